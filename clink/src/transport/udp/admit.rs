//! Admission control across the transport's links: the gate that grants one fast bulk
//! stream at a time, its decisions sent back, and the socket a granted stream is steered
//! to.

use super::*;

impl UdpTransport {
    /// The peer (route index) holding the fast-stream grant, if any.
    pub fn fast_holder(&self) -> Option<usize> {
        self.st.gate.holder().map(|h| h.peer)
    }

    /// Admission control for the link routed under `idx`: its requests and releases to
    /// the gate, its bulk stream's activity (nothing to do with admission control off).
    pub fn admit(&mut self, now: u64, idx: usize, link: &mut UdpLink) {
        let own = self.peers.has(link.dest);
        let st = &mut self.st;
        if st.cfg.admission != Mode::Off {
            link.admit(
                now,
                idx,
                own,
                &mut st.gate,
                &mut st.decisions,
                &mut st.stats,
            );
        }
    }

    /// After [`UdpTransport::admit`] for every link: runs the gate's timer and hands its
    /// decisions to `answer` as (route index, answer, whether it revokes a grant). A grant
    /// steers the stream to the steered socket when flow steering is on (its port goes in
    /// the Fast_Ack).
    pub fn admit_decisions(&mut self, now: u64, mut answer: impl FnMut(usize, Admit, bool)) {
        if self.st.gate.poll_timeout().is_some_and(|t| t <= now) {
            let st = &mut self.st;
            st.gate.handle_timeout(now, &mut st.decisions);
        }
        let mut decisions = std::mem::take(&mut self.st.decisions);
        for d in decisions.drain(..) {
            match d {
                Decision::Grant { peer, grant } => {
                    let port = self.steer_to(peer).unwrap_or(0);
                    answer(peer, Admit::Ack { grant, port }, false)
                }
                Decision::Refuse { peer } => answer(peer, Admit::NAck, false),
                Decision::Revoke { peer } => answer(peer, Admit::NAck, true),
            }
        }
        self.st.decisions = decisions;
        // A new holder (or none) may move the layout between the sockets: plan afresh.
        let holder = self.st.gate.holder().map(|h| h.peer);
        if holder != self.st.last_holder {
            self.st.last_holder = holder;
            self.disarm();
        }
        if self.steer.idle_close_due(now, holder.is_some()) {
            self.disarm();
            self.steer.close();
        }
    }

    /// Steers `peer`'s granted stream to a socket of its own: its port, or `None`.
    pub(super) fn steer_to(&mut self, peer: usize) -> Option<u16> {
        let dest = self
            .st
            .routes
            .map
            .iter()
            .find(|(_, &i)| i == peer)
            .map(|(k, _)| k.0)?;
        self.steer.steer(peer, dest)
    }

    /// When the admission gate's timer runs out (an idle holder, a rotation).
    pub fn admit_timeout(&self) -> Option<u64> {
        self.st.gate.poll_timeout()
    }

    /// Turns flow steering and peer sockets off and closes their sockets (the endpoint
    /// could not watch them): grants from now on carry no port, every peer's datagrams
    /// reach the main socket.
    pub fn stop_extra_sockets(&mut self) {
        self.disarm();
        self.steer.close();
        self.steer.turn_off();
        self.peers.close_all();
        self.count_uncovered();
    }

    /// Drops the speculative layout (the endpoint plans a new one before the next read).
    pub(super) fn disarm(&mut self) {
        self.set_arm(None, None);
    }
}
