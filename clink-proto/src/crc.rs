//! CRC-32C of short inputs with the CPU's CRC instruction: the only module of the crate
//! that allows `unsafe`, for one call of a function compiled for SSE 4.2 once the CPU is
//! known to have it. The loop takes 8 bytes per instruction, then 4, then single bytes,
//! from unaligned loads through safe slices: no pointer arithmetic.
#![allow(unsafe_code)]

/// The CRC-32C of `data` continued from `crc`, the CRC of what precedes it (0 for none;
/// initial value and final inversion as in iSCSI and the `crc32c` crate's
/// `crc32c_append`), or `None` where the CPU has no CRC instruction (or this is not
/// x86-64).
#[inline]
pub fn append(crc: u32, data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // The two headers checksummed once per datagram on each side, unrolled: a bulk
        // fragment's (with its connection id, 24 bytes) and a data datagram's (60).
        if let Ok(h) = <&[u8; 24]>::try_from(data) {
            // SAFETY: the CPU has SSE 4.2, checked just above (the detection is cached).
            return Some(unsafe { sse42_fixed(crc, h) });
        }
        if let Ok(h) = <&[u8; 60]>::try_from(data) {
            // SAFETY: as above.
            return Some(unsafe { sse42_fixed(crc, h) });
        }
        // SAFETY: as above.
        return Some(unsafe { sse42(crc, data) });
    }
    let _ = (crc, data);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let mut words = data.chunks_exact(8);
    let mut crc = u64::from(!crc);
    for w in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut crc = crc as u32;
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        crc = _mm_crc32_u32(
            crc,
            u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")),
        );
        rest = &rest[4..];
    }
    for &b in rest {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

/// [`sse42`] of exactly `N` bytes, `N` a multiple of 4: the loop's count known, so it
/// unrolls to `N / 8` word instructions and a half-word one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn sse42_fixed<const N: usize>(crc: u32, data: &[u8; N]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64};
    const { assert!(N.is_multiple_of(4)) };
    let mut crc = u64::from(!crc);
    for k in 0..N / 8 {
        let w: [u8; 8] = data[8 * k..8 * k + 8].try_into().expect("8 bytes");
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(w));
    }
    let mut crc = crc as u32;
    if N % 8 == 4 {
        let w: [u8; 4] = data[N - 4..].try_into().expect("4 bytes");
        crc = _mm_crc32_u32(crc, u32::from_le_bytes(w));
    }
    !crc
}

#[cfg(test)]
mod tests {
    use crate::netsim::Rng;

    #[test]
    fn agrees_with_the_crc32c_crate_at_every_length_and_alignment() {
        let mut rng = Rng::new(5);
        let buf: Vec<u8> = (0..600).map(|_| rng.below(256) as u8).collect();
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            super::append(0, b"x").is_some(),
            std::arch::is_x86_feature_detected!("sse4.2"),
            "the instruction is used wherever the CPU has it"
        );
        for start in 0..8 {
            for len in 0..=520 {
                let d = &buf[start..start + len];
                if let Some(c) = super::append(0, d) {
                    assert_eq!(c, crc32c::crc32c(d), "{len} bytes at {start}");
                }
                // Continued from the CRC of the bytes before it.
                let head = crc32c::crc32c(&buf[..start]);
                if let Some(c) = super::append(head, d) {
                    assert_eq!(
                        c,
                        crc32c::crc32c(&buf[..start + len]),
                        "{len} after {start}"
                    );
                }
            }
        }
    }
}
