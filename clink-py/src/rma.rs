//! The one-sided side: apertures, cookies, put/get/atomics, mapped windows, tripwires and
//! the event queue.

use crate::endpoint::{selector, Endpoint, Status};
use crate::{duration, fill_view, invalid, HeldBuffer};
use clink_rs::rma::{ApertureId, Cookie, TripId, TripOptions, Window};
use clink_rs::PeerId;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

fn trip_id(t: TripId) -> u64 {
    (u64::from(t.gen) << 32) | u64::from(t.index)
}

fn trip_of(v: u64) -> TripId {
    TripId {
        index: v as u32,
        gen: (v >> 32) as u32,
    }
}

/// An aperture of this endpoint (``Endpoint.aperture_alloc``): memory peers may access
/// through exported cookies. It is a writable buffer over that memory (``memoryview(ap)``,
/// ``numpy.frombuffer(ap, ...)``): the owner reads what peers put there, and writes what
/// they get, without copies. The memory stays mapped while the object lives (after
/// ``destroy()`` too, then read by nobody).
#[pyclass(module = "clink", frozen)]
pub struct Aperture {
    owner: Py<Endpoint>,
    /// The aperture's number within its endpoint.
    #[pyo3(get)]
    id: u32,
    win: Window,
}

#[pymethods]
impl Aperture {
    fn __len__(&self) -> usize {
        self.win.len() as usize
    }

    /// Destroys the aperture at its endpoint: later accesses by peers are refused.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        self.owner.get().sh.with(py, |ep| {
            ep.aperture_destroy(ApertureId(self.id)).map(|_| ())
        })
    }

    fn __repr__(&self) -> String {
        format!("Aperture(id={}, {} bytes)", self.id, self.win.len())
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let w = &slf.get().win;
        // SAFETY: `view` as Python gave it; the window's mapping lives as long as this
        // object, which the view holds a reference to.
        unsafe {
            fill_view(
                slf.as_any(),
                view,
                flags,
                w.as_ptr(),
                w.len() as usize,
                false,
            )
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// A window of a peer's aperture, imported from its cookie (``Endpoint.import_cookie``).
#[pyclass(module = "clink", frozen)]
pub struct Remote {
    r: clink_rs::rma::Remote,
}

#[pymethods]
impl Remote {
    /// The owner of the aperture.
    #[getter]
    fn peer(&self) -> u32 {
        self.r.peer.0
    }

    fn __len__(&self) -> usize {
        self.r.len() as usize
    }

    /// The cookie's bytes.
    fn cookie<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.r.cookie.to_bytes())
    }

    fn __repr__(&self) -> String {
        format!("Remote(peer={}, {} bytes)", self.r.peer.0, self.r.len())
    }
}

/// A same-host peer's window mapped into this process (``Endpoint.map``): a buffer whose
/// writes are plain stores into the peer's aperture (no system call, no copy through the
/// owner; call ``Endpoint.notify`` to fire its tripwires). Writable when the cookie grants
/// WRITE. Stays mapped while the object lives.
#[pyclass(module = "clink", frozen)]
pub struct MappedWindow {
    win: Window,
}

#[pymethods]
impl MappedWindow {
    fn __len__(&self) -> usize {
        self.win.len() as usize
    }

    /// Whether stores are allowed.
    #[getter]
    fn writable(&self) -> bool {
        self.win.writable()
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let w = &slf.get().win;
        // SAFETY: `view` as Python gave it; the window's mapping lives as long as this
        // object, which the view holds a reference to.
        unsafe {
            fill_view(
                slf.as_any(),
                view,
                flags,
                w.as_ptr(),
                w.len() as usize,
                !w.writable(),
            )
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// Something that happened on an endpoint (``Endpoint.wait_event``). ``kind`` is one of
/// "message", "rma_done", "send_done", "recv_done", "tripwire", "peer_connected",
/// "peer_closed", "peer_failed", "overflow", "user"; the attributes that do not apply to
/// a kind are None.
#[pyclass(module = "clink", frozen, get_all)]
pub struct Event {
    /// The kind of event.
    kind: &'static str,
    /// The peer (message sender, connected/closed/failed peer, tripwire accessor: None
    /// for this endpoint's own access).
    peer: Option<u32>,
    /// A message's tag.
    tag: Option<u64>,
    /// A request's number (rma_done, send_done, recv_done).
    req: Option<u64>,
    /// Whether the request succeeded.
    ok: Option<bool>,
    /// The tripwire that fired.
    tripwire: Option<u64>,
    /// Offset of the access that fired the tripwire.
    offset: Option<u64>,
    /// Length of that access.
    length: Option<u64>,
    /// True for a write access, False for a read.
    write: Option<bool>,
    /// A user event's value.
    value: Option<u64>,
    /// Overflow: events waiting in the overflow list.
    spilled: Option<u64>,
    /// Overflow: events lost.
    lost: Option<u64>,
}

impl From<clink_rs::events::Event> for Event {
    fn from(e: clink_rs::events::Event) -> Event {
        use clink_rs::events::Event as E;
        let mut ev = Event {
            kind: "",
            peer: None,
            tag: None,
            req: None,
            ok: None,
            tripwire: None,
            offset: None,
            length: None,
            write: None,
            value: None,
            spilled: None,
            lost: None,
        };
        match e {
            E::Message { peer, tag } => {
                ev.kind = "message";
                ev.peer = Some(peer.0);
                ev.tag = Some(tag);
            }
            E::RmaDone { req, ok } => {
                ev.kind = "rma_done";
                ev.req = Some(req);
                ev.ok = Some(ok);
            }
            E::SendDone { req, ok } => {
                ev.kind = "send_done";
                ev.req = Some(req);
                ev.ok = Some(ok);
            }
            E::RecvDone { req, ok } => {
                ev.kind = "recv_done";
                ev.req = Some(req);
                ev.ok = Some(ok);
            }
            E::Tripwire {
                id,
                peer,
                offset,
                len,
                write,
            } => {
                ev.kind = "tripwire";
                ev.tripwire = Some(trip_id(id));
                ev.peer = peer.map(|p| p.0);
                ev.offset = Some(offset);
                ev.length = Some(len);
                ev.write = Some(write);
            }
            E::PeerConnected(p) => {
                ev.kind = "peer_connected";
                ev.peer = Some(p.0);
            }
            E::PeerClosed(p) => {
                ev.kind = "peer_closed";
                ev.peer = Some(p.0);
            }
            E::PeerFailed(p) => {
                ev.kind = "peer_failed";
                ev.peer = Some(p.0);
            }
            E::Overflow { spilled, lost } => {
                ev.kind = "overflow";
                ev.spilled = Some(spilled);
                ev.lost = Some(lost);
            }
            E::User(v) => {
                ev.kind = "user";
                ev.value = Some(v);
            }
        }
        ev
    }
}

#[pymethods]
impl Event {
    fn __repr__(&self) -> String {
        let mut parts = vec![format!("kind={:?}", self.kind)];
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        };
        add("peer", self.peer.map(|v| v.to_string()));
        add("tag", self.tag.map(|v| v.to_string()));
        add("req", self.req.map(|v| v.to_string()));
        add(
            "ok",
            self.ok.map(|v| if v { "True" } else { "False" }.into()),
        );
        add("tripwire", self.tripwire.map(|v| v.to_string()));
        add("offset", self.offset.map(|v| v.to_string()));
        add("length", self.length.map(|v| v.to_string()));
        add(
            "write",
            self.write.map(|v| if v { "True" } else { "False" }.into()),
        );
        add("value", self.value.map(|v| v.to_string()));
        add("spilled", self.spilled.map(|v| v.to_string()));
        add("lost", self.lost.map(|v| v.to_string()));
        format!("Event({})", parts.join(", "))
    }
}

#[pymethods]
impl Endpoint {
    /// Allocates an aperture of ``length`` bytes (zeroed, in a memory file same-host peers
    /// can map).
    fn aperture_alloc(slf: &Bound<'_, Self>, length: usize) -> PyResult<Aperture> {
        let py = slf.py();
        let (id, win) = slf.get().sh.with(py, |ep| {
            let ap = ep.aperture_alloc(length)?;
            Ok((ap.0, ep.aperture_window(ap)?))
        })?;
        Ok(Aperture {
            owner: slf.clone().unbind(),
            id,
            win,
        })
    }

    /// Grants ``length`` bytes (None: to the end) of ``aperture`` from ``offset`` with
    /// ``rights`` (``clink.READ | clink.WRITE``): returns the cookie's bytes, to send to
    /// the peer in any message.
    #[pyo3(signature = (aperture, offset=0, length=None, rights=clink_rs::rma::READ | clink_rs::rma::WRITE))]
    fn export<'py>(
        &self,
        py: Python<'py>,
        aperture: &Aperture,
        offset: u64,
        length: Option<u64>,
        rights: u8,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let total = aperture.win.len();
        let len = length.unwrap_or(total.saturating_sub(offset));
        let c = self.sh.with(py, |ep| {
            ep.export(ApertureId(aperture.id), offset, len, rights)
        })?;
        Ok(PyBytes::new(py, &c.to_bytes()))
    }

    /// Revokes a cookie this endpoint exported: later accesses with it are refused.
    fn revoke(&self, py: Python<'_>, cookie: &[u8]) -> PyResult<()> {
        let c = Cookie::from_bytes(cookie).map_err(|e| invalid(py, e.to_string()))?;
        self.sh.with(py, |ep| ep.revoke(&c))
    }

    /// Imports the ``cookie`` bytes ``peer`` exported: the window to access with ``put``,
    /// ``get``, ``fetch_add``, ``compare_swap``, ``notify`` and ``map``.
    fn import_cookie(&self, py: Python<'_>, peer: u32, cookie: &[u8]) -> PyResult<Remote> {
        let c = Cookie::from_bytes(cookie).map_err(|e| invalid(py, e.to_string()))?;
        let r = self.sh.blocking(py, move |ep| ep.import(PeerId(peer), c))?;
        Ok(Remote { r })
    }

    /// Writes ``data`` (any C-contiguous buffer, read in place) at ``offset`` of the remote
    /// window; returns once the owner applied it (``clink.Refused`` when it refused).
    fn put(
        &self,
        py: Python<'_>,
        remote: &Remote,
        offset: u64,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let hb = HeldBuffer::readable(data)?;
        let s = hb.as_slice();
        let r = remote.r;
        self.sh.blocking(py, move |ep| ep.put(&r, offset, s))
    }

    /// Reads ``len(buf)`` bytes at ``offset`` of the remote window into ``buf`` (writable,
    /// C-contiguous).
    fn get_into(
        &self,
        py: Python<'_>,
        remote: &Remote,
        offset: u64,
        buf: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut hb = HeldBuffer::writable(buf)?;
        let s = hb.as_mut_slice();
        let r = remote.r;
        self.sh.blocking(py, move |ep| ep.get(&r, offset, s))
    }

    /// Reads ``length`` bytes at ``offset`` of the remote window.
    fn get<'py>(
        &self,
        py: Python<'py>,
        remote: &Remote,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let r = remote.r;
        let v = self.sh.blocking(py, move |ep| {
            let mut v = vec![0u8; length];
            ep.get(&r, offset, &mut v).map(|_| v)
        })?;
        Ok(PyBytes::new(py, &v))
    }

    /// Atomically adds ``value`` to the 8-byte word at ``offset`` (8-aligned) of the remote
    /// window; returns the old value.
    fn fetch_add(&self, py: Python<'_>, remote: &Remote, offset: u64, value: u64) -> PyResult<u64> {
        let r = remote.r;
        self.sh
            .blocking(py, move |ep| ep.fetch_add(&r, offset, value))
    }

    /// Atomically replaces the 8-byte word at ``offset`` with ``new`` if it equals
    /// ``expect``; returns the old value (equal to ``expect`` when it swapped).
    fn compare_swap(
        &self,
        py: Python<'_>,
        remote: &Remote,
        offset: u64,
        expect: u64,
        new: u64,
    ) -> PyResult<u64> {
        let r = remote.r;
        self.sh
            .blocking(py, move |ep| ep.compare_swap(&r, offset, expect, new))
    }

    /// Rings the owner's tripwires on ``offset..offset+length`` of the remote window as a
    /// write would (after stores through a mapped window).
    fn notify(&self, py: Python<'_>, remote: &Remote, offset: u64, length: u64) -> PyResult<()> {
        let r = remote.r;
        self.sh
            .blocking(py, move |ep| ep.notify(&r, offset, length))
    }

    /// Waits until every one-sided access this endpoint issued to ``peer`` (None: to
    /// all) has been applied.
    #[pyo3(signature = (peer=None))]
    fn flush_rma(&self, py: Python<'_>, peer: Option<u32>) -> PyResult<()> {
        self.sh
            .blocking(py, move |ep| ep.flush_rma(peer.map(PeerId)))
    }

    /// Maps a same-host peer's window into this process (``clink.Refused`` over the
    /// network).
    fn map(&self, py: Python<'_>, remote: &Remote) -> PyResult<MappedWindow> {
        let r = remote.r;
        let win = self.sh.blocking(py, move |ep| ep.map(&r))?;
        Ok(MappedWindow { win })
    }

    /// Arms a tripwire on ``offset..offset+length`` of ``aperture``: it fires on peers'
    /// writes (and reads with ``reads=True``), sets a bit, counts, and queues a "tripwire"
    /// event when ``event`` and the interest mask include ``clink.TRIPWIRES``. Returns its
    /// id.
    #[pyo3(signature = (aperture, offset, length, *, reads=false, writes=true, once=false, event=true))]
    #[allow(clippy::too_many_arguments)]
    fn tripwire(
        &self,
        py: Python<'_>,
        aperture: &Aperture,
        offset: u64,
        length: u64,
        reads: bool,
        writes: bool,
        once: bool,
        event: bool,
    ) -> PyResult<u64> {
        let opts = TripOptions {
            reads,
            writes,
            once,
            event,
        };
        self.sh
            .with(py, |ep| {
                ep.tripwire(ApertureId(aperture.id), offset, length, opts)
            })
            .map(trip_id)
    }

    /// Disarms a tripwire; False when it was not armed.
    fn tripwire_remove(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        self.sh.with(py, |ep| Ok(ep.tripwire_remove(trip_of(id))))
    }

    /// Whether the tripwire fired since armed or cleared (no progress is made).
    fn tripwire_fired(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        self.sh.with(py, |ep| Ok(ep.tripwire_fired(trip_of(id))))
    }

    /// Clears a tripwire's fired bit.
    fn tripwire_clear(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        self.sh.with(py, |ep| {
            ep.tripwire_clear(trip_of(id));
            Ok(())
        })
    }

    /// How many times the tripwire fired.
    fn tripwire_count(&self, py: Python<'_>, id: u64) -> PyResult<u64> {
        self.sh.with(py, |ep| Ok(ep.tripwire_count(trip_of(id))))
    }

    /// Waits until the tripwire fires (at most ``timeout`` seconds); clears its bit.
    #[pyo3(signature = (id, timeout=None))]
    fn wait_tripwire(&self, py: Python<'_>, id: u64, timeout: Option<f64>) -> PyResult<()> {
        let t = duration(py, timeout)?;
        self.sh
            .blocking_for(py, t, move |ep, t| ep.wait_tripwire(trip_of(id), t))
    }

    /// Sets which sources queue events: a mask of ``clink.MESSAGES``, ``RMA``,
    /// ``TRIPWIRES``, ``PEERS``, ``REQUESTS`` (``ALL``).
    fn set_interest(&self, py: Python<'_>, mask: u32) -> PyResult<()> {
        self.sh.with(py, |ep| {
            ep.set_interest(mask);
            Ok(())
        })
    }

    /// The next queued event, or None (makes progress first).
    fn next_event(&self, py: Python<'_>) -> PyResult<Option<Event>> {
        self.sh.with(py, |ep| Ok(ep.next_event().map(Event::from)))
    }

    /// Waits for the next event, at most ``timeout`` seconds (``clink.Timeout``). The GIL
    /// is released meanwhile.
    #[pyo3(signature = (timeout=None))]
    fn wait_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Event> {
        let t = duration(py, timeout)?;
        self.sh
            .blocking_for(py, t, |ep, t| ep.wait_event(t))
            .map(Event::from)
    }

    /// Receives a message matching ``peer`` / ``tag`` straight into ``aperture`` at
    /// ``offset`` (at most ``capacity`` bytes; zero copies beyond the transfer itself),
    /// firing the aperture's tripwires. Returns its Status.
    #[pyo3(signature = (aperture, offset, capacity, peer=None, tag=None, *, mask=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn recv_into_aperture(
        &self,
        py: Python<'_>,
        aperture: &Aperture,
        offset: u64,
        capacity: u64,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
        timeout: Option<f64>,
    ) -> PyResult<Status> {
        let sel = selector(py, peer, tag, mask)?;
        let t = duration(py, timeout)?;
        let ap = ApertureId(aperture.id);
        self.sh
            .blocking_for(py, t, move |ep, t| {
                ep.recv_into_aperture(sel, ap, offset, capacity, t)
            })
            .map(Status::from)
    }
}
