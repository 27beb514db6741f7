//! The provider driven through its libfabric tables from Rust, in one process (two
//! endpoints of one domain, each with its completion queue read by a thread of its own,
//! since making a connection needs the other endpoint's progress): refused hints, names
//! that do not parse, a buffer too small for a name, truncation, a peek that finds nothing,
//! cancel, and a message checked byte for byte.

use clink_fi::abi::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

struct Setup {
    cqs: [*mut fid_cq; 2],
    av: *mut fid_av,
    eps: [*mut fid_ep; 2],
    addrs: [u64; 2],
}

fn check(r: i32, what: &str) {
    assert_eq!(r, 0, "{what} failed with {r}");
}

/// A fabric, a domain, one completion queue and one address vector shared by two
/// endpoints, each knowing the other.
unsafe fn setup() -> Setup {
    // SAFETY: the provider's entry points called as libfabric calls them, with objects
    // it returned; every pointer passed is live for the call.
    unsafe {
        let prov = &*clink_fi::fi_prov_ini();
        let mut info: *mut fi_info = null_mut();
        check(
            (prov.getinfo)(fi_version(1, 17), null(), null(), 0, null(), &mut info),
            "getinfo",
        );
        // Each queue is read by a thread of its own while the test's thread posts: the
        // provider, not the test, serialises the calls.
        (*(*info).domain_attr).threading = FI_THREAD_SAFE;
        let mut fabric: *mut fid_fabric = null_mut();
        check(
            (prov.fabric)((*info).fabric_attr, &mut fabric, null_mut()),
            "fabric",
        );
        let mut domain: *mut fid_domain = null_mut();
        check(
            ((*(*fabric).ops).domain)(fabric, info, &mut domain, null_mut()),
            "domain",
        );
        let mut cqs = [null_mut(); 2];
        let mut cq_attr: fi_cq_attr = std::mem::zeroed();
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        for cq in &mut cqs {
            check(
                ((*(*domain).ops).cq_open)(domain, &mut cq_attr, cq, null_mut()),
                "cq_open",
            );
        }
        let mut av: *mut fid_av = null_mut();
        let mut av_attr: fi_av_attr = std::mem::zeroed();
        av_attr.type_ = FI_AV_TABLE;
        check(
            ((*(*domain).ops).av_open)(domain, &mut av_attr, &mut av, null_mut()),
            "av_open",
        );
        let mut eps = [null_mut(); 2];
        let mut names = [[0u8; 64]; 2];
        for (i, ep) in eps.iter_mut().enumerate() {
            check(
                ((*(*domain).ops).endpoint)(domain, info, ep, null_mut()),
                "endpoint",
            );
            let f = &mut (**ep).fid;
            check(((*f.ops).bind)(f, &mut (*av).fid, 0), "bind av");
            check(
                ((*f.ops).bind)(f, &mut (*cqs[i]).fid, FI_TRANSMIT | FI_RECV),
                "bind cq",
            );
            check(((*f.ops).control)(f, FI_ENABLE, null_mut()), "enable");
            let mut len = 8usize;
            let r = ((*(**ep).cm).getname)(f, names[i].as_mut_ptr() as *mut c_void, &mut len);
            assert_eq!(r, -FI_ETOOSMALL, "an 8-byte buffer held a name");
            assert_eq!(
                len,
                clink_proto::addr::BINARY_LEN,
                "getname said what it needs"
            );
            check(
                ((*(**ep).cm).getname)(f, names[i].as_mut_ptr() as *mut c_void, &mut len),
                "getname",
            );
        }
        // Both names, then a corrupted one: two inserted, the third refused.
        let n = clink_proto::addr::BINARY_LEN;
        let mut blob = Vec::new();
        blob.extend_from_slice(&names[0][..n]);
        blob.extend_from_slice(&names[1][..n]);
        let mut bad = names[1][..n].to_vec();
        bad[0] = 99; // an unknown version
        blob.extend_from_slice(&bad);
        let mut addrs = [0u64; 3];
        let r = ((*(*av).ops).insert)(
            av,
            blob.as_ptr() as *const c_void,
            3,
            addrs.as_mut_ptr(),
            0,
            null_mut(),
        );
        assert_eq!(r, 2, "inserted count");
        assert_eq!(addrs[..2], [0, 1], "FI_AV_TABLE indices");
        assert_eq!(
            addrs[2], FI_ADDR_NOTAVAIL,
            "a corrupt name was given an address"
        );
        Setup {
            cqs,
            av,
            eps,
            addrs: [addrs[0], addrs[1]],
        }
    }
}

/// Closes what `setup` made.
unsafe fn teardown(s: Setup) {
    // SAFETY: the objects `setup` made, each closed once.
    unsafe {
        for ep in s.eps {
            check(((*(*ep).fid.ops).close)(&mut (*ep).fid), "close endpoint");
        }
        for cq in s.cqs {
            check(((*(*cq).fid.ops).close)(&mut (*cq).fid), "close cq");
        }
        check(((*(*s.av).fid.ops).close)(&mut (*s.av).fid), "close av");
    }
}

type Outcome = Result<fi_cq_tagged_entry, fi_cq_err_entry>;

/// A completion queue's pointer, handed to the thread that reads it.
struct Queue(*mut fid_cq);
// SAFETY: the provider's objects are thread-safe (FI_THREAD_SAFE).
unsafe impl Send for Queue {}
// SAFETY: the entries' pointers are the test's contexts, only compared.
unsafe impl Send for Entry {}
struct Entry(Outcome);

/// Reads `cq` until `stop`, sending every completion and failure to the returned channel.
fn reader(
    cq: *mut fid_cq,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (
    std::sync::mpsc::Receiver<Entry>,
    std::thread::JoinHandle<()>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let q = Queue(cq);
    let h = std::thread::spawn(move || {
        let q = q;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: an open queue, room for one entry.
            unsafe {
                let mut e: fi_cq_tagged_entry = std::mem::zeroed();
                let r = ((*(*q.0).ops).read)(q.0, &mut e as *mut _ as *mut c_void, 1);
                if r == 1 {
                    let _ = tx.send(Entry(Ok(e)));
                } else if r == -(FI_EAVAIL as isize) {
                    let mut err: fi_cq_err_entry = std::mem::zeroed();
                    assert_eq!(((*(*q.0).ops).readerr)(q.0, &mut err, 0), 1);
                    let _ = tx.send(Entry(Err(err)));
                } else {
                    assert_eq!(r, -(FI_EAGAIN as isize), "cq read");
                    std::thread::yield_now();
                }
            }
        }
    });
    (rx, h)
}

/// A check for calls retried while the two endpoints connect (they answer -FI_EAGAIN
/// until then): true once one is taken, failing on any other answer or after 10 s.
fn connecting() -> impl Fn(isize, &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    move |r, what| {
        assert!(r == 0 || r == -(FI_EAGAIN as isize), "{what}: {r}");
        assert!(Instant::now() < deadline, "{what}: never connected");
        std::thread::yield_now();
        r == 0
    }
}

fn next(rx: &std::sync::mpsc::Receiver<Entry>) -> Outcome {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("no completion within 10 s")
        .0
}

fn ctx(n: usize) -> *mut c_void {
    n as *mut c_void
}

/// Cancels the receive posted on `ep` with context `c`: its completion must say
/// cancelled.
unsafe fn cancel_fails_it(ep: *mut fid_ep, rx: &std::sync::mpsc::Receiver<Entry>, c: usize) {
    assert_eq!(((*(*ep).ops).cancel)(&mut (*ep).fid, ctx(c)), 0);
    let err = next(rx).expect_err("a cancelled receive fails");
    assert_eq!((err.err, err.op_context), (FI_ECANCELED, ctx(c)));
}

/// Stops the completion readers, then closes what `setup` opened.
unsafe fn finish(
    s: Setup,
    stop: &std::sync::atomic::AtomicBool,
    readers: impl IntoIterator<Item = std::thread::JoinHandle<()>>,
) {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in readers {
        h.join().unwrap();
    }
    teardown(s);
}

#[test]
fn hints_it_cannot_meet_find_nothing() {
    // SAFETY: getinfo with zeroed hints and a live out-pointer.
    unsafe {
        let prov = &*clink_fi::fi_prov_ini();
        let mut hints: fi_info = std::mem::zeroed();
        hints.caps = FI_TAGGED | (1 << 2); // FI_RMA
        let mut out: *mut fi_info = null_mut();
        let r = (prov.getinfo)(fi_version(1, 17), null(), null(), 0, &hints, &mut out);
        assert_eq!(r, -FI_ENODATA);
        assert!(out.is_null());
    }
}

#[test]
fn messages_truncation_peek_and_cancel() {
    // SAFETY: the provider's calls on the objects `setup` made; every buffer posted
    // outlives its completion (the test reads every completion before returning).
    unsafe {
        let s = setup();
        let [a, b] = s.eps;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rx_a, ha) = reader(s.cqs[0], stop.clone());
        let (rx_b, hb) = reader(s.cqs[1], stop.clone());
        let tagged = |ep: *mut fid_ep| &*(*ep).tagged;
        // A message checked byte for byte (the receive posted before the send).
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut got = vec![0u8; msg.len()];
        // Both answer -FI_EAGAIN until the connection between the two endpoints is made.
        let again = connecting();
        while !again(
            (tagged(b).recv)(
                b,
                got.as_mut_ptr() as *mut c_void,
                got.len(),
                null_mut(),
                s.addrs[0],
                42,
                0,
                ctx(1),
            ),
            "trecv",
        ) {}
        while !again(
            (tagged(a).send)(
                a,
                msg.as_ptr() as *const c_void,
                msg.len(),
                null_mut(),
                s.addrs[1],
                42,
                ctx(2),
            ),
            "tsend",
        ) {}
        let sent = next(&rx_a).expect("send completion");
        assert_eq!(sent.op_context, ctx(2));
        let e = next(&rx_b).expect("receive completion");
        assert_eq!((e.op_context, e.len, e.tag), (ctx(1), msg.len(), 42));
        assert_eq!(e.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
        assert!(got == msg, "the message arrived changed");

        // Truncation: 64 bytes into 8.
        let mut small = [0u8; 8];
        assert_eq!(
            (tagged(b).recv)(
                b,
                small.as_mut_ptr() as *mut c_void,
                8,
                null_mut(),
                s.addrs[0],
                7,
                0,
                ctx(3)
            ),
            0
        );
        let big = [5u8; 64];
        assert_eq!(
            (tagged(a).inject)(a, big.as_ptr() as *const c_void, 64, s.addrs[1], 7),
            0
        );
        let err = next(&rx_b).expect_err("truncation is an error");
        assert_eq!((err.err, err.olen, err.op_context), (FI_ETRUNC, 56, ctx(3)));
        assert_eq!(small, [5u8; 8]);

        // A peek that finds nothing fails with FI_ENOMSG.
        let msg_desc = fi_msg_tagged {
            msg_iov: null(),
            desc: null_mut(),
            iov_count: 0,
            addr: FI_ADDR_UNSPEC,
            tag: 999,
            ignore: 0,
            context: ctx(4),
            data: 0,
        };
        assert_eq!((tagged(b).recvmsg)(b, &msg_desc, FI_PEEK), 0);
        let err = next(&rx_b).expect_err("an empty peek fails");
        assert_eq!((err.err, err.op_context), (FI_ENOMSG, ctx(4)));

        // Cancel of a receive nothing will match.
        let mut buf = [0u8; 16];
        assert_eq!(
            (tagged(b).recv)(
                b,
                buf.as_mut_ptr() as *mut c_void,
                16,
                null_mut(),
                FI_ADDR_UNSPEC,
                1234,
                0,
                ctx(5)
            ),
            0
        );
        cancel_fails_it(b, &rx_b, 5);

        finish(s, &stop, [ha, hb]);
    }
}

/// FI_MSG beside FI_TAGGED on one endpoint: an untagged receive takes only untagged
/// messages and a wildcard tagged receive only tagged ones; the completions say which
/// (FI_MSG with tag 0, FI_TAGGED with the tag); a tagged send may not use the top tag bit
/// (63 tag bits when both are offered).
#[test]
fn untagged_and_tagged_messages_do_not_cross() {
    // SAFETY: the provider's calls on the objects `setup` made; every buffer posted
    // outlives its completion (both are read before the buffers go).
    unsafe {
        let s = setup();
        let [a, b] = s.eps;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rx_a, ha) = reader(s.cqs[0], stop.clone());
        let (rx_b, hb) = reader(s.cqs[1], stop.clone());
        let tagged = |ep: *mut fid_ep| &*(*ep).tagged;
        let msg = |ep: *mut fid_ep| &*(*ep).msg;
        let again = connecting();
        let (mut ubuf, mut tbuf) = ([0u8; 16], [0u8; 16]);
        while !again(
            (msg(b).recv)(
                b,
                ubuf.as_mut_ptr() as *mut c_void,
                16,
                null_mut(),
                s.addrs[0],
                ctx(1),
            ),
            "recv",
        ) {}
        // Any tag at all: still not an untagged message.
        assert_eq!(
            (tagged(b).recv)(
                b,
                tbuf.as_mut_ptr() as *mut c_void,
                16,
                null_mut(),
                s.addrs[0],
                0,
                u64::MAX,
                ctx(2),
            ),
            0
        );
        let (t, u) = (*b"tagged", *b"untagged");
        while !again(
            (tagged(a).send)(
                a,
                t.as_ptr() as *const c_void,
                t.len(),
                null_mut(),
                s.addrs[1],
                5,
                ctx(3),
            ),
            "tsend",
        ) {}
        assert_eq!(
            (msg(a).send)(
                a,
                u.as_ptr() as *const c_void,
                u.len(),
                null_mut(),
                s.addrs[1],
                ctx(4)
            ),
            0
        );
        let mut got = [next(&rx_b).unwrap(), next(&rx_b).unwrap()];
        got.sort_by_key(|e| e.op_context as usize);
        assert_eq!((got[0].len, got[0].tag), (u.len(), 0), "untagged receive");
        assert_eq!(
            got[0].flags & (FI_MSG | FI_TAGGED | FI_RECV),
            FI_MSG | FI_RECV
        );
        assert_eq!(&ubuf[..u.len()], &u);
        assert_eq!((got[1].len, got[1].tag), (t.len(), 5), "tagged receive");
        assert_eq!(
            got[1].flags & (FI_MSG | FI_TAGGED | FI_RECV),
            FI_TAGGED | FI_RECV
        );
        assert_eq!(&tbuf[..t.len()], &t);
        let mut sent = [next(&rx_a).unwrap(), next(&rx_a).unwrap()];
        sent.sort_by_key(|e| e.op_context as usize);
        assert_eq!(sent[0].flags & (FI_MSG | FI_TAGGED), FI_TAGGED);
        assert_eq!(sent[1].flags & (FI_MSG | FI_TAGGED), FI_MSG);
        // The top tag bit belongs to untagged messages.
        assert_eq!(
            (tagged(a).inject)(a, t.as_ptr() as *const c_void, 1, s.addrs[1], 1 << 63),
            -(FI_EINVAL as isize)
        );

        finish(s, &stop, [ha, hb]);
    }
}

/// CPU seconds the calling thread has used.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// A blocking completion read (`fi_cq_sread`) sleeps on the endpoints' file descriptors:
/// one that times out has used a small part of its wait in CPU time, and one that a
/// message ends returns that message's completion.
#[test]
fn a_blocking_read_sleeps_until_a_completion() {
    // SAFETY: the provider's calls on the objects `setup` made; the buffers outlive the
    // reads that complete them.
    unsafe {
        let s = setup();
        let [a, b] = s.eps;
        let tagged = |ep: *mut fid_ep| &*(*ep).tagged;
        let cq_b = s.cqs[1];
        let sread = |cq: *mut fid_cq, e: &mut fi_cq_tagged_entry, ms: i32| {
            ((*(*cq).ops).sread)(cq, e as *mut _ as *mut c_void, 1, null(), ms)
        };
        // A thread reading the sender's queue drives its endpoint (its connect waits for
        // this side's answer).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (_rx_a, ha) = reader(s.cqs[0], stop.clone());
        let mut buf = [0u8; 8];
        let deadline = Instant::now() + Duration::from_secs(10);
        while (tagged(b).recv)(
            b,
            buf.as_mut_ptr() as *mut c_void,
            8,
            null_mut(),
            s.addrs[0],
            9,
            0,
            ctx(1),
        ) != 0
        {
            assert!(Instant::now() < deadline, "never connected");
            let mut x: fi_cq_tagged_entry = std::mem::zeroed();
            let r = ((*(*cq_b).ops).read)(cq_b, &mut x as *mut _ as *mut c_void, 1);
            assert_eq!(r, -(FI_EAGAIN as isize));
        }
        let mut e: fi_cq_tagged_entry = std::mem::zeroed();
        let (t0, c0) = (Instant::now(), thread_cpu());
        assert_eq!(
            sread(cq_b, &mut e, 400),
            -(FI_EAGAIN as isize),
            "nothing came"
        );
        let (waited, cpu) = (t0.elapsed().as_secs_f64(), thread_cpu() - c0);
        assert!(waited >= 0.39, "returned after {waited} s of a 0.4 s wait");
        assert!(
            cpu < waited / 2.0,
            "{cpu} s of CPU in a {waited} s wait: it spun rather than slept"
        );
        // The sender is another thread; the sleeping reader is woken by the message.
        let sender = {
            let (a, dest) = (a as usize, s.addrs[1]);
            std::thread::spawn(move || {
                let a = a as *mut fid_ep;
                let word = 77u64.to_le_bytes();
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let r = ((*(*a).tagged).inject)(a, word.as_ptr() as *const c_void, 8, dest, 9);
                    if r == 0 {
                        break;
                    }
                    assert_eq!(r, -(FI_EAGAIN as isize));
                    assert!(Instant::now() < deadline, "inject never taken");
                    std::thread::yield_now();
                }
            })
        };
        assert_eq!(sread(cq_b, &mut e, 10_000), 1, "the completion");
        assert_eq!((e.op_context, e.len, e.tag), (ctx(1), 8, 9));
        assert_eq!(u64::from_le_bytes(buf), 77);
        sender.join().unwrap();
        finish(s, &stop, [ha]);
    }
}

/// A receive over several buffers gets the message scattered over them in order and a
/// completion saying how much landed; a cancelled one fails as cancelled.
#[test]
fn a_receive_over_several_buffers_is_scattered_in_order() {
    // SAFETY: the provider's calls on the objects `setup` made; every buffer posted
    // outlives its completion (both are read before the buffers go).
    unsafe {
        let s = setup();
        let [a, b] = s.eps;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rx_a, ha) = reader(s.cqs[0], stop.clone());
        let (rx_b, hb) = reader(s.cqs[1], stop.clone());
        let tagged = |ep: *mut fid_ep| &*(*ep).tagged;
        let (mut x, mut y, mut z) = ([0u8; 5], [0u8; 7], [0u8; 32]);
        let iov = |bufs: [&mut [u8]; 3]| {
            bufs.map(|b| libc::iovec {
                iov_base: b.as_mut_ptr() as *mut c_void,
                iov_len: b.len(),
            })
        };
        let pieces = iov([&mut x, &mut y, &mut z]);
        let again = connecting();
        while !again(
            (tagged(b).recvv)(b, pieces.as_ptr(), null_mut(), 3, s.addrs[0], 9, 0, ctx(1)),
            "trecvv",
        ) {}
        let msg: Vec<u8> = (1..=30u8).collect();
        while !again(
            (tagged(a).send)(
                a,
                msg.as_ptr() as *const c_void,
                msg.len(),
                null_mut(),
                s.addrs[1],
                9,
                ctx(2),
            ),
            "tsend",
        ) {}
        assert_eq!(next(&rx_a).expect("send completion").op_context, ctx(2));
        let e = next(&rx_b).expect("receive completion");
        assert_eq!((e.op_context, e.len, e.tag), (ctx(1), 30, 9));
        assert_eq!(x[..], msg[..5]);
        assert_eq!(y[..], msg[5..12]);
        assert_eq!(z[..18], msg[12..]);
        assert_eq!(z[18..], [0u8; 14], "bytes beyond the message were written");

        let (mut u, mut v, mut w) = ([0u8; 4], [0u8; 4], [0u8; 4]);
        let pieces = iov([&mut u, &mut v, &mut w]);
        assert_eq!(
            (tagged(b).recvv)(
                b,
                pieces.as_ptr(),
                null_mut(),
                3,
                FI_ADDR_UNSPEC,
                4321,
                0,
                ctx(3)
            ),
            0
        );
        cancel_fails_it(b, &rx_b, 3);

        finish(s, &stop, [ha, hb]);
    }
}

/// Posts on `ep` a tagged receive of up to 8 bytes into `buf`, from `src`, with context `c`.
unsafe fn post8(
    ep: *mut fid_ep,
    buf: &mut [u8; 8],
    src: u64,
    tag: u64,
    ignore: u64,
    c: usize,
) -> isize {
    let p = buf.as_mut_ptr() as *mut c_void;
    ((*(*ep).tagged).recv)(ep, p, 8, null_mut(), src, tag, ignore, ctx(c))
}

/// Injects the byte `byte` with `tag` from `ep` to `dest`.
unsafe fn inject1(ep: *mut fid_ep, dest: u64, tag: u64, byte: &[u8; 1]) -> isize {
    ((*(*ep).tagged).inject)(ep, byte.as_ptr() as *const c_void, 1, dest, tag)
}

/// Several receives posted before their messages come: each message goes to the first
/// receive, in the order they were posted, that matches it (a wildcard posted first takes a
/// message a later exact receive also wants; a message only a later receive wants skips the
/// earlier ones), and a message none wants waits for the receive posted after it.
#[test]
fn receives_match_in_the_order_they_were_posted() {
    // SAFETY: the provider's calls on the objects `setup` made; every buffer posted
    // outlives its completion (all are read before the buffers go).
    unsafe {
        let s = setup();
        let [a, b] = s.eps;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rx_a, ha) = reader(s.cqs[0], stop.clone());
        let (rx_b, hb) = reader(s.cqs[1], stop.clone());
        // The connection first, by one message.
        let mut bufs = [[0u8; 8]; 8];
        let again = connecting();
        while !again(post8(b, &mut bufs[0], s.addrs[0], 1, 0, 10), "trecv") {}
        while !again(inject1(a, s.addrs[1], 1, b"c"), "tinject") {}
        assert_eq!(next(&rx_b).expect("the first message").op_context, ctx(10));
        let post = |i: usize, tag: u64, ignore: u64, bufs: &mut [[u8; 8]; 8]| {
            let r = post8(b, &mut bufs[i], s.addrs[0], tag, ignore, 10 + i);
            assert_eq!(r, 0, "trecv");
        };
        let inject = |tag: u64, byte: &[u8; 1]| {
            assert_eq!(inject1(a, s.addrs[1], tag, byte), 0, "tinject");
        };
        // Completions by context: (tag, the byte received).
        let take = |n: usize, bufs: &[[u8; 8]; 8]| {
            let mut got = std::collections::HashMap::new();
            for _ in 0..n {
                let e = next(&rx_b).expect("a receive completion");
                let i = e.op_context as usize - 10;
                assert_eq!(e.len, 1);
                got.insert(i, (e.tag, bufs[i][0]));
            }
            got
        };
        post(1, 0, !0, &mut bufs); // any tag
        post(2, 5, 0, &mut bufs);
        post(3, 9, 0, &mut bufs);
        inject(5, b"A");
        inject(5, b"B");
        inject(9, b"C");
        inject(7, b"D"); // wanted by no receive yet
        let got = take(3, &bufs);
        assert_eq!(
            got[&1],
            (5, b'A'),
            "the wildcard, posted first, takes the first"
        );
        assert_eq!(got[&2], (5, b'B'));
        assert_eq!(got[&3], (9, b'C'));
        post(4, 7, 0, &mut bufs);
        assert_eq!(take(1, &bufs)[&4], (7, b'D'), "the message that waited");
        post(5, 3, 0, &mut bufs);
        post(6, 4, 0, &mut bufs);
        inject(4, b"E");
        inject(3, b"F");
        let got = take(2, &bufs);
        assert_eq!((got[&5], got[&6]), ((3, b'F'), (4, b'E')));
        assert!(rx_a.try_recv().is_err(), "an inject completes nothing");

        finish(s, &stop, [ha, hb]);
    }
}

/// Messages that arrive before any receive wants them wait in arrival order: a receive
/// posted later takes the first that matches it, a peek sees them, a receive over several
/// buffers takes them too, and one too small for such a message fails truncated.
#[test]
fn messages_that_came_first_wait_in_arrival_order() {
    // SAFETY: the provider's calls on the objects `setup` made; every buffer posted
    // outlives its completion (all are read before the buffers go).
    unsafe {
        let s = setup();
        let [a, b] = s.eps;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rx_a, ha) = reader(s.cqs[0], stop.clone());
        let (rx_b, hb) = reader(s.cqs[1], stop.clone());
        let tagged = |ep: *mut fid_ep| &*(*ep).tagged;
        let mut bufs = [[0u8; 8]; 8];
        // A receive for tag 99, posted first: the messages below go past it, and its
        // completion says that those sent before its own message were taken in.
        let again = connecting();
        while !again(post8(b, &mut bufs[0], s.addrs[0], 99, 0, 10), "trecv") {}
        let inject = |tag: u64, byte: &[u8; 1]| {
            let again = connecting();
            while !again(inject1(a, s.addrs[1], tag, byte), "tinject") {}
        };
        inject(5, b"A");
        inject(6, b"B");
        inject(5, b"C");
        inject(99, b"Z");
        let e = next(&rx_b).expect("the receive of tag 99");
        assert_eq!((e.op_context, e.tag, bufs[0][0]), (ctx(10), 99, b'Z'));
        let post = |i: usize, tag: u64, ignore: u64, bufs: &mut [[u8; 8]; 8]| {
            let r = post8(b, &mut bufs[i], s.addrs[0], tag, ignore, 10 + i);
            assert_eq!(r, 0, "trecv");
        };
        post(1, 6, 0, &mut bufs);
        let e = next(&rx_b).expect("tag 6");
        assert_eq!(
            (e.op_context, e.tag, e.len, bufs[1][0]),
            (ctx(11), 6, 1, b'B')
        );
        post(2, 0, !0, &mut bufs); // any tag: the first that came
        let e = next(&rx_b).expect("any tag");
        assert_eq!((e.op_context, e.tag, bufs[2][0]), (ctx(12), 5, b'A'));
        // A peek sees the one left.
        let peek = fi_msg_tagged {
            msg_iov: null(),
            desc: null_mut(),
            iov_count: 0,
            addr: FI_ADDR_UNSPEC,
            tag: 5,
            ignore: 0,
            context: ctx(13),
            data: 0,
        };
        assert_eq!((tagged(b).recvmsg)(b, &peek, FI_PEEK), 0);
        let e = next(&rx_b).expect("the peek finds it");
        assert_eq!((e.op_context, e.tag, e.len), (ctx(13), 5, 1));
        // And a receive over two buffers takes it.
        let (mut x, mut y) = ([0u8; 1], [0u8; 4]);
        let pieces = [
            libc::iovec {
                iov_base: x.as_mut_ptr() as *mut c_void,
                iov_len: 1,
            },
            libc::iovec {
                iov_base: y.as_mut_ptr() as *mut c_void,
                iov_len: 4,
            },
        ];
        let r = (tagged(b).recvv)(b, pieces.as_ptr(), null_mut(), 2, s.addrs[0], 5, 0, ctx(14));
        assert_eq!(r, 0, "trecvv");
        let e = next(&rx_b).expect("tag 5 over two buffers");
        assert_eq!((e.op_context, e.tag, e.len, x[0]), (ctx(14), 5, 1, b'C'));
        // A message that came first and is larger than the receive that takes it: the
        // receive fails truncated, with what fitted landed. (The message after it, taken by
        // a receive waiting for it, says it came in first.)
        post(5, 99, 0, &mut bufs);
        let big = [7u8; 16];
        let again = connecting();
        while !again(
            (tagged(a).inject)(a, big.as_ptr() as *const c_void, 16, s.addrs[1], 8),
            "tinject",
        ) {}
        inject(99, b"Y");
        let e = next(&rx_b).expect("the receive of tag 99");
        assert_eq!((e.op_context, bufs[5][0]), (ctx(15), b'Y'));
        post(6, 8, 0, &mut bufs);
        let err = next(&rx_b).expect_err("truncation is an error");
        assert_eq!((err.err, err.olen, err.op_context), (FI_ETRUNC, 8, ctx(16)));
        assert_eq!(bufs[6], [7u8; 8]);
        assert!(rx_a.try_recv().is_err(), "an inject completes nothing");

        finish(s, &stop, [ha, hb]);
    }
}
