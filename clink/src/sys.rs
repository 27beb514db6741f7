//! Thin, safe wrappers over the Linux system calls clink needs, each `unsafe` block with its
//! reason. (Other `unsafe` lives next to the memory it touches: the shared-memory ring and
//! board, the UDP socket's vectored calls and speculative placement, aperture memory.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

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

fn cvt_isize(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// The monotonic clock (`CLOCK_MONOTONIC`, the one `Instant` reads) in nanoseconds: the
/// network connections read it a few times per message, and going through `Instant` and
/// `Duration` added a checked subtraction and a 128-bit conversion to each reading.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: an out-pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
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
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::other("memfd name has NUL"))?;
    // SAFETY: cname is a valid C string; flags are constants.
    let fd = cvt(unsafe {
        libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on an fd we own.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
    // SAFETY: as above; the seals are constants.
    cvt(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    })?;
    Ok(fd)
}

/// Checks that a memory file received from a peer is at least `len` bytes and sealed
/// against shrinking (so mapping it cannot fault later).
pub fn check_peer_memfd(fd: &OwnedFd, len: usize) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own.
    let seals = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    if seals & libc::F_SEAL_SHRINK == 0 {
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
    /// Maps `len` bytes of `fd` read-write, shared.
    pub fn new(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Self::with_flags(fd, len, libc::PROT_READ | libc::PROT_WRITE, 0)
    }

    /// Maps `len` bytes of `fd` read-only, shared (the fd may be read-only).
    pub fn new_read_only(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Self::with_flags(fd, len, libc::PROT_READ, 0)
    }

    /// As [`Mapping::new`], with every page allocated and mapped now (MAP_POPULATE): for
    /// rings, whose first pass would otherwise take a page fault on each side every 64
    /// cells, in the middle of the traffic.
    pub fn new_populated(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Self::with_flags(
            fd,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_POPULATE,
        )
    }

    fn with_flags(
        fd: &OwnedFd,
        len: usize,
        prot: libc::c_int,
        flags: libc::c_int,
    ) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; fd is valid and len non-zero.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED | flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
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
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped; nothing borrows it past the owner.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A non-blocking eventfd used as a doorbell.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: fresh fd owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Rings a doorbell (adds 1 to an eventfd). Doorbells are watched edge-triggered and
/// never read back; the 64-bit counter would take centuries to fill.
pub fn ring_doorbell(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64. A full counter (EAGAIN) already means "awake".
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// One end of a peer pair's bell: a Unix stream socket pair whose two ends the two
/// processes hold, over which each rings the other by writing a byte. A receiver waiting
/// for one peer only blocks in a read of it instead of in `epoll_wait` (see
/// ARCHITECTURE.md, "Waiting": measured here, the shared stream pair wakes a
/// cross-CPU ping-pong 2-4 us sooner than an eventfd through epoll).
pub struct Bell {
    fd: OwnedFd,
    /// The receive timeout last set (`SO_RCVTIMEO`), to skip a system call per sleep.
    timeout: Option<Duration>,
}

/// What a wait on a [`Bell`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum BellWait {
    /// Rung (or stale rings were pending: the caller re-checks either way).
    Rang,
    /// Nothing within the timeout.
    TimedOut,
    /// The other end is closed: the peer is gone.
    HungUp,
}

impl Bell {
    /// A connected pair: keep one end, send the other to the peer.
    pub fn pair() -> io::Result<(Bell, OwnedFd)> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        cvt(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        })?;
        // SAFETY: fresh descriptors owned by us.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((Bell::from_fd(a)?, b))
    }

    /// Adopts an end received from the peer; refuses anything but a Unix stream socket.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Bell> {
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `ty` and `len` are valid for the option's size.
        cvt(unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&mut ty as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
        if ty != libc::SOCK_STREAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer's bell is not a stream socket",
            ));
        }
        // Blocking for our reads (timed by SO_RCVTIMEO); rings are sent with MSG_DONTWAIT.
        // SAFETY: plain fcntl on a descriptor we own.
        let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) })?;
        Ok(Bell { fd, timeout: None })
    }

    /// Rings the other end. Never blocks: a full socket (EAGAIN) holds unread rings, so
    /// the other side wakes anyway; a closed one means nobody is there to wake.
    pub fn ring(&self) {
        // SAFETY: sends one byte from a valid buffer.
        unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }

    /// Blocks until the other end rings (consuming every pending ring), hangs up, or
    /// `timeout` (at least 1 us) passes.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<BellWait> {
        let timeout = timeout.max(Duration::from_micros(1));
        if self.timeout != Some(timeout) {
            let tv = libc::timeval {
                tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
            };
            // SAFETY: `tv` is a valid timeval for the option's size.
            cvt(unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            })?;
            self.timeout = Some(timeout);
        }
        let mut buf = [0u8; 64];
        // SAFETY: reads into a valid local buffer.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n > 0 {
            return Ok(BellWait::Rang);
        }
        if n == 0 {
            return Ok(BellWait::HungUp);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Ok(BellWait::TimedOut),
            // A signal: the caller re-checks as after a ring.
            io::ErrorKind::Interrupted => Ok(BellWait::Rang),
            _ => Err(e),
        }
    }
}

/// An epoll instance.
pub struct Epoll(OwnedFd);

impl Epoll {
    /// Creates an epoll instance.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fresh fd owned by us.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    /// Watches `fd` for readability (level-triggered), reporting `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add_with(fd, token, libc::EPOLLIN | libc::EPOLLRDHUP)
    }
    /// Watches `fd` for new readability only (edge-triggered): each write to an eventfd is
    /// reported once, and nothing needs to be read back.
    pub fn add_edge(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add_with(fd, token, libc::EPOLLIN | libc::EPOLLET)
    }
    fn add_with(&self, fd: RawFd, token: u64, events: libc::c_int) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: valid epoll fd and event struct.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }
    /// Changes how `fd` is watched: readability (level-triggered, with hang-ups), plus
    /// writability when `out`.
    pub fn modify(&self, fd: RawFd, token: u64, out: bool) -> io::Result<()> {
        let mut events = libc::EPOLLIN | libc::EPOLLRDHUP;
        if out {
            events |= libc::EPOLLOUT;
        }
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: valid epoll fd and event struct.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) })?;
        Ok(())
    }
    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) {
        // SAFETY: valid epoll fd; a stale fd only yields an error we ignore.
        unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }
    /// Waits up to `timeout` (None: forever) and returns the tokens that are ready.
    pub fn wait(&self, out: &mut Vec<u64>, timeout: Option<Duration>) -> io::Result<()> {
        // epoll_pwait2 takes nanoseconds: protocol timers (delayed acks, retransmissions)
        // are sub-millisecond, and epoll_wait's milliseconds would either spin (rounding
        // down) or oversleep (rounding up).
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        let mut n = -1;
        if !NO_PWAIT2.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: evs is a valid buffer of 32 events; tsp is null or points to `ts`.
            n = unsafe {
                libc::epoll_pwait2(
                    self.0.as_raw_fd(),
                    evs.as_mut_ptr(),
                    32,
                    tsp,
                    std::ptr::null(),
                )
            };
            if n < 0
                && matches!(
                    io::Error::last_os_error().raw_os_error(),
                    Some(libc::ENOSYS) | Some(libc::EPERM)
                )
            {
                // Before Linux 5.11, or refused by a seccomp profile: milliseconds then.
                NO_PWAIT2.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if NO_PWAIT2.load(std::sync::atomic::Ordering::Relaxed) {
            // Rounded up, so a short timer never turns a sleep into a spin.
            let ms = timeout.map_or(-1, |d| {
                d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
            });
            // SAFETY: evs is a valid buffer of 32 events.
            n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), 32, ms) };
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(e);
        }
        out.extend(evs[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
    /// The epoll fd itself (pollable by users: readable when any watched fd is).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Peer credentials of a Unix socket.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    /// Peer process id, as seen from this PID namespace (0 when not visible).
    pub pid: i32,
    /// Peer user id.
    pub uid: u32,
}

/// Returns this process's uid.
pub fn getuid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::getuid() }
}

/// This process's effective uid.
pub fn geteuid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}

/// A SOCK_SEQPACKET Unix socket.
pub struct SeqPacket(OwnedFd);

fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = name.as_bytes();
    if b.len() + 1 > a.sun_path.len() {
        return Err(io::Error::other("socket name too long"));
    }
    // Abstract namespace: leading NUL, not NUL-terminated, nothing on disk.
    for (i, &c) in b.iter().enumerate() {
        a.sun_path[i + 1] = c as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + b.len();
    Ok((a, len as libc::socklen_t))
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh fd owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl SeqPacket {
    /// Binds and listens on abstract name `name` (non-blocking accept).
    pub fn listen(name: &str) -> io::Result<SeqPacket> {
        let fd = seqpacket_socket()?;
        let (a, len) = abstract_addr(name)?;
        // SAFETY: valid socket and address.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) })?;
        // SAFETY: a socket we own.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
        let s = SeqPacket(fd);
        s.set_nonblocking(true)?;
        Ok(s)
    }
    /// Connects to abstract name `name`.
    pub fn connect(name: &str) -> io::Result<SeqPacket> {
        let fd = seqpacket_socket()?;
        let (a, len) = abstract_addr(name)?;
        // SAFETY: valid socket and address.
        cvt(unsafe {
            libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len)
        })?;
        Ok(SeqPacket(fd))
    }
    /// Accepts one pending connection, if any.
    pub fn accept(&self) -> io::Result<Option<SeqPacket>> {
        // SAFETY: valid listening socket; we do not need the peer address.
        let r = unsafe {
            libc::accept4(
                self.0.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(e);
        }
        // SAFETY: fresh fd owned by us.
        Ok(Some(SeqPacket(unsafe { OwnedFd::from_raw_fd(r) })))
    }
    /// Sets O_NONBLOCK.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        // SAFETY: fcntl on a valid fd.
        let fl = cvt(unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_GETFL) })?;
        let fl = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        // SAFETY: fcntl on a valid fd.
        cvt(unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_SETFL, fl) })?;
        Ok(())
    }
    /// Credentials of the connected peer (SO_PEERCRED).
    pub fn peer_cred(&self) -> io::Result<PeerCred> {
        // SAFETY: ucred is plain data.
        let mut c: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: valid socket and out-buffer of the right size.
        cvt(unsafe {
            libc::getsockopt(
                self.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut c as *mut libc::ucred).cast(),
                &mut len,
            )
        })?;
        Ok(PeerCred {
            pid: c.pid,
            uid: c.uid,
        })
    }
    /// Sends one packet with the given file descriptors attached (SCM_RIGHTS).
    pub fn send_with_fds(&self, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut _,
            iov_len: data.len(),
        };
        let mut cbuf = [0u64; 8]; // 64 bytes, 8-aligned: room for 8 fds
                                  // SAFETY: msghdr is plain data.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            assert!(fds.len() <= 8, "at most 8 fds per packet");
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE((fds.len() * 4) as u32) } as usize;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: msg_control points to cbuf, large enough for one cmsg with the fds.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as usize;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(c).cast::<RawFd>(),
                    fds.len(),
                );
            }
        }
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = cvt_isize(unsafe { libc::sendmsg(self.0.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })?;
        if n != data.len() {
            return Err(io::Error::other("short send on seqpacket socket"));
        }
        Ok(())
    }
    /// Receives one packet and up to 4 attached fds, waiting at most `timeout`. Returns the
    /// packet length (0 means the peer closed).
    pub fn recv_with_fds(
        &self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        timeout: Duration,
    ) -> io::Result<usize> {
        let late = || io::Error::new(io::ErrorKind::TimedOut, "peer did not answer in time");
        // With no timeout, MSG_DONTWAIT below says "nothing yet" by itself: no poll.
        if !timeout.is_zero() && !poll_readable(self.0.as_raw_fd(), timeout)? {
            return Err(late());
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: msghdr is plain data.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: buffers live for the call; MSG_CMSG_CLOEXEC keeps received fds private.
        let n = cvt_isize(unsafe {
            libc::recvmsg(
                self.0.as_raw_fd(),
                &mut msg,
                libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
            )
        })
        .map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => late(),
            _ => e,
        })?;
        // SAFETY: walking the control buffer the kernel filled, bounded by msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let nfd = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..nfd {
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::other("oversized handshake packet from peer"));
        }
        Ok(n)
    }
    /// The raw fd (for epoll).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until `fd` is readable or hung up; false on timeout.
pub fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(r > 0);
    }
}

/// Copies `dst.len()` bytes from address `remote` in process `pid` into `dst` with
/// process_vm_readv (one copy, no staging).
pub fn cma_read(pid: i32, remote: u64, dst: &mut [u8]) -> io::Result<()> {
    // SAFETY: `dst` is memory we own mutably for the whole call.
    unsafe { cma(pid, remote, dst.as_mut_ptr(), dst.len(), false) }
}

/// Copies `src` to address `remote` in process `pid` with process_vm_writev (the
/// same-host copy engine writing a get's answer into the initiator's buffer).
pub fn cma_write(pid: i32, remote: u64, src: &[u8]) -> io::Result<()> {
    // SAFETY: `src` is only read (process_vm_writev does not write the local side).
    unsafe { cma(pid, remote, src.as_ptr().cast_mut(), src.len(), true) }
}

/// One CMA copy of `len` bytes between `local` and `remote` in process `pid`, looping
/// over partial transfers.
///
/// # Safety
/// `local` must be valid for `len` bytes: for writes when `to_remote` is false (the
/// kernel writes it), for reads otherwise.
unsafe fn cma(
    pid: i32,
    remote: u64,
    local: *mut u8,
    len: usize,
    to_remote: bool,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // Bounded pieces keep each call's latency (and the time the peer can't be served)
        // reasonable and stay under the kernel's per-call limits.
        let n = (len - done).min(1 << 30);
        let l = libc::iovec {
            iov_base: local.add(done).cast(),
            iov_len: n,
        };
        let rem = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: n,
        };
        // SAFETY: the local iovec is valid per the caller; the kernel checks the remote
        // side against the peer's address space.
        let r = cvt_isize(if to_remote {
            libc::process_vm_writev(pid, &l, 1, &rem, 1, 0)
        } else {
            libc::process_vm_readv(pid, &l, 1, &rem, 1, 0)
        })?;
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
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::Error::other("fd path has NUL"))?;
    // SAFETY: a valid C string; the result is a new fd we own.
    let r = cvt(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: just returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Size of a memory file in bytes.
pub fn fd_size(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: zeroed stat is a valid out-parameter for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st.st_size as u64)
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
    // SAFETY: always succeeds.
    unsafe { libc::getpid() }
}

/// Makes the child `cmd` starts receive SIGKILL when the thread that started it dies
/// (`PR_SET_PDEATHSIG`, set between fork and exec): benchmark and test children never
/// outlive a killed parent.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook only calls prctl, which is async-signal-safe, and touches no
    // memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
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

/// A TCP listening socket bound to `at`; an IPv6 one takes IPv4 connections too (as
/// mapped addresses) whatever the host's `bindv6only` default.
pub fn tcp_listen(at: std::net::SocketAddr) -> io::Result<std::net::TcpListener> {
    let family = if at.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2).
    let raw = cvt(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor we own; the listener closes it.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(raw) };
    if at.is_ipv6() {
        setsockopt(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, &0)?;
    }
    let name = SockAddr::from(at);
    let (sa, len) = name.raw();
    // SAFETY: a valid socket address of the length given.
    cvt(unsafe { libc::bind(raw, sa, len) })?;
    // SAFETY: listen on our socket.
    cvt(unsafe { libc::listen(raw, 128) })?;
    Ok(listener)
}

/// A socket address in the kernel's form, either family.
#[derive(Clone, Copy)]
pub struct SockAddr {
    /// Large enough for either family; `sin6_family` sits where `sin_family` does.
    sa: libc::sockaddr_in6,
}

impl SockAddr {
    /// Space for a name the kernel writes (`recvmsg`, `getsockname`).
    pub fn empty() -> SockAddr {
        SockAddr {
            // SAFETY: sockaddr_in6 is plain old data; all-zero is a valid value.
            sa: unsafe { std::mem::zeroed() },
        }
    }

    /// `a` for a socket of the family `v6` says: an IPv4 address on an IPv6 socket is
    /// written as an IPv4-mapped IPv6 address.
    pub fn for_socket(a: std::net::SocketAddr, v6: bool) -> SockAddr {
        match a {
            std::net::SocketAddr::V4(v) if v6 => SockAddr::from(std::net::SocketAddr::new(
                v.ip().to_ipv6_mapped().into(),
                v.port(),
            )),
            a => SockAddr::from(a),
        }
    }

    /// The name and its length for a system call that reads it (a borrow: the storage
    /// outlives the call; `&sockaddr` coerces to the call's pointer).
    pub fn raw(&self) -> (&libc::sockaddr, libc::socklen_t) {
        let len = if i32::from(self.sa.sin6_family) == libc::AF_INET {
            std::mem::size_of::<libc::sockaddr_in>()
        } else {
            std::mem::size_of::<libc::sockaddr_in6>()
        };
        // SAFETY: a sockaddr (16 bytes, 2-aligned) is a prefix of the sockaddr_in6.
        let sa = unsafe { &*(&self.sa as *const libc::sockaddr_in6).cast::<libc::sockaddr>() };
        (sa, len as libc::socklen_t)
    }

    /// The pointer and capacity for a system call that writes the name.
    pub fn raw_mut(&mut self) -> (*mut libc::sockaddr, libc::socklen_t) {
        (
            (&mut self.sa as *mut libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    }

    /// The address, IPv4-mapped IPv6 addresses as IPv4 (`None`: another family).
    pub fn get(&self) -> Option<std::net::SocketAddr> {
        match i32::from(self.sa.sin6_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let sin = unsafe {
                    &*(&self.sa as *const libc::sockaddr_in6).cast::<libc::sockaddr_in>()
                };
                Some(std::net::SocketAddr::new(
                    std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into(),
                    u16::from_be(sin.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let ip = std::net::Ipv6Addr::from(self.sa.sin6_addr.s6_addr);
                Some(std::net::SocketAddr::new(
                    ip.to_ipv4_mapped().map_or(ip.into(), Into::into),
                    u16::from_be(self.sa.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

impl From<std::net::SocketAddr> for SockAddr {
    fn from(a: std::net::SocketAddr) -> SockAddr {
        let mut s = SockAddr::empty();
        match a {
            std::net::SocketAddr::V4(v) => {
                // SAFETY: the storage is larger than a sockaddr_in and suitably aligned.
                let sin = unsafe {
                    &mut *(&mut s.sa as *mut libc::sockaddr_in6).cast::<libc::sockaddr_in>()
                };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = v.port().to_be();
                sin.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            std::net::SocketAddr::V6(v) => {
                s.sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sa.sin6_port = v.port().to_be();
                s.sa.sin6_addr.s6_addr = v.ip().octets();
                s.sa.sin6_scope_id = v.scope_id();
                s.sa.sin6_flowinfo = v.flowinfo();
            }
        }
        s
    }
}

/// An address of an interface that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    /// Interface name (`eth0`).
    pub name: String,
    /// The address.
    pub ip: std::net::IpAddr,
    /// Its prefix length (the netmask's bits).
    pub prefix: u8,
    /// The interface MTU.
    pub mtu: usize,
    /// A loopback interface.
    pub lo: bool,
}

/// The addresses of the interfaces that are up, with their interface's name, prefix and
/// MTU (from `getifaddrs` and `/sys/class/net/IF/mtu`): IPv4 then IPv6 (link-local IPv6
/// addresses left out: they need a scope to be reached), each in the kernel's order,
/// loopback last.
pub fn interfaces() -> Vec<Iface> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        let lo = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        if ifa.ifa_addr.is_null() || !up {
            continue;
        }
        let (ip, prefix) = match i32::from(
            // SAFETY: a non-null ifa_addr points to a sockaddr of its family.
            unsafe { (*ifa.ifa_addr).sa_family },
        ) {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so this is a sockaddr_in, and so is a
                // non-null netmask.
                let (sin, mask) = unsafe {
                    (
                        &*(ifa.ifa_addr as *const libc::sockaddr_in),
                        (ifa.ifa_netmask as *const libc::sockaddr_in).as_ref(),
                    )
                };
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                let prefix =
                    mask.map_or(32, |m| u32::from_be(m.sin_addr.s_addr).count_ones() as u8);
                (std::net::IpAddr::V4(ip), prefix)
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6: sockaddr_in6, netmask too.
                let (sin, mask) = unsafe {
                    (
                        &*(ifa.ifa_addr as *const libc::sockaddr_in6),
                        (ifa.ifa_netmask as *const libc::sockaddr_in6).as_ref(),
                    )
                };
                let ip = std::net::Ipv6Addr::from(sin.sin6_addr.s6_addr);
                if ip.segments()[0] & 0xffc0 == 0xfe80 {
                    continue; // link-local
                }
                let prefix = mask.map_or(128, |m| {
                    m.sin6_addr
                        .s6_addr
                        .iter()
                        .map(|b| b.count_ones())
                        .sum::<u32>() as u8
                });
                (std::net::IpAddr::V6(ip), prefix)
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1500);
        out.push(Iface {
            name,
            ip,
            prefix,
            mtu,
            lo,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_by_key(|i| (i.lo, i.ip.is_ipv6()));
    out
}

/// Writes `bufs` to the connected stream socket `fd` with one `sendmsg` (a gathering
/// write, as `writev`), with `MSG_NOSIGNAL`: a peer that reset the connection gives
/// `EPIPE`, never a `SIGPIPE` that would kill a process that did not ignore it.
pub fn send_vectored(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix (documented by std).
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: the vectors point into live slices for the duration of the call.
    cvt_isize(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) } as isize)
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
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
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
        // SAFETY: unlocking our own descriptor (closing it would too).
        unsafe { libc::flock(self.fd.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bell_wakes_on_rings_times_out_and_reports_a_hang_up() {
        let (mut mine, theirs) = Bell::pair().unwrap();
        let mut theirs = Bell::from_fd(theirs).unwrap();
        // Rings pending before the wait are consumed by one read, all of them.
        for _ in 0..3 {
            theirs.ring();
        }
        assert_eq!(mine.wait(Duration::from_secs(5)).unwrap(), BellWait::Rang);
        assert_eq!(
            mine.wait(Duration::from_millis(1)).unwrap(),
            BellWait::TimedOut
        );
        // Both directions work.
        mine.ring();
        assert_eq!(theirs.wait(Duration::from_secs(5)).unwrap(), BellWait::Rang);
        drop(theirs);
        assert_eq!(mine.wait(Duration::from_secs(5)).unwrap(), BellWait::HungUp);
        // Ringing a bell nobody holds neither blocks nor fails.
        mine.ring();
    }

    #[test]
    fn a_bell_must_be_a_stream_socket() {
        let e = Bell::from_fd(eventfd().unwrap())
            .err()
            .expect("an eventfd refused");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        cvt(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, fds.as_mut_ptr()) })
            .unwrap();
        // SAFETY: fresh descriptors owned here.
        let (a, _b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let e = Bell::from_fd(a).err().expect("a datagram socket refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
