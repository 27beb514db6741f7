//! One-sided operations an endpoint starts: put, get, atomics, notify, mapped windows,
//! their requests, flushes and fences.

use super::*;

impl Endpoint {
    pub(super) fn target(r: &Remote, offset: u64) -> Target {
        Target {
            export: r.cookie.export,
            key: r.cookie.key,
            offset,
        }
    }

    /// Largest payload of one RMA frame towards peer `i`: an eager message's worth, less
    /// 64 bytes for the larger RMA header (`RMA_HEADER` is 24 bytes more than
    /// `EAGER_HEADER`; the rest is margin), so a put frame fits wherever an eager frame
    /// does.
    pub(super) fn rma_chunk(&self, i: usize) -> usize {
        (self.peers[i].eager_max as usize)
            .saturating_sub(64)
            .max(64)
    }

    pub(super) fn start_op(
        &mut self,
        peer: PeerId,
        kind: OpKind,
        keep: Option<SendBuf>,
        reap: Reap,
        parts: u32,
    ) -> Result<u64> {
        let p = self.peer(peer)?;
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        let id = self.req.alloc_id();
        self.rma.ops.insert(
            id,
            RmaOp {
                peer,
                parts,
                status: Status::Ok,
                kind,
                _keep: keep,
                reap,
                dead: false,
            },
        );
        Ok(id)
    }

    /// Sends one RMA frame to peer `i`, queueing it (encoded) when the link is full. Over
    /// UDP the datagrams go with the next `net_transmit` (every progress pass) or an
    /// explicit [`Endpoint::kick`] by a call that returns without progressing: one
    /// `sendmmsg` per batch, not per frame.
    pub(super) fn send_rma(&mut self, i: usize, f: RmaFrame) {
        let p = &mut self.peers[i];
        if !p.alive {
            return;
        }
        let f = Frame::Rma(f);
        if p.txq.is_empty() && p.link.try_send(&mut self.nets, i, &f) {
            self.stats.frames_sent += 1;
            return;
        }
        let mut v = vec![0u8; f.encoded_len()];
        f.encode(&mut v);
        p.txq.push_encoded(v);
        self.mark_busy(i);
    }

    /// Issues the frames of a put of `data` at `offset` (and counts them as the op's parts).
    pub(super) fn issue_put(&mut self, r: &Remote, offset: u64, data: &[u8], id: u64) {
        let i = r.peer.0 as usize;
        let chunk = self.rma_chunk(i);
        if self.by_engine(i, data.len()) {
            self.op_parts(id, 1);
            self.send_rma(
                i,
                RmaFrame::PutCma {
                    req: id,
                    to: Self::target(r, offset),
                    len: data.len() as u64,
                    addr: data.as_ptr() as u64,
                },
            );
            return;
        }
        let n = data.len().div_ceil(chunk).max(1);
        self.op_parts(id, n as u32);
        for k in 0..n {
            let lo = k * chunk;
            let hi = (lo + chunk).min(data.len());
            self.send_rma(
                i,
                RmaFrame::Put {
                    req: id,
                    to: Self::target(r, offset + lo as u64),
                    data: &data[lo..hi],
                },
            );
        }
    }

    /// Whether `len` bytes to or from peer `i` go by the target's copy engine (one CMA
    /// copy) rather than in frames.
    pub(super) fn by_engine(&self, i: usize, len: usize) -> bool {
        len > self.rma_chunk(i)
            && self.peers[i]
                .link
                .shm()
                .is_some_and(|s| s.peer_cma && self.ctx.config.cma)
    }

    pub(super) fn op_parts(&mut self, id: u64, n: u32) {
        if let Some(op) = self.rma.ops.get_mut(&id) {
            op.parts += n;
        }
    }

    /// Writes `data` at `offset` of a remote window and waits until the owner applied it.
    pub fn put(&mut self, r: &Remote, offset: u64, data: &[u8]) -> Result<()> {
        let id = self.start_op(
            r.peer,
            OpKind::Put,
            None, // the caller's slice outlives the blocking call
            Reap::Caller,
            0, // counted by issue_put
        )?;
        self.issue_put(r, offset, data, id);
        self.finish_op(id).map(|_| ())
    }

    /// Puts a small `data` (at most one frame, see [`Endpoint::rma_inline_max`]) without
    /// waiting and without an acknowledgement: the bytes are copied into the link at once
    /// and applied in order with the other requests to that peer. A refusal is reported by
    /// [`Endpoint::last_error`] and [`crate::Stats::rma_unacked_refused`];
    /// [`Endpoint::flush_rma`] waits until such puts are applied. Larger data is put
    /// blocking.
    pub fn put_nowait(&mut self, r: &Remote, offset: u64, data: &[u8]) -> Result<()> {
        self.put_queued(r, offset, data)?;
        self.kick(r.peer.0 as usize);
        Ok(())
    }

    /// As [`Endpoint::put_nowait`], but a network link only queues the frame: it leaves
    /// with the next frame that is sent at once (a later `put_nowait` or `notify_nowait`
    /// to the peer sends everything queued before it, in order) or at the next progress.
    /// For a batch of puts ended by one that kicks: one system call instead of one per put.
    pub(crate) fn put_queued(&mut self, r: &Remote, offset: u64, data: &[u8]) -> Result<()> {
        let i = r.peer.0 as usize;
        let p = self.peer(r.peer)?;
        if !p.alive {
            return Err(Error::PeerDead(r.peer));
        }
        if data.len() > self.rma_chunk(i) {
            return self.put(r, offset, data);
        }
        // Unacknowledged (request 0): no request state, no ack frame; a refusal still
        // comes back, and `flush_rma` confirms these puts with one sync.
        self.peers[i].unacked = true;
        self.send_rma(
            i,
            RmaFrame::Put {
                req: 0,
                to: Self::target(r, offset),
                data,
            },
        );
        Ok(())
    }

    /// As [`Endpoint::notify`], without waiting for the acknowledgement.
    pub fn notify_nowait(&mut self, r: &Remote, offset: u64, len: u64) -> Result<()> {
        self.issue_notify(r, offset, len, Reap::Detached)?;
        self.kick(r.peer.0 as usize);
        Ok(())
    }

    pub(super) fn issue_notify(
        &mut self,
        r: &Remote,
        offset: u64,
        len: u64,
        reap: Reap,
    ) -> Result<u64> {
        let id = self.start_op(r.peer, OpKind::Notify, None, reap, 1)?;
        // The stores before the doorbell are visible before it.
        std::sync::atomic::fence(Ordering::Release);
        self.send_rma(
            r.peer.0 as usize,
            RmaFrame::Notify {
                req: id,
                at: Self::target(r, offset),
                len,
            },
        );
        Ok(id)
    }

    /// Largest put towards `peer` carried inline in one frame.
    pub fn rma_inline_max(&self, peer: PeerId) -> Result<usize> {
        self.peer(peer)?;
        Ok(self.rma_chunk(peer.0 as usize))
    }

    /// Starts a put of `data` (kept alive by the request); completes with
    /// [`Endpoint::wait_rma`] and an [`Event::RmaDone`].
    pub fn iput(&mut self, r: &Remote, offset: u64, data: impl Into<Bytes>) -> Result<RmaRequest> {
        let data = SendBuf::Owned(data.into());
        // The op holds the bytes until it is over.
        let lease = data.lease();
        let id = self.start_op(
            r.peer,
            OpKind::Put,
            Some(data),
            Reap::Request,
            0, // counted by issue_put
        )?;
        self.issue_put(r, offset, lease.bytes(), id);
        self.kick(r.peer.0 as usize);
        Ok(RmaRequest { id })
    }

    pub(super) fn issue_get(&mut self, r: &Remote, offset: u64, id: u64, addr: u64, len: u64) {
        let i = r.peer.0 as usize;
        let use_cma = self.by_engine(i, len as usize);
        let from = Self::target(r, offset);
        let f = if use_cma {
            RmaFrame::GetCma {
                req: id,
                from,
                len,
                addr,
            }
        } else {
            RmaFrame::Get { req: id, from, len }
        };
        self.send_rma(i, f);
    }

    /// [`Endpoint::get`] into a lent buffer: returns only once the request is over.
    pub(in crate::endpoint) fn get_lent(
        &mut self,
        r: &Remote,
        offset: u64,
        dst: Dst,
    ) -> Result<()> {
        let (addr, len) = (dst.as_mut_ptr() as u64, dst.len() as u64);
        let id = self.start_op(
            r.peer,
            OpKind::Get {
                buf: RecvBuf::Lent(dst),
            },
            None,
            Reap::Caller,
            1,
        )?;
        self.issue_get(r, offset, id, addr, len);
        self.finish_op(id).map(|_| ())
    }

    /// Starts a get of `len` bytes; [`Endpoint::wait_rma`] returns them.
    pub fn iget(&mut self, r: &Remote, offset: u64, len: usize) -> Result<RmaRequest> {
        let mut v = vec![0u8; len];
        let addr = v.as_mut_ptr() as u64;
        let id = self.start_op(
            r.peer,
            OpKind::Get {
                buf: RecvBuf::Owned(v),
            },
            None,
            Reap::Request,
            1,
        )?;
        self.issue_get(r, offset, id, addr, len as u64);
        self.kick(r.peer.0 as usize);
        Ok(RmaRequest { id })
    }

    pub(super) fn atomic(
        &mut self,
        r: &Remote,
        offset: u64,
        op: AtomicOp,
        a: u64,
        b: u64,
    ) -> Result<u64> {
        let id = self.start_op(r.peer, OpKind::Atomic { old: 0 }, None, Reap::Caller, 1)?;
        self.send_rma(
            r.peer.0 as usize,
            RmaFrame::Atomic {
                req: id,
                at: Self::target(r, offset),
                op,
                a,
                b,
            },
        );
        match self.finish_op(id)?.kind {
            OpKind::Atomic { old } => Ok(old),
            _ => Err(Error::Consumed),
        }
    }

    /// Atomically adds `v` to the aligned word at `offset` of a remote window; returns its
    /// previous value.
    pub fn fetch_add(&mut self, r: &Remote, offset: u64, v: u64) -> Result<u64> {
        self.atomic(r, offset, AtomicOp::FetchAdd, v, 0)
    }

    /// Atomically replaces the aligned word at `offset` by `new` if it equals `expect`;
    /// returns its previous value (equal to `expect` when swapped).
    pub fn compare_swap(&mut self, r: &Remote, offset: u64, expect: u64, new: u64) -> Result<u64> {
        self.atomic(r, offset, AtomicOp::CompareSwap, expect, new)
    }

    /// Doorbell for direct stores through a mapped [`Window`]: fires the owner's write
    /// tripwires on `offset..offset+len` as a put there would. Ordered after every
    /// earlier request to that peer and, on this host, after the stores made before it.
    pub fn notify(&mut self, r: &Remote, offset: u64, len: u64) -> Result<()> {
        let id = self.issue_notify(r, offset, len, Reap::Caller)?;
        self.finish_op(id).map(|_| ())
    }

    /// Maps a same-host peer's window into this process. The owner checks the cookie and
    /// sends its memory file (read-only unless the cookie grants writes).
    pub fn map(&mut self, r: &Remote) -> Result<Window> {
        let i = r.peer.0 as usize;
        if self.peer(r.peer)?.link.shm().is_none() {
            return Err(Error::Refused {
                peer: r.peer,
                status: Status::Unsupported,
            });
        }
        let id = self.start_op(r.peer, OpKind::Map { fd: None }, None, Reap::Caller, 1)?;
        self.send_rma(
            i,
            RmaFrame::Map {
                req: id,
                of: Self::target(r, 0),
            },
        );
        let op = self.finish_op(id)?;
        let OpKind::Map { fd: Some(fd) } = op.kind else {
            return Err(Error::Invalid(format!(
                "{} acknowledged a map without sending the memory",
                r.peer
            )));
        };
        let size = sys::fd_size(&fd).map_err(io_err("fstat mapped aperture"))?;
        let c = &r.cookie;
        if c.base.checked_add(c.len).is_none_or(|e| e > size) || size > usize::MAX as u64 {
            return Err(Error::Invalid(format!(
                "{}'s aperture ({size} bytes) does not hold the cookie's window",
                r.peer
            )));
        }
        sys::check_peer_memfd(&fd, size as usize).map_err(io_err("mapped aperture"))?;
        let writable = c.rights & WRITE != 0;
        let map = if writable {
            Mapping::new(&fd, size as usize)
        } else {
            Mapping::new_read_only(&fd, size as usize)
        }
        .map_err(io_err("mmap peer aperture"))?;
        Ok(Window::new(
            Arc::new(map),
            c.base,
            c.len,
            writable,
            Some(r.peer),
        ))
    }

    /// Waits for a blocking op (no timeout: its buffers are borrowed) and removes it.
    pub(super) fn finish_op(&mut self, id: u64) -> Result<RmaOp> {
        let r = self.wait_until(None, |ep| ep.rma.ops.get(&id).is_none_or(|o| o.done()));
        let op = self.rma.ops.remove(&id).ok_or(Error::Consumed)?;
        r?;
        op_result(op)
    }

    /// Tests a non-blocking one-sided request: `Ok(Some(data))` when complete (`data` is
    /// the bytes of a get, empty for a put), `Ok(None)` while pending.
    pub fn test_rma(&mut self, req: &RmaRequest) -> Result<Option<Vec<u8>>> {
        self.progress();
        match self.rma.ops.get(&req.id) {
            None => Err(Error::Consumed),
            Some(op) if !op.done() => Ok(None),
            Some(_) => {
                let op = self.rma.ops.remove(&req.id).ok_or(Error::Consumed)?;
                op_result(op).map(|op| Some(op_bytes(op)))
            }
        }
    }

    /// Waits for a non-blocking one-sided request, at most `timeout` (the request stays
    /// valid on timeout); returns the bytes of a get (empty for a put).
    pub fn wait_rma(&mut self, req: &RmaRequest, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let id = req.id;
        self.wait_until(timeout, |ep| ep.rma.ops.get(&id).is_none_or(|o| o.done()))?;
        let op = self.rma.ops.remove(&id).ok_or(Error::Consumed)?;
        op_result(op).map(op_bytes)
    }

    /// Waits until every one-sided request issued so far to `peer` (or to every peer) is
    /// complete at its target: puts applied, gets delivered.
    pub fn flush_rma(&mut self, peer: Option<PeerId>) -> Result<()> {
        // Unacknowledged puts are confirmed by a sync behind them.
        for i in 0..self.peers.len() {
            if peer.is_some_and(|p| p.0 as usize != i) || !self.peers[i].unacked {
                continue;
            }
            self.peers[i].unacked = false;
            let peer = PeerId(i as u32);
            if let Ok(id) = self.start_op(peer, OpKind::Notify, None, Reap::Detached, 1) {
                self.send_rma(i, RmaFrame::Sync { req: id });
            }
        }
        let pending = |ep: &Endpoint| {
            ep.rma
                .ops
                .values()
                .any(|o| !o.done() && peer.is_none_or(|p| p == o.peer))
        };
        self.wait_until(None, |ep| !pending(ep))
    }

    /// Orders what follows after what preceded towards `peer`. Puts, gets, atomics and
    /// notifies to one peer are applied in the order issued already (PRAM); the fence
    /// matters for direct stores through a mapped [`Window`], which bypass the queue: it
    /// waits until the earlier requests are applied (as [`Endpoint::flush_rma`]).
    pub fn fence(&mut self, peer: PeerId) -> Result<()> {
        self.flush_rma(Some(peer))?;
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }
}

pub(super) fn op_result(op: RmaOp) -> Result<RmaOp> {
    if op.dead {
        return Err(Error::PeerDead(op.peer));
    }
    match op.status {
        Status::Ok => Ok(op),
        status => Err(Error::Refused {
            peer: op.peer,
            status,
        }),
    }
}

pub(super) fn op_bytes(op: RmaOp) -> Vec<u8> {
    match op.kind {
        OpKind::Get {
            buf: RecvBuf::Owned(v),
        } => v,
        _ => Vec::new(),
    }
}
