//! Non-blocking sends and receives in flight.

use super::*;

/// A non-blocking send (``Endpoint.isend``). It holds the sent buffer until complete.
#[pyclass(module = "clink", frozen)]
pub struct SendRequest {
    pub(super) owner: Py<Endpoint>,
    pub(super) req: Mutex<Option<clink_rs::SendRequest>>,
    /// The request's number (as in a ``send_done`` event; 0 for one complete at once).
    #[pyo3(get)]
    pub(super) id: u64,
}

#[pymethods]
impl SendRequest {
    /// True when complete (again True on later calls), False while pending; raises the
    /// send's error (``clink.PeerDead``, ...). Makes progress first.
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        let sh = &self.owner.get().sh;
        let mut l = sh.lock(py)?;
        let mut g = self
            .req
            .try_lock()
            .map_err(|_| busy(py, "request in use"))?;
        let Some(req) = g.as_ref() else {
            return Ok(true);
        };
        match l.ep(py)?.test_send(req) {
            Ok(false) => Ok(false),
            Ok(true) => {
                *g = None;
                Ok(true)
            }
            Err(e) => {
                *g = None;
                Err(to_py(py, e))
            }
        }
    }

    /// Waits for completion, at most ``timeout`` seconds (``clink.Timeout`` leaves it
    /// pending). The GIL is released meanwhile.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let t = duration(py, timeout)?;
        let sh = &self.owner.get().sh;
        let mut l = sh.lock(py)?;
        let mut g = self
            .req
            .try_lock()
            .map_err(|_| busy(py, "request in use"))?;
        let Some(req) = g.as_ref() else {
            return Ok(());
        };
        let ep = l.ep(py)?;
        let r = crate::sliced(py, t, |t| ep.wait_send(req, t))?;
        match r {
            Err(clink_rs::Error::Timeout) => Err(to_py(py, clink_rs::Error::Timeout)),
            r => {
                *g = None;
                r.or_py(py)
            }
        }
    }

    /// Cancels the send: True when withdrawn before the receiver took it, False when it
    /// is (or will be) delivered anyway.
    fn cancel(&self, py: Python<'_>) -> PyResult<bool> {
        let sh = &self.owner.get().sh;
        let mut l = sh.lock(py)?;
        let mut g = self
            .req
            .try_lock()
            .map_err(|_| busy(py, "request in use"))?;
        let Some(req) = g.take() else {
            return Ok(false);
        };
        let ep = l.ep(py)?;
        py.detach(move || ep.cancel_send(req)).or_py(py)
    }

    /// ``await req.wait_async()``: waits for completion without blocking the event loop.
    fn wait_async<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        support(py)?
            .getattr("wait_request_async")?
            .call1((slf.get().owner.bind(py), slf))
    }
}

/// A non-blocking receive (``Endpoint.irecv``).
#[pyclass(module = "clink", frozen)]
pub struct RecvRequest {
    pub(super) owner: Py<Endpoint>,
    pub(super) req: Mutex<Option<clink_rs::RecvRequest>>,
    /// The request's number (as in a ``recv_done`` event).
    #[pyo3(get)]
    pub(super) id: u64,
}

impl RecvRequest {
    /// Takes the result of a finished test/wait: the message, or its error (a truncated
    /// message's buffer is freed).
    fn finish(
        py: Python<'_>,
        ep: &mut clink_rs::Endpoint,
        g: &mut Option<clink_rs::RecvRequest>,
        r: clink_rs::Result<Option<clink_rs::Received>>,
    ) -> PyResult<Option<Message>> {
        match r {
            Ok(None) => Ok(None),
            Ok(Some(got)) => {
                *g = None;
                Ok(Some(Message::new(got.buf, got.status.into())))
            }
            Err(e) => {
                if let (clink_rs::Error::Truncated { .. }, Some(q)) = (&e, g.take()) {
                    let _ = ep.take_recv_buffer(q);
                }
                *g = None;
                Err(to_py(py, e))
            }
        }
    }
}

#[pymethods]
impl RecvRequest {
    /// The received ``Message`` when complete, None while pending; raises the receive's
    /// error (``clink.Truncated``, ``clink.PeerDead``, ``clink.Consumed`` once taken).
    fn test(&self, py: Python<'_>) -> PyResult<Option<Message>> {
        let sh = &self.owner.get().sh;
        let mut l = sh.lock(py)?;
        let mut g = self
            .req
            .try_lock()
            .map_err(|_| busy(py, "request in use"))?;
        let Some(req) = g.as_ref() else {
            return Err(raise_consumed(py));
        };
        let ep = l.ep(py)?;
        let r = ep.test_recv(req);
        RecvRequest::finish(py, ep, &mut g, r)
    }

    /// Waits for the message, at most ``timeout`` seconds (``clink.Timeout`` leaves the
    /// request pending). The GIL is released meanwhile.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let t = duration(py, timeout)?;
        let sh = &self.owner.get().sh;
        let mut l = sh.lock(py)?;
        let mut g = self
            .req
            .try_lock()
            .map_err(|_| busy(py, "request in use"))?;
        let Some(req) = g.as_ref() else {
            return Err(raise_consumed(py));
        };
        let ep = l.ep(py)?;
        let r = {
            let ep = &mut *ep;
            crate::sliced(py, t, |t| ep.wait_recv(req, t))?
        };
        match r {
            Err(clink_rs::Error::Timeout) => Err(to_py(py, clink_rs::Error::Timeout)),
            r => RecvRequest::finish(py, ep, &mut g, r.map(Some))
                .map(|m| m.expect("a completed receive")),
        }
    }

    /// Cancels the receive: True when withdrawn (it had not matched a message), False when
    /// it had (complete it with ``wait``).
    fn cancel(&self, py: Python<'_>) -> PyResult<bool> {
        let sh = &self.owner.get().sh;
        let mut l = sh.lock(py)?;
        let mut g = self
            .req
            .try_lock()
            .map_err(|_| busy(py, "request in use"))?;
        let Some(req) = g.as_ref() else {
            return Ok(false);
        };
        let withdrawn = l.ep(py)?.cancel_recv(req).or_py(py)?.is_some();
        if withdrawn {
            *g = None;
        }
        Ok(withdrawn)
    }

    /// ``await req.wait_async()``: the ``Message``, waiting without blocking the event
    /// loop.
    fn wait_async<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        support(py)?
            .getattr("wait_request_async")?
            .call1((slf.get().owner.bind(py), slf))
    }
}
