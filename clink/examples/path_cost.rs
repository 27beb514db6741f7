//! CPU cost of one hop, without the cross-core transfer: two endpoints connected over
//! shared memory, driven alternately by one thread. Per hop: an 8-byte tagged send +
//! receive, the same through the non-blocking path (a posted `irecv_raw`, progress passes
//! and the completion event, as the libfabric provider drives it), a one-word put applied
//! by a progress pass, and a one-word put whose tripwire
//! event `wait_event` returns. `clink bench --rma` measures the same hops across two cores
//! (`word_rtt`). With `udp`, the endpoints talk UDP over loopback instead, and only the
//! tagged hop is measured, as a ping-pong (each side must read the other's acks), beside
//! the same ping-pong over two plain kernel UDP sockets. With `tcp`, the same over clink's
//! TCP transport, beside two plain connected kernel TCP sockets (`TCP_NODELAY`).
//!
//! Run: `cargo run --release -p clink --example path_cost -- [hops] [udp|tcp]`

use clink::events::{self, Event, REQUESTS};
use clink::rma::{TripOptions, READ, WRITE};
use clink::{Config, Context, Selector};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(Ok(1_000_000), |s| s.parse())?;
    let net = std::env::args().nth(2);
    let (udp, tcp) = (net.as_deref() == Some("udp"), net.as_deref() == Some("tcp"));
    let cfg = move || Config {
        calibrate: false,
        force_net: udp || tcp,
        udp: if udp { Config::default().udp } else { None },
        tcp: if tcp { Config::default().tcp } else { None },
        ..Config::default()
    };
    let ctx_a = Context::with_config(cfg())?;
    let mut a = ctx_a.endpoint()?;
    let addr = a.address();
    // `connect` waits for the handshake, which `accept` on this thread answers.
    let joined = std::thread::spawn(move || -> clink::Result<_> {
        let ctx_b = Context::with_config(cfg())?;
        let mut b = ctx_b.endpoint()?;
        let p = b.connect(&addr)?;
        Ok((ctx_b, b, p))
    });
    let pa = a.accept(Some(Duration::from_secs(10)))?;
    let (_ctx_b, mut b, pb) = joined.join().expect("connecting thread")?;
    if udp || tcp {
        println!("transport: {}", a.transport(pa)?);
        for round in 0..3 {
            let mut buf = [0u8; 64];
            let sel = |p| Selector::exact(Some(p), 5);
            let t = Instant::now();
            for _ in 0..n {
                a.send(pa, 5, &buf)?;
                b.recv(sel(pb), &mut buf)?;
                b.send(pb, 5, &buf)?;
                a.recv(sel(pa), &mut buf)?;
            }
            let hop = t.elapsed().as_nanos() as f64 / n as f64 / 2.0;
            let (kernel, what) = if udp {
                (kernel_udp_hop(n)?, "UDP")
            } else {
                (kernel_tcp_hop(n)?, "TCP")
            };
            println!(
                "round {round}: ns per hop: tagged 64 B over {what} {hop:.0}, kernel {what} {kernel:.0} (clink's own {:.0})",
                hop - kernel
            );
        }
        return Ok(());
    }
    b.set_interest(events::TRIPWIRES);
    a.set_interest(REQUESTS);
    let watched = b.aperture_alloc(4096)?;
    b.tripwire(watched, 0, 8, TripOptions::default())?;
    let plain = b.aperture_alloc(4096)?;
    let plain_window = b.aperture_window(plain)?;
    // Cookies normally travel in a message; here both ends are at hand.
    let r_watched = a.import(pa, b.export(watched, 0, 64, READ | WRITE)?)?;
    let r_plain = a.import(pa, b.export(plain, 0, 64, READ | WRITE)?)?;
    let per_hop = |t: Instant| t.elapsed().as_nanos() as f64 / n as f64;
    for round in 0..3 {
        let mut buf = [0u8; 8];
        let t = Instant::now();
        for _ in 0..n {
            a.send(pa, 5, &buf)?;
            b.recv(Selector::exact(Some(pb), 5), &mut buf)?;
        }
        let tagged = per_hop(t);
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: `buf` outlives the receive, which completes inside the loop.
            let req = unsafe { a.irecv_raw(Selector::exact(Some(pa), 5), buf.as_mut_ptr(), 8) };
            b.send(pb, 5, &buf)?;
            while !matches!(a.pop_event(), Some(Event::RecvDone { .. })) {
                a.progress();
            }
            a.finish_recv(&req)?;
        }
        let nonblocking = per_hop(t);
        let t = Instant::now();
        for v in 1..=n {
            a.put_nowait(&r_plain, 0, &v.to_le_bytes())?;
            while plain_window.load_u64(0)? != v {
                b.progress();
            }
        }
        let put_progress = per_hop(t);
        let t = Instant::now();
        for v in 1..=n {
            a.put_nowait(&r_watched, 0, &v.to_le_bytes())?;
            while !matches!(
                b.wait_event(Some(Duration::from_secs(10)))?,
                Event::Tripwire { .. }
            ) {}
        }
        let put_tripwire = per_hop(t);
        println!(
            "round {round}: ns per hop: tagged {tagged:.1}, tagged_nonblocking {nonblocking:.1}, put_progress {put_progress:.1}, put_tripwire {put_tripwire:.1}"
        );
    }
    Ok(())
}

/// The same ping-pong with two plain connected kernel UDP sockets on loopback (`send`,
/// non-blocking `recv`): what the kernel alone costs a hop, so the difference is clink's.
fn kernel_udp_hop(n: u64) -> std::io::Result<f64> {
    use std::net::UdpSocket;
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    a.connect(b.local_addr()?)?;
    b.connect(a.local_addr()?)?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let mut buf = [0u8; 64];
    let hop = |from: &UdpSocket, to: &UdpSocket, buf: &mut [u8; 64]| -> std::io::Result<()> {
        from.send(buf)?;
        loop {
            match to.recv(buf) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
    };
    let t = Instant::now();
    for _ in 0..n {
        hop(&a, &b, &mut buf)?;
        hop(&b, &a, &mut buf)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / n as f64 / 2.0)
}

/// The same ping-pong over two plain connected kernel TCP sockets on loopback
/// (`TCP_NODELAY`, `write`, non-blocking `read` of the whole 64 bytes).
fn kernel_tcp_hop(n: u64) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut a = TcpStream::connect(l.local_addr()?)?;
    let (mut b, _) = l.accept()?;
    for s in [&a, &b] {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
    }
    let mut buf = [0u8; 64];
    let hop = |from: &mut TcpStream, to: &mut TcpStream, buf: &mut [u8; 64]| {
        from.write_all(buf)?;
        let mut got = 0;
        while got < buf.len() {
            match to.read(&mut buf[got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
        Ok::<(), std::io::Error>(())
    };
    let t = Instant::now();
    for _ in 0..n {
        hop(&mut a, &mut b, &mut buf)?;
        hop(&mut b, &mut a, &mut buf)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / n as f64 / 2.0)
}
