//! Keepalives sent for an endpoint whose application is away.
//!
//! An endpoint has no thread of its own: the application's calls drive its connections.
//! A process that computes for minutes between calls (an MPI rank, a training step, a
//! server idle at night) would fall silent and its peers would declare it dead after
//! `CLINK_NET_DEAD_MS`. TCP keeps such connections alive in the kernel, UCX and libfabric
//! providers with a progress thread; here a small thread per endpoint does the one thing
//! that cannot wait for the application: it tells every UDP peer, once per keepalive
//! interval in which the application made no receive pass, that this process is alive
//! (a ping on the peer's connection, which the peer answers with an ack that waits in
//! the socket). It touches none of the connection's state: the pings are built once per
//! connection (floor 0: they name no packet) and sent through a duplicate of the
//! endpoint's socket; the application's passes are seen through one counter it bumps
//! with a plain store. The fast path pays that store and nothing else.
//!
//! With each ping goes the connection's standing ack
//! ([`clink_proto::reliable::Conn::standing_ack`]: what had arrived in order when the
//! application left, published by its thread as it transmits, two atomic stores when it
//! changes). Its last ack may have been lost after the application stopped driving the
//! connection: the peer's send, which completes with that ack, would otherwise wait for
//! the application to come back, forever if the application waits for that peer (a
//! receiver that waits for its sender to exit). The repeat says "delay unknown", so the
//! peer takes no RTT sample from it.
//!
//! The other way round, the message datagrams the application sent and had not seen
//! acknowledged when it left ([`clink_proto::reliable::Repeat`], copies of the packets
//! as they first went out, the bytes shared with the connection, not copied) are repeated
//! in the away rounds numbered 1, 2, 4, 8, ...: a message whose last datagram was lost
//! reaches a peer that waits for it, though its sender computes for minutes. The
//! application's thread brings that list up to date as it transmits, under a lock taken
//! only when the connection sent or had acknowledged something since the last time (two
//! uncontended lock round trips per round trip of a ping-pong). Bulk fragments are not
//! repeated: their bytes are the application's, lent for the duration of a call.
//!
//! The other half lives in the connection ([`clink_proto::reliable::Conn`]): a caller
//! that comes back after two or more keepalive intervals restarts its peers' liveness
//! timeouts rather than judging them on silence it was not there to hear.

use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use clink_proto::reliable::{Conn, Datagram, Repeat};

/// Most message datagrams kept to repeat per connection (the newest).
const MAX_REPEATS: usize = 32;

/// What the thread and the endpoint share.
#[derive(Default)]
struct Shared {
    /// Receive passes the application made (wrapping); only the endpoint writes it.
    passes: AtomicU64,
    /// Keepalive rounds the thread sent (each to every connection).
    rounds: AtomicU64,
    /// The open connections.
    conns: Mutex<Vec<Kept>>,
}

/// One connection kept alive.
struct Kept {
    dest: SocketAddr,
    conn: u32,
    /// Its ping, encoded once.
    ping: Vec<u8>,
    standing: Arc<Standing>,
}

/// What a connection's application left standing for the keepalive thread to say while
/// it is away: the standing ack ([`Standing::publish`]) and the message datagrams to
/// repeat ([`Standing::publish_repeats`]).
#[derive(Default)]
pub struct Standing {
    /// Every packet below it arrived (0: nothing published).
    cum: AtomicU64,
    /// The credit limit advertised with it (never below `cum`).
    limit: AtomicU64,
    /// The message datagrams sent and not acknowledged (by packet number; some may have
    /// been acknowledged out of order since).
    repeats: Mutex<VecDeque<Repeat>>,
}

impl Standing {
    /// Publishes `(cum, limit)` ([`clink_proto::reliable::Conn::standing_ack`]) when
    /// `cum` moved (one load of a line only this writer writes, otherwise). One writer;
    /// both only grow.
    pub fn publish(&self, cum: u64, limit: u64) {
        if self.cum.load(Ordering::Relaxed) == cum {
            return;
        }
        // The limit first: a reader that sees the new `cum` sees this limit or a later
        // one, never a limit below its `cum` (which the peer would take for a protocol
        // error).
        self.limit.store(limit, Ordering::Release);
        self.cum.store(cum, Ordering::Release);
    }

    /// Brings the datagrams to repeat up to date with `conn`: forgets those below its
    /// floor (acknowledged), adds the message datagrams it sent from packet `from` on
    /// (the previous call's [`Conn::next_pn`]), keeping the newest [`MAX_REPEATS`].
    pub fn publish_repeats(&self, conn: &Conn, from: u64) {
        let mut l = self.repeats.lock().unwrap_or_else(PoisonError::into_inner);
        let floor = conn.send_floor();
        while l.front().is_some_and(|r| r.pn() < floor) {
            l.pop_front();
        }
        // Only the newest are kept: walk back from the newest packet (a stream of 16 KiB
        // messages sends a dozen datagrams a message, most of which would be pushed out
        // again within the same call), appending, then put what was appended in order.
        let start = l.len();
        // (Bulk fragments after the newest message are never repeated: not walked.)
        let mut pn = conn.repeat_end();
        while pn > from.max(floor) && l.len() - start < MAX_REPEATS {
            pn -= 1;
            l.extend(conn.repeat_of(pn));
        }
        l.make_contiguous()[start..].reverse();
        let excess = l.len().saturating_sub(MAX_REPEATS);
        l.drain(..excess);
    }

    /// The message datagrams of connection `conn` to repeat.
    fn repeats(&self, conn: u32) -> Vec<Vec<u8>> {
        let l = self.repeats.lock().unwrap_or_else(PoisonError::into_inner);
        l.iter()
            .map(|r| {
                let mut d = Vec::new();
                r.encode(conn, &mut d);
                d
            })
            .collect()
    }

    /// The ack datagram of connection `conn` to repeat, if anything was published.
    fn datagram(&self, conn: u32) -> Option<Vec<u8>> {
        let cum = self.cum.load(Ordering::Acquire);
        let limit = self.limit.load(Ordering::Acquire);
        if cum == 0 {
            return None;
        }
        let mut buf = Vec::new();
        Datagram::standing_ack(conn, cum, limit).encode(&mut buf);
        Some(buf)
    }
}

/// The keepalive thread of one endpoint; stopped and joined on drop.
pub struct Keepalive {
    shared: Arc<Shared>,
    /// Dropped to stop the thread (its wait ends at once).
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Keepalive {
    /// Starts the thread: it sends through `sock` (a duplicate of the endpoint's socket)
    /// every `interval` in which no receive pass was made.
    pub fn start(sock: UdpSocket, interval: Duration) -> std::io::Result<Keepalive> {
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = mpsc::channel::<()>();
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("clink-keepalive".into())
            .spawn(move || run(&s, &sock, interval, &stopped))?;
        Ok(Keepalive {
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Records a receive pass of the application (one plain store: only this side writes).
    #[inline]
    pub fn note_pass(&self) {
        let p = &self.shared.passes;
        p.store(p.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Adds connection `conn` to peer `dest` to those kept alive; its standing ack and
    /// datagrams to repeat are published through the handle returned.
    pub fn add(&self, dest: SocketAddr, conn: u32) -> Arc<Standing> {
        let mut ping = Vec::new();
        Datagram::Ping { conn, floor: 0 }.encode(&mut ping);
        let standing = Arc::new(Standing::default());
        self.lock().push(Kept {
            dest,
            conn,
            ping,
            standing: Arc::clone(&standing),
        });
        standing
    }

    /// Removes connection `conn` to peer `dest` (it failed or closed).
    pub fn remove(&self, dest: SocketAddr, conn: u32) {
        self.lock().retain(|k| (k.dest, k.conn) != (dest, conn));
    }

    /// Keepalive rounds sent so far.
    pub fn rounds(&self) -> u64 {
        self.shared.rounds.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // A panic while holding it left a valid list.
        self.shared
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(s: &Shared, sock: &UdpSocket, interval: Duration, stopped: &mpsc::Receiver<()>) {
    let mut seen = s.passes.load(Ordering::Relaxed);
    // Consecutive away rounds.
    let mut away = 0u64;
    loop {
        match stopped.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let now = s.passes.load(Ordering::Relaxed);
        if now == seen {
            // A whole interval without a pass: the application is away.
            away += 1;
            let conns = s.conns.lock().unwrap_or_else(PoisonError::into_inner);
            for k in conns.iter() {
                // Best effort, as any keepalive: a full socket buffer drops it.
                let _ = sock.send_to(&k.ping, k.dest);
                if let Some(ack) = k.standing.datagram(k.conn) {
                    let _ = sock.send_to(&ack, k.dest);
                }
                if away.is_power_of_two() {
                    for d in k.standing.repeats(k.conn) {
                        let _ = sock.send_to(&d, k.dest);
                    }
                }
            }
            if !conns.is_empty() {
                s.rounds.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            away = 0;
        }
        seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A keepalive thread of interval `interval` keeping connection 7 to a socket of the
    /// test's (its reads time out after 5 s): that socket, the thread, the connection's
    /// standing ack.
    fn kept(interval: Duration) -> (UdpSocket, Keepalive, Arc<Standing>) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let k = Keepalive::start(tx, interval).unwrap();
        let standing = k.add(rx.local_addr().unwrap(), 7);
        (rx, k, standing)
    }

    #[test]
    fn pings_go_only_while_no_pass_is_made() {
        let (rx, k, _) = kept(Duration::from_millis(50));
        // Away: pings come, each a valid ping on connection 7.
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("a ping while away");
        match Datagram::parse(&buf[..n]) {
            Ok(Datagram::Ping { conn: 7, floor: 0 }) => {}
            other => panic!("{other:?}"),
        }
        // Present: passes far more often than the interval keep the thread quiet (two
        // intervals to get past one that straddled the switch, then five counted).
        let pass_for = |d: Duration| {
            let start = Instant::now();
            while start.elapsed() < d {
                k.note_pass();
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        pass_for(Duration::from_millis(100));
        let before = k.rounds();
        pass_for(Duration::from_millis(250));
        // One round of slack: a pass loop descheduled for a whole interval is away.
        assert!(
            k.rounds() <= before + 1,
            "{} rounds while present",
            k.rounds() - before
        );
        k.remove(rx.local_addr().unwrap(), 7);
        drop(k); // joins at once
    }

    #[test]
    fn the_standing_ack_goes_with_the_pings_once_published() {
        let (rx, k, standing) = kept(Duration::from_millis(20));
        let mut buf = [0u8; 256];
        let mut next = || {
            let n = rx.recv(&mut buf).expect("a datagram while away");
            Datagram::parse(&buf[..n])
                .map(|d| format!("{d:?}"))
                .unwrap()
        };
        // Nothing published: pings alone, round after round.
        for _ in 0..2 {
            let d = next();
            assert!(d.starts_with("Ping"), "{d}");
        }
        standing.publish(12, 40);
        let want = format!("{:?}", Datagram::standing_ack(7, 12, 40));
        // (A round may have been under way: within two, the ack.)
        let got: Vec<String> = (0..4).map(|_| next()).collect();
        assert!(got.contains(&want), "{got:?}");
        drop(k);
    }

    #[test]
    fn the_newest_unacknowledged_datagrams_are_kept_to_repeat() {
        let cfg = clink_proto::reliable::Config {
            initial_cwnd: 64,
            ..Default::default()
        };
        let mut conn = Conn::new(cfg, 0);
        let standing = Standing::default();
        let send = |conn: &mut Conn, n: u64| {
            let mut buf = Vec::new();
            for i in 0..n {
                conn.send(i, b"m").unwrap();
                buf.clear();
                assert!(conn.poll_transmit(0, &mut buf).is_some());
            }
        };
        let pns = |standing: &Standing| -> Vec<u64> {
            standing
                .repeats(0)
                .iter()
                .map(|d| match Datagram::parse(d) {
                    Ok(Datagram::Data { hdr, .. }) => hdr.pn,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        send(&mut conn, 10);
        standing.publish_repeats(&conn, 0);
        assert_eq!(pns(&standing), (0..10).collect::<Vec<_>>());
        // More than the list holds since the last call: the newest, in order.
        send(&mut conn, 40);
        standing.publish_repeats(&conn, 10);
        assert_eq!(pns(&standing), (18..50).collect::<Vec<_>>());
        // A few more push the oldest out.
        send(&mut conn, 3);
        standing.publish_repeats(&conn, 50);
        assert_eq!(pns(&standing), (21..53).collect::<Vec<_>>());
    }

    #[test]
    fn unacknowledged_messages_are_repeated_in_away_rounds_numbered_by_powers_of_two() {
        let (rx, k, standing) = kept(Duration::from_millis(20));
        let cfg = clink_proto::reliable::Config {
            conn_id: 7,
            ..Default::default()
        };
        let mut conn = Conn::new(cfg, 0);
        conn.send(3, b"left behind").unwrap();
        let mut sent = Vec::new();
        assert!(conn.poll_transmit(0, &mut sent).is_some());
        standing.publish_repeats(&conn, 0);
        // In the away rounds numbered by powers of two (the thread may be a few rounds
        // in already): one copy at least among sixteen rounds' pings, at most five.
        let mut buf = [0u8; 256];
        let (mut copies, mut pings) = (0, 0);
        while pings < 16 {
            let n = rx.recv(&mut buf).expect("a datagram while away");
            if buf[..n] == sent[..] {
                copies += 1;
            } else if matches!(Datagram::parse(&buf[..n]), Ok(Datagram::Ping { .. })) {
                pings += 1;
            }
        }
        assert!(
            (1..=5).contains(&copies),
            "{copies} copies in {pings} rounds"
        );
        drop(k);
    }
}
