//! The reliable protocol driven through the seeded simulated network.
//!
//! Every test is deterministic: same seed, same run. Figures are printed (run with
//! `--nocapture`), never asserted tightly.

mod common;

use clink_proto::netsim::{NetConfig, Pair, Rng};
use clink_proto::reliable::{Config, Conn, Event, SendError};
use common::{byte_at, content, MS, SEC};

fn pair(cfg: Config, net: NetConfig) -> Pair {
    Pair::new(Conn::new(cfg.clone(), 0), Conn::new(cfg, 0), net)
}

/// What a transfer measured.
#[derive(Debug)]
struct Outcome {
    #[allow(dead_code)] // printed through Debug
    delivered: u64,
    bytes: u64,
    virtual_ns: u64,
}

/// Sends `n` messages a -> b with sizes drawn by `size` from a seeded generator (the
/// receiver redraws the same sizes), keeping at most `window_bytes` queued, and checks
/// every delivery: exactly once, in order, right tag, right length, right bytes.
fn transfer(
    p: &mut Pair,
    n: u64,
    seed: u64,
    window_bytes: usize,
    deadline: u64,
    size: impl Fn(&mut Rng) -> usize,
) -> Outcome {
    let mut srng = Rng::new(seed);
    let mut rrng = Rng::new(seed);
    let (mut sent, mut recv, mut bytes) = (0u64, 0u64, 0u64);
    let mut acked = 0u64;
    let start = p.now;
    let ok = p.run_until(start + deadline, |p| {
        while sent < n && p.a.send_buffered() < window_bytes {
            let len = size(&mut srng);
            p.a.send(sent, &content(sent, len)).expect("send");
            sent += 1;
        }
        while let Some(ev) = p.b.poll_event() {
            match ev {
                Event::Message { id, tag, data } => {
                    assert_eq!(id.0, recv, "in order, exactly once");
                    assert_eq!(tag, recv);
                    assert_eq!(data.len(), size(&mut rrng), "length of message {recv}");
                    for (j, &x) in data.iter().enumerate() {
                        assert_eq!(x, byte_at(recv, j), "byte {j} of message {recv}");
                    }
                    bytes += data.len() as u64;
                    recv += 1;
                }
                other => panic!("unexpected event at b: {other:?}"),
            }
        }
        while let Some(ev) = p.a.poll_event() {
            match ev {
                Event::Acked(id) => {
                    assert_eq!(id.0, acked, "acks in order");
                    acked += 1;
                }
                other => panic!("unexpected event at a: {other:?}"),
            }
        }
        recv == n
    });
    assert!(
        ok,
        "only {recv} of {n} delivered by t={} ns; a={:?} b={:?} net={:?}",
        p.now,
        p.a.stats(),
        p.b.stats(),
        p.stats
    );
    Outcome {
        delivered: recv,
        bytes,
        virtual_ns: p.now - start,
    }
}

#[test]
fn million_small_messages_at_5pct_loss() {
    let net = NetConfig {
        seed: 7,
        loss: 0.05,
        ..NetConfig::default()
    };
    let mut p = pair(Config::default(), net);
    let t = std::time::Instant::now();
    let o = transfer(&mut p, 1_000_000, 11, 64 << 10, 600 * SEC, |r| {
        1 + r.below(32) as usize
    });
    let (a, b) = (p.a.stats(), p.b.stats());
    println!(
        "1e6 msgs @5% loss: {:?} in {:.3} s virtual, {:.2?} CPU; a={a:?}; b={b:?}; net={:?}",
        o,
        o.virtual_ns as f64 / 1e9,
        t.elapsed(),
        p.stats
    );
    assert_eq!(b.messages_delivered, 1_000_000);
    assert!(a.retransmissions > 0 && b.naks_sent > 0);
    // Resent bytes are counted, and at 5% loss are a small part of all that was sent.
    assert!(
        a.bytes_resent > 0 && a.bytes_resent * 10 < a.bytes_sent,
        "{a:?}"
    );
}

#[test]
fn fragmented_random_sizes_at_5pct_loss() {
    let net = NetConfig {
        seed: 3,
        loss: 0.05,
        ..NetConfig::default()
    };
    let mut p = pair(Config::default(), net);
    let o = transfer(&mut p, 3000, 5, 1 << 20, 600 * SEC, |r| {
        r.below(20_000) as usize
    });
    println!("fragmented @5%: {o:?} a={:?}", p.a.stats());
}

#[test]
fn heavy_reordering_duplication_and_corruption() {
    let net = NetConfig {
        seed: 99,
        loss: 0.02,
        jitter: 500_000, // 10x the latency: datagrams overtake each other freely
        duplicate: 0.1,
        corrupt: 0.05,
        ..NetConfig::default()
    };
    let mut p = pair(Config::default(), net);
    let o = transfer(&mut p, 20_000, 17, 256 << 10, 600 * SEC, |r| {
        if r.below(10) == 0 {
            r.below(10_000) as usize
        } else {
            r.below(200) as usize
        }
    });
    let (a, b) = (p.a.stats(), p.b.stats());
    println!(
        "reorder/dup/corrupt: {o:?} a={a:?} b={b:?} net={:?}",
        p.stats
    );
    assert!(p.stats.corrupted > 0 && a.dropped_corrupt + b.dropped_corrupt > 0);
    assert!(b.duplicates > 0 && b.out_of_order > 0);
}

#[test]
fn four_mib_messages_under_loss() {
    let net = NetConfig {
        seed: 21,
        loss: 0.02,
        jitter: 20_000,
        bytes_per_us: 1250, // 10 Gbit/s
        ..NetConfig::default()
    };
    let cfg = Config {
        recv_buffer_bytes: 64 << 20,
        ..Config::default()
    };
    let mut p = pair(cfg, net);
    let o = transfer(&mut p, 4, 8, 16 << 20, 600 * SEC, |_| 4 << 20);
    println!(
        "4 x 4 MiB @2%: {o:?} goodput {:.0} MB/s a={:?}",
        o.bytes as f64 / (o.virtual_ns as f64 / 1e3),
        p.a.stats()
    );
}

#[test]
fn unreliable_mode_drops_but_never_corrupts_or_duplicates() {
    let net = NetConfig {
        seed: 4,
        loss: 0.05,
        jitter: 100_000,
        duplicate: 0.05,
        corrupt: 0.02,
        ..NetConfig::default()
    };
    let cfg = Config {
        reliable: false,
        ..Config::default()
    };
    let mut p = pair(cfg, net);
    let mut srng = Rng::new(1);
    let n = 20_000u64;
    let mut sizes = Vec::new();
    let mut sent = 0u64;
    let mut last: Option<u64> = None;
    let mut got = 0u64;
    p.run_until(300 * SEC, |p| {
        while sent < n && p.a.send_buffered() < 64 << 10 {
            let len = if srng.below(8) == 0 {
                srng.below(6000) as usize
            } else {
                srng.below(100) as usize
            };
            sizes.push(len);
            p.a.send(sent, &content(sent, len)).expect("send");
            sent += 1;
        }
        while let Some(ev) = p.b.poll_event() {
            let Event::Message { id, tag, data } = ev else {
                panic!("unexpected {ev:?}");
            };
            assert!(last.is_none_or(|l| id.0 > l), "no duplicates, in order");
            last = Some(id.0);
            assert_eq!(tag, id.0);
            assert_eq!(data, content(id.0, sizes[id.0 as usize]), "intact");
            got += 1;
        }
        while p.a.poll_event().is_some() {}
        sent == n && p.a.is_idle()
    });
    // Let the last datagrams land.
    for _ in 0..1000 {
        if !p.step() {
            break;
        }
        while let Some(ev) = p.b.poll_event() {
            let Event::Message { id, data, .. } = ev else {
                panic!("unexpected {ev:?}");
            };
            assert!(last.is_none_or(|l| id.0 > l));
            last = Some(id.0);
            assert_eq!(data, content(id.0, sizes[id.0 as usize]));
            got += 1;
        }
    }
    let (a, b) = (p.a.stats(), p.b.stats());
    println!(
        "unreliable: {got}/{n} delivered, {} dropped; a={a:?} b={b:?} net={:?}",
        b.messages_dropped, p.stats
    );
    assert_eq!((a.retransmissions, a.bytes_resent), (0, 0));
    assert!(got > n * 8 / 10 && got < n);
    assert!(b.messages_dropped > 0);
    assert_eq!(
        got + b.messages_dropped,
        n,
        "every message delivered or counted"
    );
}

#[test]
fn peer_death_is_detected_after_dead_after() {
    let cfg = Config {
        dead_after: 300 * MS,
        keepalive: 50 * MS,
        ..Config::default()
    };
    let mut p = pair(cfg, NetConfig::default());
    p.a.send(1, b"hello").expect("send");
    assert!(p.run_until(SEC, |p| p.b.poll_event().is_some()));
    // Idle but alive: keepalives keep both sides up for a long quiet time.
    let quiet = p.now + 5 * SEC;
    p.run_until(quiet, |p| p.now >= quiet);
    assert!(!p.a.is_dead() && !p.b.is_dead());
    // Now the link goes silent in both directions: a queued message cannot be delivered.
    let mut silent = Pair::new(
        std::mem::replace(&mut p.a, Conn::new(Config::default(), 0)),
        std::mem::replace(&mut p.b, Conn::new(Config::default(), 0)),
        NetConfig {
            loss: 1.0,
            ..NetConfig::default()
        },
    );
    silent.now = p.now;
    let cut = silent.now;
    silent.a.send(2, &[0u8; 5000]).expect("send");
    let mut dead_at = None;
    silent.run_until(cut + 10 * SEC, |p| {
        while let Some(ev) = p.a.poll_event() {
            if ev == Event::PeerDead {
                dead_at = Some(p.now);
            }
        }
        dead_at.is_some()
    });
    let dead_at = dead_at.expect("peer declared dead");
    let after = dead_at - cut;
    println!("declared dead {:.3} s after the cut", after as f64 / 1e9);
    // Silence began at the last datagram received before the cut, at most one keepalive
    // period earlier; detection happens at most one keepalive period late.
    assert!((240 * MS..=350 * MS).contains(&after), "{after}");
    assert_eq!(silent.a.send(3, b"x"), Err(SendError::PeerDead));
}

#[test]
fn credits_bound_the_receiver_and_resume() {
    let cfg = Config {
        recv_buffer_bytes: 64 << 10,
        ..Config::default()
    };
    let mut p = pair(cfg, NetConfig::default());
    for i in 0..1000u64 {
        p.a.send(i, &content(i, 1000)).expect("send");
    }
    // The receiver does not take its messages: the sender must stop at the credit.
    let t = p.now + SEC;
    p.run_until(t, |p| p.now >= t);
    let b = p.b.stats();
    println!("credit-stalled: a={:?} b={b:?}", p.a.stats());
    assert!(b.messages_delivered < 200, "{}", b.messages_delivered);
    assert_eq!(b.dropped_window, 0);
    assert!(
        !p.a.is_dead(),
        "window probes keep the stalled sender alive"
    );
    // Taking them reopens the window.
    let mut got = 0u64;
    assert!(p.run_until(p.now + 10 * SEC, |p| {
        while let Some(ev) = p.b.poll_event() {
            if let Event::Message { id, data, .. } = ev {
                assert_eq!(id.0, got);
                assert_eq!(data, content(got, 1000));
                got += 1;
            }
        }
        got == 1000
    }));
}

#[test]
fn stray_and_malformed_datagrams_are_counted_and_dropped() {
    let mut a = Conn::new(Config::default(), 0);
    let mut b = Conn::new(
        Config {
            conn_id: 9,
            ..Config::default()
        },
        0,
    );
    a.send(5, b"abc").expect("send");
    let mut buf = Vec::new();
    a.poll_transmit(0, &mut buf).expect("a datagram");
    assert!(b.handle_datagram(1, &buf).is_err());
    assert!(b.handle_datagram(1, b"garbage").is_err());
    let mut bad = buf.clone();
    bad[20] ^= 0x40;
    assert!(b.handle_datagram(1, &bad).is_err());
    let s = b.stats();
    assert_eq!(
        (s.dropped_stray, s.dropped_malformed, s.dropped_corrupt),
        (1, 1, 1)
    );
    assert!(b.poll_event().is_none());
}

#[test]
fn goodput_versus_loss() {
    // 8 MiB in 64 KiB messages over a 10 Gbit/s, 50 µs link with a drop-tail queue.
    let mut base = None;
    for loss in [0.0, 0.001, 0.01, 0.05] {
        let net = NetConfig {
            seed: 31,
            loss,
            bytes_per_us: 1250,
            max_queue_delay: 500_000,
            ..NetConfig::default()
        };
        let mut p = pair(Config::default(), net);
        let o = transfer(&mut p, 128, 2, 4 << 20, 600 * SEC, |_| 64 << 10);
        let gp = o.bytes as f64 / (o.virtual_ns as f64 / 1e3);
        let base = *base.get_or_insert(gp);
        let a = p.a.stats();
        println!(
            "loss {:>5.1}%: goodput {gp:>7.1} MB/s ({:.2}x lossless), {:.2} ms virtual, \
             retx {}, timeouts {}, cwnd {}, srtt {} us, queue drops {}, window cuts {}, \
             random losses {}",
            loss * 100.0,
            gp / base,
            o.virtual_ns as f64 / 1e6,
            a.retransmissions,
            a.timeouts,
            a.cwnd,
            a.srtt_ns / 1000,
            p.stats.queue_drops,
            a.congestion_events,
            a.random_losses,
        );
        // The queue's drops are congestion: the window backs off (it overshoots in slow
        // start and must be cut, or the queue would keep dropping).
        if p.stats.queue_drops > 0 {
            assert!(a.congestion_events > 0, "no back-off at a full queue");
        }
        // Random loss is not congestion: 1% costs at most 30% of the lossless goodput
        // (NewReno, cutting on every loss, got 0.18x here).
        if loss <= 0.01 {
            assert!(
                gp >= 0.7 * base,
                "{gp:.0} MB/s at {loss} loss vs {base:.0} lossless"
            );
        }
        assert!(o.virtual_ns < 10 * SEC);
    }
}

#[test]
fn burst_losses_are_not_taken_for_congestion() {
    // Losses in runs of 16 datagrams (one offload batch dropped by a lossy link), 2% of
    // the datagrams in all, on a link with no queue to fill: the sender must resend
    // them, not halve its window for a run's length in lost packets (counted packet by
    // packet, one run of 16 in a round of 128 read as 12% loss: a cut on most runs).
    let net = NetConfig {
        seed: 17,
        loss: 0.02 / 16.0,
        loss_burst: 16,
        ..NetConfig::default()
    };
    let mut p = pair(Config::default(), net);
    transfer(&mut p, 512, 3, 4 << 20, 600 * SEC, |_| 64 << 10);
    let a = p.a.stats();
    let runs = p.stats.lost / 16;
    println!(
        "{runs} runs of 16 lost: {} window cuts, {} random losses, {} timeouts",
        a.congestion_events, a.random_losses, a.timeouts
    );
    assert!(runs >= 10, "too few bursts to tell: {}", p.stats.lost);
    assert!(
        a.congestion_events * 4 <= runs,
        "{} window cuts for {runs} runs of loss: {a:?}",
        a.congestion_events
    );
}

#[test]
fn congestion_still_backs_off_when_random_loss_is_tolerated() {
    // A slow bottleneck (1 Gbit/s) with a 2 ms drop-tail queue and no random loss: every
    // drop is the queue's. The window must settle near the path's capacity plus the
    // queue, not grow to its maximum and keep the queue overflowing.
    let net = NetConfig {
        seed: 5,
        bytes_per_us: 125,
        max_queue_delay: 2_000_000,
        ..NetConfig::default()
    };
    let mut p = pair(Config::default(), net);
    let o = transfer(&mut p, 256, 3, 8 << 20, 600 * SEC, |_| 64 << 10);
    let a = p.a.stats();
    let gp = o.bytes as f64 / (o.virtual_ns as f64 / 1e3);
    println!(
        "bottleneck: {gp:.1} MB/s, cwnd {}, window cuts {}, random losses {}, queue drops {}, \
         data sent {}",
        a.cwnd, a.congestion_events, a.random_losses, p.stats.queue_drops, a.data_sent
    );
    assert!(a.congestion_events > 0);
    // Capacity 100 us x 125 B/us + 2 ms of queue = about 180 packets of 1.4 KB.
    assert!(a.cwnd < 400, "window {} never came down", a.cwnd);
    assert!(
        p.stats.queue_drops * 20 < a.data_sent,
        "{} of {} datagrams dropped at the queue",
        p.stats.queue_drops,
        a.data_sent
    );
    assert!(gp > 100.0, "{gp:.1} MB/s of a 125 MB/s link");
}

/// A lossless stream through a 1 GB/s link with a deep queue (50 ms, never full), with
/// the transport's window limits (16 MiB of packets either way), under `floor`: the
/// sender's stats, the goodput in MB/s and the network's queue drops.
fn deep_queue_stream(floor: u64) -> (clink_proto::reliable::Stats, f64, u64) {
    let net = NetConfig {
        seed: 8,
        bytes_per_us: 1000,
        max_queue_delay: 50_000_000,
        ..NetConfig::default()
    };
    let cfg = Config {
        recv_window: 1 << 16,
        max_cwnd: (16 << 20) / 1408,
        slow_start_floor: floor,
        recv_buffer_bytes: 64 << 20,
        ..Config::default()
    };
    let mut p = pair(cfg, net);
    let o = transfer(&mut p, 512, 4, 16 << 20, 600 * SEC, |_| 64 << 10);
    let gp = o.bytes as f64 / (o.virtual_ns as f64 / 1e3);
    (p.a.stats(), gp, p.stats.queue_drops)
}

#[test]
fn slow_start_ends_where_a_queue_builds() {
    // Capacity: 100 us x 1000 B/us = 100 KB. The RTT shows a queue from about 600 us
    // (the congestion test: 4x the minimum and 0.5 ms above it), about 430 packets in
    // flight; the smoothed RTT lags behind the flight, so the threshold comes down later
    // (at about 840 packets here), and after that the window grows by one per round trip
    // while the queue lasts.
    let (s, gp, drops) = deep_queue_stream(Config::default().slow_start_floor);
    println!("deep queue: {gp:.0} MB/s, {s:?}");
    assert_eq!(drops, 0);
    assert!(s.slow_start_exits >= 1, "{s:?}");
    assert!(s.cwnd < 2000, "window {} of {}", s.cwnd, (16 << 20) / 1408);
    assert!(s.srtt_ns < 3_000_000, "a queue of {} us", s.srtt_ns / 1000);
    assert!(gp > 900.0, "{gp:.0} MB/s of a 1000 MB/s link");
    // Without the exit the window runs to its maximum and the queue to 16 ms.
    let (s, _, _) = deep_queue_stream(u64::MAX);
    assert_eq!(s.slow_start_exits, 0);
    assert!(s.srtt_ns > 10_000_000, "{s:?}");
}
