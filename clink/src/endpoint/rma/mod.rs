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

use super::{Endpoint, RecvBuf, SendBuf, FAST_STREAK};
use crate::error::{io_err, Error, Result};
use crate::events::{self, Event, EventSender};
use crate::lease::Dst;
use crate::rma::{ApertureId, Remote, RmaRequest, TripOptions, Tripset, Window};
use crate::sys::{self, Mapping};
use bytes::Bytes;
use clink_proto::idhash::IdMap;
use clink_proto::rma::{
    self, serve, AtomicOp, Cookie, Grant, RmaFrame, Status, Target, READ, WRITE,
};
use clink_proto::tripwire::{self, TripId};
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
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
    /// The aperture's memory as a lease: it stays put while the aperture lives (a memory
    /// file's mapping, or a registered `Vec`'s buffer, never resized), and destroying the
    /// aperture removes its exports and is refused while a receive into it is pending.
    fn lease(&mut self) -> Dst {
        match &mut self.mem {
            ApMem::File { map, .. } => map.lease(),
            ApMem::User(v) => Dst::of_owned(v),
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
    _keep: Option<SendBuf>,
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
#[derive(Clone)]
struct Export {
    grant: Grant,
    /// The aperture's memory ([`LocalAp::lease`]): saves a second table lookup per
    /// access.
    mem: Dst,
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
