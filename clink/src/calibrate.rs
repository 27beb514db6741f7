//! Measures the costs the protocol thresholds depend on (a few milliseconds at start).

use crate::sys;
use clink_proto::cost::Costs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn best_of<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_nanos() as f64);
    }
    best.max(1.0)
}

/// One cross-core cache-line round trip between two threads, halved: a stand-in for one
/// ring hop between processes.
fn hop_once() -> f64 {
    let flag = Arc::new(AtomicU64::new(0));
    let f2 = flag.clone();
    const ROUNDS: u64 = 500;
    let t = std::thread::spawn(move || {
        for i in 0..ROUNDS {
            let start = Instant::now();
            while f2.load(Ordering::Acquire) != 2 * i + 1 {
                if start.elapsed().as_millis() > 100 {
                    return;
                }
                std::hint::spin_loop();
            }
            f2.store(2 * i + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    let mut completed = 0;
    'outer: for i in 0..ROUNDS {
        flag.store(2 * i + 1, Ordering::Release);
        while flag.load(Ordering::Acquire) != 2 * i + 2 {
            if start.elapsed().as_millis() > 200 {
                break 'outer;
            }
            std::hint::spin_loop();
        }
        completed += 1;
    }
    let el = start.elapsed().as_nanos() as f64;
    let _ = t.join();
    if completed < ROUNDS {
        return Costs::default().hop_ns; // the other thread did not get a CPU in time
    }
    el / ROUNDS as f64 / 2.0
}

/// Best of three hop measurements: a trial disturbed by other work only makes it slower.
fn hop_ns() -> f64 {
    (0..3).map(|_| hop_once()).fold(f64::MAX, f64::min)
}

/// Measures copy bandwidth, CMA bandwidth and call cost (on this process), and the ring
/// hop. Falls back to the built-in figures for anything that cannot be measured.
pub fn measure() -> Costs {
    let d = Costs::default();
    const N: usize = 256 << 10;
    let src = vec![7u8; N];
    let mut dst = vec![0u8; N];
    let copy = best_of(20, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    });
    let pid = sys::getpid();
    let addr = src.as_ptr() as u64;
    let cma_ok = sys::cma_read(pid, addr, &mut dst[..8]).is_ok();
    let (cma_bw, cma_call) = if cma_ok {
        let small = best_of(50, || {
            let _ = sys::cma_read(pid, addr, &mut dst[..8]);
        });
        let big = best_of(20, || {
            let _ = sys::cma_read(pid, addr, &mut dst);
        });
        (N as f64 / (big - small).max(1.0), small)
    } else {
        (d.cma_bytes_per_ns, d.cma_call_ns)
    };
    const BIG: usize = 64 << 20;
    let big_src = vec![1u8; BIG];
    let mut big_dst = vec![0u8; BIG];
    let copy_dram = best_of(3, || {
        big_dst.copy_from_slice(std::hint::black_box(&big_src));
        std::hint::black_box(&mut big_dst);
    });
    let big_addr = big_src.as_ptr() as u64;
    let cma_dram = if cma_ok {
        let t = best_of(2, || {
            let _ = sys::cma_read(pid, big_addr, &mut big_dst);
        });
        BIG as f64 / t
    } else {
        d.cma_dram_bytes_per_ns
    };
    Costs {
        cma_dram_bytes_per_ns: cma_dram,
        copy_bytes_per_ns: N as f64 / copy,
        copy_dram_bytes_per_ns: BIG as f64 / copy_dram,
        cache_bytes: llc_bytes().unwrap_or(d.cache_bytes),
        cma_bytes_per_ns: cma_bw,
        cma_call_ns: cma_call,
        hop_ns: hop_ns(),
    }
}

/// Size of the largest CPU cache, from sysfs.
fn llc_bytes() -> Option<u64> {
    let mut best = None;
    for i in 0..8 {
        let p = format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size");
        let Ok(t) = std::fs::read_to_string(p) else {
            continue;
        };
        let t = t.trim();
        let (num, mul) = match t.strip_suffix('K') {
            Some(n) => (n, 1024),
            None => match t.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (t, 1),
            },
        };
        if let Ok(v) = num.parse::<u64>() {
            best = best.max(Some(v * mul));
        }
    }
    best
}

/// Where a context's costs came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Measured by this process (and stored for the others of this host).
    Measured,
    /// Read from the host's cache, measured by an earlier process of this boot.
    Cached,
    /// The built-in figures (`CLINK_CALIBRATE=0`).
    BuiltIn,
}

impl Source {
    /// How `clink info` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Measured => "measured by this process",
            Source::Cached => "measured once on this host, read from the cache",
            Source::BuiltIn => "built-in (CLINK_CALIBRATE=0)",
        }
    }
}

/// The host's cost cache: `CLINK_COSTS_CACHE`, or `/dev/shm/clink-costs-<uid>` (tmpfs:
/// gone at reboot, and the boot id inside is checked anyway).
pub fn cache_path(explicit: Option<&std::path::Path>) -> std::path::PathBuf {
    match explicit {
        Some(p) => p.to_path_buf(),
        None => std::path::PathBuf::from(format!("/dev/shm/clink-costs-{}", sys::getuid())),
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The cache's costs if it is ours (a regular file owned by this uid, not a link), from
/// this boot, and every figure plausible.
fn read_cache(path: &std::path::Path, boot: &str) -> Option<Costs> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.uid() != sys::getuid() || m.len() > 4096 {
        return None;
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut &f, &mut text).ok()?;
    let (b, costs) = Costs::from_cache_text(&text).ok()?;
    (b == boot).then_some(costs)
}

/// Writes the cache atomically (a temporary file renamed over it).
fn write_cache(path: &std::path::Path, costs: &Costs, boot: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", sys::getpid()));
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, costs.to_cache_text(boot).as_bytes()));
    if ok.is_ok() && std::fs::rename(&tmp, path).is_ok() {
        return;
    }
    let _ = std::fs::remove_file(&tmp);
}

/// The costs of this host: from the cache when an earlier process of this boot measured
/// them, else measured here (one process at a time: the others wait on a lock for up to
/// 10 s, then read what it stored) and stored. A figure outside what any machine could
/// measure (a measurement disturbed by load) is replaced by the built-in one and the costs
/// are not stored, so that a later, quieter process measures again. `fresh` measures
/// whatever the cache holds.
pub fn host_costs(cache: Option<&std::path::Path>, fresh: bool) -> (Costs, Source) {
    host_costs_by(cache, fresh, measure)
}

/// [`host_costs`] with `measure` taking the measurements.
fn host_costs_by(
    cache: Option<&std::path::Path>,
    fresh: bool,
    measure: impl FnOnce() -> Costs,
) -> (Costs, Source) {
    let path = cache_path(cache);
    let boot = boot_id();
    if !fresh {
        if let Some(c) = read_cache(&path, &boot) {
            return (c, Source::Cached);
        }
    }
    let lock = sys::FileLock::acquire(
        &path.with_extension("lock"),
        std::time::Duration::from_secs(10),
    );
    if !fresh && lock.is_some() {
        if let Some(c) = read_cache(&path, &boot) {
            return (c, Source::Cached);
        }
    }
    let (costs, bad) = measure().sanitized();
    if bad.is_empty() && lock.is_some() && !boot.is_empty() {
        write_cache(&path, &costs, &boot);
    }
    (costs, Source::Measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_measures_the_others_read_and_a_bad_cache_is_replaced() {
        let dir = std::env::temp_dir().join(format!("clink-costs-test-{}", sys::getpid()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("costs");
        // Plausible figures (the built-in ones), whatever the machine's load (a measurement
        // under load can be implausible, and is then not stored: a different case).
        let host_costs =
            |p: Option<&std::path::Path>, fresh| host_costs_by(p, fresh, Costs::default);
        let (first, src) = host_costs(Some(&path), false);
        assert_eq!(src, Source::Measured);
        let (second, src) = host_costs(Some(&path), false);
        assert_eq!((second, src), (first, Source::Cached));
        // Garbage, another boot's figures and a link are not used; the next measurement
        // replaces them.
        for bad in ["nonsense", &first.to_cache_text("another-boot")] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(host_costs(Some(&path), false).1, Source::Measured);
            assert_eq!(host_costs(Some(&path), false).1, Source::Cached);
        }
        let other = dir.join("elsewhere");
        std::fs::rename(&path, &other).unwrap();
        std::os::unix::fs::symlink(&other, &path).unwrap();
        assert_eq!(
            host_costs(Some(&path), false).1,
            Source::Measured,
            "a link is not followed"
        );
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            host_costs(Some(&path), true).1,
            Source::Measured,
            "fresh measures anyway"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
