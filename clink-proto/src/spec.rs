//! Speculative defragmentation, sans-IO: where a receiver expects the fragments of a bulk
//! transfer to land, and how it checks afterwards what really arrived.
//!
//! The receiver of a bulk transfer (a rendezvous whose destination is the posted buffer)
//! pre-loads its receive vectors so that each expected datagram's [`BULK_HEADER`] lands in a
//! header slot and its payload straight at its final offset in the destination: the
//! seed's two descriptors per fragment. After the read the transport asks this module
//! what happened:
//!
//! - [`Layout::segments`] cuts a read (one datagram, or a coalesced GRO read of equal-sized
//!   segments) into datagrams and says which landed exactly on a (header slot, payload
//!   slot) pair — **candidates** — and which did not (straddling slots or the spill area);
//! - [`check`] verifies a candidate: a bulk datagram of the expected connection and
//!   transfer, for exactly the offset that slot was armed for, with a good checksum. That
//!   is a **hit**: zero copies, the bytes are final.
//! - Anything else is a **miss**: the transport gathers the datagram's bytes (one copy)
//!   and hands them to the ordinary path, where a bulk fragment is copied to its real
//!   offset through [`Placement::mark`] (the cleanup move) and anything else is handled as
//!   usual.
//!
//! **Invariant: speculation only places bytes where nothing valid is yet.** A slot is
//! armed only for a fragment [`Placement`] records as missing, and two slots are never
//! armed for one fragment, so whatever lands there — the right fragment, a stray
//! datagram, a corrupted copy — overwrites nothing of value; a miss costs a copy, never
//! data. And [`Placement::mark`] refuses a fragment already placed, so a duplicate or a
//! forged datagram never overwrites a valid one.
//!
//! **Prediction.** [`Placement::plan`] arms the fragments following the highest one placed
//! (the stream goes on where it was), grouped as the sender groups its sends
//! ([`crate::reliable::Config::bulk_group`]: one group per GSO send, one group per receive
//! entry), then the holes below it (retransmissions). A loss thus costs a miss for the
//! late retransmission only, not for everything behind it.

use crate::reliable::packet::{parse_bulk, wire_xfer, BulkContext, BulkHeader, BULK_HEADER};

/// The receiver's record of one bulk transfer: which fragments are at their place.
///
/// Only fragments that touch the destination are tracked (one bit each), so the memory
/// follows the posted buffer, not the length a peer announces; the transfer is complete
/// once they are all placed (the rest of a truncated message is dropped as it comes).
#[derive(Debug, Clone)]
pub struct Placement {
    xfer: u64,
    total: u64,
    cap: u64,
    frag: u64,
    /// Fragments touching the destination: `cap.div_ceil(frag)`.
    tracked: u64,
    placed: Vec<u64>,
    highest: Option<u64>,
    /// Every fragment below it is placed.
    low: u64,
}

/// What [`Placement::mark`] decided about a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// New: its bytes (the part below the capacity) belong at `offset`.
    New,
    /// Already placed: its bytes must not be written.
    Duplicate,
    /// A fragment of this transfer wholly beyond the destination (a truncated message):
    /// its bytes are dropped.
    Beyond,
    /// Not a fragment of this transfer (wrong offset, length or total): a forged or
    /// buggy datagram.
    Invalid,
}

impl Placement {
    /// A transfer of `total` bytes named `xfer`, cut into fragments of `frag` bytes (the
    /// connection's payload per datagram), into a destination of `cap` bytes (less than
    /// `total`: the message is truncated; the bytes beyond are received and dropped).
    pub fn new(xfer: u64, total: u64, cap: u64, frag: usize) -> Placement {
        let frag = frag.max(1) as u64;
        let cap = cap.min(total);
        let tracked = cap.div_ceil(frag);
        Placement {
            xfer,
            total,
            cap,
            frag,
            tracked,
            placed: vec![0; tracked.div_ceil(64) as usize],
            highest: None,
            low: 0,
        }
    }

    /// The transfer id.
    pub fn xfer(&self) -> u64 {
        self.xfer
    }

    /// Bytes of the destination the transfer fills (`min(total, cap)`).
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Fragments in the transfer.
    pub fn fragments(&self) -> u64 {
        self.total.div_ceil(self.frag)
    }

    /// True once every fragment touching the destination is placed.
    pub fn complete(&self) -> bool {
        self.low == self.tracked
    }

    /// True while fragments beyond the highest placed one are missing (or none is placed):
    /// the sender's stream has yet to reach the end of this transfer. False when only
    /// holes below it are left (retransmissions) or it is complete.
    pub fn streaming(&self) -> bool {
        let first = self.highest.map_or(0, |h| h + 1);
        self.next_missing(first, self.tracked).is_some()
    }

    /// Offset and length of fragment `i`.
    pub fn fragment(&self, i: u64) -> (u64, usize) {
        let off = i * self.frag;
        (off, (self.total - off).min(self.frag) as usize)
    }

    /// True when fragment `i` is at its place.
    pub fn is_placed(&self, i: u64) -> bool {
        self.placed
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Records a received fragment (`hdr` verified, `len` payload bytes).
    pub fn mark(&mut self, hdr: &BulkHeader, len: usize) -> Mark {
        if hdr.xfer != wire_xfer(self.xfer) || !hdr.offset.is_multiple_of(self.frag) {
            return Mark::Invalid;
        }
        let i = hdr.offset / self.frag;
        // (`offset < total`: `i` below the fragment count, without a second division.)
        if hdr.offset >= self.total || self.fragment(i).1 != len {
            return Mark::Invalid;
        }
        if i >= self.tracked {
            return Mark::Beyond;
        }
        if self.is_placed(i) {
            return Mark::Duplicate;
        }
        self.placed[(i / 64) as usize] |= 1 << (i % 64);
        self.highest = Some(self.highest.map_or(i, |h| h.max(i)));
        while self.low < self.tracked && self.is_placed(self.low) {
            self.low += 1;
        }
        Mark::New
    }

    /// The first missing fragment in `from..to` (whole words of placed ones skipped).
    fn next_missing(&self, mut from: u64, to: u64) -> Option<u64> {
        while from < to {
            let w = self.placed[(from / 64) as usize] | ((1u64 << (from % 64)) - 1);
            if w == u64::MAX {
                from = (from / 64 + 1) * 64;
                continue;
            }
            let i = (from / 64) * 64 + u64::from(w.trailing_ones());
            return (i < to).then_some(i);
        }
        None
    }

    /// Fragments to arm, as up to `entries` lists of at most `group` fragment indices:
    /// the missing fragments after the highest placed one, cut at multiples of `group`
    /// (how the sender groups its sends), then the holes below it. Only fragments that
    /// lie wholly inside the destination are armed.
    pub fn plan(&self, group: u64, entries: usize, out: &mut Vec<Vec<u64>>) {
        out.clear();
        let group = group.max(1);
        let n = self.tracked;
        let first = self.highest.map_or(0, |h| h + 1);
        // The stream's continuation, then the holes: each cut into entries at group
        // boundaries and at most `group` long.
        // An entry's list takes its whole group at once (grown push by push, the lists
        // cost more in reallocations than the plan itself).
        let cap = group.min(MAX_GROUP_CAPACITY) as usize;
        for (from, to) in [(first, n), (self.low, first.min(n))] {
            let mut cur: Vec<u64> = Vec::new();
            // Where the sender group of `cur`'s first fragment ends (one division per
            // entry, not per fragment).
            let mut group_end = 0;
            let mut at = from;
            while let Some(i) = self.next_missing(at, to) {
                at = i + 1;
                let (off, len) = self.fragment(i);
                if off + len as u64 > self.cap {
                    break; // so are all later ones
                }
                // A new sender group (the holes may skip its first fragment), or full.
                if !cur.is_empty() && (i >= group_end || cur.len() as u64 >= group) {
                    out.push(std::mem::take(&mut cur));
                    if out.len() >= entries {
                        return;
                    }
                }
                if cur.is_empty() {
                    cur.reserve_exact(cap);
                    group_end = (i / group + 1) * group;
                }
                cur.push(i);
            }
            if !cur.is_empty() {
                out.push(cur);
                if out.len() >= entries {
                    return;
                }
            }
        }
    }
}

/// The most fragment indices [`Placement::plan`] reserves for an entry at once.
const MAX_GROUP_CAPACITY: u64 = 256;

/// The receive vectors of one armed entry, by length: a header slot and a payload slot
/// per armed fragment, then a spill area that takes whatever does not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Payload slot lengths, one per armed fragment (each after its [`BULK_HEADER`] slot).
    pub payloads: Vec<usize>,
    /// Length of the spill area after the last slot.
    pub spill: usize,
}

/// One datagram of a read, as [`Layout::segments`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Exactly header slot `slot` followed by `len` bytes of its payload slot.
    Candidate {
        /// Offset in the logical stream (where its header slot starts).
        start: usize,
        /// Armed slot index.
        slot: usize,
        /// Payload bytes received.
        len: usize,
    },
    /// Anywhere else: bytes `start..start + len` of the read's logical stream (header
    /// slot, payload slot, header slot, ..., spill), to be gathered.
    Gather {
        /// Offset in the logical stream.
        start: usize,
        /// Length.
        len: usize,
    },
}

impl Layout {
    /// Total bytes the vectors can take.
    pub fn capacity(&self) -> usize {
        self.payloads.iter().map(|p| BULK_HEADER + p).sum::<usize>() + self.spill
    }

    /// Cuts a read of `n` bytes with segment size `seg` (a coalesced read; `None` or 0:
    /// one datagram) into datagrams, in order.
    pub fn segments(&self, n: usize, seg: Option<usize>, out: &mut Vec<Segment>) {
        out.clear();
        let n = n.min(self.capacity());
        let seg = seg.filter(|&s| s > 0).unwrap_or(n.max(1));
        let mut slot = 0usize; // next armed slot
        let mut slot_start = 0usize; // its logical start
        let mut at = 0usize;
        while at < n {
            let len = seg.min(n - at);
            // Skip slots that end before this datagram starts.
            while slot < self.payloads.len() && slot_start + BULK_HEADER + self.payloads[slot] <= at
            {
                slot_start += BULK_HEADER + self.payloads[slot];
                slot += 1;
            }
            let fits = slot < self.payloads.len()
                && at == slot_start
                && len > BULK_HEADER
                && len <= BULK_HEADER + self.payloads[slot];
            out.push(if fits {
                Segment::Candidate {
                    start: at,
                    slot,
                    len: len - BULK_HEADER,
                }
            } else {
                Segment::Gather { start: at, len }
            });
            at += len;
        }
    }
}

/// What a hit must be: the connection and transfer an armed entry waits for (a small
/// copy of the [`Placement`]'s identity, so a transport can check without borrowing it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// The connection's id and (when armed) the packet number it expected next: what
    /// verifies a fragment's header ([`parse_bulk`]).
    pub ctx: BulkContext,
    /// Transfer id.
    pub xfer: u64,
    /// Transfer length.
    pub total: u64,
    /// Fragment payload size.
    pub frag: u64,
    /// Bytes of the destination (fragments beyond it are not written).
    pub cap: u64,
}

impl Placement {
    /// What a hit for this transfer on the connection `ctx` describes must carry.
    pub fn expect(&self, ctx: BulkContext) -> Expect {
        Expect {
            ctx,
            xfer: self.xfer,
            total: self.total,
            frag: self.frag,
            cap: self.cap,
        }
    }
}

/// The verdict of [`check`] on a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The expected fragment, intact, at its place.
    Hit(BulkHeader),
    /// An intact fragment of the expected transfer that landed in another fragment's
    /// place (it fits its own place, inside the destination): a [`Displaced`] move.
    Displaced(BulkHeader),
    /// Anything else: gather it and take the ordinary path.
    Miss,
}

/// Verifies a candidate: `header` from its header slot, `payload` as it landed in the
/// destination at `offset` (the fragment offset the slot was armed for). A hit needs a valid bulk
/// datagram of the expected connection and transfer, for exactly that offset, with a
/// payload of the fragment's length.
pub fn check(e: &Expect, offset: u64, header: &[u8], payload: &[u8]) -> Check {
    debug_assert!(
        offset.is_multiple_of(e.frag),
        "armed at a fragment's offset"
    );
    match parse_bulk(e.ctx, header, payload) {
        Ok(h)
            if h.xfer == wire_xfer(e.xfer)
                && h.offset < e.total
                && (e.total - h.offset).min(e.frag) == payload.len() as u64 =>
        {
            // The armed offset is a fragment's: only another one needs the division.
            if h.offset == offset {
                Check::Hit(h)
            } else if h.offset.is_multiple_of(e.frag) && h.offset + payload.len() as u64 <= e.cap {
                Check::Displaced(h)
            } else {
                Check::Miss
            }
        }
        _ => Check::Miss,
    }
}

/// A fragment that landed at offset `from` of the destination but belongs at `to` (both
/// fragment offsets of one transfer, so two places are either the same or disjoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Displaced {
    /// Where it landed.
    pub from: u64,
    /// Where it belongs.
    pub to: u64,
    /// Its length.
    pub len: usize,
}

/// One step of the cleanup [`plan_moves`] orders, on the destination and one scratch
/// buffer of a fragment's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Copy `len` bytes at `from` into the scratch buffer.
    Save {
        /// Source offset.
        from: u64,
        /// Bytes.
        len: usize,
    },
    /// Copy `len` bytes from `from` to `to` (disjoint places).
    Copy {
        /// Source offset.
        from: u64,
        /// Target offset.
        to: u64,
        /// Bytes.
        len: usize,
    },
    /// Copy the scratch buffer's first `len` bytes to `to`.
    Restore {
        /// Target offset.
        to: u64,
        /// Bytes.
        len: usize,
    },
    /// Exchange the `len` bytes at `a` and at `b` (disjoint places): a cycle of two,
    /// each fragment in the other's place (neighbours swapped on the way), without the
    /// scratch buffer's extra copy.
    Swap {
        /// One place.
        a: u64,
        /// The other.
        b: u64,
        /// Bytes.
        len: usize,
    },
}

/// Carries out `moves` ([`plan_moves`]'s) on the destination `dest`, with `scratch` for
/// the fragment a cycle saves. Returns the bytes copied to their places (the saves not
/// counted).
///
/// # Panics
/// On a move outside `dest` (the places come from fragments [`check`] admitted: inside
/// the destination's capacity).
pub fn apply_moves(moves: &[Move], dest: &mut [u8], scratch: &mut Vec<u8>) -> usize {
    let mut copied = 0;
    for m in moves {
        match *m {
            Move::Save { from, len } => {
                scratch.clear();
                scratch.extend_from_slice(&dest[from as usize..from as usize + len]);
            }
            Move::Copy { from, to, len } => {
                dest.copy_within(from as usize..from as usize + len, to as usize);
                copied += len;
            }
            Move::Restore { to, len } => {
                dest[to as usize..to as usize + len].copy_from_slice(&scratch[..len]);
                copied += len;
            }
            Move::Swap { a, b, len } => {
                let (lo, hi) = (a.min(b) as usize, a.max(b) as usize);
                let (head, tail) = dest.split_at_mut(hi);
                head[lo..lo + len].swap_with_slice(&mut tail[..len]);
                copied += 2 * len;
            }
        }
    }
    copied
}

/// Orders the moves that put every displaced fragment of one read at its place, each
/// copied once, without overwriting one that has not moved yet: a fragment moves only
/// after the one occupying its place has moved out (chains are moved from their end); a
/// cycle of three or more saves one fragment in the scratch buffer first; a cycle of two
/// (A in B's place, B in A's: neighbours swapped) is one [`Move::Swap`]. The cleanup a miss
/// used to cost was two copies (out of the layout into a gather buffer before any cleanup
/// wrote, then into place); this is one, plus one per longer cycle.
///
/// `d`'s `from` places must be distinct, and so must its `to` places (the caller sends
/// a second fragment for the same place down the ordinary path). Places outside `d`'s
/// `from` and `to` are never touched.
pub fn plan_moves(d: &[Displaced], out: &mut Vec<Move>) {
    out.clear();
    // Who occupies a place: `from` -> index, sorted for lookups.
    let mut at: Vec<(u64, usize)> = d.iter().enumerate().map(|(i, x)| (x.from, i)).collect();
    at.sort_unstable();
    let occupant = |place: u64| {
        at.binary_search_by_key(&place, |&(f, _)| f)
            .ok()
            .map(|k| at[k].1)
    };
    let mut done = vec![false; d.len()];
    let mut chain = Vec::new();
    for i in 0..d.len() {
        if done[i] {
            continue;
        }
        // Follow i -> the fragment in i's place -> the one in its place ...
        chain.clear();
        chain.push(i);
        let mut cycle = false;
        let mut j = i;
        while let Some(k) = occupant(d[j].to).filter(|&k| !done[k]) {
            if k == i {
                cycle = true;
                break;
            }
            chain.push(k);
            j = k;
        }
        if cycle && chain.len() == 2 && d[chain[1]].len == d[i].len {
            out.push(Move::Swap {
                a: d[i].from,
                b: d[chain[1]].from,
                len: d[i].len,
            });
        } else if cycle {
            // i's place is taken by chain[1], ..., the last one's place is i's: save i,
            // then move the others from the end, then put i where it belongs.
            out.push(Move::Save {
                from: d[i].from,
                len: d[i].len,
            });
            for &k in chain[1..].iter().rev() {
                out.push(Move::Copy {
                    from: d[k].from,
                    to: d[k].to,
                    len: d[k].len,
                });
            }
            out.push(Move::Restore {
                to: d[i].to,
                len: d[i].len,
            });
        } else {
            // The last one's place is free (nobody displaced sits there, or it moved).
            for &k in chain.iter().rev() {
                out.push(Move::Copy {
                    from: d[k].from,
                    to: d[k].to,
                    len: d[k].len,
                });
            }
        }
        for &k in &chain {
            done[k] = true;
        }
    }
}

/// Whether speculation pays for the stream it is armed for.
///
/// A miss costs more than not speculating: the kernel writes the payload into the (cold)
/// destination at the wrong place and the cleanup moves it, where the copy path has the
/// kernel write hot socket slots and copies once. A sender or a path that misorders every
/// group would make every fragment pay that. So the receiver judges its armed reads in
/// windows of [`Confidence::WINDOW`] of the stream's fragments. A window loses when under
/// a fifth of them hit; two losing windows in a row turn speculation off for a while
/// ([`Confidence::BACKOFF_MIN`] datagrams read); then one window is armed again as a
/// probe, and if it loses too the backoff doubles, up to [`Confidence::BACKOFF_MAX`]. A
/// window that pays resets it all. On an ordinary stream losses and retransmissions cost
/// misses too (a retransmission read among new fragments puts the rest of the read one
/// group late: at 1% loss a few windows had 35-50% hits), but not two such windows in a row
/// below a fifth.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Confidence {
    hits: u64,
    misses: u64,
    /// The backoff the next losing window starts (0: none since the last that paid).
    backoff: u64,
    /// The last window lost (and started no backoff).
    strike: bool,
    /// Datagrams still to read with speculation off.
    left: u64,
}

impl Confidence {
    /// Fragments of the armed stream per judged window.
    pub const WINDOW: u64 = 256;
    /// Datagrams read unarmed after the first backoff.
    pub const BACKOFF_MIN: u64 = 4096;
    /// The longest backoff (at 1472-byte fragments about 390 MB, a fifth of a second at
    /// 2 GB/s): a stream that turns clean gets speculation back within that.
    pub const BACKOFF_MAX: u64 = 1 << 18;

    /// True when the next read may be armed.
    pub fn speculate(&self) -> bool {
        self.left == 0
    }

    /// Records an armed read: `hits` and `misses` among the armed stream's fragments in
    /// it (datagrams of other sources are not the stream's fault). Returns true when this
    /// read turned speculation off.
    pub fn armed(&mut self, hits: u64, misses: u64) -> bool {
        self.hits += hits;
        self.misses += misses;
        if self.hits + self.misses < Self::WINDOW {
            return false;
        }
        let lost = self.misses > 4 * self.hits;
        self.hits = 0;
        self.misses = 0;
        if !lost {
            self.backoff = 0;
            self.strike = false;
            return false;
        }
        if !self.strike && self.backoff == 0 {
            self.strike = true;
            return false;
        }
        self.strike = false;
        self.left = self.backoff.max(Self::BACKOFF_MIN);
        self.backoff = (self.left * 2).min(Self::BACKOFF_MAX);
        true
    }

    /// Records `datagrams` read while speculation was off.
    pub fn unarmed(&mut self, datagrams: u64) {
        self.left = self.left.saturating_sub(datagrams);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(xfer: u32, offset: u64) -> BulkHeader {
        BulkHeader {
            pn: 0,
            floor: 0,
            xfer,
            offset,
            hashed: true,
        }
    }

    #[test]
    fn mark_refuses_duplicates_and_strangers() {
        let mut p = Placement::new(7, 2500, 2500, 1000);
        assert_eq!(p.fragments(), 3);
        assert_eq!(p.mark(&hdr(7, 1000), 1000), Mark::New);
        assert_eq!(p.mark(&hdr(7, 1000), 1000), Mark::Duplicate);
        assert_eq!(p.mark(&hdr(8, 0), 1000), Mark::Invalid);
        assert_eq!(p.mark(&hdr(7, 500), 1000), Mark::Invalid);
        assert_eq!(p.mark(&hdr(7, 2000), 1000), Mark::Invalid);
        assert_eq!(p.mark(&hdr(7, 2000), 500), Mark::New);
        assert!(!p.complete());
        assert_eq!(p.mark(&hdr(7, 0), 1000), Mark::New);
        assert!(p.complete());
    }

    #[test]
    fn plan_follows_the_stream_then_the_holes() {
        let mut p = Placement::new(1, 10 * 100, 10 * 100, 100);
        let mut out = Vec::new();
        p.plan(4, 8, &mut out);
        assert_eq!(out, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        for i in [0u64, 1, 3, 4, 5] {
            assert_eq!(p.mark(&hdr(1, i * 100), 100), Mark::New);
        }
        p.plan(4, 8, &mut out);
        // After the highest placed (5): 6, 7 | 8, 9; then the hole 2.
        assert_eq!(out, vec![vec![6, 7], vec![8, 9], vec![2]]);
        p.plan(4, 2, &mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn plan_never_mixes_sender_groups() {
        let mut p = Placement::new(1, 1000, 1000, 100);
        for i in [0u64, 1, 4, 6, 7] {
            assert_eq!(p.mark(&hdr(1, i * 100), 100), Mark::New);
        }
        let mut out = Vec::new();
        p.plan(4, 8, &mut out);
        // After 7: 8, 9; then the holes 2, 3 | 5 (5 is in the group of 4..8, not 0..4).
        assert_eq!(out, vec![vec![8, 9], vec![2, 3], vec![5]]);
    }

    #[test]
    fn a_truncated_transfer_tracks_only_the_destination() {
        // A peer may announce any length: memory follows the 250-byte destination.
        let mut p = Placement::new(3, u64::MAX, 250, 100);
        assert_eq!(p.placed.len(), 1);
        assert_eq!(p.mark(&hdr(3, 0), 100), Mark::New);
        assert_eq!(p.mark(&hdr(3, 1000), 100), Mark::Beyond);
        assert_eq!(p.mark(&hdr(3, 100), 100), Mark::New);
        assert!(
            !p.complete(),
            "fragment 2 holds bytes 200..250 of the destination"
        );
        assert_eq!(p.mark(&hdr(3, 200), 100), Mark::New);
        assert!(p.complete());
        assert!(
            Placement::new(4, 500, 0, 100).complete(),
            "nothing to place"
        );
    }

    #[test]
    fn plan_skips_fragments_beyond_the_capacity() {
        let p = Placement::new(1, 1000, 450, 100);
        let mut out = Vec::new();
        p.plan(8, 4, &mut out);
        assert_eq!(out, vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn segments_find_candidates() {
        let l = Layout {
            payloads: vec![100, 100, 40],
            spill: 1000,
        };
        let mut out = Vec::new();
        let s = BULK_HEADER + 100;
        // A coalesced read of 3 full segments and a short one.
        l.segments(3 * s + 10, Some(s), &mut out);
        assert_eq!(
            out,
            vec![
                Segment::Candidate {
                    start: 0,
                    slot: 0,
                    len: 100
                },
                Segment::Candidate {
                    start: s,
                    slot: 1,
                    len: 100
                },
                Segment::Gather {
                    start: 2 * s,
                    len: s
                },
                Segment::Gather {
                    start: 3 * s,
                    len: 10
                },
            ]
        );
        // One short datagram fits slot 0.
        l.segments(BULK_HEADER + 40, None, &mut out);
        assert_eq!(
            out,
            vec![Segment::Candidate {
                start: 0,
                slot: 0,
                len: 40
            }]
        );
        // A read with another segment size straddles the slots.
        l.segments(400, Some(200), &mut out);
        assert_eq!(
            out,
            vec![
                Segment::Gather { start: 0, len: 200 },
                Segment::Gather {
                    start: 200,
                    len: 200
                }
            ]
        );
        // A shorter datagram at a slot's start is a candidate ([`check`] decides).
        l.segments(BULK_HEADER + 86, None, &mut out);
        assert_eq!(
            out,
            vec![Segment::Candidate {
                start: 0,
                slot: 0,
                len: 86
            }]
        );
    }

    /// `check` sorts a candidate: the expected fragment is a hit, another intact fragment
    /// of the transfer that fits its own place inside the destination is displaced, and
    /// anything else (another transfer, a damaged payload, an own place beyond the
    /// destination, a length that is not the fragment's) is a miss.
    #[test]
    fn check_tells_hits_displaced_fragments_and_misses_apart() {
        use crate::reliable::packet::Datagram;
        let e = Expect {
            ctx: BulkContext {
                conn: 9,
                next_pn: 0,
            },
            xfer: 7,
            total: 2500,
            frag: 1000,
            cap: 2000,
        };
        let dgram = |xfer: u32, offset: u64, len: usize| {
            let payload = vec![offset as u8; len];
            let mut out = Vec::new();
            Datagram::Bulk {
                conn: 9,
                hdr: BulkHeader {
                    pn: 1,
                    floor: 0,
                    xfer,
                    offset,
                    hashed: true,
                },
                payload: &payload,
            }
            .encode(&mut out);
            (out[..BULK_HEADER].to_vec(), out[BULK_HEADER..].to_vec())
        };
        let (h, p) = dgram(7, 1000, 1000);
        assert!(matches!(check(&e, 1000, &h, &p), Check::Hit(x) if x.offset == 1000));
        assert!(matches!(check(&e, 0, &h, &p), Check::Displaced(x) if x.offset == 1000));
        let (h0, p0) = dgram(7, 0, 1000);
        assert!(matches!(check(&e, 1000, &h0, &p0), Check::Displaced(x) if x.offset == 0));
        // The last fragment (500 bytes at 2000) lies beyond the 2000-byte destination.
        let (hl, pl) = dgram(7, 2000, 500);
        assert_eq!(check(&e, 0, &hl, &pl), Check::Miss);
        // Another transfer, a damaged payload, a length that is not the fragment's.
        let (hx, px) = dgram(8, 1000, 1000);
        assert_eq!(check(&e, 0, &hx, &px), Check::Miss);
        let mut bad = p.clone();
        bad[10] ^= 1;
        assert_eq!(check(&e, 0, &h, &bad), Check::Miss);
        let (hs, ps) = dgram(7, 1000, 400);
        assert_eq!(check(&e, 0, &hs, &ps), Check::Miss);
    }

    fn run_moves(moves: &[Move], dest: &mut [u8]) -> usize {
        apply_moves(moves, dest, &mut Vec::new())
    }

    #[test]
    fn a_swapped_pair_and_a_chain_each_move_once() {
        const F: u64 = 4;
        // Slots 0..6: 0 and 1 swapped (a cycle); 2 sits in 3's place, 3 in 4's (a chain
        // ending in a free place); 5 untouched.
        let d = [
            Displaced {
                from: 0,
                to: F,
                len: 4,
            },
            Displaced {
                from: F,
                to: 0,
                len: 4,
            },
            Displaced {
                from: 2 * F,
                to: 3 * F,
                len: 4,
            },
            Displaced {
                from: 3 * F,
                to: 4 * F,
                len: 4,
            },
        ];
        let mut dest: Vec<u8> = (0..24).collect();
        let mut moves = Vec::new();
        plan_moves(&d, &mut moves);
        assert_eq!(
            run_moves(&moves, &mut dest),
            16,
            "four fragments, one copy each"
        );
        assert!(
            moves.contains(&Move::Swap { a: 0, b: F, len: 4 }),
            "the pair is swapped: {moves:?}"
        );
        assert_eq!(&dest[0..4], &[4, 5, 6, 7]);
        assert_eq!(&dest[4..8], &[0, 1, 2, 3]);
        assert_eq!(&dest[12..16], &[8, 9, 10, 11]);
        assert_eq!(&dest[16..20], &[12, 13, 14, 15]);
        assert_eq!(
            &dest[20..24],
            &[20, 21, 22, 23],
            "an unnamed place is untouched"
        );
    }

    proptest::proptest! {
        /// Any set of displaced fragments (distinct landing places, distinct own places,
        /// possibly overlapping sets): after the moves every fragment is at its place,
        /// every place neither landed in nor owned is untouched, and each fragment is
        /// copied once (the one saved per cycle once more, into the scratch buffer).
        #[test]
        fn moves_put_every_displaced_fragment_at_its_place(
            slots in 2usize..40,
            picks in proptest::collection::vec((0usize..40, 0usize..40), 0..40),
            last_short in 1usize..8,
        ) {
            const F: usize = 8;
            // The last slot may be a short fragment; it can only move to or from itself
            // (lengths must match), so keep it out of other pairs.
            let len_of = |slot: usize| if slot + 1 == slots { last_short } else { F };
            let mut d = Vec::new();
            let (mut froms, mut tos) = (vec![false; slots], vec![false; slots]);
            for (a, b) in picks {
                let (a, b) = (a % slots, b % slots);
                if a == b || froms[a] || tos[b] || len_of(a) != len_of(b) {
                    continue;
                }
                froms[a] = true;
                tos[b] = true;
                d.push(Displaced { from: (a * F) as u64, to: (b * F) as u64, len: len_of(a) });
            }
            let size = slots * F;
            let before: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
            let mut dest = before.clone();
            let mut moves = Vec::new();
            plan_moves(&d, &mut moves);
            let copied = run_moves(&moves, &mut dest);
            for x in &d {
                let (f, t) = (x.from as usize, x.to as usize);
                proptest::prop_assert_eq!(&dest[t..t + x.len], &before[f..f + x.len]);
            }
            for slot in 0..slots {
                if !froms[slot] && !tos[slot] {
                    let r = slot * F..slot * F + len_of(slot);
                    proptest::prop_assert_eq!(&dest[r.clone()], &before[r]);
                }
            }
            let total: usize = d.iter().map(|x| x.len).sum();
            proptest::prop_assert_eq!(copied, total);
            let saves = moves.iter().filter(|m| matches!(m, Move::Save { .. })).count();
            proptest::prop_assert!(saves <= d.len() / 3, "at most one save per cycle of three or more");
        }
    }

    #[test]
    fn confidence_backs_off_losing_windows_and_doubles_up_to_the_cap() {
        let mut c = Confidence::default();
        assert!(c.speculate());
        // A window of mostly hits, with a few misses (a loss), keeps speculating.
        assert!(!c.armed(200, 20));
        assert!(!c.armed(30, 6));
        assert!(c.speculate());
        // One losing window (under a fifth hit) is a strike, not yet a backoff; a window
        // that pays clears it.
        assert!(!c.armed(40, 216));
        assert!(!c.armed(100, 156));
        assert!(!c.armed(10, 100));
        assert!(!c.armed(10, 136));
        assert!(c.speculate());
        // Two in a row: off for the minimum backoff.
        assert!(c.armed(50, 206));
        assert!(!c.speculate());
        c.unarmed(Confidence::BACKOFF_MIN - 1);
        assert!(!c.speculate());
        c.unarmed(1);
        assert!(c.speculate());
        // Each losing probe after it doubles it, up to the cap.
        let mut expect = Confidence::BACKOFF_MIN;
        for _ in 0..10 {
            assert!(c.armed(0, Confidence::WINDOW));
            expect = (expect * 2).min(Confidence::BACKOFF_MAX);
            c.unarmed(expect - 1);
            assert!(!c.speculate(), "{c:?}");
            c.unarmed(1);
            assert!(c.speculate());
        }
        assert_eq!(expect, Confidence::BACKOFF_MAX);
        // A window that pays resets it: the next backoff takes two losing windows again
        // and is the minimum.
        assert!(!c.armed(Confidence::WINDOW, 0));
        assert!(!c.armed(0, Confidence::WINDOW));
        assert!(c.armed(0, Confidence::WINDOW));
        c.unarmed(Confidence::BACKOFF_MIN);
        assert!(c.speculate());
        // A fifth of hits is not a losing window.
        assert!(!c.armed(Confidence::WINDOW / 5, Confidence::WINDOW * 4 / 5));
        assert!(!c.armed(Confidence::WINDOW / 5, Confidence::WINDOW * 4 / 5));
        assert!(c.speculate());
    }
}
