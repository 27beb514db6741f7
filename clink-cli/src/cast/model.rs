//! The cost model of a chain: each host's rate predicted from its costs per byte,
//! measured in a fraction of a second when it starts.
//!
//! A host does its work on one thread, one chunk after another, so its rate is the
//! inverse of the sum of its costs per byte: hashing (BLAKE3), writing to the page cache
//! (a copy into the kernel), for each network direction half of what a byte costs to go
//! through a loopback TCP connection (the kernel's copies and its TCP path, both ends
//! driven by one thread), plus the source's read from its file (one copy). A link rate,
//! when given, caps the result. The chain goes at the pace of its slowest host; hosts
//! that share a machine share its cores ([`shared_rate`]).

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
    /// A byte sent and received through a loopback TCP connection by one thread (0: not
    /// measured; each direction is then priced as a memory copy).
    pub net_bps: f64,
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
        let net_bps = net_speed(&src).unwrap_or(0.0);
        Costs {
            hash_bps,
            copy_bps,
            write_bps,
            net_bps,
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
        if read {
            t += 1.0 / self.copy_bps;
        }
        let per_direction = if self.net_bps > 0.0 {
            0.5 / self.net_bps
        } else {
            1.0 / self.copy_bps
        };
        t += [net_in, net_out].iter().filter(|&&b| b).count() as f64 * per_direction;
        let cpu = if t > 0.0 { 1.0 / t } else { f64::MAX };
        link_bps.map_or(cpu, |l| cpu.min(goodput(l)))
    }

    /// The same speeds from a report's `costs` (MB/s), `None` when one is missing.
    pub fn from_json(v: &Value) -> Option<Costs> {
        let f = |k: &str| v[k].as_f64().map(|m| m * 1e6);
        Some(Costs {
            hash_bps: f("hash_mbps")?,
            copy_bps: f("copy_mbps")?,
            write_bps: f("write_mbps")?,
            net_bps: f("net_mbps")?,
        })
    }

    /// The speeds as JSON (MB/s).
    pub fn to_json(self) -> Value {
        json!({
            "hash_mbps": self.hash_bps / 1e6,
            "copy_mbps": self.copy_bps / 1e6,
            "write_mbps": self.write_bps / 1e6,
            "net_mbps": self.net_bps / 1e6,
        })
    }
}

/// What a link of `link_bps` (bytes per second on the wire) carries of TCP payload at MTU
/// 1500: 1 448 bytes (the MSS with timestamps) per 1 538 on the wire (Ethernet's header,
/// check sum, preamble and gap, and the IP and TCP headers).
pub fn goodput(link_bps: f64) -> f64 {
    link_bps * 1448.0 / 1538.0
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

/// Speed of moving `data` through a loopback TCP connection, one thread writing and
/// reading in turn (so the figure is what a byte costs both ends, the kernel's TCP path
/// included, not what two cores could overlap).
fn net_speed(data: &[u8]) -> std::io::Result<f64> {
    use std::io::{ErrorKind, Read};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let mut tx = std::net::TcpStream::connect(l.local_addr()?)?;
    let (mut rx, _) = l.accept()?;
    tx.set_nonblocking(true)?;
    rx.set_read_timeout(Some(std::time::Duration::from_secs(1)))?;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let (mut sent, mut got) = (0, 0);
    while got < data.len() {
        while sent < data.len() {
            match tx.write(&data[sent..(sent + (256 << 10)).min(data.len())]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        // What was written is in the receiver's queue (loopback delivers within the
        // write): a blocking read returns at once.
        got += rx.read(&mut buf)?;
    }
    Ok(data.len() as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// The rate of a chain whose hosts, predicted at `rates` (bytes per second) each with a
/// core of its own, share `cores` cores: every byte costs each host its time per byte,
/// and the cores supply `cores` seconds per second.
pub fn shared_rate(rates: &[f64], cores: usize) -> f64 {
    let per_byte: f64 = rates.iter().map(|r| 1.0 / r).sum();
    let shared = cores as f64 / per_byte;
    rates.iter().copied().fold(shared, f64::min)
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
            net_bps: 0.5e9,
        };
        // hash + write + two network directions at 1 ns each: 4 ns per byte.
        let r = c.predict(true, true, false, true, true, None);
        assert!((r - 250e6).abs() < 1.0, "{r}");
        let capped = c.predict(true, true, false, true, true, Some(100e6));
        assert!((capped - 100e6 * 1448.0 / 1538.0).abs() < 1.0, "{capped}");
        // Unmeasured, a direction is a copy.
        let r = Costs { net_bps: 0.0, ..c }.predict(false, false, false, true, false, None);
        assert!((r - 1e9).abs() < 1.0, "{r}");
    }

    #[test]
    fn hosts_sharing_cores_share_their_time() {
        // Three hosts at 1 GB/s each on two cores: 2 / 3 GB/s; on six, the slowest alone.
        assert!((shared_rate(&[1e9, 1e9, 1e9], 2) - 2e9 / 3.0).abs() < 1.0);
        assert_eq!(shared_rate(&[1e9, 2e9, 1e9], 6), 1e9);
    }
}
