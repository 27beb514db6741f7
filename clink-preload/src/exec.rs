//! Connections across exec. A program that execs with a followed connection open (inetd
//! style: socat's EXEC, a shell redirect) hands the new program each connection's state in
//! `CLINK_SOCKETS_STATE` and keeps the mapping's memfd open across the exec; the library
//! in the new program rebuilds the connections before `main`. The library is put back
//! into `LD_PRELOAD` when the new environment dropped it, since the new program could not
//! read the ring without it.

use crate::conn::Conn;
use crate::sys::{errno, set_errno};
use crate::{real, table};
use libc::{c_char, c_int};
use std::ffi::{CStr, CString};
use std::sync::Arc;

/// Name of the environment variable carrying the state.
pub const STATE_VAR: &str = "CLINK_SOCKETS_STATE";

struct Handoff {
    state: String,
    /// Descriptors whose close-on-exec flag was cleared, with their old flags.
    cleared: Vec<(c_int, c_int)>,
}

impl Handoff {
    fn undo(&self) {
        for (fd, flags) in &self.cleared {
            // SAFETY: restoring the descriptor flags we changed.
            unsafe { real::fcntl(*fd, libc::F_SETFD, *flags as libc::c_long) };
        }
    }
}

fn survives(fd: c_int) -> bool {
    // SAFETY: reading descriptor flags.
    let f = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    f >= 0 && f & libc::FD_CLOEXEC == 0
}

fn prepare() -> Option<Handoff> {
    let all = table::all();
    let mut groups: Vec<(Arc<Conn>, Vec<c_int>)> = Vec::new();
    for (fd, c) in all {
        if !survives(fd) {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, &c)) {
            Some((_, fds)) => fds.push(fd),
            None => groups.push((c, vec![fd])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let mut h = Handoff {
        state: String::new(),
        cleared: Vec::new(),
    };
    for (c, fds) in groups {
        let (text, keep) = c.export();
        for fd in keep {
            // SAFETY: reading and clearing close-on-exec on the library's own descriptor.
            let old = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
            if old >= 0 {
                unsafe {
                    real::fcntl(fd, libc::F_SETFD, (old & !libc::FD_CLOEXEC) as libc::c_long)
                };
                h.cleared.push((fd, old));
            }
        }
        for fd in fds {
            h.state.push_str(&format!("{fd}={text};"));
        }
    }
    Some(h)
}

fn own_path() -> Option<String> {
    // SAFETY: dladdr fills the info for an address inside this library.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(own_path as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The environment `envp` with the state variable set and the library in LD_PRELOAD.
fn environment(envp: *const *const c_char, h: &Handoff) -> Vec<CString> {
    let mut out = Vec::new();
    let mut preload = None;
    let mut i = 0;
    // SAFETY: `envp` is a NULL-terminated array of C strings (or null).
    while !envp.is_null() && unsafe { !(*envp.add(i)).is_null() } {
        let s = unsafe { CStr::from_ptr(*envp.add(i)) }.to_bytes().to_vec();
        i += 1;
        if s.starts_with(STATE_VAR.as_bytes()) && s.get(STATE_VAR.len()) == Some(&b'=') {
            continue;
        }
        if s.starts_with(b"LD_PRELOAD=") {
            preload = Some(String::from_utf8_lossy(&s[11..]).into_owned());
            continue;
        }
        if let Ok(c) = CString::new(s) {
            out.push(c);
        }
    }
    let me = own_path().unwrap_or_default();
    let preload = match preload {
        Some(p) if p.split([' ', ':']).any(|x| x == me) => p,
        Some(p) if !p.is_empty() => format!("{me}:{p}"),
        _ => me,
    };
    out.extend(CString::new(format!("LD_PRELOAD={preload}")).ok());
    out.extend(CString::new(format!("{STATE_VAR}={}", h.state)).ok());
    out
}

/// execve with the connections handed over.
pub fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let h = if crate::config().enabled {
        prepare()
    } else {
        None
    };
    let Some(h) = h else {
        // SAFETY: the caller's arguments, forwarded.
        return unsafe { real::execve(path, argv, envp) };
    };
    let env = environment(envp, &h);
    let mut ptrs: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: the caller's path and argv; our environment array, alive across the call.
    let r = unsafe { real::execve(path, argv, ptrs.as_ptr()) };
    let e = errno();
    h.undo();
    set_errno(e);
    r
}

extern "C" {
    static mut environ: *const *const c_char;
}

/// execv / execvp / execvpe: the C library runs these through its internal execve, so the
/// wrapper sets the handed-over environment for the duration of the call.
pub fn with_environment<F: FnOnce(*const *const c_char) -> c_int>(
    envp: Option<*const *const c_char>,
    f: F,
) -> c_int {
    let h = if crate::config().enabled {
        prepare()
    } else {
        None
    };
    // SAFETY: reading the process environment pointer.
    let base = envp.unwrap_or(unsafe { environ });
    let Some(h) = h else { return f(base) };
    let env = environment(base, &h);
    let mut ptrs: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let r = f(ptrs.as_ptr());
    let e = errno();
    h.undo();
    set_errno(e);
    r
}

/// In a program started by exec: rebuilds the connections handed over, then removes the
/// variable from the environment.
pub fn adopt() {
    let Ok(state) = std::env::var(STATE_VAR) else {
        return;
    };
    let mut seen: Vec<(&str, Arc<Conn>)> = Vec::new();
    for item in state.split(';').filter(|s| !s.is_empty()) {
        let Some((fd, text)) = item.split_once('=') else {
            continue;
        };
        let Ok(fd) = fd.parse::<c_int>() else {
            continue;
        };
        // dup'd descriptors of one connection share it.
        if let Some((_, c)) = seen.iter().find(|(t, _)| *t == text) {
            table::insert(fd, c.clone());
            continue;
        }
        match Conn::import(fd, text) {
            Some(c) => {
                let c = Arc::new(c);
                table::insert(fd, c.clone());
                seen.push((text, c));
            }
            None => crate::stats::line(&format!("fd {fd}: handed-over state not usable: {text}")),
        }
    }
    // SAFETY: single-threaded library initialisation; the name is NUL-terminated.
    unsafe { libc::unsetenv(c"CLINK_SOCKETS_STATE".as_ptr()) };
}
