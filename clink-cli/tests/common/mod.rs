//! Helpers of the `clink cast` tests: a bridge of namespace hosts, temporary directories,
//! seeded file contents, and `clink cast` children that are always killed and reaped.
#![allow(dead_code)] // each test binary uses a different subset

use clink_testbed::{Bridge, BridgeSpec};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound on any wait for a child.
pub const T: Duration = Duration::from_secs(60);
pub const MIB: usize = 1 << 20;
/// The most 1 MiB chunks a node keeps in memory for a next node that is behind: two
/// windows of 6 and 16 MiB more.
pub const LAG_CHUNKS: u64 = 2 * 6 + 16;

/// Size of the main test's file: 64 MiB optimised, less in a debug build.
pub fn big() -> usize {
    if cfg!(debug_assertions) {
        24 * MIB
    } else {
        64 * MIB
    }
}

pub fn bridge(rate: Option<&str>) -> Bridge {
    bridge_of(4, rate)
}

/// A source and `hosts - 1` receivers' hosts on one bridge.
pub fn bridge_of(hosts: usize, rate: Option<&str>) -> Bridge {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
    Bridge::create(&BridgeSpec {
        hosts,
        rate: rate.map(String::from),
        ..BridgeSpec::default()
    })
    .expect("bridge")
}

/// Seeded pseudo-random bytes (xorshift64*).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("clink-cast-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `clink cast` child, killed by PID and reaped on drop; its stdout lines and its
/// whole stderr collected by threads.
pub struct Proc {
    pub child: Option<Child>,
    pub lines: mpsc::Receiver<String>,
    pub err: Option<std::thread::JoinHandle<String>>,
    pub out: Vec<String>,
    pub name: String,
}

impl Proc {
    pub fn spawn(mut cmd: Command, name: &str, stdin: bool) -> Proc {
        cmd.env("CLINK_CALIBRATE", "0")
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn clink");
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Proc {
            child: Some(child),
            lines,
            err: Some(err),
            out: Vec::new(),
            name: name.to_string(),
        }
    }

    /// The next stdout line, within `T`.
    pub fn line(&mut self) -> String {
        let l = self
            .lines
            .recv_timeout(T)
            .unwrap_or_else(|e| panic!("{}: no output line within {T:?}: {e}", self.name));
        self.out.push(l.clone());
        l
    }

    pub fn stdin(&mut self) -> std::process::ChildStdin {
        self.child.as_mut().unwrap().stdin.take().unwrap()
    }

    /// Kills the child if it still runs; returns its stderr.
    pub fn stop(&mut self) -> String {
        self.kill();
        self.err
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits up to `T` for the exit; returns its status, stdout and stderr. Kills the
    /// child and panics on timeout.
    pub fn finish(&mut self) -> (ExitStatus, String, String) {
        let c = self.child.as_mut().expect("already finished");
        let deadline = Instant::now() + T;
        let st = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            if Instant::now() >= deadline {
                let err = self.stop();
                panic!(
                    "{} did not exit within {T:?}; its stderr:\n{err}",
                    self.name
                );
            }
            // Polling for the exit only.
            std::thread::sleep(Duration::from_millis(5));
        };
        self.child = None;
        let err = self.err.take().unwrap().join().unwrap();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.out.push(l);
        }
        (st, self.out.join("\n"), err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_clink")
}

/// Starts receivers on hosts 1..=3 writing to `dir/outN` (extra arguments per host);
/// returns them and their addresses.
pub fn receivers(b: &Bridge, dir: &Path, extra: &[&[&str]]) -> (Vec<Proc>, Vec<String>) {
    receivers_of(3, b, dir, extra)
}

/// `n` receivers on hosts 1 to `n`, writing `out1`...
pub fn receivers_of(
    n: usize,
    b: &Bridge,
    dir: &Path,
    extra: &[&[&str]],
) -> (Vec<Proc>, Vec<String>) {
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for i in 1..=n {
        let extra = extra.get(i - 1).copied().unwrap_or(&[]);
        let mut cmd = b.command(i, exe());
        cmd.args(["cast", "recv", "--json"]);
        if !extra.contains(&"--out") {
            cmd.arg("--out").arg(dir.join(format!("out{i}")));
        }
        cmd.args(extra);
        let mut p = Proc::spawn(cmd, &format!("receiver on host {i}"), false);
        let a = p.line();
        assert!(a.starts_with("clink:"), "receiver {i} printed {a:?}");
        addrs.push(a);
        procs.push(p);
    }
    (procs, addrs)
}

pub fn sender(b: &Bridge, file: &str, addrs: &[String], extra: &[&str], stdin: bool) -> Proc {
    let mut cmd = b.command(0, exe());
    cmd.args(["cast", "send", file, "--to", &addrs.join(",")])
        .args(extra);
    Proc::spawn(cmd, "source on host 0", stdin)
}

/// Casts `data` (from a file, or through stdin) to three receivers and checks every copy.
pub fn cast_and_compare(name: &str, data: &[u8], extra: &[&str], via_stdin: bool) {
    let b = bridge(None);
    let dir = TempDir::new(name);
    let src = dir.0.join("source.bin");
    std::fs::write(&src, data).unwrap();
    let (mut rx, addrs) = receivers(&b, &dir.0, &[]);
    let start = Instant::now();
    let mut s = if via_stdin {
        let mut s = sender(&b, "-", &addrs, &["--json"], true);
        let mut w = s.stdin();
        let d = data.to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&d);
        });
        s
    } else {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        sender(&b, src.to_str().unwrap(), &addrs, &args, false)
    };
    let (st, out, err) = s.finish();
    if !st.success() {
        let nodes: Vec<String> = rx
            .iter_mut()
            .enumerate()
            .map(|(i, p)| {
                let (st, o, e) = p.finish();
                format!("receiver {}: {st}\n{o}\n{e}", i + 1)
            })
            .collect();
        panic!(
            "cast failed: {st}\nstdout:\n{out}\nstderr:\n{err}\n{}",
            nodes.join("\n")
        );
    }
    println!(
        "{name}: {} bytes to 3 receivers in {:?}\n{out}",
        data.len(),
        start.elapsed()
    );
    let want = blake3::hash(data).to_hex().to_string();
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "one row per node and the source:\n{out}");
    for r in &rows {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["bytes"].as_u64(), Some(data.len() as u64), "{r}");
        assert_eq!(r["root"].as_str(), Some(want.as_str()), "{r}");
    }
    // The source sent the file once, and says how much of what it sent was resent.
    let wire = rows[0]["wire_bytes"]
        .as_u64()
        .expect("the source's wire bytes");
    let resent = rows[0]["wire_bytes_resent"]
        .as_u64()
        .expect("its resent bytes");
    assert!(wire >= data.len() as u64 && resent <= wire, "{}", rows[0]);
    for (i, p) in rx.iter_mut().enumerate() {
        let (st, out, err) = p.finish();
        assert!(st.success(), "receiver {}: {st}\n{out}\n{err}", i + 1);
        let got = std::fs::read(dir.0.join(format!("out{}", i + 1))).unwrap();
        assert!(
            got == data,
            "receiver {}: its file ({} bytes) differs from the source ({} bytes)",
            i + 1,
            got.len(),
            data.len()
        );
    }
}
