//! Tripwires and the event queue: arming a watched range, firing it when a write lands,
//! waiting on one or a set, and the endpoint's events (interest, pop, wait, other threads'
//! posts).

use super::*;

impl Endpoint {
    /// Arms a tripwire on `offset..offset+len` of an aperture.
    pub fn tripwire(
        &mut self,
        ap: ApertureId,
        offset: u64,
        len: u64,
        opts: TripOptions,
    ) -> Result<TripId> {
        let a = self.rma.aps.get(&ap.0).ok_or_else(|| no_aperture(ap))?;
        if offset.checked_add(len).is_none_or(|e| e > a.len) {
            return Err(Error::Invalid(format!(
                "tripwire {offset}+{len} outside aperture of {} bytes",
                a.len
            )));
        }
        let on = if opts.reads { READ } else { 0 } | if opts.writes { WRITE } else { 0 };
        let id = self
            .rma
            .trips
            .insert(tripwire::Spec {
                aperture: ap.0,
                start: offset,
                len,
                on,
                once: opts.once,
            })
            .map_err(|e| Error::Invalid(format!("tripwire: {e}")))?;
        let n = self.rma.trips.index_bound();
        let st = &mut self.rma;
        if st.meta.len() < n {
            st.meta.resize(n, TripMeta::default());
            st.bits.resize(n.div_ceil(64), 0);
        }
        let k = id.index as usize;
        st.meta[k] = TripMeta {
            gen: id.gen,
            count: 0,
            event: opts.event,
        };
        st.bits[k / 64] &= !(1 << (k % 64));
        Ok(id)
    }

    /// Disarms a tripwire; false when it was not armed (stale id, or a once-only one that
    /// fired).
    pub fn tripwire_remove(&mut self, id: TripId) -> bool {
        self.rma.trips.remove(id).is_some()
    }

    /// Whether the tripwire fired since armed or last cleared (a bit read, no system call;
    /// no progress is made: call [`Endpoint::progress`] to apply what peers sent).
    pub fn tripwire_fired(&self, id: TripId) -> bool {
        self.trip_slot(id)
            .is_some_and(|k| self.rma.bits[k / 64] & (1 << (k % 64)) != 0)
    }

    /// Clears the fired bit of a tripwire.
    pub fn tripwire_clear(&mut self, id: TripId) {
        if let Some(k) = self.trip_slot(id) {
            self.rma.bits[k / 64] &= !(1 << (k % 64));
        }
    }

    /// How many times the tripwire fired since armed.
    pub fn tripwire_count(&self, id: TripId) -> u64 {
        self.trip_slot(id).map_or(0, |k| self.rma.meta[k].count)
    }

    /// The slot of tripwire `id`, unless it was reused by a later tripwire since.
    pub(super) fn trip_slot(&self, id: TripId) -> Option<usize> {
        let k = id.index as usize;
        self.rma.meta.get(k).filter(|m| m.gen == id.gen).map(|_| k)
    }

    /// Waits (spinning, then blocking) until a tripwire of `set` fires; returns it with its
    /// bit cleared. Bits that were already set count.
    pub fn wait_tripset(&mut self, set: &Tripset, timeout: Option<Duration>) -> Result<TripId> {
        self.wait_trips(&set.ids, timeout)
    }

    /// Waits until one tripwire fires (see [`Endpoint::wait_tripset`]).
    pub fn wait_tripwire(&mut self, id: TripId, timeout: Option<Duration>) -> Result<()> {
        self.wait_trips(&[id], timeout).map(|_| ())
    }

    /// As [`Endpoint::wait_tripset`], over a slice of ids.
    pub(crate) fn wait_trips(
        &mut self,
        ids: &[TripId],
        timeout: Option<Duration>,
    ) -> Result<TripId> {
        if ids.is_empty() {
            return Err(Error::Invalid("wait on an empty tripset".into()));
        }
        let mut hit = None;
        self.wait_until(timeout, |ep| {
            hit = ids.iter().copied().find(|&t| ep.tripwire_fired(t));
            hit.is_some()
        })?;
        let t = hit.ok_or(Error::Timeout)?;
        self.tripwire_clear(t);
        Ok(t)
    }

    /// Fires the tripwires an access of `len` bytes at `at` of aperture `ap` touches.
    pub(in crate::endpoint) fn fire(
        &mut self,
        ap: u32,
        at: u64,
        len: u64,
        kind: u8,
        peer: Option<PeerId>,
    ) {
        self.fire_first(ap, at, len, kind, peer, false);
    }

    /// As [`Endpoint::fire`]; with `take`, the first tripwire whose event would be queued
    /// is returned instead (the others are queued), packed as `gen << 32 | index`
    /// ([`NO_TRIP`]: none): the caller builds that event from scalars, which spares a
    /// 40-byte event a round trip through the queue's memory (written field by field,
    /// read back in wider moves that stall on store forwarding; so does an
    /// `Option<TripId>` passed through memory, hence one word). Only for a caller whose
    /// own events are all taken (the queue's order is kept).
    pub(super) fn fire_first(
        &mut self,
        ap: u32,
        at: u64,
        len: u64,
        kind: u8,
        peer: Option<PeerId>,
        take: bool,
    ) -> u64 {
        if self.rma.trips.is_empty() {
            return NO_TRIP;
        }
        let RmaState {
            trips, meta, bits, ..
        } = &mut self.rma;
        let (evq, stats) = (&mut self.evq, &mut self.stats);
        let mut first = NO_TRIP;
        let take = take && evq.wants(events::TRIPWIRES);
        trips.fire(ap, at, len, kind, |id, _| {
            let k = id.index as usize;
            let m = &mut meta[k];
            m.count += 1;
            bits[k / 64] |= 1 << (k % 64);
            stats.tripwires_fired += 1;
            if m.event {
                if take && first == NO_TRIP {
                    first = u64::from(id.gen) << 32 | u64::from(id.index);
                    return;
                }
                evq.push(
                    events::TRIPWIRES,
                    Event::Tripwire {
                        id,
                        peer,
                        offset: at,
                        len,
                        write: kind & WRITE != 0,
                    },
                );
            }
        });
        first
    }

    /// Chooses the event sources queued ([`crate::events::ALL`] or a mask of
    /// [`crate::events::MESSAGES`], `RMA`, `TRIPWIRES`, `PEERS`, `REQUESTS`). Nothing is
    /// queued by default.
    pub fn set_interest(&mut self, mask: u32) {
        self.evq.interest = mask;
    }

    /// The next queued event, without making progress (after [`Endpoint::progress`]).
    pub fn pop_event(&mut self) -> Option<Event> {
        self.evq.pop()
    }

    /// The next event, without a system call when one is queued; otherwise makes progress
    /// once and looks again.
    pub fn next_event(&mut self) -> Option<Event> {
        if let Some(e) = self.evq.pop() {
            return Some(e);
        }
        self.progress();
        self.evq.pop()
    }

    /// Waits (spin, then block on the endpoint's fd) for the next event, at most `timeout`.
    pub fn wait_event(&mut self, timeout: Option<Duration>) -> Result<Event> {
        if let Some(e) = self.evq.pop() {
            return Ok(e);
        }
        if let Some(e) = self.event_fast(timeout) {
            return Ok(e);
        }
        self.wait_until(timeout, |ep| !ep.evq.is_empty())?;
        self.evq.pop().ok_or(Error::Timeout)
    }

    /// The latency fast path of [`Endpoint::wait_event`] (what `recv_fast` is to a
    /// receive): while only shared-memory peers with nothing queued either way are polled,
    /// apply small puts straight off their rings until an event is queued. Gives up
    /// (`None`) at anything else at a ring's head, after the spin time or `timeout`
    /// (whichever is shorter, looked at every 64 polls, at most 4096 polls), or after
    /// [`FAST_STREAK`] events in a row, leaving it to the general path (a full progress
    /// pass per poll: transmits, timers, request completions, the liveness check). It
    /// stands aside while a pass has work of its own: watched requests, detached sends,
    /// pending handshakes, the activity board.
    pub(super) fn event_fast(&mut self, timeout: Option<Duration>) -> Option<Event> {
        if self.ready.on
            || self.peers.is_empty()
            || self.fast_streak >= FAST_STREAK
            || self.req.watching() != 0
            || !self.req.detached.is_empty()
            || !self.incoming.is_empty()
        {
            return None;
        }
        let limit = match (self.ctx.config.spin, timeout) {
            (Some(s), Some(t)) => Some(s.min(t)),
            (s, t) => s.or(t),
        };
        if limit.is_some_and(|l| l.is_zero()) {
            return None;
        }
        let mut start = None;
        for spin in 0..4096u32 {
            // Only a put applied here queues an event (looked at right after it), or a
            // post from another thread: that ring is looked at every 64 polls, and the
            // clock too (first read at the first such look).
            if spin % 64 == 63 {
                if let Some(e) = self.evq.pop() {
                    self.fast_streak += 1;
                    return Some(e);
                }
                let now = Instant::now();
                let since = *start.get_or_insert(now);
                if limit.is_some_and(|l| now - since >= l) {
                    return None;
                }
            }
            for i in 0..self.peers.len() {
                let p = &mut self.peers[i];
                let rec = match p.quiet_head() {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(()) => return None,
                };
                // As in `handle`: the record is not released before `serve` returns.
                let lease = p.link.frame_lease(&self.nets, i, rec);
                let bytes = lease.bytes();
                let Some(RmaFrame::Put { req, to, data }) = rma_put(bytes) else {
                    return None;
                };
                let taken = self.serve_put_take(i, req, to, data, true);
                self.release_frame(i, rec);
                if let Some(e) = taken {
                    self.fast_streak += 1;
                    return Some(e);
                }
                // Only the put just applied can have queued an own event; posts from
                // other threads are looked at every 64 polls.
                if let Some(e) = self.evq.pop_own() {
                    self.fast_streak += 1;
                    return Some(e);
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// A handle other threads use to post [`Event::User`] events into this endpoint's
    /// queue (waking it when it sleeps).
    pub fn event_sender(&self) -> EventSender {
        self.evq.sender(self.doorbell.clone())
    }
}
