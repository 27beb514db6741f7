//! UCX as an external baseline, measured with its own `ucx_perftest` tool.
//!
//! For every size a fresh `ucx_perftest` server (pinned to the server CPU) and
//! client (`ucx_perftest 127.0.0.1 -t tag_lat|tag_bw -s SIZE -n ITERS -w WARM
//! -f`, pinned to the client CPU) run on a free TCP port; the client's final
//! line is parsed. `ucx_perftest` reports one-way latency (its ping-pong time /
//! 2) with a percentile column (`-R`, default 50 = median, reported as
//! `median`) and bandwidth in MiB/s (converted here to GB/s = 1e9 B/s). It has
//! no p99 in the same run, so `p99` is null. It only busy-polls, so it runs in
//! busy mode only. Bandwidth rows carry `cpu_s_per_gb`, both processes together, from
//! their resource usage when reaped (`wait4`), less that of the same test run with one
//! iteration (start-up and connection set-up; [`bw_cpu_s_per_gb`]).
//!
//! Copies per byte depend on the protocol UCX picks per size (eager through a
//! shared-memory FIFO: 2; rendezvous through CMA: 1), which it does not print,
//! so `copies_per_byte` is null with a note.
//!
//! With `--placement netns` the server runs in namespace 0 and the client in
//! namespace 1 (`ip netns exec`, which execs `ucx_perftest`, so pinning and
//! PIDs are unchanged), the client connects to namespace 0's veth address, and
//! `UCX_TLS=tcp` is the only setting tried (shared memory cannot cross hosts).
//! Whether the server listens is read from `/proc/<server pid>/net/tcp`, which
//! shows the server's own namespace.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clink_testbed::NetnsPair;

use super::external;
use super::plan::Plan;
use super::report::{Metric, Row};

/// Name of the program looked up in `PATH`.
pub const PERFTEST: &str = "ucx_perftest";
/// `UCX_TLS` values tried in order; `None` = UCX's own choice.
const TLS_CANDIDATES: [Option<&str>; 3] = [Some("sm"), Some("posix,cma"), None];
/// `UCX_TLS` between two network namespaces.
const NETNS_TLS: [Option<&str>; 1] = [Some("tcp")];
/// Bound on one `ucx_perftest` client + server pair.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Copy note attached to every UCX row.
const COPIES_NOTE: &str = "UCX picks per size: eager via shm FIFO = 2, rendezvous via CMA = 1";
/// Copy note attached to UCX rows between namespaces.
const NETNS_COPIES_NOTE: &str = "UCX over kernel TCP sockets on the veth pair";

/// The final numbers of one `ucx_perftest` run.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfResult {
    /// Iterations measured.
    pub iterations: f64,
    /// Latency at the requested percentile (`-R`, default 50), microseconds.
    pub lat_percentile_us: f64,
    /// Average latency of the last reporting interval, microseconds.
    pub lat_avg_us: f64,
    /// Average latency over the whole run, microseconds.
    pub lat_overall_us: f64,
    /// Bandwidth of the last reporting interval, MiB/s.
    pub bw_avg_mibs: f64,
    /// Bandwidth over the whole run, MiB/s.
    pub bw_overall_mibs: f64,
    /// Message rate over the whole run, messages/s.
    pub msgrate_overall: f64,
}

impl PerfResult {
    /// Overall bandwidth in GB/s (1e9 bytes per second).
    pub fn bandwidth_gbs(&self) -> f64 {
        self.bw_overall_mibs * 1024.0 * 1024.0 / 1e9
    }
}

/// Parses `ucx_perftest` client output (plain, `-f`, or the `Final:` line of
/// the progress table): the last line made of 8 numbers, optionally preceded
/// by `Final:` or a test name.
pub fn parse_output(text: &str) -> Result<PerfResult, String> {
    let mut found = None;
    for line in text.lines() {
        let mut tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.first() == Some(&"Final:") || tokens.len() == 9 {
            tokens.remove(0);
        }
        if tokens.len() != 8 {
            continue;
        }
        let nums: Result<Vec<f64>, _> = tokens.iter().map(|t| t.parse::<f64>()).collect();
        if let Ok(n) = nums {
            found = Some(PerfResult {
                iterations: n[0],
                lat_percentile_us: n[1],
                lat_avg_us: n[2],
                lat_overall_us: n[3],
                bw_avg_mibs: n[4],
                bw_overall_mibs: n[5],
                msgrate_overall: n[7],
            });
        }
    }
    found.ok_or_else(|| {
        let excerpt: String = text.chars().take(600).collect();
        format!("no result line (8 numbers) in {PERFTEST} output:\n{excerpt}")
    })
}

/// Full path of `ucx_perftest` if it is in `PATH`.
pub fn find_perftest() -> Option<PathBuf> {
    external::find_in_path(PERFTEST)
}

/// One UCX test to run.
struct Test<'a> {
    exe: &'a Path,
    tls: Option<&'a str>,
    name: &'a str,
    size: usize,
    iters: usize,
    warmup: usize,
    pinned: bool,
    /// Namespaces to run server (0) and client (1) in; `None` = on the host.
    net: Option<&'a NetnsPair>,
}

/// Runs one test: its final numbers and the CPU seconds both processes used in all
/// (setup and warm-up included; `None` if either was not reaped normally).
fn run_test(t: &Test<'_>) -> Result<(PerfResult, Option<f64>), String> {
    let port_num = external::free_port()?;
    let port = port_num.to_string();
    let server_ip = t.net.map_or(Ipv4Addr::LOCALHOST, |n| n.addr(0)).to_string();
    let cmd = |server: bool| {
        let mut c = external::command(t.net, usize::from(!server), t.exe);
        if let Some(tls) = t.tls {
            c.env("UCX_TLS", tls);
        }
        if !server {
            c.arg(&server_ip);
            c.args(["-t", t.name, "-s", &t.size.to_string()]);
            c.args(["-n", &t.iters.to_string(), "-w", &t.warmup.to_string()]);
            c.arg("-f");
        }
        c.args(["-p", &port]);
        c
    };
    let (out, cpu) = external::run_server_client(
        PERFTEST,
        cmd(true),
        cmd(false),
        port_num,
        t.pinned,
        TEST_TIMEOUT,
    )?;
    let r = parse_output(&out).map_err(|e| format!("{} size {}: {e}", t.name, t.size))?;
    Ok((r, cpu))
}

/// CPU seconds per GB of a `tag_bw` test, both processes together: `ucx_perftest` cannot
/// be timed from inside, so the CPU of the same test with one iteration and one warm-up
/// (`base`: start-up, connection set-up, the server's wait for its client, tear-down)
/// is taken off the full run's, and the rest divided by the bytes of the other
/// iterations. `None` if a figure is missing or the difference is not positive.
fn bw_cpu_s_per_gb(
    full: Option<f64>,
    base: Option<f64>,
    messages: usize,
    size: usize,
) -> Option<f64> {
    let (full, base) = (full?, base?);
    let bytes = messages.checked_sub(2)? as f64 * size as f64;
    (full > base && bytes > 0.0).then(|| (full - base) / (bytes / 1e9))
}

/// Estimated one-way time of a `size`-byte message (for iteration counts only).
fn estimate_us(size: usize) -> f64 {
    0.5 + size as f64 / 5e3
}

/// Runs UCX tag_lat / tag_bw for the plan's sizes, on the host or (with `net`)
/// between the two namespaces. Returns the rows and a note saying which
/// `UCX_TLS` was used, or an error if no setting worked.
pub fn run(
    exe: &Path,
    plan: &Plan,
    pinned: bool,
    net: Option<&NetnsPair>,
) -> Result<(Vec<Row>, String), String> {
    let mut test = Test {
        exe,
        tls: None,
        name: "tag_lat",
        size: 8,
        iters: 1000,
        warmup: 100,
        pinned,
        net,
    };
    let mut tried = Vec::new();
    let mut chosen = None;
    let candidates: &[Option<&str>] = if net.is_some() {
        &NETNS_TLS
    } else {
        &TLS_CANDIDATES
    };
    for &tls in candidates {
        test.tls = tls;
        match run_test(&test) {
            Ok(_) => {
                chosen = Some(tls);
                break;
            }
            Err(e) => tried.push(format!("UCX_TLS={}: {e}", tls.unwrap_or("(unset)"))),
        }
    }
    let tls = chosen.ok_or_else(|| format!("no UCX_TLS setting worked:\n{}", tried.join("\n")))?;
    let tls_note = format!("UCX_TLS={}", tls.unwrap_or("(unset)"));
    let (transport, copies_note) = match (net, tls) {
        (Some(_), _) => ("veth", NETNS_COPIES_NOTE),
        (None, Some(_)) => ("shm", COPIES_NOTE),
        (None, None) => ("ucx-auto", COPIES_NOTE),
    };
    let row = |metric, size, median, iters: usize| Row {
        iterations: iters as u64,
        pinned,
        note: Some(format!("{tls_note}; {copies_note}")),
        ..Row::busy_host("ucx", transport, metric, size, median)
    };
    let mut rows = Vec::new();
    for &size in &plan.lat_sizes {
        let per_iter = estimate_us(size) * 2.0;
        let iters = ((plan.lat_time.as_secs_f64() * 1e6 / per_iter) as usize)
            .clamp(plan.lat_min_iters, plan.lat_max_iters);
        test.name = "tag_lat";
        test.size = size;
        test.iters = iters;
        test.warmup = (iters / 10).max(10);
        let (r, _) = run_test(&test)?;
        rows.push(row(Metric::LatencyUs, size, r.lat_percentile_us, iters));
    }
    for &size in &plan.bw_sizes {
        let total = plan.bw_rep_time.as_secs_f64() * plan.bw_reps as f64;
        let iters = ((total * 1e6 / estimate_us(size)) as usize).clamp(4, 1_000_000);
        test.name = "tag_bw";
        test.size = size;
        test.iters = iters;
        test.warmup = (iters / 10).max(1);
        let (r, cpu) = run_test(&test)?;
        let (_, base) = run_test(&Test {
            iters: 1,
            warmup: 1,
            ..test
        })?;
        rows.push(Row {
            cpu_s_per_gb: bw_cpu_s_per_gb(cpu, base, iters + test.warmup, size),
            ..row(Metric::BandwidthGbs, size, r.bandwidth_gbs(), iters)
        });
    }
    Ok((rows, tls_note))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from `ucx_perftest 127.0.0.1 -t tag_lat -s 64 -n 20000 -w 2000`
    /// (UCX 1.13.1, UCX_TLS=posix,cma,self).
    const LAT_SAMPLE: &str = "\
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |        latency (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                 20000      0.568     0.681     0.681       89.57      89.57     1467566     1467566
";

    /// Captured from `ucx_perftest 127.0.0.1 -t tag_bw -s 1048576 -n 2000 -w 200 -f`.
    const BW_SAMPLE: &str = "\
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |       overhead (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|     Test     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
                        2000    125.756   130.034   130.034     7690.30    7690.30        7690        7690
";

    #[test]
    fn parses_latency_final_line() {
        let r = parse_output(LAT_SAMPLE).expect("parse");
        assert_eq!(r.iterations, 20000.0);
        assert_eq!(r.lat_percentile_us, 0.568);
        assert_eq!(r.lat_overall_us, 0.681);
        assert_eq!(r.msgrate_overall, 1467566.0);
    }

    #[test]
    fn parses_bandwidth_final_only_line() {
        let r = parse_output(BW_SAMPLE).expect("parse");
        assert_eq!(r.bw_overall_mibs, 7690.30);
        assert!((r.bandwidth_gbs() - 7690.30 * 1048576.0 / 1e9).abs() < 1e-9);
        assert!((r.bandwidth_gbs() - 8.064).abs() < 0.001);
    }

    #[test]
    fn bandwidth_cpu_takes_the_set_up_run_off() {
        // 1.25 s for 1 002 messages of 1 MiB, 0.2 s for the two of the set-up run:
        // 1.05 s per 1 000 MiB.
        let g = bw_cpu_s_per_gb(Some(1.25), Some(0.2), 1002, 1 << 20).expect("figure");
        assert!((g - 1.05 / 1.048576).abs() < 1e-9, "{g}");
        assert_eq!(bw_cpu_s_per_gb(None, Some(0.2), 1002, 1 << 20), None);
        assert_eq!(bw_cpu_s_per_gb(Some(0.2), Some(0.3), 1002, 1 << 20), None);
        assert_eq!(bw_cpu_s_per_gb(Some(1.0), Some(0.1), 2, 1 << 20), None);
    }

    #[test]
    fn parse_errors_are_clear() {
        let err = parse_output("[1700000000.1] ERROR: connection refused\n").expect_err("err");
        assert!(err.contains("no result line"), "{err}");
        assert!(err.contains("connection refused"), "{err}");
        assert!(parse_output("").is_err());
    }

    #[test]
    fn listening_port_detected() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1065 1\n   1: 0100007F:3419 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1066 1\n";
        assert!(external::is_listening(text, 0x07E8));
        assert!(
            !external::is_listening(text, 0x3419),
            "established, not listening"
        );
        assert!(!external::is_listening(text, 1234));
    }
}
