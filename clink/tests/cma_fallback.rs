//! Rendezvous with and without CMA: messages of random sizes up to 16 MiB, in both
//! directions, contents checked, once with CMA disabled on both sides (`Config::cma =
//! false` here, `CLINK_CMA=off` in the child: the pipelined copy through the ring must be
//! used, `uses_cma == false`, no CMA bytes) and once with CMA allowed and chosen for every
//! rendezvous (`rndv: Some(Rndv::Cma)` / `CLINK_RNDV=cma`, since the built-in cost figures
//! prefer the pipeline): it is used, `uses_cma == true`, CMA bytes counted; rendezvous of
//! 128 KiB and more are split between the two sides (the sender writes the first half,
//! `cma_splits` counted), or, with `CLINK_CMA_SPLIT=0` on both sides, never split.

mod common;

use clink::{Config, PeerId, Selector};
use clink_proto::cost::Rndv;
use common::*;

const TO_PARENT: u64 = 1;
const TO_CHILD: u64 = 2;
const RESULT: u64 = 3;

/// Sizes of the run: edge cases around the thresholds, 16 MiB, and random log-uniform ones.
fn sizes(seed: u64) -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        4095,
        4096,
        64 << 10,
        (64 << 10) + 1,
        (1 << 20) - 1,
        16 << 20,
    ];
    let mut rng = Rng::new(seed);
    for _ in 0..16 {
        let bits = rng.range(10, 24); // 1 KiB .. 16 MiB
        v.push(rng.range(1 << (bits - 1), (1 << bits) + 1) as usize);
    }
    v
}

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        let (mut ep, parent) = child_connect();
        let (want_cma, want_split) = match role {
            "cma_on" => (true, true),
            "cma_whole" => (true, false),
            "cma_off" => (false, false),
            r => panic!("unknown role {r}"),
        };
        // Send everything at once (owned buffers, all in flight), then receive.
        let reqs: Vec<_> = sizes(seed)
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                ep.isend(parent, TO_PARENT, pattern(key(seed, i as u64), n))
                    .unwrap()
            })
            .collect();
        let mut ok = 0u64;
        for (i, n) in sizes(seed ^ 1).into_iter().enumerate() {
            let m = recv_vec(&mut ep, parent, TO_CHILD, n);
            assert_eq!(m.len(), n);
            check(key(seed ^ 1, i as u64), &m, &format!("child: message {i}"));
            ok += 1;
        }
        for r in reqs {
            ep.wait_send(&r, Some(T)).unwrap();
        }
        assert_eq!(ep.uses_cma(parent).unwrap(), want_cma, "child's CMA use");
        let s = ep.stats();
        if want_cma {
            assert!(s.cma_bytes > 0, "child: {s:?}");
        } else {
            assert_eq!(s.cma_bytes, 0, "child: {s:?}");
        }
        assert_eq!(s.cma_splits > 0, want_split, "child: {s:?}");
        ep.send(parent, RESULT, &ok.to_le_bytes()).unwrap();
        let _ = recv_vec(&mut ep, parent, RESULT, 0);
    });
}

fn run(cma: bool, split: bool) {
    let seed = seed(41);
    let ctx = ctx_with(Config {
        calibrate: false,
        cma,
        cma_split: split,
        rndv: cma.then_some(Rndv::Cma),
        ..Config::default()
    });
    let mut ep = ctx.endpoint().unwrap();
    let (role, env): (_, &[_]) = match (cma, split) {
        (true, true) => ("cma_on", &[("CLINK_CMA", "auto"), ("CLINK_RNDV", "cma")]),
        (true, false) => (
            "cma_whole",
            &[
                ("CLINK_CMA", "auto"),
                ("CLINK_RNDV", "cma"),
                ("CLINK_CMA_SPLIT", "0"),
            ],
        ),
        (false, _) => ("cma_off", &[("CLINK_CMA", "off")]),
    };
    let mut child = spawn(role, &ep.address(), seed, env);
    let peer: PeerId = ep.accept(Some(T)).unwrap();
    assert_eq!(ep.uses_cma(peer).unwrap(), cma, "parent's CMA use");

    let start = std::time::Instant::now();
    // Child to parent: receives posted in order with buffers of the right size.
    let expect = sizes(seed);
    let total: usize = expect.iter().sum::<usize>() * 2;
    let reqs: Vec<_> = expect
        .iter()
        .map(|&n| {
            ep.irecv(Selector::exact(Some(peer), TO_PARENT), vec![0u8; n])
                .unwrap()
        })
        .collect();
    for (i, (r, &n)) in reqs.iter().zip(&expect).enumerate() {
        let got = ep.wait_recv(r, Some(T)).unwrap();
        assert_eq!(got.status.len as usize, n, "message {i}");
        check(
            key(seed, i as u64),
            &got.buf,
            &format!("parent: message {i}"),
        );
    }
    // Parent to child: blocking sends of borrowed buffers.
    for (i, n) in sizes(seed ^ 1).into_iter().enumerate() {
        ep.send(peer, TO_CHILD, &pattern(key(seed ^ 1, i as u64), n))
            .unwrap();
    }
    let ok = recv_vec(&mut ep, peer, RESULT, 8);
    assert_eq!(ok, (sizes(seed ^ 1).len() as u64).to_le_bytes());
    let el = start.elapsed();
    ep.send(peer, RESULT, &[]).unwrap();
    child.expect_success(T);
    let s = ep.stats();
    println!(
        "cma={cma}: {:.1} MB both ways in {el:.2?}; eager max {} B; {s:?}",
        total as f64 / 1e6,
        ep.eager_max(peer).unwrap()
    );
    if cma {
        assert!(s.cma_bytes > 0, "CMA was not used: {s:?}");
    } else {
        assert_eq!(s.cma_bytes, 0, "CMA used although disabled: {s:?}");
    }
    assert_eq!(s.cma_splits > 0, cma && split, "splits: {s:?}");
}

#[test]
fn rendezvous_without_cma_uses_the_pipeline() {
    run(false, true);
}

#[test]
fn rendezvous_with_cma_splits_the_large_ones() {
    run(true, true);
}

#[test]
fn rendezvous_with_cma_unsplit_reads_it_all() {
    run(true, false);
}
