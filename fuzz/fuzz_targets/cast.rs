//! `clink cast`'s manifest and chunk headers: what the node upstream sends each node.
#![no_main]

use clink_proto::cast::{ChunkHeader, Manifest, HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = ChunkHeader::read(data) {
        // What was read, written again, reads back the same.
        let carried = if h.zero { 0 } else { h.len as usize };
        let mut b = vec![0u8; HEADER + carried];
        h.write(&mut b);
        assert_eq!(ChunkHeader::read(&b), Ok(h));
    }
    if let Ok(m) = Manifest::parse(data) {
        // A manifest taken is one the source could have sent: it reads back the same.
        assert_eq!(Manifest::parse(&m.to_json()), Ok(m.clone()));
        if let (Some(n), Some(c)) = (m.chunks(), &m.cvs) {
            assert_eq!(n, c.len() as u64);
        }
    }
});
