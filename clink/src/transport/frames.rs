//! Frames a network link received, held until the endpoint releases them.

use crate::lease::Src;
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

    /// [`FrameQueue::peek`] as a lease, valid until the frame is released.
    pub fn head(&self) -> Option<Src> {
        // The frame's heap buffer stays where it is until `release` pops it (the queue
        // moves the `Vec`, never its bytes), and the endpoint drops the lease first.
        self.q.front().map(|v| Src::of_owned(v))
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
