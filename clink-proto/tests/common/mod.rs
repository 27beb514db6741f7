//! What the simulation tests share: time units and message contents.

// (Each test crate uses a part.)
#![allow(dead_code)]

/// A millisecond and a second in the simulator's nanoseconds.
pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;

/// Byte `j` of message `msg`'s contents (differs between messages and along each).
pub fn byte_at(msg: u64, j: usize) -> u8 {
    (msg.wrapping_mul(0x9e37_79b9) as usize ^ j.wrapping_mul(131) ^ (j >> 8)) as u8
}

/// Message `msg`'s contents, `len` bytes.
pub fn content(msg: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| byte_at(msg, j)).collect()
}
