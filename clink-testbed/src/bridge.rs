//! N network namespaces ("hosts") joined through one Linux bridge: a small cluster on one
//! machine, one switch hop between any two hosts (the shape of a real cluster switch),
//! with random loss and a rate limit on each host's input link where asked.
//!
//! The bridge lives in a namespace of its own (`<name>-sw`), so nothing is made in the
//! caller's namespace and deleting the namespaces removes everything: each host's `eth0`
//! is a veth whose other end (`p<i>`) is a port of `br0` there. Loss is dropped for real by
//! nftables on the switch (`numgen random`, per port, on the way to the host: every packet
//! the host receives crosses it, packet sockets included); the rate is a token bucket
//! (`tc ... tbf`) on the same port. Host `i` has `10.202.X.(i+1)/24`.
//!
//! Names start with `clink-br-<pid>-`: [`Bridge::create`] first deletes the namespaces
//! of earlier runs whose process is gone (a crashed test or benchmark), so nothing stays
//! behind.

use super::{fresh_names, run_ip, wait_up, CARRIER_TIMEOUT};
use std::ffi::OsStr;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

/// What to build.
#[derive(Clone, Debug, PartialEq)]
pub struct BridgeSpec {
    /// Number of hosts (2..=64).
    pub hosts: usize,
    /// MTU of every link.
    pub mtu: u32,
    /// Percentage of packets dropped at random on the way into each host (0: none).
    pub loss_pct: f64,
    /// Rate limit of each host's input link, in tc's syntax (`1gbit`, `500mbit`).
    pub rate: Option<String>,
}

impl Default for BridgeSpec {
    fn default() -> Self {
        BridgeSpec {
            hosts: 2,
            mtu: 1500,
            loss_pct: 0.0,
            rate: None,
        }
    }
}

/// Hosts on a bridge; deleted on drop.
#[derive(Debug)]
pub struct Bridge {
    ip: PathBuf,
    /// The hosts' namespaces, then the switch's.
    names: Vec<String>,
    /// How many of `names` exist (a half-made bridge cleans up what it made).
    made: usize,
    addrs: Vec<Ipv4Addr>,
    spec: BridgeSpec,
}

impl Bridge {
    /// Makes the namespaces, links, bridge, addresses, loss and rate of `spec`.
    pub fn create(spec: &BridgeSpec) -> io::Result<Bridge> {
        if !(2..=64).contains(&spec.hosts) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a bridge needs 2 to 64 hosts, not {}", spec.hosts),
            ));
        }
        if !(0.0..=100.0).contains(&spec.loss_pct) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("loss {}% is not a percentage", spec.loss_pct),
            ));
        }
        let (ip, base, _, x) = fresh_names("br-")?;
        let mut names: Vec<String> = (0..spec.hosts).map(|i| format!("{base}-h{i}")).collect();
        names.push(format!("{base}-sw"));
        let mut b = Bridge {
            ip,
            names,
            made: 0,
            addrs: (0..spec.hosts)
                .map(|i| Ipv4Addr::new(10, 202, x, i as u8 + 1))
                .collect(),
            spec: spec.clone(),
        };
        // On any error below, dropping `b` deletes the namespaces made so far.
        for name in b.names.clone() {
            b.run(&["netns", "add", &name])?;
            b.made += 1;
        }
        let sw = b.switch().to_string();
        let mtu = spec.mtu.to_string();
        b.run(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        b.run(&["-n", &sw, "link", "set", "br0", "mtu", &mtu, "up"])?;
        b.run(&["-n", &sw, "link", "set", "lo", "up"])?;
        for i in 0..spec.hosts {
            let (host, port) = (b.names[i].clone(), format!("p{i}"));
            b.run(&[
                "link", "add", "eth0", "netns", &host, "type", "veth", "peer", "name", &port,
                "netns", &sw,
            ])?;
            b.run(&[
                "-n", &sw, "link", "set", &port, "mtu", &mtu, "master", "br0", "up",
            ])?;
            let cidr = format!("{}/24", b.addrs[i]);
            b.run(&["-n", &host, "addr", "add", &cidr, "dev", "eth0"])?;
            b.run(&["-n", &host, "link", "set", "eth0", "mtu", &mtu, "up"])?;
            b.run(&["-n", &host, "link", "set", "lo", "up"])?;
            if let Some(rate) = &spec.rate {
                b.tc(&[
                    "qdisc", "add", "dev", &port, "root", "tbf", "rate", rate, "burst", "256kb",
                    "latency", "20ms",
                ])?;
            }
        }
        b.set_loss_all(spec.loss_pct)?;
        b.wait_carriers()?;
        Ok(b)
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.spec.hosts
    }

    /// What it was made with (the loss as last set).
    pub fn spec(&self) -> &BridgeSpec {
        &self.spec
    }

    /// Namespace of host `i`.
    pub fn ns(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// IPv4 address of host `i`.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.addrs[i]
    }

    /// Sets the TCP congestion control of every host ([`crate::set_tcp_cc`]).
    pub fn set_tcp_cc(&self, cc: &str) -> io::Result<()> {
        (0..self.hosts()).try_for_each(|i| crate::set_tcp_cc(self.ns(i), cc))
    }

    /// A command that runs `program` on host `i` (`ip netns exec <ns> program`).
    pub fn command(&self, i: usize, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(&self.ip);
        cmd.args(["netns", "exec"]).arg(&self.names[i]).arg(program);
        cmd
    }

    /// Writes an executable script for launchers that start remote daemons through an
    /// rsh-like agent (Open MPI's `plm_rsh_agent`): `SCRIPT ADDRESS COMMAND...` runs the
    /// command in the namespace of the host with that address (any of `hosts`), with
    /// `TMPDIR` a directory of that host's beside the script: the hosts share this
    /// machine's `/tmp` and host name, where Open MPI's daemons starting at once on two of
    /// them would race to make the same per-job temporary directory.
    pub fn write_rsh_agent(&self, path: &std::path::Path, hosts: &[usize]) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let base = path.parent().unwrap_or(std::path::Path::new("."));
        let mut script = String::from("#!/bin/sh\nhost=$1\nshift\ncase $host in\n");
        for &i in hosts {
            let tmp = base.join(format!("host{i}-tmp"));
            std::fs::create_dir_all(&tmp)?;
            script += &format!(
                "{}) ns={}; tmp='{}' ;;\n",
                self.addrs[i],
                self.names[i],
                tmp.display()
            );
        }
        script += "*) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\n";
        script += &format!(
            "exec {} netns exec \"$ns\" env TMPDIR=\"$tmp\" sh -c \"$*\"\n",
            self.ip.display()
        );
        std::fs::write(path, script)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
    }

    /// Drops `pct` percent of the packets into every host, at random (0: none).
    pub fn set_loss_all(&mut self, pct: f64) -> io::Result<()> {
        let ports: Vec<(usize, f64)> = (0..self.hosts()).map(|i| (i, pct)).collect();
        self.set_loss(&ports)?;
        self.spec.loss_pct = pct;
        Ok(())
    }

    /// Sets the random loss into each listed host (host, percentage); the others lose
    /// nothing. One nftables table on the switch, replaced whole.
    pub fn set_loss(&self, ports: &[(usize, f64)]) -> io::Result<()> {
        let mut rules = String::new();
        for &(i, pct) in ports.iter().filter(|(_, p)| *p > 0.0) {
            // Per ten thousand: 0.01% steps.
            let n = (pct * 100.0).round().clamp(1.0, 10_000.0) as u32;
            rules.push_str(&format!(
                "    oifname \"p{i}\" numgen random mod 10000 < {n} counter drop\n"
            ));
        }
        let _ = self.nft("delete table bridge clink\n");
        if rules.is_empty() {
            return Ok(());
        }
        self.nft(&format!(
            "table bridge clink {{\n  chain forward {{\n    type filter hook forward \
             priority 0; policy accept;\n{rules}  }}\n}}\n"
        ))
    }

    /// Cuts host `i` off (its switch port goes down: its packets vanish without a trace,
    /// as behind a pulled cable), or reconnects it.
    pub fn set_cut(&self, i: usize, cut: bool) -> io::Result<()> {
        let port = format!("p{i}");
        self.run(&[
            "-n",
            self.switch(),
            "link",
            "set",
            &port,
            if cut { "down" } else { "up" },
        ])
    }

    /// Packets the loss rules dropped so far, over all hosts.
    pub fn dropped(&self) -> io::Result<u64> {
        let out = Command::new(&self.ip)
            .args([
                "netns",
                "exec",
                self.switch(),
                "nft",
                "list",
                "table",
                "bridge",
                "clink",
            ])
            .stderr(Stdio::null())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut total = 0;
        let mut words = text.split_whitespace();
        while let Some(w) = words.next() {
            if w == "packets" {
                total += words
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(total)
    }

    fn switch(&self) -> &str {
        &self.names[self.spec.hosts]
    }

    fn run(&self, args: &[&str]) -> io::Result<()> {
        run_ip(&self.ip, args)
    }

    fn tc(&self, args: &[&str]) -> io::Result<()> {
        let out = Command::new(&self.ip)
            .args(["netns", "exec", self.switch(), "tc"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run tc: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "`tc {}` failed: {} (is iproute2's tc with sch_tbf available?)",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    fn nft(&self, script: &str) -> io::Result<()> {
        let mut child = Command::new(&self.ip)
            .args(["netns", "exec", self.switch(), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run nft: {e}")))?;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(script.as_bytes())?;
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "nft failed: {} (the nftables package provides it)",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    fn wait_carriers(&self) -> io::Result<()> {
        let deadline = Instant::now() + CARRIER_TIMEOUT;
        for i in 0..self.hosts() {
            wait_up(&self.ip, &self.names[i], "eth0", deadline)?;
        }
        Ok(())
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for name in &self.names[..self.made] {
            if let Err(e) = run_ip(&self.ip, &["netns", "del", name]) {
                tracing::warn!(ns = %name, error = %e, "cannot delete netns");
            }
        }
        self.made = 0;
    }
}
