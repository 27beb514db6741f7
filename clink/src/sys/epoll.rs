//! An epoll instance.

use super::*;

/// An epoll instance.
pub struct Epoll(OwnedFd);

impl Epoll {
    /// Creates an epoll instance.
    pub fn new() -> io::Result<Epoll> {
        use rustix::event::epoll;
        Ok(Epoll(epoll::create(epoll::CreateFlags::CLOEXEC)?))
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
    /// Waits up to `timeout` (None: forever) and appends the tokens that are ready to
    /// `out`; true when that may be only some of them (the call's 32 entries filled).
    pub fn wait(&self, out: &mut Vec<u64>, timeout: Option<Duration>) -> io::Result<bool> {
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
                return Ok(false);
            }
            return Err(e);
        }
        out.extend(evs[..n as usize].iter().map(|e| e.u64));
        Ok(n as usize == evs.len())
    }
    /// The epoll fd itself (pollable by users: readable when any watched fd is).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    /// The same, borrowed.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
