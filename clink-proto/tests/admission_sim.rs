//! Admission control end to end on a simulated network: two senders stream bulk
//! transfers to one receive queue whose [`Gate`] grants one fast stream at a time.

use clink_proto::admission::{AskerConfig, Decision, Gate, GateConfig, Mode};
use clink_proto::netsim::Rng;
use clink_proto::reliable::packet::{BULK_HEADER, DATA_HEADER, TRAILER};
use clink_proto::reliable::{Admit, Config, Conn, Event};
use std::collections::BTreeMap;

const US: u64 = 1_000;
const LATENCY: u64 = 20 * US;
/// Payload bytes of a bulk fragment (the connections' `mtu_payload` is set to match).
const FRAG: usize = 1200;

fn byte(sender: usize, off: u64) -> u8 {
    (off as usize * 7 + sender * 101 + (off as usize >> 11)) as u8
}

struct World {
    now: u64,
    /// (arrival time, seq) -> (to the receiver?, link index, bytes)
    net: BTreeMap<(u64, u64), (bool, usize, Vec<u8>)>,
    seq: u64,
    last_at: [u64; 4],
    rng: Rng,
    loss: f64,
    senders: Vec<Conn>,
    receivers: Vec<Conn>,
    gate: Gate<usize>,
    dest: Vec<Vec<u8>>,
    /// Each sender's transfer.
    src: Vec<Vec<u8>>,
    done_send: Vec<bool>,
    /// Largest bulk fragments in flight seen from a sender while it was not granted.
    slow_peak: Vec<u64>,
    /// Steps at which each sender said its stream was slowed (`Conn::is_slowed`).
    slowed_steps: Vec<u64>,
    both_fast: u64,
}

impl World {
    /// Sender 1's transfer is longer, so it still has most of it to send when sender 0's
    /// grant comes back.
    fn new(seed: u64, loss: f64, totals: [usize; 2]) -> World {
        World::with(seed, loss, totals, 8, false)
    }

    /// As [`World::new`], with bulk groups of `group` fragments, sent misordered within
    /// each group when `misorder` (`Config::bulk_misorder`).
    fn with(seed: u64, loss: f64, totals: [usize; 2], group: u64, misorder: bool) -> World {
        let cfg = |i: u32| Config {
            conn_id: i,
            mtu_payload: FRAG + BULK_HEADER - DATA_HEADER - TRAILER,
            bulk_group: group,
            bulk_misorder: misorder,
            admission: AskerConfig {
                mode: Mode::Implicit,
                ..AskerConfig::default()
            },
            ..Config::default()
        };
        let mut senders: Vec<Conn> = (0..2).map(|i| Conn::new(cfg(i), 0)).collect();
        for (i, s) in senders.iter_mut().enumerate() {
            s.send_bulk(i as u64, totals[i] as u64).unwrap();
        }
        World {
            now: 0,
            net: BTreeMap::new(),
            seq: 0,
            last_at: [0; 4],
            rng: Rng::new(seed),
            loss,
            senders,
            receivers: (0..2).map(|i| Conn::new(cfg(i), 0)).collect(),
            gate: Gate::new(GateConfig::default()),
            dest: totals.iter().map(|&t| vec![0; t]).collect(),
            src: (0..2)
                .map(|i| (0..totals[i] as u64).map(|o| byte(i, o)).collect())
                .collect(),
            done_send: vec![false; 2],
            slow_peak: vec![0; 2],
            slowed_steps: vec![0; 2],
            both_fast: 0,
        }
    }

    fn offer(&mut self, to_rx: bool, i: usize, bytes: Vec<u8>) {
        if self.rng.chance(self.loss) {
            return;
        }
        self.seq += 1;
        // Jitter between links, FIFO within one (reordering is not under test here).
        let fifo = &mut self.last_at[usize::from(to_rx) * 2 + i];
        let at = (self.now + LATENCY + self.rng.below(5 * US)).max(*fifo);
        *fifo = at;
        self.net.insert((at, self.seq), (to_rx, i, bytes));
    }

    fn flush(&mut self) {
        let mut buf = Vec::new();
        for i in 0..2 {
            loop {
                buf.clear();
                let src = &self.src[i];
                let t = self.senders[i].poll_transmit_with(self.now, &mut buf, &mut |_, off, n| {
                    src.get(off as usize..off as usize + n)
                });
                let Some(t) = t else { break };
                let d = [&buf[..], t.payload].concat();
                self.offer(true, i, d);
            }
            loop {
                buf.clear();
                if self.receivers[i]
                    .poll_transmit(self.now, &mut buf)
                    .is_none()
                {
                    break;
                }
                self.offer(false, i, buf.clone());
            }
        }
        for i in 0..2 {
            let s = self.senders[i].stats();
            if !self.senders[i].is_fast() {
                self.slow_peak[i] = self.slow_peak[i].max(s.in_flight);
            }
            if self.senders[i].is_slowed() {
                assert!(!self.senders[i].is_fast() && !self.done_send[i]);
                self.slowed_steps[i] += 1;
            }
        }
        if self.senders.iter().all(Conn::is_fast) {
            self.both_fast += 1;
        }
    }

    fn events(&mut self) {
        let mut out = Vec::new();
        for i in 0..2 {
            while let Some(e) = self.receivers[i].poll_event() {
                match e {
                    Event::FastRequest => self.gate.request(self.now, i, &mut out),
                    Event::FastRelease { grant } => self.gate.release(self.now, i, grant, &mut out),
                    _ => {}
                }
            }
            while let Some(e) = self.senders[i].poll_event() {
                if e == Event::BulkSent(i as u64) {
                    self.done_send[i] = true;
                }
            }
        }
        self.gate.handle_timeout(self.now, &mut out);
        for d in out {
            match d {
                Decision::Grant { peer, grant } => {
                    self.receivers[peer].answer_admit(Admit::Ack { grant, port: 0 })
                }
                Decision::Refuse { peer } | Decision::Revoke { peer } => {
                    self.receivers[peer].answer_admit(Admit::NAck)
                }
            }
        }
    }

    /// One step: send, advance to the next arrival or timer, handle it.
    fn step(&mut self) {
        self.flush();
        let timers = self
            .senders
            .iter()
            .chain(&self.receivers)
            .filter_map(Conn::poll_timeout)
            .chain(self.gate.poll_timeout());
        let next = self
            .net
            .keys()
            .next()
            .map(|k| k.0)
            .into_iter()
            .chain(timers)
            .min();
        self.now = self.now.max(next.expect("something is always pending"));
        while let Some(e) = self.net.first_entry().filter(|e| e.key().0 <= self.now) {
            let (to_rx, i, bytes) = e.remove();
            if to_rx {
                let d = &mut self.dest[i];
                let _ = self.receivers[i].handle_datagram_with(self.now, &bytes, &mut |h, p| {
                    d[h.offset as usize..h.offset as usize + p.len()].copy_from_slice(p);
                    true
                });
                self.gate.active(self.now, i);
            } else {
                let _ = self.senders[i].handle_datagram(self.now, &bytes);
            }
        }
        for c in self.senders.iter_mut().chain(self.receivers.iter_mut()) {
            if c.poll_timeout().is_some_and(|t| t <= self.now) {
                c.handle_timeout(self.now);
            }
        }
        self.events();
    }
}

fn run(seed: u64, loss: f64) -> World {
    run_world(
        seed,
        World::new(seed, loss, [400 * FRAG + 17, 2000 * FRAG + 3]),
    )
}

/// Steps `w` until both transfers are sent and the grant is back; checks every byte.
fn run_world(seed: u64, mut w: World) -> World {
    let deadline = 5_000_000_000;
    while !(w.done_send.iter().all(|&d| d) && w.gate.holder().is_none()) {
        assert!(w.now < deadline, "stalled at {} ns (seed {seed})", w.now);
        w.step();
    }
    for i in 0..2 {
        for (o, &b) in w.dest[i].iter().enumerate() {
            assert_eq!(b, byte(i, o as u64), "sender {i} byte {o} (seed {seed})");
        }
    }
    w
}

/// A misordering sender (the forced-miss experiment) whose stream goes from slow (single
/// fragments) to fast (whole groups) mid-transfer still sends every fragment exactly once
/// when its groups are odd: the misorder permutes within the configured groups whatever
/// the current one. (It permuted within the current one: groups of 7, or 43 at MTU 1500,
/// against the pairs of the slow stream sent some fragments twice and others never, and
/// the transfer stalled with every packet acknowledged.)
#[test]
fn a_misordering_sender_granted_mid_transfer_sends_every_fragment_once() {
    for group in [7, 43, 8] {
        for seed in 1..=4 {
            let w = World::with(seed, 0.0, [400 * FRAG + 17, 2000 * FRAG + 3], group, true);
            let w = run_world(seed, w);
            assert!(w.slowed_steps.iter().sum::<u64>() > 0, "group {group}");
        }
    }
}

#[test]
fn two_senders_one_granted_at_a_time_both_complete_and_the_grant_comes_back() {
    let w = run(1, 0.0);
    let g = w.gate.stats();
    assert!(g.grants >= 2, "both were granted in turn: {g:?}");
    assert!(g.refusals >= 1, "the second was refused first: {g:?}");
    assert_eq!(
        g.releases, g.grants,
        "every grant released, none timed out: {g:?}"
    );
    assert_eq!(
        w.both_fast, 0,
        "never two fast streams at once on a clean network"
    );
    // The refused one said so while it waited (what keeps its sender from spinning),
    // and nobody is slowed once both transfers are done.
    assert!(
        w.slowed_steps.iter().sum::<u64>() > 0,
        "{:?}",
        w.slowed_steps
    );
    assert!(w.senders.iter().all(|s| !s.is_slowed()));
    let slow = Config::default().slow_window;
    for i in 0..2 {
        assert!(
            w.slow_peak[i] <= slow,
            "sender {i} sent {} in flight while slow",
            w.slow_peak[i]
        );
        assert!(w.senders[i].stats().fast_granted >= 1);
    }
}

#[test]
fn admission_survives_loss_of_any_of_its_datagrams() {
    for seed in 1..=20 {
        let w = run(seed, 0.05);
        // Each complete and intact (checked by `run`); every grant ended, by a release or
        // (a release lost) by the idle timeout.
        let g = w.gate.stats();
        assert!(
            g.grants >= 1 && g.releases + g.revocations == g.grants,
            "seed {seed}: {g:?}"
        );
    }
}
