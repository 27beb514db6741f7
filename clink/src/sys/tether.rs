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
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((Tether::from_fd(a)?, b))
    }

    /// Adopts an end received from the peer; refuses anything but a Unix stream socket.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Tether> {
        if rustix::net::sockopt::socket_type(&fd)? != rustix::net::SocketType::STREAM {
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
        use rustix::io::Errno;
        let mut buf = [0u8; 64];
        loop {
            match rustix::net::recv(&self.fd, &mut buf, rustix::net::RecvFlags::DONTWAIT) {
                Ok((0, _)) => return true,
                Ok(_) => continue,
                Err(Errno::AGAIN | Errno::INTR) => return false,
                Err(_) => return true,
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
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        let flags = SocketFlags::CLOEXEC;
        let (a, _b) = socketpair(AddressFamily::UNIX, SocketType::DGRAM, flags, None).unwrap();
        let e = Tether::from_fd(a).err().expect("a datagram socket refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
