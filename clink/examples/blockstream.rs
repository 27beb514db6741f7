//! Blocking one-way stream between two processes started by hand (for example in two
//! network namespaces): `blockstream recv ADDRFILE SIZE COUNT` writes its address to
//! ADDRFILE and receives; `blockstream send ADDRFILE SIZE COUNT` connects and sends.
use clink::{Context, Selector};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let (mode, file, size, count) = (&a[1], &a[2], a[3].parse::<usize>()?, a[4].parse::<usize>()?);
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let t = Instant::now();
    if mode == "recv" {
        std::fs::write(format!("{file}.tmp"), ep.address())?;
        std::fs::rename(format!("{file}.tmp"), file)?;
        let peer = ep.accept(Some(Duration::from_secs(20)))?;
        let mut buf = vec![0u8; size];
        for i in 0..count {
            let st = ep.recv(Selector::exact(Some(peer), 0), &mut buf)?;
            assert_eq!(st.len, size as u64);
            assert!(buf.iter().step_by(4096).all(|&b| b == i as u8), "payload");
        }
        ep.send(peer, 1, &[])?;
    } else {
        let addr = std::fs::read_to_string(file)?;
        let peer = ep.connect(&addr)?;
        let mut buf = vec![0u8; size];
        for i in 0..count {
            buf.fill(i as u8);
            ep.send(peer, 0, &buf)?;
        }
        ep.recv(Selector::exact(Some(peer), 1), &mut [])?;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "{mode}: {:.2} GB/s in {s:.2} s; {:?}",
        (size * count) as f64 / s / 1e9,
        ep.stats()
    );
    Ok(())
}
