//! A tour of the API: two endpoints (here in two threads of one process; across
//! processes it is the same with the address passed on) exchange tagged messages with the
//! blocking helpers, non-blocking requests, wildcard matching, probe, truncation, and the
//! zero-copy forms.
//!
//! Run: `cargo run --release -p clink --example tour`

use clink::{Context, Error, Selector};
use std::time::Duration;

fn main() -> clink::Result<()> {
    let ctx = Context::new()?;
    let mut server = ctx.endpoint()?;
    let addr = server.address();
    println!("server listens at {addr}");

    let client = std::thread::spawn(move || -> clink::Result<()> {
        let ctx = Context::new()?;
        let mut ep = ctx.endpoint()?;
        let peer = ep.connect(&addr)?;
        ep.send(peer, 1, b"hello")?; // eager: copied into the server's ring
        ep.send(peer, 2, &vec![7u8; 4 << 20])?; // rendezvous: waits until the server has it
        let reqs: Vec<_> = (0..10u64)
            .map(|i| ep.isend(peer, 100 + i, i.to_le_bytes().to_vec()))
            .collect::<Result<_, _>>()?;
        for r in &reqs {
            ep.wait_send(r, Some(Duration::from_secs(5)))?;
        }
        ep.send(peer, 3, &[0u8; 100])?; // too long for the server's buffer
        let mut slot = ep.claim(peer, 4, 16, Some(Duration::from_secs(5)))?;
        slot.buf().copy_from_slice(b"written in place");
        slot.commit();
        // Wait for the server's goodbye before closing.
        let mut b = [0u8; 2];
        ep.recv(Selector::exact(Some(peer), 99), &mut b)?;
        Ok(())
    });

    let peer = server.accept(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; 8 << 20];
    let st = server.recv(Selector::exact(Some(peer), 1), &mut buf)?;
    println!(
        "tag {} from {}: {:?}",
        st.tag,
        st.peer,
        std::str::from_utf8(&buf[..st.len as usize])
    );
    let st = server.recv(Selector::exact(Some(peer), 2), &mut buf)?;
    println!(
        "tag 2: {} bytes (rendezvous, eager up to {} B)",
        st.len,
        server.eager_max(peer)?
    );

    // Ten receives posted at once, matched by a tag mask (any tag 100..=111 from anyone).
    let reqs: Vec<_> = (0..10)
        .map(|_| {
            server.irecv(
                clink::Selector {
                    src: None,
                    tag: 96,
                    mask: !0xf,
                },
                vec![0u8; 8],
            )
        })
        .collect::<Result<_, _>>()?;
    let mut sum = 0;
    for r in &reqs {
        let got = server.wait_recv(r, Some(Duration::from_secs(5)))?;
        sum += u64::from_le_bytes(got.buf[..8].try_into().unwrap_or([0; 8]));
    }
    println!("ten small messages by tag mask, payload sum {sum}");

    while server.probe(Selector::exact(Some(peer), 3)).is_none() {
        server.progress();
    }
    let st = server.probe(Selector::exact(Some(peer), 3));
    println!("probe: {st:?}");
    let mut small = [0u8; 10];
    match server.recv(Selector::exact(Some(peer), 3), &mut small) {
        Err(Error::Truncated { len, capacity }) => {
            println!("truncated: {len} bytes sent, {capacity} fit")
        }
        other => println!("unexpected: {other:?}"),
    }
    {
        let msg =
            server.recv_in_place(Selector::exact(Some(peer), 4), Some(Duration::from_secs(5)))?;
        println!("in place: {:?}", std::str::from_utf8(&msg));
    }
    server.send(peer, 99, b"ok")?;
    client.join().expect("client thread")?;
    println!("stats: {:?}", server.stats());
    Ok(())
}
