use clink::events::{Event, REQUESTS};
use clink::{Context, Selector};
use std::process::Command;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or("events".into());
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    ep.set_interest(REQUESTS);
    let (peer, first) = if args.get(2).map(String::as_str) == Some("--pong") {
        (ep.connect(&args[3])?, false)
    } else {
        let _c = Command::new(std::env::current_exe()?)
            .args([&mode, "--pong", &ep.address()])
            .spawn()?;
        (ep.accept(Some(Duration::from_secs(10)))?, true)
    };
    let iters = 300_000u32;
    let msg = [1u8; 8];
    let mut buf = [0u8; 8];
    let sel = Selector::exact(Some(peer), 0);
    let t = Instant::now();
    for i in 0..iters {
        if first || i > 0 {
            let mut s = ep.claim(peer, 0, 8, None)?;
            s.buf().copy_from_slice(&msg);
            s.commit();
        }
        match mode.as_str() {
            "events" => {
                let req = unsafe { ep.irecv_raw(sel, buf.as_mut_ptr(), 8) };
                'w: loop {
                    ep.progress();
                    while let Some(ev) = ep.pop_event() {
                        if let Event::RecvDone { .. } = ev {
                            if ep.finish_recv(&req)?.is_some() {
                                break 'w;
                            }
                        }
                    }
                }
            }
            "test" => {
                let req = unsafe { ep.irecv_raw(sel, buf.as_mut_ptr(), 8) };
                loop {
                    ep.progress();
                    if ep.test_recv(&req)?.is_some() {
                        break;
                    }
                }
            }
            _ => {
                ep.recv(sel, &mut buf)?;
            }
        }
    }
    if !first {
        let mut s = ep.claim(peer, 0, 8, None)?;
        s.buf().copy_from_slice(&msg);
        s.commit();
        return Ok(());
    }
    println!(
        "{mode}: {:.3} us one-way",
        t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0
    );
    Ok(())
}
