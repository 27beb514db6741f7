//! The messaging protocol end to end, without I/O: two processes, each sending to and
//! receiving from the other, drive [`clink_proto::msg`]'s request states through the
//! frames of [`clink_proto::wire`] (encoded and parsed), with the runtime's part played
//! by this harness: a reliable in-order link each way, the sender's memory read by a
//! simulated CMA, the receive buffer written by a simulated push.
//!
//! Seeded random workloads mix eager and rendezvous sizes, CMA reads (split or whole)
//! and chunked transfers, receives shorter than their messages, sends cancelled at any
//! point (racing the receiver's match), receives cancelled while posted, pushes the
//! sender cannot write, and a process killed at a random step. Checked throughout: no
//! frame from a correct peer is refused, no memory is read after its send released it or
//! written after its receive completed; and at the end every request is over, every
//! delivered message holds its bytes (the head of them when truncated) in the order of
//! its tag, no withdrawn send is delivered, and a rendezvous send that succeeded was
//! delivered.

use clink_proto::cost::Rndv;
use clink_proto::matching::{Matcher, Selector};
use clink_proto::msg::{
    self, Arrived, CancelStep, Chunker, Failure, Plan, RecvState, SendState, Status,
};
use clink_proto::netsim::Rng;
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use std::collections::{HashMap, VecDeque};

/// Each side's one peer.
const PEER: PeerId = PeerId(0);
const EAGER_MAX: u64 = 256;
const CHUNK: u64 = 16 << 10;
const TAGS: u64 = 3;
/// A receive buffer larger than any message.
const BIG_BUF: usize = 700 << 10;

struct Send {
    tag: u64,
    /// The message; emptied when the send is over (its memory is the caller's again).
    data: Vec<u8>,
    len: u64,
    state: SendState<Failure>,
    /// Its place among the sends of its tag.
    seq: u64,
    /// What was sent, kept for the checks.
    payload: Vec<u8>,
}

struct Recv {
    buf: Vec<u8>,
    state: RecvState<Failure>,
    /// Cancelled while posted.
    cancelled: bool,
    /// Matched a message (which it then received, or failed to).
    matched: bool,
}

#[derive(Default)]
struct Side {
    matcher: Matcher<u64, Arrived>,
    sends: HashMap<u64, Send>,
    recvs: HashMap<u64, Recv>,
    /// Receive order per tag (request ids, as posted).
    posted: Vec<Vec<u64>>,
    /// Rendezvous receives in progress: the peer's send id -> receive id.
    pipeline_in: HashMap<u64, u64>,
    /// Frames to the other side, encoded, in order.
    out: VecDeque<Vec<u8>>,
    /// Sends that could not enter the link yet, in order.
    txq: VecDeque<u64>,
    /// Transfers the other side asked for, going out in chunks.
    chunker: Chunker,
    sent_per_tag: Vec<u64>,
    next_id: u64,
    push_refused: bool,
    dead: bool,
    peer_dead: bool,
}

struct World {
    sides: [Side; 2],
    rng: Rng,
    /// Chance that a push's write into the receiver fails.
    push_fail: f64,
}

fn frame(f: &Frame) -> Vec<u8> {
    let mut v = vec![0u8; f.encoded_len()];
    let n = f.encode(&mut v);
    v.truncate(n);
    v
}

/// A message's bytes: one value, marked every 997 bytes with the mark's number mixed
/// with a second value (cheap in a debug build; a chunk or half at a wrong offset shows).
fn payload(rng: &mut Rng, len: u64) -> Vec<u8> {
    let (fill, mix) = (rng.next_u64() as u8, rng.next_u64() as u8);
    let mut v = vec![fill; len as usize];
    for (n, i) in (0..v.len()).step_by(997).enumerate() {
        v[i] = (n as u8) ^ mix;
    }
    v
}

impl World {
    fn new(seed: u64) -> World {
        let side = || Side {
            posted: vec![Vec::new(); TAGS as usize],
            sent_per_tag: vec![0; TAGS as usize],
            next_id: 1,
            ..Side::default()
        };
        let mut rng = Rng::new(seed);
        let push_fail = [0.0, 0.2, 1.0][rng.below(3) as usize];
        World {
            sides: [side(), side()],
            rng,
            push_fail,
        }
    }

    /// The side `k` and the other.
    fn pair(&mut self, k: usize) -> (&mut Side, &mut Side) {
        let [a, b] = &mut self.sides;
        if k == 0 {
            (a, b)
        } else {
            (b, a)
        }
    }

    fn random_len(&mut self) -> u64 {
        match self.rng.below(4) {
            0 => self.rng.below(EAGER_MAX + 1),
            1 => EAGER_MAX + 1 + self.rng.below(4 * CHUNK),
            2 => msg::CMA_SPLIT_ALIGN * 32 + self.rng.below(300 << 10),
            _ => self.rng.below(2 * EAGER_MAX),
        }
    }

    fn start_send(&mut self, k: usize) {
        let tag = self.rng.below(TAGS);
        let len = self.random_len();
        let data = payload(&mut self.rng, len);
        let s = &mut self.sides[k];
        let id = s.next_id;
        s.next_id += 1;
        let seq = s.sent_per_tag[tag as usize];
        s.sent_per_tag[tag as usize] += 1;
        s.sends.insert(
            id,
            Send {
                tag,
                len,
                payload: data.clone(),
                data,
                state: SendState::Queued,
                seq,
            },
        );
        s.txq.push_back(id);
    }

    /// Moves queued sends into the link while it takes them (it refuses at random, as a
    /// full ring does).
    fn flush(&mut self, k: usize) {
        while let Some(&id) = self.sides[k].txq.front() {
            if self.rng.chance(0.3) {
                return;
            }
            let s = &mut self.sides[k];
            s.txq.pop_front();
            let Some(op) = s.sends.get_mut(&id) else {
                continue;
            };
            if op.len <= EAGER_MAX {
                s.out.push_back(frame(&Frame::Eager {
                    tag: op.tag,
                    data: &op.data,
                }));
                op.state.delivered();
                op.data = Vec::new();
            } else {
                s.out.push_back(frame(&Frame::Rts {
                    tag: op.tag,
                    len: op.len,
                    send_id: id,
                    addr: id,
                }));
                op.state.announced();
            }
        }
        self.pump(k);
    }

    /// Moves chunks of the transfers asked for into the link while it takes them (after
    /// the queued sends: frames keep their order).
    fn pump(&mut self, k: usize) {
        let s = &mut self.sides[k];
        if !s.txq.is_empty() {
            return;
        }
        while let Some(c) = s.chunker.next(|_| CHUNK) {
            if self.rng.chance(0.3) {
                return;
            }
            let op = s
                .sends
                .get_mut(&c.send_id)
                .expect("a transfer of a send of ours");
            let data = &op.data[c.offset as usize..(c.offset + c.len) as usize];
            s.out.push_back(frame(&Frame::Chunk {
                send_id: c.send_id,
                offset: c.offset,
                data,
            }));
            if s.chunker.sent(c).is_some() {
                assert!(op.state.transfer_done());
                op.data = Vec::new();
            }
        }
    }

    fn post_recv(&mut self, k: usize) {
        let tag = self.rng.below(TAGS);
        let cap = match self.rng.below(5) {
            0 => self.rng.below(2 * EAGER_MAX) as usize,
            _ => BIG_BUF,
        };
        self.post_recv_exact(k, tag, cap);
    }

    fn post_recv_exact(&mut self, k: usize, tag: u64, cap: usize) {
        let s = &mut self.sides[k];
        let id = s.next_id;
        s.next_id += 1;
        s.posted[tag as usize].push(id);
        let mut state = RecvState::Posted;
        if s.peer_dead {
            state.fail(Failure::PeerDead(PEER));
        }
        s.recvs.insert(
            id,
            Recv {
                buf: vec![0; cap],
                state,
                cancelled: false,
                matched: false,
            },
        );
        if s.peer_dead {
            return;
        }
        if let Some((_, u)) = s.matcher.post(Selector::exact(Some(PEER), tag), id) {
            self.deliver(k, id, u.tag, u.item);
        }
    }

    /// Receive `rid` of side `k` matched a message.
    fn deliver(&mut self, k: usize, rid: u64, tag: u64, item: Arrived) {
        let method = if self.rng.chance(0.5) {
            Rndv::Cma
        } else {
            Rndv::Pipeline
        };
        let (s, o) = self.pair(k);
        let op = s.recvs.get_mut(&rid).unwrap();
        op.matched = true;
        let (len, send_id, addr) = match item {
            Arrived::Eager(v) => {
                op.state = RecvState::Done(msg::copy_eager(PEER, tag, &v, &mut op.buf));
                return;
            }
            Arrived::Rts { len, send_id, addr } => (len, send_id, addr),
        };
        let status = Status {
            peer: PEER,
            tag,
            len,
        };
        let cap = op.buf.len() as u64;
        match msg::plan(method, true, len, cap, !s.push_refused) {
            Plan::Cma { n, pushed } => {
                if pushed > 0 {
                    s.pipeline_in.insert(send_id, rid);
                    s.out.push_back(frame(&Frame::Push {
                        send_id,
                        addr: rid,
                        len: pushed,
                    }));
                }
                let read = cma_read(o, addr, pushed, &mut op.buf[pushed as usize..n as usize]);
                op.state = RecvState::after_cma(status, cap, pushed, read, 0, addr);
                if pushed == 0 {
                    s.out.push_back(frame(&Frame::Fin { send_id }));
                }
            }
            Plan::Transfer => {
                op.state = RecvState::transfer(status, 0);
                s.pipeline_in.insert(send_id, rid);
                s.out.push_back(frame(&Frame::Cts { send_id }));
            }
        }
    }

    /// Side `k` handles the other's next frame; false when none was in flight.
    fn deliver_frame(&mut self, k: usize) -> bool {
        let Some(bytes) = self.sides[1 - k].out.pop_front() else {
            return false;
        };
        let f = Frame::parse(&bytes).expect("a frame we encoded parses");
        let push_fails = self.rng.chance(self.push_fail);
        let (s, o) = self.pair(k);
        match f {
            Frame::Eager { tag, data } => match s.matcher.take_posted(PEER, tag) {
                Some(rid) => self.deliver(k, rid, tag, Arrived::Eager(data.to_vec())),
                None => s
                    .matcher
                    .push_unexpected(PEER, tag, Arrived::Eager(data.to_vec())),
            },
            Frame::Rts {
                tag,
                len,
                send_id,
                addr,
            } => {
                let item = Arrived::Rts { len, send_id, addr };
                match s.matcher.take_posted(PEER, tag) {
                    Some(rid) => self.deliver(k, rid, tag, item),
                    None => s.matcher.push_unexpected(PEER, tag, item),
                }
            }
            Frame::Fin { send_id } => {
                let op = s.sends.get_mut(&send_id).expect("Fin for a send of ours");
                if op.state.on_fin() {
                    op.data = Vec::new();
                }
            }
            Frame::Cts { send_id } => {
                let op = s.sends.get_mut(&send_id).expect("CTS for a send of ours");
                op.state.on_cts().expect("CTS accepted");
                s.chunker.push(send_id, op.len);
                self.pump(k);
            }
            Frame::Chunk {
                send_id,
                offset,
                data,
            } => {
                let rid = s.pipeline_in[&send_id];
                let op = s.recvs.get_mut(&rid).unwrap();
                let cap = op.buf.len() as u64;
                let c = op
                    .state
                    .on_chunk(offset, data.len() as u64, cap)
                    .expect("chunk accepted");
                op.buf[c.copy.clone()].copy_from_slice(&data[..c.copy.len()]);
                if c.done.is_some() {
                    s.pipeline_in.remove(&send_id);
                }
            }
            Frame::Cancel { send_id } => {
                let cancelled = msg::withdraw(&mut s.matcher, PEER, send_id);
                s.out
                    .push_back(frame(&Frame::CancelAck { send_id, cancelled }));
            }
            Frame::CancelAck { send_id, cancelled } => {
                let op = s
                    .sends
                    .get_mut(&send_id)
                    .expect("answer for a send of ours");
                if op.state.on_cancel_ack(cancelled) {
                    op.data = Vec::new();
                }
            }
            Frame::Push { send_id, addr, len } => {
                let op = &s.sends[&send_id];
                let part = op.state.push_part(len, op.len).expect("push accepted");
                let ok = !push_fails && {
                    let r = o.recvs.get_mut(&addr).expect("push into a receive");
                    assert!(
                        matches!(r.state, RecvState::Split { .. }),
                        "write into a receive that is not waiting for it"
                    );
                    r.buf[part.clone()].copy_from_slice(&op.data[part]);
                    true
                };
                s.out.push_back(frame(&Frame::Pushed { send_id, ok }));
            }
            Frame::Pushed { send_id, ok } => {
                let rid = s.pipeline_in.remove(&send_id).expect("pushed for a split");
                let op = s.recvs.get_mut(&rid).unwrap();
                let end = op.state.on_pushed(ok).expect("pushed accepted");
                let head = if end.written {
                    Ok(())
                } else {
                    s.push_refused = true;
                    cma_read(o, end.addr, 0, &mut op.buf[..end.pushed as usize])
                };
                let cap = op.buf.len() as u64;
                op.state = end.finish(head, cap);
                s.out.push_back(frame(&Frame::Fin { send_id }));
            }
            Frame::Close | Frame::Rma(_) => unreachable!("not sent here"),
        }
        true
    }

    /// Side `k` withdraws a random send; a receiver's answer decides an announced one.
    fn cancel_send(&mut self, k: usize) {
        let s = &mut self.sides[k];
        let mut ids: Vec<u64> = s.sends.keys().copied().collect();
        ids.sort_unstable();
        let Some(&id) = ids.get(self.rng.below(ids.len().max(1) as u64) as usize) else {
            return;
        };
        let op = s.sends.get_mut(&id).unwrap();
        match op.state.cancel_step() {
            CancelStep::Withdraw => {
                s.txq.retain(|&t| t != id);
                op.state = SendState::Done(Err(Failure::Cancelled));
                op.data = Vec::new();
            }
            CancelStep::AskReceiver => s.out.push_back(frame(&Frame::Cancel { send_id: id })),
            CancelStep::AwaitEnd | CancelStep::Over => {}
        }
    }

    /// Side `k` withdraws a random posted receive that has not matched.
    fn cancel_recv(&mut self, k: usize) {
        let s = &mut self.sides[k];
        let tag = self.rng.below(TAGS) as usize;
        if let Some(&id) = s.posted[tag]
            .iter()
            .find(|id| matches!(s.recvs[id].state, RecvState::Posted))
        {
            if s.matcher.cancel(&id) {
                let r = s.recvs.get_mut(&id).unwrap();
                r.cancelled = true;
                r.state = RecvState::Done(Err(Failure::Cancelled));
            }
        }
    }

    /// Side `k` dies: the other finds out (as the runtime's `fail_peer_ops`).
    fn kill(&mut self, k: usize) {
        let (s, o) = self.pair(k);
        s.dead = true;
        s.out.clear();
        o.out.clear();
        o.peer_dead = true;
        o.txq.clear();
        o.chunker.clear();
        for (_, rid) in o.pipeline_in.drain() {
            o.recvs
                .get_mut(&rid)
                .unwrap()
                .state
                .fail(Failure::PeerDead(PEER));
        }
        for op in o.sends.values_mut() {
            if op.state.fail(Failure::PeerDead(PEER)) {
                op.data = Vec::new();
            }
        }
        for rid in o.matcher.drain_posted_from(PEER) {
            o.recvs
                .get_mut(&rid)
                .unwrap()
                .state
                .fail(Failure::PeerDead(PEER));
        }
        o.matcher
            .drain_unexpected_from(PEER, |u| matches!(u, Arrived::Eager(_)));
    }

    fn step(&mut self, kill_at: Option<u64>, t: u64) {
        if kill_at == Some(t) {
            let k = self.rng.below(2) as usize;
            self.kill(k);
            return;
        }
        let k = self.rng.below(2) as usize;
        if self.sides[k].dead || self.sides[k].peer_dead {
            return;
        }
        match self.rng.below(100) {
            0..=14 => self.start_send(k),
            15..=29 => self.post_recv(k),
            30..=33 => self.cancel_send(k),
            34..=35 => self.cancel_recv(k),
            36..=45 => self.flush(k),
            _ => {
                self.deliver_frame(k);
            }
        }
    }

    /// Lets everything in flight arrive (no new work).
    fn settle(&mut self) {
        for _ in 0..100_000 {
            let mut moved = false;
            for k in 0..2 {
                if self.sides[k].dead || self.sides[k].peer_dead {
                    continue;
                }
                while !self.sides[k].txq.is_empty() || !self.sides[k].chunker.is_empty() {
                    self.flush(k);
                }
                moved |= self.deliver_frame(k);
            }
            if !moved {
                return;
            }
        }
        panic!("frames still in flight after 100 000 rounds");
    }
}

/// Reads `buf.len()` bytes of the message at `addr` (a send id) from `offset` on, out of
/// the sender's memory.
fn cma_read(sender: &Side, addr: u64, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
    if sender.dead {
        return Err(Failure::Read {
            peer: PEER,
            source: std::io::Error::from_raw_os_error(3),
        });
    }
    let op = &sender.sends[&addr];
    assert!(
        matches!(op.state, SendState::WaitFin),
        "read of a send's memory after it was released"
    );
    buf.copy_from_slice(&op.data[offset as usize..offset as usize + buf.len()]);
    Ok(())
}

/// The end-of-run checks of one direction: `s` sent to `r`.
fn check_direction(seed: u64, s: &Side, r: &Side) {
    let all_over = !s.dead && !r.dead;
    if r.dead {
        // A killed process's requests stay as they were; the survivor's are checked.
        return check_sends_over(seed, s);
    }
    for tag in 0..TAGS {
        // The sends of this tag in order, the withdrawn ones left out.
        let mut sends: Vec<&Send> = s.sends.values().filter(|o| o.tag == tag).collect();
        sends.sort_by_key(|o| o.seq);
        let live: Vec<&&Send> = sends
            .iter()
            .filter(|o| !matches!(o.state, SendState::Done(Err(Failure::Cancelled))))
            .collect();
        let mut next = 0;
        for rid in &r.posted[tag as usize] {
            let op = &r.recvs[rid];
            let got = match &op.state {
                RecvState::Done(Ok(st)) => Some(st.len),
                RecvState::Done(Err(Failure::Truncated { len, .. })) => Some(*len),
                RecvState::Done(Err(Failure::Cancelled)) => {
                    assert!(op.cancelled, "seed {seed}: a receive cancelled by nobody");
                    None
                }
                RecvState::Done(Err(e)) => {
                    assert!(
                        !all_over,
                        "seed {seed}: a receive failed with both alive: {e:?}"
                    );
                    None
                }
                RecvState::Posted => None,
                st => panic!("seed {seed}: receive {rid} still in flight at the end: {st:?}"),
            };
            if !op.matched {
                assert!(got.is_none(), "seed {seed}: a receive completed unmatched");
                continue;
            }
            // Matched, then failed with its sender (read from a dead process).
            let Some(len) = got else {
                next += 1;
                continue;
            };
            let n = (len as usize).min(op.buf.len());
            let is = |o: &Send| o.len == len && op.buf[..n] == o.payload[..n];
            // After a death, the dead sender's unmatched rendezvous messages are gone
            // (their memory with it) while its eager ones stay: a later message may
            // take a lost one's place, in order all the same.
            let skip = if all_over {
                0
            } else {
                live[next.min(live.len())..]
                    .iter()
                    .position(|o| is(o))
                    .unwrap_or(0)
            };
            next += skip;
            let sent = live.get(next).unwrap_or_else(|| {
                panic!("seed {seed}: tag {tag}: a message delivered that nobody sent")
            });
            next += 1;
            assert_eq!(len, sent.len, "seed {seed}: tag {tag}: length");
            assert!(
                is(sent),
                "seed {seed}: tag {tag}: message {} delivered with wrong bytes",
                sent.seq
            );
        }
        // What was not delivered is a rendezvous send still unmatched (or failed) or an
        // eager message waiting; never a rendezvous send that reported success.
        for o in &live[next.min(live.len())..] {
            if o.len > EAGER_MAX && all_over {
                assert!(
                    !matches!(o.state, SendState::Done(Ok(()))),
                    "seed {seed}: tag {tag}: send {} succeeded undelivered",
                    o.seq
                );
            }
        }
    }
    if !s.dead {
        check_sends_over(seed, s);
    }
}

/// Every sender's peer posted receives enough at the end, or died: all its sends are over.
fn check_sends_over(seed: u64, s: &Side) {
    for o in s.sends.values() {
        assert!(
            o.state.is_done(),
            "seed {seed}: a send not over: {:?}",
            o.state
        );
    }
}

fn run(seed: u64) {
    let mut w = World::new(seed);
    let steps = 400 + w.rng.below(400);
    let kill_at = w.rng.chance(0.3).then(|| w.rng.below(steps));
    for t in 0..steps {
        w.step(kill_at, t);
    }
    w.settle();
    // Each side posts receives enough for everything the other sent, then both settle:
    // only withdrawn sends and cancelled receives are left out.
    for k in 0..2 {
        if w.sides[k].dead || w.sides[k].peer_dead {
            continue;
        }
        let wanted: Vec<u64> = (0..TAGS)
            .map(|tag| {
                w.sides[1 - k]
                    .sends
                    .values()
                    .filter(|o| o.tag == tag)
                    .count() as u64
            })
            .collect();
        for (tag, n) in wanted.into_iter().enumerate() {
            for _ in 0..n {
                w.post_recv_exact(k, tag as u64, BIG_BUF);
            }
        }
    }
    w.settle();
    for k in 0..2 {
        check_direction(seed, &w.sides[k], &w.sides[1 - k]);
    }
}

#[test]
fn random_workloads_with_cancels_truncation_refused_pushes_and_deaths() {
    for seed in 0..300 {
        run(seed);
    }
}

/// A cancel that reaches the receiver after it matched the send is refused, and the
/// rendezvous completes as if nothing had been asked.
#[test]
fn a_cancel_racing_the_match_loses_and_the_message_arrives() {
    let mut w = World::new(7);
    w.push_fail = 0.0;
    let data = vec![5u8; 4096];
    w.sides[0].sends.insert(
        1,
        Send {
            tag: 0,
            len: 4096,
            payload: data.clone(),
            data,
            state: SendState::Queued,
            seq: 0,
        },
    );
    w.sides[0].sent_per_tag[0] = 1;
    w.sides[0].txq.push_back(1);
    while !w.sides[0].txq.is_empty() {
        w.flush(0);
    }
    w.post_recv_exact(1, 0, 4096);
    assert!(w.deliver_frame(1), "the RTS arrives and matches");
    // The sender cancels now: its Cancel crosses the receiver's Fin or CTS.
    w.cancel_send(0);
    w.settle();
    let op = &w.sides[0].sends[&1];
    assert!(
        matches!(op.state, SendState::Done(Ok(()))),
        "{:?}",
        op.state
    );
    check_direction(7, &w.sides[0], &w.sides[1]);
}
