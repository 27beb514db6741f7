//! Thin, safe wrappers over the Linux system calls clink needs: through rustix where it
//! has the call (descriptors, memory files and mappings, the clock, futexes, eventfds,
//! process ids, locks, most socket calls), through nix where only it has a safe one (the
//! interface list, cross-memory copies), else hand-written over libc, each `unsafe` block
//! with its reason: memory, descriptors and libraries the kernel or another process shares
//! with us. (The crate's other `unsafe`: leases of lent memory, the shared-memory ring and
//! board, the event queue; ARCHITECTURE.md, "Where unsafe lives".)

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

mod epoll;
mod net;
pub mod packet;
pub mod pmix;
mod seqpacket;
mod tether;
pub mod udp;

pub use epoll::Epoll;
pub use net::{
    interfaces, send_pieces, send_vectored, tcp_acks, tcp_listen, tcp_wire_bytes, Iface, SockAddr,
    TcpAcks, TcpConnecting, MAX_PIECES,
};
pub use seqpacket::{poll_readable, PeerCred, SeqPacket};
pub use tether::Tether;

pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `setsockopt(2)` with a value of any plain type (an int, a struct the option takes).
pub(crate) fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: a pointer to a live `T` and its size; the kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// The monotonic clock (`CLOCK_MONOTONIC`, the one `Instant` reads) in nanoseconds: the
/// network connections read it a few times per message, and going through `Instant` and
/// `Duration` added a checked subtraction and a 128-bit conversion to each reading.
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Fills `buf` from the kernel's random source.
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    getrandom::getrandom(buf).map_err(|e| io::Error::other(e.to_string()))
}

/// A random u128 (identities, names, keys).
pub fn random_u128() -> io::Result<u128> {
    let mut b = [0u8; 16];
    random_bytes(&mut b)?;
    Ok(u128::from_le_bytes(b))
}

/// Creates an anonymous memory file of `len` bytes, sealed against shrinking and growing so
/// a peer cannot make our mapping fault (SIGBUS) by truncating it.
pub fn memfd_sealed(name: &str, len: usize) -> io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

/// Checks that a memory file received from a peer is at least `len` bytes and sealed
/// against shrinking (so mapping it cannot fault later).
pub fn check_peer_memfd(fd: &OwnedFd, len: usize) -> io::Result<()> {
    let seals = rustix::fs::fcntl_get_seals(fd)?;
    if !seals.contains(rustix::fs::SealFlags::SHRINK) {
        return Err(io::Error::other(
            "peer segment is not sealed against shrinking",
        ));
    }
    let size = fd_size(fd)?;
    if size < len as u64 {
        return Err(io::Error::other(format!(
            "peer segment has {size} bytes, protocol needs {len}"
        )));
    }
    Ok(())
}

/// `epoll_pwait2` is missing or refused here: waits use `epoll_wait` (milliseconds).
static NO_PWAIT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A shared mapping of a memory file; unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; concurrent access is governed by the ring protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above; the handle itself is immutable after creation.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The mapped bytes as a lease (held while the mapping lives: its owner keeps it).
    pub fn lease(&self) -> crate::lease::Dst {
        // SAFETY: the whole mapping, valid until it is unmapped on drop; the holder keeps
        // the mapping alive while it uses the lease.
        unsafe { crate::lease::Dst::new(self.ptr.as_ptr(), self.len) }
    }

    /// Maps `len` bytes of `fd` read-write, shared.
    pub fn new(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags};
        Self::with_flags(
            fd,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::empty(),
        )
    }

    /// Maps `len` bytes of `fd` read-only, shared (the fd may be read-only).
    pub fn new_read_only(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags};
        Self::with_flags(fd, len, ProtFlags::READ, MapFlags::empty())
    }

    /// As [`Mapping::new`], with every page allocated and mapped now (MAP_POPULATE): for
    /// rings, whose first pass would otherwise take a page fault on each side every 64
    /// cells, in the middle of the traffic.
    pub fn new_populated(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags};
        Self::with_flags(
            fd,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::POPULATE,
        )
    }

    fn with_flags(
        fd: &OwnedFd,
        len: usize,
        prot: rustix::mm::ProtFlags,
        flags: rustix::mm::MapFlags,
    ) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel chooses (nothing else is
        // there); fd is valid.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                rustix::mm::MapFlags::SHARED | flags,
                fd,
                0,
            )?
        };
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }
    /// Base address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Length in bytes (never zero).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `len` bytes from `off` lie inside the mapping.
    fn inside(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `data` to `off` (plain stores: other processes may access the bytes at the
    /// same time, so no Rust reference to them is ever made); false when outside.
    pub fn copy_in(&self, off: usize, data: &[u8]) -> bool {
        if !self.inside(off, data.len()) {
            return false;
        }
        // SAFETY: in bounds (checked); the source is a distinct local slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(off), data.len()) };
        true
    }

    /// Copies the bytes at `off` into `buf` (plain loads); false when outside.
    pub fn copy_out(&self, off: usize, buf: &mut [u8]) -> bool {
        if !self.inside(off, buf.len()) {
            return false;
        }
        // SAFETY: in bounds (checked); the destination is a distinct local slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr().add(off), buf.as_mut_ptr(), buf.len()) };
        true
    }

    /// The 64-bit word at `off`, for atomic access; `None` when outside or misaligned.
    pub fn word(&self, off: usize) -> Option<&AtomicU64> {
        if !self.inside(off, 8) || !(self.ptr() as usize + off).is_multiple_of(8) {
            return None;
        }
        // SAFETY: aligned and in bounds (checked), live while `self` is; shared memory is
        // only accessed atomically or by raw copies.
        Some(unsafe { AtomicU64::from_ptr(self.ptr().add(off).cast()) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped; nothing borrows it past the owner.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A non-blocking eventfd used as a doorbell.
pub fn eventfd() -> io::Result<OwnedFd> {
    use rustix::event::EventfdFlags;
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
    )?)
}

/// Rings a doorbell (adds 1 to an eventfd). Doorbells are watched edge-triggered and
/// never read back; the 64-bit counter would take centuries to fill.
pub fn ring_doorbell(fd: BorrowedFd<'_>) {
    // A full counter (EAGAIN) already means "awake".
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// What [`futex_wait`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum FutexWait {
    /// Woken, or the word no longer held the value (or a signal): re-check.
    Woken,
    /// Nothing within the timeout.
    TimedOut,
}

/// Sleeps while `word` holds `expected`, at most `timeout` (a futex shared between
/// processes: the word may live in a mapping another process wakes it through).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> io::Result<FutexWait> {
    use rustix::thread::futex;
    let ts = futex::Timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Not private: the word may live in memory another process maps.
    match futex::wait(word, futex::Flags::empty(), expected, Some(&ts)) {
        Ok(()) => Ok(FutexWait::Woken),
        Err(rustix::io::Errno::TIMEDOUT) => Ok(FutexWait::TimedOut),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(FutexWait::Woken),
        Err(e) => Err(e.into()),
    }
}

/// Wakes one sleeper of [`futex_wait`] on `word` (if any).
pub fn futex_wake(word: &AtomicU32) {
    let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), 1);
}

/// Returns this process's uid.
pub fn getuid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// This process's effective uid.
pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Copies `dst.len()` bytes from address `remote` in process `pid` into `dst` with
/// process_vm_readv (one copy, no staging).
pub fn cma_read(pid: i32, remote: u64, dst: &mut [u8]) -> io::Result<()> {
    cma(remote, dst.len(), |done, n, rem| {
        let local = &mut [io::IoSliceMut::new(&mut dst[done..done + n])];
        nix::sys::uio::process_vm_readv(nix::unistd::Pid::from_raw(pid), local, rem)
    })
}

/// Copies `src` to address `remote` in process `pid` with process_vm_writev (the
/// same-host copy engine writing a get's answer into the initiator's buffer).
pub fn cma_write(pid: i32, remote: u64, src: &[u8]) -> io::Result<()> {
    cma(remote, src.len(), |done, n, rem| {
        let local = &[io::IoSlice::new(&src[done..done + n])];
        nix::sys::uio::process_vm_writev(nix::unistd::Pid::from_raw(pid), local, rem)
    })
}

/// One CMA copy of `len` bytes at `remote` in another process, looping over partial
/// transfers: `copy(done, n, remote piece)` moves up to `n` bytes from offset `done`.
/// The kernel checks the remote side against the peer's address space.
fn cma(
    remote: u64,
    len: usize,
    mut copy: impl FnMut(usize, usize, &[nix::sys::uio::RemoteIoVec]) -> nix::Result<usize>,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // Bounded pieces keep each call's latency (and the time the peer can't be served)
        // reasonable and stay under the kernel's per-call limits.
        let n = (len - done).min(1 << 30);
        let rem = nix::sys::uio::RemoteIoVec {
            base: (remote as usize).wrapping_add(done),
            len: n,
        };
        let r = copy(done, n, &[rem])?;
        if r == 0 {
            return Err(io::Error::other("cross-memory copy made no progress"));
        }
        done += r;
    }
    Ok(())
}

/// A read-only descriptor of the same memory file (opened through /proc/self/fd), so a
/// peer given it cannot map the memory writable.
pub fn reopen_read_only(fd: &OwnedFd) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(rustix::fs::open(
        path.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Size of a memory file in bytes.
pub fn fd_size(fd: &OwnedFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// Hints the CPU to fetch the cache line at `p` for writing (never faults, changes
/// nothing).
#[inline]
pub fn prefetch_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// This process's id (used only for fork detection and CMA, never as an identity).
pub fn getpid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// Makes the child `cmd` starts receive SIGKILL when the thread that started it dies
/// (`PR_SET_PDEATHSIG`, set between fork and exec): benchmark and test children never
/// outlive a killed parent.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook only makes one system call (prctl, async-signal-safe) and touches
    // no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let kill = rustix::process::Signal::KILL;
            Ok(rustix::process::set_parent_process_death_signal(Some(
                kill,
            ))?)
        });
    }
}

/// Reaps `child` if it has exited (`wait4` with `WNOHANG`), with the CPU seconds (user
/// and system, all its threads) it used, which `std`'s `try_wait` drops. `None` while it
/// runs. Call it only for a child not reaped yet.
pub fn try_reap(
    child: &std::process::Child,
) -> io::Result<Option<(std::process::ExitStatus, f64)>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is the caller's unreaped child; both out-pointers are valid.
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
    match r {
        0 => Ok(None),
        r if r == pid => {
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            Ok(Some((
                std::process::ExitStatus::from_raw(status),
                secs(ru.ru_utime) + secs(ru.ru_stime),
            )))
        }
        _ => Err(io::Error::last_os_error()),
    }
}

/// An exclusive `flock` on a file, released when dropped.
pub struct FileLock {
    fd: OwnedFd,
}

impl FileLock {
    /// Takes the lock on `path` (created 0600 if missing), waiting up to `wait`; `None`
    /// if it cannot be opened or stays held that long.
    pub fn acquire(path: &std::path::Path, wait: std::time::Duration) -> Option<FileLock> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .ok()?;
        let fd: OwnedFd = f.into();
        let end = std::time::Instant::now() + wait;
        loop {
            let lock = rustix::fs::FlockOperation::NonBlockingLockExclusive;
            if rustix::fs::flock(&fd, lock).is_ok() {
                return Some(FileLock { fd });
            }
            if std::time::Instant::now() >= end {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // (Closing the descriptor would unlock it too.)
        let _ = rustix::fs::flock(&self.fd, rustix::fs::FlockOperation::Unlock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn a_futex_wait_ends_on_a_wake_a_changed_word_or_its_timeout() {
        let word = Arc::new(AtomicU32::new(2));
        // A word that no longer holds the value: back at once.
        assert_eq!(
            futex_wait(&word, 1, Duration::from_secs(5)).unwrap(),
            FutexWait::Woken
        );
        assert_eq!(
            futex_wait(&word, 2, Duration::from_millis(1)).unwrap(),
            FutexWait::TimedOut
        );
        // Woken from another thread, which clears the word first (as a producer does).
        let w = word.clone();
        let waker = std::thread::spawn(move || {
            while w.load(Ordering::SeqCst) != 3 {
                std::hint::spin_loop();
            }
            w.store(0, Ordering::SeqCst);
            futex_wake(&w);
        });
        word.store(3, Ordering::SeqCst);
        while word.load(Ordering::SeqCst) == 3 {
            assert_eq!(
                futex_wait(&word, 3, Duration::from_secs(5)).unwrap(),
                FutexWait::Woken,
                "timed out instead of being woken"
            );
        }
        waker.join().unwrap();
    }
}
