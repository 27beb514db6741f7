//! Endpoints over the UDP transport on loopback, configured by words in a string (the
//! tests over UDP share them).

use clink::config::{FaultConfig, UdpConfig};
use clink::{Config, Context, Endpoint, PeerId};
use std::net::Ipv4Addr;
use std::time::Duration;

/// A context whose network path is UDP over loopback, as `faults` says (see the words
/// below), its peers declared dead after `dead_ms`.
pub fn net_ctx(faults: &str, dead_ms: u64) -> Context {
    // "nospec" in the fault string: speculative receive off; "unreliable": unreliable mode;
    // "explicit": admission control by the API only; "nosteer": no flow steering;
    // "forcemiss": bulk fragments sent misordered (CLINK_UDP_FORCE_MISS); "nobackoff":
    // speculation kept armed however much it misses (CLINK_UDP_SPEC_BACKOFF=0); "sleepy":
    // no busy-polling, every wait sleeps at once (CLINK_SPIN_US=0); "noring": no receive
    // ring (CLINK_UDP_RING=0: the sockets alone; "ring" says the default, on); "hash": bulk
    // payloads hashed end to end (CLINK_UDP_PAYLOAD_HASH=1); "nothread": no keepalive
    // thread (CLINK_NET_KEEPALIVE_THREAD=0); "onequeue": no peer has a socket of its
    // own (CLINK_UDP_PEER_SOCKETS=0: one receive queue, the seed's admission setting);
    // "fallback": a connect gives UDP up for TCP after 300 ms (CLINK_UDP_FALLBACK_MS);
    // "shortconnect": connects time out after 1 s (CLINK_CONNECT_TIMEOUT_MS).
    let udp = UdpConfig {
        fallback: faults
            .contains("fallback")
            .then(|| Duration::from_millis(300)),
        peer_sockets: if faults.contains("onequeue") { 0 } else { 4 },
        keepalive_thread: !faults.contains("nothread"),
        payload_hash: faults.contains("hash"),
        ring: !faults.contains("noring"),
        bind: (Ipv4Addr::LOCALHOST, 0).into(),
        mtu: Some(1500),
        dead_after: Duration::from_millis(dead_ms),
        speculate: !faults.contains("nospec"),
        reliable: !faults.contains("unreliable"),
        force_miss: faults.contains("forcemiss"),
        spec_backoff: !faults.contains("nobackoff"),
        faults: FaultConfig::parse(
            &faults
                .replace("forcemiss", "")
                .replace("nobackoff", "")
                .replace("sleepy", "")
                .replace("nospec", "")
                .replace("unreliable", "")
                .replace("explicit", "")
                .replace("nosteer", "")
                .replace("noring", "")
                .replace("hash", "")
                .replace("nothread", "")
                .replace("onequeue", "")
                .replace("fallback", "")
                .replace("shortconnect", "")
                .replace("ring", ""),
        )
        .unwrap(),
        admission: if faults.contains("explicit") {
            clink_proto::admission::Mode::Explicit
        } else {
            clink_proto::admission::Mode::Implicit
        },
        steer: !faults.contains("nosteer"),
        ..UdpConfig::default()
    };
    super::ctx_with(Config {
        calibrate: false,
        force_net: true,
        spin: Some(Duration::from_micros(if faults.contains("sleepy") {
            0
        } else {
            20
        })),
        udp: Some(udp),
        connect_timeout: if faults.contains("shortconnect") {
            Duration::from_secs(1)
        } else {
            Config::default().connect_timeout
        },
        ..Config::default()
    })
}

/// Connects two endpoints over UDP: (server, its peer id for the client), (client, its
/// peer id for the server).
pub fn pair(faults: &str, dead_ms: u64) -> ((Endpoint, PeerId), (Endpoint, PeerId)) {
    let faults = faults.to_string();
    super::connect_pair(move || net_ctx(&faults, dead_ms), "udp")
}
