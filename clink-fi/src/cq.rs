//! Completion queues. Manual progress: reading an empty queue first drives every endpoint
//! bound to it (their clink progress and completion events), then hands out what they
//! queued.

use crate::abi::*;
use crate::ep::EpShared;
use crate::lock::{DomainLock, Guard};
use crate::{fid_ops, guard, no_bind, no_control};
use clink_proto::spin::SpinGate;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A failed operation, as `fi_cq_readerr` reports it.
#[derive(Clone, Copy)]
pub struct Failure {
    /// The completion fields (context, flags, length, tag).
    pub entry: fi_cq_tagged_entry,
    /// Bytes that did not fit (`FI_ETRUNC`).
    pub olen: usize,
    /// Positive libfabric error code.
    pub err: c_int,
}

/// Completed operations waiting to be read.
#[derive(Default)]
pub struct Queue {
    ok: VecDeque<(fi_cq_tagged_entry, u64)>,
    failed: VecDeque<Failure>,
}

impl Queue {
    fn len(&self) -> usize {
        self.ok.len() + self.failed.len()
    }
}

// SAFETY: the raw pointers are the application's contexts and buffers, only handed back.
unsafe impl Send for Queue {}

/// The part of a completion queue its endpoints hold.
pub struct CqShared {
    /// Entry format (`FI_CQ_FORMAT_*`).
    format: c_int,
    queue: DomainLock<Queue>,
    /// How many entries `queue` holds, written under its lock: a read finding nothing
    /// skips the lock (an atomic read-modify-write costs more than the rest of an idle
    /// read on the machines measured).
    queued: AtomicUsize,
    /// The endpoints bound to it (each removes itself when it closes).
    eps: DomainLock<Vec<Arc<EpShared>>>,
    /// Whether blocking reads spin before they sleep.
    gate: SpinGate,
}

impl CqShared {
    /// Queues a completion with its source address (`FI_ADDR_NOTAVAIL` if unknown).
    pub fn push(&self, e: fi_cq_tagged_entry, src: u64) {
        let mut q = self.lock();
        q.ok.push_back((e, src));
        self.queued.store(q.len(), Ordering::Release);
    }

    /// Queues a failure.
    pub fn fail(&self, f: Failure) {
        let mut q = self.lock();
        q.failed.push_back(f);
        self.queued.store(q.len(), Ordering::Release);
    }

    fn lock(&self) -> Guard<'_, Queue> {
        self.queue.lock()
    }

    /// The oldest failure, taken.
    fn pop_failure(&self) -> Option<Failure> {
        let mut q = self.lock();
        let f = q.failed.pop_front();
        self.queued.store(q.len(), Ordering::Release);
        f
    }

    /// Registers an endpoint whose progress reading this queue drives.
    pub fn attach(&self, ep: &Arc<EpShared>) {
        let mut eps = self.eps.lock();
        if !eps.iter().any(|e| Arc::ptr_eq(e, ep)) {
            eps.push(ep.clone());
        }
    }

    /// Forgets a closing endpoint.
    pub fn detach(&self, ep: &Arc<EpShared>) {
        self.eps.lock().retain(|e| !Arc::ptr_eq(e, ep));
    }

    /// Sleeps until one of the bound endpoints may have something, at most `limit`: their
    /// file descriptors armed (`Endpoint::prepare_wait`) and polled. Returns at once when
    /// one has work already.
    fn sleep(&self, limit: Duration) {
        let eps: Vec<Arc<EpShared>> = self.eps.lock().clone();
        let mut fds = Vec::new();
        let mut armed = 0;
        for ep in &eps {
            if !ep.prepare_wait(&mut fds) {
                break;
            }
            armed += 1;
        }
        if armed == eps.len() && !fds.is_empty() {
            let mut p: Vec<libc::pollfd> = fds
                .iter()
                .map(|&fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let ms = limit.as_millis().clamp(1, i32::MAX as u128) as c_int;
            // SAFETY: `p` holds `p.len()` initialised pollfds for the call.
            unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        }
        for ep in &eps[..armed] {
            ep.finish_wait();
        }
    }

    /// Drives the endpoints, holding the list (binds and closes wait meanwhile).
    fn progress(&self) {
        for ep in self.eps.lock().iter() {
            ep.progress();
        }
    }

    fn entry_size(&self) -> usize {
        match self.format {
            FI_CQ_FORMAT_CONTEXT => 8,
            FI_CQ_FORMAT_MSG => 24,
            FI_CQ_FORMAT_DATA => 40,
            _ => std::mem::size_of::<fi_cq_tagged_entry>(),
        }
    }

    /// Moves up to `count` completions into `buf` (and their sources into `src`).
    unsafe fn read(&self, buf: *mut c_void, count: usize, src: *mut u64) -> isize {
        // Progress only when there is nothing to hand out: a read that finds completions
        // returns them at once (a send's, queued when its message went into a peer's ring,
        // costs no pass), and the reads that empty the queue drive the endpoints.
        if self.queued.load(Ordering::Acquire) == 0 {
            self.progress();
            if self.queued.load(Ordering::Acquire) == 0 {
                return crate::err(FI_EAGAIN);
            }
        }
        let mut q = self.lock();
        if !q.failed.is_empty() {
            return crate::err(FI_EAVAIL);
        }
        let size = self.entry_size();
        let mut n = 0;
        while n < count {
            let Some((e, from)) = q.ok.pop_front() else {
                break;
            };
            // SAFETY: the caller's buffer holds `count` entries of the queue's format (a
            // prefix of the tagged entry's layout), and `src` `count` addresses if given.
            unsafe {
                let to = (buf as *mut u8).add(n * size);
                if size == std::mem::size_of::<fi_cq_tagged_entry>() {
                    // The tagged format (Open MPI's): one fixed-size store, no copy call.
                    std::ptr::write_unaligned(to as *mut fi_cq_tagged_entry, e);
                } else {
                    std::ptr::copy_nonoverlapping(
                        &e as *const fi_cq_tagged_entry as *const u8,
                        to,
                        size,
                    );
                }
                if !src.is_null() {
                    *src.add(n) = from;
                }
            }
            n += 1;
        }
        self.queued.store(q.len(), Ordering::Release);
        if n == 0 {
            crate::err(FI_EAGAIN)
        } else {
            n as isize
        }
    }
}

/// The completion queue object.
#[repr(C)]
pub struct Cq {
    fid: fid_cq,
    /// What endpoints bind to.
    pub shared: Arc<CqShared>,
}

static CQ_FID_OPS: fi_ops = fid_ops(cq_close, no_bind, no_control);
static CQ_OPS: fi_ops_cq = fi_ops_cq {
    size: std::mem::size_of::<fi_ops_cq>(),
    read,
    readfrom,
    readerr,
    sread,
    sreadfrom,
    signal: crate::enosys,
    strerror,
};

pub unsafe extern "C" fn cq_open(
    domain: *mut fid_domain,
    attr: *mut fi_cq_attr,
    out: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `attr` NULL or valid.
        let a = unsafe { attr.as_ref() };
        let format = match a.map_or(FI_CQ_FORMAT_UNSPEC, |a| a.format) {
            FI_CQ_FORMAT_UNSPEC => FI_CQ_FORMAT_TAGGED,
            f @ (FI_CQ_FORMAT_CONTEXT | FI_CQ_FORMAT_MSG | FI_CQ_FORMAT_DATA
            | FI_CQ_FORMAT_TAGGED) => f,
            _ => return -FI_ENOSYS,
        };
        if let Some(a) = a {
            if a.wait_obj != FI_WAIT_NONE && a.wait_obj != FI_WAIT_UNSPEC {
                return -FI_ENOSYS; // no file descriptor or wait set to hand out
            }
        }
        let threading = if domain.is_null() {
            FI_THREAD_SAFE
        } else {
            // SAFETY: an open domain of ours.
            unsafe { crate::fabric::domain_ref(domain) }.threading
        };
        let cq = Box::new(Cq {
            fid: fid_cq {
                fid: fid {
                    fclass: FI_CLASS_CQ,
                    context,
                    ops: &CQ_FID_OPS,
                },
                ops: &CQ_OPS,
            },
            shared: Arc::new(CqShared {
                format,
                queue: DomainLock::new(threading, Queue::default()),
                queued: AtomicUsize::new(0),
                eps: DomainLock::new(threading, Vec::new()),
                gate: SpinGate::new(),
            }),
        });
        // SAFETY: `out` checked above.
        unsafe { *out = Box::into_raw(cq) as *mut fid_cq };
        0
    })
}

/// The shared part of a completion queue of this provider.
///
/// # Safety
/// `f` must be an open completion queue of this provider.
pub unsafe fn shared_of(f: *mut fid) -> Arc<CqShared> {
    // SAFETY: per the contract.
    unsafe { (*(f as *mut Cq)).shared.clone() }
}

/// The shared part of an open queue, borrowed for the length of a call on it (the data
/// path takes no reference count).
///
/// # Safety
/// `f` must be an open completion queue of this provider, and stay open meanwhile.
unsafe fn shared_ref<'a>(f: *mut fid) -> &'a CqShared {
    // SAFETY: per the contract.
    unsafe { &(*(f as *mut Cq)).shared }
}

unsafe extern "C" fn cq_close(f: *mut fid) -> c_int {
    // SAFETY: a queue this provider opened.
    drop(unsafe { Box::from_raw(f as *mut Cq) });
    0
}

unsafe extern "C" fn read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: an open queue of ours; the buffer per libfabric's contract.
    guard(|| unsafe { shared_ref(cq as *mut fid).read(buf, count, std::ptr::null_mut()) })
}

unsafe extern "C" fn readfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
) -> isize {
    // SAFETY: as `read`.
    guard(|| unsafe { shared_ref(cq as *mut fid).read(buf, count, src) })
}

unsafe extern "C" fn readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, _flags: u64) -> isize {
    guard(|| {
        // SAFETY: an open queue of ours.
        let s = unsafe { shared_ref(cq as *mut fid) };
        let Some(f) = s.pop_failure() else {
            return crate::err(FI_EAGAIN);
        };
        // SAFETY: `buf` is the caller's error entry.
        unsafe {
            let b = &mut *buf;
            b.op_context = f.entry.op_context;
            b.flags = f.entry.flags;
            b.len = f.entry.len;
            b.buf = f.entry.buf;
            b.data = 0;
            b.tag = f.entry.tag;
            b.olen = f.olen;
            b.err = f.err;
            b.prov_errno = f.err;
            // No provider error data: a size of 0 says so whatever the caller lent.
            b.err_data_size = 0;
        }
        1
    })
}

/// Slices of a blocking read's sleep: a bound on how late a network retransmission timer
/// (which wakes no file descriptor) is served while the application sleeps here.
const SLEEP_SLICE: u64 = 10_000_000;

/// Reads of the queue a blocking read makes before it sleeps, while the queue's spin gate
/// is open.
const SPIN_POLLS: u32 = 1000;

/// Two empty reads this far apart (ns): the thread was off its CPU in between (a thousand
/// reads take tens of microseconds), and what came meanwhile came because it was.
const SPIN_GAP: u64 = 200_000;

/// Nanoseconds on a monotonic clock (from the first call).
fn now_ns() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The waiting of a blocking read: `poll` until it answers (true), spinning first while
/// `gate` is open, then sleeping (`sleep(at most ns)`) between polls; false when `timeout`
/// (ns) runs out first. `now` reads the clock. A spin that gets its answer is a hit; one
/// that runs out, or that got its answer only after losing its CPU, a miss (the gate closes
/// after several: two threads on one CPU, where a spinning reader keeps the peer that
/// would answer from running).
fn wait_for(
    gate: &SpinGate,
    timeout: Option<u64>,
    now: impl Fn() -> u64,
    mut poll: impl FnMut() -> bool,
    mut sleep: impl FnMut(u64),
) -> bool {
    let start = now();
    let deadline = timeout.map(|t| start.saturating_add(t));
    let mut spin = !gate.maybe_closed() || gate.open(start);
    let (mut idle, mut idle_at, mut lost_cpu) = (0u32, None::<u64>, false);
    loop {
        if poll() {
            if spin && idle > 0 {
                if lost_cpu {
                    gate.miss(now());
                } else {
                    gate.hit();
                }
            }
            return true;
        }
        let t = now();
        if deadline.is_some_and(|d| t >= d) {
            return false;
        }
        idle += 1;
        if spin {
            if idle_at
                .replace(t)
                .is_some_and(|a| t.saturating_sub(a) >= SPIN_GAP)
            {
                lost_cpu = true;
            }
            if idle <= SPIN_POLLS {
                std::hint::spin_loop();
                continue;
            }
            gate.miss(t);
            spin = false;
        }
        sleep(deadline.map_or(SLEEP_SLICE, |d| d - t).min(SLEEP_SLICE));
    }
}

/// Blocking read: polls (with progress), then sleeps on the bound endpoints' file
/// descriptors, until a completion, a failure or the timeout.
unsafe fn sread_until(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    timeout_ms: c_int,
) -> isize {
    // SAFETY: an open queue of ours.
    let s = unsafe { shared_of(cq as *mut fid) };
    let timeout = (timeout_ms >= 0).then(|| timeout_ms as u64 * 1_000_000);
    let mut r = crate::err(FI_EAGAIN);
    wait_for(
        &s.gate,
        timeout,
        now_ns,
        || {
            // SAFETY: the caller's buffers.
            r = unsafe { s.read(buf, count, src) };
            r != crate::err(FI_EAGAIN)
        },
        |ns| s.sleep(Duration::from_nanos(ns)),
    );
    r
}

unsafe extern "C" fn sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: forwarded.
    guard(|| unsafe { sread_until(cq, buf, count, std::ptr::null_mut(), timeout) })
}

unsafe extern "C" fn sreadfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: forwarded.
    guard(|| unsafe { sread_until(cq, buf, count, src, timeout) })
}

unsafe extern "C" fn strerror(
    _cq: *mut fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let text = match prov_errno {
        FI_ETRUNC => "message longer than the receive buffer (truncated)\0",
        FI_ECANCELED => "operation cancelled\0",
        FI_ENOMSG => "no message matched the peek\0",
        FI_EIO => "the peer failed or closed the connection\0",
        _ => "clink provider error\0",
    };
    if !buf.is_null() && len > 0 {
        let n = (len - 1).min(text.len() - 1);
        // SAFETY: `buf` has `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buf, n);
            *buf.add(n) = 0;
        }
        return buf;
    }
    text.as_ptr() as *const c_char
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Blocking reads against a simulated peer: each read costs 100 ns; the answer comes
    /// `after` ns after the wait starts if the peer has a CPU of its own (`own_cpu`), else
    /// only once the reader sleeps (one CPU: the spinning reader keeps it from running).
    /// Returns (reads made, sleeps) over `waits` waits.
    fn waits(gate: &SpinGate, waits: u32, own_cpu: bool, after: u64) -> (u64, u64) {
        let clock = Cell::new(0u64);
        let (mut reads, mut sleeps) = (0u64, 0u64);
        for _ in 0..waits {
            let ready_at = Cell::new(if own_cpu {
                clock.get() + after
            } else {
                u64::MAX
            });
            let got = wait_for(
                gate,
                Some(1_000_000_000),
                || clock.get(),
                || {
                    reads += 1;
                    clock.set(clock.get() + 100);
                    clock.get() >= ready_at.get()
                },
                |max| {
                    sleeps += 1;
                    // The peer runs while the reader sleeps and answers at once.
                    clock.set(clock.get() + max.min(5_000));
                    ready_at.set(clock.get());
                },
            );
            assert!(got, "every wait is answered");
        }
        (reads, sleeps)
    }

    #[test]
    fn reads_on_one_cpu_stop_spinning() {
        let gate = SpinGate::new();
        let (reads, sleeps) = waits(&gate, 200, false, 0);
        // Without the gate every wait spins its thousand reads in vain.
        assert!(reads < 10 * (SPIN_POLLS as u64 + 2), "{reads} reads");
        assert_eq!(sleeps, 200);
        assert!(gate.counts().1 >= 1, "the gate closed");
    }

    #[test]
    fn reads_answered_within_the_spin_never_sleep() {
        let gate = SpinGate::new();
        let (reads, sleeps) = waits(&gate, 200, true, 3_000);
        assert_eq!(sleeps, 0);
        assert_eq!(gate.counts(), (0, 0));
        assert!(reads >= 200 * 30, "{reads} reads");
    }

    #[test]
    fn a_timeout_ends_the_wait() {
        let gate = SpinGate::new();
        let clock = Cell::new(0u64);
        let got = wait_for(
            &gate,
            Some(1_000_000),
            || clock.get(),
            || {
                clock.set(clock.get() + 100);
                false
            },
            |max| clock.set(clock.get() + max),
        );
        assert!(!got && clock.get() >= 1_000_000);
    }
}
