//! One peer's rendezvous protocol, sans-IO: what the control frames of a large message do
//! to the requests, and what the runtime must do for them.
//!
//! [`Rendezvous`] holds what the protocol keeps per peer (the receives in progress by the
//! peer's send number, the sends going out in chunks, the measured choice of method,
//! whether the peer can write into this process). Its inputs are a matched announcement
//! ([`Rendezvous::matched`]), the peer's frames ([`Rendezvous::on_frame`]), the
//! completions of what it asked for ([`Rendezvous::read_done`], [`Rendezvous::written`],
//! [`Rendezvous::transfers_done`]), the peer's death ([`Rendezvous::peer_died`]) and the
//! time, passed in. Its outputs are [`Action`]s, which the runtime carries out in order:
//! queue a control frame, read or write the peer's memory (CMA), land or send a transfer.
//! Requests it finishes go to [`Requests::finished`].

use super::{plan, withdraw, Arrived, Chunker, Failure, NextChunk, Plan, RecvState, Requests};
use super::{SplitEnd, Status};
use crate::cost::{Costs, Rndv, RndvChooser};
use crate::wire::Frame;
use crate::PeerId;
use std::collections::HashMap;

/// A send's bytes, as the protocol reads them (a chunk, a pushed head).
pub trait Message {
    /// The message.
    fn bytes(&self) -> &[u8];
}

/// A receive's buffer, as the protocol fills it (chunks).
pub trait Buffer {
    /// The buffer.
    fn slice(&mut self) -> &mut [u8];
}

impl Message for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Buffer for Vec<u8> {
    fn slice(&mut self) -> &mut [u8] {
        self
    }
}

/// What the runtime does for the protocol, in the order given.
#[derive(Debug)]
pub enum Action<E> {
    /// Queue this control frame to the peer (behind what is queued already).
    Send(Frame<'static>),
    /// Read the peer's memory into a receive's buffer, then report with
    /// [`Rendezvous::read_done`].
    Read(Read<E>),
    /// Write the first `len` bytes of send `send_id` at `addr` in the peer's memory, then
    /// report with [`Rendezvous::written`].
    Write {
        /// The send.
        send_id: u64,
        /// Where, in the peer's address space.
        addr: u64,
        /// How many bytes, from the message's start.
        len: u64,
    },
    /// Receive `rid` takes the peer's transfer `send_id` of `len` bytes: a link that
    /// carries transfers itself (a network link) lands it in the receive's buffer. Comes
    /// before the CTS that asks for it.
    Expect {
        /// The peer's send.
        send_id: u64,
        /// The receive.
        rid: u64,
        /// The message's length.
        len: u64,
    },
    /// The peer asked for send `send_id` of `len` bytes: a network link sends it as a
    /// transfer; a ring carries it in chunks ([`Rendezvous::chunks`]).
    Transfer {
        /// The send.
        send_id: u64,
        /// Its length.
        len: u64,
    },
}

/// A rendezvous announcement ([`Frame::Rts`]) a receive matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Announced {
    /// The message's tag.
    pub tag: u64,
    /// Its length.
    pub len: u64,
    /// The sender's number for it.
    pub send_id: u64,
    /// Where it is in the sender's address space.
    pub addr: u64,
}

/// A read of the peer's memory ([`Action::Read`]): `len` bytes at `addr` in the peer's
/// address space into receive `rid`'s buffer from byte `at`.
#[derive(Debug)]
pub struct Read<E> {
    /// The receive.
    pub rid: u64,
    /// Where, in the peer's address space.
    pub addr: u64,
    /// Where in the buffer.
    pub at: u64,
    /// How many bytes.
    pub len: u64,
    then: Then<E>,
}

/// What a read completes.
#[derive(Debug)]
enum Then<E> {
    /// The whole read (or this side's part of a split one, `pushed` > 0) of a message
    /// announced as `send_id`.
    Matched {
        send_id: u64,
        status: Status,
        cap: u64,
        pushed: u64,
        since: u64,
        addr: u64,
    },
    /// The head of a split read the sender could not write.
    Head { send_id: u64, end: SplitEnd<E> },
}

/// A frame from the peer that names a send (or its receive) that does not exist or is not
/// in the state the frame needs: the peer's protocol error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The send the frame names.
    pub send_id: u64,
    /// What is wrong.
    pub what: &'static str,
}

/// Bytes that landed in a receive's buffer with one of the peer's frames
/// ([`Rendezvous::on_frame`]), for the runtime's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    /// None.
    Nothing,
    /// A chunk's, copied out of the frame.
    Chunk(u64),
    /// A split read's head, which the peer wrote (CMA).
    Pushed(u64),
}

/// One peer's rendezvous state (see the module's documentation).
#[derive(Debug)]
pub struct Rendezvous {
    /// The peer.
    peer: PeerId,
    /// Receives in progress: the peer's send number -> the receive's.
    incoming: HashMap<u64, u64>,
    /// Sends the peer asked for, going out through the ring in chunks, in order.
    pub chunks: Chunker,
    /// Which method is faster from this peer, as measured.
    pub chooser: RndvChooser,
    /// The peer could not write a split read's head into this process (CMA refused that
    /// way round): its messages are no longer split.
    push_refused: bool,
}

impl Rendezvous {
    /// The state with `peer`, before any message.
    pub fn new(peer: PeerId) -> Rendezvous {
        Rendezvous {
            peer,
            incoming: HashMap::new(),
            chunks: Chunker::default(),
            chooser: RndvChooser::default(),
            push_refused: false,
        }
    }

    /// Whether no receive is in progress and no send goes out in chunks.
    pub fn is_idle(&self) -> bool {
        self.incoming.is_empty() && self.chunks.is_empty()
    }

    /// Receive `rid` matched the peer's announcement `rts`. `method` is the one chosen
    /// (see [`Rendezvous::chooser`]), `cma` whether the peer's memory can be read at all,
    /// `split` whether a read may be split. A receive that is gone is ignored.
    pub fn matched<S, R: Buffer, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        rid: u64,
        rts: Announced,
        (method, cma, split): (Rndv, bool, bool),
        now: u64,
        acts: &mut Vec<Action<E>>,
    ) {
        let Some(op) = req.recvs.get_mut(&rid) else {
            return;
        };
        let Announced {
            tag,
            len,
            send_id,
            addr,
        } = rts;
        let status = Status {
            peer: self.peer,
            tag,
            len,
        };
        let cap = op.buf.slice().len() as u64;
        match plan(method, cma, len, cap, split && !self.push_refused) {
            Plan::Cma { n, pushed } => {
                if pushed > 0 {
                    self.incoming.insert(send_id, rid);
                    // The sender writes the head straight into the buffer (its address in
                    // this process is the receive's to give).
                    let dest = op.buf.slice().as_mut_ptr() as u64;
                    acts.push(Action::Send(Frame::Push {
                        send_id,
                        addr: dest,
                        len: pushed,
                    }));
                }
                acts.push(Action::Read(Read {
                    rid,
                    addr: addr + pushed,
                    at: pushed,
                    len: n - pushed,
                    then: Then::Matched {
                        send_id,
                        status,
                        cap,
                        pushed,
                        since: now,
                        addr,
                    },
                }));
            }
            Plan::Transfer => {
                op.state = RecvState::transfer(status, now);
                self.incoming.insert(send_id, rid);
                acts.push(Action::Expect { send_id, rid, len });
                acts.push(Action::Send(Frame::Cts { send_id }));
            }
        }
    }

    /// The read `r` asked for went as `result` (at `now`).
    pub fn read_done<S, R: Buffer, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        costs: &Costs,
        r: Read<E>,
        result: std::io::Result<()>,
        now: u64,
        acts: &mut Vec<Action<E>>,
    ) {
        let peer = self.peer;
        let result = result.map_err(|source| Failure::Read { peer, source }.into());
        let Some(op) = req.recvs.get_mut(&r.rid) else {
            return;
        };
        match r.then {
            Then::Matched {
                send_id,
                status,
                cap,
                pushed,
                since,
                addr,
            } => {
                op.state = RecvState::after_cma(status, cap, pushed, result, since, addr);
                if pushed == 0 {
                    req.finished.push((false, r.rid));
                    self.finish_read(costs, send_id, status.len.min(cap), since, now, acts);
                }
            }
            Then::Head { send_id, end } => {
                let cap = op.buf.slice().len() as u64;
                let (n, since) = (end.status.len.min(cap), end.since);
                op.state = end.finish(result, cap);
                req.finished.push((false, r.rid));
                self.finish_read(costs, send_id, n, since, now, acts);
            }
        }
    }

    /// The write [`Action::Write`] asked for for `send_id` succeeded (`ok`) or not.
    pub fn written<E>(&mut self, send_id: u64, ok: bool, acts: &mut Vec<Action<E>>) {
        acts.push(Action::Send(Frame::Pushed { send_id, ok }));
    }

    /// A CMA read of `n` bytes started at `since` is over: the chooser's sample, and the
    /// Fin that releases the sender's buffer.
    fn finish_read<E>(
        &mut self,
        costs: &Costs,
        send_id: u64,
        n: u64,
        since: u64,
        now: u64,
        acts: &mut Vec<Action<E>>,
    ) {
        let ns = now.saturating_sub(since) as f64;
        self.chooser.record(costs, Rndv::Cma, n, ns);
        acts.push(Action::Send(Frame::Fin { send_id }));
    }

    /// Handles one of the peer's rendezvous frames (Fin, Cts, Chunk, Cancel, CancelAck,
    /// Push, Pushed; any other frame is the runtime's). Returns the bytes that landed in a
    /// receive's buffer, or the frame's refusal.
    pub fn on_frame<S: Message, R: Buffer, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        costs: &Costs,
        frame: &Frame<'_>,
        now: u64,
        acts: &mut Vec<Action<E>>,
    ) -> Result<Landed, Refused> {
        let peer = self.peer;
        match *frame {
            Frame::Fin { send_id } => {
                if let Some(op) = req.sends.get_mut(&send_id) {
                    if op.peer == peer && op.state.on_fin() {
                        req.finished.push((true, send_id));
                    }
                }
            }
            Frame::Cts { send_id } => {
                let bad = |what| Refused { send_id, what };
                let op = match req.sends.get_mut(&send_id) {
                    Some(op) if op.peer == peer => op,
                    _ => return Err(bad("CTS for unknown send")),
                };
                op.state.on_cts().map_err(bad)?;
                let len = op.data.bytes().len() as u64;
                acts.push(Action::Transfer { send_id, len });
            }
            Frame::Chunk {
                send_id,
                offset,
                data,
            } => {
                let bad = |what| Refused { send_id, what };
                let rid = *self
                    .incoming
                    .get(&send_id)
                    .ok_or_else(|| bad("chunk for unknown send"))?;
                let op = req
                    .recvs
                    .get_mut(&rid)
                    .ok_or_else(|| bad("chunk for unknown receive"))?;
                let buf = op.buf.slice();
                let len = data.len() as u64;
                let chunk = op
                    .state
                    .on_chunk(offset, len, buf.len() as u64)
                    .map_err(bad)?;
                buf[chunk.copy.clone()].copy_from_slice(&data[..chunk.copy.len()]);
                if let Some(since) = chunk.done {
                    let ns = now.saturating_sub(since) as f64;
                    self.chooser.record(costs, Rndv::Pipeline, offset + len, ns);
                    req.finished.push((false, rid));
                    self.incoming.remove(&send_id);
                }
                return Ok(Landed::Chunk(len));
            }
            Frame::Cancel { send_id } => {
                let cancelled = withdraw(&mut req.matcher, peer, send_id);
                acts.push(Action::Send(Frame::CancelAck { send_id, cancelled }));
            }
            Frame::CancelAck { send_id, cancelled } => {
                if let Some(op) = req.sends.get_mut(&send_id) {
                    if op.peer == peer && op.state.on_cancel_ack(cancelled) {
                        req.finished.push((true, send_id));
                    }
                }
            }
            Frame::Push { send_id, addr, len } => {
                let bad = |what| Refused { send_id, what };
                let op = match req.sends.get(&send_id) {
                    Some(op) if op.peer == peer => op,
                    _ => return Err(bad("push for unknown send")),
                };
                let part = op
                    .state
                    .push_part(len, op.data.bytes().len() as u64)
                    .map_err(bad)?;
                acts.push(Action::Write {
                    send_id,
                    addr,
                    len: part.len() as u64,
                });
            }
            Frame::Pushed { send_id, ok } => {
                let bad = |what| Refused { send_id, what };
                let rid = *self
                    .incoming
                    .get(&send_id)
                    .ok_or_else(|| bad("pushed for unknown send"))?;
                let op = req
                    .recvs
                    .get_mut(&rid)
                    .ok_or_else(|| bad("pushed for unknown receive"))?;
                // (Refused, the receive stays where it was, and in progress.)
                let end = op.state.on_pushed(ok).map_err(bad)?;
                self.incoming.remove(&send_id);
                let cap = op.buf.slice().len() as u64;
                if end.written {
                    let (n, since) = (end.status.len.min(cap), end.since);
                    let pushed = end.pushed;
                    op.state = end.finish(Ok(()), cap);
                    req.finished.push((false, rid));
                    self.finish_read(costs, send_id, n, since, now, acts);
                    return Ok(Landed::Pushed(pushed));
                } else {
                    // The sender could not write its part: read it too (its memory is
                    // still there: it waits for the Fin).
                    self.push_refused = true;
                    acts.push(Action::Read(Read {
                        rid,
                        addr: end.addr,
                        at: 0,
                        len: end.pushed,
                        then: Then::Head { send_id, end },
                    }));
                }
            }
            Frame::Eager { .. } | Frame::Rts { .. } | Frame::Close | Frame::Rma(_) => {}
        }
        Ok(Landed::Nothing)
    }

    /// The next chunk of the sends going out through the ring, with its bytes (sends that
    /// are gone are skipped); `chunk` sizes it from the message's length. Report it with
    /// [`Rendezvous::chunk_sent`] once the ring took it.
    pub fn next_chunk<'r, S: Message, R, E>(
        &mut self,
        req: &'r Requests<S, R, E>,
        chunk: impl Fn(u64) -> u64,
    ) -> Option<(NextChunk, &'r [u8])> {
        loop {
            let c = self.chunks.next(&chunk)?;
            let Some(op) = req.sends.get(&c.send_id) else {
                self.chunks.skip();
                continue;
            };
            let data = &op.data.bytes()[c.offset as usize..(c.offset + c.len) as usize];
            return Some((c, data));
        }
    }

    /// Chunk `c` is in the ring: a send whose last chunk it was is complete.
    pub fn chunk_sent<S, R, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        c: NextChunk,
    ) {
        if self.chunks.sent(c).is_some() {
            if let Some(op) = req.sends.get_mut(&c.send_id) {
                if op.state.transfer_done() {
                    req.finished.push((true, c.send_id));
                }
            }
        }
    }

    /// The link finished transfers: the sends `sent` (acknowledged by the peer) and the
    /// receives of the peer's sends `received` (every byte in the buffer).
    pub fn transfers_done<S, R: Buffer, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        received: &[u64],
        sent: &[u64],
    ) {
        for &x in sent {
            if let Some(op) = req.sends.get_mut(&x) {
                if op.state.transfer_done() {
                    req.finished.push((true, x));
                }
            }
        }
        for x in received {
            let Some(rid) = self.incoming.remove(x) else {
                continue;
            };
            let Some(op) = req.recvs.get_mut(&rid) else {
                continue;
            };
            let cap = op.buf.slice().len() as u64;
            if op.state.transfer_done(cap) {
                req.finished.push((false, rid));
            }
        }
    }

    /// The peer died or closed: every request that needs it fails with `err()` (the
    /// receives in progress, the sends to it, the receives posted for it alone), its
    /// announcements are forgotten (their memory is gone; its eager messages stay).
    pub fn peer_died<S, R, E: From<Failure>>(
        &mut self,
        req: &mut Requests<S, R, E>,
        err: impl Fn() -> E,
    ) {
        let peer = self.peer;
        self.chunks.clear();
        for (_, rid) in self.incoming.drain() {
            if let Some(op) = req.recvs.get_mut(&rid) {
                if op.state.fail(err()) {
                    req.finished.push((false, rid));
                }
            }
        }
        for (id, op) in req.sends.iter_mut() {
            if op.peer == peer && op.state.fail(err()) {
                req.finished.push((true, id));
            }
        }
        for rid in req.matcher.drain_posted_from(peer) {
            if let Some(op) = req.recvs.get_mut(&rid) {
                if op.state.fail(err()) {
                    req.finished.push((false, rid));
                }
            }
        }
        req.matcher
            .drain_unexpected_from(peer, |u| matches!(u, Arrived::Eager(_)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{RecvReq, SendReq, SendState};

    type Table = Requests<Vec<u8>, Vec<u8>, Failure>;

    fn transfer(req: &mut Table, rv: &mut Rendezvous, send_id: u64) -> u64 {
        let rid = req.alloc_id();
        let (buf, state) = (vec![0; 64], RecvState::Posted);
        req.add_recv(
            rid,
            RecvReq {
                buf,
                state,
                watched: false,
                user: 0,
            },
        );
        let rts = Announced {
            tag: 1,
            len: 100,
            send_id,
            addr: 0,
        };
        let mut acts = Vec::new();
        rv.matched(req, rid, rts, (Rndv::Pipeline, true, true), 0, &mut acts);
        assert!(matches!(
            acts[..],
            [Action::Expect { .. }, Action::Send(Frame::Cts { .. })]
        ));
        rid
    }

    /// A Pushed for a receive that is not split is refused and leaves the receive in
    /// progress: its chunks are still taken (once, the refused Pushed had taken it out of
    /// the receives in progress, where it waited for ever: a fuzzer's find). The peer's
    /// death ends every request that needs it.
    #[test]
    fn a_refused_pushed_leaves_the_receive_in_progress() {
        let peer = PeerId(0);
        let (mut req, mut rv) = (Table::default(), Rendezvous::new(peer));
        let (costs, mut acts) = (Costs::default(), Vec::new());
        let a = transfer(&mut req, &mut rv, 9);
        let pushed = Frame::Pushed {
            send_id: 9,
            ok: false,
        };
        let r = rv.on_frame(&mut req, &costs, &pushed, 1, &mut acts);
        assert_eq!(r.unwrap_err().what, "pushed for a receive not split");
        assert!(acts.is_empty());
        let data = [3u8; 100];
        let chunk = Frame::Chunk {
            send_id: 9,
            offset: 0,
            data: &data,
        };
        let r = rv.on_frame(&mut req, &costs, &chunk, 2, &mut acts);
        assert_eq!(r, Ok(Landed::Chunk(100)));
        assert!(matches!(
            req.recvs[&a].state,
            RecvState::Done(Err(Failure::Truncated {
                len: 100,
                capacity: 64
            }))
        ));
        assert_eq!(req.recvs[&a].buf, [3u8; 64]);

        let b = transfer(&mut req, &mut rv, 10);
        let id = req.alloc_id();
        let state = SendState::WaitFin;
        req.add_send(
            id,
            SendReq {
                peer,
                tag: 1,
                data: vec![1; 10],
                state,
                watched: false,
            },
        );
        rv.peer_died(&mut req, || Failure::PeerDead(peer));
        assert!(matches!(
            req.recvs[&b].state,
            RecvState::Done(Err(Failure::PeerDead(_)))
        ));
        assert!(matches!(
            req.sends[&id].state,
            SendState::Done(Err(Failure::PeerDead(_)))
        ));
        assert!(rv.is_idle());
    }
}
