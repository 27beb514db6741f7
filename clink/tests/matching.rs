//! Tag matching across real processes: order per (sender, tag) with interleaved tags,
//! wildcard source (two senders), tag masks, `probe` (no consumption), truncation of eager
//! and rendezvous messages (`Error::Truncated` with the real length, the first bytes
//! intact), zero-byte messages, 1000 receives posted before their messages arrive and
//! completed out of posting order, `cancel_recv`, and the zero-copy forms
//! (`recv_in_place`, `claim`/`commit`).

mod common;

use clink::{Error, PeerId, Selector};
use common::*;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

const DONE: u64 = 0xd0_0e;
const GO: u64 = 0x60;

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        let (mut ep, parent) = child_connect();
        match role {
            "interleave" => child_interleave(&mut ep, parent, seed),
            "wild0" => child_wild(&mut ep, parent, seed, 0),
            "wild1" => child_wild(&mut ep, parent, seed, 1),
            "masks" => {
                for tag in MASK_TAGS {
                    ep.send(parent, tag, &tag.to_le_bytes()).unwrap();
                }
            }
            "probe" => {
                ep.send(parent, 7, &pattern(key(seed, 7), 1234)).unwrap();
                ep.send(parent, 8, &pattern(key(seed, 8), 300 << 10))
                    .unwrap();
            }
            "truncate" => {
                ep.send(parent, 1, &pattern(key(seed, 1), 100)).unwrap();
                ep.send(parent, 2, &pattern(key(seed, 2), 1 << 20)).unwrap();
                ep.send(parent, 3, &pattern(key(seed, 3), 1 << 20)).unwrap();
                ep.send(parent, 4, &pattern(key(seed, 4), 100)).unwrap();
            }
            "zero" => {
                for tag in [0, 0, 1, 2, 3] {
                    ep.send(parent, tag, &[]).unwrap();
                }
                let st = ep
                    .recv_timeout(Selector::exact(Some(parent), 5), &mut [0u8; 4], Some(T))
                    .unwrap();
                assert_eq!(st.len, 0);
                ep.send(parent, 6, &[]).unwrap();
            }
            "thousand" => child_thousand(&mut ep, parent, seed),
            "cancel" => {
                let _ = recv_vec(&mut ep, parent, GO, 0);
                ep.send(parent, 50, b"x").unwrap();
                ep.send(parent, 51, b"y").unwrap();
                ep.send(parent, 52, b"z").unwrap();
                ep.send(parent, 53, b"w").unwrap();
            }
            "inplace_rndv" => {
                ep.send(parent, 21, &pattern(key(seed, 100), 200 << 10))
                    .unwrap();
            }
            "abandon" => {
                for i in 0..3u64 {
                    let m = recv_vec(&mut ep, parent, 30, 4096);
                    assert_eq!(m.len() as u64, i * 10, "only committed messages arrive");
                    ep.send(parent, 31, &m).unwrap();
                }
            }
            "inplace" => {
                for i in 0..10u64 {
                    let len = (i * 37) as usize;
                    ep.send(parent, 20, &pattern(key(seed, i), len)).unwrap();
                }
                // Echo what the parent writes with claim/commit.
                for _ in 0..11 {
                    let m = recv_vec(&mut ep, parent, 30, 4096);
                    ep.send(parent, 31, &m).unwrap();
                }
            }
            r => panic!("unknown role {r}"),
        }
        let _ = recv_vec(&mut ep, parent, DONE, 0);
    });
}

/// Parent side: an endpoint and one child in `role`.
fn setup(role: &str, seed: u64) -> (clink::Endpoint, PeerId, ChildProc) {
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let child = spawn(role, &ep.address(), seed, &[]);
    let peer = ep.accept(Some(T)).expect("child connects");
    (ep, peer, child)
}

fn finish(ep: &mut clink::Endpoint, peer: PeerId, mut child: ChildProc) {
    ep.send(peer, DONE, &[]).unwrap();
    child.expect_success(T);
}

// ------------------------------------------------------------------ order per tag

const INTERLEAVE_N: u64 = 3000;

/// (tag, len) of message `i` of the interleaved stream; every 500th is rendezvous-sized.
fn interleave_spec(rng: &mut Rng, i: u64) -> (u64, usize) {
    let tag = rng.below(3);
    let len = if i % 500 == 250 {
        200 << 10
    } else {
        rng.below(200) as usize
    };
    (tag, len)
}

fn child_interleave(ep: &mut clink::Endpoint, parent: PeerId, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut reqs = Vec::new();
    for i in 0..INTERLEAVE_N {
        let (tag, len) = interleave_spec(&mut rng, i);
        reqs.push(ep.isend(parent, tag, pattern(key(seed, i), len)).unwrap());
    }
    for r in reqs {
        ep.wait_send(&r, Some(T)).unwrap();
    }
}

#[test]
fn order_per_tag_with_interleaved_tags() {
    let seed = seed(11);
    let (mut ep, peer, child) = setup("interleave", seed);
    let mut rng = Rng::new(seed);
    let mut per_tag: Vec<VecDeque<(u64, usize)>> = vec![VecDeque::new(); 3];
    for i in 0..INTERLEAVE_N {
        let (tag, len) = interleave_spec(&mut rng, i);
        per_tag[tag as usize].push_back((i, len));
    }
    // Take the tags one after the other: the others wait (in the ring or aside) meanwhile.
    let mut buf = vec![0u8; 256 << 10];
    for tag in [2u64, 0, 1] {
        for &(i, len) in &per_tag[tag as usize] {
            let st = ep
                .recv_timeout(Selector::exact(Some(peer), tag), &mut buf, Some(T))
                .unwrap_or_else(|e| panic!("tag {tag} message {i}: {e}"));
            assert_eq!(
                (st.peer, st.tag, st.len as usize),
                (peer, tag, len),
                "message {i}"
            );
            check(key(seed, i), &buf[..len], &format!("message {i}"));
        }
    }
    assert!(ep.probe(Selector::any()).is_none());
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ wildcard source

const WILD_N: u64 = 500;

fn child_wild(ep: &mut clink::Endpoint, parent: PeerId, seed: u64, id: u64) {
    let mut rng = Rng::new(seed ^ id);
    for i in 0..WILD_N {
        let len = 16 + rng.below(100) as usize;
        let mut m = pattern(key(seed ^ id, i), len);
        m[..8].copy_from_slice(&id.to_le_bytes());
        m[8..16].copy_from_slice(&i.to_le_bytes());
        ep.send(parent, 5, &m).unwrap();
    }
}

#[test]
fn wildcard_source_from_two_processes() {
    let seed = seed(12);
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let c0 = spawn("wild0", &ep.address(), seed, &[]);
    let c1 = spawn("wild1", &ep.address(), seed, &[]);
    let p0 = ep.accept(Some(T)).unwrap();
    let p1 = ep.accept(Some(T)).unwrap();
    let mut who: HashMap<PeerId, u64> = HashMap::new();
    let mut next = [0u64; 2];
    let mut buf = [0u8; 256];
    for n in 0..2 * WILD_N {
        let sel = if n % 2 == 0 {
            Selector::any()
        } else {
            Selector {
                src: None,
                tag: 5,
                mask: !0,
            }
        };
        let st = ep.recv_timeout(sel, &mut buf, Some(T)).unwrap();
        assert_eq!(st.tag, 5);
        assert!(st.peer == p0 || st.peer == p1, "{st:?}");
        let m = &buf[..st.len as usize];
        let id = u64::from_le_bytes(m[..8].try_into().unwrap());
        let i = u64::from_le_bytes(m[8..16].try_into().unwrap());
        assert!(id < 2);
        assert_eq!(*who.entry(st.peer).or_insert(id), id, "sender identity");
        assert_eq!(i, next[id as usize], "order from child {id}");
        next[id as usize] += 1;
        let mut want = pattern(key(seed ^ id, i), m.len());
        want[..8].copy_from_slice(&id.to_le_bytes());
        want[8..16].copy_from_slice(&i.to_le_bytes());
        assert!(m == &want[..], "content of message {i} from child {id}");
    }
    assert_eq!(next, [WILD_N, WILD_N]);
    assert_eq!(who.len(), 2);
    // Accept order need not be spawn order: pair peers and children by the identity sent.
    let mut children = [Some(c0), Some(c1)];
    for (p, id) in who {
        let c = children[id as usize].take().expect("one peer per child");
        finish(&mut ep, p, c);
    }
}

// ------------------------------------------------------------------ tag masks

const MASK_TAGS: [u64; 5] = [0x201, 0x105, 0x302, 0x1ff, 0x100];

#[test]
fn tag_masks() {
    let seed = seed(13);
    let (mut ep, peer, child) = setup("masks", seed);
    let mut buf = [0u8; 8];
    let mut get = |ep: &mut clink::Endpoint, tag: u64, mask: u64| {
        let sel = Selector {
            src: Some(peer),
            tag,
            mask,
        };
        let st = ep.recv_timeout(sel, &mut buf, Some(T)).unwrap();
        assert_eq!(u64::from_le_bytes(buf), st.tag, "payload names its tag");
        st.tag
    };
    // 0x1?? in arrival order, then the others by low nibble and by anything.
    assert_eq!(get(&mut ep, 0x100, 0xf00), 0x105);
    assert_eq!(get(&mut ep, 0x1ab, 0xf00), 0x1ff);
    assert_eq!(get(&mut ep, 0x100, 0xf00), 0x100);
    assert_eq!(get(&mut ep, 0x002, 0x00f), 0x302);
    assert_eq!(get(&mut ep, 0, 0), 0x201);
    assert!(ep.probe(Selector::any()).is_none());
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ probe

/// Probes until a message matching `sel` shows up (bounded).
fn probe_until(ep: &mut clink::Endpoint, sel: Selector) -> clink::Status {
    let deadline = Instant::now() + T;
    loop {
        if let Some(st) = ep.probe(sel) {
            return st;
        }
        assert!(Instant::now() < deadline, "probe found nothing for {sel:?}");
    }
}

#[test]
fn probe_reports_without_consuming() {
    let seed = seed(14);
    let (mut ep, peer, child) = setup("probe", seed);
    let s7 = Selector::exact(Some(peer), 7);
    let s8 = Selector::exact(Some(peer), 8);
    let st = probe_until(&mut ep, s7);
    assert_eq!((st.peer, st.tag, st.len), (peer, 7, 1234));
    assert_eq!(
        ep.probe(s7),
        Some(st),
        "a second probe sees the same message"
    );
    // The rendezvous message behind it: its real length, before any byte moved.
    let st8 = probe_until(&mut ep, s8);
    assert_eq!((st8.peer, st8.tag, st8.len), (peer, 8, 300 << 10));
    let any = ep.probe(Selector::any()).expect("probe any");
    assert_eq!(any, st, "wildcard probe returns the earliest message");
    // Receive them in the opposite order.
    let m8 = recv_vec(&mut ep, peer, 8, 300 << 10);
    check(key(seed, 8), &m8, "tag 8");
    assert_eq!(ep.probe(s8), None, "received message is gone");
    assert_eq!(ep.probe(s7), Some(st), "still there");
    let m7 = recv_vec(&mut ep, peer, 7, 2000);
    assert_eq!(m7.len(), 1234);
    check(key(seed, 7), &m7, "tag 7");
    assert_eq!(ep.probe(s7), None);
    assert_eq!(ep.probe(Selector::any()), None);
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ truncation

#[test]
fn truncation_reports_real_length_eager_and_rendezvous() {
    let seed = seed(15);
    let (mut ep, peer, child) = setup("truncate", seed);
    let eager_max = ep.eager_max(peer).unwrap();
    assert!((100..1 << 20).contains(&eager_max), "eager max {eager_max}");

    // Eager, blocking receive.
    let mut small = [0u8; 40];
    match ep.recv_timeout(Selector::exact(Some(peer), 1), &mut small, Some(T)) {
        Err(Error::Truncated { len, capacity }) => assert_eq!((len, capacity), (100, 40)),
        r => panic!("expected truncation, got {r:?}"),
    }
    check(
        key(seed, 1),
        &small,
        "first bytes of truncated eager message",
    );

    // Rendezvous, blocking receive.
    let mut part = vec![0u8; 100 << 10];
    match ep.recv_timeout(Selector::exact(Some(peer), 2), &mut part, Some(T)) {
        Err(Error::Truncated { len, capacity }) => {
            assert_eq!((len, capacity), (1 << 20, 100 << 10))
        }
        r => panic!("expected truncation, got {r:?}"),
    }
    check(
        key(seed, 2),
        &part,
        "first bytes of truncated rendezvous message",
    );

    // Rendezvous and eager, non-blocking receives: the buffer comes back with the error.
    for (tag, cap, len) in [(3u64, 4096usize, 1u64 << 20), (4, 10, 100)] {
        let req = ep
            .irecv(Selector::exact(Some(peer), tag), vec![0u8; cap])
            .unwrap();
        match ep.wait_recv(&req, Some(T)) {
            Err(Error::Truncated { len: l, capacity }) => {
                assert_eq!((l, capacity), (len, cap as u64), "tag {tag}")
            }
            r => panic!("tag {tag}: expected truncation, got {r:?}"),
        }
        let buf = ep
            .take_recv_buffer(req)
            .expect("buffer of truncated receive");
        assert_eq!(buf.len(), cap);
        check(key(seed, tag), &buf, &format!("first bytes of tag {tag}"));
    }
    // The sender's blocking sends all succeeded (the child asserts it) and nothing is left.
    assert!(ep.probe(Selector::any()).is_none());
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ zero bytes

#[test]
fn zero_byte_messages() {
    let seed = seed(16);
    let (mut ep, peer, child) = setup("zero", seed);
    let st = ep
        .recv_timeout(Selector::exact(Some(peer), 0), &mut [0u8; 0], Some(T))
        .unwrap();
    assert_eq!((st.tag, st.len), (0, 0));
    let st = ep
        .recv_timeout(Selector::exact(Some(peer), 0), &mut [1u8; 16], Some(T))
        .unwrap();
    assert_eq!((st.tag, st.len), (0, 0));
    let req = ep
        .irecv(Selector::exact(Some(peer), 1), Vec::new())
        .unwrap();
    let got = ep.wait_recv(&req, Some(T)).unwrap();
    assert_eq!((got.status.tag, got.status.len, got.buf.len()), (1, 0, 0));
    let req = ep
        .irecv(Selector::exact(Some(peer), 2), vec![7u8; 64])
        .unwrap();
    let got = ep.wait_recv(&req, Some(T)).unwrap();
    assert_eq!((got.status.tag, got.status.len, got.buf.len()), (2, 0, 0));
    {
        let g = ep
            .recv_in_place(Selector::exact(Some(peer), 3), Some(T))
            .unwrap();
        assert_eq!((g.status().tag, g.status().len, g.len()), (3, 0, 0));
    }
    let r = ep.isend(peer, 5, Vec::new()).unwrap();
    ep.wait_send(&r, Some(T)).unwrap();
    let st = ep
        .recv_timeout(Selector::exact(Some(peer), 6), &mut [0u8; 0], Some(T))
        .unwrap();
    assert_eq!(st.len, 0);
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ 1000 outstanding

const MANY: u64 = 1000;

/// Length of the message for tag `t` of the "thousand" test: every 100th is rendezvous-sized.
fn many_len(seed: u64, t: u64) -> usize {
    if t % 100 == 42 {
        100 << 10
    } else {
        8 + (splitmix(seed ^ t) % 120) as usize
    }
}

fn child_thousand(ep: &mut clink::Endpoint, parent: PeerId, seed: u64) {
    let mut rng = Rng::new(seed);
    let _ = recv_vec(ep, parent, GO, 0);
    // Second half of the posting order first, shuffled; the first half after an ack.
    for half in [MANY / 2..MANY, 0..MANY / 2] {
        let mut tags: Vec<u64> = half.collect();
        rng.shuffle(&mut tags);
        let mut reqs = Vec::new();
        for t in tags {
            reqs.push(
                ep.isend(parent, t, pattern(key(seed, t), many_len(seed, t)))
                    .unwrap(),
            );
        }
        for r in reqs {
            ep.wait_send(&r, Some(T)).unwrap();
        }
        let _ = recv_vec(ep, parent, GO, 0);
    }
}

#[test]
fn thousand_receives_posted_before_messages_complete_out_of_order() {
    let seed = seed(17);
    let (mut ep, peer, child) = setup("thousand", seed);
    // Each receive has exactly the right buffer size; tag t is posted t-th.
    let mut reqs: Vec<Option<clink::RecvRequest>> = (0..MANY)
        .map(|t| {
            Some(
                ep.irecv(Selector::exact(Some(peer), t), vec![0u8; many_len(seed, t)])
                    .unwrap(),
            )
        })
        .collect();
    assert!(ep.test_recv(reqs[0].as_ref().unwrap()).unwrap().is_none());
    ep.send(peer, GO, &[]).unwrap();
    let mut order = Vec::new();
    for half in [MANY / 2..MANY, 0..MANY / 2] {
        let deadline = Instant::now() + T;
        let want = half.clone().count();
        let mut got = 0;
        while got < want {
            assert!(
                Instant::now() < deadline,
                "only {got} of {want} receives done"
            );
            for t in 0..MANY {
                let Some(r) = reqs[t as usize].as_ref() else {
                    continue;
                };
                if let Some(m) = ep.test_recv(r).unwrap() {
                    assert!(
                        half.contains(&t),
                        "tag {t} completed before its message was sent"
                    );
                    assert_eq!((m.status.peer, m.status.tag), (peer, t));
                    assert_eq!(m.buf.len(), many_len(seed, t));
                    check(key(seed, t), &m.buf, &format!("tag {t}"));
                    reqs[t as usize] = None;
                    order.push(t);
                    got += 1;
                }
            }
        }
        ep.send(peer, GO, &[]).unwrap();
    }
    assert_eq!(order.len() as u64, MANY);
    // Posted 0..1000; the second half completed before any of the first.
    assert!(order[..(MANY / 2) as usize].iter().all(|&t| t >= MANY / 2));
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ cancel

#[test]
fn cancel_recv_before_and_after_match() {
    let seed = seed(18);
    let (mut ep, peer, child) = setup("cancel", seed);
    let a = ep
        .irecv(Selector::exact(Some(peer), 50), vec![0u8; 33])
        .unwrap();
    let b = ep
        .irecv(Selector::exact(Some(peer), 51), vec![0u8; 8])
        .unwrap();
    let buf = ep
        .cancel_recv(&a)
        .unwrap()
        .expect("unmatched receive is cancelled");
    assert_eq!(buf.len(), 33, "the buffer comes back whole");
    assert!(matches!(ep.test_recv(&a), Err(Error::Consumed)));
    let c = ep
        .irecv(Selector::exact(Some(peer), 52), vec![0u8; 8])
        .unwrap();
    ep.send(peer, GO, &[]).unwrap();
    // Tag 53 arrives after 52, so once it is here the receive for 52 has matched.
    assert_eq!(recv_vec(&mut ep, peer, 53, 8), b"w");
    assert!(
        ep.cancel_recv(&c).unwrap().is_none(),
        "a matched receive cannot be cancelled"
    );
    assert_eq!(ep.wait_recv(&c, Some(T)).unwrap().buf, b"z");
    assert_eq!(ep.wait_recv(&b, Some(T)).unwrap().buf, b"y");
    // The cancelled receive did not swallow its message.
    assert_eq!(recv_vec(&mut ep, peer, 50, 8), b"x");
    finish(&mut ep, peer, child);
}

// ------------------------------------------------------------------ zero-copy forms

#[test]
fn recv_in_place_and_claim_commit() {
    let seed = seed(19);
    let (mut ep, peer, child) = setup("inplace", seed);
    for i in 0..10u64 {
        let g = ep
            .recv_in_place(Selector::exact(Some(peer), 20), Some(T))
            .unwrap();
        let st = g.status();
        assert_eq!((st.peer, st.tag, st.len), (peer, 20, i * 37));
        assert_eq!(g.len() as u64, i * 37);
        check(key(seed, i), &g, &format!("in-place message {i}"));
    }

    let max = ep.eager_max(peer).unwrap() as usize;
    assert!(matches!(
        ep.claim(peer, 30, max + 1, Some(T)),
        Err(Error::TooLarge(_))
    ));
    for i in 0..11u64 {
        let len = if i == 10 {
            max.min(4096)
        } else {
            (i * 50) as usize
        };
        let k = key(seed, 1000 + i);
        let mut s = ep.claim(peer, 30, len, Some(T)).unwrap();
        assert_eq!(s.buf().len(), len);
        fill(k, s.buf());
        s.commit();
        let echo = recv_vec(&mut ep, peer, 31, 4096);
        assert_eq!(echo.len(), len, "echo {i}");
        check(k, &echo, &format!("claimed message {i}"));
    }
    finish(&mut ep, peer, child);
}

#[test]
fn abandoned_claim_publishes_nothing() {
    let seed = seed(20);
    let (mut ep, peer, child) = setup("abandon", seed);
    for i in 0..3u64 {
        // An abandoned claim of a larger message before each committed one.
        {
            let mut s = ep.claim(peer, 30, 200, Some(T)).unwrap();
            s.buf().fill(0xee);
        }
        let len = (i * 10) as usize;
        let mut s = ep.claim(peer, 30, len, Some(T)).unwrap();
        fill(key(seed, i), s.buf());
        s.commit();
        let echo = recv_vec(&mut ep, peer, 31, 4096);
        check(key(seed, i), &echo, &format!("claimed message {i}"));
        assert_eq!(echo.len(), len);
    }
    finish(&mut ep, peer, child);
}

#[test]
fn recv_in_place_of_rendezvous_message_is_prompt() {
    let seed = seed(21);
    let (mut ep, peer, child) = setup("inplace_rndv", seed);
    assert!(ep.eager_max(peer).unwrap() < 200 << 10);
    let start = Instant::now();
    {
        // A rendezvous message comes in an owned buffer behind the same guard.
        let g = ep
            .recv_in_place(Selector::exact(Some(peer), 21), Some(T))
            .unwrap();
        assert_eq!(g.status().len, 200 << 10);
        check(key(seed, 100), &g, "rendezvous message via recv_in_place");
    }
    let el = start.elapsed();
    println!("recv_in_place of a 200 KiB message took {el:?}");
    assert!(el < T / 2, "took {el:?} with a timeout of {T:?}");
    finish(&mut ep, peer, child);
}
