//! The receiving direction of a connection: kernel bytes up to the switch, then the
//! ring, sleeping in the kernel on the socket when there is nothing.

use super::*;

impl Conn {
    /// Counts bytes read off the kernel as wake-ups, keeping any that are data after all.
    pub(super) fn keep_data(&self, read: &[u8]) {
        let extra = self.note_bells(read.len() as u64) as usize;
        if extra > 0 {
            self.carried.store(true, Ordering::Release);
            self.carry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&read[read.len() - extra..]);
        }
    }

    /// Reads wake-up bytes off the kernel socket (only called once the reader is in the
    /// ring, where every kernel byte is a wake-up), noting end of stream and errors.
    pub(super) fn drain(&self, fd: c_int) {
        let mut scratch = [0u8; 256];
        loop {
            // SAFETY: a non-blocking receive into our own buffer.
            let n = unsafe {
                real::recv(
                    fd,
                    scratch.as_mut_ptr() as *mut libc::c_void,
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                self.keep_data(&scratch[..n as usize]);
            }
            if n as usize == scratch.len() {
                continue;
            }
            if n > 0 {
                return; // the queue was empty when the kernel answered
            }
            if n == 0 {
                self.eof.store(true, Ordering::Release);
            } else {
                let e = errno();
                if e != libc::EAGAIN && e != libc::EINTR {
                    self.err.store(e, Ordering::Release);
                }
            }
            return;
        }
    }

    /// Whether the ring still holds bytes the writer put there before it went back to
    /// the kernel. Bytes kept aside from the kernel ([`Conn::keep_data`]) were sent after
    /// it went back (they follow its last wake-up), so these come first: a reader asleep
    /// in the kernel can take the writer's last wake-up and the data after it in one
    /// read before it has drained the ring.
    fn ring_before_carry(&self) -> bool {
        let Some(s) = self.shared.get() else {
            return false;
        };
        let rx = self.rx_dir();
        let uns = s.unswitch_at(rx).load(Ordering::Acquire);
        uns != NOT_SWITCHED && s.head(rx).load(Ordering::Acquire) != uns
    }

    /// Receives into `iov` with recv(2) `flags`: the kernel up to the switch offset, the
    /// ring after it, and the kernel again if the writer went back to it. Returns what
    /// recvmsg would, with errno set on -1.
    pub fn recv(&self, fd: c_int, iov: &[iovec], flags: c_int) -> isize {
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let peek = flags & libc::MSG_PEEK != 0;
        let dontwait = flags & libc::MSG_DONTWAIT != 0 || self.nonblock.load(Ordering::Relaxed);
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek && !dontwait;
        self.progress(fd, false);
        self.switch_if_ready(fd);
        self.check_leaving(fd);
        let mut consumed = self.rx_consumed.lock().unwrap_or_else(|e| e.into_inner());
        let mut got = 0usize;
        let rx = self.rx_dir();
        let done = |got: usize| !waitall || got == total || peek;
        loop {
            // Data read off the kernel as wake-ups comes first, once the ring holds
            // nothing the writer put there before it went back to the kernel.
            if self.carried.load(Ordering::Acquire) && !self.ring_before_carry() {
                let mut carry = self.carry.lock().unwrap_or_else(|e| e.into_inner());
                if !carry.is_empty() && got < total {
                    let n = scatter(iov, got, &carry);
                    if !peek {
                        carry.drain(..n);
                        self.counters
                            .kernel_rx
                            .fetch_add(n as u64, Ordering::Relaxed);
                    }
                    got += n;
                    if done(got) {
                        return got as isize;
                    }
                }
            }
            let s = self.shared.get();
            let sw = self.rx_switch_at();
            if sw == NOT_SWITCHED || *consumed < sw {
                // Before the writer's switch: kernel bytes are data, up to the switch.
                let limit = if sw == NOT_SWITCHED {
                    total - got
                } else {
                    (total - got).min((sw - *consumed) as usize)
                };
                let mut kflags = flags & !libc::MSG_WAITALL;
                if got > 0 && !waitall {
                    kflags |= libc::MSG_DONTWAIT;
                }
                // Asleep in the kernel before the switch: the flag asks the writer for a
                // wake-up byte if it switches meanwhile.
                let sleeper = match s {
                    Some(s)
                        if sw == NOT_SWITCHED && kflags & libc::MSG_DONTWAIT == 0 && !dontwait =>
                    {
                        s.reader_sleeping(rx).store(1, Ordering::SeqCst);
                        fence(Ordering::SeqCst);
                        if self.rx_switch_at() != NOT_SWITCHED {
                            s.reader_sleeping(rx).store(0, Ordering::Relaxed);
                            continue;
                        }
                        Some(s)
                    }
                    _ => None,
                };
                let n = kernel_recv(fd, iov, got, limit, kflags);
                if let Some(s) = sleeper {
                    let _keep = sys::SavedErrno::save();
                    s.reader_sleeping(rx).store(0, Ordering::Relaxed);
                }
                if n < 0 {
                    return if got > 0 && errno() == libc::EAGAIN {
                        got as isize
                    } else {
                        -1
                    };
                }
                if n == 0 {
                    if limit == 0 {
                        return got as isize;
                    }
                    // End of stream by the kernel: the peer may have moved to the ring
                    // and closed after writing there.
                    let now = self.rx_switch_at();
                    if now != NOT_SWITCHED && *consumed >= now {
                        self.eof.store(true, Ordering::Release);
                        continue;
                    }
                    return got as isize;
                }
                let sw2 = self.rx_switch_at();
                let Ok(data) = kernel_share(*consumed, sw2, n as u64) else {
                    set_errno(libc::EPROTO);
                    return -1;
                };
                if !peek {
                    *consumed += data;
                    self.consumed_mirror.store(*consumed, Ordering::Release);
                    self.counters.kernel_rx.fetch_add(data, Ordering::Relaxed);
                    if (n as u64) > data {
                        // Past the switch: wake-ups (or, if the writer already went back,
                        // data kept for the next read).
                        let extra = gather(iov, got + data as usize, n as usize - data as usize);
                        self.keep_data(&extra);
                    }
                }
                got += data as usize;
                if data > 0 && !self.pairing_done.load(Ordering::Acquire) {
                    self.progress(fd, true);
                }
                if got > 0 && done(got) {
                    return got as isize;
                }
                continue;
            }
            let Some(s) = s else { return got as isize };
            if self.rx_resumed.load(Ordering::Acquire) {
                // The writer went back to the kernel: skip the wake-ups it sent before,
                // then the kernel carries data again.
                let pos = sw.saturating_add(self.bells_seen.load(Ordering::Acquire));
                let resume = s.resume_at(rx).load(Ordering::Acquire);
                if pos < resume {
                    let mut scratch = [0u8; 256];
                    let want = ((resume - pos) as usize).min(scratch.len());
                    let kflags = if dontwait || got > 0 {
                        libc::MSG_DONTWAIT
                    } else {
                        0
                    };
                    // SAFETY: a receive into our own buffer.
                    let n = unsafe {
                        real::recv(fd, scratch.as_mut_ptr() as *mut libc::c_void, want, kflags)
                    };
                    if n <= 0 {
                        return if got > 0 { got as isize } else { n };
                    }
                    self.bells_seen.fetch_add(n as u64, Ordering::AcqRel);
                    continue;
                }
                let mut kflags = flags & !libc::MSG_WAITALL;
                if got > 0 && !waitall {
                    kflags |= libc::MSG_DONTWAIT;
                }
                let n = kernel_recv(fd, iov, got, total - got, kflags);
                if n < 0 {
                    return if got > 0 && errno() == libc::EAGAIN {
                        got as isize
                    } else {
                        -1
                    };
                }
                if !peek {
                    self.counters
                        .kernel_rx
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                got += n as usize;
                if n == 0 || done(got) {
                    return got as isize;
                }
                continue;
            }
            // The ring.
            if !self.pairing_done.load(Ordering::Acquire) {
                self.progress(fd, true);
                self.switch_if_ready(fd);
            }
            // SAFETY: the iovecs are the caller's writable buffers; this thread holds the
            // receive lock, so it is the direction's only reader in this process.
            let n = match unsafe { s.read(rx, iov, got, total - got, peek) } {
                Ok(n) => n,
                Err(()) => {
                    set_errno(libc::EPROTO);
                    return -1;
                }
            };
            if n > 0 {
                got += n;
                if !peek {
                    self.counters.ring_rx.fetch_add(n as u64, Ordering::Relaxed);
                    fence(Ordering::SeqCst);
                    self.wake_writer(fd, s);
                }
                if done(got) {
                    return got as isize;
                }
                continue;
            }
            let uns = s.unswitch_at(rx).load(Ordering::Acquire);
            if uns != NOT_SWITCHED && s.head(rx).load(Ordering::Relaxed) == uns {
                self.rx_resumed.store(true, Ordering::Release);
                continue;
            }
            if got > 0 && !waitall {
                return got as isize;
            }
            if self.eof.load(Ordering::Acquire) {
                return got as isize;
            }
            let e = self.err.swap(0, Ordering::AcqRel);
            if e != 0 {
                set_errno(e);
                return -1;
            }
            if dontwait {
                // The kernel socket is asked (a system call) at most every DRAIN_EVERY_NS
                // on this path: an application polling a non-blocking socket in a loop
                // learns of an end of stream that late, while one that waits in poll or
                // epoll learns at once (the end wakes it, and its readiness is checked).
                let now = now_ns();
                if now.saturating_sub(self.last_drain_ns.load(Ordering::Relaxed)) >= DRAIN_EVERY_NS
                {
                    self.last_drain_ns.store(now, Ordering::Relaxed);
                    self.drain(fd);
                }
                if self.eof.load(Ordering::Acquire) || self.err.load(Ordering::Acquire) != 0 {
                    continue; // recheck the ring: data written before the close comes first
                }
                if s.readable(rx).map(|n| n > 0).unwrap_or(true) || self.carry_pending() {
                    continue;
                }
                if s.unswitch_at(rx).load(Ordering::Acquire) != NOT_SWITCHED {
                    continue;
                }
                if got > 0 {
                    return got as isize;
                }
                set_errno(libc::EAGAIN);
                return -1;
            }
            if let Err(e) = self.wait(fd, libc::POLLIN, libc::SO_RCVTIMEO) {
                if got > 0 {
                    return got as isize;
                }
                set_errno(e);
                return -1;
            }
        }
    }

    /// A reader's sleep when it is this process's only sleeper: on its wake socket and
    /// the kernel socket (`wake.rs`), or, without a wake socket, a blocking receive of
    /// wake-up bytes, which sleeps and consumes the wake-up in one system call (as a kernel
    /// recv would); either honours SO_RCVTIMEO and SA_RESTART as the application's own recv
    /// would. `None` when this sleep does not apply (poll-based sleep instead).
    pub(super) fn sleep_in_recv(&self, fd: c_int) -> Option<Result<(), c_int>> {
        if !self.rx_in_ring() {
            return None;
        }
        if enter_sleep(-1) != -1 {
            leave_sleep();
            return None;
        }
        if let Some(r) = self.sleep_on_wake_socket(fd) {
            leave_sleep();
            return Some(r);
        }
        let r = if !self.arm(libc::POLLIN) {
            Ok(())
        } else {
            let mut scratch = [0u8; 256];
            // SAFETY: a blocking receive into our own buffer.
            let n = unsafe {
                real::recv(
                    fd,
                    scratch.as_mut_ptr() as *mut libc::c_void,
                    scratch.len(),
                    0,
                )
            };
            let e = errno();
            self.disarm();
            if n == 0 {
                self.eof.store(true, Ordering::Release);
                Ok(())
            } else if n > 0 {
                self.keep_data(&scratch[..n as usize]);
                Ok(())
            } else if e == libc::EAGAIN || e == libc::EINTR {
                Err(e)
            } else {
                self.err.store(e, Ordering::Release);
                Ok(())
            }
        };
        leave_sleep();
        Some(r)
    }
}
