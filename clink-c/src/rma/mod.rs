//! One-sided access (CLAN): apertures, cookies, remote windows, put/get/atomics, mapped
//! windows, tripwires.

use crate::tagged::lent_bytes;
use crate::*;
use clink_rs::rma::{ApertureId, Cookie, Remote, TripId, TripOptions, Tripset, Window};
use std::ffi::{c_int, c_void};

/// Length of an export cookie in bytes.
pub const CLINK_COOKIE_LEN: usize = 64;
const _: () = assert!(CLINK_COOKIE_LEN == clink_rs::rma::COOKIE_LEN);

/// Export right: peers may read (get).
pub const CLINK_READ: u8 = 1;
/// Export right: peers may write (put, atomics, notify).
pub const CLINK_WRITE: u8 = 2;
const _: () = assert!(CLINK_READ == clink_rs::rma::READ && CLINK_WRITE == clink_rs::rma::WRITE);

/// An aperture of an endpoint (memory peers may access): a value naming it, valid until
/// `clink_aperture_destroy` or the endpoint is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clink_aperture_t {
    /// The aperture's number within its endpoint.
    pub id: u32,
}

/// An export cookie: the capability to access a window of an aperture. Plain bytes: send
/// it in any message (`sizeof(clink_cookie_t)` bytes) and `clink_import` it on the other
/// side.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clink_cookie_t {
    /// The encoded cookie.
    pub bytes: [u8; CLINK_COOKIE_LEN],
}

/// A tripwire: a value naming a watch on a range of an aperture.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct clink_tripwire_t {
    /// Slot of the tripwire.
    pub index: u32,
    /// Generation of the slot (a removed tripwire's id goes stale).
    pub gen: u32,
}

impl From<TripId> for clink_tripwire_t {
    fn from(t: TripId) -> Self {
        clink_tripwire_t {
            index: t.index,
            gen: t.gen,
        }
    }
}

impl From<clink_tripwire_t> for TripId {
    fn from(t: clink_tripwire_t) -> Self {
        TripId {
            index: t.index,
            gen: t.gen,
        }
    }
}

/// Options of a tripwire (booleans as 0/1).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clink_trip_options_t {
    /// Fire on reads (get).
    pub reads: c_int,
    /// Fire on writes (put, atomics, notify, messages received into the aperture).
    pub writes: c_int,
    /// Disarm after firing once.
    pub once: c_int,
    /// Queue a `CLINK_EVENT_TRIPWIRE` event (when the interest includes
    /// `CLINK_EVENTS_TRIPWIRES`) besides setting the bit and counting.
    pub event: c_int,
}

/// The default tripwire options: writes, re-arming, with events.
///
/// Thread safety: any thread (pure function).
#[no_mangle]
pub extern "C" fn clink_trip_options_default() -> clink_trip_options_t {
    let d = TripOptions::default();
    clink_trip_options_t {
        reads: c_int::from(d.reads),
        writes: c_int::from(d.writes),
        once: c_int::from(d.once),
        event: c_int::from(d.event),
    }
}

/// An imported cookie (`clink_import`): a window of a peer's aperture this endpoint may
/// access with put, get, atomics, notify and map.
pub struct clink_remote_t {
    owner: usize,
    r: Remote,
}

/// A window of aperture memory mapped into this process (`clink_map` of a same-host peer's
/// window, or `clink_aperture_window` of an own aperture): loads and stores without system
/// calls. It keeps the memory mapped while it lives, whatever happens to the endpoints.
pub struct clink_window_t {
    w: Window,
}

unsafe fn remote_of<'a>(h: &clink_endpoint_t, r: *const clink_remote_t) -> R<&'a Remote> {
    let r = r.as_ref().ok_or_else(|| Fail::null("remote"))?;
    if r.owner != h.key() {
        return Err(Fail::invalid("the remote was imported by another endpoint"));
    }
    Ok(&r.r)
}

unsafe fn window<'a>(w: *const clink_window_t) -> R<&'a Window> {
    w.as_ref().map(|w| &w.w).ok_or_else(|| Fail::null("window"))
}

// ------------------------------------------------------------------ apertures

/// Allocates a zeroed aperture of `len` bytes in a memory file (mappable by same-host
/// peers through `clink_map`) and stores it in `*ap`.
///
/// Ownership: the memory belongs to the endpoint until `clink_aperture_destroy` or
/// `clink_endpoint_free`; reach it directly through `clink_aperture_window`.
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `ap` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_alloc(
    ep: *mut clink_endpoint_t,
    len: usize,
    ap: *mut clink_aperture_t,
) -> c_int {
    with_ep("clink_aperture_alloc", ep, |e, _| {
        need_out(ap, "ap")?;
        let a = e.aperture_alloc(len)?;
        ap.write(clink_aperture_t { id: a.0 });
        Ok(OK)
    })
}

/// Makes an aperture of heap memory holding a copy of the `len` bytes at `data` (peers
/// put and get it; they cannot map it). The Rust API takes ownership of a heap buffer, and
/// C memory cannot be handed over, so the bytes are copied in; read them back with
/// `clink_aperture_read`.
///
/// Thread safety: one thread at a time per endpoint. Ownership: `data` is only read during
/// the call.
///
/// # Safety
/// `ep` a live endpoint; `data` `len` readable bytes (NULL when `len` is 0); `ap` writable.
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_register(
    ep: *mut clink_endpoint_t,
    data: *const c_void,
    len: usize,
    ap: *mut clink_aperture_t,
) -> c_int {
    with_ep("clink_aperture_register", ep, |e, _| {
        need_out(ap, "ap")?;
        let v = bytes(data, len, "data")?.to_vec();
        let a = e.aperture_register(v)?;
        ap.write(clink_aperture_t { id: a.0 });
        Ok(OK)
    })
}

/// Destroys an aperture: its exports become unknown (later accesses are refused), its
/// tripwires are removed. Peers that mapped it keep a mapping nobody reads. Refused while a
/// receive into it is pending.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_destroy(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
) -> c_int {
    with_ep("clink_aperture_destroy", ep, |e, _| {
        e.aperture_destroy(ApertureId(ap.id))?;
        Ok(OK)
    })
}

/// Stores the length of an aperture in `*len`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `len` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_len(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    len: *mut u64,
) -> c_int {
    with_ep("clink_aperture_len", ep, |e, _| {
        need_out(len, "len")?;
        len.write(e.aperture_len(ApertureId(ap.id))?);
        Ok(OK)
    })
}

/// A window on an own aperture (allocated ones only) for direct loads and stores by the
/// owner, e.g. polling a flag a peer writes, or reading a message received into it.
///
/// Ownership: `*win` is freed with `clink_window_free`. Thread safety: one thread at a time
/// per endpoint for this call; the window itself may be used from any thread.
///
/// # Safety
/// `ep` a live endpoint; `win` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_window(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    win: *mut *mut clink_window_t,
) -> c_int {
    with_ep("clink_aperture_window", ep, |e, _| {
        need_out(win, "win")?;
        let w = e.aperture_window(ApertureId(ap.id))?;
        win.write(Box::into_raw(Box::new(clink_window_t { w })));
        Ok(OK)
    })
}

/// Writes `len` bytes at `data` into an own aperture at `offset`, firing its write
/// tripwires (an access made through clink).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `data` `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_write(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    with_ep("clink_aperture_write", ep, |e, _| {
        e.aperture_write(ApertureId(ap.id), offset, bytes(data, len, "data")?)?;
        Ok(OK)
    })
}

/// Reads `len` bytes of an own aperture at `offset` into `buf`, firing its read tripwires.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `buf` `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_aperture_read(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    with_ep("clink_aperture_read", ep, |e, _| {
        e.aperture_read(ApertureId(ap.id), offset, bytes_mut(buf, len, "buf")?)?;
        Ok(OK)
    })
}

/// Receives a message matching `sel` straight into `offset..offset+len` of an own
/// aperture (zero copies beyond the transport's), waiting up to `timeout_ms`, and fires
/// the write tripwires over the bytes that landed. Status and truncation as `clink_recv`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `status` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_recv_into_aperture(
    ep: *mut clink_endpoint_t,
    sel: clink_selector_t,
    ap: clink_aperture_t,
    offset: u64,
    len: u64,
    timeout_ms: c_int,
    status: *mut clink_status_t,
) -> c_int {
    with_ep("clink_recv_into_aperture", ep, |e, _| {
        let s = sel.to_rust();
        match e.recv_into_aperture(s, ApertureId(ap.id), offset, len, timeout(timeout_ms)) {
            Ok(st) => {
                put_status(status, st);
                Ok(OK)
            }
            Err(err @ clink_rs::Error::Truncated { len, .. }) => {
                put_opt(
                    status,
                    clink_status_t {
                        peer: s.src.map_or(CLINK_PEER_ANY, |p| p.0),
                        tag: if s.mask == u64::MAX { s.tag } else { 0 },
                        len,
                    },
                );
                Err(err.into())
            }
            Err(err) => Err(err.into()),
        }
    })
}

// ------------------------------------------------------------------ cookies

/// Exports the window `offset..offset+len` of an aperture with `rights` (`CLINK_READ` |
/// `CLINK_WRITE`) and stores the cookie to send to peers in `*cookie`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `cookie` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_export(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    offset: u64,
    len: u64,
    rights: u8,
    cookie: *mut clink_cookie_t,
) -> c_int {
    with_ep("clink_export", ep, |e, _| {
        need_out(cookie, "cookie")?;
        let c = e.export(ApertureId(ap.id), offset, len, rights)?;
        cookie.write(clink_cookie_t {
            bytes: c.to_bytes(),
        });
        Ok(OK)
    })
}

fn decode(c: &clink_cookie_t) -> R<Cookie> {
    Cookie::from_bytes(&c.bytes).map_err(|e| Fail::invalid(format!("bad cookie: {e}")))
}

/// Revokes an export: every later access with the cookie is refused
/// (`CLINK_ERR_REFUSED`). Mappings already made stay.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `cookie` readable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_revoke(
    ep: *mut clink_endpoint_t,
    cookie: *const clink_cookie_t,
) -> c_int {
    with_ep("clink_revoke", ep, |e, _| {
        let c = cookie.as_ref().ok_or_else(|| Fail::null("cookie"))?;
        e.revoke(&decode(c)?)?;
        Ok(OK)
    })
}

/// Decodes a cookie: the length of its window and its rights (either pointer may be NULL).
/// `CLINK_ERR_INVALID` for bytes that are not a cookie.
///
/// Thread safety: any thread.
///
/// # Safety
/// `cookie` readable (NULL refused); `len`, `rights` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_cookie_info(
    cookie: *const clink_cookie_t,
    len: *mut u64,
    rights: *mut u8,
) -> c_int {
    ffi("clink_cookie_info", || {
        let c = decode(cookie.as_ref().ok_or_else(|| Fail::null("cookie"))?)?;
        put_opt(len, c.len);
        put_opt(rights, c.rights);
        Ok(OK)
    })
}

/// Turns a cookie received from `peer` (its owner) into a remote window handle. Only checks
/// that the cookie names that peer; the owner checks everything else on access.
///
/// Ownership: `*remote` is freed with `clink_remote_free` and used only with this
/// endpoint. Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `cookie` readable; `remote` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_import(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    cookie: *const clink_cookie_t,
    remote: *mut *mut clink_remote_t,
) -> c_int {
    with_ep("clink_import", ep, |e, h| {
        let c = cookie.as_ref().ok_or_else(|| Fail::null("cookie"))?;
        need_out(remote, "remote")?;
        let r = e.import(PeerId(peer), decode(c)?)?;
        remote.write(Box::into_raw(Box::new(clink_remote_t {
            owner: h.key(),
            r,
        })));
        Ok(OK)
    })
}

/// Length of a remote window in bytes (0 for NULL).
///
/// Thread safety: any thread.
///
/// # Safety
/// `remote` NULL or a live remote.
#[no_mangle]
pub unsafe extern "C" fn clink_remote_len(remote: *const clink_remote_t) -> u64 {
    remote.as_ref().map_or(0, |r| r.r.len())
}

/// Frees a remote handle (nothing is sent). NULL is ignored.
///
/// # Safety
/// `remote` NULL or a remote not freed yet.
#[no_mangle]
pub unsafe extern "C" fn clink_remote_free(remote: *mut clink_remote_t) {
    if !remote.is_null() {
        drop(Box::from_raw(remote));
    }
}

mod access;
mod tripwires;
mod windows;

pub use access::*;
pub use tripwires::*;
pub use windows::*;
