//! Tag matching: posted receives against arrived messages.
//!
//! A receive names a source (a peer or any peer), a tag and a mask; a message matches when
//! `msg_tag & mask == tag & mask`. Both queues are kept in arrival order, so the first
//! matching entry is always taken: that, with each peer's frames arriving in order, gives
//! delivery in order per (sender, tag). Queues are linear lists, as in MPI implementations:
//! the common case is a short posted queue hit at its head.

use crate::PeerId;
use std::collections::VecDeque;

/// What a receive accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selector {
    /// Only this peer, or any peer when `None`.
    pub src: Option<PeerId>,
    /// Wanted tag bits.
    pub tag: u64,
    /// Which tag bits must match (`!0` for exact, `0` for any tag).
    pub mask: u64,
}

impl Selector {
    /// Exactly `tag` from `src` (or any peer).
    pub fn exact(src: Option<PeerId>, tag: u64) -> Self {
        Selector { src, tag, mask: !0 }
    }
    /// Any tag from any peer.
    pub fn any() -> Self {
        Selector {
            src: None,
            tag: 0,
            mask: 0,
        }
    }
    /// True when a message from `src` with `tag` is accepted.
    #[inline]
    pub fn matches(&self, src: PeerId, tag: u64) -> bool {
        self.src.is_none_or(|s| s == src) && (tag & self.mask) == (self.tag & self.mask)
    }
}

/// A message that arrived before any receive matched it.
#[derive(Debug, PartialEq, Eq)]
pub struct Unexpected<U> {
    /// Sender.
    pub src: PeerId,
    /// Tag.
    pub tag: u64,
    /// The runtime's record of the message (its bytes, or a rendezvous descriptor).
    pub item: U,
}

/// Posted receives (`R`: the runtime's receive token) and unexpected messages (`U`).
#[derive(Debug)]
pub struct Matcher<R, U> {
    posted: VecDeque<(Selector, R)>,
    unexpected: VecDeque<Unexpected<U>>,
}

impl<R, U> Default for Matcher<R, U> {
    fn default() -> Self {
        Matcher {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
        }
    }
}

impl<R: PartialEq, U> Matcher<R, U> {
    /// Posts a receive: returns the first matching unexpected message, or queues the
    /// receive and returns `None`.
    pub fn post(&mut self, sel: Selector, token: R) -> Option<(R, Unexpected<U>)> {
        match self
            .unexpected
            .iter()
            .position(|u| sel.matches(u.src, u.tag))
        {
            Some(i) => self.unexpected.remove(i).map(|u| (token, u)),
            None => {
                self.posted.push_back((sel, token));
                None
            }
        }
    }

    /// A message arrived: returns the first matching posted receive (removed), or keeps the
    /// message as unexpected and returns `None`.
    pub fn arrive(&mut self, src: PeerId, tag: u64, item: U) -> Option<(R, U)> {
        match self.take_posted(src, tag) {
            Some(r) => Some((r, item)),
            None => {
                self.push_unexpected(src, tag, item);
                None
            }
        }
    }

    /// A message arrived: removes and returns the first matching posted receive, if any.
    /// With [`Matcher::push_unexpected`] this splits [`Matcher::arrive`] so the runtime can
    /// decide where to copy the bytes before it copies anything.
    pub fn take_posted(&mut self, src: PeerId, tag: u64) -> Option<R> {
        let i = self.posted.iter().position(|(s, _)| s.matches(src, tag))?;
        // Usually the first: a pop, not the general removal's shifting.
        let taken = if i == 0 {
            self.posted.pop_front()
        } else {
            self.posted.remove(i)
        };
        taken.map(|(_, r)| r)
    }

    /// True when a posted receive would take a message from `src` with `tag`.
    pub fn has_posted_for(&self, src: PeerId, tag: u64) -> bool {
        self.posted.iter().any(|(s, _)| s.matches(src, tag))
    }

    /// Keeps a message no posted receive wanted (call after [`Matcher::take_posted`]
    /// returned `None`).
    pub fn push_unexpected(&mut self, src: PeerId, tag: u64, item: U) {
        self.unexpected.push_back(Unexpected { src, tag, item });
    }

    /// True when an unexpected message matches `sel` (so a new receive must take it first).
    pub fn has_unexpected(&self, sel: &Selector) -> bool {
        self.unexpected.iter().any(|u| sel.matches(u.src, u.tag))
    }

    /// The first unexpected message matching `sel`, without removing it.
    pub fn probe(&self, sel: &Selector) -> Option<&Unexpected<U>> {
        self.unexpected.iter().find(|u| sel.matches(u.src, u.tag))
    }

    /// Removes and returns the first unexpected message matching `sel`.
    pub fn take_unexpected(&mut self, sel: &Selector) -> Option<Unexpected<U>> {
        let i = self
            .unexpected
            .iter()
            .position(|u| sel.matches(u.src, u.tag))?;
        self.unexpected.remove(i)
    }

    /// Withdraws a posted receive; true when it was still queued.
    pub fn cancel(&mut self, token: &R) -> bool {
        match self.posted.iter().position(|(_, r)| r == token) {
            Some(i) => {
                self.posted.remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes the posted receives that can only be satisfied by `peer` (it died), and
    /// returns their tokens.
    pub fn drain_posted_from(&mut self, peer: PeerId) -> Vec<R> {
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(self.posted.len());
        for (s, r) in self.posted.drain(..) {
            if s.src == Some(peer) {
                out.push(r);
            } else {
                keep.push_back((s, r));
            }
        }
        self.posted = keep;
        out
    }

    /// Removes unexpected messages from `peer` that `keep` rejects (e.g. rendezvous
    /// descriptors whose memory died with the peer), returning them.
    pub fn drain_unexpected_from(
        &mut self,
        peer: PeerId,
        mut keep: impl FnMut(&U) -> bool,
    ) -> Vec<Unexpected<U>> {
        let mut out = Vec::new();
        let mut rest = VecDeque::with_capacity(self.unexpected.len());
        for u in self.unexpected.drain(..) {
            if u.src == peer && !keep(&u.item) {
                out.push(u);
            } else {
                rest.push_back(u);
            }
        }
        self.unexpected = rest;
        out
    }

    /// The sources named by posted receives (with repeats; any-source receives name none).
    pub fn posted_sources(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.posted.iter().filter_map(|(s, _)| s.src)
    }

    /// Number of posted receives.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }
    /// Number of unexpected messages.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Post {
            src: Option<u32>,
            tag: u64,
            mask: u64,
        },
        Arrive {
            src: u32,
            tag: u64,
        },
        Cancel(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                proptest::option::of(0u32..3),
                0u64..4,
                prop_oneof![Just(!0u64), Just(0u64), Just(1u64)]
            )
                .prop_map(|(src, tag, mask)| Op::Post { src, tag, mask }),
            (0u32..3, 0u64..4).prop_map(|(src, tag)| Op::Arrive { src, tag }),
            (0usize..50).prop_map(Op::Cancel),
        ]
    }

    proptest! {
        /// Against a naive model: every message is delivered at most once, to the oldest
        /// matching receive, and per (src, tag) in arrival order.
        #[test]
        fn matches_naive_model(ops in proptest::collection::vec(op(), 0..200)) {
            let mut m: Matcher<usize, u64> = Matcher::default();
            let mut posted: Vec<(Selector, usize)> = Vec::new();
            let mut unexp: Vec<(PeerId, u64, u64)> = Vec::new();
            let mut delivered: Vec<(usize, PeerId, u64, u64)> = Vec::new();
            let mut next_tok = 0usize;
            let mut next_seq = 0u64;
            for o in ops {
                match o {
                    Op::Post { src, tag, mask } => {
                        let sel = Selector { src: src.map(PeerId), tag, mask };
                        let tok = next_tok; next_tok += 1;
                        let got = m.post(sel, tok);
                        let want = unexp.iter().position(|&(s, t, _)| sel.matches(s, t));
                        match (got, want) {
                            (Some((r, u)), Some(i)) => {
                                let (s, t, q) = unexp.remove(i);
                                prop_assert_eq!((r, u.src, u.tag, u.item), (tok, s, t, q));
                                delivered.push((tok, s, t, q));
                            }
                            (None, None) => posted.push((sel, tok)),
                            (g, w) => prop_assert!(false, "mismatch {:?} {:?}", g, w),
                        }
                    }
                    Op::Arrive { src, tag } => {
                        let seq = next_seq; next_seq += 1;
                        let got = m.arrive(PeerId(src), tag, seq);
                        let want = posted.iter().position(|(s, _)| s.matches(PeerId(src), tag));
                        match (got, want) {
                            (Some((r, q)), Some(i)) => {
                                let (_, tok) = posted.remove(i);
                                prop_assert_eq!((r, q), (tok, seq));
                                delivered.push((tok, PeerId(src), tag, seq));
                            }
                            (None, None) => unexp.push((PeerId(src), tag, seq)),
                            (g, w) => prop_assert!(false, "mismatch {:?} {:?}", g, w),
                        }
                    }
                    Op::Cancel(i) => {
                        if !posted.is_empty() {
                            let (_, tok) = posted.remove(i % posted.len());
                            prop_assert!(m.cancel(&tok));
                            prop_assert!(!m.cancel(&tok));
                        }
                    }
                }
                prop_assert_eq!(m.posted_len(), posted.len());
                prop_assert_eq!(m.unexpected_len(), unexp.len());
            }
            // Order per (src, tag): taken in posting order, the messages of one pair come in
            // arrival order.
            for s in 0..3 { for t in 0..4 {
                let mut d: Vec<_> = delivered.iter().filter(|x| x.1 == PeerId(s) && x.2 == t).collect();
                d.sort_by_key(|x| x.0);
                prop_assert!(d.windows(2).all(|w| w[0].3 < w[1].3), "out of order: {:?}", d);
            }}
            let mut seen = std::collections::HashSet::new();
            for d in &delivered { prop_assert!(seen.insert(d.3), "delivered twice"); }
        }
    }

    #[test]
    fn dead_peer_drains_only_its_receives() {
        let mut m: Matcher<u32, ()> = Matcher::default();
        assert!(m.post(Selector::exact(Some(PeerId(1)), 5), 10).is_none());
        assert!(m.post(Selector::exact(None, 5), 11).is_none());
        assert!(m.post(Selector::exact(Some(PeerId(2)), 5), 12).is_none());
        assert_eq!(m.drain_posted_from(PeerId(1)), vec![10]);
        assert_eq!(m.arrive(PeerId(2), 5, ()), Some((11, ())));
        assert_eq!(m.arrive(PeerId(2), 5, ()), Some((12, ())));
    }

    #[test]
    fn masks_and_wildcards() {
        let sel = Selector {
            src: None,
            tag: 0x10,
            mask: 0xf0,
        };
        assert!(sel.matches(PeerId(0), 0x1f));
        assert!(!sel.matches(PeerId(0), 0x2f));
        assert!(Selector::any().matches(PeerId(9), 12345));
    }
}
