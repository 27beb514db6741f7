//! One tokio task serves many peers: client threads (each with its own endpoint, as
//! separate processes would have) send numbered requests; the server, on a current_thread
//! runtime, receives from any peer with `recv_async` and answers with `send_async`, parking
//! on the endpoint's fd whenever nothing is pending.
//!
//! `cargo run --release -p clink-tokio --example server [-- CLIENTS [ROUNDS]]`

use clink::{Context, Selector};
use clink_tokio::AsyncEndpoint;
use std::time::{Duration, Instant};

const REQUEST: u64 = 1;
const BYE: u64 = 0;

/// A client: `rounds` request/reply round trips of 64 bytes; returns the median in µs.
fn client(id: u8, addr: String, rounds: usize) -> clink::Result<f64> {
    let ctx = Context::new()?;
    let mut ep = ctx.endpoint()?;
    let server = ep.connect(&addr)?;
    let mut reply = [0u8; 64];
    let mut times = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let mut req = [id; 64];
        req[..8].copy_from_slice(&(r as u64).to_le_bytes());
        let t = Instant::now();
        ep.send(server, REQUEST, &req)?;
        let st = ep.recv_timeout(
            Selector::exact(Some(server), REQUEST),
            &mut reply,
            Some(Duration::from_secs(30)),
        )?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(st.len, 64);
        assert_eq!(
            reply[..8],
            req[..8],
            "client {id}: reply to another request"
        );
        assert!(reply[8..].iter().all(|&b| b == id.wrapping_add(1)));
    }
    ep.send(server, BYE, &[])?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> clink::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: u8 = args
        .next()
        .map_or(4, |a| a.parse().expect("CLIENTS: a number"));
    let rounds: usize = args
        .next()
        .map_or(2000, |a| a.parse().expect("ROUNDS: a number"));
    let ctx = Context::new()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut srv = AsyncEndpoint::new(ctx.endpoint()?).expect("register the fd");
        let addr = srv.endpoint().address();
        let threads: Vec<_> = (0..clients)
            .map(|id| {
                let addr = addr.clone();
                std::thread::spawn(move || client(id, addr, rounds))
            })
            .collect();
        let start = Instant::now();
        let (mut left, mut served) = (clients, 0u64);
        let mut buf = vec![0u8; 64];
        while left > 0 {
            let st = srv.recv_async(Selector::any(), &mut buf).await?;
            if st.tag == BYE {
                left -= 1;
                continue;
            }
            let mut reply = buf[..st.len as usize].to_vec();
            for b in &mut reply[8..] {
                *b = b.wrapping_add(1);
            }
            srv.send_async(st.peer, REQUEST, reply).await?;
            served += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        for (id, t) in threads.into_iter().enumerate() {
            let median = t.join().expect("client thread")?;
            println!("client {id}: median round trip {median:.1} us");
        }
        println!(
            "served {served} requests from {clients} peers in one task: {:.0} per second; \
             the task parked on the endpoint's fd {} times",
            served as f64 / secs,
            srv.parks()
        );
        assert_eq!(served, u64::from(clients) * rounds as u64);
        Ok(())
    })
}
