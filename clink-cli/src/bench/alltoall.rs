//! `clink bench --alltoall`: the traffic of collectives (all-to-all, allgather) and of
//! servers with many clients. N hosts on one bridge ([`clink_testbed::Bridge`]), one
//! process per host; every round, every process sends a message of `--bw-sizes` (default
//! 256 KiB) to every other and receives one from each, contents checked; the row is the
//! slowest process's time for all rounds. Systems: clink over UDP (`clink-udp`), clink
//! over TCP (`clink-tcp`), and kernel TCP (`tcp`: one connection per pair, each round's
//! sends and receives on a thread per peer so that no pair waits on another).
//!
//! The processes find each other through files in a fresh directory (every namespace
//! sees the same filesystem): each writes its address, then reads the others'.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clink::{Context, Endpoint, PeerId, Selector};
use clink_testbed::{Bridge, BridgeSpec};
use serde_json::json;

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

/// The content of the message `src` sends `dst` in `round`.
fn fill(buf: &mut [u8], round: u64, src: usize, dst: usize) {
    let k = (round << 16 | (src as u64) << 8 | dst as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = (k ^ i as u64).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

fn check(
    buf: &[u8],
    round: u64,
    src: usize,
    dst: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    scratch.resize(buf.len(), 0);
    fill(scratch, round, src, dst);
    if buf == &scratch[..] {
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

/// The child: connects to every other rank, then runs the rounds; prints the seconds.
pub fn run_child(spec_text: &str) -> Result<(), String> {
    let s = ChildSpec::decode(spec_text)?;
    let secs = if s.system == "tcp" {
        tcp_child(&s)?
    } else {
        clink_child(&s)?
    };
    println!("alltoall-seconds {secs}");
    Ok(())
}

fn clink_child(s: &ChildSpec) -> Result<f64, String> {
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
    let mut out: Vec<Vec<u8>> = others.iter().map(|_| vec![0u8; s.size]).collect();
    let mut bufs: Vec<Vec<u8>> = others.iter().map(|_| vec![0u8; s.size]).collect();
    let mut scratch = Vec::new();
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
            let data = std::mem::take(&mut out[k]);
            sends.push((k, ep.isend(peer_of[r].unwrap(), tag, data).map_err(e)?));
        }
        for (k, q) in recvs.iter().enumerate() {
            let got = ep.wait_recv(q, Some(CHILD_TIMEOUT)).map_err(e)?;
            check(&got.buf, round, others[k], s.rank, &mut scratch)?;
            bufs[k] = got.buf;
        }
        for (k, q) in sends {
            ep.wait_send(&q, Some(CHILD_TIMEOUT)).map_err(e)?;
            out[k] = vec![0u8; s.size];
        }
    }
    let secs = t.elapsed().as_secs_f64();
    barrier(s, "done")?;
    drop_endpoint(ep);
    Ok(secs)
}

/// Closes an endpoint after every rank finished (so none sees a peer leave early).
fn drop_endpoint(mut ep: Endpoint) {
    ep.close();
}

fn tcp_child(s: &ChildSpec) -> Result<f64, String> {
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
    let t = Instant::now();
    for round in 0..s.rounds {
        std::thread::scope(|sc| -> Result<(), String> {
            let mut jobs = Vec::new();
            for (r, c) in conns.iter().enumerate() {
                let Some(c) = c else { continue };
                let size = s.size;
                jobs.push(sc.spawn(move || -> Result<(), String> {
                    let mut w = c;
                    let mut msg = vec![0u8; size];
                    fill(&mut msg, round, me, r);
                    w.write_all(&msg).map_err(|e| format!("send to {r}: {e}"))
                }));
                jobs.push(sc.spawn(move || -> Result<(), String> {
                    let mut rd = c;
                    let mut buf = vec![0u8; size];
                    rd.read_exact(&mut buf)
                        .map_err(|e| format!("receive from {r}: {e}"))?;
                    check(&buf, round, r, me, &mut Vec::new())
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
    barrier(s, "done")?;
    Ok(secs)
}

/// The parent: for each host count, round and system, a fresh bridge, one child per
/// host; the row is the slowest child's time.
pub fn run(
    hosts: &[usize],
    size: usize,
    rounds_each: u64,
    reps: u64,
    json: bool,
) -> Result<(), String> {
    if let Some(why) = clink_testbed::unavailable() {
        return Err(format!("--alltoall: {why}"));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut rows: Vec<(usize, String, u64, f64)> = Vec::new();
    super::say(
        json,
        &format!(
            "alltoall: N hosts on a bridge, one process each; {rounds_each} rounds of every \
             process sending {size} B to every other (contents checked); time of the \
             slowest process; {reps} interleaved repetitions"
        ),
    );
    for &n in hosts {
        for rep in 0..reps {
            for system in SYSTEMS {
                let secs = one_run(&exe, system, n, size, rounds_each)?;
                eprintln!(
                    "alltoall {system} N={n} repetition {}: {secs:.3} s",
                    rep + 1
                );
                if json {
                    println!(
                        "{}",
                        json!({"experiment": "alltoall", "system": system, "hosts": n,
                               "size": size, "rounds": rounds_each, "round": rep,
                               "seconds": secs, "placement": "bridge"})
                    );
                }
                rows.push((n, system.to_string(), rep, secs));
            }
        }
    }
    if !json {
        println!("hosts  system     median s  (per repetition)  vs clink-tcp  vs tcp");
        for &n in hosts {
            let med = |sys: &str| {
                let mut v: Vec<f64> = rows
                    .iter()
                    .filter(|r| r.0 == n && r.1 == sys)
                    .map(|r| r.3)
                    .collect();
                v.sort_by(f64::total_cmp);
                (v.get(v.len() / 2).copied().unwrap_or(f64::NAN), v)
            };
            for system in SYSTEMS {
                let (m, v) = med(system);
                // Per-repetition ratios against the baselines measured in the same
                // repetition, then their median (a ratio > 1: faster than the baseline).
                let ratio = |base: &str| {
                    let mut r: Vec<f64> = (0..reps)
                        .filter_map(|k| {
                            let t = |s: &str| {
                                rows.iter()
                                    .find(|r| r.0 == n && r.1 == s && r.2 == k)
                                    .map(|r| r.3)
                            };
                            Some(t(base)? / t(system)?)
                        })
                        .collect();
                    r.sort_by(f64::total_cmp);
                    r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
                };
                let per: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
                println!(
                    "{n:>5}  {system:<9}  {m:>8.3}  ({})  {:.2}x  {:.2}x",
                    per.join(" "),
                    ratio("clink-tcp"),
                    ratio("tcp")
                );
            }
        }
    }
    Ok(())
}

fn one_run(exe: &Path, system: &str, n: usize, size: usize, rounds: u64) -> Result<f64, String> {
    let b = Bridge::create(&BridgeSpec {
        hosts: n,
        ..BridgeSpec::default()
    })
    .map_err(|e| format!("bridge of {n}: {e}"))?;
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
    let mut worst: f64 = 0.0;
    for c in &mut children {
        let line = c.read_prefixed("alltoall-seconds ", "alltoall child", "its time", deadline)?;
        let secs: f64 = line
            .trim()
            .parse()
            .map_err(|_| format!("bad time {line:?}"))?;
        worst = worst.max(secs);
    }
    for c in &mut children {
        c.wait(deadline)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(worst)
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
    fn contents_depend_on_round_and_pair() {
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 100]);
        fill(&mut a, 1, 2, 3);
        fill(&mut b, 1, 3, 2);
        assert_ne!(a, b);
        assert!(check(&a, 1, 2, 3, &mut Vec::new()).is_ok());
        assert!(check(&a, 2, 2, 3, &mut Vec::new()).is_err());
    }
}
