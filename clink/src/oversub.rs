//! Whether the machine has more runnable threads than CPUs.
//!
//! Spinning before blocking saves the wake-up (20-40 us on a VM) when the peer answers
//! within the spin time and has a CPU of its own to answer on. When runnable threads
//! outnumber the CPUs this process may run on (eight processes on two cores in an
//! all-to-all, a server with many clients), a spinning waiter takes the CPU its peers
//! need to produce what it waits for: waits then block at once. The count is the
//! kernel's (`procs_running` in `/proc/loadavg`), sampled at most every
//! [`SAMPLE_EVERY`] per process, so the check costs a clock reading and two atomic loads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How often the runnable count is read.
pub const SAMPLE_EVERY: u64 = 20_000_000;

static SAMPLED_AT: AtomicU64 = AtomicU64::new(0);
static OVER: AtomicBool = AtomicBool::new(false);

/// True when, at the last sample, runnable threads outnumbered the machine's online CPUs
/// by two or more (one more is normal: a kernel thread, a timer; the CPUs of the
/// machine, not this process's affinity mask: a process pinned to one CPU still has
/// its peer on another).
pub fn oversubscribed() -> bool {
    let now = crate::sys::monotonic_ns();
    let at = SAMPLED_AT.load(Ordering::Relaxed);
    if now.saturating_sub(at) >= SAMPLE_EVERY
        && SAMPLED_AT
            .compare_exchange(at, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let over = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| running(&s))
            .is_some_and(|r| r > online_cpus() + 1);
        OVER.store(over, Ordering::Relaxed);
    }
    OVER.load(Ordering::Relaxed)
}

/// The machine's online CPUs (`/sys/devices/system/cpu/online`, read once).
fn online_cpus() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| cpu_list_len(&s))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// The number of CPUs in a kernel CPU list ("0-3,6": 5).
fn cpu_list_len(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(n)
}

/// The runnable count in a `/proc/loadavg` line ("0.12 0.30 0.25 3/412 9876": 3).
fn running(loadavg: &str) -> Option<usize> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_is_read_from_loadavg() {
        assert_eq!(running("0.12 0.30 0.25 3/412 9876\n"), Some(3));
        assert_eq!(running("0.12 0.30 0.25 17/412 9876"), Some(17));
        assert_eq!(running("0.12 0.30"), None);
        assert_eq!(running("a b c x/y z"), None);
        assert_eq!(cpu_list_len("0-1\n"), Some(2));
        assert_eq!(cpu_list_len("0-3,6"), Some(5));
        assert_eq!(cpu_list_len("5"), Some(1));
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("x"), None);
        // The live file parses (this test itself is running).
        let live = std::fs::read_to_string("/proc/loadavg").unwrap();
        assert!(running(&live).is_some_and(|r| r >= 1), "{live}");
    }
}
