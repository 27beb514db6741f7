//! Messages received in place, read straight from the sender's ring.

use super::*;

/// A message received in place (`clink_recv_in_place`): a small message is read straight
/// from the sender's ring (zero copies), others from a buffer of the library's. While it
/// is held, the endpoint is reserved for it: every other call on the endpoint returns
/// `CLINK_ERR_BUSY` until `clink_inplace_release`.
pub struct clink_inplace_t {
    guard: Option<InPlace<'static>>,
    owner: *const clink_endpoint_t,
    data: *const u8,
    len: usize,
    status: clink_status_t,
}

/// Receives a message matching `sel` without copying it when it is a small message at the
/// head of its sender's ring, waiting up to `timeout_ms` (-1 forever). On success `*msg`
/// holds it: read it with `clink_inplace_data` and give it back with
/// `clink_inplace_release` (until then the sender's later messages queue behind it and the
/// endpoint answers `CLINK_ERR_BUSY` to other calls).
///
/// Thread safety: one thread at a time per endpoint; the message may be released from
/// another thread.
///
/// # Safety
/// `ep` a live endpoint; `msg` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_recv_in_place(
    ep: *mut clink_endpoint_t,
    sel: clink_selector_t,
    timeout_ms: c_int,
    msg: *mut *mut clink_inplace_t,
) -> c_int {
    ffi("clink_recv_in_place", || {
        let h = ep_ref(ep)?;
        need_out(msg, "msg")?;
        h.lock()?;
        // SAFETY: locked, and the lock is held for as long as the guard lives (released
        // by `clink_inplace_release`, which drops the guard first); the endpoint cannot be
        // freed meanwhile (`clink_endpoint_free` refuses a locked endpoint).
        let e: &'static mut Endpoint = &mut *h.ep.get();
        let r = catch_unwind(AssertUnwindSafe(move || {
            let e = e; // moved: the guard borrows it for 'static
            e.recv_in_place(sel.to_rust(), timeout(timeout_ms))
        }));
        match r {
            Ok(Ok(g)) => {
                let (data, len, status) = (g.as_ptr(), g.len(), g.status().into());
                msg.write(Box::into_raw(Box::new(clink_inplace_t {
                    guard: Some(g),
                    owner: h,
                    data,
                    len,
                    status,
                })));
                Ok(OK)
            }
            Ok(Err(err)) => {
                h.unlock();
                Err(err.into())
            }
            Err(p) => {
                h.poison();
                resume_unwind(p)
            }
        }
    })
}

/// The bytes of an in-place message (NULL for a NULL message or an empty one); `*len`
/// (may be NULL) gets their length.
///
/// Ownership: the bytes belong to the library (the sender's ring) until
/// `clink_inplace_release`. Thread safety: any thread holding the message.
///
/// # Safety
/// `msg` NULL or a live in-place message; `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_inplace_data(
    msg: *const clink_inplace_t,
    len: *mut usize,
) -> *const c_void {
    match msg.as_ref() {
        Some(m) => {
            put_opt(len, m.len);
            m.data.cast()
        }
        None => {
            put_opt(len, 0);
            std::ptr::null()
        }
    }
}

/// Copies the status (sender, tag, length) of an in-place message into `*status`.
///
/// # Safety
/// `msg` a live in-place message; `status` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_inplace_status(
    msg: *const clink_inplace_t,
    status: *mut clink_status_t,
) -> c_int {
    ffi("clink_inplace_status", || {
        let m = msg.as_ref().ok_or_else(|| Fail::null("msg"))?;
        need_out(status, "status")?;
        status.write(m.status);
        Ok(OK)
    })
}

/// Gives an in-place message back (frees its ring space, lets the sender go on) and frees
/// the handle; the endpoint is usable again. NULL is ignored.
///
/// Thread safety: once per message, from any thread, while no call is using it.
///
/// # Safety
/// `msg` NULL or a live in-place message.
#[no_mangle]
pub unsafe extern "C" fn clink_inplace_release(msg: *mut clink_inplace_t) {
    if msg.is_null() {
        return;
    }
    let mut m = Box::from_raw(msg);
    let owner = &*m.owner;
    let guard = m.guard.take();
    if catch_unwind(AssertUnwindSafe(|| drop(guard))).is_err() {
        owner.poison();
    } else {
        owner.unlock();
    }
}
