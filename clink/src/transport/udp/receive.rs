//! The transport's receive: the receive ring, then the sockets (main, steered, per peer)
//! with the speculative layout armed for the expected bulk stream; misplaced fragments
//! moved to their place, datagrams handed to their links, ICMP errors collected.

use super::*;

impl UdpTransport {
    /// Fragments per receive entry a speculative layout arms: one GSO group when the
    /// kernel coalesces reads, else one datagram.
    pub fn rx_group(&self, bulk_payload: usize) -> u64 {
        if self.sock.gro() {
            bulk_group(bulk_payload)
        } else {
            1
        }
    }

    /// True when the next bulk read may be speculative: speculation is on and has not
    /// been turned off for a while because the armed stream's fragments mostly missed
    /// ([`Confidence`]; the endpoint then arms nothing, and re-plans when it may again).
    pub fn speculate(&self) -> bool {
        self.st.cfg.speculate && self.confidence.speculate()
    }

    /// The key (route index, the link's bulk generation) of the last [`UdpTransport::set_arm`],
    /// whether it armed a layout or found nothing to arm.
    pub fn planned_key(&self) -> Option<(usize, u64)> {
        self.st.planned
    }

    /// Arms (or, with `None`, disarms) the speculative layout `arm` for the link routed
    /// under `key.0`, whose datagrams come from `src`. Keep the key current: the layout
    /// points into that link's destination buffer, valid only while its bulk generation
    /// (`key.1`) is unchanged.
    pub fn set_arm(
        &mut self,
        key: Option<(usize, u64)>,
        armed: Option<((usize, u64), SocketAddr, Arm)>,
    ) {
        let st = &mut self.st;
        st.planned = key;
        for lead in st.lead.iter_mut() {
            lead.clear();
        }
        st.armed = armed.map(|(key, src, arm)| {
            // Per armed entry, [header slot, destination + offset] per fragment.
            let max = sock::MAX_GSO_SEGMENTS;
            for (e, frags) in arm.entries.iter().take(sock::RX_SLOTS).enumerate() {
                for (k, &(off, len)) in frags.iter().take(max).enumerate() {
                    // `off + len` lies inside the destination (Bulk::arm arms only
                    // fragments inside it).
                    let Some(dest) = arm.dest.sub(off as usize, len) else {
                        continue;
                    };
                    // The header slots stay put (allocated once) while the transport lives.
                    st.lead[e].push(Dst::of_owned(&mut st.hdr_slots[e * max + k]));
                    st.lead[e].push(dest);
                }
            }
            let layouts = arm
                .entries
                .iter()
                .map(|frags| Layout {
                    payloads: frags.iter().take(max).map(|f| f.1).collect(),
                    spill: sock::RX_SLOT,
                })
                .collect();
            Armed {
                key,
                src,
                arm,
                layouts,
            }
        });
        // The layout goes on the socket the stream arrives on: the holder's steered one,
        // else its peer's own one, else the main one. The others get none.
        let holder = st.gate.holder().map(|h| h.peer);
        st.armed_on = st.armed.as_ref().map_or(0, |a| {
            let steered = self
                .steer
                .socket_of(a.key.0)
                .filter(|_| Some(a.key.0) == holder);
            match (steered, self.peers.index_of(a.src)) {
                (Some(i), _) => 1 + i,
                (None, Some(k)) => PEER_SOCK0 + k,
                (None, None) => 0,
            }
        });
        for i in 0..PEER_SOCK0 + self.peers.len() {
            let lead: &[Vec<Dst>] = if st.armed.is_some() && st.armed_on == i {
                &st.lead
            } else {
                &[]
            };
            let Some(sock) = socket(&mut self.sock, &mut self.steer, &mut self.peers, i) else {
                continue;
            };
            // A layout that arms fewer entries than a read takes (the end of a transfer)
            // caps the reads at those, so the next transfer's first groups stay queued for
            // the read after the re-plan, which arms them, instead of landing in the plain
            // slots and being copied. On a shared socket this holds because the small
            // datagrams (acks, RTSs) queued at a transfer's boundary are read one by one
            // first (`receive`'s head check): without that, one opened the next
            // transfer's first read and every group behind it landed one entry late (a
            // clean stream 77-80% in place, BENCHMARKS.md).
            let cap = !lead.is_empty();
            // Header slots are ours; destination ranges are distinct missing fragments of a
            // buffer the link holds while the key is current, and the endpoint re-arms
            // (replacing these vectors) before using a changed key.
            sock.set_lead(lead, cap);
        }
    }

    /// Reads what arrived (one batch; `now`: [`UdpTransport::now`], read once per progress
    /// pass) and hands each datagram to `sink` with the index its
    /// link was routed under ([`UdpTransport::route`]); answers hellos and welcomes
    /// itself. With a layout armed ([`UdpTransport::set_arm`]) the read is speculative:
    /// the armed fragments land straight in the destination; verified hits are handed
    /// over as [`Got::Placed`], everything else is gathered (the miss's copy) and takes the
    /// ordinary path. Returns the number of datagrams read.
    ///
    /// With streams steered to sockets of their own every socket is read, the one holding
    /// the layout first: the other's cleanup copies may fill fragments the layout names, so
    /// no speculative read may follow them before the endpoint re-plans. So are the peer
    /// sockets; the main one too when `all` (epoll reported a socket readable), when a
    /// peer has no socket of its own, while connecting, with faults injected (held-back
    /// datagrams are released there), and else every [`peers::MAIN_EVERY`]th call
    /// ([`RING_MAIN_EVERY`]th with the ring, when nothing has the sockets read every pass).
    ///
    /// The clock is read when a datagram is handed over (`sink` gets the reading), the
    /// main socket is (held-back faults) or `all`, and else every [`CLOCK_EVERY`]th call:
    /// an idle busy-poll pass makes no clock reading. [`UdpTransport::read_at`] gives the last.
    pub(super) fn receive_with(
        &mut self,
        all: bool,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let n = self.receive_all(all, sink);
        self.collect_unreachable();
        if std::mem::take(&mut self.st.welcomes_due) {
            self.flush();
        }
        n
    }

    /// Moves the ICMP errors of every socket that saw one into the list
    /// [`UdpTransport::take_unreachable`] hands out.
    pub(super) fn collect_unreachable(&mut self) {
        let out = &mut self.unreachable;
        if self.sock.errored {
            self.sock.take_unreachable(out);
        }
        for k in 0..self.peers.len() {
            if let Some(s) = self.peers.sock_mut(k).filter(|s| s.errored) {
                s.take_unreachable(out);
            }
        }
    }

    /// The routes (peer indices) whose peer answered with ICMP destination unreachable
    /// since the last call, with whether its host said "port unreachable" (the process
    /// is gone). Only answers quoting a datagram of the route's own connection count: its
    /// connection id, or a bulk header sealed with it (a bulk fragment with a hashed
    /// payload cannot be told from a quote: its answer is left to the next datagram of
    /// another kind). A send this host refused ends every route to that destination.
    pub fn take_unreachable(&mut self) -> Vec<(usize, bool)> {
        let mut out: Vec<(usize, bool)> = Vec::new();
        let mut hit = |i: usize, port: bool| {
            if !out.iter().any(|&(j, _)| j == i) {
                out.push((i, port));
            }
        };
        for u in self.unreachable.drain(..) {
            match u.quoted {
                sock::Quoted::Conn(conn) => {
                    if let Some(i) = self.st.routes.get((u.dest, conn)) {
                        hit(i, u.port);
                    }
                }
                sock::Quoted::Bulk(h) => {
                    for &(conn, i) in self.st.routes.links_of(u.dest) {
                        if u.local || bulk_header_owner(&h, [conn]).is_some() {
                            hit(i, u.port);
                        }
                    }
                }
                sock::Quoted::Unknown => {}
            }
        }
        out
    }

    pub(super) fn receive_all(
        &mut self,
        all: bool,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        self.passes = self.passes.wrapping_add(1);
        if let Some(k) = &self.keepalive {
            k.note_pass();
        }
        let every = if self.ring.is_some() {
            RING_CLOCK_EVERY
        } else {
            CLOCK_EVERY
        };
        let mut now = (all || self.passes.is_multiple_of(every)).then(|| self.st.now());
        let early = self.replay_early(&mut now, sink);
        let from_ring = self.receive_ring(&mut now, sink);
        self.ring_reads = from_ring;
        let from_ring = from_ring + early;
        // A notice: a coalesced run of data waits in some socket (the main one, maybe).
        if self.ring.as_mut().is_some_and(ring::RxRing::take_notice) {
            self.notice_due = NOTICE_PASSES;
        }
        let notice = self.notice_due > 0;
        self.notice_due = self.notice_due.saturating_sub(1);
        let all = all || notice;
        // The main socket's cadence: one pass in MAIN_EVERY while the sockets are read on
        // every pass (as without the ring), one idle socket read in four with the ring.
        let mut main_every = peers::MAIN_EVERY;
        if self.ring.is_some() {
            let every_pass = all
                || self.sock_hot
                || self.main_drain > 0
                || self.bulk_expected
                || self.st.armed.is_some()
                || self.steer.is_open()
                || !self.st.pending.is_empty()
                || self.faults.is_some();
            if !every_pass {
                main_every = RING_MAIN_EVERY;
            }
            if !every_pass && !self.passes.is_multiple_of(RING_SOCK_EVERY) {
                // Nothing armed (or the sockets would be due), and speculation's backoff
                // counts socket datagrams only: of `finish_receive`, only the clock's
                // freshness is left to note.
                self.read_fresh = now.is_some();
                return from_ring;
            }
        }
        let n = self.receive_sockets(all, main_every, &mut now, sink);
        self.sock_hot = n > 0;
        if n > 0 {
            self.notice_due = 0;
        }
        if n > 0 && self.ring.is_some() {
            // What the sockets just gave may follow ring datagrams that arrived during
            // the reads (the kernel fills both in arrival order): read those too, so a
            // hole the socket's datagrams opened is not taken for a loss.
            let later = self.receive_ring(&mut now, sink);
            self.read_fresh |= later > 0;
            self.ring_reads += later;
            return from_ring + n + later;
        }
        from_ring + n
    }

    /// Hands over the datagrams that came for connections before the endpoint adopted
    /// them (see [`State::take_up`]); those whose connection is still not routed wait for
    /// the next pass.
    fn replay_early(
        &mut self,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        if self.st.early.is_empty() {
            return 0;
        }
        let t = *now.get_or_insert_with(|| self.st.now());
        let early = std::mem::take(&mut self.st.early);
        let n = early.len();
        for (src, d) in &early {
            self.st
                .dispatch(&mut |i, d| sink(i, Got::Datagram(d), t), *src, d);
        }
        n
    }

    /// Reads the receive ring (if any): its datagrams (never bulk fragments) to `sink`,
    /// through the fault injector when one is set.
    pub(super) fn receive_ring(
        &mut self,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        let st = &mut self.st;
        let hops = &mut self.hops;
        let Some(f) = self.faults.as_mut() else {
            let n = ring.poll(RING_BATCH, |src, link, d| {
                let t = *now.get_or_insert_with(|| st.now());
                let to_link = &mut |i, d: &[u8]| sink(i, Got::Datagram(d), t);
                let routed = st.dispatch(to_link, SocketAddr::V4(src), d);
                if let Some(link) = link.filter(|_| routed) {
                    learn(hops, src, link, d);
                }
            });
            return n;
        };
        let t = *now.get_or_insert_with(|| st.now());
        let mut gathered = std::mem::take(&mut st.gathered);
        gathered.clear();
        // (With faults, where a datagram came from is not learned: the injector may hand
        // it over late, or a corrupted copy.)
        let n = ring.poll(RING_BATCH, |src, _, d| {
            f.apply(t, SocketAddr::V4(src), d, &mut |s, d| gathered.push(s, d))
        });
        // Held-back datagrams are released by the main socket's read (every pass while
        // faults are injected): they may be bulk fragments, whose copy into a place the
        // layout still arms must stop the armed read that pass ([`Self::receive_sockets`]).
        let mut from = 0;
        for &(s, end) in &gathered.items {
            let d = &gathered.bytes[from..end];
            st.dispatch(&mut |i, d| sink(i, Got::Datagram(d), t), s, d);
            from = end;
        }
        st.gathered = gathered;
        n
    }

    /// The sockets' part of [`UdpTransport::receive`]; the main socket is read one pass
    /// in `main_every` unless something else makes it due.
    pub(super) fn receive_sockets(
        &mut self,
        all: bool,
        main_every: u32,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let main = all
            || self.uncovered > 0
            || self.main_drain > 0
            || self.faults.is_some()
            || !self.st.pending.is_empty()
            || self.passes.is_multiple_of(main_every);
        self.main_drain = self.main_drain.saturating_sub(1);
        if self.st.armed.is_none() && !main && !self.steer.is_open() {
            let n = self.receive_peers(now, sink);
            self.finish_receive(None, n, now.is_some());
            return n;
        }
        let armed = self.st.armed.take();
        // See [`socket`] for the numbering. The armed one first; then the other steered
        // ones, before the peer sockets and the main one: a previous holder's fast
        // fragments wait there while its newer, slow ones reach the others, and read out
        // of order they would look like losses (NAKs, and the sender's loss detection).
        // They are drained (a few batches at most), not read one batch per pass.
        let first = self.st.armed_on;
        // Except the stream's own peer socket before its steered one: the datagrams it
        // sent slowly before its grant wait there, and read after the fast ones they
        // would look like losses too (every grant of a steered stream cost a burst of
        // NAKs and spurious retransmissions). When that read put a bulk fragment in place
        // (the same `placed` test as the armed socket's one-entry reads), the steered one
        // is left to the next pass: what was just placed may be what the
        // layout arms (holes below the stream's head), and the endpoint re-plans first.
        // (Other datagrams there, the stream's acks and eager messages, hold nothing up.)
        let before = armed
            .as_ref()
            .filter(|_| is_steered(first))
            .and_then(|a| self.peers.index_of(a.src))
            .map(|k| PEER_SOCK0 + k);
        let order = before
            .into_iter()
            .chain(std::iter::once(first))
            .chain((1..PEER_SOCK0 + self.peers.len()).filter(|&i| i != first && Some(i) != before))
            .chain((first != 0).then_some(0));
        let mut n = 0;
        let mut hold_armed = false;
        let ready = self.peers.readable();
        for i in order {
            if i == 0 && !main || i == first && hold_armed {
                continue;
            }
            if i >= PEER_SOCK0 && ready & (1 << (i - PEER_SOCK0)) == 0 {
                // Nothing queued there (asked once for every peer socket this pass).
                continue;
            }
            let a = if i == first { armed.as_ref() } else { None };
            // An armed socket that other traffic shares looks at its queue's head first:
            // datagrams that are not bulk fragments there (a sender's requests before its
            // next transfer, its acks) would take the armed entries and put every group
            // behind them one entry late, each moved with a copy. So would a fragment the
            // layout does not expect first: a retransmission of the previous transfer or
            // of a hole (at 1% loss whole reads of 266-399 fragments were moved so). Whatever
            // does not claim one of the first entry's fragments is read one entry per
            // call, up to [`HEAD_READS`] of them, before the full read.
            let head_check = a.filter(|_| !is_steered(i)).map(|a| {
                let e = &a.arm.expect;
                move |claim: Option<(u32, u64)>| {
                    claim.is_some_and(|(xfer, off)| {
                        xfer == wire_xfer(e.xfer)
                            && a.arm
                                .entries
                                .first()
                                .is_some_and(|g| g.iter().any(|f| f.0 == off))
                    })
                }
            });
            let batches = if i == 0 || i == first || i >= PEER_SOCK0 {
                1
            } else {
                STRAGGLER_BATCHES
            };
            let (mut head_reads, mut full_reads) = (0, 0);
            while let Some(sock) = socket(&mut self.sock, &mut self.steer, &mut self.peers, i) {
                let alone = head_reads < HEAD_READS
                    && head_check.as_ref().is_some_and(|expected| {
                        let mut head = [0; BULK_HEADER];
                        sock.peek_head(&mut head)
                            .is_some_and(|n| !expected(bulk_claim(&head[..n.min(BULK_HEADER)])))
                    });
                if alone {
                    head_reads += 1;
                } else {
                    full_reads += 1;
                }
                let r = sock.recv_batch_upto(if alone { 1 } else { sock::RX_SLOTS });
                // Whether this read put bulk bytes in a destination (a hit, a move, a
                // fragment copied to its place; with faults, a held-back one released):
                // the layout may still arm that place, so no read of the armed socket
                // follows it before the endpoint re-plans.
                let mut placed = false;
                // The main socket is handed over even when empty: held-back injected
                // faults are released there.
                if r > 0 || i == 0 {
                    let t = *now.get_or_insert_with(|| self.st.now());
                    let got = deliver(
                        sock,
                        &mut self.faults,
                        &mut self.st,
                        t,
                        r,
                        a,
                        &mut |i, g| {
                            placed |= !matches!(g, Got::Datagram(d) if !is_bulk(d));
                            sink(i, g, t)
                        },
                    );
                    if is_steered(i) {
                        self.st.stats.steered_datagrams += got as u64;
                    } else if i >= PEER_SOCK0 {
                        self.st.stats.peer_socket_datagrams += got as u64;
                    }
                    n += got;
                }
                hold_armed |= placed && Some(i) == before;
                let more = if alone {
                    r == 1 && !placed
                } else {
                    r == sock::RX_SLOTS && full_reads < batches
                };
                if !more {
                    break;
                }
            }
        }
        self.finish_receive(armed, n, now.is_some());
        n
    }

    /// The common case of [`UdpTransport::receive`]: nothing armed, no steered socket
    /// open, the main socket not due: one read of each peer's own socket that has data
    /// ([`PeerSocks::readable`]). (Through the
    /// general loop's socket order and per-socket choices a 64-byte ping-pong took about
    /// 440 more user instructions a hop, 4 803 against 4 366 with this path, `valgrind
    /// --tool=callgrind` on `examples/path_cost 20000 udp`.)
    pub(super) fn receive_peers(
        &mut self,
        now: &mut Option<u64>,
        sink: &mut impl FnMut(usize, Got<'_>, u64),
    ) -> usize {
        let mut n = 0;
        let ready = self.peers.readable();
        for k in 0..self.peers.len() {
            if ready & (1 << k) == 0 {
                continue;
            }
            let Some(sock) = self.peers.sock_mut(k) else {
                continue;
            };
            let r = sock.recv_batch_upto(sock::RX_SLOTS);
            if r > 0 {
                let t = *now.get_or_insert_with(|| self.st.now());
                let got = deliver(
                    sock,
                    &mut self.faults,
                    &mut self.st,
                    t,
                    r,
                    None,
                    &mut |i, g| sink(i, g, t),
                );
                self.st.stats.peer_socket_datagrams += got as u64;
                n += got;
            }
        }
        n
    }

    /// Ends a receive that read `n` datagrams: speculation's balance (an armed pass is
    /// judged, an unarmed one while it is off counts down the backoff), the layout kept
    /// for the next read, and whether the clock was read (`fresh`).
    pub(super) fn finish_receive(&mut self, armed: Option<Armed>, n: usize, fresh: bool) {
        let (hits, misses) = (
            std::mem::take(&mut self.st.read_hits),
            std::mem::take(&mut self.st.read_misses),
        );
        if self.st.cfg.spec_backoff {
            if armed.is_some() {
                self.st.stats.spec_backoffs += u64::from(self.confidence.armed(hits, misses));
            } else {
                self.confidence.unarmed(n as u64);
            }
        }
        // Hits change the link's generation: the endpoint re-plans before the next read.
        self.st.armed = armed;
        self.read_fresh = fresh;
    }

    /// The clock's last reading, by [`UdpTransport::now`] or a receive (after a receive,
    /// at most [`CLOCK_EVERY`] idle passes old).
    pub fn read_at(&self) -> u64 {
        self.st.last_now.get()
    }

    /// Whether the last [`UdpTransport::receive`] read the clock (a datagram came, or the
    /// reading was due): [`UdpTransport::read_at`] is then as fresh as that receive.
    pub fn read_is_fresh(&self) -> bool {
        self.read_fresh
    }
}

/// Records that `src`'s datagram `d` came from `link`. A new or changed address is taken
/// only from a datagram that verifies (its CRC-32C and structure): a forged one from a
/// known source cannot redirect our sends to that peer.
pub(super) fn learn(
    links: &mut Vec<(SocketAddrV4, ring::LinkAddr)>,
    src: SocketAddrV4,
    link: ring::LinkAddr,
    d: &[u8],
) {
    let k = links.iter().position(|(a, _)| *a == src);
    if k.is_some_and(|k| links[k].1 == link) || Datagram::parse(d).is_err() {
        return;
    }
    match k {
        Some(k) => links[k].1 = link,
        None if links.len() < MAX_LINKS => links.push((src, link)),
        None => {}
    }
}

/// Puts the intact fragments a read left in each other's places at their own, each copied
/// once ([`spec::plan_moves`]), and hands them to `sink` as moved; a second fragment for
/// the same place is gathered for the ordinary path instead. Runs after every armed entry
/// of the read was verified (the moves write into places other entries landed in) and
/// before anything else of the read is handled (the ordinary path writes too).
pub(super) fn move_displaced(
    sock: &UdpSock,
    st: &mut State,
    a: &Armed,
    gathered: &mut Gathered,
    sink: &mut impl FnMut(usize, Got<'_>),
) {
    let mut displaced = std::mem::take(&mut st.displaced);
    // By place, then read order: of two fragments for one place, the first read keeps
    // it. (Sorting these small keys, not the records: a stable sort of the records was
    // 2% of a forced-miss receive's time, `examples/bulk_cost miss`.)
    let mut order = std::mem::take(&mut st.order);
    order.clear();
    order.extend(displaced.iter().enumerate().map(|(k, m)| (m.d.to, k)));
    order.sort_unstable();
    let mut list = std::mem::take(&mut st.list);
    list.clear();
    let mut last = None;
    order.retain(|&(to, k)| {
        let m = &displaced[k];
        if last == Some(to) {
            let slot = sock.slot(m.entry, sock::RX_SLOT);
            gather(
                &mut gathered.bytes,
                &st.lead[m.entry],
                slot,
                m.start,
                m.wire,
            );
            gathered.close(a.src);
            return false;
        }
        last = Some(to);
        list.push(m.d);
        true
    });
    spec::plan_moves(&list, &mut st.moves);
    // The destination the layout is armed on, referenced by nothing else during the call
    // (the read's vectors point into it, but the kernel is done with them).
    let mut lease = a.arm.dest.clone();
    let dest = lease
        .range_mut(0, a.arm.expect.cap as usize)
        .unwrap_or_default();
    spec::apply_moves(&st.moves, dest, &mut st.scratch);
    for &(_, k) in &order {
        sink(a.key.0, Got::Moved(displaced[k].h, displaced[k].wire));
    }
    displaced.clear();
    st.displaced = displaced;
    st.list = list;
    st.order = order;
}

/// Hands the `r` entries just read from `sock` to `sink`: the armed ones (`armed`, entry k
/// < its plan's length) verified in place first, then the others from their slots.
pub(super) fn deliver(
    sock: &mut UdpSock,
    faults: &mut Option<Faults>,
    st: &mut State,
    now: u64,
    r: usize,
    armed: Option<&Armed>,
    sink: &mut impl FnMut(usize, Got<'_>),
) -> usize {
    let max = sock::MAX_GSO_SEGMENTS;
    let n_armed = armed.map_or(0, |a| a.arm.entries.len().min(r));
    let mut gathered = std::mem::take(&mut st.gathered);
    gathered.clear();
    let mut segs = std::mem::take(&mut st.segs);
    let mut count = 0;
    // Pass 1: verify the armed entries; copy out everything that is not a hit, before
    // any cleanup writes into the destination.
    for (k, a) in armed.iter().flat_map(|a| (0..n_armed).map(move |k| (k, a))) {
        let got = sock.received(k);
        let frags = &a.arm.entries[k];
        a.layouts[k].segments(got.len, got.seg, &mut segs);
        for seg in &segs {
            count += 1;
            let fate = faults.as_mut().map(|f| f.fate());
            let (start, len) = match *seg {
                Segment::Candidate { start, slot, len } if got.src == a.src => {
                    let (off, _) = frags[slot];
                    // The armed payload slot, `len` <= its length.
                    let payload = a.arm.dest.range(off as usize, len).unwrap_or_default();
                    let clean = fate.is_none_or(|f| f.is_clean());
                    let header = &st.hdr_slots[k * max + slot];
                    match spec::check(&a.arm.expect, off, header, payload) {
                        Check::Hit(h) if clean => {
                            st.read_hits += 1;
                            sink(a.key.0, Got::Placed(h, BULK_HEADER + len));
                            continue;
                        }
                        Check::Displaced(h) if clean => {
                            // Moved in place once every entry of the read is verified.
                            st.stats.spec_misses += 1;
                            st.read_misses += 1;
                            let d = Displaced {
                                from: off,
                                to: h.offset,
                                len,
                            };
                            st.displaced.push(Misplaced {
                                d,
                                h,
                                wire: BULK_HEADER + len,
                                entry: k,
                                start,
                            });
                            continue;
                        }
                        _ => {
                            st.read_misses += 1;
                            (start, BULK_HEADER + len)
                        }
                    }
                }
                Segment::Candidate { start, len, .. } => (start, BULK_HEADER + len),
                Segment::Gather { start, len } => (start, len),
            };
            st.stats.spec_misses += 1;
            let slot = sock.slot(k, sock::RX_SLOT);
            match (fate, faults.as_mut()) {
                (Some(fate), Some(f)) => {
                    let mut bytes = Vec::with_capacity(len);
                    gather(&mut bytes, &st.lead[k], slot, start, len);
                    f.apply_fate(fate, now, got.src, &bytes, &mut |s, d| gathered.push(s, d))
                }
                _ => {
                    gather(&mut gathered.bytes, &st.lead[k], slot, start, len);
                    gathered.close(got.src);
                }
            }
        }
    }
    st.segs = segs;
    if let Some(a) = armed.filter(|_| !st.displaced.is_empty()) {
        move_displaced(sock, st, a, &mut gathered, sink);
    }
    // Pass 2: the unarmed entries from their slots (no copy without faults), then
    // what was gathered or held back.
    let mut to_link = |i: usize, d: &[u8]| sink(i, Got::Datagram(d));
    for k in n_armed..r {
        count += sock.for_each_datagram(k, |src, d| match faults.as_mut() {
            None => {
                st.dispatch(&mut to_link, src, d);
            }
            Some(f) => f.apply(now, src, d, &mut |s, d| gathered.push(s, d)),
        });
    }
    if let Some(f) = faults.as_mut() {
        f.release(now, &mut |s, d| gathered.push(s, d));
    }
    let mut from = 0;
    for &(s, end) in &gathered.items {
        st.dispatch(&mut to_link, s, &gathered.bytes[from..end]);
        from = end;
    }
    st.gathered = gathered;
    sock.stats.datagrams_received += count as u64;
    count
}

/// Datagrams copied out of a read to be handled after it (a speculative read's misses,
/// injected faults): one buffer reused from read to read, not an allocation each.
#[derive(Default)]
pub(super) struct Gathered {
    bytes: Vec<u8>,
    /// (source, end in `bytes`), in arrival order.
    items: Vec<(SocketAddr, usize)>,
}

impl Gathered {
    fn push(&mut self, src: SocketAddr, d: &[u8]) {
        self.bytes.extend_from_slice(d);
        self.items.push((src, self.bytes.len()));
    }

    /// Ends the datagram appended to `bytes` since the last one.
    fn close(&mut self, src: SocketAddr) {
        self.items.push((src, self.bytes.len()));
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }
}

/// Appends bytes `start..start + len` of an armed entry's logical stream (its leading
/// vectors, then its slot) to `out`: the copy a miss costs.
pub(super) fn gather(out: &mut Vec<u8>, lead: &[Dst], slot: &[u8], start: usize, len: usize) {
    let mut at = 0usize; // logical start of the current piece
    let end = start + len;
    for v in lead {
        let (a, b) = (at.max(start), (at + v.len()).min(end));
        if a < b {
            // Inside a vector the kernel just wrote (header slot or destination range).
            out.extend_from_slice(v.range(a - at, b - a).unwrap_or_default());
        }
        at += v.len();
    }
    if end > at {
        let (a, b) = (start.max(at) - at, (end - at).min(slot.len()));
        if a < b {
            out.extend_from_slice(&slot[a..b]);
        }
    }
}

/// A fragment a speculative read left in another's place.
pub(super) struct Misplaced {
    /// Where it landed and where it belongs.
    d: Displaced,
    /// Its verified header.
    h: BulkHeader,
    /// Its length on the wire.
    wire: usize,
    /// Where the read put it, to gather it instead: receive entry, and start in the
    /// entry's vectors.
    entry: usize,
    start: usize,
}

/// A speculative layout in force.
pub(super) struct Armed {
    /// (route index of the link, the link's bulk generation when planned).
    key: (usize, u64),
    /// The link's address: only its datagrams can be hits.
    src: SocketAddr,
    arm: Arm,
    /// Per armed entry, how a read into its vectors splits (made once per arming).
    layouts: Vec<Layout>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_link_address_changes_only_on_a_datagram_that_verifies() {
        let peer = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 4000);
        let at = |ifindex, mac0| ring::LinkAddr {
            ifindex,
            mac: [mac0, 1, 2, 3, 4, 5, 0, 0],
            halen: 6,
            local: Ipv4Addr::new(10, 0, 0, 1),
        };
        let mut good = Vec::new();
        Datagram::Ping { conn: 7, floor: 3 }.encode(&mut good);
        let mut forged = good.clone();
        forged[20] ^= 1; // the CRC no longer holds
        let mut links = Vec::new();
        learn(&mut links, peer, at(2, 0xaa), &forged);
        assert!(links.is_empty(), "a forged datagram taught an address");
        learn(&mut links, peer, at(2, 0xaa), &good);
        assert_eq!(links, vec![(peer, at(2, 0xaa))]);
        learn(&mut links, peer, at(3, 0xbb), &forged);
        assert_eq!(
            links,
            vec![(peer, at(2, 0xaa))],
            "a forged one redirected it"
        );
        learn(&mut links, peer, at(3, 0xbb), &good);
        assert_eq!(links, vec![(peer, at(3, 0xbb))], "a real move is followed");
    }
}
