//! `clink bench --sockets`: unmodified programs over the sockets layer
//! (`libclink_preload.so`, both ends under it) beside the same programs over kernel
//! loopback TCP, in one run: sockperf ping-pong latency with spinning and with blocking
//! waits, iperf3 single-stream throughput, redis-benchmark GET and SET (as it runs by
//! default, one request in flight per client, and with pipelines of 16), nginx + wrk.
//! Every round runs each experiment both ways (order alternating by round); the report is
//! the median of the per-round ratios clink / kernel.

use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The experiments, in the order they run.
pub const EXPERIMENTS: [&str; 8] = [
    "sockperf-pp-spin",
    "sockperf-pp-block",
    "iperf3",
    "redis-get",
    "redis-set",
    "redis-get-pipelined",
    "redis-set-pipelined",
    "nginx-wrk",
];

/// redis-benchmark's requests in flight per client (`-P`) in `exp`: its default (1), or
/// 16 for the pipelined experiments.
fn redis_pipeline(exp: &str) -> &'static str {
    if exp.ends_with("-pipelined") {
        "16"
    } else {
        "1"
    }
}

/// How long a tool may take before the run fails.
const LIMIT: Duration = Duration::from_secs(120);

struct Server(Child);

impl Drop for Server {
    /// SIGTERM first, so that a server with workers (nginx) takes them down with it; then
    /// SIGKILL after 10 s. The PID is signalled only while the child is not yet reaped.
    fn drop(&mut self) {
        use rustix::process::{kill_process, Pid, Signal};
        let pid = Pid::from_child(&self.0);
        let end = Instant::now() + Duration::from_secs(10);
        let mut sig = Signal::TERM;
        while matches!(self.0.try_wait(), Ok(None)) {
            // (Our own child, not yet reaped: its PID is still its own.)
            let _ = kill_process(pid, sig);
            if Instant::now() > end {
                sig = Signal::KILL;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn tool(name: &str) -> Result<PathBuf, String> {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
    {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!("{name} is not installed (apt-get install sockperf iperf3 redis-server redis-tools nginx-light wrk)"))
}

fn command(name: &str, args: &[&str], lib: Option<&Path>, spin_us: u64) -> Result<Command, String> {
    let mut c = Command::new(tool(name)?);
    c.args(args)
        .env_remove("LD_PRELOAD")
        .env("CLINK_SOCKETS_SPIN_US", spin_us.to_string());
    if let Some(l) = lib {
        c.env("LD_PRELOAD", l);
    }
    Ok(c)
}

fn serve(c: Result<Command, String>) -> Result<Server, String> {
    let mut c = c?;
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Ok(Server(c.spawn().map_err(|e| format!("{c:?}: {e}"))?))
}

fn output(c: Result<Command, String>) -> Result<String, String> {
    let mut c = c?;
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("{c:?}: {e}"))?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            let text = reader.join().unwrap_or_default();
            if !st.success() {
                return Err(format!("{c:?} failed ({st}): {text}"));
            }
            return Ok(text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{c:?} took longer than {LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn wait_listen(port: u16) -> Result<(), String> {
    let want = format!("{port:04X}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].rsplit(':').next() == Some(want.as_str()) && f[3] == "0A"
        }) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nothing listens on port {port}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn after<'a>(text: &'a str, key: &str) -> Result<&'a str, String> {
    let i = text
        .find(key)
        .ok_or_else(|| format!("no {key:?} in: {text}"))?;
    Ok(text[i + key.len()..].trim_start())
}

fn number(text: &str, key: &str) -> Result<f64, String> {
    let rest = after(text, key)?;
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .map_err(|_| format!("no number after {key:?} in: {text}"))
}

/// One measurement: (value, unit, whether higher is better).
fn measure(
    exp: &str,
    lib: Option<&Path>,
    dir: &Path,
    secs: u64,
) -> Result<(f64, &'static str, bool), String> {
    let port = free_port()?;
    let ps = port.to_string();
    let t = secs.to_string();
    match exp {
        "sockperf-pp-spin" | "sockperf-pp-block" => {
            let spin = if exp.ends_with("spin") { 1_000_000 } else { 0 };
            let feed = dir.join("feed");
            std::fs::write(&feed, format!("T:127.0.0.1:{port}\n")).map_err(|e| e.to_string())?;
            let _s = serve(command(
                "sockperf",
                &["sr", "-f", feed.to_str().unwrap_or(""), "-F", "e"],
                lib,
                spin,
            ))?;
            wait_listen(port)?;
            let out = output(command(
                "sockperf",
                &[
                    "pp",
                    "--tcp",
                    "-i",
                    "127.0.0.1",
                    "-p",
                    &ps,
                    "-m",
                    "64",
                    "-t",
                    "1",
                    // Without a rate, sockperf bounds its sequence numbers by a guess that
                    // a spinning ping-pong below 1 us one-way overruns ("_seqN >
                    // m_maxSequenceNo"); a cap far above any ping-pong's rate paces nothing.
                    "--mps",
                    "5000000",
                ],
                lib,
                spin,
            ))?;
            Ok((number(&out, "Summary: Latency is")?, "us", false))
        }
        "iperf3" => {
            let _s = serve(command(
                "iperf3",
                &["-s", "-1", "-B", "127.0.0.1", "-p", &ps],
                lib,
                20,
            ))?;
            wait_listen(port)?;
            let out = output(command(
                "iperf3",
                &["-c", "127.0.0.1", "-p", &ps, "-t", &t, "-J"],
                lib,
                20,
            ))?;
            let v: serde_json::Value =
                serde_json::from_str(&out).map_err(|e| format!("iperf3 report: {e}"))?;
            let bps = v["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .ok_or("no iperf3 rate")?;
            Ok((bps / 1e9, "Gbit/s", true))
        }
        "redis-get" | "redis-set" | "redis-get-pipelined" | "redis-set-pipelined" => {
            let d = dir.to_str().unwrap_or("/tmp");
            let _s = serve(command(
                "redis-server",
                &[
                    "--port",
                    &ps,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    d,
                ],
                lib,
                20,
            ))?;
            wait_listen(port)?;
            let test = if exp.starts_with("redis-get") {
                "get"
            } else {
                "set"
            };
            let out = output(command(
                "redis-benchmark",
                &[
                    "-p",
                    &ps,
                    "-n",
                    "300000",
                    "-c",
                    "50",
                    "-P",
                    redis_pipeline(exp),
                    "-d",
                    "64",
                    "-t",
                    test,
                    "--csv",
                ],
                lib,
                20,
            ))?;
            // CSV: "test","rps",... then "GET","123456.78",...
            let line = out
                .lines()
                .find(|l| {
                    l.to_uppercase()
                        .starts_with(&format!("\"{}\"", test.to_uppercase()))
                })
                .ok_or_else(|| format!("no {test} line in: {out}"))?;
            let rps: f64 = line
                .split(',')
                .nth(1)
                .map(|s| s.trim_matches('"'))
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad line {line}"))?;
            Ok((rps, "req/s", true))
        }
        "nginx-wrk" => {
            let www = dir.join("www");
            std::fs::create_dir_all(&www).map_err(|e| e.to_string())?;
            std::fs::write(www.join("index.html"), "hello\n").map_err(|e| e.to_string())?;
            let conf = dir.join("nginx.conf");
            std::fs::write(
                &conf,
                format!(
                    "daemon off; master_process on; worker_processes 2; pid {d}/ng.pid; error_log {d}/err.log; user root;\n\
                     events {{}} http {{ sendfile on; access_log off;\n\
                     server {{ listen 127.0.0.1:{port}; root {w}; }} }}\n",
                    d = dir.display(),
                    w = www.display()
                ),
            )
            .map_err(|e| e.to_string())?;
            let _s = serve(command(
                "nginx",
                &[
                    "-p",
                    dir.to_str().unwrap_or("/tmp"),
                    "-c",
                    conf.to_str().unwrap_or(""),
                ],
                lib,
                20,
            ))?;
            wait_listen(port)?;
            let url = format!("http://127.0.0.1:{port}/index.html");
            let dur = format!("{secs}s");
            let out = output(command(
                "wrk",
                &["-t2", "-c32", &format!("-d{dur}"), &url],
                lib,
                20,
            ))?;
            if out.contains("Socket errors") || out.contains("Non-2xx") {
                return Err(format!("wrk reported errors: {out}"));
            }
            Ok((number(&out, "Requests/sec:")?, "req/s", true))
        }
        _ => Err(format!("unknown experiment {exp}")),
    }
}

/// Runs the comparison: `rounds` rounds of every experiment, both ways.
pub fn run(rounds: u64, quick: bool, json: bool) -> Result<(), String> {
    let lib = crate::run::library(None)?;
    let secs = if quick { 1 } else { 3 };
    let dir = std::env::temp_dir().join(format!("clink-bench-sockets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); EXPERIMENTS.len()];
    let mut values: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; EXPERIMENTS.len()];
    let mut units = [""; EXPERIMENTS.len()];
    for round in 0..rounds.max(1) {
        for (i, exp) in EXPERIMENTS.iter().enumerate() {
            let order: [bool; 2] = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            let mut got = [0.0f64; 2];
            for clink in order {
                let (v, unit, higher) = measure(exp, clink.then_some(lib.as_path()), &dir, secs)?;
                units[i] = unit;
                got[clink as usize] = v;
                let system = if clink { "clink-sockets" } else { "kernel-tcp" };
                if json {
                    println!(
                        "{}",
                        json!({"experiment": exp, "system": system, "round": round, "value": v, "unit": unit, "higher_is_better": higher})
                    );
                }
                values[i][clink as usize].push(v);
            }
            // The ratio is "times better": clink/kernel for rates, kernel/clink for latency.
            let higher = !exp.starts_with("sockperf");
            let r = if higher {
                got[1] / got[0]
            } else {
                got[0] / got[1]
            };
            ratios[i].push(r);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if !json {
        println!(
            "{:<20} {:>14} {:>14} {:>8}  (median of {} rounds; ratio = times better, per round)",
            "experiment",
            "kernel TCP",
            "clink",
            "ratio",
            rounds.max(1)
        );
        for (i, exp) in EXPERIMENTS.iter().enumerate() {
            let med = |v: &[f64]| super::stats::median(v).unwrap_or(f64::NAN);
            println!(
                "{:<20} {:>10.2} {:<3} {:>10.2} {:<3} {:>8.2}",
                exp,
                med(&values[i][0]),
                units[i],
                med(&values[i][1]),
                units[i],
                med(&ratios[i])
            );
        }
    }
    Ok(())
}
