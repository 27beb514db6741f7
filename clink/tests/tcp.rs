//! The TCP transport over loopback (CLINK_TRANSPORT=tcp semantics: TCP even on one host):
//! every size class with checksums, speculative receive on and off, sleeping waiters,
//! tags and any-source matching across two senders, transport selection, stale
//! addresses, a peer reached at its second address when its first refuses, malformed
//! bytes on the stream, a peer killed mid-transfer, and close.

mod common;

use clink::config::TcpConfig;
use clink::{Config, Context, Endpoint, Error, PeerId, Selector};
use clink_proto::addr::Address;
use common::*;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

/// A TCP-everywhere configuration. The liveness timeout is long (10 s): a test thread
/// that generates megabytes of message content between calls into its endpoint must not
/// be taken for dead on a loaded machine (the liveness tests set their own).
fn tcp_config(speculate: bool, spin_us: u64) -> Config {
    tcp_config_dead(speculate, spin_us, 10_000)
}

fn tcp_config_dead(speculate: bool, spin_us: u64, dead_ms: u64) -> Config {
    Config {
        calibrate: false,
        force_net: true,
        prefer_tcp: true,
        spin: Some(Duration::from_micros(spin_us)),
        tcp: Some(TcpConfig {
            bind: (Ipv4Addr::LOCALHOST, 0).into(),
            speculate,
            dead_after: Duration::from_millis(dead_ms),
            ..TcpConfig::default()
        }),
        udp: Some(clink::config::UdpConfig {
            bind: (Ipv4Addr::LOCALHOST, 0).into(),
            ..Default::default()
        }),
        ..Config::default()
    }
}

fn tcp_ctx(speculate: bool, spin_us: u64) -> Context {
    ctx_with(tcp_config(speculate, spin_us))
}

/// Connects two endpoints over TCP: (server, its peer id for the client), (client, its
/// peer id for the server).
fn pair(speculate: bool, spin_us: u64) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
    pair_dead(speculate, spin_us, 10_000)
}

/// As [`pair`], with the liveness timeout `dead_ms`.
fn pair_dead(
    speculate: bool,
    spin_us: u64,
    dead_ms: u64,
) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
    connect_pair(
        move || ctx_with(tcp_config_dead(speculate, spin_us, dead_ms)),
        "tcp",
    )
}

const SIZES: &[usize] = &[
    0,
    1,
    8,
    1000,
    4096,
    65535,
    65536,
    65537,
    300_000,
    (1 << 20) - 1,
    1 << 20,
    (1 << 20) + 1,
    5 << 20,
];

fn round_trips(b: &mut Endpoint, pb: PeerId, rounds: usize, seed: u64) {
    let mut buf = vec![0u8; 8 << 20];
    for r in 0..rounds {
        for (k, &n) in SIZES.iter().enumerate() {
            let tag = (r * 100 + k + 1) as u64;
            let msg = pattern(key(seed, tag), n);
            b.send(pb, tag, &msg).unwrap();
            let st = b
                .recv_timeout(Selector::exact(Some(pb), tag), &mut buf, Some(T))
                .unwrap_or_else(|e| panic!("size {n}: {e}: {:?}", b.stats()));
            assert_eq!(st.len as usize, n, "size {n}");
            check(
                key(seed, tag),
                &buf[..n],
                &format!("echo of {n} bytes, round {r}"),
            );
        }
    }
    b.send(pb, 0, &[]).unwrap();
    b.recv_timeout(Selector::exact(Some(pb), 0), &mut buf, Some(T))
        .unwrap();
}

/// Bytes of the SIZES sent by rendezvous (above the 64 KiB network eager limit).
fn rendezvous_bytes() -> u64 {
    SIZES
        .iter()
        .filter(|&&n| n > 65536)
        .map(|&n| n as u64)
        .sum()
}

#[test]
fn every_size_class_round_trips_over_loopback_tcp() {
    let ((a, pa), (mut b, pb)) = pair(true, 20);
    let server = std::thread::spawn(move || echo(a, pa));
    round_trips(&mut b, pb, 2, 1);
    let a = join_echo(&mut b, server);
    let (sa, sb) = (a.stats(), b.stats());
    println!("server: {sa:?}\nclient: {sb:?}");
    assert!(sb.stream_writes > 0 && sb.stream_reads > 0, "{sb:?}");
    assert_eq!(sa.protocol_errors + sb.protocol_errors, 0);
    // The large messages and echoes came as rendezvous payloads received in place: every
    // payload byte either landed by speculation or was read straight into the buffer after
    // its header, apart from what cleanup copied; most of it without a copy.
    for s in [sa, sb] {
        let placed = s.spec_hit_bytes + s.stream_direct_bytes + s.cleanup_bytes;
        assert_eq!(placed, 2 * rendezvous_bytes(), "{s:?}");
        assert!(s.spec_hits > 0, "{s:?}");
        assert!(
            s.cleanup_bytes * 10 < placed,
            "more than a tenth copied: {s:?}"
        );
    }
}

#[test]
fn the_bytes_put_on_the_wire_over_tcp_are_counted() {
    let ((mut a, pa), (mut b, pb)) = pair(true, 20);
    let before = b.wire_bytes_sent(pb).unwrap().expect("a TCP peer's count");
    let resent_before = b.wire_bytes_resent(pb).unwrap().unwrap();
    let msg = vec![7u8; 1 << 20];
    // The receiver on a thread of its own: a rendezvous needs both sides driven.
    let rx = std::thread::spawn(move || {
        let mut got = vec![0u8; 1 << 20];
        a.recv_timeout(Selector::exact(Some(pa), 1), &mut got, Some(T))
            .unwrap();
        (a, got)
    });
    b.send(pb, 1, &msg).unwrap();
    let (a, got) = rx.join().unwrap();
    assert_eq!(got, msg);
    let sent = b.wire_bytes_sent(pb).unwrap().unwrap() - before;
    // The kernel's own resends (a late ack on a loaded machine) are its business.
    let resent = b.wire_bytes_resent(pb).unwrap().unwrap() - resent_before;
    assert!(resent <= sent, "{resent} of {sent}");
    // The message and clink's frame headers; nothing near a second copy.
    let first = sent - resent;
    assert!(
        (1 << 20..(1 << 20) + (64 << 10)).contains(&first),
        "{sent} sent, {resent} of them resent by the kernel"
    );
    // The receiver sent only small answers.
    assert!(a.wire_bytes_sent(pa).unwrap().unwrap() < 64 << 10);
}

#[test]
fn rendezvous_without_speculation_takes_the_copy_path() {
    let ((a, pa), (mut b, pb)) = pair(false, 20);
    let server = std::thread::spawn(move || echo(a, pa));
    round_trips(&mut b, pb, 1, 3);
    let a = join_echo(&mut b, server);
    for s in [a.stats(), b.stats()] {
        assert_eq!((s.spec_hits, s.spec_misses), (0, 0), "{s:?}");
        assert_eq!(
            s.stream_direct_bytes + s.cleanup_bytes,
            rendezvous_bytes(),
            "{s:?}"
        );
    }
}

#[test]
fn sleeping_waiters_are_woken_by_tcp_data() {
    // No spinning: every wait sleeps in epoll_wait on the endpoint's fd, so each message
    // must wake it through the TCP socket's readiness (and a full socket's writability).
    // Each answer must come well within the endpoint's 1 s safety wake-up: a sleeper
    // that only the timer woke would fail the 500 ms bound.
    let ((a, pa), (mut b, pb)) = pair(true, 0);
    let server = std::thread::spawn(move || echo(a, pa));
    let mut buf = vec![0u8; 8 << 20];
    for (k, &n) in SIZES.iter().enumerate() {
        let tag = k as u64 + 1;
        let msg = pattern(key(5, tag), n);
        b.send(pb, tag, &msg).unwrap();
        let st = b
            .recv_timeout(
                Selector::exact(Some(pb), tag),
                &mut buf,
                Some(Duration::from_millis(500)),
            )
            .unwrap_or_else(|e| panic!("size {n}: {e}: {:?}", b.stats()));
        check(key(5, tag), &buf[..st.len as usize], "echo");
    }
    b.send(pb, 0, &[]).unwrap();
    b.recv_timeout(Selector::exact(Some(pb), 0), &mut buf, Some(T))
        .unwrap();
    let a = join_echo(&mut b, server);
    assert!(a.stats().sleeps > 0 && b.stats().sleeps > 0);
}

#[test]
fn tags_and_any_source_across_two_senders() {
    let mut a = tcp_ctx(true, 20).endpoint().unwrap();
    let addr = a.address();
    let seed = seed(11);
    const N: u64 = 200;
    let senders: Vec<_> = (0..2u64)
        .map(|s| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut b = tcp_ctx(true, 20).endpoint().unwrap();
                let p = b.connect(&addr).unwrap();
                let mut rng = Rng::new(seed ^ s);
                let mut reqs = Vec::new();
                for i in 0..N {
                    let n = match rng.below(8) {
                        0 => rng.range(65537, 2 << 20),
                        _ => rng.below(4000),
                    } as usize;
                    // Tag: sender in bit 8, kind (i % 3) in the low bits.
                    let tag = (s << 8) | (i % 3);
                    let msg = pattern(key(seed, (s << 32) | i), n);
                    reqs.push(b.isend(p, tag, msg).unwrap());
                }
                for r in &reqs {
                    b.wait_send(r, Some(T)).unwrap();
                }
                // Stay until the receiver has everything.
                recv_vec(&mut b, p, 99, 8);
                b
            })
        })
        .collect();
    let mut peers = Vec::new();
    for _ in 0..2 {
        peers.push(a.accept(Some(T)).unwrap());
    }
    // First: the kind-2 messages only (a tag mask), from any source; the others wait as
    // unexpected.
    let mut buf = vec![0u8; 2 << 20];
    let mut next = [[0u64; 3]; 2]; // per sender, per kind: next message index
    let mut owner = std::collections::HashMap::new();
    let mut got = 0;
    let want2: u64 = 2 * (0..N).filter(|i| i % 3 == 2).count() as u64;
    let mut take = |a: &mut Endpoint, sel: Selector, got: &mut u64| {
        let st = a.recv_timeout(sel, &mut buf, Some(T)).unwrap();
        let (s, kind) = (st.tag >> 8, st.tag & 0xff);
        // Each peer is one sender (accepted in whatever order they connected).
        let who = *owner.entry(st.peer).or_insert(s);
        assert_eq!(who, s, "sender in the tag vs the peer it came from");
        // Per (sender, tag) order: the next index of this kind.
        let mut i = next[s as usize][kind as usize];
        while i % 3 != kind {
            i += 1;
        }
        next[s as usize][kind as usize] = i + 1;
        check(key(seed, (s << 32) | i), &buf[..st.len as usize], "message");
        *got += 1;
    };
    for _ in 0..want2 {
        take(
            &mut a,
            Selector {
                src: None,
                tag: 2,
                mask: 0xff,
            },
            &mut got,
        );
    }
    while got < 2 * N {
        take(&mut a, Selector::any(), &mut got);
    }
    assert_eq!(owner.len(), 2);
    assert_ne!(owner[&peers[0]], owner[&peers[1]]);
    for &p in &peers {
        a.send(p, 99, b"done").unwrap();
    }
    for s in senders {
        drop(s.join().unwrap());
    }
}

#[test]
fn selection_prefers_udp_unless_told_or_only_tcp_is_offered() {
    // Both offer UDP and TCP; the connector is in plain network mode: UDP.
    let udp_mode = Config {
        prefer_tcp: false,
        ..tcp_config(true, 20)
    };
    let mut a = ctx_with(udp_mode.clone()).endpoint().unwrap();
    let addr = a.address();
    assert!(addr.contains(";udp=") && addr.contains(";tcp="), "{addr}");
    let t = std::thread::spawn(move || {
        let mut b = ctx_with(udp_mode).endpoint().unwrap();
        let p = b.connect(&addr).unwrap();
        (b.transport(p).unwrap(), b)
    });
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(a.transport(pa).unwrap(), "udp");
    assert_eq!(t.join().unwrap().0, "udp");

    // The listener offers only TCP (UDP off): a UDP-preferring connector takes TCP.
    let mut a = ctx_with(Config {
        udp: None,
        ..tcp_config(true, 20)
    })
    .endpoint()
    .unwrap();
    let addr = a.address();
    assert!(!addr.contains(";udp="), "{addr}");
    let t = std::thread::spawn(move || {
        let cfg = Config {
            prefer_tcp: false,
            ..tcp_config(true, 20)
        };
        let mut b = ctx_with(cfg).endpoint().unwrap();
        let p = b.connect(&addr).unwrap();
        (b.transport(p).unwrap(), b)
    });
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(a.transport(pa).unwrap(), "tcp");
    assert_eq!(t.join().unwrap().0, "tcp");

    // TCP off on the connector and only TCP offered: a clear error.
    let mut c = ctx_with(Config {
        tcp: None,
        ..tcp_config(true, 20)
    })
    .endpoint()
    .unwrap();
    match c.connect(&a.address()) {
        Err(e @ Error::Connect { .. }) => assert!(e.to_string().contains("CLINK_TCP"), "{e}"),
        r => panic!("expected Error::Connect, got {r:?}"),
    }
}

#[test]
fn a_stale_address_is_refused_with_a_clear_error() {
    let mut a = tcp_ctx(true, 20).endpoint().unwrap();
    // The same TCP address with another endpoint id: what a restarted server leaves.
    let mut stale = Address::parse(&a.address()).unwrap();
    stale.id ^= 1;
    let stale = stale.to_string();
    let t = std::thread::spawn(move || {
        let mut b = tcp_ctx(true, 20).endpoint().unwrap();
        let r = b.connect(&stale);
        (r.map(|_| ()), b)
    });
    // Serve the listener until the connector has its answer.
    let deadline = Instant::now() + T;
    while !t.is_finished() {
        assert!(Instant::now() < deadline, "connect never returned");
        a.progress();
        let _ = a.accept(Some(Duration::from_millis(1)));
    }
    match t.join().unwrap().0 {
        Err(e @ Error::Connect { .. }) => assert!(e.to_string().contains("stale"), "{e}"),
        r => panic!("expected Error::Connect, got {r:?}"),
    }
    assert_eq!(a.peers().len(), 0);
    assert!(a.stats().handshakes_refused >= 1, "{:?}", a.stats());
}

#[test]
fn a_peer_whose_first_tcp_address_refuses_is_reached_at_its_second() {
    // The peer advertises two TCP addresses; nothing listens at the first (a port just
    // closed: the connect is refused at once), and the connect goes on to the second.
    let mut a = tcp_ctx(true, 20).endpoint().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut at = Address::parse(&a.address()).unwrap();
    at.tcp = vec![closed, at.tcp[0]];
    let at = at.to_string();
    let t = std::thread::spawn(move || {
        let mut b = tcp_ctx(true, 20).endpoint().unwrap();
        let p = b.connect(&at).unwrap();
        assert_eq!(b.transport(p).unwrap(), "tcp");
        b.send(p, 3, b"second address").unwrap();
        b
    });
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(recv_vec(&mut a, pa, 3, 32), b"second address");
    drop(t.join().unwrap());
    // Both refused: the error names each address and why.
    let closed2 = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut dead = Address::parse(&a.address()).unwrap();
    dead.tcp = vec![closed, closed2];
    let mut b = tcp_ctx(true, 20).endpoint().unwrap();
    let e = b.connect(&dead.to_string()).unwrap_err().to_string();
    for c in [closed, closed2] {
        assert!(e.contains(&format!("TCP connect to {c}: ")), "{e}");
    }
}

#[test]
fn a_peer_whose_first_tcp_address_reaches_another_endpoint_is_reached_at_its_second() {
    // The peer advertises two TCP addresses; the first is another endpoint's (an address
    // hosts of other networks share, such as a container bridge's), which refuses the
    // hello, and the connect goes on to the second.
    let mut a = tcp_ctx(true, 20).endpoint().unwrap();
    let mut other = tcp_ctx(true, 20).endpoint().unwrap();
    let wrong = Address::parse(&other.address()).unwrap().tcp[0];
    let mut at = Address::parse(&a.address()).unwrap();
    at.tcp = vec![wrong, at.tcp[0]];
    let at = at.to_string();
    let t = std::thread::spawn(move || {
        let mut b = tcp_ctx(true, 20).endpoint().unwrap();
        let r = b.connect(&at);
        if let Ok(p) = r {
            b.send(p, 3, b"second address").unwrap();
        }
        (r, b)
    });
    // Serve both listeners until the connector has its answer.
    let deadline = Instant::now() + T;
    while !t.is_finished() {
        assert!(Instant::now() < deadline, "connect never returned");
        other.progress();
        a.progress();
    }
    let (r, b) = t.join().unwrap();
    let p = r.unwrap();
    assert_eq!(b.transport(p).unwrap(), "tcp");
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(recv_vec(&mut a, pa, 3, 32), b"second address");
    assert_eq!(other.peers().len(), 0);
    assert!(other.stats().handshakes_refused >= 1, "{:?}", other.stats());
    drop(b);
}

/// Reads the listener's welcome on a raw socket, bounded.
fn read_welcome(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(T)).unwrap();
    let mut w = vec![0u8; 64];
    s.read_exact(&mut w).unwrap();
    w
}

#[test]
fn malformed_streams_kill_only_their_own_link() {
    let ((mut a, pa), (b, pb)) = pair(true, 20);
    let addr = Address::parse(&a.address()).unwrap();
    let (target, my_id) = (addr.tcp[0], addr.id);
    let hello = |to: u128| {
        clink_proto::stream::Handshake {
            from: 77,
            to,
            status: 0,
            crossed: false,
        }
        .record(clink_proto::stream::Kind::Hello)
    };
    let mut rng = Rng::new(9);
    let mut evil = Vec::new();
    // 1. Garbage instead of a hello: the connection is refused.
    let mut s = TcpStream::connect(target).unwrap();
    let mut junk = vec![0u8; 100];
    fill(1, &mut junk);
    junk[0] = 9;
    s.write_all(&junk).unwrap();
    evil.push(s);
    // 2. A hello naming another endpoint: refused, with a welcome saying so.
    let mut s = TcpStream::connect(target).unwrap();
    s.write_all(&hello(my_id ^ 5)).unwrap();
    evil.push(s);
    // 3..8. A proper hello, then a malformed record: a peer that dies of it.
    let bad_records: Vec<Vec<u8>> = vec![
        // unknown kind
        [9u8; 24].to_vec(),
        // reserved bytes set
        {
            let mut h = clink_proto::stream::Header::frame(4).encode().to_vec();
            h[1] = 1;
            h
        },
        // a frame record whose frame does not parse
        {
            let mut h = clink_proto::stream::Header::frame(4).encode().to_vec();
            h.extend_from_slice(&[0xff; 4]);
            h
        },
        // data for a transfer nobody expects
        clink_proto::stream::Header::data(12345, 0, 10)
            .encode()
            .to_vec(),
        // a second hello
        hello(my_id).to_vec(),
        // a length beyond the limit
        {
            let mut h = clink_proto::stream::Header::frame(0).encode().to_vec();
            h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            h
        },
    ];
    let n_bad = bad_records.len();
    let mut welcomed = Vec::new();
    for r in &bad_records {
        let mut s = TcpStream::connect(target).unwrap();
        s.write_all(&hello(my_id)).unwrap();
        welcomed.push((s, r.clone()));
    }
    // Serve until every hello was answered: 2 refused, n_bad accepted.
    let deadline = Instant::now() + T;
    let mut new_peers = Vec::new();
    while new_peers.len() < n_bad || a.stats().handshakes_refused < 2 {
        assert!(Instant::now() < deadline, "{:?}", a.stats());
        if let Ok(p) = a.accept(Some(Duration::from_millis(5))) {
            new_peers.push(p);
        }
    }
    let w = read_welcome(&mut evil[1]);
    let hs = clink_proto::stream::Handshake::parse(&w[24..]).unwrap();
    assert_eq!(hs.status, clink_proto::stream::REFUSED_WRONG_ID);
    for (s, r) in &mut welcomed {
        let w = read_welcome(s);
        assert_eq!(
            clink_proto::stream::Handshake::parse(&w[24..])
                .unwrap()
                .status,
            0
        );
        // Random noise after the bad record does not matter: the link is dead by then.
        let mut tail = vec![0u8; rng.below(64) as usize];
        fill(rng.next_u64(), &mut tail);
        s.write_all(r).unwrap();
        s.write_all(&tail).unwrap();
    }
    drive_until(&mut a, T, "the malformed peers' deaths", |a| {
        !new_peers.iter().any(|&p| a.is_alive(p))
    });
    let s = a.stats();
    assert_eq!(s.protocol_errors, n_bad as u64, "{s:?}");
    // The honest peer still works both ways.
    let t = std::thread::spawn(move || {
        let mut b = b;
        b.send(pb, 3, b"still here").unwrap();
        let mut buf = [0u8; 16];
        let st = b
            .recv_timeout(Selector::exact(Some(pb), 4), &mut buf, Some(T))
            .unwrap();
        assert_eq!(&buf[..st.len as usize], b"and you");
        b
    });
    let mut buf = [0u8; 64];
    let st = a
        .recv_timeout(Selector::exact(Some(pa), 3), &mut buf, Some(T))
        .unwrap();
    assert_eq!(&buf[..st.len as usize], b"still here");
    a.send(pa, 4, b"and you").unwrap();
    drop(t.join().unwrap());
    // The refused connections were closed by the endpoint: the raw sockets read the end.
    for mut s in evil {
        s.set_read_timeout(Some(T)).unwrap();
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("a refused connection was not closed: {e}"),
        }
    }
}

#[test]
fn a_receiver_that_does_not_read_pushes_back_on_the_sender() {
    // (The receiver does not progress for a while: a long liveness timeout.)
    let ((mut a, pa), (mut b, pb)) = pair_dead(true, 20, 60_000);
    // 400 eager messages of 64 KiB (25 MiB): more than the kernel's socket buffers and the
    // link's 4 MiB send queue hold while nobody reads.
    const N: u64 = 400;
    let mut reqs = Vec::new();
    for i in 0..N {
        reqs.push(b.isend(pb, 1, pattern(i, 65536)).unwrap());
        b.progress();
    }
    let s = b.stats();
    assert!(
        s.ring_full > 0,
        "the sender never found the link full: {s:?}"
    );
    // Now the receiver reads everything, in order, intact; the sender's queue drains.
    let sender = std::thread::spawn(move || {
        for r in &reqs {
            b.wait_send(r, Some(T)).unwrap();
        }
        recv_vec(&mut b, pb, 2, 8);
        b
    });
    let mut buf = vec![0u8; 65536];
    for i in 0..N {
        let st = a
            .recv_timeout(Selector::exact(Some(pa), 1), &mut buf, Some(T))
            .unwrap();
        assert_eq!(st.len, 65536);
        check(i, &buf, "pushed-back message");
    }
    a.send(pa, 2, b"ok").unwrap();
    drop(sender.join().unwrap());
}

#[test]
fn a_peer_that_stops_calling_in_stays_alive_and_resumes() {
    // B computes for ten times the liveness timeout without calling into its endpoint
    // (its kernel answers for the connection, as TCP's does); A waits meanwhile. Neither
    // declares the other dead, and a rendezvous send A started completes once B calls
    // again.
    let ((mut a, pa), (b, pb)) = pair_dead(true, 20, 300);
    drop(away_and_back(&mut a, pa, b, pb, Duration::from_secs(3)));
}

#[test]
fn an_idle_connection_stays_up_on_keepalives() {
    // Both sides progress (sleeping in their waits) but say nothing for 4x the liveness
    // timeout: the keepalives keep the peers alive.
    let ((mut a, pa), (mut b, pb)) = pair_dead(true, 0, 200);
    let t = std::thread::spawn(move || {
        let st = b.recv_timeout(Selector::exact(Some(pb), 1), &mut [0u8; 8], Some(T));
        (st.map(|s| s.len), b)
    });
    let r = a.irecv(Selector::exact(Some(pa), 2), vec![0u8; 8]).unwrap();
    assert!(matches!(
        a.wait_recv(&r, Some(Duration::from_millis(800))),
        Err(Error::Timeout)
    ));
    assert!(a.is_alive(pa), "{:?}", a.last_error());
    a.send(pa, 1, b"hi").unwrap();
    let (len, b) = t.join().unwrap();
    assert_eq!(len.unwrap(), 2);
    drop(b);
}

#[test]
fn a_receiver_on_its_latency_path_still_sends_keepalives() {
    // B streams small messages one way for 4x the liveness timeout; A takes them with
    // blocking receives that spin (the latency path: one peer, nothing else in flight)
    // and never sends: in order, none lost, and A's keepalives still reach B, or B
    // declares A dead. (Here general passes also come whenever B pauses for more than
    // the spin time; the rule that forces one every FAST_STREAK messages is pinned by
    // `endpoint::tcp`'s own test, which drives both ends from one thread.)
    let ((mut a, pa), (mut b, pb)) = pair_dead(true, 100, 200);
    let sender = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_millis(800);
        let mut n = 0u64;
        while Instant::now() < until {
            b.send(pb, 1, &n.to_le_bytes())?;
            b.progress();
            n += 1;
        }
        b.send(pb, 1, &u64::MAX.to_le_bytes())?;
        let alive = b.is_alive(pb);
        Ok::<_, Error>((n, alive, b))
    });
    let mut buf = [0u8; 8];
    let mut got = 0u64;
    loop {
        let st = a
            .recv_timeout(Selector::exact(Some(pa), 1), &mut buf, Some(T))
            .unwrap();
        assert_eq!(st.len, 8);
        let v = u64::from_le_bytes(buf);
        if v == u64::MAX {
            break;
        }
        assert_eq!(v, got, "in order, none lost");
        got += 1;
    }
    let (sent, alive, b) = sender.join().unwrap().expect("A declared dead by B");
    assert_eq!(got, sent);
    assert!(alive, "B took A for dead");
    assert!(a.is_alive(pa), "{:?}", a.last_error());
    drop(b);
}

#[test]
fn close_is_delivered_over_tcp() {
    let (a, b) = pair(true, 20);
    common::close_is_delivered(a, b);
}

/// A peer whose connection resets (a process killed with bytes of ours unread: its
/// kernel answers with a reset) is heard out first: the message it sent before dying is
/// delivered although our next write meets the reset before we read anything, and the
/// peer fails after it. The peer is a raw TCP client speaking the stream format.
#[test]
fn a_peer_that_resets_the_connection_is_heard_out_first() {
    use clink_proto::stream::{Handshake, Header, Kind, HEADER};
    use clink_proto::wire::Frame;
    let mut a = tcp_ctx(true, 20).endpoint().unwrap();
    let addr = Address::parse(&a.address()).unwrap();
    let mut s = TcpStream::connect(addr.tcp[0]).unwrap();
    let hello = Handshake {
        from: 77,
        to: addr.id,
        status: 0,
        crossed: false,
    };
    s.write_all(&hello.record(Kind::Hello)).unwrap();
    let pa = a.accept(Some(T)).unwrap();
    read_welcome(&mut s);
    // Its last words, then our message, which it never reads.
    let last = Frame::Eager {
        tag: 7,
        data: b"last words",
    };
    let mut rec = vec![0u8; HEADER + last.encoded_len()];
    rec[..HEADER].copy_from_slice(&Header::frame(last.encoded_len()).encode());
    last.encode(&mut rec[HEADER..]);
    s.write_all(&rec).unwrap();
    a.send(pa, 1, b"never read").unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.peek(&mut [0u8; 1]).unwrap();
    drop(s);
    // Our next write meets the reset before the last words are read.
    let _ = a.send(pa, 2, b"into a reset");
    last_words_then_gone(&mut a, pa, 7, Duration::from_secs(5));
    assert!(!a.is_alive(pa));
}

#[test]
fn close_delivers_a_backlog_to_a_reader_that_comes_back() {
    // Close waits while the peer is away (no progress, less than the liveness timeout),
    // then for as long as it takes the queue: before, close gave up after 200 ms and
    // dropped the frames still in the link's queue.
    let (a, b) = pair_dead(true, 20, 2000);
    common::close_delivers_a_backlog(a, b, Duration::from_millis(700));
}

#[test]
fn a_large_message_into_a_short_buffer_is_truncated() {
    let ((mut a, pa), (mut b, pb)) = pair(true, 20);
    let sender = std::thread::spawn(move || {
        b.send(pb, 3, &pattern(3, 3 << 20)).unwrap();
        b.send(pb, 4, b"after").unwrap();
        b
    });
    let mut small = vec![0u8; 100_000];
    let r = a.recv_timeout(Selector::exact(Some(pa), 3), &mut small, Some(T));
    assert!(
        matches!(
            r,
            Err(Error::Truncated {
                len: 3_145_728,
                capacity: 100_000
            })
        ),
        "{r:?}"
    );
    assert!(small[..] == pattern(3, 3 << 20)[..100_000]);
    // The stream is intact after the dropped bytes.
    let mut buf = [0u8; 8];
    let st = a
        .recv_timeout(Selector::exact(Some(pa), 4), &mut buf, Some(T))
        .unwrap();
    assert_eq!(&buf[..st.len as usize], b"after");
    drop(sender.join().unwrap());
}

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        // The message is made before connecting: the parent would take a long silence
        // for death.
        let msg = pattern(key(seed, 1), 256 << 20);
        let (mut ep, parent) = child_connect();
        assert_eq!(ep.transport(parent).unwrap(), "tcp");
        match role {
            "big_sender" => {
                let r = ep.isend(parent, 1, msg).unwrap();
                // Until killed.
                let _ = ep.wait_send(&r, Some(T));
                std::process::exit(3);
            }
            r => panic!("unknown role {r}"),
        }
    });
}

#[test]
fn peer_killed_mid_transfer_fails_the_receive_promptly() {
    let seed = seed(42);
    // A liveness timeout far beyond the bound below: the kill must be seen through the
    // connection's end, not through silence.
    let mut ep = ctx_with(tcp_config_dead(true, 20, 60_000))
        .endpoint()
        .unwrap();
    let mut child = spawn(
        "big_sender",
        &ep.address(),
        seed,
        &[
            ("CLINK_TRANSPORT", "tcp"),
            ("CLINK_TCP_BIND", "127.0.0.1:0"),
            ("CLINK_UDP_BIND", "127.0.0.1:0"),
        ],
    );
    let peer = ep.accept(Some(T)).unwrap();
    assert_eq!(ep.transport(peer).unwrap(), "tcp");
    let r = ep
        .irecv(Selector::exact(Some(peer), 1), vec![0u8; 256 << 20])
        .unwrap();
    // Wait until the transfer is under way, then kill the sender.
    drive_until(&mut ep, T, "8 MiB of the transfer", |ep| {
        ep.stats().stream_bytes_received >= 8 << 20
    });
    child.kill();
    child.reap();
    let t = Instant::now();
    match ep.wait_recv(&r, Some(Duration::from_secs(10))) {
        Err(Error::PeerDead(p)) => assert_eq!(p, peer),
        other => panic!("expected PeerDead, got {other:?}"),
    }
    println!("declared dead after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(!ep.is_alive(peer));
}

/// A receiver that computes for three liveness timeouts without calling in, while its peer
/// streams eager messages at it: its window shuts, its kernel keeps answering the sender's
/// zero-window probes, and it is not taken for dead (with `TCP_USER_TIMEOUT` the sender's
/// kernel aborted the connection after the timeout and the stream was lost).
#[test]
fn a_receiver_that_stops_reading_shuts_its_window_and_stays_alive() {
    let dead = Duration::from_millis(1000);
    let (a, b) = pair_dead(true, 20, dead.as_millis() as u64);
    let blocked = stream_to_an_away_receiver(a, b, dead);
    assert!(blocked >= dead * 2, "the window never shut: {blocked:?}");
}
