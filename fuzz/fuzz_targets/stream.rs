//! The TCP transport's record headers, handshake and the receiver's transfer tracking.
#![no_main]

use clink_proto::stream::{Handshake, Header, Incoming, HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Handshake::parse(data);
    // A transfer announced, then whatever records the peer sends for it.
    let mut inc = Incoming::default();
    inc.expect(7, 1 << 16);
    for rec in data.chunks(HEADER) {
        if let Ok(h) = Header::parse(rec) {
            assert_eq!(Header::parse(&h.encode()).ok(), Some(h));
            let _ = inc.begin(&h);
        }
    }
});
