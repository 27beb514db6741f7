//! Connected peer sockets: the first few peers of an endpoint get a UDP socket of their
//! own, bound to the endpoint's address beside its main socket (`SO_REUSEPORT`) and
//! connected to the peer. The kernel hands that peer's datagrams to it (a connected
//! socket's exact match wins the lookup), and sends through it skip the route lookup an
//! unconnected send makes per datagram. On the wire nothing changes: same addresses, same
//! ports. Measured across the veth pair with a C ping-pong of 64-byte datagrams (the
//! calls clink makes, BENCHMARKS.md): 4.2-4.9 us one-way unconnected, 3.6-4.0 connected.
//!
//! The cost: every peer socket is looked at on every pass, so only the first
//! [`UdpConfig::peer_sockets`](super::UdpConfig) peers get one; the others share the main
//! socket. One or two are read directly (a system call each); from [`POLL_MIN`] on, one
//! zero-timeout epoll wait asks which are readable and only those are read (an all-to-all's pass
//! otherwise read seven sockets to find one or two with data). The main socket then carries only handshakes and those peers'
//! datagrams, and while every peer has a socket of its own the transport reads it on
//! every [`MAIN_EVERY`]th pass only (and whenever epoll reports a socket readable).

use super::sock::{SockStats, UdpSock};
use super::steer::add_stats;
use crate::sys::Epoll;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

/// With every peer on a socket of its own, the main socket is read once per this many
/// passes (it then holds only new peers' handshakes and strays).
pub const MAIN_EVERY: u32 = 16;

/// With this many sockets or more, a pass asks an epoll instance of their own which are
/// readable (one system call) rather than reading each.
pub const POLL_MIN: usize = 3;

/// One connected socket and its peer's address.
struct PeerSock {
    sock: UdpSock,
    dest: SocketAddr,
}

/// The connected peer sockets of one endpoint.
pub struct PeerSocks {
    /// Sockets at most (0: none).
    max: usize,
    /// The main socket's address, which they share.
    local: SocketAddr,
    buf: usize,
    socks: Vec<PeerSock>,
    /// Descriptors made since the endpoint last looked (to add to its epoll set).
    new_fds: Vec<RawFd>,
    /// Counters of the sockets already closed.
    retired: SockStats,
    /// Whether their sockets leave the receive ring's datagrams to it ([`super::ring`]).
    ring: bool,
    /// Their readiness, from [`POLL_MIN`] sockets on (made then; tokens are descriptors).
    poll: Option<Epoll>,
    /// The last readiness answer's tokens.
    polled: Vec<u64>,
}

impl PeerSocks {
    /// Up to `max` sockets bound to `local` (the main socket's address, bound with
    /// [`UdpSock::bind_shared`]), `buf` bytes of kernel buffer each way; with `ring`,
    /// each leaves the receive ring's datagrams to it.
    pub fn new(max: usize, local: SocketAddr, buf: usize, ring: bool) -> PeerSocks {
        PeerSocks {
            max,
            local,
            buf,
            ring,
            socks: Vec::new(),
            new_fds: Vec::new(),
            retired: SockStats::default(),
            poll: None,
            polled: Vec::new(),
        }
    }

    /// Gives `dest` a socket of its own unless it has one or the limit is reached.
    /// Returns true when it made one. A socket that cannot be made is logged and the
    /// peer stays on the main socket.
    pub fn open(&mut self, dest: SocketAddr) -> bool {
        if self.socks.len() >= self.max || self.index_of(dest).is_some() {
            return false;
        }
        let filter = self.ring.then(super::ring::socket_filter);
        match UdpSock::connected(self.local, dest, self.buf, filter.as_deref()) {
            Ok(sock) => {
                self.new_fds.push(sock.raw());
                self.socks.push(PeerSock { sock, dest });
                self.watch();
                true
            }
            Err(e) => {
                tracing::warn!("no connected socket for {dest} ({e}): it shares the main one");
                false
            }
        }
    }

    /// Closes `dest`'s socket (its peer is gone); true when it had one. Datagrams still
    /// queued there are lost (to a peer that failed or closed). Indices of later sockets
    /// shift: the caller re-plans anything that names one.
    pub fn close(&mut self, dest: SocketAddr) -> bool {
        let Some(i) = self.index_of(dest) else {
            return false;
        };
        let s = self.socks.remove(i);
        add_stats(&mut self.retired, &s.sock.stats);
        true
    }

    /// From now on sockets leave the receive ring's datagrams to it (those already open
    /// have had the filter attached by the caller).
    pub fn leave_to_ring(&mut self) {
        self.ring = true;
    }

    /// Closes every socket and makes no more.
    pub fn close_all(&mut self) {
        for s in self.socks.drain(..) {
            add_stats(&mut self.retired, &s.sock.stats);
        }
        self.max = 0;
    }

    /// Watches every socket for readability once there are [`POLL_MIN`] (a socket closed
    /// leaves the epoll set with its descriptor). Without the epoll instance every socket
    /// is read on every pass, as below the minimum.
    fn watch(&mut self) {
        if self.socks.len() < POLL_MIN {
            return;
        }
        // A new instance takes every socket; an existing one the newest.
        let from = match &self.poll {
            Some(_) => self.socks.len() - 1,
            None => {
                match Epoll::new() {
                    Ok(e) => {
                        self.poll = Some(e);
                        0
                    }
                    Err(e) => {
                        tracing::warn!("no epoll instance for the peer sockets ({e}): each is read on every pass");
                        return;
                    }
                }
            }
        };
        let poll = self.poll.as_ref().expect("made above");
        for s in &self.socks[from..] {
            if let Err(e) = poll.add(s.sock.raw(), s.sock.raw() as u64) {
                tracing::warn!("peer socket not watched ({e}): each is read on every pass");
                self.poll = None;
                return;
            }
        }
    }

    /// The sockets worth reading now, as a bit per index: those with datagrams queued,
    /// asked of the kernel in one call from [`POLL_MIN`] sockets on; every one below that
    /// (or when the answer may be partial).
    pub fn readable(&mut self) -> u64 {
        let n = self.socks.len();
        let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        let Some(poll) = self.poll.as_ref().filter(|_| n >= POLL_MIN) else {
            return all;
        };
        self.polled.clear();
        if !matches!(poll.wait(&mut self.polled, Some(Duration::ZERO)), Ok(false)) {
            return all;
        }
        let mut ready = 0;
        for &fd in &self.polled {
            if let Some(i) = self.socks.iter().position(|s| s.sock.raw() as u64 == fd) {
                ready |= 1 << i;
            }
        }
        ready
    }

    /// The index of `dest`'s socket.
    pub fn index_of(&self, dest: SocketAddr) -> Option<usize> {
        self.socks.iter().position(|s| s.dest == dest)
    }

    /// Whether `dest` has a socket of its own.
    pub fn has(&self, dest: SocketAddr) -> bool {
        self.index_of(dest).is_some()
    }

    /// Sockets open.
    pub fn len(&self) -> usize {
        self.socks.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.socks.is_empty()
    }

    /// Socket `i`, if open.
    pub fn sock_mut(&mut self, i: usize) -> Option<&mut UdpSock> {
        self.socks.get_mut(i).map(|s| &mut s.sock)
    }

    /// Descriptors made since the last call (the caller adds them to its epoll set;
    /// closing a socket removes it).
    pub fn take_new_fds(&mut self) -> impl Iterator<Item = RawFd> + '_ {
        self.new_fds.drain(..)
    }

    /// Counters of every peer socket, open or closed.
    pub fn stats(&self) -> SockStats {
        let mut k = self.retired;
        for s in &self.socks {
            add_stats(&mut k, &s.sock.stats);
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, UdpSocket};
    use std::time::{Duration, Instant};

    fn v4(s: &UdpSocket) -> SocketAddr {
        s.local_addr().unwrap()
    }

    /// Reads `s` until a datagram arrives or 2 s pass; its source and first byte.
    fn read_one(s: &mut UdpSock) -> Option<(SocketAddr, u8)> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if s.recv_batch() > 0 {
                return Some((s.received(0).src, s.slot(0, 1)[0]));
            }
            std::thread::yield_now();
        }
        None
    }

    #[test]
    fn from_three_sockets_on_only_those_with_data_or_an_error_are_read() {
        let lo = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0);
        let main = UdpSock::bind_shared(lo, 1 << 20).unwrap();
        let others: Vec<UdpSocket> = (0..4).map(|_| UdpSocket::bind(lo).unwrap()).collect();
        let mut peers = PeerSocks::new(8, main.local(), 1 << 20, false);
        for (k, o) in others.iter().take(2).enumerate() {
            assert!(peers.open(v4(o)));
            assert_eq!(
                peers.readable(),
                (1 << (k + 1)) - 1,
                "below the minimum: all"
            );
        }
        assert!(peers.open(v4(&others[2])));
        assert_eq!(peers.readable(), 0, "nothing queued");
        // Loopback queues a datagram within its send.
        others[1].send_to(&[7], main.local()).unwrap();
        assert_eq!(peers.readable(), 0b010);
        assert_eq!(
            read_one(peers.sock_mut(1).unwrap()),
            Some((v4(&others[1]), 7))
        );
        assert_eq!(peers.readable(), 0);
        // A fourth socket, towards a port nobody listens on: its send's "port
        // unreachable" makes it readable (the error is read there).
        let gone = v4(&others[3]);
        drop(others);
        assert!(peers.open(gone));
        let mut batch = super::super::TxBatch::new(true);
        batch.push(gone, |buf| {
            buf.push(1);
            1
        });
        peers.sock_mut(3).unwrap().send_run(&mut batch, 0, true);
        let deadline = Instant::now() + Duration::from_secs(2);
        while peers.readable() != 0b1000 {
            assert!(Instant::now() < deadline, "the error never showed");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_peer_socket_takes_its_peers_datagrams_and_the_main_one_the_rest() {
        let lo = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0);
        let mut main = UdpSock::bind_shared(lo, 1 << 20).unwrap();
        let (a, b) = (UdpSocket::bind(lo).unwrap(), UdpSocket::bind(lo).unwrap());
        let mut peers = PeerSocks::new(1, main.local(), 1 << 20, false);
        assert!(peers.open(v4(&a)));
        assert!(!peers.open(v4(&b)), "the limit is one socket");
        assert!(!peers.open(v4(&a)), "one socket per peer");
        assert_eq!(peers.take_new_fds().count(), 1);
        a.send_to(&[1], main.local()).unwrap();
        b.send_to(&[2], main.local()).unwrap();
        let own = peers.sock_mut(0).unwrap();
        assert_eq!(read_one(own), Some((v4(&a), 1)));
        assert_eq!(read_one(&mut main), Some((v4(&b), 2)));
        // Sends through it come from the shared address.
        let mut batch = super::super::TxBatch::new(true);
        batch.push(v4(&a), |buf| {
            buf.push(3);
            1
        });
        let end = peers.sock_mut(0).unwrap().send_run(&mut batch, 0, true);
        assert_eq!(end, 1);
        let mut got = [0u8; 4];
        a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let (n, from) = a.recv_from(&mut got).unwrap();
        assert_eq!((n, got[0], from), (1, 3, main.local()));
        assert!(peers.close(v4(&a)));
        assert!(peers.is_empty());
        assert_eq!(
            peers.stats().datagrams_sent,
            1,
            "a closed socket's counters stay"
        );
    }
}
