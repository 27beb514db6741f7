//! Failures: a peer killed (SIGKILL) in the middle of a large pipelined rendezvous, or
//! while the parent waits on a rendezvous send to it, makes the pending operations fail
//! with `Error::PeerDead` (the detection time is printed, not asserted); a peer that exits
//! without closing still has its sent eager messages delivered (over UDP and TCP too,
//! those that reached this host), then receives from it fail;
//! kill -9 leaves nothing named in /dev/shm or under /tmp and no listening socket; the
//! endpoint keeps serving another peer after one dies, and notices a death while another
//! peer streams to it; bad addresses and bad `CLINK_*`
//! values give clear errors; connecting to an endpoint whose process is gone fails with
//! `Error::Connect` at once.

mod common;

use clink::{Config, Error, PeerId, Selector};
use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Bound on failure detection in assertions (generous; the measured time is printed).
const DETECT: Duration = Duration::from_secs(5);

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        match role {
            "env_config" => {
                // CLINK_RING_CELLS=1000 in the environment: not a power of two.
                match clink::Context::new() {
                    Err(Error::Config(m)) => assert!(m.contains("CLINK_RING_CELLS"), "{m}"),
                    Err(e) => panic!("wrong error: {e}"),
                    Ok(_) => panic!("bad CLINK_RING_CELLS accepted"),
                }
            }
            "big_sender" => {
                let (mut ep, parent) = child_connect();
                let r = ep
                    .isend(parent, 1, pattern(key(seed, 1), 64 << 20))
                    .unwrap();
                // Until killed (the parent never lets it finish).
                let _ = ep.wait_send(&r, Some(T));
                panic!("the parent should have killed us");
            }
            "stubborn" => {
                // Connects, says hello, then never receives tag 1.
                let (mut ep, parent) = child_connect();
                ep.send(parent, 0, b"ready").unwrap();
                let _ = ep.recv_timeout(Selector::exact(Some(parent), 2), &mut [0u8; 8], Some(T));
                panic!("the parent should have killed us");
            }
            "fixed_port" => {
                // Says which incarnation it is, then echoes tag 2 until tag 3.
                let (mut ep, parent) = child_connect();
                let gen = std::env::var("CLINKTEST_GEN").unwrap();
                ep.send(parent, 0, gen.as_bytes()).unwrap();
                let mut buf = [0u8; 64];
                loop {
                    let st = ep
                        .recv_timeout(
                            Selector {
                                src: Some(parent),
                                tag: 0,
                                mask: 0,
                            },
                            &mut buf,
                            Some(T),
                        )
                        .unwrap();
                    if st.tag == 3 {
                        break;
                    }
                    ep.send(parent, 2, &buf[..st.len as usize]).unwrap();
                }
                ep.close();
            }
            "exit_unclosed" => {
                let (mut ep, parent) = child_connect();
                let n = std::env::var("CLINKTEST_EXIT_N").map_or(EXIT_N, |v| v.parse().unwrap());
                for i in 0..n {
                    let r = ep
                        .isend(parent, 1, pattern(key(seed, i), exit_len(i)))
                        .unwrap();
                    assert!(ep.test_send(&r).unwrap(), "eager send {i} is in the ring");
                }
                // Exit without dropping the endpoint: no goodbye, like a crash.
                std::process::exit(0);
            }
            "echo" => {
                let (mut ep, parent) = child_connect();
                let addr = ep.address();
                ep.send(parent, 0, addr.as_bytes()).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let st = ep
                        .recv_timeout(Selector::exact(Some(parent), 1), &mut buf, Some(T))
                        .map(Some)
                        .or_else(|e| match e {
                            Error::Timeout => Ok(None),
                            e => Err(e),
                        })
                        .unwrap();
                    let Some(st) = st else {
                        panic!("no message from the parent for {T:?}");
                    };
                    if st.len == 0 {
                        break; // stop
                    }
                    ep.send(parent, 2, &buf[..st.len as usize]).unwrap();
                }
            }
            "late_sender" => {
                // Connects to the parent (already serving another peer) and sends one
                // message.
                let (mut ep, parent) = child_connect();
                ep.send(parent, 4, b"late").unwrap();
                let _ = ep.recv_timeout(Selector::exact(Some(parent), 2), &mut [0u8; 8], Some(T));
            }
            "streamer" => {
                // Sends 64-byte messages as fast as the parent takes them, until it says
                // stop (tag 9).
                let (mut ep, parent) = child_connect();
                let msg = [7u8; 64];
                while ep.probe(Selector::exact(Some(parent), 9)).is_none() {
                    ep.send(parent, 5, &msg).unwrap();
                }
            }
            r => panic!("unknown role {r}"),
        }
    });
}

fn setup(role: &str, config: Config, env: &[(&str, &str)]) -> (clink::Endpoint, PeerId, ChildProc) {
    let ctx = ctx_with(Config {
        calibrate: false,
        ..config
    });
    let mut ep = ctx.endpoint().unwrap();
    let child = spawn(role, &ep.address(), seed(31), env);
    let peer = ep.accept(Some(T)).expect("child connects");
    (ep, peer, child)
}

#[test]
fn sigkill_mid_pipelined_rendezvous_fails_pending_receive() {
    // Without CMA the 64 MiB message moves in chunks through the 128 KiB ring, at the pace
    // the receiver drains it: the transfer is certainly in progress when the kill lands.
    let (mut ep, peer, mut child) = setup(
        "big_sender",
        Config {
            cma: false,
            ..Config::default()
        },
        &[("CLINK_CMA", "off")],
    );
    let req = ep
        .irecv(Selector::exact(Some(peer), 1), vec![0u8; 64 << 20])
        .unwrap();
    // Progress by hand until some chunks have arrived: each pass handles at most a few
    // dozen frames, and the sender cannot run more than one ring (128 KiB) ahead of us,
    // so the 64 MiB message is certainly unfinished when the kill lands.
    let deadline = Instant::now() + T;
    while ep.stats().frames_received < 20 {
        assert!(Instant::now() < deadline, "the transfer did not start");
        ep.progress();
    }
    assert!(
        ep.stats().pipeline_bytes < 32 << 20,
        "the transfer is not in progress: {} bytes already in",
        ep.stats().pipeline_bytes
    );
    let frames = ep.stats().frames_received;
    let t0 = Instant::now();
    child.kill();
    let r = ep.wait_recv(&req, Some(DETECT));
    let detect = t0.elapsed();
    println!("receiver: kill -9 after {frames} frames detected in {detect:?}");
    assert!(
        matches!(r, Err(Error::PeerDead(p)) if p == peer),
        "expected PeerDead, got {:?}",
        r.map(|got| got.status)
    );
    assert!(!ep.is_alive(peer));
    assert!(ep.last_error().is_some());
    child.reap();
}

#[test]
fn sigkill_fails_pending_rendezvous_send_and_receive() {
    let (mut ep, peer, mut child) = setup("stubborn", Config::default(), &[]);
    assert_eq!(recv_vec(&mut ep, peer, 0, 16), b"ready");
    let sreq = ep.isend(peer, 1, pattern(1, 16 << 20)).unwrap();
    let rreq = ep
        .irecv(Selector::exact(Some(peer), 3), vec![0u8; 64])
        .unwrap();
    assert!(matches!(
        ep.wait_send(&sreq, Some(Duration::from_millis(20))),
        Err(Error::Timeout)
    ));
    let t0 = Instant::now();
    child.kill();
    let r = ep.wait_send(&sreq, Some(DETECT));
    let detect = t0.elapsed();
    println!("sender: kill -9 detected in {detect:?}");
    assert!(
        matches!(r, Err(Error::PeerDead(p)) if p == peer),
        "expected PeerDead, got {r:?}"
    );
    let r = ep.wait_recv(&rreq, Some(DETECT));
    assert!(matches!(r, Err(Error::PeerDead(_))), "{r:?}");
    assert!(matches!(
        ep.isend(peer, 1, vec![1u8]),
        Err(Error::PeerDead(_))
    ));
    child.reap();
}

/// Spin-free configuration: every wait sleeps at once (on the lone peer's futex when it
/// can).
fn no_spin() -> Config {
    Config {
        spin: Some(Duration::ZERO),
        ..Config::default()
    }
}

#[test]
fn sigkill_ends_a_receive_sleeping_on_the_peers_futex() {
    let (mut ep, peer, mut child) = setup("stubborn", no_spin(), &[]);
    assert_eq!(recv_vec(&mut ep, peer, 0, 16), b"ready");
    // Sleep on the futex (nothing else to wait for) until the child is killed: the sleep
    // times out within FUTEX_SLEEP_MAX and finds the pair's tether hung up.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        child.kill();
        child
    });
    let t0 = Instant::now();
    let r = ep.recv_timeout(Selector::exact(Some(peer), 2), &mut [0u8; 8], Some(DETECT));
    println!("kill -9 seen by a futex sleep after {:?}", t0.elapsed());
    assert!(matches!(r, Err(Error::PeerDead(p)) if p == peer), "{r:?}");
    assert!(
        ep.stats().futex_sleeps > 0,
        "the receive never slept on the futex"
    );
    killer.join().unwrap().reap();
}

#[test]
fn a_futex_sleep_still_accepts_a_new_peer_and_its_message() {
    let (mut ep, first, mut child) = setup("stubborn", no_spin(), &[]);
    assert_eq!(recv_vec(&mut ep, first, 0, 16), b"ready");
    let mut late = spawn("late_sender", &ep.address(), seed(32), &[]);
    // One live peer: this receive (from anyone) sleeps on its futex; the newcomer is
    // accepted at the latest when the sleep times out.
    let mut buf = [0u8; 8];
    let st = ep
        .recv_timeout(Selector::exact(None, 4), &mut buf, Some(T))
        .expect("the late peer's message");
    assert_eq!(&buf[..st.len as usize], b"late");
    assert_ne!(st.peer, first);
    assert!(
        ep.stats().futex_sleeps > 0,
        "the receive never slept on the futex"
    );
    child.kill();
    late.kill();
    child.reap();
    late.reap();
}

const EXIT_N: u64 = 200;

fn exit_len(i: u64) -> usize {
    (i % 100) as usize
}

#[test]
fn exit_without_close_delivers_sent_messages_then_fails() {
    let seed = seed(31);
    let (mut ep, peer, mut child) = setup("exit_unclosed", Config::default(), &[]);
    let st = child.wait(T);
    assert!(st.success(), "child: {st}");
    // The peer is gone, but what it put in the ring is delivered, in order.
    let mut buf = [0u8; 128];
    for i in 0..EXIT_N {
        let st = ep
            .recv_timeout(Selector::exact(Some(peer), 1), &mut buf, Some(T))
            .unwrap_or_else(|e| panic!("message {i} of a peer that exited: {e}"));
        assert_eq!(st.len as usize, exit_len(i));
        check(key(seed, i), &buf[..exit_len(i)], &format!("message {i}"));
    }
    let t0 = Instant::now();
    let r = ep.recv_timeout(Selector::exact(Some(peer), 1), &mut buf, Some(DETECT));
    println!("exited peer detected in {:?}", t0.elapsed());
    assert!(matches!(r, Err(Error::PeerDead(_))), "{r:?}");
    assert!(!ep.is_alive(peer));
    assert!(matches!(
        ep.isend(peer, 1, vec![1u8]),
        Err(Error::PeerDead(_))
    ));
}

#[test]
fn receive_posted_after_peer_death_fails_at_once() {
    let (mut ep, peer, mut child) = setup("exit_unclosed", Config::default(), &[]);
    child.wait(T);
    let mut buf = [0u8; 128];
    // Drain the dead peer's messages, then see it declared dead.
    let mut n = 0;
    loop {
        match ep.recv_timeout(Selector::exact(Some(peer), 1), &mut buf, Some(DETECT)) {
            Ok(_) => n += 1,
            Err(Error::PeerDead(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(n, EXIT_N);
    assert!(!ep.is_alive(peer));
    let t0 = Instant::now();
    let r = ep.recv_timeout(Selector::exact(Some(peer), 1), &mut buf, Some(DETECT));
    println!(
        "receive from a dead peer returned {r:?} after {:?}",
        t0.elapsed()
    );
    assert!(matches!(r, Err(Error::PeerDead(_))), "{r:?}");
    let req = ep
        .irecv(Selector::exact(Some(peer), 1), vec![0u8; 8])
        .unwrap();
    let r = ep.wait_recv(&req, Some(DETECT));
    assert!(matches!(r, Err(Error::PeerDead(_))), "{r:?}");
}

/// Names containing "clink" in /dev/shm and under /tmp (two levels deep).
fn named_clink_files() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![("/dev/shm".to_string(), 0), ("/tmp".to_string(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path().to_string_lossy().into_owned();
            let name = e.file_name().to_string_lossy().to_lowercase();
            // The host's measured costs (and their lock) are kept for the boot on purpose:
            // shared by every process, not left behind by one.
            if name.contains("clink") && !name.starts_with("clink-costs-") {
                out.insert(path.clone());
            }
            if depth < 1 && e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((path, depth + 1));
            }
        }
    }
    out
}

fn abstract_socket_listed(name: &str) -> bool {
    let t = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    t.lines().any(|l| l.ends_with(&format!("@{name}")))
}

fn ping(ep: &mut clink::Endpoint, peer: PeerId, seed: u64, rounds: u64) {
    for i in 0..rounds {
        let len = match i % 4 {
            0 => 1,
            1 => 1000,
            2 => 30_000,
            _ => 300 << 10,
        };
        let m = pattern(key(seed, i), len);
        ep.send(peer, 1, &m).unwrap();
        let back = recv_vec(ep, peer, 2, 1 << 20);
        assert!(back == m, "echo {i} of {len} bytes");
    }
}

#[test]
fn sigkill_leaves_nothing_behind_and_other_peers_keep_working() {
    let seed = seed(33);
    let before = named_clink_files();
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let mut a = spawn("echo", &ep.address(), seed, &[]);
    let pa = ep.accept(Some(T)).unwrap();
    let mut b = spawn("echo", &ep.address(), seed, &[]);
    let pb = ep.accept(Some(T)).unwrap();
    let addr_a = String::from_utf8(recv_vec(&mut ep, pa, 0, 256)).unwrap();
    let _ = recv_vec(&mut ep, pb, 0, 256);
    let sock_a = clink_proto::addr::Address::parse(&addr_a)
        .unwrap()
        .shm
        .expect("shm socket name");
    assert!(
        abstract_socket_listed(&sock_a),
        "child's socket @{sock_a} is listed"
    );
    ping(&mut ep, pa, seed, 4);
    ping(&mut ep, pb, seed, 4);

    let t0 = Instant::now();
    a.kill();
    let r = ep.recv_timeout(Selector::exact(Some(pa), 2), &mut [0u8; 8], Some(DETECT));
    println!("idle peer killed: detected in {:?}", t0.elapsed());
    assert!(matches!(r, Err(Error::PeerDead(p)) if p == pa), "{r:?}");
    a.reap();

    // Nothing named on disk, no listening socket left, and its address is refused at once.
    let after = named_clink_files();
    let new: Vec<_> = after.difference(&before).collect();
    assert!(new.is_empty(), "files left behind: {new:?}");
    assert!(
        !after.iter().any(|p| p.starts_with("/dev/shm")),
        "clink files in /dev/shm: {after:?}"
    );
    assert!(!abstract_socket_listed(&sock_a), "@{sock_a} still listed");
    let t0 = Instant::now();
    match ep.connect(&addr_a) {
        Err(Error::Connect { why, .. }) => println!("connect to killed endpoint: {why}"),
        r => panic!("expected Error::Connect, got {r:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "connect refusal took {:?}",
        t0.elapsed()
    );

    // The other peer is unaffected.
    assert!(ep.is_alive(pb));
    ping(&mut ep, pb, seed ^ 1, 20);
    ep.send(pb, 1, &[]).unwrap();
    b.expect_success(T);
    assert!(ep.stats().peers_failed >= 1);
}

/// A peer killed while another keeps the endpoint busy with a stream of messages: the
/// liveness check still runs (progress passes that always find work used to skip it),
/// so the dead peer's pending receive fails while the stream goes on.
#[test]
fn peer_killed_under_steady_traffic_from_another_is_noticed() {
    let (mut ep, ps, mut stubborn) = setup("stubborn", Config::default(), &[]);
    let _ = recv_vec(&mut ep, ps, 0, 8); // ready
    let mut streamer = spawn("streamer", &ep.address(), seed(34), &[]);
    let pf = ep.accept(Some(T)).unwrap();
    let pending = ep
        .irecv(Selector::exact(Some(ps), 1), vec![0u8; 8])
        .unwrap();
    let mut buf = [0u8; 64];
    for _ in 0..1000 {
        ep.recv(Selector::exact(Some(pf), 5), &mut buf).unwrap();
    }
    let t0 = Instant::now();
    stubborn.kill();
    let mut streamed = 0u64;
    let r = loop {
        ep.recv(Selector::exact(Some(pf), 5), &mut buf).unwrap();
        streamed += 1;
        match ep.test_recv(&pending) {
            Ok(None) => assert!(t0.elapsed() < DETECT, "not noticed in {DETECT:?}"),
            r => break r,
        }
    };
    println!(
        "killed peer noticed in {:?} while {streamed} messages streamed from another",
        t0.elapsed()
    );
    assert!(matches!(r, Err(Error::PeerDead(p)) if p == ps), "{r:?}");
    stubborn.reap();
    ep.send(pf, 9, &[]).unwrap();
    // Take what it sent before it saw the stop, until it closes.
    while ep
        .recv_timeout(Selector::exact(Some(pf), 5), &mut buf, Some(T))
        .is_ok()
    {}
    streamer.expect_success(T);
}

/// A "stubborn" child over UDP on loopback, ready, and the parent's liveness timeout
/// 60 s: only the child's host's "port unreachable" can fail it within [`DETECT`].
fn udp_stubborn() -> (clink::Endpoint, PeerId, ChildProc) {
    let mut config = net_config();
    if let Some(u) = config.udp.as_mut() {
        u.dead_after = Duration::from_secs(60);
    }
    let (mut ep, peer, child) = setup("stubborn", config, &transport_env(true));
    assert_eq!(recv_vec(&mut ep, peer, 0, 16), b"ready");
    assert_eq!(ep.transport(peer).unwrap(), "udp");
    (ep, peer, child)
}

/// Expects `r` to be `peer`'s death, told by its host's "port unreachable".
fn assert_port_unreachable<T: std::fmt::Debug>(
    ep: &clink::Endpoint,
    peer: PeerId,
    r: clink::Result<T>,
) {
    assert!(
        matches!(r, Err(Error::PeerDead(p)) if p == peer),
        "expected PeerDead, got {r:?}"
    );
    let why = ep.last_error().unwrap_or_default().to_string();
    assert!(why.contains("port unreachable"), "{why}");
}

#[test]
fn sigkill_of_a_udp_peer_is_told_by_its_hosts_port_unreachable() {
    // Over UDP nothing is sent when a process dies; but the next datagram to its port
    // comes back from its kernel as ICMP "port unreachable". With a liveness timeout of
    // 60 s, only that answer can fail the send within the bound.
    let (mut ep, peer, mut child) = udp_stubborn();
    child.kill();
    child.reap();
    let t0 = Instant::now();
    // An eager message (complete once queued): its first transmission meets the closed
    // port, and the receive posted for the answer fails.
    let s = ep.isend(peer, 1, vec![7u8; 100]).unwrap();
    let q = ep
        .irecv(Selector::exact(Some(peer), 2), vec![0u8; 8])
        .unwrap();
    let r = ep.wait_recv(&q, Some(DETECT)).map(|got| got.status);
    println!("UDP peer's kill -9 detected in {:?}", t0.elapsed());
    assert_port_unreachable(&ep, peer, r);
    drop(s);
}

#[test]
fn a_udp_peer_killed_while_awaited_is_found_by_the_pings_of_the_wait() {
    // The parent sleeps in a receive from the child and sends nothing; the child is
    // killed. The wait pings the peer it awaits once it has been silent for 20 ms, and
    // the ping meets the closed port: found well within the 60 s liveness timeout.
    let (mut ep, peer, mut child) = udp_stubborn();
    let q = ep
        .irecv(Selector::exact(Some(peer), 2), vec![0u8; 8])
        .unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300)); // the parent is asleep by then
        let t0 = Instant::now();
        child.kill();
        child.reap();
        t0
    });
    let r = ep.wait_recv(&q, Some(DETECT)).map(|got| got.status);
    let killed_at = killer.join().unwrap();
    println!(
        "awaited UDP peer's kill -9 detected in {:?}",
        killed_at.elapsed()
    );
    assert_port_unreachable(&ep, peer, r);
}

#[test]
fn a_peer_restarted_on_the_same_udp_port_is_a_new_peer_and_the_old_one_dies() {
    // A server restarted on its fixed port: the old process is killed, a new one binds
    // the same address and connects again. Datagrams for the old connection now reach the
    // new process, which drops them (another connection id); the parent takes the new
    // process for a new peer, talks to it, and declares the old one dead (silent: no
    // "port unreachable" comes from a port that is in use again).
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let bind = format!("127.0.0.1:{port}");
    let mut config = net_config();
    if let Some(u) = config.udp.as_mut() {
        u.dead_after = Duration::from_millis(1000);
    }
    let ctx = ctx_with(Config {
        calibrate: false,
        ..config
    });
    let mut ep = ctx.endpoint().unwrap();
    let env = |gen| -> Vec<(&str, &str)> {
        let mut e = transport_env(true);
        e.extend([("CLINK_UDP_BIND", bind.as_str()), ("CLINKTEST_GEN", gen)]);
        e
    };
    let mut first = spawn("fixed_port", &ep.address(), seed(32), &env("1"));
    let old = ep.accept(Some(T)).expect("the first incarnation connects");
    assert_eq!(recv_vec(&mut ep, old, 0, 8), b"1");
    first.kill();
    first.reap();
    let mut second = spawn("fixed_port", &ep.address(), seed(33), &env("2"));
    let new = ep.accept(Some(T)).expect("the second incarnation connects");
    assert_ne!(new, old);
    assert_eq!(recv_vec(&mut ep, new, 0, 8), b"2");
    for i in 0..10u8 {
        ep.send(new, 2, &[i; 32]).unwrap();
        assert_eq!(recv_vec(&mut ep, new, 2, 64), [i; 32]);
    }
    // The old peer: sends to it fail once it is declared dead, and nothing of the new
    // process is ever taken for its.
    let t0 = Instant::now();
    let r = loop {
        match ep.send(old, 2, b"anyone?") {
            Ok(()) => {
                assert!(t0.elapsed() < DETECT, "the old peer never died");
                let got = ep.recv_timeout(
                    Selector::exact(Some(old), 2),
                    &mut [0u8; 64],
                    Some(Duration::from_millis(50)),
                );
                assert!(got.is_err(), "an answer came from the old peer: {got:?}");
            }
            Err(e) => break e,
        }
    };
    println!(
        "old incarnation declared dead after {:?}: {:?}",
        t0.elapsed(),
        ep.last_error()
    );
    assert!(matches!(r, Error::PeerDead(p) if p == old), "{r:?}");
    ep.send(new, 3, b"").unwrap();
    second.expect_success(T);
}

#[test]
fn connect_to_exited_endpoint_is_refused() {
    let seed = seed(34);
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let mut child = spawn("echo", &ep.address(), seed, &[]);
    let peer = ep.accept(Some(T)).unwrap();
    let addr = String::from_utf8(recv_vec(&mut ep, peer, 0, 256)).unwrap();
    ep.send(peer, 1, &[]).unwrap();
    child.expect_success(T);
    let t0 = Instant::now();
    match ep.connect(&addr) {
        Err(e @ Error::Connect { .. }) => {
            let m = e.to_string();
            println!("{m}");
            assert!(m.contains("no endpoint listens"), "{m}");
        }
        r => panic!("expected Error::Connect, got {r:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn bad_addresses_give_clear_errors() {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let me = clink_proto::addr::Address::parse(&ep.address()).unwrap();
    for bad in [
        "",
        "garbage",
        "tcp://127.0.0.1:5000",
        "clink:",
        "clink:host=1;id=2",
        "clink:host=00000000000000zz;id=00000000000000000000000000000001",
        "clink:id=00000000000000000000000000000001",
        "clink:host=0000000000000001;shm=x",
        "clink:host=0000000000000001;id=00000000000000000000000000000001;shm=../etc",
    ] {
        match ep.connect(bad) {
            Err(e @ Error::Address(_)) => {
                let m = e.to_string();
                assert!(m.starts_with("bad address"), "{bad:?}: {m}");
            }
            r => panic!("{bad:?}: expected Error::Address, got {r:?}"),
        }
    }
    // Well-formed but unusable addresses: Error::Connect with the reason.
    let other_host = clink_proto::addr::Address {
        host: me.host ^ 1,
        id: me.id ^ 1,
        udp: Vec::new(),
        tcp: Vec::new(),
        ..me.clone()
    };
    let no_shm = clink_proto::addr::Address {
        shm: None,
        udp: Vec::new(),
        tcp: Vec::new(),
        id: me.id ^ 1,
        ..me.clone()
    };
    let nobody = clink_proto::addr::Address {
        id: me.id ^ 1,
        shm: Some("clink-nobody-listens-here".into()),
        ..me.clone()
    };
    for (a, want) in [
        (ep.address(), "itself"),
        (other_host.to_string(), "another host"),
        (no_shm.to_string(), "no transport"),
        (nobody.to_string(), "no endpoint listens"),
    ] {
        match ep.connect(&a) {
            Err(e @ Error::Connect { .. }) => {
                let m = e.to_string();
                assert!(m.contains(want), "{a}: {m}");
            }
            r => panic!("{a}: expected Error::Connect, got {r:?}"),
        }
    }
}

#[test]
fn bad_config_values_give_clear_errors() {
    let vars = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    for (k, v) in [
        ("CLINK_SPIN_US", "-1"),
        ("CLINK_SPIN_US", "soon"),
        ("CLINK_RING_CELLS", "1000"),
        ("CLINK_RING_CELLS", "2"),
        ("CLINK_RING_CELLS", "99999999999"),
        ("CLINK_CMA", "maybe"),
        ("CLINK_EAGER_MAX", "lots"),
        ("CLINK_CALIBRATE", "perhaps"),
        ("CLINK_CONNECT_TIMEOUT_MS", "0"),
        ("CLINK_LIVENESS_MS", ""),
        ("CLINK_SHM_ANY_UID", "2"),
        ("CLINK_TYPO", "1"),
    ] {
        match Config::from_vars(vars(&[(k, v)])) {
            Err(e @ Error::Config(_)) => {
                let m = e.to_string();
                assert!(m.contains(k), "{k}={v}: {m}");
            }
            r => panic!("{k}={v:?}: expected Error::Config, got {r:?}"),
        }
    }
    // Unrelated variables are ignored; good values parse.
    let c = Config::from_vars(vars(&[
        ("PATH", "/bin"),
        ("CLINKTEST_ROLE", "x"),
        ("CLINK_CMA", "off"),
        ("CLINK_RING_CELLS", "1024"),
    ]))
    .unwrap();
    assert!(!c.cma);
    assert_eq!(c.ring_cells, 1024);
    // And from the real environment, in a child process.
    let mut child = spawn("env_config", "", 0, &[("CLINK_RING_CELLS", "1000")]);
    child.expect_success(T);
}

/// Messages a peer sent over the network before it exited without closing, and that
/// reached this host, are delivered in order before the peer fails. Over UDP a few small
/// messages (within the initial congestion window, so they all leave at once): the host
/// answers "port unreachable" to this endpoint's first ack, and the frames the
/// connection had already delivered were dropped with the peer (two of six arrived).
/// Over TCP the kernel sends what the process had written, then ends the stream: 200
/// messages, more than one pass handles (66 arrived).
#[test]
fn exit_without_close_over_the_network_delivers_what_arrived() {
    let seed = seed(31);
    let tcp = Config {
        prefer_tcp: true,
        tcp: Some(clink::config::TcpConfig {
            bind: (std::net::Ipv4Addr::LOCALHOST, 0).into(),
            ..Default::default()
        }),
        ..net_config()
    };
    let udp_env = [transport_env(true), vec![("CLINKTEST_EXIT_N", "6")]].concat();
    let tcp_env = vec![
        ("CLINK_TRANSPORT", "tcp"),
        ("CLINK_TCP_BIND", "127.0.0.1:0"),
        ("CLINK_UDP_BIND", "127.0.0.1:0"),
    ];
    for (net, config, env, sent) in [
        ("udp", net_config(), udp_env, 6),
        ("tcp", tcp, tcp_env, EXIT_N),
    ] {
        let (mut ep, peer, mut child) = setup("exit_unclosed", config, &env);
        assert_eq!(ep.transport(peer).unwrap(), net);
        let st = child.wait(T);
        assert!(st.success(), "child: {st}");
        let mut buf = [0u8; 128];
        let mut n = 0;
        let r = loop {
            match ep.recv_timeout(Selector::exact(Some(peer), 1), &mut buf, Some(DETECT)) {
                Ok(st) => {
                    assert_eq!(st.len as usize, exit_len(n), "{net}: message {n}");
                    check(
                        key(seed, n),
                        &buf[..exit_len(n)],
                        &format!("{net}: message {n}"),
                    );
                    n += 1;
                }
                Err(e) => break e,
            }
        };
        println!("{net}: {n} of {sent} messages delivered, then {r:?}");
        assert!(matches!(r, Error::PeerDead(p) if p == peer), "{net}: {r:?}");
        assert_eq!(n, sent, "{net}: {:?}", ep.stats());
    }
}
