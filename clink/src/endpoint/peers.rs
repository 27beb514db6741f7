//! Peers: connecting, accepting and adopting them, what is known of each, and failing
//! them (with every operation that involved them) when their link ends.

use super::*;
use crate::transport::shm::ring_cells_for;
use crate::transport::tcp::TcpLink;
use crate::transport::udp::UdpLink;

/// How a connection was made ([`Endpoint::joined`]).
///
/// Two endpoints that connect to each other at the same moment each end up with two
/// connections to the other: the one it made and the one it accepted. Each handshake's
/// answer says whether its sender was connecting to the other at the time, so both ends
/// know such a pair *crossed*, and both make the same choice of which connection to use:
/// the one the endpoint with the smaller identity made ([`Joined::superseded`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Joined {
    /// This endpoint connected (else it accepted).
    pub connected: bool,
    /// The two ends were connecting to each other at once: another connection between
    /// them was, or is being, made too.
    pub crossed: bool,
    /// The connection crossed another and is not the one both ends use (the one the
    /// endpoint with the smaller identity made): send and receive on the other. Both ends
    /// come to the same answer. A connection that did not cross is the one to use unless
    /// another to the same endpoint came first.
    pub superseded: bool,
}

impl Endpoint {
    /// Connects to the endpoint at `addr` (a string from its [`Endpoint::address`]).
    /// Shared memory is used when the address is on this host and network namespace
    /// (unless `CLINK_TRANSPORT` says otherwise); else UDP, or TCP when configured
    /// (`CLINK_TRANSPORT=tcp`), when the peer offers only TCP, or when this endpoint's
    /// UDP is off.
    ///
    /// When the other endpoint connects to this one at the same moment, both get two
    /// connections to each other; [`Endpoint::joined`] tells which to use.
    pub fn connect(&mut self, addr: &str) -> Result<PeerId> {
        self.check_fork()?;
        let a = Address::parse(addr)?;
        if a.id == self.id {
            return Err(Error::connect(addr, "that is this endpoint itself".into()));
        }
        self.mark_connecting(Some(a.id));
        let r = self.connect_to(addr, a);
        self.mark_connecting(None);
        r
    }

    /// Records which endpoint a connect under way is for (an incoming connection from it
    /// crossed it): the shared-memory and TCP handshakes read it here as they answer a
    /// hello; the UDP transport, which answers hellos inside its receive path, gets a copy.
    fn mark_connecting(&mut self, id: Option<u128>) {
        self.connecting = id;
        if let Some(n) = self.nets.udp.as_mut() {
            n.set_connecting(id);
        }
    }

    /// [`Endpoint::connect`] to the parsed address `a`.
    fn connect_to(&mut self, addr: &str, a: Address) -> Result<PeerId> {
        let fail = |why: &str| Error::connect(addr, why.to_string());
        let tcp_first = self.nets.tcp.is_some()
            && (self.ctx.config.prefer_tcp || a.udp.is_empty() || self.nets.udp.is_none());
        let same_host = a.host == self.ctx.host;
        // A UDP socket reaches its own family only (an IPv6 one both).
        let v6_udp = self.nets.udp.as_ref().is_some_and(|n| n.local().is_ipv6());
        let udp_addrs: Vec<std::net::SocketAddr> = (a.udp.iter())
            .filter(|u| u.is_ipv4() || v6_udp)
            .copied()
            .collect();
        let udp = (!udp_addrs.is_empty()).then(|| {
            let mine = self.nets.udp.as_ref().map_or(&[][..], |n| n.interfaces());
            crate::netdev::pick(&udp_addrs, mine, crate::sys::interfaces, same_host)
        });
        let tcp = (!a.tcp.is_empty()).then(|| {
            let mine = self.nets.tcp.as_ref().map_or(&[][..], |t| t.interfaces());
            crate::netdev::pick(&a.tcp, mine, crate::sys::interfaces, same_host)
        });
        let deadline = Instant::now() + self.ctx.config.connect_timeout;
        // The peer's addresses other than the one chosen, tried when it does not answer.
        let others = |all: &[std::net::SocketAddr], chosen| {
            all.iter().filter(|&&u| u != chosen).copied().collect()
        };
        let name = match (a.shm.as_deref(), udp, tcp) {
            (Some(name), _, _) if same_host && !self.ctx.config.force_net => name,
            (_, _, Some(dest)) if tcp_first => {
                return self.connect_tcp(addr, dest, others(&a.tcp, dest), a.id, deadline)
            }
            (_, Some(dest), tcp) => {
                return self.connect_udp(addr, dest, others(&udp_addrs, dest), a.id, tcp);
            }
            (_, None, Some(dest)) => {
                return self.connect_tcp(addr, dest, others(&a.tcp, dest), a.id, deadline)
            }
            _ if !a.udp.is_empty() && self.nets.udp.is_some() => {
                return Err(fail(
                    "the peer offers only IPv6 UDP addresses and this endpoint's UDP socket is IPv4 (include an IPv6 subnet in CLINK_NET_DEVICES)",
                ))
            }
            (Some(_), None, None) => {
                return Err(fail(
                    "the endpoint is on another host or network namespace and offers no network transport (udp, tcp)",
                ))
            }
            (None, None, None) => {
                return Err(fail(
                    "the address offers no transport this build supports (shm, udp, tcp)",
                ))
            }
        };
        let mut incoming = std::mem::take(&mut self.incoming);
        let mut accepted = Vec::new();
        let mut refused = Vec::new();
        let shm_peers = (self.peers.iter())
            .filter(|p| p.alive && matches!(p.link, Link::Shm(_)))
            .count();
        let cfg = &self.ctx.config;
        let cells = ring_cells_for(
            cfg.ring_cells,
            shm_peers.max(self.expected_peers),
            cfg.ring_shrink,
        );
        let link = {
            let me = self.local();
            let (listener, epoll) = (&self.listener, &self.epoll);
            ShmPeer::connect(name, &me, cells, || {
                // Answer peers connecting to us meanwhile (mutual connects must not deadlock).
                handshake_incoming(
                    listener,
                    epoll,
                    &mut incoming,
                    &me,
                    &mut accepted,
                    &mut refused,
                );
            })
        };
        self.incoming = incoming;
        self.adopt(accepted, refused);
        self.add_shm_peer(link?, true)
    }

    /// Registers peers accepted by [`handshake_incoming`] and records refusals.
    pub(super) fn adopt(&mut self, accepted: Vec<ShmPeer>, refused: Vec<Error>) {
        for p in accepted {
            match self.add_shm_peer(p, false) {
                Ok(id) => self.new_peers.push_back(id),
                Err(e) => self.last_error = Some(e.to_string()),
            }
        }
        for e in refused {
            tracing::warn!("incoming connection refused: {e}");
            self.stats.handshakes_refused += 1;
            self.last_error = Some(e.to_string());
        }
    }

    /// How the connection to `peer` was made: whether this endpoint connected, and
    /// whether the two ends were connecting to each other at once ([`Joined`]).
    pub fn joined(&self, peer: PeerId) -> Result<Joined> {
        Ok(self.peer(peer)?.joined)
    }

    /// True while a connection from the endpoint of identity `id` is being set up: this
    /// endpoint answered its hello, and it becomes a peer when the connector's first
    /// message after that answer arrives (UDP). A program that wants one connection per
    /// pair waits for it rather than connecting too.
    pub fn being_connected_by(&self, id: u128) -> bool {
        self.nets
            .udp
            .as_ref()
            .is_some_and(|n| n.being_connected_by(id))
    }

    /// Adds the UDP connection `link` as a peer, the link kept by the UDP transport;
    /// `connected`: this endpoint made it.
    pub(super) fn add_udp_peer(&mut self, link: UdpLink, connected: bool) -> Result<PeerId> {
        let joined = self.joining(connected, link.crossed(), link.remote_id());
        let id = PeerId(self.peers.len() as u32);
        let eager_max =
            crate::context::net_eager_threshold(&self.ctx, link.conn().config().reliable);
        let Some(net) = self.nets.udp.as_mut() else {
            return Err(Error::Invalid(
                "a UDP peer without the UDP transport".into(),
            ));
        };
        net.adopt(id.0 as usize, link);
        self.watch_new_sockets();
        Ok(self.push_peer(Link::Udp, joined, eager_max))
    }

    /// How a connection was made: `connected`, this endpoint made it; `crossed`, the two
    /// ends connected to each other at once; `remote_id`, the peer's identity.
    fn joining(&self, connected: bool, crossed: bool, remote_id: u128) -> Joined {
        Joined {
            connected,
            crossed,
            // The smaller identity's connection is kept.
            superseded: crossed && connected != (self.id < remote_id),
        }
    }

    /// Adds the shared-memory connection `link` as a peer; `connected`: this endpoint made
    /// it.
    pub(super) fn add_shm_peer(&mut self, link: ShmPeer, connected: bool) -> Result<PeerId> {
        let joined = self.joining(connected, link.crossed, link.id);
        let id = PeerId(self.peers.len() as u32);
        self.epoll
            .add(link.sock.raw(), TOK_PEER0 + u64::from(id.0))
            .map_err(io_err("epoll_ctl peer socket"))?;
        // Limits follow the connection's rings (the connector chose their size).
        let eager_max = eager_threshold(&self.ctx, link.peer_cma, link.tx.mem().cap());
        Ok(self.push_peer(Link::Shm(link), joined, eager_max))
    }

    /// Adds the TCP connection `link` as a peer, the link kept by the TCP transport (its
    /// socket goes in the epoll set under the peer's token); `connected`: this endpoint
    /// made it.
    pub(super) fn add_tcp_peer(&mut self, link: TcpLink, connected: bool) -> Result<PeerId> {
        let joined = self.joining(connected, link.crossed, link.remote_id());
        let id = PeerId(self.peers.len() as u32);
        let (fd, tok) = (link.fd(), TOK_PEER0 + u64::from(id.0));
        // An accepted connection is watched already (under the handshake token).
        if self.epoll.modify(fd, tok, false).is_err() {
            self.epoll
                .add(fd, tok)
                .map_err(io_err("epoll_ctl TCP connection"))?;
        }
        let Some(tcp) = self.nets.tcp.as_mut() else {
            return Err(Error::Invalid(
                "a TCP peer without the TCP transport".into(),
            ));
        };
        tcp.adopt(id.0 as usize, link);
        let eager_max = crate::context::net_eager_threshold(&self.ctx, false);
        Ok(self.push_peer(Link::Tcp, joined, eager_max))
    }

    /// Makes the next peer, of link `link`, and announces it.
    fn push_peer(&mut self, link: Link, joined: Joined, eager_max: u64) -> PeerId {
        let id = PeerId(self.peers.len() as u32);
        self.peers.push(Peer {
            link,
            joined,
            alive: true,
            eager_max,
            txq: msg::TxQueue::default(),
            rndv: msg::Rendezvous::new(id),
            blocked: false,
            engine: Default::default(),
            announced: false,
            closing: false,
            unacked: false,
            listed: false,
        });
        self.ready_add(id.0 as usize);
        self.stats.peers_connected += 1;
        self.evq.push(events::PEERS, Event::PeerConnected(id));
        id
    }

    /// Waits up to `timeout` for a peer to connect to us and returns it. Peers that
    /// connected earlier are returned first, one per call.
    pub fn accept(&mut self, timeout: Option<Duration>) -> Result<PeerId> {
        // Progress looks at the listener only at liveness checks (no system call per poll);
        // a caller waiting for a connection looks at it on every poll, and sleeps where
        // the listener is watched (not on a peer's futex).
        self.wait_for(timeout, false, None, |ep| {
            if ep.new_peers.is_empty() {
                ep.accept_pending();
                ep.tcp_accept();
            }
            !ep.new_peers.is_empty()
        })?;
        self.new_peers.pop_front().ok_or(Error::Timeout)
    }

    /// Says that this endpoint will connect to about `n` peers on its host (a job's
    /// other local ranks, say). Its connections' rings are then sized for that many from
    /// the first connection on, rather than shrinking only as peers accumulate (see
    /// `CLINK_RING_SHRINK`): a full mesh of 64 processes holds 2 016 pairs of rings.
    pub fn expect_peers(&mut self, n: usize) {
        self.expected_peers = n;
    }

    /// The peers connected so far (alive or not).
    pub fn peers(&self) -> Vec<PeerId> {
        (0..self.peers.len() as u32).map(PeerId).collect()
    }

    /// How many peers have connected so far (alive or not): the `PeerId`s are
    /// `0..peer_count()`.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// True while `peer` is connected and alive.
    pub fn is_alive(&self, peer: PeerId) -> bool {
        self.peers.get(peer.0 as usize).is_some_and(|p| p.alive)
    }

    /// The identity of the endpoint behind `peer` (the `id` of its address): the same
    /// for every connection to that endpoint, whichever side connected.
    pub fn peer_endpoint_id(&self, peer: PeerId) -> Result<u128> {
        Ok(self.peer(peer)?.link.remote_id(&self.nets, peer.0 as usize))
    }

    /// Eager/rendezvous threshold used towards `peer` (bytes sent eagerly at most).
    pub fn eager_max(&self, peer: PeerId) -> Result<u64> {
        Ok(self.peer(peer)?.eager_max)
    }

    /// The transport that reaches `peer`: `"shm"`, `"udp"` or `"tcp"`.
    pub fn transport(&self, peer: PeerId) -> Result<&'static str> {
        Ok(self.peer(peer)?.link.transport())
    }

    /// Whether this endpoint reads `peer`'s rendezvous messages with one CMA copy (true) or
    /// through the two-copy pipeline (false).
    pub fn uses_cma(&self, peer: PeerId) -> Result<bool> {
        Ok(self.peer(peer)?.link.cma())
    }

    pub(super) fn peer(&self, peer: PeerId) -> Result<&Peer> {
        // `let else`, not `ok_or`: the error would be built (and dropped) on every call.
        let Some(p) = self.peers.get(peer.0 as usize) else {
            return Err(Error::UnknownPeer(peer));
        };
        Ok(p)
    }

    pub(super) fn accept_pending(&mut self) -> bool {
        let mut accepted = Vec::new();
        let mut refused = Vec::new();
        let mut incoming = std::mem::take(&mut self.incoming);
        handshake_incoming(
            &self.listener,
            &self.epoll,
            &mut incoming,
            &self.local(),
            &mut accepted,
            &mut refused,
        );
        self.incoming = incoming;
        let did = !accepted.is_empty();
        self.adopt(accepted, refused);
        did
    }

    /// Queues a message-arrival event for the frame at the head of peer `i`'s queue, once.
    /// Only with message events of interest: a message passed over while they were off
    /// is announced when interest is turned on.
    pub(super) fn announce(&mut self, i: usize, tag: u64) {
        let p = &mut self.peers[i];
        if !p.announced && self.evq.interest & events::MESSAGES != 0 {
            p.announced = true;
            let peer = PeerId(i as u32);
            self.evq
                .push(events::MESSAGES, Event::Message { peer, tag });
        }
    }

    pub(super) fn fail_peer(&mut self, i: usize, why: String) {
        tracing::debug!("peer {i} failed: {why}");
        self.last_error = Some(why);
        self.stats.peers_failed += 1;
        self.peers[i].alive = false;
        self.ready_remove(i);
        let peer = PeerId(i as u32);
        self.evq.push(
            events::PEERS,
            if self.peers[i].closing {
                Event::PeerClosed(peer)
            } else {
                Event::PeerFailed(peer)
            },
        );
        match &self.peers[i].link {
            Link::Shm(s) => self.epoll.remove(s.sock.raw()),
            Link::Udp => {
                if let Some(net) = self.nets.udp.as_mut() {
                    net.detach(i);
                }
            }
            Link::Tcp => self.tcp_removed(i),
        }
        self.fail_peer_ops(i);
    }

    /// Fails every operation that needs the (dead or closed) peer `i`.
    pub(super) fn fail_peer_ops(&mut self, i: usize) {
        let peer = PeerId(i as u32);
        let p = &mut self.peers[i];
        p.txq.clear();
        if let Some(b) = p.link.bulk(&mut self.nets, i) {
            // No pointer into a request buffer survives the requests' failure.
            b.clear_bulk();
        }
        p.rndv.peer_died(&mut self.req, || Error::PeerDead(peer));
        self.fail_peer_rma(i);
    }
}

/// Accepts new connections and completes the handshake of those whose hello has arrived,
/// without ever waiting for one: a connection that stays silent cannot stall the endpoint.
/// Silent ones are dropped after the connect timeout.
pub(super) fn handshake_incoming(
    listener: &SeqPacket,
    epoll: &Epoll,
    incoming: &mut Vec<(SeqPacket, Instant)>,
    me: &Local,
    accepted: &mut Vec<ShmPeer>,
    refused: &mut Vec<Error>,
) {
    loop {
        match listener.accept() {
            Ok(Some(s)) => {
                if let Err(e) = epoll.add(s.raw(), TOK_INCOMING) {
                    refused.push(Error::Io {
                        what: "epoll_ctl incoming".into(),
                        source: e,
                    });
                    continue;
                }
                incoming.push((s, Instant::now()));
            }
            Ok(None) => break,
            Err(e) => {
                refused.push(Error::Io {
                    what: "accept".into(),
                    source: e,
                });
                break;
            }
        }
    }
    let mut i = 0;
    while i < incoming.len() {
        let (s, since) = &incoming[i];
        let ready = sys::poll_readable(s.fd(), Duration::ZERO).unwrap_or(true);
        if !ready && since.elapsed() < me.config.connect_timeout {
            i += 1;
            continue;
        }
        let (s, _) = incoming.swap_remove(i);
        epoll.remove(s.raw());
        if !ready {
            refused.push(Error::Connect {
                addr: "incoming connection".into(),
                why: format!("no hello within {:?}", me.config.connect_timeout),
            });
            continue;
        }
        match ShmPeer::accept(s, me) {
            Ok(p) => accepted.push(p),
            Err(e) => refused.push(e),
        }
    }
}
