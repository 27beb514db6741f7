//! `clink info`: what clink would do on this machine, and why.

use clink::config::VARIABLES;
use clink::Context;

fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// What `Endpoint::connect` picks, in words: shared memory for a peer on this host unless
/// the network is forced; else TCP first when it is on and preferred or UDP is off, UDP
/// otherwise, TCP when the peer offers only TCP.
fn connect_choice(prefer_tcp: bool, force_net: bool, udp: bool, tcp: bool) -> String {
    let net = match (udp, tcp, prefer_tcp) {
        (true, true, true) => "TCP, or UDP when the peer offers only UDP (CLINK_TRANSPORT=tcp)",
        (false, true, true) => "TCP (CLINK_TRANSPORT=tcp)",
        (true, true, false) => "UDP, or TCP when the peer offers only TCP",
        (false, true, false) => "TCP (UDP is off here: CLINK_UDP=off)",
        (true, false, true) => "UDP (CLINK_TRANSPORT=tcp but TCP is off: CLINK_TCP=off)",
        (true, false, false) => "UDP (TCP is off here: CLINK_TCP=off)",
        (false, false, _) => "",
    };
    match (force_net, net.is_empty()) {
        (true, false) => format!("every peer, even on this host, over {net}"),
        (false, false) => format!("shared memory on this host; other hosts over {net}"),
        (false, true) => "shared memory only (CLINK_UDP=off, CLINK_TCP=off)".into(),
        (true, true) => {
            "nothing: CLINK_TRANSPORT forces the network, but UDP and TCP are off".into()
        }
    }
}

/// The congestion control clink's TCP connections run, and where it comes from.
fn congestion(t: &clink::config::TcpConfig) -> String {
    use clink::transport::tcp::{congestion_controls, host_congestion_control};
    let offered = congestion_controls();
    match (&t.congestion, host_congestion_control()) {
        (Some(cc), _) => format!("{cc} (CLINK_TCP_CC; the kernel offers {offered})"),
        (None, Ok(host)) if host == "bbr" => format!(
            "bbr, the host's (net.ipv4.tcp_congestion_control); without an fq qdisc to pace for it (veth pairs, bridges) each connection paces with a timer of its own, several times slower than cubic on a VM: CLINK_TCP_CC=cubic chooses another (the kernel offers {offered})"
        ),
        (None, Ok(host)) => format!(
            "{host}, the host's (net.ipv4.tcp_congestion_control; CLINK_TCP_CC chooses another of {offered})"
        ),
        (None, Err(e)) => format!("the host's (not readable: {e})"),
    }
}

/// Prints configuration, measured costs and the thresholds derived from them.
pub fn run() -> Result<(), String> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    let cfg = ctx.config();
    let (c, _) = ctx.costs();
    println!("clink {}", env!("CARGO_PKG_VERSION"));
    println!(
        "host key            {:016x} (boot id + network namespace: shared memory only within one)",
        ctx.host()
    );
    println!(
        "transports          shm: peers on this host and network namespace{}",
        if cfg.force_net {
            " (not used: CLINK_TRANSPORT forces the network)"
        } else {
            ""
        }
    );
    println!(
        "                    udp: {}",
        match &cfg.udp {
            Some(u) => format!(
                "on, socket bound to {} (reliable datagrams, speculative bulk receive)",
                u.bind
            ),
            None => "off (CLINK_UDP=off)".into(),
        }
    );
    if let Some(u) = &cfg.udp {
        println!(
            "                    udp bulk payloads: {}",
            if u.payload_hash {
                "hashed end to end (XXH3 per fragment, both ways: CLINK_UDP_PAYLOAD_HASH=1)"
            } else {
                "left to the UDP checksum, headers CRC-32C (unless the peer asks for hashes; CLINK_UDP_PAYLOAD_HASH=1 asks)"
            }
        );
    }
    if let Some(ring) = ctx.endpoint().ok().and_then(|mut ep| ep.udp_ring()) {
        println!(
            "                    udp receive: {}",
            match ring {
                Ok(()) => format!(
                    "small datagrams (UDP length up to {} bytes: data, acks, naks, pings, admission) from a packet socket's receive ring polled in memory, the rest from the sockets",
                    clink::transport::udp::ring::RING_MAX_UDP
                ),
                Err(why) => format!("from the sockets; receive ring {why}"),
            }
        );
    }
    println!(
        "                    tcp: {}",
        match &cfg.tcp {
            Some(t) =>
                format!(
                "on, listening on {} (one connection per peer, speculative rendezvous receive {})",
                t.bind,
                if t.speculate { "on" } else { "off: CLINK_TCP_SPECULATE=0" }
            ),
            None => "off (CLINK_TCP=off)".into(),
        }
    );
    if let Some(t) = &cfg.tcp {
        println!(
            "                    tcp congestion control: {}",
            congestion(t)
        );
    }
    let devices = cfg
        .udp
        .as_ref()
        .map(|u| u.devices.clone())
        .or_else(|| cfg.tcp.as_ref().map(|t| t.devices.clone()))
        .unwrap_or_default();
    let ifaces = clink::sys::interfaces();
    println!(
        "network addresses   {}",
        match clink::netdev::choose(&ifaces, &devices) {
            Ok((v, why)) => format!(
                "{}, advertised in this order when bound to all interfaces: {why}",
                v.iter()
                    .map(|i| format!("{} on {} (MTU {})", i.ip, i.name, i.mtu))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(e) => format!("none: {e}"),
        }
    );
    println!(
        "                    of a peer's addresses, connect picks the first on the subnet of an advertised interface, else of any interface here, else the first it lists; this host's own addresses last; the others too when that one does not answer (three UDP hellos, or a TCP connect refused or not made in 300 ms)"
    );
    let others: Vec<String> = ifaces
        .iter()
        .map(|i| format!("{} {}/{}", i.name, i.ip, i.prefix))
        .collect();
    println!(
        "                    interfaces up: {} (choose with CLINK_NET_DEVICES)",
        others.join(", ")
    );
    let choice = connect_choice(
        cfg.prefer_tcp,
        cfg.force_net,
        cfg.udp.is_some(),
        cfg.tcp.is_some(),
    );
    println!("connect picks       {choice}");
    println!();
    println!("cost model inputs ({})", ctx.costs_source());
    println!(
        "  memcpy            {:.1} GB/s in cache, {:.1} GB/s beyond the {} cache",
        c.copy_bytes_per_ns,
        c.copy_dram_bytes_per_ns,
        size(c.cache_bytes)
    );
    println!(
        "  CMA read          {:.1} GB/s in cache, {:.1} GB/s beyond, {:.0} ns per call",
        c.cma_bytes_per_ns, c.cma_dram_bytes_per_ns, c.cma_call_ns
    );
    println!(
        "  ring hop          {:.0} ns (cross-core cache-line transfer)",
        c.hop_ns
    );
    println!();
    let why = if cfg.eager_max.is_some() {
        "set by CLINK_EAGER_MAX, capped by the ring"
    } else {
        "crossover of 2 copies through the ring vs a CMA call + 1 copy, capped at a quarter of the ring"
    };
    println!(
        "eager threshold     {} with CMA, {} without ({why})",
        size(ctx.eager_threshold(true)),
        size(ctx.eager_threshold(false))
    );
    let (udp, tcp) = ctx.net_eager_thresholds();
    println!(
        "  network peers     {} over UDP (above it the bulk transfer's zero copies beat the rendezvous round trip), {} over TCP{}",
        size(udp),
        size(tcp),
        if cfg.eager_max.is_some() { " (CLINK_EAGER_MAX)" } else { "" }
    );
    println!(
        "rendezvous method per size ({}):",
        if cfg.rndv.is_some() {
            "forced by CLINK_RNDV"
        } else {
            "cheaper of CMA = hop + call + n/CMA rate (from 128 KiB split: 3 hops + call + n/2/CMA rate) and pipeline = 2 hops + n/copy rate"
        }
    );
    for n in [256u64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 1 << 30] {
        let m = ctx.rendezvous_method(n, cfg.cma);
        println!(
            "  {:>8}          {:?}{}",
            size(n),
            m,
            if matches!(m, clink_proto::cost::Rndv::Pipeline) {
                format!(", chunks of {}", size(ctx.pipeline_chunk(n)))
            } else {
                String::new()
            }
        );
    }
    println!(
        "CMA                 {}",
        if cfg.cma {
            "probed per peer at connect (process_vm_readv of a known word); pipeline where refused"
        } else {
            "off (CLINK_CMA=off): pipeline only"
        }
    );
    println!(
        "rings               {} cells x 64 B = {} per direction per peer{}",
        cfg.ring_cells,
        size(cfg.ring_cells as u64 * 64),
        if cfg.ring_shrink {
            "; halved per doubling of an endpoint's same-host peers beyond 3, down to 8 KiB (CLINK_RING_SHRINK)"
        } else {
            " for every connection (CLINK_RING_SHRINK=0)"
        }
    );
    println!(
        "spin before block   {}",
        cfg.spin
            .map_or("forever (never blocks)".to_string(), |d| format!("{d:?}"))
    );
    println!(
        "peers of other uids {}",
        if cfg.any_uid {
            "accepted (CLINK_SHM_ANY_UID=1)"
        } else {
            "refused (SO_PEERCRED)"
        }
    );
    println!();
    println!("environment variables:");
    for (name, what) in VARIABLES {
        let val = std::env::var(name).unwrap_or_else(|_| "(unset)".into());
        println!("  {name:<26} {val:<10} {what}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::connect_choice;

    #[test]
    fn the_choice_follows_connect() {
        // CLINK_TRANSPORT=udp with UDP off: TCP for every peer, not UDP.
        let c = connect_choice(false, true, false, true);
        assert!(c.starts_with("every peer") && c.contains("over TCP"), "{c}");
        // CLINK_TRANSPORT=tcp.
        let c = connect_choice(true, true, true, true);
        assert!(c.starts_with("every peer") && c.contains("over TCP"), "{c}");
        // Defaults.
        let c = connect_choice(false, false, true, true);
        assert!(
            c.starts_with("shared memory") && c.contains("over UDP, or TCP"),
            "{c}"
        );
        // TCP off: no TCP fall-back.
        let c = connect_choice(false, false, true, false);
        assert!(!c.contains("or TCP"), "{c}");
        // UDP off: other hosts over TCP.
        let c = connect_choice(false, false, false, true);
        assert!(c.contains("other hosts over TCP"), "{c}");
        assert!(connect_choice(false, false, false, false).contains("shared memory only"));
    }
}
