//! A flag per descriptor read without a lock on every wrapped call (is it a connection,
//! one of the library's wake sockets, in an epoll set): a bitmap of atomic words over
//! descriptors 0 to 65 535. Callers decide what a descriptor beyond it means.

use libc::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

/// Descriptors the map covers.
const FDS: usize = 1 << 16;

/// One flag per descriptor below [`FDS`].
pub struct FdBits([AtomicU64; FDS / 64]);

impl FdBits {
    /// All flags clear.
    pub const fn new() -> FdBits {
        FdBits([const { AtomicU64::new(0) }; FDS / 64])
    }

    /// The word and bit of `fd`; `None` beyond the map (or negative).
    fn at(&self, fd: c_int) -> Option<(&AtomicU64, u64)> {
        let f = usize::try_from(fd).ok().filter(|&f| f < FDS)?;
        Some((&self.0[f / 64], 1u64 << (f % 64)))
    }

    /// `fd`'s flag; `None` beyond the map.
    pub fn get(&self, fd: c_int) -> Option<bool> {
        self.at(fd).map(|(w, b)| w.load(Ordering::Acquire) & b != 0)
    }

    /// Sets `fd`'s flag to `on`; what it was (`None` beyond the map, where nothing is
    /// kept).
    pub fn set(&self, fd: c_int, on: bool) -> Option<bool> {
        self.at(fd).map(|(w, b)| {
            let old = if on {
                w.fetch_or(b, Ordering::AcqRel)
            } else {
                w.fetch_and(!b, Ordering::AcqRel)
            };
            old & b != 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_per_descriptor_and_the_map_ends_where_it_says() {
        let m = FdBits::new();
        for fd in [0, 63, 64, 1000, FDS as c_int - 1] {
            assert_eq!(m.get(fd), Some(false));
            assert_eq!(m.set(fd, true), Some(false));
            assert_eq!(m.get(fd), Some(true));
            if fd + 1 < FDS as c_int {
                assert_eq!(m.get(fd + 1), Some(false), "the next one untouched");
            }
            assert_eq!(m.set(fd, false), Some(true));
            assert_eq!(m.get(fd), Some(false));
        }
        for fd in [-1, FDS as c_int] {
            assert_eq!(m.get(fd), None);
            assert_eq!(m.set(fd, true), None);
        }
    }
}
