//! Shared-memory ring frames and the connection handshake: what a same-host peer writes.
#![no_main]

use clink_proto::wire::{Frame, Hello, Ready, Welcome};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::parse(data) {
        // What parses re-encodes to bytes that parse to the same frame.
        let mut out = vec![0u8; f.encoded_len()];
        let n = f.encode(&mut out);
        assert_eq!(Frame::parse(&out[..n]).ok(), Some(f));
    }
    let _ = Hello::parse(data, 1 << 20);
    let _ = Welcome::parse(data);
    let _ = Ready::parse(data);
});
