//! A receiving node of the chain: stores every chunk and forwards it from the same buffer.

use super::*;
use bytes::Bytes;
use clink::{PeerId, RecvRequest, Selector, SendRequest};
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

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
            "costs": self.costs.map(model::Costs::to_json),
            // Copies of each byte by this program in user space: none (received into
            // the buffer that is hashed, written and forwarded).
            "copies": 0,
            "root": self.root,
            "status": status,
        })
    }
}

/// `clink cast recv`.
pub fn run(a: RecvArgs) -> Result<(), String> {
    let mut ep = endpoint()?;
    let address = ep.address();
    println!("{address}");
    let _ = std::io::stdout().flush();
    if let Some(f) = &a.listen_file {
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, format!("{address}\n"))
            .and_then(|()| std::fs::rename(&tmp, f))
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    // Not truncated: a bitmap beside it may say which chunks it holds already.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&a.out)
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    let up = ep
        .accept(None)
        .map_err(|e| format!("waiting for the upstream node: {e}"))?;
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
            costs: Some(model::Costs::measure(Some(&a.out))),
            predicted_bps: 0.0,
        },
        down_reports: Vec::new(),
        bitmap: None,
        skip: Vec::new(),
        next_due: 0,
        addrs: Vec::new(),
        lens: Vec::new(),
        spliced: Vec::new(),
        repair: !a.no_repair,
    };
    let r = n.serve();
    let (status, err) = match &r {
        Ok(()) => ("ok".to_string(), None),
        Err(Failure { msg, .. }) => (format!("failed: {msg}"), Some(msg.clone())),
    };
    let mut mine = n.p.report(&status);
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
    if let Err(Failure { up_alive: true, .. }) | Ok(()) = &r {
        // Upstream learns of this node and of the ones after it.
        let mut all = vec![mine.clone()];
        all.append(&mut n.spliced);
        all.append(&mut n.down_reports);
        let msg = json!({ "nodes": all, "error": err });
        let _ = n.ep.send(n.up, T_REPORT, msg.to_string().as_bytes());
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
    /// Length of each chunk written (for a replay to a new next node).
    lens: Vec<u64>,
    /// Reports of the next nodes that died and were spliced out.
    spliced: Vec<Value>,
    /// Whether a dead neighbour is spliced out.
    repair: bool,
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
                if self.p.index == 1 {
                    "source".to_string()
                } else {
                    format!("node {}", self.p.index - 1)
                },
                self.p.chunks
            ),
            up_alive: false,
        }
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
        self.addrs = addrs.clone();
        let have = self
            .open_bitmap(&route["id"])
            .map_err(|e| fail_up(format!("node {index}: {e}")))?;
        self.setup_down(&route, &addrs, have)?;
        if let Some(c) = self.p.costs {
            let link = route["link_bps"].as_f64();
            self.p.predicted_bps = c.predict(true, true, false, true, self.down.is_some(), link);
        }
        let man_bytes = self.recv_small(T_MANIFEST, MANIFEST_MAX, "manifest")?;
        let man = Manifest::parse(&man_bytes)
            .map_err(|e| fail_up(format!("node {index}: wrong manifest: {e}")))?;
        self.p.total = man.chunks();
        self.skip = man.skip.clone().unwrap_or_default();
        self.advance_due();
        if let Some(d) = self.down {
            self.ep
                .send(d, T_MANIFEST, &man_bytes)
                .map_err(|e| self.down_lost("sending the manifest", e))?;
        }
        self.stream(&man)
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

    /// The receives of what the next node sends back: its report and its progress.
    fn post_down_receives(&mut self, d: PeerId) -> Result<(RecvRequest, RecvRequest), Failure> {
        let report = self
            .ep
            .irecv(Selector::exact(Some(d), T_REPORT), vec![0u8; 1 << 20])
            .map_err(|e| self.down_lost("posting a receive", e))?;
        let progress = self
            .ep
            .irecv(Selector::exact(Some(d), T_PROGRESS), vec![0u8; 4096])
            .map_err(|e| self.down_lost("posting a receive", e))?;
        Ok((report, progress))
    }

    fn down_lost(&self, what: &str, e: clink::Error) -> Failure {
        fail_up(format!(
            "{}: node {} failed ({what}): {e}",
            hop(self.down_node, &self.down_addr),
            self.down_node
        ))
    }

    /// Connects to the next node, hands it the route and waits for its readiness;
    /// answers upstream either way.
    fn setup_down(
        &mut self,
        route: &Value,
        addrs: &[String],
        have: Option<Vec<bool>>,
    ) -> Result<(), Failure> {
        let index = self.p.index;
        let res = if index == addrs.len() {
            Ok(have)
        } else {
            let addr = self.next_addr(addrs);
            self.down_node = index + 1;
            self.down_addr = addr.clone();
            // What every node holds: this one's chunks and the rest of the chain's.
            self.connect_down(route, &addr)
                .map(|theirs| match (have, theirs) {
                    (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| *x && *y).collect()),
                    _ => None,
                })
        };
        let answer = match &res {
            Ok(have) => json!({ "ok": true, "have": have.as_ref().map(|h| bits(h)) }),
            Err(e) => json!({ "ok": false, "error": e }),
        };
        self.ep
            .send(self.up, T_READY, answer.to_string().as_bytes())
            .map_err(|e| self.upstream_lost("answering readiness", e))?;
        res.map(|_| ()).map_err(fail_up)
    }

    /// Opens (or starts) the bitmap of the chunks this node holds for the file `id`
    /// (size, chunk size, root hash; null for a stream from stdin, which is not resumed);
    /// returns the chunks held. A bitmap of another file, or none, empties the output.
    fn open_bitmap(&mut self, id: &Value) -> Result<Option<Vec<bool>>, String> {
        let path = bitmap_path(&self.out);
        let n = match (id["size"].as_u64(), id["chunk"].as_u64()) {
            (Some(s), Some(c)) if c > 0 && !id["root"].is_null() => s.div_ceil(c) as usize,
            _ => {
                let _ = std::fs::remove_file(&path);
                self.file
                    .set_len(0)
                    .map_err(|e| format!("{}: {e}", self.out.display()))?;
                return Ok(None);
            }
        };
        let head = format!("{id}\n");
        let mut have = None;
        if let Ok(b) = std::fs::read(&path) {
            if b.len() == head.len() + n && b.starts_with(head.as_bytes()) {
                have = Some(
                    b[head.len()..]
                        .iter()
                        .map(|&c| c == b'1')
                        .collect::<Vec<_>>(),
                );
            }
        }
        let write = |have: &[bool]| -> std::io::Result<File> {
            let mut b = head.clone().into_bytes();
            b.extend(have.iter().map(|&h| if h { b'1' } else { b'0' }));
            std::fs::write(&path, &b)?;
            std::fs::OpenOptions::new().write(true).open(&path)
        };
        let have = match have {
            Some(h) => h,
            None => {
                self.file
                    .set_len(0)
                    .map_err(|e| format!("{}: {e}", self.out.display()))?;
                vec![false; n]
            }
        };
        let f = write(&have).map_err(|e| format!("{}: {e}", path.display()))?;
        self.bitmap = Some((f, head.len() as u64));
        Ok(Some(have))
    }

    fn connect_down(&mut self, route: &Value, addr: &str) -> Result<Option<Vec<bool>>, String> {
        let index = self.p.index;
        let h = hop(index + 1, addr);
        let d = self
            .ep
            .connect(addr)
            .map_err(|e| format!("{h}: cannot connect: {e}"))?;
        self.down = Some(d);
        let mut r = route.clone();
        r["index"] = json!(index + 1);
        self.ep
            .send(d, T_ROUTE, r.to_string().as_bytes())
            .map_err(|e| format!("{h}: sending the route: {e}"))?;
        let mut buf = vec![0u8; 1 << 20];
        let st = self
            .ep
            .recv_timeout(
                Selector::exact(Some(d), T_READY),
                &mut buf,
                Some(SETUP_TIMEOUT),
            )
            .map_err(|e| format!("{h}: no answer from node {}: {e}", index + 1))?;
        let v: Value = serde_json::from_slice(&buf[..st.len as usize])
            .map_err(|e| format!("{h}: bad readiness answer: {e}"))?;
        if v["ok"] == true {
            Ok(v["have"].as_str().map(unbits))
        } else {
            Err(v["error"].as_str().unwrap_or("not ready").to_string())
        }
    }

    /// Receives, verifies, writes and forwards every chunk.
    fn stream(&mut self, man: &Manifest) -> Result<(), Failure> {
        let mut up = self.up;
        let cap = HDR + man.chunk as usize;
        let mut data_sel = Selector::exact(Some(up), T_DATA);
        // A neighbour lost (what was being done, the error), handled at the top of the
        // loop: spliced out when it can be, else the end of this node's cast.
        let mut lost_up: Option<(&str, clink::Error)> = None;
        let mut lost_down: Option<(&str, clink::Error)> = None;
        // Chunks to send again to a new next node: from, until (exclusive).
        let mut replay: Option<(u64, u64)> = None;
        let mut end_bytes_sent: Option<Vec<u8>> = None;
        let mut resend_end = false;
        let mut beat_req = Some(
            self.ep
                .irecv(Selector::exact(Some(up), T_BEAT), vec![0u8; 64])
                .map_err(|e| self.upstream_lost("posting a receive", e))?,
        );
        let mut posted: VecDeque<RecvRequest> = VecDeque::new();
        let mut sends: VecDeque<(SendRequest, Bytes)> = VecDeque::new();
        let mut free: Vec<Vec<u8>> = Vec::new();
        let mut n_posted = 0u64;
        let mut total = man.chunks();
        // Chunks every node holds are not sent.
        let skipped = self.skip.iter().filter(|&&s| s).count() as u64;
        self.p.resumed = skipped;
        if let (Some(c), Some(s)) = (&man.cvs, man.size) {
            self.p.resumed_bytes = (0..c.len() as u64)
                .filter(|&i| self.skip.get(i as usize) == Some(&true))
                .map(|i| man.chunk.min(s - i * man.chunk))
                .sum();
        }
        let mut to_recv = total.map(|t| t - skipped);
        let mut end_req = Some(
            self.ep
                .irecv(Selector::exact(Some(up), T_END), vec![0u8; 1 << 16])
                .map_err(|e| self.upstream_lost("posting a receive", e))?,
        );
        let mut end_info: Option<(Value, Vec<u8>)> = None;
        let mut end_done = false;
        let mut report_req = None;
        let mut progress_req = None;
        if let Some(d) = self.down {
            let (r, p) = self.post_down_receives(d)?;
            (report_req, progress_req) = (Some(r), Some(p));
        }
        let mut cvs: Vec<[u8; 32]> = Vec::new();
        let mut single_root: Option<blake3::Hash> = None;
        let mut buffers = 0usize;
        let mut beat = Instant::now();
        let mut stalled_since = Instant::now();
        let mut last_moved = (0, 0, None);
        loop {
            let mut did = false;
            if let Some((what, e)) = lost_up.take() {
                // (The source does not splice: node 1 has no one to wait for.)
                if !self.repair || self.p.index == 1 {
                    return Err(self.upstream_lost(what, e));
                }
                let lost = self.upstream_lost(what, e).msg;
                let p = self.await_splice().map_err(|m| Failure {
                    msg: format!("{lost}; {m}"),
                    up_alive: false,
                })?;
                eprintln!(
                    "clink cast: node {}: {lost}; a new upstream took over",
                    self.p.index
                );
                up = p;
                self.up = p;
                data_sel = Selector::exact(Some(p), T_DATA);
                for q in posted.drain(..) {
                    let _ = self.ep.cancel_recv(&q);
                }
                n_posted = self.p.chunks;
                if let Some(r) = end_req.take() {
                    let _ = self.ep.cancel_recv(&r);
                }
                if end_info.is_none() && !end_done {
                    end_req = Some(
                        self.ep
                            .irecv(Selector::exact(Some(p), T_END), vec![0u8; 1 << 16])
                            .map_err(|e| self.upstream_lost("posting a receive", e))?,
                    );
                }
                if let Some(r) = beat_req.take() {
                    let _ = self.ep.cancel_recv(&r);
                }
                beat_req = Some(
                    self.ep
                        .irecv(Selector::exact(Some(p), T_BEAT), vec![0u8; 64])
                        .map_err(|e| self.upstream_lost("posting a receive", e))?,
                );
                continue;
            }
            if let Some((what, e)) = lost_down.take() {
                // A next node that stopped said why before going: an error of its own (no
                // splice), or, after the end, that the rest of the chain is done (it left
                // between its report and a send of this node's: not a death).
                match self.down_report(&report_req) {
                    Some(Err(f)) => return Err(f),
                    Some(Ok(())) if end_done => {
                        report_req = None;
                        continue;
                    }
                    _ => {}
                }
                if !self.repair || self.down_node + 1 > self.addrs.len() {
                    return Err(self.down_lost(what, e));
                }
                let lost = self.down_lost(what, e).msg;
                let (d, from) = self.splice_down(&lost)?;
                eprintln!(
                    "clink cast: node {}: {lost}; spliced to node {}, resending from chunk {from}",
                    self.p.index, self.down_node
                );
                sends.clear();
                let (r, p) = self.post_down_receives(d)?;
                (report_req, progress_req) = (Some(r), Some(p));
                replay = Some((from, self.next_due));
                resend_end = end_bytes_sent.is_some();
                continue;
            }
            // Beats from upstream (they tell the upstream when this node is gone).
            if let Some(r) = &beat_req {
                match self.ep.test_recv(r) {
                    Ok(Some(mut got)) => {
                        got.buf.resize(64, 0);
                        beat_req = self
                            .ep
                            .irecv(Selector::exact(Some(up), T_BEAT), got.buf)
                            .ok();
                    }
                    Ok(None) => {}
                    Err(_) => beat_req = None,
                }
            }
            // A report from downstream: a failure further down, or (after the end) the
            // rest of the chain done.
            if let Some(r) = &report_req {
                match self.ep.test_recv(r) {
                    Ok(Some(got)) => {
                        report_req = None;
                        did = true;
                        self.read_report(&got.buf)?;
                        if !end_done {
                            return Err(fail_up(format!(
                                "node {} reported success before the end of the stream",
                                self.down_node
                            )));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => lost_down = Some(("while streaming", e)),
                }
            }
            // Progress of the nodes downstream, relayed upstream.
            if let (Some(d), Some(r), Some(_)) = (self.down, &progress_req, &report_req) {
                match self.ep.test_recv(r) {
                    Ok(Some(got)) => {
                        did = true;
                        if let Err(e) = self.ep.send(up, T_PROGRESS, &got.buf) {
                            lost_up = Some(("relaying progress", e));
                        }
                        let mut b = got.buf;
                        b.resize(4096, 0);
                        progress_req = Some(
                            self.ep
                                .irecv(Selector::exact(Some(d), T_PROGRESS), b)
                                .map_err(|e| self.down_lost("posting a receive", e))?,
                        );
                    }
                    Ok(None) => {}
                    // A node that has gone is told by its report or by the sends.
                    Err(_) => progress_req = None,
                }
            }
            // This node's progress, which also tells it at once when the upstream
            // process is gone (its host answers "port unreachable").
            if beat.elapsed() >= PROGRESS_EVERY {
                beat = Instant::now();
                let m = json!({
                    "node": self.p.index,
                    "chunks": self.p.chunks,
                    "bytes": self.p.bytes,
                    "total": total,
                });
                if let Err(e) = self.ep.send(up, T_PROGRESS, m.to_string().as_bytes()) {
                    lost_up = Some(("sending progress", e));
                }
                // Not once the next node has reported: it may be gone by now.
                if let (Some(d), Some(_)) = (self.down, &report_req) {
                    if let Err(e) = self.ep.send(d, T_BEAT, b"beat") {
                        lost_down = Some(("sending a beat", e));
                    }
                }
            }
            // Completed sends give their buffers back.
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
                        lost_down = Some(("forwarding a chunk", e));
                        break;
                    }
                }
            }
            if lost_up.is_some() || lost_down.is_some() {
                continue;
            }
            // Chunks sent again to a new next node, from this node's file, before any
            // new one.
            if let (Some((mut i, until)), Some(d)) = (replay, self.down) {
                while i < until && sends.len() < self.window {
                    if self.skip.get(i as usize) == Some(&true) {
                        i += 1;
                        continue;
                    }
                    let len = self.lens[i as usize];
                    let mut buf = free.pop().unwrap_or_default();
                    buf.resize(HDR + len as usize, 0);
                    self.file
                        .read_exact_at(&mut buf[HDR..], i * man.chunk)
                        .map_err(|e| {
                            fail_up(format!(
                                "node {}: reading chunk {i} back from {}: {e}",
                                self.p.index,
                                self.out.display()
                            ))
                        })?;
                    ChunkHdr {
                        index: i,
                        offset: i * man.chunk,
                        len,
                        hash: man.cvs.is_none().then(|| cvs[i as usize]),
                    }
                    .write(&mut buf[..HDR]);
                    let b = Bytes::from(buf);
                    match self.ep.isend(d, T_DATA, b.clone()) {
                        Ok(r) => sends.push_back((r, b)),
                        Err(e) => {
                            lost_down = Some(("resending a chunk", e));
                            break;
                        }
                    }
                    i += 1;
                    did = true;
                }
                replay = (i < until).then_some((i, until));
                if replay.is_none() && resend_end {
                    resend_end = false;
                    if let Some(eb) = &end_bytes_sent {
                        if let Err(e) = self.ep.send(d, T_END, eb) {
                            lost_down = Some(("resending the end", e));
                        }
                    }
                }
                if replay.is_some() || lost_down.is_some() {
                    if !did {
                        idle(&mut self.ep);
                    }
                    continue;
                }
            }
            // Receives, up to the window.
            while posted.len() < self.window && to_recv.is_none_or(|t| n_posted < t) {
                let buf = match free.pop() {
                    Some(mut b) => {
                        b.resize(cap, 0);
                        b
                    }
                    None if buffers < self.window * 2 => {
                        buffers += 1;
                        vec![0u8; cap]
                    }
                    None => break,
                };
                let q = self
                    .ep
                    .irecv(data_sel, buf)
                    .map_err(|e| self.upstream_lost("posting a receive", e))?;
                posted.push_back(q);
                n_posted += 1;
            }
            // The oldest receive (matched in posting order).
            if let Some(q) = posted.front() {
                match self.ep.test_recv(q) {
                    Ok(Some(got)) => {
                        posted.pop_front();
                        did = true;
                        let buf = self.chunk(man, got.buf, &mut cvs, &mut single_root)?;
                        match self.down {
                            Some(d) => {
                                let b = Bytes::from(buf);
                                match self.ep.isend(d, T_DATA, b.clone()) {
                                    Ok(r) => sends.push_back((r, b)),
                                    Err(e) => lost_down = Some(("forwarding a chunk", e)),
                                }
                            }
                            None => free.push(buf),
                        }
                    }
                    Ok(None) => {}
                    Err(e) => lost_up = Some(("receiving a chunk", e)),
                }
            }
            if let Some(r) = &end_req {
                match self.ep.test_recv(r) {
                    Ok(Some(got)) => {
                        end_req = None;
                        did = true;
                        let v: Value = serde_json::from_slice(&got.buf).map_err(|e| {
                            fail_up(format!("node {}: bad end message: {e}", self.p.index))
                        })?;
                        let n = v["chunks"].as_u64().unwrap_or(u64::MAX);
                        if let Some(t) = total.filter(|&t| t != n) {
                            return Err(fail_up(format!(
                                "node {}: the end message counts {n} chunks, the manifest {t}",
                                self.p.index
                            )));
                        }
                        total = Some(n);
                        to_recv = Some(n - skipped);
                        self.p.total = total;
                        // Receives posted beyond the end are withdrawn.
                        while n_posted > n {
                            let Some(q) = posted.pop_back() else { break };
                            let _ = self.ep.cancel_recv(&q);
                            n_posted -= 1;
                        }
                        end_info = Some((v, got.buf));
                    }
                    Ok(None) => {}
                    Err(e) => lost_up = Some(("waiting for the end", e)),
                }
            }
            if lost_up.is_some() || lost_down.is_some() {
                continue;
            }
            if !end_done
                && to_recv.is_some_and(|t| self.p.chunks == t)
                && end_info.is_some()
                && sends.is_empty()
            {
                end_done = true;
                did = true;
                let (end, end_bytes) = end_info.take().unwrap();
                self.finish(man, &end, &cvs, single_root)?;
                if let Some(d) = self.down {
                    if let Err(e) = self.ep.send(d, T_END, &end_bytes) {
                        lost_down = Some(("forwarding the end", e));
                    }
                }
                end_bytes_sent = Some(end_bytes);
            }
            if end_done && report_req.is_none() {
                return Ok(());
            }
            // Stalled: no chunk in, none out (beats and progress relays do not count).
            let moved = (self.p.chunks, sends.len(), replay);
            if moved != last_moved {
                last_moved = moved;
                stalled_since = Instant::now();
            } else if stalled_since.elapsed() >= STALL_REPORT {
                stalled_since = Instant::now();
                let conn = |p: Option<PeerId>| {
                    match p.and_then(|p| self.ep.conn_stats(p).ok().flatten()) {
                    Some(c) => format!(
                        "cwnd {}, {} in flight, srtt {} us, rto {} ms, {} retransmitted, {} timeouts, {} duplicates",
                        c.cwnd,
                        c.in_flight,
                        c.srtt_ns / 1000,
                        c.rto_ns / 1_000_000,
                        c.retransmissions,
                        c.timeouts,
                        c.duplicates
                    ),
                    None => "-".to_string(),
                }
                };
                eprintln!(
                    "clink cast: node {}: nothing moved for {STALL_REPORT:?}: {} chunks here, {} receives posted (up to {n_posted}), {} sends in flight, replay {replay:?}, {} free buffers of {buffers}; upstream: {}; downstream: {}",
                    self.p.index,
                    self.p.chunks,
                    posted.len(),
                    sends.len(),
                    free.len(),
                    conn(Some(up)),
                    conn(self.down),
                );
            }
            if !did {
                let t = Instant::now();
                idle(&mut self.ep);
                if self.p.start.is_some() && self.p.end.is_none() {
                    self.p.idle_s += t.elapsed().as_secs_f64();
                }
            }
        }
    }

    /// Moves the next chunk due past the ones every node holds.
    fn advance_due(&mut self) {
        while self.skip.get(self.next_due as usize) == Some(&true) {
            self.next_due += 1;
        }
    }

    /// The next node's report, when it sent one before going: its own reason for
    /// stopping, or success.
    fn down_report(&mut self, report_req: &Option<RecvRequest>) -> Option<Result<(), Failure>> {
        let r = report_req.as_ref()?;
        let got = self.ep.test_recv(r).ok()??;
        Some(self.read_report(&got.buf))
    }

    /// Takes in the next node's report: the nodes below it, and its error if it failed.
    fn read_report(&mut self, buf: &[u8]) -> Result<(), Failure> {
        let v: Value = serde_json::from_slice(buf).unwrap_or(Value::Null);
        self.down_reports = v["nodes"].as_array().cloned().unwrap_or_default();
        match v["error"].as_str() {
            Some(m) => Err(fail_up(m.to_string())),
            None => Ok(()),
        }
    }

    /// Waits for a node before the dead upstream to take its place: answers its splice
    /// request with the next chunk due here.
    fn await_splice(&mut self) -> Result<PeerId, String> {
        let p = self
            .ep
            .accept(Some(SPLICE_WAIT))
            .map_err(|e| format!("no node took over within {SPLICE_WAIT:?}: {e}"))?;
        let mut buf = vec![0u8; 4096];
        self.ep
            .recv_timeout(
                Selector::exact(Some(p), T_SPLICE),
                &mut buf,
                Some(SETUP_TIMEOUT),
            )
            .map_err(|e| format!("no splice request from the new upstream: {e}"))?;
        let m = json!({ "next_due": self.next_due });
        self.ep
            .send(p, T_SPLICE, m.to_string().as_bytes())
            .map_err(|e| format!("answering the new upstream: {e}"))?;
        Ok(p)
    }

    /// Splices the dead next node out: connects to the one after it and learns the
    /// first chunk it lacks; returns the new next node and that chunk.
    fn splice_down(&mut self, lost: &str) -> Result<(PeerId, u64), Failure> {
        let dead = self.down_node;
        let succ = dead + 1;
        let addr = self.addrs[succ - 1].clone();
        let h = hop(succ, &addr);
        let fail = |m: String| fail_up(format!("{lost}; splicing it out: {h}: {m}"));
        let d = self
            .ep
            .connect(&addr)
            .map_err(|e| fail(format!("cannot connect: {e}")))?;
        let m = json!({ "from": self.p.index });
        self.ep
            .send(d, T_SPLICE, m.to_string().as_bytes())
            .map_err(|e| fail(format!("{e}")))?;
        let mut buf = vec![0u8; 4096];
        let st = self
            .ep
            .recv_timeout(
                Selector::exact(Some(d), T_SPLICE),
                &mut buf,
                Some(SETUP_TIMEOUT),
            )
            .map_err(|e| fail(format!("no answer: {e}")))?;
        let v: Value = serde_json::from_slice(&buf[..st.len as usize]).unwrap_or(Value::Null);
        let from = v["next_due"]
            .as_u64()
            .ok_or_else(|| fail("a bad answer".into()))?;
        if from > self.next_due {
            return Err(fail(format!(
                "it holds chunks up to {from}, beyond this node's {}",
                self.next_due
            )));
        }
        self.spliced.push(json!({
            "node": dead,
            "address": short(&self.down_addr),
            "status": format!("failed: {lost}; spliced out (node {} -> node {succ})", self.p.index),
        }));
        self.down = Some(d);
        self.down_node = succ;
        self.down_addr = addr;
        Ok((d, from))
    }

    /// Checks the whole stream against the source's end message: size and root hash.
    fn finish(
        &mut self,
        man: &Manifest,
        end: &Value,
        cvs: &[[u8; 32]],
        single_root: Option<blake3::Hash>,
    ) -> Result<(), Failure> {
        self.p.end = Some(Instant::now());
        let size = end["size"].as_u64().unwrap_or(0);
        if size != self.p.bytes + self.p.resumed_bytes {
            return Err(fail_up(format!(
                "node {}: {} bytes received and {} held from before, the source sent {size}",
                self.p.index, self.p.bytes, self.p.resumed_bytes
            )));
        }
        let cvs = man.cvs.as_deref().unwrap_or(cvs);
        let root = match hash::root(size, man.chunk, cvs) {
            Some(r) => r,
            None => single_root.unwrap_or_else(|| blake3::hash(b"")),
        };
        let want = end["root"].as_str().unwrap_or("");
        self.p.root = Some(root.to_hex().to_string());
        if root.to_hex().as_str() != want {
            return Err(fail_up(format!(
                "node {}: whole-stream BLAKE3 {} differs from the source's {want}",
                self.p.index,
                root.to_hex()
            )));
        }
        // Complete: the output is its size, and no bitmap is needed any more.
        self.file.set_len(size).map_err(|e| {
            fail_up(format!(
                "node {}: {}: {e}",
                self.p.index,
                self.out.display()
            ))
        })?;
        if self.bitmap.take().is_some() {
            let _ = std::fs::remove_file(bitmap_path(&self.out));
        }
        Ok(())
    }

    /// Verifies and writes one chunk; returns the buffer to forward.
    fn chunk(
        &mut self,
        man: &Manifest,
        mut buf: Vec<u8>,
        cvs: &mut Vec<[u8; 32]>,
        single_root: &mut Option<blake3::Hash>,
    ) -> Result<Vec<u8>, Failure> {
        let index = self.p.index;
        let h = ChunkHdr::read(&buf).map_err(|e| fail_up(format!("node {index}: {e}")))?;
        if h.index != self.next_due {
            return Err(fail_up(format!(
                "node {index}: chunk {} arrived where chunk {} was due",
                h.index, self.next_due
            )));
        }
        if h.offset != h.index * man.chunk || h.len > man.chunk {
            return Err(fail_up(format!(
                "node {index}: chunk {} has offset {} and length {}, not its place",
                h.index, h.offset, h.len
            )));
        }
        self.p.start.get_or_insert_with(Instant::now);
        let want = match (&man.cvs, h.hash) {
            (Some(c), _) => *c.get(h.index as usize).ok_or_else(|| {
                fail_up(format!(
                    "node {index}: chunk {} is beyond the manifest's {}",
                    h.index,
                    c.len()
                ))
            })?,
            (None, Some(x)) => x,
            (None, None) => {
                return Err(fail_up(format!(
                    "node {index}: chunk {} carries no hash and the manifest none",
                    h.index
                )))
            }
        };
        let t = Instant::now();
        let payload = &buf[HDR..];
        let got = hash::chunk_cv(h.offset, payload);
        if h.index == 0 && man.size.is_none_or(|s| s <= man.chunk) {
            *single_root = Some(blake3::hash(payload));
        }
        self.p.hash_s += t.elapsed().as_secs_f64();
        if got != want {
            return Err(fail_up(format!(
                "chunk {} failed BLAKE3 verification at {}: the data differs from the source's",
                h.index,
                self.hop_in()
            )));
        }
        let t = Instant::now();
        self.file.write_all_at(payload, h.offset).map_err(|e| {
            fail_up(format!(
                "node {index}: writing chunk {} to {}: {e}",
                h.index,
                self.out.display()
            ))
        })?;
        self.p.write_s += t.elapsed().as_secs_f64();
        if self.lens.len() <= h.index as usize {
            self.lens.resize(h.index as usize + 1, 0);
        }
        self.lens[h.index as usize] = h.len;
        if let Some((f, at)) = &self.bitmap {
            f.write_all_at(b"1", at + h.index).map_err(|e| {
                fail_up(format!(
                    "node {index}: {}: {e}",
                    bitmap_path(&self.out).display()
                ))
            })?;
        }
        if man.cvs.is_none() {
            cvs.push(want);
        }
        self.next_due += 1;
        self.advance_due();
        self.p.chunks += 1;
        self.p.bytes += h.len;
        if self.corrupt == Some(h.index) && h.len > 0 {
            buf[HDR] ^= 0x5a;
        }
        Ok(buf)
    }
}

/// The bitmap file of the output `out`: `out.clinkcast`.
fn bitmap_path(out: &std::path::Path) -> std::path::PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".clinkcast");
    p.into()
}
