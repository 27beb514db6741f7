//! A peer's one-sided requests served at a target: a run of items, each an engine turn
//! (one byte, even: the piece's copy fails when bit 1 is set) or a frame (an odd byte, then
//! a little-endian u16 length and the bytes), goes to `rma::serve` over an aperture with a
//! window exported for reading and writing, one read only, one revoked and one under
//! another key (the others' key is 0, for the fuzzer to find). Whatever the peer sends,
//! every access stays inside the aperture (the region checks each), the target sends only
//! answers, each request is answered at most once (with its get data inside its length),
//! and the engine runs dry in pieces of at most the quantum, never a panic.
#![no_main]

use clink_proto::rma::serve::{self, Admitted, HeapRegion, Host};
use clink_proto::rma::{Engine, Grant, Piece, RmaFrame, Status, Target, QUANTUM};
use clink_proto::rma::{READ, WRITE};
use clink_proto::wire::Frame;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

const APERTURE: usize = 1 << 20;

struct Fuzzed {
    mem: Rc<RefCell<Vec<u8>>>,
    grants: HashMap<u32, Grant>,
    engine: Engine<Vec<u8>>,
    /// Answers by request number: acks and replies, and get-data bytes.
    acks: HashMap<u64, u32>,
    got: HashMap<u64, u64>,
    /// Whether the next piece's copy fails.
    fail: bool,
}

impl Host for Fuzzed {
    type Region = HeapRegion;

    fn admit(&mut self, to: &Target, len: u64, need: u8) -> Result<Admitted<HeapRegion>, Status> {
        let g = self.grants.get(&to.export);
        let a = HeapRegion::admit(&self.mem, g, to, len, need)?;
        let g = g.expect("admitted");
        assert!(a.at + len <= g.base + g.len, "admitted beyond the window");
        Ok(a)
    }

    fn refused(&mut self, status: Status) {
        assert_ne!(status, Status::Ok);
    }

    fn engine(&mut self) -> &mut Engine<Vec<u8>> {
        &mut self.engine
    }

    fn answer(&mut self, f: RmaFrame<'_>) {
        match f {
            RmaFrame::Ack { req: 0, .. } => {}
            RmaFrame::Ack { req, .. } | RmaFrame::AtomicReply { req, .. } => {
                *self.acks.entry(req).or_default() += 1;
            }
            RmaFrame::GetData { req, data, .. } => {
                *self.got.entry(req).or_default() += data.len() as u64;
            }
            other => panic!("the target sent {other:?}"),
        }
    }

    fn fire(&mut self, _: u32, at: u64, len: u64, _: u8) {
        assert!(
            at + len <= APERTURE as u64,
            "a tripwire range beyond the aperture"
        );
    }

    fn moved(&mut self, _: bool, _: u64) {}

    fn can_copy(&self) -> bool {
        true
    }

    fn get_chunk(&self) -> usize {
        4000
    }

    fn map(&mut self, _: u64, _: &Admitted<HeapRegion>) -> Status {
        Status::Unsupported
    }

    fn copy(&mut self, piece: &Piece) -> bool {
        assert!(
            piece.len > 0 && piece.len <= QUANTUM,
            "a piece of {}",
            piece.len
        );
        assert!(
            piece.at + piece.len <= APERTURE as u64,
            "a copy beyond the aperture"
        );
        !self.fail
    }
}

fuzz_target!(|data: &[u8]| {
    let grant = |base: u64, len: u64, rights: u8, key: u128, revoked: bool| Grant {
        aperture: 0,
        base,
        len,
        rights,
        key,
        revoked,
    };
    let mut h = Fuzzed {
        mem: Rc::new(RefCell::new(vec![0; APERTURE])),
        grants: HashMap::from([
            (0, grant(4096, 512 << 10, READ | WRITE, 0, false)),
            (1, grant(0, APERTURE as u64, READ, 0, false)),
            (2, grant(0, APERTURE as u64, READ | WRITE, 0, true)),
            (3, grant(0, APERTURE as u64, READ | WRITE, 7 << 64, false)),
        ]),
        engine: Engine::default(),
        acks: HashMap::new(),
        got: HashMap::new(),
        fail: false,
    };
    // Get lengths asked for, by request number.
    let mut asked: HashMap<u64, u64> = HashMap::new();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        if op & 1 == 0 {
            h.fail = op & 2 != 0;
            serve::turn(&mut h);
            continue;
        }
        if rest.len() < 2 {
            break;
        }
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (f, tail) = rest[2..].split_at(n);
        rest = tail;
        let Ok(Frame::Rma(r)) = Frame::parse(f) else {
            continue;
        };
        if let RmaFrame::Get { req, len, .. } = r {
            let a = asked.entry(req).or_default();
            *a = a.saturating_add(len);
        }
        if !matches!(
            r,
            RmaFrame::Ack { .. } | RmaFrame::AtomicReply { .. } | RmaFrame::GetData { .. }
        ) {
            serve::request(&mut h, f, r);
        }
    }
    h.fail = false;
    for _ in 0..100_000 {
        if h.engine.is_empty() {
            break;
        }
        serve::turn(&mut h);
    }
    assert!(h.engine.is_empty(), "the engine never ran dry");
    for (req, got) in &h.got {
        assert!(
            got <= asked.get(req).unwrap_or(&0),
            "get data beyond the length asked"
        );
    }
});
