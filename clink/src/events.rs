//! The endpoint's asynchronous event queue (CLAN section 3.3): completions, message
//! arrivals, tripwire firings and peer events, in one queue an event-driven program
//! dequeues without system calls.
//!
//! Events are produced by the endpoint's progress engine (which turns what peers wrote into
//! its rings, and RMA requests it applied, into events) and by [`EventSender`]s on any
//! thread. Delivery is O(1) either way: the endpoint's own events go into a bounded FIFO
//! only its thread touches (no atomic read-modify-write per event), `User` events from
//! other threads into a lock-free bounded ring (the crate's `evq` module) that wakes the
//! endpoint when it sleeps. The consumer takes from the two in turn, so neither starves the
//! other. When the FIFO is full, events go to an overflow list in order, and the consumer
//! first receives an [`Event::Overflow`] saying so: nothing is lost unless the overflow
//! list itself passes [`SPILL_MAX`] events, and then the loss is counted and reported in
//! the next `Overflow` event (recover by checking request states and tripwire bits). The
//! order kept is the endpoint's own; a `User` event is ordered only against other `User`
//! events (a full ring refuses it: [`EventSender::post`] returns false).

use crate::evq::{Consumer, EventRing, SharedRing};
use clink_proto::tripwire::TripId;
use clink_proto::PeerId;
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// Interest in message arrivals ([`Event::Message`]).
pub const MESSAGES: u32 = 1;
/// Interest in one-sided access completions ([`Event::RmaDone`]).
pub const RMA: u32 = 2;
/// Interest in tripwire firings ([`Event::Tripwire`]).
pub const TRIPWIRES: u32 = 4;
/// Interest in peers connecting, closing and failing.
pub const PEERS: u32 = 8;
/// Interest in completions of non-blocking tagged requests ([`Event::SendDone`],
/// [`Event::RecvDone`]) started while it is set.
pub const REQUESTS: u32 = 16;
/// Every source.
pub const ALL: u32 = MESSAGES | RMA | TRIPWIRES | PEERS | REQUESTS;

/// Events kept in the overflow list at most before further ones are counted as lost.
pub const SPILL_MAX: usize = 1 << 20;

/// Something that happened on an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message from `peer` is waiting that no posted receive wanted (one event per
    /// message, when it reaches the head of its sender's queue): receive it.
    Message {
        /// Sender.
        peer: PeerId,
        /// Its tag.
        tag: u64,
    },
    /// A non-blocking one-sided request completed; take its result with
    /// [`crate::Endpoint::wait_rma`].
    RmaDone {
        /// The request.
        req: u64,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A non-blocking send (`isend`) completed: take its result with
    /// [`crate::Endpoint::test_send`] or `wait_send` (it will not wait).
    SendDone {
        /// The request ([`crate::SendRequest::id`]).
        req: u64,
        /// Whether it succeeded.
        ok: bool,
    },
    /// A non-blocking receive (`irecv`) completed: take it with
    /// [`crate::Endpoint::test_recv`] or `wait_recv` (it will not wait).
    RecvDone {
        /// The request ([`crate::RecvRequest::id`]).
        req: u64,
        /// Whether it succeeded (false for a truncated message, too).
        ok: bool,
    },
    /// A tripwire fired.
    Tripwire {
        /// Which.
        id: TripId,
        /// The peer whose access fired it (`None`: this endpoint's own access).
        peer: Option<PeerId>,
        /// Offset of the access within the aperture.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// True for a write (put, atomic, notify), false for a read.
        write: bool,
    },
    /// A peer connected (either direction).
    PeerConnected(PeerId),
    /// A peer said goodbye, or this endpoint closed.
    PeerClosed(PeerId),
    /// A peer died, hung up or broke the protocol.
    PeerFailed(PeerId),
    /// The queue of the endpoint's own events was full: the next `spilled` of them come
    /// from the overflow list (in order), and `lost` events were dropped beyond it since
    /// the last report.
    Overflow {
        /// Events waiting in the overflow list.
        spilled: u64,
        /// Events lost (overflow list full).
        lost: u64,
    },
    /// A value posted by an [`EventSender`].
    User(u64),
}

/// Posts [`Event::User`] events into an endpoint's queue from any thread, waking it if it
/// sleeps. Cheap to clone.
#[derive(Clone)]
pub struct EventSender {
    ring: SharedRing<Event>,
    doorbell: Arc<OwnedFd>,
}

impl EventSender {
    /// Posts `v`; `false` when the queue is full (nothing was posted: retry later).
    pub fn post(&self, v: u64) -> bool {
        match self.ring.push(Event::User(v)) {
            Ok(wake) => {
                if wake {
                    crate::sys::ring_doorbell(self.doorbell.as_fd());
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// The queue as the endpoint holds it.
pub(crate) struct EventQueue {
    ring: SharedRing<Event>,
    /// `User` events from other threads.
    rx: Consumer<Event>,
    /// The endpoint's own events, at most as many as the ring holds (then `spill`).
    local: VecDeque<Event>,
    spill: VecDeque<Event>,
    lost: u64,
    /// An Overflow event is owed to the consumer before the spilled ones.
    report: bool,
    /// Which source `pop` tries first, alternating.
    ring_first: bool,
    pub interest: u32,
}

impl EventQueue {
    pub fn new(cap: usize) -> EventQueue {
        let (ring, rx) = EventRing::new(cap);
        EventQueue {
            ring,
            rx,
            local: VecDeque::with_capacity(cap),
            spill: VecDeque::new(),
            lost: 0,
            report: false,
            ring_first: false,
            interest: 0,
        }
    }

    pub fn sender(&self, doorbell: Arc<OwnedFd>) -> EventSender {
        EventSender {
            ring: self.ring.clone(),
            doorbell,
        }
    }

    /// Whether events of `src` are wanted (the interest mask).
    pub fn wants(&self, src: u32) -> bool {
        self.interest & src != 0
    }

    /// Queues an event of source `src` if the endpoint is interested in it. Only the
    /// endpoint's own thread calls this (`&mut self`), and the endpoint cannot be asleep
    /// while it runs: `Endpoint::arm` re-checks `is_empty` after everything it pushes
    /// (its progress pass) and blocks only if that finds the queue empty; so no doorbell.
    /// [`EventSender`]s, on other threads, use the ring's `push`, which rings when the
    /// consumer sleeps.
    pub fn push(&mut self, src: u32, ev: Event) {
        if !self.wants(src) {
            return;
        }
        // Once anything spilled, later events spill too (order is kept). One report when
        // spilling starts, and another whenever events are lost.
        if self.spill.is_empty() {
            if self.local.len() < self.ring.capacity() {
                self.local.push_back(ev);
                return;
            }
            self.report = true;
        }
        if self.spill.len() >= SPILL_MAX {
            self.lost += 1;
            self.report = true;
        } else {
            self.spill.push_back(ev);
        }
    }

    pub fn pop(&mut self) -> Option<Event> {
        self.ring_first = !self.ring_first;
        if self.ring_first {
            self.rx.pop().or_else(|| self.pop_own())
        } else {
            self.pop_own().or_else(|| self.rx.pop())
        }
    }

    /// The endpoint's next own event: the FIFO's, then the overflow report, then the
    /// spilled ones (so a stream of posts cannot hold back a report or the spill). For a
    /// caller that just queued one (and looks at other threads' posts by [`Self::pop`]
    /// often enough).
    pub fn pop_own(&mut self) -> Option<Event> {
        if let Some(e) = self.local.pop_front() {
            return Some(e);
        }
        if self.report {
            self.report = false;
            let lost = std::mem::take(&mut self.lost);
            return Some(Event::Overflow {
                spilled: self.spill.len() as u64,
                lost,
            });
        }
        self.spill.pop_front()
    }

    pub fn is_empty(&self) -> bool {
        self.local.is_empty() && self.rx.is_empty() && self.spill.is_empty() && !self.report
    }

    /// Whether an [`EventSender`] exists (other threads may post events).
    pub fn has_senders(&self) -> bool {
        // Ours and the consumer's references are the only ones without a sender.
        crate::evq::handles(&self.ring) > 2
    }

    /// Asks producers on other threads for a doorbell on their next event.
    pub fn arm_sleep(&mut self) {
        self.rx.arm_sleep();
    }

    pub fn disarm_sleep(&mut self) {
        self.rx.disarm_sleep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(cap: usize) -> EventQueue {
        let mut q = EventQueue::new(cap);
        q.interest = ALL;
        q
    }

    /// The endpoint's own events and other threads' `User` events both arrive, each in its
    /// own order, taken in turn while both have some.
    #[test]
    fn own_and_user_events_in_turn() {
        let mut q = queue(8);
        let ring = q.ring.clone();
        for p in 0..3 {
            q.push(PEERS, Event::PeerConnected(PeerId(p)));
        }
        for v in 0..3 {
            assert_eq!(ring.push(Event::User(v)), Ok(false), "nobody sleeps");
        }
        let got: Vec<Event> = std::iter::from_fn(|| q.pop()).collect();
        let own: Vec<Event> = (0..3).map(|p| Event::PeerConnected(PeerId(p))).collect();
        let user: Vec<Event> = (0..3).map(Event::User).collect();
        let of = |user_ev: bool| -> Vec<Event> {
            got.iter()
                .copied()
                .filter(|e| matches!(e, Event::User(_)) == user_ev)
                .collect()
        };
        assert_eq!(of(false), own);
        assert_eq!(of(true), user);
        // Taken in turn: neither source waits for the other to run dry.
        assert!(got[..2].iter().any(|e| matches!(e, Event::User(_))));
        assert!(got[..2].iter().any(|e| !matches!(e, Event::User(_))));
        assert!(q.is_empty());
    }

    /// Own events beyond the capacity spill in order behind one Overflow report; `User`
    /// events meanwhile still arrive; uninteresting sources are not queued.
    #[test]
    fn own_events_spill_in_order() {
        let mut q = queue(2);
        q.interest = PEERS;
        q.push(TRIPWIRES, Event::User(99)); // not of interest: dropped
        for p in 0..5 {
            q.push(PEERS, Event::PeerClosed(PeerId(p)));
        }
        assert_eq!(q.ring.push(Event::User(7)), Ok(false));
        let got: Vec<Event> = std::iter::from_fn(|| q.pop()).collect();
        let closed: Vec<u32> = got
            .iter()
            .filter_map(|e| match e {
                Event::PeerClosed(p) => Some(p.0),
                _ => None,
            })
            .collect();
        assert_eq!(closed, [0, 1, 2, 3, 4]);
        let report = got
            .iter()
            .position(|e| matches!(e, Event::Overflow { .. }))
            .expect("an overflow report");
        assert_eq!(
            got[report],
            Event::Overflow {
                spilled: 3,
                lost: 0
            }
        );
        let first_spilled = got
            .iter()
            .position(|e| *e == Event::PeerClosed(PeerId(2)))
            .unwrap();
        assert!(
            report < first_spilled,
            "the report comes before the spilled events"
        );
        assert_eq!(got.iter().filter(|e| **e == Event::User(7)).count(), 1);
        assert_eq!(got.len(), 7);
    }

    /// A steady stream of posts (one per pop: the ring never runs dry) holds back neither
    /// the endpoint's own events nor the overflow report and the spilled events behind
    /// them: they get every other pop.
    #[test]
    fn posts_do_not_starve_spilled_events() {
        let mut q = queue(16);
        for p in 0..19 {
            q.push(PEERS, Event::PeerClosed(PeerId(p)));
        }
        let mut own = Vec::new();
        for v in 0..40 {
            // Refused once the ring is full: it is not empty either way.
            let _ = q.ring.push(Event::User(v));
            match q.pop() {
                Some(Event::User(_)) => {}
                Some(e) => own.push(e),
                None => panic!("queue empty with posts in it"),
            }
        }
        assert_eq!(own.len(), 20, "16 queued, the report, 3 spilled: {own:?}");
        assert_eq!(
            own[16],
            Event::Overflow {
                spilled: 3,
                lost: 0
            }
        );
        assert_eq!(own[19], Event::PeerClosed(PeerId(18)));
    }
}
