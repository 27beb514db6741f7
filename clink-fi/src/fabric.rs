//! Fabric and domain objects. The domain holds the clink context its endpoints share
//! (configuration from `CLINK_*`, the host's cost model).

use crate::abi::*;
use crate::{enosys, fid_ops, guard, no_bind, no_control};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

#[repr(C)]
struct Fabric {
    fid: fid_fabric,
}

static FABRIC_FID_OPS: fi_ops = fid_ops(fabric_close, no_bind, no_control);
static FABRIC_OPS: fi_ops_fabric = fi_ops_fabric {
    size: std::mem::size_of::<fi_ops_fabric>(),
    domain,
    passive_ep: enosys,
    eq_open,
    wait_open: enosys,
    trywait,
    domain2: enosys,
};

/// The provider's `fabric` entry: opens the fabric object.
pub unsafe extern "C" fn fabric(
    _attr: *mut fi_fabric_attr,
    out: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        let f = Box::new(Fabric {
            fid: fid_fabric {
                fid: fid {
                    fclass: FI_CLASS_FABRIC,
                    context,
                    ops: &FABRIC_FID_OPS,
                },
                ops: &FABRIC_OPS,
                api_version: fi_version(1, 17),
            },
        });
        // SAFETY: `out` checked above.
        unsafe { *out = Box::into_raw(f) as *mut fid_fabric };
        0
    })
}

unsafe extern "C" fn fabric_close(f: *mut fid) -> c_int {
    // SAFETY: `f` is a fabric this provider opened (its fid is the first field).
    drop(unsafe { Box::from_raw(f as *mut Fabric) });
    0
}

/// Nothing to wait on: every wait is a poll of the completion queues.
unsafe extern "C" fn trywait(_: *mut fid_fabric, _: *mut *mut fid, _: c_int) -> c_int {
    0
}

/// A domain: the clink context of its endpoints, made at the first endpoint.
#[repr(C)]
pub struct Domain {
    fid: fid_domain,
    /// The context (made lazily: it reads the environment and the host's cost cache).
    pub ctx: Mutex<Option<clink::Context>>,
    /// Locking the application promised to do (`FI_THREAD_DOMAIN`) or asked of us.
    pub threading: c_int,
}

// SAFETY: the fid's pointers are the static operation tables and the application's
// context, only handed back; the rest is behind a mutex or immutable.
unsafe impl Send for Domain {}
// SAFETY: as above.
unsafe impl Sync for Domain {}

impl Domain {
    /// The domain's clink context.
    pub fn context(&self) -> Result<clink::Context, String> {
        let mut g = self.ctx.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(clink::Context::new().map_err(|e| e.to_string())?);
        }
        Ok(g.as_ref().expect("just made").clone())
    }
}

static DOMAIN_FID_OPS: fi_ops = fid_ops(domain_close, no_bind, no_control);
static DOMAIN_OPS: fi_ops_domain = fi_ops_domain {
    size: std::mem::size_of::<fi_ops_domain>(),
    av_open: crate::av::av_open,
    cq_open: crate::cq::cq_open,
    endpoint: crate::ep::endpoint,
    scalable_ep: enosys,
    cntr_open: enosys,
    poll_open: enosys,
    stx_ctx: enosys,
    srx_ctx: enosys,
    query_atomic: enosys,
    query_collective: enosys,
    endpoint2: enosys,
};
static MR_OPS: fi_ops_mr = fi_ops_mr {
    size: std::mem::size_of::<fi_ops_mr>(),
    reg: enosys,
    regv: enosys,
    regattr: enosys,
};

unsafe extern "C" fn domain(
    _fabric: *mut fid_fabric,
    info: *mut fi_info,
    out: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `info` NULL or valid.
        let threading = unsafe { info.as_ref().and_then(|i| i.domain_attr.as_ref()) }
            .map_or(FI_THREAD_SAFE, |d| d.threading);
        let d = Arc::new(Domain {
            fid: fid_domain {
                fid: fid {
                    fclass: FI_CLASS_DOMAIN,
                    context,
                    ops: &DOMAIN_FID_OPS,
                },
                ops: &DOMAIN_OPS,
                mr: &MR_OPS,
            },
            ctx: Mutex::new(None),
            threading,
        });
        // SAFETY: `out` checked above. The Arc's pointer is the fid (first field); the
        // endpoints hold clones, so the domain outlives them whatever the closing order.
        unsafe { *out = Arc::into_raw(d) as *mut fid_domain };
        0
    })
}

/// The domain behind a `fid_domain` this provider made, as a new reference.
///
/// # Safety
/// `d` must be a domain of this provider that is not closed.
pub unsafe fn domain_ref(d: *mut fid_domain) -> Arc<Domain> {
    let p = d as *const Domain;
    // SAFETY: per the contract, `p` came from Arc::into_raw and is alive.
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}

unsafe extern "C" fn domain_close(d: *mut fid) -> c_int {
    // SAFETY: `d` is a domain this provider opened; this drops the application's reference.
    drop(unsafe { Arc::from_raw(d as *const Domain) });
    0
}

/// An event queue: RDM endpoints here raise no events (no connections to report, address
/// vectors insert synchronously), so it is always empty; programs open one regardless.
#[repr(C)]
struct Eq {
    fid: fid_eq,
}

static EQ_FID_OPS: fi_ops = fid_ops(eq_close, no_bind, no_control);
static EQ_OPS: fi_ops_eq = fi_ops_eq {
    size: std::mem::size_of::<fi_ops_eq>(),
    read: eq_read,
    readerr: eq_readerr,
    write: enosys,
    sread: eq_sread,
    strerror: enosys,
};

unsafe extern "C" fn eq_open(
    _fabric: *mut fid_fabric,
    _attr: *mut c_void,
    out: *mut *mut fid_eq,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        let eq = Box::new(Eq {
            fid: fid_eq {
                fid: fid {
                    fclass: FI_CLASS_EQ,
                    context,
                    ops: &EQ_FID_OPS,
                },
                ops: &EQ_OPS,
            },
        });
        // SAFETY: `out` checked above.
        unsafe { *out = Box::into_raw(eq) as *mut fid_eq };
        0
    })
}

unsafe extern "C" fn eq_close(f: *mut fid) -> c_int {
    // SAFETY: an event queue this provider opened.
    drop(unsafe { Box::from_raw(f as *mut Eq) });
    0
}

unsafe extern "C" fn eq_read(
    _: *mut fid_eq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    _: u64,
) -> isize {
    crate::err(FI_EAGAIN)
}

unsafe extern "C" fn eq_readerr(_: *mut fid_eq, _: *mut c_void, _: u64) -> isize {
    crate::err(FI_EAGAIN)
}

unsafe extern "C" fn eq_sread(
    _: *mut fid_eq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    timeout: c_int,
    _: u64,
) -> isize {
    if timeout > 0 {
        std::thread::sleep(std::time::Duration::from_millis(timeout as u64));
    }
    crate::err(FI_EAGAIN)
}
