//! `clink bench --mpi`: Open MPI on clink (`pml cm`, `mtl ofi`, the `clink` libfabric
//! provider, libclink_fi.so beside this executable) against Open MPI's own paths on one
//! host (`ob1` with the `vader` shared-memory transport; `ucx` when Open MPI has it), in one
//! run. An OSU-style C program (`mpi_bench.c`, compiled here with mpicc) measures each
//! experiment on two ranks; every round runs each system once per experiment (the order
//! rotating by round), and the report is the median of the per-round ratios against ob1.

use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SOURCE: &str = include_str!("mpi_bench.c");

/// (experiment, message size, iterations, iterations with --quick, unit, higher is better)
const EXPERIMENTS: [(&str, usize, u32, u32, &str, bool); 6] = [
    ("latency", 8, 20_000, 2_000, "us", false),
    ("latency", 65_536, 5_000, 500, "us", false),
    ("bw", 1 << 20, 60, 10, "MB/s", true),
    ("bibw", 1 << 20, 30, 5, "MB/s", true),
    ("rate", 8, 3_000, 300, "msg/s", true),
    ("allreduce", 8, 20_000, 2_000, "us", false),
];

struct System {
    name: &'static str,
    mca: Vec<String>,
}

fn systems(provider_dir: &Path) -> Vec<System> {
    let mca = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut v = vec![
        System {
            name: "ompi-ob1",
            mca: mca(&["--mca", "pml", "ob1", "--mca", "btl", "vader,self"]),
        },
        System {
            name: "ompi-clink",
            mca: {
                let mut m = mca(&[
                    "--mca",
                    "pml",
                    "cm",
                    "--mca",
                    "mtl",
                    "ofi",
                    "--mca",
                    "mtl_ofi_provider_include",
                    "clink",
                    "-x",
                ]);
                m.push(format!("FI_PROVIDER_PATH={}", provider_dir.display()));
                m
            },
        },
    ];
    let has_ucx = Command::new("ompi_info")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("MCA pml: ucx"));
    if has_ucx {
        v.push(System {
            name: "ompi-ucx",
            // Open MPI 4.1 restricts pml ucx to Mellanox devices by default.
            mca: mca(&[
                "--mca",
                "pml",
                "ucx",
                "--mca",
                "pml_ucx_tls",
                "any",
                "--mca",
                "pml_ucx_devices",
                "any",
            ]),
        });
    }
    v
}

/// The provider beside this executable, linked into a directory of its own under the
/// name libfabric looks for.
fn provider_dir(work: &Path) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let lib = exe
        .parent()
        .map(|d| d.join("libclink_fi.so"))
        .ok_or("this executable has no directory")?;
    if !lib.is_file() {
        return Err(format!(
            "the libfabric provider {} does not exist (build it with `cargo build --release -p clink-fi`)",
            lib.display()
        ));
    }
    let dir = work.join("provider");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let link = dir.join("libclink-fi.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(lib.canonicalize().map_err(|e| e.to_string())?, &link)
        .map_err(|e| e.to_string())?;
    Ok(dir)
}

fn compile(work: &Path) -> Result<PathBuf, String> {
    let src = work.join("mpi_bench.c");
    let exe = work.join("mpi_bench");
    std::fs::write(&src, SOURCE).map_err(|e| e.to_string())?;
    let st = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map_err(|e| format!("mpicc: {e} (apt-get install libopenmpi-dev openmpi-bin)"))?;
    if !st.success() {
        return Err("mpicc failed on the benchmark program".into());
    }
    Ok(exe)
}

fn measure(sys: &System, exe: &Path, exp: &str, size: usize, iters: u32) -> Result<f64, String> {
    let mut cmd = Command::new("mpirun");
    if nix_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.args(["-np", "2"]).args(&sys.mca).arg(exe).args([
        exp,
        &size.to_string(),
        &iters.to_string(),
    ]);
    let out = output_within(cmd, Duration::from_secs(300))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .rev()
        .find_map(|l| l.trim().parse::<f64>().ok())
        .ok_or_else(|| {
            format!(
                "{} {exp} {size}: no result ({})",
                sys.name,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        })
}

/// Runs `cmd` (its own process group) to the end, killing the group after `limit`.
fn output_within(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("mpirun: {e} (apt-get install openmpi-bin)"))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if Instant::now() > deadline {
            // SAFETY: signalling the process group of our own child.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Err(format!("mpirun ran past {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_end(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_end(&mut err);
    }
    Ok(Output {
        status,
        stdout: out,
        stderr: err,
    })
}

fn nix_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs the comparison: `rounds` rounds of every experiment on every system.
pub fn run(rounds: u64, quick: bool, json: bool) -> Result<(), String> {
    let work = std::env::temp_dir().join(format!("clink-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let res = run_in(&work, rounds.max(1), quick, json);
    let _ = std::fs::remove_dir_all(&work);
    res
}

fn run_in(work: &Path, rounds: u64, quick: bool, json: bool) -> Result<(), String> {
    let exe = compile(work)?;
    let sys = systems(&provider_dir(work)?);
    // values[experiment][system] over rounds; ratios[experiment][system] against ob1.
    let mut values = vec![vec![Vec::new(); sys.len()]; EXPERIMENTS.len()];
    let mut ratios = vec![vec![Vec::new(); sys.len()]; EXPERIMENTS.len()];
    for round in 0..rounds {
        for (e, &(exp, size, iters, quick_iters, unit, higher)) in EXPERIMENTS.iter().enumerate() {
            let mut got = vec![0.0; sys.len()];
            for k in 0..sys.len() {
                let s = (k + round as usize) % sys.len();
                let v = measure(
                    &sys[s],
                    &exe,
                    exp,
                    size,
                    if quick { quick_iters } else { iters },
                )?;
                got[s] = v;
                values[e][s].push(v);
                if json {
                    println!(
                        "{}",
                        json!({"experiment": exp, "size": size, "system": sys[s].name, "round": round,
                               "value": v, "unit": unit, "higher_is_better": higher})
                    );
                }
            }
            for s in 0..sys.len() {
                let r = if higher {
                    got[s] / got[0]
                } else {
                    got[0] / got[s]
                };
                ratios[e][s].push(r);
            }
        }
    }
    if !json {
        let med = |v: &[f64]| super::stats::median(v).unwrap_or(f64::NAN);
        print!("{:<10} {:>8} {:>6}", "experiment", "size", "unit");
        for s in &sys {
            print!(" {:>12}", s.name);
        }
        for s in sys.iter().skip(1) {
            print!(
                " {:>14}",
                format!("{}/ob1", s.name.trim_start_matches("ompi-"))
            );
        }
        println!("  (medians of {rounds} rounds; ratio = times better than ob1, per round)");
        for (e, &(exp, size, _, _, unit, _)) in EXPERIMENTS.iter().enumerate() {
            print!("{exp:<10} {size:>8} {unit:>6}");
            for v in &values[e] {
                print!(" {:>12.2}", med(v));
            }
            for r in ratios[e].iter().skip(1) {
                print!(" {:>14.2}", med(r));
            }
            println!();
        }
    }
    Ok(())
}
