//! Transports: the "network interfaces" of clink. They move frames and bytes and own the
//! system calls; protocol decisions stay in `clink-proto` and the endpoint.
//!
//! - [`shm`]: same host; per-peer rings in a shared memfd, CMA or pipelined rendezvous;
//! - [`udp`]: other hosts; one socket per endpoint, a reliable connection per peer
//!   (`clink_proto::reliable`), GSO/GRO batching, fault injection;
//! - [`tcp`]: other hosts where UDP is not wanted or reachable; one connection per peer,
//!   framed records (`clink_proto::stream`), speculative receive of rendezvous payloads.
//!
//! All give the endpoint the same contract, a per-peer ordered and reliable frame link:
//! send a frame or report full, peek the next received frame, release it; the endpoint's
//! `Link` type dispatches between them.

#[allow(unsafe_code)]
pub mod shm;
pub mod tcp;
pub mod udp;

mod frames;

pub use frames::FrameQueue;
