//! Connecting to a peer on another host over UDP, and falling back to TCP where UDP is
//! blocked.

use super::Endpoint;
use crate::error::{Error, Result};
use crate::sys::TcpConnecting;
use clink_proto::PeerId;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long a connect that fell back to TCP still waits for UDP's welcome once its TCP
/// connection is made, the hello repeated (three hellos): the TCP connection proves the
/// path, so UDP silence now means UDP is blocked, not that the first packets were lost or
/// waited for an address resolution (the kernel repeats an ARP request after 1 s, as long
/// as the fallback's default wait).
pub(super) const UDP_LAST_CHANCE: Duration = Duration::from_millis(300);

/// Where a UDP connect's fall-back to TCP stands.
enum TcpLeg {
    /// None to make (the peer offers no TCP, the fall-back is off, or it would come after
    /// the connect timeout).
    Off,
    /// To start connecting to `to` at `at`.
    Due { to: SocketAddr, at: Instant },
    /// The TCP connection being made.
    Connecting { c: TcpConnecting, to: SocketAddr },
    /// Made; used if UDP stays silent until `until`.
    Made {
        sock: TcpStream,
        to: SocketAddr,
        until: Instant,
    },
    /// TCP failed too: why, for the connect's error.
    Failed(String),
}

impl Endpoint {
    /// Connects over UDP to the endpoint `id` at `dest` (hello / welcome, the hello repeated
    /// until answered or the connect timeout; from the fourth hello on, at the peer's other
    /// UDP addresses, `alternates`, too: the first to answer carries the connection). When its address offers TCP too (`tcp`) and
    /// UDP brings no welcome within `CLINK_UDP_FALLBACK_MS` (a firewall that drops UDP,
    /// say), it connects a TCP socket there without blocking (UDP may still answer
    /// meanwhile); the connection made proves the path works (a lost ARP or hello only
    /// delayed UDP), so UDP gets [`UDP_LAST_CHANCE`] more, its hello repeated, before the
    /// TCP connection is used. Whichever attempt is given up leaves nothing at
    /// the peer: it offers a UDP connection to its application only once the connector's
    /// first datagram after the welcome arrives, and drops a TCP one closed before its
    /// hello.
    pub(super) fn connect_udp(
        &mut self,
        addr: &str,
        dest: SocketAddr,
        alternates: Vec<SocketAddr>,
        id: u128,
        tcp: Option<SocketAddr>,
    ) -> Result<PeerId> {
        let fail = |why: String| Error::connect(addr, why);
        let net = self.nets.udp.as_mut().ok_or_else(|| {
            fail("the endpoint is on another host and this endpoint's UDP transport is off (CLINK_UDP=off)".into())
        })?;
        let token = net.start_connect(dest, alternates, id)?;
        let start = Instant::now();
        let deadline = start + self.ctx.config.connect_timeout;
        let mut tcp_leg = match (
            self.nets.tcp.is_some().then_some(tcp).flatten(),
            net.fallback_after(),
        ) {
            (Some(to), Some(after)) if start + after < deadline => TcpLeg::Due {
                to,
                at: start + after,
            },
            _ => TcpLeg::Off,
        };
        loop {
            // Serve everything else meanwhile (mutual connects must not deadlock).
            self.progress();
            let net = self.nets.udp.as_mut().expect("checked above");
            if let Some(link) = net.connected(token) {
                // (A TCP connection made meanwhile closes unused: the peer drops it.)
                drop(tcp_leg);
                let id = self.add_udp_peer(link, true)?;
                // Its first datagram (a ping) takes the connection up at the acceptor.
                self.kick(id.0 as usize);
                return Ok(id);
            }
            let now = Instant::now();
            let failed = |to: SocketAddr, e: std::io::Error| {
                TcpLeg::Failed(format!("; TCP connect to {to}: {e}"))
            };
            tcp_leg = match tcp_leg {
                TcpLeg::Due { to, at } if now >= at => {
                    match TcpConnecting::start(
                        to,
                        self.nets.tcp.as_ref().and_then(|t| t.congestion()),
                    ) {
                        Ok(c) => TcpLeg::Connecting { c, to },
                        Err(e) => failed(to, e),
                    }
                }
                TcpLeg::Connecting { c, to } => match c.poll() {
                    Ok(false) => TcpLeg::Connecting { c, to },
                    Ok(true) => match c.into_stream() {
                        Ok(sock) => {
                            net.hello_now(token);
                            let until = (now + UDP_LAST_CHANCE).min(deadline);
                            TcpLeg::Made { sock, to, until }
                        }
                        Err(e) => failed(to, e),
                    },
                    Err(e) => failed(to, e),
                },
                TcpLeg::Made { sock, to, until } if now >= until => {
                    net.abandon(token);
                    return self.fall_back(addr, dest, id, (sock, to), now - start, deadline);
                }
                leg => leg,
            };
            if now >= deadline && !matches!(tcp_leg, TcpLeg::Made { .. }) {
                self.nets
                    .udp
                    .as_mut()
                    .expect("checked above")
                    .abandon(token);
                let tcp = match tcp_leg {
                    TcpLeg::Failed(why) => why,
                    TcpLeg::Connecting { to, .. } => {
                        format!("; TCP connect to {to}: no answer either")
                    }
                    _ => String::new(),
                };
                return Err(fail(format!(
                    "no answer from {dest} within {:?} (no endpoint with that id listens there, or the network drops everything){tcp}",
                    self.ctx.config.connect_timeout,
                )));
            }
            std::hint::spin_loop();
        }
    }

    /// Gives UDP up after `waited` and completes the handshake over the TCP connection
    /// `made` (its socket, where it goes) by `deadline`.
    fn fall_back(
        &mut self,
        addr: &str,
        dest: SocketAddr,
        id: u128,
        made: (TcpStream, SocketAddr),
        waited: Duration,
        deadline: Instant,
    ) -> Result<PeerId> {
        let (sock, to) = made;
        self.stats.udp_fallbacks += 1;
        tracing::warn!(
            "no answer over UDP from {dest} within {waited:?}: connected over TCP to {to}"
        );
        let tcp = self.nets.tcp.as_ref().expect("fallback only with TCP on");
        let link = tcp
            .hello(sock, id)
            .map_err(|e| Error::connect(addr, format!("TCP connection to {to}: {e}")))?;
        self.tcp_welcome(addr, to, link, deadline)
            .map_err(|e| match e {
                Error::Connect { addr, why } => Error::Connect {
                    addr,
                    why: format!(
                        "no answer over UDP from {dest} within {waited:?}, and over TCP: {why}"
                    ),
                },
                e => e,
            })
    }
}
