//! Which descriptors are followed connections: a bitmap answers "no" for every other
//! descriptor without a lock (the wrappers' cost for plain sockets, files and pipes), a map
//! under a read-write lock gives the connection. Several descriptors (dup) share one.

use crate::conn::Conn;
use crate::fdbits::FdBits;
use libc::c_int;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

static BITS: FdBits = FdBits::new();

/// Bumped whenever a descriptor starts or stops being followed (epoll's member lists are
/// cached against it).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The current generation of the table.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

fn map() -> &'static RwLock<HashMap<c_int, Arc<Conn>>> {
    static M: OnceLock<RwLock<HashMap<c_int, Arc<Conn>>>> = OnceLock::new();
    M.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Whether `fd` may be followed (beyond the bitmap: the map says).
fn marked(fd: c_int) -> bool {
    fd >= 0 && BITS.get(fd).unwrap_or(true)
}

/// The connection behind `fd`, if it is one (and its end has not left: see
/// `Conn::left`; such a connection is the kernel's again, here too).
pub fn get(fd: c_int) -> Option<Arc<Conn>> {
    if !marked(fd) {
        return None;
    }
    let c = map()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .cloned()?;
    (!c.left()).then_some(c)
}

/// Follows `fd` as `conn`.
pub fn insert(fd: c_int, conn: Arc<Conn>) {
    let old = map()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(fd, conn);
    BITS.set(fd, true);
    drop(old);
}

/// Stops following `fd` (closed, or reused by dup2). The connection ends with its last fd.
pub fn remove(fd: c_int) -> Option<Arc<Conn>> {
    if !marked(fd) {
        return None;
    }
    BITS.set(fd, false);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    map().write().unwrap_or_else(|e| e.into_inner()).remove(&fd)
}

/// The connections behind several descriptors at once (one lock), in order; descriptors
/// that are not followed are left out.
pub fn get_many(fds: impl Iterator<Item = c_int>) -> Vec<(c_int, Arc<Conn>)> {
    let mut fds = fds.filter(|fd| marked(*fd)).peekable();
    if fds.peek().is_none() {
        return Vec::new();
    }
    let m = map().read().unwrap_or_else(|e| e.into_inner());
    fds.filter_map(|fd| m.get(&fd).map(|c| (fd, c.clone())))
        .collect()
}

/// Every followed descriptor with its connection.
pub fn all() -> Vec<(c_int, Arc<Conn>)> {
    map()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}
