//! `clink cast`: a file streamed to many hosts through a multi-drop chain (Dolly).
//!
//! The source sends the file once, to the first node; every node verifies each chunk,
//! writes it to its file at the chunk's offset and forwards the same buffer to the next
//! node, so the chain pipelines and its rate does not depend on its length.
//!
//! Messages (clink tags, all between neighbours of the chain):
//!
//! * `ROUTE` (down): the chain's addresses and the receiver's place in it, JSON.
//! * `READY` (up): the rest of the chain is connected, or why not, JSON.
//! * `MANIFEST` (down): file size, chunk size, every chunk's BLAKE3 chaining value and
//!   the root hash (size, values and root absent for a stream read from stdin), JSON.
//! * `DATA` (down): a [`HDR`]-byte header (index, offset, length and, for stdin, the
//!   chunk's chaining value) followed by the chunk, forwarded from the buffer it lands in.
//! * `END` (down): size, chunk count and root hash of the whole stream, JSON.
//! * `PROGRESS` (up, relayed to the source): a node's chunk count and busy share, every
//!   [`PROGRESS_EVERY`]; its send also tells the node at once when its upstream
//!   process is gone (the upstream host answers "port unreachable"). After a move, also
//!   the chain's new order (the nodes above learn it on the way).
//! * `BEAT` (down): a few bytes every [`PROGRESS_EVERY`], which tell a node at once when
//!   its next node's process is gone.
//! * `SPLICE` (from a node to the one it takes over as upstream: after its dead next
//!   node, after the node it moves, or a node moved or rejoining at the tail, and back):
//!   the take-over request, answered with the first chunk the answering node lacks.
//! * `MOVE` (down, to a node far behind or, from the source, to a first node that holds
//!   the others back, and from it to its next node): the slow node goes to the tail; its
//!   next node waits for the slow node's upstream to take over.
//! * `ADOPT` (down, relayed to the tail): the chain's new order; the tail takes the moved
//!   node on.
//! * `JOIN` (from a restarted receiver to any receiver, relayed down to the tail): the
//!   restarted receiver's address and node number; the tail takes it on and sends it the
//!   chunks its bitmap lacks.
//! * `REPORT` (up): the reports of this node and of every node after it, and the error
//!   that ended the chain early if one did, JSON.
//! * `ABORT` (down, from a node that failed, before it goes): its number and the error,
//!   JSON; the next node stops too instead of waiting for a splice, and tells its own.
//!
//! A chunk of zeros travels as its header alone ([`FLAG_ZERO`]); a node whose next node
//! is behind forwards from its output file what it no longer holds in memory.

mod bench;
mod hash;
mod job;
mod model;
mod node;
mod source;
mod spawn;

use clap::{Args, Subcommand};
use clink::{Config, Context, Endpoint, PeerId, Selector};
use clink_proto::cast::{bits, unbits, ChunkHeader, Manifest, CHUNK_MAX, CHUNK_MIN, HEADER as HDR};
use serde_json::{json, Value};
use std::os::fd::AsFd;
use std::time::Duration;

/// Tag of the route message.
const T_ROUTE: u64 = 0xca_0001;
/// Tag of the readiness answer.
const T_READY: u64 = 0xca_0002;
/// Tag of the manifest.
const T_MANIFEST: u64 = 0xca_0003;
/// Tag of the chunks.
const T_DATA: u64 = 0xca_0004;
/// Tag of the end-of-stream message.
const T_END: u64 = 0xca_0005;
/// Tag of the reports.
const T_REPORT: u64 = 0xca_0006;

/// Tag of the progress messages (up, relayed to the source).
const T_PROGRESS: u64 = 0xca_0007;
/// Tag of the beats a node sends downstream (they tell it when the next node is gone).
const T_BEAT: u64 = 0xca_0008;
/// Tag of the splice request and its answer.
const T_SPLICE: u64 = 0xca_0009;
/// Tag of the message that moves a slow node to the tail (to it, and from it to the node
/// after it).
const T_MOVE: u64 = 0xca_000a;
/// Tag of the new order, sent down the chain to the tail, which takes the moved node on.
const T_ADOPT: u64 = 0xca_000b;
/// Tag of a receiver's request to rejoin the chain, relayed down to the tail.
const T_JOIN: u64 = 0xca_000c;
/// Tag of the reason a node failed, sent to the node after it before it goes: the cast is
/// over, so that node stops at once instead of waiting for another to take over.
const T_ABORT: u64 = 0xca_000d;
/// How the source starts a receiver on a host unless `--via` says otherwise.
const DEFAULT_VIA: &str = "ssh {host}";
/// How long a node whose upstream died waits for a node before it to take over.
const SPLICE_WAIT: Duration = Duration::from_secs(10);
/// How often a node tells its progress upstream.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// A node that moves nothing for this long says on stderr what it waits for.
const STALL_REPORT: Duration = Duration::from_secs(10);

/// Memory a node may fill with chunks its next node has not taken yet, beyond its two
/// windows of buffers, before it forwards them from its file instead.
const LAG_BYTES: u64 = 16 << 20;
/// Largest manifest accepted: about 490 000 chunks (490 GiB in 1 MiB chunks).
const MANIFEST_MAX: usize = 32 << 20;
/// A manifest's bytes per chunk (a hex chaining value, quoted, and a comma), for the
/// source's check of a file against [`MANIFEST_MAX`] (the rest stays below a KiB).
const MANIFEST_PER_CHUNK: u64 = 67;
/// The chunk size unless told otherwise. A node's chunks in flight (a window of 6 in,
/// 6 out) then stay within a core's cache while each is hashed, written and forwarded;
/// with 4 MiB chunks they streamed from memory, at about 0.7x the rate (`clink cast
/// bench`, BENCHMARKS.md).
const DEFAULT_CHUNK: u64 = 1 << 20;
/// Default chunk size of a chain its links hold back (`--link-rate` below the rate the
/// model gives a relaying host): a smaller unit of store-and-forward kept six shaped
/// receivers nearer the link's rate, where larger chunks cost a processor-bound chain
/// more per byte (BENCHMARKS.md, "clink cast").
const LINK_BOUND_CHUNK: u64 = 256 << 10;
/// How long the set-up of the chain (connections, route, readiness) may take per node.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a failed node waits for its upstream to stop after reporting why.
const REPORT_LINGER: Duration = Duration::from_secs(5);
/// Longest sleep of a waiting loop between looks at its requests.
const POLL_MS: i32 = 50;
/// The largest write a node makes into its output file: a chunk is written in pieces of
/// this size. In a busy chain the kernel's page-cache copy costs more per byte the larger
/// the write (larger writes get larger page-cache folios, the likely cause), though not
/// for a lone writer; of 4, 16 and 64 KiB pieces, 16 KiB did best (BENCHMARKS.md, "clink
/// cast").
const WRITE_PIECE: usize = 16 << 10;

/// `clink cast` arguments.
#[derive(Args, Debug)]
pub struct CastArgs {
    #[command(subcommand)]
    cmd: CastCmd,
}

#[derive(Subcommand, Debug)]
enum CastCmd {
    /// Receives a cast: prints this node's clink address, then stores and forwards.
    Recv(RecvArgs),
    /// Streams a file (or stdin) through a chain of receivers.
    Send(SendArgs),
    /// Runs a cast as one job of a launcher (`mpirun`, `srun`): rank 0 sends the file,
    /// ranks 1 to N receive it, in rank order.
    Job(job::JobArgs),
    /// Casts a file along a chain of bridge hosts, by clink and by a kernel-TCP relay.
    Bench(bench::BenchArgs),
    /// Internal: one host of the kernel-TCP chain of `clink cast bench`.
    #[command(name = "tcp-node", hide = true)]
    TcpNode(bench::TcpNodeArgs),
}

/// `clink cast recv` arguments.
#[derive(Args, Debug)]
pub struct RecvArgs {
    /// File the stream is written to (created or truncated).
    #[arg(long)]
    out: std::path::PathBuf,
    /// Also write the address to this file (written whole, then renamed into place).
    #[arg(long)]
    listen_file: Option<std::path::PathBuf>,
    /// Chunks in flight towards the next node (receive buffers).
    #[arg(long, default_value_t = 6)]
    window: usize,
    /// Prints this node's report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Testing aid: flips a byte of this chunk after writing it and before forwarding it
    /// (the next node must refuse it).
    #[arg(long, hide = true)]
    corrupt_chunk: Option<u64>,
    /// Testing aid: a slow host, pausing this many milliseconds after writing each chunk.
    #[arg(long, hide = true)]
    chunk_pause_ms: Option<u64>,
    /// Fails when a neighbour dies instead of splicing it out.
    #[arg(long)]
    no_repair: bool,
    /// Rejoins the running cast this receiver was part of (after it stopped or was
    /// killed): ADDR is the address of any receiver still in it. The chain's tail takes
    /// this receiver on and sends it only the chunks its bitmap beside `--out` lacks.
    #[arg(long, value_name = "ADDR")]
    rejoin: Option<String>,
}

/// `clink cast send` arguments.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("receivers").required(true).args(["to", "hosts"])))]
pub struct SendArgs {
    /// The file to send, or `-` for stdin.
    file: String,
    /// The receivers' clink addresses (each printed by `clink cast recv`), in chain
    /// order, separated by commas.
    #[arg(long, value_delimiter = ',')]
    to: Vec<String>,
    /// Hosts to start the receivers on, in chain order, separated by commas: on each,
    /// `--via` runs `clink cast recv --out OUT`, and the chain takes the addresses they
    /// print.
    #[arg(long, value_delimiter = ',', requires = "out")]
    hosts: Vec<String>,
    /// With `--hosts`: the command that runs a program on a host, as `sh` words, `{host}`
    /// standing for the host (`srun -N1 -n1 -w {host}`, `ip netns exec {host}`).
    #[arg(long, default_value = DEFAULT_VIA, requires = "hosts")]
    via: String,
    /// With `--hosts`: the receivers' output file, `{host}` standing for the host (for
    /// hosts sharing a file system).
    #[arg(long, requires = "hosts")]
    out: Option<String>,
    /// With `--hosts`: the path of `clink` on the hosts (by default this program's own).
    #[arg(long, requires = "hosts")]
    remote_clink: Option<String>,
    #[command(flatten)]
    stream: StreamArgs,
}

/// How the source streams (`clink cast send` and `clink cast job`).
#[derive(Args, Debug)]
pub struct StreamArgs {
    /// Chunk size in bytes (a power of two from 64 KiB to 64 MiB); by default 1 MiB, or
    /// 256 KiB when `--link-rate` is below what a host's processor could keep up with.
    #[arg(long)]
    chunk: Option<u64>,
    /// Chunks in flight towards the first node.
    #[arg(long, default_value_t = 6)]
    window: usize,
    /// Prints one JSON object per node (the source first) instead of the table.
    #[arg(long)]
    json: bool,
    /// Rate of the links in tc's syntax (`1gbit`), for the model's prediction.
    #[arg(long)]
    link_rate: Option<String>,
    /// Which of clink's network transports carries every hop of the chain: `tcp` (the
    /// default), `udp`, or `any` (each connection's own choice, UDP where both ends offer
    /// it).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    transport: Transport,
}

/// The transport of the chain's hops. TCP by default: on one bridge of namespaces, TCP
/// hops outran UDP hops in eight of ten configurations (2-6 receivers, shaped or not;
/// BENCHMARKS.md, "clink cast").
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// clink over kernel TCP connections.
    Tcp,
    /// clink's UDP transport (bulk fragments received in place).
    Udp,
    /// The addresses as given: each connection picks, UDP where both ends offer it.
    Any,
}

impl Transport {
    /// The key of this transport's item in a clink address, `None` for [`Transport::Any`].
    pub(crate) fn key(self) -> Option<&'static str> {
        match self {
            Transport::Tcp => Some("tcp"),
            Transport::Udp => Some("udp"),
            Transport::Any => None,
        }
    }

    /// `addr` with the other network transports' items left out, so that a connection to
    /// it can only use this one; an error when `addr` does not offer it.
    fn restrict(self, addr: &str) -> Result<String, String> {
        let Some(key) = self.key() else {
            return Ok(addr.to_string());
        };
        let mut a = clink_proto::addr::Address::parse(addr).map_err(|e| e.to_string())?;
        let (keep, drop) = match self {
            Transport::Tcp => (&a.tcp, &mut a.udp),
            _ => (&a.udp, &mut a.tcp),
        };
        if keep.is_empty() {
            return Err(format!(
                "{addr}: offers no {key} transport (is CLINK_{} off on that node?)",
                key.to_uppercase()
            ));
        }
        drop.clear();
        Ok(a.to_string())
    }
}

/// Runs `clink cast`.
pub fn run(args: CastArgs) -> Result<(), String> {
    match args.cmd {
        CastCmd::Recv(a) => node::run(a),
        CastCmd::Send(a) => source::run(a),
        CastCmd::Job(a) => job::run(a),
        CastCmd::Bench(a) => bench::run(a),
        CastCmd::TcpNode(a) => bench::tcp_node(a),
    }
}

/// Connects node `me` (0: the source) to node `to` at `addr` as its new upstream (it
/// waits for one: its upstream died or was moved), and learns the first chunk it lacks.
fn splice(ep: &mut Endpoint, me: usize, to: usize, addr: &str) -> Result<(PeerId, u64), String> {
    let h = hop(to, addr);
    let d = ep
        .connect(addr)
        .map_err(|e| format!("{h}: cannot connect: {e}"))?;
    let m = json!({ "from": me });
    ep.send(d, T_SPLICE, m.to_string().as_bytes())
        .map_err(|e| format!("{h}: {e}"))?;
    let mut buf = vec![0u8; 4096];
    let st = ep
        .recv_timeout(
            Selector::exact(Some(d), T_SPLICE),
            &mut buf,
            Some(SETUP_TIMEOUT),
        )
        .map_err(|e| format!("{h}: no answer: {e}"))?;
    let v: Value = serde_json::from_slice(&buf[..st.len as usize]).unwrap_or(Value::Null);
    let from = v["next_due"]
        .as_u64()
        .ok_or_else(|| format!("{h}: a bad answer"))?;
    Ok((d, from))
}

/// The configuration from the `CLINK_*` variables, without calibration unless
/// `CLINK_CALIBRATE` asks for it (the network path does not use its figures).
fn config() -> Result<Config, String> {
    let mut c = Config::from_env().map_err(|e| format!("configuration: {e}"))?;
    if std::env::var_os("CLINK_CALIBRATE").is_none() {
        c.calibrate = false;
    }
    Ok(c)
}

/// An endpoint of a context with [`config`].
fn endpoint() -> Result<Endpoint, String> {
    let ctx = Context::with_config(config()?).map_err(|e| format!("clink context: {e}"))?;
    ctx.endpoint().map_err(|e| format!("clink endpoint: {e}"))
}

/// The network part of a clink address (`udp=` or else `tcp=`), for messages.
fn short(addr: &str) -> String {
    for key in ["udp=", "tcp="] {
        if let Some(rest) = addr.split(';').find_map(|f| f.strip_prefix(key)) {
            return rest.to_string();
        }
    }
    addr.to_string()
}

/// Name of hop `k` (1-based: hop 1 is source -> node 1) for messages.
fn hop(k: usize, addr: &str) -> String {
    let from = if k == 1 {
        "source".to_string()
    } else {
        format!("node {}", k - 1)
    };
    format!("hop {k} ({from} -> node {k} at {})", short(addr))
}

/// Writes `data` at `off` of `f` in pieces of [`WRITE_PIECE`] bytes.
fn write_in_pieces(f: &std::fs::File, data: &[u8], off: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut at = off;
    for p in data.chunks(WRITE_PIECE) {
        f.write_all_at(p, at)?;
        at += p.len() as u64;
    }
    Ok(())
}

/// Sleeps on the endpoint's fd until something may have arrived, at most [`POLL_MS`].
fn idle(ep: &mut Endpoint) {
    if ep.prepare_wait() {
        let _ = clink::sys::poll_readable(ep.as_fd(), Duration::from_millis(POLL_MS as u64));
        ep.finish_wait();
    }
}

/// Whether `b` is all zeros (64 bytes at a time: the fold vectorises, and a chunk of
/// data stops at its first non-zero block).
fn is_zero(b: &[u8]) -> bool {
    let mut blocks = b.chunks_exact(64);
    blocks.all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
        && blocks.remainder().iter().all(|&x| x == 0)
}

/// Rate in MB/s of `bytes` in `secs`.
fn mbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e6
    } else {
        0.0
    }
}

/// Prints the reports of the chain (the source's first): a table, or JSON lines.
fn print_reports(reports: &[Value], json_out: bool) {
    if json_out {
        for r in reports {
            println!("{r}");
        }
        return;
    }
    println!(
        "{:<8} {:<22} {:>12} {:>7} {:>8} {:>9} {:>9} {:>5} {:>6}  status",
        "node", "address", "bytes", "chunks", "seconds", "MB/s", "model", "busy", "copies"
    );
    for r in reports {
        println!(
            "{:<8} {:<22} {:>12} {:>7} {:>8.2} {:>9.1} {:>9.1} {:>4.0}% {:>6}  {}{}",
            match r["node"].as_u64() {
                Some(0) | None => "source".to_string(),
                Some(n) => n.to_string(),
            },
            r["address"].as_str().unwrap_or("-"),
            r["bytes"].as_u64().unwrap_or(0),
            r["chunks"].as_u64().unwrap_or(0),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["rate_mbps"].as_f64().unwrap_or(0.0),
            r["predicted_mbps"].as_f64().unwrap_or(0.0),
            busy(r) * 100.0,
            r["copies"].as_u64().unwrap_or(0),
            r["status"].as_str().unwrap_or("?"),
            if r["moved_to_tail"] == true {
                " (slow: moved to the tail)"
            } else {
                ""
            },
        );
    }
    // The pace: the slowest host, when all finished.
    if reports.iter().any(|r| r["status"] != "ok") {
        return;
    }
    // Measured: the host busy the largest share of its time (the others wait for it).
    // The model: the host with the lowest predicted rate.
    let name = |r: &Value| match r["node"].as_u64() {
        Some(0) | None => "the source".to_string(),
        Some(n) => format!("node {n}"),
    };
    let busiest = reports.iter().max_by(|a, b| busy(a).total_cmp(&busy(b)));
    let slowest = reports.iter().min_by(|a, b| {
        let f = |r: &Value| r["predicted_mbps"].as_f64().unwrap_or(f64::MAX);
        f(a).total_cmp(&f(b))
    });
    if let (Some(b), Some(s)) = (busiest, slowest) {
        println!(
            "pace set by {} (busy {:.0}% of its time); the model names {} ({:.1} MB/s)",
            name(b),
            busy(b) * 100.0,
            name(s),
            s["predicted_mbps"].as_f64().unwrap_or(0.0)
        );
    }
}

/// Share of a host's time spent working rather than waiting.
fn busy(r: &Value) -> f64 {
    let secs = r["seconds"].as_f64().unwrap_or(0.0);
    let b = r["busy_seconds"].as_f64().unwrap_or(0.0);
    if secs > 0.0 {
        (b / secs).min(1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_restricted_to_a_transport_keeps_only_its_items() {
        let a = "clink:host=00000000000000aa;id=0000000000000000000000000000000b;\
                 shm=s1;udp=10.0.0.2:5000,10.1.0.2:5000;tcp=10.0.0.2:6000";
        let id = "host=00000000000000aa;id=0000000000000000000000000000000b;shm=s1";
        assert_eq!(
            Transport::Tcp.restrict(a).unwrap(),
            format!("clink:{id};tcp=10.0.0.2:6000")
        );
        assert_eq!(
            Transport::Udp.restrict(a).unwrap(),
            format!("clink:{id};udp=10.0.0.2:5000,10.1.0.2:5000")
        );
        assert_eq!(Transport::Any.restrict(a).unwrap(), a);
        // The result is an address clink takes.
        clink_proto::addr::Address::parse(&Transport::Tcp.restrict(a).unwrap()).unwrap();
        let udp_only = format!("clink:{id};udp=10.0.0.2:5000");
        let e = Transport::Tcp.restrict(&udp_only).unwrap_err();
        assert!(e.contains("offers no tcp transport"), "{e}");
        assert!(Transport::Udp.restrict("udp=1.2.3.4:5").is_err());
    }

    #[test]
    fn zeros_are_told_from_data_anywhere_in_a_chunk() {
        let mut b = vec![0u8; (1 << 20) + 3];
        assert!(is_zero(&b) && is_zero(&[]));
        for at in [0, 63, 64, 1 << 19, (1 << 20) + 2] {
            b[at] = 1;
            assert!(!is_zero(&b), "a byte at {at}");
            b[at] = 0;
        }
    }
}
