//! `clink bench`: latency and bandwidth between two processes, for clink and
//! its baselines (kernel TCP, UDP and Unix sockets, UCX).
//!
//! The parent ([`run`]) spawns its own executable twice per system and mode
//! with the hidden subcommand [`CHILD_SUBCOMMAND`] ([`run_child`]): first the
//! server, pinned to CPU 0, which prints its address on one stdout line; then
//! the client, pinned to CPU 1, which connects, runs the whole [`Plan`] with
//! the server mirroring it, and prints one JSON [`Row`] per line. Every wait
//! on a child is bounded; children are killed by PID and reaped.
//!
//! # Placement
//!
//! `--placement host` (default): both children on this host, IP systems over
//! loopback, clink over shared memory. `--placement netns`: for each `--mtu`
//! (default 1500 and 9000) the parent makes two network namespaces joined by a
//! veth pair with that MTU ([`clink_testbed::NetnsPair`], needs root), runs every
//! selected system with the server in namespace 0 and the client in namespace 1
//! (`ip netns exec`, which execs the child, so pinning is unchanged), then
//! deletes the pair. The server gets the address of its namespace (hidden
//! `--host-ip`): TCP and UDP bind 0.0.0.0 and advertise it; clink chooses its
//! own transport and address, and its rows are named `clink-udp` (or
//! `clink-tcp` when its channel reports a `tcp...` transport) instead of
//! `clink`; the system `clink-tcp` (in the default selection in netns placement
//! only; on the host, over loopback, when named) runs clink over TCP in the same
//! run. Unix sockets cannot cross namespaces and are skipped with a note;
//! UCX runs with `UCX_TLS=tcp`. Rows carry `placement` and, in netns, `mtu`.
//! `--placement bridge`: as netns, but the two namespaces are hosts 0 and 1 of a Linux
//! bridge ([`clink_testbed::Bridge`]: one switch hop apart, as on a cluster), made afresh
//! for each `--mtu` (default 1500) and each `--loss` percentage (default 0: packets
//! dropped at random by nftables on the switch on the way into each host), with each
//! host's input limited to `--rate` (tc's tbf) if given; rows carry `loss_pct` and
//! `rate` too. Under loss each bandwidth repetition moves at least 128 MiB (`--quick`:
//! 32 MiB), so that kernel TCP's retransmission timeouts land inside the repetitions.
//!
//! # What a bandwidth row holds
//!
//! The median over repetitions of bytes received per second (goodput: for
//! plain UDP, which may drop, the bytes the receiver counted, with `lost_pct`),
//! and `cpu_s_per_gb`: the CPU seconds both processes used during the timed
//! rounds per GB received (see [`measure`]); UCX's bandwidth rows get theirs from the
//! processes' resource usage ([`ucx`]); libfabric's `fi_pingpong` gives latency rows only
//! ([`fabric`]).
//!
//! Modules: [`channel`] (the plug-in traits), [`sockets`] (TCP / Unix
//! baselines), [`udp`] (UDP baseline, no reliability), [`measure`] (the loops),
//! [`plan`], [`stats`], [`report`], [`ucx`] (external `ucx_perftest`), [`fabric`]
//! (external `fi_pingpong`), [`external`] (what the two share),
//! [`proc`] (child processes), [`affinity`] (CPU pinning), [`clink_sys`] (clink
//! itself as a system), [`rma`] and [`evserver`] (the `--rma` experiments, two
//! pinned threads of one process), [`spec`] (the `--spec` experiments: the seed's
//! speculative defragmentation between network namespaces, a receiver and one or two
//! sender processes per run, rows with `experiment` and `variant`).
//!
//! # Adding a system
//!
//! Implement [`System`] (how the two sides meet: `listen` returns an address
//! string of one line plus an [`Acceptor`], `connect` takes that string; an IP
//! system binds 0.0.0.0 and advertises the address `listen` is given in netns
//! placement, else binds 127.0.0.1) and
//! [`Channel`] (fixed-size `send` / `recv`, optionally pipelined
//! `send_stream` / `recv_stream`, plus `copies_per_byte` and `transport`),
//! then add one `Box::new(...)` line to [`systems`]. Each side runs in its own
//! process and uses its channel from one thread only. The harness checks the
//! payload: the last echoed ping-pong message of every size and the first
//! streaming round of every size must arrive intact.

pub mod affinity;
pub mod alltoall;
pub mod channel;
pub mod clink_sys;
pub mod evserver;
pub mod external;
pub mod fabric;
pub mod measure;
pub mod mpi;
pub mod plan;
pub mod preload;
pub mod proc;
pub mod report;
pub mod rma;
pub mod sockets;
pub mod spec;
pub mod stats;
pub mod ucx;
pub mod udp;

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use clink_testbed::{BridgeSpec, NetnsPair};

// The plug-in interface and result types, re-exported for system implementations.
#[allow(unused_imports)]
pub use channel::{Acceptor, Channel, Mode, System};
pub use plan::Plan;
#[allow(unused_imports)]
pub use report::{Metric, Row};

use affinity::{CLIENT_CPU, SERVER_CPU};
use proc::ChildProc;
use report::{BRIDGE_PLACEMENT, HOST_PLACEMENT, NETNS_PLACEMENT};

/// Name of the hidden subcommand the harness runs its children with; the CLI
/// must route it to [`run_child`] with [`ChildArgs`].
pub const CHILD_SUBCOMMAND: &str = "bench-child";

/// Prefix of the server child's address line on stdout.
const ADDR_PREFIX: &str = "clink-bench-addr ";

/// Name of the external UCX baseline in `--systems`.
const UCX: &str = "ucx";
/// The external baselines (run by their own tools), after the built-in systems.
const EXTERNAL: [&str; 3] = [UCX, fabric::LIBFABRIC, fabric::LIBFABRIC_RXD];
use clink_sys::{CLINK, CLINK_TCP};
/// Name of the Unix socket baseline (host placement only).
const UNIX: &str = "unix";
/// Veth MTUs measured with `--placement netns` when `--mtu` is not given.
pub const DEFAULT_MTUS: [u32; 2] = [1500, 9000];

/// The systems built into this binary. Add a system here with one line.
pub fn systems() -> Vec<Box<dyn System>> {
    vec![
        Box::new(sockets::TcpSystem),
        Box::new(udp::UdpSystem),
        Box::new(sockets::UnixSystem),
        Box::new(clink_sys::ClinkSystem::AUTO),
        Box::new(clink_sys::ClinkSystem::TCP),
    ]
}

/// Where the two sides run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// Both on this host: loopback, shared memory.
    Host,
    /// Two network namespaces joined by a veth pair (needs root).
    Netns,
    /// Two network namespaces on a Linux bridge, one switch hop apart, with `--loss` and
    /// `--rate` applied on the switch (needs root; nftables for loss, tc for the rate).
    Bridge,
}

/// Which modes to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Spin on non-blocking operations.
    Busy,
    /// Block in the kernel.
    Blocking,
    /// Each system's default waiting: clink spins (its default spin time), then sleeps;
    /// the others block. With `--no-pin` under `taskset -c 0`, both sides share one CPU.
    Spin,
    /// Busy, then blocking.
    Both,
}

impl ModeArg {
    fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Busy => vec![Mode::Busy],
            ModeArg::Blocking => vec![Mode::Blocking],
            ModeArg::Spin => vec![Mode::Spin],
            ModeArg::Both => Mode::ALL.to_vec(),
        }
    }
}

/// Arguments of `clink bench`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("experiment_mode").args(["rma", "spec", "mpi"])))]
#[command(group(clap::ArgGroup::new("experiment").args(["rma", "spec", "alltoall", "sockets", "mpi"]).multiple(false)))]
pub struct BenchArgs {
    /// Systems to measure, comma-separated (default: every built-in system, plus ucx,
    /// libfabric and libfabric-rxd, each run when its tool, ucx_perftest or fi_pingpong,
    /// is installed).
    #[arg(long, value_delimiter = ',')]
    pub systems: Option<Vec<String>>,
    /// Waiting mode(s).
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub mode: ModeArg,
    /// Message sizes for both latency and bandwidth, comma-separated, with
    /// optional K/M/G suffix (size 0 is used for latency only).
    #[arg(long)]
    pub sizes: Option<String>,
    /// Latency sizes only (overrides --sizes for latency).
    #[arg(long)]
    pub lat_sizes: Option<String>,
    /// Bandwidth sizes only (overrides --sizes for bandwidth).
    #[arg(long)]
    pub bw_sizes: Option<String>,
    /// Short run for tests and demos (fewer iterations and repetitions).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object per line on stdout instead of tables (the header
    /// goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Do not pin the two sides to CPUs 0 and 1.
    #[arg(long)]
    pub no_pin: bool,
    /// Bound in seconds on one system+mode run (children are killed after it); default
    /// 120, and 600 under `--loss`, where kernel TCP's backed-off retransmission timeouts
    /// can stretch a run to minutes
    #[arg(long)]
    pub timeout_secs: Option<u64>,
    /// Repeat the whole run this many times, interleaving the systems
    /// (A B A B ...); tables show the median over rounds, JSON rows carry
    /// their `round` (with `--rma`, every round's rows are printed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Where the two sides run: `host` (loopback / shared memory) or `netns`
    /// (two network namespaces joined by a veth pair; needs root).
    #[arg(long, value_enum, default_value_t = Placement::Host)]
    pub placement: Placement,
    /// Veth MTUs for `--placement netns` or `bridge`, comma-separated (default
    /// 1500,9000 for netns, 1500 for bridge; ignored on the host).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(68..=65535))]
    pub mtu: Option<Vec<u32>>,
    /// With `--placement bridge`: percentages of packets dropped at random on the way
    /// into each host, comma-separated; each is a run of its own (default 0).
    #[arg(long, value_delimiter = ',')]
    pub loss: Option<Vec<f64>>,
    /// With `--placement bridge`: rate limit of each host's input link, in tc's syntax
    /// (`1gbit`, the seeds' Gigabit Ethernet).
    #[arg(long)]
    pub rate: Option<String>,
    /// With `--placement netns` or `bridge`, or `--alltoall`: the TCP congestion control
    /// of every namespace made (what kernel TCP's and clink-tcp's sockets use): a name the
    /// kernel offers, such as cubic (Linux's default), bbr or reno, and lets a namespace
    /// take (`net.ipv4.tcp_allowed_congestion_control`). Default: what a new namespace
    /// inherits from this host. Rows carry the one in force (`tcp_cc`).
    #[arg(long)]
    pub tcp_cc: Option<String>,
    /// Run the aperture experiments (one-word round trips, distributed queue, put
    /// bandwidth, event-driven server; rows with an `experiment` field) instead of the
    /// system comparison.
    #[arg(long, conflicts_with_all = ["systems", "mode", "sizes", "lat_sizes", "bw_sizes", "placement", "mtu", "timeout_secs"])]
    pub rma: bool,
    /// With `--placement netns`: run the seed's speculation experiments (interfering
    /// datagrams, the fallback penalty, two senders, loss; clink over UDP; bandwidth and
    /// hit-rate rows with `experiment` and `variant` fields) instead of the system
    /// comparison. `--mtu` defaults to 1500 here.
    #[arg(long, conflicts_with_all = ["rma", "systems", "mode", "sizes", "lat_sizes", "bw_sizes"])]
    pub spec: bool,
    /// With `--spec`: bulk fragments each sender streams per run (default 100000, with
    /// --quick 5000), in messages of 1 MiB.
    #[arg(long, requires = "spec", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub fragments: Option<u64>,
    /// With `--rma`: only these experiments (word_rtt, dqueue_rate, put_bw,
    /// event_server); with `--spec`: only these (interference, fallback, two_senders,
    /// loss); with `--mpi`: only these (latency, bw, bw_cold, bibw, rate, allreduce).
    /// Comma-separated.
    #[arg(long, value_delimiter = ',', requires = "experiment_mode",
          value_parser = clap::builder::PossibleValuesParser::new(
              rma::EXPERIMENTS.iter().chain(spec::EXPERIMENTS).chain(mpi::EXPERIMENT_NAMES).copied()))]
    pub experiments: Vec<String>,
    /// The all-to-all experiment on `--hosts` hosts on a bridge (clink over UDP, clink
    /// over TCP, kernel TCP, or those `--systems` names; message size the first of
    /// `--bw-sizes`, default 256K; `--rounds` repetitions) instead of the system
    /// comparison.
    #[arg(long, conflicts_with_all = ["mode", "placement", "lat_sizes"])]
    pub alltoall: bool,
    /// With `--alltoall`: host counts, comma-separated (default 4,8).
    #[arg(long, value_delimiter = ',', requires = "alltoall",
          value_parser = clap::value_parser!(u64).range(2..=64))]
    pub hosts: Option<Vec<u64>>,
    /// With `--alltoall`: all-to-all exchanges per run (default 100, with --quick 10).
    #[arg(long, requires = "alltoall", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub exchanges: Option<u64>,
    /// Unmodified programs (sockperf, iperf3, redis, nginx + wrk) with both ends under the
    /// sockets layer (libclink_preload.so beside this executable) against kernel loopback
    /// TCP, `--rounds` rounds, instead of the system comparison.
    #[arg(long, conflicts_with_all = ["systems", "mode", "placement", "lat_sizes"])]
    pub sockets: bool,
    /// Open MPI on clink (pml cm, mtl ofi and the clink libfabric provider,
    /// libclink_fi.so beside this executable) against Open MPI's ob1/vader and ucx paths on
    /// one host (with `--placement bridge`: two hosts on a bridge, ob1 over tcp, per
    /// `--loss`): latency, bandwidth (from one buffer, as OSU's osu_bw, and from a buffer
    /// per message of the window), bidirectional bandwidth, message rate and allreduce,
    /// `--rounds` rounds, instead of the system comparison.
    #[arg(long, conflicts_with_all = ["systems", "mode", "lat_sizes"])]
    pub mpi: bool,
    /// Internal: one process of an `--alltoall` run.
    #[arg(long, hide = true)]
    pub alltoall_child: Option<String>,
    /// With `--rma`: client connections of the event-server experiment.
    #[arg(long, value_delimiter = ',', requires = "rma", default_values_t = [1u64, 10, 100, 1000],
          value_parser = clap::value_parser!(u64).range(1..=4000))]
    pub conns: Vec<u64>,
}

impl BenchArgs {
    /// The default run, as `clink bench` with no options (used by `clink demo`): the
    /// defaults declared on the arguments above, parsed from an empty command line.
    pub fn default_for_demo() -> Self {
        <BenchCli as clap::Parser>::parse_from(["bench"]).args
    }
}

/// `BenchArgs` as a command of its own (the defaults for the demo; the tests' parser).
#[derive(clap::Parser)]
struct BenchCli {
    #[command(flatten)]
    args: BenchArgs,
}

/// Role of a child process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Listens, prints its address, mirrors the client.
    Server,
    /// Connects and drives the plan, prints JSON rows.
    Client,
}

/// Arguments of the hidden child subcommand ([`CHILD_SUBCOMMAND`]).
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// Server or client.
    #[arg(long, value_enum)]
    pub role: Role,
    /// System name (one of [`systems`]).
    #[arg(long)]
    pub system: String,
    /// `busy` or `blocking`.
    #[arg(long)]
    pub mode: String,
    /// Encoded [`Plan`].
    #[arg(long)]
    pub plan: String,
    /// Server address (client only).
    #[arg(long)]
    pub addr: Option<String>,
    /// CPU to pin this process to.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Server only: the IP address to advertise (netns placement); IP systems
    /// then bind 0.0.0.0. Without it they bind 127.0.0.1.
    #[arg(long)]
    pub host_ip: Option<Ipv4Addr>,
}

/// Tells (on stderr) which namespace pair the next runs use; the CLI tests read these
/// lines to check that every pair is removed afterwards.
pub(crate) fn announce_pair(pair: &NetnsPair) {
    eprintln!(
        "network namespaces {} ({}) and {} ({}), veth MTU {}, TCP congestion control {}",
        pair.ns(0),
        pair.addr(0),
        pair.ns(1),
        pair.addr(1),
        pair.mtu(),
        pair.tcp_cc().unwrap_or_else(|e| format!("unknown ({e})"))
    );
}

/// `--experiments` names `given` must all be among `known` (of `mode`, for the message).
fn check_experiments(mode: &str, known: &[&str], given: &[String]) -> Result<(), String> {
    match given.iter().find(|e| !known.contains(&e.as_str())) {
        Some(e) => Err(format!(
            "--experiments {e}: not an experiment of {mode} ({})",
            known.join(", ")
        )),
        None => Ok(()),
    }
}

/// Prints a line for the reader: on stdout with the tables, on stderr beside `--json`
/// rows (stdout then holds only rows).
pub(crate) fn say(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// The blank line and, with several rounds, the note that opens a table of medians.
pub(crate) fn print_rounds_note(rounds: u64) {
    println!();
    if rounds > 1 {
        println!("(each cell: median over {rounds} interleaved rounds)");
    }
}

fn find_system(name: &str) -> Option<Box<dyn System>> {
    systems().into_iter().find(|s| s.name() == name)
}

/// Child entry point: runs one side of one system+mode.
pub fn run_child(args: ChildArgs) -> Result<(), String> {
    let mode = Mode::parse(&args.mode)?;
    let plan = Plan::decode(&args.plan)?;
    let system = find_system(&args.system)
        .ok_or_else(|| format!("unknown system {:?} in this build", args.system))?;
    if let Some(cpu) = args.cpu {
        affinity::pin_self(cpu).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
    }
    let name = system.name();
    match args.role {
        Role::Server => {
            let (addr, accept) = system
                .listen(mode, args.host_ip)
                .map_err(|e| format!("{name} server: listen failed: {e}"))?;
            if addr.contains('\n') {
                return Err(format!(
                    "{name} server: address contains a newline: {addr:?}"
                ));
            }
            let mut out = io::stdout().lock();
            writeln!(out, "{ADDR_PREFIX}{addr}")
                .and_then(|()| out.flush())
                .map_err(|e| format!("{name} server: cannot print address: {e}"))?;
            drop(out);
            let mut ch = accept().map_err(|e| format!("{name} server: accept failed: {e}"))?;
            measure::serve(ch.as_mut()).map_err(|e| format!("{name} server: {e}"))
        }
        Role::Client => {
            let addr = args
                .addr
                .as_deref()
                .ok_or_else(|| "client needs --addr".to_string())?;
            let mut ch = system
                .connect(mode, addr)
                .map_err(|e| format!("{name} client: connect to {addr:?} failed: {e}"))?;
            let label = measure::RowLabel {
                system: name,
                mode,
                pinned: args.cpu.is_some(),
            };
            let mut out = io::stdout().lock();
            measure::drive(ch.as_mut(), &label, &plan, &mut |row| {
                writeln!(out, "{}", row.to_json())?;
                out.flush()
            })
            .map_err(|e| format!("{name} client: {e}"))
        }
    }
}

/// Runs the server and client children of one system+mode and collects the
/// client's rows (on the host, or with `net` the server in namespace 0 and the
/// client in namespace 1), labelled with their placement.
fn run_pair(
    system: &str,
    mode: Mode,
    plan: &Plan,
    pinned: bool,
    timeout: Duration,
    net: Option<&NetnsPair>,
) -> Result<Vec<Row>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let deadline = Instant::now() + timeout;
    let encoded = plan.encode();
    let child_cmd = |role: &str, cpu: usize, addr: Option<&str>| {
        let mut cmd = match net {
            Some(n) => n.command(if role == "server" { 0 } else { 1 }, &exe),
            None => Command::new(&exe),
        };
        cmd.args([CHILD_SUBCOMMAND, "--role", role, "--system", system]);
        if let (Some(n), "server") = (net, role) {
            cmd.args(["--host-ip", &n.addr(0).to_string()]);
        }
        cmd.args(["--mode", mode.as_str(), "--plan", &encoded]);
        if pinned {
            cmd.args(["--cpu", &cpu.to_string()]);
        }
        if let Some(a) = addr {
            cmd.args(["--addr", a]);
        }
        cmd
    };
    let pin = |cpu| pinned.then_some(cpu);
    let label = format!("{system}/{mode} server");
    let mut server = ChildProc::spawn(
        &label,
        child_cmd("server", SERVER_CPU, None),
        pin(SERVER_CPU),
    )?;
    let addr = server.read_prefixed(ADDR_PREFIX, &label, "its address", deadline)?;
    let label = format!("{system}/{mode} client");
    let mut client = ChildProc::spawn(
        &label,
        child_cmd("client", CLIENT_CPU, Some(&addr)),
        pin(CLIENT_CPU),
    )?;
    let mut rows = Vec::new();
    let mut bad_line = None;
    while let Some(line) = client.read_line(deadline)? {
        match Row::from_json(&line) {
            Ok(row) => rows.push(row),
            Err(e) => {
                bad_line.get_or_insert(format!("{label}: {e}"));
            }
        }
    }
    let client_status = client.wait(deadline);
    let server_status = server.wait(deadline);
    client_status?;
    server_status?;
    if let Some(e) = bad_line {
        return Err(e);
    }
    // (Once: reading the namespaces' congestion control runs a process.)
    let at = Where::of(net);
    for row in &mut rows {
        label_placement(row, &at);
    }
    Ok(rows)
}

/// Where a run's rows were measured.
#[derive(Debug, Clone, PartialEq)]
struct Where {
    placement: &'static str,
    mtu: Option<u32>,
    loss_pct: Option<f64>,
    rate: Option<String>,
    /// The TCP congestion control of the namespaces (`None` on the host).
    tcp_cc: Option<String>,
}

impl Where {
    fn of(net: Option<&NetnsPair>) -> Where {
        match net {
            None => Where {
                placement: HOST_PLACEMENT,
                mtu: None,
                loss_pct: None,
                rate: None,
                tcp_cc: None,
            },
            Some(n) => {
                let bridge = n.bridge().map(|b| b.spec());
                Where {
                    placement: if bridge.is_some() {
                        BRIDGE_PLACEMENT
                    } else {
                        NETNS_PLACEMENT
                    },
                    mtu: Some(n.mtu()),
                    loss_pct: bridge.map(|s| s.loss_pct),
                    rate: bridge.and_then(|s| s.rate.clone()),
                    tcp_cc: n.tcp_cc().ok(),
                }
            }
        }
    }
}

/// Sets a row's `placement`, `mtu`, `loss_pct`, `rate` and `tcp_cc`, and names clink's
/// rows between namespaces after the transport its channel reported.
fn label_placement(row: &mut Row, at: &Where) {
    row.mtu = at.mtu;
    row.loss_pct = at.loss_pct;
    row.rate = at.rate.clone();
    row.tcp_cc = at.tcp_cc.clone();
    row.placement = at.placement.to_string();
    if at.mtu.is_none() {
        return;
    }
    if row.system == CLINK {
        row.system = if row.transport.starts_with("tcp") {
            CLINK_TCP.to_string()
        } else {
            "clink-udp".to_string()
        };
    }
    if let Some(cc) = own_tcp_cc(&row.system) {
        row.tcp_cc = Some(cc);
    }
}

/// The congestion control `system`'s TCP connections ran instead of the namespaces':
/// clink-tcp's where `CLINK_TCP_CC` (which the bench's clink processes inherit) names one.
pub(crate) fn own_tcp_cc(system: &str) -> Option<String> {
    own_cc(system, std::env::var("CLINK_TCP_CC").ok().as_deref())
}

/// [`own_tcp_cc`] with `CLINK_TCP_CC`'s value `var`.
fn own_cc(system: &str, var: Option<&str>) -> Option<String> {
    let cc = var.map(str::trim).filter(|cc| !cc.is_empty())?;
    (system == CLINK_TCP).then(|| cc.to_string())
}

/// Returns a short description of the machine load (from /proc/loadavg).
fn load_note() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let f: Vec<&str> = s.split_whitespace().take(3).collect();
            (f.len() == 3).then(|| format!("load average {} {} {}", f[0], f[1], f[2]))
        })
        .unwrap_or_else(|| "load average unknown".to_string())
}

fn build_plan(args: &BenchArgs) -> Result<Plan, String> {
    let mut plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    if let Some(s) = &args.sizes {
        let sizes = plan::parse_sizes(s)?;
        plan.lat_sizes = sizes.clone();
        plan.bw_sizes = sizes.into_iter().filter(|&s| s > 0).collect();
    }
    if let Some(s) = &args.lat_sizes {
        plan.lat_sizes = plan::parse_sizes(s)?;
    }
    if let Some(s) = &args.bw_sizes {
        plan.bw_sizes = plan::parse_sizes(s)?;
        if plan.bw_sizes.contains(&0) {
            return Err("bandwidth sizes must be positive".into());
        }
    }
    Ok(plan)
}

/// The systems to run, in order, validated against the registry. The default is every
/// system plus the external ones, except `clink-tcp` on the host (clink over loopback TCP: only when
/// named).
fn selected_systems(args: &BenchArgs) -> Result<Vec<String>, String> {
    let known: Vec<&'static str> = systems().iter().map(|s| s.name()).collect();
    let names: Vec<String> = match &args.systems {
        Some(list) => list.iter().map(|s| s.trim().to_string()).collect(),
        None => known
            .iter()
            .filter(|&&s| s != CLINK_TCP || args.placement != Placement::Host)
            .map(|s| s.to_string())
            .chain(EXTERNAL.iter().map(|s| s.to_string()))
            .collect(),
    };
    for name in &names {
        if !EXTERNAL.contains(&name.as_str()) && !known.contains(&name.as_str()) {
            return Err(format!(
                "unknown system {name:?}: this build has {}, {}",
                known.join(", "),
                EXTERNAL.join(", ")
            ));
        }
    }
    Ok(names)
}

/// The `--loss` percentages (default: none), checked.
fn losses(args: &BenchArgs) -> Result<Vec<f64>, String> {
    let losses = args.loss.clone().unwrap_or_else(|| vec![0.0]);
    match losses.iter().find(|l| !(0.0..=100.0).contains(*l)) {
        Some(l) => Err(format!("--loss {l}: not a percentage")),
        None => Ok(losses),
    }
}

/// Entry point of `clink bench`.
pub fn run(args: BenchArgs) -> Result<(), String> {
    if let Some(spec) = &args.alltoall_child {
        return alltoall::run_child(spec);
    }
    if args.tcp_cc.is_some() && (args.sockets || args.mpi || args.spec || args.rma) {
        return Err(
            "--tcp-cc applies to the comparison between namespaces and to --alltoall".into(),
        );
    }
    if args.sockets {
        return preload::run(args.rounds, args.quick, args.json);
    }
    if args.mpi {
        let losses = losses(&args)?;
        let mtu = match args.mtu.as_deref() {
            None => 1500,
            Some(&[m]) => m,
            Some(_) => return Err("--mpi takes one --mtu".into()),
        };
        let bridge = match args.placement {
            Placement::Host if args.loss.is_some() || args.mtu.is_some() => {
                return Err("--loss and --mtu apply to --placement bridge only".into())
            }
            Placement::Host => None,
            Placement::Bridge if args.rate.is_none() => Some((mtu, losses.as_slice())),
            Placement::Bridge => return Err("--mpi does not take --rate".into()),
            Placement::Netns => {
                return Err("--mpi runs on one host or with --placement bridge".into())
            }
        };
        check_experiments("--mpi", mpi::EXPERIMENT_NAMES, &args.experiments)?;
        return mpi::run(
            args.rounds,
            args.quick,
            args.json,
            bridge,
            &args.experiments,
        );
    }
    if args.alltoall {
        let hosts: Vec<usize> = args
            .hosts
            .clone()
            .unwrap_or_else(|| vec![4, 8])
            .into_iter()
            .map(|h| h as usize)
            .collect();
        let size = match &args.bw_sizes.as_ref().or(args.sizes.as_ref()) {
            Some(s) => *plan::parse_sizes(s)?
                .first()
                .filter(|&&n| n > 0)
                .ok_or("--alltoall needs a positive message size")?,
            None => 256 << 10,
        };
        let exchanges = args.exchanges.unwrap_or(if args.quick { 10 } else { 100 });
        let systems = alltoall::systems(args.systems.as_deref())?;
        return alltoall::run(
            &hosts,
            &systems,
            size,
            exchanges,
            args.rounds,
            args.json,
            args.tcp_cc.as_deref(),
        );
    }
    let pinned = !args.no_pin && affinity::can_pin_pair();
    if args.rma {
        check_experiments("--rma", &rma::EXPERIMENTS, &args.experiments)?;
        let conns: Vec<usize> = args.conns.iter().map(|&c| c as usize).collect();
        return rma::run(
            args.quick,
            args.json,
            pinned,
            args.rounds,
            &args.experiments,
            &conns,
        );
    }
    if args.spec {
        return run_spec(args, pinned);
    }
    let plan = build_plan(&args)?;
    let names = selected_systems(&args)?;
    let losses = losses(&args)?;
    let lossy = losses.iter().any(|&l| l > 0.0);
    let default_secs = if lossy { 600 } else { 120 };
    let timeout = Duration::from_secs(args.timeout_secs.unwrap_or(default_secs).max(1));
    let mut header = Vec::new();
    header.push(if pinned {
        format!(
            "clink bench: server pinned to CPU {SERVER_CPU}, client pinned to CPU {CLIENT_CPU} \
             (sched_setaffinity)"
        )
    } else if args.no_pin {
        "clink bench: NOT pinned (--no-pin)".to_string()
    } else {
        format!(
            "clink bench: NOT pinned (CPUs {SERVER_CPU} and {CLIENT_CPU} not both available; \
             {:?} allowed)",
            affinity::allowed_cpus()
        )
    });
    header.push(format!(
        "latency: ping-pong after warm-up, ~{} ms per size ({}..{} round trips); \
         bandwidth: {} reps of ~{} ms per size, receiver acks at the end",
        plan.lat_time.as_millis(),
        plan.lat_min_iters,
        plan.lat_max_iters,
        plan.bw_reps,
        plan.bw_rep_time.as_millis()
    ));
    header.push(
        "buffers: one per side per size, written before measuring and reused for every \
         message (sizes <= 1M stay cache-resident, larger ones are DRAM-sized)"
            .to_string(),
    );
    let mtus: Vec<u32> = args.mtu.clone().unwrap_or_else(|| match args.placement {
        Placement::Bridge => vec![1500],
        _ => DEFAULT_MTUS.to_vec(),
    });
    if args.placement != Placement::Bridge && (args.loss.is_some() || args.rate.is_some()) {
        return Err("--loss and --rate apply to --placement bridge only".into());
    }
    if args.placement == Placement::Host && args.tcp_cc.is_some() {
        return Err("--tcp-cc applies to --placement netns or bridge (and --alltoall)".into());
    }
    let slots: Vec<Option<BridgeSpec>> = match args.placement {
        Placement::Host => vec![None],
        p => {
            if let Some(why) = clink_testbed::unavailable() {
                return Err(format!("--placement {p:?}: {why}"));
            }
            let mut v = Vec::new();
            for &mtu in &mtus {
                for &loss_pct in &losses {
                    v.push(Some(BridgeSpec {
                        hosts: 2,
                        mtu,
                        loss_pct,
                        rate: args.rate.clone(),
                    }));
                    if p == Placement::Netns {
                        break; // one pair per MTU
                    }
                }
            }
            v
        }
    };
    header.push(match args.placement {
        Placement::Host => {
            "placement host: both sides on this host (IP over loopback, clink over shared \
             memory)"
                .to_string()
        }
        Placement::Netns => format!(
            "placement netns: for each veth MTU ({}) a fresh pair of network namespaces \
             joined by veth, server in namespace 0 (10.201.X.1), client in namespace 1 \
             (10.201.X.2), started with ip netns exec",
            mtus.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Placement::Bridge => format!(
            "placement bridge: for each MTU ({}) and loss ({}%) two fresh hosts (network \
             namespaces) on a Linux bridge, server on host 0 (10.202.X.1), client on host 1 \
             (10.202.X.2); loss dropped at random by nftables on the switch on the way into \
             each host{}",
            mtus.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            losses
                .iter()
                .map(f64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            args.rate
                .as_ref()
                .map(|r| format!(", each host's input limited to {r} (tbf)"))
                .unwrap_or_default()
        ),
    });
    // Under loss a repetition moves at least this much, so that it holds many losses and
    // whatever timeouts they cost (kernel TCP's are 200 ms and more).
    let lossy_rep_bytes = if args.quick { 32 << 20 } else { 128 << 20 };
    if lossy {
        header.push(format!(
            "under loss each bandwidth repetition moves at least {} MiB, however fast its \
             warm-up was",
            lossy_rep_bytes >> 20
        ));
    }
    header.push(load_note());
    for line in &header {
        say(args.json, line);
    }
    let mut ctx = RunCtx {
        plan,
        pinned,
        json: args.json,
        timeout,
        ucx_exe: ucx::find_perftest(),
        fabric_exe: fabric::find_pingpong(),
        rows: Vec::new(),
        errors: Vec::new(),
        notes: Vec::new(),
    };
    if args.placement == Placement::Host && args.mtu.is_some() {
        ctx.note("--mtu ignored: it applies to --placement netns only".into());
    }
    for round in 0..args.rounds {
        for slot in &slots {
            ctx.plan.bw_min_bytes = match slot {
                Some(spec) if spec.loss_pct > 0.0 => lossy_rep_bytes,
                _ => 0,
            };
            let net = match slot {
                None => None,
                Some(spec) => {
                    let made = if args.placement == Placement::Bridge {
                        NetnsPair::bridged(spec)
                    } else {
                        NetnsPair::create(spec.mtu)
                    };
                    let made = made.and_then(|pair| match &args.tcp_cc {
                        Some(cc) => pair.set_tcp_cc(cc).map(|()| pair),
                        None => Ok(pair),
                    });
                    match made {
                        Ok(pair) => {
                            announce_pair(&pair);
                            Some(pair)
                        }
                        Err(e) => {
                            ctx.errors.push(format!(
                                "MTU {} loss {}%: cannot make the namespaces: {e}",
                                spec.mtu, spec.loss_pct
                            ));
                            continue;
                        }
                    }
                }
            };
            for mode in args.mode.modes() {
                for name in &names {
                    run_one(name, mode, round, net.as_ref(), &mut ctx);
                }
            }
            // Dropping the pair deletes both namespaces.
            drop(net);
        }
    }
    if !args.json {
        print_rounds_note(args.rounds);
        print!("{}", report::render_table(&report::merge_rounds(&ctx.rows)));
    }
    for note in &ctx.notes {
        say(args.json, &format!("note: {note}"));
    }
    if ctx.errors.is_empty() {
        Ok(())
    } else {
        Err(format!("some runs failed:\n{}", ctx.errors.join("\n")))
    }
}

/// `clink bench --placement netns --spec`: checks the options, then [`spec::run`].
fn run_spec(args: BenchArgs, pinned: bool) -> Result<(), String> {
    if args.placement != Placement::Netns {
        return Err(
            "--spec runs between two network namespaces: add --placement netns".to_string(),
        );
    }
    check_experiments("--spec", spec::EXPERIMENTS, &args.experiments)?;
    spec::run(spec::Opts {
        json: args.json,
        pinned,
        rounds: args.rounds,
        experiments: args.experiments,
        mtus: args.mtu.unwrap_or_else(|| vec![1500]),
        fragments: args.fragments.unwrap_or(if args.quick {
            spec::QUICK_FRAGMENTS
        } else {
            spec::FRAGMENTS
        }),
        timeout: Duration::from_secs(args.timeout_secs.unwrap_or(120).max(1)),
    })
}

/// State shared by the runs of one `clink bench` invocation.
struct RunCtx {
    plan: Plan,
    pinned: bool,
    json: bool,
    timeout: Duration,
    ucx_exe: Option<std::path::PathBuf>,
    fabric_exe: Option<std::path::PathBuf>,
    rows: Vec<Row>,
    errors: Vec<String>,
    notes: Vec<String>,
}

impl RunCtx {
    fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Records rows of a finished run (printing them at once with --json).
    fn add_rows(&mut self, rows: Vec<Row>, round: u64) {
        for mut row in rows {
            row.round = round;
            if self.json {
                println!("{}", row.to_json());
            }
            self.rows.push(row);
        }
    }
}

/// Runs one system in one mode (on the host, or between the namespaces of
/// `net`), recording rows, notes or errors in `ctx`.
fn run_one(name: &str, mode: Mode, round: u64, net: Option<&NetnsPair>, ctx: &mut RunCtx) {
    if name == UNIX && net.is_some() {
        ctx.note(
            "unix: skipped in netns placement (Unix sockets do not cross network namespaces)"
                .into(),
        );
        return;
    }
    let at = Where::of(net);
    let place = match (&at.mtu, at.loss_pct) {
        (Some(m), Some(l)) => format!(", {} MTU {m} loss {l}%", at.placement),
        (Some(m), None) => format!(", {} MTU {m}", at.placement),
        _ => String::new(),
    };
    eprintln!("running {name}/{mode} (round {}{place}) ...", round + 1);
    if name == UCX {
        let Some(exe) = ctx.ucx_exe.clone() else {
            ctx.note(format!("ucx: skipped, {} not found in PATH", ucx::PERFTEST));
            return;
        };
        if mode != Mode::Busy {
            ctx.note(format!(
                "ucx: {mode} mode skipped (ucx_perftest only busy-polls)"
            ));
            return;
        }
        match ucx::run(&exe, &ctx.plan, ctx.pinned, net) {
            Ok((mut rows, tls)) => {
                ctx.note(format!("ucx: {} with {tls}", exe.display()));
                for row in &mut rows {
                    label_placement(row, &at);
                }
                ctx.add_rows(rows, round);
            }
            Err(e) => ctx.errors.push(format!("ucx/{mode}{place}: {e}")),
        }
        return;
    }
    if fabric::provider(name, net.is_some()).is_some() {
        let Some(exe) = ctx.fabric_exe.clone() else {
            ctx.note(format!(
                "{name}: skipped, {} not found in PATH",
                fabric::PINGPONG
            ));
            return;
        };
        if mode != Mode::Busy {
            ctx.note(format!(
                "{name}: {mode} mode skipped (fi_pingpong only busy-polls)"
            ));
            return;
        }
        match fabric::run(&exe, name, &ctx.plan, ctx.pinned, net) {
            Ok((mut rows, how)) => {
                ctx.note(format!("{name}: {how}; latency only (no streaming test)"));
                for row in &mut rows {
                    label_placement(row, &at);
                }
                ctx.add_rows(rows, round);
            }
            Err(e) => ctx.errors.push(format!("{name}/{mode}{place}: {e}")),
        }
        return;
    }
    match run_pair(name, mode, &ctx.plan, ctx.pinned, ctx.timeout, net) {
        Ok(rows) => ctx.add_rows(rows, round),
        Err(e) => ctx.errors.push(format!("{name}/{mode}{place}: {e}")),
    }
}

#[cfg(test)]
mod tests;
