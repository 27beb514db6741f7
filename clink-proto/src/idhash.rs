//! A hasher for maps keyed by small integers the map's owner assigns (request, export,
//! aperture ids): one multiply instead of SipHash on per-message paths. Not for keys a
//! peer chooses at insertion: a peer could then make them collide. Lookups of
//! peer-supplied keys are fine, since the keys stored are the owner's.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing of an integer key.
#[derive(Default)]
pub struct IdHasher(u64);

const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(MUL);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(MUL);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(MUL);
    }
}

/// A `HashMap` with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_spread_and_round_trip() {
        let mut m: IdMap<u32, u32> = IdMap::default();
        for k in 0..10_000u32 {
            m.insert(k, k * 2);
        }
        assert!((0..10_000u32).all(|k| m[&k] == k * 2));
        let h = |v: u64| {
            let mut x = IdHasher::default();
            x.write_u64(v);
            x.finish()
        };
        assert_ne!(h(1), h(2));
        assert_ne!(
            h(1) >> 57,
            h(2) >> 57,
            "the top bits (hashbrown's tags) differ too"
        );
        // Consecutive ids spread over the tags (an identity hash would put them all in
        // tag 0 and make every probe compare keys).
        let tags: std::collections::HashSet<u64> = (0..1024).map(|v| h(v) >> 57).collect();
        assert!(tags.len() >= 100, "only {} of 128 tags used", tags.len());
    }
}
