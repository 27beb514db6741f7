//! Spare message buffers: the records of sent messages and the bytes of delivered ones
//! that a connection keeps for reuse instead of freeing and allocating them again.

use super::Conn;

/// Small-message buffers a connection keeps for reuse, per side (sent messages' records,
/// delivered messages' bytes given back by [`Conn::recycle`]): at most this many ...
pub(super) const SPARE_COUNT: usize = 8;
/// ... of at most this capacity. A ping-pong of small messages otherwise allocated and
/// freed three blocks a message (the sent bytes, their shared record, the delivered
/// bytes): about 4% of a one-thread 64-byte UDP hop's time in the allocator
/// (`examples/path_cost 100000 udp` under `perf`).
pub(super) const SPARE_BYTES: usize = 4096;
/// While messages up to the UDP transport's eager limit stream, up to this many (what
/// such a sender has outstanding: it queues ahead of its window, and with up to 530
/// records out at once a pool of 64 left most sends to allocate; records circulate,
/// acknowledged ones going back to the pool and new sends taking them, so the pool adds
/// little to the memory the stream holds anyway) ...
pub(super) const SPARE_STREAM_COUNT: usize = 1024;
/// ... of at most this capacity (16 KiB and an endpoint's frame header) are kept, per
/// side, until none was taken for [`SPARE_IDLE`]; then only the small ones above. A
/// stream of 16 KiB messages otherwise allocated and freed its records and buffers on
/// each side, and the allocator handed the freed top of its heap back to the kernel, so
/// the pages were faulted in again (`perf record -a` of a blocking 16 KiB stream across a
/// bridge: page faults, page clearing, unmapping and the allocator about a fifth of the
/// sending process's samples).
pub(super) const SPARE_STREAM_BYTES: usize = (16 << 10) + 256;
/// How long streaming-size spares outlive their last use (nanoseconds).
pub(super) const SPARE_IDLE: u64 = 100_000_000;

impl Conn {
    /// An empty buffer for a delivered message: a spare one if any.
    pub(super) fn spare_buf(&mut self) -> Vec<u8> {
        match self.spare_bufs.pop() {
            Some(mut b) => {
                self.took_spare();
                b.clear();
                b
            }
            None => Vec::new(),
        }
    }

    /// Notes that a spare was taken (the streaming-size ones live on).
    pub(super) fn took_spare(&mut self) {
        self.spare_taken_at = self.last_driven;
    }

    /// Drops the spares beyond the small-message bounds once none was taken for
    /// [`SPARE_IDLE`].
    pub(super) fn trim_spares(&mut self, now: u64) {
        if self.spares_large && now.saturating_sub(self.spare_taken_at) >= SPARE_IDLE {
            trim(&mut self.spare_msgs, |m| m.data.capacity());
            trim(&mut self.spare_bufs, Vec::capacity);
            self.spares_large = false;
        }
    }
}

/// Keeps `item`, of `cap` bytes, in `pool` when the streaming bounds allow; true when
/// the pool then holds more, or larger, than the small-message bounds.
pub(super) fn keep<T>(pool: &mut Vec<T>, item: T, cap: usize) -> bool {
    if pool.len() >= SPARE_STREAM_COUNT || cap > SPARE_STREAM_BYTES {
        return false;
    }
    pool.push(item);
    pool.len() > SPARE_COUNT || cap > SPARE_BYTES
}

/// Shrinks `pool` to the small-message bounds.
fn trim<T>(pool: &mut Vec<T>, cap: impl Fn(&T) -> usize) {
    pool.retain(|x| cap(x) <= SPARE_BYTES);
    pool.truncate(SPARE_COUNT);
}
