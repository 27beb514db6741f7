//! CPU cost of bulk transfers over UDP on loopback, without the cross-core transfer: two
//! endpoints driven alternately by one thread, 64 rendezvous messages of 4 MiB per round,
//! seconds of that thread per GB moved (sender and receiver together). The mode picks the
//! receive path: `spec` (default: speculative receive, fragments land in place), `off`
//! (speculation off: every fragment copied from a socket slot), `miss` (the sender
//! misorders each group, so every fragment lands in another's place and is moved: the
//! receiver's backoff is off), `backoff` (the same sender, the receiver's backoff on as by
//! default: after a window that mostly missed, the copy path for a while).
//!
//! A second argument sets the message size (default 4 MiB; the count per round keeps a
//! round at 256 MiB).
//!
//! Run: `cargo run --release -p clink --example bulk_cost -- [spec|off|miss|backoff] [bytes]`
use clink::config::UdpConfig;
use clink::{Config, Context, Selector};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let cfg = || Config {
        calibrate: false,
        force_net: true,
        tcp: None,
        udp: Some(UdpConfig {
            bind: (Ipv4Addr::LOCALHOST, 0).into(),
            mtu: Some(1500),
            speculate: mode != "off",
            force_miss: mode == "miss" || mode == "backoff",
            spec_backoff: mode != "miss",
            ..UdpConfig::default()
        }),
        ..Config::default()
    };
    let ctx_a = Context::with_config(cfg())?;
    let mut a = ctx_a.endpoint()?;
    let addr = a.address();
    let ctx_b = Context::with_config(cfg())?;
    let j = std::thread::spawn(move || {
        let mut b = ctx_b.endpoint().unwrap();
        let p = b.connect(&addr).unwrap();
        (ctx_b, b, p)
    });
    let pa = a.accept(Some(Duration::from_secs(10)))?;
    let (_c, mut b, pb) = j.join().unwrap();
    let n: usize = std::env::args().nth(2).map_or(Ok(4 << 20), |s| s.parse())?;
    if n == 0 {
        return Err("the message size must be at least one byte".into());
    }
    // One message, shared by every send (a clone is a reference count, not a 4 MiB copy
    // that the figures would include).
    let msg = bytes::Bytes::from(vec![7u8; n]);
    let mut bufs: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; n]).collect();
    for round in 0..4 {
        let t = Instant::now();
        let count = (256 << 20) / n.min(256 << 20);
        for _ in 0..count {
            let buf = bufs.pop().unwrap();
            let r = b.irecv(Selector::exact(Some(pb), 1), buf)?;
            let s = a.isend(pa, 1, msg.clone())?;
            let got = loop {
                a.progress();
                b.progress();
                if let Some(g) = b.test_recv(&r)? {
                    break g;
                }
            };
            bufs.push(got.buf);
            a.wait_send(&s, Some(Duration::from_secs(10)))?;
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{mode} round {round}: {:.3} s per GB ({:?} moved)",
            s / (count * n) as f64 * 1e9,
            b.stats().spec_moved
        );
    }
    Ok(())
}
