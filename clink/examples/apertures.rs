//! One-sided access (CLAN): an owner exports an aperture, a peer puts, gets and adds into
//! it, the owner's tripwire fires and queues an event, the peer maps the window and writes
//! with plain stores, then both run a distributed queue built only on apertures and
//! tripwires, and a tagged message lands in the aperture (`irecv_into_aperture`), firing
//! a tripwire. Two endpoints in two threads (across processes it is the same with the
//! address passed on; `CLINK_TRANSPORT=udp` runs it over the network path, where mapping
//! is refused and the queue uses puts).
//!
//! Run: `cargo run --release -p clink --example apertures`

use clink::events::{self, Event};
use clink::patterns::dqueue::{QueueReceiver, QueueSender};
use clink::rma::{Cookie, TripOptions, COOKIE_LEN, READ, WRITE};
use clink::{Context, Error, Selector};
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn main() -> clink::Result<()> {
    let ctx = Context::new()?;
    let mut owner = ctx.endpoint()?;
    let addr = owner.address();

    let peer_thread = std::thread::spawn(move || -> clink::Result<()> {
        let ctx = Context::new()?;
        let mut ep = ctx.endpoint()?;
        let owner = ep.connect(&addr)?;
        let mut b = [0u8; COOKIE_LEN];
        ep.recv_timeout(Selector::exact(Some(owner), 1), &mut b, T)?;
        let cookie = Cookie::from_bytes(&b)?;
        let r = ep.import(owner, cookie)?;
        ep.put(&r, 0, b"hello, aperture")?; // fires the owner's tripwire
        let mut back = [0u8; 15];
        ep.get(&r, 0, &mut back)?;
        println!(
            "peer: got back {:?}",
            std::str::from_utf8(&back).unwrap_or("?")
        );
        println!("peer: fetch_add -> {}", ep.fetch_add(&r, 64, 5)?);
        match ep.map(&r) {
            Ok(w) => {
                w.write(128, b"a plain store")?; // no system call, no help from the owner
                ep.notify(&r, 128, 13)?; // doorbell: fires tripwires on the range
                println!("peer: wrote through the mapped window");
            }
            Err(Error::Refused { status, .. }) => {
                println!("peer: no mapping ({})", status.describe())
            }
            Err(e) => return Err(e),
        }
        let mut forged = r;
        forged.cookie.key ^= 1;
        if let Err(e) = ep.put(&forged, 0, b"x") {
            println!("peer: forged cookie -> {e}");
        }
        let mut q = QueueSender::connect(&mut ep, owner, 2, 64, 128, T)?;
        for i in 0..100_000u64 {
            let mut e = [0u8; 64];
            e[..8].copy_from_slice(&i.to_le_bytes());
            q.push(&mut ep, &e, T)?;
        }
        ep.recv_timeout(Selector::exact(Some(owner), 3), &mut [0u8; 1], T)?;
        ep.send(owner, 4, b"a message into the aperture")?;
        ep.recv_timeout(Selector::exact(Some(owner), 5), &mut [0u8; 1], T)?;
        Ok(())
    });

    let peer = owner.accept(T)?;
    owner.set_interest(events::TRIPWIRES);
    let ap = owner.aperture_alloc(4096)?;
    let trip = owner.tripwire(ap, 0, 256, TripOptions::default())?;
    let cookie = owner.export(ap, 0, 4096, READ | WRITE)?;
    owner.send(peer, 1, &cookie.to_bytes())?;
    let mapped = owner.transport(peer)? == "shm";
    for _ in 0..if mapped { 3 } else { 2 } {
        if let Event::Tripwire { offset, len, .. } = owner.wait_event(T)? {
            println!("owner: tripwire fired by an access of {len} bytes at {offset}");
        }
    }
    let mut q = QueueReceiver::connect(&mut owner, peer, 2, 64, 128, T)?;
    let mut e = [0u8; 64];
    let t = std::time::Instant::now();
    for i in 0..100_000u64 {
        q.pop(&mut owner, &mut e, T)?;
        assert_eq!(u64::from_le_bytes(e[..8].try_into().expect("8 bytes")), i);
    }
    println!(
        "owner: 100000 queue elements in {:?}; tripwire fired {} times; {} refused",
        t.elapsed(),
        owner.tripwire_count(trip),
        owner.stats().rma_refused
    );
    // A tagged message received straight into the aperture fires its tripwires too.
    let landing = owner.tripwire(ap, 1024, 64, TripOptions::default())?;
    let req = owner.irecv_into_aperture(Selector::exact(Some(peer), 4), ap, 1024, 64)?;
    owner.send(peer, 3, b"k")?;
    loop {
        match owner.wait_event(T)? {
            Event::Tripwire { id, len, .. } if id == landing => {
                println!("owner: tripwire fired by a {len}-byte message landing");
                break;
            }
            _ => continue,
        }
    }
    let got = owner.wait_recv(&req, T)?;
    let mut text = vec![0u8; got.status.len as usize];
    owner.aperture_read(ap, 1024, &mut text)?;
    println!("owner: it says {:?}", String::from_utf8_lossy(&text));
    owner.send(peer, 5, b"k")?;
    peer_thread.join().expect("peer thread")?;
    Ok(())
}
