use super::*;

/// A data datagram's checksum catches damage to any byte, for payloads CRC'd with the
/// rest and for hashed ones, with and without a piggybacked ack; the hashed form is
/// pinned (a changed hash or layout must not pass unnoticed between builds).
#[test]
fn data_checksum_covers_every_byte() {
    for plen in [0, 8, HASHED_PAYLOAD_MIN - 1, HASHED_PAYLOAD_MIN, 1400] {
        for ack in [
            None,
            Some(Piggy {
                cum: 9,
                limit: 99,
                delay_us: 7,
            }),
        ] {
            let payload: Vec<u8> = (0..plen).map(|i| (i * 7 % 251) as u8).collect();
            let hdr = DataHeader {
                pn: 5,
                floor: 3,
                msg_id: 2,
                tag: 77,
                msg_len: plen as u32,
                offset: 0,
                ack,
            };
            let mut d = Vec::new();
            Datagram::Data {
                conn: 4,
                hdr,
                payload: &payload,
            }
            .encode(&mut d);
            assert!(Datagram::parse(&d).is_ok(), "{plen} bytes");
            let body = &d[..d.len() - TRAILER];
            let hashed = plen >= HASHED_PAYLOAD_MIN;
            assert_eq!(data_checksum(body) == crc32c(body), !hashed, "{plen} bytes");
            for at in 0..d.len() {
                let mut bad = d.clone();
                bad[at] ^= 0x10;
                assert!(Datagram::parse(&bad).is_err(), "{plen} bytes, byte {at}");
            }
        }
    }
    let body: Vec<u8> = (0..DATA_HEADER + 300).map(|i| (i * 3) as u8).collect();
    let mut b = body.clone();
    b[56..58].copy_from_slice(&300u16.to_le_bytes());
    // With no ack after the payload: the header's CRC and the payload's hash, as a
    // hashed bulk datagram's (whose hash values are pinned against other implementations).
    assert_eq!(
        data_checksum(&b),
        crc32c(&b[..DATA_HEADER]) ^ twox_hash::XxHash3_64::oneshot(&b[DATA_HEADER..]) as u32
    );
    assert_eq!(data_checksum(&b), 0xe4e2_95b0);
    // A payload length past the end: CRC'd whole, never a panic.
    b[56..58].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(data_checksum(&b), crc32c(&b));
}

/// The bulk checksum is part of the wire format: the XXH3 part of its values for these
/// payloads is pinned (computed with xxhash-rust 0.8 and checked against twox-hash 2,
/// which computes it now), so a change of the crate that computes XXH3 cannot change
/// them unnoticed; the CRC part covers the connection id, then the header.
#[test]
fn bulk_checksum_check_values() {
    let h: Vec<u8> = (0..20u32).map(|i| (i * 3) as u8).collect();
    let mut covered = vec![9, 0, 0, 0];
    covered.extend_from_slice(&h);
    let crc = crc32c(&covered);
    for (n, xxh) in [
        (0usize, 0x38d3_94c2_u32),
        (64, 0xffbb_854f),
        (1472, 0x5f72_1578),
        (8972, 0x22db_0219),
    ] {
        let p: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(bulk_checksum(9, &h, Some(&p)), crc ^ xxh, "{n} bytes");
        // Unhashed: the CRC alone, whatever the payload.
        assert_eq!(bulk_checksum(9, &h, None), crc, "{n} bytes");
        // Another connection's: another checksum.
        assert_ne!(bulk_checksum(10, &h, None), crc);
    }
}

/// A hashed bulk datagram's checksum catches damage anywhere; an unhashed one's only
/// in the header (its payload is the UDP checksum's), which `checked_len` says.
#[test]
fn the_bulk_flag_chooses_what_the_checksum_covers() {
    for hashed in [true, false] {
        let hdr = BulkHeader {
            pn: 4,
            floor: 1,
            xfer: 3,
            offset: 1448,
            hashed,
        };
        let payload = [0x5a; 1448];
        let mut d = Vec::new();
        Datagram::Bulk {
            conn: 2,
            hdr,
            payload: &payload,
        }
        .encode(&mut d);
        let ctx = BulkContext {
            conn: 2,
            next_pn: 3,
        };
        let (h, p) = d.split_at(BULK_HEADER);
        assert_eq!(parse_bulk(ctx, h, p), Ok(hdr));
        assert_eq!(
            Datagram::parse_in(&d, ctx),
            Ok(Datagram::Bulk {
                conn: 2,
                hdr,
                payload: &payload
            })
        );
        // Only its connection can verify it.
        assert_eq!(Datagram::parse(&d), Err(PacketError::BulkWithoutContext));
        let other = BulkContext { conn: 3, ..ctx };
        assert!(matches!(
            parse_bulk(other, h, p),
            Err(PacketError::BadChecksum { .. })
        ));
        assert_eq!(checked_len(&d), if hashed { d.len() } else { BULK_HEADER });
        for at in [0, 1, 6, 12, 19, 20, 23, BULK_HEADER, d.len() - 1] {
            let mut bad = d.clone();
            bad[at] ^= 0x10;
            let (h, p) = bad.split_at(BULK_HEADER);
            let caught = parse_bulk(ctx, h, p).is_err();
            assert_eq!(
                caught,
                at < BULK_HEADER || hashed,
                "hashed {hashed}, byte {at}"
            );
        }
    }
}

#[test]
fn a_handshake_carries_the_wish_for_hashed_payloads_the_paths_and_a_crossing() {
    for bits in 0..8 {
        let (payload_hash, two_paths, crossed) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
        let hs = Handshake {
            from: 1,
            to: 2,
            mtu_payload: 1400,
            payload_hash,
            two_paths,
            crossed,
        };
        for d in [
            Datagram::Hello { conn: 7, hs },
            Datagram::Welcome { conn: 7, hs },
        ] {
            let mut b = Vec::new();
            d.encode(&mut b);
            assert_eq!(Datagram::parse(&b), Ok(d));
        }
    }
    // A flag this version does not know is refused, not ignored.
    let hs = Handshake {
        from: 1,
        to: 2,
        mtu_payload: 1400,
        payload_hash: false,
        two_paths: false,
        crossed: false,
    };
    let mut b = Vec::new();
    Datagram::Hello { conn: 7, hs }.encode(&mut b);
    assert_eq!(
        u16::from_le_bytes([b[6], b[7]]),
        0,
        "flags where this test expects them"
    );
    b[6] = 8;
    // Sealed again, so that only the flag is wrong.
    let body = b.len() - TRAILER;
    let sum = crc32c(&b[..body]).to_le_bytes();
    b[body..].copy_from_slice(&sum);
    assert_eq!(Datagram::parse(&b), Err(PacketError::Reserved("flags")));
}

#[test]
fn a_bulk_header_claims_its_fragment_and_nothing_else_claims_one() {
    let hdr = BulkHeader {
        pn: 9,
        floor: 3,
        xfer: 77,
        offset: 2896,
        hashed: true,
    };
    let h = encode_bulk_header(5, &hdr, &[1; 1448]);
    assert_eq!(bulk_claim(&h), Some((77, 2896)));
    assert_eq!(bulk_claim(&h[..BULK_HEADER - 1]), None);
    let mut other = h;
    other[5] = 1;
    assert_eq!(bulk_claim(&other), None);
    assert_eq!(bulk_claim(&[]), None);
    // Nor does anything else of clink's.
    let mut ping = Vec::new();
    Datagram::Ping { conn: 5, floor: 0 }.encode(&mut ping);
    assert_eq!(bulk_claim(&ping), None);
    assert!(!is_bulk(&ping));
}

#[test]
fn crc32c_check_value() {
    // The standard check value of CRC-32C.
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn only_a_nak_may_name_the_cumulative_ack() {
    let ack = AckInfo {
        cum: 7,
        limit: 100,
        delay_us: 0,
        ranges: vec![(7, 9), (12, 13)],
    };
    let mut buf = Vec::new();
    Datagram::Nak {
        conn: 1,
        ack: ack.clone(),
    }
    .encode(&mut buf);
    assert_eq!(
        Datagram::parse(&buf),
        Ok(Datagram::Nak {
            conn: 1,
            ack: ack.clone()
        })
    );
    // The same ranges in an ack would claim the first missing packet arrived.
    buf.clear();
    Datagram::Ack { conn: 1, ack }.encode(&mut buf);
    assert!(matches!(
        Datagram::parse(&buf),
        Err(PacketError::OutOfRange {
            what: "ack range",
            ..
        })
    ));
}

/// A bulk datagram carries its packet number's low 32 bits: the receiver restores the
/// number nearest to the one it expects, across the 2^32 boundary both ways.
#[test]
fn truncated_packet_numbers_are_restored_near_the_expected_one() {
    const S: u64 = 1 << 32;
    for (next, pn) in [
        (0, 0),
        (0, 5),
        (10, 3),
        (S - 2, S + 7),
        (S + 7, S - 2),
        (5 * S + 9, 5 * S + (1 << 31) - 1),
        (5 * S + (1 << 31), 5 * S + 1),
        (u64::MAX - 3, u64::MAX - 10),
    ] {
        assert_eq!(expand_pn(next, pn as u32), pn, "next {next}, pn {pn}");
    }
}

/// The floor rides as a 16-bit distance below the packet number; one farther below is
/// not carried (0, which claims nothing), never carried wrong.
#[test]
fn a_bulk_floor_is_carried_when_near_and_dropped_when_far() {
    let ctx = BulkContext {
        conn: 1,
        next_pn: 70_000,
    };
    for (floor, carried) in [
        (69_999, 69_999),
        (70_000, 70_000),
        (4_466, 4_466),
        (4_465, 0),
        (0, 0),
    ] {
        let hdr = BulkHeader {
            pn: 70_000,
            floor,
            xfer: 1,
            offset: 0,
            hashed: false,
        };
        let h = encode_bulk_header(1, &hdr, &[3; 10]);
        let got = parse_bulk(ctx, &h, &[3; 10]).expect("valid");
        assert_eq!((got.pn, got.floor), (70_000, carried), "floor {floor}");
    }
}

/// Of several connections from one address, a bulk datagram's checksum names its own.
#[test]
fn a_bulk_datagram_tells_which_connection_it_belongs_to() {
    for hashed in [false, true] {
        let hdr = BulkHeader {
            pn: 40,
            floor: 30,
            xfer: 2,
            offset: 0,
            hashed,
        };
        let payload = [7u8; 300];
        let mut d = Vec::new();
        Datagram::Bulk {
            conn: 12,
            hdr,
            payload: &payload,
        }
        .encode(&mut d);
        assert_eq!(bulk_owner(&d, [3, 12, 5]), Some(12), "hashed {hashed}");
        assert_eq!(bulk_owner(&d, [3, 5]), None);
        let mut bad = d.clone();
        bad[if hashed { 100 } else { 10 }] ^= 1;
        assert_eq!(bulk_owner(&bad, [3, 12, 5]), None);
        assert_eq!(bulk_owner(&d[..20], [12]), None);
        // Its header alone (an ICMP error's quote) tells as much when the payload is
        // not hashed.
        let from_quote = bulk_header_owner(&d[..BULK_HEADER + 8], [3, 12]);
        assert_eq!(from_quote, (!hashed).then_some(12), "hashed {hashed}");
        assert_eq!(bulk_header_owner(&d[..BULK_HEADER], [3]), None);
    }
}
