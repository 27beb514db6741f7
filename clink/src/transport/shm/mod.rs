//! Shared-memory transport: one memfd segment per peer pair, passed over an abstract Unix
//! socket with SCM_RIGHTS.
//!
//! - Nothing is named on disk and nothing outlives the processes: the segment is a memfd
//!   (freed when the last mapping and fd go), the listening socket is in the abstract
//!   namespace (gone when the process exits), kill -9 included.
//! - Only peers of the same uid may connect (SO_PEERCRED), unless configured otherwise.
//! - The segment is sealed against shrinking, so a peer cannot make our mapping fault.
//! - The Unix socket stays open for the life of the connection: its hang-up is the death
//!   notice of the peer.
//!
//! Segment layout (direction 0 = connector to acceptor, 1 = the other way):
//! `[header page][ring 0][ring 1]`, each ring being a 256-byte control block followed by
//! its cells. The header holds each side's slot on the other's activity board ([`board`],
//! sent with the handshake; 0 = no slot, else slot + 1); the ring size comes with the
//! hello. The rings are also the staging area of the pipelined rendezvous (chunks
//! travel as ring records), so nothing else is shared.

pub mod board;
pub mod ring;

use crate::error::{io_err, Error, Result};
use crate::lease::Src;
use crate::sys::{self, Mapping, SeqPacket, Tether};
use board::{Board, Post};
use clink_proto::wire::{Frame, Hello, Ready, Welcome, HELLO_LEN, READY_LEN, WELCOME_LEN};
pub use ring::Wake;
use ring::{Consumer, Flag, Producer, Reservation, RingMem, CELL, REC_HDR};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PAGE: usize = 4096;
const CTRL: usize = 256;
/// Header words: the acceptor's slot on the connector's board, and the reverse.
const HDR_SLOT_OF_ACCEPTOR: usize = 2;
const HDR_SLOT_OF_CONNECTOR: usize = 3;

/// Largest ring the acceptor agrees to map.
pub const MAX_RING_CELLS: u32 = 1 << 20;
/// Same-host peers an endpoint connects to with full-size rings before it shrinks them.
const FULL_RING_PEERS: usize = 4;
/// The smallest ring a shrunk connection gets (8 KiB: eager up to 2 KiB, larger messages
/// by CMA or the pipeline).
const MIN_SHRUNK_CELLS: u32 = 128;

/// Cells per ring of a new connection made by an endpoint that has `peers` same-host
/// peers already: `configured` for the first `FULL_RING_PEERS`, then halved for each
/// doubling beyond (4-7 peers: a half, 8-15: a quarter, ...), down to
/// `MIN_SHRUNK_CELLS`. Each pair's rings are its own memory and a full mesh of N
/// processes holds N(N-1)/2 pairs: 64 processes at 128 KiB a ring took 527 MiB. The
/// connector chooses (its hello carries the size) and both sides' limits follow it.
pub fn ring_cells_for(configured: u32, peers: usize, shrink: bool) -> u32 {
    if !shrink || peers < FULL_RING_PEERS {
        return configured;
    }
    let halvings = usize::BITS - (peers / FULL_RING_PEERS).leading_zeros();
    (configured >> halvings.min(31)).max(MIN_SHRUNK_CELLS.min(configured))
}

/// Byte offsets of the parts of a segment.
#[derive(Clone, Copy, Debug)]
struct Layout {
    ring: [usize; 2],
    total: usize,
}

fn round_page(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    fn new(cells: u32) -> Layout {
        let ring_bytes = round_page(CTRL + cells as usize * CELL);
        let r0 = PAGE;
        let r1 = r0 + ring_bytes;
        Layout {
            ring: [r0, r1],
            total: r1 + ring_bytes,
        }
    }
}

/// One ring direction inside a mapped segment.
#[derive(Clone)]
pub struct ShmMem {
    ctrl: *mut u8,
    cells: *mut u8,
    cap: u64,
    _seg: Arc<Mapping>,
}

// SAFETY: the raw pointers point into `_seg`, kept alive by the Arc; the ring protocol
// decides who touches what.
unsafe impl Send for ShmMem {}

impl ShmMem {
    fn new(seg: &Arc<Mapping>, off: usize, cells: u32) -> ShmMem {
        // SAFETY: Layout places the ring inside the mapping (checked by its size).
        let ctrl = unsafe { seg.ptr().add(off) };
        ShmMem {
            ctrl,
            // SAFETY: as above.
            cells: unsafe { ctrl.add(CTRL) },
            cap: u64::from(cells),
            _seg: seg.clone(),
        }
    }
    fn atomic64(&self, p: *mut u8) -> &AtomicU64 {
        // SAFETY: p is 8-aligned inside the live mapping; AtomicU64 has u64's layout.
        unsafe { &*(p as *const AtomicU64) }
    }
    /// The consumer's sleep flag: the futex a [`Wake::Futex`] sleep waits on.
    pub fn sleep_flag(&self) -> &AtomicU32 {
        self.flag(Flag::ConsumerSleeping)
    }
    fn flag(&self, f: Flag) -> &AtomicU32 {
        let off = match f {
            Flag::ConsumerSleeping => 64,
            Flag::ProducerWaiting => 128,
        };
        // SAFETY: offsets inside the 256-byte control block, 4-aligned.
        unsafe { &*(self.ctrl.add(off) as *const AtomicU32) }
    }
    fn cell(&self, idx: u64) -> *mut u8 {
        debug_assert!(idx < self.cap);
        // SAFETY: idx < cap keeps the pointer inside the ring's cells.
        unsafe { self.cells.add(idx as usize * CELL) }
    }
    /// Pointer to the payload of the record at `idx`.
    pub fn payload(&self, idx: u64) -> *mut u8 {
        // SAFETY: the header is inside the cell.
        unsafe { self.cell(idx).add(REC_HDR) }
    }
}

// SAFETY: cells are distinct 64-byte slots of a mapping kept alive by `_seg`.
unsafe impl RingMem for ShmMem {
    fn cap(&self) -> u64 {
        self.cap
    }
    fn load_seq(&self, idx: u64, o: Ordering) -> u64 {
        self.atomic64(self.cell(idx)).load(o)
    }
    fn store_seq(&self, idx: u64, v: u64, o: Ordering) {
        self.atomic64(self.cell(idx)).store(v, o)
    }
    fn load_head(&self, o: Ordering) -> u64 {
        self.atomic64(self.ctrl).load(o)
    }
    fn store_head(&self, v: u64, o: Ordering) {
        self.atomic64(self.ctrl).store(v, o)
    }
    fn load_wake_at(&self, o: Ordering) -> u64 {
        // SAFETY: offset 192 of the 256-byte control block, 8-aligned.
        self.atomic64(unsafe { self.ctrl.add(192) }).load(o)
    }
    fn store_wake_at(&self, v: u64, o: Ordering) {
        // SAFETY: as above.
        self.atomic64(unsafe { self.ctrl.add(192) }).store(v, o)
    }
    fn load_flag(&self, f: Flag, o: Ordering) -> u32 {
        self.flag(f).load(o)
    }
    fn store_flag(&self, f: Flag, v: u32, o: Ordering) {
        self.flag(f).store(v, o)
    }
    fn swap_flag(&self, f: Flag, v: u32, o: Ordering) -> u32 {
        self.flag(f).swap(v, o)
    }
    fn fence(&self) {
        fence(Ordering::SeqCst)
    }
    unsafe fn write_hdr(&self, idx: u64, len: u32, flags: u32) {
        let p = self.cell(idx);
        std::ptr::write_volatile(p.add(8) as *mut u32, len);
        std::ptr::write_volatile(p.add(12) as *mut u32, flags);
    }
    unsafe fn read_hdr(&self, idx: u64) -> (u32, u32) {
        let p = self.cell(idx);
        (
            std::ptr::read_volatile(p.add(8) as *const u32),
            std::ptr::read_volatile(p.add(12) as *const u32),
        )
    }
    unsafe fn write(&self, idx: u64, off: usize, src: &[u8]) {
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.payload(idx).add(off), src.len());
    }
    unsafe fn read(&self, idx: u64, off: usize, dst: &mut [u8]) {
        std::ptr::copy_nonoverlapping(self.payload(idx).add(off), dst.as_mut_ptr(), dst.len());
    }
    fn prefetch_for_write(&self, idx: u64) {
        sys::prefetch_for_write(self.cell(idx));
        if idx + 1 < self.cap {
            sys::prefetch_for_write(self.cell(idx + 1));
        }
    }
}

/// What this endpoint tells peers at connect time.
pub struct Local<'a> {
    /// Endpoint identity.
    pub id: u128,
    /// Our doorbell (sent to the peer).
    pub doorbell: RawFd,
    /// Address and value of our CMA probe word.
    pub probe: (u64, u64),
    /// Our activity board (its file is sent to the peer, which gets a slot on it).
    pub board: &'a Board,
    /// The endpoint this one is connecting to, if any (an incoming connection from it
    /// crossed ours).
    pub connecting: Option<u128>,
    /// Settings.
    pub config: ShmConfig,
}

/// Settings of the shared-memory handshake (from `CLINK_*`, see [`crate::config`]).
#[derive(Clone, Copy, Debug)]
pub struct ShmConfig {
    /// Peers of another uid are accepted.
    pub any_uid: bool,
    /// Rendezvous by CMA where the kernel allows it (`CLINK_CMA`).
    pub cma: bool,
    /// How long a connect waits for the answer (`CLINK_CONNECT_TIMEOUT_MS`).
    pub connect_timeout: Duration,
}

/// A connected shared-memory peer.
pub struct ShmPeer {
    /// Ring we produce into.
    pub tx: Producer<ShmMem>,
    /// Ring we consume from.
    pub rx: Consumer<ShmMem>,
    /// The connection socket (liveness; late handshake messages).
    pub sock: SeqPacket,
    /// The peer's doorbell.
    pub doorbell: OwnedFd,
    /// The pair's tether (`None` once the peer hung up on it): a receiver sleeps on this
    /// peer's futex only while it holds it (see [`Tether`]).
    pub tether: Option<Tether>,
    /// Peer pid in our PID namespace (for CMA only).
    pub pid: i32,
    /// We can read the peer's memory with CMA.
    pub cma: bool,
    /// The peer can read our memory with CMA (it told us).
    pub peer_cma: bool,
    /// Peer identity.
    pub id: u128,
    /// The two ends connected to each other at once ([`clink_proto::wire::Welcome::crossed`]).
    pub crossed: bool,
    /// Aperture memory files the peer sent for our map requests, by request id, until the
    /// request's acknowledgement takes them.
    pub fds: Vec<(u64, OwnedFd)>,
    /// The peer's activity board, on which we raise our bit after publishing (`None`:
    /// the peer polls our ring directly).
    pub post: Option<Post>,
    /// The slot this peer has on our board (`None`: we poll its ring directly).
    pub slot: Option<u32>,
}

/// Opens a socket packet carrying an aperture's memory file ("CLNKAPFD" + request id).
const AP_FD_MAGIC: &[u8; 8] = b"CLNKAPFD";
/// Map answers kept waiting for their acknowledgement at most (a peer cannot make us
/// hoard descriptors).
const MAX_STASHED_FDS: usize = 16;

fn check_uid(sock: &SeqPacket, cfg: &ShmConfig) -> Result<sys::PeerCred> {
    let cred = sock.peer_cred().map_err(io_err("SO_PEERCRED"))?;
    if !cfg.any_uid && cred.uid != sys::getuid() {
        return Err(Error::Connect {
            addr: String::new(),
            why: format!(
                "peer runs as uid {}, we as uid {} (set CLINK_SHM_ANY_UID=1 to allow)",
                cred.uid,
                sys::getuid()
            ),
        });
    }
    Ok(cred)
}

fn probe_cma(cfg: &ShmConfig, pid: i32, addr: u64, value: u64) -> bool {
    if !cfg.cma || pid <= 0 {
        return false;
    }
    let mut b = [0u8; 8];
    sys::cma_read(pid, addr, &mut b).is_ok() && u64::from_le_bytes(b) == value
}

/// Word `i` of a segment's header page (shared: read and written atomically).
fn header(seg: &Mapping, i: usize) -> &AtomicU64 {
    assert!((i + 1) * 8 <= PAGE);
    // SAFETY: inside the header page of the live mapping, 8-aligned.
    unsafe { &*(seg.ptr().add(i * 8) as *const AtomicU64) }
}

/// Encodes an optional board slot for the header.
fn slot_word(slot: Option<u32>) -> u64 {
    slot.map_or(0, |s| u64::from(s) + 1)
}

/// Maps the peer's board with the slot it wrote in header word `i` (if any).
fn open_post(seg: &Mapping, i: usize, board: &OwnedFd) -> Option<Post> {
    let w = header(seg, i).load(Ordering::Acquire);
    w.checked_sub(1).and_then(|slot| Post::open(board, slot))
}

impl ShmPeer {
    /// The two rings of a segment, seen from the side that produces into `dir_out`.
    fn rings(
        seg: &Arc<Mapping>,
        cells: u32,
        dir_out: usize,
    ) -> (Producer<ShmMem>, Consumer<ShmMem>) {
        let lay = Layout::new(cells);
        (
            Producer::new(ShmMem::new(seg, lay.ring[dir_out], cells)),
            Consumer::new(ShmMem::new(seg, lay.ring[1 - dir_out], cells)),
        )
    }

    /// Connects to the endpoint listening on abstract socket `name`, with rings of
    /// `ring_cells` cells each way (see [`ring_cells_for`]). `while_waiting` is called
    /// while the answer is pending, so two endpoints connecting to each other at once can
    /// each accept the other.
    pub fn connect(
        name: &str,
        me: &Local,
        ring_cells: u32,
        while_waiting: impl FnMut(),
    ) -> Result<ShmPeer> {
        let slot = me.board.alloc();
        let r = Self::connect_with(name, me, ring_cells, slot, while_waiting);
        if let (Err(_), Some(s)) = (&r, slot) {
            me.board.release(s);
        }
        r
    }

    fn connect_with(
        name: &str,
        me: &Local,
        ring_cells: u32,
        slot: Option<u32>,
        mut while_waiting: impl FnMut(),
    ) -> Result<ShmPeer> {
        let cfg = &me.config;
        let fail = |why: String| Error::connect(name, why);
        let sock = SeqPacket::connect(name).map_err(|e| match e.raw_os_error() {
            Some(libc::ECONNREFUSED) | Some(libc::ENOENT) => {
                fail("no endpoint listens there (exited, or another network namespace)".into())
            }
            _ => fail(e.to_string()),
        })?;
        let cred = check_uid(&sock, cfg).map_err(|e| fail(e.to_string()))?;
        let hello = Hello {
            id: me.id,
            ring_cells,
            probe_addr: me.probe.0,
            probe_value: me.probe.1,
        };
        let lay = Layout::new(hello.ring_cells);
        let (tether, tether_theirs) = Tether::pair().map_err(io_err("tether socketpair"))?;
        let memfd =
            sys::memfd_sealed("clink-segment", lay.total).map_err(io_err("memfd_create"))?;
        let seg =
            Arc::new(Mapping::new_populated(&memfd, lay.total).map_err(io_err("mmap segment"))?);
        header(&seg, HDR_SLOT_OF_ACCEPTOR).store(slot_word(slot), Ordering::Release);
        sock.send_with_fds(
            &hello.encode(),
            &[
                memfd.as_raw_fd(),
                me.doorbell,
                me.board.fd(),
                tether_theirs.as_raw_fd(),
            ],
        )
        .map_err(|e| fail(format!("sending hello: {e}")))?;
        // Only the peer may hold its end: its exit must read as a hang-up on ours.
        drop((memfd, tether_theirs));
        let deadline = std::time::Instant::now() + cfg.connect_timeout;
        let mut buf = [0u8; 64];
        let mut fds = Vec::new();
        let n = loop {
            if std::time::Instant::now() >= deadline {
                return Err(fail(format!("no answer within {:?}", cfg.connect_timeout)));
            }
            match sock.recv_with_fds(&mut buf, &mut fds, Duration::from_millis(1)) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => while_waiting(),
                Err(e) => return Err(fail(format!("reading welcome: {e}"))),
            }
        };
        if n == 0 {
            return Err(fail("peer refused the connection (see its log)".into()));
        }
        let w = Welcome::parse(&buf[..n.min(WELCOME_LEN)]).map_err(|e| fail(e.to_string()))?;
        if fds.len() != 2 {
            return Err(fail(format!(
                "welcome carried {} fds, expected 2",
                fds.len()
            )));
        }
        let board = fds.pop().ok_or_else(|| fail("no board".into()))?;
        let doorbell = fds.pop().ok_or_else(|| fail("no doorbell".into()))?;
        let post = open_post(&seg, HDR_SLOT_OF_CONNECTOR, &board);
        let cma = probe_cma(cfg, cred.pid, w.probe_addr, w.probe_value);
        sock.send_with_fds(&Ready { cma_ok: cma }.encode(), &[])
            .map_err(|e| fail(format!("sending ready: {e}")))?;
        sock.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))?;
        let (tx, rx) = ShmPeer::rings(&seg, hello.ring_cells, 0);
        Ok(ShmPeer {
            tx,
            rx,
            sock,
            doorbell,
            tether: Some(tether),
            pid: cred.pid,
            cma,
            peer_cma: w.cma_ok,
            id: w.id,
            crossed: w.crossed,
            fds: Vec::new(),
            post,
            slot,
        })
    }

    /// Completes an incoming connection whose hello has arrived (the caller checked the
    /// socket is readable; this never waits): maps the segment and answers. The peer's CMA result arrives later
    /// ([`ShmPeer::on_socket_readable`]).
    pub fn accept(sock: SeqPacket, me: &Local) -> Result<ShmPeer> {
        let cfg = &me.config;
        let fail = |why: String| Error::connect("incoming connection", why);
        let cred = check_uid(&sock, cfg)?;
        let mut buf = [0u8; 128];
        let mut fds = Vec::new();
        let n = sock
            .recv_with_fds(&mut buf, &mut fds, Duration::ZERO)
            .map_err(|e| fail(format!("reading hello: {e}")))?;
        if n == 0 {
            return Err(fail(
                "the peer closed the connection before its hello".into(),
            ));
        }
        let h = Hello::parse(&buf[..n.min(HELLO_LEN)], MAX_RING_CELLS)
            .map_err(|e| fail(e.to_string()))?;
        if fds.len() != 4 {
            return Err(fail(format!("hello carried {} fds, expected 4", fds.len())));
        }
        let tether = fds.pop().ok_or_else(|| fail("no tether".into()))?;
        let tether = Tether::from_fd(tether).map_err(|e| fail(format!("tether: {e}")))?;
        let board = fds.pop().ok_or_else(|| fail("no board".into()))?;
        let doorbell = fds.pop().ok_or_else(|| fail("no doorbell".into()))?;
        let memfd = fds.pop().ok_or_else(|| fail("no segment".into()))?;
        let lay = Layout::new(h.ring_cells);
        sys::check_peer_memfd(&memfd, lay.total).map_err(|e| fail(e.to_string()))?;
        let seg = Arc::new(
            Mapping::new_populated(&memfd, lay.total).map_err(io_err("mmap peer segment"))?,
        );
        let cma = probe_cma(cfg, cred.pid, h.probe_addr, h.probe_value);
        let post = open_post(&seg, HDR_SLOT_OF_ACCEPTOR, &board);
        sock.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))?;
        let slot = me.board.alloc();
        header(&seg, HDR_SLOT_OF_CONNECTOR).store(slot_word(slot), Ordering::Release);
        let crossed = me.connecting == Some(h.id);
        let w = Welcome {
            id: me.id,
            probe_addr: me.probe.0,
            probe_value: me.probe.1,
            cma_ok: cma,
            crossed,
        };
        if let Err(e) = sock.send_with_fds(&w.encode(), &[me.doorbell, me.board.fd()]) {
            if let Some(s) = slot {
                me.board.release(s);
            }
            return Err(fail(format!("sending welcome: {e}")));
        }
        let (tx, rx) = ShmPeer::rings(&seg, h.ring_cells, 1);
        Ok(ShmPeer {
            tx,
            rx,
            sock,
            doorbell,
            tether: Some(tether),
            pid: cred.pid,
            cma,
            peer_cma: false,
            id: h.id,
            crossed,
            fds: Vec::new(),
            post,
            slot,
        })
    }

    /// The connection socket became readable: a late handshake message, or the peer hung
    /// up. Returns false when the peer is gone.
    pub fn on_socket_readable(&mut self) -> bool {
        let mut buf = [0u8; 64];
        let mut fds = Vec::new();
        match self.sock.recv_with_fds(&mut buf, &mut fds, Duration::ZERO) {
            Ok(0) => false,
            Ok(16) if &buf[..8] == AP_FD_MAGIC => {
                let mut id = [0u8; 8];
                id.copy_from_slice(&buf[8..16]);
                if let Some(fd) = fds.pop() {
                    if self.fds.len() == MAX_STASHED_FDS {
                        self.fds.remove(0);
                    }
                    self.fds.push((u64::from_le_bytes(id), fd));
                }
                true
            }
            Ok(n) => match Ready::parse(&buf[..n.min(READY_LEN)]) {
                Ok(r) => {
                    self.peer_cma = r.cma_ok;
                    true
                }
                Err(e) => {
                    tracing::warn!("bad late handshake message: {e}");
                    false
                }
            },
            Err(e)
                if e.kind() == std::io::ErrorKind::TimedOut
                    || e.kind() == std::io::ErrorKind::WouldBlock =>
            {
                true
            }
            Err(_) => false,
        }
    }

    /// Sends an aperture's memory file for map request `req` (before its acknowledgement
    /// goes into the ring, so the file is there when the ack is read).
    pub fn send_fd(&self, req: u64, fd: &OwnedFd) -> std::io::Result<()> {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(AP_FD_MAGIC);
        b[8..].copy_from_slice(&req.to_le_bytes());
        self.sock.send_with_fds(&b, &[fd.as_raw_fd()])
    }

    /// Takes the memory file sent for map request `req`, reading the socket if it has not
    /// been read yet (it was sent before the ack that prompts this call).
    pub fn take_fd(&mut self, req: u64) -> Option<OwnedFd> {
        for _ in 0..MAX_STASHED_FDS + 1 {
            if let Some(k) = self.fds.iter().position(|(r, _)| *r == req) {
                return Some(self.fds.swap_remove(k).1);
            }
            if !sys::poll_readable(self.sock.fd(), Duration::ZERO).unwrap_or(false)
                || !self.on_socket_readable()
            {
                return None;
            }
        }
        None
    }

    /// Tries to put one frame in the ring; false when the ring is full.
    pub fn try_send(&mut self, f: &Frame) -> bool {
        let len = f.encoded_len();
        let Some(r) = self.tx.reserve(len) else {
            return false;
        };
        let idx = r.idx(self.tx.mem().cap());
        // SAFETY: the reservation owns `len` payload bytes at this record.
        let out = unsafe { std::slice::from_raw_parts_mut(self.tx.mem().payload(idx), len) };
        f.encode(out);
        self.commit(r);
        true
    }

    /// Publishes a reserved record, raises our bit on the peer's board, and wakes the
    /// peer if it sleeps (its futex, or its doorbell). Returns true when it woke it.
    #[inline(always)]
    pub fn commit(&mut self, r: Reservation) -> bool {
        // Evaluate both: the board's sleeping flag must be cleared even when the ring's
        // flag already asks for a doorbell.
        let ring = self.tx.commit(r);
        let board = self.post.as_ref().is_some_and(|p| p.raise());
        if ring == Wake::Futex {
            sys::futex_wake(self.tx.mem().sleep_flag());
        }
        // The doorbell for an epoll sleep (and a board's).
        if board || (ring != Wake::None && ring != Wake::Futex) {
            sys::ring_doorbell(self.doorbell.as_fd());
        }
        ring != Wake::None || board
    }

    /// Rings the peer's doorbell.
    pub fn wake(&self) {
        sys::ring_doorbell(self.doorbell.as_fd());
    }

    /// The bytes of a record returned by `rx.peek()`, as a lease that lasts until the
    /// record is released (the segment stays mapped while the peer exists).
    ///
    /// The bytes alias memory the peer can write; a misbehaving peer can change them under
    /// us but never make us read outside the ring (lengths were checked by `peek`).
    pub fn record_lease(&self, r: ring::Record) -> Src {
        // SAFETY: peek() checked that the record lies inside the ring; the record is ours
        // until released, and the endpoint drops the lease before releasing it.
        unsafe { Src::new(self.rx.mem().payload(r.idx), r.len) }
    }

    /// As [`ShmPeer::record_lease`], borrowed from the peer.
    pub fn record_bytes(&self, r: ring::Record) -> &[u8] {
        // SAFETY: inside the ring (peek() checked); the record cannot be released while
        // `self` is borrowed.
        unsafe { std::slice::from_raw_parts(self.rx.mem().payload(r.idx), r.len) }
    }

    /// The `len` payload bytes from `off` of a reserved record, to write the message into.
    pub fn reserved(&mut self, r: &Reservation, off: usize, len: usize) -> &mut [u8] {
        let idx = r.idx(self.tx.mem().cap());
        assert!(off + len <= r.bytes(), "inside the reservation");
        // SAFETY: the reservation owns its payload bytes until committed or abandoned,
        // and `&mut self` keeps any other view of them away meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.tx.mem().payload(idx).add(off), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::{ring_cells_for, MIN_SHRUNK_CELLS};

    #[test]
    fn rings_shrink_by_half_per_doubling_of_peers_down_to_the_floor() {
        let sizes: Vec<u32> = [0, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 1000]
            .iter()
            .map(|&n| ring_cells_for(2048, n, true))
            .collect();
        assert_eq!(
            sizes,
            [2048, 2048, 1024, 1024, 512, 512, 256, 256, 128, 128, 128, 128]
        );
        // Off: always the configured size; a configured size below the floor stays.
        assert_eq!(ring_cells_for(2048, 1000, false), 2048);
        assert_eq!(ring_cells_for(64, 1000, true), 64);
        assert!(ring_cells_for(1 << 20, usize::MAX, true) >= MIN_SHRUNK_CELLS);
    }
}
