//! The UDP transport: endpoints on different hosts (here: network namespaces).
//!
//! One socket per endpoint ([`sock::UdpSock`]) carries every peer's datagrams; each peer is
//! a [`UdpLink`] holding the sans-IO reliable connection ([`clink_proto::reliable::Conn`]:
//! sequencing, SACK/NAK, retransmission, credits, congestion window, fragmentation). The
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

pub mod bulk;
pub mod faults;
pub mod keepalive;
pub mod peers;
pub mod ring;
pub mod sock;
pub mod steer;

use crate::error::{io_err, Result};
use crate::transport::FrameQueue;
use clink_proto::admission::{Decision, Gate, GateConfig, Mode};
use clink_proto::reliable::packet::{
    bulk_claim, is_bulk, is_handshake, peek_conn, BULK_HEADER, DATA_HEADER, TRAILER,
};
use clink_proto::reliable::{self, Admit, BulkHeader, Conn, Datagram, Event, Handshake, SendError};
use clink_proto::spec::{self, Check, Confidence, Displaced, Layout, Move, Segment};
use clink_proto::wire::Frame;
use keepalive::Keepalive;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

pub use bulk::{Arm, Bulk, BulkStats};
pub use faults::{FaultConfig, FaultStats, Faults};
pub use peers::PeerSocks;
pub use sock::{IoVec, SockStats, TxBatch, UdpSock};
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
/// How often a hello is repeated while connecting.
const HELLO_EVERY: Duration = Duration::from_millis(100);

/// The largest message payload per datagram for a path MTU.
pub fn mtu_payload(mtu: usize) -> usize {
    (mtu.saturating_sub(IP_UDP_HEADERS)).min(sock::MAX_UDP_PAYLOAD) - DATA_HEADER - TRAILER
}

/// Datagrams copied out of a read to be handled after it (a speculative read's misses,
/// injected faults): one buffer reused from read to read, not an allocation each.
#[derive(Default)]
struct Gathered {
    bytes: Vec<u8>,
    /// (source, end in `bytes`), in arrival order.
    items: Vec<(SocketAddrV4, usize)>,
}

impl Gathered {
    fn push(&mut self, src: SocketAddrV4, d: &[u8]) {
        self.bytes.extend_from_slice(d);
        self.items.push((src, self.bytes.len()));
    }

    /// Ends the datagram appended to `bytes` since the last one.
    fn close(&mut self, src: SocketAddrV4) {
        self.items.push((src, self.bytes.len()));
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }
}

/// Appends bytes `start..start + len` of an armed entry's logical stream (its leading
/// vectors, then its slot) to `out`: the copy a miss costs.
fn gather(out: &mut Vec<u8>, lead: &[IoVec], slot: &[u8], start: usize, len: usize) {
    let mut at = 0usize; // logical start of the current piece
    let end = start + len;
    for v in lead {
        let (a, b) = (at.max(start), (at + v.len).min(end));
        if a < b {
            // SAFETY: inside a vector the kernel just wrote (header slot or destination
            // range, valid per the receive's contract).
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(v.ptr.add(a - at), b - a) });
        }
        at += v.len;
    }
    if end > at {
        let (a, b) = (start.max(at) - at, (end - at).min(slot.len()));
        if a < b {
            out.extend_from_slice(&slot[a..b]);
        }
    }
}

/// Fragments per bulk group for a payload size: as many full datagrams as one GSO send
/// carries (so one group is one send and, with GRO, one read).
pub fn bulk_group(mtu_payload: usize) -> u64 {
    (sock::MAX_UDP_PAYLOAD / (mtu_payload + BULK_HEADER)).clamp(1, sock::MAX_GSO_SEGMENTS) as u64
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
    pub bind: SocketAddrV4,
    /// Path MTU; `None`: the MTU of the interface holding the advertised address.
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
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            bind: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
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
    /// Keepalive rounds the keepalive thread sent while the application was away.
    pub keepalive_rounds: u64,
    /// Fast-stream requests granted at once because the peer has a receive socket of
    /// its own (outside the gate).
    pub own_queue_grants: u64,
}

/// The grant id of a stream granted outside the gate (a peer with a socket of its own):
/// the last the gate would reach (after 4 billion grants), so a release of it does not
/// match one of the gate's.
const OWN_QUEUE_GRANT: u32 = u32::MAX;

/// One peer over UDP: its reliable connection and the frames it delivered.
pub struct UdpLink {
    /// The reliable connection.
    pub conn: Conn,
    /// Where the peer's datagrams go.
    pub dest: SocketAddrV4,
    /// The peer's endpoint id.
    pub remote_id: u128,
    /// Bulk transfers in progress.
    pub bulk: Bulk,
    /// Frames delivered and not yet released (beyond its bound the connection's own
    /// receive budget, and so the sender's credit, takes over).
    pub rxq: FrameQueue,
    /// The peer's admission requests (true) and releases (false, with the grant) not
    /// yet taken to the gate.
    admit_in: Vec<(bool, u32)>,
    /// The latest answer to this side's own request (granted or not), for
    /// [`crate::Endpoint::request_fast`].
    pub fast_answer: Option<bool>,
    /// Its grant was revoked: a Fast_NAck is repeated while its bulk keeps coming.
    revoked: bool,
    last_nack: u64,
    /// Bulk fragments received so far (to see the stream's activity), and how many of
    /// them were speculation hits.
    bulk_seen: u64,
    hits_seen: u64,
}

impl UdpLink {
    fn new(conn: Conn, dest: SocketAddrV4, remote_id: u128) -> UdpLink {
        UdpLink {
            conn,
            dest,
            remote_id,
            bulk: Bulk::default(),
            rxq: FrameQueue::default(),
            admit_in: Vec::new(),
            fast_answer: None,
            revoked: false,
            last_nack: 0,
            bulk_seen: 0,
            hits_seen: 0,
        }
    }

    /// Feeds what a receive got for this link to its connection; bulk fragments go to
    /// their destination.
    pub fn handle(&mut self, now: u64, got: Got<'_>) {
        // Errors are counted by the connection (corrupt, malformed, stray).
        match got {
            Got::Datagram(d) => {
                let bulk = &mut self.bulk;
                let _ = self
                    .conn
                    .handle_datagram_with(now, d, &mut |h, p| bulk.place(h, p));
            }
            Got::Placed(h, wire_len) => {
                if self.conn.accept_placed(now, &h, wire_len) == Ok(true) {
                    self.bulk.placed(&h, wire_len - BULK_HEADER);
                }
            }
            Got::Moved(h, wire_len) => {
                if self.conn.accept_placed(now, &h, wire_len) == Ok(true) {
                    self.bulk.moved(&h, wire_len - BULK_HEADER);
                }
            }
        }
    }

    /// Starts sending `len` bytes at `ptr` as bulk transfer `xfer` (the receiver's clear to
    /// send named it); false when the connection is dead.
    ///
    /// # Safety
    /// As [`Bulk::add_source`].
    pub unsafe fn send_bulk(&mut self, xfer: u64, ptr: *const u8, len: usize) -> bool {
        if self.conn.send_bulk(xfer, len as u64).is_err() {
            return false;
        }
        // SAFETY: forwarded contract.
        unsafe { self.bulk.add_source(xfer, ptr, len) };
        true
    }

    /// Expects bulk transfer `xfer` of `total` bytes into `ptr` (`cap` bytes).
    ///
    /// # Safety
    /// As [`Bulk::add_dest`].
    pub unsafe fn expect_bulk(&mut self, xfer: u64, total: u64, ptr: *mut u8, cap: u64) {
        let frag = self.conn.config().mtu_payload;
        // SAFETY: forwarded contract.
        unsafe { self.bulk.add_dest(xfer, total, ptr, cap, frag) };
    }

    /// Queues one frame on the connection (copied once, straight from the frame);
    /// false when the connection's send buffer is full (retry after progress).
    pub fn try_send(&mut self, f: &Frame) -> bool {
        match self.conn.send_with(0, f.encoded_len(), |b| {
            f.encode(b);
        }) {
            Ok(_) => true,
            Err(SendError::BufferFull) => false,
            // A dead connection reports itself through its event; a frame too large is a
            // caller bug the endpoint prevents (chunks are bounded). Either way the frame is
            // not sent; pretend it left so nothing waits on a queue that cannot drain.
            Err(e) => {
                tracing::debug!("UDP link refused a frame: {e}");
                true
            }
        }
    }

    /// Runs the connection's timers that are due at `now` (a receive's clock reading),
    /// then [`UdpLink::take_events`]. Returns true when the peer was declared dead.
    pub fn tick(&mut self, now: u64) -> bool {
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        self.take_events()
    }

    /// Releases the frame at the head of [`UdpLink::rxq`], its buffer back to the
    /// connection for reuse.
    pub fn release(&mut self) {
        if let Some(buf) = self.rxq.release() {
            self.conn.recycle(buf);
        }
    }

    /// Moves delivered messages from the connection into the frame queue while it has
    /// room (beyond that the connection's receive budget shrinks the sender's credit).
    /// Returns true when the connection declared the peer dead.
    pub fn take_events(&mut self) -> bool {
        let mut dead = false;
        while !self.rxq.full() {
            match self.conn.poll_event() {
                Some(Event::Message { data, .. }) => self.rxq.push(data),
                Some(Event::Acked(_)) => {}
                Some(Event::BulkSent(x)) => self.bulk.sent(x),
                Some(Event::PeerDead) => dead = true,
                Some(Event::FastRequest) => self.admit_in.push((true, 0)),
                Some(Event::FastRelease { grant }) => self.admit_in.push((false, grant)),
                Some(Event::Fast { granted }) => self.fast_answer = Some(granted),
                None => break,
            }
        }
        dead
    }

    /// Appends the connection's datagrams to `batch`. Bulk fragments of a stream the peer
    /// steered to a socket of its own go to that port.
    pub fn transmit(&mut self, now: u64, batch: &mut TxBatch) {
        let dest = self.dest;
        let bulk = &self.bulk;
        let conn = &mut self.conn;
        // SAFETY: bulk payloads are the sources' bytes, kept until their transfer is over
        // (acknowledged, seen by `take_events`) or the link is cleared, neither of which
        // happens before the transport sends the batch (`UdpTransport::flush`).
        while unsafe {
            batch.push_grouped(|buf| {
                let t = conn.poll_transmit_with(now, buf, &mut |x, o, n| bulk.source(x, o, n))?;
                let to = match conn.steered_port() {
                    Some(port) if t.bulk => SocketAddrV4::new(*dest.ip(), port),
                    _ => dest,
                };
                Some((t.len, t.payload, t.group_start, to))
            })
        } {}
    }

    /// Sends the gate's answer (Fast_Ack or Fast_NAck) to the peer; `revoked`: it takes a
    /// grant back (repeated while the peer's bulk keeps coming).
    pub fn answer_admit(&mut self, answer: Admit, revoked: bool) {
        self.revoked = revoked;
        self.conn.answer_admit(answer);
    }

    /// Moves the peer's admission requests and releases to `gate` (under route `idx`), and
    /// notes its bulk stream's activity: the holder's keeps its grant, a revoked sender's
    /// gets its Fast_NAck again (at most once per millisecond: the first may be lost).
    /// `own`: the peer's datagrams reach a socket of its own (a receive queue no other
    /// stream shares), so its stream cannot disturb another's speculative layout, nor
    /// another its: it is granted at once, outside the gate, which arbitrates only the
    /// streams that share the main socket. (Held to the slow window, seven streams
    /// into one receiver of an all-to-all moved a third as fast as over TCP.)
    fn admit(
        &mut self,
        now: u64,
        idx: usize,
        own: bool,
        gate: &mut Gate<usize>,
        out: &mut Vec<Decision<usize>>,
        stats: &mut UdpStats,
    ) {
        for (req, grant) in self.admit_in.drain(..) {
            self.revoked = false;
            if own {
                if req {
                    stats.own_queue_grants += 1;
                    self.conn.answer_admit(Admit::Ack {
                        grant: OWN_QUEUE_GRANT,
                        port: 0,
                    });
                }
            } else if req {
                gate.request(now, idx, out);
            } else {
                gate.release(now, idx, grant, out);
            }
        }
        let seen = self.conn.bulk_received();
        if seen != self.bulk_seen {
            let hits = self.bulk.stats.hits;
            let (new, new_hits) = (seen - self.bulk_seen, hits - self.hits_seen);
            (self.bulk_seen, self.hits_seen) = (seen, hits);
            if gate.holder().is_some_and(|h| h.peer == idx) {
                gate.active(now, idx);
                stats.granted_fragments += new;
                stats.granted_hits += new_hits;
            } else if self.revoked && now >= self.last_nack + 1_000_000 {
                self.last_nack = now;
                self.conn.answer_admit(Admit::NAck);
            }
        }
    }
}

/// An outgoing connection waiting for its welcome.
struct Pending {
    dest: SocketAddrV4,
    conn: u32,
    remote_id: u128,
    last_hello: Instant,
    /// The peer's welcome, once it came.
    welcomed: Option<Handshake>,
}

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
    faults: Option<Faults>,
    /// Whether speculation pays for the armed stream.
    confidence: Confidence,
    /// The receive ring of the small datagrams, once opened ([`ring`]).
    ring: Option<ring::RxRing>,
    /// Why there is no ring and will be none (for `clink info`); `None` while it may
    /// still be opened.
    ring_off: Option<String>,
    /// The ring's descriptor, for the endpoint's epoll set, until it takes it.
    ring_new_fd: Option<RawFd>,
    /// With the ring: the last pass's socket reads brought something, so the next pass
    /// reads the sockets again (else they are read every [`RING_SOCK_EVERY`]th pass).
    sock_hot: bool,
    /// With the ring: a bulk transfer is coming in, so every pass reads the sockets.
    bulk_expected: bool,
    /// Datagrams the last [`UdpTransport::receive`] took from the ring.
    ring_reads: usize,
    /// With the ring: where each peer's datagrams came from, one hop away (learned from
    /// the ring's frames of datagrams that reached a link): lone datagrams to it are sent
    /// through the packet socket.
    links: Vec<(SocketAddrV4, ring::LinkAddr)>,
    /// The keepalive thread, started with the first peer ([`keepalive`]).
    keepalive: Option<Keepalive>,
    /// ICMP errors read from the sockets, not yet taken by the endpoint.
    unreachable: Vec<sock::Unreachable>,
    st: State,
}

/// The links' routes: (source address, connection id) to the endpoint's peer index.
#[derive(Default)]
struct Routes {
    map: HashMap<(SocketAddrV4, u32), usize>,
    /// The last route found: a stream's datagrams skip the hashing (SipHash, keyed
    /// against forged sources) that was 2% of a 64-byte hop's user time.
    last: std::cell::Cell<Option<((SocketAddrV4, u32), usize)>>,
}

impl Routes {
    fn get(&self, key: (SocketAddrV4, u32)) -> Option<usize> {
        if let Some((k, i)) = self.last.get().filter(|(k, _)| *k == key) {
            debug_assert_eq!(self.map.get(&k), Some(&i));
            return Some(i);
        }
        let i = *self.map.get(&key)?;
        self.last.set(Some((key, i)));
        Some(i)
    }

    fn insert(&mut self, key: (SocketAddrV4, u32), i: usize) {
        self.last.set(None);
        self.map.insert(key, i);
    }

    fn remove(&mut self, key: (SocketAddrV4, u32)) -> Option<usize> {
        self.last.set(None);
        self.map.remove(&key)
    }
}

/// Everything but the socket (so a receive can borrow both at once).
struct State {
    cfg: UdpConfig,
    advertised: SocketAddrV4,
    mtu: usize,
    my_id: u128,
    batch: TxBatch,
    routes: Routes,
    pending: Vec<Pending>,
    accepted: Vec<UdpLink>,
    /// The monotonic clock's reading when the transport started, ns.
    epoch: u64,
    /// The clock's last reading ([`State::now`]): never behind any reading handed out.
    last_now: std::cell::Cell<u64>,
    stats: UdpStats,
    /// Header slots of the speculative layouts: [`sock::MAX_GSO_SEGMENTS`] per entry.
    hdr_slots: Vec<[u8; BULK_HEADER]>,
    /// The receive vectors of the armed entries.
    lead: Vec<Vec<IoVec>>,
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

/// A fragment a speculative read left in another's place.
struct Misplaced {
    /// Where it landed and where it belongs.
    d: Displaced,
    /// Its verified header.
    h: BulkHeader,
    /// Its length on the wire.
    wire: usize,
    /// Where the read put it, to gather it instead: receive entry, and start in the
    /// entry's vectors.
    entry: usize,
    start: usize,
}

/// A speculative layout in force.
struct Armed {
    /// (route index of the link, the link's bulk generation when planned).
    key: (usize, u64),
    /// The link's address: only its datagrams can be hits.
    src: SocketAddrV4,
    arm: Arm,
    /// Per armed entry, how a read into its vectors splits (made once per arming).
    layouts: Vec<Layout>,
}

impl State {
    fn now(&self) -> u64 {
        let t = crate::sys::monotonic_ns().saturating_sub(self.epoch);
        self.last_now.set(t);
        t
    }

    /// The configuration of a connection with the peer whose handshake is `peer`.
    fn conn_config(&self, conn_id: u32, peer: &Handshake) -> reliable::Config {
        let mine = mtu_payload(self.mtu);
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
            bulk_group: bulk_group(mtu_payload),
            bulk_misorder: self.cfg.force_miss,
            payload_hash: self.cfg.payload_hash || peer.payload_hash,
            admission: clink_proto::admission::AskerConfig {
                mode: self.cfg.admission,
                ..Default::default()
            },
            // One ack per 16 packets or per delay keeps them cheap in bulk transfers; in a
            // ping-pong they ride on the answers (piggybacked).
            ack_every: 16,
            ..reliable::Config::default()
        }
    }

    fn handshake(&self, to: u128) -> Handshake {
        Handshake {
            from: self.my_id,
            to,
            mtu_payload: mtu_payload(self.mtu) as u32,
            payload_hash: self.cfg.payload_hash,
        }
    }

    fn send_handshake(&mut self, dest: SocketAddrV4, d: Datagram) {
        self.batch.push(dest, |buf| d.encode(buf));
    }

    /// Routes one received datagram: to its link, or to connection set-up. True when it
    /// went to a link.
    fn dispatch(
        &mut self,
        to_link: &mut impl FnMut(usize, &[u8]),
        src: SocketAddrV4,
        d: &[u8],
    ) -> bool {
        if is_handshake(d) {
            match Datagram::parse(d) {
                Ok(Datagram::Hello { conn, hs }) if hs.to == self.my_id => {
                    self.on_hello(src, conn, hs)
                }
                Ok(Datagram::Welcome { conn, hs }) if hs.to == self.my_id => {
                    if let Some(p) = self
                        .pending
                        .iter_mut()
                        .find(|p| p.dest == src && p.conn == conn)
                    {
                        p.welcomed = Some(hs);
                    }
                }
                _ => self.stats.bad_handshakes += 1,
            }
            return false;
        }
        match peek_conn(d).and_then(|c| self.routes.get((src, c))) {
            Some(i) => {
                to_link(i, d);
                true
            }
            None => {
                self.stats.stray += 1;
                false
            }
        }
    }

    fn on_hello(&mut self, src: SocketAddrV4, conn: u32, hs: Handshake) {
        // A repeated hello (our welcome was lost) is answered again; a new one makes a link.
        let known = self.routes.get((src, conn)).is_some()
            || self
                .accepted
                .iter()
                .any(|l| l.dest == src && l.conn.config().conn_id == conn);
        if !known {
            let c = Conn::new(self.conn_config(conn, &hs), self.now());
            self.accepted.push(UdpLink::new(c, src, hs.from));
        }
        let hs = self.handshake(hs.from);
        self.send_handshake(src, Datagram::Welcome { conn, hs });
    }
}

impl UdpTransport {
    /// Binds the socket and works out the address to advertise and the path MTU.
    pub fn new(cfg: UdpConfig, my_id: u128) -> Result<UdpTransport> {
        let sock = if cfg.peer_sockets > 0 {
            UdpSock::bind_shared(cfg.bind, cfg.sock_buf)
        } else {
            UdpSock::bind(cfg.bind, cfg.sock_buf)
        }
        .map_err(io_err(format!("bind UDP {}", cfg.bind)))?;
        let (ip, if_mtu) = if cfg.bind.ip().is_unspecified() {
            let (i, _) = crate::netdev::choose(&crate::sys::ipv4_interfaces(), &cfg.devices)
                .map_err(crate::Error::Config)?;
            (i.ip, i.mtu)
        } else {
            let ip = *cfg.bind.ip();
            (ip, crate::sys::ipv4_mtu(ip).unwrap_or(1500))
        };
        let mtu = cfg.mtu.unwrap_or(if_mtu).clamp(576, 65536);
        let batch = TxBatch::new(sock.gso());
        let steer = Steering::new(cfg.steer, cfg.bind, cfg.sock_buf);
        // The ring is opened with the first UDP peer ([`UdpTransport::open_ring`]): an
        // endpoint that never talks UDP adds no packet tap to every IP packet's path.
        let ring_off = (!cfg.ring).then(|| "off (CLINK_UDP_RING=0)".to_string());
        let peers = PeerSocks::new(cfg.peer_sockets, sock.local(), cfg.sock_buf, false);
        Ok(UdpTransport {
            peers,
            ring: None,
            ring_off,
            ring_new_fd: None,
            sock_hot: false,
            bulk_expected: false,
            ring_reads: 0,
            links: Vec::new(),
            keepalive: None,
            unreachable: Vec::new(),
            passes: 0,
            read_fresh: false,
            uncovered: 0,
            faults: cfg.faults.active().then(|| Faults::new(cfg.faults.clone())),
            confidence: Confidence::default(),
            st: State {
                advertised: SocketAddrV4::new(ip, sock.local().port()),
                mtu,
                cfg,
                my_id,
                batch,
                routes: Routes::default(),
                pending: Vec::new(),
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

    /// The address peers reach this endpoint at.
    pub fn advertised(&self) -> SocketAddrV4 {
        self.st.advertised
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
            keepalive_rounds: self.keepalive.as_ref().map_or(0, Keepalive::rounds),
            ..self.st.stats
        }
    }

    /// Whether small datagrams are read from a receive ring ([`ring`]), and if not, why
    /// (opens it now if it is wanted and not open yet).
    pub fn ring(&mut self) -> std::result::Result<(), &str> {
        self.open_ring();
        match &self.ring_off {
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
        if self.ring.is_some() || self.ring_off.is_some() {
            return;
        }
        let local = SocketAddrV4::new(*self.st.cfg.bind.ip(), self.sock.local().port());
        let r = match ring::RxRing::open(local) {
            Ok(r) => r,
            Err(e) => {
                self.ring_off = Some(format!("refused by the kernel ({e})"));
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
                self.ring_off = Some(format!("a socket's filter was refused ({e})"));
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

    /// Starts connecting to the endpoint `remote_id` at `dest`; returns a token for
    /// [`UdpTransport::connected`].
    pub fn start_connect(&mut self, dest: SocketAddrV4, remote_id: u128) -> Result<u32> {
        let conn = loop {
            let c = (crate::sys::random_u128().map_err(io_err("random connection id"))? as u32) | 1;
            if self.st.routes.get((dest, c)).is_none()
                && self.st.pending.iter().all(|p| p.conn != c)
            {
                break c;
            }
        };
        self.st.pending.push(Pending {
            dest,
            conn,
            remote_id,
            last_hello: Instant::now(),
            welcomed: None,
        });
        let hs = self.st.handshake(remote_id);
        self.st.send_handshake(dest, Datagram::Hello { conn, hs });
        self.flush();
        Ok(conn)
    }

    /// The link of a connection started with [`UdpTransport::start_connect`] once its
    /// welcome arrived (repeats the hello meanwhile); `None` while waiting.
    pub fn connected(&mut self, token: u32) -> Option<UdpLink> {
        let i = self.st.pending.iter().position(|p| p.conn == token)?;
        let p = &mut self.st.pending[i];
        if let Some(hs) = p.welcomed {
            let p = self.st.pending.swap_remove(i);
            let conn = Conn::new(self.st.conn_config(p.conn, &hs), self.now());
            return Some(UdpLink::new(conn, p.dest, p.remote_id));
        }
        if p.last_hello.elapsed() >= HELLO_EVERY {
            p.last_hello = Instant::now();
            let (dest, conn, to) = (p.dest, p.conn, p.remote_id);
            let hs = self.st.handshake(to);
            self.st.send_handshake(dest, Datagram::Hello { conn, hs });
            self.flush();
        }
        None
    }

    /// True while the transport has peers or connections being set up (the socket needs
    /// polling); false for an endpoint that only talks over shared memory.
    pub fn active(&self) -> bool {
        !self.st.routes.map.is_empty()
            || !self.st.pending.is_empty()
            || !self.st.accepted.is_empty()
    }

    /// Gives up a connection attempt.
    pub fn abandon(&mut self, token: u32) {
        self.st.pending.retain(|p| p.conn != token);
    }

    /// Makes `link` (a new peer at index `idx` of the endpoint) reachable by its
    /// datagrams, on a connected socket of its own while there are fewer than
    /// [`UdpConfig::peer_sockets`].
    pub fn route(&mut self, link: &UdpLink, idx: usize) {
        let conn = link.conn.config().conn_id;
        self.st.routes.insert((link.dest, conn), idx);
        self.start_keepalive();
        if let Some(k) = &self.keepalive {
            k.add(link.dest, conn);
        }
        self.open_ring();
        if self.peers.open(link.dest) {
            // Its datagrams move to the new socket: a layout for it must move too.
            self.disarm();
        }
        self.count_uncovered();
    }

    /// Forgets a peer's route (it failed or closed); its datagrams become stray, its
    /// fast-stream grant passes on, its socket (when no other link goes to its address)
    /// closes.
    pub fn unroute(&mut self, link: &UdpLink) {
        let conn = link.conn.config().conn_id;
        if let Some(k) = &self.keepalive {
            k.remove(link.dest, conn);
        }
        let st = &mut self.st;
        if let Some(i) = st.routes.remove((link.dest, conn)) {
            let now = st.now();
            st.gate.forget(now, i, &mut st.decisions);
        }
        let shared = st.routes.map.keys().any(|(d, _)| *d == link.dest);
        if !shared {
            self.links.retain(|(a, _)| *a != link.dest);
        }
        if !shared && self.peers.close(link.dest) {
            // Sockets after it moved down one index.
            self.disarm();
        }
        self.count_uncovered();
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

    /// The peer (route index) holding the fast-stream grant, if any.
    pub fn fast_holder(&self) -> Option<usize> {
        self.st.gate.holder().map(|h| h.peer)
    }

    /// Admission control for the link routed under `idx`: its requests and releases to
    /// the gate, its bulk stream's activity (nothing to do with admission control off).
    pub fn admit(&mut self, now: u64, idx: usize, link: &mut UdpLink) {
        let own = self.peers.has(link.dest);
        let st = &mut self.st;
        if st.cfg.admission != Mode::Off {
            link.admit(
                now,
                idx,
                own,
                &mut st.gate,
                &mut st.decisions,
                &mut st.stats,
            );
        }
    }

    /// After [`UdpTransport::admit`] for every link: runs the gate's timer and hands its
    /// decisions to `answer` as (route index, answer, whether it revokes a grant). A grant
    /// steers the stream to the steered socket when flow steering is on (its port goes in
    /// the Fast_Ack).
    pub fn admit_decisions(&mut self, now: u64, mut answer: impl FnMut(usize, Admit, bool)) {
        if self.st.gate.poll_timeout().is_some_and(|t| t <= now) {
            let st = &mut self.st;
            st.gate.handle_timeout(now, &mut st.decisions);
        }
        let mut decisions = std::mem::take(&mut self.st.decisions);
        for d in decisions.drain(..) {
            match d {
                Decision::Grant { peer, grant } => {
                    let port = self.steer_to(peer).unwrap_or(0);
                    answer(peer, Admit::Ack { grant, port }, false)
                }
                Decision::Refuse { peer } => answer(peer, Admit::NAck, false),
                Decision::Revoke { peer } => answer(peer, Admit::NAck, true),
            }
        }
        self.st.decisions = decisions;
        // A new holder (or none) may move the layout between the sockets: plan afresh.
        let holder = self.st.gate.holder().map(|h| h.peer);
        if holder != self.st.last_holder {
            self.st.last_holder = holder;
            self.disarm();
        }
        if self.steer.idle_close_due(now, holder.is_some()) {
            self.disarm();
            self.steer.close();
        }
    }

    /// Steers `peer`'s granted stream to a socket of its own: its port, or `None`.
    fn steer_to(&mut self, peer: usize) -> Option<u16> {
        let dest = self
            .st
            .routes
            .map
            .iter()
            .find(|(_, &i)| i == peer)
            .map(|(k, _)| k.0)?;
        self.steer.steer(peer, dest)
    }

    /// Turns flow steering and peer sockets off and closes their sockets (the endpoint
    /// could not watch them): grants from now on carry no port, every peer's datagrams
    /// reach the main socket.
    pub fn stop_extra_sockets(&mut self) {
        self.disarm();
        self.steer.close();
        self.steer.turn_off();
        self.peers.close_all();
        self.count_uncovered();
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

    /// Drops the speculative layout (the endpoint plans a new one before the next read).
    fn disarm(&mut self) {
        self.set_arm(None, None);
    }

    /// When the admission gate's timer runs out (an idle holder, a rotation).
    pub fn admit_timeout(&self) -> Option<u64> {
        self.st.gate.poll_timeout()
    }

    /// Links of peers that connected to us since the last call.
    pub fn take_accepted(&mut self) -> Vec<UdpLink> {
        std::mem::take(&mut self.st.accepted)
    }

    /// Fragments per receive entry a speculative layout arms: one GSO group when the
    /// kernel coalesces reads, else one datagram.
    pub fn rx_group(&self, mtu_payload: usize) -> u64 {
        if self.sock.gro() {
            bulk_group(mtu_payload)
        } else {
            1
        }
    }

    /// True when the next bulk read may be speculative: speculation is on and has not
    /// been turned off for a while because the armed stream's fragments mostly missed
    /// ([`Confidence`]; the endpoint then arms nothing, and re-plans when it may again).
    pub fn speculate(&self) -> bool {
        self.st.cfg.speculate && self.confidence.speculate()
    }

    /// The key (route index, the link's bulk generation) of the last [`UdpTransport::set_arm`],
    /// whether it armed a layout or found nothing to arm.
    pub fn planned_key(&self) -> Option<(usize, u64)> {
        self.st.planned
    }

    /// Arms (or, with `None`, disarms) the speculative layout `arm` for the link routed
    /// under `key.0`, whose datagrams come from `src`. Keep the key current: the layout
    /// points into that link's destination buffer, valid only while its bulk generation
    /// (`key.1`) is unchanged.
    pub fn set_arm(
        &mut self,
        key: Option<(usize, u64)>,
        armed: Option<((usize, u64), SocketAddrV4, Arm)>,
    ) {
        let st = &mut self.st;
        st.planned = key;
        for lead in st.lead.iter_mut() {
            lead.clear();
        }
        st.armed = armed.map(|(key, src, arm)| {
            // Per armed entry, [header slot, destination + offset] per fragment.
            let max = sock::MAX_GSO_SEGMENTS;
            for (e, frags) in arm.entries.iter().take(sock::RX_SLOTS).enumerate() {
                for (k, &(off, len)) in frags.iter().take(max).enumerate() {
                    st.lead[e].push(IoVec {
                        ptr: st.hdr_slots[e * max + k].as_mut_ptr(),
                        len: BULK_HEADER,
                    });
                    st.lead[e].push(IoVec {
                        // SAFETY: `off + len` lies inside the destination (Bulk::arm arms
                        // only fragments inside it).
                        ptr: unsafe { arm.dest.add(off as usize) },
                        len,
                    });
                }
            }
            let layouts = arm
                .entries
                .iter()
                .map(|frags| Layout {
                    payloads: frags.iter().take(max).map(|f| f.1).collect(),
                    spill: sock::RX_SLOT,
                })
                .collect();
            Armed {
                key,
                src,
                arm,
                layouts,
            }
        });
        // The layout goes on the socket the stream arrives on: the holder's steered one,
        // else its peer's own one, else the main one. The others get none.
        let holder = st.gate.holder().map(|h| h.peer);
        st.armed_on = st.armed.as_ref().map_or(0, |a| {
            let steered = self
                .steer
                .socket_of(a.key.0)
                .filter(|_| Some(a.key.0) == holder);
            match (steered, self.peers.index_of(a.src)) {
                (Some(i), _) => 1 + i,
                (None, Some(k)) => PEER_SOCK0 + k,
                (None, None) => 0,
            }
        });
        for i in 0..PEER_SOCK0 + self.peers.len() {
            let lead: &[Vec<IoVec>] = if st.armed.is_some() && st.armed_on == i {
                &st.lead
            } else {
                &[]
            };
            let Some(sock) = socket(&mut self.sock, &mut self.steer, &mut self.peers, i) else {
                continue;
            };
            // A layout that arms fewer entries than a read takes (the end of a transfer)
            // caps the reads at those, so the next transfer's first groups stay queued for
            // the read after the re-plan, which arms them, instead of landing in the plain
            // slots and being copied. On a shared socket this holds because the small
            // datagrams (acks, RTSs) queued at a transfer's boundary are read one by one
            // first (`receive`'s head check): without that, one opened the next
            // transfer's first read and every group behind it landed one entry late (a
            // clean stream 77-80% in place, BENCHMARKS.md).
            let cap = !lead.is_empty();
            // SAFETY: header slots are ours; destination ranges are distinct missing
            // fragments of a buffer the Bulk contract keeps valid while the key is
            // current, and the endpoint re-arms (replacing these vectors) before using a
            // changed key.
            unsafe { sock.set_lead(lead, cap) };
        }
    }

    /// Reads what arrived (one batch; `now`: [`UdpTransport::now`], read once per progress
    /// pass) and hands each datagram to `sink` with the index its
    /// link was routed under ([`UdpTransport::route`]); answers hellos and welcomes
    /// itself. With a layout armed ([`UdpTransport::set_arm`]) the read is speculative:
    /// the armed fragments land straight in the destination; verified hits are handed
    /// over as [`Got::Placed`], everything else is gathered (the miss's copy) and takes the
    /// ordinary path. Returns the number of datagrams read.
    ///
    /// With streams steered to sockets of their own every socket is read, the one holding
    /// the layout first: the other's cleanup copies may fill fragments the layout names, so
    /// no speculative read may follow them before the endpoint re-plans. So are the peer
    /// sockets; the main one too when `all` (epoll reported a socket readable), when a
    /// peer has no socket of its own, while connecting, with faults injected (held-back
    /// datagrams are released there), and else every [`peers::MAIN_EVERY`]th call
    /// ([`RING_MAIN_EVERY`]th with the ring, when nothing has the sockets read every pass).
    ///
    /// The clock is read when a datagram is handed over (`sink` gets the reading), the
    /// main socket is (held-back faults) or `all`, and else every [`CLOCK_EVERY`]th call:
    /// an idle busy-poll pass makes no clock reading. [`UdpTransport::read_at`] gives the last.
    pub fn receive(&mut self, all: bool, sink: &mut impl FnMut(usize, Got<'_>, u64)) -> usize {
        let n = self.receive_all(all, sink);
        self.collect_unreachable();
        n
    }

    /// Moves the ICMP errors of every socket that saw one into the list
    /// [`UdpTransport::take_unreachable`] hands out.
    fn collect_unreachable(&mut self) {
        let out = &mut self.unreachable;
        if self.sock.errored {
            self.sock.take_unreachable(out);
        }
        for k in 0..self.peers.len() {
            if let Some(s) = self.peers.sock_mut(k).filter(|s| s.errored) {
                s.take_unreachable(out);
            }
        }
    }

    /// The routes (peer indices) whose peer answered with ICMP destination unreachable
    /// since the last call, with whether its host said "port unreachable" (the process
    /// is gone). Only answers quoting the route's own connection id count: an ICMP
    /// message must name a datagram of that connection to end it.
    pub fn take_unreachable(&mut self) -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        for u in self.unreachable.drain(..) {
            let Some(conn) = u.conn else { continue };
            if let Some(i) = self.st.routes.get((u.dest, conn)) {
                if !out.iter().any(|&(j, _)| j == i) {
                    out.push((i, u.port));
                }
            }
        }
        out
    }

    fn receive_all(&mut self, all: bool, sink: &mut impl FnMut(usize, Got<'_>, u64)) -> usize {
        self.passes = self.passes.wrapping_add(1);
        if let Some(k) = &self.keepalive {
            k.note_pass();
        }
        let every = if self.ring.is_some() {
            RING_CLOCK_EVERY
        } else {
            CLOCK_EVERY
        };
        let mut now = (all || self.passes.is_multiple_of(every)).then(|| self.st.now());
        let from_ring = self.receive_ring(&mut now, sink);
        self.ring_reads = from_ring;
        // The main socket's cadence: one pass in MAIN_EVERY while the sockets are read on
        // every pass (as without the ring), one idle socket read in four with the ring.
        let mut main_every = peers::MAIN_EVERY;
        if self.ring.is_some() {
            let every_pass = all
                || self.sock_hot
                || self.bulk_expected
                || self.st.armed.is_some()
                || self.steer.is_open()
                || !self.st.pending.is_empty()
                || self.faults.is_some();
            if !every_pass {
                main_every = RING_MAIN_EVERY;
            }
            if !every_pass && !self.passes.is_multiple_of(RING_SOCK_EVERY) {
                // Nothing armed (or the sockets would be due), and speculation's backoff
                // counts socket datagrams only: of `finish_receive`, only the clock's
                // freshness is left to note.
                self.read_fresh = now.is_some();
                return from_ring;
            }
        }
        let n = self.receive_sockets(all, main_every, &mut now, sink);
        self.sock_hot = n > 0;
        if n > 0 && self.ring.is_some() {
            // What the sockets just gave may follow ring datagrams that arrived during
            // the reads (the kernel fills both in arrival order): read those too, so a
            // hole the socket's datagrams opened is not taken for a loss.
            let later = self.receive_ring(&mut now, sink);
            self.read_fresh |= later > 0;
            self.ring_reads += later;
            return from_ring + n + later;
        }
        from_ring + n
    }

    /// Reads the receive ring (if any): its datagrams (never bulk fragments) to `sink`,
    /// through the fault injector when one is set.
    fn receive_ring(
        &mut self,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        let st = &mut self.st;
        let links = &mut self.links;
        let Some(f) = self.faults.as_mut() else {
            let n = ring.poll(RING_BATCH, |src, link, d| {
                let t = *now.get_or_insert_with(|| st.now());
                let routed = st.dispatch(&mut |i, d| sink(i, Got::Datagram(d), t), src, d);
                if let Some(link) = link.filter(|_| routed) {
                    learn(links, src, link, d);
                }
            });
            return n;
        };
        let t = *now.get_or_insert_with(|| st.now());
        let mut gathered = std::mem::take(&mut st.gathered);
        gathered.clear();
        // (With faults, where a datagram came from is not learned: the injector may hand
        // it over late, or a corrupted copy.)
        let n = ring.poll(RING_BATCH, |src, _, d| {
            f.apply(t, src, d, &mut |s, d| gathered.push(s, d))
        });
        // Held-back datagrams are released by the main socket's read (every pass while
        // faults are injected): they may be bulk fragments, whose copy into a place the
        // layout still arms must stop the armed read that pass ([`Self::receive_sockets`]).
        let mut from = 0;
        for &(s, end) in &gathered.items {
            let d = &gathered.bytes[from..end];
            st.dispatch(&mut |i, d| sink(i, Got::Datagram(d), t), s, d);
            from = end;
        }
        st.gathered = gathered;
        n
    }

    /// The sockets' part of [`UdpTransport::receive`]; the main socket is read one pass
    /// in `main_every` unless something else makes it due.
    fn receive_sockets(
        &mut self,
        all: bool,
        main_every: u32,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let main = all
            || self.uncovered > 0
            || self.faults.is_some()
            || !self.st.pending.is_empty()
            || self.passes.is_multiple_of(main_every);
        if self.st.armed.is_none() && !main && !self.steer.is_open() {
            let n = self.receive_peers(now, sink);
            self.finish_receive(None, n, now.is_some());
            return n;
        }
        let armed = self.st.armed.take();
        // See [`socket`] for the numbering. The armed one first; then the other steered
        // ones, before the peer sockets and the main one: a previous holder's fast
        // fragments wait there while its newer, slow ones reach the others, and read out
        // of order they would look like losses (NAKs, and the sender's loss detection).
        // They are drained (a few batches at most), not read one batch per pass.
        let first = self.st.armed_on;
        // Except the stream's own peer socket before its steered one: the datagrams it
        // sent slowly before its grant wait there, and read after the fast ones they
        // would look like losses too (every grant of a steered stream cost a burst of
        // NAKs and spurious retransmissions). When that read put a bulk fragment in place
        // (the same `placed` test as the armed socket's one-entry reads), the steered one
        // is left to the next pass: what was just placed may be what the
        // layout arms (holes below the stream's head), and the endpoint re-plans first.
        // (Other datagrams there, the stream's acks and eager messages, hold nothing up.)
        let before = armed
            .as_ref()
            .filter(|_| is_steered(first))
            .and_then(|a| self.peers.index_of(a.src))
            .map(|k| PEER_SOCK0 + k);
        let order = before
            .into_iter()
            .chain(std::iter::once(first))
            .chain((1..PEER_SOCK0 + self.peers.len()).filter(|&i| i != first && Some(i) != before))
            .chain((first != 0).then_some(0));
        let mut n = 0;
        let mut hold_armed = false;
        for i in order {
            if i == 0 && !main || i == first && hold_armed {
                continue;
            }
            let a = if i == first { armed.as_ref() } else { None };
            // An armed socket that other traffic shares looks at its queue's head first:
            // datagrams that are not bulk fragments there (a sender's requests before its
            // next transfer, its acks) would take the armed entries and put every group
            // behind them one entry late, each moved with a copy. So would a fragment the
            // layout does not expect first: a retransmission of the previous transfer or
            // of a hole (at 1% loss whole reads of 266-399 fragments were moved so). Whatever
            // does not claim one of the first entry's fragments is read one entry per
            // call, up to [`HEAD_READS`] of them, before the full read.
            let head_check = a.filter(|_| !is_steered(i)).map(|a| {
                let e = &a.arm.expect;
                move |claim: Option<(u32, u64, u64)>| {
                    claim.is_some_and(|(conn, xfer, off)| {
                        conn == e.conn
                            && xfer == e.xfer
                            && a.arm
                                .entries
                                .first()
                                .is_some_and(|g| g.iter().any(|f| f.0 == off))
                    })
                }
            });
            let batches = if i == 0 || i == first || i >= PEER_SOCK0 {
                1
            } else {
                STRAGGLER_BATCHES
            };
            let (mut head_reads, mut full_reads) = (0, 0);
            while let Some(sock) = socket(&mut self.sock, &mut self.steer, &mut self.peers, i) {
                let alone = head_reads < HEAD_READS
                    && head_check.as_ref().is_some_and(|expected| {
                        let mut head = [0; BULK_HEADER];
                        sock.peek_head(&mut head)
                            .is_some_and(|n| !expected(bulk_claim(&head[..n.min(BULK_HEADER)])))
                    });
                if alone {
                    head_reads += 1;
                } else {
                    full_reads += 1;
                }
                let r = sock.recv_batch_upto(if alone { 1 } else { sock::RX_SLOTS });
                // Whether this read put bulk bytes in a destination (a hit, a move, a
                // fragment copied to its place; with faults, a held-back one released):
                // the layout may still arm that place, so no read of the armed socket
                // follows it before the endpoint re-plans.
                let mut placed = false;
                // The main socket is handed over even when empty: held-back injected
                // faults are released there.
                if r > 0 || i == 0 {
                    let t = *now.get_or_insert_with(|| self.st.now());
                    let got = deliver(
                        sock,
                        &mut self.faults,
                        &mut self.st,
                        t,
                        r,
                        a,
                        &mut |i, g| {
                            placed |= !matches!(g, Got::Datagram(d) if !is_bulk(d));
                            sink(i, g, t)
                        },
                    );
                    if is_steered(i) {
                        self.st.stats.steered_datagrams += got as u64;
                    } else if i >= PEER_SOCK0 {
                        self.st.stats.peer_socket_datagrams += got as u64;
                    }
                    n += got;
                }
                hold_armed |= placed && Some(i) == before;
                let more = if alone {
                    r == 1 && !placed
                } else {
                    r == sock::RX_SLOTS && full_reads < batches
                };
                if !more {
                    break;
                }
            }
        }
        self.finish_receive(armed, n, now.is_some());
        n
    }

    /// The common case of [`UdpTransport::receive`]: nothing armed, no steered socket
    /// open, the main socket not due: one read of each peer's own socket. (Through the
    /// general loop's socket order and per-socket choices a 64-byte ping-pong took about
    /// 440 more user instructions a hop, 4 803 against 4 366 with this path, `valgrind
    /// --tool=callgrind` on `examples/path_cost 20000 udp`.)
    fn receive_peers(
        &mut self,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let mut n = 0;
        for k in 0..self.peers.len() {
            let Some(sock) = self.peers.sock_mut(k) else {
                continue;
            };
            let r = sock.recv_batch_upto(sock::RX_SLOTS);
            if r > 0 {
                let t = *now.get_or_insert_with(|| self.st.now());
                let got = deliver(
                    sock,
                    &mut self.faults,
                    &mut self.st,
                    t,
                    r,
                    None,
                    &mut |i, g| sink(i, g, t),
                );
                self.st.stats.peer_socket_datagrams += got as u64;
                n += got;
            }
        }
        n
    }

    /// Ends a receive that read `n` datagrams: speculation's balance (an armed pass is
    /// judged, an unarmed one while it is off counts down the backoff), the layout kept
    /// for the next read, and whether the clock was read (`fresh`).
    fn finish_receive(&mut self, armed: Option<Armed>, n: usize, fresh: bool) {
        let (hits, misses) = (
            std::mem::take(&mut self.st.read_hits),
            std::mem::take(&mut self.st.read_misses),
        );
        if self.st.cfg.spec_backoff {
            if armed.is_some() {
                self.st.stats.spec_backoffs += u64::from(self.confidence.armed(hits, misses));
            } else {
                self.confidence.unarmed(n as u64);
            }
        }
        // Hits change the link's generation: the endpoint re-plans before the next read.
        self.st.armed = armed;
        self.read_fresh = fresh;
    }

    /// The clock's last reading, by [`UdpTransport::now`] or a receive (after a receive,
    /// at most [`CLOCK_EVERY`] idle passes old).
    pub fn read_at(&self) -> u64 {
        self.st.last_now.get()
    }

    /// Whether the last [`UdpTransport::receive`] read the clock (a datagram came, or the
    /// reading was due): [`UdpTransport::read_at`] is then as fresh as that receive.
    pub fn read_is_fresh(&self) -> bool {
        self.read_fresh
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

    /// Queues `link`'s datagrams for sending.
    pub fn transmit(&mut self, link: &mut UdpLink, now: u64) {
        link.transmit(now, &mut self.st.batch);
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
            if let (Some(ring), Some(d)) = (self.ring.as_mut(), lone) {
                if let Some(k) = self.links.iter().position(|(a, _)| *a == dest) {
                    match ring.send(&self.links[k].1, dest, d) {
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
                            self.links.swap_remove(k);
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

/// Frames one pass takes from the ring at most.
const RING_BATCH: usize = 64;

/// Most peers whose link-layer address is kept ([`UdpTransport::flush`] sends to the
/// others through the sockets).
const MAX_LINKS: usize = 64;

/// Records that `src`'s datagram `d` came from `link`. A new or changed address is taken
/// only from a datagram that verifies (its CRC-32C and structure): a forged one from a
/// known source cannot redirect our sends to that peer.
fn learn(
    links: &mut Vec<(SocketAddrV4, ring::LinkAddr)>,
    src: SocketAddrV4,
    link: ring::LinkAddr,
    d: &[u8],
) {
    let k = links.iter().position(|(a, _)| *a == src);
    if k.is_some_and(|k| links[k].1 == link) || Datagram::parse(d).is_err() {
        return;
    }
    match k {
        Some(k) => links[k].1 = link,
        None if links.len() < MAX_LINKS => links.push((src, link)),
        None => {}
    }
}

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

/// Puts the intact fragments a read left in each other's places at their own, each copied
/// once ([`spec::plan_moves`]), and hands them to `sink` as moved; a second fragment for
/// the same place is gathered for the ordinary path instead. Runs after every armed entry
/// of the read was verified (the moves write into places other entries landed in) and
/// before anything else of the read is handled (the ordinary path writes too).
fn move_displaced(
    sock: &UdpSock,
    st: &mut State,
    a: &Armed,
    gathered: &mut Gathered,
    sink: &mut impl FnMut(usize, Got<'_>),
) {
    let mut displaced = std::mem::take(&mut st.displaced);
    // By place, then read order: of two fragments for one place, the first read keeps
    // it. (Sorting these small keys, not the records: a stable sort of the records was
    // 2% of a forced-miss receive's time, `examples/bulk_cost miss`.)
    let mut order = std::mem::take(&mut st.order);
    order.clear();
    order.extend(displaced.iter().enumerate().map(|(k, m)| (m.d.to, k)));
    order.sort_unstable();
    let mut list = std::mem::take(&mut st.list);
    list.clear();
    let mut last = None;
    order.retain(|&(to, k)| {
        let m = &displaced[k];
        if last == Some(to) {
            let slot = sock.slot(m.entry, sock::RX_SLOT);
            gather(
                &mut gathered.bytes,
                &st.lead[m.entry],
                slot,
                m.start,
                m.wire,
            );
            gathered.close(a.src);
            return false;
        }
        last = Some(to);
        list.push(m.d);
        true
    });
    spec::plan_moves(&list, &mut st.moves);
    // SAFETY: the destination the layout is armed on, valid for its capacity while the
    // key is current (the Bulk contract), and referenced by nothing else during the call
    // (the read's vectors point into it, but the kernel is done with them).
    let dest = unsafe { std::slice::from_raw_parts_mut(a.arm.dest, a.arm.expect.cap as usize) };
    spec::apply_moves(&st.moves, dest, &mut st.scratch);
    for &(_, k) in &order {
        sink(a.key.0, Got::Moved(displaced[k].h, displaced[k].wire));
    }
    displaced.clear();
    st.displaced = displaced;
    st.list = list;
    st.order = order;
}

/// Hands the `r` entries just read from `sock` to `sink`: the armed ones (`armed`, entry k
/// < its plan's length) verified in place first, then the others from their slots.
fn deliver(
    sock: &mut UdpSock,
    faults: &mut Option<Faults>,
    st: &mut State,
    now: u64,
    r: usize,
    armed: Option<&Armed>,
    sink: &mut impl FnMut(usize, Got<'_>),
) -> usize {
    let max = sock::MAX_GSO_SEGMENTS;
    let n_armed = armed.map_or(0, |a| a.arm.entries.len().min(r));
    let mut gathered = std::mem::take(&mut st.gathered);
    gathered.clear();
    let mut segs = std::mem::take(&mut st.segs);
    let mut count = 0;
    // Pass 1: verify the armed entries; copy out everything that is not a hit, before
    // any cleanup writes into the destination.
    for (k, a) in armed.iter().flat_map(|a| (0..n_armed).map(move |k| (k, a))) {
        let got = sock.received(k);
        let frags = &a.arm.entries[k];
        a.layouts[k].segments(got.len, got.seg, &mut segs);
        for seg in &segs {
            count += 1;
            let fate = faults.as_mut().map(|f| f.fate());
            let (start, len) = match *seg {
                Segment::Candidate { start, slot, len } if got.src == a.src => {
                    let (off, _) = frags[slot];
                    // SAFETY: the armed payload slot, `len` <= its length.
                    let payload =
                        unsafe { std::slice::from_raw_parts(a.arm.dest.add(off as usize), len) };
                    let clean = fate.is_none_or(|f| f.is_clean());
                    let header = &st.hdr_slots[k * max + slot];
                    match spec::check(&a.arm.expect, off, header, payload) {
                        Check::Hit(h) if clean => {
                            st.read_hits += 1;
                            sink(a.key.0, Got::Placed(h, BULK_HEADER + len));
                            continue;
                        }
                        Check::Displaced(h) if clean => {
                            // Moved in place once every entry of the read is verified.
                            st.stats.spec_misses += 1;
                            st.read_misses += 1;
                            let d = Displaced {
                                from: off,
                                to: h.offset,
                                len,
                            };
                            st.displaced.push(Misplaced {
                                d,
                                h,
                                wire: BULK_HEADER + len,
                                entry: k,
                                start,
                            });
                            continue;
                        }
                        _ => {
                            st.read_misses += 1;
                            (start, BULK_HEADER + len)
                        }
                    }
                }
                Segment::Candidate { start, len, .. } => (start, BULK_HEADER + len),
                Segment::Gather { start, len } => (start, len),
            };
            st.stats.spec_misses += 1;
            let slot = sock.slot(k, sock::RX_SLOT);
            match (fate, faults.as_mut()) {
                (Some(fate), Some(f)) => {
                    let mut bytes = Vec::with_capacity(len);
                    gather(&mut bytes, &st.lead[k], slot, start, len);
                    f.apply_fate(fate, now, got.src, &bytes, &mut |s, d| gathered.push(s, d))
                }
                _ => {
                    gather(&mut gathered.bytes, &st.lead[k], slot, start, len);
                    gathered.close(got.src);
                }
            }
        }
    }
    st.segs = segs;
    if let Some(a) = armed.filter(|_| !st.displaced.is_empty()) {
        move_displaced(sock, st, a, &mut gathered, sink);
    }
    // Pass 2: the unarmed entries from their slots (no copy without faults), then
    // what was gathered or held back.
    let mut to_link = |i: usize, d: &[u8]| sink(i, Got::Datagram(d));
    for k in n_armed..r {
        count += sock.for_each_datagram(k, |src, d| match faults.as_mut() {
            None => {
                st.dispatch(&mut to_link, src, d);
            }
            Some(f) => f.apply(now, src, d, &mut |s, d| gathered.push(s, d)),
        });
    }
    if let Some(f) = faults.as_mut() {
        f.release(now, &mut |s, d| gathered.push(s, d));
    }
    let mut from = 0;
    for &(s, end) in &gathered.items {
        st.dispatch(&mut to_link, s, &gathered.bytes[from..end]);
        from = end;
    }
    st.gathered = gathered;
    sock.stats.datagrams_received += count as u64;
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_link_address_changes_only_on_a_datagram_that_verifies() {
        let peer = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 4000);
        let at = |ifindex, mac0| ring::LinkAddr {
            ifindex,
            mac: [mac0, 1, 2, 3, 4, 5, 0, 0],
            halen: 6,
            local: Ipv4Addr::new(10, 0, 0, 1),
        };
        let mut good = Vec::new();
        Datagram::Ping { conn: 7, floor: 3 }.encode(&mut good);
        let mut forged = good.clone();
        forged[20] ^= 1; // the CRC no longer holds
        let mut links = Vec::new();
        learn(&mut links, peer, at(2, 0xaa), &forged);
        assert!(links.is_empty(), "a forged datagram taught an address");
        learn(&mut links, peer, at(2, 0xaa), &good);
        assert_eq!(links, vec![(peer, at(2, 0xaa))]);
        learn(&mut links, peer, at(3, 0xbb), &forged);
        assert_eq!(
            links,
            vec![(peer, at(2, 0xaa))],
            "a forged one redirected it"
        );
        learn(&mut links, peer, at(3, 0xbb), &good);
        assert_eq!(links, vec![(peer, at(3, 0xbb))], "a real move is followed");
    }
}
