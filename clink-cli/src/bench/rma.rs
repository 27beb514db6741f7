//! `clink bench --rma`: the aperture experiments of CLAN section 5, each beside a baseline
//! measured by the same code in the same run, on this host (shared memory).
//!
//! Two endpoints in one process, one thread each, pinned to CPUs 0 and 1 (unless
//! `--no-pin`), connected over shared memory exactly as two processes would be (rings in
//! a memory file, apertures mapped through a passed descriptor, CMA for the copy engine).
//! Rows (`--json`: one object per line) carry an `experiment` field:
//!
//! - `word_rtt`: one-way latency (half the mean round trip of each batch of 16; the
//!   median over batches) of one 8-byte word, variants
//!   `tagged` (baseline: 8-byte tagged messages), `mapped_spin` (a store into the peer's
//!   mapped window, the peer spinning on its own memory), `put_tripwire` (a put, the peer
//!   waiting for the tripwire event in its event queue), `put_progress` (a put, the peer
//!   making progress passes until the word changes: no tripwire, no event; with
//!   `put_tripwire` it splits the put's cost from the event's);
//! - `dqueue_rate`: distributed-queue elements per second (millions) for 8, 64 and 256
//!   bytes, variant `mapped`; baseline `tagged`: a stream of tagged messages of that size;
//! - `put_bw`: bandwidth (GB/s) of puts by size, variants `mapped_store` (memcpy into the
//!   peer's mapped window), `put` (inline frames, or the target's copy engine with one
//!   CMA copy above the inline size), baseline `tagged` (a stream of messages);
//! - `event_server`: an event-driven server with 1 to 1000 client connections against an
//!   epoll server over kernel TCP ([`super::evserver`]).

use super::affinity::{spawn_thread, CLIENT_CPU, SERVER_CPU};
use super::stats;
use clink::events::{self, Event};
use clink::patterns::dqueue::{QueueReceiver, QueueSender};
use clink::rma::{Cookie, TripOptions, COOKIE_LEN, READ, WRITE};
use clink::{Config, Context, Endpoint, PeerId, Selector};
use serde_json::json;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(30));
const TAG_SETUP: u64 = 0x7000;
const TAG_MSG: u64 = 0x7001;

/// One measured figure.
struct RmaRow {
    experiment: &'static str,
    variant: &'static str,
    metric: &'static str,
    size: usize,
    median: f64,
    min: f64,
    max: f64,
    iterations: u64,
    reps: u64,
}

impl RmaRow {
    fn json(&self, pinned: bool, round: u64) -> String {
        json!({
            "system": "clink",
            "transport": "shm",
            "mode": "busy",
            "experiment": self.experiment,
            "variant": self.variant,
            "metric": self.metric,
            "size": self.size,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "iterations": self.iterations,
            "reps": self.reps,
            "pinned": pinned,
            "round": round,
            "placement": "host",
        })
        .to_string()
    }
}

/// Median, minimum and maximum of `v` (not empty).
fn summary(v: &[f64]) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (stats::median(v).unwrap_or(f64::NAN), min, max)
}

/// The configuration of the aperture benchmarks' endpoints: no calibration, busy-poll,
/// and no network transports (both sides are on one host: a UDP socket or a TCP listener
/// per endpoint would only add descriptors and epoll entries).
pub(super) fn same_host_config() -> Config {
    Config {
        calibrate: false,
        spin: None,
        udp: None,
        tcp: None,
        ..Config::default()
    }
}

/// Runs `a` and `b` on two threads (pinned to CPUs 0 and 1) with connected endpoints.
fn pair<R: Send + 'static>(
    pin: bool,
    a: impl FnOnce(&mut Endpoint, PeerId) -> R + Send + 'static,
    b: impl FnOnce(&mut Endpoint, PeerId) + Send + 'static,
) -> Result<R, String> {
    let cfg = same_host_config;
    let ctx_a = Context::with_config(cfg()).map_err(|e| e.to_string())?;
    let mut ep_a = ctx_a.endpoint().map_err(|e| e.to_string())?;
    let addr = ep_a.address();
    let (tx, rx) = mpsc::channel();
    let tb = spawn_thread("rma-b", pin.then_some(CLIENT_CPU), move || {
        let ctx_b = Context::with_config(cfg()).expect("context");
        let mut ep_b = ctx_b.endpoint().expect("endpoint");
        let p = ep_b.connect(&addr).expect("connect");
        tx.send(()).ok();
        b(&mut ep_b, p);
    });
    let ta = spawn_thread("rma-a", pin.then_some(SERVER_CPU), move || {
        let p = ep_a.accept(T).expect("accept");
        rx.recv_timeout(Duration::from_secs(30))
            .expect("peer ready");
        let r = a(&mut ep_a, p);
        drop(ctx_a);
        r
    });
    let r = ta.join().map_err(|_| "bench side A panicked".to_string())?;
    tb.join().map_err(|_| "bench side B panicked".to_string())?;
    Ok(r)
}

fn swap(ep: &mut Endpoint, peer: PeerId, mine: &Cookie) -> clink::rma::Remote {
    ep.send(peer, TAG_SETUP, &mine.to_bytes())
        .expect("send cookie");
    let mut b = [0u8; COOKIE_LEN];
    ep.recv_timeout(Selector::exact(Some(peer), TAG_SETUP), &mut b, T)
        .expect("recv cookie");
    ep.import(peer, Cookie::from_bytes(&b).expect("cookie"))
        .expect("import")
}

/// Round trips timed together per sample: one round trip is 150-700 ns here and the clock
/// reads in steps of about 10 ns, which quantized a per-round-trip median to 5 ns steps of
/// the one-way figure (enough to move a ratio of two such medians by 0.1).
const RTT_BATCH: usize = 16;

/// One-way latencies in microseconds: half the mean round trip of each batch of
/// [`RTT_BATCH`] (the `iters` round trips give `iters / RTT_BATCH` samples).
fn one_way_us(iters: usize, mut one: impl FnMut()) -> Vec<f64> {
    (0..iters / RTT_BATCH)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..RTT_BATCH {
                one();
            }
            t.elapsed().as_nanos() as f64 / (2 * RTT_BATCH) as f64 / 1000.0
        })
        .collect()
}

/// One word bounced `n` times between two pinned endpoints: each side runs `setup`, then
/// the initiator sends value `v` (`send`) and waits for it to come back (`wait`) while the
/// responder waits for it and sends it back. Returns the initiator's one-way latencies.
fn bounce<S: 'static>(
    pin: bool,
    n: usize,
    setup: impl Fn(&mut Endpoint, PeerId) -> S + Copy + Send + 'static,
    send: impl Fn(&mut Endpoint, &S, u64) + Copy + Send + 'static,
    wait: impl Fn(&mut Endpoint, &S, u64) + Copy + Send + 'static,
) -> Result<Vec<f64>, String> {
    pair(
        pin,
        move |ep, p| {
            let s = setup(ep, p);
            let mut v = 0u64;
            one_way_us(n, || {
                v += 1;
                send(ep, &s, v);
                wait(ep, &s, v);
            })
        },
        move |ep, p| {
            let s = setup(ep, p);
            for v in 1..=n as u64 {
                wait(ep, &s, v);
                send(ep, &s, v);
            }
            // Puts sent unacknowledged are applied before the pair closes.
            ep.flush_rma(None).unwrap();
        },
    )
}

fn word_rtt(pin: bool, iters: usize) -> Result<Vec<RmaRow>, String> {
    let row = |variant, s: Vec<f64>| {
        let (m, lo, hi) = summary(&s);
        RmaRow {
            experiment: "word_rtt",
            variant,
            metric: "latency_us",
            size: 8,
            median: m,
            min: lo,
            max: hi,
            iterations: (s.len() * RTT_BATCH) as u64, // round trips
            reps: 1,
        }
    };
    // Whole batches: the responder answers exactly `n` round trips.
    let n = iters - iters % RTT_BATCH;
    let mut rows = Vec::new();
    // Baseline: 8-byte tagged messages.
    let s = bounce(
        pin,
        n,
        |_, p| p,
        |ep, &p, v| ep.send(p, TAG_MSG, &v.to_le_bytes()).unwrap(),
        |ep, &p, _| {
            let mut b = [0u8; 8];
            ep.recv(Selector::exact(Some(p), TAG_MSG), &mut b).unwrap();
        },
    )?;
    rows.push(row("tagged", s));
    // Mapped stores, spinning on local memory.
    let s = bounce(
        pin,
        n,
        |ep, p| {
            let ap = ep.aperture_alloc(4096).unwrap();
            let c = ep.export(ap, 0, 64, READ | WRITE).unwrap();
            let r = swap(ep, p, &c);
            let far = ep.map(&r).unwrap();
            (ep.aperture_window(ap).unwrap(), far)
        },
        |_, (_, far), v| far.store_u64(0, v).unwrap(),
        |_, (near, _), v| {
            while near.load_u64(0).unwrap() != v {
                std::hint::spin_loop();
            }
        },
    )?;
    rows.push(row("mapped_spin", s));
    // A put, the peer waiting for its tripwire event.
    let s = bounce(
        pin,
        n,
        |ep, p| {
            ep.set_interest(events::TRIPWIRES);
            let ap = ep.aperture_alloc(4096).unwrap();
            ep.tripwire(ap, 0, 8, TripOptions::default()).unwrap();
            let c = ep.export(ap, 0, 64, READ | WRITE).unwrap();
            swap(ep, p, &c)
        },
        |ep, r, v| ep.put_nowait(r, 0, &v.to_le_bytes()).unwrap(),
        |ep, _, _| while !matches!(ep.wait_event(T).unwrap(), Event::Tripwire { .. }) {},
    )?;
    rows.push(row("put_tripwire", s));
    // A put, the peer making progress until its word changes (no tripwire, no event).
    let s = bounce(
        pin,
        n,
        |ep, p| {
            let ap = ep.aperture_alloc(4096).unwrap();
            let c = ep.export(ap, 0, 64, READ | WRITE).unwrap();
            let r = swap(ep, p, &c);
            (ep.aperture_window(ap).unwrap(), r)
        },
        |ep, (_, r), v| ep.put_nowait(r, 0, &v.to_le_bytes()).unwrap(),
        |ep, (near, _), v| {
            while near.load_u64(0).unwrap() != v {
                ep.progress();
            }
        },
    )?;
    rows.push(row("put_progress", s));
    Ok(rows)
}

/// Distributed queue vs a stream of tagged messages: millions of elements per second.
fn dqueue_rate(pin: bool, count: u64, reps: usize) -> Result<Vec<RmaRow>, String> {
    let mut rows = Vec::new();
    for &size in &[8usize, 64, 256] {
        for variant in ["tagged", "mapped"] {
            let mut rates = Vec::new();
            for _ in 0..reps {
                let secs = pair(
                    pin,
                    move |ep, p| {
                        let mut buf = vec![0u8; size];
                        // Both variants start the clock at the first element (the sender
                        // may have filled part of the ring or queue before) and rescale.
                        let rescale = count as f64 / (count - 1) as f64;
                        if variant == "tagged" {
                            let sel = Selector::exact(Some(p), TAG_MSG);
                            ep.recv(sel, &mut buf).unwrap();
                            let t = Instant::now();
                            for _ in 1..count {
                                ep.recv(sel, &mut buf).unwrap();
                            }
                            return t.elapsed().as_secs_f64() * rescale;
                        }
                        let mut q = QueueReceiver::connect(ep, p, TAG_SETUP, size, 256, T).unwrap();
                        q.pop(ep, &mut buf, T).unwrap(); // the first element starts the clock
                        let t = Instant::now();
                        for _ in 1..count {
                            q.pop(ep, &mut buf, T).unwrap();
                        }
                        t.elapsed().as_secs_f64() * rescale
                    },
                    move |ep, p| {
                        let buf = vec![7u8; size];
                        if variant == "tagged" {
                            for _ in 0..count {
                                ep.send(p, TAG_MSG, &buf).unwrap();
                            }
                            return;
                        }
                        let mut q = QueueSender::connect(ep, p, TAG_SETUP, size, 256, T).unwrap();
                        for _ in 0..count {
                            q.push(ep, &buf, T).unwrap();
                        }
                    },
                )?;
                rates.push(count as f64 / secs / 1e6);
            }
            let (m, lo, hi) = summary(&rates);
            rows.push(RmaRow {
                experiment: "dqueue_rate",
                variant,
                metric: "rate_mps",
                size,
                median: m,
                min: lo,
                max: hi,
                iterations: count,
                reps: reps as u64,
            });
        }
    }
    Ok(rows)
}

/// Put bandwidth by size: mapped stores and puts, against streamed tagged messages.
fn put_bw(pin: bool, total: usize, reps: usize) -> Result<Vec<RmaRow>, String> {
    let mut rows = Vec::new();
    for &size in &[4096usize, 65536, 1 << 20, 4 << 20] {
        let count = (total / size).max(8);
        for variant in ["tagged", "mapped_store", "put"] {
            let mut bw = Vec::new();
            for _ in 0..reps {
                let secs = pair(
                    pin,
                    move |ep, p| {
                        let data = vec![3u8; size];
                        if variant == "tagged" {
                            let msgs = vec![&data[..]; count];
                            let t = Instant::now();
                            ep.send_batch(p, TAG_MSG, &msgs).unwrap();
                            let mut ack = [0u8; 1];
                            ep.recv(Selector::exact(Some(p), TAG_MSG + 1), &mut ack)
                                .unwrap();
                            return t.elapsed().as_secs_f64();
                        }
                        let mut b = [0u8; COOKIE_LEN];
                        ep.recv_timeout(Selector::exact(Some(p), TAG_SETUP), &mut b, T)
                            .unwrap();
                        let r = ep.import(p, Cookie::from_bytes(&b).unwrap()).unwrap();
                        let win = (variant == "mapped_store").then(|| ep.map(&r).unwrap());
                        let t = Instant::now();
                        for _ in 0..count {
                            match &win {
                                Some(w) => w.write(0, &data).unwrap(),
                                None => ep.put(&r, 0, &data).unwrap(),
                            }
                        }
                        let s = t.elapsed().as_secs_f64();
                        ep.send(p, TAG_MSG + 2, b"done").unwrap();
                        s
                    },
                    move |ep, p| {
                        if variant == "tagged" {
                            let mut buf = vec![0u8; size];
                            for _ in 0..count {
                                ep.recv(Selector::exact(Some(p), TAG_MSG), &mut buf)
                                    .unwrap();
                            }
                            ep.send(p, TAG_MSG + 1, b"k").unwrap();
                            return;
                        }
                        let ap = ep.aperture_alloc(size).unwrap();
                        let c = ep.export(ap, 0, size as u64, WRITE).unwrap();
                        ep.send(p, TAG_SETUP, &c.to_bytes()).unwrap();
                        let mut b = [0u8; 8];
                        ep.recv(Selector::exact(Some(p), TAG_MSG + 2), &mut b)
                            .unwrap();
                    },
                )?;
                bw.push((count * size) as f64 / secs / 1e9);
            }
            let (m, lo, hi) = summary(&bw);
            rows.push(RmaRow {
                experiment: "put_bw",
                variant,
                metric: "bandwidth_gbs",
                size,
                median: m,
                min: lo,
                max: hi,
                iterations: count as u64,
                reps: reps as u64,
            });
        }
    }
    Ok(rows)
}

/// The experiments, in the order they run.
pub const EXPERIMENTS: [&str; 4] = ["word_rtt", "dqueue_rate", "put_bw", "event_server"];

/// Runs the experiments named in `only` (all when empty) `rounds` times and prints rows
/// (JSON) or a table.
pub fn run(
    quick: bool,
    json: bool,
    pin: bool,
    rounds: u64,
    only: &[String],
    conns: &[usize],
) -> Result<(), String> {
    let want = |e: &str| only.is_empty() || only.iter().any(|o| o == e);
    eprintln!(
        "clink bench --rma: two endpoints over shared memory, one thread each{}",
        if pin {
            ", pinned to CPUs 0 and 1"
        } else {
            ", not pinned"
        }
    );
    let (iters, count, total, reps) = if quick {
        (2_000, 200_000, 64 << 20, 3)
    } else {
        (20_000, 2_000_000, 512 << 20, 5)
    };
    let server_iters = if quick { 5_000 } else { 50_000 };
    for round in 0..rounds {
        // Each experiment's rows are printed as soon as it is over.
        let print = |rows: Vec<RmaRow>| {
            for r in &rows {
                if json {
                    println!("{}", r.json(pin, round));
                } else {
                    println!(
                        "{:<12} {:<13} {:>8} B  {:<14} median {:>10.3}  (min {:.3}, max {:.3})",
                        r.experiment, r.variant, r.size, r.metric, r.median, r.min, r.max
                    );
                }
            }
        };
        if want("word_rtt") {
            print(word_rtt(pin, iters)?);
        }
        if want("dqueue_rate") {
            print(dqueue_rate(pin, count, reps)?);
        }
        if want("put_bw") {
            print(put_bw(pin, total, reps)?);
        }
        if want("event_server") {
            for r in super::evserver::run(pin, conns, server_iters)? {
                if json {
                    println!("{}", r.json(pin, round));
                } else {
                    let p99 = r.p99.map_or(String::new(), |p| format!("  p99 {p:.3}"));
                    println!(
                        "event_server {:<12} {:<9} {:>5} conns  median {:>10.3}{p99}  ({})",
                        r.system,
                        r.variant,
                        r.endpoints,
                        r.median,
                        if r.variant == "rate" { "M req/s" } else { "us" }
                    );
                }
            }
        }
    }
    Ok(())
}
