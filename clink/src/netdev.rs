//! Which interface's address an endpoint advertises to network peers.
//!
//! A node of a real cluster has several interfaces (a management network, a data network,
//! a container bridge). Bound to all interfaces (`CLINK_UDP_BIND` / `CLINK_TCP_BIND`
//! unset), an endpoint advertises one address per transport; `CLINK_NET_DEVICES` says
//! which, as UCX's `UCX_NET_DEVICES` and Open MPI's `btl_tcp_if_include` do: a
//! comma-separated list of interface names (`eth1`) and IPv4 subnets (`10.1.0.0/16`),
//! tried in order, the first interface address matching one of them winning. Unset, the
//! first non-loopback interface that is up is used (else loopback). A list nothing
//! matches is an error that names the interfaces there are, not a silent fallback.
//!
//! `clink info` prints the choice and why.

use crate::sys::Iface;
use std::fmt;
use std::net::Ipv4Addr;

/// One entry of `CLINK_NET_DEVICES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceRule {
    /// An interface, by name.
    Name(String),
    /// Any address in this IPv4 subnet.
    Subnet(Ipv4Addr, u8),
}

impl DeviceRule {
    fn matches(&self, i: &Iface) -> bool {
        match self {
            DeviceRule::Name(n) => *n == i.name,
            DeviceRule::Subnet(net, bits) => {
                let mask = if *bits == 0 {
                    0
                } else {
                    u32::MAX << (32 - bits)
                };
                u32::from(i.ip) & mask == u32::from(*net) & mask
            }
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

/// Parses `CLINK_NET_DEVICES`: names and `A.B.C.D/N` subnets, comma-separated.
pub fn parse_rules(text: &str) -> Result<Vec<DeviceRule>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((a, b)) = item.split_once('/') {
            let ip: Ipv4Addr = a
                .parse()
                .map_err(|_| format!("{item:?}: not an IPv4 subnet (A.B.C.D/N)"))?;
            let bits: u8 = b
                .parse()
                .ok()
                .filter(|&n| n <= 32)
                .ok_or_else(|| format!("{item:?}: the prefix length must be 0 to 32"))?;
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

/// The interface address to advertise among `ifaces` (as [`crate::sys::ipv4_interfaces`]
/// lists them: loopback last), with why it was chosen.
pub fn choose(ifaces: &[Iface], rules: &[DeviceRule]) -> Result<(Iface, String), String> {
    if rules.is_empty() {
        return match ifaces.first() {
            Some(i) if !i.lo => Ok((i.clone(), "the first non-loopback interface".into())),
            Some(i) => Ok((i.clone(), "loopback: no other interface is up".into())),
            None => Ok((
                Iface {
                    name: "lo".into(),
                    ip: Ipv4Addr::LOCALHOST,
                    prefix: 8,
                    mtu: 65536,
                    lo: true,
                },
                "loopback: no interface is up".into(),
            )),
        };
    }
    for r in rules {
        if let Some(i) = ifaces.iter().find(|i| r.matches(i)) {
            return Ok((i.clone(), format!("CLINK_NET_DEVICES entry {r}")));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, ip: [u8; 4], lo: bool) -> Iface {
        Iface {
            name: name.into(),
            ip: Ipv4Addr::from(ip),
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
        let pick = |t: &str| choose(&ifs, &parse_rules(t).unwrap()).map(|(i, _)| i.name);
        assert_eq!(choose(&ifs, &[]).unwrap().0.name, "mgmt0");
        assert_eq!(pick("data0").unwrap(), "data0");
        assert_eq!(pick("10.0.0.0/8").unwrap(), "data0");
        assert_eq!(pick("eth9, 192.168.0.0/16").unwrap(), "mgmt0");
        assert_eq!(pick("data0,mgmt0").unwrap(), "data0");
        assert_eq!(pick("0.0.0.0/0").unwrap(), "mgmt0");
        let err = pick("eth9,172.16.0.0/12").unwrap_err();
        assert!(
            err.contains("no interface") && err.contains("data0 10.1.2.3/24"),
            "{err}"
        );
        let (i, why) = choose(&[iface("lo", [127, 0, 0, 1], true)], &[]).unwrap();
        assert!(i.lo && why.contains("loopback"), "{why}");
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
                DeviceRule::Subnet(Ipv4Addr::new(10, 0, 0, 0), 8)
            ]
        );
    }
}
