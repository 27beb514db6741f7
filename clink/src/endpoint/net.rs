//! The endpoint's side of the network transport: connecting over UDP, moving datagrams
//! between the socket and the peers' reliable connections, their timers, and the limits
//! that differ from shared memory.

use super::link::{self, Link};
use super::Endpoint;
use crate::error::{Error, Result};
use crate::Selector;
use crate::Status;
use clink_proto::reliable::Stats as ConnStats;
use clink_proto::spin::SpinGate;
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use std::time::{Duration, Instant};

/// The earliest a sleeping endpoint wakes for a connection's tail-probe, retransmission,
/// keepalive or admission timer, nanoseconds from now (a due ack wakes it on time). Every
/// request arms a tail probe a few hundred microseconds out, and a sleep with that
/// timeout cost a blocking UDP ping-pong time (`examples/pingpong` over UDP with
/// `CLINK_SPIN_US=0`, 64 B: 27.9-35.0 us one-way with this floor against 29.5-36.9
/// without, 6 interleaved pairs). A busy-polling endpoint runs every timer on time. Not
/// while a bulk transfer is being sent: its stream waits on those timers after a tail
/// loss (at 5% injected loss a sender asleep after its spin woke 2 ms late for nearly
/// every tail probe, by then a timeout: 556 timeouts and 17 probes per 100 MiB).
const SLEEP_TIMER_FLOOR: u64 = 2_000_000;

/// The longest the network latency paths (`Endpoint::recv_fast_udp`, `recv_fast_tcp`) spin
/// before they hand over to the general path (which spins for what is left of the
/// configured time, then sleeps).
const UDP_FAST_SPIN_MAX: Duration = Duration::from_micros(100);
/// The longest a wait keeps spinning past its spin time for a reply due from a UDP peer
/// ([`Endpoint::reply_due`]).
const REPLY_SPIN_MAX: Duration = Duration::from_millis(1);

/// How long `Endpoint::recv_fast_udp` (or `recv_fast_tcp`) may spin: the configured spin
/// time (`None`, busy mode: no limit) but at most [`UDP_FAST_SPIN_MAX`], and not past the
/// receive's timeout.
fn fast_spin(spin: Option<Duration>, timeout: Option<Duration>) -> Duration {
    let s = spin.map_or(UDP_FAST_SPIN_MAX, |s| s.min(UDP_FAST_SPIN_MAX));
    timeout.map_or(s, |t| s.min(t))
}

/// The latency paths' poll loop: polls until `poll` says something came (`Some(true)`)
/// or that the path must give up (`Some(false)`), or until `spin` has passed since `spun`
/// (set at the loop's first clock reading, 64 polls in, unless the caller's spin began
/// earlier). True when something came; something that came after a poll that found
/// nothing is a hit for `gate` (what the first poll finds says nothing of spinning).
pub(super) fn spin_for(
    spin: Duration,
    spun: &mut Option<Instant>,
    gate: &SpinGate,
    mut poll: impl FnMut() -> Option<bool>,
) -> bool {
    for n in 0u32.. {
        if let Some(got) = poll() {
            if got && n > 0 {
                gate.hit();
            }
            return got;
        }
        if n % 64 == 63 && spun.get_or_insert_with(Instant::now).elapsed() >= spin {
            return false;
        }
    }
    false
}

/// Most passes [`Endpoint::drain_before_nak`] reads the sockets for (each reads a batch
/// of every socket; a socket still not empty after them holds a burst the NAK may name).
const DRAIN_READS: usize = 8;

impl Endpoint {
    /// Asks `peer` (a network peer) to take this endpoint's bulk transfers as its one fast
    /// stream (admission control's Fast_Req, the explicit form of what `CLINK_UDP_ADMISSION=
    /// implicit` does by itself) and waits up to `timeout` for the answer: `Ok(true)`
    /// granted (bulk transfers go at full speed, received straight in place), `Ok(false)`
    /// refused (they go slowly, and the request stays queued at the peer: a later grant
    /// shows in [`Endpoint::is_fast`]). With admission control off every stream is fast:
    /// `Ok(true)` at once.
    pub fn request_fast(&mut self, peer: PeerId, timeout: Duration) -> Result<bool> {
        let i = self.net_peer(peer)?;
        let now = self.nets.udp.as_ref().map_or(0, |n| n.now());
        if let Some(u) = link::udp_mut(&mut self.nets, i) {
            if u.conn().is_fast() {
                return Ok(true);
            }
            u.request_fast(now);
        }
        self.kick(i);
        let answer = |ep: &Endpoint| link::udp(&ep.nets, i).and_then(|u| u.fast_answer());
        self.wait_until(Some(timeout), |ep| {
            !ep.peers[i].alive || answer(ep).is_some()
        })?;
        answer(self).ok_or(Error::PeerDead(peer))
    }

    /// Gives back the fast stream `peer` granted (or withdraws the request); needed only
    /// with `CLINK_UDP_ADMISSION=explicit` (implicit grants go back by themselves when no
    /// bulk transfer has been sent for a while).
    pub fn release_fast(&mut self, peer: PeerId) -> Result<()> {
        let i = self.net_peer(peer)?;
        if let Some(u) = link::udp_mut(&mut self.nets, i) {
            u.release_fast();
        }
        self.kick(i);
        Ok(())
    }

    /// Whether this endpoint's bulk transfers to `peer` go fast now (granted by its
    /// admission control, or admission control off); false for a shared-memory or TCP
    /// peer.
    pub fn is_fast(&self, peer: PeerId) -> Result<bool> {
        Ok(self.udp_link(peer)?.is_some_and(|u| u.conn().is_fast()))
    }

    /// The reliable connection to `peer` as it stands: round-trip time (smoothed and
    /// minimum), retransmission timeout, congestion window and threshold, packets in
    /// flight, and its counters (datagrams and bytes each way, retransmissions, losses,
    /// acks and NAKs, duplicates, drops by cause). `None` for a peer over shared memory or
    /// TCP, which has no such connection (the kernel keeps TCP's). A dead peer's last
    /// state stays readable.
    pub fn conn_stats(&self, peer: PeerId) -> Result<Option<ConnStats>> {
        Ok(self.udp_link(peer)?.map(|u| u.conn().stats()))
    }

    /// Payload bytes this endpoint has put on the wire towards `peer`, resends included:
    /// UDP payloads over UDP (clink's headers with them), TCP segments' payloads over TCP
    /// (the kernel's count, `TCP_INFO`). `None` over shared memory, and over TCP once the
    /// peer's socket is closed or on a kernel before 4.19.
    pub fn wire_bytes_sent(&self, peer: PeerId) -> Result<Option<u64>> {
        Ok(match &self.peer(peer)?.link {
            Link::Udp => self.udp_link(peer)?.map(|u| u.conn().stats().bytes_sent),
            Link::Tcp => link::tcp(&self.nets, peer.0 as usize)
                .and_then(|t| crate::sys::tcp_wire_bytes(t.fd()).ok())
                .map(|b| b.0),
            Link::Shm(_) => None,
        })
    }

    /// The part of [`Endpoint::wire_bytes_sent`] that was sent again: clink's
    /// retransmissions over UDP, the kernel's over TCP (`tcpi_bytes_retrans`: the kernel
    /// may resend even over loopback). `None` where `wire_bytes_sent` is.
    pub fn wire_bytes_resent(&self, peer: PeerId) -> Result<Option<u64>> {
        Ok(match &self.peer(peer)?.link {
            Link::Udp => self.udp_link(peer)?.map(|u| u.conn().stats().bytes_resent),
            Link::Tcp => link::tcp(&self.nets, peer.0 as usize)
                .and_then(|t| crate::sys::tcp_wire_bytes(t.fd()).ok())
                .map(|b| b.1),
            Link::Shm(_) => None,
        })
    }

    /// How this endpoint reads its small UDP datagrams: `Some(Ok(()))` from the receive
    /// ring (`CLINK_UDP_RING`), `Some(Err(why))` from its sockets, and why; `None` without
    /// a UDP transport.
    ///
    /// The ring is otherwise opened with the first UDP peer; this opens it now.
    pub fn udp_ring(&mut self) -> Option<std::result::Result<(), String>> {
        let r = self
            .nets
            .udp
            .as_mut()
            .map(|n| n.ring().map_err(str::to_string));
        self.watch_new_sockets();
        r
    }

    /// Peer `i`'s UDP link, if it is a UDP peer (only those have one in the transport's
    /// table).
    pub(super) fn udp(&self, i: usize) -> Option<&crate::transport::udp::UdpLink> {
        link::udp(&self.nets, i)
    }

    /// As [`Endpoint::udp`], mutable.
    pub(super) fn udp_mut(&mut self, i: usize) -> Option<&mut crate::transport::udp::UdpLink> {
        link::udp_mut(&mut self.nets, i)
    }

    /// `peer`'s UDP link (kept by the transport), if it is a UDP peer.
    fn udp_link(&self, peer: PeerId) -> Result<Option<&crate::transport::udp::UdpLink>> {
        self.peer(peer)?;
        Ok(self.udp(peer.0 as usize))
    }

    /// `peer`'s index when it is a live UDP peer (admission control's scope).
    fn net_peer(&self, peer: PeerId) -> Result<usize> {
        let p = self.peer(peer)?;
        match &p.link {
            _ if !p.alive => Err(Error::PeerDead(peer)),
            Link::Udp => Ok(peer.0 as usize),
            l => Err(Error::Invalid(format!(
                "{peer} is reached over {}: admission control is for UDP peers (a TCP stream \
                 or a shared-memory ring has no speculation for another stream to disturb)",
                l.transport()
            ))),
        }
    }

    /// Sends what peer `i`'s link has queued, at once, rather than at the end of the
    /// progress pass: a UDP link's datagrams, a TCP link's send queue; nothing for shared
    /// memory, whose frames are in the peer's ring already (told apart inline, so that a
    /// ring peer's send makes no call here).
    #[inline]
    pub(super) fn kick(&mut self, i: usize) {
        match self.peers.get(i).map(|p| &p.link) {
            Some(Link::Tcp) => self.tcp_write(i),
            Some(Link::Udp) => self.kick_udp(i),
            Some(Link::Shm(_)) | None => {}
        }
    }

    /// [`Endpoint::kick`] for a UDP link.
    fn kick_udp(&mut self, i: usize) {
        if let Some(net) = self.nets.udp.as_mut() {
            let now = net.now();
            net.send_now(i, now);
        }
    }

    /// Adds the sockets the UDP transport made since the last call (flow steering's,
    /// peers' own) to the epoll set, so sleeps watch them too; before the endpoint first
    /// sleeps, only forgets them ([`Endpoint::watch_udp`] adds every open one then).
    pub(super) fn watch_new_sockets(&mut self) {
        let Some(net) = self.nets.udp.as_mut() else {
            return;
        };
        let new: Vec<_> = net.take_new_fds().collect();
        if self.udp_watched {
            self.watch_fds(new);
        }
    }

    /// Puts the UDP transport's extra sockets (peers' own, steered) in the epoll set at
    /// the endpoint's first sleep (or [`Endpoint::prepare_wait`]); they stay there. Until
    /// then every pass reads them anyway, and a socket in an epoll set costs each datagram
    /// through it a wake-up callback: when it lands (readable) and when the sent one is
    /// freed (write space), 0.1-0.3 us a hop across the veth pair (a C ping-pong, connected
    /// sockets, with and without an epoll set watching them). A busy-polling endpoint
    /// never sleeps, so never pays it. The main socket is watched from the start: new
    /// peers' hellos are read when epoll reports it.
    pub(super) fn watch_udp(&mut self) {
        if self.udp_watched {
            return;
        }
        self.udp_watched = true;
        let Some(net) = self.nets.udp.as_mut() else {
            return;
        };
        net.take_new_fds().for_each(drop);
        let main = net.sock.raw();
        let extra = net.fds().into_iter().filter(|&fd| fd != main).collect();
        self.watch_fds(extra);
    }

    fn watch_fds(&mut self, fds: Vec<std::os::fd::RawFd>) {
        if fds
            .iter()
            .any(|&fd| self.epoll.add(fd, super::TOK_UDP).is_err())
        {
            // A sleep would not wake for it: one socket for all rather than a deaf one.
            tracing::warn!("epoll_ctl of a UDP socket failed: no steered or peer sockets");
            if let Some(net) = self.nets.udp.as_mut() {
                net.stop_extra_sockets();
            }
        }
    }

    /// Reads the UDP socket, runs the connections' timers, moves delivered frames into the
    /// links' queues, adopts peers that connected, fails peers declared dead. True when
    /// anything arrived.
    ///
    /// `readable`: epoll reported the main socket readable, so it is read even when it is
    /// not due. Without it (the busy-poll path, wake-ups by a peer's own socket) it does
    /// nothing while the transport has no peer and no connection under way: an endpoint
    /// with only shared-memory peers makes no system call per poll. Hellos from new peers
    /// are then read when epoll reports the socket readable (liveness checks, sleeps).
    pub(super) fn net_receive(&mut self, readable: bool) -> bool {
        if self
            .nets
            .udp
            .as_ref()
            .is_none_or(|n| !readable && !n.active())
        {
            return false;
        }
        let got = self.read_net(readable) > 0;
        if got {
            self.drain_before_nak();
        }
        let Some(net) = self.nets.udp.as_mut() else {
            return got;
        };
        // Timers and admission decisions with the receive's reading of the clock.
        let now = net.read_at();
        let dead = net.run_timers(now);
        let unreachable: Vec<(usize, bool)> = net
            .take_unreachable()
            .into_iter()
            .filter(|(i, _)| !dead.contains(i))
            .collect();
        let accepted = net.take_accepted();
        self.watch_new_sockets();
        self.finish_bulk();
        let adopted = !accepted.is_empty();
        for link in accepted {
            match self.add_udp_peer(link, false) {
                Ok(id) => self.new_peers.push_back(id),
                Err(e) => self.last_error = Some(e.to_string()),
            }
        }
        for i in dead {
            self.udp_peer_dead(i);
        }
        for (i, port) in unreachable {
            if !self.peers.get(i).is_some_and(|p| p.alive) {
                continue;
            }
            let why = if port {
                "its host answered 'port unreachable': no process listens there any more"
            } else {
                "its host or network is unreachable (an ICMP answer, or this host has no route or source address for it any more)"
            };
            self.fail_after_drain(i, format!("{}: {why}", PeerId(i as u32)));
        }
        if let Some(net) = self.nets.udp.as_mut() {
            net.flush(); // welcomes answering hellos
        }
        got || adopted
    }

    /// One read of the UDP transport (the ring and the sockets due, the speculative
    /// layout planned first): datagrams read.
    fn read_net(&mut self, readable: bool) -> usize {
        self.nets
            .udp
            .as_mut()
            .map_or(0, |net| net.receive(readable))
    }

    /// Marks the UDP connections whose peer this endpoint awaits something from (`on`:
    /// a receive posted for it by name, a send to it not complete, a transfer coming in
    /// from it), so that a silent one is pinged soon and its death found within the
    /// connection's await-probe time; `!on` clears every mark (the wait is over).
    pub(super) fn mark_awaited(&mut self, on: bool) {
        if self.nets.udp.is_none() {
            return;
        }
        let mut want = vec![false; self.peers.len()];
        if on {
            for src in self.req.matcher.posted_sources() {
                if let Some(w) = want.get_mut(src.0 as usize) {
                    *w = true;
                }
            }
            for op in self.req.sends.values() {
                if !op.state.is_done() {
                    if let Some(w) = want.get_mut(op.peer.0 as usize) {
                        *w = true;
                    }
                }
            }
        }
        let any = self
            .nets
            .udp
            .as_mut()
            .is_some_and(|net| net.mark_awaited(on, |i| want.get(i).copied().unwrap_or(false)));
        self.awaiting = any;
    }

    /// Fails UDP peer `i`, whose connection declared it dead (silent too long).
    fn udp_peer_dead(&mut self, i: usize) {
        let silent = self
            .ctx
            .config
            .udp
            .as_ref()
            .map_or(Duration::ZERO, |c| c.dead_after);
        self.fail_after_drain(
            i,
            format!(
                "{} sent nothing for {silent:?}: declared dead",
                PeerId(i as u32)
            ),
        );
    }

    /// The busy-poll latency path of a blocking receive from a network peer, the
    /// counterpart of `recv_fast`: when `sel` names its source, that peer is the
    /// endpoint's only live one and nothing is in flight (no posted receive, no send, no
    /// queued frame, no bulk transfer; per transport, [`Endpoint::recv_fast_udp`] and
    /// `recv_fast_tcp` say the rest), poll that peer's transport directly and copy a
    /// small message matching `sel` straight into `buf`: no request, no matching queues,
    /// and none of the rest of a progress pass (the other peers, the admission gate, new
    /// connections, the liveness check). Gives up (`None`) as soon as anything else
    /// heads the queue, or after its spin time ([`fast_spin`]), leaving it to the general
    /// path, which runs all that; `spun` then holds when its spin began (its first clock
    /// reading, 64 polls in), for the general path to count from.
    pub(super) fn recv_fast_net(
        &mut self,
        sel: Selector,
        buf: &mut [u8],
        timeout: Option<Duration>,
        spun: &mut Option<Instant>,
    ) -> Option<Result<Status>> {
        let i = sel.src?.0 as usize;
        // (A closed spin gate sends the receive to the general path, which sleeps at once.)
        let spin = if self.spin_open() {
            fast_spin(self.ctx.config.spin, timeout)
        } else {
            Duration::ZERO
        };
        let p = self.peers.get(i).filter(|p| p.alive)?;
        let open = !spin.is_zero()
            && !matches!(p.link, Link::Shm(_))
            && p.txq.is_empty()
            && p.rndv.chunks.is_empty()
            && p.engine.is_empty()
            && self.req.matcher.posted_len() == 0
            && self.req.sends.is_empty()
            && !self.req.matcher.has_unexpected(&sel)
            && self.peers.iter().filter(|p| p.alive).count() == 1;
        if !open {
            return None;
        }
        match self.peers[i].link {
            Link::Udp => self.recv_fast_udp(i, sel, buf, spin, spun),
            Link::Tcp => self.recv_fast_tcp(i, sel, buf, spin, spun),
            Link::Shm(_) => None,
        }
    }

    /// [`Endpoint::recv_fast_net`] over UDP (peer `i`): the link must have no frame
    /// queued, no bulk transfer either way and no layout armed; the sockets and the ring
    /// are read.
    fn recv_fast_udp(
        &mut self,
        i: usize,
        sel: Selector,
        buf: &mut [u8],
        spin: Duration,
        spun: &mut Option<Instant>,
    ) -> Option<Result<Status>> {
        loop {
            if !self.peers[i].alive {
                return None;
            }
            let net = self.nets.udp.as_mut()?;
            let u = net.link(i)?;
            let quiet = u.frames().peek().is_none() && !u.bulk().receiving() && !u.bulk().sending();
            if !quiet || net.planned_key().is_some() {
                return None;
            }
            // No `pause` between polls: each is a system call already, and a pause only
            // lengthens the pass a datagram landing during it waits for (busy 64 B across
            // the veth pair 2.55-2.63 -> 2.51-2.56 us, three alternated runs).
            let gate = &self.spin_gate;
            let got = spin_for(spin, spun, gate, || {
                let n = net.receive_planned(false);
                (n > 0).then_some(true)
            });
            if !got {
                return None;
            }
            self.drain_before_nak();
            // What came may be no message at all (an ack of the caller's last send,
            // which the peer sends at once after a long message): then spin on here
            // rather than in the general path, whose slower passes find the answer late.
            if let Some(r) = self.take_fast_udp(i, sel, buf) {
                return Some(r);
            }
        }
    }

    /// With the receive ring, after a read that took datagrams from the ring and opened a
    /// hole in some peer's sequence: reads every socket until they are empty (at most
    /// [`DRAIN_READS`] passes), before the connection NAKs the hole. The ring and the
    /// sockets are two queues of one arrival order (bulk fragments and long coalesced runs
    /// take the sockets, the small datagrams the ring), and a ring datagram read before
    /// the socket datagrams that preceded it would otherwise have them NAKed and resent
    /// as lost.
    fn drain_before_nak(&mut self) {
        if !self.nets.udp.as_ref().is_some_and(|n| n.read_ring_last()) {
            return;
        }
        let hole = |net: &Option<crate::transport::udp::UdpTransport>| {
            net.as_ref()
                .is_some_and(|n| n.live_links().any(|(_, u)| u.conn().nak_pending()))
        };
        for _ in 0..DRAIN_READS {
            if !hole(&self.nets.udp) || self.read_net(true) == 0 {
                return;
            }
        }
    }

    /// After [`Endpoint::recv_fast_udp`] read something: the peer's due timers and
    /// delivered messages, then the message at the head of its queue if it is a small one
    /// matching `sel` (copied out), else `None`. With that message or with none queued
    /// (an ack came), what the connection owes the peer (an ack, data an ack let out)
    /// goes out at once rather than when the next progress pass comes.
    fn take_fast_udp(&mut self, i: usize, sel: Selector, buf: &mut [u8]) -> Option<Result<Status>> {
        let net = self.nets.udp.as_mut()?;
        let now = net.read_at();
        let u = net.link_mut(i)?;
        if u.tick(now) {
            self.udp_peer_dead(i);
            return None;
        }
        let src = PeerId(i as u32);
        let result = match u.frames().peek().map(Frame::parse) {
            None => None,
            Some(Ok(Frame::Eager { tag, data })) if sel.matches(src, tag) => {
                Some(super::copy_eager(src, tag, data, buf))
            }
            Some(_) => return None,
        };
        if result.is_some() {
            u.release();
            self.stats.frames_received += 1;
        }
        net.send_now(i, now);
        result
    }

    /// Completes the rendezvous sends and receives whose UDP bulk transfers are over.
    fn finish_bulk(&mut self) {
        for i in 0..self.peers.len() {
            if matches!(self.peers[i].link, Link::Udp) {
                self.finish_bulk_peer(i);
            }
        }
    }

    /// Sends every UDP link's pending datagrams (acks, data, retransmissions) in one batch.
    /// `fresh`: read the clock; else the receive's reading will do.
    pub(super) fn net_transmit(&mut self, fresh: bool) {
        let Some(net) = self.nets.udp.as_mut().filter(|n| n.active()) else {
            return;
        };
        let now = if fresh { net.now() } else { net.read_at() };
        net.transmit_all(now);
    }

    /// How long a wait that has spun its configured time should go on spinning, counted
    /// from its last activity, because a datagram is due from a UDP peer within about a
    /// round trip (an ack of what is in flight, the repair of a hole): two of the link's
    /// smoothed RTTs, at most [`REPLY_SPIN_MAX`]; `None` when nothing is due. A sleep there
    /// puts a wake-up on the reply's path, tens of microseconds on this machine; under
    /// injected loss, on the path of the repairs and of the acks that free the next
    /// transfer (BENCHMARKS.md).
    pub(super) fn reply_due(&self) -> Option<Duration> {
        self.nets
            .udp
            .as_ref()?
            .live_links()
            .filter_map(|(_, u)| u.conn().reply_due())
            .max()
            .map(|rtt| Duration::from_nanos(2 * rtt).min(REPLY_SPIN_MAX))
    }

    /// Whether the only thing in flight is a bulk stream admission control slowed down:
    /// some UDP peer's stream is held to the slow window and no reply is due from any
    /// peer ([`Endpoint::reply_due`] leaves out a slowed stream's acks).
    pub(super) fn only_slowed(&self) -> bool {
        let slowed = self
            .nets
            .udp
            .as_ref()
            .is_some_and(|n| n.live_links().any(|(_, u)| u.conn().is_slowed()));
        slowed && self.reply_due().is_none()
    }

    /// Whether the last UDP receive took no clock reading (it got nothing; see
    /// `UdpTransport::read_is_fresh`).
    pub(super) fn net_clock_stale(&self) -> bool {
        self.nets.udp.as_ref().is_some_and(|n| !n.read_is_fresh())
    }

    /// How long a sleeping endpoint may wait before a connection timer (retransmission,
    /// delayed ack, keepalive, liveness) or a held-back injected fault needs it.
    pub(super) fn net_timer(&self) -> Option<Duration> {
        let net = self.nets.udp.as_ref()?;
        let now = net.now();
        let next = net
            .live_links()
            .filter_map(|(_, u)| {
                // Loss-recovery, keepalive and admission timers may fire a little late
                // in a sleep; a due ack may not (the peer's retransmission timer waits
                // for it).
                u.conn().poll_timeout().map(|t| {
                    let ack = u.conn().ack_timeout().unwrap_or(u64::MAX);
                    let floor = if u.bulk().sending() {
                        0
                    } else {
                        SLEEP_TIMER_FLOOR
                    };
                    t.max(now + floor).min(ack)
                })
            })
            .chain(net.next_fault_release())
            .chain(net.admit_timeout().map(|t| t.max(now + SLEEP_TIMER_FLOOR)))
            .min()?;
        Some(Duration::from_nanos(next.saturating_sub(now)))
    }

    /// Adds the network path's counters (transport and every UDP connection) to `s`.
    pub(super) fn add_net_stats(&self, s: &mut crate::Stats) {
        let Some(net) = self.nets.udp.as_ref() else {
            return;
        };
        let k = net.sock_stats();
        s.datagrams_sent += k.datagrams_sent;
        s.datagrams_received += k.datagrams_received;
        s.send_calls += k.send_calls;
        s.recv_calls += k.recv_calls;
        s.gro_reads += k.gro_reads;
        s.send_drops += k.send_drops;
        // A read cut short by its slot lost bytes: counted with the malformed drops.
        s.malformed_dropped += k.truncated;
        let t = net.stats();
        s.stray_dropped += t.stray + t.bad_handshakes;
        s.handshakes_abandoned += t.abandoned_handshakes;
        s.spec_misses += t.spec_misses;
        s.spec_backoffs += t.spec_backoffs;
        s.fast_grants += t.fast_grants;
        s.fast_refusals += t.fast_refusals;
        s.fast_revocations += t.fast_revocations;
        s.granted_fragments += t.granted_fragments;
        s.granted_hits += t.granted_hits;
        s.steered_datagrams += t.steered_datagrams;
        s.peer_socket_datagrams += t.peer_socket_datagrams;
        s.ring_datagrams += t.ring_datagrams;
        s.datagrams_received += t.ring_datagrams;
        s.ring_full_drops += t.ring_full_drops;
        s.ring_sent += t.ring_sent;
        s.ring_notices += t.ring_notices;
        s.keepalive_rounds += t.keepalive_rounds;
        s.datagrams_sent += t.ring_sent;
        s.malformed_dropped += t.ring_malformed;
        let f = net.fault_stats();
        s.faults_injected += f.dropped + f.duplicated + f.corrupted + f.delayed;
        for u in net.links() {
            let c = u.conn().stats();
            s.retransmissions += c.retransmissions;
            s.bulk_hashed += c.bulk_hashed;
            s.naks_sent += c.naks_sent;
            s.timeouts += c.timeouts;
            s.rto_probes += c.rto_probes;
            s.window_cuts += c.congestion_events;
            s.random_losses += c.random_losses;
            s.tail_probes += c.tail_probes;
            s.fast_granted += c.fast_granted;
            s.fast_refused += c.fast_refused;
            s.corrupt_dropped += c.dropped_corrupt;
            s.malformed_dropped += c.dropped_malformed;
            s.duplicates_dropped += c.duplicates;
            s.stray_dropped += c.dropped_stray;
            let b = u.bulk().stats;
            s.spec_hits += b.hits;
            s.spec_hit_bytes += b.hit_bytes;
            s.cleanup_bytes += b.cleanup_bytes;
            s.spec_moved += b.moved;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SLEEP_TIMER_FLOOR;
    use crate::lease::SendBuf;
    use crate::{Config, Endpoint, PeerId, Selector};
    use std::time::{Duration, Instant};

    /// Two endpoints over UDP on loopback, and each one's id for the other.
    fn udp_pair() -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
        let spin = Config::default().spin;
        udp_pair_spin(spin, spin)
    }

    /// As [`udp_pair`], with each endpoint's spin time (`None`: it never sleeps).
    fn udp_pair_spin(
        spin_a: Option<Duration>,
        spin_b: Option<Duration>,
    ) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
        let cfg = move |spin| Config {
            spin,
            calibrate: false,
            force_net: true,
            tcp: None,
            ..Config::default()
        };
        crate::endpoint::connected_pair(cfg(spin_a), cfg(spin_b))
    }

    /// A sleeping endpoint waits at least [`SLEEP_TIMER_FLOOR`] for its loss-recovery
    /// timers while only small messages are in flight, but not while a bulk transfer is:
    /// a stream's tail probe must fire on time.
    #[test]
    fn a_sleep_keeps_a_bulk_senders_loss_timers_on_time() {
        let ((mut a, pa), (mut b, pb)) = udp_pair();
        let floor = Duration::from_nanos(SLEEP_TIMER_FLOOR);
        let in_flight = |ep: &Endpoint| {
            let u = ep.udp(pa.0 as usize).expect("a UDP peer");
            (u.bulk().sending(), u.conn().stats().in_flight)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        // A small message in flight, unacknowledged: its timers wait for the floor.
        let small = a.isend(pa, 1, vec![1u8; 100]).unwrap();
        assert_eq!(in_flight(&a), (false, 1));
        assert!(a.net_timer().unwrap() >= floor, "{:?}", a.net_timer());
        let r = b.irecv(Selector::exact(Some(pb), 1), vec![0; 100]).unwrap();
        while b.test_recv(&r).unwrap().is_none() {
            a.progress();
            assert!(Instant::now() < deadline);
        }
        // A bulk transfer under way: they do not.
        let big = 8 << 20;
        let r = b.irecv(Selector::exact(Some(pb), 2), vec![0; big]).unwrap();
        let bulk = a.isend(pa, 2, vec![2u8; big]).unwrap();
        loop {
            a.progress();
            if matches!(in_flight(&a), (true, n) if n > 0) {
                break;
            }
            b.progress();
            assert!(Instant::now() < deadline, "no bulk fragment in flight");
        }
        // Until this side's delayed ack has gone (it would bound the sleep by itself).
        let acking = |ep: &Endpoint| {
            let u = ep.udp(pa.0 as usize).expect("a UDP peer");
            u.conn().ack_timeout().is_some()
        };
        while acking(&a) {
            a.progress();
            assert!(Instant::now() < deadline, "the ack never went");
        }
        assert!(in_flight(&a).1 > 0);
        let t = a.net_timer().unwrap();
        assert!(t < floor, "{t:?}");
        while b.test_recv(&r).unwrap().is_none() {
            a.progress();
            assert!(Instant::now() < deadline);
        }
        for s in [small, bulk] {
            while !a.test_send(&s).unwrap() {
                b.progress();
                assert!(Instant::now() < deadline);
            }
        }
    }

    /// A batch's rendezvous announcements are queued without a system call each and
    /// leave together at the kick (one run of datagrams), and every message arrives.
    #[test]
    fn a_batchs_announcements_leave_in_one_send() {
        let ((mut a, pa), (mut b, pb)) = udp_pair();
        let size = 64 << 10;
        // Within the connection's initial window (ten packets): all may leave at once.
        let n = 8;
        assert!(
            size as u64 > a.peers[pa.0 as usize].eager_max,
            "a rendezvous size"
        );
        let calls = |ep: &Endpoint| ep.stats().send_calls;
        let before = calls(&a);
        let sends: Vec<_> = (0..n)
            .map(|k| {
                let data = SendBuf::Owned(vec![k as u8; size].into());
                a.start_send_kick(pa, 4, data, false).unwrap()
            })
            .collect();
        assert_eq!(calls(&a), before, "an announcement left before the kick");
        a.kick(pa.0 as usize);
        assert_eq!(
            calls(&a),
            before + 1,
            "the announcements took more than one send"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        for k in 0..n {
            let r = b
                .irecv(Selector::exact(Some(pb), 4), vec![0; size])
                .unwrap();
            let got = loop {
                if let Some(got) = b.test_recv(&r).unwrap() {
                    break got;
                }
                a.progress();
                assert!(Instant::now() < deadline, "message {k} never arrived");
            };
            assert!(got.buf.iter().all(|&x| x == k as u8), "message {k} damaged");
        }
        for s in sends {
            while !a.test_send(&s).unwrap() {
                b.progress();
                assert!(Instant::now() < deadline, "a send never completed");
            }
        }
    }

    /// The fast path's spin: the configured time, at most `UDP_FAST_SPIN_MAX`, and never
    /// past the receive's timeout.
    #[test]
    fn the_fast_paths_spin_is_bounded_by_the_config_its_cap_and_the_timeout() {
        let us = Duration::from_micros;
        assert_eq!(super::fast_spin(None, None), super::UDP_FAST_SPIN_MAX);
        assert_eq!(super::fast_spin(Some(us(10)), None), us(10));
        assert_eq!(
            super::fast_spin(Some(Duration::from_secs(1)), None),
            super::UDP_FAST_SPIN_MAX
        );
        assert_eq!(super::fast_spin(None, Some(us(20))), us(20));
        assert_eq!(
            super::fast_spin(Some(us(50)), Some(Duration::ZERO)),
            Duration::ZERO
        );
        assert_eq!(super::fast_spin(Some(Duration::ZERO), None), Duration::ZERO);
    }

    /// The UDP socket an endpoint reads for new peers (its main one) is in its epoll set
    /// from the start; its peers' own sockets join it when the endpoint first prepares to
    /// sleep, so that a sleep wakes for each (and a busy endpoint's datagrams pay no
    /// wake-up callbacks before).
    #[test]
    fn udp_sockets_join_the_epoll_set_before_the_first_sleep() {
        // `a` never sleeps; `b` sleeps as soon as it finds nothing.
        let ((mut a, _), (mut b, pa)) = udp_pair_spin(None, Some(Duration::ZERO));
        // EPOLL_CTL_MOD with the events and the token each was added with (so the check
        // changes nothing): ENOENT when not watched.
        let watched = |ep: &Endpoint, fd| {
            let main = ep.nets.udp.as_ref().unwrap().sock.raw();
            let tok = if fd == main {
                super::super::TOK_UDP_MAIN
            } else {
                super::super::TOK_UDP
            };
            match ep.epoll.modify(fd, tok, false) {
                Ok(()) => true,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
                Err(e) => panic!("epoll_ctl: {e}"),
            }
        };
        let main = a.nets.udp.as_ref().unwrap().sock.raw();
        // The main socket and the peer's own, and the receive ring when there is one.
        let expect = |ep: &Endpoint| 2 + usize::from(ep.nets.udp.as_ref().unwrap().has_ring());
        let fds = a.nets.udp.as_mut().unwrap().fds();
        assert_eq!(fds.len(), expect(&a));
        assert!(watched(&a, main));
        let own = fds.into_iter().find(|&fd| fd != main).unwrap();
        assert!(!watched(&a, own), "watched before any sleep");
        // A sleep (a blocking receive that times out) and a user's prepare_wait both
        // add them.
        let err = b.recv_timeout(
            Selector::exact(Some(pa), 0),
            &mut [0u8; 8],
            Some(Duration::from_millis(1)),
        );
        assert!(matches!(err, Err(crate::Error::Timeout)), "{err:?}");
        assert!(b.stats().sleeps > 0);
        if a.prepare_wait() {
            a.finish_wait();
        }
        for ep in [&mut a, &mut b] {
            let n = expect(ep);
            let fds = ep.nets.udp.as_mut().unwrap().fds();
            assert_eq!(fds.len(), n);
            for fd in fds {
                assert!(watched(ep, fd), "fd {fd} not watched after a sleep");
            }
        }
    }
}
