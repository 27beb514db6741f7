//! The UDP transport's datagrams and bulk headers: what any host on the network can send.
#![no_main]

use clink_proto::reliable::packet::{parse_bulk, Datagram, BULK_HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Datagram::parse(data);
    if data.len() >= BULK_HEADER {
        let _ = parse_bulk(&data[..BULK_HEADER], &data[BULK_HEADER..]);
    }
});
