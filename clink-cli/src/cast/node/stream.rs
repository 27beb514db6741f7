//! Streaming a file through the node: each chunk received, stored and forwarded from
//! the same buffer, and the end of the stream.

use super::callers::CALLERS_EVERY;
use super::moves::{MOVE_AFTER, MOVE_WINDOWS};
use super::*;

impl Node {
    /// Receives, verifies, writes and forwards every chunk.
    pub(super) fn stream(&mut self, man: &Manifest) -> Result<(), Failure> {
        let mut up = self.up;
        let cap = HDR + man.chunk as usize;
        let mut data_sel = Selector::exact(Some(up), T_DATA);
        // A neighbour lost (what was being done, the error), handled at the top of the
        // loop: spliced out when it can be, else the end of this node's cast.
        let mut lost_up: Option<(&str, clink::Error)> = None;
        let mut lost_down: Option<(&str, clink::Error)> = None;
        // A move changes this node's upstream: it waits for the new one (the tail when
        // this node was moved, `Some(true)`; the moved node's upstream when that node
        // was this one's, `Some(false)`).
        let mut moved_up: Option<bool> = None;
        // Since when the next node has been far behind (see `moves`).
        let mut far_behind: Option<Instant> = None;
        // Chunks to forward from this node's file, from, until (exclusive): to a new next
        // node that replaced a dead one, or to a next node that fell behind (this node
        // goes on receiving meanwhile: a slow node holds back only the nodes after it).
        let mut replay: Option<(u64, u64)> = None;
        let mut end_bytes_sent: Option<Vec<u8>> = None;
        let mut resend_end = false;
        let mut beat_req = Some(
            self.ep
                .irecv(Selector::exact(Some(up), T_BEAT), vec![0u8; 64])
                .map_err(|e| self.upstream_lost("posting a receive", e))?,
        );
        let mut move_req = Some(self.post_up(up, T_MOVE)?);
        let mut adopt_req = Some(self.post_up(up, T_ADOPT)?);
        let mut join_req = Some(self.post_up(up, T_JOIN)?);
        let mut abort_req = Some(self.post_up(up, T_ABORT)?);
        let mut posted: VecDeque<RecvRequest> = VecDeque::new();
        let mut sends: VecDeque<(SendRequest, Bytes)> = VecDeque::new();
        let mut free: Vec<Vec<u8>> = Vec::new();
        let mut n_posted = 0u64;
        let mut total = man.chunks();
        // Chunks every node holds are not sent.
        let skipped = self.skip.iter().filter(|&&s| s).count() as u64;
        self.p.resumed = skipped;
        if let (Some(c), Some(_)) = (&man.cvs, man.size) {
            self.p.resumed_bytes = (0..c.len() as u64)
                .filter(|&i| self.skip.get(i as usize) == Some(&true))
                .map(|i| man.chunk_len(i))
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
        // Buffers: a window of receives, a window of sends, and more sends while the next
        // node is behind (a moment's stall of a node sharing its core is absorbed in
        // memory), up to [`LAG_BYTES`]; beyond, chunks are forwarded from the file.
        let max_buffers = self.window * 2 + (LAG_BYTES / man.chunk.max(1)) as usize;
        let mut beat = Instant::now();
        // This node's idle seconds at the last progress message (its busy share since).
        let mut idle_at_beat = 0.0;
        let mut callers_at = Instant::now();
        let mut stalled_since = Instant::now();
        let mut last_moved = (0, 0, None);
        loop {
            let mut did = false;
            let new_up = if let Some(me) = moved_up.take() {
                let why = if me {
                    "moved to the tail".to_string()
                } else {
                    format!("{} before it moved to the tail", node_name(self.up_node))
                };
                let p = self.await_splice().map_err(|m| Failure {
                    msg: format!("node {}: {why}: {m}", self.p.index),
                    up_alive: false,
                })?;
                eprintln!(
                    "clink cast: node {}: {why}; {} feeds it from chunk {}",
                    self.p.index,
                    node_name(self.up_node),
                    self.next_due
                );
                Some(p)
            } else if let Some((what, e)) = lost_up.take() {
                // An upstream that failed said so before it went: nothing to wait for.
                if let Some(f) = self.upstream_aborted(&abort_req) {
                    return Err(f);
                }
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
                Some(p)
            } else {
                None
            };
            if let Some(p) = new_up {
                up = p;
                self.up = p;
                data_sel = Selector::exact(Some(p), T_DATA);
                for q in posted.drain(..) {
                    // Its buffer back, or one fewer counted (a receive that completed
                    // meanwhile took it with it).
                    match self.ep.cancel_recv(&q) {
                        Ok(Some(b)) => free.push(b),
                        _ => buffers -= 1,
                    }
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
                for r in [move_req.take(), adopt_req.take(), join_req.take()]
                    .into_iter()
                    .flatten()
                {
                    let _ = self.ep.cancel_recv(&r);
                }
                move_req = Some(self.post_up(p, T_MOVE)?);
                adopt_req = Some(self.post_up(p, T_ADOPT)?);
                join_req = Some(self.post_up(p, T_JOIN)?);
                if let Some(r) = abort_req.take() {
                    let _ = self.ep.cancel_recv(&r);
                }
                abort_req = Some(self.post_up(p, T_ABORT)?);
                continue;
            }
            // The upstream failed (it lingers for its own upstream's answer meanwhile).
            if let Some(f) = self.upstream_aborted(&abort_req) {
                return Err(f);
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
                if !self.repair || self.after(self.down_node).is_none() {
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
                self.down_from = from;
                resend_end = end_bytes_sent.is_some();
                continue;
            }
            // Moved to the tail (this node), or the node before this one moved (its next
            // node feeds this one now).
            if let Some(r) = &move_req {
                match self.ep.test_recv(r) {
                    Ok(Some(got)) => {
                        move_req = None;
                        let v: Value = serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
                        self.take_order(&v);
                        let me = v["node"].as_u64() == Some(self.p.index as u64);
                        if me {
                            self.moved = true;
                            if let Some(d) = self.down.take() {
                                // The next node is the moving node's upstream's now.
                                if let Err(e) = self.ep.send(d, T_MOVE, &got.buf) {
                                    self.down = Some(d);
                                    return Err(self.down_lost("handing it over", e));
                                }
                                sends.clear();
                                replay = None;
                                resend_end = false;
                                (report_req, progress_req) = (None, None);
                                self.predict();
                            }
                        }
                        moved_up = Some(me);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => lost_up = Some(("streaming", e)),
                }
            }
            // A node moved to the tail: this node takes it on if it is the tail.
            if let Some(r) = &adopt_req {
                match self.ep.test_recv(r) {
                    Ok(Some(got)) => {
                        let v: Value = serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
                        self.take_order(&v);
                        adopt_req = Some(self.post_up(up, T_ADOPT)?);
                        let node = v["node"].as_u64().unwrap_or(0) as usize;
                        match self.down {
                            Some(d) => {
                                if let Err(e) = self.ep.send(d, T_ADOPT, &got.buf) {
                                    lost_down = Some(("sending the new order", e));
                                }
                            }
                            None if node != 0 && node != self.p.index => {
                                let from =
                                    self.splice_to(node, "adopting a node moved to the tail")?;
                                let (r, p, from_file) = self.take_on_next(from, Vec::new())?;
                                (report_req, progress_req, replay) = (Some(r), Some(p), from_file);
                            }
                            None => {}
                        }
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => lost_up = Some(("streaming", e)),
                }
            }
            // Receivers rejoining the cast: relayed down to the tail, which takes them on.
            if let Some(r) = &join_req {
                match self.ep.test_recv(r) {
                    Ok(Some(got)) => {
                        self.joins.push(got.buf);
                        join_req = Some(self.post_up(up, T_JOIN)?);
                    }
                    Ok(None) => {}
                    Err(e) => lost_up = Some(("streaming", e)),
                }
            }
            for b in std::mem::take(&mut self.joins) {
                did = true;
                let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
                let node = v["node"].as_u64().unwrap_or(0) as usize;
                let (Some(addr), true) = (
                    v["address"].as_str(),
                    node != 0 && node <= self.addrs.len() && node != self.p.index,
                ) else {
                    continue;
                };
                match self.down {
                    // (Asked again: taken on already.)
                    Some(_) if self.down_node == node => {}
                    Some(d) => {
                        if let Err(e) = self.ep.send(d, T_JOIN, &b) {
                            lost_down = Some(("relaying a rejoin", e));
                        }
                    }
                    None => match self.take_joined(node, addr) {
                        Ok(have) => {
                            let (r, p, from_file) = self.take_on_next(0, have)?;
                            (report_req, progress_req, replay) = (Some(r), Some(p), from_file);
                            eprintln!(
                                "clink cast: node {}: node {node} rejoined; this node feeds it the chunks it lacks",
                                self.p.index
                            );
                        }
                        Err(e) => eprintln!(
                            "clink cast: node {}: node {node} asked to rejoin: {e}",
                            self.p.index
                        ),
                    },
                }
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
                        let v: Value = serde_json::from_slice(&got.buf).unwrap_or(Value::Null);
                        self.take_order(&v);
                        self.note_busy(&v);
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
            if callers_at.elapsed() >= CALLERS_EVERY {
                callers_at = Instant::now();
                for call in self.poll_callers() {
                    match call {
                        callers::Call::Join(b) => self.joins.push(b),
                        // (Kept for when this node finds its upstream gone.)
                        callers::Call::Splice(p, b) => self.splices.push((p, b)),
                    }
                }
            }
            if beat.elapsed() >= PROGRESS_EVERY {
                let busy = 1.0 - (self.p.idle_s - idle_at_beat) / beat.elapsed().as_secs_f64();
                idle_at_beat = self.p.idle_s;
                beat = Instant::now();
                let m = json!({
                    "node": self.p.index,
                    "chunks": self.p.chunks,
                    "bytes": self.p.bytes,
                    "total": total,
                    // Its share of the interval not spent waiting (the source moves a
                    // first node far busier than all the others to the tail).
                    "busy": busy.clamp(0.0, 1.0),
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
            // Chunks forwarded from this node's file, in order, before any new one.
            if let (Some((mut i, until)), Some(d)) = (replay, self.down) {
                while i < until && sends.len() < self.window {
                    if self.skip.get(i as usize) == Some(&true) || self.down_holds(i) {
                        i += 1;
                        continue;
                    }
                    let len = self.lens[i as usize];
                    let zero = self.zeros.get(i as usize) == Some(&true);
                    let mut buf = free.pop().unwrap_or_default();
                    buf.resize(HDR + if zero { 0 } else { len as usize }, 0);
                    self.file
                        .read_exact_at(&mut buf[HDR..], i * man.chunk)
                        .map_err(|e| {
                            fail_up(format!(
                                "node {}: reading chunk {i} back from {}: {e}",
                                self.p.index,
                                self.out.display()
                            ))
                        })?;
                    ChunkHeader {
                        index: i,
                        offset: i * man.chunk,
                        len,
                        hash: man.cvs.is_none().then(|| cvs[i as usize]),
                        zero,
                    }
                    .write(&mut buf[..HDR]);
                    let b = Bytes::from(buf);
                    match self.ep.isend(d, T_DATA, b.clone()) {
                        Ok(r) => sends.push_back((r, b)),
                        Err(e) => {
                            lost_down = Some(("forwarding a chunk from the file", e));
                            break;
                        }
                    }
                    i += 1;
                    self.p.from_file += 1;
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
                if lost_down.is_some() {
                    continue;
                }
            }
            // A next node far behind for a while, with nodes after it: moved to the tail.
            let backlog = replay.map_or(0, |(i, until)| until.saturating_sub(i));
            if backlog < MOVE_WINDOWS * self.window as u64 || self.moved_next || !self.repair {
                far_behind = None;
            } else if far_behind.get_or_insert_with(Instant::now).elapsed() >= MOVE_AFTER
                && self.after(self.down_node).is_some()
                && self.starved_after(self.down_node)
            {
                far_behind = None;
                if let Err(e) = self.tell_move(backlog) {
                    lost_down = Some(("moving it to the tail", e));
                    continue;
                }
                let (d, from) = self.finish_move()?;
                sends.clear();
                let (r, p) = self.post_down_receives(d)?;
                (report_req, progress_req) = (Some(r), Some(p));
                replay = Some((from, self.next_due));
                self.down_from = from;
                continue;
            }
            // Receives, up to the window.
            while posted.len() < self.window && to_recv.is_none_or(|t| n_posted < t) {
                let buf = match free.pop() {
                    Some(mut b) => {
                        b.resize(cap, 0);
                        b
                    }
                    None if buffers < max_buffers => {
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
                        let index = self.next_due;
                        let buf = self.chunk(man, got.buf, &mut cvs, &mut single_root)?;
                        // Forwarding this buffer would leave none for the next receive
                        // (the others wait in sends: the next node is behind), or chunks
                        // before it wait in the file: it goes from the file too, later.
                        let behind = free.is_empty() && buffers >= max_buffers;
                        match self.down {
                            Some(_) if self.down_holds(index) => free.push(buf),
                            Some(d) if replay.is_none() && !behind => {
                                let b = Bytes::from(buf);
                                match self.ep.isend(d, T_DATA, b.clone()) {
                                    Ok(r) => sends.push_back((r, b)),
                                    Err(e) => lost_down = Some(("forwarding a chunk", e)),
                                }
                            }
                            Some(_) => {
                                free.push(buf);
                                let from = replay.map_or(index, |(from, _)| from);
                                replay = Some((from, self.next_due));
                            }
                            None => free.push(buf),
                        }
                        if to_recv.is_some_and(|t| self.p.chunks == t) {
                            // This node's file is whole (checked against the end message
                            // below); what the next node still lacks is forwarded after.
                            self.p.end = Some(Instant::now());
                            self.p.behind_at_end =
                                replay.map_or(0, |(i, until)| until - i) + sends.len() as u64;
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
                && replay.is_none()
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

    /// Checks the whole stream against the source's end message: size and root hash.
    pub(super) fn finish(
        &mut self,
        man: &Manifest,
        end: &Value,
        cvs: &[[u8; 32]],
        single_root: Option<blake3::Hash>,
    ) -> Result<(), Failure> {
        self.p.end.get_or_insert_with(Instant::now);
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
    pub(super) fn chunk(
        &mut self,
        man: &Manifest,
        mut buf: Vec<u8>,
        cvs: &mut Vec<[u8; 32]>,
        single_root: &mut Option<blake3::Hash>,
    ) -> Result<Vec<u8>, Failure> {
        let index = self.p.index;
        let h = ChunkHeader::read(&buf).map_err(|e| fail_up(format!("node {index}: {e}")))?;
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
        let now = Instant::now();
        self.p.start.get_or_insert(now);
        if let Some(last) = self.p.last_chunk.replace(now) {
            let gap = now.duration_since(last).as_secs_f64();
            self.p.longest_gap_s = self.p.longest_gap_s.max(gap);
        }
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
        if h.zero && self.zero_buf.len() < h.len as usize {
            self.zero_buf = vec![0; h.len as usize];
        }
        let payload = if h.zero {
            &self.zero_buf[..h.len as usize]
        } else {
            &buf[HDR..]
        };
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
        let written = if h.zero {
            // A hole, also over what an earlier cast left there.
            punch_hole(&self.file, h.offset, h.len).or_else(|_| {
                write_in_pieces(&self.file, &self.zero_buf[..h.len as usize], h.offset)
            })
        } else {
            write_in_pieces(&self.file, payload, h.offset)
        };
        written.map_err(|e| {
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
        if h.zero {
            if self.zeros.len() <= h.index as usize {
                self.zeros.resize(h.index as usize + 1, false);
            }
            self.zeros[h.index as usize] = true;
            self.p.zero_chunks += 1;
        }
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
        if self.corrupt == Some(h.index) && buf.len() > HDR {
            buf[HDR] ^= 0x5a;
        }
        if let Some(d) = self.pause {
            std::thread::sleep(d);
        }
        Ok(buf)
    }
}

/// Makes `len` bytes at `offset` of `f` a hole (the file's size unchanged).
fn punch_hole(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use rustix::fs::FallocateFlags;
    rustix::fs::fallocate(
        f,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )
    .map_err(std::io::Error::from)
}
