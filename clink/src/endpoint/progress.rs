//! Progress: one pass over every link (drain what peers sent, flush what is queued, run
//! the copy engine), the epoll set's events, and the completion events of watched requests.

use super::*;

impl Endpoint {
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
    pub(super) fn progress_pass(&mut self, read_sockets: bool) -> bool {
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
        if !self.req.finished.is_empty() {
            self.report_done();
        }
        if self.rma.has_aperture_recvs() {
            self.settle_aperture_recvs();
        }
        if !self.req.detached.is_empty() {
            self.req.reap_detached();
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
    pub(super) fn visit(&mut self, i: usize, pass: &mut ready::Pass) {
        if !self.peers[i].alive {
            return;
        }
        if !self.peers[i].txq.is_empty() || !self.peers[i].rndv.chunks.is_empty() {
            pass.did |= self.flush(i);
        }
        pass.did |= self.drain(i, false);
        pass.blocked |= self.peers[i].blocked;
        pass.copies |= !self.peers[i].engine.is_empty();
    }

    /// Fails peer `i` for `why` once every frame its link already delivered is handled
    /// (copied aside if no receive wants it): what a peer sent and this endpoint received
    /// before the peer died (a hang-up, a reset, a closed port, silence) is not lost with
    /// it.
    pub(super) fn fail_after_drain(&mut self, i: usize, why: String) {
        // The link's queue is finite and nothing refills it meanwhile (no read happens
        // here), so the forced drains end.
        while self.peers[i].alive
            && self.peers[i]
                .link
                .peek(&self.nets, i)
                .is_ok_and(|r| r.is_some())
        {
            if !self.drain(i, true) {
                break;
            }
        }
        if self.peers[i].alive {
            self.fail_peer(i, why);
        }
    }

    /// Handles up to RX_BUDGET frames from peer `i`.
    ///
    /// A message no posted receive wants is left at the head of the ring (no copy) and the
    /// peer marked `blocked`, unless `force`: then it is copied aside as unexpected so the
    /// frames behind it can be seen (done when nothing else moves, see `progress`).
    pub(super) fn drain(&mut self, i: usize, force: bool) -> bool {
        let mut n = 0;
        self.peers[i].blocked = false;
        while n < RX_BUDGET {
            let rec = match self.peers[i].link.peek(&self.nets, i) {
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
            self.release_frame(i, rec);
            n += 1;
        }
        n > 0
    }

    /// Polls the epoll set (doorbell, listener, peer sockets) once, waiting up to
    /// `timeout`. Returns true when something happened. Without `read_udp` a readable UDP
    /// socket is left to the next pass's own read (epoll reports it level-triggered).
    pub(super) fn check_events(&mut self, timeout: Option<Duration>, read_udp: bool) -> bool {
        let now = Instant::now();
        self.last_check = now;
        self.stats.liveness_checks += 1;
        self.tcp_liveness(now);
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
                    if matches!(self.peers[i].link, Link::Tcp) {
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
                        self.fail_after_drain(i, format!("{} hung up", PeerId(i as u32)));
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

    /// Queues completion events for the watched requests that finished since the last
    /// report (a request taken by its caller meanwhile is not reported); true when it
    /// queued one. Out of line: most passes finish nothing.
    #[inline(never)]
    pub(super) fn report_done(&mut self) -> bool {
        let evq = &mut self.evq;
        let mut any = false;
        self.req.report(|send, req, ok| {
            any = true;
            evq.push(
                events::REQUESTS,
                if send {
                    Event::SendDone { req, ok }
                } else {
                    Event::RecvDone { req, ok }
                },
            );
        });
        any
    }
}
