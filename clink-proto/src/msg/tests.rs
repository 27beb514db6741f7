use super::*;
use crate::cost::Rndv;

fn st(len: u64) -> Status {
    Status {
        peer: PeerId(1),
        tag: 7,
        len,
    }
}

#[test]
fn a_large_read_is_split_at_a_page_boundary_and_a_small_one_is_not() {
    let m = 1 << 20;
    assert_eq!(
        plan(Rndv::Cma, true, m, m, true),
        Plan::Cma {
            n: m,
            pushed: m / 2
        }
    );
    // Odd lengths: the sender's head ends on a page boundary.
    let odd = 300_001;
    let Plan::Cma { n, pushed } = plan(Rndv::Cma, true, odd, odd, true) else {
        panic!("not a CMA read");
    };
    assert_eq!((n, pushed % CMA_SPLIT_ALIGN), (odd, 0));
    assert!(pushed <= odd / 2 && pushed > odd / 2 - CMA_SPLIT_ALIGN);
    // Below the split's minimum, with splits off, into a short buffer, or not CMA.
    let small = crate::cost::CMA_SPLIT_MIN - 1;
    assert_eq!(
        plan(Rndv::Cma, true, small, small, true),
        Plan::Cma {
            n: small,
            pushed: 0
        }
    );
    assert_eq!(
        plan(Rndv::Cma, true, m, m, false),
        Plan::Cma { n: m, pushed: 0 }
    );
    assert_eq!(
        plan(Rndv::Cma, true, m, 10, true),
        Plan::Cma { n: 10, pushed: 0 }
    );
    assert_eq!(plan(Rndv::Cma, false, m, m, true), Plan::Transfer);
    assert_eq!(plan(Rndv::Pipeline, true, m, m, true), Plan::Transfer);
}

#[test]
fn chunks_must_come_in_order_and_the_last_completes_the_receive() {
    let mut r = RecvState::<Failure>::transfer(st(10), 100);
    assert_eq!(
        r.on_chunk(4, 2, 10),
        Err("chunk out of order or beyond the message")
    );
    assert_eq!(
        r.on_chunk(0, 4, 10).unwrap(),
        Chunk {
            copy: 0..4,
            done: None
        }
    );
    assert_eq!(
        r.on_chunk(4, 7, 10),
        Err("chunk out of order or beyond the message")
    );
    assert_eq!(
        r.on_chunk(4, 6, 10).unwrap(),
        Chunk {
            copy: 4..10,
            done: Some(100)
        }
    );
    assert!(matches!(r, RecvState::Done(Ok(s)) if s == st(10)));
    assert_eq!(
        r.on_chunk(10, 0, 10),
        Err("chunk for a receive not in progress")
    );
}

#[test]
fn chunks_beyond_a_short_buffer_are_dropped_and_the_receive_is_truncated() {
    let mut r = RecvState::<Failure>::transfer(st(10), 0);
    assert_eq!(r.on_chunk(0, 6, 4).unwrap().copy, 0..4);
    assert_eq!(r.on_chunk(6, 4, 4).unwrap().copy, 4..4);
    assert!(matches!(
        r,
        RecvState::Done(Err(Failure::Truncated {
            len: 10,
            capacity: 4
        }))
    ));
}

#[test]
fn a_split_read_ends_with_both_halves_and_fails_with_either() {
    let both = |read: Result<(), Failure>, written: bool, head: Result<(), Failure>| {
        let mut r = RecvState::after_cma(st(8192), 8192, 4096, read, 5, 0xa000);
        assert!(r.in_flight());
        let end = r.on_pushed(written).unwrap();
        assert_eq!(
            (end.pushed, end.addr, end.since, end.written),
            (4096, 0xa000, 5, written)
        );
        end.finish(head, 8192)
    };
    assert!(matches!(both(Ok(()), true, Ok(())), RecvState::Done(Ok(_))));
    let gone = || Failure::Read {
        peer: PeerId(1),
        source: std::io::Error::other("gone"),
    };
    assert!(matches!(
        both(Err(gone()), true, Ok(())),
        RecvState::Done(Err(Failure::Read { .. }))
    ));
    assert!(matches!(
        both(Ok(()), false, Err(gone())),
        RecvState::Done(Err(Failure::Read { .. }))
    ));
    let mut posted = RecvState::<Failure>::Posted;
    assert!(posted.on_pushed(true).is_err());
    // Not split: over at once.
    assert!(RecvState::<Failure>::after_cma(st(10), 10, 0, Ok(()), 0, 0).is_done());
}

#[test]
fn a_send_answers_only_the_frames_its_state_expects() {
    let mut s = SendState::<Failure>::Queued;
    assert_eq!(s.cancel_step(), CancelStep::Withdraw);
    assert!(!s.on_fin(), "a Fin before the RTS left");
    assert!(s.on_cts().is_err());
    assert!(s.push_part(1, 10).is_err());
    s.announced();
    assert_eq!(s.cancel_step(), CancelStep::AskReceiver);
    assert_eq!(s.push_part(4, 10), Ok(0..4));
    assert!(s.push_part(11, 10).is_err());
    assert!(
        !s.on_cancel_ack(false),
        "a refused cancel leaves it waiting"
    );
    s.on_cts().unwrap();
    assert_eq!(s.cancel_step(), CancelStep::AwaitEnd);
    assert!(
        !s.on_fin() && !s.on_cancel_ack(true),
        "a transfer ends only by itself"
    );
    assert!(s.transfer_done());
    assert_eq!(s.cancel_step(), CancelStep::Over);
    assert!(!s.fail(Failure::PeerDead(PeerId(0))), "over already");
    assert!(matches!(s, SendState::Done(Ok(()))));

    let mut c = SendState::<Failure>::WaitFin;
    assert!(c.on_cancel_ack(true));
    assert!(matches!(c, SendState::Done(Err(Failure::Cancelled))));
}

#[test]
fn a_cancel_withdraws_only_its_own_unmatched_announcement() {
    let mut m = Matcher::<u64, Arrived>::default();
    let rts = |send_id| Arrived::Rts {
        len: 1 << 20,
        send_id,
        addr: 0,
    };
    m.push_unexpected(PeerId(1), 5, rts(1));
    m.push_unexpected(PeerId(1), 5, Arrived::Eager(vec![1]));
    m.push_unexpected(PeerId(2), 5, rts(2));
    assert!(
        !withdraw(&mut m, PeerId(1), 2),
        "another peer's send of that id"
    );
    assert!(withdraw(&mut m, PeerId(1), 1));
    assert!(!withdraw(&mut m, PeerId(1), 1), "already withdrawn");
    assert_eq!(m.unexpected_len(), 2);
}

#[test]
fn a_message_goes_eager_up_to_the_threshold_and_an_unreliable_link_takes_no_more() {
    let reliable = || false;
    assert_eq!(Protocol::choose(0, 64, reliable), Ok(Protocol::Eager));
    assert_eq!(Protocol::choose(64, 64, reliable), Ok(Protocol::Eager));
    assert_eq!(Protocol::choose(65, 64, reliable), Ok(Protocol::Rendezvous));
    // The link's reliability is asked only for a message above the threshold.
    let asked = std::cell::Cell::new(0);
    let unreliable = || {
        asked.set(asked.get() + 1);
        true
    };
    assert_eq!(Protocol::choose(64, 64, unreliable), Ok(Protocol::Eager));
    assert_eq!(asked.get(), 0);
    assert_eq!(
        Protocol::choose(65, 64, unreliable),
        Err(TooLong { len: 65, max: 64 })
    );
    assert_eq!(asked.get(), 1);
    // A queued send keeps the protocol it was sent with.
    assert_eq!(Protocol::of(64, 64), Protocol::Eager);
    assert_eq!(Protocol::of(u64::MAX, 64), Protocol::Rendezvous);
}
