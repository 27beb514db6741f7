//! The endpoint: peers, tag matching, eager and rendezvous protocols, progress and waiting.
//!
//! Threading: an [`Endpoint`] is `Send` but not `Sync`: one thread drives it at a time
//! (all operations take `&mut self`), as with a UCX worker in single-thread mode. Move it
//! between threads freely; share it behind a `Mutex` if you must.
//!
//! Fork: an endpoint belongs to the process that created it. A forked child must create
//! its own [`crate::Context`]; `connect` detects a child using a parent's endpoint.
//!
//! Progress: every call that waits, and [`Endpoint::progress`], moves data: drains the
//! peers' rings, matches, answers rendezvous requests, flushes queued sends. A process
//! that computes for long stretches should call `progress` now and then, or rendezvous
//! senders waiting on it stall (as in MPI). It is never declared dead for it: over UDP a
//! keepalive thread pings its peers while it makes no call
//! ([`crate::transport::udp::keepalive`]), over TCP the kernel keeps the connection.
//!
//! Transports: each peer is a [`link::Link`], shared memory on the same host or UDP
//! otherwise (`CLINK_TRANSPORT=udp` forces UDP), or TCP (`CLINK_TRANSPORT=tcp`, or a peer
//! that offers only TCP); the protocol above is the same for all.

use crate::context::{eager_threshold, pipeline_chunk, rendezvous_method, CtxInner};
use crate::error::{io_err, Error, Result};
use crate::events::{self, Event, EventQueue};
use crate::stats::Stats;
use crate::sys::{self, Epoll, SeqPacket};
use crate::transport::shm::board::Board;
use crate::transport::shm::ring::RingMem;
use crate::transport::shm::{Local, ShmPeer, Wake};
use crate::transport::tcp::TcpTransport;
use crate::transport::udp::UdpTransport;
use bytes::Bytes;
use clink_proto::addr::Address;
use clink_proto::cost::{Rndv, RndvChooser, CMA_SPLIT_MIN};
use clink_proto::matching::{Matcher, Selector};
use clink_proto::wire::{Frame, EAGER_HEADER};
use clink_proto::PeerId;
use link::{Link, Rx};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod link;
pub(crate) mod net;
mod ready;
mod rma;
mod tcp;

const TOK_DOORBELL: u64 = 0;
const TOK_LISTENER: u64 = 1;
/// Epoll token of connections whose hello has not arrived yet.
const TOK_INCOMING: u64 = 2;
/// Epoll token of the UDP sockets of peers and steered streams.
const TOK_UDP: u64 = 3;
/// Epoll token of the main UDP socket (handshakes, peers without a socket of their own):
/// the others' readiness does not make a wake-up read it.
const TOK_UDP_MAIN: u64 = u64::MAX - 3;
/// Longest `close` waits for its goodbyes to reach network peers.
const LINGER: Duration = Duration::from_millis(200);
const TOK_PEER0: u64 = 4;
/// Frames handled per peer per progress pass, so one busy peer cannot starve the others.
const RX_BUDGET: usize = 64;
/// Capacity of the event queue: of the endpoint's own events (beyond, they spill in
/// order) and of other threads' posts (beyond, a post is refused); see [`crate::events`].
const EVENT_QUEUE_CAP: usize = 4096;
/// Events `wait_event`'s fast path may return in a row before a full progress pass.
const FAST_STREAK: u32 = 64;
/// The longest sleep on a peer's bell: the listener is not watched meanwhile, so this
/// bounds how long a connecting process waits for its welcome.
const BELL_SLEEP_MAX: Duration = Duration::from_millis(50);
/// The split point is a multiple of this (page-aligned halves: no page pinned by both).
const CMA_SPLIT_ALIGN: u64 = 4096;

/// Request ids are small sequential integers: a multiply, not SipHash, per message.
type IdMap<V> = clink_proto::idhash::IdMap<u64, V>;

/// What a completed receive reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Sender.
    pub peer: PeerId,
    /// Tag of the message.
    pub tag: u64,
    /// Length of the message in bytes.
    pub len: u64,
}

/// A completed non-blocking receive: the buffer (truncated to the message length) and its
/// status.
pub struct Received {
    /// The receive buffer, its length set to the message length (empty for
    /// [`Endpoint::irecv_into_aperture`]: the bytes are in the aperture).
    pub buf: Vec<u8>,
    /// Who sent what.
    pub status: Status,
}

impl std::fmt::Debug for Received {
    /// Shows the length, not the bytes (messages can be gigabytes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("buf", &format_args!("<{} bytes>", self.buf.len()))
            .field("status", &self.status)
            .finish()
    }
}

/// Handle of a non-blocking send. Not `Clone`; complete it with `test`/`wait`/`cancel`.
#[derive(Debug)]
#[must_use = "a send request must be waited on, tested to completion or cancelled"]
pub struct SendRequest {
    id: u64, // 0: completed at once
}

impl SendRequest {
    /// The request's number, as in [`Event::SendDone`] (0 for a send that completed at
    /// once while completion events were not wanted).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// Handle of a non-blocking receive.
#[derive(Debug)]
#[must_use = "a receive request must be waited on, tested to completion or cancelled"]
pub struct RecvRequest {
    id: u64,
}

impl RecvRequest {
    /// The request's number, as in [`Event::RecvDone`].
    pub fn id(&self) -> u64 {
        self.id
    }
}

enum SendData {
    Owned(Bytes),
    /// Memory owned by a blocking caller that waits until the send is over.
    Borrowed(*const u8, usize),
}

impl SendData {
    fn bytes(&self) -> &[u8] {
        match self {
            SendData::Owned(b) => b,
            // SAFETY: the blocking caller keeps the slice alive until completion (send_raw).
            SendData::Borrowed(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
        }
    }
}

enum SendState {
    /// Waiting in the peer's transmit queue (eager: ring full; rendezvous: RTS not sent).
    Queued,
    /// RTS sent; the receiver will read it (CMA, then FIN) or ask for chunks (CTS).
    WaitFin,
    /// Being pushed through the ring in chunks.
    Pipelining,
    /// Over.
    Done(Result<()>),
}

struct SendOp {
    peer: PeerId,
    tag: u64,
    data: SendData,
    state: SendState,
}

enum RecvBuf {
    Owned(Vec<u8>),
    /// Memory owned by a blocking caller that waits until completion.
    Borrowed(*mut u8, usize),
    /// Memory the endpoint does not own: a range of one of its apertures
    /// (`Endpoint::irecv_into_aperture`, which cannot then be destroyed while the receive
    /// is pending) or caller memory (`Endpoint::irecv_raw`).
    Aperture {
        ptr: *mut u8,
        len: usize,
    },
}

impl RecvBuf {
    fn slice(&mut self) -> &mut [u8] {
        match self {
            RecvBuf::Owned(v) => v,
            // SAFETY: the blocking caller keeps the slice alive until completion (recv).
            RecvBuf::Borrowed(p, n) => unsafe { std::slice::from_raw_parts_mut(*p, *n) },
            // SAFETY: in bounds of an aperture that outlives the receive (destroying it is
            // refused while the receive is pending).
            RecvBuf::Aperture { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(*ptr, *len)
            },
        }
    }
}

enum RecvState {
    Posted,
    /// Receiving a pipelined rendezvous message chunk by chunk (since `since`).
    Pipelining {
        status: Status,
        got: u64,
        since: Instant,
    },
    /// A split CMA rendezvous: this side has read the message from byte `pushed` on
    /// (`read`: how that went); the sender writes the first `pushed` bytes into the
    /// buffer and says so ([`Frame::Pushed`]). The buffer is the sender's target until then.
    Split {
        status: Status,
        pushed: u64,
        read: std::io::Result<()>,
        since: Instant,
        /// The message in the sender's memory (for reading the first part if it cannot
        /// write it).
        addr: u64,
    },
    Done(Result<Status>),
}

struct RecvOp {
    buf: RecvBuf,
    state: RecvState,
}

/// A message that arrived before its receive.
enum Unexp {
    Eager(Vec<u8>),
    Rts { len: u64, send_id: u64, addr: u64 },
}

/// Something to put in a peer's ring, in order.
enum TxItem {
    Send(u64),
    Ctrl(Frame<'static>),
    /// An encoded frame (one-sided requests and answers that found the link full).
    Raw(Vec<u8>),
}

/// A pipelined send in progress towards one peer.
struct PipelineOut {
    send_id: u64,
    next: u64,
    len: u64,
}

struct Peer {
    link: Link,
    alive: bool,
    eager_max: u64,
    txq: VecDeque<TxItem>,
    /// Pipelined sends the receiver asked for (CTS), in order; the first is active.
    pipeline_out: VecDeque<PipelineOut>,
    /// Pipelined receives in progress: send_id -> receive id.
    pipeline_in: HashMap<u64, u64>,
    /// The ring's head holds a message no receive wants yet (left in place).
    blocked: bool,
    /// Which rendezvous method is faster from this peer, as measured.
    chooser: RndvChooser,
    /// The peer could not write a split rendezvous's half into this process (CMA
    /// refused that way round): its rendezvous are no longer split.
    push_refused: bool,
    /// The copy engine's queue of this peer's large one-sided requests (and the requests
    /// behind them).
    engine: VecDeque<rma::EngineItem>,
    /// The message at the head of the ring was announced by an event.
    announced: bool,
    /// The peer said goodbye (or we closed): its end is reported as closed, not failed.
    closing: bool,
    /// Unacknowledged puts were sent since the last sync.
    unacked: bool,
    /// On the busy list (see `ready`).
    listed: bool,
}

impl Peer {
    /// Releases the frame at the head of the peer's queue (the next one is announced
    /// afresh); true when the peer must be woken.
    fn release(&mut self, rx: Rx) -> bool {
        self.announced = false;
        self.link.release(rx)
    }

    /// For the latency fast paths (`recv_fast`, `event_fast`): the record at the head of
    /// a live shared-memory peer's ring with nothing queued either way (`Ok(None)`: the
    /// ring is empty, or the peer is dead: skipped). `Err(())` hands over to the general
    /// path: a network peer (its frames arrive through the socket, read by `progress`),
    /// queued or engine work, or a ring error (which the general path reports).
    #[inline]
    fn quiet_head(&mut self) -> std::result::Result<Option<Rx>, ()> {
        if !self.alive {
            return Ok(None);
        }
        if !self.txq.is_empty()
            || !self.pipeline_out.is_empty()
            || !self.engine.is_empty()
            || self.link.shm().is_none()
        {
            return Err(());
        }
        self.link.peek().map_err(|_| ())
    }
}

/// A communication port: listens for peers, connects to them, sends and receives tagged
/// messages. See the module docs for threading and progress rules.
pub struct Endpoint {
    ctx: Arc<CtxInner>,
    id: u128,
    sock_name: String,
    listener: SeqPacket,
    doorbell: Arc<OwnedFd>,
    epoll: Epoll,
    probe: Box<u64>,
    peers: Vec<Peer>,
    new_peers: VecDeque<PeerId>,
    /// Accepted connections waiting for their hello, with their arrival time.
    incoming: Vec<(SeqPacket, Instant)>,
    matcher: Matcher<u64, Unexp>,
    sends: IdMap<SendOp>,
    recvs: IdMap<RecvOp>,
    next_id: u64,
    stats: Stats,
    /// Progress passes made (wrapping): every 64th looks at the clock for the liveness
    /// check.
    passes: u32,
    /// When the epoll set was last looked at (liveness, connections).
    last_check: Instant,
    /// Events `wait_event`'s fast path returned since the last progress pass (it gives
    /// way to a pass after [`FAST_STREAK`]).
    fast_streak: u32,
    events: Vec<u64>,
    last_error: Option<String>,
    /// The network transport, when enabled (`CLINK_UDP`).
    net: Option<UdpTransport>,
    /// Some UDP connection is marked awaited ([`Endpoint::mark_awaited`]).
    awaiting: bool,
    /// Whether the UDP transport's extra sockets (peers' own, steered) are in the epoll
    /// set: from the first sleep or [`Endpoint::prepare_wait`] on, not before (see
    /// `Endpoint::watch_udp`).
    udp_watched: bool,
    /// The TCP transport, when enabled (`CLINK_TCP`).
    tcp: Option<TcpTransport>,
    /// Sends nobody waits for (committed network claims): removed once complete.
    detached: Vec<u64>,
    /// Apertures, exports, tripwires and one-sided requests.
    rma: rma::RmaState,
    /// The event queue.
    evq: EventQueue,
    /// Non-blocking requests whose completion is to be reported: (is a send, id).
    watched: Vec<(bool, u64)>,
    /// A request finished since the watched ones were last looked at (set wherever a
    /// request's state becomes `Done`, so that passes without one skip the scan).
    finished: bool,
    /// Our activity board and which peers a progress pass visits.
    board: Board,
    ready: ready::Ready,
}

// The raw pointers an endpoint holds point into memory it owns or that stays valid while
// it holds them: borrowed send/receive buffers during the blocking call that lent them, a
// UDP link's bulk sources and destinations (request buffers the endpoint owns), aperture
// memory, mapped segments. None is tied to a thread.
// SAFETY: see above; moving the endpoint to another thread moves all of it.
unsafe impl Send for Endpoint {}

impl Endpoint {
    pub(crate) fn new(ctx: Arc<CtxInner>) -> Result<Endpoint> {
        let id = sys::random_u128().map_err(io_err("random identity"))?;
        let sock_name = format!("clink-{id:032x}");
        let listener =
            SeqPacket::listen(&sock_name).map_err(io_err("listen on abstract socket"))?;
        let doorbell = Arc::new(sys::eventfd().map_err(io_err("eventfd"))?);
        let epoll = Epoll::new().map_err(io_err("epoll_create"))?;
        epoll
            .add_edge(doorbell.as_raw_fd(), TOK_DOORBELL)
            .map_err(io_err("epoll_ctl"))?;
        epoll
            .add(listener.raw(), TOK_LISTENER)
            .map_err(io_err("epoll_ctl"))?;
        let probe = Box::new((id as u64) | 1);
        let net = match &ctx.config.udp {
            Some(cfg) => {
                let t = UdpTransport::new(cfg.clone(), id)?;
                epoll
                    .add(t.sock.raw(), TOK_UDP_MAIN)
                    .map_err(io_err("epoll_ctl UDP socket"))?;
                Some(t)
            }
            None => None,
        };
        let tcp = match &ctx.config.tcp {
            Some(cfg) => {
                let t = TcpTransport::new(cfg.clone(), id)?;
                epoll
                    .add(t.listener_fd(), tcp::TOK_TCP_LISTENER)
                    .map_err(io_err("epoll_ctl TCP listener"))?;
                Some(t)
            }
            None => None,
        };
        Ok(Endpoint {
            ctx,
            id,
            sock_name,
            listener,
            doorbell,
            epoll,
            probe,
            peers: Vec::new(),
            new_peers: VecDeque::new(),
            incoming: Vec::new(),
            matcher: Matcher::default(),
            sends: IdMap::default(),
            recvs: IdMap::default(),
            next_id: 1,
            stats: Stats::default(),
            passes: 0,
            last_check: Instant::now(),
            fast_streak: 0,
            events: Vec::with_capacity(32),
            last_error: None,
            net,
            awaiting: false,
            udp_watched: false,
            tcp,
            detached: Vec::new(),
            rma: rma::RmaState::default(),
            evq: EventQueue::new(EVENT_QUEUE_CAP),
            watched: Vec::new(),
            finished: false,
            board: Board::new()?,
            ready: ready::Ready::default(),
        })
    }

    /// The printable address other processes pass to [`Endpoint::connect`].
    pub fn address(&self) -> String {
        Address {
            host: self.ctx.host,
            id: self.id,
            shm: Some(self.sock_name.clone()),
            udp: self.net.as_ref().map(UdpTransport::advertised),
            tcp: self.tcp.as_ref().map(TcpTransport::advertised),
        }
        .to_string()
    }

    /// Counters since creation.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        self.add_net_stats(&mut s);
        self.add_tcp_stats(&mut s);
        s
    }

    /// The last peer failure or protocol error seen, for diagnostics.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    fn local(&self) -> Local<'_> {
        Local {
            id: self.id,
            doorbell: self.doorbell.as_raw_fd(),
            probe: (&*self.probe as *const u64 as u64, *self.probe),
            board: &self.board,
            config: &self.ctx.config,
        }
    }

    fn check_fork(&self) -> Result<()> {
        if sys::getpid() != self.ctx.pid {
            return Err(Error::Forked(self.ctx.pid));
        }
        Ok(())
    }

    /// Connects to the endpoint at `addr` (a string from its [`Endpoint::address`]).
    /// Shared memory is used when the address is on this host and network namespace
    /// (unless `CLINK_TRANSPORT` says otherwise); else UDP, or TCP when configured
    /// (`CLINK_TRANSPORT=tcp`), when the peer offers only TCP, or when this endpoint's
    /// UDP is off.
    pub fn connect(&mut self, addr: &str) -> Result<PeerId> {
        self.check_fork()?;
        let a = Address::parse(addr)?;
        let fail = |why: &str| Error::Connect {
            addr: addr.to_string(),
            why: why.to_string(),
        };
        if a.id == self.id {
            return Err(fail("that is this endpoint itself"));
        }
        let tcp_first = self.tcp.is_some()
            && (self.ctx.config.prefer_tcp || a.udp.is_none() || self.net.is_none());
        let name = match (a.shm.as_deref(), a.udp, a.tcp) {
            (Some(name), _, _) if a.host == self.ctx.host && !self.ctx.config.force_net => name,
            (_, _, Some(dest)) if tcp_first => return self.connect_tcp(addr, dest, a.id),
            (_, Some(dest), _) => return self.connect_udp(addr, dest, a.id),
            (_, None, Some(dest)) => return self.connect_tcp(addr, dest, a.id),
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
        let link = {
            let me = self.local();
            let (listener, epoll) = (&self.listener, &self.epoll);
            ShmPeer::connect(name, &me, || {
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
        self.add_peer(Link::Shm(link?))
    }

    /// Registers peers accepted by [`handshake_incoming`] and records refusals.
    fn adopt(&mut self, accepted: Vec<ShmPeer>, refused: Vec<Error>) {
        for p in accepted {
            match self.add_peer(Link::Shm(p)) {
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

    fn add_peer(&mut self, link: Link) -> Result<PeerId> {
        let id = PeerId(self.peers.len() as u32);
        let eager_max = match &link {
            Link::Shm(s) => {
                self.epoll
                    .add(s.sock.raw(), TOK_PEER0 + u64::from(id.0))
                    .map_err(io_err("epoll_ctl peer socket"))?;
                // Limits follow the connection's rings (the connector chose their size).
                eager_threshold(&self.ctx, s.peer_cma, s.tx.mem().cap())
            }
            Link::Udp(u) => {
                if let Some(net) = self.net.as_mut() {
                    net.route(u, id.0 as usize);
                }
                self.watch_new_sockets();
                net::eager_threshold(&self.ctx, u.conn.config().reliable)
            }
            Link::Tcp(_) => net::eager_threshold(&self.ctx, false),
        };
        let tcp = matches!(link, Link::Tcp(_));
        self.peers.push(Peer {
            link,
            alive: true,
            eager_max,
            txq: VecDeque::new(),
            pipeline_out: VecDeque::new(),
            pipeline_in: HashMap::new(),
            blocked: false,
            chooser: RndvChooser::default(),
            push_refused: false,
            engine: VecDeque::new(),
            announced: false,
            closing: false,
            unacked: false,
            listed: false,
        });
        if tcp {
            if let Err(e) = self.tcp_added(id.0 as usize) {
                self.peers.pop();
                return Err(e);
            }
        }
        self.ready_add(id.0 as usize);
        self.stats.peers_connected += 1;
        self.evq.push(events::PEERS, Event::PeerConnected(id));
        Ok(id)
    }

    /// Waits up to `timeout` for a peer to connect to us and returns it. Peers that
    /// connected earlier are returned first, one per call.
    pub fn accept(&mut self, timeout: Option<Duration>) -> Result<PeerId> {
        // Progress looks at the listener only at liveness checks (no system call per poll);
        // a caller waiting for a connection looks at it on every poll, and sleeps where
        // the listener is watched (not on a peer's bell).
        self.wait_for(timeout, false, None, |ep| {
            if ep.new_peers.is_empty() {
                ep.accept_pending();
                ep.tcp_accept();
            }
            !ep.new_peers.is_empty()
        })?;
        self.new_peers.pop_front().ok_or(Error::Timeout)
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
        Ok(self.peer(peer)?.link.remote_id())
    }

    /// This endpoint's identity (the `id` of its address).
    pub fn endpoint_id(&self) -> u128 {
        self.id
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

    fn peer(&self, peer: PeerId) -> Result<&Peer> {
        // `let else`, not `ok_or`: the error would be built (and dropped) on every call.
        let Some(p) = self.peers.get(peer.0 as usize) else {
            return Err(Error::UnknownPeer(peer));
        };
        Ok(p)
    }

    fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    // ---------------------------------------------------------------- sending

    /// Starts sending `data` to `peer` with `tag`. Small messages are copied into the
    /// peer's ring at once (the request is then already complete); large ones wait in
    /// `data` until the receiver has read them (one copy, by CMA) or they have been
    /// pushed through the ring (pipeline). `data` is kept alive by the request: pass a `Vec<u8>` (moved, not
    /// copied) or a `Bytes`.
    ///
    /// With [`events::REQUESTS`] in the interest mask, its completion is reported by an
    /// [`Event::SendDone`] (a send complete at once included, under its own number).
    pub fn isend(&mut self, peer: PeerId, tag: u64, data: impl Into<Bytes>) -> Result<SendRequest> {
        let req = self.start_send(peer, tag, SendData::Owned(data.into()))?;
        if self.evq.interest & events::REQUESTS == 0 {
            return Ok(req);
        }
        let id = if req.id == 0 {
            // Complete already: give it a number and a finished entry to report and take.
            let id = self.alloc_id();
            self.sends.insert(
                id,
                SendOp {
                    peer,
                    tag,
                    data: SendData::Owned(Bytes::new()),
                    state: SendState::Done(Ok(())),
                },
            );
            id
        } else {
            req.id
        };
        // Reported by the next progress pass (which `next_event`, `wait_event` and
        // `prepare_wait` all run first; `wait_event`'s fast path stands aside while any
        // request is watched), not here: one scan per pass, not per request.
        self.watched.push((true, id));
        self.finished = true;
        Ok(SendRequest { id })
    }

    /// Queues completion events for the watched requests that are done (see
    /// [`events::REQUESTS`]); a request taken by `test`/`wait`/`cancel` first is dropped
    /// from the watch silently.
    fn report_done(&mut self) {
        if !std::mem::take(&mut self.finished) {
            return;
        }
        let (sends, recvs, evq) = (&self.sends, &self.recvs, &mut self.evq);
        self.watched.retain(|&(send, id)| {
            // None: gone (taken by the caller); Some(None): pending; Some(Some(ok)): done.
            let state = if send {
                sends.get(&id).map(|o| match &o.state {
                    SendState::Done(r) => Some(r.is_ok()),
                    _ => None,
                })
            } else {
                recvs.get(&id).map(|o| match &o.state {
                    RecvState::Done(r) => Some(r.is_ok()),
                    _ => None,
                })
            };
            match state {
                None => false,
                Some(None) => true,
                Some(Some(ok)) => {
                    let req = id;
                    evq.push(
                        events::REQUESTS,
                        if send {
                            Event::SendDone { req, ok }
                        } else {
                            Event::RecvDone { req, ok }
                        },
                    );
                    false
                }
            }
        });
    }

    fn start_send(&mut self, peer: PeerId, tag: u64, data: SendData) -> Result<SendRequest> {
        let Some(p) = self.peers.get_mut(peer.0 as usize) else {
            return Err(Error::UnknownPeer(peer));
        };
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        let bytes = data.bytes();
        let len = bytes.len() as u64;
        if len <= p.eager_max {
            self.stats.eager_sends += 1;
            self.stats.eager_bytes += len;
            if p.txq.is_empty() && p.link.try_send(&Frame::Eager { tag, data: bytes }) {
                self.stats.frames_sent += 1;
                self.kick(peer.0 as usize);
                return Ok(SendRequest { id: 0 });
            }
            self.stats.ring_full += 1;
        } else if p.link.unreliable() {
            // A lost chunk or FIN would leave the rendezvous hanging: in unreliable mode
            // (BCL-4's datagram service) messages are at most one eager frame.
            return Err(Error::TooLarge(format!(
                "{len} bytes over an unreliable link: at most {} (CLINK_EAGER_MAX)",
                p.eager_max
            )));
        } else {
            self.stats.rendezvous_sends += 1;
        }
        let id = self.alloc_id();
        let p = &mut self.peers[peer.0 as usize];
        p.txq.push_back(TxItem::Send(id));
        self.mark_busy(peer.0 as usize);
        self.sends.insert(
            id,
            SendOp {
                peer,
                tag,
                data,
                state: SendState::Queued,
            },
        );
        self.flush(peer.0 as usize);
        Ok(SendRequest { id })
    }

    /// Sends and waits until the message is out of `data` (blocking helper).
    pub fn send(&mut self, peer: PeerId, tag: u64, data: &[u8]) -> Result<()> {
        let req = self.start_send(peer, tag, SendData::Borrowed(data.as_ptr(), data.len()))?;
        self.finish_borrowed_send(req)
    }

    /// Sends every message of `msgs` to `peer` with `tag`, all in flight at once, and
    /// waits until all are out of the caller's memory (blocking helper for streaming:
    /// large messages pipeline their rendezvous without copying into owned buffers).
    pub fn send_batch(&mut self, peer: PeerId, tag: u64, msgs: &[&[u8]]) -> Result<()> {
        let mut reqs = Vec::with_capacity(msgs.len());
        let mut first_err = None;
        for m in msgs {
            match self.start_send(peer, tag, SendData::Borrowed(m.as_ptr(), m.len())) {
                Ok(r) => reqs.push(r),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        // Every started send must be over before the borrowed slices go away.
        for r in reqs {
            if let Err(e) = self.finish_borrowed_send(r) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Lets a send complete on its own: nobody will wait for it.
    fn detach_send(&mut self, req: SendRequest) {
        if req.id != 0 {
            self.detached.push(req.id);
        }
    }

    fn finish_borrowed_send(&mut self, req: SendRequest) -> Result<()> {
        // The request points into the caller's slice: it must be over before we return,
        // whatever happens. Only peer death (bounded by the liveness check) ends it early.
        match self.wait_send(&req, None) {
            Err(Error::Timeout) => unreachable!("no timeout given"),
            r => r,
        }
    }

    /// Tests a send: `Ok(true)` when complete, `Ok(false)` while pending, an error when
    /// it failed. Makes progress first.
    pub fn test_send(&mut self, req: &SendRequest) -> Result<bool> {
        if req.id == 0 {
            return Ok(true);
        }
        self.progress();
        self.take_send(req.id)
    }

    /// A send's outcome without a progress pass (for callers that learnt of its
    /// completion from [`Event::SendDone`]): as [`Endpoint::test_send`] otherwise.
    pub fn finish_send(&mut self, req: &SendRequest) -> Result<bool> {
        if req.id == 0 {
            return Ok(true);
        }
        self.take_send(req.id)
    }

    fn take_send(&mut self, id: u64) -> Result<bool> {
        match self.sends.get(&id).map(|s| &s.state) {
            None => Err(Error::Consumed),
            Some(SendState::Done(_)) => match self.sends.remove(&id).map(|s| s.state) {
                Some(SendState::Done(r)) => r.map(|_| true),
                _ => Err(Error::Consumed),
            },
            Some(_) => Ok(false),
        }
    }

    /// Waits for a send to complete, at most `timeout` (`None`: until it completes or the
    /// peer dies). On timeout the request stays valid.
    pub fn wait_send(&mut self, req: &SendRequest, timeout: Option<Duration>) -> Result<()> {
        if req.id == 0 {
            return Ok(());
        }
        let id = req.id;
        self.wait_until(timeout, |ep| {
            matches!(
                ep.sends.get(&id).map(|s| &s.state),
                Some(SendState::Done(_)) | None
            )
        })?;
        self.take_send(id).map(|_| ())
    }

    /// Cancels a send. A send whose bytes are already in the peer's ring cannot be
    /// withdrawn (`Ok(false)`, it will be delivered); an unmatched rendezvous send is
    /// withdrawn (`Ok(true)`) after the receiver confirms. Waits for that answer (bounded by
    /// the peer's liveness).
    pub fn cancel_send(&mut self, req: SendRequest) -> Result<bool> {
        let id = req.id;
        let Some(op) = self.sends.get_mut(&id) else {
            return Ok(false);
        };
        let peer = op.peer;
        match op.state {
            SendState::Queued => {
                // Never left this process: drop it from the queue.
                let p = &mut self.peers[peer.0 as usize];
                p.txq.retain(|t| !matches!(t, TxItem::Send(s) if *s == id));
                self.sends.remove(&id);
                Ok(true)
            }
            SendState::WaitFin => {
                self.push_ctrl(peer.0 as usize, Frame::Cancel { send_id: id });
                self.wait_until(None, |ep| {
                    matches!(
                        ep.sends.get(&id).map(|s| &s.state),
                        Some(SendState::Done(_)) | None
                    )
                })?;
                match self.sends.remove(&id).map(|s| s.state) {
                    Some(SendState::Done(Err(Error::Cancelled))) => Ok(true),
                    Some(SendState::Done(Err(e))) => Err(e),
                    _ => Ok(false),
                }
            }
            SendState::Pipelining => {
                self.wait_until(None, |ep| {
                    matches!(
                        ep.sends.get(&id).map(|s| &s.state),
                        Some(SendState::Done(_)) | None
                    )
                })?;
                self.sends.remove(&id);
                Ok(false)
            }
            SendState::Done(_) => {
                self.sends.remove(&id);
                Ok(false)
            }
        }
    }

    /// Claims space for an `len`-byte eager message in `peer`'s ring, to be written in
    /// place and published with [`SendSlot::commit`] (zero copies on the sending side).
    /// Waits up to `timeout` for ring space. `len` must not exceed the eager threshold.
    pub fn claim(
        &mut self,
        peer: PeerId,
        tag: u64,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<SendSlot<'_>> {
        let i = peer.0 as usize;
        let max = self.peer(peer)?.eager_max;
        if len as u64 > max {
            return Err(Error::TooLarge(format!(
                "claim of {len} bytes exceeds the eager threshold {max} towards {peer}"
            )));
        }
        if !self.peers[i].alive {
            return Err(Error::PeerDead(peer));
        }
        if self.peers[i].link.shm().is_none() {
            // Over the network the message is written into a buffer the link then owns
            // (one copy less than `send`, none saved on the wire).
            return Ok(SendSlot {
                ep: self,
                peer: i,
                res: None,
                owned: Some(vec![0u8; len]),
                len,
                tag,
            });
        }
        let need = EAGER_HEADER + len;
        self.wait_until(timeout, |ep| {
            let p = &mut ep.peers[i];
            !p.alive || (p.txq.is_empty() && p.link.shm_mut().is_some_and(|s| s.tx.arm_wait(need)))
        })?;
        let p = &mut self.peers[i];
        if !p.alive {
            return Err(Error::PeerDead(peer));
        }
        let Some(shm) = p.link.shm_mut() else {
            return Err(Error::PeerDead(peer));
        };
        let Some(res) = shm.tx.reserve(need) else {
            return Err(Error::Timeout);
        };
        Ok(SendSlot {
            ep: self,
            peer: i,
            res: Some(res),
            owned: None,
            len,
            tag,
        })
    }

    /// The end of a CMA rendezvous receive of `n` bytes from peer `i` started at `since`:
    /// the chooser's sample, and the Fin that releases the sender's buffer.
    fn finish_cma(&mut self, i: usize, send_id: u64, n: u64, since: Instant) {
        let ns = since.elapsed().as_nanos() as f64;
        self.peers[i]
            .chooser
            .record(&self.ctx.costs, Rndv::Cma, n, ns);
        self.push_ctrl(i, Frame::Fin { send_id });
    }

    fn push_ctrl(&mut self, i: usize, f: Frame<'static>) {
        let p = &mut self.peers[i];
        if !p.alive {
            return;
        }
        if p.txq.is_empty() && p.link.try_send(&f) {
            self.stats.frames_sent += 1;
            return;
        }
        p.txq.push_back(TxItem::Ctrl(f));
        self.mark_busy(i);
    }

    /// Moves queued frames of peer `i` into its ring; true when something moved.
    fn flush(&mut self, i: usize) -> bool {
        let mut did = false;
        loop {
            let p = &mut self.peers[i];
            let Some(item) = p.txq.front() else { break };
            let ok = match item {
                TxItem::Ctrl(f) => p.link.try_send(f),
                TxItem::Raw(v) => match Frame::parse(v) {
                    Ok(f) => p.link.try_send(&f),
                    Err(_) => true, // we encoded it: cannot happen; drop rather than stall
                },
                TxItem::Send(id) => match self.sends.get_mut(id) {
                    None => true, // cancelled meanwhile
                    Some(op) => {
                        let data = op.data.bytes();
                        let len = data.len() as u64;
                        if len <= p.eager_max {
                            let ok = p.link.try_send(&Frame::Eager { tag: op.tag, data });
                            if ok {
                                op.state = SendState::Done(Ok(()));
                                self.finished = true;
                            }
                            ok
                        } else {
                            let ok = p.link.try_send(&Frame::Rts {
                                tag: op.tag,
                                len,
                                send_id: *id,
                                addr: data.as_ptr() as u64,
                            });
                            if ok {
                                op.state = SendState::WaitFin;
                            }
                            ok
                        }
                    }
                },
            };
            if !ok {
                break;
            }
            p.txq.pop_front();
            self.stats.frames_sent += 1;
            did = true;
        }
        let did = did | self.pump_pipeline(i);
        if did {
            self.kick(i);
        }
        did
    }

    /// Copies chunks of the active pipelined send into the peer's ring while it has room;
    /// a send whose last chunk is in the ring is complete.
    fn pump_pipeline(&mut self, i: usize) -> bool {
        let mut did = false;
        let p = &mut self.peers[i];
        if !p.txq.is_empty() {
            return false; // keep frame order: queued frames first
        }
        while let Some(st) = p.pipeline_out.front_mut() {
            let Some(op) = self.sends.get_mut(&st.send_id) else {
                p.pipeline_out.pop_front();
                continue;
            };
            let chunk = match &p.link {
                Link::Shm(s) => pipeline_chunk(&self.ctx, st.len, s.tx.mem().cap()),
                // (Not reached over UDP, where a rendezvous is a bulk transfer; bounded
                // like an eager frame all the same.)
                Link::Udp(_) | Link::Tcp(_) => net::eager_threshold(&self.ctx, false),
            }
            .min(st.len - st.next);
            let data = &op.data.bytes()[st.next as usize..(st.next + chunk) as usize];
            let f = Frame::Chunk {
                send_id: st.send_id,
                offset: st.next,
                data,
            };
            if !p.link.try_send(&f) {
                break;
            }
            self.stats.frames_sent += 1;
            st.next += chunk;
            did = true;
            if st.next >= st.len {
                op.state = SendState::Done(Ok(()));
                self.finished = true;
                p.pipeline_out.pop_front();
            }
        }
        did
    }

    // ---------------------------------------------------------------- receiving

    /// Posts a receive into `buf` (its length is the capacity) for a message matching
    /// `sel`. Complete it with [`Endpoint::wait_recv`] or [`Endpoint::test_recv`]. With
    /// [`events::REQUESTS`] in the interest mask, its completion is reported by an
    /// [`Event::RecvDone`].
    pub fn irecv(&mut self, sel: Selector, buf: Vec<u8>) -> Result<RecvRequest> {
        Ok(self.post_recv(sel, RecvBuf::Owned(buf)))
    }

    /// Posts a receive of a message matching `sel` straight into `len` bytes of caller
    /// memory at `ptr` (no copy on completion, unlike [`Endpoint::irecv`], whose buffer
    /// the endpoint owns). Complete it with [`Endpoint::test_recv`] or `wait_recv`: its
    /// [`Received`] has an empty `buf`, the message being at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and neither read nor freed by the
    /// caller, until the request completes or [`Endpoint::cancel_recv`] withdraws it.
    pub unsafe fn irecv_raw(&mut self, sel: Selector, ptr: *mut u8, len: usize) -> RecvRequest {
        // A zero-length buffer may come as NULL (C callers): slices need a non-null pointer.
        let ptr = if len == 0 {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            ptr
        };
        self.post_recv(sel, RecvBuf::Aperture { ptr, len })
    }

    /// Posts a non-blocking receive into `buf`.
    fn post_recv(&mut self, sel: Selector, buf: RecvBuf) -> RecvRequest {
        let id = self.alloc_id();
        self.recvs.insert(
            id,
            RecvOp {
                buf,
                state: RecvState::Posted,
            },
        );
        self.post(sel, id);
        if self.evq.interest & events::REQUESTS != 0 {
            self.watched.push((false, id));
        }
        RecvRequest { id }
    }

    fn post(&mut self, sel: Selector, id: u64) {
        if let Some((_, u)) = self.matcher.post(sel, id) {
            self.deliver(u.src, u.tag, id, u.item);
            return;
        }
        // Nothing it could match has arrived, and a dead (or unknown) source will send
        // nothing more: fail now rather than at the caller's timeout.
        if let Some(src) = sel.src.filter(|&p| !self.is_alive(p)) {
            self.matcher.cancel(&id);
            let err = if (src.0 as usize) < self.peers.len() {
                Error::PeerDead(src)
            } else {
                Error::UnknownPeer(src)
            };
            if let Some(op) = self.recvs.get_mut(&id) {
                op.state = RecvState::Done(Err(err));
                self.finished = true;
            }
        }
    }

    /// Receives one message matching `sel` into `buf` (blocking helper). Returns who sent
    /// what; a message longer than `buf` fills it and returns [`Error::Truncated`].
    pub fn recv(&mut self, sel: Selector, buf: &mut [u8]) -> Result<Status> {
        self.recv_timeout(sel, buf, None)
    }

    /// As [`Endpoint::recv`], giving up after `timeout` (the receive is withdrawn).
    pub fn recv_timeout(
        &mut self,
        sel: Selector,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Status> {
        if let Some(r) = self.recv_fast(sel, buf) {
            return r;
        }
        // The time the network fast path spun counts towards the spin time and the timeout.
        let mut spun = None;
        if let Some(r) = self.recv_fast_net(sel, buf, timeout, &mut spun) {
            return r;
        }
        let id = self.alloc_id();
        self.recvs.insert(
            id,
            RecvOp {
                buf: RecvBuf::Borrowed(buf.as_mut_ptr(), buf.len()),
                state: RecvState::Posted,
            },
        );
        self.post(sel, id);
        let r = self.wait_for(timeout, true, spun, |ep| {
            matches!(
                ep.recvs.get(&id).map(|r| &r.state),
                Some(RecvState::Done(_))
            )
        });
        if let Err(e) = r {
            // Withdraw before `buf` goes out of scope. A pipelined receive in flight must
            // finish first: its chunks land in `buf`.
            if !self.matcher.cancel(&id) {
                self.wait_until(None, |ep| {
                    !matches!(
                        ep.recvs.get(&id).map(|r| &r.state),
                        Some(RecvState::Pipelining { .. } | RecvState::Split { .. })
                    )
                })?;
            }
            if let Some(RecvOp {
                state: RecvState::Done(res),
                ..
            }) = self.recvs.remove(&id)
            {
                return res;
            }
            return Err(e);
        }
        match self.recvs.remove(&id).map(|r| r.state) {
            Some(RecvState::Done(res)) => res,
            _ => Err(Error::Consumed),
        }
    }

    /// The latency fast path of a blocking receive: when nothing else is in flight (no
    /// posted receive, no matching unexpected message, no pending send or queued frame),
    /// poll the rings directly for a small message matching `sel` and copy it straight
    /// into `buf`: no request, no matching queues. Gives up (`None`) as soon as anything
    /// else shows up at a ring's head, or after a short spin, leaving it to the general
    /// path.
    fn recv_fast(&mut self, sel: Selector, buf: &mut [u8]) -> Option<Result<Status>> {
        if self.matcher.posted_len() != 0
            || !self.sends.is_empty()
            || self.matcher.has_unexpected(&sel)
        {
            return None;
        }
        let spins = match self.ctx.config.spin {
            Some(d) if d.is_zero() => 1,
            _ => 4096,
        };
        let (lo, hi) = match sel.src {
            // A dead or unknown source: the general path fails the receive at once.
            Some(p) if !self.is_alive(p) => return None,
            Some(p) => (p.0 as usize, p.0 as usize + 1),
            None => (0, self.peers.len()),
        };
        for _ in 0..spins {
            for i in lo..hi {
                let p = &mut self.peers[i];
                let rec = match p.quiet_head() {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(()) => return None,
                };
                let src = PeerId(i as u32);
                let Ok(Frame::Eager { tag, data }) = Frame::parse(p.link.frame(rec)) else {
                    return None;
                };
                if !sel.matches(src, tag) {
                    return None;
                }
                let result = copy_eager(src, tag, data, buf);
                if p.release(rec) {
                    p.link.wake();
                    self.stats.doorbells += 1;
                }
                self.stats.frames_received += 1;
                return Some(result);
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Tests a receive: `Ok(Some(..))` when complete, `Ok(None)` while pending.
    pub fn test_recv(&mut self, req: &RecvRequest) -> Result<Option<Received>> {
        self.progress();
        self.take_recv(req.id)
    }

    /// A receive's outcome without a progress pass (for callers that learnt of its
    /// completion from [`Event::RecvDone`]): as [`Endpoint::test_recv`] otherwise.
    pub fn finish_recv(&mut self, req: &RecvRequest) -> Result<Option<Received>> {
        self.take_recv(req.id)
    }

    fn take_recv(&mut self, id: u64) -> Result<Option<Received>> {
        if self.rma.has_aperture_recvs() {
            // Fire its tripwires before the request goes (a completion in this call's own
            // pass, or one found without a pass).
            self.settle_aperture_recvs();
        }
        match self.recvs.get(&id).map(|r| (&r.state, &r.buf)) {
            None => Err(Error::Consumed),
            Some((RecvState::Done(_), RecvBuf::Aperture { .. })) => {
                // The bytes are in the aperture: no buffer to hand back, even truncated.
                match self.recvs.remove(&id).map(|op| op.state) {
                    Some(RecvState::Done(res)) => res.map(|status| {
                        Some(Received {
                            buf: Vec::new(),
                            status,
                        })
                    }),
                    _ => Err(Error::Consumed),
                }
            }
            Some((RecvState::Done(Err(Error::Truncated { .. })), _)) => {
                // Keep the buffer (with the message's first bytes) for take_recv_buffer.
                match &self.recvs[&id].state {
                    RecvState::Done(Err(Error::Truncated { len, capacity })) => {
                        Err(Error::Truncated {
                            len: *len,
                            capacity: *capacity,
                        })
                    }
                    _ => Err(Error::Consumed),
                }
            }
            Some((RecvState::Done(_), _)) => match self.recvs.remove(&id) {
                Some(RecvOp {
                    buf: RecvBuf::Owned(mut buf),
                    state: RecvState::Done(res),
                }) => {
                    let st = res?;
                    buf.truncate(st.len as usize);
                    Ok(Some(Received { buf, status: st }))
                }
                _ => Err(Error::Consumed),
            },
            Some(_) => Ok(None),
        }
    }

    /// After a receive failed with [`Error::Truncated`], returns its buffer (which holds
    /// the message's first bytes).
    pub fn take_recv_buffer(&mut self, req: RecvRequest) -> Option<Vec<u8>> {
        match self.recvs.remove(&req.id)? {
            RecvOp {
                buf: RecvBuf::Owned(v),
                ..
            } => Some(v),
            _ => None,
        }
    }

    /// Waits for a receive, at most `timeout`. On timeout the request stays valid.
    pub fn wait_recv(&mut self, req: &RecvRequest, timeout: Option<Duration>) -> Result<Received> {
        let id = req.id;
        self.wait_until(timeout, |ep| {
            matches!(
                ep.recvs.get(&id).map(|r| &r.state),
                Some(RecvState::Done(_)) | None
            )
        })?;
        self.take_recv(id)?.ok_or(Error::Consumed)
    }

    /// Waits for the first of `reqs` to complete, at most `timeout` (MPI's `Waitany`):
    /// its index in `reqs` and what it received (or its error). One progress loop serves
    /// them all, where polling each with [`Endpoint::test_recv`] makes a progress pass per
    /// request. The other requests stay valid, and all of them on timeout. Empty `reqs` is
    /// [`Error::Invalid`].
    pub fn wait_any_recv(
        &mut self,
        reqs: &[RecvRequest],
        timeout: Option<Duration>,
    ) -> Result<(usize, Result<Received>)> {
        if reqs.is_empty() {
            return Err(Error::Invalid("wait_any_recv: no request".into()));
        }
        let mut first = None;
        self.wait_until(timeout, |ep| {
            first = reqs.iter().position(|r| {
                matches!(
                    ep.recvs.get(&r.id).map(|r| &r.state),
                    Some(RecvState::Done(_)) | None
                )
            });
            first.is_some()
        })?;
        let i = first.expect("the wait ended on a completed request");
        Ok((
            i,
            self.take_recv(reqs[i].id)
                .and_then(|r| r.ok_or(Error::Consumed)),
        ))
    }

    /// Cancels a receive that has not matched a message; returns its buffer. `Ok(None)`
    /// when it had already matched (complete it with `wait_recv`).
    pub fn cancel_recv(&mut self, req: &RecvRequest) -> Result<Option<Vec<u8>>> {
        if !self.matcher.cancel(&req.id) {
            return Ok(None);
        }
        match self.recvs.remove(&req.id) {
            Some(RecvOp {
                buf: RecvBuf::Owned(v),
                ..
            }) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Looks for a message matching `sel` that has arrived and not been received yet,
    /// without receiving it. Makes progress first.
    pub fn probe(&mut self, sel: Selector) -> Option<Status> {
        self.progress();
        for i in 0..self.peers.len() {
            if self.peers[i].alive && self.peers[i].blocked {
                self.drain(i, true);
            }
        }
        self.matcher.probe(&sel).map(|u| Status {
            peer: u.src,
            tag: u.tag,
            len: match &u.item {
                Unexp::Eager(v) => v.len() as u64,
                Unexp::Rts { len, .. } => *len,
            },
        })
    }

    /// Receives a message matching `sel` without copying it when it is a small message at
    /// the head of its sender's ring: the guard borrows the ring memory and frees it when
    /// dropped. Other messages (unexpected, or large) are delivered in an owned buffer
    /// behind the same guard. Waits up to `timeout`.
    pub fn recv_in_place(
        &mut self,
        sel: Selector,
        timeout: Option<Duration>,
    ) -> Result<InPlace<'_>> {
        let mut found: Option<(usize, Rx, u64)> = None;
        let mut owned: Option<(Status, Vec<u8>)> = None;
        self.wait_until(timeout, |ep| {
            if let Some(u) = ep.matcher.probe(&sel) {
                let is_eager = matches!(u.item, Unexp::Eager(_));
                if is_eager {
                    if let Some(u) = ep.matcher.take_unexpected(&sel) {
                        if let Unexp::Eager(v) = u.item {
                            owned = Some((
                                Status {
                                    peer: u.src,
                                    tag: u.tag,
                                    len: v.len() as u64,
                                },
                                v,
                            ));
                            return true;
                        }
                    }
                }
                return true; // a rendezvous message: received into a buffer below
            }
            for i in 0..ep.peers.len() {
                if sel.src.is_some_and(|s| s.0 as usize != i) || !ep.peers[i].alive {
                    continue;
                }
                let p = &mut ep.peers[i];
                if let Ok(Some(r)) = p.link.peek() {
                    if let Ok(Frame::Eager { tag, .. }) = Frame::parse(p.link.frame(r)) {
                        if sel.matches(PeerId(i as u32), tag)
                            && !ep.matcher.has_posted_for(PeerId(i as u32), tag)
                        {
                            found = Some((i, r, tag));
                            return true;
                        }
                    }
                }
            }
            false
        })
        .or_else(|e| {
            if matches!(e, Error::Timeout) && self.matcher.probe(&sel).is_some() {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        if let Some((i, r, tag)) = found {
            let len = self.peers[i]
                .link
                .frame(r)
                .len()
                .saturating_sub(EAGER_HEADER);
            return Ok(InPlace {
                ep: self,
                status: Status {
                    peer: PeerId(i as u32),
                    tag,
                    len: len as u64,
                },
                data: InPlaceData::Ring(i, r),
            });
        }
        if let Some((status, v)) = owned {
            return Ok(InPlace {
                ep: self,
                status,
                data: InPlaceData::Owned(v),
            });
        }
        // A rendezvous message is waiting: receive it into a buffer of its size.
        let len = self.matcher.probe(&sel).map(|u| match &u.item {
            Unexp::Rts { len, .. } => *len,
            Unexp::Eager(v) => v.len() as u64,
        });
        let len = len.ok_or(Error::Timeout)?;
        let req = self.irecv(sel, vec![0u8; len as usize])?;
        let got = self.wait_recv(&req, None)?;
        Ok(InPlace {
            ep: self,
            status: got.status,
            data: InPlaceData::Owned(got.buf),
        })
    }

    /// Matched a message to receive `rid`: copy it in, or start the rendezvous.
    fn deliver(&mut self, src: PeerId, tag: u64, rid: u64, item: Unexp) {
        match item {
            Unexp::Eager(v) => self.complete_eager(src, tag, rid, &v),
            Unexp::Rts { len, send_id, addr } => {
                self.start_rendezvous(src, tag, rid, len, send_id, addr)
            }
        }
    }

    fn complete_eager(&mut self, src: PeerId, tag: u64, rid: u64, data: &[u8]) {
        let Some(op) = self.recvs.get_mut(&rid) else {
            return;
        };
        op.state = RecvState::Done(copy_eager(src, tag, data, op.buf.slice()));
        self.finished = true;
    }

    fn start_rendezvous(
        &mut self,
        src: PeerId,
        tag: u64,
        rid: u64,
        len: u64,
        send_id: u64,
        addr: u64,
    ) {
        let i = src.0 as usize;
        let status = Status {
            peer: src,
            tag,
            len,
        };
        let Some(op) = self.recvs.get_mut(&rid) else {
            return;
        };
        let p = &mut self.peers[i];
        if !p.alive {
            op.state = RecvState::Done(Err(Error::PeerDead(src)));
            self.finished = true;
            return;
        }
        let cma = p.link.cma();
        let method = match self.ctx.config.rndv {
            Some(_) => rendezvous_method(&self.ctx, len, cma),
            None => {
                let model = rendezvous_method(&self.ctx, len, cma);
                p.chooser.choose(&self.ctx.costs, len, cma, model)
            }
        };
        if let (Rndv::Cma, Some(shm)) = (method, p.link.shm()) {
            let pid = shm.pid;
            let buf = op.buf.slice();
            let cap = buf.len() as u64;
            let n = len.min(cap);
            let dest = buf.as_mut_ptr() as u64;
            // From CMA_SPLIT_MIN on both cores copy: the sender writes the first half
            // (page-aligned) while this side reads the rest, and the buffer stays the
            // sender's target until its answer. (Whether the peer may write here is not
            // waited for: the handshake's late Ready says it, but a refused write is
            // answered, and the first one stops the splits.)
            let pushed = if self.ctx.config.cma_split && !p.push_refused && n >= CMA_SPLIT_MIN {
                (n / 2) & !(CMA_SPLIT_ALIGN - 1)
            } else {
                0
            };
            let t = Instant::now();
            if pushed > 0 {
                p.pipeline_in.insert(send_id, rid);
                let f = Frame::Push {
                    send_id,
                    addr: dest,
                    len: pushed,
                };
                self.push_ctrl(i, f);
            }
            let Some(op) = self.recvs.get_mut(&rid) else {
                return;
            };
            let buf = &mut op.buf.slice()[pushed as usize..n as usize];
            let read = sys::cma_read(pid, addr + pushed, buf);
            if read.is_ok() {
                self.stats.cma_bytes += n - pushed;
            }
            if pushed > 0 {
                self.stats.cma_splits += 1;
                op.state = RecvState::Split {
                    status,
                    pushed,
                    read,
                    since: t,
                    addr,
                };
            } else {
                op.state = cma_outcome(src, status, cap, read);
                self.finished = true;
                self.finish_cma(i, send_id, n, t);
            }
        } else {
            if let Some(u) = p.link.bulk() {
                // A bulk transfer straight into the posted buffer (speculatively).
                let buf = op.buf.slice();
                let (ptr, cap) = (buf.as_mut_ptr(), buf.len() as u64);
                // SAFETY: the receive op owns the buffer (heap or a blocking caller's
                // slice) and keeps it until the transfer completes (finish_bulk_peer) or the
                // peer fails (fail_peer_ops clears the link's transfers first).
                unsafe { u.expect_bulk(send_id, len, ptr, cap) };
            }
            op.state = RecvState::Pipelining {
                status,
                got: 0,
                since: Instant::now(),
            };
            p.pipeline_in.insert(send_id, rid);
            self.push_ctrl(i, Frame::Cts { send_id });
        }
    }

    // ---------------------------------------------------------------- progress

    /// Moves data: drains rings, matches, answers rendezvous, flushes queued frames, and
    /// now and then checks peers' liveness and accepts connections. Returns true when
    /// anything happened. Never blocks.
    pub fn progress(&mut self) -> bool {
        self.progress_pass(true)
    }

    /// A progress pass; without `read_sockets` it leaves the network sockets unread (the
    /// re-check before a sleep: epoll reports them level-triggered, so what arrives
    /// between the last read and the sleep wakes it at once, and a read there would be
    /// one more system call per sleep).
    fn progress_pass(&mut self, read_sockets: bool) -> bool {
        self.fast_streak = 0;
        let mut pass = ready::Pass {
            did: read_sockets && (self.net_receive(false) | self.tcp_receive()),
            ..Default::default()
        };
        if self.ready.on {
            self.visit_board(&mut pass);
        } else {
            for i in 0..self.peers.len() {
                self.visit(i, &mut pass);
            }
        }
        let mut did = pass.did;
        if !did && pass.blocked {
            // Nothing moves: copy unwanted messages aside to reach the frames behind them.
            for i in self.blocked_peers() {
                did |= self.drain(i, true);
            }
        }
        if pass.copies {
            did |= self.run_engine();
        }
        // A pass that did work reads the clock for what it sends (the work may have taken
        // long: copies), unless the last UDP receive read it (a datagram came: this pass's
        // receive, or in a pass that reads no socket the one just before) and it ran no
        // copies: a send timestamp read a little early only lengthens its RTT sample,
        // and the clock read was about 70 of a 64-byte hop's 1 650 user-space cycles (one
        // of three on its critical path). An idle pass keeps the last reading.
        let fresh = pass.copies || did && self.net_clock_stale();
        self.net_transmit(fresh);
        self.tcp_transmit();
        if !self.watched.is_empty() {
            self.report_done();
        }
        if self.rma.has_aperture_recvs() {
            self.settle_aperture_recvs();
        }
        if !self.detached.is_empty() {
            let sends = &mut self.sends;
            self.detached
                .retain(|id| match sends.get(id).map(|s| &s.state) {
                    Some(SendState::Done(_)) => {
                        sends.remove(id);
                        false
                    }
                    Some(_) => true,
                    None => false,
                });
        }
        // Every 64 passes, busy or not, look at the clock (cheap, but not free), and every
        // liveness interval at the epoll set: hang-ups, new connections. Only idle passes
        // used to, so a stream from one peer hid another's death (128 ms-1.9 s to notice
        // it in `tests/failure.rs`, against the 100 ms asked). A busy pass leaves the UDP
        // sockets to the next pass's own read, as before: only idle passes read them here.
        self.passes = self.passes.wrapping_add(1);
        if self.passes.is_multiple_of(64) && self.last_check.elapsed() >= self.ctx.config.liveness {
            did |= self.check_events(Some(Duration::ZERO), !did);
            // Bounds what a peer tampering with the board can delay (see `ready`).
            self.sweep();
        }
        did
    }

    /// Flushes what is queued towards peer `i` and drains what it sent.
    fn visit(&mut self, i: usize, pass: &mut ready::Pass) {
        if !self.peers[i].alive {
            return;
        }
        if !self.peers[i].txq.is_empty() || !self.peers[i].pipeline_out.is_empty() {
            pass.did |= self.flush(i);
        }
        pass.did |= self.drain(i, false);
        pass.blocked |= self.peers[i].blocked;
        pass.copies |= !self.peers[i].engine.is_empty();
    }

    /// Handles up to RX_BUDGET frames from peer `i`.
    ///
    /// A message no posted receive wants is left at the head of the ring (no copy) and the
    /// peer marked `blocked`, unless `force`: then it is copied aside as unexpected so the
    /// frames behind it can be seen (done when nothing else moves, see `progress`).
    fn drain(&mut self, i: usize, force: bool) -> bool {
        let mut n = 0;
        self.peers[i].blocked = false;
        while n < RX_BUDGET {
            let rec = match self.peers[i].link.peek() {
                Ok(Some(r)) => r,
                Ok(None) => {
                    if self.peers[i].link.publish() {
                        self.peers[i].link.wake();
                        self.stats.doorbells += 1;
                    }
                    break;
                }
                Err(e) => {
                    self.stats.protocol_errors += 1;
                    self.fail_peer(
                        i,
                        format!(
                            "{}",
                            Error::Ring {
                                peer: PeerId(i as u32),
                                source: e
                            }
                        ),
                    );
                    return true;
                }
            };
            let announced = self.peers[i].announced;
            match self.handle(i, rec, force) {
                Ok(true) => {}
                Ok(false) => {
                    self.peers[i].blocked = true;
                    // A message event just queued is progress: the pass must not copy the
                    // message aside before the user had a chance to receive it in place.
                    return n > 0 || !announced && self.peers[i].announced;
                }
                Err(e) => {
                    self.stats.protocol_errors += 1;
                    self.fail_peer(i, e.to_string());
                    return true;
                }
            }
            self.stats.frames_received += 1;
            if self.peers[i].release(rec) {
                self.peers[i].link.wake();
                self.stats.doorbells += 1;
            }
            n += 1;
        }
        n > 0
    }

    /// Handles one frame; `Ok(false)` when it was left in the ring (see `drain`).
    fn handle(&mut self, i: usize, rec: Rx, force: bool) -> Result<bool> {
        let src = PeerId(i as u32);
        // The record lives in the peer's segment, kept mapped while the peer exists (or in
        // the heap buffer at the head of a UDP link's queue); the slice is detached from
        // `self` so the handlers below can take `&mut self`.
        let bytes: &[u8] = {
            let b = self.peers[i].link.frame(rec);
            // SAFETY: the mapping outlives this call (peers are never removed), and the
            // record is not released until handle() returns (a UDP link's queued frame is
            // a heap buffer that stays put until it is released after handle()).
            unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) }
        };
        let f = Frame::parse(bytes).map_err(|e| Error::Proto {
            peer: src,
            source: e,
        })?;
        match f {
            Frame::Eager { tag, data } => match self.matcher.take_posted(src, tag) {
                Some(rid) => self.complete_eager(src, tag, rid, data),
                None if !force => {
                    self.announce(i, tag);
                    return Ok(false);
                }
                None => {
                    self.announce(i, tag);
                    self.stats.unexpected += 1;
                    self.matcher
                        .push_unexpected(src, tag, Unexp::Eager(data.to_vec()));
                }
            },
            Frame::Rts {
                tag,
                len,
                send_id,
                addr,
            } => match self.matcher.take_posted(src, tag) {
                Some(rid) => self.start_rendezvous(src, tag, rid, len, send_id, addr),
                None if !force => {
                    self.announce(i, tag);
                    return Ok(false);
                }
                None => {
                    self.announce(i, tag);
                    self.matcher
                        .push_unexpected(src, tag, Unexp::Rts { len, send_id, addr })
                }
            },
            Frame::Fin { send_id } => {
                if let Some(op) = self.sends.get_mut(&send_id) {
                    if op.peer == src && matches!(op.state, SendState::WaitFin) {
                        op.state = SendState::Done(Ok(()));
                        self.finished = true;
                    }
                }
            }
            Frame::Cts { send_id } => {
                let len = match self.sends.get_mut(&send_id) {
                    Some(op) if op.peer == src && matches!(op.state, SendState::WaitFin) => {
                        op.state = SendState::Pipelining;
                        if let Some(u) = self.peers[i].link.bulk() {
                            let d = op.data.bytes();
                            // SAFETY: the send op owns (or borrows from a blocking caller)
                            // the bytes until it completes, which happens only when the
                            // link reports the transfer acknowledged, or the peer fails
                            // (the link's transfers are cleared first).
                            if !unsafe { u.send_bulk(send_id, d.as_ptr(), d.len()) } {
                                op.state = SendState::Done(Err(Error::PeerDead(src)));
                                self.finished = true;
                            }
                            self.kick(i);
                            return Ok(true);
                        }
                        op.data.bytes().len() as u64
                    }
                    _ => return Err(bad_send_ref(src, send_id, "CTS for unknown send")),
                };
                self.peers[i].pipeline_out.push_back(PipelineOut {
                    send_id,
                    next: 0,
                    len,
                });
                self.pump_pipeline(i);
            }
            Frame::Chunk {
                send_id,
                offset,
                data,
            } => {
                let p = &mut self.peers[i];
                let bad = |what| bad_send_ref(src, send_id, what);
                let rid = *p
                    .pipeline_in
                    .get(&send_id)
                    .ok_or_else(|| bad("chunk for unknown send"))?;
                let op = self
                    .recvs
                    .get_mut(&rid)
                    .ok_or_else(|| bad("chunk for unknown receive"))?;
                let RecvState::Pipelining { status, got, since } = &mut op.state else {
                    return Err(bad("chunk for a receive not in progress"));
                };
                let len = data.len() as u64;
                if offset != *got || offset + len > status.len {
                    return Err(bad("chunk out of order or beyond the message"));
                }
                let buf = op.buf.slice();
                let cap = buf.len() as u64;
                if offset < cap {
                    let end = (offset + len).min(cap);
                    buf[offset as usize..end as usize]
                        .copy_from_slice(&data[..(end - offset) as usize]);
                }
                *got += len;
                self.stats.pipeline_bytes += len;
                if *got == status.len {
                    let st = *status;
                    p.chooser.record(
                        &self.ctx.costs,
                        Rndv::Pipeline,
                        st.len,
                        since.elapsed().as_nanos() as f64,
                    );
                    op.state = RecvState::Done(receive_result(st, cap));
                    self.finished = true;
                    p.pipeline_in.remove(&send_id);
                }
            }
            Frame::Cancel { send_id } => {
                let mut found = false;
                let removed = self.matcher.drain_unexpected_from(src, |u| {
                    let hit = !found && matches!(u, Unexp::Rts { send_id: s, .. } if *s == send_id);
                    found |= hit;
                    !hit
                });
                self.push_ctrl(
                    i,
                    Frame::CancelAck {
                        send_id,
                        cancelled: !removed.is_empty(),
                    },
                );
            }
            Frame::CancelAck { send_id, cancelled } => {
                if let Some(op) = self.sends.get_mut(&send_id) {
                    if cancelled && op.peer == src && matches!(op.state, SendState::WaitFin) {
                        op.state = SendState::Done(Err(Error::Cancelled));
                        self.finished = true;
                    }
                }
            }
            Frame::Push { send_id, addr, len } => {
                let bad = |what| bad_send_ref(src, send_id, what);
                let op = match self.sends.get(&send_id) {
                    Some(op) if op.peer == src && matches!(op.state, SendState::WaitFin) => op,
                    _ => return Err(bad("push for unknown send")),
                };
                let d = op.data.bytes();
                let part = d
                    .get(..len as usize)
                    .ok_or_else(|| bad("push beyond the message"))?;
                let pid = self.peers[i].link.shm().map(|s| s.pid);
                let ok = pid.is_some_and(|pid| sys::cma_write(pid, addr, part).is_ok());
                self.push_ctrl(i, Frame::Pushed { send_id, ok });
            }
            Frame::Pushed { send_id, ok } => {
                let p = &mut self.peers[i];
                let bad = |what| bad_send_ref(src, send_id, what);
                let rid = p
                    .pipeline_in
                    .remove(&send_id)
                    .ok_or_else(|| bad("pushed for unknown send"))?;
                let op = self
                    .recvs
                    .get_mut(&rid)
                    .ok_or_else(|| bad("pushed for unknown receive"))?;
                let RecvState::Split {
                    status,
                    pushed,
                    read,
                    since,
                    addr,
                } = std::mem::replace(&mut op.state, RecvState::Posted)
                else {
                    return Err(bad("pushed for a receive not split"));
                };
                let buf = op.buf.slice();
                let cap = buf.len() as u64;
                // The sender could not write its part: read it too (its memory is still
                // there: it waits for the Fin).
                let head = if ok {
                    Ok(())
                } else {
                    p.push_refused = true;
                    match p.link.shm() {
                        Some(shm) => sys::cma_read(shm.pid, addr, &mut buf[..pushed as usize]),
                        None => Err(std::io::Error::other("not a shared-memory peer")),
                    }
                };
                if head.is_ok() {
                    self.stats.cma_bytes += pushed;
                }
                op.state = cma_outcome(src, status, cap, read.and(head));
                self.finished = true;
                self.finish_cma(i, send_id, status.len.min(cap), since);
            }
            Frame::Close => {
                // Transfers the peer acknowledged before its goodbye (the ack rides with
                // it: see `close`) complete; only the rest fail.
                self.finish_bulk_peer(i);
                self.peers[i].closing = true;
                self.fail_peer(i, format!("{src} closed the connection"))
            }
            Frame::Rma(r) => self.handle_rma(i, bytes, r)?,
        }
        Ok(true)
    }

    /// Polls the epoll set (doorbell, listener, peer sockets) once, waiting up to
    /// `timeout`. Returns true when something happened. Without `read_udp` a readable UDP
    /// socket is left to the next pass's own read (epoll reports it level-triggered).
    fn check_events(&mut self, timeout: Option<Duration>, read_udp: bool) -> bool {
        self.last_check = Instant::now();
        self.stats.liveness_checks += 1;
        let mut evs = std::mem::take(&mut self.events);
        evs.clear();
        if let Err(e) = self.epoll.wait(&mut evs, timeout) {
            tracing::warn!("epoll_wait: {e}");
        }
        let mut did = false;
        let (mut udp_main, mut udp_other) = (false, false);
        for &t in &evs {
            match t {
                TOK_DOORBELL => {} // edge-triggered: nothing to read back
                TOK_LISTENER | TOK_INCOMING => did |= self.accept_pending(),
                TOK_UDP_MAIN => udp_main = true,
                TOK_UDP => udp_other = true,
                tcp::TOK_TCP_LISTENER | tcp::TOK_TCP_INCOMING => did |= self.tcp_accept(),
                t => {
                    let i = (t - TOK_PEER0) as usize;
                    if i >= self.peers.len() || !self.peers[i].alive {
                        continue;
                    }
                    if matches!(self.peers[i].link, Link::Tcp(_)) {
                        did |= self.tcp_event(i);
                        continue;
                    }
                    let p = &mut self.peers[i];
                    let Some(shm) = p.link.shm_mut() else {
                        continue;
                    };
                    if shm.on_socket_readable() {
                        // A late handshake message: the peer's CMA result may change the
                        // eager threshold towards it.
                        p.eager_max = eager_threshold(&self.ctx, shm.peer_cma, shm.tx.mem().cap());
                    } else {
                        // Deliver what the peer left in its ring before declaring it dead.
                        self.drain(i, true);
                        if self.peers[i].alive {
                            self.fail_peer(i, format!("{} hung up", PeerId(i as u32)));
                        }
                        did = true;
                    }
                }
            }
        }
        self.events = evs;
        // One receive pass for however many UDP sockets woke us; the main one only when
        // it did (or is due: see `UdpTransport::receive`).
        if read_udp && (udp_main || udp_other) {
            did |= self.net_receive(udp_main);
            // What the read made due (an ack that may not wait) leaves now: the wait that
            // slept may return without another pass.
            self.net_transmit(true);
        }
        did
    }

    fn accept_pending(&mut self) -> bool {
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
    fn announce(&mut self, i: usize, tag: u64) {
        let p = &mut self.peers[i];
        if !p.announced && self.evq.interest & events::MESSAGES != 0 {
            p.announced = true;
            let peer = PeerId(i as u32);
            self.evq
                .push(events::MESSAGES, Event::Message { peer, tag });
        }
    }

    fn fail_peer(&mut self, i: usize, why: String) {
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
            Link::Udp(u) => {
                if let Some(net) = self.net.as_mut() {
                    net.unroute(u);
                }
            }
            Link::Tcp(_) => self.tcp_removed(i),
        }
        self.fail_peer_ops(i);
    }

    /// Completes the rendezvous sends and receives whose bulk transfers peer `i`'s link
    /// finished (UDP or TCP).
    fn finish_bulk_peer(&mut self, i: usize) {
        let Some((done_in, done_out)) = self.peers[i].link.bulk().and_then(|b| b.take_done())
        else {
            return;
        };
        if !done_in.is_empty() {
            if let Link::Udp(u) = &mut self.peers[i].link {
                // The sender's send completes with the ack of the last fragments: it goes
                // with this pass's (or wake-up's) transmit, not after the ack delay (the
                // application may stop driving this endpoint once it has its message).
                u.conn.ack_now();
            }
        }
        for x in done_out {
            if let Some(op) = self.sends.get_mut(&x) {
                if matches!(op.state, SendState::Pipelining) {
                    op.state = SendState::Done(Ok(()));
                    self.finished = true;
                }
            }
        }
        for x in done_in {
            let Some(rid) = self.peers[i].pipeline_in.remove(&x) else {
                continue;
            };
            let Some(op) = self.recvs.get_mut(&rid) else {
                continue;
            };
            if let RecvState::Pipelining { status, .. } = op.state {
                // Its bytes are counted by the link (hits, direct reads, cleanup copies).
                let cap = op.buf.slice().len() as u64;
                op.state = RecvState::Done(receive_result(status, cap));
                self.finished = true;
            }
        }
    }

    /// Fails every operation that needs the (dead or closed) peer `i`.
    fn fail_peer_ops(&mut self, i: usize) {
        let peer = PeerId(i as u32);
        let p = &mut self.peers[i];
        p.txq.clear();
        p.pipeline_out.clear();
        if let Some(b) = p.link.bulk() {
            // No pointer into a request buffer survives the requests' failure.
            b.clear_bulk();
        }
        for (_, rid) in p.pipeline_in.drain() {
            if let Some(op) = self.recvs.get_mut(&rid) {
                op.state = RecvState::Done(Err(Error::PeerDead(peer)));
                self.finished = true;
            }
        }
        for op in self.sends.values_mut() {
            if op.peer == peer && !matches!(op.state, SendState::Done(_)) {
                op.state = SendState::Done(Err(Error::PeerDead(peer)));
                self.finished = true;
            }
        }
        self.fail_peer_rma(i);
        for rid in self.matcher.drain_posted_from(peer) {
            if let Some(op) = self.recvs.get_mut(&rid) {
                op.state = RecvState::Done(Err(Error::PeerDead(peer)));
                self.finished = true;
            }
        }
        // Rendezvous messages of a dead peer cannot be read any more; eager ones can.
        self.matcher
            .drain_unexpected_from(peer, |u| matches!(u, Unexp::Eager(_)));
    }

    // ---------------------------------------------------------------- waiting

    /// Spins calling `progress` until `done` holds, for up to the configured spin time,
    /// then blocks on the endpoint's fd (arm, re-check, sleep). `Error::Timeout` after
    /// `timeout`.
    fn wait_until(
        &mut self,
        timeout: Option<Duration>,
        done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        self.wait_for(timeout, true, None, done)
    }

    /// [`Self::wait_until`]; `bell`: the wait may sleep on a lone peer's bell (only what
    /// that peer sends, or its exit, can end it); `since`: when the caller began spinning
    /// for the same thing (the spin time and the timeout count from there).
    fn wait_for(
        &mut self,
        timeout: Option<Duration>,
        bell: bool,
        since: Option<Instant>,
        done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        let r = self.wait_inner(timeout, bell, since, done);
        if self.awaiting {
            self.mark_awaited(false);
        }
        r
    }

    /// [`Endpoint::wait_for`] itself.
    fn wait_inner(
        &mut self,
        timeout: Option<Duration>,
        bell: bool,
        since: Option<Instant>,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        if done(self) {
            return Ok(());
        }
        // The clock is read only every 16 idle polls; `start` on the first such read.
        let mut start: Option<Instant> = since;
        let spin = self.ctx.config.spin;
        // With no spin time at all, go to sleep after the first empty poll.
        let no_spin = spin == Some(Duration::ZERO);
        let mut polls: u32 = 0;
        // A wake-up has just read the sockets: the pass after it only matches what came.
        let mut woken = false;
        // The first idle clock reading since the last pass that did something (at most
        // 16 polls after it).
        let mut quiet_since: Option<Instant> = None;
        loop {
            let did = self.progress_pass(!std::mem::take(&mut woken));
            if done(self) {
                return Ok(());
            }
            polls = polls.wrapping_add(1);
            if did {
                quiet_since = None;
            }
            if did || (!no_spin && !polls.is_multiple_of(16)) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let start = *start.get_or_insert(now);
            let quiet = *quiet_since.get_or_insert(now);
            let deadline = timeout.map(|t| start + t);
            if deadline.is_some_and(|d| now >= d) {
                return Err(Error::Timeout);
            }
            // Within the spin time, spin; but a bulk stream admission control slowed down
            // is slow by design, and its sender spinning for the acks took the core that
            // two senders share from the granted stream (two senders' aggregate 0.83x
            // one sender spinning, 0.92x sleeping at once; BENCHMARKS.md). A
            // spin time of "forever" (never block) is kept.
            // Nor while runnable threads outnumber the CPUs: the spin would take the
            // CPU a peer needs to produce what is awaited.
            let spinning = match spin {
                None => true,
                Some(s) => {
                    now < start + s && !self.only_slowed() && !crate::oversub::oversubscribed()
                }
            };
            if spinning {
                continue;
            }
            // Spun its time, but a reply is due within a round trip: spin on for it (not
            // with a spin time of zero, which asks to block at once).
            if !no_spin
                && self.reply_due().is_some_and(|due| now < quiet + due)
                && !crate::oversub::oversubscribed()
            {
                continue;
            }
            if let Some(i) = self.bell_peer().filter(|_| bell) {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                self.bell_sleep(i, left.map_or(BELL_SLEEP_MAX, |l| l.min(BELL_SLEEP_MAX)));
            } else if self.arm() {
                // Block: ask producers for a doorbell, re-check, then sleep.
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                self.stats.sleeps += 1;
                // Wake up at least every second to re-check (belt and braces; every
                // wake-up path is signalled).
                let mut t = left.map_or(Duration::from_secs(1), |l| l.min(Duration::from_secs(1)));
                if let Some(n) = self.net_timer() {
                    t = t.min(n);
                }
                woken = self.check_events(Some(t), true);
                self.finish_wait();
                if woken {
                    quiet_since = None; // (what woke it is activity)
                }
            }
            // Arming polls too: what it found (a message event, say) is looked at before
            // another pass, which could copy an announced message aside.
            if done(self) {
                return Ok(());
            }
        }
    }

    /// The peer a wait may sleep on through its bell instead of epoll: the only live peer,
    /// over shared memory, and nothing else that could need a wake-up: no live network
    /// peer (so no protocol timer), no activity board, no event senders on other threads,
    /// no connection being set up, nothing waiting for ring space or for the copy engine.
    /// (A connection that starts meanwhile waits up to [`BELL_SLEEP_MAX`].)
    fn bell_peer(&self) -> Option<usize> {
        if self.ready.on
            || self.tcp.as_ref().is_some_and(|t| t.handshaking())
            || self.evq.has_senders()
            || !self.new_peers.is_empty()
            || !self.incoming.is_empty()
        {
            return None;
        }
        let mut live = self.peers.iter().enumerate().filter(|(_, p)| p.alive);
        let (i, p) = live.next()?;
        if live.next().is_some() {
            return None;
        }
        let Link::Shm(shm) = &p.link else {
            return None;
        };
        (shm.bell.is_some() && p.txq.is_empty() && p.pipeline_out.is_empty() && p.engine.is_empty())
            .then_some(i)
    }

    /// Sleeps on peer `i`'s bell (see [`Self::bell_peer`]) for at most `timeout`: asks
    /// the peer to ring it, re-checks, then blocks in its read. Its hang-up drops the bell;
    /// the next sleep, in epoll, then sees the peer's socket hang up.
    fn bell_sleep(&mut self, i: usize, timeout: Duration) {
        let Some(shm) = self.peers[i].link.shm_mut() else {
            return;
        };
        shm.rx.arm_sleep(Wake::Bell);
        if shm.rx.publish() {
            shm.wake();
            self.stats.doorbells += 1;
        }
        let busy = self.progress_pass(false)
            || !self.peers[i].engine.is_empty()
            || matches!(self.peers[i].link.peek(), Ok(Some(_)))
            || !self.evq.is_empty();
        let Some(shm) = self.peers[i].link.shm_mut() else {
            return;
        };
        if !busy {
            self.stats.sleeps += 1;
            self.stats.bell_sleeps += 1;
            if let Some(b) = shm.bell.as_mut() {
                match b.wait(timeout) {
                    Ok(sys::BellWait::Rang | sys::BellWait::TimedOut) => {}
                    Ok(sys::BellWait::HungUp) => shm.bell = None,
                    Err(e) => {
                        tracing::warn!("bell: {e}");
                        shm.bell = None;
                    }
                }
            }
        }
        shm.rx.disarm_sleep();
    }

    /// Prepares to block on [`Endpoint::fd`]: consumes the fd's pending readiness, asks
    /// every peer for a doorbell on its next message, then re-checks. Returns true when it
    /// is safe to block (nothing arrived meanwhile); false when there is work, in which
    /// case call `progress` instead. After waking, call [`Endpoint::finish_wait`].
    pub fn prepare_wait(&mut self) -> bool {
        self.check_events(Some(Duration::ZERO), true);
        self.arm()
    }

    /// Arm-then-recheck without consuming readiness (the internal wait loop consumes it
    /// in its own epoll_wait: one system call per sleep).
    fn arm(&mut self) -> bool {
        // About to sleep: every UDP socket must be able to wake it, and the peers it
        // awaits are probed while it sleeps.
        self.watch_udp();
        self.mark_awaited(true);
        let board = self.ready.on;
        if board {
            // One flag for every peer on the board.
            self.board.arm_sleep();
        }
        let list = self.arm_list();
        for &i in &list {
            let p = &mut self.peers[i];
            let waiting = !p.txq.is_empty() || !p.pipeline_out.is_empty();
            let Some(shm) = p.link.shm_mut() else {
                continue;
            };
            if waiting {
                // Blocked on a full ring: ask for a doorbell when the peer frees space.
                shm.tx.arm_wait_any();
            }
            if !board || shm.slot.is_none() {
                shm.rx.arm_sleep(Wake::Doorbell);
            }
            if shm.rx.publish() {
                shm.wake();
                self.stats.doorbells += 1;
            }
        }
        self.ready.armed = list;
        // (The doorbell is drained when epoll reports it, not here: one system call less
        // per sleep; a stale ring only costs one spurious wake-up.)
        self.evq.arm_sleep();
        let busy = self.progress_pass(false)
            || (board && self.board.any())
            || self.arm_list().into_iter().any(|i| {
                let p = &mut self.peers[i];
                !p.engine.is_empty() || matches!(p.link.peek(), Ok(Some(_)))
            })
            || !self.new_peers.is_empty()
            || !self.evq.is_empty();
        if busy {
            self.finish_wait();
        }
        !busy
    }

    /// Withdraws the doorbell requests of [`Endpoint::prepare_wait`].
    pub fn finish_wait(&mut self) {
        self.evq.disarm_sleep();
        self.board.disarm_sleep();
        for &i in &self.ready.armed {
            if let Some(shm) = self.peers[i].link.shm_mut() {
                shm.rx.disarm_sleep();
                shm.tx.disarm_wait();
            }
        }
    }

    /// The endpoint's file descriptor, level-triggered: readable when a message,
    /// connection or peer failure may be pending. For poll/epoll/select: call
    /// [`Endpoint::prepare_wait`] before blocking on it and `progress` after
    /// (`prepare_wait` also puts the UDP peers' own sockets in the set it reports on:
    /// until the endpoint first sleeps or prepares to, only its progress passes read
    /// them).
    pub fn fd(&self) -> RawFd {
        self.epoll.raw()
    }

    /// Progresses until no live network link has data its peer has not taken (bounded by
    /// [`LINGER`]), waiting as any wait does (spin, then sleep until a datagram or a
    /// retransmission timer): a peer that has gone never acknowledges, and spinning out
    /// the whole bound burned a core for it.
    fn linger(&mut self) {
        let pending = |ep: &Endpoint| ep.peers.iter().any(|p| p.alive && p.link.has_unsent());
        // A timeout is the bound doing its job: close goes on regardless.
        let _ = self.wait_until(Some(LINGER), |ep| !pending(ep));
    }

    /// Says goodbye to every peer: queued frames are flushed as far as the rings take
    /// them, then a `Close` frame tells each peer, after everything sent before it, that
    /// requests towards this endpoint fail. Local requests fail with `PeerDead`. Dropping
    /// the endpoint does the same (and its peers would see the socket hang up anyway).
    pub fn close(&mut self) {
        for i in 0..self.peers.len() {
            if !self.peers[i].alive {
                continue;
            }
            self.flush(i);
            let p = &mut self.peers[i];
            if p.txq.is_empty() {
                if let Link::Udp(u) = &mut p.link {
                    // The goodbye must not overtake the ack of a transfer received:
                    // the peer fails its sends towards us when the goodbye arrives.
                    u.conn.ack_with_next_data();
                }
                p.link.try_send(&Frame::Close);
            }
        }
        // Over the network, the goodbye must be delivered before the links go quiet.
        self.linger();
        for i in 0..self.peers.len() {
            if self.peers[i].alive {
                self.peers[i].closing = true;
                self.fail_peer(i, format!("{} closed locally", PeerId(i as u32)));
            }
        }
    }
}

/// Accepts new connections and completes the handshake of those whose hello has arrived,
/// without ever waiting for one: a connection that stays silent cannot stall the endpoint.
/// Silent ones are dropped after the connect timeout.
fn handshake_incoming(
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
        let ready = sys::poll_readable(s.raw(), Duration::ZERO).unwrap_or(true);
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

/// The state a CMA rendezvous receive of `status` into a `cap`-byte buffer ends in, given
/// how its reads went.
fn cma_outcome(src: PeerId, status: Status, cap: u64, read: std::io::Result<()>) -> RecvState {
    RecvState::Done(match read {
        Ok(()) => receive_result(status, cap),
        Err(e) => Err(Error::Io {
            what: format!("reading rendezvous message from {src}"),
            source: e,
        }),
    })
}

/// The protocol error for a peer's frame naming a send (or its receive) that does not
/// exist or is not in the state the frame needs.
fn bad_send_ref(peer: PeerId, send_id: u64, what: &'static str) -> Error {
    Error::Proto {
        peer,
        source: clink_proto::ProtoError::OutOfRange {
            what,
            value: send_id,
            limit: 0,
        },
    }
}

/// The outcome of a receive whose bytes are all in: its status, or `Truncated` when the
/// message was longer than the `cap`-byte buffer (which holds its head).
fn receive_result(status: Status, cap: u64) -> Result<Status> {
    if status.len > cap {
        Err(Error::Truncated {
            len: status.len,
            capacity: cap,
        })
    } else {
        Ok(status)
    }
}

/// Copies an eager message into a receive buffer: its status, or `Truncated` (with the
/// buffer holding the first bytes) when it is longer than the buffer.
fn copy_eager(src: PeerId, tag: u64, data: &[u8], buf: &mut [u8]) -> Result<Status> {
    let n = data.len().min(buf.len());
    buf[..n].copy_from_slice(&data[..n]);
    let status = Status {
        peer: src,
        tag,
        len: data.len() as u64,
    };
    receive_result(status, buf.len() as u64)
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Rendezvous sends still point into memory we are about to free: nothing to do
        // for the peer (it will see our socket close and fail its receive).
        // A split rendezvous's sender may still write into its receive buffer: leak it
        // rather than let the allocator hand that memory out again.
        for op in self.recvs.values_mut() {
            if let (RecvState::Split { .. }, RecvBuf::Owned(v)) = (&op.state, &mut op.buf) {
                std::mem::forget(std::mem::take(v));
            }
        }
        self.close();
    }
}

enum InPlaceData {
    Ring(usize, Rx),
    Owned(Vec<u8>),
}

/// A received small message read in place from the sender's ring (zero copies), or an
/// owned buffer when the message could not be read in place. The ring space is freed when
/// the guard is dropped; until then the sender's later messages queue behind it.
pub struct InPlace<'a> {
    ep: &'a mut Endpoint,
    status: Status,
    data: InPlaceData,
}

impl InPlace<'_> {
    /// Who sent what.
    pub fn status(&self) -> Status {
        self.status
    }
}

impl std::ops::Deref for InPlace<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            InPlaceData::Ring(i, r) => &self.ep.peers[*i].link.frame(*r)[EAGER_HEADER..],
            InPlaceData::Owned(v) => v,
        }
    }
}

impl Drop for InPlace<'_> {
    fn drop(&mut self) {
        if let InPlaceData::Ring(i, r) = self.data {
            let p = &mut self.ep.peers[i];
            self.ep.stats.frames_received += 1;
            if p.release(r) {
                p.link.wake();
            }
        }
    }
}

/// Space claimed in a peer's ring for one eager message ([`Endpoint::claim`]): write the
/// message into [`SendSlot::buf`], then [`SendSlot::commit`]. Dropping it uncommitted
/// abandons the message.
pub struct SendSlot<'a> {
    ep: &'a mut Endpoint,
    peer: usize,
    res: Option<crate::transport::shm::ring::Reservation>,
    /// Over the network: the message's own buffer, sent on commit.
    owned: Option<Vec<u8>>,
    len: usize,
    tag: u64,
}

impl Drop for SendSlot<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.res.take() {
            if let Some(shm) = self.ep.peers[self.peer].link.shm_mut() {
                shm.tx.abandon(r);
            }
        }
    }
}

impl SendSlot<'_> {
    /// The message bytes, in the peer's ring.
    pub fn buf(&mut self) -> &mut [u8] {
        if let Some(v) = &mut self.owned {
            return v;
        }
        let Some(shm) = self.ep.peers[self.peer].link.shm() else {
            return &mut [];
        };
        let Some(r) = &self.res else { return &mut [] };
        let idx = r.idx(shm.tx.mem().cap());
        // SAFETY: the reservation owns EAGER_HEADER + len bytes of this record.
        unsafe {
            std::slice::from_raw_parts_mut(shm.tx.mem().payload(idx).add(EAGER_HEADER), self.len)
        }
    }

    /// Publishes the message.
    pub fn commit(mut self) {
        if let Some(v) = self.owned.take() {
            let peer = PeerId(self.peer as u32);
            // The peer may have died meanwhile: its requests fail, and so does this one,
            // silently as a ring commit would (the caller learns it from the next call).
            if let Ok(req) = self
                .ep
                .start_send(peer, self.tag, SendData::Owned(v.into()))
            {
                self.ep.detach_send(req);
            }
            return;
        }
        let Some(r) = self.res.take() else { return };
        let Some(shm) = self.ep.peers[self.peer].link.shm_mut() else {
            return;
        };
        let idx = r.idx(shm.tx.mem().cap());
        let mut hdr = [0u8; EAGER_HEADER];
        Frame::encode_eager_header(self.tag, &mut hdr);
        // SAFETY: the reservation owns the record's first EAGER_HEADER bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(hdr.as_ptr(), shm.tx.mem().payload(idx), EAGER_HEADER)
        };
        if shm.commit(r) {
            self.ep.stats.doorbells += 1;
        }
        self.ep.stats.frames_sent += 1;
        self.ep.stats.eager_sends += 1;
        self.ep.stats.eager_bytes += self.len as u64;
    }
}

/// Two endpoints made with `cfg_a` and `cfg_b` and connected (the second connects to
/// the first, from another thread, while the first accepts), with each one's id for the
/// other: for the transports' in-crate tests.
#[cfg(test)]
fn connected_pair(
    cfg_a: crate::Config,
    cfg_b: crate::Config,
) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
    let mut a = crate::Context::with_config(cfg_a)
        .unwrap()
        .endpoint()
        .unwrap();
    let addr = a.address();
    let client = std::thread::spawn(move || {
        let mut b = crate::Context::with_config(cfg_b)
            .unwrap()
            .endpoint()
            .unwrap();
        let p = b.connect(&addr).unwrap();
        (b, p)
    });
    let pa = a.accept(Some(Duration::from_secs(10))).unwrap();
    let (b, pb) = client.join().unwrap();
    ((a, pa), (b, pb))
}
