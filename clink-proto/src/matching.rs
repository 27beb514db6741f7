//! Tag matching: posted receives against arrived messages.
//!
//! A receive names a source (a peer or any peer), a tag and a mask; a message matches when
//! `msg_tag & mask == tag & mask`. Both queues are kept in arrival order, so the first
//! matching entry is always taken: that, with each peer's frames arriving in order, gives
//! delivery in order per (sender, tag).
//!
//! Short queues are searched from their head, as MPI implementations do: the common case
//! is a receive posted just before its message, hit at once. A queue longer than
//! [`INDEX_FROM`] entries also gets an index by (source, tag), as UCX's tag matching keeps
//! hash buckets: a message finds the oldest receive posted for exactly its source and tag
//! without walking the receives for other tags, and such a receive finds its oldest
//! unexpected message the same way. Receives with any source or a partial mask (and
//! messages they look for) are still found by a walk, in order, and the older of the two
//! candidates wins, so the order is the linear queues' whatever the mix. In an indexed
//! queue a taken entry leaves a hole until it reaches the head (the index holds the
//! entries' numbers); one whose holes outgrow its entries is compacted.

use crate::PeerId;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

/// Entries of a queue from which on it is indexed by (source, tag); below, a walk from the
/// head is cheaper than hashing.
pub const INDEX_FROM: usize = 32;

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

/// A (source, tag) pair, the key of an index.
type Key = (PeerId, u64);

/// Numbers of a queue's entries by key, oldest first. A key's first number is kept in the
/// table itself (most keys have one entry: no allocation); a key with none left is
/// removed.
#[derive(Debug)]
struct Index {
    map: HashMap<Key, (u64, VecDeque<u64>), KeyHasher>,
}

impl Index {
    fn new() -> Index {
        Index {
            map: HashMap::with_hasher(KeyHasher::new()),
        }
    }

    fn push(&mut self, k: Key, n: u64) {
        match self.map.entry(k) {
            Entry::Occupied(mut e) => e.get_mut().1.push_back(n),
            Entry::Vacant(e) => {
                e.insert((n, VecDeque::new()));
            }
        }
    }

    /// The oldest number of key `k`.
    fn front(&self, k: &Key) -> Option<u64> {
        self.map.get(k).map(|e| e.0)
    }

    /// Removes number `n` from key `k` (its oldest, the usual case, or another).
    fn remove(&mut self, k: Key, n: u64) {
        let Entry::Occupied(mut e) = self.map.entry(k) else {
            return;
        };
        let (first, rest) = e.get_mut();
        if *first != n {
            rest.retain(|&x| x != n);
        } else if let Some(next) = rest.pop_front() {
            *first = next;
        } else {
            e.remove();
        }
    }
}

/// Builds the hasher of an index's keys: a multiply-fold hash (two multiplications for a
/// key), seeded at random per index so that a peer choosing its tags cannot aim at one
/// bucket; SipHash, the standard one, cost more than the index saved at a few dozen
/// entries.
#[derive(Clone, Debug)]
struct KeyHasher(u64);

impl KeyHasher {
    fn new() -> KeyHasher {
        use std::hash::BuildHasher;
        // The standard library's random keys, hashing any constant, make the seed.
        KeyHasher(std::collections::hash_map::RandomState::new().hash_one(0u64))
    }
}

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = FoldHash;
    fn build_hasher(&self) -> FoldHash {
        FoldHash(self.0)
    }
}

/// The hasher [`KeyHasher`] builds: each integer written is folded in by a 64 x 64-bit
/// multiplication whose halves are XORed.
#[derive(Debug)]
struct FoldHash(u64);

impl FoldHash {
    fn fold(&mut self, x: u64) {
        let m = u128::from(self.0 ^ x) * u128::from(0x9e37_79b9_7f4a_7c15u64);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

impl std::hash::Hasher for FoldHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.fold(u64::from_le_bytes(w));
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.fold(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.fold(x);
    }
}

/// True for a receive that only one (source, tag) pair satisfies: the indexed kind.
fn is_exact(sel: &Selector) -> bool {
    sel.src.is_some() && sel.mask == !0
}

/// Entries in arrival order, each known by its number (`base` + its place). While an
/// index holds the numbers, a taken entry leaves a hole (dropped once it reaches the head;
/// compaction renumbers); otherwise the queue closes up behind it.
#[derive(Debug)]
struct Queue<T> {
    items: VecDeque<Option<T>>,
    /// Number of `items[0]`.
    base: u64,
    live: usize,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            items: VecDeque::new(),
            base: 0,
            live: 0,
        }
    }
}

impl<T> Queue<T> {
    fn push(&mut self, t: T) -> u64 {
        let n = self.base + self.items.len() as u64;
        self.items.push_back(Some(t));
        self.live += 1;
        n
    }

    fn get(&self, n: u64) -> Option<&T> {
        self.items.get(n.checked_sub(self.base)? as usize)?.as_ref()
    }

    /// Takes entry `n`. With `keep_numbers` (an index holds them) it leaves a hole;
    /// without, the entries behind it move up (a shift of the shorter side, as before
    /// there were numbers) and those behind it are renumbered.
    fn take(&mut self, n: u64, keep_numbers: bool) -> Option<T> {
        if n == self.base {
            return self.items.front().is_some().then(|| self.pop_head());
        }
        let i = n.checked_sub(self.base)? as usize;
        let t = if keep_numbers {
            self.items.get_mut(i)?.take()?
        } else {
            self.items.remove(i)??
        };
        self.live -= 1;
        Some(t)
    }

    /// Takes the head (there is one: a queue's head is never a hole) and the holes behind
    /// it.
    #[inline]
    fn pop_head(&mut self) -> T {
        let t = self.items.pop_front().flatten().expect("a live head");
        self.base += 1;
        self.live -= 1;
        while matches!(self.items.front(), Some(None)) {
            self.items.pop_front();
            self.base += 1;
        }
        t
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &T)> + '_ {
        let base = self.base;
        self.items
            .iter()
            .enumerate()
            .filter_map(move |(i, t)| t.as_ref().map(|t| (base + i as u64, t)))
    }

    #[inline]
    fn find(&self, mut f: impl FnMut(&T) -> bool) -> Option<u64> {
        match self.items.front() {
            None => None,
            // The head first, without the walk's set-up: the usual hit.
            Some(Some(t)) if f(t) => Some(self.base),
            _ => {
                let i = self
                    .items
                    .iter()
                    .position(|t| t.as_ref().is_some_and(&mut f))?;
                Some(self.base + i as u64)
            }
        }
    }

    /// Drops the holes (renumbering the entries from 0) once they outnumber the entries
    /// twice over, so a long-lived entry at the head does not hold an ever longer queue;
    /// true when it did (indexes must then be rebuilt).
    #[inline]
    fn compact_if_sparse(&mut self) -> bool {
        let holes = self.items.len() - self.live;
        if holes <= 2 * self.live + INDEX_FROM {
            return false;
        }
        self.items.retain(Option::is_some);
        self.base = 0;
        true
    }
}

/// Posted receives (`R`: the runtime's receive token) and unexpected messages (`U`).
#[derive(Debug)]
pub struct Matcher<R, U> {
    posted: Queue<(Selector, R)>,
    /// The exact posted receives by key, while the queue is long.
    posted_index: Option<Index>,
    /// Posted receives that are not exact (any source, or a partial mask).
    wild: usize,
    unexpected: Queue<Unexpected<U>>,
    /// The unexpected messages by key, while the queue is long.
    unexpected_index: Option<Index>,
    /// Length from which the queues are indexed ([`INDEX_FROM`]; tests lower it).
    index_from: usize,
    /// An index no longer in use, emptied, kept for the next one: a queue that fills and
    /// empties again and again does not allocate its table each time.
    spare: Option<Index>,
}

impl<R, U> Default for Matcher<R, U> {
    fn default() -> Self {
        Matcher {
            posted: Queue::default(),
            posted_index: None,
            wild: 0,
            unexpected: Queue::default(),
            unexpected_index: None,
            index_from: INDEX_FROM,
            spare: None,
        }
    }
}

impl<R: PartialEq, U> Matcher<R, U> {
    /// A matcher whose queues are indexed from `n` entries on (tests run the index on
    /// short queues).
    #[cfg(test)]
    fn indexed_from(n: usize) -> Self {
        Matcher {
            index_from: n,
            ..Matcher::default()
        }
    }

    /// Posts a receive: returns the first matching unexpected message, or queues the
    /// receive and returns `None`.
    pub fn post(&mut self, sel: Selector, token: R) -> Option<(R, Unexpected<U>)> {
        match self.find_unexpected(&sel) {
            Some(n) => Some((token, self.remove_unexpected(n))),
            None => {
                let n = self.posted.push((sel, token));
                if !is_exact(&sel) {
                    self.wild += 1;
                }
                match self.posted_index.as_mut() {
                    Some(ix) if is_exact(&sel) => ix.push((sel.src.expect("exact"), sel.tag), n),
                    Some(_) => {}
                    None if self.posted.live > self.index_from => self.index_posted(),
                    None => {}
                }
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
        // The head of an unindexed queue, the usual hit: popped, nothing else to update.
        if self.posted_index.is_none()
            && matches!(self.posted.items.front(), Some(Some((s, _))) if s.matches(src, tag))
        {
            let (sel, r) = self.posted.pop_head();
            if !is_exact(&sel) {
                self.wild -= 1;
            }
            return Some(r);
        }
        let n = self.find_posted(src, tag)?;
        Some(self.remove_posted(n).1)
    }

    /// True when a posted receive would take a message from `src` with `tag`.
    pub fn has_posted_for(&self, src: PeerId, tag: u64) -> bool {
        self.find_posted(src, tag).is_some()
    }

    /// Keeps a message no posted receive wanted (call after [`Matcher::take_posted`]
    /// returned `None`).
    pub fn push_unexpected(&mut self, src: PeerId, tag: u64, item: U) {
        let n = self.unexpected.push(Unexpected { src, tag, item });
        match self.unexpected_index.as_mut() {
            Some(ix) => ix.push((src, tag), n),
            None if self.unexpected.live > self.index_from => self.index_unexpected(),
            None => {}
        }
    }

    /// True when an unexpected message matches `sel` (so a new receive must take it first).
    pub fn has_unexpected(&self, sel: &Selector) -> bool {
        self.find_unexpected(sel).is_some()
    }

    /// The first unexpected message matching `sel`, without removing it.
    pub fn probe(&self, sel: &Selector) -> Option<&Unexpected<U>> {
        self.unexpected.get(self.find_unexpected(sel)?)
    }

    /// Removes and returns the first unexpected message matching `sel`.
    pub fn take_unexpected(&mut self, sel: &Selector) -> Option<Unexpected<U>> {
        let n = self.find_unexpected(sel)?;
        Some(self.remove_unexpected(n))
    }

    /// Withdraws a posted receive; true when it was still queued.
    pub fn cancel(&mut self, token: &R) -> bool {
        match self.posted.find(|(_, r)| r == token) {
            Some(n) => {
                self.remove_posted(n);
                true
            }
            None => false,
        }
    }

    /// Removes the posted receives that can only be satisfied by `peer` (it died), and
    /// returns their tokens.
    pub fn drain_posted_from(&mut self, peer: PeerId) -> Vec<R> {
        let gone: Vec<u64> = self
            .posted
            .iter()
            .filter(|(_, (s, _))| s.src == Some(peer))
            .map(|(n, _)| n)
            .collect();
        // From the last: a removal renumbers only the entries behind it.
        let mut out: Vec<R> = gone
            .into_iter()
            .rev()
            .map(|n| self.remove_posted(n).1)
            .collect();
        out.reverse();
        out
    }

    /// Removes unexpected messages from `peer` that `keep` rejects (e.g. rendezvous
    /// descriptors whose memory died with the peer), returning them.
    pub fn drain_unexpected_from(
        &mut self,
        peer: PeerId,
        mut keep: impl FnMut(&U) -> bool,
    ) -> Vec<Unexpected<U>> {
        let gone: Vec<u64> = self
            .unexpected
            .iter()
            .filter(|(_, u)| u.src == peer && !keep(&u.item))
            .map(|(n, _)| n)
            .collect();
        // From the last, as in `drain_posted_from`.
        let mut out: Vec<Unexpected<U>> = gone
            .into_iter()
            .rev()
            .map(|n| self.remove_unexpected(n))
            .collect();
        out.reverse();
        out
    }

    /// The sources named by posted receives (with repeats; any-source receives name none).
    pub fn posted_sources(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.posted.iter().filter_map(|(_, (s, _))| s.src)
    }

    /// Number of posted receives.
    pub fn posted_len(&self) -> usize {
        self.posted.live
    }
    /// Number of unexpected messages.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.live
    }

    /// The number of the oldest posted receive matching a message from `src` with `tag`.
    #[inline(always)]
    fn find_posted(&self, src: PeerId, tag: u64) -> Option<u64> {
        if self.posted.live == 0 {
            return None;
        }
        let Some(ix) = &self.posted_index else {
            return self.posted.find(|(s, _)| s.matches(src, tag));
        };
        let exact = ix.front(&(src, tag));
        let wild = if self.wild > 0 {
            self.posted
                .find(|(s, _)| !is_exact(s) && s.matches(src, tag))
        } else {
            None
        };
        match (exact, wild) {
            (Some(e), Some(w)) => Some(e.min(w)),
            (e, w) => e.or(w),
        }
    }

    /// The number of the oldest unexpected message `sel` matches.
    #[inline(always)]
    fn find_unexpected(&self, sel: &Selector) -> Option<u64> {
        if self.unexpected.live == 0 {
            return None;
        }
        match (&self.unexpected_index, sel.src) {
            (Some(ix), Some(src)) if is_exact(sel) => ix.front(&(src, sel.tag)),
            _ => self.unexpected.find(|u| sel.matches(u.src, u.tag)),
        }
    }

    /// Takes posted receive `n` (a live one) out of the queue and its index.
    #[inline]
    fn remove_posted(&mut self, n: u64) -> (Selector, R) {
        let keep = self.posted_index.is_some();
        let (sel, r) = self.posted.take(n, keep).expect("a live posted receive");
        if !is_exact(&sel) {
            self.wild -= 1;
        } else if let (Some(ix), Some(src)) = (self.posted_index.as_mut(), sel.src) {
            ix.remove((src, sel.tag), n);
        }
        if self.posted.live == 0 {
            if let Some(ix) = self.posted_index.take() {
                self.retire(ix);
            }
        } else if self.posted.compact_if_sparse() && self.posted_index.is_some() {
            self.index_posted();
        }
        (sel, r)
    }

    /// Takes unexpected message `n` (a live one) out of the queue and its index.
    #[inline]
    fn remove_unexpected(&mut self, n: u64) -> Unexpected<U> {
        let keep = self.unexpected_index.is_some();
        let u = self
            .unexpected
            .take(n, keep)
            .expect("a live unexpected message");
        if let Some(ix) = self.unexpected_index.as_mut() {
            ix.remove((u.src, u.tag), n);
        }
        if self.unexpected.live == 0 {
            if let Some(ix) = self.unexpected_index.take() {
                self.retire(ix);
            }
        } else if self.unexpected.compact_if_sparse() && self.unexpected_index.is_some() {
            self.index_unexpected();
        }
        u
    }

    /// Keeps an index no longer in use (emptied) for the next one.
    fn retire(&mut self, mut ix: Index) {
        ix.map.clear();
        self.spare = Some(ix);
    }

    /// An empty index: the spare one, or a new one.
    fn fresh_index(&mut self) -> Index {
        let mut ix = self.spare.take().unwrap_or_else(Index::new);
        ix.map.clear();
        ix
    }

    /// (Re)builds the index of the exact posted receives.
    fn index_posted(&mut self) {
        let mut ix = self.fresh_index();
        for (n, (s, _)) in self.posted.iter() {
            if let (true, Some(src)) = (is_exact(s), s.src) {
                ix.push((src, s.tag), n);
            }
        }
        self.posted_index = Some(ix);
    }

    /// (Re)builds the index of the unexpected messages.
    fn index_unexpected(&mut self) {
        let mut ix = self.fresh_index();
        for (n, u) in self.unexpected.iter() {
            ix.push((u.src, u.tag), n);
        }
        self.unexpected_index = Some(ix);
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
        /// Probe for, then take, the oldest unexpected message a selector matches.
        Take {
            src: Option<u32>,
            tag: u64,
            mask: u64,
        },
        HasPostedFor {
            src: u32,
            tag: u64,
        },
        /// A peer died: its posted receives and its unexpected messages with odd items go.
        Drain(u32),
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
            (
                proptest::option::of(0u32..3),
                0u64..4,
                prop_oneof![Just(!0u64), Just(0u64), Just(1u64)]
            )
                .prop_map(|(src, tag, mask)| Op::Take { src, tag, mask }),
            (0u32..3, 0u64..4).prop_map(|(src, tag)| Op::HasPostedFor { src, tag }),
            (0u32..3).prop_map(Op::Drain),
        ]
    }

    proptest! {
        /// Against a naive model: every message is delivered at most once, to the oldest
        /// matching receive, and per (src, tag) in arrival order.
        #[test]
        fn matches_naive_model(
            ops in proptest::collection::vec(op(), 0..300),
            index_from in prop_oneof![Just(0usize), Just(3), Just(INDEX_FROM)],
        ) {
            let mut m: Matcher<usize, u64> = Matcher::indexed_from(index_from);
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
                    Op::Take { src, tag, mask } => {
                        let sel = Selector { src: src.map(PeerId), tag, mask };
                        let want = unexp.iter().position(|&(s, t, _)| sel.matches(s, t));
                        prop_assert_eq!(m.has_unexpected(&sel), want.is_some());
                        let probed = m.probe(&sel).map(|u| (u.src, u.tag, u.item));
                        let got = m.take_unexpected(&sel).map(|u| (u.src, u.tag, u.item));
                        prop_assert_eq!(probed, got);
                        prop_assert_eq!(got, want.map(|i| unexp.remove(i)));
                    }
                    Op::HasPostedFor { src, tag } => {
                        let want = posted.iter().any(|(s, _)| s.matches(PeerId(src), tag));
                        prop_assert_eq!(m.has_posted_for(PeerId(src), tag), want);
                    }
                    Op::Drain(p) => {
                        let peer = PeerId(p);
                        let want: Vec<usize> = posted.iter()
                            .filter(|(s, _)| s.src == Some(peer)).map(|(_, t)| *t).collect();
                        posted.retain(|(s, _)| s.src != Some(peer));
                        prop_assert_eq!(m.drain_posted_from(peer), want);
                        let want: Vec<u64> = unexp.iter()
                            .filter(|u| u.0 == peer && u.2 % 2 == 1).map(|u| u.2).collect();
                        unexp.retain(|u| !(u.0 == peer && u.2 % 2 == 1));
                        let got: Vec<u64> = m.drain_unexpected_from(peer, |q| q % 2 == 0)
                            .into_iter().map(|u| u.item).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(m.posted_len(), posted.len());
                prop_assert_eq!(m.unexpected_len(), unexp.len());
                let mut sources: Vec<PeerId> = m.posted_sources().collect();
                let mut want: Vec<PeerId> = posted.iter().filter_map(|(s, _)| s.src).collect();
                sources.sort();
                want.sort();
                prop_assert_eq!(sources, want);
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
    fn thousands_of_tags_match_in_any_order_through_the_index() {
        let mut m: Matcher<u64, u64> = Matcher::default();
        let peer = PeerId(3);
        // Receives posted in tag order, messages arriving in reverse: each finds its own.
        for t in 0..5000 {
            assert!(m.post(Selector::exact(Some(peer), t), t).is_none());
        }
        assert!(m.posted_index.is_some());
        for t in (0..5000).rev() {
            assert_eq!(m.arrive(peer, t, t), Some((t, t)));
        }
        assert_eq!(m.posted_len(), 0);
        assert!(m.posted_index.is_none(), "dropped with the last receive");
        // Messages first, receives after, in reverse.
        for t in 0..5000 {
            assert!(m.arrive(peer, t, t).is_none());
        }
        assert!(m.unexpected_index.is_some());
        for t in (0..5000).rev() {
            let (tok, u) = m.post(Selector::exact(Some(peer), t), t).unwrap();
            assert_eq!((tok, u.tag, u.item), (t, t, t));
        }
        assert_eq!(m.unexpected_len(), 0);
    }

    #[test]
    fn an_older_wildcard_receive_wins_over_an_indexed_exact_one() {
        let mut m: Matcher<u32, ()> = Matcher::default();
        assert!(m.post(Selector::exact(None, 7), 0).is_none());
        for t in 0..100 {
            assert!(m
                .post(Selector::exact(Some(PeerId(1)), t), 1 + t as u32)
                .is_none());
        }
        assert!(m.posted_index.is_some());
        assert_eq!(m.arrive(PeerId(1), 7, ()), Some((0, ())));
        assert_eq!(m.arrive(PeerId(1), 7, ()), Some((8, ())));
        let any = Selector {
            src: None,
            tag: 0,
            mask: 0,
        };
        assert!(m.post(any, 1000).is_none());
        assert_eq!(
            m.arrive(PeerId(1), 3, ()),
            Some((4, ())),
            "the exact one is older"
        );
        assert_eq!(m.arrive(PeerId(1), 3, ()), Some((1000, ())));
    }

    #[test]
    fn an_entry_left_at_the_head_does_not_hold_a_growing_queue() {
        let mut m: Matcher<u64, u64> = Matcher::default();
        // A receive nobody answers, then a long stream through receives posted behind it.
        assert!(m
            .post(Selector::exact(Some(PeerId(9)), 1), u64::MAX)
            .is_none());
        // A message nobody takes, then a long stream of messages taken behind it.
        assert!(m.arrive(PeerId(8), 1, 0).is_none());
        for t in 0..20_000 {
            assert!(m.post(Selector::exact(Some(PeerId(1)), t), t).is_none());
            assert_eq!(m.arrive(PeerId(1), t, t), Some((t, t)));
            assert!(m.arrive(PeerId(2), t, t).is_none());
            let (_, u) = m.post(Selector::exact(Some(PeerId(2)), t), t).unwrap();
            assert_eq!(u.item, t);
        }
        assert_eq!((m.posted_len(), m.unexpected_len()), (1, 1));
        assert!(
            m.posted.items.len() <= 3 + INDEX_FROM,
            "{}",
            m.posted.items.len()
        );
        assert!(m.unexpected.items.len() <= 3 + INDEX_FROM);
        assert_eq!(m.take_posted(PeerId(9), 1), Some(u64::MAX));
        assert_eq!(
            m.take_unexpected(&Selector::exact(Some(PeerId(8)), 1))
                .map(|u| u.item),
            Some(0)
        );
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
