//! Moving a slow node to the tail of the chain.
//!
//! A node whose next node falls far behind (it forwards to it from its file, see
//! `stream`) and stays behind, while the nodes after that one say they wait most of their
//! time (the busy shares of the progress messages), moves that node to the tail, once:
//! it tells the slow node
//! (`MOVE`), which hands its own next node over (`MOVE` again) and waits for a new
//! upstream; it splices itself to that next node as it would past a dead one, and sends
//! the new order down the chain (`ADOPT`) and up (with the progress messages). The tail
//! connects to the slow node and feeds it from where it stands, from its file when it
//! falls behind. The nodes that were after the slow one then go at the chain's pace, and
//! only the slow node finishes late. The first node, which has no node above it to fall
//! behind, is moved by the source in the same way when the busy shares in the progress
//! messages say it holds all the others back (`source.rs`).

use super::*;

/// How far behind (in windows of chunks) a next node must be, and for how long, before
/// it is moved to the tail.
pub(super) const MOVE_WINDOWS: u64 = 2;
pub(in crate::cast) const MOVE_AFTER: Duration = Duration::from_secs(1);
/// The busy share (time not spent waiting, as the progress messages say) at or below
/// which the nodes after a slow one count as held back by it: a chain whose nodes are all
/// busy (they share too few processors) gains nothing from a move.
pub(in crate::cast) const STARVED_BUSY: f64 = 0.25;

/// A next node's report and progress receives, and the run of chunks to forward to it
/// from the file.
pub(super) type TakenOn = (RecvRequest, RecvRequest, Option<(u64, u64)>);

impl Node {
    /// The node after `node` in the chain's current order.
    pub(super) fn after(&self, node: usize) -> Option<usize> {
        self.order.after(node)
    }

    /// Whether every node after `node` has said it waits most of its time (busy at most
    /// [`STARVED_BUSY`]): `node` holds them back.
    pub(super) fn starved_after(&self, node: usize) -> bool {
        self.order.all_after(node, |n| {
            self.busy
                .get(n)
                .copied()
                .flatten()
                .is_some_and(|b| b <= STARVED_BUSY)
        })
    }

    /// Notes the busy share a progress message from downstream carries.
    pub(super) fn note_busy(&mut self, v: &Value) {
        if let (Some(n), Some(b)) = (v["node"].as_u64(), v["busy"].as_f64()) {
            let n = n as usize;
            if n <= self.addrs.len() {
                if self.busy.len() <= n {
                    self.busy.resize(n + 1, None);
                }
                self.busy[n] = Some(b);
            }
        }
    }

    /// Takes a chain order from a message, if it holds one that names the same nodes as
    /// this node's.
    pub(super) fn take_order(&mut self, v: &Value) {
        if let Some(o) = super::order::Order::from_json(v, self.addrs.len()) {
            self.order = o;
        }
    }

    /// Moves the next node to the tail: tells it so (an error: the next node is lost,
    /// not moved).
    pub(super) fn tell_move(&mut self, behind: u64) -> Result<(), clink::Error> {
        let slow = self.down_node;
        let order = self.order.with_tail(slow);
        let m = json!({ "order": order.to_json(), "node": slow, "up": self.p.index });
        if let Some(d) = self.down {
            self.ep.send(d, T_MOVE, m.to_string().as_bytes())?;
        }
        eprintln!(
            "clink cast: node {}: node {slow} is {behind} chunks behind; moving it to the tail",
            self.p.index
        );
        Ok(())
    }

    /// Completes [`Node::tell_move`]: splices this node to the node after the moved one
    /// and hands the new order down and up. Returns the new next node and the first chunk
    /// it lacks.
    pub(super) fn finish_move(&mut self) -> Result<(PeerId, u64), Failure> {
        let slow = self.down_node;
        let succ = self.after(slow).expect("checked before the move");
        let from = self.splice_to(succ, "moving a slow node to the tail")?;
        self.order = self.order.with_tail(slow);
        self.moved_next = true;
        let d = self.down.expect("spliced");
        let adopt = json!({ "order": self.order.to_json(), "node": slow });
        self.ep
            .send(d, T_ADOPT, adopt.to_string().as_bytes())
            .map_err(|e| self.down_lost("sending the new order", e))?;
        let up = json!({ "order": self.order.to_json() });
        self.ep
            .send(self.up, T_PROGRESS, up.to_string().as_bytes())
            .map_err(|e| self.upstream_lost("sending the new order", e))?;
        Ok((d, from))
    }

    /// At the tail, the node just connected to (moved here, or rejoining), which holds
    /// every chunk below `from` and those `has` marks: its receives (report, progress),
    /// and the chunks to forward to it from this node's file.
    pub(super) fn take_on_next(&mut self, from: u64, has: Vec<bool>) -> Result<TakenOn, Failure> {
        let (r, p) = self.post_down_receives(self.down.expect("connected"))?;
        self.down_from = from;
        self.down_has = has;
        self.predict();
        let first = (0..self.next_due)
            .find(|&i| !self.down_holds(i))
            .unwrap_or(self.next_due);
        Ok((
            r,
            p,
            (first < self.next_due).then_some((first, self.next_due)),
        ))
    }

    /// Connects to node `to` as its new upstream (it waits for one: its upstream died or
    /// it was moved) and learns the first chunk it lacks; `why` labels errors.
    pub(super) fn splice_to(&mut self, to: usize, why: &str) -> Result<u64, Failure> {
        let addr = self.addrs.get(to - 1).cloned().unwrap_or_default();
        let (d, from) = super::super::splice(&mut self.ep, self.p.index, to, &addr)
            .map_err(|m| fail_up(format!("{why}: {m}")))?;
        self.down = Some(d);
        self.down_node = to;
        self.down_addr = addr;
        Ok(from)
    }
}
