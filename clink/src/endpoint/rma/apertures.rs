//! Apertures: memory an endpoint exposes (allocated or registered), read and written
//! locally, received into, exported as cookies, revoked, and imported as [`Remote`]s.

use super::*;

impl Endpoint {
    /// Allocates a zeroed aperture of `len` bytes in a memory file (mappable by same-host
    /// peers through [`Endpoint::map`]).
    pub fn aperture_alloc(&mut self, len: usize) -> Result<ApertureId> {
        if len == 0 {
            return Err(Error::Invalid("an aperture needs at least one byte".into()));
        }
        let page = 4096;
        let size = len.div_ceil(page) * page;
        let fd = sys::memfd_sealed("clink-aperture", size).map_err(io_err("aperture memfd"))?;
        let map = Arc::new(Mapping::new(&fd, size).map_err(io_err("mmap aperture"))?);
        Ok(self.add_aperture(ApMem::File { fd, map }, len as u64))
    }

    /// Makes `buf` an aperture (peers put and get it; it cannot be mapped by them). It is
    /// given back by [`Endpoint::aperture_destroy`].
    pub fn aperture_register(&mut self, buf: Vec<u8>) -> Result<ApertureId> {
        if buf.is_empty() {
            return Err(Error::Invalid("an aperture needs at least one byte".into()));
        }
        let len = buf.len() as u64;
        Ok(self.add_aperture(ApMem::User(buf), len))
    }

    pub(super) fn add_aperture(&mut self, mem: ApMem, len: u64) -> ApertureId {
        let id = self.rma.next_ap;
        self.rma.next_ap += 1;
        self.rma.aps.insert(id, LocalAp { mem, len });
        ApertureId(id)
    }

    /// Destroys an aperture: its exports become unknown (later accesses are refused), its
    /// tripwires are removed, and a registered buffer is given back. Peers that mapped it
    /// keep their mapping of memory this endpoint no longer reads.
    pub fn aperture_destroy(&mut self, ap: ApertureId) -> Result<Option<Vec<u8>>> {
        if !self.rma.aps.contains_key(&ap.0) {
            return Err(no_aperture(ap));
        }
        // Settled, the list holds exactly the receives still pending.
        self.settle_aperture_recvs();
        if self.rma.aperture_recvs.iter().any(|r| r.ap == ap.0) {
            return Err(Error::Invalid(format!(
                "aperture {} has a receive pending into it: cancel it first",
                ap.0
            )));
        }
        let a = self.rma.aps.remove(&ap.0).ok_or_else(|| no_aperture(ap))?;
        self.rma.exports.retain(|_, e| e.grant.aperture != ap.0);
        self.rma.trips.remove_aperture(ap.0);
        Ok(match a.mem {
            ApMem::User(v) => Some(v),
            ApMem::File { .. } => None,
        })
    }

    /// Length of an aperture in bytes.
    pub fn aperture_len(&self, ap: ApertureId) -> Result<u64> {
        Ok(self.rma.aps.get(&ap.0).ok_or_else(|| no_aperture(ap))?.len)
    }

    /// A window on this endpoint's own aperture (allocated ones only), for direct loads and
    /// stores by the owner, e.g. polling a flag a peer writes.
    pub fn aperture_window(&self, ap: ApertureId) -> Result<Window> {
        let a = self.rma.aps.get(&ap.0).ok_or_else(|| no_aperture(ap))?;
        match &a.mem {
            ApMem::File { map, .. } => Ok(Window::new(map.clone(), 0, a.len, true, None)),
            ApMem::User(_) => Err(Error::Invalid(
                "a registered buffer has no window: use aperture_read/aperture_write".into(),
            )),
        }
    }

    /// Writes `data` into this endpoint's own aperture at `offset`, firing its write
    /// tripwires (an access made through clink).
    pub fn aperture_write(&mut self, ap: ApertureId, offset: u64, data: &[u8]) -> Result<()> {
        self.local_range(ap, offset, data.len() as u64)?
            .write(0, data);
        self.fire(ap.0, offset, data.len() as u64, WRITE, None);
        Ok(())
    }

    /// Reads this endpoint's own aperture at `offset` into `buf`, firing its read
    /// tripwires.
    pub fn aperture_read(&mut self, ap: ApertureId, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mem = self.local_range(ap, offset, buf.len() as u64)?;
        buf.copy_from_slice(mem.bytes());
        self.fire(ap.0, offset, buf.len() as u64, READ, None);
        Ok(())
    }

    /// Receives a tagged message straight into this endpoint's aperture at `offset` (at
    /// most `len` bytes) and fires the write tripwires over the bytes that landed, with
    /// the sender as the accessing peer: a message landing in an aperture is an access
    /// made through clink. Truncation is reported as by [`Endpoint::recv`] (the first
    /// `len` bytes landed, and fire).
    ///
    /// Only blocking receives into apertures fire tripwires; a message received into a
    /// plain buffer that happens to alias an aperture does not.
    pub fn recv_into_aperture(
        &mut self,
        sel: clink_proto::matching::Selector,
        ap: ApertureId,
        offset: u64,
        len: u64,
        timeout: Option<Duration>,
    ) -> Result<crate::endpoint::Status> {
        // The memory stays mapped during the call: destroying the aperture needs
        // `&mut self`, which the receive holds.
        let mut mem = self.local_range(ap, offset, len)?;
        let res = self.recv_timeout(sel, mem.bytes_mut(), timeout);
        // (A truncation error does not name the sender: the selector's source, if any;
        // with an any-source selector the tripwire event says `peer: None`.)
        if let Some((peer, n)) = landed(&res, sel.src, len) {
            self.fire(ap.0, offset, n, WRITE, peer);
        }
        res
    }

    /// Posts a non-blocking receive of a message matching `sel` into `offset..offset+len`
    /// of aperture `ap`. When it completes, the aperture's write tripwires over the bytes
    /// that landed fire (in the progress pass that completed it, so a thread waiting on
    /// the tripwire or the event queue wakes without anyone testing the request).
    /// Complete the request with [`Endpoint::wait_recv`] or [`Endpoint::test_recv`]:
    /// its [`crate::Received`] has an empty `buf`, the message being in the aperture. The
    /// aperture cannot be destroyed while the receive is pending (cancel it first).
    pub fn irecv_into_aperture(
        &mut self,
        sel: clink_proto::matching::Selector,
        ap: ApertureId,
        offset: u64,
        len: u64,
    ) -> Result<crate::endpoint::RecvRequest> {
        let buf = RecvBuf::InPlace(self.local_range(ap, offset, len)?);
        let req = self.post_recv(sel, buf, 0);
        self.rma.aperture_recvs.push(ApertureRecv {
            req: req.id(),
            ap: ap.0,
            offset,
            len,
            src: sel.src,
        });
        // A message that had arrived completes it at once: fire now, not at the next
        // pass (`wait_event`'s fast path may run none for a while). Later completions
        // happen in a progress pass, which settles at its end.
        self.settle_aperture_recvs();
        Ok(req)
    }

    /// Fires the tripwires of the receives into apertures that completed (in the order
    /// they were posted); forgets those cancelled or failed.
    pub(in crate::endpoint) fn settle_aperture_recvs(&mut self) {
        let mut fires = Vec::new();
        let recvs = &self.req.recvs;
        self.rma
            .aperture_recvs
            .retain(|r| match recvs.get(&r.req).map(|op| &op.state) {
                Some(crate::endpoint::RecvState::Done(res)) => {
                    if let Some((peer, n)) = landed(res, r.src, r.len) {
                        fires.push((r.ap, r.offset, n, peer));
                    }
                    false
                }
                Some(_) => true,
                None => false,
            });
        for (ap, offset, n, peer) in fires {
            self.fire(ap, offset, n, WRITE, peer);
        }
    }

    pub(super) fn local_range(&mut self, ap: ApertureId, offset: u64, len: u64) -> Result<Dst> {
        let a = self.rma.aps.get_mut(&ap.0).ok_or_else(|| no_aperture(ap))?;
        match offset.checked_add(len) {
            Some(end) if end <= a.len => Ok(a
                .lease()
                .sub(offset as usize, len as usize)
                .expect("inside the aperture")),
            _ => Err(Error::Invalid(format!(
                "access {offset}+{len} outside aperture of {} bytes",
                a.len
            ))),
        }
    }

    /// Exports the window `offset..offset+len` of an aperture with `rights`
    /// ([`crate::rma::READ`] | [`crate::rma::WRITE`]): the cookie to send to peers.
    pub fn export(&mut self, ap: ApertureId, offset: u64, len: u64, rights: u8) -> Result<Cookie> {
        let a = self.rma.aps.get_mut(&ap.0).ok_or_else(|| no_aperture(ap))?;
        let mem = a.lease();
        if offset.checked_add(len).is_none_or(|e| e > a.len) {
            return Err(Error::Invalid(format!(
                "export {offset}+{len} outside aperture of {} bytes",
                a.len
            )));
        }
        if rights == 0 || rights & !(READ | WRITE) != 0 {
            return Err(Error::Invalid(format!("bad rights {rights:#x}")));
        }
        let key = sys::random_u128().map_err(io_err("random cookie key"))?;
        let export = self.rma.next_export;
        self.rma.next_export += 1;
        let grant = Grant {
            aperture: ap.0,
            base: offset,
            len,
            rights,
            key,
            revoked: false,
        };
        self.rma.exports.insert(export, Export { grant, mem });
        Ok(Cookie {
            owner: self.id,
            export,
            base: offset,
            len,
            rights,
            key,
        })
    }

    /// Revokes an export: every later access with the cookie is refused
    /// ([`crate::rma::AccessStatus::Revoked`]). Mappings already made stay (see the trust
    /// model in [`crate::rma`]).
    pub fn revoke(&mut self, cookie: &Cookie) -> Result<()> {
        match self.rma.exports.get_mut(&cookie.export) {
            Some(Export { grant: g, .. })
                if cookie.owner == self.id && rma::key_eq(g.key, cookie.key) =>
            {
                g.revoked = true;
                Ok(())
            }
            _ => Err(Error::Invalid(
                "revoke: not a cookie of this endpoint".into(),
            )),
        }
    }

    /// Turns a cookie received from `peer` (its owner) into a handle for one-sided access.
    /// Only checks that it names that peer; the owner checks everything else on access.
    pub fn import(&mut self, peer: PeerId, cookie: Cookie) -> Result<Remote> {
        let p = self.peer(peer)?;
        let owner = p.link.remote_id(&self.nets, peer.0 as usize);
        if owner != cookie.owner {
            return Err(Error::Invalid(format!(
                "the cookie belongs to endpoint {:032x}, not to {peer}",
                cookie.owner
            )));
        }
        Ok(Remote { peer, cookie })
    }
}
