//! A peer pair's bell: a Unix stream socket pair each side rings the other through.

use super::*;

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
