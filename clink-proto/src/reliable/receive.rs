//! The receiving half of a connection: parsing and admitting datagrams, reassembly and
//! in-order delivery, the receive window's credit, naks for holes, and the acks this side
//! owes.

use super::*;

impl Conn {
    /// Feeds one received datagram. Errors say why it was dropped; they are counted and
    /// need no action. Call [`Conn::poll_transmit`] and [`Conn::poll_event`] afterwards.
    /// Bulk fragments are discarded (counted): see [`Conn::handle_datagram_with`].
    pub fn handle_datagram(&mut self, now: u64, bytes: &[u8]) -> Result<(), RecvError> {
        self.handle_datagram_with(now, bytes, &mut |_, _| false)
    }

    /// As [`Conn::handle_datagram`]; a new bulk fragment is handed to `place`, which puts
    /// the payload at its destination and returns false when it has none for that transfer
    /// (the fragment is then dropped and counted). Duplicates never reach `place`.
    pub fn handle_datagram_with(
        &mut self,
        now: u64,
        bytes: &[u8],
        place: &mut dyn FnMut(&BulkHeader, &[u8]) -> bool,
    ) -> Result<(), RecvError> {
        if self.dead {
            return Err(RecvError::PeerDead);
        }
        self.drive(now);
        let d = match Datagram::parse_in(bytes, self.bulk_context()) {
            Ok(d) => d,
            Err(e) => {
                if matches!(e, PacketError::BadChecksum { .. }) {
                    self.stats.dropped_corrupt += 1;
                } else {
                    self.stats.dropped_malformed += 1;
                }
                return Err(e.into());
            }
        };
        let conn = d.conn();
        if conn != self.cfg.conn_id {
            self.stats.dropped_stray += 1;
            return Err(RecvError::WrongConnection(conn));
        }
        let r = match d {
            Datagram::Data { hdr, payload, .. } => {
                let acked = hdr.ack.map_or(Ok(()), |a| {
                    self.stats.acks_received += 1;
                    self.on_ack(now, &a.ack_info(), false)
                });
                acked.and_then(|()| self.on_data(now, hdr, payload))
            }
            Datagram::Bulk { hdr, payload, .. } => self.on_bulk(now, &hdr).map(|fresh| {
                if fresh && !place(&hdr, payload) {
                    self.stats.bulk_discarded += 1;
                }
            }),
            Datagram::Ack { ack, .. } => {
                self.stats.acks_received += 1;
                self.on_ack(now, &ack, false)
            }
            Datagram::Nak { ack, .. } => {
                self.stats.naks_received += 1;
                self.on_ack(now, &ack, true)
            }
            Datagram::Ping { floor, .. } => {
                if floor > self.rcv_highest.max(self.rcv_next) + MAX_WINDOW {
                    Err(RecvError::Protocol("ping floor far beyond the window"))
                } else {
                    if !self.cfg.reliable {
                        self.skip_to(floor);
                    }
                    self.ack_now = true;
                    Ok(())
                }
            }
            Datagram::Admit { admit, .. } => {
                match admit {
                    packet::Admit::Req => self.events.push_back(Event::FastRequest),
                    packet::Admit::Release { grant } => {
                        self.events.push_back(Event::FastRelease { grant })
                    }
                    a => {
                        if let Some(granted) = self.asker.on_answer(now, a) {
                            if granted {
                                if self.asker.steered_port().is_some() {
                                    self.steer_after = Some(self.next_pn);
                                }
                                self.stats.fast_granted += 1;
                            } else {
                                self.stats.fast_refused += 1;
                            }
                            self.events.push_back(Event::Fast { granted });
                        }
                    }
                }
                Ok(())
            }
            // Connection set-up belongs to the transport, which answers it before any
            // connection sees it.
            Datagram::Hello { .. } | Datagram::Welcome { .. } => Err(RecvError::Protocol(
                "handshake datagram on an open connection",
            )),
        };
        self.asker.bulk_active(now, self.bulk_outstanding > 0);
        match r {
            Ok(()) => {
                self.last_recv = now;
                self.stats.datagrams_received += 1;
                self.stats.bytes_received += bytes.len() as u64;
            }
            Err(_) => self.stats.dropped_malformed += 1,
        }
        r
    }

    /// Packets of receive budget free: what the buffer holds less what delivered messages
    /// not yet taken use. (Asked two or three times a message: no division when nothing
    /// waits, and the budget's once, at `new`; 64-bit divisions were a visible part of a
    /// 64-byte ping-pong's user time under `perf`.)
    pub(super) fn credit(&self) -> u64 {
        let used = match self.event_bytes {
            0 => 0,
            b => b.div_ceil(self.cfg.mtu_payload) as u64,
        };
        self.recv_budget
            .saturating_sub(used)
            .min(self.cfg.recv_window)
    }

    pub(super) fn on_data(
        &mut self,
        now: u64,
        hdr: DataHeader,
        payload: &[u8],
    ) -> Result<(), RecvError> {
        if hdr.msg_len > self.cfg.max_message_len {
            return Err(RecvError::Protocol("message longer than max_message_len"));
        }
        if !self.admit(now, hdr.pn, hdr.floor)? {
            return Ok(());
        }
        if hdr.pn == self.rcv_next {
            self.rcv_next += 1;
            self.accept(hdr, payload);
            self.drain_in_order();
        } else {
            let (pn, floor) = (hdr.pn, self.rcv_next);
            let payload = payload.to_vec();
            self.slots.put(pn, floor, Slot::Frag { hdr, payload });
        }
        Ok(())
    }

    /// What the parser of a bulk datagram received on this connection needs to know
    /// ([`packet::parse_bulk`]).
    pub fn bulk_context(&self) -> BulkContext {
        BulkContext {
            conn: self.cfg.conn_id,
            next_pn: self.rcv_next,
        }
    }

    /// A bulk fragment's pn: true when new (its payload must be, or is, at its place).
    pub(super) fn on_bulk(&mut self, now: u64, hdr: &BulkHeader) -> Result<bool, RecvError> {
        if self.cfg.payload_hash && !hdr.hashed {
            return Err(RecvError::Protocol("bulk payload not hashed as agreed"));
        }
        if !self.admit(now, hdr.pn, hdr.floor)? {
            return Ok(false);
        }
        self.stats.bulk_fragments += 1;
        self.stats.bulk_hashed += u64::from(hdr.hashed);
        self.rcv_bulk_top = self.rcv_bulk_top.max(hdr.pn + 1);
        if hdr.pn == self.rcv_next {
            self.rcv_next += 1;
            self.drain_in_order();
        } else {
            self.slots.put(hdr.pn, self.rcv_next, Slot::Placed);
        }
        Ok(true)
    }

    /// Accounts a bulk fragment that a speculative receive found at its place, verified
    /// already ([`packet::parse_bulk`]), `wire_len` bytes on the wire. `Ok(true)`: new, the
    /// caller marks its bytes valid; `Ok(false)`: a duplicate or beyond the window, its
    /// bytes must be ignored.
    pub fn accept_placed(
        &mut self,
        now: u64,
        hdr: &BulkHeader,
        wire_len: usize,
    ) -> Result<bool, RecvError> {
        if self.dead {
            return Err(RecvError::PeerDead);
        }
        self.drive(now);
        match self.on_bulk(now, hdr) {
            Ok(fresh) => {
                self.last_recv = now;
                self.stats.datagrams_received += 1;
                self.stats.bytes_received += wire_len as u64;
                Ok(fresh)
            }
            Err(e) => {
                self.stats.dropped_malformed += 1;
                Err(e)
            }
        }
    }

    /// The sequencing shared by data and bulk fragments: floor, duplicates, window, NAK
    /// of new holes, ack scheduling. True when the packet is new and inside the window.
    pub(super) fn admit(&mut self, now: u64, pn: u64, floor: u64) -> Result<bool, RecvError> {
        let window = self.cfg.recv_window;
        if floor > self.rcv_next + MAX_WINDOW {
            return Err(RecvError::Protocol("floor far beyond the window"));
        }
        if !self.cfg.reliable && floor > self.rcv_next {
            self.skip_to(floor);
        }
        // The next expected packet's slot is always empty (`drain_in_order` and
        // `skip_to` empty it as `rcv_next` reaches it): the in-order case skips the load,
        // a cache miss per message (the ring is walked once per `window` packets).
        debug_assert!(!self.slots.has(self.rcv_next, self.rcv_next));
        if pn < self.rcv_next
            || pn != self.rcv_next
                && pn < self.rcv_next + window
                && self.slots.has(pn, self.rcv_next)
        {
            self.stats.duplicates += 1;
            self.ack_now = true;
            return Ok(false);
        }
        if pn >= self.rcv_next + window {
            self.stats.dropped_window += 1;
            self.ack_now = true;
            return Ok(false);
        }
        if pn > self.rcv_highest {
            // A new hole [rcv_highest, pn): NAK it at once.
            self.push_nak(self.rcv_highest, pn);
        }
        if pn != self.rcv_next {
            self.stats.out_of_order += 1;
            self.rcv_ranges.insert(pn, pn + 1, |_, _| {});
        }
        // A packet that fills a hole is acked at once: the sender learns of the repair.
        let filled_hole = pn < self.rcv_highest;
        if pn >= self.rcv_highest {
            self.rcv_highest_at = now;
        }
        self.rcv_highest = self.rcv_highest.max(pn + 1);
        self.unacked += 1;
        if filled_hole || self.unacked >= self.cfg.ack_every {
            self.ack_now = true;
        } else if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + self.cfg.ack_delay);
        }
        Ok(true)
    }

    pub(super) fn push_nak(&mut self, s: u64, e: u64) {
        if let Some(last) = self.nak_ranges.last_mut() {
            if last.1 == s {
                last.1 = e;
                return;
            }
        }
        if self.nak_ranges.len() < packet::MAX_RANGES {
            self.nak_ranges.push((s, e));
        }
    }

    pub(super) fn drain_in_order(&mut self) {
        while self.rcv_next < self.rcv_highest {
            let Some(slot) = self.slots.take(self.rcv_next) else {
                break;
            };
            self.rcv_next += 1;
            if let Slot::Frag { hdr, payload } = slot {
                self.accept(hdr, &payload);
            }
        }
        self.rcv_ranges.trim_below(self.rcv_next);
        if self.rcv_next == self.rcv_highest {
            self.slots.settle(self.rcv_next);
        }
    }

    /// Unreliable mode: stop waiting for every packet below `floor`.
    pub(super) fn skip_to(&mut self, floor: u64) {
        while self.rcv_next < floor.min(self.rcv_highest) {
            match self.slots.take(self.rcv_next) {
                Some(Slot::Frag { hdr, payload }) => {
                    self.rcv_next += 1;
                    self.accept(hdr, &payload);
                }
                Some(Slot::Placed) => self.rcv_next += 1,
                None => {
                    self.rcv_next += 1;
                    self.drop_partial();
                }
            }
        }
        if self.rcv_next < floor {
            self.drop_partial();
            self.rcv_next = floor;
            self.rcv_highest = floor;
        }
        self.drain_in_order();
    }

    pub(super) fn drop_partial(&mut self) {
        if let Some(r) = self.reasm.take() {
            self.stats.messages_dropped += 1;
            self.rcv_msg_id = r.id + 1;
        }
    }

    /// Takes the next in-order fragment.
    pub(super) fn accept(&mut self, hdr: DataHeader, payload: &[u8]) {
        if !self.cfg.reliable && hdr.msg_id > self.rcv_msg_id {
            // Whole messages vanished in a skipped hole.
            let missing = hdr.msg_id - self.rcv_msg_id - u64::from(self.reasm.is_some());
            self.stats.messages_dropped += missing;
            self.drop_partial();
            self.rcv_msg_id = hdr.msg_id;
        }
        if hdr.offset == 0 {
            if self.reasm.is_some() || hdr.msg_id != self.rcv_msg_id {
                self.violation();
                return;
            }
            let mut buf = self.spare_buf();
            if payload.len() == hdr.msg_len as usize {
                buf.extend_from_slice(payload);
                self.deliver(hdr.msg_id, hdr.tag, buf);
            } else {
                buf.reserve(hdr.msg_len as usize);
                buf.extend_from_slice(payload);
                self.reasm = Some(Reasm {
                    id: hdr.msg_id,
                    tag: hdr.tag,
                    len: hdr.msg_len,
                    buf,
                });
            }
            return;
        }
        match &mut self.reasm {
            Some(r)
                if r.id == hdr.msg_id
                    && r.tag == hdr.tag
                    && r.len == hdr.msg_len
                    && r.buf.len() == hdr.offset as usize =>
            {
                r.buf.extend_from_slice(payload);
                if r.buf.len() == r.len as usize {
                    let r = self.reasm.take().expect("reassembly in progress");
                    self.deliver(r.id, r.tag, r.buf);
                }
            }
            _ if !self.cfg.reliable && hdr.msg_id < self.rcv_msg_id => {
                // The tail of a message already dropped.
            }
            None if !self.cfg.reliable => {
                // The head of this message was lost: drop the rest of it.
                self.stats.messages_dropped += 1;
                self.rcv_msg_id = hdr.msg_id + 1;
            }
            _ => self.violation(),
        }
    }

    pub(super) fn violation(&mut self) {
        // Checksummed and in sequence yet inconsistent: the peer is buggy or forged.
        self.stats.dropped_malformed += 1;
        self.drop_partial();
    }

    pub(super) fn deliver(&mut self, id: u64, tag: u64, data: Vec<u8>) {
        self.rcv_msg_id = id + 1;
        self.stats.messages_delivered += 1;
        self.event_bytes += data.len();
        self.events.push_back(Event::Message {
            id: MsgId(id),
            tag,
            data,
        });
    }

    /// The packets of `ranges` (from `from` on) not received yet, as at most
    /// [`packet::MAX_RANGES`] ranges.
    pub(super) fn still_missing(&self, ranges: &[(u64, u64)], from: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(s, e) in ranges {
            for pn in s.max(from)..e.min(self.rcv_highest) {
                if self.slots.has(pn, self.rcv_next) {
                    continue;
                }
                if let Some(last) = out.last_mut().filter(|l| l.1 == pn) {
                    last.1 = pn + 1;
                } else if out.len() == packet::MAX_RANGES {
                    return out;
                } else {
                    out.push((pn, pn + 1));
                }
            }
        }
        out
    }

    /// The ack that is due, built and counted as sent (whatever datagram carries it).
    pub(super) fn take_ack(&mut self, now: u64) -> AckInfo {
        let ack = self.build_ack(now);
        self.ack_now = false;
        self.ack_deadline = None;
        self.unacked = 0;
        self.bulk_since_ack = 0;
        self.advertised_limit = ack.limit;
        ack
    }

    pub(super) fn build_ack(&self, now: u64) -> AckInfo {
        let limit = (self.rcv_next + self.credit()).max(self.advertised_limit);
        let ranges = self.rcv_ranges.iter().take(packet::MAX_RANGES).collect();
        let delay_us = now.saturating_sub(self.rcv_highest_at) / 1000;
        AckInfo {
            cum: self.rcv_next,
            limit,
            delay_us: delay_us.min(u64::from(packet::MAX_ACK_DELAY_US)) as u32,
            ranges,
        }
    }

    /// The in-order part of the ack this side would send now, for someone else to repeat
    /// while the application is away (the keepalive thread of `clink`): every packet below
    /// the first is here, and the peer may send below the second (the credit already
    /// advertised: no new credit is given for a buffer nobody drains). `None` in
    /// unreliable mode and before anything arrived. Sent with [`MAX_ACK_DELAY_US`] as its
    /// delay (it times nothing), it completes the peer's sends whose last ack was lost
    /// after this side's application stopped driving the connection.
    ///
    /// [`MAX_ACK_DELAY_US`]: packet::MAX_ACK_DELAY_US
    pub fn standing_ack(&self) -> Option<(u64, u64)> {
        (self.cfg.reliable && self.rcv_next > 0)
            .then(|| (self.rcv_next, self.advertised_limit.max(self.rcv_next)))
    }

    /// Acknowledges what has arrived with the next [`Conn::poll_transmit`] instead of
    /// after the ack delay (if anything is unacknowledged): the peer is waiting on it,
    /// say the last fragments of a bulk transfer whose send completes with their ack,
    /// while the application that received the message may stop driving this side.
    pub fn ack_now(&mut self) {
        if self.ack_deadline.is_some() {
            self.ack_now = true;
        }
    }

    /// Makes the next data datagram carry the ack (as a piggybacked one, when nothing
    /// arrived out of order) instead of an ack datagram of its own before it, even when
    /// nothing new is to be acknowledged. For a message whose arrival must imply the ack:
    /// a goodbye sent after a received transfer, which the peer reads as "requests
    /// towards me fail", must not overtake the ack that completes the peer's send (a
    /// lost ack datagram let it do so).
    pub fn ack_with_next_data(&mut self) {
        self.ack_now = false;
        self.ack_deadline = Some(self.last_driven + self.cfg.ack_delay);
    }

    /// When a delayed ack is due (included in [`Conn::poll_timeout`]).
    pub fn ack_timeout(&self) -> Option<u64> {
        self.ack_deadline.filter(|_| !self.dead)
    }
}
