//! Receives and messages the provider keeps while clink does not need them: a receive
//! into one buffer posted while clink holds no posted receive and no unexpected message
//! stays here ([`State::lazy`]), and the eager messages at the rings' heads are matched
//! against such receives by the provider ([`Endpoint::poll_eager`]) or kept in arrival
//! order ([`State::early`]). Anything else hands both to clink first, in order.

use super::*;

/// How many emptied buffers of early messages an endpoint keeps (each at most
/// [`SPARE_BYTES`]): a burst of messages before their receives then allocates nothing.
pub(super) const SPARE_MAX: usize = 64;
pub(super) const SPARE_BYTES: usize = 64 << 10;

impl State {
    /// Completes a receive into one buffer with the first message of [`State::early`] it
    /// matches, if any (out of line: most receives find none there).
    #[inline(never)]
    pub(super) fn recv_early(
        &mut self,
        sel: Selector,
        buf: *mut u8,
        cap: usize,
        ctx: *mut c_void,
        report: bool,
    ) -> bool {
        let Some(k) = self.early.iter().position(|m| sel.matches(m.0, m.1)) else {
            return false;
        };
        let (peer, tag, mut data) = take_at(&mut self.early, k);
        // SAFETY: the caller's buffer of `cap` bytes, for this call.
        let res = unsafe { copy_into(buf, cap, peer, tag, &data) };
        if self.spare.len() < SPARE_MAX && data.capacity() <= SPARE_BYTES {
            data.clear();
            self.spare.push(data);
        }
        let r = PostedRecv::kept(sel, ctx, Dest::Direct { buf, cap }, report);
        // Landed whole from a known peer: reported on the spot, as a polled message is.
        let known = peers::known_source(&self.sources, peer);
        match (&res, known, self.rx_cq.as_deref()) {
            (Ok(st), Some(src), Some(cq)) => {
                let full = st.len as usize;
                r.report(cq, self.msg, full, full, st.tag, src);
            }
            _ => self.finish_recv(r, landed(res)),
        }
        true
    }

    /// Hands the messages ([`State::early`]) and receives ([`State::lazy`]) the provider
    /// kept to clink, each in its order.
    pub(super) fn hand_over(&mut self) {
        while let Some((peer, tag, data)) = self.early.pop_front() {
            // (A peer the endpoint knows: it sent the message.)
            let _ = self.ep.set_aside(peer, tag, data);
        }
        while let Some((user, sel)) = self.lazy.pop_front() {
            let Some(r) = self.posted.get_mut(user) else {
                continue;
            };
            let Dest::Direct { buf, cap } = r.dest else {
                continue;
            };
            // SAFETY: as for any posted receive: the caller's buffer stays valid until
            // the completion.
            let req = unsafe { self.ep.irecv_raw_user(sel, buf, cap, user) };
            // A source found dead fails the receive at once.
            let res = self.ep.test_recv(&req);
            r.req = Some(req);
            if let Ok(None) = res {
                continue;
            }
            if let Some(r) = self.posted.take(user) {
                self.finish_recv(r, res);
            }
        }
    }

    /// Matches the messages at the heads of the rings against the receives the provider
    /// kept ([`State::lazy`]), completing them, and keeps those none wants
    /// ([`State::early`]); false when clink is needed (it holds receives or messages, or a
    /// progress pass is due): the caller hands its receives and messages over.
    pub(super) fn poll_lazy(&mut self) -> bool {
        let mut declined = false;
        let State {
            ep,
            posted,
            lazy,
            early,
            spare,
            rx_cq,
            sources,
            msg,
            fast,
            ..
        } = self;
        let polled = ep.poll_eager(|src, tag, data| {
            let Some(k) = lazy.iter().position(|(_, sel)| sel.matches(src, tag)) else {
                let mut kept = spare.pop().unwrap_or_default();
                kept.extend_from_slice(data);
                early.push_back((src, tag, kept));
                return true;
            };
            let (user, _) = take_at(lazy, k);
            let Some(&PostedRecv {
                dest: Dest::Direct { buf, cap },
                ..
            }) = posted.get(user)
            else {
                // (Not a kept receive: none is anything else. The message stays for clink.)
                declined = true;
                return false;
            };
            // SAFETY: the caller's buffer of `cap` bytes, valid until the completion.
            let res = unsafe { copy_into(buf, cap, src, tag, data) };
            let known = peers::known_source(sources, src);
            match (&res, known, rx_cq.as_deref()) {
                (Ok(_), Some(a), Some(cq)) => {
                    let full = data.len();
                    let r = posted.take(user).expect("looked at");
                    r.report(cq, *msg, full, full, tag, a);
                }
                _ => fast.push((user, res)),
            }
            true
        });
        polled.is_some() && !declined
    }
}

/// Takes entry `k` (present) out of `q`. Nearly always the first, taken with `pop_front`:
/// `VecDeque::remove(0)` gives the same but cost every hop of the provider's own matching
/// about 27 instructions more (`provider_cost`, callgrind).
fn take_at<T>(q: &mut std::collections::VecDeque<T>, k: usize) -> T {
    if k == 0 { q.pop_front() } else { q.remove(k) }.expect("an entry at k")
}

/// Copies eager message `data` (of `tag`, from `src`) into the caller's buffer `buf` of
/// `cap` bytes, as much as fits: its status, or its truncation.
///
/// # Safety
/// `buf` holds `cap` writable bytes (a zero-length receive may pass no buffer).
unsafe fn copy_into(
    buf: *mut u8,
    cap: usize,
    src: PeerId,
    tag: u64,
    data: &[u8],
) -> clink::Result<clink::Status> {
    let into: &mut [u8] = if cap == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(buf, cap) }
    };
    clink_proto::msg::copy_eager(src, tag, data, into)
}
