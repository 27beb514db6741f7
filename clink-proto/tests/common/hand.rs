//! Driving two connections by hand: every datagram, and the time, in the test's hands.

use crate::common::content;
use clink_proto::reliable::{Config, Conn, Event};

/// Every datagram `c` has to send now.
pub fn transmit_all(c: &mut Conn, now: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let mut buf = Vec::new();
        if c.poll_transmit(now, &mut buf).is_none() {
            return out;
        }
        out.push(buf);
    }
}

/// One-way delay of the hand-driven tests.
pub const OWD: u64 = 50_000;

/// One round trip by hand: everything `a` has to send reaches `b` one OWD later, then
/// everything `b` answers reaches `a` one more OWD on.
pub fn exchange(a: &mut Conn, b: &mut Conn, now: &mut u64) {
    let sent = transmit_all(a, *now);
    deliver(&sent, a, b, now);
}

/// As [`exchange`], for the datagrams of `a`'s given (the others lost or held back).
pub fn deliver(datagrams: &[Vec<u8>], a: &mut Conn, b: &mut Conn, now: &mut u64) {
    for d in datagrams {
        b.handle_datagram(*now + OWD, d).unwrap();
    }
    *now += OWD;
    for d in transmit_all(b, *now) {
        a.handle_datagram(*now + OWD, &d).unwrap();
    }
    *now += OWD;
}

/// Two connections without delayed acks (crisp timing) that exchanged one message, so the
/// sender has an RTT sample; and the time after it.
pub fn warmed_pair() -> (Conn, Conn, u64) {
    warmed_pair_with(Config::default())
}

/// [`warmed_pair`] from `cfg` (acks of every packet).
fn warmed_pair_with(cfg: Config) -> (Conn, Conn, u64) {
    let cfg = Config {
        ack_every: 1,
        ..cfg
    };
    let (mut a, mut b) = (Conn::new(cfg.clone(), 0), Conn::new(cfg, 0));
    let mut now = 0;
    a.send(0, b"warm-up").unwrap();
    exchange(&mut a, &mut b, &mut now);
    assert!(matches!(b.poll_event(), Some(Event::Message { .. })));
    (a, b, now)
}

/// A pair from `cfg` warmed as [`warmed_pair`], whose sender's window has grown past 64
/// packets.
pub fn grown_pair(cfg: Config) -> (Conn, Conn, u64) {
    let (mut a, mut b, mut now) = warmed_pair_with(cfg);
    let frag = a.config().mtu_payload;
    for i in 0..20u64 {
        a.send(100 + i, &content(i, 8 * frag)).unwrap();
        for _ in 0..4 {
            exchange(&mut a, &mut b, &mut now);
        }
        while b.poll_event().is_some() {}
        while a.poll_event().is_some() {}
    }
    assert!(a.stats().cwnd > 64, "{:?}", a.stats());
    (a, b, now)
}
