//! The UDP transport's unit tests.

use super::*;
use std::net::IpAddr;

fn transport(ring: bool, bind: IpAddr) -> UdpTransport {
    let cfg = UdpConfig {
        bind: SocketAddr::new(bind, 0),
        ring,
        ..UdpConfig::default()
    };
    UdpTransport::new(cfg, 1).expect("a loopback socket")
}

/// Bulk datagrams carry no connection id: with one link from an address they go to
/// it, with two (connected both ways, or a restarted peer's old and new connection)
/// to the one whose id sealed the checksum, and a removed link's traffic to the other.
#[test]
fn bulk_datagrams_are_routed_by_source_and_checksum() {
    let a: SocketAddr = "10.1.0.1:4000".parse().unwrap();
    let b: SocketAddr = "10.1.0.2:4000".parse().unwrap();
    let bulk = |conn: u32| {
        let hdr = BulkHeader {
            pn: 3,
            floor: 0,
            xfer: 1,
            offset: 0,
            hashed: conn.is_multiple_of(2),
        };
        let mut d = Vec::new();
        Datagram::Bulk {
            conn,
            hdr,
            payload: &[5; 100],
        }
        .encode(&mut d);
        d
    };
    let mut r = Routes::default();
    r.insert((a, 7), 0);
    assert_eq!(r.get_src(a, &bulk(7)), Some(0));
    assert_eq!(r.get_src(b, &bulk(7)), None);
    r.insert((a, 8), 1);
    r.insert((b, 7), 2);
    for _ in 0..2 {
        assert_eq!(r.get_src(a, &bulk(7)), Some(0));
        assert_eq!(r.get_src(a, &bulk(8)), Some(1));
        assert_eq!(r.get_src(a, &bulk(9)), None);
        assert_eq!(r.get_src(b, &bulk(7)), Some(2));
    }
    assert_eq!(r.remove((a, 7)), Some(0));
    assert_eq!(r.get_src(a, &bulk(8)), Some(1));
    assert_eq!(r.remove((a, 8)), Some(1));
    assert_eq!(r.get_src(a, &bulk(8)), None);
    assert_eq!(r.get((b, 7)), Some(2));
}

#[test]
fn a_handshake_says_whether_small_datagrams_take_another_path_and_the_peer_judges_by_it() {
    let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let dest = SocketAddr::new(lo4, 9);
    // Said before the ring opens (it opens with the first routed peer, after that
    // peer's connection is made), and not by an endpoint that will have none.
    for (ring, bind, says) in [
        (true, lo4, true),
        (false, lo4, false),
        (true, IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), false),
    ] {
        let t = transport(ring, bind);
        assert!(!t.has_ring());
        assert_eq!(
            t.st.handshake(2, dest).two_paths,
            says,
            "ring {ring}, {bind}"
        );
    }
    // The peer's paths decide how this end's sends judge losses, whatever its own.
    for ring in [true, false] {
        let t = transport(ring, lo4);
        for two_paths in [true, false] {
            let peer = Handshake {
                from: 2,
                to: 1,
                mtu_payload: 1400,
                payload_hash: false,
                two_paths,
                crossed: false,
            };
            assert_eq!(t.st.conn_config(7, dest, &peer).split_paths, two_paths);
        }
    }
}

/// The transport keeps its links by peer index: a datagram read from the socket goes
/// straight to its link, whose delivered frame the endpoint then finds under that index;
/// a detached link (its peer failed) leaves the live list, gets nothing more (what comes
/// is stray) and stays readable.
#[test]
fn the_transport_hands_datagrams_to_its_links_and_a_detached_one_gets_none() {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut t = transport(false, lo);
    let peer = std::net::UdpSocket::bind((lo, 0)).unwrap();
    let cfg = reliable::Config {
        conn_id: 7,
        ..reliable::Config::default()
    };
    let mut sender = Conn::new(cfg.clone(), 0);
    t.adopt(
        3,
        UdpLink::new(Conn::new(cfg, 0), peer.local_addr().unwrap(), 2, false),
    );
    assert_eq!(t.live_links().map(|(i, _)| i).collect::<Vec<_>>(), [3]);
    assert!(t.link(0).is_none() && t.link(4).is_none());
    let to = t.sock.local();
    let mut send = |msg: &[u8]| {
        sender.send(0, msg).unwrap();
        let mut buf = Vec::new();
        let tx = sender
            .poll_transmit_with(0, &mut buf, &mut |_, _, _| None)
            .expect("a datagram");
        buf.truncate(tx.len);
        peer.send_to(&buf, to).unwrap();
    };
    // (Sent to a socket on this host: it is there when the sendto returns.)
    send(b"hello");
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.link(3).unwrap().frames().peek().is_none() {
        t.receive(true);
        assert!(t.run_timers(t.now()).is_empty());
        assert!(
            Instant::now() < deadline,
            "the datagram never reached its link"
        );
    }
    assert_eq!(t.link(3).unwrap().frames().peek(), Some(&b"hello"[..]));
    t.link_mut(3).unwrap().release();
    t.detach(3);
    assert_eq!(t.live_links().count(), 0);
    let stray = t.stats().stray;
    send(b"again");
    while t.stats().stray == stray {
        t.receive(true);
        assert!(
            Instant::now() < deadline,
            "the datagram was not counted stray"
        );
    }
    assert!(t.link(3).unwrap().frames().peek().is_none());
    assert_eq!(t.link(3).unwrap().conn().stats().datagrams_received, 1);
}
