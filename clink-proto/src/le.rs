//! Little-endian field readers shared by the parsers. Callers check lengths first (with
//! [`need`] or their own error type), so these index without further checks.

use crate::ProtoError;

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn u128_at(b: &[u8], off: usize) -> u128 {
    u128::from(u64_at(b, off)) | (u128::from(u64_at(b, off + 8)) << 64)
}

/// Writes `v` little-endian at `off` (the encoders' counterpart of [`u32_at`]).
pub(crate) fn put_u32(out: &mut [u8], off: usize, v: u32) {
    out[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `off` (the encoders' counterpart of [`u64_at`]).
pub(crate) fn put_u64(out: &mut [u8], off: usize, v: u64) {
    out[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `off`.
pub(crate) fn put_u128(out: &mut [u8], off: usize, v: u128) {
    out[off..off + 16].copy_from_slice(&v.to_le_bytes());
}

/// `Truncated` unless `b` holds at least `n` bytes.
pub(crate) fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), ProtoError> {
    if b.len() < n {
        return Err(ProtoError::Truncated {
            what,
            need: n,
            have: b.len(),
        });
    }
    Ok(())
}
