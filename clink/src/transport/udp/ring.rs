//! The receive ring: the endpoint's small datagrams read from memory, without a system
//! call per poll, and its lone datagrams sent below the UDP socket layer.
//!
//! A packet socket (`AF_PACKET`, `SOCK_DGRAM`, `ETH_P_IP`) with a `PACKET_RX_RING`
//! (TPACKET_V2) shares a ring of frames with the kernel: the kernel copies each packet
//! its filter accepts into the next free frame and flips the frame's status word; the
//! endpoint polls that word, reads the packet in place and hands the frame back. A
//! busy-polling receiver then finds a datagram by a load from memory instead of a
//! `recvfrom` per poll (the CLAN event queue's idea applied to UDP).
//!
//! Which datagrams: the connection's small ones, those whose UDP length is at most
//! [`RING_MAX_UDP`] and whose kind byte says data, ack, nak, ping or admit. A classic BPF
//! filter on the packet socket takes exactly those (`ring_filter`); the complementary
//! filter on every UDP socket bound to the endpoint's port drops exactly those
//! ([`socket_filter`]), so each datagram is read once, through one of the two. Both
//! filters judge the same fields of the same packet (its UDP length field and its kind
//! byte), also for a GSO or GRO packet, whose UDP length is the whole run's. Bulk
//! fragments, coalesced runs longer than a frame, handshakes and anything else stay on
//! the sockets (the speculative scatter receive needs the socket's vectors).
//!
//! Each frame also says where the packet came from: the interface and the sender's
//! link-layer address. [`RxRing::send`] sends a datagram back that way through the same
//! packet socket, with the IP and UDP headers built here: no UDP or IP output path, no
//! route or neighbour lookup, no qdisc. On the wire it is the same UDP datagram.
//! Not on loopback, where IP input drops injected packets (see [`RxRing::poll`]).
//! Measured together (BENCHMARKS.md), the two halves took the busy 64-byte hop
//! across the veth pair from 1.18-1.23x to 0.99-1.13x kernel UDP (medians of three sets
//! of alternated rounds); the receive half alone made no difference (the sender's system
//! call, which runs the veth pair and the receiver's IP input, is most of a hop).
//!
//! The capture runs before IP input, and the sends skip IP output: the ring's packets are
//! validated here ([`clink_proto::ipv4::parse_udp`]: header checksum, lengths, no
//! fragment), and netfilter rules of the host do not see either (as with any
//! packet-socket or AF_XDP stack). Needs `CAP_NET_RAW`; without it the transport uses
//! its sockets alone.

use crate::sys::packet::PacketRing;
pub use crate::sys::packet::{attach_filter, detach_filter};
use clink_proto::ipv4;
use clink_proto::reliable::packet::coalesced_segment;
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::RawFd;

/// Bytes of one ring frame (the TPACKET_V2 header, then the IP packet).
const FRAME: usize = 2048;
/// Frames in the ring (4 MiB). Bursts of small datagrams mostly leave as GSO runs longer
/// than a frame, which go to the socket; a full ring drops (counted, and repaired by
/// the connection as any loss).
const FRAMES: usize = 2048;
/// Bytes per block of the ring's kernel memory (a multiple of the page and the frame).
const BLOCK: usize = 64 << 10;
/// The longest UDP datagram (header included) the ring takes: what fits a frame after
/// the frame's header (80 bytes for a `SOCK_DGRAM` capture) and the longest IP header.
pub const RING_MAX_UDP: u16 = (FRAME - 80 - 60) as u16;
/// The longest datagram [`RxRing::send`] takes (the transport sends longer ones through
/// its sockets): what the ring takes, so the copy `send` makes stays within a frame's
/// worth.
pub const SEND_MAX: usize = RING_MAX_UDP as usize - ipv4::UDP_HEADER;
/// Datagram kinds the ring takes (`clink_proto::reliable::packet`): data, ack, nak, ping,
/// admit.
const RING_KINDS: [u32; 5] = [1, 2, 3, 4, 8];
/// Offset of the kind byte in a UDP datagram (UDP header, then the common header's byte 5).
const KIND_AT: u32 = 8 + 5;
/// Kind byte of a data datagram.
const KIND_DATA: u32 = 1;
/// Bytes the ring keeps of a coalesced run of data datagrams too long for a frame (from
/// the IP header on): a notice that the sockets hold it (see [`RxRing::take_notice`]).
const NOTICE_SNAP: u32 = 64;

// Classic BPF opcodes (linux/filter.h).
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_H_IND: u16 = 0x48;
const LD_B_IND: u16 = 0x50;
const LDX_B_MSH: u16 = 0xb1;
const JEQ_K: u16 = 0x15;
const JGT_K: u16 = 0x25;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
/// Offset of the network header for the loads of a socket's filter (`SKF_NET_OFF`).
const NET_OFF: u32 = (-0x100000i32) as u32;
/// Ancillary load of the packet type (`SKF_AD_OFF + SKF_AD_PKTTYPE`).
const AD_PKTTYPE: u32 = (-0x1000i32 + 4) as u32;

/// Where a filter jump goes.
#[derive(Clone, Copy)]
enum To {
    Next,
    Take,
    Leave,
    /// The ring keeps the packet's first [`NOTICE_SNAP`] bytes (the socket gets it whole).
    Notice,
    /// Over this many instructions.
    Skip(u8),
}

/// A filter under construction: instructions with symbolic targets, resolved by
/// [`Prog::finish`] against a final "take" and "leave" return.
struct Prog(Vec<(u16, To, To, u32)>);

impl Prog {
    fn op(&mut self, code: u16, k: u32) -> &mut Self {
        self.0.push((code, To::Next, To::Next, k));
        self
    }

    fn jump(&mut self, code: u16, k: u32, yes: To, no: To) -> &mut Self {
        self.0.push((code, yes, no, k));
        self
    }

    /// The program: `take` returns `take_ret`, `leave` returns `leave_ret`, `notice`
    /// [`NOTICE_SNAP`].
    fn finish(&self, take_ret: u32, leave_ret: u32) -> Vec<libc::sock_filter> {
        let n = self.0.len();
        let (take, leave, notice) = (n, n + 1, n + 2);
        let rel = |i: usize, t: To| -> u8 {
            let at = match t {
                To::Next => i + 1,
                To::Take => take,
                To::Leave => leave,
                To::Notice => notice,
                To::Skip(k) => i + 1 + usize::from(k),
            };
            (at - i - 1) as u8
        };
        let mut out: Vec<_> = self
            .0
            .iter()
            .enumerate()
            .map(|(i, &(code, jt, jf, k))| libc::sock_filter {
                code,
                jt: rel(i, jt),
                jf: rel(i, jf),
                k,
            })
            .collect();
        for k in [take_ret, leave_ret, NOTICE_SNAP] {
            out.push(libc::sock_filter {
                code: RET_K,
                jt: 0,
                jf: 0,
                k,
            });
        }
        out
    }

    /// With the kind byte in A: to `hit` for a ring kind, else to the other target.
    fn kinds(&mut self, hit: To, miss: To) -> &mut Self {
        for (j, &kind) in RING_KINDS.iter().enumerate() {
            let last = j + 1 == RING_KINDS.len();
            self.jump(JEQ_K, kind, hit, if last { miss } else { To::Next });
        }
        self
    }
}

/// The packet socket's filter (offsets from the IP header): a packet for this host, UDP,
/// not a fragment, to `port` (and `ip` when the endpoint is bound to one), whose UDP
/// length is at most [`RING_MAX_UDP`] and whose kind is one of the ring's. A datagram
/// too short to hold a kind byte is taken too (the ring counts it as malformed: the UDP
/// socket's filter cannot read its kind and drops it, so it must not be lost unseen).
/// Of a longer one whose kind says data (a coalesced run of an eager message's
/// fragments, which the socket reads), the ring keeps a notice: its first bytes.
fn ring_filter(ip: Option<std::net::Ipv4Addr>, port: u16) -> Vec<libc::sock_filter> {
    let mut p = Prog(Vec::new());
    p.op(LD_W_ABS, AD_PKTTYPE)
        .jump(JEQ_K, libc::PACKET_HOST as u32, To::Next, To::Leave)
        .op(LD_B_ABS, 9)
        .jump(JEQ_K, u32::from(ipv4::PROTO_UDP), To::Next, To::Leave)
        .op(LD_H_ABS, 6)
        .jump(JSET_K, 0x3fff, To::Leave, To::Next);
    if let Some(ip) = ip {
        p.op(LD_W_ABS, 16)
            .jump(JEQ_K, u32::from(ip), To::Next, To::Leave);
    }
    p.op(LDX_B_MSH, 0)
        .op(LD_H_IND, 2)
        .jump(JEQ_K, u32::from(port), To::Next, To::Leave)
        .op(LD_H_IND, 4)
        .jump(JGT_K, u32::from(RING_MAX_UDP), To::Next, To::Skip(2))
        .op(LD_B_IND, KIND_AT)
        .jump(JEQ_K, KIND_DATA, To::Notice, To::Leave)
        .jump(JGE_K, KIND_AT + 1, To::Next, To::Take)
        .op(LD_B_IND, KIND_AT)
        .kinds(To::Take, To::Leave);
    p.finish(u32::from(u16::MAX), 0)
}

/// The UDP sockets' filter (offsets from the UDP header): drops what `ring_filter`
/// takes, keeps everything else (IPv6 datagrams among it: the ring takes IPv4 only; the
/// version nibble is 4 or 6, told apart by its bit 0x20).
pub fn socket_filter() -> Vec<libc::sock_filter> {
    let mut p = Prog(Vec::new());
    p.op(LD_B_ABS, NET_OFF)
        .jump(JSET_K, 0x20, To::Leave, To::Next)
        .op(LD_H_ABS, 4)
        .jump(JGT_K, u32::from(RING_MAX_UDP), To::Leave, To::Next)
        .jump(JGE_K, KIND_AT + 1, To::Next, To::Take)
        .op(LD_B_ABS, KIND_AT)
        .kinds(To::Take, To::Leave);
    // "Take" here means the ring has it: drop (return 0); "leave" keeps it whole.
    p.finish(0, u32::MAX)
}

/// Where a peer's datagrams came from, one hop away: enough to send it a packet through
/// the packet socket ([`RxRing::send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkAddr {
    /// The interface they came in on.
    pub ifindex: i32,
    /// The sender's link-layer address (`halen` bytes of `mac`).
    pub mac: [u8; 8],
    /// Its length.
    pub halen: u8,
    /// Our address they were sent to (the source of our replies).
    pub local: std::net::Ipv4Addr,
}

/// Counters of a receive ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Datagrams read from the ring.
    pub datagrams: u64,
    /// Frames holding no valid UDP packet for the endpoint (refused by the IP/UDP
    /// parser, or cut short), dropped.
    pub malformed: u64,
    /// Packets the kernel dropped because the ring was full (`PACKET_STATISTICS`).
    pub full_drops: u64,
    /// Datagrams sent through the packet socket ([`RxRing::send`]).
    pub sent: u64,
    /// Notices of coalesced data runs too long for a frame ([`RxRing::take_notice`]).
    pub notices: u64,
}

/// A packet socket's receive ring (see the module doc). `Send`, not `Sync` (one endpoint
/// reads it).
pub struct RxRing {
    ring: PacketRing,
    head: usize,
    port: u16,
    stats: RingStats,
    /// The kernel's full-ring drops so far (its counter resets when read).
    full_drops: std::cell::Cell<u64>,
    /// The packet [`RxRing::send`] builds, reused.
    tx: Vec<u8>,
    /// A notice came since [`RxRing::take_notice`] last looked.
    notice: bool,
}

impl RxRing {
    /// Opens a ring taking the endpoint's small datagrams: those sent to `local`'s port
    /// (and to its address, unless it is unspecified). Fails without `CAP_NET_RAW`.
    pub fn open(local: SocketAddrV4) -> io::Result<RxRing> {
        // The filter first: nothing else is queued while the ring is set up.
        let ip = Some(*local.ip()).filter(|ip| !ip.is_unspecified());
        let ring = PacketRing::open(&ring_filter(ip, local.port()), FRAME, FRAMES, BLOCK)?;
        Ok(RxRing {
            ring,
            head: 0,
            port: local.port(),
            stats: RingStats::default(),
            full_drops: std::cell::Cell::new(0),
            tx: Vec::with_capacity(ipv4::IP_HEADER + ipv4::UDP_HEADER + SEND_MAX),
            notice: false,
        })
    }

    /// The descriptor (readable while a frame waits), for epoll.
    pub fn raw(&self) -> RawFd {
        self.ring.raw()
    }

    /// Hands every datagram of up to `max` waiting frames to `f` (source, link,
    /// datagram), in arrival order, and gives the frames back. A frame holding a coalesced
    /// run is split by the datagrams' own lengths; with each, the link address it came
    /// from (`None` from a loopback interface: a packet sent back there through the
    /// packet socket carries no route, and IP input drops it as a martian). Returns the
    /// datagrams handed over.
    pub fn poll(
        &mut self,
        max: usize,
        mut f: impl FnMut(SocketAddrV4, Option<LinkAddr>, &[u8]),
    ) -> usize {
        let mut n = 0;
        for _ in 0..max {
            let head = self.head;
            let Some(frame) = self.ring.frame(head) else {
                break;
            };
            n += Self::frame(self.port, &mut self.stats, &mut self.notice, frame, &mut f);
            self.ring.give_back(head);
            self.head = (head + 1) % FRAMES;
        }
        self.stats.datagrams += n as u64;
        n
    }

    /// The datagrams of one frame, to `f`.
    fn frame(
        port: u16,
        stats: &mut RingStats,
        notice: &mut bool,
        frame: &[u8],
        f: &mut impl FnMut(SocketAddrV4, Option<LinkAddr>, &[u8]),
    ) -> usize {
        // tpacket2_hdr: tp_len at 4, tp_snaplen at 8, tp_net at 14.
        let word = |at: usize| {
            u32::from_ne_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]])
        };
        let (len, snap) = (word(4) as usize, word(8) as usize);
        if snap < len && snap == NOTICE_SNAP as usize {
            // Only the filter cuts a packet this short: a run the sockets hold.
            *notice = true;
            stats.notices += 1;
            return 0;
        }
        let net = usize::from(u16::from_ne_bytes([frame[14], frame[15]]));
        let pkt = frame.get(net..net.saturating_add(snap));
        let udp = match pkt.filter(|_| snap == len).map(ipv4::parse_udp) {
            Some(Ok(u)) if u.dst.port() == port => u,
            _ => {
                stats.malformed += 1;
                return 0;
            }
        };
        // The frame's sockaddr_ll (after the 32-byte header): the interface it came in
        // on and the sender's link-layer address, where a reply can be sent straight.
        // Not on loopback: a packet injected there carries no route, and IP input drops
        // its 127/8 addresses as martians (only a receiver's own ring would see it).
        let hatype = u16::from_ne_bytes([frame[40], frame[41]]);
        let mut mac = [0u8; 8];
        mac.copy_from_slice(&frame[44..52]);
        let link = (hatype != libc::ARPHRD_LOOPBACK).then(|| LinkAddr {
            ifindex: i32::from_ne_bytes([frame[36], frame[37], frame[38], frame[39]]),
            halen: frame[43].min(8),
            mac,
            local: *udp.dst.ip(),
        });
        let d = udp.payload;
        match coalesced_segment(d) {
            Some(seg) => {
                d.chunks(seg).for_each(|c| f(udp.src, link, c));
                d.len().div_ceil(seg)
            }
            None => {
                f(udp.src, link, d);
                1
            }
        }
    }

    /// Sends one datagram to `dest`, one hop away at `link`, through the packet socket:
    /// the IPv4 and UDP headers built here (don't-fragment, TTL 64, UDP checksum 0: none,
    /// which IPv4 allows; every clink datagram carries its own checksum), no qdisc
    /// (`PACKET_QDISC_BYPASS`), no route or neighbour lookup. The packet is an ordinary
    /// UDP datagram from our port: a receiver without a ring reads it from its socket.
    /// `d` is at most [`SEND_MAX`] bytes.
    pub fn send(&mut self, link: &LinkAddr, dest: SocketAddrV4, d: &[u8]) -> io::Result<()> {
        // One contiguous packet for `sendto`, which skips `sendmsg`'s header and vector
        // import: the headers, then a copy of the datagram.
        debug_assert!(d.len() <= SEND_MAX);
        let mut hdr = [0u8; ipv4::IP_HEADER + ipv4::UDP_HEADER];
        let src = SocketAddrV4::new(link.local, self.port);
        ipv4::encode_headers(src, dest, d.len(), &mut hdr)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.tx.clear();
        self.tx.extend_from_slice(&hdr);
        self.tx.extend_from_slice(d);
        self.ring
            .send(link.ifindex, link.halen, link.mac, &self.tx)?;
        self.stats.sent += 1;
        Ok(())
    }

    /// Whether a notice came since the last call: a run of data datagrams too long for a
    /// frame (an eager message's fragments coalesced by GSO/GRO) waits in a socket. The
    /// sockets are otherwise read on one idle pass in [`super::RING_SOCK_EVERY`]; told,
    /// the receiver reads them at once.
    pub fn take_notice(&mut self) -> bool {
        std::mem::take(&mut self.notice)
    }

    /// Counters, with the kernel's ring-full drops collected since the last call.
    pub fn stats(&self) -> RingStats {
        self.full_drops
            .set(self.full_drops.get() + self.ring.take_drops());
        RingStats {
            full_drops: self.full_drops.get(),
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions the filters use, to check them
    /// against packets without a kernel. Loads are relative to `base` (the packet
    /// socket's filter sees the IP header first, a UDP socket's the UDP header), those
    /// past [`NET_OFF`] to the IP header at 0.
    fn run(prog: &[libc::sock_filter], pkt: &[u8], base: usize, pkttype: u32) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let load = |at: usize, n: usize| -> Option<u32> {
            pkt.get(at..at + n)
                .map(|b| b.iter().fold(0u32, |v, &c| (v << 8) | u32::from(c)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            let k = if i.k >= NET_OFF {
                (i.k - NET_OFF) as usize
            } else {
                base + i.k as usize
            };
            let x_k = base + x as usize + i.k as usize;
            let loaded = match i.code {
                LD_W_ABS if i.k == AD_PKTTYPE => Some(pkttype),
                LD_W_ABS => load(k, 4),
                LD_H_ABS => load(k, 2),
                LD_B_ABS => load(k, 1),
                LD_H_IND => load(x_k, 2),
                LD_B_IND => load(x_k, 1),
                LDX_B_MSH => match load(k, 1) {
                    Some(v) => {
                        x = (v & 0xf) * 4;
                        continue;
                    }
                    None => return 0,
                },
                RET_K => return i.k,
                JEQ_K | JGT_K | JGE_K | JSET_K => {
                    let yes = match i.code {
                        JEQ_K => a == i.k,
                        JGT_K => a > i.k,
                        JGE_K => a >= i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if yes { i.jt } else { i.jf });
                    continue;
                }
                c => panic!("opcode {c:#x} not interpreted"),
            };
            // An out-of-range load ends the program with 0, as in the kernel.
            match loaded {
                Some(v) => a = v,
                None => return 0,
            }
        }
    }

    #[test]
    fn every_datagram_goes_to_exactly_one_of_ring_and_socket() {
        use std::net::Ipv4Addr;
        let me = SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 2), 7000);
        let other = SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 4000);
        let ring = ring_filter(None, me.port());
        let ring_ip = ring_filter(Some(*me.ip()), me.port());
        let sock = socket_filter();
        let max = SEND_MAX;
        for kind in 0..=255u8 {
            for len in [0, 5, 6, 40, 164, max, max + 1, 9000] {
                let mut payload = vec![0u8; len];
                if len > 5 {
                    payload[5] = kind;
                }
                let mut pkt = Vec::new();
                ipv4::encode_udp(other, me, &payload, &mut pkt);
                let ret = run(&ring, &pkt, 0, 0);
                assert_eq!(ret, run(&ring_ip, &pkt, 0, 0));
                // A notice keeps a packet's head only: the socket still has to take it.
                let notice = ret == NOTICE_SNAP;
                let to_ring = ret != 0 && !notice;
                let to_sock = run(&sock, &pkt, 20, 0) != 0;
                assert_ne!(to_ring, to_sock, "kind {kind}, {len} bytes");
                let small_kind = len > 5 && RING_KINDS.contains(&u32::from(kind));
                assert_eq!(to_ring, len <= max && (len <= 5 || small_kind));
                assert_eq!(notice, len > max && u32::from(kind) == KIND_DATA);
                if notice {
                    // Cut short, which is how the ring tells a notice from a datagram.
                    assert!((NOTICE_SNAP as usize) < pkt.len());
                }
                // Not for this host, another port, another address: never the ring's.
                assert_eq!(run(&ring, &pkt, 0, 3), 0);
                for (filter, to) in [
                    (&ring, SocketAddrV4::new(*me.ip(), 7001)),
                    (&ring_ip, SocketAddrV4::new(*other.ip(), 7000)),
                ] {
                    let mut wrong = Vec::new();
                    ipv4::encode_udp(other, to, &payload, &mut wrong);
                    assert_eq!(run(filter, &wrong, 0, 0), 0, "to {to}");
                }
                // An IPv6 datagram (the ring takes IPv4 only): always the socket's.
                let mut six = vec![0u8; 48];
                six[0] = 0x60;
                six[6] = ipv4::PROTO_UDP;
                six[44..46].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
                six.extend_from_slice(&payload);
                assert_ne!(run(&sock, &six, 40, 0), 0, "IPv6, kind {kind}, {len} bytes");
            }
        }
    }

    /// Bulk fragments stay on the sockets (the speculative scatter receive needs them),
    /// whatever their packet numbers and flags: their kind byte sits where every other
    /// datagram's does.
    #[test]
    fn bulk_fragments_of_any_packet_number_go_to_the_socket() {
        use clink_proto::reliable::{BulkHeader, Datagram};
        use std::net::Ipv4Addr;
        let me = SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 2), 7000);
        let other = SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 4000);
        let ring = ring_filter(None, me.port());
        let sock = socket_filter();
        for pn in (0..4096u64).chain([1 << 20, (1 << 32) - 1, 5 << 40]) {
            for (len, hashed) in [(1, false), (200, true), (1448, false)] {
                let hdr = BulkHeader {
                    pn,
                    floor: pn / 2,
                    xfer: pn as u32,
                    offset: (pn % (1 << 20)) * 1448,
                    hashed,
                };
                let payload = vec![pn as u8; len];
                let mut d = Vec::new();
                Datagram::Bulk {
                    conn: 7,
                    hdr,
                    payload: &payload,
                }
                .encode(&mut d);
                let mut pkt = Vec::new();
                ipv4::encode_udp(other, me, &d, &mut pkt);
                assert_eq!(run(&ring, &pkt, 0, 0), 0, "pn {pn}, {len} bytes");
                assert_ne!(run(&sock, &pkt, 20, 0), 0, "pn {pn}, {len} bytes");
            }
        }
    }
}
