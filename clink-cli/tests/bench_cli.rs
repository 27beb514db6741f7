//! End-to-end: `clink bench --quick --json` for clink and the kernel sockets, two
//! processes per system.

use std::process::Command;

#[test]
fn quick_json_run_over_sockets() {
    let out = Command::new(env!("CARGO_BIN_EXE_clink"))
        .args(["bench", "--quick", "--json", "--systems", "tcp,unix,clink"])
        .args([
            "--lat-sizes",
            "0,64",
            "--bw-sizes",
            "64K",
            "--timeout-secs",
            "60",
        ])
        .output()
        .expect("run clink bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "clink bench failed: {stderr}");
    assert!(stderr.contains("pinned"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stdout line is JSON"))
        .collect();
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
            "copies_per_byte",
        ] {
            assert!(row.get(key).is_some(), "missing {key} in {row}");
        }
        assert!(row["median"].as_f64().is_some_and(|m| m > 0.0), "{row}");
        if row["metric"] == "latency_us" {
            assert!(row["p99"].as_f64().is_some(), "{row}");
        }
        // Kernel sockets copy twice; clink's eager and pipelined paths too (CMA: once).
        let copies = row["copies_per_byte"].as_f64().unwrap_or(-1.0);
        assert!(
            copies == 2.0 || (row["system"] == "clink" && copies == 1.0),
            "{row}"
        );
    }
}
