//! Leases: memory lent to a request (a send's source, a receive's destination) and held
//! by the transports that move its bytes.
//!
//! A rendezvous payload leaves straight from the send buffer and lands straight in the
//! posted receive buffer, so the links (`Bulk`, `TcpLink`), the speculative read's vectors
//! and a send batch keep a pointer and a length into memory they do not own, for as long
//! as the transfer lasts. A lease is that pointer and length, with every access
//! bounds-checked here. It carries no lifetime, so it is sound under one rule the runtime
//! keeps: no holder uses a lease after the request it was made for is over (links forget
//! their transfers when they complete or the peer fails, a send batch is flushed within
//! the pass that filled it, the UDP transport re-arms before reading after a transfer
//! ended).
//!
//! Caller memory becomes a lease through the `unsafe` constructors, whose callers promise
//! it stays valid until the request is over (`endpoint::lend`: blocking calls that wait
//! for that, and the raw receive). Memory the runtime owns is leased by its owner, which
//! keeps it in place while the lease is held ([`Src::of_owned`], [`SendBuf::lease`],
//! [`RecvBuf::lease`]).

use std::sync::atomic::AtomicU64;

/// Readable bytes lent for the life of a request (a send's source). Copies are handles to
/// the same memory.
#[derive(Clone, Copy, Debug)]
pub struct Src {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a lease is a loan of plain bytes with no thread affinity; whoever holds it is
// driven by the endpoint's one thread at a time (the endpoint is `Send`, not `Sync`).
unsafe impl Send for Src {}

impl Src {
    /// Lends `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be readable and left unchanged until the request the lease
    /// is made for is over (the runtime uses no copy after that: module docs).
    #[inline]
    pub unsafe fn new(ptr: *const u8, len: usize) -> Src {
        let ptr = if len == 0 {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            ptr
        };
        Src { ptr, len }
    }

    /// A lease of bytes their owner in the runtime keeps in place, unchanged, for as long
    /// as any holder has the lease (a request's own buffer, a received frame until it is
    /// released).
    #[inline]
    pub fn of_owned(b: &[u8]) -> Src {
        Src {
            ptr: b.as_ptr(),
            len: b.len(),
        }
    }

    /// Lends bytes that live for ever (tests, constants).
    #[inline]
    pub fn from_static(b: &'static [u8]) -> Src {
        Src::of_owned(b)
    }

    /// The number of bytes lent.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no bytes are lent.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All the bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: readable and unchanged for the life of the lease (constructor's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The `len` bytes from `off`; `None` when the range is not inside the lease.
    #[inline]
    pub fn range(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.bytes().get(off..off.checked_add(len)?)
    }

    /// The lease of the `len` bytes from `off` (same loan); `None` when not inside.
    #[inline]
    pub fn sub(&self, off: usize, len: usize) -> Option<Src> {
        let b = self.range(off, len)?;
        Some(Src {
            ptr: b.as_ptr(),
            len,
        })
    }
}

/// Writable bytes lent for the life of a request (a receive's destination). Clones are
/// handles to the same memory: the endpoint's one driving thread never keeps a view of
/// it across a call into another holder, so views do not overlap in time.
#[derive(Clone, Debug)]
pub struct Dst {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: as for `Src`.
unsafe impl Send for Dst {}

impl Dst {
    /// Lends `len` writable bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes and used by nothing else until
    /// the request the lease is made for is over (the runtime uses no clone after that:
    /// module docs).
    #[inline]
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Dst {
        let ptr = if len == 0 {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            ptr
        };
        Dst { ptr, len }
    }

    /// Lends memory that lives for ever (tests: a leaked buffer).
    #[inline]
    pub fn from_static(b: &'static mut [u8]) -> Dst {
        Dst::of_owned(b)
    }

    /// The number of bytes lent.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no bytes are lent.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All the bytes, to read what landed there.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: valid for the life of the lease (constructor's contract); no mutable
        // view is alive (type docs).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// All the bytes, to write.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: valid and exclusively the lease's (constructor's contract); no other
        // view is alive (type docs).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The `len` bytes from `off`, to read what landed there; `None` when the range is
    /// not inside the lease.
    #[inline]
    pub fn range(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.bytes().get(off..off.checked_add(len)?)
    }

    /// The `len` bytes from `off`, to write; `None` when not inside the lease.
    #[inline]
    pub fn range_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        self.bytes_mut().get_mut(off..off.checked_add(len)?)
    }

    /// A lease of a buffer its owner keeps in place (never resized or dropped) for as
    /// long as any holder has the lease: an owned receive buffer, a registered aperture.
    #[inline]
    pub fn of_owned(v: &mut [u8]) -> Dst {
        Dst {
            ptr: v.as_mut_ptr(),
            len: v.len(),
        }
    }

    /// The aligned 64-bit word at `off`, for atomic access to memory other processes may
    /// access at the same time; `None` when outside the lease or misaligned.
    #[inline]
    pub fn word(&self, off: usize) -> Option<&AtomicU64> {
        let p = self.sub(off, 8)?.ptr;
        // SAFETY: eight bytes inside the lease, aligned (checked); memory shared with other
        // processes is only accessed atomically or by raw copies.
        (p as usize)
            .is_multiple_of(8)
            .then(|| unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Copies `data` to `off`; false (nothing written) when it does not fit. 8 to 16
    /// bytes go as two (overlapping) unaligned words rather than a call into the C
    /// library: one-word puts are the latency path.
    #[inline]
    pub fn write(&mut self, off: usize, data: &[u8]) -> bool {
        let len = data.len();
        if !self.fits(off, len) {
            return false;
        }
        let src = data.as_ptr();
        // SAFETY: `off + len` is inside the lease (checked above), `data` is distinct
        // memory of `len` bytes; with 8 to 16 bytes both words lie within them.
        unsafe {
            let dst = self.ptr.add(off);
            if (8..=16).contains(&len) {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(len - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(len - 8).cast::<u64>().write_unaligned(b);
            } else {
                std::ptr::copy_nonoverlapping(src, dst, len);
            }
        }
        true
    }

    /// True when `len` bytes from `off` lie inside the lease.
    #[inline]
    fn fits(&self, off: usize, len: usize) -> bool {
        off <= self.len && len <= self.len - off
    }

    /// The lease of the `len` bytes from `off` (same loan); `None` when not inside.
    #[inline]
    pub fn sub(&self, off: usize, len: usize) -> Option<Dst> {
        self.fits(off, len).then(|| Dst {
            ptr: self.ptr.wrapping_add(off),
            len,
        })
    }

    /// The first byte's address, for a vector the kernel writes through or an address
    /// a peer reads from.
    #[inline]
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// A send's bytes: owned by the request, or lent by its caller.
pub enum SendBuf {
    /// Owned by the request.
    Owned(bytes::Bytes),
    /// Lent by the caller (a blocking send waiting until the request is over).
    Lent(Src),
}

impl SendBuf {
    /// The bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        match self {
            SendBuf::Owned(b) => b,
            SendBuf::Lent(s) => s.bytes(),
        }
    }

    /// A lease of the bytes, for a link that sends them while the request lasts.
    #[inline]
    pub fn lease(&self) -> Src {
        match self {
            // A lease of memory the request owns: the buffer stays put (`Bytes` never
            // moves its bytes) until the request is dropped, after its links let go.
            SendBuf::Owned(b) => Src::of_owned(b),
            SendBuf::Lent(s) => *s,
        }
    }
}

impl clink_proto::msg::Message for SendBuf {
    #[inline]
    fn bytes(&self) -> &[u8] {
        SendBuf::bytes(self)
    }
}

/// A receive's destination: owned by the request, or lent.
pub enum RecvBuf {
    /// Owned by the request (handed to the caller when it completes).
    Owned(Vec<u8>),
    /// Lent by a blocking caller or a raw request's caller.
    Lent(Dst),
    /// Received in place, nothing handed back on completion: caller memory of a raw
    /// receive, or a range of one of the endpoint's apertures (which cannot be destroyed
    /// while the receive is pending).
    InPlace(Dst),
}

impl clink_proto::msg::Buffer for RecvBuf {
    #[inline]
    fn slice(&mut self) -> &mut [u8] {
        RecvBuf::slice(self)
    }
}

impl RecvBuf {
    /// The destination's bytes.
    #[inline]
    pub fn slice(&mut self) -> &mut [u8] {
        match self {
            RecvBuf::Owned(v) => v,
            RecvBuf::Lent(d) | RecvBuf::InPlace(d) => d.bytes_mut(),
        }
    }

    /// A lease of the destination, for a link that writes into it while the request
    /// lasts.
    #[inline]
    pub fn lease(&mut self) -> Dst {
        match self {
            // As `SendBuf::lease`: an owned buffer is never resized while the request
            // that owns it is pending.
            RecvBuf::Owned(v) => Dst::of_owned(v),
            RecvBuf::Lent(d) | RecvBuf::InPlace(d) => d.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        let s = Src::from_static(b"abcdef");
        assert_eq!(s.range(2, 3), Some(&b"cde"[..]));
        assert_eq!(
            s.sub(1, 4).and_then(|t| t.range(1, 2).map(<[u8]>::to_vec)),
            Some(b"cd".to_vec())
        );
        assert!(s.sub(3, 4).is_none());
        assert_eq!(s.range(4, 3), None);
        assert_eq!(s.range(usize::MAX, 2), None);
        let mut d = Dst::from_static(Box::leak(vec![0u8; 8].into_boxed_slice()));
        assert!(d.write(6, b"xy"));
        assert!(!d.write(7, b"xy"));
        assert_eq!(d.range(5, 3), Some(&b"\0xy"[..]));
        assert_eq!(d.range(usize::MAX, 2), None);
        assert!(d.sub(8, 0).is_some() && d.sub(9, 0).is_none());
        assert_eq!(
            d.sub(6, 2).and_then(|t| t.range(0, 2).map(<[u8]>::to_vec)),
            Some(b"xy".to_vec())
        );
        assert!(d.sub(7, 2).is_none() && d.sub(9, 0).is_none());
        // Every length up to 24 (both branches of the write, the two-word one for 8 to 16
        // bytes, and their edges) writes exactly its bytes and nothing around them.
        for len in 0..=24usize {
            let mut m = Dst::from_static(Box::leak(vec![0u8; 40].into_boxed_slice()));
            let src: Vec<u8> = (1..=len as u8).collect();
            assert!(m.write(5, &src));
            let mut want = vec![0u8; 40];
            want[5..5 + len].copy_from_slice(&src);
            assert_eq!(m.range(0, 40).map(<[u8]>::to_vec), Some(want), "len {len}");
            assert!(!m.write(40 - len + 1, &src) || len == 0);
        }
        // Sixteen bytes hold an aligned word at one of their first eight offsets.
        let w = Dst::from_static(Box::leak(vec![0u8; 16].into_boxed_slice()));
        let o = (0..8)
            .find(|&o| (w.as_mut_ptr() as usize + o).is_multiple_of(8))
            .expect("an aligned offset");
        assert!(w.word(o).is_some() && w.word(o + 1).is_none() && w.word(o + 9).is_none());
        // SAFETY: zero bytes: nothing is ever read or written.
        let e = unsafe { Dst::new(std::ptr::null_mut(), 0) };
        assert!(e.is_empty() && e.range(0, 0) == Some(&[][..]));
    }
}
