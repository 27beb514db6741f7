//! A peer pair's tether: a Unix stream socket pair whose hang-up tells each side the
//! other is gone.

use super::*;

/// One end of a peer pair's tether: a Unix stream socket pair whose two ends the two
/// processes hold. Nothing is sent over it: a receiver that sleeps on its one peer's
/// futex (the ring's sleep flag, see ARCHITECTURE.md, "Waiting") cannot watch the peer's
/// connection socket meanwhile, and checks the tether for the peer's exit when the sleep
/// times out.
pub struct Tether {
    fd: OwnedFd,
}

impl Tether {
    /// A connected pair: keep one end, send the other to the peer.
    pub fn pair() -> io::Result<(Tether, OwnedFd)> {
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
        Ok((Tether::from_fd(a)?, b))
    }

    /// Adopts an end received from the peer; refuses anything but a Unix stream socket.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Tether> {
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
                "the peer's tether is not a stream socket",
            ));
        }
        Ok(Tether { fd })
    }

    /// Whether the other end is closed (the peer is gone), without blocking (bytes a
    /// peer wrote, though none should, are read and ignored).
    pub fn hung_up(&self) -> bool {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: reads into a valid local buffer.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => return true,
                n if n > 0 => continue,
                _ => {
                    let e = io::Error::last_os_error();
                    return !matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tether_reports_the_other_end_closed() {
        let (mine, theirs) = Tether::pair().unwrap();
        let theirs = Tether::from_fd(theirs).unwrap();
        assert!(!mine.hung_up() && !theirs.hung_up());
        drop(theirs);
        assert!(mine.hung_up());
    }

    #[test]
    fn a_tether_must_be_a_stream_socket() {
        let e = Tether::from_fd(eventfd().unwrap())
            .err()
            .expect("an eventfd refused");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        cvt(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, fds.as_mut_ptr()) })
            .unwrap();
        // SAFETY: fresh descriptors owned here.
        let (a, _b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let e = Tether::from_fd(a).err().expect("a datagram socket refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
