//! The PMIx client calls a launched process makes (`libpmix.so.2`, loaded at run time):
//! init, put, commit, fence, get, finalize. Errors are PMIx's status codes.

use std::ffi::{c_char, c_int, c_void, CStr};

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

impl Pmix {
    fn load() -> Result<Pmix, String> {
        // SAFETY: dlopen/dlsym with NUL-terminated names; each symbol is cast to the
        // signature PMIx 4's pmix.h gives it.
        unsafe {
            let h = libc::dlopen(c"libpmix.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            if h.is_null() {
                return Err(
                    "libpmix.so.2 cannot be loaded (apt-get install libpmix2; it comes with Open MPI)"
                        .into(),
                );
            }
            let sym = |name: &CStr| {
                let p = libc::dlsym(h, name.as_ptr());
                if p.is_null() {
                    Err(format!("libpmix.so.2 lacks {}", name.to_string_lossy()))
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

/// A connection to the launcher's PMIx service (finalized on drop).
pub struct Client {
    pmix: Pmix,
    me: Proc,
}

// SAFETY: PMIx's client calls are thread-safe; the struct only holds its name and the
// function pointers.
unsafe impl Send for Client {}

/// A failed call: what was called, and PMIx's status (or why it could not be called).
pub type PmixError = String;

fn status(call: &str, rc: c_int) -> Result<(), PmixError> {
    if rc == PMIX_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed ({rc})"))
    }
}

impl Client {
    /// Loads the library and joins the job (`PMIx_Init`).
    pub fn init() -> Result<Client, PmixError> {
        let pmix = Pmix::load()?;
        let mut me = Proc {
            nspace: [0; NSPACE],
            rank: 0,
        };
        // SAFETY: `me` is writable; no attributes.
        status("PMIx_Init", unsafe {
            (pmix.init)(&mut me, std::ptr::null_mut(), 0)
        })?;
        Ok(Client { pmix, me })
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    fn proc(&self, rank: Option<u32>) -> Proc {
        Proc {
            nspace: self.me.nspace,
            rank: rank.unwrap_or(PMIX_RANK_WILDCARD),
        }
    }

    /// Reads `key` of `rank` (`None`: the job's own, the wildcard rank) and maps the value
    /// with `f` (`None`: an unusable value).
    fn get<T>(
        &self,
        rank: Option<u32>,
        key: &CStr,
        f: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>, PmixError> {
        let proc = self.proc(rank);
        let mut v: *mut Value = std::ptr::null_mut();
        // SAFETY: valid proc and key; PMIx allocates `v`, released below.
        let rc = unsafe { (self.pmix.get)(&proc, key.as_ptr(), std::ptr::null(), 0, &mut v) };
        if rc != PMIX_SUCCESS || v.is_null() {
            return Err(format!(
                "PMIx_Get of {} for rank {} failed ({rc})",
                key.to_string_lossy(),
                proc.rank
            ));
        }
        // SAFETY: `v` is PMIx's value, read then released the way PMIX_VALUE_RELEASE does.
        unsafe {
            let out = f(&*v);
            (self.pmix.destruct)(v);
            libc::free(v as *mut c_void);
            Ok(out)
        }
    }

    /// A 32-bit unsigned value (`None` when the value has another type).
    pub fn get_u32(&self, rank: Option<u32>, key: &CStr) -> Result<Option<u32>, PmixError> {
        self.get(rank, key, |v| {
            (v.kind == PMIX_UINT32).then_some(v.data[0] as u32)
        })
    }

    /// A string value (`None` when the value has another type or is null).
    pub fn get_string(&self, rank: Option<u32>, key: &CStr) -> Result<Option<String>, PmixError> {
        self.get(rank, key, |v| {
            if v.kind != PMIX_STRING || v.data[0] == 0 {
                return None;
            }
            // SAFETY: a PMIX_STRING value holds a NUL-terminated string.
            let s = unsafe { CStr::from_ptr(v.data[0] as *const c_char) };
            Some(s.to_string_lossy().into_owned())
        })
    }

    /// Publishes `key` = `text` for the whole job (`PMIx_Put`, global scope).
    pub fn put_string(&self, key: &CStr, text: &CStr) -> Result<(), PmixError> {
        let mut v = Value {
            kind: PMIX_STRING,
            data: [text.as_ptr() as u64, 0, 0],
        };
        // SAFETY: a string value PMIx copies; key and value valid during the call.
        status("PMIx_Put", unsafe {
            (self.pmix.put)(PMIX_GLOBAL, key.as_ptr(), &mut v)
        })
    }

    /// Makes what was put visible to the fence (`PMIx_Commit`).
    pub fn commit(&self) -> Result<(), PmixError> {
        // SAFETY: no arguments.
        status("PMIx_Commit", unsafe { (self.pmix.commit)() })
    }

    /// A fence over the whole job (`PMIx_Fence` with no procs); data is fetched on demand
    /// after it.
    pub fn fence(&self) -> Result<(), PmixError> {
        // SAFETY: no procs, no attributes.
        status("PMIx_Fence", unsafe {
            (self.pmix.fence)(std::ptr::null(), 0, std::ptr::null(), 0)
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: no attributes.
        unsafe { (self.pmix.finalize)(std::ptr::null(), 0) };
    }
}
