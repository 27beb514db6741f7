//! Address vectors: the peers' names (clink addresses in binary form), by `fi_addr_t`.
//! `FI_AV_TABLE` hands out the indices 0, 1, ...; `FI_AV_MAP` hands out 1, 2, ..., so that
//! 0 is never an address. Open MPI relies on that: without remote CQ data it carries the
//! source in the tag and posts some receives (the `MPI_Ssend` acknowledgement, any-source
//! probes) with the address 0, meaning "ignored", on an endpoint that honours directed
//! receives. A receive naming an address the vector never gave out (0 under `FI_AV_MAP`)
//! therefore matches any source.

use crate::abi::*;
use crate::{enosys, fid_ops, guard, no_bind, no_control};
use clink_proto::addr::{Address, BINARY_LEN};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard};

/// One inserted peer.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its address (text form, for `connect`).
    pub addr: String,
    /// Its endpoint identity.
    pub id: u128,
    /// Its host key (machine and network namespace).
    pub host: u64,
}

/// The entries, shared with the endpoints bound to the vector.
#[derive(Default)]
pub struct Table {
    /// By index; `None` once removed.
    pub entries: Vec<Option<Entry>>,
    /// `fi_addr_t` by endpoint identity (for `FI_SOURCE`).
    pub by_id: HashMap<u128, u64>,
    /// The `fi_addr_t` of the first entry (1 for `FI_AV_MAP`, 0 for `FI_AV_TABLE`).
    pub first: u64,
}

impl Table {
    /// The entry an `fi_addr_t` names, if the vector gave it out and it was not removed.
    pub fn get(&self, a: u64) -> Option<&Entry> {
        let i = a.checked_sub(self.first)?;
        self.entries.get(usize::try_from(i).ok()?)?.as_ref()
    }

    /// Whether the vector ever gave out `a` (removed entries included).
    pub fn gave_out(&self, a: u64) -> bool {
        a.checked_sub(self.first)
            .is_some_and(|i| i < self.entries.len() as u64)
    }
}

/// A vector's table and its length, readable without the lock (endpoints look at every
/// progress whether something was inserted).
#[derive(Default)]
pub struct AvShared {
    table: Mutex<Table>,
    /// Entries inserted so far.
    pub inserted: AtomicUsize,
}

impl AvShared {
    /// Locks the table.
    pub fn lock(&self) -> LockResult<MutexGuard<'_, Table>> {
        self.table.lock()
    }
}

/// The address vector object.
#[repr(C)]
pub struct Av {
    fid: fid_av,
    /// Its table.
    pub table: Arc<AvShared>,
}

static AV_FID_OPS: fi_ops = fid_ops(av_close, no_bind, no_control);
static AV_OPS: fi_ops_av = fi_ops_av {
    size: std::mem::size_of::<fi_ops_av>(),
    insert,
    insertsvc: enosys,
    insertsym: enosys,
    remove,
    lookup,
    straddr,
    av_set: enosys,
};

pub unsafe extern "C" fn av_open(
    _domain: *mut fid_domain,
    attr: *mut fi_av_attr,
    out: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `attr` NULL or valid.
        if let Some(a) = unsafe { attr.as_ref() } {
            if ![FI_AV_UNSPEC, FI_AV_MAP, FI_AV_TABLE].contains(&a.type_) {
                return -FI_EINVAL;
            }
            if a.flags != 0 || !a.name.is_null() {
                return -FI_ENOSYS; // FI_EVENT, FI_READ, shared named vectors
            }
        }
        // SAFETY: `attr` NULL or valid.
        let table = unsafe { attr.as_ref() }.map_or(FI_AV_MAP, |a| a.type_);
        let first = u64::from(table != FI_AV_TABLE);
        let av = Box::new(Av {
            fid: fid_av {
                fid: fid {
                    fclass: FI_CLASS_AV,
                    context,
                    ops: &AV_FID_OPS,
                },
                ops: &AV_OPS,
            },
            table: Arc::new(AvShared {
                table: Mutex::new(Table {
                    first,
                    ..Table::default()
                }),
                inserted: AtomicUsize::new(0),
            }),
        });
        // SAFETY: `out` checked above.
        unsafe { *out = Box::into_raw(av) as *mut fid_av };
        0
    })
}

unsafe extern "C" fn av_close(f: *mut fid) -> c_int {
    // SAFETY: an address vector this provider opened; endpoints keep their own Arc.
    drop(unsafe { Box::from_raw(f as *mut Av) });
    0
}

/// The table of an address vector of this provider.
///
/// # Safety
/// `f` must be an open address vector of this provider.
pub unsafe fn table_of(f: *mut fid) -> Arc<AvShared> {
    // SAFETY: per the contract.
    unsafe { (*(f as *mut Av)).table.clone() }
}

unsafe extern "C" fn insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    _context: *mut c_void,
) -> c_int {
    guard(|| {
        if flags != 0 || (count > 0 && addr.is_null()) {
            return -FI_EINVAL;
        }
        // SAFETY: an open vector of ours.
        let table = unsafe { table_of(av as *mut fid) };
        let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
        let mut ok = 0;
        for i in 0..count {
            // SAFETY: the caller passes `count` names of the length getname gave.
            let bytes = unsafe {
                std::slice::from_raw_parts((addr as *const u8).add(i * BINARY_LEN), BINARY_LEN)
            };
            let out = match Address::from_bytes(bytes) {
                Ok(a) => {
                    let index = t.entries.len() as u64 + t.first;
                    t.by_id.insert(a.id, index);
                    t.entries.push(Some(Entry {
                        addr: a.to_string(),
                        id: a.id,
                        host: a.host,
                    }));
                    ok += 1;
                    index
                }
                Err(_) => FI_ADDR_NOTAVAIL,
            };
            if !fi_addr.is_null() {
                // SAFETY: `fi_addr` has room for `count` entries.
                unsafe { *fi_addr.add(i) = out };
            }
        }
        table.inserted.store(t.entries.len(), Ordering::Release);
        ok
    })
}

unsafe extern "C" fn remove(
    av: *mut fid_av,
    fi_addr: *mut fi_addr_t,
    count: usize,
    _: u64,
) -> c_int {
    guard(|| {
        // SAFETY: an open vector of ours.
        let table = unsafe { table_of(av as *mut fid) };
        let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
        for i in 0..count {
            // SAFETY: `count` entries.
            let a = unsafe { *fi_addr.add(i) };
            let Some(at) = a.checked_sub(t.first) else {
                continue;
            };
            if let Some(e) = t.entries.get_mut(at as usize).and_then(Option::take) {
                t.by_id.remove(&e.id);
            }
        }
        0
    })
}

unsafe extern "C" fn lookup(
    av: *mut fid_av,
    fi_addr: fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: an open vector of ours.
        let table = unsafe { table_of(av as *mut fid) };
        let t = table.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = t.get(fi_addr) else {
            return -FI_ENOENT;
        };
        let Some(bytes) = Address::parse(&e.addr).ok().and_then(|a| a.to_bytes()) else {
            return -FI_EIO;
        };
        // SAFETY: `addrlen` valid; `addr` has `*addrlen` bytes.
        unsafe {
            let n = (*addrlen).min(BINARY_LEN);
            if !addr.is_null() {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, n);
            }
            *addrlen = BINARY_LEN;
        }
        0
    })
}

unsafe extern "C" fn straddr(
    _av: *mut fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: `addr` is a name of BINARY_LEN bytes; `buf` has `*len` bytes.
    unsafe {
        let bytes = std::slice::from_raw_parts(addr as *const u8, BINARY_LEN);
        let text = match Address::from_bytes(bytes) {
            Ok(a) => a.to_string(),
            Err(e) => format!("(not a clink name: {e})"),
        };
        let n = (*len).saturating_sub(1).min(text.len());
        if !buf.is_null() && *len > 0 {
            std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buf, n);
            *buf.add(n) = 0;
        }
        *len = text.len() + 1;
    }
    buf
}
