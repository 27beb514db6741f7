//! Transports: the "network interfaces" of clink. They move frames and bytes and own the
//! system calls and `unsafe`; protocol decisions stay in `clink-proto` and the endpoint.
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

pub mod shm;
pub mod tcp;
pub mod udp;

use std::collections::VecDeque;

/// The frames a network link (UDP or TCP) received and the endpoint has not released,
/// in order, bounded in bytes: once [`FrameQueue::full`] the link takes no more, and its
/// transport's own flow control (the connection's credit, the kernel's TCP window) holds
/// the sender back.
#[derive(Default)]
pub struct FrameQueue {
    q: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl FrameQueue {
    /// Bytes held before the queue counts as full.
    pub const CAP: usize = 4 << 20;

    /// Appends a received frame.
    pub fn push(&mut self, f: Vec<u8>) {
        self.bytes += f.len();
        self.q.push_back(f);
    }

    /// The oldest frame not yet released.
    pub fn peek(&self) -> Option<&[u8]> {
        self.q.front().map(Vec::as_slice)
    }

    /// Releases the frame [`FrameQueue::peek`] returned, handing back its buffer.
    pub fn release(&mut self) -> Option<Vec<u8>> {
        let v = self.q.pop_front()?;
        self.bytes -= v.len();
        Some(v)
    }

    /// Whether it holds [`FrameQueue::CAP`] bytes or more.
    pub fn full(&self) -> bool {
        self.bytes >= Self::CAP
    }
}
