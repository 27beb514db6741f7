//! A peer's rendezvous frames against this side's requests: a run of frames (each a
//! little-endian u16 length, then the bytes) goes to a peer's `Rendezvous` that holds
//! sends waiting for the peer, receives in the middle of a transfer and of a split read,
//! and an unexpected announcement. Whatever the peer sends, each frame is refused or
//! answered with actions that stay inside the requests' buffers, never a panic; and once
//! the peer dies no request is left in flight.
#![no_main]

use clink_proto::cost::{Costs, Rndv};
use clink_proto::msg::{
    Action, Announced, Arrived, Failure, RecvReq, RecvState, Rendezvous, Requests, SendReq,
    SendState,
};
use clink_proto::wire::Frame;
use clink_proto::PeerId;
use libfuzzer_sys::fuzz_target;

type Reqs = Requests<Vec<u8>, Vec<u8>, Failure>;

/// Carries out `acts` as a runtime would, checking what they ask for.
fn carry_out(
    rv: &mut Rendezvous,
    req: &mut Reqs,
    costs: &Costs,
    now: u64,
    acts: Vec<Action<Failure>>,
) {
    let mut more = Vec::new();
    for a in acts {
        match a {
            Action::Read(r) => {
                let cap = req.recvs[&r.rid].buf.len() as u64;
                assert!(r.at + r.len <= cap, "a read beyond the receive's buffer");
                rv.read_done(req, costs, r, Ok(()), now, &mut more);
            }
            Action::Write { send_id, len, .. } => {
                assert!(
                    len as usize <= req.sends[&send_id].data.len(),
                    "a push beyond the message"
                );
                rv.written(send_id, true, &mut more);
            }
            Action::Transfer { send_id, len } => rv.chunks.push(send_id, len),
            Action::Send(_) | Action::Expect { .. } => {}
        }
    }
    if !more.is_empty() {
        carry_out(rv, req, costs, now, more);
    }
}

fuzz_target!(|data: &[u8]| {
    let peer = PeerId(0);
    let costs = Costs::default();
    let mut req = Reqs::default();
    let mut rv = Rendezvous::new(peer);
    // Sends 1 to 3, announced to the peer: 0, 100 and 5 000 bytes.
    for len in [0usize, 100, 5000] {
        let id = req.alloc_id();
        let state = SendState::WaitFin;
        let data = vec![7; len];
        req.add_send(
            id,
            SendReq {
                peer,
                tag: 1,
                data,
                state,
                watched: false,
            },
        );
    }
    // Receives 4 and 5 matched the peer's sends 1 and 2: a transfer into a shorter
    // buffer, and a split read of a message longer than the buffer.
    let mut acts = Vec::new();
    let matched = [
        (1u64, 5000u64, Rndv::Pipeline, 1000),
        (2, 200_000, Rndv::Cma, 140_000),
    ];
    for (send_id, len, method, cap) in matched {
        let rid = req.alloc_id();
        let buf = vec![0; cap];
        req.add_recv(
            rid,
            RecvReq {
                buf,
                state: RecvState::Posted,
                watched: false,
                user: 0,
            },
        );
        let rts = Announced {
            tag: 1,
            len,
            send_id,
            addr: 1 << 20,
        };
        rv.matched(&mut req, rid, rts, (method, true, true), 0, &mut acts);
    }
    carry_out(&mut rv, &mut req, &costs, 1, std::mem::take(&mut acts));
    // The peer's send 3 arrived unexpected (a Cancel may withdraw it).
    req.set_aside(
        peer,
        1,
        Arrived::Rts {
            len: 9000,
            send_id: 3,
            addr: 0,
        },
    );

    let mut rest = data;
    let mut now = 2;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (f, tail) = rest[2..].split_at(n);
        rest = tail;
        let Ok(frame) = Frame::parse(f) else {
            continue;
        };
        now += 1;
        if rv
            .on_frame(&mut req, &costs, &frame, now, &mut acts)
            .is_err()
        {
            assert!(acts.is_empty(), "a refused frame asked for actions");
            continue;
        }
        carry_out(&mut rv, &mut req, &costs, now, std::mem::take(&mut acts));
        while let Some((c, d)) = rv.next_chunk(&req, |_| 4096) {
            assert_eq!(d.len() as u64, c.len);
            rv.chunk_sent(&mut req, c);
        }
    }
    rv.peer_died(&mut req, || Failure::PeerDead(peer));
    assert!(rv.is_idle());
    for s in req.sends.values() {
        assert!(
            s.state.is_done(),
            "a send still waiting after its peer died"
        );
    }
    for r in req.recvs.values() {
        assert!(
            !r.state.in_flight(),
            "a receive still in flight after its peer died"
        );
    }
});
