//! A receive request's life: posted, matched (eager copy, or a rendezvous read or
//! transfer), over.

use super::{receive_result, Failure, Status};
use crate::cost::{Rndv, CMA_SPLIT_MIN};
use std::ops::Range;

/// A split CMA read's halves meet at a multiple of this: page-aligned, so no page is
/// pinned by both sides' calls.
pub const CMA_SPLIT_ALIGN: u64 = 4096;

/// Where a receive request stands.
#[derive(Debug)]
pub enum RecvState<E> {
    /// Waiting for a message to match.
    Posted,
    /// Receiving a rendezvous message as a transfer (chunks through the ring, or the
    /// link's bulk transfer), `got` bytes in, since `since` (ns, the runtime's clock).
    Transfer {
        /// The message.
        status: Status,
        /// Bytes in so far (chunks; a bulk transfer counts on its own).
        got: u64,
        /// When it started.
        since: u64,
    },
    /// A split CMA read: this side has read the message from byte `pushed` on (`read`:
    /// how that went) and waits for the sender to say it wrote the first `pushed` bytes.
    /// The buffer is the sender's target until then.
    Split {
        /// The message.
        status: Status,
        /// The bytes the sender writes.
        pushed: u64,
        /// How this side's read went.
        read: Result<(), E>,
        /// When it started.
        since: u64,
        /// The message in the sender's memory (to read the head if the sender cannot
        /// write it).
        addr: u64,
    },
    /// Over.
    Done(Result<Status, E>),
}

/// How a matched rendezvous message is received ([`plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Read with CMA: `n` bytes into the buffer, the sender writing the first `pushed` of
    /// them (0: none, this side reads them all) while this side reads the rest.
    Cma {
        /// Bytes that land in the buffer (the message, or the buffer's capacity).
        n: u64,
        /// The head the sender writes.
        pushed: u64,
    },
    /// Ask the sender for it (CTS) and receive it as a transfer.
    Transfer,
}

/// How to receive a `len`-byte rendezvous message into a `cap`-byte buffer: by `method`
/// (the cost model's or the measured choice) when the peer's memory can be read
/// (`cma`), the read split between the two sides when `split` permits and it is large
/// enough.
pub fn plan(method: Rndv, cma: bool, len: u64, cap: u64, split: bool) -> Plan {
    if method != Rndv::Cma || !cma {
        return Plan::Transfer;
    }
    let n = len.min(cap);
    let pushed = if split && n >= CMA_SPLIT_MIN {
        (n / 2) & !(CMA_SPLIT_ALIGN - 1)
    } else {
        0
    };
    Plan::Cma { n, pushed }
}

/// A chunk accepted ([`RecvState::on_chunk`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Where its bytes go in the buffer (`copy.len()` of them from its start; empty when
    /// it lies beyond a short buffer).
    pub copy: Range<usize>,
    /// It was the last: the transfer started at this time (the runtime's clock, as
    /// given to [`RecvState::transfer`]).
    pub done: Option<u64>,
}

/// A split read whose sender answered ([`RecvState::on_pushed`]): finish it with
/// [`SplitEnd::finish`] once the head is read when the sender could not write it.
#[derive(Debug)]
pub struct SplitEnd<E> {
    /// The message.
    pub status: Status,
    /// The head the sender was to write.
    pub pushed: u64,
    /// How this side's read went.
    pub read: Result<(), E>,
    /// When it started.
    pub since: u64,
    /// The message in the sender's memory.
    pub addr: u64,
    /// The sender wrote the head; if not, this side must read `0..pushed` from `addr`.
    pub written: bool,
}

impl<E: From<Failure>> SplitEnd<E> {
    /// The receive's end: `head` is how the head got in (`Ok` when the sender wrote it).
    pub fn finish(self, head: Result<(), E>, cap: u64) -> RecvState<E> {
        RecvState::Done(
            self.read
                .and(head)
                .and_then(|()| receive_result(self.status, cap)),
        )
    }
}

impl<E: From<Failure>> RecvState<E> {
    /// Whether it is over.
    #[inline]
    pub fn is_done(&self) -> bool {
        matches!(self, RecvState::Done(_))
    }

    /// Whether bytes may still land in its buffer (a transfer, or a split read whose
    /// sender writes into it).
    pub fn in_flight(&self) -> bool {
        matches!(self, RecvState::Transfer { .. } | RecvState::Split { .. })
    }

    /// After a [`Plan::Cma`] read of all but the first `pushed` bytes (`read`: how it
    /// went): a split waiting for the sender, or over.
    pub fn after_cma(
        status: Status,
        cap: u64,
        pushed: u64,
        read: Result<(), E>,
        since: u64,
        addr: u64,
    ) -> Self {
        if pushed > 0 {
            return RecvState::Split {
                status,
                pushed,
                read,
                since,
                addr,
            };
        }
        RecvState::Done(read.and_then(|()| receive_result(status, cap)))
    }

    /// A [`Plan::Transfer`] starting at `since`.
    pub fn transfer(status: Status, since: u64) -> Self {
        RecvState::Transfer {
            status,
            got: 0,
            since,
        }
    }

    /// A [`Frame::Chunk`](crate::wire::Frame::Chunk) of `len` bytes at `offset`, into a
    /// `cap`-byte buffer: where it goes, and whether it completed the receive. Refused
    /// unless it is the next chunk of a transfer in progress, within the message.
    pub fn on_chunk(&mut self, offset: u64, len: u64, cap: u64) -> Result<Chunk, &'static str> {
        let RecvState::Transfer { status, got, since } = self else {
            return Err("chunk for a receive not in progress");
        };
        if offset != *got || offset + len > status.len {
            return Err("chunk out of order or beyond the message");
        }
        let copy = offset.min(cap) as usize..(offset + len).min(cap) as usize;
        *got += len;
        if *got < status.len {
            return Ok(Chunk { copy, done: None });
        }
        let since = *since;
        *self = RecvState::Done(receive_result(*status, cap));
        Ok(Chunk {
            copy,
            done: Some(since),
        })
    }

    /// The link finished the bulk transfer into a `cap`-byte buffer: true when that
    /// completed the receive.
    pub fn transfer_done(&mut self, cap: u64) -> bool {
        let RecvState::Transfer { status, .. } = self else {
            return false;
        };
        *self = RecvState::Done(receive_result(*status, cap));
        true
    }

    /// [`Frame::Pushed`](crate::wire::Frame::Pushed): the split read's sender answered
    /// (`written`). The receive leaves the split (to [`RecvState::Posted`] until
    /// [`SplitEnd::finish`]); refused unless it was split.
    pub fn on_pushed(&mut self, written: bool) -> Result<SplitEnd<E>, &'static str> {
        match std::mem::replace(self, RecvState::Posted) {
            RecvState::Split {
                status,
                pushed,
                read,
                since,
                addr,
            } => Ok(SplitEnd {
                status,
                pushed,
                read,
                since,
                addr,
                written,
            }),
            other => {
                *self = other;
                Err("pushed for a receive not split")
            }
        }
    }

    /// Ends the receive with `e` unless it is over already: true when it ended it.
    pub fn fail(&mut self, e: E) -> bool {
        if self.is_done() {
            return false;
        }
        *self = RecvState::Done(Err(e));
        true
    }
}
