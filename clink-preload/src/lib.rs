//! `libclink_preload.so`: the sockets layer of clink. Loaded with `LD_PRELOAD` (or by
//! `clink run -- PROGRAM`), it moves the data of TCP connections between two processes on
//! one host that both run under it onto shared-memory rings, and leaves every other
//! connection on kernel TCP, byte for byte as before.
//!
//! The kernel connection is always made first and stays the application's descriptor; the
//! two ends pair outside the stream (an abstract Unix socket per connection, each end
//! proving it owns the mirror socket by passing it) and each direction switches to the ring
//! at an exact byte offset. See `clink_proto::sockets` for the protocol and ARCHITECTURE.md
//! for the design and its limits.
//!
//! Environment:
//! - `CLINK_SOCKETS=0` turns acceleration off (every call goes to the kernel);
//! - `CLINK_SOCKETS_SPIN_US` (default 20): how long a blocking call spins on a ring before
//!   it sleeps in the kernel (while the process's spins keep failing, calls sleep at once
//!   for a while);
//! - `CLINK_SOCKETS_RING_KB` (default 1024, a power of two from 4 to 65536): each
//!   direction's ring;
//! - `CLINK_SOCKETS_STATS=PATH`: append one line per connection to PATH (accelerated or
//!   not, and why; wake-ups sent; the process's blocking calls whose spin failed and the
//!   times its spin closed; bytes by ring and by kernel);
//! - `CLINK_SOCKETS_WAKE=0` wakes a sleeping reader with a byte through the kernel socket
//!   instead of a datagram to its wake socket (see `conn/wake.rs`).

mod conn;
mod exec;
mod fdbits;
mod interpose;
mod real;
mod shared;
mod spin;
mod stats;
mod sys;
mod table;
mod wait;

use std::sync::OnceLock;

/// The library's settings, read once from the environment.
pub struct Config {
    /// Whether connections are paired at all.
    pub enabled: bool,
    /// Spin budget of blocking calls, in nanoseconds.
    pub spin_ns: u64,
    /// Bytes of each ring.
    pub ring: u32,
    /// Where statistics lines go.
    pub stats: Option<String>,
    /// Whether a sleeping reader of a ring listens on a wake socket (`conn/wake.rs`).
    pub wake_sockets: bool,
}

fn complain(var: &str, value: &str, why: &str) {
    let msg = format!("libclink_preload: {var}={value}: {why}; acceleration is off\n");
    // SAFETY: writing our message to stderr.
    unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
}

fn read_config() -> Config {
    let mut c = Config {
        enabled: true,
        spin_ns: 20_000,
        ring: 1 << 20,
        stats: std::env::var("CLINK_SOCKETS_STATS")
            .ok()
            .filter(|s| !s.is_empty()),
        wake_sockets: true,
    };
    if let Ok(v) = std::env::var("CLINK_SOCKETS_WAKE") {
        match v.as_str() {
            "0" | "off" | "no" | "false" => c.wake_sockets = false,
            "1" | "on" | "yes" | "true" => {}
            _ => {
                complain("CLINK_SOCKETS_WAKE", &v, "not 0 or 1");
                c.enabled = false;
            }
        }
    }
    if let Ok(v) = std::env::var("CLINK_SOCKETS") {
        c.enabled = !matches!(v.as_str(), "0" | "off" | "no" | "false");
    }
    if let Ok(v) = std::env::var("CLINK_SOCKETS_SPIN_US") {
        match v.parse::<u64>() {
            Ok(us) if us <= 10_000_000 => c.spin_ns = us * 1000,
            _ => {
                complain(
                    "CLINK_SOCKETS_SPIN_US",
                    &v,
                    "not a number of microseconds up to 10000000",
                );
                c.enabled = false;
            }
        }
    }
    if let Ok(v) = std::env::var("CLINK_SOCKETS_RING_KB") {
        match v.parse::<u32>() {
            Ok(kb) if kb.is_power_of_two() && (4..=65536).contains(&kb) => c.ring = kb * 1024,
            _ => {
                complain(
                    "CLINK_SOCKETS_RING_KB",
                    &v,
                    "not a power of two from 4 to 65536",
                );
                c.enabled = false;
            }
        }
    }
    c
}

static DISABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The settings.
pub fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    static OFF: OnceLock<Config> = OnceLock::new();
    if DISABLED.load(std::sync::atomic::Ordering::Acquire) {
        return OFF.get_or_init(|| Config {
            enabled: false,
            ..read_config()
        });
    }
    C.get_or_init(read_config)
}

/// Turns pairing off for the rest of the process (it set up io_uring).
pub fn disable() {
    DISABLED.store(true, std::sync::atomic::Ordering::Release);
}

extern "C" fn init() {
    let _ = config();
}

extern "C" fn fini() {
    // One line per connection, not per descriptor: dup'd descriptors share it.
    let mut seen: Vec<std::sync::Arc<conn::Conn>> = Vec::new();
    for (fd, c) in table::all() {
        if !seen.iter().any(|s| std::sync::Arc::ptr_eq(s, &c)) {
            // Every descriptor closes at exit: this one is the last.
            c.before_close(fd, || true);
            stats::record_close(&c);
            seen.push(c);
        }
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
