//! A byte stream built only on apertures and tripwires (`patterns::stream`): one thread
//! writes 16 MiB in writes of varying sizes, the other reads it back in reads of other
//! sizes (a read returns what is there, like a socket) and checks every byte. Two
//! endpoints in two threads; across processes it is the same with the address passed on.
//! Same host: the bytes move by plain stores into the reader's mapped ring;
//! `CLINK_TRANSPORT=udp` runs it over the network path (puts).
//!
//! Run: `cargo run --release -p clink --example bytestream`

use clink::patterns::stream::{StreamReader, StreamWriter};
use clink::{Context, Selector};
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(10));
const TOTAL: usize = 16 << 20;
const CAPACITY: usize = 256 << 10;

/// Byte `i` of the stream.
fn byte(i: usize) -> u8 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()[7]
}

fn main() -> clink::Result<()> {
    let ctx = Context::new()?;
    let mut rx_ep = ctx.endpoint()?;
    let addr = rx_ep.address();

    let writer = std::thread::spawn(move || -> clink::Result<()> {
        let ctx = Context::new()?;
        let mut ep = ctx.endpoint()?;
        let reader = ep.connect(&addr)?;
        let mut w = StreamWriter::connect(&mut ep, reader, 1, CAPACITY, T)?;
        let data: Vec<u8> = (0..TOTAL).map(byte).collect();
        let mut pos = 0;
        let mut size = 1;
        while pos < TOTAL {
            // 1 byte to ~1 MiB: smaller and larger than the ring.
            let n = size.min(TOTAL - pos);
            w.write(&mut ep, &data[pos..pos + n], T)?;
            pos += n;
            size = if size > CAPACITY * 4 { 1 } else { size * 3 + 7 };
        }
        w.flush(&mut ep)?;
        // Stay alive until the reader has everything (its puts to us need our progress).
        ep.recv_timeout(Selector::exact(Some(reader), 2), &mut [0u8; 1], T)?;
        Ok(())
    });

    let writer_peer = rx_ep.accept(T)?;
    let mut r = StreamReader::connect(&mut rx_ep, writer_peer, 1, CAPACITY, T)?;
    let mut buf = vec![0u8; 100_000];
    let (mut pos, mut reads) = (0, 0u64);
    let t = Instant::now();
    while pos < TOTAL {
        let n = r.read(&mut rx_ep, &mut buf, T)?;
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, byte(pos + k), "byte {}", pos + k);
        }
        pos += n;
        reads += 1;
    }
    let el = t.elapsed();
    println!(
        "reader: {} MiB over {} in {reads} reads, {:?} ({:.0} MiB/s, checked); ring {} KiB",
        TOTAL >> 20,
        rx_ep.transport(writer_peer)?,
        el,
        TOTAL as f64 / (1 << 20) as f64 / el.as_secs_f64(),
        CAPACITY >> 10
    );
    rx_ep.send(writer_peer, 2, b"k")?;
    writer.join().expect("writer thread")?;
    Ok(())
}
