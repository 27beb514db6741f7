//! The provider loaded by real libfabric programs: `fi_info`, `fi_pingpong` (with data
//! verification), Open MPI (`pml cm`, `mtl ofi`) running the C suite in `tests/mpi` on one
//! host and across two namespace hosts, and mpi4py. The tools come from Debian's packages
//! (libfabric-bin, openmpi-bin, libopenmpi-dev, python3-mpi4py), which `.ci/run` installs;
//! a missing tool fails the test with a message saying so.
//! Needs `cargo build -p clink-fi` first (`.ci/test` does): a test build does not leave
//! `libclink_fi.so` in the target directory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// A directory holding the provider as `libclink-fi.so`, for `FI_PROVIDER_PATH`.
struct ProviderDir(PathBuf);

impl ProviderDir {
    fn new(name: &str) -> ProviderDir {
        let lib = target_dir().join("debug/libclink_fi.so");
        assert!(
            lib.exists(),
            "{} is missing: run `cargo build -p clink-fi` first (.ci/test does)",
            lib.display()
        );
        let dir = std::env::temp_dir().join(format!("clink-fi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(lib.canonicalize().unwrap(), dir.join("libclink-fi.so"))
            .unwrap();
        ProviderDir(dir)
    }
}

impl Drop for ProviderDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn need(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{tool} is not installed (Debian package {package}; .ci/run installs it)"
    );
}

/// A child process killed (with its process group) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: signalling the process group this test started.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn spawn(mut cmd: Command) -> Proc {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Proc(cmd.spawn().expect("spawn"))
}

/// Waits for the process at most `limit`; after that, kills it (and its process group)
/// and fails with what it printed.
fn finish(mut p: Proc, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            timed_out = true;
            // SAFETY: signalling the process group this test started.
            unsafe { libc::kill(-(p.0.id() as i32), libc::SIGKILL) };
            break p.0.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    p.0.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    p.0.stderr.take().unwrap().read_to_end(&mut err).unwrap();
    let o = Output {
        status,
        stdout: out,
        stderr: err,
    };
    assert!(!timed_out, "a process ran past {limit:?}: {}", text(&o));
    o
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn fi_info_lists_the_provider_with_tagged_rdm() {
    need("fi_info", "libfabric-bin");
    let dir = ProviderDir::new("info");
    let mut cmd = Command::new("fi_info");
    cmd.args(["-p", "clink", "-t", "FI_EP_RDM", "-c", "FI_TAGGED", "-v"])
        .env("FI_PROVIDER_PATH", &dir.0);
    let out = finish(spawn(cmd), LIMIT);
    let t = text(&out);
    assert!(out.status.success(), "fi_info failed: {t}");
    for want in [
        "prov_name: clink",
        "FI_EP_RDM",
        "FI_TAGGED",
        "mem_tag_format: 0xffffffffffffffff",
    ] {
        assert!(t.contains(want), "no {want:?} in: {t}");
    }
    // Hints it cannot meet find nothing rather than a wrong provider.
    let mut cmd = Command::new("fi_info");
    cmd.args(["-p", "clink", "-c", "FI_RMA"])
        .env("FI_PROVIDER_PATH", &dir.0);
    let out = finish(spawn(cmd), LIMIT);
    assert!(!out.status.success(), "fi_info offered RMA: {}", text(&out));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on TCP `port` (from /proc/net/tcp, without connecting).
fn listening(port: u16) -> bool {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    t.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[3] == "0A" && f[1].ends_with(&format!(":{port:04X}"))
    })
}

#[test]
fn fi_pingpong_tagged_every_size_with_verification() {
    pingpong_every_size("tagged");
}

/// The untagged (FI_MSG) data path, fi_pingpong's default.
#[test]
fn fi_pingpong_untagged_every_size_with_verification() {
    pingpong_every_size("msg");
}

/// The network path with IPv6 names: both endpoints on UDP over `::1` only (their names
/// carry an IPv6 address), TCP off.
#[test]
fn fi_pingpong_over_udp_on_ipv6() {
    pingpong_every_size_with(
        "tagged",
        &[
            ("CLINK_TRANSPORT", "udp"),
            ("CLINK_UDP_BIND", "[::1]:0"),
            ("CLINK_TCP", "off"),
        ],
    );
}

fn pingpong_every_size(mode: &str) {
    pingpong_every_size_with(mode, &[]);
}

fn pingpong_every_size_with(mode: &str, env: &[(&str, &str)]) {
    need("fi_pingpong", "libfabric-bin");
    let dir = ProviderDir::new(&format!("pingpong-{mode}-{}", env.len()));
    let port = free_port().to_string();
    let args = [
        "-p", "clink", "-e", "rdm", "-m", mode, "-I", "20", "-S", "all", "-v",
    ];
    let mut srv = Command::new("fi_pingpong");
    srv.args(args)
        .args(["-B", &port])
        .env("FI_PROVIDER_PATH", &dir.0)
        .envs(env.iter().copied());
    let server = spawn(srv);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listening(port.parse().unwrap()) {
        assert!(
            Instant::now() < deadline,
            "fi_pingpong's server never listened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cli = Command::new("fi_pingpong");
    cli.args(args)
        .args(["-P", &port, "127.0.0.1"])
        .env("FI_PROVIDER_PATH", &dir.0)
        .envs(env.iter().copied());
    let client = finish(spawn(cli), LIMIT);
    let server = finish(server, LIMIT);
    for (who, o) in [("client", &client), ("server", &server)] {
        let t = text(o);
        assert!(o.status.success(), "{who} failed: {t}");
        // One result row per size, up to the largest fi_pingpong tries.
        assert!(
            t.lines().any(|l| l.starts_with("6m ")),
            "{who} stopped early: {t}"
        );
    }
}

/// Builds the C suite with Open MPI's compiler wrapper.
fn build_suite() -> PathBuf {
    need("mpicc", "libopenmpi-dev");
    // One executable per call: tests run in parallel and each removes its own.
    static BUILT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("clink-fi-suite-{}-{n}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/suite.c");
    let st = Command::new("mpicc")
        .args(["-O1", "-g", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .expect("mpicc");
    assert!(st.success(), "mpicc failed on {}", src.display());
    out
}

fn mpirun(dir: &ProviderDir, ranks: u32, program: &Path, args: &[&str]) -> Output {
    need("mpirun", "openmpi-bin");
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &ranks.to_string(),
    ])
    .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
    .args(["--mca", "mtl_ofi_provider_include", "clink"])
    .args(["-x", "FI_PROVIDER_PATH"])
    .env("FI_PROVIDER_PATH", &dir.0)
    .arg(program)
    .args(args);
    finish(spawn(cmd), LIMIT)
}

#[test]
fn open_mpi_runs_the_suite_on_one_two_and_four_ranks() {
    let dir = ProviderDir::new("mpi");
    let suite = build_suite();
    for ranks in [1, 2, 4] {
        let out = mpirun(&dir, ranks, &suite, &[&(64u64 << 20).to_string()]);
        let t = text(&out);
        assert!(out.status.success(), "{ranks} ranks: {t}");
        for part in [
            "ok send_recv_sizes",
            "ok isend_irecv_storm",
            "ok ssend",
            "ok probe_iprobe_mprobe_improbe",
            "ok self",
            "ok cancel",
            "ok truncation",
            "ok allreduce_alltoall_bcast",
            "ok thread_multiple",
            "ok all",
        ] {
            assert!(t.contains(part), "{ranks} ranks: no {part:?} in {t}");
        }
    }
    let _ = std::fs::remove_file(suite);
}

/// Two ranks on two hosts (network namespaces on a Linux bridge; mpirun in a third one,
/// starting its daemons through an rsh agent that enters the host's namespace), `loss_pct`
/// percent of the packets into each rank's host dropped at random: the provider reaches
/// the other rank over clink's network path.
fn suite_across_two_namespace_hosts(loss_pct: f64, max: u64) {
    if let Some(why) = clink_testbed::unavailable() {
        panic!("needs network namespaces (run as root): {why}");
    }
    need("mpirun", "openmpi-bin");
    // A directory of its own: the two runs of this suite may go in parallel.
    let dir = ProviderDir::new(&format!("mpi-net-{loss_pct}"));
    let suite = build_suite();
    let bridge = clink_testbed::Bridge::create(&clink_testbed::BridgeSpec {
        hosts: 3,
        ..Default::default()
    })
    .expect("bridge");
    bridge
        .set_loss(&[(1, loss_pct), (2, loss_pct)])
        .expect("nftables loss rules");
    let agent = dir.0.join("agent.sh");
    bridge.write_rsh_agent(&agent, &[1, 2]).expect("agent");
    let hosts = format!("{},{}", bridge.addr(1), bridge.addr(2));
    let mut cmd = bridge.command(0, "mpirun");
    // Each daemon sees the machine's cores as its own: unbound, the two ranks do not share
    // core 0; the daemons' hwloc runtime control, then idle, crashes now and then when
    // several daemons start on one machine (hwloc_shmem_topology_write): off.
    cmd.args([
        "--allow-run-as-root",
        "-np",
        "2",
        "--host",
        &hosts,
        "--bind-to",
        "none",
    ])
    .args(["--mca", "rtc", "^hwloc", "--mca", "plm_rsh_agent"])
    .arg(&agent)
    .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
    .args(["--mca", "mtl_ofi_provider_include", "clink"])
    .args(["-x", "FI_PROVIDER_PATH"])
    .env("FI_PROVIDER_PATH", &dir.0)
    .arg(&suite)
    .arg(max.to_string());
    let out = finish(spawn(cmd), Duration::from_secs(60));
    let t = text(&out);
    assert!(out.status.success(), "across hosts, {loss_pct}% loss: {t}");
    for part in [
        "ok send_recv_sizes",
        "ok ssend",
        "ok self",
        "ok allreduce_alltoall_bcast",
        "ok all",
    ] {
        assert!(
            t.contains(part),
            "across hosts, {loss_pct}% loss: no {part:?} in {t}"
        );
    }
    if loss_pct > 0.0 {
        let dropped = bridge.dropped().expect("nftables counters");
        assert!(dropped > 0, "{loss_pct}% loss dropped no packet");
    }
    let _ = std::fs::remove_file(suite);
}

#[test]
fn open_mpi_runs_the_suite_across_two_namespace_hosts() {
    suite_across_two_namespace_hosts(0.0, 8 << 20);
}

/// Every packet into either rank's host has a 1% chance of being dropped by the kernel.
#[test]
fn open_mpi_runs_the_suite_across_hosts_with_one_percent_loss() {
    suite_across_two_namespace_hosts(1.0, 64 << 20);
}

#[test]
fn mpi4py_runs_on_the_provider() {
    // Debian's python3-mpi4py lives in the system interpreter's dist-packages.
    let python = Path::new("/usr/bin/python3");
    let has = Command::new(python)
        .args(["-c", "import mpi4py"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(has, "mpi4py is not installed for /usr/bin/python3 (Debian package python3-mpi4py; .ci/run installs it)");
    let dir = ProviderDir::new("mpi4py");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/mpi4py_check.py");
    let out = mpirun(&dir, 2, python, &[script.to_str().unwrap()]);
    let t = text(&out);
    assert!(
        out.status.success() && t.contains("ok mpi4py"),
        "mpi4py: {t}"
    );
}
