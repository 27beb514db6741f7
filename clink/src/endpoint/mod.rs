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
//!
//! Where things are: [`peers`] (connect, accept, failing a peer), [`send`] and [`recv`]
//! (the calls and their requests), [`protocol`] (handling each frame: eager, rendezvous,
//! CMA, pipeline, cancel), [`progress`] (one pass over the links), [`wait`] (spinning,
//! sleeping, the endpoint's fd); per transport [`net`] (UDP), [`tcp`] and [`link`]; [`rma`]
//! for apertures, one-sided operations and tripwires; [`ready`] for the ready board.

use crate::context::{eager_threshold, pipeline_chunk, rendezvous_method, CtxInner};
use crate::error::{io_err, Error, Result};
use crate::events::{self, Event, EventQueue};
use crate::lease::{Dst, RecvBuf, SendBuf};
use crate::stats::Stats;
use crate::sys::{self, Epoll, SeqPacket};
use crate::transport::shm::board::Board;
use crate::transport::shm::ring::RingMem;
use crate::transport::shm::{Local, ShmPeer, Wake};
use crate::transport::tcp::TcpTransport;
use crate::transport::udp::UdpTransport;
use bytes::Bytes;
use clink_proto::addr::Address;
use clink_proto::matching::Selector;
use clink_proto::msg::{self, Arrived};
use clink_proto::wire::{Frame, EAGER_HEADER};
use clink_proto::PeerId;
use link::{Link, Rx};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[allow(unsafe_code)]
mod lend;
mod link;
pub(crate) mod net;
mod net_connect;
mod peers;
mod progress;
mod protocol;
mod ready;
mod recv;
mod rma;
mod send;
mod tcp;
mod wait;

use msg::copy_eager;
pub use peers::Joined;
pub use recv::InPlace;
pub use send::SendSlot;

const TOK_DOORBELL: u64 = 0;
const TOK_LISTENER: u64 = 1;
/// Epoll token of connections whose hello has not arrived yet.
const TOK_INCOMING: u64 = 2;
/// Epoll token of the UDP sockets of peers and steered streams.
const TOK_UDP: u64 = 3;
/// Epoll token of the main UDP socket (handshakes, peers without a socket of their own):
/// the others' readiness does not make a wake-up read it.
const TOK_UDP_MAIN: u64 = u64::MAX - 3;
/// Longest `close` waits for its goodbyes to reach network peers (and the slice of its
/// waits for what is queued before them).
const LINGER: Duration = Duration::from_millis(200);
const TOK_PEER0: u64 = 4;
/// Frames handled per peer per progress pass, so one busy peer cannot starve the others.
const RX_BUDGET: usize = 64;
/// Capacity of the event queue: of the endpoint's own events (beyond, they spill in
/// order) and of other threads' posts (beyond, a post is refused); see [`crate::events`].
const EVENT_QUEUE_CAP: usize = 4096;
/// Events `wait_event`'s fast path may return in a row before a full progress pass.
const FAST_STREAK: u32 = 64;
/// The longest sleep on a peer's futex: neither the listener nor the peer's socket is
/// watched meanwhile, so this bounds how long a connecting process waits for its welcome
/// and how late the peer's death (its tether hung up) is seen; an idle receiver wakes
/// this often to look.
const FUTEX_SLEEP_MAX: Duration = Duration::from_millis(10);

pub use clink_proto::msg::Status;

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

impl crate::Context {
    /// Creates an endpoint listening for peers.
    pub fn endpoint(&self) -> Result<Endpoint> {
        Endpoint::new(self.inner.clone())
    }
}

// An endpoint moves between threads with everything it holds (it is `Send`, not `Sync`).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Endpoint>();
};

/// A send request's protocol state (see [`clink_proto::msg`]).
type SendState = msg::SendState<Error>;

type SendOp = msg::SendReq<SendBuf, Error>;

/// A receive request's protocol state (see [`clink_proto::msg`]).
type RecvState = msg::RecvState<Error>;

type RecvOp = msg::RecvReq<RecvBuf, Error>;

struct Peer {
    link: Link,
    /// How the connection was made.
    joined: Joined,
    alive: bool,
    eager_max: u64,
    /// What waits for the link, in order ([`msg::TxQueue`]).
    txq: msg::TxQueue,
    /// The rendezvous protocol's state with this peer (receives in progress, sends going
    /// out in chunks, the measured choice of method).
    rndv: msg::Rendezvous,
    /// The ring's head holds a message no receive wants yet (left in place).
    blocked: bool,
    /// The copy engine's queue of this peer's large one-sided requests (and the requests
    /// behind them).
    engine: rma::EngineQueue,
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
    #[inline]
    fn release(&mut self, nets: &mut link::Nets, i: usize, rx: Rx) -> bool {
        self.announced = false;
        self.link.release(nets, i, rx)
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
        if !self.txq.is_empty() || !self.rndv.chunks.is_empty() || !self.engine.is_empty() {
            return Err(());
        }
        let Some(s) = self.link.shm_mut() else {
            return Err(());
        };
        s.rx.peek().map(|r| r.map(Rx::Ring)).map_err(|_| ())
    }

    /// For the receive fast paths (`recv_fast`, `poll_recvs`, `poll_eager`): the eager
    /// message at the head of a quiet ring ([`Peer::quiet_head`]) as (record, tag, bytes);
    /// `Err(())` for any other frame there, as for what `quiet_head` refuses. (Inlined into
    /// each: out of line, its call showed in their instruction counts.)
    #[inline(always)]
    fn quiet_eager(&mut self) -> std::result::Result<Option<EagerHead<'_>>, ()> {
        let Some(rec) = self.quiet_head()? else {
            return Ok(None);
        };
        let Rx::Ring(r) = rec else {
            return Err(());
        };
        let Some(s) = self.link.shm() else {
            return Err(());
        };
        match Frame::parse(s.record_bytes(r)) {
            Ok(Frame::Eager { tag, data }) => Ok(Some((rec, tag, data))),
            _ => Err(()),
        }
    }
}

/// An eager message at the head of a ring: its record, tag and bytes.
type EagerHead<'a> = (Rx, u64, &'a [u8]);

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
    /// The endpoint a `connect` under way is for: a connection it accepts from that one
    /// meanwhile crossed it ([`Joined::crossed`]).
    connecting: Option<u128>,
    /// Accepted connections waiting for their hello, with their arrival time.
    incoming: Vec<(SeqPacket, Instant)>,
    /// The requests, their states and buffers ([`clink_proto::msg::Requests`]).
    req: msg::Requests<SendBuf, RecvBuf, Error>,
    /// The rendezvous protocol's actions being carried out, and those their completions
    /// ask for (kept for their allocations).
    acts: Vec<msg::Action<Error>>,
    acts_more: Vec<msg::Action<Error>>,
    stats: Stats,
    /// Progress passes made (wrapping): every 64th looks at the clock for the liveness
    /// check.
    passes: u32,
    /// When the epoll set was last looked at (liveness, connections).
    last_check: Instant,
    /// Events `wait_event`'s fast path returned since the last progress pass (it gives
    /// way to a pass after [`FAST_STREAK`]).
    fast_streak: u32,
    /// Calls of [`Endpoint::poll_recvs`] (wrapping): every 64th leaves it to a pass.
    fast_polls: u32,
    events: Vec<u64>,
    last_error: Option<String>,
    /// The network transports and their links.
    nets: link::Nets,
    /// Some UDP connection is marked awaited ([`Endpoint::mark_awaited`]).
    awaiting: bool,
    /// Whether waits spin before they sleep: closed for a while after spins keep failing
    /// (see [`clink_proto::spin`]).
    spin_gate: clink_proto::spin::SpinGate,
    /// Whether the UDP transport's extra sockets (peers' own, steered) are in the epoll
    /// set: from the first sleep or [`Endpoint::prepare_wait`] on, not before (see
    /// `Endpoint::watch_udp`).
    udp_watched: bool,
    /// Apertures, exports, tripwires and one-sided requests.
    rma: rma::RmaState,
    /// The event queue.
    evq: EventQueue,
    /// Our activity board and which peers a progress pass visits.
    board: Board,
    ready: ready::Ready,
    /// How many same-host peers the application expects ([`Endpoint::expect_peers`]).
    expected_peers: usize,
}

impl Endpoint {
    pub(crate) fn new(ctx: Arc<CtxInner>) -> Result<Endpoint> {
        let local_peers = ctx.local_peers;
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
            connecting: None,
            incoming: Vec::new(),
            req: msg::Requests::default(),
            acts: Vec::new(),
            acts_more: Vec::new(),
            stats: Stats::default(),
            passes: 0,
            last_check: Instant::now(),
            fast_streak: 0,
            fast_polls: 0,
            events: Vec::with_capacity(32),
            last_error: None,
            nets: link::Nets { udp: net, tcp },
            awaiting: false,
            spin_gate: clink_proto::spin::SpinGate::new(),
            udp_watched: false,
            rma: rma::RmaState::default(),
            evq: EventQueue::new(EVENT_QUEUE_CAP),
            board: Board::new()?,
            ready: ready::Ready::default(),
            expected_peers: local_peers,
        })
    }

    /// The printable address other processes pass to [`Endpoint::connect`].
    pub fn address(&self) -> String {
        Address {
            host: self.ctx.host,
            id: self.id,
            shm: Some(self.sock_name.clone()),
            udp: (self.nets.udp.as_ref()).map_or(Vec::new(), |n| n.advertised().to_vec()),
            tcp: (self.nets.tcp.as_ref()).map_or(Vec::new(), |t| t.advertised().to_vec()),
        }
        .to_string()
    }

    /// Counters since creation.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        (s.spins_failed, s.spin_closures) = self.spin_gate.counts();
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
            connecting: self.connecting,
            config: crate::transport::shm::ShmConfig {
                any_uid: self.ctx.config.any_uid,
                cma: self.ctx.config.cma,
                connect_timeout: self.ctx.config.connect_timeout,
            },
        }
    }

    fn check_fork(&self) -> Result<()> {
        if sys::getpid() != self.ctx.pid {
            return Err(Error::Forked(self.ctx.pid));
        }
        Ok(())
    }

    /// This endpoint's identity (the `id` of its address).
    pub fn endpoint_id(&self) -> u128 {
        self.id
    }

    // ---------------------------------------------------------------- sending

    // ---------------------------------------------------------------- receiving

    /// The word a pending receive was posted with ([`Endpoint::irecv_raw_user`]; 0 for the
    /// other receives), `None` once it is gone.
    pub fn recv_user(&self, req: u64) -> Option<u64> {
        self.req.recvs.get(&req).map(|op| op.user)
    }

    // ---------------------------------------------------------------- progress

    // ---------------------------------------------------------------- waiting

    /// Says goodbye to every peer: what is queued towards each is delivered first (frames
    /// waiting for room in a ring or a link, bytes a network link holds) for as long as
    /// the peers keep taking it (it gives up on a peer that takes nothing for
    /// `CLINK_NET_DEAD_MS`), then a `Close` frame tells each peer, after everything sent
    /// before it, that requests towards this endpoint fail. Local requests fail with
    /// `PeerDead`. Dropping the endpoint does the same (and its peers would see the
    /// socket hang up anyway). Over UDP what a connection's window holds back after a
    /// non-blocking send (a blocking one returns once nothing is held back) and the
    /// fragments of large messages go only while the endpoint is driven (the keepalive
    /// thread repeats only the small datagrams sent and not acknowledged): a process that
    /// sends its last message so and then waits outside clink (for a child to exit, say)
    /// closes first.
    pub fn close(&mut self) {
        for i in 0..self.peers.len() {
            if self.peers[i].alive {
                self.flush(i);
            }
        }
        self.linger(self.close_stall());
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if !p.alive || !p.txq.is_empty() {
                continue;
            }
            if let Some(u) = link::udp_mut(&mut self.nets, i) {
                // The goodbye must not overtake the ack of a transfer received: the
                // peer fails its sends towards us when the goodbye arrives.
                u.ack_with_next_data();
            }
            p.link.try_send(&mut self.nets, i, &Frame::Close);
        }
        // Over the network, the goodbye must be delivered before the links go quiet.
        self.linger(LINGER);
        for i in 0..self.peers.len() {
            if self.peers[i].alive {
                self.peers[i].closing = true;
                self.fail_peer(i, format!("{} closed locally", PeerId(i as u32)));
            }
        }
    }

    /// How long `close` waits for a peer that takes nothing of what is queued for it: the
    /// network's liveness timeout (a peer that silent is declared dead meanwhile).
    fn close_stall(&self) -> Duration {
        let c = &self.ctx.config;
        let udp = c.udp.as_ref().map(|u| u.dead_after);
        let tcp = c.tcp.as_ref().map(|t| t.dead_after);
        udp.into_iter()
            .chain(tcp)
            .max()
            .unwrap_or(LINGER)
            .max(LINGER)
    }
}

impl Endpoint {
    /// Releases frame `rec` of peer `i` once handled: counted, and the peer woken when it
    /// waits for room in its ring.
    #[inline(always)]
    fn release_frame(&mut self, i: usize, rec: Rx) {
        self.stats.frames_received += 1;
        if self.peers[i].release(&mut self.nets, i, rec) {
            self.peers[i].link.wake();
            self.stats.doorbells += 1;
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Rendezvous sends still point into memory we are about to free: nothing to do
        // for the peer (it will see our socket close and fail its receive).
        // A split rendezvous's sender may still write into its receive buffer: leak it
        // rather than let the allocator hand that memory out again.
        for op in self.req.recvs.values_mut() {
            if let (RecvState::Split { .. }, RecvBuf::Owned(v)) = (&op.state, &mut op.buf) {
                std::mem::forget(std::mem::take(v));
            }
        }
        self.close();
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
