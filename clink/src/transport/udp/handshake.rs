//! Connection set-up over UDP, three-way: the connector's hello (repeated every 100 ms
//! until welcomed), the acceptor's welcome, and the connector's first datagram after it
//! (a ping), which alone makes the acceptor offer the connection to its application. A
//! connector that gives up (its connect timed out, or it fell back to TCP) so leaves no
//! peer behind; datagrams that come before the endpoint adopts a connection are kept for
//! it. A peer that advertises several addresses is sent hellos at the one chosen first
//! (`netdev::pick`), then, once [`ALTERNATES_AFTER`] hellos went unanswered, at the others
//! too: the first address to answer for the right endpoint carries the connection, and
//! the acceptor drops the others' half-made links when no datagram follows.

use super::*;

/// How often a hello is repeated while connecting.
const HELLO_EVERY: Duration = Duration::from_millis(100);
/// Hellos at a peer's chosen address before its other addresses are tried too (about
/// 300 ms: a few lost hellos on a path that works should not open a second one).
const ALTERNATES_AFTER: u32 = 3;

/// An incoming connection welcomed but not yet taken up: its connector has sent nothing
/// since the hello. It is offered to the application only once a datagram of its own
/// arrives (the connector's first one is a ping), so a connector that gave up on it (it
/// fell back to TCP, or the welcome never reached it) leaves no peer behind.
pub(super) struct HalfOpen {
    link: UdpLink,
    /// When its last hello came.
    hello_at: Instant,
}

/// How long a welcomed connection waits for its connector's first datagram (hellos that
/// keep coming restart the wait).
const HALF_OPEN_FOR: Duration = Duration::from_secs(10);
/// Welcomed connections kept waiting at most.
const HALF_OPEN_MAX: usize = 1024;
/// Datagrams of connections not yet adopted by the endpoint kept for it (beyond them, a
/// connection's reliability resends what it needs).
const EARLY_MAX: usize = 256;

/// An outgoing connection waiting for its welcome.
pub(super) struct Pending {
    /// The address hellos go to (once welcomed, the one that answered).
    dest: SocketAddr,
    /// The peer's other addresses, tried too after [`ALTERNATES_AFTER`] hellos.
    alternates: Vec<SocketAddr>,
    /// Hellos sent so far.
    hellos: u32,
    conn: u32,
    remote_id: u128,
    last_hello: Instant,
    /// The peer's welcome, once it came.
    welcomed: Option<Handshake>,
}

impl State {
    /// This endpoint's handshake towards the endpoint `to` at `dest`.
    pub(super) fn handshake(&self, to: u128, dest: SocketAddr) -> Handshake {
        Handshake {
            from: self.my_id,
            to,
            mtu_payload: self.payload_towards(dest) as u32,
            payload_hash: self.cfg.payload_hash,
            two_paths: self.two_paths(),
            crossed: false,
        }
    }

    /// Queues a hello or welcome for `dest` (sent with the next flush).
    fn send_handshake(&mut self, dest: SocketAddr, d: Datagram) {
        self.batch.push(dest, |buf| d.encode(buf));
    }

    /// A welcome from `src` for the outgoing connection `conn`: the first from the
    /// endpoint it was meant for, from any of the addresses its hellos went to, makes that
    /// address the connection's.
    pub(super) fn on_welcome(&mut self, src: SocketAddr, conn: u32, hs: Handshake) {
        if let Some(p) = self.pending.iter_mut().find(|p| {
            p.conn == conn
                && p.welcomed.is_none()
                && hs.from == p.remote_id
                && (p.dest == src || p.alternates.contains(&src))
        }) {
            p.dest = src;
            p.welcomed = Some(hs);
        }
    }

    /// A datagram for no route: the first of a welcomed connection (which it takes up), a
    /// later one of a connection the endpoint has not adopted yet (both kept for the
    /// next receive), or a stray.
    pub(super) fn take_up(&mut self, src: SocketAddr, d: &[u8]) {
        let Some(conn) = peek_conn(d) else {
            self.stats.stray += 1;
            return;
        };
        let ours = |l: &UdpLink| l.route_key() == (src, conn);
        if let Some(i) = self.half_open.iter().position(|h| ours(&h.link)) {
            let h = self.half_open.swap_remove(i);
            self.accepted.push(h.link);
        } else if !self.accepted.iter().any(ours) {
            self.stats.stray += 1;
            return;
        }
        if self.early.len() < EARLY_MAX {
            self.early.push((src, d.to_vec()));
        }
    }

    pub(super) fn on_hello(&mut self, src: SocketAddr, conn: u32, hs: Handshake) {
        // A repeated hello (our welcome was lost) is answered again; a new one makes a link.
        // A repeat is answered as the first was (whether it crossed a connect of ours).
        let ours = |l: &UdpLink| l.route_key() == (src, conn);
        let waiting = self.half_open.iter_mut().find(|h| ours(&h.link));
        let known = if let Some(h) = waiting {
            h.hello_at = Instant::now();
            Some(h.link.crossed)
        } else if let Some(l) = self.accepted.iter().find(|l| ours(l)) {
            Some(l.crossed)
        } else if self.routes.get((src, conn)).is_some() {
            // Taken up already: its connector had the welcome.
            Some(false)
        } else {
            None
        };
        let crossed = known.unwrap_or(self.connecting == Some(hs.from));
        if known.is_none() {
            if self.half_open.len() >= HALF_OPEN_MAX {
                // A flood of hellos (forged sources, say): the oldest waits longest.
                self.half_open.remove(0);
                self.stats.abandoned_handshakes += 1;
            }
            let c = Conn::new(self.conn_config(conn, src, &hs), self.now());
            self.half_open.push(HalfOpen {
                link: UdpLink::new(c, src, hs.from, crossed),
                hello_at: Instant::now(),
            });
        }
        let hs = Handshake {
            crossed,
            ..self.handshake(hs.from, src)
        };
        self.send_handshake(src, Datagram::Welcome { conn, hs });
        self.welcomes_due = true;
    }
}

impl UdpTransport {
    /// Tells the transport which endpoint a connect under way (over any transport) is
    /// for: a hello from that one crossed it, and the welcome says so.
    pub fn set_connecting(&mut self, id: Option<u128>) {
        self.st.connecting = id;
    }

    /// True while a connection from the endpoint `id` waits to be taken up (welcomed;
    /// its connector's first datagram has not come) or adopted.
    pub fn being_connected_by(&self, id: u128) -> bool {
        (self.st.half_open.iter().map(|h| &h.link))
            .chain(&self.st.accepted)
            .any(|l| l.remote_id == id)
    }

    /// Starts connecting to the endpoint `remote_id` at `dest` (and, if it does not answer
    /// there, at `alternates`, its other addresses); returns a token for
    /// [`UdpTransport::connected`].
    pub fn start_connect(
        &mut self,
        dest: SocketAddr,
        alternates: Vec<SocketAddr>,
        remote_id: u128,
    ) -> Result<u32> {
        let conn = loop {
            let c = (crate::sys::random_u128().map_err(io_err("random connection id"))? as u32) | 1;
            if self.st.routes.get((dest, c)).is_none()
                && self.st.pending.iter().all(|p| p.conn != c)
            {
                break c;
            }
        };
        self.st.pending.push(Pending {
            dest,
            alternates,
            hellos: 0,
            conn,
            remote_id,
            last_hello: Instant::now(),
            welcomed: None,
        });
        self.hello_now(conn);
        Ok(conn)
    }

    /// The link of a connection started with [`UdpTransport::start_connect`] once its
    /// welcome arrived (repeats the hello meanwhile); `None` while waiting.
    pub fn connected(&mut self, token: u32) -> Option<UdpLink> {
        let i = self.st.pending.iter().position(|p| p.conn == token)?;
        let p = &mut self.st.pending[i];
        if let Some(hs) = p.welcomed {
            let p = self.st.pending.swap_remove(i);
            let mut conn = Conn::new(self.st.conn_config(p.conn, p.dest, &hs), self.now());
            // Takes the connection up at the acceptor (which offers it to its application
            // only then).
            conn.ping_now();
            return Some(UdpLink::new(conn, p.dest, p.remote_id, hs.crossed));
        }
        if p.last_hello.elapsed() >= HELLO_EVERY {
            self.hello_now(token);
        }
        None
    }

    /// Sends the hello of the connection `token` (being set up) now; its repeats count
    /// from here.
    pub fn hello_now(&mut self, token: u32) {
        let Some(p) = self.st.pending.iter_mut().find(|p| p.conn == token) else {
            return;
        };
        p.last_hello = Instant::now();
        p.hellos += 1;
        let (dest, conn, to) = (p.dest, p.conn, p.remote_id);
        let others = if p.hellos > ALTERNATES_AFTER {
            p.alternates.clone()
        } else {
            Vec::new()
        };
        for d in std::iter::once(dest).chain(others) {
            let hs = self.st.handshake(to, d);
            self.st.send_handshake(d, Datagram::Hello { conn, hs });
        }
        self.flush();
    }

    /// Gives up a connection attempt.
    pub fn abandon(&mut self, token: u32) {
        self.st.pending.retain(|p| p.conn != token);
    }

    /// How long a connect waits for a UDP welcome before falling back to TCP
    /// ([`UdpConfig::fallback`]).
    pub fn fallback_after(&self) -> Option<Duration> {
        self.st.cfg.fallback
    }

    /// Links of peers that connected to us since the last call and took the connection
    /// up (sent a datagram after the welcome). Drops welcomed connections whose connector
    /// stayed silent for 10 s.
    pub fn take_accepted(&mut self) -> Vec<UdpLink> {
        if !self.st.half_open.is_empty() {
            let (before, now) = (self.st.half_open.len(), Instant::now());
            self.st
                .half_open
                .retain(|h| now.duration_since(h.hello_at) < HALF_OPEN_FOR);
            self.st.stats.abandoned_handshakes += (before - self.st.half_open.len()) as u64;
        }
        std::mem::take(&mut self.st.accepted)
    }
}
