//! The aperture patterns between processes, over shared memory (mapped windows, plain
//! stores) and over UDP (puts): the distributed queue with checked contents and
//! wrap-arounds, the flagged mailbox, and an RPC server with three clients sleeping on a
//! tripset.

mod common;

use clink::patterns::dqueue::{Mailbox, QueueReceiver, QueueSender};
use clink::patterns::rpc::{RpcClient, RpcServer};
use clink::patterns::stream::{StreamReader, StreamWriter};
use clink::{Error, PeerId};
use common::*;
use std::time::Duration;

const N: u64 = 20_000;
const ELEM: usize = 64;
const SLOTS: usize = 64;
const TAG: u64 = 100;
const RPC_SIZE: usize = 32;
const CALLS: u64 = 300;
const STREAM_LEN: usize = 8 << 20;
const STREAM_CAP: usize = 16 << 10;

/// The bytes of the stream in a run with `seed`.
fn stream_bytes(seed: u64) -> Vec<u8> {
    pattern(key(seed, 7777), STREAM_LEN)
}

/// A random transfer size: tiny, below the ring, or larger than the ring (split across
/// waits and wrap-arounds), at most `left`.
fn chunk(rng: &mut Rng, left: usize) -> usize {
    let n = match rng.below(4) {
        0 => rng.range(1, 64),
        1 => rng.range(64, STREAM_CAP as u64),
        2 => rng.range(STREAM_CAP as u64, 3 * STREAM_CAP as u64),
        _ => rng.range(1, 2 * STREAM_CAP as u64),
    } as usize;
    n.min(left)
}

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        let (mut ep, parent) = child_connect();
        match role {
            "producer" => {
                let mut q =
                    QueueSender::connect(&mut ep, parent, TAG, ELEM, SLOTS, Some(T)).unwrap();
                for i in 0..N {
                    q.push(&mut ep, &pattern(key(seed, i), ELEM), Some(T))
                        .unwrap();
                }
                // Mailbox: ten messages of growing length.
                let mut m = Mailbox::sender(&mut ep, parent, TAG + 10, 1000, Some(T)).unwrap();
                for i in 0..10usize {
                    m.send(
                        &mut ep,
                        &pattern(key(seed, 1000 + i as u64), i * 100),
                        Some(T),
                    )
                    .unwrap();
                }
                let _ = recv_vec(&mut ep, parent, 99, 8);
            }
            "client" => {
                let mut c = RpcClient::connect(&mut ep, parent, TAG, RPC_SIZE, Some(T)).unwrap();
                let mut resp = [0u8; RPC_SIZE];
                for i in 0..CALLS {
                    let mut req = [0u8; RPC_SIZE];
                    req[..8].copy_from_slice(&key(seed, i).to_le_bytes());
                    c.call(&mut ep, &req, &mut resp, Some(T)).unwrap();
                    let v = u64::from_le_bytes(resp[..8].try_into().unwrap());
                    assert_eq!(v, key(seed, i).wrapping_mul(3), "response to call {i}");
                }
                // Pipelined: 15 requests in flight, a 16th refused, all answered in order.
                let req = |i: u64| {
                    let mut r = [0u8; RPC_SIZE];
                    r[..8].copy_from_slice(&key(seed, CALLS + i).to_le_bytes());
                    r
                };
                for i in 0..15 {
                    c.send(&mut ep, &req(i), Some(T)).unwrap();
                }
                assert!(matches!(
                    c.send(&mut ep, &req(15), Some(T)),
                    Err(Error::Invalid(_))
                ));
                for i in 0..15 {
                    c.recv(&mut ep, &mut resp, Some(T)).unwrap();
                    let v = u64::from_le_bytes(resp[..8].try_into().unwrap());
                    assert_eq!(v, key(seed, CALLS + i).wrapping_mul(3), "pipelined {i}");
                }
                let _ = recv_vec(&mut ep, parent, 99, 8);
            }
            "stream-writer" => {
                let data = stream_bytes(seed);
                let mut rng = Rng::new(seed ^ 1);
                let mut w =
                    StreamWriter::connect(&mut ep, parent, TAG + 20, STREAM_CAP, Some(T)).unwrap();
                let mut pos = 0;
                while pos < data.len() {
                    let n = chunk(&mut rng, data.len() - pos);
                    let mut part = &data[pos..pos + n];
                    if rng.below(4) == 0 {
                        let k = w.try_write(&mut ep, part).unwrap();
                        assert!(k <= n);
                        part = &part[k..];
                    }
                    w.write(&mut ep, part, Some(T)).unwrap();
                    pos += n;
                    if rng.below(64) == 0 {
                        // A pause longer than the reader's spin: it goes to sleep.
                        std::thread::sleep(Duration::from_millis(3));
                    }
                }
                w.flush(&mut ep).unwrap();
                assert_eq!(w.written(), data.len() as u64);
                let _ = recv_vec(&mut ep, parent, 99, 8);
            }
            r => panic!("unknown role {r}"),
        }
    });
}

fn queue_and_mailbox(net: bool) {
    let seed = seed(51);
    let mut ep = transport_ctx(net).endpoint().unwrap();
    let mut child = spawn("producer", &ep.address(), seed, &transport_env(net));
    let peer = ep.accept(Some(T)).unwrap();
    let mut q = QueueReceiver::connect(&mut ep, peer, TAG, ELEM, SLOTS, Some(T)).unwrap();
    let mut buf = [0u8; ELEM];
    for i in 0..N {
        q.pop(&mut ep, &mut buf, Some(T)).unwrap();
        check(key(seed, i), &buf, &format!("queue element {i}"));
    }
    assert!(!q.try_pop(&mut ep, &mut buf).unwrap(), "nothing more");
    let mut m = Mailbox::receiver(&mut ep, peer, TAG + 10, 1000, Some(T)).unwrap();
    let mut out = vec![0u8; 1000];
    for i in 0..9usize {
        let n = m.recv(&mut ep, &mut out, Some(T)).unwrap();
        assert_eq!(n, i * 100);
        check(key(seed, 1000 + i as u64), &out[..n], "mailbox message");
    }
    // The last (900 bytes) into 500: truncated, its head kept.
    let r = m.recv(&mut ep, &mut out[..500], Some(T));
    assert!(
        matches!(
            r,
            Err(Error::Truncated {
                len: 900,
                capacity: 500
            })
        ),
        "{r:?}"
    );
    check(key(seed, 1009), &out[..500], "truncated mailbox message");
    ep.send(peer, 99, b"bye").unwrap();
    // Data moves only while the endpoint is called: close delivers the goodbye (over
    // UDP a datagram the child's host dropped is sent again) before the wait.
    ep.close();
    child.expect_success(T);
    if !net {
        // Same host: the data moved by stores only; nothing was put through the rings.
        assert_eq!(ep.stats().rma_put_bytes, 0);
    }
}

#[test]
fn distributed_queue_and_mailbox_over_shared_memory() {
    queue_and_mailbox(false);
}

#[test]
fn distributed_queue_and_mailbox_over_udp() {
    queue_and_mailbox(true);
}

fn rpc(net: bool) {
    let seed = seed(52);
    let mut ep = transport_ctx(net).endpoint().unwrap();
    let mut kids: Vec<_> = (0..3)
        .map(|k| spawn("client", &ep.address(), seed + k, &transport_env(net)))
        .collect();
    let mut server = RpcServer::new(RPC_SIZE);
    let mut peers = Vec::new();
    for _ in 0..3 {
        let p = ep.accept(Some(T)).unwrap();
        server.add_client(&mut ep, p, TAG, Some(T)).unwrap();
        peers.push(p);
    }
    let mut served = 0;
    while served < 3 * (CALLS as usize + 15) {
        served += server
            .serve(
                &mut ep,
                |_, req, resp| {
                    let v = u64::from_le_bytes(req[..8].try_into().unwrap());
                    resp[..8].copy_from_slice(&v.wrapping_mul(3).to_le_bytes());
                },
                Some(T),
            )
            .unwrap();
    }
    // Every request was served and the clients wait for their "bye": an idle server
    // sleeps on its tripset (each nap blocks after the endpoint's 50 us spin) rather
    // than spinning until the timeout.
    let before = ep.stats().sleeps;
    let idle = server.serve(
        &mut ep,
        |c, _, _| panic!("{c} sent a request after its last one"),
        Some(Duration::from_millis(50)),
    );
    assert!(matches!(idle, Err(Error::Timeout)), "{idle:?}");
    assert!(ep.stats().sleeps > before, "the idle server never slept");
    for p in peers {
        ep.send(p, 99, b"bye").unwrap();
    }
    ep.close(); // (delivers the goodbyes: see above)
    for k in &mut kids {
        k.expect_success(T);
    }
}

#[test]
fn rpc_server_with_three_clients_over_shared_memory() {
    rpc(false);
}

#[test]
fn rpc_server_with_three_clients_over_udp() {
    rpc(true);
}

fn byte_stream(net: bool) {
    let seed = seed(53);
    let data = stream_bytes(seed);
    let mut ep = transport_ctx(net).endpoint().unwrap();
    let mut child = spawn("stream-writer", &ep.address(), seed, &transport_env(net));
    let peer = ep.accept(Some(T)).unwrap();
    let mut r = StreamReader::connect(&mut ep, peer, TAG + 20, STREAM_CAP, Some(T)).unwrap();
    let mut rng = Rng::new(seed ^ 2);
    let mut buf = vec![0u8; 3 * STREAM_CAP];
    let mut pos = 0;
    let (mut reads, mut empty) = (0u64, 0u64);
    while pos < data.len() {
        let want = chunk(&mut rng, data.len() - pos);
        let n = if rng.below(4) == 0 {
            r.try_read(&mut ep, &mut buf[..want]).unwrap()
        } else {
            r.read(&mut ep, &mut buf[..want], Some(T)).unwrap()
        };
        assert!(n <= want);
        if n == 0 {
            empty += 1;
            continue;
        }
        if let Some(i) = (0..n).find(|&i| buf[i] != data[pos + i]) {
            panic!("stream byte {} differs after {reads} reads", pos + i);
        }
        pos += n;
        reads += 1;
        if rng.below(64) == 0 {
            // A pause with the ring filling: the writer goes to sleep.
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    assert_eq!(r.consumed(), data.len() as u64);
    assert_eq!(r.try_read(&mut ep, &mut buf).unwrap(), 0, "nothing more");
    println!("{reads} reads, {empty} empty try_reads");
    ep.send(peer, 99, b"bye").unwrap();
    ep.close(); // (delivers the goodbye: see above)
    child.expect_success(T);
    if !net {
        assert_eq!(ep.stats().rma_put_bytes, 0, "same host: stores only");
    }
}

#[test]
fn byte_stream_over_shared_memory() {
    byte_stream(false);
}

#[test]
fn byte_stream_over_udp() {
    byte_stream(true);
}

#[test]
fn byte_stream_rejects_bad_capacity() {
    let mut ep = ctx().endpoint().unwrap();
    for cap in [0, 1, 32, 1000, 3 << 20, 1 << 31] {
        let w = StreamWriter::connect(&mut ep, PeerId(0), 1, cap, Some(T));
        assert!(matches!(w, Err(Error::Invalid(_))), "capacity {cap}");
        let r = StreamReader::connect(&mut ep, PeerId(0), 1, cap, Some(T));
        assert!(matches!(r, Err(Error::Invalid(_))), "capacity {cap}");
    }
}
