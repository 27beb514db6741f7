//! The plug-in interface between the harness and a system under test.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;

/// How a channel waits for data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Spin: non-blocking operations retried until they complete.
    Busy,
    /// Block in the kernel until data or buffer space is available.
    Blocking,
    /// Each system's own default waiting: clink spins for its default spin time, then
    /// sleeps; the kernel's sockets and the other systems block as in `Blocking`.
    Spin,
}

impl Mode {
    /// Both modes, in the order they are run.
    pub const ALL: [Mode; 2] = [Mode::Busy, Mode::Blocking];

    /// The name used on the command line and in the `mode` JSON field.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Busy => "busy",
            Mode::Blocking => "blocking",
            Mode::Spin => "spin",
        }
    }

    /// Parses `busy` or `blocking`.
    pub fn parse(text: &str) -> Result<Mode, String> {
        match text {
            "busy" => Ok(Mode::Busy),
            "blocking" => Ok(Mode::Blocking),
            "spin" => Ok(Mode::Spin),
            other => Err(format!(
                "unknown mode {other:?} (expected busy, blocking or spin)"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One side of a connected two-process message channel driven by the harness.
///
/// A channel is used by one thread only; it need not be `Send` or `Sync`.
pub trait Channel {
    /// Copies of each payload byte of a `size`-byte message on this path (documented
    /// property of the system, or measured by it).
    fn copies_per_byte(&self, size: usize) -> f64;
    /// Human label of the transport, for the `transport` JSON field.
    fn transport(&self) -> String;
    /// Send one message of exactly `buf.len()` bytes.
    fn send(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Receive one message of exactly `buf.len()` bytes into `buf`.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()>;
    /// Send `count` messages of `buf.len()` bytes back to back; implementations may pipeline.
    fn send_stream(&mut self, buf: &[u8], count: usize) -> io::Result<()> {
        for _ in 0..count {
            self.send(buf)?;
        }
        Ok(())
    }
    /// Receive `count` messages of `buf.len()` bytes.
    fn recv_stream(&mut self, buf: &mut [u8], count: usize) -> io::Result<()> {
        for _ in 0..count {
            self.recv(buf)?;
        }
        Ok(())
    }
    /// Payload bytes the last [`Channel::recv_stream`] actually received, for channels
    /// that may lose data (plain UDP); `None` (the default) means a reliable channel that
    /// received every byte.
    fn stream_received(&self) -> Option<u64> {
        None
    }
    /// Whether every byte sent arrives (false for plain UDP); unreliable channels get a
    /// `lost_pct` field on their bandwidth rows.
    fn reliable(&self) -> bool {
        true
    }
}

/// Accepts the one client of a listening server side (may block until it connects).
pub type Acceptor = Box<dyn FnOnce() -> io::Result<Box<dyn Channel>>>;

/// How a system makes its two sides.
pub trait System {
    /// Name used in `--systems` and in the `system` JSON field.
    fn name(&self) -> &'static str;
    /// Server side: bind/listen, return the address string for the client and a closure/object that accepts.
    ///
    /// The address must be a single line without newlines; the harness passes
    /// it verbatim to [`System::connect`] in the client process.
    ///
    /// `advertise`: `None` on the host (IP systems bind 127.0.0.1); with
    /// `--placement netns` the address of this side's namespace, which IP systems
    /// put in their address string (binding 0.0.0.0). Systems that choose their own
    /// address (clink) or use no IP (Unix sockets) ignore it.
    fn listen(&self, mode: Mode, advertise: Option<Ipv4Addr>) -> io::Result<(String, Acceptor)>;
    /// Client side: connect to the address printed by the server.
    fn connect(&self, mode: Mode, addr: &str) -> io::Result<Box<dyn Channel>>;
}
