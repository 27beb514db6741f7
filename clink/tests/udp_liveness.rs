//! The UDP transport's liveness and closing over loopback: a silent peer declared dead, a
//! peer that stops calling in kept alive, goodbyes, acks and messages that arrive while
//! their endpoint is away, peers beyond the socket limit. Two endpoints in one process.

mod common;

use clink::config::UdpConfig;
use clink::{Config, Error, Selector};
use common::udp::{net_ctx, pair};
use common::{check, fill, pattern, T};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

#[test]
fn a_silent_peer_is_declared_dead_and_its_requests_fail() {
    let ((mut a, pa), (b, _pb)) = pair("nothread", 300);
    let r = a
        .irecv(Selector::exact(Some(pa), 1), vec![0u8; 16])
        .unwrap();
    // Vanish without a goodbye, as a host that is gone would: leak the endpoint so its
    // Drop does not close the connection (and it has no keepalive thread to speak for
    // it).
    std::mem::forget(b);
    let t = Instant::now();
    match a.wait_recv(&r, Some(T)) {
        Err(Error::PeerDead(p)) => assert_eq!(p, pa),
        other => panic!("expected PeerDead, got {other:?}"),
    }
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(!a.is_alive(pa));
}

#[test]
fn a_peer_that_stops_calling_in_stays_alive_and_resumes() {
    // B computes for ten times the liveness timeout without calling into its endpoint;
    // its keepalive thread speaks for it. A waits meanwhile with a rendezvous send
    // outstanding. Neither declares the other dead (B's connection does not judge A on
    // silence it was not there to hear), and the send completes once B calls again.
    let ((mut a, pa), (b, pb)) = pair("", 300);
    let b = common::away_and_back(&mut a, pa, b, pb, Duration::from_secs(3));
    assert!(b.stats().keepalive_rounds >= 5, "{:?}", b.stats());
}

#[test]
fn a_receiver_that_stops_calling_in_under_a_stream_stays_alive() {
    // As over TCP (tests/tcp.rs): B streams eager messages at A while A computes for
    // three liveness timeouts; A's keepalive thread speaks for it, B's sends wait for
    // room, and every message arrives once A calls again.
    let dead = Duration::from_millis(1000);
    let (a, b) = pair("", dead.as_millis() as u64);
    common::stream_to_an_away_receiver(a, b, dead);
}

#[test]
fn close_delivers_a_backlog_to_a_reader_that_comes_back() {
    // As over TCP (tests/tcp.rs): the messages the connection still holds are delivered.
    let (a, b) = pair("", 2000);
    common::close_delivers_a_backlog(a, b, Duration::from_millis(700));
}

#[test]
fn close_is_delivered_over_udp() {
    let (a, b) = pair("", 2000);
    common::close_is_delivered(a, b);
}

/// A receiver that stops driving its endpoint as soon as its bulk receive returns (as an
/// application may) has already acknowledged the last fragments: the sender's send, which
/// completes with that ack, returns without waiting to declare the receiver dead. Busy
/// and sleeping receivers both.
#[test]
fn the_last_fragments_are_acked_before_the_receive_returns() {
    for spin in [None, Some(Duration::ZERO)] {
        let ctx = move || {
            common::ctx_with(Config {
                calibrate: false,
                force_net: true,
                spin,
                udp: Some(UdpConfig {
                    bind: (Ipv4Addr::LOCALHOST, 0).into(),
                    mtu: Some(1500),
                    dead_after: Duration::from_millis(3000),
                    ..UdpConfig::default()
                }),
                ..Config::default()
            })
        };
        let mut r = ctx().endpoint().unwrap();
        let addr = r.address();
        let sender = std::thread::spawn(move || {
            let mut s = ctx().endpoint().unwrap();
            let p = s.connect(&addr).unwrap();
            let mut outcomes = Vec::new();
            for k in 0..4u64 {
                let msg = pattern(k, 300_000 + 1409 * k as usize);
                let t = Instant::now();
                outcomes.push((s.send(p, k, &msg).map(|_| ()), t.elapsed()));
            }
            outcomes
        });
        let p = r.accept(Some(T)).unwrap();
        let mut buf = vec![0u8; 400_000];
        for k in 0..4u64 {
            let st = r
                .recv_timeout(Selector::exact(Some(p), k), &mut buf, Some(T))
                .unwrap();
            assert_eq!(st.len, 300_000 + 1409 * k, "message {k}");
            check(k, &buf[..st.len as usize], "message");
            if k == 3 {
                // Not driven any more until the sender is done.
                let outcomes = sender.join().unwrap();
                for (o, took) in outcomes {
                    assert!(o.is_ok(), "spin {spin:?}: {o:?} after {took:?}");
                }
                break;
            }
        }
    }
}

/// A receiver that stops driving its endpoint as soon as each bulk receive returns, and
/// waits (without calling in) for its sender to report the send complete, while the
/// sender loses a third of what it receives: now and then the ack that completes a send
/// is among the losses. The receiver's keepalive thread repeats its standing ack, and
/// every send completes while the receiver is still away. (Without that repeat such a
/// send would wait for the receiver to call again: here, never.)
#[test]
fn sends_complete_while_their_receiver_is_away_though_their_acks_are_lost() {
    const N: u64 = 16;
    let len = |k: u64| 200_000 + 1409 * k as usize;
    let ctx = net_ctx("", 2000);
    let mut r = ctx.endpoint().unwrap();
    let addr = r.address();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        let ctx = net_ctx("drop=0.3,seed=11", 2000);
        let mut s = ctx.endpoint().unwrap();
        let p = s.connect(&addr).unwrap();
        for k in 0..N {
            let req = s.isend(p, k, pattern(k, len(k))).unwrap();
            let t = Instant::now();
            let outcome = s.wait_send(&req, Some(T)).map_err(|e| e.to_string());
            let failed = outcome.is_err();
            done_tx.send((outcome, t.elapsed())).unwrap();
            if failed {
                break;
            }
        }
        // Kept until the receiver has seen every outcome.
        (ctx, s)
    });
    let p = r.accept(Some(T)).unwrap();
    let mut buf = vec![0u8; 300_000];
    let mut lost_acks = 0;
    for k in 0..N {
        let st = r
            .recv_timeout(Selector::exact(Some(p), k), &mut buf, Some(T))
            .unwrap();
        assert_eq!(st.len as usize, len(k), "message {k}");
        check(k, &buf[..st.len as usize], "message");
        // Away until the sender says its send is over.
        let (outcome, took) = done_rx
            .recv_timeout(T + Duration::from_secs(5))
            .expect("the sender reports");
        assert!(outcome.is_ok(), "send {k}: {outcome:?} after {took:?}");
        // (A send that waited for a keepalive round had lost its ack.)
        lost_acks += usize::from(took >= Duration::from_millis(400));
    }
    drop(sender.join().unwrap());
    eprintln!("{lost_acks} of {N} sends completed by the standing ack");
    assert!(r.stats().keepalive_rounds > 0, "{:?}", r.stats());
}

/// Two endpoints connected both ways have two connections between the same two sockets.
/// Bulk fragments carry no connection id: their checksum tells the connections apart,
/// so transfers in flight on both at once each land in their own receive.
#[test]
fn two_connections_between_one_pair_of_sockets_keep_their_bulk_transfers_apart() {
    const N: u64 = 6;
    let len = |k: u64| (1 << 20) + 1448 * k as usize + 3;
    // Default; payloads hashed; one receive queue for both and no speculative layout
    // (every fragment routed by source address and checksum).
    for cfg in ["", "hash", "onequeue nospec"] {
        let ((mut a, pa), (mut b, pb)) = pair(cfg, 5000);
        // The second connection, from the other side: another connection id.
        let addr = b.address();
        let dialer = std::thread::spawn(move || {
            let p = a.connect(&addr).unwrap();
            (a, p)
        });
        let pb2 = b.accept(Some(T)).unwrap();
        let (mut a, pa2) = dialer.join().unwrap();
        assert_ne!(pb, pb2);
        let sender = std::thread::spawn(move || {
            // Every transfer under way before any completes: both connections' fragments
            // interleave on the wire.
            let reqs: Vec<_> = (0..N)
                .map(|k| {
                    let p = if k % 2 == 0 { pb } else { pb2 };
                    b.isend(p, k, pattern(k, len(k))).unwrap()
                })
                .collect();
            for r in &reqs {
                b.wait_send(r, Some(T)).unwrap();
            }
            b
        });
        let mut buf = vec![0u8; len(N)];
        for k in 0..N {
            let p = if k % 2 == 0 { pa } else { pa2 };
            let st = a
                .recv_timeout(Selector::exact(Some(p), k), &mut buf, Some(T))
                .unwrap();
            assert_eq!(st.len as usize, len(k), "{cfg:?} message {k}");
            check(k, &buf[..st.len as usize], "message");
        }
        let b = sender.join().unwrap();
        let (sa, sb) = (a.stats(), b.stats());
        assert!(sa.spec_hit_bytes + sa.cleanup_bytes > 0, "{sa:?}");
        assert_eq!(sb.peers_failed, 0, "{sb:?}");
    }
}

/// A sender that sends a message and then stops calling clink (it waits outside clink for
/// its receiver's word) still gets it there when a datagram of it was lost on the way:
/// its keepalive thread repeats what it left unacknowledged. (It only ever sends: each
/// send that finds its window full reads the acks that waited meanwhile.)
#[test]
fn messages_arrive_while_their_sender_is_away_though_their_datagrams_are_lost() {
    const N: u64 = 10;
    // Eager messages of one to eight datagrams.
    let len = |k: u64| 100 + 1000 * k as usize;
    // The receiver's socket loses 30% of what arrives (its liveness timeout is long
    // enough for the away sender's keepalives to get through that).
    let ctx = net_ctx("drop=0.3,seed=5", 10_000);
    let mut r = ctx.endpoint().unwrap();
    let addr = r.address();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        // Away rounds of 250 ms.
        let ctx = net_ctx("", 1000);
        let mut s = ctx.endpoint().unwrap();
        let p = s.connect(&addr).unwrap();
        for k in 0..N {
            s.send(p, k, &pattern(k, len(k))).unwrap();
            // Away until the receiver has the message.
            go_rx.recv_timeout(T).expect("the receiver reports");
        }
        (ctx, s)
    });
    let p = r.accept(Some(T)).unwrap();
    let mut buf = vec![0u8; len(N)];
    for k in 0..N {
        let st = r
            .recv_timeout(Selector::exact(Some(p), k), &mut buf, Some(T))
            .unwrap();
        assert_eq!(st.len as usize, len(k), "message {k}");
        check(k, &buf[..st.len as usize], "message");
        go_tx.send(()).unwrap();
    }
    let (_ctx, s) = sender.join().unwrap();
    let (sr, ss) = (r.stats(), s.stats());
    assert!(sr.faults_injected > 0, "{sr:?}");
    assert!(ss.keepalive_rounds > 0, "{ss:?}");
    r.close();
}

/// A process that only sends (a loop of eager sends, nothing that receives) keeps its
/// connection's window moving: a send that finds queued data held back reads the acks
/// first. (Without that, everything past the first window waited in the connection until
/// a call that reads: here the close.)
#[test]
fn a_loop_of_sends_alone_reads_the_acks_its_window_waits_for() {
    const N: u64 = 2000;
    let ((mut a, pa), (mut b, pb)) = pair("", 5000);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1024];
        for k in 0..N {
            let st = a
                .recv_timeout(Selector::exact(Some(pa), k), &mut buf, Some(T))
                .unwrap();
            check(k, &buf[..st.len as usize], "message");
        }
        a
    });
    for k in 0..N {
        b.send(pb, k, &pattern(k, 1024)).unwrap();
    }
    let cs = b.conn_stats(pb).unwrap().expect("a UDP connection");
    assert!(cs.data_sent >= N / 2, "{cs:?}");
    b.close();
    drop(reader.join().unwrap());
}

/// With room for one peer socket, the first client's datagrams reach its own connected
/// socket and the second's the main one; a server that never spins (every wait sleeps in
/// epoll) is woken by both, and every message, small or bulk, comes back intact.
#[test]
fn peers_beyond_the_socket_limit_share_the_main_socket_and_sleepers_wake_for_both() {
    let ctx = |sockets: usize| {
        common::ctx_with(Config {
            calibrate: false,
            force_net: true,
            spin: Some(Duration::ZERO),
            udp: Some(UdpConfig {
                bind: (Ipv4Addr::LOCALHOST, 0).into(),
                mtu: Some(1500),
                peer_sockets: sockets,
                ..UdpConfig::default()
            }),
            ..Config::default()
        })
    };
    let mut server = ctx(1).endpoint().unwrap();
    let addr = server.address();
    const ROUNDS: u64 = 30;
    let clients: Vec<_> = (0..2u64)
        .map(|c| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut ep = ctx(4).endpoint().unwrap();
                let p = ep.connect(&addr).unwrap();
                let mut buf = vec![0u8; 200_000];
                for r in 0..ROUNDS {
                    let n = if r % 5 == 4 { 150_000 } else { 8 + r as usize };
                    let mut msg = vec![0u8; n];
                    fill(c << 32 | r, &mut msg);
                    ep.send(p, r, &msg).unwrap();
                    let st = ep
                        .recv_timeout(Selector::exact(Some(p), r), &mut buf, Some(T))
                        .unwrap();
                    assert_eq!(&buf[..st.len as usize], &msg[..], "client {c} round {r}");
                }
                // Stay until the server has answered the other client too.
                ep.recv_timeout(Selector::exact(Some(p), u64::MAX), &mut buf, Some(T))
                    .unwrap();
            })
        })
        .collect();
    let peers = [
        server.accept(Some(T)).unwrap(),
        server.accept(Some(T)).unwrap(),
    ];
    let mut buf = vec![0u8; 200_000];
    for _ in 0..2 * ROUNDS {
        let sel = Selector {
            src: None,
            tag: 0,
            mask: 0,
        };
        let st = server.recv_timeout(sel, &mut buf, Some(T)).unwrap();
        server
            .send(st.peer, st.tag, &buf[..st.len as usize])
            .unwrap();
    }
    for &p in &peers {
        server.send(p, u64::MAX, b"done").unwrap();
    }
    for c in clients {
        c.join().unwrap();
    }
    let s = server.stats();
    assert!(s.sleeps > 0, "the server slept");
    assert!(
        s.peer_socket_datagrams > 0 && s.peer_socket_datagrams < s.datagrams_received,
        "one client on a socket of its own, the other on the main one: {s:?}"
    );
}
