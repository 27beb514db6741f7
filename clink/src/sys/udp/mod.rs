//! The UDP socket of an endpoint: batched sends with segmentation offload, batched
//! receives with receive coalescing: the system calls of the UDP path, with the message
//! headers and vectors they take (into the batch's buffer, the socket's slots, and the
//! leases of bulk payloads and speculative destinations).
//!
//! **Send.** Datagrams are appended to a [`TxBatch`]; consecutive datagrams to the same
//! destination of the same size become one GSO "virtual frame" (`UDP_SEGMENT`: the kernel
//! cuts it into datagrams at the lowest level, as the seed's driver did), and all frames go
//! out with one `sendmmsg`. Where the kernel refuses GSO, each datagram is its own entry.
//!
//! **Receive.** `recvmmsg` into slots of 64 KiB (a GRO read can return a whole 64 KiB
//! virtual frame; a smaller slot would lose the rest silently: the kernel truncates a
//! coalesced read to the buffer and drops the remainder), split by the `UDP_GRO`
//! segment size. A speculative
//! layout puts caller-given vectors before each slot ([`UdpSock::set_lead`]); they are
//! built once per layout, not per read.

mod batch;

pub use batch::TxBatch;

use crate::lease::Dst;
use crate::sys::net::{for_socket, unmapped};
use crate::sys::{cvt, setsockopt, SockAddr};
use batch::frame_vectors;
use clink_proto::reliable::packet::{coalesced_segment, BULK_HEADER};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Largest UDP payload of one send (IPv4).
pub const MAX_UDP_PAYLOAD: usize = 65507;
/// Most segments of one GSO send (the kernel allows 128; half keeps bursts short).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Receive slots per `recvmmsg`.
pub const RX_SLOTS: usize = 8;
/// Bytes per receive slot: a whole coalesced 64 KiB read.
pub const RX_SLOT: usize = 65536;
/// Entries per `sendmmsg`.
const TX_BATCH: usize = 64;

/// Counters of the socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockStats {
    /// `sendmmsg` calls.
    pub send_calls: u64,
    /// Datagrams handed to the kernel (GSO segments counted one by one).
    pub datagrams_sent: u64,
    /// Datagrams the kernel refused (buffer full or an error); the protocol resends them.
    pub send_drops: u64,
    /// `recvmmsg` calls that returned data.
    pub recv_calls: u64,
    /// Datagrams received (after splitting coalesced reads).
    pub datagrams_received: u64,
    /// Coalesced (GRO) reads.
    pub gro_reads: u64,
    /// Reads cut short by the slot size (should never happen).
    pub truncated: u64,
}

/// A non-blocking UDP socket with GSO/GRO where the kernel offers them.
pub struct UdpSock {
    fd: OwnedFd,
    local: SocketAddr,
    /// An IPv6 socket (IPv4 peers as mapped addresses).
    v6: bool,
    gso: bool,
    gro: bool,
    rx: Box<RxBufs>,
    /// Entries the next `recvmmsg` asks for (see [`UdpSock::recv_batch`]).
    width: usize,
    /// At most this many entries per read: [`RX_SLOTS`], or the entries a layout arms
    /// when [`UdpSock::set_lead`] is told to cap.
    cap: usize,
    /// The last call asked for one entry and got it.
    single: bool,
    /// The entries' vectors are the slots alone ([`UdpSock::set_lead`] with no layout and
    /// no cap): a second such call has nothing to change.
    plain: bool,
    /// The peer of a connected socket until it is first found empty: it may still hold
    /// datagrams that anyone sent before the connect, so reads ask for the sender.
    peer: Option<SocketAddr>,
    /// That peer once the socket was found empty: the only sender it can hold, so a
    /// one-entry read asks for no name.
    only: Option<SocketAddr>,
    /// A read failed with an error other than "nothing to read": the kernel holds an
    /// ICMP error for a datagram this socket sent ([`UdpSock::take_unreachable`]).
    pub errored: bool,
    /// Destinations this host refused to send to (no route, or the source address a
    /// connected socket holds is gone), handed out with the ICMP errors.
    refused: Vec<Unreachable>,
    /// Counters.
    pub stats: SockStats,
}

struct RxBufs {
    data: Vec<u8>,
    addrs: [SockAddr; RX_SLOTS],
    /// Each entry's vectors: the caller's leading ones (a speculative layout, see
    /// [`UdpSock::set_lead`]), then its 64 KiB slot. Built when the layout changes, not
    /// per read; the headers point at them.
    iovs: Vec<Vec<libc::iovec>>,
    /// Total length of each entry's vectors.
    caps: [usize; RX_SLOTS],
    ctrl: [[u64; 8]; RX_SLOTS],
    hdrs: [libc::mmsghdr; RX_SLOTS],
    got: [RxEntry; RX_SLOTS],
}

// SAFETY: the headers and vectors point into this value's own buffers and into memory the
// caller of `set_lead` vouches for; none of it is tied to a thread.
unsafe impl Send for RxBufs {}

impl RxBufs {
    /// The first `len` bytes of entry `k`'s slot.
    fn slot(&self, k: usize, len: usize) -> &[u8] {
        &self.data[k * RX_SLOT..k * RX_SLOT + len.min(RX_SLOT)]
    }
}

/// A destination that answered one of our datagrams with ICMP destination unreachable, or
/// that this host refused to send to ([`UdpSock::take_unreachable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreachable {
    /// Where the datagram went.
    pub dest: SocketAddr,
    /// Whose datagram it was, from the part of it the ICMP message quoted (or the
    /// datagram itself, when this host refused it).
    pub quoted: Quoted,
    /// This host refused to send it (no route, or no source address any more): no
    /// answer from the network, which nobody else could have forged.
    pub local: bool,
    /// Port unreachable (the host answered: no process there), rather than host or
    /// network unreachable.
    pub port: bool,
}

/// Whose datagram an [`Unreachable`] was, as far as its start tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quoted {
    /// A datagram of the reliable protocol carrying its connection id (bytes 8..12).
    Conn(u32),
    /// A bulk fragment, which carries none: its header, whose checksum names its
    /// connection (`clink_proto::reliable::packet::bulk_header_owner`).
    Bulk([u8; BULK_HEADER]),
    /// Not a datagram of ours, or cut too short to tell.
    Unknown,
}

impl Quoted {
    /// What the start `q` of a datagram says about it.
    fn of(q: &[u8]) -> Quoted {
        use clink_proto::reliable::packet::{is_bulk, peek_conn, MAGIC};
        if is_bulk(q) {
            let mut h = [0; BULK_HEADER];
            h.copy_from_slice(&q[..BULK_HEADER]);
            return Quoted::Bulk(h);
        }
        let magic = q
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        match peek_conn(q) {
            Some(c) if magic == Some(MAGIC) => Quoted::Conn(c),
            _ => Quoted::Unknown,
        }
    }
}

/// What one entry of the last [`UdpSock::recv_batch`] received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxEntry {
    /// Source address.
    pub src: SocketAddr,
    /// Bytes received (over the leading vectors, then the slot).
    pub len: usize,
    /// Segment size of a coalesced (GRO) read.
    pub seg: Option<usize>,
}

impl UdpSock {
    /// Binds a non-blocking socket to `addr` (port 0: any) with `buf_bytes` of kernel
    /// buffers each way (forced as root, else as large as allowed), and turns on GRO.
    pub fn bind(addr: SocketAddr, buf_bytes: usize) -> io::Result<UdpSock> {
        UdpSock::open(addr, buf_bytes, false, None)
    }

    /// As [`UdpSock::bind`], with `SO_REUSEPORT`: sockets of this user may bind the same
    /// address too. Those connected to a peer then take its datagrams (the kernel prefers
    /// a connected socket's exact match), the others everything else.
    pub fn bind_shared(addr: SocketAddr, buf_bytes: usize) -> io::Result<UdpSock> {
        UdpSock::open(addr, buf_bytes, true, None)
    }

    /// A socket bound to `local` beside the shared socket bound there
    /// ([`UdpSock::bind_shared`]) and connected to `peer`: it receives `peer`'s datagrams
    /// and sends to it without a route lookup per datagram. `filter`: a classic BPF
    /// program attached before the socket is bound (so nothing it drops is ever queued).
    pub fn connected(
        local: SocketAddr,
        peer: SocketAddr,
        buf_bytes: usize,
        filter: Option<&[libc::sock_filter]>,
    ) -> io::Result<UdpSock> {
        let mut s = UdpSock::open(local, buf_bytes, true, filter)?;
        s.connect(peer)?;
        s.peer = Some(peer);
        Ok(s)
    }

    fn open(
        addr: SocketAddr,
        buf_bytes: usize,
        shared: bool,
        filter: Option<&[libc::sock_filter]>,
    ) -> io::Result<UdpSock> {
        use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
        let family = if addr.is_ipv4() {
            AddressFamily::INET
        } else {
            AddressFamily::INET6
        };
        let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
        let fd = rustix::net::socket_with(family, SocketType::DGRAM, flags, None)?;
        let raw = fd.as_raw_fd();
        // The option is an int.
        let b = buf_bytes.min(i32::MAX as usize);
        if sockopt::set_socket_recv_buffer_size_force(&fd, b).is_err() {
            sockopt::set_socket_recv_buffer_size(&fd, b)?;
        }
        if sockopt::set_socket_send_buffer_size_force(&fd, b).is_err() {
            sockopt::set_socket_send_buffer_size(&fd, b)?;
        }
        let gro = setsockopt(raw, libc::SOL_UDP, libc::UDP_GRO, &1).is_ok();
        // ICMP errors for what this socket sends (a peer's port unreachable: its process
        // is gone) are queued with the destination and the datagram they answer, on
        // connected and unconnected sockets alike (`take_unreachable`).
        setsockopt(raw, libc::IPPROTO_IP, libc::IP_RECVERR, &1)?;
        if addr.is_ipv6() {
            // IPv4 peers too (mapped addresses), whatever the host's default, and their
            // ICMPv6 errors.
            sockopt::set_ipv6_v6only(&fd, false)?;
            setsockopt(raw, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, &1)?;
        }
        if shared {
            sockopt::set_socket_reuseport(&fd, true)?;
        }
        if let Some(prog) = filter {
            crate::sys::packet::attach_filter(raw, prog)?;
        }
        rustix::net::bind(&fd, &addr)?;
        let bound = rustix::net::getsockname(&fd)?;
        let local = std::net::SocketAddr::try_from(bound).map_or(addr, unmapped);
        let mut sock = UdpSock {
            fd,
            local,
            v6: addr.is_ipv6(),
            gso: true,
            gro,
            rx: Box::new(RxBufs {
                data: vec![0u8; RX_SLOTS * RX_SLOT],
                addrs: [SockAddr::empty(); RX_SLOTS],
                iovs: (0..RX_SLOTS)
                    .map(|_| Vec::with_capacity(2 * MAX_GSO_SEGMENTS + 1))
                    .collect(),
                caps: [0; RX_SLOTS],
                ctrl: [[0; 8]; RX_SLOTS],
                // SAFETY: as above.
                hdrs: unsafe { zeroed() },
                got: [RxEntry {
                    src: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
                    len: 0,
                    seg: None,
                }; RX_SLOTS],
            }),
            width: RX_SLOTS,
            cap: RX_SLOTS,
            single: false,
            plain: false,
            peer: None,
            only: None,
            errored: false,
            refused: Vec::new(),
            stats: SockStats::default(),
        };
        sock.set_lead(&[], false);
        Ok(sock)
    }

    /// Connects the socket to `peer`: from now on the kernel gives it only `peer`'s
    /// datagrams (flow steering; datagrams already queued stay).
    pub fn connect(&self, peer: SocketAddr) -> io::Result<()> {
        Ok(rustix::net::connect(&self.fd, &for_socket(peer, self.v6))?)
    }

    /// The bound address (the port the kernel chose).
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Whether receive coalescing (UDP_GRO) is on.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Whether segmentation offload (UDP_SEGMENT) is used for sends.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Drains the socket's error queue into `out`: the destinations that answered a
    /// datagram of ours with ICMP "port unreachable" (no process listens there: the peer
    /// exited or was killed), "host unreachable" or "network unreachable", each with the
    /// connection id of the datagram the kernel quoted back (`None` when the quote is
    /// not one of ours). Other errors are dropped. Also clears [`UdpSock::errored`].
    pub fn take_unreachable(&mut self, out: &mut Vec<Unreachable>) {
        self.errored = false;
        out.append(&mut self.refused);
        // Bounded: the queue holds what the kernel's ICMP rate limit let through.
        for _ in 0..64 {
            let mut quote = [0u8; 64];
            let mut name = SockAddr::empty();
            let mut ctrl = [0u64; 16];
            let mut iov = libc::iovec {
                iov_base: quote.as_mut_ptr().cast(),
                iov_len: quote.len(),
            };
            // SAFETY: plain old data; every pointer is set below.
            let mut h: libc::msghdr = unsafe { zeroed() };
            (h.msg_name, h.msg_namelen) = {
                let (p, l) = name.raw_mut();
                (p.cast(), l)
            };
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = ctrl.as_mut_ptr().cast();
            h.msg_controllen = size_of_val(&ctrl);
            // SAFETY: the header points at live buffers of the sizes given.
            let n = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut h,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                return;
            }
            let quoted = &quote[..(n as usize).min(quote.len())];
            // SAFETY: the kernel filled `h.msg_control` with `msg_controllen` bytes of
            // well-formed control messages; the macros walk them within those bounds.
            let mut c = unsafe { libc::CMSG_FIRSTHDR(&h) };
            while !c.is_null() {
                // SAFETY: `c` points at a control message header inside `ctrl`.
                let (level, kind) = unsafe { ((*c).cmsg_level, (*c).cmsg_type) };
                let v4 = level == libc::IPPROTO_IP && kind == libc::IP_RECVERR;
                let v6 = level == libc::IPPROTO_IPV6 && kind == libc::IPV6_RECVERR;
                if v4 || v6 {
                    // SAFETY: an IP_RECVERR / IPV6_RECVERR message holds a
                    // sock_extended_err; read unaligned (control data is only 8-aligned
                    // by convention).
                    let ee: libc::sock_extended_err =
                        unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
                    // Destination unreachable: ICMP type 3, codes net (0), host (1),
                    // port (3); ICMPv6 type 1, codes no route (0), address (3), port (4).
                    let (origin, kind, codes, port) = if v4 {
                        (libc::SO_EE_ORIGIN_ICMP, 3, [0, 1, 3], 3)
                    } else {
                        (libc::SO_EE_ORIGIN_ICMP6, 1, [0, 3, 4], 4)
                    };
                    let unreachable =
                        ee.ee_origin == origin && ee.ee_type == kind && codes.contains(&ee.ee_code);
                    if let Some(dest) = name.get().filter(|_| unreachable) {
                        out.push(Unreachable {
                            dest,
                            quoted: Quoted::of(quoted),
                            local: false,
                            port: ee.ee_code == port,
                        });
                    }
                }
                // SAFETY: as CMSG_FIRSTHDR above.
                c = unsafe { libc::CMSG_NXTHDR(&h, c) };
            }
        }
    }

    /// The descriptor, for epoll.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A duplicate of the descriptor as a standard socket (another thread's sends share
    /// the port and the file's flags: non-blocking).
    pub fn try_clone_std(&self) -> io::Result<std::net::UdpSocket> {
        Ok(std::net::UdpSocket::from(self.fd.try_clone()?))
    }

    /// Sends everything in `batch` through this (unconnected) socket and empties it, as
    /// [`UdpSock::send_run`] run by run. For the tests: the transport picks a socket per
    /// run (`UdpTransport::flush`).
    #[cfg(test)]
    fn send(&mut self, batch: &mut TxBatch) {
        let mut i = 0;
        while i < batch.frames.len() {
            i = self.send_run(batch, i, false);
        }
        batch.clear();
    }

    /// Sends the frames of `batch` from `first` to the same destination as it (a run);
    /// returns the index after the run. `connected`: this socket is connected to that
    /// destination, so the datagrams go without a name (the kernel then uses the route it
    /// keeps instead of looking one up per datagram). Datagrams the kernel does not take
    /// (socket buffer full) are dropped and counted: the reliable protocol resends them.
    pub fn send_run(&mut self, batch: &mut TxBatch, first: usize, connected: bool) -> usize {
        let mut i = first;
        let mut end = batch.run_end(first);
        while i < end {
            let n = (end - i).min(TX_BATCH);
            let sent = self.send_some(batch, i, n, connected);
            match sent {
                Ok(k) if k > 0 => i += k,
                Err(e) if e.raw_os_error() == Some(libc::EIO) && self.gso => {
                    // No segmentation offload on this path: one datagram per entry.
                    tracing::info!("UDP_SEGMENT refused ({e}); sending datagram by datagram");
                    self.gso = false;
                    batch.split_from(i);
                    end = batch.run_end(i);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The socket buffer is full: the rest of the run would fail the same way.
                    let rest = &batch.frames[i..end];
                    self.stats.send_drops += rest.iter().map(|f| u64::from(f.count)).sum::<u64>();
                    break;
                }
                r => {
                    // A hard error on this frame: drop it, go on with the others. An
                    // ICMP error the kernel reported here is also in the error queue; a
                    // refusal of this host's own (no route to the peer, or the address
                    // a connected socket sends from is gone) is kept as one.
                    if let Err(e) = r {
                        tracing::debug!("sendmmsg: {e}");
                        self.errored = true;
                        let local = [libc::ENETUNREACH, libc::EHOSTUNREACH, libc::EADDRNOTAVAIL];
                        if e.raw_os_error().is_some_and(|c| local.contains(&c)) {
                            let f = &batch.frames[i];
                            let d = &batch.dgrams[f.first];
                            self.refused.push(Unreachable {
                                dest: f.dest,
                                quoted: Quoted::of(&batch.buf[d.start..d.start + d.len]),
                                local: true,
                                port: false,
                            });
                        }
                    }
                    self.stats.send_drops += u64::from(batch.frames[i].count);
                    i += 1;
                }
            }
        }
        end
    }

    fn send_some(
        &mut self,
        batch: &mut TxBatch,
        first: usize,
        n: usize,
        connected: bool,
    ) -> io::Result<usize> {
        if let Some(b) = batch.lone_datagram(first, n) {
            // One datagram in the batch's own buffer (a small message, an ack): `sendto`
            // straight from it, without the vectors and message header built below (no
            // header and vector for the kernel to import either: about 0.2 us of a 5 us
            // one-thread loopback hop, `examples/path_cost`).
            let flags = rustix::net::SendFlags::DONTWAIT;
            if connected {
                rustix::net::send(&self.fd, b, flags)?;
            } else {
                let to = for_socket(batch.frames[first].dest, self.v6);
                rustix::net::sendto(&self.fd, b, flags, &to)?;
            }
            self.stats.send_calls += 1;
            self.stats.datagrams_sent += 1;
            return Ok(1);
        }
        // The call's arguments live in the batch and are written for the `n` entries sent
        // only: zeroing 64 of each on the stack per call was 1.4% of a 64-byte UDP hop.
        // Vectors, names and control buffers first (the vectors may grow), then the
        // headers that point into them.
        let frames = &batch.frames[first..first + n];
        let a = &mut batch.args;
        a.addrs.clear();
        a.ctrl.clear();
        a.hdrs.clear();
        frame_vectors(frames, &batch.dgrams, &batch.buf, &mut a.iovs, &mut a.spans);
        for f in frames {
            if !connected {
                a.addrs.push(SockAddr::for_socket(f.dest, self.v6));
            }
            a.ctrl.push([0; 4]);
        }
        for k in 0..n {
            let f = &batch.frames[first + k];
            // SAFETY: plain old data; every field the kernel reads is set below.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            let h = &mut m.msg_hdr;
            if !connected {
                let (p, l) = a.addrs[k].raw();
                h.msg_name = (p as *const libc::sockaddr).cast_mut().cast();
                h.msg_namelen = l;
            }
            h.msg_iov = a.iovs[a.spans[k].0..].as_mut_ptr();
            h.msg_iovlen = a.spans[k].1;
            if f.count > 1 {
                // SAFETY: the control buffer is large and aligned enough for one cmsg
                // carrying a u16 (CMSG_SPACE(2) = 24 bytes, 32 available).
                unsafe {
                    h.msg_control = a.ctrl[k].as_mut_ptr().cast();
                    h.msg_controllen = libc::CMSG_SPACE(2) as usize;
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), f.seg as u16);
                }
            }
            a.hdrs.push(m);
        }
        let r = if n == 1 {
            // One entry (a bulk fragment or group, its payload in the caller's memory):
            // `sendmsg`, without `sendmmsg`'s batch bookkeeping.
            // SAFETY: as for `sendmmsg` below, for the one header.
            let k = unsafe { libc::sendmsg(self.raw(), &a.hdrs[0].msg_hdr, libc::MSG_DONTWAIT) };
            if k < 0 {
                return Err(io::Error::last_os_error());
            }
            1
        } else {
            // SAFETY: `n` headers whose pointers refer to the batch's argument vectors (not
            // touched until the call returns), through them to `batch.buf` and to payloads
            // valid until the batch is sent (the contract of `TxBatch::push_grouped`).
            cvt(unsafe {
                libc::sendmmsg(
                    self.raw(),
                    a.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            })? as usize
        };
        self.stats.send_calls += 1;
        for f in &batch.frames[first..first + r] {
            self.stats.datagrams_sent += u64::from(f.count);
        }
        Ok(r)
    }

    /// Calls `f` with each datagram entry `k` of the last [`UdpSock::recv_batch`] put in
    /// its own slot (a coalesced read split by its segment size); returns how many. For an
    /// entry without leading vectors that is everything it received.
    pub fn for_each_datagram(&self, k: usize, mut f: impl FnMut(SocketAddr, &[u8])) -> usize {
        let e = self.rx.got[k];
        let data = self.slot(k, e.len);
        let seg = e.seg.unwrap_or(data.len()).max(1);
        let mut n = 0;
        for d in data.chunks(seg) {
            f(e.src, d);
            n += 1;
        }
        n
    }

    /// The first `len` bytes entry `k` of the last [`UdpSock::recv_batch`] put in its own
    /// slot (after its leading vectors).
    pub fn slot(&self, k: usize, len: usize) -> &[u8] {
        self.rx.slot(k, len)
    }

    /// Sets the vectors every later [`UdpSock::recv_batch`] reads entry `k` into first:
    /// `lead[k]` (none for entries beyond `lead`), then the entry's own 64 KiB slot.
    /// `cap`: reads take no more entries than `lead` arms (at least one). The leases must
    /// not overlap; they are written by every read until the next call of this function,
    /// which the transport makes before a transfer they belong to ends (the lease rule,
    /// `crate::lease`).
    pub fn set_lead(&mut self, lead: &[Vec<Dst>], cap: bool) {
        // Every socket but the armed one is told so on every re-plan (several a message).
        let plain = !cap && lead.iter().all(Vec::is_empty);
        if plain && self.plain {
            return;
        }
        self.plain = plain;
        let armed = lead.iter().take_while(|l| !l.is_empty()).count();
        self.cap = if cap { armed.max(1) } else { RX_SLOTS };
        let rx = &mut *self.rx;
        for k in 0..RX_SLOTS {
            let v = &mut rx.iovs[k];
            v.clear();
            if let Some(l) = lead.get(k) {
                v.extend(l.iter().map(|x| libc::iovec {
                    iov_base: x.as_mut_ptr().cast(),
                    iov_len: x.len(),
                }));
            }
            v.push(libc::iovec {
                iov_base: rx.data[k * RX_SLOT..].as_mut_ptr().cast(),
                iov_len: RX_SLOT,
            });
            rx.caps[k] = v.iter().map(|x| x.iov_len).sum();
            let h = &mut rx.hdrs[k].msg_hdr;
            h.msg_name = rx.addrs[k].raw_mut().0.cast();
            h.msg_iov = v.as_mut_ptr();
            h.msg_iovlen = v.len();
            h.msg_control = rx.ctrl[k].as_mut_ptr().cast();
        }
    }

    /// One `recvmmsg` of up to [`RX_SLOTS`] entries into the vectors of
    /// [`UdpSock::set_lead`]. Returns the entries read; see [`UdpSock::received`].
    /// Datagram counters are the caller's to keep.
    pub fn recv_batch(&mut self) -> usize {
        self.recv_batch_upto(RX_SLOTS)
    }

    /// [`UdpSock::recv_batch`] taking at most `max` entries (at least one).
    pub fn recv_batch_upto(&mut self, max: usize) -> usize {
        let rx = &mut *self.rx;
        let width = self.width.min(self.cap).min(max.max(1));
        // Only the entries this call asks for (the kernel touches no other).
        for k in 0..width {
            let h = &mut rx.hdrs[k].msg_hdr;
            h.msg_namelen = rx.addrs[k].raw_mut().1;
            h.msg_controllen = size_of::<[u64; 8]>();
            h.msg_flags = 0;
            rx.hdrs[k].msg_len = 0;
        }
        // A one-vector entry read alone needs no message header: a coalesced read is told
        // and split by the datagrams' own lengths instead of the `UDP_GRO` control message
        // (`coalesced_segment`).
        let plain = width == 1 && rx.hdrs[0].msg_hdr.msg_iovlen == 1;
        // SAFETY: every header points at live buffers of the sizes given: our slots,
        // names and control buffers, and leading vectors valid per `set_lead`'s contract.
        let r = unsafe {
            if plain {
                // `recvfrom`, which skips `recvmsg`'s header and vector import, and once
                // only the peer can be heard the name too (about 0.2 us more of that hop).
                let h = &mut rx.hdrs[0];
                let v = *h.msg_hdr.msg_iov;
                let (name, namelen) = if self.only.is_some() {
                    (std::ptr::null_mut(), std::ptr::null_mut())
                } else {
                    (
                        h.msg_hdr.msg_name.cast(),
                        &mut h.msg_hdr.msg_namelen as *mut _,
                    )
                };
                let flags = libc::MSG_DONTWAIT | libc::MSG_TRUNC;
                let n = libc::recvfrom(
                    self.fd.as_raw_fd(),
                    v.iov_base,
                    v.iov_len,
                    flags,
                    name,
                    namelen,
                );
                if n < 0 {
                    -1
                } else {
                    if n as usize > v.iov_len {
                        h.msg_hdr.msg_flags = libc::MSG_TRUNC;
                    }
                    h.msg_len = n as libc::c_uint;
                    1
                }
            } else if width == 1 {
                // One entry: `recvmsg`, which skips `recvmmsg`'s batch bookkeeping (0.2-0.3
                // us of a 64-byte hop across the veth pair in a C ping-pong).
                let h = &mut rx.hdrs[0];
                let n = libc::recvmsg(self.fd.as_raw_fd(), &mut h.msg_hdr, libc::MSG_DONTWAIT);
                if n < 0 {
                    -1
                } else {
                    h.msg_len = n as libc::c_uint;
                    1
                }
            } else {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    rx.hdrs.as_mut_ptr(),
                    width as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        if r < 0 {
            match io::Error::last_os_error().kind() {
                io::ErrorKind::WouldBlock => {
                    if self.peer.is_some() {
                        // Found empty since the connect: whatever reached the socket
                        // while it was still unconnected (any sender's) has been read
                        // with its name.
                        self.only = self.peer.take();
                    }
                }
                io::ErrorKind::Interrupted => {}
                _ => self.errored = true,
            }
        }
        // One entry while datagrams come one at a time (a ping-pong): a wider call that
        // gets one tries the next entry too (its header and vectors imported, the queue
        // found empty), about 1% of a 64-byte hop. All of them once a call brings more
        // than one, fills a wide call, or two one-entry calls in a row bring one each (a
        // single datagram read is followed by the poll that finds the queue empty).
        // A call the caller limited (`recv_batch_upto`) says nothing about how datagrams
        // come, and leaves the choice as it was.
        let got = r.max(0) as usize;
        if max >= self.width.min(self.cap) {
            let wide = got > 1 || got == width && (width > 1 || self.single);
            self.single = width == 1 && got == 1 && !wide;
            self.width = if wide { RX_SLOTS } else { 1 };
        }
        if r <= 0 {
            return 0;
        }
        self.stats.recv_calls += 1;
        for k in 0..r as usize {
            let h = &rx.hdrs[k];
            let len = (h.msg_len as usize).min(rx.caps[k]);
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                self.stats.truncated += 1;
            }
            let seg = if plain {
                coalesced_segment(rx.slot(k, len))
            } else {
                gro_segment(&h.msg_hdr)
            };
            let seg = seg.filter(|&s| s > 0 && s < len);
            if seg.is_some() {
                self.stats.gro_reads += 1;
            }
            let src = match self.only {
                Some(p) if plain => p,
                _ => rx.addrs[k].get().unwrap_or(self.local),
            };
            rx.got[k] = RxEntry { src, len, seg };
        }
        r as usize
    }

    /// Peeks at the datagram at the head of the receive queue: copies its first bytes
    /// into `buf` (as many as fit) and returns its whole length (with `UDP_GRO`, of the
    /// coalesced run there); `None` when the queue is empty. One `recv(MSG_PEEK |
    /// MSG_TRUNC)`: the datagram stays queued.
    pub fn peek_head(&self, buf: &mut [u8]) -> Option<usize> {
        use rustix::net::RecvFlags;
        let flags = RecvFlags::PEEK | RecvFlags::TRUNC | RecvFlags::DONTWAIT;
        rustix::net::recv(&self.fd, buf, flags)
            .ok()
            .map(|(_, len)| len)
    }

    /// What entry `k` of the last [`UdpSock::recv_batch`] received.
    pub fn received(&self, k: usize) -> RxEntry {
        self.rx.got[k]
    }
}

/// The segment size of a coalesced read, from its `UDP_GRO` control message.
fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    // SAFETY: walking the control messages the kernel wrote into our buffer, within
    // msg_controllen (the CMSG macros bound every step).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

#[cfg(test)]
mod tests;
