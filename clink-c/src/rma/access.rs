//! One-sided access to a peer's aperture: put, get, atomics, notify, and their
//! non-blocking forms, ordering (flush, fence), mapping a same-host aperture (`clink_map`).

use super::*;

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
