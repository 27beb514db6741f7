//! Harness of the compatibility suite: real programs run with and without the sockets
//! layer, in the four placements (both ends under clink, server only, client only,
//! neither), every process stopped by its PID when a test ends.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The library under test: `CLINK_PRELOAD_LIB`, or the debug build of this workspace.
pub fn lib() -> PathBuf {
    if let Some(p) = std::env::var_os("CLINK_PRELOAD_LIB") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let p = target.join("debug/libclink_preload.so");
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build -p clink-preload` first (.ci/test does)",
        p.display()
    );
    p.canonicalize().unwrap()
}

/// The path of an installed program; fails the test clearly when it is missing.
pub fn tool(name: &str) -> PathBuf {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
    {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed (.ci/run installs it from Debian's packages)");
}

/// Which ends run under the sockets layer.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    /// The server end.
    pub server: bool,
    /// The client end.
    pub client: bool,
}

/// The four placements every case runs in.
pub const PLACEMENTS: [Placement; 4] = [
    Placement {
        server: true,
        client: true,
    },
    Placement {
        server: true,
        client: false,
    },
    Placement {
        server: false,
        client: true,
    },
    Placement {
        server: false,
        client: false,
    },
];

/// A scratch directory for one test, removed at the end.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh directory named after the test.
    pub fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("clink-sockets-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    /// A path inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The statistics file of one run in placement `p` (`tag` tells runs of a test apart).
    pub fn stats(&self, p: Placement, tag: &str) -> PathBuf {
        self.path(&format!("stats-{}{}{tag}", p.server as u8, p.client as u8))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A command, under the sockets layer when `preload`, writing its statistics to `stats`.
pub fn command(program: &str, args: &[&str], preload: bool, stats: &Path) -> Command {
    let mut c = Command::new(tool(program));
    c.args(args);
    c.env_remove("LD_PRELOAD");
    if preload {
        c.env("LD_PRELOAD", lib()).env("CLINK_SOCKETS_STATS", stats);
    }
    c
}

/// Runs `program` with `args`, not under the sockets layer, and fails the test with its
/// error output unless it succeeds.
pub fn run_ok(program: &str, args: &[&str]) -> Output {
    let out = run(
        command(program, args, false, Path::new("/dev/null")),
        None,
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Writes C program `text` to `src` and compiles it to `bin`.
pub fn compile_c(text: &str, src: &Path, bin: &Path) {
    std::fs::write(src, text).unwrap();
    run_ok(
        "cc",
        &["-O1", "-o", bin.to_str().unwrap(), src.to_str().unwrap()],
    );
}

/// Two different free ports.
pub fn free_ports() -> (u16, u16) {
    let a = free_port();
    loop {
        let b = free_port();
        if b != a {
            return (a, b);
        }
    }
}

/// A process stopped (SIGKILL, by PID) and reaped when dropped.
pub struct Proc {
    /// The child.
    pub child: Child,
}

impl Proc {
    /// Starts `c` with its output discarded unless `log` is given.
    pub fn start(mut c: Command, log: Option<&Path>) -> Proc {
        match log {
            Some(p) => {
                let f = std::fs::File::create(p).unwrap();
                c.stdout(f.try_clone().unwrap()).stderr(f);
            }
            None => {
                c.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        c.stdin(Stdio::null());
        Proc {
            child: c.spawn().expect("spawn"),
        }
    }

    /// The process ID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Proc {
    /// Waits up to `limit` for the process to exit by itself and returns its status;
    /// fails the test if it is still running then.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(
                Instant::now() < end,
                "process {} still running after {limit:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asks the process to stop (SIGTERM) and waits up to 10 s for it: a server that forks
    /// workers (nginx) takes them down with it, which a SIGKILL of the parent would not.
    pub fn terminate(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: signalling our own child (not yet reaped) by its PID.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signalling our own child (not yet reaped) by its PID.
            unsafe { libc::kill(self.pid(), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// Runs `c` to completion within `limit`, with `input` on its stdin; kills it and fails
/// the test if it takes longer.
pub fn run(mut c: Command, input: Option<&Path>, limit: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    match input {
        Some(p) => c.stdin(std::fs::File::open(p).unwrap()),
        None => c.stdin(Stdio::null()),
    };
    let mut child = c.spawn().expect("spawn");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            // SAFETY: signalling our own child by its PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            panic!("{c:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// A TCP port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (bounded) until a port is in LISTEN state, without connecting to it (so
/// one-shot servers are not used up by the check).
pub fn wait_for_listen(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let want = format!("{port:04X}");
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let tcp6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
        // Field 1 is local "ADDR:PORT" in hex, field 3 the state (0A: LISTEN).
        let listening = tcp.lines().chain(tcp6.lines()).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].rsplit(':').next() == Some(want.as_str()) && f[3] == "0A"
        });
        if listening {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "port {port} not listening after 20 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded, 20 s) until the log at `path` contains `word`, a line a process
/// writes once it is where the test needs it; fails with `what` otherwise.
pub fn wait_for_log(path: &Path, word: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(word)
    {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The statistics lines the processes of a run wrote.
pub fn stats_lines(stats: &Path) -> Vec<String> {
    std::fs::read_to_string(stats)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Checks what the statistics say about the connections to `port`: both ends accelerated
/// when both ran under clink, and the end that did reporting the kernel when only one did.
pub fn check_placement(p: Placement, stats: &Path, port: u16) {
    let needle = format!("127.0.0.1:{port}");
    let ours = || -> Vec<String> {
        stats_lines(stats)
            .into_iter()
            .filter(|l| l.contains(&needle))
            .collect()
    };
    let mut lines = ours();
    if p.server && p.client {
        // Each end writes its line as it closes: a server still handling the client's
        // end-of-stream has not yet. Wait (bounded) for both.
        let end = Instant::now() + Duration::from_secs(10);
        while lines.len() < 2 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
            lines = ours();
        }
    }
    let accel = lines.iter().filter(|l| l.contains(": accelerated")).count();
    let kernel = lines.iter().filter(|l| l.contains(": kernel")).count();
    match (p.server, p.client) {
        // A connection closed before it carried a byte may close before pairing ends
        // (its ends then report the kernel, with nothing sent either way).
        (true, true) => {
            // Whether a line of the other end of the same connection says `what`.
            let mirror_has = |l: &String, what: &dyn Fn(&String) -> bool| {
                let label = l.split(": ").nth(1).unwrap_or_default();
                let ends = label.split(" -> ").collect::<Vec<_>>();
                let back = format!(": {} -> {}: ", ends.last().unwrap_or(&""), ends[0]);
                lines.iter().any(|m| m.contains(&back) && what(m))
            };
            let idle = |l: &String| {
                l.ends_with("kernel tx 0 rx 0")
                    || mirror_has(l, &|m| m.ends_with("ring tx 0 rx 0 kernel tx 0 rx 0"))
            };
            // A pairing that did not finish within its bounded wait (a loaded machine)
            // leaves that connection on kernel TCP: allowed for a few, as long as neither
            // end put a byte on the ring (the other end may have counted the pairing done).
            let fell_back = |l: &String| {
                l.contains("the peer had not answered") || l.contains("pairing refused")
            };
            let ring_bytes = |l: &String| {
                let w: Vec<&str> = l.split(' ').collect();
                w.windows(5)
                    .find(|x| x[0] == "ring" && x[1] == "tx" && x[3] == "rx")
                    .is_some_and(|x| x[2] != "0" || x[4] != "0")
            };
            let late = lines
                .iter()
                .filter(|l| !l.contains(": accelerated") && !idle(l))
                .collect::<Vec<_>>();
            assert!(
                accel >= 2
                    && late.len() * 4 <= lines.len()
                    && late
                        .iter()
                        .all(|l| fell_back(l) && !ring_bytes(l) && !mirror_has(l, &ring_bytes)),
                "{p:?}: expected accelerated ends (a few pairings too late allowed), got {lines:#?}"
            )
        }
        (false, false) => assert!(
            lines.is_empty(),
            "{p:?}: no end was under clink, got {lines:#?}"
        ),
        _ => assert!(
            accel == 0 && kernel >= 1,
            "{p:?}: expected kernel connections only, got {lines:#?}"
        ),
    }
}

/// Random bytes from a seeded generator.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The bound on every program a test runs.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The SHA-256 of `data`, by `sha256sum` (a program of its own, not the code under test).
pub fn sha256(data: &[u8], dir: &Scratch) -> String {
    let p = dir.path("sha-input");
    std::fs::write(&p, data).unwrap();
    let out = run(
        command("sha256sum", &[p.to_str().unwrap()], false, &p),
        None,
        LIMIT,
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
/// With both ends under clink: the server's end was accelerated, then left.
pub fn expect_left(p: Placement, stats: &Path) {
    if p.server && p.client {
        let lines = stats_lines(stats).join("\n");
        assert!(
            lines.contains("its descriptor left this process"),
            "{p:?}: the connection did not leave: {lines}"
        );
    }
}

/// Runs a Python client (arguments: the port) and checks the line it prints.
pub fn expect_output(p: Placement, client: &Path, port: &str, stats: &Path, want: &str) {
    let out = run(
        command(
            "python3",
            &[client.to_str().unwrap(), port],
            p.client,
            stats,
        ),
        None,
        LIMIT,
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(stdout.trim(), want, "{p:?}: {stderr}");
}

/// [`expect_output`] for a client that prints "match" when everything came back right.
pub fn expect_match(p: Placement, client: &Path, port: &str, stats: &Path) {
    expect_output(p, client, port, stats, "match");
}
