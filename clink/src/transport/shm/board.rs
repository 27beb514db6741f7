//! The activity board: one page per endpoint, shared with each of its same-host peers, on
//! which a peer raises its bit after publishing a record in its ring towards us.
//!
//! It turns "which of my N rings has something" from N ring polls into a scan of N/64
//! words, so an endpoint with a thousand peers pays for the active ones only (CLAN's
//! event-driven server). It is used only when the endpoint has enough peers
//! (`CLINK_BOARD_PEERS`): with few peers, polling the rings directly is cheaper, and the
//! producer then pays one load of a line that never changes.
//!
//! Page layout: `on` (u32) at 64; `sleeping` (u32) at 128; the bitmap of
//! [`SLOTS`] bits from 512. Each peer is told its slot at connect time (in the pair
//! segment's header); a peer outside the board (no slot left) is polled directly.
//!
//! Protocol (both halves are Dekker pairs over SeqCst operations):
//! - producer: publish the record, fence (the ring's commit does it), load `on`; if on,
//!   raise the bit (fetch-or), then load `sleeping` and, when set, clear it
//!   and ring the doorbell;
//! - consumer: for each non-zero word, swap it to zero, fence, poll the rings of its bits.
//!   Either the consumer's poll sees the record, or the producer's load sees the cleared
//!   bit and raises it again. Turning the board on is `on = 1`, fence, one poll of every
//!   ring. Sleeping is `sleeping = 1`, fence, re-scan the words.
//!
//! Every peer can write the whole page. A hostile peer can raise bits (spurious polls) or
//! clear other peers' bits; the endpoint therefore also polls the next 32 peers' rings in
//! turn at each liveness check (`endpoint::ready`), which bounds the delay such a peer can
//! cause to `CLINK_LIVENESS_MS` times the number of peers / 32.

use crate::error::{io_err, Result};
use crate::sys::{self, Mapping};
use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Slots on one board (peers beyond them are polled directly).
pub const SLOTS: usize = 4096;
/// Words of the bitmap.
pub const WORDS: usize = SLOTS / 64;
const LEN: usize = 4096;
const ON: usize = 64;
const SLEEPING: usize = 128;
const BITS: usize = 512;

/// Typed views of the page; every offset is a constant inside it.
struct Page(Mapping);

impl Page {
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= LEN && off.is_multiple_of(4));
        // SAFETY: a constant, aligned offset inside the live page; AtomicU32 has u32's
        // layout and shared memory is only ever accessed atomically.
        unsafe { &*(self.0.ptr().add(off) as *const AtomicU32) }
    }
    fn word(&self, w: usize) -> &AtomicU64 {
        assert!(w < WORDS);
        // SAFETY: w < WORDS keeps the word inside the page, 8-aligned.
        unsafe { &*(self.0.ptr().add(BITS + w * 8) as *const AtomicU64) }
    }
}

/// An endpoint's own board (the consuming side), with its slot allocator.
pub struct Board {
    page: Page,
    fd: OwnedFd,
    free: RefCell<Vec<u32>>,
}

impl Board {
    /// Creates a fresh board in a sealed memory file.
    pub fn new() -> Result<Board> {
        let fd = sys::memfd_sealed("clink-board", LEN).map_err(io_err("memfd_create board"))?;
        // No magic number: every peer can write the page, so a check of one at
        // `Post::open` would let a stray write keep later peers off the board while this
        // side counts them on it (they would then wait for the liveness sweep).
        let map = Mapping::new(&fd, LEN).map_err(io_err("mmap board"))?;
        Ok(Board {
            page: Page(map),
            fd,
            free: RefCell::new((0..SLOTS as u32).rev().collect()),
        })
    }

    /// The memory file, sent to each peer at connect time.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    #[cfg(test)]
    fn file(&self) -> &OwnedFd {
        &self.fd
    }

    /// A slot for a new peer, if any is left.
    pub fn alloc(&self) -> Option<u32> {
        self.free.borrow_mut().pop()
    }

    /// Gives a slot back (its peer is gone or never connected).
    pub fn release(&self, slot: u32) {
        if (slot as usize) < SLOTS {
            self.word(slot as usize / 64)
                .fetch_and(!(1u64 << (slot % 64)), Ordering::Relaxed);
            self.free.borrow_mut().push(slot);
        }
    }

    fn word(&self, w: usize) -> &AtomicU64 {
        self.page.word(w)
    }

    /// Tells producers whether to raise their bits. After turning it on the caller must
    /// poll every ring once (a producer may have published just before seeing it).
    pub fn set_on(&self, on: bool) {
        self.page.u32_at(ON).store(u32::from(on), Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Takes the raised bits of word `w` (zero when none), ready for the rings to be
    /// polled.
    pub fn take(&self, w: usize) -> u64 {
        let word = self.word(w);
        if word.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let bits = word.swap(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        bits
    }

    /// True when some bit is raised.
    pub fn any(&self) -> bool {
        (0..WORDS).any(|w| self.word(w).load(Ordering::SeqCst) != 0)
    }

    /// Declares that the endpoint is about to sleep; the caller must check [`Board::any`]
    /// afterwards.
    pub fn arm_sleep(&self) {
        self.page.u32_at(SLEEPING).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Withdraws [`Board::arm_sleep`].
    pub fn disarm_sleep(&self) {
        let s = self.page.u32_at(SLEEPING);
        if s.load(Ordering::Relaxed) != 0 {
            s.store(0, Ordering::Relaxed);
        }
    }
}

/// A peer's board as seen by us, the producer, with the slot it gave us.
pub struct Post {
    page: Page,
    slot: usize,
}

impl Post {
    /// Maps a peer's board; `None` when the peer gave no valid slot or a bad file. With no
    /// slot the peer polls our ring on every pass; with a slot but a bad file we raise no
    /// bit, and the peer, which counts us on its board, finds our records only at its
    /// periodic sweep: a peer that hands out a bad board slows only its own receipt.
    pub fn open(fd: &OwnedFd, slot: u64) -> Option<Post> {
        let slot = usize::try_from(slot).ok().filter(|&s| s < SLOTS)?;
        sys::check_peer_memfd(fd, LEN).ok()?;
        let map = Mapping::new(fd, LEN).ok()?;
        Some(Post {
            page: Page(map),
            slot,
        })
    }

    /// Called right after publishing a record (and the ring's fence): raises our bit when
    /// the board is on. Returns true when the consumer sleeps on the board and must be
    /// woken.
    pub fn raise(&self) -> bool {
        if self.page.u32_at(ON).load(Ordering::SeqCst) == 0 {
            return false;
        }
        // Straight to the read-modify-write: a load first would cost one more transfer of
        // the line (the consumer took the bits since, so it is rarely already raised).
        self.page
            .word(self.slot / 64)
            .fetch_or(1u64 << (self.slot % 64), Ordering::SeqCst);
        let sleeping = self.page.u32_at(SLEEPING);
        sleeping.load(Ordering::SeqCst) != 0 && sleeping.swap(0, Ordering::SeqCst) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post_for(b: &Board, slot: u32) -> Post {
        Post::open(b.file(), u64::from(slot)).unwrap()
    }

    #[test]
    fn bits_are_raised_only_when_on_and_taken_once() {
        let b = Board::new().unwrap();
        let s = b.alloc().unwrap();
        let p = post_for(&b, s);
        assert!(!p.raise());
        assert!(!b.any());
        b.set_on(true);
        assert!(!p.raise());
        assert!(b.any());
        assert_eq!(b.take(s as usize / 64), 1 << (s % 64));
        assert_eq!(b.take(s as usize / 64), 0);
        b.arm_sleep();
        assert!(p.raise(), "a sleeping consumer must be woken");
        assert!(!p.raise(), "the first raise cleared the sleeping flag");
        b.release(s);
        assert!(!b.any(), "release clears the slot's bit");
    }

    #[test]
    fn bad_slots_and_files_are_refused() {
        let b = Board::new().unwrap();
        assert!(Post::open(b.file(), SLOTS as u64).is_none());
        assert!(Post::open(b.file(), u64::MAX).is_none());
        let small = sys::memfd_sealed("small", 64).unwrap();
        assert!(Post::open(&small, 0).is_none());
    }

    #[test]
    fn slots_are_allocated_once_until_released() {
        let b = Board::new().unwrap();
        let mut seen = std::collections::HashSet::new();
        while let Some(s) = b.alloc() {
            assert!(seen.insert(s));
        }
        assert_eq!(seen.len(), SLOTS);
        b.release(7);
        assert_eq!(b.alloc(), Some(7));
    }
}
