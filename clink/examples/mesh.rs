//! Many processes on one host: N processes connect every pair (a full mesh), exchange an
//! 8-byte message with every other (an all-to-all, each message checked), and then two
//! of them (ranks 0 and 1) ping-pong 8 bytes while the others wait in a blocking receive.
//! Prints the host's shared memory the mesh holds (`Shmem` of `/proc/meminfo` while it
//! stands, less before it started), the ranks' resident memory then (`VmRSS`: with
//! `CLINK_TRANSPORT=udp` the mesh is made of UDP connections, whose state is private
//! memory), the slowest rank's times to connect and to exchange,
//! and the ping-pong's one-way latency. `mesh 2` is the lone pair to compare it with.
//! Each rank tells its endpoint how many peers to expect (`Endpoint::expect_peers`), which
//! sizes the rings from the first connection on; `MESH_NO_HINT=1` leaves that out.
//!
//! Run: `cargo run --release -p clink --example mesh -- [processes] [round trips]`

use clink::{Context, Endpoint, PeerId, Selector};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TAG_RANK: u64 = 1;
const TAG_ALL: u64 = 2;
const TAG_PING: u64 = 3;
const TAG_EXIT: u64 = 4;
const LIMIT: Duration = Duration::from_secs(120);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--rank") {
        let dir = PathBuf::from(&args[2]);
        let (rank, n, iters) = (args[3].parse()?, args[4].parse()?, args[5].parse()?);
        return rank_main(&dir, rank, n, iters);
    }
    let n: usize = args.get(1).map_or(Ok(64), |s| s.parse())?;
    let iters: u32 = args.get(2).map_or(Ok(20_000), |s| s.parse())?;
    if n < 2 {
        return Err("at least two processes".into());
    }
    let dir = std::env::temp_dir().join(format!("clink-mesh-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let before = shmem_kib()?;
    let exe = std::env::current_exe()?;
    let mut kids: Vec<Child> = Vec::new();
    for r in 0..n {
        let spawned = Command::new(&exe)
            .args(["--rank", &dir.display().to_string()])
            .args([r.to_string(), n.to_string(), iters.to_string()])
            .stdout(Stdio::piped())
            .spawn();
        match spawned {
            Ok(c) => kids.push(c),
            Err(e) => {
                stop(&mut kids);
                return Err(e.into());
            }
        }
    }
    // Every rank says when its mesh stands; then the memory is read and they go on.
    let stood = wait_files(&dir, "stands", n);
    let during = shmem_kib();
    let go = std::fs::write(dir.join("go"), b"");
    let mut outs = Vec::new();
    for c in kids.drain(..) {
        outs.push(c.wait_with_output());
    }
    let _ = std::fs::remove_dir_all(&dir);
    stood?;
    go?;
    let mut mesh_ms: f64 = 0.0;
    let mut all_ms: f64 = 0.0;
    let mut latency = None;
    let (mut rss_kib, mut rss_max) = (0.0, 0.0f64);
    for (r, o) in outs.into_iter().enumerate() {
        let o = o?;
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if !o.status.success() {
            return Err(format!("rank {r} failed ({}): {text}", o.status).into());
        }
        for l in text.lines() {
            let mut w = l.split_whitespace();
            match (w.next(), w.next().and_then(|v| v.parse::<f64>().ok())) {
                (Some("mesh_ms"), Some(v)) => mesh_ms = mesh_ms.max(v),
                (Some("alltoall_ms"), Some(v)) => all_ms = all_ms.max(v),
                (Some("one_way_us"), Some(v)) => latency = Some(v),
                (Some("rss_kib"), Some(v)) => {
                    rss_kib += v;
                    rss_max = rss_max.max(v);
                }
                _ => {}
            }
        }
    }
    let held = during?.saturating_sub(before);
    println!(
        "{n} processes: shared memory {:.1} MiB while the mesh stands, resident {:.1} MiB in \
         all (the largest rank {:.1} MiB); mesh {mesh_ms:.0} ms, \
         all-to-all {all_ms:.0} ms (slowest rank); 8 B one-way between ranks 0 and 1: {:.3} us \
         (mean of {iters} round trips)",
        held as f64 / 1024.0,
        rss_kib / 1024.0,
        rss_max / 1024.0,
        latency.ok_or("rank 0 printed no latency")?
    );
    Ok(())
}

fn stop(kids: &mut Vec<Child>) {
    for mut c in kids.drain(..) {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `Shmem:` of `/proc/meminfo`, in KiB (memfd segments count there).
fn shmem_kib() -> Result<u64, Box<dyn std::error::Error>> {
    let m = std::fs::read_to_string("/proc/meminfo")?;
    m.lines()
        .find_map(|l| l.strip_prefix("Shmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no Shmem line in /proc/meminfo".into())
}

/// Waits until `dir` holds `n` files named `PREFIX.R` (or the limit passes).
fn wait_files(dir: &Path, prefix: &str, n: usize) -> Result<(), String> {
    let names: Vec<String> = (0..n).map(|r| format!("{prefix}.{r}")).collect();
    wait_for(dir, &names, prefix)
}

/// Waits until every file of `names` is in `dir` (or the limit passes).
fn wait_for(dir: &Path, names: &[String], what: &str) -> Result<(), String> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let have = names.iter().filter(|f| dir.join(f).exists()).count();
        if have == names.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{have} of {} ranks reached '{what}' within {LIMIT:?}",
                names.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn rank_main(
    dir: &Path,
    rank: usize,
    n: usize,
    iters: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    if std::env::var_os("MESH_NO_HINT").is_none() {
        ep.expect_peers(n - 1);
    }
    let tmp = dir.join(format!("addr.{rank}.tmp"));
    std::fs::write(&tmp, ep.address())?;
    std::fs::rename(&tmp, dir.join(format!("addr.{rank}")))?;
    wait_files(dir, "addr", n)?;
    // Rank r connects to the higher ranks and is connected to by the lower ones, which
    // name themselves in a first message.
    let t = Instant::now();
    let mut peer_of = vec![None; n];
    for (r, slot) in peer_of.iter_mut().enumerate().skip(rank + 1) {
        let addr = std::fs::read_to_string(dir.join(format!("addr.{r}")))?;
        let p = ep.connect(&addr)?;
        ep.send(p, TAG_RANK, &(rank as u64).to_le_bytes())?;
        *slot = Some(p);
    }
    for _ in 0..rank {
        let p = ep.accept(Some(LIMIT))?;
        let mut b = [0u8; 8];
        ep.recv_timeout(Selector::exact(Some(p), TAG_RANK), &mut b, Some(LIMIT))?;
        let r = u64::from_le_bytes(b) as usize;
        if r >= rank || peer_of[r].is_some() {
            return Err(format!("rank {rank}: a peer named itself {r}").into());
        }
        peer_of[r] = Some(p);
    }
    let peers: Vec<PeerId> = peer_of.iter().flatten().copied().collect();
    println!("mesh_ms {:.1}", t.elapsed().as_secs_f64() * 1e3);
    let t = Instant::now();
    for (r, p) in peer_of.iter().enumerate() {
        if let Some(p) = p {
            ep.send(*p, TAG_ALL, &((rank * n + r) as u64).to_le_bytes())?;
        }
    }
    for (r, p) in peer_of.iter().enumerate() {
        if let Some(p) = p {
            let mut b = [0u8; 8];
            ep.recv_timeout(Selector::exact(Some(*p), TAG_ALL), &mut b, Some(LIMIT))?;
            if u64::from_le_bytes(b) != (r * n + rank) as u64 {
                return Err(format!("rank {rank}: wrong all-to-all message from rank {r}").into());
            }
        }
    }
    println!("alltoall_ms {:.1}", t.elapsed().as_secs_f64() * 1e3);
    let status = std::fs::read_to_string("/proc/self/status")?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no VmRSS line in /proc/self/status")?;
    println!("rss_kib {rss}");
    std::fs::write(dir.join(format!("stands.{rank}")), b"")?;
    // The parent's go: it has read the memory the mesh holds.
    wait_for(dir, &["go".to_string()], "go")?;
    match rank {
        0 => {
            let other = peer_of[1].ok_or("no rank 1")?;
            let us = ping(&mut ep, other, iters)?;
            println!("one_way_us {us:.3}");
            for p in &peers {
                ep.send(*p, TAG_EXIT, &[])?;
            }
        }
        1 => {
            let zero = peer_of[0].ok_or("no rank 0")?;
            let mut b = [0u8; 8];
            for _ in 0..iters + iters / 10 {
                ep.recv_timeout(Selector::exact(Some(zero), TAG_PING), &mut b, Some(LIMIT))?;
                ep.send(zero, TAG_PING, &b)?;
            }
            ep.recv_timeout(Selector::exact(Some(zero), TAG_EXIT), &mut [], Some(LIMIT))?;
        }
        _ => {
            let zero = peer_of[0].ok_or("no rank 0")?;
            ep.recv_timeout(Selector::exact(Some(zero), TAG_EXIT), &mut [], Some(LIMIT))?;
        }
    }
    ep.close();
    Ok(())
}

fn ping(ep: &mut Endpoint, peer: PeerId, iters: u32) -> clink::Result<f64> {
    let mut b = [0u8; 8];
    let sel = Selector::exact(Some(peer), TAG_PING);
    for _ in 0..iters / 10 {
        ep.send(peer, TAG_PING, &b)?;
        ep.recv_timeout(sel, &mut b, Some(LIMIT))?;
    }
    let t = Instant::now();
    for _ in 0..iters {
        ep.send(peer, TAG_PING, &b)?;
        ep.recv_timeout(sel, &mut b, Some(LIMIT))?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(iters) / 2.0)
}
