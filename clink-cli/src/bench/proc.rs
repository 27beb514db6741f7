//! Child processes with bounded waits.
//!
//! Every wait takes a deadline; a child that misses it is killed by PID and
//! reaped. A [`ChildProc`] that is dropped while its process still runs kills
//! and reaps it too, and every child gets `PR_SET_PDEATHSIG = SIGKILL`, so no
//! benchmark process outlives the harness.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::affinity::spawn_pinned;

/// Bytes of a child's stderr kept for error messages.
const STDERR_TAIL: usize = 4096;
/// Bound on waiting for a dead child's stderr to be drained.
const STDERR_DRAIN: Duration = Duration::from_millis(200);
/// Poll interval while waiting for a child to exit.
const EXIT_POLL: Duration = Duration::from_millis(1);

enum StdoutEvent {
    Line(String),
    Eof,
    Failed(io::Error),
}

/// A spawned child whose stdout is read line by line and whose stderr tail
/// is kept.
pub struct ChildProc {
    name: String,
    child: Child,
    lines: Receiver<StdoutEvent>,
    stdout_done: bool,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    stderr_reader: Option<thread::JoinHandle<()>>,
    reaped: Option<ExitStatus>,
    /// CPU seconds (user + system, all its threads) the child used, read when it was
    /// reaped by [`ChildProc::wait`] or [`ChildProc::has_exited`] (not after a kill).
    cpu_secs: Option<f64>,
}

impl ChildProc {
    /// Spawns `cmd` (pinned to `cpu` if given) with piped stdout and stderr.
    /// `name` labels the child in error messages.
    pub fn spawn(name: &str, mut cmd: Command, cpu: Option<usize>) -> Result<ChildProc, String> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        clink::sys::die_with_parent(&mut cmd);
        let mut child = spawn_pinned(&mut cmd, cpu)
            .map_err(|e| format!("{name}: cannot start {:?}: {e}", cmd.get_program()))?;
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{name}: child pipes missing"));
        };
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let event = match line {
                    Ok(l) => StdoutEvent::Line(l),
                    Err(e) => StdoutEvent::Failed(e),
                };
                let failed = matches!(event, StdoutEvent::Failed(_));
                if tx.send(event).is_err() || failed {
                    return;
                }
            }
            let _ = tx.send(StdoutEvent::Eof);
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr);
        let stderr_reader = thread::spawn(move || {
            let mut err = err;
            let mut chunk = [0u8; 1024];
            while let Ok(n) = err.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                if let Ok(mut t) = tail.lock() {
                    t.extend(&chunk[..n]);
                    let excess = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..excess);
                }
            }
        });
        Ok(ChildProc {
            name: name.to_string(),
            child,
            lines,
            stdout_done: false,
            stderr,
            stderr_reader: Some(stderr_reader),
            reaped: None,
            cpu_secs: None,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last bytes the child wrote to stderr, as text.
    pub fn stderr_tail(&self) -> String {
        match self.stderr.lock() {
            Ok(t) => String::from_utf8_lossy(&t.iter().copied().collect::<Vec<u8>>())
                .trim()
                .to_string(),
            Err(_) => String::new(),
        }
    }

    fn describe(&mut self, what: &str) -> String {
        if self.reaped.is_some() {
            // The child is gone: give its stderr reader a moment (bounded) to
            // drain the pipe so the message shows the child's last words.
            let until = Instant::now() + STDERR_DRAIN;
            while let Some(h) = &self.stderr_reader {
                if h.is_finished() || Instant::now() >= until {
                    break;
                }
                thread::sleep(EXIT_POLL);
            }
        }
        let tail = self.stderr_tail();
        if tail.is_empty() {
            format!("{} (pid {}): {what}", self.name, self.pid())
        } else {
            format!(
                "{} (pid {}): {what}; its stderr ends with:\n{tail}",
                self.name,
                self.pid()
            )
        }
    }

    /// Next stdout line, or `None` at end of stream. Kills the child and
    /// fails if nothing arrives before `deadline`.
    pub fn read_line(&mut self, deadline: Instant) -> Result<Option<String>, String> {
        if self.stdout_done {
            return Ok(None);
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(StdoutEvent::Line(l)) => Ok(Some(l)),
            Ok(StdoutEvent::Eof) | Err(RecvTimeoutError::Disconnected) => {
                self.stdout_done = true;
                Ok(None)
            }
            Ok(StdoutEvent::Failed(e)) => {
                self.stdout_done = true;
                Err(self.describe(&format!("reading its output failed: {e}")))
            }
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Err(self.describe("no output before the deadline; killed"))
            }
        }
    }

    /// Reads lines until one starts with `prefix` and returns the rest (a server's
    /// address, a child's result); an error naming `who` and `what` it never printed when
    /// the child ends first or `deadline` passes.
    pub fn read_prefixed(
        &mut self,
        prefix: &str,
        who: &str,
        what: &str,
        deadline: Instant,
    ) -> Result<String, String> {
        loop {
            match self.read_line(deadline)? {
                Some(line) => {
                    if let Some(a) = line.strip_prefix(prefix) {
                        return Ok(a.to_string());
                    }
                }
                None => {
                    let status = self.wait(deadline);
                    return Err(format!(
                        "{who} ended without printing {what} ({})",
                        status.err().unwrap_or_else(|| "exit 0".into())
                    ));
                }
            }
        }
    }

    /// Waits for the child to exit until `deadline`, then kills it and fails.
    /// A non-zero exit is an error carrying the stderr tail.
    pub fn wait(&mut self, deadline: Instant) -> Result<(), String> {
        let status = loop {
            match self.try_reap() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() >= deadline => {
                    self.kill();
                    return Err(self.describe("did not exit in time; killed"));
                }
                Ok(None) => thread::sleep(EXIT_POLL),
                Err(e) => {
                    self.kill();
                    return Err(self.describe(&format!("wait failed: {e}")));
                }
            }
        };
        if status.success() {
            Ok(())
        } else {
            Err(self.describe(&format!("exited with {status}")))
        }
    }

    /// Whether the child has already exited (reaping it if so).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.try_reap(), Ok(Some(_)))
    }

    /// The CPU seconds the child used (user + system, every thread), known once
    /// [`ChildProc::wait`] or [`ChildProc::has_exited`] reaped it.
    pub fn cpu_secs(&self) -> Option<f64> {
        self.cpu_secs
    }

    /// Reaps the child if it has exited, with `wait4` so that its resource usage
    /// comes along (`std`'s `try_wait` drops it).
    fn try_reap(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.reaped {
            return Ok(Some(s));
        }
        Ok(clink::sys::try_reap(&self.child)?.map(|(s, cpu)| {
            self.cpu_secs = Some(cpu);
            self.reaped = Some(s);
            s
        }))
    }

    /// Kills the child by PID (if still running) and reaps it.
    pub fn kill(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            if let Ok(s) = self.child.wait() {
                self.reaped = Some(s);
            }
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lines_and_reaps() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one; echo two; echo oops >&2; exit 3"]);
        let mut p = ChildProc::spawn("sh", cmd, None).expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(p.read_line(deadline), Ok(Some("one".into())));
        assert_eq!(p.read_line(deadline), Ok(Some("two".into())));
        assert_eq!(p.read_line(deadline), Ok(None));
        let err = p.wait(deadline).expect_err("exit 3");
        assert!(err.contains("oops") || err.contains("exit"), "{err}");
    }

    #[test]
    fn reaping_reads_the_childs_cpu_time() {
        // A child that burns about 0.2 s of CPU, then exits.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"]);
        let mut p = ChildProc::spawn("sh", cmd, None).expect("spawn");
        assert_eq!(p.cpu_secs(), None);
        p.wait(Instant::now() + Duration::from_secs(60))
            .expect("exit 0");
        let cpu = p.cpu_secs().expect("read at the reap");
        assert!(cpu > 0.01 && cpu < 30.0, "{cpu} s");
    }

    #[test]
    fn timeout_kills() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut p = ChildProc::spawn("sleep", cmd, None).expect("spawn");
        let start = Instant::now();
        let err = p
            .read_line(Instant::now() + Duration::from_millis(50))
            .expect_err("timeout");
        assert!(err.contains("deadline"), "{err}");
        assert!(p.has_exited());
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
