//! Model checking of the event queue with loom: concurrent claims and publication across a
//! wrap, the full condition, and the sleep/doorbell protocol (no lost wake-up). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p clink --release --lib loom`.

use super::*;
use loom::sync::atomic::AtomicU32;
use loom::sync::Notify;
use loom::thread;

/// Pushes `v`, yielding while the queue is full; returns the doorbell request.
fn push_retry<T: Copy + Send>(q: &EventRing<T>, mut v: T) -> bool {
    loop {
        match q.push(v) {
            Ok(wake) => return wake,
            Err(back) => {
                v = back;
                thread::yield_now();
            }
        }
    }
}

/// Two producers of two items each race for two slots while the consumer makes three
/// pop attempts (so positions can wrap onto a slot just freed). Every accepted item arrives
/// exactly once, each producer's in order, whether popped during the race or in the drain
/// afterwards.
///
/// Nobody spins without bound: a spinning thread could starve one that has claimed a slot
/// but not published it, an unfair schedule loom would explore forever; so a push may be
/// refused. The consumer retries (rather than popping twice back to back) because loom's
/// DPOR remembers only the last access to an atomic: a producer's own load of a slot's
/// sequence hides the race between the consumer's earlier load and the producer's publish
/// (tokio-rs/loom#166, #392), and back-to-back pops were never explored seeing an item.
/// The preemption bound keeps the model to seconds; with it, weakening any ordering of the
/// queue (publish, hand-back, either sequence load) fails this test.
#[test]
fn two_producers_race_and_wrap() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = b.preemption_bound.or(Some(3));
    b.check(|| {
        let (q, mut c) = EventRing::<(u8, u8)>::new(2);
        let ts: Vec<_> = (0..2u8)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    let mut accepted = Vec::new();
                    for s in 0..2u8 {
                        match q.push((p, s)) {
                            Ok(_) => accepted.push((p, s)),
                            Err(back) => assert_eq!(back, (p, s), "refused value handed back"),
                        }
                    }
                    accepted
                })
            })
            .collect();
        let mut got: Vec<(u8, u8)> = Vec::new();
        for _ in 0..3 {
            match c.pop() {
                Some(v) => got.push(v),
                None => thread::yield_now(),
            }
        }
        let mut accepted: Vec<(u8, u8)> = Vec::new();
        for t in ts {
            accepted.extend(t.join().unwrap());
        }
        while let Some(v) = c.pop() {
            got.push(v);
        }
        // A refusal means two items were queued: at least two pushes were accepted.
        assert!(accepted.len() >= 2, "spurious full: {accepted:?}");
        for p in 0..2u8 {
            let mine: Vec<u8> = got.iter().filter(|v| v.0 == p).map(|v| v.1).collect();
            let want: Vec<u8> = accepted.iter().filter(|v| v.0 == p).map(|v| v.1).collect();
            assert_eq!(mine, want, "producer {p}: lost, duplicated or reordered");
        }
        assert_eq!(got.len(), accepted.len());
    });
}

/// One producer pushing three items through two slots, spinning while full, and a
/// consumer spinning while empty: the queue fills, wraps, and delivers in order.
#[test]
fn spinning_producer_and_consumer_wrap() {
    loom::model(|| {
        let (q, mut c) = EventRing::<u8>::new(2);
        let t = thread::spawn(move || {
            for i in 0..3u8 {
                push_retry(&q, i);
            }
        });
        for i in 0..3u8 {
            let v = loop {
                match c.pop() {
                    Some(v) => break v,
                    None => thread::yield_now(),
                }
            };
            assert_eq!(v, i);
        }
        t.join().unwrap();
        assert_eq!(c.pop(), None);
    });
}

/// A full queue refuses a push (handing the value back) and accepts it once a concurrent
/// pop has freed a slot; the freed slot's next lap carries the new item.
#[test]
fn full_until_pop() {
    loom::model(|| {
        let (q, mut c) = EventRing::<u8>::new(2);
        assert_eq!(q.push(1), Ok(false));
        assert_eq!(q.push(2), Ok(false));
        assert_eq!(q.push(3), Err(3), "queue is full");
        let t = thread::spawn(move || {
            let v = c.pop();
            (c, v)
        });
        // Refused (zero or more times, depending on the interleaving) until the pop.
        push_retry(&q, 3);
        let (mut c, first) = t.join().unwrap();
        assert_eq!(first, Some(1), "queue was full: the pop finds the oldest");
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), Some(3));
        assert_eq!(c.pop(), None);
    });
}

/// A consumer that arms, re-checks and then "sleeps" is always woken: either it sees the
/// item on its re-check or the producer is told to ring the doorbell.
#[test]
fn no_lost_wakeup() {
    loom::model(|| {
        let (q, mut c) = EventRing::<u8>::new(2);
        let doorbell = Arc::new(AtomicU32::new(0));
        let d2 = doorbell.clone();
        let t = thread::spawn(move || {
            if q.push(7).expect("empty queue has room") {
                d2.store(1, Ordering::SeqCst);
            }
        });
        c.arm_sleep();
        let seen = c.pop();
        if seen.is_some() {
            c.disarm_sleep();
        }
        t.join().unwrap();
        if seen.is_none() {
            assert_eq!(
                doorbell.load(Ordering::SeqCst),
                1,
                "consumer would sleep forever"
            );
            assert_eq!(c.pop(), Some(7));
        }
    });
}

/// The full spin-then-block loop with an eventfd-like doorbell (loom's `Notify`: a permit
/// and a single waiter) and two producers: the consumer receives both items and never
/// blocks forever (loom reports a deadlock otherwise), including when one producer has
/// claimed the head slot but not published it while the other publishes the next one.
#[test]
fn blocking_consumer_two_producers() {
    // Bounded preemptions: the unbounded state space of two producers, a consumer and a
    // doorbell takes hours and tens of GB; every lost-wake-up interleaving needs at most
    // two preemptions.
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let (q, mut c) = EventRing::<u8>::new(2);
        let bell = Arc::new(Notify::new());
        let ts: Vec<_> = (0..2u8)
            .map(|p| {
                let q = q.clone();
                let bell = bell.clone();
                thread::spawn(move || {
                    if q.push(p).expect("two slots for two items") {
                        bell.notify();
                    }
                })
            })
            .collect();
        let mut got = [false; 2];
        for _ in 0..2 {
            let v = loop {
                if let Some(v) = c.pop() {
                    break v;
                }
                c.arm_sleep();
                if let Some(v) = c.pop() {
                    c.disarm_sleep();
                    break v;
                }
                bell.wait();
                c.disarm_sleep();
            };
            assert!(!got[v as usize], "item {v} delivered twice");
            got[v as usize] = true;
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(got, [true, true]);
    });
}
