//! Which connections were accelerated and why the others were not: one line per
//! connection, appended when it closes (or when the process exits) to the file named by
//! `CLINK_SOCKETS_STATS` (`clink run --stats` sets it).

use crate::conn::Conn;
use std::sync::atomic::Ordering;

/// Writes one line to the statistics file, if one is configured.
pub fn line(text: &str) {
    let Some(path) = crate::config().stats.as_ref() else {
        return;
    };
    let _keep = crate::sys::SavedErrno::save();
    let line = format!("clink-sockets pid {}: {text}\n", std::process::id());
    let Ok(cpath) = std::ffi::CString::new(path.as_str()) else {
        return;
    };
    // SAFETY: opening, appending to and closing a file of our own; one write of a short
    // line is atomic with O_APPEND, so processes sharing the file do not interleave.
    unsafe {
        let fd = libc::open(
            cpath.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        );
        if fd >= 0 {
            libc::syscall(libc::SYS_write, fd, line.as_ptr(), line.len());
            crate::real::close(fd);
        }
    }
}

/// Records a connection that stays on the kernel from the start.
pub fn record_plain(fd: libc::c_int, why: &str) {
    if crate::config().stats.is_none() {
        return;
    }
    let label = match (crate::sys::local_addr(fd), crate::sys::peer_addr(fd)) {
        (Some(l), Some(p)) => format!("{l} -> {p}"),
        _ => "unconnected".to_string(),
    };
    line(&format!("{label}: kernel ({why})"));
}

/// Records a followed connection when its last descriptor closes.
pub fn record_close(c: &Conn) {
    if crate::config().stats.is_none() {
        return;
    }
    let k = &c.counters;
    let (failed, closed) = crate::spin::counts();
    line(&format!(
        "{}: {} wakes {} spins failed {failed} closed {closed} ring tx {} rx {} kernel tx {} rx {}",
        c.label,
        c.outcome(),
        k.wake_datagrams.load(Ordering::Relaxed),
        k.ring_tx.load(Ordering::Relaxed),
        k.ring_rx.load(Ordering::Relaxed),
        k.kernel_tx.load(Ordering::Relaxed),
        k.kernel_rx.load(Ordering::Relaxed)
    ));
}
