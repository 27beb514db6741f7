//! Request/response over apertures: each client has a request queue into the server's
//! aperture and a response queue into its own ([`super::dqueue`]); the server waits on a
//! tripset over every client's request queue, so it sleeps until some client writes.

use super::dqueue::{QueueReceiver, QueueSender, MAX_SLEEP};
use crate::rma::Tripset;
use crate::{Endpoint, Error, PeerId, Result};
use std::time::{Duration, Instant};

/// Slots per queue (requests in flight per client: one less).
const SLOTS: usize = 16;

/// A client of an [`RpcServer`].
pub struct RpcClient {
    tx: QueueSender,
    rx: QueueReceiver,
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
        Ok(RpcClient { tx, rx })
    }

    /// Sends a request without waiting for its response (up to 15 in flight).
    pub fn send(&mut self, ep: &mut Endpoint, req: &[u8], timeout: Option<Duration>) -> Result<()> {
        self.tx.push(ep, req, timeout)
    }

    /// Receives the next response, in request order.
    pub fn recv(
        &mut self,
        ep: &mut Endpoint,
        resp: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.rx.pop(ep, resp, timeout)
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
    size: usize,
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
            size,
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
        let rx = QueueReceiver::connect(ep, peer, tag, self.size, SLOTS, timeout)?;
        let tx = QueueSender::connect(ep, peer, tag + 1, self.size, SLOTS, timeout)?;
        self.set.add(rx.tripwire());
        self.clients.push(Client { peer, rx, tx });
        Ok(())
    }

    /// Number of clients.
    pub fn clients(&self) -> usize {
        self.clients.len()
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
            while c.rx.try_pop(ep, &mut self.req)? {
                handler(c.peer, &self.req, &mut self.resp);
                c.tx.push(ep, &self.resp, None)?;
                served += 1;
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
        let end = timeout.map(|t| Instant::now() + t);
        let mut spins = 0u32;
        loop {
            let n = self.poll(ep, &mut handler)?;
            if n > 0 {
                return Ok(n);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                ep.progress();
            }
            if spins < 1 << 12 {
                continue;
            }
            spins = 0;
            for c in &mut self.clients {
                c.rx.prepare_sleep(ep)?;
            }
            let n = self.poll(ep, &mut handler)?;
            if n > 0 {
                return Ok(n);
            }
            let left = end.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::Timeout);
            }
            let nap = left.map_or(MAX_SLEEP, |l| l.min(MAX_SLEEP));
            match ep.wait_tripset(&self.set, Some(nap)) {
                Ok(_) | Err(Error::Timeout) => {}
                Err(e) => return Err(e),
            }
        }
    }
}
