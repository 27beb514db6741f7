//! Two "hosts": the test enters one network namespace on a thread (its endpoint's UDP
//! socket lives there) and runs the peer as a child process in the other, joined by a veth
//! pair. Random sizes with checksums (over UDP and over TCP), injected faults, and a peer
//! killed mid-transfer.
//! Fails with the reason where namespaces cannot be made (not root, no `ip`).

mod common;

use clink::{Endpoint, Error, PeerId, Selector};
use clink_testbed::NetnsPair;
use common::*;
use std::time::{Duration, Instant};

const MSGS: u64 = 3000;

fn size(rng: &mut Rng) -> usize {
    // Mostly small, some across fragment and eager boundaries, a few large.
    match rng.below(10) {
        0..=5 => rng.below(2048) as usize,
        6..=8 => rng.range(2048, 200_000) as usize,
        _ => rng.range(200_000, 3 << 20) as usize,
    }
}

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        let (mut ep, parent) = child_connect();
        let want = match std::env::var("CLINK_TRANSPORT").as_deref() {
            Ok("tcp") => "tcp",
            _ => "udp",
        };
        assert_eq!(ep.transport(parent).unwrap(), want);
        match role {
            "sender" => {
                // Non-blocking sends, up to 64 outstanding: the receiver takes the tags
                // out of order, so a rendezvous send may wait for later messages.
                let mut rng = Rng::new(seed);
                let mut inflight = std::collections::VecDeque::new();
                for i in 0..MSGS {
                    let tag = i % 7;
                    let r = ep.isend(parent, tag, pattern(key(seed, i), size(&mut rng)));
                    inflight.push_back((i, r.unwrap()));
                    while inflight.len() > 64 || (i + 1 == MSGS && !inflight.is_empty()) {
                        let (k, r) = inflight.pop_front().unwrap();
                        if let Err(e) = ep.wait_send(&r, Some(T)) {
                            panic!("message {k}: {e}: {:?} {:?}", ep.stats(), ep.last_error());
                        }
                    }
                }
                // Wait for the parent's word that everything arrived, then say goodbye.
                recv_vec(&mut ep, parent, 99, 8);
                ep.close();
            }
            "big_sender" => {
                let r = ep
                    .isend(parent, 1, pattern(key(seed, 1), 256 << 20))
                    .unwrap();
                // Until killed; with its short liveness timeout this side may declare the
                // (momentarily quiet) parent dead first, which is fine: it just exits.
                let _ = ep.wait_send(&r, Some(T));
                std::process::exit(3);
            }
            r => panic!("unknown role {r}"),
        }
    });
}

/// Runs `f` on a thread inside namespace 0 of `pair` with an endpoint made there (its
/// configuration from the environment).
fn in_ns0<R: Send + 'static>(
    pair: &NetnsPair,
    f: impl FnOnce(Endpoint) -> R + Send + 'static,
) -> (String, std::thread::JoinHandle<R>) {
    let config = clink::Config {
        calibrate: false,
        ..clink::Config::from_env().unwrap()
    };
    in_netns(pair.ns(0), config, f)
}

fn pair() -> NetnsPair {
    require_netns();
    NetnsPair::create(1500).expect("create namespaces")
}

fn child_in_ns1(
    pair: &NetnsPair,
    role: &str,
    addr: &str,
    seed: u64,
    env: &[(&str, &str)],
) -> ChildProc {
    let exe = std::env::current_exe().unwrap();
    spawn_with(pair.command(1, exe), role, addr, seed, env)
}

fn receive_all(ep: &mut Endpoint, seed: u64, transport: &'static str) -> PeerId {
    let peer = ep.accept(Some(T)).unwrap();
    assert_eq!(ep.transport(peer).unwrap(), transport);
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 4 << 20];
    // Receive per tag in order, but the tags round-robin in reverse, so messages of other
    // tags wait as unexpected: ordering per (sender, tag) is what is checked.
    let mut expect: Vec<Vec<(u64, usize)>> = vec![Vec::new(); 7];
    for i in 0..MSGS {
        expect[(i % 7) as usize].push((i, size(&mut rng)));
    }
    let mut next = [0usize; 7];
    let mut left = MSGS;
    while left > 0 {
        for tag in (0..7u64).rev() {
            let Some(&(i, n)) = expect[tag as usize].get(next[tag as usize]) else {
                continue;
            };
            let st = ep
                .recv_timeout(Selector::exact(Some(peer), tag), &mut buf, Some(T))
                .unwrap_or_else(|e| panic!("message {i}: {e}"));
            assert_eq!(st.len as usize, n, "message {i} length");
            assert!(
                buf[..n] == pattern(key(seed, i), n)[..],
                "message {i} content"
            );
            next[tag as usize] += 1;
            left -= 1;
        }
    }
    ep.send(peer, 99, b"done").unwrap();
    peer
}

fn random_sizes(faults: &str) {
    random_sizes_over(faults, "udp");
}

/// The random-sizes run over `transport` ("udp", or "tcp": the child connects with
/// `CLINK_TRANSPORT=tcp`).
fn random_sizes_over(faults: &str, transport: &'static str) {
    let pair = pair();
    let seed = seed(41);
    let (addr, h) = in_ns0(&pair, move |mut ep| {
        let peer = receive_all(&mut ep, seed, transport);
        // The child closes after our "done": wait for its goodbye (bounded), which ends a
        // receive directed at it (one from any source would wait out the bound).
        let r = ep
            .irecv(Selector::exact(Some(peer), 99), vec![0u8; 8])
            .unwrap();
        match ep.wait_recv(&r, Some(T)) {
            Err(Error::PeerDead(p)) if p == peer => {}
            other => panic!(
                "the goodbye should end the receive: {:?}",
                other.map(|g| g.status)
            ),
        }
        (ep.stats(), ep.udp_ring())
    });
    let mut env = vec![("CLINK_UDP_MTU", "1500")];
    if faults == "noring" {
        // The sender without a receive ring (no CAP_NET_RAW, say): this side's packet-
        // socket sends must reach its UDP sockets.
        env.push(("CLINK_UDP_RING", "0"));
    } else if !faults.is_empty() {
        env.push(("CLINK_FAULTS", faults));
    }
    if transport == "tcp" {
        env.push(("CLINK_TRANSPORT", "tcp"));
    }
    let mut child = child_in_ns1(&pair, "sender", &addr, seed, &env);
    let (stats, ring) = h.join().expect("receiver thread");
    child.expect_success(T);
    println!("receiver stats: {stats:?}, receive ring {ring:?}");
    if transport == "tcp" {
        assert!(
            stats.stream_reads > 0 && stats.datagrams_received == 0,
            "{stats:?}"
        );
        // Rendezvous payloads landed in place, by speculation or straight after their
        // header, not through the receive buffer.
        assert!(stats.spec_hits > 0, "{stats:?}");
        assert!(
            stats.cleanup_bytes * 10 < stats.spec_hit_bytes + stats.stream_direct_bytes,
            "{stats:?}"
        );
    } else {
        assert!(stats.datagrams_received > MSGS);
        if (faults.is_empty() || faults == "noring") && ring == Some(Ok(())) {
            // Answered through the packet socket (acks, the final "done"); and with a
            // sender that has a ring, read from this side's ring too.
            assert!(stats.ring_sent > 0, "{stats:?}");
            assert!(faults == "noring" || stats.ring_datagrams > 0, "{stats:?}");
            // Eager messages of a few datagrams came as coalesced runs, each announced
            // by a notice in the ring.
            assert!(stats.ring_notices > 0, "{stats:?}");
        }
    }
}

#[test]
fn random_sizes_with_checksums_across_namespaces_over_tcp() {
    random_sizes_over("", "tcp");
}

#[test]
fn a_sender_without_the_receive_ring_gets_the_packet_socket_sends() {
    random_sizes("noring");
}

#[test]
fn random_sizes_with_checksums_across_namespaces() {
    random_sizes("");
}

#[test]
fn random_sizes_under_injected_faults_across_namespaces() {
    // Faults on the sender's receive side: its acks and the receiver's answers are hit.
    random_sizes("drop=0.03,dup=0.01,corrupt=0.01,reorder=0.03,delay_us=200,seed=3");
}

#[test]
fn peer_killed_mid_transfer_fails_the_receive() {
    let pair = pair();
    let seed = seed(42);
    let (addr, h) = in_ns0(&pair, move |mut ep| {
        let peer = ep.accept(Some(T)).unwrap();
        let r = ep
            .irecv(Selector::exact(Some(peer), 1), vec![0u8; 256 << 20])
            .unwrap();
        // Wait until the transfer is under way, then report it.
        let t = Instant::now();
        while ep.stats().datagrams_received < 1000 && t.elapsed() < T {
            ep.progress();
        }
        (ep, r)
    });
    let mut child = child_in_ns1(
        &pair,
        "big_sender",
        &addr,
        seed,
        &[("CLINK_NET_DEAD_MS", "500")],
    );
    let (mut ep, r) = h.join().unwrap();
    child.kill();
    child.reap();
    let t = Instant::now();
    // This endpoint's own liveness timeout is the default (2 s) unless the environment
    // says otherwise; it must fire.
    match ep.wait_recv(&r, Some(Duration::from_secs(10))) {
        Err(Error::PeerDead(_)) => {}
        other => panic!("expected PeerDead, got {other:?}"),
    }
    println!("declared dead after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
}
