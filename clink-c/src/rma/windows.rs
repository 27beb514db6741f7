//! Windows (an own aperture, or a same-host peer's mapped by `clink_map`): their memory,
//! reads, writes and atomics on it.

use super::*;

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
