//! `libclink_fi.so`: a libfabric provider named `clink` that runs programs written against
//! libfabric (and Open MPI, through its `mtl ofi`) on clink's endpoints: shared memory
//! on one host, the network path across hosts.
//!
//! What it offers: `FI_EP_RDM` endpoints with tagged messages (`FI_TAGGED`) and untagged
//! ones (`FI_MSG`; the top tag bit marks them, see `ep::MSG_TAG`), directed
//! receives, `FI_SOURCE`, peek / claim / discard, cancel, truncation reported as
//! `FI_ETRUNC`, inject, address vectors of both kinds (`FI_AV_MAP`, `FI_AV_TABLE`),
//! completion queues in every format, `FI_THREAD_SAFE` (every object is locked), manual
//! progress (reading a completion queue drives the endpoints bound to it), no memory
//! registration (`mr_mode` 0). Sends lend the caller's buffer to clink (no copy; one CMA
//! copy for large messages on one host) and receives land in the caller's buffer.
//!
//! Load it with `FI_PROVIDER_PATH=<dir holding libclink_fi.so>` (libfabric loads every
//! file there whose name ends in `fi.so`); `fi_info -p clink` lists it. Names are the
//! endpoint's address in clink's 62-byte binary form (`clink_proto::addr::BINARY_LEN`).
//!
//! Connections: two endpoints share one clink connection, made by the one with the
//! smaller identity when either first needs it (the other waits for it, answering
//! `-FI_EAGAIN` to sends meanwhile), so a receive from a given address always has one
//! connection to match on; when both connect at the same moment, both use the one the
//! smaller identity made (`clink::Joined::superseded`).

pub mod abi;
mod av;
mod cq;
mod ep;
mod fabric;
mod info;
mod lock;

use abi::*;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The provider's version (reported by `fi_info -l`).
pub const VERSION: u32 = fi_version(0, 1);
/// The provider's name, as `fi_info -p` and Open MPI's `mtl_ofi_provider_include` take it.
pub const NAME: &str = "clink";

static mut PROVIDER: fi_provider = fi_provider {
    version: VERSION,
    fi_version: fi_version(1, 17),
    context: fi_context {
        internal: [std::ptr::null_mut(); 4],
    },
    name: c"clink".as_ptr(),
    getinfo: info::getinfo,
    fabric: fabric::fabric,
    cleanup,
};

/// libfabric's entry point for an external provider. The core writes into the returned
/// structure (its `context`), so it lives in writable static memory.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut fi_provider {
    &raw mut PROVIDER
}

unsafe extern "C" fn cleanup() {}

/// The function every unimplemented table slot points at.
pub(crate) unsafe extern "C" fn enosys() -> isize {
    -(FI_ENOSYS as isize)
}

/// A return type of entry points: `c_int` or `ssize_t`.
pub(crate) trait Code {
    fn failed() -> Self;
}
impl Code for c_int {
    fn failed() -> Self {
        -FI_EIO
    }
}
impl Code for isize {
    fn failed() -> Self {
        -(FI_EIO as isize)
    }
}

/// Runs an entry point's body; a panic becomes `-FI_EIO` instead of unwinding into C.
pub(crate) fn guard<T: Code>(f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| T::failed())
}

/// A negated libfabric error code as the `ssize_t` the data-path calls return.
pub(crate) fn err(e: c_int) -> isize {
    -(e as isize)
}

/// `strdup` into memory libfabric frees with `free`.
pub(crate) fn c_strdup(s: &str) -> *mut c_char {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    // SAFETY: malloc of the right size, then a copy into it.
    unsafe {
        let p = libc::malloc(v.len()) as *mut c_char;
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(v.as_ptr() as *const c_char, p, v.len());
        }
        p
    }
}

/// `calloc` of one `T`, for structures libfabric frees with `free`.
pub(crate) fn c_calloc<T>() -> *mut T {
    // SAFETY: plain allocation.
    unsafe { libc::calloc(1, std::mem::size_of::<T>()) as *mut T }
}

/// The common `fi_ops` of an object class: its close, bind and control.
pub(crate) const fn fid_ops(
    close: unsafe extern "C" fn(*mut fid) -> c_int,
    bind: unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int,
    control: unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int,
) -> fi_ops {
    fi_ops {
        size: std::mem::size_of::<fi_ops>(),
        close,
        bind,
        control,
        ops_open: enosys,
        tostr: enosys,
        ops_set: enosys,
    }
}

pub(crate) unsafe extern "C" fn no_bind(_: *mut fid, _: *mut fid, _: u64) -> c_int {
    -FI_ENOSYS
}

pub(crate) unsafe extern "C" fn no_control(_: *mut fid, _: c_int, _: *mut c_void) -> c_int {
    -FI_ENOSYS
}

/// Writes a diagnostic to stderr when `FI_CLINK_LOG` is set (why hints were refused, why
/// an endpoint could not be made).
pub(crate) fn log(what: &str) {
    if std::env::var_os("FI_CLINK_LOG").is_some() {
        eprintln!("clink provider: {what}");
    }
}
