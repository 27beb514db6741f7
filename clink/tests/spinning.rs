//! Waiting when both ends share one CPU: a spinning wait keeps the CPU from the thread
//! that would answer it, so spins fail one after the other; waits then stop spinning for
//! a while instead of paying a whole spin per message.

mod common;

use clink::{Context, Endpoint, PeerId, Selector, Stats};
use common::T;

/// Round trips of each run.
const ROUNDS: u32 = 2000;

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data (all-zero is the empty set); CPU_SET writes within
    // it for any cpu below CPU_SETSIZE (checked); pid 0 is the calling thread.
    unsafe {
        assert!(cpu < libc::CPU_SETSIZE as usize);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The CPU the calling thread runs on.
fn this_cpu() -> usize {
    // SAFETY: no arguments; returns the CPU number or -1.
    let c = unsafe { libc::sched_getcpu() };
    assert!(c >= 0, "sched_getcpu: {}", std::io::Error::last_os_error());
    c as usize
}

/// Two endpoints of contexts made by `ctx`, connected over `transport` (the client in
/// another thread): (server, its peer id for the client), (client, its peer id).
fn pair(ctx: fn() -> Context, transport: &str) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
    let mut a = ctx().endpoint().expect("endpoint");
    let addr = a.address();
    let client = std::thread::spawn(move || {
        let mut b = ctx().endpoint().expect("endpoint");
        let p = b.connect(&addr).expect("connect");
        (b, p)
    });
    let pa = a.accept(Some(T)).expect("accept");
    let (b, pb) = client.join().expect("client thread");
    assert_eq!(a.transport(pa).unwrap(), transport);
    assert_eq!(b.transport(pb).unwrap(), transport);
    ((a, pa), (b, pb))
}

/// [`ROUNDS`] blocking 8-byte round trips between two endpoints whose threads are pinned
/// to one CPU, with the default spin time; every answer is checked. Returns both sides'
/// statistics.
fn ping_pong_on_one_cpu(ctx: fn() -> Context, transport: &'static str) -> (Stats, Stats) {
    let ((mut a, pa), (b, pb)) = pair(ctx, transport);
    let cpu = this_cpu();
    let echo = std::thread::spawn(move || {
        pin_to(cpu);
        let mut b: Endpoint = b;
        let mut buf = [0u8; 8];
        for _ in 0..ROUNDS {
            let st = b
                .recv_timeout(Selector::exact(Some(pb), 1), &mut buf, Some(T))
                .expect("echo's receive");
            b.send(pb, 2, &buf[..st.len as usize]).expect("echo's send");
        }
        b.close();
        b.stats()
    });
    pin_to(cpu);
    let mut buf = [0u8; 8];
    for i in 0..ROUNDS {
        let msg = u64::from(i).to_le_bytes();
        a.send(pa, 1, &msg).expect("send");
        let st = a
            .recv_timeout(Selector::exact(Some(pa), 2), &mut buf, Some(T))
            .expect("receive");
        assert_eq!(st.len, 8);
        assert_eq!(buf, msg, "round trip {i}");
    }
    let b_stats = echo.join().expect("echo thread");
    (a.stats(), b_stats)
}

/// Failed spins over both sides stay a small share of the waits, and the gate closed.
fn spins_stop_failing(ctx: fn() -> Context, transport: &'static str) {
    let (a, b) = ping_pong_on_one_cpu(ctx, transport);
    let failed = a.spins_failed + b.spins_failed;
    let closures = a.spin_closures + b.spin_closures;
    eprintln!(
        "{transport}: {failed} failed spins, {closures} closures, {} + {} sleeps in {ROUNDS} round trips",
        a.sleeps, b.sleeps
    );
    assert!(
        closures >= 1,
        "the spin never closed ({failed} failed spins)"
    );
    // Each side spins in vain at most a few times per hold, not once per message.
    assert!(
        failed < u64::from(ROUNDS) / 4,
        "{failed} failed spins in {ROUNDS} round trips"
    );
}

#[test]
fn waits_on_one_cpu_stop_spinning_over_shared_memory() {
    spins_stop_failing(common::ctx, "shm");
}

#[test]
fn waits_on_one_cpu_stop_spinning_over_udp() {
    spins_stop_failing(|| common::ctx_with(common::net_config()), "udp");
}
