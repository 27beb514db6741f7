//! Stress: one million messages of random sizes (mostly small, some up to 64 KiB, a few
//! rendezvous-sized up to 1 MiB) from a child process to the parent, on five tags. Every
//! message's length, tag, sender and contents (derived from the seed and its sequence
//! number) are checked on receipt, and so is the order per tag. The parent keeps up to 64
//! non-blocking receives outstanding on four tags, completes them as they finish (out of
//! posting order across tags), and takes the fifth tag with blocking receives.

mod common;

use clink::{PeerId, RecvRequest, Selector};
use common::*;
use std::collections::VecDeque;
use std::time::Instant;

const N: u64 = 1_000_000;
/// Tags 0..4 are received with `irecv`, tag 4 with blocking `recv`.
const IRECV_TAGS: u64 = 4;
const BLOCKING_TAG: u64 = 4;
const DONE_TAG: u64 = 99;
const WINDOW: usize = 64;
const SEND_WINDOW: usize = 32;

/// Tag and length of the next message (parent and child draw the same sequence).
fn spec(rng: &mut Rng) -> (u64, usize) {
    let r = rng.next_u64();
    let tag = if r % 8 == 7 {
        BLOCKING_TAG
    } else {
        (r >> 3) % IRECV_TAGS
    };
    let u = (r >> 16) % 200_000;
    let len = if u < 8 {
        // ~40 messages: rendezvous-sized.
        rng.range(64 << 10, (1 << 20) + 1)
    } else if u < 200 {
        // ~1000: up to 64 KiB.
        rng.range(4096, (64 << 10) + 1)
    } else if u < 6000 {
        // ~3%: a few KiB.
        rng.range(256, 4096)
    } else {
        rng.below(256)
    };
    (tag, len as usize)
}

#[test]
fn child_entry() {
    child_main(|role| match role {
        "sender" => sender(),
        r => panic!("unknown role {r}"),
    });
}

fn sender() {
    let seed = child_seed();
    let (mut ep, parent) = child_connect();
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut inflight = VecDeque::new();
    for seq in 0..N {
        let (tag, len) = spec(&mut rng);
        let k = key(seed, seq);
        if len > 4096 || seq % 8 == 0 {
            // Owned, non-blocking: several rendezvous sends overlap.
            inflight.push_back(ep.isend(parent, tag, pattern(k, len)).expect("isend"));
            while inflight.len() > SEND_WINDOW {
                let r = inflight.pop_front().expect("nonempty");
                ep.wait_send(&r, Some(T)).expect("wait_send");
            }
        } else {
            fill(k, &mut buf[..len]);
            ep.send(parent, tag, &buf[..len]).expect("send");
        }
    }
    for r in inflight {
        ep.wait_send(&r, Some(T)).expect("wait_send");
    }
    let _ = recv_vec(&mut ep, parent, DONE_TAG, 8);
}

struct Pending {
    req: RecvRequest,
    seq: u64,
    len: usize,
}

fn verify(seed: u64, peer: PeerId, seq: u64, tag: u64, len: usize, st: clink::Status, buf: &[u8]) {
    assert_eq!(st.peer, peer, "message {seq}: sender");
    assert_eq!(st.tag, tag, "message {seq}: tag");
    assert_eq!(st.len as usize, len, "message {seq}: length");
    assert_eq!(buf.len(), len, "message {seq}: buffer length");
    check(key(seed, seq), buf, &format!("message {seq} (tag {tag})"));
}

#[test]
fn million_messages_random_sizes() {
    let seed = seed(0x5eed_0001);
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let mut child = spawn("sender", &ep.address(), seed, &[]);
    let peer = ep.accept(Some(T)).expect("child connects");
    let start = Instant::now();

    let mut rng = Rng::new(seed);
    let mut queues: Vec<VecDeque<Pending>> = (0..IRECV_TAGS).map(|_| VecDeque::new()).collect();
    let mut outstanding = 0usize;
    let mut next = 0u64;
    let mut done = 0u64;
    let mut bytes = 0u64;
    let mut blocking_buf = vec![0u8; (1 << 20) + 8];
    let mut out_of_order = 0u64;
    let mut last_completed_seq = 0u64;
    while done < N {
        // Post ahead, in sending order; a message on the blocking tag is received at once.
        while outstanding < WINDOW && next < N {
            let (tag, len) = spec(&mut rng);
            let seq = next;
            next += 1;
            let slack = (seq % 3) as usize; // the buffer may be larger than the message
            if tag == BLOCKING_TAG {
                let buf = &mut blocking_buf[..len + slack];
                let st = ep
                    .recv_timeout(Selector::exact(Some(peer), tag), buf, Some(T))
                    .unwrap_or_else(|e| panic!("blocking recv of message {seq}: {e}"));
                verify(seed, peer, seq, tag, len, st, &buf[..st.len as usize]);
                done += 1;
                bytes += len as u64;
            } else {
                let req = ep
                    .irecv(Selector::exact(Some(peer), tag), vec![0u8; len + slack])
                    .expect("irecv");
                queues[tag as usize].push_back(Pending { req, seq, len });
                outstanding += 1;
            }
        }
        // Complete whatever is ready, tag by tag (each tag's receives finish in order).
        let mut any = false;
        for (tag, q) in queues.iter_mut().enumerate() {
            while let Some(p) = q.front() {
                match ep.test_recv(&p.req) {
                    Ok(Some(got)) => {
                        verify(seed, peer, p.seq, tag as u64, p.len, got.status, &got.buf);
                        if p.seq < last_completed_seq {
                            out_of_order += 1;
                        }
                        last_completed_seq = p.seq;
                        bytes += p.len as u64;
                        q.pop_front();
                        outstanding -= 1;
                        done += 1;
                        any = true;
                    }
                    Ok(None) => break,
                    Err(e) => panic!("receive of message {}: {e}", p.seq),
                }
            }
        }
        if !any && outstanding > 0 {
            // Nothing ready: block on the oldest outstanding receive.
            let (tag, _) = queues
                .iter()
                .enumerate()
                .filter_map(|(t, q)| q.front().map(|p| (t, p.seq)))
                .min_by_key(|&(_, s)| s)
                .expect("outstanding receive");
            let p = queues[tag].pop_front().expect("front");
            let got = ep
                .wait_recv(&p.req, Some(T))
                .unwrap_or_else(|e| panic!("wait_recv of message {}: {e}", p.seq));
            verify(seed, peer, p.seq, tag as u64, p.len, got.status, &got.buf);
            last_completed_seq = p.seq;
            bytes += p.len as u64;
            outstanding -= 1;
            done += 1;
        }
    }
    let el = start.elapsed();
    ep.send(peer, DONE_TAG, b"done").unwrap();
    child.expect_success(T);
    let s = ep.stats();
    println!(
        "{N} messages, {:.1} MB in {el:.2?}: {:.0} msg/s; completions out of posting order: \
         {out_of_order}; unexpected: {}, cma bytes: {}, sleeps: {}",
        bytes as f64 / 1e6,
        N as f64 / el.as_secs_f64(),
        s.unexpected,
        s.cma_bytes,
        s.sleeps
    );
    assert!(ep.probe(Selector::any()).is_none(), "stray message left");
}
