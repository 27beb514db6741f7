//! Network sockets and interfaces: TCP listeners of either family, socket addresses in
//! the kernel's form, the interfaces that are up, gathering writes.

use super::*;

/// A TCP listening socket bound to `at`; an IPv6 one takes IPv4 connections too (as
/// mapped addresses) whatever the host's `bindv6only` default.
pub fn tcp_listen(at: std::net::SocketAddr) -> io::Result<std::net::TcpListener> {
    use rustix::net::{sockopt, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(family(&at), SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    if at.is_ipv6() {
        sockopt::set_ipv6_v6only(&fd, false)?;
    }
    rustix::net::bind(&fd, &at)?;
    rustix::net::listen(&fd, 128)?;
    Ok(fd.into())
}

/// The address family of `a`.
fn family(a: &std::net::SocketAddr) -> rustix::net::AddressFamily {
    if a.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    }
}

/// A TCP connection being made without blocking: [`TcpConnecting::poll`] says when it is
/// up or has failed, while the caller goes on with other work.
pub struct TcpConnecting(std::net::TcpStream);

impl TcpConnecting {
    /// Starts connecting to `to` (a non-blocking `connect`), with congestion control
    /// `congestion` (`None`: the host's). Chosen before the connect: a socket that
    /// started under bbr keeps pacing itself after a switch to another.
    pub fn start(to: std::net::SocketAddr, congestion: Option<&str>) -> io::Result<TcpConnecting> {
        use rustix::net::{SocketFlags, SocketType};
        let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
        let fd = rustix::net::socket_with(family(&to), SocketType::STREAM, flags, None)?;
        if let Some(cc) = congestion {
            rustix::net::sockopt::set_tcp_congestion(&fd, cc)?;
        }
        match rustix::net::connect(&fd, &to) {
            Err(e) if e != rustix::io::Errno::INPROGRESS => Err(e.into()),
            _ => Ok(TcpConnecting(fd.into())),
        }
    }

    /// `Ok(true)` once the connection is up, `Ok(false)` while it is being made, the
    /// error when it failed (refused, unreachable, timed out by the kernel).
    pub fn poll(&self) -> io::Result<bool> {
        if !super::seqpacket::poll_for(
            self.0.as_fd(),
            rustix::event::PollFlags::OUT,
            Duration::ZERO,
        )? {
            return Ok(false);
        }
        match self.0.take_error()? {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

    /// The connected socket, in blocking mode (as `TcpStream::connect` leaves one).
    pub fn into_stream(self) -> io::Result<std::net::TcpStream> {
        self.0.set_nonblocking(false)?;
        Ok(self.0)
    }
}

/// `a` as a socket of the family `v6` says takes it: an IPv4 address on an IPv6 socket
/// becomes an IPv4-mapped IPv6 address.
pub(crate) fn for_socket(a: std::net::SocketAddr, v6: bool) -> std::net::SocketAddr {
    match a {
        std::net::SocketAddr::V4(v) if v6 => {
            std::net::SocketAddr::new(v.ip().to_ipv6_mapped().into(), v.port())
        }
        a => a,
    }
}

/// `a` with an IPv4-mapped IPv6 address given as the IPv4 address it maps.
pub(crate) fn unmapped(a: std::net::SocketAddr) -> std::net::SocketAddr {
    match a {
        std::net::SocketAddr::V6(v) => match v.ip().to_ipv4_mapped() {
            Some(ip) => std::net::SocketAddr::new(ip.into(), v.port()),
            None => a,
        },
        a => a,
    }
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
        SockAddr::from(for_socket(a, v6))
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
    use nix::net::if_::InterfaceFlags;
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ifa in list {
        if !ifa.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let lo = ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        let Some(addr) = ifa.address else { continue };
        let (ip, prefix) = if let Some(sin) = addr.as_sockaddr_in() {
            let mask = ifa.netmask.as_ref().and_then(|m| m.as_sockaddr_in());
            let prefix = mask.map_or(32, |m| m.ip().to_bits().count_ones() as u8);
            (std::net::IpAddr::V4(sin.ip()), prefix)
        } else if let Some(sin) = addr.as_sockaddr_in6() {
            let ip = sin.ip();
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                continue; // link-local
            }
            let mask = ifa.netmask.as_ref().and_then(|m| m.as_sockaddr_in6());
            let prefix = mask.map_or(128, |m| m.ip().to_bits().count_ones() as u8);
            (std::net::IpAddr::V6(ip), prefix)
        } else {
            continue;
        };
        let name = ifa.interface_name;
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
    out.sort_by_key(|i| (i.lo, i.ip.is_ipv6()));
    out
}

/// Writes `bufs` to the connected stream socket `fd` with one `sendmsg` (a gathering
/// write, as `writev`), with `MSG_NOSIGNAL`: a peer that reset the connection gives
/// `EPIPE`, never a `SIGPIPE` that would kill a process that did not ignore it.
pub fn send_vectored(fd: BorrowedFd<'_>, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendFlags};
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    Ok(rustix::net::sendmsg(
        fd,
        bufs,
        &mut SendAncillaryBuffer::default(),
        flags,
    )?)
}

/// [`send_vectored`] of the first [`MAX_PIECES`] non-empty slices of `pieces` (0 when
/// there are none).
pub fn send_pieces<'a>(
    fd: BorrowedFd<'_>,
    pieces: impl Iterator<Item = &'a [u8]>,
) -> io::Result<usize> {
    // Left uninitialised: zeroing 64 vectors took about 200 of a 64-byte TCP hop's 2 900
    // user instructions (`callgrind`, `examples/path_cost 20000 tcp`).
    let mut iov = [const { std::mem::MaybeUninit::<io::IoSlice<'a>>::uninit() }; MAX_PIECES];
    let mut k = 0;
    for p in pieces.filter(|p| !p.is_empty()).take(MAX_PIECES) {
        iov[k].write(io::IoSlice::new(p));
        k += 1;
    }
    if k == 0 {
        return Ok(0);
    }
    // SAFETY: the first `k` entries were written just above.
    let iov = unsafe { std::slice::from_raw_parts(iov.as_ptr().cast::<io::IoSlice<'a>>(), k) };
    send_vectored(fd, iov)
}

/// Most slices one [`send_pieces`] writes.
pub const MAX_PIECES: usize = 64;

/// A TCP socket's `TCP_INFO` and the length the kernel filled in.
fn tcp_info(fd: RawFd) -> io::Result<(libc::tcp_info, usize)> {
    // SAFETY: tcp_info is plain data; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` describe a writable buffer of the option's size.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    })?;
    Ok((info, len as usize))
}

/// Payload bytes a TCP socket has put on the wire, resends included, and those of them
/// that were resends (`tcpi_bytes_sent` and `tcpi_bytes_retrans` of `TCP_INFO`, Linux
/// 4.19 and later; `Unsupported` on an older kernel).
pub fn tcp_wire_bytes(fd: RawFd) -> io::Result<(u64, u64)> {
    let (info, len) = tcp_info(fd)?;
    let need =
        std::mem::offset_of!(libc::tcp_info, tcpi_bytes_retrans) + std::mem::size_of::<u64>();
    if len < need {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel's TCP_INFO has no tcpi_bytes_sent (Linux 4.19 or later)",
        ));
    }
    Ok((info.tcpi_bytes_sent, info.tcpi_bytes_retrans))
}

/// What a TCP socket knows of its peer's host answering: segments sent and not yet
/// acknowledged, probes (zero-window or keepalive) sent and not answered, and the time
/// since the last acknowledgement came (`TCP_INFO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpAcks {
    /// Segments in flight, unacknowledged.
    pub unacked: u32,
    /// Zero-window or keepalive probes unanswered (any acknowledgement resets it).
    pub probes: u8,
    /// Since the last acknowledgement from the peer's host.
    pub last_ack: std::time::Duration,
}

/// [`TcpAcks`] of socket `fd`.
pub fn tcp_acks(fd: RawFd) -> io::Result<TcpAcks> {
    let (info, _) = tcp_info(fd)?;
    Ok(TcpAcks {
        unacked: info.tcpi_unacked,
        probes: info.tcpi_probes,
        last_ack: std::time::Duration::from_millis(info.tcpi_last_ack_recv.into()),
    })
}
