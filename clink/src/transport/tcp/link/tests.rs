//! The receive side against hand-made streams over a real loopback connection:
//! pieces cut as predicted and not, frames between them, frames larger than the
//! receive buffer, arbitrary read boundaries. After every `receive` the bytes the
//! link calls valid must be the right ones (speculation never clobbers valid data),
//! and at the end everything must be in place.
use super::*;
use crate::lease::Dst;
use std::io::Write;
use std::net::TcpListener;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn connected(speculate: bool) -> (TcpStream, TcpLink) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (r, _) = l.accept().unwrap();
    let mut link = TcpLink::new(r, speculate, Duration::from_secs(2)).unwrap();
    link.handshake = Some((
        Kind::Hello,
        Handshake {
            from: 1,
            to: 2,
            status: 0,
            crossed: false,
        },
    ));
    (w, link)
}

fn frame_record(tag: u64, data: &[u8]) -> Vec<u8> {
    let f = Frame::Eager { tag, data };
    let mut v = vec![0u8; HEADER + f.encoded_len()];
    v[..HEADER].copy_from_slice(&Header::frame(f.encoded_len()).encode());
    f.encode(&mut v[HEADER..]);
    v
}

fn run(seed: u64, speculate: bool) -> TcpStats {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (mut w, mut link) = connected(speculate);
    let total = 1 + rng.below(3 * CHUNK as u64 + 5000) as usize;
    let cap = if rng.below(5) == 0 {
        rng.below(total as u64) as usize
    } else {
        total
    };
    let want: Vec<u8> = (0..total)
        .map(|i| (i as u64 ^ seed) as u8 ^ (i >> 8) as u8)
        .collect();
    let lent = Dst::from_static(Box::leak(vec![0xeeu8; cap].into_boxed_slice()));
    link.expect_bulk(7, total as u64, lent.clone());
    let dest = |r: std::ops::RangeTo<usize>| lent.range(0, r.end).expect("in the lease");
    // The stream: pieces of the transfer (mostly as predicted, sometimes cut
    // otherwise), frames in between.
    let mut stream = Vec::new();
    let mut frames = Vec::new();
    let mut off = 0usize;
    while off < total {
        if rng.below(3) == 0 {
            let big = rng.below(8) == 0;
            let n = if big {
                RX_BUF + rng.below(1 << 20) as usize
            } else {
                rng.below(3000) as usize
            };
            let data: Vec<u8> = (0..n).map(|i| (i as u64 + seed) as u8).collect();
            stream.extend(frame_record(frames.len() as u64, &data));
            frames.push(data);
        }
        let n = if rng.below(4) == 0 {
            1 + rng.below(CHUNK as u64 + 1000) as usize
        } else {
            CHUNK
        }
        .min(total - off);
        stream.extend_from_slice(&Header::data(7, off as u64, n).encode());
        stream.extend_from_slice(&want[off..off + n]);
        off += n;
    }
    stream.extend(frame_record(999, b"end"));
    frames.push(b"end".to_vec());
    // A writer thread writes in random pieces (a blocking write never stalls the
    // reader); the reader checks the valid prefix after every receive.
    let cuts: Vec<usize> = (0..64).map(|_| 1 + rng.below(400_000) as usize).collect();
    let writer = std::thread::spawn(move || {
        let (mut at, mut k) = (0, 0);
        while at < stream.len() {
            let n = cuts[k % cuts.len()].min(stream.len() - at);
            w.write_all(&stream[at..at + n]).unwrap();
            w.flush().unwrap();
            at += n;
            k += 1;
        }
        w
    });
    let mut got_frames = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while got_frames.len() < frames.len() {
        assert!(std::time::Instant::now() < deadline, "stuck (seed {seed})");
        link.receive()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let valid = link.valid_prefix(7).unwrap_or(total as u64) as usize;
        let v = valid.min(cap);
        assert!(
            dest(..v) == &want[..v],
            "seed {seed}: valid prefix {v} clobbered"
        );
        while let Some(f) = link.rxq.peek() {
            match Frame::parse(f).unwrap() {
                Frame::Eager { data, .. } => got_frames.push(data.to_vec()),
                f => panic!("unexpected {f:?}"),
            }
            link.release();
        }
    }
    drop(writer.join().unwrap());
    assert_eq!(got_frames, frames, "seed {seed}");
    assert_eq!(link.done_in, vec![7], "seed {seed}");
    assert!(dest(..cap) == &want[..cap], "seed {seed}: final content");
    link.stats
}

/// Mutated streams (valid records with bytes flipped, cut, or garbage inserted): the
/// link parses them to the end or stops with a `Malformed` error; it never panics,
/// never reports an I/O error, and never writes outside the posted buffer (a guard
/// zone after it stays intact).
#[test]
fn mutated_streams_fail_cleanly() {
    let mut malformed = 0;
    for seed in 0..300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let (mut w, mut link) = connected(rng.below(2) == 0);
        let total = 1 + rng.below(200_000) as usize;
        // The buffer goes 4 KiB beyond the lease: the zone a bug could write past it.
        let buf = Box::leak(vec![0u8; total + 4096].into_boxed_slice());
        let whole = Dst::from_static(buf);
        link.expect_bulk(3, total as u64, whole.sub(0, total).expect("inside"));
        let mut stream = Vec::new();
        let mut off = 0;
        while off < total {
            if rng.below(2) == 0 {
                stream.extend(frame_record(1, &vec![7u8; rng.below(500) as usize]));
            }
            let n = (1 + rng.below(70_000) as usize).min(total - off);
            stream.extend_from_slice(&Header::data(3, off as u64, n).encode());
            stream.extend(std::iter::repeat_n(9u8, n));
            off += n;
        }
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(stream.len() as u64) as usize;
            match rng.below(3) {
                0 => stream[at] ^= 1 << rng.below(8),
                1 => stream.truncate(at.max(1)),
                _ => {
                    let junk: Vec<u8> = (0..rng.below(40)).map(|_| rng.next() as u8).collect();
                    stream.splice(at..at, junk);
                }
            }
        }
        // The end of the stream ends the test; written by a thread so a blocking write
        // never stalls the reader.
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&stream);
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            assert!(std::time::Instant::now() < deadline, "seed {seed}: stuck");
            match link.receive() {
                Ok(_) => {}
                Err(LinkError::Closed) => break,
                Err(LinkError::Malformed(_)) => {
                    malformed += 1;
                    break;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
            while link.rxq.peek().is_some() {
                link.release();
            }
        }
        drop(link); // a writer still blocked on a dead link gets an error
        writer.join().unwrap();
        assert!(
            whole
                .range(total, 4096)
                .expect("inside")
                .iter()
                .all(|&b| b == 0),
            "seed {seed}: wrote past the buffer"
        );
    }
    assert!(malformed > 100, "{malformed}");
}

#[test]
fn any_stream_lands_right_with_and_without_speculation() {
    let mut sum = TcpStats::default();
    for seed in 0..60 {
        for spec in [true, false] {
            let s = run(seed, spec);
            sum.spec_hits += s.spec_hits;
            sum.spec_misses += s.spec_misses;
            sum.cleanup_bytes += s.cleanup_bytes;
            if !spec {
                assert_eq!(s.spec_hits + s.spec_misses, 0);
            }
        }
    }
    // Both paths were taken.
    assert!(sum.spec_hits > 0 && sum.spec_misses > 0, "{sum:?}");
}
