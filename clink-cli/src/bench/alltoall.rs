//! `clink bench --alltoall`: the traffic of collectives (all-to-all, allgather) and of
//! servers with many clients. N hosts on one bridge ([`clink_testbed::Bridge`]), one
//! process per host; every round, every process sends a message of `--bw-sizes` (default
//! 256 KiB) to every other and receives one from each, contents checked; the row is the
//! slowest process's time for all rounds and the CPU time all processes spent in them
//! (user and system, which includes the kernel's delivery of what a process sends).
//! Systems: clink over UDP (`clink-udp`), clink over TCP (`clink-tcp`), and kernel TCP
//! (`tcp`: one connection per pair, each round's sends and receives on a thread per peer
//! so that no pair waits on another).
//!
//! The processes find each other through files in a fresh directory (every namespace
//! sees the same filesystem): each writes its address, then reads the others'.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clink::{Context, Endpoint, PeerId, Selector};
use clink_testbed::{Bridge, BridgeSpec};
use serde_json::json;

use super::measure::CpuTimes;
use super::stats::median;

/// The systems of the experiment.
pub const SYSTEMS: [&str; 3] = ["clink-udp", "clink-tcp", "tcp"];
/// Port of the kernel-TCP processes.
const TCP_PORT: u16 = 47_300;
/// Bound on any wait of a child.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// What one child does, passed as `--alltoall-child` (fields separated by commas).
#[derive(Debug, Clone, PartialEq)]
pub struct ChildSpec {
    /// System name (one of [`SYSTEMS`]).
    pub system: String,
    /// This process's rank.
    pub rank: usize,
    /// Number of processes.
    pub n: usize,
    /// Message size.
    pub size: usize,
    /// All-to-all rounds.
    pub rounds: u64,
    /// The rendezvous directory.
    pub dir: PathBuf,
}

impl ChildSpec {
    fn encode(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            self.system,
            self.rank,
            self.n,
            self.size,
            self.rounds,
            self.dir.display()
        )
    }

    /// Parses [`ChildSpec::encode`]'s text.
    pub fn decode(text: &str) -> Result<ChildSpec, String> {
        let f: Vec<&str> = text.splitn(6, ',').collect();
        let bad = || format!("bad --alltoall-child {text:?}");
        if f.len() != 6 || !SYSTEMS.contains(&f[0]) {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let spec = ChildSpec {
            system: f[0].to_string(),
            rank: num(f[1])? as usize,
            n: num(f[2])? as usize,
            size: num(f[3])? as usize,
            rounds: num(f[4])?,
            dir: PathBuf::from(f[5]),
        };
        if spec.n < 2 || spec.rank >= spec.n || spec.size == 0 {
            return Err(bad());
        }
        Ok(spec)
    }
}

/// The content of the message `src` sends `dst` in `round`: word `i` (little-endian) is
/// the message's key xor `i`, the last word cut to the length.
fn fill(buf: &mut [u8], round: u64, src: usize, dst: usize) {
    let k = key(round, src, dst);
    let mut words = buf.chunks_exact_mut(8);
    for (i, c) in (&mut words).enumerate() {
        c.copy_from_slice(&(k ^ i as u64).to_le_bytes());
    }
    let n = buf.len() / 8;
    let tail = &mut buf[n * 8..];
    let len = tail.len();
    tail.copy_from_slice(&(k ^ n as u64).to_le_bytes()[..len]);
}

fn key(round: u64, src: usize, dst: usize) -> u64 {
    (round << 16 | (src as u64) << 8 | dst as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Checks that `buf` holds what [`fill`] writes for the message `src` -> `dst`.
fn check(buf: &[u8], round: u64, src: usize, dst: usize) -> Result<(), String> {
    let k = key(round, src, dst);
    let n = buf.len() / 8;
    // Every word's difference folded together (no early exit: the loop vectorizes, and a
    // damaged message is the rare case).
    let diff = buf.chunks_exact(8).enumerate().fold(0u64, |acc, (i, c)| {
        acc | (u64::from_le_bytes(c.try_into().expect("8 bytes")) ^ k ^ i as u64)
    });
    let words_ok = diff == 0;
    if words_ok && buf[n * 8..] == (k ^ n as u64).to_le_bytes()[..buf.len() - n * 8] {
        Ok(())
    } else {
        Err(format!(
            "round {round}: the message {src} -> {dst} is damaged"
        ))
    }
}

/// Writes `text` to `dir/name` atomically.
fn publish(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)))
        .map_err(|e| format!("cannot write {name}: {e}"))
}

/// Waits for `dir/name` (bounded) and returns its text.
fn await_file(dir: &Path, name: &str) -> Result<String, String> {
    let until = Instant::now() + CHILD_TIMEOUT;
    loop {
        if let Ok(t) = std::fs::read_to_string(dir.join(name)) {
            return Ok(t);
        }
        if Instant::now() > until {
            return Err(format!("{name} never appeared"));
        }
        // Polling for another process's file; nothing depends on the pause's length.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A barrier of all ranks through files named `tag.RANK`.
fn barrier(s: &ChildSpec, tag: &str) -> Result<(), String> {
    publish(&s.dir, &format!("{tag}.{}", s.rank), "")?;
    for r in 0..s.n {
        await_file(&s.dir, &format!("{tag}.{r}"))?;
    }
    Ok(())
}

/// The child: connects to every other rank, then runs the rounds; prints their seconds
/// of wall-clock and of CPU time, and the part of it in the kernel.
pub fn run_child(spec_text: &str) -> Result<(), String> {
    let s = ChildSpec::decode(spec_text)?;
    let (secs, cpu) = if s.system == "tcp" {
        tcp_child(&s)?
    } else {
        clink_child(&s)?
    };
    println!("alltoall-seconds {secs} {} {}", cpu.total, cpu.kernel);
    Ok(())
}

fn clink_child(s: &ChildSpec) -> Result<(f64, CpuTimes), String> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    let mut ep = ctx.endpoint().map_err(|e| e.to_string())?;
    publish(&s.dir, &format!("addr.{}", s.rank), &ep.address())?;
    let mut peer_of: Vec<Option<PeerId>> = vec![None; s.n];
    let e = |e: clink::Error| e.to_string();
    for (r, slot) in peer_of.iter_mut().enumerate().take(s.rank) {
        let p = ep
            .connect(&await_file(&s.dir, &format!("addr.{r}"))?)
            .map_err(e)?;
        ep.send(p, 1, &[s.rank as u8]).map_err(e)?;
        *slot = Some(p);
    }
    for _ in s.rank + 1..s.n {
        let p = ep.accept(Some(CHILD_TIMEOUT)).map_err(e)?;
        let mut b = [0u8; 1];
        ep.recv_timeout(Selector::exact(Some(p), 1), &mut b, Some(CHILD_TIMEOUT))
            .map_err(e)?;
        peer_of[b[0] as usize] = Some(p);
    }
    barrier(s, "connected")?;
    let others: Vec<usize> = (0..s.n).filter(|&r| r != s.rank).collect();
    // Buffers are made once and reused every round, as an application's are: a fresh
    // 256 KiB buffer per message would measure the allocator (calloc's zeroing or a new
    // mapping's page faults), not the transport.
    let mut out: Vec<Vec<u8>> = others.iter().map(|_| vec![0u8; s.size]).collect();
    let mut bufs: Vec<Vec<u8>> = others.iter().map(|_| vec![0u8; s.size]).collect();
    let cpu0 = CpuTimes::now();
    let t = Instant::now();
    for round in 0..s.rounds {
        let tag = 2 + round;
        let mut recvs = Vec::new();
        for (k, &r) in others.iter().enumerate() {
            let buf = std::mem::take(&mut bufs[k]);
            recvs.push(ep.irecv(Selector::exact(peer_of[r], tag), buf).map_err(e)?);
        }
        let mut sends = Vec::new();
        for (k, &r) in others.iter().enumerate() {
            fill(&mut out[k], round, s.rank, r);
            let data = Bytes::from(std::mem::take(&mut out[k]));
            let req = ep
                .isend(peer_of[r].unwrap(), tag, data.clone())
                .map_err(e)?;
            sends.push((k, data, req));
        }
        for (k, q) in recvs.iter().enumerate() {
            let got = ep.wait_recv(q, Some(CHILD_TIMEOUT)).map_err(e)?;
            check(&got.buf, round, others[k], s.rank)?;
            bufs[k] = got.buf;
        }
        for (k, data, q) in sends {
            ep.wait_send(&q, Some(CHILD_TIMEOUT)).map_err(e)?;
            // Back once clink let go of it (a completed send holds no reference).
            out[k] = data
                .try_into_mut()
                .map_or_else(|_| vec![0u8; s.size], Vec::from);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = CpuTimes::now().since(cpu0);
    barrier(s, "done")?;
    let st = ep.stats();
    // In COUNTER_NAMES' order.
    let counters: [u64; COUNTER_NAMES.len()] = [
        st.retransmissions,
        st.timeouts,
        st.tail_probes,
        st.duplicates_dropped,
        st.sleeps,
        st.spec_hit_bytes,
        st.cleanup_bytes,
    ];
    let words: Vec<String> = counters.iter().map(u64::to_string).collect();
    println!("{COUNTERS_PREFIX}{}", words.join(" "));
    drop_endpoint(ep);
    Ok((secs, cpu))
}

/// Closes an endpoint after every rank finished (so none sees a peer leave early).
fn drop_endpoint(mut ep: Endpoint) {
    ep.close();
}

fn tcp_child(s: &ChildSpec) -> Result<(f64, CpuTimes), String> {
    let hosts: Vec<Ipv4Addr> = await_file(&s.dir, "hosts")?
        .lines()
        .map(|l| l.parse().map_err(|_| format!("bad host {l:?}")))
        .collect::<Result<_, String>>()?;
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, TCP_PORT))
        .map_err(|e| format!("listen: {e}"))?;
    publish(&s.dir, &format!("addr.{}", s.rank), "listening")?;
    let mut conns: Vec<Option<TcpStream>> = (0..s.n).map(|_| None).collect();
    for r in 0..s.rank {
        await_file(&s.dir, &format!("addr.{r}"))?;
        let mut c = TcpStream::connect(SocketAddrV4::new(hosts[r], TCP_PORT))
            .map_err(|e| format!("connect to {r}: {e}"))?;
        c.write_all(&[s.rank as u8]).map_err(|e| e.to_string())?;
        conns[r] = Some(c);
    }
    for _ in s.rank + 1..s.n {
        let (mut c, _) = listener.accept().map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        c.read_exact(&mut b).map_err(|e| e.to_string())?;
        conns[b[0] as usize] = Some(c);
    }
    for c in conns.iter().flatten() {
        c.set_nodelay(true).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(CHILD_TIMEOUT))
            .map_err(|e| e.to_string())?;
    }
    barrier(s, "connected")?;
    let me = s.rank;
    // Per peer, a send and a receive buffer made once (as in the clink child).
    let mut out: Vec<Vec<u8>> = (0..s.n).map(|_| vec![0u8; s.size]).collect();
    let mut bufs: Vec<Vec<u8>> = (0..s.n).map(|_| vec![0u8; s.size]).collect();
    let cpu0 = CpuTimes::now();
    let t = Instant::now();
    for round in 0..s.rounds {
        std::thread::scope(|sc| -> Result<(), String> {
            let mut jobs = Vec::new();
            for (r, (c, (msg, buf))) in conns
                .iter()
                .zip(out.iter_mut().zip(bufs.iter_mut()))
                .enumerate()
            {
                let Some(c) = c else { continue };
                jobs.push(sc.spawn(move || -> Result<(), String> {
                    let mut w = c;
                    fill(msg, round, me, r);
                    w.write_all(msg).map_err(|e| format!("send to {r}: {e}"))
                }));
                jobs.push(sc.spawn(move || -> Result<(), String> {
                    let mut rd = c;
                    rd.read_exact(buf)
                        .map_err(|e| format!("receive from {r}: {e}"))?;
                    check(buf, round, r, me)
                }));
            }
            for j in jobs {
                j.join()
                    .map_err(|_| "a peer thread panicked".to_string())??;
            }
            Ok(())
        })?;
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = CpuTimes::now().since(cpu0);
    barrier(s, "done")?;
    Ok((secs, cpu))
}

/// The parent: for each host count, round and system, a fresh bridge, one child per
/// host; the row is the slowest child's time and all children's CPU time.
pub fn run(
    hosts: &[usize],
    systems: &[&'static str],
    size: usize,
    rounds_each: u64,
    reps: u64,
    json: bool,
    tcp_cc: Option<&str>,
) -> Result<(), String> {
    if let Some(why) = clink_testbed::unavailable() {
        return Err(format!("--alltoall: {why}"));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut rows: Vec<Row> = Vec::new();
    super::say(
        json,
        &format!(
            "alltoall: N hosts on a bridge, one process each; {rounds_each} rounds of every \
             process sending {size} B to every other (contents checked); time of the \
             slowest process and CPU time of all; {reps} interleaved repetitions"
        ),
    );
    for &n in hosts {
        for rep in 0..reps {
            for &system in systems {
                let (secs, cpu, counters, host_cc) =
                    one_run(&exe, system, n, size, rounds_each, tcp_cc)?;
                let cc = super::own_tcp_cc(system).unwrap_or(host_cc);
                let said: Vec<String> = counters
                    .iter()
                    .flat_map(|c| COUNTER_NAMES.iter().zip(c))
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                eprintln!(
                    "alltoall {system} N={n} repetition {} (TCP congestion control {cc}): \
                     {secs:.3} s, CPU {:.2} s ({:.2} in the kernel){}{}",
                    rep + 1,
                    cpu.total,
                    cpu.kernel,
                    if said.is_empty() {
                        ""
                    } else {
                        "; all processes: "
                    },
                    said.join(", ")
                );
                if json {
                    let mut row = json!({"experiment": "alltoall", "system": system, "hosts": n,
                               "size": size, "rounds": rounds_each, "round": rep,
                               "seconds": secs, "cpu_seconds": cpu.total,
                               "kernel_seconds": cpu.kernel, "placement": "bridge",
                               "tcp_cc": cc});
                    for (k, v) in counters.iter().flat_map(|c| COUNTER_NAMES.iter().zip(c)) {
                        row[*k] = json!(v);
                    }
                    println!("{row}");
                }
                rows.push(Row {
                    hosts: n,
                    system,
                    rep,
                    secs,
                    cpu,
                });
            }
        }
    }
    if !json {
        println!(
            "hosts  system     median s  (per repetition)  vs clink-tcp  vs tcp  CPU s (all)  \
             in the kernel"
        );
        for &n in hosts {
            let of =
                |sys: &'static str| rows.iter().filter(move |r| r.hosts == n && r.system == sys);
            for &system in systems {
                let secs: Vec<f64> = of(system).map(|r| r.secs).collect();
                let cpu: Vec<f64> = of(system).map(|r| r.cpu.total).collect();
                let kernel: Vec<f64> = of(system).map(|r| r.cpu.kernel).collect();
                // Per-repetition ratios against the baselines measured in the same
                // repetition, then their median (a ratio > 1: faster than the baseline).
                let ratio = |base: &'static str| {
                    let t = |s: &'static str, k| of(s).find(|r| r.rep == k).map(|r| r.secs);
                    let r: Vec<f64> = (0..reps)
                        .filter_map(|k| Some(t(base, k)? / t(system, k)?))
                        .collect();
                    median(&r).map_or("-".into(), |r| format!("{r:.2}x"))
                };
                let per: Vec<String> = secs.iter().map(|x| format!("{x:.2}")).collect();
                println!(
                    "{n:>5}  {system:<9}  {:>8.3}  ({})  {:>11}  {:>6}  {:>11.2}  {:.2}",
                    median(&secs).unwrap_or(f64::NAN),
                    per.join(" "),
                    ratio("clink-tcp"),
                    ratio("tcp"),
                    median(&cpu).unwrap_or(f64::NAN),
                    median(&kernel).unwrap_or(f64::NAN)
                );
            }
        }
    }
    Ok(())
}

/// The systems `--systems` names (`clink` is `clink-udp`), in [`SYSTEMS`]' order; all
/// of them without it.
pub fn systems(asked: Option<&[String]>) -> Result<Vec<&'static str>, String> {
    let Some(asked) = asked else {
        return Ok(SYSTEMS.to_vec());
    };
    for a in asked {
        if a != "clink" && !SYSTEMS.contains(&a.as_str()) {
            return Err(format!(
                "--alltoall: no system {a:?} (it runs {})",
                SYSTEMS.join(", ")
            ));
        }
    }
    let named = |s: &str| {
        asked
            .iter()
            .any(|a| a == s || (a == "clink" && s == "clink-udp"))
    };
    Ok(SYSTEMS.into_iter().filter(|s| named(s)).collect())
}

/// The line a clink child prints its endpoint's counters on, before its times.
const COUNTERS_PREFIX: &str = "alltoall-counters ";

/// The counters a clink child reports, in the order it prints them (summed over a run's
/// processes): they say where a run's time went (resends, timer expiries, sleeps, and how
/// much of the bulk data landed in place rather than through the copy path).
const COUNTER_NAMES: [&str; 7] = [
    "retransmissions",
    "timeouts",
    "tail_probes",
    "duplicates_dropped",
    "sleeps",
    "in_place_bytes",
    "copied_bytes",
];

/// One run's figures.
struct Row {
    hosts: usize,
    system: &'static str,
    rep: u64,
    /// The slowest process's seconds.
    secs: f64,
    /// All processes' CPU seconds, and the part of them in the kernel.
    cpu: CpuTimes,
}

/// One run's figures: the slowest child's seconds, all children's CPU times, (clink
/// systems) the sum of their counters ([`COUNTER_NAMES`]) and the hosts' TCP congestion
/// control.
type RunFigures = (f64, CpuTimes, Option<[u64; COUNTER_NAMES.len()]>, String);

/// One run on a fresh bridge of `n` hosts, their TCP congestion control set to `tcp_cc`
/// if given.
fn one_run(
    exe: &Path,
    system: &str,
    n: usize,
    size: usize,
    rounds: u64,
    tcp_cc: Option<&str>,
) -> Result<RunFigures, String> {
    let b = Bridge::create(&BridgeSpec {
        hosts: n,
        ..BridgeSpec::default()
    })
    .map_err(|e| format!("bridge of {n}: {e}"))?;
    if let Some(cc) = tcp_cc {
        b.set_tcp_cc(cc).map_err(|e| e.to_string())?;
    }
    let cc = clink_testbed::tcp_cc(b.ns(0)).map_err(|e| e.to_string())?;
    let dir =
        std::env::temp_dir().join(format!("clink-alltoall-{}-{}", std::process::id(), b.ns(0)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let hosts: Vec<String> = (0..n).map(|i| b.addr(i).to_string()).collect();
    publish(&dir, "hosts", &hosts.join("\n"))?;
    let mut children = Vec::new();
    for rank in 0..n {
        let spec = ChildSpec {
            system: system.to_string(),
            rank,
            n,
            size,
            rounds,
            dir: dir.clone(),
        };
        let mut cmd: Command = b.command(rank, exe);
        cmd.args(["bench", "--alltoall-child", &spec.encode()])
            .env("CLINK_CALIBRATE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if system == "clink-tcp" {
            cmd.env("CLINK_TRANSPORT", "tcp");
        }
        let child =
            super::proc::ChildProc::spawn(&format!("alltoall {system} rank {rank}"), cmd, None)?;
        children.push(child);
    }
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let (mut worst, mut cpu) = (0.0f64, CpuTimes::default());
    let mut counters = (system != "tcp").then_some([0u64; COUNTER_NAMES.len()]);
    for c in &mut children {
        if let Some(sum) = counters.as_mut() {
            let line =
                c.read_prefixed(COUNTERS_PREFIX, "alltoall child", "its counters", deadline)?;
            let got: Vec<u64> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| format!("bad counters {line:?}"))?;
            if got.len() != sum.len() {
                return Err(format!("bad counters {line:?}"));
            }
            for (s, g) in sum.iter_mut().zip(got) {
                *s += g;
            }
        }
        let line = c.read_prefixed("alltoall-seconds ", "alltoall child", "its time", deadline)?;
        let bad = || format!("bad times {line:?}");
        let mut f = line.split_whitespace().map(str::parse::<f64>);
        let (Some(Ok(secs)), Some(Ok(total)), Some(Ok(kernel)), None) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        worst = worst.max(secs);
        cpu.add(CpuTimes { total, kernel });
    }
    for c in &mut children {
        c.wait(deadline)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((worst, cpu, counters, cc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_specs_round_trip_and_bad_ones_are_refused() {
        let s = ChildSpec {
            system: "clink-udp".into(),
            rank: 3,
            n: 8,
            size: 262_144,
            rounds: 100,
            dir: PathBuf::from("/tmp/x,y"),
        };
        assert_eq!(ChildSpec::decode(&s.encode()).unwrap(), s);
        for bad in [
            "",
            "udp,0,2,1,1,/t",
            "tcp,2,2,1,1,/t",
            "tcp,0,2,0,1,/t",
            "tcp,0,x,1,1,/t",
        ] {
            assert!(ChildSpec::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn systems_are_named_as_the_bench_names_them() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(systems(None).unwrap(), SYSTEMS.to_vec());
        assert_eq!(
            systems(Some(&names(&["tcp", "clink"]))).unwrap(),
            ["clink-udp", "tcp"]
        );
        assert_eq!(
            systems(Some(&names(&["clink-tcp"]))).unwrap(),
            ["clink-tcp"]
        );
        assert!(systems(Some(&names(&["ucx"]))).is_err());
    }

    #[test]
    fn contents_depend_on_round_and_pair() {
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 100]);
        fill(&mut a, 1, 2, 3);
        fill(&mut b, 1, 3, 2);
        assert_ne!(a, b);
        assert!(check(&a, 1, 2, 3).is_ok());
        assert!(check(&a, 2, 2, 3).is_err());
        // Damage anywhere is found, in a whole word and in the cut last one.
        for at in [0, 7, 8, 95, 96, 99] {
            let mut d = a.clone();
            d[at] ^= 1;
            assert!(check(&d, 1, 2, 3).is_err(), "byte {at}");
        }
    }
}
