//! The target's copy engine, sans-IO: the order in which one peer's requests are applied
//! when some are large copies done a quantum at a time.
//!
//! A large put or get (a CMA copy between the initiator's memory and an aperture) is not
//! done in one call: the engine moves pieces of at most [`QUANTUM`] bytes, one per turn and
//! peer, so one peer's bulk cannot starve another's. Requests that arrive from that peer
//! meanwhile wait behind the copy, whatever their size: a peer's requests take effect in
//! the order it sent them (a put followed by a notify fires the notify's tripwire after
//! the put's bytes are in). The runtime serves what the engine hands back and carries out
//! the pieces (the system calls); `tests/rma_engine_sim.rs` checks the order and the
//! pieces against a sequential model.

use std::collections::VecDeque;

/// The most one turn copies for one peer: large enough that the system call's cost is
/// small beside the copy, small enough that other peers' turns come often.
pub const QUANTUM: u64 = 256 << 10;

/// A large copy admitted for the engine (its target already checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkCopy {
    /// The initiator's request number.
    pub req: u64,
    /// The aperture.
    pub ap: u32,
    /// Offset in the aperture.
    pub at: u64,
    /// Bytes to copy.
    pub len: u64,
    /// The initiator's address of the bytes.
    pub addr: u64,
    /// Bytes copied so far.
    pub done: u64,
    /// A put (the initiator's bytes into the aperture); else a get.
    pub put: bool,
}

/// One piece of the head copy to carry out ([`Engine::piece`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The aperture.
    pub ap: u32,
    /// Offset in the aperture.
    pub at: u64,
    /// The initiator's address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// A put.
    pub put: bool,
}

enum Item<F> {
    Copy(BulkCopy),
    Frame(F),
}

/// One peer's engine queue: the copy in progress at its head, then the requests that
/// arrived behind it (`F`: the runtime's copy of a request frame).
pub struct Engine<F> {
    queue: VecDeque<Item<F>>,
}

impl<F> Default for Engine<F> {
    fn default() -> Self {
        Engine {
            queue: VecDeque::new(),
        }
    }
}

impl<F> Engine<F> {
    /// Whether nothing is queued (requests are then served as they arrive).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// A request arrived: true when it must wait behind a copy (`keep` makes the
    /// engine's copy of it, which comes back from [`Engine::next_waiting`] in its turn);
    /// false when it is to be served at once (nothing is kept).
    pub fn queued(&mut self, keep: impl FnOnce() -> F) -> bool {
        if self.queue.is_empty() {
            return false;
        }
        self.queue.push_back(Item::Frame(keep()));
        true
    }

    /// Serving a request admitted a large copy: it goes first, ahead of the requests still
    /// waiting.
    pub fn start(&mut self, c: BulkCopy) {
        self.queue.push_front(Item::Copy(c));
    }

    /// The next piece of the head copy, at most `quantum` bytes; `None` when the head is
    /// not a copy (nothing to do this turn).
    pub fn piece(&self, quantum: u64) -> Option<Piece> {
        let Some(Item::Copy(c)) = self.queue.front() else {
            return None;
        };
        Some(Piece {
            ap: c.ap,
            at: c.at + c.done,
            // The initiator's address is the peer's word: one that wraps is a bad address
            // for the copy's system call to refuse, not an overflow here.
            addr: c.addr.wrapping_add(c.done),
            len: (c.len - c.done).min(quantum),
            put: c.put,
        })
    }

    /// The piece of `n` bytes was copied: the copy, once it is complete (it leaves the
    /// queue; answer it, then serve the requests behind it with
    /// [`Engine::next_waiting`]).
    pub fn copied(&mut self, n: u64) -> Option<BulkCopy> {
        let Some(Item::Copy(c)) = self.queue.front_mut() else {
            return None;
        };
        c.done = (c.done + n).min(c.len);
        if c.done < c.len {
            return None;
        }
        self.take_head()
    }

    /// The head copy failed: it leaves the queue (answer it as failed, then serve the
    /// requests behind it).
    pub fn failed(&mut self) -> Option<BulkCopy> {
        self.take_head()
    }

    fn take_head(&mut self) -> Option<BulkCopy> {
        if !matches!(self.queue.front(), Some(Item::Copy(_))) {
            return None;
        }
        match self.queue.pop_front() {
            Some(Item::Copy(c)) => Some(c),
            _ => None,
        }
    }

    /// The next request that waited behind a finished copy, while no copy is at the head:
    /// serve it; if it admits a copy, [`Engine::start`] it (the rest keep waiting).
    pub fn next_waiting(&mut self) -> Option<F> {
        if !matches!(self.queue.front(), Some(Item::Frame(_))) {
            return None;
        }
        match self.queue.pop_front() {
            Some(Item::Frame(f)) => Some(f),
            _ => None,
        }
    }

    /// Drops everything (the peer died).
    pub fn clear(&mut self) {
        self.queue.clear();
    }
}
