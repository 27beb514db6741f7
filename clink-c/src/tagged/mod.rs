//! Tagged messages: blocking and non-blocking sends and receives, requests, in-place
//! receives and claimed send slots.

use crate::*;
use bytes::Bytes;
use clink_rs::rma::{ApertureId, RmaRequest};
use clink_rs::{Error, InPlace, Received, RecvRequest, SendRequest, SendSlot};
use std::ffi::{c_int, c_void};

/// Caller memory lent to a non-blocking send or put until it completes (the zero-copy
/// contract of `clink_isend` and `clink_iput`).
struct Lent {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the caller guarantees the memory stays valid and unchanged until the request
// completes; the endpoint only reads it.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: see `Send` above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Caller memory as `Bytes` without a copy (see [`Lent`]).
pub(crate) unsafe fn lent_bytes(p: *const c_void, len: usize) -> R<Bytes> {
    if len != 0 && p.is_null() {
        return Err(Fail::null("buf"));
    }
    Ok(Bytes::from_owner(Lent { ptr: p.cast(), len }))
}

/// The status of a truncated receive: its full length, and the selector's peer and tag
/// when it names them exactly (the Rust API does not report them with the error).
fn truncated_status(sel: Selector, len: u64) -> clink_status_t {
    clink_status_t {
        peer: sel.src.map_or(CLINK_PEER_ANY, |p| p.0),
        tag: if sel.mask == u64::MAX { sel.tag } else { 0 },
        len,
    }
}

/// Sends `len` bytes at `buf` to `peer` with `tag` and returns once the message is out of
/// `buf` (copied into the peer's ring, or read by the peer for large messages: one copy by
/// CMA on the same host; over UDP, also until the connection holds nothing back for its
/// window). Waits as long as it takes, bounded by the peer's liveness.
///
/// Thread safety: one thread at a time per endpoint. Ownership: `buf` is only borrowed
/// during the call.
///
/// # Safety
/// `ep` a live endpoint; `buf` `len` readable bytes (NULL allowed when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn clink_send(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    tag: u64,
    buf: *const c_void,
    len: usize,
) -> c_int {
    with_ep("clink_send", ep, |e, _| {
        let data = bytes(buf, len, "buf")?;
        e.send(PeerId(peer), tag, data)?;
        Ok(OK)
    })
}

/// One buffer of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clink_iov_t {
    /// Start of the bytes.
    pub base: *const c_void,
    /// Their length.
    pub len: usize,
}

/// Sends each of the `n` buffers of `iov` as its own message to `peer` with `tag`, all in
/// flight at once (large ones pipeline their rendezvous), and returns when all are out of
/// the caller's memory. Returns the first error.
///
/// Thread safety: one thread at a time per endpoint. Ownership: borrowed during the call.
///
/// # Safety
/// `ep` a live endpoint; `iov` `n` readable entries, each naming readable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_send_batch(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    tag: u64,
    iov: *const clink_iov_t,
    n: usize,
) -> c_int {
    with_ep("clink_send_batch", ep, |e, _| {
        if n == 0 {
            return Ok(OK);
        }
        if iov.is_null() {
            return Err(Fail::null("iov"));
        }
        let v = std::slice::from_raw_parts(iov, n);
        let msgs = v
            .iter()
            .map(|m| bytes(m.base, m.len, "iov[].base"))
            .collect::<R<Vec<&[u8]>>>()?;
        e.send_batch(PeerId(peer), tag, &msgs)?;
        Ok(OK)
    })
}

/// Receives one message matching `sel` into `buf` (capacity `cap`), waiting up to
/// `timeout_ms` (-1 forever, 0 only what is there). Fills `*status` (may be NULL).
/// A message longer than `cap` fills `buf` with its first bytes and returns
/// `CLINK_ERR_TRUNCATED` with `status->len` its full length (and `peer`/`tag` those of the
/// selector when it names them exactly, else `CLINK_PEER_ANY` and 0: the Rust API does not
/// report them for a truncated message). On timeout the receive is withdrawn.
///
/// Copies: small messages one (out of the ring); large ones land straight in `buf` (one
/// CMA copy on the same host, or speculative placement over UDP).
///
/// Thread safety: one thread at a time per endpoint. Ownership: `buf` borrowed during the
/// call.
///
/// # Safety
/// `ep` a live endpoint; `buf` `cap` writable bytes (NULL allowed when `cap` is 0);
/// `status` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_recv(
    ep: *mut clink_endpoint_t,
    sel: clink_selector_t,
    buf: *mut c_void,
    cap: usize,
    timeout_ms: c_int,
    status: *mut clink_status_t,
) -> c_int {
    with_ep("clink_recv", ep, |e, _| {
        let b = bytes_mut(buf, cap, "buf")?;
        let s = sel.to_rust();
        match e.recv_timeout(s, b, timeout(timeout_ms)) {
            Ok(st) => {
                put_status(status, st);
                Ok(OK)
            }
            Err(err) => Err(recv_failed(err, s, status)),
        }
    })
}

/// A failed receive's error; a truncated one's status is filled in too.
#[cold]
#[inline(never)]
unsafe fn recv_failed(err: Error, s: Selector, status: *mut clink_status_t) -> Fail {
    if let Error::Truncated { len, .. } = err {
        put_opt(status, truncated_status(s, len));
    }
    err.into()
}

/// Looks for a message matching `sel` that arrived and was not received yet, without
/// receiving it (makes progress first): `CLINK_OK` with `*status` filled, or `CLINK_AGAIN`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `status` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_probe(
    ep: *mut clink_endpoint_t,
    sel: clink_selector_t,
    status: *mut clink_status_t,
) -> c_int {
    with_ep("clink_probe", ep, |e, _| match e.probe(sel.to_rust()) {
        Some(st) => {
            put_status(status, st);
            Ok(OK)
        }
        None => Ok(AGAIN),
    })
}

mod inplace;
mod requests;
mod slots;

pub use inplace::*;
pub use requests::*;
pub use slots::*;
