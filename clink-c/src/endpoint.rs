//! Contexts, endpoints, peers, progress and waiting, statistics.

use crate::*;
use clink_rs::Context;
use std::ffi::{c_char, c_int};

/// A context (`clink_context_create`): the configuration read from the `CLINK_*`
/// environment variables, the measured cost model and the host identity. One per process
/// is enough.
pub struct clink_context_t {
    ctx: Context,
}

impl clink_context_t {
    pub(crate) fn new(ctx: Context) -> clink_context_t {
        clink_context_t { ctx }
    }
}

/// Creates a context configured from the `CLINK_*` environment variables (an unknown
/// `CLINK_*` variable or a bad value fails with `CLINK_ERR_CONFIG`).
///
/// Ownership: on success `*out` is a new context, freed with `clink_context_free`.
/// Thread safety: any thread; a context may be used from several threads at once.
///
/// # Safety
/// `out` must be NULL (refused) or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn clink_context_create(out: *mut *mut clink_context_t) -> c_int {
    ffi("clink_context_create", || {
        need_out(out, "out")?;
        let ctx = Context::new()?;
        out.write(Box::into_raw(Box::new(clink_context_t { ctx })));
        Ok(OK)
    })
}

/// Frees a context. Endpoints created from it stay valid (they share its state).
/// NULL is ignored.
///
/// Thread safety: no other call may be using this context.
///
/// # Safety
/// `ctx` must be NULL or a context from `clink_context_create` not freed yet.
#[no_mangle]
pub unsafe extern "C" fn clink_context_free(ctx: *mut clink_context_t) {
    if !ctx.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(ctx))));
    }
}

/// The host key of a context (machine and network namespace, hashed): two endpoints share
/// memory only when their keys are equal. 0 for a NULL context.
///
/// Thread safety: any thread.
///
/// # Safety
/// `ctx` must be NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn clink_context_host(ctx: *const clink_context_t) -> u64 {
    ctx.as_ref().map_or(0, |c| c.ctx.host())
}

/// Creates an endpoint listening for peers.
///
/// Ownership: on success `*out` is a new endpoint, freed with `clink_endpoint_free`.
/// Thread safety: the context may be shared; the new endpoint is used by one thread at a
/// time (see the preamble). Fork: an endpoint belongs to the process that created it; a
/// forked child creates its own context and endpoints.
///
/// # Safety
/// `ctx` must be a live context and `out` writable storage for a pointer (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_create(
    ctx: *const clink_context_t,
    out: *mut *mut clink_endpoint_t,
) -> c_int {
    ffi("clink_endpoint_create", || {
        let ctx = ctx.as_ref().ok_or_else(|| Fail::null("context"))?;
        need_out(out, "out")?;
        let ep = ctx.ctx.endpoint()?;
        out.write(Box::into_raw(Box::new(clink_endpoint_t::new(ep))));
        Ok(OK)
    })
}

/// Closes and frees an endpoint: peers are told goodbye (their requests towards it fail),
/// its pending requests fail, its apertures go away (peers' mappings stay but are no longer
/// read). Request, remote, window and event-sender handles made from it stay valid to free
/// (a window keeps its memory mapped); using a request with another endpoint is refused.
/// NULL is ignored (`CLINK_OK`).
///
/// Returns `CLINK_ERR_BUSY` (and frees nothing) while another thread is in a call on it,
/// an in-place receive or send slot still holds it, or it is bound to another thread.
///
/// # Safety
/// `ep` must be NULL or an endpoint from `clink_endpoint_create` not freed yet.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_free(ep: *mut clink_endpoint_t) -> c_int {
    if ep.is_null() {
        return OK;
    }
    ffi("clink_endpoint_free", || {
        (*ep).lock().or_else(|e| {
            // A poisoned endpoint is still freed.
            if e.code == CLINK_ERR_PANIC {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        let b = Box::from_raw(ep);
        // Dropping closes it (goodbyes, a bounded linger for network peers).
        drop(b);
        Ok(OK)
    })
}

/// The endpoint's printable address (`clink:host=..;id=..;shm=..;...`): give it to the
/// other process, which passes it to `clink_connect`. NULL for a NULL endpoint.
///
/// Ownership: the string belongs to the endpoint and lives as long as it does.
/// Thread safety: any thread (the address never changes).
///
/// # Safety
/// `ep` must be NULL or a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_address(ep: *const clink_endpoint_t) -> *const c_char {
    ep.as_ref().map_or(std::ptr::null(), |h| h.address.as_ptr())
}

/// Binds the endpoint to the calling thread: from now on only this thread may call on it
/// (other threads' calls return `CLINK_ERR_BUSY` without touching it), and its calls claim
/// the endpoint with a plain load and store instead of an atomic compare-and-swap, which
/// shortens every send and receive (as libfabric's `FI_THREAD_DOMAIN` and a
/// single-threaded UCX worker do, but checked). Binding again from the owner does nothing.
/// `CLINK_ERR_BUSY` if another thread is in a call, holds a borrow (in-place message,
/// send slot) or owns the binding.
///
/// Thread safety: any thread. A thread that exits while it owns an endpoint should unbind
/// it first (a later thread could be given the same `pthread_t`).
///
/// # Safety
/// `ep` must be a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_bind_thread(ep: *mut clink_endpoint_t) -> c_int {
    ffi("clink_endpoint_bind_thread", || {
        let h = ep_ref(ep)?;
        h.owner.bind().map_err(|r| h.refused(r))?;
        Ok(OK)
    })
}

/// Gives up the calling thread's binding (`clink_endpoint_bind_thread`): any thread may
/// call on the endpoint again, one at a time. Nothing to do if it is not bound;
/// `CLINK_ERR_BUSY` if another thread owns it or this thread still holds a borrow of it
/// (an in-place message or send slot not given back).
///
/// Thread safety: the owning thread.
///
/// # Safety
/// `ep` must be a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_unbind_thread(ep: *mut clink_endpoint_t) -> c_int {
    ffi("clink_endpoint_unbind_thread", || {
        let h = ep_ref(ep)?;
        h.owner.unbind().map_err(|r| h.refused(r))?;
        Ok(OK)
    })
}

/// Says that this endpoint will connect to about `n` peers on its host (a job's other
/// local ranks): its connections' rings are sized for that many from the first (see
/// `CLINK_RING_SHRINK`; a full mesh of N processes holds N(N-1)/2 pairs of rings).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` must be a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_expect_peers(ep: *mut clink_endpoint_t, n: usize) -> c_int {
    with_ep("clink_endpoint_expect_peers", ep, |e, _| {
        e.expect_peers(n);
        Ok(OK)
    })
}

/// Connects to the endpoint at `address` (a string from its `clink_endpoint_address`) and
/// stores the new peer in `*peer`. Shared memory on the same host and network namespace,
/// else UDP or TCP (see `CLINK_TRANSPORT`). The wait for the other side is bounded by
/// `CLINK_CONNECT_TIMEOUT_MS` (the Rust API takes no per-call timeout for connects);
/// peers connecting to this endpoint meanwhile are answered.
///
/// Thread safety: one thread at a time per endpoint (`CLINK_ERR_BUSY` otherwise).
///
/// # Safety
/// `ep` a live endpoint, `address` a NUL-terminated string, `peer` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_connect(
    ep: *mut clink_endpoint_t,
    address: *const c_char,
    peer: *mut clink_peer_t,
) -> c_int {
    with_ep("clink_connect", ep, |e, _| {
        let a = c_str(address, "address")?;
        need_out(peer, "peer")?;
        let p = e.connect(a)?;
        peer.write(p.0);
        Ok(OK)
    })
}

/// Waits up to `timeout_ms` (-1: forever, 0: only what is already there) for a peer to
/// connect and stores it in `*peer`. Peers that connected earlier are returned first, one
/// per call. `CLINK_ERR_TIMEOUT` when none came.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `peer` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_accept(
    ep: *mut clink_endpoint_t,
    timeout_ms: c_int,
    peer: *mut clink_peer_t,
) -> c_int {
    with_ep("clink_accept", ep, |e, _| {
        need_out(peer, "peer")?;
        let p = e.accept(timeout(timeout_ms))?;
        peer.write(p.0);
        Ok(OK)
    })
}

/// Says goodbye to every peer (they see this endpoint as closed; requests towards them
/// fail with `CLINK_ERR_PEER_DEAD`), after delivering what is queued towards each while
/// it takes it. Over UDP what a connection's window holds back after a non-blocking send
/// (a blocking one returns once nothing is held back) and the fragments of large
/// messages go only while the endpoint is driven: a process that sends its last message
/// so and then waits outside clink (for a child to exit, say) closes first. The endpoint
/// is still to be freed.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_close(ep: *mut clink_endpoint_t) -> c_int {
    with_ep("clink_endpoint_close", ep, |e, _| {
        e.close();
        Ok(OK)
    })
}

/// The number of peers connected so far, alive or not (peers are numbered 0..count-1).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `count` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_peer_count(ep: *mut clink_endpoint_t, count: *mut u32) -> c_int {
    with_ep("clink_peer_count", ep, |e, _| {
        need_out(count, "count")?;
        count.write(e.peers().len() as u32);
        Ok(OK)
    })
}

/// Whether `peer` is connected and alive: `*alive` = 1 or 0 (0 for an unknown peer).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `alive` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_peer_alive(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    alive: *mut c_int,
) -> c_int {
    with_ep("clink_peer_alive", ep, |e, _| {
        need_out(alive, "alive")?;
        alive.write(c_int::from(e.is_alive(PeerId(peer))));
        Ok(OK)
    })
}

/// Information about one peer: the transport reaching it (a static string "shm", "udp"
/// or "tcp"), the largest message sent to it eagerly (larger ones go by rendezvous), and
/// whether its rendezvous messages are read with one CMA copy. Any out pointer may be NULL.
///
/// Thread safety: one thread at a time per endpoint. Ownership: the transport string is
/// static.
///
/// # Safety
/// `ep` a live endpoint; each out pointer NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_peer_info(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    transport: *mut *const c_char,
    eager_max: *mut u64,
    uses_cma: *mut c_int,
) -> c_int {
    with_ep("clink_peer_info", ep, |e, _| {
        let p = PeerId(peer);
        let t = match e.transport(p)? {
            "shm" => c"shm",
            "udp" => c"udp",
            "tcp" => c"tcp",
            _ => c"other",
        };
        put_opt(transport, t.as_ptr());
        put_opt(eager_max, e.eager_max(p)?);
        put_opt(uses_cma, c_int::from(e.uses_cma(p)?));
        Ok(OK)
    })
}

/// How the connection to `peer` was made: `*connected` 1 when this endpoint connected (0:
/// it accepted), `*crossed` 1 when the two ends were connecting to each other at once
/// (the pair then holds two connections), `*superseded` 1 when this is the one of those
/// two that both ends leave unused (the other, which the endpoint with the smaller
/// identity made, is the one to send and receive on). Any out pointer may be NULL.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; each out pointer NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_peer_joined(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    connected: *mut c_int,
    crossed: *mut c_int,
    superseded: *mut c_int,
) -> c_int {
    with_ep("clink_peer_joined", ep, |e, _| {
        let j = e.joined(PeerId(peer))?;
        put_opt(connected, c_int::from(j.connected));
        put_opt(crossed, c_int::from(j.crossed));
        put_opt(superseded, c_int::from(j.superseded));
        Ok(OK)
    })
}

/// Copies the endpoint's last peer failure or protocol error (diagnostics, as opposed to
/// `clink_last_error`, which is about the last failing call) into `buf` (NUL-terminated,
/// cut to `cap` bytes); `*len` (if not NULL) gets its full length. `CLINK_AGAIN` when
/// there is none (`buf` then holds "").
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `buf` NULL (only with `cap` 0) or `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_diagnostic(
    ep: *mut clink_endpoint_t,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> c_int {
    with_ep("clink_endpoint_diagnostic", ep, |e, _| {
        let out = bytes_mut(buf.cast(), cap, "buf")?;
        let msg = e.last_error().unwrap_or("");
        put_opt(len, msg.len());
        if let Some(room) = cap.checked_sub(1) {
            let n = msg.len().min(room);
            out[..n].copy_from_slice(&msg.as_bytes()[..n]);
            out[n] = 0;
        }
        Ok(if msg.is_empty() { AGAIN } else { OK })
    })
}

/// Makes progress without blocking: drains peers' rings, matches, answers rendezvous,
/// flushes queued sends, and now and then checks liveness and accepts connections.
/// Returns 1 when anything happened, 0 when nothing did, a negative error otherwise.
/// There is no background thread: a process that computes for long stretches calls this
/// now and then (over the network at least every `CLINK_NET_DEAD_MS`, or peers declare it
/// dead).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_progress(ep: *mut clink_endpoint_t) -> c_int {
    with_ep("clink_progress", ep, |e, _| Ok(c_int::from(e.progress())))
}

/// The endpoint's file descriptor for poll/epoll/select, level-triggered: readable when a
/// message, connection or peer failure may be pending. Before blocking on it call
/// `clink_prepare_wait` (block only when it returns 1), after waking `clink_finish_wait`
/// then `clink_progress` (or any receive/test). Returns the fd (>= 0) or a negative error.
///
/// Ownership: the fd belongs to the endpoint; do not close it. Thread safety: any thread
/// may poll the fd; the calls around it are one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_fd(ep: *mut clink_endpoint_t) -> c_int {
    with_ep("clink_endpoint_fd", ep, |e, _| Ok(e.fd()))
}

/// Prepares to block on `clink_endpoint_fd`: consumes the fd's pending readiness, asks
/// every peer for a doorbell on its next message, then re-checks. Returns 1 when it is
/// safe to block, 0 when work arrived meanwhile (do not block: call `clink_progress`),
/// a negative error otherwise.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_prepare_wait(ep: *mut clink_endpoint_t) -> c_int {
    with_ep("clink_prepare_wait", ep, |e, _| {
        Ok(c_int::from(e.prepare_wait()))
    })
}

/// Withdraws the doorbell requests of a `clink_prepare_wait` that returned 1 (call it
/// after waking, before `clink_progress`).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_finish_wait(ep: *mut clink_endpoint_t) -> c_int {
    with_ep("clink_finish_wait", ep, |e, _| {
        e.finish_wait();
        Ok(OK)
    })
}

/// The endpoint's main counters (monotonic since it was created). Every counter, these
/// and the others (spins, losses, speculation, admission control, ...), can be read by
/// name with `clink_endpoint_stat` (names listed by `clink_stat_name`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct clink_stats_t {
    /// Frames written into peers' rings or links.
    pub frames_sent: u64,
    /// Frames read from peers.
    pub frames_received: u64,
    /// Messages sent eagerly (copied through the ring).
    pub eager_sends: u64,
    /// Messages sent by rendezvous.
    pub rendezvous_sends: u64,
    /// Payload bytes copied into rings (eager, sender side).
    pub eager_bytes: u64,
    /// Payload bytes moved by a single CMA copy (receiver side).
    pub cma_bytes: u64,
    /// Payload bytes moved by the two-copy pipeline (receiver side).
    pub pipeline_bytes: u64,
    /// Eager messages that arrived before their receive and were copied aside.
    pub unexpected: u64,
    /// Times a send found the peer's ring full and queued.
    pub ring_full: u64,
    /// Doorbells rung (wake-up system calls made).
    pub doorbells: u64,
    /// Times the endpoint blocked in the kernel.
    pub sleeps: u64,
    /// Malformed frames received (the peer is dropped).
    pub protocol_errors: u64,
    /// Peers that died, hung up or were dropped.
    pub peers_failed: u64,
    /// Incoming connections refused.
    pub handshakes_refused: u64,
    /// Peers connected (both directions).
    pub peers_connected: u64,
    /// Network: datagrams sent.
    pub datagrams_sent: u64,
    /// Network: datagrams received.
    pub datagrams_received: u64,
    /// Network: data datagrams sent again.
    pub retransmissions: u64,
    /// Network: bulk fragments found in place by a speculative receive (zero copies).
    pub spec_hits: u64,
    /// Network: datagrams read into a speculative layout that were not the expected ones.
    pub spec_misses: u64,
    /// TCP: bytes written to the connections.
    pub stream_bytes_sent: u64,
    /// TCP: bytes read from the connections.
    pub stream_bytes_received: u64,
    /// One-sided requests this endpoint refused as a target.
    pub rma_refused: u64,
    /// Bytes peers put into this endpoint's apertures.
    pub rma_put_bytes: u64,
    /// Bytes peers got from this endpoint's apertures.
    pub rma_get_bytes: u64,
    /// Tripwire firings.
    pub tripwires_fired: u64,
}

impl From<clink_rs::Stats> for clink_stats_t {
    fn from(s: clink_rs::Stats) -> Self {
        clink_stats_t {
            frames_sent: s.frames_sent,
            frames_received: s.frames_received,
            eager_sends: s.eager_sends,
            rendezvous_sends: s.rendezvous_sends,
            eager_bytes: s.eager_bytes,
            cma_bytes: s.cma_bytes,
            pipeline_bytes: s.pipeline_bytes,
            unexpected: s.unexpected,
            ring_full: s.ring_full,
            doorbells: s.doorbells,
            sleeps: s.sleeps,
            protocol_errors: s.protocol_errors,
            peers_failed: s.peers_failed,
            handshakes_refused: s.handshakes_refused,
            peers_connected: s.peers_connected,
            datagrams_sent: s.datagrams_sent,
            datagrams_received: s.datagrams_received,
            retransmissions: s.retransmissions,
            spec_hits: s.spec_hits,
            spec_misses: s.spec_misses,
            stream_bytes_sent: s.stream_bytes_sent,
            stream_bytes_received: s.stream_bytes_received,
            rma_refused: s.rma_refused,
            rma_put_bytes: s.rma_put_bytes,
            rma_get_bytes: s.rma_get_bytes,
            tripwires_fired: s.tripwires_fired,
        }
    }
}

/// Copies the endpoint's counters into `*out`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `out` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_stats(
    ep: *mut clink_endpoint_t,
    out: *mut clink_stats_t,
) -> c_int {
    with_ep("clink_endpoint_stats", ep, |e, _| {
        need_out(out, "out")?;
        out.write(e.stats().into());
        Ok(OK)
    })
}

/// Reads the endpoint's counter called `name` into `*out`: any of the endpoint's counters,
/// those of `clink_stats_t` and the rest (spins, losses, speculation, the receive ring,
/// ...), by the names `clink_stat_name` lists. An unknown name gives `CLINK_ERR_INVALID`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `name` a NUL-terminated string, `out` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_endpoint_stat(
    ep: *mut clink_endpoint_t,
    name: *const c_char,
    out: *mut u64,
) -> c_int {
    with_ep("clink_endpoint_stat", ep, |e, _| {
        let name = c_str(name, "name")?;
        need_out(out, "out")?;
        let v = e
            .stats()
            .get(name)
            .ok_or_else(|| Fail::invalid(format!("no counter called {name:?}")))?;
        out.write(v);
        Ok(OK)
    })
}

/// Returns the name of counter number `index` (from 0) of `clink_endpoint_stat`, or NULL
/// past the last: a program lists every counter with a loop until NULL.
///
/// Thread safety: any thread. Ownership: static; do not free it.
#[no_mangle]
pub extern "C" fn clink_stat_name(index: usize) -> *const c_char {
    static NAMES: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        clink_rs::Stats::NAMES
            .iter()
            .filter_map(|n| std::ffi::CString::new(*n).ok())
            .collect()
    });
    names.get(index).map_or(std::ptr::null(), |n| n.as_ptr())
}

/// The reliable UDP connection to a network peer as it stands (as QUIC stacks report it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct clink_conn_stats_t {
    /// Smoothed round-trip time, ns (0 before a sample).
    pub srtt_ns: u64,
    /// Least round-trip time in the current 10-second window, ns.
    pub min_rtt_ns: u64,
    /// Retransmission timeout with backoff, ns.
    pub rto_ns: u64,
    /// Congestion window, packets.
    pub cwnd: u64,
    /// Slow-start threshold, packets.
    pub ssthresh: u64,
    /// Packets in flight.
    pub in_flight: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Bytes of those datagrams.
    pub bytes_sent: u64,
    /// Valid datagrams received.
    pub datagrams_received: u64,
    /// Bytes of those datagrams.
    pub bytes_received: u64,
    /// Data datagrams sent again.
    pub retransmissions: u64,
    /// Packets declared lost.
    pub lost: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
}

/// Copies the UDP connection state of `peer` into `*out`. `CLINK_ERR_UNSUPPORTED` for a
/// peer over shared memory or TCP (no such connection).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `out` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_peer_conn_stats(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    out: *mut clink_conn_stats_t,
) -> c_int {
    with_ep("clink_peer_conn_stats", ep, |e, _| {
        need_out(out, "out")?;
        let s = e.conn_stats(PeerId(peer))?.ok_or_else(|| {
            Fail::new(
                CLINK_ERR_UNSUPPORTED,
                "connection statistics exist only for UDP peers",
            )
        })?;
        out.write(clink_conn_stats_t {
            srtt_ns: s.srtt_ns,
            min_rtt_ns: s.min_rtt_ns,
            rto_ns: s.rto_ns,
            cwnd: s.cwnd,
            ssthresh: s.ssthresh,
            in_flight: s.in_flight,
            datagrams_sent: s.datagrams_sent,
            bytes_sent: s.bytes_sent,
            datagrams_received: s.datagrams_received,
            bytes_received: s.bytes_received,
            retransmissions: s.retransmissions,
            lost: s.lost,
            timeouts: s.timeouts,
        });
        Ok(OK)
    })
}

/// Admission control (UDP peers): asks `peer` to take this endpoint's bulk transfers as its
/// one fast stream and waits up to `timeout_ms` (-1 forever) for the answer: `*granted`
/// = 1 granted, 0 refused (the request stays queued at the peer). With admission control
/// off every stream is fast (1 at once).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `granted` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_request_fast(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    timeout_ms: c_int,
    granted: *mut c_int,
) -> c_int {
    with_ep("clink_request_fast", ep, |e, _| {
        // "Forever" as a year: the wait adds it to the clock.
        let t = timeout(timeout_ms).unwrap_or(Duration::from_secs(365 * 86_400));
        let g = e.request_fast(PeerId(peer), t)?;
        put_opt(granted, c_int::from(g));
        Ok(OK)
    })
}

/// Gives back the fast stream `peer` granted (or withdraws the request).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_release_fast(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
) -> c_int {
    with_ep("clink_release_fast", ep, |e, _| {
        e.release_fast(PeerId(peer))?;
        Ok(OK)
    })
}

/// Whether this endpoint's bulk transfers to `peer` go fast now: `*fast` = 1 or 0 (0 for a
/// shared-memory or TCP peer).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint, `fast` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_is_fast(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    fast: *mut c_int,
) -> c_int {
    with_ep("clink_is_fast", ep, |e, _| {
        need_out(fast, "fast")?;
        fast.write(c_int::from(e.is_fast(PeerId(peer))?));
        Ok(OK)
    })
}
