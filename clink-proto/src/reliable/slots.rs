//! The receive window's out-of-order slots: a ring indexed by packet number, holding what
//! arrived beyond a hole. It starts small and doubles as packets arrive further ahead,
//! up to the window: a connection's receive state is sized by the holes it has seen, not
//! by its window (which, at 32 MiB of 1 448-byte packets, made every connection allocate
//! and clear 23 170 slots whether it ever saw a hole or not: about 2.3 MiB a connection,
//! BENCHMARKS.md). A power-of-two length makes the index a mask, not a division. A grown
//! ring goes back to its first length once the stream has run without a hole for a while
//! ([`Slots::settle`]), so one burst of loss does not hold a window's worth of slots for
//! the connection's life.

/// Slots to begin with.
const INITIAL: usize = 64;

/// A grown ring shrinks once this many times its length in packets arrived in order since
/// it last held one: a stream with holes now and then keeps its ring rather than
/// reallocating it at every hole.
const QUIET_ROUNDS: u64 = 4;

/// The ring: slot `pn & mask` holds packet `pn`, for every `pn` from the lowest packet
/// still awaited (the `floor` of each call) up to `floor + len`.
pub(super) struct Slots<T> {
    ring: Vec<Option<T>>,
    mask: u64,
    /// The longest the ring may grow: the window, rounded up to a power of two.
    max: usize,
    /// The highest packet ever held.
    last_put: u64,
}

impl<T> Slots<T> {
    /// An empty ring for a window of `window` packets.
    pub(super) fn new(window: u64) -> Slots<T> {
        let max = (window.max(1) as usize).next_power_of_two();
        let len = INITIAL.min(max);
        Slots {
            ring: (0..len).map(|_| None).collect(),
            mask: len as u64 - 1,
            max,
            last_put: 0,
        }
    }

    /// Whether packet `pn` is held (`floor`: the lowest packet awaited, at most `pn`).
    pub(super) fn has(&self, pn: u64, floor: u64) -> bool {
        pn.wrapping_sub(floor) <= self.mask && self.ring[(pn & self.mask) as usize].is_some()
    }

    /// Holds `v` as packet `pn` (`floor` as for [`Slots::has`]; `pn` inside the window
    /// above it), growing the ring to reach it.
    pub(super) fn put(&mut self, pn: u64, floor: u64, v: T) {
        let ahead = pn - floor;
        if ahead > self.mask {
            self.grow(ahead, floor);
        }
        self.ring[(pn & self.mask) as usize] = Some(v);
        self.last_put = self.last_put.max(pn);
    }

    /// Called with nothing held (every packet below `floor` delivered, none above it
    /// yet): a grown ring that has held nothing for [`QUIET_ROUNDS`] times its length
    /// goes back to its first length.
    #[inline]
    pub(super) fn settle(&mut self, floor: u64) {
        let len = self.ring.len();
        if len > INITIAL && floor.saturating_sub(self.last_put) > QUIET_ROUNDS * len as u64 {
            debug_assert!(
                self.ring.iter().all(Option::is_none),
                "settled while holding"
            );
            let first = INITIAL.min(self.max);
            self.ring = (0..first).map(|_| None).collect();
            self.mask = first as u64 - 1;
        }
    }

    /// Takes packet `pn` (the lowest awaited: its slot is inside the ring) out.
    pub(super) fn take(&mut self, pn: u64) -> Option<T> {
        self.ring[(pn & self.mask) as usize].take()
    }

    /// Doubles the ring until packet `floor + ahead` fits, each held packet moved to its
    /// slot in the longer ring.
    fn grow(&mut self, ahead: u64, floor: u64) {
        let len = ((ahead + 1) as usize).next_power_of_two().min(self.max);
        assert!(ahead < len as u64, "packet beyond the window");
        let old_mask = self.mask;
        let old = std::mem::replace(&mut self.ring, (0..len).map(|_| None).collect());
        self.mask = len as u64 - 1;
        for (i, v) in old.into_iter().enumerate() {
            if let Some(v) = v {
                // The one packet of [floor, floor + old length) that slot `i` held.
                let pn = floor + ((i as u64).wrapping_sub(floor) & old_mask);
                self.ring[(pn & self.mask) as usize] = Some(v);
            }
        }
    }

    /// Slots allocated now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ring.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_as_far_as_packets_arrive_and_keeps_each_where_it_is_found() {
        let mut s = Slots::new(23_170);
        assert_eq!(s.len(), INITIAL);
        // Awaiting 1_000_003 (a floor that is no multiple of any length).
        let floor = 1_000_003;
        for pn in [
            floor + 5,
            floor + 63,
            floor + 64,
            floor + 1000,
            floor + 20_000,
        ] {
            s.put(pn, floor, pn);
        }
        assert_eq!(s.len(), 32_768);
        for pn in floor..floor + 23_170 {
            let held = [5, 63, 64, 1000, 20_000].contains(&(pn - floor));
            assert_eq!(s.has(pn, floor), held, "{pn}");
        }
        // Beyond the ring: not held, whatever its slot holds.
        assert!(!s.has(floor + 32_768 + 5, floor));
        assert_eq!(s.take(floor + 5), Some(floor + 5));
        assert!(!s.has(floor + 5, floor));
    }

    #[test]
    fn a_grown_ring_shrinks_after_a_quiet_stretch_and_grows_again() {
        let mut s = Slots::new(1 << 20);
        s.put(1000, 10, 1000);
        assert_eq!(s.len(), 1024);
        assert_eq!(s.take(1000), Some(1000));
        // Not yet quiet for long enough (4 x 1024 packets past the last one held).
        s.settle(1000 + 4 * 1024);
        assert_eq!(s.len(), 1024);
        s.settle(1001 + 4 * 1024);
        assert_eq!(s.len(), INITIAL);
        // The shrunk ring serves as a new one: near packets fit, far ones grow it.
        let floor = 10_000;
        s.put(floor + 3, floor, floor + 3);
        assert_eq!(s.len(), INITIAL);
        s.put(floor + 300, floor, floor + 300);
        assert_eq!(s.len(), 512);
        assert!(s.has(floor + 3, floor) && s.has(floor + 300, floor));
        assert!(!s.has(floor + 4, floor));
        // A ring at its first length stays so.
        let mut small = Slots::<u64>::new(1 << 20);
        small.settle(1 << 40);
        assert_eq!(small.len(), INITIAL);
    }

    #[test]
    fn a_ring_never_outgrows_its_window() {
        let mut s = Slots::new(100);
        s.put(99, 0, ());
        assert_eq!(s.len(), 128);
        let mut one = Slots::new(1);
        one.put(7, 7, ());
        assert!(one.has(7, 7) && one.len() == 1);
    }

    #[test]
    fn growing_with_the_floor_advanced_keeps_every_held_packet() {
        // Packets held around the old ring's wrap, the floor moved past some slots.
        let mut s = Slots::new(1 << 20);
        let floor = 130;
        for pn in (floor + 1..floor + 64).step_by(3) {
            s.put(pn, floor, pn);
        }
        s.put(floor + 500, floor, floor + 500);
        for pn in floor..floor + 600 {
            let held =
                (pn > floor && pn < floor + 64 && (pn - floor - 1) % 3 == 0) || pn == floor + 500;
            assert_eq!(s.has(pn, floor), held, "{pn}");
            if held {
                assert_eq!(s.take(pn), Some(pn));
            }
        }
    }
}
