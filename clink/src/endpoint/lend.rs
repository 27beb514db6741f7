//! Where caller memory becomes a lease ([`crate::lease`]): the blocking calls, which
//! return only once the request holding the lease is over, and the raw receive, whose
//! caller promises it. The only `unsafe` of the endpoint.

use super::*;
use crate::lease::Src;
use crate::rma::Remote;

impl Endpoint {
    /// Sends and waits until the message is out of `data` (blocking helper); over UDP,
    /// also until the connection holds nothing back for its window or the peer's credit
    /// (its datagrams are in flight, repeated by the keepalive thread if the caller then
    /// stays away).
    pub fn send(&mut self, peer: PeerId, tag: u64, data: &[u8]) -> Result<()> {
        // SAFETY: `finish_borrowed_send` returns only once the request is over.
        let lent = SendBuf::Lent(unsafe { Src::new(data.as_ptr(), data.len()) });
        // (Not `start_send`: its one read of held acks is part of `transmit_held` here.)
        let req = self.start_send_kick(peer, tag, lent, true)?;
        self.finish_borrowed_send(req)?;
        self.transmit_held(peer)
    }

    /// Sends every message of `msgs` to `peer` with `tag`, all in flight at once, and
    /// waits until all are out of the caller's memory (blocking helper for streaming:
    /// large messages pipeline their rendezvous without copying into owned buffers, small
    /// ones leave together: over TCP one gathering write, over UDP one batch of
    /// datagrams, where `send` in a loop makes a system call per message).
    pub fn send_batch(&mut self, peer: PeerId, tag: u64, msgs: &[&[u8]]) -> Result<()> {
        let mut reqs = Vec::with_capacity(msgs.len());
        let mut first_err = None;
        for m in msgs {
            // SAFETY: every request started here is over before this call returns (below).
            let lent = SendBuf::Lent(unsafe { Src::new(m.as_ptr(), m.len()) });
            // Not kicked one by one: the batch's small messages leave together below.
            match self.start_send_kick(peer, tag, lent, false) {
                Ok(r) => reqs.push(r),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        self.kick(peer.0 as usize);
        // Every started send must be over before the borrowed slices go away.
        for r in reqs {
            if let Err(e) = self.finish_borrowed_send(r) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or_else(|| self.transmit_held(peer), Err)
    }

    /// The general path of a blocking receive into `buf`.
    pub(super) fn recv_lent(
        &mut self,
        sel: Selector,
        buf: &mut [u8],
        timeout: Option<Duration>,
        spun: Option<Instant>,
    ) -> Result<Status> {
        // SAFETY: `recv_posted` returns only once the receive is over.
        let lent = unsafe { Dst::new(buf.as_mut_ptr(), buf.len()) };
        self.recv_posted(sel, lent, timeout, spun)
    }

    /// Reads `buf.len()` bytes at `offset` of a remote window.
    pub fn get(&mut self, r: &Remote, offset: u64, buf: &mut [u8]) -> Result<()> {
        // SAFETY: `get_lent` returns only once the request is over.
        let lent = unsafe { Dst::new(buf.as_mut_ptr(), buf.len()) };
        self.get_lent(r, offset, lent)
    }

    /// Posts a receive of a message matching `sel` straight into `len` bytes of caller
    /// memory at `ptr` (no copy on completion, unlike [`Endpoint::irecv`], whose buffer
    /// the endpoint owns). Complete it with [`Endpoint::test_recv`] or `wait_recv`: its
    /// [`Received`] has an empty `buf`, the message being at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and neither read nor freed by the
    /// caller, until the request completes or [`Endpoint::cancel_recv`] withdraws it.
    pub unsafe fn irecv_raw(&mut self, sel: Selector, ptr: *mut u8, len: usize) -> RecvRequest {
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.irecv_raw_user(sel, ptr, len, 0) }
    }

    /// [`Endpoint::irecv_raw`] carrying a word of the caller's (`user`), which
    /// [`Endpoint::poll_recvs`] and [`Endpoint::recv_user`] hand back: a caller keeping its
    /// own record of each receive (the libfabric provider) indexes it by that word instead
    /// of looking the request up.
    ///
    /// # Safety
    /// As [`Endpoint::irecv_raw`].
    pub unsafe fn irecv_raw_user(
        &mut self,
        sel: Selector,
        ptr: *mut u8,
        len: usize,
        user: u64,
    ) -> RecvRequest {
        // SAFETY: the caller's contract (a zero-length buffer may come as NULL from C
        // callers: the lease then points nowhere).
        let lent = unsafe { Dst::new(ptr, len) };
        self.post_recv(sel, RecvBuf::InPlace(lent), user)
    }
}
