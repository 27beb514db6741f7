//! `clink cast bench`: a chain of N receivers on a bridge of N+1 hosts, cast by clink and
//! relayed by kernel TCP (Dolly as it was: read, write to the file, write to the next
//! host), the same file through the same shape.

use super::*;
use clink_testbed::{Bridge, BridgeSpec};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// `clink cast bench` arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Receivers in the chain (the bridge has one host more, the source's).
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Size of the file cast, in MiB.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Rate limit of each host's input link, in tc's syntax (`1gbit`).
    #[arg(long)]
    rate: Option<String>,
    /// Chunks in flight per hop (`--window` of the receivers and the source).
    #[arg(long, default_value_t = 6)]
    window: usize,
    /// Chunk size in bytes (`--chunk` of the source; its default when not given).
    #[arg(long)]
    chunk: Option<u64>,
    /// The clink chain's transport (`--transport` of the source).
    #[arg(long, value_enum, default_value_t = super::Transport::Tcp)]
    transport: super::Transport,
    /// Runs both chains this many times, alternating which goes first (the clink chain in
    /// even rounds), and gives the median of the per-round rate ratios.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Prints JSON rows only.
    #[arg(long)]
    json: bool,
    /// Instead of the comparison: kills the middle receiver once it holds half the file,
    /// restarts it with `--rejoin`, and reports how long the receivers after it stalled,
    /// what the source sent and what the restarted one fetched (3 receivers or more).
    #[arg(long)]
    kill_middle: bool,
}

/// Arguments of one host of the kernel-TCP chain (internal).
#[derive(Args, Debug)]
pub struct TcpNodeArgs {
    /// Output file (receivers) or input file (the source).
    #[arg(long)]
    file: PathBuf,
    /// Address of the next host (`IP:port`).
    #[arg(long)]
    next: Option<String>,
    /// Sends `file` to `next` instead of receiving.
    #[arg(long)]
    source: bool,
    /// The source sends at most this many bytes.
    #[arg(long)]
    limit: Option<u64>,
    /// Prints the CPU seconds this process used when it is done (`cpu SECONDS`).
    #[arg(long)]
    report_cpu: bool,
}

/// Bound on a whole run of either chain.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// A child killed (by PID) and reaped on drop.
struct Kid(Option<Child>);

impl Kid {
    fn spawn(mut cmd: Command) -> Result<(Kid, BufReader<std::process::ChildStdout>), String> {
        cmd.env("CLINK_CALIBRATE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut c = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let out = BufReader::new(c.stdout.take().unwrap());
        Ok((Kid(Some(c)), out))
    }

    /// Waits for the exit, within the run's bound.
    fn wait(&mut self, deadline: Instant) -> Result<std::process::ExitStatus, String> {
        let c = self.0.as_mut().unwrap();
        loop {
            if let Some(st) = c.try_wait().map_err(|e| e.to_string())? {
                self.0 = None;
                return Ok(st);
            }
            if Instant::now() >= deadline {
                return Err("a chain host did not finish in time".into());
            }
            // Polling for the exit only.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn line(out: &mut BufReader<std::process::ChildStdout>) -> Result<String, String> {
    let mut l = String::new();
    out.read_line(&mut l).map_err(|e| e.to_string())?;
    if l.is_empty() {
        return Err("a chain host exited before printing its address".into());
    }
    Ok(l.trim().to_string())
}

/// Runs `clink cast bench`.
pub fn run(a: BenchArgs) -> Result<(), String> {
    if let Some(why) = clink_testbed::unavailable() {
        return Err(why);
    }
    if a.hosts == 0 {
        return Err("--hosts: at least one receiver".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bridge = Bridge::create(&BridgeSpec {
        hosts: a.hosts + 1,
        rate: a.rate.clone(),
        ..BridgeSpec::default()
    })
    .map_err(|e| format!("bridge: {e}"))?;
    let dir = std::env::temp_dir().join(format!("clink-cast-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let _clean = CleanDir(dir.clone());
    let size = a.size_mib << 20;
    let src = dir.join("source.bin");
    write_file(&src, size).map_err(|e| format!("{}: {e}", src.display()))?;
    let rate = a.rate.clone().unwrap_or_else(|| "none".into());
    let want = file_hash(&src)?;
    if a.kill_middle {
        return kill_middle(&bridge, &exe, &dir, &src, &a, &rate, &want);
    }
    let mut ratios = Vec::new();
    // The network's price for the model, on this bridge (its rate limit included).
    let net_bps = bridge_net_bps(&bridge, &exe, size.min(256 << 20))?;
    for round in 0..a.rounds {
        // Which chain runs first alternates: the second one writes its files into memory
        // the first one's just gave back, which on a virtual machine can be much cheaper
        // (or dearer) to write to than memory left alone for a while.
        let clink_first = round % 2 == 0;
        let mut tcp = None;
        if !clink_first {
            tcp = Some(relay(&bridge, &exe, &dir, &src, a.hosts, &want)?);
        }
        let (clink, predicted, chunk) = clink_chain(&bridge, &exe, &dir, &src, &a, net_bps)?;
        // Every copy checked; then removed, so that the other chain starts with the page
        // cache as this one did (a chain's files left behind slowed the other's writes).
        check_copies(&dir, "clink", a.hosts, &want)?;
        let tcp = match tcp {
            Some(t) => t,
            None => relay(&bridge, &exe, &dir, &src, a.hosts, &want)?,
        };
        let rows = [("clink-cast", &clink), ("tcp-relay", &tcp)];
        for (system, chain) in rows {
            let secs = &chain.secs;
            let mut row = json!({
                "bench": "cast",
                "system": system,
                "round": round,
                "first": if clink_first { "clink-cast" } else { "tcp-relay" },
                "hosts": a.hosts,
                "bytes": size,
                "rate_limit": rate,
                "window": a.window,
                "transport": if system == "clink-cast" { a.transport.key().unwrap_or("any") } else { "tcp" },
                "seconds": secs,
                "rate_mbps": mbps(size, *secs),
                // The receivers' processor time (user and system) per GB, their mean.
                "node_cpu_s_per_gb": chain.cpu_s_per_gb,
            });
            if system == "clink-cast" {
                // The cost model's rate for the chain, its hosts sharing this machine.
                row["predicted_mbps"] = json!(predicted / 1e6);
                row["net_bridge_mbps"] = json!(net_bps / 1e6);
                row["chunk"] = json!(chunk);
            }
            println!("{row}");
        }
        let (c, t) = (mbps(size, clink.secs), mbps(size, tcp.secs));
        if t > 0.0 {
            ratios.push(c / t);
        }
        if !a.json {
            println!(
                "round {round}: {} MiB to {} receivers in a chain (link rate {rate}): clink cast \
                 over {} {c:.1} MB/s (every chunk verified by BLAKE3 at every hop), kernel TCP \
                 relay {t:.1} MB/s; a receiver's processor time per GB {:.2} s and {:.2} s",
                a.size_mib,
                a.hosts,
                a.transport.key().unwrap_or("any transport"),
                clink.cpu_s_per_gb,
                tcp.cpu_s_per_gb,
            );
        }
    }
    if !a.json && a.rounds > 1 {
        if let Some(m) = crate::bench::stats::median(&ratios) {
            println!(
                "clink cast / relay, median of {} per-round ratios: {m:.2}",
                ratios.len()
            );
        }
    }
    Ok(())
}

/// A child's standard output.
type Out = BufReader<std::process::ChildStdout>;

/// The receivers of a chain, each with its output, and their addresses.
type Receivers = (Vec<(Kid, Out)>, Vec<String>);

/// Receiver `i` of a clink chain (`extra` arguments), writing `dir/clink{i}`, and its
/// output (its address first).
fn clink_receiver(
    b: &Bridge,
    exe: &Path,
    dir: &Path,
    a: &BenchArgs,
    i: usize,
    extra: &[&str],
) -> Result<(Kid, Out), String> {
    let mut cmd = b.command(i, exe);
    cmd.args(["cast", "recv", "--json", "--window", &a.window.to_string()])
        .args(extra)
        .arg("--out")
        .arg(dir.join(format!("clink{i}")));
    Kid::spawn(cmd)
}

/// Receivers 1 to `a.hosts` of a clink chain, each with its output, and their addresses.
fn clink_receivers(b: &Bridge, exe: &Path, dir: &Path, a: &BenchArgs) -> Result<Receivers, String> {
    let mut kids = Vec::new();
    let mut addrs = Vec::new();
    for i in 1..=a.hosts {
        let (k, mut out) = clink_receiver(b, exe, dir, a, i, &[])?;
        addrs.push(line(&mut out)?);
        kids.push((k, out));
    }
    Ok((kids, addrs))
}

/// The source of a clink chain through `addrs`, casting `src`.
fn clink_source(
    b: &Bridge,
    exe: &Path,
    src: &Path,
    a: &BenchArgs,
    addrs: &[String],
) -> Result<(Kid, Out), String> {
    let mut cmd = b.command(0, exe);
    cmd.args(["cast", "send", "--json", "--window", &a.window.to_string()])
        .args(["--to", &addrs.join(",")])
        .args(["--transport", a.transport.key().unwrap_or("any")])
        .arg(src);
    if let Some(r) = &a.rate {
        cmd.args(["--link-rate", r]);
    }
    if let Some(c) = a.chunk {
        cmd.args(["--chunk", &c.to_string()]);
    }
    Kid::spawn(cmd)
}

/// `--kill-middle`: per round, a clink chain whose middle receiver is killed at half the
/// file and restarted with `--rejoin`; one JSON row each.
fn kill_middle(
    b: &Bridge,
    exe: &Path,
    dir: &Path,
    src: &Path,
    a: &BenchArgs,
    rate: &str,
    want: &blake3::Hash,
) -> Result<(), String> {
    if a.hosts < 3 {
        return Err("--kill-middle: at least 3 receivers (one before and one after it)".into());
    }
    let size = a.size_mib << 20;
    let m = a.hosts.div_ceil(2);
    for round in 0..a.rounds {
        let (mut kids, addrs) = clink_receivers(b, exe, dir, a)?;
        let deadline = Instant::now() + RUN_TIMEOUT;
        let (mut s, mut out) = clink_source(b, exe, src, a, &addrs)?;
        // The middle receiver writes its chunks in order: half its file is half the cast.
        let its = dir.join(format!("clink{m}"));
        while std::fs::metadata(&its).map_or(0, |f| f.len()) < size / 2 {
            if Instant::now() >= deadline {
                return Err(format!("node {m} never held half the file"));
            }
            // Polling a file's length only.
            std::thread::sleep(Duration::from_millis(1));
        }
        let killed_at = std::fs::metadata(&its).map_or(0, |f| f.len());
        drop(kids.remove(m - 1));
        let (k, mut o) = clink_receiver(b, exe, dir, a, m, &["--rejoin", &addrs[m - 2]])?;
        line(&mut o)?;
        kids.insert(m - 1, (k, o));
        let st = s.wait(deadline)?;
        // A restarted node fails when the cast ended before it could rejoin (the rest of
        // the file took less time than its start): a row says so.
        let mut rejoined = true;
        for (i, (k, _)) in kids.iter_mut().enumerate() {
            rejoined &= k.wait(deadline)?.success() || i + 1 != m;
        }
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        if !st.success() && rejoined {
            return Err(format!("clink cast failed: {st}"));
        }
        let rows: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let node = |n: usize| rows.iter().find(|r| r["node"] == n);
        let after = (m + 1..=a.hosts).filter_map(node);
        let stall = after
            .map(|r| r["longest_gap_seconds"].as_f64().unwrap_or(f64::NAN))
            .fold(0.0, f64::max);
        let wire = rows
            .first()
            .and_then(|r| r["wire_bytes"].as_u64())
            .unwrap_or(0);
        let none = Value::Null;
        let again = if rejoined {
            node(m).ok_or(format!("no report of node {m}"))?
        } else {
            &none
        };
        check_copies_but(dir, "clink", a.hosts, want, (!rejoined).then_some(m))?;
        let row = json!({
            "bench": "cast-kill",
            "system": "clink-cast",
            "round": round,
            "hosts": a.hosts,
            "bytes": size,
            "rate_limit": rate,
            "transport": a.transport.key().unwrap_or("any"),
            "killed_node": m,
            "killed_at_bytes": killed_at,
            "stall_after_s": stall,
            "source_sent_ratio": wire as f64 / size as f64,
            "rejoined": rejoined && again["rejoined"] == true,
            "chunks_fetched": again["chunks"],
            "chunks_held": again["chunks_resumed"],
            "chain_seconds": rows.first().map(|r| r["chain_seconds"].clone()),
        });
        println!("{row}");
        if !a.json && !rejoined {
            println!(
                "round {round}: node {m} of {} killed at {} of {} MiB: the nodes after it \
                 stalled {stall:.2} s at most, the source sent {:.4}x the file; the cast ended \
                 before the restarted node could rejoin",
                a.hosts,
                killed_at >> 20,
                a.size_mib,
                wire as f64 / size as f64,
            );
        } else if !a.json {
            println!(
                "round {round}: node {m} of {} killed at {} of {} MiB and restarted: the nodes \
                 after it stalled {stall:.2} s at most, the source sent {:.4}x the file, the \
                 restarted node fetched {} chunks and held {}; every copy checked",
                a.hosts,
                killed_at >> 20,
                a.size_mib,
                wire as f64 / size as f64,
                again["chunks"],
                again["chunks_resumed"],
            );
        }
    }
    Ok(())
}

/// The kernel-TCP chain's seconds, its copies checked against `want` and removed.
fn relay(
    bridge: &Bridge,
    exe: &Path,
    dir: &Path,
    src: &Path,
    hosts: usize,
    want: &blake3::Hash,
) -> Result<Chain, String> {
    let chain = tcp_chain(bridge, exe, dir, src, hosts)?;
    check_copies(dir, "tcp", hosts, want)?;
    Ok(chain)
}

/// BLAKE3 of the file at `p`.
fn file_hash(p: &Path) -> Result<blake3::Hash, String> {
    let mut h = blake3::Hasher::new();
    let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    h.update_reader(f)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(h.finalize())
}

/// Checks the copies `{prefix}1` ..= `{prefix}{hosts}` in `dir` against the source's
/// hash `want`, then removes them.
fn check_copies(dir: &Path, prefix: &str, hosts: usize, want: &blake3::Hash) -> Result<(), String> {
    check_copies_but(dir, prefix, hosts, want, None)
}

/// As [`check_copies`], host `skip`'s copy (incomplete) removed unchecked.
fn check_copies_but(
    dir: &Path,
    prefix: &str,
    hosts: usize,
    want: &blake3::Hash,
    skip: Option<usize>,
) -> Result<(), String> {
    for i in 1..=hosts {
        let p = dir.join(format!("{prefix}{i}"));
        if Some(i) == skip {
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_file(p.with_extension("clinkcast"));
            continue;
        }
        let got = file_hash(&p)?;
        if got != *want {
            return Err(format!(
                "{}: BLAKE3 {} differs from the source's {}",
                p.display(),
                got.to_hex(),
                want.to_hex()
            ));
        }
        std::fs::remove_file(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

struct CleanDir(PathBuf);

impl Drop for CleanDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file of `size` pseudo-random bytes (xorshift64*, not compressible).
fn write_file(p: &Path, size: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(p)?);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for c in buf.chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// Seconds from the start of `clink cast send` until every host of the chain is done,
/// the model's rate for the chain (bytes per second) with every host on this machine's
/// cores, and the chunk size the source used.
fn clink_chain(
    b: &Bridge,
    exe: &Path,
    dir: &Path,
    src: &Path,
    a: &BenchArgs,
    net_bps: f64,
) -> Result<(Chain, f64, u64), String> {
    let (mut kids, addrs) = clink_receivers(b, exe, dir, a)?;
    let deadline = Instant::now() + RUN_TIMEOUT;
    let (mut s, mut out) = clink_source(b, exe, src, a, &addrs)?;
    let st = s.wait(deadline)?;
    for (k, _) in &mut kids {
        k.wait(deadline)?;
    }
    let mut text = String::new();
    let _ = out.read_to_string(&mut text);
    if !st.success() {
        return Err(format!("clink cast failed: {st}"));
    }
    for l in text.lines() {
        eprintln!("clink cast: {l}");
    }
    // The source's clock from its first chunk to the last node's report.
    let first: Value = text
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or("clink cast printed no report")?;
    let secs = first["chain_seconds"]
        .as_f64()
        .ok_or_else(|| "clink cast's report has no chain_seconds".to_string())?;
    let rows: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let chunk = first["chunk"].as_u64().unwrap_or(0);
    let cpu: Vec<f64> = rows[1..]
        .iter()
        .filter_map(|r| r["cpu_seconds"].as_f64())
        .collect();
    let chain = Chain {
        secs,
        cpu_s_per_gb: cpu_per_gb(&cpu, a.size_mib << 20)?,
    };
    Ok((chain, chain_prediction(&rows, net_bps, a), chunk))
}

/// A chain's run: its seconds, and its receivers' mean processor seconds per GB.
struct Chain {
    secs: f64,
    cpu_s_per_gb: f64,
}

/// The mean of the receivers' processor seconds `cpu` per GB of a file of `size` bytes.
fn cpu_per_gb(cpu: &[f64], size: u64) -> Result<f64, String> {
    if cpu.is_empty() {
        return Err("no receiver reported its processor time".into());
    }
    Ok(cpu.iter().sum::<f64>() / cpu.len() as f64 / (size as f64 / 1e9))
}

/// The model's rate for a chain whose hosts reported `rows` (the source's first, then
/// the receivers in chain order), all sharing this machine's cores, each network
/// direction priced at half of what a byte cost across the bridge (`net_bps`, both ends:
/// [`bridge_net_bps`]) rather than through the hosts' own loopback, capped by the link's
/// goodput.
fn chain_prediction(rows: &[Value], net_bps: f64, a: &BenchArgs) -> f64 {
    let last = rows.len().saturating_sub(1);
    let rates: Vec<f64> = rows
        .iter()
        .enumerate()
        .filter_map(|(k, r)| {
            let c = super::model::Costs::from_json(&r["costs"])?;
            let c = super::model::Costs { net_bps, ..c };
            Some(if k == 0 {
                // The source reads its file and sends it (hashed before the stream).
                c.predict(false, false, true, false, true, None)
            } else {
                c.predict(true, true, false, true, k < last, None)
            })
        })
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shared = super::model::shared_rate(&rates, cores);
    let link = a.rate.as_deref().and_then(super::model::parse_rate);
    link.map_or(shared, |l| shared.min(super::model::goodput(l)))
}

/// What a byte costs to cross the bridge over kernel TCP, both ends together (bytes per
/// CPU second): `size` bytes of zeros from host 0 to host 1, one process each (`cast
/// tcp-node`), their CPU seconds summed.
fn bridge_net_bps(b: &Bridge, exe: &Path, size: u64) -> Result<f64, String> {
    let mut cmd = b.command(1, exe);
    cmd.args(["cast", "tcp-node", "--report-cpu", "--file", "/dev/null"]);
    let (mut rk, mut rout) = Kid::spawn(cmd)?;
    let port = line(&mut rout)?;
    let mut cmd = b.command(0, exe);
    cmd.args([
        "cast",
        "tcp-node",
        "--source",
        "--report-cpu",
        "--file",
        "/dev/zero",
    ])
    .args(["--limit", &size.to_string()])
    .args(["--next", &format!("{}:{port}", b.addr(1))]);
    let (mut sk, mut sout) = Kid::spawn(cmd)?;
    let deadline = Instant::now() + RUN_TIMEOUT;
    for k in [&mut sk, &mut rk] {
        let st = k.wait(deadline)?;
        if !st.success() {
            return Err(format!("the bridge's TCP probe failed: {st}"));
        }
    }
    let secs = cpu_line(&mut sout)? + cpu_line(&mut rout)?;
    Ok(size as f64 / secs.max(1e-9))
}

/// The processor seconds a `cast tcp-node --report-cpu` printed when it was done.
fn cpu_line(out: &mut Out) -> Result<f64, String> {
    let l = line(out)?;
    l.strip_prefix("cpu ")
        .and_then(|v| v.parse().ok())
        .ok_or(format!(
            "a kernel-TCP host printed {l:?}, not its processor time"
        ))
}

/// Seconds from the start of the TCP source until every relay has written its file, and
/// the relays' processor time.
fn tcp_chain(
    b: &Bridge,
    exe: &Path,
    dir: &Path,
    src: &Path,
    hosts: usize,
) -> Result<Chain, String> {
    let mut kids = Vec::new();
    let mut next: Option<String> = None;
    // From the last host back, each told the address of the one after it.
    for i in (1..=hosts).rev() {
        let mut cmd = b.command(i, exe);
        cmd.args(["cast", "tcp-node", "--report-cpu", "--file"])
            .arg(dir.join(format!("tcp{i}")));
        if let Some(n) = &next {
            cmd.args(["--next", n]);
        }
        let (k, mut out) = Kid::spawn(cmd)?;
        let port = line(&mut out)?;
        next = Some(format!("{}:{port}", b.addr(i)));
        kids.push((k, out));
    }
    let mut cmd = b.command(0, exe);
    cmd.args([
        "cast",
        "tcp-node",
        "--source",
        "--next",
        next.as_deref().unwrap(),
        "--file",
    ])
    .arg(src);
    let t = Instant::now();
    let deadline = t + RUN_TIMEOUT;
    let (mut s, _out) = Kid::spawn(cmd)?;
    let st = s.wait(deadline)?;
    let mut cpu = Vec::new();
    for (k, out) in &mut kids {
        let st = k.wait(deadline)?;
        if !st.success() {
            return Err(format!("a TCP relay failed: {st}"));
        }
        cpu.push(cpu_line(out)?);
    }
    if !st.success() {
        return Err(format!("the TCP source failed: {st}"));
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(Chain {
        secs,
        cpu_s_per_gb: cpu_per_gb(&cpu, std::fs::metadata(src).map_or(0, |m| m.len()))?,
    })
}

/// One host of the kernel-TCP chain: the source sends its file; a relay prints its port,
/// accepts the upstream, and for each read writes the bytes to its file, then to the next.
pub fn tcp_node(a: TcpNodeArgs) -> Result<(), String> {
    tcp_node_run(&a)?;
    if a.report_cpu {
        println!("cpu {}", crate::bench::measure::process_cpu_secs());
    }
    Ok(())
}

fn tcp_node_run(a: &TcpNodeArgs) -> Result<(), String> {
    const BUF: usize = 4 << 20;
    let mut buf = vec![0u8; BUF];
    if a.source {
        let next = a.next.as_deref().ok_or("--source needs --next")?;
        let mut down = TcpStream::connect(next).map_err(|e| format!("{next}: {e}"))?;
        let mut f = std::fs::File::open(&a.file).map_err(|e| e.to_string())?;
        let mut left = a.limit.unwrap_or(u64::MAX);
        while left > 0 {
            let want = (left.min(BUF as u64)) as usize;
            let n = f.read(&mut buf[..want]).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            down.write_all(&buf[..n]).map_err(|e| e.to_string())?;
            left -= n as u64;
        }
        return Ok(());
    }
    let l = TcpListener::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    println!("{}", l.local_addr().map_err(|e| e.to_string())?.port());
    let _ = std::io::stdout().flush();
    let (mut up, _) = l.accept().map_err(|e| e.to_string())?;
    let mut down = match &a.next {
        Some(n) => Some(TcpStream::connect(n).map_err(|e| format!("{n}: {e}"))?),
        None => None,
    };
    let mut f = std::fs::File::create(&a.file).map_err(|e| e.to_string())?;
    loop {
        let n = up.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        f.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        if let Some(d) = &mut down {
            d.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        }
    }
}
