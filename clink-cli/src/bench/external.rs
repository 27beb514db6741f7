//! What the external baselines (`ucx_perftest`, libfabric's `fi_pingpong`) share: finding
//! the tool, a free control port, and waiting until the server listens on it.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use clink_testbed::NetnsPair;

use super::affinity::{CLIENT_CPU, SERVER_CPU};
use super::proc::ChildProc;

/// Bound on a server starting to listen on its control port.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Full path of the program `name` if it is in `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A TCP port free on the host at the time of the call (the namespaces have ports of
/// their own, so it is free there too).
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free TCP port: {e}"))
}

/// Whether `/proc/net/tcp{,6}` text shows a socket listening on `port`.
pub fn is_listening(proc_net_tcp: &str, port: u16) -> bool {
    let want = format!("{port:04X}");
    proc_net_tcp.lines().skip(1).any(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let local_port = cols.get(1).and_then(|a| a.rsplit(':').next());
        local_port == Some(want.as_str()) && cols.get(3) == Some(&"0A")
    })
}

/// Waits (at most [`LISTEN_TIMEOUT`]) until `server` listens on TCP `port`, read from
/// `/proc/<pid>/net/tcp{,6}`: the server's own view, right in whatever network namespace
/// it runs. Fails (killing it) if it exits first or never listens.
pub fn wait_listening(server: &mut ChildProc, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    let pid = server.pid();
    loop {
        let text = ["tcp", "tcp6"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok())
            .collect::<Vec<_>>();
        if text.iter().any(|t| is_listening(t, port)) {
            return Ok(());
        }
        if server.has_exited() {
            let why = match server.wait(Instant::now()) {
                Ok(()) => "it exited with status 0".to_string(),
                Err(e) => e,
            };
            return Err(format!("not listening on port {port}: {why}"));
        }
        if Instant::now() >= deadline {
            server.kill();
            return Err(format!(
                "the server (pid {pid}) did not listen on port {port} within {LISTEN_TIMEOUT:?}"
            ));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// A command running `exe` on the host, or (with `net`) in namespace `side` (0: the
/// server's, 1: the client's).
pub fn command(net: Option<&NetnsPair>, side: usize, exe: &Path) -> Command {
    match net {
        Some(n) => n.command(side, exe),
        None => Command::new(exe),
    }
}

/// Runs `tool`'s server (pinned to the server CPU when `pinned`) until it listens on TCP
/// `port`, then its client (pinned to the client CPU) to its end, each bounded by
/// `timeout`. Returns the client's stdout and both processes' CPU seconds (`None` if
/// either was not reaped normally). A failing client's error carries its stdout (the
/// tools report some failures there only).
pub fn run_server_client(
    tool: &str,
    server: Command,
    client: Command,
    port: u16,
    pinned: bool,
    timeout: Duration,
) -> Result<(String, Option<f64>), String> {
    let pin = |cpu| pinned.then_some(cpu);
    let mut server = ChildProc::spawn(&format!("{tool} server"), server, pin(SERVER_CPU))?;
    wait_listening(&mut server, port)?;
    let mut client = ChildProc::spawn(&format!("{tool} client"), client, pin(CLIENT_CPU))?;
    let deadline = Instant::now() + timeout;
    let mut out = String::new();
    while let Some(line) = client.read_line(deadline)? {
        out.push_str(&line);
        out.push('\n');
    }
    client
        .wait(deadline)
        .map_err(|e| format!("{e}; its stdout:\n{}", out.trim_end()))?;
    server.wait(deadline)?;
    let cpu = client.cpu_secs().zip(server.cpu_secs()).map(|(c, s)| c + s);
    Ok((out, cpu))
}
