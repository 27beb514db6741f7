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
    READER_ON_WAKE_SOCKET,
};
use libc::{c_int, iovec};

mod iov;
mod leave;
mod nodelay;
mod pairing;
mod recv;
mod send;
#[cfg(test)]
mod tests;
mod wake;

pub use leave::Why;
use wake::restarts_after_signal;
pub use wake::{drain_wake, is_own};

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
    /// An accepting end sent its Hello and waits for the Ack on this connection; the Ack
    /// must carry the mirror of the socket with these addresses.
    ServerWaiting {
        uconn: c_int,
        local: std::net::SocketAddr,
        peer: std::net::SocketAddr,
    },
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
    /// Readers woken by a datagram to their wake socket (not a byte by the kernel).
    pub wake_datagrams: AtomicU64,
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
    /// This end's wake socket for its receiving direction (-1: none yet; see `wake.rs`).
    wake_fd: AtomicI32,
    /// The epoll sets (by the sockets layer's number of each) the wake socket is in.
    wake_sets: Mutex<Vec<u64>>,
    /// The socket's SO_RCVTIMEO in milliseconds as last read (-1: none, -2: not read
    /// since it was last set through this library).
    rcv_timeout_ms: AtomicI32,
    /// The application's TCP_NODELAY while the library holds the socket at 1 (its
    /// sending direction on the ring, where the kernel stream carries only wake-up bytes,
    /// which Nagle's algorithm would hold back for the peer's delayed ack); -1 otherwise.
    app_nodelay: AtomicI32,
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
            wake_fd: AtomicI32::new(-1),
            wake_sets: Mutex::new(Vec::new()),
            rcv_timeout_ms: AtomicI32::new(-2),
            app_nodelay: AtomicI32::new(-1),
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
    pub fn rx_in_ring(&self) -> bool {
        let sw = self.rx_switch_at();
        sw != NOT_SWITCHED
            && self.consumed_mirror.load(Ordering::Acquire) >= sw
            && !self.rx_resumed.load(Ordering::Acquire)
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
        self.arm_as(events, 1)
    }

    /// [`Conn::arm`], a reader's flag raised to `reader` (1, or `READER_ON_WAKE_SOCKET`
    /// for a reader that also listens on its wake socket).
    pub fn arm_as(&self, events: i16, reader: u32) -> bool {
        let Some(s) = self.shared.get().filter(|_| !self.left()) else {
            return true;
        };
        let unswitched = self.rx_switch_at() == NOT_SWITCHED;
        if events & libc::POLLIN != 0 && (self.rx_in_ring() || unswitched) {
            s.reader_sleeping(self.rx_dir())
                .store(reader, Ordering::SeqCst);
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
        let spin = crate::spin::budget(start);
        let mut i = 0u32;
        if spin > 0 {
            loop {
                if self.ready_without_kernel(event) {
                    if i > 0 {
                        crate::spin::hit();
                    }
                    return Ok(());
                }
                std::hint::spin_loop();
                i += 1;
                if i.is_multiple_of(64) {
                    let now = now_ns();
                    if now - start > spin {
                        crate::spin::miss(now);
                        break;
                    }
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
                if e == libc::EINTR && restarts_after_signal(deadline.is_some()) {
                    continue;
                }
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

    /// Before the descriptor closes: reads the wake-up bytes still queued, which would
    /// make the kernel answer the close with a reset instead of an orderly end. When it
    /// is the connection's last descriptor in this process (`last`, asked only then) and
    /// bytes the peer wrote lie unread (in the ring, or kept aside from the kernel after
    /// the peer went back to it), asks the kernel for the reset it
    /// answers a close with when its own buffer holds unread bytes (a linger of zero
    /// seconds): the peer then reads ECONNRESET after what it had, as over kernel TCP.
    pub fn before_close(&self, fd: c_int, last: impl FnOnce() -> bool) {
        if !self.rx_in_ring() {
            // Unread bytes are in the kernel's buffer (a reader goes back to the kernel
            // only once it has taken what was kept aside): it decides.
            return;
        }
        let _keep = sys::SavedErrno::save();
        if !self.eof.load(Ordering::Acquire) {
            self.drain(fd);
        }
        let in_ring = self
            .shared
            .get()
            .is_some_and(|s| s.readable(self.rx_dir()).is_ok_and(|n| n > 0));
        if (in_ring || self.carry_pending()) && last() {
            sys::reset_on_close(fd);
        }
    }

    /// Whether bytes read off the kernel with wake-up bytes and kept (the writer went back
    /// to the kernel) wait to be read.
    fn carry_pending(&self) -> bool {
        self.carried.load(Ordering::Acquire)
            && !self
                .carry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
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
                Pairing::ServerWaiting { uconn, .. } => close_fd(uconn),
                Pairing::Done => {}
            }
        }
        let w = *self.wake_fd.get_mut();
        if w >= 0 {
            wake::close_own(w);
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
