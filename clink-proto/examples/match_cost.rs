//! Cost of tag matching against the number of entries queued: `n` receives posted for
//! distinct tags of one peer, their messages arriving in the reverse order (each finds
//! the last receive of the queue: the worst case for a walk from the head), then `n`
//! messages arriving first and their receives posted in the reverse order. Prints the
//! mean nanoseconds per match for each `n`.
//!
//! Run: `cargo run --release -p clink-proto --example match_cost`

use clink_proto::matching::{Matcher, Selector};
use clink_proto::PeerId;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let peer = PeerId(1);
    println!("queued  posted-first ns/match  arrived-first ns/match");
    let sizes: Vec<u64> = match std::env::args().nth(1) {
        Some(n) => vec![n.parse().expect("a queue length")],
        None => vec![1, 8, 64, 512, 4096],
    };
    for n in sizes {
        let rounds = (1 << 16) / n;
        let mut m: Matcher<u64, u64> = Matcher::default();
        let (mut posted_ns, mut arrived_ns) = (0u128, 0u128);
        for _ in 0..rounds {
            for t in 0..n {
                assert!(m.post(Selector::exact(Some(peer), t), t).is_none());
            }
            let at = Instant::now();
            for t in (0..n).rev() {
                black_box(m.take_posted(peer, t));
            }
            posted_ns += at.elapsed().as_nanos();
            for t in 0..n {
                m.push_unexpected(peer, t, t);
            }
            let at = Instant::now();
            for t in (0..n).rev() {
                black_box(m.take_unexpected(&Selector::exact(Some(peer), t)));
            }
            arrived_ns += at.elapsed().as_nanos();
        }
        assert_eq!((m.posted_len(), m.unexpected_len()), (0, 0));
        let per = (rounds * n) as f64;
        println!(
            "{n:>6}  {:>22.1}  {:>22.1}",
            posted_ns as f64 / per,
            arrived_ns as f64 / per
        );
    }
}
