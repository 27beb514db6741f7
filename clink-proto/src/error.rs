use thiserror::Error;

/// Everything that can be wrong with bytes that came from outside the process.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The input ended before the structure it announced.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being parsed.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Wrong magic number: not a clink peer.
    #[error("bad magic {0:#010x}: not a clink peer")]
    BadMagic(u32),
    /// A peer speaks another protocol version.
    #[error("unsupported protocol version {got} (this build speaks {want})")]
    BadVersion {
        /// Version received.
        got: u16,
        /// Version spoken here.
        want: u16,
    },
    /// Unknown frame kind byte.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// A handshake message of another type than the one expected at this step.
    #[error("expected a {want} message, got handshake message type {got}")]
    UnexpectedMessage {
        /// The message expected.
        want: &'static str,
        /// The type byte received.
        got: u8,
    },
    /// A length or index field is outside the range the receiver allows.
    #[error("{what} out of range: {value} (limit {limit})")]
    OutOfRange {
        /// Field name.
        what: &'static str,
        /// Value received.
        value: u64,
        /// Largest allowed value.
        limit: u64,
    },
    /// An address string could not be understood.
    #[error("bad address {addr:?}: {why}")]
    BadAddress {
        /// The offending text.
        addr: String,
        /// What is wrong with it.
        why: &'static str,
    },
}
