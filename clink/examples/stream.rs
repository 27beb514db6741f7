//! Streams large messages from a child process to this one and prints the goodput and the
//! receiver's data-path counters (for the network path: speculation hits and misses, bytes
//! copied by cleanup).
//!
//! ```text
//! cargo run --release --example stream -- [size] [count]
//! CLINK_TRANSPORT=udp CLINK_UDP_MTU=1500 cargo run --release --example stream -- 1048576 2000
//! ```
//!
//! With `STREAM_SENDER_NETNS=NAME` the sender runs in network namespace NAME (through
//! `ip netns exec`; run this side in another namespace). With `STREAM_SENDERS=N` (default
//! one) N sender processes stream `count` messages each at once (the seed's two-senders
//! experiment, where admission control, `CLINK_UDP_ADMISSION`, decides which stream is
//! received in place). `STREAM_RECVS=N` (default two) receives are kept posted per sender. With `--send ADDR SIZE COUNT` it is the sending child.
//!
//! `clink bench --placement netns --spec` runs these experiments (and the others of the
//! seed) with payload checks, interleaved rounds and JSON rows.

use clink::{Context, Selector};
use std::process::Command;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--send") {
        return send(&args[2], args[3].parse()?, args[4].parse()?);
    }
    let size: usize = args.get(1).map_or(Ok(1 << 20), |s| s.parse())?;
    let count: usize = args.get(2).map_or(Ok(1000), |s| s.parse())?;
    let senders: usize = std::env::var("STREAM_SENDERS").map_or(Ok(1), |s| s.parse())?;
    let window: usize = std::env::var("STREAM_RECVS").map_or(Ok(2), |s| s.parse())?;
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..senders {
        let mut cmd = match std::env::var("STREAM_SENDER_NETNS") {
            Ok(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns]).arg(&exe);
                c
            }
            Err(_) => Command::new(&exe),
        };
        children.push(
            cmd.args([
                "--send",
                &ep.address(),
                &size.to_string(),
                &count.to_string(),
            ])
            .spawn()?,
        );
    }
    let peers = (0..senders)
        .map(|_| ep.accept(Some(Duration::from_secs(10))))
        .collect::<Result<Vec<_>, _>>()?;
    // Receives posted per sender at all times (two by default), so every sender's
    // transfers can be under way together (with one receive for all, the receiver would
    // clear one rendezvous at a time and the senders could never interfere).
    let (mut reqs, mut from) = (Vec::new(), Vec::new());
    for (k, &p) in peers.iter().enumerate() {
        for _ in 0..window.max(1).min(count) {
            reqs.push(ep.irecv(Selector::exact(Some(p), 0), vec![0u8; size])?);
            from.push(k);
        }
    }
    let expect = vec![7u8; size];
    let mut got = vec![0usize; senders];
    let mut done_at = vec![0.0; senders];
    let mut t = None; // the first message starts the clock
    while got.iter().sum::<usize>() < count * senders {
        // One progress loop for every posted receive.
        let (i, r) = ep.wait_any_recv(&reqs, Some(Duration::from_secs(30)))?;
        let r = r?;
        let k = from[i];
        // A slice comparison (memcmp): a byte-by-byte `all` loop here was the
        // receiver's hottest code in some builds and cost a third of the goodput.
        assert!(r.buf == expect, "payload damaged");
        let start = *t.get_or_insert_with(Instant::now);
        got[k] += 1;
        if got[k] == count {
            done_at[k] = start.elapsed().as_secs_f64();
        }
        let mut buf = r.buf;
        buf.resize(size, 0);
        if got[k] + window.max(1) <= count {
            reqs[i] = ep.irecv(Selector::exact(Some(peers[k]), 0), buf)?;
        } else {
            let _completed = reqs.swap_remove(i);
            from.swap_remove(i);
        }
    }
    let t = t.expect("messages arrived");
    let secs = t.elapsed().as_secs_f64();
    for &p in &peers {
        ep.send(p, 1, &[])?;
    }
    let transport = ep.transport(peers[0])?;
    // The stop messages are delivered before the wait for the senders, which is outside
    // clink: a lost one is resent only while this endpoint is driven (`close` lingers
    // until the senders have them).
    ep.close();
    for mut c in children {
        c.wait()?;
    }
    let s = ep.stats();
    println!(
        "{size} B x {count} x {senders} sender(s) over {}: {:.2} GB/s aggregate (senders done at {})",
        transport,
        (size * (count * senders - 1)) as f64 / secs / 1e9,
        done_at
            .iter()
            .map(|d| format!("{:.3} s", d))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "receiver: {} datagrams in {} reads ({} coalesced), {} sent in {} calls, {} sleeps; speculation: {} hits ({} B, {:.2}% of bulk bytes), {} misses; {} B copied by cleanup; {} duplicates, {} NAKs sent, {} malformed or cut short; admission: {} grants, {} refusals, {} revocations, {} datagrams on the steered socket; the granted stream's hit rate {:.2}% of {} fragments",
        s.datagrams_received, s.recv_calls, s.gro_reads, s.datagrams_sent, s.send_calls, s.sleeps, s.spec_hits, s.spec_hit_bytes,
        100.0 * s.spec_hit_rate().unwrap_or(0.0),
        s.spec_misses, s.cleanup_bytes, s.duplicates_dropped, s.naks_sent, s.malformed_dropped,
        s.fast_grants, s.fast_refusals, s.fast_revocations, s.steered_datagrams,
        100.0 * s.granted_hit_rate().unwrap_or(0.0), s.granted_fragments
    );
    Ok(())
}

fn send(addr: &str, size: usize, count: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let peer = ep.connect(addr)?;
    let msg = vec![7u8; size];
    let batch: Vec<&[u8]> = vec![&msg; 16];
    let mut left = count;
    while left > 0 {
        let n = left.min(batch.len());
        ep.send_batch(peer, 0, &batch[..n])?;
        left -= n;
    }
    let mut stop = [0u8; 0];
    ep.recv(Selector::exact(Some(peer), 1), &mut stop)?;
    let s = ep.stats();
    println!(
        "sender: {} datagrams in {} send calls, {} sleeps, {} retransmissions ({} timeouts, {} window \
         cuts, {} random losses, {} tail probes), {} refused by the kernel; fast stream \
         granted {} times, refused {}",
        s.datagrams_sent,
        s.send_calls,
        s.sleeps,
        s.retransmissions,
        s.timeouts,
        s.window_cuts,
        s.random_losses,
        s.tail_probes,
        s.send_drops,
        s.fast_granted,
        s.fast_refused
    );
    if let Some(c) = ep.conn_stats(peer)? {
        println!(
            "sender's connection: smoothed RTT {:.1} us (least {:.1}), window {} packets \
             (threshold {}), {} lost",
            c.srtt_ns as f64 / 1e3,
            c.min_rtt_ns as f64 / 1e3,
            c.cwnd,
            c.ssthresh,
            c.lost
        );
    }
    Ok(())
}
