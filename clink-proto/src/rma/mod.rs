//! One-sided access to apertures (CLAN): capability cookies, the target's access check, and
//! the RMA frames carried on a peer's link.
//!
//! An aperture is a memory region of an endpoint; an *export* of it grants a window
//! (`base..base+len` of the aperture) with rights, guarded by a 128-bit random key. The
//! [`Cookie`] names the export and carries the key; whoever holds it may access the window
//! through the owner. The owner checks every access with [`check`] (key in constant time,
//! then revocation, rights and bounds) before touching memory.
//!
//! Frame layout (inside a [`crate::wire::Frame::Rma`]): byte 0 the kind, byte 1 a
//! kind-specific flag (status or atomic op), bytes 2..4 zero, bytes 4..8 the export of a
//! request's target (else zero), the request number at 8..16, then the kind's fields: a
//! request's target continues with `key | offset` ([`RMA_HEADER`]), offsets relative to
//! the export's window. Every integer is little-endian; parsing is total.

mod engine;
pub mod serve;

pub use engine::{BulkCopy, Engine, Piece, QUANTUM};

use crate::le::{need, put_u128, put_u32, put_u64, u128_at, u32_at, u64_at};
use crate::ProtoError;

/// Right to read (get, fetch from atomics).
pub const READ: u8 = 1;
/// Right to write (put, atomics, notify).
pub const WRITE: u8 = 2;

/// Bytes of an encoded [`Cookie`].
pub const COOKIE_LEN: usize = 64;
const COOKIE_MAGIC: u32 = 0x4549_4b43; // "CKIE"

/// An exported, unforgeable capability to one window of an aperture.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cookie {
    /// Identity of the endpoint owning the aperture.
    pub owner: u128,
    /// Export number at the owner.
    pub export: u32,
    /// Start of the window within the aperture. Accesses are relative to the window (the
    /// owner checks them against its own export, never this field); a same-host mapping
    /// uses it to place the window in the mapped file (which holds the whole aperture), so
    /// a forged base only misplaces the forger's own view.
    pub base: u64,
    /// Length of the window in bytes.
    pub len: u64,
    /// [`READ`] and/or [`WRITE`].
    pub rights: u8,
    /// The random key the owner checks.
    pub key: u128,
}

impl std::fmt::Debug for Cookie {
    /// Never prints the key (cookies end up in logs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cookie")
            .field("owner", &format_args!("{:032x}", self.owner))
            .field("export", &self.export)
            .field("base", &self.base)
            .field("len", &self.len)
            .field("rights", &self.rights)
            .finish_non_exhaustive()
    }
}

impl Cookie {
    /// The cookie as bytes, to send in any message.
    pub fn to_bytes(&self) -> [u8; COOKIE_LEN] {
        let mut b = [0u8; COOKIE_LEN];
        put_u32(&mut b, 0, COOKIE_MAGIC);
        put_u32(&mut b, 4, self.export);
        put_u128(&mut b, 8, self.owner);
        put_u64(&mut b, 24, self.base);
        put_u64(&mut b, 32, self.len);
        b[40] = self.rights;
        put_u128(&mut b, 48, self.key);
        b
    }

    /// Parses a cookie received from anywhere. Only the form is checked here; the owner
    /// checks the key on every access.
    pub fn from_bytes(b: &[u8]) -> Result<Cookie, ProtoError> {
        need("cookie", b, COOKIE_LEN)?;
        if b.len() != COOKIE_LEN {
            return Err(ProtoError::OutOfRange {
                what: "cookie length",
                value: b.len() as u64,
                limit: COOKIE_LEN as u64,
            });
        }
        let magic = u32_at(b, 0);
        if magic != COOKIE_MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        let rights = b[40];
        if rights == 0 || rights & !(READ | WRITE) != 0 || b[41..48].iter().any(|&x| x != 0) {
            return Err(ProtoError::OutOfRange {
                what: "cookie rights",
                value: u64::from(rights),
                limit: u64::from(READ | WRITE),
            });
        }
        let (base, len) = (u64_at(b, 24), u64_at(b, 32));
        if base.checked_add(len).is_none() {
            return Err(ProtoError::OutOfRange {
                what: "cookie window end",
                value: base,
                limit: u64::MAX - len,
            });
        }
        Ok(Cookie {
            export: u32_at(b, 4),
            owner: u128_at(b, 8),
            base,
            len,
            rights,
            key: u128_at(b, 48),
        })
    }
}

/// What the owner holds for one export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The aperture exported.
    pub aperture: u32,
    /// Start of the window within the aperture.
    pub base: u64,
    /// Length of the window.
    pub len: u64,
    /// Rights granted.
    pub rights: u8,
    /// The key a request must present.
    pub key: u128,
    /// Revoked exports stay known so that their holders get a clear answer.
    pub revoked: bool,
}

/// Outcome of an access as carried on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The export does not exist (never did, or its aperture was destroyed).
    NoSuchExport = 1,
    /// The key does not match: a forged or corrupted cookie.
    BadKey = 2,
    /// The export was revoked.
    Revoked = 3,
    /// The access leaves the exported window.
    OutOfRange = 4,
    /// The cookie does not grant the right needed.
    NotPermitted = 5,
    /// An atomic on an address that is not 8-byte aligned.
    Misaligned = 6,
    /// The target could not perform it (e.g. a copy from the initiator's memory failed).
    Failed = 7,
    /// Not possible over this transport (e.g. mapping across hosts).
    Unsupported = 8,
}

impl Status {
    /// Decodes a status byte; unknown values are `None` (a protocol error).
    pub fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::NoSuchExport,
            2 => Status::BadKey,
            3 => Status::Revoked,
            4 => Status::OutOfRange,
            5 => Status::NotPermitted,
            6 => Status::Misaligned,
            7 => Status::Failed,
            8 => Status::Unsupported,
            _ => return None,
        })
    }

    /// A sentence for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::NoSuchExport => "no such export at the target",
            Status::BadKey => "the cookie's key does not match (forged or corrupted cookie)",
            Status::Revoked => "the cookie was revoked",
            Status::OutOfRange => "the access leaves the exported window",
            Status::NotPermitted => "the cookie does not grant this access",
            Status::Misaligned => "atomics need an 8-byte aligned offset",
            Status::Failed => "the target could not perform the access",
            Status::Unsupported => "not possible over this transport",
        }
    }
}

/// Compares keys in time independent of where they differ.
#[inline]
pub fn key_eq(a: u128, b: u128) -> bool {
    // One XOR of the whole key, hidden from the optimiser before the test against zero:
    // no comparison that stops at the first differing byte.
    std::hint::black_box(a ^ b) == 0
}

/// The owner's check of one access of `len` bytes at `offset` in the window of `grant`
/// needing `need` rights. Returns the offset within the aperture. The key is checked
/// first, so a forger learns nothing about revocation, rights or bounds.
#[inline]
pub fn check(
    grant: Option<&Grant>,
    key: u128,
    offset: u64,
    len: u64,
    need: u8,
) -> Result<u64, Status> {
    let g = grant.ok_or(Status::NoSuchExport)?;
    if !key_eq(g.key, key) {
        return Err(Status::BadKey);
    }
    if g.revoked {
        return Err(Status::Revoked);
    }
    if g.rights & need != need {
        return Err(Status::NotPermitted);
    }
    match offset.checked_add(len) {
        Some(end) if end <= g.len => Ok(g.base + offset),
        _ => Err(Status::OutOfRange),
    }
}

/// Word-sized atomic operations (the discriminant is the frame's op byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AtomicOp {
    /// Adds `a`, returns the old value.
    FetchAdd = 1,
    /// Stores `b` if the value is `a`; returns the old value.
    CompareSwap = 2,
}

impl AtomicOp {
    /// Decodes an op byte; unknown values are `None` (a protocol error).
    pub fn from_u8(v: u8) -> Option<AtomicOp> {
        Some(match v {
            1 => AtomicOp::FetchAdd,
            2 => AtomicOp::CompareSwap,
            _ => return None,
        })
    }
}

/// Names the target of a request: export, key and offset within the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Export number.
    pub export: u32,
    /// Key presented.
    pub key: u128,
    /// Offset within the export's window.
    pub offset: u64,
}

/// Size of the fixed part of put and get frames: `kind, op/status, 2 zero bytes, export |
/// req | key | offset` (40 bytes, so a put of one word fills exactly one 64-byte ring
/// cell with the ring's 16-byte record header).
pub const RMA_HEADER: usize = 40;

const K_PUT: u8 = 16;
const K_PUT_CMA: u8 = 17;
const K_GET: u8 = 18;
const K_GET_DATA: u8 = 19;
const K_GET_CMA: u8 = 20;
const K_ATOMIC: u8 = 21;
const K_ATOMIC_REPLY: u8 = 22;
const K_NOTIFY: u8 = 23;
const K_MAP: u8 = 24;
const K_ACK: u8 = 25;
const K_SYNC: u8 = 26;
/// Size of the fixed part of a get reply: `kind | req | offset`, the bytes follow.
pub const GET_DATA_HEADER: usize = 24;

/// True when the frame kind byte is one of the RMA kinds.
pub fn is_rma_kind(k: u8) -> bool {
    (K_PUT..=K_SYNC).contains(&k)
}

/// Whether a frame's first byte (its kind) says put: lets a receiver's fast path pick puts
/// out before parsing anything.
#[inline]
pub fn is_put_kind(k: u8) -> bool {
    k == K_PUT
}

/// One RMA frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaFrame<'a> {
    /// Write `data` at the target.
    Put {
        /// Initiator's request id (echoed in the ack). Zero: acknowledge only a refusal
        /// (unacknowledged puts; a later [`RmaFrame::Sync`] confirms them).
        req: u64,
        /// Where.
        to: Target,
        /// The bytes.
        data: &'a [u8],
    },
    /// Write `len` bytes the target copies from the initiator's memory at `addr` (same
    /// host: one copy by the target's copy engine).
    PutCma {
        /// Request id.
        req: u64,
        /// Where.
        to: Target,
        /// Bytes.
        len: u64,
        /// Address of the bytes in the initiator.
        addr: u64,
    },
    /// Read `len` bytes; answered by [`RmaFrame::GetData`] frames then an ack.
    Get {
        /// Request id.
        req: u64,
        /// From where.
        from: Target,
        /// Bytes.
        len: u64,
    },
    /// Part of a get's answer: `data` belongs at `offset` of the get's buffer.
    GetData {
        /// The get answered.
        req: u64,
        /// Offset within the get.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// Read `len` bytes, which the target writes into the initiator's memory at `addr`.
    GetCma {
        /// Request id.
        req: u64,
        /// From where.
        from: Target,
        /// Bytes.
        len: u64,
        /// Address of the initiator's buffer.
        addr: u64,
    },
    /// A word-sized atomic on an 8-byte aligned word.
    Atomic {
        /// Request id.
        req: u64,
        /// Which word.
        at: Target,
        /// The operation.
        op: AtomicOp,
        /// Addend, or the expected value.
        a: u64,
        /// The new value (compare-swap).
        b: u64,
    },
    /// The answer to an atomic.
    AtomicReply {
        /// The atomic answered.
        req: u64,
        /// Outcome.
        status: Status,
        /// The word's previous value.
        old: u64,
    },
    /// Doorbell after direct stores through a mapping: fires the write tripwires of the
    /// range as if the bytes had been put.
    Notify {
        /// Request id.
        req: u64,
        /// Start of the range.
        at: Target,
        /// Bytes.
        len: u64,
    },
    /// Asks for the export's memory to map (same host); the file descriptor comes on the
    /// connection's socket, then the ack.
    Map {
        /// Request id.
        req: u64,
        /// The export (offset unused, zero).
        of: Target,
    },
    /// Answered by an ack once every earlier request from this initiator is applied.
    Sync {
        /// Request id.
        req: u64,
    },
    /// Completion of a put, notify, map, get or sync.
    Ack {
        /// The request completed.
        req: u64,
        /// Outcome.
        status: Status,
    },
}

#[inline]
fn target_at(b: &[u8]) -> Target {
    Target {
        export: u32_at(b, 4),
        key: u128_at(b, 16),
        offset: u64_at(b, 32),
    }
}

fn status(b: u8) -> Result<Status, ProtoError> {
    Status::from_u8(b).ok_or(ProtoError::OutOfRange {
        what: "rma status",
        value: u64::from(b),
        limit: Status::Unsupported as u64,
    })
}

impl<'a> RmaFrame<'a> {
    /// Parses an RMA frame (the whole record, kind byte included).
    #[inline]
    pub fn parse(b: &'a [u8]) -> Result<RmaFrame<'a>, ProtoError> {
        need("rma frame", b, 16)?;
        let req = u64_at(b, 8);
        let f = match b[0] {
            K_PUT => {
                need("put frame", b, RMA_HEADER)?;
                RmaFrame::Put {
                    req,
                    to: target_at(b),
                    data: &b[RMA_HEADER..],
                }
            }
            K_PUT_CMA | K_GET_CMA => {
                need("cma rma frame", b, RMA_HEADER + 16)?;
                let (t, len, addr) = (
                    target_at(b),
                    u64_at(b, RMA_HEADER),
                    u64_at(b, RMA_HEADER + 8),
                );
                if b[0] == K_PUT_CMA {
                    RmaFrame::PutCma {
                        req,
                        to: t,
                        len,
                        addr,
                    }
                } else {
                    RmaFrame::GetCma {
                        req,
                        from: t,
                        len,
                        addr,
                    }
                }
            }
            K_GET | K_NOTIFY => {
                need("get/notify frame", b, RMA_HEADER + 8)?;
                let (t, len) = (target_at(b), u64_at(b, RMA_HEADER));
                if b[0] == K_GET {
                    RmaFrame::Get { req, from: t, len }
                } else {
                    RmaFrame::Notify { req, at: t, len }
                }
            }
            K_GET_DATA => {
                need("get data frame", b, GET_DATA_HEADER)?;
                RmaFrame::GetData {
                    req,
                    offset: u64_at(b, 16),
                    data: &b[GET_DATA_HEADER..],
                }
            }
            K_ATOMIC => {
                need("atomic frame", b, RMA_HEADER + 16)?;
                let op = AtomicOp::from_u8(b[1]).ok_or(ProtoError::OutOfRange {
                    what: "atomic op",
                    value: u64::from(b[1]),
                    limit: AtomicOp::CompareSwap as u64,
                })?;
                RmaFrame::Atomic {
                    req,
                    at: target_at(b),
                    op,
                    a: u64_at(b, RMA_HEADER),
                    b: u64_at(b, RMA_HEADER + 8),
                }
            }
            K_ATOMIC_REPLY => {
                need("atomic reply frame", b, 24)?;
                RmaFrame::AtomicReply {
                    req,
                    status: status(b[1])?,
                    old: u64_at(b, 16),
                }
            }
            K_MAP => {
                need("map frame", b, RMA_HEADER)?;
                RmaFrame::Map {
                    req,
                    of: target_at(b),
                }
            }
            K_ACK => RmaFrame::Ack {
                req,
                status: status(b[1])?,
            },
            K_SYNC => RmaFrame::Sync { req },
            k => return Err(ProtoError::BadKind(k)),
        };
        Ok(f)
    }

    /// Bytes [`RmaFrame::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        match self {
            RmaFrame::Put { data, .. } => RMA_HEADER + data.len(),
            RmaFrame::PutCma { .. } | RmaFrame::GetCma { .. } | RmaFrame::Atomic { .. } => {
                RMA_HEADER + 16
            }
            RmaFrame::Get { .. } | RmaFrame::Notify { .. } => RMA_HEADER + 8,
            RmaFrame::GetData { data, .. } => GET_DATA_HEADER + data.len(),
            RmaFrame::AtomicReply { .. } => 24,
            RmaFrame::Map { .. } => RMA_HEADER,
            RmaFrame::Ack { .. } | RmaFrame::Sync { .. } => 16,
        }
    }

    /// Writes the frame into `out` (at least [`RmaFrame::encoded_len`] bytes); returns the
    /// bytes written.
    ///
    /// # Panics
    /// If `out` is too short (a caller bug).
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let n = self.encoded_len();
        let out = &mut out[..n];
        // Byte 0 the kind, 1 the flag, 2..8 zero unless a target follows, 8..16 the
        // request; then a request's target, then the kind's own fields.
        let (kind, flag, req, target) = match *self {
            RmaFrame::Put { req, to, .. } => (K_PUT, 0, req, Some(to)),
            RmaFrame::PutCma { req, to, .. } => (K_PUT_CMA, 0, req, Some(to)),
            RmaFrame::Get { req, from, .. } => (K_GET, 0, req, Some(from)),
            RmaFrame::GetData { req, .. } => (K_GET_DATA, 0, req, None),
            RmaFrame::GetCma { req, from, .. } => (K_GET_CMA, 0, req, Some(from)),
            RmaFrame::Atomic { req, at, op, .. } => (K_ATOMIC, op as u8, req, Some(at)),
            RmaFrame::AtomicReply { req, status, .. } => (K_ATOMIC_REPLY, status as u8, req, None),
            RmaFrame::Notify { req, at, .. } => (K_NOTIFY, 0, req, Some(at)),
            RmaFrame::Map { req, of } => (K_MAP, 0, req, Some(of)),
            RmaFrame::Ack { req, status } => (K_ACK, status as u8, req, None),
            RmaFrame::Sync { req } => (K_SYNC, 0, req, None),
        };
        out[..8].fill(0);
        out[0] = kind;
        out[1] = flag;
        put_u64(out, 8, req);
        if let Some(t) = target {
            put_u32(out, 4, t.export);
            put_u128(out, 16, t.key);
            put_u64(out, 32, t.offset);
        }
        match *self {
            RmaFrame::Put { data, .. } => out[RMA_HEADER..].copy_from_slice(data),
            RmaFrame::PutCma { len, addr, .. } | RmaFrame::GetCma { len, addr, .. } => {
                put_u64(out, RMA_HEADER, len);
                put_u64(out, RMA_HEADER + 8, addr);
            }
            RmaFrame::Get { len, .. } | RmaFrame::Notify { len, .. } => {
                put_u64(out, RMA_HEADER, len);
            }
            RmaFrame::GetData { offset, data, .. } => {
                put_u64(out, 16, offset);
                out[GET_DATA_HEADER..].copy_from_slice(data);
            }
            RmaFrame::Atomic { a, b, .. } => {
                put_u64(out, RMA_HEADER, a);
                put_u64(out, RMA_HEADER + 8, b);
            }
            RmaFrame::AtomicReply { old, .. } => put_u64(out, 16, old),
            RmaFrame::Map { .. } | RmaFrame::Ack { .. } | RmaFrame::Sync { .. } => {}
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            aperture: 3,
            base: 100,
            len: 64,
            rights: READ | WRITE,
            key: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
            revoked: false,
        }
    }

    #[test]
    fn check_orders_key_before_everything() {
        let g = grant();
        assert_eq!(check(Some(&g), g.key, 8, 8, WRITE), Ok(108));
        assert_eq!(check(None, g.key, 0, 1, READ), Err(Status::NoSuchExport));
        assert_eq!(check(Some(&g), g.key ^ 1, 0, 1, READ), Err(Status::BadKey));
        let r = Grant { revoked: true, ..g };
        // A wrong key on a revoked export still says BadKey: revocation is not leaked.
        assert_eq!(check(Some(&r), g.key ^ 1, 0, 1, READ), Err(Status::BadKey));
        assert_eq!(check(Some(&r), g.key, 0, 1, READ), Err(Status::Revoked));
        let ro = Grant { rights: READ, ..g };
        assert_eq!(
            check(Some(&ro), g.key, 0, 1, WRITE),
            Err(Status::NotPermitted)
        );
        assert_eq!(check(Some(&g), g.key, 60, 5, READ), Err(Status::OutOfRange));
        assert_eq!(check(Some(&g), g.key, 64, 0, READ), Ok(164));
        assert_eq!(
            check(Some(&g), g.key, u64::MAX, 2, READ),
            Err(Status::OutOfRange)
        );
    }

    #[test]
    fn cookie_roundtrip_and_refusals() {
        let c = Cookie {
            owner: 77,
            export: 9,
            base: 4096,
            len: 8192,
            rights: READ,
            key: u128::MAX - 5,
        };
        assert_eq!(Cookie::from_bytes(&c.to_bytes()), Ok(c));
        let mut b = c.to_bytes();
        b[40] = 4;
        assert!(Cookie::from_bytes(&b).is_err());
        let mut b = c.to_bytes();
        b[0] ^= 1;
        assert!(matches!(
            Cookie::from_bytes(&b),
            Err(ProtoError::BadMagic(_))
        ));
        assert!(Cookie::from_bytes(&c.to_bytes()[..63]).is_err());
        assert!(!format!("{c:?}").contains(&format!("{}", c.key)));
    }
}
