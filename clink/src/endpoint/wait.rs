//! Waiting: spinning, then sleeping in epoll or on a peer's doorbell until a condition
//! holds or a timeout passes; the endpoint's file descriptor for an application's own
//! event loop; lingering at close.

use super::*;

/// Two clock readings of a spinning wait, sixteen idle polls apart, at least this far
/// apart in time: the thread was off its CPU in between (sixteen polls take a few
/// microseconds, tens with many sockets to read).
const SPIN_GAP: Duration = Duration::from_micros(200);

impl Endpoint {
    /// Drives the endpoint until `done` holds: a progress pass, then `done`, spinning for
    /// up to the configured spin time (`CLINK_SPIN_US`; not while spins keep failing, as
    /// on a CPU shared with the peer), then sleeping on the endpoint's fd between passes.
    /// The endpoint's own blocking calls wait this way; this one is for what they do not
    /// cover (the first of several requests of different kinds, a condition of the
    /// caller's). `done` should look only at what the endpoint's progress can change.
    /// `Error::Timeout` after `timeout`.
    ///
    /// ```
    /// use clink::{Context, Selector};
    /// use std::time::Duration;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new()?;
    /// let mut a = ctx.endpoint()?;
    /// let addr = a.address();
    /// let other = std::thread::spawn(move || -> clink::Result<()> {
    ///     let mut b = Context::new()?.endpoint()?;
    ///     let p = b.connect(&addr)?;
    ///     b.send(p, 1, b"ping")
    /// });
    /// let p = a.accept(Some(Duration::from_secs(10)))?;
    /// // The first of two receives, whichever message comes.
    /// let reqs = [
    ///     a.irecv(Selector::exact(Some(p), 1), vec![0; 8])?,
    ///     a.irecv(Selector::exact(Some(p), 2), vec![0; 8])?,
    /// ];
    /// let mut first = None;
    /// a.wait_until(Some(Duration::from_secs(10)), |ep| {
    ///     first = reqs.iter().find_map(|r| ep.test_recv(r).transpose());
    ///     first.is_some()
    /// })?;
    /// let got = first.expect("done")?;
    /// assert_eq!((&got.buf[..], got.status.tag), (&b"ping"[..], 1));
    /// other.join().expect("the other thread")?;
    /// # Ok(()) }
    /// ```
    pub fn wait_until(
        &mut self,
        timeout: Option<Duration>,
        done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        self.wait_for(timeout, true, None, done)
    }

    /// [`Self::wait_until`]; `futex`: the wait may sleep on a lone peer's futex (only what
    /// that peer sends, or its exit, can end it); `since`: when the caller began spinning
    /// for the same thing (the spin time and the timeout count from there).
    pub(super) fn wait_for(
        &mut self,
        timeout: Option<Duration>,
        futex: bool,
        since: Option<Instant>,
        done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        let r = self.wait_inner(timeout, futex, since, done);
        if self.awaiting {
            self.mark_awaited(false);
        }
        r
    }

    /// [`Endpoint::wait_for`] itself.
    pub(super) fn wait_inner(
        &mut self,
        timeout: Option<Duration>,
        futex: bool,
        since: Option<Instant>,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<()> {
        if done(self) {
            return Ok(());
        }
        // The clock is read only every 16 idle polls; `start` on the first such read.
        let mut start: Option<Instant> = since;
        let spin = self.ctx.config.spin;
        // With no spin time at all, or while spins keep failing, go to sleep after the
        // first empty poll.
        let no_spin = spin == Some(Duration::ZERO) || (spin.is_some() && !self.spin_open());
        // Whether this wait's spin is judged: a hit or a miss counts once (a spin that ran
        // out is a miss, whether the wait then sleeps or finds work as it arms); a wait
        // that does not spin, or spins for ever, counts for neither.
        let mut judged = no_spin || spin.is_none();
        let mut polls: u32 = 0;
        // A wake-up has just read the sockets: the pass after it only matches what came.
        let mut woken = false;
        // The first idle clock reading since the last pass that did something (at most
        // 16 polls after it).
        let mut quiet_since: Option<Instant> = None;
        // The last clock reading with only idle polls since (none after a pass that did
        // something), and whether two such readings were far apart: the thread was off
        // its CPU while it spun, and whatever came meanwhile came because it was.
        let mut idle_at: Option<Instant> = None;
        let mut lost_cpu = false;
        // Whether a pass found nothing to do.
        let mut idled = false;
        loop {
            let did = self.progress_pass(!std::mem::take(&mut woken));
            if done(self) {
                // (Done without an idle pass, it says nothing of spinning.)
                if !judged && idled {
                    if lost_cpu {
                        self.spin_failed();
                    } else {
                        self.spin_gate.hit();
                    }
                }
                return Ok(());
            }
            polls = polls.wrapping_add(1);
            if did {
                quiet_since = None;
                idle_at = None;
            } else {
                idled = true;
            }
            if did || (!no_spin && !polls.is_multiple_of(16)) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if idle_at.replace(now).is_some_and(|t| now - t >= SPIN_GAP) {
                lost_cpu = true;
            }
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
                Some(_) if no_spin => false,
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
            if !std::mem::replace(&mut judged, true) {
                self.spin_failed();
            }
            if let Some(i) = self.futex_peer().filter(|_| futex) {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                self.futex_sleep(i, left.map_or(FUTEX_SLEEP_MAX, |l| l.min(FUTEX_SLEEP_MAX)));
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
                // A TCP peer's host that is gone sends nothing to wake the sleep.
                if let Some(tcp) = self.nets.tcp.as_ref().filter(|t| !t.peers.is_empty()) {
                    t = t.min(tcp.acks_interval());
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

    /// Whether a wait may spin before it sleeps ([`clink_proto::spin::SpinGate`]); reads
    /// the clock only while the gate may be closed.
    #[inline]
    pub(super) fn spin_open(&self) -> bool {
        !self.spin_gate.maybe_closed() || self.spin_gate.open(sys::monotonic_ns())
    }

    /// A wait spun in vain: the gate closes after several in a row.
    fn spin_failed(&self) {
        self.spin_gate.miss(sys::monotonic_ns());
    }

    /// The peer a wait may sleep on through its futex instead of epoll: the only live peer,
    /// over shared memory, and nothing else that could need a wake-up: no live network
    /// peer (so no protocol timer), no activity board, no event senders on other threads,
    /// no connection being set up, nothing waiting for ring space or for the copy engine.
    /// (A connection that starts meanwhile waits up to [`FUTEX_SLEEP_MAX`].)
    pub(super) fn futex_peer(&self) -> Option<usize> {
        if self.ready.on
            || self.nets.tcp.as_ref().is_some_and(|t| t.handshaking())
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
        (shm.tether.is_some()
            && p.txq.is_empty()
            && p.rndv.chunks.is_empty()
            && p.engine.is_empty())
        .then_some(i)
    }

    /// Sleeps on peer `i`'s futex (see [`Self::futex_peer`]) for at most `timeout`: sets
    /// the ring's sleep flag to [`Wake::Futex`] (the peer's next commit wakes the futex),
    /// re-checks, then waits while the flag holds. A sleep that times out looks at the
    /// pair's tether: the peer's exit drops it, and the next sleep, in epoll, sees the
    /// peer's socket hang up.
    pub(super) fn futex_sleep(&mut self, i: usize, timeout: Duration) {
        let Some(shm) = self.peers[i].link.shm_mut() else {
            return;
        };
        shm.rx.arm_sleep(Wake::Futex);
        if shm.rx.publish() {
            shm.wake();
            self.stats.doorbells += 1;
        }
        let busy = self.progress_pass(false)
            || !self.peers[i].engine.is_empty()
            || matches!(self.peers[i].link.peek(&self.nets, i), Ok(Some(_)))
            || !self.evq.is_empty();
        let Some(shm) = self.peers[i].link.shm_mut() else {
            return;
        };
        if !busy {
            self.stats.sleeps += 1;
            self.stats.futex_sleeps += 1;
            let flag = shm.rx.mem().sleep_flag();
            match sys::futex_wait(flag, Wake::Futex as u32, timeout) {
                Ok(sys::FutexWait::Woken) => {}
                Ok(sys::FutexWait::TimedOut) => {
                    if shm.tether.as_ref().is_some_and(|t| t.hung_up()) {
                        shm.tether = None;
                    }
                }
                Err(e) => {
                    tracing::warn!("futex: {e}");
                    shm.tether = None;
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
    pub(super) fn arm(&mut self) -> bool {
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
            let waiting = !p.txq.is_empty() || !p.rndv.chunks.is_empty();
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
                !p.engine.is_empty() || matches!(p.link.peek(&self.nets, i), Ok(Some(_)))
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

    /// Progresses until nothing queued towards a live peer is left (frames waiting for
    /// room, bytes a network link holds), for as long as the peers keep taking it: it
    /// gives up once nothing has moved for `stall`. Waits as any wait does (spin, then
    /// sleep until a datagram or a retransmission timer): a peer that has gone never
    /// acknowledges, and spinning out the whole bound burned a core for it.
    pub(super) fn linger(&mut self, stall: Duration) {
        let left = |ep: &Endpoint| {
            ep.peers
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive)
                .fold((0, 0), |(f, b), (i, p)| {
                    (f + p.txq.len(), b + p.link.unsent_bytes(&ep.nets, i))
                })
        };
        // The least left so far: only going below it is progress (what a peer's
        // acknowledgement takes off, a retransmission or a keepalive may add back).
        let mut low = left(self);
        let mut moved = Instant::now();
        while low != (0, 0) {
            let was = low;
            // A timeout is only a look at the clock: the loop decides.
            let _ = self.wait_until(Some(LINGER), |ep| {
                let l = left(ep);
                l.0 < was.0 || l.1 < was.1
            });
            let now = left(self);
            low = (low.0.min(now.0), low.1.min(now.1));
            if low != was {
                moved = Instant::now();
            } else if moved.elapsed() >= stall {
                return;
            }
        }
    }
}

/// The endpoint's file descriptor ([`Endpoint::fd`]), borrowed for as long as the endpoint.
impl std::os::fd::AsFd for Endpoint {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.epoll.fd()
    }
}
