//! Model checking of the event queue with loom: concurrent claims and publication across a
//! wrap, the full condition, and the sleep/doorbell protocol (no lost wake-up). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p clink --release --lib loom`.

use super::*;
use loom::sync::atomic::AtomicU32;
use loom::sync::{Condvar, Mutex};
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

/// Two producers of two items each through two slots (so positions wrap and producers
/// race for the same slot): every item arrives once, each producer's in order.
#[test]
fn two_producers_wrap_fifo() {
    loom::model(|| {
        let (q, mut c) = EventRing::<(u8, u8)>::new(2);
        let ts: Vec<_> = (0..2u8)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    for s in 0..2u8 {
                        push_retry(&q, (p, s));
                    }
                })
            })
            .collect();
        let mut next = [0u8; 2];
        let mut got = 0;
        while got < 4 {
            match c.pop() {
                Some((p, s)) => {
                    assert_eq!(s, next[p as usize], "producer {p} out of order");
                    next[p as usize] += 1;
                    got += 1;
                }
                None => thread::yield_now(),
            }
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(next, [2, 2]);
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

/// The full spin-then-block loop with an eventfd-like doorbell (a counter under a mutex)
/// and two producers: the consumer receives both items and never blocks forever (loom
/// reports a deadlock otherwise), including when one producer has claimed the head slot
/// but not published it while the other publishes the next one.
#[test]
fn blocking_consumer_two_producers() {
    loom::model(|| {
        let (q, mut c) = EventRing::<u8>::new(2);
        let bell = Arc::new((Mutex::new(0u32), Condvar::new()));
        let ts: Vec<_> = (0..2u8)
            .map(|p| {
                let q = q.clone();
                let bell = bell.clone();
                thread::spawn(move || {
                    if q.push(p).expect("two slots for two items") {
                        *bell.0.lock().unwrap() += 1;
                        bell.1.notify_one();
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
                // Block until rung, then consume the doorbell (as a read of an eventfd).
                let mut n = bell.0.lock().unwrap();
                while *n == 0 {
                    n = bell.1.wait(n).unwrap();
                }
                *n = 0;
                drop(n);
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
