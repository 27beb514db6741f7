//! Sending: eager frames, rendezvous requests and the pipelined copy, the send queue per
//! peer, and a send request's life (test, wait, cancel), in place included ([`SendSlot`]).

use super::*;
use clink_proto::msg::CancelStep;

impl Endpoint {
    /// Starts sending `data` to `peer` with `tag`. Small messages are copied into the
    /// peer's ring at once (the request is then already complete); large ones wait in
    /// `data` until the receiver has read them (one copy, by CMA) or they have been
    /// pushed through the ring (pipeline). `data` is kept alive by the request: pass a `Vec<u8>` (moved, not
    /// copied) or a `Bytes`.
    ///
    /// With [`events::REQUESTS`] in the interest mask, its completion is reported by an
    /// [`Event::SendDone`] (a send complete at once included, under its own number).
    pub fn isend(&mut self, peer: PeerId, tag: u64, data: impl Into<Bytes>) -> Result<SendRequest> {
        let req = self.start_send(peer, tag, SendBuf::Owned(data.into()))?;
        if self.evq.interest & events::REQUESTS == 0 {
            return Ok(req);
        }
        let id = if req.id == 0 {
            // Complete already: give it a number and a finished entry to report and take.
            let id = self.req.alloc_id();
            self.req.add_send(
                id,
                SendOp {
                    peer,
                    tag,
                    data: SendBuf::Owned(Bytes::new()),
                    state: SendState::Done(Ok(())),
                    watched: false,
                },
            );
            self.req.finished.push((true, id));
            id
        } else {
            req.id
        };
        // Reported by the next progress pass (which `next_event`, `wait_event` and
        // `prepare_wait` all run first; `wait_event`'s fast path stands aside while any
        // request is watched).
        self.req.watch_send(id);
        Ok(SendRequest { id })
    }

    pub(super) fn start_send(
        &mut self,
        peer: PeerId,
        tag: u64,
        data: SendBuf,
    ) -> Result<SendRequest> {
        let req = self.start_send_kick(peer, tag, data, true)?;
        self.read_held_acks(peer);
        Ok(req)
    }

    /// A UDP connection whose window holds queued data back waits for acks that only a
    /// read brings (a kernel stack reads them on its own): one progress pass, or a loop
    /// that only sends would leave everything past the first window queued until it
    /// called something that reads. Nothing extra while the window has room.
    pub(super) fn read_held_acks(&mut self, peer: PeerId) {
        let held = self
            .udp(peer.0 as usize)
            .is_some_and(|u| u.conn().has_unsent());
        if held {
            self.progress_pass(true);
        }
    }

    /// The blocking sends' end: returns once what `peer`'s UDP connection held back for
    /// its window or the peer's credit is transmitted, reading the acks that make room.
    /// From then on the connection's datagrams are in flight, which the keepalive thread
    /// repeats while the caller is away (computing after its last send, say); data still
    /// queued would wait for the caller's next call. (TCP's blocking `write` likewise
    /// returns once the kernel holds the bytes.) With half the window in flight it reads
    /// the acks once: a caller that only sends would otherwise leave them unread, and the
    /// datagrams the keepalive thread repeats while it is away would pile up. Ends early
    /// when the peer fails.
    #[inline]
    pub(super) fn transmit_held(&mut self, peer: PeerId) -> Result<()> {
        match self.peers.get(peer.0 as usize) {
            Some(p) if p.alive && matches!(p.link, Link::Udp) => self.wait_held(peer.0 as usize),
            _ => Ok(()),
        }
    }

    fn holds_unsent(&self, i: usize) -> bool {
        self.peers.get(i).is_some_and(|p| p.alive)
            && self.udp(i).is_some_and(|u| u.conn().has_unsent())
    }

    #[inline(never)]
    fn wait_held(&mut self, i: usize) -> Result<()> {
        let Some(c) = self.udp(i).map(|u| u.conn()) else {
            return Ok(());
        };
        if c.has_unsent() {
            return self.wait_until(None, |ep| !ep.holds_unsent(i));
        }
        if c.window_half_used() {
            self.progress_pass(true);
        }
        Ok(())
    }

    /// [`Endpoint::start_send`]; an eager message or a large one's announcement is sent
    /// at once (`kick`), or left queued in its link for a later kick (a batch's messages
    /// then leave together: one gathering write over TCP, one batch of datagrams over
    /// UDP).
    pub(super) fn start_send_kick(
        &mut self,
        peer: PeerId,
        tag: u64,
        data: SendBuf,
        kick: bool,
    ) -> Result<SendRequest> {
        let Some(p) = self.peers.get_mut(peer.0 as usize) else {
            return Err(Error::UnknownPeer(peer));
        };
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        let bytes = data.bytes();
        let len = bytes.len() as u64;
        let nets = &self.nets;
        let unreliable = || p.link.unreliable(nets, peer.0 as usize);
        match msg::Protocol::choose(len, p.eager_max, unreliable) {
            Ok(msg::Protocol::Eager) => {
                self.stats.eager_sends += 1;
                self.stats.eager_bytes += len;
                if self.eager_now(peer.0 as usize, tag, bytes, kick) {
                    return Ok(SendRequest { id: 0 });
                }
                self.stats.ring_full += 1;
            }
            Ok(msg::Protocol::Rendezvous) => self.stats.rendezvous_sends += 1,
            Err(e) => {
                return Err(Error::TooLarge(format!(
                    "{} bytes over an unreliable link: at most {} (CLINK_EAGER_MAX)",
                    e.len, e.max
                )))
            }
        }
        let id = self.req.alloc_id();
        let p = &mut self.peers[peer.0 as usize];
        p.txq.push_send(id);
        self.mark_busy(peer.0 as usize);
        self.req.add_send(
            id,
            SendOp {
                peer,
                tag,
                data,
                state: SendState::Queued,
                watched: false,
            },
        );
        // A batch's announcements leave together (over UDP one datagram run through
        // the kernel instead of a system call and a trip through the stack each).
        if kick {
            self.flush(peer.0 as usize);
        } else {
            self.move_queued(peer.0 as usize);
        }
        Ok(SendRequest { id })
    }

    /// Writes an eager message into peer `i`'s link if it takes it now and nothing waits
    /// before it in the peer's queue (then kicked, when `kick`): true when it is in.
    #[inline]
    fn eager_now(&mut self, i: usize, tag: u64, data: &[u8], kick: bool) -> bool {
        let p = &mut self.peers[i];
        if !p.txq.is_empty()
            || !p
                .link
                .try_send(&mut self.nets, i, &Frame::Eager { tag, data })
        {
            return false;
        }
        self.stats.frames_sent += 1;
        if kick {
            self.kick(i);
        }
        true
    }

    /// Sends `data` now if it goes whole into its peer's link without waiting: `Ok(true)`
    /// when it is in (over, as a blocking [`Endpoint::send`]'s message would be; over the
    /// network it leaves with the connection's window), `Ok(false)` when it would have to
    /// wait (longer than the eager threshold, the ring full, or earlier messages queued
    /// for that peer), and then nothing was sent. For callers that never block and keep
    /// the message themselves otherwise (a libfabric inject).
    #[inline]
    pub fn try_send(&mut self, peer: PeerId, tag: u64, data: &[u8]) -> Result<bool> {
        let p = self.peer(peer)?;
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        if data.len() as u64 > p.eager_max {
            return Ok(false);
        }
        let sent = self.eager_now(peer.0 as usize, tag, data, true);
        if sent {
            self.stats.eager_sends += 1;
            self.stats.eager_bytes += data.len() as u64;
        }
        Ok(sent)
    }

    /// Lets a send complete on its own: nobody will wait for it.
    pub(super) fn detach_send(&mut self, req: SendRequest) {
        if req.id != 0 {
            self.req.detached.push(req.id);
        }
    }

    #[inline]
    pub(super) fn finish_borrowed_send(&mut self, req: SendRequest) -> Result<()> {
        // A message that went out at once (most small ones) has no request to wait for:
        // inline, so that callers across the C boundary skip the call too.
        if req.id == 0 {
            return Ok(());
        }
        self.wait_borrowed_send(req)
    }

    #[inline(never)]
    fn wait_borrowed_send(&mut self, req: SendRequest) -> Result<()> {
        // The request points into the caller's slice: it must be over before we return,
        // whatever happens. Only peer death (bounded by the liveness check) ends it early.
        match self.wait_send(&req, None) {
            Err(Error::Timeout) => unreachable!("no timeout given"),
            r => r,
        }
    }

    /// Tests a send: `Ok(true)` when complete, `Ok(false)` while pending, an error when
    /// it failed. Makes progress first.
    pub fn test_send(&mut self, req: &SendRequest) -> Result<bool> {
        if req.id == 0 {
            return Ok(true);
        }
        self.progress();
        self.take_send(req.id)
    }

    /// A send's outcome without a progress pass (for callers that learnt of its
    /// completion from [`Event::SendDone`]): as [`Endpoint::test_send`] otherwise.
    pub fn finish_send(&mut self, req: &SendRequest) -> Result<bool> {
        if req.id == 0 {
            return Ok(true);
        }
        self.take_send(req.id)
    }

    pub(super) fn take_send(&mut self, id: u64) -> Result<bool> {
        match self.req.sends.get(&id).map(|s| &s.state) {
            None => Err(Error::Consumed),
            Some(SendState::Done(_)) => match self.req.remove_send(id).map(|s| s.state) {
                Some(SendState::Done(r)) => r.map(|_| true),
                _ => Err(Error::Consumed),
            },
            Some(_) => Ok(false),
        }
    }

    /// Waits for a send to complete, at most `timeout` (`None`: until it completes or the
    /// peer dies). On timeout the request stays valid.
    pub fn wait_send(&mut self, req: &SendRequest, timeout: Option<Duration>) -> Result<()> {
        if req.id == 0 {
            return Ok(());
        }
        self.wait_send_over(req.id, timeout)?;
        self.take_send(req.id).map(|_| ())
    }

    /// Cancels a send. A send whose bytes are already in the peer's ring cannot be
    /// withdrawn (`Ok(false)`, it will be delivered); an unmatched rendezvous send is
    /// withdrawn (`Ok(true)`) after the receiver confirms. Waits for that answer (bounded by
    /// the peer's liveness).
    pub fn cancel_send(&mut self, req: SendRequest) -> Result<bool> {
        let id = req.id;
        let Some(op) = self.req.sends.get_mut(&id) else {
            return Ok(false);
        };
        let peer = op.peer;
        match op.state.cancel_step() {
            CancelStep::Withdraw => {
                // Never left this process: drop it from the queue.
                let p = &mut self.peers[peer.0 as usize];
                p.txq.withdraw(id);
                self.req.remove_send(id);
                Ok(true)
            }
            CancelStep::AskReceiver => {
                self.push_ctrl(peer.0 as usize, Frame::Cancel { send_id: id });
                self.wait_send_over(id, None)?;
                match self.req.remove_send(id).map(|s| s.state) {
                    Some(SendState::Done(Err(Error::Cancelled))) => Ok(true),
                    Some(SendState::Done(Err(e))) => Err(e),
                    _ => Ok(false),
                }
            }
            CancelStep::AwaitEnd => {
                self.wait_send_over(id, None)?;
                self.req.remove_send(id);
                Ok(false)
            }
            CancelStep::Over => {
                self.req.remove_send(id);
                Ok(false)
            }
        }
    }

    /// Waits until send `id` is over (or gone), at most `timeout`.
    fn wait_send_over(&mut self, id: u64, timeout: Option<Duration>) -> Result<()> {
        self.wait_until(timeout, |ep| {
            ep.req.sends.get(&id).is_none_or(|s| s.state.is_done())
        })
    }

    /// Claims space for an `len`-byte eager message in `peer`'s ring, to be written in
    /// place and published with [`SendSlot::commit`] (zero copies on the sending side).
    /// Waits up to `timeout` for ring space. `len` must not exceed the eager threshold.
    pub fn claim(
        &mut self,
        peer: PeerId,
        tag: u64,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<SendSlot<'_>> {
        let i = peer.0 as usize;
        let max = self.peer(peer)?.eager_max;
        if len as u64 > max {
            return Err(Error::TooLarge(format!(
                "claim of {len} bytes exceeds the eager threshold {max} towards {peer}"
            )));
        }
        if !self.peers[i].alive {
            return Err(Error::PeerDead(peer));
        }
        if self.peers[i].link.shm().is_none() {
            // Over the network the message is written into a buffer the link then owns
            // (one copy less than `send`, none saved on the wire).
            return Ok(SendSlot {
                ep: self,
                peer: i,
                res: None,
                owned: Some(vec![0u8; len]),
                len,
                tag,
            });
        }
        let need = EAGER_HEADER + len;
        self.wait_until(timeout, |ep| {
            let p = &mut ep.peers[i];
            // Armed (for the sleep) only when the record does not fit.
            let fits = |s: &mut ShmPeer| s.tx.has_room(need) || s.tx.arm_wait(need);
            !p.alive || (p.txq.is_empty() && p.link.shm_mut().is_some_and(fits))
        })?;
        let p = &mut self.peers[i];
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        let Some(shm) = p.link.shm_mut() else {
            return Err(Error::PeerDead(peer));
        };
        let Some(res) = shm.tx.reserve(need) else {
            return Err(Error::Timeout);
        };
        Ok(SendSlot {
            ep: self,
            peer: i,
            res: Some(res),
            owned: None,
            len,
            tag,
        })
    }

    pub(super) fn push_ctrl(&mut self, i: usize, f: Frame<'static>) {
        let p = &mut self.peers[i];
        if !p.alive {
            return;
        }
        if p.txq.is_empty() && p.link.try_send(&mut self.nets, i, &f) {
            self.stats.frames_sent += 1;
            return;
        }
        p.txq.push_ctrl(f);
        self.mark_busy(i);
    }

    /// Moves queued frames of peer `i` into its link and sends them; true when something
    /// moved.
    pub(super) fn flush(&mut self, i: usize) -> bool {
        let did = self.move_queued(i);
        if did {
            self.kick(i);
        }
        did
    }

    /// Moves queued frames of peer `i` into its link (its ring, or a network link's
    /// queue, sent by the next [`Endpoint::kick`]); true when something moved.
    fn move_queued(&mut self, i: usize) -> bool {
        let mut did = false;
        loop {
            let p = &mut self.peers[i];
            let ok = match p.txq.head(&self.req, p.eager_max) {
                None => break,
                Some(msg::Head::Frame(f)) => p.link.try_send(&mut self.nets, i, &f),
                Some(msg::Head::Stale) => true,
            };
            if !ok {
                break;
            }
            p.txq.pop(&mut self.req, p.eager_max);
            self.stats.frames_sent += 1;
            did = true;
        }
        did | self.pump_pipeline(i)
    }

    /// Copies chunks of the active pipelined send into the peer's ring while it has room;
    /// a send whose last chunk is in the ring is complete.
    pub(super) fn pump_pipeline(&mut self, i: usize) -> bool {
        let mut did = false;
        let p = &mut self.peers[i];
        if !p.txq.is_empty() {
            return false; // keep frame order: queued frames first
        }
        let ring_cells = p.link.shm().map(|s| s.tx.mem().cap());
        let chunk = |len| match ring_cells {
            Some(cells) => pipeline_chunk(&self.ctx, len, cells),
            // (Not reached over UDP or TCP, where a rendezvous is a bulk transfer;
            // bounded like an eager frame all the same.)
            None => crate::context::net_eager_threshold(&self.ctx, false),
        };
        while let Some((c, data)) = p.rndv.next_chunk(&self.req, chunk) {
            let f = Frame::Chunk {
                send_id: c.send_id,
                offset: c.offset,
                data,
            };
            if !p.link.try_send(&mut self.nets, i, &f) {
                break;
            }
            self.stats.frames_sent += 1;
            did = true;
            p.rndv.chunk_sent(&mut self.req, c);
        }
        did
    }
}

/// Space claimed in a peer's ring for one eager message ([`Endpoint::claim`]): write the
/// message into [`SendSlot::buf`], then [`SendSlot::commit`]. Dropping it uncommitted
/// abandons the message.
pub struct SendSlot<'a> {
    ep: &'a mut Endpoint,
    peer: usize,
    res: Option<crate::transport::shm::ring::Reservation>,
    /// Over the network: the message's own buffer, sent on commit.
    owned: Option<Vec<u8>>,
    len: usize,
    tag: u64,
}

impl Drop for SendSlot<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.res.take() {
            if let Some(shm) = self.ep.peers[self.peer].link.shm_mut() {
                shm.tx.abandon(r);
            }
        }
    }
}

impl SendSlot<'_> {
    /// The message bytes, in the peer's ring.
    pub fn buf(&mut self) -> &mut [u8] {
        if let Some(v) = &mut self.owned {
            return v;
        }
        let Some(shm) = self.ep.peers[self.peer].link.shm_mut() else {
            return &mut [];
        };
        let Some(r) = &self.res else { return &mut [] };
        shm.reserved(r, EAGER_HEADER, self.len)
    }

    /// Publishes the message.
    pub fn commit(mut self) {
        if let Some(v) = self.owned.take() {
            let peer = PeerId(self.peer as u32);
            // The peer may have died meanwhile: its requests fail, and so does this one,
            // silently as a ring commit would (the caller learns it from the next call).
            if let Ok(req) = self.ep.start_send(peer, self.tag, SendBuf::Owned(v.into())) {
                self.ep.detach_send(req);
            }
            return;
        }
        let Some(r) = self.res.take() else { return };
        let Some(shm) = self.ep.peers[self.peer].link.shm_mut() else {
            return;
        };
        let mut hdr = [0u8; EAGER_HEADER];
        Frame::encode_eager_header(self.tag, &mut hdr);
        shm.reserved(&r, 0, EAGER_HEADER).copy_from_slice(&hdr);
        if shm.commit(r) {
            self.ep.stats.doorbells += 1;
        }
        self.ep.stats.frames_sent += 1;
        self.ep.stats.eager_sends += 1;
        self.ep.stats.eager_bytes += self.len as u64;
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Error, PeerId, Selector};

    /// `try_send` puts a message into the peer's ring at once or sends nothing: above the
    /// eager threshold and with the ring full it answers false, and none of those
    /// messages arrives; once the receiver made room it takes messages again.
    #[test]
    fn try_send_sends_now_or_not_at_all() {
        let cfg = || Config {
            calibrate: false,
            ..Config::default()
        };
        let ((mut a, pa), (mut b, pb)) = super::super::connected_pair(cfg(), cfg());
        let max = a.eager_max(pa).unwrap() as usize;
        assert!(a.try_send(pa, 1, b"now").unwrap());
        assert!(!a.try_send(pa, 2, &vec![0; max + 1]).unwrap());
        let msg = vec![7u8; 1024];
        let mut sent = 0;
        while a.try_send(pa, 3, &msg).unwrap() {
            sent += 1;
            assert!(sent < 1 << 20, "the ring never filled");
        }
        assert!(sent > 0);
        let mut buf = vec![0u8; max + 1];
        let st = b.recv(Selector::any(), &mut buf).unwrap();
        assert_eq!((st.peer, st.tag, &buf[..3]), (pb, 1, &b"now"[..]));
        for k in 0..sent {
            let st = b.recv(Selector::any(), &mut buf).unwrap();
            assert_eq!((st.tag, st.len), (3, 1024), "message {k}");
        }
        assert!(
            b.probe(Selector::any()).is_none(),
            "a refused message arrived"
        );
        assert!(a.try_send(pa, 4, b"again").unwrap());
        let st = b.recv(Selector::any(), &mut buf).unwrap();
        assert_eq!((st.tag, &buf[..5]), (4, &b"again"[..]));
        assert!(matches!(
            a.try_send(PeerId(9), 1, b"x"),
            Err(Error::UnknownPeer(_))
        ));
    }
}
