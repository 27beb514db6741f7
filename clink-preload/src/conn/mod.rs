//! One TCP connection the library follows: its pairing with the other end, and the data
//! path of each direction, on the kernel socket up to the switch offset and on the shared
//! ring after it.
//!
//! Pairing (see `clink_proto::sockets`): a connecting end binds an abstract Unix socket
//! named after the server address and its own port before its SYN leaves; an accepting end
//! connects to that name when `accept` returns and sends a Hello with a fresh mapping and
//! its TCP socket; the connecting end checks that socket is the mirror of its own, maps
//! the rings and answers with an Ack carrying its own socket. Nothing waits for a peer that
//! is not there: an accepting end whose client bound no name knows at once, and a
//! connecting end gives up when a byte arrives by the kernel with no Hello queued (the
//! Hello is queued before the server's `accept` returns, so before it can send).
//!
//! Each direction then switches at an exact byte offset: its writer stores "N bytes went
//! by the kernel" in the mapping, sends one wake-up byte, and writes to the ring; its
//! reader takes exactly N bytes from the kernel, then reads the ring, and from then on
//! treats kernel bytes as wake-ups. A sleeping reader (or a writer facing a full ring) sets
//! a flag in the mapping and waits in the kernel on the socket; the other side sends a
//! wake-up byte when it sees the flag, so unmodified poll and epoll sets work.

use crate::real;
use crate::shared::Shared;
use crate::stats;
use crate::sys::{self, errno, now_ns, set_errno};
use clink_proto::sockets::{
    is_mirror, kernel_share, rendezvous_name, Ack, Hello, MSG_LEN, NOT_SWITCHED,
};
use libc::{c_int, iovec};

mod iov;
mod leave;
mod pairing;

use iov::{gather, kernel_recv, kernel_send, scatter, slice_iov};
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Which end of the kernel connection this process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Returned by `accept` (direction 0 is this end's sending direction).
    Accepting,
    /// Made by `connect` (direction 1 is this end's sending direction).
    Connecting,
}

enum Pairing {
    /// A connecting end waits for the accepting end's Hello on this listener.
    ClientWaiting { listener: c_int, deadline_ns: u64 },
    /// An accepting end sent its Hello and waits for the Ack on this connection.
    ServerWaiting { uconn: c_int },
    /// Paired, or given up (the connection stays on the kernel).
    Done,
}

/// Counters of where a connection's bytes went.
#[derive(Default)]
pub struct Counters {
    /// Bytes sent through the ring.
    pub ring_tx: AtomicU64,
    /// Bytes received through the ring.
    pub ring_rx: AtomicU64,
    /// Bytes sent through the kernel socket.
    pub kernel_tx: AtomicU64,
    /// Bytes received through the kernel socket.
    pub kernel_rx: AtomicU64,
}

/// A followed connection (shared by every fd that refers to the same socket).
pub struct Conn {
    /// Which end this is.
    pub role: Role,
    /// Whether the file description is non-blocking (kept in step by fcntl and ioctl).
    pub nonblock: AtomicBool,
    /// "local -> peer", for statistics.
    pub label: String,
    pairing: Mutex<Pairing>,
    pairing_done: AtomicBool,
    last_check_ns: AtomicU64,
    last_drain_ns: AtomicU64,
    shared: OnceLock<Shared>,
    peer_ready: AtomicBool,
    tx_sent: Mutex<u64>,
    rx_consumed: Mutex<u64>,
    consumed_mirror: AtomicU64,
    tx_switched: AtomicBool,
    /// This end's sending direction went back to the kernel (its reader left, or this
    /// end's descriptor escaped): no more ring, no more wake-up bytes.
    tx_back: AtomicBool,
    /// The peer went back to the kernel and this end read the ring to that point.
    rx_resumed: AtomicBool,
    /// Wake-up bytes read off the kernel stream of the receiving direction.
    bells_seen: AtomicU64,
    /// Bytes read off the kernel as wake-ups that turned out to be data (the writer went
    /// back to the kernel meanwhile), delivered before the kernel's next bytes.
    carry: Mutex<Vec<u8>>,
    /// Set once `carry` was ever used (the receive path takes its lock only then).
    carried: AtomicBool,
    eof: AtomicBool,
    err: AtomicI32,
    outcome: Mutex<String>,
    /// Where the bytes went.
    pub counters: Counters,
}

/// Threads of this process asleep in the kernel on behalf of a connection. With more than
/// one, a wake-up byte drained by one thread may have been meant for another, so sleeps are
/// cut into short slices (correctness never rests on a drained byte).
static SLEEPERS: AtomicU32 = AtomicU32::new(0);

/// Counts a thread going to sleep in the kernel; returns the longest sleep it may take in
/// milliseconds (-1: unbounded), given the caller's `timeout_ms`.
pub fn enter_sleep(timeout_ms: c_int) -> c_int {
    let n = SLEEPERS.fetch_add(1, Ordering::AcqRel) + 1;
    if n > 1 && !(0..=1).contains(&timeout_ms) {
        1
    } else {
        timeout_ms
    }
}

/// Counts a thread back from its sleep.
pub fn leave_sleep() {
    SLEEPERS.fetch_sub(1, Ordering::AcqRel);
}

const CHECK_EVERY_NS: u64 = 50_000;
const DRAIN_EVERY_NS: u64 = 200_000;
const CLIENT_DEADLINE_NS: u64 = 10_000_000_000;
const PAIR_TIMEOUT_MS: c_int = 500;

impl Conn {
    fn new(role: Role, fd: c_int, pairing: Pairing, shared: Option<Shared>) -> Conn {
        let label = match (sys::local_addr(fd), sys::peer_addr(fd)) {
            (Some(l), Some(p)) => format!("{l} -> {p}"),
            _ => "unconnected".to_string(),
        };
        let cell = OnceLock::new();
        if let Some(s) = shared {
            let _ = cell.set(s);
        }
        Conn {
            role,
            nonblock: AtomicBool::new(is_nonblocking(fd)),
            label,
            pairing: Mutex::new(pairing),
            pairing_done: AtomicBool::new(false),
            last_check_ns: AtomicU64::new(0),
            last_drain_ns: AtomicU64::new(0),
            shared: cell,
            peer_ready: AtomicBool::new(false),
            tx_sent: Mutex::new(0),
            rx_consumed: Mutex::new(0),
            consumed_mirror: AtomicU64::new(0),
            tx_switched: AtomicBool::new(false),
            tx_back: AtomicBool::new(false),
            rx_resumed: AtomicBool::new(false),
            bells_seen: AtomicU64::new(0),
            carry: Mutex::new(Vec::new()),
            carried: AtomicBool::new(false),
            eof: AtomicBool::new(false),
            err: AtomicI32::new(0),
            outcome: Mutex::new("pairing".to_string()),
            counters: Counters::default(),
        }
    }

    fn tx_dir(&self) -> usize {
        match self.role {
            Role::Accepting => 0,
            Role::Connecting => 1,
        }
    }

    fn rx_dir(&self) -> usize {
        1 - self.tx_dir()
    }

    /// Whether this end's sends go to the ring.
    fn tx_on_ring(&self) -> bool {
        self.tx_switched.load(Ordering::Acquire)
            && !self.tx_back.load(Ordering::Acquire)
            && !self.peer_leaving()
    }

    /// Whether this direction's reader reached the ring: the peer switched and every byte
    /// it sent by the kernel was consumed.
    fn rx_in_ring(&self) -> bool {
        match self.shared.get() {
            Some(s) => {
                let sw = s.switch_at(self.rx_dir()).load(Ordering::Acquire);
                sw != NOT_SWITCHED
                    && self.consumed_mirror.load(Ordering::Acquire) >= sw
                    && !self.rx_resumed.load(Ordering::Acquire)
            }
            None => false,
        }
    }

    /// For poll and epoll: this connection's readiness for `events` (POLL* bits) given what
    /// the kernel reported, or `None` when the kernel's answer stands.
    pub fn fix_readiness(&self, fd: c_int, events: i16, kernel: i16) -> Option<i16> {
        let s = self.shared.get()?;
        if self.left() {
            return None;
        }
        let rx = self.rx_in_ring();
        self.check_leaving(fd);
        let tx = self.tx_on_ring();
        if !rx && !tx {
            return None;
        }
        let mut out = kernel;
        let inbits = libc::POLLIN | libc::POLLRDNORM;
        let outbits = libc::POLLOUT | libc::POLLWRNORM;
        if rx {
            if kernel & (inbits | libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
                self.drain(fd);
            }
            out &= !inbits;
            let ready = s.readable(self.rx_dir()).map(|n| n > 0).unwrap_or(true)
                || self.eof.load(Ordering::Acquire)
                || self.err.load(Ordering::Acquire) != 0;
            if ready {
                out |= events & inbits;
            }
        }
        if tx {
            out &= !outbits;
            let room = s.writable(self.tx_dir()).map(|n| n > 0).unwrap_or(true);
            let mut gone = kernel & (libc::POLLERR | libc::POLLHUP) != 0;
            if !room && !gone && events & outbits != 0 {
                // A peer that died with nothing unread in its kernel socket sent a FIN, not
                // a reset: nothing would end this writer's wait but the reset a wake-up
                // byte draws (as a kernel TCP writer's next segment would).
                if let Some(e) = self.peer_gone(fd) {
                    self.err.store(e, Ordering::Release);
                    out |= libc::POLLERR;
                    gone = true;
                }
            }
            if room || gone {
                out |= events & outbits;
            }
        }
        Some(out & (events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL))
    }

    /// For a sleep in poll or epoll of a writer whose ring is full: what to ask the kernel
    /// for instead of POLLOUT (the kernel socket is always writable; room in the ring is
    /// announced by a wake-up byte, and the peer's end by POLLRDHUP), and whether the sleep
    /// must be cut short (kernel bytes before the switch would end it at once).
    pub fn room_events(&self, events: i16) -> Option<(i16, bool)> {
        let s = self.shared.get()?;
        if self.left() {
            return None;
        }
        if events & libc::POLLOUT == 0
            || !self.tx_on_ring()
            || s.writable(self.tx_dir()).map(|n| n > 0).unwrap_or(true)
        {
            return None;
        }
        // After the peer's FIN the kernel socket is readable for good: sleep in short
        // steps then, as before the reader reached the ring.
        let clean = self.rx_in_ring() && !self.eof.load(Ordering::Acquire);
        let ask = if clean {
            libc::POLLIN | libc::POLLRDHUP
        } else {
            0
        };
        Some(((events & !(libc::POLLOUT | libc::POLLWRNORM)) | ask, !clean))
    }

    /// For the spinning phase of poll and epoll: readiness from the rings alone, without a
    /// system call (`false` when only the kernel can tell).
    pub fn ready_without_kernel(&self, events: i16) -> bool {
        let Some(s) = self.shared.get().filter(|_| !self.left()) else {
            return false;
        };
        (events & libc::POLLIN != 0
            && self.rx_in_ring()
            && s.readable(self.rx_dir()).map(|n| n > 0).unwrap_or(true))
            || (events & libc::POLLOUT != 0
                && self.tx_on_ring()
                && s.writable(self.tx_dir()).map(|n| n > 0).unwrap_or(true))
    }

    /// Before sleeping in the kernel for `events`: raises the sleep flags so the other end
    /// sends wake-ups. Returns false (flags left down) when something is ready already.
    pub fn arm(&self, events: i16) -> bool {
        let Some(s) = self.shared.get().filter(|_| !self.left()) else {
            return true;
        };
        let unswitched = s.switch_at(self.rx_dir()).load(Ordering::Acquire) == NOT_SWITCHED;
        if events & libc::POLLIN != 0 && (self.rx_in_ring() || unswitched) {
            s.reader_sleeping(self.rx_dir()).store(1, Ordering::SeqCst);
        }
        if events & libc::POLLOUT != 0 && self.tx_on_ring() {
            s.writer_sleeping(self.tx_dir()).store(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        if self.ready_without_kernel(events) {
            self.disarm();
            return false;
        }
        true
    }

    /// After sleeping: lowers the sleep flags.
    pub fn disarm(&self) {
        if let Some(s) = self.shared.get() {
            s.reader_sleeping(self.rx_dir()).store(0, Ordering::Relaxed);
            s.writer_sleeping(self.tx_dir()).store(0, Ordering::Relaxed);
        }
    }

    /// Counts bytes read off the kernel as wake-ups, keeping any that are data after all.
    fn keep_data(&self, read: &[u8]) {
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
    fn drain(&self, fd: c_int) {
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
            // Data read off the kernel as wake-ups comes first.
            if self.carried.load(Ordering::Acquire) {
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
            let sw = s
                .map(|s| s.switch_at(rx).load(Ordering::Acquire))
                .unwrap_or(NOT_SWITCHED);
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
                        if s.switch_at(rx).load(Ordering::SeqCst) != NOT_SWITCHED {
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
                    let now = s
                        .map(|s| s.switch_at(rx).load(Ordering::Acquire))
                        .unwrap_or(NOT_SWITCHED);
                    if now != NOT_SWITCHED && *consumed >= now {
                        self.eof.store(true, Ordering::Release);
                        continue;
                    }
                    return got as isize;
                }
                let sw2 = s
                    .map(|s| s.switch_at(rx).load(Ordering::Acquire))
                    .unwrap_or(NOT_SWITCHED);
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
                if s.readable(rx).map(|n| n > 0).unwrap_or(true)
                    || self.carried.load(Ordering::Acquire)
                        && !self
                            .carry
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .is_empty()
                {
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

    fn wake_writer(&self, fd: c_int, s: &Shared) {
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
                if flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0 {
                    self.bell(fd);
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

    /// Whether the kernel says the peer is gone for good (reset, or closed while our ring
    /// to it is full: a wake-up byte then draws the reset a closed socket answers with).
    fn peer_gone(&self, fd: c_int) -> Option<c_int> {
        // A drain may have taken the socket's error already.
        let e = self.err.swap(0, Ordering::AcqRel);
        if e != 0 {
            return Some(self.as_kernel_would(e));
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: polling one pollfd, without waiting.
        unsafe { real::poll(&mut pfd, 1, 0) };
        if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            let e = sys::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)
                .filter(|e| *e != 0)
                .unwrap_or(libc::EPIPE);
            return Some(self.as_kernel_would(e));
        }
        if pfd.revents & libc::POLLRDHUP != 0 {
            self.bell(fd);
        }
        None
    }

    /// The error a kernel TCP writer would see for the peer's end `e`: a peer that closed
    /// with bytes unread resets the stream, while the unread bytes of ours sit in the ring
    /// where its kernel cannot see them (it sent a FIN, and the reset drawn after the FIN
    /// reads as EPIPE).
    fn as_kernel_would(&self, e: c_int) -> c_int {
        let unread = self.tx_on_ring()
            && self
                .shared
                .get()
                .is_some_and(|s| s.readable(self.tx_dir()).is_ok_and(|n| n > 0));
        if e == libc::EPIPE && unread {
            libc::ECONNRESET
        } else {
            e
        }
    }

    /// Waits (spinning, then asleep in the kernel) until the ring has data (`POLLIN`) or
    /// room (`POLLOUT`), the kernel socket has news, or the socket's timeout option
    /// `timeout_opt` (SO_RCVTIMEO / SO_SNDTIMEO) passes (EAGAIN).
    fn wait(&self, fd: c_int, event: i16, timeout_opt: c_int) -> Result<(), c_int> {
        let start = now_ns();
        let spin = crate::config().spin_ns;
        let mut i = 0u32;
        if spin > 0 {
            loop {
                if self.ready_without_kernel(event) {
                    return Ok(());
                }
                std::hint::spin_loop();
                i += 1;
                if i.is_multiple_of(64) && now_ns() - start > spin {
                    break;
                }
            }
        }
        if event == libc::POLLIN {
            if let Some(r) = self.sleep_in_recv(fd) {
                return r;
            }
        }
        let timeout_ms = sys::sock_timeout_ms(fd, timeout_opt);
        let deadline = (timeout_ms >= 0).then(|| start + timeout_ms as u64 * 1_000_000);
        loop {
            self.check_leaving(fd);
            if event == libc::POLLOUT && (!self.tx_on_ring() || self.peer_leaving()) {
                return Ok(()); // the caller (holding the send lock) resends by the kernel
            }
            // Kernel bytes on this socket are wake-ups only once the reader reached the ring;
            // before that, waiting for POLLIN would return at once for data that is not ours.
            let clean = self.rx_in_ring();
            if !self.arm(event) {
                return Ok(());
            }
            let mut t = match deadline {
                Some(d) => (d.saturating_sub(now_ns()) / 1_000_000) as c_int,
                None => -1,
            };
            if !clean && !(0..=1).contains(&t) {
                t = 1;
            }
            let t = enter_sleep(t);
            let mut pfd = libc::pollfd {
                fd,
                events: if clean { libc::POLLIN } else { 0 },
                revents: 0,
            };
            // SAFETY: polling one pollfd.
            let r = unsafe { real::poll(&mut pfd, 1, t) };
            let e = errno();
            leave_sleep();
            self.disarm();
            if r < 0 {
                return Err(e);
            }
            if clean && pfd.revents != 0 {
                self.drain(fd);
            }
            if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                if event == libc::POLLOUT {
                    // The drain above may have taken the socket's error already.
                    let e = self.err.swap(0, Ordering::AcqRel);
                    return Err(if e != 0 {
                        self.as_kernel_would(e)
                    } else {
                        self.peer_gone(fd).unwrap_or(libc::EPIPE)
                    });
                }
                return Ok(());
            }
            if self.ready_without_kernel(event)
                || self.eof.load(Ordering::Acquire)
                || self.err.load(Ordering::Acquire) != 0
            {
                return Ok(());
            }
            if event == libc::POLLOUT {
                if let Some(e) = self.peer_gone(fd) {
                    return Err(e);
                }
            }
            if let Some(d) = deadline {
                if now_ns() >= d {
                    return Err(libc::EAGAIN);
                }
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

    /// Before the descriptor closes: reads the wake-up bytes still queued, which would
    /// make the kernel answer the close with a reset instead of an orderly end.
    pub fn before_close(&self, fd: c_int) {
        if self.rx_in_ring() && !self.eof.load(Ordering::Acquire) {
            let _keep = sys::SavedErrno::save();
            self.drain(fd);
        }
    }

    /// A reader's sleep when it is this process's only sleeper: a blocking receive of
    /// wake-up bytes, which sleeps and consumes the wake-up in one system call (as a kernel
    /// recv would), and honours SO_RCVTIMEO and SA_RESTART as the application's own recv
    /// would. `None` when this sleep does not apply (poll-based sleep instead).
    fn sleep_in_recv(&self, fd: c_int) -> Option<Result<(), c_int>> {
        if !self.rx_in_ring() {
            return None;
        }
        if enter_sleep(-1) != -1 {
            leave_sleep();
            return None;
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

    /// Bytes a FIONREAD would report, when the ring decides it.
    pub fn pending(&self) -> Option<c_int> {
        let s = self.shared.get()?;
        if !self.rx_in_ring() {
            return None;
        }
        Some(
            s.readable(self.rx_dir())
                .unwrap_or(0)
                .min(c_int::MAX as u64) as c_int,
        )
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Ok(p) = self.pairing.get_mut() {
            match *p {
                Pairing::ClientWaiting { listener, .. } => close_fd(listener),
                Pairing::ServerWaiting { uconn } => close_fd(uconn),
                Pairing::Done => {}
            }
        }
        stats::record_close(self);
    }
}

fn fail_send(e: c_int, flags: c_int) -> isize {
    if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: raising the signal the kernel would raise for this send.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    set_errno(e);
    -1
}

fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the file status flags.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Sends one wake-up byte on the kernel socket; false if it was not sent (the socket's
/// buffer is full: the peer then has wake-ups queued already).
fn doorbell(fd: c_int) -> bool {
    let b = 0u8;
    let _keep = sys::SavedErrno::save();
    // SAFETY: a one-byte non-blocking send from our own buffer.
    unsafe {
        real::send(
            fd,
            &b as *const u8 as *const libc::c_void,
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        ) == 1
    }
}

/// Sends all of `bytes` on the kernel socket, waiting for room if it is non-blocking.
fn send_all(fd: c_int, bytes: &[u8]) -> bool {
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: sending from our own buffer.
        let n = unsafe {
            real::send(
                fd,
                bytes[off..].as_ptr() as *const libc::c_void,
                bytes.len() - off,
                libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            off += n as usize;
            continue;
        }
        let e = errno();
        if n < 0 && (e == libc::EAGAIN || e == libc::EINTR) {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: polling our own socket.
            unsafe { real::poll(&mut pfd, 1, 1000) };
            continue;
        }
        return false;
    }
    true
}

/// Closes one of the library's own descriptors.
pub fn close_fd(fd: c_int) {
    let _keep = sys::SavedErrno::save();
    // SAFETY: closing a descriptor the library owns.
    unsafe { real::close(fd) };
}
