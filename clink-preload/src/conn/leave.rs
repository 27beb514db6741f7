//! Going back to the kernel: a connection whose descriptor escapes (exec, a passed
//! descriptor, stdio, io_uring) leaves the rings, with the wake-up bytes counted so that
//! both ends know where the kernel stream carries data again.

use super::*;

/// Why a connection goes back to the kernel (its statistics line says it).
#[derive(Clone, Copy, Debug)]
pub enum Why {
    /// Its descriptor escapes to a program that reads and writes the kernel socket itself
    /// (exec, a passed descriptor, stdio).
    Escaped,
    /// The application makes a call the rings cannot serve with the kernel's semantics
    /// (`recvmmsg`, `splice`, urgent data, io_uring), named here.
    Call(&'static str),
}

impl Conn {
    /// Sends one wake-up byte on this end's outgoing kernel stream, counted in the mapping
    /// so that a reader who leaves can read exactly the wake-ups sent to it, and not at all
    /// once that reader is leaving or this end went back to the kernel.
    pub(super) fn bell(&self, fd: c_int) {
        let Some(s) = self.shared.get() else { return };
        let d = self.tx_dir();
        s.bells_in_flight(d).fetch_add(1, Ordering::SeqCst);
        if !self.tx_back.load(Ordering::SeqCst)
            && s.leaving(d).load(Ordering::SeqCst) == 0
            && doorbell(fd)
        {
            s.bells_sent(d).fetch_add(1, Ordering::SeqCst);
        }
        s.bells_in_flight(d).fetch_sub(1, Ordering::SeqCst);
    }

    /// If the peer's reader is leaving (its descriptor escapes to a program that reads
    /// the kernel socket itself): sends what the ring holds unread by the kernel and stays
    /// on the kernel. Needs the send lock; a thread holding it does this itself.
    pub(super) fn follow_leaving(&self, fd: c_int) {
        let Some(s) = self.shared.get() else { return };
        let d = self.tx_dir();
        if self.tx_back.load(Ordering::Acquire) || s.leaving(d).load(Ordering::SeqCst) == 0 {
            return;
        }
        self.tx_back.store(true, Ordering::SeqCst);
        self.give_back_nodelay(fd);
        if !self.tx_switched.load(Ordering::Acquire) {
            return;
        }
        let head = s.head(d).load(Ordering::Acquire);
        let tail = s.tail(d).load(Ordering::Relaxed);
        if let Ok(n) = clink_proto::sockets::ring_readable(head, tail, s.ring_size()) {
            let bytes = s.copy_out(d, head, n as usize);
            if send_all(fd, &bytes) {
                self.counters.kernel_tx.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// [`Conn::follow_leaving`] from a path that does not hold the send lock.
    pub(super) fn check_leaving(&self, fd: c_int) {
        if let Some(s) = self.shared.get() {
            if !self.tx_back.load(Ordering::Acquire)
                && s.leaving(self.tx_dir()).load(Ordering::Acquire) != 0
            {
                if let Ok(_g) = self.tx_sent.try_lock() {
                    self.follow_leaving(fd);
                }
            }
        }
    }

    /// This end goes back to the kernel for good (`why`): asks the peer to resend by the
    /// kernel what the ring holds unread, reads the wake-up bytes queued for this end
    /// exactly, and puts this end's own sending direction back on the kernel at a stream
    /// position the peer can tell.
    pub fn leave(&self, fd: c_int, why: Why) {
        let Some(s) = self.shared.get() else { return };
        let (rx, tx) = (self.rx_dir(), self.tx_dir());
        let _keep = sys::SavedErrno::save();
        s.leaving(rx).store(1, Ordering::SeqCst);
        s.reader_sleeping(rx).store(0, Ordering::SeqCst);
        wait_until(|| s.bells_in_flight(rx).load(Ordering::SeqCst) == 0);
        let consumed = self.consumed_mirror.load(Ordering::Acquire);
        let sw = self.rx_switch_at();
        if sw != NOT_SWITCHED && consumed >= sw {
            let mut want = s
                .bells_sent(rx)
                .load(Ordering::SeqCst)
                .saturating_sub(self.bells_seen.load(Ordering::Acquire));
            let mut scratch = [0u8; 256];
            while want > 0 {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: polling and reading our own socket into our own buffer.
                let n = unsafe {
                    // Counted as sent, so already queued on loopback: the bound is for
                    // a path that delays them (2 s, not a scheduler's time slice).
                    if real::poll(&mut pfd, 1, 2000) != 1 {
                        break;
                    }
                    real::recv(
                        fd,
                        scratch.as_mut_ptr() as *mut libc::c_void,
                        (want as usize).min(scratch.len()),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n <= 0 {
                    break;
                }
                want -= n as u64;
            }
        }
        let _g = self.tx_sent.lock().unwrap_or_else(|e| e.into_inner());
        if self.tx_switched.load(Ordering::Acquire) || sw != NOT_SWITCHED {
            // The peer may sleep waiting for the ring: a last wake-up (counted) makes it
            // look, find this end gone and resend.
            if !self.tx_switched.load(Ordering::Acquire) {
                s.switch_at(tx).store(*_g, Ordering::SeqCst);
                self.tx_switched.store(true, Ordering::Release);
            }
            self.bell(fd);
            self.tx_back.store(true, Ordering::SeqCst);
            self.give_back_nodelay(fd);
            wait_until(|| s.bells_in_flight(tx).load(Ordering::SeqCst) == 0);
            let resume =
                s.switch_at(tx).load(Ordering::SeqCst) + s.bells_sent(tx).load(Ordering::SeqCst);
            s.resume_at(tx).store(resume, Ordering::SeqCst);
            s.unswitch_at(tx)
                .store(s.tail(tx).load(Ordering::SeqCst), Ordering::SeqCst);
        } else {
            self.tx_back.store(true, Ordering::SeqCst);
            self.give_back_nodelay(fd);
        }
        let why = match why {
            Why::Escaped => "its descriptor left this process".to_string(),
            Why::Call(name) => format!("{name}, which the rings do not carry"),
        };
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) =
            if self.peer_ready.load(Ordering::Acquire) || sw != NOT_SWITCHED {
                format!("accelerated, then handed to the kernel ({why})")
            } else {
                format!("kernel ({why}, before the pairing ended)")
            };
        self.pairing_done.store(true, Ordering::Release);
    }

    /// Whether the peer's reader is leaving (this end must resend by the kernel).
    pub(super) fn peer_leaving(&self) -> bool {
        self.shared
            .get()
            .is_some_and(|s| s.leaving(self.tx_dir()).load(Ordering::Acquire) != 0)
    }

    /// Whether this end left (see [`Conn::leave`]), in this process or in another that
    /// shares the connection since a fork: the connection is the kernel's again.
    pub fn left(&self) -> bool {
        self.shared
            .get()
            .is_some_and(|s| s.leaving(self.rx_dir()).load(Ordering::Acquire) != 0)
    }

    /// Counts `n` bytes just read off the receiving kernel stream as wake-ups, and
    /// returns how many of the last of them are data after all (the writer went back to the
    /// kernel and data followed its last wake-up).
    pub(super) fn note_bells(&self, n: u64) -> u64 {
        let seen = self.bells_seen.fetch_add(n, Ordering::AcqRel) + n;
        let Some(s) = self.shared.get() else { return 0 };
        let rx = self.rx_dir();
        let sw = self.rx_switch_at();
        if sw == NOT_SWITCHED || s.unswitch_at(rx).load(Ordering::Acquire) == NOT_SWITCHED {
            return 0;
        }
        let pos = sw.saturating_add(seen);
        let resume = s.resume_at(rx).load(Ordering::Acquire);
        if pos <= resume {
            return 0;
        }
        let extra = (pos - resume).min(n);
        self.bells_seen.fetch_sub(extra, Ordering::AcqRel);
        extra
    }
}

/// Waits (bounded, 2 s) for a condition the other process makes true within
/// microseconds (a send in progress ending) unless it is descheduled: on a loaded machine
/// that took longer than an earlier 200 ms bound, and a leave that went on regardless
/// counted the stream's wake-up bytes wrong.
pub(super) fn wait_until(mut cond: impl FnMut() -> bool) {
    let end = now_ns() + 2_000_000_000;
    while !cond() && now_ns() < end {
        // SAFETY: yielding the CPU.
        unsafe { libc::sched_yield() };
    }
}
