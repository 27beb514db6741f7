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
    poll_for(fd, libc::POLLIN, timeout)
}

/// Waits up to `timeout` for `fd` to report any of `events` (or an error or hang-up);
/// true if it did.
pub(crate) fn poll_for(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events,
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
