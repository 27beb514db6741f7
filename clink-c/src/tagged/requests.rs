//! Non-blocking requests: sends, receives (into memory or an aperture) and one-sided
//! operations in flight, tested, waited for, cancelled and freed.

use super::*;

enum Kind {
    Send {
        req: Option<SendRequest>,
        peer: clink_peer_t,
        tag: u64,
        len: u64,
    },
    Recv {
        req: Option<RecvRequest>,
        /// Where the bytes go (NULL for a receive into an aperture).
        dst: *mut u8,
        cap: usize,
        aperture: bool,
        sel: Selector,
    },
    Rma {
        req: Option<RmaRequest>,
        /// Where a get's bytes go (NULL for a put).
        dst: *mut u8,
        cap: usize,
    },
}

/// How a request's completion is asked for.
#[derive(Clone, Copy)]
enum Ask {
    /// Once, without waiting (makes progress).
    Test,
    /// Waiting up to a time (`None`: for ever); running out of it leaves the request
    /// pending.
    Wait(Option<Duration>),
}

/// A non-blocking operation in flight (`clink_isend`, `clink_irecv`,
/// `clink_irecv_into_aperture`, `clink_iput`, `clink_iget`). Complete it with
/// `clink_test`, `clink_wait` or `clink_wait_any` (which store its result in it: testing a
/// completed request again returns the same result), then free it with
/// `clink_request_free`.
pub struct clink_request_t {
    owner: usize,
    id: u64,
    kind: Kind,
    done: Option<(clink_error, clink_status_t, String)>,
}

impl clink_request_t {
    fn new(owner: &clink_endpoint_t, id: u64, kind: Kind) -> *mut clink_request_t {
        Box::into_raw(Box::new(clink_request_t {
            owner: owner.key(),
            id,
            kind,
            done: None,
        }))
    }

    pub(crate) fn new_rma(
        owner: &clink_endpoint_t,
        req: RmaRequest,
        dst: *mut u8,
        cap: usize,
    ) -> *mut clink_request_t {
        clink_request_t::new(
            owner,
            req.id(),
            Kind::Rma {
                req: Some(req),
                dst,
                cap,
            },
        )
    }

    fn finish(&mut self, code: clink_error, status: clink_status_t, msg: String) {
        self.done = Some((code, status, msg));
    }

    fn fail(&mut self, e: Error) {
        let code = code_of(&e);
        self.finish(code, clink_status_t::default(), e.to_string());
    }

    /// The completed request's result: status written, its code (errors as `Err`).
    unsafe fn report(&self, status: *mut clink_status_t) -> R<c_int> {
        let Some((code, st, msg)) = &self.done else {
            return Ok(AGAIN);
        };
        put_opt(status, *st);
        if (*code as c_int) < 0 {
            return Err(Fail::new(*code, msg.clone()));
        }
        Ok(*code as c_int)
    }

    /// A receive's outcome: `Ok(true)` once complete (result stored), `Ok(false)` while
    /// pending, `Err` for a timeout (the request stays pending).
    fn recv_outcome(
        &mut self,
        e: &mut Endpoint,
        res: clink_rs::Result<Option<Received>>,
    ) -> R<bool> {
        let Kind::Recv {
            req,
            dst,
            cap,
            aperture,
            sel,
        } = &mut self.kind
        else {
            return Err(Fail::invalid("not a receive"));
        };
        match res {
            Ok(None) => Ok(false),
            Ok(Some(got)) => {
                if !*aperture && !got.buf.is_empty() {
                    let n = got.buf.len().min(*cap);
                    // SAFETY: the caller lent `cap` writable bytes at `dst` until completion.
                    unsafe { std::ptr::copy_nonoverlapping(got.buf.as_ptr(), *dst, n) };
                }
                *req = None;
                self.finish(CLINK_OK, got.status.into(), String::new());
                Ok(true)
            }
            Err(Error::Timeout) => Err(Fail::new(CLINK_ERR_TIMEOUT, "timed out")),
            Err(err @ Error::Truncated { len, .. }) => {
                if let Some(r) = req.take() {
                    if let Some(v) = e.take_recv_buffer(r) {
                        if !*aperture {
                            let n = v.len().min(*cap);
                            // SAFETY: as above.
                            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), *dst, n) };
                        }
                    }
                }
                let st = truncated_status(*sel, len);
                self.finish(CLINK_ERR_TRUNCATED, st, err.to_string());
                Ok(true)
            }
            Err(err) => {
                *req = None;
                self.fail(err);
                Ok(true)
            }
        }
    }

    /// Tests for completion (makes progress): `Ok(true)` once complete.
    fn test(&mut self, e: &mut Endpoint) -> R<bool> {
        self.progress(e, Ask::Test)
    }

    /// Waits up to `t` for completion: `Err` (timeout) leaves it pending.
    fn wait(&mut self, e: &mut Endpoint, t: Option<Duration>) -> R<()> {
        self.progress(e, Ask::Wait(t)).map(|_| ())
    }

    /// Asks for completion as `ask` says: `Ok(true)` once complete (result stored),
    /// `Ok(false)` while pending, `Err` for a wait that timed out (the request stays
    /// pending).
    fn progress(&mut self, e: &mut Endpoint, ask: Ask) -> R<bool> {
        if self.done.is_some() {
            return Ok(true);
        }
        match &mut self.kind {
            Kind::Send {
                req,
                peer,
                tag,
                len,
            } => {
                let st = clink_status_t {
                    peer: *peer,
                    tag: *tag,
                    len: *len,
                };
                let Some(r) = req else {
                    return Err(Fail::invalid("request has no operation"));
                };
                let res = match ask {
                    Ask::Test => e.test_send(r),
                    Ask::Wait(t) => e.wait_send(r, t).map(|()| true),
                };
                match res {
                    Ok(false) => Ok(false),
                    Ok(true) => {
                        *req = None;
                        self.finish(CLINK_OK, st, String::new());
                        Ok(true)
                    }
                    Err(Error::Timeout) if matches!(ask, Ask::Wait(_)) => {
                        Err(Fail::new(CLINK_ERR_TIMEOUT, "timed out"))
                    }
                    Err(err) => {
                        *req = None;
                        self.fail(err);
                        Ok(true)
                    }
                }
            }
            Kind::Recv { req, .. } => {
                let Some(r) = req else {
                    return Err(Fail::invalid("request has no operation"));
                };
                let res = match ask {
                    Ask::Test => e.test_recv(r),
                    Ask::Wait(t) => e.wait_recv(r, t).map(Some),
                };
                self.recv_outcome(e, res)
            }
            Kind::Rma { req, dst, cap } => {
                let Some(r) = req else {
                    return Err(Fail::invalid("request has no operation"));
                };
                let res = match ask {
                    Ask::Test => e.test_rma(r),
                    Ask::Wait(t) => e.wait_rma(r, t).map(Some),
                };
                match res {
                    Ok(None) => Ok(false),
                    Ok(Some(v)) => {
                        let (dst, cap) = (*dst, *cap);
                        *req = None;
                        self.rma_done(v, dst, cap);
                        Ok(true)
                    }
                    Err(Error::Timeout) if matches!(ask, Ask::Wait(_)) => {
                        Err(Fail::new(CLINK_ERR_TIMEOUT, "timed out"))
                    }
                    Err(err) => {
                        *req = None;
                        self.fail(err);
                        Ok(true)
                    }
                }
            }
        }
    }

    /// A one-sided operation done: a get's bytes copied to the caller's memory.
    fn rma_done(&mut self, v: Vec<u8>, dst: *mut u8, cap: usize) {
        if !dst.is_null() {
            let n = v.len().min(cap);
            // SAFETY: the caller lent `cap` writable bytes at `dst` until completion.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst, n) };
        }
        let st = clink_status_t {
            peer: CLINK_PEER_ANY,
            tag: 0,
            len: v.len() as u64,
        };
        self.finish(CLINK_OK, st, String::new());
    }
}

/// The request behind a C pointer, checked to belong to `h`.
unsafe fn req_mut<'a>(h: &clink_endpoint_t, r: *mut clink_request_t) -> R<&'a mut clink_request_t> {
    let r = r.as_mut().ok_or_else(|| Fail::null("request"))?;
    if r.owner != h.key() {
        return Err(Fail::invalid("the request belongs to another endpoint"));
    }
    Ok(r)
}

/// Starts sending `len` bytes at `buf` to `peer` with `tag` and stores the request in
/// `*req`. Zero-copy: the endpoint reads `buf` itself (small messages are copied into the
/// peer's ring at once and the request is then already complete; large ones are read from
/// `buf` by the receiver, by CMA on the same host).
///
/// Ownership: `buf` stays lent to the library until the request completes (test/wait
/// report completion) or a cancel withdraws it: keep it valid and unchanged until then.
/// `*req` is freed with `clink_request_free`. Thread safety: one thread at a time per
/// endpoint.
///
/// # Safety
/// `ep` a live endpoint; `buf` `len` readable bytes (NULL when `len` is 0), valid until
/// completion; `req` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_isend(
    ep: *mut clink_endpoint_t,
    peer: clink_peer_t,
    tag: u64,
    buf: *const c_void,
    len: usize,
    req: *mut *mut clink_request_t,
) -> c_int {
    with_ep("clink_isend", ep, |e, h| {
        need_out(req, "req")?;
        let data = lent_bytes(buf, len)?;
        let r = e.isend(PeerId(peer), tag, data)?;
        req.write(clink_request_t::new(
            h,
            r.id(),
            Kind::Send {
                req: Some(r),
                peer,
                tag,
                len: len as u64,
            },
        ));
        Ok(OK)
    })
}

/// Posts a receive of a message matching `sel` into `buf` (capacity `cap`) and stores the
/// request in `*req`. Completion (test/wait/wait_any) fills the status as `clink_recv`
/// does, truncation included.
///
/// Copies: the Rust API's non-blocking receive owns its buffer (there is no variant
/// borrowing caller memory), so the library receives into a buffer of its own of `cap`
/// bytes and copies the message into `buf` when the request completes: one copy more than
/// `clink_recv`. For zero-copy non-blocking receives use `clink_irecv_into_aperture`
/// (the message lands in aperture memory, readable in place through
/// `clink_aperture_window`).
///
/// Ownership: `buf` is written when the request completes (in test/wait): keep it valid
/// until then, or cancel. Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `buf` `cap` writable bytes (NULL when `cap` is 0) valid until
/// completion; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn clink_irecv(
    ep: *mut clink_endpoint_t,
    sel: clink_selector_t,
    buf: *mut c_void,
    cap: usize,
    req: *mut *mut clink_request_t,
) -> c_int {
    with_ep("clink_irecv", ep, |e, h| {
        need_out(req, "req")?;
        if cap != 0 && buf.is_null() {
            return Err(Fail::null("buf"));
        }
        let s = sel.to_rust();
        let r = e.irecv(s, vec![0u8; cap])?;
        req.write(clink_request_t::new(
            h,
            r.id(),
            Kind::Recv {
                req: Some(r),
                dst: buf.cast(),
                cap,
                aperture: false,
                sel: s,
            },
        ));
        Ok(OK)
    })
}

/// Posts a zero-copy receive of a message matching `sel` into `offset..offset+len` of this
/// endpoint's aperture `ap` (the message lands there; its length is in the completion
/// status). When it completes, the aperture's write tripwires over the bytes that landed
/// fire. The aperture cannot be destroyed while the receive is pending.
///
/// Ownership: `*req` is freed with `clink_request_free`. Thread safety: one thread at a
/// time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn clink_irecv_into_aperture(
    ep: *mut clink_endpoint_t,
    sel: clink_selector_t,
    ap: clink_aperture_t,
    offset: u64,
    len: u64,
    req: *mut *mut clink_request_t,
) -> c_int {
    with_ep("clink_irecv_into_aperture", ep, |e, h| {
        need_out(req, "req")?;
        let s = sel.to_rust();
        let r = e.irecv_into_aperture(s, ApertureId(ap.id), offset, len)?;
        req.write(clink_request_t::new(
            h,
            r.id(),
            Kind::Recv {
                req: Some(r),
                dst: std::ptr::null_mut(),
                cap: 0,
                aperture: true,
                sel: s,
            },
        ));
        Ok(OK)
    })
}

/// Tests a request (makes progress first): `CLINK_AGAIN` while pending; once complete
/// its result: `CLINK_OK` with `*status` filled (receives: sender, tag, length; sends:
/// destination, tag, length; gets: length), or its error (`CLINK_ERR_TRUNCATED` with the
/// status filled, `CLINK_ERR_CANCELLED`, `CLINK_ERR_PEER_DEAD`, ...). A complete request
/// keeps its result: testing it again returns the same.
///
/// Thread safety: one thread at a time per endpoint (and per request).
///
/// # Safety
/// `ep` a live endpoint; `req` a live request of that endpoint; `status` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_test(
    ep: *mut clink_endpoint_t,
    req: *mut clink_request_t,
    status: *mut clink_status_t,
) -> c_int {
    with_ep("clink_test", ep, |e, h| {
        let r = req_mut(h, req)?;
        r.test(e)?;
        r.report(status)
    })
}

/// Waits up to `timeout_ms` (-1 forever) for a request to complete and returns its result
/// as `clink_test` does; `CLINK_ERR_TIMEOUT` leaves it pending.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// As `clink_test`.
#[no_mangle]
pub unsafe extern "C" fn clink_wait(
    ep: *mut clink_endpoint_t,
    req: *mut clink_request_t,
    timeout_ms: c_int,
    status: *mut clink_status_t,
) -> c_int {
    with_ep("clink_wait", ep, |e, h| {
        let r = req_mut(h, req)?;
        r.wait(e, timeout(timeout_ms))?;
        r.report(status)
    })
}

/// Waits up to `timeout_ms` (-1 forever) for the first of the `n` requests of `reqs` to
/// complete (MPI's Waitany): stores its index in `*index` and returns its result as
/// `clink_test` does. NULL entries are skipped (all NULL: `CLINK_ERR_INVALID`). A request
/// already complete is returned at once: free it and set its entry to NULL (or reuse the
/// slot) before waiting again. `CLINK_ERR_TIMEOUT` leaves them all pending. When all are
/// receives, one progress loop serves them all; a mix of kinds is tested in turn between
/// sleeps on the endpoint's fd.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `reqs` `n` entries, each NULL or a live request of that endpoint;
/// `index` writable (NULL refused); `status` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_wait_any(
    ep: *mut clink_endpoint_t,
    reqs: *const *mut clink_request_t,
    n: usize,
    timeout_ms: c_int,
    index: *mut usize,
    status: *mut clink_status_t,
) -> c_int {
    with_ep("clink_wait_any", ep, |e, h| {
        need_out(index, "index")?;
        if reqs.is_null() {
            return Err(Fail::null("reqs"));
        }
        let all = std::slice::from_raw_parts(reqs, n);
        let mut live = Vec::with_capacity(n);
        for (i, &p) in all.iter().enumerate() {
            if !p.is_null() {
                live.push((i, req_mut(h, p)?));
            }
        }
        if live.is_empty() {
            return Err(Fail::invalid("no request (every entry is NULL)"));
        }
        if let Some((i, r)) = live.iter().find(|(_, r)| r.done.is_some()) {
            index.write(*i);
            return r.report(status);
        }
        let t = timeout(timeout_ms);
        let k = if live
            .iter()
            .all(|(_, r)| matches!(r.kind, Kind::Recv { req: Some(_), .. }))
        {
            wait_any_recv(e, &mut live, t)?
        } else {
            wait_any_mixed(e, &mut live, t)?
        };
        index.write(live[k].0);
        live[k].1.report(status)
    })
}

/// Waits for the first of several receives with one progress loop.
fn wait_any_recv(
    e: &mut Endpoint,
    live: &mut [(usize, &mut clink_request_t)],
    t: Option<Duration>,
) -> R<usize> {
    let take = |r: &mut clink_request_t| match &mut r.kind {
        Kind::Recv { req, .. } => req.take(),
        _ => None,
    };
    let mut taken: Vec<RecvRequest> = live.iter_mut().filter_map(|(_, r)| take(r)).collect();
    let res = e.wait_any_recv(&taken, t);
    // Give every request back before looking at the outcome.
    for (_, r) in live.iter_mut().rev() {
        if let Kind::Recv { req, .. } = &mut r.kind {
            *req = taken.pop();
        }
    }
    let (k, res) = res?;
    let r = &mut *live[k].1;
    r.recv_outcome(e, res.map(Some))?;
    Ok(k)
}

/// Waits for the first of requests of several kinds: tests each in turn after each of the
/// endpoint's progress passes, waiting as its own blocking calls do (`Endpoint::wait_until`).
fn wait_any_mixed(
    e: &mut Endpoint,
    live: &mut [(usize, &mut clink_request_t)],
    t: Option<Duration>,
) -> R<usize> {
    let mut outcome: Option<R<usize>> = None;
    let waited = e.wait_until(t, |e| {
        for (k, (_, r)) in live.iter_mut().enumerate() {
            match r.test(e) {
                Ok(false) => {}
                Ok(true) => outcome = Some(Ok(k)),
                Err(f) => outcome = Some(Err(f)),
            }
            if outcome.is_some() {
                return true;
            }
        }
        false
    });
    match (outcome, waited) {
        (Some(o), _) => o,
        (None, Err(err)) => Err(err.into()),
        (None, Ok(())) => Err(Fail::invalid("the wait ended without a finished request")),
    }
}

/// Cancels a request. `*withdrawn` (may be NULL) = 1 when the operation was withdrawn
/// (the request then completes with `CLINK_ERR_CANCELLED`; a send's buffer is no longer
/// read), 0 when it was too late: a send already in the peer's ring is delivered (the
/// request completes with `CLINK_OK`), a receive that already matched a message completes
/// normally (wait for it). Cancelling a send waits for the receiver's answer (bounded by
/// its liveness). One-sided requests cannot be cancelled (`CLINK_ERR_INVALID`).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `req` a live request of it; `withdrawn` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_cancel(
    ep: *mut clink_endpoint_t,
    req: *mut clink_request_t,
    withdrawn: *mut c_int,
) -> c_int {
    with_ep("clink_cancel", ep, |e, h| {
        let r = req_mut(h, req)?;
        put_opt(withdrawn, 0);
        if r.done.is_some() {
            return Ok(OK);
        }
        let cancelled = || String::from("cancelled");
        match &mut r.kind {
            Kind::Send {
                req,
                peer,
                tag,
                len,
            } => {
                let st = clink_status_t {
                    peer: *peer,
                    tag: *tag,
                    len: *len,
                };
                let Some(s) = req.take() else {
                    return Err(Fail::invalid("request has no operation"));
                };
                match e.cancel_send(s) {
                    Ok(true) => {
                        put_opt(withdrawn, 1);
                        r.finish(CLINK_ERR_CANCELLED, st, cancelled());
                    }
                    Ok(false) => r.finish(CLINK_OK, st, String::new()),
                    Err(err) => {
                        let f = Fail::new(code_of(&err), err.to_string());
                        r.fail(err);
                        return Err(f);
                    }
                }
            }
            Kind::Recv {
                req: Some(q),
                aperture,
                ..
            } => {
                let aperture = *aperture;
                let gone = match e.cancel_recv(q)? {
                    Some(_) => true,
                    // A receive into an aperture gives no buffer back: it was withdrawn
                    // when the endpoint no longer knows it.
                    None if aperture => matches!(e.test_recv(q), Err(Error::Consumed)),
                    None => false,
                };
                if gone {
                    put_opt(withdrawn, 1);
                    if let Kind::Recv { req, .. } = &mut r.kind {
                        *req = None;
                    }
                    r.finish(CLINK_ERR_CANCELLED, clink_status_t::default(), cancelled());
                }
            }
            Kind::Recv { req: None, .. } => {
                return Err(Fail::invalid("request has no operation"));
            }
            Kind::Rma { .. } => {
                return Err(Fail::invalid("one-sided requests cannot be cancelled"));
            }
        }
        Ok(OK)
    })
}

/// The request's number, as carried by `CLINK_EVENT_SEND_DONE`, `CLINK_EVENT_RECV_DONE`
/// and `CLINK_EVENT_RMA_DONE` events (0 for a NULL request, and for a send complete at
/// once while request events were not wanted).
///
/// Thread safety: any thread not freeing the request.
///
/// # Safety
/// `req` NULL or a live request.
#[no_mangle]
pub unsafe extern "C" fn clink_request_id(req: *const clink_request_t) -> u64 {
    req.as_ref().map_or(0, |r| r.id)
}

/// Frees a request handle. NULL is ignored. Freeing a pending request does not cancel it:
/// a send still reads its buffer until it completes on its own (cancel or wait first), a
/// receive still takes the next matching message (and drops it) unless cancelled first.
///
/// Thread safety: no other call may be using this request.
///
/// # Safety
/// `req` NULL or a request not freed yet.
#[no_mangle]
pub unsafe extern "C" fn clink_request_free(req: *mut clink_request_t) {
    if !req.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(req))));
    }
}
