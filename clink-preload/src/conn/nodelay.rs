//! TCP_NODELAY while a sending direction is on the ring. Its kernel stream then carries
//! only one-byte wake-ups, and with Nagle's algorithm on (the application's default) a
//! wake-up sent while the previous one is unacknowledged waits for the peer's ack, which
//! the peer delays (up to 40 ms) since it sends no data by the kernel: a writer facing a
//! full ring then slept milliseconds per ring (iperf3 without `-N`: 0.5 against 69 Gbit/s
//! with it). The library sets TCP_NODELAY at the switch and keeps the application's value
//! to report it (`getsockopt`) and to restore it when the direction goes back to the
//! kernel.

use super::*;

impl Conn {
    /// At the switch of the sending direction: holds the socket at TCP_NODELAY, keeping
    /// the application's value.
    pub(super) fn take_nodelay(&self, fd: c_int) {
        let _keep = sys::SavedErrno::save();
        let Some(app) = sys::sockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY) else {
            return;
        };
        if app == 0 && !set_nodelay(fd, 1) {
            return;
        }
        self.app_nodelay.store(app, Ordering::Release);
    }

    /// When the sending direction goes back to the kernel: the application's value again.
    pub(super) fn give_back_nodelay(&self, fd: c_int) {
        let app = self.app_nodelay.swap(-1, Ordering::AcqRel);
        if app == 0 {
            let _keep = sys::SavedErrno::save();
            set_nodelay(fd, 0);
        }
    }

    /// The application sets TCP_NODELAY to `v`: while the library holds it, the socket
    /// stays at 1 and `v` is what the application sees (`None`: not held, the
    /// application's call goes to the kernel).
    pub fn app_sets_nodelay(&self, fd: c_int, v: c_int) -> Option<c_int> {
        let held = self.app_nodelay.load(Ordering::Acquire);
        if held < 0 {
            return None;
        }
        self.app_nodelay.store((v != 0) as c_int, Ordering::Release);
        // The socket stays at 1 (a value of 0 would hand wake-ups back to Nagle).
        Some(if set_nodelay(fd, 1) { 0 } else { -1 })
    }

    /// The application's TCP_NODELAY while the library holds the socket at 1.
    pub fn app_nodelay(&self) -> Option<c_int> {
        let v = self.app_nodelay.load(Ordering::Acquire);
        (v >= 0).then_some(v)
    }
}

fn set_nodelay(fd: c_int, v: c_int) -> bool {
    // SAFETY: setting an int option of a socket from our own int.
    unsafe {
        real::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &v as *const c_int as *const libc::c_void,
            std::mem::size_of::<c_int>() as libc::socklen_t,
        ) == 0
    }
}
