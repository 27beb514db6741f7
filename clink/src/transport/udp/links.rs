//! The transport's links: a table keyed by the endpoint's peer index (the route index of
//! the link's datagrams). The transport routes each datagram to its link itself, runs the
//! links' timers and admission control, plans the speculative layout over their bulk
//! streams and sends what they queue; the endpoint reaches a link by its peer index for
//! its frames and bulk transfers, and hears of dead peers from [`UdpTransport::run_timers`].

use super::*;

/// Receive entries a speculative read arms (the socket reads up to this many at once).
const RX_ENTRIES: usize = sock::RX_SLOTS;

/// A link and whether it is live: routed, its timers run. A failed or closed peer's link
/// stays, unrouted, so its last state (counters, round trip) can be read.
struct Slot {
    link: Box<UdpLink>,
    live: bool,
}

/// The links by peer index.
#[derive(Default)]
pub(super) struct Links {
    slots: Vec<Option<Slot>>,
}

impl Links {
    #[inline]
    fn live_mut(&mut self, i: usize) -> Option<&mut UdpLink> {
        match self.slots.get_mut(i) {
            Some(Some(s)) if s.live => Some(&mut s.link),
            _ => None,
        }
    }

    /// Hands what a receive got for route `i` to its link, if it is live.
    #[inline]
    pub(super) fn deliver(&mut self, i: usize, got: Got<'_>, now: u64) {
        if let Some(l) = self.live_mut(i) {
            l.handle(now, got);
        }
    }

    fn live_ref(&self, i: usize) -> Option<&UdpLink> {
        match self.slots.get(i) {
            Some(Some(s)) if s.live => Some(&s.link),
            _ => None,
        }
    }

    fn live(&self) -> impl Iterator<Item = (usize, &UdpLink)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Some(s) if s.live => Some((i, &*s.link)),
            _ => None,
        })
    }

    fn live_iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut UdpLink)> + '_ {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Some(s) if s.live => Some((i, &mut *s.link)),
                _ => None,
            })
    }
}

impl UdpTransport {
    /// Takes `link` as the endpoint's peer `idx` and makes it reachable by its datagrams,
    /// on a connected socket of its own while there are fewer than
    /// [`UdpConfig::peer_sockets`].
    pub fn adopt(&mut self, idx: usize, mut link: UdpLink) {
        let key @ (_, conn) = link.route_key();
        self.st.routes.insert(key, idx);
        self.start_keepalive();
        if let Some(k) = &self.keepalive {
            link.standing = Some(k.add(link.dest, conn));
        }
        self.open_ring();
        if self.peers.open(link.dest) {
            // Its datagrams move to the new socket: a layout for it must move too.
            self.disarm();
            self.main_drain = MAIN_DRAIN_PASSES;
        }
        self.count_uncovered();
        let slots = &mut self.links.slots;
        if slots.len() <= idx {
            slots.resize_with(idx + 1, || None);
        }
        slots[idx] = Some(Slot {
            link: Box::new(link),
            live: true,
        });
    }

    /// Forgets peer `idx`'s route (it failed or closed); its datagrams become stray, its
    /// fast-stream grant passes on, its socket (when no other link goes to its address)
    /// closes. The link stays, to be read.
    pub fn detach(&mut self, idx: usize) {
        let Some(Some(slot)) = self.links.slots.get_mut(idx) else {
            return;
        };
        if !std::mem::replace(&mut slot.live, false) {
            return;
        }
        // Nothing awaited from it any more: its connection pings no longer.
        slot.link.set_awaited(false);
        let (dest, key @ (_, conn)) = (slot.link.dest, slot.link.route_key());
        if let Some(k) = &self.keepalive {
            k.remove(dest, conn);
        }
        let st = &mut self.st;
        if let Some(i) = st.routes.remove(key) {
            let now = st.now();
            st.gate.forget(now, i, &mut st.decisions);
        }
        let shared = st.routes.map.keys().any(|(d, _)| *d == dest);
        if !shared {
            self.hops.retain(|(a, _)| SocketAddr::V4(*a) != dest);
        }
        if !shared && self.peers.close(dest) {
            // Sockets after it moved down one index.
            self.disarm();
        }
        self.count_uncovered();
    }

    /// Peer `idx`'s link, live or not.
    pub fn link(&self, idx: usize) -> Option<&UdpLink> {
        self.links.slots.get(idx)?.as_ref().map(|s| &*s.link)
    }

    /// As [`UdpTransport::link`], mutable.
    pub fn link_mut(&mut self, idx: usize) -> Option<&mut UdpLink> {
        self.links
            .slots
            .get_mut(idx)?
            .as_mut()
            .map(|s| &mut *s.link)
    }

    /// The live links with their peer indices.
    pub fn live_links(&self) -> impl Iterator<Item = (usize, &UdpLink)> + '_ {
        self.links.live()
    }

    /// Every link, live or not (for their counters).
    pub fn links(&self) -> impl Iterator<Item = &UdpLink> + '_ {
        self.links.slots.iter().flatten().map(|s| &*s.link)
    }

    /// Reads the ring and the sockets due once, after planning the speculative layout
    /// ([`UdpTransport::plan_layout`]), and hands what came to the links: datagrams read.
    pub fn receive(&mut self, all: bool) -> usize {
        self.plan_layout();
        self.receive_planned(all)
    }

    /// As [`UdpTransport::receive`], with the layout planned already (the busy-poll
    /// latency path plans nothing: it runs only while no bulk transfer is under way).
    #[inline]
    pub fn receive_planned(&mut self, all: bool) -> usize {
        let mut links = std::mem::take(&mut self.links);
        let n = self.receive_with(all, &mut |i, g, now| links.deliver(i, g, now));
        self.links = links;
        n
    }

    /// Arms a speculative receive for one stream at a time (the others' fragments take
    /// the ordinary path): the one admission control granted, or with no grant in force
    /// the first live link with a bulk transfer coming in. Planned afresh only when that
    /// link's transfers changed, not on every read: every read of an armed socket must
    /// follow a plan (a hit or a copy changes what the layout may arm).
    fn plan_layout(&mut self) {
        let receiving =
            |i: usize, l: &UdpLink| l.bulk.receiving().then(|| (i, l.bulk.generation()));
        let key = match (self.speculate(), self.fast_holder()) {
            (false, _) => None,
            (true, Some(h)) => self.links.live_ref(h).and_then(|l| receiving(h, l)),
            (true, None) => self.links.live().find_map(|(i, l)| receiving(i, l)),
        };
        if self.planned_key() != key {
            let arm = key.and_then(|(i, g)| {
                let frag = self.links.live_ref(i)?.conn.config().bulk_payload();
                let group = self.rx_group(frag);
                let l = self.links.live_mut(i)?;
                l.plan_arm(group, RX_ENTRIES)
                    .map(|(src, a)| ((i, g), src, a))
            });
            self.set_arm(key, arm);
        }
        if self.has_ring() {
            let bulk_in = key.is_some() || self.links.live().any(|(_, l)| l.bulk.receiving());
            self.expect_bulk(bulk_in);
        }
    }

    /// Runs the live links' timers due at `now` (a receive's clock reading) and admission
    /// control (requests to the gate, its answers back to the peers): the peers the
    /// connections declared dead.
    pub fn run_timers(&mut self, now: u64) -> Vec<usize> {
        let mut dead = Vec::new();
        let mut links = std::mem::take(&mut self.links);
        for (i, l) in links.live_iter_mut() {
            if l.tick(now) {
                dead.push(i);
            }
            self.admit(now, i, l);
        }
        // The gate's decisions (usually none) back to the peers as Fast_Ack / Fast_NAck.
        self.admit_decisions(now, |i, answer, revoked| {
            if let Some(l) = links.live_mut(i) {
                l.answer_admit(answer, revoked);
            }
        });
        self.links = links;
        dead
    }

    /// Sends what peer `idx`'s link has queued, at once.
    #[inline]
    pub fn send_now(&mut self, idx: usize, now: u64) {
        let Some(l) = self.links.live_mut(idx) else {
            return;
        };
        l.transmit(now, &mut self.st.batch);
        self.flush();
        if let Some(l) = self.links.live_mut(idx) {
            l.publish_standing();
        }
    }

    /// Sends every live link's pending datagrams (acks, data, retransmissions) in one
    /// batch, then publishes what the keepalive thread repeats.
    pub fn transmit_all(&mut self, now: u64) {
        let batch = &mut self.st.batch;
        for (_, l) in self.links.live_iter_mut() {
            l.transmit(now, batch);
        }
        self.flush();
        for (_, l) in self.links.live_iter_mut() {
            l.publish_standing();
        }
    }

    /// Marks the live links whose peer the endpoint awaits something from (`awaited(i)`,
    /// or a transfer coming in from it), so that a silent one is pinged soon; `!on`
    /// clears every mark (a detached link's was cleared when it was detached). True when
    /// some link is marked.
    pub fn mark_awaited(&mut self, on: bool, awaited: impl Fn(usize) -> bool) -> bool {
        let mut any = false;
        for (i, l) in self.links.live_iter_mut() {
            let w = on && (awaited(i) || l.bulk.receiving());
            l.set_awaited(w);
            any |= w;
        }
        any
    }
}
