//! Wake sockets: a cheaper wake-up for a reader asleep in the library's own wait than a
//! byte through the kernel's TCP stack (which runs the whole TCP output and input path on
//! the writer's core). A reader that sleeps in a blocking `recv` or `read` with nothing
//! in the ring, or in a poll, select or epoll wait holding its connection, makes once an
//! abstract Unix datagram socket of a fresh number and publishes the number in the
//! mapping. It then sleeps in `poll` on that socket and the kernel socket (blocking
//! receive; poll and select add it to the caller's descriptors), or with the socket
//! registered in the application's epoll set (`wait.rs`), with `READER_ON_WAKE_SOCKET` as
//! its sleep flag. The kernel socket still reports the peer's
//! end, a reset, and the wake-up byte of a writer whose datagram could not be sent. A
//! writer that finds that flag sends one empty datagram to the number's name through one
//! unbound socket of its process, and falls back to the wake-up byte if that fails. A
//! stranger's datagram only wakes the reader, which looks at its ring and sleeps again.
//! Writers facing a full ring, and readers of an epoll set nested in another, wait for the
//! byte (their flag is 1).

use super::*;
use clink_proto::sockets::wake_name;
use std::sync::atomic::AtomicU64;

/// This process's unbound datagram socket for waking readers (-1: not made yet, or
/// could not be).
static SENDER: AtomicI32 = AtomicI32::new(-1);

/// Wake socket numbers made by this process (the high half is the process id).
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The library's own wake sockets (and sender), by descriptor: an application's `close`
/// of one (a loop closing every descriptor, say) is refused as for a descriptor that is
/// not open, so its number is never reused under a sleeping reader.
static OWN: crate::fdbits::FdBits = crate::fdbits::FdBits::new();

/// Whether `fd` is one of the library's wake sockets.
pub fn is_own(fd: c_int) -> bool {
    OWN.get(fd) == Some(true)
}

/// Closes one of the library's wake sockets.
pub(super) fn close_own(fd: c_int) {
    OWN.set(fd, false);
    close_fd(fd);
}

fn datagram_socket() -> c_int {
    // SAFETY: a new socket of our own.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    OWN.set(fd, true);
    fd
}

/// Wakes the reader whose wake socket `number` names (read from the mapping after the
/// reader's flag was taken); false when it could not (the byte then wakes it).
pub(super) fn ring(number: &AtomicU64) -> bool {
    let n = number.load(Ordering::Acquire);
    if n == 0 {
        return false;
    }
    let mut fd = SENDER.load(Ordering::Acquire);
    if fd < 0 {
        let new = datagram_socket();
        if new < 0 {
            return false;
        }
        fd = match SENDER.compare_exchange(-1, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => new,
            Err(other) => {
                close_own(new);
                other
            }
        };
    }
    let (a, len) = sys::abstract_addr(&wake_name(n));
    let _keep = sys::SavedErrno::save();
    // SAFETY: an empty datagram from our own socket to a valid abstract address.
    let r = unsafe {
        real::sendto(
            fd,
            std::ptr::null(),
            0,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            &a as *const _ as *const libc::sockaddr,
            len,
        )
    };
    // A full queue holds wake-ups already.
    r == 0 || errno() == libc::EAGAIN
}

impl Conn {
    /// This end's wake socket, for a reader about to sleep in a poll, select or epoll
    /// wait on `events` (POLL* bits) that waits for its ring's data: made and published
    /// on first use; `None` when the wait is not for ring data, or there can be none (see
    /// [`Conn::wake_socket`]; the connection not paired).
    pub fn wake_fd_for(&self, events: i16) -> Option<c_int> {
        if events & libc::POLLIN == 0 || !self.rx_in_ring() {
            return None;
        }
        self.wake_socket(self.shared.get()?)
    }

    /// Notes that the wake socket is registered in the epoll set numbered `set`.
    pub fn note_wake_set(&self, set: u64) {
        let mut sets = self.wake_sets.lock().unwrap_or_else(|e| e.into_inner());
        if !sets.contains(&set) {
            sets.push(set);
        }
    }

    /// Forgets the wake socket's registration in epoll set `set`: its descriptor if it
    /// was registered there (the caller takes it out of the set).
    pub fn forget_wake_set(&self, set: u64) -> Option<c_int> {
        let mut sets = self.wake_sets.lock().unwrap_or_else(|e| e.into_inner());
        let k = sets.iter().position(|&s| s == set)?;
        sets.swap_remove(k);
        let w = self.wake_fd.load(Ordering::Acquire);
        (w >= 0).then_some(w)
    }

    /// The socket's receive timeout (SO_RCVTIMEO) in milliseconds, -1 for none: read from
    /// the kernel once, again after the application sets it.
    fn rcv_timeout(&self, fd: c_int) -> c_int {
        let t = self.rcv_timeout_ms.load(Ordering::Relaxed);
        if t != -2 {
            return t;
        }
        let t = sys::sock_timeout_ms(fd, libc::SO_RCVTIMEO);
        self.rcv_timeout_ms.store(t, Ordering::Relaxed);
        t
    }

    /// The application set SO_RCVTIMEO: read it again at the next sleep.
    pub fn rcv_timeout_changed(&self) {
        self.rcv_timeout_ms.store(-2, Ordering::Relaxed);
    }

    /// Whether the wake socket is registered in epoll set `set`.
    pub fn wake_in_set(&self, set: u64) -> bool {
        self.wake_sets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&set)
    }

    /// This end's wake socket, made and published on first use; `None` if it cannot be,
    /// or wake sockets are off (`CLINK_SOCKETS_WAKE=0`).
    fn wake_socket(&self, s: &Shared) -> Option<c_int> {
        let fd = self.wake_fd.load(Ordering::Acquire);
        if fd >= 0 {
            return Some(fd);
        }
        if !crate::config().wake_sockets {
            return None;
        }
        let fd = datagram_socket();
        if fd < 0 {
            return None;
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        let number = pid << 32 | (NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff);
        let (a, len) = sys::abstract_addr(&wake_name(number));
        // SAFETY: binding our own socket to a valid abstract address.
        if unsafe { libc::bind(fd, &a as *const _ as *const libc::sockaddr, len) } != 0 {
            close_own(fd);
            return None;
        }
        if self
            .wake_fd
            .compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            close_own(fd); // another thread of this process made one meanwhile
            return Some(self.wake_fd.load(Ordering::Acquire));
        }
        // Published before any flag that points to it is raised.
        s.wake_socket(self.rx_dir())
            .store(number, Ordering::Release);
        Some(fd)
    }

    /// The reader's sleep in the library's own wait, listening on its wake socket and
    /// the kernel socket `fd`: `None` when it has no wake socket (the caller sleeps on
    /// the kernel socket alone). Honours SO_RCVTIMEO (`EAGAIN`) and returns `EINTR` for a
    /// signal unless every handler the process installed restarts calls (SA_RESTART),
    /// as a kernel `recv` would.
    pub(super) fn sleep_on_wake_socket(&self, fd: c_int) -> Option<Result<(), c_int>> {
        let s = self.shared.get()?;
        let w = self.wake_socket(s)?;
        let timeout_ms = self.rcv_timeout(fd);
        let deadline = (timeout_ms >= 0).then(|| now_ns() + timeout_ms as u64 * 1_000_000);
        loop {
            if !self.arm_as(libc::POLLIN, READER_ON_WAKE_SOCKET) {
                return Some(Ok(()));
            }
            let t = deadline.map_or(-1, |d| (d.saturating_sub(now_ns()) / 1_000_000) as c_int);
            let mut pfd = [
                libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: w,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: polling two pollfds of our own array.
            let r = unsafe { real::poll(pfd.as_mut_ptr(), 2, t) };
            let e = errno();
            self.disarm();
            if pfd[1].revents != 0 {
                drain_wake(w);
            }
            if pfd[0].revents != 0 {
                self.drain(fd);
            }
            if r < 0 {
                if e == libc::EINTR && restarts_after_signal(deadline.is_some()) {
                    continue;
                }
                return Some(Err(e));
            }
            if r > 0 {
                return Some(Ok(()));
            }
            if deadline.is_some_and(|d| now_ns() >= d) {
                return Some(Err(libc::EAGAIN));
            }
        }
    }
}

/// Reads the datagrams queued on wake socket `w`.
pub fn drain_wake(w: c_int) {
    let mut b = [0u8; 1];
    // SAFETY: non-blocking receives into our own byte.
    while unsafe {
        real::recv(
            w,
            b.as_mut_ptr() as *mut libc::c_void,
            1,
            libc::MSG_DONTWAIT,
        )
    } >= 0
    {}
}

/// Whether a kernel send or receive that a signal interrupted before it moved a byte
/// would go on (the library's own sleep is a `poll`, which never does): only without a
/// timeout on the socket (SO_RCVTIMEO / SO_SNDTIMEO, `timed`; see signal(7)) and, since
/// which signal came is not known, when every handler the process installed has
/// SA_RESTART.
pub(super) fn restarts_after_signal(timed: bool) -> bool {
    !timed && every_handler_restarts()
}

fn every_handler_restarts() -> bool {
    (1..=libc::SIGRTMAX()).all(|sig| {
        // SAFETY: sigaction is plain data; zeroes are a valid value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the disposition of a signal into our own struct.
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        r != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}
