//! The messaging protocol's frame handling: eager delivery, rendezvous (RTS, CTS, FIN),
//! the CMA read and its split, the pipelined copy, cancels; and completing the transfers
//! a network link finished.

use super::*;

impl Endpoint {
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
        let status = Status {
            peer: src,
            tag,
            len,
        };
        let Some(op) = self.req.recvs.get_mut(&rid) else {
            return;
        };
        let p = &mut self.peers[i];
        if !p.alive {
            op.state = RecvState::Done(Err(Error::PeerDead(src)));
            self.req.finished.push((false, rid));
            return;
        }
        let cma = p.link.cma();
        let method = match self.ctx.config.rndv {
            Some(_) => rendezvous_method(&self.ctx, len, cma),
            None => {
                let model = rendezvous_method(&self.ctx, len, cma);
                p.chooser.choose(&self.ctx.costs, len, cma, model)
            }
        };
        let cap = op.buf.slice().len() as u64;
        // (Whether the peer may write into this process for a split read is not waited
        // for: the handshake's late Ready says it, but a refused write is answered, and
        // the first one stops the splits.)
        let split = self.ctx.config.cma_split && !p.push_refused;
        let shm_pid = p.link.shm().map(|s| s.pid);
        let plan = msg::plan(method, shm_pid.is_some(), len, cap, split);
        let since = sys::monotonic_ns();
        match (plan, shm_pid) {
            (msg::Plan::Cma { n, pushed }, Some(pid)) => {
                let dest = op.buf.slice().as_mut_ptr() as u64;
                if pushed > 0 {
                    p.pipeline_in.insert(send_id, rid);
                    let f = Frame::Push {
                        send_id,
                        addr: dest,
                        len: pushed,
                    };
                    self.push_ctrl(i, f);
                }
                let Some(op) = self.req.recvs.get_mut(&rid) else {
                    return;
                };
                let buf = &mut op.buf.slice()[pushed as usize..n as usize];
                let read = sys::cma_read(pid, addr + pushed, buf).map_err(read_failed(src));
                if read.is_ok() {
                    self.stats.cma_bytes += n - pushed;
                }
                op.state = RecvState::after_cma(status, cap, pushed, read, since, addr);
                if pushed > 0 {
                    self.stats.cma_splits += 1;
                } else {
                    self.req.finished.push((false, rid));
                    self.finish_cma(i, send_id, n, since);
                }
            }
            _ => {
                if let Some(u) = p.link.bulk() {
                    // A bulk transfer straight into the posted buffer (speculatively).
                    // The receive op keeps the buffer until the transfer completes
                    // (finish_bulk_peer) or the peer fails (fail_peer_ops clears the
                    // link's transfers first).
                    u.expect_bulk(send_id, len, op.buf.lease());
                }
                op.state = RecvState::transfer(status, since);
                p.pipeline_in.insert(send_id, rid);
                self.push_ctrl(i, Frame::Cts { send_id });
            }
        }
    }

    /// Copies aside, as unexpected, eager message `bytes` with `tag` from peer `i` that no
    /// posted receive wants (a receive posted later takes it from there).
    pub(super) fn set_aside_eager(&mut self, i: usize, tag: u64, bytes: Vec<u8>) {
        self.announce(i, tag);
        self.stats.unexpected += 1;
        self.matcher
            .push_unexpected(PeerId(i as u32), tag, Arrived::Eager(bytes));
    }

    /// Handles one frame; `Ok(false)` when it was left in the ring (see `drain`).
    pub(super) fn handle(&mut self, i: usize, rec: Rx, force: bool) -> Result<bool> {
        let src = PeerId(i as u32);
        // The record lives in the peer's segment, kept mapped while the peer exists (or in
        // the heap buffer at the head of a UDP link's queue); the slice is detached from
        // `self` so the handlers below can take `&mut self`.
        let lease = self.peers[i].link.frame_lease(rec);
        let bytes = lease.bytes();
        let f = Frame::parse(bytes).map_err(|e| Error::Proto {
            peer: src,
            source: e,
        })?;
        match f {
            Frame::Eager { tag, data } => match self.matcher.take_posted(src, tag) {
                Some(rid) => self.complete_eager(src, tag, rid, data),
                None if !force => {
                    self.announce(i, tag);
                    return Ok(false);
                }
                None => self.set_aside_eager(i, tag, data.to_vec()),
            },
            Frame::Rts {
                tag,
                len,
                send_id,
                addr,
            } => match self.matcher.take_posted(src, tag) {
                Some(rid) => self.start_rendezvous(src, tag, rid, len, send_id, addr),
                None if !force => {
                    self.announce(i, tag);
                    return Ok(false);
                }
                None => {
                    self.announce(i, tag);
                    self.matcher
                        .push_unexpected(src, tag, Arrived::Rts { len, send_id, addr })
                }
            },
            Frame::Fin { send_id } => {
                if let Some(op) = self.req.sends.get_mut(&send_id) {
                    if op.peer == src && op.state.on_fin() {
                        self.req.finished.push((true, send_id));
                    }
                }
            }
            Frame::Cts { send_id } => {
                let bad = |what| bad_send_ref(src, send_id, what);
                let op = match self.req.sends.get_mut(&send_id) {
                    Some(op) if op.peer == src => op,
                    _ => return Err(bad("CTS for unknown send")),
                };
                op.state.on_cts().map_err(bad)?;
                let len = op.data.bytes().len() as u64;
                if let Some(u) = self.peers[i].link.bulk() {
                    // The send op holds the bytes until it completes, which happens only
                    // when the link reports the transfer acknowledged, or the peer fails
                    // (the link's transfers are cleared first).
                    if !u.send_bulk(send_id, op.data.lease()) && op.state.fail(Error::PeerDead(src))
                    {
                        self.req.finished.push((true, send_id));
                    }
                    self.kick(i);
                    return Ok(true);
                }
                self.peers[i].pipeline_out.push(send_id, len);
                self.pump_pipeline(i);
            }
            Frame::Chunk {
                send_id,
                offset,
                data,
            } => {
                let p = &mut self.peers[i];
                let bad = |what| bad_send_ref(src, send_id, what);
                let rid = *p
                    .pipeline_in
                    .get(&send_id)
                    .ok_or_else(|| bad("chunk for unknown send"))?;
                let op = self
                    .req
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
                self.stats.pipeline_bytes += len;
                if let Some(since) = chunk.done {
                    let ns = sys::monotonic_ns().saturating_sub(since) as f64;
                    p.chooser
                        .record(&self.ctx.costs, Rndv::Pipeline, offset + len, ns);
                    self.req.finished.push((false, rid));
                    p.pipeline_in.remove(&send_id);
                }
            }
            Frame::Cancel { send_id } => {
                let cancelled = msg::withdraw(&mut self.matcher, src, send_id);
                self.push_ctrl(i, Frame::CancelAck { send_id, cancelled });
            }
            Frame::CancelAck { send_id, cancelled } => {
                if let Some(op) = self.req.sends.get_mut(&send_id) {
                    if op.peer == src && op.state.on_cancel_ack(cancelled) {
                        self.req.finished.push((true, send_id));
                    }
                }
            }
            Frame::Push { send_id, addr, len } => {
                let bad = |what| bad_send_ref(src, send_id, what);
                let op = match self.req.sends.get(&send_id) {
                    Some(op) if op.peer == src => op,
                    _ => return Err(bad("push for unknown send")),
                };
                let d = op.data.bytes();
                let part = &d[op.state.push_part(len, d.len() as u64).map_err(bad)?];
                let pid = self.peers[i].link.shm().map(|s| s.pid);
                let ok = pid.is_some_and(|pid| sys::cma_write(pid, addr, part).is_ok());
                self.push_ctrl(i, Frame::Pushed { send_id, ok });
            }
            Frame::Pushed { send_id, ok } => {
                let p = &mut self.peers[i];
                let bad = |what| bad_send_ref(src, send_id, what);
                let rid = p
                    .pipeline_in
                    .remove(&send_id)
                    .ok_or_else(|| bad("pushed for unknown send"))?;
                let op = self
                    .req
                    .recvs
                    .get_mut(&rid)
                    .ok_or_else(|| bad("pushed for unknown receive"))?;
                let end = op.state.on_pushed(ok).map_err(bad)?;
                let buf = op.buf.slice();
                let cap = buf.len() as u64;
                // The sender could not write its part: read it too (its memory is still
                // there: it waits for the Fin).
                let head = if end.written {
                    Ok(())
                } else {
                    p.push_refused = true;
                    let head = &mut buf[..end.pushed as usize];
                    match p.link.shm() {
                        Some(shm) => sys::cma_read(shm.pid, end.addr, head),
                        None => Err(std::io::Error::other("not a shared-memory peer")),
                    }
                    .map_err(read_failed(src))
                };
                if head.is_ok() {
                    self.stats.cma_bytes += end.pushed;
                }
                let (n, since) = (end.status.len.min(cap), end.since);
                op.state = end.finish(head, cap);
                self.req.finished.push((false, rid));
                self.finish_cma(i, send_id, n, since);
            }
            Frame::Close => {
                // Transfers the peer acknowledged before its goodbye (the ack rides with
                // it: see `close`) complete; only the rest fail.
                self.finish_bulk_peer(i);
                self.peers[i].closing = true;
                self.fail_peer(i, format!("{src} closed the connection"))
            }
            Frame::Rma(r) => self.handle_rma(i, bytes, r)?,
        }
        Ok(true)
    }

    /// The end of a CMA rendezvous receive of `n` bytes from peer `i` started at `since`:
    /// the chooser's sample, and the Fin that releases the sender's buffer.
    pub(super) fn finish_cma(&mut self, i: usize, send_id: u64, n: u64, since: u64) {
        let ns = sys::monotonic_ns().saturating_sub(since) as f64;
        self.peers[i]
            .chooser
            .record(&self.ctx.costs, Rndv::Cma, n, ns);
        self.push_ctrl(i, Frame::Fin { send_id });
    }

    /// Completes the rendezvous sends and receives whose bulk transfers peer `i`'s link
    /// finished (UDP or TCP).
    pub(super) fn finish_bulk_peer(&mut self, i: usize) {
        let Some((done_in, done_out)) = self.peers[i].link.bulk().and_then(|b| b.take_done())
        else {
            return;
        };
        if !done_in.is_empty() {
            if let Link::Udp(u) = &mut self.peers[i].link {
                // The sender's send completes with the ack of the last fragments: it goes
                // with this pass's (or wake-up's) transmit, not after the ack delay (the
                // application may stop driving this endpoint once it has its message).
                u.ack_now();
            }
        }
        for x in done_out {
            if let Some(op) = self.req.sends.get_mut(&x) {
                if op.state.transfer_done() {
                    self.req.finished.push((true, x));
                }
            }
        }
        for x in done_in {
            let Some(rid) = self.peers[i].pipeline_in.remove(&x) else {
                continue;
            };
            let Some(op) = self.req.recvs.get_mut(&rid) else {
                continue;
            };
            // Its bytes are counted by the link (hits, direct reads, cleanup copies).
            let cap = op.buf.slice().len() as u64;
            if op.state.transfer_done(cap) {
                self.req.finished.push((false, rid));
            }
        }
    }
}

/// The error of a failed read of peer `src`'s message out of its memory.
fn read_failed(src: PeerId) -> impl FnOnce(std::io::Error) -> Error {
    move |source| msg::Failure::Read { peer: src, source }.into()
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
