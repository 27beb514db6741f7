//! A blocking one-way stream between two processes started by hand, for example in two
//! network namespaces joined by a bridge:
//!
//! ```text
//! blockstream recv ADDRFILE SIZE COUNT   # writes its address to ADDRFILE, receives
//! blockstream send ADDRFILE SIZE COUNT   # connects to that address, sends
//! ```
//!
//! Every message is checked (each carries its index in every byte). With
//! `BLOCKSTREAM_PAUSE_S=N` the receiver computes for N seconds (makes no call into clink)
//! after the first message, so the sender's next sends wait on it that long. A failure
//! prints the wall-clock time it was seen (for measuring how long a death took to notice).
//! With `BLOCKSTREAM_VERBOSE=1` each side also prints its connection's counters.
use clink::{Context, Selector};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: blockstream recv|send ADDRFILE SIZE COUNT");
        std::process::exit(2);
    }
    if let Err(e) = run(&a[1], &a[2], &a[3], &a[4]) {
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!("{}: failed at {:.6}: {e}", a[1], at.as_secs_f64());
        std::process::exit(1);
    }
}

fn run(mode: &str, file: &str, size: &str, count: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (size, count): (usize, usize) = (size.parse()?, count.parse()?);
    let pause: u64 = std::env::var("BLOCKSTREAM_PAUSE_S").map_or(Ok(0), |s| s.parse())?;
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let t = Instant::now();
    let mut buf = vec![0u8; size];
    let (peer, st) = if mode == "recv" {
        std::fs::write(format!("{file}.tmp"), ep.address())?;
        std::fs::rename(format!("{file}.tmp"), file)?;
        let peer = ep.accept(Some(Duration::from_secs(20)))?;
        for i in 0..count {
            let st = ep.recv(Selector::exact(Some(peer), 0), &mut buf)?;
            if st.len != size as u64 || buf.iter().any(|&b| b != i as u8) {
                return Err(format!("message {i} damaged").into());
            }
            if i == 0 && pause > 0 {
                std::thread::sleep(Duration::from_secs(pause)); // the computation
            }
        }
        // Counted before the last word: a peer that closes after it hangs up, not fails.
        let st = ep.stats();
        ep.send(peer, 1, &[])?;
        (peer, st)
    } else {
        let peer = ep.connect(std::fs::read_to_string(file)?.trim())?;
        for i in 0..count {
            buf.fill(i as u8);
            ep.send(peer, 0, &buf)?;
        }
        let st = ep.stats();
        ep.recv(Selector::exact(Some(peer), 1), &mut [])?;
        (peer, st)
    };
    let s = t.elapsed().as_secs_f64();
    if std::env::var_os("BLOCKSTREAM_VERBOSE").is_some() {
        eprintln!("{mode}: {:?}", ep.conn_stats(peer)?);
        eprintln!("{mode}: {:?}", ep.stats());
    }
    let c = ep.conn_stats(peer)?;
    println!(
        "{mode}: {:.2} GB/s in {s:.2} s over {}; timeouts {}, retransmissions {}, keepalive rounds {}, peers failed {}",
        (size * count) as f64 / s / 1e9,
        ep.transport(peer)?,
        c.map_or(0, |c| c.timeouts),
        st.retransmissions,
        st.keepalive_rounds,
        st.peers_failed,
    );
    Ok(())
}
