//! libfabric as an external baseline, measured with its own `fi_pingpong` (Debian's
//! `libfabric-bin`; fabtests' streaming tests are not packaged there).
//!
//! Two systems, each one libfabric provider per placement:
//! - `libfabric`: shared memory (`-p shm -e rdm`) on the host; the `tcp` provider's
//!   connected endpoints (`-p tcp -e msg`) between namespaces (UCX over tcp's analogue);
//! - `libfabric-rxd`: reliable datagrams over UDP (`-p udp -e rdm`, the `ofi_rxd` utility
//!   provider over the `udp` core provider), the design closest to clink-udp.
//!
//! For every latency size a server (pinned to the server CPU; in namespace 0 with
//! `--placement netns`) and a client (`fi_pingpong -p P -e E -I ITERS -S SIZE -P PORT
//! SERVER_IP`, pinned to the client CPU; in namespace 1) run on a free control port; both
//! get the same `-I` and `-S` (the server does not learn them from the client).
//! `fi_pingpong` busy-polls its completion queue and prints the mean one-way time of its
//! ping-pong (`usec/xfer`: the run's time / 2 / iterations) and no percentile, so the
//! `median` of these rows is that mean (the note says so) and `p99` is null. It has no
//! streaming test, so there are no bandwidth rows: its `MB/sec` keeps one message in
//! flight, not comparable with the harness's streaming bandwidth.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clink_testbed::NetnsPair;

use super::external;
use super::plan::Plan;
use super::report::{Metric, Row};

/// Name of the program looked up in `PATH`.
pub const PINGPONG: &str = "fi_pingpong";
/// The system over libfabric's shared-memory (host) or tcp (netns) provider.
pub const LIBFABRIC: &str = "libfabric";
/// The system over libfabric's reliable datagrams on UDP (`ofi_rxd`).
pub const LIBFABRIC_RXD: &str = "libfabric-rxd";
/// Bound on one client + server pair.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Full path of `fi_pingpong` if it is in `PATH`.
pub fn find_pingpong() -> Option<PathBuf> {
    external::find_in_path(PINGPONG)
}

/// The provider and endpoint type `system` uses in the placement (`netns`: between
/// namespaces), or `None` when `system` is not a libfabric system.
pub fn provider(system: &str, netns: bool) -> Option<(&'static str, &'static str)> {
    match (system, netns) {
        (LIBFABRIC, false) => Some(("shm", "rdm")),
        (LIBFABRIC, true) => Some(("tcp", "msg")),
        (LIBFABRIC_RXD, _) => Some(("udp", "rdm")),
        _ => None,
    }
}

/// Parses `fi_pingpong` client output: the `usec/xfer` column of the data line under the
/// header line that names it.
pub fn parse_usec_per_xfer(text: &str) -> Result<f64, String> {
    let mut column = None;
    let mut found = None;
    for line in text.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = tokens.iter().position(|&t| t == "usec/xfer") {
            column = Some((i, tokens.len()));
            continue;
        }
        let Some((i, n)) = column else { continue };
        if tokens.len() == n {
            if let Ok(v) = tokens[i].parse::<f64>() {
                found = Some(v);
            }
        }
    }
    found.filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| {
        let excerpt: String = text.chars().take(600).collect();
        format!("no usec/xfer figure in {PINGPONG} output:\n{excerpt}")
    })
}

/// One ping-pong to run.
struct Test<'a> {
    exe: &'a Path,
    provider: &'a str,
    ep_type: &'a str,
    size: usize,
    iters: usize,
    pinned: bool,
    /// Namespaces to run server (0) and client (1) in; `None` = on the host.
    net: Option<&'a NetnsPair>,
}

/// Runs one ping-pong: the mean one-way time in microseconds.
fn run_test(t: &Test<'_>) -> Result<f64, String> {
    let port_num = external::free_port()?;
    let port = port_num.to_string();
    let server_ip = t.net.map_or(Ipv4Addr::LOCALHOST, |n| n.addr(0)).to_string();
    let cmd = |server: bool| {
        let mut c = external::command(t.net, usize::from(!server), t.exe);
        c.args(["-p", t.provider, "-e", t.ep_type]);
        c.args(["-I", &t.iters.to_string(), "-S", &t.size.to_string()]);
        if server {
            c.args(["-B", &port]);
        } else {
            c.args(["-P", &port, &server_ip]);
        }
        c
    };
    let (out, _) = external::run_server_client(
        PINGPONG,
        cmd(true),
        cmd(false),
        port_num,
        t.pinned,
        TEST_TIMEOUT,
    )?;
    parse_usec_per_xfer(&out).map_err(|e| format!("size {}: {e}", t.size))
}

/// Runs `system`'s ping-pongs for the plan's latency sizes, on the host or (with `net`)
/// between the two namespaces. Returns the rows and a note naming the provider.
pub fn run(
    exe: &Path,
    system: &str,
    plan: &Plan,
    pinned: bool,
    net: Option<&NetnsPair>,
) -> Result<(Vec<Row>, String), String> {
    let (provider, ep_type) =
        provider(system, net.is_some()).ok_or_else(|| format!("{system} is not libfabric"))?;
    let note = format!("fi_pingpong -p {provider} -e {ep_type}; mean one-way time, no percentile");
    let mut rows = Vec::new();
    for &size in &plan.lat_sizes {
        // A first guess of 10 us a hop plus 5 GB/s, for the iteration count only.
        let per_iter_us = 2.0 * (10.0 + size as f64 / 5e3);
        let iters = ((plan.lat_time.as_secs_f64() * 1e6 / per_iter_us) as usize)
            .clamp(plan.lat_min_iters, plan.lat_max_iters);
        let us = run_test(&Test {
            exe,
            provider,
            ep_type,
            size,
            iters,
            pinned,
            net,
        })?;
        rows.push(Row {
            iterations: iters as u64,
            pinned,
            note: Some(note.clone()),
            ..Row::busy_host(system, provider, Metric::LatencyUs, size, us)
        });
    }
    Ok((rows, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from `fi_pingpong -p tcp -e msg -I 20000 -S 64 -P 47600 10.77.0.1`
    /// (libfabric 1.17).
    const SAMPLE: &str = "\
bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
64      20k     =20k     2.4m        0.26s      9.98       6.41       0.16
";

    #[test]
    fn parses_the_usec_per_xfer_column() {
        assert_eq!(parse_usec_per_xfer(SAMPLE), Ok(6.41));
    }

    #[test]
    fn output_without_a_figure_is_a_clear_error() {
        let err = parse_usec_per_xfer("ctrl/read(): util/pingpong.c:563 , ret=-104\n")
            .expect_err("no figure");
        assert!(err.contains("no usec/xfer figure"), "{err}");
        assert!(err.contains("ret=-104"), "{err}");
        // A header with no data line, or a data line that is cut short.
        let cut = "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec\n64 20k =20k\n";
        assert!(parse_usec_per_xfer(cut).is_err());
        assert!(parse_usec_per_xfer("").is_err());
    }

    #[test]
    fn each_system_has_a_provider_in_each_placement() {
        assert_eq!(provider(LIBFABRIC, false), Some(("shm", "rdm")));
        assert_eq!(provider(LIBFABRIC, true), Some(("tcp", "msg")));
        assert_eq!(provider(LIBFABRIC_RXD, true), Some(("udp", "rdm")));
        assert_eq!(provider("ucx", true), None);
    }
}
