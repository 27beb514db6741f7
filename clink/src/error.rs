use clink_proto::PeerId;
use std::io;
use thiserror::Error;

/// Errors of the clink runtime.
#[derive(Debug, Error)]
pub enum Error {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// A configuration value is invalid.
    #[error("bad configuration: {0}")]
    Config(String),
    /// Bytes from a peer broke the protocol.
    #[error("protocol error from {peer}: {source}")]
    Proto {
        /// The offending peer.
        peer: PeerId,
        /// What was wrong.
        source: clink_proto::ProtoError,
    },
    /// A peer's shared ring broke the protocol.
    #[error("corrupt ring from {peer}: {source}")]
    Ring {
        /// The offending peer.
        peer: PeerId,
        /// What was wrong.
        source: crate::transport::shm::ring::RingError,
    },
    /// An address string could not be used.
    #[error("bad address: {0}")]
    Address(#[from] clink_proto::ProtoError),
    /// Connecting failed.
    #[error("cannot connect to {addr}: {why}")]
    Connect {
        /// Address tried.
        addr: String,
        /// Why it failed.
        why: String,
    },
    /// The peer exited, was killed, or broke the protocol; its operations fail.
    #[error("{0} is gone (exited, killed or disconnected)")]
    PeerDead(PeerId),
    /// No such peer on this endpoint.
    #[error("unknown {0}")]
    UnknownPeer(PeerId),
    /// The message was longer than the receive buffer; the buffer holds its first bytes.
    #[error("message truncated: {len} bytes sent, receive buffer holds {capacity}")]
    Truncated {
        /// Real message length.
        len: u64,
        /// Receive buffer capacity.
        capacity: u64,
    },
    /// A wait ran out of time; the request is still pending.
    #[error("timed out")]
    Timeout,
    /// The request was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The request's result was already taken.
    #[error("request already completed and consumed")]
    Consumed,
    /// A size is outside what the operation supports.
    #[error("{0}")]
    TooLarge(String),
    /// The target of a one-sided access refused it (bad, revoked or forged cookie, access
    /// out of the exported window, missing right), or a local check did.
    #[error("access refused by {peer}: {}", .status.describe())]
    Refused {
        /// The target (the owner of the aperture).
        peer: PeerId,
        /// Why.
        status: clink_proto::rma::Status,
    },
    /// An argument is invalid (an aperture, tripwire or pattern argument, or a limit such
    /// as the RPC client's requests in flight), or a pattern's peer wrote a value it cannot
    /// have written honestly (a stream counter, mailbox length, cookie size or window size
    /// out of range).
    #[error("{0}")]
    Invalid(String),
    /// No launcher (mpirun, srun) started this process, or its PMIx service failed.
    #[error("launcher: {0}")]
    Launcher(String),
    /// The endpoint was used from a forked child process.
    #[error("endpoint used after fork (created by pid {0}); create a new Context in the child")]
    Forked(i32),
}

/// Result with the runtime's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

impl Error {
    /// A failed connect to `addr`, for the reason `why`.
    pub(crate) fn connect(addr: &str, why: String) -> Error {
        Error::Connect {
            addr: addr.to_string(),
            why,
        }
    }
}

impl From<clink_proto::msg::Failure> for Error {
    fn from(f: clink_proto::msg::Failure) -> Error {
        use clink_proto::msg::Failure;
        match f {
            Failure::PeerDead(p) => Error::PeerDead(p),
            Failure::Cancelled => Error::Cancelled,
            Failure::Truncated { len, capacity } => Error::Truncated { len, capacity },
            Failure::Read { peer, source } => Error::Io {
                what: format!("reading rendezvous message from {peer}"),
                source,
            },
        }
    }
}
