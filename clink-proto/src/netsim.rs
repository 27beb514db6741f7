//! A deterministic simulated network joining two [`Conn`]s, for tests and experiments.
//!
//! [`Pair`] moves datagrams between two connections through a link with fixed latency,
//! seeded random loss, extra delay (which reorders), duplication, corruption (one byte
//! flipped), an MTU, and optionally a bandwidth with a bounded queue (a drop-tail
//! bottleneck). Virtual time jumps to the next arrival or timer, so a simulated second of
//! traffic costs only the CPU of the protocol work. Same seed, same run.
//!
//! Pure like the rest of the crate; the runtime may reuse it for fault-injection tests.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::reliable::{Conn, Event};

/// A small, fast, seeded random generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// Faults and shape of the simulated link (the same in both directions). Times in ns.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    /// Seed of the fault generator.
    pub seed: u64,
    /// One-way propagation delay.
    pub latency: u64,
    /// Largest random extra delay per datagram (uniform); reorders datagrams.
    pub jitter: u64,
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Datagrams lost together at each loss (the same direction's next ones): a link that
    /// drops one segmentation-offload batch takes dozens of datagrams at once. 1: single
    /// losses.
    pub loss_burst: u32,
    /// Probability a datagram is delivered twice (the copy with its own delay).
    pub duplicate: f64,
    /// Probability one byte of a datagram is flipped.
    pub corrupt: f64,
    /// Datagrams longer than this are dropped.
    pub mtu: usize,
    /// Link rate in bytes per microsecond (= MB/s); 0 for unlimited.
    pub bytes_per_us: u64,
    /// Longest a datagram may wait in the link queue before it is dropped (tail drop).
    pub max_queue_delay: u64,
}

impl Default for NetConfig {
    /// A clean 1500-byte link with 50 µs latency and unlimited rate.
    fn default() -> Self {
        NetConfig {
            seed: 1,
            latency: 50_000,
            jitter: 0,
            loss: 0.0,
            loss_burst: 1,
            duplicate: 0.0,
            corrupt: 0.0,
            mtu: 1472,
            bytes_per_us: 0,
            max_queue_delay: 10_000_000,
        }
    }
}

/// What the simulated network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams offered by the two connections.
    pub offered: u64,
    /// Datagrams handed to a connection.
    pub delivered: u64,
    /// Dropped by random loss.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams with a flipped byte.
    pub corrupted: u64,
    /// Dropped for exceeding the MTU.
    pub too_big: u64,
    /// Dropped by the full link queue.
    pub queue_drops: u64,
}

struct InFlight {
    at: u64,
    seq: u64,
    to_b: bool,
    bytes: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Two connections joined by a simulated link. `a` and `b` are public: send on them and
/// take their events directly between steps.
pub struct Pair {
    /// The first endpoint.
    pub a: Conn,
    /// The second endpoint.
    pub b: Conn,
    /// Virtual time, ns.
    pub now: u64,
    /// What the network did.
    pub stats: NetStats,
    cfg: NetConfig,
    rng: Rng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    link_free: [u64; 2],
    /// Datagrams still to drop of a burst, per direction.
    burst_left: [u32; 2],
    buf: Vec<u8>,
}

impl Pair {
    /// Joins `a` and `b` (created at time 0) through a link shaped by `cfg`.
    pub fn new(a: Conn, b: Conn, cfg: NetConfig) -> Pair {
        Pair {
            a,
            b,
            now: 0,
            stats: NetStats::default(),
            rng: Rng::new(cfg.seed),
            cfg,
            queue: BinaryHeap::new(),
            seq: 0,
            link_free: [0; 2],
            burst_left: [0; 2],
            buf: Vec::with_capacity(2048),
        }
    }

    fn offer(&mut self, to_b: bool) {
        self.stats.offered += 1;
        let len = self.buf.len();
        if len > self.cfg.mtu {
            self.stats.too_big += 1;
            return;
        }
        // Serialisation on the sender's link (a bottleneck queue when a rate is set).
        let mut depart = self.now;
        if self.cfg.bytes_per_us > 0 {
            let l = &mut self.link_free[usize::from(to_b)];
            let start = (*l).max(self.now);
            if start - self.now > self.cfg.max_queue_delay {
                self.stats.queue_drops += 1;
                return;
            }
            depart = start + (len as u64 * 1000).div_ceil(self.cfg.bytes_per_us);
            *l = depart;
        }
        let burst = &mut self.burst_left[usize::from(to_b)];
        if *burst > 0 {
            *burst -= 1;
            self.stats.lost += 1;
            return;
        }
        if self.rng.chance(self.cfg.loss) {
            *burst = self.cfg.loss_burst.saturating_sub(1);
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.cfg.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut bytes = self.buf.clone();
            if self.rng.chance(self.cfg.corrupt) && !bytes.is_empty() {
                let i = self.rng.below(bytes.len() as u64) as usize;
                bytes[i] ^= 1 + self.rng.below(255) as u8;
                self.stats.corrupted += 1;
            }
            let jitter = if self.cfg.jitter > 0 {
                self.rng.below(self.cfg.jitter + 1)
            } else {
                0
            };
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at: depart + self.cfg.latency + jitter,
                seq: self.seq,
                to_b,
                bytes,
            }));
        }
    }

    /// Moves every datagram both connections want to send into the network.
    pub fn flush(&mut self) {
        loop {
            self.buf.clear();
            if self.a.poll_transmit(self.now, &mut self.buf).is_some() {
                self.offer(true);
                continue;
            }
            self.buf.clear();
            if self.b.poll_transmit(self.now, &mut self.buf).is_some() {
                self.offer(false);
                continue;
            }
            break;
        }
    }

    /// Flushes, then advances virtual time to the next arrival or timer and handles
    /// everything due then. Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.flush();
        let mut next = self.queue.peek().map(|Reverse(p)| p.at);
        for t in [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
        {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let Some(next) = next else {
            return false;
        };
        self.now = self.now.max(next);
        while self.queue.peek().is_some_and(|Reverse(p)| p.at <= self.now) {
            let Reverse(p) = self.queue.pop().expect("peeked");
            self.stats.delivered += 1;
            let c = if p.to_b { &mut self.b } else { &mut self.a };
            // Drops are counted by the connection; nothing to do here.
            let _ = c.handle_datagram(self.now, &p.bytes);
        }
        if self.a.poll_timeout().is_some_and(|t| t <= self.now) {
            self.a.handle_timeout(self.now);
        }
        if self.b.poll_timeout().is_some_and(|t| t <= self.now) {
            self.b.handle_timeout(self.now);
        }
        true
    }

    /// Steps until `done` holds or virtual time passes `deadline`; returns whether `done`
    /// held. `done` may send and take events.
    pub fn run_until(&mut self, deadline: u64, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > deadline || !self.step() {
                return done(self);
            }
        }
    }

    /// Takes every pending event of `a` and of `b`, in that order.
    pub fn drain_events(&mut self) -> (Vec<Event>, Vec<Event>) {
        let mut ea = Vec::new();
        let mut eb = Vec::new();
        while let Some(e) = self.a.poll_event() {
            ea.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            eb.push(e);
        }
        (ea, eb)
    }
}
