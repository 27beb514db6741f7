//! Helpers shared by the integration tests: child processes that are always reaped, a
//! seeded RNG, deterministic message contents, and endpoint set-up.
//!
//! Multi-process pattern: a test re-executes its own test binary as the peer process,
//! running only the test named [`CHILD_ENTRY`] with `CLINKTEST_ROLE` set; that test calls
//! [`child_main`], which dispatches on the role (and returns at once in a normal run).
//! The variables are not named `CLINK_*` because `Config::from_env` rejects unknown ones.
#![allow(dead_code)] // each test binary uses a different subset

pub mod udp;

use clink::{Config, Context, Endpoint, PeerId, Selector};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Name of the `#[test]` function every multi-process test file defines as the child's
/// entry point.
pub const CHILD_ENTRY: &str = "child_entry";
/// Role of the child process (unset in the normal test run).
pub const ROLE_VAR: &str = "CLINKTEST_ROLE";
/// Address of the parent's endpoint, for the child to connect to.
pub const ADDR_VAR: &str = "CLINKTEST_ADDR";
/// Seed of the run, passed to the child.
pub const SEED_VAR: &str = "CLINKTEST_SEED";
/// Generous bound on any single wait in the tests.
pub const T: Duration = Duration::from_secs(20);

/// A context for the test process: built-in cost figures (no calibration, which takes time).
pub fn ctx() -> Context {
    ctx_with(Config {
        calibrate: false,
        ..Config::default()
    })
}

/// The parent's context of a test that runs over shared memory (`net` false) or over UDP
/// on loopback even on one host (`net` true); the child gets [`transport_env`].
pub fn transport_ctx(net: bool) -> Context {
    if !net {
        return ctx();
    }
    ctx_with(net_config())
}

/// UDP on loopback even on one host, no calibration (see [`transport_ctx`]).
#[allow(dead_code)] // (not every test binary uses it)
pub fn net_config() -> Config {
    Config {
        calibrate: false,
        force_net: true,
        udp: Some(clink::config::UdpConfig {
            bind: (std::net::Ipv4Addr::LOCALHOST, 0).into(),
            ..Default::default()
        }),
        ..Config::default()
    }
}

/// The child's environment matching [`transport_ctx`].
pub fn transport_env(net: bool) -> Vec<(&'static str, &'static str)> {
    if net {
        vec![
            ("CLINK_TRANSPORT", "udp"),
            ("CLINK_UDP_BIND", "127.0.0.1:0"),
        ]
    } else {
        vec![]
    }
}

/// A context with the given configuration.
pub fn ctx_with(config: Config) -> Context {
    Context::with_config(config).expect("context")
}

/// The seed for this run: `CLINKTEST_SEED` if set, else `default`. Printed so a failure can
/// be replayed.
pub fn seed(default: u64) -> u64 {
    let s = std::env::var(SEED_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    println!("seed = {s} (replay with {SEED_VAR}={s})");
    s
}

/// A child process running this test binary in some role; killed (by PID) and reaped when
/// dropped, so no test leaves a process behind, whatever happens.
pub struct ChildProc {
    child: Option<Child>,
    role: String,
}

/// Starts this test binary as a child in `role`, connecting to `addr`, with extra
/// environment variables (e.g. `CLINK_CMA=off`). Children never calibrate.
pub fn spawn(role: &str, addr: &str, seed: u64, env: &[(&str, &str)]) -> ChildProc {
    let exe = std::env::current_exe().expect("current_exe");
    spawn_with(Command::new(exe), role, addr, seed, env)
}

/// As [`spawn`], with `cmd` the command that runs this test binary (e.g. wrapped in
/// `ip netns exec`).
pub fn spawn_with(
    mut cmd: Command,
    role: &str,
    addr: &str,
    seed: u64,
    env: &[(&str, &str)],
) -> ChildProc {
    cmd.args([CHILD_ENTRY, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role)
        .env(ADDR_VAR, addr)
        .env(SEED_VAR, seed.to_string())
        .env("CLINK_CALIBRATE", "0")
        .stdin(Stdio::null())
        // The child's harness chatter is noise; its panics go to stderr, which is kept.
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn child test process");
    ChildProc {
        child: Some(child),
        role: role.to_string(),
    }
}

impl ChildProc {
    /// Process id of the child.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Waits up to `timeout` for the child to exit by itself and returns its status; kills
    /// it and panics on timeout.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("child already reaped");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                self.child = None;
                return st;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                panic!("child '{}' did not exit within {timeout:?}", self.role);
            }
            // Polling for process exit only; no correctness depends on this pause.
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits for the child to exit and asserts it succeeded.
    pub fn expect_success(&mut self, timeout: Duration) {
        let st = self.wait(timeout);
        assert!(st.success(), "child '{}' failed: {st}", self.role);
    }

    /// Sends SIGKILL (now) without reaping.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            c.kill().expect("kill child");
        }
    }

    /// Reaps a killed child.
    pub fn reap(&mut self) -> ExitStatus {
        let st = self
            .child
            .as_mut()
            .expect("child already reaped")
            .wait()
            .expect("wait");
        self.child = None;
        st
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// In the child entry test: runs `f(role)` when this process is a child, else returns.
pub fn child_main(f: impl FnOnce(&str)) {
    if let Ok(role) = std::env::var(ROLE_VAR) {
        let start = Instant::now();
        f(&role);
        let el = start.elapsed();
        if el > T / 2 {
            eprintln!("note: child '{role}' took {el:?}");
        }
    }
}

/// In a child: the seed given by the parent.
pub fn child_seed() -> u64 {
    std::env::var(SEED_VAR)
        .expect("seed variable")
        .parse()
        .expect("seed")
}

/// In a child: a context from the environment (the parent set `CLINK_CALIBRATE=0` and
/// whatever else the test needs), an endpoint, and the parent as a connected peer.
pub fn child_connect() -> (Endpoint, PeerId) {
    let ctx = Context::new().expect("child context from CLINK_* variables");
    let mut ep = ctx.endpoint().expect("child endpoint");
    let addr = std::env::var(ADDR_VAR).expect("address variable");
    let peer = ep.connect(&addr).expect("child connects to parent");
    (ep, peer)
}

/// Receives exactly one message with `tag` from `peer` into a fresh buffer of `cap` bytes.
pub fn recv_vec(ep: &mut Endpoint, peer: PeerId, tag: u64, cap: usize) -> Vec<u8> {
    let mut buf = vec![0u8; cap];
    let st = ep
        .recv_timeout(Selector::exact(Some(peer), tag), &mut buf, Some(T))
        .unwrap_or_else(|e| panic!("recv tag {tag}: {e}"));
    buf.truncate(st.len as usize);
    buf
}

/// xorshift64* generator: small, fast, deterministic.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix(seed) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }
    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// SplitMix64 finaliser: a good 64-bit mix.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Key of message `seq` in a run with `seed`: the contents are derived from it.
pub fn key(seed: u64, seq: u64) -> u64 {
    seed ^ seq.wrapping_mul(0xd6e8_feb8_6659_fd93)
}

/// Fills `buf` with the deterministic contents of the message with key `k`.
pub fn fill(k: u64, buf: &mut [u8]) {
    let mut w = splitmix(k);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&w.to_le_bytes());
        w = w.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(k | 1);
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&w.to_le_bytes()[..n]);
}

/// A fresh buffer of `len` bytes with the contents of key `k`.
pub fn pattern(k: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(k, &mut v);
    v
}

/// Index of the first byte of `buf` that differs from the contents of key `k`, if any.
pub fn mismatch(k: u64, buf: &[u8]) -> Option<usize> {
    let mut w = splitmix(k);
    let mut chunks = buf.chunks_exact(8);
    let mut off = 0;
    for c in &mut chunks {
        if c != w.to_le_bytes() {
            let b = w.to_le_bytes();
            return Some(off + (0..8).find(|&i| c[i] != b[i]).unwrap_or(0));
        }
        w = w.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(k | 1);
        off += 8;
    }
    let rest = chunks.remainder();
    let b = w.to_le_bytes();
    (0..rest.len()).find(|&i| rest[i] != b[i]).map(|i| off + i)
}

/// Panics with a precise message when `buf` does not hold the contents of key `k`.
#[track_caller]
pub fn check(k: u64, buf: &[u8], what: &str) {
    if let Some(i) = mismatch(k, buf) {
        panic!(
            "{what}: content mismatch at byte {i} of {} (got {:#04x})",
            buf.len(),
            buf[i]
        );
    }
}

/// Connects two endpoints of contexts made by `ctx` (the client in another thread) over
/// `transport` on loopback, which the address must offer and both sides must pick:
/// (server, its peer id for the client), (client, its peer id for the server).
pub fn connect_pair(
    ctx: impl Fn() -> Context + Clone + Send + 'static,
    transport: &'static str,
) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
    let mut a = ctx().endpoint().unwrap();
    let addr = a.address();
    assert!(addr.contains(&format!(";{transport}=127.0.0.1:")), "{addr}");
    let client_ctx = ctx.clone();
    let client = std::thread::spawn(move || {
        let mut b = client_ctx().endpoint().unwrap();
        let p = b.connect(&addr).unwrap();
        assert_eq!(b.transport(p).unwrap(), transport);
        (b, p)
    });
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(a.transport(pa).unwrap(), transport);
    ((a, pa), client.join().unwrap())
}

/// Echo server: returns every message from `peer` with its tag until tag 0 (answered, so
/// the client keeps progressing, and retransmitting over UDP, until this side has
/// everything; then it closes, lingering until the answer is out, and stops).
pub fn echo(mut ep: Endpoint, peer: PeerId) -> Endpoint {
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let st = match ep.recv_timeout(
            Selector {
                src: Some(peer),
                tag: 0,
                mask: 0,
            },
            &mut buf,
            Some(T),
        ) {
            Ok(st) => st,
            Err(e) => panic!(
                "echo: {e}: {:?} last error {:?}",
                ep.stats(),
                ep.last_error()
            ),
        };
        if st.tag == 0 {
            ep.send(peer, 0, &[]).unwrap();
            // Nobody progresses this endpoint afterwards.
            ep.close();
            return ep;
        }
        ep.send(peer, st.tag, &buf[..st.len as usize]).unwrap();
    }
}

/// Joins the thread running [`echo`] while driving `ep`, its client: the server's close
/// lingers until its goodbye is acknowledged, which takes this side's progress.
#[allow(dead_code)] // (not every test binary uses it)
pub fn join_echo(ep: &mut Endpoint, server: std::thread::JoinHandle<Endpoint>) -> Endpoint {
    drive_until(ep, T, "the echo server's close", |_| server.is_finished());
    server.join().expect("the echo server")
}

/// Calls `ep.progress()` until `cond` holds; panics after `timeout`.
pub fn drive_until(
    ep: &mut Endpoint,
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut(&mut Endpoint) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !cond(ep) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        ep.progress();
        std::hint::spin_loop();
    }
}

/// Fails the test with the reason when network namespaces cannot be made here (they need
/// root and iproute2): such a test never passes without running.
#[allow(dead_code)] // (not every test binary uses it)
pub fn require_netns() {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
}

/// Runs `f` on a thread inside network namespace `ns` (a name under /var/run/netns) with
/// an endpoint made there from `config`; returns its address and the thread.
#[allow(dead_code)] // (not every test binary uses it)
pub fn in_netns<R: Send + 'static>(
    ns: &str,
    config: Config,
    f: impl FnOnce(Endpoint) -> R + Send + 'static,
) -> (String, std::thread::JoinHandle<R>) {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{ns}");
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).expect("open namespace");
        // SAFETY: setns on this thread only, with a namespace fd we hold open.
        let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        let ep = Context::with_config(config).unwrap().endpoint().unwrap();
        tx.send(ep.address()).unwrap();
        f(ep)
    });
    (rx.recv_timeout(T).expect("endpoint address"), h)
}

/// B stays away from its endpoint (no call) for `away` while A waits with a 4 MiB
/// rendezvous send to B outstanding and a receive from B posted; then B calls in again
/// (on a thread of its own: A must progress to move the payload), receives the payload
/// intact and answers. Neither may declare the other dead. Returns B's endpoint.
#[allow(dead_code)] // (not every test binary uses it)
pub fn away_and_back(
    a: &mut Endpoint,
    pa: PeerId,
    mut b: Endpoint,
    pb: PeerId,
    away: Duration,
) -> Endpoint {
    let big = pattern(5, 4 << 20);
    let s = a.isend(pa, 5, big.clone()).unwrap();
    let r = a
        .irecv(Selector::exact(Some(pa), 6), vec![0u8; 16])
        .unwrap();
    assert!(matches!(
        a.wait_recv(&r, Some(away)),
        Err(clink::Error::Timeout)
    ));
    assert!(a.is_alive(pa), "{:?}", a.last_error());
    let back = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4 << 20];
        let st = b
            .recv_timeout(Selector::exact(Some(pb), 5), &mut buf, Some(T))
            .unwrap_or_else(|e| panic!("{e}: {:?}", b.last_error()));
        assert_eq!(st.len, 4 << 20);
        assert!(buf == big, "payload damaged");
        b.send(pb, 6, b"back").unwrap();
        assert!(b.is_alive(pb), "{:?}", b.last_error());
        b
    });
    a.wait_send(&s, Some(T))
        .unwrap_or_else(|e| panic!("{e}: {:?}", a.last_error()));
    let got = a.wait_recv(&r, Some(T)).unwrap();
    assert_eq!(&got.buf[..got.status.len as usize], b"back");
    back.join().unwrap()
}

/// A stays away from its endpoint (no call) for three times `dead`, the liveness
/// timeout, while B streams 200 eager messages of 60 KiB at it with blocking sends; then
/// A receives them all, in order. Neither may declare the other dead. Returns how long
/// B's sends were held back.
#[allow(dead_code)] // (not every test binary uses it)
pub fn stream_to_an_away_receiver(
    (mut a, pa): (Endpoint, PeerId),
    (mut b, pb): (Endpoint, PeerId),
    dead: Duration,
) -> Duration {
    let n = 200u64;
    let receiver = std::thread::spawn(move || {
        // Computing: no call into clink.
        std::thread::sleep(dead * 3);
        let mut buf = vec![0u8; 60 << 10];
        for i in 0..n {
            let st = a
                .recv_timeout(Selector::exact(Some(pa), 1), &mut buf, Some(T))
                .unwrap_or_else(|e| panic!("message {i}: {e}: {:?}", a.last_error()));
            assert_eq!(st.len, 60 << 10);
            assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), i);
        }
        a
    });
    let mut msg = vec![7u8; 60 << 10];
    let t = Instant::now();
    for i in 0..n {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        b.send(pb, 1, &msg).unwrap_or_else(|e| {
            panic!(
                "send {i} after {:?}: {e}; {:?}",
                t.elapsed(),
                b.last_error()
            )
        });
    }
    let blocked = t.elapsed();
    println!("the sends were held {blocked:?}");
    let a = receiver.join().unwrap();
    assert!(b.is_alive(pb), "{:?}", b.last_error());
    assert!(a.is_alive(pa), "{:?}", a.last_error());
    blocked
}

/// B sends a last message and closes; A receives it, then its receives from B fail with
/// `PeerDead` well before any timeout: a posted one, and an in-place one (which waited
/// out its timeout before).
#[allow(dead_code)] // (not every test binary uses it)
pub fn close_is_delivered((mut a, pa): (Endpoint, PeerId), (mut b, pb): (Endpoint, PeerId)) {
    b.send(pb, 1, b"last words").unwrap();
    b.close();
    // The goodbye arrives well before the liveness timeout would have said it.
    last_words_then_gone(&mut a, pa, 1, Duration::from_secs(1));
    let t = Instant::now();
    let r = a
        .recv_in_place(Selector::exact(Some(pa), 2), Some(Duration::from_secs(5)))
        .map(|g| g.status());
    assert!(matches!(r, Err(clink::Error::PeerDead(_))), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

/// A receives "last words" from `pa` with `tag`, then a receive posted for `tag + 1` fails
/// with `PeerDead` within `within`: the peer's last message came before its end.
#[allow(dead_code)] // (not every test binary uses it)
pub fn last_words_then_gone(a: &mut Endpoint, pa: PeerId, tag: u64, within: Duration) {
    let mut buf = [0u8; 32];
    let st = a
        .recv_timeout(Selector::exact(Some(pa), tag), &mut buf, Some(T))
        .unwrap();
    assert_eq!(&buf[..st.len as usize], b"last words");
    let r = a
        .irecv(Selector::exact(Some(pa), tag + 1), vec![0u8; 8])
        .unwrap();
    let got = a.wait_recv(&r, Some(within)).map(|m| m.status);
    assert!(matches!(got, Err(clink::Error::PeerDead(_))), "{got:?}");
}

/// B queues 1000 eager messages of 8 KiB for A (non-blocking sends: far more than the
/// kernel takes while A reads nothing) and closes at once, while A stays away from its
/// endpoint for `away` (less than the liveness timeout); then A receives all of them, in
/// order, and the peer's end after them. Returns how long B's close took.
#[allow(dead_code)] // (not every test binary uses it)
pub fn close_delivers_a_backlog(
    (mut a, pa): (Endpoint, PeerId),
    (mut b, pb): (Endpoint, PeerId),
    away: Duration,
) -> Duration {
    let (n, size) = (1000u64, 8 << 10);
    let receiver = std::thread::spawn(move || {
        std::thread::sleep(away);
        let mut buf = vec![0u8; size];
        for i in 0..n {
            let st = a
                .recv_timeout(Selector::exact(Some(pa), 1), &mut buf, Some(T))
                .unwrap_or_else(|e| panic!("message {i}: {e}: {:?}", a.last_error()));
            assert_eq!(st.len as usize, size);
            assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), i);
        }
        let r = a.recv_timeout(Selector::exact(Some(pa), 1), &mut buf, Some(T));
        assert!(matches!(r, Err(clink::Error::PeerDead(_))), "{r:?}");
    });
    let mut sends = Vec::new();
    for i in 0..n {
        let mut msg = vec![7u8; size];
        msg[..8].copy_from_slice(&i.to_le_bytes());
        sends.push(b.isend(pb, 1, msg).unwrap());
    }
    let t = Instant::now();
    b.close();
    let took = t.elapsed();
    println!("close took {took:?}");
    receiver.join().unwrap();
    took
}

/// The example `name` cargo built beside this test (`cargo test` builds the examples).
pub fn example(name: &str) -> std::path::PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing (cargo test builds the examples)",
        path.display()
    );
    path
}
