//! `clink demo`, the main job: a second process is started, the two exchange messages of
//! every size class (content checked both ways), and then the benchmark table is printed.

use crate::bench;
use clink::{Context, Selector};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `clink demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Skip the benchmark table.
    #[arg(long)]
    pub no_bench: bool,
    /// Short benchmark run.
    #[arg(long)]
    pub quick: bool,
}

const SIZES: &[usize] = &[0, 1, 8, 64, 1000, 4096, 65536, 1 << 20, 16 << 20];

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The first process: listens, starts the peer, checks the echoes.
pub fn run(args: DemoArgs) -> Result<(), String> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    let mut ep = ctx.endpoint().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["demo-peer", &ep.address()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the peer process: {e}"))?;
    let result = (|| {
        let peer = ep
            .accept(Some(Duration::from_secs(10)))
            .map_err(|e| format!("peer did not connect: {e}"))?;
        println!(
            "demo: pid {} connected to pid {} over shared memory (CMA {})",
            std::process::id(),
            child.id(),
            if ep.uses_cma(peer).unwrap_or(false) {
                "on"
            } else {
                "off"
            }
        );
        let t = Instant::now();
        let mut total = 0usize;
        for (i, &n) in SIZES.iter().enumerate() {
            let msg = pattern(n, i as u64);
            ep.send(peer, i as u64, &msg).map_err(|e| e.to_string())?;
            let mut back = vec![0u8; n];
            let st = ep
                .recv(Selector::exact(Some(peer), i as u64), &mut back)
                .map_err(|e| e.to_string())?;
            if st.len as usize != n || back != msg {
                return Err(format!("echo of {n} bytes came back wrong"));
            }
            total += 2 * n;
        }
        println!("demo: {} messages echoed and checked ({} bytes) in {:?}; eager up to {} B, rendezvous above", SIZES.len(), total, t.elapsed(), ep.eager_max(peer).unwrap_or(0));
        let s = ep.stats();
        println!(
            "demo: frames sent {} received {}, eager {} rendezvous {}, CMA bytes {}, doorbells {}",
            s.frames_sent,
            s.frames_received,
            s.eager_sends,
            s.rendezvous_sends,
            s.cma_bytes,
            s.doorbells
        );
        Ok(())
    })();
    let waited = wait_child(&mut child, Duration::from_secs(10));
    result?;
    waited?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
        }
    }
    if args.no_bench {
        return Ok(());
    }
    println!();
    let mut bargs = bench::BenchArgs::default_for_demo();
    bargs.quick = args.quick;
    bench::run(bargs)
}

fn wait_child(child: &mut std::process::Child, limit: Duration) -> Result<(), String> {
    let end = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("peer process failed: {st}")),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("peer process did not finish in time (killed)".into());
            }
        }
    }
}

/// The second process: connects and echoes every message.
pub fn peer(addr: &str) -> Result<(), String> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    let mut ep = ctx.endpoint().map_err(|e| e.to_string())?;
    let peer = ep.connect(addr).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; *SIZES.iter().max().unwrap_or(&0)];
    for i in 0..SIZES.len() {
        let st = ep
            .recv(Selector::exact(Some(peer), i as u64), &mut buf)
            .map_err(|e| e.to_string())?;
        ep.send(peer, st.tag, &buf[..st.len as usize])
            .map_err(|e| e.to_string())?;
    }
    println!(
        "demo-peer: pid {} echoed {} messages",
        std::process::id(),
        SIZES.len()
    );
    Ok(())
}
