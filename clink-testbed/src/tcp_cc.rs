//! The TCP congestion control of a namespace: the algorithm its TCP sockets use unless
//! they choose one. A namespace made here starts with the host's
//! (`net.ipv4.tcp_congestion_control`), which need not be Linux's default (cubic): on a
//! machine set to BBR, every kernel-TCP baseline of a benchmark runs BBR, whose pacing
//! (a timer per socket where no `fq` qdisc paces for it, as on veth) costs a virtual
//! machine dearly. Benchmarks report what was in force and can set it.

use std::io;

use crate::{require_ip, run_ip_output};

/// The setting, as a process inside a namespace sees it.
const KNOB: &str = clink::transport::tcp::CC_DEFAULT_KNOB;
/// What the kernel offers (built in or loaded).
const AVAILABLE: &str = clink::transport::tcp::CC_AVAILABLE_KNOB;
/// What a namespace other than the host's may take as its own: the kernel lets only the
/// host's namespace set a restricted algorithm (reno and the boot-time default are
/// allowed; root in the host's namespace may allow others).
const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

/// Reads `path` from inside namespace `ns`.
fn read_in(ns: &str, path: &str) -> io::Result<String> {
    let out = run_ip_output(&require_ip()?, &["netns", "exec", ns, "cat", path])?;
    Ok(out.trim().to_string())
}

/// The congestion control TCP sockets in namespace `ns` get.
pub fn tcp_cc(ns: &str) -> io::Result<String> {
    read_in(ns, KNOB)
}

/// The congestion controls namespace `ns` may take ([`set_tcp_cc`]):
/// `net.ipv4.tcp_allowed_congestion_control`.
pub fn allowed_tcp_cc(ns: &str) -> io::Result<Vec<String>> {
    Ok(read_in(ns, ALLOWED)?
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// Sets the congestion control of namespace `ns` to `cc`, a name the kernel offers
/// (`net.ipv4.tcp_available_congestion_control`: reno and cubic always, bbr where its
/// module is loaded) and lets a namespace take ([`allowed_tcp_cc`]), and checks it took.
pub fn set_tcp_cc(ns: &str, cc: &str) -> io::Result<()> {
    if !clink::transport::tcp::is_congestion_name(cc) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{cc:?} is not a congestion control's name"),
        ));
    }
    // (`cc` is checked above: nothing in it the shell would read.)
    let script = format!("echo {cc} > {KNOB}");
    if let Err(e) = run_ip_output(&require_ip()?, &["netns", "exec", ns, "sh", "-c", &script]) {
        let offered = read_in(ns, AVAILABLE).unwrap_or_default();
        let allowed = allowed_tcp_cc(ns).unwrap_or_default();
        let hint = if allowed.iter().any(|a| a == cc) {
            String::new()
        } else {
            let list = allowed.join(" ");
            format!(
                "; a namespace may take only {list} (net.ipv4.tcp_allowed_congestion_control): \
                 as root, add {cc} with `sysctl -w net.ipv4.tcp_allowed_congestion_control='{list} \
                 {cc}'`"
            )
        };
        return Err(io::Error::other(format!(
            "cannot set TCP congestion control {cc} in namespace {ns} (the kernel offers: \
             {offered}{hint}): {e}"
        )));
    }
    match tcp_cc(ns)? {
        now if now == cc => Ok(()),
        now => Err(io::Error::other(format!(
            "TCP congestion control of namespace {ns} is {now} after setting {cc}"
        ))),
    }
}
