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
                put_opt(status, st.into());
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

// ------------------------------------------------------------------ access

/// Writes `len` bytes at `data` at `offset` of a remote window and waits until the owner
/// applied it (`CLINK_ERR_REFUSED` when the owner refused it).
///
/// Thread safety: one thread at a time per endpoint. Ownership: `data` borrowed during
/// the call.
///
/// # Safety
/// `ep` a live endpoint; `remote` a live remote of it; `data` `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_put(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    with_ep("clink_put", ep, |e, h| {
        e.put(remote_of(h, remote)?, offset, bytes(data, len, "data")?)?;
        Ok(OK)
    })
}

/// Puts a small `data` (at most `clink_rma_inline_max` bytes) without waiting and without
/// an acknowledgement: copied into the link at once and applied in order with the other
/// requests to that peer. A refusal shows in the endpoint's diagnostic and statistics;
/// `clink_flush_rma` waits until such puts are applied. Larger data is put blocking.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// As `clink_put`.
#[no_mangle]
pub unsafe extern "C" fn clink_put_nowait(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    with_ep("clink_put_nowait", ep, |e, h| {
        e.put_nowait(remote_of(h, remote)?, offset, bytes(data, len, "data")?)?;
        Ok(OK)
    })
}

/// Starts a put of `len` bytes at `data` (zero-copy: read from `data` by the library) and
/// stores the request in `*req`; complete it with test/wait (an `CLINK_EVENT_RMA_DONE`
/// event reports it when wanted).
///
/// Ownership: `data` stays lent until the request completes; `*req` is freed with
/// `clink_request_free`. Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// As `clink_put`, `data` valid until completion; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn clink_iput(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    data: *const c_void,
    len: usize,
    req: *mut *mut clink_request_t,
) -> c_int {
    with_ep("clink_iput", ep, |e, h| {
        need_out(req, "req")?;
        let r = remote_of(h, remote)?;
        let q = e.iput(r, offset, lent_bytes(data, len)?)?;
        req.write(clink_request_t::new_rma(h, q, std::ptr::null_mut(), 0));
        Ok(OK)
    })
}

/// Reads `len` bytes at `offset` of a remote window into `buf` (waits for them).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `remote` a live remote of it; `buf` `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_get(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    with_ep("clink_get", ep, |e, h| {
        e.get(remote_of(h, remote)?, offset, bytes_mut(buf, len, "buf")?)?;
        Ok(OK)
    })
}

/// Starts a get of `len` bytes at `offset` of a remote window into `buf` and stores the
/// request in `*req`. The Rust API returns a get's bytes in a buffer of its own when the
/// request completes: they are copied into `buf` then (status `len` = bytes got).
///
/// Ownership: `buf` is written at completion (keep it valid until then); `*req` is freed
/// with `clink_request_free`. Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// As `clink_get`, `buf` valid until completion; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn clink_iget(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    buf: *mut c_void,
    len: usize,
    req: *mut *mut clink_request_t,
) -> c_int {
    with_ep("clink_iget", ep, |e, h| {
        need_out(req, "req")?;
        if len != 0 && buf.is_null() {
            return Err(Fail::null("buf"));
        }
        let r = remote_of(h, remote)?;
        let q = e.iget(r, offset, len)?;
        req.write(clink_request_t::new_rma(h, q, buf.cast(), len));
        Ok(OK)
    })
}

/// Atomically adds `v` to the aligned 64-bit word at `offset` of a remote window; its
/// previous value goes to `*old` (may be NULL).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `remote` a live remote of it; `old` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_fetch_add(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    v: u64,
    old: *mut u64,
) -> c_int {
    with_ep("clink_fetch_add", ep, |e, h| {
        let prev = e.fetch_add(remote_of(h, remote)?, offset, v)?;
        put_opt(old, prev);
        Ok(OK)
    })
}

/// Atomically replaces the aligned 64-bit word at `offset` of a remote window by `desired`
/// if it equals `expected`; its previous value goes to `*old` (equal to `expected` when
/// swapped; may be NULL).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// As `clink_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn clink_compare_swap(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    expected: u64,
    desired: u64,
    old: *mut u64,
) -> c_int {
    with_ep("clink_compare_swap", ep, |e, h| {
        let prev = e.compare_swap(remote_of(h, remote)?, offset, expected, desired)?;
        put_opt(old, prev);
        Ok(OK)
    })
}

/// Doorbell for direct stores through a mapped window: fires the owner's write tripwires
/// on `offset..offset+len` as a put there would, ordered after every earlier request to
/// that peer and the stores made before it. Waits for the acknowledgement.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `remote` a live remote of it.
#[no_mangle]
pub unsafe extern "C" fn clink_notify(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    len: u64,
) -> c_int {
    with_ep("clink_notify", ep, |e, h| {
        e.notify(remote_of(h, remote)?, offset, len)?;
        Ok(OK)
    })
}

/// As `clink_notify`, without waiting for the acknowledgement.
///
/// # Safety
/// As `clink_notify`.
#[no_mangle]
pub unsafe extern "C" fn clink_notify_nowait(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    offset: u64,
    len: u64,
) -> c_int {
    with_ep("clink_notify_nowait", ep, |e, h| {
        e.notify_nowait(remote_of(h, remote)?, offset, len)?;
        Ok(OK)
    })
}

/// Stores in `*max` the largest put towards `peer` carried inline in one frame.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `max` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_rma_inline_max(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    max: *mut usize,
) -> c_int {
    with_ep("clink_rma_inline_max", ep, |e, _| {
        need_out(max, "max")?;
        max.write(e.rma_inline_max(PeerId(peer))?);
        Ok(OK)
    })
}

/// Waits until every one-sided request issued so far to `peer` (`CLINK_PEER_ANY`: to
/// every peer) is complete at its target: puts applied, gets delivered.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_flush_rma(ep: *mut clink_endpoint_t, peer: clink_peer_t) -> c_int {
    with_ep("clink_flush_rma", ep, |e, _| {
        e.flush_rma(peer_opt(peer))?;
        Ok(OK)
    })
}

/// Orders what follows after what preceded towards `peer` (matters for direct stores
/// through a mapped window, which bypass the request queue): waits until the earlier
/// requests are applied.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_fence(ep: *mut clink_endpoint_t, peer: clink_peer_t) -> c_int {
    with_ep("clink_fence", ep, |e, _| {
        e.fence(PeerId(peer))?;
        Ok(OK)
    })
}

/// Maps a same-host peer's window into this process (the owner checks the cookie and
/// sends its memory file, read-only unless the cookie grants writes). Other transports:
/// `CLINK_ERR_REFUSED` (not possible over them).
///
/// Ownership: `*win` is freed with `clink_window_free`. Thread safety: one thread at a time
/// per endpoint for this call; the window may be used from any thread.
///
/// # Safety
/// `ep` a live endpoint; `remote` a live remote of it; `win` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_map(
    ep: *mut clink_endpoint_t,
    remote: *const clink_remote_t,
    win: *mut *mut clink_window_t,
) -> c_int {
    with_ep("clink_map", ep, |e, h| {
        need_out(win, "win")?;
        let w = e.map(remote_of(h, remote)?)?;
        win.write(Box::into_raw(Box::new(clink_window_t { w })));
        Ok(OK)
    })
}

// ------------------------------------------------------------------ windows

/// Frees a window (unmaps its memory once no other window shares the mapping). NULL is
/// ignored.
///
/// # Safety
/// `win` NULL or a window not freed yet.
#[no_mangle]
pub unsafe extern "C" fn clink_window_free(win: *mut clink_window_t) {
    if !win.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(win))));
    }
}

/// Base address of a window (NULL for NULL), for code that manages its own accesses: the
/// memory is shared with other processes, so use atomics or volatile accesses, and stay
/// within `clink_window_len` bytes (writes only when `clink_window_writable`).
///
/// Ownership: valid while the window lives. Thread safety: any thread.
///
/// # Safety
/// `win` NULL or a live window.
#[no_mangle]
pub unsafe extern "C" fn clink_window_ptr(win: *const clink_window_t) -> *mut c_void {
    win.as_ref()
        .map_or(std::ptr::null_mut(), |w| w.w.as_ptr().cast())
}

/// Length of a window in bytes (0 for NULL).
///
/// # Safety
/// `win` NULL or a live window.
#[no_mangle]
pub unsafe extern "C" fn clink_window_len(win: *const clink_window_t) -> u64 {
    win.as_ref().map_or(0, |w| w.w.len())
}

/// 1 when stores are allowed through the window (the cookie granted writes), else 0.
///
/// # Safety
/// `win` NULL or a live window.
#[no_mangle]
pub unsafe extern "C" fn clink_window_writable(win: *const clink_window_t) -> c_int {
    win.as_ref().map_or(0, |w| c_int::from(w.w.writable()))
}

/// Copies `len` bytes at `data` into the window at `offset` (plain stores, then a release
/// fence). Bounds and rights are checked (`CLINK_ERR_REFUSED` or `CLINK_ERR_INVALID`).
/// The owner does not see such stores: ring its tripwires with `clink_notify`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `win` a live window; `data` `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_window_write(
    win: *const clink_window_t,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    ffi("clink_window_write", || {
        window(win)?.write(offset, bytes(data, len, "data")?)?;
        Ok(OK)
    })
}

/// Copies `len` bytes of the window at `offset` into `buf` (after an acquire fence).
///
/// Thread safety: any thread.
///
/// # Safety
/// `win` a live window; `buf` `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_window_read(
    win: *const clink_window_t,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    ffi("clink_window_read", || {
        window(win)?.read(offset, bytes_mut(buf, len, "buf")?)?;
        Ok(OK)
    })
}

/// Stores an aligned 64-bit word with release ordering.
///
/// Thread safety: any thread.
///
/// # Safety
/// `win` a live window.
#[no_mangle]
pub unsafe extern "C" fn clink_window_store_u64(
    win: *const clink_window_t,
    offset: u64,
    v: u64,
) -> c_int {
    ffi("clink_window_store_u64", || {
        window(win)?.store_u64(offset, v)?;
        Ok(OK)
    })
}

/// Loads an aligned 64-bit word with acquire ordering into `*v`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `win` a live window; `v` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_window_load_u64(
    win: *const clink_window_t,
    offset: u64,
    v: *mut u64,
) -> c_int {
    ffi("clink_window_load_u64", || {
        need_out(v, "v")?;
        v.write(window(win)?.load_u64(offset)?);
        Ok(OK)
    })
}

/// Atomic fetch-add on an aligned 64-bit word of the window (coherent with the owner's
/// and other mappers' atomics on this host); the previous value goes to `*old` (may be
/// NULL).
///
/// Thread safety: any thread.
///
/// # Safety
/// `win` a live window; `old` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_window_fetch_add_u64(
    win: *const clink_window_t,
    offset: u64,
    v: u64,
    old: *mut u64,
) -> c_int {
    ffi("clink_window_fetch_add_u64", || {
        put_opt(old, window(win)?.fetch_add_u64(offset, v)?);
        Ok(OK)
    })
}

/// Atomic compare-and-swap on an aligned 64-bit word of the window; the previous value
/// goes to `*old` (may be NULL).
///
/// Thread safety: any thread.
///
/// # Safety
/// `win` a live window; `old` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_window_compare_swap_u64(
    win: *const clink_window_t,
    offset: u64,
    expected: u64,
    desired: u64,
    old: *mut u64,
) -> c_int {
    ffi("clink_window_compare_swap_u64", || {
        put_opt(
            old,
            window(win)?.compare_swap_u64(offset, expected, desired)?,
        );
        Ok(OK)
    })
}

// ------------------------------------------------------------------ tripwires

/// Arms a tripwire on `offset..offset+len` of an own aperture with `opts` (NULL: the
/// defaults, `clink_trip_options_default`) and stores it in `*trip`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `opts` NULL or readable; `trip` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    offset: u64,
    len: u64,
    opts: *const clink_trip_options_t,
    trip: *mut clink_tripwire_t,
) -> c_int {
    with_ep("clink_tripwire", ep, |e, _| {
        need_out(trip, "trip")?;
        let o = opts
            .as_ref()
            .map_or(TripOptions::default(), |o| TripOptions {
                reads: o.reads != 0,
                writes: o.writes != 0,
                once: o.once != 0,
                event: o.event != 0,
            });
        let t = e.tripwire(ApertureId(ap.id), offset, len, o)?;
        trip.write(t.into());
        Ok(OK)
    })
}

/// Disarms a tripwire: `*removed` (may be NULL) = 1, or 0 when it was not armed (stale id,
/// or a once-only one that fired).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `removed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire_remove(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
    removed: *mut c_int,
) -> c_int {
    with_ep("clink_tripwire_remove", ep, |e, _| {
        put_opt(removed, c_int::from(e.tripwire_remove(trip.into())));
        Ok(OK)
    })
}

/// Reads a tripwire: `*fired` (may be NULL) = 1 when it fired since armed or last cleared
/// (a bit read, no progress made: call `clink_progress` to apply what peers sent), and
/// `*count` (may be NULL) how many times it fired since armed.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `fired`, `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire_state(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
    fired: *mut c_int,
    count: *mut u64,
) -> c_int {
    with_ep("clink_tripwire_state", ep, |e, _| {
        put_opt(fired, c_int::from(e.tripwire_fired(trip.into())));
        put_opt(count, e.tripwire_count(trip.into()));
        Ok(OK)
    })
}

/// Clears the fired bit of a tripwire.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire_clear(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
) -> c_int {
    with_ep("clink_tripwire_clear", ep, |e, _| {
        e.tripwire_clear(trip.into());
        Ok(OK)
    })
}

/// Waits (spinning, then blocking) up to `timeout_ms` (-1 forever) until a tripwire fires,
/// and clears its bit (a bit already set counts).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_wait_tripwire(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
    timeout_ms: c_int,
) -> c_int {
    with_ep("clink_wait_tripwire", ep, |e, _| {
        e.wait_tripwire(trip.into(), timeout(timeout_ms))?;
        Ok(OK)
    })
}

/// Waits up to `timeout_ms` (-1 forever) until one of the `n` tripwires of `trips` fires;
/// stores it in `*fired` (may be NULL) with its bit cleared.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `trips` `n` readable entries; `fired` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_wait_tripset(
    ep: *mut clink_endpoint_t,
    trips: *const clink_tripwire_t,
    n: usize,
    timeout_ms: c_int,
    fired: *mut clink_tripwire_t,
) -> c_int {
    with_ep("clink_wait_tripset", ep, |e, _| {
        if n == 0 {
            return Err(Fail::invalid("empty tripwire set"));
        }
        if trips.is_null() {
            return Err(Fail::null("trips"));
        }
        let mut set = Tripset::new();
        for &t in std::slice::from_raw_parts(trips, n) {
            set.add(t.into());
        }
        let t = e.wait_tripset(&set, timeout(timeout_ms))?;
        put_opt(fired, t.into());
        Ok(OK)
    })
}
