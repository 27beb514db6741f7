//! The distributed queue (CLAN Example 2) and the flagged mailbox (Example 1).
//!
//! Memory: the receiver's aperture holds `slots` slots of `stride` bytes (the element,
//! padding, and an 8-byte sequence word at the end); the sender's aperture holds the read
//! counter. The sender writes element `w` into slot `w % slots` and then its sequence word
//! `w + 1` (so a slot's word says which lap it holds: no ABA across wrap-arounds), with no
//! message and no system call. The receiver polls the next slot's word, copies the element
//! out and, lazily (every half queue, and whenever it finds the queue empty), writes its
//! read counter into the sender's aperture. The sender re-reads that counter only when
//! its cached copy says full; the queue is full when one slot is empty (`slots - 1`
//! elements in flight), so `w == r` means empty without a shared flag.
//!
//! Waiting: the receiver spins, then sleeps on a tripwire over its slots. Puts (network)
//! fire it themselves; direct stores (same host) do not, so before sleeping the receiver
//! raises a `sleeping` word in the sender's aperture, and a sender that finds it raised
//! after writing an element lowers it and rings the doorbell (one notify); a receiver that
//! keeps up by spinning costs the sender no doorbell at all. The sender reads the word
//! without a full fence after its stores (a fence per element would serialise on the
//! transfer of each element's cache lines), so in a narrow race the read can miss a word
//! being raised: the receiver therefore sleeps at most [`MAX_SLEEP`] at a time and looks
//! again, which bounds a missed wake-up to that delay.

pub use super::MAX_SLEEP;
use super::{deadline, nap, open_pair, quiet_tripwire, spin, Far};
use crate::rma::{ApertureId, TripId, Window};
use crate::{Endpoint, Error, PeerId, Result};
use std::time::Duration;

/// The sender's control window: read counter, then the receiver's `sleeping` word.
const CTRL_LEN: u64 = 16;
const SLEEPING: u64 = 8;

fn stride(elem: usize) -> usize {
    (elem + 8).div_ceil(64) * 64
}

fn check_geometry(elem: usize, slots: usize) -> Result<()> {
    if elem == 0 || slots < 2 || elem > 1 << 20 || slots > 1 << 20 {
        return Err(Error::Invalid(format!(
            "queue of {slots} slots of {elem} bytes: need 1..=1 MiB elements and 2..=2^20 slots"
        )));
    }
    Ok(())
}

/// The writing side of a distributed queue.
pub struct QueueSender {
    peer: PeerId,
    elem: usize,
    slots: u64,
    stride: usize,
    far: Far,
    /// Our aperture with the receiver's read counter (kept for the export's lifetime).
    _ap: ApertureId,
    near: Window,
    w: u64,
    r_cache: u64,
    buf: Vec<u8>,
}

impl QueueSender {
    /// Sets up the sending side towards `peer`, which calls [`QueueReceiver::connect`]
    /// with the same `tag`, `elem` and `slots`.
    pub fn connect(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        elem: usize,
        slots: usize,
        timeout: Option<Duration>,
    ) -> Result<QueueSender> {
        check_geometry(elem, slots)?;
        let st = stride(elem);
        let (ap, near, far) = open_pair(ep, peer, tag, CTRL_LEN, (slots * st) as u64, timeout)?;
        Ok(QueueSender {
            peer,
            elem,
            slots: slots as u64,
            stride: st,
            far,
            near,
            _ap: ap,
            w: 0,
            r_cache: 0,
            buf: vec![0u8; st],
        })
    }

    /// Appends one element (`data.len()` must be the element size); `Ok(false)` when the
    /// queue is full.
    pub fn try_push(&mut self, ep: &mut Endpoint, data: &[u8]) -> Result<bool> {
        if data.len() != self.elem {
            return Err(Error::Invalid(format!(
                "queue element is {} bytes, got {}",
                self.elem,
                data.len()
            )));
        }
        if self.w - self.r_cache >= self.slots - 1 {
            self.r_cache = self.near.load_u64(0)?;
            if self.w - self.r_cache >= self.slots - 1 {
                return Ok(false);
            }
        }
        let base = (self.w % self.slots) as usize * self.stride;
        let seq_at = (base + self.stride - 8) as u64;
        if self.far.mapped() {
            self.far.write(ep, base as u64, data)?;
            self.far.store_u64(ep, seq_at, self.w + 1)?;
        } else {
            // One put carries element and sequence word (applied in order, in one go).
            self.buf[..data.len()].copy_from_slice(data);
            let n = self.stride;
            self.buf[n - 8..].copy_from_slice(&(self.w + 1).to_le_bytes());
            self.far.write(ep, base as u64, &self.buf)?;
        }
        self.w += 1;
        // No fence before this load (a full fence per element waits for the element's
        // cache lines to reach the receiver and halves the rate); the race it leaves is
        // covered by the receiver's bounded sleep (see the module docs).
        let bell = (0, self.ring_len());
        self.far.wake_if_sleeping(ep, &self.near, SLEEPING, bell)?;
        Ok(true)
    }

    /// Appends one element, waiting (spinning, making progress) while the queue is full.
    pub fn push(
        &mut self,
        ep: &mut Endpoint,
        data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let end = deadline(timeout);
        let mut polls = 0u32;
        while !self.try_push(ep, data)? {
            spin(ep, Some(self.peer), &mut polls, end)?;
        }
        Ok(())
    }

    /// Bytes of the receiver's slots.
    fn ring_len(&self) -> u64 {
        self.slots * self.stride as u64
    }

    /// Elements written so far.
    pub fn written(&self) -> u64 {
        self.w
    }
}

/// The reading side of a distributed queue.
pub struct QueueReceiver {
    peer: PeerId,
    elem: usize,
    slots: u64,
    stride: usize,
    _ap: ApertureId,
    near: Window,
    far: Far,
    trip: TripId,
    r: u64,
    r_pub: u64,
}

impl QueueReceiver {
    /// Sets up the receiving side of a queue of `slots` slots (`slots - 1` elements in
    /// flight) of `elem`-byte elements from `peer`.
    pub fn connect(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        elem: usize,
        slots: usize,
        timeout: Option<Duration>,
    ) -> Result<QueueReceiver> {
        check_geometry(elem, slots)?;
        let st = stride(elem);
        let len = (slots * st) as u64;
        let (ap, near, far) = open_pair(ep, peer, tag, len, CTRL_LEN, timeout)?;
        // Armed after the swap: a write before it is found by the next look at the slots
        // (the tripwire only matters to a receiver about to sleep, which looks again).
        let trip = quiet_tripwire(ep, ap, 0, len)?;
        Ok(QueueReceiver {
            peer,
            elem,
            slots: slots as u64,
            stride: st,
            near,
            _ap: ap,
            far,
            trip,
            r: 0,
            r_pub: 0,
        })
    }

    /// The tripwire over the slots (for waiting on several queues with a tripset).
    pub fn tripwire(&self) -> TripId {
        self.trip
    }

    /// Takes the next element into `buf[..elem]` if there is one.
    pub fn try_pop(&mut self, ep: &mut Endpoint, buf: &mut [u8]) -> Result<bool> {
        if buf.len() < self.elem {
            return Err(Error::Invalid(format!(
                "buffer of {} bytes for {}-byte elements",
                buf.len(),
                self.elem
            )));
        }
        let base = (self.r % self.slots) as usize * self.stride;
        let seq = self.near.load_u64((base + self.stride - 8) as u64)?;
        if seq != self.r + 1 {
            // Empty: hand the sender every slot we freed before anyone waits.
            if self.r != self.r_pub {
                self.publish(ep)?;
            }
            return Ok(false);
        }
        self.near.read(base as u64, &mut buf[..self.elem])?;
        self.r += 1;
        // At least one: a queue has two slots or more.
        if self.r - self.r_pub >= self.slots / 2 {
            self.publish(ep)?;
        }
        Ok(true)
    }

    fn publish(&mut self, ep: &mut Endpoint) -> Result<()> {
        self.far.store_u64(ep, 0, self.r)?;
        self.r_pub = self.r;
        Ok(())
    }

    /// Takes the next element, spinning (with progress) and then sleeping on the queue's
    /// tripwire, at most `timeout`.
    pub fn pop(
        &mut self,
        ep: &mut Endpoint,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let end = deadline(timeout);
        let mut polls = 0u32;
        loop {
            if self.try_pop(ep, buf)? {
                return Ok(());
            }
            if spin(ep, Some(self.peer), &mut polls, end)? {
                // Sleep: clear the bit, say so, look once more, then wait for a firing.
                self.prepare_sleep(ep)?;
                if self.try_pop(ep, buf)? {
                    return Ok(());
                }
                nap(ep, &[self.trip], end)?;
            }
        }
    }

    /// Before sleeping on [`QueueReceiver::tripwire`]: clears its bit and asks the sender
    /// for a doorbell on its next element. Look at the queue once more afterwards, then
    /// wait.
    pub fn prepare_sleep(&mut self, ep: &mut Endpoint) -> Result<()> {
        self.far.prepare_sleep(ep, self.trip, SLEEPING)
    }
}

/// CLAN's Example 1: one message buffer in the receiver's memory with an `rx_ready` flag
/// (here the slot's sequence word) and a `tx_ready` flag in the sender's (the read
/// counter): the distributed queue with exactly one usable slot, carrying messages of up
/// to `max` bytes with their length.
pub struct Mailbox;

impl Mailbox {
    fn elem(max: usize) -> usize {
        max + 8
    }

    /// The sending side (see [`QueueSender::connect`]).
    pub fn sender(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<MailboxSender> {
        let q = QueueSender::connect(ep, peer, tag, Self::elem(max), 2, timeout)?;
        Ok(MailboxSender {
            buf: vec![0u8; Self::elem(max)],
            q,
        })
    }

    /// The receiving side.
    pub fn receiver(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<MailboxReceiver> {
        let q = QueueReceiver::connect(ep, peer, tag, Self::elem(max), 2, timeout)?;
        Ok(MailboxReceiver {
            buf: vec![0u8; Self::elem(max)],
            q,
        })
    }
}

/// Sending side of a [`Mailbox`].
pub struct MailboxSender {
    q: QueueSender,
    buf: Vec<u8>,
}

impl MailboxSender {
    /// Waits for `tx_ready`, writes the message and raises `rx_ready`.
    pub fn send(&mut self, ep: &mut Endpoint, msg: &[u8], timeout: Option<Duration>) -> Result<()> {
        let max = self.buf.len() - 8;
        if msg.len() > max {
            return Err(Error::TooLarge(format!(
                "mailbox message of {} bytes exceeds {max}",
                msg.len()
            )));
        }
        self.buf[..8].copy_from_slice(&(msg.len() as u64).to_le_bytes());
        self.buf[8..8 + msg.len()].copy_from_slice(msg);
        self.q.push(ep, &self.buf, timeout)
    }
}

/// Receiving side of a [`Mailbox`].
pub struct MailboxReceiver {
    q: QueueReceiver,
    buf: Vec<u8>,
}

impl MailboxReceiver {
    /// Waits for `rx_ready`, copies the message into `out` and raises `tx_ready`; returns
    /// its length. A message longer than `out` fills it and gives [`Error::Truncated`].
    pub fn recv(
        &mut self,
        ep: &mut Endpoint,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<usize> {
        self.q.pop(ep, &mut self.buf, timeout)?;
        let n = u64::from_le_bytes(self.buf[..8].try_into().expect("8 bytes")) as usize;
        let max = self.buf.len() - 8;
        if n > max {
            return Err(Error::Invalid(format!(
                "mailbox message of {n} bytes from the peer exceeds the maximum {max}"
            )));
        }
        let k = n.min(out.len());
        out[..k].copy_from_slice(&self.buf[8..8 + k]);
        if k < n {
            return Err(Error::Truncated {
                len: n as u64,
                capacity: k as u64,
            });
        }
        Ok(n)
    }
}
