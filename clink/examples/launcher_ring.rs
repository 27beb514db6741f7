//! Ranks started by a launcher find each other and pass a message around a ring:
//! `mpirun -np 3 target/debug/examples/launcher_ring` (any program, not only MPI ones:
//! mpirun's PMIx service carries the endpoint addresses). Each rank prints `rank R of N:
//! got G from its left` and how many ranks share its node.

use clink::Selector;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ctx, job) = clink::Context::from_launcher()?;
    let mut ep = ctx.endpoint()?;
    let addrs = job.exchange_addresses(&ep.address())?;
    let (rank, size) = (job.rank(), job.size());
    if size == 1 {
        println!("rank 0 of 1: alone");
        return Ok(());
    }
    let right = ep.connect(&addrs[((rank + 1) % size) as usize])?;
    let msg = format!("hello from {rank}");
    ep.send(right, 7, msg.as_bytes())?;
    let mut buf = [0u8; 64];
    let st = ep.recv_timeout(Selector::any(), &mut buf, Some(Duration::from_secs(30)))?;
    let got = std::str::from_utf8(&buf[..st.len as usize])?;
    let left = (rank + size - 1) % size;
    if got != format!("hello from {left}") {
        return Err(format!("rank {rank}: got {got:?}, not the left neighbour's greeting").into());
    }
    println!("rank {rank} of {size}: got {got:?} from its left");
    match job.local_size() {
        Some(n) => println!("rank {rank}: {n} ranks on this node"),
        None => println!("rank {rank}: the launcher does not say how many ranks share this node"),
    }
    ep.close();
    Ok(())
}
