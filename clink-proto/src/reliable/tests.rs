use super::packet::{DataHeader, Datagram};
use super::spares::{SPARE_BYTES, SPARE_COUNT, SPARE_IDLE, SPARE_STREAM_BYTES, SPARE_STREAM_COUNT};
use super::{misordered, Config, Conn, Event};

/// A ping-pong of messages of changing sizes, each delivered buffer given back: every
/// message arrives intact in a reused buffer (a longer one after a shorter, a shorter
/// after a longer), the acknowledged records are filled again, and the stores stay
/// bounded (a buffer too large to keep is freed).
#[test]
fn spare_buffers_carry_later_messages_intact_and_stay_bounded() {
    let cfg = Config::default();
    let cfg_mtu = cfg.mtu_payload;
    let (mut a, mut b) = (Conn::new(cfg.clone(), 0), Conn::new(cfg, 0));
    let mut now = 1_000;
    let mut buf = Vec::new();
    let mut reused = (0, 0);
    let sizes = [64usize, 7, 300, 0, 1, 2000, 64, 5000, 3];
    for (i, &len) in sizes.iter().cycle().take(60).enumerate() {
        let (from, to) = if i % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let msg: Vec<u8> = (0..len).map(|k| (k * 31 + i * 7) as u8).collect();
        let spare = (from.spare_msgs.len(), to.spare_bufs.len());
        from.send(i as u64, &msg).expect("queued");
        if spare.0 > 0 {
            assert_eq!(from.spare_msgs.len(), spare.0 - 1, "a record reused");
            reused.0 += 1;
        }
        while let Some(n) = from.poll_transmit(now, &mut buf) {
            to.handle_datagram(now, &buf[..n]).expect("valid datagram");
            buf.clear();
        }
        if spare.1 > 0 && len <= cfg_mtu {
            // (The delivery of a one-datagram message took a kept buffer.)
            assert!(to.spare_bufs.len() < spare.1, "a buffer reused");
            reused.1 += 1;
        }
        let mut got = None;
        while let Some(ev) = to.poll_event() {
            if let Event::Message { tag, data, .. } = ev {
                assert!(got.is_none(), "one message per turn");
                assert_eq!(tag, i as u64);
                assert_eq!(data, msg, "message {i} ({len} bytes)");
                got = Some(());
                to.recycle(data);
            }
        }
        assert!(got.is_some(), "message {i} delivered");
        for c in [&*from, &*to] {
            assert!(c.spare_bufs.len() <= SPARE_COUNT && c.spare_msgs.len() <= SPARE_COUNT);
            assert!(c
                .spare_bufs
                .iter()
                .all(|b| b.capacity() <= SPARE_STREAM_BYTES));
            assert!(c
                .spare_msgs
                .iter()
                .all(|m| m.data.capacity() <= SPARE_STREAM_BYTES));
        }
        now += 10_000;
    }
    // Most sends found the record of the last message acknowledged (the answer carried
    // the ack; not after a message too large to keep), most deliveries a buffer.
    assert!(reused.0 >= 50 && reused.1 >= 42, "reused {reused:?}");
}

/// A stream of 16 KiB messages in batches reuses its records and buffers on each side
/// (none allocated after the first batch but what more messages in flight need), and
/// the spares shrink back to the small-message bounds once the stream has been quiet for
/// [`SPARE_IDLE`].
#[test]
fn a_stream_of_eager_messages_reuses_its_buffers_and_idle_spares_shrink() {
    let cfg = Config::default();
    let (mut a, mut b) = (Conn::new(cfg.clone(), 0), Conn::new(cfg, 0));
    let mut now = 1_000;
    let mut buf = Vec::new();
    let len = 16 << 10;
    // More than a send batch: a blocking sender queues ahead of its window.
    let batch = 300;
    let mut fresh_records = 0;
    let mut kept = Vec::new();
    for round in 0..6u64 {
        for i in 0..batch {
            let msg = vec![(round * 7 + i) as u8; len];
            let spares = a.spare_msgs.len();
            a.send(i, &msg).expect("queued");
            fresh_records += usize::from(spares == a.spare_msgs.len());
        }
        // Both ways until everything is delivered and acknowledged.
        for _ in 0..200 {
            let mut moved = false;
            for k in 0..2 {
                let (from, to) = if k == 0 {
                    (&mut a, &mut b)
                } else {
                    (&mut b, &mut a)
                };
                while let Some(n) = from.poll_transmit(now, &mut buf) {
                    to.handle_datagram(now, &buf[..n]).expect("valid datagram");
                    buf.clear();
                    moved = true;
                }
            }
            while let Some(ev) = b.poll_event() {
                if let Event::Message { tag, data, .. } = ev {
                    assert_eq!(data, vec![(round * 7 + tag) as u8; len], "message {tag}");
                    b.recycle(data);
                }
            }
            now += 20_000;
            if !moved {
                break;
            }
        }
        assert_eq!(b.stats().messages_delivered, (round + 1) * batch);
        // Every delivered buffer came back (as many as were in use at once, at most a
        // batch); once the window has opened, no round allocates more.
        kept.push(b.spare_bufs.len());
        assert!(kept[kept.len() - 1] <= batch as usize, "{kept:?}");
    }
    assert!(
        kept[1] > SPARE_COUNT && kept[1..].iter().all(|&k| k == kept[1]),
        "{kept:?}"
    );
    assert!(
        fresh_records <= batch as usize,
        "{fresh_records} records allocated for {} messages",
        6 * batch
    );
    assert!(a.spare_msgs.len() > SPARE_COUNT && a.spare_msgs.len() <= SPARE_STREAM_COUNT);
    // Quiet for the idle time: the next drive of each side trims its spares.
    now += SPARE_IDLE;
    for c in [&mut a, &mut b] {
        c.handle_timeout(now);
        assert!(c.spare_msgs.len() <= SPARE_COUNT && c.spare_bufs.len() <= SPARE_COUNT);
        assert!(c
            .spare_msgs
            .iter()
            .all(|m| m.data.capacity() <= SPARE_BYTES));
        assert!(c.spare_bufs.iter().all(|b| b.capacity() <= SPARE_BYTES));
    }
    assert!(b.spare_bufs.is_empty(), "16 KiB buffers are not small");
}

/// A reply is due while packets are in flight (their acks) or a hole waits for its
/// repair, once there is an RTT to say when; not otherwise.
#[test]
fn a_reply_is_due_for_packets_in_flight_and_for_holes() {
    let cfg = Config::default();
    let mut a = Conn::new(cfg.clone(), 0);
    let mut b = Conn::new(cfg, 0);
    let mut now = 1_000;
    let pass = |from: &mut Conn, to: &mut Conn, now: u64| {
        let mut buf = Vec::new();
        while let Some(n) = from.poll_transmit(now, &mut buf) {
            to.handle_datagram(now, &buf[..n]).expect("valid datagram");
            buf.clear();
        }
    };
    a.send(0, b"ping").expect("queued");
    assert_eq!(a.reply_due(), None, "no RTT sample yet");
    pass(&mut a, &mut b, now);
    now += 50_000;
    b.send(0, b"pong").expect("queued");
    pass(&mut b, &mut a, now); // the answer acks the ping: a has its sample
    now += 500_000; // past the ack delay
    pass(&mut a, &mut b, now); // the ack of the pong: b has its sample
    assert_eq!(a.reply_due(), None, "everything acked");
    assert_eq!(b.reply_due(), None);
    a.send(0, b"again").expect("queued");
    let mut buf = Vec::new();
    a.poll_transmit(now, &mut buf).expect("a datagram");
    assert_eq!(a.reply_due(), Some(a.rtt.srtt), "its ack is due");
    // b misses that one and gets the next: a hole.
    a.send(0, b"later").expect("queued");
    buf.clear();
    let m = a.poll_transmit(now, &mut buf).expect("a datagram");
    assert_eq!(b.reply_due(), None, "nothing due before the hole");
    b.handle_datagram(now, &buf[..m]).expect("valid datagram");
    assert_eq!(
        b.reply_due(),
        Some(b.rtt.srtt),
        "the repair of the hole is due"
    );
}

/// The standing ack (what the receiver has in order, with the credit it advertised),
/// repeated long after by someone else with the "unknown" delay, completes the sender's
/// packets whose own ack was lost, and gives no RTT sample: timed, it would read as a
/// round trip of the whole wait.
#[test]
fn a_standing_ack_repeated_late_acks_and_times_nothing() {
    let cfg = Config::default();
    let (mut a, mut b) = (Conn::new(cfg.clone(), 0), Conn::new(cfg, 0));
    assert_eq!(b.standing_ack(), None, "nothing received yet");
    let mut now = 1_000;
    let mut buf = Vec::new();
    // A first exchange gives a an RTT of 100 us.
    a.send(0, b"first").expect("queued");
    while let Some(n) = a.poll_transmit(now, &mut buf) {
        b.handle_datagram(now + 50_000, &buf[..n]).expect("valid");
        buf.clear();
    }
    b.ack_now();
    while let Some(n) = b.poll_transmit(now + 50_000, &mut buf) {
        a.handle_datagram(now + 100_000, &buf[..n]).expect("valid");
        buf.clear();
    }
    let srtt = a.rtt.srtt;
    assert!(srtt > 0 && srtt <= 100_000, "{srtt}");
    // A second message arrives; its ack is lost.
    now += 1_000_000;
    a.send(0, b"second").expect("queued");
    while let Some(n) = a.poll_transmit(now, &mut buf) {
        b.handle_datagram(now, &buf[..n]).expect("valid");
        buf.clear();
    }
    b.ack_now();
    while b.poll_transmit(now, &mut buf).is_some() {
        buf.clear();
    }
    assert_eq!(a.stats().in_flight, 1, "the second is unacknowledged");
    let (cum, limit) = b.standing_ack().expect("received");
    assert_eq!(cum, 2, "both packets in order");
    assert!(limit >= cum);
    // Half a second later, the repeated standing ack.
    Datagram::standing_ack(0, cum, limit).encode(&mut buf);
    a.handle_datagram(now + 500_000_000, &buf).expect("valid");
    assert_eq!(a.stats().in_flight, 0, "acknowledged");
    assert_eq!(a.rtt.srtt, srtt, "no sample from it");
}

/// Feeds `rx` packet `pn` of connection 0: a one-byte message (`byte`) of its own.
fn deliver_one_byte_message(rx: &mut Conn, pn: u64, byte: u8) {
    let hdr = DataHeader {
        pn,
        floor: 0,
        msg_id: pn,
        tag: 0,
        msg_len: 1,
        offset: 0,
        ack: None,
    };
    let mut buf = Vec::new();
    Datagram::Data {
        conn: 0,
        hdr,
        payload: &[byte],
    }
    .encode(&mut buf);
    rx.handle_datagram(1, &buf).expect("valid datagram");
}

/// The received ranges kept as packets arrive are those a walk of the slots finds
/// (what acks carried before), whatever the arrival order, duplicates included.
#[test]
fn received_ranges_match_the_slots_in_any_arrival_order() {
    let window = 64u64;
    for seed in 1..=200u64 {
        let cfg = Config {
            recv_window: window,
            ..Config::default()
        };
        let mut rx = Conn::new(cfg, 0);
        // Packets 0..48, shuffled (seeded xorshift), some twice.
        let mut order: Vec<u64> = (0..48).chain(0..8).collect();
        let mut x = seed;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for pn in order {
            deliver_one_byte_message(&mut rx, pn, 7);
            let mut walked = Vec::new();
            let mut run = None;
            for p in rx.rcv_next + 1..rx.rcv_highest + 1 {
                let have = p < rx.rcv_highest && rx.slots.has(p, rx.rcv_next);
                match (have, run) {
                    (true, None) => run = Some(p),
                    (false, Some(s)) => {
                        walked.push((s, p));
                        run = None;
                    }
                    _ => {}
                }
            }
            let kept: Vec<(u64, u64)> = rx.rcv_ranges.iter().collect();
            assert_eq!(kept, walked, "seed {seed}, after {pn}");
        }
        assert_eq!(rx.rcv_next, 48);
        assert_eq!(rx.rcv_ranges.iter().count(), 0);
    }
}

/// A connection whose reorder ring grew for a hole far behind the newest packet gives the
/// memory back once the stream has run in order for a while, and every message of both
/// stretches is delivered once, in order.
#[test]
fn a_ring_grown_for_a_hole_shrinks_once_the_stream_runs_in_order() {
    let mut rx = Conn::new(Config::default(), 0);
    let deliver = |rx: &mut Conn, pn: u64| deliver_one_byte_message(rx, pn, pn as u8);
    // Packet 0 lost, 1..1000 held behind it; then its repair and a long in-order run.
    for pn in 1..1000 {
        deliver(&mut rx, pn);
    }
    assert_eq!(rx.slots.len(), 1024);
    deliver(&mut rx, 0);
    let mut next = 0u64;
    let drain = |rx: &mut Conn, next: &mut u64| {
        while let Some(ev) = rx.poll_event() {
            if let Event::Message { data, .. } = ev {
                assert_eq!(data, [*next as u8], "message {next}");
                *next += 1;
            }
        }
    };
    drain(&mut rx, &mut next);
    assert_eq!(next, 1000);
    // Still grown while the quiet stretch is short (4 x 1 024 packets past the last held).
    for pn in 1000..999 + 4 * 1024 {
        deliver(&mut rx, pn);
        drain(&mut rx, &mut next);
    }
    assert_eq!(rx.slots.len(), 1024);
    for pn in 999 + 4 * 1024..1001 + 4 * 1024 {
        deliver(&mut rx, pn);
        drain(&mut rx, &mut next);
    }
    assert_eq!(rx.slots.len(), 64);
    assert_eq!(next, 1001 + 4 * 1024);
}

#[test]
fn misorder_permutes_each_group_without_fixed_points() {
    for group in [1u64, 2, 3, 7, 16, 44] {
        for n in 1..=200u64 {
            let mut seen = vec![false; n as usize];
            for k in 0..n {
                let i = misordered(k, n, group);
                assert!(i < n, "group {group}, n {n}: {k} -> {i}");
                let unit = group.max(2);
                assert_eq!(i / unit, k / unit, "stays in its unit");
                assert!(!seen[i as usize], "sent twice");
                seen[i as usize] = true;
                let lone_last = k == n - 1 && n % unit == 1;
                assert_eq!(i == k, lone_last, "group {group}, n {n}: {k} -> {i}");
            }
        }
    }
    // Pairs swapped; an odd unit's tail rotates.
    let order: Vec<u64> = (0..7).map(|k| misordered(k, 7, 7)).collect();
    assert_eq!(order, vec![1, 0, 3, 2, 5, 6, 4]);
}

/// A repeat copy ([`Conn::repeat_of`]) still held when its message is acknowledged does
/// not keep the record from being reused once the copy is let go (a keepalive thread
/// prunes its copies after the ack is read), and a record still shared is never written
/// (a send passes it over and leaves it for a later one).
#[test]
fn a_record_shared_with_a_repeat_at_its_ack_is_reused_once_the_repeat_lets_go() {
    let (mut a, mut b) = (
        Conn::new(Config::default(), 0),
        Conn::new(Config::default(), 0),
    );
    let mut buf = Vec::new();
    // a sends, a copy is taken, b's answer acknowledges it.
    let mut ask = |a: &mut Conn, b: &mut Conn, tag: u64, now: u64| {
        a.send(tag, b"question").unwrap();
        while let Some(n) = a.poll_transmit(now, &mut buf) {
            b.handle_datagram(now, &buf[..n]).unwrap();
            buf.clear();
        }
        let held = a
            .repeat_of(a.next_pn() - 1)
            .expect("sent, not acknowledged");
        b.send(tag, b"answer").unwrap();
        while let Some(n) = b.poll_transmit(now + 1, &mut buf) {
            a.handle_datagram(now + 1, &buf[..n]).unwrap();
            buf.clear();
        }
        held
    };
    let encoded = |r: &super::Repeat| {
        let mut d = Vec::new();
        r.encode(0, &mut d);
        match Datagram::parse(&d) {
            Ok(Datagram::Data { hdr, payload, .. }) => (hdr.tag, payload.to_vec()),
            other => panic!("{other:?}"),
        }
    };
    let held = ask(&mut a, &mut b, 1, 1_000);
    // Acknowledged while the copy is held: kept all the same.
    assert_eq!(a.spare_msgs.len(), 1);
    // Still shared when a send wants a record: passed over (kept for a later send), and
    // the copy intact.
    a.send(2, b"another").unwrap();
    assert_eq!(a.spare_msgs.len(), 1);
    assert_eq!(std::sync::Arc::strong_count(&a.spare_msgs[0]), 2);
    assert_eq!(encoded(&held), (1, b"question".to_vec()));
    drop(held);
    let held = ask(&mut a, &mut b, 3, 2_000);
    // Messages 2 and 3 acknowledged: both records kept, 3's on top.
    assert_eq!(a.spare_msgs.len(), 2);
    // Let go before the next send: that send reuses the record.
    drop(held);
    let spare = std::sync::Arc::as_ptr(&a.spare_msgs[1]);
    a.send(4, b"reused").unwrap();
    assert_eq!(a.spare_msgs.len(), 1);
    let mut reused = false;
    while a.poll_transmit(3_000, &mut buf).is_some() {
        buf.clear();
    }
    for pn in a.send_floor()..a.next_pn() {
        if let Some(r) = a.repeat_of(pn) {
            reused |= std::sync::Arc::as_ptr(&r.msg) == spare && encoded(&r).0 == 4;
        }
    }
    assert!(reused, "the spare record carries message 4");
}
