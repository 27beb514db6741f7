//! The node's downstream side: its receives, the connection to the next node, its
//! reports, and splicing the chain past a lost node.

use super::*;

impl Node {
    /// The receives of what the next node sends back: its report and its progress.
    pub(super) fn post_down_receives(
        &mut self,
        d: PeerId,
    ) -> Result<(RecvRequest, RecvRequest), Failure> {
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

    pub(super) fn down_lost(&self, what: &str, e: clink::Error) -> Failure {
        fail_up(format!(
            "{}: node {} failed ({what}): {e}",
            hop(self.down_node, &self.down_addr),
            self.down_node
        ))
    }

    /// Connects to the next node, hands it the route and waits for its readiness;
    /// answers upstream either way.
    pub(super) fn setup_down(
        &mut self,
        route: &Value,
        addrs: &[String],
        have: Option<Vec<bool>>,
    ) -> Result<(), Failure> {
        let index = self.p.index;
        // (A receiver rejoining at the tail has no next node, whatever its index.)
        let res = if index == addrs.len() || route["tail"] == true {
            Ok(have)
        } else {
            let addr = self.next_addr(addrs);
            self.down_node = index + 1;
            self.down_addr = addr.clone();
            // What every node holds: this one's chunks and the rest of the chain's.
            self.connect_down(route, &addr, index + 1)
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
    pub(super) fn open_bitmap(
        &mut self,
        id: &Value,
        node: usize,
    ) -> Result<Option<Vec<bool>>, String> {
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
            if b.len() >= head.len() + n && b.starts_with(head.as_bytes()) {
                have = Some(
                    b[head.len()..head.len() + n]
                        .iter()
                        .map(|&c| c == b'1')
                        .collect::<Vec<_>>(),
                );
            }
        }
        let write = |have: &[bool]| -> std::io::Result<File> {
            let mut b = head.clone().into_bytes();
            b.extend(have.iter().map(|&h| if h { b'1' } else { b'0' }));
            // Which node this is, for a rejoin (`--rejoin`).
            b.extend(format!("\nnode {node}\n").as_bytes());
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

    /// Connects to node `next` at `addr` as its upstream, hands it the route and waits
    /// for its readiness: the chunks it (and the chain after it) holds.
    pub(super) fn connect_down(
        &mut self,
        route: &Value,
        addr: &str,
        next: usize,
    ) -> Result<Option<Vec<bool>>, String> {
        let h = hop(next, addr);
        let d = self
            .ep
            .connect(addr)
            .map_err(|e| format!("{h}: cannot connect: {e}"))?;
        self.down = Some(d);
        let mut r = route.clone();
        r["index"] = json!(next);
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
            .map_err(|e| format!("{h}: no answer from node {next}: {e}"))?;
        let v: Value = serde_json::from_slice(&buf[..st.len as usize])
            .map_err(|e| format!("{h}: bad readiness answer: {e}"))?;
        if v["ok"] == true {
            Ok(v["have"].as_str().and_then(unbits))
        } else {
            Err(v["error"].as_str().unwrap_or("not ready").to_string())
        }
    }

    /// At the tail: takes on node `node`, at `addr`, which rejoins the cast (see
    /// `--rejoin`): the route (saying it is the tail) and the manifest; returns the chunks
    /// it holds. Nothing changes when it cannot be reached.
    pub(super) fn take_joined(&mut self, node: usize, addr: &str) -> Result<Vec<bool>, String> {
        let mut route = self.route.clone();
        route["tail"] = json!(true);
        let had = (self.down_node, self.down_addr.clone());
        let res = self.connect_down(&route, addr, node).and_then(|have| {
            let d = self.down.expect("connected");
            self.ep
                .send(d, T_MANIFEST, &self.manifest)
                .map_err(|e| format!("{}: sending the manifest: {e}", hop(node, addr)))?;
            Ok(have.unwrap_or_default())
        });
        match res {
            Ok(have) => {
                self.down_node = node;
                self.down_addr = addr.to_string();
                self.order = self.order.with_tail(node);
                Ok(have)
            }
            Err(e) => {
                self.down = None;
                (self.down_node, self.down_addr) = had;
                Err(e)
            }
        }
    }

    /// Whether the next node holds chunk `i` already (it took over from a point, or it
    /// rejoined with chunks of its own).
    pub(super) fn down_holds(&self, i: u64) -> bool {
        i < self.down_from || self.down_has.get(i as usize) == Some(&true)
    }

    /// Moves the next chunk due past the ones every node holds.
    pub(super) fn advance_due(&mut self) {
        while self.skip.get(self.next_due as usize) == Some(&true) {
            self.next_due += 1;
        }
    }

    /// The next node's report, when it sent one before going: its own reason for
    /// stopping, or success.
    pub(super) fn down_report(
        &mut self,
        report_req: &Option<RecvRequest>,
    ) -> Option<Result<(), Failure>> {
        let r = report_req.as_ref()?;
        let got = self.ep.test_recv(r).ok()??;
        Some(self.read_report(&got.buf))
    }

    /// Takes in the next node's report: the nodes below it, and its error if it failed.
    pub(super) fn read_report(&mut self, buf: &[u8]) -> Result<(), Failure> {
        let v: Value = serde_json::from_slice(buf).unwrap_or(Value::Null);
        self.down_reports = v["nodes"].as_array().cloned().unwrap_or_default();
        match v["error"].as_str() {
            Some(m) => Err(fail_up(m.to_string())),
            None => Ok(()),
        }
    }

    /// Waits for a new upstream (a node before the dead upstream, or the tail when this
    /// node was moved there): answers its splice request with the next chunk due here.
    /// Requests to rejoin that came meanwhile are kept for the stream loop
    /// ([`Node::joins`]).
    pub(super) fn await_splice(&mut self) -> Result<PeerId, String> {
        let deadline = Instant::now() + SPLICE_WAIT;
        let (p, buf) = loop {
            let mut splice = self.splices.pop();
            for call in self.poll_callers() {
                match call {
                    callers::Call::Splice(p, b) if splice.is_none() => splice = Some((p, b)),
                    callers::Call::Splice(p, b) => self.splices.push((p, b)),
                    callers::Call::Join(b) => self.joins.push(b),
                }
            }
            if let Some(s) = splice {
                break s;
            }
            if Instant::now() >= deadline {
                return Err(format!("no node took over within {SPLICE_WAIT:?}"));
            }
            idle(&mut self.ep);
        };
        let v: Value = serde_json::from_slice(&buf).unwrap_or(Value::Null);
        self.up_node = v["from"].as_u64().unwrap_or(0) as usize;
        let m = json!({ "next_due": self.next_due });
        self.ep
            .send(p, T_SPLICE, m.to_string().as_bytes())
            .map_err(|e| format!("answering the new upstream: {e}"))?;
        Ok(p)
    }

    /// Splices the dead next node out: connects to the one after it and learns the
    /// first chunk it lacks; returns the new next node and that chunk.
    pub(super) fn splice_down(&mut self, lost: &str) -> Result<(PeerId, u64), Failure> {
        let dead = self.down_node;
        let dead_addr = self.down_addr.clone();
        let Some(succ) = self.after(dead) else {
            return Err(fail_up(format!("{lost}; no node after it to splice to")));
        };
        let from = self.splice_to(succ, &format!("{lost}; splicing it out"))?;
        if from > self.next_due {
            return Err(fail_up(format!(
                "{lost}; splicing it out: {}: it holds chunks up to {from}, beyond this node's {}",
                hop(succ, &self.down_addr),
                self.next_due
            )));
        }
        self.spliced.push(json!({
            "node": dead,
            "address": short(&dead_addr),
            "status": format!("failed: {lost}; spliced out (node {} -> node {succ})", self.p.index),
        }));
        self.order.remove(dead);
        Ok((self.down.expect("spliced"), from))
    }
}

/// The node a receiver was in the cast its output's bitmap belongs to (for `--rejoin`).
pub(super) fn bitmap_node(out: &std::path::Path) -> Result<usize, String> {
    let path = bitmap_path(out);
    let b = std::fs::read(&path).map_err(|e| {
        format!(
            "{}: {e} (--rejoin resumes a receiver of a running cast from its bitmap)",
            path.display()
        )
    })?;
    let text = String::from_utf8_lossy(&b);
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("node ")?.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| format!("{}: no node number in it", path.display()))
}
