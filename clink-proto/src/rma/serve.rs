//! The target's side of one-sided access, sans-IO: what each request from a peer does, in
//! what order, which tripwires it fires and what answers it.
//!
//! A request is checked against the target's exports ([`Host::admit`], built on
//! [`super::check`]), applied to the memory admitted, fires the tripwires the access
//! touches, and is answered: a put with an ack when it asks for one or is refused, a get
//! with its bytes in frames of at most [`Host::get_chunk`] and then an ack, an atomic with
//! its reply, a notify, a map and a sync with an ack. Large puts and gets between
//! processes of one host are copies that the peer's [`Engine`] carries out a [`QUANTUM`] at
//! a time ([`turn`]); the requests that arrive meanwhile wait behind the copy, so a peer's
//! requests take effect in the order it sent them.
//!
//! The runtime implements [`Host`]: the export table and the apertures' memory, the
//! tripwires, the link back to the peer, and the copies (system calls).
//! `tests/rma_engine_sim.rs` and the `rma_target` fuzz target drive the same functions
//! with hosts of their own.

use super::{
    check, AtomicOp, BulkCopy, Engine, Grant, Piece, RmaFrame, Status, Target, QUANTUM, READ, WRITE,
};
use crate::wire::Frame;
use std::cell::RefCell;
use std::rc::Rc;

/// The memory one admitted request may access, from its first byte.
pub trait Region {
    /// Writes `data` at the start (the region was admitted for at least its length).
    fn write(&mut self, data: &[u8]);
    /// Calls `f` with the `len` bytes at `off` (with none when they do not lie inside
    /// the region).
    fn read<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T;
    /// Applies `op` (with operands `a`, `b`) to the word at the start: its old value, or
    /// `None` when the word is not 8-byte aligned.
    fn atomic(&mut self, op: AtomicOp, a: u64, b: u64) -> Option<u64>;
}

/// Memory on the heap as an aperture (the simulation's and the fuzz target's hosts): a
/// region is a range of it, and an access outside what was admitted panics (a test host
/// wants to know).
pub struct HeapRegion {
    mem: Rc<RefCell<Vec<u8>>>,
    at: usize,
    len: usize,
}

impl HeapRegion {
    /// Bytes `at..at + len` of `mem`.
    pub fn new(mem: Rc<RefCell<Vec<u8>>>, at: usize, len: usize) -> HeapRegion {
        HeapRegion { mem, at, len }
    }

    /// A host's [`Host::admit`] over `mem`: an access of `len` bytes at `to` needing
    /// `need`, checked against export `grant` ([`check`]).
    pub fn admit(
        mem: &Rc<RefCell<Vec<u8>>>,
        grant: Option<&Grant>,
        to: &Target,
        len: u64,
        need: u8,
    ) -> Result<Admitted<HeapRegion>, Status> {
        let at = check(grant, to.key, to.offset, len, need)?;
        let g = grant.expect("admitted by check");
        Ok(Admitted {
            ap: g.aperture,
            at,
            mem: HeapRegion::new(mem.clone(), at as usize, len as usize),
            rights: g.rights,
        })
    }
}

impl Region for HeapRegion {
    fn write(&mut self, data: &[u8]) {
        assert!(data.len() <= self.len, "a write larger than admitted");
        self.mem.borrow_mut()[self.at..self.at + data.len()].copy_from_slice(data);
    }

    fn read<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T {
        assert!(off + len <= self.len, "a read outside what was admitted");
        f(&self.mem.borrow()[self.at + off..self.at + off + len])
    }

    fn atomic(&mut self, op: AtomicOp, a: u64, b: u64) -> Option<u64> {
        if !self.at.is_multiple_of(8) || self.len < 8 {
            return None;
        }
        let mut m = self.mem.borrow_mut();
        let w = &mut m[self.at..self.at + 8];
        let old = u64::from_le_bytes(w.try_into().expect("eight bytes"));
        let new = match op {
            AtomicOp::FetchAdd => old.wrapping_add(a),
            AtomicOp::CompareSwap if old == a => b,
            AtomicOp::CompareSwap => old,
        };
        w.copy_from_slice(&new.to_le_bytes());
        Some(old)
    }
}

/// A request the export table admitted.
pub struct Admitted<R> {
    /// The aperture.
    pub ap: u32,
    /// Where the access starts in the aperture.
    pub at: u64,
    /// The bytes accessed.
    pub mem: R,
    /// The rights of the export it went through.
    pub rights: u8,
}

/// What serving one peer's requests needs from the target.
pub trait Host {
    /// Admitted memory.
    type Region: Region;
    /// Checks an access of `len` bytes at `to` needing rights `need` against the export
    /// table ([`super::check`]): the memory, or why not.
    fn admit(&mut self, to: &Target, len: u64, need: u8) -> Result<Admitted<Self::Region>, Status>;
    /// A request was refused with `status` (for the target's counters).
    fn refused(&mut self, status: Status);
    /// The peer's copy engine.
    fn engine(&mut self) -> &mut Engine<Vec<u8>>;
    /// Sends `f` to the peer.
    fn answer(&mut self, f: RmaFrame<'_>);
    /// An access of `len` bytes at `at` in aperture `ap` took effect: fire the tripwires
    /// it touches (`access` [`READ`] and/or [`WRITE`]).
    fn fire(&mut self, ap: u32, at: u64, len: u64, access: u8);
    /// `len` bytes were put (`put`) or got: for the counters.
    fn moved(&mut self, put: bool, len: u64);
    /// Whether the peer's memory can be copied by the engine (a process on this host).
    fn can_copy(&self) -> bool;
    /// The largest payload of one get-data frame to the peer.
    fn get_chunk(&self) -> usize;
    /// Hands the peer the memory of the aperture request `req` admitted (a same-host
    /// mapping): the status its ack carries.
    fn map(&mut self, req: u64, a: &Admitted<Self::Region>) -> Status;
    /// Carries out one piece of the engine's head copy; false when it failed.
    fn copy(&mut self, piece: &Piece) -> bool;
}

/// A request arrived from the peer (`bytes`: its frame's encoding, which the engine keeps
/// when the request must wait behind a copy).
#[inline]
pub fn request<H: Host>(h: &mut H, bytes: &[u8], f: RmaFrame<'_>) {
    if h.engine().queued(|| bytes.to_vec()) {
        return;
    }
    if let Some(c) = serve(h, f) {
        h.engine().start(c);
    }
}

/// Applies a put of `data` at `to` and answers it when it asks for an answer (`req` not 0)
/// or is refused. The engine must be idle ([`request`] sees to it; the runtime's fast path
/// applies puts only then).
#[inline(always)]
pub fn put<H: Host>(h: &mut H, req: u64, to: Target, data: &[u8]) {
    let len = data.len() as u64;
    let status = match h.admit(&to, len, WRITE) {
        Ok(mut a) => {
            a.mem.write(data);
            h.moved(true, len);
            h.fire(a.ap, a.at, len, WRITE);
            Status::Ok
        }
        Err(s) => refuse(h, s),
    };
    if req != 0 || status != Status::Ok {
        h.answer(RmaFrame::Ack { req, status });
    }
}

fn refuse<H: Host>(h: &mut H, s: Status) -> Status {
    h.refused(s);
    s
}

/// Applies one request and answers it; a large copy it admitted is returned instead (the
/// caller puts it at the head of the engine).
#[must_use]
fn serve<H: Host>(h: &mut H, f: RmaFrame<'_>) -> Option<BulkCopy> {
    match f {
        RmaFrame::Put { req, to, data } => put(h, req, to, data),
        RmaFrame::Sync { req } => h.answer(RmaFrame::Ack {
            req,
            status: Status::Ok,
        }),
        RmaFrame::PutCma { req, to, len, addr }
        | RmaFrame::GetCma {
            req,
            from: to,
            len,
            addr,
        } => {
            let put = matches!(f, RmaFrame::PutCma { .. });
            let access = if put { WRITE } else { READ };
            let status = match h.admit(&to, len, access) {
                // Nothing to copy: done at once, without a system call.
                Ok(a) if len == 0 => {
                    h.fire(a.ap, a.at, 0, access);
                    Status::Ok
                }
                Ok(a) if h.can_copy() => {
                    return Some(BulkCopy {
                        req,
                        ap: a.ap,
                        at: a.at,
                        len,
                        addr,
                        done: 0,
                        put,
                    })
                }
                Ok(_) => Status::Unsupported,
                Err(s) => refuse(h, s),
            };
            h.answer(RmaFrame::Ack { req, status });
        }
        RmaFrame::Get { req, from, len } => {
            let status = match h.admit(&from, len, READ) {
                Ok(a) => {
                    let chunk = h.get_chunk().max(1);
                    let mut off = 0usize;
                    while off < len as usize {
                        let n = chunk.min(len as usize - off);
                        a.mem.read(off, n, |data| {
                            h.answer(RmaFrame::GetData {
                                req,
                                offset: off as u64,
                                data,
                            })
                        });
                        off += n;
                    }
                    h.moved(false, len);
                    h.fire(a.ap, a.at, len, READ);
                    Status::Ok
                }
                Err(s) => refuse(h, s),
            };
            h.answer(RmaFrame::Ack { req, status });
        }
        RmaFrame::Atomic { req, at, op, a, b } => {
            let (status, old) = match h.admit(&at, 8, READ | WRITE) {
                Ok(mut ad) => match ad.mem.atomic(op, a, b) {
                    Some(old) => {
                        h.fire(ad.ap, ad.at, 8, READ | WRITE);
                        (Status::Ok, old)
                    }
                    None => (refuse(h, Status::Misaligned), 0),
                },
                Err(s) => (refuse(h, s), 0),
            };
            h.answer(RmaFrame::AtomicReply { req, status, old });
        }
        RmaFrame::Notify { req, at, len } => {
            let status = match h.admit(&at, len, WRITE) {
                Ok(a) => {
                    // The bytes a notify announces were written through a mapping, before
                    // the frame: seen by whoever the tripwires wake.
                    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                    h.fire(a.ap, a.at, len, WRITE);
                    Status::Ok
                }
                Err(s) => refuse(h, s),
            };
            h.answer(RmaFrame::Ack { req, status });
        }
        RmaFrame::Map { req, of } => {
            // Any right allows mapping (the mapping's mode follows the rights).
            let status = match h.admit(&of, 0, 0) {
                Ok(a) => h.map(req, &a),
                Err(s) => refuse(h, s),
            };
            h.answer(RmaFrame::Ack { req, status });
        }
        // Answers are the initiator's, never served.
        RmaFrame::Ack { .. } | RmaFrame::AtomicReply { .. } | RmaFrame::GetData { .. } => {}
    }
    None
}

/// One turn of the peer's copy engine: one piece of its head copy, at most [`QUANTUM`]
/// bytes. When that ends the copy (or fails it), the copy fires its tripwires and is
/// answered, and the requests that waited behind it are served in order until one needs
/// the engine. False when the engine holds no copy at its head.
pub fn turn<H: Host>(h: &mut H) -> bool {
    let Some(piece) = h.engine().piece(QUANTUM) else {
        return false;
    };
    let ok = h.copy(&piece);
    let engine = h.engine();
    let ended = if ok {
        engine.copied(piece.len)
    } else {
        engine.failed()
    };
    let Some(c) = ended else {
        return true;
    };
    let status = if ok {
        h.moved(c.put, c.len);
        h.fire(c.ap, c.at, c.len, if c.put { WRITE } else { READ });
        Status::Ok
    } else {
        Status::Failed
    };
    h.answer(RmaFrame::Ack { req: c.req, status });
    while let Some(v) = h.engine().next_waiting() {
        // (Checked when it arrived.)
        let Ok(Frame::Rma(f)) = Frame::parse(&v) else {
            continue;
        };
        if let Some(c) = serve(h, f) {
            h.engine().start(c);
            break;
        }
    }
    true
}
