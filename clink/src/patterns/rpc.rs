//! Request/response over apertures: each client has a request queue into the server's
//! aperture and a response queue into its own ([`super::dqueue`]); the server waits on a
//! tripset over every client's request queue, so it sleeps until some client writes.

use super::dqueue::{QueueReceiver, QueueSender};
use super::{deadline, nap, spin};
use crate::rma::Tripset;
use crate::{Endpoint, Error, PeerId, Result};
use std::time::Duration;

/// Slots per queue (requests in flight per client: one less).
const SLOTS: usize = 16;

/// A client of an [`RpcServer`].
pub struct RpcClient {
    tx: QueueSender,
    rx: QueueReceiver,
    /// Requests sent whose responses were not received yet.
    outstanding: usize,
}

impl RpcClient {
    /// Connects to the server `peer` (which calls [`RpcServer::add_client`] with the same
    /// `tag` and `size`); requests and responses are `size` bytes.
    pub fn connect(
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        size: usize,
        timeout: Option<Duration>,
    ) -> Result<RpcClient> {
        let tx = QueueSender::connect(ep, peer, tag, size, SLOTS, timeout)?;
        let rx = QueueReceiver::connect(ep, peer, tag + 1, size, SLOTS, timeout)?;
        Ok(RpcClient {
            tx,
            rx,
            outstanding: 0,
        })
    }

    /// Sends a request without waiting for its response. At most 15 may be in flight
    /// (their responses must fit the response queue, or the server would block on it):
    /// a 16th is refused with `Error::Invalid`.
    pub fn send(&mut self, ep: &mut Endpoint, req: &[u8], timeout: Option<Duration>) -> Result<()> {
        if self.outstanding == SLOTS - 1 {
            return Err(Error::Invalid(format!(
                "{} RPC requests in flight: receive a response first",
                SLOTS - 1
            )));
        }
        self.tx.push(ep, req, timeout)?;
        self.outstanding += 1;
        Ok(())
    }

    /// Receives the next response, in request order.
    pub fn recv(
        &mut self,
        ep: &mut Endpoint,
        resp: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.rx.pop(ep, resp, timeout)?;
        self.outstanding = self.outstanding.saturating_sub(1);
        Ok(())
    }

    /// One call: request, then its response.
    pub fn call(
        &mut self,
        ep: &mut Endpoint,
        req: &[u8],
        resp: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.send(ep, req, timeout)?;
        self.recv(ep, resp, timeout)
    }
}

struct Client {
    peer: PeerId,
    rx: QueueReceiver,
    tx: QueueSender,
}

/// An event-driven server: any number of clients, one thread, sleeping on a tripset.
pub struct RpcServer {
    clients: Vec<Client>,
    set: Tripset,
    next: usize,
    req: Vec<u8>,
    resp: Vec<u8>,
}

impl RpcServer {
    /// A server for `size`-byte requests and responses.
    pub fn new(size: usize) -> RpcServer {
        RpcServer {
            clients: Vec::new(),
            set: Tripset::new(),
            next: 0,
            req: vec![0u8; size],
            resp: vec![0u8; size],
        }
    }

    /// Sets up the queues of client `peer` (which calls [`RpcClient::connect`]).
    pub fn add_client(
        &mut self,
        ep: &mut Endpoint,
        peer: PeerId,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let size = self.req.len();
        let rx = QueueReceiver::connect(ep, peer, tag, size, SLOTS, timeout)?;
        let tx = QueueSender::connect(ep, peer, tag + 1, size, SLOTS, timeout)?;
        self.set.add(rx.tripwire());
        self.clients.push(Client { peer, rx, tx });
        Ok(())
    }

    /// Serves every request waiting (one sweep over the clients, round-robin), calling
    /// `handler(client, request, response)`; returns how many were served.
    pub fn poll(
        &mut self,
        ep: &mut Endpoint,
        mut handler: impl FnMut(PeerId, &[u8], &mut [u8]),
    ) -> Result<usize> {
        let n = self.clients.len();
        let mut served = 0;
        for k in 0..n {
            let c = &mut self.clients[(self.next + k) % n];
            // A client that died is skipped (its last requests go unanswered); the
            // others go on being served.
            while ep.is_alive(c.peer) && c.rx.try_pop(ep, &mut self.req)? {
                handler(c.peer, &self.req, &mut self.resp);
                // Never full: a client has at most `SLOTS - 1` requests in flight.
                match c.tx.push(ep, &self.resp, None) {
                    Ok(()) => served += 1,
                    Err(Error::PeerDead(_)) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        self.next = (self.next + 1) % n.max(1);
        Ok(served)
    }

    /// Serves requests until at least one was served: polls, spins a little, then sleeps
    /// on the tripset; `Error::Timeout` after `timeout`.
    pub fn serve(
        &mut self,
        ep: &mut Endpoint,
        mut handler: impl FnMut(PeerId, &[u8], &mut [u8]),
        timeout: Option<Duration>,
    ) -> Result<usize> {
        if self.clients.is_empty() {
            return Err(Error::Invalid("an RPC server without clients".into()));
        }
        let end = deadline(timeout);
        let mut polls = 0u32;
        loop {
            let n = self.poll(ep, &mut handler)?;
            if n > 0 {
                return Ok(n);
            }
            // No single peer to watch: `poll` skips dead clients.
            if !spin(ep, None, &mut polls, end)? {
                continue;
            }
            for c in &mut self.clients {
                if ep.is_alive(c.peer) {
                    c.rx.prepare_sleep(ep)?;
                }
            }
            let n = self.poll(ep, &mut handler)?;
            if n > 0 {
                return Ok(n);
            }
            nap(ep, &self.set.ids, end)?;
        }
    }
}
