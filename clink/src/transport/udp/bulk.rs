//! Bulk (rendezvous) transfers of one UDP link: the sources the connection reads at each
//! transmission (the sender's own buffer, no staging copy) and the destinations the
//! fragments land in (the posted receive buffer), speculatively or by the cleanup copy.
//!
//! The memory is lent by the endpoint's send and receive requests (`crate::lease`);
//! a transfer's lease is dropped here when the transfer reports done or the link is
//! cleared ([`Bulk::clear`]) when the peer fails.

use crate::lease::{Dst, Src};
use clink_proto::reliable::packet::wire_xfer;
use clink_proto::reliable::{BulkContext, BulkHeader};
use clink_proto::spec::{Expect, Mark, Placement};

/// A transfer being sent: the caller's bytes.
struct Source {
    xfer: u64,
    src: Src,
}

/// A transfer being received into the caller's buffer.
struct Dest {
    pl: Placement,
    dst: Dst,
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
    /// The destination.
    pub dest: Dst,
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

impl Bulk {
    /// Registers the source of transfer `xfer`, held until `xfer` appears in
    /// [`Bulk::done_out`] or [`Bulk::clear`] is called.
    pub fn add_source(&mut self, xfer: u64, src: Src) {
        self.out.push(Source { xfer, src });
    }

    /// Registers the destination of transfer `xfer`: `total` bytes arriving in fragments of
    /// `frag`, of which the first `dst.len()` fit (held until `xfer` appears in
    /// [`Bulk::done_in`] or [`Bulk::clear`] is called).
    pub fn add_dest(&mut self, xfer: u64, total: u64, dst: Dst, frag: usize) {
        self.dests.push(Dest {
            pl: Placement::new(xfer, total, dst.len() as u64, frag),
            dst,
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
    /// there is no such source or range.
    pub fn source(&self, xfer: u64, off: u64, len: usize) -> Option<&[u8]> {
        let s = self.out.iter().find(|s| s.xfer == xfer)?;
        s.src.range(usize::try_from(off).ok()?, len)
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
        let Some(i) = self.dest_of(hdr) else {
            return false;
        };
        let d = &mut self.dests[i];
        if d.pl.mark(hdr, payload.len()) == Mark::New {
            self.gen += 1;
            let cap = d.pl.cap();
            if hdr.offset < cap {
                let n = (payload.len() as u64).min(cap - hdr.offset) as usize;
                // Inside the destination (`offset + n <= cap`); the fragment was missing,
                // so nothing valid is overwritten.
                d.dst.write(hdr.offset as usize, &payload[..n]);
                self.stats.cleanup_bytes += n as u64;
            }
            self.finish_if_complete(i);
        }
        true
    }

    /// A speculative hit the connection accepted as new: its bytes are in place.
    pub fn placed(&mut self, hdr: &BulkHeader, len: usize) {
        let Some(i) = self.dest_of(hdr) else {
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
        let Some(i) = self.dest_of(hdr) else {
            return;
        };
        if self.dests[i].pl.mark(hdr, len) == Mark::New {
            self.gen += 1;
            self.stats.cleanup_bytes += len as u64;
            self.stats.moved += 1;
            self.finish_if_complete(i);
        }
    }

    /// The transfer a fragment belongs to: the oldest whose id has the low 32 bits it
    /// carries ([`wire_xfer`]). An honest sender's ids of transfers under way at once
    /// differ there (its request ids count up by one, so they would need four billion
    /// requests between them); a peer that sends two whose ids differ only above them
    /// fills the older one first, and the newer waits for its fragments.
    fn dest_of(&self, hdr: &BulkHeader) -> Option<usize> {
        self.dests
            .iter()
            .position(|d| wire_xfer(d.pl.xfer()) == hdr.xfer)
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
    pub fn arm(&mut self, ctx: BulkContext, group: u64, entries: usize) -> Option<Arm> {
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
            expect: d.pl.expect(ctx),
            dest: d.dst.clone(),
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

    fn frag(xfer: u32, k: u64) -> BulkHeader {
        BulkHeader {
            pn: k,
            floor: 0,
            xfer,
            offset: k * 1024,
            hashed: false,
        }
    }

    const CTX: BulkContext = BulkContext {
        conn: 7,
        next_pn: 0,
    };

    /// A `Bulk` receiving transfers 1..=n of 4 KiB in 1 KiB fragments.
    fn receiving(n: usize) -> Bulk {
        let mut b = Bulk::default();
        for x in 0..n {
            let buf = Box::leak(vec![0u8; 4096].into_boxed_slice());
            b.add_dest(x as u64 + 1, 4096, Dst::from_static(buf), 1024);
        }
        b
    }

    /// A transfer waiting only for retransmissions (holes below its highest fragment)
    /// leaves the layout to the next one, which the sender streams meanwhile; one whose
    /// end is still to come keeps it.
    #[test]
    fn the_layout_goes_to_the_transfer_still_streaming() {
        let mut b = receiving(2);
        b.placed(&frag(1, 0), 1024);
        assert_eq!(
            b.arm(CTX, 4, 8).expect("armed").expect.xfer,
            1,
            "1 streams on"
        );
        b.placed(&frag(1, 2), 1024);
        b.placed(&frag(1, 3), 1024);
        let arm = b.arm(CTX, 4, 8).expect("armed");
        assert_eq!(arm.expect.xfer, 2, "1 only waits for its fragment 1");
        assert_eq!(arm.entries[0][0], (0, 1024));
        b.place(&frag(1, 1), &[0; 1024]);
        assert_eq!(b.done_in, vec![1]);
        assert_eq!(b.arm(CTX, 4, 8).expect("armed").expect.xfer, 2);
    }

    /// With three receives posted, the first one finishing leaves the next oldest to
    /// arm, whichever finishes: the layout follows the order the sender streams them in.
    #[test]
    fn the_oldest_unfinished_transfer_is_armed() {
        let mut b = receiving(3);
        assert_eq!(b.arm(CTX, 4, 8).expect("armed").expect.xfer, 1);
        for k in 0..4 {
            b.placed(&frag(1, k), 1024);
        }
        assert_eq!(b.done_in, vec![1]);
        let arm = b.arm(CTX, 4, 8).expect("armed");
        assert_eq!(arm.expect.xfer, 2, "the next oldest, not the newest");
        assert_eq!(arm.expect.ctx.conn, 7);
        assert_eq!(
            arm.entries,
            vec![vec![(0, 1024), (1024, 1024), (2048, 1024), (3072, 1024)]]
        );
    }
}
