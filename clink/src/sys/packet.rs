//! A packet socket (`AF_PACKET`, `SOCK_DGRAM`, `ETH_P_IP`) with a TPACKET_V2 receive ring
//! shared with the kernel, and sends of whole IP packets through it: the system calls and
//! the mapping behind the UDP transport's receive ring (`transport::udp::ring`).

use super::{cvt, setsockopt};
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Attaches a classic BPF filter to a socket.
pub fn attach_filter(fd: RawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // (The kernel copies the program: `prog` need only outlive the call.)
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// Takes a socket's filter off (best effort: used to undo a partial set-up).
pub fn detach_filter(fd: RawFd) {
    let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_DETACH_FILTER, &0);
}

/// A link-layer address for the packet socket: `ifindex` 0 is every interface.
fn sockaddr_ll(ifindex: i32, halen: u8, addr: [u8; 8]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as u16;
    ll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    ll.sll_ifindex = ifindex;
    ll.sll_halen = halen;
    ll.sll_addr = addr;
    ll
}

/// A packet socket's receive ring of `frames` frames of `frame` bytes, mapped. Owns its
/// descriptor and mapping; `Send`, not `Sync` (one endpoint reads it).
pub struct PacketRing {
    fd: OwnedFd,
    map: *mut u8,
    frame: usize,
    frames: usize,
}

// SAFETY: the mapping is owned by this value alone and freed with it; moving it to
// another thread moves that ownership.
unsafe impl Send for PacketRing {}

impl PacketRing {
    /// Opens the socket, attaches `filter` (before anything can be queued), and sets up
    /// and maps a ring of `frames` frames of `frame` bytes in blocks of `block` bytes;
    /// sends bypass the qdisc. Fails without `CAP_NET_RAW`.
    pub fn open(
        filter: &[libc::sock_filter],
        frame: usize,
        frames: usize,
        block: usize,
    ) -> io::Result<PacketRing> {
        use rustix::net::{AddressFamily, Protocol, SocketFlags, SocketType};
        // IPv4 frames only (`ETH_P_IP`, in network order as the kernel wants it).
        let ip = std::num::NonZeroU32::new(u32::from((libc::ETH_P_IP as u16).to_be()))
            .map(Protocol::from_raw);
        let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
        let fd = rustix::net::socket_with(AddressFamily::PACKET, SocketType::DGRAM, flags, ip)?;
        let raw = fd.as_raw_fd();
        attach_filter(raw, filter)?;
        setsockopt(
            raw,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &(libc::tpacket_versions::TPACKET_V2 as libc::c_int),
        )?;
        let req = libc::tpacket_req {
            tp_block_size: block as u32,
            tp_block_nr: (frames * frame / block) as u32,
            tp_frame_size: frame as u32,
            tp_frame_nr: frames as u32,
        };
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        // Sends go straight to the device (a veth pair has no queue to bypass anyway).
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &1)?;
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: maps the ring the kernel just made for this socket, at its size, at an
        // address the kernel chooses.
        let map = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                frames * frame,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::POPULATE,
                &fd,
                0,
            )?
        };
        let ring = PacketRing {
            fd,
            map: map.cast(),
            frame,
            frames,
        };
        let ll = sockaddr_ll(0, 0, [0; 8]);
        // SAFETY: a valid sockaddr_ll of the size given.
        cvt(unsafe {
            libc::bind(
                raw,
                (&ll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(ring)
    }

    /// The descriptor (readable while a frame waits), for epoll.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The status word of frame `i`.
    fn status(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.frames, "a frame of the ring");
        // SAFETY: frame `i` lies in the mapping, which lives as long as `self`; its first
        // word (`tp_status`, 4-aligned: frames are page-aligned multiples of 16) is the
        // word the kernel and we hand the frame over with, so atomic access is right.
        unsafe { &*self.map.add(i * self.frame).cast::<AtomicU32>() }
    }

    /// Frame `i`'s bytes when the kernel has handed it to user space, `None` while it is
    /// the kernel's. Give it back with [`PacketRing::give_back`].
    pub fn frame(&self, i: usize) -> Option<&[u8]> {
        if self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: a frame the kernel handed to user space (TP_STATUS_USER, read with
        // Acquire above): it does not write it again until it is given back, which needs
        // `&mut self` (no borrow of the frame is left then).
        Some(unsafe { std::slice::from_raw_parts(self.map.add(i * self.frame), self.frame) })
    }

    /// Hands frame `i` back to the kernel.
    pub fn give_back(&mut self, i: usize) {
        self.status(i)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }

    /// Sends one IP packet out of interface `ifindex` to the link-layer address
    /// (`halen` bytes of `mac`).
    pub fn send(&self, ifindex: i32, halen: u8, mac: [u8; 8], packet: &[u8]) -> io::Result<()> {
        let ll = sockaddr_ll(ifindex, halen, mac);
        // SAFETY: the packet and the name are live for the call; the kernel only reads
        // them.
        let n = unsafe {
            libc::sendto(
                self.raw(),
                packet.as_ptr().cast(),
                packet.len(),
                libc::MSG_DONTWAIT,
                (&ll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Packets the kernel dropped because the ring was full since the last call
    /// (`PACKET_STATISTICS`, which resets when read); 0 if it cannot be read.
    pub fn take_drops(&self) -> u64 {
        // SAFETY: tpacket_stats is plain old data.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: out-pointers to a tpacket_stats and its length.
        let r = unsafe {
            libc::getsockopt(
                self.raw(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r == 0 {
            u64::from(st.tp_drops)
        } else {
            0
        }
    }
}

impl Drop for PacketRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, at its size; nothing borrows it past `self`.
        let _ = unsafe { rustix::mm::munmap(self.map.cast(), self.frames * self.frame) };
    }
}
