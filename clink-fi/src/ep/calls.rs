//! The endpoint's libfabric face: the object and its operation tables (fid, ep, cm, msg,
//! tagged; the unsupported classes' stubs), `fi_endpoint`, and the `extern "C"` calls
//! that check their arguments and hand them to the endpoint's [`State`].

use super::*;

/// The endpoint object.
#[repr(C)]
struct Ep {
    fid: fid_ep,
    shared: Arc<EpShared>,
    _domain: Arc<Domain>,
}

static EP_FID_OPS: fi_ops = fid_ops(ep_close, ep_bind, ep_control);
static EP_OPS: fi_ops_ep = fi_ops_ep {
    size: std::mem::size_of::<fi_ops_ep>(),
    cancel,
    getopt,
    setopt,
    tx_ctx: enosys,
    rx_ctx: enosys,
    rx_size_left: enosys,
    tx_size_left: enosys,
};
static CM_OPS: fi_ops_cm = fi_ops_cm {
    size: std::mem::size_of::<fi_ops_cm>(),
    setname: enosys,
    getname,
    getpeer: enosys,
    connect: enosys,
    listen: enosys,
    accept: enosys,
    reject: enosys,
    shutdown: enosys,
    join: enosys,
};
static TAGGED_OPS: fi_ops_tagged = fi_ops_tagged {
    size: std::mem::size_of::<fi_ops_tagged>(),
    recv: trecv,
    recvv: trecvv,
    recvmsg: trecvmsg,
    send: tsend,
    sendv: tsendv,
    sendmsg: tsendmsg,
    inject: tinject,
    senddata: enosys,
    injectdata: enosys,
};
static MSG_OPS: fi_ops_msg = fi_ops_msg {
    size: std::mem::size_of::<fi_ops_msg>(),
    recv: mrecv,
    recvv: mrecvv,
    recvmsg: mrecvmsg,
    send: msend,
    sendv: msendv,
    sendmsg: msendmsg,
    inject: minject,
    senddata: enosys,
    injectdata: enosys,
};
static RMA_OPS: fi_ops_none<9> = fi_ops_none {
    size: std::mem::size_of::<fi_ops_none<9>>(),
    slots: [enosys; 9],
};
static ATOMIC_OPS: fi_ops_none<13> = fi_ops_none {
    size: std::mem::size_of::<fi_ops_none<13>>(),
    slots: [enosys; 13],
};
static COLL_OPS: fi_ops_none<11> = fi_ops_none {
    size: std::mem::size_of::<fi_ops_none<11>>(),
    slots: [enosys; 11],
};

pub unsafe extern "C" fn endpoint(
    domain: *mut fid_domain,
    info: *mut fi_info,
    out: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if out.is_null() || domain.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: an open domain of ours; `info` NULL or valid.
        let (dom, info) = unsafe { (domain_ref(domain), info.as_ref()) };
        let ep = match dom
            .context()
            .and_then(|c| c.endpoint().map_err(|e| e.to_string()))
        {
            Ok(ep) => ep,
            Err(e) => {
                crate::log(&format!("no clink endpoint: {e}"));
                return -FI_EIO;
            }
        };
        let mut ep = ep;
        ep.set_interest(REQUESTS | PEERS);
        // SAFETY: the info's attributes NULL or valid.
        let (tx_flags, rx_flags) = unsafe {
            (
                info.and_then(|i| i.tx_attr.as_ref())
                    .map_or(0, |t| t.op_flags),
                info.and_then(|i| i.rx_attr.as_ref())
                    .map_or(0, |r| r.op_flags),
            )
        };
        let ctx = match dom.context() {
            Ok(c) => c,
            Err(_) => return -FI_EIO,
        };
        let my_id = ep.endpoint_id();
        // SAFETY: the info's attributes NULL or valid.
        let directed = unsafe {
            info.is_some_and(|i| {
                i.caps & FI_DIRECTED_RECV != 0
                    || i.rx_attr
                        .as_ref()
                        .is_some_and(|r| r.caps & FI_DIRECTED_RECV != 0)
            })
        };
        let shared = Arc::new(EpShared {
            st: DomainLock::new(
                dom.threading,
                State {
                    ep,
                    ctx,
                    looped: None,
                    my_id,
                    av: None,
                    tx_cq: None,
                    rx_cq: None,
                    tx_selective: false,
                    rx_selective: false,
                    tx_flags,
                    rx_flags,
                    directed,
                    msg: info.is_some_and(|i| i.caps & FI_MSG != 0),
                    links: Map::default(),
                    remote_of: Vec::new(),
                    ring_max: Vec::new(),
                    considered: 0,
                    routes: Vec::new(),
                    waiting: Map::default(),
                    sources: Vec::new(),
                    unreachable: HashSet::new(),
                    crossed: Map::default(),
                    ops: Map::default(),
                    posted: Default::default(),
                    lazy: VecDeque::new(),
                    early: VecDeque::new(),
                    spare: Vec::new(),
                    claims: Map::default(),
                    fast: Vec::new(),
                },
            ),
        });
        let e = Box::new(Ep {
            fid: fid_ep {
                fid: fid {
                    fclass: FI_CLASS_EP,
                    context,
                    ops: &EP_FID_OPS,
                },
                ops: &EP_OPS,
                cm: &CM_OPS,
                msg: &MSG_OPS,
                rma: &RMA_OPS,
                tagged: &TAGGED_OPS,
                atomic: &ATOMIC_OPS,
                collective: &COLL_OPS,
            },
            shared,
            _domain: dom,
        });
        // SAFETY: `out` checked above.
        unsafe { *out = Box::into_raw(e) as *mut fid_ep };
        0
    })
}

/// The shared part of an open endpoint, borrowed for the length of a call on it (the data
/// path takes no reference count).
///
/// # Safety
/// `f` must be an open endpoint of this provider, and stay open meanwhile.
unsafe fn shared<'a>(f: *mut fid) -> &'a EpShared {
    // SAFETY: per the contract.
    unsafe { &(*(f as *mut Ep)).shared }
}

unsafe extern "C" fn ep_close(f: *mut fid) -> c_int {
    guard(|| {
        // SAFETY: an endpoint this provider opened.
        let e = unsafe { Box::from_raw(f as *mut Ep) };
        let cqs = {
            let st = e.shared.lock();
            [st.tx_cq.clone(), st.rx_cq.clone()]
        };
        for cq in cqs.iter().flatten() {
            cq.detach(&e.shared);
        }
        let mut st = e.shared.lock();
        if let Some(mut l) = st.looped.take() {
            l.ep.close();
        }
        st.ep.close();
        drop(st);
        0
    })
}

unsafe extern "C" fn ep_bind(f: *mut fid, b: *mut fid, flags: u64) -> c_int {
    guard(|| {
        if b.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: an open endpoint of ours, and an object of ours to bind.
        unsafe {
            let sh = (*(f as *mut Ep)).shared.clone();
            let class = (*b).fclass;
            if class == FI_CLASS_CQ {
                // Before taking the endpoint's lock: a queue's reader holds the queue's list
                // while it drives the endpoints.
                shared_of(b).attach(&sh);
            }
            let mut st = sh.lock();
            match class {
                FI_CLASS_AV => st.av = Some(table_of(b)),
                FI_CLASS_CQ => {
                    let cq = shared_of(b);
                    let selective = flags & FI_SELECTIVE_COMPLETION != 0;
                    if flags & FI_TRANSMIT != 0 {
                        st.tx_cq = Some(cq.clone());
                        st.tx_selective = selective;
                    }
                    if flags & FI_RECV != 0 {
                        st.rx_cq = Some(cq);
                        st.rx_selective = selective;
                    }
                }
                _ => return -FI_ENOSYS,
            }
        }
        0
    })
}

unsafe extern "C" fn ep_control(f: *mut fid, command: c_int, _arg: *mut c_void) -> c_int {
    guard(|| {
        if command != FI_ENABLE {
            return -FI_ENOSYS;
        }
        // SAFETY: an open endpoint of ours.
        let sh = unsafe { shared(f) };
        let st = sh.lock();
        if st.av.is_none() || (st.tx_cq.is_none() && st.rx_cq.is_none()) {
            return -FI_EINVAL; // bind an address vector and a completion queue first
        }
        0
    })
}

unsafe extern "C" fn getname(f: *mut fid, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    guard(|| {
        if addrlen.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: an open endpoint of ours.
        let sh = unsafe { shared(f) };
        let text = sh.lock().ep.address();
        let Some(bytes) = Address::parse(&text).ok().and_then(|a| a.to_bytes()) else {
            return -FI_EIO;
        };
        // SAFETY: `addrlen` valid; `addr` has `*addrlen` bytes.
        unsafe {
            let room = *addrlen;
            *addrlen = bytes.len();
            if room < bytes.len() || addr.is_null() {
                return -FI_ETOOSMALL;
            }
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len());
        }
        0
    })
}

unsafe extern "C" fn cancel(f: *mut fid, ctx: *mut c_void) -> isize {
    // SAFETY: an open endpoint of ours.
    guard(|| {
        // SAFETY: an open endpoint of ours.
        let sh = unsafe { shared(f) };
        let r = sh.lock().cancel(ctx);
        r
    })
}

unsafe extern "C" fn getopt(
    _: *mut fid,
    _: c_int,
    _: c_int,
    _: *mut c_void,
    _: *mut usize,
) -> c_int {
    -FI_ENOPROTOOPT
}

unsafe extern "C" fn setopt(_: *mut fid, _: c_int, _: c_int, _: *const c_void, _: usize) -> c_int {
    -FI_ENOPROTOOPT
}

/// An operation's buffers as (pointer, length) pairs, held inline (no allocation on the
/// data path).
struct Iovs {
    v: [(*mut u8, usize); crate::info::IOV_LIMIT + 1],
    n: usize,
}

impl std::ops::Deref for Iovs {
    type Target = [(*mut u8, usize)];
    fn deref(&self) -> &Self::Target {
        &self.v[..self.n]
    }
}

/// The iovecs as (pointer, length) pairs; beyond `IOV_LIMIT` only one more is read (the
/// operation refuses the count anyway).
unsafe fn iovs(iov: *const libc::iovec, count: usize) -> Iovs {
    let mut out = Iovs {
        v: [(std::ptr::null_mut(), 0); crate::info::IOV_LIMIT + 1],
        n: 0,
    };
    if count == 0 || iov.is_null() {
        return out;
    }
    out.n = count.min(crate::info::IOV_LIMIT + 1);
    // SAFETY: the caller's `count` iovecs (at least as many as read here).
    let given = unsafe { std::slice::from_raw_parts(iov, out.n) };
    for (o, v) in out.v.iter_mut().zip(given) {
        *o = (v.iov_base as *mut u8, v.iov_len);
    }
    out
}

/// The caller's `len` bytes at `buf` (empty for a NULL pointer).
unsafe fn bytes_at<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's buffer.
    unsafe { std::slice::from_raw_parts(buf as *const u8, len) }
}

/// Which message kind an operation is: tagged with the caller's tag (and ignore bits), or
/// untagged (`FI_MSG`: [`MSG_TAG`], of which a receive takes any).
#[derive(Clone, Copy)]
enum Kind {
    Tagged { tag: u64, ignore: u64 },
    Untagged,
}

/// Untagged messages are tagged messages with [`MSG_TAG`]; an untagged receive takes the
/// next one from its source (or any), in order.
const UNTAGGED_IGNORE: u64 = !MSG_TAG;

impl Kind {
    /// The clink tag of a send: a tagged one may not use the untagged messages' bit when
    /// the endpoint offers both.
    fn send_tag(self, st: &State) -> Result<u64, c_int> {
        match self {
            Kind::Tagged { tag, .. } => st.tagged_send_tag(tag),
            Kind::Untagged => Ok(MSG_TAG),
        }
    }

    /// The tag and ignore bits of a receive.
    fn recv_bits(self, st: &State) -> (u64, u64) {
        match self {
            Kind::Tagged { tag, ignore } => st.tagged_recv_bits(tag, ignore),
            Kind::Untagged => (MSG_TAG, UNTAGGED_IGNORE),
        }
    }
}

/// Posts a receive into `iov` (at most `IOV_LIMIT` pieces; none: a zero-length buffer),
/// with the endpoint's default flags unless `flags` says.
unsafe fn post_recv(
    ep: *mut fid_ep,
    iov: &[(*mut u8, usize)],
    src: fi_addr_t,
    kind: Kind,
    ctx: *mut c_void,
    flags: Option<u64>,
) -> isize {
    if iov.len() > crate::info::IOV_LIMIT {
        return err(FI_EINVAL);
    }
    let none = [(std::ptr::null_mut(), 0)];
    let iov = if iov.is_empty() { &none[..] } else { iov };
    // SAFETY: an open endpoint of ours.
    let sh = unsafe { shared(ep as *mut fid) };
    let mut st = sh.lock();
    let flags = flags.unwrap_or(st.rx_flags);
    let (tag, ignore) = kind.recv_bits(&st);
    st.recv(iov, src, tag, ignore, ctx, flags)
}

/// Sends the caller's `iov` as one message (several pieces gathered into a copy, one
/// lent), with the endpoint's default flags unless `flags` says.
unsafe fn post_send(
    ep: *mut fid_ep,
    iov: &[(*mut u8, usize)],
    dest: fi_addr_t,
    kind: Kind,
    ctx: *mut c_void,
    flags: Option<u64>,
) -> isize {
    if iov.len() > crate::info::IOV_LIMIT {
        return err(FI_EINVAL);
    }
    // SAFETY: an open endpoint of ours.
    let sh = unsafe { shared(ep as *mut fid) };
    let mut st = sh.lock();
    let flags = flags.unwrap_or(st.tx_flags);
    let tag = match kind.send_tag(&st) {
        Ok(t) => t,
        Err(e) => return err(e),
    };
    if iov.len() <= 1 {
        // SAFETY: the caller's buffer.
        let data = iov.first().map_or(&[][..], |&(p, n)| unsafe {
            bytes_at(p as *const c_void, n)
        });
        return st.send(Data::Caller(data), dest, tag, ctx, flags);
    }
    let mut all = Vec::new();
    for &(p, n) in iov {
        // SAFETY: the caller's buffers.
        all.extend_from_slice(unsafe { bytes_at(p as *const c_void, n) });
    }
    st.send(Data::Owned(all), dest, tag, ctx, flags)
}

/// An inject: copied at once, never completed.
unsafe fn post_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
    kind: Kind,
) -> isize {
    if len > crate::info::INJECT_MAX {
        return err(FI_EINVAL);
    }
    let one = [(buf as *mut u8, len)];
    // SAFETY: forwarded.
    unsafe { post_send(ep, &one, dest, kind, std::ptr::null_mut(), Some(FI_INJECT)) }
}

// ------------------------------------------------------------------ tagged

unsafe extern "C" fn trecv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: fi_addr_t,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    let kind = Kind::Tagged { tag, ignore };
    // SAFETY: forwarded.
    guard(|| unsafe { post_recv(ep, &[(buf as *mut u8, len)], src, kind, ctx, None) })
}

unsafe extern "C" fn trecvv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    let kind = Kind::Tagged { tag, ignore };
    // SAFETY: the caller's iovecs; forwarded.
    guard(|| unsafe { post_recv(ep, &iovs(iov, count), src, kind, ctx, None) })
}

unsafe extern "C" fn trecvmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    guard(|| {
        // SAFETY: the caller's message description.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return err(FI_EINVAL);
        };
        let kind = Kind::Tagged {
            tag: m.tag,
            ignore: m.ignore,
        };
        // SAFETY: the message's iovecs; forwarded.
        unsafe {
            post_recv(
                ep,
                &iovs(m.msg_iov, m.iov_count),
                m.addr,
                kind,
                m.context,
                Some(flags),
            )
        }
    })
}

unsafe extern "C" fn tsend(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: fi_addr_t,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    let kind = Kind::Tagged { tag, ignore: 0 };
    let one = [(buf as *mut u8, len)];
    // SAFETY: forwarded.
    guard(|| unsafe { post_send(ep, &one, dest, kind, ctx, None) })
}

unsafe extern "C" fn tsendv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    let kind = Kind::Tagged { tag, ignore: 0 };
    // SAFETY: the caller's iovecs; forwarded.
    guard(|| unsafe { post_send(ep, &iovs(iov, count), dest, kind, ctx, None) })
}

unsafe extern "C" fn tsendmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    guard(|| {
        // SAFETY: the caller's message description.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return err(FI_EINVAL);
        };
        let kind = Kind::Tagged {
            tag: m.tag,
            ignore: 0,
        };
        // SAFETY: the message's iovecs; forwarded.
        unsafe {
            post_send(
                ep,
                &iovs(m.msg_iov, m.iov_count),
                m.addr,
                kind,
                m.context,
                Some(flags),
            )
        }
    })
}

unsafe extern "C" fn tinject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
    tag: u64,
) -> isize {
    // SAFETY: forwarded.
    guard(|| unsafe { post_inject(ep, buf, len, dest, Kind::Tagged { tag, ignore: 0 }) })
}

// ------------------------------------------------------------------ untagged (FI_MSG)

unsafe extern "C" fn mrecv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: fi_addr_t,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: forwarded.
    guard(|| unsafe { post_recv(ep, &[(buf as *mut u8, len)], src, Kind::Untagged, ctx, None) })
}

unsafe extern "C" fn mrecvv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller's iovecs; forwarded.
    guard(|| unsafe { post_recv(ep, &iovs(iov, count), src, Kind::Untagged, ctx, None) })
}

unsafe extern "C" fn mrecvmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    guard(|| {
        // SAFETY: the caller's message description.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return err(FI_EINVAL);
        };
        let v = iovs(m.msg_iov, m.iov_count);
        // SAFETY: the message's iovecs; forwarded.
        unsafe { post_recv(ep, &v, m.addr, Kind::Untagged, m.context, Some(flags)) }
    })
}

unsafe extern "C" fn msend(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: fi_addr_t,
    ctx: *mut c_void,
) -> isize {
    let one = [(buf as *mut u8, len)];
    // SAFETY: forwarded.
    guard(|| unsafe { post_send(ep, &one, dest, Kind::Untagged, ctx, None) })
}

unsafe extern "C" fn msendv(
    ep: *mut fid_ep,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: the caller's iovecs; forwarded.
    guard(|| unsafe { post_send(ep, &iovs(iov, count), dest, Kind::Untagged, ctx, None) })
}

unsafe extern "C" fn msendmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    guard(|| {
        // SAFETY: the caller's message description.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return err(FI_EINVAL);
        };
        let v = iovs(m.msg_iov, m.iov_count);
        // SAFETY: the message's iovecs; forwarded.
        unsafe { post_send(ep, &v, m.addr, Kind::Untagged, m.context, Some(flags)) }
    })
}

unsafe extern "C" fn minject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
) -> isize {
    // SAFETY: forwarded.
    guard(|| unsafe { post_inject(ep, buf, len, dest, Kind::Untagged) })
}
