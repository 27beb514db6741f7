//! Sans-IO protocol core of clink.
//!
//! Everything here is pure: no system calls, no threads, no clock reads. The runtime crate
//! `clink` feeds bytes and measured numbers in and acts on what comes out. That keeps every
//! protocol decision testable with property tests and a model checker.
//!
//! - [`wire`]: the frames that travel on a per-peer ring and the connection handshake,
//!   parsed by total functions into typed errors;
//! - [`msg`]: the messaging protocol's decisions: what a send or receive request does
//!   with each eager or rendezvous frame, and what it ends in;
//! - [`matching`]: tag matching of posted receives against arrived messages (BIP's tags,
//!   MPI's source/tag/mask);
//! - [`cost`]: the cost model that picks the eager/rendezvous threshold and the pipeline
//!   chunk size from measured copy and system-call costs (BIP: "model all you can");
//! - [`addr`]: endpoint address strings;
//! - [`ipv4`]: the IPv4 + UDP headers of packets the UDP transport's receive ring
//!   captures below the socket layer;
//! - [`reliable`]: the per-peer reliable datagram protocol of the network path
//!   (sequencing, SACK/NAK, RTT and retransmission, credits and congestion window,
//!   fragmentation, an unreliable mode, liveness), with [`netsim`], the seeded simulated
//!   network its tests run on; used by the UDP transport;
//! - [`admission`]: admission control of fast bulk streams (the seed's Fast_Req /
//!   Fast_Ack / Fast_NAck): one granted stream per receive queue;
//! - [`spec`]: speculative defragmentation: where a bulk transfer's fragments are expected
//!   to land, and the verifier that sorts what landed into hits and misses;
//! - [`stream`]: the TCP transport's record framing (fixed headers, so a receiver can
//!   land the next rendezvous piece straight in its buffer) and handshake, with the
//!   receiver's prediction of the next piece;
//! - [`rma`]: one-sided access to apertures: capability cookies, the access check, and
//!   the RMA frames (put, get, atomics, notify, map) carried on a peer's link;
//! - [`sockets`]: the sockets layer's pairing of two ends of a kernel TCP connection and
//!   the byte-offset switch of each direction onto a shared-memory ring;
//! - [`spin`]: whether a wait spins before it sleeps (spins that keep failing close it);
//! - [`tripwire`]: CLAN's tripwires, byte ranges of an aperture that fire on access, matched
//!   through per-page buckets;
//! - [`cast`]: `clink cast`'s manifest and chunk headers, which each node of the chain
//!   checks before it writes or forwards a chunk.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod addr;
pub mod admission;
pub mod cast;
pub mod cost;
mod crc;
mod error;
pub mod idhash;
pub mod ipv4;
mod le;
pub mod matching;
pub mod msg;
pub mod netsim;
pub mod reliable;
pub mod rma;
pub mod sockets;
pub mod spec;
pub mod spin;
pub mod stream;
pub mod tripwire;
pub mod wire;

pub use error::ProtoError;

/// Identifies a connected peer within one endpoint (an index, never a PID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer#{}", self.0)
    }
}
