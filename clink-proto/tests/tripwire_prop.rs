//! Property test of the tripwire matcher against a naive linear model: same hits in the same
//! order, same disarming, same validation, whatever the mix of narrow and wide tripwires.

use clink_proto::tripwire::{Matcher, Spec, TripId, READ, WRITE};
use proptest::prelude::*;
use proptest::sample::Index;

const PAGE: u64 = 4096;
/// Starts spread over 3 * 70 pages, so narrow (<= 64 pages) and wide tripwires mix and overlap.
const SPAN: u64 = 3 * 70 * PAGE;

#[derive(Clone, Debug)]
enum Op {
    Insert(Spec),
    /// Removes a live id, a stale one, or an arbitrary one, by `which`.
    Remove(u8, Index, u64),
    Fire {
        aperture: u32,
        start: u64,
        len: u64,
        kind: u8,
    },
    /// Fires just before, at or after an edge of a live tripwire (or a page boundary, if
    /// none is live), where off-by-one overlap bugs show.
    FireAtEdge {
        pick: Index,
        at_end: bool,
        delta: i64,
        len: u64,
        kind: u8,
    },
    RemoveAperture(u32),
}

fn len() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1..=256u64,
        3 => 1..=8 * PAGE,
        2 => 60 * PAGE..=70 * PAGE, // around the 64-page bucketing limit
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let insert = (
        0..3u32,
        prop_oneof![10 => 0..SPAN, 1 => any::<u64>(), 1 => Just(u64::MAX - 1)],
        prop_oneof![20 => len(), 1 => Just(0u64), 1 => any::<u64>()],
        prop_oneof![10 => 1..=3u8, 1 => any::<u8>()],
        any::<bool>(),
    )
        .prop_map(|(aperture, start, len, on, once)| {
            Op::Insert(Spec {
                aperture,
                start,
                len,
                on,
                once,
            })
        });
    let fire = (
        0..4u32,
        prop_oneof![10 => 0..SPAN, 1 => any::<u64>()],
        prop_oneof![4 => 0..=64u64, 4 => 0..=4 * PAGE, 2 => 0..=100 * PAGE, 1 => any::<u64>()],
        prop_oneof![10 => 0..=3u8, 1 => any::<u8>()],
    )
        .prop_map(|(aperture, start, len, kind)| Op::Fire {
            aperture,
            start,
            len,
            kind,
        });
    let edge = (
        any::<Index>(),
        any::<bool>(),
        -2..=2i64,
        0..=3 * PAGE,
        1..=3u8,
    )
        .prop_map(|(pick, at_end, delta, len, kind)| Op::FireAtEdge {
            pick,
            at_end,
            delta,
            len,
            kind,
        });
    prop_oneof![
        6 => insert,
        3 => edge,
        3 => (0..3u8, any::<Index>(), any::<u64>()).prop_map(|(w, i, r)| Op::Remove(w, i, r)),
        5 => fire,
        1 => (0..4u32).prop_map(Op::RemoveAperture),
    ]
}

/// The naive model: every armed tripwire in a list, checked linearly.
#[derive(Default)]
struct Model {
    live: Vec<(TripId, Spec)>,
    stale: Vec<TripId>,
}

impl Model {
    fn valid(s: &Spec) -> bool {
        s.len > 0
            && s.on & (READ | WRITE) != 0
            && s.on & !(READ | WRITE) == 0
            && s.start.checked_add(s.len).is_some()
    }

    fn remove(&mut self, id: TripId) -> Option<Spec> {
        let at = self.live.iter().position(|(i, _)| *i == id)?;
        self.stale.push(id);
        Some(self.live.swap_remove(at).1)
    }

    fn fire(&mut self, aperture: u32, start: u64, len: u64, kind: u8) -> Vec<(TripId, Spec)> {
        let end = start.saturating_add(len);
        let mut hits: Vec<(TripId, Spec)> = self
            .live
            .iter()
            .filter(|(_, s)| {
                s.aperture == aperture
                    && start < end // an empty access touches nothing
                    && s.on & kind != 0
                    && s.start < end
                    && start < s.start + s.len
            })
            .copied()
            .collect();
        hits.sort_by_key(|(id, _)| id.index);
        for (id, s) in &hits {
            if s.once {
                self.remove(*id);
            }
        }
        hits
    }
}

/// One access on both the matcher and the model: the same hits, in the same order.
fn same_fire(
    m: &mut Matcher,
    model: &mut Model,
    aperture: u32,
    start: u64,
    len: u64,
    kind: u8,
) -> Result<(), TestCaseError> {
    let mut got = Vec::new();
    m.fire(aperture, start, len, kind, |id, s| got.push((id, *s)));
    let want = model.fire(aperture, start, len, kind);
    prop_assert_eq!(
        got,
        want,
        "fire {} [{}, +{}) kind {}",
        aperture,
        start,
        len,
        kind
    );
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut m = Matcher::new();
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Insert(spec) => match m.insert(spec) {
                Ok(id) => {
                    prop_assert!(Model::valid(&spec), "accepted invalid {spec:?}");
                    prop_assert!(
                        model.live.iter().all(|(i, _)| i.index != id.index),
                        "{id:?} reuses a live slot"
                    );
                    prop_assert!(!model.stale.contains(&id), "{id:?} was issued before");
                    model.live.push((id, spec));
                }
                Err(_) => prop_assert!(!Model::valid(&spec), "rejected valid {spec:?}"),
            },
            Op::Remove(which, pick, raw) => {
                let id = match which {
                    0 if !model.live.is_empty() => pick.get(&model.live).0,
                    1 if !model.stale.is_empty() => *pick.get(&model.stale),
                    // Small indices and generations, so some arbitrary ids are live.
                    _ => TripId {
                        index: (raw & 63) as u32,
                        gen: (raw >> 32 & 3) as u32,
                    },
                };
                let want = model.remove(id);
                prop_assert_eq!(m.remove(id), want, "remove {:?}", id);
            }
            Op::Fire {
                aperture,
                start,
                len,
                kind,
            } => {
                same_fire(&mut m, &mut model, aperture, start, len, kind)?;
            }
            Op::FireAtEdge {
                pick,
                at_end,
                delta,
                len,
                kind,
            } => {
                let (aperture, edge) = match model.live.is_empty() {
                    true => (pick.index(3) as u32, pick.index(200) as u64 * PAGE),
                    false => {
                        let s = pick.get(&model.live).1;
                        (s.aperture, if at_end { s.start + s.len } else { s.start })
                    }
                };
                // Start at the edge, or end there when approaching the tripwire's start.
                let start = match at_end {
                    true => edge.saturating_add_signed(delta),
                    false => edge.saturating_sub(len).saturating_add_signed(delta),
                };
                same_fire(&mut m, &mut model, aperture, start, len, kind)?;
            }
            Op::RemoveAperture(aperture) => {
                let mut want: Vec<TripId> = model
                    .live
                    .iter()
                    .filter(|(_, s)| s.aperture == aperture)
                    .map(|(id, _)| *id)
                    .collect();
                want.sort();
                for id in &want {
                    model.remove(*id);
                }
                prop_assert_eq!(m.remove_aperture(aperture), want);
            }
        }
        prop_assert_eq!(m.len(), model.live.len());
        prop_assert_eq!(m.is_empty(), model.live.is_empty());
        for (id, spec) in &model.live {
            prop_assert_eq!(m.get(*id), Some(spec));
            prop_assert!((id.index as usize) < m.index_bound());
        }
        for id in &model.stale {
            prop_assert_eq!(m.get(*id), None);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn matcher_agrees_with_linear_model(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops)?;
    }
}
