//! SOCK_SEQPACKET Unix sockets (the same-host handshake, descriptors passed with
//! SCM_RIGHTS, peer credentials) and waiting for one descriptor.

use super::*;

/// Peer credentials of a Unix socket.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    /// Peer process id, as seen from this PID namespace (0 when not visible).
    pub pid: i32,
    /// Peer user id.
    pub uid: u32,
}

/// A SOCK_SEQPACKET Unix socket.
pub struct SeqPacket(OwnedFd);

/// The abstract-namespace address `name` (a leading NUL, nothing on disk).
fn abstract_addr(name: &str) -> io::Result<rustix::net::SocketAddrUnix> {
    rustix::net::SocketAddrUnix::new_abstract_name(name.as_bytes())
        .map_err(|_| io::Error::other("socket name too long"))
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

impl SeqPacket {
    /// Binds and listens on abstract name `name` (non-blocking accept).
    pub fn listen(name: &str) -> io::Result<SeqPacket> {
        let fd = seqpacket_socket()?;
        rustix::net::bind(&fd, &abstract_addr(name)?)?;
        rustix::net::listen(&fd, 128)?;
        let s = SeqPacket(fd);
        s.set_nonblocking(true)?;
        Ok(s)
    }
    /// Connects to abstract name `name`.
    pub fn connect(name: &str) -> io::Result<SeqPacket> {
        let fd = seqpacket_socket()?;
        rustix::net::connect(&fd, &abstract_addr(name)?)?;
        Ok(SeqPacket(fd))
    }
    /// Accepts one pending connection, if any.
    pub fn accept(&self) -> io::Result<Option<SeqPacket>> {
        match rustix::net::accept_with(&self.0, rustix::net::SocketFlags::CLOEXEC) {
            Ok(fd) => Ok(Some(SeqPacket(fd))),
            Err(rustix::io::Errno::AGAIN) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
    /// Sets O_NONBLOCK.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let mut fl = rustix::fs::fcntl_getfl(&self.0)?;
        fl.set(rustix::fs::OFlags::NONBLOCK, on);
        rustix::fs::fcntl_setfl(&self.0, fl)?;
        Ok(())
    }
    /// Credentials of the connected peer (SO_PEERCRED).
    pub fn peer_cred(&self) -> io::Result<PeerCred> {
        let c = rustix::net::sockopt::socket_peercred(&self.0)?;
        Ok(PeerCred {
            pid: c.pid.as_raw_nonzero().get(),
            uid: c.uid.as_raw(),
        })
    }
    /// Sends one packet with the given file descriptors attached (SCM_RIGHTS).
    pub fn send_with_fds(&self, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        assert!(fds.len() <= 8, "at most 8 fds per packet");
        // SAFETY: the caller's descriptors, open for the call (the kernel duplicates them
        // into the message).
        let fds: Vec<BorrowedFd<'_>> = fds
            .iter()
            .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
            .collect();
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other(
                "descriptors do not fit the control buffer",
            ));
        }
        let iov = [io::IoSlice::new(data)];
        let n = rustix::net::sendmsg(&self.0, &iov, &mut control, SendFlags::NOSIGNAL)?;
        if n != data.len() {
            return Err(io::Error::other("short send on seqpacket socket"));
        }
        Ok(())
    }
    /// Receives one packet and up to 8 attached fds, waiting at most `timeout`. Returns the
    /// packet length (0 means the peer closed; more descriptors than that truncate the
    /// packet: an error).
    pub fn recv_with_fds(
        &self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        timeout: Duration,
    ) -> io::Result<usize> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
        let late = || io::Error::new(io::ErrorKind::TimedOut, "peer did not answer in time");
        // With no timeout, DONTWAIT below says "nothing yet" by itself: no poll.
        if !timeout.is_zero() && !poll_readable(self.0.as_fd(), timeout)? {
            return Err(late());
        }
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [io::IoSliceMut::new(buf)];
        // CMSG_CLOEXEC keeps received descriptors private to this process.
        let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
        let got = match rustix::net::recvmsg(&self.0, &mut iov, &mut control, flags) {
            Ok(m) => m,
            Err(rustix::io::Errno::AGAIN) => return Err(late()),
            Err(e) => return Err(e.into()),
        };
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if got
            .flags
            .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
        {
            return Err(io::Error::other("oversized handshake packet from peer"));
        }
        Ok(got.bytes)
    }
    /// The raw fd (for epoll).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    /// The descriptor, borrowed (for a wait on it alone).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Waits until `fd` is readable or hung up; false on timeout.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    poll_for(fd, rustix::event::PollFlags::IN, timeout)
}

/// Waits up to `timeout` for `fd` to report any of `events` (or an error or hang-up);
/// true if it did.
pub(crate) fn poll_for(
    fd: BorrowedFd<'_>,
    events: rustix::event::PollFlags,
    timeout: Duration,
) -> io::Result<bool> {
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let mut p = [rustix::event::PollFd::from_borrowed_fd(fd, events)];
    loop {
        match rustix::event::poll(&mut p, Some(&ts)) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r? > 0),
        }
    }
}
