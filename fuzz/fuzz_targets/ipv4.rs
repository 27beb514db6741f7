//! IPv4 + UDP packets the receive ring captures below the socket layer.
#![no_main]

use clink_proto::ipv4::parse_udp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_udp(data);
});
