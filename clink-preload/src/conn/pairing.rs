//! Pairing the two ends of a connection outside the stream: the rendezvous name a
//! connecting end binds before its SYN, the Hello / Ack exchange with each end's socket as
//! proof of ownership, and the switch of this end's sending direction once the peer mapped
//! the rings.

use super::*;

impl Conn {
    /// Prepares a connecting socket before its `connect`: binds it to an ephemeral port if
    /// it has none and binds the rendezvous name. `None` when the connection stays plain.
    pub fn before_connect(fd: c_int, dst: std::net::SocketAddr) -> Option<c_int> {
        let port = match sys::local_addr(fd) {
            Some(a) if a.port() != 0 => a.port(),
            Some(a) => {
                let any: std::net::SocketAddr = if a.is_ipv4() {
                    "0.0.0.0:0".parse().ok()?
                } else {
                    "[::]:0".parse().ok()?
                };
                let (ss, len) = to_c(any);
                // SAFETY: binding our own socket to a wildcard address of its family.
                if unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len) } != 0 {
                    return None;
                }
                sys::local_addr(fd)?.port()
            }
            None => return None,
        };
        let name = rendezvous_name(dst, port);
        // SAFETY: a new Unix socket of our own.
        let l = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if l < 0 {
            return None;
        }
        let (a, len) = sys::abstract_addr(&name);
        // SAFETY: binding and listening on our own socket with a valid address.
        let ok = unsafe {
            libc::bind(l, &a as *const _ as *const libc::sockaddr, len) == 0
                && libc::listen(l, 4) == 0
        };
        if !ok {
            close_fd(l);
            return None;
        }
        Some(l)
    }

    /// The connecting end, once `connect` succeeded or is in progress.
    pub fn connecting(fd: c_int, listener: c_int) -> Conn {
        let deadline_ns = now_ns() + CLIENT_DEADLINE_NS;
        Conn::new(
            Role::Connecting,
            fd,
            Pairing::ClientWaiting {
                listener,
                deadline_ns,
            },
            None,
        )
    }

    /// The accepting end of a socket `accept` returned: offers the pairing if the client
    /// bound its rendezvous name. `Err(reason)` when the connection stays on the kernel.
    pub fn accepted(fd: c_int, ring: u32) -> Result<Conn, &'static str> {
        let (local, peer) = match (sys::local_addr(fd), sys::peer_addr(fd)) {
            (Some(l), Some(p)) => (l, p),
            _ => return Err("no addresses"),
        };
        let name = rendezvous_name(local, peer.port());
        // SAFETY: a new Unix socket of our own.
        let u = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if u < 0 {
            return Err("no Unix socket");
        }
        let (a, len) = sys::abstract_addr(&name);
        // SAFETY: connecting our own socket to a valid abstract address.
        if unsafe { real::connect(u, &a as *const _ as *const libc::sockaddr, len) } != 0 {
            close_fd(u);
            return Err("peer not under clink");
        }
        let Some(shared) = Shared::create(ring) else {
            close_fd(u);
            return Err("no shared memory");
        };
        let hello = Hello { ring }.encode();
        if !send_with_fds(u, &hello, &[shared.memfd, fd]) {
            close_fd(u);
            return Err("pairing refused");
        }
        Ok(Conn::new(
            Role::Accepting,
            fd,
            Pairing::ServerWaiting {
                uconn: u,
                local,
                peer,
            },
            Some(shared),
        ))
    }

    /// Advances the pairing if it is still under way. `force` skips the rate limit: a byte
    /// came by the kernel (a connecting end then decides) or the peer switched.
    pub fn progress(&self, fd: c_int, force: bool) {
        if self.pairing_done.load(Ordering::Acquire) {
            return;
        }
        let now = now_ns();
        if !force && now.saturating_sub(self.last_check_ns.load(Ordering::Relaxed)) < CHECK_EVERY_NS
        {
            return;
        }
        self.last_check_ns.store(now, Ordering::Relaxed);
        let Ok(mut p) = self.pairing.try_lock() else {
            return;
        };
        let _keep = sys::SavedErrno::save();
        match *p {
            Pairing::ClientWaiting {
                listener,
                deadline_ns,
            } => {
                // SAFETY: accepting on our own non-blocking listener.
                let u = unsafe {
                    real::accept4(
                        listener,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                if u >= 0 {
                    let outcome = self.client_pair(fd, u);
                    close_fd(u);
                    close_fd(listener);
                    self.finish(&mut p, outcome);
                } else if force || now > deadline_ns {
                    close_fd(listener);
                    self.finish(&mut p, Err("peer not under clink"));
                }
            }
            Pairing::ServerWaiting { uconn, local, peer } => {
                self.take_ack(&mut p, uconn, local, peer)
            }
            Pairing::Done => {}
        }
    }

    /// An accepting end whose socket has addresses `local` and `peer`: reads and checks the
    /// peer's Ack if it has come, and ends the pairing with its verdict.
    fn take_ack(
        &self,
        p: &mut Pairing,
        uconn: c_int,
        local: std::net::SocketAddr,
        peer: std::net::SocketAddr,
    ) {
        let mut buf = [0u8; MSG_LEN];
        let mut fds = [-1; 2];
        let (n, nfds) = recv_with_fds(uconn, &mut buf, &mut fds, libc::MSG_DONTWAIT);
        if n < 0 && errno() == libc::EAGAIN {
            return;
        }
        let outcome = if n == MSG_LEN as isize && Ack::decode(&buf).is_ok() && nfds == 1 {
            if mirrors_addrs(local, peer, fds[0]) {
                Ok(())
            } else {
                Err("pairing refused: not the mirror socket")
            }
        } else {
            Err("pairing refused")
        };
        for f in fds.iter().take(nfds) {
            close_fd(*f);
        }
        close_fd(uconn);
        self.finish(p, outcome);
    }

    /// Where the peer's sends moved from the kernel to the ring, in the stream this end
    /// reads ([`NOT_SWITCHED`] before): believed only once this end's pairing proved the
    /// peer. The mapping went to whoever held the rendezvous name, and only the Ack shows
    /// that it holds the mirror socket; a peer acks before it switches, so a switch that
    /// shows before this end's pairing ended is settled here by reading the Ack (waiting
    /// for a thread that is pairing meanwhile).
    pub(super) fn rx_switch_at(&self) -> u64 {
        let Some(s) = self.shared.get() else {
            return NOT_SWITCHED;
        };
        let sw = s.switch_at(self.rx_dir()).load(Ordering::SeqCst);
        if sw == NOT_SWITCHED || self.peer_ready.load(Ordering::Acquire) {
            return sw;
        }
        if !self.pairing_done.load(Ordering::Acquire) {
            let mut p = self.pairing.lock().unwrap_or_else(|e| e.into_inner());
            if let Pairing::ServerWaiting { uconn, local, peer } = *p {
                let _keep = sys::SavedErrno::save();
                self.take_ack(&mut p, uconn, local, peer);
            }
        }
        if self.peer_ready.load(Ordering::Acquire) {
            sw
        } else {
            NOT_SWITCHED
        }
    }

    pub(super) fn finish(&self, p: &mut Pairing, outcome: Result<(), &'static str>) {
        *p = Pairing::Done;
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = match outcome {
            Ok(()) => "accelerated".to_string(),
            Err(why) => format!("kernel ({why})"),
        };
        if outcome.is_ok() {
            self.peer_ready.store(true, Ordering::Release);
        }
        self.pairing_done.store(true, Ordering::Release);
    }

    /// After pairing: moves this end's sending direction onto the ring if no send holds it.
    pub fn switch_if_ready(&self, fd: c_int) {
        if self.peer_ready.load(Ordering::Acquire) && !self.tx_switched.load(Ordering::Acquire) {
            if let Ok(sent) = self.tx_sent.try_lock() {
                self.switch_tx(fd, *sent);
            }
        }
    }

    pub(super) fn switch_tx(&self, fd: c_int, sent: u64) {
        if self.tx_switched.load(Ordering::Acquire) || self.tx_back.load(Ordering::Acquire) {
            return;
        }
        let Some(s) = self.shared.get() else { return };
        s.switch_at(self.tx_dir()).store(sent, Ordering::SeqCst);
        self.tx_switched.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        self.take_nodelay(fd);
        // A reader asleep in the kernel before the switch waits for kernel bytes that
        // will not come: wake it. (A wake-up byte nobody reads would turn this end's close
        // into a reset, so none is sent to a reader that is not asleep.)
        if s.reader_sleeping(self.tx_dir()).swap(0, Ordering::AcqRel) != 0 {
            self.bell(fd);
        }
        // The reader may have left meanwhile (checked after the switch is visible).
        self.follow_leaving(fd);
    }

    pub(super) fn client_pair(&self, fd: c_int, u: c_int) -> Result<(), &'static str> {
        // SAFETY: making our own accepted socket blocking, with a bounded wait.
        unsafe {
            let fl = real::fcntl(u, libc::F_GETFL, 0);
            real::fcntl(u, libc::F_SETFL, (fl & !libc::O_NONBLOCK) as libc::c_long);
        }
        let mut pfd = libc::pollfd {
            fd: u,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one pollfd of ours.
        if unsafe { real::poll(&mut pfd, 1, PAIR_TIMEOUT_MS) } != 1 {
            return Err("pairing timed out");
        }
        let mut buf = [0u8; MSG_LEN];
        let mut fds = [-1; 2];
        let (n, nfds) = recv_with_fds(u, &mut buf, &mut fds, libc::MSG_DONTWAIT);
        let result = (|| {
            if n != MSG_LEN as isize || nfds != 2 {
                return Err("pairing refused");
            }
            let hello = Hello::decode(&buf).map_err(|_| "pairing refused: bad hello")?;
            if !mirrors(fd, fds[1]) {
                return Err("pairing refused: not the mirror socket");
            }
            let shared =
                Shared::attach(fds[0], hello.ring).ok_or("pairing refused: bad mapping")?;
            fds[0] = -1; // owned by `shared` now
            let _ = self.shared.set(shared);
            if !send_with_fds(u, &Ack.encode(), &[fd]) {
                return Err("pairing refused: ack not sent");
            }
            Ok(())
        })();
        for f in fds.iter().take(nfds) {
            if *f >= 0 {
                close_fd(*f);
            }
        }
        result
    }

    /// What became of the pairing, for statistics.
    pub fn outcome(&self) -> String {
        if !self.pairing_done.load(Ordering::Acquire) {
            return "kernel (the peer had not answered)".to_string();
        }
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Whether the socket `theirs` (received from the peer) is the mirror image of `ours`.
pub(super) fn mirrors(ours: c_int, theirs: c_int) -> bool {
    match (sys::local_addr(ours), sys::peer_addr(ours)) {
        (Some(a), Some(b)) => mirrors_addrs(a, b, theirs),
        _ => false,
    }
}

/// Whether the socket `theirs` is the mirror image of a socket from `local` to `peer`.
fn mirrors_addrs(local: std::net::SocketAddr, peer: std::net::SocketAddr, theirs: c_int) -> bool {
    match (sys::local_addr(theirs), sys::peer_addr(theirs)) {
        (Some(c), Some(d)) => is_mirror(local, peer, c, d),
        _ => false,
    }
}

/// A control buffer with room for `n` descriptors (8-aligned, as `cmsghdr` wants).
fn control_buffer(n: usize) -> Vec<u64> {
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE((n * 4) as u32) } as usize;
    vec![0u64; space.div_ceil(8)]
}

/// A message header for one iovec and the control buffer `cbuf`; both must outlive its
/// use.
fn msghdr_with(iov: &mut iovec, cbuf: &mut [u64]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; zeroes are a valid value.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    m.msg_controllen = std::mem::size_of_val(cbuf) as _;
    m
}

pub(super) fn send_with_fds(u: c_int, msg: &[u8], fds: &[c_int]) -> bool {
    let mut iov = iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    let mut cbuf = control_buffer(fds.len());
    let m = msghdr_with(&mut iov, &mut cbuf);
    // SAFETY: filling the one control message the buffer was sized for.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut c_int, fds.len());
    }
    // SAFETY: sending our message on our own Unix socket.
    let n = unsafe { real::sendmsg(u, &m, libc::MSG_NOSIGNAL) };
    n == msg.len() as isize
}

/// Receives one message and up to `fds.len()` descriptors (close-on-exec). Returns the
/// byte count (or -1) and how many descriptors arrived.
pub(super) fn recv_with_fds(
    u: c_int,
    buf: &mut [u8],
    fds: &mut [c_int],
    flags: c_int,
) -> (isize, usize) {
    let mut iov = iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = control_buffer(fds.len());
    let mut m = msghdr_with(&mut iov, &mut cbuf);
    // SAFETY: receiving into our own buffers.
    let n = unsafe { real::recvmsg(u, &mut m, flags | libc::MSG_CMSG_CLOEXEC) };
    let mut count = 0;
    if n >= 0 {
        // SAFETY: walking the control messages the kernel wrote into `cbuf`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&m);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    let data = libc::CMSG_DATA(c) as *const c_int;
                    for i in 0..k {
                        let f = std::ptr::read_unaligned(data.add(i));
                        if count < fds.len() {
                            fds[count] = f;
                            count += 1;
                        } else {
                            close_fd(f);
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&m, c);
            }
        }
        if m.msg_flags & libc::MSG_CTRUNC != 0 {
            return (-1, count);
        }
    }
    (n, count)
}

/// A socket address as C wants it.
pub fn to_c(a: std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zeroes are a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        std::net::SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            let s = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            let s = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}
