//! Which peers a progress pass visits.
//!
//! With few peers, every pass visits every peer (a ring poll is one load). With at least
//! `CLINK_BOARD_PEERS` same-host peers on the activity board
//! ([`crate::transport::shm::board`]), a pass visits only:
//! - the peers whose bit is raised on the board (they published a record),
//! - the peers on the busy list: those left with work after their last visit (frames
//!   queued towards them, a pipelined send, engine copies, a message left at the head of
//!   their ring, records beyond the visit's budget) or given work since,
//! - the peers outside the board (network peers, peers beyond its slots),
//!
//! so a pass costs the active peers plus a scan of one bit per peer. Every live peer is
//! visited once when the board turns on, and each liveness check visits the next
//! [`SWEEP`] peers in turn, which bounds what a peer tampering with the board can delay
//! to `N / SWEEP` liveness periods (0.3 s for 1000 peers at the default 10 ms) without
//! a pause of N ring polls every period.

use super::{Endpoint, Link};
use crate::transport::shm::board;

/// Peers visited regardless of the board at each liveness check.
pub const SWEEP: usize = 32;

/// No peer in this board slot.
pub(super) const NO_PEER: u32 = u32::MAX;

/// What the peers' visits found in one pass.
#[derive(Default)]
pub(super) struct Pass {
    pub did: bool,
    pub blocked: bool,
    pub copies: bool,
}

/// The endpoint's visiting state.
pub(super) struct Ready {
    /// The board is on: visit only what it and the lists say.
    pub on: bool,
    /// Board slot -> peer index.
    pub slot_peer: Vec<u32>,
    /// Live peers with a board slot.
    pub boarded: usize,
    /// Words of the board worth scanning (above the highest slot handed out).
    pub words: usize,
    /// Peers to visit whatever the board says.
    pub busy: Vec<usize>,
    spare: Vec<usize>,
    /// Live peers outside the board.
    pub direct: Vec<usize>,
    /// The peers the last arming armed individually: `finish_wait` disarms exactly these
    /// (the lists may change in between).
    pub armed: Vec<usize>,
    /// Where the next liveness sweep starts.
    sweep_at: usize,
}

impl Default for Ready {
    fn default() -> Ready {
        Ready {
            on: false,
            slot_peer: vec![NO_PEER; board::SLOTS],
            boarded: 0,
            words: 0,
            busy: Vec::new(),
            spare: Vec::new(),
            direct: Vec::new(),
            armed: Vec::new(),
            sweep_at: 0,
        }
    }
}

impl Endpoint {
    /// Records a new peer's place: on the board, or polled directly.
    pub(super) fn ready_add(&mut self, i: usize) {
        match self.peers[i].link.shm().and_then(|s| s.slot) {
            Some(slot) => {
                self.ready.slot_peer[slot as usize] = i as u32;
                self.ready.boarded += 1;
                self.ready.words = self.ready.words.max(slot as usize / 64 + 1);
            }
            None => self.ready.direct.push(i),
        }
        self.mark_busy(i);
        self.board_mode();
    }

    /// Forgets a dead peer: frees its slot.
    pub(super) fn ready_remove(&mut self, i: usize) {
        if let Link::Shm(s) = &mut self.peers[i].link {
            if let Some(slot) = s.slot.take() {
                self.ready.slot_peer[slot as usize] = NO_PEER;
                self.ready.boarded -= 1;
                self.board.release(slot);
            }
        }
        self.ready.direct.retain(|&d| d != i);
        self.board_mode();
    }

    /// Turns the board on or off as the number of boarded peers crosses the threshold.
    fn board_mode(&mut self) {
        let min = self.ctx.config.board_peers;
        let want = min > 0 && self.ready.boarded >= min;
        if want == self.ready.on {
            return;
        }
        self.board.set_on(want);
        self.ready.on = want;
        if want {
            // Producers may have published before they saw the board on: visit all once.
            self.mark_all();
        } else {
            for &i in &self.ready.busy {
                self.peers[i].listed = false;
            }
            self.ready.busy.clear();
        }
    }

    /// Puts peer `i` on the busy list (board mode): it is visited on the next pass.
    pub(super) fn mark_busy(&mut self, i: usize) {
        if self.ready.on && !self.peers[i].listed {
            self.peers[i].listed = true;
            self.ready.busy.push(i);
        }
    }

    /// Puts every live peer on the busy list.
    fn mark_all(&mut self) {
        for i in 0..self.peers.len() {
            if self.peers[i].alive {
                self.mark_busy(i);
            }
        }
    }

    /// Puts the next [`SWEEP`] peers on the busy list (board mode).
    pub(super) fn sweep(&mut self) {
        let n = self.peers.len();
        if !self.ready.on || n == 0 {
            return;
        }
        for _ in 0..SWEEP.min(n) {
            let i = self.ready.sweep_at % n;
            self.ready.sweep_at = i + 1;
            if self.peers[i].alive {
                self.mark_busy(i);
            }
        }
    }

    /// True when peer `i` needs a visit whatever the board says.
    fn has_work(&mut self, i: usize) -> bool {
        let p = &mut self.peers[i];
        p.alive
            && (!p.txq.is_empty()
                || !p.rndv.chunks.is_empty()
                || !p.engine.is_empty()
                || p.blocked
                || matches!(p.link.peek(&self.nets, i), Ok(Some(_))))
    }

    /// One pass over the peers the board and the lists name.
    pub(super) fn visit_board(&mut self, pass: &mut Pass) {
        let mut list =
            std::mem::replace(&mut self.ready.busy, std::mem::take(&mut self.ready.spare));
        for &i in &list {
            self.peers[i].listed = false;
        }
        for &i in &list {
            self.visit_ready(i, pass);
        }
        list.clear();
        self.ready.spare = list;
        for w in 0..self.ready.words {
            let mut bits = self.board.take(w);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let i = self.ready.slot_peer[w * 64 + b];
                if i != NO_PEER {
                    self.stats.board_wakeups += 1;
                    self.visit_ready(i as usize, pass);
                }
            }
        }
        for k in 0..self.ready.direct.len() {
            let i = self.ready.direct[k];
            self.visit_ready(i, pass);
        }
    }

    fn visit_ready(&mut self, i: usize, pass: &mut Pass) {
        self.visit(i, pass);
        if self.has_work(i) {
            self.mark_busy(i);
        }
    }

    /// The blocked peers a pass that moved nothing must force (board mode: they are all
    /// on the busy list).
    pub(super) fn blocked_peers(&self) -> Vec<usize> {
        if self.ready.on {
            self.ready
                .busy
                .iter()
                .copied()
                .filter(|&i| self.peers[i].blocked)
                .collect()
        } else {
            (0..self.peers.len())
                .filter(|&i| self.peers[i].alive && self.peers[i].blocked)
                .collect()
        }
    }

    /// The peers whose rings a sleeping endpoint must arm individually: all of them, or in
    /// board mode those the board does not cover (busy and direct ones).
    pub(super) fn arm_list(&self) -> Vec<usize> {
        let alive = |&i: &usize| self.peers[i].alive;
        if self.ready.on {
            let listed = self.ready.busy.iter().chain(&self.ready.direct).copied();
            listed.filter(alive).collect()
        } else {
            (0..self.peers.len()).filter(alive).collect()
        }
    }
}
