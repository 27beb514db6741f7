//! Connecting to a peer on another host over UDP, and falling back to TCP where UDP is
//! blocked.

use super::link::Link;
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

impl Endpoint {
    /// Connects over UDP to the endpoint `id` at `dest` (hello / welcome, the hello repeated
    /// until answered or the connect timeout). When its address offers TCP too (`tcp`) and
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
        id: u128,
        tcp: Option<SocketAddr>,
    ) -> Result<PeerId> {
        let fail = |why: String| Error::connect(addr, why);
        let net = self.net.as_mut().ok_or_else(|| {
            fail("the endpoint is on another host and this endpoint's UDP transport is off (CLINK_UDP=off)".into())
        })?;
        let token = net.start_connect(dest, id)?;
        let start = Instant::now();
        let deadline = start + self.ctx.config.connect_timeout;
        // When to try TCP, and where; `None` once tried (or never to be).
        let mut fallback = (self.tcp.is_some())
            .then_some(tcp)
            .flatten()
            .zip(net.fallback_after())
            .map(|(to, after)| (to, (start + after).min(deadline)));
        // The TCP connection being made, and once made, when UDP's last chance ends.
        let mut connecting: Option<(TcpConnecting, SocketAddr)> = None;
        let mut made: Option<(TcpStream, SocketAddr, Instant)> = None;
        let mut tcp_failed = None;
        loop {
            // Serve everything else meanwhile (mutual connects must not deadlock).
            self.progress();
            let net = self.net.as_mut().expect("checked above");
            if let Some(link) = net.connected(token) {
                // (A TCP connection made meanwhile closes unused: the peer drops it.)
                drop((connecting, made));
                let id = self.add_peer(Link::Udp(Box::new(link)))?;
                // Its first datagram (a ping) takes the connection up at the acceptor.
                self.kick(id.0 as usize);
                return Ok(id);
            }
            let now = Instant::now();
            if let Some((sock, to, _)) = made.take_if(|(_, _, until)| now >= *until) {
                net.abandon(token);
                self.stats.udp_fallbacks += 1;
                let waited = now - start;
                tracing::warn!(
                    "no answer over UDP from {dest} within {waited:?}: connected over TCP to {to}"
                );
                let tcp = self.tcp.as_ref().expect("fallback only with TCP on");
                let link = tcp
                    .hello(sock, id)
                    .map_err(|e| fail(format!("TCP connection to {to}: {e}")))?;
                return self.tcp_welcome(addr, to, link, deadline).map_err(|e| match e {
                    Error::Connect { addr, why } => Error::Connect {
                        addr,
                        why: format!("no answer over UDP from {dest} within {waited:?}, and over TCP: {why}"),
                    },
                    e => e,
                });
            }
            if let Some((to, _)) = fallback.take_if(|&mut (_, at)| now >= at && at < deadline) {
                match TcpConnecting::start(to) {
                    Ok(c) => connecting = Some((c, to)),
                    Err(e) => tcp_failed = Some(format!("; TCP connect to {to}: {e}")),
                }
            }
            if let Some((c, to)) = connecting.take() {
                let up = match c.poll() {
                    Ok(false) => {
                        connecting = Some((c, to));
                        None
                    }
                    Ok(true) => Some(c.into_stream()),
                    Err(e) => Some(Err(e)),
                };
                match up {
                    Some(Ok(sock)) => {
                        net.hello_now(token);
                        let until = (Instant::now() + UDP_LAST_CHANCE).min(deadline);
                        made = Some((sock, to, until));
                    }
                    Some(Err(e)) => tcp_failed = Some(format!("; TCP connect to {to}: {e}")),
                    None => {}
                }
            }
            if Instant::now() >= deadline && made.is_none() {
                self.net.as_mut().expect("checked above").abandon(token);
                let tcp = tcp_failed.or_else(|| {
                    let (_, to) = connecting.as_ref()?;
                    Some(format!("; TCP connect to {to}: no answer either"))
                });
                return Err(fail(format!(
                    "no answer from {dest} within {:?} (no endpoint with that id listens there, or the network drops everything){}",
                    self.ctx.config.connect_timeout,
                    tcp.unwrap_or_default()
                )));
            }
            std::hint::spin_loop();
        }
    }
}
