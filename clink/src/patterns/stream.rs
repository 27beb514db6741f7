//! A byte stream over apertures (CLAN section 4: the distributed queue adapted to
//! unstructured data): no message boundaries, `write` and `read` of any length, like a
//! socket.
//!
//! Memory: the reader's aperture holds the ring of `capacity` bytes (a power of two) at 0,
//! the write counter `w` at `capacity`, and the writer's `sleeping` word at `capacity + 8`;
//! the writer's aperture holds the read counter `r` at 0 and the reader's `sleeping` word
//! at 8. Counters are u64 byte positions (never wrapped, so no ABA and no lost slot:
//! `w - r` bytes are in the ring, `0..=capacity`); byte `p` lives at `p % capacity`. The
//! writer copies bytes into the ring (split at the wrap) with one-sided writes, then stores
//! `w` (same host: plain stores with release order; across hosts: puts, applied in
//! order), so the reader never sees a byte before the counter that covers it is complete.
//! The reader copies bytes out and writes `r` back lazily: every half ring, and whenever
//! it finds the ring empty. The writer re-reads `r` (its own memory) only when its cached
//! copy leaves too little room.
//!
//! Waiting: each side spins, then sleeps on a tripwire (the reader's over `w`, the
//! writer's over `r`). Puts fire it; direct stores do not, so a side about to sleep raises
//! its `sleeping` word in the peer's aperture, fences, and looks once more; the peer, after
//! storing its counter, fences, finds the word raised, lowers it and rings the doorbell
//! (one notify). Sleeps last at most [`super::MAX_SLEEP`], which bounds any missed wake-up.

use super::{deadline, nap, open_pair, quiet_tripwire, spin, Far};
use crate::rma::{ApertureId, TripId, Window};
use crate::{Endpoint, Error, PeerId, Result};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// Smallest ring.
pub const MIN_CAPACITY: usize = 64;
/// Largest ring.
pub const MAX_CAPACITY: usize = 1 << 30;
/// The writer's control window: read counter, then the reader's `sleeping` word.
const CTRL_LEN: u64 = 16;
/// Past the ring: write counter, the writer's `sleeping` word, padding to a cache line.
const TAIL_LEN: u64 = 64;
/// Offset of the `sleeping` word in the writer's control window.
const READER_SLEEPING: u64 = 8;

fn check_capacity(capacity: usize) -> Result<()> {
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(Error::Invalid(format!(
            "stream capacity {capacity}: need a power of two in {MIN_CAPACITY}..={MAX_CAPACITY}"
        )));
    }
    Ok(())
}

/// The writing side of a byte stream.
pub struct StreamWriter {
    peer: PeerId,
    cap: u64,
    far: Far,
    /// Largest put carried in one frame (network path).
    chunk: usize,
    _ap: ApertureId,
    near: Window,
    trip: TripId,
    w: u64,
    r_cache: u64,
}

impl StreamWriter {
    /// Sets up the writing side towards `peer`, which calls [`StreamReader::connect`] with
    /// the same `tag` and `capacity` (bytes in flight, a power of two).
    pub fn connect(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        capacity: usize,
        timeout: Option<Duration>,
    ) -> Result<StreamWriter> {
        check_capacity(capacity)?;
        let cap = capacity as u64;
        let (ap, near, far) = open_pair(ep, peer, tag, CTRL_LEN, cap + TAIL_LEN, timeout)?;
        let trip = quiet_tripwire(ep, ap, 0, 8)?;
        let chunk = ep.rma_inline_max(peer)?;
        Ok(StreamWriter {
            peer,
            cap,
            far,
            chunk,
            _ap: ap,
            near,
            trip,
            w: 0,
            r_cache: 0,
        })
    }

    /// Writes as much of `data` as fits now and returns how many bytes were taken (0 when
    /// the ring is full); the reader sees them at once.
    pub fn try_write(&mut self, ep: &mut Endpoint, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if self.cap - (self.w - self.r_cache) < data.len() as u64 {
            let r = self.near.load_u64(0)?;
            if r < self.r_cache || r > self.w {
                return Err(Error::Invalid(format!(
                    "stream: {}'s read counter {r} is outside {}..={}",
                    self.peer, self.r_cache, self.w
                )));
            }
            self.r_cache = r;
        }
        let room = self.cap - (self.w - self.r_cache);
        let n = (data.len() as u64).min(room) as usize;
        if n == 0 {
            return Ok(0);
        }
        let at = (self.w & (self.cap - 1)) as usize;
        let first = n.min(self.cap as usize - at);
        self.copy_in(ep, at as u64, &data[..first])?;
        self.copy_in(ep, 0, &data[first..n])?;
        self.w += n as u64;
        // After the bytes: same host, a release store behind the window's release fence;
        // network, a put behind the data's puts (a peer applies them in order), which
        // sends them all at once (one system call per write, not one per chunk).
        self.far.store_u64(ep, self.cap, self.w)?;
        if self.far.mapped() {
            fence(Ordering::SeqCst);
        }
        let bell = (self.cap, 8);
        self.far
            .wake_if_sleeping(ep, &self.near, READER_SLEEPING, bell)?;
        Ok(n)
    }

    fn copy_in(&mut self, ep: &mut Endpoint, at: u64, data: &[u8]) -> Result<()> {
        if self.far.mapped() {
            return self.far.write(ep, at, data);
        }
        // Frame-sized puts never wait for an acknowledgement; they are queued and leave
        // with the counter's put (`try_write`).
        for (k, c) in data.chunks(self.chunk).enumerate() {
            self.far.write_queued(ep, at + (k * self.chunk) as u64, c)?;
        }
        Ok(())
    }

    /// Writes all of `data`, waiting (spinning, then sleeping on the read counter's
    /// tripwire) while the ring is full; `Error::Timeout` after `timeout` (some bytes may
    /// have been written: see [`StreamWriter::written`]).
    pub fn write(
        &mut self,
        ep: &mut Endpoint,
        mut data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let end = deadline(timeout);
        let mut polls = 0u32;
        while !data.is_empty() {
            let n = self.try_write(ep, data)?;
            if n > 0 {
                data = &data[n..];
                continue;
            }
            if !spin(ep, Some(self.peer), &mut polls, end)? {
                continue;
            }
            self.far.prepare_sleep(ep, self.trip, self.cap + 8)?;
            if self.near.load_u64(0)? != self.r_cache {
                continue;
            }
            nap(ep, &[self.trip], end)?;
        }
        Ok(())
    }

    /// Makes what was written reach the reader: same host, rings its doorbell (`write`
    /// does when the reader sleeps); network, waits until the owner applied the puts.
    pub fn flush(&mut self, ep: &mut Endpoint) -> Result<()> {
        if self.far.mapped() {
            self.far.doorbell(ep, self.cap, 8)
        } else {
            ep.flush_rma(Some(self.peer))
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.w
    }
}

/// The reading side of a byte stream.
pub struct StreamReader {
    peer: PeerId,
    cap: u64,
    _ap: ApertureId,
    near: Window,
    far: Far,
    trip: TripId,
    r: u64,
    r_pub: u64,
}

impl StreamReader {
    /// Sets up the reading side of a stream from `peer` with a ring of `capacity` bytes (a
    /// power of two) in this endpoint's aperture.
    pub fn connect(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        capacity: usize,
        timeout: Option<Duration>,
    ) -> Result<StreamReader> {
        check_capacity(capacity)?;
        let cap = capacity as u64;
        let (ap, near, far) = open_pair(ep, peer, tag, cap + TAIL_LEN, CTRL_LEN, timeout)?;
        // Over the write counter only: it is written after the bytes it covers.
        let trip = quiet_tripwire(ep, ap, cap, 8)?;
        Ok(StreamReader {
            peer,
            cap,
            _ap: ap,
            near,
            far,
            trip,
            r: 0,
            r_pub: 0,
        })
    }

    /// Copies the bytes available now (up to `buf.len()`) into `buf`; returns how many (0
    /// when the ring is empty).
    pub fn try_read(&mut self, ep: &mut Endpoint, buf: &mut [u8]) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let w = self.near.load_u64(self.cap)?;
        if w < self.r || w - self.r > self.cap {
            return Err(Error::Invalid(format!(
                "stream: {}'s write counter {w} is outside {}..={}",
                self.peer,
                self.r,
                self.r + self.cap
            )));
        }
        let n = ((w - self.r) as usize).min(buf.len());
        if n == 0 {
            // Empty: hand the writer all the room we freed before anyone waits.
            if self.r != self.r_pub {
                self.publish(ep)?;
            }
            return Ok(0);
        }
        let at = (self.r & (self.cap - 1)) as usize;
        let first = n.min(self.cap as usize - at);
        self.near.read(at as u64, &mut buf[..first])?;
        self.near.read(0, &mut buf[first..n])?;
        self.r += n as u64;
        if self.r - self.r_pub >= self.cap / 2 {
            self.publish(ep)?;
        }
        Ok(n)
    }

    fn publish(&mut self, ep: &mut Endpoint) -> Result<()> {
        // A release store (or a put issued after them): the copies out of the ring are
        // done before the writer may overwrite it.
        self.far.store_u64(ep, 0, self.r)?;
        self.r_pub = self.r;
        if self.far.mapped() {
            fence(Ordering::SeqCst);
        }
        self.far
            .wake_if_sleeping(ep, &self.near, self.cap + 8, (0, 8))
    }

    /// Reads at least one byte (up to `buf.len()`), spinning and then sleeping on the write
    /// counter's tripwire, at most `timeout`; returns how many.
    pub fn read(
        &mut self,
        ep: &mut Endpoint,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let end = deadline(timeout);
        let mut polls = 0u32;
        loop {
            let n = self.try_read(ep, buf)?;
            if n > 0 {
                return Ok(n);
            }
            if !spin(ep, Some(self.peer), &mut polls, end)? {
                continue;
            }
            self.far.prepare_sleep(ep, self.trip, READER_SLEEPING)?;
            let n = self.try_read(ep, buf)?;
            if n > 0 {
                return Ok(n);
            }
            nap(ep, &[self.trip], end)?;
        }
    }

    /// Fills all of `buf`, waiting as [`StreamReader::read`] (at most `timeout` in all).
    pub fn read_exact(
        &mut self,
        ep: &mut Endpoint,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let end = deadline(timeout);
        let mut got = 0;
        while got < buf.len() {
            let left = end.map(|d| d.saturating_duration_since(Instant::now()));
            got += self.read(ep, &mut buf[got..], left)?;
        }
        Ok(())
    }

    /// Bytes read so far.
    pub fn consumed(&self) -> u64 {
        self.r
    }
}
