//! Fault injection on the receive side of the UDP transport: the kernel here has no netem,
//! so loss, duplication, corruption, reordering and delay are made in user space, seeded,
//! from `CLINK_FAULTS` (see [`FaultConfig::parse`]). Applied to every datagram read from
//! the socket, before the protocol sees it, so every fault exercises the real recovery path.

use clink_proto::netsim::Rng;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// What to inject. Probabilities are per datagram.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Seed of the generator (same seed, same faults for the same arrivals).
    pub seed: u64,
    /// Probability a datagram is dropped.
    pub drop: f64,
    /// Probability a datagram is delivered twice.
    pub dup: f64,
    /// Probability one byte of a datagram is flipped.
    pub corrupt: f64,
    /// Probability a datagram is held back for `delay_us` (it arrives after later ones).
    pub reorder: f64,
    /// How long a held-back datagram waits, microseconds.
    pub delay_us: u64,
}

impl FaultConfig {
    /// Parses `drop=0.01,dup=0.001,corrupt=0.001,reorder=0.01,delay_us=200,seed=7` (any
    /// subset, any order). Probabilities must lie in `0..=1`.
    pub fn parse(s: &str) -> Result<FaultConfig, String> {
        let mut c = FaultConfig {
            seed: 1,
            delay_us: 200,
            ..FaultConfig::default()
        };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected key=value"))?;
            let prob = |v: &str| -> Result<f64, String> {
                let p: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{k}={v:?}: not a number"))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(format!("{k}={v:?}: a probability must be between 0 and 1"));
                }
                Ok(p)
            };
            let int = |v: &str| -> Result<u64, String> {
                v.trim()
                    .parse()
                    .map_err(|_| format!("{k}={v:?}: not a non-negative integer"))
            };
            match k.trim() {
                "drop" => c.drop = prob(v)?,
                "dup" => c.dup = prob(v)?,
                "corrupt" => c.corrupt = prob(v)?,
                "reorder" => c.reorder = prob(v)?,
                "delay_us" => c.delay_us = int(v)?.min(10_000_000),
                "seed" => c.seed = int(v)?,
                other => {
                    return Err(format!(
                    "unknown fault {other:?} (known: drop, dup, corrupt, reorder, delay_us, seed)"
                ))
                }
            }
        }
        Ok(c)
    }

    /// True when any fault is enabled.
    pub fn active(&self) -> bool {
        self.drop > 0.0 || self.dup > 0.0 || self.corrupt > 0.0 || self.reorder > 0.0
    }
}

/// Counters of injected faults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Datagrams dropped.
    pub dropped: u64,
    /// Datagrams delivered twice.
    pub duplicated: u64,
    /// Datagrams with a flipped byte.
    pub corrupted: u64,
    /// Datagrams held back (reordered).
    pub delayed: u64,
}

/// What the injector decided for one datagram (and its duplicate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fate {
    drop: bool,
    dup: bool,
    corrupt: [bool; 2],
    hold: [bool; 2],
}

impl Fate {
    /// Delivered once, now, intact.
    pub fn is_clean(&self) -> bool {
        !self.drop && !self.dup && !self.corrupt[0] && !self.hold[0]
    }
}

/// The injector: decides per datagram, holds back delayed ones.
pub struct Faults {
    cfg: FaultConfig,
    rng: Rng,
    held: VecDeque<(u64, SocketAddr, Vec<u8>)>,
    /// Counters.
    pub stats: FaultStats,
}

impl Faults {
    /// An injector for `cfg`.
    pub fn new(cfg: FaultConfig) -> Faults {
        Faults {
            rng: Rng::new(cfg.seed),
            cfg,
            held: VecDeque::new(),
            stats: FaultStats::default(),
        }
    }

    /// Draws what happens to the next arrived datagram (apply it with
    /// [`Faults::apply_fate`]). A transport checks [`Fate::is_clean`] to keep a datagram
    /// it received in place (speculatively) where it is.
    pub fn fate(&mut self) -> Fate {
        if self.rng.chance(self.cfg.drop) {
            return Fate {
                drop: true,
                ..Fate::default()
            };
        }
        let dup = self.rng.chance(self.cfg.dup);
        let mut f = Fate {
            dup,
            ..Fate::default()
        };
        for k in 0..if dup { 2 } else { 1 } {
            f.corrupt[k] = self.rng.chance(self.cfg.corrupt);
            f.hold[k] = self.rng.chance(self.cfg.reorder);
        }
        f
    }

    /// Passes one arrived datagram through the faults at time `now` (ns); what survives
    /// goes to `deliver` (now, twice, damaged, or later through [`Faults::release`]).
    pub fn apply(
        &mut self,
        now: u64,
        src: SocketAddr,
        d: &[u8],
        deliver: &mut impl FnMut(SocketAddr, &[u8]),
    ) {
        let fate = self.fate();
        self.apply_fate(fate, now, src, d, deliver);
    }

    /// Applies a fate drawn by [`Faults::fate`] to datagram `d`.
    pub fn apply_fate(
        &mut self,
        fate: Fate,
        now: u64,
        src: SocketAddr,
        d: &[u8],
        deliver: &mut impl FnMut(SocketAddr, &[u8]),
    ) {
        if fate.drop {
            self.stats.dropped += 1;
            return;
        }
        if fate.dup {
            self.stats.duplicated += 1;
        }
        for k in 0..if fate.dup { 2 } else { 1 } {
            let corrupt = fate.corrupt[k] && !d.is_empty();
            let hold = fate.hold[k];
            if !corrupt && !hold {
                deliver(src, d);
                continue;
            }
            let mut v = d.to_vec();
            if corrupt {
                self.stats.corrupted += 1;
                // Damage stands for what slips past the kernel's UDP checksum, so it hits
                // bytes clink's own checksum covers (not an unhashed bulk payload, which
                // only the UDP checksum does).
                let span = clink_proto::reliable::packet::checked_len(&v);
                let at = self.rng.below(span as u64) as usize;
                v[at] ^= 1 + self.rng.below(255) as u8;
            }
            if hold {
                self.stats.delayed += 1;
                self.held
                    .push_back((now + self.cfg.delay_us * 1000, src, v));
            } else {
                deliver(src, &v);
            }
        }
    }

    /// Delivers the held-back datagrams due at `now`.
    pub fn release(&mut self, now: u64, deliver: &mut impl FnMut(SocketAddr, &[u8])) {
        while self.held.front().is_some_and(|h| h.0 <= now) {
            let (_, src, v) = self.held.pop_front().expect("front exists");
            deliver(src, &v);
        }
    }

    /// When the next held-back datagram is due.
    pub fn next_release(&self) -> Option<u64> {
        self.held.front().map(|h| h.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_errors() {
        let c = FaultConfig::parse("drop=0.05, dup=0.01,seed=9,delay_us=50").unwrap();
        assert_eq!((c.drop, c.dup, c.seed, c.delay_us), (0.05, 0.01, 9, 50));
        assert!(c.active());
        assert!(!FaultConfig::parse("").unwrap().active());
        for bad in ["drop", "drop=2", "drop=x", "lose=0.1", "seed=-1"] {
            assert!(FaultConfig::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn faults_are_counted_and_seeded() {
        let run = || {
            let mut f = Faults::new(
                FaultConfig::parse("drop=0.1,dup=0.1,corrupt=0.1,reorder=0.1,delay_us=1").unwrap(),
            );
            let src = SocketAddr::new([127, 0, 0, 1].into(), 1);
            let mut got = Vec::new();
            for i in 0..1000u32 {
                f.apply(u64::from(i) * 1000, src, &i.to_le_bytes(), &mut |_, d| {
                    got.push(d.to_vec())
                });
                f.release(u64::from(i) * 1000, &mut |_, d| got.push(d.to_vec()));
            }
            f.release(u64::MAX, &mut |_, d| got.push(d.to_vec()));
            (got, f.stats)
        };
        let (a, sa) = run();
        let (b, sb) = run();
        assert_eq!(a, b);
        assert_eq!(sa, sb);
        assert!(sa.dropped > 50 && sa.duplicated > 50 && sa.corrupted > 50 && sa.delayed > 50);
        assert_eq!(a.len() as u64, 1000 - sa.dropped + sa.duplicated);
    }

    proptest! {
        #[test]
        fn parse_is_total(s in ".{0,80}") { let _ = FaultConfig::parse(&s); }
    }
}
