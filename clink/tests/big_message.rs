//! One message of 4 GiB + 1 byte, beyond any 32-bit length, through each rendezvous
//! method (the copy pipeline through the ring, and a single CMA copy), content checked
//! page by page. Two endpoints in two threads of this process (an endpoint is `Send`).

use clink::{Config, Context, Rndv, Selector};
use std::time::Duration;

const LEN: usize = (4 << 30) + 1;
const PAGE: usize = 4096;

fn page_byte(i: usize) -> u8 {
    (i.wrapping_mul(131) % 251) as u8
}

/// A zeroed buffer backed by transparent huge pages where the kernel offers them (2 MiB
/// faults instead of 4 KiB ones: the test is dominated by page faults otherwise).
fn big_buf(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    let start = (v.as_ptr() as usize).next_multiple_of(2 << 20);
    let end = (v.as_ptr() as usize + len) & !((2 << 20) - 1);
    if end > start {
        // SAFETY: advisory call on a range inside the vector's allocation.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    v
}

fn run(method: Rndv) {
    let cfg = Config {
        calibrate: false,
        rndv: Some(method),
        ..Config::default()
    };
    let ctx = Context::with_config(cfg.clone()).expect("context");
    let mut rx = ctx.endpoint().expect("endpoint");
    let addr = rx.address();
    let sender = std::thread::spawn(move || {
        let ctx = Context::with_config(cfg).expect("context");
        let mut tx = ctx.endpoint().expect("endpoint");
        let peer = tx.connect(&addr).expect("connect");
        let mut msg = big_buf(LEN);
        for (i, page) in msg.chunks_mut(PAGE).enumerate() {
            page.fill(page_byte(i));
        }
        let req = tx.isend(peer, 42, msg).expect("isend");
        tx.wait_send(&req, Some(Duration::from_secs(300)))
            .expect("send completes");
    });
    let peer = rx.accept(Some(Duration::from_secs(10))).expect("accept");
    let req = rx
        .irecv(Selector::exact(Some(peer), 42), big_buf(LEN))
        .expect("irecv");
    let got = rx
        .wait_recv(&req, Some(Duration::from_secs(300)))
        .expect("receive completes");
    sender.join().expect("sender thread");
    assert_eq!(got.status.len, LEN as u64);
    assert_eq!(got.buf.len(), LEN);
    let mut expect = vec![0u8; PAGE];
    for (i, page) in got.buf.chunks(PAGE).enumerate() {
        expect.fill(page_byte(i));
        assert!(page == &expect[..page.len()], "page {i} differs");
    }
    let s = rx.stats();
    match method {
        Rndv::Pipeline => assert_eq!(s.pipeline_bytes, LEN as u64),
        Rndv::Cma => assert_eq!(s.cma_bytes, LEN as u64),
    }
}

/// One test running both methods in turn: each needs 8 GiB (two buffers) at once.
#[test]
fn four_gib_plus_one_by_pipeline_then_cma() {
    run(Rndv::Pipeline);
    run(Rndv::Cma);
}
