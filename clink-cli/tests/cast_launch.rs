//! `clink cast` started by others: the source starting its receivers through a command per
//! host, ranks started by mpirun casting in rank order, a job outside a launcher, and the
//! bench's cast rows. Needs root and iproute2 (and mpirun for the job): fails with the
//! reason where they are unavailable.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// Whether a process runs with `arg` among its arguments (this machine's `/proc`).
fn running_with(arg: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
    })
}

#[test]
fn the_source_starts_the_receivers_itself_through_a_command_per_host() {
    let b = bridge(None);
    let dir = TempDir::new("hosts");
    let data = random(5 * MIB + 777, 43);
    let src = dir.0.join("src");
    std::fs::write(&src, &data).unwrap();
    let hosts: Vec<&str> = (1..=3).map(|i| b.ns(i)).collect();
    let out = dir.0.join("copy.{host}");
    let send = |hosts: &str| {
        let mut cmd = b.command(0, exe());
        cmd.args(["cast", "send"])
            .arg(&src)
            .args(["--hosts", hosts, "--via", "ip netns exec {host}", "--json"])
            .arg("--out")
            .arg(&out);
        Proc::spawn(cmd, "source", false)
    };
    let (st, stdout, err) = send(&hosts.join(",")).finish();
    assert!(st.success(), "cast failed: {st}\n{stdout}\n{err}");
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "the source and three receivers:\n{stdout}");
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(rows[i + 1]["status"], "ok", "{stdout}");
        // The chain in the hosts' order: node i on host i.
        let at = format!("{}:", b.addr(i + 1));
        let addr = rows[i + 1]["address"].as_str().unwrap();
        assert!(
            addr.starts_with(&at),
            "node {} at {addr}, not on {h}",
            i + 1
        );
        let got = std::fs::read(dir.0.join(format!("copy.{h}"))).unwrap();
        assert!(got == data, "the copy on {h} differs");
    }
    // A host its command cannot reach: the cast fails before any data, naming it, and
    // the receiver started on the host before it is stopped.
    let (st, stdout, err) = send(&format!("{},clink-no-such-host", hosts[0])).finish();
    assert!(!st.success(), "{stdout}\n{err}");
    assert!(
        err.contains("host clink-no-such-host") && err.contains("before the receiver printed"),
        "{err}"
    );
    // What the command said, after the host's name.
    assert!(
        err.contains("clink-no-such-host: Cannot open network namespace"),
        "{err}"
    );
    let first = dir.0.join(format!("copy.{}", hosts[0]));
    assert!(
        !running_with(first.to_str().unwrap()),
        "the receiver on {} still runs",
        hosts[0]
    );
}

/// `clink cast job` under Open MPI's mpirun: rank 0 on host 0 sends, ranks 1-3 on hosts
/// 1-3 (started through an rsh agent that enters each host's namespace) receive, in rank
/// order, having learnt each other's addresses from mpirun's PMIx service.
#[test]
fn ranks_started_by_mpirun_cast_a_file_in_rank_order() {
    let has = Command::new("sh")
        .args(["-c", "command -v mpirun"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has,
        "mpirun is not installed (Debian package openmpi-bin; .ci/run installs it)"
    );
    let b = bridge(None);
    let dir = TempDir::new("job");
    let data = random(5 * MIB + 4321, 44);
    let src = dir.0.join("src");
    std::fs::write(&src, &data).unwrap();
    let agent = dir.0.join("agent.sh");
    b.write_rsh_agent(&agent, &[1, 2, 3]).unwrap();
    let hosts: Vec<String> = (0..4).map(|i| b.addr(i).to_string()).collect();
    let job = |out: &Path| {
        let mut cmd = b.command(0, "mpirun");
        // As the provider's suite runs it (clink-fi/tests/provider.rs): unbound, without
        // the daemons' hwloc runtime control.
        cmd.args([
            "--allow-run-as-root",
            "-np",
            "4",
            "--host",
            &hosts.join(","),
        ])
        .args(["--bind-to", "none", "--mca", "rtc", "^hwloc"])
        .args(["--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args([exe(), "cast", "job", "--json"])
        .arg(&src)
        .arg("--out")
        .arg(out);
        Proc::spawn(cmd, "mpirun", false)
    };
    let (st, out, err) = job(&dir.0.join("copy.{rank}")).finish();
    assert!(st.success(), "the job failed: {st}\n{out}\n{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.len(),
        4,
        "rank 0's rows for the source and three receivers:\n{out}"
    );
    for (i, row) in rows.iter().enumerate().skip(1) {
        assert_eq!(row["status"], "ok", "{out}");
        let at = format!("{}:", b.addr(i));
        let addr = row["address"].as_str().unwrap();
        assert!(addr.starts_with(&at), "node {i} at {addr}, not on host {i}");
        let got = std::fs::read(dir.0.join(format!("copy.{i}"))).unwrap();
        assert!(got == data, "rank {i}'s copy differs");
    }
    // Receivers that cannot write end the job, saying why (the first to fail does:
    // mpirun then stops the other ranks).
    let (st, _, err) = job(Path::new("/nonexistent-clink-dir/copy.{rank}")).finish();
    assert!(!st.success(), "{err}");
    assert!(
        err.contains("/nonexistent-clink-dir/copy.") && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn a_cast_job_outside_a_launcher_says_so() {
    let out = Command::new(exe())
        .args(["cast", "job", "/dev/null", "--out", "/dev/null"])
        .env_remove("PMIX_NAMESPACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not started by a PMIx launcher"), "{err}");
}

#[test]
fn the_bench_casts_through_both_chains_and_reports_rates_and_processor_time() {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("this test needs network namespaces: {why}");
    }
    let mut cmd = Command::new(exe());
    cmd.args(["cast", "bench", "--hosts", "2", "--size-mib", "8", "--json"]);
    let (st, out, err) = Proc::spawn(cmd, "bench", false).finish();
    assert!(st.success(), "{st}\n{out}\n{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let systems: Vec<&str> = rows.iter().map(|r| r["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["clink-cast", "tcp-relay"], "{out}");
    for r in &rows {
        assert_eq!(r["bytes"], 8 << 20, "{r}");
        for k in ["rate_mbps", "node_cpu_s_per_gb"] {
            let v = r[k].as_f64().unwrap_or(0.0);
            assert!(v > 0.0 && v.is_finite(), "{k} of {r}");
        }
    }
    assert!(
        rows[0]["predicted_mbps"].as_f64().unwrap_or(0.0) > 0.0,
        "{out}"
    );
}
