//! Space claimed in a peer's ring, written in place and committed.

use super::*;

/// Space claimed in a peer's ring for one message (`clink_claim`): write the message into
/// `clink_slot_buf`, then `clink_slot_commit` (or `clink_slot_abandon`). While it is held
/// the endpoint is reserved for it (`CLINK_ERR_BUSY` to other calls).
pub struct clink_slot_t {
    slot: Option<SendSlot<'static>>,
    owner: *const clink_endpoint_t,
    buf: *mut u8,
    len: usize,
}

/// Claims space for a `len`-byte message to `peer` with `tag` in its ring, waiting up to
/// `timeout_ms` (-1 forever) for room: the message is written in place (zero copies on the
/// sending side; over the network into a buffer the link then owns). `len` must not exceed
/// the peer's eager threshold (`clink_peer_info`), else `CLINK_ERR_TOO_LARGE`.
///
/// Ownership: `*slot` is consumed by `clink_slot_commit` or `clink_slot_abandon`.
/// Thread safety: one thread at a time per endpoint; the endpoint answers `CLINK_ERR_BUSY`
/// to other calls until the slot is committed or abandoned.
///
/// # Safety
/// `ep` a live endpoint; `slot` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_claim(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    tag: u64,
    len: usize,
    timeout_ms: c_int,
    slot: *mut *mut clink_slot_t,
) -> c_int {
    ffi("clink_claim", || {
        let h = ep_ref(ep)?;
        need_out(slot, "slot")?;
        h.lock()?;
        // SAFETY: as in `clink_recv_in_place`: locked for as long as the slot lives.
        let e: &'static mut Endpoint = &mut *h.ep.get();
        let r = catch_unwind(AssertUnwindSafe(move || {
            let e = e; // moved: the slot borrows it for 'static
            e.claim(PeerId(peer), tag, len, timeout(timeout_ms))
                .map(|mut s| {
                    let b = s.buf();
                    let (p, n) = (b.as_mut_ptr(), b.len());
                    (s, p, n)
                })
        }));
        match r {
            Ok(Ok((s, buf, n))) => {
                slot.write(Box::into_raw(Box::new(clink_slot_t {
                    slot: Some(s),
                    owner: h,
                    buf,
                    len: n,
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

/// Where to write the claimed message (`*len`, may be NULL, gets its length). NULL for a
/// NULL slot.
///
/// Ownership: the memory belongs to the library (the peer's ring) until commit/abandon.
///
/// # Safety
/// `slot` NULL or a live slot; `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_slot_buf(slot: *mut clink_slot_t, len: *mut usize) -> *mut c_void {
    match slot.as_ref() {
        Some(s) => {
            put_opt(len, s.len);
            s.buf.cast()
        }
        None => {
            put_opt(len, 0);
            std::ptr::null_mut()
        }
    }
}

unsafe fn end_slot(slot: *mut clink_slot_t, commit: bool) -> c_int {
    ffi("clink_slot_commit", || {
        if slot.is_null() {
            return Err(Fail::null("slot"));
        }
        let mut b = Box::from_raw(slot);
        let owner = &*b.owner;
        let s = b.slot.take();
        let r = catch_unwind(AssertUnwindSafe(|| match s {
            Some(s) if commit => s.commit(),
            s => drop(s),
        }));
        if r.is_err() {
            owner.poison();
        } else {
            owner.unlock();
        }
        if let Err(p) = r {
            resume_unwind(p);
        }
        Ok(OK)
    })
}

/// Publishes the claimed message and frees the slot; the endpoint is usable again.
/// `CLINK_ERR_NULL` for NULL. A peer that died meanwhile is reported by the next call.
///
/// Thread safety: once per slot, from any thread, while no call is using it.
///
/// # Safety
/// `slot` NULL or a live slot.
#[no_mangle]
pub unsafe extern "C" fn clink_slot_commit(slot: *mut clink_slot_t) -> c_int {
    end_slot(slot, true)
}

/// Abandons the claimed message (nothing is sent) and frees the slot. NULL is ignored.
///
/// # Safety
/// `slot` NULL or a live slot.
#[no_mangle]
pub unsafe extern "C" fn clink_slot_abandon(slot: *mut clink_slot_t) {
    if !slot.is_null() {
        end_slot(slot, false);
    }
}
