//! Two endpoints that connect to each other at the same moment, over each transport:
//! each may end with two connections to the other (the one it made and the one it
//! accepted), and both ends must use the same one (`Joined::superseded`, then the first
//! connection), so that a directed receive on one end waits on the connection the other
//! end sends on.

mod common;

use clink::config::{Config, TcpConfig, UdpConfig};
use clink::{Context, Endpoint, PeerId};
use common::*;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Rounds of crossed connects per transport.
const ROUNDS: usize = 12;

/// The connection to the endpoint `theirs` that `ep` uses: the first not superseded.
fn kept(ep: &Endpoint, theirs: u128) -> Option<PeerId> {
    ep.peers()
        .into_iter()
        .find(|&p| ep.peer_endpoint_id(p).ok() == Some(theirs) && !ep.joined(p).unwrap().superseded)
}

/// One end of a round: connects to `addr` when the barrier opens, serves until both ends
/// have the connection they keep, then sends its identity on it and receives the other's
/// on its own. Returns (connections to the other, how many crossed).
fn one_end(
    mut ep: Endpoint,
    addr: String,
    theirs: u128,
    go: Arc<Barrier>,
    ready: Arc<AtomicUsize>,
) -> (usize, usize) {
    go.wait();
    ep.connect(&addr).unwrap();
    let deadline = Instant::now() + T;
    let mut mine_ready = false;
    loop {
        if !mine_ready && kept(&ep, theirs).is_some() {
            mine_ready = true;
            ready.fetch_add(1, Ordering::SeqCst);
        }
        if mine_ready && ready.load(Ordering::SeqCst) == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no connection kept within {T:?}");
        let _ = ep.accept(Some(Duration::from_millis(1)));
        ep.progress();
    }
    let p = kept(&ep, theirs).unwrap();
    ep.send(p, 7, &ep.endpoint_id().to_le_bytes()).unwrap();
    assert_eq!(
        recv_vec(&mut ep, p, 7, 16),
        theirs.to_le_bytes(),
        "the message came on the kept connection"
    );
    // Serve until the other end has received too (an unacknowledged datagram).
    go.wait();
    let to_other: Vec<PeerId> = (ep.peers().into_iter())
        .filter(|&q| ep.peer_endpoint_id(q).ok() == Some(theirs))
        .collect();
    let crossed = to_other
        .iter()
        .filter(|&&q| ep.joined(q).unwrap().crossed)
        .count();
    ep.close();
    (to_other.len(), crossed)
}

fn cross(make: impl Fn() -> Context) {
    let (mut pairs, mut crossings) = (0, 0);
    for _ in 0..ROUNDS {
        let a = make().endpoint().unwrap();
        let b = make().endpoint().unwrap();
        let (ida, idb) = (a.endpoint_id(), b.endpoint_id());
        let (addra, addrb) = (a.address(), b.address());
        let go = Arc::new(Barrier::new(2));
        let ready = Arc::new(AtomicUsize::new(0));
        let (g, r) = (go.clone(), ready.clone());
        let t = std::thread::spawn(move || one_end(b, addra, ida, g, r));
        let (na, ca) = one_end(a, addrb, idb, go, ready);
        let (nb, cb) = t.join().unwrap();
        // A pair holds two connections only if a connect crossed the other's.
        assert!(na <= 2 && nb <= 2, "{na} and {nb} connections");
        if na == 2 || nb == 2 {
            pairs += 1;
            assert!(ca + cb > 0, "two connections, none crossed");
        }
        crossings += usize::from(ca + cb > 0);
    }
    eprintln!("{ROUNDS} rounds: {pairs} with two connections, {crossings} crossed");
}

#[test]
fn crossed_shm_connects_agree_on_one_connection() {
    cross(ctx);
}

#[test]
fn crossed_udp_connects_agree_on_one_connection() {
    cross(|| ctx_with(net_config()));
}

#[test]
fn crossed_tcp_connects_agree_on_one_connection() {
    cross(|| {
        ctx_with(Config {
            calibrate: false,
            force_net: true,
            prefer_tcp: true,
            tcp: Some(TcpConfig {
                bind: (Ipv4Addr::LOCALHOST, 0).into(),
                ..TcpConfig::default()
            }),
            udp: Some(UdpConfig {
                bind: (Ipv4Addr::LOCALHOST, 0).into(),
                ..Default::default()
            }),
            ..Config::default()
        })
    });
}
