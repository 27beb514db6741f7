//! `clink info`: what clink would do on this machine, and why.

use clink::config::VARIABLES;
use clink::Context;

/// Prints configuration, measured costs and the thresholds derived from them.
pub fn run() -> Result<(), String> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    let cfg = ctx.config();
    let (c, measured) = ctx.costs();
    println!("clink {}", env!("CARGO_PKG_VERSION"));
    println!(
        "host key          {:016x} (boot id + network namespace; shared memory only within one)",
        ctx.host()
    );
    println!("transports        shm (same host). Network transports: not in this build.");
    println!();
    println!(
        "cost model inputs ({})",
        if measured {
            "measured at start, CLINK_CALIBRATE=0 to skip"
        } else {
            "built-in figures"
        }
    );
    println!("  memcpy          {:.1} GB/s", c.copy_bytes_per_ns);
    println!(
        "  CMA read        {:.1} GB/s, {:.0} ns per call",
        c.cma_bytes_per_ns, c.cma_call_ns
    );
    println!(
        "  ring hop        {:.0} ns (cross-core cache-line transfer)",
        c.hop_ns
    );
    println!();
    let with = ctx.eager_threshold(true);
    let without = ctx.eager_threshold(false);
    let why = if cfg.eager_max.is_some() {
        "set by CLINK_EAGER_MAX (capped by the ring)"
    } else {
        "where 2 copies through the ring cost as much as a CMA call + 1 copy"
    };
    println!("eager threshold   {with} B with CMA ({why})");
    println!("                  {without} B without CMA (the staged pipeline also copies twice: eager up to the ring's limit)");
    let chunk = |n: u64| {
        cfg.chunk
            .unwrap_or_else(|| c.chunk_size(n, 16 << 10, u64::from(cfg.staging_slot_bytes)))
    };
    println!("staging chunk     {} B for 1 MiB, {} B for 64 MiB (c = sqrt(n * hop * copy rate), in [16 KiB, slot])", chunk(1 << 20), chunk(64 << 20));
    println!(
        "CMA               {}",
        if cfg.cma {
            "probed per peer at connect (process_vm_readv of a known word)"
        } else {
            "off (CLINK_CMA=off): staged pipeline"
        }
    );
    println!(
        "rings             {} cells x 64 B = {} KiB per direction",
        cfg.ring_cells,
        cfg.ring_cells as usize * 64 / 1024
    );
    println!(
        "staging           {} slots x {} KiB per direction",
        cfg.staging_slots,
        cfg.staging_slot_bytes / 1024
    );
    println!(
        "spin before block {}",
        cfg.spin
            .map_or("forever (never blocks)".to_string(), |d| format!("{d:?}"))
    );
    println!(
        "peers of other uids {}",
        if cfg.any_uid {
            "accepted"
        } else {
            "refused (SO_PEERCRED)"
        }
    );
    println!();
    println!("environment variables:");
    for (name, what) in VARIABLES {
        let val = std::env::var(name).unwrap_or_else(|_| "(unset)".into());
        println!("  {name:<26} {val:<10} {what}");
    }
    Ok(())
}
