//! The endpoint's side of the TCP transport: connecting, accepting (hello / welcome),
//! reading and writing every TCP link once per progress pass, completing rendezvous
//! transfers the links finished, and failing peers whose connection ended.

use super::link;
use super::net::spin_for;
use super::{copy_eager, Endpoint, FAST_STREAK, TOK_PEER0};
use crate::error::{Error, Result};
use crate::sys::TcpConnecting;
use crate::transport::tcp::{LinkError, TcpLink, TcpTransport};
use crate::{Selector, Status};
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Epoll token of the TCP listening socket.
pub(super) const TOK_TCP_LISTENER: u64 = u64::MAX - 1;
/// Epoll token of accepted TCP connections waiting for their hello.
pub(super) const TOK_TCP_INCOMING: u64 = u64::MAX - 2;
/// How long a TCP connect to one of a peer's addresses may take before the next is tried
/// beside it.
const TCP_ALTERNATE_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

impl Endpoint {
    /// Connects over TCP to the endpoint `id` at `dest`: connect (without blocking), hello,
    /// then the welcome, progressing everything else all along, by `deadline`. When the
    /// connect to `dest` fails, or has not completed within [`TCP_ALTERNATE_AFTER`], it
    /// connects to the peer's next address (`alternates`, in order) as well. One connection
    /// at a time carries the hello (two welcomed would be two peers on the other side): the
    /// first made; when the endpoint there is another one (it refuses the hello: an
    /// address the peer shares with hosts of other networks, such as a container bridge's)
    /// or the connection fails, the next made carries it. The others close unused (the peer
    /// drops a connection closed before its hello).
    pub(super) fn connect_tcp(
        &mut self,
        addr: &str,
        dest: SocketAddr,
        alternates: Vec<SocketAddr>,
        id: u128,
        deadline: Instant,
    ) -> Result<PeerId> {
        let fail = |why: String| Error::connect(addr, why);
        if self.nets.tcp.is_none() {
            return Err(fail("the peer is reachable only over TCP and this endpoint's TCP transport is off (CLINK_TCP=off)".into()));
        }
        let mut left = std::iter::once(dest).chain(alternates);
        let mut tries: Vec<(TcpConnecting, SocketAddr)> = Vec::new();
        let mut made: std::collections::VecDeque<(TcpStream, SocketAddr)> = Default::default();
        let mut hello: Option<(TcpLink, SocketAddr)> = None;
        let mut failed: Vec<String> = Vec::new();
        let mut next_at = Instant::now();
        let mut more = true;
        loop {
            let now = Instant::now();
            if more && ((tries.is_empty() && made.is_empty() && hello.is_none()) || now >= next_at)
            {
                match left.next() {
                    Some(to) => {
                        let cc = self.nets.tcp.as_ref().and_then(|t| t.congestion());
                        match TcpConnecting::start(to, cc) {
                            Ok(c) => tries.push((c, to)),
                            Err(e) => failed.push(format!("TCP connect to {to}: {e}")),
                        }
                        next_at = now + TCP_ALTERNATE_AFTER;
                    }
                    None => more = false,
                }
            }
            let mut k = 0;
            while k < tries.len() {
                match tries[k].0.poll() {
                    Ok(false) => k += 1,
                    Ok(true) => {
                        let (c, to) = tries.swap_remove(k);
                        match c.into_stream() {
                            Ok(sock) => made.push_back((sock, to)),
                            Err(e) => failed.push(format!("TCP connect to {to}: {e}")),
                        }
                    }
                    Err(e) => {
                        let (_, to) = tries.swap_remove(k);
                        failed.push(format!("TCP connect to {to}: {e}"));
                    }
                }
            }
            if hello.is_none() {
                if let Some((sock, to)) = made.pop_front() {
                    let tcp = self.nets.tcp.as_ref().expect("checked above");
                    match tcp.hello(sock, id) {
                        Ok(link) => hello = Some((link, to)),
                        Err(e) => failed.push(format!("TCP connection to {to}: {e}")),
                    }
                }
            }
            if let Some((link, to)) = hello.as_mut() {
                match Self::tcp_welcome_step(link) {
                    Some(Ok(())) => {
                        let (link, _) = hello.take().expect("matched above");
                        return self.add_welcomed(link);
                    }
                    Some(Err(why)) => {
                        failed.push(format!("TCP handshake with {to}: {why}"));
                        hello = None;
                        continue;
                    }
                    None => {}
                }
            }
            if tries.is_empty() && made.is_empty() && hello.is_none() && !more {
                return Err(fail(failed.join("; ")));
            }
            if now >= deadline {
                let waiting = tries
                    .iter()
                    .map(|(_, to)| format!("TCP connect to {to}: timed out"))
                    .chain(hello.iter().map(|(_, to)| {
                        format!("no welcome from {to} (no clink endpoint listens there, or it is not progressing)")
                    }));
                return Err(fail(
                    failed
                        .into_iter()
                        .chain(waiting)
                        .collect::<Vec<_>>()
                        .join("; "),
                ));
            }
            self.progress();
            std::hint::spin_loop();
        }
    }

    /// Writes `link`'s hello and reads its answer: `None` while no welcome has come,
    /// `Some(Ok)` when welcomed, `Some(Err(why))` when refused or the connection failed.
    fn tcp_welcome_step(link: &mut TcpLink) -> Option<std::result::Result<(), String>> {
        let r = link.write().and_then(|_| link.receive());
        // A refusal is followed by the end of the stream, often in the same read: the
        // welcome's reason comes first.
        match (TcpTransport::welcomed(link), r) {
            (Some(w), _) => Some(w),
            (None, Err(e)) => Some(Err(e.to_string())),
            (None, Ok(_)) => None,
        }
    }

    /// Makes the welcomed `link` a peer.
    fn add_welcomed(&mut self, mut link: TcpLink) -> Result<PeerId> {
        link.crossed = link.welcome_crossed();
        // (A stream that ended right after the welcome fails the new peer at its first
        // read.)
        let id = self.add_tcp_peer(link, true)?;
        // Frames that came with the welcome are waiting in the link.
        self.mark_busy(id.0 as usize);
        Ok(id)
    }

    /// Drives `link` (connected to `dest`, its hello queued) until the welcome arrives,
    /// progressing everything else meanwhile, by `deadline`; the welcomed link becomes a
    /// peer.
    pub(super) fn tcp_welcome(
        &mut self,
        addr: &str,
        dest: SocketAddr,
        mut link: TcpLink,
        deadline: Instant,
    ) -> Result<PeerId> {
        let fail = |why: String| Error::connect(addr, why);
        let timeout = deadline.saturating_duration_since(Instant::now());
        loop {
            match Self::tcp_welcome_step(&mut link) {
                Some(Ok(())) => return self.add_welcomed(link),
                Some(Err(why)) => return Err(fail(format!("TCP handshake with {dest}: {why}"))),
                None => {}
            }
            if Instant::now() >= deadline {
                return Err(fail(format!(
                    "no welcome from {dest} within {timeout:?} (no clink endpoint listens there, or it is not progressing)"
                )));
            }
            // Serve everything else meanwhile (mutual connects must not deadlock).
            self.progress();
            std::hint::spin_loop();
        }
    }

    /// Accepts TCP connections and reads the hellos of those being set up; welcomed ones
    /// become peers. True when a peer was added.
    pub(super) fn tcp_accept(&mut self) -> bool {
        let Some(tcp) = self.nets.tcp.as_mut() else {
            return false;
        };
        for fd in tcp.accept_new() {
            if let Err(e) = self.epoll.add(fd, TOK_TCP_INCOMING) {
                tracing::warn!("epoll_ctl TCP connection: {e}");
            }
        }
        self.tcp_handshakes()
    }

    /// Reads the hellos of accepted connections and adopts the peers they name (no
    /// `accept` call: new connections are the listener's, which epoll reports).
    fn tcp_handshakes(&mut self) -> bool {
        let Some(tcp) = self.nets.tcp.as_mut().filter(|t| t.handshaking()) else {
            return false;
        };
        let hs = tcp.poll_incoming(self.ctx.config.connect_timeout, self.connecting);
        self.stats.handshakes_abandoned += hs.abandoned;
        for why in hs.dropped {
            self.stats.handshakes_refused += 1;
            self.last_error = Some(why);
        }
        let mut did = false;
        for link in hs.accepted {
            match self.add_tcp_peer(link, false) {
                Ok(id) => {
                    self.new_peers.push_back(id);
                    self.mark_busy(id.0 as usize);
                    did = true;
                }
                Err(e) => self.last_error = Some(e.to_string()),
            }
        }
        did
    }

    /// One progress pass over the TCP transport: handshakes under way, then every TCP
    /// link's socket read (frames queued, rendezvous payloads placed), finished transfers
    /// completed, dead links failed. True when anything arrived.
    pub(super) fn tcp_receive(&mut self) -> bool {
        let Some(tcp) = self.nets.tcp.as_ref() else {
            return false;
        };
        let mut did = false;
        if tcp.handshaking() {
            did |= self.tcp_handshakes();
        }
        let mut k = 0;
        while let Some(i) = self.tcp_peer(k) {
            did |= self.tcp_read(i);
            k = self.tcp_next(k, i);
        }
        did
    }

    /// [`Endpoint::recv_fast_net`] over TCP (peer `i`): the link must have no frame
    /// queued, no bytes waiting to be written, no rendezvous transfer and no failure
    /// pending, and no handshake be under way; its socket alone is read. It serves at
    /// most [`FAST_STREAK`] messages in a row, so that a general pass (keepalives, the
    /// liveness check) runs between them. A read that fails leaves its error in the link
    /// ([`crate::transport::tcp::TcpLink::failed`]) for the general path's read, which fails the peer.
    pub(super) fn recv_fast_tcp(
        &mut self,
        i: usize,
        sel: Selector,
        buf: &mut [u8],
        spin: Duration,
        spun: &mut Option<Instant>,
    ) -> Option<Result<Status>> {
        if self.fast_streak >= FAST_STREAK
            || self.nets.tcp.as_ref().is_none_or(TcpTransport::handshaking)
        {
            return None;
        }
        let t = link::tcp_mut(&mut self.nets, i)?;
        if t.frames().peek().is_some() || !t.bulk_idle() || t.wants_write() || t.has_failed() {
            return None;
        }
        let got = spin_for(spin, spun, &self.spin_gate, || match t.receive() {
            Ok(true) => Some(true),
            Ok(false) => None,
            Err(e) => {
                t.note_failure(e);
                Some(false)
            }
        });
        if !got {
            return None;
        }
        self.take_fast_tcp(i, sel, buf)
    }

    /// After [`Endpoint::recv_fast_tcp`] read something: the message at the head of the
    /// link's queue if it is a small one matching `sel` (copied out), else `None` (the
    /// general path takes what was read).
    fn take_fast_tcp(&mut self, i: usize, sel: Selector, buf: &mut [u8]) -> Option<Result<Status>> {
        let t = link::tcp_mut(&mut self.nets, i)?;
        let src = PeerId(i as u32);
        let result = match Frame::parse(t.frames().peek()?) {
            Ok(Frame::Eager { tag, data }) if sel.matches(src, tag) => {
                copy_eager(src, tag, data, buf)
            }
            _ => return None,
        };
        t.release();
        self.stats.frames_received += 1;
        self.fast_streak += 1;
        Some(result)
    }

    /// The `k`th peer on the TCP transport's list.
    fn tcp_peer(&self, k: usize) -> Option<usize> {
        self.nets.tcp.as_ref().and_then(|t| t.peers.get(k).copied())
    }

    /// The list position after visiting peer `i` at `k` (a peer that failed meanwhile left
    /// the list, so its successor is at `k` now).
    fn tcp_next(&self, k: usize, i: usize) -> usize {
        if self.tcp_peer(k) == Some(i) {
            k + 1
        } else {
            k
        }
    }

    /// Reads peer `i`'s connection; fails the peer when it ended or sent garbage.
    ///
    /// After a failed write (or a read off the progress pass) the link is dead, but what
    /// the peer sent before is still readable (the kernel keeps bytes that came before a
    /// reset): it is read and handled first, one batch of reads per pass, and the peer
    /// fails with that failure once the socket has no more, so that its last messages (a
    /// reason it gave for leaving, say) are not lost to the failed write.
    fn tcp_read(&mut self, i: usize) -> bool {
        if !self.peers[i].alive {
            return false;
        }
        let Some(t) = link::tcp(&self.nets, i) else {
            return false;
        };
        if t.has_failed() && t.frames().full() {
            // Room for what is left: the frames read are handled (copied aside if no
            // receive wants them), as they would be when the peer fails.
            self.drain(i, true);
        }
        let Some(t) = link::tcp_mut(&mut self.nets, i) else {
            return false;
        };
        let failed = t.take_failure();
        let r = match (t.receive(), failed) {
            (Ok(true), Some(e)) => {
                t.note_failure(e);
                Ok(true)
            }
            // Nothing more to read: the earlier failure says why the link ended.
            (Ok(false) | Err(LinkError::Closed | LinkError::Io(_)), Some(e)) => Err(e),
            (r, _) => r,
        };
        let did = matches!(r, Ok(true));
        self.finish_bulk_peer(i);
        if did {
            self.mark_busy(i);
        }
        if let Err(e) = r {
            self.tcp_failed(i, e);
            return true;
        }
        did
    }

    /// Fails peer `i` after its link reported `e`; frames it delivered before are handled
    /// first (its eager messages still arrive).
    fn tcp_failed(&mut self, i: usize, e: LinkError) {
        let peer = PeerId(i as u32);
        if let LinkError::Malformed(m) = &e {
            self.stats.protocol_errors += 1;
            self.stats.malformed_dropped += 1;
            let err = Error::Proto {
                peer,
                source: m.clone(),
            };
            self.fail_peer(i, err.to_string());
            return;
        }
        self.fail_after_drain(i, format!("{peer} {e}"));
    }

    /// Fails the TCP peers whose host is gone ([`crate::transport::tcp::TcpLink::host_gone`]),
    /// when a look is due at `now` (part of the liveness check).
    pub(super) fn tcp_liveness(&mut self, now: Instant) {
        let Some(tcp) = self.nets.tcp.as_mut() else {
            return;
        };
        for (i, silent) in tcp.hosts_gone(now) {
            let why = format!(
                "no acknowledgement from its host for {} ms with data or probes outstanding: declared dead",
                silent.as_millis()
            );
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, why);
            self.tcp_failed(i, LinkError::Io(e));
        }
    }

    /// Writes every TCP link's queue (one batch of gathering writes per link per pass) and keeps
    /// epoll's interest in writability in step with what is left.
    pub(super) fn tcp_transmit(&mut self) {
        let mut k = 0;
        while let Some(i) = self.tcp_peer(k) {
            self.tcp_write(i);
            k = self.tcp_next(k, i);
        }
    }

    /// Writes peer `i`'s queue (at the pass's end, on writability, or at once after a
    /// send: [`Endpoint::kick`]).
    pub(super) fn tcp_write(&mut self, i: usize) {
        let alive = self.peers[i].alive;
        let Some(t) = link::tcp_mut(&mut self.nets, i) else {
            return;
        };
        if !alive || !t.wants_write() {
            if t.out_armed() && alive {
                t.set_out_armed(false);
                let _ = self.epoll.modify(t.fd(), TOK_PEER0 + i as u64, false);
            }
            return;
        }
        let r = t.write();
        // Asleep, wake when the socket takes more (level-triggered).
        let want = t.wants_write();
        if want != t.out_armed() {
            t.set_out_armed(want);
            if let Err(e) = self.epoll.modify(t.fd(), TOK_PEER0 + i as u64, want) {
                tracing::warn!("epoll_ctl TCP connection: {e}");
            }
        }
        if let Err(e) = r {
            // Failed at the next read (see `TcpLink::failed`), which comes at once:
            // the hang-up makes the socket readable.
            t.note_failure(e);
        }
        self.finish_bulk_peer(i);
    }

    /// Epoll reported peer `i`'s socket (readable, writable or hung up).
    pub(super) fn tcp_event(&mut self, i: usize) -> bool {
        let did = self.tcp_read(i);
        self.tcp_write(i);
        did
    }

    /// Peer `i` failed or closed: flush what its link can still take, end our side of the
    /// stream (the peer reads the end), free its buffers (its transfers are forgotten
    /// with them) and stop watching it.
    pub(super) fn tcp_removed(&mut self, i: usize) {
        let Some(t) = link::tcp_mut(&mut self.nets, i) else {
            return;
        };
        let _ = t.write();
        t.shutdown();
        t.free();
        self.epoll.remove(t.fd());
        if let Some(tcp) = self.nets.tcp.as_mut() {
            tcp.detach(i);
        }
    }

    /// Adds the TCP transport's counters to `s`.
    pub(super) fn add_tcp_stats(&self, s: &mut crate::Stats) {
        let Some(tcp) = self.nets.tcp.as_ref() else {
            return;
        };
        for t in tcp.links() {
            let k = t.stats;
            s.stream_writes += k.writes;
            s.stream_bytes_sent += k.bytes_sent;
            s.stream_reads += k.reads;
            s.stream_bytes_received += k.bytes_received;
            s.stream_direct_bytes += k.direct_bytes;
            s.spec_hits += k.spec_hits;
            s.spec_hit_bytes += k.spec_hit_bytes;
            s.spec_misses += k.spec_misses;
            s.cleanup_bytes += k.cleanup_bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FAST_STREAK;
    use crate::transport::tcp::TcpConfig;
    use crate::{Config, Endpoint, PeerId, Selector};
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    /// Two endpoints over TCP on loopback that spin 100 us before they sleep, and each
    /// one's id for the other.
    fn tcp_pair() -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
        let cfg = || Config {
            calibrate: false,
            force_net: true,
            prefer_tcp: true,
            spin: Some(Duration::from_micros(100)),
            tcp: Some(TcpConfig {
                bind: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
                ..TcpConfig::default()
            }),
            ..Config::default()
        };
        crate::endpoint::connected_pair(cfg(), cfg())
    }

    /// `CLINK_TCP_CC` sets both ends' connections' congestion control (reno: built into
    /// every kernel); without it they run the host's default; a name the kernel refuses
    /// fails the endpoint's creation, naming the choices.
    #[test]
    fn tcp_links_run_the_congestion_control_asked_for() {
        let cfg = |cc: Option<&str>| Config {
            calibrate: false,
            force_net: true,
            prefer_tcp: true,
            tcp: Some(TcpConfig {
                bind: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
                congestion: cc.map(String::from),
                ..TcpConfig::default()
            }),
            ..Config::default()
        };
        let ran = |(a, pa): &(Endpoint, PeerId)| {
            let t = crate::endpoint::link::tcp(&a.nets, pa.0 as usize).expect("a TCP link");
            t.congestion().unwrap()
        };
        let (a, b) = crate::endpoint::connected_pair(cfg(Some("reno")), cfg(Some("reno")));
        assert_eq!((ran(&a), ran(&b)), ("reno".into(), "reno".into()));
        let host = crate::transport::tcp::host_congestion_control().unwrap();
        let (a, b) = crate::endpoint::connected_pair(cfg(None), cfg(None));
        assert_eq!((ran(&a), ran(&b)), (host.clone(), host));
        let e = crate::Context::with_config(cfg(Some("no-such-cc")))
            .and_then(|c| c.endpoint())
            .err()
            .expect("a congestion control the kernel lacks")
            .to_string();
        assert!(
            e.contains("CLINK_TCP_CC=no-such-cc") && e.contains("reno"),
            "{e}"
        );
    }

    /// The latency path of a blocking receive serves at most [`FAST_STREAK`] messages in
    /// a row; the next receive takes the general path, whose pass (keepalives, the
    /// liveness check) starts the count again. One thread drives both ends, so each
    /// reply is in the socket before its receive starts.
    #[test]
    fn the_tcp_latency_path_yields_to_a_general_pass_every_streak() {
        let ((mut a, pa), (mut b, pb)) = tcp_pair();
        assert_eq!(a.transport(pa).unwrap(), "tcp");
        let mut streaks = Vec::new();
        let mut buf = [0u8; 8];
        for k in 0..600u64 {
            b.send(pb, 3, &k.to_le_bytes()).unwrap();
            let st = a.recv(Selector::exact(Some(pa), 3), &mut buf).unwrap();
            assert_eq!((st.len, u64::from_le_bytes(buf)), (8, k));
            streaks.push(a.fast_streak);
            a.send(pa, 4, &k.to_le_bytes()).unwrap();
            b.recv(Selector::exact(Some(pb), 4), &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), k);
        }
        assert_eq!(streaks.iter().max(), Some(&FAST_STREAK), "{streaks:?}");
        for w in streaks.windows(2) {
            if w[0] == FAST_STREAK {
                assert_eq!(w[1], 0, "a general pass after a full streak: {streaks:?}");
            }
        }
    }
}
