//! The target side: serving a peer's RMA requests (rights and bounds checked against the
//! export), applying them in order, the copy engine's quantum for large ones, and failing
//! a peer's operations when it dies.

use super::*;

impl Endpoint {
    /// Handles an RMA frame from peer `i` (both roles).
    pub(in crate::endpoint) fn handle_rma(
        &mut self,
        i: usize,
        bytes: &[u8],
        f: RmaFrame,
    ) -> Result<()> {
        let src = PeerId(i as u32);
        let is_request = !matches!(
            f,
            RmaFrame::Ack { .. } | RmaFrame::AtomicReply { .. } | RmaFrame::GetData { .. }
        );
        // Keep the peer's order: behind a copy in the engine.
        if is_request && self.peers[i].engine.queued(|| bytes.to_vec()) {
            return Ok(());
        }
        match f {
            RmaFrame::Ack { req: 0, status } => {
                // Refusal of an unacknowledged put.
                self.stats.rma_unacked_refused += 1;
                self.last_error = Some(format!(
                    "unacknowledged put refused by {src}: {}",
                    status.describe()
                ));
                Ok(())
            }
            RmaFrame::Ack { req, status } => {
                let is_map = matches!(
                    self.rma.ops.get(&req).map(|o| &o.kind),
                    Some(OpKind::Map { fd: None })
                );
                let fd = match self.peers[i].link.shm_mut() {
                    Some(s) if is_map && status == Status::Ok => s.take_fd(req),
                    _ => None,
                };
                self.answer(src, req, status, |k| {
                    if let (OpKind::Map { fd: slot }, Some(fd)) = (k, fd) {
                        *slot = Some(fd);
                    }
                })
            }
            RmaFrame::AtomicReply { req, status, old } => self.answer(src, req, status, |k| {
                if let OpKind::Atomic { old: o } = k {
                    *o = old;
                }
            }),
            RmaFrame::GetData { req, offset, data } => {
                let op = self
                    .rma
                    .ops
                    .get_mut(&req)
                    .filter(|o| o.peer == src)
                    .ok_or_else(|| bad(src, "get data for an unknown request", req))?;
                let OpKind::Get { buf } = &mut op.kind else {
                    return Err(bad(src, "get data for a request that is not a get", req));
                };
                let b = buf.slice();
                let end = offset
                    .checked_add(data.len() as u64)
                    .filter(|&e| e <= b.len() as u64)
                    .ok_or_else(|| bad(src, "get data beyond the buffer", offset))?;
                b[offset as usize..end as usize].copy_from_slice(data);
                Ok(())
            }
            req => {
                // The engine is idle for this peer (else the frame was queued above).
                if let Some(c) = self.serve(i, req) {
                    self.peers[i].engine.start(c);
                }
                Ok(())
            }
        }
    }

    /// Completes one part of an initiator's op.
    pub(super) fn answer(
        &mut self,
        src: PeerId,
        req: u64,
        status: Status,
        set: impl FnOnce(&mut OpKind),
    ) -> Result<()> {
        let op = self
            .rma
            .ops
            .get_mut(&req)
            .filter(|o| o.peer == src && o.parts > 0)
            .ok_or_else(|| bad(src, "answer to an unknown request", req))?;
        set(&mut op.kind);
        if status != Status::Ok && op.status == Status::Ok {
            op.status = status;
        }
        op.parts -= 1;
        if !op.done() {
            return Ok(());
        }
        match op.reap {
            Reap::Caller => {}
            Reap::Request => {
                let ok = op.status == Status::Ok;
                self.evq.push(events::RMA, Event::RmaDone { req, ok });
            }
            Reap::Detached => {
                if op.status != Status::Ok {
                    self.last_error = Some(format!(
                        "unacknowledged access refused by {src}: {}",
                        op.status.describe()
                    ));
                }
                self.rma.ops.remove(&req);
            }
        }
        Ok(())
    }

    /// Checks a request against the export table; counts refusals.
    #[inline]
    pub(super) fn admit(&mut self, t: &Target, len: u64, need: u8) -> Result<Applied, Status> {
        // Borrowed, not copied out of the table (the refusal's `&mut self` comes after
        // the last use of the borrow).
        let e = self.rma.exports.get(&t.export);
        match rma::check(e.map(|e| &e.grant), t.key, t.offset, len, need) {
            Ok(at) => {
                // `check` admits only an existing export and keeps the access inside it,
                // inside the aperture.
                match e.and_then(|e| Some((e, e.mem.sub(at as usize, len as usize)?))) {
                    Some((e, mem)) => Ok(Applied {
                        ap: e.grant.aperture,
                        at,
                        mem,
                        rights: e.grant.rights,
                    }),
                    None => Err(self.refuse(Status::OutOfRange)),
                }
            }
            Err(s) => Err(self.refuse(s)),
        }
    }

    /// Counts a refused request (as a target) and returns its status.
    pub(super) fn refuse(&mut self, s: Status) -> Status {
        self.stats.rma_refused += 1;
        s
    }

    /// Applies one request from peer `i` and answers it; a large copy admitted for the copy
    /// engine is returned instead (the caller queues it where the peer's order wants it).
    #[must_use]
    pub(super) fn serve(&mut self, i: usize, f: RmaFrame) -> Option<rma::BulkCopy> {
        let src = Some(PeerId(i as u32));
        match f {
            RmaFrame::Put { req, to, data } => self.serve_put(i, req, to, data),
            RmaFrame::Sync { req } => {
                self.send_rma(
                    i,
                    RmaFrame::Ack {
                        req,
                        status: Status::Ok,
                    },
                );
            }
            RmaFrame::PutCma { req, to, len, addr }
            | RmaFrame::GetCma {
                req,
                from: to,
                len,
                addr,
            } => {
                let put = matches!(f, RmaFrame::PutCma { .. });
                let need = if put { WRITE } else { READ };
                match self.admit(&to, len, need) {
                    Ok(_) if !self.peers[i].link.cma() => {
                        self.send_rma(
                            i,
                            RmaFrame::Ack {
                                req,
                                status: Status::Unsupported,
                            },
                        );
                    }
                    Ok(a) => {
                        return Some(rma::BulkCopy {
                            req,
                            ap: a.ap,
                            at: a.at,
                            len,
                            addr,
                            done: 0,
                            put,
                        })
                    }
                    Err(status) => self.send_rma(i, RmaFrame::Ack { req, status }),
                }
            }
            RmaFrame::Get { req, from, len } => {
                let status = match self.admit(&from, len, READ) {
                    Ok(a) => {
                        let chunk = self.rma_chunk(i);
                        let mut off = 0usize;
                        while off < len as usize {
                            let n = chunk.min(len as usize - off);
                            let data = a.mem.range(off, n).unwrap_or_default();
                            self.send_rma(
                                i,
                                RmaFrame::GetData {
                                    req,
                                    offset: off as u64,
                                    data,
                                },
                            );
                            off += n;
                        }
                        self.stats.rma_get_bytes += len;
                        self.fire(a.ap, a.at, len, READ, src);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                self.send_rma(i, RmaFrame::Ack { req, status });
            }
            RmaFrame::Atomic { req, at, op, a, b } => {
                let (status, old) = match self.admit(&at, 8, READ | WRITE) {
                    Ok(ap) => {
                        if let Some(w) = ap.mem.word(0) {
                            let old = match op {
                                AtomicOp::FetchAdd => w.fetch_add(a, Ordering::AcqRel),
                                AtomicOp::CompareSwap => {
                                    match w.compare_exchange(
                                        a,
                                        b,
                                        Ordering::AcqRel,
                                        Ordering::Acquire,
                                    ) {
                                        Ok(v) | Err(v) => v,
                                    }
                                }
                            };
                            self.fire(ap.ap, ap.at, 8, READ | WRITE, src);
                            (Status::Ok, old)
                        } else {
                            (self.refuse(Status::Misaligned), 0)
                        }
                    }
                    Err(s) => (s, 0),
                };
                self.send_rma(i, RmaFrame::AtomicReply { req, status, old });
            }
            RmaFrame::Notify { req, at, len } => {
                let status = match self.admit(&at, len, WRITE) {
                    Ok(a) => {
                        std::sync::atomic::fence(Ordering::Acquire);
                        self.fire(a.ap, a.at, len, WRITE, src);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                self.send_rma(i, RmaFrame::Ack { req, status });
            }
            RmaFrame::Map { req, of } => {
                let status = self.serve_map(i, req, &of);
                self.send_rma(i, RmaFrame::Ack { req, status });
            }
            RmaFrame::Ack { .. } | RmaFrame::AtomicReply { .. } | RmaFrame::GetData { .. } => {}
        }
        None
    }

    /// Applies a put frame from peer `i` (and answers it when asked to, or to refuse it).
    pub(super) fn serve_put(&mut self, i: usize, req: u64, to: Target, data: &[u8]) {
        self.serve_put_take(i, req, to, data, false);
    }

    /// As [`Endpoint::serve_put`]; with `take`, the put's first tripwire event is returned
    /// rather than queued ([`Endpoint::fire_first`]).
    #[inline(always)]
    pub(super) fn serve_put_take(
        &mut self,
        i: usize,
        req: u64,
        to: Target,
        data: &[u8],
        take: bool,
    ) -> Option<Event> {
        let peer = Some(PeerId(i as u32));
        let (status, taken) = match self.admit(&to, data.len() as u64, WRITE) {
            Ok(mut a) => {
                a.mem.write(0, data);
                self.stats.rma_put_bytes += data.len() as u64;
                let len = data.len() as u64;
                let first = self.fire_first(a.ap, a.at, len, WRITE, peer, take);
                (Status::Ok, (first != NO_TRIP).then_some((first, a.at, len)))
            }
            Err(s) => (s, None),
        };
        if req != 0 || status != Status::Ok {
            self.send_rma(i, RmaFrame::Ack { req, status });
        }
        taken.map(|(id, offset, len)| Event::Tripwire {
            id: TripId {
                index: id as u32,
                gen: (id >> 32) as u32,
            },
            peer,
            offset,
            len,
            write: true,
        })
    }

    /// Sends the memory file of a checked map request before its ack.
    pub(super) fn serve_map(&mut self, i: usize, req: u64, of: &Target) -> Status {
        // Any right allows mapping (the descriptor's mode follows the rights, below).
        let a = match self.admit(of, 0, 0) {
            Ok(a) => a,
            Err(s) => return s,
        };
        let Some(shm) = self.peers[i].link.shm() else {
            return Status::Unsupported;
        };
        let Some(LocalAp {
            mem: ApMem::File { fd, .. },
            ..
        }) = self.rma.aps.get(&a.ap)
        else {
            return Status::Unsupported;
        };
        let sent = if a.rights & WRITE != 0 {
            shm.send_fd(req, fd)
        } else {
            sys::reopen_read_only(fd).and_then(|ro| shm.send_fd(req, &ro))
        };
        match sent {
            Ok(()) => Status::Ok,
            Err(e) => {
                tracing::warn!("sending aperture to {}: {e}", PeerId(i as u32));
                Status::Failed
            }
        }
    }

    /// One turn of the copy engine: up to [`rma::QUANTUM`] bytes for each peer with a
    /// queued copy, round-robin, so one peer's bulk cannot starve another's. True when
    /// anything moved.
    pub(in crate::endpoint) fn run_engine(&mut self) -> bool {
        let mut did = false;
        for i in 0..self.peers.len() {
            if !self.peers[i].engine.is_empty() {
                did = true;
                self.engine_turn(i);
            }
        }
        did
    }

    pub(super) fn engine_turn(&mut self, i: usize) {
        let src = PeerId(i as u32);
        let pid = self.peers[i].link.shm().map_or(0, |s| s.pid);
        let Some(piece) = self.peers[i].engine.piece(rma::QUANTUM) else {
            return;
        };
        let res = match self.rma.aps.get_mut(&piece.ap) {
            None => Err(std::io::Error::other("aperture destroyed")),
            Some(a) => {
                // The copy was checked inside the export, inside the aperture.
                let mut lease = a.lease();
                match lease.range_mut(piece.at as usize, piece.len as usize) {
                    None => Err(std::io::Error::other("outside the aperture")),
                    Some(mem) if piece.put => sys::cma_read(pid, piece.addr, mem),
                    Some(mem) => sys::cma_write(pid, piece.addr, mem),
                }
            }
        };
        let engine = &mut self.peers[i].engine;
        let (c, status) = match res {
            Ok(()) => {
                self.stats.rma_engine_bytes += piece.len;
                match engine.copied(piece.len) {
                    Some(c) => (c, Status::Ok),
                    None => return,
                }
            }
            Err(e) => {
                tracing::warn!("copy engine for {src}: {e}");
                match engine.failed() {
                    Some(c) => (c, Status::Failed),
                    None => return,
                }
            }
        };
        if status == Status::Ok {
            if c.put {
                self.stats.rma_put_bytes += c.len;
            } else {
                self.stats.rma_get_bytes += c.len;
            }
            let access = if c.put { WRITE } else { READ };
            self.fire(c.ap, c.at, c.len, access, Some(src));
        }
        let req = c.req;
        self.send_rma(i, RmaFrame::Ack { req, status });
        // Requests that waited behind the copy, in order, until one needs the engine: its
        // copy takes the head of the queue, ahead of the requests still waiting.
        while let Some(v) = self.peers[i].engine.next_waiting() {
            let Ok(Frame::Rma(f)) = Frame::parse(&v) else {
                continue; // we checked it on arrival
            };
            if let Some(c) = self.serve(i, f) {
                self.peers[i].engine.start(c);
                break;
            }
        }
    }

    /// Fails the one-sided requests towards a dead peer and drops its engine queue.
    pub(in crate::endpoint) fn fail_peer_rma(&mut self, i: usize) {
        let peer = PeerId(i as u32);
        self.peers[i].engine.clear();
        let mut done = Vec::new();
        for (&id, op) in self.rma.ops.iter_mut() {
            if op.peer == peer && !op.done() {
                op.parts = 0;
                op.dead = true;
                if op.reap == Reap::Request {
                    done.push(id);
                }
            }
        }
        for req in done {
            self.evq
                .push(events::RMA, Event::RmaDone { req, ok: false });
        }
        self.rma
            .ops
            .retain(|_, o| !(o.reap == Reap::Detached && o.done()));
    }
}
