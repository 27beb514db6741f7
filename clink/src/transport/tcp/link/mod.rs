//! One peer over TCP: the connection's send queue (frames copied once, rendezvous payloads
//! referenced in place and written with gathering `sendmsg`), its receive buffer, and the
//! speculative receive of rendezvous payloads straight into the posted buffer.

use crate::lease::{Dst, Src};
use crate::transport::FrameQueue;
use clink_proto::stream::{self, Handshake, Header, Incoming, Kind, CHUNK, HEADER, MAX_RECORD};
use clink_proto::wire::Frame;
use clink_proto::ProtoError;
use std::collections::{HashMap, VecDeque};
use std::io::{self, ErrorKind, IoSliceMut, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

/// Frame bytes queued (not yet written) beyond which `try_send` reports the link full.
const TX_BOUND: usize = 4 << 20;
/// Rendezvous bytes queued ahead of the socket: frames sent meanwhile wait behind at most
/// this much of a large transfer.
const TX_WINDOW: usize = 2 << 20;
/// Frames are coalesced into owned segments of up to this size (fewer vectors per write).
const OWN_SEG: usize = 64 << 10;
/// Receive buffer room after a speculative layout (and the least a plain read asks for).
const RX_SPARE: usize = 256 << 10;
/// Receive buffer size: a header, one whole piece, and the spare (see `read_spec`).
const RX_BUF: usize = HEADER + CHUNK + RX_SPARE;
/// Payload bytes a speculative read lands at most: a miss (another record where a piece
/// was predicted) costs at most this much cleanup; on a hit, the rest of the piece is
/// read directly (one more read per piece).
const SPEC_FIRST: usize = 8 << 10;
/// Released frame buffers kept for the next frames (small messages then cost no
/// allocation on either side: a 64-byte hop spent about 420 of its 3 300 user
/// instructions in `malloc` and `free`, `callgrind` of `examples/path_cost 20000 tcp`).
const SPARE_FRAMES: usize = 8;
/// The largest capacity of a kept frame buffer, sent or received: a frame of the largest
/// eager message (64 KiB by default, plus the record and frame headers) fits. Smaller, an
/// eager message of 64 KiB got a fresh buffer on both sides every time, faulted in page by
/// page (16 faults per message, slower than 63 KiB messages); at most 8 such buffers are
/// kept per link for receiving, one for sending.
const SPARE_FRAME_MAX: usize = OWN_SEG + 4096;
/// Reads per `receive` call at most (one progress pass).
const MAX_READS: usize = 16;
/// Writes per `write` call at most.
const MAX_WRITES: usize = 16;

/// Why a link stopped working.
#[derive(Debug)]
pub enum LinkError {
    /// The peer closed its end (end of stream).
    Closed,
    /// A system call failed (reset, broken pipe, ...).
    Io(io::Error),
    /// The peer sent bytes that are not a valid record stream.
    Malformed(ProtoError),
}

impl From<ProtoError> for LinkError {
    fn from(e: ProtoError) -> Self {
        LinkError::Malformed(e)
    }
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Closed => write!(f, "closed its TCP connection"),
            LinkError::Io(e) => write!(f, "TCP connection failed: {e}"),
            LinkError::Malformed(e) => write!(f, "sent a malformed TCP stream: {e}"),
        }
    }
}

/// Counters of one TCP link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpStats {
    /// Gathering writes (`sendmsg`) that wrote something.
    pub writes: u64,
    /// Bytes written to the socket.
    pub bytes_sent: u64,
    /// `read`/`readv` calls that read something.
    pub reads: u64,
    /// Bytes read from the socket.
    pub bytes_received: u64,
    /// Speculative reads whose header was exactly the predicted piece.
    pub spec_hits: u64,
    /// Payload bytes those reads landed in place.
    pub spec_hit_bytes: u64,
    /// Speculative reads that found another record (its bytes moved back in order).
    pub spec_misses: u64,
    /// Payload bytes read straight into the posted buffer after their header was seen
    /// (the rest of a piece: no copy either).
    pub direct_bytes: u64,
    /// Bytes copied by cleanup: misplaced bytes moved back out of a destination, and
    /// payload bytes copied from the receive buffer to their place.
    pub cleanup_bytes: u64,
}

/// A queued piece of the outgoing stream.
enum Seg {
    /// Encoded records (headers and frames).
    Own(Vec<u8>),
    /// Rendezvous payload bytes in the send request's buffer; `done` names the transfer
    /// this piece completes.
    Ext { src: Src, done: Option<u64> },
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Own(v) => v.len(),
            Seg::Ext { src, .. } => src.len(),
        }
    }
}

/// A rendezvous send not yet entirely queued.
struct Source {
    xfer: u64,
    src: Src,
    next: usize,
}

/// What one `readv` returned.
#[derive(Clone, Copy)]
struct ReadLen {
    /// Bytes read (0: the end of the stream).
    n: usize,
    /// Fewer than asked for: the socket held no more at that moment, so a pass's reads
    /// end there ([`TcpLink::receive`]).
    short: bool,
}

/// The data record whose payload is being received.
#[derive(Clone, Copy)]
struct Cur {
    xfer: u64,
    /// Offset in the transfer of the next payload byte.
    at: u64,
    /// Payload bytes of the record still to come.
    left: usize,
    /// The record is the transfer's last.
    last: bool,
}

/// One peer's TCP connection (see the module docs of [`super`]).
///
/// `Send`, not `Sync`: it holds leases of request buffers (see [`TcpLink::send_bulk`],
/// [`TcpLink::expect_bulk`]).
pub struct TcpLink {
    sock: TcpStream,
    /// The peer's endpoint id (from the handshake).
    pub(in crate::transport::tcp) remote_id: u128,
    /// The two ends connected to each other at once (the handshake's welcome said so).
    pub crossed: bool,
    tx: VecDeque<Seg>,
    /// A written owned segment's buffer, kept for the next one.
    spare_tx: Option<Vec<u8>>,
    /// Released frames' buffers, kept for the next frames ([`SPARE_FRAMES`]).
    spare_rx: Vec<Vec<u8>>,
    /// Bytes of the front segment already written.
    tx_off: usize,
    /// Unwritten bytes queued, and how many of them are owned (frames, headers).
    tx_queued: usize,
    tx_owned: usize,
    out: VecDeque<Source>,
    /// Rendezvous sends whose every byte the kernel has taken (the send is complete).
    done_out: Vec<u64>,
    rx: Vec<u8>,
    start: usize,
    end: usize,
    /// Frames received and not yet released (once full, the link stops reading and the
    /// kernel's window pushes back on the sender).
    pub(in crate::transport::tcp) rxq: FrameQueue,
    cur: Option<Cur>,
    incoming: Incoming,
    /// The posted buffers of incoming transfers, each no longer than its transfer.
    dests: HashMap<u64, Dst>,
    /// Incoming transfers whose every byte is at its place (the receive is complete).
    done_in: Vec<u64>,
    hdr: [u8; HEADER],
    speculate: bool,
    /// The handshake record received (a hello on the accepting side, a welcome on the
    /// connecting side); frames are refused before it and handshakes after it.
    pub(in crate::transport::tcp) handshake: Option<(Kind, Handshake)>,
    /// Counters.
    pub stats: TcpStats,
    /// The endpoint watches the socket for writability too (set by the endpoint).
    out_armed: bool,
    /// The liveness timeout: the peer's host is taken for gone when it has acknowledged
    /// nothing for this long while data or probes await an answer ([`TcpLink::host_gone`]).
    dead_after: Duration,
    /// Since when the liveness checks have seen, every time, segments in flight or a probe
    /// unanswered, with no acknowledgement since ([`TcpLink::host_gone`]).
    awaiting_since: Option<std::time::Instant>,
    /// A write (or a read off the progress pass, the latency path's) failed: the link is
    /// dead; the endpoint reads what the socket still holds and fails the peer in a
    /// progress pass (a write can happen inside the handling of a frame, where failing
    /// the peer at once would handle the frames again).
    failed: Option<LinkError>,
}

impl TcpLink {
    /// The congestion control this connection runs (`TCP_CONGESTION`).
    pub fn congestion(&self) -> io::Result<String> {
        Ok(rustix::net::sockopt::tcp_congestion(&self.sock)?)
    }

    /// Wraps a connected socket: non-blocking, `TCP_NODELAY`, the kernel's keepalives
    /// for an idle connection ([`kernel_liveness`]), and `dead_after` the bound of
    /// [`TcpLink::host_gone`]. (Its congestion control was chosen before the connect, or
    /// inherited from the listener: [`super::TcpConfig::congestion`].)
    pub fn new(sock: TcpStream, speculate: bool, dead_after: Duration) -> io::Result<TcpLink> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        kernel_liveness(&sock, dead_after)?;
        Ok(TcpLink {
            sock,
            remote_id: 0,
            crossed: false,
            tx: VecDeque::new(),
            spare_tx: None,
            spare_rx: Vec::new(),
            tx_off: 0,
            tx_queued: 0,
            tx_owned: 0,
            out: VecDeque::new(),
            done_out: Vec::new(),
            rx: vec![0; RX_BUF],
            start: 0,
            end: 0,
            rxq: FrameQueue::default(),
            cur: None,
            incoming: Incoming::default(),
            dests: HashMap::new(),
            done_in: Vec::new(),
            hdr: [0; HEADER],
            speculate,
            handshake: None,
            stats: TcpStats::default(),
            out_armed: false,
            dead_after,
            awaiting_since: None,
            failed: None,
        })
    }

    /// The welcome that answered this connection's hello said the two ends were
    /// connecting to each other at once.
    pub fn welcome_crossed(&self) -> bool {
        self.handshake
            .is_some_and(|(k, hs)| k == Kind::Welcome && hs.crossed)
    }

    /// The peer's endpoint id (from the handshake).
    pub fn remote_id(&self) -> u128 {
        self.remote_id
    }

    /// The frames received and not yet released.
    pub fn frames(&self) -> &FrameQueue {
        &self.rxq
    }

    /// The transfers finished since the last call: (received, sent); `None` when there
    /// are none (the common case, checked on every read and write of a link).
    pub fn take_bulk_done(&mut self) -> Option<(Vec<u64>, Vec<u64>)> {
        if self.done_in.is_empty() && self.done_out.is_empty() {
            return None;
        }
        Some((
            std::mem::take(&mut self.done_in),
            std::mem::take(&mut self.done_out),
        ))
    }

    /// Records that a write (or a read off the progress pass) failed: the link is dead,
    /// and the endpoint reads what the socket still holds, then fails the peer, in a
    /// progress pass (see the field `failed`).
    pub fn note_failure(&mut self, e: LinkError) {
        self.failed = Some(e);
    }

    /// The failure [`TcpLink::note_failure`] recorded, taken.
    pub fn take_failure(&mut self) -> Option<LinkError> {
        self.failed.take()
    }

    /// Whether a failure is recorded.
    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// How long the peer's host has been silent, when that makes it gone (a liveness
    /// check, made every so often while the endpoint is in use): it has acknowledged
    /// nothing for the liveness timeout, and meanwhile either two probes (zero-window or
    /// keepalive) went unanswered, or every check for at least the timeout found segments
    /// in flight or a probe out. A live host acknowledges within a round trip whatever its
    /// process does: a peer whose process does not read (its window shut for minutes)
    /// answers the kernel's zero-window probes and is not taken for gone, where
    /// `TCP_USER_TIMEOUT` aborted such a connection after the timeout (Linux 5.11 and
    /// later count a shut window against it). Data just sent after a long quiet is not
    /// taken for unanswered either: the checks must see it outstanding for the timeout.
    pub fn host_gone(&mut self, now: std::time::Instant) -> Option<Duration> {
        let a = crate::sys::tcp_acks(self.fd()).ok()?;
        if a.unacked == 0 && a.probes == 0 {
            self.awaiting_since = None;
            return None;
        }
        // An acknowledgement since the checks began to wait resets them.
        let since = match self.awaiting_since {
            Some(t) if now.saturating_duration_since(t) <= a.last_ack => t,
            _ => *self.awaiting_since.insert(now),
        };
        let waited = now.saturating_duration_since(since) >= self.dead_after;
        (a.last_ack >= self.dead_after && (a.probes >= 2 || waited)).then_some(a.last_ack)
    }

    /// Whether the endpoint watches the socket for writability too.
    pub fn out_armed(&self) -> bool {
        self.out_armed
    }

    /// Sets what [`TcpLink::out_armed`] says (the endpoint changed its epoll interest).
    pub fn set_out_armed(&mut self, on: bool) {
        self.out_armed = on;
    }

    /// The socket's file descriptor (for epoll).
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Queues raw record bytes (the handshake).
    pub fn queue_record(&mut self, bytes: &[u8]) {
        self.push_own(bytes.len(), |b| b.copy_from_slice(bytes));
    }

    fn push_own(&mut self, n: usize, fill: impl FnOnce(&mut [u8])) {
        let v = match self.tx.back_mut() {
            Some(Seg::Own(v)) if v.len() + n <= OWN_SEG => v,
            _ => {
                let v = match self.spare_tx.take() {
                    Some(v) if v.capacity() >= n => v,
                    // A frame larger than a segment gets its own buffer, of its size
                    // (growing one of OWN_SEG would double it).
                    _ => Vec::with_capacity(n.clamp(4096, OWN_SEG).max(n)),
                };
                self.tx.push_back(Seg::Own(v));
                match self.tx.back_mut() {
                    Some(Seg::Own(v)) => v,
                    _ => unreachable!("just pushed"),
                }
            }
        };
        let at = v.len();
        v.resize(at + n, 0);
        fill(&mut v[at..]);
        self.tx_queued += n;
        self.tx_owned += n;
    }

    /// Queues one frame (copied once, into the send queue); false when the queue is over
    /// its bound (retry after progress).
    pub fn try_send(&mut self, f: &Frame) -> bool {
        let n = f.encoded_len();
        if self.tx_owned > 0 && self.tx_owned + n > TX_BOUND {
            return false;
        }
        self.push_own(HEADER + n, |b| {
            b[..HEADER].copy_from_slice(&Header::frame(n).encode());
            f.encode(&mut b[HEADER..]);
        });
        true
    }

    /// Starts sending the bytes of `src` as transfer `xfer` (the receiver's clear to send
    /// named it): data records of [`CHUNK`] bytes written straight from the buffer. The
    /// transfer is reported in [`TcpLink::done_out`] once the kernel has every byte (the
    /// lease is held until then, or until [`TcpLink::clear_bulk`]).
    pub fn send_bulk(&mut self, xfer: u64, src: Src) {
        self.out.push_back(Source { xfer, src, next: 0 });
    }

    /// Expects transfer `xfer` of `total` bytes into `dst` (bytes beyond it are read and
    /// dropped). Reported in [`TcpLink::done_in`] when complete (the lease is held until
    /// then, or until [`TcpLink::clear_bulk`]).
    pub fn expect_bulk(&mut self, xfer: u64, total: u64, dst: Dst) {
        self.incoming.expect(xfer, total);
        let cap = dst.len().min(usize::try_from(total).unwrap_or(usize::MAX));
        if let Some(dst) = dst.sub(0, cap) {
            self.dests.insert(xfer, dst);
        }
    }

    /// Forgets every transfer: no pointer into a request buffer survives (the peer failed).
    pub fn clear_bulk(&mut self) {
        self.out.clear();
        self.tx.retain(|s| matches!(s, Seg::Own(_)));
        self.tx_off = 0;
        self.tx_queued = self.tx_owned;
        self.incoming.clear();
        self.dests.clear();
        self.cur = None;
    }

    /// True when no rendezvous transfer is under way either way.
    pub fn bulk_idle(&self) -> bool {
        self.out.is_empty() && self.dests.is_empty() && self.cur.is_none()
    }

    /// Bytes queued and not yet written: frames, and what is left of rendezvous sends.
    pub fn queued_bytes(&self) -> usize {
        self.tx_queued + self.out.iter().map(|s| s.src.len() - s.next).sum::<usize>()
    }

    /// True while something waits to be written.
    pub fn wants_write(&self) -> bool {
        !self.tx.is_empty() || !self.out.is_empty()
    }

    /// Releases the frame at the head of [`TcpLink::rxq`], keeping its buffer for a later
    /// frame.
    pub fn release(&mut self) {
        if let Some(v) = self.rxq.release() {
            if v.capacity() <= SPARE_FRAME_MAX && self.spare_rx.len() < SPARE_FRAMES {
                self.spare_rx.push(v);
            }
        }
    }

    /// Frees the buffers of a link whose peer is gone (peers are never removed from the
    /// endpoint, so a dead link should not keep its megabyte of receive buffer). Received
    /// frames are kept: the endpoint may be handling the one at the head (a `Close`).
    pub fn free(&mut self) {
        self.clear_bulk();
        self.tx.clear();
        self.tx_off = 0;
        self.tx_queued = 0;
        self.tx_owned = 0;
        self.rx = Vec::new();
        self.spare_tx = None;
        self.spare_rx = Vec::new();
        self.start = 0;
        self.end = 0;
    }

    /// Closes our sending side after what was written (the peer reads the end of stream).
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(Shutdown::Write);
    }

    /// Cuts queued rendezvous sends into data records while the queue is short.
    fn fill_tx(&mut self) {
        while self.tx_queued < TX_WINDOW {
            let Some(s) = self.out.front_mut() else { break };
            let n = (s.src.len() - s.next).min(CHUNK);
            let (xfer, off) = (s.xfer, s.next);
            let last = off + n == s.src.len();
            let Some(src) = s.src.sub(off, n) else { break };
            s.next += n;
            if last {
                self.out.pop_front();
            }
            self.push_own(HEADER, |b| {
                b.copy_from_slice(&Header::data(xfer, off as u64, n).encode())
            });
            self.tx.push_back(Seg::Ext {
                src,
                done: last.then_some(xfer),
            });
            self.tx_queued += n;
        }
    }

    /// Marks `n` bytes written: frees written segments, reports completed transfers.
    fn advance(&mut self, mut n: usize) {
        self.tx_queued -= n;
        while let Some(s) = self.tx.front() {
            let left = s.len() - self.tx_off;
            if left > n {
                if matches!(s, Seg::Own(_)) {
                    self.tx_owned -= n;
                }
                self.tx_off += n;
                return;
            }
            n -= left;
            self.tx_off = 0;
            match self.tx.pop_front() {
                Some(Seg::Own(mut v)) => {
                    self.tx_owned -= left;
                    if v.capacity() <= SPARE_FRAME_MAX {
                        v.clear();
                        self.spare_tx = Some(v);
                    }
                }
                Some(Seg::Ext { done: Some(x), .. }) => self.done_out.push(x),
                _ => {}
            }
        }
    }

    /// Writes what is queued with gathering `sendmsg` calls (`MSG_NOSIGNAL`; up to
    /// `sys::MAX_PIECES` (64) pieces per call) until the queue is empty or the socket is
    /// full. True when anything was written.
    pub fn write(&mut self) -> Result<bool, LinkError> {
        let mut did = false;
        for _ in 0..MAX_WRITES {
            self.fill_tx();
            if self.tx.is_empty() {
                break;
            }
            let skip = self.tx_off;
            let pieces = self.tx.iter().enumerate().map(|(j, s)| {
                let skip = if j == 0 { skip } else { 0 };
                match s {
                    Seg::Own(v) => &v[skip..],
                    Seg::Ext { src, .. } => &src.bytes()[skip..],
                }
            });
            // Only empty pieces (a zero-length transfer) write nothing.
            let n = match crate::sys::send_pieces(self.sock.as_fd(), pieces) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(LinkError::Io(e)),
            };
            if n > 0 {
                self.stats.writes += 1;
                self.stats.bytes_sent += n as u64;
            }
            self.advance(n);
            did = true;
        }
        Ok(did)
    }

    /// Reads what arrived (at most `MAX_READS` (16) reads) and parses it: frames into the
    /// frame queue, rendezvous payloads to their place, the handshake into
    /// [`TcpLink::handshake`]. True when anything was read. An error means the link is
    /// dead (frames parsed before it are still queued).
    ///
    /// A read that comes back short ends the reads: the socket was empty when it
    /// returned, and a read after it would almost always find nothing, one more system
    /// call before the message is handed over (what came meanwhile is the next pass's,
    /// or wakes the endpoint's epoll).
    pub fn receive(&mut self) -> Result<bool, LinkError> {
        let mut did = false;
        for _ in 0..MAX_READS {
            if self.rxq.full() {
                break;
            }
            let r = match self.read_once()? {
                None => break,
                Some(r) if r.n == 0 => return Err(LinkError::Closed),
                Some(r) => r,
            };
            did = true;
            self.stats.reads += 1;
            self.stats.bytes_received += r.n as u64;
            self.parse()?;
            if r.short {
                break;
            }
        }
        Ok(did)
    }

    /// One read: `None` when nothing is there, `n == 0` at the end of the stream.
    fn read_once(&mut self) -> Result<Option<ReadLen>, LinkError> {
        if self.cur.is_some() {
            return self.read_direct();
        }
        if self.speculate && self.start == self.end {
            if let Some(p) = self.incoming.predict() {
                if let Some(d) = self.dests.get(&p.xfer).cloned() {
                    if p.len > 0 && p.offset as usize + p.len <= d.len() {
                        return self.read_spec(p, d);
                    }
                }
            }
        }
        self.read_plain()
    }

    /// One `readv`: `None` when nothing is there.
    fn sys_read(
        sock: &TcpStream,
        iov: &mut [IoSliceMut<'_>],
    ) -> Result<Option<ReadLen>, LinkError> {
        loop {
            return match (&*sock).read_vectored(iov) {
                Ok(n) => Ok(Some(ReadLen {
                    n,
                    short: n < iov.iter().map(|v| v.len()).sum::<usize>(),
                })),
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => Err(LinkError::Io(e)),
            };
        }
    }

    /// Plain read into the receive buffer (compacted, or grown for a frame larger than
    /// it, as the bytes arrive).
    fn read_plain(&mut self) -> Result<Option<ReadLen>, LinkError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.rx.len() > RX_BUF {
                self.rx.truncate(RX_BUF);
                self.rx.shrink_to_fit();
            }
        } else if self.rx.len() - self.end < RX_SPARE && self.start > 0 {
            self.rx.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.rx.len() {
            // A frame larger than the buffer: grow as its bytes arrive, not on its word.
            let max = HEADER + MAX_RECORD as usize + RX_SPARE;
            let n = (self.rx.len() * 2).max(RX_BUF).min(max);
            self.rx.resize(n, 0);
        }
        let end = self.end;
        let r = Self::sys_read(&self.sock, &mut [IoSliceMut::new(&mut self.rx[end..])])?;
        if let Some(r) = r {
            self.end += r.n;
        }
        Ok(r)
    }

    /// The rest of a data record's payload, straight into its place (when it fits the
    /// posted buffer), then whatever follows into the receive buffer. Entered with the
    /// receive buffer empty (`parse` consumed it).
    fn read_direct(&mut self) -> Result<Option<ReadLen>, LinkError> {
        let Some(c) = self.cur else { return Ok(None) };
        let (direct, mut dst) = match self.dests.get(&c.xfer) {
            Some(d) if (c.at as usize) < d.len() => {
                (c.left.min(d.len() - c.at as usize), Some(d.clone()))
            }
            _ => (0, None),
        };
        self.start = 0;
        self.end = 0;
        // More pieces of the transfer follow, or another transfer is expected after its
        // last (the sender serves them back to back): read only the next header behind
        // this piece, so the next payload is not caught in the receive buffer (and copied).
        let spare = if direct < c.left || (c.last && self.incoming.is_empty()) {
            self.rx.len()
        } else {
            HEADER
        };
        let r = {
            // The posted buffer's range (`at + direct` within it); nothing valid is there
            // yet (bytes arrive in order and `at` is the next one).
            let dest: &mut [u8] = match &mut dst {
                Some(d) => d.range_mut(c.at as usize, direct).unwrap_or_default(),
                None => &mut [],
            };
            let mut iov = [
                IoSliceMut::new(dest),
                IoSliceMut::new(&mut self.rx[..spare]),
            ];
            Self::sys_read(&self.sock, &mut iov)?
        };
        let Some(r) = r else { return Ok(None) };
        let n = r.n;
        let d = n.min(direct);
        self.end = n - d;
        self.stats.direct_bytes += d as u64;
        if let Some(c) = &mut self.cur {
            c.at += d as u64;
            c.left -= d;
            if c.left == 0 {
                self.end_record();
            }
        }
        Ok(Some(r))
    }

    /// The speculative read: `[header slot, destination + predicted offset (at most
    /// [`SPEC_FIRST`] bytes), spare]` (the spare only after the transfer's last bytes). If
    /// the header is the predicted one the payload is in place (a hit); if not, the
    /// bytes are put back in stream order in the receive buffer (cleanup) for `parse`.
    /// Only bytes of the destination not yet received are targeted, so a miss costs a
    /// copy, never data.
    fn read_spec(
        &mut self,
        p: stream::Prediction,
        mut d: Dst,
    ) -> Result<Option<ReadLen>, LinkError> {
        let off = p.offset as usize;
        // The first read takes at most SPEC_FIRST bytes of the piece (a miss costs at most
        // that much copying); on a hit the rest is read directly.
        let first = p.len.min(SPEC_FIRST);
        self.start = 0;
        self.end = 0;
        if self.rx.len() < HEADER + first + RX_SPARE {
            self.rx.resize(HEADER + first + RX_SPARE, 0);
        }
        // `off + len` lies inside the posted buffer (checked by the caller): bytes of the
        // transfer not yet received.
        let dest = d.range_mut(off, first).unwrap_or_default();
        // More of the transfer follows: no spare, so it is read directly or by the next
        // speculative read rather than caught in the receive buffer (and copied).
        let spare_len = if p.last && first == p.len {
            RX_SPARE
        } else {
            0
        };
        let r = {
            let spare = &mut self.rx[HEADER + first..HEADER + first + spare_len];
            let mut iov = [
                IoSliceMut::new(&mut self.hdr),
                IoSliceMut::new(dest),
                IoSliceMut::new(spare),
            ];
            Self::sys_read(&self.sock, &mut iov)?
        };
        let n = match r {
            Some(r) if r.n > 0 => r.n,
            _ => return Ok(r),
        };
        if n < HEADER {
            self.rx[..n].copy_from_slice(&self.hdr[..n]);
            self.end = n;
            return Ok(r);
        }
        let landed = (n - HEADER).min(first);
        let dest = d.range(off, landed).unwrap_or_default();
        if Header::parse(&self.hdr).ok() == Some(p.header()) {
            let last = self.incoming.begin(&p.header())?;
            self.stats.spec_hits += 1;
            self.stats.spec_hit_bytes += landed as u64;
            if n - HEADER > first {
                // What followed the piece is in the spare, in order.
                self.start = HEADER + first;
                self.end = n;
            }
            self.cur = Some(Cur {
                xfer: p.xfer,
                at: (off + landed) as u64,
                left: p.len - landed,
                last,
            });
            if landed == p.len {
                self.end_record();
            }
        } else {
            // Header, then what landed in the destination, then the spare (already right
            // after it when the destination range was filled).
            self.stats.spec_misses += 1;
            self.stats.cleanup_bytes += landed as u64;
            self.rx[..HEADER].copy_from_slice(&self.hdr);
            self.rx[HEADER..HEADER + landed].copy_from_slice(dest);
            self.end = n;
        }
        Ok(r)
    }

    /// The current data record is complete.
    fn end_record(&mut self) {
        if let Some(c) = self.cur.take() {
            if c.last {
                self.dests.remove(&c.xfer);
                self.done_in.push(c.xfer);
            }
        }
    }

    /// Parses the receive buffer: payload bytes of the current data record to their place
    /// (what fits), frames into the queue, the handshake aside. Stops at an incomplete
    /// frame, or at an incomplete data payload (whose rest `read_direct` takes).
    fn parse(&mut self) -> Result<(), LinkError> {
        loop {
            if let Some(c) = &mut self.cur {
                let k = (self.end - self.start).min(c.left);
                if k > 0 {
                    if let Some(d) = self.dests.get_mut(&c.xfer) {
                        let at = c.at as usize;
                        if at < d.len() {
                            let m = k.min(d.len() - at);
                            d.write(at, &self.rx[self.start..self.start + m]);
                            self.stats.cleanup_bytes += m as u64;
                        }
                    }
                    c.at += k as u64;
                    c.left -= k;
                    self.start += k;
                }
                if c.left > 0 {
                    break;
                }
                self.end_record();
                continue;
            }
            let avail = &self.rx[self.start..self.end];
            if avail.len() < HEADER {
                break;
            }
            let h = Header::parse(avail)?;
            // The handshake record comes first and once: frames, data and keepalives
            // are refused before it, another handshake after it.
            let handshake = matches!(h.kind, Kind::Hello | Kind::Welcome);
            match (self.handshake.is_some(), handshake) {
                (false, false) => return Err(ProtoError::BadKind(h.kind.byte()).into()),
                (true, true) => {
                    return Err(ProtoError::UnexpectedMessage {
                        want: "frame or data record",
                        got: h.kind.byte(),
                    }
                    .into())
                }
                _ => {}
            }
            match h.kind {
                Kind::Data => {
                    let last = self.incoming.begin(&h)?;
                    self.start += HEADER;
                    self.cur = Some(Cur {
                        xfer: h.xfer,
                        at: h.offset,
                        left: h.len as usize,
                        last,
                    });
                }
                Kind::Keepalive => self.start += HEADER,
                Kind::Frame | Kind::Hello | Kind::Welcome => {
                    let total = HEADER + h.len as usize;
                    if avail.len() < total {
                        break;
                    }
                    let payload = &avail[HEADER..total];
                    if h.kind == Kind::Frame {
                        let mut v = self.spare_rx.pop().unwrap_or_default();
                        v.clear();
                        v.extend_from_slice(payload);
                        self.rxq.push(v);
                    } else {
                        self.handshake = Some((h.kind, Handshake::parse(payload)?));
                    }
                    self.start += total;
                }
            }
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(())
    }
}

/// The kernel's part of a connection's liveness: keepalive probes after a quarter of
/// `dead_after` of silence, then every quarter (whole seconds, at least one), and the
/// connection aborted (reads and writes then fail with `ETIMEDOUT`) after four unanswered:
/// an idle connection to a host that is gone ends without the application. With data
/// outstanding (keepalives then pause) the endpoint's check of the acknowledgements
/// decides ([`TcpLink::host_gone`]). No `TCP_USER_TIMEOUT`: it would also abort a
/// connection whose peer keeps its window shut (a process computing instead of reading)
/// although its host answers every probe. A peer process that exits is seen at once (its
/// kernel closes the connection).
fn kernel_liveness(sock: &TcpStream, dead_after: Duration) -> io::Result<()> {
    use crate::sys::setsockopt;
    let fd = sock.as_raw_fd();
    let probe = (dead_after.as_secs() / 4).clamp(1, i32::MAX as u64) as libc::c_int;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, &1 as &libc::c_int)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, &probe)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, &probe)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, &4 as &libc::c_int)?;
    Ok(())
}

#[cfg(test)]
impl TcpLink {
    /// Bytes of transfer `xfer` known valid at its place (a prefix: pieces arrive in
    /// order), `None` when the link does not know the transfer (any more).
    fn valid_prefix(&self, xfer: u64) -> Option<u64> {
        match self.cur {
            Some(c) if c.xfer == xfer => Some(c.at),
            _ => self.incoming.predict_for(xfer),
        }
    }
}

#[cfg(test)]
mod tests;
