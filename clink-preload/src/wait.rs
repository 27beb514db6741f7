//! poll, select and epoll over sets that hold followed connections. A connection whose
//! reader reached the ring is readable when the ring holds bytes (its kernel socket then
//! carries only wake-ups); one whose writer switched is writable when the ring has room.
//! The wrappers look at the kernel and the rings without waiting, spin on the rings for a
//! bounded time, then raise the connections' sleep flags and wait in the kernel, where a
//! peer's wake-up byte ends the sleep like any other event.

use crate::conn::{enter_sleep, leave_sleep, Conn};
use crate::sys::{errno, now_ns, set_errno};
use crate::{real, table};
use clink_proto::sockets::READER_ON_WAKE_SOCKET;
use libc::{c_int, pollfd, sigset_t};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Ring checks between two looks at the kernel while spinning.
const SPINS_PER_LOOK: u32 = 256;

/// A poll or epoll wait's spin, for the process's spin gate (`crate::spin`): whether it
/// spun, and whether its spin ran out.
#[derive(Default)]
struct SpinTrack {
    spun: bool,
    out: bool,
}

impl SpinTrack {
    /// Whether to spin on (`start`: when the wait began; `spin`: its spin time): until
    /// the spin time has passed, then never again in this wait (a miss, counted once).
    fn on(&mut self, start: u64, spin: u64) -> bool {
        if self.out {
            return false;
        }
        let now = now_ns();
        if now - start < spin {
            self.spun = true;
            return true;
        }
        self.out = true;
        if spin > 0 {
            crate::spin::miss(now);
        }
        false
    }

    /// The wait found something ready: a hit if it came while spinning.
    fn ready(&self) {
        if self.spun && !self.out {
            crate::spin::hit();
        }
    }
}

fn remaining(deadline: Option<u64>) -> c_int {
    match deadline {
        Some(d) => (d.saturating_sub(now_ns()).div_ceil(1_000_000)).min(c_int::MAX as u64) as c_int,
        None => -1,
    }
}

fn ms_to_ts(ms: c_int) -> Option<libc::timespec> {
    (ms >= 0).then(|| libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) as i64) * 1_000_000,
    })
}

/// Converts a timespec timeout to milliseconds (rounded up); -1 for none.
pub fn ts_to_ms(ts: *const libc::timespec) -> c_int {
    if ts.is_null() {
        return -1;
    }
    // SAFETY: the caller passed a valid timespec.
    let t = unsafe { *ts };
    (t.tv_sec * 1000 + (t.tv_nsec + 999_999) / 1_000_000).clamp(0, c_int::MAX as i64) as c_int
}

fn fix_poll(
    fds: &mut [pollfd],
    conns: &[(usize, Arc<Conn>)],
    nested: &[(usize, Vec<Inner>)],
) -> c_int {
    for (i, c) in conns {
        let p = &mut fds[*i];
        if let Some(v) = c.fix_readiness(p.fd, p.events, p.revents) {
            p.revents = v;
        }
    }
    for (i, inner) in nested {
        let p = &mut fds[*i];
        if p.events & libc::POLLIN != 0 && inner_ready(inner) {
            p.revents |= libc::POLLIN;
        }
    }
    fds.iter().filter(|p| p.revents != 0).count() as c_int
}

/// poll / ppoll over `fds`, with the signal mask of ppoll if given.
pub fn poll(fds: &mut [pollfd], timeout_ms: c_int, mask: *const sigset_t) -> c_int {
    let conns: Vec<(usize, Arc<Conn>)> = fds
        .iter()
        .enumerate()
        .filter_map(|(i, p)| table::get(p.fd).map(|c| (i, c)))
        .collect();
    let n = fds.len() as libc::nfds_t;
    let nested: Vec<(usize, Vec<Inner>)> = fds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.events & libc::POLLIN != 0)
        .filter_map(|(i, p)| nested_in_poll(p.fd).map(|v| (i, v)))
        .collect();
    if conns.is_empty() && nested.is_empty() {
        return kernel_poll(fds, n, timeout_ms, mask);
    }
    let events: Vec<i16> = fds.iter().map(|p| p.events).collect();
    let own = || conns.iter().map(|(i, c)| (c.as_ref(), events[*i]));
    let inner = || nested.iter().map(|(_, v)| v.as_slice());
    for (i, c) in &conns {
        c.progress(fds[*i].fd, false);
        c.switch_if_ready(fds[*i].fd);
    }
    let start = now_ns();
    let deadline = (timeout_ms >= 0).then(|| start + timeout_ms as u64 * 1_000_000);
    let spin = crate::spin::budget(start);
    // Without a spin, sleep at once: the kernel's wait returns at once for whatever is
    // ready there, and the armed flags catch the rings (one system call, as without us).
    let mut look = spin > 0 || timeout_ms == 0;
    let mut spinning = SpinTrack::default();
    loop {
        if look {
            // SAFETY: `fds` is the caller's pollfd array.
            let r = unsafe { real::poll(fds.as_mut_ptr(), n, 0) };
            if r < 0 {
                return r;
            }
            let ready = fix_poll(fds, &conns, &nested);
            if ready > 0 || timeout_ms == 0 {
                spinning.ready();
                return ready;
            }
            if spinning.on(start, spin) {
                let mut k = 0;
                while k < SPINS_PER_LOOK
                    && !conns
                        .iter()
                        .any(|(i, c)| c.ready_without_kernel(fds[*i].events))
                    && !nested.iter().any(|(_, inner)| inner_ready(inner))
                {
                    std::hint::spin_loop();
                    k += 1;
                }
                continue;
            }
        }
        look = true;
        let wakes: Vec<Option<c_int>> = conns
            .iter()
            .map(|(i, c)| c.wake_fd_for(events[*i]))
            .collect();
        if !arm_all(flagged(own(), &wakes, inner())) {
            continue;
        }
        let r = sleep_poll(fds, n, &conns, &wakes, remaining(deadline), mask);
        let e = errno();
        for (c, _, _) in flagged(own(), &wakes, inner()) {
            c.disarm();
        }
        if r < 0 {
            set_errno(e);
            return r;
        }
        let ready = fix_poll(fds, &conns, &nested);
        if ready > 0 {
            return ready;
        }
        if deadline.is_some_and(|d| now_ns() >= d) {
            return 0;
        }
    }
}

/// The kernel part of a sleep in poll: writers facing a full ring wait for a wake-up
/// byte instead of POLLOUT (see `Conn::room_events`), and the wake sockets `wakes` (one
/// per connection or none) are polled after the caller's descriptors.
fn sleep_poll(
    fds: &mut [pollfd],
    n: libc::nfds_t,
    conns: &[(usize, Arc<Conn>)],
    wakes: &[Option<c_int>],
    timeout_ms: c_int,
    mask: *const sigset_t,
) -> c_int {
    let mut changed = Vec::new();
    let mut t = timeout_ms;
    for (i, c) in conns {
        if let Some((ev, short)) = c.room_events(fds[*i].events) {
            changed.push((*i, fds[*i].events));
            fds[*i].events = ev;
            if short && !(0..=1).contains(&t) {
                t = 1;
            }
        }
    }
    let t = enter_sleep(t);
    let (r, e) = if wakes.iter().all(Option::is_none) {
        (kernel_poll(fds, n, t, mask), errno())
    } else {
        let mut all: Vec<pollfd> = fds.to_vec();
        all.extend(wakes.iter().flatten().map(|&w| pollfd {
            fd: w,
            events: libc::POLLIN,
            revents: 0,
        }));
        let k = all.len() as libc::nfds_t;
        let r = kernel_poll(&mut all, k, t, mask);
        let e = errno();
        for (mine, p) in fds.iter_mut().zip(&all) {
            mine.revents = p.revents;
        }
        for p in &all[fds.len()..] {
            if p.revents != 0 {
                crate::conn::drain_wake(p.fd);
            }
        }
        // What the caller's descriptors report (the rings are looked at after).
        let r = if r > 0 {
            fds.iter().filter(|p| p.revents != 0).count() as c_int
        } else {
            r
        };
        (r, e)
    };
    leave_sleep();
    for (i, ev) in changed {
        fds[i].events = ev;
        fds[i].revents &=
            ev | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL | libc::POLLIN | libc::POLLRDHUP;
    }
    set_errno(e);
    r
}

/// A sleep's connections with their events and sleep flags: `READER_ON_WAKE_SOCKET` for
/// the set's own connections whose wake socket the sleep waits on (`wakes`, see
/// `conn/wake.rs`), 1 for the others and for those of the nested epoll sets `inner`.
fn flagged<'c: 'w, 'w>(
    own: impl Iterator<Item = (&'c Conn, i16)> + Clone + 'w,
    wakes: &'w [Option<c_int>],
    inner: impl Iterator<Item = &'c [Inner]> + Clone + 'w,
) -> impl Iterator<Item = (&'c Conn, i16, u32)> + Clone + 'w {
    own.zip(wakes)
        .map(|((c, ev), w)| {
            (
                c,
                ev,
                if w.is_some() {
                    READER_ON_WAKE_SOCKET
                } else {
                    1
                },
            )
        })
        .chain(inner.flat_map(|v| v.iter().map(|(_, ev, c)| (c.as_ref(), *ev, 1))))
}

/// Raises the sleep flags of every connection, each reader's to its value (see
/// [`Conn::arm_as`]); false (all lowered) if one is ready.
fn arm_all<'a>(conns: impl Iterator<Item = (&'a Conn, i16, u32)> + Clone) -> bool {
    for (c, ev, flag) in conns.clone() {
        if !c.arm_as(ev, flag) {
            for (c, _, _) in conns {
                c.disarm();
            }
            return false;
        }
    }
    true
}

fn kernel_poll(
    fds: &mut [pollfd],
    n: libc::nfds_t,
    timeout_ms: c_int,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: `fds` is the caller's pollfd array; `mask` is the caller's or null.
    unsafe {
        if mask.is_null() {
            real::poll(fds.as_mut_ptr(), n, timeout_ms)
        } else {
            let ts = ms_to_ts(timeout_ms);
            real::ppoll(
                fds.as_mut_ptr(),
                n,
                ts.as_ref().map_or(std::ptr::null(), |t| t as *const _),
                mask,
            )
        }
    }
}

/// Whether any descriptor below `nfds` in the sets is a followed connection.
fn sets_have_conns(nfds: c_int, sets: &[*mut libc::fd_set]) -> bool {
    (0..nfds.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
        // SAFETY: the sets are the caller's fd_sets (or null), `fd` below FD_SETSIZE.
        sets.iter()
            .any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) })
            && table::get(fd).is_some()
    })
}

/// select / pselect through [`poll`] when a set holds a followed connection; `None` when
/// the kernel's select should answer.
pub fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout_ms: c_int,
    mask: *const sigset_t,
) -> Option<c_int> {
    if !sets_have_conns(nfds, &[r, w, e]) {
        return None;
    }
    let mut fds = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0;
        // SAFETY: the caller's fd_sets (or null), `fd` below FD_SETSIZE.
        unsafe {
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                ev |= libc::POLLOUT;
            }
            if !e.is_null() && libc::FD_ISSET(fd, e) {
                ev |= libc::POLLPRI;
            }
        }
        if ev != 0 {
            fds.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let n = poll(&mut fds, timeout_ms, mask);
    if n < 0 {
        return Some(n);
    }
    if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        set_errno(libc::EBADF);
        return Some(-1);
    }
    let mut count = 0;
    // SAFETY: rewriting the caller's fd_sets with the descriptors found ready.
    unsafe {
        for s in [r, w, e] {
            if !s.is_null() {
                libc::FD_ZERO(s);
            }
        }
        for p in &fds {
            let rv = p.revents;
            if !r.is_null()
                && p.events & libc::POLLIN != 0
                && rv & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            {
                libc::FD_SET(p.fd, r);
                count += 1;
            }
            if !w.is_null()
                && p.events & libc::POLLOUT != 0
                && rv & (libc::POLLOUT | libc::POLLERR) != 0
            {
                libc::FD_SET(p.fd, w);
                count += 1;
            }
            if !e.is_null() && p.events & libc::POLLPRI != 0 && rv & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, e);
                count += 1;
            }
        }
    }
    Some(count)
}

#[derive(Clone, Copy)]
struct Reg {
    events: u32,
    data: u64,
    disabled: bool,
}

/// One epoll set's registrations, with the list of its followed members cached against
/// the table's generation (epoll_wait runs far more often than anything changes).
struct Set {
    /// This set's number, unique in the process (an epoll descriptor's number is reused
    /// once closed; connections remember the sets their wake sockets are in by this).
    id: u64,
    regs: HashMap<c_int, Reg>,
    cache: Option<(u64, Arc<Vec<Member>>)>,
}

impl Default for Set {
    fn default() -> Set {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Set {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            regs: HashMap::new(),
            cache: None,
        }
    }
}

/// The data of a connection's wake socket's registration in an application's epoll set,
/// the socket's descriptor in the low 32 bits. The high bits are those of no canonical
/// x86-64 address and of no small number, so no pointer or descriptor an application
/// registers as its data can equal it; `fix_epoll` takes these events out.
const WAKE_MARK: u64 = 0xc11c_5e70_0000_0000;
const WAKE_MASK: u64 = 0xffff_ffff_0000_0000;

/// Before a sleep in epoll set `epfd`: puts the wake socket of every member that waits
/// for ring data into the set (once; it stays), and gives each member's wake socket if it
/// is there (its reader's flag then tells writers a datagram wakes it).
fn register_wakes(epfd: c_int, members: &[Member]) -> Vec<Option<c_int>> {
    let id = regs()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&epfd)
        .map(|s| s.id);
    members
        .iter()
        .map(|(_, r, c)| {
            if r.disabled {
                return None;
            }
            let (id, w) = (id?, c.wake_fd_for((r.events & 0xffff) as i16)?);
            if c.wake_in_set(id) {
                return Some(w);
            }
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: WAKE_MARK | w as u32 as u64,
            };
            // SAFETY: adding our own socket to the caller's epoll set with our own event.
            let ok = unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, w, &mut ev) } == 0
                || errno() == libc::EEXIST;
            ok.then(|| {
                c.note_wake_set(id);
                w
            })
        })
        .collect()
}

/// Takes connection `c`'s wake socket out of epoll set `epfd` (numbered `id`), when
/// the application takes the connection out or closes it.
fn unregister_wake(epfd: c_int, id: u64, c: &Conn) {
    if let Some(w) = c.forget_wake_set(id) {
        // SAFETY: removing our own socket from the caller's epoll set.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, w, std::ptr::null_mut()) };
    }
}

fn regs() -> &'static Mutex<HashMap<c_int, Set>> {
    static R: OnceLock<Mutex<HashMap<c_int, Set>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Descriptors that are, or are members of, an epoll set: `forget` (every close) looks no
/// further for the others.
static REGISTERED: crate::fdbits::FdBits = crate::fdbits::FdBits::new();

/// Whether `fd` is (or, with `set`, was before it is set to that) registered; true beyond
/// the bitmap, where every descriptor is looked for.
fn registered(fd: c_int, set: Option<bool>) -> bool {
    match set {
        Some(on) => REGISTERED.set(fd, on),
        None => REGISTERED.get(fd),
    }
    .unwrap_or(true)
}

/// Set once an epoll set has been put inside another (only then do waits look for nested
/// sets).
static ANY_NESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes a successful epoll_ctl.
pub fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *const libc::epoll_event) {
    let mut m = regs().lock().unwrap_or_else(|e| e.into_inner());
    if op == libc::EPOLL_CTL_ADD
        && (m.contains_key(&fd) || m.values().any(|set| set.regs.contains_key(&epfd)))
    {
        ANY_NESTED.store(true, std::sync::atomic::Ordering::Release);
    }
    match op {
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD if !ev.is_null() => {
            // SAFETY: the caller's event, which the kernel just accepted.
            let e = unsafe { std::ptr::read_unaligned(ev) };
            registered(fd, Some(true));
            registered(epfd, Some(true));
            let set = m.entry(epfd).or_default();
            set.regs.insert(
                fd,
                Reg {
                    events: e.events,
                    data: e.u64,
                    disabled: false,
                },
            );
            set.cache = None;
        }
        libc::EPOLL_CTL_DEL => {
            if let Some(set) = m.get_mut(&epfd) {
                set.regs.remove(&fd);
                set.cache = None;
                let id = set.id;
                drop(m);
                if let Some(c) = table::get(fd) {
                    unregister_wake(epfd, id, &c);
                }
            }
        }
        _ => {}
    }
}

/// Forgets `fd` (closed, or replaced by `dup2`; `conn` the connection it named, if any)
/// as a member of epoll sets and as an epoll set.
pub fn forget(fd: c_int, conn: Option<&Conn>) {
    if !registered(fd, None) {
        return;
    }
    registered(fd, Some(false));
    let mut m = regs().lock().unwrap_or_else(|e| e.into_inner());
    m.remove(&fd);
    let mut left = Vec::new();
    for (&epfd, set) in m.iter_mut() {
        if set.regs.remove(&fd).is_some() {
            set.cache = None;
            left.push((epfd, set.id));
        }
    }
    drop(m);
    if let Some(c) = conn {
        for (epfd, id) in left {
            unregister_wake(epfd, id, c);
        }
    }
}

type Member = (c_int, Reg, Arc<Conn>);

fn members(epfd: c_int) -> Arc<Vec<Member>> {
    let mut m = regs().lock().unwrap_or_else(|e| e.into_inner());
    let Some(set) = m.get_mut(&epfd) else {
        return Arc::new(Vec::new());
    };
    let generation = table::generation();
    if let Some((g, list)) = &set.cache {
        if *g == generation {
            return list.clone();
        }
    }
    let conns = table::get_many(set.regs.keys().copied());
    let list: Arc<Vec<Member>> = Arc::new(
        conns
            .into_iter()
            .filter_map(|(fd, c)| set.regs.get(&fd).map(|r| (fd, *r, c)))
            .collect(),
    );
    set.cache = Some((generation, list.clone()));
    list
}

fn disable(epfd: c_int, fd: c_int) {
    let mut m = regs().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(set) = m.get_mut(&epfd) {
        if let Some(r) = set.regs.get_mut(&fd) {
            r.disabled = true;
            set.cache = None;
        }
    }
}

/// A followed connection inside an epoll set, with the events it is registered for.
type Inner = (c_int, i16, Arc<Conn>);

/// The followed connections of epoll set `epfd` and of the sets inside it (an epoll set
/// can be a member of another, or of a poll set): their ring readiness reaches the outer
/// wait only through the inner set, so the outer wait arms them and reports the inner set
/// readable when one of them is.
fn inner_conns(epfd: c_int, depth: u32) -> Vec<Inner> {
    if depth > 4 {
        return Vec::new();
    }
    let mut out: Vec<Inner> = members(epfd)
        .iter()
        .filter(|(_, r, _)| !r.disabled)
        .map(|(fd, r, c)| (*fd, (r.events & 0xffff) as i16, c.clone()))
        .collect();
    for (inner, _) in nested_sets(epfd) {
        out.extend(inner_conns(inner, depth + 1));
    }
    out
}

/// The registrations of `epfd` that are themselves epoll sets this process knows.
fn nested_sets(epfd: c_int) -> Vec<(c_int, Reg)> {
    if !ANY_NESTED.load(std::sync::atomic::Ordering::Acquire) {
        return Vec::new();
    }
    let m = regs().lock().unwrap_or_else(|e| e.into_inner());
    match m.get(&epfd) {
        Some(set) => set
            .regs
            .iter()
            .filter(|(fd, _)| m.contains_key(fd))
            .map(|(fd, r)| (*fd, *r))
            .collect(),
        None => Vec::new(),
    }
}

/// Whether a connection inside a nested set is readable or writable from its ring.
fn inner_ready(inner: &[Inner]) -> bool {
    inner.iter().any(|(_, ev, c)| c.ready_without_kernel(*ev))
}

/// Whether `fd` is an epoll set with followed connections inside (for poll).
fn nested_in_poll(fd: c_int) -> Option<Vec<Inner>> {
    if !ANY_NESTED.load(std::sync::atomic::Ordering::Acquire) && !registered(fd, None) {
        return None;
    }
    if !registered(fd, None)
        || !regs()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&fd)
    {
        return None;
    }
    let inner = inner_conns(fd, 1);
    (!inner.is_empty()).then_some(inner)
}

fn fix_epoll(
    epfd: c_int,
    evs: &mut [libc::epoll_event],
    n: usize,
    members: &[Member],
    nested: &[(Reg, Vec<Inner>)],
) -> usize {
    let mut out: Vec<libc::epoll_event> = Vec::with_capacity(n + members.len());
    let mut reported = vec![false; members.len()];
    for ev in &evs[..n] {
        let (events, data) = (ev.events, ev.u64);
        if data & WAKE_MASK == WAKE_MARK {
            // A wake socket: its connection's ring is looked at below.
            crate::conn::drain_wake(data as u32 as c_int);
            continue;
        }
        match members.iter().position(|(_, r, _)| r.data == data) {
            Some(k) => {
                let (fd, r, c) = &members[k];
                reported[k] = true;
                match c.fix_readiness(*fd, (r.events & 0xffff) as i16, (events & 0xffff) as i16) {
                    Some(v) if v != 0 => out.push(libc::epoll_event {
                        events: v as u16 as u32,
                        u64: data,
                    }),
                    Some(_) => {}
                    None => out.push(libc::epoll_event { events, u64: data }),
                }
            }
            None => out.push(libc::epoll_event { events, u64: data }),
        }
    }
    for (k, (fd, r, c)) in members.iter().enumerate() {
        if reported[k] || r.disabled || out.len() >= evs.len() {
            continue;
        }
        if let Some(v) = c.fix_readiness(*fd, (r.events & 0xffff) as i16, 0) {
            if v != 0 {
                out.push(libc::epoll_event {
                    events: v as u16 as u32,
                    u64: r.data,
                });
                if r.events & libc::EPOLLONESHOT as u32 != 0 {
                    disable(epfd, *fd);
                }
            }
        }
    }
    for (r, inner) in nested {
        if out.len() < evs.len()
            && !out.iter().any(|e| e.u64 == r.data)
            && r.events & libc::EPOLLIN as u32 != 0
            && inner_ready(inner)
        {
            out.push(libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: r.data,
            });
        }
    }
    let k = out.len().min(evs.len());
    evs[..k].copy_from_slice(&out[..k]);
    k
}

/// The kernel part of a sleep in epoll: registrations of writers facing a full ring wait
/// for a wake-up byte instead of EPOLLOUT for the time of the sleep.
fn sleep_epoll(
    epfd: c_int,
    evs: &mut [libc::epoll_event],
    members: &[Member],
    timeout_ms: c_int,
    mask: *const sigset_t,
) -> c_int {
    let mut changed = Vec::new();
    let mut t = timeout_ms;
    for (fd, r, c) in members {
        if let Some((ev, short)) = c.room_events((r.events & 0xffff) as i16) {
            let mut e = libc::epoll_event {
                events: (r.events & !0xffff) | ev as u16 as u32,
                u64: r.data,
            };
            // SAFETY: modifying a registration the caller made, with its own data.
            if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, *fd, &mut e) } == 0 {
                changed.push((*fd, *r));
            }
            if short && !(0..=1).contains(&t) {
                t = 1;
            }
        }
    }
    let t = enter_sleep(t);
    // SAFETY: the caller's epoll set, event array and signal mask (or null).
    let r = unsafe { real::epoll_pwait(epfd, evs.as_mut_ptr(), evs.len() as c_int, t, mask) };
    let e = errno();
    leave_sleep();
    for (fd, reg) in changed {
        let mut ev = libc::epoll_event {
            events: reg.events,
            u64: reg.data,
        };
        // SAFETY: restoring the caller's registration.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) };
    }
    set_errno(e);
    r
}

/// epoll_wait / epoll_pwait when the set holds followed connections; `None` when the
/// kernel's epoll_wait should answer.
pub fn epoll_wait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout_ms: c_int,
    mask: *const sigset_t,
) -> Option<c_int> {
    if max <= 0 || evs.is_null() {
        return None;
    }
    let members = members(epfd);
    let nested: Vec<(Reg, Vec<Inner>)> = nested_sets(epfd)
        .into_iter()
        .map(|(fd, r)| (r, inner_conns(fd, 1)))
        .filter(|(_, inner)| !inner.is_empty())
        .collect();
    if nested.is_empty() && (members.is_empty() || members.iter().all(|(_, _, c)| c.left())) {
        return None;
    }
    let own = || {
        members
            .iter()
            .map(|(_, r, c)| (c.as_ref(), (r.events & 0xffff) as i16))
    };
    let inner = || nested.iter().map(|(_, v)| v.as_slice());
    // SAFETY: the caller's array of `max` events.
    let evs = unsafe { std::slice::from_raw_parts_mut(evs, max as usize) };
    for (fd, _, c) in members.iter() {
        c.progress(*fd, false);
        c.switch_if_ready(*fd);
    }
    let start = now_ns();
    let deadline = (timeout_ms >= 0).then(|| start + timeout_ms as u64 * 1_000_000);
    let spin = crate::spin::budget(start);
    let mut look = spin > 0 || timeout_ms == 0;
    let mut spinning = SpinTrack::default();
    loop {
        if look {
            // SAFETY: the caller's epoll set and event array.
            let r = unsafe { real::epoll_wait(epfd, evs.as_mut_ptr(), max, 0) };
            if r < 0 {
                return Some(r);
            }
            let ready = fix_epoll(epfd, evs, r as usize, &members, &nested);
            if ready > 0 || timeout_ms == 0 {
                spinning.ready();
                return Some(ready as c_int);
            }
            if spinning.on(start, spin) {
                let mut k = 0;
                while k < SPINS_PER_LOOK
                    && !members.iter().any(|(_, r, c)| {
                        !r.disabled && c.ready_without_kernel((r.events & 0xffff) as i16)
                    })
                    && !nested.iter().any(|(_, inner)| inner_ready(inner))
                {
                    std::hint::spin_loop();
                    k += 1;
                }
                continue;
            }
        }
        look = true;
        let wakes = register_wakes(epfd, &members);
        if !arm_all(flagged(own(), &wakes, inner())) {
            continue;
        }
        let r = sleep_epoll(epfd, evs, &members, remaining(deadline), mask);
        let e = errno();
        for (c, _, _) in flagged(own(), &wakes, inner()) {
            c.disarm();
        }
        if r < 0 {
            set_errno(e);
            return Some(r);
        }
        let ready = fix_epoll(epfd, evs, r as usize, &members, &nested);
        if ready > 0 {
            return Some(ready as c_int);
        }
        if deadline.is_some_and(|d| now_ns() >= d) {
            return Some(0);
        }
    }
}
