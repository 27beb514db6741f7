//! CPU pinning with `sched_setaffinity`.
//!
//! A child inherits the affinity mask of the thread that spawns it, so
//! [`spawn_pinned`] pins the spawning thread around the spawn: the child (ours
//! or an external program such as `ucx_perftest`) starts on its CPU from its
//! first instruction. Our own children also pin themselves with [`pin_self`].

use std::io;
use std::process::{Child, Command};

/// CPU of the server side.
pub const SERVER_CPU: usize = 0;
/// CPU of the client side.
pub const CLIENT_CPU: usize = 1;

/// Number of CPUs the calling thread may run on, or `None` if unknown.
pub fn allowed_cpus() -> Option<usize> {
    get_mask().ok().map(|set| {
        // SAFETY: CPU_COUNT only reads the fully initialised cpu_set_t.
        unsafe { libc::CPU_COUNT(&set) as usize }
    })
}

/// Whether the two sides can be pinned to [`SERVER_CPU`] and [`CLIENT_CPU`].
pub fn can_pin_pair() -> bool {
    get_mask().is_ok_and(|set| {
        // SAFETY: CPU_ISSET reads a bit of the initialised set; the indices are
        // below CPU_SETSIZE.
        unsafe { libc::CPU_ISSET(SERVER_CPU, &set) && libc::CPU_ISSET(CLIENT_CPU, &set) }
    })
}

/// Pins the calling thread to `cpu`.
pub fn pin_self(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} out of range"),
        ));
    }
    // SAFETY: cpu is below CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set_mask(&set)
}

/// Spawns `cmd` with the child pinned to `cpu` (if `cpu` is `Some`), restoring
/// the calling thread's affinity afterwards.
pub fn spawn_pinned(cmd: &mut Command, cpu: Option<usize>) -> io::Result<Child> {
    let Some(cpu) = cpu else {
        return cmd.spawn();
    };
    let saved = get_mask()?;
    pin_self(cpu)?;
    let spawned = cmd.spawn();
    let restored = set_mask(&saved);
    let child = spawned?;
    restored.map(|()| child)
}

fn get_mask() -> io::Result<libc::cpu_set_t> {
    // SAFETY: zeroed cpu_set_t is valid; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = calling thread; pointer and size describe `set`.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc == 0 {
        Ok(set)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_mask(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: pid 0 = calling thread; pointer and size describe `set`.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Spawns a thread named `name`, pinned to `cpu` when given (the caller checked with
/// [`can_pin_pair`] that it may; a refusal then is a bug and panics the thread).
pub fn spawn_thread<R: Send + 'static>(
    name: &str,
    cpu: Option<usize>,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::thread::JoinHandle<R> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(c) = cpu {
                pin_self(c).unwrap_or_else(|e| panic!("cannot pin to CPU {c}: {e}"));
            }
            f()
        })
        .expect("spawn a bench thread")
}
