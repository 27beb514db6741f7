//! Bounded lock-free multi-producer/single-consumer queue of small `Copy` items: the part
//! of the per-endpoint event queue that other threads post into (CLAN-style: a producer
//! delivers an event in O(1) and the consumer dequeues it without a system call).
//!
//! The algorithm is Vyukov's bounded MPMC array queue restricted to one consumer. Every
//! slot carries a sequence number: slot `i` starts at `i`. A producer reads `tail = pos`,
//! and the slot at `pos` is free for it when `seq == pos`; it claims `pos` by a CAS on
//! `tail`, writes the value and publishes with `seq = pos + 1` (Release). The consumer, at
//! `head = pos`, finds an item when `seq == pos + 1` (Acquire), reads it and hands the slot
//! to the next lap with `seq = pos + cap` (Release). A producer that sees `seq < pos` has
//! met an item of the previous lap not yet consumed: the queue is full and the value is
//! handed back. Producers contend only on `tail`; the consumer polls the slot at its head
//! and never reads `tail`, so an empty poll costs one (usually cached) load.
//!
//! Sleep/wake (Dekker-style, no lost wake-up), for a consumer that spins and then blocks on
//! a doorbell (an eventfd, outside this module):
//! - the consumer sets `consumer_sleeping = 1` (a swap), issues a SeqCst fence, then
//!   re-checks the slot at its head ([`Consumer::arm_sleep`], then [`Consumer::pop`] or
//!   [`Consumer::is_empty`]); it blocks only if that re-check finds nothing;
//! - a producer stores the slot's sequence number (publication), issues a SeqCst fence,
//!   then loads the flag; if it is set, it clears it with a swap and [`EventRing::push`]
//!   returns `Ok(true)`: the caller must ring the doorbell.
//!
//! The two fences are totally ordered. If the consumer's fence comes first, the producer's
//! load after its own fence sees the flag; otherwise the consumer's load after its fence
//! sees the publication. So either the consumer finds the item or the producer is told to
//! wake it (the swap lets exactly one producer ring for one arming). A slot claimed but not
//! yet published blocks the consumer's view of later slots; its producer publishes it
//! after the consumer armed, so that producer sees the flag (or an earlier one cleared it
//! and rang, and the woken consumer re-arms). Spurious doorbells (a producer clears the
//! flag just as the consumer disarms) cost one extra wake-up and nothing else.
//!
//! Under `cfg(loom)` the atomics, cells and `Arc` come from loom so that the model checks
//! in `loom_tests` run this very code.

use std::fmt;
use std::mem::MaybeUninit;

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
use loom::sync::Arc;
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::Arc;

/// One value cell; under loom, a tracked cell so the checker sees data races.
struct Cell<T>(
    #[cfg(not(loom))] std::cell::UnsafeCell<MaybeUninit<T>>,
    #[cfg(loom)] loom::cell::UnsafeCell<MaybeUninit<T>>,
);

#[cfg(not(loom))]
impl<T: Copy> Cell<T> {
    fn new() -> Self {
        Cell(std::cell::UnsafeCell::new(MaybeUninit::uninit()))
    }

    /// # Safety
    /// The caller owns the slot (claimed by the CAS on `tail`, not yet published).
    unsafe fn write(&self, v: T) {
        // SAFETY: exclusive access per the caller's contract.
        unsafe { (*self.0.get()).write(v) };
    }

    /// # Safety
    /// The caller is the consumer and an Acquire load saw this slot published.
    unsafe fn read(&self) -> T {
        // SAFETY: initialised and not written concurrently, per the caller's contract.
        unsafe { (*self.0.get()).assume_init() }
    }
}

#[cfg(loom)]
impl<T: Copy> Cell<T> {
    fn new() -> Self {
        Cell(loom::cell::UnsafeCell::new(MaybeUninit::uninit()))
    }

    /// # Safety
    /// As for the non-loom version.
    unsafe fn write(&self, v: T) {
        // SAFETY: exclusive access per the caller's contract (loom checks it).
        self.0.with_mut(|p| unsafe {
            (*p).write(v);
        });
    }

    /// # Safety
    /// As for the non-loom version.
    unsafe fn read(&self) -> T {
        // SAFETY: initialised and not written concurrently (loom checks it).
        self.0.with(|p| unsafe { (*p).assume_init() })
    }
}

struct Slot<T> {
    seq: AtomicU64,
    val: Cell<T>,
}

/// Keeps a producer-written and a consumer-written counter off each other's cache line.
#[repr(align(64))]
struct Padded<V>(V);

/// A producer re-reading a tail that moved on: under loom, a yield so the model lets the
/// other threads progress.
#[inline]
fn backoff() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// The shared side as the queue's users hold it (loom's `Arc` under the model checker).
pub type SharedRing<T> = Arc<EventRing<T>>;

/// How many handles share a ring (its consumer's included).
pub fn handles<T: Copy + Send>(ring: &SharedRing<T>) -> usize {
    Arc::strong_count(ring)
}

/// Shared side of the queue: producers push through `&EventRing` (usually an `Arc`).
pub struct EventRing<T: Copy + Send> {
    /// Next position to claim (producers, CAS).
    tail: Padded<AtomicU64>,
    /// 1 while the consumer is (about to be) blocked and wants a doorbell.
    consumer_sleeping: Padded<AtomicU32>,
    mask: u64,
    slots: Box<[Slot<T>]>,
}

// SAFETY: a slot's value is accessed by one thread at a time: the producer that claimed its
// position (CAS on `tail`) until it publishes with a Release store of `seq`, then the single
// consumer (the non-Clone `Consumer`, after an Acquire load of `seq`) until it hands the slot
// back with a Release store. Values move between threads, hence `T: Send`.
unsafe impl<T: Copy + Send> Sync for EventRing<T> {}
// SAFETY: the ring owns its values (plain `Copy` data, `T: Send`) and atomics.
unsafe impl<T: Copy + Send> Send for EventRing<T> {}

impl<T: Copy + Send> EventRing<T> {
    /// A queue of `cap` slots; returns the shared side (clone the `Arc` for each producer)
    /// and the unique consumer.
    ///
    /// # Panics
    /// If `cap` is not a power of two of at least 2.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cap: usize) -> (Arc<EventRing<T>>, Consumer<T>) {
        assert!(
            cap >= 2 && cap.is_power_of_two(),
            "event queue capacity must be a power of two >= 2, got {cap}"
        );
        let slots = (0..cap as u64)
            .map(|i| Slot {
                seq: AtomicU64::new(i),
                val: Cell::new(),
            })
            .collect();
        let ring = Arc::new(EventRing {
            tail: Padded(AtomicU64::new(0)),
            consumer_sleeping: Padded(AtomicU32::new(0)),
            mask: cap as u64 - 1,
            slots,
        });
        let cons = Consumer {
            ring: ring.clone(),
            head: 0,
        };
        (ring, cons)
    }

    /// Appends `v`. Never blocks. `Ok(true)`: the consumer was going to sleep and the caller
    /// must ring its doorbell; `Ok(false)`: delivered, nothing more to do; `Err(v)`: the
    /// queue is full and `v` is handed back (the caller decides: retry, drop, overflow).
    pub fn push(&self, v: T) -> Result<bool, T> {
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        let slot = loop {
            let slot = &self.slots[(pos & self.mask) as usize];
            let seq = slot.seq.load(Ordering::Acquire);
            // Positions are 64-bit and never wrap in practice; the signed difference
            // tells free (0), previous lap still occupied (< 0), or a stale `pos` (> 0).
            let diff = seq.wrapping_sub(pos) as i64;
            if diff == 0 {
                match self.tail.0.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break slot,
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return Err(v);
            } else {
                backoff();
                pos = self.tail.0.load(Ordering::Relaxed);
            }
        };
        // SAFETY: the CAS gave us position `pos`; its slot is free (seq == pos) and nobody
        // else touches it until we publish.
        unsafe { slot.val.write(v) };
        slot.seq.store(pos + 1, Ordering::Release);
        Ok(self.wants_doorbell())
    }

    /// After a publish: true when the consumer sleeps and must be woken (clears its flag).
    /// The fence pairs with the one in [`Consumer::arm_sleep`]; the plain load keeps the
    /// flag's line shared while nobody sleeps.
    fn wants_doorbell(&self) -> bool {
        fence(Ordering::SeqCst);
        self.consumer_sleeping.0.load(Ordering::Relaxed) != 0
            && self.consumer_sleeping.0.swap(0, Ordering::AcqRel) != 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

impl<T: Copy + Send> fmt::Debug for EventRing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventRing")
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// The unique consuming side (not `Clone`: single consumer is what makes `pop` sound).
pub struct Consumer<T: Copy + Send> {
    ring: Arc<EventRing<T>>,
    /// Next position to read.
    head: u64,
}

impl<T: Copy + Send> Consumer<T> {
    /// Takes the oldest item, or `None` when the slot at the head is not published yet.
    pub fn pop(&mut self) -> Option<T> {
        let pos = self.head;
        let slot = &self.ring.slots[(pos & self.ring.mask) as usize];
        if slot.seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        // SAFETY: the Acquire load saw the publication of position `pos`; only we read it
        // and no producer writes it until we hand it back below.
        let v = unsafe { slot.val.read() };
        slot.seq
            .store(pos + self.ring.slots.len() as u64, Ordering::Release);
        self.head = pos + 1;
        Some(v)
    }

    /// Number of positions claimed by producers and not yet read (some may still be
    /// being written, so `pop` can return `None` while this is not 0). For the unit tests
    /// (not the loom ones).
    #[cfg(all(test, not(loom)))]
    pub fn len(&self) -> usize {
        let tail = self.ring.tail.0.load(Ordering::Relaxed);
        (tail.saturating_sub(self.head) as usize).min(self.ring.capacity())
    }

    /// Whether the slot at the head holds no published item (exact for this consumer at
    /// the time of the load; a claimed but unpublished item counts as absent).
    pub fn is_empty(&self) -> bool {
        let pos = self.head;
        let slot = &self.ring.slots[(pos & self.ring.mask) as usize];
        slot.seq.load(Ordering::Acquire) != pos + 1
    }

    /// Declares that the consumer is about to block; the caller must then re-check
    /// ([`Consumer::pop`] or [`Consumer::is_empty`]) and block only if that finds nothing,
    /// calling [`Consumer::disarm_sleep`] otherwise.
    pub fn arm_sleep(&mut self) {
        // A swap, not a store: as a read-modify-write it lands after any producer's clearing
        // swap in the flag's modification order, which loom's approximate model of that
        // order needs to prove the protocol (a plain store is an `xchg` on x86 anyway).
        self.ring.consumer_sleeping.0.swap(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Withdraws a sleep declaration (after a successful re-check, or once woken).
    pub fn disarm_sleep(&mut self) {
        // Load first: no write (and no line transfer) when a producer already cleared it.
        if self.ring.consumer_sleeping.0.load(Ordering::Relaxed) != 0 {
            self.ring.consumer_sleeping.0.store(0, Ordering::Relaxed);
        }
    }
}

impl<T: Copy + Send> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("head", &self.head)
            .field("ring", &self.ring)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn assert_send_sync<X: Send + Sync>() {}

    #[test]
    fn shareable_across_threads() {
        assert_send_sync::<EventRing<u64>>();
        assert_send_sync::<Arc<EventRing<[u8; 24]>>>();
        fn assert_send<X: Send>() {}
        assert_send::<Consumer<u64>>();
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn capacity_must_be_power_of_two() {
        let _ = EventRing::<u32>::new(3);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn capacity_one_rejected() {
        let _ = EventRing::<u32>::new(1);
    }

    #[test]
    fn fifo_single_thread() {
        let (q, mut c) = EventRing::<(u16, u32)>::new(8);
        assert_eq!(q.capacity(), 8);
        assert_eq!(c.len(), 0);
        assert!(c.is_empty());
        assert_eq!(c.pop(), None);
        for i in 0..5u32 {
            assert_eq!(q.push((i as u16, i * 10)), Ok(false));
        }
        assert_eq!(c.len(), 5);
        assert!(!c.is_empty());
        for i in 0..5u32 {
            assert_eq!(c.pop(), Some((i as u16, i * 10)));
        }
        assert_eq!(c.pop(), None);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn full_returns_the_value() {
        let (q, mut c) = EventRing::<u64>::new(4);
        for i in 0..4 {
            assert_eq!(q.push(i), Ok(false));
        }
        assert_eq!(q.push(99), Err(99));
        assert_eq!(c.len(), 4);
        assert_eq!(c.pop(), Some(0));
        assert_eq!(q.push(4), Ok(false));
        assert_eq!(q.push(100), Err(100));
        for i in 1..5 {
            assert_eq!(c.pop(), Some(i));
        }
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn wraps_around_many_times() {
        let (q, mut c) = EventRing::<u64>::new(4);
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        let mut refused = 0u64;
        // Fill levels 0..=6 (beyond capacity too), so every slot is hit at every lap offset
        // and the full check runs at every offset.
        for round in 0..10_000u64 {
            for _ in 0..round % 7 {
                match q.push(next_in) {
                    Ok(_) => next_in += 1,
                    Err(v) => {
                        assert_eq!(v, next_in);
                        assert_eq!(c.len(), 4);
                        refused += 1;
                    }
                }
            }
            while let Some(v) = c.pop() {
                assert_eq!(v, next_out);
                next_out += 1;
            }
        }
        let expected: u64 = (0..10_000u64).map(|r| (r % 7).min(4)).sum();
        assert_eq!(next_in, expected);
        assert_eq!(next_out, expected);
        assert_eq!(
            refused,
            (0..10_000u64)
                .map(|r| (r % 7).saturating_sub(4))
                .sum::<u64>()
        );
    }

    #[test]
    fn sleep_flag_asks_one_doorbell() {
        let (q, mut c) = EventRing::<u8>::new(4);
        assert_eq!(q.push(1), Ok(false), "nobody sleeps");
        c.arm_sleep();
        assert_eq!(q.push(2), Ok(true), "armed consumer wants a doorbell");
        assert_eq!(q.push(3), Ok(false), "flag cleared by the first push");
        c.disarm_sleep();
        c.arm_sleep();
        c.disarm_sleep();
        assert_eq!(q.push(4), Ok(false), "disarmed consumer wants none");
        assert_eq!(q.push(5), Err(5));
        c.arm_sleep();
        assert_eq!(q.push(6), Err(6), "a failed push rings nothing");
        assert_eq!(c.pop(), Some(1));
        assert_eq!(q.push(6), Ok(true));
    }

    /// Items encode (producer, sequence); each producer's items arrive once and in order.
    #[test]
    fn many_producers_one_consumer() {
        const PRODUCERS: u64 = 4;
        const PER: u64 = 100_000;
        let deadline = Instant::now() + Duration::from_secs(30);
        let (q, mut c) = EventRing::<u64>::new(64);
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for s in 0..PER {
                        let mut v = p << 32 | s;
                        while let Err(back) = q.push(v) {
                            v = back;
                            assert!(Instant::now() < deadline, "producer {p} timed out");
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let consumer = std::thread::spawn(move || {
            let mut next = [0u64; PRODUCERS as usize];
            let mut got = 0;
            let mut idle = 0u32;
            while got < PRODUCERS * PER {
                match c.pop() {
                    Some(v) => {
                        let (p, s) = ((v >> 32) as usize, v & 0xffff_ffff);
                        assert!(p < PRODUCERS as usize, "bad producer id {p}");
                        assert_eq!(s, next[p], "producer {p}: out of order or duplicate");
                        next[p] += 1;
                        got += 1;
                        idle = 0;
                    }
                    None => {
                        idle += 1;
                        if idle.is_multiple_of(1024) {
                            assert!(Instant::now() < deadline, "consumer timed out");
                        }
                        std::thread::yield_now();
                    }
                }
            }
            assert_eq!(c.pop(), None);
            assert_eq!(c.len(), 0);
            next
        });
        for t in producers {
            t.join().expect("producer");
        }
        let next = consumer.join().expect("consumer");
        assert!(next.iter().all(|&n| n == PER));
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
