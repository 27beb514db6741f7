//! Connecting over UDP on loopback: a peer whose UDP does not answer is reached over TCP,
//! one whose UDP answers stays on it, one whose first address does not answer is reached
//! at its second, both failing says why, half-made and unwelcome connections are dropped,
//! a flood of hellos makes no peers.

mod common;

use clink::{Context, Endpoint, Error};
use common::udp::net_ctx;
use common::{recv_vec, T};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// `addr` with its UDP address replaced by `udp`.
fn with_udp(addr: &str, udp: std::net::SocketAddr) -> String {
    let mut a = clink_proto::addr::Address::parse(addr).unwrap();
    a.udp = vec![udp];
    a.to_string()
}

/// An endpoint over UDP (its context, which must outlive it) and its parsed address, for
/// tests that hand connectors a doctored one.
fn listening() -> (Context, Endpoint, clink_proto::addr::Address) {
    let ctx = net_ctx("", 2000);
    let a = ctx.endpoint().unwrap();
    let me = clink_proto::addr::Address::parse(&a.address()).unwrap();
    (ctx, a, me)
}

/// A thread connecting to `addr` with a 300 ms fallback, which takes at least that long
/// and ends on `transport` (having fallen back when that is "tcp"), then sends a word in
/// its name with tag 5.
fn connect_past_fallback(
    addr: String,
    transport: &'static str,
) -> std::thread::JoinHandle<(Context, Endpoint)> {
    std::thread::spawn(move || {
        let ctx = net_ctx("fallback", 2000);
        let mut b = ctx.endpoint().unwrap();
        let t = Instant::now();
        let p = b.connect(&addr).unwrap();
        let took = t.elapsed();
        assert_eq!(b.transport(p).unwrap(), transport);
        assert_eq!(b.stats().udp_fallbacks, u64::from(transport == "tcp"));
        assert!(took >= Duration::from_millis(300), "{took:?}");
        b.send(p, 5, transport.as_bytes()).unwrap();
        (ctx, b)
    })
}

/// Accepts [`connect_past_fallback`]'s peer on `a` and receives its word.
fn accept_word(a: &mut Endpoint, transport: &str) {
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(a.transport(pa).unwrap(), transport);
    assert_eq!(recv_vec(a, pa, 5, 16), transport.as_bytes());
}

#[test]
fn a_peer_whose_udp_does_not_answer_is_reached_over_tcp() {
    // The peer's UDP address leads to a socket that drops everything, as a firewall
    // dropping UDP would; its TCP address is its own. The connect gives UDP up after
    // the fallback time and connects over TCP; the peer is offered nothing over UDP.
    let ctx = net_ctx("", 2000);
    let mut a = ctx.endpoint().unwrap();
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = with_udp(&a.address(), silent.local_addr().unwrap());
    let client = connect_past_fallback(addr, "tcp");
    accept_word(&mut a, "tcp");
    // The hellos did reach the silent socket (nothing else answered them).
    silent.set_nonblocking(true).unwrap();
    assert!(silent.recv_from(&mut [0u8; 2048]).is_ok());
    drop(client.join().unwrap());
}

#[test]
fn a_peer_whose_first_address_does_not_answer_is_reached_at_its_second() {
    // The peer advertises two UDP addresses and no TCP one; the first (the one a
    // connector on its host picks) leads to a socket that drops everything, as an
    // unrouted or firewalled network would. After three unanswered hellos the connect
    // sends them to the second address too, which answers: the connection goes there.
    let (_ctx, mut a, me) = listening();
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut at = me.clone();
    at.udp = vec![silent.local_addr().unwrap(), me.udp[0]];
    at.tcp = Vec::new();
    let addr = at.to_string();
    let client = std::thread::spawn(move || {
        let ctx = net_ctx("", 2000);
        let mut b = ctx.endpoint().unwrap();
        let t = Instant::now();
        let p = b.connect(&addr).unwrap();
        let took = t.elapsed();
        assert_eq!(b.transport(p).unwrap(), "udp");
        // Hellos go out every 100 ms: the fourth, the first to the second address, at 300.
        assert!(took >= Duration::from_millis(300), "{took:?}");
        b.send(p, 5, b"second").unwrap();
        let back = recv_vec(&mut b, p, 6, 16);
        (ctx, b, back)
    });
    let pa = a.accept(Some(T)).unwrap();
    assert_eq!(recv_vec(&mut a, pa, 5, 16), b"second");
    a.send(pa, 6, b"both ways").unwrap();
    let (_ctx_b, _b, back) = client.join().unwrap();
    assert_eq!(back, b"both ways");
    // The first address had the first hellos, and more after the second was tried.
    silent.set_nonblocking(true).unwrap();
    let mut hellos = 0;
    while silent.recv_from(&mut [0u8; 2048]).is_ok() {
        hellos += 1;
    }
    assert!(hellos >= 4, "{hellos} hellos at the first address");
    assert!(a.accept(Some(Duration::ZERO)).is_err(), "one peer only");
}

#[test]
fn a_connect_whose_udp_answers_once_tcp_is_made_stays_on_udp() {
    // The first hellos are lost (as behind a lost ARP request): the connect reaches the
    // fallback time and makes a TCP connection, which proves the path; UDP answers in its
    // last chance and wins. The TCP connection closes unused, before its hello.
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (_ctx, mut a, me) = listening();
    // A relay in front of the peer's UDP address that drops everything until a TCP
    // connection reaches the listener in front of its TCP address.
    let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
    relay
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut at = me.clone();
    at.udp = vec![relay.local_addr().unwrap()];
    at.tcp = vec![listener.local_addr().unwrap()];
    let (open, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let peer_udp = me.udp[0];
    let relaying = {
        let (open, done) = (open.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut connector, mut dropped) = (None, 0);
            let mut buf = [0u8; 65536];
            while !done.load(Ordering::Relaxed) {
                let Ok((n, from)) = relay.recv_from(&mut buf) else {
                    continue;
                };
                if from == peer_udp {
                    if let Some(c) = connector {
                        relay.send_to(&buf[..n], c).unwrap();
                    }
                } else if open.load(Ordering::Relaxed) {
                    connector = Some(from);
                    relay.send_to(&buf[..n], peer_udp).unwrap();
                } else {
                    dropped += 1;
                }
            }
            dropped
        })
    };
    let accepting = {
        let open = open.clone();
        std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            open.store(true, Ordering::Relaxed);
            sock.set_read_timeout(Some(T)).unwrap();
            let mut got = Vec::new();
            sock.read_to_end(&mut got).unwrap();
            got.len()
        })
    };
    let client = connect_past_fallback(at.to_string(), "udp");
    accept_word(&mut a, "udp");
    let (_ctx, b) = client.join().unwrap();
    drop(b);
    assert_eq!(
        accepting.join().unwrap(),
        0,
        "the TCP connection sent its hello"
    );
    done.store(true, Ordering::Relaxed);
    assert!(relaying.join().unwrap() > 0, "no hello was lost");
}

#[test]
fn a_connect_whose_udp_and_tcp_both_fail_says_why_for_each() {
    // UDP silent, TCP refused (no listener on that port): the connect keeps trying UDP
    // until its timeout, then names both.
    let (_ctx, _a, mut at) = listening();
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    at.udp = vec![silent.local_addr().unwrap()];
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    at.tcp = vec![closed.local_addr().unwrap()];
    drop(closed);
    let ctx = net_ctx("fallback shortconnect", 2000);
    let mut b = ctx.endpoint().unwrap();
    let t = Instant::now();
    let e = b.connect(&at.to_string()).unwrap_err().to_string();
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(
        e.contains("no answer from") && e.contains("TCP connect to"),
        "{e}"
    );
    assert!(e.contains("refused"), "{e}");
    assert_eq!(b.stats().udp_fallbacks, 0);
}

#[test]
fn a_tcp_connection_closed_before_its_hello_is_dropped_quietly() {
    // What a connector that reached this endpoint over UDP after all leaves behind.
    let (_ctx, mut a, me) = listening();
    drop(std::net::TcpStream::connect(me.tcp[0]).unwrap());
    let t = Instant::now();
    while a.stats().handshakes_abandoned == 0 {
        assert!(t.elapsed() < T, "never dropped: {:?}", a.stats());
        assert!(a.accept(Some(Duration::from_millis(10))).is_err());
    }
    let s = a.stats();
    assert_eq!((s.handshakes_abandoned, s.handshakes_refused), (1, 0));
    assert_eq!(a.last_error(), None);
}

#[test]
fn a_welcomed_connection_is_offered_only_once_its_connector_takes_it_up() {
    // A hello alone (from a connector that then gave up, or fell back to TCP) is
    // answered but makes no peer; the connector's next datagram makes it one.
    use clink_proto::reliable::{Datagram, Handshake};
    let (_ctx, mut a, me) = listening();
    let connector = UdpSocket::bind("127.0.0.1:0").unwrap();
    connector.set_read_timeout(Some(T)).unwrap();
    let (conn, from) = (0x77, 0x1234_5678);
    let mut hello = Vec::new();
    Datagram::Hello {
        conn,
        hs: Handshake {
            from,
            to: me.id,
            mtu_payload: 1400,
            payload_hash: false,
            two_paths: false,
            crossed: false,
        },
    }
    .encode(&mut hello);
    connector.send_to(&hello, me.udp[0]).unwrap();
    assert!(matches!(
        a.accept(Some(Duration::from_millis(300))),
        Err(Error::Timeout)
    ));
    let mut buf = [0u8; 2048];
    let (n, _) = connector.recv_from(&mut buf).expect("a welcome");
    assert!(
        matches!(Datagram::parse(&buf[..n]), Ok(Datagram::Welcome { conn: c, .. }) if c == conn),
        "{:?}",
        Datagram::parse(&buf[..n])
    );
    let mut ping = Vec::new();
    Datagram::Ping { conn, floor: 0 }.encode(&mut ping);
    connector.send_to(&ping, me.udp[0]).unwrap();
    let p = a.accept(Some(T)).unwrap();
    assert_eq!(a.peer_endpoint_id(p).unwrap(), from);
}

#[test]
fn a_flood_of_hellos_makes_no_peers_and_keeps_the_endpoint_open() {
    // 1 100 hellos naming this endpoint, each a new connection from one socket (forged
    // ones, say), none followed by anything: they are welcomed, kept at most 1 024 at a
    // time, and never offered as peers; a real connector still gets in.
    use clink_proto::reliable::{Datagram, Handshake};
    let (_ctx, mut a, me) = listening();
    let flood = UdpSocket::bind("127.0.0.1:0").unwrap();
    for conn in 1..=1100u32 {
        let mut hello = Vec::new();
        Datagram::Hello {
            conn,
            hs: Handshake {
                from: 0xbad,
                to: me.id,
                mtu_payload: 1400,
                payload_hash: false,
                two_paths: false,
                crossed: false,
            },
        }
        .encode(&mut hello);
        flood.send_to(&hello, me.udp[0]).unwrap();
    }
    let deadline = Instant::now() + T;
    while a.stats().handshakes_abandoned < 76 && Instant::now() < deadline {
        a.progress();
    }
    assert_eq!(a.stats().handshakes_abandoned, 76);
    assert!(matches!(
        a.accept(Some(Duration::from_millis(300))),
        Err(Error::Timeout)
    ));
    let addr = a.address();
    let client = std::thread::spawn(move || {
        let ctx = net_ctx("", 2000);
        let mut b = ctx.endpoint().unwrap();
        let p = b.connect(&addr).unwrap();
        b.send(p, 1, b"in").unwrap();
        (ctx, b)
    });
    let p = a.accept(Some(T)).unwrap();
    assert_ne!(a.peer_endpoint_id(p).unwrap(), 0xbad);
    assert_eq!(recv_vec(&mut a, p, 1, 8), b"in");
    drop(client.join().unwrap());
}
