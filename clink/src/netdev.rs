//! Which interfaces' addresses an endpoint advertises to network peers, and which of a
//! peer's addresses it connects to.
//!
//! A node of a real cluster has several interfaces (a management network, a data network,
//! a container bridge). Bound to all interfaces (`CLINK_UDP_BIND` / `CLINK_TCP_BIND`
//! unset), an endpoint advertises the IPv4 address of every non-loopback interface that
//! is up, in the kernel's order, at most [`MAX_NET_ADDRS`]; on a host without IPv4 (but
//! loopback), its IPv6 addresses (link-local ones aside); loopback only when there is no
//! other. IPv6 is not advertised beside IPv4 by default because the UDP transport then
//! needs an IPv6 socket, which carries IPv4 as mapped addresses at a cost
//! (ARCHITECTURE.md, "Which address is advertised"). `CLINK_NET_DEVICES` narrows,
//! orders and widens them, as UCX's `UCX_NET_DEVICES` and Open MPI's `btl_tcp_if_include` do: a
//! comma-separated list of interface names (`eth1`) and subnets (`10.1.0.0/16`,
//! `fd00:1::/64`), the interfaces matching the first entry first; a name takes its
//! interface's IPv4 addresses (its IPv6 ones if it has no IPv4), a subnet what it holds.
//! A list nothing matches is an error that names the
//! interfaces there are, not a silent fallback. The first address advertised is the
//! preferred one, and sets the path MTU towards peers on no advertised interface's
//! subnet.
//!
//! The connecting side picks among a peer's addresses ([`pick`]) as Open MPI's TCP
//! transport does, by subnet: the first on the subnet of an interface it advertises
//! itself, else the first on any of its interfaces' subnets, else the first the kernel
//! must route; an address that is one of this host's own (a container bridge's
//! `172.17.0.1` exists on every host) is taken last, since it would reach this host. A
//! UDP connect that hears nothing there for three hellos, or a TCP connect refused there or
//! not made within 300 ms, tries the peer's other addresses too. A UDP socket of one family reaches that family only;
//! TCP connects over either.
//!
//! `clink info` prints the choice and why.

use crate::sys::Iface;
use clink_proto::addr::MAX_NET_ADDRS;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// One entry of `CLINK_NET_DEVICES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceRule {
    /// An interface, by name.
    Name(String),
    /// Any address in this subnet (IPv4 or IPv6).
    Subnet(IpAddr, u8),
}

impl DeviceRule {
    fn matches(&self, i: &Iface) -> bool {
        match self {
            DeviceRule::Name(n) => *n == i.name,
            DeviceRule::Subnet(net, bits) => in_subnet(i.ip, *net, *bits),
        }
    }
}

impl fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRule::Name(n) => write!(f, "{n}"),
            DeviceRule::Subnet(a, b) => write!(f, "{a}/{b}"),
        }
    }
}

/// Parses `CLINK_NET_DEVICES`: names and `A.B.C.D/N` or `IPv6/N` subnets, comma-separated.
pub fn parse_rules(text: &str) -> Result<Vec<DeviceRule>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((a, b)) = item.split_once('/') {
            let ip: IpAddr = a
                .parse()
                .map_err(|_| format!("{item:?}: not a subnet (A.B.C.D/N or IPv6/N)"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = b
                .parse()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{item:?}: the prefix length must be 0 to {max}"))?;
            out.push(DeviceRule::Subnet(ip, bits));
        } else if item.len() <= 15 && item.bytes().all(|c| c.is_ascii_graphic() && c != b'/') {
            out.push(DeviceRule::Name(item.to_string()));
        } else {
            return Err(format!("{item:?}: not an interface name"));
        }
    }
    if out.is_empty() {
        return Err("no interface or subnet given".into());
    }
    Ok(out)
}

/// Whether `ip` is in `net/bits` (never across families).
fn in_subnet(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let masked = |a: u128, width: u32| {
        let bits = u32::from(bits).min(width);
        if bits == 0 {
            0
        } else {
            a >> (width - bits)
        }
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            masked(u32::from(a).into(), 32) == masked(u32::from(n).into(), 32)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => masked(a.into(), 128) == masked(n.into(), 128),
        _ => false,
    }
}

/// The interfaces whose addresses to advertise among `ifaces` (as
/// [`crate::sys::interfaces`] lists them: IPv4 first, loopback last), preferred first,
/// with why they were chosen. Never empty.
pub fn choose(ifaces: &[Iface], rules: &[DeviceRule]) -> Result<(Vec<Iface>, String), String> {
    if rules.is_empty() {
        // IPv4 where the host has it (an IPv6 socket taking IPv4 as mapped addresses
        // costs the IPv4 path), IPv6 on a host that has only IPv6.
        let up = |v6: bool| -> Vec<Iface> {
            (ifaces.iter())
                .filter(|i| !i.lo && i.ip.is_ipv6() == v6)
                .take(MAX_NET_ADDRS)
                .cloned()
                .collect()
        };
        let v4 = up(false);
        if !v4.is_empty() {
            return Ok((v4, "every non-loopback IPv4 interface that is up".into()));
        }
        let v6 = up(true);
        if !v6.is_empty() {
            return Ok((
                v6,
                "every non-loopback interface that is up (IPv6 only here)".into(),
            ));
        }
        return Ok(match ifaces.first() {
            Some(i) => (vec![i.clone()], "loopback: no other interface is up".into()),
            None => (
                vec![Iface {
                    name: "lo".into(),
                    ip: Ipv4Addr::LOCALHOST.into(),
                    prefix: 8,
                    mtu: 65536,
                    lo: true,
                }],
                "loopback: no interface is up".into(),
            ),
        });
    }
    let mut out: Vec<Iface> = Vec::new();
    for r in rules {
        // A name takes its interface's IPv4 addresses, or its IPv6 ones when it has no
        // IPv4 (as the default does); a subnet takes what it holds.
        let has_v4 = |name: &str| ifaces.iter().any(|j| j.name == name && j.ip.is_ipv4());
        let wanted = |i: &&Iface| match r {
            DeviceRule::Name(_) => r.matches(i) && (i.ip.is_ipv4() || !has_v4(&i.name)),
            DeviceRule::Subnet(..) => r.matches(i),
        };
        for i in ifaces.iter().filter(wanted) {
            if out.len() < MAX_NET_ADDRS && !out.iter().any(|o| o.ip == i.ip) {
                out.push(i.clone());
            }
        }
    }
    if !out.is_empty() {
        let want: Vec<String> = rules.iter().map(ToString::to_string).collect();
        return Ok((out, format!("CLINK_NET_DEVICES={}", want.join(","))));
    }
    let have: Vec<String> = ifaces
        .iter()
        .map(|i| format!("{} {}/{}", i.name, i.ip, i.prefix))
        .collect();
    let want: Vec<String> = rules.iter().map(ToString::to_string).collect();
    Err(format!(
        "CLINK_NET_DEVICES={}: no interface that is up matches (interfaces: {})",
        want.join(","),
        if have.is_empty() {
            "none".into()
        } else {
            have.join(", ")
        }
    ))
}

/// The interfaces an endpoint whose socket is bound to `bind` advertises: those
/// [`choose`] picks when `bind` is unspecified (all interfaces), else the one holding
/// `bind`.
pub fn advertise(bind: IpAddr, rules: &[DeviceRule]) -> crate::Result<Vec<Iface>> {
    let ifaces = crate::sys::interfaces();
    if bind.is_unspecified() {
        return Ok(choose(&ifaces, rules).map_err(crate::Error::Config)?.0);
    }
    Ok(vec![ifaces.into_iter().find(|i| i.ip == bind).unwrap_or(
        Iface {
            name: "?".into(),
            ip: bind,
            prefix: if bind.is_ipv4() { 32 } else { 128 },
            mtu: 1500,
            lo: bind.is_loopback(),
        },
    )])
}

/// Where a transport configured to bind `bind` binds its socket, given the interfaces it
/// advertises: all interfaces of both families (`[::]`, taking IPv4 too) when it is bound
/// to all and one of them is IPv6, else `bind`.
pub fn socket_bind(bind: SocketAddr, mine: &[Iface]) -> SocketAddr {
    if bind.ip().is_unspecified() && mine.iter().any(|i| i.ip.is_ipv6()) {
        SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), bind.port())
    } else {
        bind
    }
}

/// Which of a peer's addresses `peer` (its preference order, never empty) to connect to
/// from a host whose interfaces `local` lists (called only when there is a choice), of
/// which this endpoint advertises `mine`; `same_host` when the peer is in this host and
/// namespace (its addresses are then all reachable: the preferred one). The rule is the
/// module's.
pub fn pick(
    peer: &[SocketAddr],
    mine: &[Iface],
    local: impl FnOnce() -> Vec<Iface>,
    same_host: bool,
) -> SocketAddr {
    if peer.len() == 1 || same_host {
        return peer[0];
    }
    let local = local();
    let on = |set: &[Iface], a: &SocketAddr| {
        set.iter()
            .any(|i| !i.lo && in_subnet(a.ip(), i.ip, i.prefix))
    };
    let foreign: Vec<SocketAddr> = peer
        .iter()
        .filter(|a| !local.iter().any(|i| i.ip == a.ip()))
        .copied()
        .collect();
    (foreign.iter().find(|a| on(mine, a)))
        .or_else(|| foreign.iter().find(|a| on(&local, a)))
        .or(foreign.first())
        .copied()
        .unwrap_or(peer[0])
}

/// The MTU towards `dest` of an endpoint advertising `mine` (never empty): the MTU of the
/// advertised interface whose subnet holds `dest`, else the smallest advertised one (the
/// kernel may route through any of them).
pub fn mtu_towards(mine: &[Iface], dest: IpAddr) -> usize {
    mine.iter()
        .find(|i| in_subnet(dest, i.ip, i.prefix))
        .or_else(|| mine.iter().min_by_key(|i| i.mtu))
        .map_or(1500, |i| i.mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: Vec<Iface>) -> Vec<String> {
        v.into_iter().map(|i| i.name).collect()
    }

    fn iface(name: &str, ip: [u8; 4], lo: bool) -> Iface {
        Iface {
            name: name.into(),
            ip: Ipv4Addr::from(ip).into(),
            prefix: 24,
            mtu: 1500,
            lo,
        }
    }

    #[test]
    fn rules_pick_by_name_or_subnet_in_order() {
        let ifs = [
            iface("mgmt0", [192, 168, 1, 5], false),
            iface("data0", [10, 1, 2, 3], false),
            iface("lo", [127, 0, 0, 1], true),
        ];
        let pick =
            |t: &str| choose(&ifs, &parse_rules(t).unwrap()).map(|(v, _)| names(v).join(","));
        assert_eq!(names(choose(&ifs, &[]).unwrap().0), ["mgmt0", "data0"]);
        assert_eq!(pick("data0").unwrap(), "data0");
        assert_eq!(pick("10.0.0.0/8").unwrap(), "data0");
        assert_eq!(pick("eth9, 192.168.0.0/16").unwrap(), "mgmt0");
        assert_eq!(pick("data0,mgmt0").unwrap(), "data0,mgmt0");
        assert_eq!(pick("data0,10.0.0.0/8").unwrap(), "data0");
        assert_eq!(pick("0.0.0.0/0").unwrap(), "mgmt0,data0,lo");
        let err = pick("eth9,172.16.0.0/12").unwrap_err();
        assert!(
            err.contains("no interface") && err.contains("data0 10.1.2.3/24"),
            "{err}"
        );
        let (v, why) = choose(&[iface("lo", [127, 0, 0, 1], true)], &[]).unwrap();
        assert!(v.len() == 1 && v[0].lo && why.contains("loopback"), "{why}");
        let (v, _) = choose(&[], &[]).unwrap();
        assert_eq!(v[0].ip, Ipv4Addr::LOCALHOST);
    }

    #[test]
    fn ipv6_subnets_and_addresses() {
        let mut v6 = iface("data6", [0; 4], false);
        v6.ip = "fd00:1::5".parse().unwrap();
        v6.prefix = 64;
        let ifs = [iface("eth0", [10, 1, 2, 3], false), v6];
        let rules = parse_rules("fd00:1::/64").unwrap();
        assert_eq!(choose(&ifs, &rules).unwrap().0[0].name, "data6");
        // By default IPv4 where there is any, IPv6 on an IPv6-only host.
        assert_eq!(names(choose(&ifs, &[]).unwrap().0), ["eth0"]);
        assert_eq!(names(choose(&ifs[1..], &[]).unwrap().0), ["data6"]);
        let both = parse_rules("10.0.0.0/8,fd00:1::/64").unwrap();
        assert_eq!(names(choose(&ifs, &both).unwrap().0), ["eth0", "data6"]);
        // A name: the interface's IPv4 address when it has one.
        let mut eth0_v6 = ifs[1].clone();
        eth0_v6.name = "eth0".into();
        let dual = [ifs[0].clone(), eth0_v6.clone()];
        let ips = |v: Vec<Iface>| v.into_iter().map(|i| i.ip).collect::<Vec<_>>();
        assert_eq!(
            ips(choose(&dual, &parse_rules("eth0").unwrap()).unwrap().0),
            [ifs[0].ip]
        );
        assert_eq!(
            ips(choose(&[eth0_v6.clone()], &parse_rules("eth0").unwrap())
                .unwrap()
                .0),
            [eth0_v6.ip]
        );
        assert_eq!(parse_rules("10.0.0.0/8").unwrap().len(), 1);
        assert!(parse_rules("fd00::/129").is_err());
        assert!(parse_rules("fd00::/64").is_ok());
        // An IPv4 subnet never holds an IPv6 address, nor the other way round.
        assert_eq!(
            names(choose(&ifs, &parse_rules("0.0.0.0/0").unwrap()).unwrap().0),
            ["eth0"]
        );
        assert_eq!(
            names(choose(&ifs, &parse_rules("::/0").unwrap()).unwrap().0),
            ["data6"]
        );
        let six = |s: &str| SocketAddr::new(s.parse().unwrap(), 7000);
        let peer = [sa([192, 168, 9, 9]), six("fd00:1::9")];
        assert_eq!(pick(&peer, &ifs, || ifs.to_vec(), false), six("fd00:1::9"));
        let many: Vec<Iface> = (0..20)
            .map(|n| iface(&format!("e{n}"), [10, 0, n, 1], false))
            .collect();
        assert_eq!(choose(&many, &[]).unwrap().0.len(), MAX_NET_ADDRS);
    }

    fn sa(ip: [u8; 4]) -> SocketAddr {
        SocketAddr::new(Ipv4Addr::from(ip).into(), 7000)
    }

    #[test]
    fn a_peer_is_reached_on_a_shared_subnet() {
        // This host: a management network first, a data network, a container bridge.
        let local = [
            iface("mgmt0", [192, 168, 1, 5], false),
            iface("data0", [10, 1, 2, 3], false),
            iface("docker0", [172, 17, 0, 1], false),
            iface("lo", [127, 0, 0, 1], true),
        ];
        let mine = &local[..3];
        let at = |peer: &[SocketAddr], mine: &[Iface]| pick(peer, mine, || local.to_vec(), false);
        // A peer on the data network only, which lists an unreachable address first.
        let peer = [sa([192, 168, 9, 9]), sa([10, 1, 2, 4])];
        assert_eq!(at(&peer, mine), sa([10, 1, 2, 4]));
        // Its container bridge has this host's address: never preferred.
        let peer = [sa([172, 17, 0, 1]), sa([10, 1, 2, 4])];
        assert_eq!(at(&peer, mine), sa([10, 1, 2, 4]));
        // Advertised interfaces' subnets before the others'.
        let only_data = &local[1..2];
        let peer = [sa([192, 168, 1, 6]), sa([10, 1, 2, 4])];
        assert_eq!(at(&peer, only_data), sa([10, 1, 2, 4]));
        assert_eq!(at(&peer, mine), sa([192, 168, 1, 6]));
        // No shared subnet: the peer's preference (the kernel routes it).
        let peer = [sa([8, 8, 4, 4]), sa([9, 9, 9, 9])];
        assert_eq!(at(&peer, mine), sa([8, 8, 4, 4]));
        // Only this host's own addresses, or a peer on this host: its first.
        assert_eq!(at(&[sa([172, 17, 0, 1])], mine), sa([172, 17, 0, 1]));
        let peer = [sa([192, 168, 1, 5]), sa([10, 1, 2, 3])];
        // (Neither lists this host's interfaces.)
        let no_listing = || -> Vec<Iface> { panic!("interfaces listed without a choice") };
        assert_eq!(pick(&peer, mine, no_listing, true), sa([192, 168, 1, 5]));
        assert_eq!(
            pick(&peer[..1], mine, no_listing, false),
            sa([192, 168, 1, 5])
        );
    }

    #[test]
    fn the_mtu_is_the_interface_towards_the_peer() {
        let mut data = iface("data0", [10, 1, 2, 3], false);
        data.mtu = 9000;
        let mine = [iface("mgmt0", [192, 168, 1, 5], false), data];
        assert_eq!(
            mtu_towards(&mine, Ipv4Addr::new(10, 1, 2, 200).into()),
            9000
        );
        assert_eq!(
            mtu_towards(&mine, Ipv4Addr::new(192, 168, 1, 7).into()),
            1500
        );
        assert_eq!(mtu_towards(&mine, Ipv4Addr::new(8, 8, 8, 8).into()), 1500);
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in [
            "",
            " , ",
            "10.0.0.0/33",
            "10.0.0/8",
            "a/b",
            "averyveryverylongname",
        ] {
            assert!(parse_rules(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_rules("eth1, 10.0.0.0/8").unwrap(),
            [
                DeviceRule::Name("eth1".into()),
                DeviceRule::Subnet(Ipv4Addr::new(10, 0, 0, 0).into(), 8)
            ]
        );
    }
}
