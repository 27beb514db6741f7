//! Datagram format of the reliable protocol, with a total parser.
//!
//! Every datagram but a bulk one is `header | body | crc32c`, little-endian throughout:
//!
//! ```text
//! common header (16 bytes)
//!   0..4   magic "CLRD" (0x4452_4c43)
//!   4      version ([`VERSION`])
//!   5      kind: 1 data, 2 ack, 3 nak, 4 ping, 5 hello, 6 welcome, 8 admit (7 unused)
//!   6..8   flags: bit 0 in a data datagram, "an ack rides along" (below); in a hello
//!          or welcome, bit 0 "the sender wants bulk payloads hashed", bit 1 "the
//!          sender reads small datagrams by another path than bulk fragments" (a receive
//!          ring) and bit 2 (a welcome's) "the sender was connecting to the hello's
//!          sender"; every other bit, and these in any other kind, must be zero
//!   8..12  connection id
//!   12..16 reserved (must be zero)
//! data body (44 bytes, then the payload)
//!   16..24 packet number
//!   24..32 floor: every packet below it is acknowledged or abandoned by the sender
//!   32..40 message id
//!   40..48 tag
//!   48..52 message length
//!   52..56 fragment offset in the message
//!   56..58 payload length
//!   58..60 reserved (must be zero)
//!   then the payload, then with flag bit 0 a piggybacked ack (20 bytes): cumulative ack
//!   (u64), limit (u64) and ack delay in microseconds (u32), as in an ack without ranges
//! ack / nak body (20 bytes, then the ranges)
//!   16..24 cumulative ack: every packet below it was received
//!   24..32 limit: the sender may send packet numbers below it (the credit)
//!   32     number of ranges (at most MAX_RANGES)
//!   33..36 ack delay: microseconds between the arrival of the highest packet received
//!          and this ack (24 bits, saturated), so the sender can take it out of its RTT
//!   36..   ranges, 8 bytes each: start (u32, offset from the cumulative ack) and
//!          length (u32, >= 1); ascending, disjoint and not adjacent. For an ack they are
//!          packets received above the cumulative ack (SACK), so start >= 1; for a nak,
//!          packets missing, and the first may start at the cumulative ack itself (offset
//!          0: the first missing packet is the commonest one to nak).
//! ping body (8 bytes)
//!   16..24 floor (as in data)
//! admit body (8 bytes): admission control of fast bulk streams (see [`crate::admission`])
//!   16     op: 1 Fast_Req, 2 Fast_Ack, 3 Fast_NAck, 4 release
//!   17     reserved (zero)
//!   18..20 steered port: in a Fast_Ack, the receiver's socket for this stream alone
//!          (0: none, send to the endpoint's socket); zero in the other ops
//!   20..24 grant id (Fast_Ack and release; zero in Fast_Req and Fast_NAck, and in a
//!          release that withdraws a request not granted)
//! hello / welcome body (40 bytes): connection set-up, outside any connection's state
//!   16..32 sender's endpoint id
//!   32..48 addressee's endpoint id (from its address string; a hello to a stale
//!          address is refused)
//!   48..52 sender's largest datagram payload (its path MTU)
//!   52..56 reserved (zero)
//! trailer (every datagram but bulk)
//!   last 4 bytes: CRC-32C of everything before it; for a data datagram whose payload is
//!   at least [`HASHED_PAYLOAD_MIN`] bytes, CRC-32C of the header and the piggybacked ack
//!   (everything but the payload), XORed with the low 32 bits of the payload's XXH3-64
//!   ([`data_checksum`])
//! bulk datagram (24-byte header, then the payload; no trailer, no common header)
//!   0..2   payload length
//!   2..4   packet number minus floor (as in data), or 0xffff when the floor is that far
//!          below or farther (no floor carried)
//!   4      flags: bit 0 "the payload is hashed" ([`BulkHeader::hashed`]); the rest zero
//!   5      kind [`BULK_KIND`], where every other datagram has its kind byte (so a
//!          classifier that reads byte 5 of every datagram, the receive ring's packet
//!          filter, tells bulk fragments apart without knowing two layouts)
//!   6..10  packet number, low 32 bits (the receiver restores the rest from the packet
//!          number it expects next, [`BulkContext`])
//!   10..14 transfer id, low 32 bits (the receiver's name for the transfer is the
//!          sender's id of the send, from its clear-to-send; see [`wire_xfer`])
//!   14..20 offset of the payload in the transfer (48 bits)
//!   20..24 checksum: CRC-32C of the connection id (4 bytes, not sent) and bytes 0..20,
//!          XORed, when the flags say the payload is hashed, with the low 32 bits of the
//!          payload's XXH3-64 ([`bulk_checksum`])
//! ```
//!
//! A bulk datagram is one fragment of a rendezvous transfer whose destination is the
//! receiver's posted buffer. Its header holds only what a fragment must say, so that at
//! MTU 1500 a fragment carries 1 448 payload bytes, as many as a TCP segment with
//! timestamps (where the link is the bottleneck, goodput is payload per packet: a 64-byte
//! header would leave 1 408, 0.97x). The connection id it leaves out is checked
//! all the same: it seeds the checksum, so a fragment of another connection (an earlier
//! incarnation of the peer at the same address) fails it. Its checksum sits in the
//! header, so the datagram is exactly
//! `header | payload` and a receive vector `[header slot, destination + offset]` splits it
//! with nothing of it landing past the payload (see [`crate::spec`]). Its payload checksum
//! is XXH3 rather than CRC-32C: at 1.4 KB fragments the CRC instruction's serial
//! dependency chain made checksumming a fifth of all CPU time of a 1.8 GB/s transfer (both
//! sides profiled), XXH3's vector code is several times cheaper per byte; a random damage
//! still escapes with probability 2^-32.
//!
//! Every data fragment carries the whole message description (id, tag, length, offset), so
//! each datagram is self-describing: a receiver can place any payload at its final offset
//! without having seen the first fragment (what speculative defragmentation needs).

use crate::le::{u128_at, u16_at, u32_at, u64_at};
use thiserror::Error;

/// Magic number opening every datagram ("CLRD").
pub const MAGIC: u32 = 0x4452_4c43;
/// Version of the datagram format spoken by this build (2 since the bulk checksum
/// stopped seeding its hash, [`bulk_checksum`]; 3 since a bulk datagram's payload is
/// hashed only when its flag says so, [`BulkHeader::hashed`]; 4 since a data datagram's
/// long payload is hashed rather than CRC'd, [`data_checksum`]; 6 since a bulk datagram
/// has a header of its own, [`BULK_HEADER`] bytes; 7 since a welcome says whether the
/// connects crossed, [`Handshake::crossed`]). Hello and welcome carry it: two builds that
/// speak different versions never open a connection.
pub const VERSION: u8 = 7;
/// Kind byte (byte 5) of a bulk datagram, which has no common header: no other
/// datagram's kind.
pub const BULK_KIND: u8 = 0xb5;
/// Shortest data payload [`data_checksum`] hashes (shorter ones are CRC'd with the rest:
/// both cost little there, and the small messages' path stays as it was).
pub const HASHED_PAYLOAD_MIN: usize = 256;
/// Bytes of the common header.
pub const COMMON_HEADER: usize = 16;
/// Bytes before the payload of a data datagram.
pub const DATA_HEADER: usize = 60;
/// Bytes of an ack riding on a data datagram ([`DataHeader::ack`]).
pub const PIGGY_LEN: usize = 20;
/// Flag bit of a data datagram carrying an ack.
const FLAG_ACK: u16 = 1;
/// Flag bit of a bulk datagram whose checksum covers its payload ([`BulkHeader::hashed`]).
const FLAG_HASHED: u16 = 1;
/// Flag bit of a hello or welcome whose sender wants bulk payloads hashed
/// ([`Handshake::payload_hash`]).
const FLAG_WANT_HASH: u16 = 1;
/// Flag bit of a hello or welcome whose sender reads small datagrams apart from bulk
/// fragments ([`Handshake::two_paths`]).
const FLAG_TWO_PATHS: u16 = 2;
/// Flag bit of a welcome whose sender was connecting to the hello's sender
/// ([`Handshake::crossed`]).
const FLAG_CROSSED: u16 = 4;
/// Bytes before the ranges of an ack or nak datagram.
pub const ACK_HEADER: usize = 36;
/// Bytes of a ping datagram without its trailer.
pub const PING_LEN: usize = 24;
/// Bytes of an admit datagram (same as a ping).
pub const ADMIT_LEN: usize = 24;
/// Bytes of a hello or welcome datagram without its trailer.
pub const HANDSHAKE_LEN: usize = 56;
/// Bytes before the payload of a bulk datagram (its checksum included).
pub const BULK_HEADER: usize = 24;
/// Largest offset in a transfer a bulk datagram can carry, plus one (48 bits).
pub const MAX_BULK_OFFSET: u64 = 1 << 48;
/// The floor gap of a bulk datagram that carries no floor.
const NO_FLOOR: u16 = u16::MAX;
/// Bytes of the checksum trailer.
pub const TRAILER: usize = 4;
/// Most ranges an ack or nak datagram carries.
pub const MAX_RANGES: usize = 32;
/// Largest payload a single data datagram can carry (the length field is 16 bits).
pub const MAX_PAYLOAD: usize = u16::MAX as usize;

const K_DATA: u8 = 1;
const K_ACK: u8 = 2;
const K_NAK: u8 = 3;
const K_PING: u8 = 4;
const K_HELLO: u8 = 5;
const K_WELCOME: u8 = 6;
const K_ADMIT: u8 = 8;

/// True when the datagram's kind byte says hello or welcome (connection set-up): a cheap
/// peek for demultiplexing before [`Datagram::parse`], which still verifies everything.
pub fn is_handshake(b: &[u8]) -> bool {
    b.len() > 5 && (b[5] == K_HELLO || b[5] == K_WELCOME)
}

/// The 48-bit little-endian number at `b[at..at + 6]`.
pub(super) fn u48_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..6].copy_from_slice(&b[at..at + 6]);
    u64::from_le_bytes(w)
}

/// The full packet number whose low 32 bits are `low`, nearest to `next` (the receiver's
/// next expected packet number): what a sender never more than 2^31 packets ahead of or
/// behind its receiver's expectation meant.
pub fn expand_pn(next: u64, low: u32) -> u64 {
    const SPAN: u64 = 1 << 32;
    let cand = (next & !(SPAN - 1)) | u64::from(low);
    if cand < next && next - cand > SPAN / 2 {
        cand.checked_add(SPAN).unwrap_or(cand)
    } else if cand > next && cand - next > SPAN / 2 && cand >= SPAN {
        cand - SPAN
    } else {
        cand
    }
}

/// The length the datagram at the start of `b` gives itself in its header (payload
/// length, range count, or its kind's fixed size), read without verifying anything else;
/// `None` when `b` is too short to tell or does not open with clink's magic and version.
///
/// Total: any input gives a length or `None`. See [`coalesced_segment`].
pub fn declared_len(b: &[u8]) -> Option<usize> {
    if is_bulk(b) {
        return Some(BULK_HEADER + usize::from(u16_at(b, 0)));
    }
    if b.len() < COMMON_HEADER || u32_at(b, 0) != MAGIC || b[4] != VERSION {
        return None;
    }
    let plen = || (b.len() >= DATA_HEADER).then(|| usize::from(u16_at(b, 56)));
    Some(match b[5] {
        K_DATA => {
            let piggy = if u16_at(b, 6) & FLAG_ACK != 0 {
                PIGGY_LEN
            } else {
                0
            };
            DATA_HEADER + plen()? + piggy + TRAILER
        }
        K_ACK | K_NAK => ACK_HEADER + 8 * usize::from(*b.get(32)?) + TRAILER,
        K_HELLO | K_WELCOME => HANDSHAKE_LEN + TRAILER,
        K_ADMIT => ADMIT_LEN + TRAILER,
        // Every other kind is parsed as a ping (and refused unless it is one).
        _ => PING_LEN + TRAILER,
    })
}

/// The segment size when `b` is a coalesced read (several datagrams the kernel's UDP GRO
/// joined), told without the kernel's `UDP_GRO` control message: every datagram in it
/// declares ([`declared_len`]) the first one's length, the last one at most that and
/// exactly what is left. `None` for a single datagram, and for anything else (a damaged or
/// hostile one is then one datagram that [`Datagram::parse`] refuses, not several). A
/// forged read that passes is a run of datagrams its sender could have sent one by one.
/// Total: any input gives a size or `None`.
pub fn coalesced_segment(b: &[u8]) -> Option<usize> {
    let seg = declared_len(b).filter(|&s| s < b.len())?;
    let mut rest = b;
    while rest.len() > seg {
        if declared_len(rest) != Some(seg) {
            return None;
        }
        rest = &rest[seg..];
    }
    (declared_len(rest) == Some(rest.len())).then_some(seg)
}

/// The connection id of a datagram, read without verifying it (for demultiplexing;
/// [`Datagram::parse`] verifies). `None` when too short to hold one, and for a bulk
/// datagram, which does not carry it (its checksum does: [`parse_bulk`]).
pub fn peek_conn(b: &[u8]) -> Option<u32> {
    (b.len() >= COMMON_HEADER && !is_bulk(b)).then(|| u32_at(b, 8))
}

/// Why a datagram was refused by [`Datagram::parse`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PacketError {
    /// Shorter than the structure it announces.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being parsed.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Wrong magic number: not a clink datagram.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// Another version of the format.
    #[error("unsupported datagram version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    /// A bulk datagram parsed without its connection's [`BulkContext`] (which it takes to
    /// verify: its checksum covers the connection id it does not carry).
    #[error("bulk datagram parsed outside its connection")]
    BulkWithoutContext,
    /// Unknown kind byte.
    #[error("unknown datagram kind {0}")]
    BadKind(u8),
    /// A reserved field or flag is not zero.
    #[error("reserved bits set in {0}")]
    Reserved(&'static str),
    /// The checksum does not match: the datagram was damaged on the way.
    #[error("checksum mismatch: carried {carried:#010x}, computed {computed:#010x}")]
    BadChecksum {
        /// Checksum in the trailer.
        carried: u32,
        /// Checksum of the bytes received.
        computed: u32,
    },
    /// A length, offset or range field is inconsistent.
    #[error("{what} out of range: {value} (limit {limit})")]
    OutOfRange {
        /// Field name.
        what: &'static str,
        /// Value received.
        value: u64,
        /// Largest allowed value.
        limit: u64,
    },
}

/// Largest ack delay an ack can carry (24 bits of microseconds, about 16.8 s). An ack
/// that carries it gives its sender no RTT sample: its delay is unknown (the standing ack
/// an away application's keepalive thread repeats) or longer than anything a round trip
/// could be told from.
pub const MAX_ACK_DELAY_US: u32 = 0xff_ffff;

/// The acknowledgement fields shared by ack and nak datagrams.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckInfo {
    /// Every packet number below this was received (the next one expected).
    pub cum: u64,
    /// The sender may send packet numbers below this (flow-control credit).
    pub limit: u64,
    /// Microseconds the receiver held the ack since the highest packet arrived (at most
    /// [`MAX_ACK_DELAY_US`], which says "unknown": no RTT sample).
    pub delay_us: u32,
    /// Absolute half-open ranges `[start, end)` above `cum`: received ones (ack) or
    /// missing ones (nak, whose first range may also start at `cum`). Ascending,
    /// disjoint, non-adjacent, at most [`MAX_RANGES`].
    pub ranges: Vec<(u64, u64)>,
}

/// Fields of a data datagram (one fragment of one message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Packet number (per connection, from 0).
    pub pn: u64,
    /// Every packet below it has been acknowledged or abandoned by the sender.
    pub floor: u64,
    /// Message id (per connection, from 0).
    pub msg_id: u64,
    /// Message tag.
    pub tag: u64,
    /// Length of the whole message.
    pub msg_len: u32,
    /// Offset of this fragment in the message.
    pub offset: u32,
    /// An ack riding along (cumulative ack, limit, delay; no ranges): the answer to a
    /// request acknowledges it without a datagram of its own.
    pub ack: Option<Piggy>,
}

/// An ack carried by a data datagram: an [`AckInfo`] without ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piggy {
    /// As [`AckInfo::cum`].
    pub cum: u64,
    /// As [`AckInfo::limit`].
    pub limit: u64,
    /// As [`AckInfo::delay_us`].
    pub delay_us: u32,
}

impl Piggy {
    /// The ack it stands for.
    pub fn ack_info(&self) -> AckInfo {
        AckInfo {
            cum: self.cum,
            limit: self.limit,
            delay_us: self.delay_us,
            ranges: Vec::new(),
        }
    }
}

/// The body of a hello or welcome datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    /// The sender's endpoint id.
    pub from: u128,
    /// The addressee's endpoint id.
    pub to: u128,
    /// The sender's largest datagram payload.
    pub mtu_payload: u32,
    /// The sender wants the bulk payloads of this connection hashed end to end, both
    /// ways ([`BulkHeader::hashed`]).
    pub payload_hash: bool,
    /// The sender reads this connection's small datagrams by another path than its bulk
    /// fragments (a receive ring beside the sockets), so a small one can overtake
    /// fragments sent before it: the other end judges losses per kind
    /// ([`crate::reliable::Config::split_paths`]).
    pub two_paths: bool,
    /// Welcome only: the sender was connecting to the hello's sender when the hello came
    /// (the two connects crossed, so the pair will hold two connections).
    pub crossed: bool,
}

/// What an admit datagram says (admission control of fast bulk streams, the seed's
/// Fast_Req / Fast_Ack / Fast_NAck; see [`crate::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// The sender asks to send its bulk transfers fast (Fast_Req).
    Req,
    /// The receiver grants the fast stream (Fast_Ack).
    Ack {
        /// The grant's id (echoed by the release).
        grant: u32,
        /// A port of the receiver's that takes this stream alone (flow steering), or 0.
        port: u16,
    },
    /// The receiver refuses or revokes the fast stream (Fast_NAck): send slowly.
    NAck,
    /// The sender gives the grant back (or, with grant 0, withdraws its request).
    Release {
        /// The grant given back; 0 for a request not granted.
        grant: u32,
    },
}

/// A parsed datagram, borrowing the payload from the received bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datagram<'a> {
    /// One fragment of a message.
    Data {
        /// Connection id.
        conn: u32,
        /// Fragment description.
        hdr: DataHeader,
        /// Fragment bytes.
        payload: &'a [u8],
    },
    /// One fragment of a bulk (rendezvous) transfer.
    Bulk {
        /// Connection id.
        conn: u32,
        /// Fragment description.
        hdr: BulkHeader,
        /// Fragment bytes.
        payload: &'a [u8],
    },
    /// Cumulative + selective acknowledgement with the receiver's credit.
    Ack {
        /// Connection id.
        conn: u32,
        /// Ack fields; ranges are received packets.
        ack: AckInfo,
    },
    /// Negative acknowledgement: ranges are packets detected missing.
    Nak {
        /// Connection id.
        conn: u32,
        /// Ack fields; ranges are missing packets.
        ack: AckInfo,
    },
    /// Keepalive / probe; the peer answers with an ack at once.
    Ping {
        /// Connection id.
        conn: u32,
        /// As [`DataHeader::floor`].
        floor: u64,
    },
    /// Connection request: the sender chose `conn` for the new connection.
    Hello {
        /// Connection id proposed by the sender.
        conn: u32,
        /// Identities and limits.
        hs: Handshake,
    },
    /// Connection accepted (answer to a hello, same `conn`).
    Welcome {
        /// Connection id of the hello.
        conn: u32,
        /// Identities and limits.
        hs: Handshake,
    },
    /// Admission control of fast bulk streams.
    Admit {
        /// Connection id.
        conn: u32,
        /// Request, answer or release.
        admit: Admit,
    },
}

fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), PacketError> {
    if b.len() < n {
        Err(PacketError::Truncated {
            what,
            need: n,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

impl<'a> Datagram<'a> {
    /// A standing ack ([`crate::reliable::Conn::standing_ack`]) of connection `conn` as
    /// someone other than the connection repeats it: in-order only, with the "delay
    /// unknown" value ([`MAX_ACK_DELAY_US`]), so that it times nothing at the peer.
    pub fn standing_ack(conn: u32, cum: u64, limit: u64) -> Datagram<'static> {
        Datagram::Ack {
            conn,
            ack: AckInfo {
                cum,
                limit,
                delay_us: MAX_ACK_DELAY_US,
                ranges: Vec::new(),
            },
        }
    }

    /// The connection id the datagram carries.
    pub fn conn(&self) -> u32 {
        match self {
            Datagram::Data { conn, .. }
            | Datagram::Bulk { conn, .. }
            | Datagram::Ack { conn, .. }
            | Datagram::Nak { conn, .. }
            | Datagram::Ping { conn, .. }
            | Datagram::Hello { conn, .. }
            | Datagram::Welcome { conn, .. }
            | Datagram::Admit { conn, .. } => *conn,
        }
    }

    /// Parses and verifies one datagram other than a bulk one, which only its connection
    /// can verify ([`PacketError::BulkWithoutContext`]; see [`Datagram::parse_in`]).
    /// Total: any input gives a datagram or an error.
    pub fn parse(b: &'a [u8]) -> Result<Datagram<'a>, PacketError> {
        Datagram::parse_with(b, None)
    }

    /// Parses and verifies one datagram received on the connection `bulk` describes.
    /// Total: any input gives a datagram or an error.
    pub fn parse_in(b: &'a [u8], bulk: BulkContext) -> Result<Datagram<'a>, PacketError> {
        Datagram::parse_with(b, Some(bulk))
    }

    fn parse_with(b: &'a [u8], bulk: Option<BulkContext>) -> Result<Datagram<'a>, PacketError> {
        if is_bulk(b) {
            let ctx = bulk.ok_or(PacketError::BulkWithoutContext)?;
            need("bulk header", b, BULK_HEADER)?;
            let hdr = parse_bulk(ctx, &b[..BULK_HEADER], &b[BULK_HEADER..])?;
            return Ok(Datagram::Bulk {
                conn: ctx.conn,
                hdr,
                payload: &b[BULK_HEADER..],
            });
        }
        need("datagram", b, COMMON_HEADER + TRAILER)?;
        let kind = common(b)?;
        let body = b.len() - TRAILER;
        let carried = u32_at(b, body);
        let computed = if kind == K_DATA {
            data_checksum(&b[..body])
        } else {
            crc32c(&b[..body])
        };
        if carried != computed {
            return Err(PacketError::BadChecksum { carried, computed });
        }
        let b = &b[..body];
        let flags = u16_at(b, 6);
        let handshake = kind == K_HELLO || kind == K_WELCOME;
        if flags != 0
            && !(kind == K_DATA && flags == FLAG_ACK)
            && !(handshake && flags & !(FLAG_WANT_HASH | FLAG_TWO_PATHS | FLAG_CROSSED) == 0)
        {
            return Err(PacketError::Reserved("flags"));
        }
        if u32_at(b, 12) != 0 {
            return Err(PacketError::Reserved("common header"));
        }
        let conn = u32_at(b, 8);
        match kind {
            K_DATA => {
                need("data header", b, DATA_HEADER)?;
                if u16_at(b, 58) != 0 {
                    return Err(PacketError::Reserved("data header"));
                }
                let piggy = flags == FLAG_ACK;
                if piggy {
                    need("piggybacked ack", b, DATA_HEADER + PIGGY_LEN)?;
                }
                let plen = usize::from(u16_at(b, 56));
                let have = b.len() - DATA_HEADER - if piggy { PIGGY_LEN } else { 0 };
                let ack = piggy.then(|| {
                    let at = b.len() - PIGGY_LEN;
                    Piggy {
                        cum: u64_at(b, at),
                        limit: u64_at(b, at + 8),
                        delay_us: u32_at(b, at + 16),
                    }
                });
                let hdr = DataHeader {
                    pn: u64_at(b, 16),
                    floor: u64_at(b, 24),
                    msg_id: u64_at(b, 32),
                    tag: u64_at(b, 40),
                    msg_len: u32_at(b, 48),
                    offset: u32_at(b, 52),
                    ack,
                };
                if plen != have {
                    return Err(PacketError::OutOfRange {
                        what: "payload length",
                        value: plen as u64,
                        limit: have as u64,
                    });
                }
                let end = u64::from(hdr.offset) + plen as u64;
                if end > u64::from(hdr.msg_len) {
                    return Err(PacketError::OutOfRange {
                        what: "fragment end",
                        value: end,
                        limit: hdr.msg_len.into(),
                    });
                }
                if plen == 0 && hdr.msg_len != 0 {
                    return Err(PacketError::OutOfRange {
                        what: "empty fragment of a non-empty message",
                        value: 0,
                        limit: 0,
                    });
                }
                if hdr.floor > hdr.pn {
                    return Err(PacketError::OutOfRange {
                        what: "floor",
                        value: hdr.floor,
                        limit: hdr.pn,
                    });
                }
                if let Some(a) = ack {
                    if a.limit < a.cum {
                        return Err(PacketError::OutOfRange {
                            what: "piggybacked ack limit",
                            value: a.limit,
                            limit: a.cum,
                        });
                    }
                    if a.delay_us > MAX_ACK_DELAY_US {
                        return Err(PacketError::OutOfRange {
                            what: "piggybacked ack delay",
                            value: a.delay_us.into(),
                            limit: MAX_ACK_DELAY_US.into(),
                        });
                    }
                }
                Ok(Datagram::Data {
                    conn,
                    hdr,
                    payload: &b[DATA_HEADER..DATA_HEADER + plen],
                })
            }
            K_ACK | K_NAK => {
                need("ack header", b, ACK_HEADER)?;
                let cum = u64_at(b, 16);
                let limit = u64_at(b, 24);
                let n = usize::from(b[32]);
                let delay_us = u32::from_le_bytes([b[33], b[34], b[35], 0]);
                if n > MAX_RANGES {
                    return Err(PacketError::OutOfRange {
                        what: "range count",
                        value: n as u64,
                        limit: MAX_RANGES as u64,
                    });
                }
                let want = ACK_HEADER + 8 * n;
                if b.len() != want {
                    return Err(PacketError::OutOfRange {
                        what: "ack length",
                        value: b.len() as u64,
                        limit: want as u64,
                    });
                }
                let mut ranges = Vec::with_capacity(n);
                let mut prev_end = cum; // next start must be > prev_end (non-adjacent)
                for i in 0..n {
                    // A nak's first range may start at `cum` (offset 0).
                    let floor_ok = |s: u64| s > prev_end || (i == 0 && kind == K_NAK && s == cum);
                    let o = ACK_HEADER + 8 * i;
                    let start = u64::from(u32_at(b, o));
                    let len = u64::from(u32_at(b, o + 4));
                    let s = cum.checked_add(start);
                    let e = s.and_then(|s| s.checked_add(len));
                    match (s, e) {
                        (Some(s), Some(e)) if len > 0 && floor_ok(s) => {
                            ranges.push((s, e));
                            prev_end = e;
                        }
                        _ => {
                            return Err(PacketError::OutOfRange {
                                what: "ack range",
                                value: start,
                                limit: prev_end - cum,
                            })
                        }
                    }
                }
                let ack = AckInfo {
                    cum,
                    limit,
                    delay_us,
                    ranges,
                };
                Ok(if kind == K_ACK {
                    Datagram::Ack { conn, ack }
                } else {
                    Datagram::Nak { conn, ack }
                })
            }
            K_HELLO | K_WELCOME => {
                if b.len() != HANDSHAKE_LEN {
                    return Err(PacketError::OutOfRange {
                        what: "handshake length",
                        value: b.len() as u64,
                        limit: HANDSHAKE_LEN as u64,
                    });
                }
                if u32_at(b, 52) != 0 {
                    return Err(PacketError::Reserved("handshake"));
                }
                let hs = Handshake {
                    from: u128_at(b, 16),
                    to: u128_at(b, 32),
                    mtu_payload: u32_at(b, 48),
                    payload_hash: flags & FLAG_WANT_HASH != 0,
                    two_paths: flags & FLAG_TWO_PATHS != 0,
                    crossed: flags & FLAG_CROSSED != 0,
                };
                Ok(if kind == K_HELLO {
                    Datagram::Hello { conn, hs }
                } else {
                    Datagram::Welcome { conn, hs }
                })
            }
            K_ADMIT => {
                if b.len() != ADMIT_LEN {
                    return Err(PacketError::OutOfRange {
                        what: "admit length",
                        value: b.len() as u64,
                        limit: ADMIT_LEN as u64,
                    });
                }
                if b[17] != 0 {
                    return Err(PacketError::Reserved("admit"));
                }
                let (port, grant) = (u16_at(b, 18), u32_at(b, 20));
                let admit = match b[16] {
                    1 if grant == 0 => Admit::Req,
                    2 => Admit::Ack { grant, port },
                    3 if grant == 0 => Admit::NAck,
                    4 => Admit::Release { grant },
                    1 | 3 => return Err(PacketError::Reserved("admit grant")),
                    op => {
                        return Err(PacketError::OutOfRange {
                            what: "admit op",
                            value: op.into(),
                            limit: 4,
                        })
                    }
                };
                if port != 0 && !matches!(admit, Admit::Ack { .. }) {
                    return Err(PacketError::Reserved("admit port"));
                }
                Ok(Datagram::Admit { conn, admit })
            }
            _ => {
                if b.len() != PING_LEN {
                    return Err(PacketError::OutOfRange {
                        what: "ping length",
                        value: b.len() as u64,
                        limit: PING_LEN as u64,
                    });
                }
                Ok(Datagram::Ping {
                    conn,
                    floor: u64_at(b, 16),
                })
            }
        }
    }

    /// Appends the encoded datagram (with its checksum) to `out`; returns bytes written.
    ///
    /// # Panics
    /// On a caller bug: a payload longer than [`MAX_PAYLOAD`], more than [`MAX_RANGES`]
    /// ranges, or ranges that do not follow the rules of [`AckInfo::ranges`].
    pub fn encode(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        let (kind, conn) = match self {
            Datagram::Data { conn, .. } => (K_DATA, *conn),
            Datagram::Bulk { conn, hdr, payload } => {
                out.extend_from_slice(&encode_bulk_header(*conn, hdr, payload));
                out.extend_from_slice(payload);
                return out.len() - start;
            }
            Datagram::Ack { conn, .. } => (K_ACK, *conn),
            Datagram::Nak { conn, .. } => (K_NAK, *conn),
            Datagram::Ping { conn, .. } => (K_PING, *conn),
            Datagram::Hello { conn, .. } => (K_HELLO, *conn),
            Datagram::Welcome { conn, .. } => (K_WELCOME, *conn),
            Datagram::Admit { conn, .. } => (K_ADMIT, *conn),
        };
        let flags = match self {
            Datagram::Data { hdr, .. } if hdr.ack.is_some() => FLAG_ACK,
            Datagram::Hello { hs, .. } | Datagram::Welcome { hs, .. } => {
                (if hs.payload_hash { FLAG_WANT_HASH } else { 0 })
                    | (if hs.two_paths { FLAG_TWO_PATHS } else { 0 })
                    | (if hs.crossed { FLAG_CROSSED } else { 0 })
            }
            _ => 0,
        };
        let common = common_header(kind, flags, conn);
        if !matches!(self, Datagram::Data { .. }) {
            out.extend_from_slice(&common);
        }
        match self {
            Datagram::Data { hdr, payload, .. } => {
                // Written in place, not field by field: every `extend_from_slice` checks
                // the capacity (a data datagram's encode was about 250 instructions
                // besides its CRC, `valgrind --tool=callgrind` on `examples/path_cost udp`).
                let plen = u16::try_from(payload.len()).expect("payload longer than MAX_PAYLOAD");
                let mut h = [0u8; DATA_HEADER];
                h[..COMMON_HEADER].copy_from_slice(&common);
                h[16..24].copy_from_slice(&hdr.pn.to_le_bytes());
                h[24..32].copy_from_slice(&hdr.floor.to_le_bytes());
                h[32..40].copy_from_slice(&hdr.msg_id.to_le_bytes());
                h[40..48].copy_from_slice(&hdr.tag.to_le_bytes());
                h[48..52].copy_from_slice(&hdr.msg_len.to_le_bytes());
                h[52..56].copy_from_slice(&hdr.offset.to_le_bytes());
                h[56..58].copy_from_slice(&plen.to_le_bytes());
                out.reserve(DATA_HEADER + payload.len() + PIGGY_LEN + TRAILER);
                out.extend_from_slice(&h);
                out.extend_from_slice(payload);
                if let Some(a) = hdr.ack {
                    let mut t = [0u8; PIGGY_LEN];
                    t[0..8].copy_from_slice(&a.cum.to_le_bytes());
                    t[8..16].copy_from_slice(&a.limit.to_le_bytes());
                    t[16..20].copy_from_slice(&a.delay_us.min(MAX_ACK_DELAY_US).to_le_bytes());
                    out.extend_from_slice(&t);
                }
            }
            Datagram::Bulk { .. } => unreachable!("encoded above"),
            Datagram::Ack { ack, .. } | Datagram::Nak { ack, .. } => {
                assert!(ack.ranges.len() <= MAX_RANGES, "too many ranges");
                out.extend_from_slice(&ack.cum.to_le_bytes());
                out.extend_from_slice(&ack.limit.to_le_bytes());
                let d = ack.delay_us.min(MAX_ACK_DELAY_US).to_le_bytes();
                out.extend_from_slice(&[ack.ranges.len() as u8, d[0], d[1], d[2]]);
                for &(s, e) in &ack.ranges {
                    let off = u32::try_from(s - ack.cum).expect("range too far above cum");
                    let len = u32::try_from(e - s).expect("range too long");
                    out.extend_from_slice(&off.to_le_bytes());
                    out.extend_from_slice(&len.to_le_bytes());
                }
            }
            Datagram::Ping { floor, .. } => out.extend_from_slice(&floor.to_le_bytes()),
            Datagram::Hello { hs, .. } | Datagram::Welcome { hs, .. } => {
                out.extend_from_slice(&hs.from.to_le_bytes());
                out.extend_from_slice(&hs.to.to_le_bytes());
                out.extend_from_slice(&hs.mtu_payload.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
            }
            Datagram::Admit { admit, .. } => {
                let (op, grant, port) = match *admit {
                    Admit::Req => (1u8, 0u32, 0u16),
                    Admit::Ack { grant, port } => (2, grant, port),
                    Admit::NAck => (3, 0, 0),
                    Admit::Release { grant } => (4, grant, 0),
                };
                out.extend_from_slice(&[op, 0]);
                out.extend_from_slice(&port.to_le_bytes());
                out.extend_from_slice(&grant.to_le_bytes());
            }
        }
        let sum = if kind == K_DATA {
            data_checksum(&out[start..])
        } else {
            crc32c(&out[start..])
        };
        out.extend_from_slice(&sum.to_le_bytes());
        out.len() - start
    }
}

/// Checks magic, version and kind of the common header; returns the kind.
fn common(b: &[u8]) -> Result<u8, PacketError> {
    let magic = u32_at(b, 0);
    if magic != MAGIC {
        return Err(PacketError::BadMagic(magic));
    }
    if b[4] != VERSION {
        return Err(PacketError::BadVersion(b[4]));
    }
    let kind = b[5];
    if !matches!(kind, K_DATA..=K_WELCOME | K_ADMIT) {
        return Err(PacketError::BadKind(kind));
    }
    Ok(kind)
}

/// The 16 bytes every datagram starts with: magic, version, kind, flags, connection id,
/// four reserved zero bytes.
fn common_header(kind: u8, flags: u16, conn: u32) -> [u8; COMMON_HEADER] {
    let mut h = [0u8; COMMON_HEADER];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4] = VERSION;
    h[5] = kind;
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..12].copy_from_slice(&conn.to_le_bytes());
    h
}

mod bulk;
mod checksum;
#[cfg(test)]
mod tests;

pub use bulk::{
    bulk_claim, bulk_header_owner, bulk_owner, encode_bulk_header, is_bulk, parse_bulk, wire_xfer,
    BulkContext, BulkHeader,
};
pub use checksum::{bulk_checksum, checked_len, crc32c, data_checksum};
