//! Sans-IO reliable datagram protocol: one [`Conn`] per peer.
//!
//! A `Conn` turns tagged messages of any size into datagrams of at most
//! [`Config::mtu_payload`] payload bytes and back, over a network that may lose, reorder,
//! duplicate and corrupt them. It does no I/O and reads no clock: the caller passes `now`
//! (nanoseconds on any monotonic clock) and moves the bytes, in the quinn-proto style:
//!
//! - [`Conn::send`] queues a message;
//! - [`Conn::handle_datagram`] takes a received datagram;
//! - [`Conn::poll_transmit`] yields the next datagram to send (call it until `None` after
//!   every other call);
//! - [`Conn::poll_timeout`] says when [`Conn::handle_timeout`] must be called next;
//! - [`Conn::poll_event`] yields delivered messages, send completions and peer death.
//!
//! # Design
//!
//! **Sequencing.** Every data datagram has a packet number (pn), consecutive per
//! connection; a message's fragments take consecutive pns, so in-order delivery by pn is
//! in-order delivery of messages, and reassembly is an append. A retransmission reuses its
//! pn (Karn's rule keeps RTT samples honest: only packets sent once are timed).
//!
//! **Why cumulative + selective acks.** The cumulative ack (`cum`: every pn below was
//! received) is one number that survives any loss of earlier acks and lets the sender free
//! its buffer in order. Alone it stalls on a loss: everything above a hole looks unacked.
//! The SACK ranges (at most [`packet::MAX_RANGES`]) say exactly which packets above the hole
//! arrived, so only the missing ones are resent, and they give the loss detector its
//! signal: a packet is declared lost when a packet *transmitted* `dup_thresh` transmissions
//! after it was acked (RACK-like, so lost retransmissions are detected too), provided the
//! acks have reported on it: with more holes than an ack has ranges for, the packets above
//! its last range are unknown, not missing (declaring them lost, at 1% loss across the
//! veth pair, tripped the loss-rate test 54-83 times per 500 MiB). On top, the
//! receiver sends a **NAK** the moment it sees a new gap (fast retransmit without waiting
//! for three acks); a lost NAK costs nothing because SACK and the retransmission timer
//! still cover the hole. Holes that only a probe revealed (a resend of a packet still in
//! flight, which can overtake the flight) are believed after a wait
//! (`promote_probe_acks`). The timer (RTO) follows RFC 6298 (SRTT/RTTVAR, plus the peer's
//! ack delay) with exponential backoff, reset by any progress.
//!
//! **Why credits and a congestion window.** They answer different questions. Credits
//! (the `limit` in every ack: "you may send pns below this") protect the *receiver*: it
//! never has to hold more than its window of out-of-order packets plus its byte budget of
//! undelivered messages, so memory is bounded whatever the sender does; datagrams beyond the
//! window are dropped and counted. The congestion window protects the *network*: packets in
//! flight are capped by `cwnd`, which grows by one per acked packet in slow start, by one
//! per window afterwards (additive increase) while the RTT shows a queue (without one, by
//! one per acked packet still: see below), and is halved once per window of data on a
//! congestion loss (multiplicative decrease, NewReno-like), and drops to 2 on a timeout, so
//! a flow backs off under congestion and shares a bottleneck with TCP. **Which losses are
//! congestion.** A drop-tail queue fills, and the RTT grows, before it drops; random loss
//! (a flaky link, the injected faults here) comes with neither. So a loss cuts the window
//! only when the smoothed RTT (without the peer's ack delay, which each ack reports) is
//! at least [`Config::congestion_rtt_factor`] times the minimum and
//! [`Config::congestion_queue_floor`] above it, or when the last two
//! rounds had more loss events than [`Config::congestion_loss_pct`] of their packets (a
//! queue too shallow to show in the RTT; a run of consecutive packets lost together is
//! one event: a link that drops one segmentation-offload batch takes dozens of datagrams
//! at once); other losses are only resent. NewReno, cutting on every
//! loss, held goodput at 1% random loss to 0.18x lossless in the simulator and 0.02x
//! across the veth pair; a flow at a full queue (TCP's, or its own) still halves as TCP
//! does. (TCP Veno's packet-count test of the queue was tried first, then the factor
//! alone: busy-polling across the veth pair the RTT is 11 us idle and 45-100 us while
//! streaming, from the sender's own 64 KB batches, with no queue at all; both called
//! most losses congestion.) The same test of the RTT decides how a window grows above
//! the slow-start threshold: while the smoothed RTT shows no queue it grows by every
//! packet acked, as in slow start, because the link has room; one packet per window
//! starts only once a queue shows. A window halved by the losses that did look like
//! congestion (a burst of them, or a moment of queue) otherwise took hundreds of round
//! trips to regrow on a fast path with random loss, holding its stream far below what the
//! path carries. A shaped link's queue shows and keeps additive increase. **Slow start
//! ends at a queue**, as HyStart ends TCP's: once the window holds at least
//! [`Config::slow_start_floor`] packets and the same test shows a queue, the threshold
//! comes down to the window, which from there grows by one per window while the queue
//! lasts. Without it a lossless path never left slow start, and the window ran to
//! [`Config::max_cwnd`]: 16 MiB queued in the receiver's socket across the veth pair
//! (a smoothed RTT of 5 ms against 15-40 us idle), data that went cold in the caches
//! between the sender's copy and the receiver's, and a small message behind it waited the
//! whole queue. A sender sends a new packet only
//! when both allow it. When the credit is exhausted and nothing is in flight, the RTO timer
//! sends a ping as a window probe so a lost window update cannot deadlock.
//!
//! **Unreliable mode** ([`Config::reliable`] false, BCL-4's option): the same sequencing,
//! acks and congestion control, but lost packets are abandoned instead of resent. The
//! sender's `floor` (in data and ping datagrams: "everything below is acked or abandoned")
//! tells the receiver to stop waiting for holes; a message with a missing fragment is
//! dropped and counted. Nothing is ever delivered twice or damaged.
//!
//! **Liveness.** With keepalives on, an idle side pings after [`Config::keepalive`] of
//! silence and the peer answers with an ack. After [`Config::dead_after`] without any valid
//! datagram while data is outstanding (or keepalives are on), [`Event::PeerDead`] is emitted
//! once and the connection stops sending.
//!
//! **Copies.** `send` copies the message once into a shared buffer (retransmissions borrow
//! it); encoding copies each fragment into the datagram. On receipt an in-order fragment is
//! copied once into the message buffer (a single-fragment message once into its own);
//! an out-of-order one is copied once more into the receive window.
//!
//! Where things are: `send.rs` (queuing, choosing and building packets, processing acks),
//! `receive.rs` (admitting datagrams, reassembly, the acks owed), `recovery.rs` (timers,
//! probes, liveness, loss), [`packet`] (the datagram format), `ranges.rs` (received ranges),
//! `repeat.rs` (what the runtime repeats for a caller that is away).
//!
//! `Conn` is `Send` and `Sync` (plain owned data; shared message buffers are `Arc`s) and is
//! driven by one thread at a time through `&mut self`.

pub mod packet;
mod ranges;
mod receive;
mod recovery;
mod repeat;
mod rtt;
mod send;
mod slots;
mod spares;

use rtt::Rtt;
use slots::Slots;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::admission::{Asker, AskerConfig, Mode};

use thiserror::Error;

pub use packet::{
    AckInfo, Admit, BulkContext, BulkHeader, DataHeader, Datagram, Handshake, PacketError,
};
pub use repeat::Repeat;

/// Identifies a message sent on one connection (consecutive from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId(pub u64);

/// Tunables of one connection. Times are nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Connection id carried in every datagram; datagrams with another id are dropped.
    pub conn_id: u32,
    /// Largest payload per datagram (path MTU minus IP/UDP headers minus
    /// [`packet::DATA_HEADER`] + [`packet::TRAILER`]). At most [`packet::MAX_PAYLOAD`].
    pub mtu_payload: usize,
    /// Reliable (retransmit) or unreliable (abandon lost packets) delivery.
    pub reliable: bool,
    /// Receive window in packets: the most out-of-order packets held. At most 2^20.
    pub recv_window: u64,
    /// Byte budget for delivered messages not yet taken with [`Conn::poll_event`]; credit
    /// shrinks as it fills.
    pub recv_buffer_bytes: usize,
    /// Byte budget for messages queued by [`Conn::send`] and not yet acknowledged.
    pub send_buffer_bytes: usize,
    /// Largest message accepted (sent or received).
    pub max_message_len: u32,
    /// Congestion window at start, in packets.
    pub initial_cwnd: u64,
    /// Largest congestion window, in packets.
    pub max_cwnd: u64,
    /// Slow start ends at a queue only once the window holds this many packets (see the
    /// module docs): below it, a queue that the RTT shows is the batching and scheduling
    /// of a few bursts, not a link that is full.
    pub slow_start_floor: u64,
    /// Retransmission timeout before any RTT sample.
    pub initial_rto: u64,
    /// Smallest retransmission timeout.
    pub min_rto: u64,
    /// Largest retransmission timeout (after backoff).
    pub max_rto: u64,
    /// Longest the receiver delays an ack.
    pub ack_delay: u64,
    /// The receiver acks at once after this many new packets.
    pub ack_every: u32,
    /// Reordering tolerance: a packet is lost when one transmitted this many later is acked.
    pub dup_thresh: u64,
    /// Bulk fragments and the other packets reach the peer by two paths that reorder them
    /// (a receive ring takes the small packets before the kernel has queued on the socket
    /// the fragments sent ahead of them): a packet is then lost only when one of its own
    /// kind transmitted `dup_thresh` later is acked.
    pub split_paths: bool,
    /// A loss is congestion (the window is cut) when the smoothed RTT is at least this
    /// many times the minimum RTT, and at least [`Config::congestion_queue_floor`] above
    /// it: a queue has built. 0: every loss is congestion (NewReno). See the module docs.
    pub congestion_rtt_factor: u64,
    /// The least queueing delay (smoothed RTT minus minimum) that counts as a queue, ns:
    /// batching and scheduling alone inflate a short RTT several times.
    pub congestion_queue_floor: u64,
    /// A loss is congestion when the last two rounds had more loss events (runs of
    /// consecutive packets lost) than this percentage of the packets they sent (and at
    /// least 3; a round counts at least 128 packets, so that a few random losses in a
    /// short round do not look like congestion).
    pub congestion_loss_pct: u64,
    /// Silence after which the peer is declared dead.
    pub dead_after: u64,
    /// Silence after which a ping is sent; 0 disables keepalives.
    pub keepalive: u64,
    /// While the caller awaits something from the peer ([`Conn::set_awaited`]): silence
    /// after which a ping is sent, doubling while pings go unanswered, up to
    /// [`Config::keepalive`]. A peer whose process died is then found within about this
    /// long (its host answers the ping with "port unreachable"). 0: no such pings.
    pub await_probe: u64,
    /// Fragments of a bulk transfer sent as one group (one GSO send, one speculative
    /// receive entry): a new group starts only when the congestion window and the credit
    /// have room for all of it, so groups stay aligned to multiples of this many fragments
    /// from the transfer's start. 1 disables grouping.
    pub bulk_group: u64,
    /// Admission control of this side's bulk stream ([`crate::admission`]); off by
    /// default here (every bulk stream fast), implicit by default in the UDP transport.
    pub admission: AskerConfig,
    /// Bulk fragments in flight at most while the stream is not granted (the seed's slow
    /// mode: it keeps going without disturbing the granted stream).
    pub slow_window: u64,
    /// Experiment knob, off by default: send each bulk group's fragments out of order
    /// (see [`misordered`]: neighbours swapped in pairs, an odd group's last three
    /// rotated), so that no fragment arrives in the slot a receiver's speculation armed for
    /// it and every one takes the cleanup path (the seed's fallback penalty). Groups stay
    /// whole and the data arrives intact; only the order within a group changes.
    pub bulk_misorder: bool,
    /// Bulk payloads are hashed end to end, both ways ([`packet::BulkHeader::hashed`]):
    /// this side hashes the payloads it sends and drops (as malformed) a bulk datagram
    /// that arrives unhashed. When false, it sends them unhashed, left to the UDP checksum
    /// (headers are always checked), and takes either kind.
    pub payload_hash: bool,
}

impl Default for Config {
    /// Figures for a LAN or a veth pair with a 1500-byte MTU.
    fn default() -> Self {
        Config {
            conn_id: 0,
            mtu_payload: 1472 - packet::DATA_HEADER - packet::TRAILER,
            reliable: true,
            recv_window: 1024,
            recv_buffer_bytes: 16 << 20,
            send_buffer_bytes: 64 << 20,
            max_message_len: 1 << 30,
            initial_cwnd: 10,
            max_cwnd: 4096,
            slow_start_floor: 64,
            initial_rto: 20_000_000,
            min_rto: 1_000_000,
            max_rto: 1_000_000_000,
            ack_delay: 200_000,
            ack_every: 2,
            dup_thresh: 3,
            split_paths: false,
            congestion_rtt_factor: 4,
            congestion_queue_floor: 500_000,
            congestion_loss_pct: 5,
            dead_after: 2_000_000_000,
            keepalive: 500_000_000,
            await_probe: 20_000_000,
            bulk_group: 1,
            admission: AskerConfig {
                mode: Mode::Off,
                ..AskerConfig::default()
            },
            slow_window: 4,
            bulk_misorder: false,
            payload_hash: true,
        }
    }
}

impl Config {
    /// Payload bytes of a bulk fragment: a data datagram's [`Config::mtu_payload`] plus
    /// what the bulk header saves on the data header and trailer, so both fill the same
    /// datagram size (at most [`packet::MAX_PAYLOAD`]). Both ends derive it from the
    /// `mtu_payload` they agreed on.
    pub fn bulk_payload(&self) -> usize {
        bulk_payload(self.mtu_payload)
    }
}

/// [`Config::bulk_payload`] for a data payload of `mtu_payload` bytes.
pub fn bulk_payload(mtu_payload: usize) -> usize {
    (mtu_payload + packet::DATA_HEADER + packet::TRAILER - packet::BULK_HEADER)
        .min(packet::MAX_PAYLOAD)
}

/// Why [`Conn::send`] refused a message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Longer than [`Config::max_message_len`].
    #[error("message of {len} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Message length.
        len: usize,
        /// The limit.
        limit: u32,
    },
    /// The send buffer is full; retry after [`Event::Acked`] events.
    #[error("send buffer full")]
    BufferFull,
    /// The peer was declared dead.
    #[error("peer dead")]
    PeerDead,
    /// A bulk transfer of zero bytes (send it as a message).
    #[error("empty bulk transfer")]
    EmptyBulk,
    /// A bulk transfer of [`packet::MAX_BULK_OFFSET`] bytes or more (256 TiB: its
    /// datagrams' offsets have 48 bits).
    #[error("bulk transfer of {0} bytes exceeds 2^48")]
    BulkTooLarge(u64),
}

/// Why [`Conn::handle_datagram`] dropped a datagram (each is also counted in [`Stats`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RecvError {
    /// The bytes are not a valid datagram (includes a failed checksum).
    #[error(transparent)]
    Packet(#[from] PacketError),
    /// A valid datagram of another connection.
    #[error("datagram for connection {0}")]
    WrongConnection(u32),
    /// Well-formed but inconsistent with the connection's state (a buggy or forged peer).
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// The connection is dead and takes nothing more.
    #[error("peer dead")]
    PeerDead,
}

/// Something the application must know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A whole message, delivered exactly once and in order.
    Message {
        /// The sender's id of the message.
        id: MsgId,
        /// Its tag.
        tag: u64,
        /// Its bytes.
        data: Vec<u8>,
    },
    /// Every fragment of this sent message was acknowledged (reliable mode only).
    Acked(MsgId),
    /// Every fragment of this bulk transfer was acknowledged (reliable mode only): the
    /// caller's source memory is no longer needed.
    BulkSent(u64),
    /// No datagram from the peer for [`Config::dead_after`]; the connection stopped.
    PeerDead,
    /// The peer asks to send its bulk stream fast (Fast_Req): answer with
    /// [`Conn::answer_admit`] (the receive queue's [`crate::admission::Gate`] decides).
    FastRequest,
    /// The peer gives back grant `grant` or (another id) withdraws its request.
    FastRelease {
        /// The grant given back (0: a request withdrawn).
        grant: u32,
    },
    /// This side's bulk stream was granted (true) or refused / revoked (false).
    Fast {
        /// Granted or not.
        granted: bool,
    },
}

/// Counters of one connection; `cwnd`, `ssthresh`, `srtt_ns`, `rto_ns` and `in_flight`
/// are snapshots taken by [`Conn::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams produced by `poll_transmit`.
    pub datagrams_sent: u64,
    /// Bytes of those datagrams.
    pub bytes_sent: u64,
    /// Bytes of the data datagrams among them that were retransmissions (in
    /// `bytes_sent` too).
    pub bytes_resent: u64,
    /// Datagrams passed to `handle_datagram` that were valid for this connection.
    pub datagrams_received: u64,
    /// Bytes of those datagrams.
    pub bytes_received: u64,
    /// Data datagrams sent, first transmissions and retransmissions.
    pub data_sent: u64,
    /// Data datagrams sent again.
    pub retransmissions: u64,
    /// Ack datagrams sent.
    pub acks_sent: u64,
    /// Acks carried by data datagrams instead (see [`packet::Piggy`]).
    pub acks_piggybacked: u64,
    /// Ack datagrams received.
    pub acks_received: u64,
    /// Nak datagrams sent.
    pub naks_sent: u64,
    /// Nak datagrams received.
    pub naks_received: u64,
    /// Pings sent (keepalives and window probes).
    pub pings_sent: u64,
    /// Data datagrams received that were already received.
    pub duplicates: u64,
    /// Data datagrams received above a hole.
    pub out_of_order: u64,
    /// Data datagrams dropped because they were beyond the receive window.
    pub dropped_window: u64,
    /// Datagrams dropped for a bad checksum.
    pub dropped_corrupt: u64,
    /// Datagrams dropped as malformed or inconsistent (bad magic, version, kind, length,
    /// range, or a protocol violation).
    pub dropped_malformed: u64,
    /// Valid datagrams of another connection.
    pub dropped_stray: u64,
    /// Packets declared lost (by SACK, NAK or timeout).
    pub lost: u64,
    /// Packets abandoned in unreliable mode.
    pub abandoned: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Times the congestion window was reduced.
    pub congestion_events: u64,
    /// Times slow start ended at a queue (the threshold came down to the window).
    pub slow_start_exits: u64,
    /// Tail loss probes sent.
    pub tail_probes: u64,
    /// Timeouts that collapsed the window and proved spurious (the flight arrived, its
    /// acks late): window and threshold restored.
    pub spurious_timeouts: u64,
    /// Packets a timeout declared lost (counted in `lost`) whose one transmission
    /// arrived all the same: acked before any resend, or put back in flight when the
    /// timeout proved spurious. `lost - reprieved` leaves what the loss detector judged
    /// lost and what a timeout condemned and resent before an ack could prove it
    /// delivered.
    pub reprieved: u64,
    /// Window reductions by the loss detector that proved spurious (every packet they
    /// condemned arrived from its first transmission: reordered, not lost): window and
    /// threshold restored.
    pub spurious_cuts: u64,
    /// Times the caller came back from an absence (no call for two keepalive intervals)
    /// and the liveness timeout restarted instead of judging the peer on the gap (the
    /// acks that waited meanwhile take no RTT sample).
    pub absences_excused: u64,
    /// Retransmission timeouts answered with a probe only (the first in a row; counted
    /// in `timeouts` too).
    pub rto_probes: u64,
    /// Losses taken for random link loss (no queue behind them): resent without a
    /// window reduction.
    pub random_losses: u64,
    /// Messages accepted by `send`.
    pub messages_sent: u64,
    /// Messages delivered.
    pub messages_delivered: u64,
    /// Messages dropped incomplete (unreliable mode).
    pub messages_dropped: u64,
    /// Bulk transfers accepted by `send_bulk`.
    pub bulk_transfers: u64,
    /// Times this side's bulk stream was granted fast (Fast_Ack received).
    pub fast_granted: u64,
    /// Times it was refused or revoked (Fast_NAck received).
    pub fast_refused: u64,
    /// New bulk fragments received (placed by the caller, or found in place).
    pub bulk_fragments: u64,
    /// Those whose payload was hashed end to end ([`packet::BulkHeader::hashed`]).
    pub bulk_hashed: u64,
    /// New bulk fragments the caller had no destination for (dropped after their pn was
    /// accepted, so the sender does not resend them).
    pub bulk_discarded: u64,
    /// Congestion window, packets (snapshot).
    pub cwnd: u64,
    /// Slow-start threshold, packets (snapshot).
    pub ssthresh: u64,
    /// Smoothed RTT, ns (snapshot; 0 before a sample).
    pub srtt_ns: u64,
    /// Smallest RTT seen in the current 10-second window, ns (snapshot; 0 before a
    /// sample).
    pub min_rtt_ns: u64,
    /// Current retransmission timeout with backoff, ns (snapshot).
    pub rto_ns: u64,
    /// Packets in flight (snapshot).
    pub in_flight: u64,
}

#[derive(Default)]
struct MsgData {
    id: u64,
    tag: u64,
    data: Vec<u8>,
}

/// What a queued or sent packet carries: part of a message (its bytes owned here), or of
/// a bulk transfer (its bytes in the caller's memory, fetched at each transmission).
#[derive(Clone)]
enum Item {
    Msg(Arc<MsgData>),
    Bulk { xfer: u64, total: u64 },
}

impl Item {
    fn is_bulk(&self) -> bool {
        matches!(self, Item::Bulk { .. })
    }

    fn len(&self) -> u64 {
        match self {
            Item::Msg(m) => m.data.len() as u64,
            Item::Bulk { total, .. } => *total,
        }
    }
}

struct Queued {
    item: Item,
    next_off: u64,
    /// Fragments handed out so far (`next_off` / the fragment size, counted rather than
    /// divided: a 64-bit division per fragment).
    next_seq: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PState {
    InFlight,
    Lost,
    Acked,
    Abandoned,
}

/// What a window reduction by the loss detector changed, kept until the packets it
/// condemned prove it spurious or one of them is resent.
struct CutUndo {
    cwnd: u64,
    ssthresh: u64,
    /// Its number in `Stats::congestion_events` (the packets' `condemned_by`).
    cut: u64,
    /// Packets it condemned whose first transmission is not yet acked.
    unproven: u64,
}

struct Sent {
    item: Item,
    offset: u64,
    len: u32,
    /// A bulk fragment sent first in its group (decided when it was cut: with
    /// [`Config::bulk_misorder`] its offset no longer says).
    opens_group: bool,
    /// The last datagram cut from its item: acknowledging it (after all before it) ends
    /// the item. Not `offset + len == total`, which misorder sends before the end.
    closes_item: bool,
    tx_seq: u64,
    sent_at: u64,
    /// When it was first sent: with [`Sent::timer_only`], the start of a round trip
    /// that its ack still measures (see `on_ack`).
    first_sent_at: u64,
    /// Every transmission after the first was the timers' doing (a tail probe, the
    /// retransmission timer's probe or its condemnation of the flight), none the resend
    /// of a packet that acks or a NAK reported missing.
    timer_only: bool,
    /// Its latest transmission was a probe (a resend of a packet still in flight): its
    /// ack may come from that copy, which can overtake the flight sent before it.
    probe: bool,
    tx_count: u32,
    /// The window reduction (its number in `Stats::congestion_events`) whose loss
    /// detection condemned this packet, while its ack may still prove that reduction
    /// spurious; 0 otherwise.
    condemned_by: u64,
    state: PState,
}

/// A packet received above a hole.
enum Slot {
    /// A message fragment, kept until the hole fills.
    Frag { hdr: DataHeader, payload: Vec<u8> },
    /// A bulk fragment, already at its destination: only its pn is remembered.
    Placed,
}

struct Reasm {
    id: u64,
    tag: u64,
    len: u32,
    buf: Vec<u8>,
}

/// The payload source of [`Conn::poll_transmit_with`]: `(xfer, offset, len)` gives the
/// `len` bytes of transfer `xfer` from `offset`, where they are (`None`: no such transfer
/// or range).
pub type BulkSource<'s> = dyn FnMut(u64, u64, usize) -> Option<&'s [u8]> + 's;

/// One datagram produced by [`Conn::poll_transmit_with`]: `len` bytes appended to the
/// caller's buffer, then `payload` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit<'s> {
    /// Bytes appended to the buffer (a bulk fragment: its header only).
    pub len: usize,
    /// A bulk fragment's payload, where the source keeps it: not copied, so a transport
    /// sends it by a second vector (empty for every other datagram).
    pub payload: &'s [u8],
    /// It opens a bulk group (or is a bulk retransmission): a GSO batcher should start a
    /// new send with it, so the receiver's speculative layout lines up.
    pub group_start: bool,
    /// It is a bulk fragment sent for the first time, which goes to
    /// [`Conn::steered_port`] when there is one. A retransmission is not: it goes to the
    /// peer's main socket, because arriving out of order in the steered one it would
    /// take a receive entry armed for the next group and shift every later group of that
    /// read off its place; so the steered socket sees the stream in order.
    pub bulk: bool,
}

/// Packets sent and lost in the current round trip and the one before (a round ends
/// when a packet sent after it began is acked and it sent at least
/// [`MIN_ROUND_PACKETS`], so that a few random losses in a short round between messages do
/// not read as a loss rate).
const MIN_ROUND_PACKETS: u64 = 128;

#[derive(Default)]
struct Round {
    /// The round ends when a transmission numbered from here on is acked.
    end_tx: u64,
    sent: u64,
    /// Loss events: runs of consecutive packet numbers lost together count once.
    lost: u64,
    /// The last packet number counted lost (a loss of the next one extends its run).
    last_lost: Option<u64>,
    prev_sent: u64,
    prev_lost: u64,
}

/// Tail loss probes without progress before only the retransmission timer is left.
const MAX_PROBES: u32 = 2;
/// Retransmission timeouts in a row that only probe; the next condemns the flight.
const RTO_PROBES: u32 = 3;
/// Most backoff doublings of the retransmission timeout.
const MAX_BACKOFF: u32 = 16;
/// Largest receive window allowed.
const MAX_WINDOW: u64 = 1 << 20;

/// The protocol state of one connection to one peer. See the [module docs](self).
pub struct Conn {
    cfg: Config,
    // --- sender ---
    send_queue: VecDeque<Queued>,
    send_bytes: usize,
    next_msg_id: u64,
    next_pn: u64,
    /// One past the newest message packet (bulk fragments are never repeated: the walk of
    /// [`Conn::repeat_end`]'s callers stops here, not at `next_pn`).
    msg_pn_end: u64,
    snd_una: u64,
    sent: VecDeque<Sent>,
    tx_order: VecDeque<(u64, u64)>,
    next_tx_seq: u64,
    /// The latest transmission acked, per kind of packet (the others, bulk fragments:
    /// [`Config::split_paths`] judges each kind by its own); the later of the two is the
    /// latest of all ([`Conn::largest_acked_tx`]).
    largest_acked_tx_of: [Option<u64>; 2],
    /// Per kind, the latest probe acked beyond `largest_acked_tx_of` and when it becomes
    /// evidence of losses below it (see `Conn::promote_probe_acks`).
    probe_acked: [Option<(u64, u64)>; 2],
    /// The peer's acks have said, for every packet below this, whether it arrived (the
    /// cumulative ack, or the end of the highest SACK range; an ack carries at most
    /// [`packet::MAX_RANGES`] ranges, so with more holes than that the packets above
    /// are unknown, not missing).
    sack_top: u64,
    /// The packets above `snd_una` the acks' SACK ranges have acknowledged.
    sacked: ranges::Ranges,
    /// A grant steered this side's stream to a port of its own when the next pn was this:
    /// new bulk fragments wait until everything sent before is acknowledged, so the
    /// stream does not arrive on two sockets at once (read out of order, it would look
    /// like losses).
    steer_after: Option<u64>,
    /// Scratch list of the loss detector (packets passed over, kept in order).
    rack_unknown: Vec<(u64, u64)>,
    /// Records of acknowledged small messages, for [`Conn::send_with`] to fill again.
    spare_msgs: Vec<Arc<MsgData>>,
    /// Packets to resend, lowest first: the lowest holds the cumulative ack back, while one
    /// far up may be one the receiver holds but its acks' few SACK ranges cannot reach
    /// (resent in the order they were condemned, a shaped link's thousands of losses took a
    /// window of 2 through such packets, one timeout per pair, and the stream stalled).
    lost: std::collections::BTreeSet<u64>,
    in_flight: u64,
    peer_limit: u64,
    cwnd: u64,
    ssthresh: u64,
    cwnd_acc: u64,
    /// Transmissions numbered from here on belong to the current congestion epoch.
    recovery_tx: u64,
    round: Round,
    rtt: Rtt,
    backoff: u32,
    rto_deadline: Option<u64>,
    /// When to send a tail loss probe (no ack for two RTTs with packets in flight).
    tlp_deadline: Option<u64>,
    /// The packet the probe resends.
    probe: Option<u64>,
    /// Probes sent since the last progress (at most [`MAX_PROBES`]).
    probes: u32,
    /// Admission control of this side's bulk stream.
    asker: Asker,
    /// Bulk transfers queued and not yet wholly acknowledged.
    bulk_outstanding: u64,
    /// Answers to the peer's admission requests, to send.
    admit_out: VecDeque<packet::Admit>,
    // --- receiver ---
    rcv_next: u64,
    rcv_highest: u64,
    /// One past the highest bulk fragment received ([`Conn::bulk_has_holes`]).
    rcv_bulk_top: u64,
    /// The packets received above `rcv_next`, as sorted, disjoint, non-touching ranges
    /// (what an ack's SACK ranges say), kept as they arrive: an ack used to find them by
    /// walking the slots from `rcv_next` to `rcv_highest`, which behind a hole in a fast
    /// stream was thousands of slots per ack.
    rcv_ranges: ranges::Ranges,
    /// When the highest packet arrived (for the ack delay).
    rcv_highest_at: u64,
    /// What arrived above a hole, by packet number.
    slots: Slots<Slot>,
    reasm: Option<Reasm>,
    /// Delivered messages' buffers given back ([`Conn::recycle`]), for the next ones.
    spare_bufs: Vec<Vec<u8>>,
    rcv_msg_id: u64,
    events: VecDeque<Event>,
    event_bytes: usize,
    /// The receive buffer in packets (`recv_buffer_bytes / mtu_payload`).
    recv_budget: u64,
    unacked: u32,
    /// Bulk fragments sent since an ack became pending (see `poll_transmit_with`).
    bulk_since_ack: u64,
    ack_now: bool,
    ack_deadline: Option<u64>,
    advertised_limit: u64,
    nak_ranges: Vec<(u64, u64)>,
    // --- liveness ---
    last_recv: u64,
    last_ping: u64,
    /// The latest time the caller drove the connection (any call that passes `now`).
    last_driven: u64,
    /// When a spare record or buffer was last taken ([`spares::SPARE_IDLE`]).
    spare_taken_at: u64,
    /// Whether the spares hold more, or larger, than the small-message bounds.
    spares_large: bool,
    /// When the caller last came back from an absence (see `Conn::drive`).
    back_at: u64,
    /// The caller awaits something from the peer ([`Conn::set_awaited`]).
    awaited: bool,
    /// Window and threshold before the last timeout collapsed them, while it may still
    /// prove spurious (see `Conn::undo_spurious_timeout`).
    rto_undo: Option<(u64, u64)>,
    /// The loss detector's last window reduction, while it may still prove spurious
    /// (see `Conn::undo_spurious_cut`).
    cut_undo: Option<CutUndo>,
    ping_pending: bool,
    dead: bool,
    stats: Stats,
}

impl Conn {
    /// A new connection at time `now`. Out-of-range settings are clamped (window to
    /// `1..=2^20`, `mtu_payload` to `1..=MAX_PAYLOAD`, windows and counts to at least 1).
    pub fn new(mut cfg: Config, now: u64) -> Conn {
        cfg.recv_window = cfg.recv_window.clamp(1, MAX_WINDOW);
        cfg.mtu_payload = cfg.mtu_payload.clamp(1, packet::MAX_PAYLOAD);
        cfg.initial_cwnd = cfg.initial_cwnd.max(1);
        cfg.max_cwnd = cfg.max_cwnd.max(cfg.initial_cwnd);
        cfg.ack_every = cfg.ack_every.max(1);
        cfg.dup_thresh = cfg.dup_thresh.max(1);
        cfg.slow_window = cfg.slow_window.max(1);
        let slots = Slots::new(cfg.recv_window);
        // Before the first ack, the peer's credit is taken to be what this side's own
        // configuration would grant (both sides normally share one configuration).
        let recv_budget = (cfg.recv_buffer_bytes / cfg.mtu_payload) as u64;
        let initial_limit = recv_budget.min(cfg.recv_window);
        Conn {
            send_queue: VecDeque::new(),
            send_bytes: 0,
            next_msg_id: 0,
            next_pn: 0,
            msg_pn_end: 0,
            snd_una: 0,
            sent: VecDeque::new(),
            tx_order: VecDeque::new(),
            next_tx_seq: 0,
            largest_acked_tx_of: [None; 2],
            probe_acked: [None; 2],
            sack_top: 0,
            sacked: ranges::Ranges::default(),
            steer_after: None,
            rack_unknown: Vec::new(),
            spare_msgs: Vec::new(),
            lost: std::collections::BTreeSet::new(),
            in_flight: 0,
            peer_limit: initial_limit,
            cwnd: cfg.initial_cwnd,
            ssthresh: cfg.max_cwnd,
            cwnd_acc: 0,
            recovery_tx: 0,
            round: Round::default(),
            rtt: Rtt {
                srtt: 0,
                rttvar: 0,
                has: false,
                min: 0,
                min_at: 0,
            },
            backoff: 0,
            rto_deadline: None,
            tlp_deadline: None,
            probe: None,
            probes: 0,
            asker: Asker::new(cfg.admission.clone()),
            bulk_outstanding: 0,
            admit_out: VecDeque::new(),
            rcv_next: 0,
            rcv_highest: 0,
            rcv_bulk_top: 0,
            rcv_ranges: ranges::Ranges::default(),
            rcv_highest_at: now,
            slots,
            reasm: None,
            spare_bufs: Vec::new(),
            rcv_msg_id: 0,
            events: VecDeque::new(),
            event_bytes: 0,
            recv_budget,
            unacked: 0,
            bulk_since_ack: 0,
            ack_now: false,
            ack_deadline: None,
            advertised_limit: initial_limit,
            nak_ranges: Vec::new(),
            last_recv: now,
            last_ping: now,
            last_driven: now,
            spare_taken_at: now,
            spares_large: false,
            back_at: 0,
            awaited: false,
            rto_undo: None,
            cut_undo: None,
            ping_pending: false,
            dead: false,
            stats: Stats::default(),
            cfg,
        }
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters, with the congestion and RTT snapshots filled in.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.cwnd = self.cwnd;
        s.ssthresh = self.ssthresh;
        s.srtt_ns = self.rtt.srtt;
        s.min_rtt_ns = self.rtt.min;
        s.rto_ns = self.rto();
        s.in_flight = self.in_flight;
        s
    }

    /// True once the peer was declared dead.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// The smoothed round-trip time (nanoseconds) when a datagram from the peer is due
    /// within about one: an ack of packets in flight (unless this side's bulk stream was
    /// refused a fast stream), or the repair of a hole below a packet that arrived. `None`
    /// when nothing is due or before the first RTT sample.
    pub fn reply_due(&self) -> Option<u64> {
        // (A stream admission control slowed down is slow by design: spinning for its
        // acks would take the CPU the granted stream needs, 0.92 -> 0.56x in the
        // two-senders experiment, where both senders share a core.)
        let acks = self.in_flight > 0 && (self.bulk_outstanding == 0 || self.asker.fast());
        let due = acks || self.has_holes();
        (due && self.rtt.has && !self.dead).then_some(self.rtt.srtt)
    }

    /// Sends a ping with the next datagrams polled, ahead of any data: a connector's first
    /// datagram, which tells the acceptor that its welcome arrived and the connection is
    /// taken up (an acceptor offers a connection to its application only then).
    pub fn ping_now(&mut self) {
        self.ping_pending = true;
    }

    /// True while queued data waits for the window or the peer's credit (nothing of it
    /// sent yet): acks this side has not read may be what holds it back.
    pub fn has_unsent(&self) -> bool {
        !self.send_queue.is_empty()
    }

    /// True when half the congestion window or more is in flight: the acks a sender has
    /// not read are worth reading before the window holds data back.
    pub fn window_half_used(&self) -> bool {
        self.in_flight.saturating_mul(2) >= self.cwnd
    }

    /// True when every queued message has been sent and acknowledged (or abandoned).
    pub fn is_idle(&self) -> bool {
        self.send_queue.is_empty() && self.sent.is_empty()
    }

    /// Bytes of messages queued by `send` and not yet acknowledged.
    pub fn send_buffered(&self) -> usize {
        self.send_bytes
    }

    /// Next event, if any. Taking messages frees receive budget (and may prompt a window
    /// update: call [`Conn::poll_transmit`] afterwards).
    pub fn poll_event(&mut self) -> Option<Event> {
        let ev = self.events.pop_front()?;
        if let Event::Message { data, .. } = &ev {
            let low = self.cfg.recv_window / 4;
            let before = self.credit();
            self.event_bytes -= data.len();
            if before < low && self.credit() >= low {
                self.ack_now = true;
            }
        }
        Some(ev)
    }

    /// Answers the peer's admission request (a Fast_Ack or Fast_NAck) or revokes its
    /// grant (Fast_NAck); sent with the next [`Conn::poll_transmit`].
    pub fn answer_admit(&mut self, a: packet::Admit) {
        if self.admit_out.len() < 4 {
            self.admit_out.push_back(a);
        }
    }

    /// Asks the peer for a fast bulk stream now (the explicit API; the answer comes as
    /// [`Event::Fast`]). Nothing happens with admission control off.
    pub fn request_fast(&mut self, now: u64) {
        self.asker.request(now);
    }

    /// Gives the fast stream back, or withdraws the request.
    pub fn release_fast(&mut self) {
        self.asker.release();
    }

    /// New bulk fragments received so far (placed by the caller or found in place).
    pub fn bulk_received(&self) -> u64 {
        self.stats.bulk_fragments
    }

    /// Whether a hole was seen that the next transmission will NAK (a transport that reads
    /// one peer's datagrams from two queues checks the other queue first, so that a
    /// datagram still waiting there is not reported missing).
    pub fn nak_pending(&self) -> bool {
        !self.nak_ranges.is_empty()
    }

    /// Whether packets are missing below the highest one received (holes waiting for
    /// their repair).
    pub fn has_holes(&self) -> bool {
        self.rcv_highest > self.rcv_next
    }

    /// Whether a bulk fragment was received above a missing packet: the bulk stream
    /// itself is out of order (a loss, or a repair still to come), and repairs will
    /// arrive among its new fragments. A hole that only datagrams of another queue opened
    /// (a small datagram read from the receive ring ahead of the fragments sent before it,
    /// still waiting in a socket) leaves the bulk stream in order: its next fragments are
    /// the ones missing.
    pub fn bulk_has_holes(&self) -> bool {
        self.rcv_bulk_top > self.rcv_next
    }

    /// Whether bulk fragments go fast now (granted, or admission control off).
    pub fn is_fast(&self) -> bool {
        self.asker.fast()
    }

    /// Whether this side's bulk stream is under way and held to the slow window because
    /// admission control refused it a fast one.
    pub fn is_slowed(&self) -> bool {
        self.bulk_outstanding > 0 && !self.asker.fast()
    }

    /// The peer's port for this side's granted stream alone (flow steering), if any:
    /// once everything sent before the grant is acknowledged.
    pub fn steered_port(&self) -> Option<u16> {
        self.asker.steered_port().filter(|_| !self.steer_pending())
    }

    /// Granted a steered port, but packets sent before the grant are still unacknowledged:
    /// new bulk fragments wait (see `steer_after`).
    fn steer_pending(&self) -> bool {
        self.steer_after.is_some_and(|p| self.snd_una < p) && self.asker.steered_port().is_some()
    }
}

/// The fragment sent at position `k` of a bulk transfer of `n` fragments under
/// [`Config::bulk_misorder`]. Positions are cut into units of `group` (at least 2; the
/// sender's groups, aligned from the transfer's start); within a unit neighbours are
/// swapped in pairs, and in a unit of odd length the last three rotate (positions
/// `len-3, len-2, len-1` carry fragments `len-2, len-1, len-3`). So no position carries its
/// own fragment, except the lone last fragment of a transfer whose last unit has only one.
/// A permutation of each unit: every fragment is sent exactly once.
pub fn misordered(k: u64, n: u64, group: u64) -> u64 {
    let unit = group.max(2);
    let start = k / unit * unit;
    let len = unit.min(n.saturating_sub(start));
    let p = k - start;
    let q = if len < 2 {
        p
    } else if len.is_multiple_of(2) || p + 3 < len {
        p ^ 1
    } else if p + 1 < len {
        p + 1 // len - 3 -> len - 2, len - 2 -> len - 1
    } else {
        len - 3
    };
    start + q
}

#[cfg(test)]
mod tests;
