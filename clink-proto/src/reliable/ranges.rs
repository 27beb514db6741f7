//! A set of packet numbers kept as sorted, disjoint, non-touching ranges `[start, end)`:
//! the receiver's packets above its cumulative ack (what its acks' SACK ranges say) and
//! the sender's packets those ranges already acknowledged. Both grow at the back as a
//! stream arrives behind a hole; an insert there is O(1), elsewhere a binary search.

use std::collections::VecDeque;

/// Sorted, disjoint, non-touching ranges of packet numbers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Ranges(VecDeque<(u64, u64)>);

impl Ranges {
    /// Adds `[s, e)`, calling `fresh(a, b)` for each part `[a, b)` that was not in the set
    /// before, in order.
    pub(crate) fn insert(&mut self, s: u64, e: u64, mut fresh: impl FnMut(u64, u64)) {
        if s >= e {
            return;
        }
        let r = &mut self.0;
        // At or past the end (a stream behind a hole): extend the last range or add one.
        if r.back().is_none_or(|&(_, end)| end <= s) {
            match r.back_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => r.push_back((s, e)),
            }
            fresh(s, e);
            return;
        }
        // The ranges i..j touch [s, e) (i: the first that touches or follows it): the
        // gaps between them are fresh, and they merge with it into one.
        let i = r.partition_point(|&(_, end)| end < s);
        let j = i + r.range(i..).take_while(|&&(a, _)| a <= e).count();
        let (mut start, mut end, mut at) = (s, e, s);
        for &(a, b) in r.range(i..j) {
            if a > at {
                fresh(at, a);
            }
            at = at.max(b);
            start = start.min(a);
            end = end.max(b);
        }
        if at < e {
            fresh(at, e);
        }
        r.drain(i..j);
        r.insert(i, (start, end));
    }

    /// Forgets every number below `x`.
    pub(crate) fn trim_below(&mut self, x: u64) {
        while let Some(f) = self.0.front_mut() {
            if f.1 <= x {
                self.0.pop_front();
            } else {
                f.0 = f.0.max(x);
                break;
            }
        }
    }

    /// The ranges, lowest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;
    use proptest::prelude::*;

    proptest! {
        /// Against a plain bit set: the ranges hold exactly the numbers inserted (and not
        /// trimmed), sorted, disjoint and non-touching, and `fresh` names exactly the
        /// numbers each insert added.
        #[test]
        fn ranges_are_the_set_of_numbers_inserted(
            ops in prop::collection::vec((0u64..200, 1u64..12, any::<bool>()), 1..80)
        ) {
            let mut r = Ranges::default();
            let mut bits = vec![false; 220];
            for (s, len, trim) in ops {
                if trim {
                    r.trim_below(s);
                    bits.iter_mut().take(s as usize).for_each(|b| *b = false);
                    continue;
                }
                let e = s + len;
                let mut added = Vec::new();
                r.insert(s, e, |a, b| added.extend(a..b));
                let expect: Vec<u64> = (s..e).filter(|&i| !bits[i as usize]).collect();
                prop_assert_eq!(added, expect);
                (s..e).for_each(|i| bits[i as usize] = true);
                let v: Vec<(u64, u64)> = r.iter().collect();
                for w in v.windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "touching or unsorted: {:?}", v);
                }
                let mut held = vec![false; 220];
                for (a, b) in v {
                    prop_assert!(a < b);
                    (a..b).for_each(|i| held[i as usize] = true);
                }
                prop_assert_eq!(&held, &bits);
            }
        }
    }
}
