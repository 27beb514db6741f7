//! Property test of the shared-memory ring (`clink::transport::shm::ring`), driven
//! single-threaded over a heap-backed `RingMem`: random sequences of reserve/commit of
//! random lengths, peek/release, explicit head publication and wake-up flags, compared
//! with a `VecDeque` model. Checked: every record comes out exactly once, in order, with
//! its bytes and length intact; `reserve` never hands out space the consumer still holds,
//! and refuses only when the ring is really full once the consumer has published its head
//! (it publishes lazily, so a refusal before that is allowed); doorbells are requested
//! exactly when the other side asked for one, and a producer waiting for space is always
//! woken by the release or publication that follows.

use clink::transport::shm::ring::{
    cells_for, max_payload, Consumer, Flag, Producer, RingMem, Wake, CELL, REC_HDR,
};
use proptest::prelude::*;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// The ring's memory on the heap: `cap` cells of 64 bytes (8-aligned, contiguous, so a
/// record's payload may run over several cells), the consumer head and the flags.
struct Heap {
    cap: u64,
    cells: UnsafeCell<Vec<u64>>,
    head: AtomicU64,
    wake_at: AtomicU64,
    flags: [AtomicU32; 2],
}

/// Both halves share one `Heap`; single-threaded, so `Rc`.
#[derive(Clone)]
struct Mem(Rc<Heap>);

impl Mem {
    fn new(cap: u64) -> Mem {
        Mem(Rc::new(Heap {
            cap,
            cells: UnsafeCell::new(vec![0u64; cap as usize * CELL / 8]),
            head: AtomicU64::new(0),
            wake_at: AtomicU64::new(0),
            flags: Default::default(),
        }))
    }
    fn base(&self) -> *mut u8 {
        // SAFETY: the Vec is never resized; we only take its buffer pointer.
        unsafe { (*self.0.cells.get()).as_mut_ptr().cast() }
    }
    /// Pointer to byte `off` of cell `idx`, checking that `len` bytes from there stay in
    /// the ring (an out-of-bounds access by the ring code fails the test).
    fn at(&self, idx: u64, off: usize, len: usize) -> *mut u8 {
        let start = idx as usize * CELL + off;
        assert!(
            idx < self.0.cap,
            "cell index {idx} outside a ring of {}",
            self.0.cap
        );
        assert!(
            start + len <= self.0.cap as usize * CELL,
            "access of {len} bytes at cell {idx}+{off} runs past the ring"
        );
        // SAFETY: bounds checked above.
        unsafe { self.base().add(start) }
    }
    fn flag(&self, f: Flag) -> &AtomicU32 {
        &self.0.flags[match f {
            Flag::ConsumerSleeping => 0,
            Flag::ProducerWaiting => 1,
        }]
    }
    fn seq(&self, idx: u64) -> &AtomicU64 {
        // SAFETY: cells are 64-byte slots of a u64 buffer, so the first word is an aligned
        // u64 inside the allocation; AtomicU64 has the layout of u64.
        unsafe { &*(self.at(idx, 0, 8) as *const AtomicU64) }
    }
}

// SAFETY: idx < cap maps to distinct 64-byte cells of one allocation kept alive by the Rc.
unsafe impl RingMem for Mem {
    fn cap(&self) -> u64 {
        self.0.cap
    }
    fn load_seq(&self, idx: u64, o: Ordering) -> u64 {
        self.seq(idx).load(o)
    }
    fn store_seq(&self, idx: u64, v: u64, o: Ordering) {
        self.seq(idx).store(v, o)
    }
    fn load_head(&self, o: Ordering) -> u64 {
        self.0.head.load(o)
    }
    fn store_head(&self, v: u64, o: Ordering) {
        self.0.head.store(v, o)
    }
    fn load_wake_at(&self, o: Ordering) -> u64 {
        self.0.wake_at.load(o)
    }
    fn store_wake_at(&self, v: u64, o: Ordering) {
        self.0.wake_at.store(v, o)
    }
    fn load_flag(&self, f: Flag, o: Ordering) -> u32 {
        self.flag(f).load(o)
    }
    fn store_flag(&self, f: Flag, v: u32, o: Ordering) {
        self.flag(f).store(v, o)
    }
    fn swap_flag(&self, f: Flag, v: u32, o: Ordering) -> u32 {
        self.flag(f).swap(v, o)
    }
    fn fence(&self) {
        fence(Ordering::SeqCst)
    }
    unsafe fn write_hdr(&self, idx: u64, len: u32, flags: u32) {
        let p = self.at(idx, 8, 8);
        std::ptr::write(p as *mut u32, len);
        std::ptr::write(p.add(4) as *mut u32, flags);
    }
    unsafe fn read_hdr(&self, idx: u64) -> (u32, u32) {
        let p = self.at(idx, 8, 8);
        (
            std::ptr::read(p as *const u32),
            std::ptr::read(p.add(4) as *const u32),
        )
    }
    unsafe fn write(&self, idx: u64, off: usize, src: &[u8]) {
        let p = self.at(idx, REC_HDR + off, src.len());
        std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
    }
    unsafe fn read(&self, idx: u64, off: usize, dst: &mut [u8]) {
        let p = self.at(idx, REC_HDR + off, dst.len());
        std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len());
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Reserve and commit a record; the length is taken modulo the largest payload + 1.
    Push(usize, u8),
    /// Peek and release one record.
    Pop,
    /// Peek twice without releasing: the same record both times.
    Peek,
    /// The consumer publishes its head.
    Publish,
    /// The consumer declares it will sleep, woken as given / withdraws it (`None`).
    Sleep(Wake),
    /// The producer declares it waits for space for a record of this length.
    Wait(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..48, any::<u8>()).prop_map(|(l, b)| Op::Push(l, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(l, b)| Op::Push(l, b)),
        6 => Just(Op::Pop),
        1 => Just(Op::Peek),
        1 => Just(Op::Publish),
        1 => prop_oneof![Just(Wake::None), Just(Wake::Doorbell), Just(Wake::Futex)].prop_map(Op::Sleep),
        1 => any::<usize>().prop_map(Op::Wait),
    ]
}

struct Rec {
    pos: u64,
    data: Vec<u8>,
}

/// Cells of padding before a record of `n` cells produced at position `tail`.
fn pad(cap: u64, tail: u64, n: u64) -> u64 {
    let idx = tail % cap;
    if idx + n > cap {
        cap - idx
    } else {
        0
    }
}

fn run(cap: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mem = Mem::new(cap);
    let mut prod = Producer::new(mem.clone());
    let mut cons = Consumer::new(mem.clone());
    let maxp = max_payload(cap);
    let mut model: VecDeque<Rec> = VecDeque::new();
    let (mut tail, mut head) = (0u64, 0u64); // positions in cells, padding included
    let (mut sleeping, mut waiting) = (Wake::None, false);
    // The head position a waiting producer asked to be woken at.
    let mut want_head = 0u64;
    let mut serial = 0u32;
    for op in ops {
        match op {
            Op::Push(l, b) => {
                let len = l % (maxp + 1);
                let n = cells_for(len);
                let need = pad(cap, tail, n) + n;
                let fits = tail + need - head <= cap;
                let mut r = prod.reserve(len);
                if r.is_none() {
                    // Possibly only the lazily published head: publish and retry.
                    if cons.publish() {
                        prop_assert!(
                            waiting && head >= want_head,
                            "wake-up requested without a waiter"
                        );
                        waiting = false;
                    }
                    r = prod.reserve(len);
                    prop_assert_eq!(
                        r.is_some(),
                        fits,
                        "reserve({}) with the head published: tail {} head {} cap {}",
                        len,
                        tail,
                        head,
                        cap
                    );
                } else {
                    prop_assert!(fits, "reserve({len}) overwrote unconsumed cells");
                }
                let Some(r) = r else { continue };
                serial += 1;
                let data: Vec<u8> = (0..len)
                    .map(|i| b.wrapping_add((i as u32).wrapping_mul(31).wrapping_add(serial) as u8))
                    .collect();
                let idx = r.idx(cap);
                // SAFETY: the reservation owns `len` payload bytes at this record.
                unsafe { prod.mem().write(idx, 0, &data) };
                let pos = tail + pad(cap, tail, n);
                prop_assert_eq!(idx, pos % cap, "record placed where the model expects");
                let bell = prod.commit(r);
                prop_assert_eq!(
                    bell,
                    sleeping,
                    "the doorbell the consumer asked for, if any"
                );
                sleeping = Wake::None;
                tail = pos + n;
                model.push_back(Rec { pos, data });
            }
            Op::Pop | Op::Peek => {
                let got = cons.peek();
                prop_assert!(got.is_ok(), "peek error on a well-formed ring: {:?}", got);
                let got = got.unwrap();
                let Some(want) = model.front() else {
                    prop_assert_eq!(got, None, "record out of an empty ring");
                    continue;
                };
                let Some(rec) = got else {
                    return Err(TestCaseError::fail("committed record not visible"));
                };
                prop_assert_eq!(rec.idx, want.pos % cap);
                prop_assert_eq!(rec.len, want.data.len());
                let mut buf = vec![0u8; rec.len];
                // SAFETY: peek returned this record; its payload lies inside the ring.
                unsafe { cons.mem().read(rec.idx, 0, &mut buf) };
                prop_assert!(buf == want.data, "record bytes differ");
                // Peeking consumed any padding before the record.
                head = want.pos;
                if matches!(op, Op::Peek) {
                    prop_assert_eq!(cons.peek(), Ok(Some(rec)), "peek is idempotent");
                    continue;
                }
                let end = want.pos + cells_for(rec.len);
                model.pop_front();
                head = end;
                let woke = cons.release(rec);
                prop_assert!(
                    !woke || (waiting && head >= want_head),
                    "wake-up requested too early or without a waiter"
                );
                if woke {
                    waiting = false;
                } else if waiting && head >= want_head {
                    // Once its head is reached, a waiting producer is woken by this
                    // release or the publish after it.
                    prop_assert!(cons.publish(), "waiting producer not woken");
                    waiting = false;
                }
            }
            Op::Publish => {
                let woke = cons.publish();
                prop_assert!(
                    !woke || (waiting && head >= want_head),
                    "wake-up requested too early or without a waiter"
                );
                if woke {
                    waiting = false;
                }
            }
            Op::Sleep(how) => {
                if how == Wake::None {
                    cons.disarm_sleep();
                } else {
                    cons.arm_sleep(how);
                }
                sleeping = how;
            }
            Op::Wait(l) => {
                let len = l % (maxp + 1);
                let n = cells_for(len);
                let fits = tail + pad(cap, tail, n) + n - head <= cap;
                let ok = prod.arm_wait(len);
                prop_assert!(!ok || fits, "arm_wait({len}) claims space that is not free");
                waiting = !ok;
                want_head = (tail + pad(cap, tail, n) + n).saturating_sub(cap).min(tail);
            }
        }
    }
    // Everything still in the ring comes out, in order.
    while let Some(want) = model.pop_front() {
        let rec = cons.peek().ok().flatten();
        prop_assert!(rec.is_some(), "record lost");
        let rec = rec.unwrap();
        let mut buf = vec![0u8; rec.len];
        // SAFETY: as above.
        unsafe { cons.mem().read(rec.idx, 0, &mut buf) };
        prop_assert!(buf == want.data);
        let _ = cons.release(rec);
    }
    prop_assert_eq!(cons.peek(), Ok(None));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn ring_matches_model(
        cap in prop::sample::select(vec![2u64, 4, 8, 16, 64]),
        ops in prop::collection::vec(op(), 1..400),
    ) {
        run(cap, ops)?;
    }
}

#[test]
fn fills_to_capacity_and_wraps() {
    // Deterministic companion: fill with 1-cell records, drain, repeat past the wrap.
    let cap = 16;
    let mem = Mem::new(cap);
    let mut prod = Producer::new(mem.clone());
    let mut cons = Consumer::new(mem);
    for round in 0..5u8 {
        let mut n = 0u8;
        while let Some(r) = prod.reserve(CELL - REC_HDR) {
            let idx = r.idx(cap);
            // SAFETY: the reservation owns these bytes.
            unsafe { prod.mem().write(idx, 0, &[round ^ n; CELL - REC_HDR]) };
            let _ = prod.commit(r);
            n += 1;
        }
        assert!(n as u64 <= cap);
        if round == 0 {
            assert_eq!(n as u64, cap, "an empty ring takes cap one-cell records");
        }
        for i in 0..n {
            let rec = cons.peek().unwrap().expect("record");
            let mut b = [0u8; CELL - REC_HDR];
            // SAFETY: peek returned it.
            unsafe { cons.mem().read(rec.idx, 0, &mut b) };
            assert_eq!(b, [round ^ i; CELL - REC_HDR]);
            let _ = cons.release(rec);
        }
        assert_eq!(cons.peek().unwrap(), None);
        let _ = cons.publish();
    }
}

#[test]
fn a_sleep_flag_value_the_ring_never_writes_asks_for_the_doorbell() {
    // A hostile or broken peer may leave anything in the flag: every value but the futex's
    // gets the doorbell, which wakes any kind of sleep.
    for (v, want) in [
        (0, Wake::None),
        (1, Wake::Doorbell),
        (2, Wake::Futex),
        (3, Wake::Doorbell),
        (u32::MAX, Wake::Doorbell),
    ] {
        let mem = Mem::new(4);
        let mut prod = Producer::new(mem.clone());
        mem.store_flag(Flag::ConsumerSleeping, v, Ordering::SeqCst);
        let r = prod.reserve(8).expect("space in an empty ring");
        assert_eq!(prod.commit(r), want, "flag value {v}");
        assert_eq!(
            mem.load_flag(Flag::ConsumerSleeping, Ordering::SeqCst),
            0,
            "the flag is taken"
        );
    }
}
