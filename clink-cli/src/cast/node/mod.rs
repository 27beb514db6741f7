//! A receiving node of the chain: stores every chunk and forwards it from the same buffer.

use super::*;
use bytes::Bytes;
use clink::{PeerId, RecvRequest, Selector, SendRequest};
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

mod callers;
mod down;
pub(super) mod moves;
pub(super) mod order;
mod stream;

/// Where a node stands when it stops, for its report.
struct Progress {
    index: usize,
    address: String,
    chunks: u64,
    bytes: u64,
    resumed: u64,
    resumed_bytes: u64,
    total: Option<u64>,
    start: Option<Instant>,
    end: Option<Instant>,
    hash_s: f64,
    write_s: f64,
    idle_s: f64,
    root: Option<String>,
    costs: Option<model::Costs>,
    predicted_bps: f64,
    /// The same without the link's cap: what this host's CPU allows.
    cpu_bps: f64,
    /// Chunks forwarded by reading them back from the output file (the next node was
    /// behind, or replaced a dead one) rather than from the buffer they arrived in.
    from_file: u64,
    /// Chunks the next node still lacked when this one had them all.
    behind_at_end: u64,
    /// When the last chunk arrived, and the longest wait between two (a stall of the
    /// chain before this node: a splice, a slow node).
    last_chunk: Option<Instant>,
    longest_gap_s: f64,
    /// Chunks of zeros (holes), which came as headers alone.
    zero_chunks: u64,
}

impl Progress {
    fn report(&self, status: &str) -> Value {
        let secs = match (self.start, self.end) {
            (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
            (Some(s), None) => s.elapsed().as_secs_f64(),
            _ => 0.0,
        };
        json!({
            "node": self.index,
            "address": short(&self.address),
            "bytes": self.bytes,
            "chunks": self.chunks,
            "chunks_total": self.total,
            "chunks_resumed": self.resumed,
            "seconds": secs,
            "rate_mbps": mbps(self.bytes, secs),
            "hash_seconds": self.hash_s,
            "write_seconds": self.write_s,
            "busy_seconds": (secs - self.idle_s).max(0.0),
            "predicted_mbps": self.predicted_bps / 1e6,
            "cpu_mbps": self.cpu_bps / 1e6,
            "costs": self.costs.map(model::Costs::to_json),
            // Copies of each byte by this program in user space: none (received into
            // the buffer that is hashed, written and forwarded).
            "copies": 0,
            "chunks_from_file": self.from_file,
            "next_behind_at_end": self.behind_at_end,
            "longest_gap_seconds": self.longest_gap_s,
            "zero_chunks": self.zero_chunks,
            "root": self.root,
            "status": status,
        })
    }
}

/// `clink cast recv`.
pub fn run(a: RecvArgs) -> Result<(), String> {
    let ready = Ready::prepare(&a)?;
    let ep = endpoint()?;
    let address = ep.address();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{address}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("printing this node's address: {e}"))?;
    if let Some(f) = &a.listen_file {
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, format!("{address}\n"))
            .and_then(|()| std::fs::rename(&tmp, f))
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    serve(a, ep, ready)
}

/// What a receiver readies before its address is out: its costs (a node busy measuring,
/// tens of milliseconds of hashing, copying and writing, once its upstream neighbour has
/// connected answers nothing meanwhile, and the upstream's timers read that silence as a
/// lost flight) and its output file (a receiver that cannot write is never part of a
/// chain).
pub(super) struct Ready {
    costs: model::Costs,
    file: File,
}

impl Ready {
    pub(super) fn prepare(a: &RecvArgs) -> Result<Ready, String> {
        let costs = model::Costs::measure(Some(&a.out));
        // Not truncated: a bitmap beside it may say which chunks it holds already.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&a.out)
            .map_err(|e| format!("{}: {e}", a.out.display()))?;
        Ok(Ready { costs, file })
    }
}

/// Receives the cast on `ep`, whose address is out: from the upstream that connects (or
/// the chain `--rejoin` names), then reports.
pub(super) fn serve(a: RecvArgs, mut ep: Endpoint, ready: Ready) -> Result<(), String> {
    let Ready { costs, file } = ready;
    let address = ep.address();
    let cpu_at_start = crate::bench::measure::process_cpu_secs();
    let rejoin_as = match &a.rejoin {
        Some(_) => Some(down::bitmap_node(&a.out)?),
        None => None,
    };
    let up = match (&a.rejoin, rejoin_as) {
        (Some(via), Some(node)) => rejoin(&mut ep, via, &address, node)?,
        _ => ep
            .accept(None)
            .map_err(|e| format!("waiting for the upstream node: {e}"))?,
    };
    let mut n = Node {
        ep,
        up,
        down: None,
        down_node: 0,
        down_addr: String::new(),
        file,
        out: a.out.clone(),
        window: a.window.max(1),
        corrupt: a.corrupt_chunk,
        pause: a.chunk_pause_ms.map(Duration::from_millis),
        p: Progress {
            index: 0,
            address,
            chunks: 0,
            bytes: 0,
            resumed: 0,
            resumed_bytes: 0,
            total: None,
            start: None,
            end: None,
            hash_s: 0.0,
            write_s: 0.0,
            idle_s: 0.0,
            root: None,
            costs: Some(costs),
            predicted_bps: 0.0,
            cpu_bps: 0.0,
            from_file: 0,
            behind_at_end: 0,
            last_chunk: None,
            longest_gap_s: 0.0,
            zero_chunks: 0,
        },
        down_reports: Vec::new(),
        bitmap: None,
        skip: Vec::new(),
        next_due: 0,
        addrs: Vec::new(),
        lens: Vec::new(),
        zeros: Vec::new(),
        zero_buf: Vec::new(),
        spliced: Vec::new(),
        repair: !a.no_repair,
        order: order::Order::default(),
        busy: Vec::new(),
        up_node: 0,
        down_from: 0,
        moved_next: false,
        moved: false,
        link_bps: None,
        route: Value::Null,
        manifest: Vec::new(),
        down_has: Vec::new(),
        rejoined: a.rejoin.is_some(),
        own_have: None,
        callers: Vec::new(),
        joins: Vec::new(),
        splices: Vec::new(),
    };
    let r = n.serve();
    let (status, err) = match &r {
        Ok(()) => ("ok".to_string(), None),
        Err(Failure { msg, .. }) => (format!("failed: {msg}"), Some(msg.clone())),
    };
    let mut mine = n.p.report(&status);
    mine["moved_to_tail"] = json!(n.moved);
    mine["rejoined"] = json!(n.rejoined);
    // The network path's recovery work on this node's links (its sends downstream, and
    // the retransmission timeouts of both links).
    let timeouts: u64 = [Some(n.up), n.down]
        .into_iter()
        .flatten()
        .filter_map(|p| n.ep.conn_stats(p).ok().flatten())
        .map(|c| c.timeouts)
        .sum();
    mine["retransmissions"] = json!(n.ep.stats().retransmissions);
    mine["timeouts"] = json!(timeouts);
    // The processor time the cast took here (user and system), from the address out.
    mine["cpu_seconds"] = json!(crate::bench::measure::process_cpu_secs() - cpu_at_start);
    if let (Err(f), Some(d)) = (&r, n.down) {
        // The cast is over: the next node stops now rather than wait for a splice (a
        // while at most: a next node that takes nothing is no reason to hang here).
        let m = json!({ "node": n.p.index, "error": f.msg });
        if let Ok(s) = n.ep.isend(d, T_ABORT, m.to_string().into_bytes()) {
            let _ = n.ep.wait_send(&s, Some(REPORT_LINGER));
        }
    }
    if let Err(Failure { up_alive: true, .. }) | Ok(()) = &r {
        // Upstream learns of this node and of the ones after it.
        let mut all = vec![mine.clone()];
        all.append(&mut n.spliced);
        all.append(&mut n.down_reports);
        let msg = json!({ "nodes": all, "error": err });
        let _ = n.ep.send(n.up, T_REPORT, msg.to_string().as_bytes());
        if r.is_err() {
            // The upstream may still be sending: gone now, this node's unread chunks
            // would make its kernel reset the connection and drop what of the report it
            // had not yet sent (over UDP, the report's resends would end with the
            // process), and the upstream would splice this node out without its reason.
            // It stops on the report; wait for that (for nothing on this tag), a while at
            // most.
            let _ = n.ep.recv_timeout(
                Selector::exact(Some(n.up), T_REPORT),
                &mut [],
                Some(REPORT_LINGER),
            );
        }
    }
    n.ep.close();
    if a.json {
        mine["out"] = json!(a.out.display().to_string());
        // A reader that has gone is no reason to fail a cast that succeeded.
        let _ = writeln!(std::io::stdout(), "{mine}");
    } else {
        eprintln!(
            "clink cast: node {}: {} of {} chunks verified and written ({} bytes) to {}: {status}",
            n.p.index,
            n.p.chunks,
            n.p.total.map_or("?".into(), |t| t.to_string()),
            n.p.bytes,
            a.out.display()
        );
    }
    r.map_err(|f| f.msg)
}

/// Why a node stopped early; `up_alive` when its upstream can still hear of it.
struct Failure {
    msg: String,
    up_alive: bool,
}

/// Node `n` in messages (0: the source).
fn node_name(n: usize) -> String {
    match n {
        0 => "the source".into(),
        n => format!("node {n}"),
    }
}

fn fail_up(msg: String) -> Failure {
    Failure {
        msg,
        up_alive: true,
    }
}

struct Node {
    ep: Endpoint,
    up: PeerId,
    down: Option<PeerId>,
    /// The next node's index in the chain (`index + 1`, more after a splice).
    down_node: usize,
    down_addr: String,
    file: File,
    out: std::path::PathBuf,
    window: usize,
    corrupt: Option<u64>,
    /// A pause after each chunk written (a slow host, for tests).
    pause: Option<Duration>,
    p: Progress,
    down_reports: Vec<Value>,
    /// The `.clinkcast` file beside the output and where its bits start.
    bitmap: Option<(File, u64)>,
    /// Chunks every node holds already (not sent again).
    skip: Vec<bool>,
    /// Index of the next chunk due.
    next_due: u64,
    /// The chain's addresses.
    addrs: Vec<String>,
    /// Length of each chunk written (for a replay to a new next node), and which were
    /// zeros (replayed as headers).
    lens: Vec<u64>,
    zeros: Vec<bool>,
    /// Zeros, the payload a chunk of zeros is checked against.
    zero_buf: Vec<u8>,
    /// Reports of the next nodes that died and were spliced out.
    spliced: Vec<Value>,
    /// Whether a dead neighbour is spliced out.
    repair: bool,
    /// The chain's nodes (their indices) in their current order.
    order: order::Order,
    /// The busy shares the nodes after this one last reported, by index.
    busy: Vec<Option<f64>>,
    /// The upstream node's index (0: the source).
    up_node: usize,
    /// The first chunk the next node lacked when this node took it on (none before it
    /// is forwarded).
    down_from: u64,
    /// This node moved its next node to the tail (at most once).
    moved_next: bool,
    /// This node was moved to the tail.
    moved: bool,
    /// The links' rate, for the model (`--link-rate` at the source).
    link_bps: Option<f64>,
    /// The route and the manifest as received (for a receiver that rejoins at the tail).
    route: Value,
    manifest: Vec<u8>,
    /// The chunks the next node holds already (it rejoined), not forwarded.
    down_has: Vec<bool>,
    /// This node rejoined the cast (`--rejoin`).
    rejoined: bool,
    /// The chunks this node held when it (re)joined, by its bitmap.
    own_have: Option<Vec<bool>>,
    /// Peers that connected while this node streams, until they say why.
    callers: Vec<callers::Caller>,
    /// Requests to rejoin not yet relayed (or, at the tail, taken on).
    joins: Vec<Vec<u8>>,
    /// Requests of nodes to take over as this node's upstream, come before it found its
    /// upstream gone.
    splices: Vec<(PeerId, Vec<u8>)>,
}

impl Node {
    /// Label of the hop into this node.
    fn hop_in(&self) -> String {
        hop(self.p.index, &self.p.address)
    }

    fn upstream_lost(&self, what: &str, e: clink::Error) -> Failure {
        Failure {
            msg: format!(
                "{}: the upstream {} is gone ({what}): {e}; {} chunks verified here",
                self.hop_in(),
                if self.up_node == 0 {
                    "source".to_string()
                } else {
                    format!("node {}", self.up_node)
                },
                self.p.chunks
            ),
            up_alive: false,
        }
    }

    /// The upstream's reason for failing, once its [`T_ABORT`] message has come (looked
    /// at without a progress pass: the stream loop's other receives make those).
    fn upstream_aborted(&mut self, r: &Option<RecvRequest>) -> Option<Failure> {
        let got = self.ep.finish_recv(r.as_ref()?).ok()??;
        let v: Value = serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
        Some(Failure {
            msg: format!(
                "{}: stopped, {} failed: {}",
                self.hop_in(),
                node_name(v["node"].as_u64().unwrap_or(0) as usize),
                v["error"].as_str().unwrap_or("(no reason given)")
            ),
            up_alive: false,
        })
    }

    fn serve(&mut self) -> Result<(), Failure> {
        let route = self.recv_small(T_ROUTE, 1 << 20, "route")?;
        let route: Value = serde_json::from_slice(&route)
            .map_err(|e| fail_up(format!("bad route message: {e}")))?;
        let index = route["index"].as_u64().unwrap_or(0) as usize;
        let addrs: Vec<String> = route["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if index == 0 || index > addrs.len() {
            return Err(fail_up("bad route message: no place for this node".into()));
        }
        self.p.index = index;
        self.up_node = index - 1;
        self.order = order::Order::new(addrs.len());
        self.addrs = addrs.clone();
        let have = self
            .open_bitmap(&route["id"], index)
            .map_err(|e| fail_up(format!("node {index}: {e}")))?;
        if self.rejoined {
            if have.is_none() {
                return Err(fail_up(format!(
                    "node {index}: rejoining a cast from stdin, which cannot resume"
                )));
            }
            self.own_have = have.clone();
        }
        self.route = route.clone();
        self.setup_down(&route, &addrs, have)?;
        self.link_bps = route["link_bps"].as_f64();
        self.predict();
        let man_bytes = self.recv_small(T_MANIFEST, MANIFEST_MAX, "manifest")?;
        let man = Manifest::parse(&man_bytes)
            .map_err(|e| fail_up(format!("node {index}: wrong manifest: {e}")))?;
        self.p.total = man.chunks();
        self.skip = man.skip.clone().unwrap_or_default();
        if let Some(h) = &self.own_have {
            // Rejoined: the tail sends only what this node lacks.
            self.skip = h.clone();
        }
        self.manifest = man_bytes.clone();
        self.advance_due();
        if let Some(d) = self.down {
            self.ep
                .send(d, T_MANIFEST, &man_bytes)
                .map_err(|e| self.down_lost("sending the manifest", e))?;
        }
        self.stream(&man)
    }

    /// The model's rate for this node: it receives, hashes and writes, and forwards when
    /// it has a next node.
    fn predict(&mut self) {
        if let Some(c) = self.p.costs {
            let down = self.down.is_some();
            self.p.predicted_bps = c.predict(true, true, false, true, down, self.link_bps);
            self.p.cpu_bps = c.predict(true, true, false, true, down, None);
        }
    }

    /// A receive of a small control message with `tag` from upstream node `up`.
    fn post_up(&mut self, up: PeerId, tag: u64) -> Result<RecvRequest, Failure> {
        self.ep
            .irecv(Selector::exact(Some(up), tag), vec![0u8; 4096])
            .map_err(|e| self.upstream_lost("posting a receive", e))
    }

    /// Blocking receive of a small message from upstream.
    fn recv_small(&mut self, tag: u64, max: usize, what: &str) -> Result<Vec<u8>, Failure> {
        let mut buf = vec![0u8; max];
        let st = self
            .ep
            .recv_timeout(Selector::exact(Some(self.up), tag), &mut buf, None)
            .map_err(|e| self.upstream_lost(&format!("waiting for the {what}"), e))?;
        buf.truncate(st.len as usize);
        Ok(buf)
    }

    fn next_addr(&self, addrs: &[String]) -> String {
        addrs.get(self.p.index).cloned().unwrap_or_default()
    }
}

/// Asks the chain, through receiver `via`, to take this receiver (node `node`, at
/// `address`) back at its tail, and waits for the tail to connect; asks again every
/// [`JOIN_RETRY`] (a request that met a node splicing past this one's old process is
/// lost), for [`SETUP_TIMEOUT`] at most.
fn rejoin(ep: &mut Endpoint, via: &str, address: &str, node: usize) -> Result<PeerId, String> {
    let ended = "the cast has ended or that receiver has left: cast the file again to resume";
    let n = ep
        .connect(via)
        .map_err(|e| format!("rejoining through {via}: cannot connect ({e}): {ended}"))?;
    let m = json!({ "address": address, "node": node });
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        ep.send(n, T_JOIN, m.to_string().as_bytes())
            .map_err(|e| format!("rejoining through {via}: {e}: {ended}"))?;
        match ep.accept(Some(JOIN_RETRY)) {
            Ok(up) => return Ok(up),
            Err(_) if Instant::now() < deadline => continue,
            Err(e) => {
                return Err(format!(
                    "rejoining through {via}: no tail took node {node} on: {e}"
                ))
            }
        }
    }
}

/// How often a rejoining receiver asks again.
const JOIN_RETRY: Duration = Duration::from_secs(2);

/// The bitmap file of the output `out`: `out.clinkcast`.
fn bitmap_path(out: &std::path::Path) -> std::path::PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".clinkcast");
    p.into()
}
