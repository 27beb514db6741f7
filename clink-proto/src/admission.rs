//! Admission control of fast bulk streams (the speculative-defragmentation seed, section 4).
//!
//! Speculation lands a bulk stream's payloads straight in the posted buffer only while the
//! datagrams arriving are the ones expected. Two senders blasting at one receive queue
//! interleave and make most of them miss. So a receive queue grants **one fast stream at a
//! time**: a sender asks (Fast_Req), the receiver grants (Fast_Ack) or refuses (Fast_NAck),
//! and a refused sender goes on *slowly* (a few packets in flight, no GSO groups), so it
//! neither waits for the granted one (no deadlock: every sender always progresses) nor
//! disturbs it much. The datagrams are [`crate::reliable::Admit`].
//!
//! Two sans-IO state machines, driven by the caller's clock:
//!
//! - [`Gate`], the receiver's: one per receive queue (an endpoint's socket), across all of
//!   its peers. It grants the first asker, queues the refused ones (FIFO) and grants the
//!   next when the holder releases, falls idle ([`GateConfig::idle`]: a release was lost or
//!   the sender vanished), or has held the grant for [`GateConfig::max_hold`] while others
//!   wait (the holder is revoked and queued again: fairness between bulk senders).
//! - [`Asker`], the sender's, one per connection (inside [`crate::reliable::Conn`]). In
//!   [`Mode::Implicit`] (the default, the seed's "transparent" allocation) it asks when a
//!   bulk transfer is queued and gives the grant back after [`AskerConfig::linger`] without
//!   one (a [`STANDING_GRANT`], from a receiver with nothing to arbitrate, is kept); in
//!   [`Mode::Explicit`] the application asks and releases (the seed's ioctl).
//!
//! **Lost datagrams.** Every message is idempotent and repeated by whoever needs the
//! answer: an unanswered Fast_Req is sent again after [`AskerConfig::retry`]; a refused
//! sender asks again every [`AskerConfig::refused_retry`] (in case the Fast_Ack that
//! granted it later was lost); a Fast_Ack reaching a sender that no longer wants the
//! grant is answered with a release; a lost release costs the receiver
//! [`GateConfig::idle`]; a lost revocation is repeated by the receiver whenever the
//! revoked sender's bulk datagrams keep coming (see the UDP transport), and a sender whose
//! retransmission timer fires while its grant steers it to a socket of its own (which a
//! lost revocation would leave unread) drops the grant and asks again.

use crate::reliable::Admit;
use std::collections::VecDeque;

/// The grant id of a *standing* grant: a receiver that gave this sender a receive queue
/// of its own (a socket no other stream shares) has nothing to arbitrate, grants it
/// outside any gate and may tell it so unasked. In implicit mode the sender keeps such a
/// grant through idle times instead of giving it back after [`AskerConfig::linger`]
/// (and asking again, slow until answered, at its next transfer). The last id a gate
/// would reach, after 4 billion grants, so a release of it matches none of a gate's.
pub const STANDING_GRANT: u32 = u32::MAX;

/// Who asks for grants: nobody (every stream is fast, no admission control), the protocol
/// itself when a bulk transfer starts, or the application.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// No admission control: every bulk stream is sent fast.
    Off,
    /// Asked for when a bulk transfer is queued, released when none has been for a while.
    #[default]
    Implicit,
    /// Asked for and released by the application; bulk transfers are slow without a grant.
    Explicit,
}

/// Timing of the sender's side. Times are nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AskerConfig {
    /// Who asks.
    pub mode: Mode,
    /// An unanswered Fast_Req is repeated after this long.
    pub retry: u64,
    /// A refused sender asks again this often.
    pub refused_retry: u64,
    /// Implicit mode: the grant is given back after this long without a bulk transfer
    /// (long enough to cover the request/clear-to-send gap between consecutive messages).
    pub linger: u64,
}

impl Default for AskerConfig {
    fn default() -> Self {
        AskerConfig {
            mode: Mode::Implicit,
            retry: 1_000_000,
            refused_retry: 20_000_000,
            linger: 2_000_000,
        }
    }
}

/// Where a sender stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not asking (bulk transfers are slow, unless admission control is off).
    Idle,
    /// Asked, no answer yet (slow meanwhile: the seed's "start at low priority").
    Asking,
    /// Granted: send fast, to `port` when the receiver steers the stream to its own socket.
    Granted {
        /// The grant's id.
        grant: u32,
        /// The receiver's port for this stream alone, or 0.
        port: u16,
    },
    /// Refused or revoked: send slowly, ask again now and then.
    Refused,
}

/// The sender's side of admission control. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Asker {
    cfg: AskerConfig,
    standing: Standing,
    /// Explicit mode: the application asked and has not released.
    wanted: bool,
    /// When to repeat the request (asking or refused).
    retry_at: Option<u64>,
    /// Implicit mode: since when no bulk transfer has been outstanding.
    idle_since: Option<u64>,
    /// The datagram to send next (the latest decision replaces an unsent one).
    out: Option<Admit>,
}

impl Asker {
    /// A sender that has not asked.
    pub fn new(cfg: AskerConfig) -> Asker {
        Asker {
            cfg,
            standing: Standing::Idle,
            wanted: false,
            retry_at: None,
            idle_since: None,
            out: None,
        }
    }

    /// Where the sender stands.
    pub fn standing(&self) -> Standing {
        self.standing
    }

    /// May bulk fragments be sent fast (whole groups, the full window)?
    pub fn fast(&self) -> bool {
        self.cfg.mode == Mode::Off || matches!(self.standing, Standing::Granted { .. })
    }

    /// The receiver's port for this stream alone, when granted with one.
    pub fn steered_port(&self) -> Option<u16> {
        match self.standing {
            Standing::Granted { port, .. } if port != 0 => Some(port),
            _ => None,
        }
    }

    /// Holds a [`STANDING_GRANT`] (kept through idle times).
    fn standing_grant(&self) -> bool {
        matches!(self.standing, Standing::Granted { grant, .. } if grant == STANDING_GRANT)
    }

    fn ask(&mut self, now: u64) {
        self.standing = Standing::Asking;
        self.out = Some(Admit::Req);
        self.retry_at = Some(now + self.cfg.retry);
    }

    /// Whether a bulk transfer is outstanding (queued or not yet acknowledged). In
    /// implicit mode a new one asks (unless already asking or granted), and none starts
    /// the linger time, after which the grant (or the request) is given back.
    pub fn bulk_active(&mut self, now: u64, active: bool) {
        if self.cfg.mode != Mode::Implicit || self.wanted || self.standing_grant() {
            return;
        }
        if active {
            self.idle_since = None;
            if self.standing == Standing::Idle {
                self.ask(now);
            }
        } else if self.standing != Standing::Idle {
            self.idle_since.get_or_insert(now);
        }
    }

    /// The application asks for a fast stream (explicit API; also allowed in implicit
    /// mode, where it only asks earlier). Nothing to do when off or already granted.
    pub fn request(&mut self, now: u64) {
        if self.cfg.mode == Mode::Off {
            return;
        }
        self.wanted = true;
        self.idle_since = None;
        if matches!(self.standing, Standing::Idle | Standing::Refused) {
            self.ask(now);
        }
    }

    /// The application gives the grant back, or withdraws its request.
    pub fn release(&mut self) {
        self.wanted = false;
        self.give_back();
    }

    fn give_back(&mut self) {
        let grant = match self.standing {
            Standing::Idle => return,
            Standing::Granted { grant, .. } => grant,
            Standing::Asking | Standing::Refused => 0,
        };
        self.standing = Standing::Idle;
        self.retry_at = None;
        self.idle_since = None;
        self.out = Some(Admit::Release { grant });
    }

    /// The receiver's answer. Returns `Some(granted)` when the standing changed to granted
    /// or refused.
    pub fn on_answer(&mut self, now: u64, a: Admit) -> Option<bool> {
        match a {
            Admit::Ack { grant, port } => match self.standing {
                // A standing grant, told unasked: kept (implicit mode) for the next
                // transfer, which then starts fast.
                Standing::Idle if grant == STANDING_GRANT && self.cfg.mode == Mode::Implicit => {
                    self.standing = Standing::Granted { grant, port };
                    self.idle_since = None;
                    Some(true)
                }
                // Granted after we stopped asking (a late Fast_Ack): give it straight back.
                Standing::Idle => {
                    self.out = Some(Admit::Release { grant });
                    None
                }
                Standing::Granted { grant: g, port: p } if g == grant && p == port => None,
                _ => {
                    self.standing = Standing::Granted { grant, port };
                    self.retry_at = None;
                    Some(true)
                }
            },
            Admit::NAck => match self.standing {
                Standing::Asking | Standing::Granted { .. } => {
                    self.standing = Standing::Refused;
                    self.retry_at = Some(now + self.cfg.refused_retry);
                    Some(false)
                }
                Standing::Idle | Standing::Refused => None,
            },
            // Requests and releases go the other way: the receiver's business.
            Admit::Req | Admit::Release { .. } => None,
        }
    }

    /// The retransmission timer condemned a flight (its probes went unanswered): a
    /// steered grant may have been revoked by a NAck that was lost, and the stream then
    /// goes to a socket nobody reads, so drop it and ask again soon. An unsteered grant
    /// is kept: its stream reaches the receiver either way, which repeats a lost
    /// revocation while the stream keeps coming. (Dropping it too put every timeout's
    /// stream in slow mode for the retry time, where more timeouts followed: at 5%
    /// injected loss 556 timeouts and 387 grants for 100 MiB.)
    pub fn on_timeout(&mut self, now: u64) {
        if matches!(self.standing, Standing::Granted { port, .. } if port != 0) {
            self.standing = Standing::Refused;
            self.retry_at = Some(now + self.cfg.retry);
        }
    }

    /// When [`Asker::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let linger = self.idle_since.map(|t| t + self.cfg.linger);
        self.retry_at.into_iter().chain(linger).min()
    }

    /// Repeats an unanswered request, and (implicit mode) gives the grant back once no
    /// bulk transfer has been outstanding for the linger time ([`Asker::bulk_active`]).
    pub fn handle_timeout(&mut self, now: u64) {
        if self.idle_since.is_some_and(|t| now >= t + self.cfg.linger) {
            if self.standing_grant() {
                // (Idle since before the standing grant came.)
                self.idle_since = None;
            } else {
                self.give_back();
                return;
            }
        }
        if self.retry_at.is_some_and(|t| now >= t) {
            let again = match self.standing {
                Standing::Asking => self.cfg.retry,
                _ => self.cfg.refused_retry,
            };
            self.out = Some(Admit::Req);
            self.retry_at = Some(now + again);
        }
    }

    /// The admit datagram to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Admit> {
        self.out.take()
    }
}

/// Limits of the receiver's side. Times are nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateConfig {
    /// A holder whose stream has been quiet this long loses the grant (a lost release, a
    /// sender gone).
    pub idle: u64,
    /// A holder loses the grant after this long when others wait (it is queued again).
    pub max_hold: u64,
    /// Most refused senders remembered for a later grant; beyond, they ask again.
    pub max_waiters: usize,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            idle: 20_000_000,
            max_hold: 50_000_000,
            max_waiters: 1024,
        }
    }
}

/// What the receiver must tell a sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision<P> {
    /// Send it a Fast_Ack with this grant id.
    Grant {
        /// The sender.
        peer: P,
        /// The grant id.
        grant: u32,
    },
    /// Send it a Fast_NAck (its request is refused and queued).
    Refuse {
        /// The sender.
        peer: P,
    },
    /// Send it a Fast_NAck (its grant is taken back).
    Revoke {
        /// The sender.
        peer: P,
    },
}

/// Counters of a [`Gate`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Grants made (a repeated answer to the holder is not counted again).
    pub grants: u64,
    /// Requests refused.
    pub refusals: u64,
    /// Grants taken back (idle or held too long).
    pub revocations: u64,
    /// Grants given back by their holder.
    pub releases: u64,
}

/// The current grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder<P> {
    /// Who holds it.
    pub peer: P,
    /// Its id.
    pub grant: u32,
    since: u64,
    active: u64,
}

/// The receiver's side: one fast stream per receive queue. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Gate<P> {
    cfg: GateConfig,
    holder: Option<Holder<P>>,
    waiters: VecDeque<P>,
    last_grant: u32,
    stats: GateStats,
}

impl<P: Copy + Eq> Gate<P> {
    /// A gate with nothing granted.
    pub fn new(cfg: GateConfig) -> Gate<P> {
        Gate {
            cfg,
            holder: None,
            waiters: VecDeque::new(),
            last_grant: 0,
            stats: GateStats::default(),
        }
    }

    /// The current grant, if any.
    pub fn holder(&self) -> Option<&Holder<P>> {
        self.holder.as_ref()
    }

    /// Senders refused and waiting for the grant, in order.
    pub fn waiters(&self) -> impl Iterator<Item = &P> {
        self.waiters.iter()
    }

    /// Counters.
    pub fn stats(&self) -> GateStats {
        self.stats
    }

    fn grant_to(&mut self, now: u64, peer: P, out: &mut Vec<Decision<P>>) {
        // Ids are never 0 (0 means "no grant" in a release).
        self.last_grant = self.last_grant.wrapping_add(1).max(1);
        self.holder = Some(Holder {
            peer,
            grant: self.last_grant,
            since: now,
            active: now,
        });
        self.stats.grants += 1;
        out.push(Decision::Grant {
            peer,
            grant: self.last_grant,
        });
    }

    fn promote(&mut self, now: u64, out: &mut Vec<Decision<P>>) {
        if let Some(p) = self.waiters.pop_front() {
            self.grant_to(now, p, out);
        }
    }

    /// A Fast_Req from `peer`.
    pub fn request(&mut self, now: u64, peer: P, out: &mut Vec<Decision<P>>) {
        match self.holder {
            Some(ref mut h) if h.peer == peer => {
                // A repeat (the answer was lost): same grant.
                h.active = now;
                out.push(Decision::Grant {
                    peer,
                    grant: h.grant,
                });
            }
            None => self.grant_to(now, peer, out),
            Some(_) => {
                if !self.waiters.contains(&peer) && self.waiters.len() < self.cfg.max_waiters {
                    self.waiters.push_back(peer);
                }
                self.stats.refusals += 1;
                out.push(Decision::Refuse { peer });
            }
        }
    }

    /// A release from `peer`: it gives back `grant`, or (any other id) withdraws its
    /// request.
    pub fn release(&mut self, now: u64, peer: P, grant: u32, out: &mut Vec<Decision<P>>) {
        self.waiters.retain(|&w| w != peer);
        if self
            .holder
            .is_some_and(|h| h.peer == peer && h.grant == grant)
        {
            self.holder = None;
            self.stats.releases += 1;
            self.promote(now, out);
        }
    }

    /// The holder's stream is alive (a bulk fragment arrived).
    pub fn active(&mut self, now: u64, peer: P) {
        if let Some(h) = self.holder.as_mut().filter(|h| h.peer == peer) {
            h.active = now;
        }
    }

    /// `peer` is gone: its grant passes on, its request is dropped.
    pub fn forget(&mut self, now: u64, peer: P, out: &mut Vec<Decision<P>>) {
        self.waiters.retain(|&w| w != peer);
        if self.holder.is_some_and(|h| h.peer == peer) {
            self.holder = None;
            self.promote(now, out);
        }
    }

    /// When [`Gate::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let h = self.holder.as_ref()?;
        let idle = h.active + self.cfg.idle;
        Some(if self.waiters.is_empty() {
            idle
        } else {
            idle.min(h.since + self.cfg.max_hold)
        })
    }

    /// Takes the grant back from an idle holder, or from one that held it for
    /// [`GateConfig::max_hold`] while others wait (it joins the queue's end), and grants
    /// the next waiter.
    pub fn handle_timeout(&mut self, now: u64, out: &mut Vec<Decision<P>>) {
        let Some(h) = self.holder else { return };
        let idle = now >= h.active + self.cfg.idle;
        let rotate = !self.waiters.is_empty() && now >= h.since + self.cfg.max_hold;
        if !idle && !rotate {
            return;
        }
        self.holder = None;
        self.stats.revocations += 1;
        out.push(Decision::Revoke { peer: h.peer });
        if !idle && self.waiters.len() < self.cfg.max_waiters {
            self.waiters.push_back(h.peer);
        }
        self.promote(now, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    #[test]
    fn one_grant_at_a_time_then_the_next_in_order() {
        let mut g = Gate::new(GateConfig::default());
        let mut out = Vec::new();
        g.request(0, 1u32, &mut out);
        g.request(1, 2, &mut out);
        g.request(2, 3, &mut out);
        g.request(3, 2, &mut out); // a repeat does not queue twice
        assert_eq!(
            out,
            vec![
                Decision::Grant { peer: 1, grant: 1 },
                Decision::Refuse { peer: 2 },
                Decision::Refuse { peer: 3 },
                Decision::Refuse { peer: 2 },
            ]
        );
        out.clear();
        g.release(4, 1, 99, &mut out); // the wrong grant id changes nothing
        assert!(out.is_empty());
        g.release(5, 1, 1, &mut out);
        assert_eq!(out, vec![Decision::Grant { peer: 2, grant: 2 }]);
        assert_eq!(g.waiters().copied().collect::<Vec<_>>(), vec![3]);
        let s = g.stats();
        assert_eq!((s.grants, s.refusals, s.releases), (2, 3, 1));
    }

    #[test]
    fn an_idle_holder_is_revoked_and_a_greedy_one_rotated() {
        let cfg = GateConfig::default();
        let mut g = Gate::new(cfg.clone());
        let mut out = Vec::new();
        g.request(0, 1u32, &mut out);
        assert_eq!(g.poll_timeout(), Some(cfg.idle));
        g.active(cfg.idle - 1, 1);
        g.handle_timeout(cfg.idle, &mut out);
        assert_eq!(out.len(), 1, "active recently: kept");
        g.handle_timeout(2 * cfg.idle, &mut out);
        assert_eq!(out[1], Decision::Revoke { peer: 1 });
        assert!(g.holder().is_none());
        out.clear();
        // Rotation: a busy holder yields after max_hold when someone waits.
        g.request(100 * MS, 1, &mut out);
        g.request(100 * MS, 2, &mut out);
        let t = 100 * MS + cfg.max_hold;
        g.active(t, 1);
        assert_eq!(g.poll_timeout(), Some(t));
        g.handle_timeout(t, &mut out);
        assert_eq!(out[2], Decision::Revoke { peer: 1 });
        assert!(matches!(out[3], Decision::Grant { peer: 2, .. }));
        assert_eq!(g.waiters().copied().collect::<Vec<_>>(), vec![1]);
        out.clear();
        g.forget(t + 1, 2, &mut out);
        assert!(matches!(out[..], [Decision::Grant { peer: 1, .. }]));
    }

    #[test]
    fn the_implicit_asker_asks_repeats_and_gives_back() {
        let cfg = AskerConfig::default();
        let mut a = Asker::new(cfg.clone());
        assert!(!a.fast());
        a.bulk_active(0, true);
        assert_eq!(a.poll_transmit(), Some(Admit::Req));
        assert_eq!(a.poll_transmit(), None);
        assert_eq!(a.poll_timeout(), Some(cfg.retry));
        a.handle_timeout(cfg.retry);
        assert_eq!(
            a.poll_transmit(),
            Some(Admit::Req),
            "unanswered: asked again"
        );
        assert_eq!(
            a.on_answer(
                cfg.retry + 1,
                Admit::Ack {
                    grant: 7,
                    port: 4000
                }
            ),
            Some(true)
        );
        assert!(a.fast());
        assert_eq!(a.steered_port(), Some(4000));
        assert_eq!(a.poll_timeout(), None);
        // No bulk outstanding for the linger time: the grant goes back.
        a.bulk_active(10 * MS, false);
        assert_eq!(a.poll_timeout(), Some(10 * MS + cfg.linger));
        a.handle_timeout(10 * MS + cfg.linger - 1);
        assert!(a.fast(), "lingers first");
        a.handle_timeout(10 * MS + cfg.linger);
        assert_eq!(a.poll_transmit(), Some(Admit::Release { grant: 7 }));
        assert_eq!(a.standing(), Standing::Idle);
        // A late Fast_Ack while idle is given straight back.
        assert_eq!(a.on_answer(20 * MS, Admit::Ack { grant: 8, port: 0 }), None);
        assert_eq!(a.poll_transmit(), Some(Admit::Release { grant: 8 }));
    }

    #[test]
    fn a_standing_grant_is_kept_through_idle_times_in_implicit_mode_only() {
        let cfg = AskerConfig::default();
        let standing = Admit::Ack {
            grant: STANDING_GRANT,
            port: 0,
        };
        // Told unasked, while idle: taken, and the next transfer starts fast.
        let mut a = Asker::new(cfg.clone());
        assert_eq!(a.on_answer(0, standing), Some(true));
        assert_eq!(a.poll_transmit(), None);
        a.bulk_active(MS, true);
        assert!(a.fast());
        assert_eq!(a.poll_transmit(), None, "nothing to ask");
        // Idle for far longer than the linger time: still granted, nothing given back.
        a.bulk_active(2 * MS, false);
        assert_eq!(a.poll_timeout(), None);
        a.handle_timeout(SEC);
        assert!(a.fast());
        assert_eq!(a.poll_transmit(), None);
        // Answering a request that had gone idle meanwhile: the linger is cleared.
        let mut a = Asker::new(cfg.clone());
        a.bulk_active(0, true);
        assert_eq!(a.poll_transmit(), Some(Admit::Req));
        a.bulk_active(MS, false);
        assert_eq!(a.on_answer(2 * MS, standing), Some(true));
        a.handle_timeout(MS + cfg.linger);
        assert!(a.fast());
        assert_eq!(a.poll_transmit(), None);
        assert_eq!(a.poll_timeout(), None);
        // A revocation still ends it.
        assert_eq!(a.on_answer(SEC, Admit::NAck), Some(false));
        assert!(!a.fast());
        // Explicit mode: the application decides; an unasked grant goes straight back.
        let mut e = Asker::new(AskerConfig {
            mode: Mode::Explicit,
            ..cfg
        });
        assert_eq!(e.on_answer(0, standing), None);
        assert_eq!(
            e.poll_transmit(),
            Some(Admit::Release {
                grant: STANDING_GRANT
            })
        );
        assert!(!e.fast());
    }

    #[test]
    fn a_refused_asker_is_slow_asks_now_and_then_and_drops_a_steered_grant_on_timeout() {
        let cfg = AskerConfig::default();
        let mut a = Asker::new(cfg.clone());
        a.bulk_active(0, true);
        a.poll_transmit();
        assert_eq!(a.on_answer(1, Admit::NAck), Some(false));
        assert!(!a.fast());
        assert_eq!(a.poll_timeout(), Some(1 + cfg.refused_retry));
        a.handle_timeout(1 + cfg.refused_retry);
        assert_eq!(a.poll_transmit(), Some(Admit::Req));
        assert_eq!(a.on_answer(2, Admit::Ack { grant: 3, port: 0 }), Some(true));
        // Unsteered: a timeout keeps the grant (a lost revocation is repeated).
        a.on_timeout(3);
        assert!(a.fast());
        assert_eq!(a.poll_transmit(), None);
        // Steered: the grant may be gone, its socket unread: dropped, asked again.
        assert_eq!(a.on_answer(4, Admit::Ack { grant: 4, port: 9 }), Some(true));
        a.on_timeout(5);
        assert!(!a.fast());
        a.handle_timeout(5 + cfg.retry);
        assert_eq!(a.poll_transmit(), Some(Admit::Req));
    }

    #[test]
    fn explicit_mode_asks_only_when_told_and_off_is_always_fast() {
        let mut a = Asker::new(AskerConfig {
            mode: Mode::Explicit,
            ..AskerConfig::default()
        });
        a.bulk_active(0, true);
        assert_eq!(a.poll_transmit(), None);
        a.request(1);
        assert_eq!(a.poll_transmit(), Some(Admit::Req));
        a.on_answer(2, Admit::Ack { grant: 1, port: 0 });
        a.bulk_active(3, false);
        a.handle_timeout(u64::MAX / 2);
        assert!(a.fast(), "explicit grants are kept until released");
        a.release();
        assert_eq!(a.poll_transmit(), Some(Admit::Release { grant: 1 }));
        let off = Asker::new(AskerConfig {
            mode: Mode::Off,
            ..AskerConfig::default()
        });
        assert!(off.fast());
    }
}
