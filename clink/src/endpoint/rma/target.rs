//! The target side: the answers an initiator receives, and the requests a peer sends,
//! served by [`clink_proto::rma::serve`] on the endpoint's exports, apertures, tripwires and
//! links ([`Serving`], its host); failing a peer's operations when it dies.

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
                serve::request(&mut Serving::new(self, i, false), bytes, req);
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

    /// Checks a request against the export table.
    #[inline]
    fn admit(&self, t: &Target, len: u64, need: u8) -> Result<serve::Admitted<Dst>, Status> {
        let e = self.rma.exports.get(&t.export);
        let at = rma::check(e.map(|e| &e.grant), t.key, t.offset, len, need)?;
        // `check` admits only an existing export and keeps the access inside it, inside
        // the aperture.
        match e.and_then(|e| Some((e, e.mem.sub(at as usize, len as usize)?))) {
            Some((e, mem)) => Ok(serve::Admitted {
                ap: e.grant.aperture,
                at,
                mem,
                rights: e.grant.rights,
            }),
            None => Err(Status::OutOfRange),
        }
    }

    /// Applies a put frame from peer `i` (and answers it when asked to, or to refuse it);
    /// with `take`, the put's first tripwire event is returned rather than queued
    /// ([`Endpoint::fire_first`]).
    #[inline(always)]
    pub(super) fn serve_put_take(
        &mut self,
        i: usize,
        req: u64,
        to: Target,
        data: &[u8],
        take: bool,
    ) -> Option<Event> {
        let mut s = Serving::new(self, i, take);
        serve::put(&mut s, req, to, data);
        let peer = Some(PeerId(i as u32));
        s.taken.map(|(id, offset, len)| Event::Tripwire {
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

    /// One turn of the copy engine: up to [`rma::QUANTUM`] bytes for each peer with a
    /// queued copy, round-robin, so one peer's bulk cannot starve another's. True when
    /// anything moved.
    pub(in crate::endpoint) fn run_engine(&mut self) -> bool {
        let mut did = false;
        for i in 0..self.peers.len() {
            if !self.peers[i].engine.is_empty() {
                did = true;
                serve::turn(&mut Serving::new(self, i, false));
            }
        }
        did
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

/// Peer `i`'s requests served on the endpoint ([`serve::Host`]).
struct Serving<'a> {
    ep: &'a mut Endpoint,
    i: usize,
    /// Whether the first tripwire event a put queues is taken instead
    /// ([`Endpoint::fire_first`]).
    take: bool,
    /// That event, as `fire_first` packs it, with the access's offset and length.
    taken: Option<(u64, u64, u64)>,
}

impl<'a> Serving<'a> {
    #[inline(always)]
    fn new(ep: &'a mut Endpoint, i: usize, take: bool) -> Self {
        Serving {
            ep,
            i,
            take,
            taken: None,
        }
    }
}

impl serve::Region for Dst {
    #[inline(always)]
    fn write(&mut self, data: &[u8]) {
        Dst::write(self, 0, data);
    }

    fn read<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T {
        f(self.range(off, len).unwrap_or_default())
    }

    fn atomic(&mut self, op: AtomicOp, a: u64, b: u64) -> Option<u64> {
        let w = self.word(0)?;
        Some(match op {
            AtomicOp::FetchAdd => w.fetch_add(a, Ordering::AcqRel),
            AtomicOp::CompareSwap => {
                match w.compare_exchange(a, b, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(v) | Err(v) => v,
                }
            }
        })
    }
}

impl serve::Host for Serving<'_> {
    type Region = Dst;

    #[inline(always)]
    fn admit(&mut self, to: &Target, len: u64, need: u8) -> Result<serve::Admitted<Dst>, Status> {
        self.ep.admit(to, len, need)
    }

    fn refused(&mut self, _: Status) {
        self.ep.stats.rma_refused += 1;
    }

    fn engine(&mut self) -> &mut EngineQueue {
        &mut self.ep.peers[self.i].engine
    }

    #[inline]
    fn answer(&mut self, f: RmaFrame<'_>) {
        self.ep.send_rma(self.i, f);
    }

    #[inline(always)]
    fn fire(&mut self, ap: u32, at: u64, len: u64, access: u8) {
        let peer = Some(PeerId(self.i as u32));
        let first = self.ep.fire_first(ap, at, len, access, peer, self.take);
        if first != NO_TRIP {
            self.taken = Some((first, at, len));
        }
    }

    #[inline(always)]
    fn moved(&mut self, put: bool, len: u64) {
        let s = &mut self.ep.stats;
        if put {
            s.rma_put_bytes += len;
        } else {
            s.rma_get_bytes += len;
        }
    }

    fn can_copy(&self) -> bool {
        self.ep.peers[self.i].link.cma()
    }

    fn get_chunk(&self) -> usize {
        self.ep.rma_chunk(self.i)
    }

    /// Sends the aperture's memory file before the ack.
    fn map(&mut self, req: u64, a: &serve::Admitted<Dst>) -> Status {
        let Some(shm) = self.ep.peers[self.i].link.shm() else {
            return Status::Unsupported;
        };
        let Some(LocalAp {
            mem: ApMem::File { fd, .. },
            ..
        }) = self.ep.rma.aps.get(&a.ap)
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
                tracing::warn!("sending aperture to {}: {e}", PeerId(self.i as u32));
                Status::Failed
            }
        }
    }

    fn copy(&mut self, piece: &rma::Piece) -> bool {
        let pid = self.ep.peers[self.i].link.shm().map_or(0, |s| s.pid);
        let res = match self.ep.rma.aps.get_mut(&piece.ap) {
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
        match res {
            Ok(()) => {
                self.ep.stats.rma_engine_bytes += piece.len;
                true
            }
            Err(e) => {
                tracing::warn!("copy engine for {}: {e}", PeerId(self.i as u32));
                false
            }
        }
    }
}
