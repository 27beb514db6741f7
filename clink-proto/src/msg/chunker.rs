//! The pipelined transfer's sending side: the sends a receiver asked for in chunks, one
//! after another.

use std::collections::VecDeque;

/// One peer's pipelined sends the receiver asked for ([`Frame::Cts`]), in the order asked:
/// the first goes out chunk by chunk as the link takes them, then the next. The runtime
/// asks for the next chunk, writes it ([`Frame::Chunk`]) if the link has room, and says
/// so.
///
/// [`Frame::Cts`]: crate::wire::Frame::Cts
/// [`Frame::Chunk`]: crate::wire::Frame::Chunk
#[derive(Debug, Default)]
pub struct Chunker {
    queue: VecDeque<Out>,
}

#[derive(Debug)]
struct Out {
    send_id: u64,
    next: u64,
    len: u64,
}

/// The chunk to send next ([`Chunker::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextChunk {
    /// The send.
    pub send_id: u64,
    /// Where the chunk starts in the message.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

impl Chunker {
    /// Whether no transfer is waiting to be sent.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The receiver asked for send `send_id` of `len` bytes (a rendezvous message: more
    /// than the eager threshold, so never empty).
    pub fn push(&mut self, send_id: u64, len: u64) {
        self.queue.push_back(Out {
            send_id,
            next: 0,
            len,
        });
    }

    /// The next chunk of the first transfer, of `chunk(message length)` bytes or what is
    /// left.
    pub fn next(&self, chunk: impl FnOnce(u64) -> u64) -> Option<NextChunk> {
        let o = self.queue.front()?;
        Some(NextChunk {
            send_id: o.send_id,
            offset: o.next,
            len: chunk(o.len).max(1).min(o.len - o.next),
        })
    }

    /// The chunk [`Chunker::next`] named is in the link: the send's id when it was the
    /// last (the transfer then leaves the queue and the send is complete).
    pub fn sent(&mut self, c: NextChunk) -> Option<u64> {
        let o = self.queue.front_mut()?;
        debug_assert_eq!((o.send_id, o.next), (c.send_id, c.offset));
        o.next += c.len;
        if o.next < o.len {
            return None;
        }
        self.queue.pop_front().map(|o| o.send_id)
    }

    /// The first transfer's send is gone: drop it.
    pub fn skip(&mut self) {
        self.queue.pop_front();
    }

    /// Drops every transfer (the peer died).
    pub fn clear(&mut self) {
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_go_out_one_after_another_in_chunks() {
        let mut c = Chunker::default();
        c.push(1, 10);
        c.push(2, 3);
        let mut out = Vec::new();
        while let Some(n) = c.next(|len| if len == 10 { 4 } else { 100 }) {
            out.push((n.send_id, n.offset, n.len));
            if let Some(done) = c.sent(n) {
                out.push((done, u64::MAX, 0));
            }
        }
        assert_eq!(
            out,
            [
                (1, 0, 4),
                (1, 4, 4),
                (1, 8, 2),
                (1, u64::MAX, 0),
                (2, 0, 3),
                (2, u64::MAX, 0)
            ]
        );
        assert!(c.is_empty());
        // A chunk size of 0 still moves.
        c.push(3, 2);
        assert_eq!(c.next(|_| 0).map(|n| n.len), Some(1));
    }
}
