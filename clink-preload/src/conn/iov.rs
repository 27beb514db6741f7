//! The caller's buffers: cutting iovec lists and moving bytes between them and the
//! kernel socket.

use super::*;

/// Copies `src` into the iovecs from byte `skip` on; returns the count.
pub(super) fn scatter(iov: &[iovec], skip: usize, src: &[u8]) -> usize {
    let mut done = 0;
    for v in slice_iov(iov, skip, src.len()) {
        // SAFETY: the caller's writable buffer, cut to its own length.
        unsafe {
            std::ptr::copy_nonoverlapping(src[done..].as_ptr(), v.iov_base as *mut u8, v.iov_len)
        };
        done += v.iov_len;
    }
    done
}

/// Copies `n` bytes of the iovecs from byte `skip` on.
pub(super) fn gather(iov: &[iovec], skip: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    for v in slice_iov(iov, skip, n) {
        // SAFETY: the caller's buffer, which the kernel just filled.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
        });
    }
    out
}

/// Copies of the iovecs covering bytes `skip..skip + limit`.
pub(super) fn slice_iov(iov: &[iovec], skip: usize, limit: usize) -> Vec<iovec> {
    let mut out = Vec::with_capacity(iov.len());
    crate::shared::for_each_span(iov, skip, limit, |p, len| {
        out.push(iovec {
            iov_base: p as *mut libc::c_void,
            iov_len: len,
        })
    });
    out
}

pub(super) fn kernel_recv(
    fd: c_int,
    iov: &[iovec],
    skip: usize,
    limit: usize,
    flags: c_int,
) -> isize {
    let mut v = slice_iov(iov, skip, limit);
    // SAFETY: msghdr is plain data; zeroes are a valid value.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = v.as_mut_ptr();
    m.msg_iovlen = v.len() as _;
    // SAFETY: the iovecs are the caller's buffers, cut to `limit` bytes.
    unsafe { real::recvmsg(fd, &mut m, flags) }
}

pub(super) fn kernel_send(fd: c_int, iov: &[iovec], flags: c_int) -> isize {
    // SAFETY: msghdr is plain data; zeroes are a valid value.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.as_ptr() as *mut iovec;
    m.msg_iovlen = iov.len() as _;
    // SAFETY: the iovecs are the caller's buffers.
    unsafe { real::sendmsg(fd, &m, flags) }
}
