//! The receives an endpoint has posted: where each one's bytes go and what its completion
//! reports, in a table indexed by the word clink keeps for each receive.

use super::*;

/// Where a receive's bytes go.
pub(super) enum Dest {
    /// Straight into one caller buffer.
    Direct { buf: *mut u8, cap: usize },
    /// Into a buffer of the provider's (a posted receive's `staging`, a claim's), then
    /// scattered over the caller's iovecs (boxed: the common receive stays small to move).
    Scatter(Box<Scattered>),
}

/// The caller's iovecs of a receive into several buffers.
pub(super) struct Scattered {
    pub(super) iovs: Vec<(*mut u8, usize)>,
    /// Where a posted receive's message lands before it is scattered (empty for a claim,
    /// whose message is in the provider's buffer).
    pub(super) staging: Vec<u8>,
}

impl Dest {
    pub(super) fn scatter_over(iovs: Vec<(*mut u8, usize)>, staging: Vec<u8>) -> Dest {
        Dest::Scatter(Box::new(Scattered { iovs, staging }))
    }

    pub(super) fn first(&self) -> *mut c_void {
        match self {
            Dest::Direct { buf, .. } => *buf as *mut c_void,
            Dest::Scatter(s) => s
                .iovs
                .first()
                .map_or(std::ptr::null_mut(), |s| s.0 as *mut c_void),
        }
    }

    /// Copies `data` over the iovecs; returns how much fitted.
    pub(super) unsafe fn scatter(&self, data: &[u8]) -> usize {
        let mut off = 0;
        if let Dest::Scatter(s) = self {
            for &(p, n) in &s.iovs {
                let k = n.min(data.len() - off);
                // SAFETY: the caller's iovec of `n` bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(off), p, k) };
                off += k;
            }
        }
        off
    }
}

/// A receive posted to clink, or kept by the provider until then (see [`State::lazy`]).
pub(super) struct PostedRecv {
    /// Clink's request (`None` while the receive is one of [`State::lazy`]).
    pub(super) req: Option<RecvRequest>,
    pub(super) ctx: *mut c_void,
    pub(super) dest: Dest,
    pub(super) report: bool,
    /// The receive's tag, and whether it wants that tag exactly (no ignored bits): what a
    /// failure reports.
    pub(super) tag: u64,
    pub(super) exact: bool,
}

impl PostedRecv {
    /// A receive the provider keeps rather than hands to clink ([`State::lazy`]).
    pub(super) fn kept(sel: Selector, ctx: *mut c_void, dest: Dest, report: bool) -> PostedRecv {
        PostedRecv {
            req: None,
            ctx,
            dest,
            report,
            tag: sel.tag,
            exact: sel.mask == u64::MAX,
        }
    }

    /// Queues its completion (if it is to be reported) on `cq`, or its truncation: a
    /// message of `full` bytes with `tag` from address `src`, `len` of them landed.
    pub(super) fn report(
        &self,
        cq: &CqShared,
        msg: bool,
        len: usize,
        full: usize,
        tag: u64,
        src: u64,
    ) {
        let e = tagged_entry(msg, self.ctx, RX, len, self.dest.first(), tag);
        report_received(cq, e, full, self.report, src);
    }
}

/// The posted receives, by the word clink keeps for each
/// (`Endpoint::irecv_raw_user`): its slot's index plus one, 0 meaning none. A completion
/// finds its receive by index, without a look-up.
#[derive(Default)]
pub(super) struct Posted {
    slots: Vec<Option<PostedRecv>>,
    free: Vec<usize>,
}

impl Posted {
    /// A slot for a receive about to be posted ([`Posted::fill`] or [`Posted::release`]).
    #[inline(always)]
    pub(super) fn reserve(&mut self) -> u64 {
        let i = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        i as u64 + 1
    }

    #[inline(always)]
    pub(super) fn fill(&mut self, user: u64, r: PostedRecv) {
        self.slots[user as usize - 1] = Some(r);
    }

    pub(super) fn release(&mut self, user: u64) {
        self.free.push(user as usize - 1);
    }

    pub(super) fn get(&self, user: u64) -> Option<&PostedRecv> {
        self.slots.get((user as usize).checked_sub(1)?)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, user: u64) -> Option<&mut PostedRecv> {
        self.slots
            .get_mut((user as usize).checked_sub(1)?)?
            .as_mut()
    }

    /// Takes the receive out, freeing its slot.
    pub(super) fn take(&mut self, user: u64) -> Option<PostedRecv> {
        let i = (user as usize).checked_sub(1)?;
        let r = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        Some(r)
    }

    /// The word of the receive posted with context `ctx`.
    pub(super) fn find(&self, ctx: *mut c_void) -> Option<u64> {
        let i = self
            .slots
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.ctx == ctx))?;
        Some(i as u64 + 1)
    }
}
