//! Receivers the source starts itself (`clink cast send --hosts`): one command per host
//! (`ssh {host}` unless `--via` says otherwise: `srun -w {host} -N1 -n1`, `ip netns exec
//! {host}`, ...) runs `clink cast recv` there; the first line it prints is the receiver's
//! address, and the chain follows the hosts' order. Whatever a receiver prints after that
//! is dropped (its report reaches the source through the chain); the lines of its
//! standard error go to the source's, after the host's name.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the receivers may take to print their addresses (connecting through ssh,
/// measuring their costs), all together.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the receivers may take to exit once the cast is over (each lingers at most
/// `REPORT_LINGER` after a failure), before they are killed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// What starts the receivers.
pub(super) struct Plan<'a> {
    /// The hosts, in chain order.
    pub hosts: &'a [String],
    /// The command that runs a program on a host: words for `sh`, `{host}` replaced by
    /// the host's name (quoted).
    pub via: &'a str,
    /// The path of `clink` on the hosts.
    pub clink: &'a str,
    /// Each receiver's output file, `{host}` replaced by the host's name.
    pub out: &'a str,
    /// Chunks in flight per hop.
    pub window: usize,
}

/// One started receiver.
struct Receiver {
    host: String,
    child: Child,
    /// The thread that passes its standard error on (it ends with the receiver).
    errors: Option<std::thread::JoinHandle<()>>,
}

/// The receivers started, killed by PID and reaped when dropped if still running.
pub(super) struct Receivers(Vec<Receiver>);

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Plan<'_> {
    /// The shell command that starts the receiver on `host`.
    fn command(&self, host: &str) -> String {
        let out = self.out.replace("{host}", host);
        // `exec`: the receiver's process (or the ssh client) is the child, killed by its
        // PID if the cast goes wrong.
        format!(
            "exec {} {} cast recv --out {} --window {}",
            self.via.replace("{host}", &quote(host)),
            quote(self.clink),
            quote(&out),
            self.window
        )
    }

    /// Starts a receiver on every host; returns them and their addresses in chain order.
    pub(super) fn start(&self) -> Result<(Receivers, Vec<String>), String> {
        let mut rx = Receivers(Vec::new());
        let (tx, lines) = mpsc::channel();
        for (i, host) in self.hosts.iter().enumerate() {
            let cmd = self.command(host);
            let mut child = Command::new("sh")
                .args(["-c", &cmd])
                // Not the source's: ssh would read a file cast from stdin.
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("host {host}: cannot run `{cmd}`: {e}"))?;
            let out = child.stdout.take().expect("piped");
            let err = child.stderr.take().expect("piped");
            let name = host.clone();
            let errors = std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("{name}: {line}");
                }
            });
            rx.0.push(Receiver {
                host: host.clone(),
                child,
                errors: Some(errors),
            });
            let tx = tx.clone();
            // The address, then the rest drained so that the receiver never blocks on a
            // full pipe.
            std::thread::spawn(move || {
                let mut lines = BufReader::new(out).lines();
                let first = lines.next().and_then(Result::ok);
                let _ = tx.send((i, first));
                for _ in lines.by_ref() {}
            });
        }
        drop(tx);
        let mut addrs: Vec<Option<String>> = vec![None; self.hosts.len()];
        let deadline = Instant::now() + START_TIMEOUT;
        while addrs.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok((i, line)) = lines.recv_timeout(left) else {
                let late: Vec<&str> = (0..addrs.len())
                    .filter(|&i| addrs[i].is_none())
                    .map(|i| self.hosts[i].as_str())
                    .collect();
                return Err(format!(
                    "no receiver address within {START_TIMEOUT:?} from {}",
                    late.join(", ")
                ));
            };
            let host = &self.hosts[i];
            let Some(line) = line else {
                let how = rx.0[i].child.wait().map_or("?".into(), |st| st.to_string());
                return Err(format!(
                    "host {host}: `{}` ended ({how}) before the receiver printed its address",
                    self.command(host)
                ));
            };
            let line = line.trim().to_string();
            if clink_proto::addr::Address::parse(&line).is_err() {
                return Err(format!(
                    "host {host}: `{}` printed {line:?}, not a clink address",
                    self.command(host)
                ));
            }
            addrs[i] = Some(line);
        }
        Ok((rx, addrs.into_iter().map(Option::unwrap).collect()))
    }
}

impl Receivers {
    /// Waits for every receiver to exit (they do once the cast is over), killing those
    /// still running after [`EXIT_TIMEOUT`]; returns the hosts whose command failed.
    pub(super) fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let mut failed = Vec::new();
        for r in &mut self.0 {
            let st = loop {
                match r.child.try_wait() {
                    Ok(Some(st)) => break Some(st),
                    Ok(None) if Instant::now() < deadline => {
                        // Polling for the exit only.
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    _ => break None,
                }
            };
            match st {
                Some(st) if st.success() => {}
                Some(st) => failed.push(format!("{} ({st})", r.host)),
                None => failed.push(format!("{} (still running: killed)", r.host)),
            }
        }
        failed
    }
}

impl Drop for Receivers {
    fn drop(&mut self) {
        for r in &mut self.0 {
            if let Ok(None) = r.child.try_wait() {
                let _ = r.child.kill();
            }
            let _ = r.child.wait();
            // What it said before it went, out before the source's own last words.
            if let Some(t) = r.errors.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_and_paths_reach_the_shell_quoted() {
        let hosts = ["n'1".to_string()];
        let p = Plan {
            hosts: &hosts,
            via: "ssh -o BatchMode=yes {host}",
            clink: "/opt/clink/bin/clink",
            out: "/data/my image.{host}",
            window: 6,
        };
        assert_eq!(
            p.command("n'1"),
            r"exec ssh -o BatchMode=yes 'n'\''1' '/opt/clink/bin/clink' cast recv --out '/data/my image.n'\''1' --window 6"
        );
        // What sh makes of it: the words as given.
        let out = Command::new("sh")
            .args(["-c", &p.command("n'1").replacen("exec", "printf '%s|'", 1)])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "ssh|-o|BatchMode=yes|n'1|/opt/clink/bin/clink|cast|recv|--out|/data/my image.n'1|--window|6|"
        );
    }
}
