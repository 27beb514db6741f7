//! Messages received in place and send slots: both hold the endpoint while they live.

use super::*;

/// A message received in place (``Endpoint.recv_in_place``): a read-only buffer over the
/// sender's ring (zero copies) or a library buffer, valid until ``release()`` (or the end
/// of its ``with`` block). Views of it (``memoryview(msg)``) must be released first.
/// While it is held the endpoint raises ``clink.Busy`` to other calls.
#[pyclass(module = "clink", frozen)]
pub struct InPlaceMessage {
    pub(super) owner: Py<Endpoint>,
    pub(super) guard: Mutex<Option<SendBox<clink_rs::InPlace<'static>>>>,
    pub(super) ptr: usize,
    pub(super) len: usize,
    /// Who sent it, its tag and length.
    #[pyo3(get)]
    pub(super) status: Status,
    pub(super) exports: AtomicUsize,
}

impl InPlaceMessage {
    fn drop_guard(&self) -> bool {
        let g = match self.guard.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        let had = g.is_some();
        drop(g);
        if had {
            self.owner.get().sh.busy.store(false, Ordering::Release);
        }
        had
    }

    fn live(&self) -> bool {
        self.guard.lock().map(|g| g.is_some()).unwrap_or(false)
    }
}

impl Drop for InPlaceMessage {
    fn drop(&mut self) {
        self.drop_guard();
    }
}

#[pymethods]
impl InPlaceMessage {
    /// Gives the message back (frees its ring space) and unlocks the endpoint. Raises
    /// BufferError while views of it are still exported. Releasing twice does nothing.
    fn release(&self) -> PyResult<()> {
        if self.exports.load(Ordering::Acquire) > 0 {
            return Err(PyBufferError::new_err(
                "release the memoryviews of this message first",
            ));
        }
        self.drop_guard();
        Ok(())
    }

    /// Whether it is still held (not released).
    #[getter]
    fn held(&self) -> bool {
        self.live()
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// A copy of the bytes.
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if !self.live() {
            return Err(PyBufferError::new_err("message released"));
        }
        // SAFETY: held: the bytes stay in place until released.
        let s = unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) };
        Ok(PyBytes::new(py, s))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.release()?;
        Ok(false)
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        if !me.live() {
            return Err(PyBufferError::new_err("message released"));
        }
        // SAFETY: held (checked above): the bytes stay in place while any view is
        // exported (`exports` keeps the release from freeing them).
        unsafe { fill_view(slf.as_any(), view, flags, me.ptr as *mut u8, me.len, true)? };
        me.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Room claimed in a peer's ring (``Endpoint.claim``): a writable buffer; write the
/// message into it, then ``commit()`` (or ``abandon()``). As a context manager it commits
/// at the end of the block, or abandons when the block raised. Views of it must be
/// released before committing. While it is held the endpoint raises ``clink.Busy``.
#[pyclass(module = "clink", frozen)]
pub struct SendSlot {
    pub(super) owner: Py<Endpoint>,
    pub(super) slot: Mutex<Option<SendBox<clink_rs::SendSlot<'static>>>>,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) exports: AtomicUsize,
}

impl SendSlot {
    fn finish(&self, commit: bool) -> PyResult<bool> {
        if self.exports.load(Ordering::Acquire) > 0 {
            return Err(PyBufferError::new_err(
                "release the memoryviews of this slot first",
            ));
        }
        let s = match self.slot.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        let Some(s) = s else { return Ok(false) };
        if commit {
            s.0.commit();
        } else {
            drop(s);
        }
        self.owner.get().sh.busy.store(false, Ordering::Release);
        Ok(true)
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        let s = match self.slot.get_mut() {
            Ok(g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        if s.is_some() {
            drop(s);
            self.owner.get().sh.busy.store(false, Ordering::Release);
        }
    }
}

#[pymethods]
impl SendSlot {
    /// Publishes the message; the endpoint is usable again. False when already done.
    fn commit(&self) -> PyResult<bool> {
        self.finish(true)
    }

    /// Gives the room back without sending. False when already done.
    fn abandon(&self) -> PyResult<bool> {
        self.finish(false)
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let ok = exc_type.is_none_or(|t| t.is_none());
        self.finish(ok)?;
        Ok(false)
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        if !me.slot.lock().map(|g| g.is_some()).unwrap_or(false) {
            return Err(PyBufferError::new_err(
                "slot already committed or abandoned",
            ));
        }
        // SAFETY: the slot is still open (checked above): its ring space stays reserved
        // while any view is exported (`exports` keeps commit and abandon from ending it).
        unsafe { fill_view(slf.as_any(), view, flags, me.ptr as *mut u8, me.len, false)? };
        me.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}
