//! BLAKE3 over a chunked file: each chunk's chaining value (its subtree hash, bound to
//! its offset) and the whole file's root hash merged from them, equal to `b3sum`'s.
//!
//! The chunk size is a power of two of at least BLAKE3's 1 KiB chunk, so every chunk is
//! a complete subtree of the file's BLAKE3 tree and the root follows from the chunks'
//! chaining values without reading the data again (files of one chunk or none excepted:
//! their root is the plain hash of that chunk).

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

/// Chaining value of the chunk `data` starting at byte `offset` of the file.
pub fn chunk_cv(offset: u64, data: &[u8]) -> ChainingValue {
    let mut h = blake3::Hasher::new();
    h.set_input_offset(offset);
    h.update(data);
    h.finalize_non_root()
}

/// Root hash of a file of `size` bytes in chunks of `chunk` bytes whose chaining values
/// are `cvs`. `None` for files of at most one chunk (their root is the plain hash).
pub fn root(size: u64, chunk: u64, cvs: &[ChainingValue]) -> Option<blake3::Hash> {
    if cvs.len() < 2 {
        return None;
    }
    let left = left_subtree_len(size);
    let k = (left / chunk) as usize;
    let l = subtree(left, chunk, &cvs[..k]);
    let r = subtree(size - left, chunk, &cvs[k..]);
    Some(merge_subtrees_root(&l, &r, Mode::Hash))
}

/// Chaining value of a subtree of `len` bytes made of the chunks `cvs`.
fn subtree(len: u64, chunk: u64, cvs: &[ChainingValue]) -> ChainingValue {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let left = left_subtree_len(len);
    let k = (left / chunk) as usize;
    let l = subtree(left, chunk, &cvs[..k]);
    let r = subtree(len - left, chunk, &cvs[k..]);
    merge_subtrees_non_root(&l, &r, Mode::Hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_from_chunk_values_is_blake3_of_the_file() {
        let chunk = 4096u64;
        for size in [4097usize, 8192, 3 * 4096 + 17, 5 * 4096, 9 * 4096 - 1] {
            let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
            let cvs: Vec<_> = data
                .chunks(chunk as usize)
                .enumerate()
                .map(|(i, c)| chunk_cv(i as u64 * chunk, c))
                .collect();
            assert_eq!(
                root(size as u64, chunk, &cvs).unwrap(),
                blake3::hash(&data),
                "size {size}"
            );
        }
    }
}
