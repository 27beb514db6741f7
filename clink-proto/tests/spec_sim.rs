//! Speculative defragmentation end to end, without I/O: a bulk transfer between two
//! [`Conn`]s over a seeded lossy network, the receiver arming layouts with
//! [`Placement::plan`], a model of the kernel's scatter receive writing each (coalesced)
//! read into them, and [`spec::check`] sorting hits from misses.
//!
//! Checked on every read: speculation never overwrites a fragment already placed; at the
//! end the destination equals the source, whatever was lost, duplicated, corrupted,
//! reordered or injected, and whether or not the sender misorders its groups on purpose
//! ([`Config::bulk_misorder`], the fallback experiment's sender that makes every
//! fragment miss).

use clink_proto::netsim::Rng;
use clink_proto::reliable::packet::{BULK_HEADER, DATA_HEADER, TRAILER};
use clink_proto::reliable::{Config, Conn, Event};
use clink_proto::spec::{self, Check, Displaced, Layout, Mark, Placement, Segment};

/// Payload bytes of a bulk fragment (the connection's `mtu_payload` is set to match).
const FRAG: usize = 1000;
const GROUP: u64 = 16;
const ENTRIES: usize = 4;
const SPILL: usize = 65536;

struct Faults {
    loss: f64,
    dup: f64,
    corrupt: f64,
    reorder: f64,
    /// Foreign datagrams (another connection's) injected per read.
    noise: f64,
}

#[derive(Default, Debug)]
struct Counts {
    hits: u64,
    misses: u64,
    /// Misses moved in place (intact fragments of the transfer in another's place).
    moved: u64,
    reads: u64,
}

/// One GSO "virtual frame": equal-sized datagrams, the last possibly shorter.
type Frame = Vec<Vec<u8>>;

/// The kernel's scatter: writes `frame` (its datagrams end to end) into the layout's
/// vectors: header slots, destination payload slots, spill.
fn scatter(
    frame: &[u8],
    plan: &[u64],
    pl: &Placement,
    hdrs: &mut [[u8; BULK_HEADER]],
    dest: &mut [u8],
    spill: &mut [u8],
) {
    let mut at = 0;
    for (k, &i) in plan.iter().enumerate() {
        let (off, len) = pl.fragment(i);
        for piece in [
            &mut hdrs[k][..],
            &mut dest[off as usize..off as usize + len],
        ] {
            let n = piece.len().min(frame.len() - at);
            piece[..n].copy_from_slice(&frame[at..at + n]);
            at += n;
        }
    }
    let n = (frame.len() - at).min(spill.len());
    spill[..n].copy_from_slice(&frame[at..at + n]);
}

/// Bytes `start..start+len` of the layout's logical stream.
fn gather(
    start: usize,
    len: usize,
    plan: &[u64],
    pl: &Placement,
    hdrs: &[[u8; BULK_HEADER]],
    dest: &[u8],
    spill: &[u8],
) -> Vec<u8> {
    let mut pieces: Vec<&[u8]> = Vec::new();
    for (k, &i) in plan.iter().enumerate() {
        let (off, l) = pl.fragment(i);
        pieces.push(&hdrs[k]);
        pieces.push(&dest[off as usize..off as usize + l]);
    }
    pieces.push(spill);
    pieces.concat()[start..start + len].to_vec()
}

fn run(seed: u64, total: usize, cap: usize, f: &Faults) -> Counts {
    run_with(seed, total, cap, f, false)
}

fn run_with(seed: u64, total: usize, cap: usize, f: &Faults, misorder: bool) -> Counts {
    let mut rng = Rng::new(seed);
    let src: Vec<u8> = (0..total).map(|_| rng.next_u64() as u8).collect();
    let cfg = Config {
        mtu_payload: FRAG + BULK_HEADER - DATA_HEADER - TRAILER,
        bulk_group: GROUP,
        recv_window: 4096,
        max_cwnd: 256,
        ack_every: 8,
        bulk_misorder: misorder,
        ..Config::default()
    };
    let mut a = Conn::new(cfg.clone(), 0);
    let mut b = Conn::new(cfg, 0);
    a.send_bulk(42, total as u64).unwrap();
    let mut pl = Placement::new(42, total as u64, cap as u64, FRAG);
    let mut dest = vec![0u8; cap];
    let mut spill = vec![0u8; SPILL];
    let mut hdrs = vec![[0u8; BULK_HEADER]; GROUP as usize];
    let mut c = Counts::default();
    let mut held: Vec<Frame> = Vec::new();
    let mut now = 0u64;
    let mut sent_done = false;
    let mut buf = Vec::new();
    let mut plans = Vec::new();
    let mut segs = Vec::new();
    let (mut moves, mut scratch) = (Vec::new(), Vec::new());
    for _round in 0..200_000 {
        now += 20_000;
        // Sender: datagrams grouped as a GSO batcher groups them.
        let mut frames: Vec<Frame> = Vec::new();
        loop {
            buf.clear();
            let Some(t) = a.poll_transmit_with(now, &mut buf, &mut |_, off, n| {
                // The transport forgets a source at BulkSent: nothing may be read after.
                assert!(!sent_done, "fragment at {off} sent after BulkSent");
                Some(&src[off as usize..off as usize + n])
            }) else {
                break;
            };
            let d = [&buf[..], t.payload].concat();
            let joins = frames.last().is_some_and(|fr: &Frame| {
                !t.group_start
                    && fr.len() < GROUP as usize
                    && fr[0].len() == d.len()
                    && fr.last().unwrap().len() == d.len()
            });
            if joins {
                frames.last_mut().unwrap().push(d);
            } else {
                frames.push(vec![d]);
            }
        }
        // The network: loss, duplication, corruption, reordering, foreign noise.
        let mut arriving: Vec<Frame> = std::mem::take(&mut held);
        for mut fr in frames {
            if rng.chance(f.loss) {
                continue;
            }
            if rng.chance(f.corrupt) {
                let d = rng.below(fr.len() as u64) as usize;
                let at = rng.below(fr[d].len() as u64) as usize;
                fr[d][at] ^= 1 + rng.below(255) as u8;
            }
            if rng.chance(f.dup) {
                arriving.push(fr.clone());
            }
            if rng.chance(f.reorder) {
                held.push(fr);
            } else {
                arriving.push(fr);
            }
        }
        if rng.chance(f.noise) {
            let mut junk = vec![0u8; BULK_HEADER + FRAG];
            for x in junk.iter_mut() {
                *x = rng.next_u64() as u8;
            }
            arriving.insert(rng.below(arriving.len() as u64 + 1) as usize, vec![junk]);
        }
        // The receiver reads up to ENTRIES frames per call, each into an armed entry.
        for batch in arriving.chunks(ENTRIES) {
            pl.plan(GROUP, ENTRIES, &mut plans);
            let before: Vec<u8> = dest.clone();
            let placed_before: Vec<bool> = (0..pl.fragments()).map(|i| pl.is_placed(i)).collect();
            let mut gathered: Vec<Vec<u8>> = Vec::new();
            // Intact fragments in another's place: moved in place after the read.
            let mut displaced: Vec<(Displaced, clink_proto::reliable::BulkHeader)> = Vec::new();
            for (e, fr) in batch.iter().enumerate() {
                c.reads += 1;
                let plan = plans.get(e).cloned().unwrap_or_default();
                let bytes = fr.concat();
                scatter(&bytes, &plan, &pl, &mut hdrs, &mut dest, &mut spill);
                let layout = Layout {
                    payloads: plan.iter().map(|&i| pl.fragment(i).1).collect(),
                    spill: SPILL,
                };
                layout.segments(bytes.len(), Some(fr[0].len()), &mut segs);
                for s in &segs {
                    match *s {
                        Segment::Candidate { start, slot, len } => {
                            let (off, _) = pl.fragment(plan[slot]);
                            let payload = &dest[off as usize..off as usize + len];
                            match spec::check(
                                &pl.expect(b.bulk_context()),
                                off,
                                &hdrs[slot],
                                payload,
                            ) {
                                Check::Hit(h) => {
                                    c.hits += 1;
                                    if b.accept_placed(now, &h, BULK_HEADER + len).unwrap() {
                                        assert_eq!(pl.mark(&h, len), Mark::New);
                                    }
                                }
                                Check::Displaced(h)
                                    if displaced.iter().all(|(d, _)| d.to != h.offset) =>
                                {
                                    c.misses += 1;
                                    let d = Displaced {
                                        from: off,
                                        to: h.offset,
                                        len,
                                    };
                                    displaced.push((d, h));
                                }
                                Check::Displaced(_) | Check::Miss => {
                                    c.misses += 1;
                                    gathered.push(gather(
                                        start,
                                        BULK_HEADER + len,
                                        &plan,
                                        &pl,
                                        &hdrs,
                                        &dest,
                                        &spill,
                                    ));
                                }
                            }
                        }
                        Segment::Gather { start, len } => {
                            c.misses += 1;
                            gathered.push(gather(start, len, &plan, &pl, &hdrs, &dest, &spill));
                        }
                    }
                }
            }
            // Invariant: no fragment placed before this read was touched by it.
            for (i, &was) in placed_before.iter().enumerate() {
                let (off, len) = pl.fragment(i as u64);
                let end = (off as usize + len).min(cap);
                if was && (off as usize) < cap {
                    assert!(
                        dest[off as usize..end] == before[off as usize..end],
                        "speculation overwrote placed fragment {i}"
                    );
                }
            }
            // Cleanup: displaced fragments move to their places (each copied once), then
            // the other misses take the ordinary path.
            let list: Vec<Displaced> = displaced.iter().map(|(d, _)| *d).collect();
            spec::plan_moves(&list, &mut moves);
            spec::apply_moves(&moves, &mut dest, &mut scratch);
            for (d, h) in &displaced {
                c.moved += 1;
                if b.accept_placed(now, h, BULK_HEADER + d.len).unwrap() {
                    pl.mark(h, d.len);
                }
            }
            for d in gathered {
                let _ = b.handle_datagram_with(now, &d, &mut |h, p| {
                    if pl.mark(h, p.len()) == Mark::New {
                        let off = h.offset as usize;
                        if off < cap {
                            let n = p.len().min(cap - off);
                            dest[off..off + n].copy_from_slice(&p[..n]);
                        }
                    }
                    true
                });
            }
        }
        // Acks back (lossless: the forward path carries the faults).
        buf.clear();
        while let Some(n) = b.poll_transmit(now, &mut buf) {
            let d = buf[buf.len() - n..].to_vec();
            let _ = a.handle_datagram(now, &d);
        }
        buf.clear();
        if let Some(t) = a.poll_timeout() {
            if t <= now {
                a.handle_timeout(now);
            }
        }
        if let Some(t) = b.poll_timeout() {
            if t <= now {
                b.handle_timeout(now);
            }
        }
        while let Some(ev) = a.poll_event() {
            assert_eq!(ev, Event::BulkSent(42));
            sent_done = true;
        }
        if sent_done && pl.complete() {
            assert!(
                dest[..] == src[..cap],
                "destination differs from the source"
            );
            return c;
        }
    }
    panic!(
        "transfer did not finish: {} of {} fragments, a={:?} b={:?}",
        (0..pl.fragments()).filter(|&i| pl.is_placed(i)).count(),
        pl.fragments(),
        a.stats(),
        b.stats()
    );
}

const CLEAN: Faults = Faults {
    loss: 0.0,
    dup: 0.0,
    corrupt: 0.0,
    reorder: 0.0,
    noise: 0.0,
};

#[test]
fn clean_stream_hits_everything() {
    let c = run(1, 2_000_000 + 123, 2_000_000 + 123, &CLEAN);
    println!("clean: {c:?}");
    let rate = c.hits as f64 / (c.hits + c.misses) as f64;
    assert!(rate >= 0.99, "hit rate {rate:.4} on a clean stream ({c:?})");
}

#[test]
fn every_fault_at_once_loses_nothing() {
    for seed in 0..6 {
        let f = Faults {
            loss: 0.05,
            dup: 0.05,
            corrupt: 0.05,
            reorder: 0.1,
            noise: 0.3,
        };
        let c = run(
            seed,
            700_000 + seed as usize * 777,
            700_000 + seed as usize * 777,
            &f,
        );
        println!("seed {seed}: {c:?}");
        assert!(c.hits > 0);
    }
}

#[test]
fn truncated_destination_gets_the_head_only() {
    let f = Faults {
        loss: 0.02,
        dup: 0.02,
        corrupt: 0.02,
        reorder: 0.05,
        noise: 0.1,
    };
    run(9, 300_000, 123_456, &f);
}

#[test]
fn a_misordering_sender_misses_everything_and_loses_nothing() {
    // Clean: every fragment misses (the data still arrives intact: `run` checks it).
    let total = 2_000_000 + 123;
    let c = run_with(3, total, total, &CLEAN, true);
    println!("misordered, clean: {c:?}");
    let frags = total.div_ceil(FRAG) as u64;
    // 2001 fragments in groups of 16: the last one is alone in its group and hits.
    assert_eq!(frags % GROUP, 1);
    assert!(c.hits <= 1, "only the lone last fragment may hit: {c:?}");
    assert!(
        c.misses + 1 >= frags,
        "every other fragment must miss: {c:?}"
    );
    assert_eq!(
        c.moved, c.misses,
        "intact fragments in each other's places are all moved in place: {c:?}"
    );
    // With faults: still exactly the source.
    for seed in 0..4 {
        let f = Faults {
            loss: 0.05,
            dup: 0.05,
            corrupt: 0.05,
            reorder: 0.1,
            noise: 0.3,
        };
        let c = run_with(seed, 500_000 + seed as usize * 999, 500_000, &f, true);
        println!("misordered, faults, seed {seed}: {c:?}");
    }
}

#[test]
fn a_misordering_sender_keeps_its_source_until_the_last_datagram_is_acked() {
    // The fragment at the highest offset goes out before the end of its group: its ack
    // must not end the transfer while a datagram sent after it may still need resending
    // (seen in CI: the source was forgotten and the retransmission found nothing to send).
    // Short transfers, odd and even last groups, each datagram lost alone now and then.
    let f = Faults { loss: 0.1, ..CLEAN };
    for seed in 0..64u64 {
        let total = 20_000 + seed as usize * 1001;
        run_with(100 + seed, total, total, &f, true);
    }
}
