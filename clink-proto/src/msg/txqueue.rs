//! A peer's transmit queue: what could not enter the link when it was sent (the ring was
//! full, or something was queued already), in order.
//!
//! A send waits here by number and becomes its frame when it reaches the link: an eager
//! message when it is at most the peer's eager threshold, else its rendezvous
//! announcement (RTS). Control frames and encoded one-sided frames wait beside them, so
//! a peer sees every frame in the order this side produced it.

use super::{Failure, Message, Protocol, Requests};
use crate::wire::Frame;
use std::collections::VecDeque;

/// One item of a [`TxQueue`].
#[derive(Debug)]
enum Queued {
    /// A send request, by number.
    Send(u64),
    /// A control frame.
    Ctrl(Frame<'static>),
    /// A frame already encoded (one-sided requests and answers).
    Encoded(Vec<u8>),
}

/// The head of a [`TxQueue`] ([`TxQueue::head`]).
#[derive(Debug)]
pub enum Head<'a> {
    /// Write this frame into the link, then [`TxQueue::pop`].
    Frame(Frame<'a>),
    /// Nothing to write (the send was withdrawn and is gone): [`TxQueue::pop`] it.
    Stale,
}

/// A peer's transmit queue (see the module's documentation).
#[derive(Debug, Default)]
pub struct TxQueue {
    items: VecDeque<Queued>,
}

impl TxQueue {
    /// Whether nothing waits.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many items wait.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Send `id` waits for the link.
    pub fn push_send(&mut self, id: u64) {
        self.items.push_back(Queued::Send(id));
    }

    /// A control frame waits for the link.
    pub fn push_ctrl(&mut self, f: Frame<'static>) {
        self.items.push_back(Queued::Ctrl(f));
    }

    /// An encoded frame waits for the link.
    pub fn push_encoded(&mut self, frame: Vec<u8>) {
        self.items.push_back(Queued::Encoded(frame));
    }

    /// Send `id` is withdrawn before it reached the link.
    pub fn withdraw(&mut self, id: u64) {
        self.items
            .retain(|q| !matches!(q, Queued::Send(s) if *s == id));
    }

    /// Forgets everything (the peer is gone).
    pub fn clear(&mut self) {
        self.items.clear();
    }

    /// What to write into the link next, for a peer whose eager threshold is
    /// `eager_max`.
    pub fn head<'a, S: Message, R, E>(
        &'a self,
        req: &'a Requests<S, R, E>,
        eager_max: u64,
    ) -> Option<Head<'a>> {
        Some(match self.items.front()? {
            Queued::Ctrl(f) => Head::Frame(*f),
            // This side encoded it: it parses; were it not to, it is dropped rather than
            // let it stall the queue.
            Queued::Encoded(v) => Frame::parse(v).map_or(Head::Stale, Head::Frame),
            Queued::Send(id) => match req.sends.get(id) {
                None => Head::Stale,
                Some(op) => {
                    let data = op.data.bytes();
                    let len = data.len() as u64;
                    Head::Frame(match Protocol::of(len, eager_max) {
                        Protocol::Eager => Frame::Eager { tag: op.tag, data },
                        Protocol::Rendezvous => Frame::Rts {
                            tag: op.tag,
                            len,
                            send_id: *id,
                            addr: data.as_ptr() as u64,
                        },
                    })
                }
            },
        })
    }

    /// The head is in the link (or was stale): it leaves the queue, and a send it was is
    /// delivered (eager: the request is over) or announced.
    pub fn pop<S: Message, R, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        eager_max: u64,
    ) {
        let Some(Queued::Send(id)) = self.items.pop_front() else {
            return;
        };
        let Some(op) = req.sends.get_mut(&id) else {
            return;
        };
        match Protocol::of(op.data.bytes().len() as u64, eager_max) {
            Protocol::Eager => {
                op.state.delivered();
                req.finished.push((true, id));
            }
            Protocol::Rendezvous => op.state.announced(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{SendReq, SendState};
    use crate::PeerId;

    type Table = Requests<Vec<u8>, Vec<u8>, Failure>;

    fn send(t: &mut Table, len: usize) -> u64 {
        let id = t.alloc_id();
        t.add_send(
            id,
            SendReq {
                peer: PeerId(0),
                tag: 7,
                data: vec![1; len],
                state: SendState::Queued,
                watched: false,
            },
        );
        id
    }

    /// Items leave in order; a send becomes an eager frame or an RTS by the threshold and
    /// its state follows; a withdrawn send never reaches the link.
    #[test]
    fn items_leave_in_order_as_their_frames() {
        let mut t = Table::default();
        let (small, big, gone) = (send(&mut t, 4), send(&mut t, 100), send(&mut t, 4));
        let mut q = TxQueue::default();
        q.push_send(small);
        q.push_ctrl(Frame::Fin { send_id: 9 });
        q.push_send(gone);
        q.push_send(big);
        let mut enc = vec![0u8; Frame::Cts { send_id: 3 }.encoded_len()];
        Frame::Cts { send_id: 3 }.encode(&mut enc);
        q.push_encoded(enc);
        q.push_encoded(vec![0xff; 3]);
        q.withdraw(gone);
        assert_eq!(q.len(), 5);
        let mut out = Vec::new();
        while let Some(h) = q.head(&t, 10) {
            out.push(match h {
                Head::Frame(Frame::Eager { data, .. }) => format!("eager {}", data.len()),
                Head::Frame(Frame::Rts { len, send_id, .. }) => format!("rts {len} {send_id}"),
                Head::Frame(f) => format!("{f:?}"),
                Head::Stale => "stale".into(),
            });
            q.pop(&mut t, 10);
        }
        assert_eq!(
            out,
            [
                "eager 4".to_string(),
                "Fin { send_id: 9 }".into(),
                format!("rts 100 {big}"),
                "Cts { send_id: 3 }".into(),
                "stale".into(),
            ]
        );
        assert!(matches!(t.sends[&small].state, SendState::Done(Ok(()))));
        assert!(matches!(t.sends[&big].state, SendState::WaitFin));
        assert!(matches!(t.sends[&gone].state, SendState::Queued));
        assert_eq!(t.finished, [(true, small)]);
        assert!(q.is_empty());
    }
}
