//! `clink bench --mpi`: Open MPI on clink (`pml cm`, `mtl ofi`, the `clink` libfabric
//! provider, libclink_fi.so beside this executable) against Open MPI's own paths, in one
//! run. On one host (default) those are `ob1` with the `vader` shared-memory transport and
//! `ucx` when Open MPI has it; with `--placement bridge` the two ranks run on two hosts
//! (network namespaces on a Linux bridge, `--loss` dropped at random into each, mpirun in
//! a third host starting its daemons through an rsh agent that enters the namespace) and
//! `ob1` uses its `tcp` transport, `ucx` its TCP one. An OSU-style C program
//! (`mpi_bench.c`, compiled here with mpicc) measures each experiment on two ranks; every
//! round runs each system once per experiment (the order rotating by round), and the
//! report is the median of the per-round ratios against ob1.

use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const SOURCE: &str = include_str!("mpi_bench.c");

/// The experiments `--experiments` may name (each once, whatever its sizes).
pub const EXPERIMENT_NAMES: &[&str] = &["latency", "bw", "bw_cold", "bibw", "rate", "allreduce"];

pub(super) type Experiment = (&'static str, usize, u32, u32, &'static str, bool);

/// (experiment, message size, iterations, iterations with --quick, unit, higher is better)
pub(super) const EXPERIMENTS: [Experiment; 7] = [
    ("latency", 8, 20_000, 2_000, "us", false),
    ("latency", 65_536, 5_000, 500, "us", false),
    ("bw", 1 << 20, 60, 10, "MB/s", true),
    ("bw_cold", 1 << 20, 60, 10, "MB/s", true),
    ("bibw", 1 << 20, 30, 5, "MB/s", true),
    ("rate", 8, 3_000, 300, "msg/s", true),
    ("allreduce", 8, 20_000, 2_000, "us", false),
];

struct System {
    name: &'static str,
    mca: Vec<String>,
}

fn systems(provider_dir: &Path, across_hosts: bool) -> Vec<System> {
    let mca = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let btl = if across_hosts {
        "tcp,self"
    } else {
        "vader,self"
    };
    let mut v = vec![
        System {
            name: "ompi-ob1",
            mca: mca(&["--mca", "pml", "ob1", "--mca", "btl", btl]),
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

/// Where the two ranks run.
enum Hosts {
    /// Both on this host.
    One,
    /// Hosts 1 and 2 of a bridge, mpirun on host 0.
    Bridge {
        bridge: clink_testbed::Bridge,
        agent: PathBuf,
        loss_pct: f64,
    },
}

impl Hosts {
    fn bridge(work: &Path, mtu: u32, loss_pct: f64) -> Result<Hosts, String> {
        if let Some(why) = clink_testbed::unavailable() {
            return Err(format!("--placement bridge: {why}"));
        }
        let bridge = clink_testbed::Bridge::create(&clink_testbed::BridgeSpec {
            hosts: 3,
            mtu,
            ..Default::default()
        })
        .map_err(|e| format!("cannot make the bridge: {e}"))?;
        bridge
            .set_loss(&[(1, loss_pct), (2, loss_pct)])
            .map_err(|e| format!("cannot set the loss: {e}"))?;
        let agent = work.join("rsh-agent.sh");
        bridge
            .write_rsh_agent(&agent, &[1, 2])
            .map_err(|e| format!("cannot write the rsh agent: {e}"))?;
        Ok(Hosts::Bridge {
            bridge,
            agent,
            loss_pct,
        })
    }

    /// mpirun for two ranks, placed.
    fn mpirun(&self) -> Command {
        match self {
            Hosts::One => {
                let mut cmd = Command::new("mpirun");
                cmd.args(["-np", "2"]);
                cmd
            }
            Hosts::Bridge { bridge, agent, .. } => {
                let mut cmd = bridge.command(0, "mpirun");
                let hosts = format!("{},{}", bridge.addr(1), bridge.addr(2));
                // Each daemon sees the machine's cores as its own: bound, both ranks
                // would share core 0 and time-slice. Unbound, the daemons' hwloc runtime
                // control has nothing to do, and it crashes now and then when several
                // daemons start on one machine (hwloc_shmem_topology_write): off.
                cmd.args(["-np", "2", "--host", &hosts, "--bind-to", "none"])
                    .args(["--mca", "rtc", "^hwloc", "--mca", "plm_rsh_agent"])
                    .arg(agent);
                cmd
            }
        }
    }
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

fn measure(
    at: &Hosts,
    sys: &System,
    exe: &Path,
    exp: &str,
    size: usize,
    iters: u32,
) -> Result<f64, String> {
    let mut cmd = at.mpirun();
    if nix_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.args(&sys.mca)
        .arg(exe)
        .args([exp, &size.to_string(), &iters.to_string()]);
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
                    .take(12)
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
            // (The process group of our own child: it leads it.)
            let _ = rustix::process::kill_process_group(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::KILL,
            );
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
    clink::sys::geteuid() == 0
}

/// Runs the comparison: `rounds` rounds of every experiment on every system, on one host
/// or (`bridge` = MTU and loss percentages) on two hosts of a bridge, one per loss.
pub fn run(
    rounds: u64,
    quick: bool,
    json: bool,
    bridge: Option<(u32, &[f64])>,
    only: &[String],
) -> Result<(), String> {
    // The experiments to run: those `only` names, or all.
    let plan: Vec<Experiment> = EXPERIMENTS
        .into_iter()
        .filter(|e| only.is_empty() || only.iter().any(|o| o == e.0))
        .collect();
    let work = std::env::temp_dir().join(format!("clink-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let res = (|| {
        let exe = compile(&work)?;
        let provider = provider_dir(&work)?;
        match bridge {
            None => run_at(
                &Hosts::One,
                &plan,
                &exe,
                &provider,
                rounds.max(1),
                quick,
                json,
            ),
            Some((mtu, losses)) => {
                for &loss in losses {
                    let at = Hosts::bridge(&work, mtu, loss)?;
                    run_at(&at, &plan, &exe, &provider, rounds.max(1), quick, json)?;
                }
                Ok(())
            }
        }
    })();
    let _ = std::fs::remove_dir_all(&work);
    res
}

fn run_at(
    at: &Hosts,
    plan: &[Experiment],
    exe: &Path,
    provider: &Path,
    rounds: u64,
    quick: bool,
    json: bool,
) -> Result<(), String> {
    let sys = systems(provider, matches!(at, Hosts::Bridge { .. }));
    let (placement, loss) = match at {
        Hosts::One => ("host", 0.0),
        Hosts::Bridge { loss_pct, .. } => ("bridge", *loss_pct),
    };
    // values[experiment][system] over rounds; ratios[experiment][system] against ob1.
    let mut values = vec![vec![Vec::new(); sys.len()]; plan.len()];
    let mut ratios = vec![vec![Vec::new(); sys.len()]; plan.len()];
    let mut failures = Vec::new();
    for round in 0..rounds {
        for (e, &(exp, size, iters, quick_iters, unit, higher)) in plan.iter().enumerate() {
            let mut got = vec![None; sys.len()];
            for k in 0..sys.len() {
                let s = (k + round as usize) % sys.len();
                let iters = if quick { quick_iters } else { iters };
                // A system that fails (a crash, a hang) loses its round; the others go on.
                let v = match measure(at, &sys[s], exe, exp, size, iters) {
                    Ok(v) => v,
                    Err(why) => {
                        failures.push((sys[s].name, format!("round {round}: {why}")));
                        if json {
                            println!(
                                "{}",
                                json!({"experiment": exp, "size": size, "system": sys[s].name,
                                       "round": round, "error": why,
                                       "placement": placement, "loss_pct": loss})
                            );
                        }
                        continue;
                    }
                };
                got[s] = Some(v);
                values[e][s].push(v);
                if json {
                    println!(
                        "{}",
                        json!({"experiment": exp, "size": size, "system": sys[s].name, "round": round,
                               "value": v, "unit": unit, "higher_is_better": higher,
                               "placement": placement, "loss_pct": loss})
                    );
                }
            }
            for s in 0..sys.len() {
                if let (Some(base), Some(v)) = (got[0], got[s]) {
                    ratios[e][s].push(if higher { v / base } else { base / v });
                }
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
        if let Hosts::Bridge { .. } = at {
            println!("two hosts on a bridge, {loss}% of packets into each dropped at random; ob1 over tcp");
        }
        for (e, &(exp, size, _, _, unit, _)) in plan.iter().enumerate() {
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
    for (_, f) in &failures {
        eprintln!("clink bench --mpi: {f}");
    }
    // A baseline that crashes is reported; clink failing fails the run.
    match failures.iter().find(|(name, _)| *name == "ompi-clink") {
        Some((_, f)) => Err(format!("clink failed: {f}")),
        None => Ok(()),
    }
}
