//! Text a peer or another local process provides: endpoint addresses (text and binary),
//! the sockets layer's pairing messages and the host's cost cache.
#![no_main]

use clink_proto::addr::Address;
use clink_proto::cost::Costs;
use clink_proto::sockets::{Ack, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(a) = Address::parse(s) {
            assert_eq!(Address::parse(&a.to_string()).ok(), Some(a));
        }
        if let Ok((boot, c)) = Costs::from_cache_text(s) {
            assert!(c.sanitized().1.is_empty());
            let _ = boot;
        }
    }
    if let Ok(a) = Address::from_bytes(data) {
        assert_eq!(a.to_bytes().map(|b| b.to_vec()), Some(data.to_vec()));
    }
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }
    let _ = Ack::decode(data);
});
