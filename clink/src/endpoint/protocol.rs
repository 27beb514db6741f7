//! The messaging protocol's frames: eager messages and RTSs meet the posted receives here;
//! the rendezvous frames go to the peer's [`msg::Rendezvous`], whose actions are carried
//! out here (CMA reads and writes, control frames, bulk transfers and chunks); and the
//! transfers a network link finished are reported to it.

use super::*;
use clink_proto::msg::Arrival;

impl Endpoint {
    /// Receive `rid` matched peer `src`'s announcement of `send_id` (`len` bytes at `addr`
    /// in its memory) with `tag`: read it, or ask for it.
    pub(super) fn start_rendezvous(
        &mut self,
        src: PeerId,
        tag: u64,
        rid: u64,
        len: u64,
        send_id: u64,
        addr: u64,
    ) {
        let i = src.0 as usize;
        let p = &mut self.peers[i];
        if !p.alive {
            if let Some(op) = self.req.recvs.get_mut(&rid) {
                op.state = RecvState::Done(Err(Error::PeerDead(src)));
                self.req.finished.push((false, rid));
            }
            return;
        }
        let cma = p.link.cma();
        let method = match self.ctx.config.rndv {
            Some(_) => rendezvous_method(&self.ctx, len, cma),
            None => {
                let model = rendezvous_method(&self.ctx, len, cma);
                p.rndv.chooser.choose(&self.ctx.costs, len, cma, model)
            }
        };
        // (Whether the peer may write into this process for a split read is not waited
        // for: the handshake's late Ready says it, but a refused write is answered, and
        // the first one stops the splits.)
        let how = (method, p.link.shm().is_some(), self.ctx.config.cma_split);
        let mut acts = std::mem::take(&mut self.acts);
        let now = sys::monotonic_ns();
        p.rndv.matched(
            &mut self.req,
            rid,
            msg::Announced {
                tag,
                len,
                send_id,
                addr,
            },
            how,
            now,
            &mut acts,
        );
        self.act(i, acts);
    }

    /// Carries out, in order, what the rendezvous protocol asked for with peer `i` (and
    /// what their completions ask for in turn).
    fn act(&mut self, i: usize, mut acts: Vec<msg::Action<Error>>) {
        let mut more = std::mem::take(&mut self.acts_more);
        loop {
            for a in acts.drain(..) {
                self.act_one(i, a, &mut more);
            }
            if more.is_empty() {
                break;
            }
            std::mem::swap(&mut acts, &mut more);
        }
        // (Both kept for their allocations.)
        (self.acts, self.acts_more) = (acts, more);
    }

    fn act_one(&mut self, i: usize, a: msg::Action<Error>, more: &mut Vec<msg::Action<Error>>) {
        let src = PeerId(i as u32);
        match a {
            msg::Action::Send(f) => {
                if matches!(f, Frame::Push { .. }) {
                    self.stats.cma_splits += 1;
                }
                self.push_ctrl(i, f);
            }
            msg::Action::Read(r) => {
                let Some(op) = self.req.recvs.get_mut(&r.rid) else {
                    return;
                };
                let buf = &mut op.buf.slice()[r.at as usize..(r.at + r.len) as usize];
                let read = match self.peers[i].link.shm() {
                    Some(shm) => sys::cma_read(shm.pid, r.addr, buf),
                    None => Err(std::io::Error::other("not a shared-memory peer")),
                };
                if read.is_ok() {
                    self.stats.cma_bytes += r.len;
                }
                let now = sys::monotonic_ns();
                let costs = &self.ctx.costs;
                self.peers[i]
                    .rndv
                    .read_done(&mut self.req, costs, r, read, now, more);
            }
            msg::Action::Write { send_id, addr, len } => {
                let pid = self.peers[i].link.shm().map(|s| s.pid);
                let data = self.req.sends.get(&send_id).map(|op| op.data.bytes());
                let ok = match (pid, data) {
                    (Some(pid), Some(d)) => sys::cma_write(pid, addr, &d[..len as usize]).is_ok(),
                    _ => false,
                };
                self.peers[i].rndv.written(send_id, ok, more);
            }
            msg::Action::Expect { send_id, rid, len } => {
                // A bulk transfer straight into the posted buffer (speculatively). The
                // receive op keeps the buffer until the transfer completes
                // (finish_bulk_peer) or the peer fails (fail_peer_ops clears the link's
                // transfers first).
                let op = self.req.recvs.get_mut(&rid);
                if let (Some(u), Some(op)) = (self.peers[i].link.bulk(&mut self.nets, i), op) {
                    u.expect_bulk(send_id, len, op.buf.lease());
                }
            }
            msg::Action::Transfer { send_id, len } => {
                let p = &mut self.peers[i];
                let Some(u) = p.link.bulk(&mut self.nets, i) else {
                    p.rndv.chunks.push(send_id, len);
                    self.pump_pipeline(i);
                    return;
                };
                // The send op holds the bytes until it completes, which happens only when
                // the link reports the transfer acknowledged, or the peer fails (the
                // link's transfers are cleared first).
                if let Some(op) = self.req.sends.get_mut(&send_id) {
                    if !u.send_bulk(send_id, op.data.lease()) && op.state.fail(Error::PeerDead(src))
                    {
                        self.req.finished.push((true, send_id));
                    }
                }
                self.kick(i);
            }
        }
    }

    /// Copies aside, as unexpected, eager message `bytes` with `tag` from peer `i` that no
    /// posted receive wants (a receive posted later takes it from there).
    pub(super) fn set_aside_eager(&mut self, i: usize, tag: u64, bytes: Vec<u8>) {
        self.announce(i, tag);
        self.stats.unexpected += 1;
        self.req
            .set_aside(PeerId(i as u32), tag, Arrived::Eager(bytes));
    }

    /// Handles one frame; `Ok(false)` when it was left in the ring (see `drain`).
    pub(super) fn handle(&mut self, i: usize, rec: Rx, force: bool) -> Result<bool> {
        let src = PeerId(i as u32);
        // The record lives in the peer's segment, kept mapped while the peer exists (or in
        // the heap buffer at the head of a UDP link's queue); the slice is detached from
        // `self` so the handlers below can take `&mut self`.
        let lease = self.peers[i].link.frame_lease(&self.nets, i, rec);
        let bytes = lease.bytes();
        let f = Frame::parse(bytes).map_err(|e| Error::Proto {
            peer: src,
            source: e,
        })?;
        match f {
            Frame::Eager { tag, data } => match self.req.arrival(src, tag, force) {
                Arrival::Posted(rid) => self.complete_eager(src, tag, rid, data),
                Arrival::Leave => {
                    self.announce(i, tag);
                    return Ok(false);
                }
                Arrival::SetAside => self.set_aside_eager(i, tag, data.to_vec()),
            },
            Frame::Rts {
                tag,
                len,
                send_id,
                addr,
            } => match self.req.arrival(src, tag, force) {
                Arrival::Posted(rid) => self.start_rendezvous(src, tag, rid, len, send_id, addr),
                Arrival::Leave => {
                    self.announce(i, tag);
                    return Ok(false);
                }
                Arrival::SetAside => {
                    self.announce(i, tag);
                    self.req
                        .set_aside(src, tag, Arrived::Rts { len, send_id, addr })
                }
            },
            Frame::Close => {
                // Transfers the peer acknowledged before its goodbye (the ack rides with
                // it: see `close`) complete; only the rest fail.
                self.finish_bulk_peer(i);
                // Its sender lingers until the goodbye is acknowledged, and a failed
                // peer's link sends nothing more: the ack goes now.
                if let Some(u) = self.udp_mut(i) {
                    u.ack_now();
                    self.kick(i);
                }
                self.peers[i].closing = true;
                self.fail_peer(i, format!("{src} closed the connection"))
            }
            Frame::Rma(r) => self.handle_rma(i, bytes, r)?,
            // The rendezvous frames.
            ref f => self.handle_rendezvous(i, f)?,
        }
        Ok(true)
    }

    /// Hands peer `i`'s rendezvous frame `f` to its protocol and carries out what it asks
    /// (out of line: at most a few per large message, kept off the eager path).
    #[inline(never)]
    fn handle_rendezvous(&mut self, i: usize, f: &Frame<'_>) -> Result<()> {
        let mut acts = std::mem::take(&mut self.acts);
        let now = sys::monotonic_ns();
        let landed = self.peers[i]
            .rndv
            .on_frame(&mut self.req, &self.ctx.costs, f, now, &mut acts);
        match landed {
            Ok(msg::Landed::Nothing) => {}
            Ok(msg::Landed::Chunk(n)) => self.stats.pipeline_bytes += n,
            Ok(msg::Landed::Pushed(n)) => self.stats.cma_bytes += n,
            Err(r) => {
                self.acts = acts;
                return Err(bad_send_ref(PeerId(i as u32), r.send_id, r.what));
            }
        }
        self.act(i, acts);
        Ok(())
    }

    /// Completes the rendezvous sends and receives whose bulk transfers peer `i`'s link
    /// finished (UDP or TCP).
    pub(super) fn finish_bulk_peer(&mut self, i: usize) {
        let Some((done_in, done_out)) = self.peers[i]
            .link
            .bulk(&mut self.nets, i)
            .and_then(|b| b.take_done())
        else {
            return;
        };
        if !done_in.is_empty() {
            if let Some(u) = self.udp_mut(i) {
                // The sender's send completes with the ack of the last fragments: it goes
                // with this pass's (or wake-up's) transmit, not after the ack delay (the
                // application may stop driving this endpoint once it has its message).
                u.ack_now();
            }
        }
        self.peers[i]
            .rndv
            .transfers_done(&mut self.req, &done_in, &done_out);
    }
}

/// The protocol error for a peer's frame naming a send (or its receive) that does not
/// exist or is not in the state the frame needs.
pub(super) fn bad_send_ref(peer: PeerId, send_id: u64, what: &'static str) -> Error {
    Error::Proto {
        peer,
        source: clink_proto::ProtoError::OutOfRange {
            what,
            value: send_id,
            limit: 0,
        },
    }
}
