//! Single-producer/single-consumer ring of 64-byte cells, the heart of the shared-memory
//! path.
//!
//! A record (one frame) occupies `ceil((16 + len) / 64)` consecutive cells; its payload is
//! contiguous, so a receiver can read it in place. The first 8 bytes of every cell slot
//! hold a sequence word: `p + 1` means "a record starts at absolute cell
//! position `p`". The producer writes the payload and header, then publishes by storing
//! the sequence word with Release; the consumer polls only the sequence word of the cell at
//! its head (Acquire), so a small message costs one cache-line transfer and neither side
//! polls a shared head/tail index. A value below `head + 1` is a record of an earlier lap
//! (or zero): nothing new yet. The consumer zeroes the sequence slots of the continuation
//! cells it releases (their bytes were payload) and publishes its head lazily (every 1/8 of
//! the ring, or when it runs dry); the producer re-reads that head only when its cached
//! copy says the ring is full.
//!
//! A sequence value above `head + 1` is a corrupt ring (a word "from the future") and
//! yields [`RingError`]; lengths are checked against the ring bounds before any byte is
//! touched.
//!
//! Sleep/wake (Dekker-style, no lost wake-up): a consumer about to block sets
//! `cons_sleeping`, issues a SeqCst fence, and re-polls; a producer, after publishing,
//! fences and rings the consumer's doorbell only if the flag was set; the flag's value
//! says which doorbell ([`Wake`]). The same protocol in
//! the other direction (`prod_waiting`) wakes a producer blocked on a full ring.
//!
//! The memory is reached through the [`RingMem`] trait so that the same code runs on real
//! shared memory and, under `cfg(loom)`, on a model-checked stand-in.

use std::sync::atomic::Ordering;

/// Bytes per cell: one cache line.
pub const CELL: usize = 64;
/// Record header bytes inside the first cell: seq (8), len (4), flags (4).
pub const REC_HDR: usize = 16;
const F_PAD: u32 = 1;

/// Which wake-up flag of a ring.
#[derive(Clone, Copy, Debug)]
pub enum Flag {
    /// The consumer is (about to be) blocked and wants a doorbell after a publish.
    ConsumerSleeping,
    /// The producer is blocked on a full ring and wants a doorbell after a head publish.
    ProducerWaiting,
}

/// How a sleeping consumer wants to be woken: the value of its sleep flag, which a
/// producer takes (swaps to zero) after publishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Awake: no doorbell.
    None = 0,
    /// Through the endpoint's doorbell (an eventfd watched by epoll).
    Doorbell = 1,
    /// Through a futex on the sleep flag itself (a wait while the flag holds this value):
    /// a receiver that waits for this one peer only.
    Futex = 2,
}

impl Wake {
    fn flag(self) -> u32 {
        self as u32
    }

    /// Any other value a peer left in the flag asks for the doorbell: it wakes every kind
    /// of sleep, a futex wake only a futex wait.
    fn from_flag(v: u32) -> Wake {
        match v {
            0 => Wake::None,
            2 => Wake::Futex,
            _ => Wake::Doorbell,
        }
    }
}

/// Access to a ring's memory: atomics for synchronisation, raw copies for payload.
///
/// # Safety
/// Implementations must map `idx < cap()` to distinct cells and keep the memory alive and
/// valid for as long as the value exists.
pub unsafe trait RingMem {
    /// Cells in the ring (a power of two).
    fn cap(&self) -> u64;
    /// Loads the sequence word of cell `idx`.
    fn load_seq(&self, idx: u64, o: Ordering) -> u64;
    /// Stores the sequence word of cell `idx`.
    fn store_seq(&self, idx: u64, v: u64, o: Ordering);
    /// Loads the consumer's published head.
    fn load_head(&self, o: Ordering) -> u64;
    /// Publishes the consumer's head.
    fn store_head(&self, v: u64, o: Ordering);
    /// Loads the head position a waiting producer wants reached before it is woken.
    fn load_wake_at(&self, o: Ordering) -> u64;
    /// Stores the head position a waiting producer wants reached.
    fn store_wake_at(&self, v: u64, o: Ordering);
    /// Loads a flag.
    fn load_flag(&self, f: Flag, o: Ordering) -> u32;
    /// Stores a flag.
    fn store_flag(&self, f: Flag, v: u32, o: Ordering);
    /// Swaps a flag.
    fn swap_flag(&self, f: Flag, v: u32, o: Ordering) -> u32;
    /// A sequentially consistent fence.
    fn fence(&self);
    /// Writes record header fields (len, flags) of the record at `idx`.
    ///
    /// # Safety
    /// Only the producer, only on cells it owns (not yet published).
    unsafe fn write_hdr(&self, idx: u64, len: u32, flags: u32);
    /// Reads record header fields of the record at `idx`.
    ///
    /// # Safety
    /// Only the consumer, after an Acquire load saw the record's sequence word.
    unsafe fn read_hdr(&self, idx: u64) -> (u32, u32);
    /// Copies `src` into the payload of the record at `idx`, starting at payload offset `off`.
    ///
    /// # Safety
    /// As for `write_hdr`; the range must lie inside the reserved record.
    unsafe fn write(&self, idx: u64, off: usize, src: &[u8]);
    /// Copies payload bytes of the record at `idx` from offset `off` into `dst`.
    ///
    /// # Safety
    /// As for `read_hdr`; the range must lie inside the record.
    unsafe fn read(&self, idx: u64, off: usize, dst: &mut [u8]);
    /// Hints that cells `idx` and `idx + 1` will be written soon: no effect on the
    /// contents; nothing by default.
    fn prefetch_for_write(&self, _idx: u64) {}
}

/// A ring whose contents break the protocol (a buggy or hostile peer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The head cell's sequence word is neither free nor the expected position.
    #[error("bad sequence word at ring position {pos}: {got:#x} (expected 0 or {:#x})", pos + 1)]
    BadSequence {
        /// Consumer position.
        pos: u64,
        /// Sequence value found.
        got: u64,
    },
    /// A record length that does not fit the ring.
    #[error("record length {len} at ring position {pos} does not fit the ring")]
    BadLength {
        /// Consumer position.
        pos: u64,
        /// Length found.
        len: u32,
    },
}

/// Cells a record of `len` payload bytes occupies.
#[inline]
pub fn cells_for(len: usize) -> u64 {
    (REC_HDR + len).div_ceil(CELL) as u64
}

/// Largest payload a ring of `cap` cells accepts in one record (half the ring, so a record
/// plus the padding before it always fits in an empty ring).
pub fn max_payload(cap: u64) -> usize {
    (cap / 2) as usize * CELL - REC_HDR
}

/// A place reserved in the ring for one record; fill it, then [`Producer::commit`].
#[derive(Debug)]
#[must_use]
pub struct Reservation {
    pos: u64,
    len: u32,
}

impl Reservation {
    /// Cell index of the record (for [`RingMem::write`]).
    pub fn idx(&self, cap: u64) -> u64 {
        self.pos & (cap - 1)
    }

    /// Payload bytes reserved.
    pub fn bytes(&self) -> usize {
        self.len as usize
    }
}

/// The producing half.
pub struct Producer<M: RingMem> {
    mem: M,
    tail: u64,
    cached_head: u64,
}

impl<M: RingMem> Producer<M> {
    /// A producer at position 0 of a fresh (zeroed) ring.
    pub fn new(mem: M) -> Self {
        Producer {
            mem,
            tail: 0,
            cached_head: 0,
        }
    }

    /// The ring memory.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    fn fits(&self, need: u64) -> bool {
        // A head beyond our tail is impossible from an honest consumer: treat the ring as
        // full rather than trust it (no arithmetic on hostile values can wrap).
        match self.tail.checked_sub(self.cached_head) {
            Some(used) => used + need <= self.mem.cap(),
            None => false,
        }
    }

    fn space(&mut self, need: u64) -> bool {
        if self.fits(need) {
            return true;
        }
        self.cached_head = self.mem.load_head(Ordering::Acquire);
        self.fits(need)
    }

    /// Reserves a record of `len` payload bytes, or returns `None` when the ring is full.
    ///
    /// # Panics
    /// If `len > max_payload(cap)`: the caller must split or use rendezvous.
    pub fn reserve(&mut self, len: usize) -> Option<Reservation> {
        let cap = self.mem.cap();
        assert!(len <= max_payload(cap), "record larger than half the ring");
        let n = cells_for(len);
        let idx = self.tail & (cap - 1);
        let pad = if idx + n > cap { cap - idx } else { 0 };
        if !self.space(pad + n) {
            return None;
        }
        if pad > 0 {
            // SAFETY: the cells [idx, cap) are free (space() checked) and owned by us.
            unsafe { self.mem.write_hdr(idx, 0, F_PAD) };
            self.mem.store_seq(idx, self.tail + 1, Ordering::Release);
            self.tail += pad;
        }
        Some(Reservation {
            pos: self.tail,
            len: len as u32,
        })
    }

    /// Publishes a reserved record. Returns how the consumer asked to be woken (the caller
    /// must ring that doorbell).
    pub fn commit(&mut self, r: Reservation) -> Wake {
        let cap = self.mem.cap();
        let idx = r.pos & (cap - 1);
        // SAFETY: the record's cells were reserved by reserve() and are not yet published.
        unsafe { self.mem.write_hdr(idx, r.len, 0) };
        self.mem.store_seq(idx, r.pos + 1, Ordering::Release);
        self.tail = r.pos + cells_for(r.len as usize);
        // The next record's cells, fetched for writing now rather than at the next send:
        // with many peers that send finds them cold (in another core's cache, or in the
        // ring's first lap not yet read into any), and the fence below would wait for them.
        self.mem.prefetch_for_write(self.tail & (cap - 1));
        self.wants_doorbell()
    }

    /// After a publish: how the consumer sleeps, if it does (clears its flag).
    fn wants_doorbell(&self) -> Wake {
        self.mem.fence();
        if self
            .mem
            .load_flag(Flag::ConsumerSleeping, Ordering::Relaxed)
            == 0
        {
            return Wake::None;
        }
        Wake::from_flag(
            self.mem
                .swap_flag(Flag::ConsumerSleeping, 0, Ordering::AcqRel),
        )
    }

    /// Declares that the producer will block until space frees; returns true when space
    /// for `len` bytes appeared meanwhile (then do not block).
    pub fn arm_wait(&mut self, len: usize) -> bool {
        let cap = self.mem.cap();
        let (n, pad) = self.cells_at_tail(len);
        // Woken as soon as this record fits.
        self.arm_until((self.tail + pad + n).saturating_sub(cap));
        let ok = self.space(pad + n);
        if ok {
            self.disarm_wait();
        }
        ok
    }

    /// Whether a record of `len` payload bytes fits now, without asking for a doorbell
    /// (the check to make before [`Producer::arm_wait`], whose fences cost more than a
    /// claim's other work when the ring has room, as it mostly does).
    pub fn has_room(&mut self, len: usize) -> bool {
        let (n, pad) = self.cells_at_tail(len);
        self.space(pad + n)
    }

    /// The cells a record of `len` bytes takes, and the padding before it if it would
    /// run past the ring's end.
    fn cells_at_tail(&self, len: usize) -> (u64, u64) {
        let cap = self.mem.cap();
        let n = cells_for(len);
        let idx = self.tail & (cap - 1);
        (n, if idx + n > cap { cap - idx } else { 0 })
    }

    /// Asks for a doorbell once the consumer's head reaches `head` (never beyond our
    /// tail, so a consumer that runs dry always reaches it).
    fn arm_until(&mut self, head: u64) {
        self.mem
            .store_wake_at(head.min(self.tail), Ordering::Relaxed);
        self.mem
            .store_flag(Flag::ProducerWaiting, 1, Ordering::SeqCst);
        self.mem.fence();
    }

    /// Gives up a reservation without publishing it. The caller may have written payload
    /// over the sequence slots of the record's later cells: they are zeroed so a later,
    /// shorter record does not leave them at the consumer's head.
    pub fn abandon(&mut self, r: Reservation) {
        let cap = self.mem.cap();
        let idx = r.idx(cap);
        for i in idx + 1..idx + cells_for(r.len as usize) {
            self.mem.store_seq(i, 0, Ordering::Relaxed);
        }
    }

    /// Asks the consumer for a doorbell once half the ring is free (the producer is about
    /// to block with frames queued; waking it for every few freed cells would cost a
    /// wake-up per cell batch). The caller must retry its sends afterwards.
    pub fn arm_wait_any(&mut self) {
        let half = self.mem.cap() / 2;
        self.arm_until(self.tail.saturating_sub(half));
    }

    /// Withdraws [`Producer::arm_wait_any`] / [`Producer::arm_wait`].
    pub fn disarm_wait(&mut self) {
        if self.mem.load_flag(Flag::ProducerWaiting, Ordering::Relaxed) != 0 {
            self.mem
                .store_flag(Flag::ProducerWaiting, 0, Ordering::Relaxed);
        }
    }
}

/// A record seen at the consumer's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Cell index of the record.
    pub idx: u64,
    /// Payload length.
    pub len: usize,
}

/// The consuming half.
pub struct Consumer<M: RingMem> {
    mem: M,
    head: u64,
    published: u64,
}

impl<M: RingMem> Consumer<M> {
    /// A consumer at position 0 of a fresh (zeroed) ring.
    pub fn new(mem: M) -> Self {
        Consumer {
            mem,
            head: 0,
            published: 0,
        }
    }

    /// The ring memory.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    /// The record at the head, if one is published. Padding is skipped.
    pub fn peek(&mut self) -> Result<Option<Record>, RingError> {
        let cap = self.mem.cap();
        loop {
            let idx = self.head & (cap - 1);
            let seq = self.mem.load_seq(idx, Ordering::Acquire);
            if seq < self.head + 1 {
                return Ok(None); // free, or a record of an earlier lap
            }
            if seq != self.head + 1 {
                return Err(RingError::BadSequence {
                    pos: self.head,
                    got: seq,
                });
            }
            // SAFETY: the Acquire load above saw this record's publication.
            let (len, flags) = unsafe { self.mem.read_hdr(idx) };
            if flags & F_PAD != 0 {
                self.consume(cap - idx);
                continue;
            }
            let n = cells_for(len as usize);
            if len as usize > max_payload(cap) || idx + n > cap {
                return Err(RingError::BadLength {
                    pos: self.head,
                    len,
                });
            }
            return Ok(Some(Record {
                idx,
                len: len as usize,
            }));
        }
    }

    fn consume(&mut self, n: u64) {
        let cap = self.mem.cap();
        let idx = self.head & (cap - 1);
        // Zero the sequence slots of the continuation cells so stale payload is never read
        // as a header in a later lap. The head cell keeps its (now old-lap) sequence
        // number: the consumer never writes the line of a one-cell message, so the
        // producer reuses it without pulling a modified line back.
        for i in idx + 1..idx + n {
            self.mem.store_seq(i, 0, Ordering::Relaxed);
        }
        self.head += n;
    }

    /// Releases the record returned by the last `peek`. Returns true when the producer
    /// waits for space and must be woken.
    pub fn release(&mut self, r: Record) -> bool {
        self.consume(cells_for(r.len));
        if self.head - self.published >= self.mem.cap() / 8 {
            return self.publish();
        }
        false
    }

    /// Publishes the head now (when running dry or before sleeping). Returns true when the
    /// producer waits for space and must be woken.
    pub fn publish(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        self.published = self.head;
        self.mem.store_head(self.head, Ordering::Release);
        self.mem.fence();
        self.mem.load_flag(Flag::ProducerWaiting, Ordering::Acquire) != 0
            && self.head >= self.mem.load_wake_at(Ordering::Relaxed)
            && self
                .mem
                .swap_flag(Flag::ProducerWaiting, 0, Ordering::AcqRel)
                != 0
    }

    /// Declares that the consumer is about to block, woken as `how` says (not
    /// [`Wake::None`]); the caller must re-poll afterwards.
    pub fn arm_sleep(&mut self, how: Wake) {
        debug_assert!(how != Wake::None);
        self.mem
            .store_flag(Flag::ConsumerSleeping, how.flag(), Ordering::SeqCst);
        self.mem.fence();
    }

    /// Withdraws a sleep declaration.
    pub fn disarm_sleep(&mut self) {
        if self
            .mem
            .load_flag(Flag::ConsumerSleeping, Ordering::Relaxed)
            != 0
        {
            self.mem
                .store_flag(Flag::ConsumerSleeping, 0, Ordering::Relaxed);
        }
    }
}

#[cfg(loom)]
mod loom_tests;
