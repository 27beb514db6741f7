//! The aperture patterns between processes, over shared memory (mapped windows, plain
//! stores) and over UDP (puts): the distributed queue with checked contents and
//! wrap-arounds, the flagged mailbox, and an RPC server with three clients sleeping on a
//! tripset.

mod common;

use clink::patterns::dqueue::{Mailbox, QueueReceiver, QueueSender};
use clink::patterns::rpc::{RpcClient, RpcServer};
use common::*;

const N: u64 = 20_000;
const ELEM: usize = 64;
const SLOTS: usize = 64;
const TAG: u64 = 100;
const RPC_SIZE: usize = 32;
const CALLS: u64 = 300;

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
    for i in 0..10usize {
        let n = m.recv(&mut ep, &mut out, Some(T)).unwrap();
        assert_eq!(n, i * 100);
        check(key(seed, 1000 + i as u64), &out[..n], "mailbox message");
    }
    ep.send(peer, 99, b"bye").unwrap();
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
    while served < 3 * CALLS as usize {
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
    for p in peers {
        ep.send(p, 99, b"bye").unwrap();
    }
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
