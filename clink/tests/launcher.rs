//! Ranks started by Open MPI's mpirun find each other through its PMIx service
//! (`examples/launcher_ring.rs`, three ranks), and a process no launcher started gets a
//! clear error. mpirun comes from Debian's openmpi-bin, which `.ci/run` installs.

mod common;

use common::example;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_process_without_a_launcher_gets_a_clear_error() {
    assert!(
        std::env::var_os("PMIX_NAMESPACE").is_none(),
        "this test must run outside a launcher"
    );
    let err = clink::Context::from_launcher()
        .err()
        .expect("no launcher, no job");
    assert!(matches!(err, clink::Error::Launcher(_)), "{err}");
    assert!(
        err.to_string().contains("not started by a PMIx launcher"),
        "{err}"
    );
}

#[test]
fn ranks_started_by_mpirun_pass_a_message_around_a_ring() {
    let has = Command::new("sh")
        .args(["-c", "command -v mpirun"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has,
        "mpirun is not installed (Debian package openmpi-bin; .ci/run installs it)"
    );
    let ring = example("launcher_ring");
    let mut cmd = Command::new("mpirun");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .args(["--oversubscribe", "-np", "3"])
        .arg(&ring)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // SAFETY: signalling the process group of our own child (mpirun and its ranks).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("mpirun ran past 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for r in 0..3 {
        let left = (r + 2) % 3;
        let want = format!("rank {r} of 3: got \"hello from {left}\" from its left");
        assert!(text.contains(&want), "no {want:?} in {text}");
        // Open MPI's PMIx says how many ranks share the node (all three here); the
        // endpoints size their rings for that many peers.
        let local = format!("rank {r}: 3 ranks on this node");
        assert!(text.contains(&local), "no {local:?} in {text}");
    }
}
