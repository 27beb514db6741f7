//! Context, Endpoint, tagged messages, requests, in-place messages and send slots.

use crate::{busy, duration, fill_view, invalid, sliced, support, to_py, HeldBuffer, OrPy};
use bytes::Bytes;
use clink_rs::{PeerId, Selector};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use std::cell::UnsafeCell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A value moved across `Python::detach` that the compiler cannot prove `Send` (an
/// in-place guard or send slot: they borrow the endpoint, which is `Send`, and index its
/// memory).
pub(crate) struct SendBox<T>(pub(crate) T);
// SAFETY: see above; the endpoint they borrow is locked for as long as they live.
unsafe impl<T> Send for SendBox<T> {}
// SAFETY: only touched by the thread holding the endpoint's lock.
unsafe impl<T> Sync for SendBox<T> {}

impl<T: Copy> SendBox<T> {
    /// The value (a closure calling this captures the box, not its field).
    pub(crate) fn get(&self) -> T {
        self.0
    }
}

/// The endpoint and its lock.
pub struct Shared {
    ep: UnsafeCell<Option<clink_rs::Endpoint>>,
    busy: AtomicBool,
    fd: RawFd,
    address: String,
}

// SAFETY: the endpoint is `Send`; access is serialised by `busy` (a compare-and-swap that
// fails rather than waits), so no two threads ever have it at once.
unsafe impl Sync for Shared {}

/// The endpoint, locked for one call (unlocked when dropped).
pub(crate) struct Locked<'a>(&'a Shared);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

impl Locked<'_> {
    /// The endpoint (closed: `InvalidArgument`).
    pub(crate) fn ep(&mut self, py: Python<'_>) -> PyResult<&mut clink_rs::Endpoint> {
        // SAFETY: locked.
        unsafe { (*self.0.ep.get()).as_mut() }.ok_or_else(|| invalid(py, "endpoint closed"))
    }
}

impl Shared {
    /// Takes the endpoint; `Busy` when another thread (or an in-place message or send slot)
    /// holds it.
    pub(crate) fn lock(&self, py: Python<'_>) -> PyResult<Locked<'_>> {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(busy(
                py,
                "endpoint in use by another thread, or held by an unreleased in-place message \
                 or send slot",
            ));
        }
        Ok(Locked(self))
    }

    /// Runs a quick call with the GIL held.
    pub(crate) fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut clink_rs::Endpoint) -> clink_rs::Result<T>,
    ) -> PyResult<T> {
        let mut l = self.lock(py)?;
        f(l.ep(py)?).or_py(py)
    }

    /// Runs a call that waits up to `timeout` (given to `f`), with the GIL released and
    /// Python's signals looked at every [`crate::sliced`] slice.
    pub(crate) fn blocking_for<T: Send>(
        &self,
        py: Python<'_>,
        timeout: Option<std::time::Duration>,
        mut f: impl FnMut(&mut clink_rs::Endpoint, Option<std::time::Duration>) -> clink_rs::Result<T>
            + Send,
    ) -> PyResult<T> {
        let mut l = self.lock(py)?;
        let ep = l.ep(py)?;
        sliced(py, timeout, |t| f(ep, t))?.or_py(py)
    }

    /// Runs a call that may wait, with the GIL released.
    pub(crate) fn blocking<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut clink_rs::Endpoint) -> clink_rs::Result<T> + Send,
    ) -> PyResult<T> {
        let mut l = self.lock(py)?;
        let ep = l.ep(py)?;
        py.detach(move || f(ep)).or_py(py)
    }
}

pub(crate) fn selector(
    py: Python<'_>,
    peer: Option<u32>,
    tag: Option<u64>,
    mask: Option<u64>,
) -> PyResult<Selector> {
    let src = peer.map(PeerId);
    match (tag, mask) {
        (None, None) => Ok(Selector {
            src,
            tag: 0,
            mask: 0,
        }),
        (None, Some(_)) => Err(invalid(py, "a tag mask needs a tag")),
        (Some(tag), mask) => Ok(Selector {
            src,
            tag,
            mask: mask.unwrap_or(!0),
        }),
    }
}

// ------------------------------------------------------------------ context

/// A clink context: configuration (from the ``CLINK_*`` environment variables, read when
/// it is created) and the machine's cost model. Create one per process (a forked child
/// creates its own).
#[pyclass(module = "clink", frozen)]
pub struct Context {
    ctx: clink_rs::Context,
}

#[pymethods]
impl Context {
    #[new]
    fn new(py: Python<'_>) -> PyResult<Context> {
        let ctx = py.detach(clink_rs::Context::new).or_py(py)?;
        Ok(Context { ctx })
    }

    /// Opens a new endpoint.
    fn endpoint(&self, py: Python<'_>) -> PyResult<Endpoint> {
        let ep = self.ctx.endpoint().or_py(py)?;
        Ok(Endpoint::wrap(ep))
    }

    /// A context for a process started by a launcher (``mpirun``, ``srun``), with the
    /// :class:`Job` it belongs to: ``ctx, job = clink.Context.from_launcher()``. Raises
    /// :class:`ConfigError` when no launcher started the process.
    #[staticmethod]
    fn from_launcher(py: Python<'_>) -> PyResult<(Context, Job)> {
        let (ctx, job) = py.detach(clink_rs::Context::from_launcher).or_py(py)?;
        Ok((Context { ctx }, Job { job }))
    }
}

/// The job a launcher started this process in (:meth:`Context.from_launcher`): this
/// process's ``rank``, the job's ``size``, and the exchange of endpoint addresses.
#[pyclass(module = "clink", frozen)]
pub struct Job {
    job: clink_rs::launcher::Launcher,
}

#[pymethods]
impl Job {
    /// This process's rank (from 0).
    #[getter]
    fn rank(&self) -> u32 {
        self.job.rank()
    }

    /// The number of ranks in the job.
    #[getter]
    fn size(&self) -> u32 {
        self.job.size()
    }

    /// The number of the job's ranks on this node (this one included), or None when the
    /// launcher does not say.
    #[getter]
    fn local_size(&self) -> Option<u32> {
        self.job.local_size()
    }

    /// Publishes ``address`` (this rank's :attr:`Endpoint.address`) and returns every
    /// rank's, indexed by rank. Collective: every rank calls it; it returns when all have
    /// published (the GIL is released meanwhile).
    fn exchange_addresses(&self, py: Python<'_>, address: &str) -> PyResult<Vec<String>> {
        py.detach(|| self.job.exchange_addresses(address)).or_py(py)
    }

    fn __repr__(&self) -> String {
        format!("Job(rank={}, size={})", self.job.rank(), self.job.size())
    }
}

// ------------------------------------------------------------------ status, message

/// Who sent what: ``peer``, ``tag`` and ``length`` (the message's full length).
#[pyclass(module = "clink", frozen, eq)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The peer (sender of a received message).
    #[pyo3(get)]
    peer: u32,
    /// The message's tag.
    #[pyo3(get)]
    tag: u64,
    /// The message's length in bytes.
    #[pyo3(get)]
    length: u64,
}

impl From<clink_rs::Status> for Status {
    fn from(s: clink_rs::Status) -> Status {
        Status {
            peer: s.peer.0,
            tag: s.tag,
            length: s.len,
        }
    }
}

#[pymethods]
impl Status {
    fn __repr__(&self) -> String {
        format!(
            "Status(peer={}, tag={}, length={})",
            self.peer, self.tag, self.length
        )
    }
}

/// A received message that owns its bytes: a buffer (``memoryview(msg)``, ``bytes(msg)``,
/// ``numpy.frombuffer(msg, ...)`` read it without copying) with its ``status``.
#[pyclass(module = "clink", frozen)]
pub struct Message {
    data: SendBox<UnsafeCell<Vec<u8>>>,
    /// Who sent it, its tag and length.
    #[pyo3(get)]
    status: Status,
}

impl Message {
    fn new(data: Vec<u8>, status: Status) -> Message {
        Message {
            data: SendBox(UnsafeCell::new(data)),
            status,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the vector is never resized after creation; Python writers may change
        // its bytes through writable views, as with a bytearray.
        unsafe { &*self.data.0.get() }
    }
}

#[pymethods]
impl Message {
    /// The sender.
    #[getter]
    fn peer(&self) -> u32 {
        self.status.peer
    }

    /// The tag.
    #[getter]
    fn tag(&self) -> u64 {
        self.status.tag
    }

    fn __len__(&self) -> usize {
        self.bytes().len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.bytes())
    }

    fn __repr__(&self) -> String {
        format!(
            "Message({} bytes, {})",
            self.bytes().len(),
            self.status.__repr__()
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let (ptr, len) = {
            // SAFETY: only the pointer and length are taken (the GIL is held, nothing
            // else borrows the vector now); it is never resized after creation.
            let v = unsafe { &mut *slf.get().data.0.get() };
            (v.as_mut_ptr(), v.len())
        };
        // SAFETY: `view` as Python gave it; the vector lives as long as the message,
        // which the view holds a reference to.
        unsafe { fill_view(slf.as_any(), view, flags, ptr, len, false) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

// ------------------------------------------------------------------ endpoint

/// A communication port: connects to peers and accepts them, sends and receives tagged
/// messages, owns apertures and an event queue.
///
/// Thread safety: any thread may call it, one at a time; a call while another thread is
/// inside one (or while an in-place message or send slot is held) raises ``clink.Busy``.
/// Blocking calls release the GIL; one without a timeout sees Ctrl-C only when it returns
/// (pass a timeout to stay interruptible). There is no background thread: call into the
/// endpoint (any call, or ``progress()``) now and then while computing, and more often
/// than every 2 s over the network.
#[pyclass(module = "clink", frozen)]
pub struct Endpoint {
    pub(crate) sh: Shared,
    aio: PyOnceLock<Py<PyAny>>,
}

impl Endpoint {
    fn wrap(ep: clink_rs::Endpoint) -> Endpoint {
        let (fd, address) = (ep.fd(), ep.address());
        Endpoint {
            sh: Shared {
                ep: UnsafeCell::new(Some(ep)),
                busy: AtomicBool::new(false),
                fd,
                address,
            },
            aio: PyOnceLock::new(),
        }
    }
}

#[pymethods]
impl Endpoint {
    /// The printable address another process passes to ``connect``.
    #[getter]
    fn address(&self) -> &str {
        &self.sh.address
    }

    /// The endpoint's file descriptor, level-triggered: readable when a message, connection
    /// or peer failure may be pending. Before blocking on it (select, poll, an event loop)
    /// call ``prepare_wait()`` and block only when it returns True; after waking call
    /// ``finish_wait()`` and then make progress (any call). Owned by the endpoint.
    fn fileno(&self) -> RawFd {
        self.sh.fd
    }

    /// Says that this endpoint will connect to about ``n`` peers on its host (a job's
    /// other local ranks): its connections' rings are sized for that many from the first
    /// (see ``CLINK_RING_SHRINK``). Endpoints of ``Context.from_launcher()`` know it
    /// already when the launcher says.
    fn expect_peers(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        self.sh.with(py, |ep| {
            ep.expect_peers(n);
            Ok(())
        })
    }

    /// Connects to the endpoint at ``address``; returns the peer's number.
    fn connect(&self, py: Python<'_>, address: &str) -> PyResult<u32> {
        let a = address.to_string();
        self.sh.blocking(py, move |ep| ep.connect(&a)).map(|p| p.0)
    }

    /// Waits for a peer to connect (at most ``timeout`` seconds; None: no limit); returns
    /// its number. ``clink.Timeout`` when none came.
    #[pyo3(signature = (timeout=None))]
    fn accept(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u32> {
        let t = duration(py, timeout)?;
        self.sh
            .blocking_for(py, t, |ep, t| ep.accept(t))
            .map(|p| p.0)
    }

    /// The connected peers' numbers.
    fn peers(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        self.sh
            .with(py, |ep| Ok(ep.peers().into_iter().map(|p| p.0).collect()))
    }

    /// Whether ``peer`` is connected and alive.
    fn is_alive(&self, py: Python<'_>, peer: u32) -> PyResult<bool> {
        self.sh.with(py, |ep| Ok(ep.is_alive(PeerId(peer))))
    }

    /// The transport to ``peer``: "shm", "udp" or "tcp".
    fn transport(&self, py: Python<'_>, peer: u32) -> PyResult<&'static str> {
        self.sh.with(py, |ep| ep.transport(PeerId(peer)))
    }

    /// How the connection to ``peer`` was made: ``(connected, crossed, superseded)``.
    /// ``connected``: this endpoint connected (else it accepted); ``crossed``: the two
    /// ends were connecting to each other at once (the pair then holds two connections);
    /// ``superseded``: this is the one of those two that both ends leave unused (the
    /// other, which the endpoint with the smaller identity made, is the one to use).
    fn joined(&self, py: Python<'_>, peer: u32) -> PyResult<(bool, bool, bool)> {
        self.sh.with(py, |ep| {
            ep.joined(PeerId(peer))
                .map(|j| (j.connected, j.crossed, j.superseded))
        })
    }

    /// The largest message sent to ``peer`` eagerly (larger ones go by rendezvous), and
    /// the largest ``claim``.
    fn eager_max(&self, py: Python<'_>, peer: u32) -> PyResult<u64> {
        self.sh.with(py, |ep| ep.eager_max(PeerId(peer)))
    }

    /// Sends ``data`` (any C-contiguous buffer: bytes, bytearray, memoryview, numpy array)
    /// to ``peer`` with ``tag`` and waits until it is out of ``data``. No copy of ``data``
    /// is made: the endpoint reads it in place (into the peer's ring for small messages,
    /// by one CMA copy into the receiver's buffer for large ones on the same host). The
    /// GIL is released meanwhile: do not modify ``data`` from another thread until it
    /// returns.
    fn send(&self, py: Python<'_>, peer: u32, tag: u64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let hb = HeldBuffer::readable(data)?;
        let s = hb.as_slice();
        self.sh
            .blocking(py, move |ep| ep.send(PeerId(peer), tag, s))
    }

    /// Sends each buffer of ``buffers`` as its own message to ``peer`` with ``tag``, all
    /// in flight at once, and returns when every one is out of its buffer: small ones
    /// leave together (one system call for the batch over the network, where ``send`` in
    /// a loop makes one per message). No buffer is copied by Python.
    fn send_batch(
        &self,
        py: Python<'_>,
        peer: u32,
        tag: u64,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let held = (buffers.iter())
            .map(HeldBuffer::readable)
            .collect::<PyResult<Vec<_>>>()?;
        let slices: Vec<&[u8]> = held.iter().map(HeldBuffer::as_slice).collect();
        self.sh
            .blocking(py, move |ep| ep.send_batch(PeerId(peer), tag, &slices))
    }

    /// Receives one message matching ``peer`` / ``tag`` (None: any; ``mask`` selects tag
    /// bits) into ``buf``, a writable C-contiguous buffer (bytearray, memoryview, numpy
    /// array), without an intermediate copy: the message lands in ``buf`` directly. Returns
    /// its Status; a message longer than ``buf`` fills it and raises ``clink.Truncated``
    /// (``length``: the full length). ``timeout`` in seconds (None: no limit;
    /// ``clink.Timeout``, the receive withdrawn). The GIL is released meanwhile.
    #[pyo3(signature = (buf, peer=None, tag=None, *, mask=None, timeout=None))]
    fn recv_into(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
        timeout: Option<f64>,
    ) -> PyResult<Status> {
        let sel = selector(py, peer, tag, mask)?;
        let t = duration(py, timeout)?;
        let mut hb = HeldBuffer::writable(buf)?;
        let s = hb.as_mut_slice();
        self.sh
            .blocking_for(py, t, move |ep, t| ep.recv_timeout(sel, &mut *s, t))
            .map(Status::from)
    }

    /// Receives one message matching ``peer`` / ``tag`` into a new ``Message`` of its
    /// exact length (one copy: out of the sender's ring, or of the library's buffer for a
    /// large message; ``recv_into`` lands it in a buffer of yours instead). ``timeout`` as
    /// for ``recv_into``.
    #[pyo3(signature = (peer=None, tag=None, *, mask=None, timeout=None))]
    fn recv(
        &self,
        py: Python<'_>,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
        timeout: Option<f64>,
    ) -> PyResult<Message> {
        let sel = selector(py, peer, tag, mask)?;
        let t = duration(py, timeout)?;
        let (v, st) = self.sh.blocking_for(py, t, move |ep, t| {
            let g = ep.recv_in_place(sel, t)?;
            Ok((g.to_vec(), g.status()))
        })?;
        Ok(Message::new(v, st.into()))
    }

    /// Looks for a message matching ``peer`` / ``tag`` that has arrived and not been
    /// received yet, without receiving it: its Status, or None. Makes progress first.
    #[pyo3(signature = (peer=None, tag=None, *, mask=None))]
    fn probe(
        &self,
        py: Python<'_>,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
    ) -> PyResult<Option<Status>> {
        let sel = selector(py, peer, tag, mask)?;
        self.sh.with(py, |ep| Ok(ep.probe(sel).map(Status::from)))
    }

    /// Starts sending ``data`` (any C-contiguous buffer) to ``peer`` with ``tag`` without
    /// copying it: the request holds the buffer (exported, so a bytearray cannot be
    /// resized) until the send is complete. Do not modify it until then. Complete it with
    /// ``test``, ``wait`` or ``await req.wait_async()``.
    fn isend(
        slf: &Bound<'_, Self>,
        peer: u32,
        tag: u64,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<SendRequest> {
        let py = slf.py();
        let hb = HeldBuffer::readable(data)?;
        let bytes = Bytes::from_owner(hb);
        let req = slf
            .get()
            .sh
            .with(py, |ep| ep.isend(PeerId(peer), tag, bytes))?;
        Ok(SendRequest {
            owner: slf.clone().unbind(),
            id: req.id(),
            req: Mutex::new(Some(req)),
        })
    }

    /// Posts a receive of at most ``size`` bytes for a message matching ``peer`` / ``tag``.
    /// The Rust endpoint owns the receive buffer while the request is pending; on
    /// completion it becomes the returned ``Message`` (no copy).
    #[pyo3(signature = (size, peer=None, tag=None, *, mask=None))]
    fn irecv(
        slf: &Bound<'_, Self>,
        size: usize,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
    ) -> PyResult<RecvRequest> {
        let py = slf.py();
        let sel = selector(py, peer, tag, mask)?;
        let req = slf.get().sh.with(py, |ep| ep.irecv(sel, vec![0u8; size]))?;
        Ok(RecvRequest {
            owner: slf.clone().unbind(),
            id: req.id(),
            req: Mutex::new(Some(req)),
        })
    }

    /// Waits for the first of ``requests`` (receive requests of this endpoint) to complete,
    /// at most ``timeout`` seconds: returns ``(index, Message)``; a failed one raises its
    /// error. The others stay pending (all of them on ``clink.Timeout``).
    #[pyo3(signature = (requests, timeout=None))]
    fn wait_any(
        &self,
        py: Python<'_>,
        requests: Vec<Bound<'_, RecvRequest>>,
        timeout: Option<f64>,
    ) -> PyResult<(usize, Message)> {
        let t = duration(py, timeout)?;
        let mut l = self.sh.lock(py)?;
        let ep = l.ep(py)?;
        let mut taken = Vec::with_capacity(requests.len());
        for r in &requests {
            if !std::ptr::eq(&r.get().owner.get().sh, &self.sh) {
                return Err(invalid(py, "a request of another endpoint"));
            }
            let got = r.get().req.lock().map(|mut g| g.take());
            match got {
                Ok(Some(q)) => taken.push(q),
                _ => {
                    // Put the ones taken so far back.
                    for (q, r) in taken.into_iter().zip(&requests) {
                        *r.get().req.lock().expect("request lock") = Some(q);
                    }
                    return Err(raise_consumed(py));
                }
            }
        }
        let reqs = &taken;
        let put_back = |taken: Vec<_>| {
            for (q, r) in taken.into_iter().zip(&requests) {
                *r.get().req.lock().expect("request lock") = Some(q);
            }
        };
        let r = {
            let ep = &mut *ep;
            sliced(py, t, |t| ep.wait_any_recv(reqs, t))
        };
        let r = match r {
            Ok(r) => r,
            Err(interrupted) => {
                // A signal handler's exception leaves every request pending, as a timeout
                // does.
                put_back(taken);
                return Err(interrupted);
            }
        };
        match r {
            Ok((i, res)) => {
                for (j, (q, r)) in taken.into_iter().zip(&requests).enumerate() {
                    if j != i {
                        *r.get().req.lock().expect("request lock") = Some(q);
                    } else if matches!(res, Err(clink_rs::Error::Truncated { .. })) {
                        let _ = ep.take_recv_buffer(q);
                    }
                }
                let got = res.or_py(py)?;
                Ok((i, Message::new(got.buf, got.status.into())))
            }
            Err(e) => {
                put_back(taken);
                Err(to_py(py, e))
            }
        }
    }

    /// Receives a message matching ``peer`` / ``tag`` without copying it when it is a small
    /// message at the head of its sender's ring (others come in a buffer of the library's).
    /// Returns an ``InPlaceMessage``: a read-only buffer valid until released (use it as a
    /// context manager). Until then the endpoint raises ``clink.Busy`` to other calls.
    #[pyo3(signature = (peer=None, tag=None, *, mask=None, timeout=None))]
    fn recv_in_place(
        slf: &Bound<'_, Self>,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
        timeout: Option<f64>,
    ) -> PyResult<InPlaceMessage> {
        let py = slf.py();
        let sel = selector(py, peer, tag, mask)?;
        let t = duration(py, timeout)?;
        let sh = &slf.get().sh;
        let mut l = sh.lock(py)?;
        // SAFETY: the guard borrows the endpoint for as long as the InPlaceMessage holds
        // it: the lock stays taken until the guard is dropped (release or drop), and the
        // message keeps the Python endpoint (and so the Rust one) alive.
        let ep = SendBox(l.ep(py)? as *mut clink_rs::Endpoint);
        let g = sliced(py, t, |t| {
            // SAFETY: as above; a slice that timed out holds no borrow, and the one that
            // returns the guard ends the wait.
            let ep: &'static mut clink_rs::Endpoint = unsafe { &mut *ep.get() };
            ep.recv_in_place(sel, t).map(SendBox)
        })?
        .or_py(py)?;
        std::mem::forget(l); // the message holds the lock now
        let g = g.0;
        let (ptr, len, st) = (g.as_ptr() as usize, g.len(), g.status());
        Ok(InPlaceMessage {
            owner: slf.clone().unbind(),
            guard: Mutex::new(Some(SendBox(g))),
            ptr,
            len,
            status: st.into(),
            exports: AtomicUsize::new(0),
        })
    }

    /// Claims room for a ``length``-byte message to ``peer`` with ``tag`` in its ring
    /// (waiting up to ``timeout`` seconds): write the message into the returned
    /// ``SendSlot`` (a writable buffer), then ``commit()`` (zero copies on the sending
    /// side). ``length`` at most ``eager_max(peer)``. Until committed or abandoned the
    /// endpoint raises ``clink.Busy`` to other calls.
    #[pyo3(signature = (peer, tag, length, timeout=None))]
    fn claim(
        slf: &Bound<'_, Self>,
        peer: u32,
        tag: u64,
        length: usize,
        timeout: Option<f64>,
    ) -> PyResult<SendSlot> {
        let py = slf.py();
        let t = duration(py, timeout)?;
        let sh = &slf.get().sh;
        let mut l = sh.lock(py)?;
        // SAFETY: as in recv_in_place: locked for as long as the slot lives.
        let ep = SendBox(l.ep(py)? as *mut clink_rs::Endpoint);
        let s = sliced(py, t, |t| {
            // SAFETY: as in recv_in_place.
            let ep: &'static mut clink_rs::Endpoint = unsafe { &mut *ep.get() };
            ep.claim(PeerId(peer), tag, length, t).map(SendBox)
        })?
        .or_py(py)?;
        std::mem::forget(l);
        let mut s = s.0;
        let b = s.buf();
        let (ptr, len) = (b.as_mut_ptr() as usize, b.len());
        Ok(SendSlot {
            owner: slf.clone().unbind(),
            slot: Mutex::new(Some(SendBox(s))),
            ptr,
            len,
            exports: AtomicUsize::new(0),
        })
    }

    /// Moves data without blocking (drains rings, matches, answers rendezvous, runs the
    /// network's timers); True when anything happened.
    fn progress(&self, py: Python<'_>) -> PyResult<bool> {
        self.sh.with(py, |ep| Ok(ep.progress()))
    }

    /// Prepares to block on ``fileno()``: True when it is safe to block (then call
    /// ``finish_wait()`` after waking), False when work arrived meanwhile (make progress
    /// instead; no ``finish_wait`` needed).
    fn prepare_wait(&self, py: Python<'_>) -> PyResult<bool> {
        self.sh.with(py, |ep| Ok(ep.prepare_wait()))
    }

    /// Withdraws the doorbell requests of a ``prepare_wait()`` that returned True.
    fn finish_wait(&self, py: Python<'_>) -> PyResult<()> {
        self.sh.with(py, |ep| {
            ep.finish_wait();
            Ok(())
        })
    }

    /// The endpoint's counters as a dict of name to integer (frames, eager and rendezvous
    /// sends, CMA bytes, sleeps, datagrams, retransmissions, one-sided bytes, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.sh.with(py, |ep| Ok(ep.stats()))?;
        let d = crate::new_dict(py);
        for (name, value) in s.fields() {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// Says goodbye to every peer and frees the endpoint; later calls raise
    /// ``clink.InvalidArgument``. Apertures' memory stays mapped while their objects live.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut l = self.sh.lock(py)?;
        // SAFETY: locked.
        let ep = unsafe { (*l.0.ep.get()).take() };
        if let Some(mut ep) = ep {
            py.detach(move || {
                ep.close();
                drop(ep)
            });
        }
        let _ = l.ep(py); // (closed now)
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// ``await ep.recv_async(buf, peer, tag)``: as ``recv_into``, waiting for the message's
    /// arrival without blocking the event loop (the endpoint's fd in ``loop.add_reader``,
    /// with the ``prepare_wait``/``finish_wait`` protocol). Once a message has arrived its
    /// bytes are moved synchronously (one copy into ``buf``; for a large message that is
    /// the whole transfer, so its sender must progress on its own meanwhile: another
    /// process or thread). Cancelling the coroutine leaves nothing posted.
    #[pyo3(signature = (buf, peer=None, tag=None, *, mask=None))]
    fn recv_async<'py>(
        slf: &Bound<'py, Self>,
        buf: Bound<'py, PyAny>,
        peer: Option<u32>,
        tag: Option<u64>,
        mask: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        support(slf.py())?
            .getattr("recv_async")?
            .call1((slf, buf, peer, tag, mask))
    }

    /// ``await ep.send_async(peer, tag, data)``: ``isend`` then waits for completion
    /// without blocking the event loop (a rendezvous send completes when the receiver has
    /// taken the bytes). ``data`` must not change until it returns.
    fn send_async<'py>(
        slf: &Bound<'py, Self>,
        peer: u32,
        tag: u64,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        support(slf.py())?
            .getattr("send_async")?
            .call1((slf, peer, tag, data))
    }

    /// ``await ep.wait_event_async()``: the next event of the endpoint's queue (see
    /// ``set_interest``), waiting without blocking the event loop.
    fn wait_event_async<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        support(slf.py())?
            .getattr("wait_event_async")?
            .call1((slf,))
    }

    /// The asyncio waiters of this endpoint, per event loop (internal).
    fn _aio_table(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.aio
            .get_or_try_init(py, || {
                support(py)?
                    .getattr("_new_table")?
                    .call0()
                    .map(Bound::unbind)
            })
            .map(|t| t.clone_ref(py))
    }

    fn __repr__(&self) -> String {
        format!("Endpoint({})", self.sh.address)
    }
}

fn raise_consumed(py: Python<'_>) -> PyErr {
    crate::raise_code(py, -13, "request already completed and consumed".into())
}

mod inplace;
mod requests;

pub use inplace::{InPlaceMessage, SendSlot};
pub use requests::{RecvRequest, SendRequest};
