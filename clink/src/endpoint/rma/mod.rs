//! Apertures, one-sided access, tripwires and the event queue on the endpoint.
//!
//! Initiator side: every access is a frame on the peer's link (put data inline; large puts
//! and gets on the same host by the target's copy engine with one CMA copy), answered by an
//! ack, get data or an atomic reply. Target side: the progress engine checks each request
//! against its export table ([`clink_proto::rma::check`]), applies it, fires the matching
//! tripwires, and answers. Requests from one peer are applied in the order sent (PRAM):
//! while a large copy is in the engine, that peer's later requests wait behind it.

use super::{Endpoint, RecvBuf, SendData, TxItem, FAST_STREAK};
use crate::error::{io_err, Error, Result};
use crate::events::{self, Event, EventSender};
use crate::rma::{ApertureId, Remote, RmaRequest, TripOptions, Tripset, Window};
use crate::sys::{self, Mapping};
use bytes::Bytes;
use clink_proto::idhash::IdMap;
use clink_proto::rma::{self, AtomicOp, Cookie, Grant, RmaFrame, Status, Target, READ, WRITE};
use clink_proto::tripwire::{self, TripId};
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// No tripwire taken ([`Endpoint::fire_first`]).
const NO_TRIP: u64 = u64::MAX;

/// Bytes the copy engine moves for one peer before serving the next (fairness quantum).
const ENGINE_QUANTUM: u64 = 256 << 10;

enum ApMem {
    /// clink's memory file, mappable by same-host peers.
    File { fd: OwnedFd, map: Arc<Mapping> },
    /// A user buffer handed over; given back by `aperture_destroy`.
    User(Vec<u8>),
}

struct LocalAp {
    mem: ApMem,
    len: u64,
}

impl LocalAp {
    fn ptr(&mut self) -> *mut u8 {
        match &mut self.mem {
            ApMem::File { map, .. } => map.ptr(),
            ApMem::User(v) => v.as_mut_ptr(),
        }
    }
}

enum OpKind {
    Put,
    Get { buf: RecvBuf },
    Atomic { old: u64 },
    Notify,
    Map { fd: Option<OwnedFd> },
}

/// An initiator's outstanding one-sided request.
struct RmaOp {
    peer: PeerId,
    /// Answers still expected (a put cut into frames gets one ack per frame).
    parts: u32,
    /// First refusal seen.
    status: Status,
    kind: OpKind,
    /// Keeps a put's bytes alive until the target has them.
    _keep: Option<SendData>,
    reap: Reap,
    /// The peer died before answering.
    dead: bool,
}

/// Who takes an op's result.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reap {
    /// A blocking call waiting for it.
    Caller,
    /// A non-blocking request: `wait_rma`/`test_rma`, with an RmaDone event.
    Request,
    /// Nobody: removed when complete (a refusal is kept in `last_error`).
    Detached,
}

impl RmaOp {
    fn done(&self) -> bool {
        self.parts == 0
    }
}

/// A large copy queued in the target's copy engine.
pub(super) struct EngineCopy {
    req: u64,
    ap: u32,
    /// Offset in the aperture.
    at: u64,
    len: u64,
    /// Initiator's address.
    addr: u64,
    done: u64,
    /// True: put (read the initiator, write the aperture); false: get.
    put: bool,
}

/// The per-peer copy-engine queue: a large copy, or a later request waiting behind it.
pub(super) enum EngineItem {
    Copy(EngineCopy),
    Frame(Vec<u8>),
}

#[derive(Clone, Copy, Default)]
struct TripMeta {
    /// Generation of the tripwire in this slot: an old id of a reused slot reads nothing.
    gen: u32,
    count: u64,
    event: bool,
}

/// The endpoint's aperture, export, tripwire and one-sided request state.
#[derive(Default)]
pub(super) struct RmaState {
    aps: IdMap<u32, LocalAp>,
    next_ap: u32,
    exports: IdMap<u32, Export>,
    next_export: u32,
    trips: tripwire::Matcher,
    meta: Vec<TripMeta>,
    /// Fired bits by tripwire index: read without a system call.
    bits: Vec<u64>,
    ops: IdMap<u64, RmaOp>,
    /// Non-blocking receives into apertures whose tripwires have not fired yet.
    aperture_recvs: Vec<ApertureRecv>,
}

/// A receive posted by [`Endpoint::irecv_into_aperture`].
struct ApertureRecv {
    req: u64,
    ap: u32,
    offset: u64,
    len: u64,
    /// The selector's source (a truncation error names no sender).
    src: Option<PeerId>,
}

impl RmaState {
    /// True while a receive into an aperture may still have tripwires to fire.
    pub(super) fn has_aperture_recvs(&self) -> bool {
        !self.aperture_recvs.is_empty()
    }
}

/// Where a receive of at most `len` bytes into an aperture wrote, by its result: the
/// sender and the bytes that landed (a truncated message fills the range).
fn landed(
    res: &Result<super::Status>,
    src: Option<PeerId>,
    len: u64,
) -> Option<(Option<PeerId>, u64)> {
    match res {
        Ok(st) => Some((Some(st.peer), st.len.min(len))),
        Err(Error::Truncated { .. }) => Some((src, len)),
        Err(_) => None,
    }
    .filter(|&(_, n)| n > 0)
}

/// An export as its owner keeps it.
#[derive(Clone, Copy)]
struct Export {
    grant: Grant,
    /// The aperture's first byte: it stays put while the aperture lives (a memory file's
    /// mapping, or a registered `Vec`'s buffer, never resized), and destroying the
    /// aperture removes its exports. Saves a second table lookup per access.
    mem: *mut u8,
}

// SAFETY: `mem` points into an aperture owned by the same endpoint; the export moves
// between threads only with the endpoint that owns both.
unsafe impl Send for Export {}

/// What a target needs to apply one request.
struct Applied {
    ap: u32,
    at: u64,
    /// The first byte accessed (`at` bytes into the aperture).
    ptr: *mut u8,
    /// The export's rights.
    rights: u8,
}

impl Endpoint {
    // ------------------------------------------------------------ apertures

    /// Allocates a zeroed aperture of `len` bytes in a memory file (mappable by same-host
    /// peers through [`Endpoint::map`]).
    pub fn aperture_alloc(&mut self, len: usize) -> Result<ApertureId> {
        if len == 0 {
            return Err(Error::Invalid("an aperture needs at least one byte".into()));
        }
        let page = 4096;
        let size = len.div_ceil(page) * page;
        let fd = sys::memfd_sealed("clink-aperture", size).map_err(io_err("aperture memfd"))?;
        let map = Arc::new(Mapping::new(&fd, size).map_err(io_err("mmap aperture"))?);
        Ok(self.add_aperture(ApMem::File { fd, map }, len as u64))
    }

    /// Makes `buf` an aperture (peers put and get it; it cannot be mapped by them). It is
    /// given back by [`Endpoint::aperture_destroy`].
    pub fn aperture_register(&mut self, buf: Vec<u8>) -> Result<ApertureId> {
        if buf.is_empty() {
            return Err(Error::Invalid("an aperture needs at least one byte".into()));
        }
        let len = buf.len() as u64;
        Ok(self.add_aperture(ApMem::User(buf), len))
    }

    fn add_aperture(&mut self, mem: ApMem, len: u64) -> ApertureId {
        let id = self.rma.next_ap;
        self.rma.next_ap += 1;
        self.rma.aps.insert(id, LocalAp { mem, len });
        ApertureId(id)
    }

    /// Destroys an aperture: its exports become unknown (later accesses are refused), its
    /// tripwires are removed, and a registered buffer is given back. Peers that mapped it
    /// keep their mapping of memory this endpoint no longer reads.
    pub fn aperture_destroy(&mut self, ap: ApertureId) -> Result<Option<Vec<u8>>> {
        if !self.rma.aps.contains_key(&ap.0) {
            return Err(no_aperture(ap));
        }
        // Settled, the list holds exactly the receives still pending.
        self.settle_aperture_recvs();
        if self.rma.aperture_recvs.iter().any(|r| r.ap == ap.0) {
            return Err(Error::Invalid(format!(
                "aperture {} has a receive pending into it: cancel it first",
                ap.0
            )));
        }
        let a = self.rma.aps.remove(&ap.0).ok_or_else(|| no_aperture(ap))?;
        self.rma.exports.retain(|_, e| e.grant.aperture != ap.0);
        self.rma.trips.remove_aperture(ap.0);
        Ok(match a.mem {
            ApMem::User(v) => Some(v),
            ApMem::File { .. } => None,
        })
    }

    /// Length of an aperture in bytes.
    pub fn aperture_len(&self, ap: ApertureId) -> Result<u64> {
        Ok(self.rma.aps.get(&ap.0).ok_or_else(|| no_aperture(ap))?.len)
    }

    /// A window on this endpoint's own aperture (allocated ones only), for direct loads and
    /// stores by the owner, e.g. polling a flag a peer writes.
    pub fn aperture_window(&self, ap: ApertureId) -> Result<Window> {
        let a = self.rma.aps.get(&ap.0).ok_or_else(|| no_aperture(ap))?;
        match &a.mem {
            ApMem::File { map, .. } => Ok(Window::new(map.clone(), 0, a.len, true, None)),
            ApMem::User(_) => Err(Error::Invalid(
                "a registered buffer has no window: use aperture_read/aperture_write".into(),
            )),
        }
    }

    /// Writes `data` into this endpoint's own aperture at `offset`, firing its write
    /// tripwires (an access made through clink).
    pub fn aperture_write(&mut self, ap: ApertureId, offset: u64, data: &[u8]) -> Result<()> {
        let p = self.local_range(ap, offset, data.len() as u64)?;
        // SAFETY: in bounds of the aperture (checked); the source is a distinct slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        self.fire(ap.0, offset, data.len() as u64, WRITE, None);
        Ok(())
    }

    /// Reads this endpoint's own aperture at `offset` into `buf`, firing its read
    /// tripwires.
    pub fn aperture_read(&mut self, ap: ApertureId, offset: u64, buf: &mut [u8]) -> Result<()> {
        let p = self.local_range(ap, offset, buf.len() as u64)?;
        // SAFETY: in bounds (checked); the destination is a distinct slice.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        self.fire(ap.0, offset, buf.len() as u64, READ, None);
        Ok(())
    }

    /// Receives a tagged message straight into this endpoint's aperture at `offset` (at
    /// most `len` bytes) and fires the write tripwires over the bytes that landed, with
    /// the sender as the accessing peer: a message landing in an aperture is an access
    /// made through clink. Truncation is reported as by [`Endpoint::recv`] (the first
    /// `len` bytes landed, and fire).
    ///
    /// Only blocking receives into apertures fire tripwires; a message received into a
    /// plain buffer that happens to alias an aperture does not.
    pub fn recv_into_aperture(
        &mut self,
        sel: clink_proto::matching::Selector,
        ap: ApertureId,
        offset: u64,
        len: u64,
        timeout: Option<Duration>,
    ) -> Result<super::Status> {
        let p = self.local_range(ap, offset, len)?;
        // SAFETY: in bounds of the aperture (checked). The memory stays mapped during the
        // call: destroying the aperture needs `&mut self`, which the receive holds.
        let buf = unsafe { std::slice::from_raw_parts_mut(p, len as usize) };
        let res = self.recv_timeout(sel, buf, timeout);
        // (A truncation error does not name the sender: the selector's source, if any;
        // with an any-source selector the tripwire event says `peer: None`.)
        if let Some((peer, n)) = landed(&res, sel.src, len) {
            self.fire(ap.0, offset, n, WRITE, peer);
        }
        res
    }

    /// Posts a non-blocking receive of a message matching `sel` into `offset..offset+len`
    /// of aperture `ap`. When it completes, the aperture's write tripwires over the bytes
    /// that landed fire (in the progress pass that completed it, so a thread waiting on
    /// the tripwire or the event queue wakes without anyone testing the request).
    /// Complete the request with [`Endpoint::wait_recv`] or [`Endpoint::test_recv`]:
    /// its [`crate::Received`] has an empty `buf`, the message being in the aperture. The
    /// aperture cannot be destroyed while the receive is pending (cancel it first).
    pub fn irecv_into_aperture(
        &mut self,
        sel: clink_proto::matching::Selector,
        ap: ApertureId,
        offset: u64,
        len: u64,
    ) -> Result<super::RecvRequest> {
        let ptr = self.local_range(ap, offset, len)?;
        let buf = RecvBuf::Aperture {
            ptr,
            len: len as usize,
        };
        let req = self.post_recv(sel, buf);
        self.rma.aperture_recvs.push(ApertureRecv {
            req: req.id(),
            ap: ap.0,
            offset,
            len,
            src: sel.src,
        });
        // A message that had arrived completes it at once: fire now, not at the next
        // pass (`wait_event`'s fast path may run none for a while). Later completions
        // happen in a progress pass, which settles at its end.
        self.settle_aperture_recvs();
        Ok(req)
    }

    /// Fires the tripwires of the receives into apertures that completed (in the order
    /// they were posted); forgets those cancelled or failed.
    pub(super) fn settle_aperture_recvs(&mut self) {
        let mut fires = Vec::new();
        let recvs = &self.recvs;
        self.rma
            .aperture_recvs
            .retain(|r| match recvs.get(&r.req).map(|op| &op.state) {
                Some(super::RecvState::Done(res)) => {
                    if let Some((peer, n)) = landed(res, r.src, r.len) {
                        fires.push((r.ap, r.offset, n, peer));
                    }
                    false
                }
                Some(_) => true,
                None => false,
            });
        for (ap, offset, n, peer) in fires {
            self.fire(ap, offset, n, WRITE, peer);
        }
    }

    fn local_range(&mut self, ap: ApertureId, offset: u64, len: u64) -> Result<*mut u8> {
        let a = self.rma.aps.get_mut(&ap.0).ok_or_else(|| no_aperture(ap))?;
        match offset.checked_add(len) {
            // SAFETY: offset is within the aperture.
            Some(end) if end <= a.len => Ok(unsafe { a.ptr().add(offset as usize) }),
            _ => Err(Error::Invalid(format!(
                "access {offset}+{len} outside aperture of {} bytes",
                a.len
            ))),
        }
    }

    /// Exports the window `offset..offset+len` of an aperture with `rights`
    /// ([`crate::rma::READ`] | [`crate::rma::WRITE`]): the cookie to send to peers.
    pub fn export(&mut self, ap: ApertureId, offset: u64, len: u64, rights: u8) -> Result<Cookie> {
        let a = self.rma.aps.get_mut(&ap.0).ok_or_else(|| no_aperture(ap))?;
        let mem = a.ptr();
        if offset.checked_add(len).is_none_or(|e| e > a.len) {
            return Err(Error::Invalid(format!(
                "export {offset}+{len} outside aperture of {} bytes",
                a.len
            )));
        }
        if rights == 0 || rights & !(READ | WRITE) != 0 {
            return Err(Error::Invalid(format!("bad rights {rights:#x}")));
        }
        let key = sys::random_u128().map_err(io_err("random cookie key"))?;
        let export = self.rma.next_export;
        self.rma.next_export += 1;
        let grant = Grant {
            aperture: ap.0,
            base: offset,
            len,
            rights,
            key,
            revoked: false,
        };
        self.rma.exports.insert(export, Export { grant, mem });
        Ok(Cookie {
            owner: self.id,
            export,
            base: offset,
            len,
            rights,
            key,
        })
    }

    /// Revokes an export: every later access with the cookie is refused
    /// ([`crate::rma::AccessStatus::Revoked`]). Mappings already made stay (see the trust
    /// model in [`crate::rma`]).
    pub fn revoke(&mut self, cookie: &Cookie) -> Result<()> {
        match self.rma.exports.get_mut(&cookie.export) {
            Some(Export { grant: g, .. })
                if cookie.owner == self.id && rma::key_eq(g.key, cookie.key) =>
            {
                g.revoked = true;
                Ok(())
            }
            _ => Err(Error::Invalid(
                "revoke: not a cookie of this endpoint".into(),
            )),
        }
    }

    /// Turns a cookie received from `peer` (its owner) into a handle for one-sided access.
    /// Only checks that it names that peer; the owner checks everything else on access.
    pub fn import(&mut self, peer: PeerId, cookie: Cookie) -> Result<Remote> {
        let p = self.peer(peer)?;
        let owner = match &p.link {
            super::Link::Shm(s) => s.id,
            super::Link::Udp(u) => u.remote_id,
            super::Link::Tcp(t) => t.remote_id,
        };
        if owner != cookie.owner {
            return Err(Error::Invalid(format!(
                "the cookie belongs to endpoint {:032x}, not to {peer}",
                cookie.owner
            )));
        }
        Ok(Remote { peer, cookie })
    }

    // ------------------------------------------------------------ one-sided access

    fn target(r: &Remote, offset: u64) -> Target {
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
    fn rma_chunk(&self, i: usize) -> usize {
        (self.peers[i].eager_max as usize)
            .saturating_sub(64)
            .max(64)
    }

    fn start_op(
        &mut self,
        peer: PeerId,
        kind: OpKind,
        keep: Option<SendData>,
        reap: Reap,
        parts: u32,
    ) -> Result<u64> {
        let p = self.peer(peer)?;
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        let id = self.alloc_id();
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
    fn send_rma(&mut self, i: usize, f: RmaFrame) {
        let p = &mut self.peers[i];
        if !p.alive {
            return;
        }
        let f = Frame::Rma(f);
        if p.txq.is_empty() && p.link.try_send(&f) {
            self.stats.frames_sent += 1;
            return;
        }
        let mut v = vec![0u8; f.encoded_len()];
        f.encode(&mut v);
        p.txq.push_back(TxItem::Raw(v));
        self.mark_busy(i);
    }

    /// Issues the frames of a put of `data` at `offset` (and counts them as the op's parts).
    fn issue_put(&mut self, r: &Remote, offset: u64, data: &[u8], id: u64) {
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
    fn by_engine(&self, i: usize, len: usize) -> bool {
        len > self.rma_chunk(i)
            && self.peers[i]
                .link
                .shm()
                .is_some_and(|s| s.peer_cma && self.ctx.config.cma)
    }

    fn op_parts(&mut self, id: u64, n: u32) {
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

    fn issue_notify(&mut self, r: &Remote, offset: u64, len: u64, reap: Reap) -> Result<u64> {
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
        let data: Bytes = data.into();
        let (ptr, len) = (data.as_ptr(), data.len());
        let id = self.start_op(
            r.peer,
            OpKind::Put,
            Some(SendData::Owned(data)),
            Reap::Request,
            0, // counted by issue_put
        )?;
        // SAFETY: the op keeps the Bytes (heap memory that does not move) alive.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        self.issue_put(r, offset, bytes, id);
        self.kick(r.peer.0 as usize);
        Ok(RmaRequest { id })
    }

    fn issue_get(&mut self, r: &Remote, offset: u64, id: u64, addr: u64, len: u64) {
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

    /// Reads `buf.len()` bytes at `offset` of a remote window.
    pub fn get(&mut self, r: &Remote, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (addr, len) = (buf.as_mut_ptr(), buf.len());
        let id = self.start_op(
            r.peer,
            OpKind::Get {
                buf: RecvBuf::Borrowed(addr, len),
            },
            None,
            Reap::Caller,
            1,
        )?;
        self.issue_get(r, offset, id, addr as u64, len as u64);
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

    fn atomic(&mut self, r: &Remote, offset: u64, op: AtomicOp, a: u64, b: u64) -> Result<u64> {
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
    fn finish_op(&mut self, id: u64) -> Result<RmaOp> {
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

    // ------------------------------------------------------------ tripwires

    /// Arms a tripwire on `offset..offset+len` of an aperture.
    pub fn tripwire(
        &mut self,
        ap: ApertureId,
        offset: u64,
        len: u64,
        opts: TripOptions,
    ) -> Result<TripId> {
        let a = self.rma.aps.get(&ap.0).ok_or_else(|| no_aperture(ap))?;
        if offset.checked_add(len).is_none_or(|e| e > a.len) {
            return Err(Error::Invalid(format!(
                "tripwire {offset}+{len} outside aperture of {} bytes",
                a.len
            )));
        }
        let on = if opts.reads { READ } else { 0 } | if opts.writes { WRITE } else { 0 };
        let id = self
            .rma
            .trips
            .insert(tripwire::Spec {
                aperture: ap.0,
                start: offset,
                len,
                on,
                once: opts.once,
            })
            .map_err(|e| Error::Invalid(format!("tripwire: {e}")))?;
        let n = self.rma.trips.index_bound();
        let st = &mut self.rma;
        if st.meta.len() < n {
            st.meta.resize(n, TripMeta::default());
            st.bits.resize(n.div_ceil(64), 0);
        }
        let k = id.index as usize;
        st.meta[k] = TripMeta {
            gen: id.gen,
            count: 0,
            event: opts.event,
        };
        st.bits[k / 64] &= !(1 << (k % 64));
        Ok(id)
    }

    /// Disarms a tripwire; false when it was not armed (stale id, or a once-only one that
    /// fired).
    pub fn tripwire_remove(&mut self, id: TripId) -> bool {
        self.rma.trips.remove(id).is_some()
    }

    /// Whether the tripwire fired since armed or last cleared (a bit read, no system call;
    /// no progress is made: call [`Endpoint::progress`] to apply what peers sent).
    pub fn tripwire_fired(&self, id: TripId) -> bool {
        self.trip_slot(id)
            .is_some_and(|k| self.rma.bits[k / 64] & (1 << (k % 64)) != 0)
    }

    /// Clears the fired bit of a tripwire.
    pub fn tripwire_clear(&mut self, id: TripId) {
        if let Some(k) = self.trip_slot(id) {
            self.rma.bits[k / 64] &= !(1 << (k % 64));
        }
    }

    /// How many times the tripwire fired since armed.
    pub fn tripwire_count(&self, id: TripId) -> u64 {
        self.trip_slot(id).map_or(0, |k| self.rma.meta[k].count)
    }

    /// The slot of tripwire `id`, unless it was reused by a later tripwire since.
    fn trip_slot(&self, id: TripId) -> Option<usize> {
        let k = id.index as usize;
        self.rma.meta.get(k).filter(|m| m.gen == id.gen).map(|_| k)
    }

    /// Waits (spinning, then blocking) until a tripwire of `set` fires; returns it with its
    /// bit cleared. Bits that were already set count.
    pub fn wait_tripset(&mut self, set: &Tripset, timeout: Option<Duration>) -> Result<TripId> {
        self.wait_trips(&set.ids, timeout)
    }

    /// Waits until one tripwire fires (see [`Endpoint::wait_tripset`]).
    pub fn wait_tripwire(&mut self, id: TripId, timeout: Option<Duration>) -> Result<()> {
        self.wait_trips(&[id], timeout).map(|_| ())
    }

    /// As [`Endpoint::wait_tripset`], over a slice of ids.
    pub(crate) fn wait_trips(
        &mut self,
        ids: &[TripId],
        timeout: Option<Duration>,
    ) -> Result<TripId> {
        if ids.is_empty() {
            return Err(Error::Invalid("wait on an empty tripset".into()));
        }
        let mut hit = None;
        self.wait_until(timeout, |ep| {
            hit = ids.iter().copied().find(|&t| ep.tripwire_fired(t));
            hit.is_some()
        })?;
        let t = hit.ok_or(Error::Timeout)?;
        self.tripwire_clear(t);
        Ok(t)
    }

    /// Fires the tripwires an access of `len` bytes at `at` of aperture `ap` touches.
    pub(super) fn fire(&mut self, ap: u32, at: u64, len: u64, kind: u8, peer: Option<PeerId>) {
        self.fire_first(ap, at, len, kind, peer, false);
    }

    /// As [`Endpoint::fire`]; with `take`, the first tripwire whose event would be queued
    /// is returned instead (the others are queued), packed as `gen << 32 | index`
    /// ([`NO_TRIP`]: none): the caller builds that event from scalars, which spares a
    /// 40-byte event a round trip through the queue's memory (written field by field,
    /// read back in wider moves that stall on store forwarding; so does an
    /// `Option<TripId>` passed through memory, hence one word). Only for a caller whose
    /// own events are all taken (the queue's order is kept).
    fn fire_first(
        &mut self,
        ap: u32,
        at: u64,
        len: u64,
        kind: u8,
        peer: Option<PeerId>,
        take: bool,
    ) -> u64 {
        if self.rma.trips.is_empty() {
            return NO_TRIP;
        }
        let RmaState {
            trips, meta, bits, ..
        } = &mut self.rma;
        let (evq, stats) = (&mut self.evq, &mut self.stats);
        let mut first = NO_TRIP;
        let take = take && evq.wants(events::TRIPWIRES);
        trips.fire(ap, at, len, kind, |id, _| {
            let k = id.index as usize;
            let m = &mut meta[k];
            m.count += 1;
            bits[k / 64] |= 1 << (k % 64);
            stats.tripwires_fired += 1;
            if m.event {
                if take && first == NO_TRIP {
                    first = u64::from(id.gen) << 32 | u64::from(id.index);
                    return;
                }
                evq.push(
                    events::TRIPWIRES,
                    Event::Tripwire {
                        id,
                        peer,
                        offset: at,
                        len,
                        write: kind & WRITE != 0,
                    },
                );
            }
        });
        first
    }

    // ------------------------------------------------------------ event queue

    /// Chooses the event sources queued ([`crate::events::ALL`] or a mask of
    /// [`crate::events::MESSAGES`], `RMA`, `TRIPWIRES`, `PEERS`, `REQUESTS`). Nothing is
    /// queued by default.
    pub fn set_interest(&mut self, mask: u32) {
        self.evq.interest = mask;
    }

    /// The next queued event, without making progress (after [`Endpoint::progress`]).
    pub fn pop_event(&mut self) -> Option<Event> {
        self.evq.pop()
    }

    /// The next event, without a system call when one is queued; otherwise makes progress
    /// once and looks again.
    pub fn next_event(&mut self) -> Option<Event> {
        if let Some(e) = self.evq.pop() {
            return Some(e);
        }
        self.progress();
        self.evq.pop()
    }

    /// Waits (spin, then block on the endpoint's fd) for the next event, at most `timeout`.
    pub fn wait_event(&mut self, timeout: Option<Duration>) -> Result<Event> {
        if let Some(e) = self.evq.pop() {
            return Ok(e);
        }
        if let Some(e) = self.event_fast(timeout) {
            return Ok(e);
        }
        self.wait_until(timeout, |ep| !ep.evq.is_empty())?;
        self.evq.pop().ok_or(Error::Timeout)
    }

    /// The latency fast path of [`Endpoint::wait_event`] (what `recv_fast` is to a
    /// receive): while only shared-memory peers with nothing queued either way are polled,
    /// apply small puts straight off their rings until an event is queued. Gives up
    /// (`None`) at anything else at a ring's head, after the spin time or `timeout`
    /// (whichever is shorter, looked at every 64 polls, at most 4096 polls), or after
    /// [`FAST_STREAK`] events in a row, leaving it to the general path (a full progress
    /// pass per poll: transmits, timers, request completions, the liveness check). It
    /// stands aside while a pass has work of its own: watched requests, detached sends,
    /// pending handshakes, the activity board.
    fn event_fast(&mut self, timeout: Option<Duration>) -> Option<Event> {
        if self.ready.on
            || self.peers.is_empty()
            || self.fast_streak >= FAST_STREAK
            || !self.watched.is_empty()
            || !self.detached.is_empty()
            || !self.incoming.is_empty()
        {
            return None;
        }
        let limit = match (self.ctx.config.spin, timeout) {
            (Some(s), Some(t)) => Some(s.min(t)),
            (s, t) => s.or(t),
        };
        if limit.is_some_and(|l| l.is_zero()) {
            return None;
        }
        let mut start = None;
        for spin in 0..4096u32 {
            // Only a put applied here queues an event (looked at right after it), or a
            // post from another thread: that ring is looked at every 64 polls, and the
            // clock too (first read at the first such look).
            if spin % 64 == 63 {
                if let Some(e) = self.evq.pop() {
                    self.fast_streak += 1;
                    return Some(e);
                }
                let now = Instant::now();
                let since = *start.get_or_insert(now);
                if limit.is_some_and(|l| now - since >= l) {
                    return None;
                }
            }
            for i in 0..self.peers.len() {
                let p = &mut self.peers[i];
                let rec = match p.quiet_head() {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(()) => return None,
                };
                let b = p.link.frame(rec);
                // SAFETY: as in `handle`: the segment stays mapped and the record is not
                // released before `serve` returns.
                let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
                let Some(RmaFrame::Put { req, to, data }) = rma_put(bytes) else {
                    return None;
                };
                let taken = self.serve_put_take(i, req, to, data, true);
                self.stats.frames_received += 1;
                if self.peers[i].release(rec) {
                    self.peers[i].link.wake();
                    self.stats.doorbells += 1;
                }
                if let Some(e) = taken {
                    self.fast_streak += 1;
                    return Some(e);
                }
                // Only the put just applied can have queued an own event; posts from
                // other threads are looked at every 64 polls.
                if let Some(e) = self.evq.pop_own() {
                    self.fast_streak += 1;
                    return Some(e);
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// A handle other threads use to post [`Event::User`] events into this endpoint's
    /// queue (waking it when it sleeps).
    pub fn event_sender(&self) -> EventSender {
        self.evq.sender(self.doorbell.clone())
    }

    // ------------------------------------------------------------ target side

    /// Handles an RMA frame from peer `i` (both roles).
    pub(super) fn handle_rma(&mut self, i: usize, bytes: &[u8], f: RmaFrame) -> Result<()> {
        let src = PeerId(i as u32);
        let is_request = !matches!(
            f,
            RmaFrame::Ack { .. } | RmaFrame::AtomicReply { .. } | RmaFrame::GetData { .. }
        );
        if is_request && !self.peers[i].engine.is_empty() {
            // Keep the peer's order: behind the copy in the engine.
            self.peers[i]
                .engine
                .push_back(EngineItem::Frame(bytes.to_vec()));
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
                    self.peers[i].engine.push_back(EngineItem::Copy(c));
                }
                Ok(())
            }
        }
    }

    /// Completes one part of an initiator's op.
    fn answer(
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
    fn admit(&mut self, t: &Target, len: u64, need: u8) -> Result<Applied, Status> {
        // Borrowed, not copied out of the table (the refusal's `&mut self` comes after
        // the last use of the borrow).
        let e = self.rma.exports.get(&t.export);
        match rma::check(e.map(|e| &e.grant), t.key, t.offset, len, need) {
            Ok(at) => {
                let e = e.expect("check admits only an existing export");
                Ok(Applied {
                    ap: e.grant.aperture,
                    at,
                    // SAFETY: `check` kept the access inside the export, which is inside
                    // the aperture starting at `mem`.
                    ptr: unsafe { e.mem.add(at as usize) },
                    rights: e.grant.rights,
                })
            }
            Err(s) => Err(self.refuse(s)),
        }
    }

    /// Counts a refused request (as a target) and returns its status.
    fn refuse(&mut self, s: Status) -> Status {
        self.stats.rma_refused += 1;
        s
    }

    /// Applies one request from peer `i` and answers it; a large copy admitted for the copy
    /// engine is returned instead (the caller queues it where the peer's order wants it).
    #[must_use]
    fn serve(&mut self, i: usize, f: RmaFrame) -> Option<EngineCopy> {
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
                        return Some(EngineCopy {
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
                        let p = a.ptr as *const u8;
                        let chunk = self.rma_chunk(i);
                        let mut off = 0usize;
                        while off < len as usize {
                            let n = chunk.min(len as usize - off);
                            // SAFETY: inside the aperture (checked).
                            let data = unsafe { std::slice::from_raw_parts(p.add(off), n) };
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
                        let p = ap.ptr;
                        if !(p as usize).is_multiple_of(8) {
                            (self.refuse(Status::Misaligned), 0)
                        } else {
                            // SAFETY: aligned, inside the aperture; aperture memory is
                            // only accessed atomically or by raw copies.
                            let w = unsafe { AtomicU64::from_ptr(p.cast()) };
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
    fn serve_put(&mut self, i: usize, req: u64, to: Target, data: &[u8]) {
        self.serve_put_take(i, req, to, data, false);
    }

    /// As [`Endpoint::serve_put`]; with `take`, the put's first tripwire event is returned
    /// rather than queued ([`Endpoint::fire_first`]).
    #[inline]
    fn serve_put_take(
        &mut self,
        i: usize,
        req: u64,
        to: Target,
        data: &[u8],
        take: bool,
    ) -> Option<Event> {
        let peer = Some(PeerId(i as u32));
        let (status, taken) = match self.admit(&to, data.len() as u64, WRITE) {
            Ok(a) => {
                let p = a.ptr;
                // SAFETY: inside the aperture (checked); the frame is distinct memory.
                unsafe { copy_short(data.as_ptr(), p, data.len()) };
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
    fn serve_map(&mut self, i: usize, req: u64, of: &Target) -> Status {
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

    /// One turn of the copy engine: up to [`ENGINE_QUANTUM`] bytes for each peer with a
    /// queued copy, round-robin, so one peer's bulk cannot starve another's. True when
    /// anything moved.
    pub(super) fn run_engine(&mut self) -> bool {
        let mut did = false;
        for i in 0..self.peers.len() {
            if !self.peers[i].engine.is_empty() {
                did = true;
                self.engine_turn(i);
            }
        }
        did
    }

    fn engine_turn(&mut self, i: usize) {
        let src = PeerId(i as u32);
        let pid = self.peers[i].link.shm().map_or(0, |s| s.pid);
        let Some(EngineItem::Copy(c)) = self.peers[i].engine.front_mut() else {
            return;
        };
        let n = (c.len - c.done).min(ENGINE_QUANTUM);
        let (ap, at, put) = (c.ap, c.at + c.done, c.put);
        let addr = c.addr + c.done;
        let res = match self.rma.aps.get_mut(&ap) {
            None => Err(std::io::Error::other("aperture destroyed")),
            Some(a) => {
                // SAFETY: the copy was checked inside the export, inside the aperture.
                let mem =
                    unsafe { std::slice::from_raw_parts_mut(a.ptr().add(at as usize), n as usize) };
                if put {
                    sys::cma_read(pid, addr, mem)
                } else {
                    sys::cma_write(pid, addr, mem)
                }
            }
        };
        let Some(EngineItem::Copy(c)) = self.peers[i].engine.front_mut() else {
            return;
        };
        let status = match res {
            Ok(()) => {
                c.done += n;
                self.stats.rma_engine_bytes += n;
                if c.done < c.len {
                    return;
                }
                Status::Ok
            }
            Err(e) => {
                tracing::warn!("copy engine for {src}: {e}");
                Status::Failed
            }
        };
        let (req, ap, at, len, put) = (c.req, c.ap, c.at, c.len, c.put);
        self.peers[i].engine.pop_front();
        if status == Status::Ok {
            if put {
                self.stats.rma_put_bytes += len;
            } else {
                self.stats.rma_get_bytes += len;
            }
            self.fire(ap, at, len, if put { WRITE } else { READ }, Some(src));
        }
        self.send_rma(i, RmaFrame::Ack { req, status });
        // Requests that waited behind the copy, in order, until one needs the engine: its
        // copy takes the head of the queue, ahead of the requests still waiting.
        while matches!(self.peers[i].engine.front(), Some(EngineItem::Frame(_))) {
            let Some(EngineItem::Frame(v)) = self.peers[i].engine.pop_front() else {
                break;
            };
            let Ok(Frame::Rma(f)) = Frame::parse(&v) else {
                continue; // we checked it on arrival
            };
            if let Some(c) = self.serve(i, f) {
                self.peers[i].engine.push_front(EngineItem::Copy(c));
                break;
            }
        }
    }

    /// Fails the one-sided requests towards a dead peer and drops its engine queue.
    pub(super) fn fail_peer_rma(&mut self, i: usize) {
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

fn op_result(op: RmaOp) -> Result<RmaOp> {
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

fn op_bytes(op: RmaOp) -> Vec<u8> {
    match op.kind {
        OpKind::Get {
            buf: RecvBuf::Owned(v),
        } => v,
        _ => Vec::new(),
    }
}

fn no_aperture(ap: ApertureId) -> Error {
    Error::Invalid(format!("no aperture {} on this endpoint", ap.0))
}

fn bad(peer: PeerId, what: &'static str, value: u64) -> Error {
    Error::Proto {
        peer,
        source: clink_proto::ProtoError::OutOfRange {
            what,
            value,
            limit: 0,
        },
    }
}

/// `bytes` as a put frame, or `None` for any other frame (left to the general path,
/// which also reports malformed ones).
fn rma_put(bytes: &[u8]) -> Option<RmaFrame<'_>> {
    if !rma::is_put_kind(*bytes.first()?) {
        return None;
    }
    RmaFrame::parse(bytes).ok()
}

/// Copies `len` bytes between distinct buffers; 8 to 16 of them as two (overlapping)
/// unaligned words rather than a call into the C library: one-word puts are the latency
/// path.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`].
unsafe fn copy_short(src: *const u8, dst: *mut u8, len: usize) {
    if (8..=16).contains(&len) {
        // SAFETY: both words lie within the `len` bytes the caller vouches for.
        unsafe {
            let (a, b) = (
                src.cast::<u64>().read_unaligned(),
                src.add(len - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

#[cfg(test)]
mod tests {
    use super::copy_short;

    /// Every length up to 40 (both branches and their edges) copies exactly its bytes and
    /// nothing around them.
    #[test]
    fn copy_short_copies_exactly_len_bytes() {
        let src: Vec<u8> = (1..=64).collect();
        for len in 0..=40usize {
            let mut dst = vec![0u8; 64];
            // SAFETY: both buffers hold at least 3 + len bytes and do not overlap.
            unsafe { copy_short(src.as_ptr().add(3), dst.as_mut_ptr().add(5), len) };
            let mut want = vec![0u8; 64];
            want[5..5 + len].copy_from_slice(&src[3..3 + len]);
            assert_eq!(dst, want, "len {len}");
        }
    }
}
