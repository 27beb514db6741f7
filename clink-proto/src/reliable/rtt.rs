//! The connection's round-trip time: smoothed, its variation, and the path's minimum.

/// RFC 6298 round-trip estimator.
#[derive(Clone, Copy)]
pub(super) struct Rtt {
    pub(super) srtt: u64,
    pub(super) rttvar: u64,
    pub(super) has: bool,
    /// The smallest sample since `min_at` (the path's propagation delay, no queue).
    pub(super) min: u64,
    pub(super) min_at: u64,
}

/// How long a minimum RTT stands before a larger sample may replace it (a route change).
const MIN_RTT_WINDOW: u64 = 10_000_000_000;

impl Rtt {
    /// A raw sample `r` and the same without the peer's ack delay.
    pub(super) fn sample(&mut self, now: u64, raw: u64, r: u64) {
        if !self.has || raw <= self.min || now.saturating_sub(self.min_at) > MIN_RTT_WINDOW {
            self.min = raw;
            self.min_at = now;
        }
        if self.has {
            self.rttvar = (3 * self.rttvar + self.srtt.abs_diff(r)) / 4;
            self.srtt = (7 * self.srtt + r) / 8;
        } else {
            self.srtt = r;
            self.rttvar = r / 2;
            self.has = true;
        }
    }
}
