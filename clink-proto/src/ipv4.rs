//! IPv4 + UDP headers of a packet captured below the socket layer (the UDP transport's
//! receive ring hands over whole IP packets, which the kernel has not validated yet:
//! the capture runs before IP input). A total parser: every input gives a typed result,
//! never a panic, and a packet is accepted only when the kernel's own input path would
//! deliver it to a UDP socket (version 4, a header checksum that holds, lengths that
//! agree, no fragment), except that the UDP checksum is not checked: a packet sent on
//! the same host (a veth pair, loopback) carries a partial one, and every clink datagram
//! has a CRC-32C of its own.

use std::net::{Ipv4Addr, SocketAddrV4};
use thiserror::Error;

/// Bytes of an IPv4 header without options.
pub const IP_HEADER: usize = 20;
/// Bytes of a UDP header.
pub const UDP_HEADER: usize = 8;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// Why a captured packet was refused.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum Ipv4Error {
    /// Shorter than its headers, or than the lengths its headers announce.
    #[error("truncated packet: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Not IPv4, or a header length under 20 bytes.
    #[error("not an IPv4 header (version/length byte {0:#04x})")]
    NotIpv4(u8),
    /// The IP header checksum does not hold.
    #[error("bad IPv4 header checksum")]
    Checksum,
    /// Not UDP.
    #[error("IP protocol {0}, not UDP")]
    NotUdp(u8),
    /// A fragment (reassembly is the kernel's, on the socket path).
    #[error("an IP fragment")]
    Fragment,
    /// The UDP length field disagrees with the IP total length.
    #[error("UDP length {udp} does not fit the IP payload of {ip} bytes")]
    UdpLength {
        /// The UDP header's length field.
        udp: usize,
        /// Bytes of IP payload.
        ip: usize,
    },
}

/// A UDP datagram found in a captured IPv4 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp<'a> {
    /// Source address and port.
    pub src: SocketAddrV4,
    /// Destination address and port.
    pub dst: SocketAddrV4,
    /// The UDP payload (a coalesced run of datagrams when the packet was a GSO/GRO one).
    pub payload: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

/// The ones'-complement sum of `b` as 16-bit big-endian words (RFC 1071), folded.
fn ones_sum(b: &[u8]) -> u16 {
    let mut s: u32 = 0;
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        s += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        s += u32::from(*last) << 8;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Parses the IPv4 and UDP headers at the start of `pkt`; bytes past the IP total length
/// (link-layer padding) are ignored.
pub fn parse_udp(pkt: &[u8]) -> Result<Udp<'_>, Ipv4Error> {
    let short = |need: usize| Ipv4Error::Truncated {
        need,
        have: pkt.len(),
    };
    let first = *pkt.first().ok_or(short(IP_HEADER))?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < IP_HEADER {
        return Err(Ipv4Error::NotIpv4(first));
    }
    if pkt.len() < ihl {
        return Err(short(ihl));
    }
    let total = usize::from(be16(pkt, 2));
    if total < ihl + UDP_HEADER || pkt.len() < total {
        return Err(short(total.max(ihl + UDP_HEADER)));
    }
    if ones_sum(&pkt[..ihl]) != 0xffff {
        return Err(Ipv4Error::Checksum);
    }
    if pkt[9] != PROTO_UDP {
        return Err(Ipv4Error::NotUdp(pkt[9]));
    }
    if be16(pkt, 6) & 0x3fff != 0 {
        return Err(Ipv4Error::Fragment);
    }
    let udp = &pkt[ihl..total];
    let len = usize::from(be16(udp, 4));
    if len < UDP_HEADER || len > udp.len() {
        return Err(Ipv4Error::UdpLength {
            udp: len,
            ip: udp.len(),
        });
    }
    Ok(Udp {
        src: SocketAddrV4::new(ip_at(pkt, 12), be16(udp, 0)),
        dst: SocketAddrV4::new(ip_at(pkt, 16), be16(udp, 2)),
        payload: &udp[UDP_HEADER..len],
    })
}

/// Writes the IPv4 (no options, don't-fragment, TTL 64, a valid header checksum) and UDP
/// (checksum 0: none) headers of a `len`-byte datagram from `src` to `dst` into `out`;
/// `None` when the packet would exceed 65 535 bytes.
pub fn encode_headers(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    len: usize,
    out: &mut [u8; IP_HEADER + UDP_HEADER],
) -> Option<()> {
    let total = u16::try_from(IP_HEADER + UDP_HEADER + len).ok()?;
    out[..12].copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, PROTO_UDP, 0, 0]);
    out[2..4].copy_from_slice(&total.to_be_bytes());
    out[12..16].copy_from_slice(&src.ip().octets());
    out[16..20].copy_from_slice(&dst.ip().octets());
    let sum = !ones_sum(&out[..IP_HEADER]);
    out[10..12].copy_from_slice(&sum.to_be_bytes());
    out[20..22].copy_from_slice(&src.port().to_be_bytes());
    out[22..24].copy_from_slice(&dst.port().to_be_bytes());
    out[24..26].copy_from_slice(&(total - IP_HEADER as u16).to_be_bytes());
    out[26..28].fill(0);
    Some(())
}

/// Builds an IPv4 packet (no options, a valid header checksum, UDP checksum 0) holding
/// `payload` from `src` to `dst`: the inverse of [`parse_udp`], for tests and simulators.
/// (Payloads past the 65 535-byte limit are cut to fit.)
pub fn encode_udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8], out: &mut Vec<u8>) {
    let len = payload
        .len()
        .min(usize::from(u16::MAX) - IP_HEADER - UDP_HEADER);
    let mut hdr = [0u8; IP_HEADER + UDP_HEADER];
    encode_headers(src, dst, len, &mut hdr).expect("length cut to fit");
    out.extend_from_slice(&hdr);
    out.extend_from_slice(&payload[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(ip: [u8; 4], port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(ip), port)
    }

    #[test]
    fn checksum_of_a_known_header() {
        // The example header of RFC 1071's usual illustration (checksum 0xb861).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ones_sum(&h), 0xffff);
    }

    #[test]
    fn refusals_name_their_cause() {
        let (s, d) = (addr([10, 0, 0, 1], 5), addr([10, 0, 0, 2], 6));
        let mut p = Vec::new();
        encode_udp(s, d, b"hello", &mut p);
        assert_eq!(parse_udp(&p).unwrap().payload, b"hello");
        let mut bad = p.clone();
        bad[15] ^= 1; // a source address bit: the header checksum catches it
        assert_eq!(parse_udp(&bad), Err(Ipv4Error::Checksum));
        let mut frag = p.clone();
        frag[6] |= 0x20; // more fragments
        let sum = !ones_sum(&{
            let mut h = frag[..20].to_vec();
            h[10..12].fill(0);
            h
        });
        frag[10..12].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(parse_udp(&frag), Err(Ipv4Error::Fragment));
        assert!(matches!(
            parse_udp(&p[..p.len() - 1]),
            Err(Ipv4Error::Truncated { .. })
        ));
        assert_eq!(parse_udp(&[0x65; 40]), Err(Ipv4Error::NotIpv4(0x65)));
        let mut long = p.clone();
        long[24..26].copy_from_slice(&100u16.to_be_bytes()); // UDP length past the packet
        assert!(matches!(
            parse_udp(&long),
            Err(Ipv4Error::UdpLength { udp: 100, .. })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..120)) {
            if let Ok(u) = parse_udp(&b) {
                // Whatever is accepted lies inside the input.
                prop_assert!(u.payload.len() + IP_HEADER + UDP_HEADER <= b.len());
            }
        }

        #[test]
        fn encoded_packets_parse_back(
            s in any::<[u8; 4]>(), sp in any::<u16>(), d in any::<[u8; 4]>(), dp in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            pad in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let (s, d) = (addr(s, sp), addr(d, dp));
            let mut p = Vec::new();
            encode_udp(s, d, &payload, &mut p);
            p.extend_from_slice(&pad); // link padding is ignored
            let u = parse_udp(&p).unwrap();
            prop_assert_eq!(u, Udp { src: s, dst: d, payload: &payload });
        }

        #[test]
        fn a_flipped_ip_header_bit_is_refused(
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            bit in 0usize..(IP_HEADER * 8),
        ) {
            let (s, d) = (addr([10, 1, 2, 3], 4000), addr([10, 1, 2, 4], 5000));
            let mut p = Vec::new();
            encode_udp(s, d, &payload, &mut p);
            p[bit / 8] ^= 1 << (bit % 8);
            // A flipped IP header bit is always caught (by the checksum or a field check).
            prop_assert!(parse_udp(&p).is_err());
        }
    }
}
