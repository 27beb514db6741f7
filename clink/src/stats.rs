//! Counters for every decision a performance question needs.

/// Declares [`Stats`] from its list of counters, with the list of their names in the same
/// order ([`Stats::NAMES`], [`Stats::fields`]): the bindings (C, Python) and the tools read
/// every counter by name without a second list to keep in step.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Per-endpoint counters (monotonic since the endpoint was created).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Stats {
            /// Every counter's name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// Every counter with its name, in the order of [`Stats::NAMES`].
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.iter().copied().zip([$(self.$name),*])
            }
        }
    };
}

counters! {
    /// Frames written into peers' rings.
    frames_sent,
    /// Frames read from peers' rings.
    frames_received,
    /// Messages sent eagerly (copied through the ring).
    eager_sends,
    /// Messages sent by rendezvous.
    rendezvous_sends,
    /// Payload bytes copied into rings (eager, sender side).
    eager_bytes,
    /// Payload bytes moved by a single CMA copy (receiver side; of a split rendezvous, the
    /// half the sender wrote too).
    cma_bytes,
    /// CMA rendezvous receives split between the two sides (see `CLINK_CMA_SPLIT`).
    cma_splits,
    /// Payload bytes moved by the two-copy pipeline through the ring (receiver side).
    pipeline_bytes,
    /// Eager messages that arrived before their receive and were copied aside.
    unexpected,
    /// Times a send found the peer's ring full and queued.
    ring_full,
    /// Doorbells rung (wake-up system calls made by this endpoint).
    doorbells,
    /// Times this endpoint blocked in the kernel.
    sleeps,
    /// Of those, the sleeps on a lone peer's futex (not epoll).
    futex_sleeps,
    /// Waits that spun their whole spin time in vain (or got what they awaited only
    /// after the thread had lost its CPU while spinning).
    spins_failed,
    /// Times waits stopped spinning for a while because their spins kept failing
    /// ([`clink_proto::spin::SpinGate`]).
    spin_closures,
    /// Liveness / connection checks (epoll_wait with zero timeout while busy).
    liveness_checks,
    /// Malformed frames or ring contents received (the peer is dropped).
    protocol_errors,
    /// Peers that died, hung up or were dropped.
    peers_failed,
    /// Incoming connections refused (bad handshake, other uid, silent, ...).
    handshakes_refused,
    /// Incoming connections their connector gave up before they were offered to the
    /// application: UDP ones welcomed but never taken up (it gave up, or fell back to TCP),
    /// TCP ones closed before their hello (it reached this endpoint over UDP after all).
    handshakes_abandoned,
    /// Connections made over TCP because the peer's UDP address did not answer within
    /// `CLINK_UDP_FALLBACK_MS`.
    udp_fallbacks,
    /// Peers connected (both directions).
    peers_connected,
    /// Network path (UDP): datagrams sent (GSO segments counted one by one).
    datagrams_sent,
    /// Network path: datagrams received (after splitting coalesced reads).
    datagrams_received,
    /// Network path: system calls that sent datagrams (`sendmmsg`).
    send_calls,
    /// Network path: system calls that received datagrams (`recvmmsg` returning data).
    recv_calls,
    /// Network path: coalesced (GRO) reads.
    gro_reads,
    /// Network path: data datagrams sent again.
    retransmissions,
    /// Network path: negative acknowledgements sent.
    naks_sent,
    /// Network path: retransmission timer expiries.
    timeouts,
    /// Network path: timer expiries answered with one probe (the first of a run: a
    /// stalled receiver's flight is not resent, nor the window cut).
    rto_probes,
    /// Network path: congestion-window reductions.
    window_cuts,
    /// Network path: losses taken for random link loss (resent, window kept).
    random_losses,
    /// Network path: tail loss probes sent.
    tail_probes,
    /// Network path: datagrams dropped for a bad checksum.
    corrupt_dropped,
    /// Network path: malformed or inconsistent datagrams dropped.
    malformed_dropped,
    /// Network path: duplicate datagrams suppressed.
    duplicates_dropped,
    /// Network path: datagrams from unknown peers or connections, and bad handshakes.
    stray_dropped,
    /// Network path: datagrams the kernel refused on send (resent by the protocol).
    send_drops,
    /// Network path: faults injected (`CLINK_FAULTS`): drops, duplicates, corruptions,
    /// delays.
    faults_injected,
    /// Network path: bulk (rendezvous) fragments (UDP) or pieces (TCP) found intact at
    /// their place by a speculative receive: zero user-space copies.
    spec_hits,
    /// Network path: payload bytes of those hits.
    spec_hit_bytes,
    /// Network path: datagrams (UDP) or records (TCP) read into a speculative layout that
    /// were not the expected fragment or piece (moved back, then handled by the ordinary
    /// path).
    spec_misses,
    /// Network path: bulk payload bytes copied to their place by the ordinary path
    /// (misses, reads beyond the armed layout, speculation off) or moved there from
    /// another fragment's place.
    cleanup_bytes,
    /// Network path (UDP): intact fragments a speculative read left in another's place,
    /// moved to their own with one copy.
    spec_moved,
    /// Network path (UDP): times most of the armed stream's fragments missed and
    /// speculation was turned off for a while (`CLINK_UDP_SPEC_BACKOFF`).
    spec_backoffs,
    /// Network path, admission control as a receiver: fast streams granted (Fast_Ack).
    fast_grants,
    /// Network path: fast-stream requests refused (Fast_NAck).
    fast_refusals,
    /// Network path: grants taken back (idle, or held too long while others waited).
    fast_revocations,
    /// Network path: bulk fragments received from the stream holding the grant.
    granted_fragments,
    /// Network path: those found in place (the granted stream's speculation hits).
    granted_hits,
    /// Network path: new bulk fragments received whose payload was hashed end to end
    /// (`CLINK_UDP_PAYLOAD_HASH`; the others' payloads were the UDP checksum's).
    bulk_hashed,
    /// Network path: datagrams read from the socket of a steered fast stream (flow
    /// steering, `CLINK_UDP_STEER`).
    steered_datagrams,
    /// Network path: datagrams read from the sockets of peers that have one of their own
    /// (`CLINK_UDP_PEER_SOCKETS`).
    peer_socket_datagrams,
    /// Network path: datagrams read from the UDP receive ring (`CLINK_UDP_RING`; also
    /// counted in `datagrams_received`).
    ring_datagrams,
    /// Network path: datagrams the kernel dropped because the receive ring was full
    /// (repaired by the connection as losses).
    ring_full_drops,
    /// Network path: datagrams sent through the receive ring's packet socket to a peer
    /// one hop away (also counted in `datagrams_sent`).
    ring_sent,
    /// Network path: notices in the receive ring of a coalesced run of an eager
    /// message's datagrams waiting in a socket, which the endpoint then read at once.
    ring_notices,
    /// Network path: keepalive rounds the endpoint's keepalive thread sent to its UDP
    /// peers while the application made no call.
    keepalive_rounds,
    /// Network path, as a sender: times this endpoint's bulk streams were granted fast.
    fast_granted,
    /// Network path, as a sender: times they were refused or revoked (then sent slowly).
    fast_refused,
    /// TCP path: `writev` calls that wrote something.
    stream_writes,
    /// TCP path: bytes written to the connections.
    stream_bytes_sent,
    /// TCP path: reads that returned data.
    stream_reads,
    /// TCP path: bytes read from the connections.
    stream_bytes_received,
    /// TCP path: rendezvous payload bytes read straight into the posted buffer after
    /// their header had been seen (no copy; the speculative hits are in `spec_hit_bytes`).
    stream_direct_bytes,
    /// One-sided requests this endpoint refused as a target (bad key, revoked, out of
    /// range, missing right, unknown export).
    rma_refused,
    /// Bytes peers put into this endpoint's apertures (applied).
    rma_put_bytes,
    /// Bytes peers got from this endpoint's apertures.
    rma_get_bytes,
    /// Of the bytes put and got, those the copy engine moved (large same-host accesses,
    /// served round-robin across peers).
    rma_engine_bytes,
    /// Tripwire firings.
    tripwires_fired,
    /// Unacknowledged puts of this endpoint that a target refused.
    rma_unacked_refused,
    /// Peer visits prompted by a bit on the activity board.
    board_wakeups,
}

impl Stats {
    /// The counter called `name` (one of [`Stats::NAMES`]).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.fields().find(|&(n, _)| n == name).map(|(_, v)| v)
    }

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
    fn every_counter_by_name() {
        let s = Stats {
            frames_sent: 3,
            board_wakeups: 9,
            ..Stats::default()
        };
        assert_eq!(s.fields().count(), Stats::NAMES.len());
        assert_eq!(s.get("frames_sent"), Some(3));
        assert_eq!(s.get("board_wakeups"), Some(9));
        assert_eq!(s.get("spins_failed"), Some(0));
        assert_eq!(s.get("no_such_counter"), None);
        // The names are the fields' own (what `Debug` prints), in order.
        let debug = format!("{s:?}");
        let mut at = 0;
        for (name, value) in s.fields() {
            let item = format!("{name}: {value}");
            let found = debug[at..]
                .find(&item)
                .unwrap_or_else(|| panic!("{item} in order"));
            at += found + item.len();
        }
    }

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
