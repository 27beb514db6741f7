//! The source of the chain: hashes the file into a manifest, then streams it to node 1.

use super::node::moves::STARVED_BUSY;
use super::node::order::Order;
use super::*;
use bytes::Bytes;
use clink::{PeerId, RecvRequest, Selector, SendRequest};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{IsTerminal, Read};
use std::os::unix::fs::FileExt;
use std::time::Instant;

enum Input {
    File(File, u64),
    Stdin(std::io::Stdin),
}

/// Reads up to `buf.len()` bytes at `offset` (a file) or from the stream; short only at
/// the end.
fn fill(input: &mut Input, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = match input {
            Input::File(f, _) => f.read_at(&mut buf[got..], offset + got as u64)?,
            Input::Stdin(s) => s.lock().read(&mut buf[got..])?,
        };
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// The chaining values of the chunks of `f` (`size` bytes in chunks of `chunk`), hashed
/// on every core before the stream starts (the receivers wait for the manifest): each
/// thread takes every `threads`th run of chunks.
fn hash_file(f: &File, size: u64, chunk: u64) -> std::io::Result<Vec<[u8; 32]>> {
    let n = size.div_ceil(chunk) as usize;
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    // Runs of chunks small enough to share the work evenly, large enough to read well.
    const RUN: usize = 8;
    let hashed = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> std::io::Result<Vec<(usize, [u8; 32])>> {
                    let mut out = Vec::new();
                    let mut buf = vec![0u8; chunk as usize];
                    for run in (t..n.div_ceil(RUN)).step_by(threads) {
                        for i in run * RUN..((run + 1) * RUN).min(n) {
                            let off = i as u64 * chunk;
                            let len = chunk.min(size - off) as usize;
                            f.read_exact_at(&mut buf[..len], off)?;
                            out.push((i, hash::chunk_cv(off, &buf[..len])));
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a hashing thread panicked"))
            .collect::<std::io::Result<Vec<_>>>()
    })?;
    let mut cvs = vec![[0u8; 32]; n];
    for (i, cv) in hashed.into_iter().flatten() {
        cvs[i] = cv;
    }
    Ok(cvs)
}

/// Progress on the source's terminal: a bar per host on a TTY, else a line every few
/// seconds.
struct Show {
    bars: Option<(indicatif::MultiProgress, Vec<indicatif::ProgressBar>)>,
    bytes: Vec<u64>,
    total: Option<u64>,
    last: Instant,
    start: Instant,
}

impl Show {
    /// Progress of the source and `nodes` nodes.
    fn new(total: Option<u64>, nodes: usize) -> Show {
        let bars = std::io::stderr().is_terminal().then(|| {
            let m = indicatif::MultiProgress::new();
            let style = indicatif::ProgressStyle::with_template(
                "{prefix:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            let bars = (0..=nodes)
                .map(|i| {
                    let b = m.add(indicatif::ProgressBar::new(total.unwrap_or(0)));
                    b.set_style(style.clone());
                    b.set_prefix(if i == 0 {
                        "source".to_string()
                    } else {
                        format!("node {i}")
                    });
                    b
                })
                .collect();
            (m, bars)
        });
        Show {
            bars,
            bytes: vec![0; nodes + 1],
            total,
            last: Instant::now(),
            start: Instant::now(),
        }
    }

    /// Host `i` (0: the source) is at `bytes`.
    fn set(&mut self, i: usize, bytes: u64) {
        if let Some(b) = self.bytes.get_mut(i) {
            *b = bytes;
        }
        if let Some((_, bars)) = &self.bars {
            if let Some(b) = bars.get(i) {
                if self.total.is_none() {
                    b.set_length(bytes.max(b.length().unwrap_or(0)));
                }
                b.set_position(bytes);
            }
        } else if self.last.elapsed() >= Duration::from_secs(2) {
            self.last = Instant::now();
            let secs = self.start.elapsed().as_secs_f64();
            let nodes: Vec<String> = self.bytes[1..]
                .iter()
                .enumerate()
                .map(|(k, b)| format!("node {} {:.1} MB", k + 1, *b as f64 / 1e6))
                .collect();
            eprintln!(
                "clink cast: {:.1} s: source {:.1} MB sent ({:.1} MB/s); {}",
                secs,
                self.bytes[0] as f64 / 1e6,
                mbps(self.bytes[0], secs),
                nodes.join(", ")
            );
        }
    }

    fn done(&self) {
        if let Some((m, bars)) = &self.bars {
            for b in bars {
                b.finish_and_clear();
            }
            let _ = m.clear();
        }
    }
}

/// The chunk size when none is given: smaller for a chain whose links (`link_bps`) are
/// slower than a relaying host's processor (`relay_cpu`, bytes per second).
fn default_chunk(link_bps: Option<f64>, relay_cpu: f64) -> u64 {
    match link_bps {
        Some(l) if l < relay_cpu => LINK_BOUND_CHUNK,
        _ => DEFAULT_CHUNK,
    }
}

/// `clink cast send`; with `--hosts`, the receivers started first ([`spawn`]).
pub fn run(mut a: SendArgs) -> Result<(), String> {
    if a.hosts.is_empty() {
        return cast(a, None);
    }
    let clink = match &a.remote_clink {
        Some(c) => c.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("this program's path: {e}"))?
            .to_string_lossy()
            .into_owned(),
    };
    let (hosts, via, out) = (a.hosts.clone(), a.via.clone(), a.out.clone());
    let plan = spawn::Plan {
        hosts: &hosts,
        via: &via,
        clink: &clink,
        out: out.as_deref().unwrap_or_default(),
        window: a.stream.window,
    };
    let (receivers, addrs) = plan.start()?;
    a.to = addrs;
    let r = cast(a, None);
    let failed = receivers.finish();
    if r.is_ok() && !failed.is_empty() {
        eprintln!(
            "clink cast: every copy is whole, but the receiver's command failed on {}",
            failed.join(", ")
        );
    }
    r
}

/// Casts the file through the receivers at `a.to`, from `ep` (a new endpoint if none).
pub(super) fn cast(mut a: SendArgs, ep: Option<Endpoint>) -> Result<(), String> {
    let link_bps = match &a.stream.link_rate {
        Some(r) => {
            Some(model::parse_rate(r).ok_or(format!("--link-rate {r}: not a rate such as 1gbit"))?)
        }
        None => None,
    };
    let costs = model::Costs::measure(None);
    // A relaying host hashes, writes, receives and sends every byte.
    let relay_cpu = costs.predict(true, true, false, true, true, None);
    let chunk = a.stream.chunk.unwrap_or(default_chunk(link_bps, relay_cpu));
    if !chunk.is_power_of_two() || !(CHUNK_MIN..=CHUNK_MAX).contains(&chunk) {
        return Err(format!(
            "--chunk {chunk}: a power of two from {CHUNK_MIN} to {CHUNK_MAX} bytes"
        ));
    }
    let mut input = if a.file == "-" {
        Input::Stdin(std::io::stdin())
    } else {
        let f = File::open(&a.file).map_err(|e| format!("{}: {e}", a.file))?;
        let size = f.metadata().map_err(|e| format!("{}: {e}", a.file))?.len();
        if size.div_ceil(chunk) * MANIFEST_PER_CHUNK + 1024 > MANIFEST_MAX as u64 {
            return Err(format!(
                "{}: {size} bytes in chunks of {chunk} make a manifest beyond {MANIFEST_MAX} \
                 bytes; a larger --chunk (a power of two) makes fewer chunks",
                a.file
            ));
        }
        Input::File(f, size)
    };
    // The manifest: a file is hashed whole first (chunk by chunk).
    let mut hash_s = 0.0;
    let mut man = match &mut input {
        Input::Stdin(_) => Manifest {
            size: None,
            chunk,
            cvs: None,
            root: None,
            skip: None,
        },
        Input::File(f, size) => {
            let size = *size;
            let t = Instant::now();
            let cvs = hash_file(f, size, chunk).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    format!("{}: shorter than its size {size}", a.file)
                }
                _ => format!("{}: {e}", a.file),
            })?;
            let single = (size <= chunk).then(|| {
                let mut buf = vec![0u8; size as usize];
                f.read_exact_at(&mut buf, 0).map(|()| blake3::hash(&buf))
            });
            let single = single.transpose().map_err(|e| format!("{}: {e}", a.file))?;
            hash_s = t.elapsed().as_secs_f64();
            let root = hash::root(size, chunk, &cvs)
                .or(single)
                .unwrap_or_else(|| blake3::hash(b""));
            Manifest {
                size: Some(size),
                chunk,
                cvs: Some(cvs),
                root: Some(*root.as_bytes()),
                skip: None,
            }
        }
    };
    // Every node connects to the next through the route's addresses: restricted here,
    // they carry the chain's transport to every hop (and to a splice).
    a.to =
        a.to.iter()
            .map(|addr| a.stream.transport.restrict(addr))
            .collect::<Result<_, _>>()?;
    let mut ep = match ep {
        Some(ep) => ep,
        None => endpoint()?,
    };
    let first = &a.to[0];
    let h1 = hop(1, first);
    let down = ep
        .connect(first)
        .map_err(|e| format!("{h1}: cannot connect: {e}"))?;
    let predicted = costs.predict(man.cvs.is_none(), false, true, false, true, link_bps);
    let cpu = costs.predict(man.cvs.is_none(), false, true, false, true, None);
    let route = json!({ "index": 1, "nodes": a.to, "link_bps": link_bps, "id": man.id() });
    ep.send(down, T_ROUTE, route.to_string().as_bytes())
        .map_err(|e| format!("{h1}: sending the route: {e}"))?;
    let mut buf = vec![0u8; 1 << 20];
    let ready_timeout = SETUP_TIMEOUT * a.to.len() as u32;
    let st = ep
        .recv_timeout(
            Selector::exact(Some(down), T_READY),
            &mut buf,
            Some(ready_timeout),
        )
        .map_err(|e| format!("{h1}: no readiness answer from node 1: {e}"))?;
    let v: Value = serde_json::from_slice(&buf[..st.len as usize])
        .map_err(|e| format!("{h1}: bad readiness answer: {e}"))?;
    if v["ok"] != true {
        return Err(format!(
            "the chain is not ready: {}",
            v["error"].as_str().unwrap_or("?")
        ));
    }
    // Chunks every node holds from an earlier cast of this file are not sent again.
    if let (Some(have), Some(n)) = (v["have"].as_str().and_then(unbits), man.chunks()) {
        if have.len() as u64 == n && have.iter().any(|&h| h) {
            man.skip = Some(have);
        }
    }
    ep.send(down, T_MANIFEST, &man.to_json())
        .map_err(|e| format!("{h1}: sending the manifest: {e}"))?;

    let mut stream = Stream {
        ep: &mut ep,
        down,
        first: first.clone(),
        first_node: 1,
        downs: vec![down],
        addrs: a.to.clone(),
        order: Order::new(a.to.len()),
        window: a.stream.window.max(1),
        nodes: a.to.len(),
        idle_s: 0.0,
    };
    let t = Instant::now();
    let r = stream.run(&mut input, &man, hash_s);
    let chain_s = t.elapsed().as_secs_f64();
    let idle_s = stream.idle_s;
    // The connections the chunks went out on (more than one when the first node moved).
    let downs = stream.downs.clone();
    let (mut mine, reports, err) = r?;
    let secs = mine["seconds"].as_f64().unwrap_or(0.0);
    mine["busy_seconds"] = json!((secs - idle_s).max(0.0));
    mine["predicted_mbps"] = json!(predicted / 1e6);
    mine["cpu_mbps"] = json!(cpu / 1e6);
    mine["chunk"] = json!(man.chunk);
    mine["costs"] = costs.to_json();
    // From the first chunk to the last node's report.
    mine["chain_seconds"] = json!(chain_s);
    mine["chunks_resumed"] = json!(man
        .skip
        .as_ref()
        .map_or(0, |s| s.iter().filter(|&&x| x).count()));
    mine["retransmissions"] = json!(ep.stats().retransmissions);
    let conns: Vec<_> = downs
        .iter()
        .filter_map(|&d| ep.conn_stats(d).ok().flatten())
        .collect();
    mine["timeouts"] = json!(conns.iter().map(|c| c.timeouts).sum::<u64>());
    let conn = ep.conn_stats(down).ok().flatten();
    // Why the downstream connection resent (over UDP): the peer's NAKs, the losses acks
    // revealed, the timers.
    if let Some(c) = conn {
        mine["recovery"] = json!({
            "naks_received": c.naks_received,
            "lost": c.lost,
            "tail_probes": c.tail_probes,
            "rto_probes": c.rto_probes,
            "spurious_timeouts": c.spurious_timeouts,
            "reprieved": c.reprieved,
            "spurious_cuts": c.spurious_cuts,
            "bulk_discarded": c.bulk_discarded,
        });
    }
    // What the source put on the wire towards the chain, clink's headers and resends
    // included (UDP payloads, or TCP segments' payloads).
    let wire = |f: fn(&Endpoint, PeerId) -> clink::Result<Option<u64>>| {
        downs
            .iter()
            .map(|&d| f(&ep, d).ok().flatten())
            .sum::<Option<u64>>()
    };
    mine["wire_bytes"] = json!(wire(Endpoint::wire_bytes_sent));
    // Of which resent (clink's resends over UDP, the kernel's over TCP).
    mine["wire_bytes_resent"] = json!(wire(Endpoint::wire_bytes_resent));
    ep.close();
    let mut all = vec![mine];
    // A node spliced out that rejoined and finished reports twice: its end counts.
    let rejoined: Vec<Value> = reports
        .iter()
        .filter(|r| r["rejoined"] == true && r["status"] == "ok")
        .map(|r| r["node"].clone())
        .collect();
    all.extend(
        reports
            .into_iter()
            .filter(|r| r["status"] == "ok" || !rejoined.contains(&r["node"])),
    );
    let n_ok = all[1..].iter().filter(|r| r["status"] == "ok").count();
    let mut err = err;
    if err.is_none() {
        if n_ok != a.to.len() {
            let failed: Vec<String> = all[1..]
                .iter()
                .filter(|r| r["status"] != "ok")
                .map(|r| {
                    format!(
                        "node {}: {}",
                        r["node"],
                        r["status"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            err = Some(format!(
                "{} of {} nodes hold the whole file; {}",
                n_ok,
                a.to.len(),
                failed.join("; ")
            ));
        } else if let Some(bad) = all[1..].iter().find(|r| r["root"] != all[0]["root"]) {
            err = Some(format!(
                "node {} reports BLAKE3 {} for the whole stream, the source {}",
                bad["node"], bad["root"], all[0]["root"]
            ));
        }
    }
    if let Some(e) = &err {
        all[0]["status"] = json!(format!("stopped: {e}"));
    }
    print_reports(&all, a.stream.json);
    match err {
        None => {
            if !a.stream.json {
                println!(
                    "{} bytes cast to {} nodes, every chunk verified at every hop; BLAKE3 {}",
                    all[0]["bytes"],
                    a.to.len(),
                    all[0]["root"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        Some(e) => Err(e),
    }
}

struct Stream<'a> {
    ep: &'a mut Endpoint,
    /// The first node: its connection, address and number (node 1 unless it was moved).
    down: PeerId,
    first: String,
    first_node: usize,
    /// Every connection to a first node so far (the chunks went out on these).
    downs: Vec<PeerId>,
    /// Every node's address, by number.
    addrs: Vec<String>,
    /// The chain's order (the nodes tell it after a move).
    order: Order,
    window: usize,
    nodes: usize,
    idle_s: f64,
}

/// How busy (the share of its time not waiting) the first node must be, the others all
/// starved ([`STARVED_BUSY`]) for a second, before the source moves it to the tail: it
/// then holds them to less than a third of what they could take.
const SLOW_FIRST_BUSY: f64 = 0.9;

impl Stream<'_> {
    fn lost(&self, what: &str, e: clink::Error) -> String {
        let n = self.first_node;
        format!(
            "hop 1 (source -> node {n} at {}): node {n} failed ({what}): {e}",
            short(&self.first)
        )
    }

    /// The receives of the first node's report and of its progress messages.
    fn post_down_receives(&mut self) -> Result<(RecvRequest, RecvRequest), String> {
        let mut post = |tag, len| {
            self.ep
                .irecv(Selector::exact(Some(self.down), tag), vec![0u8; len])
                .map_err(|e| self.lost("posting a receive", e))
        };
        Ok((post(T_REPORT, 1 << 20)?, post(T_PROGRESS, 4096)?))
    }

    /// Whether the busy shares the nodes last reported (`busy`, by node number) say
    /// that the first node holds the others back.
    fn first_is_slow(&self, busy: &[Option<f64>]) -> bool {
        let first = self.first_node;
        let others = (1..busy.len()).filter(|&n| n != first);
        self.order.after(first).is_some()
            && busy[first].is_some_and(|b| b >= SLOW_FIRST_BUSY)
            && others
                .map(|n| busy[n])
                .all(|b| b.is_some_and(|b| b <= STARVED_BUSY))
    }

    /// Moves the first node to the tail (as a node moves its next one, `node::moves`):
    /// tells it, and it hands its next node over; splices to that node and tells the
    /// chain the new order (the tail takes the moved node on). Returns the first chunk
    /// the new first node lacks.
    fn move_first(&mut self) -> Result<u64, String> {
        let slow = self.first_node;
        let succ = self.order.after(slow).ok_or("no node after the first")?;
        let order = self.order.with_tail(slow);
        let m = json!({ "order": order.to_json(), "node": slow, "up": 0 });
        self.ep
            .send(self.down, T_MOVE, m.to_string().as_bytes())
            .map_err(|e| self.lost("moving it to the tail", e))?;
        let addr = self.addrs[succ - 1].clone();
        let (d, from) = splice(self.ep, 0, succ, &addr)
            .map_err(|e| format!("moving node {slow} to the tail: {e}"))?;
        let adopt = json!({ "order": order.to_json(), "node": slow });
        (self.down, self.first, self.first_node, self.order) = (d, addr, succ, order);
        self.downs.push(d);
        self.ep
            .send(d, T_ADOPT, adopt.to_string().as_bytes())
            .map_err(|e| self.lost("sending the new order", e))?;
        eprintln!(
            "clink cast: node {slow} holds the others back; moved to the tail (node {succ} \
             first now, from chunk {from})"
        );
        Ok(from)
    }

    /// Streams the chunks, sends the end and collects the chain's reports: the source's
    /// own, the nodes', and the error that ended the chain early if one did.
    fn run(
        &mut self,
        input: &mut Input,
        man: &Manifest,
        hash_s: f64,
    ) -> Result<(Value, Vec<Value>, Option<String>), String> {
        let csize = man.chunk as usize;
        let (mut report_req, progress) = self.post_down_receives()?;
        let mut progress_req = Some(progress);
        let mut sends: VecDeque<(SendRequest, Bytes)> = VecDeque::new();
        let mut free: Vec<Vec<u8>> = Vec::new();
        let mut cvs: Vec<[u8; 32]> = Vec::new();
        let mut single = None;
        let mut sent = 0u64;
        let mut zero_chunks = 0u64;
        let mut index = 0u64;
        let mut eof = false;
        let mut read_s = 0.0;
        let mut stdin_hash_s = 0.0;
        let mut show = Show::new(man.size, self.nodes);
        let start = Instant::now();
        let mut root = None;
        let mut end_at: Option<Instant> = None;
        let mut beat = Instant::now();
        // The nodes' busy shares as they last reported them, by node number; since when
        // the first node has held the others back; whether it was moved (once at most).
        let mut busy: Vec<Option<f64>> = vec![None; self.nodes + 1];
        let mut slow_since: Option<Instant> = None;
        let mut moved = false;
        let v: Value = 'main: loop {
            let mut did = false;
            // Beats tell this side at once when node 1's process is gone (its host
            // answers "port unreachable"), even with nothing else in flight.
            if beat.elapsed() >= PROGRESS_EVERY {
                beat = Instant::now();
                if let Err(e) = self.ep.send(self.down, T_BEAT, b"beat") {
                    if let Ok(Some(got)) = self.ep.test_recv(&report_req) {
                        break 'main serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
                    }
                    show.done();
                    let msg = self.lost("sending a beat", e);
                    let mine = source_report(
                        sent,
                        index,
                        start.elapsed().as_secs_f64(),
                        read_s,
                        hash_s,
                        None,
                    );
                    return Ok((mine, Vec::new(), Some(msg)));
                }
            }
            match self.ep.test_recv(&report_req) {
                Ok(Some(got)) => break serde_json::from_slice(&got.buf).unwrap_or(Value::Null),
                Ok(None) => {}
                Err(e) => {
                    let msg = self.lost("while streaming", e);
                    show.done();
                    let mine = source_report(
                        sent,
                        index,
                        start.elapsed().as_secs_f64(),
                        read_s,
                        hash_s,
                        None,
                    );
                    return Ok((mine, Vec::new(), Some(msg)));
                }
            }
            if let Some(r) = progress_req.take() {
                match self.ep.test_recv(&r) {
                    Ok(Some(got)) => {
                        did = true;
                        let v: Value = serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
                        if let (Some(n), Some(b)) = (v["node"].as_u64(), v["bytes"].as_u64()) {
                            show.set(n as usize, b);
                            if let Some(x) = busy.get_mut(n as usize) {
                                *x = v["busy"].as_f64();
                            }
                        }
                        if let Some(o) = Order::from_json(&v, self.nodes) {
                            self.order = o;
                        }
                        let mut b = got.buf;
                        b.resize(4096, 0);
                        progress_req = Some(
                            self.ep
                                .irecv(Selector::exact(Some(self.down), T_PROGRESS), b)
                                .map_err(|e| self.lost("posting a receive", e))?,
                        );
                    }
                    Ok(None) => progress_req = Some(r),
                    Err(_) => {} // the report or the sends tell why
                }
            }
            while let Some((req, _)) = sends.front() {
                match self.ep.test_send(req) {
                    Ok(true) => {
                        let (_, b) = sends.pop_front().unwrap();
                        if let Ok(m) = b.try_into_mut() {
                            free.push(Vec::from(m));
                        }
                        did = true;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        if let Ok(Some(got)) = self.ep.test_recv(&report_req) {
                            break 'main serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
                        }
                        let msg = self.lost("receiving a chunk", e);
                        show.done();
                        let mine = source_report(
                            sent,
                            index,
                            start.elapsed().as_secs_f64(),
                            read_s,
                            hash_s,
                            None,
                        );
                        return Ok((mine, Vec::new(), Some(msg)));
                    }
                }
            }
            // A first node that holds all the others back for a while goes to the tail
            // (while chunks are still to come: the end has not been sent).
            // (Not from stdin: what the new first node lacks could not be read again.)
            if !moved && root.is_none() && man.size.is_some() && self.first_is_slow(&busy) {
                let since = *slow_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= super::node::moves::MOVE_AFTER {
                    moved = true;
                    let from = self.move_first()?;
                    // What goes again is counted once.
                    sent -= (from..index)
                        .filter(|&i| {
                            man.skip
                                .as_ref()
                                .is_none_or(|s| s.get(i as usize) != Some(&true))
                        })
                        .map(|i| man.chunk_len(i))
                        .sum::<u64>();
                    index = from;
                    eof = false;
                    sends.clear();
                    busy.iter_mut().for_each(|b| *b = None);
                    let _ = self.ep.cancel_recv(&report_req);
                    if let Some(r) = progress_req.take() {
                        let _ = self.ep.cancel_recv(&r);
                    }
                    let (r, p) = self.post_down_receives()?;
                    (report_req, progress_req) = (r, Some(p));
                    did = true;
                }
            } else {
                slow_since = None;
            }
            while !eof && sends.len() < self.window {
                if let Some(sk) = &man.skip {
                    while sk.get(index as usize) == Some(&true) {
                        index += 1;
                    }
                }
                if man.size.is_some_and(|s| index * man.chunk >= s) {
                    eof = true;
                    break;
                }
                let mut buf = free.pop().unwrap_or_default();
                buf.resize(HDR + csize, 0);
                let offset = index * man.chunk;
                let t = Instant::now();
                let n = fill(input, offset, &mut buf[HDR..]).map_err(|e| format!("input: {e}"))?;
                read_s += t.elapsed().as_secs_f64();
                if n == 0 {
                    eof = true;
                    break;
                }
                buf.truncate(HDR + n);
                let hash = match &man.cvs {
                    Some(_) => None,
                    None => {
                        let t = Instant::now();
                        let cv = hash::chunk_cv(offset, &buf[HDR..]);
                        if index == 0 {
                            single = Some(blake3::hash(&buf[HDR..]));
                        }
                        stdin_hash_s += t.elapsed().as_secs_f64();
                        cvs.push(cv);
                        Some(cv)
                    }
                };
                // A chunk of zeros (a sparse file's hole) goes as its header alone.
                let zero = is_zero(&buf[HDR..]);
                if zero {
                    buf.truncate(HDR);
                    zero_chunks += 1;
                }
                ChunkHeader {
                    index,
                    offset,
                    len: n as u64,
                    hash,
                    zero,
                }
                .write(&mut buf[..HDR]);
                let b = Bytes::from(buf);
                let req = self
                    .ep
                    .isend(self.down, T_DATA, b.clone())
                    .map_err(|e| self.lost("sending a chunk", e))?;
                sends.push_back((req, b));
                index += 1;
                sent += n as u64;
                did = true;
                show.set(0, sent);
            }
            if eof && sends.is_empty() && root.is_none() {
                // Everything is out: the end message, then the chain's reports.
                let r = match &man.root {
                    Some(r) => blake3::Hash::from_bytes(*r),
                    None => hash::root(sent, man.chunk, &cvs)
                        .or(single)
                        .unwrap_or_else(|| blake3::hash(b"")),
                };
                let size = man.size.unwrap_or(sent);
                let end = json!({ "size": size, "chunks": index, "root": r.to_hex().to_string() });
                self.ep
                    .send(self.down, T_END, end.to_string().as_bytes())
                    .map_err(|e| self.lost("sending the end", e))?;
                root = Some(r);
                end_at = Some(Instant::now());
                did = true;
            }
            if !did {
                let t = Instant::now();
                idle(self.ep);
                if root.is_none() {
                    self.idle_s += t.elapsed().as_secs_f64();
                }
            }
        };
        show.done();
        let mine = source_report(
            sent,
            index,
            end_at
                .map_or(start.elapsed(), |e| e.duration_since(start))
                .as_secs_f64(),
            read_s,
            hash_s + stdin_hash_s,
            root.as_ref(),
        );
        let mut mine = mine;
        mine["zero_chunks"] = json!(zero_chunks);
        let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
        let err = v["error"].as_str().map(String::from);
        Ok((mine, nodes, err))
    }
}

fn source_report(
    bytes: u64,
    chunks: u64,
    secs: f64,
    read_s: f64,
    hash_s: f64,
    root: Option<&blake3::Hash>,
) -> Value {
    json!({
        "node": 0,
        "address": "source",
        "bytes": bytes,
        "chunks": chunks,
        "chunks_total": chunks,
        "seconds": secs,
        "rate_mbps": mbps(bytes, secs),
        "read_seconds": read_s,
        "hash_seconds": hash_s,
        // The read from the file into the send buffer.
        "copies": 1,
        "root": root.map(|r| r.to_hex().to_string()),
        "status": "ok",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_hashed_on_every_core_gives_the_chunks_values_in_order() {
        // 21 chunks and a bit (runs of 8 shared by the threads), then none at all.
        let chunk = 64 << 10;
        let mut data = vec![0u8; 21 * chunk as usize + 4321];
        let mut x = 7u64;
        for b in data.iter_mut() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (x >> 56) as u8;
        }
        let path = std::env::temp_dir().join(format!("clink-cast-hash-{}", std::process::id()));
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let cvs = hash_file(&f, data.len() as u64, chunk).unwrap();
        let want: Vec<[u8; 32]> = data
            .chunks(chunk as usize)
            .enumerate()
            .map(|(i, c)| hash::chunk_cv(i as u64 * chunk, c))
            .collect();
        assert_eq!(cvs, want);
        let root = hash::root(data.len() as u64, chunk, &cvs).unwrap();
        assert_eq!(root, blake3::hash(&data));
        assert!(hash_file(&f, 0, chunk).unwrap().is_empty());
        // A file shorter than the size it was said to have.
        let short = hash_file(&f, data.len() as u64 + chunk, chunk).unwrap_err();
        assert_eq!(short.kind(), std::io::ErrorKind::UnexpectedEof);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_chain_its_links_hold_back_gets_smaller_chunks() {
        assert_eq!(default_chunk(None, 1e9), DEFAULT_CHUNK);
        assert_eq!(default_chunk(Some(125e6), 1e9), LINK_BOUND_CHUNK);
        assert_eq!(default_chunk(Some(10e9), 1e9), DEFAULT_CHUNK);
    }
}
