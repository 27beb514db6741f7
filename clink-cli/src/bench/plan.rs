//! The measurement plan shared by the parent, the server child and the client
//! child, and its one-line text encoding (passed as `--plan`).

use std::time::Duration;

/// Default ping-pong sizes in bytes.
pub const DEFAULT_LAT_SIZES: &[usize] = &[0, 8, 64, 256, 1024, 4096, 16384, 65536];

/// Default streaming sizes in bytes (4 KiB .. 64 MiB).
pub const DEFAULT_BW_SIZES: &[usize] = &[
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

/// What one client run measures and how long it spends on each point.
///
/// Iteration counts are time-bounded: the client estimates the round-trip time
/// during warm-up and picks a count that fills `lat_time`, clamped to
/// `[lat_min_iters, lat_max_iters]`; bandwidth repetitions are sized to last
/// about `bw_rep_time` each and to move at least `bw_min_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Ping-pong message sizes in bytes.
    pub lat_sizes: Vec<usize>,
    /// Streaming message sizes in bytes.
    pub bw_sizes: Vec<usize>,
    /// Target measuring time per latency size.
    pub lat_time: Duration,
    /// Lower bound on measured ping-pong iterations per size.
    pub lat_min_iters: usize,
    /// Upper bound on measured ping-pong iterations per size.
    pub lat_max_iters: usize,
    /// Number of timed streaming repetitions per size (the median is reported).
    pub bw_reps: usize,
    /// Target duration of one streaming repetition.
    pub bw_rep_time: Duration,
    /// Least payload one streaming repetition moves, whatever its warm-up's rate. Over a
    /// lossy path a warm-up that met no loss would otherwise size repetitions too short to
    /// contain a retransmission timeout, and the median would hide them.
    pub bw_min_bytes: usize,
}

impl Plan {
    /// The default full plan (about 0.35 s per latency size and 5 x 80 ms per
    /// bandwidth size).
    pub fn full() -> Self {
        Plan {
            lat_sizes: DEFAULT_LAT_SIZES.to_vec(),
            bw_sizes: DEFAULT_BW_SIZES.to_vec(),
            lat_time: Duration::from_millis(300),
            lat_min_iters: 200,
            lat_max_iters: 20_000,
            bw_reps: 5,
            bw_rep_time: Duration::from_millis(80),
            bw_min_bytes: 0,
        }
    }

    /// A short plan for tests and demos: fewer iterations, 3 short repetitions.
    pub fn quick() -> Self {
        Plan {
            lat_time: Duration::from_millis(30),
            lat_min_iters: 50,
            lat_max_iters: 2_000,
            bw_reps: 3,
            bw_rep_time: Duration::from_millis(15),
            ..Plan::full()
        }
    }

    /// Encodes the plan as one `key=value;...` line for the child command line.
    pub fn encode(&self) -> String {
        format!(
            "lat={};bw={};lat_ms={};lat_min={};lat_max={};reps={};rep_ms={};rep_min={}",
            join(&self.lat_sizes),
            join(&self.bw_sizes),
            self.lat_time.as_millis(),
            self.lat_min_iters,
            self.lat_max_iters,
            self.bw_reps,
            self.bw_rep_time.as_millis(),
            self.bw_min_bytes
        )
    }

    /// Parses the output of [`Plan::encode`]; every key is required.
    pub fn decode(text: &str) -> Result<Self, String> {
        let mut plan = Plan::full();
        let mut seen = Vec::new();
        for part in text.split(';').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("plan: expected key=value, got {part:?}"))?;
            match key {
                "lat" => plan.lat_sizes = parse_sizes(value)?,
                "bw" => plan.bw_sizes = parse_sizes(value)?,
                "lat_ms" => plan.lat_time = Duration::from_millis(parse_num(key, value)?),
                "lat_min" => plan.lat_min_iters = parse_num(key, value)? as usize,
                "lat_max" => plan.lat_max_iters = parse_num(key, value)? as usize,
                "reps" => plan.bw_reps = parse_num(key, value)? as usize,
                "rep_ms" => plan.bw_rep_time = Duration::from_millis(parse_num(key, value)?),
                "rep_min" => plan.bw_min_bytes = parse_num(key, value)? as usize,
                _ => return Err(format!("plan: unknown key {key:?}")),
            }
            seen.push(key.to_string());
        }
        for key in [
            "lat", "bw", "lat_ms", "lat_min", "lat_max", "reps", "rep_ms", "rep_min",
        ] {
            if !seen.iter().any(|k| k == key) {
                return Err(format!("plan: missing key {key:?} in {text:?}"));
            }
        }
        if plan.bw_reps == 0 || plan.lat_min_iters == 0 || plan.lat_max_iters < plan.lat_min_iters {
            return Err(format!("plan: inconsistent counts in {text:?}"));
        }
        Ok(plan)
    }
}

fn join(sizes: &[usize]) -> String {
    sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_num(key: &str, value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .map_err(|e| format!("plan: bad number for {key}: {value:?}: {e}"))
}

/// Parses a comma-separated size list; each item is a byte count with an
/// optional binary suffix `K`, `M` or `G` (e.g. `0,64,4K,1M`). Empty = none.
pub fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_size)
        .collect()
}

fn parse_size(item: &str) -> Result<usize, String> {
    let upper = item.to_ascii_uppercase();
    let trimmed = upper
        .trim_end_matches('B')
        .trim_end_matches('I')
        .to_string();
    let (digits, shift) = match trimmed.chars().last() {
        Some('K') => (&trimmed[..trimmed.len() - 1], 10),
        Some('M') => (&trimmed[..trimmed.len() - 1], 20),
        Some('G') => (&trimmed[..trimmed.len() - 1], 30),
        _ => (trimmed.as_str(), 0),
    };
    let n: usize = digits
        .trim()
        .parse()
        .map_err(|e| format!("bad size {item:?}: {e}"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("size {item:?} too large"))
}

/// Human form of a byte size: `64`, `4K`, `16M` (binary units, exact only).
pub fn human_size(size: usize) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if size >= 1 << shift && size & ((1 << shift) - 1) == 0 {
            return format!("{}{}", size >> shift, suffix);
        }
    }
    size.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_roundtrip() {
        for plan in [Plan::full(), Plan::quick()] {
            assert_eq!(Plan::decode(&plan.encode()), Ok(plan));
        }
        let custom = Plan {
            lat_sizes: vec![],
            bw_sizes: vec![4096],
            bw_min_bytes: 64 << 20,
            ..Plan::quick()
        };
        assert_eq!(Plan::decode(&custom.encode()), Ok(custom));
    }

    #[test]
    fn plan_rejects_garbage() {
        assert!(Plan::decode("lat=1;bw=2").is_err());
        assert!(Plan::decode("nonsense").is_err());
        let bad = Plan::full().encode().replace("reps=5", "reps=x");
        assert!(Plan::decode(&bad).is_err());
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(
            parse_sizes("0,8, 4K,1M,64MiB"),
            Ok(vec![0, 8, 4096, 1 << 20, 64 << 20])
        );
        assert_eq!(parse_sizes(""), Ok(vec![]));
        assert!(parse_sizes("4X").is_err());
        assert!(parse_sizes("99999999999999999999G").is_err());
        assert_eq!(human_size(0), "0");
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(64 << 20), "64M");
        assert_eq!(human_size(1000), "1000");
    }
}
