//! The C API of clink (`libclink.so`, `libclink.a`, header `include/clink.h`).
//!
//! Every exported function is `extern "C"`, checks its pointers, runs its body under
//! `catch_unwind` (a Rust panic becomes [`clink_error::CLINK_ERR_PANIC`], never an unwind
//! into C) and reports failures as negative [`clink_error`] codes, with a message for
//! [`clink_last_error`]. The header is generated from this crate by cbindgen
//! (`tests/header.rs` checks that the committed one is current; `CLINK_BLESS=1` rewrites
//! it).
//!
//! Ownership and threading rules common to every call are in the header's preamble
//! (`cbindgen.toml`); each function's comment adds its own.
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

use clink_rs::{Endpoint, PeerId, Selector};
use std::cell::{RefCell, UnsafeCell};
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod endpoint;
mod events;
mod launcher;
mod owner;
mod rma;
mod tagged;

pub use endpoint::*;
pub use events::*;
pub use launcher::*;
pub use rma::*;
pub use tagged::*;

/// Result codes of the C API: `CLINK_OK` (0) and `CLINK_AGAIN` (1, not an error) and the
/// negative `CLINK_ERR_*` errors. Functions return them as `int`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum clink_error {
    /// Success.
    CLINK_OK = 0,
    /// Not an error: a test found the request still pending, or a non-blocking poll
    /// (probe, next event, event post) found nothing or no room.
    CLINK_AGAIN = 1,
    /// A required pointer argument was NULL.
    CLINK_ERR_NULL = -1,
    /// An argument is invalid (bad aperture, tripwire, range, request of another endpoint,
    /// non-UTF-8 string, ...).
    CLINK_ERR_INVALID = -2,
    /// A system call failed.
    CLINK_ERR_IO = -3,
    /// A `CLINK_*` environment variable is unknown or has a bad value.
    CLINK_ERR_CONFIG = -4,
    /// A peer broke the protocol (its connection is dropped).
    CLINK_ERR_PROTOCOL = -5,
    /// An address string could not be parsed.
    CLINK_ERR_ADDRESS = -6,
    /// Connecting failed (unreachable, refused, timed out after `CLINK_CONNECT_TIMEOUT_MS`).
    CLINK_ERR_CONNECT = -7,
    /// The peer exited, was killed, closed or was disconnected.
    CLINK_ERR_PEER_DEAD = -8,
    /// No such peer on this endpoint.
    CLINK_ERR_UNKNOWN_PEER = -9,
    /// The message was longer than the receive buffer: the buffer holds its first bytes and
    /// the status's `len` its full length.
    CLINK_ERR_TRUNCATED = -10,
    /// A wait ran out of time; the request (if any) is still pending.
    CLINK_ERR_TIMEOUT = -11,
    /// The request was cancelled.
    CLINK_ERR_CANCELLED = -12,
    /// The request's result was already taken.
    CLINK_ERR_CONSUMED = -13,
    /// A size is outside what the operation supports.
    CLINK_ERR_TOO_LARGE = -14,
    /// The target of a one-sided access refused it (bad or revoked cookie, out of the
    /// window, missing right, misaligned atomic).
    CLINK_ERR_REFUSED = -15,
    /// The endpoint was used from a forked child: create a new context there.
    CLINK_ERR_FORKED = -16,
    /// The endpoint is in use: by another thread right now, or held by an in-place
    /// receive or a claimed send slot not yet released.
    CLINK_ERR_BUSY = -17,
    /// A Rust panic was caught inside the library; an endpoint it happened in is unusable
    /// from then on (every call returns this code; free it).
    CLINK_ERR_PANIC = -18,
    /// Not possible over this peer's transport (e.g. connection statistics of a
    /// shared-memory peer).
    CLINK_ERR_UNSUPPORTED = -19,
}

pub use clink_error::*;

/// Returns a static, NUL-terminated description of a result code (an unknown code gets
/// "unknown clink error code").
///
/// Thread safety: any thread. Ownership: the string is static; do not free it.
#[no_mangle]
pub extern "C" fn clink_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        0 => c"success",
        1 => c"not yet (pending, nothing there, or no room)",
        -1 => c"a required pointer argument was NULL",
        -2 => c"invalid argument",
        -3 => c"system call failed",
        -4 => c"bad configuration (CLINK_* environment variable)",
        -5 => c"protocol error from a peer",
        -6 => c"bad address",
        -7 => c"cannot connect",
        -8 => c"peer is gone (exited, killed, closed or disconnected)",
        -9 => c"unknown peer",
        -10 => c"message truncated",
        -11 => c"timed out",
        -12 => c"cancelled",
        -13 => c"request already completed and consumed",
        -14 => c"size outside what the operation supports",
        -15 => c"one-sided access refused",
        -16 => c"endpoint used after fork",
        -17 => c"endpoint busy (another thread, or an unreleased in-place receive or send slot)",
        -18 => c"internal panic caught (the endpoint is unusable)",
        -19 => c"not supported over this peer's transport",
        _ => c"unknown clink error code",
    };
    s.as_ptr()
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Returns the message of the last failing clink call on the calling thread (an empty
/// string before any failure). Successful calls leave it as it is.
///
/// Thread safety: thread-local, any thread. Ownership: the string belongs to the library
/// and stays valid until the next failing clink call on this thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn clink_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Returns the library version, a static NUL-terminated string such as "0.1.0".
///
/// Thread safety: any thread. Ownership: static; do not free it.
#[no_mangle]
pub extern "C" fn clink_version() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A failure on its way to C: a code and a message for `clink_last_error`.
pub(crate) struct Fail {
    code: clink_error,
    msg: String,
}

pub(crate) type R<T> = Result<T, Fail>;

impl Fail {
    pub(crate) fn new(code: clink_error, msg: impl Into<String>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }

    // Cold and out of line: the fast paths check their arguments without the message
    // formatting in their frames.
    #[cold]
    #[inline(never)]
    pub(crate) fn null(what: &str) -> Fail {
        Fail::new(CLINK_ERR_NULL, format!("{what} is NULL"))
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
        Fail::new(CLINK_ERR_INVALID, msg)
    }
}

/// The C code of a Rust error.
pub(crate) fn code_of(e: &clink_rs::Error) -> clink_error {
    use clink_rs::Error as E;
    match e {
        E::Io { .. } => CLINK_ERR_IO,
        // No launcher in the environment is a configuration matter for C callers.
        E::Config(_) | E::Launcher(_) => CLINK_ERR_CONFIG,
        E::Proto { .. } | E::Ring { .. } => CLINK_ERR_PROTOCOL,
        E::Address(_) => CLINK_ERR_ADDRESS,
        E::Connect { .. } => CLINK_ERR_CONNECT,
        E::PeerDead(_) => CLINK_ERR_PEER_DEAD,
        E::UnknownPeer(_) => CLINK_ERR_UNKNOWN_PEER,
        E::Truncated { .. } => CLINK_ERR_TRUNCATED,
        E::Timeout => CLINK_ERR_TIMEOUT,
        E::Cancelled => CLINK_ERR_CANCELLED,
        E::Consumed => CLINK_ERR_CONSUMED,
        E::TooLarge(_) => CLINK_ERR_TOO_LARGE,
        E::Refused { .. } => CLINK_ERR_REFUSED,
        E::Invalid(_) => CLINK_ERR_INVALID,
        E::Forked(_) => CLINK_ERR_FORKED,
    }
}

impl From<clink_rs::Error> for Fail {
    fn from(e: clink_rs::Error) -> Fail {
        Fail::new(code_of(&e), e.to_string())
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Runs the body of an exported function: its result code, or the code of its failure
/// (message recorded), or `CLINK_ERR_PANIC` for a panic (caught here, never unwound
/// into C).
#[inline(always)]
pub(crate) fn ffi(name: &str, f: impl FnOnce() -> R<c_int>) -> c_int {
    // The failure becomes its code inside the guard (see `with_ep`).
    catch_unwind(AssertUnwindSafe(|| code(name, f()))).unwrap_or_else(|p| panicked(name, p))
}

/// The C code of exported function `name`'s result (a failure's message recorded).
#[inline(always)]
fn code(name: &str, r: R<c_int>) -> c_int {
    match r {
        Ok(c) => c,
        Err(e) => failed(name, e),
    }
}

/// Records a failure of exported function `name` and returns its code. Out of line and
/// cold: the message formatting stays out of the fast paths' frames.
#[cold]
#[inline(never)]
fn failed(name: &str, e: Fail) -> c_int {
    set_last_error(&format!("{name}: {}", e.msg));
    e.code as c_int
}

/// Records a panic caught in exported function `name` (see [`failed`]).
#[cold]
#[inline(never)]
fn panicked(name: &str, p: Box<dyn std::any::Any + Send>) -> c_int {
    set_last_error(&format!("{name}: internal panic: {}", panic_message(&*p)));
    CLINK_ERR_PANIC as c_int
}

/// The C code for success.
pub(crate) const OK: c_int = CLINK_OK as c_int;
/// The C code for "not yet".
pub(crate) const AGAIN: c_int = CLINK_AGAIN as c_int;

/// A peer of an endpoint: a small integer, numbered from 0 in connection order.
pub type clink_peer_t = u32;

/// "Any peer" in a selector (and "unknown peer" in a truncated receive's status).
pub const CLINK_PEER_ANY: clink_peer_t = u32::MAX;
/// Selector mask: every tag bit must match.
pub const CLINK_TAG_MASK_EXACT: u64 = u64::MAX;
/// Selector mask: any tag matches.
pub const CLINK_TAG_MASK_ANY: u64 = 0;
/// Timeout value meaning "wait forever".
pub const CLINK_FOREVER: c_int = -1;

/// What a receive accepts: a message from `peer` (or any peer, `CLINK_PEER_ANY`) whose tag
/// satisfies `(msg_tag & mask) == (tag & mask)` (`mask` = `CLINK_TAG_MASK_EXACT` for
/// exactly `tag`, `CLINK_TAG_MASK_ANY` for any tag).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clink_selector_t {
    /// Source peer, or `CLINK_PEER_ANY`.
    pub peer: clink_peer_t,
    /// Wanted tag bits.
    pub tag: u64,
    /// Which tag bits must match.
    pub mask: u64,
}

impl clink_selector_t {
    pub(crate) fn to_rust(self) -> Selector {
        Selector {
            src: peer_opt(self.peer),
            tag: self.tag,
            mask: self.mask,
        }
    }
}

/// A selector for exactly `tag` from `peer` (`CLINK_PEER_ANY`: from any peer).
///
/// Thread safety: any thread (pure function).
#[no_mangle]
pub extern "C" fn clink_selector_exact(peer: clink_peer_t, tag: u64) -> clink_selector_t {
    clink_selector_t {
        peer,
        tag,
        mask: CLINK_TAG_MASK_EXACT,
    }
}

/// A selector for any tag from any peer.
///
/// Thread safety: any thread (pure function).
#[no_mangle]
pub extern "C" fn clink_selector_any() -> clink_selector_t {
    clink_selector_t {
        peer: CLINK_PEER_ANY,
        tag: 0,
        mask: CLINK_TAG_MASK_ANY,
    }
}

/// Who sent what: filled by completed receives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct clink_status_t {
    /// Sender.
    pub peer: clink_peer_t,
    /// Tag of the message.
    pub tag: u64,
    /// Length of the message in bytes (its full length, even when truncated).
    pub len: u64,
}

impl From<clink_rs::Status> for clink_status_t {
    fn from(s: clink_rs::Status) -> Self {
        clink_status_t {
            peer: s.peer.0,
            tag: s.tag,
            len: s.len,
        }
    }
}

pub(crate) fn peer_opt(p: clink_peer_t) -> Option<PeerId> {
    (p != CLINK_PEER_ANY).then_some(PeerId(p))
}

/// A C timeout in milliseconds: negative waits forever.
pub(crate) fn timeout(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Writes a receive's status through `p` when `p` is not NULL, field by field: the receive
/// has just written it, and a copy that read two of its fields in one wider load would
/// wait for those narrower stores to reach the cache.
#[inline(always)]
pub(crate) unsafe fn put_status(p: *mut clink_status_t, s: clink_rs::Status) {
    if !p.is_null() {
        // (Volatile: kept as three stores, each of a field read alone.)
        std::ptr::addr_of_mut!((*p).peer).write_volatile(s.peer.0);
        std::ptr::addr_of_mut!((*p).tag).write_volatile(s.tag);
        std::ptr::addr_of_mut!((*p).len).write_volatile(s.len);
    }
}

/// Writes `v` through `p` when `p` is not NULL.
pub(crate) unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        p.write(v);
    }
}

/// Checks an out pointer.
pub(crate) fn need_out<T>(p: *mut T, what: &str) -> R<()> {
    if p.is_null() {
        Err(Fail::null(what))
    } else {
        Ok(())
    }
}

/// A C byte range as a slice (`len` 0 allows NULL).
pub(crate) unsafe fn bytes<'a>(p: *const std::ffi::c_void, len: usize, what: &str) -> R<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Fail::null(what));
    }
    Ok(std::slice::from_raw_parts(p.cast(), len))
}

/// A C byte range as a mutable slice (`len` 0 allows NULL).
pub(crate) unsafe fn bytes_mut<'a>(
    p: *mut std::ffi::c_void,
    len: usize,
    what: &str,
) -> R<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Fail::null(what));
    }
    Ok(std::slice::from_raw_parts_mut(p.cast(), len))
}

/// An endpoint (`clink_endpoint_create`): listens for peers, connects to them, sends and
/// receives tagged messages, owns apertures and an event queue.
pub struct clink_endpoint_t {
    ep: UnsafeCell<Endpoint>,
    /// Claimed while a call runs on the endpoint, or while an in-place receive or a send
    /// slot borrows it: a second call meanwhile gets `CLINK_ERR_BUSY` instead of racing.
    pub(crate) owner: owner::Owner,
    /// A panic was caught in a call on this endpoint: its state may be inconsistent.
    poisoned: AtomicBool,
    address: CString,
}

// SAFETY: the endpoint is `Send`; concurrent access is excluded by the claim (`owner`),
// so sharing the handle between threads never gives two threads the endpoint at once.
unsafe impl Sync for clink_endpoint_t {}

impl clink_endpoint_t {
    pub(crate) fn new(ep: Endpoint) -> clink_endpoint_t {
        let address = CString::new(ep.address()).unwrap_or_default();
        clink_endpoint_t {
            ep: UnsafeCell::new(ep),
            owner: owner::Owner::default(),
            poisoned: AtomicBool::new(false),
            address,
        }
    }

    /// Takes the endpoint for one call (or a borrow that outlives the call).
    #[inline(always)]
    pub(crate) fn lock(&self) -> R<()> {
        match self.owner.claim() {
            Ok(()) => Ok(()),
            Err(r) => Err(self.refused(r)),
        }
    }

    /// Why a claim was refused. A poisoned endpoint keeps its claim forever (see
    /// [`clink_endpoint_t::poison`]), so only refused calls need to look at the flag.
    #[cold]
    #[inline(never)]
    pub(crate) fn refused(&self, r: owner::Refused) -> Fail {
        if self.poisoned.load(Ordering::Acquire) {
            return Fail::new(
                CLINK_ERR_PANIC,
                "an earlier call on this endpoint panicked; free it",
            );
        }
        busy(r)
    }

    /// Marks the endpoint unusable after a panic in a call that held its claim: the claim
    /// is never given back, so every later call is refused with `CLINK_ERR_PANIC`
    /// (`clink_endpoint_free` still frees it).
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    pub(crate) fn unlock(&self) {
        self.owner.release();
    }

    /// The endpoint itself; the caller holds the lock.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get(&self) -> &mut Endpoint {
        &mut *self.ep.get()
    }

    /// An identity for requests: which endpoint they belong to.
    pub(crate) fn key(&self) -> usize {
        self as *const _ as usize
    }
}

/// The error of a refused claim.
#[cold]
#[inline(never)]
fn busy(r: owner::Refused) -> Fail {
    match r {
        owner::Refused::Busy => Fail::new(
            CLINK_ERR_BUSY,
            "endpoint in use by another thread, or held by an in-place receive or a send slot",
        ),
        owner::Refused::OtherThread => Fail::new(
            CLINK_ERR_BUSY,
            "endpoint bound to another thread (clink_endpoint_bind_thread)",
        ),
    }
}

/// The endpoint behind a C pointer.
pub(crate) unsafe fn ep_ref<'a>(ep: *const clink_endpoint_t) -> R<&'a clink_endpoint_t> {
    ep.as_ref().ok_or_else(|| Fail::null("endpoint"))
}

/// Runs `f` on the endpoint behind `ep` as exported function `name`, returning its code.
#[inline(always)]
pub(crate) unsafe fn with_ep(
    name: &str,
    ep: *const clink_endpoint_t,
    f: impl FnOnce(&mut Endpoint, &clink_endpoint_t) -> R<c_int>,
) -> c_int {
    // One unwinding guard for the whole call (as `ffi` and `run` together: a panic
    // poisons the endpoint and returns `CLINK_ERR_PANIC`), the fast paths' only one.
    let Some(h) = ep.as_ref() else {
        return failed(name, Fail::null("endpoint"));
    };
    if let Err(e) = h.lock() {
        return failed(name, e);
    }
    // A failure becomes its code inside the guard, so that only the code crosses it: a
    // whole result would cross through memory, written in pieces narrower than the load
    // that takes it back, which waits for them to reach the cache (on every call).
    // SAFETY: locked: no other call has the endpoint.
    match catch_unwind(AssertUnwindSafe(|| code(name, f(unsafe { h.get() }, h)))) {
        Ok(c) => {
            h.unlock();
            c
        }
        Err(p) => {
            h.poison();
            panicked(name, p)
        }
    }
}

/// A C string argument as UTF-8.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> R<&'a str> {
    if p.is_null() {
        return Err(Fail::null(what));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| Fail::invalid(format!("{what} is not UTF-8")))
}
