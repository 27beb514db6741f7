//! One peer over UDP ([`UdpLink`]): its reliable connection, its bulk transfers, the
//! frames it delivered, and its side of admission control.

use super::*;
use crate::lease::{Dst, Src};
use std::sync::Arc;

/// One peer over UDP: its reliable connection and the frames it delivered.
pub struct UdpLink {
    /// The reliable connection.
    pub(super) conn: Conn,
    /// Where the peer's datagrams go.
    pub(super) dest: SocketAddr,
    /// The peer's endpoint id.
    pub(super) remote_id: u128,
    /// The two ends connected to each other at once (said by the welcome).
    pub(super) crossed: bool,
    /// Bulk transfers in progress.
    pub(super) bulk: Bulk,
    /// Frames delivered and not yet released (beyond its bound the connection's own
    /// receive budget, and so the sender's credit, takes over).
    pub(super) rxq: FrameQueue,
    /// The peer's admission requests (true) and releases (false, with the grant) not
    /// yet taken to the gate.
    pub(super) admit_in: Vec<(bool, u32)>,
    /// The latest answer to this side's own request (granted or not), for
    /// [`crate::Endpoint::request_fast`].
    pub(super) fast_answer: Option<bool>,
    /// Its grant was revoked: a Fast_NAck is repeated while its bulk keeps coming.
    pub(super) revoked: bool,
    pub(super) last_nack: u64,
    /// Bulk fragments received so far (to see the stream's activity), and how many of
    /// them were speculation hits.
    pub(super) bulk_seen: u64,
    pub(super) hits_seen: u64,
    /// The peer was told, unasked, that its stream is granted for good (it reaches a
    /// socket of its own here).
    standing_told: bool,
    /// Where the connection's standing ack and datagrams to repeat are published for the
    /// keepalive thread (none without one).
    pub(super) standing: Option<Arc<keepalive::Standing>>,
    /// The connection's (floor, next packet number) when they were last published.
    repeats_seen: (u64, u64),
}

impl UdpLink {
    pub(super) fn new(conn: Conn, dest: SocketAddr, remote_id: u128, crossed: bool) -> UdpLink {
        UdpLink {
            conn,
            dest,
            remote_id,
            crossed,
            bulk: Bulk::default(),
            rxq: FrameQueue::default(),
            admit_in: Vec::new(),
            fast_answer: None,
            revoked: false,
            last_nack: 0,
            bulk_seen: 0,
            hits_seen: 0,
            standing_told: false,
            standing: None,
            repeats_seen: (0, 0),
        }
    }

    /// The reliable connection, to read its state (configuration, counters, timers).
    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// What the transport routes its datagrams by: the peer's address and the
    /// connection id.
    pub fn route_key(&self) -> (SocketAddr, u32) {
        (self.dest, self.conn.config().conn_id)
    }

    /// Where the peer's datagrams go.
    pub fn dest(&self) -> SocketAddr {
        self.dest
    }

    /// The peer's endpoint id.
    pub fn remote_id(&self) -> u128 {
        self.remote_id
    }

    /// The two ends connected to each other at once (the handshake's welcome said so).
    pub fn crossed(&self) -> bool {
        self.crossed
    }

    /// The bulk transfers in progress, to read their state.
    pub fn bulk(&self) -> &Bulk {
        &self.bulk
    }

    /// The frames delivered and not yet released.
    pub fn frames(&self) -> &FrameQueue {
        &self.rxq
    }

    /// The bulk transfers finished since the last call: (received, sent); `None` when
    /// there are none.
    pub fn take_bulk_done(&mut self) -> Option<(Vec<u64>, Vec<u64>)> {
        let b = &mut self.bulk;
        if b.done_in.is_empty() && b.done_out.is_empty() {
            return None;
        }
        Some((
            std::mem::take(&mut b.done_in),
            std::mem::take(&mut b.done_out),
        ))
    }

    /// Forgets every bulk transfer (the peer failed): no lease is used afterwards.
    pub fn clear_bulk(&mut self) {
        self.bulk.clear();
    }

    /// Acknowledges at the next transmit, not after the ack delay (a transfer just
    /// completed here: its sender completes with this ack).
    pub fn ack_now(&mut self) {
        self.conn.ack_now();
    }

    /// Sends the owed ack with the next data packet (a goodbye must not overtake it).
    pub fn ack_with_next_data(&mut self) {
        self.conn.ack_with_next_data();
    }

    /// Asks the peer for the fast stream (admission control); the answer shows in
    /// [`UdpLink::fast_answer`].
    pub fn request_fast(&mut self, now: u64) {
        self.fast_answer = None;
        self.conn.request_fast(now);
    }

    /// The peer's latest answer to [`UdpLink::request_fast`].
    pub fn fast_answer(&self) -> Option<bool> {
        self.fast_answer
    }

    /// Gives the fast stream back (or withdraws the request).
    pub fn release_fast(&mut self) {
        self.conn.release_fast();
    }

    /// Marks the peer as awaited (a silent one is pinged soon) or not.
    pub fn set_awaited(&mut self, awaited: bool) {
        self.conn.set_awaited(awaited);
    }

    /// The speculative layout to arm for this link's bulk stream: its source address and
    /// up to `entries` receive entries of `group` fragments each. None while the bulk
    /// stream has holes (a fragment arrived above a missing packet): their
    /// repairs arrive among the new fragments and put the reads out of step with any
    /// layout (ARCHITECTURE.md, "Speculative defragmentation"); the repair that closes
    /// the last one changes the bulk generation, and the transport plans again. A hole
    /// that a small datagram from the receive ring opened ahead of fragments still
    /// queued in a socket does not stop it: those fragments come next, in order.
    pub fn plan_arm(&mut self, group: u64, entries: usize) -> Option<(SocketAddr, Arm)> {
        if self.conn.bulk_has_holes() {
            return None;
        }
        // The packet number expected now restores those of the fragments the read brings
        // (they are within 2^31 of it).
        let ctx = self.conn.bulk_context();
        self.bulk.arm(ctx, group, entries).map(|a| (self.dest, a))
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

    /// Starts sending the bytes of `src` as bulk transfer `xfer` (the receiver's clear to
    /// send named it); false when the connection is dead.
    pub fn send_bulk(&mut self, xfer: u64, src: Src) -> bool {
        if self.conn.send_bulk(xfer, src.len() as u64).is_err() {
            return false;
        }
        self.bulk.add_source(xfer, src);
        true
    }

    /// Expects bulk transfer `xfer` of `total` bytes into `dst` (bytes beyond it are
    /// dropped).
    pub fn expect_bulk(&mut self, xfer: u64, total: u64, dst: Dst) {
        let frag = self.conn.config().bulk_payload();
        self.bulk.add_dest(xfer, total, dst, frag);
    }

    /// Queues one frame on the connection (copied once, straight from the frame);
    /// false when the connection's send buffer is full (retry after progress).
    pub fn try_send(&mut self, f: &Frame) -> bool {
        match self.conn.send_with(0, f.encoded_len(), |b| f.append_to(b)) {
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
        // Bulk payloads are the sources' bytes, held until their transfer is over
        // (acknowledged, seen by `take_events`) or the link is cleared, neither of which
        // happens before the transport sends the batch (`UdpTransport::flush`).
        while batch.push_grouped(|buf| {
            let t = conn.poll_transmit_with(now, buf, &mut |x, o, n| bulk.source(x, o, n))?;
            let to = match conn.steered_port() {
                Some(port) if t.bulk => SocketAddr::new(dest.ip(), port),
                _ => dest,
            };
            Some((t.len, t.payload, t.group_start, to))
        }) {}
    }

    /// Publishes for the keepalive thread what it says if the application leaves now: the
    /// standing ack and the datagrams to repeat. Called after the batch went out (off the
    /// path of a datagram to the peer, which a ping-pong waits for).
    pub fn publish_standing(&mut self) {
        let Some(s) = &self.standing else { return };
        let conn = &self.conn;
        if let Some((cum, limit)) = conn.standing_ack() {
            s.publish(cum, limit);
        }
        let now_seen = (conn.send_floor(), conn.next_pn());
        if now_seen != self.repeats_seen {
            s.publish_repeats(conn, self.repeats_seen.1);
            self.repeats_seen = now_seen;
        }
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
    /// into one receiver of an all-to-all moved a third as fast as over TCP.) Such a peer
    /// is told so once, unasked: a [`STANDING_GRANT`] it keeps through idle times, so its
    /// transfers do not each start slow while a request crosses (an 8-host all-to-all,
    /// whose processes wait for one another between exchanges, asked again at nearly
    /// every message). If that answer is lost, its first transfer asks as before.
    pub(super) fn admit(
        &mut self,
        now: u64,
        idx: usize,
        own: bool,
        gate: &mut Gate<usize>,
        out: &mut Vec<Decision<usize>>,
        stats: &mut UdpStats,
    ) {
        if own && !self.standing_told {
            self.standing_told = true;
            self.conn.answer_admit(Admit::Ack {
                grant: STANDING_GRANT,
                port: 0,
            });
        }
        for (req, grant) in self.admit_in.drain(..) {
            self.revoked = false;
            if own {
                if req {
                    stats.own_queue_grants += 1;
                    self.conn.answer_admit(Admit::Ack {
                        grant: STANDING_GRANT,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A link whose bulk stream has holes arms no layout; once they are repaired it arms
    /// the rest of the transfer again. A hole that a later small datagram opened (read
    /// from another queue ahead of the fragments) does not stop it.
    #[test]
    fn a_link_with_bulk_holes_arms_no_speculative_layout() {
        let cfg = reliable::Config::default();
        let frag = cfg.bulk_payload();
        let total = 40 * frag;
        let mut tx = Conn::new(cfg.clone(), 0);
        let mut rx = UdpLink::new(Conn::new(cfg, 0), "127.0.0.1:9".parse().unwrap(), 1, false);
        let src = vec![5u8; total];
        let dst: &'static mut [u8] = Box::leak(vec![0u8; total].into_boxed_slice());
        tx.send_bulk(1, total as u64).unwrap();
        rx.expect_bulk(1, total as u64, Dst::from_static(dst));
        let poll = |tx: &mut Conn| {
            let mut dgrams = Vec::new();
            loop {
                let mut buf = Vec::new();
                let Some(t) = tx.poll_transmit_with(0, &mut buf, &mut |_, o, n| {
                    Some(&src[o as usize..o as usize + n])
                }) else {
                    break;
                };
                buf.truncate(t.len);
                buf.extend_from_slice(t.payload);
                dgrams.push(buf);
            }
            dgrams
        };
        // The transfer's fragments, then a message sent after them (an RTS, say), the
        // window opened by a peer's acks.
        tx.send(7, b"next").unwrap();
        let mut dgrams = Vec::new();
        let mut small = None;
        let mut peer = Conn::new(reliable::Config::default(), 0);
        for _ in 0..20 {
            for d in poll(&mut tx) {
                let _ = peer.handle_datagram(0, &d);
                if is_bulk(&d) {
                    dgrams.push(d);
                } else {
                    small = Some(d);
                }
            }
            if small.is_some() {
                break;
            }
            let mut ack = Vec::new();
            while let Some(n) = peer.poll_transmit(0, &mut ack) {
                tx.handle_datagram(0, &ack[..n]).unwrap();
                ack.clear();
            }
        }
        let small = small.expect("the message left");
        assert!(dgrams.len() >= 5, "{} datagrams", dgrams.len());
        let plan = |rx: &mut UdpLink| rx.plan_arm(4, 8);
        assert!(plan(&mut rx).is_some(), "a clean stream arms");
        for d in [&dgrams[0], &dgrams[1], &small] {
            rx.handle(1_000, Got::Datagram(d));
        }
        assert!(rx.conn.has_holes());
        let (_, arm) = plan(&mut rx).expect("fragments below a small datagram come next");
        assert_eq!(arm.entries[0][0].0, 2 * frag as u64, "from fragment 2 on");
        rx.handle(1_000, Got::Datagram(&dgrams[3]));
        assert!(
            plan(&mut rx).is_none(),
            "the repair of fragment 2 is to come"
        );
        rx.handle(2_000, Got::Datagram(&dgrams[2]));
        let (_, arm) = plan(&mut rx).expect("armed again");
        assert_eq!(
            arm.entries[0][0].0,
            4 * frag as u64,
            "from the next fragment on"
        );
    }
}
