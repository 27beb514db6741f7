//! A soak on a small cluster: four hosts on a Linux bridge dropping 1% of the packets into
//! each host at random, one process per host, every pair exchanging messages of random
//! sizes (1 B to 4 MiB, log-uniform) both ways with four tags, by blocking and
//! non-blocking sends, for `SOAK_SECS` seconds (default 15; the full soak is
//! `SOAK_SECS=600 cargo test --release -p clink --test soak -- --nocapture`).
//!
//! Every message is checked where it lands: its length and contents are a function of
//! (sender, receiver, tag, index within that tag), so a loss, duplicate, reordering within
//! a tag or damaged byte is caught at once; at the end each sender's per-tag counts must
//! equal what its peers received. Each process also reports its resident memory after
//! the first quarter and at the end. `SOAK_LOSS` sets another drop percentage. Needs
//! root, iproute2 and nftables.

mod common;

use clink::{Config, Endpoint, PeerId, Received, RecvRequest, Selector, SendRequest};
use clink_testbed::{Bridge, BridgeSpec};
use common::*;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const HOSTS: usize = 4;
const TAGS: u64 = 4;
const MAX_LEN: u64 = 4 << 20;
/// Non-blocking sends outstanding at most.
const OUTSTANDING: usize = 8;
const TAG_ADDR: u64 = 100;
const TAG_LIST: u64 = 101;
const TAG_RANK: u64 = 102;
const TAG_END: u64 = 103;
const TAG_REPORT: u64 = 104;
const TAG_EXIT: u64 = 105;

/// The key of message `k` of `tag` from `src` to `dst`.
fn msg_key(seed: u64, src: usize, dst: usize, tag: u64, k: u64) -> u64 {
    key(seed, ((src * HOSTS + dst) as u64 * TAGS + tag) << 40 | k)
}

/// Its length: log-uniform over 1 B ..= 4 MiB, drawn from the key.
fn msg_len(k: u64) -> usize {
    let mut r = Rng::new(k);
    let bits = r.range(0, 23); // 2^0 ..= 2^22
    r.range(1u64 << bits, ((1u64 << (bits + 1)) - 1).min(MAX_LEN) + 1) as usize
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn child_entry() {
    child_main(|role| {
        assert_eq!(role, "soak");
        let seed = child_seed();
        let secs: u64 = std::env::var("SOAK_SECS").unwrap().parse().unwrap();
        let (mut ep, parent) = child_connect();
        ep.send(parent, TAG_ADDR, ep.address().as_bytes()).unwrap();
        let list = String::from_utf8(recv_vec(&mut ep, parent, TAG_LIST, 4096)).unwrap();
        let addrs: Vec<&str> = list.lines().collect();
        let me = addrs
            .iter()
            .position(|a| *a == ep.address())
            .expect("own address");
        // Connect to the lower ranks, accept the higher ones (who say their rank).
        let mut peer_of: Vec<Option<PeerId>> = vec![None; HOSTS];
        for (r, a) in addrs.iter().enumerate().take(me) {
            let p = ep.connect(a).unwrap();
            ep.send(p, TAG_RANK, &[me as u8]).unwrap();
            peer_of[r] = Some(p);
        }
        for _ in me + 1..HOSTS {
            let p = ep.accept(Some(T)).unwrap();
            let r = recv_vec(&mut ep, p, TAG_RANK, 1)[0] as usize;
            peer_of[r] = Some(p);
        }
        let report = soak(&mut ep, seed, me, &peer_of, Duration::from_secs(secs));
        ep.send(parent, TAG_REPORT, report.as_bytes()).unwrap();
        // Nobody leaves before everyone has everything (a process that closes while a
        // peer still has data for it, or owes it acks, cuts that exchange short).
        recv_vec(&mut ep, parent, TAG_EXIT, 8);
        ep.close();
    });
}

/// One process's part: returns its report line.
fn soak(
    ep: &mut Endpoint,
    seed: u64,
    me: usize,
    peer_of: &[Option<PeerId>],
    d: Duration,
) -> String {
    let others: Vec<usize> = (0..HOSTS).filter(|&r| r != me).collect();
    let mut rng = Rng::new(seed ^ me as u64);
    // One receive posted per (peer, tag) at all times: within a tag, messages then
    // complete in the order they were sent, which is what is checked (across tags, and
    // across the receives of one tag, completion order is not the sending order: a
    // rendezvous matched first may finish after an eager message matched later).
    let (mut posted, mut from): (Vec<RecvRequest>, Vec<(usize, u64)>) = (Vec::new(), Vec::new());
    for &r in &others {
        for tag in 0..TAGS {
            let sel = Selector::exact(peer_of[r], tag);
            posted.push(ep.irecv(sel, vec![0u8; MAX_LEN as usize]).unwrap());
            from.push((r, tag));
        }
    }
    let mut sent = [[0u64; TAGS as usize]; HOSTS];
    let mut got = vec![[0u64; TAGS as usize]; HOSTS];
    let mut outstanding: VecDeque<SendRequest> = VecDeque::new();
    let (mut bytes_out, mut bytes_in) = (0u64, 0u64);
    let start = Instant::now();
    let mut rss_warm = None;
    let mut ends_sent = false;
    let mut want_end: Vec<Option<Vec<u64>>> = vec![None; HOSTS];
    let check = |r: usize, got: &mut [[u64; 4]], rec: &Received| {
        let tag = rec.status.tag;
        assert!(tag < TAGS, "tag {tag} from {r}");
        let k = got[r][tag as usize];
        let mk = msg_key(seed, r, me, tag, k);
        let len = rec.status.len as usize;
        assert_eq!(len, msg_len(mk), "{r}->{me} tag {tag} message {k}: length");
        if let Some(at) = mismatch(mk, &rec.buf[..len]) {
            panic!("{r}->{me} tag {tag} message {k}: byte {at} of {len} differs");
        }
        got[r][tag as usize] += 1;
        len as u64
    };
    loop {
        // Sends are retired as they complete, never waited for: a process blocked on
        // its send while its peer is blocked on one to it, each with its receive for
        // the other filled and not posted again, would wait for ever.
        while let Some(r) = outstanding.front() {
            match ep.test_send(r) {
                Ok(true) => drop(outstanding.pop_front()),
                Ok(false) => break,
                Err(e) => panic!("{me}: send: {e}: {:?}", ep.last_error()),
            }
        }
        let sending = start.elapsed() < d;
        if rss_warm.is_none() && start.elapsed() > d / 4 {
            rss_warm = Some(rss_kib());
        }
        let room = outstanding.len() < OUTSTANDING;
        if sending && room {
            let r = others[rng.below(others.len() as u64) as usize];
            let tag = rng.below(TAGS);
            let k = sent[r][tag as usize];
            let mk = msg_key(seed, me, r, tag, k);
            let msg = pattern(mk, msg_len(mk));
            bytes_out += msg.len() as u64;
            let p = peer_of[r].unwrap();
            if rng.below(2) == 0 && msg.len() <= 1024 {
                ep.send(p, tag, &msg).unwrap(); // eager: complete once queued
            } else {
                outstanding.push_back(ep.isend(p, tag, msg).unwrap());
            }
            sent[r][tag as usize] += 1;
        } else if !sending && !ends_sent {
            // Done sending: each peer is told how many of each tag to expect.
            for &r in &others {
                let counts: Vec<u8> = sent[r].iter().flat_map(|c| c.to_le_bytes()).collect();
                ep.send(peer_of[r].unwrap(), TAG_END, &counts).unwrap();
            }
            ends_sent = true;
        }
        // Whatever arrived (at most a short wait while sending).
        let wait = if sending && room {
            Duration::ZERO
        } else {
            Duration::from_millis(5)
        };
        let got_one = if posted.is_empty() {
            None
        } else {
            match ep.wait_any_recv(&posted, Some(wait)) {
                Ok(x) => Some(x),
                Err(clink::Error::Timeout) => None,
                Err(e) => panic!("{me}: wait: {e}"),
            }
        };
        // The end counts the peers sent (they stay receivable after a peer closes).
        for &r in &others {
            let sel = Selector::exact(peer_of[r], TAG_END);
            if want_end[r].is_none() && ep.probe(sel).is_some() {
                let mut counts = [0u8; 32];
                ep.recv(sel, &mut counts).unwrap();
                want_end[r] = Some(
                    counts
                        .chunks(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                );
            }
        }
        let complete = |r: usize, got: &[[u64; 4]]| {
            want_end[r]
                .as_ref()
                .is_some_and(|w| w.iter().zip(&got[r]).all(|(w, g)| g == w))
        };
        if let Some((i, rec)) = got_one {
            let (r, tag) = from[i];
            match rec {
                Ok(rec) => {
                    assert_eq!(rec.status.tag, tag);
                    bytes_in += check(r, &mut got, &rec);
                    let mut buf = rec.buf;
                    buf.resize(MAX_LEN as usize, 0);
                    posted[i] = ep.irecv(Selector::exact(peer_of[r], tag), buf).unwrap();
                }
                // A peer that finished closes: its receives fail, once all it said
                // it sent has arrived.
                Err(clink::Error::PeerDead(_)) if complete(r, &got) => {
                    drop(posted.swap_remove(i));
                    from.swap_remove(i);
                }
                Err(e) => panic!("{me}: receive from {r}: {e}: {:?}", ep.last_error()),
            }
        }
        if !sending {
            // Finished when every peer's end count matches what arrived.
            let done = others.iter().all(|&r| complete(r, &got));
            if done && outstanding.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < d + T,
                "{me}: the exchange did not finish: got {got:?}, told {want_end:?}"
            );
        }
    }
    let s = ep.stats();
    format!(
        "host {me}: {} messages / {} MiB out, {} MiB in, {} retransmissions, rss {} -> {} KiB",
        sent.iter().flatten().sum::<u64>(),
        bytes_out >> 20,
        bytes_in >> 20,
        s.retransmissions,
        rss_warm.unwrap_or(0),
        rss_kib()
    )
}

#[test]
fn four_hosts_exchange_random_messages_under_one_percent_loss() {
    require_netns();
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let loss_pct: f64 = std::env::var("SOAK_LOSS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let b = Bridge::create(&BridgeSpec {
        hosts: HOSTS + 1, // the coordinator on the last
        loss_pct,
        ..BridgeSpec::default()
    })
    .expect("bridge");
    let config = Config {
        calibrate: false,
        ..Config::from_env().unwrap()
    };
    let (addr, h) = in_netns(b.ns(HOSTS), config, move |mut ep| {
        let mut peers = Vec::new();
        let mut addrs = Vec::new();
        for _ in 0..HOSTS {
            let p = ep.accept(Some(T)).unwrap();
            addrs.push(String::from_utf8(recv_vec(&mut ep, p, TAG_ADDR, 4096)).unwrap());
            peers.push(p);
        }
        let list = addrs.join("\n");
        for &p in &peers {
            ep.send(p, TAG_LIST, list.as_bytes()).unwrap();
        }
        let bound = Duration::from_secs(secs) + 2 * T;
        let reports = peers
            .iter()
            .map(|&p| {
                let mut buf = vec![0u8; 4096];
                let st = ep
                    .recv_timeout(Selector::exact(Some(p), TAG_REPORT), &mut buf, Some(bound))
                    .unwrap_or_else(|e| panic!("no report: {e}"));
                String::from_utf8_lossy(&buf[..st.len as usize]).into_owned()
            })
            .collect::<Vec<_>>();
        for &p in &peers {
            ep.send(p, TAG_EXIT, &[]).unwrap();
        }
        // Driven until every child has closed (a lost word is resent meanwhile).
        let until = Instant::now() + T;
        while peers.iter().any(|&p| ep.is_alive(p)) {
            assert!(Instant::now() < until, "the children did not all leave");
            let _ = ep.recv_timeout(
                Selector::exact(None, TAG_EXIT),
                &mut [],
                Some(Duration::from_millis(10)),
            );
        }
        reports
    });
    let exe = std::env::current_exe().unwrap();
    let secs_text = secs.to_string();
    let mut children: Vec<ChildProc> = (0..HOSTS)
        .map(|i| {
            spawn_with(
                b.command(i, &exe),
                "soak",
                &addr,
                seed(71),
                &[("SOAK_SECS", &secs_text), ("CLINK_TRANSPORT", "udp")],
            )
        })
        .collect();
    let reports = h.join().expect("coordinator");
    for c in &mut children {
        c.expect_success(T);
    }
    for r in &reports {
        println!("{r}");
    }
    println!("switch dropped {} packets", b.dropped().unwrap_or(0));
    assert!(b.dropped().unwrap_or(0) > 0, "no loss was injected");
}
