//! A deterministic mutation fuzzer of the RMA frame parser and the cookie parser (cargo-fuzz
//! needs a nightly toolchain; this runs in the ordinary test suite).
//!
//! It starts from valid encodings of every [`RmaFrame`] kind and of [`Cookie`]s, stacks
//! seeded mutations (bit flips, interesting byte values, `u64` fields set to huge values,
//! kind changes, truncation, extension, insertion and deletion, splicing two inputs), and
//! feeds the result to [`RmaFrame::parse`], [`Frame::parse`] and [`Cookie::from_bytes`].
//! It asserts that parsing never panics and, when it succeeds, that the frame re-encodes
//! to bytes that parse to the same value and re-encode identically (round-trip stability),
//! that a cookie's encoding is canonical, and that the owner's [`check`] of a parsed
//! request against a parsed cookie only admits accesses inside the window.
//!
//! `RMA_FUZZ_SEED` and `RMA_FUZZ_ITERS` override the fixed seed and iteration count.

use clink_proto::netsim::Rng;
use clink_proto::rma::{check, AtomicOp, Cookie, Grant, RmaFrame, Status, Target, READ, WRITE};
use clink_proto::wire::Frame;
use std::panic::{catch_unwind, AssertUnwindSafe};

const SEED: u64 = 0x5eed_f0f4_d4a0;
const ITERS: u64 = 200_000;

const BYTES: [u8; 6] = [0, 0xff, 0x7f, 0x80, 1, 0xfe];
const WORDS: [u64; 10] = [
    0,
    1,
    u64::MAX,
    u64::MAX - 1,
    1 << 63,
    (1 << 63) - 1,
    u32::MAX as u64,
    1 << 32,
    usize::MAX as u64 - 47,
    4096,
];

fn word(rng: &mut Rng) -> u64 {
    if rng.below(2) == 0 {
        WORDS[rng.below(WORDS.len() as u64) as usize]
    } else {
        rng.next_u64()
    }
}

fn target(rng: &mut Rng) -> Target {
    Target {
        export: word(rng) as u32,
        key: u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()),
        offset: word(rng),
    }
}

fn status(rng: &mut Rng) -> Status {
    Status::from_u8(rng.below(9) as u8).expect("0..=8 are statuses")
}

/// A valid encoding of a random frame of kind number `k` (0..11).
fn seed_frame(rng: &mut Rng, k: u64) -> Vec<u8> {
    let data: Vec<u8> = (0..rng.below(80)).map(|_| rng.next_u64() as u8).collect();
    let req = word(rng);
    let f = match k {
        0 => RmaFrame::Put {
            req,
            to: target(rng),
            data: &data,
        },
        1 => RmaFrame::PutCma {
            req,
            to: target(rng),
            len: word(rng),
            addr: word(rng),
        },
        2 => RmaFrame::Get {
            req,
            from: target(rng),
            len: word(rng),
        },
        3 => RmaFrame::GetData {
            req,
            offset: word(rng),
            data: &data,
        },
        4 => RmaFrame::GetCma {
            req,
            from: target(rng),
            len: word(rng),
            addr: word(rng),
        },
        5 => RmaFrame::Atomic {
            req,
            at: target(rng),
            op: if rng.below(2) == 0 {
                AtomicOp::FetchAdd
            } else {
                AtomicOp::CompareSwap
            },
            a: word(rng),
            b: word(rng),
        },
        6 => RmaFrame::AtomicReply {
            req,
            status: status(rng),
            old: word(rng),
        },
        7 => RmaFrame::Notify {
            req,
            at: target(rng),
            len: word(rng),
        },
        8 => RmaFrame::Map {
            req,
            of: target(rng),
        },
        9 => RmaFrame::Ack {
            req,
            status: status(rng),
        },
        _ => RmaFrame::Sync { req },
    };
    let mut out = vec![0u8; f.encoded_len()];
    assert_eq!(f.encode(&mut out), out.len());
    assert_eq!(RmaFrame::parse(&out), Ok(f), "seed frame must parse");
    // Every strict prefix is refused or parses to a frame with a shorter payload.
    for cut in 0..out.len() {
        if let Ok(g) = RmaFrame::parse(&out[..cut]) {
            assert_eq!(g.encoded_len(), cut, "prefix {cut} of {f:?}");
        }
    }
    out
}

fn seed_cookie(rng: &mut Rng) -> Vec<u8> {
    let len = word(rng) >> rng.below(64);
    let c = Cookie {
        owner: u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()),
        export: word(rng) as u32,
        base: rng.next_u64() % (u64::MAX - len).max(1),
        len,
        rights: 1 + rng.below(3) as u8,
        key: u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()),
    };
    let b = c.to_bytes().to_vec();
    assert_eq!(Cookie::from_bytes(&b), Ok(c), "seed cookie must parse");
    b
}

/// Applies one random mutation to `b`; `other` is a second input for splicing.
fn mutate(rng: &mut Rng, b: &mut Vec<u8>, other: &[u8]) {
    let pick = |rng: &mut Rng, n: usize| rng.below(n.max(1) as u64) as usize;
    match rng.below(10) {
        0 | 1 if !b.is_empty() => {
            let i = pick(rng, b.len());
            b[i] ^= 1 << rng.below(8);
        }
        2 if !b.is_empty() => {
            let i = pick(rng, b.len());
            b[i] = BYTES[pick(rng, BYTES.len())];
        }
        3 if b.len() >= 8 => {
            // A u64 field (the frames' fields sit at multiples of 8) set to a huge value.
            let i = 8 * pick(rng, b.len() / 8);
            b[i..i + 8].copy_from_slice(&word(rng).to_le_bytes());
        }
        4 if !b.is_empty() => {
            // Another kind byte, RMA or not (14..=27 brackets the RMA kinds).
            b[0] = if rng.below(4) == 0 {
                rng.next_u64() as u8
            } else {
                14 + rng.below(14) as u8
            };
        }
        5 => {
            let n = pick(rng, b.len() + 1);
            b.truncate(n);
        }
        6 => {
            let max = if rng.below(8) == 0 { 300 } else { 17 };
            let n = rng.below(max);
            b.extend((0..n).map(|_| rng.next_u64() as u8));
        }
        7 => {
            let i = pick(rng, b.len() + 1);
            let n = 1 + rng.below(8) as usize;
            for _ in 0..n {
                b.insert(i, rng.next_u64() as u8);
            }
        }
        8 if !b.is_empty() => {
            let i = pick(rng, b.len());
            let n = (1 + rng.below(8) as usize).min(b.len() - i);
            b.drain(i..i + n);
        }
        _ => {
            // Splice: a prefix of this input, a suffix of the other.
            let cut = pick(rng, b.len() + 1);
            let from = pick(rng, other.len() + 1);
            b.truncate(cut);
            b.extend_from_slice(&other[from..]);
        }
    }
}

#[derive(Default, Debug)]
struct Counts {
    frames_ok: u64,
    frames_err: u64,
    cookies_ok: u64,
    checks_ok: u64,
}

/// Parses `b` every way and checks the invariants; panics (with context) on a violation.
fn exercise(b: &[u8], grants: &[(Cookie, Grant)], c: &mut Counts) {
    match RmaFrame::parse(b) {
        Ok(f) => {
            c.frames_ok += 1;
            let n = f.encoded_len();
            match f {
                // The payload is the rest of the record.
                RmaFrame::Put { .. } | RmaFrame::GetData { .. } => assert_eq!(n, b.len()),
                _ => assert!(
                    n <= b.len(),
                    "{f:?} encodes to {n} bytes > input {}",
                    b.len()
                ),
            }
            let mut e = vec![0u8; n];
            assert_eq!(f.encode(&mut e), n);
            let g = RmaFrame::parse(&e).expect("a re-encoded frame parses");
            assert_eq!(g, f, "round trip changed the frame");
            // The same record seen by the link's frame parser.
            assert_eq!(Frame::parse(b), Ok(Frame::Rma(f)));
            // The owner's check of the request against every grant.
            let (t, len, need) = match f {
                RmaFrame::Put { to, data, .. } => (to, data.len() as u64, WRITE),
                RmaFrame::PutCma { to, len, .. } => (to, len, WRITE),
                RmaFrame::Get { from, len, .. } | RmaFrame::GetCma { from, len, .. } => {
                    (from, len, READ)
                }
                RmaFrame::Atomic { at, .. } => (at, 8, READ | WRITE),
                RmaFrame::Notify { at, len, .. } => (at, len, WRITE),
                RmaFrame::Map { of, .. } => (of, 0, READ),
                _ => return,
            };
            for (cookie, grant) in grants {
                // With the frame's key, and with the cookie's (so some checks pass).
                for key in [t.key, cookie.key] {
                    let r = check(Some(grant), key, t.offset, len, need);
                    if let Ok(at) = r {
                        c.checks_ok += 1;
                        assert_eq!(key, grant.key);
                        assert!(!grant.revoked && grant.rights & need == need);
                        let end = t.offset.checked_add(len).expect("admitted end overflows");
                        assert!(end <= grant.len, "admitted past the window");
                        assert_eq!(at, grant.base + t.offset);
                    }
                }
            }
        }
        Err(_) => {
            c.frames_err += 1;
            // The link's parser refuses it too (or it is not an RMA record at all).
            if let Ok(Frame::Rma(f)) = Frame::parse(b) {
                panic!("Frame::parse accepted {f:?} that RmaFrame::parse refused");
            }
        }
    }
    if let Ok(k) = Cookie::from_bytes(b) {
        c.cookies_ok += 1;
        let e = k.to_bytes();
        assert_eq!(&e[..], b, "a cookie's encoding is canonical");
        assert_eq!(Cookie::from_bytes(&e), Ok(k));
        assert!(k.base.checked_add(k.len).is_some());
        assert!(k.rights != 0 && k.rights & !(READ | WRITE) == 0);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn rma_frames_and_cookies_survive_mutation() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("RMA_FUZZ_SEED").unwrap_or(SEED);
    let iters = env("RMA_FUZZ_ITERS").unwrap_or(ITERS);
    println!("seed = {seed:#x}, {iters} iterations (RMA_FUZZ_SEED / RMA_FUZZ_ITERS)");
    let mut rng = Rng::new(seed);
    // A corpus of valid inputs: every frame kind several times, and cookies.
    let mut corpus: Vec<Vec<u8>> = (0..8)
        .flat_map(|_| (0..11).collect::<Vec<_>>())
        .map(|k| seed_frame(&mut rng, k))
        .collect();
    let mut grants = Vec::new();
    for _ in 0..16 {
        let b = seed_cookie(&mut rng);
        let c = Cookie::from_bytes(&b).expect("seed cookie");
        grants.push((
            c,
            Grant {
                aperture: 0,
                base: c.base,
                len: c.len,
                rights: c.rights,
                key: c.key,
                revoked: rng.below(4) == 0,
            },
        ));
        corpus.push(b);
    }
    let mut counts = Counts::default();
    for it in 0..iters {
        let mut b = corpus[rng.below(corpus.len() as u64) as usize].clone();
        let other = corpus[rng.below(corpus.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut b, &other);
        }
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| exercise(&b, &grants, &mut counts))) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "iteration {it} (seed {seed:#x}): {msg}\ninput ({} bytes): {}",
                b.len(),
                hex(&b)
            );
        }
        // Keep some parsed-and-valid mutants: later mutations start from odd but valid
        // frames (huge fields, foreign payloads).
        if it % 64 == 0 && RmaFrame::parse(&b).is_ok() && corpus.len() < 1024 {
            corpus.push(b);
        }
    }
    println!("{counts:?}, corpus {}", corpus.len());
    // The mutations reach both sides of the parsers.
    assert!(counts.frames_ok > iters / 10, "{counts:?}");
    assert!(counts.frames_err > iters / 10, "{counts:?}");
    assert!(counts.cookies_ok > 0, "{counts:?}");
    assert!(counts.checks_ok > 0, "{counts:?}");
}
