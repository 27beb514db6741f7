//! Apertures, one-sided access, tripwires and the event queue on the endpoint.
//!
//! Initiator side: every access is a frame on the peer's link (put data inline; large puts
//! and gets on the same host by the target's copy engine with one CMA copy), answered by an
//! ack, get data or an atomic reply. Target side: the progress engine checks each request
//! against its export table ([`clink_proto::rma::check`]), applies it, fires the matching
//! tripwires, and answers. Requests from one peer are applied in the order sent (PRAM):
//! while a large copy is in the engine, that peer's later requests wait behind it.

mod apertures;
mod ops;
mod target;
mod trips;

use super::{Endpoint, RecvBuf, SendData, TxItem, FAST_STREAK};
use crate::error::{io_err, Error, Result};
use crate::events::{self, Event, EventSender};
use crate::rma::{ApertureId, Remote, RmaRequest, TripOptions, Tripset, Window};
use crate::sys::{self, Mapping};
use bytes::Bytes;
use clink_proto::idhash::IdMap;
use clink_proto::rma::{self, AtomicOp, Cookie, Grant, RmaFrame, Status, Target, READ, WRITE};
use clink_proto::tripwire::{self, TripId};
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// No tripwire taken ([`Endpoint::fire_first`]).
const NO_TRIP: u64 = u64::MAX;

enum ApMem {
    /// clink's memory file, mappable by same-host peers.
    File { fd: OwnedFd, map: Arc<Mapping> },
    /// A user buffer handed over; given back by `aperture_destroy`.
    User(Vec<u8>),
}

struct LocalAp {
    mem: ApMem,
    len: u64,
}

impl LocalAp {
    fn ptr(&mut self) -> *mut u8 {
        match &mut self.mem {
            ApMem::File { map, .. } => map.ptr(),
            ApMem::User(v) => v.as_mut_ptr(),
        }
    }
}

enum OpKind {
    Put,
    Get { buf: RecvBuf },
    Atomic { old: u64 },
    Notify,
    Map { fd: Option<OwnedFd> },
}

/// An initiator's outstanding one-sided request.
struct RmaOp {
    peer: PeerId,
    /// Answers still expected (a put cut into frames gets one ack per frame).
    parts: u32,
    /// First refusal seen.
    status: Status,
    kind: OpKind,
    /// Keeps a put's bytes alive until the target has them.
    _keep: Option<SendData>,
    reap: Reap,
    /// The peer died before answering.
    dead: bool,
}

/// Who takes an op's result.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reap {
    /// A blocking call waiting for it.
    Caller,
    /// A non-blocking request: `wait_rma`/`test_rma`, with an RmaDone event.
    Request,
    /// Nobody: removed when complete (a refusal is kept in `last_error`).
    Detached,
}

impl RmaOp {
    fn done(&self) -> bool {
        self.parts == 0
    }
}

/// A peer's copy-engine queue (see [`clink_proto::rma::Engine`]): a large copy, then
/// the requests waiting behind it as received.
pub(super) type EngineQueue = rma::Engine<Vec<u8>>;

#[derive(Clone, Copy, Default)]
struct TripMeta {
    /// Generation of the tripwire in this slot: an old id of a reused slot reads nothing.
    gen: u32,
    count: u64,
    event: bool,
}

/// The endpoint's aperture, export, tripwire and one-sided request state.
#[derive(Default)]
pub(super) struct RmaState {
    aps: IdMap<u32, LocalAp>,
    next_ap: u32,
    exports: IdMap<u32, Export>,
    next_export: u32,
    trips: tripwire::Matcher,
    meta: Vec<TripMeta>,
    /// Fired bits by tripwire index: read without a system call.
    bits: Vec<u64>,
    ops: IdMap<u64, RmaOp>,
    /// Non-blocking receives into apertures whose tripwires have not fired yet.
    aperture_recvs: Vec<ApertureRecv>,
}

/// A receive posted by [`Endpoint::irecv_into_aperture`].
struct ApertureRecv {
    req: u64,
    ap: u32,
    offset: u64,
    len: u64,
    /// The selector's source (a truncation error names no sender).
    src: Option<PeerId>,
}

impl RmaState {
    /// True while a receive into an aperture may still have tripwires to fire.
    pub(super) fn has_aperture_recvs(&self) -> bool {
        !self.aperture_recvs.is_empty()
    }
}

/// Where a receive of at most `len` bytes into an aperture wrote, by its result: the
/// sender and the bytes that landed (a truncated message fills the range).
fn landed(
    res: &Result<super::Status>,
    src: Option<PeerId>,
    len: u64,
) -> Option<(Option<PeerId>, u64)> {
    match res {
        Ok(st) => Some((Some(st.peer), st.len.min(len))),
        Err(Error::Truncated { .. }) => Some((src, len)),
        Err(_) => None,
    }
    .filter(|&(_, n)| n > 0)
}

/// An export as its owner keeps it.
#[derive(Clone, Copy)]
struct Export {
    grant: Grant,
    /// The aperture's first byte: it stays put while the aperture lives (a memory file's
    /// mapping, or a registered `Vec`'s buffer, never resized), and destroying the
    /// aperture removes its exports. Saves a second table lookup per access.
    mem: *mut u8,
}

// SAFETY: `mem` points into an aperture owned by the same endpoint; the export moves
// between threads only with the endpoint that owns both.
unsafe impl Send for Export {}

/// What a target needs to apply one request.
struct Applied {
    ap: u32,
    at: u64,
    /// The first byte accessed (`at` bytes into the aperture).
    ptr: *mut u8,
    /// The export's rights.
    rights: u8,
}

impl Endpoint {
    // ------------------------------------------------------------ apertures

    // ------------------------------------------------------------ one-sided access

    // ------------------------------------------------------------ tripwires

    // ------------------------------------------------------------ event queue

    // ------------------------------------------------------------ target side
}

fn no_aperture(ap: ApertureId) -> Error {
    Error::Invalid(format!("no aperture {} on this endpoint", ap.0))
}

fn bad(peer: PeerId, what: &'static str, value: u64) -> Error {
    Error::Proto {
        peer,
        source: clink_proto::ProtoError::OutOfRange {
            what,
            value,
            limit: 0,
        },
    }
}

/// `bytes` as a put frame, or `None` for any other frame (left to the general path,
/// which also reports malformed ones).
fn rma_put(bytes: &[u8]) -> Option<RmaFrame<'_>> {
    if !rma::is_put_kind(*bytes.first()?) {
        return None;
    }
    RmaFrame::parse(bytes).ok()
}

/// Copies `len` bytes between distinct buffers; 8 to 16 of them as two (overlapping)
/// unaligned words rather than a call into the C library: one-word puts are the latency
/// path.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`].
unsafe fn copy_short(src: *const u8, dst: *mut u8, len: usize) {
    if (8..=16).contains(&len) {
        // SAFETY: both words lie within the `len` bytes the caller vouches for.
        unsafe {
            let (a, b) = (
                src.cast::<u64>().read_unaligned(),
                src.add(len - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

#[cfg(test)]
mod tests {
    use super::copy_short;

    /// Every length up to 40 (both branches and their edges) copies exactly its bytes and
    /// nothing around them.
    #[test]
    fn copy_short_copies_exactly_len_bytes() {
        let src: Vec<u8> = (1..=64).collect();
        for len in 0..=40usize {
            let mut dst = vec![0u8; 64];
            // SAFETY: both buffers hold at least 3 + len bytes and do not overlap.
            unsafe { copy_short(src.as_ptr().add(3), dst.as_mut_ptr().add(5), len) };
            let mut want = vec![0u8; 64];
            want[5..5 + len].copy_from_slice(&src[3..3 + len]);
            assert_eq!(dst, want, "len {len}");
        }
    }
}
