//! Communication patterns built only on apertures and tripwires (CLAN section 4). The
//! setup swaps cookies in one tagged message each way; after that, data moves only by
//! one-sided writes into the peer's aperture and is noticed by polling local memory or by
//! a tripwire.
//!
//! - [`dqueue`]: the distributed queue of CLAN's Example 2: fixed-size elements written
//!   remotely into the receiver's ring, lazy read counter written back into the sender's
//!   aperture, full when one slot is empty. With one usable slot it is Example 1's message
//!   transfer with `tx_ready` / `rx_ready` flags ([`dqueue::Mailbox`]).
//! - [`stream`]: a byte stream (the queue adapted to unstructured data): a ring of bytes
//!   in the reader's aperture, a write counter published after the bytes, a lazy read
//!   counter in the writer's; reads return what is there, like a socket.
//! - [`rpc`]: request/response over a pair of queues, and an event-driven server that waits
//!   on a tripset over all its clients.
//!
//! Each pattern works on the same host (the peer's window mapped: plain stores, no system
//! call, no help from the peer) and across hosts (puts, applied by the owner's progress).

pub mod dqueue;
pub mod rpc;
pub mod stream;

use crate::rma::{ApertureId, Cookie, Remote, TripId, Window, COOKIE_LEN, WRITE};
use crate::{Endpoint, Error, PeerId, Result, Selector};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// Polls before a waiting side looks at the clock or goes to sleep.
const SPIN: u32 = 1 << 12;
/// Longest sleep of a waiting side before it looks again: bounds a wake-up missed by a
/// writer that reads the `sleeping` word without a fence (see [`dqueue`]).
pub const MAX_SLEEP: Duration = Duration::from_millis(1);

pub(crate) fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + t)
}

/// One step of a waiting loop: progress every 64 polls, and then a look at `peer`'s
/// liveness (`None`: no single peer to watch, as for a server over many clients);
/// `Ok(true)` when it is time to sleep (every [`SPIN`] polls), `Err(Timeout)` past `end`.
pub(crate) fn spin(
    ep: &mut Endpoint,
    peer: Option<PeerId>,
    polls: &mut u32,
    end: Option<Instant>,
) -> Result<bool> {
    *polls += 1;
    if polls.is_multiple_of(64) {
        ep.progress();
        if let Some(peer) = peer.filter(|&p| !ep.is_alive(p)) {
            return Err(Error::PeerDead(peer));
        }
    }
    if polls.is_multiple_of(SPIN) {
        if end.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout);
        }
        return Ok(true);
    }
    std::hint::spin_loop();
    Ok(false)
}

/// Sleeps until one of `trips` fires, at most [`MAX_SLEEP`] (less if `end` is nearer).
pub(crate) fn nap(ep: &mut Endpoint, trips: &[TripId], end: Option<Instant>) -> Result<()> {
    let left = end.map_or(MAX_SLEEP, |d| {
        d.saturating_duration_since(Instant::now()).min(MAX_SLEEP)
    });
    match ep.wait_trips(trips, Some(left)) {
        Ok(_) | Err(Error::Timeout) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A peer's window written by direct stores when it is mapped (same host) or by puts.
pub(crate) enum Far {
    Mapped { win: Window, remote: Remote },
    Put(Remote),
}

impl Far {
    /// Maps the window on the same host; uses puts otherwise.
    pub(crate) fn open(ep: &mut Endpoint, remote: Remote) -> Result<Far> {
        if ep.transport(remote.peer)? == "shm" {
            let win = ep.map(&remote)?;
            Ok(Far::Mapped { win, remote })
        } else {
            Ok(Far::Put(remote))
        }
    }

    pub(crate) fn write(&self, ep: &mut Endpoint, offset: u64, data: &[u8]) -> Result<()> {
        match self {
            Far::Mapped { win, .. } => win.write(offset, data),
            Far::Put(r) => ep.put_nowait(r, offset, data),
        }
    }

    /// As [`Far::write`], but a put is only queued on the link, not sent: the next
    /// [`Far::store_u64`] (a `put_nowait`) sends it with everything queued before, in
    /// order. Same host, the same plain stores as `write`.
    pub(crate) fn write_queued(&self, ep: &mut Endpoint, offset: u64, data: &[u8]) -> Result<()> {
        match self {
            Far::Mapped { win, .. } => win.write(offset, data),
            Far::Put(r) => ep.put_queued(r, offset, data),
        }
    }

    /// Stores `v` (little-endian) at `offset`: same host a release store, network a put
    /// sent at once (with any put [`Far::write_queued`] left queued before it).
    pub(crate) fn store_u64(&self, ep: &mut Endpoint, offset: u64, v: u64) -> Result<()> {
        match self {
            Far::Mapped { win, .. } => win.store_u64(offset, v),
            Far::Put(r) => ep.put_nowait(r, offset, &v.to_le_bytes()),
        }
    }

    /// Makes direct stores visible to the owner's tripwires (puts fire them already).
    pub(crate) fn doorbell(&self, ep: &mut Endpoint, offset: u64, len: u64) -> Result<()> {
        match self {
            Far::Mapped { remote, .. } => ep.notify_nowait(remote, offset, len),
            Far::Put(_) => Ok(()),
        }
    }

    pub(crate) fn mapped(&self) -> bool {
        matches!(self, Far::Mapped { .. })
    }

    /// Before sleeping on `trip`, which the peer's writes fire: clears its bit, then (same
    /// host, where the peer's direct stores cannot fire it) raises our `sleeping` word at
    /// `at` of the peer's window and fences, so its next write is followed by a doorbell
    /// ([`Far::wake_if_sleeping`]). Over the network puts fire the tripwire themselves.
    /// The caller must look at its memory once more afterwards and [`nap`] only if that
    /// finds nothing: a write that landed before the clear is seen by that look, one after
    /// it fires the tripwire (no lost wake-up).
    pub(crate) fn prepare_sleep(&self, ep: &mut Endpoint, trip: TripId, at: u64) -> Result<()> {
        ep.tripwire_clear(trip);
        if self.mapped() {
            self.store_u64(ep, at, 1)?;
            fence(Ordering::SeqCst);
        }
        Ok(())
    }

    /// After a write: when the peer raised its `sleeping` word at `at` of our own window
    /// `near`, lowers it and rings the doorbell over `bell` (offset, length) of its
    /// window. Same host only. The caller decides whether to fence before.
    pub(crate) fn wake_if_sleeping(
        &self,
        ep: &mut Endpoint,
        near: &Window,
        at: u64,
        bell: (u64, u64),
    ) -> Result<()> {
        if self.mapped() && near.load_u64(at)? != 0 {
            near.store_u64(at, 0)?;
            self.doorbell(ep, bell.0, bell.1)?;
        }
        Ok(())
    }
}

/// A tripwire on writes to `len` bytes at `offset` of `ap` that only sets its bit (no
/// event): what a pattern's waiting side sleeps on.
pub(crate) fn quiet_tripwire(
    ep: &mut Endpoint,
    ap: ApertureId,
    offset: u64,
    len: u64,
) -> Result<TripId> {
    ep.tripwire(
        ap,
        offset,
        len,
        crate::rma::TripOptions {
            event: false,
            ..Default::default()
        },
    )
}

/// Sets up one side of a pattern: allocates our `mine`-byte aperture, exports it for the
/// peer's writes, swaps cookies with `tag`, and opens the peer's window, which must be
/// `theirs` bytes. Returns our aperture, a window on it, and the peer's window.
pub(crate) fn open_pair(
    ep: &mut Endpoint,
    peer: PeerId,
    tag: u64,
    mine: u64,
    theirs: u64,
    timeout: Option<Duration>,
) -> Result<(ApertureId, Window, Far)> {
    let ap = ep.aperture_alloc(mine as usize)?;
    let cookie = ep.export(ap, 0, mine, WRITE)?;
    let remote = swap_cookies(ep, peer, tag, &cookie, timeout)?;
    if remote.len() != theirs {
        return Err(Error::Invalid(format!(
            "{peer}'s window is {} bytes, this side expects {theirs} (same element size and slots on both sides?)",
            remote.len()
        )));
    }
    let far = Far::open(ep, remote)?;
    Ok((ap, ep.aperture_window(ap)?, far))
}

/// Sends our cookie to `peer` with `tag` and receives its cookie (same tag).
pub(crate) fn swap_cookies(
    ep: &mut Endpoint,
    peer: PeerId,
    tag: u64,
    mine: &Cookie,
    timeout: Option<Duration>,
) -> Result<Remote> {
    ep.send(peer, tag, &mine.to_bytes())?;
    let mut b = [0u8; COOKIE_LEN];
    let st = ep.recv_timeout(Selector::exact(Some(peer), tag), &mut b, timeout)?;
    if st.len as usize != COOKIE_LEN {
        return Err(Error::Invalid(format!(
            "pattern setup: expected a {COOKIE_LEN}-byte cookie from {peer}, got {} bytes",
            st.len
        )));
    }
    let c = Cookie::from_bytes(&b).map_err(|e| Error::Invalid(format!("pattern setup: {e}")))?;
    ep.import(peer, c)
}
