//! The UDP transport's datagrams and bulk headers: what any host on the network can send.
#![no_main]

use clink_proto::reliable::packet::{parse_bulk, BulkContext, Datagram, BULK_HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Datagram::parse(data);
    // A connection's view: its id and expected packet number from the first 12 bytes
    // (anything: a receiver may expect any number), the datagram after them.
    if data.len() >= 12 {
        let ctx = BulkContext {
            conn: u32::from_le_bytes(data[..4].try_into().unwrap()),
            next_pn: u64::from_le_bytes(data[4..12].try_into().unwrap()),
        };
        let d = &data[12..];
        let _ = Datagram::parse_in(d, ctx);
        if d.len() >= BULK_HEADER {
            let _ = parse_bulk(ctx, &d[..BULK_HEADER], &d[BULK_HEADER..]);
        }
    }
});
