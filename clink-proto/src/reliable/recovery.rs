//! Timers and loss recovery: the retransmission timeout and its backoff, tail probes,
//! liveness (pings and death), the undo of spurious timeouts and window cuts, and marking
//! packets lost.

use super::*;

impl Conn {
    /// Earliest time at which [`Conn::handle_timeout`] must be called, if any. Valid until
    /// the next call of any other method.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.dead {
            return None;
        }
        let mut t = self.rto_deadline;
        let mut min = |x: Option<u64>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        min(self.tlp_deadline);
        min(self.ack_deadline);
        min(self.asker.poll_timeout());
        if self.cfg.keepalive > 0 {
            min(Some(
                self.last_recv.max(self.last_ping) + self.cfg.keepalive,
            ));
        }
        if self.liveness_watched() {
            min(Some(self.last_recv + self.cfg.dead_after));
        }
        min(self.await_probe_at());
        min(self.probe_evidence_at());
        t
    }

    /// Says whether the caller awaits something from the peer (a receive it posted, an
    /// answer to a send): while it does, a silent peer is pinged after
    /// [`Config::await_probe`] rather than [`Config::keepalive`], so a peer that is gone
    /// is found quickly (a live one answers each ping with an ack).
    pub fn set_awaited(&mut self, on: bool) {
        self.awaited = on;
    }

    /// When the next ping of an awaited peer is due: `await_probe` after the last thing
    /// heard, then after each ping a silence as long as the one before it (the interval
    /// doubles while pings go unanswered), at most `keepalive`.
    pub(super) fn await_probe_at(&self) -> Option<u64> {
        if !self.awaited || self.cfg.await_probe == 0 || self.cfg.keepalive == 0 {
            return None;
        }
        let silence = self.last_ping.saturating_sub(self.last_recv);
        let step = silence.clamp(
            self.cfg.await_probe,
            self.cfg.keepalive.max(self.cfg.await_probe),
        );
        Some(self.last_recv.max(self.last_ping) + step)
    }

    pub(super) fn liveness_watched(&self) -> bool {
        self.cfg.keepalive > 0 || !self.is_idle()
    }

    /// Notes a call of the caller's at `now` (a timer run, a datagram fed in).
    ///
    /// Silence the caller did not watch is not the peer's. With keepalives on, a present
    /// caller drives the connection at least every keepalive interval; a gap of two or
    /// more means it was away (computing without calling in, descheduled, stopped), and
    /// whatever the peer sent meanwhile waited in a socket the caller had not read. The
    /// peer gets a full timeout from now instead of being judged on that gap, and the
    /// acks that waited time nothing: what they measure is the absence, not the path
    /// (their packets were sent before `back_at`, see `on_ack`).
    pub(super) fn drive(&mut self, now: u64) {
        let away = self.cfg.keepalive > 0
            && now.saturating_sub(self.last_driven) >= 2 * self.cfg.keepalive;
        self.last_driven = self.last_driven.max(now);
        self.trim_spares(now);
        if away {
            self.stats.absences_excused += 1;
            self.last_recv = self.last_recv.max(now);
            self.back_at = now;
        }
    }

    /// Runs the timers due at `now`. Call [`Conn::poll_transmit`] and
    /// [`Conn::poll_event`] afterwards.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.dead {
            return;
        }
        self.drive(now);
        if self.liveness_watched() && now >= self.last_recv + self.cfg.dead_after {
            self.dead = true;
            self.events.push_back(Event::PeerDead);
            return;
        }
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_now = true;
        }
        let keepalive_due = self.cfg.keepalive > 0
            && now >= self.last_recv.max(self.last_ping) + self.cfg.keepalive;
        if keepalive_due || self.await_probe_at().is_some_and(|t| now >= t) {
            self.ping_pending = true;
            self.last_ping = now;
        }
        // (A transfer queued since the last datagram must stop the linger first.)
        self.asker.bulk_active(now, self.bulk_outstanding > 0);
        self.asker.handle_timeout(now);
        if self.probe_evidence_at().is_some_and(|t| t <= now) {
            self.promote_probe_acks(now);
            self.detect_lost();
        }
        if self.rto_deadline.is_some_and(|d| d <= now) {
            self.on_rto(now);
        } else if self.tlp_deadline.is_some_and(|d| d <= now) {
            self.on_tail_probe();
        }
    }

    /// The probe timeout: two RTTs plus the peer's ack delay (a lone packet's ack may be
    /// delayed); `None` before an RTT sample.
    pub(super) fn pto(&self) -> Option<u64> {
        self.rtt.has.then(|| 2 * self.rtt.srtt + self.cfg.ack_delay)
    }

    /// (Re)starts the probe timer after a transmission or progress, while packets are in
    /// flight and the probe would come before the retransmission timer.
    pub(super) fn arm_tail_probe(&mut self, now: u64) {
        self.tlp_deadline = match (self.pto(), self.rto_deadline) {
            (Some(p), Some(r)) if self.in_flight > 0 && self.probes < MAX_PROBES && now + p < r => {
                Some(now + p)
            }
            _ => None,
        };
    }

    /// RFC 8985's tail loss probe: when the last packets of a flight are lost nothing
    /// later is acked, so neither SACK nor the receiver's NAK can tell, and only the
    /// retransmission timer (>= `min_rto`, then a window of 2) would. Resending the
    /// highest packet in flight instead makes the receiver NAK the hole below it (or, if
    /// the probe was a duplicate, ack with SACK at once), believed after a wait (the probe
    /// may have overtaken the flight: `promote_probe_acks`). No window change. A second probe
    /// without progress resends the *lowest* packet in flight: the hole that holds the
    /// cumulative ack back, when the acks' few SACK ranges cannot reach the highest (a
    /// livelock the simulator found: probes of a packet the receiver had, acked as
    /// duplicates, forever). Then only the timer. Unreliable mode resends nothing: a ping
    /// asks for the ack that tells what to abandon.
    pub(super) fn on_tail_probe(&mut self) {
        self.tlp_deadline = None;
        self.stats.tail_probes += 1;
        self.probes += 1;
        if !self.cfg.reliable {
            self.ping_pending = true;
            return;
        }
        if let Some(pn) = self.in_flight_end(self.probes == 1) {
            self.probe = Some(pn);
        }
    }

    /// The highest packet still in flight, or the lowest: what a probe resends.
    fn in_flight_end(&self, highest: bool) -> Option<u64> {
        let in_flight = |s: &Sent| s.state == PState::InFlight;
        let i = if highest {
            self.sent.iter().rposition(in_flight)
        } else {
            self.sent.iter().position(in_flight)
        };
        i.map(|i| self.snd_una + i as u64)
    }

    pub(super) fn rto(&self) -> u64 {
        let base = if self.rtt.has {
            self.rtt.srtt + (4 * self.rtt.rttvar).max(1000) + self.cfg.ack_delay
        } else {
            self.cfg.initial_rto
        };
        let base = base.clamp(self.cfg.min_rto, self.cfg.max_rto);
        (base << self.backoff).min(self.cfg.max_rto)
    }

    pub(super) fn outstanding(&self) -> bool {
        self.snd_una < self.next_pn || !self.send_queue.is_empty()
    }

    pub(super) fn on_rto(&mut self, now: u64) {
        self.stats.timeouts += 1;
        // Timeouts without progress probe, as QUIC's PTO does, and condemn nothing: the
        // first resends the highest packet in flight (whose arrival makes the receiver
        // NAK any hole below it), the next the lowest (the hole that holds the cumulative
        // ack back, should the acks' SACK ranges not reach the highest), then the highest
        // again. A receiver that only stalled (descheduled on a host with more runnable
        // threads than cores) then acks the whole flight; such stalls outlast a timeout
        // or two when a queue holds the RTT at milliseconds (ARCHITECTURE.md, "What a
        // timeout does"). Only when `RTO_PROBES` probes went unanswered is it persistent
        // congestion: all lost, window of 2.
        let probe = (self.cfg.reliable && self.backoff < RTO_PROBES)
            .then(|| self.in_flight_end(self.backoff.is_multiple_of(2)))
            .flatten();
        if let Some(pn) = probe {
            self.probe = Some(pn);
            self.stats.rto_probes += 1;
            self.backoff += 1;
            self.rto_deadline = Some(now + self.rto());
            self.tlp_deadline = None;
            return;
        }
        // Only now is a steered grant dropped: dropped while probing, the stream's new
        // fragments would take the receiver's main socket, be read before the flight
        // still queued on the steered one, and make the receiver NAK all of it.
        self.asker.on_timeout(now);
        let mut flight = 0;
        for i in 0..self.sent.len() {
            if self.sent[i].state == PState::InFlight {
                let pn = self.snd_una + i as u64;
                self.mark_lost(pn, false);
                flight += 1;
            }
        }
        if flight > 0 {
            // The flight's fate is now the timeout's to prove (its own undo).
            self.cut_undo = None;
            self.rto_undo = Some((self.cwnd, self.ssthresh));
            // A flight no larger than the initial window (sent without any evidence of
            // the path's capacity) cannot have overfilled it: its timeouts say the peer
            // or the path went quiet, not that the window was too large, so the
            // threshold stays and the window regrows in slow start once acks come. (A
            // peer process busy for tens of milliseconds with one small message in
            // flight, a single packet that a probe resent so no ack can prove the
            // timeout spurious, otherwise left the threshold at 5 packets and every
            // later bulk transfer in linear growth: a `clink cast` hop ran at a third of
            // its rate for seconds.)
            if flight > self.cfg.initial_cwnd {
                self.ssthresh = (self.cwnd / 2).max(2);
            }
            self.cwnd = 2;
            self.cwnd_acc = 0;
            self.recovery_tx = self.next_tx_seq;
            self.stats.congestion_events += 1;
        } else if self.outstanding() {
            // Nothing in flight but data waits: the credit is exhausted. Probe.
            self.ping_pending = true;
        }
        self.advance_una();
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
        self.rto_deadline = self.outstanding().then(|| now + self.rto());
        self.tlp_deadline = None;
    }

    /// The last timeout condemned a flight that the receiver had, only late (its acks
    /// held back: a receiver that did not read for a few milliseconds, a host that
    /// descheduled it). Proof: an ack of a packet marked lost and never resent (only its
    /// first transmission can have arrived; retransmitted ones prove nothing, Karn's
    /// rule). Then, as F-RTO and Eifel do, the window and threshold go back to what they
    /// were and the packets still queued for resending are in flight again (the loss
    /// detector condemns any that really were lost).
    pub(super) fn undo_spurious_timeout(&mut self) {
        let Some((cwnd, ssthresh)) = self.rto_undo.take() else {
            return;
        };
        self.cwnd = self.cwnd.max(cwnd);
        self.ssthresh = ssthresh;
        self.cwnd_acc = 0;
        self.stats.spurious_timeouts += 1;
        for s in self.sent.iter_mut() {
            if s.state == PState::Lost && s.tx_count == 1 {
                s.state = PState::InFlight;
                self.in_flight += 1;
                // Counted when the timeout alone condemned it (see `Stats::reprieved`).
                self.stats.reprieved += u64::from(s.timer_only);
            }
        }
    }

    /// The loss detector's last window reduction was spurious: every packet it condemned
    /// (a NAK, or later packets acked first) was acked before it was resent, so only its
    /// first transmission can have arrived; they were reordered (two receive sockets
    /// read in turn, a sender that moved between cores with packets queued on the one it
    /// left), not lost. As Linux undoes a recovery that DSACKs prove needless, the window
    /// and threshold go back to what they were.
    pub(super) fn undo_spurious_cut(&mut self, u: CutUndo) {
        self.cwnd = self.cwnd.max(u.cwnd);
        self.ssthresh = self.ssthresh.max(u.ssthresh);
        self.cwnd_acc = 0;
        self.stats.spurious_cuts += 1;
    }

    /// Marks an in-flight packet lost: queued for retransmission, or abandoned.
    pub(super) fn mark_lost(&mut self, pn: u64, congestion: bool) {
        let idx = (pn - self.snd_una) as usize;
        let s = &mut self.sent[idx];
        if s.state != PState::InFlight {
            return;
        }
        self.in_flight -= 1;
        self.stats.lost += 1;
        if congestion {
            s.timer_only = false;
            // (A timeout's wholesale marking is not a loss rate.) A run of consecutive
            // packets lost together is one event: one drop of one burst (a segmentation
            // offload batch is one packet to the links it crosses, and a lossy link that
            // drops it takes dozens of datagrams at once).
            if self.round.last_lost.is_none_or(|l| l + 1 != pn) {
                self.round.lost += 1;
            }
            self.round.last_lost = Some(pn);
        }
        if self.cfg.reliable {
            s.state = PState::Lost;
            self.lost.insert(pn);
        } else {
            s.state = PState::Abandoned;
            self.stats.abandoned += 1;
        }
        // One reduction per epoch: only the loss of a transmission made after the last
        // reduction reduces again (lost retransmissions included).
        let tx_seq = s.tx_seq;
        if congestion && tx_seq >= self.recovery_tx {
            if self.random_loss() {
                self.stats.random_losses += 1;
                return;
            }
            self.cut_undo = self.cfg.reliable.then_some(CutUndo {
                cwnd: self.cwnd,
                ssthresh: self.ssthresh,
                cut: self.stats.congestion_events + 1,
                unproven: 0,
            });
            self.ssthresh = (self.cwnd / 2).max(2);
            self.cwnd = self.ssthresh;
            self.cwnd_acc = 0;
            self.recovery_tx = self.next_tx_seq;
            self.stats.congestion_events += 1;
            // The losses that made this cut do not make the next one.
            self.round = Round {
                end_tx: self.next_tx_seq,
                ..Round::default()
            };
        }
        // The loss belongs to the open cut's epoch (the one that made it, or one after
        // it before the window shrank again): its ack may prove the cut spurious.
        if let Some(u) = self
            .cut_undo
            .as_mut()
            .filter(|_| congestion && tx_seq < self.recovery_tx)
        {
            self.sent[idx].condemned_by = u.cut;
            u.unproven += 1;
        }
    }

    /// Whether the smoothed RTT shows no queue on the path: below
    /// [`Config::congestion_rtt_factor`] times the minimum or within
    /// [`Config::congestion_queue_floor`] of it (see the module docs). False before an RTT
    /// sample and when the test is off (factor 0).
    pub(super) fn no_queue(&self) -> bool {
        let r = &self.rtt;
        let factor = self.cfg.congestion_rtt_factor;
        let queue_at = r
            .min
            .saturating_mul(factor)
            .max(r.min + self.cfg.congestion_queue_floor);
        factor != 0 && r.has && r.srtt < queue_at
    }

    /// Whether the smoothed RTT shows a queue: the test [`Conn::no_queue`] makes, failed
    /// on a sample rather than for want of one (false before an RTT sample and when the
    /// test is off).
    pub(super) fn queued(&self) -> bool {
        self.cfg.congestion_rtt_factor != 0 && self.rtt.has && !self.no_queue()
    }

    /// Is this loss random rather than congestion? See the module docs.
    pub(super) fn random_loss(&self) -> bool {
        if !self.no_queue() {
            return false;
        }
        let (sent, lost) = (
            self.round.sent + self.round.prev_sent,
            self.round.lost + self.round.prev_lost,
        );
        lost < 3 || lost * 100 <= sent * self.cfg.congestion_loss_pct
    }
}
