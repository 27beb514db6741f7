//! The table of an endpoint's requests: each send's and receive's state and buffer by
//! number, which of them the application watches (their completion is reported as an
//! event), the ones finished since the last report, the sends nobody waits for, and the
//! matching of arriving messages against posted receives.

use super::reqmap::ReqMap;
use super::{Arrived, RecvState, SendState};
use crate::matching::Matcher;
use crate::PeerId;

/// A send request: to whom, with which tag, its bytes (`B`: owned or lent) and state.
pub struct SendReq<B, E> {
    /// The destination.
    pub peer: PeerId,
    /// The message's tag.
    pub tag: u64,
    /// The message's bytes.
    pub data: B,
    /// Where the protocol is with it.
    pub state: SendState<E>,
    /// Its completion is to be reported (the application watches requests and has not
    /// been told yet).
    pub watched: bool,
}

/// A receive request: its destination (`B`), state, whether it is watched, and the
/// caller's word for it (handed back on completion).
pub struct RecvReq<B, E> {
    /// Where the message goes.
    pub buf: B,
    /// Where the protocol is with it.
    pub state: RecvState<E>,
    /// As [`SendReq::watched`].
    pub watched: bool,
    /// The caller's word for it.
    pub user: u64,
}

/// What an arriving eager message or RTS is for ([`Requests::arrival`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The posted receive it matched, taken off the posted queue.
    Posted(u64),
    /// No receive wants it yet: it stays where it is (the head of the peer's ring, read
    /// in place later), and the peer's frames behind it wait.
    Leave,
    /// No receive wants it: it is kept as unexpected ([`Requests::set_aside`]) so that
    /// the frames behind it can be handled.
    SetAside,
}

/// An endpoint's requests. Numbers start at 1 (0 means "complete already, nothing to
/// look up"), and are never reused.
pub struct Requests<S, R, E> {
    /// Sends by number.
    pub sends: ReqMap<SendReq<S, E>>,
    /// Receives by number.
    pub recvs: ReqMap<RecvReq<R, E>>,
    /// Requests whose state became done since the last report: (is a send, number). Every
    /// place that finishes a request adds it, so a report looks at those alone.
    pub finished: Vec<(bool, u64)>,
    /// Sends nobody waits for: removed once done.
    pub detached: Vec<u64>,
    /// The posted receives (by number) and the messages that arrived before any receive
    /// wanted them.
    pub matcher: Matcher<u64, Arrived>,
    next_id: u64,
    watching: usize,
}

impl<S, R, E> Default for Requests<S, R, E> {
    fn default() -> Self {
        Requests {
            sends: ReqMap::default(),
            recvs: ReqMap::default(),
            finished: Vec::new(),
            detached: Vec::new(),
            matcher: Matcher::default(),
            next_id: 1,
            watching: 0,
        }
    }
}

impl<S, R, E> Requests<S, R, E> {
    /// An eager message or an RTS with `tag` arrived from `src`: the posted receive it is
    /// for, or, when none wants it, whether it stays where it arrived (`force` false: the
    /// runtime may leave it in place) or is set aside as unexpected (`force`: nothing
    /// else moves until it is out of the way).
    #[inline]
    pub fn arrival(&mut self, src: PeerId, tag: u64, force: bool) -> Arrival {
        match self.matcher.take_posted(src, tag) {
            Some(rid) => Arrival::Posted(rid),
            None if force => Arrival::SetAside,
            None => Arrival::Leave,
        }
    }

    /// Keeps `item`, from `src` with `tag`, as unexpected: a receive posted later takes
    /// it.
    pub fn set_aside(&mut self, src: PeerId, tag: u64, item: Arrived) {
        self.matcher.push_unexpected(src, tag, item);
    }

    /// A fresh request number.
    #[inline]
    pub fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Adds send `id`.
    #[inline]
    pub fn add_send(&mut self, id: u64, req: SendReq<S, E>) {
        self.watching += usize::from(req.watched);
        self.sends.insert(id, req);
    }

    /// Adds receive `id`.
    #[inline]
    pub fn add_recv(&mut self, id: u64, req: RecvReq<R, E>) {
        self.watching += usize::from(req.watched);
        self.recvs.insert(id, req);
    }

    /// Takes send `id` out. Every removal goes through here (or [`Requests::remove_recv`]),
    /// which keeps the count of watched requests right.
    #[inline]
    pub fn remove_send(&mut self, id: u64) -> Option<SendReq<S, E>> {
        let req = self.sends.remove(&id)?;
        self.watching -= usize::from(req.watched);
        Some(req)
    }

    /// Takes receive `id` out.
    #[inline]
    pub fn remove_recv(&mut self, id: u64) -> Option<RecvReq<R, E>> {
        let req = self.recvs.remove(&id)?;
        self.watching -= usize::from(req.watched);
        Some(req)
    }

    /// Marks send `id` as watched (its completion to be reported); false when there is no
    /// such send.
    pub fn watch_send(&mut self, id: u64) -> bool {
        match self.sends.get_mut(&id) {
            Some(req) if req.watched => true,
            Some(req) => {
                req.watched = true;
                self.watching += 1;
                true
            }
            None => false,
        }
    }

    /// How many requests are watched and not reported yet.
    #[inline]
    pub fn watching(&self) -> usize {
        self.watching
    }

    /// Hands `report` each watched request that finished since the last call, once:
    /// (is a send, number, succeeded); a request taken by its caller meanwhile is left
    /// out. Forgets the finished list.
    pub fn report(&mut self, mut report: impl FnMut(bool, u64, bool)) {
        for k in 0..self.finished.len() {
            let (send, id) = self.finished[k];
            let ok = if send {
                self.sends.get_mut(&id).and_then(|o| match &o.state {
                    SendState::Done(r) if o.watched => {
                        o.watched = false;
                        Some(r.is_ok())
                    }
                    _ => None,
                })
            } else {
                self.recvs.get_mut(&id).and_then(|o| match &o.state {
                    RecvState::Done(r) if o.watched => {
                        o.watched = false;
                        Some(r.is_ok())
                    }
                    _ => None,
                })
            };
            if let Some(ok) = ok {
                self.watching -= 1;
                report(send, id, ok);
            }
        }
        self.finished.clear();
    }

    /// Removes the detached sends that are done.
    pub fn reap_detached(&mut self) {
        let mut detached = std::mem::take(&mut self.detached);
        detached.retain(|&id| match self.sends.get(&id).map(|s| &s.state) {
            Some(SendState::Done(_)) => {
                self.remove_send(id);
                false
            }
            Some(_) => true,
            None => false,
        });
        self.detached = detached;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Table = Requests<(), (), ()>;

    fn send(watched: bool) -> SendReq<(), ()> {
        SendReq {
            peer: PeerId(0),
            tag: 1,
            data: (),
            state: SendState::Queued,
            watched,
        }
    }

    fn recv(watched: bool) -> RecvReq<(), ()> {
        RecvReq {
            buf: (),
            state: RecvState::Posted,
            watched,
            user: 7,
        }
    }

    /// Every watched request is reported once, when done, whichever way it leaves the
    /// table; the watched count follows adds, watches, reports and removals.
    #[test]
    fn watched_requests_are_reported_once_and_counted() {
        let mut t = Table::default();
        let (a, b, c, d) = (t.alloc_id(), t.alloc_id(), t.alloc_id(), t.alloc_id());
        assert_eq!((a, d), (1, 4), "numbers from 1, never reused");
        t.add_send(a, send(true));
        t.add_send(b, send(false));
        t.add_recv(c, recv(true));
        t.add_recv(d, recv(false));
        assert_eq!(t.watching(), 2);
        assert!(
            t.watch_send(b) && t.watch_send(b),
            "watching twice counts once"
        );
        assert!(!t.watch_send(99));
        assert_eq!(t.watching(), 3);
        // a and c finish; a is reported, c was taken by its caller first.
        t.sends.get_mut(&a).unwrap().state = SendState::Done(Ok(()));
        t.recvs.get_mut(&c).unwrap().state = RecvState::Done(Err(()));
        t.finished.extend([(true, a), (false, c)]);
        assert!(t.remove_recv(c).is_some());
        assert_eq!(t.watching(), 2);
        let mut got = Vec::new();
        t.report(|s, id, ok| got.push((s, id, ok)));
        assert_eq!(got, vec![(true, a, true)]);
        assert!(t.finished.is_empty());
        assert_eq!(t.watching(), 1, "b is still watched");
        t.finished.push((true, a));
        t.report(|_, _, _| panic!("a was reported already"));
        // b is detached: reaped once done, not before.
        t.detached.push(b);
        t.reap_detached();
        assert!(t.sends.contains_key(&b));
        t.sends.get_mut(&b).unwrap().state = SendState::Done(Ok(()));
        t.reap_detached();
        assert!(!t.sends.contains_key(&b) && t.detached.is_empty());
        assert_eq!(t.watching(), 0);
        assert!(t.remove_send(a).is_some() && t.remove_recv(d).is_some());
        assert!(t.sends.is_empty() && t.recvs.is_empty());
    }

    /// An arriving message goes to the receive posted for it; with none, it stays where it
    /// arrived unless the runtime must have it out of the way, and then it is kept for the
    /// receive posted later.
    #[test]
    fn an_arrival_finds_its_posted_receive_or_waits() {
        use crate::matching::Selector;
        let mut t: Requests<(), (), ()> = Requests::default();
        let src = PeerId(2);
        assert!(t.matcher.post(Selector::exact(Some(src), 5), 41).is_none());
        assert_eq!(t.arrival(src, 5, false), Arrival::Posted(41));
        assert_eq!(t.arrival(src, 5, false), Arrival::Leave, "taken once");
        assert_eq!(t.arrival(PeerId(3), 6, true), Arrival::SetAside);
        t.set_aside(PeerId(3), 6, Arrived::Eager(vec![7]));
        let (_, u) = t
            .matcher
            .post(Selector::exact(Some(PeerId(3)), 6), 42)
            .expect("the message set aside");
        assert_eq!(u.item, Arrived::Eager(vec![7]));
    }
}
