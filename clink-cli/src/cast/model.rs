//! The cost model of a chain: each host's rate predicted from its costs per byte,
//! measured in a fraction of a second when it starts.
//!
//! A host does its work on one thread, one chunk after another, so its rate is the
//! inverse of the sum of its costs per byte: hashing (BLAKE3), writing to the page cache
//! (a copy into the kernel), and for each network direction the kernel's copy between the
//! socket and the buffer (priced as one memory copy: the UDP path sends by `sendmmsg`
//! from the buffer and receives by speculative scatter straight into it, one kernel copy
//! each way), plus the source's read from its file (one copy). A link rate, when given,
//! caps the result. The chain goes at the pace of its slowest host.

use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Bytes each measurement moves.
const PROBE: usize = 16 << 20;

/// Measured speeds of this host, in bytes per second.
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    /// BLAKE3 hashing (chunk chaining values).
    pub hash_bps: f64,
    /// Memory-to-memory copy.
    pub copy_bps: f64,
    /// `pwrite` into the page cache of the output's file system (0: not measured).
    pub write_bps: f64,
}

impl Costs {
    /// Measures hashing and copying, and writing next to `out` when given (a temporary
    /// file, removed at once).
    pub fn measure(out: Option<&Path>) -> Costs {
        let src = vec![0x5au8; PROBE];
        let mut dst = vec![0u8; PROBE];
        dst.copy_from_slice(&src); // touch the pages first
        let t = Instant::now();
        let _ = super::hash::chunk_cv(0, &src);
        let hash_bps = PROBE as f64 / t.elapsed().as_secs_f64().max(1e-9);
        let t = Instant::now();
        for _ in 0..4 {
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
        }
        let copy_bps = 4.0 * PROBE as f64 / t.elapsed().as_secs_f64().max(1e-9);
        let write_bps = out.map_or(0.0, |p| write_speed(p, &src).unwrap_or(0.0));
        Costs {
            hash_bps,
            copy_bps,
            write_bps,
        }
    }

    /// Predicted rate (bytes per second) of a host that hashes (`hash`), writes
    /// (`write`), reads its input (`read`), receives (`net_in`) and sends (`net_out`)
    /// every byte, capped by `link_bps` when known.
    pub fn predict(
        &self,
        hash: bool,
        write: bool,
        read: bool,
        net_in: bool,
        net_out: bool,
        link_bps: Option<f64>,
    ) -> f64 {
        let mut t = 0.0;
        if hash {
            t += 1.0 / self.hash_bps;
        }
        if write && self.write_bps > 0.0 {
            t += 1.0 / self.write_bps;
        }
        let copies = [read, net_in, net_out].iter().filter(|&&b| b).count();
        t += copies as f64 / self.copy_bps;
        let cpu = if t > 0.0 { 1.0 / t } else { f64::MAX };
        link_bps.map_or(cpu, |l| cpu.min(l))
    }

    /// The speeds as JSON (MB/s).
    pub fn to_json(self) -> Value {
        json!({
            "hash_mbps": self.hash_bps / 1e6,
            "copy_mbps": self.copy_bps / 1e6,
            "write_mbps": self.write_bps / 1e6,
        })
    }
}

/// Speed of writing `data` to a temporary file beside `out` (removed afterwards).
fn write_speed(out: &Path, data: &[u8]) -> std::io::Result<f64> {
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = format!(".clinkcast-probe-{}", std::process::id());
    let path = dir.join(name);
    let f = std::fs::File::create(&path)?;
    let _guard = Remove(&path);
    let t = Instant::now();
    let mut off = 0u64;
    // As a node writes its chunks.
    for c in data.chunks(1 << 20) {
        super::write_in_pieces(&f, c, off)?;
        off += c.len() as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    (&f).flush()?;
    Ok(data.len() as f64 / secs.max(1e-9))
}

struct Remove<'a>(&'a Path);

impl Drop for Remove<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Parses a rate in tc's syntax (`1gbit`, `500mbit`, `100kbit`, `2gbps`) into bytes per
/// second.
pub fn parse_rate(s: &str) -> Option<f64> {
    let s = s.trim().to_ascii_lowercase();
    let units: [(&str, f64); 8] = [
        ("gbit", 1e9 / 8.0),
        ("mbit", 1e6 / 8.0),
        ("kbit", 1e3 / 8.0),
        ("gbps", 1e9),
        ("mbps", 1e6),
        ("kbps", 1e3),
        ("bit", 1.0 / 8.0),
        ("bps", 1.0),
    ];
    for (u, f) in units {
        if let Some(n) = s.strip_suffix(u) {
            return n.parse::<f64>().ok().map(|x| x * f);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_tc_syntax() {
        assert_eq!(parse_rate("1gbit"), Some(125e6));
        assert_eq!(parse_rate("500mbit"), Some(62.5e6));
        assert_eq!(parse_rate("fast"), None);
    }

    #[test]
    fn the_prediction_adds_costs_per_byte_and_takes_the_link_cap() {
        let c = Costs {
            hash_bps: 1e9,
            copy_bps: 1e9,
            write_bps: 1e9,
        };
        // hash + write + two network copies: 4 ns per byte.
        let r = c.predict(true, true, false, true, true, None);
        assert!((r - 250e6).abs() < 1.0, "{r}");
        assert_eq!(c.predict(true, true, false, true, true, Some(100e6)), 100e6);
    }
}
