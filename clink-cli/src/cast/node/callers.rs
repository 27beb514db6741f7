//! Connections a node accepts while it streams: a node taking over as its upstream
//! (`SPLICE`, after a death or a move) and a receiver rejoining the cast (`JOIN`). Each
//! new peer gets a receive for both; whichever comes tells what it wants.

use super::*;

/// How often a streaming node looks for new connections (a system call or two).
pub(super) const CALLERS_EVERY: Duration = Duration::from_millis(20);

/// A peer that connected to this node and has not yet said why.
pub(super) struct Caller {
    peer: PeerId,
    join: RecvRequest,
    splice: RecvRequest,
}

/// What a caller asked for.
pub(super) enum Call {
    /// To become this node's upstream (the request's bytes).
    Splice(PeerId, Vec<u8>),
    /// To rejoin the cast (the request's bytes, to relay to the tail).
    Join(Vec<u8>),
}

impl Node {
    /// Accepts the peers that connected (without waiting) and takes what the callers
    /// asked for so far.
    pub(super) fn poll_callers(&mut self) -> Vec<Call> {
        while let Ok(peer) = self.ep.accept(Some(Duration::ZERO)) {
            let post = |ep: &mut Endpoint, tag| {
                ep.irecv(Selector::exact(Some(peer), tag), vec![0u8; 4096])
            };
            match (post(&mut self.ep, T_JOIN), post(&mut self.ep, T_SPLICE)) {
                (Ok(join), Ok(splice)) => self.callers.push(Caller { peer, join, splice }),
                // Gone already.
                _ => continue,
            }
        }
        let mut calls = Vec::new();
        let mut k = 0;
        while k < self.callers.len() {
            let c = &self.callers[k];
            let call = match self.ep.test_recv(&c.splice) {
                Ok(Some(got)) => Some(Some(Call::Splice(c.peer, got.buf))),
                Ok(None) => match self.ep.test_recv(&c.join) {
                    Ok(Some(got)) => Some(Some(Call::Join(got.buf))),
                    Ok(None) => None,
                    Err(_) => Some(None),
                },
                Err(_) => Some(None),
            };
            match call {
                None => k += 1,
                Some(call) => {
                    let c = self.callers.swap_remove(k);
                    let _ = self.ep.cancel_recv(&c.join);
                    let _ = self.ep.cancel_recv(&c.splice);
                    calls.extend(call);
                }
            }
        }
        calls
    }
}
