//! `scripts/bench-plot.py` draws rows shaped as `clink bench --json`'s (needs `python3`;
//! fails with the reason when it is missing).

use std::process::Command;

#[test]
fn the_plot_script_draws_a_line_per_system_and_refuses_bad_rows() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("scripts/bench-plot.py");
    let dir = std::env::temp_dir().join(format!("clink-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = String::new();
    for (system, scale) in [("clink", 1.0), ("ucx", 2.0)] {
        for round in 0..3 {
            for (k, size) in [8u64, 1024, 65536].into_iter().enumerate() {
                let lat = scale * (k + 1) as f64 * (1.0 + round as f64 / 10.0);
                rows += &format!(
                    "{{\"system\":\"{system}\",\"metric\":\"latency_us\",\"mode\":\"busy\",\"placement\":\"host\",\"size\":{size},\"median\":{lat},\"round\":{round}}}\n"
                );
            }
        }
    }
    // A row of an experiment and one of another placement are left out.
    rows += "{\"experiment\":\"x\",\"system\":\"clink\",\"metric\":\"latency_us\",\"size\":8,\"median\":9}\n";
    rows += "{\"system\":\"tcp\",\"metric\":\"latency_us\",\"mode\":\"busy\",\"placement\":\"netns\",\"size\":8,\"median\":9}\n";
    let input = dir.join("rows.jsonl");
    std::fs::write(&input, rows).unwrap();
    let prefix = dir.join("out");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&input)
        .arg(&prefix)
        .args(["--placement", "host"])
        .output()
        .expect("python3 is needed to run scripts/bench-plot.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(dir.join("out-latency.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
    assert!(
        svg.contains(">clink busy<") && svg.contains(">ucx busy<"),
        "{svg}"
    );
    assert!(!svg.contains("tcp"), "{svg}");
    // The median of the three rounds (1.1 for clink at 8 B) is the point drawn.
    assert!(svg.contains("clink busy 8: 1.1<"), "{svg}");
    assert!(!dir.join("out-bandwidth.svg").exists());
    // A line that is not JSON is an error naming it.
    std::fs::write(&input, "{\"system\":\n").unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .arg(&input)
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rows.jsonl:1"));
    let _ = std::fs::remove_dir_all(&dir);
}
