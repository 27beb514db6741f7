//! A peer's frame link, over whichever transport reaches it: the one contract the
//! endpoint's protocol needs (send a frame or report full, peek the next received frame,
//! release it), dispatched to the shared-memory ring or the UDP connection.

use crate::transport::shm::ring::{Record, RingError};
use crate::transport::shm::ShmPeer;
use crate::transport::udp::UdpLink;
use clink_proto::wire::Frame;

/// The transport of one peer.
pub(crate) enum Link {
    Shm(ShmPeer),
    /// Boxed: a reliable connection is far larger than a ring pair's handle.
    Udp(Box<UdpLink>),
}

/// A received frame not yet released: a ring record, or the head of a UDP link's queue.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rx {
    Ring(Record),
    Net,
}

impl Link {
    /// The transport's name, for `clink info` and diagnostics.
    pub fn transport(&self) -> &'static str {
        match self {
            Link::Shm(_) => "shm",
            Link::Udp(_) => "udp",
        }
    }

    /// The shared-memory peer, if that is the transport.
    pub fn shm(&self) -> Option<&ShmPeer> {
        match self {
            Link::Shm(s) => Some(s),
            Link::Udp(_) => None,
        }
    }

    /// As [`Link::shm`], mutable.
    pub fn shm_mut(&mut self) -> Option<&mut ShmPeer> {
        match self {
            Link::Shm(s) => Some(s),
            Link::Udp(_) => None,
        }
    }

    /// The UDP link, when a rendezvous over it is a bulk transfer (reliable mode; the
    /// unreliable mode refuses rendezvous messages altogether).
    pub fn bulk(&mut self) -> Option<&mut UdpLink> {
        match self {
            Link::Udp(u) if u.conn.config().reliable => Some(u),
            _ => None,
        }
    }

    /// A UDP link in unreliable mode (no rendezvous: messages are single eager frames).
    pub fn unreliable(&self) -> bool {
        matches!(self, Link::Udp(u) if !u.conn.config().reliable)
    }

    /// Whether rendezvous messages from this peer can be read with one CMA copy.
    pub fn cma(&self) -> bool {
        self.shm().is_some_and(|s| s.cma)
    }

    /// Queues one frame; false when the link is full (retry after progress).
    pub fn try_send(&mut self, f: &Frame) -> bool {
        match self {
            Link::Shm(s) => s.try_send(f),
            Link::Udp(u) => u.try_send(f),
        }
    }

    /// The next received frame, if any.
    pub fn peek(&mut self) -> Result<Option<Rx>, RingError> {
        match self {
            Link::Shm(s) => Ok(s.rx.peek()?.map(Rx::Ring)),
            Link::Udp(u) => Ok(u.peek().map(|_| Rx::Net)),
        }
    }

    /// The bytes of a frame returned by [`Link::peek`].
    pub fn frame(&self, rx: Rx) -> &[u8] {
        match (self, rx) {
            (Link::Shm(s), Rx::Ring(r)) => s.record(r),
            (Link::Udp(u), Rx::Net) => u.peek().unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Releases a frame returned by [`Link::peek`]; true when the peer must be woken
    /// (it waits for ring space).
    pub fn release(&mut self, rx: Rx) -> bool {
        match (self, rx) {
            (Link::Shm(s), Rx::Ring(r)) => s.rx.release(r),
            (Link::Udp(u), Rx::Net) => {
                u.release();
                false
            }
            _ => false,
        }
    }

    /// Publishes the consumer position (shared memory); true when the peer must be woken.
    pub fn publish(&mut self) -> bool {
        match self {
            Link::Shm(s) => s.rx.publish(),
            Link::Udp(_) => false,
        }
    }

    /// Rings the peer's doorbell (shared memory only; a UDP peer reads its socket).
    pub fn wake(&self) {
        if let Link::Shm(s) = self {
            s.wake();
        }
    }
}
