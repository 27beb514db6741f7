//! The event queue: completions, message arrivals, tripwire firings, peer events and
//! user events posted from other threads.

use crate::*;
use clink_rs::events::{Event, EventSender};
use std::ffi::c_int;

/// Interest in message arrivals no posted receive wanted (`CLINK_EVENT_MESSAGE`).
pub const CLINK_EVENTS_MESSAGES: u32 = 1;
/// Interest in one-sided request completions (`CLINK_EVENT_RMA_DONE`).
pub const CLINK_EVENTS_RMA: u32 = 2;
/// Interest in tripwire firings (`CLINK_EVENT_TRIPWIRE`).
pub const CLINK_EVENTS_TRIPWIRES: u32 = 4;
/// Interest in peers connecting, closing and failing.
pub const CLINK_EVENTS_PEERS: u32 = 8;
/// Interest in completions of non-blocking tagged requests started while it is set
/// (`CLINK_EVENT_SEND_DONE`, `CLINK_EVENT_RECV_DONE`).
pub const CLINK_EVENTS_REQUESTS: u32 = 16;
/// Every source.
pub const CLINK_EVENTS_ALL: u32 = 31;
const _: () = assert!(
    CLINK_EVENTS_MESSAGES == clink_rs::events::MESSAGES
        && CLINK_EVENTS_RMA == clink_rs::events::RMA
        && CLINK_EVENTS_TRIPWIRES == clink_rs::events::TRIPWIRES
        && CLINK_EVENTS_PEERS == clink_rs::events::PEERS
        && CLINK_EVENTS_REQUESTS == clink_rs::events::REQUESTS
        && CLINK_EVENTS_ALL == clink_rs::events::ALL
);

/// What an event is about (the fields of `clink_event_t` it sets are named with each).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum clink_event_kind {
    /// A message from `peer` with `tag` is waiting that no posted receive wanted.
    CLINK_EVENT_MESSAGE = 1,
    /// One-sided request `req` completed (`ok`): take its result with test/wait.
    CLINK_EVENT_RMA_DONE = 2,
    /// Send request `req` completed (`ok`).
    CLINK_EVENT_SEND_DONE = 3,
    /// Receive request `req` completed (`ok`; 0 for a truncated message too).
    CLINK_EVENT_RECV_DONE = 4,
    /// Tripwire `trip` fired on an access of `len` bytes at `offset` (`write` 1 for a
    /// write) by `peer` (`CLINK_PEER_ANY`: this endpoint's own access).
    CLINK_EVENT_TRIPWIRE = 5,
    /// `peer` connected.
    CLINK_EVENT_PEER_CONNECTED = 6,
    /// `peer` said goodbye, or this endpoint closed.
    CLINK_EVENT_PEER_CLOSED = 7,
    /// `peer` died, hung up or broke the protocol.
    CLINK_EVENT_PEER_FAILED = 8,
    /// The queue was full: the next `spilled` events come from the overflow list, and
    /// `lost` were dropped beyond it since the last report.
    CLINK_EVENT_OVERFLOW = 9,
    /// `value` was posted by a `clink_event_sender_t`.
    CLINK_EVENT_USER = 10,
}

/// An event (see `clink_event_kind` for which fields each kind sets; the others are 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clink_event_t {
    /// What happened.
    pub kind: clink_event_kind,
    /// The peer concerned (`CLINK_PEER_ANY` when none).
    pub peer: clink_peer_t,
    /// Tag of a waiting message.
    pub tag: u64,
    /// Request number (`clink_request_id`).
    pub req: u64,
    /// 1 when the request succeeded.
    pub ok: c_int,
    /// 1 for a write access (tripwires).
    pub write: c_int,
    /// The tripwire that fired.
    pub trip: clink_tripwire_t,
    /// Offset of the access within the aperture.
    pub offset: u64,
    /// Length of the access.
    pub len: u64,
    /// Events waiting in the overflow list.
    pub spilled: u64,
    /// Events lost.
    pub lost: u64,
    /// A user event's value.
    pub value: u64,
}

impl From<Event> for clink_event_t {
    fn from(e: Event) -> Self {
        use clink_event_kind::*;
        let mut c = clink_event_t {
            kind: CLINK_EVENT_USER,
            peer: CLINK_PEER_ANY,
            tag: 0,
            req: 0,
            ok: 0,
            write: 0,
            trip: clink_tripwire_t { index: 0, gen: 0 },
            offset: 0,
            len: 0,
            spilled: 0,
            lost: 0,
            value: 0,
        };
        match e {
            Event::Message { peer, tag } => {
                c.kind = CLINK_EVENT_MESSAGE;
                c.peer = peer.0;
                c.tag = tag;
            }
            Event::RmaDone { req, ok } => {
                c.kind = CLINK_EVENT_RMA_DONE;
                c.req = req;
                c.ok = c_int::from(ok);
            }
            Event::SendDone { req, ok } => {
                c.kind = CLINK_EVENT_SEND_DONE;
                c.req = req;
                c.ok = c_int::from(ok);
            }
            Event::RecvDone { req, ok } => {
                c.kind = CLINK_EVENT_RECV_DONE;
                c.req = req;
                c.ok = c_int::from(ok);
            }
            Event::Tripwire {
                id,
                peer,
                offset,
                len,
                write,
            } => {
                c.kind = CLINK_EVENT_TRIPWIRE;
                c.trip = id.into();
                c.peer = peer.map_or(CLINK_PEER_ANY, |p| p.0);
                c.offset = offset;
                c.len = len;
                c.write = c_int::from(write);
            }
            Event::PeerConnected(p) => {
                c.kind = CLINK_EVENT_PEER_CONNECTED;
                c.peer = p.0;
            }
            Event::PeerClosed(p) => {
                c.kind = CLINK_EVENT_PEER_CLOSED;
                c.peer = p.0;
            }
            Event::PeerFailed(p) => {
                c.kind = CLINK_EVENT_PEER_FAILED;
                c.peer = p.0;
            }
            Event::Overflow { spilled, lost } => {
                c.kind = CLINK_EVENT_OVERFLOW;
                c.spilled = spilled;
                c.lost = lost;
            }
            Event::User(v) => {
                c.kind = CLINK_EVENT_USER;
                c.value = v;
            }
        }
        c
    }
}

/// Chooses the event sources queued: a mask of `CLINK_EVENTS_*` (`CLINK_EVENTS_ALL`).
/// Nothing is queued by default.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_set_interest(ep: *mut clink_endpoint_t, mask: u32) -> c_int {
    with_ep("clink_set_interest", ep, |e, _| {
        e.set_interest(mask);
        Ok(OK)
    })
}

/// Takes the next event into `*ev` without a system call when one is queued (otherwise
/// makes progress once and looks again): `CLINK_OK`, or `CLINK_AGAIN` when there is none.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `ev` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_next_event(
    ep: *mut clink_endpoint_t,
    ev: *mut clink_event_t,
) -> c_int {
    with_ep("clink_next_event", ep, |e, _| {
        need_out(ev, "ev")?;
        match e.next_event() {
            Some(x) => {
                ev.write(x.into());
                Ok(OK)
            }
            None => Ok(AGAIN),
        }
    })
}

/// Waits (spin, then block on the endpoint's fd) up to `timeout_ms` (-1 forever) for the
/// next event and stores it in `*ev`; `CLINK_ERR_TIMEOUT` when none came.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `ev` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_wait_event(
    ep: *mut clink_endpoint_t,
    timeout_ms: c_int,
    ev: *mut clink_event_t,
) -> c_int {
    with_ep("clink_wait_event", ep, |e, _| {
        need_out(ev, "ev")?;
        let x = e.wait_event(timeout(timeout_ms))?;
        ev.write(x.into());
        Ok(OK)
    })
}

/// Posts `CLINK_EVENT_USER` events into an endpoint's queue from any thread, waking the
/// endpoint when it sleeps.
pub struct clink_event_sender_t {
    s: EventSender,
}

/// Creates an event sender for the endpoint.
///
/// Ownership: `*out` is freed with `clink_event_sender_free`; it stays valid (posting into
/// a queue nobody reads) after the endpoint is freed. Thread safety: one thread at a time
/// per endpoint for this call.
///
/// # Safety
/// `ep` a live endpoint; `out` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_event_sender_create(
    ep: *mut clink_endpoint_t,
    out: *mut *mut clink_event_sender_t,
) -> c_int {
    with_ep("clink_event_sender_create", ep, |e, _| {
        need_out(out, "out")?;
        let s = e.event_sender();
        out.write(Box::into_raw(Box::new(clink_event_sender_t { s })));
        Ok(OK)
    })
}

/// Posts `value` as a `CLINK_EVENT_USER` event: `CLINK_OK`, or `CLINK_AGAIN` when the queue
/// of posted events is full (nothing was posted: retry later).
///
/// Thread safety: any thread, concurrently with the endpoint's own calls and with other
/// posts through the same sender.
///
/// # Safety
/// `sender` a live event sender.
#[no_mangle]
pub unsafe extern "C" fn clink_event_post(
    sender: *const clink_event_sender_t,
    value: u64,
) -> c_int {
    ffi("clink_event_post", || {
        let s = sender.as_ref().ok_or_else(|| Fail::null("sender"))?;
        Ok(if s.s.post(value) { OK } else { AGAIN })
    })
}

/// Frees an event sender. NULL is ignored.
///
/// # Safety
/// `sender` NULL or a sender not freed yet, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn clink_event_sender_free(sender: *mut clink_event_sender_t) {
    if !sender.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(sender))));
    }
}
