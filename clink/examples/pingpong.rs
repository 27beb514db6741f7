//! Ping-pong latency between two processes: the example starts its second process itself.
//!
//! Run: `cargo run --release -p clink --example pingpong -- [size] [iterations]`
//!
//! `PINGPONG_WRAP="ip netns exec HOST"` starts the second process under that command
//! prefix (split at spaces), for example in another network namespace; the first process
//! then advertises its network address. `PINGPONG_IDLE=N` connects N more processes to the
//! first one that send nothing until the end (its waits then have several peers to watch).

use clink::{Context, Selector};
use std::process::Command;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--pong") {
        return pong(&args[2]);
    }
    if args.get(1).map(String::as_str) == Some("--idle") {
        return idle(&args[2]);
    }
    let size: usize = args.get(1).map_or(Ok(8), |s| s.parse())?;
    let iters: u32 = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let wrap = std::env::var("PINGPONG_WRAP").unwrap_or_default();
    let mut argv: Vec<String> = wrap.split_whitespace().map(String::from).collect();
    argv.push(std::env::current_exe()?.display().to_string());
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .args(["--pong", &ep.address()])
        .spawn()?;
    let peer = ep.accept(Some(Duration::from_secs(10)))?;
    let idle_n: usize = std::env::var("PINGPONG_IDLE").map_or(Ok(0), |s| s.parse())?;
    let mut idlers = Vec::new();
    for _ in 0..idle_n {
        let c = Command::new(&argv[0])
            .args(&argv[1..])
            .args(["--idle", &ep.address()])
            .spawn()?;
        idlers.push((c, ep.accept(Some(Duration::from_secs(10)))?));
    }
    let msg = vec![1u8; size];
    let mut buf = vec![0u8; size];
    let sel = Selector::exact(Some(peer), 0);
    for _ in 0..iters / 10 {
        ep.send(peer, 0, &msg)?;
        ep.recv(sel, &mut buf)?;
    }
    let t = Instant::now();
    for _ in 0..iters {
        ep.send(peer, 0, &msg)?;
        ep.recv(sel, &mut buf)?;
    }
    let one_way = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters) / 2.0;
    ep.send(peer, 1, &[])?; // stop
    for (_, p) in &idlers {
        ep.send(*p, 1, &[])?;
    }
    let transport = ep.transport(peer)?;
    // Delivered before the wait outside clink (a lost datagram is resent only while the
    // endpoint is driven; `close` lingers until the child has it).
    ep.close();
    child.wait()?;
    for (mut c, _) in idlers {
        c.wait()?;
    }
    let s = ep.stats();
    let per = |n: u64| n as f64 / f64::from(iters + iters / 10);
    println!(
        "{size} B over {}: {one_way:.3} us one-way (mean of {iters} round trips{}); per round trip: {:.2} sleeps ({:.2} on futexes), {:.2} datagrams sent, {:.2} send calls, {:.2} receive calls with data",
        transport,
        if idle_n > 0 { format!(", {idle_n} idle peers") } else { String::new() },
        per(s.sleeps),
        per(s.futex_sleeps),
        per(s.datagrams_sent),
        per(s.send_calls),
        per(s.recv_calls),
    );
    Ok(())
}

fn pong(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let peer = ep.connect(addr)?;
    let mut buf = vec![0u8; 64 << 20];
    loop {
        let st = ep.recv(
            Selector {
                src: Some(peer),
                tag: 0,
                mask: 0,
            },
            &mut buf,
        )?;
        if st.tag == 1 {
            return Ok(());
        }
        ep.send(peer, 0, &buf[..st.len as usize])?;
    }
}

/// A peer that connects and waits, sending nothing, until told to stop (tag 1).
fn idle(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let peer = ep.connect(addr)?;
    ep.recv(Selector::exact(Some(peer), 1), &mut [])?;
    Ok(())
}
