//! The RMA target, without I/O: several initiators stream encoded requests (puts inline,
//! acknowledged or not, large puts and gets by the copy engine, gets in frames, atomics,
//! notifies, syncs, maps) at one target, which serves them with the runtime's code
//! (`clink_proto::rma::serve`) over memory of the harness's; one initiator is on another
//! host (its copies are unsupported). Engine turns come between arrivals, round-robin
//! between peers as the runtime's progress pass does them. Faults: copy pieces fail,
//! requests name a forged key, a revoked or unknown export, a range outside the window, a
//! right the export lacks, a misaligned word; and a peer dies with requests under way.
//!
//! Checked against a sequential model of each initiator's window: every request is
//! answered once, in the order its initiator sent it, with the status its fault calls for;
//! a get, an atomic or a notify sees exactly the bytes of the requests sent before it; a
//! request fires the tripwires of its range once, after its bytes are in; no piece is
//! larger than the quantum; a failed copy leaves the requests behind it to be served; and
//! a dead peer's engine is left empty and answers nothing more.

use clink_proto::netsim::Rng;
use clink_proto::rma::serve::{self, Admitted, HeapRegion, Host};
use clink_proto::rma::{
    AtomicOp, Engine, Grant, Piece, RmaFrame, Status, Target, QUANTUM, READ, WRITE,
};
use clink_proto::wire::Frame;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

const PEERS: usize = 3;
/// Each initiator's window in the aperture.
const WINDOW: u64 = 2 << 20;
/// The largest get-data frame's payload.
const GET_CHUNK: usize = 3000;
const KEY: u128 = 0x5eed_0fc0_ffee;
/// Exports besides each peer's window (numbered `PEERS + k`).
const READ_ONLY: u32 = PEERS as u32;
const REVOKED: u32 = PEERS as u32 + 1;
const UNKNOWN: u32 = 999;
/// The peer on another host: its large puts and gets cannot be copied (unsupported).
const ACROSS: usize = 2;

/// What a request is, as its initiator knows it.
#[derive(Clone, Debug)]
enum Req {
    /// Bytes in the frame; `acked`: the initiator asked for an answer.
    Put {
        at: u64,
        data: Vec<u8>,
        acked: bool,
    },
    /// Bytes in the initiator's memory: copied by the engine.
    BigPut {
        at: u64,
        data: Vec<u8>,
    },
    /// Into the initiator's memory, by the engine.
    BigGet {
        at: u64,
        len: u64,
    },
    /// The bytes in get-data frames.
    Get {
        at: u64,
        len: u64,
    },
    FetchAdd {
        at: u64,
        v: u64,
    },
    CompareSwap {
        at: u64,
        expect: u64,
        new: u64,
    },
    /// Fires on the window's bytes: the harness records what they are then.
    Notify {
        at: u64,
        len: u64,
    },
    Sync,
    /// A same-host mapping of the window (the harness's host hands one out).
    Map,
}

/// How a request is made wrong (or not).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    BadKey,
    Revoked,
    Unknown,
    /// Past the window's end.
    OutOfRange,
    /// Through the read-only export.
    ReadOnly,
}

impl Fault {
    fn status(self) -> Status {
        match self {
            Fault::None => Status::Ok,
            Fault::BadKey => Status::BadKey,
            Fault::Revoked => Status::Revoked,
            Fault::Unknown => Status::NoSuchExport,
            Fault::OutOfRange => Status::OutOfRange,
            Fault::ReadOnly => Status::NotPermitted,
        }
    }
}

/// What the target sent back.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Ack {
        req: u64,
        status: Status,
    },
    Data {
        req: u64,
        offset: u64,
        data: Vec<u8>,
    },
    Reply {
        req: u64,
        status: Status,
        old: u64,
    },
}

/// A firing of the tripwires of a range: its place in the aperture, the access, and the
/// range's bytes at that moment.
#[derive(Clone, Debug)]
struct Fired {
    at: u64,
    len: u64,
    access: u8,
    seen: Vec<u8>,
}

/// The target: one aperture holding every initiator's window, its exports, and per peer
/// an engine, the answers sent and the tripwires fired.
struct Sim {
    mem: Rc<RefCell<Vec<u8>>>,
    grants: HashMap<u32, Grant>,
    engines: Vec<Engine<Vec<u8>>>,
    /// The initiators' memory for copies, by (peer, request number).
    theirs: HashMap<(usize, u64), Vec<u8>>,
    answers: Vec<Vec<Answer>>,
    fired: Vec<Vec<Fired>>,
    /// The mappings handed out, per peer: (request, where the window starts).
    mapped: Vec<Vec<(u64, u64)>>,
    refused: usize,
    rng: Rng,
    /// The peer whose request or engine is being served.
    cur: usize,
}

fn base(p: usize) -> u64 {
    p as u64 * WINDOW
}

/// A copy's initiator address: the request number above, the offset below.
fn addr(n: u64) -> u64 {
    (n + 1) << 32
}

impl Host for Sim {
    type Region = HeapRegion;

    fn admit(&mut self, to: &Target, len: u64, need: u8) -> Result<Admitted<HeapRegion>, Status> {
        HeapRegion::admit(&self.mem, self.grants.get(&to.export), to, len, need)
    }

    fn refused(&mut self, _: Status) {
        self.refused += 1;
    }

    fn engine(&mut self) -> &mut Engine<Vec<u8>> {
        &mut self.engines[self.cur]
    }

    fn answer(&mut self, f: RmaFrame<'_>) {
        let a = match f {
            RmaFrame::Ack { req, status } => Answer::Ack { req, status },
            RmaFrame::GetData { req, offset, data } => Answer::Data {
                req,
                offset,
                data: data.to_vec(),
            },
            RmaFrame::AtomicReply { req, status, old } => Answer::Reply { req, status, old },
            other => panic!("the target sent {other:?}"),
        };
        self.answers[self.cur].push(a);
    }

    fn fire(&mut self, ap: u32, at: u64, len: u64, access: u8) {
        assert_eq!(ap, 0);
        let seen = self.mem.borrow()[at as usize..(at + len) as usize].to_vec();
        self.fired[self.cur].push(Fired {
            at,
            len,
            access,
            seen,
        });
    }

    fn moved(&mut self, _: bool, _: u64) {}

    fn can_copy(&self) -> bool {
        self.cur != ACROSS
    }

    fn get_chunk(&self) -> usize {
        GET_CHUNK
    }

    fn map(&mut self, req: u64, a: &Admitted<HeapRegion>) -> Status {
        self.mapped[self.cur].push((req, a.at));
        Status::Ok
    }

    fn copy(&mut self, piece: &Piece) -> bool {
        assert!(
            piece.len > 0 && piece.len <= QUANTUM,
            "piece of {} bytes",
            piece.len
        );
        if self.rng.chance(0.05) {
            return false;
        }
        let (n, off) = ((piece.addr >> 32) - 1, (piece.addr & 0xffff_ffff) as usize);
        let theirs = self
            .theirs
            .get_mut(&(self.cur, n))
            .expect("a copy of a request with memory");
        let (at, len) = (piece.at as usize, piece.len as usize);
        let mut mem = self.mem.borrow_mut();
        if piece.put {
            mem[at..at + len].copy_from_slice(&theirs[off..off + len]);
        } else {
            theirs[off..off + len].copy_from_slice(&mem[at..at + len]);
        }
        true
    }
}

/// The frame of request `n` of peer `p` with fault `fault`.
fn encode(p: usize, n: u64, r: &Req, fault: Fault) -> Vec<u8> {
    let req = n + 1;
    let (export, key) = match fault {
        Fault::BadKey => (p as u32, KEY ^ 1),
        Fault::Revoked => (REVOKED, KEY),
        Fault::Unknown => (UNKNOWN, KEY),
        Fault::ReadOnly => (READ_ONLY, KEY),
        Fault::None | Fault::OutOfRange => (p as u32, KEY),
    };
    let shift = if fault == Fault::OutOfRange {
        WINDOW
    } else {
        0
    };
    let t = |at: u64| Target {
        export,
        key,
        offset: at + shift,
    };
    let f = match r {
        Req::Put { at, data, acked } => RmaFrame::Put {
            req: if *acked { req } else { 0 },
            to: t(*at),
            data,
        },
        Req::BigPut { at, data } => RmaFrame::PutCma {
            req,
            to: t(*at),
            len: data.len() as u64,
            addr: addr(n),
        },
        Req::BigGet { at, len } => RmaFrame::GetCma {
            req,
            from: t(*at),
            len: *len,
            addr: addr(n),
        },
        Req::Get { at, len } => RmaFrame::Get {
            req,
            from: t(*at),
            len: *len,
        },
        Req::FetchAdd { at, v } => RmaFrame::Atomic {
            req,
            at: t(*at),
            op: AtomicOp::FetchAdd,
            a: *v,
            b: 0,
        },
        Req::CompareSwap { at, expect, new } => RmaFrame::Atomic {
            req,
            at: t(*at),
            op: AtomicOp::CompareSwap,
            a: *expect,
            b: *new,
        },
        Req::Notify { at, len } => RmaFrame::Notify {
            req,
            at: t(*at),
            len: *len,
        },
        Req::Sync => RmaFrame::Sync { req },
        Req::Map => RmaFrame::Map { req, of: t(0) },
    };
    let f = Frame::Rma(f);
    let mut v = vec![0; f.encoded_len()];
    f.encode(&mut v);
    v
}

impl Sim {
    /// Request `n` of peer `p` arrives, as its encoded frame.
    fn arrive(&mut self, p: usize, n: u64, r: &Req, fault: Fault) {
        if let Req::BigPut { data, .. } = r {
            self.theirs.insert((p, n), data.clone());
        }
        if let Req::BigGet { len, .. } = r {
            self.theirs.insert((p, n), vec![0; *len as usize]);
        }
        let bytes = encode(p, n, r, fault);
        let Ok(Frame::Rma(f)) = Frame::parse(&bytes) else {
            panic!("request {n} of peer {p} does not parse back");
        };
        self.cur = p;
        serve::request(self, &bytes, f);
    }

    /// A progress pass: a turn of every engine.
    fn pass(&mut self) {
        for p in 0..PEERS {
            self.cur = p;
            serve::turn(self);
        }
    }
}

fn random_req(rng: &mut Rng) -> Req {
    let data = |rng: &mut Rng, len: u64| {
        let v = rng.next_u64() as u8;
        let mut d = vec![v; len as usize];
        for (k, i) in (0..d.len()).step_by(509).enumerate() {
            d[i] = k as u8 ^ v.rotate_left(3);
        }
        d
    };
    let at_len = |rng: &mut Rng, max: u64| {
        let len = 1 + rng.below(max);
        (rng.below(WINDOW - len + 1), len)
    };
    // A copy now and then of nothing (served at once: the engine takes no empty copy).
    let copy_at_len = |rng: &mut Rng| {
        if rng.chance(0.05) {
            (rng.below(WINDOW), 0)
        } else {
            at_len(rng, 3 * QUANTUM)
        }
    };
    let word = |rng: &mut Rng| {
        // Mostly aligned; now and then not (refused as misaligned).
        let at = rng.below(64) * 8;
        if rng.chance(0.1) {
            at + 1 + rng.below(7)
        } else {
            at
        }
    };
    match rng.below(21) {
        0..=6 => {
            let (at, len) = at_len(rng, 256);
            Req::Put {
                at,
                data: data(rng, len),
                acked: rng.chance(0.5),
            }
        }
        7..=9 => {
            let (at, len) = copy_at_len(rng);
            Req::BigPut {
                at,
                data: data(rng, len),
            }
        }
        10..=11 => {
            let (at, len) = copy_at_len(rng);
            Req::BigGet { at, len }
        }
        12..=13 => {
            let (at, len) = at_len(rng, 4 * GET_CHUNK as u64);
            Req::Get { at, len }
        }
        14 => Req::FetchAdd {
            at: word(rng),
            v: rng.next_u64() % 1000,
        },
        15 => Req::CompareSwap {
            at: word(rng),
            expect: rng.next_u64() % 4,
            new: rng.next_u64(),
        },
        16..=18 => {
            let (at, len) = at_len(rng, 4096);
            Req::Notify { at, len }
        }
        19 => Req::Map,
        _ => Req::Sync,
    }
}

fn random_fault(rng: &mut Rng, r: &Req) -> Fault {
    if matches!(r, Req::Sync) || !rng.chance(0.08) {
        return Fault::None;
    }
    let read_only_refuses = matches!(
        r,
        Req::Put { .. }
            | Req::BigPut { .. }
            | Req::Notify { .. }
            | Req::FetchAdd { .. }
            | Req::CompareSwap { .. }
    );
    match rng.below(5) {
        0 => Fault::BadKey,
        1 => Fault::Revoked,
        2 => Fault::Unknown,
        // (A map has no length: at the window's end it is still inside.)
        3 if !matches!(r, Req::Map) => Fault::OutOfRange,
        _ if read_only_refuses => Fault::ReadOnly,
        _ => Fault::BadKey,
    }
}

/// What the target did for one peer.
struct Seen<'a> {
    answers: &'a [Answer],
    fired: &'a [Fired],
    /// The target's bytes of the peer's window at the end.
    window: &'a [u8],
    /// The initiator's memory of its copies.
    theirs: &'a HashMap<(usize, u64), Vec<u8>>,
    /// The mappings handed out.
    mapped: &'a [(u64, u64)],
    /// The peer died (only its answers' order and contents are checked, up to where they
    /// stop).
    dead: bool,
}

/// One peer's requests and faults, and what the target did, checked against the peer's
/// window applied in order (a failed copy's range is unknown until the end, where the
/// target's bytes are taken for it when no later put of this peer covers it). Returns how
/// many of its requests were refused.
fn check_peer(seed: u64, p: usize, sent: &[(Req, Fault)], seen: Seen<'_>) -> usize {
    let Seen {
        answers,
        fired,
        window,
        theirs,
        mapped,
        dead,
    } = seen;
    let mut maps = Vec::new();
    let mut refusals = 0;
    let ctx = format!("seed {seed}: peer {p}");
    let mut model = vec![0u8; WINDOW as usize];
    let mut answers = answers.iter().peekable();
    let mut fired = fired.iter();
    let mut unknown: Vec<(usize, usize)> = Vec::new();
    let overlaps = |unknown: &[(usize, usize)], at: usize, len: usize| {
        unknown.iter().any(|&(u, ul)| at < u + ul && u < at + len)
    };
    let mut ended = false;
    for (n, (r, fault)) in sent.iter().enumerate() {
        let req = n as u64 + 1;
        let want = fault.status();
        // The fire of an access that took effect: its range, and what it saw.
        let mut fire = |at: u64, len: u64, access: u8| -> Fired {
            let f = fired
                .next()
                .cloned()
                .unwrap_or_else(|| panic!("{ctx}: request {req} ({r:?}) fired nothing"));
            assert_eq!(
                (f.at, f.len, f.access),
                (base(p) + at, len, access),
                "{ctx}: request {req} ({r:?}) fired another range"
            );
            f
        };
        // An unacknowledged put that is not refused has no answer: it took effect if any
        // answer comes after it (and, for a peer that lived, in any case).
        if let (
            Req::Put {
                at,
                data,
                acked: false,
            },
            Fault::None,
        ) = (r, fault)
        {
            if dead && answers.peek().is_none() {
                break;
            }
            let at = *at as usize;
            model[at..at + data.len()].copy_from_slice(data);
            unknown.retain(|&(u, ul)| !(at <= u && u + ul <= at + data.len()));
            let f = fire(at as u64, data.len() as u64, WRITE);
            assert_eq!(f.seen, *data, "{ctx}: a put fired before its bytes were in");
            continue;
        }
        // Every other request is answered: first its data, if a get.
        let mut got = Vec::new();
        if let (Req::Get { .. }, Fault::None) = (r, fault) {
            while let Some(Answer::Data {
                req: q,
                offset,
                data,
            }) = answers.peek()
            {
                assert_eq!(*q, req, "{ctx}: get data of another request");
                assert_eq!(*offset as usize, got.len(), "{ctx}: get data out of order");
                assert!(data.len() <= GET_CHUNK, "{ctx}: get data beyond the chunk");
                got.extend_from_slice(data);
                answers.next();
            }
        }
        let Some(a) = answers.next() else {
            assert!(dead, "{ctx}: request {req} ({r:?}) never answered");
            ended = true;
            break;
        };
        match (r, a) {
            (
                Req::FetchAdd { at, .. } | Req::CompareSwap { at, .. },
                Answer::Reply {
                    req: q,
                    status,
                    old,
                },
            ) => {
                assert_eq!(*q, req, "{ctx}: {r:?} answered out of order");
                let misaligned = at % 8 != 0 && *fault == Fault::None;
                let want = if misaligned { Status::Misaligned } else { want };
                assert_eq!(*status, want, "{ctx}: {r:?} with {fault:?}");
                if want != Status::Ok {
                    refusals += 1;
                    continue;
                }
                let at = *at as usize;
                let w: [u8; 8] = model[at..at + 8].try_into().unwrap();
                let cur = u64::from_le_bytes(w);
                if !overlaps(&unknown, at, 8) {
                    assert_eq!(*old, cur, "{ctx}: {r:?} saw another old value");
                }
                let new = match r {
                    Req::FetchAdd { v, .. } => old.wrapping_add(*v),
                    Req::CompareSwap { expect, new, .. } if old == expect => *new,
                    _ => *old,
                };
                model[at..at + 8].copy_from_slice(&new.to_le_bytes());
                let f = fire(at as u64, 8, READ | WRITE);
                assert_eq!(
                    f.seen,
                    new.to_le_bytes(),
                    "{ctx}: {r:?} fired before it applied"
                );
            }
            (_, Answer::Ack { req: q, status }) => {
                assert_eq!(
                    *q,
                    if matches!(r, Req::Put { acked: false, .. }) {
                        0
                    } else {
                        req
                    },
                    "{ctx}: {r:?} answered out of order"
                );
                let copy = matches!(r, Req::BigPut { .. } | Req::BigGet { .. });
                let empty = matches!(r, Req::BigPut { data, .. } if data.is_empty())
                    || matches!(r, Req::BigGet { len: 0, .. });
                // Across hosts a copy is unsupported (an empty one needs no copy).
                let want = if copy && !empty && p == ACROSS && *fault == Fault::None {
                    Status::Unsupported
                } else {
                    want
                };
                if copy && *status == Status::Failed && *fault == Fault::None && p != ACROSS {
                    // A failed copy: a put may have written some of its pieces.
                    if let Req::BigPut { at, data } = r {
                        unknown.push((*at as usize, data.len()));
                    }
                    continue;
                }
                assert_eq!(*status, want, "{ctx}: {r:?} with {fault:?}");
                if want != Status::Ok {
                    refusals += usize::from(want != Status::Unsupported);
                    continue;
                }
                match r {
                    Req::Put { at, data, .. } | Req::BigPut { at, data } => {
                        let at = *at as usize;
                        model[at..at + data.len()].copy_from_slice(data);
                        unknown.retain(|&(u, ul)| !(at <= u && u + ul <= at + data.len()));
                        let f = fire(at as u64, data.len() as u64, WRITE);
                        assert_eq!(f.seen, *data, "{ctx}: {r:?} fired before its bytes were in");
                    }
                    Req::BigGet { at, len } | Req::Get { at, len } | Req::Notify { at, len } => {
                        let (a, l) = (*at as usize, *len as usize);
                        let access = if matches!(r, Req::Notify { .. }) {
                            WRITE
                        } else {
                            READ
                        };
                        let f = fire(*at, *len, access);
                        if !overlaps(&unknown, a, l) {
                            assert!(
                                f.seen[..] == model[a..a + l],
                                "{ctx}: {r:?} fired on bytes other than those sent before it"
                            );
                            if matches!(r, Req::Get { .. }) {
                                assert!(got[..] == model[a..a + l], "{ctx}: {r:?} got other bytes");
                            }
                            if matches!(r, Req::BigGet { .. }) {
                                let into = &theirs[&(p, n as u64)];
                                assert!(
                                    into[..] == model[a..a + l],
                                    "{ctx}: {r:?} copied other bytes"
                                );
                            }
                        }
                    }
                    Req::Sync => {}
                    Req::Map => maps.push((req, base(p))),
                    Req::FetchAdd { .. } | Req::CompareSwap { .. } => unreachable!(),
                }
            }
            (r, a) => panic!("{ctx}: {r:?} answered with {a:?}"),
        }
    }
    assert!(
        ended || answers.next().is_none(),
        "{ctx}: answers to requests never sent"
    );
    assert!(
        fired.next().is_none() || dead,
        "{ctx}: tripwires fired by no request"
    );
    assert!(
        dead || maps == mapped,
        "{ctx}: mappings handed out {mapped:?}, answered {maps:?}"
    );
    if dead {
        return refusals;
    }
    for &(u, ul) in &unknown {
        model[u..u + ul].copy_from_slice(&window[u..u + ul]);
    }
    assert!(model == window, "{ctx}: window bytes at the end");
    refusals
}

fn run(seed: u64) {
    let mut rng = Rng::new(seed);
    let sent: Vec<Vec<(Req, Fault)>> = (0..PEERS)
        .map(|_| {
            (0..10 + rng.below(40))
                .map(|_| {
                    let r = random_req(&mut rng);
                    let f = random_fault(&mut rng, &r);
                    (r, f)
                })
                .collect()
        })
        .collect();
    let mut grants = HashMap::new();
    let grant = |base: u64, rights: u8, revoked: bool| Grant {
        aperture: 0,
        base,
        len: WINDOW,
        rights,
        key: KEY,
        revoked,
    };
    for p in 0..PEERS {
        grants.insert(p as u32, grant(base(p), READ | WRITE, false));
    }
    grants.insert(READ_ONLY, grant(0, READ, false));
    grants.insert(REVOKED, grant(0, READ | WRITE, true));
    let mut t = Sim {
        mem: Rc::new(RefCell::new(vec![0; PEERS * WINDOW as usize])),
        grants,
        engines: (0..PEERS).map(|_| Engine::default()).collect(),
        theirs: HashMap::new(),
        answers: vec![Vec::new(); PEERS],
        fired: vec![Vec::new(); PEERS],
        mapped: vec![Vec::new(); PEERS],
        refused: 0,
        rng: Rng::new(seed ^ 0x9e37),
        cur: 0,
    };
    let mut next: Vec<VecDeque<u64>> = sent.iter().map(|v| (0..v.len() as u64).collect()).collect();
    // A third of the runs lose a peer while its requests are under way.
    let victim = rng.chance(0.3).then(|| rng.below(PEERS as u64) as usize);
    let mut dead = [false; PEERS];
    let mut answered_at_death = 0;
    // Arrivals and progress passes interleaved at random; then the engines run dry.
    while next.iter().any(|q| !q.is_empty()) {
        let p = rng.below(PEERS as u64) as usize;
        if Some(p) == victim && !dead[p] && rng.chance(0.02) {
            // As the runtime fails a peer: its engine dropped, nothing more arrives.
            dead[p] = true;
            t.engines[p].clear();
            next[p].clear();
            answered_at_death = t.answers[p].len();
            continue;
        }
        if rng.chance(0.6) {
            if let Some(n) = next[p].pop_front() {
                let (r, f) = &sent[p][n as usize];
                t.arrive(p, n, r, *f);
            }
        } else {
            t.pass();
        }
    }
    for _ in 0..100_000 {
        if t.engines.iter().all(|e| e.is_empty()) {
            break;
        }
        t.pass();
    }
    assert!(
        t.engines.iter().all(|e| e.is_empty()),
        "seed {seed}: engines never ran dry"
    );
    let mem = t.mem.borrow();
    let mut refusals = 0;
    for p in 0..PEERS {
        if dead[p] {
            assert_eq!(
                t.answers[p].len(),
                answered_at_death,
                "seed {seed}: a dead peer was answered"
            );
        }
        let seen = Seen {
            answers: &t.answers[p],
            fired: &t.fired[p],
            window: &mem[base(p) as usize..(base(p) + WINDOW) as usize],
            theirs: &t.theirs,
            mapped: &t.mapped[p],
            dead: dead[p],
        };
        refusals += check_peer(seed, p, &sent[p], seen);
    }
    assert_eq!(t.refused, refusals, "seed {seed}: refusals counted");
}

#[test]
fn requests_take_effect_in_the_order_each_initiator_sent_them() {
    for seed in 0..300 {
        run(seed);
    }
}
