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

/// Reads `path` from inside namespace `ns`.
fn read_in(ns: &str, path: &str) -> io::Result<String> {
    let out = run_ip_output(&require_ip()?, &["netns", "exec", ns, "cat", path])?;
    Ok(out.trim().to_string())
}

/// The congestion control TCP sockets in namespace `ns` get.
pub fn tcp_cc(ns: &str) -> io::Result<String> {
    read_in(ns, KNOB)
}

/// Sets the congestion control of namespace `ns` to `cc`, a name the kernel offers
/// (`net.ipv4.tcp_available_congestion_control`: reno and cubic always, bbr where its
/// module is loaded), and checks it took.
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
        return Err(io::Error::other(format!(
            "cannot set TCP congestion control {cc} in namespace {ns} (the kernel offers: \
             {offered}): {e}"
        )));
    }
    match tcp_cc(ns)? {
        now if now == cc => Ok(()),
        now => Err(io::Error::other(format!(
            "TCP congestion control of namespace {ns} is {now} after setting {cc}"
        ))),
    }
}
