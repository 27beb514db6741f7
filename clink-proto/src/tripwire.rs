//! Tripwires (CLAN): byte ranges of an aperture watched for reads and/or writes.
//!
//! An aperture is a memory region named by a `u32` id. A tripwire watches `[start, start+len)`
//! of one aperture; an access that overlaps it with a matching kind fires it, and a once-only
//! tripwire is disarmed by firing. The runtime reports accesses; this module only decides which
//! tripwires they hit.
//!
//! Matching must stay better than linear with thousands of tripwires per endpoint, so each
//! aperture indexes its tripwires by 4 KiB page: a tripwire spanning at most
//! [`MAX_BUCKETED_PAGES`] pages is listed in the bucket of every page it touches, and an access
//! only visits the buckets of the pages it touches. Wider tripwires would cost one bucket entry
//! per page, so they go to a per-aperture `wide` list that every access on the aperture checks
//! linearly; they are expected to be few.

use crate::idhash::IdMap;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use crate::ProtoError;

/// Access kind bits (the same as the rights of an export).
pub use crate::rma::{READ, WRITE};

/// log2 of the bucket page size.
const PAGE_SHIFT: u32 = 12;
/// Tripwires spanning more pages than this go to the aperture's linear `wide` list.
pub const MAX_BUCKETED_PAGES: u64 = 64;

/// Identifies an armed tripwire: slab index + generation (so a stale id never names a newer
/// tripwire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TripId {
    /// Slot in the matcher's slab.
    pub index: u32,
    /// Generation of the slot when the tripwire was armed.
    pub gen: u32,
}

/// What a tripwire watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The aperture watched.
    pub aperture: u32,
    /// First watched byte offset.
    pub start: u64,
    /// Watched byte count (non-zero).
    pub len: u64,
    /// Access kinds that fire it: a non-empty mask of [`READ`] | [`WRITE`].
    pub on: u8,
    /// Disarm after the first firing.
    pub once: bool,
}

impl Spec {
    /// One past the last watched byte; cannot overflow once [`Matcher::insert`] accepted it.
    fn end(&self) -> u64 {
        self.start + self.len
    }

    /// The pages this tripwire is bucketed under, or `None` if it belongs to the wide list.
    fn bucket_pages(&self) -> Option<RangeInclusive<u64>> {
        let pages = pages(self.start, self.end());
        (pages.end() - pages.start() < MAX_BUCKETED_PAGES).then_some(pages)
    }
}

/// Whether an access of `kind` to `start..end` fires tripwire `s`.
fn touches(s: &Spec, kind: u8, start: u64, end: u64) -> bool {
    s.on & kind != 0 && s.start < end && start < s.end()
}

/// Pages touched by the non-empty byte range `[start, end)`.
fn pages(start: u64, end: u64) -> RangeInclusive<u64> {
    start >> PAGE_SHIFT..=(end - 1) >> PAGE_SHIFT
}

/// One slab slot.
struct Entry {
    /// Bumped on every disarm so older ids of this slot go stale.
    gen: u32,
    /// `None` while the slot is free.
    spec: Option<Spec>,
    /// Fire call that last examined this entry: dedups a tripwire listed in several buckets
    /// without a per-call set.
    stamp: u64,
}

/// The tripwire index of one aperture.
#[derive(Default)]
struct Aperture {
    /// Page -> slab indices of the narrow tripwires touching that page.
    buckets: BTreeMap<u64, Vec<u32>>,
    /// Slab indices of the tripwires too wide to bucket; checked linearly.
    wide: Vec<u32>,
}

/// The armed tripwires of one endpoint, matched against accesses.
#[derive(Default)]
pub struct Matcher {
    slab: Vec<Entry>,
    /// Free slab slots, reused before the slab grows.
    free: Vec<u32>,
    /// Only apertures with at least one armed tripwire have an entry.
    apertures: IdMap<u32, Aperture>,
    /// Stamp of the latest fire call.
    epoch: u64,
    /// Hit list reused across fire calls, to not allocate per access.
    scratch: Vec<u32>,
}

impl Matcher {
    /// An empty matcher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms a tripwire. Errors ([`ProtoError::OutOfRange`]) if `len == 0`, `on` has no
    /// READ/WRITE bit or unknown bits, or `start + len` overflows `u64`.
    pub fn insert(&mut self, spec: Spec) -> Result<TripId, ProtoError> {
        let bad = |what, value, limit| Err(ProtoError::OutOfRange { what, value, limit });
        if spec.len == 0 {
            return bad("tripwire length", 0, u64::MAX);
        }
        if spec.on & (READ | WRITE) == 0 || spec.on & !(READ | WRITE) != 0 {
            return bad(
                "tripwire access mask",
                spec.on.into(),
                (READ | WRITE).into(),
            );
        }
        if spec.start.checked_add(spec.len).is_none() {
            return bad("tripwire start", spec.start, u64::MAX - spec.len);
        }
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let Ok(index) = u32::try_from(self.slab.len()) else {
                    return bad("tripwire count", self.slab.len() as u64, u32::MAX.into());
                };
                self.slab.push(Entry {
                    gen: 0,
                    spec: None,
                    stamp: 0,
                });
                index
            }
        };
        let entry = &mut self.slab[index as usize];
        entry.spec = Some(spec);
        let id = TripId {
            index,
            gen: entry.gen,
        };
        let ap = self.apertures.entry(spec.aperture).or_default();
        match spec.bucket_pages() {
            Some(pages) => pages.for_each(|p| ap.buckets.entry(p).or_default().push(index)),
            None => ap.wide.push(index),
        }
        Ok(id)
    }

    /// Disarms; returns its spec, `None` if the id is stale/unknown.
    pub fn remove(&mut self, id: TripId) -> Option<Spec> {
        self.get(id)?;
        let spec = self.release(id.index)?;
        if let Some(ap) = self.apertures.get_mut(&spec.aperture) {
            match spec.bucket_pages() {
                Some(pages) => {
                    for p in pages {
                        if let Some(bucket) = ap.buckets.get_mut(&p) {
                            unlink(bucket, id.index);
                            if bucket.is_empty() {
                                ap.buckets.remove(&p);
                            }
                        }
                    }
                }
                None => unlink(&mut ap.wide, id.index),
            }
            if ap.buckets.is_empty() && ap.wide.is_empty() {
                self.apertures.remove(&spec.aperture);
            }
        }
        Some(spec)
    }

    /// The spec of an armed tripwire, `None` if the id is stale/unknown.
    pub fn get(&self, id: TripId) -> Option<&Spec> {
        let entry = self.slab.get(id.index as usize)?;
        (entry.gen == id.gen).then_some(entry.spec.as_ref()?)
    }

    /// Number of armed tripwires.
    pub fn len(&self) -> usize {
        // Every slot is either free or armed.
        self.slab.len() - self.free.len()
    }

    /// True if no tripwire is armed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Largest slab index ever used + 1 (the runtime sizes a per-index bitmap with it).
    pub fn index_bound(&self) -> usize {
        self.slab.len()
    }

    /// Fires every armed tripwire on `aperture` whose range overlaps `[start, start+len)` and
    /// whose `on` mask intersects `kind`: calls `hit(id, &spec)` exactly once per such
    /// tripwire, in ascending [`TripId::index`] order; once-only tripwires are removed after
    /// their call. `len == 0` touches nothing; `start + len` saturates at `u64::MAX`.
    pub fn fire(
        &mut self,
        aperture: u32,
        start: u64,
        len: u64,
        kind: u8,
        mut hit: impl FnMut(TripId, &Spec),
    ) {
        // The usual small access, within one page that one tripwire watches: no hit list
        // to fill and sort.
        let end = start.saturating_add(len);
        if end > start && start >> PAGE_SHIFT == (end - 1) >> PAGE_SHIFT {
            let Some(ap) = self.apertures.get(&aperture) else {
                return;
            };
            let bucket = ap.buckets.get(&(start >> PAGE_SHIFT));
            let bucket = bucket.map_or(&[][..], Vec::as_slice);
            if bucket.len() + ap.wide.len() == 1 {
                let index = *bucket.first().or(ap.wide.first()).expect("one candidate");
                let spec = self.slab[index as usize].spec;
                if spec.is_some_and(|s| touches(&s, kind, start, end)) {
                    self.fire_index(index, &mut hit);
                }
                return;
            }
        }
        let mut hits = std::mem::take(&mut self.scratch);
        self.collect(aperture, start, len, kind, &mut hits);
        for &index in &hits {
            self.fire_index(index, &mut hit);
        }
        hits.clear();
        self.scratch = hits;
    }

    /// Calls `hit` for the armed tripwire at slab `index` (none: nothing) and removes it if
    /// it fires once only.
    #[inline(always)]
    fn fire_index(&mut self, index: u32, hit: &mut impl FnMut(TripId, &Spec)) {
        let entry = &self.slab[index as usize];
        let Some(spec) = entry.spec else { return };
        let id = TripId {
            index,
            gen: entry.gen,
        };
        hit(id, &spec);
        if spec.once {
            self.remove(id);
        }
    }

    /// Fills `out` with the sorted slab indices [`Matcher::fire`] would hit; returns how many
    /// distinct tripwires it examined (so tests can check the index prunes).
    fn collect(
        &mut self,
        aperture: u32,
        start: u64,
        len: u64,
        kind: u8,
        out: &mut Vec<u32>,
    ) -> usize {
        out.clear();
        let end = start.saturating_add(len);
        let Some(ap) = self.apertures.get(&aperture) else {
            return 0;
        };
        // Also covers start == u64::MAX, where saturation leaves nothing to touch.
        if end <= start {
            return 0;
        }
        let hits = |s: &Option<Spec>| s.as_ref().is_some_and(|s| touches(s, kind, start, end));
        let pages = pages(start, end);
        let mut examined = 0;
        if pages.start() == pages.end() {
            // One page (the usual small access): one bucket lookup, and no tripwire can be
            // met twice (it is listed once per page, or only in the wide list).
            let bucket = ap.buckets.get(pages.start()).map_or(&[][..], Vec::as_slice);
            for &index in bucket.iter().chain(&ap.wide) {
                examined += 1;
                if hits(&self.slab[index as usize].spec) {
                    out.push(index);
                }
            }
        } else {
            self.epoch = self.epoch.wrapping_add(1);
            let stamp = self.epoch;
            let buckets = ap.buckets.range(pages).flat_map(|(_, b)| b);
            for &index in buckets.chain(&ap.wide) {
                let entry = &mut self.slab[index as usize];
                if entry.stamp == stamp {
                    continue; // already seen through another page's bucket
                }
                entry.stamp = stamp;
                examined += 1;
                if hits(&entry.spec) {
                    out.push(index);
                }
            }
        }
        out.sort_unstable();
        examined
    }

    /// Removes every tripwire on `aperture` (the aperture is being destroyed); returns their
    /// ids in ascending index order.
    pub fn remove_aperture(&mut self, aperture: u32) -> Vec<TripId> {
        let Some(ap) = self.apertures.remove(&aperture) else {
            return Vec::new();
        };
        let mut indices: Vec<u32> = ap.buckets.into_values().flatten().chain(ap.wide).collect();
        indices.sort_unstable();
        indices.dedup(); // a narrow tripwire is listed once per page it touches
        indices
            .into_iter()
            .map(|index| {
                let gen = self.slab[index as usize].gen;
                self.release(index);
                TripId { index, gen }
            })
            .collect()
    }

    /// Frees a slab slot, staling its ids; the caller unlinks it from its aperture.
    fn release(&mut self, index: u32) -> Option<Spec> {
        let entry = &mut self.slab[index as usize];
        let spec = entry.spec.take()?;
        entry.gen = entry.gen.wrapping_add(1);
        self.free.push(index);
        Some(spec)
    }
}

/// Removes `index` from an unordered index list.
fn unlink(list: &mut Vec<u32>, index: u32) {
    if let Some(i) = list.iter().position(|&x| x == index) {
        list.swap_remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(aperture: u32, start: u64, len: u64, on: u8, once: bool) -> Spec {
        Spec {
            aperture,
            start,
            len,
            on,
            once,
        }
    }

    fn fired(m: &mut Matcher, aperture: u32, start: u64, len: u64, kind: u8) -> Vec<TripId> {
        let mut ids = Vec::new();
        m.fire(aperture, start, len, kind, |id, _| ids.push(id));
        ids
    }

    #[test]
    fn stale_id_after_remove_and_reinsert_is_rejected() {
        let mut m = Matcher::new();
        let a = m.insert(spec(0, 0, 10, READ, false)).unwrap();
        assert!(m.remove(a).is_some());
        let b = m.insert(spec(0, 100, 10, WRITE, false)).unwrap();
        assert_eq!(a.index, b.index, "slot reused");
        assert_ne!(a, b);
        assert_eq!(m.get(a), None);
        assert_eq!(m.remove(a), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.get(b).map(|s| s.start), Some(100));
        assert_eq!(m.remove(TripId { index: 99, gen: 0 }), None);
    }

    #[test]
    fn invalid_specs_are_rejected() {
        let mut m = Matcher::new();
        for bad in [
            spec(0, 0, 0, READ, false),
            spec(0, 0, 1, 0, false),
            spec(0, 0, 1, 4, false),
            spec(0, 0, 1, READ | 8, false),
            spec(0, u64::MAX, 1, READ, false),
            spec(0, 1, u64::MAX, READ, false),
        ] {
            assert!(
                matches!(m.insert(bad), Err(ProtoError::OutOfRange { .. })),
                "{bad:?}"
            );
        }
        assert!(m.is_empty());
        assert_eq!(m.index_bound(), 0);
    }

    #[test]
    fn edge_ranges_do_not_panic() {
        let mut m = Matcher::new();
        let top = m.insert(spec(0, u64::MAX - 1, 1, READ, false)).unwrap();
        let all = m.insert(spec(0, 0, u64::MAX, READ | WRITE, false)).unwrap();
        assert_eq!(fired(&mut m, 0, u64::MAX, u64::MAX, READ), vec![]);
        assert_eq!(
            fired(&mut m, 0, u64::MAX - 1, u64::MAX, READ),
            vec![top, all]
        );
        assert_eq!(fired(&mut m, 0, 0, u64::MAX, READ), vec![top, all]);
        assert_eq!(fired(&mut m, 0, 5, 0, READ), vec![]);
        assert_eq!(fired(&mut m, 0, 5, 1, 0), vec![]);
        assert_eq!(fired(&mut m, 1, 0, u64::MAX, READ), vec![]);
        assert_eq!(fired(&mut m, 0, u64::MAX - 1, 1, WRITE), vec![all]);
        assert_eq!(m.remove_aperture(0), vec![top, all]);
        assert!(m.is_empty());
    }

    #[test]
    fn once_only_disarms_and_kinds_filter() {
        let mut m = Matcher::new();
        let r = m.insert(spec(3, 0, 8, READ, true)).unwrap();
        let w = m.insert(spec(3, 4, 8, WRITE, false)).unwrap();
        assert_eq!(fired(&mut m, 3, 0, 16, WRITE), vec![w]);
        assert_eq!(fired(&mut m, 3, 7, 1, READ | WRITE), vec![r, w]);
        assert_eq!(fired(&mut m, 3, 0, 16, READ), vec![]);
        assert_eq!(m.get(r), None);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn a_single_page_access_visits_only_its_bucket() {
        let mut m = Matcher::new();
        // 4096 tripwires of 256 bytes: 16 per page over 256 pages, plus one wide tripwire.
        let ids: Vec<TripId> = (0..4096u64)
            .map(|i| m.insert(spec(0, i * 256, 256, READ, false)).unwrap())
            .collect();
        let wide = m
            .insert(spec(
                0,
                0,
                (MAX_BUCKETED_PAGES + 1) << PAGE_SHIFT,
                READ,
                false,
            ))
            .unwrap();
        let page = 100u64;
        let start = (page << PAGE_SHIFT) + 300; // inside the 2nd tripwire of the page
        let mut hits = Vec::new();
        let examined = m.collect(0, start, 600, READ, &mut hits);
        assert_eq!(examined, 16 + 1, "the page's bucket plus the wide list");
        let first = (page * 16) as usize;
        assert_eq!(
            hits,
            vec![first as u32 + 1, first as u32 + 2, first as u32 + 3]
        );
        let want = vec![ids[first + 1], ids[first + 2], ids[first + 3]];
        assert_eq!(fired(&mut m, 0, start, 600, READ), want);
        // An access on the wide tripwire's pages also fires it.
        assert_eq!(fired(&mut m, 0, 10, 1, READ), vec![ids[0], wide]);
    }
}
