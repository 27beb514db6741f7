//! The activity board: a server endpoint with 12 same-host peers (three child processes
//! of four endpoints each) uses the board (progress visits only the peers that raised
//! their bit). Every client sends messages of random sizes (eager and rendezvous) on two
//! tags; the server receives from any peer, checks each sender's order per tag and the
//! contents, and echoes every message back; clients check the echoes. Run busy-polling
//! and with both sides sleeping after every empty poll (the board's sleeping flag). Then
//! the children exit and a second round reuses the freed board slots.

mod common;

use clink::{Endpoint, PeerId, Selector};
use common::*;
use std::collections::HashMap;
use std::time::Duration;

const CHILDREN: usize = 3;
const PER_CHILD: usize = 4;
const MSGS: u64 = 300;

/// Length of message `k` of client `c` (both sides draw the same sequence).
fn len_of(seed: u64, c: u64, k: u64) -> usize {
    let mut r = Rng::new(seed ^ (c << 32) ^ k);
    match r.below(16) {
        0 => r.range(64 << 10, 300 << 10) as usize, // rendezvous
        1..=3 => r.range(1024, 16 << 10) as usize,
        _ => r.below(200) as usize,
    }
}

/// The content key of client `c`'s message `k` (for `common::pattern` / `check`).
fn msg_key(c: u64, k: u64) -> u64 {
    c << 32 ^ k
}

#[test]
fn child_entry() {
    child_main(|role| match role {
        "clients" => clients(),
        r => panic!("unknown role {r}"),
    });
}

/// Four client endpoints in one process, served round-robin with non-blocking requests.
fn clients() {
    let seed = child_seed();
    let ctx = clink::Context::new().expect("context");
    let addr = std::env::var(ADDR_VAR).expect("address");
    let mut eps: Vec<(Endpoint, PeerId)> = (0..PER_CHILD)
        .map(|_| {
            let mut ep = ctx.endpoint().expect("endpoint");
            let p = ep.connect(&addr).expect("connect");
            (ep, p)
        })
        .collect();
    // Each client first says who it is, then sends its messages and checks the echoes.
    let ids: Vec<u64> = eps
        .iter_mut()
        .map(|(ep, p)| {
            let mut b = [0u8; 8];
            ep.recv_timeout(Selector::exact(Some(*p), 9), &mut b, Some(T))
                .expect("client id");
            u64::from_le_bytes(b)
        })
        .collect();
    for k in 0..MSGS {
        for (n, (ep, p)) in eps.iter_mut().enumerate() {
            let c = ids[n];
            let len = len_of(seed, c, k);
            let msg = pattern(msg_key(c, k), len);
            ep.send(*p, k % 2, &msg).expect("send");
            let mut buf = vec![0u8; len];
            let st = ep
                .recv_timeout(Selector::exact(Some(*p), 10 + k % 2), &mut buf, Some(T))
                .expect("echo");
            assert_eq!(st.len as usize, len);
            assert!(buf == msg, "client {c}: echo {k} differs");
        }
    }
}

fn serve(ep: &mut Endpoint, seed: u64, env: &[(&str, &str)]) {
    let addr = ep.address();
    let mut kids: Vec<ChildProc> = (0..CHILDREN)
        .map(|_| spawn("clients", &addr, seed, env))
        .collect();
    let mut peers = Vec::new();
    for c in 0..CHILDREN * PER_CHILD {
        let p = ep.accept(Some(T)).expect("accept");
        ep.send(p, 9, &(c as u64).to_le_bytes()).expect("id");
        peers.push(p);
    }
    let client: HashMap<PeerId, u64> = peers
        .iter()
        .enumerate()
        .map(|(c, &p)| (p, c as u64))
        .collect();
    let mut next: HashMap<(PeerId, u64), u64> = HashMap::new();
    let mut buf = vec![0u8; 1 << 20];
    let total = (CHILDREN * PER_CHILD) as u64 * MSGS;
    // A lost wake-up of a sleeping endpoint costs its 1 s safety timer: thousands of
    // messages cannot fit in this bound then (a correct round takes well under a second).
    let start = std::time::Instant::now();
    for _ in 0..total {
        assert!(
            start.elapsed() < T * 3,
            "the round is far too slow: lost wake-ups"
        );
        // Far below the liveness period: a message the board failed to announce is only
        // found by the liveness scan, 10 s later, and fails the test.
        let st = ep
            .recv_timeout(Selector::any(), &mut buf, Some(Duration::from_secs(4)))
            .expect("server receive (within 4 s: no lost board wake-up)");
        let c = client[&st.peer];
        let k = next.entry((st.peer, st.tag)).or_insert(st.tag);
        assert_eq!(
            st.len as usize,
            len_of(seed, c, *k),
            "client {c} message {k}"
        );
        check(
            msg_key(c, *k),
            &buf[..st.len as usize],
            &format!("client {c} message {k}"),
        );
        *k += 2;
        ep.send(st.peer, 10 + st.tag, &buf[..st.len as usize])
            .expect("echo");
    }
    for k in &mut kids {
        k.expect_success(T);
    }
}

fn run(env: &[(&str, &str)], config: clink::Config) {
    let seed = seed(0xb0a4d);
    let ctx = ctx_with(config);
    let mut ep = ctx.endpoint().unwrap();
    serve(&mut ep, seed, env);
    let first = ep.stats().board_wakeups;
    assert!(first > 0, "the server never used the board");
    // The children are gone: a second round takes the freed slots.
    serve(&mut ep, seed + 1, env);
    assert!(ep.stats().board_wakeups > first);
    assert_eq!(ep.stats().protocol_errors, 0);
    if ep_sleeps_expected(&ctx) {
        assert!(ep.stats().sleeps > 0, "the sleeping run never slept");
    }
}

fn ep_sleeps_expected(ctx: &clink::Context) -> bool {
    ctx.config().spin == Some(Duration::ZERO)
}

#[test]
fn twelve_peers_on_the_board_busy_polling() {
    run(
        &[],
        clink::Config {
            calibrate: false,
            liveness: Duration::from_secs(10),
            ..Default::default()
        },
    );
}

#[test]
fn twelve_peers_on_the_board_sleeping() {
    run(
        &[("CLINK_SPIN_US", "0")],
        clink::Config {
            calibrate: false,
            spin: Some(Duration::ZERO),
            liveness: Duration::from_secs(10),
            ..Default::default()
        },
    );
}

/// A server driven by message events receives each message where it arrived: the event
/// is progress, so the endpoint does not copy the message aside before `recv` runs.
#[test]
fn message_events_leave_messages_in_place() {
    use clink::events::{self, Event};
    // The server sleeps after each empty poll: the event is found while arming to sleep.
    let ctx = ctx_with(clink::Config {
        calibrate: false,
        spin: Some(Duration::ZERO),
        ..Default::default()
    });
    let mut server = ctx.endpoint().unwrap();
    let addr = server.address();
    let client = std::thread::spawn(move || {
        let ctx = common::ctx();
        let mut ep = ctx.endpoint().unwrap();
        let p = ep.connect(&addr).unwrap();
        let mut b = [0u8; 8];
        for k in 0u64..200 {
            ep.send(p, 1, &k.to_le_bytes()).unwrap();
            ep.recv_timeout(Selector::exact(Some(p), 2), &mut b, Some(T))
                .unwrap();
            assert_eq!(u64::from_le_bytes(b), k);
        }
    });
    server.set_interest(events::MESSAGES);
    let mut b = [0u8; 8];
    let mut served = 0;
    while served < 200 {
        let Event::Message { peer, tag } = server.wait_event(Some(T)).unwrap() else {
            continue;
        };
        server
            .recv_timeout(Selector::exact(Some(peer), tag), &mut b, Some(T))
            .unwrap();
        server.send(peer, 2, &b).unwrap();
        served += 1;
    }
    client.join().unwrap();
    assert_eq!(server.stats().unexpected, 0, "messages were copied aside");
}

/// With `events::REQUESTS`, every non-blocking send and receive reports its completion
/// once, under its request number: eager sends complete at once, rendezvous sends when
/// the peer has read them, receives when the message is in.
#[test]
fn request_completion_events() {
    use clink::events::{self, Event};
    let ctx = ctx();
    let mut ep = ctx.endpoint().unwrap();
    let addr = ep.address();
    let peer_thread = std::thread::spawn(move || {
        let ctx = common::ctx();
        let mut ep = ctx.endpoint().unwrap();
        let p = ep.connect(&addr).unwrap();
        let mut big = vec![0u8; 1 << 20];
        let st = ep
            .recv_timeout(Selector::exact(Some(p), 1), &mut big, Some(T))
            .unwrap();
        assert_eq!(st.len, 1 << 20);
        ep.send(p, 2, b"reply").unwrap();
        let mut b = [0u8; 1];
        ep.recv_timeout(Selector::exact(Some(p), 3), &mut b, Some(T))
            .unwrap();
    });
    let p = ep.accept(Some(T)).unwrap();
    ep.set_interest(events::REQUESTS);
    let small = ep.isend(p, 9, vec![1u8; 8]).unwrap();
    let big = ep.isend(p, 1, vec![7u8; 1 << 20]).unwrap();
    let rx = ep
        .irecv(Selector::exact(Some(p), 2), vec![0u8; 16])
        .unwrap();
    let mut want = vec![
        Event::SendDone {
            req: small.id(),
            ok: true,
        },
        Event::SendDone {
            req: big.id(),
            ok: true,
        },
        Event::RecvDone {
            req: rx.id(),
            ok: true,
        },
    ];
    assert!(small.id() != 0 && small.id() != big.id());
    while !want.is_empty() {
        let e = ep.wait_event(Some(T)).unwrap();
        let k = want
            .iter()
            .position(|w| *w == e)
            .unwrap_or_else(|| panic!("unexpected or repeated event {e:?}"));
        want.remove(k);
    }
    // Completed requests are taken without waiting; nothing else is reported.
    ep.wait_send(&small, Some(Duration::ZERO)).unwrap();
    ep.wait_send(&big, Some(Duration::ZERO)).unwrap();
    let got = ep.wait_recv(&rx, Some(Duration::ZERO)).unwrap();
    assert_eq!(&got.buf[..got.status.len as usize], b"reply");
    assert_eq!(ep.next_event(), None);
    ep.send(p, 3, b"k").unwrap();
    peer_thread.join().unwrap();
}
