//! Apertures and one-sided access between processes, over shared memory and over UDP
//! (loopback): puts and gets of every size class (inline frames and the copy engine),
//! atomics, tripwires firing on remote accesses (with events), forged, revoked,
//! out-of-range and read-only cookies refused at the initiator and counted at the target,
//! mapped windows with plain stores and the notify doorbell, a peer killed while holding a
//! mapping and while writing, and the event queue under overflow.

mod common;

use clink::events::{self, Event};
use clink::rma::{AccessStatus, Cookie, TripOptions, Tripset, COOKIE_LEN, READ, WRITE};
use clink::{Endpoint, Error, PeerId, Selector};
use common::*;

const AP_LEN: usize = 4 << 20;
/// Window of the small read-write export.
const SMALL: (u64, u64) = ((3 << 20) + 65536, 128);
/// Offset of the write tripwire.
const TRIP_AT: u64 = 3 << 20;
const TAG_COOKIES: u64 = 1;
const TAG_REVOKE: u64 = 2;
const TAG_STOP: u64 = 3;
const TAG_REPORT: u64 = 4;
const SIZES: &[usize] = &[1, 8, 100, 4000, 65536, 300_000, 1 << 20];

fn cookie_bytes(cs: &[Cookie]) -> Vec<u8> {
    cs.iter().flat_map(|c| c.to_bytes()).collect()
}

fn cookies(b: &[u8]) -> Vec<Cookie> {
    b.chunks(COOKIE_LEN)
        .map(|c| Cookie::from_bytes(c).expect("cookie"))
        .collect()
}

/// The owner: an aperture with three exports and two tripwires, served until told to stop;
/// then reports its counters and checks what the parent wrote.
fn owner(seed: u64) {
    let (mut ep, parent) = child_connect();
    ep.set_interest(events::ALL);
    let ap = ep.aperture_alloc(AP_LEN).unwrap();
    let rw = ep.export(ap, 0, AP_LEN as u64, READ | WRITE).unwrap();
    let ro = ep.export(ap, 0, 4096, READ).unwrap();
    let small = ep.export(ap, SMALL.0, SMALL.1, READ | WRITE).unwrap();
    let trip = ep
        .tripwire(ap, TRIP_AT, 64, TripOptions::default())
        .unwrap();
    let once = ep
        .tripwire(
            ap,
            0,
            8,
            TripOptions {
                reads: true,
                writes: false,
                once: true,
                event: true,
            },
        )
        .unwrap();
    ep.send(parent, TAG_COOKIES, &cookie_bytes(&[rw, ro, small]))
        .unwrap();
    let mut trip_events = 0u64;
    let mut once_events = 0u64;
    loop {
        match ep.wait_event(Some(T)).expect("owner waits for events") {
            Event::Tripwire { id, peer, .. } => {
                assert_eq!(peer, Some(parent));
                if id == trip {
                    trip_events += 1;
                } else if id == once {
                    once_events += 1;
                }
            }
            Event::Message {
                tag: TAG_REVOKE, ..
            } => {
                let _ = recv_vec(&mut ep, parent, TAG_REVOKE, 8);
                ep.revoke(&small).unwrap();
                ep.send(parent, TAG_REVOKE, b"done").unwrap();
            }
            Event::Message { tag: TAG_STOP, .. } => break,
            _ => {}
        }
    }
    let _ = recv_vec(&mut ep, parent, TAG_STOP, 8);
    // The parent wrote pattern(seed) over the first 1 MiB (the largest put).
    let mut mine = vec![0u8; 1 << 20];
    ep.aperture_read(ap, 0, &mut mine).unwrap();
    check(key(seed, 1 << 20), &mine, "owner's view of the largest put");
    let s = ep.stats();
    let report: Vec<u8> = [
        s.rma_refused,
        ep.tripwire_count(trip),
        trip_events,
        once_events,
        ep.tripwire_fired(once) as u64,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect();
    ep.send(parent, TAG_REPORT, &report).unwrap();
    // Wait for the parent to go (its close), so our goodbye does not race its last reads.
    let _ = ep.recv_timeout(Selector::exact(Some(parent), 99), &mut [0u8; 1], Some(T));
}

#[test]
fn child_entry() {
    child_main(|role| {
        let seed = child_seed();
        match role {
            "owner" => owner(seed),
            "mapper" => {
                // Maps the parent's aperture and stores into it until killed.
                let (mut ep, parent) = child_connect();
                let c = cookies(&recv_vec(&mut ep, parent, TAG_COOKIES, 1024));
                let r = ep.import(parent, c[0]).unwrap();
                let w = ep.map(&r).unwrap();
                ep.send(parent, TAG_COOKIES, b"mapped").unwrap();
                let mut v = 0u64;
                loop {
                    v += 1;
                    w.store_u64(0, v).unwrap();
                    if v.is_multiple_of(1 << 16) {
                        ep.progress();
                    }
                }
            }
            "flooder" => {
                // Puts one word N times into the parent's tripwired aperture.
                let (mut ep, parent) = child_connect();
                let c = cookies(&recv_vec(&mut ep, parent, TAG_COOKIES, 1024));
                let r = ep.import(parent, c[0]).unwrap();
                for i in 0..FLOOD {
                    ep.put(&r, 0, &i.to_le_bytes()).unwrap();
                }
                ep.send(parent, TAG_STOP, b"done").unwrap();
                let _ = ep.recv_timeout(Selector::exact(Some(parent), 99), &mut [0u8; 1], Some(T));
            }
            r => panic!("unknown role {r}"),
        }
    });
}

const FLOOD: u64 = 10_000;

fn refused(r: clink::Result<impl std::fmt::Debug>) -> AccessStatus {
    match r {
        Err(Error::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn one_sided(net: bool) {
    let seed = seed(41);
    let mut ep = transport_ctx(net).endpoint().unwrap();
    let env = transport_env(net);
    let mut child = spawn("owner", &ep.address(), seed, &env);
    let peer = ep.accept(Some(T)).unwrap();
    assert_eq!(ep.transport(peer).unwrap(), if net { "udp" } else { "shm" });
    let c = cookies(&recv_vec(&mut ep, peer, TAG_COOKIES, 1024));
    let (rw, ro, small) = (
        ep.import(peer, c[0]).unwrap(),
        ep.import(peer, c[1]).unwrap(),
        ep.import(peer, c[2]).unwrap(),
    );

    // Puts and gets of every size class, blocking and not.
    for &n in SIZES {
        let k = key(seed, n as u64);
        let data = pattern(k, n);
        let off = 1u64 << 20;
        ep.put(&rw, off, &data).unwrap();
        let mut back = vec![0u8; n];
        ep.get(&rw, off, &mut back).unwrap();
        check(k, &back, &format!("get after put of {n} bytes"));
        let q = ep.iput(&rw, 0, pattern(k ^ 1, n)).unwrap();
        assert!(ep.wait_rma(&q, Some(T)).unwrap().is_empty());
        let g = ep.iget(&rw, 0, n).unwrap();
        check(k ^ 1, &ep.wait_rma(&g, Some(T)).unwrap(), "iget");
    }
    // Requests from one peer apply in order through the copy engine: two large puts
    // (copies) then a small one over the same bytes, all in flight at once.
    if !net {
        let big = 1 << 20;
        // Buffers made first, so the three requests leave back to back.
        let (a, b, c) = (
            pattern(key(seed, 7), big),
            pattern(key(seed, 8), big),
            vec![0xab; 64],
        );
        let reqs = [
            ep.iput(&rw, 0, a).unwrap(),
            ep.iput(&rw, 0, b).unwrap(),
            ep.iput(&rw, 0, c).unwrap(),
        ];
        for q in &reqs {
            ep.wait_rma(q, Some(T)).unwrap();
        }
        let mut got = vec![0u8; big];
        ep.get(&rw, 0, &mut got).unwrap();
        let mut want = pattern(key(seed, 8), big);
        want[..64].fill(0xab);
        assert!(got == want, "puts applied out of order");
    }
    // The last large put, checked by the owner at the end.
    ep.put(&rw, 0, &pattern(key(seed, 1 << 20), 1 << 20))
        .unwrap();

    // Atomics on the small window's first words.
    assert_eq!(ep.fetch_add(&small, 0, 5).unwrap(), 0);
    assert_eq!(ep.fetch_add(&small, 0, 7).unwrap(), 5);
    assert_eq!(ep.compare_swap(&small, 0, 11, 100).unwrap(), 12);
    assert_eq!(ep.compare_swap(&small, 0, 12, 100).unwrap(), 12);
    assert_eq!(ep.fetch_add(&small, 0, 0).unwrap(), 100);
    assert_eq!(
        refused(ep.fetch_add(&small, 4, 1)),
        AccessStatus::Misaligned
    );

    // Tripwire: three puts touching it, one beside it.
    for _ in 0..3 {
        ep.put(&rw, TRIP_AT + 10, b"trip").unwrap();
    }
    ep.put(&rw, TRIP_AT + 64, b"beside").unwrap();
    // Two gets over 0..8: the read-once tripwire there fired on the earlier `iget` and
    // disarmed itself, so these fire nothing (its events are counted below).
    let mut w = [0u8; 8];
    ep.get(&rw, 0, &mut w).unwrap();
    ep.get(&rw, 4, &mut w).unwrap();

    // Refusals: out of range, read-only, forged key, unknown export, revoked.
    let mut refusals = 0;
    assert_eq!(
        refused(ep.put(&small, SMALL.1 - 4, &[0u8; 8])),
        AccessStatus::OutOfRange
    );
    assert_eq!(
        refused(ep.get(&ro, 4000, &mut [0u8; 200])),
        AccessStatus::OutOfRange
    );
    assert_eq!(refused(ep.put(&ro, 0, b"no")), AccessStatus::NotPermitted);
    let mut forged = rw;
    forged.cookie.key ^= 1 << 77;
    assert_eq!(refused(ep.put(&forged, 0, b"forged")), AccessStatus::BadKey);
    assert_eq!(
        refused(ep.get(&forged, 0, &mut [0u8; 8])),
        AccessStatus::BadKey
    );
    let mut unknown = rw;
    unknown.cookie.export = 999;
    assert_eq!(
        refused(ep.put(&unknown, 0, b"x")),
        AccessStatus::NoSuchExport
    );
    refusals += 7; // with the misaligned atomic
    ep.send(peer, TAG_REVOKE, b"revoke").unwrap();
    assert_eq!(recv_vec(&mut ep, peer, TAG_REVOKE, 8), b"done");
    assert_eq!(refused(ep.put(&small, 0, b"late")), AccessStatus::Revoked);
    refusals += 1;
    // The other windows still work.
    ep.put(&rw, 2 << 20, b"still fine").unwrap();
    // Unacknowledged puts: a refusal still comes back; flush_rma waits for them.
    ep.put_nowait(&ro, 0, b"nope").unwrap();
    ep.put_nowait(&rw, (2 << 20) + 16, b"unacked").unwrap();
    ep.flush_rma(Some(peer)).unwrap();
    assert_eq!(ep.stats().rma_unacked_refused, 1);
    assert!(ep.last_error().unwrap().contains("does not grant"));
    let mut b = [0u8; 7];
    ep.get(&rw, (2 << 20) + 16, &mut b).unwrap();
    assert_eq!(&b, b"unacked");
    refusals += 1;

    // Mapping: same host only.
    if net {
        assert_eq!(refused(ep.map(&rw)), AccessStatus::Unsupported);
    } else {
        let m = ep.map(&rw).unwrap();
        assert!(m.writable());
        m.store_u64(TRIP_AT + 8, 0xfeed).unwrap();
        ep.notify(&rw, TRIP_AT + 8, 8).unwrap(); // fires the tripwire: the 4th firing
        let mut b = [0u8; 8];
        ep.get(&rw, TRIP_AT + 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 0xfeed, "a store through the mapping");
        assert!(matches!(
            m.store_u64(AP_LEN as u64, 1),
            Err(Error::Refused {
                status: AccessStatus::OutOfRange,
                ..
            })
        ));
        let r = ep.map(&ro).unwrap();
        assert!(!r.writable());
        assert_eq!(refused(r.store_u64(0, 1)), AccessStatus::NotPermitted);
        assert_eq!(r.load_u64(0).unwrap(), m.load_u64(0).unwrap());
        assert_eq!(refused(ep.map(&forged)), AccessStatus::BadKey);
        refusals += 1;
    }

    ep.send(peer, TAG_STOP, b"stop").unwrap();
    let rep = recv_vec(&mut ep, peer, TAG_REPORT, 64);
    let v: Vec<u64> = rep
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let fired = if net { 3 } else { 4 };
    assert_eq!(v[0], refusals, "refusals counted at the target");
    assert_eq!(v[1], fired, "tripwire count");
    assert_eq!(v[2], fired, "tripwire events");
    assert_eq!(v[3], 1, "the once-only tripwire fired once");
    assert_eq!(v[4], 1, "its bit is set");
    drop(ep);
    child.expect_success(T);
}

#[test]
fn one_sided_access_over_shared_memory() {
    one_sided(false);
}

#[test]
fn one_sided_access_over_udp() {
    one_sided(true);
}

/// A peer that mapped our aperture and stores into it is killed: our aperture and endpoint
/// stay sound; a peer whose aperture we mapped is killed: our stores keep working (the
/// memory stays mapped) and one-sided requests to it fail with PeerDead.
#[test]
fn peer_killed_while_holding_a_mapping() {
    let seed = seed(43);
    let mut ep = ctx().endpoint().unwrap();
    let ap = ep.aperture_alloc(4096).unwrap();
    let c = ep.export(ap, 0, 4096, READ | WRITE).unwrap();
    let mut child = spawn("mapper", &ep.address(), seed, &[]);
    let peer = ep.accept(Some(T)).unwrap();
    ep.send(peer, TAG_COOKIES, &c.to_bytes()).unwrap();
    assert_eq!(recv_vec(&mut ep, peer, TAG_COOKIES, 16), b"mapped");
    let win = ep.aperture_window(ap).unwrap();
    // The child is storing: watch the word move, then kill it mid-stream.
    let first = win.load_u64(0).unwrap();
    drive_until(&mut ep, T, "the mapper's stores", |_| {
        win.load_u64(0).unwrap() > first + 1000
    });
    child.kill();
    child.reap();
    drive_until(&mut ep, T, "the mapper's death", |ep| !ep.is_alive(peer));
    ep.aperture_write(ap, 8, b"after").unwrap();
    let mut b = [0u8; 5];
    ep.aperture_read(ap, 8, &mut b).unwrap();
    assert_eq!(&b, b"after");

    // The other way round: we map a child's aperture, the child dies.
    let mut owner = spawn("owner", &ep.address(), seed, &[]);
    let peer = ep.accept(Some(T)).unwrap();
    let c = cookies(&recv_vec(&mut ep, peer, TAG_COOKIES, 1024));
    let rw = ep.import(peer, c[0]).unwrap();
    let m = ep.map(&rw).unwrap();
    m.store_u64(0, 1).unwrap();
    owner.kill();
    owner.reap();
    for i in 0..1000 {
        m.store_u64(8 * (i % 512), i).unwrap(); // no SIGBUS: the memory file is sealed
    }
    drive_until(&mut ep, T, "the owner's death", |ep| !ep.is_alive(peer));
    assert!(matches!(ep.put(&rw, 0, b"x"), Err(Error::PeerDead(p)) if p == peer));
}

/// Ten thousand tripwire events with nobody dequeuing: the ring (4096) overflows into the
/// ordered overflow list; the consumer gets one Overflow report, then every event, none
/// lost.
#[test]
fn event_queue_overflow_loses_nothing() {
    let seed = seed(44);
    let mut ep = ctx().endpoint().unwrap();
    ep.set_interest(events::TRIPWIRES | events::PEERS);
    let ap = ep.aperture_alloc(4096).unwrap();
    let t = ep.tripwire(ap, 0, 8, TripOptions::default()).unwrap();
    let c = ep.export(ap, 0, 4096, WRITE).unwrap();
    let mut child = spawn("flooder", &ep.address(), seed, &[]);
    let peer = ep.accept(Some(T)).unwrap();
    ep.send(peer, TAG_COOKIES, &c.to_bytes()).unwrap();
    // Drive progress only (no dequeue) until the flooder says it is done.
    let _ = recv_vec(&mut ep, peer, TAG_STOP, 8);
    assert_eq!(ep.tripwire_count(t), FLOOD);
    let mut trips = 0;
    let mut overflow = None;
    let mut connected = 0;
    while let Some(e) = ep.next_event() {
        match e {
            Event::Tripwire { id, .. } => {
                assert_eq!(id, t);
                trips += 1;
            }
            Event::Overflow { spilled, lost } => {
                assert!(overflow.is_none(), "one report");
                assert_eq!(lost, 0);
                overflow = Some(spilled);
            }
            Event::PeerConnected(p) => {
                assert_eq!(p, peer);
                connected += 1;
            }
            e => panic!("unexpected event {e:?}"),
        }
    }
    assert_eq!(trips, FLOOD, "every firing delivered");
    assert_eq!(connected, 1);
    let spilled = overflow.expect("an overflow report");
    assert_eq!(
        spilled,
        FLOOD + 1 - 4096,
        "queue capacity 4096, the rest spilled"
    );
    let mut set = Tripset::new();
    set.add(t);
    assert_eq!(ep.wait_tripset(&set, Some(T)).unwrap(), t, "its bit is set");
    assert!(!ep.tripwire_fired(t), "cleared by the wait");
    drop(ep);
    child.expect_success(T);
}

/// `User` events posted from another thread reach an endpoint blocked in `wait_event`
/// (no spinning: each post after it sleeps must ring its doorbell), in the order posted.
/// All 200 must arrive within 5 s: without the doorbell each would wait for the 1 s
/// safety wake-up or its timeout.
#[test]
fn event_sender_wakes_a_sleeping_endpoint() {
    let mut ep = ctx_with(clink::Config {
        calibrate: false,
        spin: Some(std::time::Duration::ZERO),
        ..clink::Config::default()
    })
    .endpoint()
    .unwrap();
    let tx = ep.event_sender();
    let (ready, go) = std::sync::mpsc::channel::<()>();
    let poster = std::thread::spawn(move || {
        for v in 0..200u64 {
            // Wait until the endpoint has taken the previous event, so most posts find
            // it asleep (or about to be).
            go.recv_timeout(T).expect("endpoint alive");
            assert!(tx.post(v), "queue has room");
        }
    });
    let before = ep.stats().sleeps;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for v in 0..200u64 {
        ready.send(()).unwrap();
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert_eq!(ep.wait_event(Some(left)).unwrap(), Event::User(v));
    }
    poster.join().unwrap();
    assert!(
        ep.stats().sleeps > before,
        "the endpoint slept at least once"
    );
}

/// `wait_event`'s fast path keeps a peer's order and answers refusals: a large put (the
/// target's copy engine, or many frames without CMA) followed by a one-word put with a
/// tripwire, then a forged put and a good one. The tripwire event of the word comes after
/// the large put landed, and the forged put is refused (counted at the target, reported
/// to the initiator) without an event. The initiator runs on its own thread.
#[test]
fn wait_event_fast_path_keeps_order_and_refuses() {
    const BIG: usize = 1 << 20;
    let mut b = ctx().endpoint().unwrap();
    b.set_interest(events::TRIPWIRES);
    let ap = b.aperture_alloc(8 + BIG).unwrap();
    let trip = b.tripwire(ap, 0, 8, TripOptions::default()).unwrap();
    let cookie = b.export(ap, 0, (8 + BIG) as u64, READ | WRITE).unwrap();
    let addr = b.address();
    let initiator = std::thread::spawn(move || {
        let mut a = ctx().endpoint().unwrap();
        let pa = a.connect(&addr).unwrap();
        let r = a.import(pa, cookie).unwrap();
        let mut forged = cookie;
        forged.key ^= 1;
        let bad = a.import(pa, forged).unwrap();
        let req = a.iput(&r, 8, pattern(7, BIG)).unwrap();
        a.put_nowait(&r, 0, &1u64.to_le_bytes()).unwrap();
        a.put_nowait(&bad, 0, &2u64.to_le_bytes()).unwrap();
        a.put_nowait(&r, 0, &3u64.to_le_bytes()).unwrap();
        a.wait_rma(&req, Some(T)).unwrap();
        drive_until(&mut a, T, "the refusal reaching the initiator", |a| {
            a.stats().rma_unacked_refused == 1
        });
        assert!(a.last_error().is_some_and(|e| e.contains("refused")));
        a.flush_rma(None).unwrap();
    });
    let _pb = b.accept(Some(T)).unwrap();
    let wait_trip = |b: &mut Endpoint| match b.wait_event(Some(T)).unwrap() {
        Event::Tripwire { id, offset, .. } => {
            assert_eq!(id, trip);
            assert_eq!(offset, 0);
        }
        e => panic!("unexpected event {e:?}"),
    };
    wait_trip(&mut b);
    let mut landed = vec![0u8; BIG];
    b.aperture_read(ap, 8, &mut landed).unwrap();
    check(
        7,
        &landed,
        "the large put, before the word's tripwire event",
    );
    wait_trip(&mut b);
    let mut word = [0u8; 8];
    b.aperture_read(ap, 0, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), 3, "the forged put wrote nothing");
    assert_eq!(b.stats().rma_refused, 1, "the forged put is refused");
    // The initiator's flush needs this side's progress.
    while !initiator.is_finished() {
        b.progress();
    }
    initiator.join().unwrap();
}

/// A put under two tripwires reports both, once each and in tripwire order, put after
/// put: `wait_event`'s fast path hands the first back itself and queues the second.
#[test]
fn one_put_under_two_tripwires_reports_both_in_order() {
    let mut b = ctx().endpoint().unwrap();
    b.set_interest(events::TRIPWIRES);
    let ap = b.aperture_alloc(4096).unwrap();
    let t1 = b.tripwire(ap, 0, 8, TripOptions::default()).unwrap();
    let t2 = b.tripwire(ap, 4, 8, TripOptions::default()).unwrap();
    let cookie = b.export(ap, 0, 64, READ | WRITE).unwrap();
    let addr = b.address();
    let initiator = std::thread::spawn(move || {
        let mut a = ctx().endpoint().unwrap();
        let pa = a.connect(&addr).unwrap();
        let r = a.import(pa, cookie).unwrap();
        for v in 1..=3u64 {
            a.put_nowait(&r, 0, &v.to_le_bytes()).unwrap();
        }
        a.flush_rma(None).unwrap();
    });
    let pb = b.accept(Some(T)).unwrap();
    for round in 1..=3u64 {
        for want in [t1, t2] {
            match b.wait_event(Some(T)).unwrap() {
                Event::Tripwire {
                    id,
                    peer,
                    offset,
                    len,
                    write,
                } => assert_eq!(
                    (id, peer, offset, len, write),
                    (want, Some(pb), 0, 8, true),
                    "put {round}"
                ),
                e => panic!("unexpected event {e:?}"),
            }
        }
    }
    assert_eq!((b.tripwire_count(t1), b.tripwire_count(t2)), (3, 3));
    assert!(b.next_event().is_none(), "each reported once");
    while !initiator.is_finished() {
        b.progress();
    }
    initiator.join().unwrap();
}

/// `r` failed with `Error::Invalid` saying `what`.
#[track_caller]
fn invalid<T: std::fmt::Debug>(r: clink::Result<T>, what: &str) {
    match r {
        Err(Error::Invalid(m)) => assert!(m.contains(what), "{m:?} does not say {what:?}"),
        r => panic!("expected Invalid({what:?}), got {r:?}"),
    }
}

/// Local misuse gets clear errors.
#[test]
fn local_misuse_is_refused() {
    let mut ep: Endpoint = ctx().endpoint().unwrap();
    invalid(ep.aperture_alloc(0), "at least one byte");
    let ap = ep.aperture_alloc(100).unwrap();
    invalid(
        ep.export(ap, 50, 51, READ),
        "50+51 outside aperture of 100 bytes",
    );
    invalid(ep.export(ap, 0, 10, 0), "bad rights 0x0");
    invalid(ep.export(ap, 0, 10, 4), "bad rights 0x4");
    invalid(
        ep.tripwire(ap, 90, 11, TripOptions::default()),
        "tripwire 90+11 outside aperture of 100 bytes",
    );
    invalid(
        ep.aperture_write(ap, 99, b"ab"),
        "99+2 outside aperture of 100 bytes",
    );
    let c = ep.export(ap, 0, 10, READ).unwrap();
    assert!(
        matches!(ep.import(PeerId(0), c), Err(Error::UnknownPeer(PeerId(0)))),
        "no such peer"
    );
    let buf = ep.aperture_register(vec![7u8; 10]).unwrap();
    invalid(ep.aperture_window(buf), "registered buffer has no window");
    assert_eq!(ep.aperture_destroy(buf).unwrap(), Some(vec![7u8; 10]));
    invalid(ep.aperture_destroy(buf), "no aperture");
    let mut fake = c;
    fake.key ^= 1;
    invalid(ep.revoke(&fake), "not a cookie of this endpoint");
    ep.revoke(&c).unwrap();
}

/// The sender of the receive-into-aperture tests: connects to `addr`, waits for the
/// receiver's word (tag 6) first when `go_first`, sends 5, 300 000 and 100 bytes under tag
/// 5, then waits for the receiver's word again before closing.
fn three_messages(addr: String, go_first: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut s = ctx().endpoint().unwrap();
        let p = s.connect(&addr).unwrap();
        let word = |s: &mut Endpoint| {
            s.recv_timeout(Selector::exact(Some(p), 6), &mut [0u8; 1], Some(T))
                .unwrap()
        };
        if go_first {
            word(&mut s);
        }
        s.send(p, 5, b"small").unwrap();
        s.send(p, 5, &vec![9u8; 300_000]).unwrap();
        s.send(p, 5, &[1u8; 100]).unwrap();
        word(&mut s);
    })
}

/// The receiving side of those tests: the sender's peer id, a 1 MiB aperture, and write
/// tripwires with events over its first word and over the word at 200 000.
fn landing_aperture(
    ep: &mut Endpoint,
) -> (
    PeerId,
    clink::rma::ApertureId,
    clink::rma::TripId,
    clink::rma::TripId,
) {
    let peer = ep.accept(Some(T)).unwrap();
    ep.set_interest(events::TRIPWIRES);
    let ap = ep.aperture_alloc(1 << 20).unwrap();
    let head = ep.tripwire(ap, 0, 8, TripOptions::default()).unwrap();
    let far = ep.tripwire(ap, 200_000, 8, TripOptions::default()).unwrap();
    (peer, ap, head, far)
}

/// Tagged messages received into an aperture fire its write tripwires (with the sender as
/// the accessing peer), eager and rendezvous alike; a truncated one fires over what landed.
#[test]
fn messages_landing_in_an_aperture_fire_tripwires() {
    let mut ep = ctx().endpoint().unwrap();
    let sender = three_messages(ep.address(), false);
    let (peer, ap, head, far) = landing_aperture(&mut ep);
    let sel = Selector::exact(Some(peer), 5);
    let st = ep.recv_into_aperture(sel, ap, 0, 1 << 20, Some(T)).unwrap();
    assert_eq!(st.len, 5);
    let mut got = [0u8; 5];
    ep.aperture_read(ap, 0, &mut got).unwrap();
    assert_eq!(&got, b"small");
    match ep.next_event() {
        Some(Event::Tripwire {
            id,
            peer: p,
            offset,
            len,
            write,
        }) => {
            assert_eq!((id, p, offset, len, write), (head, Some(peer), 0, 5, true));
        }
        e => panic!("expected the head tripwire, got {e:?}"),
    }
    assert!(
        !ep.tripwire_fired(far),
        "5 bytes do not reach offset 200000"
    );
    ep.recv_into_aperture(sel, ap, 0, 1 << 20, Some(T)).unwrap();
    assert!(
        ep.tripwire_fired(far),
        "a rendezvous message landed over it"
    );
    // Truncated: 100 bytes into 50: fires over the 50 that landed.
    let before = ep.tripwire_count(head);
    let r = ep.recv_into_aperture(sel, ap, 0, 50, Some(T));
    assert!(matches!(
        r,
        Err(Error::Truncated {
            len: 100,
            capacity: 50
        })
    ));
    assert_eq!(ep.tripwire_count(head), before + 1);
    assert!(
        ep.recv_into_aperture(sel, ap, (1 << 20) - 4, 8, Some(T))
            .is_err(),
        "out of range"
    );
    ep.send(peer, 6, b"k").unwrap();
    sender.join().unwrap();
}

/// Non-blocking receives into an aperture fire its tripwires when they complete, with
/// nobody testing the requests (the event wakes `wait_event`); the aperture cannot be
/// destroyed under a pending receive; a cancelled one fires nothing.
#[test]
fn nonblocking_receives_into_an_aperture_fire_tripwires_on_completion() {
    let mut ep = ctx().endpoint().unwrap();
    let sender = three_messages(ep.address(), true);
    let (peer, ap, head, far) = landing_aperture(&mut ep);
    let sel = Selector::exact(Some(peer), 5);
    // A receive posted and cancelled first: it matches nothing and fires nothing.
    let gone = ep
        .irecv_into_aperture(Selector::exact(Some(peer), 77), ap, 0, 8)
        .unwrap();
    assert!(
        ep.cancel_recv(&gone).unwrap().is_none(),
        "no buffer to give back"
    );
    let small = ep.irecv_into_aperture(sel, ap, 0, 1000).unwrap();
    let big = ep.irecv_into_aperture(sel, ap, 100_000, 900_000).unwrap();
    let cut = ep.irecv_into_aperture(sel, ap, 0, 50).unwrap();
    assert!(
        matches!(ep.aperture_destroy(ap), Err(Error::Invalid(_))),
        "destroyed under pending receives"
    );
    ep.send(peer, 6, b"g").unwrap();
    // Only events: the requests are not looked at until every tripwire has fired.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match ep.wait_event(Some(T)).unwrap() {
            Event::Tripwire {
                id,
                peer: p,
                offset,
                len,
                write,
            } => {
                assert_eq!((p, write), (Some(peer), true));
                seen.push((id, offset, len));
            }
            e => panic!("unexpected event {e:?}"),
        }
    }
    // In completion order: the truncated eager message may complete while the
    // rendezvous one before it is still landing (matching is in order, completion not).
    seen.sort_by_key(|&(_, offset, len)| (offset, len));
    assert_eq!(
        seen,
        vec![(head, 0, 5), (head, 0, 50), (far, 100_000, 300_000)],
        "each receive fired over what landed"
    );
    let r = ep.wait_recv(&small, Some(T)).unwrap();
    assert_eq!((r.buf.len(), r.status.len), (0, 5));
    assert_eq!(ep.wait_recv(&big, Some(T)).unwrap().status.len, 300_000);
    assert!(matches!(
        ep.wait_recv(&cut, Some(T)),
        Err(Error::Truncated {
            len: 100,
            capacity: 50
        })
    ));
    let mut got = vec![0u8; 300_000];
    ep.aperture_read(ap, 100_000, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 9));
    let mut got = [0u8; 50];
    ep.aperture_read(ap, 0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 1), "the truncated message's head");
    assert!(
        ep.next_event().is_none(),
        "the cancelled receive fired nothing"
    );
    assert!(
        ep.irecv_into_aperture(sel, ap, (1 << 20) - 4, 8).is_err(),
        "out of range"
    );
    ep.aperture_destroy(ap).unwrap();
    ep.send(peer, 6, b"k").unwrap();
    sender.join().unwrap();
}

/// A tripwire id whose slot was reused by a later tripwire reads nothing of the new one.
#[test]
fn stale_tripwire_ids_see_nothing() {
    let mut ep: Endpoint = ctx().endpoint().unwrap();
    let ap = ep.aperture_alloc(4096).unwrap();
    let once = TripOptions {
        once: true,
        ..TripOptions::default()
    };
    let old = ep.tripwire(ap, 0, 8, once).unwrap();
    ep.aperture_write(ap, 0, &[1]).unwrap();
    assert!(ep.tripwire_fired(old));
    assert_eq!(ep.tripwire_count(old), 1);
    // The once-only tripwire disarmed itself: its slot goes to the next one.
    let new = ep.tripwire(ap, 0, 8, TripOptions::default()).unwrap();
    assert_eq!(new.index, old.index, "the slot is reused");
    ep.aperture_write(ap, 0, &[2]).unwrap();
    assert!(ep.tripwire_fired(new));
    assert!(
        !ep.tripwire_fired(old),
        "the old id reads the new tripwire's bit"
    );
    assert_eq!(ep.tripwire_count(old), 0);
    ep.tripwire_clear(old);
    assert!(
        ep.tripwire_fired(new),
        "clearing the old id clears the new one"
    );
}

/// The copy engine serves its peers' queued copies round-robin (CLAN section 3.4): a
/// small put queued just after a large one from another peer completes first. Both
/// requests are in the target's rings before it runs at all (each initiator signals after
/// its `iput` returned, which wrote the request into an empty ring), so the order is
/// deterministic: the small put needs 2 turns of 256 KiB, the large one 128; a first-come
/// engine would finish the large one first.
#[test]
fn the_copy_engine_does_not_let_a_large_put_starve_a_small_one() {
    const LARGE: usize = 32 << 20;
    const SMALL_PUT: usize = 512 << 10;
    let mut t = ctx().endpoint().unwrap();
    t.set_interest(events::TRIPWIRES);
    let ap = t.aperture_alloc(LARGE + SMALL_PUT).unwrap();
    let once = TripOptions::default();
    let t_large = t.tripwire(ap, 0, LARGE as u64, once).unwrap();
    let t_small = t
        .tripwire(ap, LARGE as u64, SMALL_PUT as u64, once)
        .unwrap();
    let addr = t.address();
    let (issued, is_issued) = std::sync::mpsc::channel();
    // Accepted one after the other: the large put's initiator is the target's peer 0 (an
    // engine that served its lowest peer first would finish the large put first).
    let initiators: Vec<_> = [(0u64, LARGE, 0xa1u8), (LARGE as u64, SMALL_PUT, 0xb2)]
        .into_iter()
        .map(|(at, len, fill)| {
            let cookie = t.export(ap, at, len as u64, WRITE).unwrap();
            let (addr, issued) = (addr.clone(), issued.clone());
            let (go, told) = std::sync::mpsc::channel::<()>();
            let h = std::thread::spawn(move || {
                let mut a = ctx().endpoint().unwrap();
                let p = a.connect(&addr).unwrap();
                let r = a.import(p, cookie).unwrap();
                told.recv_timeout(T).unwrap();
                let req = a.iput(&r, 0, vec![fill; len]).unwrap();
                issued.send(()).unwrap();
                a.wait_rma(&req, Some(T)).unwrap();
            });
            assert_eq!(t.accept(Some(T)).unwrap(), PeerId(at.min(1) as u32));
            (h, go)
        })
        .collect();
    // The large put first; from here on the target runs only once both are queued.
    for (_, go) in &initiators {
        go.send(()).unwrap();
        is_issued.recv_timeout(T).unwrap();
    }
    let mut fired = Vec::new();
    while fired.len() < 2 {
        match t.wait_event(Some(T)).unwrap() {
            Event::Tripwire { id, .. } => fired.push(id),
            e => panic!("unexpected event {e:?}"),
        }
    }
    assert_eq!(
        t.stats().rma_engine_bytes,
        (LARGE + SMALL_PUT) as u64,
        "both puts went through the copy engine"
    );
    assert_eq!(
        fired,
        [t_small, t_large],
        "the small put waited for the large one"
    );
    for (h, _) in initiators {
        while !h.is_finished() {
            t.progress();
        }
        h.join().unwrap();
    }
    let mut got = vec![0u8; LARGE + SMALL_PUT];
    t.aperture_read(ap, 0, &mut got).unwrap();
    assert!(got[..LARGE].iter().all(|&b| b == 0xa1));
    assert!(got[LARGE..].iter().all(|&b| b == 0xb2));
}
