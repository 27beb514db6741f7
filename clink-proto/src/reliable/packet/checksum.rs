//! The datagrams' checksums: CRC-32C of headers, XXH3 of long payloads.

use super::*;

/// The checksum of a bulk datagram of connection `conn`: the CRC-32C of the connection id
/// (four little-endian bytes, not sent) followed by the first 20 header bytes, XORed, for a
/// hashed payload (`Some`), with the low 32 bits of the payload's XXH3-64 (unseeded). A
/// damaged header changes the CRC, a damaged hashed payload the hash; both at once cancel
/// with probability 2^-32, as a seeded hash would. (Until datagram version 2 the CRC
/// seeded the hash: a seeded XXH3 derives its 192-byte secret on every call, 25 against
/// 31-32 GB/s on 1408-byte fragments.) Computed by `twox-hash`, which picks AVX2 at run
/// time (`xxhash-rust`, used before, compiles SSE2 only for the baseline x86-64 target;
/// BENCHMARKS.md). An unhashed payload (`None`) is left to the UDP checksum,
/// which the sending kernel (or NIC) fills in and the receiving one verifies below clink.
///
/// # Panics
/// When `header20` is not the header's first 20 bytes (a caller bug).
pub fn bulk_checksum(conn: u32, header20: &[u8], payload: Option<&[u8]>) -> u32 {
    // One CRC over 24 contiguous bytes: three words of the short loop.
    let mut covered = [0u8; BULK_HEADER];
    covered[..4].copy_from_slice(&conn.to_le_bytes());
    covered[4..].copy_from_slice(header20);
    let crc = crc32c(&covered);
    payload.map_or(crc, |p| with_hash(crc, p))
}

/// `crc` XORed with the low 32 bits of `payload`'s XXH3-64 (unseeded): a hashed payload's
/// part of a checksum ([`bulk_checksum`], [`data_checksum`]).
fn with_hash(crc: u32, payload: &[u8]) -> u32 {
    payload_hash(payload) ^ crc
}

/// The low 32 bits of `payload`'s XXH3-64 (unseeded).
pub(super) fn payload_hash(payload: &[u8]) -> u32 {
    twox_hash::XxHash3_64::oneshot(payload) as u32
}

/// The trailer of data datagram `d` (everything before the trailer): with a payload of
/// at least [`HASHED_PAYLOAD_MIN`] bytes, the CRC-32C of the rest (header, piggybacked
/// ack) XORed with the low 32 bits of the payload's XXH3-64, as [`bulk_checksum`] does
/// and for its reason: the CRC instruction's serial chain made checksumming the largest
/// user-space cost of a 16 KiB eager ping-pong (6% of all samples, both sides), where
/// XXH3's vector code is several times cheaper per byte. A damaged header or ack moves
/// the CRC, a damaged payload the hash; random damage escapes with probability 2^-32.
/// Shorter payloads, and a datagram too short or too inconsistent to say where its
/// payload is, are CRC'd whole (parsing then refuses the latter anyway); a datagram too
/// short to hold a hashed payload costs one comparison more than a plain CRC.
#[inline]
pub fn data_checksum(d: &[u8]) -> u32 {
    if d.len() < DATA_HEADER + HASHED_PAYLOAD_MIN {
        crc32c(d)
    } else {
        long_data_checksum(d)
    }
}

/// [`data_checksum`] of a datagram long enough to hold a hashed payload (kept out of
/// line: the short datagrams' path inlines to a comparison and the CRC).
#[inline(never)]
fn long_data_checksum(d: &[u8]) -> u32 {
    let end = DATA_HEADER + usize::from(u16_at(d, 56));
    match d.get(DATA_HEADER..end) {
        Some(p) if p.len() >= HASHED_PAYLOAD_MIN => {
            with_hash(crc32c_append(crc32c(&d[..DATA_HEADER]), &d[end..]), p)
        }
        _ => crc32c(d),
    }
}

/// How many leading bytes of datagram `d` clink's own checksum covers: all of them,
/// except for a bulk datagram whose payload is not hashed ([`BulkHeader::hashed`]), whose
/// header alone it covers. Read without verifying anything (a fault injector damages only
/// bytes clink is meant to catch damage to).
pub fn checked_len(d: &[u8]) -> usize {
    if is_bulk(d) && u16::from(d[4]) & FLAG_HASHED == 0 {
        BULK_HEADER
    } else {
        d.len()
    }
}

/// CRC-32C (Castagnoli) of `data`: the SSE 4.2 / ARMv8 instruction where the CPU has
/// it, software otherwise. It covers every byte of ordinary datagrams and the header of
/// bulk ones (whose payloads go through XXH3, see [`bulk_checksum`]); a table-driven CRC
/// (2-3 GB/s here) was a bottleneck of its own. Inputs of at most `SHORT_CRC` bytes (a
/// bulk header, an ack, a small message) take one instruction per 8 bytes in a plain
/// loop (`crate::crc`); longer ones the `crc32c` crate's three interleaved streams,
/// whose set-up (alignment, dispatch, the combining tables) cost a 60-byte bulk header
/// about 160 instructions, twice per fragment.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// [`crc32c`] of `data` continued from `crc`, the CRC of what precedes it.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.len() <= SHORT_CRC {
        if let Some(c) = crate::crc::append(crc, data) {
            return c;
        }
    }
    ::crc32c::crc32c_append(crc, data)
}

/// The longest input [`crc32c`] computes in one serial loop: beyond it, interleaving hides
/// the instruction's latency of 3 cycles.
pub const SHORT_CRC: usize = 512;
