//! Whether a wait should spin before it sleeps.
//!
//! Spinning saves the wake-up (tens of microseconds on a VM) when what a wait awaits
//! arrives within the spin time. It is wasted CPU when it does not, and worse when the
//! thread producing it shares this thread's CPU: the scheduler lets a spinning thread
//! run on rather than switch to the one it has just woken, so the producer runs only
//! after the spin has run out, and every hop then costs a whole spin (BENCHMARKS.md,
//! "Two processes on one CPU"). Nothing cheap tells a thread who else runs on its CPU,
//! but the symptom is plain: its spins stop succeeding. [`SpinGate`] keeps count: after
//! [`SpinGate::MISSES`] waits in a row that spun their whole time in vain, waits sleep at
//! once for [`SpinGate::HOLD_NS`]; then one wait spins again: if it fails, the gate closes
//! for another hold; if it succeeds, the count starts again from zero.
//!
//! Time is passed in (nanoseconds on any monotonic clock).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Counts the waits whose spin failed and closes the spin for a while after several.
/// Shared by threads through relaxed atomics (a lost update costs one spin more or
/// less); one per endpoint, or one per process in the sockets layer.
#[derive(Debug, Default)]
pub struct SpinGate {
    /// Waits in a row whose spin ran out (reset by one that succeeded).
    misses: AtomicU32,
    /// While nonzero: waits sleep at once until this time.
    closed_until: AtomicU64,
    /// Misses in all, and times the gate closed (for statistics).
    failed: AtomicU64,
    closures: AtomicU64,
}

impl SpinGate {
    /// Waits in a row whose spins ran out before the gate closes.
    pub const MISSES: u32 = 4;
    /// How long the gate stays closed (ns): long enough that the spin a reopened gate
    /// tries costs a small share of the time (one spin in 20 ms), short enough that a
    /// phase where spinning pays again finds it soon.
    pub const HOLD_NS: u64 = 20_000_000;

    /// An open gate.
    pub const fn new() -> SpinGate {
        SpinGate {
            misses: AtomicU32::new(0),
            closed_until: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            closures: AtomicU64::new(0),
        }
    }

    /// Whether the gate may be closed: when false, [`SpinGate::open`] is true whatever
    /// the time (callers skip reading the clock).
    #[inline]
    pub fn maybe_closed(&self) -> bool {
        self.closed_until.load(Relaxed) != 0
    }

    /// Whether a wait starting at `now` may spin.
    pub fn open(&self, now: u64) -> bool {
        match self.closed_until.load(Relaxed) {
            0 => true,
            t if now < t => false,
            _ => {
                self.closed_until.store(0, Relaxed);
                true
            }
        }
    }

    /// A wait spun and what it waited for came.
    #[inline]
    pub fn hit(&self) {
        if self.misses.load(Relaxed) != 0 {
            self.misses.store(0, Relaxed);
        }
    }

    /// A wait spun its whole time in vain at `now`. True when that closes the gate.
    pub fn miss(&self, now: u64) -> bool {
        self.failed.fetch_add(1, Relaxed);
        let n = self.misses.fetch_add(1, Relaxed).saturating_add(1);
        if n >= Self::MISSES {
            self.closures.fetch_add(1, Relaxed);
            // (Never 0, which means open.)
            self.closed_until
                .store(now.saturating_add(Self::HOLD_NS).max(1), Relaxed);
            // (Saturates rather than wraps: a gate that keeps failing stays counted.)
            self.misses.store(Self::MISSES, Relaxed);
            return true;
        }
        false
    }

    /// Misses so far, and the times the gate closed.
    pub fn counts(&self) -> (u64, u64) {
        (self.failed.load(Relaxed), self.closures.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn spins_that_keep_failing_close_the_gate_for_a_hold() {
        let g = SpinGate::new();
        for k in 0..SpinGate::MISSES - 1 {
            g.miss(k as u64);
            assert!(!g.maybe_closed() && g.open(k as u64));
        }
        g.miss(10);
        assert!(g.maybe_closed());
        assert_eq!(g.counts(), (u64::from(SpinGate::MISSES), 1));
        assert!(!g.open(10));
        assert!(!g.open(10 + SpinGate::HOLD_NS - 1));
        assert!(g.open(10 + SpinGate::HOLD_NS));
        assert!(!g.maybe_closed());
    }

    #[test]
    fn a_hit_resets_the_count() {
        let g = SpinGate::new();
        for round in 0..10u64 {
            for _ in 0..SpinGate::MISSES - 1 {
                g.miss(round * MS);
            }
            g.hit();
        }
        assert!(!g.maybe_closed());
    }

    #[test]
    fn a_reopened_gate_closes_again_at_the_next_miss_and_stays_open_after_a_hit() {
        let g = SpinGate::new();
        for _ in 0..SpinGate::MISSES {
            g.miss(0);
        }
        let t = SpinGate::HOLD_NS;
        assert!(g.open(t));
        // The trial spin failed: closed again at once.
        g.miss(t);
        assert!(!g.open(t + 1));
        assert!(g.open(2 * t));
        // The next trial succeeded: open, and it takes the full count to close again.
        g.hit();
        for k in 0..SpinGate::MISSES - 1 {
            g.miss(2 * t + k as u64);
            assert!(g.open(2 * t + k as u64));
        }
    }
}
