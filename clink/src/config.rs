//! Configuration, read from `CLINK_*` environment variables. This is the one place they are
//! defined; `clink info` prints them with their values.

pub use crate::transport::tcp::TcpConfig;
pub use crate::transport::udp::{FaultConfig, UdpConfig};
use crate::{Error, Result};
use std::time::Duration;

/// Every environment variable clink reads, with its meaning (printed by `clink info`).
pub const VARIABLES: &[(&str, &str)] = &[
    ("CLINK_SPIN_US", "busy-poll time before blocking, microseconds (default 50; 0 = block at once; 'inf' = never block); a blocking receive from an endpoint's only peer over UDP spends up to this long (at most 100 us) in its fast path, then the rest of it in the general path; with a nonzero spin time, a wait for which a UDP peer's reply is due (an ack of packets in flight, the repair of a hole) spins on up to two of that link's smoothed RTTs (at most 1 ms) from its last activity before it blocks; while this endpoint's bulk stream is held to the slow window by admission control and no reply is due, a wait blocks at once (a slowed sender spinning took the core it shares with the granted one); after four waits in a row whose spin failed (nothing came within it, or it came only after the thread lost its CPU while spinning, as when both ends share one CPU), waits block at once for 20 ms, then try spinning again"),
    ("CLINK_EAGER_MAX", "eager/rendezvous threshold in bytes (default: from the measured cost model)"),
    ("CLINK_CHUNK", "pipelined-rendezvous chunk size in bytes (default: from the cost model, per message)"),
    ("CLINK_RNDV", "rendezvous copy: 'auto' (default: cost model per size), 'cma' or 'pipeline'"),
    ("CLINK_CMA", "'auto' (default: probe process_vm_readv at connect) or 'off' (never use CMA: pipeline only)"),
    ("CLINK_CMA_SPLIT", "'1' (default): a CMA rendezvous of 128 KiB or more is copied by both sides at once, the sender writing the first half into the posted buffer (process_vm_writev) while the receiver reads the second; '0': the receiver reads it all"),
    ("CLINK_RING_CELLS", "64-byte cells per ring direction, a power of two (default 2048 = 128 KiB: small enough to stay in the caches of both cores)"),
    ("CLINK_RING_SHRINK", "'1' (default): an endpoint with many same-host peers connects to more of them with smaller rings (halved for each doubling of its peers beyond 4, down to 128 cells = 8 KiB; each pair's rings are its own memory, and a full mesh of N processes holds N(N-1)/2 pairs); '0': every connection gets CLINK_RING_CELLS"),
    ("CLINK_SHM_ANY_UID", "'1' lets peers of other uids connect (default: same uid only)"),
    ("CLINK_CALIBRATE", "'1' (default): the copy, CMA and ring-hop costs the protocols are chosen from are measured once per host and boot, by the first process that needs them (the others wait for it, then read them from CLINK_COSTS_CACHE); a figure no machine could measure (a measurement disturbed by load) is replaced by the built-in one and not stored; 'fresh': measured by this process (and stored); '0': built-in figures"),
    ("CLINK_COSTS_CACHE", "the file holding the host's measured costs (default /dev/shm/clink-costs-UID)"),
    ("CLINK_CONNECT_TIMEOUT_MS", "connect handshake timeout (default 5000)"),
    ("CLINK_LIVENESS_MS", "how often a busy-polling endpoint checks peers for death (default 10)"),
    ("CLINK_BOARD_PEERS", "same-host peers from which progress visits only the peers that raised their bit on the activity board (default 4; 0 = never)"),
    ("CLINK_TRANSPORT", "'auto' (default): shared memory on the same host, UDP otherwise (TCP when the peer offers only TCP or UDP is off); 'udp': UDP even on the same host (loopback tests and benchmarks), never falling back to TCP (unless CLINK_UDP_FALLBACK_MS says so); 'tcp': TCP for every peer, even on the same host"),
    ("CLINK_UDP", "'on' (default): offer the UDP network transport to peers on other hosts; 'off': same-host shared memory only"),
    ("CLINK_UDP_BIND", "IP address:port the UDP socket binds (default 0.0.0.0:0: every interface, all of whose addresses are advertised; see CLINK_NET_DEVICES)"),
    ("CLINK_UDP_MTU", "path MTU in bytes for fragmentation (default: the MTU of the advertised interface; jumbo frames welcome)"),
    ("CLINK_UDP_SPECULATE", "'1' (default): receive bulk transfers speculatively, payloads straight into the posted buffer; '0': through the socket's slots and one copy (the baseline of the speculation experiments)"),
    ("CLINK_UDP_SPEC_BACKOFF", "'1' (default): when under a fifth of the armed stream's fragments land in place in two windows of 256 in a row (a sender or path that misorders them), turn speculation off for 4 096 datagrams read, then probe with one window, doubling the backoff on each losing probe up to 262 144: a miss costs more than the copy path (forced misses 0.70x speculation off without it, 0.92x with it, BENCHMARKS.md); '0': keep speculating whatever the misses (the raw miss path, clink bench --spec's forced_miss_raw)"),
    ("CLINK_UDP_FORCE_MISS", "experiment knob, '0' (default): '1' makes this endpoint send its bulk fragments misordered within each group (neighbours swapped), so the receiver's speculation misses every one and all take the cleanup path; the data still arrives intact (the fallback experiment of clink bench --spec)"),
    ("CLINK_UDP_ADMISSION", "admission control of fast bulk streams, one granted per receiving endpoint (Fast_Req / Fast_Ack / Fast_NAck): 'implicit' (default: asked for when a bulk transfer starts), 'explicit' (Endpoint::request_fast), 'off' (every stream fast)"),
    ("CLINK_UDP_PEER_SOCKETS", "how many peers (the first ones) get a UDP socket of their own, connected to them and sharing the endpoint's port (SO_REUSEPORT): their datagrams skip the per-datagram route lookup and the main socket (64-byte one-way across the veth pair 0.5-0.8 us less in three alternated pairs, BENCHMARKS.md); every such socket is looked at on every pass (with the receive ring, when a transfer comes in or it was busy; from three of them on, one zero-timeout epoll wait asks which hold data and only those are read), so a few: default 8, one per peer of an 8-host all-to-all (each then its own receive queue for admission control: such an all-to-all took 0.76x the time it took with 4, BENCHMARKS.md), 0-64; 0: one socket for all"),
    ("CLINK_UDP_STEER", "'1': a receiver steers the fast stream admission control granted to a UDP socket of its own, connected to that sender (the kernel keeps other traffic out of its speculative layout; it puts no more in place than without it, and costs goodput with two senders and under loss, BENCHMARKS.md); '0' (default): no steered socket (a stream arrives on its peer's own socket, see CLINK_UDP_PEER_SOCKETS, or on the main one)"),
    ("CLINK_UDP_RING", "'1' (default): once an endpoint has a UDP peer, it reads the small datagrams (data, acks, naks, pings, admission; UDP length up to 1 908 bytes) from a packet socket's receive ring shared with the kernel (PACKET_RX_RING), polled in memory without a system call, the UDP sockets dropping them by a BPF filter, and it sends its lone datagrams to a peer one hop away through that packet socket (IP and UDP headers built by clink, no qdisc, the peer's link-layer address learned from its frames); bulk fragments, GSO runs and handshakes stay on the UDP sockets. Needs CAP_NET_RAW (without it, the sockets alone, as with '0'); these packets bypass the host's netfilter rules. It shortens the busy 64-byte one-way hop across a veth pair (BENCHMARKS.md); no packet-socket sends on loopback"),
    ("CLINK_UDP_PAYLOAD_HASH", "'0' (default): a bulk fragment's payload is left to the UDP checksum (filled in by the sending kernel or NIC, verified by the receiving one), as TCP leaves its stream to its own, and clink's CRC-32C covers its header (which the speculation verifier trusts) and every byte of the other datagrams; '1': each fragment's payload is also hashed end to end (XXH3), on both directions of every connection this endpoint makes or accepts (either side's wish applies), and an unhashed fragment is refused. It costs goodput and CPU (BENCHMARKS.md)"),
    ("CLINK_UDP_RELIABLE", "'1' (default): retransmit lost datagrams; '0': BCL-4's unreliable mode (lost messages are dropped, never damaged or duplicated)"),
    ("CLINK_TCP", "'on' (default): offer the TCP transport (a listening socket, advertised as tcp=IP:port); 'off': no TCP"),
    ("CLINK_TCP_BIND", "IP address:port the TCP listening socket binds (default 0.0.0.0:0: every interface, all of whose addresses are advertised; see CLINK_NET_DEVICES)"),
    ("CLINK_TCP_SPECULATE", "'1' (default): read rendezvous payloads over TCP speculatively, straight into the posted buffer; '0': through the receive buffer and one copy"),
    ("CLINK_TCP_CC", "the congestion control of this endpoint's TCP connections, a name the kernel offers (net.ipv4.tcp_available_congestion_control, e.g. 'cubic'); default: the host's (net.ipv4.tcp_congestion_control). A name the kernel refuses fails the endpoint's creation. Where the host's is bbr and no fq qdisc paces for it (veth pairs, bridges), every connection paces itself with a timer of its own, which held kernel TCP and clink's TCP links several times below cubic on a VM (BENCHMARKS.md)"),
    ("CLINK_NET_DEAD_MS", "silence after which a network peer (UDP or TCP) is declared dead, milliseconds (default 2000); keepalives every quarter of it"),
    ("CLINK_NET_DEVICES", "which interfaces' addresses the network transports advertise when bound to all interfaces: interface names and IPv4 or IPv6 subnets, comma-separated, in order of preference (e.g. 'eth1', '10.1.0.0/16' or 'fd00:1::/64'); default: every non-loopback IPv4 interface that is up (IPv6 ones on a host without IPv4). A list nothing matches is an error naming the interfaces there are. A connecting peer picks the advertised address on a subnet it shares"),
    ("CLINK_UDP_FALLBACK_MS", "how long a connect waits for the peer's UDP welcome before it gives UDP up and connects over TCP, when the peer's address offers TCP too (a firewall that drops UDP), milliseconds (default 1000, or 0 with CLINK_TRANSPORT=udp; 0: never, UDP until CLINK_CONNECT_TIMEOUT_MS); once the TCP connection is made (the path works), UDP gets 300 ms more, its hello repeated, before TCP is used; the attempt given up leaves no peer behind at the other end"),
    ("CLINK_NET_KEEPALIVE_THREAD", "'1' (default): a thread per endpoint pings its UDP peers while the application makes no call for a keepalive interval and repeats its last acknowledgement to each, so a process that computes for minutes between calls stays alive to its peers and their sends whose final ack was lost complete (TCP peers are kept alive by the kernel's keepalives); '0': no thread, the application must call in more often than CLINK_NET_DEAD_MS"),
    ("CLINK_FAULTS", "faults injected on UDP receive, e.g. 'drop=0.01,dup=0.001,corrupt=0.001,reorder=0.01,delay_us=200,seed=7' (default none)"),
];

/// Runtime configuration. Build with [`Config::from_env`] or start from `Default` and set
/// fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Busy-poll time before blocking; `None` = never block.
    pub spin: Option<Duration>,
    /// Forced eager threshold (bytes), or `None` for the cost model's.
    pub eager_max: Option<u64>,
    /// Forced pipeline chunk size, or `None` for the cost model's.
    pub chunk: Option<u64>,
    /// Forced rendezvous copy method, or `None` for the cost model's choice per size.
    pub rndv: Option<clink_proto::cost::Rndv>,
    /// Whether CMA (process_vm_readv) may be used.
    pub cma: bool,
    /// Whether a large CMA rendezvous is split: the sender writes the first half into
    /// the posted buffer (process_vm_writev) while the receiver reads the second.
    pub cma_split: bool,
    /// Cells per ring direction (power of two).
    pub ring_cells: u32,
    /// Connect to more same-host peers with smaller rings once there are many
    /// ([`crate::transport::shm::ring_cells_for`]).
    pub ring_shrink: bool,
    /// Accept shared-memory peers with another uid.
    pub any_uid: bool,
    /// Use measured costs (once per host, cached) rather than the built-in ones.
    pub calibrate: bool,
    /// Measure in this process even when the host's cache holds costs.
    pub calibrate_fresh: bool,
    /// The host's cost cache (default `/dev/shm/clink-costs-UID`).
    pub costs_cache: Option<std::path::PathBuf>,
    /// Connect handshake timeout.
    pub connect_timeout: Duration,
    /// Liveness check period while busy-polling.
    pub liveness: Duration,
    /// Same-host peers from which the activity board is used (0 = never).
    pub board_peers: usize,
    /// Use the network transport even for peers on the same host.
    pub force_net: bool,
    /// The UDP network transport's settings, `None` when it is off.
    pub udp: Option<UdpConfig>,
    /// Network peers over TCP rather than UDP (`CLINK_TRANSPORT=tcp`).
    pub prefer_tcp: bool,
    /// The TCP transport's settings, `None` when it is off.
    pub tcp: Option<TcpConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            spin: Some(Duration::from_micros(50)),
            eager_max: None,
            chunk: None,
            rndv: None,
            cma: true,
            cma_split: true,
            ring_cells: 2048,
            ring_shrink: true,
            any_uid: false,
            calibrate: true,
            calibrate_fresh: false,
            costs_cache: None,
            connect_timeout: Duration::from_secs(5),
            liveness: Duration::from_millis(10),
            board_peers: 4,
            force_net: false,
            udp: Some(UdpConfig::default()),
            prefer_tcp: false,
            tcp: Some(TcpConfig::default()),
        }
    }
}

fn bad(var: &str, val: &str, why: &str) -> Error {
    Error::Config(format!("{var}={val:?}: {why}"))
}

fn num(var: &str, val: &str, min: u64, max: u64) -> Result<u64> {
    let v: u64 = val
        .trim()
        .parse()
        .map_err(|_| bad(var, val, "not a non-negative integer"))?;
    if v < min || v > max {
        return Err(bad(var, val, &format!("must be between {min} and {max}")));
    }
    Ok(v)
}

fn flag(var: &str, val: &str) -> Result<bool> {
    match val.trim() {
        "1" | "on" | "yes" | "true" => Ok(true),
        "0" | "off" | "no" | "false" => Ok(false),
        _ => Err(bad(var, val, "expected 0/1, on/off, yes/no or true/false")),
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(std::env::vars())
    }

    /// Builds a configuration from `(name, value)` pairs; names not starting with `CLINK_`
    /// are ignored, unknown `CLINK_` names are an error (a typo should not pass silently).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Config> {
        let mut c = Config::default();
        let mut udp = UdpConfig::default();
        let mut udp_on = true;
        let mut fallback_set = false;
        let mut tcp = TcpConfig::default();
        let mut tcp_on = true;
        for (k, v) in vars {
            if !k.starts_with("CLINK_") {
                continue;
            }
            match k.as_str() {
                "CLINK_SPIN_US" => {
                    c.spin = if v.trim() == "inf" {
                        None
                    } else {
                        Some(Duration::from_micros(num(&k, &v, 0, 60_000_000)?))
                    }
                }
                "CLINK_EAGER_MAX" => c.eager_max = Some(num(&k, &v, 0, 1 << 30)?),
                "CLINK_CHUNK" => c.chunk = Some(num(&k, &v, 4096, 1 << 30)?),
                "CLINK_CMA" => {
                    c.cma = match v.trim() {
                        "auto" | "on" | "1" => true,
                        "off" | "0" => false,
                        _ => return Err(bad(&k, &v, "expected 'auto' or 'off'")),
                    }
                }
                "CLINK_CMA_SPLIT" => c.cma_split = flag(&k, &v)?,
                "CLINK_RING_SHRINK" => c.ring_shrink = flag(&k, &v)?,
                "CLINK_RING_CELLS" => {
                    let n = num(&k, &v, 64, 1 << 20)?;
                    if !n.is_power_of_two() {
                        return Err(bad(&k, &v, "must be a power of two"));
                    }
                    c.ring_cells = n as u32;
                }
                "CLINK_RNDV" => {
                    c.rndv = match v.trim() {
                        "auto" => None,
                        "cma" => Some(clink_proto::cost::Rndv::Cma),
                        "pipeline" => Some(clink_proto::cost::Rndv::Pipeline),
                        _ => return Err(bad(&k, &v, "expected 'auto', 'cma' or 'pipeline'")),
                    }
                }
                "CLINK_SHM_ANY_UID" => c.any_uid = flag(&k, &v)?,
                "CLINK_CALIBRATE" => {
                    (c.calibrate, c.calibrate_fresh) = match v.trim() {
                        "fresh" => (true, true),
                        _ => (
                            flag(&k, &v).map_err(|_| bad(&k, &v, "expected 1, 0 or 'fresh'"))?,
                            false,
                        ),
                    }
                }
                "CLINK_COSTS_CACHE" => {
                    if v.trim().is_empty() {
                        return Err(bad(&k, &v, "expected a file path"));
                    }
                    c.costs_cache = Some(std::path::PathBuf::from(v.trim()));
                }
                "CLINK_CONNECT_TIMEOUT_MS" => {
                    c.connect_timeout = Duration::from_millis(num(&k, &v, 1, 3_600_000)?)
                }
                "CLINK_LIVENESS_MS" => c.liveness = Duration::from_millis(num(&k, &v, 1, 10_000)?),
                "CLINK_BOARD_PEERS" => {
                    c.board_peers =
                        num(&k, &v, 0, crate::transport::shm::board::SLOTS as u64)? as usize
                }
                "CLINK_UDP" => udp_on = flag(&k, &v)?,
                "CLINK_TRANSPORT" => {
                    (c.force_net, c.prefer_tcp) = match v.trim() {
                        "auto" => (false, false),
                        "udp" => (true, false),
                        "tcp" => (true, true),
                        _ => return Err(bad(&k, &v, "expected 'auto', 'udp' or 'tcp'")),
                    }
                }
                "CLINK_UDP_BIND" => {
                    udp.bind = v.trim().parse().map_err(|_| {
                        bad(&k, &v, "expected <IP address>:<port> (IPv6 in brackets)")
                    })?
                }
                "CLINK_TCP" => tcp_on = flag(&k, &v)?,
                "CLINK_TCP_BIND" => {
                    tcp.bind = v.trim().parse().map_err(|_| {
                        bad(&k, &v, "expected <IP address>:<port> (IPv6 in brackets)")
                    })?
                }
                "CLINK_TCP_SPECULATE" => tcp.speculate = flag(&k, &v)?,
                "CLINK_TCP_CC" => {
                    let name = v.trim();
                    if !crate::transport::tcp::is_congestion_name(name) {
                        return Err(bad(
                            &k,
                            &v,
                            "expected a congestion control's name (1-15 letters, digits, '_' or '-'), e.g. 'cubic'",
                        ));
                    }
                    tcp.congestion = Some(name.to_string());
                }
                "CLINK_UDP_MTU" => udp.mtu = Some(num(&k, &v, 576, 65536)? as usize),
                "CLINK_UDP_RELIABLE" => udp.reliable = flag(&k, &v)?,
                "CLINK_UDP_SPECULATE" => udp.speculate = flag(&k, &v)?,
                "CLINK_UDP_SPEC_BACKOFF" => udp.spec_backoff = flag(&k, &v)?,
                "CLINK_UDP_STEER" => udp.steer = flag(&k, &v)?,
                "CLINK_UDP_PEER_SOCKETS" => udp.peer_sockets = num(&k, &v, 0, 64)? as usize,
                "CLINK_UDP_RING" => udp.ring = flag(&k, &v)?,
                "CLINK_NET_KEEPALIVE_THREAD" => udp.keepalive_thread = flag(&k, &v)?,
                "CLINK_UDP_FALLBACK_MS" => {
                    let ms = num(&k, &v, 0, 3_600_000)?;
                    udp.fallback = (ms > 0).then(|| Duration::from_millis(ms));
                    fallback_set = true;
                }
                "CLINK_NET_DEVICES" => {
                    udp.devices = crate::netdev::parse_rules(&v).map_err(|e| bad(&k, &v, &e))?;
                    tcp.devices = udp.devices.clone();
                }
                "CLINK_UDP_PAYLOAD_HASH" => udp.payload_hash = flag(&k, &v)?,
                "CLINK_UDP_FORCE_MISS" => udp.force_miss = flag(&k, &v)?,
                "CLINK_UDP_ADMISSION" => {
                    use clink_proto::admission::Mode;
                    udp.admission = match v.trim() {
                        "implicit" => Mode::Implicit,
                        "explicit" => Mode::Explicit,
                        "off" => Mode::Off,
                        _ => return Err(bad(&k, &v, "expected 'implicit', 'explicit' or 'off'")),
                    }
                }
                "CLINK_NET_DEAD_MS" => {
                    udp.dead_after = Duration::from_millis(num(&k, &v, 10, 3_600_000)?);
                    tcp.dead_after = udp.dead_after;
                }
                "CLINK_FAULTS" => {
                    udp.faults = FaultConfig::parse(&v).map_err(|e| bad(&k, &v, &e))?
                }
                _ => {
                    let known: Vec<&str> = VARIABLES.iter().map(|(n, _)| *n).collect();
                    return Err(Error::Config(format!(
                        "unknown variable {k} (known: {})",
                        known.join(", ")
                    )));
                }
            }
        }
        if c.force_net && !c.prefer_tcp && !fallback_set {
            // UDP asked for by name: a connect that falls back to TCP would hide it.
            udp.fallback = None;
        }
        c.udp = udp_on.then_some(udp);
        c.tcp = tcp_on.then_some(tcp);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_rejects() {
        let c = Config::from_vars(vars(&[
            ("CLINK_SPIN_US", "0"),
            ("CLINK_CMA", "off"),
            ("PATH", "x"),
            ("CLINK_RING_CELLS", "1024"),
        ]))
        .unwrap();
        assert_eq!(c.spin, Some(Duration::ZERO));
        assert!(!c.cma);
        let cal = |v: &str| {
            Config::from_vars(vars(&[("CLINK_CALIBRATE", v)]))
                .map(|c| (c.calibrate, c.calibrate_fresh))
        };
        assert_eq!(cal("fresh").unwrap(), (true, true));
        assert_eq!(cal("1").unwrap(), (true, false));
        assert_eq!(cal("0").unwrap(), (false, false));
        assert!(cal("sometimes").is_err());
        assert_eq!(c.ring_cells, 1024);
        let udp = |k: &str, v: &str| {
            Config::from_vars(vars(&[(k, v)]))
                .unwrap()
                .udp
                .expect("UDP on by default")
        };
        use clink_proto::admission::Mode;
        assert_eq!(
            udp("CLINK_UDP_ADMISSION", "explicit").admission,
            Mode::Explicit
        );
        assert_eq!(udp("CLINK_UDP_ADMISSION", "off").admission, Mode::Off);
        assert_eq!(
            udp("CLINK_UDP_ADMISSION", "implicit").admission,
            Mode::Implicit
        );
        assert!(udp("CLINK_UDP_FORCE_MISS", "1").force_miss);
        assert!(!udp("CLINK_UDP_SPEC_BACKOFF", "0").spec_backoff);
        assert!(udp("PATH", "x").spec_backoff);
        assert!(!udp("PATH", "x").force_miss);
        assert!(udp("CLINK_UDP_PAYLOAD_HASH", "1").payload_hash);
        assert!(!udp("PATH", "x").payload_hash);
        // UDP by name never falls back to TCP, unless the fallback is named too.
        let fallback =
            |v: &[(&str, &str)]| Config::from_vars(vars(v)).unwrap().udp.unwrap().fallback;
        assert_eq!(fallback(&[]), Some(Duration::from_millis(1000)));
        assert_eq!(fallback(&[("CLINK_UDP_FALLBACK_MS", "0")]), None);
        assert_eq!(fallback(&[("CLINK_TRANSPORT", "udp")]), None);
        assert_eq!(
            fallback(&[("CLINK_TRANSPORT", "udp"), ("CLINK_UDP_FALLBACK_MS", "300")]),
            Some(Duration::from_millis(300))
        );
        let board = |v: &str| Config::from_vars(vars(&[("CLINK_BOARD_PEERS", v)]));
        let slots = crate::transport::shm::board::SLOTS;
        assert_eq!(board(&slots.to_string()).unwrap().board_peers, slots);
        assert!(board(&(slots + 1).to_string()).is_err());
        let t = Config::from_vars(vars(&[
            ("CLINK_TRANSPORT", "tcp"),
            ("CLINK_TCP_BIND", "127.0.0.1:0"),
            ("CLINK_TCP_SPECULATE", "0"),
            ("CLINK_TCP_CC", " cubic "),
        ]))
        .unwrap();
        assert!(t.force_net && t.prefer_tcp);
        let tc = t.tcp.unwrap();
        assert_eq!(
            (tc.bind.to_string(), tc.speculate, tc.congestion.as_deref()),
            ("127.0.0.1:0".into(), false, Some("cubic"))
        );
        assert_eq!(
            Config::from_vars(vars(&[("CLINK_TCP", "off")]))
                .unwrap()
                .tcp,
            None
        );
        assert_eq!(
            Config::from_vars(vars(&[("CLINK_SPIN_US", "inf")]))
                .unwrap()
                .spin,
            None
        );
        for bad in [
            ("CLINK_SPIN_US", "-1"),
            ("CLINK_RING_CELLS", "1000"),
            ("CLINK_CMA", "maybe"),
            ("CLINK_TYPO", "1"),
            ("CLINK_EAGER_MAX", "lots"),
            ("CLINK_UDP_BIND", "localhost"),
            ("CLINK_UDP_MTU", "100"),
            ("CLINK_FAULTS", "drop=5"),
            ("CLINK_UDP", "maybe"),
            ("CLINK_UDP_ADMISSION", "sometimes"),
            ("CLINK_UDP_FORCE_MISS", "always"),
            ("CLINK_UDP_SPEC_BACKOFF", "never"),
            ("CLINK_TCP", "maybe"),
            ("CLINK_TCP_BIND", "localhost"),
            ("CLINK_TCP_CC", ""),
            ("CLINK_TCP_CC", "cubic; reboot"),
            ("CLINK_TCP_CC", "-n"),
            ("CLINK_TCP_CC", "a_name_longer_than_15"),
            ("CLINK_TRANSPORT", "sctp"),
        ] {
            let e = Config::from_vars(vars(&[bad])).unwrap_err().to_string();
            assert!(e.contains(bad.0), "{e}");
        }
    }
}
