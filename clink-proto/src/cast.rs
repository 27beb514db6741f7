//! `clink cast`'s wire format: the manifest the source sends first (JSON: the file's
//! size, its chunk size and each chunk's BLAKE3 chaining value) and the header of each
//! chunk message. Both come from the node upstream, so both are checked here, whole,
//! before a node acts on them (and fuzzed: `fuzz/fuzz_targets/cast.rs`).

use serde_json::{json, Value};

/// Length of a chunk message's header.
pub const HEADER: usize = 64;
/// Magic number at the start of a chunk header.
const DATA_MAGIC: &[u8; 4] = b"CKD1";
/// Flag of a chunk header carrying the chunk's chaining value.
const FLAG_HASH: u32 = 1;
/// Flag of a chunk of zeros: the header says its length, no bytes follow (a sparse file's
/// holes cross the chain as headers and stay holes in every copy).
const FLAG_ZERO: u32 = 2;
/// Manifest format identifier.
pub const MANIFEST_MAGIC: &str = "clink-cast/1";
/// Smallest chunk size (a power of two of at least BLAKE3's 1 KiB chunk, so that every
/// chunk is a whole subtree of the file's hash tree).
pub const CHUNK_MIN: u64 = 64 << 10;
/// Largest chunk size.
pub const CHUNK_MAX: u64 = 64 << 20;

/// A chunk message's header: which chunk, where it goes, how long it is and, for a
/// stream without a manifest of hashes, its chaining value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// The chunk's number.
    pub index: u64,
    /// Its offset in the file.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its chaining value, when the header carries one.
    pub hash: Option<[u8; 32]>,
    /// `len` zeros, not carried.
    pub zero: bool,
}

impl ChunkHeader {
    /// Writes the header into the first [`HEADER`] bytes of `b` (at least that long).
    pub fn write(&self, b: &mut [u8]) {
        b[..4].copy_from_slice(DATA_MAGIC);
        let mut flags = if self.hash.is_some() { FLAG_HASH } else { 0 };
        if self.zero {
            flags |= FLAG_ZERO;
        }
        b[4..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..64].copy_from_slice(&self.hash.unwrap_or([0; 32]));
    }

    /// Reads the header of chunk message `b` and checks that the message carries the
    /// bytes it announces (none for a chunk of zeros).
    pub fn read(b: &[u8]) -> Result<ChunkHeader, String> {
        if b.len() < HEADER || &b[..4] != DATA_MAGIC {
            return Err("a chunk message without a chunk header".into());
        }
        let u64at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut f = [0u8; 4];
        f.copy_from_slice(&b[4..8]);
        let flags = u32::from_le_bytes(f);
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&b[32..64]);
        let h = ChunkHeader {
            index: u64at(8),
            offset: u64at(16),
            len: u64at(24),
            hash: (flags & FLAG_HASH != 0).then_some(hash),
            zero: flags & FLAG_ZERO != 0,
        };
        let carried = if h.zero { 0 } else { h.len };
        if carried != (b.len() - HEADER) as u64 {
            return Err(format!(
                "chunk {}: header says {} bytes, message carries {}",
                h.index,
                h.len,
                b.len() - HEADER
            ));
        }
        Ok(h)
    }
}

/// What the source announces before the data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The file's size; `None` for a stream (standard input).
    pub size: Option<u64>,
    /// Bytes per chunk (a power of two from [`CHUNK_MIN`] to [`CHUNK_MAX`]).
    pub chunk: u64,
    /// Each chunk's chaining value (a file), or `None` (a stream: each chunk header
    /// carries its own).
    pub cvs: Option<Vec<[u8; 32]>>,
    /// The file's BLAKE3 root hash (files of several chunks).
    pub root: Option<[u8; 32]>,
    /// Chunks every node holds already, not sent (a file's cast resumed).
    pub skip: Option<Vec<bool>>,
}

impl Manifest {
    /// The manifest as sent.
    pub fn to_json(&self) -> Vec<u8> {
        json!({
            "magic": MANIFEST_MAGIC,
            "size": self.size,
            "chunk_size": self.chunk,
            "chunks": self.cvs.as_ref().map(|v| v.iter().map(|c| hex(c)).collect::<Vec<_>>()),
            "root": self.root.map(|r| hex(&r)),
            "skip": self.skip.as_ref().map(|s| bits(s)),
        })
        .to_string()
        .into_bytes()
    }

    /// Parses and checks a manifest.
    pub fn parse(b: &[u8]) -> Result<Manifest, String> {
        let v: Value =
            serde_json::from_slice(b).map_err(|e| format!("manifest is not JSON: {e}"))?;
        if v["magic"] != MANIFEST_MAGIC {
            return Err(format!(
                "manifest format {} is not {MANIFEST_MAGIC}",
                v["magic"]
            ));
        }
        let chunk = v["chunk_size"]
            .as_u64()
            .ok_or("manifest without a chunk size")?;
        if !chunk.is_power_of_two() || !(CHUNK_MIN..=CHUNK_MAX).contains(&chunk) {
            return Err(format!(
                "manifest chunk size {chunk} is not a power of two from {CHUNK_MIN} to {CHUNK_MAX}"
            ));
        }
        let size = v["size"].as_u64();
        let cvs = match v["chunks"].as_array() {
            None => None,
            Some(a) => Some(
                a.iter()
                    .enumerate()
                    .map(|(i, h)| {
                        h.as_str()
                            .and_then(unhex32)
                            .ok_or(format!("manifest chunk {i}: not a 32-byte hex hash"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let root = match &v["root"] {
            Value::Null => None,
            r => Some(
                r.as_str()
                    .and_then(unhex32)
                    .ok_or("manifest root is not a 32-byte hex hash")?,
            ),
        };
        match (size, &cvs) {
            (Some(s), Some(c)) => {
                let n = s.div_ceil(chunk);
                if c.len() as u64 != n {
                    return Err(format!(
                        "manifest lists {} chunk hashes for {s} bytes in chunks of {chunk} ({n} chunks)",
                        c.len()
                    ));
                }
                if n >= 2 && root.is_none() {
                    return Err("manifest of several chunks without a root hash".into());
                }
            }
            (None, None) => {}
            _ => return Err("manifest gives a size without chunk hashes or the reverse".into()),
        }
        let skip = match &v["skip"] {
            Value::Null => None,
            s => Some(
                s.as_str()
                    .and_then(unbits)
                    .ok_or("manifest skip list is not a string of 0 and 1")?,
            ),
        };
        if let (Some(s), Some(c)) = (&skip, &cvs) {
            if s.len() != c.len() {
                return Err(format!(
                    "manifest skips from a list of {} chunks, not {}",
                    s.len(),
                    c.len()
                ));
            }
        }
        if skip.is_some() && cvs.is_none() {
            return Err("manifest of a stream skips chunks".into());
        }
        Ok(Manifest {
            size,
            chunk,
            cvs,
            root,
            skip,
        })
    }

    /// What identifies the file for a resumed cast: size, chunk size, root hash (null
    /// for a stream).
    pub fn id(&self) -> Value {
        match (self.size, self.root) {
            (Some(s), Some(r)) => json!({ "size": s, "chunk": self.chunk, "root": hex(&r) }),
            _ => Value::Null,
        }
    }

    /// Number of chunks, when the size is known.
    pub fn chunks(&self) -> Option<u64> {
        self.size.map(|s| s.div_ceil(self.chunk))
    }

    /// The length of chunk `i` of a file of known size.
    pub fn chunk_len(&self, i: u64) -> u64 {
        self.chunk.min(
            self.size
                .unwrap_or(0)
                .saturating_sub(i.saturating_mul(self.chunk)),
        )
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of the hex string `s` (32 of them), or `None` when it is not one.
pub fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A set of chunks as a string of `0` and `1`.
pub fn bits(b: &[bool]) -> String {
    b.iter().map(|&x| if x { '1' } else { '0' }).collect()
}

/// The set of chunks of a string of [`bits`]; `None` when another character is in it.
pub fn unbits(s: &str) -> Option<Vec<bool>> {
    s.bytes()
        .map(|c| match c {
            b'0' => Some(false),
            b'1' => Some(true),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn man(size: u64, chunk: u64) -> Manifest {
        let n = size.div_ceil(chunk) as usize;
        Manifest {
            size: Some(size),
            chunk,
            cvs: Some(vec![[7; 32]; n]),
            root: Some([9; 32]),
            skip: None,
        }
    }

    #[test]
    fn a_manifest_reads_back_as_written() {
        let m = man(10 << 20, 4 << 20);
        let p = Manifest::parse(&m.to_json()).unwrap();
        assert_eq!(p.size, Some(10 << 20));
        assert_eq!(p.chunks(), Some(3));
        assert_eq!(p.cvs, m.cvs);
        assert_eq!(p.root, m.root);
    }

    #[test]
    fn wrong_manifests_are_refused_with_the_reason() {
        let bad = |v: Value, want: &str| {
            let e = Manifest::parse(v.to_string().as_bytes()).unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        let mut v: Value = serde_json::from_slice(&man(10 << 20, 4 << 20).to_json()).unwrap();
        v["chunks"].as_array_mut().unwrap().pop();
        bad(v, "2 chunk hashes for 10485760 bytes");
        let mut v: Value = serde_json::from_slice(&man(10 << 20, 4 << 20).to_json()).unwrap();
        v["chunk_size"] = json!(3 << 20);
        bad(v, "not a power of two");
        let mut v: Value = serde_json::from_slice(&man(10 << 20, 4 << 20).to_json()).unwrap();
        v["magic"] = json!("other/9");
        bad(v, "is not clink-cast/1");
        let mut v: Value = serde_json::from_slice(&man(10 << 20, 4 << 20).to_json()).unwrap();
        v["chunks"][1] = json!("zz");
        bad(v, "manifest chunk 1");
        assert!(Manifest::parse(b"{").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn a_chunk_header_round_trips_and_checks_its_length() {
        let mut b = vec![0u8; HEADER + 10];
        let h = ChunkHeader {
            index: 3,
            offset: 3 << 20,
            len: 10,
            hash: Some([1; 32]),
            zero: false,
        };
        h.write(&mut b);
        let r = ChunkHeader::read(&b).unwrap();
        assert_eq!(
            (r.index, r.offset, r.len, r.hash, r.zero),
            (3, 3 << 20, 10, Some([1; 32]), false)
        );
        assert!(ChunkHeader::read(&b[..HEADER + 5]).is_err());
        // A chunk of zeros: its length in the header, nothing after it.
        let z = ChunkHeader { zero: true, ..h };
        z.write(&mut b);
        let r = ChunkHeader::read(&b[..HEADER]).unwrap();
        assert_eq!((r.len, r.zero), (10, true));
        assert!(
            ChunkHeader::read(&b).is_err(),
            "zeros with bytes after them"
        );
    }

    #[test]
    fn a_skip_list_is_only_zeros_and_ones_for_as_many_chunks() {
        let mut m = man(10 << 20, 4 << 20);
        m.skip = Some(vec![true, false, true]);
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        let mut v: Value = serde_json::from_slice(&m.to_json()).unwrap();
        v["skip"] = json!("1x1");
        let e = Manifest::parse(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("not a string of 0 and 1"), "{e}");
        v["skip"] = json!("11");
        let e = Manifest::parse(v.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("skips from a list of 2 chunks, not 3"), "{e}");
        assert_eq!(unbits(&bits(&[true, false])), Some(vec![true, false]));
    }

    proptest! {
        #[test]
        fn chunk_headers_round_trip(index: u64, offset: u64, len in 0u64..200, hash: Option<[u8; 32]>, zero: bool) {
            let h = ChunkHeader { index, offset, len, hash, zero };
            let mut b = vec![0u8; HEADER + if zero { 0 } else { len as usize }];
            h.write(&mut b);
            prop_assert_eq!(ChunkHeader::read(&b), Ok(h));
        }

        #[test]
        fn manifests_round_trip(size in 0u64..(1 << 28), shift in 16u32..=26, root: [u8; 32], skip: bool) {
            let chunk = 1u64 << shift;
            let n = size.div_ceil(chunk) as usize;
            let m = Manifest {
                size: Some(size),
                chunk,
                cvs: Some((0..n).map(|i| [i as u8; 32]).collect()),
                root: Some(root),
                skip: skip.then(|| (0..n).map(|i| i % 3 == 0).collect()),
            };
            prop_assert_eq!(Manifest::parse(&m.to_json()), Ok(m));
        }

        #[test]
        fn parsing_is_total(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ChunkHeader::read(&b);
            let _ = Manifest::parse(&b);
        }
    }
}
