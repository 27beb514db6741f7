//! Receiving: posting receives, the fast path of a blocking receive, a receive request's
//! life (test, wait, wait-any, cancel), probing, in-place receives ([`InPlace`]) and
//! delivering eager messages.

use super::*;
use clink_proto::msg::Arrival;

impl Endpoint {
    /// Posts a receive into `buf` (its length is the capacity) for a message matching
    /// `sel`. Complete it with [`Endpoint::wait_recv`] or [`Endpoint::test_recv`]. With
    /// [`events::REQUESTS`] in the interest mask, its completion is reported by an
    /// [`Event::RecvDone`].
    pub fn irecv(&mut self, sel: Selector, buf: Vec<u8>) -> Result<RecvRequest> {
        Ok(self.post_recv(sel, RecvBuf::Owned(buf), 0))
    }

    /// Posts a non-blocking receive into `buf`.
    pub(super) fn post_recv(&mut self, sel: Selector, buf: RecvBuf, user: u64) -> RecvRequest {
        let id = self.req.alloc_id();
        let watched = self.evq.interest & events::REQUESTS != 0;
        self.req.add_recv(
            id,
            RecvOp {
                buf,
                state: RecvState::Posted,
                watched,
                user,
            },
        );
        self.post(sel, id);
        RecvRequest { id }
    }

    pub(super) fn post(&mut self, sel: Selector, id: u64) {
        if let Some((_, u)) = self.req.matcher.post(sel, id) {
            self.deliver(u.src, u.tag, id, u.item);
            return;
        }
        // Nothing it could match has arrived, and a dead (or unknown) source will send
        // nothing more: fail now rather than at the caller's timeout.
        if let Some(err) = self.gone_source(&sel) {
            self.req.matcher.cancel(&id);
            if let Some(op) = self.req.recvs.get_mut(&id) {
                op.state = RecvState::Done(Err(err));
                self.req.finished.push((false, id));
            }
        }
    }

    /// Why nothing more can match `sel`: its source is named and dead (`PeerDead`) or
    /// unknown (`UnknownPeer`); `None` when any peer may still send.
    fn gone_source(&self, sel: &Selector) -> Option<Error> {
        let src = sel.src.filter(|&p| !self.is_alive(p))?;
        Some(if (src.0 as usize) < self.peers.len() {
            Error::PeerDead(src)
        } else {
            Error::UnknownPeer(src)
        })
    }

    /// Receives one message matching `sel` into `buf` (blocking helper). Returns who sent
    /// what; a message longer than `buf` fills it and returns [`Error::Truncated`].
    pub fn recv(&mut self, sel: Selector, buf: &mut [u8]) -> Result<Status> {
        self.recv_timeout(sel, buf, None)
    }

    /// As [`Endpoint::recv`], giving up after `timeout` (the receive is withdrawn).
    pub fn recv_timeout(
        &mut self,
        sel: Selector,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Status> {
        if let Some(r) = self.recv_fast(sel, buf) {
            return r;
        }
        // The time the network fast path spun counts towards the spin time and the timeout.
        let mut spun = None;
        if let Some(r) = self.recv_fast_net(sel, buf, timeout, &mut spun) {
            return r;
        }
        self.recv_lent(sel, buf, timeout, spun)
    }

    /// The general path of [`Endpoint::recv_timeout`], into a lent buffer: returns only
    /// once the receive is over (done, or withdrawn with nothing in flight).
    pub(super) fn recv_posted(
        &mut self,
        sel: Selector,
        dst: Dst,
        timeout: Option<Duration>,
        spun: Option<Instant>,
    ) -> Result<Status> {
        let id = self.req.alloc_id();
        self.req.add_recv(
            id,
            RecvOp {
                buf: RecvBuf::Lent(dst),
                state: RecvState::Posted,
                watched: false,
                user: 0,
            },
        );
        self.post(sel, id);
        let r = self.wait_for(timeout, true, spun, |ep| {
            matches!(
                ep.req.recvs.get(&id).map(|r| &r.state),
                Some(RecvState::Done(_))
            )
        });
        if let Err(e) = r {
            // Withdraw before the lent buffer goes out of scope. A pipelined receive in
            // flight must finish first: its chunks land in that buffer.
            if !self.req.matcher.cancel(&id) {
                self.wait_until(None, |ep| {
                    ep.req.recvs.get(&id).is_none_or(|r| !r.state.in_flight())
                })?;
            }
            if let Some(RecvOp {
                state: RecvState::Done(res),
                ..
            }) = self.req.remove_recv(id)
            {
                return res;
            }
            return Err(e);
        }
        match self.req.remove_recv(id).map(|r| r.state) {
            Some(RecvState::Done(res)) => res,
            _ => Err(Error::Consumed),
        }
    }

    /// The latency fast path of a blocking receive: when nothing else is in flight (no
    /// posted receive, no matching unexpected message, no pending send or queued frame),
    /// poll the rings directly for a small message matching `sel` and copy it straight
    /// into `buf`: no request, no matching queues. Gives up (`None`) as soon as anything
    /// else shows up at a ring's head, or after a short spin, leaving it to the general
    /// path.
    pub(super) fn recv_fast(&mut self, sel: Selector, buf: &mut [u8]) -> Option<Result<Status>> {
        if self.req.matcher.posted_len() != 0
            || !self.req.sends.is_empty()
            || self.req.matcher.has_unexpected(&sel)
        {
            return None;
        }
        let spins = match self.ctx.config.spin {
            Some(d) if d.is_zero() => 1,
            _ => 4096,
        };
        let (lo, hi) = match sel.src {
            // A dead or unknown source: the general path fails the receive at once.
            Some(p) if !self.is_alive(p) => return None,
            Some(p) => (p.0 as usize, p.0 as usize + 1),
            None => (0, self.peers.len()),
        };
        for n in 0..spins {
            for i in lo..hi {
                let (rec, tag, data) = match self.peers[i].quiet_eager() {
                    Ok(Some(m)) => m,
                    Ok(None) => continue,
                    Err(()) => return None,
                };
                let src = PeerId(i as u32);
                if !sel.matches(src, tag) {
                    return None;
                }
                let result = copy_eager(src, tag, data, buf);
                self.release_frame(i, rec);
                if n > 0 {
                    // (Found at the first look, it says nothing of spinning.)
                    self.spin_gate.hit();
                }
                return Some(result);
            }
            if n == 0 && self.spin_gate.maybe_closed() {
                // Spins keep failing: the general path sleeps at once.
                return None;
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Completes posted receives straight off the shared-memory rings, for callers that
    /// drive the endpoint by polling its requests (the libfabric provider's completion
    /// queues): while a ring's head is an eager message the first matching posted receive
    /// takes, it is copied there and, for a receive into caller memory
    /// ([`Endpoint::irecv_raw`], `irecv_raw_user`), `done(request id, its user word,
    /// outcome)` is called and the request is
    /// gone (no event, nothing to finish); a receive into an owned buffer completes as in
    /// a progress pass. A small message no posted receive wants is copied aside as
    /// unexpected (a receive posted later takes it from there). Returns how many `done`
    /// was called for, or `None` when a progress pass is due instead: anything else at a
    /// ring's head, a network peer, a send or a handshake in flight, a completion event to
    /// read, or every 64th call (liveness, timers). Completions reported before a `None`
    /// stand.
    pub fn poll_recvs(&mut self, mut done: impl FnMut(u64, u64, Result<Status>)) -> Option<usize> {
        if self.pass_due() {
            return None;
        }
        // Requests finished since the last report (a receive its caller took at once from
        // the unexpected queue leaves its number there): reported here, unless that queues
        // an event, which the pass's caller reads.
        if !self.req.finished.is_empty() && self.report_done() {
            return None;
        }
        let mut n = 0;
        for i in 0..self.peers.len() {
            loop {
                let (rec, tag, data) = match self.peers[i].quiet_eager() {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(()) => return None,
                };
                let src = PeerId(i as u32);
                let Arrival::Posted(rid) = self.req.arrival(src, tag, true) else {
                    // No posted receive wants it: copied aside as unexpected, which a pass
                    // would do too once nothing else moves (a caller that polls its
                    // requests posts receives only after such reads), without the pass.
                    // (Copied before the call: `data` borrows the peer's ring.)
                    let bytes = data.to_vec();
                    self.set_aside_eager(i, tag, bytes);
                    self.release_frame(i, rec);
                    continue;
                };
                let op = self.req.recvs.get_mut(&rid)?;
                let result = copy_eager(src, tag, data, op.buf.slice());
                let report = if matches!(op.buf, RecvBuf::Owned(_)) {
                    op.state = RecvState::Done(result);
                    self.req.finished.push((false, rid));
                    None
                } else {
                    let user = op.user;
                    self.req.remove_recv(rid);
                    Some((user, result))
                };
                self.release_frame(i, rec);
                if let Some((user, result)) = report {
                    done(rid, user, result);
                    n += 1;
                }
            }
        }
        Some(n)
    }

    /// Whether a caller polling the rings ([`Endpoint::poll_recvs`], [`Endpoint::poll_eager`])
    /// should run a progress pass instead: anything but eager messages may be waiting, or
    /// this is every 64th poll (liveness, timers).
    fn pass_due(&mut self) -> bool {
        self.fast_polls = self.fast_polls.wrapping_add(1);
        self.fast_polls.is_multiple_of(64)
            || self.ready.on
            || !self.req.sends.is_empty()
            || !self.req.detached.is_empty()
            || !self.incoming.is_empty()
            || self.rma.has_aperture_recvs()
    }

    /// Offers the eager messages at the heads of the shared-memory rings to `take(sender,
    /// tag, payload)`, for a caller that keeps receives of its own while the endpoint holds
    /// none (the libfabric provider's receives not handed over yet): a message `take`
    /// accepts (true) is consumed (one no receive of the caller's wants can be given back
    /// with [`Endpoint::set_aside`]); the first it declines stays at the head of its ring,
    /// and the poll ends there (the caller then posts its receives and polls again).
    /// Returns how many were taken, or `None` when the endpoint holds posted receives or
    /// unexpected messages (they come first), when message events are watched, or when a
    /// progress pass is due ([`Endpoint::poll_recvs`]); with `None` after some were taken,
    /// those stand.
    pub fn poll_eager(
        &mut self,
        mut take: impl FnMut(PeerId, u64, &[u8]) -> bool,
    ) -> Option<usize> {
        if self.req.matcher.posted_len() != 0
            || self.req.matcher.unexpected_len() != 0
            || self.evq.interest & events::MESSAGES != 0
            || self.pass_due()
        {
            return None;
        }
        if !self.req.finished.is_empty() && self.report_done() {
            return None;
        }
        let mut n = 0;
        for i in 0..self.peers.len() {
            loop {
                let (rec, tag, data) = match self.peers[i].quiet_eager() {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(()) => return None,
                };
                if !take(PeerId(i as u32), tag, data) {
                    return Some(n);
                }
                self.release_frame(i, rec);
                n += 1;
            }
        }
        Some(n)
    }

    /// Gives back a message [`Endpoint::poll_eager`] took and no receive of the caller's
    /// wanted: it waits, as if it had just arrived unexpected, for a receive posted later
    /// (after the messages set aside before it). Call it before posting any receive the
    /// message could match, and before any other call that makes progress, so that it keeps
    /// its place among the messages of its sender.
    pub fn set_aside(&mut self, peer: PeerId, tag: u64, data: Vec<u8>) -> Result<()> {
        self.peer(peer)?;
        self.set_aside_eager(peer.0 as usize, tag, data);
        Ok(())
    }

    /// How many receives are posted and wait for a message to match.
    #[inline]
    pub fn posted_recvs(&self) -> usize {
        self.req.matcher.posted_len()
    }

    /// How many messages arrived before any receive wanted them and wait, copied aside,
    /// for one (a receive posted now may complete at once from them).
    #[inline]
    pub fn unexpected_count(&self) -> usize {
        self.req.matcher.unexpected_len()
    }

    /// Tests a receive: `Ok(Some(..))` when complete, `Ok(None)` while pending.
    pub fn test_recv(&mut self, req: &RecvRequest) -> Result<Option<Received>> {
        self.progress();
        self.take_recv(req.id)
    }

    /// A receive's outcome without a progress pass (for callers that learnt of its
    /// completion from [`Event::RecvDone`]): as [`Endpoint::test_recv`] otherwise.
    pub fn finish_recv(&mut self, req: &RecvRequest) -> Result<Option<Received>> {
        self.take_recv(req.id)
    }

    pub(super) fn take_recv(&mut self, id: u64) -> Result<Option<Received>> {
        if self.rma.has_aperture_recvs() {
            // Fire its tripwires before the request goes (a completion in this call's own
            // pass, or one found without a pass).
            self.settle_aperture_recvs();
        }
        match self.req.recvs.get(&id).map(|r| (&r.state, &r.buf)) {
            None => Err(Error::Consumed),
            Some((RecvState::Done(_), RecvBuf::InPlace(_))) => {
                // The bytes are in the aperture: no buffer to hand back, even truncated.
                match self.req.remove_recv(id).map(|op| op.state) {
                    Some(RecvState::Done(res)) => res.map(|status| {
                        Some(Received {
                            buf: Vec::new(),
                            status,
                        })
                    }),
                    _ => Err(Error::Consumed),
                }
            }
            Some((RecvState::Done(Err(Error::Truncated { .. })), _)) => {
                // Keep the buffer (with the message's first bytes) for take_recv_buffer.
                match &self.req.recvs[&id].state {
                    RecvState::Done(Err(Error::Truncated { len, capacity })) => {
                        Err(Error::Truncated {
                            len: *len,
                            capacity: *capacity,
                        })
                    }
                    _ => Err(Error::Consumed),
                }
            }
            Some((RecvState::Done(_), _)) => match self.req.remove_recv(id) {
                Some(RecvOp {
                    buf: RecvBuf::Owned(mut buf),
                    state: RecvState::Done(res),
                    ..
                }) => {
                    let st = res?;
                    buf.truncate(st.len as usize);
                    Ok(Some(Received { buf, status: st }))
                }
                _ => Err(Error::Consumed),
            },
            Some(_) => Ok(None),
        }
    }

    /// After a receive failed with [`Error::Truncated`], returns its buffer (which holds
    /// the message's first bytes).
    pub fn take_recv_buffer(&mut self, req: RecvRequest) -> Option<Vec<u8>> {
        match self.req.remove_recv(req.id)? {
            RecvOp {
                buf: RecvBuf::Owned(v),
                ..
            } => Some(v),
            _ => None,
        }
    }

    /// Waits for a receive, at most `timeout`. On timeout the request stays valid.
    pub fn wait_recv(&mut self, req: &RecvRequest, timeout: Option<Duration>) -> Result<Received> {
        let id = req.id;
        self.wait_until(timeout, |ep| {
            matches!(
                ep.req.recvs.get(&id).map(|r| &r.state),
                Some(RecvState::Done(_)) | None
            )
        })?;
        self.take_recv(id)?.ok_or(Error::Consumed)
    }

    /// Waits for the first of `reqs` to complete, at most `timeout` (MPI's `Waitany`):
    /// its index in `reqs` and what it received (or its error). One progress loop serves
    /// them all, where polling each with [`Endpoint::test_recv`] makes a progress pass per
    /// request. The other requests stay valid, and all of them on timeout. Empty `reqs` is
    /// [`Error::Invalid`].
    pub fn wait_any_recv(
        &mut self,
        reqs: &[RecvRequest],
        timeout: Option<Duration>,
    ) -> Result<(usize, Result<Received>)> {
        if reqs.is_empty() {
            return Err(Error::Invalid("wait_any_recv: no request".into()));
        }
        let mut first = None;
        self.wait_until(timeout, |ep| {
            first = reqs.iter().position(|r| {
                matches!(
                    ep.req.recvs.get(&r.id).map(|r| &r.state),
                    Some(RecvState::Done(_)) | None
                )
            });
            first.is_some()
        })?;
        let i = first.expect("the wait ended on a completed request");
        Ok((
            i,
            self.take_recv(reqs[i].id)
                .and_then(|r| r.ok_or(Error::Consumed)),
        ))
    }

    /// Cancels a receive that has not matched a message; returns its buffer. `Ok(None)`
    /// when it had already matched (complete it with `wait_recv`).
    pub fn cancel_recv(&mut self, req: &RecvRequest) -> Result<Option<Vec<u8>>> {
        if !self.req.matcher.cancel(&req.id) {
            return Ok(None);
        }
        match self.req.remove_recv(req.id) {
            Some(RecvOp {
                buf: RecvBuf::Owned(v),
                ..
            }) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Looks for a message matching `sel` that has arrived and not been received yet,
    /// without receiving it. Makes progress first.
    pub fn probe(&mut self, sel: Selector) -> Option<Status> {
        self.progress();
        for i in 0..self.peers.len() {
            if self.peers[i].alive && self.peers[i].blocked {
                self.drain(i, true);
            }
        }
        self.req.matcher.probe(&sel).map(|u| Status {
            peer: u.src,
            tag: u.tag,
            len: u.item.len(),
        })
    }

    /// Receives a message matching `sel` without copying it when it is a small message at
    /// the head of its sender's ring: the guard borrows the ring memory and frees it when
    /// dropped. Other messages (unexpected, or large) are delivered in an owned buffer
    /// behind the same guard. Waits up to `timeout`.
    pub fn recv_in_place(
        &mut self,
        sel: Selector,
        timeout: Option<Duration>,
    ) -> Result<InPlace<'_>> {
        let mut found: Option<(usize, Rx, u64)> = None;
        let mut owned: Option<(Status, Vec<u8>)> = None;
        let mut gone = None;
        self.wait_until(timeout, |ep| {
            if let Some(u) = ep.req.matcher.probe(&sel) {
                let is_eager = matches!(u.item, Arrived::Eager(_));
                if is_eager {
                    if let Some(u) = ep.req.matcher.take_unexpected(&sel) {
                        if let Arrived::Eager(v) = u.item {
                            owned = Some((
                                Status {
                                    peer: u.src,
                                    tag: u.tag,
                                    len: v.len() as u64,
                                },
                                v,
                            ));
                            return true;
                        }
                    }
                }
                return true; // a rendezvous message: received into a buffer below
            }
            for i in 0..ep.peers.len() {
                if sel.src.is_some_and(|s| s.0 as usize != i) || !ep.peers[i].alive {
                    continue;
                }
                let p = &mut ep.peers[i];
                if let Ok(Some(r)) = p.link.peek(&ep.nets, i) {
                    if let Ok(Frame::Eager { tag, .. }) = Frame::parse(p.link.frame(&ep.nets, i, r))
                    {
                        if sel.matches(PeerId(i as u32), tag)
                            && !ep.req.matcher.has_posted_for(PeerId(i as u32), tag)
                        {
                            found = Some((i, r, tag));
                            return true;
                        }
                    }
                }
            }
            // The named peer is gone and left nothing matching: nothing more can come.
            gone = ep.gone_source(&sel);
            gone.is_some()
        })
        .or_else(|e| {
            if matches!(e, Error::Timeout) && self.req.matcher.probe(&sel).is_some() {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        if let Some((i, r, tag)) = found {
            let len = self.peers[i]
                .link
                .frame(&self.nets, i, r)
                .len()
                .saturating_sub(EAGER_HEADER);
            return Ok(InPlace {
                ep: self,
                status: Status {
                    peer: PeerId(i as u32),
                    tag,
                    len: len as u64,
                },
                data: InPlaceData::Ring(i, r),
            });
        }
        if let Some((status, v)) = owned {
            return Ok(InPlace {
                ep: self,
                status,
                data: InPlaceData::Owned(v),
            });
        }
        if let Some(e) = gone {
            return Err(e);
        }
        // A rendezvous message is waiting: receive it into a buffer of its size.
        let len = self.req.matcher.probe(&sel).map(|u| u.item.len());
        let len = len.ok_or(Error::Timeout)?;
        let req = self.irecv(sel, vec![0u8; len as usize])?;
        let got = self.wait_recv(&req, None)?;
        Ok(InPlace {
            ep: self,
            status: got.status,
            data: InPlaceData::Owned(got.buf),
        })
    }

    /// Matched a message to receive `rid`: copy it in, or start the rendezvous.
    pub(super) fn deliver(&mut self, src: PeerId, tag: u64, rid: u64, item: Arrived) {
        match item {
            Arrived::Eager(v) => self.complete_eager(src, tag, rid, &v),
            Arrived::Rts { len, send_id, addr } => {
                self.start_rendezvous(src, tag, rid, len, send_id, addr)
            }
        }
    }

    pub(super) fn complete_eager(&mut self, src: PeerId, tag: u64, rid: u64, data: &[u8]) {
        let Some(op) = self.req.recvs.get_mut(&rid) else {
            return;
        };
        op.state = RecvState::Done(copy_eager(src, tag, data, op.buf.slice()));
        self.req.finished.push((false, rid));
    }
}

pub(super) enum InPlaceData {
    Ring(usize, Rx),
    Owned(Vec<u8>),
}

/// A received small message read in place from the sender's ring (zero copies), or an
/// owned buffer when the message could not be read in place. The ring space is freed when
/// the guard is dropped; until then the sender's later messages queue behind it.
pub struct InPlace<'a> {
    ep: &'a mut Endpoint,
    status: Status,
    data: InPlaceData,
}

impl InPlace<'_> {
    /// Who sent what.
    pub fn status(&self) -> Status {
        self.status
    }
}

impl std::ops::Deref for InPlace<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            InPlaceData::Ring(i, r) => {
                &self.ep.peers[*i].link.frame(&self.ep.nets, *i, *r)[EAGER_HEADER..]
            }
            InPlaceData::Owned(v) => v,
        }
    }
}

impl Drop for InPlace<'_> {
    fn drop(&mut self) {
        if let InPlaceData::Ring(i, r) = self.data {
            let p = &mut self.ep.peers[i];
            self.ep.stats.frames_received += 1;
            if p.release(&mut self.ep.nets, i, r) {
                p.link.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::events::{Event, REQUESTS};
    use crate::lease::{Dst, RecvBuf};
    use crate::{Config, Error, Selector};

    fn pair() -> (
        (super::Endpoint, super::PeerId),
        (super::Endpoint, super::PeerId),
    ) {
        let cfg = || Config {
            calibrate: false,
            ..Config::default()
        };
        super::super::connected_pair(cfg(), cfg())
    }

    /// Events until the endpoint's queue is empty, after progress passes enough to report
    /// everything finished.
    fn events(ep: &mut super::Endpoint) -> Vec<Event> {
        ep.progress();
        std::iter::from_fn(|| ep.pop_event()).collect()
    }

    /// `poll_eager` offers the eager messages at the rings' heads in order and stops at the
    /// first one declined; one given back with `set_aside` waits as unexpected, ahead of
    /// those still in the rings; a held message or a posted receive keeps the poll away.
    #[test]
    fn poll_eager_offers_the_ring_heads_and_takes_back_what_it_is_given() {
        let ((mut a, pa), (mut b, pb)) = pair();
        for (tag, m) in [(1, &b"one"[..]), (2, b"two"), (3, b"three")] {
            a.send(pa, tag, m).unwrap();
        }
        // Takes the first, declines the second: the poll ends there.
        let mut seen = Vec::new();
        let n = b.poll_eager(|src, tag, data| {
            seen.push((src, tag, data.to_vec()));
            tag == 1
        });
        assert_eq!(n, Some(1));
        assert_eq!(seen, [(pb, 1, b"one".to_vec()), (pb, 2, b"two".to_vec())]);
        // Given back, the first waits as unexpected, ahead of those still in the ring, and
        // the endpoint holding a message keeps the poll away.
        b.set_aside(pb, 1, b"one".to_vec()).unwrap();
        assert_eq!(b.unexpected_count(), 1);
        assert_eq!(b.poll_eager(|_, _, _| panic!("a message is held")), None);
        let mut buf = [0u8; 8];
        for m in [&b"one"[..], b"two", b"three"] {
            let st = b.recv(Selector::any(), &mut buf).unwrap();
            assert_eq!(&buf[..st.len as usize], m);
        }
        // So does a posted receive.
        let _r = b.irecv(Selector::any(), vec![0; 8]).unwrap();
        assert_eq!(b.posted_recvs(), 1);
        assert_eq!(b.poll_eager(|_, _, _| panic!("a receive is posted")), None);
        assert!(b.set_aside(super::PeerId(99), 1, Vec::new()).is_err());
    }

    /// A small message into a receive in caller memory completes from the ring with no
    /// event and leaves nothing to finish; a receive into an owned buffer is left to the
    /// progress pass's event; messages no receive wants are copied aside, in order.
    #[test]
    fn poll_recvs_completes_receives_in_caller_memory_and_leaves_the_rest() {
        let ((mut a, pa), (mut b, pb)) = pair();
        b.set_interest(REQUESTS);
        // Caller memory, as `irecv_raw_user` lends it.
        let buf = Dst::from_static(Box::leak(Box::new([0u8; 16])));
        let raw = b.post_recv(
            Selector::exact(Some(pb), 7),
            RecvBuf::InPlace(buf.clone()),
            77,
        );
        a.send(pa, 7, b"in place").unwrap();
        let mut done = Vec::new();
        assert_eq!(
            b.poll_recvs(|id, user, r| done.push((id, user, r))),
            Some(1)
        );
        let (id, user, r) = done.pop().unwrap();
        assert_eq!((id, user), (raw.id(), 77));
        let st = r.unwrap();
        assert_eq!((st.peer, st.tag, st.len), (pb, 7, 8));
        assert_eq!(buf.range(0, 8), Some(&b"in place"[..]));
        assert!(matches!(b.finish_recv(&raw), Err(Error::Consumed)));
        assert_eq!(
            b.req.watching(),
            0,
            "the taken request is no longer watched"
        );
        assert!(events(&mut b).is_empty(), "no event for a request taken");

        // Owned buffer: completed in the ring's order, reported by an event.
        let owned = b.irecv(Selector::exact(Some(pb), 8), vec![0; 16]).unwrap();
        a.send(pa, 8, b"owned").unwrap();
        assert_eq!(b.recv_user(owned.id()), Some(0));
        assert_eq!(
            b.poll_recvs(|_, _, _| panic!("not in caller memory")),
            Some(0)
        );
        let ev = events(&mut b);
        assert!(
            matches!(ev[..], [Event::RecvDone { req, ok: true }] if req == owned.id()),
            "{ev:?}"
        );
        let got = b.finish_recv(&owned).unwrap().unwrap();
        assert_eq!(&got.buf, b"owned");

        // Nothing wants tag 9: both messages are copied aside, and receives posted later
        // get them in the order they came; a message behind them still reaches its
        // posted receive in the same poll.
        let buf = Dst::from_static(Box::leak(Box::new([0u8; 16])));
        let behind = b.post_recv(
            Selector::exact(Some(pb), 10),
            RecvBuf::InPlace(buf.clone()),
            5,
        );
        a.send(pa, 9, b"later").unwrap();
        a.send(pa, 9, b"latest").unwrap();
        a.send(pa, 10, b"behind").unwrap();
        let mut done = Vec::new();
        assert_eq!(
            b.poll_recvs(|id, user, r| done.push((id, user, r.map(|s| s.len)))),
            Some(1)
        );
        assert!(
            matches!(done[..], [(id, 5, Ok(6))] if id == behind.id()),
            "{done:?}"
        );
        assert_eq!(buf.range(0, 6), Some(&b"behind"[..]));
        assert_eq!(b.unexpected_count(), 2);
        for want in [&b"later"[..], b"latest"] {
            let mut late = [0u8; 8];
            let st = b.recv(Selector::exact(Some(pb), 9), &mut late).unwrap();
            assert_eq!(&late[..st.len as usize], want);
        }
        assert_eq!(b.req.watching(), 0);

        // A watched receive posted for a message copied aside, and taken at once, leaves
        // no event to report: the next poll still serves the rings.
        a.send(pa, 11, b"aside").unwrap();
        assert_eq!(b.poll_recvs(|_, _, _| panic!("no receive yet")), Some(0));
        let buf = Dst::from_static(Box::leak(Box::new([0u8; 16])));
        let taken = b.post_recv(
            Selector::exact(Some(pb), 11),
            RecvBuf::InPlace(buf.clone()),
            6,
        );
        assert_eq!(b.finish_recv(&taken).unwrap().unwrap().status.len, 5);
        assert_eq!(buf.range(0, 5), Some(&b"aside"[..]));
        let next = b.post_recv(Selector::exact(Some(pb), 12), RecvBuf::InPlace(buf), 8);
        a.send(pa, 12, b"next").unwrap();
        let mut done = Vec::new();
        assert_eq!(b.poll_recvs(|id, user, _| done.push((id, user))), Some(1));
        assert_eq!(done, [(next.id(), 8)]);
        assert!(events(&mut b).is_empty(), "nothing to report");
    }

    /// Every watched request is reported once, whichever way it finished, and one taken
    /// before the report is not reported at all.
    #[test]
    fn finished_requests_are_reported_once() {
        let ((mut a, pa), (mut b, pb)) = pair();
        a.set_interest(REQUESTS);
        b.set_interest(REQUESTS);
        // A send complete at once (in the peer's ring) and two receives.
        let s = a.isend(pa, 1, vec![1u8; 32]).unwrap();
        let r1 = b.irecv(Selector::exact(Some(pb), 1), vec![0; 32]).unwrap();
        let r2 = b.irecv(Selector::exact(Some(pb), 2), vec![0; 32]).unwrap();
        a.send(pa, 2, &[2u8; 32]).unwrap();
        let ev_a = events(&mut a);
        assert!(
            matches!(ev_a[..], [Event::SendDone { req, ok: true }] if req == s.id()),
            "{ev_a:?}"
        );
        assert!(events(&mut a).is_empty(), "reported twice");
        assert_eq!(a.req.watching(), 0);
        b.progress();
        let mut ids: Vec<u64> = std::iter::from_fn(|| b.pop_event())
            .filter_map(|e| match e {
                Event::RecvDone { req, ok: true } => Some(req),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, [r1.id(), r2.id()]);
        // A message copied aside (nothing wanted it), then a receive that matches it when
        // posted and is taken before any pass.
        a.send(pa, 3, &[3u8; 32]).unwrap();
        b.progress();
        assert_eq!(b.unexpected_count(), 1);
        let r3 = b.irecv(Selector::exact(Some(pb), 3), vec![0; 32]).unwrap();
        let got = b.finish_recv(&r3).unwrap().unwrap();
        assert_eq!(got.buf, [3u8; 32]);
        let ev = events(&mut b);
        assert!(ev.is_empty(), "{ev:?}");
        for r in [r1, r2] {
            assert!(b.finish_recv(&r).unwrap().is_some());
        }
        assert_eq!(b.req.watching(), 0);
        assert!(b.req.finished.is_empty());
    }
}
