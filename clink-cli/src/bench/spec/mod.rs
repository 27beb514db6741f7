//! `clink bench --placement netns --spec`: the seed's speculative-defragmentation
//! experiments (Kurmann/Rauch/Stricker), clink over UDP across a veth pair.
//!
//! For every round and `--mtu` (default 1500 only) the parent makes a fresh pair of
//! network namespaces ([`clink_testbed::NetnsPair`]), runs an untimed warm-up transfer,
//! then for every experiment and variant one bulk transfer between real processes: the
//! **receiver** in namespace 0 (pinned to CPU 0), one or two **senders** in namespace 1
//! (pinned to CPU 1), all started by the parent as the hidden subcommand
//! [`CHILD_SUBCOMMAND`] ([`run_child`]) with the variant's
//! `CLINK_*` settings in their environment. Each sender streams `--fragments` bulk
//! fragments' worth (default 100 000, `--quick` 5 000; at MTU 1500 a fragment carries
//! 1448 bytes, so 138 messages) of [`MSG_SIZE`]-byte messages, [`WINDOW`] in flight; the
//! receiver keeps two receives posted per sender (with one for all, it would clear one
//! rendezvous at a time and two senders could never interfere), compares every message
//! with the pattern expected for its sender and position (a slice comparison; a mismatch
//! fails the run: an error and a non-zero exit, the rows say `"verified": false`), and
//! reports its endpoint counters ([`clink::Stats`]). Clocks run from the receiver's "go"
//! (sent once every receive is posted) to its last message.
//!
//! # Experiments and variants
//!
//! - `interference` (the seed's Table 1): `clean`; `interfere_100` and
//!   `interfere_10000`: a thread of the sender process sends that many stray datagrams
//!   per 100 000 fragments (random bytes, 64 to 1400 long, from a socket clink does not
//!   know) to the receiver's UDP port, paced by the sender's progress so that they are
//!   spread over the transfer. Its CPU time is not counted in `cpu_s_per_gb`, but it
//!   shares the sender's core. By default the stream arrives on its peer's own connected
//!   socket (`CLINK_UDP_PEER_SOCKETS`) and the strays, from an address clink does not
//!   know, on the main one: the kernel keeps them apart. `interfere_10000_shared`
//!   (`CLINK_UDP_PEER_SOCKETS=0` on the receiver) puts both in the main socket, the
//!   seed's situation: strays interleave with the armed fragments. In
//!   `interfere_10000_steered` (`CLINK_UDP_STEER=1`) flow steering gives the granted
//!   stream a steered socket of its own.
//! - `fallback` (Fig. 6): `normal`; `speculate_off` (`CLINK_UDP_SPECULATE=0` on the
//!   receiver: every fragment by the copy path); `forced_miss` (`CLINK_UDP_FORCE_MISS=1` on
//!   the sender: fragments misordered within each group, so speculation is armed and
//!   misses, until the receiver finds it does not pay and turns it off for a while,
//!   `CLINK_UDP_SPEC_BACKOFF`); `forced_miss_raw` (the same with the backoff off on the
//!   receiver: every fragment lands in another's place and is moved, the cost of a miss).
//! - `two_senders`: `one_sender` (the reference, in the same round, clink's defaults);
//!   `admission_off` (`CLINK_UDP_ADMISSION=off`), `admission` (`implicit`, the default),
//!   both without flow steering (`CLINK_UDP_STEER=0`, the default), and `steered`
//!   (admission control and flow-steered sockets, `CLINK_UDP_STEER=1`); each of the two
//!   senders streams the full `--fragments`, into one receive queue
//!   (`CLINK_UDP_PEER_SOCKETS=0` on the receiver: senders with sockets of their own are
//!   each granted at once).
//! - `loss`: `loss_0`, `loss_0.1`, `loss_1`, `loss_5`: `CLINK_FAULTS=drop=P,seed=N` on the
//!   receiver (percent in the name; `N` = round + 1).
//!
//! # Rows
//!
//! Per run two JSON rows (`--json`, one per line, printed as each run ends), both with
//! `system` `clink-udp`, `transport` `udp`, `mode` `default` (spin, then block), `placement` `netns`, `mtu`,
//! `round`, `experiment`, `variant`, `senders`, `size` (message size), `iterations`
//! (messages received), `fragments` (bulk fragments those messages make, all senders) and
//! `verified`:
//! - `metric` `bandwidth_gbs`: goodput in GB/s (1e9 B/s) in `median` (= `min` = `max`: one
//!   transfer per round), `cpu_s_per_gb`: CPU seconds of the receiver and the senders
//!   during the transfer per GB received;
//! - `metric` `hit_rate`: the fraction of bulk payload bytes that landed in place
//!   ([`clink::Stats::spec_hit_rate`]) in `median`, with the counters behind it (`hits`,
//!   `misses`, `hit_bytes`, `cleanup_bytes`), `granted_hit_rate` (the granted stream's,
//!   [`clink::Stats::granted_hit_rate`], `null` without a grant), the admission counters,
//!   `stray_dropped`, `interfering` (stray datagrams sent), `interferer_cpu_s` (the CPU
//!   seconds of the thread that sent them, on the sender's core, not counted in
//!   `cpu_s_per_gb`), `faults_injected` and the
//!   senders' `retransmissions` and `timeouts`.
//!
//! Without `--json`: a table per MTU and experiment, medians over `--rounds` (which
//! interleave the variants: A B C A B C ...), with each variant's goodput as a multiple
//! of the experiment's reference ([`reference()`]).

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clink::{Config, Context, Endpoint, PeerId, Selector};
use clink_testbed::NetnsPair;
use serde_json::{json, Map, Value};

use super::affinity::{self, CLIENT_CPU, SERVER_CPU};
use super::measure::{process_cpu_secs, thread_cpu_secs};
use super::proc::ChildProc;
use super::stats::median;

mod child;

pub use child::{run_child, ChildArgs};

/// Name of the hidden subcommand the children run as; the CLI routes it to [`run_child`].
pub const CHILD_SUBCOMMAND: &str = "bench-spec-child";

/// The experiments, in the order they run (the `experiment` field).
pub const EXPERIMENTS: &[&str] = &["interference", "fallback", "two_senders", "loss"];

/// The flow-steering variable, set on the receiver and the senders by the variants that
/// name it ("1" for `steered` and `interfere_10000_steered`, "0" for `admission` and
/// `admission_off`).
const STEER: &str = "CLINK_UDP_STEER";

/// Bytes per message.
pub const MSG_SIZE: usize = 1 << 20;
/// Messages each sender keeps in flight.
pub const WINDOW: usize = 16;
/// Bulk fragments per sender and run by default.
pub const FRAGMENTS: u64 = 100_000;
/// Bulk fragments per sender and run with `--quick`.
pub const QUICK_FRAGMENTS: u64 = 5_000;
/// The interference counts are per this many fragments.
const INTERFERE_PER: u64 = 100_000;

const TAG_DATA: u64 = 0x5ec0;
const TAG_HELLO: u64 = 0x5ec1;
const TAG_GO: u64 = 0x5ec2;
const TAG_STOP: u64 = 0x5ec3;
/// Prefix of the receiver's address line.
const ADDR_PREFIX: &str = "clink-spec-addr ";
/// Prefix of a child's result line (one JSON object).
const RESULT_PREFIX: &str = "clink-spec-result ";

/// One configuration of an experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// Experiment name (one of [`EXPERIMENTS`]).
    pub experiment: &'static str,
    /// Variant name (the `variant` field).
    pub name: String,
    /// Sender processes.
    pub senders: usize,
    /// Stray datagrams per 100 000 fragments (sent by the first sender's interferer).
    pub interfere: u64,
    /// `CLINK_*` settings of the receiver.
    pub receiver_env: Vec<(String, String)>,
    /// `CLINK_*` settings of the senders.
    pub sender_env: Vec<(String, String)>,
}

impl Variant {
    fn new(experiment: &'static str, name: &str) -> Variant {
        Variant {
            experiment,
            name: name.to_string(),
            senders: 1,
            interfere: 0,
            receiver_env: Vec::new(),
            sender_env: Vec::new(),
        }
    }

    fn receiver(mut self, k: &str, v: &str) -> Variant {
        self.receiver_env.push((k.to_string(), v.to_string()));
        self
    }

    fn sender(mut self, k: &str, v: &str) -> Variant {
        self.sender_env.push((k.to_string(), v.to_string()));
        self
    }

    fn both(self, k: &str, v: &str) -> Variant {
        self.receiver(k, v).sender(k, v)
    }

    fn senders(mut self, n: usize) -> Variant {
        self.senders = n;
        self
    }
}

/// The variant whose goodput the others of `experiment` are compared with.
pub fn reference(experiment: &str) -> &'static str {
    match experiment {
        "interference" => "clean",
        "fallback" => "speculate_off",
        "two_senders" => "one_sender",
        _ => "loss_0",
    }
}

/// The variants of `experiment` in round `round` (the loss seed follows the round).
pub fn variants(experiment: &str, round: u64) -> Vec<Variant> {
    match experiment {
        "interference" => vec![
            Variant::new("interference", "clean"),
            Variant {
                interfere: 100,
                ..Variant::new("interference", "interfere_100")
            },
            Variant {
                interfere: 10_000,
                ..Variant::new("interference", "interfere_10000")
            },
            // The seed's situation: one socket for the stream and the strays.
            Variant {
                interfere: 10_000,
                ..Variant::new("interference", "interfere_10000_shared")
                    .receiver("CLINK_UDP_PEER_SOCKETS", "0")
            },
            // Flow steering gives the stream a steered socket.
            Variant {
                interfere: 10_000,
                ..Variant::new("interference", "interfere_10000_steered").both(STEER, "1")
            },
        ],
        "fallback" => vec![
            Variant::new("fallback", "normal"),
            Variant::new("fallback", "speculate_off").receiver("CLINK_UDP_SPECULATE", "0"),
            Variant::new("fallback", "forced_miss").sender("CLINK_UDP_FORCE_MISS", "1"),
            Variant::new("fallback", "forced_miss_raw")
                .sender("CLINK_UDP_FORCE_MISS", "1")
                .receiver("CLINK_UDP_SPEC_BACKOFF", "0"),
        ],
        "two_senders" => {
            // One receive queue, as in the seed: with sockets of their own the two
            // streams would not compete (each is granted at once).
            let unsteered = |v: Variant| v.both(STEER, "0").receiver("CLINK_UDP_PEER_SOCKETS", "0");
            vec![
                Variant::new("two_senders", "one_sender"),
                unsteered(
                    Variant::new("two_senders", "admission_off")
                        .senders(2)
                        .both("CLINK_UDP_ADMISSION", "off"),
                ),
                unsteered(
                    Variant::new("two_senders", "admission")
                        .senders(2)
                        .both("CLINK_UDP_ADMISSION", "implicit"),
                ),
                Variant::new("two_senders", "steered")
                    .senders(2)
                    .both("CLINK_UDP_ADMISSION", "implicit")
                    .both(STEER, "1")
                    .receiver("CLINK_UDP_PEER_SOCKETS", "0"),
            ]
        }
        "loss" => [
            ("loss_0", 0.0),
            ("loss_0.1", 0.001),
            ("loss_1", 0.01),
            ("loss_5", 0.05),
        ]
        .iter()
        .map(|&(name, p)| {
            let v = Variant::new("loss", name);
            if p > 0.0 {
                v.receiver("CLINK_FAULTS", &format!("drop={p},seed={}", round + 1))
            } else {
                v
            }
        })
        .collect(),
        _ => Vec::new(),
    }
}

/// Messages per sender for `fragments` fragments of `frag` bytes in messages of `size`.
pub fn message_count(fragments: u64, frag: usize, size: usize) -> u64 {
    let per_msg = size.div_ceil(frag.max(1)) as u64;
    fragments.div_ceil(per_msg).max(1)
}

/// Byte `i` of message pattern `j` (0..3, the message number mod 3) of sender `s`:
/// period 251, so a fragment at the wrong offset, another message's or another sender's
/// bytes all differ.
fn pattern_byte(s: usize, j: u64, i: usize) -> u8 {
    ((i as u64 * 131 + j * 7919 + s as u64 * 104_729 + 17) % 251) as u8
}

/// Message pattern `j` of sender `s`, `size` bytes.
fn pattern(s: usize, j: u64, size: usize) -> Vec<u8> {
    (0..size).map(|i| pattern_byte(s, j, i)).collect()
}

/// What `clink bench --spec` was asked for.
pub struct Opts {
    /// JSON rows on stdout instead of tables.
    pub json: bool,
    /// Pin the receiver to CPU 0 and the senders to CPU 1.
    pub pinned: bool,
    /// Interleaved repetitions.
    pub rounds: u64,
    /// Experiments to run (empty: all).
    pub experiments: Vec<String>,
    /// Veth MTUs.
    pub mtus: Vec<u32>,
    /// Fragments per sender and run.
    pub fragments: u64,
    /// Bound on one run.
    pub timeout: Duration,
}

/// The outcome of one run (one variant in one round), from the children's reports.
#[derive(Debug, Clone)]
struct Measured {
    experiment: &'static str,
    variant: String,
    mtu: u32,
    round: u64,
    senders: usize,
    messages: u64,
    fragments: u64,
    gbps: f64,
    cpu_s_per_gb: f64,
    hit_rate: Option<f64>,
    granted_hit_rate: Option<f64>,
    verified: bool,
    /// The receiver's counters and the senders' sums, copied into the hit-rate row.
    counters: Map<String, Value>,
}

impl Measured {
    /// The two JSON rows of the run.
    fn rows(&self, pinned: bool) -> [Value; 2] {
        let base = json!({
            "system": "clink-udp",
            "transport": "udp",
            "mode": "default",
            "experiment": self.experiment,
            "variant": self.variant,
            "senders": self.senders,
            "size": MSG_SIZE,
            "iterations": self.messages,
            "fragments": self.fragments,
            "reps": 1,
            "pinned": pinned,
            "round": self.round,
            "placement": "netns",
            "mtu": self.mtu,
            "verified": self.verified,
        });
        let with = |extra: Value| {
            let mut row = base.clone();
            if let (Value::Object(r), Value::Object(e)) = (&mut row, extra) {
                r.extend(e);
            }
            row
        };
        // 0.1 MB/s, 0.1 ms per GB; rates to 1e-6 (one fragment in 100 000 shows).
        let (gbps, cpu) = (round(self.gbps, 1e4), round(self.cpu_s_per_gb, 1e4));
        let rate = |r: Option<f64>| r.map(|r| round(r, 1e6));
        let bw = with(json!({
            "metric": "bandwidth_gbs",
            "median": gbps,
            "min": gbps,
            "max": gbps,
            "cpu_s_per_gb": cpu,
        }));
        let hit_rate = rate(self.hit_rate);
        let mut hit = with(json!({
            "metric": "hit_rate",
            "median": hit_rate,
            "min": hit_rate,
            "max": hit_rate,
            "granted_hit_rate": rate(self.granted_hit_rate),
        }));
        if let Value::Object(r) = &mut hit {
            for (k, v) in &self.counters {
                r.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        [bw, hit]
    }
}

/// `x` rounded to `1 / scale`; not finite: `None` (JSON `null`).
fn round(x: f64, scale: f64) -> Option<f64> {
    x.is_finite().then(|| (x * scale).round() / scale)
}

/// Entry point of `clink bench --placement netns --spec`.
pub fn run(opts: Opts) -> Result<(), String> {
    if let Some(why) = clink_testbed::unavailable() {
        return Err(format!("--spec: {why}"));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let fragments = opts.fragments;
    let wanted: Vec<&'static str> = EXPERIMENTS
        .iter()
        .copied()
        .filter(|e| opts.experiments.is_empty() || opts.experiments.iter().any(|o| o == e))
        .collect();
    let say = |line: &str| super::say(opts.json, line);
    say(&format!(
        "clink bench --spec: the seed's speculation experiments, clink over UDP across a veth \
         pair; receiver in namespace 0{}, sender(s) in namespace 1{}; {fragments} bulk \
         fragments per sender and run in messages of {} KiB, {WINDOW} in flight, every \
         message checked",
        if opts.pinned { " on CPU 0" } else { "" },
        if opts.pinned { " on CPU 1" } else { "" },
        MSG_SIZE >> 10
    ));
    say(&super::load_note());
    let mut all: Vec<Measured> = Vec::new();
    let mut errors = Vec::new();
    for round in 0..opts.rounds {
        for &mtu in &opts.mtus {
            let pair = match NetnsPair::create(mtu) {
                Ok(p) => p,
                Err(e) => {
                    errors.push(format!("MTU {mtu}: cannot make the namespace pair: {e}"));
                    continue;
                }
            };
            super::announce_pair(&pair);
            // An untimed warm-up transfer first: the first run in a fresh pair measured
            // up to half the goodput of the same run later (neighbour discovery, cold
            // kernel paths), which would handicap whichever variant comes first.
            let warm = Variant::new("warm_up", "warm_up");
            if let Err(e) = run_variant(&exe, &pair, &warm, QUICK_FRAGMENTS, round, &opts) {
                errors.push(format!("warm-up (round {}, MTU {mtu}): {e}", round + 1));
            }
            for &exp in &wanted {
                for v in variants(exp, round) {
                    eprintln!(
                        "running {exp}/{} (round {}, MTU {mtu}) ...",
                        v.name,
                        round + 1
                    );
                    match run_variant(&exe, &pair, &v, fragments, round, &opts) {
                        Ok(m) => {
                            if !m.verified {
                                errors.push(format!(
                                    "{exp}/{} (round {}, MTU {mtu}): payload check failed: {}",
                                    v.name,
                                    round + 1,
                                    m.counters
                                        .get("first_bad")
                                        .and_then(Value::as_str)
                                        .unwrap_or("?")
                                ));
                            }
                            if opts.json {
                                for row in m.rows(opts.pinned) {
                                    println!("{row}");
                                }
                            }
                            all.push(m);
                        }
                        Err(e) => errors.push(format!(
                            "{exp}/{} (round {}, MTU {mtu}): {e}",
                            v.name,
                            round + 1
                        )),
                    }
                }
            }
            // Dropping the pair deletes both namespaces.
            drop(pair);
        }
    }
    if !opts.json {
        super::print_rounds_note(opts.rounds);
        print!("{}", render_table(&all));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("some runs failed:\n{}", errors.join("\n")))
    }
}

/// A child of one run, placed in namespace `side` with the variant's environment.
fn child_cmd(
    exe: &Path,
    pair: &NetnsPair,
    side: usize,
    env: &[(String, String)],
    args: &[String],
) -> Command {
    let mut cmd = pair.command(side, exe);
    cmd.arg(CHILD_SUBCOMMAND).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The JSON object of a child's result line.
fn read_result(child: &mut ChildProc, deadline: Instant) -> Result<Map<String, Value>, String> {
    let json = child.read_prefixed(RESULT_PREFIX, "it", "a result", deadline)?;
    match serde_json::from_str(&json) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(format!("unreadable result line: {json:?}")),
    }
}

fn num(m: &Map<String, Value>, k: &str) -> f64 {
    m.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn count(m: &Map<String, Value>, k: &str) -> u64 {
    m.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// Runs one variant: the receiver, then the senders; collects and checks their results.
fn run_variant(
    exe: &Path,
    pair: &NetnsPair,
    v: &Variant,
    fragments: u64,
    round: u64,
    opts: &Opts,
) -> Result<Measured, String> {
    let frag = clink::transport::udp::bulk_fragment(pair.mtu() as usize);
    let msgs = message_count(fragments, frag, MSG_SIZE);
    let deadline = Instant::now() + opts.timeout;
    let pin = |cpu: usize| opts.pinned.then_some(cpu);
    let common = |role: &str, cpu: usize| {
        let mut a: Vec<String> = [
            "--role",
            role,
            "--size",
            &MSG_SIZE.to_string(),
            "--count",
            &msgs.to_string(),
            "--timeout-secs",
            &opts.timeout.as_secs().max(1).to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if opts.pinned {
            a.extend(["--cpu".to_string(), cpu.to_string()]);
        }
        a
    };
    let mut args = common("receiver", SERVER_CPU);
    args.extend(["--senders".to_string(), v.senders.to_string()]);
    let mut receiver = ChildProc::spawn(
        "receiver",
        child_cmd(exe, pair, 0, &v.receiver_env, &args),
        pin(SERVER_CPU),
    )?;
    let addr = receiver.read_prefixed(ADDR_PREFIX, "the receiver", "its address", deadline)?;
    let strays = v.interfere * fragments / INTERFERE_PER;
    let mut senders = Vec::new();
    for i in 0..v.senders {
        let mut args = common("sender", CLIENT_CPU);
        args.extend([
            "--addr".to_string(),
            addr.clone(),
            "--index".to_string(),
            i.to_string(),
            "--seed".to_string(),
            (round * 16 + i as u64 + 1).to_string(),
        ]);
        if i == 0 && strays > 0 {
            args.extend(["--interfere".to_string(), strays.to_string()]);
        }
        senders.push(ChildProc::spawn(
            &format!("sender {i}"),
            child_cmd(exe, pair, 1, &v.sender_env, &args),
            pin(CLIENT_CPU),
        )?);
    }
    let rx = read_result(&mut receiver, deadline).map_err(|e| format!("receiver: {e}"))?;
    let mut tx = Vec::new();
    for (i, s) in senders.iter_mut().enumerate() {
        tx.push(read_result(s, deadline).map_err(|e| format!("sender {i}: {e}"))?);
    }
    for s in &mut senders {
        s.wait(deadline)?;
    }
    receiver.wait(deadline)?;
    let bytes = count(&rx, "bytes");
    let secs = num(&rx, "secs");
    let cpu = num(&rx, "cpu_s") + tx.iter().map(|t| num(t, "cpu_s")).sum::<f64>();
    let mut counters = rx.clone();
    for k in [
        "interfering",
        "retransmissions",
        "timeouts",
        "window_cuts",
        "fast_granted",
        "fast_refused",
    ] {
        counters.insert(k.into(), json!(tx.iter().map(|t| count(t, k)).sum::<u64>()));
    }
    let stray_cpu: f64 = tx.iter().map(|t| num(t, "interferer_cpu_s")).sum();
    counters.insert("interferer_cpu_s".into(), json!(stray_cpu));
    for k in [
        "bytes",
        "secs",
        "cpu_s",
        "bad",
        "hit_rate",
        "granted_hit_rate",
    ] {
        counters.remove(k);
    }
    if count(&rx, "bad") == 0 {
        counters.remove("first_bad");
    }
    let opt = |k: &str| rx.get(k).and_then(Value::as_f64);
    Ok(Measured {
        experiment: v.experiment,
        variant: v.name.clone(),
        mtu: pair.mtu(),
        round,
        senders: v.senders,
        messages: msgs * v.senders as u64,
        fragments: msgs * MSG_SIZE.div_ceil(frag) as u64 * v.senders as u64,
        gbps: bytes as f64 / secs / 1e9,
        cpu_s_per_gb: cpu / (bytes as f64 / 1e9),
        hit_rate: opt("hit_rate"),
        granted_hit_rate: opt("granted_hit_rate"),
        // (The receiver returns only once it has every message.)
        verified: count(&rx, "bad") == 0,
        counters,
    })
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.2}%", 100.0 * x))
}

/// The readable report: per MTU and experiment, one line per variant with the medians
/// over rounds.
fn render_table(all: &[Measured]) -> String {
    let mut out = String::new();
    let mut mtus: Vec<u32> = all.iter().map(|m| m.mtu).collect();
    mtus.sort_unstable();
    mtus.dedup();
    for mtu in mtus {
        out.push_str(&format!(
            "== clink-udp across a veth pair, MTU {mtu}: goodput (GB/s), the multiple of the \
             experiment's reference, bulk bytes landed in place, the granted stream's \
             fragments in place, CPU s/GB (receiver + senders) ==\n"
        ));
        for &exp in EXPERIMENTS {
            let of_exp: Vec<&Measured> = all
                .iter()
                .filter(|m| m.mtu == mtu && m.experiment == exp)
                .collect();
            if of_exp.is_empty() {
                continue;
            }
            let mut names: Vec<&str> = Vec::new();
            for m in &of_exp {
                if !names.contains(&m.variant.as_str()) {
                    names.push(&m.variant);
                }
            }
            let med = |name: &str, f: &dyn Fn(&Measured) -> Option<f64>| {
                let v: Vec<f64> = of_exp
                    .iter()
                    .filter(|m| m.variant == name)
                    .filter_map(|m| f(m))
                    .collect();
                median(&v)
            };
            let ref_gbps = med(reference(exp), &|m| Some(m.gbps));
            out.push_str(&format!("{exp} (reference: {})\n", reference(exp)));
            let mut grid = vec![[
                "variant", "GB/s", "x ref", "in place", "granted", "CPU s/GB", "notes",
            ]
            .map(String::from)
            .to_vec()];
            for name in names {
                let gbps = med(name, &|m| Some(m.gbps));
                let ratio = match (gbps, ref_gbps) {
                    (Some(g), Some(r)) if r > 0.0 => format!("{:.2}", g / r),
                    _ => "-".into(),
                };
                let c = |k: &str| med(name, &|m| m.counters.get(k).and_then(Value::as_f64));
                let mut notes = Vec::new();
                if of_exp.iter().any(|m| m.variant == name && !m.verified) {
                    notes.push("PAYLOAD CHECK FAILED".to_string());
                }
                for (k, label) in [
                    ("interfering", "strays sent"),
                    ("faults_injected", "faults"),
                    ("retransmissions", "retransmitted"),
                ] {
                    if let Some(x) = c(k).filter(|&x| x >= 0.5) {
                        notes.push(format!("{x:.0} {label}"));
                    }
                }
                grid.push(vec![
                    name.to_string(),
                    gbps.map_or("-".into(), |g| format!("{g:.3}")),
                    ratio,
                    pct(med(name, &|m| m.hit_rate)),
                    pct(med(name, &|m| m.granted_hit_rate)),
                    med(name, &|m| Some(m.cpu_s_per_gb)).map_or("-".into(), |c| format!("{c:.2}")),
                    notes.join(", "),
                ]);
            }
            // The variant and the notes left-aligned, the figures right-aligned.
            out.push_str(&super::report::format_grid(&grid, "  ", |i, n| {
                i == 0 || i + 1 == n
            }));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_experiment_has_its_reference_and_distinct_variants() {
        for &exp in EXPERIMENTS {
            let vs = variants(exp, 0);
            assert!(vs.iter().any(|v| v.name == reference(exp)), "{exp}");
            for v in &vs {
                assert_eq!(v.experiment, exp);
                assert_eq!(vs.iter().filter(|w| w.name == v.name).count(), 1);
                for (k, _) in v.receiver_env.iter().chain(&v.sender_env) {
                    assert!(
                        clink::config::VARIABLES.iter().any(|(n, _)| n == k),
                        "{k} is not a clink variable"
                    );
                }
            }
        }
        let loss = variants("loss", 2);
        let names: Vec<&str> = loss.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["loss_0", "loss_0.1", "loss_1", "loss_5"]);
        assert_eq!(
            loss[2].receiver_env,
            vec![("CLINK_FAULTS".to_string(), "drop=0.01,seed=3".to_string())]
        );
        assert!(loss[0].receiver_env.is_empty());
        let two = variants("two_senders", 0);
        assert_eq!(two.iter().filter(|v| v.senders == 2).count() + 1, two.len());
        let steered = two.iter().find(|v| v.name == "steered").expect("steered");
        assert!(steered.receiver_env.contains(&(STEER.into(), "1".into())));
        assert!(two[2].sender_env.contains(&(STEER.into(), "0".into())));
        let f = variants("fallback", 0);
        assert_eq!(
            f[2].sender_env,
            vec![("CLINK_UDP_FORCE_MISS".to_string(), "1".to_string())]
        );
        assert_eq!(f[3].sender_env, f[2].sender_env);
        assert_eq!(
            f[3].receiver_env,
            vec![("CLINK_UDP_SPEC_BACKOFF".to_string(), "0".to_string())]
        );
    }

    #[test]
    fn message_counts_cover_the_fragments() {
        // MTU 1500: 1448-byte fragments, 725 per MiB.
        assert_eq!(message_count(100_000, 1448, 1 << 20), 138);
        assert_eq!(message_count(5_000, 1448, 1 << 20), 7);
        assert_eq!(message_count(1, 1448, 1 << 20), 1);
        assert_eq!(clink::transport::udp::bulk_fragment(1500), 1448);
        assert_eq!(clink::transport::udp::mtu_payload(1500), 1408);
    }

    #[test]
    fn patterns_differ_by_sender_message_and_offset() {
        let a = pattern(0, 0, 4096);
        assert_ne!(a, pattern(1, 0, 4096));
        assert_ne!(a, pattern(0, 1, 4096));
        // A fragment one place off (1448 bytes) does not match.
        assert_ne!(a[..1448], a[1448..2896]);
    }

    fn measured(variant: &str, gbps: f64, round: u64) -> Measured {
        let mut counters = Map::new();
        counters.insert("retransmissions".into(), json!(3));
        Measured {
            experiment: "loss",
            variant: variant.into(),
            mtu: 1500,
            round,
            senders: 1,
            messages: 7,
            fragments: 5215,
            gbps,
            cpu_s_per_gb: 1.5,
            hit_rate: Some(0.995),
            granted_hit_rate: None,
            verified: true,
            counters,
        }
    }

    #[test]
    fn rows_and_table() {
        let m = measured("loss_1", 1.0, 0);
        let [bw, hit] = m.rows(true);
        assert_eq!(bw["metric"], "bandwidth_gbs");
        assert_eq!(bw["cpu_s_per_gb"], 1.5);
        assert_eq!(hit["metric"], "hit_rate");
        assert_eq!(hit["median"], 0.995);
        assert!(hit["granted_hit_rate"].is_null());
        assert_eq!(hit["retransmissions"], 3);
        for row in [&bw, &hit] {
            for k in [
                "system",
                "experiment",
                "variant",
                "placement",
                "mtu",
                "round",
                "verified",
            ] {
                assert!(row.get(k).is_some(), "{k} missing in {row}");
            }
            assert_eq!(row["system"], "clink-udp");
        }
        let all = vec![
            measured("loss_0", 2.0, 0),
            m,
            measured("loss_0", 4.0, 1),
            measured("loss_1", 1.5, 1),
        ];
        let text = render_table(&all);
        assert!(text.contains("loss (reference: loss_0)"), "{text}");
        // Medians: loss_0 3.0, loss_1 1.25, so 0.42x.
        assert!(text.contains("3.000"), "{text}");
        assert!(text.contains("0.42"), "{text}");
        assert!(text.contains("99.50%"), "{text}");
        assert!(text.contains("3 retransmitted"), "{text}");
    }
}
