use clink::events::{Event, REQUESTS};
use clink::{Context, Selector};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx_a = Context::new()?;
    let mut a = ctx_a.endpoint()?;
    let addr = a.address();
    let joined = std::thread::spawn(move || -> clink::Result<_> {
        let ctx_b = Context::new()?;
        let mut b = ctx_b.endpoint()?;
        let p = b.connect(&addr)?;
        Ok((ctx_b, b, p))
    });
    let pa = a.accept(Some(Duration::from_secs(10)))?;
    let (_ctx_b, mut b, pb) = joined.join().expect("t")?;
    b.set_interest(REQUESTS);
    let n = 1_000_000u32;
    let msg = [1u8; 8];
    let mut buf = [0u8; 8];
    let sel = Selector::exact(Some(pb), 0);
    for round in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            a.send(pa, 0, &msg)?;
            b.recv(sel, &mut buf)?;
        }
        let blocking = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for _ in 0..n {
            let req = unsafe { b.irecv_raw(sel, buf.as_mut_ptr(), 8) };
            let mut s = a.claim(pa, 0, 8, None)?;
            s.buf().copy_from_slice(&msg);
            s.commit();
            'w: loop {
                b.progress();
                while let Some(ev) = b.pop_event() {
                    if let Event::RecvDone { .. } = ev {
                        if b.finish_recv(&req)?.is_some() {
                            break 'w;
                        }
                    }
                }
            }
        }
        let ev = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for _ in 0..n {
            b.progress();
        }
        let idle = t.elapsed().as_nanos() as f64 / n as f64;
        println!("round {round}: blocking send+recv {blocking:.1} ns, claim+irecv+progress+event {ev:.1} ns, idle progress {idle:.1} ns");
    }
    Ok(())
}
