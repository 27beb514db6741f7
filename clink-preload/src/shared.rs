//! One connection's shared mapping (a memfd both ends map): the header page with each
//! direction's positions, switch offset and sleep flags, and the two byte rings. The
//! layout is `clink_proto::sockets::Layout`; every position a peer wrote is checked before
//! it is used, so a broken or hostile peer makes a call fail, never read out of bounds.

use clink_proto::sockets::{ring_readable, Layout, NOT_SWITCHED};
use libc::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Magic word at the start of the mapping.
pub const MAGIC: u32 = 0x434b_534d; // "CKSM"

/// A mapped connection.
pub struct Shared {
    base: *mut u8,
    layout: Layout,
    /// The memfd behind the mapping (kept for handing the connection across exec).
    pub memfd: c_int,
    /// How far into each ring this process's writer has had the pages made (see
    /// [`Shared::populate_ahead`]); the ring's size once done.
    populated: [AtomicU64; 2],
}

/// The first stretch of a ring made ahead of its writer; each later one doubles what is
/// made, so a writer that fills the ring makes about eight calls, and one that writes a
/// few bytes pays for a few pages.
const POPULATE_FIRST: u64 = 16 << 10;

// SAFETY: the mapping is shared memory accessed through atomics (positions, flags) and
// through byte copies of ring ranges that the SPSC protocol gives to one side at a time.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Creates and maps a fresh mapping with rings of `ring` bytes.
    pub fn create(ring: u32) -> Option<Shared> {
        let layout = Layout { ring };
        // SAFETY: memfd_create takes a NUL-terminated name and flags.
        let fd = unsafe { libc::memfd_create(c"clink-socket".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: sizing the memfd we just created.
        if unsafe { libc::ftruncate(fd, layout.total() as libc::off_t) } != 0 {
            // SAFETY: closing our own fd.
            unsafe { libc::syscall(libc::SYS_close, fd) };
            return None;
        }
        let s = Shared::map(fd, layout)?;
        s.header_u32(Layout::RING_OFF)
            .store(ring, Ordering::Relaxed);
        for dir in 0..2 {
            s.switch_at(dir).store(NOT_SWITCHED, Ordering::Relaxed);
            s.unswitch_at(dir).store(NOT_SWITCHED, Ordering::Relaxed);
        }
        s.header_u32(Layout::MAGIC_OFF)
            .store(MAGIC, Ordering::Release);
        Some(s)
    }

    /// Maps a peer's memfd after checking its size and header against `ring`.
    pub fn attach(fd: c_int, ring: u32) -> Option<Shared> {
        let layout = Layout { ring };
        // SAFETY: fstat writes the stat buffer it is given.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size as usize != layout.total() {
            return None;
        }
        let s = Shared::map(fd, layout)?;
        if s.header_u32(Layout::MAGIC_OFF).load(Ordering::Acquire) != MAGIC
            || s.header_u32(Layout::RING_OFF).load(Ordering::Relaxed) != ring
        {
            return None;
        }
        Some(s)
    }

    fn map(fd: c_int, layout: Layout) -> Option<Shared> {
        // SAFETY: a fresh shared mapping of the whole memfd; unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.total(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // SAFETY: closing the fd handed to us; nothing else uses it.
            unsafe { libc::syscall(libc::SYS_close, fd) };
            return None;
        }
        Some(Shared {
            base: p as *mut u8,
            layout,
            memfd: fd,
            populated: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    /// Bytes in each ring.
    pub fn ring_size(&self) -> u32 {
        self.layout.ring
    }

    fn header_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is a 4-aligned offset within the header page, which lives as long
        // as `self`; AtomicU32 has the layout of u32.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    fn dir_u64(&self, dir: usize, off: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned offset within direction `dir`'s block of the header page.
        unsafe { &*(self.base.add(Layout::dir_block(dir) + off) as *const AtomicU64) }
    }

    fn dir_u32(&self, dir: usize, off: usize) -> &AtomicU32 {
        // SAFETY: a 4-aligned offset within direction `dir`'s block of the header page.
        unsafe { &*(self.base.add(Layout::dir_block(dir) + off) as *const AtomicU32) }
    }

    /// The writer's position of direction `dir`.
    pub fn tail(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::TAIL)
    }

    /// The reader's position of direction `dir`.
    pub fn head(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::HEAD)
    }

    /// The kernel bytes direction `dir`'s writer sent before moving to the ring.
    pub fn switch_at(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::SWITCH_AT)
    }

    /// Set while direction `dir`'s reader sleeps in the kernel.
    pub fn reader_sleeping(&self, dir: usize) -> &AtomicU32 {
        self.dir_u32(dir, Layout::READER_SLEEPING)
    }

    /// Set while direction `dir`'s writer sleeps in the kernel (ring full).
    pub fn writer_sleeping(&self, dir: usize) -> &AtomicU32 {
        self.dir_u32(dir, Layout::WRITER_SLEEPING)
    }

    /// Where direction `dir`'s writer went back to the kernel (ring position).
    pub fn unswitch_at(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::UNSWITCH_AT)
    }

    /// The kernel stream position of direction `dir` from which data resumes.
    pub fn resume_at(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::RESUME_AT)
    }

    /// Set when direction `dir`'s reader leaves (see `Layout::LEAVING`).
    pub fn leaving(&self, dir: usize) -> &AtomicU32 {
        self.dir_u32(dir, Layout::LEAVING)
    }

    /// Wake-up bytes being sent on direction `dir`'s kernel stream.
    pub fn bells_in_flight(&self, dir: usize) -> &AtomicU32 {
        self.dir_u32(dir, Layout::BELLS_IN_FLIGHT)
    }

    /// Wake-up bytes sent on direction `dir`'s kernel stream.
    pub fn bells_sent(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::BELLS_SENT)
    }

    /// The number of direction `dir`'s reader's wake socket (0: none).
    pub fn wake_socket(&self, dir: usize) -> &AtomicU64 {
        self.dir_u64(dir, Layout::WAKE_SOCKET)
    }

    /// Copies the `n` bytes of direction `dir`'s ring from position `from` (for a resend).
    pub fn copy_out(&self, dir: usize, from: u64, n: usize) -> Vec<u8> {
        let cap = self.layout.ring as usize;
        let ring = self.ring_ptr(dir);
        let mut out = vec![0u8; n.min(cap)];
        let mut off = 0;
        while off < out.len() {
            let pos = (from as usize + off) & (cap - 1);
            let k = (out.len() - off).min(cap - pos);
            // SAFETY: `pos + k <= cap`; the range was written by this writer and is not
            // reused (the reader left).
            unsafe { std::ptr::copy_nonoverlapping(ring.add(pos), out.as_mut_ptr().add(off), k) };
            off += k;
        }
        out
    }

    /// Bytes readable in direction `dir`; `Err` when the peer's positions are impossible.
    pub fn readable(&self, dir: usize) -> Result<u64, ()> {
        let head = self.head(dir).load(Ordering::Relaxed);
        let tail = self.tail(dir).load(Ordering::Acquire);
        ring_readable(head, tail, self.layout.ring).map_err(|_| ())
    }

    /// Bytes writable in direction `dir`.
    pub fn writable(&self, dir: usize) -> Result<u64, ()> {
        let head = self.head(dir).load(Ordering::Acquire);
        let tail = self.tail(dir).load(Ordering::Relaxed);
        ring_readable(head, tail, self.layout.ring)
            .map(|n| self.layout.ring as u64 - n)
            .map_err(|_| ())
    }

    /// Copies up to `want` readable bytes of direction `dir` into the iovecs (after
    /// skipping `skip` bytes of them), advancing the reader unless `peek`. Returns the count.
    ///
    /// # Safety
    /// The iovecs must describe writable memory; the caller is direction `dir`'s only reader.
    pub unsafe fn read(
        &self,
        dir: usize,
        iov: &[libc::iovec],
        skip: usize,
        want: usize,
        peek: bool,
    ) -> Result<usize, ()> {
        let avail = self.readable(dir)? as usize;
        let head = self.head(dir).load(Ordering::Relaxed);
        let n = avail.min(want);
        let ring = self.ring_ptr(dir);
        let cap = self.layout.ring as usize;
        let mut done = 0;
        for_each_span(iov, skip, n, |dst, len| {
            let mut off = 0;
            while off < len {
                let pos = (head as usize + done + off) & (cap - 1);
                let k = (len - off).min(cap - pos);
                // SAFETY: `pos + k <= cap` within the ring; `dst + off + k` within the
                // caller's iovec; the range is published by the writer (Acquire above).
                unsafe { std::ptr::copy_nonoverlapping(ring.add(pos), dst.add(off), k) };
                off += k;
            }
            done += len;
        });
        if !peek {
            self.head(dir)
                .store(head.wrapping_add(n as u64), Ordering::Release);
        }
        Ok(n)
    }

    /// Copies up to `want` bytes from the iovecs (after skipping `skip` bytes of them)
    /// into direction `dir`'s ring, as much as fits, and publishes them. Returns the count.
    ///
    /// # Safety
    /// The iovecs must describe readable memory; the caller is direction `dir`'s only writer.
    pub unsafe fn write(
        &self,
        dir: usize,
        iov: &[libc::iovec],
        skip: usize,
        want: usize,
    ) -> Result<usize, ()> {
        let space = self.writable(dir)? as usize;
        let tail = self.tail(dir).load(Ordering::Relaxed);
        let n = space.min(want);
        let ring = self.ring_ptr(dir);
        let cap = self.layout.ring as usize;
        self.populate_ahead(dir, tail.saturating_add(n as u64));
        let mut done = 0;
        for_each_span(iov, skip, n, |src, len| {
            let mut off = 0;
            while off < len {
                let pos = (tail as usize + done + off) & (cap - 1);
                let k = (len - off).min(cap - pos);
                // SAFETY: `pos + k <= cap`; the range is free (the reader released it).
                unsafe {
                    std::ptr::copy_nonoverlapping(src.add(off) as *const u8, ring.add(pos), k)
                };
                off += k;
            }
            done += len;
        });
        self.tail(dir)
            .store(tail.wrapping_add(n as u64), Ordering::Release);
        Ok(n)
    }

    /// Makes the pages of direction `dir`'s ring up to position `end` (and as far again as
    /// was made before) in one call, during the writer's first lap. Left to faults, a
    /// writer takes one per page, and so does a reader that follows it closely (the
    /// kernel maps the pages around a faulting one only when they exist already): a
    /// redis-benchmark run took thousands per process. Positions start at 0, so the first
    /// lap is every position below the ring's size.
    fn populate_ahead(&self, dir: usize, end: u64) {
        let cap = u64::from(self.layout.ring);
        let done = self.populated[dir].load(Ordering::Relaxed);
        if end <= done || done >= cap {
            return;
        }
        let to = end
            .next_multiple_of(POPULATE_FIRST)
            .max(done.saturating_mul(2))
            .min(cap);
        // SAFETY: a range of this mapping's own ring; MADV_POPULATE_WRITE only faults the
        // pages in (writing nothing), as the copy into them would.
        let r = unsafe {
            libc::madvise(
                self.ring_ptr(dir).add(done as usize) as *mut c_void,
                (to - done) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        // A kernel without it (before 5.14): faults, as before.
        self.populated[dir].store(if r == 0 { to } else { cap }, Ordering::Relaxed);
    }

    fn ring_ptr(&self, dir: usize) -> *mut u8 {
        // SAFETY: the ring of `dir` lies within the mapping.
        unsafe { self.base.add(self.layout.ring_at(dir)) }
    }
}

/// Calls `f(ptr, len)` for the spans of `iov` covering bytes `skip..skip + n`.
pub(crate) fn for_each_span(
    iov: &[libc::iovec],
    mut skip: usize,
    mut n: usize,
    mut f: impl FnMut(*mut u8, usize),
) {
    for v in iov {
        if n == 0 {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let len = (v.iov_len - skip).min(n);
        // SAFETY: pointer arithmetic within the iovec's own range.
        f(unsafe { (v.iov_base as *mut u8).add(skip) }, len);
        skip = 0;
        n -= len;
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping and closing our memfd; nothing refers to them
        // once the last owner is gone.
        unsafe {
            libc::munmap(self.base as *mut c_void, self.layout.total());
            libc::syscall(libc::SYS_close, self.memfd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which 4 KiB pages of direction `dir`'s ring are in memory.
    fn resident(s: &Shared, dir: usize) -> Vec<bool> {
        let pages = s.ring_size() as usize / 4096;
        let mut v = vec![0u8; pages];
        // SAFETY: the ring is page-aligned within the mapping; `v` has a byte per page.
        let r = unsafe {
            libc::mincore(
                s.ring_ptr(dir) as *mut c_void,
                s.ring_size() as usize,
                v.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        v.iter().map(|b| b & 1 == 1).collect()
    }

    fn write(s: &Shared, n: usize) {
        let data = vec![7u8; n];
        let iov = [libc::iovec {
            iov_base: data.as_ptr() as *mut c_void,
            iov_len: n,
        }];
        // SAFETY: `iov` describes `data`; this test is the ring's only writer.
        assert_eq!(unsafe { s.write(0, &iov, 0, n) }, Ok(n));
    }

    #[test]
    fn a_writer_makes_its_rings_pages_ahead_doubling_and_no_further() {
        let s = Shared::create(256 << 10).expect("memfd");
        assert!(
            resident(&s, 0).iter().all(|r| !r),
            "nothing made before a write"
        );
        let made = |s: &Shared| resident(s, 0).iter().filter(|r| **r).count();
        write(&s, 100);
        // The first 16 KiB: four pages, the first four.
        assert_eq!(made(&s), 4);
        assert!(resident(&s, 0)[..4].iter().all(|r| *r));
        write(&s, 20 << 10);
        assert_eq!(made(&s), 8, "32 KiB after 20 KiB written");
        write(&s, 20 << 10);
        assert_eq!(made(&s), 16, "64 KiB after 40 KiB: twice what was made");
        write(&s, 150 << 10);
        assert_eq!(
            made(&s),
            48,
            "192 KiB after 190 KiB: more than twice, as far as written"
        );
        write(&s, 60 << 10);
        assert_eq!(made(&s), 64, "the whole ring, never beyond it");
        assert!(
            resident(&s, 1).iter().all(|r| !r),
            "the other direction untouched"
        );
    }
}
