//! Hostile and odd peers: a fake peer built from the raw pieces (`clink::sys` sockets,
//! memfds, mappings, eventfds and `clink_proto::wire` handshake messages) connects to a
//! real endpoint and
//! - sends a malformed hello (bad magic, version, kind, ring size, truncated, wrong fd
//!   count, a tether that is not a stream socket, unsealed or too small segment, nothing at
//!   all): the connection is refused,
//!   `last_error` says why, and the endpoint keeps serving a well-behaved peer;
//! - completes the handshake, then writes garbage into the ring (a sequence word from the
//!   future, a record length beyond the ring or across its end, an unknown frame kind,
//!   truncated frames, a CTS, a push or a pushed for a send that does not exist):
//!   `protocol_errors` counts it,
//!   that peer is declared dead, nothing panics, messages it sent before the garbage are
//!   delivered, and the well-behaved peer still exchanges messages;
//! - corrupts the consumer head it publishes, or asks for rings smaller than the
//!   endpoint's own: the endpoint must not panic;
//! - cannot write its half of a split rendezvous: the endpoint reads it itself.
//!
//! Offsets inside the segment use only the stable ring part of the layout: ring 0
//! (connector to acceptor) at 4096, ring 1 right after it (page-rounded), each a 256-byte
//! control block (consumer head at offset 0) then 64-byte cells (seq u64, len u32, flags
//! u32, payload; frame kind in payload byte 0).

mod common;

use clink::sys::{self, Mapping, SeqPacket};
use clink::{Config, Endpoint, Error, PeerId, Selector};
use clink_proto::wire::{Frame, Hello, Ready, Welcome, EAGER_HEADER};
use common::*;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const CTRL: usize = 256;
const CELL: usize = 64;
const RING0: usize = PAGE;
const CELLS: u32 = 64;

fn ring_bytes(cells: u32) -> usize {
    (CTRL + cells as usize * CELL).div_ceil(PAGE) * PAGE
}

/// Segment size for `cells`-cell rings, with a margin (a larger memfd is accepted).
fn seg_len(cells: u32) -> usize {
    RING0 + 2 * ring_bytes(cells) + 64 * 1024
}

fn hello(cells: u32) -> Hello {
    Hello {
        id: sys::random_u128().unwrap(),
        ring_cells: cells,
        probe_addr: 0,
        probe_value: 0,
    }
}

fn shm_name(ep: &Endpoint) -> String {
    clink_proto::addr::Address::parse(&ep.address())
        .unwrap()
        .shm
        .expect("shm socket name")
}

// ------------------------------------------------------------------ well-behaved peer

/// A well-behaved peer on its own thread: echoes tag 1 as tag 2 until an empty message.
fn good_peer(addr: String) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let ctx = ctx();
        let mut ep = ctx.endpoint().unwrap();
        let p = ep.connect(&addr).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let st = ep
                .recv_timeout(Selector::exact(Some(p), 1), &mut buf, Some(T))
                .unwrap();
            if st.len == 0 {
                break;
            }
            ep.send(p, 2, &buf[..st.len as usize]).unwrap();
        }
    })
}

fn ping(ep: &mut Endpoint, peer: PeerId, round: u64) {
    for (i, len) in [1usize, 1000, 30_000, 300 << 10].into_iter().enumerate() {
        let k = key(round, i as u64);
        ep.send(peer, 1, &pattern(k, len)).unwrap();
        let back = recv_vec(ep, peer, 2, 1 << 20);
        assert_eq!(back.len(), len);
        check(k, &back, &format!("echo round {round}"));
    }
}

fn stop(ep: &mut Endpoint, peer: PeerId, h: JoinHandle<()>) {
    ep.send(peer, 1, &[]).unwrap();
    h.join().expect("good peer thread");
}

// ------------------------------------------------------------------ bad hellos

enum Fds {
    Good,
    None,
    One,
    /// Segment and doorbell but no activity board.
    Two,
    /// No tether.
    Three,
    Five,
    /// An eventfd where the tether (a stream socket) belongs.
    BadTether,
    Unsealed,
    TooSmall,
}

fn unsealed_memfd(len: usize) -> OwnedFd {
    let name = c"clinktest-unsealed";
    // SAFETY: valid C string, constant flags; the fd is owned by nobody else.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: fresh fd from the kernel.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall on an fd we own.
    let r = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
    assert_eq!(r, 0);
    fd
}

/// Connects, sends `msg` with the given fds, and returns the answer's length (0: the
/// endpoint closed the connection, i.e. refused it). `None` for `msg` closes at once.
fn send_hello(name: String, msg: Option<Vec<u8>>, fds: Fds) -> std::io::Result<usize> {
    let sock = SeqPacket::connect(&name)?;
    let Some(msg) = msg else {
        return Ok(0);
    };
    let len = seg_len(CELLS);
    let seg = sys::memfd_sealed("clinktest-fake", len)?;
    let small = sys::memfd_sealed("clinktest-small", 4096)?;
    let unsealed = unsealed_memfd(len);
    let db = sys::eventfd()?;
    let db2 = sys::eventfd()?;
    let board = sys::memfd_sealed("clinktest-board", 4096)?;
    let (_tether, tether_theirs) = sys::Tether::pair()?;
    let (seg, db, board) = (seg.as_raw_fd(), db.as_raw_fd(), board.as_raw_fd());
    let tether = tether_theirs.as_raw_fd();
    let list: Vec<RawFd> = match fds {
        Fds::Good => vec![seg, db, board, tether],
        Fds::None => vec![],
        Fds::One => vec![seg],
        Fds::Two => vec![seg, db],
        Fds::Three => vec![seg, db, board],
        Fds::Five => vec![seg, db, board, tether, db2.as_raw_fd()],
        Fds::BadTether => vec![seg, db, board, db2.as_raw_fd()],
        Fds::Unsealed => vec![unsealed.as_raw_fd(), db, board, tether],
        Fds::TooSmall => vec![small.as_raw_fd(), db, board, tether],
    };
    sock.send_with_fds(&msg, &list)?;
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    sock.recv_with_fds(&mut buf, &mut got, T)
}

#[test]
fn bad_hellos_are_refused_and_the_endpoint_keeps_working() {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let name = shm_name(&ep);
    let good = hello(CELLS).encode().to_vec();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.clone();
        f(&mut v);
        Some(v)
    };
    let cells = |n: u32| Some(hello(n).encode().to_vec());
    let cases: Vec<(&str, Option<Vec<u8>>, Fds, &str)> = vec![
        ("bad magic", with(&|v| v[0] ^= 0xff), Fds::Good, "magic"),
        ("bad version", with(&|v| v[4] = 99), Fds::Good, "version"),
        (
            "welcome kind",
            with(&|v| v[6] = 2),
            Fds::Good,
            "expected a hello",
        ),
        ("ring too large", cells(1 << 21), Fds::Good, "ring cells"),
        (
            "ring not a power of two",
            cells(1000),
            Fds::Good,
            "ring cells",
        ),
        ("ring of zero cells", cells(0), Fds::Good, "ring cells"),
        (
            "truncated hello",
            with(&|v| v.truncate(20)),
            Fds::Good,
            "truncated",
        ),
        ("no fds", Some(good.clone()), Fds::None, "fds"),
        ("one fd", Some(good.clone()), Fds::One, "fds"),
        ("two fds", Some(good.clone()), Fds::Two, "fds"),
        ("three fds", Some(good.clone()), Fds::Three, "fds"),
        ("five fds", Some(good.clone()), Fds::Five, "fds"),
        (
            "tether not a socket",
            Some(good.clone()),
            Fds::BadTether,
            "tether",
        ),
        (
            "unsealed segment",
            Some(good.clone()),
            Fds::Unsealed,
            "sealed",
        ),
        (
            "segment too small",
            Some(good.clone()),
            Fds::TooSmall,
            "bytes",
        ),
        ("no hello at all", None, Fds::Good, ""),
    ];
    let n_cases = cases.len() as u64;
    for (case, msg, fds, keyword) in cases {
        let before = ep.last_error().map(str::to_string);
        let n = name.clone();
        let h = std::thread::spawn(move || send_hello(n, msg, fds));
        let deadline = Instant::now() + T;
        // Serve the endpoint until the fake peer has its answer and the refusal is recorded.
        while !h.is_finished() || ep.last_error().map(str::to_string) == before {
            assert!(Instant::now() < deadline, "{case}: no refusal recorded");
            match ep.accept(Some(Duration::from_millis(5))) {
                Err(Error::Timeout) => {}
                Ok(p) => panic!("{case}: a bad peer was accepted as {p}"),
                Err(e) => panic!("{case}: accept failed: {e}"),
            }
        }
        let answer = h.join().expect("fake peer thread");
        assert!(
            matches!(answer, Ok(0)),
            "{case}: expected the connection to be closed, got {answer:?}"
        );
        let le = ep.last_error().unwrap_or_default().to_lowercase();
        println!("{case}: {le}");
        assert!(
            le.contains(keyword),
            "{case}: last_error {le:?} lacks {keyword:?}"
        );
    }
    assert_eq!(ep.stats().peers_connected, 0);
    assert_eq!(ep.stats().handshakes_refused, n_cases);
    assert!(ep.peers().is_empty());
    // A well-behaved peer is served as usual.
    let h = good_peer(ep.address());
    let gp = ep.accept(Some(T)).unwrap();
    ping(&mut ep, gp, 1);
    stop(&mut ep, gp, h);
}

#[test]
fn silent_connection_does_not_stall_the_endpoint() {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let name = shm_name(&ep);
    let h = good_peer(ep.address());
    let gp = ep.accept(Some(T)).unwrap();
    let sock = SeqPacket::connect(&name).unwrap();
    // The endpoint serves the good peer while the silent connection is pending.
    let mut worst = Duration::ZERO;
    let end = Instant::now() + Duration::from_millis(1500);
    let mut round = 10;
    while Instant::now() < end {
        let t0 = Instant::now();
        ping(&mut ep, gp, round);
        worst = worst.max(t0.elapsed());
        round += 1;
    }
    drop(sock);
    println!("worst echo round trip with a silent connection pending: {worst:?}");
    stop(&mut ep, gp, h);
    assert!(worst < Duration::from_millis(500), "stalled for {worst:?}");
}

// ------------------------------------------------------------------ ring garbage

/// A fake peer that completed the handshake: it owns the segment and can write anything.
struct Fake {
    _sock: SeqPacket,
    seg: Mapping,
    ep_doorbell: OwnedFd,
    _doorbell: OwnedFd,
    /// Our end of the tether, held so that the endpoint sees no hang-up on it.
    _tether: sys::Tether,
    cells: u32,
}

fn fake_connect(name: String, cells: u32) -> std::io::Result<Fake> {
    fake_connect_with(name, hello(cells))
}

/// [`fake_connect`] with a hello of the caller's (a readable probe word: CMA allowed).
fn fake_connect_with(name: String, hello: Hello) -> std::io::Result<Fake> {
    let cells = hello.ring_cells;
    let sock = SeqPacket::connect(&name)?;
    let len = seg_len(cells);
    let memfd = sys::memfd_sealed("clinktest-fake", len)?;
    let seg = Mapping::new(&memfd, len)?;
    let db = sys::eventfd()?;
    // A board file too small to be one (and no slot on it in the segment header): the
    // endpoint keeps no post on this peer's board and must take no harm from it. (It
    // still gives the fake a slot on its own board; with fewer than CLINK_BOARD_PEERS
    // peers every ring is polled on each pass anyway.)
    let board = sys::memfd_sealed("clinktest-board", 64)?;
    let (tether, tether_theirs) = sys::Tether::pair()?;
    sock.send_with_fds(
        &hello.encode(),
        &[
            memfd.as_raw_fd(),
            db.as_raw_fd(),
            board.as_raw_fd(),
            tether_theirs.as_raw_fd(),
        ],
    )?;
    let mut buf = [0u8; 64];
    let mut fds = Vec::new();
    let n = sock.recv_with_fds(&mut buf, &mut fds, T)?;
    let w = Welcome::parse(&buf[..n]).map_err(|e| std::io::Error::other(e.to_string()))?;
    assert_eq!(
        w.cma_ok,
        hello.probe_addr != 0,
        "the probe address 0 cannot be read, a real one can"
    );
    assert_eq!(
        fds.len(),
        2,
        "welcome carries the endpoint's doorbell and board"
    );
    fds.truncate(1);
    sock.send_with_fds(&Ready { cma_ok: false }.encode(), &[])?;
    Ok(Fake {
        _sock: sock,
        seg,
        ep_doorbell: fds.pop().expect("doorbell"),
        _doorbell: db,
        _tether: tether,
        cells,
    })
}

/// Connects a fake peer to `ep` (served from this thread) and returns it with its id.
fn connect_fake(ep: &mut Endpoint, cells: u32) -> (Fake, PeerId) {
    let name = shm_name(ep);
    let h = std::thread::spawn(move || fake_connect(name, cells));
    let p = ep.accept(Some(T)).expect("fake peer accepted");
    let f = h.join().expect("fake thread").expect("fake handshake");
    (f, p)
}

impl Fake {
    fn cell(&self, ring: usize, pos: u64) -> *mut u8 {
        let base = RING0 + ring * ring_bytes(self.cells) + CTRL;
        let off = base + (pos % u64::from(self.cells)) as usize * CELL;
        assert!(off + CELL <= self.seg.len());
        // SAFETY: inside the mapping (checked above).
        unsafe { self.seg.ptr().add(off) }
    }

    /// Writes a record at ring-0 position `pos` with explicit header fields and publishes
    /// it with sequence word `seq`.
    fn put(&self, pos: u64, seq: u64, len: u32, flags: u32, payload: &[u8]) {
        let c = self.cell(0, pos);
        let room = (u64::from(self.cells) - pos % u64::from(self.cells)) as usize * CELL - 16;
        assert!(payload.len() <= room, "test writes inside the ring");
        // SAFETY: the cell and the payload bytes after it lie inside the mapping; the
        // endpoint only reads them after the Release store of the sequence word.
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), c.add(16), payload.len());
            std::ptr::write_volatile(c.add(8) as *mut u32, len);
            std::ptr::write_volatile(c.add(12) as *mut u32, flags);
            (*(c as *const AtomicU64)).store(seq, Ordering::Release);
        }
        sys::ring_doorbell(self.ep_doorbell.as_fd());
    }

    /// Writes a well-formed frame at `pos`; returns the next position.
    fn frame(&self, pos: u64, f: &Frame) -> u64 {
        let mut b = vec![0u8; f.encoded_len()];
        f.encode(&mut b);
        self.put(pos, pos + 1, b.len() as u32, 0, &b);
        pos + (16 + b.len()).div_ceil(CELL) as u64
    }

    /// The frame the endpoint published at ring-1 position `pos` (endpoint to us), as
    /// bytes, once its sequence word says it is there.
    fn read(&self, pos: u64) -> Option<Vec<u8>> {
        let c = self.cell(1, pos);
        // SAFETY: the cell lies inside the mapping; its record is read only after the
        // Acquire load of its sequence word shows it published.
        unsafe {
            if (*(c as *const AtomicU64)).load(Ordering::Acquire) != pos + 1 {
                return None;
            }
            let len = std::ptr::read_volatile(c.add(8) as *const u32) as usize;
            assert!(len <= CELL - 16, "a control frame fits one cell");
            Some(std::slice::from_raw_parts(c.add(16), len).to_vec())
        }
    }

    /// Stores `v` as the consumer head this peer publishes for ring 1 (endpoint to us).
    fn publish_head(&self, v: u64) {
        let off = RING0 + ring_bytes(self.cells);
        // SAFETY: the control block of ring 1 is inside the mapping, 8-aligned.
        unsafe { (*(self.seg.ptr().add(off) as *const AtomicU64)).store(v, Ordering::Release) };
    }
}

fn eager(tag: u64, data: &[u8]) -> Frame<'_> {
    Frame::Eager { tag, data }
}

#[test]
fn ring_garbage_kills_only_that_peer() {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let h = good_peer(ep.address());
    let gp = ep.accept(Some(T)).unwrap();
    ping(&mut ep, gp, 100);
    let big = vec![0x5a; 30 * CELL - 16 - EAGER_HEADER]; // a 30-cell eager record
    type Writer = Box<dyn Fn(&Fake)>;
    let cases: Vec<(&str, Writer, &str)> = vec![
        (
            "sequence word from the future after a valid message",
            Box::new(|f| {
                let next = f.frame(0, &eager(77, b"before the garbage"));
                f.put(next, 1000, 16, 0, &[1; 16]);
            }),
            "sequence",
        ),
        (
            "record length beyond the ring",
            Box::new(|f| f.put(0, 1, 0xffff_0000, 0, &[1; 16])),
            "length",
        ),
        (
            "record across the end of the ring",
            Box::new(move |f| {
                let p = f.frame(0, &eager(5, &big));
                let p = f.frame(p, &eager(5, &big));
                assert_eq!(p, 60);
                f.put(p, p + 1, 500, 0, &[1; 16]);
            }),
            "length",
        ),
        (
            "unknown frame kind",
            Box::new(|f| {
                let mut b = [0u8; 16];
                b[0] = 0xee;
                f.put(0, 1, 16, 0, &b);
            }),
            "kind",
        ),
        (
            "eager frame shorter than its header",
            Box::new(|f| {
                let mut b = [0u8; 16];
                eager(1, &[]).encode(&mut b);
                f.put(0, 1, 8, 0, &b);
            }),
            "truncated",
        ),
        (
            "frame shorter than a kind word",
            Box::new(|f| f.put(0, 1, 3, 0, &[1, 0, 0])),
            "truncated",
        ),
        (
            "CTS for a send that does not exist",
            Box::new(|f| {
                f.frame(0, &Frame::Cts { send_id: 0xdead });
            }),
            "",
        ),
        (
            "push (write my half here) for a send that does not exist",
            Box::new(|f| {
                f.frame(
                    0,
                    &Frame::Push {
                        send_id: 0xdead,
                        addr: 0x1000,
                        len: 1 << 20,
                    },
                );
            }),
            "push for unknown send",
        ),
        (
            "pushed (my half is written) for a receive that does not exist",
            Box::new(|f| {
                f.frame(
                    0,
                    &Frame::Pushed {
                        send_id: 0xdead,
                        ok: true,
                    },
                );
            }),
            "pushed for unknown send",
        ),
    ];
    let mut fakes = Vec::new();
    for (case, write, keyword) in cases {
        let (fake, fp) = connect_fake(&mut ep, CELLS);
        let early = ep
            .irecv(Selector::exact(Some(fp), 77), vec![0u8; 64])
            .unwrap();
        let s0 = ep.stats();
        write(&fake);
        let t0 = Instant::now();
        drive_until(&mut ep, T, case, |ep| !ep.is_alive(fp));
        let s1 = ep.stats();
        let le = ep.last_error().unwrap_or_default().to_lowercase();
        println!("{case}: dead after {:?}: {le}", t0.elapsed());
        assert_eq!(s1.protocol_errors, s0.protocol_errors + 1, "{case}");
        assert_eq!(s1.peers_failed, s0.peers_failed + 1, "{case}");
        assert!(
            le.contains(keyword),
            "{case}: last_error {le:?} lacks {keyword:?}"
        );
        let r = ep.wait_recv(&early, Some(T));
        if case.contains("valid message") {
            let m = r.unwrap_or_else(|e| panic!("{case}: message before the garbage: {e}"));
            assert_eq!(m.buf, b"before the garbage");
        } else {
            assert!(
                matches!(r, Err(Error::PeerDead(p)) if p == fp),
                "{case}: {r:?}"
            );
        }
        assert!(matches!(
            ep.isend(fp, 1, vec![1u8]),
            Err(Error::PeerDead(_))
        ));
        // The good peer does not notice.
        assert!(ep.is_alive(gp));
        ping(&mut ep, gp, fp.0 as u64);
        fakes.push(fake); // keep the socket open: death came from the garbage, not a hang-up
    }
    stop(&mut ep, gp, h);
}

#[test]
fn corrupt_consumer_head_does_not_panic() {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let (fake, fp) = connect_fake(&mut ep, CELLS);
    fake.publish_head(u64::MAX);
    // Fill the 64-cell ring towards the fake peer so that the endpoint re-reads the head.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for i in 0..20u64 {
            match ep.isend(fp, 1, vec![i as u8; 500]) {
                Ok(_) | Err(Error::PeerDead(_)) => {}
                Err(e) => panic!("{e}"),
            }
            ep.progress();
        }
    }));
    if r.is_err() {
        // Dropping it would panic again (its goodbye frame) and abort the test binary.
        std::mem::forget(ep);
        panic!("the endpoint panicked on a corrupt consumer head");
    }
    drop(fake);
}

#[test]
fn peer_with_smaller_rings_is_served() {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let addr = ep.address();
    // A well-behaved peer configured with 64-cell (4 KiB) rings.
    let h = std::thread::spawn(move || {
        let ctx = ctx_with(Config {
            calibrate: false,
            ring_cells: 64,
            ..Config::default()
        });
        let mut ep = ctx.endpoint().unwrap();
        let p = ep.connect(&addr).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let st = ep
                .recv_timeout(Selector::exact(Some(p), 1), &mut buf, Some(T))
                .unwrap();
            if st.len == 0 {
                break;
            }
            ep.send(p, 2, &buf[..st.len as usize]).unwrap();
        }
    });
    let gp = ep.accept(Some(T)).unwrap();
    ping(&mut ep, gp, 7);
    stop(&mut ep, gp, h);
}

/// A sender that cannot write its half of a split rendezvous: the fake peer (in this
/// process, so the endpoint can read its memory with CMA) sends a 256 KiB rendezvous,
/// answers the endpoint's push with `ok: false`, and the endpoint reads that half
/// itself: the message arrives intact, a Fin follows, and the next rendezvous from that
/// peer is not split any more.
#[test]
fn a_refused_push_is_read_by_the_receiver() {
    const LEN: usize = 256 << 10;
    let ctx = ctx_with(Config {
        calibrate: false,
        rndv: Some(clink::Rndv::Cma),
        ..Config::default()
    });
    let mut ep = ctx.endpoint().unwrap();
    let probe: &'static u64 = Box::leak(Box::new(0x5eed_cafe_u64));
    let hello = Hello {
        probe_addr: probe as *const u64 as u64,
        probe_value: *probe,
        ..hello(CELLS)
    };
    let name = shm_name(&ep);
    let h = std::thread::spawn(move || fake_connect_with(name, hello));
    let fp = ep.accept(Some(T)).expect("fake peer accepted");
    let fake = h.join().expect("fake thread").expect("fake handshake");
    assert!(ep.uses_cma(fp).unwrap());
    let msg: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    let (mut tx, mut rx) = (0u64, 0u64);
    for round in 0..2u64 {
        let rts = Frame::Rts {
            tag: 9,
            len: LEN as u64,
            send_id: round,
            addr: msg.as_ptr() as u64,
        };
        tx = fake.frame(tx, &rts);
        let req = ep
            .irecv(Selector::exact(Some(fp), 9), vec![0u8; LEN])
            .unwrap();
        let s0 = ep.stats();
        // The endpoint's answer: a push of the first half (round 0), or, once refused,
        // nothing but the Fin of a whole read (round 1).
        let mut next = || {
            let t0 = Instant::now();
            loop {
                ep.progress();
                if let Some(b) = fake.read(rx) {
                    rx += 1;
                    return Frame::parse(&b).unwrap().to_owned_ctrl();
                }
                assert!(t0.elapsed() < T, "no frame from the endpoint");
            }
        };
        let first = next();
        if round == 0 {
            let Ctrl::Push { send_id, addr, len } = first else {
                panic!("expected a push, got {first:?}");
            };
            assert_eq!((send_id, len), (0, (LEN / 2) as u64));
            assert_ne!(addr, 0);
            tx = fake.frame(tx, &Frame::Pushed { send_id, ok: false });
            let fin = next();
            assert_eq!(fin, Ctrl::Fin { send_id: 0 });
        } else {
            assert_eq!(first, Ctrl::Fin { send_id: 1 }, "round 1 is not split");
        }
        let got = ep.wait_recv(&req, Some(T)).unwrap();
        assert_eq!(got.status.len, LEN as u64);
        assert!(got.buf == msg, "round {round}: message differs");
        let s1 = ep.stats();
        assert_eq!(s1.cma_bytes - s0.cma_bytes, LEN as u64, "round {round}");
        assert_eq!(s1.cma_splits - s0.cma_splits, u64::from(round == 0));
        assert!(ep.is_alive(fp));
    }
    drop(fake);
}

/// The control frames the test above expects, owned.
#[derive(Debug, PartialEq, Eq)]
enum Ctrl {
    Push { send_id: u64, addr: u64, len: u64 },
    Fin { send_id: u64 },
    Other(String),
}

trait ToOwnedCtrl {
    fn to_owned_ctrl(&self) -> Ctrl;
}

impl ToOwnedCtrl for Frame<'_> {
    fn to_owned_ctrl(&self) -> Ctrl {
        match *self {
            Frame::Push { send_id, addr, len } => Ctrl::Push { send_id, addr, len },
            Frame::Fin { send_id } => Ctrl::Fin { send_id },
            ref f => Ctrl::Other(format!("{f:?}")),
        }
    }
}
