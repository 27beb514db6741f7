//! CPU pinning with `sched_setaffinity`.
//!
//! A child inherits the affinity mask of the thread that spawns it, so
//! [`spawn_pinned`] pins the spawning thread around the spawn: the child (ours
//! or an external program such as `ucx_perftest`) starts on its CPU from its
//! first instruction. Our own children also pin themselves with [`pin_self`].

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use std::io;
use std::process::{Child, Command};

/// CPU of the server side.
pub const SERVER_CPU: usize = 0;
/// CPU of the client side.
pub const CLIENT_CPU: usize = 1;

/// Number of CPUs the calling thread may run on, or `None` if unknown.
pub fn allowed_cpus() -> Option<usize> {
    get_mask().ok().map(|set| set.count() as usize)
}

/// Whether the two sides can be pinned to [`SERVER_CPU`] and [`CLIENT_CPU`].
pub fn can_pin_pair() -> bool {
    get_mask().is_ok_and(|set| set.is_set(SERVER_CPU) && set.is_set(CLIENT_CPU))
}

/// Pins the calling thread to `cpu`.
pub fn pin_self(cpu: usize) -> io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} out of range"),
        ));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
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

/// The calling thread's affinity mask.
fn get_mask() -> io::Result<CpuSet> {
    Ok(sched_getaffinity(None)?)
}

fn set_mask(set: &CpuSet) -> io::Result<()> {
    Ok(sched_setaffinity(None, set)?)
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
