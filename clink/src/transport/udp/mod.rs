//! The UDP transport: endpoints on different hosts (here: network namespaces).
//!
//! One socket per endpoint ([`sock::UdpSock`]) carries every peer's datagrams; each peer is
//! a [`UdpLink`] holding the sans-IO reliable connection ([`clink_proto::reliable::Conn`]:
//! sequencing, SACK/NAK, retransmission, credits, congestion window, fragmentation), kept
//! by the transport under the endpoint's peer index ([`links`]): a receive hands each
//! datagram to its link, and the endpoint takes the frames the links delivered. The
//! endpoint's frames (eager messages, rendezvous control, pipelined chunks, close) are the
//! connection's messages, so the endpoint's protocol above is the same as over shared
//! memory: a link is an ordered, reliable frame channel, with its own flow control.
//!
//! Demultiplexing: datagrams are routed by (source address, connection id). A hello
//! (connection request, carrying the addressee's endpoint id) creates a connection with the
//! id the initiator chose; the welcome answers it. Anything else from an unknown
//! (address, id) is stray: dropped and counted. Corrupt datagrams fail their checksum and
//! are dropped by the connection; fault injection ([`faults`]) sits between the socket and
//! the connections. Rendezvous transfers travel as bulk fragments received speculatively
//! straight into the posted buffer ([`bulk`], [`clink_proto::spec`]).

mod admit;
pub mod bulk;
pub mod faults;
mod handshake;
pub mod keepalive;
mod link;
mod links;
pub mod peers;
mod receive;
pub mod ring;
pub mod steer;

pub use crate::sys::udp as sock;

use handshake::{HalfOpen, Pending};
pub use link::UdpLink;
use receive::{Armed, Gathered, Misplaced};

use crate::error::{io_err, Result};
use crate::lease::Dst;
use crate::transport::FrameQueue;
use clink_proto::admission::{Decision, Gate, GateConfig, Mode, STANDING_GRANT};
use clink_proto::reliable::packet::{
    bulk_claim, bulk_header_owner, bulk_owner, is_bulk, is_handshake, peek_conn, wire_xfer,
    BULK_HEADER, DATA_HEADER, TRAILER,
};
use clink_proto::reliable::{self, Admit, BulkHeader, Conn, Datagram, Event, Handshake, SendError};
use clink_proto::spec::{self, Check, Confidence, Displaced, Layout, Move, Segment};
use clink_proto::wire::Frame;
use keepalive::Keepalive;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

pub use bulk::{Arm, Bulk, BulkStats};
pub use faults::{FaultConfig, FaultStats, Faults};
pub use peers::PeerSocks;
pub use sock::{SockStats, TxBatch, UdpSock};
pub use steer::Steering;

/// IPv4 + UDP header bytes.
const IP_UDP_HEADERS: usize = 28;
/// Receive batches read from a steered socket other than the armed one per pass (a
/// previous holder's stragglers).
const STRAGGLER_BATCHES: usize = 4;
/// Datagrams read one per call at the head of an armed shared socket's queue, per pass,
/// because they are not the fragment the layout expects first (see
/// [`UdpTransport::receive`]).
const HEAD_READS: usize = 32;

/// The largest message payload per datagram for a path MTU.
pub fn mtu_payload(mtu: usize) -> usize {
    (mtu.saturating_sub(IP_UDP_HEADERS)).min(sock::MAX_UDP_PAYLOAD) - DATA_HEADER - TRAILER
}

/// The payload of a bulk fragment for a path MTU (IPv4): 1 448 bytes at MTU 1500, as many
/// as a TCP segment with timestamps carries.
pub fn bulk_fragment(mtu: usize) -> usize {
    reliable::bulk_payload(mtu_payload(mtu))
}

/// Fragments per bulk group for a fragment payload size ([`reliable::bulk_payload`]): as
/// many full datagrams as one GSO send carries (so one group is one send and, with GRO,
/// one read).
pub fn bulk_group(bulk_payload: usize) -> u64 {
    (sock::MAX_UDP_PAYLOAD / (bulk_payload + BULK_HEADER)).clamp(1, sock::MAX_GSO_SEGMENTS) as u64
}

/// What a receive hands to the endpoint for a link.
pub enum Got<'a> {
    /// A datagram for the link's connection.
    Datagram(&'a [u8]),
    /// A bulk fragment a speculative receive found intact at its place (header verified),
    /// with its length on the wire.
    Placed(BulkHeader, usize),
    /// A bulk fragment a speculative receive found intact in another fragment's place and
    /// moved to its own (header verified), with its length on the wire.
    Moved(BulkHeader, usize),
}

/// Settings of the UDP transport (from `CLINK_*`, see [`crate::config`]).
#[derive(Clone, Debug, PartialEq)]
pub struct UdpConfig {
    /// Address to bind; unspecified IP = all interfaces, port 0 = any.
    pub bind: SocketAddr,
    /// Path MTU; `None`: per peer, the MTU of the advertised interface towards it
    /// ([`crate::netdev::mtu_towards`]).
    pub mtu: Option<usize>,
    /// Kernel socket buffer size each way.
    pub sock_buf: usize,
    /// Silence after which a peer is declared dead.
    pub dead_after: Duration,
    /// Reliable (retransmit) or unreliable (BCL-4's choice) delivery.
    pub reliable: bool,
    /// Speculative scatter receive of bulk transfers.
    pub speculate: bool,
    /// Turn speculation off for a while when the armed stream's fragments mostly miss
    /// ([`Confidence`]); `false` keeps it armed whatever it costs (the raw miss path).
    pub spec_backoff: bool,
    /// Experiment knob: send bulk fragments misordered within their groups, so that the
    /// receiver's speculation misses every one (`reliable::Config::bulk_misorder`).
    pub force_miss: bool,
    /// Faults to inject on receive.
    pub faults: FaultConfig,
    /// Admission control of fast bulk streams (one granted stream per socket).
    pub admission: Mode,
    /// Flow steering: the granted stream gets a socket of its own.
    pub steer: bool,
    /// Peers (the first ones) that get a connected socket of their own ([`peers`]); 0:
    /// every peer shares the main socket.
    pub peer_sockets: usize,
    /// Read the small datagrams from a packet socket's receive ring instead of the UDP
    /// sockets, and send lone small datagrams to a peer one hop away through that packet
    /// socket ([`ring`]; needs `CAP_NET_RAW`, else the sockets alone).
    pub ring: bool,
    /// Hash bulk payloads end to end (XXH3 per fragment) on this side's connections, both
    /// ways (either side's wish applies); otherwise they are left to the UDP checksum, as
    /// TCP leaves its stream to its own, and only bulk headers carry clink's checksum
    /// ([`clink_proto::reliable::packet::BulkHeader::hashed`]).
    pub payload_hash: bool,
    /// A thread that pings every peer while the application makes no receive pass for
    /// a keepalive interval ([`keepalive`]), so that a process computing for minutes is
    /// not declared dead by its peers.
    pub keepalive_thread: bool,
    /// Which interface's address to advertise when bound to all of them
    /// (`CLINK_NET_DEVICES`, [`crate::netdev`]); empty: the first non-loopback one.
    pub devices: Vec<crate::netdev::DeviceRule>,
    /// How long a connect waits for a UDP welcome before it gives UDP up and connects
    /// over TCP, when the peer offers TCP too; `None`: never (UDP until the connect
    /// timeout; the default with `CLINK_TRANSPORT=udp`).
    pub fallback: Option<Duration>,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            bind: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
            mtu: None,
            sock_buf: 32 << 20,
            dead_after: Duration::from_millis(2000),
            reliable: true,
            speculate: true,
            force_miss: false,
            spec_backoff: true,
            faults: FaultConfig::default(),
            admission: Mode::Implicit,
            steer: false,
            peer_sockets: 8,
            ring: true,
            payload_hash: false,
            keepalive_thread: true,
            devices: Vec::new(),
            fallback: Some(Duration::from_millis(1000)),
        }
    }
}

/// Counters of the transport (connection counters are in each link's `Conn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams from unknown (address, connection) pairs, dropped.
    pub stray: u64,
    /// Handshake datagrams that failed to parse or were addressed to another endpoint.
    pub bad_handshakes: u64,
    /// Incoming connections welcomed whose connector never sent a datagram after the
    /// hello (it gave up, or fell back to TCP), dropped.
    pub abandoned_handshakes: u64,
    /// Datagrams read into a speculative layout that were not the expected fragment
    /// (gathered and handled by the ordinary path).
    pub spec_misses: u64,
    /// Times the armed stream's fragments mostly missed and speculation was turned off
    /// for a while ([`Confidence`]).
    pub spec_backoffs: u64,
    /// Fast streams granted by this endpoint's admission control (Fast_Ack).
    pub fast_grants: u64,
    /// Fast-stream requests it refused (Fast_NAck).
    pub fast_refusals: u64,
    /// Grants it took back (idle, or held too long while others waited).
    pub fast_revocations: u64,
    /// Bulk fragments received from the stream holding the grant (while it held it).
    pub granted_fragments: u64,
    /// Those found in place by the speculative receive (the granted stream's hits).
    pub granted_hits: u64,
    /// Datagrams read from the steered sockets.
    pub steered_datagrams: u64,
    /// Datagrams read from peers' own sockets ([`peers`]).
    pub peer_socket_datagrams: u64,
    /// Datagrams read from the receive ring ([`ring`]).
    pub ring_datagrams: u64,
    /// Ring frames that held no valid UDP packet for the endpoint, dropped.
    pub ring_malformed: u64,
    /// Packets the kernel dropped for a full ring (repaired as losses).
    pub ring_full_drops: u64,
    /// Datagrams sent through the ring's packet socket.
    pub ring_sent: u64,
    /// Notices in the ring of coalesced data runs waiting in a socket.
    pub ring_notices: u64,
    /// Keepalive rounds the keepalive thread sent while the application was away.
    pub keepalive_rounds: u64,
    /// Fast-stream requests granted at once because the peer has a receive socket of
    /// its own (outside the gate).
    pub own_queue_grants: u64,
}

/// Passes that read the main socket after a peer's own socket opened (what the peer sent
/// before then, a connector's first messages say, waits there).
const MAIN_DRAIN_PASSES: u32 = 4;

/// The endpoint's UDP socket, its routes and connection set-up.
pub struct UdpTransport {
    /// The socket.
    pub sock: UdpSock,
    /// The sockets granted fast streams are steered to (flow steering).
    steer: Steering,
    /// The connected sockets of the first peers.
    peers: PeerSocks,
    /// Receive passes, for reading the main socket every [`peers::MAIN_EVERY`]th one.
    passes: u32,
    /// Whether the last receive read the clock (see [`UdpTransport::read_is_fresh`]).
    read_fresh: bool,
    /// Routes whose peer has no socket of its own (their datagrams reach the main one).
    uncovered: usize,
    /// Passes left that read the main socket whatever its cadence: a peer's socket just
    /// opened, and what the peer sent before it did waits in the main one.
    main_drain: u32,
    faults: Option<Faults>,
    /// Whether speculation pays for the armed stream.
    confidence: Confidence,
    /// The receive ring of the small datagrams, once opened ([`ring`]).
    ring: Option<ring::RxRing>,
    /// The ring's descriptor, for the endpoint's epoll set, until it takes it.
    ring_new_fd: Option<RawFd>,
    /// With the ring: the last pass's socket reads brought something, so the next pass
    /// reads the sockets again (else they are read every [`RING_SOCK_EVERY`]th pass).
    sock_hot: bool,
    /// With the ring: passes left that read every socket because the ring gave notice
    /// of a coalesced data run ([`RxRing::take_notice`]); the kernel queues the run on
    /// the socket just after the ring's copy, so a read at once may come too early.
    notice_due: u32,
    /// With the ring: a bulk transfer is coming in, so every pass reads the sockets.
    bulk_expected: bool,
    /// Datagrams the last [`UdpTransport::receive`] took from the ring.
    ring_reads: usize,
    /// With the ring: where each peer's datagrams came from, one hop away (learned from
    /// the ring's frames of datagrams that reached a link): lone datagrams to it are sent
    /// through the packet socket.
    hops: Vec<(SocketAddrV4, ring::LinkAddr)>,
    /// The links, by the endpoint's peer index ([`links`]).
    links: links::Links,
    /// The keepalive thread, started with the first peer ([`keepalive`]).
    keepalive: Option<Keepalive>,
    /// ICMP errors read from the sockets, not yet taken by the endpoint.
    unreachable: Vec<sock::Unreachable>,
    st: State,
}

/// The links' routes: (source address, connection id) to the endpoint's peer index, and
/// source address alone to the links from there (for bulk datagrams, which do not carry
/// their connection id: with one link from an address it is that one; with several, two
/// endpoints connected both ways or a restarted peer's old and new connection, the
/// datagram's checksum names it, [`bulk_owner`]).
#[derive(Default)]
struct Routes {
    map: HashMap<(SocketAddr, u32), usize>,
    by_src: HashMap<SocketAddr, Vec<(u32, usize)>>,
    /// The last route found: a stream's datagrams skip the hashing (SipHash, keyed
    /// against forged sources) that was 2% of a 64-byte hop's user time.
    last: std::cell::Cell<Option<((SocketAddr, u32), usize)>>,
    /// The same for bulk datagrams from an address with one link.
    last_src: std::cell::Cell<Option<(SocketAddr, usize)>>,
}

impl Routes {
    /// The link bulk datagram `d` from `src` belongs to, if any.
    fn get_src(&self, src: SocketAddr, d: &[u8]) -> Option<usize> {
        if let Some((_, i)) = self.last_src.get().filter(|(k, _)| *k == src) {
            return Some(i);
        }
        match self.by_src.get(&src)?.as_slice() {
            &[(_, i)] => {
                self.last_src.set(Some((src, i)));
                Some(i)
            }
            links => {
                let c = bulk_owner(d, links.iter().map(|l| l.0))?;
                links.iter().find(|l| l.0 == c).map(|l| l.1)
            }
        }
    }

    /// The links from (and to) `src`: (connection id, peer index).
    fn links_of(&self, src: SocketAddr) -> &[(u32, usize)] {
        self.by_src.get(&src).map_or(&[], |l| l.as_slice())
    }

    fn get(&self, key: (SocketAddr, u32)) -> Option<usize> {
        if let Some((k, i)) = self.last.get().filter(|(k, _)| *k == key) {
            debug_assert_eq!(self.map.get(&k), Some(&i));
            return Some(i);
        }
        let i = *self.map.get(&key)?;
        self.last.set(Some((key, i)));
        Some(i)
    }

    fn insert(&mut self, key: (SocketAddr, u32), i: usize) {
        self.last.set(None);
        self.last_src.set(None);
        if let Some(old) = self.map.insert(key, i) {
            self.unlist(key, old);
        }
        self.by_src.entry(key.0).or_default().push((key.1, i));
    }

    fn remove(&mut self, key: (SocketAddr, u32)) -> Option<usize> {
        self.last.set(None);
        self.last_src.set(None);
        let i = self.map.remove(&key)?;
        self.unlist(key, i);
        Some(i)
    }

    fn unlist(&mut self, key: (SocketAddr, u32), i: usize) {
        if let Some(links) = self.by_src.get_mut(&key.0) {
            links.retain(|&l| l != (key.1, i));
            if links.is_empty() {
                self.by_src.remove(&key.0);
            }
        }
    }
}

/// Everything but the socket (so a receive can borrow both at once).
struct State {
    cfg: UdpConfig,
    /// Why there is no receive ring and will be none (for `clink info`); `None` while it
    /// is open or may still be opened ([`State::two_paths`]).
    ring_off: Option<String>,
    /// The interfaces advertised, preferred first.
    ifaces: Vec<crate::sys::Iface>,
    advertised: Vec<SocketAddr>,
    my_id: u128,
    batch: TxBatch,
    routes: Routes,
    pending: Vec<Pending>,
    /// The endpoint a connect under way is for (of any transport): a hello from it
    /// crossed that connect.
    connecting: Option<u128>,
    /// Incoming connections waiting for their connector's first datagram.
    half_open: Vec<HalfOpen>,
    /// Incoming connections taken up, for the endpoint to adopt.
    accepted: Vec<UdpLink>,
    /// Datagrams that arrived for connections of `accepted` before the endpoint routed
    /// them, handed over again at the next receive.
    early: Vec<(SocketAddr, Vec<u8>)>,
    /// Welcomes queued by a receive, sent at its end: no link transmits them (a welcomed
    /// connection is adopted only once taken up), and a receive made outside a progress
    /// pass (a wait's read) flushes nothing else.
    welcomes_due: bool,
    /// The monotonic clock's reading when the transport started, ns.
    epoch: u64,
    /// The clock's last reading ([`State::now`]): never behind any reading handed out.
    last_now: std::cell::Cell<u64>,
    stats: UdpStats,
    /// Header slots of the speculative layouts: [`sock::MAX_GSO_SEGMENTS`] per entry.
    hdr_slots: Vec<[u8; BULK_HEADER]>,
    /// The receive vectors of the armed entries.
    lead: Vec<Vec<Dst>>,
    /// The armed layout, rebuilt only when its key changes.
    armed: Option<Armed>,
    /// The socket the layout is armed on (see [`socket`]: 0 the main one).
    armed_on: usize,
    /// The grant holder when decisions were last drained (a change re-plans the layout).
    last_holder: Option<usize>,
    /// Admission control: which peer (route index) may send fast.
    gate: Gate<usize>,
    /// Its decisions not yet told to the peers.
    decisions: Vec<Decision<usize>>,
    /// The key last planned, armed or not (a plan with nothing to arm is not redone until
    /// the key changes).
    planned: Option<(usize, u64)>,
    segs: Vec<Segment>,
    /// A read's intact fragments in each other's places, reused.
    displaced: Vec<Misplaced>,
    /// Their moves, as [`spec::plan_moves`] ordered them, reused.
    moves: Vec<Move>,
    /// The [`Displaced`] of those that will move, reused.
    list: Vec<Displaced>,
    /// The displaced fragments' (place, index) in place order, reused.
    order: Vec<(u64, usize)>,
    /// The fragment a cycle of moves saves, reused.
    scratch: Vec<u8>,
    /// What a read copied out, reused.
    gathered: Gathered,
    /// The armed stream's fragments a receive found in place and not, for [`Confidence`].
    read_hits: u64,
    read_misses: u64,
}

impl State {
    fn now(&self) -> u64 {
        let t = crate::sys::monotonic_ns().saturating_sub(self.epoch);
        self.last_now.set(t);
        t
    }

    /// The largest message payload per datagram towards `dest`, by the path MTU: the
    /// configured one, else that of the advertised interface towards it
    /// ([`crate::netdev::mtu_towards`]).
    fn payload_towards(&self, dest: SocketAddr) -> usize {
        let mtu = (self.cfg.mtu)
            .unwrap_or_else(|| crate::netdev::mtu_towards(&self.ifaces, dest.ip()))
            .clamp(576, 65536);
        // IPv6's header is 20 bytes longer than the IPv4 one `mtu_payload` counts.
        mtu_payload(if dest.is_ipv6() { mtu - 20 } else { mtu })
    }

    /// The configuration of a connection with the peer at `dest` whose handshake is
    /// `peer`.
    fn conn_config(&self, conn_id: u32, dest: SocketAddr, peer: &Handshake) -> reliable::Config {
        let mine = self.payload_towards(dest);
        let mtu_payload = mine.min(peer.mtu_payload as usize).max(64);
        reliable::Config {
            conn_id,
            mtu_payload,
            reliable: self.cfg.reliable,
            dead_after: self.cfg.dead_after.as_nanos() as u64,
            keepalive: (self.cfg.dead_after.as_nanos() as u64 / 4).max(1),
            // Enough packets in flight to fill a fast local link at any MTU.
            recv_window: ((32 << 20) / mtu_payload as u64).clamp(1024, 1 << 16),
            max_cwnd: ((16 << 20) / mtu_payload as u64).max(64),
            bulk_group: bulk_group(reliable::bulk_payload(mtu_payload)),
            bulk_misorder: self.cfg.force_miss,
            payload_hash: self.cfg.payload_hash || peer.payload_hash,
            admission: clink_proto::admission::AskerConfig {
                mode: self.cfg.admission,
                ..Default::default()
            },
            // One ack per 16 packets or per delay keeps them cheap in bulk transfers; in a
            // ping-pong they ride on the answers (piggybacked).
            ack_every: 16,
            // The peer's receive paths decide whether ours reorder (its ring).
            split_paths: peer.two_paths,
            ..reliable::Config::default()
        }
    }

    /// Whether the receive ring is open, or will be with the first UDP peer unless the
    /// kernel refuses it: the connections' small packets and their bulk fragments then
    /// arrive by two paths. Said in the handshake: the peer's sends judge losses per kind
    /// ([`reliable::Config::split_paths`]), for the first peer too, whose connection is
    /// made before its route opens the ring. A refusal after a handshake said so leaves
    /// that peer judging per kind, which only makes it wait for more evidence.
    fn two_paths(&self) -> bool {
        self.ring_off.is_none() && ring_ip(self.cfg.bind.ip()).is_some()
    }

    /// Routes one received datagram: to its link, or to connection set-up. True when it
    /// went to a link.
    fn dispatch(
        &mut self,
        to_link: &mut impl FnMut(usize, &[u8]),
        src: SocketAddr,
        d: &[u8],
    ) -> bool {
        if is_handshake(d) {
            match Datagram::parse(d) {
                Ok(Datagram::Hello { conn, hs }) if hs.to == self.my_id => {
                    self.on_hello(src, conn, hs)
                }
                Ok(Datagram::Welcome { conn, hs }) if hs.to == self.my_id => {
                    self.on_welcome(src, conn, hs)
                }
                _ => self.stats.bad_handshakes += 1,
            }
            return false;
        }
        let route = if is_bulk(d) {
            self.routes.get_src(src, d)
        } else {
            peek_conn(d).and_then(|c| self.routes.get((src, c)))
        };
        match route {
            Some(i) => {
                to_link(i, d);
                true
            }
            None => {
                self.take_up(src, d);
                false
            }
        }
    }
}

impl UdpTransport {
    /// Binds the socket and works out the address to advertise and the path MTU.
    pub fn new(cfg: UdpConfig, my_id: u128) -> Result<UdpTransport> {
        let ifaces = crate::netdev::advertise(cfg.bind.ip(), &cfg.devices)?;
        let at = crate::netdev::socket_bind(cfg.bind, &ifaces);
        let sock = if cfg.peer_sockets > 0 {
            UdpSock::bind_shared(at, cfg.sock_buf)
        } else {
            UdpSock::bind(at, cfg.sock_buf)
        }
        .map_err(io_err(format!("bind UDP {at}")))?;
        let port = sock.local().port();
        let batch = TxBatch::new(sock.gso());
        let steer = Steering::new(cfg.steer, at, cfg.sock_buf);
        // The ring is opened with the first UDP peer ([`UdpTransport::open_ring`]): an
        // endpoint that never talks UDP adds no packet tap to every IP packet's path.
        let ring_off = (!cfg.ring).then(|| "off (CLINK_UDP_RING=0)".to_string());
        let peers = PeerSocks::new(cfg.peer_sockets, sock.local(), cfg.sock_buf, false);
        Ok(UdpTransport {
            peers,
            ring: None,
            ring_new_fd: None,
            sock_hot: false,
            notice_due: 0,
            bulk_expected: false,
            ring_reads: 0,
            hops: Vec::new(),
            links: links::Links::default(),
            keepalive: None,
            unreachable: Vec::new(),
            passes: 0,
            read_fresh: false,
            uncovered: 0,
            main_drain: 0,
            faults: cfg.faults.active().then(|| Faults::new(cfg.faults.clone())),
            confidence: Confidence::default(),
            st: State {
                ring_off,
                advertised: ifaces.iter().map(|i| SocketAddr::new(i.ip, port)).collect(),
                ifaces,
                cfg,
                my_id,
                batch,
                routes: Routes::default(),
                pending: Vec::new(),
                connecting: None,
                half_open: Vec::new(),
                early: Vec::new(),
                welcomes_due: false,
                accepted: Vec::new(),
                epoch: crate::sys::monotonic_ns(),
                last_now: std::cell::Cell::new(0),
                stats: UdpStats::default(),
                hdr_slots: vec![[0; BULK_HEADER]; sock::RX_SLOTS * sock::MAX_GSO_SEGMENTS],
                lead: (0..sock::RX_SLOTS).map(|_| Vec::new()).collect(),
                armed: None,
                armed_on: 0,
                last_holder: None,
                gate: Gate::new(GateConfig::default()),
                decisions: Vec::new(),
                planned: None,
                segs: Vec::new(),
                displaced: Vec::new(),
                moves: Vec::new(),
                list: Vec::new(),
                order: Vec::new(),
                scratch: Vec::new(),
                gathered: Gathered::default(),
                read_hits: 0,
                read_misses: 0,
            },
            steer,
            sock,
        })
    }

    /// Nanoseconds since the transport started (the connections' clock).
    pub fn now(&self) -> u64 {
        self.st.now()
    }

    /// The addresses peers reach this endpoint at, preferred first.
    pub fn advertised(&self) -> &[SocketAddr] {
        &self.st.advertised
    }

    /// The interfaces those addresses are on.
    pub fn interfaces(&self) -> &[crate::sys::Iface] {
        &self.st.ifaces
    }

    /// The socket's bound address (IPv6: it reaches IPv4 peers too).
    pub fn local(&self) -> SocketAddr {
        self.sock.local()
    }

    /// Transport counters.
    pub fn stats(&self) -> UdpStats {
        let g = self.st.gate.stats();
        let r = self.ring.as_ref().map(|r| r.stats()).unwrap_or_default();
        UdpStats {
            fast_grants: g.grants + self.st.stats.own_queue_grants,
            fast_refusals: g.refusals,
            fast_revocations: g.revocations,
            ring_datagrams: r.datagrams,
            ring_malformed: r.malformed,
            ring_full_drops: r.full_drops,
            ring_sent: r.sent,
            ring_notices: r.notices,
            keepalive_rounds: self.keepalive.as_ref().map_or(0, Keepalive::rounds),
            ..self.st.stats
        }
    }

    /// Whether small datagrams are read from a receive ring ([`ring`]), and if not, why
    /// (opens it now if it is wanted and not open yet).
    pub fn ring(&mut self) -> std::result::Result<(), &str> {
        self.open_ring();
        match &self.st.ring_off {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    /// Opens the receive ring if it is wanted and not open yet, and makes every socket
    /// bound to the endpoint's port leave the ring's datagrams to it (the ring first: a
    /// datagram arriving in between reaches both, and the connection drops the
    /// duplicate; the other order would lose it). On any refusal there is no ring, and
    /// the reason is kept.
    fn open_ring(&mut self) {
        if self.ring.is_some() || self.st.ring_off.is_some() {
            return;
        }
        let Some(ip) = ring_ip(self.st.cfg.bind.ip()) else {
            self.st.ring_off = Some("off: the socket is bound to an IPv6 address".into());
            return;
        };
        let local = std::net::SocketAddrV4::new(ip, self.sock.local().port());
        let r = match ring::RxRing::open(local) {
            Ok(r) => r,
            Err(e) => {
                self.st.ring_off = Some(format!("refused by the kernel ({e})"));
                return;
            }
        };
        let prog = ring::socket_filter();
        let raws: Vec<RawFd> = std::iter::once(self.sock.raw())
            .chain((0..self.peers.len()).filter_map(|k| self.peers.sock_mut(k).map(|s| s.raw())))
            .collect();
        for (n, &fd) in raws.iter().enumerate() {
            if let Err(e) = ring::attach_filter(fd, &prog) {
                raws[..n].iter().for_each(|&fd| ring::detach_filter(fd));
                self.st.ring_off = Some(format!("a socket's filter was refused ({e})"));
                return;
            }
        }
        self.peers.leave_to_ring();
        self.ring_new_fd = Some(r.raw());
        self.ring = Some(r);
    }

    /// Whether there is a receive ring.
    pub fn has_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// Whether the last [`UdpTransport::receive`] took datagrams from the ring (only
    /// then can a hole be a socket datagram the ring's overtook).
    pub fn read_ring_last(&self) -> bool {
        self.ring_reads > 0
    }

    /// Tells the transport whether a bulk transfer is coming in: with the receive ring,
    /// the sockets (where bulk fragments arrive) are then read on every pass.
    pub fn expect_bulk(&mut self, yes: bool) {
        self.bulk_expected = yes;
    }

    /// Injected-fault counters (zero when no faults are configured).
    pub fn fault_stats(&self) -> FaultStats {
        self.faults.as_ref().map(|f| f.stats).unwrap_or_default()
    }

    /// True while the transport has peers or connections being set up (the socket needs
    /// polling); false for an endpoint that only talks over shared memory.
    pub fn active(&self) -> bool {
        !self.st.routes.map.is_empty()
            || !self.st.pending.is_empty()
            || !self.st.half_open.is_empty()
            || !self.st.accepted.is_empty()
    }

    /// Starts the keepalive thread if it is wanted and not running: its pings go out
    /// through a duplicate of the main socket, every quarter of the liveness timeout in
    /// which no receive pass was made. A failure to start it is logged, not fatal (the
    /// application must then call in as often as the timeout asks).
    fn start_keepalive(&mut self) {
        if self.keepalive.is_some() || !self.st.cfg.keepalive_thread {
            return;
        }
        let interval = (self.st.cfg.dead_after / 4).max(Duration::from_millis(1));
        match self
            .sock
            .try_clone_std()
            .and_then(|s| Keepalive::start(s, interval))
        {
            Ok(k) => self.keepalive = Some(k),
            Err(e) => {
                tracing::warn!("keepalive thread: {e}");
                self.st.cfg.keepalive_thread = false;
            }
        }
    }

    fn count_uncovered(&mut self) {
        let peers = &self.peers;
        self.uncovered = self
            .st
            .routes
            .map
            .keys()
            .filter(|(d, _)| !peers.has(*d))
            .count();
    }

    /// Every open socket (main, steered, peers'): what the endpoint's epoll set must hold
    /// once the endpoint sleeps.
    pub fn fds(&mut self) -> Vec<RawFd> {
        (0..PEER_SOCK0 + self.peers.len())
            .filter_map(|i| {
                socket(&mut self.sock, &mut self.steer, &mut self.peers, i).map(|s| s.raw())
            })
            .chain(self.ring.as_ref().map(|r| r.raw()))
            .collect()
    }

    /// Sockets the endpoint must add to its epoll set (once; closing one removes it).
    pub fn take_new_fds(&mut self) -> impl Iterator<Item = RawFd> + '_ {
        self.steer
            .take_new_fds()
            .chain(self.peers.take_new_fds())
            .chain(self.ring_new_fd.take())
    }

    /// The main, the steered and the peer sockets' counters together.
    pub fn sock_stats(&self) -> SockStats {
        let mut k = self.sock.stats;
        steer::add_stats(&mut k, &self.steer.stats());
        steer::add_stats(&mut k, &self.peers.stats());
        k
    }

    /// When the fault injector next releases a held-back datagram.
    pub fn next_fault_release(&self) -> Option<u64> {
        self.faults.as_ref().and_then(Faults::next_release)
    }

    /// Sends everything queued: to a peer with a socket of its own through that socket,
    /// else through the main one.
    pub fn flush(&mut self) {
        let batch = &mut self.st.batch;
        let mut i = 0;
        while i < batch.frames() {
            let dest = batch.frame_dest(i);
            // Bulk fragments always take the sockets: the kernel fills in their UDP
            // checksum, which an unhashed payload relies on (the packet socket's is 0).
            let lone = batch
                .lone_datagram(i, 1)
                .filter(|d| d.len() <= ring::SEND_MAX && !is_bulk(d));
            // (The ring is IPv4's: it knows IPv4 peers only.)
            if let (Some(ring), Some(d), SocketAddr::V4(dest)) = (self.ring.as_mut(), lone, dest) {
                if let Some(k) = self.hops.iter().position(|(a, _)| *a == dest) {
                    match ring.send(&self.hops[k].1, dest, d) {
                        Ok(()) => {
                            i += 1;
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            // A full send buffer: dropped, as a full socket's would be
                            // (the connection resends it).
                            self.sock.stats.send_drops += 1;
                            i += 1;
                            continue;
                        }
                        Err(e) => {
                            // The interface is gone, say (or the kernel is short of
                            // buffers): forget the address, take the socket.
                            tracing::debug!("packet socket send to {dest}: {e}");
                            self.hops.swap_remove(k);
                        }
                    }
                }
            }
            let own = self.peers.index_of(dest);
            let (sock, connected) = match own.and_then(|k| self.peers.sock_mut(k)) {
                Some(s) => (s, true),
                None => (&mut self.sock, false),
            };
            i = sock.send_run(batch, i, connected);
        }
        batch.clear();
    }
}

/// An idle receive reads the clock once per this many calls (timers are due in tens of
/// microseconds at the soonest; a busy-poll pass takes under one).
pub const CLOCK_EVERY: u32 = 8;

/// With the receive ring, an idle pass (a load of one frame's status) costs a few
/// nanoseconds, so the clock is read once per this many.
pub const RING_CLOCK_EVERY: u32 = 64;

/// With the receive ring, an idle pass reads the sockets once per this many calls (they
/// then hold bulk fragments, which are read on every pass while a transfer is expected,
/// GSO runs of a few datagrams, handshakes and strays). A pass that reads only the ring
/// is a few loads, a socket read a system call: at 64, a `perf` profile of a busy
/// ping-pong put the `recvfrom` path at 12-15% of all samples against 19% for the ring
/// passes themselves, and a ring datagram landing during a socket read waited for it.
pub const RING_SOCK_EVERY: u32 = 256;

/// With the receive ring and nothing that has the sockets read on every pass, the main
/// socket (handshakes of new peers, strays, the datagrams of peers without a socket of
/// their own) is read on one socket read in four. While the sockets are read on every
/// pass (a bulk transfer coming in, say), it keeps [`peers::MAIN_EVERY`], as without the
/// ring: counted in those slower passes, one in 1 024 left strays unread through a whole
/// short transfer (`clink bench --spec --quick` counted none of 34 dropped).
pub const RING_MAIN_EVERY: u32 = 4 * RING_SOCK_EVERY;

/// Passes that read every socket after a notice from the ring, until one brings
/// something.
pub const NOTICE_PASSES: u32 = 64;

/// Frames one pass takes from the ring at most.
const RING_BATCH: usize = 64;

/// Most peers whose link-layer address is kept ([`UdpTransport::flush`] sends to the
/// others through the sockets).
const MAX_LINKS: usize = 64;

/// The number of the first peer socket (see [`socket`]).
const PEER_SOCK0: usize = 1 + steer::SOCKETS;

/// Whether socket `i` (see [`socket`]) is a steered one.
fn is_steered(i: usize) -> bool {
    (1..PEER_SOCK0).contains(&i)
}

/// Socket `i` of a transport: 0 the main one, 1..=[`steer::SOCKETS`] the steered ones (if
/// open), then the peer sockets.
fn socket<'a>(
    main: &'a mut UdpSock,
    steer: &'a mut Steering,
    peers: &'a mut PeerSocks,
    i: usize,
) -> Option<&'a mut UdpSock> {
    match i {
        0 => Some(main),
        _ if i < PEER_SOCK0 => steer.sock_mut(i - 1),
        _ => peers.sock_mut(i - PEER_SOCK0),
    }
}

/// The address the receive ring reads frames to for a socket bound to `bind`, if any: it
/// reads IPv4 frames, those to the bound IPv4 address, or to any when the socket is bound
/// to all interfaces (of one family or both).
fn ring_ip(bind: std::net::IpAddr) -> Option<Ipv4Addr> {
    match bind {
        std::net::IpAddr::V4(ip) => Some(ip),
        ip if ip.is_unspecified() => Some(Ipv4Addr::UNSPECIFIED),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
