//! Framing of the TCP transport's byte stream, sans-IO.
//!
//! A TCP connection carries **records**, each a fixed [`HEADER`]-byte header followed by
//! `len` payload bytes:
//!
//! ```text
//! 0      1        4        8         16          24
//! | kind | 0 0 0  | len u32 | xfer u64 | offset u64 | payload (len bytes) ...
//! ```
//!
//! (little-endian). Kinds: [`Kind::Frame`] (one endpoint [`crate::wire::Frame`]),
//! [`Kind::Data`] (a piece of a rendezvous payload: bytes `offset..offset + len` of bulk
//! transfer `xfer`), [`Kind::Hello`] and [`Kind::Welcome`] (the connection handshake,
//! [`Handshake`]), [`Kind::Keepalive`] (no payload; read and skipped: the runtime leaves
//! liveness to the kernel's TCP keepalives and sends none). The header has a fixed size
//! so that a receiver expecting the next piece of a transfer can read with one vector
//! pair `[header slot, destination + offset]`: speculative receive applied to a byte
//! stream. [`Incoming`] keeps the
//! receiver's transfers, predicts the next piece ([`Incoming::predict`]) and validates
//! every data header ([`Incoming::begin`]); senders cut transfers into pieces of
//! [`CHUNK`] bytes, which is what the prediction assumes (another cut only costs misses).
//!
//! Every parser here is total: a malformed header is a [`ProtoError`], never a panic.

use crate::le::{need, put_u128, put_u32, put_u64, u128_at, u16_at, u32_at, u64_at};
use crate::ProtoError;
use std::collections::VecDeque;

/// Bytes of a record header.
pub const HEADER: usize = 24;
/// Largest payload of a record (a frame or one data piece): 1 GiB.
pub const MAX_RECORD: u32 = 1 << 30;
/// Bytes of a rendezvous payload per data record (the last piece may be shorter).
pub const CHUNK: usize = 1 << 20;
/// Magic number opening a handshake payload ("CLTP").
pub const MAGIC: u32 = 0x5054_4c43;
/// Version of the stream protocol (2 since the handshake's byte 7 holds flags,
/// [`Handshake::crossed`]).
pub const VERSION: u16 = 2;
/// Payload bytes of a hello or welcome.
pub const HANDSHAKE_LEN: usize = 40;

/// What a record carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One endpoint frame (eager message, rendezvous control, RMA, close).
    Frame,
    /// A piece of a bulk (rendezvous) transfer.
    Data,
    /// Connection request: names the addressee.
    Hello,
    /// Answer to a hello: accepted or refused.
    Welcome,
    /// Sent on a connection with nothing else to say, so the peer can tell an idle
    /// endpoint from one that stopped (no payload).
    Keepalive,
}

impl Kind {
    /// The kind's byte on the wire.
    pub fn byte(self) -> u8 {
        match self {
            Kind::Frame => 1,
            Kind::Data => 2,
            Kind::Hello => 3,
            Kind::Welcome => 4,
            Kind::Keepalive => 5,
        }
    }
}

/// A record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the payload is.
    pub kind: Kind,
    /// Payload bytes that follow the header.
    pub len: u32,
    /// Bulk transfer (data records; 0 otherwise).
    pub xfer: u64,
    /// Offset of the payload in its transfer (data records; 0 otherwise).
    pub offset: u64,
}

impl Header {
    /// The header of a frame record of `len` bytes.
    pub fn frame(len: usize) -> Header {
        Header {
            kind: Kind::Frame,
            len: len as u32,
            xfer: 0,
            offset: 0,
        }
    }

    /// The keepalive record (a header alone).
    pub fn keepalive() -> Header {
        Header {
            kind: Kind::Keepalive,
            len: 0,
            xfer: 0,
            offset: 0,
        }
    }

    /// The header of data record: bytes `offset..offset + len` of transfer `xfer`.
    pub fn data(xfer: u64, offset: u64, len: usize) -> Header {
        Header {
            kind: Kind::Data,
            len: len as u32,
            xfer,
            offset,
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0] = self.kind.byte();
        put_u32(&mut b, 4, self.len);
        put_u64(&mut b, 8, self.xfer);
        put_u64(&mut b, 16, self.offset);
        b
    }

    /// Parses a header from the first [`HEADER`] bytes of `b` (total: every malformed
    /// input is an error).
    pub fn parse(b: &[u8]) -> Result<Header, ProtoError> {
        need("stream record header", b, HEADER)?;
        let kind = match b[0] {
            1 => Kind::Frame,
            2 => Kind::Data,
            3 => Kind::Hello,
            4 => Kind::Welcome,
            5 => Kind::Keepalive,
            k => return Err(ProtoError::BadKind(k)),
        };
        if b[1..4] != [0, 0, 0] {
            return Err(ProtoError::OutOfRange {
                what: "stream record reserved bytes",
                value: u64::from(u32::from_le_bytes([b[1], b[2], b[3], 0])),
                limit: 0,
            });
        }
        let len = u32_at(b, 4);
        let (xfer, offset) = (u64_at(b, 8), u64_at(b, 16));
        if len > MAX_RECORD {
            return Err(ProtoError::OutOfRange {
                what: "stream record length",
                value: u64::from(len),
                limit: u64::from(MAX_RECORD),
            });
        }
        if kind != Kind::Data && (xfer != 0 || offset != 0) {
            return Err(ProtoError::OutOfRange {
                what: "transfer field of a non-data record",
                value: xfer | offset,
                limit: 0,
            });
        }
        if matches!(kind, Kind::Hello | Kind::Welcome) && len as usize != HANDSHAKE_LEN {
            return Err(ProtoError::OutOfRange {
                what: "handshake record length",
                value: u64::from(len),
                limit: HANDSHAKE_LEN as u64,
            });
        }
        if kind == Kind::Keepalive && len != 0 {
            return Err(ProtoError::OutOfRange {
                what: "keepalive record length",
                value: u64::from(len),
                limit: 0,
            });
        }
        if kind == Kind::Data && offset.checked_add(u64::from(len)).is_none() {
            return Err(ProtoError::OutOfRange {
                what: "data record offset",
                value: offset,
                limit: u64::MAX - u64::from(len),
            });
        }
        Ok(Header {
            kind,
            len,
            xfer,
            offset,
        })
    }
}

/// A hello (connector -> listener) or welcome (answer) payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// The sender's endpoint id.
    pub from: u128,
    /// The endpoint id the sender believes it talks to.
    pub to: u128,
    /// Welcome only: 0 accepted, [`REFUSED_WRONG_ID`] refused (the hello named another
    /// endpoint: a stale address).
    pub status: u8,
    /// Welcome only: the sender was connecting to the hello's sender when the hello came
    /// (the two connects crossed, so the pair will hold two connections).
    pub crossed: bool,
}

/// Welcome status: the hello named an endpoint id that does not listen here.
pub const REFUSED_WRONG_ID: u8 = 1;
/// Handshake flag: [`Handshake::crossed`].
const FLAG_CROSSED: u8 = 1;

impl Handshake {
    /// Encodes a whole record (header + payload) of `kind` (hello or welcome).
    pub fn record(&self, kind: Kind) -> [u8; HEADER + HANDSHAKE_LEN] {
        let mut b = [0u8; HEADER + HANDSHAKE_LEN];
        let h = Header {
            kind,
            len: HANDSHAKE_LEN as u32,
            xfer: 0,
            offset: 0,
        };
        b[..HEADER].copy_from_slice(&h.encode());
        let p = &mut b[HEADER..];
        put_u32(p, 0, MAGIC);
        p[4..6].copy_from_slice(&VERSION.to_le_bytes());
        p[6] = self.status;
        p[7] = if self.crossed { FLAG_CROSSED } else { 0 };
        put_u128(p, 8, self.from);
        put_u128(p, 24, self.to);
        b
    }

    /// Parses a handshake payload (the bytes after the header).
    pub fn parse(p: &[u8]) -> Result<Handshake, ProtoError> {
        if p.len() != HANDSHAKE_LEN {
            return Err(ProtoError::Truncated {
                what: "stream handshake",
                need: HANDSHAKE_LEN,
                have: p.len(),
            });
        }
        let magic = u32_at(p, 0);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        let version = u16_at(p, 4);
        if version != VERSION {
            return Err(ProtoError::BadVersion {
                got: version,
                want: VERSION,
            });
        }
        if p[7] & !FLAG_CROSSED != 0 {
            return Err(ProtoError::OutOfRange {
                what: "stream handshake flags",
                value: p[7].into(),
                limit: FLAG_CROSSED.into(),
            });
        }
        Ok(Handshake {
            status: p[6],
            crossed: p[7] & FLAG_CROSSED != 0,
            from: u128_at(p, 8),
            to: u128_at(p, 24),
        })
    }
}

/// One incoming bulk transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Transfer {
    xfer: u64,
    total: u64,
    /// Bytes announced by data headers so far (the next piece starts here).
    announced: u64,
}

/// What [`Incoming::predict`] expects next on the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// The transfer.
    pub xfer: u64,
    /// Offset of the next piece.
    pub offset: u64,
    /// Its length.
    pub len: usize,
    /// It is the transfer's last piece (what follows is not more of it).
    pub last: bool,
}

impl Prediction {
    /// The header the prediction expects.
    pub fn header(&self) -> Header {
        Header::data(self.xfer, self.offset, self.len)
    }
}

/// The receiver's bulk transfers on one connection, in the order their clear-to-send went
/// out (the order the sender serves them: one transfer at a time, in pieces of [`CHUNK`]).
#[derive(Clone, Debug, Default)]
pub struct Incoming {
    q: VecDeque<Transfer>,
}

impl Incoming {
    /// Expects transfer `xfer` of `total` bytes (after it, in order).
    pub fn expect(&mut self, xfer: u64, total: u64) {
        self.q.push_back(Transfer {
            xfer,
            total,
            announced: 0,
        });
    }

    /// True when no transfer is expected.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Forgets every transfer (the peer failed).
    pub fn clear(&mut self) {
        self.q.clear();
    }

    /// The next data record the stream should carry if the sender behaves as expected:
    /// the oldest transfer's next piece of at most [`CHUNK`] bytes.
    pub fn predict(&self) -> Option<Prediction> {
        let t = self.q.front()?;
        let len = (t.total - t.announced).min(CHUNK as u64);
        Some(Prediction {
            xfer: t.xfer,
            offset: t.announced,
            len: len as usize,
            last: t.announced + len == t.total,
        })
    }

    /// Bytes of transfer `xfer` announced by data headers so far, `None` when it is not
    /// (any more) expected.
    pub fn predict_for(&self, xfer: u64) -> Option<u64> {
        self.q.iter().find(|t| t.xfer == xfer).map(|t| t.announced)
    }

    /// Validates a data header and accounts its piece. Pieces of a transfer must come in
    /// order without gaps and stay inside it; transfers may interleave. Returns true when
    /// the piece is the transfer's last (the transfer is then forgotten).
    pub fn begin(&mut self, h: &Header) -> Result<bool, ProtoError> {
        let bad = |what, value, limit| ProtoError::OutOfRange { what, value, limit };
        if h.kind != Kind::Data {
            return Err(ProtoError::BadKind(h.kind.byte()));
        }
        let i = self.q.iter().position(|t| t.xfer == h.xfer).ok_or(bad(
            "data for an unknown transfer",
            h.xfer,
            0,
        ))?;
        let t = &mut self.q[i];
        if h.offset != t.announced {
            return Err(bad("data record offset", h.offset, t.announced));
        }
        let end = h.offset + u64::from(h.len);
        if end > t.total {
            return Err(bad("data beyond its transfer", end, t.total));
        }
        t.announced = end;
        let last = end == t.total;
        if last {
            self.q.remove(i);
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn headers_round_trip_and_reject() {
        for h in [
            Header::frame(0),
            Header::frame(70_000),
            Header::data(7, 1 << 40, CHUNK),
            Header::keepalive(),
        ] {
            assert_eq!(Header::parse(&h.encode()), Ok(h));
        }
        let mut b = Header::frame(5).encode();
        b[0] = 9;
        assert_eq!(Header::parse(&b), Err(ProtoError::BadKind(9)));
        let mut b = Header::frame(5).encode();
        b[2] = 1;
        assert!(Header::parse(&b).is_err());
        let mut b = Header::frame(5).encode();
        b[4..8].copy_from_slice(&(MAX_RECORD + 1).to_le_bytes());
        assert!(Header::parse(&b).is_err());
        let mut b = Header::frame(5).encode();
        b[8] = 1; // a frame naming a transfer
        assert!(Header::parse(&b).is_err());
        assert!(Header::parse(&Header::data(1, u64::MAX, 2).encode()).is_err());
        let mut b = Header::keepalive().encode();
        b[4] = 1; // a keepalive with a payload
        assert!(Header::parse(&b).is_err());
        assert!(Header::parse(&b[..HEADER - 1]).is_err());
        let hs = Handshake {
            from: 1 << 100,
            to: 3,
            status: REFUSED_WRONG_ID,
            crossed: false,
        };
        let r = hs.record(Kind::Welcome);
        assert_eq!(
            next_record(&r).unwrap().map(|(h, n)| (h.kind, n)),
            Some((Kind::Welcome, r.len()))
        );
        assert_eq!(Handshake::parse(&r[HEADER..]), Ok(hs));
        let crossed = Handshake {
            status: 0,
            crossed: true,
            ..hs
        };
        let r = crossed.record(Kind::Welcome);
        assert_eq!(Handshake::parse(&r[HEADER..]), Ok(crossed));
        let mut unknown = r;
        unknown[HEADER + 7] |= 2;
        assert!(Handshake::parse(&unknown[HEADER..]).is_err());
        let mut bad = r;
        bad[HEADER] ^= 1;
        assert!(matches!(
            Handshake::parse(&bad[HEADER..]),
            Err(ProtoError::BadMagic(_))
        ));
    }

    #[test]
    fn incoming_predicts_and_validates() {
        let mut inc = Incoming::default();
        assert_eq!(inc.predict(), None);
        inc.expect(5, CHUNK as u64 + 10);
        inc.expect(6, 0);
        let p = inc.predict().unwrap();
        assert_eq!((p.xfer, p.offset, p.len, p.last), (5, 0, CHUNK, false));
        // Out of order, unknown, beyond the end: refused, state unchanged.
        assert!(inc.begin(&Header::data(5, 1, 3)).is_err());
        assert!(inc.begin(&Header::data(9, 0, 3)).is_err());
        assert!(inc.begin(&Header::data(5, 0, CHUNK + 11)).is_err());
        assert!(inc.begin(&Header::frame(3)).is_err());
        assert_eq!(inc.begin(&p.header()), Ok(false));
        let p = inc.predict().unwrap();
        assert_eq!((p.offset, p.len, p.last), (CHUNK as u64, 10, true));
        assert_eq!(inc.begin(&p.header()), Ok(true));
        assert_eq!(inc.predict().map(|p| (p.xfer, p.len)), Some((6, 0)));
        assert_eq!(inc.begin(&Header::data(6, 0, 0)), Ok(true));
        assert!(inc.is_empty());
    }

    /// The next complete record at the start of `b`: its header and total length (with
    /// the payload), `Ok(None)` while incomplete. A deframer of whole records for the
    /// tests' receiver; the TCP link streams data payloads instead of waiting for them.
    fn next_record(b: &[u8]) -> Result<Option<(Header, usize)>, ProtoError> {
        if b.len() < HEADER {
            return Ok(None);
        }
        let h = Header::parse(b)?;
        let total = HEADER + h.len as usize;
        Ok((b.len() >= total).then_some((h, total)))
    }

    /// A record of the model: kind and payload (data records: transfer, offset).
    fn record(kind: u8, xfer: u64, off: u64, payload: &[u8]) -> Vec<u8> {
        let h = match kind % 2 {
            0 => Header::frame(payload.len()),
            _ => Header::data(xfer, off, payload.len()),
        };
        let mut v = h.encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    proptest! {
        /// Arbitrary bytes: the parsers never panic, and a header that parses re-encodes
        /// to the same bytes.
        #[test]
        fn parsers_are_total(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(h) = Header::parse(&b) {
                prop_assert_eq!(&h.encode()[..], &b[..HEADER]);
            }
            let _ = next_record(&b);
            let _ = Handshake::parse(&b);
            let mut inc = Incoming::default();
            inc.expect(1, 1000);
            if let Ok(h) = Header::parse(&b) {
                let _ = inc.begin(&h);
            }
        }

        /// A sequence of records cut at arbitrary points comes out whole and in order.
        #[test]
        fn records_survive_any_cut(
            recs in proptest::collection::vec(
                (any::<u8>(), any::<u64>(), 0u64..1 << 40, proptest::collection::vec(any::<u8>(), 0..300)),
                0..20),
            cuts in proptest::collection::vec(1usize..97, 1..40),
        ) {
            let mut stream = Vec::new();
            for (k, x, o, p) in &recs {
                stream.extend(record(*k, *x, *o, p));
            }
            // Feed the stream in pieces, deframing as a receiver would.
            let (mut buf, mut at, mut out, mut c) = (Vec::new(), 0usize, Vec::new(), 0usize);
            while at < stream.len() || !buf.is_empty() {
                let n = cuts[c % cuts.len()].min(stream.len() - at);
                c += 1;
                buf.extend_from_slice(&stream[at..at + n]);
                at += n;
                while let Some((h, total)) = next_record(&buf).unwrap() {
                    out.push((h, buf[HEADER..total].to_vec()));
                    buf.drain(..total);
                }
                if n == 0 {
                    break;
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(out.len(), recs.len());
            for ((h, p), (k, x, o, q)) in out.iter().zip(&recs) {
                prop_assert_eq!(p, q);
                if k % 2 == 1 {
                    prop_assert_eq!((h.kind, h.xfer, h.offset), (Kind::Data, *x, *o));
                } else {
                    prop_assert_eq!(h.kind, Kind::Frame);
                }
            }
        }
    }
}
