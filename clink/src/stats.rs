//! Counters for every decision a performance question needs.

/// Per-endpoint counters (monotonic since the endpoint was created).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames written into peers' rings.
    pub frames_sent: u64,
    /// Frames read from peers' rings.
    pub frames_received: u64,
    /// Messages sent eagerly (copied through the ring).
    pub eager_sends: u64,
    /// Messages sent by rendezvous.
    pub rendezvous_sends: u64,
    /// Payload bytes copied into rings (eager, sender side).
    pub eager_bytes: u64,
    /// Payload bytes moved by a single CMA copy (receiver side; of a split rendezvous, the
    /// half the sender wrote too).
    pub cma_bytes: u64,
    /// CMA rendezvous receives split between the two sides (see `CLINK_CMA_SPLIT`).
    pub cma_splits: u64,
    /// Payload bytes moved by the two-copy pipeline through the ring (receiver side).
    pub pipeline_bytes: u64,
    /// Eager messages that arrived before their receive and were copied aside.
    pub unexpected: u64,
    /// Times a send found the peer's ring full and queued.
    pub ring_full: u64,
    /// Doorbells rung (wake-up system calls made by this endpoint).
    pub doorbells: u64,
    /// Times this endpoint blocked in the kernel.
    pub sleeps: u64,
    /// Of those, the sleeps on a lone peer's futex (not epoll).
    pub futex_sleeps: u64,
    /// Waits that spun their whole spin time in vain (or got what they awaited only
    /// after the thread had lost its CPU while spinning).
    pub spins_failed: u64,
    /// Times waits stopped spinning for a while because their spins kept failing
    /// ([`clink_proto::spin::SpinGate`]).
    pub spin_closures: u64,
    /// Liveness / connection checks (epoll_wait with zero timeout while busy).
    pub liveness_checks: u64,
    /// Malformed frames or ring contents received (the peer is dropped).
    pub protocol_errors: u64,
    /// Peers that died, hung up or were dropped.
    pub peers_failed: u64,
    /// Incoming connections refused (bad handshake, other uid, silent, ...).
    pub handshakes_refused: u64,
    /// Peers connected (both directions).
    pub peers_connected: u64,
    /// Network path (UDP): datagrams sent (GSO segments counted one by one).
    pub datagrams_sent: u64,
    /// Network path: datagrams received (after splitting coalesced reads).
    pub datagrams_received: u64,
    /// Network path: system calls that sent datagrams (`sendmmsg`).
    pub send_calls: u64,
    /// Network path: system calls that received datagrams (`recvmmsg` returning data).
    pub recv_calls: u64,
    /// Network path: coalesced (GRO) reads.
    pub gro_reads: u64,
    /// Network path: data datagrams sent again.
    pub retransmissions: u64,
    /// Network path: negative acknowledgements sent.
    pub naks_sent: u64,
    /// Network path: retransmission timer expiries.
    pub timeouts: u64,
    /// Network path: timer expiries answered with one probe (the first of a run: a
    /// stalled receiver's flight is not resent, nor the window cut).
    pub rto_probes: u64,
    /// Network path: congestion-window reductions.
    pub window_cuts: u64,
    /// Network path: losses taken for random link loss (resent, window kept).
    pub random_losses: u64,
    /// Network path: tail loss probes sent.
    pub tail_probes: u64,
    /// Network path: datagrams dropped for a bad checksum.
    pub corrupt_dropped: u64,
    /// Network path: malformed or inconsistent datagrams dropped.
    pub malformed_dropped: u64,
    /// Network path: duplicate datagrams suppressed.
    pub duplicates_dropped: u64,
    /// Network path: datagrams from unknown peers or connections, and bad handshakes.
    pub stray_dropped: u64,
    /// Network path: datagrams the kernel refused on send (resent by the protocol).
    pub send_drops: u64,
    /// Network path: faults injected (`CLINK_FAULTS`): drops, duplicates, corruptions,
    /// delays.
    pub faults_injected: u64,
    /// Network path: bulk (rendezvous) fragments (UDP) or pieces (TCP) found intact at
    /// their place by a speculative receive: zero user-space copies.
    pub spec_hits: u64,
    /// Network path: payload bytes of those hits.
    pub spec_hit_bytes: u64,
    /// Network path: datagrams (UDP) or records (TCP) read into a speculative layout that
    /// were not the expected fragment or piece (moved back, then handled by the ordinary
    /// path).
    pub spec_misses: u64,
    /// Network path: bulk payload bytes copied to their place by the ordinary path
    /// (misses, reads beyond the armed layout, speculation off) or moved there from
    /// another fragment's place.
    pub cleanup_bytes: u64,
    /// Network path (UDP): intact fragments a speculative read left in another's place,
    /// moved to their own with one copy.
    pub spec_moved: u64,
    /// Network path (UDP): times most of the armed stream's fragments missed and
    /// speculation was turned off for a while (`CLINK_UDP_SPEC_BACKOFF`).
    pub spec_backoffs: u64,
    /// Network path, admission control as a receiver: fast streams granted (Fast_Ack).
    pub fast_grants: u64,
    /// Network path: fast-stream requests refused (Fast_NAck).
    pub fast_refusals: u64,
    /// Network path: grants taken back (idle, or held too long while others waited).
    pub fast_revocations: u64,
    /// Network path: bulk fragments received from the stream holding the grant.
    pub granted_fragments: u64,
    /// Network path: those found in place (the granted stream's speculation hits).
    pub granted_hits: u64,
    /// Network path: new bulk fragments received whose payload was hashed end to end
    /// (`CLINK_UDP_PAYLOAD_HASH`; the others' payloads were the UDP checksum's).
    pub bulk_hashed: u64,
    /// Network path: datagrams read from the socket of a steered fast stream (flow
    /// steering, `CLINK_UDP_STEER`).
    pub steered_datagrams: u64,
    /// Network path: datagrams read from the sockets of peers that have one of their own
    /// (`CLINK_UDP_PEER_SOCKETS`).
    pub peer_socket_datagrams: u64,
    /// Network path: datagrams read from the UDP receive ring (`CLINK_UDP_RING`; also
    /// counted in `datagrams_received`).
    pub ring_datagrams: u64,
    /// Network path: datagrams the kernel dropped because the receive ring was full
    /// (repaired by the connection as losses).
    pub ring_full_drops: u64,
    /// Network path: datagrams sent through the receive ring's packet socket to a peer
    /// one hop away (also counted in `datagrams_sent`).
    pub ring_sent: u64,
    /// Network path: notices in the receive ring of a coalesced run of an eager
    /// message's datagrams waiting in a socket, which the endpoint then read at once.
    pub ring_notices: u64,
    /// Network path: keepalive rounds the endpoint's keepalive thread sent to its UDP
    /// peers while the application made no call.
    pub keepalive_rounds: u64,
    /// Network path, as a sender: times this endpoint's bulk streams were granted fast.
    pub fast_granted: u64,
    /// Network path, as a sender: times they were refused or revoked (then sent slowly).
    pub fast_refused: u64,
    /// TCP path: `writev` calls that wrote something.
    pub stream_writes: u64,
    /// TCP path: bytes written to the connections.
    pub stream_bytes_sent: u64,
    /// TCP path: reads that returned data.
    pub stream_reads: u64,
    /// TCP path: bytes read from the connections.
    pub stream_bytes_received: u64,
    /// TCP path: rendezvous payload bytes read straight into the posted buffer after
    /// their header had been seen (no copy; the speculative hits are in `spec_hit_bytes`).
    pub stream_direct_bytes: u64,
    /// One-sided requests this endpoint refused as a target (bad key, revoked, out of
    /// range, missing right, unknown export).
    pub rma_refused: u64,
    /// Bytes peers put into this endpoint's apertures (applied).
    pub rma_put_bytes: u64,
    /// Bytes peers got from this endpoint's apertures.
    pub rma_get_bytes: u64,
    /// Of the bytes put and got, those the copy engine moved (large same-host accesses,
    /// served round-robin across peers).
    pub rma_engine_bytes: u64,
    /// Tripwire firings.
    pub tripwires_fired: u64,
    /// Unacknowledged puts of this endpoint that a target refused.
    pub rma_unacked_refused: u64,
    /// Peer visits prompted by a bit on the activity board.
    pub board_wakeups: u64,
}

impl Stats {
    /// The network path's speculation hit rate as a receiver: the fraction of the bulk
    /// (rendezvous) payload bytes received that a speculative receive found at their
    /// place, `spec_hit_bytes / (spec_hit_bytes + cleanup_bytes)` (all fragments but a
    /// transfer's last have one size, so this is the fraction of fragments too). `None`
    /// before any bulk byte arrived.
    pub fn spec_hit_rate(&self) -> Option<f64> {
        let placed = self.spec_hit_bytes + self.cleanup_bytes;
        (placed > 0).then(|| self.spec_hit_bytes as f64 / placed as f64)
    }

    /// The hit rate of the streams admission control granted (`granted_hits /
    /// granted_fragments`, in fragments); `None` when no granted stream sent any.
    pub fn granted_hit_rate(&self) -> Option<f64> {
        (self.granted_fragments > 0)
            .then(|| self.granted_hits as f64 / self.granted_fragments as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::Stats;

    #[test]
    fn hit_rates() {
        let s = Stats::default();
        assert_eq!((s.spec_hit_rate(), s.granted_hit_rate()), (None, None));
        let s = Stats {
            spec_hit_bytes: 300,
            cleanup_bytes: 100,
            granted_fragments: 10,
            granted_hits: 9,
            ..Stats::default()
        };
        assert_eq!(s.spec_hit_rate(), Some(0.75));
        assert_eq!(s.granted_hit_rate(), Some(0.9));
    }
}
