//! The messaging protocol end to end, without I/O: two processes, each sending to and
//! receiving from the other, drive [`clink_proto::msg`]'s requests and each one's
//! [`Rendezvous`] through the frames of [`clink_proto::wire`] (encoded and parsed), with
//! the runtime's part played by this harness: it matches announcements, carries out the
//! protocol's actions over a reliable in-order link each way, reads the sender's memory by
//! a simulated CMA and writes a split read's head into the receive buffer by a simulated
//! push.
//!
//! Seeded random workloads mix eager and rendezvous sizes, CMA reads (split or whole)
//! and chunked transfers (or, over a link that carries transfers as a network link does,
//! whole transfers in place of both), receives shorter than their messages, sends cancelled at any
//! point (racing the receiver's match), receives cancelled while posted, pushes the
//! sender cannot write, and a process killed at a random step. Checked throughout: no
//! frame from a correct peer is refused, no memory is read after its send released it or
//! written after its receive completed; and at the end every request is over, every
//! delivered message holds its bytes (the head of them when truncated) in the order of
//! its tag, no withdrawn send is delivered, and a rendezvous send that succeeded was
//! delivered.

use clink_proto::cost::{Costs, Rndv};
use clink_proto::matching::Selector;
use clink_proto::msg::{
    self, Action, Arrival, Arrived, CancelStep, Failure, Head, Message, RecvReq, RecvState,
    Rendezvous, Requests, SendReq, SendState, TxQueue,
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

/// A send's bytes and what the checks need of it.
struct Send {
    /// The message (an RTS gives its address). Kept allocated to the end of the run, so
    /// no later message takes its address.
    data: Vec<u8>,
    /// The send is over: its memory is the caller's again, and no read may touch it.
    released: bool,
    len: u64,
    /// Its place among the sends of its tag.
    seq: u64,
    /// What was sent, kept for the checks.
    payload: Vec<u8>,
}

impl Message for Send {
    fn bytes(&self) -> &[u8] {
        &self.data
    }
}

/// What the checks need to know of a receive besides its request.
#[derive(Clone, Copy, Default)]
struct RecvMarks {
    /// Cancelled while posted.
    cancelled: bool,
    /// Matched a message (which it then received, or failed to).
    matched: bool,
}

type Reqs = Requests<Send, Vec<u8>, Failure>;
type SendOp = SendReq<Send, Failure>;

struct Side {
    req: Reqs,
    marks: HashMap<u64, RecvMarks>,
    /// Receive order per tag (request ids, as posted).
    posted: Vec<Vec<u64>>,
    /// The rendezvous protocol's state with the other side.
    rndv: Rendezvous,
    /// Frames to the other side, encoded, in order.
    out: VecDeque<Vec<u8>>,
    /// What could not enter the link yet, in order.
    txq: TxQueue,
    /// Over a link that carries transfers: the sends being transferred to the other
    /// side, in order.
    bulk_out: VecDeque<u64>,
    /// Over a link that carries transfers: the other side's sends this one expects, and
    /// the receives they land in.
    expected: HashMap<u64, u64>,
    sent_per_tag: Vec<u64>,
    dead: bool,
    peer_dead: bool,
}

impl Side {
    /// Releases the memory of the sends that finished (as a caller reuses it once its send
    /// is over): a later read of it would be caught.
    fn release_finished(&mut self) {
        for (send, id) in std::mem::take(&mut self.req.finished) {
            if send {
                if let Some(op) = self.req.sends.get_mut(&id) {
                    op.data.released = true;
                }
            }
        }
    }
}

struct World {
    sides: [Side; 2],
    rng: Rng,
    /// Chance that a push's write into the receiver fails.
    push_fail: f64,
    /// The link carries transfers itself, as a network link does (no CMA, no chunks).
    bulk: bool,
    costs: Costs,
    now: u64,
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
            req: Reqs::default(),
            marks: HashMap::new(),
            posted: vec![Vec::new(); TAGS as usize],
            rndv: Rendezvous::new(PEER),
            out: VecDeque::new(),
            txq: TxQueue::default(),
            bulk_out: VecDeque::new(),
            expected: HashMap::new(),
            sent_per_tag: vec![0; TAGS as usize],
            dead: false,
            peer_dead: false,
        };
        let mut rng = Rng::new(seed);
        let push_fail = [0.0, 0.2, 1.0][rng.below(3) as usize];
        let bulk = rng.chance(0.3);
        World {
            sides: [side(), side()],
            rng,
            push_fail,
            bulk,
            costs: Costs::default(),
            now: 0,
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
        let id = s.req.alloc_id();
        let seq = s.sent_per_tag[tag as usize];
        s.sent_per_tag[tag as usize] += 1;
        let data = Send {
            len,
            payload: data.clone(),
            data,
            released: false,
            seq,
        };
        s.req.add_send(
            id,
            SendReq {
                peer: PEER,
                tag,
                data,
                state: SendState::Queued,
                watched: false,
            },
        );
        s.txq.push_send(id);
    }

    /// Moves queued sends into the link while it takes them (it refuses at random, as a
    /// full ring does).
    fn flush(&mut self, k: usize) {
        loop {
            let s = &mut self.sides[k];
            let Some(head) = s.txq.head(&s.req, EAGER_MAX) else {
                break;
            };
            if self.rng.chance(0.3) {
                return;
            }
            if let Head::Frame(f) = head {
                s.out.push_back(frame(&f));
            }
            s.txq.pop(&mut s.req, EAGER_MAX);
            s.release_finished();
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
        while let Some((c, data)) = s.rndv.next_chunk(&s.req, |_| CHUNK) {
            if self.rng.chance(0.3) {
                return;
            }
            assert!(
                !s.req.sends[&c.send_id].data.released,
                "a chunk of a send's memory after it was released"
            );
            s.out.push_back(frame(&Frame::Chunk {
                send_id: c.send_id,
                offset: c.offset,
                data,
            }));
            s.rndv.chunk_sent(&mut s.req, c);
        }
        s.release_finished();
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
        let id = s.req.alloc_id();
        s.posted[tag as usize].push(id);
        let mut state = RecvState::Posted;
        if s.peer_dead {
            state.fail(Failure::PeerDead(PEER));
        }
        s.req.add_recv(
            id,
            RecvReq {
                buf: vec![0; cap],
                state,
                watched: false,
                user: 0,
            },
        );
        s.marks.insert(id, RecvMarks::default());
        if s.peer_dead {
            return;
        }
        if let Some((_, u)) = s.req.matcher.post(Selector::exact(Some(PEER), tag), id) {
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
        let now = self.tick();
        let s = &mut self.sides[k];
        s.marks.get_mut(&rid).unwrap().matched = true;
        let (len, send_id, addr) = match item {
            Arrived::Eager(v) => {
                let op = s.req.recvs.get_mut(&rid).unwrap();
                op.state = RecvState::Done(msg::copy_eager(PEER, tag, &v, &mut op.buf));
                return;
            }
            Arrived::Rts { len, send_id, addr } => (len, send_id, addr),
        };
        let mut acts = Vec::new();
        s.rndv.matched(
            &mut s.req,
            rid,
            msg::Announced {
                tag,
                len,
                send_id,
                addr,
            },
            (method, !self.bulk, true),
            now,
            &mut acts,
        );
        self.act(k, acts);
    }

    /// The simulated clock: a microsecond per call.
    fn tick(&mut self) -> u64 {
        self.now += 1000;
        self.now
    }

    /// Side `k` carries out the protocol's actions, in order, and what their completions
    /// ask for in turn.
    fn act(&mut self, k: usize, mut todo: Vec<Action<Failure>>) {
        let mut more = Vec::new();
        while !todo.is_empty() {
            for a in todo.drain(..) {
                let push_fails = self.rng.chance(self.push_fail);
                let bulk = self.bulk;
                let now = self.tick();
                let costs = self.costs;
                let (s, o) = self.pair(k);
                match a {
                    Action::Send(f) => s.out.push_back(frame(&f)),
                    Action::Read(r) => {
                        let op = s.req.recvs.get_mut(&r.rid).expect("a read into a receive");
                        let buf = &mut op.buf[r.at as usize..(r.at + r.len) as usize];
                        let read = cma_read(o, r.addr, buf);
                        s.rndv
                            .read_done(&mut s.req, &costs, r, read, now, &mut more);
                    }
                    Action::Write { send_id, addr, len } => {
                        let ok = !push_fails && {
                            let data = &s.req.sends[&send_id].data.data;
                            cma_write(o, addr, &data[..len as usize]);
                            true
                        };
                        s.rndv.written(send_id, ok, &mut more);
                    }
                    Action::Expect { send_id, rid, .. } if bulk => {
                        s.expected.insert(send_id, rid);
                    }
                    // The ring carries no transfer of its own.
                    Action::Expect { .. } => {}
                    Action::Transfer { send_id, .. } if bulk => s.bulk_out.push_back(send_id),
                    Action::Transfer { send_id, len } => s.rndv.chunks.push(send_id, len),
                }
            }
            std::mem::swap(&mut todo, &mut more);
        }
        self.sides[k].release_finished();
        self.pump(k);
    }

    /// Side `k` handles the other's next frame; false when none was in flight.
    fn deliver_frame(&mut self, k: usize) -> bool {
        let Some(bytes) = self.sides[1 - k].out.pop_front() else {
            return false;
        };
        let f = Frame::parse(&bytes).expect("a frame we encoded parses");
        let now = self.tick();
        let s = &mut self.sides[k];
        let (tag, item) = match f {
            Frame::Eager { tag, data } => (tag, Arrived::Eager(data.to_vec())),
            Frame::Rts {
                tag,
                len,
                send_id,
                addr,
            } => (tag, Arrived::Rts { len, send_id, addr }),
            ref f => {
                let mut acts = Vec::new();
                s.rndv
                    .on_frame(&mut s.req, &self.costs, f, now, &mut acts)
                    .expect("a correct peer's frame is accepted");
                self.act(k, acts);
                return true;
            }
        };
        // (The simulated link hands each frame over once: what no receive wants is set
        // aside at once, as a runtime does when nothing else moves.)
        match s.req.arrival(PEER, tag, true) {
            Arrival::Posted(rid) => self.deliver(k, rid, tag, item),
            Arrival::SetAside | Arrival::Leave => s.req.set_aside(PEER, tag, item),
        }
        true
    }

    /// Side `k` receives the other's next transfer over a link that carries them: the
    /// message lands in the receive's buffer (its head, in a shorter one), the link reports
    /// it to both sides. False when none was in flight.
    fn deliver_bulk(&mut self, k: usize) -> bool {
        let (s, o) = self.pair(k);
        let Some(send_id) = o.bulk_out.pop_front() else {
            return false;
        };
        let rid = s
            .expected
            .remove(&send_id)
            .expect("a transfer the receiver expects");
        let op = &o.req.sends[&send_id];
        assert!(
            !op.data.released && matches!(op.state, SendState::Transfer),
            "transfer of a send's memory after it was released"
        );
        let r = s
            .req
            .recvs
            .get_mut(&rid)
            .expect("a transfer into a receive");
        assert!(
            matches!(r.state, RecvState::Transfer { .. }),
            "transfer into a receive that is not waiting for it"
        );
        let n = r.buf.len().min(op.data.data.len());
        r.buf[..n].copy_from_slice(&op.data.data[..n]);
        s.rndv.transfers_done(&mut s.req, &[send_id], &[]);
        o.rndv.transfers_done(&mut o.req, &[], &[send_id]);
        s.release_finished();
        o.release_finished();
        true
    }

    /// Side `k` withdraws a random send; a receiver's answer decides an announced one.
    fn cancel_send(&mut self, k: usize) {
        let s = &mut self.sides[k];
        let mut ids: Vec<u64> = s.req.sends.iter_mut().map(|(id, _)| id).collect();
        ids.sort_unstable();
        let Some(&id) = ids.get(self.rng.below(ids.len().max(1) as u64) as usize) else {
            return;
        };
        let op = s.req.sends.get_mut(&id).unwrap();
        match op.state.cancel_step() {
            CancelStep::Withdraw => {
                s.txq.withdraw(id);
                op.state = SendState::Done(Err(Failure::Cancelled));
                op.data.released = true;
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
            .find(|id| matches!(s.req.recvs[id].state, RecvState::Posted))
        {
            if s.req.matcher.cancel(&id) {
                s.marks.get_mut(&id).unwrap().cancelled = true;
                s.req.recvs.get_mut(&id).unwrap().state = RecvState::Done(Err(Failure::Cancelled));
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
        // The link forgets every transfer, both ways.
        s.bulk_out.clear();
        o.bulk_out.clear();
        o.expected.clear();
        o.rndv.peer_died(&mut o.req, || Failure::PeerDead(PEER));
        o.release_finished();
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
            46..=55 => {
                self.deliver_bulk(k);
            }
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
                while !self.sides[k].txq.is_empty() || !self.sides[k].rndv.chunks.is_empty() {
                    self.flush(k);
                }
                moved |= self.deliver_frame(k);
                moved |= self.deliver_bulk(k);
            }
            // (A side's last flush may have put frames in the link after the other's
            // last look.)
            let idle = |s: &Side| s.out.is_empty() && s.bulk_out.is_empty();
            if !moved && self.sides.iter().all(idle) {
                return;
            }
        }
        panic!("frames still in flight after 100 000 rounds");
    }
}

/// Reads `buf.len()` bytes at `addr` out of the sender's memory (a message's address, as
/// its RTS gave it, plus an offset).
fn cma_read(sender: &Side, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
    if sender.dead {
        return Err(std::io::Error::from_raw_os_error(3));
    }
    let op = sender
        .req
        .sends
        .values()
        .find(|o| {
            let at = o.data.data.as_ptr() as u64;
            (at..at + o.data.len).contains(&addr)
        })
        .expect("a read of a message's memory");
    assert!(
        !op.data.released && matches!(op.state, SendState::WaitFin),
        "read of a send's memory after it was released"
    );
    let offset = (addr - op.data.data.as_ptr() as u64) as usize;
    buf.copy_from_slice(&op.data.data[offset..offset + buf.len()]);
    Ok(())
}

/// Writes `data` at `addr` in the receiver's memory: the start of a receive's buffer.
fn cma_write(receiver: &mut Side, addr: u64, data: &[u8]) {
    let r = receiver
        .req
        .recvs
        .values_mut()
        .find(|r| r.buf.as_ptr() as u64 == addr)
        .expect("a push into a receive's buffer");
    assert!(
        matches!(r.state, RecvState::Split { .. }),
        "write into a receive that is not waiting for it"
    );
    r.buf[..data.len()].copy_from_slice(data);
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
        let mut sends: Vec<&SendOp> = s.req.sends.values().filter(|o| o.tag == tag).collect();
        sends.sort_by_key(|o| o.data.seq);
        let live: Vec<&&SendOp> = sends
            .iter()
            .filter(|o| !matches!(o.state, SendState::Done(Err(Failure::Cancelled))))
            .collect();
        let mut next = 0;
        for rid in &r.posted[tag as usize] {
            let op = &r.req.recvs[rid];
            let marks = r.marks[rid];
            let got = match &op.state {
                RecvState::Done(Ok(st)) => Some(st.len),
                RecvState::Done(Err(Failure::Truncated { len, .. })) => Some(*len),
                RecvState::Done(Err(Failure::Cancelled)) => {
                    assert!(
                        marks.cancelled,
                        "seed {seed}: a receive cancelled by nobody"
                    );
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
            if !marks.matched {
                assert!(got.is_none(), "seed {seed}: a receive completed unmatched");
                continue;
            }
            // Matched, then failed with its sender (read from a dead process).
            let Some(len) = got else {
                next += 1;
                continue;
            };
            let n = (len as usize).min(op.buf.len());
            let is = |o: &SendOp| o.data.len == len && op.buf[..n] == o.data.payload[..n];
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
            assert_eq!(len, sent.data.len, "seed {seed}: tag {tag}: length");
            assert!(
                is(sent),
                "seed {seed}: tag {tag}: message {} delivered with wrong bytes",
                sent.data.seq
            );
        }
        // What was not delivered is a rendezvous send still unmatched (or failed) or an
        // eager message waiting; never a rendezvous send that reported success.
        for o in &live[next.min(live.len())..] {
            if o.data.len > EAGER_MAX && all_over {
                assert!(
                    !matches!(o.state, SendState::Done(Ok(()))),
                    "seed {seed}: tag {tag}: send {} succeeded undelivered",
                    o.data.seq
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
    for o in s.req.sends.values() {
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
                    .req
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
    let id = w.sides[0].req.alloc_id();
    w.sides[0].req.add_send(
        id,
        SendReq {
            peer: PEER,
            tag: 0,
            data: Send {
                len: 4096,
                payload: data.clone(),
                data,
                released: false,
                seq: 0,
            },
            state: SendState::Queued,
            watched: false,
        },
    );
    w.sides[0].sent_per_tag[0] = 1;
    w.sides[0].txq.push_send(id);
    while !w.sides[0].txq.is_empty() {
        w.flush(0);
    }
    w.post_recv_exact(1, 0, 4096);
    assert!(w.deliver_frame(1), "the RTS arrives and matches");
    // The sender cancels now: its Cancel crosses the receiver's Fin or CTS.
    w.cancel_send(0);
    w.settle();
    let op = &w.sides[0].req.sends[&id];
    assert!(
        matches!(op.state, SendState::Done(Ok(()))),
        "{:?}",
        op.state
    );
    check_direction(7, &w.sides[0], &w.sides[1]);
}
