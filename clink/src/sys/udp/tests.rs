use super::*;

fn lo() -> SocketAddr {
    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)
}

#[test]
fn payloads_from_caller_memory_follow_their_headers() {
    // Bulk datagrams: an 8-byte header in the batch, the payload where it is; grouped
    // into GSO sends (a short last one closes its frame), between plain datagrams.
    let mut a = UdpSock::bind(lo(), 1 << 20).unwrap();
    let mut b = UdpSock::bind(lo(), 1 << 20).unwrap();
    let dest = b.local();
    let src: Vec<u8> = (0..40_000u32).map(|k| (k * 7 + k / 251) as u8).collect();
    let mut batch = TxBatch::new(true);
    let mut want = Vec::new();
    let mut off = 0;
    let mut i = 0u64;
    while off < src.len() {
        let n = (src.len() - off).min(1000);
        let payload = &src[off..off + n];
        want.push([&i.to_le_bytes()[..], payload].concat());
        batch.push_grouped(|buf| {
            buf.extend_from_slice(&i.to_le_bytes());
            Some((8, payload, i.is_multiple_of(16), dest))
        });
        if i == 20 {
            want.push(b"plain".to_vec());
            batch.push(dest, |buf| {
                buf.extend_from_slice(b"plain");
                5
            });
        }
        off += n;
        i += 1;
    }
    assert!(batch.frames.len() < want.len() / 4, "grouped for GSO");
    a.send(&mut batch);
    let mut got: Vec<Vec<u8>> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got.len() < want.len() && std::time::Instant::now() < deadline {
        for k in 0..b.recv_batch() {
            b.for_each_datagram(k, |_, d| got.push(d.to_vec()));
        }
    }
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g == w,
            "datagram {k}: {} bytes {:?}.., want {} bytes {:?}..",
            g.len(),
            &g[..12.min(g.len())],
            w.len(),
            &w[..12.min(w.len())]
        );
    }
}

#[test]
fn a_capped_layout_reads_no_more_entries_than_it_arms() {
    let mut s = UdpSock::bind(lo(), 1 << 20).unwrap();
    let x = std::net::UdpSocket::bind(lo()).unwrap();
    let lead: Vec<Vec<Dst>> = (0..2)
        .map(|_| vec![Dst::from_static(Box::leak(Box::new([0u8; 16])))])
        .collect();
    // Drains the socket; the entries each read returned.
    let drain = |s: &mut UdpSock, n: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut reads = Vec::new();
        while reads.iter().sum::<usize>() < n {
            match s.recv_batch() {
                0 => assert!(std::time::Instant::now() < deadline, "nothing arrived"),
                r => reads.push(r),
            }
        }
        reads
    };
    for capped in [true, false] {
        s.set_lead(&lead, capped);
        for len in 1..=6 {
            x.send_to(&vec![len as u8; 100 + len], s.local()).unwrap();
        }
        let reads = drain(&mut s, 6);
        if capped {
            assert!(reads.iter().all(|&r| r <= 2), "capped reads {reads:?}");
        } else {
            assert!(reads.iter().any(|&r| r > 2), "uncapped reads {reads:?}");
        }
    }
    s.set_lead(&[], false);
}

#[test]
fn the_head_is_the_first_datagram_and_a_limited_read_takes_it_alone() {
    let mut s = UdpSock::bind(lo(), 1 << 20).unwrap();
    let x = std::net::UdpSocket::bind(lo()).unwrap();
    let mut head = [0u8; 4];
    let mut peek = |s: &UdpSock| s.peek_head(&mut head).map(|n| (n, head));
    assert_eq!(peek(&s), None, "an empty queue");
    x.send_to(&[7; 40], s.local()).unwrap();
    x.send_to(&[8; 1000], s.local()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while peek(&s).is_none() {
        assert!(std::time::Instant::now() < deadline, "nothing arrived");
    }
    assert_eq!(peek(&s), Some((40, [7; 4])));
    assert_eq!(peek(&s), Some((40, [7; 4])), "a peek leaves it queued");
    s.width = RX_SLOTS; // a read that would take both
    assert_eq!(s.recv_batch_upto(1), 1);
    assert_eq!(s.slot(0, s.received(0).len), &[7; 40]);
    while peek(&s).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the second never arrived"
        );
    }
    assert_eq!(peek(&s), Some((1000, [8; 4])));
    assert_eq!(s.recv_batch(), 1);
    assert_eq!(s.received(0).len, 1000);
    assert_eq!(peek(&s), None);
    // A limited read leaves the width as it was: the next full one takes what waits.
    s.width = RX_SLOTS;
    s.single = false;
    for len in [40, 1000, 1000, 1000] {
        x.send_to(&vec![9; len], s.local()).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while peek(&s).is_none() {
        assert!(std::time::Instant::now() < deadline, "nothing arrived");
    }
    assert_eq!(s.recv_batch_upto(1), 1);
    // (Loopback queues a datagram before `send_to` returns: all three wait.)
    assert_eq!(s.recv_batch(), 3, "a full read after a limited one");
}

#[test]
fn a_datagram_queued_before_the_connect_is_read_with_its_senders_name() {
    let lo_sock = || std::net::UdpSocket::bind(lo()).unwrap();
    let (x, y) = (lo_sock(), lo_sock());
    let v4 = |s: &std::net::UdpSocket| s.local_addr().unwrap();
    // Bound but not yet connected (as `connected` makes it): anyone can reach it.
    let mut s = UdpSock::open(lo(), 1 << 20, true, None).unwrap();
    x.send_to(b"early", s.local()).unwrap();
    s.connect(v4(&y)).unwrap();
    s.peer = Some(v4(&y));
    s.width = 1; // a one-entry read, the path that may skip the name
    let read = |s: &mut UdpSock| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if s.recv_batch() == 1 {
                let e = s.received(0);
                return (e.src, s.slot(0, e.len).to_vec());
            }
            assert!(std::time::Instant::now() < deadline, "nothing arrived");
        }
    };
    assert_eq!(read(&mut s), (v4(&x), b"early".to_vec()));
    // Found empty: from now on only the peer can be heard, and no name is asked for.
    assert_eq!(s.recv_batch(), 0);
    assert!(s.only.is_some());
    y.send_to(b"late", s.local()).unwrap();
    assert_eq!(read(&mut s), (v4(&y), b"late".to_vec()));
}

#[test]
fn one_at_a_time_reads_split_coalesced_reads_by_the_datagrams_own_lengths() {
    use clink_proto::reliable::Datagram;
    let mut a = UdpSock::bind(lo(), 1 << 20).unwrap();
    let mut main = UdpSock::bind(lo(), 1 << 20).unwrap();
    let mut own = UdpSock::connected(lo(), a.local(), 1 << 20, None).unwrap();
    // Found empty: the next reads ask for one entry (and, connected, for no name).
    assert_eq!((own.recv_batch(), main.recv_batch()), (0, 0));
    assert!(own.only.is_some() && main.only.is_none());
    for (b, connected) in [(&mut own, true), (&mut main, false)] {
        let dest = b.local();
        let mut batch = TxBatch::new(true);
        for floor in 0..20u64 {
            batch.push(dest, |buf| Datagram::Ping { conn: 9, floor }.encode(buf));
        }
        assert_eq!(batch.frames(), 1, "one segmented send");
        a.send(&mut batch);
        let mut floors = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while floors.len() < 20 && std::time::Instant::now() < deadline {
            for k in 0..b.recv_batch() {
                b.for_each_datagram(k, |src, d| {
                    assert_eq!(src, a.local(), "connected: {connected}");
                    match Datagram::parse(d) {
                        Ok(Datagram::Ping { conn: 9, floor }) => floors.push(floor),
                        other => panic!("{other:?}"),
                    }
                });
            }
        }
        assert_eq!(
            floors,
            (0..20).collect::<Vec<_>>(),
            "connected: {connected}"
        );
        assert!(b.stats.gro_reads >= 1, "one coalesced read at least");
    }
}

#[test]
fn loopback_round_trip_with_segmentation() {
    let mut a = UdpSock::bind(lo(), 1 << 20).unwrap();
    let mut b = UdpSock::bind(lo(), 1 << 20).unwrap();
    let dest = b.local();
    let mut batch = TxBatch::new(true);
    let mut want = Vec::new();
    for i in 0..50u32 {
        let n = if i == 49 { 7 } else { 1000 };
        let d: Vec<u8> = (0..n).map(|k| (i as usize * 31 + k) as u8).collect();
        want.push(d.clone());
        batch.push(dest, |buf| {
            buf.extend_from_slice(&d);
            n
        });
    }
    a.send(&mut batch);
    assert!(batch.is_empty());
    let mut got: Vec<Vec<u8>> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got.len() < want.len() && std::time::Instant::now() < deadline {
        for k in 0..b.recv_batch() {
            b.for_each_datagram(k, |src, d| {
                assert_eq!(src.port(), a.local().port());
                got.push(d.to_vec());
            });
        }
    }
    assert_eq!(got, want);
}
