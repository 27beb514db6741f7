//! Result rows: their JSON form (one object per line, the child -> parent and
//! `--json` format) and the human-readable table.
//!
//! JSON fields added after the first version (readers of older rows get the
//! defaults): `placement` (`host` or `netns`; default `host`), `mtu` (veth MTU,
//! netns rows only), `cpu_s_per_gb` (bandwidth rows of systems the harness drives
//! itself: client + server CPU seconds per GB received), `kernel_s_per_gb` (the part of
//! those in the kernel) and `lost_pct` (bandwidth
//! rows of unreliable channels: percent of the bytes sent that never arrived),
//! `loss_pct` and `rate` (bridge rows: the random loss into each host, and its input
//! link's rate limit if any).

use serde_json::{json, Map, Value};

use super::channel::Mode;
use super::plan::human_size;
use super::stats::{median, n_half, NHalf};

/// `placement` of rows measured on the host (loopback, shared memory).
pub const HOST_PLACEMENT: &str = "host";
/// `placement` of rows measured between two network namespaces joined by veth.
pub const NETNS_PLACEMENT: &str = "netns";
/// `placement` of rows measured between two hosts on a Linux bridge (with `loss_pct`
/// and `rate`).
pub const BRIDGE_PLACEMENT: &str = "bridge";

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// One-way latency (round trip / 2) in microseconds.
    LatencyUs,
    /// Streaming bandwidth in GB/s (1e9 bytes per second).
    BandwidthGbs,
}

impl Metric {
    /// The `metric` JSON field.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::LatencyUs => "latency_us",
            Metric::BandwidthGbs => "bandwidth_gbs",
        }
    }

    /// Parses the `metric` JSON field.
    pub fn parse(text: &str) -> Result<Metric, String> {
        match text {
            "latency_us" => Ok(Metric::LatencyUs),
            "bandwidth_gbs" => Ok(Metric::BandwidthGbs),
            other => Err(format!("unknown metric {other:?}")),
        }
    }
}

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// System name (`tcp`, `unix`, `clink`, `ucx`).
    pub system: String,
    /// Transport label reported by the channel (`loopback`, `unix`, `shm`, ...).
    pub transport: String,
    /// Waiting mode.
    pub mode: Mode,
    /// What is measured.
    pub metric: Metric,
    /// Message size in bytes.
    pub size: usize,
    /// Median: of one-way latencies, or of the repetitions' bandwidths.
    pub median: f64,
    /// 99th percentile of one-way latencies (latency rows only; `None` if unknown).
    pub p99: Option<f64>,
    /// Smallest sample (latency) or slowest repetition (bandwidth), if known.
    pub min: Option<f64>,
    /// Largest sample (latency) or fastest repetition (bandwidth), if known.
    pub max: Option<f64>,
    /// Copies of each payload byte by the protocol's design (nominal, not measured: the
    /// JSON key is `nominal_copies_per_byte`; `None` when the system does not say).
    pub copies_per_byte: Option<f64>,
    /// Measured ping-pong round trips, or messages per bandwidth repetition.
    pub iterations: u64,
    /// Number of repetitions (1 for latency).
    pub reps: u64,
    /// Whether server and client ran pinned to different CPUs.
    pub pinned: bool,
    /// Index of the interleaved round (repetition of the whole run) this row
    /// belongs to, from 0.
    pub round: u64,
    /// Free-form remark (e.g. which UCX transports were used).
    pub note: Option<String>,
    /// Where the two sides ran: [`HOST_PLACEMENT`] or [`NETNS_PLACEMENT`].
    pub placement: String,
    /// MTU of the veth pair (netns placement only).
    pub mtu: Option<u32>,
    /// Bandwidth rows: CPU seconds of client + server per GB received during the
    /// timed rounds (`None` for external tools).
    pub cpu_s_per_gb: Option<f64>,
    /// Bandwidth rows: the part of `cpu_s_per_gb` spent in the kernel (system time).
    pub kernel_s_per_gb: Option<f64>,
    /// Bandwidth rows of unreliable channels: percent of the bytes sent that were lost.
    pub lost_pct: Option<f64>,
    /// Bridge rows: percent of packets dropped at random on the way into each host.
    pub loss_pct: Option<f64>,
    /// Bridge rows: the rate limit of each host's input link (tc syntax), if any.
    pub rate: Option<String>,
    /// Rows measured between namespaces: their TCP congestion control (what kernel TCP's
    /// and clink-tcp's sockets used).
    pub tcp_cc: Option<String>,
}

impl Row {
    /// A busy-mode row placed on the host (a caller that measured elsewhere relabels the
    /// placement) with `median` alone: one repetition, no percentile, extremes, copy
    /// count, iterations or CPU figure unless the caller sets them (the external tools'
    /// rows, test rows).
    pub fn busy_host(
        system: &str,
        transport: &str,
        metric: Metric,
        size: usize,
        median: f64,
    ) -> Row {
        Row {
            system: system.into(),
            transport: transport.into(),
            mode: Mode::Busy,
            metric,
            size,
            median,
            p99: None,
            min: None,
            max: None,
            copies_per_byte: None,
            iterations: 0,
            reps: 1,
            pinned: false,
            round: 0,
            note: None,
            placement: HOST_PLACEMENT.into(),
            mtu: None,
            cpu_s_per_gb: None,
            kernel_s_per_gb: None,
            lost_pct: None,
            loss_pct: None,
            rate: None,
            tcp_cc: None,
        }
    }

    /// The row as one JSON object (single line, no trailing newline).
    pub fn to_json(&self) -> String {
        let mut obj = Map::new();
        obj.insert("system".into(), json!(self.system));
        obj.insert("transport".into(), json!(self.transport));
        obj.insert("mode".into(), json!(self.mode.as_str()));
        obj.insert("metric".into(), json!(self.metric.as_str()));
        obj.insert("size".into(), json!(self.size));
        obj.insert("median".into(), num(Some(self.median)));
        if self.metric == Metric::LatencyUs {
            obj.insert("p99".into(), num(self.p99));
        }
        obj.insert("min".into(), num(self.min));
        obj.insert("max".into(), num(self.max));
        obj.insert("round".into(), json!(self.round));
        obj.insert("nominal_copies_per_byte".into(), num(self.copies_per_byte));
        obj.insert("iterations".into(), json!(self.iterations));
        obj.insert("reps".into(), json!(self.reps));
        obj.insert("pinned".into(), json!(self.pinned));
        if let Some(note) = &self.note {
            obj.insert("note".into(), json!(note));
        }
        obj.insert("placement".into(), json!(self.placement));
        if let Some(mtu) = self.mtu {
            obj.insert("mtu".into(), json!(mtu));
        }
        if self.cpu_s_per_gb.is_some() {
            obj.insert("cpu_s_per_gb".into(), num(self.cpu_s_per_gb));
        }
        if self.kernel_s_per_gb.is_some() {
            obj.insert("kernel_s_per_gb".into(), num(self.kernel_s_per_gb));
        }
        if self.lost_pct.is_some() {
            obj.insert("lost_pct".into(), num(self.lost_pct));
        }
        if self.loss_pct.is_some() {
            obj.insert("loss_pct".into(), num(self.loss_pct));
        }
        if let Some(rate) = &self.rate {
            obj.insert("rate".into(), json!(rate));
        }
        if let Some(cc) = &self.tcp_cc {
            obj.insert("tcp_cc".into(), json!(cc));
        }
        Value::Object(obj).to_string()
    }

    /// Parses one line written by [`Row::to_json`], with a clear error naming
    /// the missing or malformed field.
    pub fn from_json(line: &str) -> Result<Row, String> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("not a JSON row ({e}): {line:?}"))?;
        let obj = value
            .as_object()
            .ok_or_else(|| format!("JSON row is not an object: {line:?}"))?;
        let field = |name: &str| {
            obj.get(name)
                .ok_or_else(|| format!("JSON row lacks {name:?}: {line:?}"))
        };
        let string = |name: &str| -> Result<String, String> {
            field(name)?
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("JSON row field {name:?} is not a string: {line:?}"))
        };
        let uint = |name: &str| -> Result<u64, String> {
            field(name)?
                .as_u64()
                .ok_or_else(|| format!("JSON row field {name:?} is not an integer: {line:?}"))
        };
        let opt_f64 = |name: &str| -> Result<Option<f64>, String> {
            match obj.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| format!("JSON row field {name:?} is not a number: {line:?}")),
            }
        };
        let size = usize::try_from(uint("size")?)
            .map_err(|_| format!("JSON row size out of range: {line:?}"))?;
        Ok(Row {
            system: string("system")?,
            transport: string("transport")?,
            mode: Mode::parse(&string("mode")?)?,
            metric: Metric::parse(&string("metric")?)?,
            size,
            median: opt_f64("median")?
                .ok_or_else(|| format!("JSON row lacks a numeric \"median\": {line:?}"))?,
            p99: opt_f64("p99")?,
            min: opt_f64("min")?,
            max: opt_f64("max")?,
            // (Rows written before the key said "nominal" are read too.)
            copies_per_byte: match opt_f64("nominal_copies_per_byte")? {
                Some(c) => Some(c),
                None => opt_f64("copies_per_byte")?,
            },
            iterations: uint("iterations")?,
            reps: uint("reps")?,
            pinned: obj.get("pinned").and_then(Value::as_bool).unwrap_or(false),
            round: obj.get("round").and_then(Value::as_u64).unwrap_or(0),
            note: obj.get("note").and_then(Value::as_str).map(str::to_string),
            placement: obj
                .get("placement")
                .and_then(Value::as_str)
                .unwrap_or(HOST_PLACEMENT)
                .to_string(),
            mtu: obj
                .get("mtu")
                .and_then(Value::as_u64)
                .and_then(|m| u32::try_from(m).ok()),
            cpu_s_per_gb: opt_f64("cpu_s_per_gb")?,
            kernel_s_per_gb: opt_f64("kernel_s_per_gb")?,
            lost_pct: opt_f64("lost_pct")?,
            loss_pct: opt_f64("loss_pct")?,
            rate: obj.get("rate").and_then(Value::as_str).map(str::to_string),
            tcp_cc: obj
                .get("tcp_cc")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

/// Decimal places kept in JSON numbers (0.1 ns for latency, 0.1 MB/s for bandwidth).
const JSON_DECIMALS: f64 = 1e4;

/// A finite number as JSON (rounded to 4 decimals), anything else as `null`.
fn num(v: Option<f64>) -> Value {
    match v {
        Some(x) if x.is_finite() => json!((x * JSON_DECIMALS).round() / JSON_DECIMALS),
        _ => Value::Null,
    }
}

/// Merges the rows of several rounds: one row per (placement, mtu, system, mode,
/// metric, size) whose `median`, `p99`, `cpu_s_per_gb`, `kernel_s_per_gb` and `lost_pct` are the
/// medians over the rounds and whose `min` / `max` are the extremes. Rows keep
/// their first-seen order.
pub fn merge_rounds(rows: &[Row]) -> Vec<Row> {
    let key = |r: &Row| {
        (
            r.placement.clone(),
            r.mtu,
            condition(r),
            r.system.clone(),
            r.mode,
            r.metric,
            r.size,
        )
    };
    let mut out: Vec<Row> = Vec::new();
    for row in rows {
        if out.iter().any(|o| key(o) == key(row)) {
            continue;
        }
        let group: Vec<&Row> = rows.iter().filter(|r| key(r) == key(row)).collect();
        let collect = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<f64> {
            group.iter().filter_map(|r| f(r)).collect()
        };
        let mut merged = row.clone();
        merged.median = median(&collect(&|r| Some(r.median))).unwrap_or(f64::NAN);
        merged.p99 = median(&collect(&|r| r.p99));
        merged.min = collect(&|r| r.min).into_iter().reduce(f64::min);
        merged.max = collect(&|r| r.max).into_iter().reduce(f64::max);
        merged.cpu_s_per_gb = median(&collect(&|r| r.cpu_s_per_gb));
        merged.kernel_s_per_gb = median(&collect(&|r| r.kernel_s_per_gb));
        merged.lost_pct = median(&collect(&|r| r.lost_pct));
        out.push(merged);
    }
    out
}

/// The network condition of a row (bridge rows: loss and rate; rows between namespaces:
/// their TCP congestion control), as text for keys and headings ("" on the host).
fn condition(r: &Row) -> String {
    let parts: [Option<String>; 3] = [
        r.loss_pct.map(|l| format!("loss {l}%")),
        r.rate.as_ref().map(|r| format!("rate {r}")),
        r.tcp_cc
            .as_ref()
            .map(|c| format!("TCP congestion control {c}")),
    ];
    parts.into_iter().flatten().collect::<Vec<_>>().join(", ")
}

/// Column key of the table: one system in one mode.
fn column_of(row: &Row) -> String {
    format!("{}/{}", row.system, row.mode)
}

fn columns(rows: &[Row], metric: Metric) -> Vec<String> {
    let mut cols: Vec<String> = Vec::new();
    for row in rows.iter().filter(|r| r.metric == metric) {
        let col = column_of(row);
        if !cols.contains(&col) {
            cols.push(col);
        }
    }
    cols
}

fn render_grid(rows: &[Row], metric: Metric, cell: impl Fn(&Row) -> String) -> String {
    let cols = columns(rows, metric);
    if cols.is_empty() {
        return String::new();
    }
    let mut sizes: Vec<usize> = rows
        .iter()
        .filter(|r| r.metric == metric)
        .map(|r| r.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut grid: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["size".to_string()];
    header.extend(cols.iter().cloned());
    grid.push(header);
    for size in sizes {
        let mut line = vec![human_size(size)];
        for col in &cols {
            let found = rows
                .iter()
                .find(|r| r.metric == metric && r.size == size && &column_of(r) == col);
            line.push(found.map(&cell).unwrap_or_else(|| "-".to_string()));
        }
        grid.push(line);
    }
    format_grid(&grid, "", |_, _| false)
}

/// Lays out `grid` (a header line first, every line as long) in columns two spaces apart,
/// each line after `indent`; cells right-aligned except where `left(column, columns)`.
pub fn format_grid(
    grid: &[Vec<String>],
    indent: &str,
    left: impl Fn(usize, usize) -> bool,
) -> String {
    let n = grid.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|i| grid.iter().map(|l| l[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in grid {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if left(i, n) {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out.push_str(indent);
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The n-half of every (system, mode) that has bandwidth rows, in column order.
pub fn n_halves(rows: &[Row]) -> Vec<(String, NHalf)> {
    columns(rows, Metric::BandwidthGbs)
        .into_iter()
        .filter_map(|col| {
            let pts: Vec<(usize, f64)> = rows
                .iter()
                .filter(|r| r.metric == Metric::BandwidthGbs && column_of(r) == col)
                .map(|r| (r.size, r.median))
                .collect();
            n_half(&pts).map(|nh| (col, nh))
        })
        .collect()
}

fn fmt_num(x: f64) -> String {
    if x < 0.1 {
        format!("{x:.4}")
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Heading of a placement group, `None` for the host.
fn group_heading(placement: &str, mtu: Option<u32>, condition: &str) -> Option<String> {
    if placement == HOST_PLACEMENT && mtu.is_none() {
        return None;
    }
    Some(match (placement, mtu) {
        (BRIDGE_PLACEMENT, Some(m)) => format!(
            "== placement bridge: server and client on two hosts one switch hop apart, MTU \
             {m}, {condition} =="
        ),
        (NETNS_PLACEMENT, Some(m)) => format!(
            "== placement netns: server and client in two network namespaces joined by a \
             veth pair, MTU {m}{}{condition} ==",
            if condition.is_empty() { "" } else { ", " }
        ),
        (p, Some(m)) => format!("== placement {p}, MTU {m} =="),
        (p, None) => format!("== placement {p} =="),
    })
}

/// The readable report: for each placement (and veth MTU) in first-seen order, the
/// latency table, bandwidth table, CPU-per-GB table, n-half and copies lines.
pub fn render_table(rows: &[Row]) -> String {
    let mut groups: Vec<(String, Option<u32>, String)> = Vec::new();
    for row in rows {
        let g = (row.placement.clone(), row.mtu, condition(row));
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let mut out = String::new();
    for (i, (placement, mtu, cond)) in groups.iter().enumerate() {
        let members: Vec<Row> = rows
            .iter()
            .filter(|r| &r.placement == placement && r.mtu == *mtu && &condition(r) == cond)
            .cloned()
            .collect();
        if i > 0 {
            out.push('\n');
        }
        if let Some(h) = group_heading(placement, *mtu, cond) {
            out.push_str(&h);
            out.push('\n');
        }
        out.push_str(&render_group(&members));
    }
    out
}

fn render_group(rows: &[Row]) -> String {
    let mut out = String::new();
    let lat = render_grid(rows, Metric::LatencyUs, |r| {
        let p99 = r.p99.map(fmt_num).unwrap_or_else(|| "-".to_string());
        format!("{} / {}", fmt_num(r.median), p99)
    });
    if !lat.is_empty() {
        out.push_str("One-way latency, microseconds (RTT/2): median / p99\n");
        out.push_str(&lat);
        out.push('\n');
    }
    let bw = render_grid(rows, Metric::BandwidthGbs, |r| fmt_num(r.median));
    if !bw.is_empty() {
        out.push_str("Streaming bandwidth, GB/s (1e9 B/s): median of repetitions\n");
        out.push_str(&bw);
        out.push('\n');
    }
    let with_cpu: Vec<Row> = rows
        .iter()
        .filter(|r| r.metric == Metric::BandwidthGbs && r.cpu_s_per_gb.is_some())
        .cloned()
        .collect();
    let cpu = render_grid(&with_cpu, Metric::BandwidthGbs, |r| {
        r.cpu_s_per_gb.map(fmt_num).unwrap_or_else(|| "-".into())
    });
    if !cpu.is_empty() {
        out.push_str(
            "CPU seconds per GB while streaming, client + server (busy mode spins on both \
             sides: ~2 / GB/s)\n",
        );
        out.push_str(&cpu);
        out.push('\n');
    }
    if with_cpu.iter().any(|r| r.kernel_s_per_gb.is_some()) {
        let kernel = render_grid(&with_cpu, Metric::BandwidthGbs, |r| {
            r.kernel_s_per_gb.map(fmt_num).unwrap_or_else(|| "-".into())
        });
        out.push_str("of which in the kernel (system time, softirq work included)\n");
        out.push_str(&kernel);
        out.push('\n');
    }
    let lossy: Vec<String> = rows
        .iter()
        .filter(|r| r.lost_pct.is_some_and(|l| l > 0.0))
        .map(|r| {
            format!(
                "  {} {} {}: {:.2}% of the bytes lost (bandwidth above is goodput)",
                column_of(r),
                human_size(r.size),
                r.transport,
                r.lost_pct.unwrap_or(0.0)
            )
        })
        .collect();
    if !lossy.is_empty() {
        out.push_str("loss (unreliable baselines):\n");
        for l in lossy {
            out.push_str(&l);
            out.push('\n');
        }
    }
    let halves = n_halves(rows);
    if !halves.is_empty() {
        out.push_str(
            "n-half (smallest measured size reaching half the peak; ~ = linear interpolation \
             between the neighbouring measured sizes):\n",
        );
        for (col, nh) in halves {
            let interp = match nh.interpolated_size {
                Some(s) => format!("~{:.1} KiB", s / 1024.0),
                None => "below the smallest measured size".to_string(),
            };
            out.push_str(&format!(
                "  {col:<16} peak {} GB/s, n-half {} measured, {interp}\n",
                fmt_num(nh.peak),
                human_size(nh.measured_size)
            ));
        }
    }
    let copies = copies_lines(rows);
    if !copies.is_empty() {
        out.push_str(
            "copies per byte (nominal: counted from each protocol's design, not measured; on one host the\n  rendezvous mix of CMA and pipeline is the receiver's actual choice):\n",
        );
        for c in copies {
            out.push_str(&format!("  {c}\n"));
        }
    }
    out
}

/// The "copies per byte" lines: per system and transport, the value by message size (it
/// changes where a protocol changes, e.g. eager to rendezvous), from that system's
/// bandwidth rows when it has any (the median where rounds or modes differ), consecutive
/// sizes with the same value merged: `clink (shm): 2.00 at 4K-16K; 1.06 at 256K-64M`.
fn copies_lines(rows: &[Row]) -> Vec<String> {
    let mut systems: Vec<(String, String)> = Vec::new();
    for r in rows {
        let key = (r.system.clone(), r.transport.clone());
        if !systems.contains(&key) {
            systems.push(key);
        }
    }
    let mut lines = Vec::new();
    for (system, transport) in systems {
        let mut mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.system == system && r.transport == transport)
            .collect();
        if mine.iter().any(|r| r.metric == Metric::BandwidthGbs) {
            mine.retain(|r| r.metric == Metric::BandwidthGbs);
        }
        let mut sizes: Vec<usize> = mine.iter().map(|r| r.size).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut runs: Vec<(String, usize, usize)> = Vec::new();
        for size in sizes {
            let vals: Vec<f64> = mine
                .iter()
                .filter(|r| r.size == size)
                .filter_map(|r| r.copies_per_byte)
                .collect();
            let Some(v) = median(&vals).map(fmt_num) else {
                continue;
            };
            match runs.last_mut() {
                Some((last, _, end)) if *last == v => *end = size,
                _ => runs.push((v, size, size)),
            }
        }
        if runs.is_empty() {
            let note = mine
                .iter()
                .find_map(|r| r.note.as_deref())
                .map(|n| format!("; {n}"))
                .unwrap_or_default();
            lines.push(format!("{system} n/a ({transport}{note})"));
            continue;
        }
        let runs: Vec<String> = runs
            .iter()
            .map(|(v, lo, hi)| {
                if lo == hi {
                    format!("{v} at {}", human_size(*lo))
                } else {
                    format!("{v} at {}-{}", human_size(*lo), human_size(*hi))
                }
            })
            .collect();
        lines.push(format!("{system} ({transport}): {}", runs.join("; ")));
    }
    lines
}

/// Rows for other modules' tests.
#[cfg(test)]
pub mod tests_support {
    use super::*;

    /// A bandwidth row of `system` over `transport`, placed on the host.
    pub fn bw_row(system: &str, transport: &str) -> Row {
        Row {
            copies_per_byte: Some(2.0),
            iterations: 1,
            ..Row::busy_host(system, transport, Metric::BandwidthGbs, 65536, 1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies per byte by size: runs of equal values merged, medians across modes, latency
    /// rows ignored when bandwidth rows exist, "n/a" with the system's note.
    #[test]
    fn copies_lines_by_size() {
        let bw = |system: &str, size: usize, c: Option<f64>, mode: Mode| Row {
            size,
            copies_per_byte: c,
            mode,
            note: c.is_none().then(|| "picks per size".to_string()),
            ..tests_support::bw_row(system, "shm")
        };
        let mut lat = lat_row();
        lat.system = "clink".into();
        lat.transport = "shm".into();
        lat.copies_per_byte = Some(7.0);
        let rows = vec![
            bw("clink", 4096, Some(2.0), Mode::Busy),
            bw("clink", 65536, Some(1.0), Mode::Busy),
            bw("clink", 65536, Some(1.0), Mode::Blocking),
            bw("clink", 65536, Some(2.0), Mode::Blocking),
            bw("clink", 1 << 20, Some(1.0), Mode::Busy),
            bw("ucx", 4096, None, Mode::Busy),
            lat,
        ];
        assert_eq!(
            copies_lines(&rows),
            [
                "clink (shm): 2.00 at 4K; 1.00 at 64K-1M",
                "ucx n/a (shm; picks per size)",
            ]
        );
    }

    fn lat_row() -> Row {
        Row {
            p99: Some(5.5),
            min: Some(3.9),
            max: Some(40.0),
            copies_per_byte: Some(2.0),
            iterations: 20000,
            pinned: true,
            ..Row::busy_host("tcp", "loopback", Metric::LatencyUs, 64, 4.06)
        }
    }

    #[test]
    fn json_has_required_fields_and_roundtrips() {
        let row = lat_row();
        let line = row.to_json();
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).expect("json");
        for key in [
            "system",
            "transport",
            "mode",
            "metric",
            "size",
            "median",
            "p99",
            "nominal_copies_per_byte",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["metric"], "latency_us");
        assert_eq!(v["mode"], "busy");
        assert_eq!(v["size"], 64);
        assert_eq!(Row::from_json(&line), Ok(row.clone()));
        // A row written when the key was `copies_per_byte` reads the same.
        let old = line.replace("nominal_copies_per_byte", "copies_per_byte");
        assert_eq!(Row::from_json(&old), Ok(row));
    }

    #[test]
    fn json_bandwidth_row_omits_p99_and_keeps_nulls() {
        let row = Row {
            system: "ucx".into(),
            transport: "shm".into(),
            metric: Metric::BandwidthGbs,
            size: 1 << 20,
            median: 7.69,
            p99: None,
            copies_per_byte: None,
            note: Some("UCX_TLS=sm".into()),
            ..lat_row()
        };
        let line = row.to_json();
        let v: Value = serde_json::from_str(&line).expect("json");
        assert!(v.get("p99").is_none());
        assert!(v["nominal_copies_per_byte"].is_null());
        assert_eq!(Row::from_json(&line), Ok(row));
    }

    #[test]
    fn json_nan_becomes_null_and_bad_lines_are_errors() {
        let row = Row {
            p99: Some(f64::NAN),
            ..lat_row()
        };
        let v: Value = serde_json::from_str(&row.to_json()).expect("json");
        assert!(v["p99"].is_null());
        assert!(Row::from_json("hello").is_err());
        assert!(Row::from_json("[1]").is_err());
        let err = Row::from_json(r#"{"system":"tcp"}"#).expect_err("incomplete");
        assert!(err.contains("lacks"), "{err}");
    }

    #[test]
    fn rounds_merge_to_medians() {
        let rows: Vec<Row> = [(4.0, 5.0), (1.0, 9.0), (2.0, 6.0)]
            .iter()
            .enumerate()
            .map(|(i, &(med, p99))| Row {
                median: med,
                p99: Some(p99),
                min: Some(med / 2.0),
                round: i as u64,
                ..lat_row()
            })
            .collect();
        let mut all = rows.clone();
        all.push(Row {
            size: 8,
            ..lat_row()
        });
        let merged = merge_rounds(&all);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].median, 2.0);
        assert_eq!(merged[0].p99, Some(6.0));
        assert_eq!(merged[0].min, Some(0.5));
        assert_eq!(merged[0].max, Some(40.0));
        assert_eq!(merged[1].size, 8);
    }

    #[test]
    fn table_lists_sizes_columns_and_nhalf() {
        let mut rows = vec![lat_row()];
        for (size, bw) in [(4096, 1.0), (16384, 3.0), (65536, 4.0)] {
            rows.push(Row {
                metric: Metric::BandwidthGbs,
                size,
                median: bw,
                p99: None,
                ..lat_row()
            });
        }
        let text = render_table(&rows);
        assert!(text.contains("tcp/busy"), "{text}");
        assert!(text.contains("4.06 / 5.50"), "{text}");
        assert!(text.contains("16K"), "{text}");
        assert!(text.contains("n-half 16K measured"), "{text}");
        assert!(text.contains("tcp (loopback): 2.00 at 4K-64K"), "{text}");
        assert!(!text.contains("CPU seconds"), "{text}");
        assert!(!text.contains("placement"), "{text}");
    }

    #[test]
    fn new_fields_roundtrip_and_old_rows_parse() {
        let row = Row {
            system: "udp".into(),
            transport: "veth".into(),
            metric: Metric::BandwidthGbs,
            size: 65536,
            median: 1.5,
            p99: None,
            placement: NETNS_PLACEMENT.into(),
            mtu: Some(9000),
            cpu_s_per_gb: Some(0.42),
            kernel_s_per_gb: Some(0.25),
            lost_pct: Some(0.5),
            ..lat_row()
        };
        let line = row.to_json();
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["placement"], "netns");
        assert_eq!(v["mtu"], 9000);
        assert_eq!(v["cpu_s_per_gb"], 0.42);
        assert_eq!(v["kernel_s_per_gb"], 0.25);
        assert_eq!(Row::from_json(&line), Ok(row));
        // A host latency row has no mtu / cpu / loss fields; an old row has no placement.
        let v: Value = serde_json::from_str(&lat_row().to_json()).expect("json");
        assert_eq!(v["placement"], "host");
        assert!(v.get("mtu").is_none() && v.get("cpu_s_per_gb").is_none());
        let mut old: Map<String, Value> = match v {
            Value::Object(o) => o,
            _ => unreachable!(),
        };
        old.remove("placement");
        let parsed = Row::from_json(&Value::Object(old).to_string()).expect("old row");
        assert_eq!(parsed.placement, HOST_PLACEMENT);
    }

    #[test]
    fn table_groups_placements_and_shows_cpu() {
        let bw = |placement: &str, mtu, system: &str, cpu| Row {
            system: system.into(),
            metric: Metric::BandwidthGbs,
            size: 65536,
            median: 2.0,
            p99: None,
            placement: placement.into(),
            mtu,
            cpu_s_per_gb: cpu,
            kernel_s_per_gb: cpu.map(|c| c / 2.0),
            ..lat_row()
        };
        let rows = vec![
            bw(HOST_PLACEMENT, None, "tcp", Some(0.9)),
            bw(NETNS_PLACEMENT, Some(1500), "udp", Some(0.8)),
            bw(NETNS_PLACEMENT, Some(9000), "udp", Some(0.7)),
            bw(NETNS_PLACEMENT, Some(9000), "ucx", None),
        ];
        let text = render_table(&rows);
        assert!(text.contains("MTU 1500"), "{text}");
        assert!(text.contains("MTU 9000"), "{text}");
        assert!(text.contains("CPU seconds per GB"), "{text}");
        assert!(text.contains("0.70"), "{text}");
        assert!(text.contains("of which in the kernel"), "{text}");
        assert!(text.contains("0.35"), "{text}");
        assert_eq!(merge_rounds(&rows).len(), 4);
    }
}
