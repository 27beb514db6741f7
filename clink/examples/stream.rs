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
//! `ip netns exec`; run this side in another namespace). With `--send ADDR SIZE COUNT` it
//! is the sending child.

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
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let exe = std::env::current_exe()?;
    let mut cmd = match std::env::var("STREAM_SENDER_NETNS") {
        Ok(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns]).arg(exe);
            c
        }
        Err(_) => Command::new(exe),
    };
    let mut child = cmd
        .args([
            "--send",
            &ep.address(),
            &size.to_string(),
            &count.to_string(),
        ])
        .spawn()?;
    let peer = ep.accept(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; size];
    let sel = Selector::exact(Some(peer), 0);
    ep.recv(sel, &mut buf)?; // the first message starts the clock
    let t = Instant::now();
    for _ in 1..count {
        ep.recv(sel, &mut buf)?;
    }
    let secs = t.elapsed().as_secs_f64();
    assert!(buf.iter().all(|&b| b == 7), "payload damaged");
    ep.send(peer, 1, &[])?;
    child.wait()?;
    let s = ep.stats();
    println!(
        "{size} B x {count} over {}: {:.2} GB/s",
        ep.transport(peer)?,
        (size * (count - 1)) as f64 / secs / 1e9
    );
    println!(
        "receiver: {} datagrams in {} reads ({} coalesced); speculation: {} hits ({} B), {} misses; {} B copied by cleanup; {} duplicates, {} NAKs sent, {} malformed or cut short",
        s.datagrams_received, s.recv_calls, s.gro_reads, s.spec_hits, s.spec_hit_bytes,
        s.spec_misses, s.cleanup_bytes, s.duplicates_dropped, s.naks_sent, s.malformed_dropped
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
        "sender: {} datagrams in {} send calls, {} retransmissions ({} timeouts, {} window \
         cuts, {} random losses, {} tail probes), {} refused by the kernel",
        s.datagrams_sent,
        s.send_calls,
        s.retransmissions,
        s.timeouts,
        s.window_cuts,
        s.random_losses,
        s.tail_probes,
        s.send_drops
    );
    Ok(())
}
