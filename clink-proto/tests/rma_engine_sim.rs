//! The RMA target's order of application, without I/O: several initiators stream puts
//! (inline or large), gets and notifies at one target; large ones go through each
//! peer's [`Engine`] a quantum at a time, round-robin between peers, as the runtime's
//! progress pass does, and some of their pieces fail.
//!
//! Checked against a sequential model of each initiator's window: every request takes
//! effect in the order its initiator sent it (a get or notify sees exactly the bytes of
//! the puts sent before it), no piece is larger than the quantum, a failed copy leaves
//! the requests behind it to be served, and every request is answered once.

use clink_proto::netsim::Rng;
use clink_proto::rma::{BulkCopy, Engine, QUANTUM};
use std::collections::VecDeque;

const PEERS: usize = 3;
/// Each initiator's window in the aperture.
const WINDOW: u64 = 2 << 20;

#[derive(Clone, Debug)]
enum Req {
    /// Bytes carried in the frame: applied when served.
    Put { at: u64, data: Vec<u8> },
    /// Bytes in the initiator's memory: copied by the engine.
    BigPut { at: u64, data: Vec<u8> },
    /// Into the initiator's memory, by the engine.
    BigGet { at: u64, len: u64 },
    /// Fires on the window's bytes: the harness records what they are then.
    Notify { at: u64, len: u64 },
}

/// What the target did with a request: (peer, its number, what it saw).
type Answer = (usize, u64, Option<Vec<u8>>);

struct Target {
    mem: Vec<u8>,
    engines: Vec<Engine<(u64, Req)>>,
    /// The request whose copy is at the head of each peer's engine.
    head: Vec<u64>,
    /// The initiator's memory a get in the engine fills, per peer.
    got: Vec<Vec<u8>>,
    answers: Vec<Answer>,
    rng: Rng,
}

fn base(p: usize) -> u64 {
    p as u64 * WINDOW
}

impl Target {
    /// Serves request `n` of peer `p`; a large one is handed back as a copy (`addr` 0:
    /// a piece's `addr` is then its offset in the initiator's bytes).
    fn serve(&mut self, p: usize, n: u64, r: Req) -> Option<BulkCopy> {
        let b = base(p) as usize;
        let copy = |at: u64, len: u64, put: bool| BulkCopy {
            req: n,
            ap: 0,
            at: base(p) + at,
            len,
            addr: 0,
            done: 0,
            put,
        };
        let c = match r {
            Req::Put { at, data } => {
                let at = b + at as usize;
                self.mem[at..at + data.len()].copy_from_slice(&data);
                self.answers.push((p, n, Some(Vec::new())));
                return None;
            }
            Req::Notify { at, len } => {
                let at = b + at as usize;
                let seen = self.mem[at..at + len as usize].to_vec();
                self.answers.push((p, n, Some(seen)));
                return None;
            }
            Req::BigPut { at, data } => copy(at, data.len() as u64, true),
            Req::BigGet { at, len } => {
                self.got[p] = vec![0; len as usize];
                copy(at, len, false)
            }
        };
        self.head[p] = n;
        Some(c)
    }

    /// Request `n` of peer `p` arrives: served at once, or it waits behind a copy.
    fn arrive(&mut self, p: usize, n: u64, r: Req) {
        if self.engines[p].queued(|| (n, r.clone())) {
            return;
        }
        if let Some(c) = self.serve(p, n, r) {
            self.engines[p].start(c);
        }
    }

    /// One turn of peer `p`'s engine: a piece (which fails now and then), and when that
    /// ends the copy, the requests that waited behind it.
    fn turn(&mut self, p: usize, sent: &[Vec<Req>]) {
        let Some(piece) = self.engines[p].piece(QUANTUM) else {
            return;
        };
        assert!(
            piece.len <= QUANTUM && piece.len > 0,
            "piece of {} bytes",
            piece.len
        );
        let n = self.head[p];
        let (at, off, len) = (piece.at as usize, piece.addr as usize, piece.len as usize);
        let end = if self.rng.chance(0.05) {
            self.engines[p].failed().map(|c| (c, None))
        } else {
            match &sent[p][n as usize] {
                Req::BigPut { data, .. } => {
                    assert!(piece.put);
                    self.mem[at..at + len].copy_from_slice(&data[off..off + len]);
                }
                Req::BigGet { .. } => {
                    assert!(!piece.put);
                    self.got[p][off..off + len].copy_from_slice(&self.mem[at..at + len]);
                }
                other => panic!("a copy for {other:?}"),
            }
            let seen = |c: BulkCopy, got: &mut Vec<u8>| {
                (
                    c,
                    Some(if c.put {
                        Vec::new()
                    } else {
                        std::mem::take(got)
                    }),
                )
            };
            let c = self.engines[p].copied(piece.len);
            c.map(|c| seen(c, &mut self.got[p]))
        };
        let Some((c, seen)) = end else {
            return;
        };
        assert_eq!(c.req, n, "the copy that ended is the head's");
        self.answers.push((p, n, seen));
        while let Some((n, r)) = self.engines[p].next_waiting() {
            if let Some(c) = self.serve(p, n, r) {
                self.engines[p].start(c);
                break;
            }
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
    match rng.below(10) {
        0..=3 => {
            let (at, len) = at_len(rng, 256);
            Req::Put {
                at,
                data: data(rng, len),
            }
        }
        4..=5 => {
            let (at, len) = at_len(rng, 3 * QUANTUM);
            Req::BigPut {
                at,
                data: data(rng, len),
            }
        }
        6..=7 => {
            let (at, len) = at_len(rng, 3 * QUANTUM);
            Req::BigGet { at, len }
        }
        _ => {
            let (at, len) = at_len(rng, 4096);
            Req::Notify { at, len }
        }
    }
}

/// Checks the answers against each initiator's window applied in order; `None` answers
/// are failed copies (a failed put may have written some pieces: the model then takes
/// the target's bytes of its range, which only a later request of that peer changes).
fn check(seed: u64, sent: &[Vec<Req>], answers: &[Answer], mem: &[u8]) {
    for (p, reqs) in sent.iter().enumerate() {
        let mine: Vec<&Answer> = answers.iter().filter(|a| a.0 == p).collect();
        let order: Vec<u64> = mine.iter().map(|a| a.1).collect();
        let want: Vec<u64> = (0..reqs.len() as u64).collect();
        assert_eq!(
            order, want,
            "seed {seed}: peer {p}: requests answered out of order"
        );
        let mut model = vec![0u8; WINDOW as usize];
        let window = &mem[base(p) as usize..(base(p) + WINDOW) as usize];
        // A failed put's range: unknown until the end, where the target's bytes are
        // taken for it when no later put of this peer covers it (else skipped).
        let mut unknown: Vec<(usize, usize)> = Vec::new();
        for (a, r) in mine.iter().zip(reqs) {
            let seen = &a.2;
            let overlaps_unknown =
                |at: usize, len: usize| unknown.iter().any(|&(u, ul)| at < u + ul && u < at + len);
            match (r, seen) {
                (Req::Put { at, data } | Req::BigPut { at, data }, Some(_)) => {
                    let at = *at as usize;
                    model[at..at + data.len()].copy_from_slice(data);
                    unknown.retain(|&(u, ul)| !(at <= u && u + ul <= at + data.len()));
                }
                (Req::BigPut { at, data }, None) => unknown.push((*at as usize, data.len())),
                (Req::BigGet { at, len } | Req::Notify { at, len }, Some(v)) => {
                    let (at, len) = (*at as usize, *len as usize);
                    if !overlaps_unknown(at, len) {
                        assert!(
                            v[..] == model[at..at + len],
                            "seed {seed}: peer {p}: {r:?} saw bytes other than those sent before it"
                        );
                    }
                }
                (Req::BigGet { .. }, None) => {}
                (r, None) => panic!("seed {seed}: {r:?} failed: only copies fail"),
            }
        }
        // Compared outside the failed puts' ranges (taken from the target).
        for &(u, ul) in &unknown {
            model[u..u + ul].copy_from_slice(&window[u..u + ul]);
        }
        assert!(
            model == window,
            "seed {seed}: peer {p}: window bytes at the end"
        );
    }
}

fn run(seed: u64) {
    let mut rng = Rng::new(seed);
    let sent: Vec<Vec<Req>> = (0..PEERS)
        .map(|_| {
            (0..10 + rng.below(40))
                .map(|_| random_req(&mut rng))
                .collect()
        })
        .collect();
    let mut t = Target {
        mem: vec![0; PEERS * WINDOW as usize],
        engines: (0..PEERS).map(|_| Engine::default()).collect(),
        head: vec![0; PEERS],
        got: vec![Vec::new(); PEERS],
        answers: Vec::new(),
        rng: Rng::new(seed ^ 0x9e37),
    };
    let mut next: Vec<VecDeque<(u64, Req)>> = sent
        .iter()
        .map(|v| {
            v.iter()
                .cloned()
                .enumerate()
                .map(|(n, r)| (n as u64, r))
                .collect()
        })
        .collect();
    // Arrivals and engine turns interleaved at random; then the engines run dry.
    while next.iter().any(|q| !q.is_empty()) {
        let p = rng.below(PEERS as u64) as usize;
        if rng.chance(0.6) {
            if let Some((n, r)) = next[p].pop_front() {
                t.arrive(p, n, r);
            }
        } else {
            // A progress pass: one turn for every peer with a copy.
            for q in 0..PEERS {
                t.turn(q, &sent);
            }
        }
    }
    for _ in 0..100_000 {
        if t.engines.iter().all(|e| e.is_empty()) {
            break;
        }
        for q in 0..PEERS {
            t.turn(q, &sent);
        }
    }
    assert!(
        t.engines.iter().all(|e| e.is_empty()),
        "seed {seed}: engines never ran dry"
    );
    check(seed, &sent, &t.answers, &t.mem);
}

#[test]
fn requests_take_effect_in_the_order_each_initiator_sent_them() {
    for seed in 0..200 {
        run(seed);
    }
}
