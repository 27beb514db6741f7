//! clink for tokio: an [`AsyncEndpoint`] wraps a [`clink::Endpoint`] and waits for it
//! through tokio's reactor instead of blocking a thread.
//!
//! Every wait follows the endpoint's own protocol for external event loops: try the
//! operation (each try makes progress), spin for a short while ([`AsyncEndpoint::with_spin`],
//! 20 µs by default: a reply that is a round trip away comes back without a sleep; not
//! while spins keep failing, as they do when the answer must come from a task of the same
//! thread: see `clink_proto::spin`), then
//! [`Endpoint::prepare_wait`]; when it says blocking is safe, park the task on the
//! endpoint's fd ([`Endpoint::fd`], registered with [`AsyncFd`]) and call
//! [`Endpoint::finish_wait`] on waking. No thread is started. A parked task also wakes
//! after [`AsyncEndpoint::with_tick`] (50 ms by default) to run the endpoint's timers: over
//! the network, retransmissions and keepalives only run when the endpoint is called into.
//!
//! The runtime needs its IO and time drivers (`Builder::enable_all`); a `current_thread`
//! runtime serves any number of peers from one task (`examples/server.rs`).
//!
//! ```no_run
//! # async fn f() -> clink::Result<()> {
//! use clink::Selector;
//! let ctx = clink::Context::new()?;
//! let mut ep = clink_tokio::AsyncEndpoint::new(ctx.endpoint()?).expect("tokio runtime");
//! let peer = ep.accept_async().await?;
//! let mut buf = vec![0u8; 1 << 20];
//! let st = ep.recv_async(Selector::any(), &mut buf).await?;
//! ep.send_async(peer, st.tag + 1, buf[..st.len as usize].to_vec()).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

use bytes::Bytes;
use clink::events::Event;
use clink::{Endpoint, Error, PeerId, Received, Result, Selector, Status};
use clink_proto::spin::SpinGate;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Nanoseconds on a monotonic clock (for the spin gate).
fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Withdraws the doorbell requests of a `prepare_wait` however the wait ends (a dropped
/// future included).
struct Armed<'a>(&'a mut Endpoint);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.finish_wait();
    }
}

/// Default spin before parking.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);
/// Default longest park between two progress passes.
pub const DEFAULT_TICK: Duration = Duration::from_millis(50);

/// An endpoint whose waits are futures. See the crate docs for how it waits.
pub struct AsyncEndpoint {
    /// A duplicate of the endpoint's fd (the same epoll instance), owned here so that
    /// the registration never outlives the descriptor it names.
    fd: AsyncFd<OwnedFd>,
    ep: Endpoint,
    spin: Duration,
    /// Closes the spin for a while after several spins in a row failed.
    gate: SpinGate,
    tick: Duration,
    parks: u64,
}

impl AsyncEndpoint {
    /// Wraps `ep`, registering its fd with the current tokio runtime (call it inside one).
    pub fn new(ep: Endpoint) -> std::io::Result<AsyncEndpoint> {
        // SAFETY: the endpoint's fd is open while the endpoint lives, for this call.
        let dup = unsafe { BorrowedFd::borrow_raw(ep.fd()) }.try_clone_to_owned()?;
        // SAFETY: `dup` is an open descriptor owned by the AsyncFd for its whole life.
        let fd = unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(AsyncEndpoint {
            fd,
            ep,
            spin: DEFAULT_SPIN,
            gate: SpinGate::new(),
            tick: DEFAULT_TICK,
            parks: 0,
        })
    }

    /// Sets how long a wait spins (trying the operation) before it parks the task.
    pub fn with_spin(mut self, spin: Duration) -> AsyncEndpoint {
        self.spin = spin;
        self
    }

    /// Sets the longest a parked task sleeps before making progress anyway.
    pub fn with_tick(mut self, tick: Duration) -> AsyncEndpoint {
        self.tick = tick;
        self
    }

    /// How many times a wait parked the task on the endpoint's fd.
    pub fn parks(&self) -> u64 {
        self.parks
    }

    /// How many waits spun their whole spin time in vain before they parked.
    pub fn spins_failed(&self) -> u64 {
        self.gate.counts().0
    }

    /// The endpoint, for the calls that do not wait (`address`, `peers`, `probe`, `isend`,
    /// `stats`, ...) and the blocking ones that are short (`connect`).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The endpoint, mutably.
    pub fn endpoint_mut(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    /// Unwraps the endpoint (deregistering its fd).
    pub fn into_inner(self) -> Endpoint {
        let AsyncEndpoint { fd, ep, .. } = self;
        drop(fd);
        ep
    }

    /// Calls `f` (which should make progress, as every endpoint operation does) until it
    /// returns `Some`, spinning, then parking on the endpoint's fd between tries.
    pub async fn until<T>(
        &mut self,
        mut f: impl FnMut(&mut Endpoint) -> Result<Option<T>>,
    ) -> Result<T> {
        loop {
            if let Some(v) = f(&mut self.ep)? {
                return Ok(v);
            }
            if !self.spin.is_zero() && self.spin_open() {
                let start = Instant::now();
                while start.elapsed() < self.spin {
                    if let Some(v) = f(&mut self.ep)? {
                        self.gate.hit();
                        return Ok(v);
                    }
                    std::hint::spin_loop();
                }
                self.gate.miss(clock_ns());
            }
            if !self.ep.prepare_wait() {
                // Work arrived meanwhile: try again, letting the other tasks run first.
                tokio::task::yield_now().await;
                continue;
            }
            self.parks += 1;
            let armed = Armed(&mut self.ep);
            let woke = tokio::time::timeout(self.tick, self.fd.readable()).await;
            drop(armed);
            match woke {
                Ok(Ok(mut guard)) => guard.clear_ready(),
                Ok(Err(e)) => {
                    return Err(Error::Io {
                        what: "waiting on the endpoint's fd".into(),
                        source: e,
                    })
                }
                Err(_) => {} // the tick: make progress
            }
        }
    }

    /// Whether a wait may spin (the gate is open; reads the clock only when it may not).
    fn spin_open(&self) -> bool {
        !self.gate.maybe_closed() || self.gate.open(clock_ns())
    }

    /// Waits for a peer to connect; returns it.
    pub async fn accept_async(&mut self) -> Result<PeerId> {
        self.until(|ep| match ep.accept(Some(Duration::ZERO)) {
            Ok(p) => Ok(Some(p)),
            Err(Error::Timeout) => Ok(None),
            Err(e) => Err(e),
        })
        .await
    }

    /// Receives a message matching `sel` into `buf`: waits for it to arrive without
    /// blocking the runtime, then receives it with [`Endpoint::recv`] (the bytes land in
    /// `buf` directly; for a large message this moves the whole transfer in the call).
    /// Nothing is posted while it waits, so dropping the future loses nothing. A message
    /// longer than `buf` fills it and returns [`Error::Truncated`]. Since the transfer of
    /// a rendezvous message runs inside the call, its sender must make progress on its
    /// own meanwhile (another process or thread): for a sender driven by the same thread,
    /// use [`AsyncEndpoint::recv_owned_async`].
    pub async fn recv_async(&mut self, sel: Selector, buf: &mut [u8]) -> Result<Status> {
        self.until(|ep| match ep.probe(sel) {
            Some(st) => ep
                .recv(Selector::exact(Some(st.peer), st.tag), buf)
                .map(Some),
            None => Ok(None),
        })
        .await
    }

    /// Receives a message matching `sel` into `buf` (its length is the capacity), the
    /// transfer included, asynchronously: posts the receive ([`Endpoint::irecv`]) and
    /// waits for its completion. Dropping the future cancels the receive (or, when it had
    /// already matched, lets it complete and drops the message).
    pub async fn recv_owned_async(&mut self, sel: Selector, buf: Vec<u8>) -> Result<Received> {
        let req = self.ep.irecv(sel, buf)?;
        struct Posted<'a> {
            ep: Option<&'a mut AsyncEndpoint>,
            req: clink::RecvRequest,
        }
        impl Drop for Posted<'_> {
            fn drop(&mut self) {
                if let Some(a) = self.ep.take() {
                    // Cancelled future: withdraw the receive (a matched one completes and
                    // is dropped with the endpoint's request table entry).
                    let _ = a.ep.cancel_recv(&self.req);
                }
            }
        }
        let mut p = Posted {
            ep: Some(self),
            req,
        };
        let req = &p.req;
        let a = p.ep.as_mut().expect("set above");
        let r = a.until(|ep| ep.test_recv(req)).await;
        p.ep = None; // completed (or failed): nothing to cancel
        r
    }

    /// Sends `data` to `peer` with `tag` ([`Endpoint::isend`]: a `Vec<u8>` or `Bytes` is
    /// moved, not copied) and waits until it is complete, a rendezvous send included (the
    /// receiver has taken the bytes). Dropping the future lets the send complete on its
    /// own.
    pub async fn send_async(
        &mut self,
        peer: PeerId,
        tag: u64,
        data: impl Into<Bytes>,
    ) -> Result<()> {
        let req = self.ep.isend(peer, tag, data)?;
        self.until(|ep| ep.test_send(&req).map(|done| done.then_some(())))
            .await
    }

    /// The next event of the endpoint's queue (see [`Endpoint::set_interest`]).
    pub async fn wait_event_async(&mut self) -> Result<Event> {
        self.until(|ep| Ok(ep.next_event())).await
    }
}
