//! Ranks of a job started by a launcher (`mpirun`, `srun`) find each other through the
//! launcher's PMIx service: each publishes its endpoint's address, a fence makes them
//! visible, and each reads everyone's. `libpmix.so.2` (Debian's libpmix2, which Open MPI
//! and Slurm bring) is loaded at run time, so programs that never ask need no PMIx.
//!
//! ```no_run
//! let (ctx, job) = clink::Context::from_launcher()?;
//! let mut ep = ctx.endpoint()?;
//! let addrs = job.exchange_addresses(&ep.address())?;
//! println!("rank {} of {}: {} addresses", job.rank(), job.size(), addrs.len());
//! # Ok::<(), clink::Error>(())
//! ```

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// `PMIX_MAX_NSLEN` + 1.
const NSPACE: usize = 256;
const PMIX_SUCCESS: c_int = 0;
const PMIX_STRING: u16 = 3;
const PMIX_UINT32: u16 = 14;
const PMIX_GLOBAL: u8 = 3;
const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;
/// `sizeof(pmix_value_t)` in PMIx 4 (type, padding, a 24-byte union).
const VALUE_SIZE: usize = 32;

#[repr(C)]
struct Proc {
    nspace: [c_char; NSPACE],
    rank: u32,
}

/// The `pmix_value_t` fields read or written here; the rest of its 32 bytes is padding.
#[repr(C)]
struct Value {
    kind: u16,
    data: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<Value>() == VALUE_SIZE);

type Init = unsafe extern "C" fn(*mut Proc, *mut c_void, usize) -> c_int;
type Finalize = unsafe extern "C" fn(*const c_void, usize) -> c_int;
type Put = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type Commit = unsafe extern "C" fn() -> c_int;
type Fence = unsafe extern "C" fn(*const Proc, usize, *const c_void, usize) -> c_int;
type Get = unsafe extern "C" fn(
    *const Proc,
    *const c_char,
    *const c_void,
    usize,
    *mut *mut Value,
) -> c_int;
type Destruct = unsafe extern "C" fn(*mut Value);

struct Pmix {
    init: Init,
    finalize: Finalize,
    put: Put,
    commit: Commit,
    fence: Fence,
    get: Get,
    destruct: Destruct,
}

fn fail(what: impl Into<String>) -> Error {
    Error::Launcher(what.into())
}

impl Pmix {
    fn load() -> Result<Pmix> {
        // SAFETY: dlopen/dlsym with NUL-terminated names; each symbol is cast to the
        // signature PMIx 4's pmix.h gives it.
        unsafe {
            let h = libc::dlopen(c"libpmix.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            if h.is_null() {
                return Err(fail(
                    "libpmix.so.2 cannot be loaded (apt-get install libpmix2; it comes with Open MPI)",
                ));
            }
            let sym = |name: &CStr| {
                let p = libc::dlsym(h, name.as_ptr());
                if p.is_null() {
                    Err(fail(format!(
                        "libpmix.so.2 lacks {}",
                        name.to_string_lossy()
                    )))
                } else {
                    Ok(p)
                }
            };
            Ok(Pmix {
                init: std::mem::transmute::<*mut c_void, Init>(sym(c"PMIx_Init")?),
                finalize: std::mem::transmute::<*mut c_void, Finalize>(sym(c"PMIx_Finalize")?),
                put: std::mem::transmute::<*mut c_void, Put>(sym(c"PMIx_Put")?),
                commit: std::mem::transmute::<*mut c_void, Commit>(sym(c"PMIx_Commit")?),
                fence: std::mem::transmute::<*mut c_void, Fence>(sym(c"PMIx_Fence")?),
                get: std::mem::transmute::<*mut c_void, Get>(sym(c"PMIx_Get")?),
                destruct: std::mem::transmute::<*mut c_void, Destruct>(sym(
                    c"PMIx_Value_destruct",
                )?),
            })
        }
    }
}

/// This process's place in a launched job, and the launcher's key-value service.
pub struct Launcher {
    pmix: Pmix,
    me: Proc,
    size: u32,
    local_size: Option<u32>,
}

// SAFETY: PMIx's client calls are thread-safe; the struct only holds its name and the
// function pointers.
unsafe impl Send for Launcher {}

impl Launcher {
    /// Joins the job that started this process. Fails with [`Error::Launcher`] when no
    /// launcher did (no `PMIX_NAMESPACE` in the environment) or its service answers with
    /// an error.
    pub fn from_env() -> Result<Launcher> {
        if std::env::var_os("PMIX_NAMESPACE").is_none() {
            return Err(fail(
                "this process was not started by a PMIx launcher (mpirun, srun): PMIX_NAMESPACE is not set",
            ));
        }
        let pmix = Pmix::load()?;
        let mut me = Proc {
            nspace: [0; NSPACE],
            rank: 0,
        };
        // SAFETY: `me` is writable; no attributes.
        let rc = unsafe { (pmix.init)(&mut me, std::ptr::null_mut(), 0) };
        if rc != PMIX_SUCCESS {
            return Err(fail(format!("PMIx_Init failed ({rc})")));
        }
        let mut job = Launcher {
            pmix,
            me,
            size: 0,
            local_size: None,
        };
        let wildcard = Proc {
            nspace: job.me.nspace,
            rank: PMIX_RANK_WILDCARD,
        };
        let size = job.get(&wildcard, c"pmix.job.size", |v| {
            (v.kind == PMIX_UINT32).then_some(v.data[0] as u32)
        })?;
        job.size = size
            .filter(|&n| n > 0)
            .ok_or_else(|| fail("the job size is not a positive number"))?;
        // Optional: a launcher that does not say leaves the rings sized as peers come.
        job.local_size = job
            .get(&wildcard, c"pmix.local.size", |v| {
                (v.kind == PMIX_UINT32).then_some(v.data[0] as u32)
            })
            .ok()
            .flatten()
            .filter(|&n| n > 0 && n <= job.size);
        Ok(job)
    }

    /// This process's rank (0-based).
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Number of the job's ranks on this node (this one included), when the launcher
    /// says (`pmix.local.size`).
    pub fn local_size(&self) -> Option<u32> {
        self.local_size
    }

    /// Reads `key` of `proc` and maps the value with `f` (`None`: unusable value).
    fn get<T>(
        &self,
        proc: &Proc,
        key: &CStr,
        f: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>> {
        let mut v: *mut Value = std::ptr::null_mut();
        // SAFETY: valid proc and key; PMIx allocates `v`, released below.
        let rc = unsafe { (self.pmix.get)(proc, key.as_ptr(), std::ptr::null(), 0, &mut v) };
        if rc != PMIX_SUCCESS || v.is_null() {
            return Err(fail(format!(
                "PMIx_Get of {} for rank {} failed ({rc})",
                key.to_string_lossy(),
                proc.rank
            )));
        }
        // SAFETY: `v` is PMIx's value, read then released the way PMIX_VALUE_RELEASE does.
        unsafe {
            let out = f(&*v);
            (self.pmix.destruct)(v);
            libc::free(v as *mut c_void);
            Ok(out)
        }
    }

    /// Publishes `addr` as this rank's endpoint address and returns every rank's, indexed
    /// by rank (this one's included). Collective: every rank of the job must call it.
    pub fn exchange_addresses(&self, addr: &str) -> Result<Vec<String>> {
        let key = c"clink.address";
        let text = CString::new(addr).map_err(|_| fail("an address with a NUL byte"))?;
        let mut v = Value {
            kind: PMIX_STRING,
            data: [text.as_ptr() as u64, 0, 0],
        };
        // SAFETY: a string value PMIx copies; key and value valid during the call.
        let rc = unsafe { (self.pmix.put)(PMIX_GLOBAL, key.as_ptr(), &mut v) };
        if rc != PMIX_SUCCESS {
            return Err(fail(format!("PMIx_Put failed ({rc})")));
        }
        // SAFETY: no arguments.
        let rc = unsafe { (self.pmix.commit)() };
        if rc != PMIX_SUCCESS {
            return Err(fail(format!("PMIx_Commit failed ({rc})")));
        }
        // A fence over the whole job (NULL procs); the data is fetched on demand after it.
        // SAFETY: no procs, no attributes.
        let rc = unsafe { (self.pmix.fence)(std::ptr::null(), 0, std::ptr::null(), 0) };
        if rc != PMIX_SUCCESS {
            return Err(fail(format!("PMIx_Fence failed ({rc})")));
        }
        (0..self.size)
            .map(|rank| {
                let who = Proc {
                    nspace: self.me.nspace,
                    rank,
                };
                self.get(&who, key, |v| {
                    if v.kind != PMIX_STRING || v.data[0] == 0 {
                        return None;
                    }
                    // SAFETY: a PMIX_STRING value holds a NUL-terminated string.
                    let s = unsafe { CStr::from_ptr(v.data[0] as *const c_char) };
                    Some(s.to_string_lossy().into_owned())
                })?
                .ok_or_else(|| fail(format!("rank {rank} published no address")))
            })
            .collect()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // SAFETY: no attributes.
        unsafe { (self.pmix.finalize)(std::ptr::null(), 0) };
    }
}
