//! Network namespaces as "hosts" on one machine, for clink's tests and benchmarks: two joined by
//! a veth pair ([`NetnsPair`]), or several on a Linux bridge with loss and rate limits
//! ([`Bridge`]). The pair:
//!
//! [`NetnsPair::create`] runs iproute2 (`ip netns add`, `ip link add ... type veth`, ...)
//! and needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN). Names are unique per call
//! (`clink-<pid>-<random>-0` and `-1`), so tests running in parallel do not collide; the
//! two ends get `10.201.X.1/24` (side 0) and `10.201.X.2/24` (side 1), with X (1..=250)
//! taken from the random suffix (the addresses live inside the namespaces, so equal X in
//! two pairs is harmless). Both veth ends and both `lo` are up, the veth MTU is the one
//! asked for, and `create` returns once both ends have their carrier. Dropping the pair deletes both namespaces (the veth pair goes with them);
//! a creation that fails half-way removes what it made.
//!
//! Processes are placed in a namespace with [`NetnsPair::command`], which wraps
//! `ip netns exec <ns> <program>`: `ip` switches namespace and then execs the program,
//! so the spawned process *is* the program (its PID, CPU affinity and parent-death signal
//! are the program's).
//!
//! Where namespaces cannot be made (not root, no `ip`, a sandbox refusing `unshare`),
//! [`unavailable`] says why, so callers can skip with a message:
//!
//! ```no_run
//! if let Some(why) = clink_testbed::unavailable() {
//!     eprintln!("skipped: {why}");
//!     return;
//! }
//! let pair = clink_testbed::NetnsPair::create(1500).expect("netns pair");
//! let mut server = pair.command(0, "my-server");
//! server.arg(pair.addr(0).to_string());
//! ```
//!
//! `NetnsPair` is `Send + Sync` (names and addresses only); it has no state that needs
//! a lock.

mod bridge;
mod tcp_cc;

pub use bridge::{Bridge, BridgeSpec};
pub use tcp_cc::{allowed_tcp_cc, set_tcp_cc, tcp_cc};

use clink::sys;
use std::ffi::OsStr;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Prefix of every namespace this module creates.
pub const NAME_PREFIX: &str = "clink-";

/// Bound on a new veth pair's carrier coming on ([`NetnsPair::create`]).
const CARRIER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where `ip` is looked for when it is not in `PATH`.
const IP_FALLBACKS: [&str; 3] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"];

/// Two network namespaces joined by a veth pair; deleted on drop.
#[derive(Debug)]
pub struct NetnsPair {
    ip: PathBuf,
    names: [String; 2],
    /// Which namespaces exist (so a half-made pair cleans up only what it made).
    made: [bool; 2],
    addrs: [Ipv4Addr; 2],
    mtu: u32,
    /// Hosts 0 and 1 of a bridge instead of a veth pair ([`NetnsPair::bridged`]).
    bridge: Option<Bridge>,
}

impl NetnsPair {
    /// Makes the two namespaces, the veth pair between them, addresses, MTU, links up.
    pub fn create(mtu: u32) -> io::Result<NetnsPair> {
        let (ip, base, rand, x) = fresh_names("")?;
        let mut pair = NetnsPair {
            ip,
            names: [format!("{base}-0"), format!("{base}-1")],
            made: [false, false],
            addrs: [Ipv4Addr::new(10, 201, x, 1), Ipv4Addr::new(10, 201, x, 2)],
            mtu,
            bridge: None,
        };
        // On any error below, dropping `pair` deletes the namespaces made so far.
        for side in 0..2 {
            let name = pair.names[side].clone();
            pair.ip_cmd(&["netns", "add", &name])?;
            pair.made[side] = true;
        }
        // Device names are per namespace; keep them short (IFNAMSIZ) and unique anyway.
        let dev = [format!("ck{rand:08x}a"), format!("ck{rand:08x}b")];
        let [ns0, ns1] = pair.names.clone();
        pair.ip_cmd(&[
            "link", "add", &dev[0], "netns", &ns0, "type", "veth", "peer", "name", &dev[1],
            "netns", &ns1,
        ])?;
        let mtu_text = mtu.to_string();
        for (side, dev) in dev.iter().enumerate() {
            let ns = pair.names[side].clone();
            let cidr = format!("{}/24", pair.addrs[side]);
            pair.ip_cmd(&["-n", &ns, "addr", "add", &cidr, "dev", dev])?;
            pair.ip_cmd(&["-n", &ns, "link", "set", "dev", dev, "mtu", &mtu_text])?;
            pair.ip_cmd(&["-n", &ns, "link", "set", "dev", dev, "up"])?;
            pair.ip_cmd(&["-n", &ns, "link", "set", "dev", "lo", "up"])?;
        }
        pair.wait_carrier(&dev)?;
        Ok(pair)
    }

    /// Waits (at most [`CARRIER_TIMEOUT`]) until both veth ends have their carrier. The
    /// kernel turns it on asynchronously (link-watch work), some time after both ends are
    /// up; until then the link's state is DOWN. Sockets do not mind, but a program that
    /// lists the running interfaces does: UCX's tcp transport, started at once, saw only
    /// `lo` and could not reach the other side.
    fn wait_carrier(&self, dev: &[String; 2]) -> io::Result<()> {
        let deadline = Instant::now() + CARRIER_TIMEOUT;
        for (side, dev) in dev.iter().enumerate() {
            wait_up(&self.ip, &self.names[side], dev, deadline)?;
        }
        Ok(())
    }

    /// Two hosts of a [`Bridge`] made from `spec` (its `hosts` is taken as 2), used
    /// wherever a pair is: one switch hop apart, with the spec's loss and rate.
    pub fn bridged(spec: &BridgeSpec) -> io::Result<NetnsPair> {
        let b = Bridge::create(&BridgeSpec {
            hosts: 2,
            ..spec.clone()
        })?;
        Ok(NetnsPair {
            ip: ip_binary().unwrap_or_default(),
            names: [b.ns(0).to_string(), b.ns(1).to_string()],
            made: [false, false], // the bridge deletes its own
            addrs: [b.addr(0), b.addr(1)],
            mtu: spec.mtu,
            bridge: Some(b),
        })
    }

    /// The bridge behind the pair, if it is one ([`NetnsPair::bridged`]).
    pub fn bridge(&self) -> Option<&Bridge> {
        self.bridge.as_ref()
    }

    /// Name of namespace `side` (0 or 1). Panics on any other side.
    pub fn ns(&self, side: usize) -> &str {
        &self.names[side]
    }

    /// IPv4 address of the veth end in namespace `side` (0 or 1). Panics on any other side.
    pub fn addr(&self, side: usize) -> Ipv4Addr {
        self.addrs[side]
    }

    /// The MTU of both veth ends.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The TCP congestion control of side 0's namespace ([`tcp_cc`]; both sides have the
    /// same unless set apart).
    pub fn tcp_cc(&self) -> io::Result<String> {
        tcp_cc(&self.names[0])
    }

    /// Sets the TCP congestion control of both namespaces ([`set_tcp_cc`]).
    pub fn set_tcp_cc(&self, cc: &str) -> io::Result<()> {
        self.names.iter().try_for_each(|ns| set_tcp_cc(ns, cc))
    }

    /// A command that runs `program` inside namespace `side`: `ip netns exec <ns> program`.
    /// Add the program's arguments, environment and stdio to it as usual.
    pub fn command(&self, side: usize, program: impl AsRef<OsStr>) -> Command {
        if let Some(b) = &self.bridge {
            return b.command(side, program);
        }
        let mut cmd = Command::new(&self.ip);
        cmd.args(["netns", "exec"])
            .arg(&self.names[side])
            .arg(program);
        cmd
    }

    /// Runs `ip ARGS`, failing with its stderr on a non-zero exit.
    fn ip_cmd(&self, args: &[&str]) -> io::Result<()> {
        run_ip(&self.ip, args)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for side in 0..2 {
            if self.made[side] {
                // Deleting the namespace destroys the veth end in it, and with it the pair.
                if let Err(e) = run_ip(&self.ip, &["netns", "del", &self.names[side]]) {
                    tracing::warn!(ns = %self.names[side], error = %e, "cannot delete netns");
                }
                self.made[side] = false;
            }
        }
    }
}

fn run_ip(ip: &Path, args: &[&str]) -> io::Result<()> {
    run_ip_output(ip, args).map(drop)
}

/// Runs `ip ARGS` and returns its stdout, failing with its stderr on a non-zero exit.
fn run_ip_output(ip: &Path, args: &[&str]) -> io::Result<String> {
    let out = Command::new(ip)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {}: {e}", ip.display())))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Waits until `dev` in namespace `ns` is operationally up (has its carrier), failing
/// after `deadline`. Polls `ip -o link show`: the kernel sends no event to wait on here.
fn wait_up(ip: &Path, ns: &str, dev: &str, deadline: Instant) -> io::Result<()> {
    loop {
        let args = ["-n", ns, "-o", "link", "show", "dev", dev];
        if link_state(&run_ip_output(ip, &args)?) == Some("UP") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{dev} in {ns} had no carrier after {CARRIER_TIMEOUT:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What making namespaces starts with: the `ip` program, the namespaces of crashed runs
/// removed ([`remove_stale`]), a fresh name stem `clink-<kind><pid>-<random>`, the random
/// number, and the third byte X of the addresses (1..=250) taken from it.
fn fresh_names(kind: &str) -> io::Result<(PathBuf, String, u32, u8)> {
    let ip = require_ip()?;
    remove_stale(&ip);
    let rand = sys::random_u128().map(|r| r as u32)?;
    let base = format!("{NAME_PREFIX}{kind}{}-{rand:08x}", std::process::id());
    Ok((ip, base, rand, (rand % 250 + 1) as u8))
}

/// Deletes the namespaces this module made in processes that are gone (a crashed test or
/// benchmark): names `clink-[br-|probe-]<pid>-...` whose pid has no `/proc` entry.
fn remove_stale(ip: &Path) {
    let Ok(list) = run_ip_output(ip, &["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if let Some(pid) = owner_pid(name) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                tracing::info!(ns = %name, "deleting a namespace left by process {pid}");
                let _ = run_ip(ip, &["netns", "del", name]);
            }
        }
    }
}

/// The pid in a namespace name this module makes, if it is one.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let rest = rest
        .strip_prefix("br-")
        .or_else(|| rest.strip_prefix("probe-"))
        .unwrap_or(rest);
    let (pid, tail) = rest.split_once('-')?;
    (!tail.is_empty()).then_some(())?;
    pid.parse().ok()
}

/// The operational state in one line of `ip -o link show` (`UP`, `DOWN`, ...).
fn link_state(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    words.find(|&w| w == "state")?;
    words.next()
}

/// [`ip_binary`], or an error saying it is not installed.
fn require_ip() -> io::Result<PathBuf> {
    ip_binary().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the `ip` program (iproute2) is not installed",
        )
    })
}

/// Full path of iproute2's `ip`: from `PATH`, else the usual sbin locations.
pub fn ip_binary() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("ip"))
            .find(|p| p.is_file())
    });
    from_path.or_else(|| IP_FALLBACKS.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// Why network namespaces cannot be made here, or `None` if they can (a probe namespace
/// was created and deleted). The answer is computed once per process.
pub fn unavailable() -> Option<String> {
    static ANSWER: OnceLock<Option<String>> = OnceLock::new();
    ANSWER.get_or_init(probe).clone()
}

fn probe() -> Option<String> {
    let Some(ip) = ip_binary() else {
        return Some(
            "network namespaces unavailable: the `ip` program (iproute2) is not \
                     installed"
                .into(),
        );
    };
    let uid = sys::geteuid();
    if uid != 0 {
        return Some(format!(
            "network namespaces unavailable: they need root, this process runs as uid {uid}"
        ));
    }
    let name = match sys::random_u128().map(|r| r as u32) {
        Ok(r) => format!("{NAME_PREFIX}probe-{}-{r:08x}", std::process::id()),
        Err(e) => {
            return Some(format!(
                "network namespaces unavailable: no randomness: {e}"
            ))
        }
    };
    if let Err(e) = run_ip(&ip, &["netns", "add", &name]) {
        return Some(format!("network namespaces unavailable: {e}"));
    }
    if let Err(e) = run_ip(&ip, &["netns", "del", &name]) {
        return Some(format!(
            "network namespaces unavailable: made {name} but cannot delete it: {e}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::sync::Mutex;

    /// The tests look at `ip netns list`, so they run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// A test's turn (see [`SERIAL`]), after checking that namespaces can be made here.
    fn netns_turn() -> std::sync::MutexGuard<'static, ()> {
        let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = unavailable() {
            panic!("this test needs network namespaces: {why}");
        }
        turn
    }

    #[test]
    fn stale_names_give_their_owner() {
        assert_eq!(owner_pid("clink-123-0000abcd-0"), Some(123));
        assert_eq!(owner_pid("clink-br-77-0000abcd-h3"), Some(77));
        assert_eq!(owner_pid("clink-probe-9-0000abcd"), Some(9));
        assert_eq!(owner_pid("clink-x-1"), None);
        assert_eq!(owner_pid("other-12-a"), None);
        assert_eq!(owner_pid("clink-12"), None);
    }

    #[test]
    fn the_link_state_is_read_from_ip_o_link_show() {
        let up = "2: ckb@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT";
        let down = "2: ckb@if2: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state DOWN mode";
        assert_eq!(link_state(up), Some("UP"));
        assert_eq!(link_state(down), Some("DOWN"));
        assert_eq!(link_state("2: x: <UP> mtu 1500"), None);
        assert_eq!(link_state("2: x: state"), None);
    }

    fn netns_list() -> String {
        let ip = ip_binary().expect("ip");
        let out = Command::new(ip)
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn python3() -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("python3"))
            .find(|p| p.is_file())
    }

    /// Receives one datagram in namespace 0, sent from namespace 1, with python3.
    fn datagram_crosses(pair: &NetnsPair, py: &Path) {
        let port = 47_000 + (std::process::id() % 1000) as u16;
        let recv_src = format!(
            "import socket,sys\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.bind(('{}',{port}))\n\
             s.settimeout(10)\n\
             print('ready',flush=True)\n\
             d,a=s.recvfrom(100)\n\
             print(d.decode(),a[0],flush=True)\n",
            pair.addr(0)
        );
        let mut rx = pair
            .command(0, py)
            .args(["-c", &recv_src])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn receiver");
        let mut lines = BufReader::new(rx.stdout.take().expect("stdout")).lines();
        assert_eq!(lines.next().expect("line").expect("read"), "ready");
        // A few sends: the first may wait for ARP resolution.
        let send_src = format!(
            "import socket,time\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             for i in range(20):\n    s.sendto(b'hello-clink',('{}',{port})); time.sleep(0.05)\n",
            pair.addr(0)
        );
        let mut tx = pair
            .command(1, py)
            .args(["-c", &send_src])
            .spawn()
            .expect("spawn sender");
        let got = lines.next().expect("datagram line").expect("read");
        assert_eq!(got, format!("hello-clink {}", pair.addr(1)));
        assert!(rx.wait().expect("wait receiver").success());
        let _ = tx.kill();
        let _ = tx.wait();
    }

    #[test]
    fn pair_carries_udp_and_is_deleted_on_drop() {
        let _turn = netns_turn();
        let pair = NetnsPair::create(9000).expect("create pair");
        let names = [pair.ns(0).to_string(), pair.ns(1).to_string()];
        assert!(names.iter().all(|n| n.starts_with(NAME_PREFIX)));
        assert_ne!(names[0], names[1]);
        let list = netns_list();
        assert!(names.iter().all(|n| list.contains(n.as_str())), "{list}");
        assert_eq!(pair.addr(0).octets()[..3], pair.addr(1).octets()[..3]);
        assert_eq!(pair.addr(0).octets()[3], 1);
        assert_eq!(pair.addr(1).octets()[3], 2);
        let third = pair.addr(0).octets()[2];
        assert!((1..=250).contains(&third));
        // MTU and address as asked, seen from inside namespace 1.
        let show = pair
            .command(1, ip_binary().expect("ip"))
            .args(["-o", "addr", "show"])
            .output()
            .expect("ip addr show");
        let text = String::from_utf8_lossy(&show.stdout);
        assert!(text.contains(&format!("{}/24", pair.addr(1))), "{text}");
        let link = pair
            .command(1, ip_binary().expect("ip"))
            .args(["-o", "link", "show"])
            .output()
            .expect("ip link show");
        let text = String::from_utf8_lossy(&link.stdout);
        assert!(text.contains("mtu 9000"), "{text}");
        match python3() {
            Some(py) => datagram_crosses(&pair, &py),
            None => panic!("the datagram check needs python3 in PATH"),
        }
        drop(pair);
        let list = netns_list();
        assert!(!names.iter().any(|n| list.contains(n.as_str())), "{list}");
    }

    #[test]
    fn a_namespace_congestion_control_is_read_and_set() {
        let _turn = netns_turn();
        let pair = NetnsPair::create(1500).expect("create pair");
        let (a, b) = (pair.ns(0), pair.ns(1));
        // Reno and another the kernel lets a namespace take (the host's boot-time
        // default, or one root allowed), when there is one.
        let allowed = allowed_tcp_cc(a).expect("allowed");
        assert!(allowed.iter().any(|c| c == "reno"), "{allowed:?}");
        let two: Vec<&str> = std::iter::once("reno")
            .chain(allowed.iter().map(String::as_str).find(|&c| c != "reno"))
            .collect();
        for &cc in &two {
            set_tcp_cc(a, cc).expect("set");
            assert_eq!(tcp_cc(a).expect("read"), cc);
        }
        // One the kernel offers but a namespace may not take is refused, with the way.
        let offered =
            std::fs::read_to_string(clink::transport::tcp::CC_AVAILABLE_KNOB).expect("available");
        if let Some(barred) = offered
            .split_whitespace()
            .find(|c| !allowed.iter().any(|a| a == c))
        {
            let e = set_tcp_cc(a, barred).expect_err("a restricted algorithm");
            assert!(
                e.to_string().contains("tcp_allowed_congestion_control"),
                "{e}"
            );
        }
        // Per namespace: the other one keeps what it had.
        let other = tcp_cc(b).expect("read");
        if let Some(&diff) = two.iter().find(|&&c| c != other) {
            set_tcp_cc(a, diff).expect("set");
            assert_eq!(tcp_cc(b).expect("read"), other);
        }
        let bad = set_tcp_cc(a, "no_such_cc").expect_err("not offered");
        assert!(bad.to_string().contains("the kernel offers"), "{bad}");
        let odd = set_tcp_cc(a, "cubic; reboot").expect_err("not a name");
        assert_eq!(odd.kind(), io::ErrorKind::InvalidInput);
        // A bridge sets every host's.
        let b = Bridge::create(&BridgeSpec {
            hosts: 3,
            ..BridgeSpec::default()
        })
        .expect("bridge");
        for &cc in &two {
            b.set_tcp_cc(cc).expect("set");
            assert!((0..3).all(|i| tcp_cc(b.ns(i)).expect("read") == cc));
        }
    }

    #[test]
    fn pairs_do_not_collide() {
        let _turn = netns_turn();
        let a = NetnsPair::create(1500).expect("a");
        let b = NetnsPair::create(1500).expect("b");
        assert_ne!(a.ns(0), b.ns(0));
        assert_eq!(a.mtu(), 1500);
    }

    #[test]
    fn failed_creation_cleans_up() {
        let _turn = netns_turn();
        // An MTU the veth refuses: the namespaces made before the failure must go.
        let before = netns_list();
        let err = NetnsPair::create(1_000_000).expect_err("absurd MTU");
        assert!(err.to_string().contains("mtu"), "{err}");
        let after = netns_list();
        let ours = |l: &str| {
            l.lines()
                .filter(|x| x.starts_with(&format!("{NAME_PREFIX}{}-", std::process::id())))
                .count()
        };
        assert!(ours(&after) <= ours(&before), "{before}\n---\n{after}");
    }
}
