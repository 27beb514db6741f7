//! Where an endpoint's messages go: the connection to each address-vector entry (the
//! endpoint with the smaller identity connects; when both connect at once, both use the
//! connection the smaller one made), the connection to itself, and the source address
//! of a connection's messages.

use super::*;

impl State {
    pub(super) fn learn_peers(&mut self) {
        let n = self.ep.peer_count();
        while self.remote_of.len() < n {
            let p = PeerId(self.remote_of.len() as u32);
            let id = self.ep.peer_endpoint_id(p).unwrap_or(0);
            self.remote_of.push(id);
            let shm = self.ep.transport(p).is_ok_and(|t| t == "shm");
            self.ring_max.push(if shm {
                self.ep.eager_max(p).unwrap_or(0)
            } else {
                0
            });
            // Both ends connected at once (ARCHITECTURE.md, "The libfabric provider"):
            // both use the connection the smaller identity made.
            if id != 0 && self.ep.joined(p).is_ok_and(|j| j.superseded) {
                crate::log(&format!(
                    "connections to endpoint {id:032x} crossed: {p} is not the one kept"
                ));
                continue;
            }
            let first = *self.links.entry(id).or_insert(p);
            if first != p && id != 0 {
                crate::log(&format!(
                    "a second connection to endpoint {id:032x} ({p}); sends and directed \
                     receives keep {first}, and its messages on the other wait"
                ));
            }
        }
    }

    /// Connects to the address-vector entries inserted since the last look whose
    /// identity is larger than ours (they wait for us to connect).
    pub(super) fn connect_new_entries(&mut self) {
        // Looked at on every progress pass: no reference count taken unless there is news.
        let news = |av: &&Arc<AvShared>| av.inserted.load(Ordering::Acquire) != self.considered;
        let Some(av) = self.av.as_ref().filter(news).cloned() else {
            return;
        };
        let t = av.lock().unwrap_or_else(|e| e.into_inner());
        // The job's other ranks on this host: the rings are sized for that many from the
        // first connection (a full mesh of local ranks holds a pair of rings per pair).
        let host = self.ctx.host();
        let local = (t.entries.iter().flatten())
            .filter(|e| e.host == host && e.id != self.my_id)
            .count();
        self.ep.expect_peers(local);
        let todo: Vec<(u128, String)> = t.entries[self.considered.min(t.entries.len())..]
            .iter()
            .flatten()
            .map(|e| (e.id, e.addr.clone()))
            .collect();
        self.considered = t.entries.len();
        drop(t);
        for (id, addr) in todo {
            self.learn_peers();
            if id > self.my_id && !self.links.contains_key(&id) {
                // A connection the peer started and we have not adopted yet would make a
                // second one.
                let _ = self.ep.accept(Some(Duration::ZERO));
                self.learn_peers();
                if self.links.contains_key(&id) || self.expecting(id) {
                    continue;
                }
                let _ = self.connect(id, &addr);
            }
        }
    }

    /// Connects to the endpoint `id` at `addr`: the connection to use, or `FI_EAGAIN`
    /// when ours crossed the peer's and theirs is the one kept (not here yet), or
    /// `FI_EIO` when the connect failed.
    pub(super) fn connect(&mut self, id: u128, addr: &str) -> Result<PeerId, c_int> {
        match self.ep.connect(addr) {
            Ok(_) => {
                self.learn_peers();
                match self.links.get(&id) {
                    Some(&p) => Ok(p),
                    None => {
                        self.crossed.insert(id, Instant::now());
                        Err(FI_EAGAIN)
                    }
                }
            }
            Err(e) => {
                crate::log(&format!("connecting to {addr}: {e}"));
                self.unreachable.insert(id);
                Err(FI_EIO)
            }
        }
    }

    /// True while a connection from the endpoint `id` is on its way: its connect crossed
    /// ours and is the one kept, or it is being set up. A connect of ours would make a
    /// second connection (or a third).
    fn expecting(&self, id: u128) -> bool {
        self.crossed.contains_key(&id) || self.ep.being_connected_by(id)
    }

    /// Makes the connection to ourselves: a second endpoint connects to this one, from a
    /// thread, while this one answers its handshake.
    pub(super) fn ensure_loop(&mut self) -> Result<(), c_int> {
        if self.looped.is_some() {
            return Ok(());
        }
        let mut lep = self.ctx.endpoint().map_err(|e| {
            crate::log(&format!("no loopback endpoint: {e}"));
            FI_EIO
        })?;
        lep.set_interest(REQUESTS);
        let id = lep.endpoint_id();
        let addr = self.ep.address();
        let main = &mut self.ep;
        let (lep, res) = std::thread::scope(|s| {
            let h = s.spawn(move || {
                let r = lep.connect(&addr);
                (lep, r)
            });
            while !h.is_finished() {
                let _ = main.accept(Some(Duration::from_millis(1)));
            }
            h.join().expect("the loopback connect does not panic")
        });
        let to_main = res.map_err(|e| {
            crate::log(&format!("loopback connection: {e}"));
            FI_EIO
        })?;
        self.learn_peers();
        self.looped = Some(Looped {
            ep: lep,
            to_main,
            id,
            ops: Map::default(),
        });
        Ok(())
    }

    /// The main endpoint's connection from its loopback endpoint.
    pub(super) fn link_from_myself(&mut self) -> Result<PeerId, c_int> {
        self.ensure_loop()?;
        let id = self.looped.as_ref().map_or(0, |l| l.id);
        self.learn_peers();
        self.links.get(&id).copied().ok_or(FI_EIO)
    }

    /// Where address-vector entry `dest` leads: to a connection (ours if we connect, else
    /// the one the peer made: `FI_EAGAIN` until it has) or to this endpoint itself.
    #[inline]
    pub(super) fn target(&mut self, dest: u64) -> Result<Target, c_int> {
        if let Some(&Some(p)) = self.routes.get(dest as usize) {
            return Ok(p);
        }
        self.first_target(dest)
    }

    /// [`State::target`] of an address not used before (out of line: the data path's
    /// call stays a look-up, without this one's frame).
    #[inline(never)]
    fn first_target(&mut self, dest: u64) -> Result<Target, c_int> {
        let t = self.route(dest)?;
        // Addresses are never reused (the vector only grows), so the answer stays right;
        // `route` found `dest` in the vector, so the table is no longer than it.
        let i = dest as usize;
        if self.routes.len() <= i {
            self.routes.resize(i + 1, None);
        }
        self.routes[i] = Some(t);
        Ok(t)
    }

    /// Where `dest` leads, from the address vector (the first use of an address).
    fn route(&mut self, dest: u64) -> Result<Target, c_int> {
        let entry = {
            let av = self.av.as_ref().ok_or(FI_EINVAL)?;
            let t = av.lock().unwrap_or_else(|e| e.into_inner());
            t.get(dest).cloned().ok_or(FI_EINVAL)?
        };
        self.learn_peers();
        if entry.id == self.my_id {
            return Ok(Target::Myself);
        }
        if let Some(&p) = self.links.get(&entry.id) {
            return Ok(Target::Peer(p));
        }
        if self.unreachable.contains(&entry.id) {
            return Err(FI_EIO);
        }
        let _ = self.ep.accept(Some(Duration::ZERO));
        self.learn_peers();
        if let Some(&p) = self.links.get(&entry.id) {
            return Ok(Target::Peer(p));
        }
        if let Some(since) = self.crossed.get(&entry.id) {
            if since.elapsed() < CROSSED_WAIT {
                return Err(FI_EAGAIN);
            }
            crate::log(&format!(
                "endpoint {:032x} connected to us at the same time as we did, and its \
                 connection did not arrive within {CROSSED_WAIT:?}",
                entry.id
            ));
            return Err(FI_EIO);
        }
        if self.ep.being_connected_by(entry.id) {
            return Err(FI_EAGAIN);
        }
        if entry.id > self.my_id {
            return self.connect(entry.id, &entry.addr).map(Target::Peer);
        }
        // The peer connects when it inserts our address; a program that inserts addresses
        // only when it first talks to them (Open MPI across hosts) may never do so before
        // we need it: after a grace period we connect ourselves.
        let since = *self.waiting.entry(entry.id).or_insert_with(Instant::now);
        if since.elapsed() < CONNECT_GRACE {
            return Err(FI_EAGAIN);
        }
        self.connect(entry.id, &entry.addr).map(Target::Peer)
    }

    pub(super) fn source_of(&mut self, p: PeerId) -> u64 {
        if let Some(a) = known_source(&self.sources, p) {
            return a;
        }
        let a = self.lookup_source(p);
        if self.sources.len() <= p.0 as usize {
            self.sources.resize(p.0 as usize + 1, FI_ADDR_NOTAVAIL);
        }
        self.sources[p.0 as usize] = a;
        a
    }

    pub(super) fn lookup_source(&self, p: PeerId) -> u64 {
        let Some(&id) = self.remote_of.get(p.0 as usize) else {
            return FI_ADDR_NOTAVAIL;
        };
        let id = match &self.looped {
            Some(l) if l.id == id => self.my_id,
            _ => id,
        };
        self.av
            .as_ref()
            .and_then(|av| {
                av.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .by_id
                    .get(&id)
                    .copied()
            })
            .unwrap_or(FI_ADDR_NOTAVAIL)
    }
}

/// The address of peer `p` as [`State::source_of`] learned it, if it has (`sources` is
/// that table): what the completion paths that cannot look one up take.
pub(super) fn known_source(sources: &[u64], p: PeerId) -> Option<u64> {
    sources
        .get(p.0 as usize)
        .copied()
        .filter(|&a| a != FI_ADDR_NOTAVAIL)
}
