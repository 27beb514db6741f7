//! The sockets layer's protocol: how two processes on one host that both run under
//! `libclink_preload.so` pair the two ends of a kernel TCP connection and move its data
//! onto a shared-memory ring, without ever putting a byte into a stream whose peer is not
//! proven to be accelerated.
//!
//! - [`rendezvous_name`]: the abstract Unix socket a connecting end binds *before* its
//!   TCP SYN leaves, named after the server address it connects to and its own port, so an
//!   accepting end finds it at once or knows the client is plain (no wait);
//! - [`Hello`] / [`Ack`]: the two pairing messages on that Unix socket (each carries the
//!   sender's TCP socket as SCM_RIGHTS, the proof of ownership checked against the mirror
//!   4-tuple);
//! - [`Layout`] and [`ring_readable`] / [`ring_writable`]: the shared mapping (one header
//!   page, one ring per direction) and the index arithmetic that rejects a corrupt peer;
//! - [`kernel_share`]: the byte-offset switch: of what a kernel read returned, how much is
//!   stream data and how much is wake-up bytes sent after the writer moved to the ring.

use crate::error::ProtoError;
use crate::le::{put_u32, u16_at, u32_at};
use std::net::{IpAddr, SocketAddr};

/// Version of the pairing messages and of the shared mapping's layout.
pub const VERSION: u16 = 2;
/// Magic of a [`Hello`].
pub const HELLO_MAGIC: u32 = 0x434b_5348; // "CKSH"
/// Magic of an [`Ack`].
pub const ACK_MAGIC: u32 = 0x434b_5341; // "CKSA"
/// Encoded size of a [`Hello`] and of an [`Ack`].
pub const MSG_LEN: usize = 12;
/// Smallest ring a peer may propose (bytes).
pub const MIN_RING: u32 = 4096;
/// Largest ring a peer may propose (bytes): bounds what a peer can make us map.
pub const MAX_RING: u32 = 64 << 20;
/// Value of a direction's switch offset before its writer moved to the ring.
pub const NOT_SWITCHED: u64 = u64::MAX;

/// An address as the other end of a loopback connection sees it: IPv4-mapped IPv6
/// addresses become IPv4, so an IPv4 client and a dual-stack server name the same thing.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => SocketAddr::new(IpAddr::V6(*v6.ip()), v6.port()),
        },
        v4 => v4,
    }
}

/// The abstract Unix socket name (without its leading NUL) that a connecting end with
/// local port `client_port` binds before connecting to `server`. Abstract names are
/// scoped by network namespace, so only processes that share the kernel's view of the
/// connection can meet there.
pub fn rendezvous_name(server: SocketAddr, client_port: u16) -> String {
    format!(
        "clink-sockets/{VERSION}/{}/{client_port}",
        canonical(server)
    )
}

/// Whether two ends' addresses are mirror images (`a`'s local is `b`'s peer and the other
/// way round): the only pairing accepted, so NAT and proxies never match.
pub fn is_mirror(
    a_local: SocketAddr,
    a_peer: SocketAddr,
    b_local: SocketAddr,
    b_peer: SocketAddr,
) -> bool {
    canonical(a_local) == canonical(b_peer) && canonical(a_peer) == canonical(b_local)
}

/// The accepting end's offer: "here is the mapping (a memfd) and my TCP socket".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Bytes in each direction's ring (a power of two).
    pub ring: u32,
}

impl Hello {
    /// Encodes the message.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        put_u32(&mut b, 0, HELLO_MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        put_u32(&mut b, 8, self.ring);
        b
    }

    /// Decodes and checks a message a peer sent.
    pub fn decode(b: &[u8]) -> Result<Hello, ProtoError> {
        check_header(b, HELLO_MAGIC, "hello")?;
        let ring = u32_at(b, 8);
        if !(MIN_RING..=MAX_RING).contains(&ring) || !ring.is_power_of_two() {
            return Err(ProtoError::OutOfRange {
                what: "ring size",
                value: ring as u64,
                limit: MAX_RING as u64,
            });
        }
        Ok(Hello { ring })
    }
}

/// The connecting end's answer: "I mapped it; here is my TCP socket".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack;

impl Ack {
    /// Encodes the message.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        put_u32(&mut b, 0, ACK_MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b
    }

    /// Decodes and checks a message a peer sent.
    pub fn decode(b: &[u8]) -> Result<Ack, ProtoError> {
        check_header(b, ACK_MAGIC, "ack")?;
        Ok(Ack)
    }
}

fn check_header(b: &[u8], magic: u32, what: &'static str) -> Result<(), ProtoError> {
    if b.len() < MSG_LEN {
        return Err(ProtoError::Truncated {
            what,
            need: MSG_LEN,
            have: b.len(),
        });
    }
    let m = u32_at(b, 0);
    if m != magic {
        return Err(ProtoError::BadMagic(m));
    }
    let v = u16_at(b, 4);
    if v != VERSION {
        return Err(ProtoError::BadVersion {
            got: v,
            want: VERSION,
        });
    }
    Ok(())
}

/// Where things are in the shared mapping of one connection: a header page, then the
/// ring of direction 0 (accepting end to connecting end), then that of direction 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes in each ring.
    pub ring: u32,
}

impl Layout {
    /// Bytes of the header page.
    pub const HEADER: usize = 4096;
    /// Bytes of one direction's control block within the header (a few cache lines).
    pub const DIR_BLOCK: usize = 512;
    /// Offset of the magic word (u32) within the header.
    pub const MAGIC_OFF: usize = 0;
    /// Offset of the ring size (u32) within the header.
    pub const RING_OFF: usize = 4;
    /// Offset, within a direction's block, of the writer's position (u64, own line).
    pub const TAIL: usize = 0;
    /// Offset of the reader's position (u64, own line).
    pub const HEAD: usize = 128;
    /// Offset of the switch offset (u64): kernel bytes written before the ring.
    pub const SWITCH_AT: usize = 256;
    /// Offset of the "reader is asleep in the kernel" flag (u32).
    pub const READER_SLEEPING: usize = 320;
    /// Offset of the "writer is asleep in the kernel" flag (u32).
    pub const WRITER_SLEEPING: usize = 324;
    /// Offset of the ring position (u64) at which the writer went back to the kernel
    /// (`NOT_SWITCHED` while it has not).
    pub const UNSWITCH_AT: usize = 264;
    /// Offset of the kernel stream position (u64) from which the kernel carries data
    /// again after the writer went back: its switch offset plus every wake-up byte it sent.
    pub const RESUME_AT: usize = 272;
    /// Offset of the "reader is leaving" flag (u32): the reader's descriptor escapes to a
    /// program that reads the kernel socket itself; the writer resends what the ring holds
    /// unread by the kernel and stays there, and sends no more wake-up bytes.
    pub const LEAVING: usize = 328;
    /// Offset of the count (u32) of wake-up bytes being sent on this direction's kernel
    /// stream right now (a line of its own: the writer changes it on every wake-up, and
    /// the reader's sleep flag must not share a line with it).
    pub const BELLS_IN_FLIGHT: usize = 384;
    /// Offset of the count (u64) of wake-up bytes sent on this direction's kernel stream.
    pub const BELLS_SENT: usize = 392;
    /// Offset of the reader's wake socket's number (u64, 0: none): a reader asleep in
    /// the library's own wait, with [`READER_ON_WAKE_SOCKET`] in its sleep flag, also
    /// listens on the abstract Unix datagram socket [`wake_name`] of this number, so
    /// one datagram wakes it instead of a byte through the kernel's TCP stack.
    pub const WAKE_SOCKET: usize = 400;

    /// Bytes of the whole mapping.
    pub fn total(&self) -> usize {
        Self::HEADER + 2 * self.ring as usize
    }

    /// Offset of direction `dir`'s control block.
    pub fn dir_block(dir: usize) -> usize {
        256 + dir * Self::DIR_BLOCK
    }

    /// Offset of direction `dir`'s ring.
    pub fn ring_at(&self, dir: usize) -> usize {
        Self::HEADER + dir * self.ring as usize
    }
}

/// The reader's sleep flag ([`Layout::READER_SLEEPING`]) of a reader that also listens
/// on its wake socket ([`Layout::WAKE_SOCKET`]); 1 means it waits on the kernel socket
/// only (in the application's poll or epoll), where only a wake-up byte reaches it.
pub const READER_ON_WAKE_SOCKET: u32 = 2;

/// The abstract Unix socket name of wake socket `number` ([`Layout::WAKE_SOCKET`]).
pub fn wake_name(number: u64) -> String {
    format!("clink-sockets/{VERSION}/wake/{number:016x}")
}

/// Bytes a reader may take from a ring of `cap` bytes whose writer is at `tail` and
/// reader at `head`; an error when the positions a peer wrote cannot be right.
pub fn ring_readable(head: u64, tail: u64, cap: u32) -> Result<u64, ProtoError> {
    let n = tail.wrapping_sub(head);
    if n > cap as u64 {
        return Err(ProtoError::OutOfRange {
            what: "ring fill",
            value: n,
            limit: cap as u64,
        });
    }
    Ok(n)
}

/// Bytes a writer may put into the ring (see [`ring_readable`]).
pub fn ring_writable(head: u64, tail: u64, cap: u32) -> Result<u64, ProtoError> {
    Ok(cap as u64 - ring_readable(head, tail, cap)?)
}

/// Of `got` bytes a kernel read just returned to a reader that had consumed `consumed`
/// kernel bytes of this direction, how many are stream data. After the writer's switch at
/// `switch_at` everything the kernel carries is a wake-up byte; `NOT_SWITCHED` means all
/// of it is data. A switch offset behind what was already consumed means a broken peer.
pub fn kernel_share(consumed: u64, switch_at: u64, got: u64) -> Result<u64, ProtoError> {
    if switch_at == NOT_SWITCHED {
        return Ok(got);
    }
    if switch_at < consumed {
        return Err(ProtoError::OutOfRange {
            what: "switch offset",
            value: switch_at,
            limit: consumed,
        });
    }
    Ok(got.min(switch_at - consumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let h = Hello { ring: 1 << 20 };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        assert_eq!(Ack::decode(&Ack.encode()), Ok(Ack));
        assert!(Hello::decode(&Ack.encode()).is_err());
        assert!(Ack::decode(&h.encode()).is_err());
        assert!(Hello::decode(&h.encode()[..5]).is_err());
        let mut odd = h.encode();
        put_u32(&mut odd, 8, 3 << 12);
        assert!(Hello::decode(&odd).is_err(), "not a power of two");
        put_u32(&mut odd, 8, 1 << 30);
        assert!(Hello::decode(&odd).is_err(), "too large");
        let mut v = h.encode();
        v[4..6].copy_from_slice(&9u16.to_le_bytes());
        assert_eq!(
            Hello::decode(&v),
            Err(ProtoError::BadVersion {
                got: 9,
                want: VERSION
            })
        );
    }

    #[test]
    fn names_and_mirrors_see_through_mapped_addresses() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:8080".parse().unwrap();
        assert_eq!(rendezvous_name(v4, 40000), rendezvous_name(mapped, 40000));
        assert_eq!(
            rendezvous_name(v4, 40000),
            "clink-sockets/2/127.0.0.1:8080/40000"
        );
        let c: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        assert!(is_mirror(c, mapped, v4, c));
        assert!(!is_mirror(c, v4, c, v4));
    }

    #[test]
    fn ring_arithmetic_rejects_impossible_positions() {
        assert_eq!(ring_readable(10, 20, 4096), Ok(10));
        assert_eq!(ring_writable(10, 20, 4096), Ok(4086));
        assert_eq!(
            ring_readable(u64::MAX - 1, 3, 4096),
            Ok(5),
            "positions wrap"
        );
        assert!(ring_readable(0, 4097, 4096).is_err());
        assert!(ring_readable(5, 4, 4096).is_err(), "reader ahead of writer");
    }

    #[test]
    fn the_switch_splits_data_from_wake_ups() {
        assert_eq!(kernel_share(0, NOT_SWITCHED, 100), Ok(100));
        assert_eq!(kernel_share(90, 100, 50), Ok(10));
        assert_eq!(kernel_share(100, 100, 3), Ok(0));
        assert!(kernel_share(101, 100, 1).is_err());
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// What a peer sends on the pairing socket, and the positions it writes into the
        /// mapping, are checked by total functions: any input gives a value or an error.
        #[test]
        fn peer_input_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40),
                                   head in any::<u64>(), tail in any::<u64>(), cap in any::<u32>(),
                                   consumed in any::<u64>(), switch in any::<u64>(), got in any::<u64>()) {
            if let Ok(h) = Hello::decode(&b) {
                prop_assert!(h.ring.is_power_of_two() && (MIN_RING..=MAX_RING).contains(&h.ring));
                prop_assert_eq!(Hello::decode(&h.encode()), Ok(h));
            }
            let _ = Ack::decode(&b);
            if let Ok(n) = ring_readable(head, tail, cap) {
                prop_assert!(n <= cap as u64);
                prop_assert_eq!(ring_writable(head, tail, cap), Ok(cap as u64 - n));
            }
            if let Ok(d) = kernel_share(consumed, switch, got) {
                prop_assert!(d <= got);
            }
        }
    }
}
