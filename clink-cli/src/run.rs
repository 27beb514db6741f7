//! `clink run -- PROGRAM ARGS`: runs an unmodified program with the sockets layer
//! (`libclink_preload.so`) loaded, so that its TCP connections to other processes on this
//! host that also run under clink move onto shared-memory rings.

use clap::Args;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `clink run`.
#[derive(Args)]
pub struct RunArgs {
    /// After the program exits, print which connections were accelerated and why the
    /// others were not (one line per connection, from every process of the program).
    #[arg(long)]
    stats: bool,
    /// Microseconds a blocking call spins on a ring before it sleeps (CLINK_SOCKETS_SPIN_US).
    #[arg(long)]
    spin_us: Option<u64>,
    /// The sockets layer library (default: libclink_preload.so beside this executable,
    /// or CLINK_PRELOAD_LIB).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Where the library is: `--lib`, `CLINK_PRELOAD_LIB`, or beside the running executable.
pub fn library(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let path = match explicit.or_else(|| std::env::var_os("CLINK_PRELOAD_LIB").map(PathBuf::from)) {
        Some(p) => p,
        None => {
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
            exe.parent()
                .map(|d| d.join("libclink_preload.so"))
                .ok_or("this executable has no directory")?
        }
    };
    if !path.is_file() {
        return Err(format!(
            "the sockets layer library {} does not exist (build it with `cargo build --release -p clink-preload`, or pass --lib)",
            path.display()
        ));
    }
    path.canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `clink run`.
pub fn run(args: RunArgs) -> Result<(), String> {
    let lib = library(args.lib)?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", lib.display()),
        _ => lib.display().to_string(),
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]).env("LD_PRELOAD", preload);
    if let Some(us) = args.spin_us {
        cmd.env("CLINK_SOCKETS_SPIN_US", us.to_string());
    }
    if !args.stats {
        // The program takes this process's place (same PID, signals and exit status).
        let e = cmd.exec();
        return Err(format!("{}: {e}", args.command[0]));
    }
    let stats = std::env::temp_dir().join(format!("clink-run-stats-{}", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    cmd.env("CLINK_SOCKETS_STATS", &stats);
    let status = cmd
        .status()
        .map_err(|e| format!("{}: {e}", args.command[0]))?;
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    let _ = std::fs::remove_file(&stats);
    let accelerated = text.lines().filter(|l| l.contains(": accelerated")).count();
    let total = text.lines().count();
    eprintln!("clink run: {accelerated} of {total} TCP connection ends accelerated");
    for l in text.lines() {
        eprintln!("  {l}");
    }
    std::process::exit(status.code().unwrap_or(128 + status.signal_or_zero()));
}

trait SignalOrZero {
    fn signal_or_zero(&self) -> i32;
}

impl SignalOrZero for std::process::ExitStatus {
    fn signal_or_zero(&self) -> i32 {
        std::os::unix::process::ExitStatusExt::signal(self).unwrap_or(0)
    }
}
