//! The sending direction of a connection: kernel writes up to the switch, then the
//! ring, waking the reader that sleeps; `sendfile` through the ring.

use super::*;

impl Conn {
    pub(super) fn wake_writer(&self, fd: c_int, s: &Shared) {
        let flag = s.writer_sleeping(self.rx_dir());
        if flag.load(Ordering::Relaxed) != 0
            && self.tx_on_ring()
            && flag.swap(0, Ordering::AcqRel) != 0
        {
            self.bell(fd);
        }
    }

    /// Sends from `iov` with send(2) `flags`: the kernel until this end switched, the ring
    /// after. Returns what sendmsg would, with errno set on -1.
    pub fn send(&self, fd: c_int, iov: &[iovec], flags: c_int) -> isize {
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        self.progress(fd, false);
        let mut sent = self.tx_sent.lock().unwrap_or_else(|e| e.into_inner());
        if self.peer_ready.load(Ordering::Acquire) {
            self.switch_tx(fd, *sent);
        }
        self.follow_leaving(fd);
        if !self.tx_on_ring() || total == 0 {
            let n = kernel_send(fd, iov, flags);
            if n > 0 {
                *sent += n as u64;
                self.counters
                    .kernel_tx
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            return n;
        }
        let Some(s) = self.shared.get() else {
            return -1;
        };
        let dontwait = flags & libc::MSG_DONTWAIT != 0 || self.nonblock.load(Ordering::Relaxed);
        let tx = self.tx_dir();
        let mut put = 0usize;
        loop {
            self.follow_leaving(fd);
            if !self.tx_on_ring() {
                // The reader left while this send waited: the rest goes by the kernel.
                let rest = slice_iov(iov, put, total - put);
                let n = kernel_send(fd, &rest, flags);
                if n > 0 {
                    *sent += n as u64;
                    self.counters
                        .kernel_tx
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                return match (n < 0, put > 0) {
                    (true, true) => put as isize,
                    (true, false) => -1,
                    _ => put as isize + n,
                };
            }
            // SAFETY: the iovecs are the caller's readable buffers; this thread holds the
            // send lock, so it is the direction's only writer in this process.
            let n = match unsafe { s.write(tx, iov, put, total - put) } {
                Ok(n) => n,
                Err(()) => {
                    set_errno(libc::EPROTO);
                    return -1;
                }
            };
            if n > 0 {
                put += n;
                self.counters.ring_tx.fetch_add(n as u64, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                let flag = s.reader_sleeping(tx);
                if flag.load(Ordering::Relaxed) != 0 {
                    match flag.swap(0, Ordering::AcqRel) {
                        0 => {}
                        READER_ON_WAKE_SOCKET if wake::ring(s.wake_socket(tx)) => {
                            self.counters.wake_datagrams.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => self.bell(fd),
                    }
                }
            }
            if put == total {
                return total as isize;
            }
            if n > 0 && dontwait {
                return put as isize;
            }
            if let Some(e) = self.peer_gone(fd) {
                if put > 0 {
                    return put as isize;
                }
                return fail_send(e, flags);
            }
            if dontwait {
                set_errno(libc::EAGAIN);
                return -1;
            }
            if let Err(e) = self.wait(fd, libc::POLLOUT, libc::SO_SNDTIMEO) {
                if put > 0 {
                    return put as isize;
                }
                if e == libc::EPIPE || e == libc::ECONNRESET {
                    return fail_send(e, flags);
                }
                set_errno(e);
                return -1;
            }
        }
    }

    /// sendfile(2) onto this connection: the kernel's own before the switch, a copy through
    /// the ring after it (the file's position or `*off` advances by what was sent).
    pub fn send_file(&self, fd: c_int, inp: c_int, off: *mut libc::off_t, count: usize) -> isize {
        {
            let mut sent = self.tx_sent.lock().unwrap_or_else(|e| e.into_inner());
            if self.peer_ready.load(Ordering::Acquire) {
                self.switch_tx(fd, *sent);
            }
            self.follow_leaving(fd);
            if !self.tx_on_ring() {
                // SAFETY: the caller's arguments, forwarded.
                let n = unsafe { real::sendfile(fd, inp, off, count) };
                if n > 0 {
                    *sent += n as u64;
                    self.counters
                        .kernel_tx
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                return n;
            }
        }
        let mut pos = if off.is_null() {
            // SAFETY: lseek on the caller's file (its position when `off` is null).
            unsafe { libc::lseek(inp, 0, libc::SEEK_CUR) }
        } else {
            // SAFETY: `off` is not null: the caller's offset, as sendfile reads it.
            unsafe { *off }
        };
        if pos < 0 {
            return -1;
        }
        let mut buf = vec![0u8; count.min(1 << 20)];
        let mut done = 0usize;
        while done < count {
            let want = (count - done).min(buf.len());
            // SAFETY: reading the caller's file into our own buffer.
            let r = unsafe { libc::pread(inp, buf.as_mut_ptr() as *mut libc::c_void, want, pos) };
            if r <= 0 {
                if r < 0 && done == 0 {
                    return -1;
                }
                break;
            }
            let w = self.send(
                fd,
                &[iovec {
                    iov_base: buf.as_mut_ptr() as *mut libc::c_void,
                    iov_len: r as usize,
                }],
                0,
            );
            if w <= 0 {
                if done == 0 {
                    return w;
                }
                break;
            }
            done += w as usize;
            pos += w as libc::off_t;
            if (w as usize) < r as usize {
                break;
            }
        }
        let _keep = sys::SavedErrno::save();
        // SAFETY: advancing the caller's offset or file position by what was sent.
        unsafe {
            if off.is_null() {
                libc::lseek(inp, pos, libc::SEEK_SET);
            } else {
                *off = pos;
            }
        }
        done as isize
    }
}
