//! Small system helpers: errno, the clock, socket addresses.

use libc::{c_int, sockaddr, sockaddr_storage, socklen_t};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The calling thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Keeps errno across bookkeeping that may change it, so a wrapper returns the errno of
/// the call it forwarded.
pub struct SavedErrno(c_int);

impl SavedErrno {
    /// Saves the current errno.
    pub fn save() -> Self {
        SavedErrno(errno())
    }
}

impl Drop for SavedErrno {
    fn drop(&mut self) {
        set_errno(self.0)
    }
}

/// Monotonic time in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads an IPv4 or IPv6 socket address from C.
///
/// # Safety
/// `addr` must point to `len` readable bytes.
pub unsafe fn from_c(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: the family field is within `len` bytes (checked above).
    let family = unsafe { (*addr).sa_family } as c_int;
    match family {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the buffer holds a sockaddr_in (family and length checked).
            let a = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the buffer holds a sockaddr_in6 (family and length checked).
            let a = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn name_of(fd: c_int, peer: bool) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; zeroes are a valid value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    let p = &mut ss as *mut sockaddr_storage as *mut sockaddr;
    // SAFETY: the kernel writes at most `len` bytes into `ss`.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of a socket address.
    unsafe { from_c(p, len) }
}

/// The local address of socket `fd`.
pub fn local_addr(fd: c_int) -> Option<SocketAddr> {
    name_of(fd, false)
}

/// The peer address of socket `fd`.
pub fn peer_addr(fd: c_int) -> Option<SocketAddr> {
    name_of(fd, true)
}

/// Makes closing socket `fd` abort the connection with a reset (`SO_LINGER` on, zero
/// seconds), as the kernel does by itself for a socket closed with unread bytes.
pub fn reset_on_close(fd: c_int) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the kernel reads `size_of::<linger>()` bytes from `l`.
    unsafe {
        crate::real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as socklen_t,
        )
    };
}

/// An integer socket option.
pub fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `v`.
    let r = unsafe {
        crate::real::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

/// A send or receive timeout (SO_RCVTIMEO / SO_SNDTIMEO) in milliseconds; -1 for none.
pub fn sock_timeout_ms(fd: c_int, name: c_int) -> c_int {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `tv`.
    let r = unsafe {
        crate::real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            &mut tv as *mut libc::timeval as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
        return -1;
    }
    (tv.tv_sec * 1000 + tv.tv_usec / 1000).clamp(1, c_int::MAX as i64) as c_int
}

/// Whether `fd` is a TCP socket of the IPv4 or IPv6 family.
pub fn is_inet_tcp(fd: c_int) -> bool {
    let ty = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE);
    let proto = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL);
    let dom = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    ty == Some(libc::SOCK_STREAM)
        && proto == Some(libc::IPPROTO_TCP)
        && matches!(dom, Some(libc::AF_INET) | Some(libc::AF_INET6))
}

/// The abstract Unix socket address of `name` (a leading NUL, then the name).
pub fn abstract_addr(name: &str) -> (libc::sockaddr_un, socklen_t) {
    // SAFETY: sockaddr_un is plain data; zeroes are a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    let n = bytes.len().min(a.sun_path.len() - 1);
    for (i, b) in bytes[..n].iter().enumerate() {
        a.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as socklen_t)
}
