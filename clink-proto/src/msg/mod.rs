//! The messaging protocol's decisions, sans-IO: what a send or a receive request does
//! with each frame of the eager and rendezvous protocols, and what it ends in.
//!
//! A message of at most the eager threshold travels whole in one [`Frame::Eager`]
//! ([`Protocol::choose`]). A larger one is announced by an RTS ([`Frame::Rts`]) and waits
//! in the sender's memory until the receiver that matches it has
//! - read it with CMA ([`Plan::Cma`]), then released it ([`Frame::Fin`]); a split read
//!   first asks the sender to write the message's head into the receive buffer
//!   ([`Frame::Push`], answered by [`Frame::Pushed`]) while it reads the rest itself; or
//! - asked for it ([`Frame::Cts`]) and received it as a transfer: chunks through the ring
//!   ([`Frame::Chunk`]) or, over the network, the link's bulk transfer.
//!
//! A sender withdraws an RTS nobody matched with [`Frame::Cancel`]; the receiver answers
//! with [`Frame::CancelAck`] ([`withdraw`]).
//!
//! Each request's state is a [`SendState`] or [`RecvState`]; their methods are the
//! transitions, and refuse a frame the state does not expect (a peer's protocol error).
//! [`Requests`] is the table of an endpoint's requests with the matching of arriving
//! messages against posted receives: [`Requests::arrival`] says what an eager message or
//! an RTS is for (the receive it matched, or, when none wants it, whether it waits where
//! it is or is set aside). [`Rendezvous`] is one peer's rendezvous protocol: given a
//! matched announcement, the peer's control frames, the completions of what it asked for
//! and the time, it applies the transitions and returns [`Action`]s. The runtime (the
//! `clink` crate's endpoint) owns the memory: it copies an eager message into the matched
//! receive's buffer, reads a waiting one in place or copies it aside, and carries out the
//! actions: the system calls (CMA reads and writes, ring and socket writes) and the clock.
//! The simulation test `tests/msg_sim.rs` drives two sides' [`Requests`] and
//! [`Rendezvous`] through random workloads with cancels, truncation, refused pushes and
//! peer deaths.

//! States are generic over the runtime's error type `E`, which takes the protocol's own
//! outcomes through `From<Failure>`.
//!
//! [`Frame::Eager`]: crate::wire::Frame::Eager
//! [`Frame::Rts`]: crate::wire::Frame::Rts
//! [`Frame::Fin`]: crate::wire::Frame::Fin
//! [`Frame::Push`]: crate::wire::Frame::Push
//! [`Frame::Pushed`]: crate::wire::Frame::Pushed
//! [`Frame::Cts`]: crate::wire::Frame::Cts
//! [`Frame::Chunk`]: crate::wire::Frame::Chunk
//! [`Frame::Cancel`]: crate::wire::Frame::Cancel
//! [`Frame::CancelAck`]: crate::wire::Frame::CancelAck

mod chunker;
mod recv;
mod rendezvous;
mod reqmap;
mod requests;
mod send;
mod txqueue;

pub use chunker::{Chunker, NextChunk};
pub use recv::{plan, Chunk, Plan, RecvState, SplitEnd, CMA_SPLIT_ALIGN};
pub use rendezvous::{Action, Announced, Buffer, Landed, Message, Read, Refused, Rendezvous};
pub use reqmap::ReqMap;
pub use requests::{Arrival, RecvReq, Requests, SendReq};
pub use send::{CancelStep, Protocol, SendState, TooLong};
pub use txqueue::{Head, TxQueue};

use crate::matching::Matcher;
use crate::PeerId;

/// What a completed receive reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Sender.
    pub peer: PeerId,
    /// Tag of the message.
    pub tag: u64,
    /// Length of the message in bytes.
    pub len: u64,
}

/// How the protocol ends a request other than by delivering it.
#[derive(Debug)]
pub enum Failure {
    /// The peer died or closed before the request was over.
    PeerDead(PeerId),
    /// The request was withdrawn.
    Cancelled,
    /// The message was longer than the receive buffer, which holds its head.
    Truncated {
        /// The message's length.
        len: u64,
        /// The buffer's.
        capacity: u64,
    },
    /// Reading the message out of the sender's memory failed.
    Read {
        /// The sender.
        peer: PeerId,
        /// The system's error.
        source: std::io::Error,
    },
}

/// A message that arrived before any receive wanted it, as the matcher keeps it.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrived {
    /// An eager message, copied aside.
    Eager(Vec<u8>),
    /// A rendezvous announcement: the message waits in the sender's memory.
    Rts {
        /// The message's length.
        len: u64,
        /// The sender's handle.
        send_id: u64,
        /// Where the message is in the sender's address space.
        addr: u64,
    },
}

impl Arrived {
    /// The message's length.
    pub fn len(&self) -> u64 {
        match self {
            Arrived::Eager(v) => v.len() as u64,
            Arrived::Rts { len, .. } => *len,
        }
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The outcome of a receive whose bytes are all in: its status, or `Truncated` when the
/// message was longer than the `cap`-byte buffer (which holds its head).
pub fn receive_result<E: From<Failure>>(status: Status, cap: u64) -> Result<Status, E> {
    if status.len > cap {
        Err(Failure::Truncated {
            len: status.len,
            capacity: cap,
        }
        .into())
    } else {
        Ok(status)
    }
}

/// Copies an eager message into a receive buffer: its status, or `Truncated` (the buffer
/// holding the first bytes) when it is longer than the buffer.
pub fn copy_eager<E: From<Failure>>(
    src: PeerId,
    tag: u64,
    data: &[u8],
    buf: &mut [u8],
) -> Result<Status, E> {
    let n = data.len().min(buf.len());
    buf[..n].copy_from_slice(&data[..n]);
    let status = Status {
        peer: src,
        tag,
        len: data.len() as u64,
    };
    receive_result(status, buf.len() as u64)
}

/// The receiver's side of [`Frame::Cancel`](crate::wire::Frame::Cancel): drops `src`'s
/// unmatched RTS of `send_id` if it is still waiting; the answer's `cancelled` (false:
/// already matched, the rendezvous goes on).
pub fn withdraw<R: PartialEq>(
    matcher: &mut Matcher<R, Arrived>,
    src: PeerId,
    send_id: u64,
) -> bool {
    let mut found = false;
    let removed = matcher.drain_unexpected_from(src, |u| {
        let hit = !found && matches!(u, Arrived::Rts { send_id: s, .. } if *s == send_id);
        found |= hit;
        !hit
    });
    !removed.is_empty()
}

#[cfg(test)]
mod tests;
