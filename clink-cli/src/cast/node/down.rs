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
    pub(super) fn open_bitmap(&mut self, id: &Value) -> Result<Option<Vec<bool>>, String> {
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

    pub(super) fn connect_down(
        &mut self,
        route: &Value,
        addr: &str,
    ) -> Result<Option<Vec<bool>>, String> {
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
    pub(super) fn await_splice(&mut self) -> Result<PeerId, String> {
        let p = self
            .ep
            .accept(Some(SPLICE_WAIT))
            .map_err(|e| format!("no node took over within {SPLICE_WAIT:?}: {e}"))?;
        let mut buf = vec![0u8; 4096];
        let st = self
            .ep
            .recv_timeout(
                Selector::exact(Some(p), T_SPLICE),
                &mut buf,
                Some(SETUP_TIMEOUT),
            )
            .map_err(|e| format!("no splice request from the new upstream: {e}"))?;
        let v: Value = serde_json::from_slice(&buf[..st.len as usize]).unwrap_or(Value::Null);
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
        self.order.retain(|&n| n != dead);
        Ok((self.down.expect("spliced"), from))
    }
}
