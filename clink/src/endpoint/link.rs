//! A peer's frame link, over whichever transport reaches it: the one contract the
//! endpoint's protocol needs (send a frame or report full, peek the next received frame,
//! release it), dispatched to the shared-memory ring, the UDP connection or the TCP
//! connection. A peer holds its ring pair (the shared-memory fast paths take it without a
//! dispatch); a network link is its transport's, by the peer's index ([`Nets`]): the
//! calls that reach one take the transports and the index.

use crate::lease::{Dst, Src};
use crate::transport::shm::ring::{Record, RingError};
use crate::transport::shm::ShmPeer;
use crate::transport::tcp::{TcpLink, TcpTransport};
use crate::transport::udp::{UdpLink, UdpTransport};
use clink_proto::wire::Frame;

/// The transport of one peer.
pub(crate) enum Link {
    Shm(ShmPeer),
    /// Held by the UDP transport, under the peer's index.
    Udp,
    /// Held by the TCP transport, under the peer's index.
    Tcp,
}

/// A link over which a rendezvous is a bulk transfer the link moves itself: the sender's
/// buffer is read in place, the receiver's posted buffer is written in place, and the
/// link reports completions ([`BulkLink::take_done`]).
pub(crate) trait BulkLink {
    /// Starts sending the bytes of `src` as transfer `xfer`; false when the link is dead.
    /// The link holds the lease until it reports the transfer done or forgets its
    /// transfers (peer failure).
    fn send_bulk(&mut self, xfer: u64, src: Src) -> bool;
    /// Expects transfer `xfer` of `total` bytes into `dst`, held as `send_bulk`'s source.
    fn expect_bulk(&mut self, xfer: u64, total: u64, dst: Dst);
    /// The transfers finished since the last call: (received, sent); `None` when there
    /// are none (the common case, checked on every read and write of a link).
    fn take_done(&mut self) -> Option<(Vec<u64>, Vec<u64>)>;
    /// Forgets every transfer (the peer failed): no pointer into a request buffer is used
    /// afterwards.
    fn clear_bulk(&mut self);
}

impl BulkLink for UdpLink {
    fn send_bulk(&mut self, xfer: u64, src: Src) -> bool {
        UdpLink::send_bulk(self, xfer, src)
    }
    fn expect_bulk(&mut self, xfer: u64, total: u64, dst: Dst) {
        UdpLink::expect_bulk(self, xfer, total, dst)
    }
    fn take_done(&mut self) -> Option<(Vec<u64>, Vec<u64>)> {
        UdpLink::take_bulk_done(self)
    }
    fn clear_bulk(&mut self) {
        UdpLink::clear_bulk(self);
    }
}

impl BulkLink for TcpLink {
    fn send_bulk(&mut self, xfer: u64, src: Src) -> bool {
        TcpLink::send_bulk(self, xfer, src);
        // Queued: a dead connection shows at its next read, which fails the transfer.
        true
    }
    fn expect_bulk(&mut self, xfer: u64, total: u64, dst: Dst) {
        TcpLink::expect_bulk(self, xfer, total, dst)
    }
    fn take_done(&mut self) -> Option<(Vec<u64>, Vec<u64>)> {
        TcpLink::take_bulk_done(self)
    }
    fn clear_bulk(&mut self) {
        TcpLink::clear_bulk(self);
    }
}

/// A received frame not yet released: a ring record, or the head of a network link's
/// queue.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rx {
    Ring(Record),
    Net,
}

/// The endpoint's network transports (each when enabled: `CLINK_UDP`, `CLINK_TCP`),
/// which keep their links by peer index.
pub(crate) struct Nets {
    pub udp: Option<UdpTransport>,
    pub tcp: Option<TcpTransport>,
}

/// Peer `i`'s UDP link.
pub(crate) fn udp(nets: &Nets, i: usize) -> Option<&UdpLink> {
    nets.udp.as_ref()?.link(i)
}

/// As [`udp`], mutable.
pub(crate) fn udp_mut(nets: &mut Nets, i: usize) -> Option<&mut UdpLink> {
    nets.udp.as_mut()?.link_mut(i)
}

/// Peer `i`'s TCP link.
pub(crate) fn tcp(nets: &Nets, i: usize) -> Option<&TcpLink> {
    nets.tcp.as_ref()?.link(i)
}

/// As [`tcp`], mutable.
pub(crate) fn tcp_mut(nets: &mut Nets, i: usize) -> Option<&mut TcpLink> {
    nets.tcp.as_mut()?.link_mut(i)
}

impl Link {
    /// Bytes the link holds that the peer has not taken: a UDP connection's messages
    /// not yet acknowledged (while it is alive), a TCP send queue not yet written (the
    /// kernel delivers what it took, as for any socket). Shared memory holds none (its
    /// frames are in the peer's ring). `nets`, `i`: the transports and the peer's index.
    pub fn unsent_bytes(&self, nets: &Nets, i: usize) -> usize {
        match self {
            Link::Shm(_) => 0,
            Link::Udp => udp(nets, i)
                .filter(|u| !u.conn().is_dead())
                .map_or(0, |u| u.conn().send_buffered()),
            Link::Tcp => tcp(nets, i).map_or(0, |t| t.queued_bytes()),
        }
    }

    /// The peer's endpoint identity (the `id` of its address).
    pub fn remote_id(&self, nets: &Nets, i: usize) -> u128 {
        match self {
            Link::Shm(s) => s.id,
            Link::Udp => udp(nets, i).map_or(0, |u| u.remote_id()),
            Link::Tcp => tcp(nets, i).map_or(0, |t| t.remote_id()),
        }
    }

    /// The transport's name, for `clink info` and diagnostics.
    pub fn transport(&self) -> &'static str {
        match self {
            Link::Shm(_) => "shm",
            Link::Udp => "udp",
            Link::Tcp => "tcp",
        }
    }

    /// The shared-memory peer, if that is the transport.
    pub fn shm(&self) -> Option<&ShmPeer> {
        match self {
            Link::Shm(s) => Some(s),
            _ => None,
        }
    }

    /// As [`Link::shm`], mutable.
    pub fn shm_mut(&mut self) -> Option<&mut ShmPeer> {
        match self {
            Link::Shm(s) => Some(s),
            _ => None,
        }
    }

    /// The link, when a rendezvous over it is a bulk transfer: UDP in reliable mode (the
    /// unreliable mode refuses rendezvous messages altogether) and TCP.
    pub fn bulk<'a>(&'a mut self, nets: &'a mut Nets, i: usize) -> Option<&'a mut dyn BulkLink> {
        match self {
            Link::Udp => udp_mut(nets, i)
                .filter(|u| u.conn().config().reliable)
                .map(|u| u as &mut dyn BulkLink),
            Link::Tcp => tcp_mut(nets, i).map(|t| t as &mut dyn BulkLink),
            Link::Shm(_) => None,
        }
    }

    /// A UDP link in unreliable mode (no rendezvous: messages are single eager frames).
    pub fn unreliable(&self, nets: &Nets, i: usize) -> bool {
        udp(nets, i).is_some_and(|u| !u.conn().config().reliable)
    }

    /// Whether rendezvous messages from this peer can be read with one CMA copy.
    pub fn cma(&self) -> bool {
        self.shm().is_some_and(|s| s.cma)
    }

    /// Queues one frame; false when the link is full (retry after progress).
    pub fn try_send(&mut self, nets: &mut Nets, i: usize, f: &Frame) -> bool {
        match self {
            Link::Shm(s) => s.try_send(f),
            // (A UDP peer always has its link in the transport; were it gone, the frame
            // is dropped rather than left to block its queue.)
            Link::Udp => udp_mut(nets, i).is_none_or(|u| u.try_send(f)),
            Link::Tcp => tcp_mut(nets, i).is_none_or(|t| t.try_send(f)),
        }
    }

    /// The next received frame, if any.
    pub fn peek(&mut self, nets: &Nets, i: usize) -> Result<Option<Rx>, RingError> {
        match self {
            Link::Shm(s) => Ok(s.rx.peek()?.map(Rx::Ring)),
            Link::Udp => Ok(udp(nets, i)
                .and_then(|u| u.frames().peek())
                .map(|_| Rx::Net)),
            Link::Tcp => Ok(tcp(nets, i)
                .and_then(|t| t.frames().peek())
                .map(|_| Rx::Net)),
        }
    }

    /// The bytes of a frame returned by [`Link::peek`].
    pub fn frame<'a>(&'a self, nets: &'a Nets, i: usize, rx: Rx) -> &'a [u8] {
        match (self, rx) {
            (Link::Shm(s), Rx::Ring(r)) => s.record_bytes(r),
            (Link::Udp, Rx::Net) => udp(nets, i).and_then(|u| u.frames().peek()).unwrap_or(&[]),
            (Link::Tcp, Rx::Net) => tcp(nets, i).and_then(|t| t.frames().peek()).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// As [`Link::frame`], as a lease that outlives the borrow of the link: valid until
    /// the frame is released (the endpoint handles a frame, with `&mut self`, before it
    /// releases it).
    #[inline]
    pub fn frame_lease(&self, nets: &Nets, i: usize, rx: Rx) -> Src {
        let none = Src::from_static(&[]);
        match (self, rx) {
            (Link::Shm(s), Rx::Ring(r)) => s.record_lease(r),
            (Link::Udp, Rx::Net) => udp(nets, i).and_then(|u| u.frames().head()).unwrap_or(none),
            (Link::Tcp, Rx::Net) => tcp(nets, i).and_then(|t| t.frames().head()).unwrap_or(none),
            _ => none,
        }
    }

    /// Releases a frame returned by [`Link::peek`]; true when the peer must be woken
    /// (it waits for ring space).
    pub fn release(&mut self, nets: &mut Nets, i: usize, rx: Rx) -> bool {
        match (self, rx) {
            (Link::Shm(s), Rx::Ring(r)) => s.rx.release(r),
            (Link::Udp, Rx::Net) => {
                if let Some(u) = udp_mut(nets, i) {
                    u.release();
                }
                false
            }
            (Link::Tcp, Rx::Net) => {
                if let Some(t) = tcp_mut(nets, i) {
                    t.release();
                }
                false
            }
            _ => false,
        }
    }

    /// Publishes the consumer position (shared memory); true when the peer must be woken.
    pub fn publish(&mut self) -> bool {
        match self {
            Link::Shm(s) => s.rx.publish(),
            Link::Udp | Link::Tcp => false,
        }
    }

    /// Rings the peer's doorbell (shared memory only; a network peer reads its socket).
    pub fn wake(&self) {
        if let Link::Shm(s) = self {
            s.wake();
        }
    }
}
