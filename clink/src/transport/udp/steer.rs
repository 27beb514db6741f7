//! Flow steering: the fast stream admission control granted gets a UDP socket of its own,
//! connected to that sender, so the kernel keeps every other datagram out of the
//! speculative layout armed on it (the seed's section 6 "separate descriptor list and
//! match register", which a connected socket provides). The Fast_Ack carries its port;
//! the sender sends its bulk fragments there, everything else to the main socket.
//!
//! Two sockets take turns: a new holder gets the one the previous holder did not use,
//! which stays connected to it, so the previous holder's fragments still in flight when
//! the grant passed are read, not refused by the kernel and retransmitted. Both close
//! after [`IDLE_CLOSE`] without a holder (an idle endpoint reads one socket per poll).

use super::sock::{SockStats, UdpSock};
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// How long the sockets stay open with no grant in force, nanoseconds.
pub const IDLE_CLOSE: u64 = 200_000_000;
/// Steered sockets at most.
pub const SOCKETS: usize = 2;

/// One steered socket and the peer (route index) it is connected to.
struct Steered {
    sock: UdpSock,
    peer: usize,
}

/// The steered sockets of one endpoint.
pub struct Steering {
    on: bool,
    bind: SocketAddr,
    buf: usize,
    socks: [Option<Steered>; SOCKETS],
    /// The socket granted last.
    last: usize,
    /// Descriptors made since the endpoint last looked (to add to its epoll set).
    new_fds: Vec<RawFd>,
    /// Since when no grant has been in force.
    idle_since: Option<u64>,
    /// Counters of the sockets already closed.
    retired: SockStats,
}

impl Steering {
    /// Steering (when `on`) with sockets bound to `bind`'s address (any port), `buf`
    /// bytes of kernel buffer each way.
    pub fn new(on: bool, bind: SocketAddr, buf: usize) -> Steering {
        Steering {
            on,
            bind: SocketAddr::new(bind.ip(), 0),
            buf,
            socks: [None, None],
            last: 0,
            new_fds: Vec::new(),
            idle_since: None,
            retired: SockStats::default(),
        }
    }

    /// Steers `peer` (whose datagrams come from `dest`) to a socket of its own and returns
    /// the port; `None` with steering off or when no socket can be made (the stream then
    /// shares the main socket).
    pub fn steer(&mut self, peer: usize, dest: SocketAddr) -> Option<u16> {
        if !self.on {
            return None;
        }
        if let Some(i) = self.socket_of(peer) {
            self.last = i;
            return self.socks[i].as_ref().map(|s| s.sock.local().port());
        }
        let i = (self.last + 1) % SOCKETS;
        if self.socks[i].is_none() {
            match UdpSock::bind(self.bind, self.buf) {
                Ok(sock) => {
                    self.new_fds.push(sock.raw());
                    self.socks[i] = Some(Steered { sock, peer });
                }
                Err(e) => {
                    tracing::warn!("flow steering off: cannot bind UDP at {}: {e}", self.bind);
                    self.on = false;
                    return None;
                }
            }
        }
        let s = self.socks[i].as_mut()?;
        if let Err(e) = s.sock.connect(dest) {
            tracing::warn!("flow steering: cannot connect to {dest}: {e}");
            return None;
        }
        s.peer = peer;
        self.last = i;
        Some(s.sock.local().port())
    }

    /// The socket (index) connected to `peer`.
    pub fn socket_of(&self, peer: usize) -> Option<usize> {
        (0..SOCKETS).find(|&i| self.socks[i].as_ref().is_some_and(|s| s.peer == peer))
    }

    /// Socket `i`, if open.
    pub fn sock_mut(&mut self, i: usize) -> Option<&mut UdpSock> {
        self.socks.get_mut(i)?.as_mut().map(|s| &mut s.sock)
    }

    /// Whether any socket is open.
    pub fn is_open(&self) -> bool {
        self.socks.iter().any(Option::is_some)
    }

    /// Descriptors made since the last call (the caller adds them to its epoll set;
    /// closing a socket removes it).
    pub fn take_new_fds(&mut self) -> impl Iterator<Item = RawFd> + '_ {
        self.new_fds.drain(..)
    }

    /// Notes whether a grant is in force at `now`; after [`IDLE_CLOSE`] without one, closes
    /// the sockets and returns true (the caller must drop any layout armed on them first:
    /// it returns true only then).
    pub fn idle_close_due(&mut self, now: u64, granted: bool) -> bool {
        if granted || !self.is_open() {
            self.idle_since = None;
            return false;
        }
        let since = *self.idle_since.get_or_insert(now);
        now.saturating_sub(since) >= IDLE_CLOSE
    }

    /// Closes every socket (after [`Steering::idle_close_due`]); what they still held is
    /// lost to the reliable protocol's retransmissions.
    pub fn close(&mut self) {
        for s in self.socks.iter_mut().filter_map(Option::take) {
            add_stats(&mut self.retired, &s.sock.stats);
        }
        self.idle_since = None;
    }

    /// No more sockets: later grants are not steered.
    pub fn turn_off(&mut self) {
        self.on = false;
    }

    /// Counters of every steered socket, open or closed.
    pub fn stats(&self) -> SockStats {
        let mut k = self.retired;
        for s in self.socks.iter().flatten() {
            add_stats(&mut k, &s.sock.stats);
        }
        k
    }
}

/// Adds `b`'s counters to `a`.
pub fn add_stats(a: &mut SockStats, b: &SockStats) {
    a.datagrams_sent += b.datagrams_sent;
    a.datagrams_received += b.datagrams_received;
    a.send_calls += b.send_calls;
    a.recv_calls += b.recv_calls;
    a.gro_reads += b.gro_reads;
    a.send_drops += b.send_drops;
    a.truncated += b.truncated;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, UdpSocket};
    use std::time::{Duration, Instant};

    fn lo() -> SocketAddr {
        SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)
    }

    fn bound() -> (UdpSocket, SocketAddr) {
        let s = UdpSocket::bind(lo()).unwrap();
        let a = s.local_addr().unwrap();
        (s, a)
    }

    /// Reads socket `i` until a datagram arrives or 2 s pass.
    fn read_one(st: &mut Steering, i: usize) -> Option<SocketAddr> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let s = st.sock_mut(i).unwrap();
            if s.recv_batch() > 0 {
                return Some(s.received(0).src);
            }
            std::thread::yield_now();
        }
        None
    }

    #[test]
    fn holders_take_turns_and_a_returning_holder_keeps_its_socket() {
        let mut st = Steering::new(true, lo(), 1 << 20);
        let (a, b, c) = (bound().1, bound().1, bound().1);
        let pa = st.steer(1, a).unwrap();
        let pb = st.steer(2, b).unwrap();
        assert_ne!(pa, pb, "a new holder gets the other socket");
        assert_eq!(st.take_new_fds().count(), 2);
        assert_eq!(
            st.steer(1, a),
            Some(pa),
            "the previous holder's socket is still its own"
        );
        // A third holder takes the socket the last grant did not use (peer 2's).
        assert_eq!(st.steer(3, c), Some(pb));
        assert_eq!(st.socket_of(2), None);
        assert_eq!(st.take_new_fds().count(), 0, "no socket was made for it");
    }

    #[test]
    fn a_steered_socket_takes_only_its_holders_datagrams() {
        let mut st = Steering::new(true, lo(), 1 << 20);
        let (holder, ha) = bound();
        let (other, _) = bound();
        let port = st.steer(7, ha).unwrap();
        let i = st.socket_of(7).unwrap();
        let to = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        // The other sender's datagram is refused by the kernel (no socket matches); the
        // holder's, sent after it, is the first one read.
        other.send_to(b"stray", to).unwrap();
        holder.send_to(b"fast", to).unwrap();
        assert_eq!(read_one(&mut st, i), Some(ha));
        assert_eq!(st.sock_mut(i).unwrap().recv_batch(), 0);
    }

    #[test]
    fn sockets_close_after_an_idle_spell_and_steering_off_makes_none() {
        let mut st = Steering::new(true, lo(), 1 << 20);
        assert!(!st.idle_close_due(0, false), "nothing open");
        st.steer(1, bound().1).unwrap();
        assert!(!st.idle_close_due(10, true));
        assert!(!st.idle_close_due(20, false), "the idle spell starts");
        assert!(!st.idle_close_due(20 + IDLE_CLOSE - 1, false));
        assert!(st.idle_close_due(20 + IDLE_CLOSE, false));
        st.close();
        assert!(!st.is_open());
        let mut off = Steering::new(false, lo(), 1 << 20);
        assert_eq!(off.steer(1, bound().1), None);
        assert!(!off.is_open());
    }
}
