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
    // hashed bulk datagram's (whose values are pinned against other implementations).
    assert_eq!(
        data_checksum(&b),
        bulk_checksum(&b[..DATA_HEADER], Some(&b[DATA_HEADER..]))
    );
    assert_eq!(data_checksum(&b), 0xe4e2_95b0);
    // A payload length past the end: CRC'd whole, never a panic.
    b[56..58].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(data_checksum(&b), crc32c(&b));
}

/// The bulk checksum is part of the wire format: its values for these inputs are
/// pinned (computed with xxhash-rust 0.8 and the crc32c crate, and checked against
/// twox-hash 2, which computes it now), so a change of the crate that computes XXH3
/// cannot change them unnoticed.
#[test]
fn bulk_checksum_check_values() {
    let h: Vec<u8> = (0..60u32).map(|i| (i * 3) as u8).collect();
    for (n, want) in [
        (0usize, 0x6b6c_3681_u32),
        (64, 0xac04_270c),
        (1472, 0x0ccd_b73b),
        (8972, 0x7164_a05a),
    ] {
        let p: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(bulk_checksum(&h, Some(&p)), want, "{n} bytes");
        // Unhashed: the header's CRC alone, whatever the payload.
        assert_eq!(bulk_checksum(&h, None), crc32c(&h), "{n} bytes");
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
            offset: 1408,
            total: 1 << 16,
            hashed,
        };
        let payload = [0x5a; 1408];
        let mut d = Vec::new();
        Datagram::Bulk {
            conn: 2,
            hdr,
            payload: &payload,
        }
        .encode(&mut d);
        let (h, p) = d.split_at(BULK_HEADER);
        assert_eq!(parse_bulk(h, p), Ok((2, hdr)));
        assert_eq!(checked_len(&d), if hashed { d.len() } else { BULK_HEADER });
        for at in [6, 20, 59, 60, BULK_HEADER, d.len() - 1] {
            let mut bad = d.clone();
            bad[at] ^= 0x10;
            let (h, p) = bad.split_at(BULK_HEADER);
            let caught = parse_bulk(h, p).is_err();
            assert_eq!(
                caught,
                at < BULK_HEADER || hashed,
                "hashed {hashed}, byte {at}"
            );
        }
    }
}

#[test]
fn a_handshake_carries_the_wish_for_hashed_payloads_and_the_paths() {
    for (payload_hash, two_paths) in [(true, false), (false, false), (false, true), (true, true)] {
        let hs = Handshake {
            from: 1,
            to: 2,
            mtu_payload: 1400,
            payload_hash,
            two_paths,
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
    };
    let mut b = Vec::new();
    Datagram::Hello { conn: 7, hs }.encode(&mut b);
    assert_eq!(
        u16::from_le_bytes([b[6], b[7]]),
        0,
        "flags where this test expects them"
    );
    b[6] = 4;
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
        offset: 2816,
        total: 1 << 20,
        hashed: true,
    };
    let h = encode_bulk_header(5, &hdr, &[1; 1408]);
    assert_eq!(bulk_claim(&h), Some((5, 77, 2816)));
    assert_eq!(bulk_claim(&h[..BULK_HEADER - 1]), None);
    let mut other = h;
    other[5] = K_DATA;
    assert_eq!(bulk_claim(&other), None);
    assert_eq!(bulk_claim(&[]), None);
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
