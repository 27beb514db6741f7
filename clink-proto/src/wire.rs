//! Wire formats: frames carried in one ring record, and the connection handshake.
//!
//! A ring record carries exactly one [`Frame`]. Every integer is little-endian. Parsing is
//! total: any byte string yields either a frame that borrows from it or a [`ProtoError`],
//! never a panic (see the property tests below; the RMA frames are also mutation-fuzzed in `tests/rma_fuzz.rs`).
//!
//! Frame layout: byte 0 is the kind, bytes 1..8 are reserved (zero), then the fixed fields of
//! that kind as `u64`s, then (for [`Frame::Eager`]) the payload. (RMA frames use bytes
//! 1..8 and a 128-bit key: see [`crate::rma`].)

use crate::le::{need, put_u128, put_u64, u128_at, u16_at, u32_at, u64_at};
use crate::ProtoError;

/// Protocol version spoken by this build; the handshake refuses any other (2: the split
/// rendezvous's [`Frame::Push`] and [`Frame::Pushed`]; 3: the welcome's
/// [`Welcome::crossed`] flag, which an older build would read as `cma_ok`).
pub const VERSION: u16 = 3;
/// Magic number opening every handshake message ("CLNK").
pub const MAGIC: u32 = 0x4b4e_4c43;

const K_EAGER: u8 = 1;
const K_RTS: u8 = 2;
const K_FIN: u8 = 3;
const K_CTS: u8 = 4;
const K_CHUNK: u8 = 5;
const K_CANCEL: u8 = 6;
const K_CANCEL_ACK: u8 = 7;
const K_CLOSE: u8 = 8;
const K_PUSH: u8 = 9;
const K_PUSHED: u8 = 10;

/// Size of the fixed part of an eager frame; the payload follows it.
pub const EAGER_HEADER: usize = 16;
/// Size of the fixed part of a chunk frame; the chunk's bytes follow it.
pub const CHUNK_HEADER: usize = 24;

/// One protocol frame, borrowing its payload from the record it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole small message, copied inline.
    Eager {
        /// Message tag.
        tag: u64,
        /// Message bytes.
        data: &'a [u8],
    },
    /// Request to send: a large message waits in the sender's memory at `addr`.
    Rts {
        /// Message tag.
        tag: u64,
        /// Message length in bytes.
        len: u64,
        /// Sender's handle for this send.
        send_id: u64,
        /// Address of the message in the sender's address space (for a CMA read).
        addr: u64,
    },
    /// The receiver is done with a rendezvous send (read it, or discarded it).
    Fin {
        /// The send this concludes.
        send_id: u64,
    },
    /// The receiver matched a rendezvous send and asks for it in chunks through the ring.
    Cts {
        /// The send being answered.
        send_id: u64,
    },
    /// One chunk of a pipelined rendezvous send, carried in the ring.
    Chunk {
        /// The send it belongs to.
        send_id: u64,
        /// Offset of the chunk in the message.
        offset: u64,
        /// The chunk's bytes.
        data: &'a [u8],
    },
    /// The sender withdraws an unmatched rendezvous send.
    Cancel {
        /// The send withdrawn.
        send_id: u64,
    },
    /// Answer to [`Frame::Cancel`]: whether it was withdrawn before being matched.
    CancelAck {
        /// The send concerned.
        send_id: u64,
        /// True when the receiver had not matched it and dropped it.
        cancelled: bool,
    },
    /// Orderly goodbye: no further frames follow.
    Close,
    /// The receiver of a rendezvous send (read with CMA) asks the sender to write the
    /// message's first `len` bytes into the receiver's memory at `addr` (a CMA write)
    /// while it reads the rest itself: both cores copy at once.
    Push {
        /// The send being answered.
        send_id: u64,
        /// Address of the posted buffer in the receiver's address space.
        addr: u64,
        /// Bytes to write, from the start of the message.
        len: u64,
    },
    /// Answer to [`Frame::Push`]: the sender wrote its part (`ok`) or could not (the
    /// receiver then reads that part itself).
    Pushed {
        /// The send concerned.
        send_id: u64,
        /// True when the write succeeded.
        ok: bool,
    },
    /// One-sided access to an aperture (see [`crate::rma`]).
    Rma(crate::rma::RmaFrame<'a>),
}

impl<'a> Frame<'a> {
    /// Parses one frame from a record's bytes.
    pub fn parse(b: &'a [u8]) -> Result<Frame<'a>, ProtoError> {
        need("frame", b, 8)?;
        let f = match b[0] {
            K_EAGER => {
                need("eager frame", b, EAGER_HEADER)?;
                Frame::Eager {
                    tag: u64_at(b, 8),
                    data: &b[EAGER_HEADER..],
                }
            }
            K_RTS => {
                need("rts frame", b, 40)?;
                Frame::Rts {
                    tag: u64_at(b, 8),
                    len: u64_at(b, 16),
                    send_id: u64_at(b, 24),
                    addr: u64_at(b, 32),
                }
            }
            K_FIN => {
                need("fin frame", b, 16)?;
                Frame::Fin {
                    send_id: u64_at(b, 8),
                }
            }
            K_CTS => {
                need("cts frame", b, 16)?;
                Frame::Cts {
                    send_id: u64_at(b, 8),
                }
            }
            K_CHUNK => {
                need("chunk frame", b, CHUNK_HEADER)?;
                Frame::Chunk {
                    send_id: u64_at(b, 8),
                    offset: u64_at(b, 16),
                    data: &b[CHUNK_HEADER..],
                }
            }
            K_CANCEL => {
                need("cancel frame", b, 16)?;
                Frame::Cancel {
                    send_id: u64_at(b, 8),
                }
            }
            K_CANCEL_ACK => {
                need("cancel-ack frame", b, 16)?;
                Frame::CancelAck {
                    send_id: u64_at(b, 8),
                    cancelled: b[1] != 0,
                }
            }
            K_CLOSE => Frame::Close,
            K_PUSH => {
                need("push frame", b, 32)?;
                Frame::Push {
                    send_id: u64_at(b, 8),
                    addr: u64_at(b, 16),
                    len: u64_at(b, 24),
                }
            }
            K_PUSHED => {
                need("pushed frame", b, 16)?;
                Frame::Pushed {
                    send_id: u64_at(b, 8),
                    ok: b[1] != 0,
                }
            }
            k if crate::rma::is_rma_kind(k) => Frame::Rma(crate::rma::RmaFrame::parse(b)?),
            k => return Err(ProtoError::BadKind(k)),
        };
        Ok(f)
    }

    /// Bytes [`Frame::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        match self {
            Frame::Eager { data, .. } => EAGER_HEADER + data.len(),
            Frame::Rts { .. } => 40,
            Frame::Push { .. } => 32,
            Frame::Chunk { data, .. } => CHUNK_HEADER + data.len(),
            Frame::Close => 8,
            Frame::Rma(r) => r.encoded_len(),
            _ => 16,
        }
    }

    /// Writes the frame into `out`, which must hold [`Frame::encoded_len`] bytes; returns
    /// the number of bytes written.
    ///
    /// # Panics
    /// If `out` is shorter than `encoded_len()` (a caller bug, not outside input).
    pub fn encode(&self, out: &mut [u8]) -> usize {
        if let Frame::Rma(r) = self {
            return r.encode(out);
        }
        let n = self.encoded_len();
        let out = &mut out[..n];
        out[..8].fill(0);
        match *self {
            Frame::Eager { tag, data } => {
                out[0] = K_EAGER;
                put_u64(out, 8, tag);
                out[EAGER_HEADER..].copy_from_slice(data);
            }
            Frame::Rts {
                tag,
                len,
                send_id,
                addr,
            } => {
                out[0] = K_RTS;
                put_u64(out, 8, tag);
                put_u64(out, 16, len);
                put_u64(out, 24, send_id);
                put_u64(out, 32, addr);
            }
            Frame::Fin { send_id } => {
                out[0] = K_FIN;
                put_u64(out, 8, send_id);
            }
            Frame::Cts { send_id } => {
                out[0] = K_CTS;
                put_u64(out, 8, send_id);
            }
            Frame::Chunk {
                send_id,
                offset,
                data,
            } => {
                out[0] = K_CHUNK;
                put_u64(out, 8, send_id);
                put_u64(out, 16, offset);
                out[CHUNK_HEADER..].copy_from_slice(data);
            }
            Frame::Cancel { send_id } => {
                out[0] = K_CANCEL;
                put_u64(out, 8, send_id);
            }
            Frame::CancelAck { send_id, cancelled } => {
                out[0] = K_CANCEL_ACK;
                out[1] = u8::from(cancelled);
                put_u64(out, 8, send_id);
            }
            Frame::Close => out[0] = K_CLOSE,
            Frame::Push { send_id, addr, len } => {
                out[0] = K_PUSH;
                put_u64(out, 8, send_id);
                put_u64(out, 16, addr);
                put_u64(out, 24, len);
            }
            Frame::Pushed { send_id, ok } => {
                out[0] = K_PUSHED;
                out[1] = u8::from(ok);
                put_u64(out, 8, send_id);
            }
            Frame::Rma(_) => unreachable!("encoded above"),
        }
        n
    }

    /// Appends the frame to `out`, as [`Frame::encode`] writes it, without zeroing the
    /// room of an eager or chunk payload first: its bytes are written once.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        let (header, data) = match *self {
            Frame::Eager { tag, data } => (Frame::Eager { tag, data: &[] }, data),
            Frame::Chunk {
                send_id,
                offset,
                data,
            } => (
                Frame::Chunk {
                    send_id,
                    offset,
                    data: &[],
                },
                data,
            ),
            _ => (*self, &[][..]),
        };
        let at = out.len();
        out.resize(at + header.encoded_len(), 0);
        header.encode(&mut out[at..]);
        out.extend_from_slice(data);
    }

    /// Writes only the header of an eager frame carrying `tag`; the caller places the
    /// payload right after it (claim/commit sends write it in place).
    pub fn encode_eager_header(tag: u64, out: &mut [u8; EAGER_HEADER]) {
        out.fill(0);
        out[0] = K_EAGER;
        out[8..16].copy_from_slice(&tag.to_le_bytes());
    }
}

/// First message on a new connection, client to server, sent with the shared segment's and
/// the client's doorbell file descriptors attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Random identity of the connecting endpoint.
    pub id: u128,
    /// Cells in each ring of the segment.
    pub ring_cells: u32,
    /// Address of a probe word in the sender's memory: the peer tries a CMA read of it.
    pub probe_addr: u64,
    /// Value the probe word holds.
    pub probe_value: u64,
}

/// Answer to [`Hello`], server to client, with the server's doorbell fd attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// Random identity of the accepting endpoint.
    pub id: u128,
    /// Address of the server's probe word.
    pub probe_addr: u64,
    /// Value of the server's probe word.
    pub probe_value: u64,
    /// True when the server could read the client's probe word with CMA.
    pub cma_ok: bool,
    /// The server was connecting to the client when the hello came (the two connects
    /// crossed, so the pair will hold two connections).
    pub crossed: bool,
}

/// Welcome flag: [`Welcome::cma_ok`].
const W_CMA_OK: u8 = 1;
/// Welcome flag: [`Welcome::crossed`].
const W_CROSSED: u8 = 2;

/// Second client message: whether the client could read the server's probe word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// True when the client could read the server's probe word with CMA.
    pub cma_ok: bool,
}

/// Smallest ring a peer may ask for (every control frame must fit many times over).
pub const MIN_RING_CELLS: u32 = 64;

/// Bytes of an encoded [`Hello`].
pub const HELLO_LEN: usize = 56;
/// Bytes of an encoded [`Welcome`].
pub const WELCOME_LEN: usize = 40;
/// Bytes of an encoded [`Ready`].
pub const READY_LEN: usize = 8;
const T_HELLO: u8 = 1;
const T_WELCOME: u8 = 2;
const T_READY: u8 = 3;

fn preamble(out: &mut [u8], ty: u8) {
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&VERSION.to_le_bytes());
    out[6] = ty;
    out[7] = 0;
}

fn check_preamble(b: &[u8], ty: u8, what: &'static str, len: usize) -> Result<(), ProtoError> {
    need(what, b, 8)?;
    let magic = u32_at(b, 0);
    if magic != MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    let v = u16_at(b, 4);
    if v != VERSION {
        return Err(ProtoError::BadVersion {
            got: v,
            want: VERSION,
        });
    }
    if b[6] != ty {
        return Err(ProtoError::UnexpectedMessage {
            want: what,
            got: b[6],
        });
    }
    need(what, b, len)
}

impl Hello {
    /// Encodes into a fixed-size array.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut o = [0u8; HELLO_LEN];
        preamble(&mut o, T_HELLO);
        put_u128(&mut o, 8, self.id);
        o[24..28].copy_from_slice(&self.ring_cells.to_le_bytes());
        // 28..40 reserved (zero)
        o[40..48].copy_from_slice(&self.probe_addr.to_le_bytes());
        o[48..56].copy_from_slice(&self.probe_value.to_le_bytes());
        o
    }
    /// Parses and range-checks; `max_cells` bounds the ring size the peer may ask for.
    pub fn parse(b: &[u8], max_cells: u32) -> Result<Hello, ProtoError> {
        check_preamble(b, T_HELLO, "hello", HELLO_LEN)?;
        let ring_cells = u32_at(b, 24);
        if ring_cells < MIN_RING_CELLS || ring_cells > max_cells || !ring_cells.is_power_of_two() {
            return Err(ProtoError::OutOfRange {
                what: "ring cells (power of two)",
                value: ring_cells.into(),
                limit: max_cells.into(),
            });
        }
        Ok(Hello {
            id: u128_at(b, 8),
            ring_cells,
            probe_addr: u64_at(b, 40),
            probe_value: u64_at(b, 48),
        })
    }
}

impl Welcome {
    /// Encodes into a fixed-size array.
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut o = [0u8; WELCOME_LEN];
        preamble(&mut o, T_WELCOME);
        o[7] =
            (if self.cma_ok { W_CMA_OK } else { 0 }) | (if self.crossed { W_CROSSED } else { 0 });
        put_u128(&mut o, 8, self.id);
        o[24..32].copy_from_slice(&self.probe_addr.to_le_bytes());
        o[32..40].copy_from_slice(&self.probe_value.to_le_bytes());
        o
    }
    /// Parses a welcome message.
    pub fn parse(b: &[u8]) -> Result<Welcome, ProtoError> {
        check_preamble(b, T_WELCOME, "welcome", WELCOME_LEN)?;
        if b[7] & !(W_CMA_OK | W_CROSSED) != 0 {
            return Err(ProtoError::OutOfRange {
                what: "welcome flags",
                value: b[7].into(),
                limit: (W_CMA_OK | W_CROSSED).into(),
            });
        }
        Ok(Welcome {
            id: u128_at(b, 8),
            probe_addr: u64_at(b, 24),
            probe_value: u64_at(b, 32),
            cma_ok: b[7] & W_CMA_OK != 0,
            crossed: b[7] & W_CROSSED != 0,
        })
    }
}

impl Ready {
    /// Encodes into a fixed-size array.
    pub fn encode(&self) -> [u8; READY_LEN] {
        let mut o = [0u8; READY_LEN];
        preamble(&mut o, T_READY);
        o[7] = u8::from(self.cma_ok);
        o
    }
    /// Parses a ready message.
    pub fn parse(b: &[u8]) -> Result<Ready, ProtoError> {
        check_preamble(b, T_READY, "ready", READY_LEN)?;
        Ok(Ready { cma_ok: b[7] != 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_strategy() -> impl Strategy<Value = (u8, u64, u64, u64, u64, Vec<u8>)> {
        (
            1u8..=11,
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..200),
        )
    }

    fn build(k: u8, a: u64, b: u64, c: u64, d: u64, data: &[u8]) -> Frame<'_> {
        match k {
            1 => Frame::Eager { tag: a, data },
            2 => Frame::Rts {
                tag: a,
                len: b,
                send_id: c,
                addr: d,
            },
            3 => Frame::Fin { send_id: a },
            4 => Frame::Cts { send_id: a },
            5 => Frame::Chunk {
                send_id: a,
                offset: b,
                data,
            },
            6 => Frame::Cancel { send_id: a },
            7 => Frame::CancelAck {
                send_id: a,
                cancelled: b & 1 == 1,
            },
            9 => Frame::Push {
                send_id: a,
                addr: b,
                len: c,
            },
            10 => Frame::Pushed {
                send_id: a,
                ok: b & 1 == 1,
            },
            _ => Frame::Close,
        }
    }

    proptest! {
        #[test]
        fn frames_round_trip((k, a, b, c, d, data) in frame_strategy()) {
            let f = build(k, a, b, c, d, &data);
            let mut buf = vec![0u8; f.encoded_len()];
            prop_assert_eq!(f.encode(&mut buf), buf.len());
            prop_assert_eq!(Frame::parse(&buf), Ok(f));
            // Appended after other bytes, the same bytes.
            let mut appended = vec![0xa5; 3];
            f.append_to(&mut appended);
            prop_assert_eq!(&appended[..3], &[0xa5; 3]);
            prop_assert_eq!(&appended[3..], &buf[..]);
        }

        #[test]
        fn parsing_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Frame::parse(&bytes);
            let _ = Hello::parse(&bytes, 1 << 20);
            let _ = Welcome::parse(&bytes);
            let _ = Ready::parse(&bytes);
        }

        #[test]
        fn truncated_frames_are_errors((k, a, b, c, d, data) in frame_strategy(), cut in 0usize..40) {
            let f = build(k, a, b, c, d, &data);
            let mut buf = vec![0u8; f.encoded_len()];
            f.encode(&mut buf);
            let fixed = match k { 1 => EAGER_HEADER, 5 => CHUNK_HEADER, _ => f.encoded_len() };
            if cut < fixed {
                let r = Frame::parse(&buf[..cut]);
                prop_assert!(matches!(r, Err(ProtoError::Truncated { .. })), "{:?}", r);
            }
        }
    }

    #[test]
    fn handshake_round_trip_and_rejections() {
        let h = Hello {
            id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            ring_cells: 4096,
            probe_addr: 77,
            probe_value: 99,
        };
        assert_eq!(Hello::parse(&h.encode(), 1 << 20), Ok(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(matches!(
            Hello::parse(&bad, 1 << 20),
            Err(ProtoError::BadMagic(_))
        ));
        let mut bad = h.encode();
        bad[4] = 9;
        assert_eq!(
            Hello::parse(&bad, 1 << 20),
            Err(ProtoError::BadVersion {
                got: 9,
                want: VERSION
            })
        );
        let big = Hello {
            ring_cells: 1 << 21,
            ..h
        };
        assert!(matches!(
            Hello::parse(&big.encode(), 1 << 20),
            Err(ProtoError::OutOfRange { .. })
        ));
        let odd = Hello {
            ring_cells: 1000,
            ..h
        };
        assert!(matches!(
            Hello::parse(&odd.encode(), 1 << 20),
            Err(ProtoError::OutOfRange { .. })
        ));
        let w = Welcome {
            id: 5,
            probe_addr: 6,
            probe_value: 7,
            cma_ok: true,
            crossed: false,
        };
        assert_eq!(Welcome::parse(&w.encode()), Ok(w));
        for (cma_ok, crossed) in [(false, true), (true, true), (false, false)] {
            let w = Welcome {
                cma_ok,
                crossed,
                ..w
            };
            assert_eq!(Welcome::parse(&w.encode()), Ok(w));
        }
        let mut unknown = w.encode();
        unknown[7] |= 4;
        assert!(matches!(
            Welcome::parse(&unknown),
            Err(ProtoError::OutOfRange { .. })
        ));
        assert!(matches!(
            Welcome::parse(&h.encode()),
            Err(ProtoError::UnexpectedMessage {
                want: "welcome",
                got: 1
            })
        ));
        assert_eq!(
            Ready::parse(&Ready { cma_ok: false }.encode()),
            Ok(Ready { cma_ok: false })
        );
    }
}
