//! The event-driven server of CLAN section 5: one server endpoint with N client
//! connections (1 to 1000), against an epoll server over kernel TCP doing the same work,
//! measured by the same client code in the same run.
//!
//! Two threads pinned to CPUs 0 (server) and 1 (clients); the client thread owns all N
//! client endpoints (or sockets). A request is 64 bytes; the server answers each with a
//! 64-byte copy of it. Both servers busy-poll (the clink server spins in `wait_event`, the
//! TCP server in `epoll_wait` with a zero timeout) and both clients spin on their replies,
//! so neither side ever sleeps in the kernel: the comparison is of the data paths.
//!
//! - clink server: `wait_event` gives `Message { peer, tag }` (the endpoint's progress
//!   visits only the peers that raised their bit on its activity board), `recv` from that
//!   peer, `send` the answer.
//! - TCP server: level-triggered epoll over the N accepted sockets; `read` every ready
//!   socket, `write` one answer per complete request.
//!
//! The clink server uses its activity board from the first peer on (`CLINK_BOARD_PEERS=1`),
//! so every N runs the same code; system `clink-direct` is the default configuration at
//! N = 1 (rings polled directly below 4 peers), for reference.
//!
//! Rows (`experiment` = `event_server`, `endpoints` = N, `system` clink, clink-direct or
//! tcp):
//! - `rtt_idle`: round-trip time of one request at a time on one connection while the
//!   other N - 1 are connected and silent (the server must find it among N), median in
//!   microseconds (CLAN's latency against the number of endpoints);
//! - `rate`: requests per second (millions) with `INFLIGHT` requests outstanding over
//!   distinct connections;
//! - `rtt_busy`: the median round trip of the requests of the `rate` run (the server busy
//!   with the others).

use super::affinity::{spawn_thread, CLIENT_CPU, SERVER_CPU};
use super::stats;
use clink::events::{self, Event};
use clink::{Config, Context, Endpoint, PeerId, Selector};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const REQ: usize = 64;
const TAG_REQ: u64 = 0x7100;
const TAG_REP: u64 = 0x7101;
const TAG_STOP: u64 = 0x7102;
/// Requests in flight in the rate run (at most N).
const INFLIGHT: usize = 16;
const T: Option<Duration> = Some(Duration::from_secs(60));

/// One measured figure.
pub struct ServerRow {
    /// "clink" (the board from the first peer), "clink-direct" (the board threshold at its
    /// default of 4 peers, so rings polled directly; run at N = 1 only) or "tcp".
    pub system: &'static str,
    /// "rtt_idle", "rtt_busy" or "rate".
    pub variant: &'static str,
    /// Client connections.
    pub endpoints: usize,
    /// Median (microseconds or millions of requests per second).
    pub median: f64,
    /// p99 of the round trips (rtt rows; none for the rate, a single figure per run).
    pub p99: Option<f64>,
    /// Requests measured.
    pub iterations: u64,
}

impl ServerRow {
    /// The row as one JSON object.
    pub fn json(&self, pinned: bool, round: u64) -> String {
        json!({
            "system": self.system,
            "transport": if self.system == "tcp" { "tcp" } else { "shm" },
            "mode": "busy",
            "experiment": "event_server",
            "variant": self.variant,
            "metric": if self.variant == "rate" { "rate_mps" } else { "rtt_us" },
            "size": REQ,
            "endpoints": self.endpoints,
            "median": self.median,
            "p99": self.p99,
            "iterations": self.iterations,
            "pinned": pinned,
            "round": round,
            "placement": "host",
        })
        .to_string()
    }
}

/// `board`: the server uses its activity board from the first peer on (the same code path
/// at every N); otherwise from the default threshold (`CLINK_BOARD_PEERS` = 4 peers).
fn config(board: bool) -> Config {
    let d = super::rma::same_host_config();
    Config {
        board_peers: if board { 1 } else { d.board_peers },
        // Small rings: a thousand connections, each carrying one 64-byte request at a time.
        ring_cells: 256,
        ..d
    }
}

/// Raises the descriptor limit to its hard maximum (a thousand connections need several
/// thousand descriptors on each side).
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    if r.current != r.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: r.maximum,
                maximum: r.maximum,
            },
        );
    }
}

/// What the client measures: per-request round trips (ns) of the idle and busy runs and
/// the busy run's duration.
struct ClientResult {
    idle: Vec<f64>,
    busy: Vec<f64>,
    busy_secs: f64,
}

/// The client's side of a connection, for either system.
trait Conn {
    fn send(&mut self, req: &[u8; REQ]);
    /// Takes a complete reply if one is there.
    fn poll(&mut self, rep: &mut [u8; REQ]) -> bool;
}

/// Runs the idle and busy workloads over `conns`, checking every reply.
fn drive<C: Conn>(conns: &mut [C], iters: usize) -> ClientResult {
    let n = conns.len();
    let mut rep = [0u8; REQ];
    let mut req = [0u8; REQ];
    let mut idle = Vec::with_capacity(iters);
    for k in 0..iters {
        req[..8].copy_from_slice(&(k as u64).to_le_bytes());
        let t = Instant::now();
        conns[0].send(&req);
        while !conns[0].poll(&mut rep) {
            std::hint::spin_loop();
        }
        idle.push(t.elapsed().as_nanos() as f64);
        assert_eq!(rep, req, "wrong reply");
    }
    // Busy: INFLIGHT requests outstanding over distinct connections; a reply is followed
    // by a request on the next idle connection in turn (one request per connection at a
    // time: replies on a connection come in order).
    let k_in = INFLIGHT.min(n);
    let mut in_flight = vec![false; n];
    // (connection, request number, start)
    let mut slots: Vec<(usize, u64, Instant)> = Vec::with_capacity(k_in);
    let mut next_conn = 0usize;
    let mut sent = 0u64;
    let mut busy = Vec::with_capacity(iters);
    let total = iters as u64;
    let start = Instant::now();
    let mut issue = |conns: &mut [C], in_flight: &mut [bool]| {
        while in_flight[next_conn] {
            next_conn = (next_conn + 1) % n;
        }
        let c = next_conn;
        in_flight[c] = true;
        next_conn = (next_conn + 1) % n;
        let mut r = [0u8; REQ];
        r[..8].copy_from_slice(&sent.to_le_bytes());
        // The clock starts before the send, as in the idle loop.
        let t = Instant::now();
        conns[c].send(&r);
        sent += 1;
        (c, sent - 1, t)
    };
    for _ in 0..k_in {
        slots.push(issue(conns, &mut in_flight));
    }
    let mut done = 0u64;
    while done < total {
        let mut k = 0;
        while k < slots.len() {
            let (c, id, t) = slots[k];
            if !conns[c].poll(&mut rep) {
                k += 1;
                continue;
            }
            busy.push(t.elapsed().as_nanos() as f64);
            assert_eq!(
                u64::from_le_bytes(rep[..8].try_into().unwrap()),
                id,
                "wrong reply"
            );
            in_flight[c] = false;
            done += 1;
            if done + (slots.len() as u64) <= total {
                slots[k] = issue(conns, &mut in_flight);
                k += 1;
            } else {
                slots.swap_remove(k);
            }
        }
    }
    ClientResult {
        idle,
        busy,
        busy_secs: start.elapsed().as_secs_f64(),
    }
}

// ------------------------------------------------------------------ clink

struct ClinkConn {
    ep: Endpoint,
    peer: PeerId,
}

impl Conn for ClinkConn {
    fn send(&mut self, req: &[u8; REQ]) {
        self.ep.send(self.peer, TAG_REQ, req).expect("clink send");
    }
    fn poll(&mut self, rep: &mut [u8; REQ]) -> bool {
        // (`probe` runs a progress pass itself.)
        match self.ep.probe(Selector::exact(Some(self.peer), TAG_REP)) {
            Some(_) => {
                self.ep
                    .recv(Selector::exact(Some(self.peer), TAG_REP), rep)
                    .expect("clink reply");
                true
            }
            None => false,
        }
    }
}

fn clink_server(ep: &mut Endpoint) {
    ep.set_interest(events::MESSAGES);
    let mut buf = [0u8; REQ];
    loop {
        let Event::Message { peer, tag } = ep.wait_event(T).expect("server event") else {
            continue;
        };
        let st = ep
            .recv(Selector::exact(Some(peer), tag), &mut buf)
            .expect("server recv");
        if tag == TAG_STOP {
            return;
        }
        ep.send(peer, TAG_REP, &buf[..st.len as usize])
            .expect("server send");
    }
}

fn run_clink(pinned: bool, n: usize, iters: usize, board: bool) -> Result<ClientResult, String> {
    let ctx = Context::with_config(config(board)).map_err(|e| e.to_string())?;
    let mut server = ctx.endpoint().map_err(|e| e.to_string())?;
    let addr = server.address();
    let (tx, rx) = mpsc::channel();
    let st = spawn_thread("clink-server", pinned.then_some(SERVER_CPU), move || {
        for _ in 0..n {
            server.accept(T).expect("accept");
        }
        rx.recv().ok();
        clink_server(&mut server);
    });
    let ct = spawn_thread("clink-clients", pinned.then_some(CLIENT_CPU), move || {
        // Each client endpoint has one peer: the default (no board) whatever the server does.
        let cctx = Context::with_config(config(false)).expect("context");
        let mut conns: Vec<ClinkConn> = (0..n)
            .map(|_| {
                let mut ep = cctx.endpoint().expect("endpoint");
                let peer = ep.connect(&addr).expect("connect");
                ClinkConn { ep, peer }
            })
            .collect();
        tx.send(()).ok();
        let r = drive(&mut conns, iters);
        // Any connection stops the server; the others close with the client.
        let last = &mut conns[0];
        last.ep.send(last.peer, TAG_STOP, b"").expect("stop");
        r
    });
    let r = ct.join().map_err(|_| "clink client panicked".to_string())?;
    st.join().map_err(|_| "clink server panicked".to_string())?;
    Ok(r)
}

// ------------------------------------------------------------------ TCP + epoll

/// One end of a TCP connection carrying `REQ`-byte messages: the bytes of the one being
/// assembled.
struct Framed {
    s: TcpStream,
    got: usize,
    buf: [u8; REQ],
}

impl Framed {
    fn new(s: TcpStream) -> Framed {
        s.set_nodelay(true).expect("nodelay");
        s.set_nonblocking(true).expect("nonblocking");
        Framed {
            s,
            got: 0,
            buf: [0; REQ],
        }
    }

    /// Reads what is there; `Some` with a complete message, `None` for more to come.
    /// Errors on end of stream.
    fn try_frame(&mut self) -> std::io::Result<Option<[u8; REQ]>> {
        loop {
            match self.s.read(&mut self.buf[self.got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => {
                    self.got += k;
                    if self.got == REQ {
                        self.got = 0;
                        return Ok(Some(self.buf));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
}

impl Conn for Framed {
    fn send(&mut self, req: &[u8; REQ]) {
        self.s.write_all(req).expect("tcp send");
    }
    fn poll(&mut self, rep: &mut [u8; REQ]) -> bool {
        match self.try_frame().expect("tcp client read") {
            Some(m) => {
                *rep = m;
                true
            }
            None => false,
        }
    }
}

fn tcp_server(listener: TcpListener, n: usize) {
    let ep = clink::sys::Epoll::new().expect("epoll");
    let mut peers: Vec<Framed> = (0..n)
        .map(|i| {
            let (s, _) = listener.accept().expect("tcp accept");
            ep.add(s.as_raw_fd(), i as u64).expect("epoll add");
            Framed::new(s)
        })
        .collect();
    let mut ready = Vec::with_capacity(64);
    loop {
        ready.clear();
        ep.wait(&mut ready, Some(Duration::ZERO))
            .expect("epoll_wait");
        for &t in &ready {
            let p = &mut peers[t as usize];
            loop {
                match p.try_frame() {
                    Ok(Some(m)) => p.s.write_all(&m).expect("tcp server write"),
                    Ok(None) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return, // done
                    Err(e) => panic!("tcp server read: {e}"),
                }
            }
        }
    }
}

fn run_tcp(pinned: bool, n: usize, iters: usize) -> Result<ClientResult, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let st = spawn_thread("tcp-server", pinned.then_some(SERVER_CPU), move || {
        tcp_server(listener, n);
    });
    let ct = spawn_thread("tcp-clients", pinned.then_some(CLIENT_CPU), move || {
        let mut conns: Vec<Framed> = (0..n)
            .map(|_| Framed::new(TcpStream::connect(addr).expect("tcp connect")))
            .collect();
        drive(&mut conns, iters)
        // Dropping the sockets ends the server (it returns on the first end of stream).
    });
    let r = ct.join().map_err(|_| "tcp client panicked".to_string())?;
    st.join().map_err(|_| "tcp server panicked".to_string())?;
    Ok(r)
}

/// Runs both systems for each N in `endpoints` (`iters` requests per workload).
pub fn run(pinned: bool, endpoints: &[usize], iters: usize) -> Result<Vec<ServerRow>, String> {
    raise_fd_limit();
    let mut rows = Vec::new();
    for &n in endpoints {
        for system in ["tcp", "clink", "clink-direct"] {
            let r = match system {
                "clink" => run_clink(pinned, n, iters, true)?,
                "clink-direct" if n == 1 => run_clink(pinned, n, iters, false)?,
                "tcp" => run_tcp(pinned, n, iters)?,
                _ => continue,
            };
            let mut row = |variant, median, p99| {
                rows.push(ServerRow {
                    system,
                    variant,
                    endpoints: n,
                    median,
                    p99,
                    iterations: iters as u64,
                })
            };
            // Round trips in microseconds.
            let med = |v: &[f64]| stats::median(v).unwrap_or(f64::NAN) / 1000.0;
            let p99 = |v: &[f64]| stats::percentile(v, 99.0).map(|p| p / 1000.0);
            row("rtt_idle", med(&r.idle), p99(&r.idle));
            row("rtt_busy", med(&r.busy), p99(&r.busy));
            row("rate", iters as f64 / r.busy_secs / 1e6, None);
        }
    }
    Ok(rows)
}
