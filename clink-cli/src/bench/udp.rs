//! Kernel UDP baseline: fixed-size messages as datagrams over one connected socket pair.
//!
//! **No reliability.** This is plain UDP: nothing is acknowledged, retransmitted or
//! reordered. It is the floor that a reliable datagram protocol (clink's UDP transport)
//! is measured against, not a competitor that does the same work.
//!
//! - **Messages.** A message of up to [`MAX_DATAGRAM`] (65507 = 64 KiB - 1 - 28) bytes is
//!   one datagram; a larger one is cut into datagrams of at most [`MAX_DATAGRAM`] bytes
//!   that the receiver reassembles in order (loopback and veth do not reorder one flow).
//!   A zero-length message is a zero-length datagram.
//! - **Latency** (ping-pong): with one message in flight nothing is lost in practice; a
//!   lost datagram shows as an error after [`RECV_TIMEOUT`], never as a hang.
//! - **Bandwidth** (stream): the sender sends every datagram of every message back to back,
//!   then a zero-length *end marker* (data datagrams are never empty: bandwidth sizes are
//!   positive). The receiver lands each datagram at its place in the message buffer and
//!   counts the bytes it actually got until the end marker, and reports that count
//!   ([`Channel::stream_received`]): the harness computes **goodput** from it and notes the
//!   loss. A receiver that falls behind overflows its socket buffer and the kernel drops
//!   datagrams (the end marker too), so while the sender waits for the receiver's answer it
//!   resends the end marker every [`END_RESEND`]; a stale marker that arrives later is a
//!   zero-length datagram where a non-empty message is expected, and is skipped. The
//!   payload check of the harness runs on a round that lost nothing (a lossy check round is
//!   repeated).
//! - **Waiting.** Busy mode spins on `recv(MSG_DONTWAIT)` / `send(MSG_DONTWAIT)` returning
//!   `EAGAIN`; blocking mode blocks in the kernel.
//! - **Buffers.** Socket buffers are 32 MiB each way (`SO_RCVBUFFORCE` /
//!   `SO_SNDBUFFORCE` as root, else whatever `SO_RCVBUF` / `SO_SNDBUF` grants).
//!
//! Copies per byte: 2 (sender's buffer -> kernel, kernel -> receiver's buffer).
//!
//! Address: `IP:PORT`. On the host the server binds 127.0.0.1; with an advertised address
//! (`--placement netns`) it binds 0.0.0.0 and prints the advertised IP. The two sides meet
//! with a hello datagram from the client answered by the server, after which both sockets
//! are `connect`ed to each other.

use std::io::{self, ErrorKind};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use super::channel::{Acceptor, Channel, Mode, System};
use super::sockets::{transport_label, KERNEL_SOCKET_COPIES};

/// Largest UDP payload over IPv4 (65535 - 8 UDP - 20 IP header bytes).
pub const MAX_DATAGRAM: usize = 65_507;
/// Requested socket buffer size, each direction.
const SOCKET_BUFFER: usize = 32 << 20;
/// Bound on waiting for any one datagram.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(30);
/// Interval between end-marker resends while the sender waits for the receiver's answer.
pub const END_RESEND: Duration = Duration::from_millis(1);
/// Spins between clock reads in busy mode.
const SPINS_PER_CLOCK: u32 = 256;
/// The client's hello and the server's answer.
const HELLO: &[u8] = b"clink-bench-udp-hello";
const HELLO_ACK: &[u8] = b"clink-bench-udp-hello-ack";
/// Handshake: attempts and wait per attempt.
const HELLO_TRIES: u32 = 10;
const HELLO_WAIT: Duration = Duration::from_secs(1);

/// The kernel UDP system.
pub struct UdpSystem;

impl System for UdpSystem {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn listen(&self, mode: Mode, advertise: Option<Ipv4Addr>) -> io::Result<(String, Acceptor)> {
        let bind_ip = if advertise.is_some() {
            Ipv4Addr::UNSPECIFIED
        } else {
            Ipv4Addr::LOCALHOST
        };
        let sock = UdpSocket::bind((bind_ip, 0))?;
        set_buffers(&sock);
        let shown = advertise.unwrap_or(Ipv4Addr::LOCALHOST);
        let addr = SocketAddr::from((shown, sock.local_addr()?.port()));
        let label = transport_label(shown.into());
        let accept: Acceptor = Box::new(move || {
            sock.set_read_timeout(Some(RECV_TIMEOUT))?;
            let mut buf = [0u8; 64];
            let from = loop {
                let (n, from) = sock.recv_from(&mut buf)?;
                if &buf[..n] == HELLO {
                    break from;
                }
            };
            sock.connect(from)?;
            sock.send(HELLO_ACK)?;
            Ok(Box::new(UdpChannel::new(sock, mode, label)?) as Box<dyn Channel>)
        });
        Ok((addr.to_string(), accept))
    }

    fn connect(&self, mode: Mode, addr: &str) -> io::Result<Box<dyn Channel>> {
        let server: SocketAddr = addr.parse().map_err(|e| {
            io::Error::new(
                ErrorKind::InvalidInput,
                format!("udp address {addr:?}: {e}"),
            )
        })?;
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        set_buffers(&sock);
        sock.connect(server)?;
        sock.set_read_timeout(Some(HELLO_WAIT))?;
        let mut buf = [0u8; 64];
        let mut answered = false;
        for _ in 0..HELLO_TRIES {
            sock.send(HELLO)?;
            match sock.recv(&mut buf) {
                Ok(n) if &buf[..n] == HELLO_ACK => {
                    answered = true;
                    break;
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
        if !answered {
            return Err(io::Error::new(
                ErrorKind::TimedOut,
                format!("no answer from the udp server at {addr} after {HELLO_TRIES} hellos"),
            ));
        }
        Ok(Box::new(UdpChannel::new(
            sock,
            mode,
            transport_label(server.ip()),
        )?))
    }
}

/// Best-effort large socket buffers (forced as root, else capped by the sysctl limits).
fn set_buffers(sock: &UdpSocket) {
    use rustix::net::sockopt as so;
    if so::set_socket_recv_buffer_size_force(sock, SOCKET_BUFFER).is_err() {
        let _ = so::set_socket_recv_buffer_size(sock, SOCKET_BUFFER);
    }
    if so::set_socket_send_buffer_size_force(sock, SOCKET_BUFFER).is_err() {
        let _ = so::set_socket_send_buffer_size(sock, SOCKET_BUFFER);
    }
}

/// One side of a connected UDP socket pair.
pub struct UdpChannel {
    sock: UdpSocket,
    busy: bool,
    transport: &'static str,
    /// An end marker was sent and nothing has come back yet: receiving resends it.
    end_pending: Option<Instant>,
    /// Bytes the last `recv_stream` got.
    last_stream: Option<u64>,
}

impl UdpChannel {
    fn new(sock: UdpSocket, mode: Mode, transport: &'static str) -> io::Result<Self> {
        sock.set_read_timeout(Some(RECV_TIMEOUT))?;
        sock.set_nonblocking(false)?;
        Ok(UdpChannel {
            sock,
            busy: mode == Mode::Busy,
            transport,
            end_pending: None,
            last_stream: None,
        })
    }

    /// Sends one datagram, retrying while the socket buffer is full.
    fn send_dgram(&self, buf: &[u8]) -> io::Result<()> {
        use rustix::io::Errno;
        use rustix::net::SendFlags;
        let flags = if self.busy {
            SendFlags::DONTWAIT
        } else {
            SendFlags::empty()
        };
        loop {
            match rustix::net::send(&self.sock, buf, flags) {
                Ok(n) if n == buf.len() => return Ok(()),
                Ok(n) => {
                    return Err(io::Error::other(format!(
                        "short datagram send: {n} of {} bytes",
                        buf.len()
                    )))
                }
                Err(Errno::AGAIN | Errno::NOBUFS) => std::hint::spin_loop(),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn send_end_marker(&mut self) -> io::Result<()> {
        self.send_dgram(&[])?;
        if self.end_pending.is_none() && !self.busy {
            // Blocking receives wake up to resend the marker.
            self.sock.set_read_timeout(Some(END_RESEND))?;
        }
        self.end_pending = Some(Instant::now());
        Ok(())
    }

    fn end_answered(&mut self) -> io::Result<()> {
        if self.end_pending.take().is_some() && !self.busy {
            self.sock.set_read_timeout(Some(RECV_TIMEOUT))?;
        }
        Ok(())
    }

    /// Receives one datagram into `buf`; returns its full length (which may exceed
    /// `buf.len()`: the rest was cut off). Resends a pending end marker while waiting.
    fn recv_dgram(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use rustix::io::Errno;
        use rustix::net::RecvFlags;
        let flags = if self.busy {
            RecvFlags::DONTWAIT | RecvFlags::TRUNC
        } else {
            RecvFlags::TRUNC
        };
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            match rustix::net::recv(&self.sock, &mut *buf, flags) {
                Ok((_, full)) => {
                    self.end_answered()?;
                    return Ok(full);
                }
                Err(Errno::AGAIN) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            // Nothing there: a busy spin, or a blocking receive's timeout.
            if self.busy {
                spins += 1;
                if spins < SPINS_PER_CLOCK {
                    std::hint::spin_loop();
                    continue;
                }
                spins = 0;
            }
            let now = Instant::now();
            if let Some(sent) = self.end_pending {
                if now.duration_since(sent) >= END_RESEND {
                    self.send_end_marker()?;
                }
            }
            if now.duration_since(start) >= RECV_TIMEOUT {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "no datagram for {RECV_TIMEOUT:?} (lost? plain UDP has no reliability)"
                    ),
                ));
            }
        }
    }
}

impl Channel for UdpChannel {
    fn copies_per_byte(&self, _size: usize) -> f64 {
        KERNEL_SOCKET_COPIES
    }

    fn transport(&self) -> String {
        self.transport.to_string()
    }

    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        if buf.is_empty() {
            return self.send_dgram(buf);
        }
        for chunk in buf.chunks(MAX_DATAGRAM) {
            self.send_dgram(chunk)?;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            let n = self.recv_dgram(buf)?;
            return if n == 0 {
                Ok(())
            } else {
                Err(io::Error::new(
                    ErrorKind::InvalidData,
                    format!("expected an empty datagram, got {n} bytes"),
                ))
            };
        }
        for chunk in buf.chunks_mut(MAX_DATAGRAM) {
            let n = loop {
                // A zero-length datagram here is a stale end marker: skip it.
                match self.recv_dgram(chunk)? {
                    0 => continue,
                    n => break n,
                }
            };
            if n != chunk.len() {
                return Err(io::Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "expected a datagram of {} bytes, got {n} (a lost datagram?)",
                        chunk.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn send_stream(&mut self, buf: &[u8], count: usize) -> io::Result<()> {
        for _ in 0..count {
            for chunk in buf.chunks(MAX_DATAGRAM) {
                self.send_dgram(chunk)?;
            }
        }
        self.send_end_marker()
    }

    fn recv_stream(&mut self, buf: &mut [u8], _count: usize) -> io::Result<()> {
        let size = buf.len();
        let mut got: u64 = 0;
        let mut off = 0usize;
        loop {
            let end = (off + MAX_DATAGRAM).min(size);
            let n = self.recv_dgram(&mut buf[off..end])?;
            if n == 0 {
                break; // the end marker
            }
            got += n as u64;
            // Next place: after this fragment; a short fragment ends a message (after a
            // loss the places are off until then, but such a round is not verified).
            off += n.min(end - off);
            if off >= size || n < MAX_DATAGRAM {
                off = 0;
            }
        }
        self.last_stream = Some(got);
        Ok(())
    }

    fn stream_received(&self) -> Option<u64> {
        self.last_stream
    }

    fn reliable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_carries_messages_of_every_size() {
        for mode in Mode::ALL {
            let (addr, accept) = UdpSystem.listen(mode, None).expect("listen");
            let client = std::thread::spawn(move || {
                let mut ch = UdpSystem.connect(mode, &addr).expect("connect");
                for size in [0usize, 1, 1000, MAX_DATAGRAM, MAX_DATAGRAM + 1, 200_000] {
                    let out: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                    ch.send(&out).expect("send");
                    let mut back = vec![0u8; size];
                    ch.recv(&mut back).expect("recv echo");
                    assert_eq!(back, out, "{mode} size {size}");
                }
                // A stream, then its answer.
                let msg = vec![7u8; 100_000];
                ch.send_stream(&msg, 5).expect("stream");
                let mut ack = [0u8; 8];
                ch.recv(&mut ack).expect("ack");
                assert!(u64::from_le_bytes(ack) <= 500_000);
                assert_eq!(ch.transport(), "loopback");
            });
            let mut server = accept().expect("accept");
            for size in [0usize, 1, 1000, MAX_DATAGRAM, MAX_DATAGRAM + 1, 200_000] {
                let mut buf = vec![0u8; size];
                server.recv(&mut buf).expect("recv");
                server.send(&buf).expect("echo");
            }
            let mut buf = vec![0u8; 100_000];
            server.recv_stream(&mut buf, 5).expect("recv stream");
            let got = server.stream_received().expect("udp counts bytes");
            assert!(got <= 500_000, "{got}");
            // Loss is possible (small socket buffers without root): check what arrived
            // only when nothing was lost.
            if got == 500_000 {
                assert_eq!(buf, vec![7u8; 100_000]);
            } else {
                eprintln!("udp test stream lost {} bytes", 500_000 - got);
            }
            server.send(&got.to_le_bytes()).expect("ack");
            client.join().expect("client");
        }
    }

    /// A receiver that falls behind loses datagrams (and, likely, the end marker): the
    /// stream still ends (the marker is resent) and the count shows the loss.
    #[test]
    fn lossy_stream_ends_and_counts() {
        for mode in Mode::ALL {
            let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            a.connect(b.local_addr().expect("addr")).expect("connect");
            b.connect(a.local_addr().expect("addr")).expect("connect");
            // The smallest receive buffer the kernel allows.
            rustix::net::sockopt::set_socket_recv_buffer_size(&b, 0).expect("rcvbuf");
            let sent = 200 * 10_000u64;
            let sender = std::thread::spawn(move || {
                let mut ch = UdpChannel::new(a, mode, "loopback").expect("channel");
                ch.send_stream(&[5u8; 10_000], 200).expect("stream");
                let mut ack = [0u8; 8];
                ch.recv(&mut ack).expect("ack");
                u64::from_le_bytes(ack)
            });
            let mut rx = UdpChannel::new(b, mode, "loopback").expect("channel");
            std::thread::sleep(Duration::from_millis(100));
            let mut buf = vec![0u8; 10_000];
            rx.recv_stream(&mut buf, 200).expect("recv stream");
            let got = rx.stream_received().expect("count");
            rx.send(&got.to_le_bytes()).expect("ack");
            assert_eq!(sender.join().expect("sender"), got);
            assert!(got < sent, "{mode}: nothing lost with a tiny buffer? {got}");
            assert_eq!(got % 10_000, 0, "{mode}: whole datagrams only");
            assert!(!rx.reliable());
        }
    }
}
