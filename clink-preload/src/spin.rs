//! Whether a blocking call spins before it sleeps: spins that keep failing close the
//! process's spin for a while (`clink_proto::spin`), so that two programs sharing one CPU
//! do not each spend a whole spin per message while the other waits for the CPU.

use clink_proto::spin::SpinGate;

static GATE: SpinGate = SpinGate::new();

/// The spin time (ns) of a blocking call starting at `now`: the configured one, or none
/// while the spin gate is closed.
#[inline]
pub fn budget(now: u64) -> u64 {
    let spin = crate::config().spin_ns;
    if spin == 0 || !GATE.maybe_closed() || GATE.open(now) {
        spin
    } else {
        0
    }
}

/// A call spun and what it waited for came.
#[inline]
pub fn hit() {
    GATE.hit();
}

/// A call spun its whole spin time in vain at `now`.
pub fn miss(now: u64) {
    GATE.miss(now);
}

/// This process's calls whose spin ran out, and the times its spin closed.
pub fn counts() -> (u64, u64) {
    GATE.counts()
}
