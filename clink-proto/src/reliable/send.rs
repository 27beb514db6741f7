//! The sending half of a connection: queuing messages and bulk transfers, choosing the
//! next packet (new, lost or probe), building datagrams with their piggybacked acks, and
//! processing the peer's acks and naks (the congestion window and the send floor).

use super::*;

impl Conn {
    /// Queues a message; it is copied once. Call [`Conn::poll_transmit`] afterwards.
    pub fn send(&mut self, tag: u64, data: &[u8]) -> Result<MsgId, SendError> {
        self.send_with(tag, data.len(), |b| b.extend_from_slice(data))
    }

    /// Queues a `len`-byte message that `fill` appends straight to the (empty) send buffer
    /// record it is given (the caller's one copy: no intermediate buffer, and no zeroing
    /// first). `fill` is not called when the message is refused; bytes it appends beyond
    /// `len` are cut, and missing ones are zeros (a caller bug either way).
    pub fn send_with(
        &mut self,
        tag: u64,
        len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<MsgId, SendError> {
        if self.dead {
            return Err(SendError::PeerDead);
        }
        if len > self.cfg.max_message_len as usize {
            return Err(SendError::TooLarge {
                len,
                limit: self.cfg.max_message_len,
            });
        }
        if self.send_bytes > 0 && self.send_bytes + len > self.cfg.send_buffer_bytes {
            return Err(SendError::BufferFull);
        }
        let id = self.next_msg_id;
        // The newest spare no other owner shares; one still shared (a copy kept for
        // repeating, `Conn::repeat_of`, until its holder learns of the ack) stays for a
        // later send.
        let free = (0..self.spare_msgs.len())
            .rev()
            .find(|&i| Arc::get_mut(&mut self.spare_msgs[i]).is_some());
        let mut msg = match free {
            Some(i) => {
                self.took_spare();
                self.spare_msgs.swap_remove(i)
            }
            None => Arc::default(),
        };
        let m = Arc::get_mut(&mut msg).expect("a spare record has no other owner");
        m.id = id;
        m.tag = tag;
        m.data.clear();
        m.data.reserve(len);
        fill(&mut m.data);
        debug_assert_eq!(m.data.len(), len, "send_with's fill appends `len` bytes");
        m.data.resize(len, 0);
        self.next_msg_id += 1;
        self.send_bytes += len;
        self.stats.messages_sent += 1;
        self.send_queue.push_back(Queued {
            item: Item::Msg(msg),
            next_off: 0,
            next_seq: 0,
        });
        Ok(MsgId(id))
    }

    /// Queues a bulk transfer of `len` bytes (`len` > 0) named `xfer` by the receiver. Its
    /// bytes are not copied: each transmission asks the `source` callback of
    /// [`Conn::poll_transmit_with`] for them, so the caller keeps them unchanged until
    /// [`Event::BulkSent`]. The receiver gets the fragments through the `place` callback of
    /// [`Conn::handle_datagram_with`] (or finds them in place, [`Conn::accept_placed`]);
    /// they are ordered with the messages around them only for acknowledgement, not for
    /// delivery.
    pub fn send_bulk(&mut self, xfer: u64, len: u64) -> Result<(), SendError> {
        if self.dead {
            return Err(SendError::PeerDead);
        }
        if len == 0 {
            return Err(SendError::EmptyBulk);
        }
        if len > packet::MAX_BULK_OFFSET {
            return Err(SendError::BulkTooLarge(len));
        }
        self.stats.bulk_transfers += 1;
        self.bulk_outstanding += 1;
        self.send_queue.push_back(Queued {
            item: Item::Bulk { xfer, total: len },
            next_off: 0,
            next_seq: 0,
        });
        Ok(())
    }

    /// Gives back the buffer of a delivered message ([`Event::Message`]) once its bytes
    /// are no longer needed, for a later message to be delivered in (optional: a few
    /// small ones are kept, and while messages up to the eager limit stream, more; anything
    /// else is freed).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        self.spares_large |= spares::keep(&mut self.spare_bufs, buf, cap);
    }

    /// Appends the next datagram to send to `buf` and returns its length, or `None` when
    /// there is nothing to send now. Call repeatedly until `None` after every other call.
    /// For a connection with bulk transfers use [`Conn::poll_transmit_with`].
    pub fn poll_transmit(&mut self, now: u64, buf: &mut Vec<u8>) -> Option<usize> {
        self.poll_transmit_with(now, buf, &mut |_, _, _| None)
            .map(|t| t.len)
    }

    /// As [`Conn::poll_transmit`]; a bulk fragment's payload is read where `source(xfer,
    /// offset, len)` says it is (checksummed there) and returned in
    /// [`Transmit::payload`], not appended: the buffer gets its header only. `source`
    /// returning `None` or another length (no such transfer or range: a caller bug) fails
    /// the connection.
    pub fn poll_transmit_with<'s>(
        &mut self,
        now: u64,
        buf: &mut Vec<u8>,
        source: &mut BulkSource<'s>,
    ) -> Option<Transmit<'s>> {
        if self.dead {
            return None;
        }
        let mut group_start = false;
        let mut bulk = false;
        let mut resend = false;
        let mut payload: &'s [u8] = &[];
        let conn = self.cfg.conn_id;
        self.asker.bulk_active(now, self.bulk_outstanding > 0);
        let n = if !self.nak_ranges.is_empty() {
            let mut ack = self.build_ack(now);
            // Only holes still open are worth a NAK: packets that arrived since the hole
            // was seen (a batch's misses are handed over after its hits) are left out, or
            // the sender would resend them and count a burst of losses. (Naming `cum`
            // itself, the first missing packet, stalled the 5% loss simulation for
            // seconds of timeouts, for a reason not found; the hole at `cum` is left to
            // SACK and the tail probe.)
            let ranges = std::mem::take(&mut self.nak_ranges);
            ack.ranges = self.still_missing(&ranges, ack.cum + 1);
            if ack.ranges.is_empty() {
                return self.poll_transmit_with(now, buf, source);
            }
            self.stats.naks_sent += 1;
            self.advertised_limit = ack.limit;
            Datagram::Nak { conn, ack }.encode(buf)
        } else if (self.ack_now
            || self.ack_deadline.is_some_and(|d| {
                d <= now || self.bulk_outstanding > 0 && self.bulk_since_ack >= self.bulk_group()
            }))
            && !self.next_carries_ack()
        {
            // With a bulk transfer to send, a pending ack goes after one group of its
            // fragments: bulk fragments carry none, and a transfer of megabytes leaves in
            // one burst that can outlast the peer's retransmission timer (a 16 MiB burst
            // is 8 ms at 2 GB/s; each rendezvous answer waiting behind it timed out twice
            // at the peer). Not before the group: the ack (of the clear-to-send, say)
            // would delay the fragments the peer waits for by a send of its own.
            self.encode_ack(now, buf)
        } else if self.ping_pending {
            self.ping_pending = false;
            self.stats.pings_sent += 1;
            Datagram::Ping {
                conn,
                floor: self.snd_una,
            }
            .encode(buf)
        } else if let Some(admit) = self
            .admit_out
            .pop_front()
            .or_else(|| self.asker.poll_transmit())
        {
            Datagram::Admit { conn, admit }.encode(buf)
        } else if let Some(pn) = self.next_to_send() {
            let idx = (pn - self.snd_una) as usize;
            let tx_seq = self.next_tx_seq;
            self.next_tx_seq += 1;
            self.tx_order.push_back((pn, tx_seq));
            // (A probe resends a packet still in flight.)
            let probe = self.sent[idx].state == PState::InFlight;
            if !probe {
                self.in_flight += 1;
            }
            let reported_missing = pn < self.sack_top;
            let s = &mut self.sent[idx];
            s.probe = probe;
            s.tx_seq = tx_seq;
            s.sent_at = now;
            if s.tx_count == 0 {
                s.first_sent_at = now;
            } else if reported_missing {
                // A hole below packets the receiver has: lost, not late.
                s.timer_only = false;
            }
            s.tx_count += 1;
            s.state = PState::InFlight;
            if s.tx_count > 1 {
                self.stats.retransmissions += 1;
                // Its ack can no longer say which copy arrived (Karn's rule): the cut
                // that condemned it cannot prove spurious.
                if std::mem::take(&mut s.condemned_by) != 0 {
                    self.cut_undo = None;
                }
            }
            self.stats.data_sent += 1;
            self.round.sent += 1;
            if self.rto_deadline.is_none() {
                self.rto_deadline = Some(now + self.rto());
            }
            self.arm_tail_probe(now);
            resend = self.sent[idx].tx_count > 1;
            let piggy = match self.sent[idx].item {
                Item::Msg(_) => self.take_piggy(now, self.sent[idx].len as usize, resend),
                Item::Bulk { .. } => None,
            };
            let s = &self.sent[idx];
            let floor = self.snd_una;
            match &s.item {
                Item::Msg(m) => {
                    let hdr = DataHeader {
                        pn,
                        floor,
                        msg_id: m.id,
                        tag: m.tag,
                        msg_len: m.data.len() as u32,
                        offset: s.offset as u32,
                        ack: piggy,
                    };
                    let payload =
                        &m.data[s.offset as usize..(s.offset + u64::from(s.len)) as usize];
                    Datagram::Data { conn, hdr, payload }.encode(buf)
                }
                &Item::Bulk { xfer, .. } => {
                    let hdr = BulkHeader {
                        pn,
                        floor,
                        xfer: packet::wire_xfer(xfer),
                        offset: s.offset,
                        hashed: self.cfg.payload_hash,
                    };
                    bulk = s.tx_count <= 1;
                    group_start = s.tx_count > 1 || s.opens_group;
                    if self.ack_deadline.is_some() {
                        self.bulk_since_ack += 1;
                    }
                    let len = s.len as usize;
                    let Some(p) = source(xfer, s.offset, len).filter(|p| p.len() == len) else {
                        self.stats.dropped_malformed += 1;
                        self.dead = true;
                        self.events.push_back(Event::PeerDead);
                        return None;
                    };
                    payload = p;
                    buf.extend_from_slice(&packet::encode_bulk_header(conn, &hdr, p));
                    packet::BULK_HEADER
                }
            }
        } else if self.ack_deadline.is_some() && self.bulk_outstanding > 0 {
            // Nothing more to send now: the ack the fragments went ahead of.
            self.encode_ack(now, buf)
        } else {
            return None;
        };
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += (n + payload.len()) as u64;
        if resend {
            self.stats.bytes_resent += (n + payload.len()) as u64;
        }
        Some(Transmit {
            len: n,
            payload,
            group_start,
            bulk,
        })
    }

    /// Fragments per bulk group: the configured group while fast, single fragments
    /// while slow (a refused stream sends no bursts).
    pub(super) fn bulk_group(&self) -> u64 {
        if self.asker.fast() {
            self.cfg.bulk_group.max(1)
        } else {
            1
        }
    }

    /// The latest transmission acked, of either kind.
    fn largest_acked_tx(&self) -> Option<u64> {
        self.largest_acked_tx_of[0].max(self.largest_acked_tx_of[1])
    }

    /// The pn to transmit next: a tail probe (whatever the window), else, if the window
    /// has room, a lost one or a new fragment the credit allows.
    pub(super) fn next_to_send(&mut self) -> Option<u64> {
        if let Some(pn) = self.probe.take() {
            if pn >= self.snd_una
                && self.sent[(pn - self.snd_una) as usize].state == PState::InFlight
            {
                return Some(pn);
            }
        }
        if self.in_flight >= self.cwnd {
            return None;
        }
        while let Some(pn) = self.lost.pop_first() {
            if pn >= self.snd_una && self.sent[(pn - self.snd_una) as usize].state == PState::Lost {
                return Some(pn);
            }
        }
        if self.next_pn >= self.peer_limit || self.send_queue.is_empty() {
            return None;
        }
        let group = self.bulk_group();
        // Slow (refused), or waiting for the acks that let a steered stream switch ports.
        let hold_bulk =
            !self.asker.fast() && self.in_flight >= self.cfg.slow_window || self.steer_pending();
        let q = self.send_queue.front_mut()?;
        let total = q.item.len();
        let frag = match q.item {
            Item::Bulk { .. } => self.cfg.bulk_payload(),
            Item::Msg(_) => self.cfg.mtu_payload,
        } as u64;
        if hold_bulk && matches!(q.item, Item::Bulk { .. }) {
            return None;
        }
        if matches!(q.item, Item::Bulk { .. }) && q.next_seq.is_multiple_of(group) {
            // Start a group only when all of it can go at once (capped by what the window
            // and the peer's whole credit could ever allow, so this never deadlocks).
            let need = group
                .min((total - q.next_off).div_ceil(frag))
                .min(self.cwnd)
                .min(self.peer_limit.saturating_sub(self.snd_una).max(1));
            if self.cwnd.saturating_sub(self.in_flight) < need
                || self.peer_limit - self.next_pn < need
            {
                return None;
            }
        }
        // `q.next_off` walks the transfer in sending order (groups are cut by it); the
        // fragment sent at that position is normally the same one, or, with the
        // experiment's misorder, another of its group.
        // (A message's fragments need no division: they go in order, in no group.)
        let (opens_group, offset) = match q.item {
            Item::Bulk { .. } => {
                let seq = q.next_seq;
                // Within the configured groups, not the current ones: a stream that goes
                // from slow (single fragments, misordered in pairs) to fast mid-transfer
                // would otherwise mix two permutations, which for odd groups send some
                // fragments twice and others never.
                let offset = if self.cfg.bulk_misorder {
                    misordered(seq, total.div_ceil(frag), self.cfg.bulk_group.max(1)) * frag
                } else {
                    q.next_off
                };
                (seq.is_multiple_of(group), offset)
            }
            Item::Msg(_) => (false, q.next_off),
        };
        let len = (total - offset).min(frag);
        q.next_off += (total - q.next_off).min(frag);
        q.next_seq += 1;
        let closes_item = q.next_off >= total;
        let item = if closes_item {
            self.send_queue.pop_front().expect("front exists").item
        } else {
            q.item.clone()
        };
        let pn = self.next_pn;
        self.next_pn += 1;
        if !item.is_bulk() {
            self.msg_pn_end = self.next_pn;
        }
        self.sent.push_back(Sent {
            item,
            offset,
            len: len as u32,
            opens_group,
            closes_item,
            tx_seq: 0,
            sent_at: 0,
            first_sent_at: 0,
            timer_only: true,
            probe: false,
            tx_count: 0,
            condemned_by: 0,
            state: PState::Lost,
        });
        Some(pn)
    }

    /// Whether the datagram [`Conn::next_to_send`] gives next is a message's fragment with
    /// room for a piggybacked ack that needs no ranges: a due ack then rides on it
    /// instead of leaving first in a datagram of its own (a clear-to-send and the ack of
    /// the transfer before it leave as one datagram, not two). A conservative look: a
    /// probe or a resend next, or a closed window, leaves the ack its own datagram.
    fn next_carries_ack(&self) -> bool {
        if self.probe.is_some()
            || !self.lost.is_empty()
            || self.in_flight >= self.cwnd
            || self.next_pn >= self.peer_limit
            || self.has_holes()
        {
            return false;
        }
        self.send_queue.front().is_some_and(|q| {
            let left = q.item.len() - q.next_off;
            matches!(q.item, Item::Msg(_))
                && self.piggy_fits(left.min(self.cfg.mtu_payload as u64) as usize)
        })
    }

    /// Whether a data datagram of `len` payload bytes has room for a piggybacked ack.
    fn piggy_fits(&self, len: usize) -> bool {
        len + packet::PIGGY_LEN <= self.cfg.mtu_payload
    }

    /// The pending ack as a datagram of its own, into `buf` (it then counts as sent).
    fn encode_ack(&mut self, now: u64, buf: &mut Vec<u8>) -> usize {
        let ack = self.take_ack(now);
        self.stats.acks_sent += 1;
        Datagram::Ack {
            conn: self.cfg.conn_id,
            ack,
        }
        .encode(buf)
    }

    /// An ack for a data datagram of `len` payload bytes to carry, when one is due (or
    /// the datagram is a `resend`) and needs no ranges (nothing received out of order) and
    /// the datagram has room: it then counts as sent (no ack datagram of its own follows).
    /// A resent copy carries the ack again: the lost first copy may have carried the only
    /// one, and a message that must imply the ack before it (a goodbye, see
    /// [`Conn::ack_with_next_data`]) must imply it in every copy.
    pub(super) fn take_piggy(
        &mut self,
        now: u64,
        len: usize,
        resend: bool,
    ) -> Option<packet::Piggy> {
        let due = resend || self.ack_now || self.ack_deadline.is_some();
        if !due || self.has_holes() || !self.piggy_fits(len) {
            return None;
        }
        let ack = self.take_ack(now);
        self.stats.acks_piggybacked += 1;
        Some(packet::Piggy {
            cum: ack.cum,
            limit: ack.limit,
            delay_us: ack.delay_us,
        })
    }

    pub(super) fn on_ack(&mut self, now: u64, ack: &AckInfo, nak: bool) -> Result<(), RecvError> {
        if ack.cum > self.next_pn || ack.ranges.last().is_some_and(|r| r.1 > self.next_pn) {
            return Err(RecvError::Protocol("ack of a packet never sent"));
        }
        if ack.limit < ack.cum {
            return Err(RecvError::Protocol("credit limit below the cumulative ack"));
        }
        self.peer_limit = self.peer_limit.max(ack.limit);
        let mut newly = 0u64;
        // (tx_seq, sent_at) of the latest timed packet acked.
        let mut sample: Option<(u64, u64)> = None;
        // A packet the timeout condemned arrived all the same, from its one transmission.
        let mut original_arrived = false;
        let mut ack_one = |this: &mut Conn, pn: u64, cumulative: bool| {
            let idx = (pn - this.snd_una) as usize;
            let s = &mut this.sent[idx];
            if matches!(s.state, PState::Acked | PState::Abandoned) {
                return;
            }
            if s.state == PState::Lost && s.tx_count == 1 {
                original_arrived = true;
                // Condemned by the timer alone (see `Stats::reprieved`).
                this.stats.reprieved += u64::from(s.timer_only);
            }
            let by = std::mem::take(&mut s.condemned_by);
            if let Some(u) = this.cut_undo.as_mut().filter(|u| by == u.cut) {
                u.unproven -= 1;
            }
            if s.state == PState::InFlight {
                this.in_flight -= 1;
            }
            s.state = PState::Acked;
            newly += 1;
            let kind = usize::from(s.item.is_bulk());
            if s.probe {
                // Evidence after half the probe's wait (see `promote_probe_acks`); a later
                // probe's ack does not put the first one's verdict off.
                let at = now + ((s.sent_at - s.first_sent_at) / 2).max(this.rtt.srtt);
                let p = &mut this.probe_acked[kind];
                *p = Some(p.map_or((s.tx_seq, at), |(t, a)| (t.max(s.tx_seq), a)));
            } else {
                let of = &mut this.largest_acked_tx_of[kind];
                *of = Some(of.map_or(s.tx_seq, |m| m.max(s.tx_seq)));
            }
            // Karn's rule leaves a resent packet's ack untimed, as it may answer any of
            // its transmissions. A packet resent only by the timers, never reported
            // missing, and acked with everything before it is the exception, timed from
            // its first transmission: the timers fired because that one's ack was late,
            // and if lateness is what the path does (acks queued behind another stream's
            // burst at a shaped link, a peer descheduled), untimed acks left the timer at
            // its floor, firing on every packet, for ever. If the first copy was lost
            // after all, the sample is too long by the timers' wait: a timer slow to fire
            // for a while, not one that fires when nothing is lost.
            let t = if s.tx_count == 1 || (s.timer_only && cumulative) {
                Some(s.first_sent_at)
            } else {
                None
            };
            if let Some(t) = t.filter(|_| sample.is_none_or(|(x, _)| s.tx_seq > x)) {
                sample = Some((s.tx_seq, t));
            }
        };
        for pn in self.snd_una..ack.cum.max(self.snd_una) {
            ack_one(self, pn, true);
        }
        if !nak {
            // Only what the ranges add to what earlier acks said: each ack repeats the
            // ranges above a hole, thousands of packets behind one in a fast stream.
            let mut sacked = std::mem::take(&mut self.sacked);
            for &(s, e) in &ack.ranges {
                sacked.insert(s.max(self.snd_una), e, |a, b| {
                    for pn in a..b {
                        ack_one(self, pn, false);
                    }
                });
            }
            self.sacked = sacked;
            let top = ack.ranges.last().map_or(ack.cum, |r| r.1);
            self.sack_top = self.sack_top.max(top);
        }
        if original_arrived && self.rto_undo.is_some() {
            self.undo_spurious_timeout();
        }
        if let Some(u) = self.cut_undo.take_if(|u| u.unproven == 0) {
            self.undo_spurious_cut(u);
        }
        // An ack whose delay is unknown times nothing (see [`packet::MAX_ACK_DELAY_US`]),
        // nor one of a packet sent before the caller's last absence (it may have waited
        // unread for the whole of it, see `Conn::drive`).
        let timed = |&(_, sent_at): &(u64, u64)| {
            ack.delay_us < packet::MAX_ACK_DELAY_US && sent_at >= self.back_at
        };
        if let Some((_, sent_at)) = sample.filter(timed) {
            // QUIC's rule: the peer's ack delay comes out of the sample unless that would
            // go below the minimum (a delayed ack is not a queue).
            let r = now.saturating_sub(sent_at);
            let delay = u64::from(ack.delay_us) * 1000;
            let adjusted = if r >= self.rtt.min + delay {
                r - delay
            } else {
                r
            };
            self.rtt.sample(now, r, adjusted);
        }
        if self.round.sent >= MIN_ROUND_PACKETS
            && self
                .largest_acked_tx()
                .is_some_and(|t| t >= self.round.end_tx)
        {
            let r = &mut self.round;
            (r.prev_sent, r.prev_lost) = (r.sent, r.lost);
            (r.sent, r.lost) = (0, 0);
            r.end_tx = self.next_tx_seq;
        }
        if newly > 0 {
            self.backoff = 0;
            // No growth until a transmission of the current epoch is acked.
            if self
                .largest_acked_tx()
                .is_some_and(|t| t >= self.recovery_tx)
            {
                // Above the threshold the window grows by one per window only while the
                // RTT shows a queue: with none, the link has room, and a window cut by
                // a loss that only looked like congestion comes back in a few round trips.
                let slow_start = self.cwnd < self.ssthresh;
                if slow_start && self.cwnd >= self.cfg.slow_start_floor && self.queued() {
                    // Slow start ends where a queue builds (see the module docs).
                    self.ssthresh = self.cwnd;
                    self.stats.slow_start_exits += 1;
                } else if slow_start || self.no_queue() {
                    self.cwnd = (self.cwnd + newly).min(self.cfg.max_cwnd);
                } else {
                    self.cwnd_acc += newly;
                    if self.cwnd_acc >= self.cwnd {
                        self.cwnd_acc -= self.cwnd;
                        self.cwnd = (self.cwnd + 1).min(self.cfg.max_cwnd);
                    }
                }
            }
        }
        if nak {
            for &(s, e) in &ack.ranges {
                // A NAK names the holes below the packet that revealed them. A probe may
                // have overtaken the flight it probes: the loss detector judges those
                // holes once the probe's ack is evidence.
                let by_probe = (self.snd_una..self.next_pn).contains(&e)
                    && self.sent[(e - self.snd_una) as usize].probe;
                if by_probe {
                    continue;
                }
                for pn in s.max(self.snd_una)..e.min(self.next_pn) {
                    let p = &self.sent[(pn - self.snd_una) as usize];
                    // With two paths a hole the other kind's packet opened is not news
                    // (the packet may be on the slower path): believed once a later
                    // packet of its own kind arrived.
                    let own = self.largest_acked_tx_of[usize::from(p.item.is_bulk())];
                    let believed = !self.cfg.split_paths || own.is_some_and(|m| m > p.tx_seq);
                    if p.tx_count == 1 && believed {
                        self.mark_lost(pn, true);
                    }
                }
            }
        }
        self.promote_probe_acks(now);
        self.detect_lost();
        self.advance_una();
        if newly > 0 || self.rto_deadline.is_none() {
            self.rto_deadline = self.outstanding().then(|| now + self.rto());
        }
        if newly > 0 {
            self.probes = 0;
            self.arm_tail_probe(now);
        }
        Ok(())
    }

    /// Makes the acked probes whose wait is over evidence of the losses below them (see
    /// `largest_acked_tx_of`). A probe resends a packet while the flight before it is
    /// still unacked; its copy can reach the receiver first (the flight queued on the
    /// backlog of a sending core that was preempted, while the probe left from another),
    /// and the holes its ack shows are then only late. So they are believed as losses
    /// only once they stay open half as long again as the probe waited for them, and at
    /// least a smoothed RTT: a real tail loss is still repaired before the retransmission
    /// timer, and a flight that was only held back is acked first (across the bridge its
    /// acks came 0.15-0.3 of the probe's wait after the probe's). Later packets acked
    /// from a first transmission are evidence at once.
    pub(super) fn promote_probe_acks(&mut self, now: u64) {
        for kind in 0..2 {
            let of = self.largest_acked_tx_of[kind];
            let Some((tx, at)) = self.probe_acked[kind] else {
                continue;
            };
            if of.is_some_and(|m| m >= tx) {
                self.probe_acked[kind] = None;
            } else if at <= now {
                self.largest_acked_tx_of[kind] = Some(tx);
                self.probe_acked[kind] = None;
            }
        }
    }

    /// When an acked probe becomes evidence ([`Conn::promote_probe_acks`]).
    pub(super) fn probe_evidence_at(&self) -> Option<u64> {
        self.probe_acked.iter().flatten().map(|&(_, at)| at).min()
    }

    /// The loss detector, run on each ack and when a probe's ack becomes evidence.
    pub(super) fn detect_lost(&mut self) {
        // RACK-like detection: lost when a packet transmitted dup_thresh later was acked.
        // Only a packet the acks have reported on can be missing: above the last SACK
        // range its fate is unknown (a retransmission's ack, raising `largest`, would
        // otherwise condemn every packet beyond the ranges an ack has room for). Those stay
        // queued, in order, while the scan goes on past them: a lost retransmission behind
        // them is still found.
        if let Some(largest) = self.largest_acked_tx() {
            let mut unknown = std::mem::take(&mut self.rack_unknown);
            while let Some(&(pn, tx)) = self.tx_order.front() {
                if pn < self.snd_una {
                    self.tx_order.pop_front();
                    continue;
                }
                let s = &self.sent[(pn - self.snd_una) as usize];
                if s.tx_seq != tx || s.state != PState::InFlight {
                    self.tx_order.pop_front();
                    continue;
                }
                if tx + self.cfg.dup_thresh > largest {
                    break;
                }
                self.tx_order.pop_front();
                // With two paths, only its own kind's acks condemn a packet; one the other
                // kind's overtook stays queued, in order, as an unknown one does.
                let own = self.largest_acked_tx_of[usize::from(s.item.is_bulk())];
                let overtaken =
                    self.cfg.split_paths && own.is_none_or(|m| tx + self.cfg.dup_thresh > m);
                if pn < self.sack_top && !overtaken {
                    self.mark_lost(pn, true);
                } else {
                    unknown.push((pn, tx));
                }
            }
            for &e in unknown.iter().rev() {
                self.tx_order.push_front(e);
            }
            unknown.clear();
            self.rack_unknown = unknown;
        }
    }

    pub(super) fn advance_una(&mut self) {
        while let Some(front) = self.sent.front() {
            if !matches!(front.state, PState::Acked | PState::Abandoned) {
                break;
            }
            let s = self.sent.pop_front().expect("front exists");
            self.snd_una += 1;
            if s.closes_item {
                match s.item {
                    Item::Msg(m) => {
                        self.send_bytes -= m.data.len();
                        if self.cfg.reliable {
                            self.events.push_back(Event::Acked(MsgId(m.id)));
                        }
                        // Kept for reuse (within the spares' bounds): by the time a send
                        // takes it, its other owners (a repeat copy) have normally let go
                        // (checked then).
                        let cap = m.data.capacity();
                        self.spares_large |= spares::keep(&mut self.spare_msgs, m, cap);
                    }
                    // Acknowledged or (unreliable mode) given up: either way the source
                    // bytes are no longer needed.
                    Item::Bulk { xfer, .. } => {
                        self.bulk_outstanding -= 1;
                        self.events.push_back(Event::BulkSent(xfer));
                    }
                }
            }
        }
        self.sacked.trim_below(self.snd_una);
    }
}
