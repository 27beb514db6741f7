//! Kernel socket baselines: TCP (over loopback, or over the veth pair with
//! `--placement netns`) and Unix stream sockets. The UDP baseline is in [`super::udp`].
//!
//! Messages have a size both sides know, so framing is just `write_all` /
//! `read_exact`. In busy mode the socket is non-blocking and both loops spin
//! on `WouldBlock`. A stream cannot carry an empty message, so a zero-length
//! message travels as one byte (the same on both sides).
//!
//! Copies per byte: 2 (sender's buffer -> kernel socket buffer, kernel ->
//! receiver's buffer).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{SystemTime, UNIX_EPOCH};

use super::channel::{Acceptor, Channel, Mode, System};

/// Copies per payload byte through a kernel socket.
pub const KERNEL_SOCKET_COPIES: f64 = 2.0;

/// A fixed-size-message channel over any byte stream.
pub struct StreamChannel<S: Read + Write> {
    stream: S,
    busy: bool,
    transport: &'static str,
}

impl<S: Read + Write> StreamChannel<S> {
    /// Wraps a connected stream; `busy` must match the stream's non-blocking flag.
    pub fn new(stream: S, busy: bool, transport: &'static str) -> Self {
        StreamChannel {
            stream,
            busy,
            transport,
        }
    }

    fn write_all_spin(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.stream.write(buf) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_exact_spin(&mut self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.stream.read(buf) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl<S: Read + Write> Channel for StreamChannel<S> {
    fn copies_per_byte(&self, _size: usize) -> f64 {
        KERNEL_SOCKET_COPIES
    }

    fn transport(&self) -> String {
        self.transport.to_string()
    }

    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        let buf = if buf.is_empty() { &[0u8][..] } else { buf };
        if self.busy {
            self.write_all_spin(buf)
        } else {
            self.stream.write_all(buf)
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut token = [0u8; 1];
        let buf = if buf.is_empty() { &mut token[..] } else { buf };
        if self.busy {
            self.read_exact_spin(buf)
        } else {
            self.stream.read_exact(buf)
        }
    }
}

/// The `transport` label of an IP path: `loopback` for a loopback address, `veth`
/// otherwise (the harness's only other IP path is the veth pair of `--placement netns`).
pub fn transport_label(ip: IpAddr) -> &'static str {
    if ip.is_loopback() {
        "loopback"
    } else {
        "veth"
    }
}

/// Kernel TCP with `TCP_NODELAY`: over 127.0.0.1, or, with an advertised address,
/// listening on 0.0.0.0 and reached at that address.
pub struct TcpSystem;

fn tcp_channel(stream: TcpStream, mode: Mode) -> io::Result<Box<dyn Channel>> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(mode == Mode::Busy)?;
    let label = transport_label(stream.peer_addr()?.ip());
    Ok(Box::new(StreamChannel::new(
        stream,
        mode == Mode::Busy,
        label,
    )))
}

impl System for TcpSystem {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen(&self, mode: Mode, advertise: Option<Ipv4Addr>) -> io::Result<(String, Acceptor)> {
        let bind_ip = if advertise.is_some() {
            Ipv4Addr::UNSPECIFIED
        } else {
            Ipv4Addr::LOCALHOST
        };
        let listener = TcpListener::bind((bind_ip, 0))?;
        let port = listener.local_addr()?.port();
        let addr = format!("{}:{port}", advertise.unwrap_or(Ipv4Addr::LOCALHOST));
        let accept: Acceptor = Box::new(move || {
            let (stream, _) = listener.accept()?;
            tcp_channel(stream, mode)
        });
        Ok((addr, accept))
    }

    fn connect(&self, mode: Mode, addr: &str) -> io::Result<Box<dyn Channel>> {
        tcp_channel(TcpStream::connect(addr)?, mode)
    }
}

/// Unix stream socket bound to an abstract name (nothing is created on disk,
/// nothing is left behind after a crash).
pub struct UnixSystem;

fn unix_channel(stream: UnixStream, mode: Mode) -> io::Result<Box<dyn Channel>> {
    stream.set_nonblocking(mode == Mode::Busy)?;
    Ok(Box::new(StreamChannel::new(
        stream,
        mode == Mode::Busy,
        "unix",
    )))
}

/// Prefix of the printed address that marks an abstract socket name.
const ABSTRACT_PREFIX: &str = "@";

impl System for UnixSystem {
    fn name(&self) -> &'static str {
        "unix"
    }

    fn listen(&self, mode: Mode, _advertise: Option<Ipv4Addr>) -> io::Result<(String, Acceptor)> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("clink-bench-{}-{nanos:08x}", std::process::id());
        let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name)?)?;
        let accept: Acceptor = Box::new(move || {
            let (stream, _) = listener.accept()?;
            unix_channel(stream, mode)
        });
        Ok((format!("{ABSTRACT_PREFIX}{name}"), accept))
    }

    fn connect(&self, mode: Mode, addr: &str) -> io::Result<Box<dyn Channel>> {
        let name = addr.strip_prefix(ABSTRACT_PREFIX).ok_or_else(|| {
            io::Error::new(
                ErrorKind::InvalidInput,
                format!("unix address {addr:?} is not an abstract name (@...)"),
            )
        })?;
        let stream = UnixStream::connect_addr(&SocketAddr::from_abstract_name(name)?)?;
        unix_channel(stream, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(system: &dyn System, mode: Mode) -> (Box<dyn Channel>, Box<dyn Channel>) {
        let (addr, accept) = system.listen(mode, None).expect("listen");
        let client = system.connect(mode, &addr).expect("connect");
        let server = accept().expect("accept");
        (server, client)
    }

    #[test]
    fn sockets_carry_fixed_size_messages() {
        let systems: [&dyn System; 2] = [&TcpSystem, &UnixSystem];
        for system in systems {
            for mode in Mode::ALL {
                let (mut server, mut client) = pair(system, mode);
                for size in [0usize, 1, 100, 5000] {
                    let out: Vec<u8> = (0..size).map(|i| i as u8).collect();
                    client.send(&out).expect("send");
                    let mut back = vec![0u8; size];
                    server.recv(&mut back).expect("recv");
                    assert_eq!(back, out, "{} {mode} size {size}", system.name());
                }
                assert_eq!(client.copies_per_byte(64), 2.0);
            }
        }
    }
}
