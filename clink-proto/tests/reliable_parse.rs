//! Property tests of the reliable protocol's datagram parser: total, round-tripping, and
//! never fooled by a damaged datagram.

use clink_proto::reliable::packet::{
    bulk_checksum, bulk_claim, checked_len, coalesced_segment, crc32c, declared_len, is_bulk,
    parse_bulk, Piggy, BULK_HEADER, BULK_KIND, MAX_ACK_DELAY_US, MAX_RANGES, VERSION,
};
use clink_proto::reliable::{
    AckInfo, Admit, BulkContext, BulkHeader, Config, Conn, DataHeader, Datagram, Handshake,
    PacketError,
};
use proptest::prelude::*;

fn datagram() -> impl Strategy<Value = (u8, u32, DataHeader, Vec<u8>, AckInfo)> {
    let hdr = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        0u32..1 << 20,
        proptest::option::of((0u64..u64::MAX / 2, 0u64..1 << 40, 0..=MAX_ACK_DELAY_US)),
    )
        .prop_map(|(pn, f, msg_id, tag, off, piggy)| DataHeader {
            pn,
            floor: f % pn.saturating_add(1),
            msg_id,
            tag,
            msg_len: 0,
            offset: off,
            // A piggybacked ack (limit >= cum), or none.
            ack: piggy.map(|(cum, credit, delay_us)| Piggy {
                cum,
                limit: cum + credit,
                delay_us,
            }),
        });
    let ack = (
        0u64..u64::MAX / 2,
        any::<u64>(),
        proptest::collection::vec((1u64..1000, 1u64..1000), 0..MAX_RANGES),
        0..=MAX_ACK_DELAY_US,
    )
        .prop_map(|(cum, limit, gaps, delay_us)| {
            let mut ranges = Vec::new();
            let mut at = cum;
            for (gap, len) in gaps {
                let s = at + gap;
                ranges.push((s, s + len));
                at = s + len;
            }
            AckInfo {
                cum,
                limit,
                delay_us,
                ranges,
            }
        });
    (
        0u8..9,
        any::<u32>(),
        hdr,
        proptest::collection::vec(any::<u8>(), 0..1500),
        ack,
    )
}

fn build<'a>(k: u8, conn: u32, mut hdr: DataHeader, p: &'a [u8], ack: &AckInfo) -> Datagram<'a> {
    match k {
        0 => {
            hdr.msg_len = hdr.offset + p.len() as u32;
            if p.is_empty() {
                hdr.offset = 0;
                hdr.msg_len = 0;
            }
            Datagram::Data {
                conn,
                hdr,
                payload: p,
            }
        }
        1 => Datagram::Ack {
            conn,
            ack: ack.clone(),
        },
        2 => {
            // A nak may name the cumulative ack itself as missing.
            let mut ack = ack.clone();
            if hdr.tag & 1 == 1 {
                if let Some(first) = ack.ranges.first_mut() {
                    first.0 = ack.cum;
                }
            }
            Datagram::Nak { conn, ack }
        }
        6 if !p.is_empty() => Datagram::Bulk {
            conn,
            hdr: BulkHeader {
                pn: hdr.pn,
                // A floor the header can carry (a farther one is carried as none).
                floor: hdr.pn - (hdr.pn - hdr.floor) % 0xffff,
                xfer: hdr.msg_id as u32,
                offset: u64::from(hdr.offset) << 12,
                hashed: hdr.tag & 0x10000 != 0,
            },
            payload: p,
        },
        3 | 6 => Datagram::Ping {
            conn,
            floor: hdr.floor,
        },
        7 | 8 => {
            let grant = hdr.offset;
            let admit = match (k, hdr.tag % 4) {
                (_, 0) => Admit::Req,
                (_, 1) => Admit::Ack {
                    grant,
                    port: hdr.msg_len as u16,
                },
                (_, 2) => Admit::NAck,
                _ => Admit::Release { grant },
            };
            Datagram::Admit { conn, admit }
        }
        k => {
            let hs = Handshake {
                from: u128::from(hdr.pn) << 64 | u128::from(hdr.tag),
                to: u128::from(hdr.msg_id) << 32 | u128::from(hdr.floor),
                mtu_payload: hdr.offset,
                payload_hash: hdr.tag & 1 == 1,
                two_paths: hdr.tag & 2 == 2,
                crossed: hdr.tag & 4 == 4,
            };
            if k == 4 {
                Datagram::Hello { conn, hs }
            } else {
                Datagram::Welcome { conn, hs }
            }
        }
    }
}

proptest! {
    #[test]
    fn parse_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Datagram::parse(&bytes);
        let mut c = Conn::new(Config::default(), 0);
        let _ = c.handle_datagram(1, &bytes);
        prop_assert!(c.poll_event().is_none());
    }

    #[test]
    fn arbitrary_bodies_with_a_valid_crc_never_panic(
        kind in 1u8..9,
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        // Past the checksum, so the field checks themselves are exercised.
        let mut b = vec![0x43, 0x4c, 0x52, 0x44, VERSION, kind, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&body);
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let _ = Datagram::parse(&b);
        let mut c = Conn::new(Config::default(), 0);
        let _ = c.handle_datagram(1, &b);
        let _ = c.poll_event();
        let mut out = Vec::new();
        while c.poll_transmit(2, &mut out).is_some() {}
    }

    #[test]
    fn declared_lengths_and_segments_are_total_and_in_range(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        valid_start in any::<bool>(),
    ) {
        let mut b = bytes;
        if valid_start && b.len() >= 5 {
            b[..5].copy_from_slice(&[0x43, 0x4c, 0x52, 0x44, VERSION]);
            if b.len() > 6 && b[6] & 1 == 1 {
                b[5] = BULK_KIND;
            }
        }
        if let Some(n) = declared_len(&b) {
            // At least a common header and its trailer, at most a full-size data datagram.
            prop_assert!((20..=60 + 65535 + 20 + 4).contains(&n), "{}", n);
        }
        if let Some(seg) = coalesced_segment(&b) {
            prop_assert!(seg >= 20 && seg < b.len());
        }
        if bulk_claim(&b).is_some() {
            prop_assert!(is_bulk(&b) && b.len() >= BULK_HEADER);
        }
    }

    #[test]
    fn every_encoded_datagram_declares_its_own_length(
        (k, conn, hdr, p, ack) in datagram(),
        after in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let d = build(k, conn, hdr, &p, &ack);
        let bulk = matches!(d, Datagram::Bulk { .. });
        let mut buf = Vec::new();
        let n = d.encode(&mut buf);
        // Whatever follows it in a coalesced read does not change what it declares.
        buf.extend_from_slice(&after);
        prop_assert_eq!(declared_len(&buf), Some(n));
        prop_assert_eq!(is_bulk(&buf), bulk);
        prop_assert!(!is_bulk(&buf[..5]));
    }

    #[test]
    fn coalesced_reads_split_at_their_segment_size_and_nothing_else_splits(
        (k, conn, hdr, p, ack) in datagram(),
        count in 1usize..6,
        cut in any::<prop::sample::Index>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let d = build(k, conn, hdr, &p, &ack);
        let mut one = Vec::new();
        let n = d.encode(&mut one);
        // A single datagram is never split.
        prop_assert_eq!(coalesced_segment(&one), None);
        // `count` copies and a shorter last one (a truncated copy of the first that
        // declares its own length is not available generically: use a ping, the
        // shortest kind), as GRO joins them.
        let mut run = Vec::new();
        for _ in 0..count {
            run.extend_from_slice(&one);
        }
        let mut ping = Vec::new();
        let pn = Datagram::Ping { conn, floor: 1 }.encode(&mut ping);
        if pn <= n {
            let mut with_last = run.clone();
            with_last.extend_from_slice(&ping);
            prop_assert_eq!(coalesced_segment(&with_last), Some(n));
        }
        prop_assert_eq!(coalesced_segment(&run), (count > 1).then_some(n));
        // Cut short, or with bytes after it that are not a datagram: not a coalesced read.
        let c = cut.index(run.len());
        if c % n != 0 {
            prop_assert_eq!(coalesced_segment(&run[..c]), None);
        }
        if !garbage.is_empty() && declared_len(&garbage) != Some(garbage.len()) {
            run.extend_from_slice(&garbage);
            prop_assert_eq!(coalesced_segment(&run), None);
        }
    }

    #[test]
    fn encode_parse_round_trip((k, conn, hdr, p, ack) in datagram()) {
        let d = build(k, conn, hdr, &p, &ack);
        let mut buf = vec![7u8; 3]; // encode appends
        let n = d.encode(&mut buf);
        prop_assert_eq!(n, buf.len() - 3);
        // The receiver's expectation anywhere within 2^31 of the packet number.
        let pn = match &d { Datagram::Bulk { hdr, .. } => hdr.pn, _ => 0 };
        let ctx = BulkContext { conn, next_pn: pn.saturating_add(hdr.tag % (1 << 31)) };
        prop_assert_eq!(Datagram::parse_in(&buf[3..], ctx), Ok(d.clone()));
        if let Datagram::Bulk { hdr, .. } = d {
            prop_assert_eq!(Datagram::parse(&buf[3..]), Err(PacketError::BulkWithoutContext));
            // Split as a scatter receive splits it: header slot, payload elsewhere.
            let (h, pl) = buf[3..].split_at(BULK_HEADER);
            prop_assert_eq!(parse_bulk(ctx, h, pl), Ok(hdr));
        } else {
            prop_assert_eq!(Datagram::parse(&buf[3..]), Ok(d.clone()));
        }
    }

    #[test]
    fn bulk_headers_with_a_valid_crc_never_panic(
        mut h in proptest::collection::vec(any::<u8>(), BULK_HEADER),
        payload in proptest::collection::vec(any::<u8>(), 0..200),
        honest_len in any::<bool>(),
        hashed in any::<bool>(),
    ) {
        // Past the checksum and the flags (most of the time with the right payload
        // length), so the field checks themselves are exercised.
        h[5] = BULK_KIND;
        h[4] = u8::from(hashed);
        if honest_len {
            h[0..2].copy_from_slice(&(payload.len() as u16).to_le_bytes());
        }
        let sum = bulk_checksum(0, &h[..20], hashed.then_some(&payload[..]));
        h[20..].copy_from_slice(&sum.to_le_bytes());
        let ctx = BulkContext { conn: 0, next_pn: 0 };
        if let Ok(hdr) = parse_bulk(ctx, &h, &payload) {
            prop_assert!(!payload.is_empty() && hdr.offset < 1 << 48);
            prop_assert!(hdr.floor <= hdr.pn);
        }
        let mut c = Conn::new(Config::default(), 0);
        let mut d = h.clone();
        d.extend_from_slice(&payload);
        let _ = c.handle_datagram_with(1, &d, &mut |_, _| false);
    }

    #[test]
    fn any_single_byte_damage_or_truncation_is_refused(
        (k, conn, hdr, p, ack) in datagram(),
        pos in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<prop::sample::Index>(),
    ) {
        let d = build(k, conn, hdr, &p, &ack);
        let mut buf = Vec::new();
        d.encode(&mut buf);
        // Every byte clink's checksum covers (all but an unhashed bulk payload, which the
        // UDP checksum covers below clink).
        let ctx = BulkContext { conn, next_pn: 0 };
        let mut bad = buf.clone();
        bad[pos.index(checked_len(&buf))] ^= flip;
        prop_assert!(Datagram::parse_in(&bad, ctx).is_err());
        let c = cut.index(buf.len());
        prop_assert!(Datagram::parse_in(&buf[..c], ctx).is_err());
    }
}

#[test]
fn typed_errors() {
    let mut buf = Vec::new();
    Datagram::Ping { conn: 1, floor: 2 }.encode(&mut buf);
    assert!(matches!(
        Datagram::parse(&buf[..10]),
        Err(PacketError::Truncated { .. })
    ));
    let mut b = buf.clone();
    b[0] ^= 1;
    assert!(matches!(Datagram::parse(&b), Err(PacketError::BadMagic(_))));
    let mut b = buf.clone();
    b[4] = VERSION + 1;
    assert_eq!(
        Datagram::parse(&b),
        Err(PacketError::BadVersion(VERSION + 1))
    );
    let mut b = buf.clone();
    b[5] = 9;
    assert_eq!(Datagram::parse(&b), Err(PacketError::BadKind(9)));
    // An admit datagram: an unknown op, a grant in a request and a port in a NAck are
    // refused.
    let admit = |op: u8, port: u16, grant: u32| {
        let mut b = vec![
            0x43, 0x4c, 0x52, 0x44, VERSION, 8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, op, 0,
        ];
        b.extend_from_slice(&port.to_le_bytes());
        b.extend_from_slice(&grant.to_le_bytes());
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        Datagram::parse(&b).map(|d| match d {
            Datagram::Admit { admit, .. } => Some(admit),
            _ => None,
        })
    };
    assert_eq!(
        admit(2, 9000, 7),
        Ok(Some(Admit::Ack {
            grant: 7,
            port: 9000
        }))
    );
    assert!(matches!(
        admit(5, 0, 0),
        Err(PacketError::OutOfRange { .. })
    ));
    assert_eq!(admit(1, 0, 3), Err(PacketError::Reserved("admit grant")));
    assert_eq!(admit(3, 1, 0), Err(PacketError::Reserved("admit port")));
    let mut b = buf.clone();
    b[17] ^= 4;
    assert!(matches!(
        Datagram::parse(&b),
        Err(PacketError::BadChecksum { .. })
    ));
}

/// A connection that agreed on hashed bulk payloads refuses an unhashed fragment (counted
/// as malformed, never placed); one that did not takes both kinds.
#[test]
fn an_unhashed_fragment_is_refused_where_hashes_were_agreed() {
    for (agreed, hashed, taken) in [
        (true, true, true),
        (true, false, false),
        (false, true, true),
        (false, false, true),
    ] {
        let cfg = Config {
            payload_hash: agreed,
            ..Config::default()
        };
        let mut c = Conn::new(cfg, 0);
        let mut d = Vec::new();
        Datagram::Bulk {
            conn: 0,
            hdr: BulkHeader {
                pn: 0,
                floor: 0,
                xfer: 1,
                offset: 0,
                hashed,
            },
            payload: &[9; 100],
        }
        .encode(&mut d);
        let mut placed = false;
        let r = c.handle_datagram_with(1, &d, &mut |_, _| {
            placed = true;
            true
        });
        assert_eq!(r.is_ok(), taken, "agreed {agreed}, hashed {hashed}");
        assert_eq!(placed, taken);
        assert_eq!(c.stats().dropped_malformed, u64::from(!taken));
    }
}
