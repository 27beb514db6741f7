//! The `clink` command-line tool: `bench`, `info`, `demo`, `cast`, `run`.
//!
//! No unsafe code: system calls go through `clink::sys` and rustix.
#![forbid(unsafe_code)]

mod bench;
mod cast;
mod demo;
mod info;
mod run;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "clink",
    version,
    about = "clink: user-level zero-copy communication; tools and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Latency and bandwidth between two processes: clink vs kernel sockets and UCX.
    Bench(bench::BenchArgs),
    /// Configuration, measured costs and the thresholds chosen from them, and why.
    Info,
    /// The main job: two processes exchange checked messages, then the benchmark table.
    Demo(demo::DemoArgs),
    /// Streams a file to many hosts through a chain that stores and forwards (Dolly).
    Cast(cast::CastArgs),
    /// Runs an unmodified program with its same-host TCP connections on clink's
    /// shared-memory path (the sockets layer, libclink_preload.so).
    Run(run::RunArgs),
    /// Internal: one side of a benchmark run (spawned by `clink bench`).
    #[command(name = "bench-child", hide = true)]
    BenchChild(bench::ChildArgs),
    /// Internal: one process of a `clink bench --spec` run.
    #[command(name = bench::spec::CHILD_SUBCOMMAND, hide = true)]
    BenchSpecChild(bench::spec::ChildArgs),
    /// Internal: the second process of `clink demo`.
    #[command(name = "demo-peer", hide = true)]
    DemoPeer {
        /// Address of the first process's endpoint.
        addr: String,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Bench(args) => bench::run(args),
        Cmd::BenchChild(args) => bench::run_child(args),
        Cmd::BenchSpecChild(args) => bench::spec::run_child(args),
        Cmd::Info => info::run(),
        Cmd::Demo(args) => demo::run(args),
        Cmd::Cast(args) => cast::run(args),
        Cmd::Run(args) => run::run(args),
        Cmd::DemoPeer { addr } => demo::peer(&addr),
    };
    if let Err(e) = result {
        eprintln!("clink: {e}");
        std::process::exit(1);
    }
}
