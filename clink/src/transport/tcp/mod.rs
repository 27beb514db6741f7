//! The TCP transport: endpoints on other hosts where UDP is not wanted or not reachable
//! (`CLINK_TRANSPORT=tcp`, or a peer that offers only TCP).
//!
//! One listening socket per endpoint (advertised as `tcp=IP:port`, the same IP choice as
//! UDP) and one non-blocking connection per peer pair, `TCP_NODELAY`. The connection
//! carries the records of [`clink_proto::stream`]: endpoint frames, rendezvous payload
//! pieces, and the handshake: the connector's hello names the endpoint it wants (a stale
//! address is refused by the listener's welcome, with a clear error on the connecting
//! side). The kernel does reliability, ordering and flow control, so a [`TcpLink`] is
//! already the ordered, reliable frame link the endpoint's protocol needs.
//!
//! Rendezvous payloads bypass the frame queue on both sides: the sender writes them
//! straight from the send buffer (a gathering `sendmsg` of a header and the buffer range), the receiver
//! reads them with one vectored read `[header slot, posted buffer + expected offset,
//! spare]`, checks the header, and on a miss moves the bytes back in stream order
//! ([`link`]). Errors (end of stream, reset, malformed records) kill that peer's link only.

pub mod link;

use crate::error::{io_err, Result};
use clink_proto::stream::{Handshake, Kind, REFUSED_WRONG_ID};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

pub use link::{LinkError, TcpLink, TcpStats};

/// Settings of the TCP transport (from `CLINK_*`, see [`crate::config`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TcpConfig {
    /// Address the listening socket binds; unspecified IP = all interfaces (of both
    /// families where an IPv6 address is advertised), port 0 = any.
    pub bind: SocketAddr,
    /// Speculative receive of rendezvous payloads straight into the posted buffer.
    pub speculate: bool,
    /// Silence after which a peer is declared dead (`CLINK_NET_DEAD_MS`, shared with UDP);
    /// keepalives go every quarter of it on an otherwise idle connection.
    pub dead_after: Duration,
    /// Which interfaces' addresses to advertise when bound to all of them
    /// (`CLINK_NET_DEVICES`, [`crate::netdev`]); empty: every non-loopback one.
    pub devices: Vec<crate::netdev::DeviceRule>,
    /// The congestion control of this endpoint's connections (`CLINK_TCP_CC`, a name the
    /// kernel offers, as `TCP_CONGESTION` takes it); `None`: the host's default
    /// (`net.ipv4.tcp_congestion_control`), which peers' choices do not change.
    pub congestion: Option<String>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            bind: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
            speculate: true,
            dead_after: Duration::from_millis(2000),
            devices: Vec::new(),
            congestion: None,
        }
    }
}

/// The network namespace's default congestion control for new connections
/// (`net.ipv4.tcp_congestion_control`).
pub const CC_DEFAULT_KNOB: &str = "/proc/sys/net/ipv4/tcp_congestion_control";
/// The congestion controls the kernel offers (`net.ipv4.tcp_available_congestion_control`).
pub const CC_AVAILABLE_KNOB: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// Whether `name` can be a congestion control's name: 1-15 bytes (`TCP_CA_NAME_MAX` is
/// 16 with the terminating zero), letters, digits, `_` and `-`, a letter or digit first
/// (nothing a shell or `echo` would read as anything but the name).
pub fn is_congestion_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The congestion controls the kernel offers, or why they are not known.
pub fn congestion_controls() -> String {
    std::fs::read_to_string(CC_AVAILABLE_KNOB)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("(unknown: {e})"))
}

/// The host's default congestion control for new connections.
pub fn host_congestion_control() -> std::io::Result<String> {
    std::fs::read_to_string(CC_DEFAULT_KNOB).map(|s| s.trim().into())
}

/// An accepted connection waiting for its hello.
struct Incoming {
    link: TcpLink,
    since: Instant,
}

/// What [`TcpTransport::poll_incoming`] decided about connections waiting for a hello.
#[derive(Default)]
pub struct Handshakes {
    /// Links whose hello named us: welcomed, ready to become peers.
    pub accepted: Vec<TcpLink>,
    /// Why connections were dropped (refused, malformed, silent); closing them took them
    /// out of the endpoint's epoll set.
    pub dropped: Vec<String>,
    /// Connections closed before their hello (a connector that gave them up: it reached
    /// this endpoint over UDP after all), dropped quietly.
    pub abandoned: u64,
}

/// The endpoint's listening socket, the connections being set up, and its links by the
/// endpoint's peer index.
pub struct TcpTransport {
    listener: TcpListener,
    /// The interfaces advertised, preferred first.
    ifaces: Vec<crate::sys::Iface>,
    advertised: Vec<SocketAddr>,
    my_id: u128,
    cfg: TcpConfig,
    incoming: Vec<Incoming>,
    /// Endpoint peer indices of the live links, in the order they joined (progress
    /// visits only these).
    pub peers: Vec<usize>,
    /// The links by peer index; a failed or closed peer's link stays (freed, its
    /// counters readable).
    links: Vec<Option<Box<TcpLink>>>,
    /// When the links' acknowledgements were last looked at ([`TcpTransport::acks_due`]).
    acks_checked: std::time::Instant,
}

impl TcpTransport {
    /// Takes `link` as the endpoint's peer `idx`, live.
    pub fn adopt(&mut self, idx: usize, link: TcpLink) {
        if self.links.len() <= idx {
            self.links.resize_with(idx + 1, || None);
        }
        self.links[idx] = Some(Box::new(link));
        self.peers.push(idx);
    }

    /// Peer `idx` failed or closed: its link leaves the live list (it stays, to be read).
    pub fn detach(&mut self, idx: usize) {
        self.peers.retain(|&p| p != idx);
    }

    /// Peer `idx`'s link, live or not.
    pub fn link(&self, idx: usize) -> Option<&TcpLink> {
        self.links.get(idx)?.as_deref()
    }

    /// As [`TcpTransport::link`], mutable.
    pub fn link_mut(&mut self, idx: usize) -> Option<&mut TcpLink> {
        self.links.get_mut(idx)?.as_deref_mut()
    }

    /// Every link, live or not (for their counters).
    pub fn links(&self) -> impl Iterator<Item = &TcpLink> + '_ {
        self.links.iter().flatten().map(|l| &**l)
    }

    /// Binds the listening socket and works out the address to advertise.
    pub fn new(cfg: TcpConfig, my_id: u128) -> Result<TcpTransport> {
        let ifaces = crate::netdev::advertise(cfg.bind.ip(), &cfg.devices)?;
        let at = crate::netdev::socket_bind(cfg.bind, &ifaces);
        let listener = crate::sys::tcp_listen(at).map_err(io_err(format!("bind TCP {at}")))?;
        listener
            .set_nonblocking(true)
            .map_err(io_err("non-blocking TCP listener"))?;
        if let Some(cc) = &cfg.congestion {
            // On the listener, whose connections inherit it from their start (a socket
            // that started under bbr keeps pacing itself after a switch). A name the
            // kernel refuses fails here, with the choices there are, not at the first
            // connection.
            rustix::net::sockopt::set_tcp_congestion(&listener, cc).map_err(|e| {
                crate::Error::Config(format!(
                    "CLINK_TCP_CC={cc}: the kernel refuses it ({e}); it offers {} \
                     (net.ipv4.tcp_available_congestion_control; without CAP_NET_ADMIN only \
                     those of net.ipv4.tcp_allowed_congestion_control)",
                    congestion_controls()
                ))
            })?;
        }
        let port = listener
            .local_addr()
            .map_err(io_err("TCP listener address"))?
            .port();
        Ok(TcpTransport {
            listener,
            advertised: ifaces.iter().map(|i| SocketAddr::new(i.ip, port)).collect(),
            ifaces,
            my_id,
            cfg,
            incoming: Vec::new(),
            peers: Vec::new(),
            links: Vec::new(),
            acks_checked: std::time::Instant::now(),
        })
    }

    /// The congestion control asked for (`CLINK_TCP_CC`), `None`: the host's.
    pub fn congestion(&self) -> Option<&str> {
        self.cfg.congestion.as_deref()
    }

    /// The addresses peers reach this endpoint at, preferred first.
    pub fn advertised(&self) -> &[SocketAddr] {
        &self.advertised
    }

    /// The interfaces those addresses are on.
    pub fn interfaces(&self) -> &[crate::sys::Iface] {
        &self.ifaces
    }

    /// The listening socket's descriptor (for epoll).
    pub fn listener_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// How often the links' acknowledgements are looked at for a host that is gone
    /// ([`link::TcpLink::host_gone`]): an eighth of the liveness timeout, at least 10 ms.
    pub fn acks_interval(&self) -> std::time::Duration {
        (self.cfg.dead_after / 8).max(std::time::Duration::from_millis(10))
    }

    /// When a look at the links' acknowledgements is due at `now`: the live links whose
    /// host has acknowledged nothing for too long ([`TcpLink::host_gone`]), with how long.
    pub fn hosts_gone(&mut self, now: std::time::Instant) -> Vec<(usize, std::time::Duration)> {
        if !self.acks_due(now) {
            return Vec::new();
        }
        let links = &mut self.links;
        self.peers
            .iter()
            .filter_map(|&i| {
                let l = links.get_mut(i)?.as_deref_mut()?;
                l.host_gone(now).map(|silent| (i, silent))
            })
            .collect()
    }

    /// True (and `now` noted) when a look at the links' acknowledgements is due.
    fn acks_due(&mut self, now: std::time::Instant) -> bool {
        if self.peers.is_empty()
            || now.saturating_duration_since(self.acks_checked) < self.acks_interval()
        {
            return false;
        }
        self.acks_checked = now;
        true
    }

    /// True while accepted connections wait for their hello.
    pub fn handshaking(&self) -> bool {
        !self.incoming.is_empty()
    }

    /// A link on `sock` (connected to the endpoint `remote_id`) with the hello queued; the
    /// caller drives it until its welcome arrives ([`TcpTransport::welcomed`]).
    pub fn hello(&self, sock: TcpStream, remote_id: u128) -> std::io::Result<TcpLink> {
        let mut link = TcpLink::new(sock, self.cfg.speculate, self.cfg.dead_after)?;
        link.remote_id = remote_id;
        link.queue_record(
            &Handshake {
                from: self.my_id,
                to: remote_id,
                status: 0,
                crossed: false,
            }
            .record(Kind::Hello),
        );
        Ok(link)
    }

    /// The outcome of a connection's handshake on the connecting side: `None` while no
    /// welcome has arrived, `Some(Ok)` when accepted, `Some(Err(why))` when refused.
    pub fn welcomed(link: &TcpLink) -> Option<std::result::Result<(), String>> {
        let (kind, hs) = link.handshake?;
        Some(match (kind, hs.status) {
            (Kind::Welcome, 0) if hs.from == link.remote_id => Ok(()),
            (Kind::Welcome, REFUSED_WRONG_ID) => Err(format!(
                "the endpoint listening there is not {:032x} (a stale address: that endpoint is gone)",
                link.remote_id
            )),
            (Kind::Welcome, s) => Err(format!(
                "refused (welcome status {s}, from endpoint {:032x})",
                hs.from
            )),
            (k, _) => Err(format!("answered a hello with a {k:?} record")),
        })
    }

    /// Accepts new connections (non-blocking); returns their descriptors, to be watched
    /// until their hello arrives.
    pub fn accept_new(&mut self) -> Vec<RawFd> {
        let mut fds = Vec::new();
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    match TcpLink::new(sock, self.cfg.speculate, self.cfg.dead_after) {
                        Ok(link) => {
                            fds.push(link.fd());
                            self.incoming.push(Incoming {
                                link,
                                since: Instant::now(),
                            });
                        }
                        Err(e) => tracing::warn!("TCP accept: {e}"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors and the like: try again at the next readiness.
                    tracing::warn!("TCP accept: {e}");
                    break;
                }
            }
        }
        fds
    }

    /// Reads the hellos of accepted connections: a hello naming this endpoint is
    /// welcomed, one naming another is refused (the welcome says why), a malformed one or
    /// none within `timeout` drops the connection. `connecting`: the endpoint a connect of
    /// this one's is under way to (a hello from it crossed that connect, and the welcome
    /// says so).
    pub fn poll_incoming(&mut self, timeout: Duration, connecting: Option<u128>) -> Handshakes {
        let mut out = Handshakes::default();
        let my_id = self.my_id;
        let mut i = 0;
        while i < self.incoming.len() {
            let inc = &mut self.incoming[i];
            let r = inc.link.receive();
            let verdict = match (r, inc.link.handshake) {
                (_, Some((Kind::Hello, hs))) => {
                    let ok = hs.to == my_id;
                    let crossed = ok && connecting == Some(hs.from);
                    let answer = Handshake {
                        from: my_id,
                        to: hs.from,
                        status: if ok { 0 } else { REFUSED_WRONG_ID },
                        crossed,
                    };
                    inc.link.queue_record(&answer.record(Kind::Welcome));
                    let wrote = inc.link.write();
                    if ok {
                        inc.link.remote_id = hs.from;
                        inc.link.crossed = crossed;
                        Some(wrote.map_err(|e| e.to_string()))
                    } else {
                        Some(Err(format!(
                            "TCP hello for endpoint {:032x}, this is {my_id:032x} (a stale address)",
                            hs.to
                        )))
                    }
                }
                (_, Some((k, _))) => Some(Err(format!("TCP connection opened with a {k:?}"))),
                (Err(LinkError::Closed), None) => {
                    out.abandoned += 1;
                    self.incoming.swap_remove(i);
                    continue;
                }
                (Err(e), None) => Some(Err(format!("TCP connection before its hello: {e}"))),
                (Ok(_), None) if inc.since.elapsed() >= timeout => {
                    Some(Err(format!("TCP connection silent for {timeout:?}")))
                }
                (Ok(_), None) => None,
            };
            match verdict {
                None => i += 1,
                Some(v) => {
                    let inc = self.incoming.swap_remove(i);
                    match v {
                        Ok(_) => out.accepted.push(inc.link),
                        Err(why) => {
                            tracing::warn!("incoming TCP connection refused: {why}");
                            inc.link.shutdown();
                            out.dropped.push(why);
                        }
                    }
                }
            }
        }
        out
    }
}
