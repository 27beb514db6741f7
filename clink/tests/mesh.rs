//! Many processes on one host (`examples/mesh.rs`): 16 processes connect every pair,
//! exchange a checked message with every other and ping-pong; the rings they share stay
//! within the bound their expected peer count sets (full-size rings would take 31 MiB).

mod common;

use common::example;
use std::process::Command;

#[test]
fn sixteen_processes_mesh_within_the_shrunk_rings_memory() {
    let mesh = example("mesh");
    // The example bounds each of its waits (120 s) and fails then.
    let out = Command::new(&mesh)
        .args(["16", "2000"])
        .env("CLINK_CALIBRATE", "0")
        .output()
        .expect("run the mesh example");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mib: f64 = text
        .split("shared memory ")
        .nth(1)
        .and_then(|s| s.split(" MiB").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no shared memory figure in {text:?}"));
    // 120 pairs of 512-cell rings (15 expected peers): about 9 MiB with the pages around
    // them; 120 pairs of full 2048-cell rings would be 31 MiB.
    assert!(mib < 20.0, "the mesh holds {mib} MiB: {text}");
}
