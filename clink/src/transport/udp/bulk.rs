//! Bulk (rendezvous) transfers of one UDP link: the sources the connection reads at each
//! transmission (the sender's own buffer, no staging copy) and the destinations the
//! fragments land in (the posted receive buffer), speculatively or by the cleanup copy.
//!
//! The memory behind the raw pointers belongs to the endpoint's send and receive
//! requests, which stay alive (and their buffers in place) until the transfer reports
//! done here or the link is cleared ([`Bulk::clear`]) when the peer fails.

use clink_proto::reliable::BulkHeader;
use clink_proto::spec::{Expect, Mark, Placement};

/// A transfer being sent: the caller's bytes.
struct Source {
    xfer: u64,
    ptr: *const u8,
    len: usize,
}

/// A transfer being received into the caller's buffer.
struct Dest {
    pl: Placement,
    ptr: *mut u8,
}

/// Counters of the bulk path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkStats {
    /// Fragments found at their place by a speculative receive (zero copies).
    pub hits: u64,
    /// Payload bytes of those.
    pub hit_bytes: u64,
    /// Payload bytes copied to their place by the ordinary path (misses, unarmed reads,
    /// speculation off) or moved there from another fragment's place.
    pub cleanup_bytes: u64,
    /// Fragments a speculative receive found in another's place and moved to their own
    /// (one copy, not the ordinary path's two).
    pub moved: u64,
}

/// What a speculative receive arms for one link: where the fragments go and which.
pub struct Arm {
    /// What a hit must carry.
    pub expect: Expect,
    /// Destination start.
    pub dest: *mut u8,
    /// Per receive entry, the (offset, length) of each armed fragment.
    pub entries: Vec<Vec<(u64, usize)>>,
}

/// The bulk transfers of one link.
#[derive(Default)]
pub struct Bulk {
    /// Few at a time (one per rendezvous send in flight): a vector beats hashing on the
    /// per-datagram lookup.
    out: Vec<Source>,
    dests: Vec<Dest>,
    plan: Vec<Vec<u64>>,
    /// Changes whenever what [`Bulk::arm`] would return may change.
    gen: u64,
    /// Transfers received completely since the endpoint last looked.
    pub done_in: Vec<u64>,
    /// Transfers sent and acknowledged since the endpoint last looked.
    pub done_out: Vec<u64>,
    /// Counters.
    pub stats: BulkStats,
}

// SAFETY: the raw pointers are into request buffers owned by the endpoint that owns this
// link; they move with it between threads and are only used by its (single) driver.
unsafe impl Send for Bulk {}

impl Bulk {
    /// Registers the source of transfer `xfer`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay valid and unchanged until `xfer` appears in
    /// [`Bulk::done_out`] or [`Bulk::clear`] is called.
    pub unsafe fn add_source(&mut self, xfer: u64, ptr: *const u8, len: usize) {
        self.out.push(Source { xfer, ptr, len });
    }

    /// Registers the destination of transfer `xfer`: `total` bytes arriving in fragments of
    /// `frag`, of which the first `cap` fit at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + min(cap, total)` must stay valid for writes, and untouched by anyone
    /// else, until `xfer` appears in [`Bulk::done_in`] or [`Bulk::clear`] is called.
    pub unsafe fn add_dest(&mut self, xfer: u64, total: u64, ptr: *mut u8, cap: u64, frag: usize) {
        self.dests.push(Dest {
            pl: Placement::new(xfer, total, cap, frag),
            ptr,
        });
        self.gen += 1;
        // A zero-byte destination has nothing to wait for.
        self.finish_if_complete(self.dests.len() - 1);
    }

    /// A number that changes whenever the layout to arm may change (a fragment placed, a
    /// transfer added, finished or cleared): a transport re-plans only then.
    pub fn generation(&self) -> u64 {
        self.gen
    }

    /// Forgets every transfer (the peer failed): no pointer is used afterwards.
    pub fn clear(&mut self) {
        self.out.clear();
        self.dests.clear();
        self.gen += 1;
    }

    /// True while a transfer is being sent (not yet acknowledged).
    pub fn sending(&self) -> bool {
        !self.out.is_empty()
    }

    /// True while a transfer is being received.
    pub fn receiving(&self) -> bool {
        !self.dests.is_empty()
    }

    /// The `len` bytes of transfer `xfer` from `off`, in the sender's buffer; `None` when
    /// there is no such source or range. They stay valid (beyond this borrow) until the
    /// transfer is over, by the contract of [`Bulk::add_source`].
    pub fn source(&self, xfer: u64, off: u64, len: usize) -> Option<&[u8]> {
        let s = self.out.iter().find(|s| s.xfer == xfer)?;
        (off as usize).checked_add(len).filter(|&e| e <= s.len)?;
        // SAFETY: in bounds of a source kept valid by the contract of `add_source`.
        Some(unsafe { std::slice::from_raw_parts(s.ptr.add(off as usize), len) })
    }

    /// The sender's side of a transfer is over (acknowledged).
    pub fn sent(&mut self, xfer: u64) {
        if let Some(i) = self.out.iter().position(|s| s.xfer == xfer) {
            self.out.swap_remove(i);
            self.done_out.push(xfer);
        }
    }

    /// The ordinary path's placement (a miss, an unarmed read, speculation off): copies a
    /// new fragment's payload to its place (the part inside the destination). False when
    /// no transfer of that id is being received.
    pub fn place(&mut self, hdr: &BulkHeader, payload: &[u8]) -> bool {
        let Some(i) = self.dests.iter().position(|d| d.pl.xfer() == hdr.xfer) else {
            return false;
        };
        let d = &mut self.dests[i];
        if d.pl.mark(hdr, payload.len()) == Mark::New {
            self.gen += 1;
            let cap = d.pl.cap();
            if hdr.offset < cap {
                let n = (payload.len() as u64).min(cap - hdr.offset) as usize;
                // SAFETY: `offset + n <= cap`, inside the destination of `add_dest`; the
                // fragment was missing, so nothing valid is overwritten.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        payload.as_ptr(),
                        d.ptr.add(hdr.offset as usize),
                        n,
                    )
                };
                self.stats.cleanup_bytes += n as u64;
            }
            self.finish_if_complete(i);
        }
        true
    }

    /// A speculative hit the connection accepted as new: its bytes are in place.
    pub fn placed(&mut self, hdr: &BulkHeader, len: usize) {
        let Some(i) = self.dests.iter().position(|d| d.pl.xfer() == hdr.xfer) else {
            return;
        };
        if self.dests[i].pl.mark(hdr, len) == Mark::New {
            self.gen += 1;
            self.stats.hits += 1;
            self.stats.hit_bytes += len as u64;
            self.finish_if_complete(i);
        }
    }

    /// A fragment the speculative receive found in another's place, moved to its own
    /// (one copy) and accepted by the connection as new.
    pub fn moved(&mut self, hdr: &BulkHeader, len: usize) {
        let Some(i) = self.dests.iter().position(|d| d.pl.xfer() == hdr.xfer) else {
            return;
        };
        if self.dests[i].pl.mark(hdr, len) == Mark::New {
            self.gen += 1;
            self.stats.cleanup_bytes += len as u64;
            self.stats.moved += 1;
            self.finish_if_complete(i);
        }
    }

    fn finish_if_complete(&mut self, i: usize) {
        if self.dests[i].pl.complete() {
            // In order: the first one is the oldest, the transfer a speculative receive
            // arms for (a swap moved the newest to the front, and the next transfer's
            // fragments then arrived in a layout armed for another).
            let d = self.dests.remove(i);
            self.done_in.push(d.pl.xfer());
        }
    }

    /// The layout to arm for the oldest transfer the sender is still streaming (the oldest
    /// one whose fragments beyond its highest placed one are missing, see
    /// [`Placement::streaming`]), else the oldest: up to `entries` receive entries of at
    /// most `group` fragments each (see [`Placement::plan`]). A transfer that waits only
    /// for retransmissions does not hold the layout while the next one streams.
    pub fn arm(&mut self, conn: u32, group: u64, entries: usize) -> Option<Arm> {
        let d = self
            .dests
            .iter()
            .find(|d| d.pl.streaming())
            .or(self.dests.first())?;
        d.pl.plan(group, entries, &mut self.plan);
        if self.plan.is_empty() {
            return None;
        }
        Some(Arm {
            expect: d.pl.expect(conn),
            dest: d.ptr,
            entries: self
                .plan
                .iter()
                .map(|e| e.iter().map(|&i| d.pl.fragment(i)).collect())
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(xfer: u64, k: u64) -> BulkHeader {
        BulkHeader {
            pn: k,
            floor: 0,
            xfer,
            offset: k * 1024,
            total: 4096,
            hashed: false,
        }
    }

    /// A `Bulk` receiving transfers 1..=n of 4 KiB in 1 KiB fragments, with their buffers
    /// (keep them while it is used: it points into them).
    fn receiving(n: usize) -> (Vec<Vec<u8>>, Bulk) {
        let mut bufs = vec![vec![0u8; 4096]; n];
        let mut b = Bulk::default();
        for (x, buf) in bufs.iter_mut().enumerate() {
            // SAFETY: the buffers move out with `b` (their heap memory stays put) and the
            // caller keeps them while it uses `b`; nothing else touches them.
            unsafe { b.add_dest(x as u64 + 1, 4096, buf.as_mut_ptr(), 4096, 1024) };
        }
        (bufs, b)
    }

    /// A transfer waiting only for retransmissions (holes below its highest fragment)
    /// leaves the layout to the next one, which the sender streams meanwhile; one whose
    /// end is still to come keeps it.
    #[test]
    fn the_layout_goes_to_the_transfer_still_streaming() {
        let (_bufs, mut b) = receiving(2);
        b.placed(&frag(1, 0), 1024);
        assert_eq!(
            b.arm(7, 4, 8).expect("armed").expect.xfer,
            1,
            "1 streams on"
        );
        b.placed(&frag(1, 2), 1024);
        b.placed(&frag(1, 3), 1024);
        let arm = b.arm(7, 4, 8).expect("armed");
        assert_eq!(arm.expect.xfer, 2, "1 only waits for its fragment 1");
        assert_eq!(arm.entries[0][0], (0, 1024));
        b.place(&frag(1, 1), &[0; 1024]);
        assert_eq!(b.done_in, vec![1]);
        assert_eq!(b.arm(7, 4, 8).expect("armed").expect.xfer, 2);
    }

    /// With three receives posted, the first one finishing leaves the next oldest to
    /// arm, whichever finishes: the layout follows the order the sender streams them in.
    #[test]
    fn the_oldest_unfinished_transfer_is_armed() {
        let (_bufs, mut b) = receiving(3);
        assert_eq!(b.arm(7, 4, 8).expect("armed").expect.xfer, 1);
        for k in 0..4 {
            b.placed(&frag(1, k), 1024);
        }
        assert_eq!(b.done_in, vec![1]);
        let arm = b.arm(7, 4, 8).expect("armed");
        assert_eq!(arm.expect.xfer, 2, "the next oldest, not the newest");
        assert_eq!(arm.expect.conn, 7);
        assert_eq!(
            arm.entries,
            vec![vec![(0, 1024), (1024, 1024), (2048, 1024), (3072, 1024)]]
        );
    }
}
