//! Tripwires and their events.

use super::*;

/// Arms a tripwire on `offset..offset+len` of an own aperture with `opts` (NULL: the
/// defaults, `clink_trip_options_default`) and stores it in `*trip`.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `opts` NULL or readable; `trip` writable (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire(
    ep: *mut clink_endpoint_t,
    ap: clink_aperture_t,
    offset: u64,
    len: u64,
    opts: *const clink_trip_options_t,
    trip: *mut clink_tripwire_t,
) -> c_int {
    with_ep("clink_tripwire", ep, |e, _| {
        need_out(trip, "trip")?;
        let o = opts
            .as_ref()
            .map_or(TripOptions::default(), |o| TripOptions {
                reads: o.reads != 0,
                writes: o.writes != 0,
                once: o.once != 0,
                event: o.event != 0,
            });
        let t = e.tripwire(ApertureId(ap.id), offset, len, o)?;
        trip.write(t.into());
        Ok(OK)
    })
}

/// Disarms a tripwire: `*removed` (may be NULL) = 1, or 0 when it was not armed (stale id,
/// or a once-only one that fired).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `removed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire_remove(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
    removed: *mut c_int,
) -> c_int {
    with_ep("clink_tripwire_remove", ep, |e, _| {
        put_opt(removed, c_int::from(e.tripwire_remove(trip.into())));
        Ok(OK)
    })
}

/// Reads a tripwire: `*fired` (may be NULL) = 1 when it fired since armed or last cleared
/// (a bit read, no progress made: call `clink_progress` to apply what peers sent), and
/// `*count` (may be NULL) how many times it fired since armed.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `fired`, `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire_state(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
    fired: *mut c_int,
    count: *mut u64,
) -> c_int {
    with_ep("clink_tripwire_state", ep, |e, _| {
        put_opt(fired, c_int::from(e.tripwire_fired(trip.into())));
        put_opt(count, e.tripwire_count(trip.into()));
        Ok(OK)
    })
}

/// Clears the fired bit of a tripwire.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_tripwire_clear(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
) -> c_int {
    with_ep("clink_tripwire_clear", ep, |e, _| {
        e.tripwire_clear(trip.into());
        Ok(OK)
    })
}

/// Waits (spinning, then blocking) up to `timeout_ms` (-1 forever) until a tripwire fires,
/// and clears its bit (a bit already set counts).
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint.
#[no_mangle]
pub unsafe extern "C" fn clink_wait_tripwire(
    ep: *mut clink_endpoint_t,
    trip: clink_tripwire_t,
    timeout_ms: c_int,
) -> c_int {
    with_ep("clink_wait_tripwire", ep, |e, _| {
        e.wait_tripwire(trip.into(), timeout(timeout_ms))?;
        Ok(OK)
    })
}

/// Waits up to `timeout_ms` (-1 forever) until one of the `n` tripwires of `trips` fires;
/// stores it in `*fired` (may be NULL) with its bit cleared.
///
/// Thread safety: one thread at a time per endpoint.
///
/// # Safety
/// `ep` a live endpoint; `trips` `n` readable entries; `fired` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn clink_wait_tripset(
    ep: *mut clink_endpoint_t,
    trips: *const clink_tripwire_t,
    n: usize,
    timeout_ms: c_int,
    fired: *mut clink_tripwire_t,
) -> c_int {
    with_ep("clink_wait_tripset", ep, |e, _| {
        if n == 0 {
            return Err(Fail::invalid("empty tripwire set"));
        }
        if trips.is_null() {
            return Err(Fail::null("trips"));
        }
        let mut set = Tripset::new();
        for &t in std::slice::from_raw_parts(trips, n) {
            set.add(t.into());
        }
        let t = e.wait_tripset(&set, timeout(timeout_ms))?;
        put_opt(fired, t.into());
        Ok(OK)
    })
}
