//! One-sided access frames and capability cookies: what a peer sends to an aperture.
#![no_main]

use clink_proto::rma::{Cookie, RmaFrame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = RmaFrame::parse(data);
    let _ = Cookie::from_bytes(data);
});
