//! Endpoints: one clink endpoint each, with the tagged data path, completions and the
//! connection rule (the endpoint with the smaller identity connects).

use crate::abi::*;
use crate::av::{table_of, AvShared};
use crate::cq::{shared_of, CqShared, Failure};
use crate::fabric::{domain_ref, Domain};
use crate::lock::{DomainLock, Guard};
use crate::{enosys, err, fid_ops, guard};
use bytes::Bytes;
use clink::events::{Event, PEERS, REQUESTS};
use clink::{Endpoint, Error, PeerId, RecvRequest, Selector, SendRequest};
use clink_proto::addr::Address;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod calls;
mod kept;
mod peers;
mod posted;

pub use calls::endpoint;
use posted::{Dest, Posted, PostedRecv};

/// How long an endpoint with the larger identity waits for the other to connect before it
/// connects itself.
const CONNECT_GRACE: Duration = Duration::from_millis(200);
/// How long an endpoint whose connection crossed the peer's (and is not the one kept)
/// waits for the peer's to arrive.
const CROSSED_WAIT: Duration = Duration::from_secs(20);

/// A hasher for the integer keys of the endpoint's maps (request numbers, identities):
/// one multiplication instead of SipHash on every message.
#[derive(Default, Clone, Copy)]
struct IntHash(u64);

impl std::hash::Hasher for IntHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = (self.0 ^ k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u128(&mut self, k: u128) {
        self.write_u64(k as u64);
        self.write_u64((k >> 64) as u64);
    }
    fn write_usize(&mut self, k: usize) {
        self.write_u64(k as u64);
    }
}

type Map<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IntHash>>;

/// Caller memory lent to a send until it completes.
struct Lent {
    ptr: *const u8,
    len: usize,
}

// SAFETY: libfabric's contract keeps the buffer valid and unchanged until the send's
// completion, whichever thread reads it.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the Send impl.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A send's bytes: the caller's (lent when a completion will say they are free, else
/// copied) or a gathered copy of several buffers.
enum Data<'a> {
    Caller(&'a [u8]),
    Owned(Vec<u8>),
}

/// A claimed message's final receive (`FI_CLAIM`), or where it is waited for.
struct ClaimTarget {
    ctx: *mut c_void,
    dest: Dest,
    discard: bool,
    report: bool,
}

/// A message a peek claimed: received into the endpoint's buffer at once, handed over
/// when the application's `FI_CLAIM` receive comes.
struct Claim {
    done: Option<clink::Result<Option<clink::Received>>>,
    target: Option<ClaimTarget>,
}

enum Op {
    Send {
        req: SendRequest,
        ctx: *mut c_void,
        len: usize,
        tag: u64,
        report: bool,
    },
    Claim {
        req: RecvRequest,
        key: usize,
    },
}

/// The endpoint's connection to itself: a second clink endpoint connected to the first,
/// through which messages to the endpoint's own address go (MPI ranks send to themselves).
struct Looped {
    ep: Endpoint,
    /// Its connection to the main endpoint.
    to_main: PeerId,
    /// Its identity (the main endpoint's peer for it has this remote identity).
    id: u128,
    /// Its sends in flight, by request number.
    ops: Map<u64, Op>,
}

/// Where an address leads.
#[derive(Clone, Copy)]
enum Target {
    Peer(PeerId),
    Myself,
}

struct State {
    ep: Endpoint,
    ctx: clink::Context,
    looped: Option<Looped>,
    my_id: u128,
    av: Option<Arc<AvShared>>,
    tx_cq: Option<Arc<CqShared>>,
    rx_cq: Option<Arc<CqShared>>,
    tx_selective: bool,
    rx_selective: bool,
    tx_flags: u64,
    rx_flags: u64,
    /// Receives honour their source address (`FI_DIRECTED_RECV` asked for); without it
    /// the address is ignored, as libfabric specifies.
    directed: bool,
    /// Untagged messages (`FI_MSG`) are offered: tagged ones have 63 bits ([`MSG_TAG`]).
    msg: bool,
    /// The connection to each peer endpoint, by its identity.
    links: Map<u128, PeerId>,
    /// Each connection's peer identity, by `PeerId`.
    remote_of: Vec<u128>,
    /// Per `PeerId`, the largest message written in place into the peer's shared-memory
    /// ring (0 for a network peer).
    ring_max: Vec<u64>,
    /// Address-vector entries looked at for connecting.
    considered: usize,
    /// The address of each connection's peer, once known (`FI_SOURCE`).
    sources: Vec<u64>,
    /// Peers with a larger identity we wait for (to connect to us), since when.
    waiting: Map<u128, Instant>,
    /// Where each address used so far leads, by address (the vector hands out small
    /// consecutive numbers).
    routes: Vec<Option<Target>>,
    /// Peers our connection attempt failed for (sends to them fail).
    unreachable: HashSet<u128>,
    /// Peers whose connection to us crossed ours and is the one kept: we wait for it
    /// (since when).
    crossed: Map<u128, Instant>,
    /// Sends in flight and claims, by clink's request number.
    ops: Map<u64, Op>,
    /// The posted receives.
    posted: Posted,
    /// Receives not handed to clink yet, in the order they were posted (their words in
    /// `posted`, and selectors): while clink holds no posted receive and no unexpected
    /// message, the messages at the heads of the rings are matched against these by the
    /// provider ([`Endpoint::poll_eager`]), which saves clink's bookkeeping of a request per
    /// small message. Anything else hands them over first, in order ([`State::hand_over`]),
    /// so that matching is clink's, in the order the receives were posted.
    lazy: VecDeque<(u64, Selector)>,
    /// Messages taken off the rings by [`Endpoint::poll_eager`] that no kept receive
    /// wanted, in arrival order (sender, tag, bytes): a receive posted later looks here
    /// first. Handed to clink, as its unexpected messages, with [`State::lazy`]: while this
    /// holds any, clink holds none (it takes messages only in passes, which come after a
    /// hand-over), so none of them ever arrived after one of clink's.
    early: VecDeque<(PeerId, u64, Vec<u8>)>,
    /// Buffers of early messages taken, kept for the next ones (at most [`kept::SPARE_MAX`]).
    spare: Vec<Vec<u8>>,
    claims: Map<usize, Claim>,
    /// Receives [`clink::Endpoint::poll_recvs`] completed (their words), kept for its
    /// memory.
    fast: Vec<(u64, clink::Result<clink::Status>)>,
}

// SAFETY: the endpoint and the application's pointers are only used under the state's
// mutex (one thread at a time).
unsafe impl Send for State {}

/// The part of an endpoint that completion queues drive.
pub struct EpShared {
    st: DomainLock<State>,
}

impl EpShared {
    fn lock(&self) -> Guard<'_, State> {
        self.st.lock()
    }

    /// Arms this endpoint's clink endpoints (its own and the one its messages to itself
    /// take) for a sleep on their file descriptors, which it adds to `fds`: false when one
    /// has work already (progress instead; nothing stays armed). Then
    /// [`EpShared::finish_wait`].
    pub fn prepare_wait(&self, fds: &mut Vec<std::os::fd::RawFd>) -> bool {
        let mut st = self.lock();
        if !st.ep.prepare_wait() {
            return false;
        }
        if let Some(l) = st.looped.as_mut() {
            if !l.ep.prepare_wait() {
                st.ep.finish_wait();
                return false;
            }
            fds.push(l.ep.fd());
        }
        fds.push(st.ep.fd());
        true
    }

    /// Withdraws what [`EpShared::prepare_wait`] armed.
    pub fn finish_wait(&self) {
        let mut st = self.lock();
        st.ep.finish_wait();
        if let Some(l) = st.looped.as_mut() {
            l.ep.finish_wait();
        }
    }

    /// One round of progress: new connections, clink's progress, completions.
    pub fn progress(&self) {
        self.lock().progress();
    }
}

/// The clink tag of untagged (`FI_MSG`) messages. On an endpoint that offers FI_MSG,
/// tagged messages keep this bit clear (63 tag bits, as its `mem_tag_format` says), and an
/// untagged receive matches exactly the messages that have it.
pub(super) const MSG_TAG: u64 = 1 << 63;

/// A completion entry; on an endpoint with FI_MSG (`msg`), one of an untagged message
/// (its clink tag has [`MSG_TAG`]) says `FI_MSG` and tag 0.
fn tagged_entry(
    msg: bool,
    ctx: *mut c_void,
    flags: u64,
    len: usize,
    buf: *mut c_void,
    tag: u64,
) -> fi_cq_tagged_entry {
    let (flags, tag) = if msg && tag & MSG_TAG != 0 {
        ((flags & !FI_TAGGED) | FI_MSG, 0)
    } else {
        (flags, tag)
    };
    fi_cq_tagged_entry {
        op_context: ctx,
        flags,
        len,
        buf,
        data: 0,
        tag,
    }
}

/// Reports a received message of `full` bytes whose entry `e` says how many landed: a
/// truncation failure when fewer than all, else the completion if `report`.
fn report_received(cq: &CqShared, e: fi_cq_tagged_entry, full: usize, report: bool, src: u64) {
    if full > e.len {
        let olen = full - e.len;
        cq.fail(Failure {
            entry: e,
            olen,
            err: FI_ETRUNC,
        });
    } else if report {
        cq.push(e, src);
    }
}

/// A receive's outcome, landed in its caller's memory, as `finish_recv` takes it.
fn landed(res: clink::Result<clink::Status>) -> clink::Result<Option<clink::Received>> {
    res.map(|status| {
        Some(clink::Received {
            buf: Vec::new(),
            status,
        })
    })
}

/// What a finished send reports.
struct SentOp {
    ctx: *mut c_void,
    len: usize,
    tag: u64,
    report: bool,
}

/// The outcome of send `id` of `ops` (made on `ep`) once it is over, the op taken out;
/// `None` while it is still under way (or not a send of `ops`).
fn finished_send(
    ep: &mut Endpoint,
    ops: &mut Map<u64, Op>,
    id: u64,
) -> Option<(clink::Result<bool>, SentOp)> {
    let Some(Op::Send { req, .. }) = ops.get(&id) else {
        return None;
    };
    let res = ep.finish_send(req);
    if let Ok(false) = res {
        return None;
    }
    let Some(Op::Send {
        ctx,
        len,
        tag,
        report,
        ..
    }) = ops.remove(&id)
    else {
        return None;
    };
    Some((
        res,
        SentOp {
            ctx,
            len,
            tag,
            report,
        },
    ))
}

const RX: u64 = FI_RECV | FI_TAGGED;
const TX: u64 = FI_SEND | FI_TAGGED;

impl State {
    fn progress(&mut self) {
        self.connect_new_entries();
        // The provider's own matching while clink holds no receive and no message (messages
        // to itself need the looped endpoint's progress: a full pass). When it cannot go on,
        // a pass is due: clink's poll below would count the same poll twice.
        let own =
            self.looped.is_none() && self.ep.posted_recvs() == 0 && self.ep.unexpected_count() == 0;
        if own {
            let enough = self.poll_lazy();
            self.report_fast();
            if enough {
                return;
            }
        }
        self.hand_over();
        // Small messages into posted receives straight off the rings, while nothing else
        // needs a pass (clink says when one is due). A completion into one buffer from a
        // peer whose address is known is reported on the spot; the others (a scatter, an
        // error, a first message) after the poll.
        let enough = !own && self.looped.is_none() && {
            let State {
                ep,
                posted,
                rx_cq,
                sources,
                msg,
                fast,
                ..
            } = self;
            ep.poll_recvs(|_, user, res| {
                if let (Ok(st), Some(cq)) = (&res, rx_cq.as_deref()) {
                    let known = peers::known_source(sources, st.peer);
                    let direct = posted
                        .get(user)
                        .is_some_and(|r| matches!(r.dest, Dest::Direct { .. }));
                    if let (Some(src), true) = (known, direct) {
                        let full = st.len as usize;
                        let r = posted.take(user).expect("looked at");
                        r.report(cq, *msg, full, full, st.tag, src);
                        return;
                    }
                }
                fast.push((user, res));
            })
            .is_some()
        };
        self.report_fast();
        if enough {
            return;
        }
        if let Some(mut l) = self.looped.take() {
            l.ep.progress();
            while let Some(ev) = l.ep.pop_event() {
                if let Event::SendDone { req, .. } = ev {
                    if let Some((res, s)) = finished_send(&mut l.ep, &mut l.ops, req) {
                        self.report_send(res, s);
                    }
                }
            }
            self.looped = Some(l);
        }
        // One pass, then what it (and the calls since the last) queued.
        self.ep.progress();
        while let Some(ev) = self.ep.pop_event() {
            match ev {
                Event::SendDone { req, .. } => self.send_done(req),
                Event::RecvDone { req, .. } => self.recv_done(req),
                Event::PeerConnected(_) => self.learn_peers(),
                _ => {}
            }
        }
    }

    /// Reports the receives a poll completed into [`State::fast`].
    fn report_fast(&mut self) {
        if self.fast.is_empty() {
            return;
        }
        let mut fast = std::mem::take(&mut self.fast);
        for (user, res) in fast.drain(..) {
            if let Some(r) = self.posted.take(user) {
                self.finish_recv(r, landed(res));
            }
        }
        self.fast = fast;
    }

    fn send_done(&mut self, id: u64) {
        if let Some((res, s)) = finished_send(&mut self.ep, &mut self.ops, id) {
            self.report_send(res, s);
        }
    }

    /// Queues a finished send's completion (or failure).
    fn report_send(&self, res: clink::Result<bool>, s: SentOp) {
        let SentOp {
            ctx,
            len,
            tag,
            report,
        } = s;
        let Some(cq) = &self.tx_cq else { return };
        match res {
            Ok(_) if report => cq.push(
                tagged_entry(self.msg, ctx, TX, 0, std::ptr::null_mut(), tag),
                FI_ADDR_NOTAVAIL,
            ),
            Ok(_) => {}
            Err(_) => cq.fail(Failure {
                entry: tagged_entry(self.msg, ctx, TX, len, std::ptr::null_mut(), tag),
                olen: 0,
                err: FI_EIO,
            }),
        }
    }

    fn recv_done(&mut self, id: u64) {
        if let Some(user) = self.ep.recv_user(id).filter(|&u| u != 0) {
            let Some(req) = self.posted.get(user).and_then(|r| r.req.as_ref()) else {
                return;
            };
            let res = self.ep.finish_recv(req);
            if let Ok(None) = res {
                return;
            }
            if let Some(r) = self.posted.take(user) {
                self.finish_recv(r, res);
            }
            return;
        }
        match self.ops.remove(&id) {
            Some(Op::Claim { req, key }) => {
                let res = self.ep.finish_recv(&req);
                if let Ok(None) = res {
                    self.ops.insert(id, Op::Claim { req, key });
                    return;
                }
                if let Some(c) = self.claims.get_mut(&key) {
                    c.done = Some(res);
                }
                self.settle_claim(key);
            }
            Some(op) => {
                self.ops.insert(id, op);
            }
            None => {}
        }
    }

    /// Reports a finished receive (its result from `finish_recv`).
    fn finish_recv(&mut self, r: PostedRecv, res: clink::Result<Option<clink::Received>>) {
        match res {
            Ok(Some(got)) => {
                let full = got.status.len as usize;
                let len = match &r.dest {
                    // SAFETY: the caller's iovecs, valid until this completion.
                    Dest::Scatter(s) => unsafe {
                        r.dest.scatter(&s.staging[..full.min(s.staging.len())])
                    },
                    Dest::Direct { .. } => full,
                };
                let src = self.source_of(got.status.peer);
                if let Some(cq) = &self.rx_cq {
                    r.report(cq, self.msg, len, full, got.status.tag, src);
                }
            }
            Ok(None) => {}
            Err(Error::Truncated { len, capacity }) => {
                let tag = if r.exact { r.tag } else { 0 };
                if let Some(cq) = &self.rx_cq {
                    cq.fail(Failure {
                        entry: tagged_entry(
                            self.msg,
                            r.ctx,
                            RX,
                            capacity as usize,
                            r.dest.first(),
                            tag,
                        ),
                        olen: (len - capacity) as usize,
                        err: FI_ETRUNC,
                    });
                }
            }
            Err(e) => {
                // Consumed: a cancel took the request.
                let err = if matches!(e, Error::Consumed) {
                    FI_ECANCELED
                } else {
                    FI_EIO
                };
                if let Some(cq) = &self.rx_cq {
                    cq.fail(Failure {
                        entry: tagged_entry(self.msg, r.ctx, RX, 0, r.dest.first(), r.tag),
                        olen: 0,
                        err,
                    });
                }
            }
        }
    }

    /// Hands a claimed message to its `FI_CLAIM` receive once both are there.
    fn settle_claim(&mut self, key: usize) {
        let ready = self
            .claims
            .get(&key)
            .is_some_and(|c| c.done.is_some() && c.target.is_some());
        if !ready {
            return;
        }
        let c = self.claims.remove(&key).expect("checked");
        let (res, t) = (c.done.expect("checked"), c.target.expect("checked"));
        let Some(cq) = self.rx_cq.clone() else { return };
        match res {
            Ok(Some(got)) => {
                let src = self.source_of(got.status.peer);
                let full = got.buf.len();
                let len = if t.discard {
                    0
                } else {
                    match &t.dest {
                        Dest::Direct { buf, cap } => {
                            let k = full.min(*cap);
                            // SAFETY: the caller's buffer of `cap` bytes.
                            unsafe { std::ptr::copy_nonoverlapping(got.buf.as_ptr(), *buf, k) };
                            k
                        }
                        // SAFETY: the caller's iovecs.
                        d => unsafe { d.scatter(&got.buf) },
                    }
                };
                let e = tagged_entry(self.msg, t.ctx, RX, len, t.dest.first(), got.status.tag);
                // A discarded message is not truncated: nothing of it was wanted.
                report_received(&cq, e, if t.discard { len } else { full }, t.report, src);
            }
            _ => cq.fail(Failure {
                entry: tagged_entry(self.msg, t.ctx, RX, 0, t.dest.first(), 0),
                olen: 0,
                err: FI_EIO,
            }),
        }
    }

    fn send(&mut self, data: Data<'_>, dest: u64, tag: u64, ctx: *mut c_void, flags: u64) -> isize {
        let target = match self.target(dest) {
            Ok(Target::Myself) => self.ensure_loop().map(|_| Target::Myself),
            t => t,
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => {
                if e == FI_EAGAIN {
                    self.progress();
                }
                return err(e);
            }
        };
        let inject = flags & FI_INJECT != 0;
        let report = !inject && (flags & FI_COMPLETION != 0 || !self.tx_selective);
        if let (Data::Caller(d), Target::Peer(p)) = (&data, target) {
            // Written into a same-host peer's ring when it has room: no allocation, no
            // request to track, and the completion (if any) at once: the message is in
            // the peer's ring and the buffer free again. An inject (no completion) to a
            // network peer is copied into its link's queue when that takes it.
            let fits = self
                .ring_max
                .get(p.0 as usize)
                .is_some_and(|&m| d.len() as u64 <= m);
            if fits || inject {
                if let Ok(true) = self.ep.try_send(p, tag, d) {
                    if report {
                        if let Some(cq) = &self.tx_cq {
                            cq.push(
                                tagged_entry(self.msg, ctx, TX, 0, std::ptr::null_mut(), tag),
                                FI_ADDR_NOTAVAIL,
                            );
                        }
                    }
                    return 0;
                }
            }
        }
        // Without a completion the application may reuse the buffer at once: copy it.
        let bytes = match data {
            Data::Caller(d) if report => Bytes::from_owner(Lent {
                ptr: d.as_ptr(),
                len: d.len(),
            }),
            Data::Caller(d) => Bytes::copy_from_slice(d),
            Data::Owned(v) => Bytes::from(v),
        };
        let len = bytes.len();
        let (ep, ops, peer) = match target {
            Target::Peer(p) => (&mut self.ep, &mut self.ops, p),
            Target::Myself => {
                let l = self.looped.as_mut().expect("made above");
                (&mut l.ep, &mut l.ops, l.to_main)
            }
        };
        match ep.isend(peer, tag, bytes) {
            Ok(req) => {
                ops.insert(
                    req.id(),
                    Op::Send {
                        req,
                        ctx,
                        len,
                        tag,
                        report,
                    },
                );
                0
            }
            Err(_) => err(FI_EIO),
        }
    }

    /// A tagged send's tag: with FI_MSG offered, the top bit is the untagged messages'.
    fn tagged_send_tag(&self, tag: u64) -> Result<u64, c_int> {
        if self.msg && tag & MSG_TAG != 0 {
            return Err(FI_EINVAL);
        }
        Ok(tag)
    }

    /// A tagged receive's tag and ignore mask: with FI_MSG offered, the top bit is always
    /// compared and clear (no untagged message matches a tagged receive).
    fn tagged_recv_bits(&self, tag: u64, ignore: u64) -> (u64, u64) {
        if self.msg {
            (tag & !MSG_TAG, ignore & !MSG_TAG)
        } else {
            (tag, ignore)
        }
    }

    fn selector(&mut self, src: u64, tag: u64, ignore: u64) -> Result<Selector, c_int> {
        let named = src != FI_ADDR_UNSPEC
            && self.directed
            && (self.routes.get(src as usize).is_some_and(Option::is_some)
                || self
                    .av
                    .as_ref()
                    .is_some_and(|av| av.lock().unwrap_or_else(|e| e.into_inner()).gave_out(src)));
        // An address the vector never gave out names no one: any source (see av.rs).
        let src = if !named {
            None
        } else {
            Some(match self.target(src)? {
                Target::Peer(p) => p,
                Target::Myself => self.link_from_myself()?,
            })
        };
        Ok(Selector {
            src,
            tag: tag & !ignore,
            mask: !ignore,
        })
    }

    fn recv(
        &mut self,
        iov: &[(*mut u8, usize)],
        src: u64,
        tag: u64,
        ignore: u64,
        ctx: *mut c_void,
        flags: u64,
    ) -> isize {
        let sel = match self.selector(src, tag, ignore) {
            Ok(s) => s,
            Err(e) => {
                if e == FI_EAGAIN {
                    self.progress();
                }
                return err(e);
            }
        };
        let report = flags & FI_COMPLETION != 0 || !self.rx_selective;
        let mut dest = if iov.len() == 1 {
            Dest::Direct {
                buf: iov[0].0,
                cap: iov[0].1,
            }
        } else {
            Dest::scatter_over(iov.to_vec(), Vec::new())
        };
        if flags & FI_PEEK != 0 {
            // (The peek looks at clink's messages, the kept ones among them, and a claim's
            // receive goes to clink after the receives posted before it.)
            self.hand_over();
            return self.peek(sel, ctx, flags);
        }
        if flags & FI_CLAIM != 0 {
            let key = ctx as usize;
            let Some(c) = self.claims.get_mut(&key) else {
                return err(FI_EINVAL);
            };
            c.target = Some(ClaimTarget {
                ctx,
                dest,
                discard: flags & FI_DISCARD != 0,
                report,
            });
            self.settle_claim(key);
            return 0;
        }
        if let Dest::Direct { buf, cap } = dest {
            // A message the provider took before any receive wanted it (see `early`).
            if !self.early.is_empty() && self.recv_early(sel, buf, cap, ctx, report) {
                return 0;
            }
            // Kept by the provider while clink holds nothing the receive would have to
            // come after (see `lazy`).
            if self.looped.is_none()
                && self.rx_cq.is_some()
                && self.ep.unexpected_count() == 0
                && self.ep.posted_recvs() == 0
            {
                let user = self.posted.reserve();
                self.posted
                    .fill(user, PostedRecv::kept(sel, ctx, dest, report));
                self.lazy.push_back((user, sel));
                return 0;
            }
        }
        // After the receives posted before it.
        self.hand_over();
        let waiting = self.ep.unexpected_count() != 0;
        let (buf, cap) = match &mut dest {
            Dest::Direct { buf, cap } => (*buf, *cap),
            // The vector's memory stays put when the receive moves.
            Dest::Scatter(s) => {
                s.staging = vec![0; s.iovs.iter().map(|v| v.1).sum()];
                (s.staging.as_mut_ptr(), s.staging.len())
            }
        };
        let user = self.posted.reserve();
        // SAFETY: libfabric's contract keeps a caller buffer valid until the completion;
        // `staging` lives in the receive's slot until then.
        let req = unsafe { self.ep.irecv_raw_user(sel, buf, cap, user) };
        let r = PostedRecv {
            req: Some(req),
            ctx,
            dest,
            report,
            tag: sel.tag,
            exact: sel.mask == u64::MAX,
        };
        // A message that had arrived (unexpected) completes the receive at once: its
        // completion is queued now rather than after the next pass's event.
        let res = match &r.req {
            Some(req) if waiting => self.ep.finish_recv(req),
            _ => Ok(None),
        };
        match res {
            Ok(None) => self.posted.fill(user, r),
            res => {
                self.posted.release(user);
                self.finish_recv(r, res)
            }
        }
        0
    }

    /// `FI_PEEK` (with `FI_CLAIM` or `FI_DISCARD`): reports a matching message that has
    /// arrived, or fails with `FI_ENOMSG`.
    fn peek(&mut self, sel: Selector, ctx: *mut c_void, flags: u64) -> isize {
        let Some(cq) = self.rx_cq.clone() else {
            return err(FI_EINVAL);
        };
        let Some(st) = self.ep.probe(sel) else {
            cq.fail(Failure {
                entry: tagged_entry(self.msg, ctx, RX, 0, std::ptr::null_mut(), sel.tag),
                olen: 0,
                err: FI_ENOMSG,
            });
            return 0;
        };
        if flags & (FI_CLAIM | FI_DISCARD) != 0 {
            // The first message from that peer with that tag is the one the peek saw.
            let exact = Selector::exact(Some(st.peer), st.tag);
            let req = match self.ep.irecv(exact, vec![0; st.len as usize]) {
                Ok(r) => r,
                Err(_) => return err(FI_EIO),
            };
            let key = ctx as usize;
            self.claims.insert(
                key,
                Claim {
                    done: None,
                    target: (flags & FI_CLAIM == 0).then_some(ClaimTarget {
                        ctx,
                        dest: Dest::scatter_over(Vec::new(), Vec::new()),
                        discard: true,
                        report: false,
                    }),
                },
            );
            self.ops.insert(req.id(), Op::Claim { req, key });
        }
        let src = self.source_of(st.peer);
        cq.push(
            tagged_entry(
                self.msg,
                ctx,
                RX,
                st.len as usize,
                std::ptr::null_mut(),
                st.tag,
            ),
            src,
        );
        0
    }

    fn cancel(&mut self, ctx: *mut c_void) -> isize {
        let Some(user) = self.posted.find(ctx) else {
            return 0;
        };
        let Some(r) = self.posted.get(user) else {
            return 0;
        };
        let Some(req) = &r.req else {
            // Not handed to clink: withdrawn here.
            self.lazy.retain(|&(u, _)| u != user);
            if let Some(r) = self.posted.take(user) {
                self.finish_recv(r, Err(Error::Consumed));
            }
            return 0;
        };
        let _ = self.ep.cancel_recv(req);
        // Cancelled: the request is gone (Consumed); matched meanwhile: it finishes (and
        // stays in its slot until then: clink knows it by that slot's word).
        let res = self.ep.test_recv(req);
        if let Ok(None) = res {
            return 0;
        }
        if let Some(r) = self.posted.take(user) {
            self.finish_recv(r, res);
        }
        0
    }
}
