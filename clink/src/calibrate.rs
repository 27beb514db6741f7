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
