//! Bulk datagrams: one fragment of a rendezvous transfer, a 24-byte header and the
//! payload, no common header or trailer (the layout is in the parent module's docs). The
//! parser takes header and payload apart, as a speculative scatter receive leaves them.

use super::*;

/// True when `b` has the bulk kind byte and is long enough for a bulk header: a cheap
/// peek (nothing else verified) for a receiver deciding which socket to read next.
pub fn is_bulk(b: &[u8]) -> bool {
    b.len() >= BULK_HEADER && b[5] == BULK_KIND
}

/// The (transfer id's low 32 bits, offset) a bulk datagram opening `b` claims, read
/// without verifying anything (a hint: which fragment is at the head of a receive queue,
/// from its first [`BULK_HEADER`] bytes peeked at, before deciding how to read it); `None`
/// when `b` does not open with a bulk header.
///
/// Total: any input gives a claim or `None`.
pub fn bulk_claim(b: &[u8]) -> Option<(u32, u64)> {
    is_bulk(b).then(|| (u32_at(b, 10), u48_at(b, 14)))
}

/// Which of the connections `conns` (their ids) bulk datagram `d` was sealed for, told
/// by its checksum ([`bulk_checksum`]), for a receiver with several connections from the
/// datagram's source address (a bulk datagram does not carry its connection id). `None`
/// when none, or when `d` is not a bulk datagram; a damaged one matches none. Hashes a
/// hashed payload once, whatever the number of connections.
pub fn bulk_owner(d: &[u8], conns: impl IntoIterator<Item = u32>) -> Option<u32> {
    if !is_bulk(d) {
        return None;
    }
    let (h, p) = d.split_at(BULK_HEADER);
    let hash = if h[4] == FLAG_HASHED as u8 {
        checksum::payload_hash(p)
    } else {
        0
    };
    sealed_for(h, hash, conns)
}

/// Which of the connections `conns` a bulk header `h` alone (an ICMP error's quote of a
/// fragment we sent) was sealed for: told by its checksum when its payload is not hashed;
/// `None` when none is, or when the payload is hashed (its checksum then needs the
/// payload, which a quote does not hold whole).
pub fn bulk_header_owner(h: &[u8], conns: impl IntoIterator<Item = u32>) -> Option<u32> {
    (is_bulk(h) && h[4] == 0)
        .then(|| sealed_for(h, 0, conns))
        .flatten()
}

/// The connection of `conns` whose checksum of bulk header `h` (its first 20 bytes),
/// XORed with `hash` (the payload's part, 0 when unhashed), is the one `h` carries.
fn sealed_for(h: &[u8], hash: u32, conns: impl IntoIterator<Item = u32>) -> Option<u32> {
    let carried = u32_at(h, 20);
    conns
        .into_iter()
        .find(|&c| bulk_checksum(c, &h[..20], None) ^ hash == carried)
}

/// The transfer id as a bulk datagram carries it: its low 32 bits.
pub fn wire_xfer(xfer: u64) -> u32 {
    xfer as u32
}

/// Fields of a bulk datagram (one fragment of a rendezvous transfer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkHeader {
    /// Packet number (shared with data datagrams; the wire carries its low 32 bits).
    pub pn: u64,
    /// As [`DataHeader::floor`] (0 when the datagram carries none).
    pub floor: u64,
    /// Transfer id: the low 32 bits of the send's id ([`wire_xfer`]).
    pub xfer: u32,
    /// Offset of the payload in the transfer (below [`MAX_BULK_OFFSET`]).
    pub offset: u64,
    /// Whether the checksum covers the payload too (XXH3, end to end). When not, it
    /// covers the header alone and the payload is left to the UDP checksum, as TCP leaves
    /// its stream to its own ([`bulk_checksum`]).
    pub hashed: bool,
}

/// What the receiving connection lends the parser of a bulk datagram: its id (which the
/// checksum covers) and the packet number it expects next (from which the truncated
/// packet number is restored, [`expand_pn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkContext {
    /// The connection id.
    pub conn: u32,
    /// The next packet number the connection expects.
    pub next_pn: u64,
}

/// Parses and verifies a bulk datagram whose header and payload lie apart (a speculative
/// scatter receive put the payload straight into its destination), received on the
/// connection `ctx` describes. `header` must be the [`BULK_HEADER`] bytes, `payload` the
/// bytes that followed them. Total: any input gives a header or an error.
pub fn parse_bulk(
    ctx: BulkContext,
    header: &[u8],
    payload: &[u8],
) -> Result<BulkHeader, PacketError> {
    if header.len() != BULK_HEADER {
        return Err(PacketError::Truncated {
            what: "bulk header",
            need: BULK_HEADER,
            have: header.len(),
        });
    }
    if header[5] != BULK_KIND {
        return Err(PacketError::BadKind(header[5]));
    }
    // The flags choose what the checksum covers; the CRC covers the flags themselves.
    let hashed = header[4] == FLAG_HASHED as u8;
    let carried = u32_at(header, 20);
    let computed = bulk_checksum(ctx.conn, &header[..20], hashed.then_some(payload));
    if carried != computed {
        return Err(PacketError::BadChecksum { carried, computed });
    }
    if header[4] != 0 && !hashed {
        return Err(PacketError::Reserved("bulk flags"));
    }
    let plen = usize::from(u16_at(header, 0));
    if plen != payload.len() || plen == 0 {
        return Err(PacketError::OutOfRange {
            what: "bulk payload length",
            value: plen as u64,
            limit: payload.len() as u64,
        });
    }
    let pn = expand_pn(ctx.next_pn, u32_at(header, 6));
    let floor = match u16_at(header, 2) {
        NO_FLOOR => 0,
        gap => pn.checked_sub(gap.into()).ok_or(PacketError::OutOfRange {
            what: "floor gap",
            value: gap.into(),
            limit: pn,
        })?,
    };
    Ok(BulkHeader {
        pn,
        floor,
        xfer: u32_at(header, 10),
        offset: u48_at(header, 14),
        hashed,
    })
}

/// The [`BULK_HEADER`] bytes of a bulk datagram of connection `conn` carrying `payload`
/// (its checksum included): what a sender puts before the payload, in one buffer or as
/// the first of two send vectors.
///
/// # Panics
/// On a caller bug: an empty payload or one longer than [`MAX_PAYLOAD`], an offset of
/// [`MAX_BULK_OFFSET`] or more, or a floor above the packet number.
pub fn encode_bulk_header(conn: u32, hdr: &BulkHeader, payload: &[u8]) -> [u8; BULK_HEADER] {
    assert!(!payload.is_empty(), "empty bulk payload");
    let plen = u16::try_from(payload.len()).expect("payload longer than MAX_PAYLOAD");
    assert!(hdr.offset < MAX_BULK_OFFSET, "bulk offset beyond 48 bits");
    let gap = hdr
        .pn
        .checked_sub(hdr.floor)
        .expect("floor above the packet number");
    let mut h = [0u8; BULK_HEADER];
    h[0..2].copy_from_slice(&plen.to_le_bytes());
    // A gap of NO_FLOOR or more is carried as none.
    h[2..4].copy_from_slice(&u16::try_from(gap).unwrap_or(NO_FLOOR).to_le_bytes());
    h[4] = if hdr.hashed { FLAG_HASHED as u8 } else { 0 };
    h[5] = BULK_KIND;
    h[6..10].copy_from_slice(&(hdr.pn as u32).to_le_bytes());
    h[10..14].copy_from_slice(&hdr.xfer.to_le_bytes());
    h[14..20].copy_from_slice(&hdr.offset.to_le_bytes()[..6]);
    let sum = bulk_checksum(conn, &h[..20], hdr.hashed.then_some(payload));
    h[20..24].copy_from_slice(&sum.to_le_bytes());
    h
}
