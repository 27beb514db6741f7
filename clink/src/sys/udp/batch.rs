//! A send batch: datagrams waiting to leave, grouped into GSO frames (consecutive
//! datagrams to one destination of one size become one `UDP_SEGMENT` send), with the
//! vectors and headers one `sendmmsg` takes ([`super::UdpSock::send_run`] sends
//! them).

use super::{MAX_GSO_SEGMENTS, MAX_UDP_PAYLOAD};
use crate::lease::Src;
use crate::sys::SockAddr;
use std::net::SocketAddr;

/// One datagram of a send batch: `len` bytes of the batch's buffer from `start`, then
/// the bytes of `ext` (a bulk payload sent where it is).
#[derive(Clone, Copy, Debug)]
pub(super) struct Dgram {
    pub(super) start: usize,
    pub(super) len: usize,
    ext: Src,
}

/// One entry of a send batch: `count` datagrams from `first`, each of `seg` bytes (the
/// last may be shorter), `len` in all.
#[derive(Clone, Copy, Debug)]
pub(super) struct Frame {
    pub(super) dest: SocketAddr,
    pub(super) first: usize,
    len: usize,
    pub(super) seg: usize,
    pub(super) count: u32,
    /// A shorter datagram ended it: nothing more may join.
    closed: bool,
}

/// The vectors of `frames`, all in one list as one `sendmmsg` takes them (`iovs`, cleared
/// first), and per frame its span of that list, (start, count) (`spans`, cleared first).
pub(super) fn frame_vectors(
    frames: &[Frame],
    dgrams: &[Dgram],
    buf: &[u8],
    iovs: &mut Vec<libc::iovec>,
    spans: &mut Vec<(usize, usize)>,
) {
    iovs.clear();
    spans.clear();
    for f in frames {
        let at = iovs.len();
        f.iovecs(dgrams, buf, iovs);
        spans.push((at, iovs.len() - at));
    }
}

impl Frame {
    /// Appends this frame's vectors to `iovs`: each datagram's bytes in the batch's
    /// buffer `buf` (joined with the frame's previous vector where they follow it, never
    /// with another frame's), then its payload.
    fn iovecs(&self, dgrams: &[Dgram], buf: &[u8], iovs: &mut Vec<libc::iovec>) {
        let own = iovs.len();
        for d in &dgrams[self.first..self.first + self.count as usize] {
            if d.len > 0 {
                let p = buf[d.start..].as_ptr();
                match iovs[own..].last_mut() {
                    Some(v)
                        if v.iov_base.cast::<u8>().wrapping_add(v.iov_len).cast_const() == p =>
                    {
                        v.iov_len += d.len;
                    }
                    _ => iovs.push(libc::iovec {
                        iov_base: p as *mut libc::c_void,
                        iov_len: d.len,
                    }),
                }
            }
            if !d.ext.is_empty() {
                iovs.push(libc::iovec {
                    iov_base: d.ext.bytes().as_ptr().cast_mut().cast(),
                    iov_len: d.ext.len(),
                });
            }
        }
    }
}

/// Datagrams waiting to be sent, grouped into GSO frames.
#[derive(Default)]
pub struct TxBatch {
    pub(super) buf: Vec<u8>,
    pub(super) dgrams: Vec<Dgram>,
    pub(super) frames: Vec<Frame>,
    /// The arguments of one `sendmmsg`, reused.
    pub(super) args: SendArgs,
    gso: bool,
}

/// The arguments of one `sendmmsg`: per entry a header, a name, a control buffer and its
/// span of vectors.
#[derive(Default)]
pub(super) struct SendArgs {
    pub(super) hdrs: Vec<libc::mmsghdr>,
    pub(super) addrs: Vec<SockAddr>,
    pub(super) ctrl: Vec<[u64; 4]>,
    pub(super) iovs: Vec<libc::iovec>,
    pub(super) spans: Vec<(usize, usize)>,
}

// SAFETY: the vectors of `args` point into the batch's own buffer and into payload leases
// it holds; the batch moves with its endpoint and is used by one thread at a time.
unsafe impl Send for SendArgs {}

impl TxBatch {
    /// An empty batch; `gso` groups equal-sized datagrams to one destination.
    pub fn new(gso: bool) -> TxBatch {
        TxBatch {
            buf: Vec::with_capacity(1 << 20),
            gso,
            ..TxBatch::default()
        }
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Datagrams queued.
    pub fn datagrams(&self) -> usize {
        self.dgrams.len()
    }

    /// Appends one datagram for `dest`: `write` appends its bytes to the buffer it is
    /// given and returns how many (0: nothing to send, the call is undone).
    pub fn push(&mut self, dest: SocketAddr, write: impl FnOnce(&mut Vec<u8>) -> usize) -> bool {
        self.push_grouped(|b| Some((write(b), &[][..], false, dest)))
    }

    /// As [`TxBatch::push`]; `write` also gives bytes that follow those it appended
    /// (a bulk payload, sent from where it is: no copy), says whether the datagram must
    /// open a new GSO send (a bulk group boundary: the receiver's speculative layout
    /// expects each group in one read), and where it goes (`None`: nothing to send, the
    /// call is undone). The payload is held as a lease (`crate::lease`): it is a bulk
    /// source's bytes, which stay until their transfer is acknowledged, after the batch
    /// is sent ([`super::UdpSock::send_run`]).
    pub fn push_grouped<'p>(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>) -> Option<(usize, &'p [u8], bool, SocketAddr)>,
    ) -> bool {
        let start = self.buf.len();
        let Some((n, ext, boundary, dest)) = write(&mut self.buf) else {
            self.buf.truncate(start);
            return false;
        };
        if n + ext.len() == 0 {
            self.buf.truncate(start);
            return false;
        }
        debug_assert_eq!(self.buf.len(), start + n);
        self.dgrams.push(Dgram {
            start,
            len: n,
            ext: Src::of_owned(ext),
        });
        let n = n + ext.len();
        if self.gso && !boundary {
            if let Some(f) = self.frames.last_mut() {
                if f.dest == dest
                    && !f.closed
                    && n <= f.seg
                    && f.len + n <= MAX_UDP_PAYLOAD
                    && (f.count as usize) < MAX_GSO_SEGMENTS
                {
                    f.len += n;
                    f.count += 1;
                    f.closed = n < f.seg;
                    return true;
                }
            }
        }
        self.frames.push(Frame {
            dest,
            first: self.dgrams.len() - 1,
            len: n,
            seg: n,
            count: 1,
            closed: false,
        });
        true
    }

    /// The bytes of the one datagram that makes up the `n` frames from `first`, when they
    /// are one frame of one datagram held whole in the buffer (no payload elsewhere).
    pub(crate) fn lone_datagram(&self, first: usize, n: usize) -> Option<&[u8]> {
        let f = self.frames.get(first).filter(|f| n == 1 && f.count == 1)?;
        let d = self.dgrams.get(f.first).filter(|d| d.ext.is_empty())?;
        self.buf.get(d.start..d.start + d.len)
    }

    /// The destination of frame `i`.
    pub fn frame_dest(&self, i: usize) -> SocketAddr {
        self.frames[i].dest
    }

    /// Frames queued (GSO sends; see [`TxBatch::datagrams`] for datagrams).
    pub fn frames(&self) -> usize {
        self.frames.len()
    }

    /// The index after the run of frames from `first` to the same destination.
    pub fn run_end(&self, first: usize) -> usize {
        let Some(d) = self.frames.get(first).map(|f| f.dest) else {
            return first;
        };
        first
            + self.frames[first..]
                .iter()
                .take_while(|f| f.dest == d)
                .count()
    }

    /// Turns every GSO frame from `first` on back into single datagrams (GSO refused by
    /// the kernel); frames before `first` (sent already) keep their indices.
    pub(super) fn split_from(&mut self, first: usize) {
        self.gso = false;
        let split: Vec<Frame> = self.frames[first..]
            .iter()
            .flat_map(|f| {
                let dest = f.dest;
                self.dgrams[f.first..f.first + f.count as usize]
                    .iter()
                    .enumerate()
                    .map(move |(k, d)| Frame {
                        dest,
                        first: f.first + k,
                        len: d.len + d.ext.len(),
                        seg: d.len + d.ext.len(),
                        count: 1,
                        closed: false,
                    })
            })
            .collect();
        self.frames.truncate(first);
        self.frames.extend(split);
    }

    /// Forgets everything queued (after it was sent).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.dgrams.clear();
        self.frames.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn batches_group_equal_datagrams() {
        let mut b = TxBatch::new(true);
        let d = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 9);
        for n in [100, 100, 100, 40, 100] {
            b.push(d, |buf| {
                buf.extend(std::iter::repeat_n(1u8, n));
                n
            });
        }
        assert_eq!(b.frames.len(), 2);
        assert_eq!((b.frames[0].count, b.frames[0].len), (4, 340));
        assert_eq!(b.datagrams(), 5);
        b.split_from(1);
        assert_eq!(b.frames.len(), 2, "the first frame keeps its place");
        b.split_from(0);
        assert_eq!(b.frames.len(), 5);
        assert_eq!(b.frames[3].len, 40);
    }

    proptest::proptest! {
        /// Whatever datagrams are queued (bytes in the batch, caller payloads, group
        /// boundaries, two destinations), each frame's vectors spell its datagrams end to
        /// end, in order, and every frame is a valid GSO send: all segments but the last of
        /// one size, the last no longer, at most 64 of them and 65507 bytes; split back
        /// (GSO refused), every datagram is its own entry, bytes intact.
        #[test]
        fn frames_spell_their_datagrams_and_obey_gso_limits(
            dgrams in proptest::collection::vec(
                (0usize..80, 0usize..1500, proptest::bool::ANY, proptest::bool::ANY),
                1..300,
            ),
        ) {
            let src: Vec<u8> = (0..4096u32).map(|k| (k * 31 + 7) as u8).collect();
            let dests = [
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 1),
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 2),
            ];
            let mut batch = TxBatch::new(true);
            let mut want: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
            for (k, &(head, ext, boundary, other)) in dgrams.iter().enumerate() {
                let off = (k * 97) % 2048;
                let payload = &src[off..off + ext];
                let dest = dests[usize::from(other)];
                let bytes: Vec<u8> = (0..head).map(|i| (k + i) as u8).collect();
                let d = [&bytes[..], payload].concat();
                let pushed = batch.push_grouped(|buf| {
                    buf.extend_from_slice(&bytes);
                    Some((head, payload, boundary, dest))
                });
                proptest::prop_assert_eq!(pushed, !d.is_empty());
                if !d.is_empty() {
                    want.push((dest, d));
                }
            }
            // All frames' vectors in one list, as `send_some` builds them for `sendmmsg`.
            let spell = |batch: &mut TxBatch| -> Vec<(SocketAddr, Vec<u8>, usize, u32)> {
                let (mut iovs, mut spans) = (Vec::new(), Vec::new());
                frame_vectors(&batch.frames, &batch.dgrams, &batch.buf, &mut iovs, &mut spans);
                (0..batch.frames.len())
                    .map(|f| {
                        let fr = batch.frames[f];
                        let (at, count) = spans[f];
                        let mut bytes = Vec::new();
                        for v in &iovs[at..at + count] {
                            // SAFETY: vectors into the batch's buffer and `src`, both live.
                            bytes.extend_from_slice(unsafe {
                                std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
                            });
                        }
                        (fr.dest, bytes, fr.seg, fr.count)
                    })
                    .collect()
            };
            let frames = spell(&mut batch);
            let mut at = 0;
            for (dest, bytes, seg, count) in &frames {
                let count = *count as usize;
                proptest::prop_assert!((1..=MAX_GSO_SEGMENTS).contains(&count));
                proptest::prop_assert!(bytes.len() <= MAX_UDP_PAYLOAD || count == 1);
                let mine = &want[at..at + count];
                at += count;
                proptest::prop_assert!(mine.iter().all(|(d, _)| d == dest));
                for (i, (_, d)) in mine.iter().enumerate() {
                    if i + 1 < count {
                        proptest::prop_assert_eq!(d.len(), *seg);
                    } else {
                        proptest::prop_assert!(d.len() <= *seg);
                    }
                }
                let joined: Vec<u8> = mine.iter().flat_map(|(_, d)| d.iter().copied()).collect();
                proptest::prop_assert!(bytes == &joined, "a frame's vectors are its datagrams");
            }
            proptest::prop_assert_eq!(at, want.len());
            batch.split_from(0);
            let single = spell(&mut batch);
            proptest::prop_assert_eq!(single.len(), want.len());
            for ((dest, bytes, _, count), (d, w)) in single.iter().zip(&want) {
                proptest::prop_assert_eq!(*count, 1);
                proptest::prop_assert_eq!(dest, d);
                proptest::prop_assert!(bytes == w);
            }
        }
    }
}
