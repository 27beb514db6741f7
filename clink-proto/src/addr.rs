//! Endpoint address strings.
//!
//! An address is printable text that one process hands to another (a file, an argument, a
//! message) and that `connect` parses:
//!
//! ```text
//! clink:host=<16 hex>;id=<32 hex>;shm=<socket name>;udp=<IP>:<port>[,...];tcp=<IP>:<port>[,...]
//! ```
//!
//! `host` names the machine and network namespace (shared memory is only possible when it
//! matches), `id` is the endpoint's random identity, and each further `key=value` names a
//! transport the endpoint offers and how to reach it (an IPv6 address in brackets,
//! `[fd00::1]:5000`). A network transport lists every
//! address it can be reached at (a host with a management and a data network has two),
//! preferred first, at most [`MAX_NET_ADDRS`]; the connecting side picks the one it can
//! reach. Unknown transport keys are skipped so that newer endpoints can offer more;
//! malformed text is an error.

use crate::ProtoError;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};

/// Prefix of every address.
pub const PREFIX: &str = "clink:";

/// Most addresses one network transport may list (a peer's text is bounded).
pub const MAX_NET_ADDRS: usize = 8;

/// A parsed endpoint address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// Host key: machine and network namespace.
    pub host: u64,
    /// Random endpoint identity.
    pub id: u128,
    /// Abstract Unix socket name of the shared-memory transport, if offered.
    pub shm: Option<String>,
    /// UDP socket addresses of the network transport, preferred first; empty if not
    /// offered.
    pub udp: Vec<SocketAddr>,
    /// TCP listening addresses of the stream transport, preferred first; empty if not
    /// offered.
    pub tcp: Vec<SocketAddr>,
}

fn bad(addr: &str, why: &'static str) -> ProtoError {
    ProtoError::BadAddress {
        addr: addr.chars().take(200).collect(),
        why,
    }
}

impl Address {
    /// Parses an address string.
    pub fn parse(s: &str) -> Result<Address, ProtoError> {
        let rest = s
            .trim()
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad(s, "does not start with \"clink:\""))?;
        let (mut host, mut id, mut shm, mut udp, mut tcp) = (None, None, None, None, None);
        for item in rest.split(';') {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| bad(s, "item without '='"))?;
            if v.is_empty() {
                return Err(bad(s, "empty value"));
            }
            match k {
                "host" => {
                    if host.is_some() {
                        return Err(bad(s, "duplicate host"));
                    }
                    if v.len() != 16 {
                        return Err(bad(s, "host must be 16 hex digits"));
                    }
                    host = Some(u64::from_str_radix(v, 16).map_err(|_| bad(s, "host is not hex"))?);
                }
                "id" => {
                    if id.is_some() {
                        return Err(bad(s, "duplicate id"));
                    }
                    if v.len() != 32 {
                        return Err(bad(s, "id must be 32 hex digits"));
                    }
                    id = Some(u128::from_str_radix(v, 16).map_err(|_| bad(s, "id is not hex"))?);
                }
                "shm" => {
                    if shm.is_some() {
                        return Err(bad(s, "duplicate shm"));
                    }
                    if v.len() > 100
                        || !v
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                    {
                        return Err(bad(
                            s,
                            "shm socket name must be at most 100 characters [A-Za-z0-9.-]",
                        ));
                    }
                    shm = Some(v.to_string());
                }
                "udp" | "tcp" => {
                    let list = if k == "udp" { &mut udp } else { &mut tcp };
                    if list.is_some() {
                        return Err(bad(s, "duplicate network transport"));
                    }
                    *list = Some(parse_net(s, v)?);
                }
                k if k.is_empty() || !k.bytes().all(|b| b.is_ascii_lowercase()) => {
                    return Err(bad(s, "malformed key"));
                }
                _ => {} // a transport this build does not know
            }
        }
        Ok(Address {
            host: host.ok_or_else(|| bad(s, "missing host"))?,
            id: id.ok_or_else(|| bad(s, "missing id"))?,
            shm,
            udp: udp.unwrap_or_default(),
            tcp: tcp.unwrap_or_default(),
        })
    }
}

/// Whether `a` can be a peer's address: a unicast IP, a non-zero port, and for IPv6 no
/// scope or flow label (the text form would not carry them back).
fn valid_net(a: &SocketAddr) -> bool {
    let ip_ok = match a {
        SocketAddr::V4(v) => {
            !(v.ip().is_unspecified() || v.ip().is_multicast() || v.ip().is_broadcast())
        }
        SocketAddr::V6(v) => {
            !(v.ip().is_unspecified() || v.ip().is_multicast())
                && v.scope_id() == 0
                && v.flowinfo() == 0
                && v.ip().to_ipv4_mapped().is_none()
        }
    };
    ip_ok && a.port() != 0
}

/// A network transport's addresses: `<IP>:<port>` items (IPv6 in brackets),
/// comma-separated, each valid ([`valid_net`]), at most [`MAX_NET_ADDRS`], none
/// repeated.
fn parse_net(s: &str, v: &str) -> Result<Vec<SocketAddr>, ProtoError> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for item in v.split(',') {
        let a: SocketAddr = item
            .parse()
            .map_err(|_| bad(s, "a network address must be <IP address>:<port>"))?;
        if !valid_net(&a) {
            return Err(bad(
                s,
                "a network address needs a unicast address and a non-zero port",
            ));
        }
        if out.contains(&a) {
            return Err(bad(s, "a network address is listed twice"));
        }
        if out.len() == MAX_NET_ADDRS {
            return Err(bad(s, "more network addresses than a transport may list"));
        }
        out.push(a);
    }
    Ok(out)
}

fn write_net(f: &mut std::fmt::Formatter<'_>, key: &str, v: &[SocketAddr]) -> std::fmt::Result {
    for (n, a) in v.iter().enumerate() {
        if n == 0 {
            write!(f, ";{key}=")?;
        } else {
            f.write_str(",")?;
        }
        write!(f, "{a}")?;
    }
    Ok(())
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}host={:016x};id={:032x}", self.host, self.id)?;
        if let Some(s) = &self.shm {
            write!(f, ";shm={s}")?;
        }
        write_net(f, "udp", &self.udp)?;
        write_net(f, "tcp", &self.tcp)
    }
}

/// Length of [`Address::to_bytes`]: a version byte, the host key, the identity, a byte
/// of flags and two socket addresses of 18 bytes each (an IPv6 address, or an IPv4 one
/// mapped into IPv6, then the port).
pub const BINARY_LEN: usize = 1 + 8 + 16 + 1 + NET_LEN + NET_LEN;
/// Bytes of one socket address in the binary form.
const NET_LEN: usize = 16 + 2;
/// Where the binary form's UDP and TCP socket addresses start.
const UDP_AT: usize = 26;
const TCP_AT: usize = UDP_AT + NET_LEN;
const BINARY_VERSION: u8 = 2;
const HAS_SHM: u8 = 1;
const HAS_UDP: u8 = 2;
const HAS_TCP: u8 = 4;

impl Address {
    /// The shared-memory socket name an endpoint with identity `id` listens on.
    pub fn shm_name(id: u128) -> String {
        format!("clink-{id:032x}")
    }

    /// The address in [`BINARY_LEN`] bytes, for interfaces that carry addresses as short
    /// opaque blobs (libfabric's names are at most 64 bytes; the text form is longer).
    /// It carries one address per network transport: its first IPv4 address, which
    /// sockets of either family reach, else its first IPv6 one. `None` when the
    /// shared-memory name is not the one [`Address::shm_name`] derives from the identity.
    pub fn to_bytes(&self) -> Option<[u8; BINARY_LEN]> {
        let mut b = [0u8; BINARY_LEN];
        b[0] = BINARY_VERSION;
        b[1..9].copy_from_slice(&self.host.to_le_bytes());
        b[9..25].copy_from_slice(&self.id.to_le_bytes());
        let mut flags = 0;
        if let Some(s) = &self.shm {
            if *s != Address::shm_name(self.id) {
                return None;
            }
            flags |= HAS_SHM;
        }
        for (bit, at, list) in [(HAS_UDP, UDP_AT, &self.udp), (HAS_TCP, TCP_AT, &self.tcp)] {
            let first = (list.iter().find(|a| a.is_ipv4())).or(list.first());
            if let Some(a) = first {
                flags |= bit;
                let ip = match a {
                    SocketAddr::V4(v) => v.ip().to_ipv6_mapped(),
                    SocketAddr::V6(v) => *v.ip(),
                };
                b[at..at + 16].copy_from_slice(&ip.octets());
                b[at + 16..at + NET_LEN].copy_from_slice(&a.port().to_le_bytes());
            }
        }
        b[25] = flags;
        Some(b)
    }

    /// Parses [`Address::to_bytes`]'s form, checking it as [`Address::parse`] checks text.
    pub fn from_bytes(b: &[u8]) -> Result<Address, ProtoError> {
        let bad = |why| ProtoError::BadAddress {
            addr: format!("{} binary bytes", b.len()),
            why,
        };
        if b.len() != BINARY_LEN {
            return Err(bad("binary address of the wrong length"));
        }
        if b[0] != BINARY_VERSION {
            return Err(bad("binary address of an unknown version"));
        }
        let flags = b[25];
        if flags & !(HAS_SHM | HAS_UDP | HAS_TCP) != 0 {
            return Err(bad("binary address with unknown flags"));
        }
        let host = u64::from_le_bytes(b[1..9].try_into().expect("8 bytes"));
        let id = u128::from_le_bytes(b[9..25].try_into().expect("16 bytes"));
        let sock = |bit: u8, at: usize| -> Result<Vec<SocketAddr>, ProtoError> {
            if flags & bit == 0 {
                if b[at..at + NET_LEN].iter().any(|&x| x != 0) {
                    return Err(bad("binary address with bytes in an absent field"));
                }
                return Ok(Vec::new());
            }
            let octets: [u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
            let ip = std::net::Ipv6Addr::from(octets);
            let port = u16::from_le_bytes([b[at + 16], b[at + 17]]);
            let a = match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)),
            };
            if !valid_net(&a) {
                return Err(bad(
                    "binary address needs a unicast address and a non-zero port",
                ));
            }
            Ok(vec![a])
        };
        Ok(Address {
            host,
            id,
            shm: (flags & HAS_SHM != 0).then(|| Address::shm_name(id)),
            udp: sock(HAS_UDP, UDP_AT)?,
            tcp: sock(HAS_TCP, TCP_AT)?,
        })
    }
}

impl std::str::FromStr for Address {
    type Err = ProtoError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Address::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn binary_round_trip_and_errors() {
        let a = Address {
            host: 0x0123_4567_89ab_cdef,
            id: 0xfeed_f00d << 64 | 42,
            shm: Some(Address::shm_name(0xfeed_f00d << 64 | 42)),
            udp: vec!["10.0.0.1:4000".parse().unwrap()],
            tcp: vec!["10.0.0.2:4001".parse().unwrap()],
        };
        let b = a.to_bytes().unwrap();
        assert_eq!(Address::from_bytes(&b), Ok(a.clone()));
        let only_udp = Address {
            shm: None,
            tcp: Vec::new(),
            ..a.clone()
        };
        assert_eq!(
            Address::from_bytes(&only_udp.to_bytes().unwrap()),
            Ok(only_udp)
        );
        let odd_name = Address {
            shm: Some("elsewhere".into()),
            ..a.clone()
        };
        assert_eq!(odd_name.to_bytes(), None);
        assert!(Address::from_bytes(&b[..BINARY_LEN - 1]).is_err());
        let mut v = b;
        v[0] = 1;
        assert!(Address::from_bytes(&v).is_err());
        let mut f = b;
        f[25] |= 8;
        assert!(Address::from_bytes(&f).is_err());
        let mut junk = only_udp_bytes();
        junk[TCP_AT + 3] = 1; // a byte in the absent tcp field
        assert!(Address::from_bytes(&junk).is_err());
        let mut port0 = b;
        port0[UDP_AT + 16] = 0;
        port0[UDP_AT + 17] = 0;
        assert!(Address::from_bytes(&port0).is_err());
        let mut multicast = b;
        multicast[UDP_AT..UDP_AT + 16]
            .copy_from_slice(&"ff02::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert!(Address::from_bytes(&multicast).is_err());
    }

    /// IPv6 addresses cross in the binary form; a transport offering both families
    /// carries its first IPv4 address (every socket reaches it).
    #[test]
    fn binary_ipv6() {
        let v6 = Address {
            host: 9,
            id: 10,
            shm: None,
            udp: vec!["[fd00::1]:4000".parse().unwrap()],
            tcp: vec!["[2001:db8::7]:4001".parse().unwrap()],
        };
        let b = v6.to_bytes().unwrap();
        assert_eq!(Address::from_bytes(&b), Ok(v6.clone()));
        let both = Address {
            udp: vec![
                "[fd00::1]:4000".parse().unwrap(),
                "10.0.0.1:4000".parse().unwrap(),
            ],
            ..v6.clone()
        };
        let back = Address::from_bytes(&both.to_bytes().unwrap()).unwrap();
        assert_eq!(back.udp, vec!["10.0.0.1:4000".parse().unwrap()]);
        assert_eq!(back.tcp, v6.tcp);
    }

    fn only_udp_bytes() -> [u8; BINARY_LEN] {
        Address {
            host: 1,
            id: 2,
            shm: None,
            udp: vec!["127.0.0.1:9".parse().unwrap()],
            tcp: Vec::new(),
        }
        .to_bytes()
        .unwrap()
    }

    #[test]
    fn round_trip_and_errors() {
        let a = Address {
            host: 0xabc,
            id: 7,
            shm: Some("clink-00ff".into()),
            udp: vec!["10.0.0.1:4000".parse().unwrap()],
            tcp: vec!["10.0.0.1:4001".parse().unwrap()],
        };
        assert_eq!(Address::parse(&a.to_string()), Ok(a.clone()));
        let with_future = format!("{a};rdma=mlx5:1");
        assert_eq!(Address::parse(&with_future), Ok(a));
        let only_udp =
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=127.0.0.1:9";
        assert_eq!(Address::parse(only_udp).unwrap().shm, None);
        let only_tcp =
            "clink:host=0000000000000001;id=00000000000000000000000000000001;tcp=127.0.0.1:9";
        let t = Address::parse(only_tcp).unwrap();
        assert_eq!(
            (t.udp, t.tcp),
            (Vec::new(), vec!["127.0.0.1:9".parse().unwrap()])
        );
        let two = "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=10.0.0.1:9,192.168.1.5:9;tcp=10.0.0.1:7";
        let t = Address::parse(two).unwrap();
        assert_eq!(t.udp.len(), 2);
        assert_eq!(t.to_string(), two);
        // The binary form keeps the preferred address of each.
        let b = Address::from_bytes(&t.to_bytes().unwrap()).unwrap();
        assert_eq!((b.udp, b.tcp), (vec![t.udp[0]], t.tcp));
        let six = "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=10.0.0.1:9,[fd00::1]:9;tcp=[fd00::1]:7";
        let a6 = Address::parse(six).unwrap();
        assert!(a6.udp[1].is_ipv6() && a6.tcp[0].is_ipv6());
        assert_eq!(a6.to_string(), six);
        // The binary form keeps each transport's first IPv4 address, else its first IPv6.
        let b = Address::from_bytes(&a6.to_bytes().unwrap()).unwrap();
        assert_eq!((b.udp, b.tcp), (vec![a6.udp[0]], a6.tcp.clone()));
        let many: Vec<String> = (1..=MAX_NET_ADDRS)
            .map(|i| format!("10.0.0.{i}:9"))
            .collect();
        let at_most = format!(
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp={}",
            many.join(",")
        );
        assert_eq!(Address::parse(&at_most).unwrap().udp.len(), MAX_NET_ADDRS);
        assert!(Address::parse(&format!("{at_most},10.0.0.99:9")).is_err());
        for s in [
            "",
            "clink:",
            "tcp://x",
            "clink:host=1;id=2",
            "clink:host=00000000000000zz;id=00000000000000000000000000000001",
            "clink:host=0000000000000001",
            "clink:host=0000000000000001;host=0000000000000001",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;shm=a/b",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=1.2.3.4",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=0.0.0.0:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=1.2.3.4:0",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=255.255.255.255:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=1.2.3.4:5;udp=1.2.3.4:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;tcp=1.2.3.4:5;tcp=1.2.3.4:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;tcp=1.2.3.4:0",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;tcp=1.2.3.4",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=1.2.3.4:5,",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=1.2.3.4:5,1.2.3.4:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=1.2.3.4:5,0.0.0.0:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=[::]:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=[ff02::1]:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=[fe80::1%2]:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=[::ffff:1.2.3.4]:5",
            "clink:host=0000000000000001;id=00000000000000000000000000000001;udp=fd00::1:5",
        ] {
            assert!(Address::parse(s).is_err(), "{s}");
        }
    }

    proptest! {
        #[test]
        fn parse_is_total(s in ".{0,120}") { let _ = Address::parse(&s); }
        #[test]
        fn parse_is_total_near_valid(tail in "[a-z=;0-9]{0,60}") {
            let _ = Address::parse(&format!("clink:host=0000000000000001;id=00000000000000000000000000000001;{tail}"));
        }
    }
}
