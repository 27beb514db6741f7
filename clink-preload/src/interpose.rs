//! The exported symbols that take the place of the C library's socket calls. Each one
//! forwards to the C library unless the descriptor is a followed connection; forwarding
//! keeps arguments, return value and errno exactly as the application gave and expects.

use crate::conn::{close_fd, Conn, Why};
use crate::sys::{self, errno, set_errno, SavedErrno};
use crate::{config, real, stats, table, wait};
use libc::{
    c_char, c_int, c_void, iovec, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec,
};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Descriptors whose owner asked for something only the kernel does (TCP_REPAIR, kTLS,
/// TCP_MD5SIG, IP_TRANSPARENT): never paired.
static KERNEL_ONLY: Mutex<Option<HashSet<c_int>>> = Mutex::new(None);

fn kernel_only(fd: c_int) -> bool {
    KERNEL_ONLY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&fd))
}

/// Whether any descriptor was ever marked kernel-only (close skips the set otherwise).
static ANY_KERNEL_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn set_kernel_only(fd: c_int, on: bool) {
    if on {
        ANY_KERNEL_ONLY.store(true, std::sync::atomic::Ordering::Release);
    } else if !ANY_KERNEL_ONLY.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let mut g = KERNEL_ONLY.lock().unwrap_or_else(|e| e.into_inner());
    let s = g.get_or_insert_with(HashSet::new);
    if on {
        s.insert(fd);
    } else {
        s.remove(&fd);
    }
}

fn one(buf: *const c_void, n: size_t) -> [iovec; 1] {
    [iovec {
        iov_base: buf as *mut c_void,
        iov_len: n,
    }]
}

/// # Safety
/// `iov` must point to `n` iovecs (or `n` is 0).
unsafe fn iovs<'a>(iov: *const iovec, n: usize) -> Option<&'a [iovec]> {
    if n > libc::UIO_MAXIOV as usize || (n > 0 && iov.is_null()) {
        return None;
    }
    if n == 0 {
        return Some(&[]);
    }
    // SAFETY: the caller's array of `n` iovecs.
    Some(unsafe { std::slice::from_raw_parts(iov, n) })
}

/// The accelerated connection a send with `flags` on `fd` goes through, if any. Urgent
/// data (`MSG_OOB`) is outside the byte stream the rings carry: the connection goes back
/// to the kernel first (for good), so the urgent byte follows the ring's data in order.
fn sending_on(fd: c_int, flags: c_int) -> Option<Arc<Conn>> {
    let c = table::get(fd)?;
    if flags & libc::MSG_OOB != 0 {
        drop(c);
        crate::exec::leave_fd(fd, Why::Call("urgent data sent"));
        return None;
    }
    Some(c)
}

/// The accelerated connection a receive with `flags` on `fd` reads, if any: a receive of
/// urgent data (`MSG_OOB`) asks the kernel, which holds the only urgent byte there can be
/// (a peer sends one only once it is back on the kernel) and leaves the stream alone.
fn receiving_on(fd: c_int, flags: c_int) -> Option<Arc<Conn>> {
    table::get(fd).filter(|_| flags & libc::MSG_OOB == 0)
}

/// Takes each of `fds` that is an accelerated connection back to the kernel before a call
/// (`what`) that moves its bytes without passing through the wrappers.
fn kernel_call(what: &'static str, fds: &[c_int]) {
    for &fd in fds {
        crate::exec::leave_fd(fd, Why::Call(what));
    }
}

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
    ts: *mut timespec,
) -> c_int {
    kernel_call("recvmmsg", &[fd]);
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::recvmmsg(fd, msgs, n, flags, ts) }
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
) -> c_int {
    kernel_call("sendmmsg", &[fd]);
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::sendmmsg(fd, msgs, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    n: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    kernel_call("splice", &[fd_in, fd_out]);
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::splice(fd_in, off_in, fd_out, off_out, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if !config().enabled || table::get(fd).is_some() {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::connect(fd, addr, len) };
    }
    // SAFETY: the caller's address of `len` bytes.
    let dst = unsafe { sys::from_c(addr, len) };
    let listener = match dst {
        Some(dst) if sys::is_inet_tcp(fd) && !kernel_only(fd) => Conn::before_connect(fd, dst),
        _ => None,
    };
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::connect(fd, addr, len) };
    let e = errno();
    if let Some(l) = listener {
        if r == 0 || e == libc::EINPROGRESS || e == libc::EINTR {
            table::insert(fd, Arc::new(Conn::connecting(fd, l)));
        } else {
            close_fd(l);
        }
    }
    set_errno(e);
    r
}

fn after_accept(r: c_int) -> c_int {
    if r < 0 || !config().enabled {
        return r;
    }
    let _keep = SavedErrno::save();
    if !sys::is_inet_tcp(r) {
        return r;
    }
    match Conn::accepted(r, config().ring) {
        Ok(c) => table::insert(r, Arc::new(c)),
        Err(why) => stats::record_plain(r, why),
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    after_accept(unsafe { real::accept4(fd, addr, len, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    after_accept(unsafe { real::accept4(fd, addr, len, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    match table::get(fd) {
        Some(c) => c.recv(fd, &one(buf, n), 0),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::read(fd, buf, n) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    match table::get(fd) {
        Some(c) => c.send(fd, &one(buf, n), 0),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::write(fd, buf, n) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: the caller's array of iovecs of the count it gives.
    match (table::get(fd), unsafe { iovs(iov, n.max(0) as usize) }) {
        (Some(c), Some(v)) if n >= 0 => c.recv(fd, v, 0),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        _ => unsafe { real::readv(fd, iov, n) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: the caller's array of iovecs of the count it gives.
    match (table::get(fd), unsafe { iovs(iov, n.max(0) as usize) }) {
        (Some(c), Some(v)) if n >= 0 => c.send(fd, v, 0),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        _ => unsafe { real::writev(fd, iov, n) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    match receiving_on(fd, flags) {
        Some(c) => c.recv(fd, &one(buf, n), flags),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::recv(fd, buf, n, flags) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    match sending_on(fd, flags) {
        Some(c) => c.send(fd, &one(buf, n), flags),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::send(fd, buf, n, flags) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    match receiving_on(fd, flags) {
        Some(c) => {
            let r = c.recv(fd, &one(buf, n), flags);
            if r >= 0 && !alen.is_null() {
                // TCP reports no source address (the kernel sets the length to 0 too).
                // SAFETY: the caller's length word (not null), which recvfrom may write.
                unsafe { *alen = 0 };
            }
            r
        }
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::recvfrom(fd, buf, n, flags, addr, alen) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { recvfrom(fd, buf, n, flags, addr, alen) }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    match sending_on(fd, flags) {
        Some(c) if flags & libc::MSG_FASTOPEN == 0 => c.send(fd, &one(buf, n), flags),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        _ => unsafe { real::sendto(fd, buf, n, flags, addr, alen) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let Some(c) = receiving_on(fd, flags) else {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::recvmsg(fd, msg, flags) };
    };
    if msg.is_null() {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::recvmsg(fd, msg, flags) };
    }
    // SAFETY: the caller's msghdr and its iovecs.
    let m = unsafe { &mut *msg };
    // SAFETY: the caller's array of iovecs of the count it gives.
    let Some(v) = (unsafe { iovs(m.msg_iov, m.msg_iovlen) }) else {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::recvmsg(fd, msg, flags) };
    };
    let r = c.recv(fd, v, flags);
    if r >= 0 {
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
    }
    r
}

/// Connections whose descriptors a message passes to another process go back to the
/// kernel first: the receiver may read them without the library.
fn leave_passed(msg: *const msghdr) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the caller's msghdr and its control messages, walked with the C macros.
    unsafe {
        let m = &*msg;
        if m.msg_control.is_null() || m.msg_controllen == 0 {
            return;
        }
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let k = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize) / 4;
                let data = libc::CMSG_DATA(c) as *const c_int;
                for i in 0..k {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    crate::exec::leave_fd(fd, Why::Escaped);
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    if config().enabled {
        let _keep = SavedErrno::save();
        leave_passed(msg);
    }
    let Some(c) = sending_on(fd, flags) else {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    if msg.is_null() || flags & libc::MSG_FASTOPEN != 0 {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::sendmsg(fd, msg, flags) };
    }
    // SAFETY: the caller's msghdr and its iovecs.
    let m = unsafe { &*msg };
    // SAFETY: the caller's array of iovecs of the count it gives.
    match unsafe { iovs(m.msg_iov, m.msg_iovlen) } {
        Some(v) => c.send(fd, v, flags),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::sendmsg(fd, msg, flags) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() || n == 0 || n > 1 << 20 {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::poll(fds, n, timeout) };
    }
    // SAFETY: the caller's array of `n` pollfds.
    wait::poll(
        unsafe { std::slice::from_raw_parts_mut(fds, n as usize) },
        timeout,
        std::ptr::null(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        chk_fail();
    }
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if fds.is_null() || n == 0 || n > 1 << 20 {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        return unsafe { real::ppoll(fds, n, ts, mask) };
    }
    // SAFETY: the caller's array of `n` pollfds.
    wait::poll(
        unsafe { std::slice::from_raw_parts_mut(fds, n as usize) },
        wait::ts_to_ms(ts),
        mask,
    )
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        chk_fail();
    }
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { ppoll(fds, n, ts, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let ms = if tv.is_null() {
        -1
    } else {
        // SAFETY: the caller's timeval.
        let t = unsafe { *tv };
        (t.tv_sec * 1000 + (t.tv_usec + 999) / 1000).clamp(0, c_int::MAX as i64) as c_int
    };
    match wait::select(n, r, w, e, ms, std::ptr::null()) {
        Some(x) => x,
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::select(n, r, w, e, tv) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    match wait::select(n, r, w, e, wait::ts_to_ms(ts), mask) {
        Some(x) => x,
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::pselect(n, r, w, e, ts, mask) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::epoll_ctl(epfd, op, fd, ev) };
    if r == 0 {
        let _keep = SavedErrno::save();
        wait::epoll_ctl(epfd, op, fd, ev);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    match wait::epoll_wait(epfd, evs, max, timeout, std::ptr::null()) {
        Some(x) => x,
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::epoll_wait(epfd, evs, max, timeout) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    match wait::epoll_wait(epfd, evs, max, timeout, mask) {
        Some(x) => x,
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::epoll_pwait(epfd, evs, max, timeout, mask) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    match wait::epoll_wait(epfd, evs, max, wait::ts_to_ms(ts), mask) {
        Some(x) => x,
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::epoll_pwait2(epfd, evs, max, ts, mask) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if crate::conn::is_own(fd) {
        // Not the application's: to it, not an open descriptor.
        set_errno(libc::EBADF);
        return -1;
    }
    if config().enabled {
        let _keep = SavedErrno::save();
        before_close(fd);
    }
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::close(fd) }
}

/// What closing the application's descriptor `fd` ends here (see [`forget`]), the
/// connection's wake-up bytes read first.
fn before_close(fd: c_int) {
    if let Some(c) = forget(fd) {
        // Its last descriptor here when no other (a dup) is followed as the same one.
        c.before_close(fd, || {
            !table::all().iter().any(|(_, other)| Arc::ptr_eq(other, &c))
        });
    }
}

/// Forgets the application's descriptor `fd` (closing, or replaced by `dup2`): its
/// connection (returned), its memberships of epoll sets, its kernel-only mark.
fn forget(fd: c_int) -> Option<Arc<Conn>> {
    let gone = table::remove(fd);
    wait::forget(fd, gone.as_deref());
    set_kernel_only(fd, false);
    gone
}

/// `close_range`'s flag that marks the descriptors close-on-exec instead of closing them.
const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;

/// Closes the application's descriptors from `first` to `last` as [`close`] does each
/// (daemons close every descriptor they do not know of this way), in runs around the
/// library's own, which stay open.
#[no_mangle]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    if !config().enabled || flags & CLOSE_RANGE_CLOEXEC != 0 || first > last {
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the
        // same contract.
        return unsafe { real::close_range(first, last, flags) };
    }
    // No descriptor is numbered at or above the limit on open files (the library's own
    // included).
    // SAFETY: sysconf has no preconditions.
    let open_max =
        unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(1, c_int::MAX as libc::c_long);
    let top = last.min(open_max as libc::c_uint - 1);
    let mut from = first;
    for fd in first..=top {
        if crate::conn::is_own(fd as c_int) {
            if from < fd {
                // SAFETY: closing a run of the application's descriptors, as it asked.
                let r = unsafe { real::close_range(from, fd - 1, flags) };
                if r != 0 {
                    return r;
                }
            }
            from = fd + 1;
        } else {
            let _keep = SavedErrno::save();
            before_close(fd as c_int);
        }
    }
    if from > last {
        return 0;
    }
    // SAFETY: closing the rest of the range, the application's descriptors.
    unsafe { real::close_range(from, last, flags) }
}

fn after_dup(old: c_int, new: c_int) -> c_int {
    if new >= 0 && new != old {
        let _keep = SavedErrno::save();
        if let Some(c) = table::get(old) {
            table::insert(new, c);
        }
    }
    new
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    after_dup(fd, unsafe { real::dup(fd) })
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::dup2(fd, to) };
    if r >= 0 && fd != to {
        let _keep = SavedErrno::save();
        forget(to);
    }
    after_dup(fd, r)
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::dup3(fd, to, flags) };
    if r >= 0 {
        let _keep = SavedErrno::save();
        forget(to);
    }
    after_dup(fd, r)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r < 0 {
        return r;
    }
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => after_dup(fd, r),
        libc::F_SETFL => {
            if let Some(c) = table::get(fd) {
                c.nonblock.store(
                    arg as c_int & libc::O_NONBLOCK != 0,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            r
        }
        _ => r,
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int {
    if let Some(c) = table::get(fd) {
        if req == libc::FIONREAD && !arg.is_null() {
            if let Some(n) = c.pending() {
                // SAFETY: FIONREAD's argument is an int the caller provides.
                unsafe { *(arg as *mut c_int) = n };
                return 0;
            }
        }
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        let r = unsafe { real::ioctl(fd, req, arg) };
        if r == 0 && req == libc::FIONBIO && !arg.is_null() {
            // SAFETY: FIONBIO's argument is an int the caller provides.
            let on = unsafe { *(arg as *const c_int) } != 0;
            c.nonblock.store(on, std::sync::atomic::Ordering::Relaxed);
        }
        return r;
    }
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::ioctl(fd, req, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if level == libc::IPPROTO_TCP
        && name == libc::TCP_NODELAY
        && !val.is_null()
        && len as usize >= std::mem::size_of::<c_int>()
    {
        if let Some(c) = table::get(fd) {
            // SAFETY: the caller's option value, at least an int long (checked above).
            let v = unsafe { std::ptr::read_unaligned(val as *const c_int) };
            if let Some(r) = c.app_sets_nodelay(fd, v) {
                return r;
            }
        }
    }
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    let kernel = (level == libc::IPPROTO_TCP
        && matches!(name, libc::TCP_REPAIR | libc::TCP_ULP | libc::TCP_MD5SIG))
        || (level == libc::SOL_IP && name == libc::IP_TRANSPARENT);
    if r == 0 && kernel {
        let _keep = SavedErrno::save();
        set_kernel_only(fd, true);
    }
    if r == 0 && level == libc::SOL_SOCKET && name == libc::SO_RCVTIMEO {
        if let Some(c) = table::get(fd) {
            c.rcv_timeout_changed();
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    let r = unsafe { real::getsockopt(fd, level, name, val, len) };
    if r == 0 && level == libc::IPPROTO_TCP && name == libc::TCP_NODELAY && !val.is_null() {
        // SAFETY: the kernel just wrote the option through the caller's length.
        let n = unsafe { *len } as usize;
        if n >= std::mem::size_of::<c_int>() {
            if let Some(app) = table::get(fd).and_then(|c| c.app_nodelay()) {
                // SAFETY: the caller's buffer, holding at least an int (checked above).
                unsafe { std::ptr::write_unaligned(val as *mut c_int, app) };
            }
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    match table::get(out) {
        Some(c) => c.send_file(out, inp, off, n),
        // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
        // contract.
        None => unsafe { real::sendfile(out, inp, off, n) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, passed on to this library's own version of the call.
    unsafe { sendfile(out, inp, off, n) }
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    crate::exec::execve(path, argv, envp)
}

/// Exported calls that start a program, after the connections whose descriptors it
/// would inherit went back to the kernel (`exec::before_exec`).
macro_rules! leaving_first {
    ($( fn $name:ident($($a:ident: $t:ty),*) -> $r:ty; )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
                crate::exec::before_exec();
                // SAFETY: the caller's arguments, passed unchanged to the C library's call
                // of the same contract.
                unsafe { real::$name($($a),*) }
            }
        )*
    };
}

// The C library runs the exec family and the children that system(), popen() and
// posix_spawn() start through its internal execve, which no wrapper sees.
leaving_first! {
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn posix_spawn(
        pid: *mut libc::pid_t,
        path: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char
    ) -> c_int;
    fn posix_spawnp(
        pid: *mut libc::pid_t,
        file: *const c_char,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char,
        envp: *const *mut c_char
    ) -> c_int;
    fn system(cmd: *const c_char) -> c_int;
    fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE;
}

/// A stdio stream over an accelerated connection would read and write the kernel socket
/// inside the C library, past the wrappers: the connection leaves first.
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    crate::exec::leave_fd(fd, Why::Escaped);
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::fdopen(fd, mode) }
}

/// io_uring reads and writes sockets in the kernel, past the wrappers: a process that sets
/// one up has its connections leave and pairs no more (liburing versions that make the
/// system call themselves, without `syscall`, are not seen).
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: libc::c_long,
    a: libc::c_long,
    b: libc::c_long,
    c: libc::c_long,
    d: libc::c_long,
    e: libc::c_long,
    f: libc::c_long,
) -> libc::c_long {
    if n == libc::SYS_io_uring_setup {
        // Leave first: leave_where does nothing once pairing is off.
        crate::exec::leave_where(Why::Call("io_uring"), |_| true);
        crate::disable();
    }
    // SAFETY: the caller's arguments, passed unchanged to the C library's call of the same
    // contract.
    unsafe { real::syscall(n, a, b, c, d, e, f) }
}

fn chk_fail() -> ! {
    extern "C" {
        fn __chk_fail() -> !;
    }
    // SAFETY: the C library's report of a buffer overflow; it does not return.
    unsafe { __chk_fail() }
}
