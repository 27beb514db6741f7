//! CPU cost of one 8-byte hop through the provider, without the cross-core transfer: two
//! endpoints on one host (shared memory), each in a domain of its own with the threading
//! Open MPI asks for (`FI_THREAD_DOMAIN`), driven alternately by one thread
//! through the provider's libfabric tables, as a libfabric program (or Open MPI's `mtl
//! ofi`) drives them: a tagged receive posted, the send, and completion-queue reads until
//! the receive's completion. Three ways of sending: `fi_tinject` (no completion: what Open
//! MPI uses for small messages), `fi_tsend` with its completion read, and `fi_tsend` with
//! the receive posted after the message arrived (an unexpected message). Beside them, the
//! same hop over clink's own API in the same process (a blocking `send` and `recv`), so the
//! difference is what the provider adds.
//!
//! Run: `cargo run --release -p clink-fi --example provider_cost -- [hops] [inject|send|unexpected|own|idle]`

use clink_fi::abi::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn check(r: i32, what: &str) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed with {r}"))
    }
}

/// Two endpoints, each with its own completion queue, and each one's address for the
/// other.
struct Pair {
    eps: [*mut fid_ep; 2],
    cqs: [*mut fid_cq; 2],
    addrs: [u64; 2],
}

/// Opens the provider's objects: a domain per endpoint (with `FI_THREAD_DOMAIN`, the model
/// Open MPI asks for, a domain's objects are driven by one thread at a time, and making
/// the connection needs both endpoints driven at once), each with its completion queue
/// and an address vector holding both names.
unsafe fn open() -> Result<Pair, String> {
    // SAFETY: the provider's entry points called as libfabric calls them, with objects it
    // returned; every pointer passed is live for the call.
    unsafe {
        let prov = &*clink_fi::fi_prov_ini();
        let mut info: *mut fi_info = null_mut();
        let v = fi_version(1, 17);
        check(
            (prov.getinfo)(v, null(), null(), 0, null(), &mut info),
            "getinfo",
        )?;
        if (*(*info).domain_attr).threading != FI_THREAD_DOMAIN {
            return Err("the provider's default is not FI_THREAD_DOMAIN".into());
        }
        let mut fabric: *mut fid_fabric = null_mut();
        check(
            (prov.fabric)((*info).fabric_attr, &mut fabric, null_mut()),
            "fabric",
        )?;
        let mut eps = [null_mut(); 2];
        let mut cqs = [null_mut(); 2];
        let mut avs = [null_mut(); 2];
        let mut names = Vec::new();
        for i in 0..2 {
            let mut domain: *mut fid_domain = null_mut();
            let dops = |f: *mut fid_fabric| &*(*f).ops;
            check(
                (dops(fabric).domain)(fabric, info, &mut domain, null_mut()),
                "domain",
            )?;
            let ops = &*(*domain).ops;
            let mut cq_attr: fi_cq_attr = std::mem::zeroed();
            cq_attr.format = FI_CQ_FORMAT_TAGGED;
            check(
                (ops.cq_open)(domain, &mut cq_attr, &mut cqs[i], null_mut()),
                "cq_open",
            )?;
            let mut av_attr: fi_av_attr = std::mem::zeroed();
            av_attr.type_ = FI_AV_TABLE;
            check(
                (ops.av_open)(domain, &mut av_attr, &mut avs[i], null_mut()),
                "av_open",
            )?;
            check(
                (ops.endpoint)(domain, info, &mut eps[i], null_mut()),
                "endpoint",
            )?;
            let f = &mut (*eps[i]).fid;
            check(((*f.ops).bind)(f, &mut (*avs[i]).fid, 0), "bind av")?;
            let cq = &mut (*cqs[i]).fid;
            check(((*f.ops).bind)(f, cq, FI_TRANSMIT | FI_RECV), "bind cq")?;
            check(((*f.ops).control)(f, FI_ENABLE, null_mut()), "enable")?;
            let mut name = [0u8; 64];
            let mut len = name.len();
            let r = ((*(*eps[i]).cm).getname)(f, name.as_mut_ptr() as *mut c_void, &mut len);
            check(r, "getname")?;
            names.extend_from_slice(&name[..len]);
        }
        let mut addrs = [[0u64; 2]; 2];
        let blob = names.as_ptr() as *const c_void;
        for (av, a) in avs.iter().zip(&mut addrs) {
            let r = ((*(**av).ops).insert)(*av, blob, 2, a.as_mut_ptr(), 0, null_mut());
            if r != 2 {
                return Err(format!("av insert: {r}"));
            }
        }
        if addrs[0] != addrs[1] {
            return Err("the two vectors numbered the names differently".into());
        }
        Ok(Pair {
            eps,
            cqs,
            addrs: addrs[0],
        })
    }
}

/// Reads `cq` until one completion comes; an error entry or another answer is an error.
unsafe fn completion(cq: *mut fid_cq) -> Result<fi_cq_tagged_entry, String> {
    // SAFETY: an open queue; room for one entry.
    unsafe {
        let mut e: fi_cq_tagged_entry = std::mem::zeroed();
        loop {
            match ((*(*cq).ops).read)(cq, &mut e as *mut _ as *mut c_void, 1) {
                1 => return Ok(e),
                r if r == -(FI_EAGAIN as isize) => {}
                r => return Err(format!("cq read: {r}")),
            }
        }
    }
}

/// An endpoint and its queue, for the thread that drives them while the pair connects.
struct Side(*mut fid_ep, *mut fid_cq);
// SAFETY: each side's objects (a domain of their own) are used by one thread at a time.
unsafe impl Send for Side {}

/// Connects the pair: one message each way, each side driven by a thread of its own
/// (the connecting endpoint waits for the other's progress), which injects its message
/// (retried while the connection is not there) and reads its queue until both are sent.
unsafe fn connect(p: &Pair) -> Result<(), String> {
    let sent = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let sides: Vec<_> = (0..2)
            .map(|i| {
                let side = Side(p.eps[i], p.cqs[i]);
                let (to, sent) = (p.addrs[1 - i], &sent);
                s.spawn(move || -> Result<(), String> {
                    let side = side;
                    let (ep, cq) = (side.0, side.1);
                    let msg = [0u8; 8];
                    // SAFETY: a plain C struct, all zeroes a valid value.
                    let mut e: fi_cq_tagged_entry = unsafe { std::mem::zeroed() };
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let mut done = false;
                    while sent.load(Ordering::Acquire) < 2 {
                        if !done {
                            // SAFETY: an open endpoint; the inject copies the 8 bytes.
                            let r = unsafe {
                                let t = &*(*ep).tagged;
                                (t.inject)(ep, msg.as_ptr() as *const c_void, 8, to, 1)
                            };
                            match r {
                                0 => {
                                    done = true;
                                    sent.fetch_add(1, Ordering::Release);
                                }
                                r if r == -(FI_EAGAIN as isize) => {}
                                r => return Err(format!("inject: {r}")),
                            }
                        }
                        if Instant::now() > deadline {
                            return Err("never connected".into());
                        }
                        // SAFETY: an open queue, room for one entry.
                        unsafe { ((*(*cq).ops).read)(cq, &mut e as *mut _ as *mut c_void, 1) };
                        std::thread::yield_now();
                    }
                    Ok(())
                })
            })
            .collect();
        sides
            .into_iter()
            .try_for_each(|h| h.join().expect("a connecting thread"))
    })?;
    // The two connecting messages, received (unexpected) now that one thread drives both.
    for (at, from) in [(1, 0), (0, 1)] {
        let mut buf = [0u8; 8];
        let ep = p.eps[at];
        // SAFETY: an open endpoint; `buf` outlives the completion read below.
        unsafe {
            let t = &*(*ep).tagged;
            let b = buf.as_mut_ptr() as *mut c_void;
            let r = (t.recv)(ep, b, 8, null_mut(), p.addrs[from], 1, 0, null_mut());
            check(r as i32, "connecting recv")?;
            completion(p.cqs[at])?;
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Inject,
    Send,
    Unexpected,
}

/// `n` hops of 8 bytes, alternately each way; ns per hop.
unsafe fn hops(p: &Pair, n: u64, way: Way) -> Result<f64, String> {
    let mut buf = [[0u8; 8]; 2];
    let t = Instant::now();
    for i in 0..n {
        let (from, to) = ((i & 1) as usize, 1 - (i & 1) as usize);
        let (src, dst) = (p.eps[from], p.eps[to]);
        // SAFETY: open endpoints and queues; each receive's buffer outlives its completion,
        // read before the next hop; a sent buffer is not touched before its completion.
        unsafe {
            let rb = buf[to].as_mut_ptr() as *mut c_void;
            let post = || {
                let t = &*(*dst).tagged;
                check(
                    (t.recv)(dst, rb, 8, null_mut(), p.addrs[from], 5, 0, null_mut()) as i32,
                    "trecv",
                )
            };
            if way != Way::Unexpected {
                post()?;
            }
            let sb = buf[from].as_ptr() as *const c_void;
            let t = &*(*src).tagged;
            if way == Way::Inject {
                check((t.inject)(src, sb, 8, p.addrs[to], 5) as i32, "tinject")?;
            } else {
                let r = (t.send)(src, sb, 8, null_mut(), p.addrs[to], 5, null_mut());
                check(r as i32, "tsend")?;
                completion(p.cqs[from])?;
            }
            if way == Way::Unexpected {
                // The message is in the receiver's ring: a read of its queue takes it in
                // as unexpected before the receive is posted.
                let mut e: fi_cq_tagged_entry = std::mem::zeroed();
                let q = p.cqs[to];
                ((*(*q).ops).read)(q, &mut e as *mut _ as *mut c_void, 1);
                post()?;
            }
            let e = completion(p.cqs[to])?;
            if e.len != 8 || e.tag != 5 {
                return Err(format!("completion of {} bytes, tag {}", e.len, e.tag));
            }
        }
    }
    Ok(t.elapsed().as_nanos() as f64 / n as f64)
}

/// The same hop over clink's own API: a blocking `send` and `recv` between two endpoints.
fn clink_hops(n: u64) -> Result<f64, Box<dyn std::error::Error>> {
    use clink::{Config, Context, Selector};
    let cfg = || Config {
        calibrate: false,
        ..Config::default()
    };
    let ctx_a = Context::with_config(cfg())?;
    let mut a = ctx_a.endpoint()?;
    let addr = a.address();
    let joined = std::thread::spawn(move || -> clink::Result<_> {
        let ctx_b = Context::with_config(cfg())?;
        let mut b = ctx_b.endpoint()?;
        let p = b.connect(&addr)?;
        Ok((ctx_b, b, p))
    });
    let pa = a.accept(Some(Duration::from_secs(10)))?;
    let (_ctx_b, mut b, pb) = joined.join().expect("connecting thread")?;
    let mut buf = [0u8; 8];
    let t = Instant::now();
    for _ in 0..n / 2 {
        a.send(pa, 5, &buf)?;
        b.recv(Selector::exact(Some(pb), 5), &mut buf)?;
        b.send(pb, 5, &buf)?;
        a.recv(Selector::exact(Some(pa), 5), &mut buf)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / (n / 2 * 2) as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(Ok(1_000_000), |s| s.parse())?;
    // SAFETY: the pair's objects are used only through the provider's calls above.
    let p = unsafe { open() }?;
    // SAFETY: the objects `open` made.
    unsafe { connect(&p) }?;
    // One way alone (for a profiler): `inject`, `send`, `unexpected` or `own` (clink's own
    // hop); or `idle`: reads
    // of a completion queue with nothing to complete (what a waiting receiver repeats).
    if std::env::args().nth(2).as_deref() == Some("idle") {
        // SAFETY: a plain C struct, all zeroes a valid value.
        let mut e: fi_cq_tagged_entry = unsafe { std::mem::zeroed() };
        let q = p.cqs[0];
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: an open queue; room for one entry.
            let r = unsafe { ((*(*q).ops).read)(q, &mut e as *mut _ as *mut c_void, 1) };
            if r != -(FI_EAGAIN as isize) {
                return Err(format!("an idle read answered {r}").into());
            }
        }
        println!(
            "ns per idle read: {:.1}",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        return Ok(());
    }
    if let Some(only) = std::env::args().nth(2) {
        if only == "own" {
            println!("ns per hop: own {:.1}", clink_hops(n)?);
            return Ok(());
        }
        let way = match only.as_str() {
            "inject" => Way::Inject,
            "send" => Way::Send,
            "unexpected" => Way::Unexpected,
            _ => return Err(format!("unknown way {only}: inject, send or unexpected").into()),
        };
        // SAFETY: as above.
        let ns = unsafe { hops(&p, n, way) }?;
        println!("ns per hop: {only} {ns:.1}");
        return Ok(());
    }
    for round in 0..3 {
        let own = clink_hops(n)?;
        // SAFETY: as above.
        let (inject, send, unexpected) = unsafe {
            (
                hops(&p, n, Way::Inject)?,
                hops(&p, n, Way::Send)?,
                hops(&p, n, Way::Unexpected)?,
            )
        };
        println!(
            "round {round}: ns per hop: clink send+recv {own:.1}; provider tinject {inject:.1} (+{:.1}), tsend {send:.1} (+{:.1}), unexpected {unexpected:.1} (+{:.1})",
            inject - own,
            send - own,
            unexpected - own
        );
    }
    Ok(())
}
