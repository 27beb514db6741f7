//! The map of an endpoint's requests by number. Numbers come from one counter and only
//! grow, and requests mostly finish in about the order they began, so a request sits in
//! the slot its number picks in a small direct-mapped table (no hashing, no probing on the
//! path of every posted receive); one still there when a number [`SLOTS`] later needs the
//! slot moves to a hash map.

use crate::idhash::IdMap;

/// Slots of the table (a power of two).
const SLOTS: usize = 256;

/// Values by request number (see the module docs).
pub struct ReqMap<V> {
    /// By number modulo [`SLOTS`], with the number (allocated at the first insert).
    slots: Vec<Option<(u64, V)>>,
    /// Values in `slots`.
    in_slots: usize,
    /// Values moved out of their slot by a later number.
    old: IdMap<u64, V>,
}

impl<V> Default for ReqMap<V> {
    fn default() -> Self {
        ReqMap {
            slots: Vec::new(),
            in_slots: 0,
            old: IdMap::default(),
        }
    }
}

fn slot(id: u64) -> usize {
    id as usize & (SLOTS - 1)
}

impl<V> ReqMap<V> {
    /// Inserts `v` as number `id`; returns the value it replaces.
    pub fn insert(&mut self, id: u64, v: V) -> Option<V> {
        if self.slots.is_empty() {
            self.slots.resize_with(SLOTS, || None);
        }
        let s = &mut self.slots[slot(id)];
        match s {
            None => {
                *s = Some((id, v));
                self.in_slots += 1;
                self.take_old(id)
            }
            Some((k, old)) if *k == id => Some(std::mem::replace(old, v)),
            Some(_) => {
                // A request that outlived the numbers since: it moves out.
                let (k, moved) = s.replace((id, v)).expect("occupied");
                self.old.insert(k, moved);
                self.take_old(id)
            }
        }
    }

    /// Number `id` out of the hash map (looked for only when it holds anything).
    fn take_old(&mut self, id: u64) -> Option<V> {
        if self.old.is_empty() {
            return None;
        }
        self.old.remove(&id)
    }

    /// Takes out number `id`.
    pub fn remove(&mut self, id: &u64) -> Option<V> {
        if let Some(s) = self.slots.get_mut(slot(*id)) {
            if s.as_ref().is_some_and(|(k, _)| k == id) {
                self.in_slots -= 1;
                return s.take().map(|(_, v)| v);
            }
        }
        self.take_old(*id)
    }

    /// Number `id`'s value.
    pub fn get(&self, id: &u64) -> Option<&V> {
        match self.slots.get(slot(*id)) {
            Some(Some((k, v))) if k == id => Some(v),
            _ if self.old.is_empty() => None,
            _ => self.old.get(id),
        }
    }

    /// Number `id`'s value, to change.
    pub fn get_mut(&mut self, id: &u64) -> Option<&mut V> {
        match self.slots.get_mut(slot(*id)) {
            Some(Some((k, v))) if k == id => Some(v),
            _ if self.old.is_empty() => None,
            _ => self.old.get_mut(id),
        }
    }

    /// Whether number `id` is there.
    pub fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.in_slots == 0 && self.old.is_empty()
    }

    /// How many values the map holds.
    pub fn len(&self) -> usize {
        self.in_slots + self.old.len()
    }

    /// The values, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        let recent = self.slots.iter().flatten().map(|(_, v)| v);
        recent.chain(self.old.values())
    }

    /// The values, to change, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        let recent = self.slots.iter_mut().flatten().map(|(_, v)| v);
        recent.chain(self.old.values_mut())
    }

    /// (number, value) pairs, to change, in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut V)> {
        let recent = self.slots.iter_mut().flatten().map(|(k, v)| (*k, v));
        recent.chain(self.old.iter_mut().map(|(&k, v)| (k, v)))
    }
}

impl<V> std::ops::Index<&u64> for ReqMap<V> {
    type Output = V;

    /// Number `id`'s value; panics if there is none, as a map's index does.
    fn index(&self, id: &u64) -> &V {
        self.get(id).expect("no request with that number")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        /// A new request, the counter first moved on by this much (numbers other kinds of
        /// request took).
        Insert(u64),
        /// Removes the n-th live request (modulo how many there are), or a number never
        /// given out.
        Remove(usize),
        RemoveUnknown(u64),
        Change(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..3).prop_map(Op::Insert),
            1 => (0u64..3000).prop_map(Op::Insert),
            4 => any::<usize>().prop_map(Op::Remove),
            1 => any::<u64>().prop_map(Op::RemoveUnknown),
            2 => any::<usize>().prop_map(Op::Change),
        ]
    }

    fn check(m: &mut ReqMap<u64>, model: &BTreeMap<u64, u64>) {
        assert_eq!(m.len(), model.len());
        assert_eq!(m.is_empty(), model.is_empty());
        for (k, v) in model {
            assert_eq!(m.get(k), Some(v), "number {k}");
        }
        let mut all: Vec<(u64, u64)> = m.iter_mut().map(|(k, v)| (k, *v)).collect();
        all.sort();
        assert_eq!(all, model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
        let mut vals: Vec<u64> = m.values().copied().collect();
        vals.sort();
        let mut want: Vec<u64> = model.values().copied().collect();
        want.sort();
        assert_eq!(vals, want);
    }

    proptest! {
        /// Against a sorted map: any mix of new numbers (with gaps, long ones included),
        /// removals in any order, changes, and removals of numbers never given out.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut m = ReqMap::default();
            let mut model = BTreeMap::new();
            let mut next = 1u64;
            for op in ops {
                match op {
                    Op::Insert(skip) => {
                        next += skip;
                        assert_eq!(m.insert(next, next * 10), None);
                        model.insert(next, next * 10);
                        next += 1;
                    }
                    Op::Remove(n) if !model.is_empty() => {
                        let k = *model.keys().nth(n % model.len()).unwrap();
                        assert_eq!(m.remove(&k), model.remove(&k));
                        assert_eq!(m.remove(&k), None);
                    }
                    Op::RemoveUnknown(k) if !model.contains_key(&k) => {
                        assert_eq!(m.remove(&k), None);
                        assert!(!m.contains_key(&k));
                    }
                    Op::Change(n) if !model.is_empty() => {
                        let k = *model.keys().nth(n % model.len()).unwrap();
                        *m.get_mut(&k).unwrap() += 1;
                        *model.get_mut(&k).unwrap() += 1;
                    }
                    _ => {}
                }
                check(&mut m, &model);
            }
        }
    }

    /// A request that outlives many others moves out of its slot and is still found; the
    /// table stays its size.
    #[test]
    fn a_long_lived_request_moves_out_and_is_still_found() {
        let mut m = ReqMap::default();
        m.insert(1, 1u64);
        for id in 2..100_000u64 {
            m.insert(id, id);
            assert_eq!(m.remove(&id), Some(id));
        }
        assert_eq!(m.slots.len(), SLOTS);
        assert_eq!((m.in_slots, m.old.len()), (0, 1));
        assert_eq!(m.get(&1), Some(&1));
        assert_eq!(m.remove(&1), Some(1));
        assert!(m.is_empty());
    }
}
