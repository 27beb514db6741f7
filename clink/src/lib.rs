//! clink: user-level, zero-copy communication between processes.
//!
//! ```no_run
//! use clink::{Context, Selector};
//! # fn main() -> clink::Result<()> {
//! let ctx = Context::new()?;                 // configuration from CLINK_* variables
//! let mut ep = ctx.endpoint()?;
//! println!("{}", ep.address());             // give this string to the other process
//! let peer = ep.accept(None)?;              // ... which calls ep.connect(&address)
//! let mut buf = vec![0u8; 1 << 20];
//! let st = ep.recv(Selector::exact(Some(peer), 7), &mut buf)?;
//! ep.send(peer, 8, &buf[..st.len as usize])?;
//! # Ok(()) }
//! ```
//!
//! Copies per byte on the same host: eager messages 2 (into the ring, out of it), 1 with
//! [`Endpoint::claim`] or [`Endpoint::recv_in_place`], 0 with both; rendezvous messages 1
//! (a single `process_vm_readv` from the sender's buffer into the receive buffer), or 2
//! through the two-copy pipeline (chosen when faster, or where CMA is not permitted).
//!
//! Between hosts the same API runs over UDP ([`config::UdpConfig`]): a reliable connection per
//! peer, batched system calls with segmentation offload and receive coalescing, and
//! rendezvous payloads received speculatively straight into the posted buffer. Where UDP is
//! not wanted or not reachable, over TCP ([`config::TcpConfig`], `CLINK_TRANSPORT=tcp` or a peer
//! that offers only TCP): one connection per peer, rendezvous payloads written from the
//! send buffer and read by one vectored read into the posted buffer. Data moves only
//! when the application calls in (any operation, or [`Endpoint::progress`]), but liveness
//! does not depend on it: a process may compute for any length of time between calls
//! without its network peers declaring it dead (a keepalive thread per endpoint pings its
//! UDP peers while it is away; TCP connections are kept by the kernel's keepalives). A
//! peer process that exits or is killed is seen at once (TCP: its kernel closes the
//! connection; UDP: its host answers "port unreachable"), a host or path that is gone
//! after `CLINK_NET_DEAD_MS` (2 s); what it sent and this host received before is
//! delivered first. A process that is stopped (SIGSTOP, Ctrl-Z, a debugger's breakpoint)
//! answers nothing over UDP, its keepalive thread stopped with it: its UDP peers declare it
//! dead after `CLINK_NET_DEAD_MS`, where its TCP peers do not (its kernel answers for it);
//! debug over TCP (`CLINK_TRANSPORT=tcp`) or with a longer `CLINK_NET_DEAD_MS`. A process
//! should drop or [`Endpoint::close`] its endpoint before it exits: over UDP the messages
//! not yet sent (a completed eager send may still be queued in the endpoint, behind the
//! congestion window) leave with the process otherwise, as they would not from a kernel
//! TCP socket or a ring.
#![warn(missing_docs)]
// `unsafe` only where memory Rust does not own is touched, in the modules that allow it
// below and in `endpoint::lend` and `transport::shm` (ARCHITECTURE.md, "Where unsafe lives").
#![deny(unsafe_code)]

mod calibrate;
pub mod config;
mod context;
mod endpoint;
mod error;
pub mod events;
#[allow(unsafe_code)]
pub(crate) mod evq;
pub mod launcher;
#[allow(unsafe_code)]
mod lease;
pub mod netdev;
mod oversub;
pub mod patterns;
pub mod rma;
pub mod stats;
// Not part of the API: the system-call layer and the transports are public for clink's
// own crates (the CLI, the bindings, the test bed) and its tests only.
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod sys;
#[doc(hidden)]
pub mod transport;

pub use clink_proto::cost::Rndv;
pub use clink_proto::matching::Selector;
pub use clink_proto::reliable::Stats as ConnStats;
pub use clink_proto::PeerId;
pub use config::Config;
pub use context::Context;
pub use endpoint::{
    Endpoint, InPlace, Joined, Received, RecvRequest, SendRequest, SendSlot, Status,
};
pub use error::{Error, Result};
pub use stats::Stats;
