//! Apertures, one-sided access and Tripwires (CLAN): the public handle types. The
//! operations are methods of [`crate::Endpoint`] (see its "apertures" section).
//!
//! - An **aperture** is memory of an endpoint that peers may access: allocated by clink in
//!   a memory file ([`crate::Endpoint::aperture_alloc`], mappable by same-host peers) or a
//!   user buffer handed over ([`crate::Endpoint::aperture_register`]).
//! - [`crate::Endpoint::export`] grants a window of it as a [`Cookie`] (send its
//!   [`Cookie::to_bytes`] in any message); the receiver [`crate::Endpoint::import`]s it
//!   into a [`Remote`] and calls `put`, `get`, `fetch_add`, `compare_swap`, `notify` on it.
//!   The owner checks the key (constant time), revocation, rights and bounds of every
//!   access; refusals come back as [`crate::Error::Refused`] and are counted in the
//!   owner's [`crate::Stats::rma_refused`].
//! - On the same host, [`crate::Endpoint::map`] maps an imported window into this process:
//!   a [`Window`] whose small writes are plain stores (zero copies, no system call, no
//!   help from the owner). The owner cannot see such stores: call
//!   [`crate::Endpoint::notify`] (a doorbell) to fire its tripwires.
//! - **Trust model of mappings**: the owner checks the cookie once, when it hands over the
//!   memory file. A read-only cookie yields a read-only descriptor (the kernel refuses a
//!   writable mapping), but the mapping covers the whole aperture, not just the window:
//!   the window bounds of a [`Window`] are enforced by this library, not by the hardware,
//!   and revoking the cookie stops further puts/gets/maps but cannot unmap memory another
//!   process already mapped. Export a dedicated aperture to a peer you do not trust with
//!   the rest of it. Destroying the aperture detaches it: later stores by holders of old
//!   mappings land in memory nobody reads.

pub use clink_proto::rma::{Cookie, Status as AccessStatus, COOKIE_LEN, READ, WRITE};
pub use clink_proto::tripwire::TripId;

use crate::error::{Error, Result};
use crate::sys::Mapping;
use clink_proto::PeerId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A local aperture of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ApertureId(pub u32);

/// An imported cookie: a window of a peer's aperture this endpoint may access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The owner.
    pub peer: PeerId,
    /// The capability.
    pub cookie: Cookie,
}

impl Remote {
    /// Length of the window in bytes.
    pub fn len(&self) -> u64 {
        self.cookie.len
    }

    /// True for an empty window.
    pub fn is_empty(&self) -> bool {
        self.cookie.len == 0
    }
}

/// Handle of a non-blocking one-sided request (`iput`, `iget`); complete it with
/// [`crate::Endpoint::wait_rma`] or [`crate::Endpoint::test_rma`].
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a one-sided request must be waited on or tested to completion"]
pub struct RmaRequest {
    pub(crate) id: u64,
}

impl RmaRequest {
    /// The id carried by this request's [`crate::events::Event::RmaDone`].
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A group of tripwires waited on together ([`crate::Endpoint::wait_tripset`]).
#[derive(Clone, Debug, Default)]
pub struct Tripset {
    pub(crate) ids: Vec<TripId>,
}

impl Tripset {
    /// An empty set.
    pub fn new() -> Tripset {
        Tripset::default()
    }

    /// Adds a tripwire.
    pub fn add(&mut self, id: TripId) {
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
    }

    /// Removes a tripwire.
    pub fn remove(&mut self, id: TripId) {
        self.ids.retain(|&t| t != id);
    }

    /// The tripwires in the set.
    pub fn ids(&self) -> &[TripId] {
        &self.ids
    }
}

/// Options of a tripwire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TripOptions {
    /// Fire on reads (get).
    pub reads: bool,
    /// Fire on writes (put, atomics, notify).
    pub writes: bool,
    /// Disarm after firing once.
    pub once: bool,
    /// Queue an [`crate::events::Event::Tripwire`] (when the endpoint's interest includes
    /// tripwires) besides setting the bit and counting.
    pub event: bool,
}

impl Default for TripOptions {
    /// Writes, re-arming, with events.
    fn default() -> Self {
        TripOptions {
            reads: false,
            writes: true,
            once: false,
            event: true,
        }
    }
}

/// A window of aperture memory mapped into this process: an imported window of a
/// same-host peer ([`crate::Endpoint::map`]) or a local aperture
/// ([`crate::Endpoint::aperture_window`]). Reads and writes are plain loads and stores on
/// memory other processes access concurrently, so they go through raw copies and atomics
/// ([`Mapping`]), never Rust references. Bounds are checked on every call. `Send` and
/// `Sync`; it keeps the memory mapped while it lives, whatever happens to the endpoints.
#[derive(Clone)]
pub struct Window {
    map: Arc<Mapping>,
    /// Where the window starts in the mapping.
    base: usize,
    len: u64,
    writable: bool,
    peer: Option<PeerId>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("len", &self.len)
            .field("writable", &self.writable)
            .field("peer", &self.peer)
            .finish()
    }
}

impl Window {
    /// A window of `len` bytes at `offset` of `map`. The caller checked the bounds.
    pub(crate) fn new(
        map: Arc<Mapping>,
        offset: u64,
        len: u64,
        writable: bool,
        peer: Option<PeerId>,
    ) -> Window {
        debug_assert!(offset + len <= map.len() as u64);
        Window {
            map,
            base: offset as usize,
            len,
            writable,
            peer,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty window.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether stores are allowed (the cookie granted writes).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Base address of the window (for code that manages its own raw accesses).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr().wrapping_add(self.base)
    }

    fn refuse(&self, status: AccessStatus) -> Error {
        match self.peer {
            Some(peer) => Error::Refused { peer, status },
            None => Error::Invalid(format!("window access refused: {}", status.describe())),
        }
    }

    fn check(&self, offset: u64, len: u64, write: bool) -> Result<()> {
        if write && !self.writable {
            return Err(self.refuse(AccessStatus::NotPermitted));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(self.refuse(AccessStatus::OutOfRange)),
        }
    }

    fn word(&self, offset: u64, write: bool) -> Result<&AtomicU64> {
        self.check(offset, 8, write)?;
        // In bounds (checked): only misalignment is left to refuse.
        self.map
            .word(self.base + offset as usize)
            .ok_or_else(|| self.refuse(AccessStatus::Misaligned))
    }

    /// Copies `data` into the window at `offset` (plain stores), then a release fence so a
    /// later flag store publishes it.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64, true)?;
        self.map.copy_in(self.base + offset as usize, data);
        std::sync::atomic::fence(Ordering::Release);
        Ok(())
    }

    /// Copies bytes of the window at `offset` into `buf` (after an acquire fence, so data
    /// published by a flag read before is seen).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64, false)?;
        std::sync::atomic::fence(Ordering::Acquire);
        self.map.copy_out(self.base + offset as usize, buf);
        Ok(())
    }

    /// Stores an aligned word with release ordering (one plain store on x86).
    pub fn store_u64(&self, offset: u64, v: u64) -> Result<()> {
        self.word(offset, true)?.store(v, Ordering::Release);
        Ok(())
    }

    /// Loads an aligned word with acquire ordering.
    pub fn load_u64(&self, offset: u64) -> Result<u64> {
        Ok(self.word(offset, false)?.load(Ordering::Acquire))
    }

    /// Atomic fetch-add on an aligned word, directly in the shared memory (coherent with
    /// the owner's and other mappers' atomics on this host).
    pub fn fetch_add_u64(&self, offset: u64, v: u64) -> Result<u64> {
        Ok(self.word(offset, true)?.fetch_add(v, Ordering::AcqRel))
    }

    /// Atomic compare-and-swap on an aligned word; returns the previous value.
    pub fn compare_swap_u64(&self, offset: u64, expect: u64, new: u64) -> Result<u64> {
        let w = self.word(offset, true)?;
        Ok(
            match w.compare_exchange(expect, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }
}
