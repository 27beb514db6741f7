//! End-to-end: `clink bench --quick --json` for clink and the kernel sockets, two
//! processes per system, on the host, between two network namespaces and between two
//! hosts on a bridge with loss; the aperture
//! experiments (`--rma`) and the speculation experiments (`--spec`, between namespaces).

use std::process::Command;

/// Runs `cmd` (`what`: what it runs, should it not start), which must succeed (else the
/// test fails with `failed` and its stderr): its stdout and stderr.
fn succeed(cmd: &mut Command, what: &str, failed: &str) -> (String, String) {
    let out = cmd.output().expect(what);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{failed}: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// The JSON rows a `--json` run printed on stdout (every line must be one).
fn json_rows(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stdout line is JSON"))
        .collect()
}

/// The namespaces a run named on stderr ("network namespaces A (...) and B (...)"): there
/// must be `n`, and none may be left.
fn assert_namespaces_removed(stderr: &str, n: usize) {
    let made: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("network namespaces "))
        .flat_map(|l| l.split_whitespace())
        .filter(|w| w.starts_with(clink_testbed::NAME_PREFIX))
        .collect();
    assert_eq!(made.len(), n, "{stderr}");
    let list = Command::new(clink_testbed::ip_binary().expect("ip"))
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let list = String::from_utf8_lossy(&list.stdout);
    for ns in made {
        assert!(!list.contains(ns), "{ns} left behind: {list}");
    }
}

#[test]
fn quick_json_run_over_sockets() {
    let (stdout, stderr) = succeed(
        Command::new(env!("CARGO_BIN_EXE_clink"))
            .args(["bench", "--quick", "--json", "--systems", "tcp,unix,clink"])
            .args([
                "--lat-sizes",
                "0,64",
                "--bw-sizes",
                "64K",
                "--timeout-secs",
                "60",
            ]),
        "run clink bench",
        "clink bench failed",
    );
    // Rows say they were pinned exactly when the header says so.
    let pinned = stderr.contains("server pinned to CPU 0");
    assert!(pinned || stderr.contains("NOT pinned"), "{stderr}");
    let rows = json_rows(&stdout);
    // 3 systems x 2 modes x (2 latency + 1 bandwidth) rows.
    assert_eq!(rows.len(), 18, "{stdout}");
    for sys in ["tcp", "unix", "clink"] {
        assert_eq!(
            rows.iter().filter(|r| r["system"] == sys).count(),
            6,
            "{sys}: {stdout}"
        );
    }
    for row in &rows {
        for key in [
            "system",
            "transport",
            "mode",
            "metric",
            "size",
            "median",
            "nominal_copies_per_byte",
        ] {
            assert!(row.get(key).is_some(), "missing {key} in {row}");
        }
        assert!(row["median"].as_f64().is_some_and(|m| m > 0.0), "{row}");
        if row["metric"] == "latency_us" {
            assert!(row["p99"].as_f64().is_some(), "{row}");
        }
        assert_eq!(row["placement"], "host", "{row}");
        assert_eq!(row["pinned"], pinned, "{row}");
        if row["metric"] == "bandwidth_gbs" {
            assert!(
                row["cpu_s_per_gb"].as_f64().is_some_and(|c| c > 0.0),
                "{row}"
            );
        }
        // Kernel sockets copy twice; clink's eager and pipelined paths too (CMA: once).
        let copies = row["nominal_copies_per_byte"].as_f64().unwrap_or(-1.0);
        assert!(
            copies == 2.0 || (row["system"] == "clink" && copies == 1.0),
            "{row}"
        );
    }
}

/// `--mode spin` (each system's default waiting) on one CPU: both sides inherit this
/// test's mask when it is narrowed to one CPU with `taskset`, and `--no-pin` keeps it.
#[test]
fn quick_spin_run_on_one_cpu() {
    let (stdout, stderr) = succeed(
        Command::new("taskset")
            .args(["-c", "0", env!("CARGO_BIN_EXE_clink")])
            .args(["bench", "--quick", "--json", "--no-pin", "--mode", "spin"])
            .args([
                "--systems",
                "unix,clink",
                "--lat-sizes",
                "8",
                "--bw-sizes",
                "64K",
            ])
            .args(["--timeout-secs", "60"]),
        "run taskset (util-linux) and clink bench",
        "clink bench failed",
    );
    assert!(stderr.contains("NOT pinned (--no-pin)"), "{stderr}");
    let rows = json_rows(&stdout);
    // 2 systems x (1 latency + 1 bandwidth) rows, all in spin mode.
    assert_eq!(rows.len(), 4, "{stdout}");
    for row in &rows {
        assert_eq!(row["mode"], "spin", "{row}");
        let m = row["median"].as_f64().expect("median");
        assert!(m.is_finite() && m > 0.0, "{row}");
    }
}

#[test]
fn quick_netns_run_over_tcp_and_udp() {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
    let (stdout, stderr) = succeed(
        Command::new(env!("CARGO_BIN_EXE_clink"))
            .args(["bench", "--placement", "netns", "--quick", "--json"])
            .args([
                "--systems",
                "tcp,udp,clink-tcp",
                "--lat-sizes",
                "0,64",
                "--bw-sizes",
                "64K",
            ])
            .args(["--timeout-secs", "60"]),
        "run clink bench",
        "clink bench failed",
    );
    assert!(stderr.contains("placement netns"), "{stderr}");
    let rows = json_rows(&stdout);
    // 2 MTUs (default 1500, 9000) x 3 systems x 2 modes x (2 latency + 1 bandwidth).
    assert_eq!(rows.len(), 36, "{stdout}");
    for mtu in [1500, 9000] {
        for sys in ["tcp", "udp", "clink-tcp"] {
            let n = rows
                .iter()
                .filter(|r| r["system"] == sys && r["mtu"] == mtu)
                .count();
            assert_eq!(n, 6, "{sys} MTU {mtu}: {stdout}");
        }
    }
    for row in &rows {
        assert_eq!(row["placement"], "netns", "{row}");
        assert!(row["median"].as_f64().is_some_and(|m| m > 0.0), "{row}");
        let copies = row["nominal_copies_per_byte"].as_f64();
        if row["system"] == "clink-tcp" {
            // clink over TCP: eager 3 user-space copies + the kernel's 2, rendezvous 2.
            assert_eq!(row["transport"], "tcp", "{row}");
            assert!(copies == Some(5.0) || copies == Some(2.0), "{row}");
        } else {
            assert_eq!(row["transport"], "veth", "{row}");
            assert_eq!(copies, Some(2.0), "{row}");
        }
        if row["metric"] == "bandwidth_gbs" {
            assert!(
                row["cpu_s_per_gb"].as_f64().is_some_and(|c| c > 0.0),
                "{row}"
            );
            if row["system"] == "udp" {
                let lost = row["lost_pct"]
                    .as_f64()
                    .expect("udp rows say what was lost");
                assert!((0.0..100.0).contains(&lost), "{row}");
            }
        }
    }
    // The namespaces this run made (named on stderr) are gone.
    assert_namespaces_removed(&stderr, 4);
}

#[test]
fn quick_rma_run_with_the_event_server() {
    let (stdout, _) = succeed(
        Command::new(env!("CARGO_BIN_EXE_clink"))
            .args(["bench", "--rma", "--quick", "--json"])
            .args(["--experiments", "word_rtt,event_server", "--conns", "1,3"]),
        "run clink bench --rma",
        "clink bench --rma failed",
    );
    let rows = json_rows(&stdout);
    let of = |e: &str| rows.iter().filter(|r| r["experiment"] == e).count();
    assert_eq!(
        of("word_rtt"),
        4,
        "tagged, mapped_spin, put_tripwire, put_progress: {stdout}"
    );
    // tcp and clink at N = 1 and 3, clink-direct at N = 1; three rows each.
    assert_eq!(of("event_server"), 15, "{stdout}");
    for r in &rows {
        assert!(r["median"].as_f64().is_some_and(|m| m > 0.0), "{r}");
        if r["experiment"] == "event_server" {
            assert!(r["endpoints"] == 1 || r["endpoints"] == 3, "{r}");
            assert_eq!(r["p99"].is_null(), r["variant"] == "rate", "{r}");
        }
    }
}

#[test]
fn quick_bridge_run_with_loss() {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
    let (stdout, stderr) = succeed(
        Command::new(env!("CARGO_BIN_EXE_clink"))
            .args(["bench", "--placement", "bridge", "--quick", "--json"])
            .args(["--systems", "tcp,clink", "--mode", "busy"])
            .args(["--lat-sizes", "64", "--bw-sizes", "64K", "--loss", "0,2"])
            .args(["--timeout-secs", "60"]),
        "run clink bench",
        "clink bench failed",
    );
    assert!(stderr.contains("placement bridge"), "{stderr}");
    let rows = json_rows(&stdout);
    // 2 losses x 2 systems x (1 latency + 1 bandwidth).
    assert_eq!(rows.len(), 8, "{stdout}");
    for loss in [0.0, 2.0] {
        for sys in ["tcp", "clink-udp"] {
            let n = rows
                .iter()
                .filter(|r| r["system"] == sys && r["loss_pct"].as_f64() == Some(loss))
                .count();
            assert_eq!(n, 2, "{sys} at {loss}%: {stdout}");
        }
    }
    for row in &rows {
        assert_eq!(row["placement"], "bridge", "{row}");
        assert_eq!(row["mtu"], 1500, "{row}");
        assert!(row["median"].as_f64().is_some_and(|m| m > 0.0), "{row}");
    }
    assert_namespaces_removed(&stderr, 4);
}

#[test]
fn quick_spec_run_between_namespaces() {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
    let (stdout, stderr) = succeed(
        Command::new(env!("CARGO_BIN_EXE_clink"))
            .args([
                "bench",
                "--placement",
                "netns",
                "--spec",
                "--quick",
                "--json",
            ])
            .args(["--fragments", "2000", "--timeout-secs", "60"]),
        "run clink bench --spec",
        "clink bench --spec failed",
    );
    let rows = json_rows(&stdout);
    let expected = [
        ("interference", "clean"),
        ("interference", "interfere_100"),
        ("interference", "interfere_10000"),
        ("interference", "interfere_10000_shared"),
        ("interference", "interfere_10000_steered"),
        ("fallback", "normal"),
        ("fallback", "speculate_off"),
        ("fallback", "forced_miss"),
        ("fallback", "forced_miss_raw"),
        ("two_senders", "one_sender"),
        ("two_senders", "admission_off"),
        ("two_senders", "admission"),
        ("two_senders", "steered"),
        ("loss", "loss_0"),
        ("loss", "loss_0.1"),
        ("loss", "loss_1"),
        ("loss", "loss_5"),
    ];
    let find = |exp: &str, var: &str, metric: &str| {
        let of: Vec<&serde_json::Value> = rows
            .iter()
            .filter(|r| r["experiment"] == exp && r["variant"] == var && r["metric"] == metric)
            .collect();
        assert_eq!(of.len(), 1, "{exp}/{var} {metric}: {stdout}");
        of[0].clone()
    };
    for (exp, var) in expected {
        let bw = find(exp, var, "bandwidth_gbs");
        assert!(bw["median"].as_f64().is_some_and(|m| m > 0.0), "{bw}");
        assert!(bw["cpu_s_per_gb"].as_f64().is_some_and(|c| c > 0.0), "{bw}");
        let hit = find(exp, var, "hit_rate");
        let rate = hit["median"].as_f64().expect("a hit rate");
        assert!((0.0..=1.0).contains(&rate), "{hit}");
        for row in [&bw, &hit] {
            for key in [
                "system",
                "transport",
                "mode",
                "size",
                "round",
                "mtu",
                "senders",
            ] {
                assert!(row.get(key).is_some(), "missing {key} in {row}");
            }
            assert_eq!(row["system"], "clink-udp", "{row}");
            assert_eq!(row["placement"], "netns", "{row}");
            assert_eq!(row["mtu"], 1500, "{row}");
            // Every message of every run compared equal to what was sent.
            assert_eq!(row["verified"], true, "{row}");
        }
    }
    // The variants do what they say.
    assert_eq!(find("fallback", "speculate_off", "hit_rate")["median"], 0.0);
    let forced = find("fallback", "forced_miss", "hit_rate");
    assert!(
        forced["median"].as_f64().is_some_and(|r| r < 0.25),
        "{forced}"
    );
    // The receiver found speculation not paying and turned it off; without the backoff
    // it keeps speculating, and missing.
    assert!(
        forced["backoffs"].as_u64().is_some_and(|b| b >= 1),
        "{forced}"
    );
    let raw = find("fallback", "forced_miss_raw", "hit_rate");
    assert!(raw["median"].as_f64().is_some_and(|r| r < 0.25), "{raw}");
    assert_eq!(raw["backoffs"], 0, "{raw}");
    assert!(raw["misses"].as_u64().is_some_and(|m| m > 0), "{raw}");
    for var in ["interfere_10000", "interfere_10000_shared"] {
        let strays = find("interference", var, "hit_rate");
        // 10 000 per 100 000 fragments: 200, less those still due when the stream ended.
        let sent = strays["interfering"].as_u64().expect("strays sent");
        assert!((1..=200).contains(&sent), "{strays}");
        assert!(
            strays["stray_dropped"].as_u64().is_some_and(|d| d > 0),
            "{strays}"
        );
    }
    let lossy = find("loss", "loss_5", "hit_rate");
    assert!(
        lossy["faults_injected"].as_u64().is_some_and(|f| f > 0),
        "{lossy}"
    );
    assert_eq!(
        find("two_senders", "admission", "bandwidth_gbs")["senders"],
        2
    );
    // The namespaces this run made are gone.
    assert_namespaces_removed(&stderr, 2);
}

#[test]
fn quick_alltoall_run_reports_times_and_where_the_bulk_bytes_landed() {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
    let (hosts, exchanges, size) = (3u64, 3u64, 65536u64);
    let (stdout, _) = succeed(
        Command::new(env!("CARGO_BIN_EXE_clink"))
            .args(["bench", "--alltoall", "--hosts", "3", "--exchanges", "3"])
            .args(["--bw-sizes", "64K", "--rounds", "1", "--json"])
            .args(["--systems", "clink,clink-tcp,tcp"]),
        "run clink bench",
        "clink bench failed",
    );
    let rows = json_rows(&stdout);
    assert_eq!(rows.len(), 3, "{stdout}");
    for row in &rows {
        assert_eq!(row["experiment"], "alltoall", "{row}");
        assert_eq!(row["hosts"], hosts, "{row}");
        assert!(row["seconds"].as_f64().is_some_and(|s| s > 0.0), "{row}");
        let clink = row["system"] != "tcp";
        assert_eq!(
            row["sleeps"].is_u64(),
            clink,
            "counters for clink only: {row}"
        );
    }
    // Over UDP every 64 KiB message is a bulk transfer: each byte of it lands once, in
    // place or through the copy path.
    let udp = rows
        .iter()
        .find(|r| r["system"] == "clink-udp")
        .expect("udp row");
    let landed = udp["in_place_bytes"].as_u64().unwrap() + udp["copied_bytes"].as_u64().unwrap();
    assert_eq!(landed, hosts * (hosts - 1) * exchanges * size, "{udp}");
}
