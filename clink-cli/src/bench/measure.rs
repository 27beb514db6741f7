//! The measurement loops run over a [`Channel`]: the client drives, the server
//! mirrors.
//!
//! The client tells the server what comes next with a 24-byte command message
//! (`op`, `size`, `count`, little-endian u64 each):
//! - `LAT`: `count` round trips of `size` bytes (server echoes each message);
//! - `BW`: the client streams `count` messages of `size` bytes, the server
//!   answers with one 8-byte ack after the last one;
//! - `BW_CHECK`: like `BW`, but the server verifies the payload pattern before
//!   acking (used for the untimed warm-up round only);
//! - `DONE`: the server returns.
//!
//! Buffers are allocated once per size and written before use, so their pages
//! are resident; one buffer per side is reused for every message of a size.

use std::io::{self, ErrorKind};
use std::time::{Duration, Instant};

use super::channel::{Channel, Mode};
use super::plan::Plan;
use super::report::{Metric, Row};
use super::stats::{median, percentile};

const OP_DONE: u64 = 0;
const OP_LAT: u64 = 1;
const OP_BW: u64 = 2;
const OP_BW_CHECK: u64 = 3;

const CMD_LEN: usize = 24;
const ACK_LEN: usize = 8;
const ACK_OK: u64 = 0;
const ACK_CORRUPT: u64 = 1;

/// Ping-pong round trips used to estimate the round-trip time before warm-up.
const LAT_PROBE_ITERS: usize = 16;
/// Bytes streamed in each bandwidth warm-up round (at least one message).
const BW_WARM_BYTES: usize = 8 << 20;
/// Upper bound on messages in one bandwidth repetition.
const BW_MAX_COUNT: usize = 1_000_000;

/// Payload byte `i` of a message of `size` bytes (not periodic in powers of 2).
fn pattern_byte(size: usize, i: usize) -> u8 {
    ((i as u64)
        .wrapping_mul(131)
        .wrapping_add((size as u64).wrapping_mul(7))
        % 251) as u8
}

/// A buffer of `size` bytes holding the pattern (all pages written).
fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| pattern_byte(size, i)).collect()
}

fn encode_cmd(op: u64, size: usize, count: usize) -> [u8; CMD_LEN] {
    let mut out = [0u8; CMD_LEN];
    out[0..8].copy_from_slice(&op.to_le_bytes());
    out[8..16].copy_from_slice(&(size as u64).to_le_bytes());
    out[16..24].copy_from_slice(&(count as u64).to_le_bytes());
    out
}

fn decode_cmd(cmd: &[u8; CMD_LEN]) -> io::Result<(u64, usize, usize)> {
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&cmd[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    let to_usize = |v: u64| {
        usize::try_from(v).map_err(|_| bad_data(format!("command field {v} out of range")))
    };
    Ok((word(0), to_usize(word(1))?, to_usize(word(2))?))
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, msg)
}

/// Server side: obeys the client's commands until `DONE` (or an error).
pub fn serve(ch: &mut dyn Channel) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut cmd = [0u8; CMD_LEN];
    loop {
        ch.recv(&mut cmd)?;
        let (op, size, count) = decode_cmd(&cmd)?;
        if op != OP_DONE && buf.len() != size {
            // A fresh buffer per size, written so its pages are resident.
            buf = vec![0xEE; size];
        }
        match op {
            OP_DONE => return Ok(()),
            OP_LAT => {
                for _ in 0..count {
                    ch.recv(&mut buf)?;
                    ch.send(&buf)?;
                }
            }
            OP_BW | OP_BW_CHECK => {
                ch.recv_stream(&mut buf, count)?;
                let ok = op == OP_BW
                    || buf
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == pattern_byte(size, i));
                let ack = if ok { ACK_OK } else { ACK_CORRUPT };
                ch.send(&ack.to_le_bytes())?;
            }
            other => return Err(bad_data(format!("unknown command op {other}"))),
        }
    }
}

/// Identity of the rows a client produces.
pub struct RowLabel<'a> {
    /// System name for the `system` field.
    pub system: &'a str,
    /// Mode the channel runs in.
    pub mode: Mode,
    /// Whether both sides run pinned to different CPUs.
    pub pinned: bool,
}

/// Client side: runs the whole plan, handing each finished row to `emit`
/// (latency sizes first, then bandwidth sizes), then tells the server `DONE`.
pub fn drive(
    ch: &mut dyn Channel,
    label: &RowLabel<'_>,
    plan: &Plan,
    emit: &mut dyn FnMut(Row) -> io::Result<()>,
) -> io::Result<()> {
    for &size in &plan.lat_sizes {
        let row = latency(ch, label, plan, size)?;
        emit(row)?;
    }
    for &size in &plan.bw_sizes {
        let row = bandwidth(ch, label, plan, size)?;
        emit(row)?;
    }
    ch.send(&encode_cmd(OP_DONE, 0, 0))
}

fn base_row(ch: &dyn Channel, label: &RowLabel<'_>, metric: Metric, size: usize) -> Row {
    Row {
        system: label.system.to_string(),
        transport: ch.transport(),
        mode: label.mode,
        metric,
        size,
        median: f64::NAN,
        p99: None,
        min: None,
        max: None,
        copies_per_byte: Some(ch.copies_per_byte()),
        iterations: 0,
        reps: 1,
        pinned: label.pinned,
        round: 0,
        note: None,
    }
}

/// Runs `count` round trips; returns the total time and, if `samples` is
/// given, pushes each one-way time (RTT/2) in microseconds.
fn ping_pong(
    ch: &mut dyn Channel,
    sbuf: &[u8],
    rbuf: &mut [u8],
    count: usize,
    mut samples: Option<&mut Vec<f64>>,
) -> io::Result<Duration> {
    ch.send(&encode_cmd(OP_LAT, sbuf.len(), count))?;
    let start = Instant::now();
    for _ in 0..count {
        let t0 = Instant::now();
        ch.send(sbuf)?;
        ch.recv(rbuf)?;
        if let Some(s) = samples.as_deref_mut() {
            s.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(start.elapsed())
}

/// Iterations that fill `target` at `per_iter` each, clamped to `[lo, hi]`.
fn iters_for(target: Duration, per_iter: Duration, lo: usize, hi: usize) -> usize {
    let per = per_iter.as_secs_f64().max(1e-9);
    let n = (target.as_secs_f64() / per).round();
    (n.min(hi as f64) as usize).clamp(lo, hi.max(lo))
}

fn latency(
    ch: &mut dyn Channel,
    label: &RowLabel<'_>,
    plan: &Plan,
    size: usize,
) -> io::Result<Row> {
    let sbuf = pattern(size);
    let mut rbuf = vec![0u8; size];
    rbuf.fill(0x11);
    // Probe, then warm up for about a sixth of the measuring time.
    let probe = ping_pong(ch, &sbuf, &mut rbuf, LAT_PROBE_ITERS, None)? / LAT_PROBE_ITERS as u32;
    let warm_iters = iters_for(plan.lat_time / 6, probe, LAT_PROBE_ITERS, 5_000);
    let warm = ping_pong(ch, &sbuf, &mut rbuf, warm_iters, None)? / warm_iters as u32;
    let count = iters_for(plan.lat_time, warm, plan.lat_min_iters, plan.lat_max_iters);
    let mut samples = Vec::with_capacity(count);
    ping_pong(ch, &sbuf, &mut rbuf, count, Some(&mut samples))?;
    if rbuf != sbuf {
        return Err(bad_data(format!(
            "latency size {size}: echoed payload differs from what was sent"
        )));
    }
    let mut row = base_row(ch, label, Metric::LatencyUs, size);
    row.median = median(&samples).unwrap_or(f64::NAN);
    row.p99 = percentile(&samples, 99.0);
    row.min = samples.iter().copied().reduce(f64::min);
    row.max = samples.iter().copied().reduce(f64::max);
    row.iterations = count as u64;
    Ok(row)
}

/// Streams `count` messages; returns the time from the first send to the ack.
fn stream_once(
    ch: &mut dyn Channel,
    buf: &[u8],
    count: usize,
    check: bool,
) -> io::Result<Duration> {
    let op = if check { OP_BW_CHECK } else { OP_BW };
    ch.send(&encode_cmd(op, buf.len(), count))?;
    let mut ack = [0u8; ACK_LEN];
    let start = Instant::now();
    ch.send_stream(buf, count)?;
    ch.recv(&mut ack)?;
    let elapsed = start.elapsed();
    match u64::from_le_bytes(ack) {
        ACK_OK => Ok(elapsed),
        ACK_CORRUPT => Err(bad_data(format!(
            "bandwidth size {}: the server received a corrupted payload",
            buf.len()
        ))),
        other => Err(bad_data(format!("unexpected ack value {other}"))),
    }
}

fn bandwidth(
    ch: &mut dyn Channel,
    label: &RowLabel<'_>,
    plan: &Plan,
    size: usize,
) -> io::Result<Row> {
    if size == 0 {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "bandwidth size must be positive",
        ));
    }
    let buf = pattern(size);
    let warm_count = (BW_WARM_BYTES / size).max(1);
    // Untimed round that also verifies the payload, then a round for the rate.
    stream_once(ch, &buf, warm_count, true)?;
    let warm = stream_once(ch, &buf, warm_count, false)?;
    let per_msg = warm / warm_count as u32;
    let count = iters_for(plan.bw_rep_time, per_msg, 1, BW_MAX_COUNT);
    let mut gbs = Vec::with_capacity(plan.bw_reps);
    for _ in 0..plan.bw_reps {
        let t = stream_once(ch, &buf, count, false)?.as_secs_f64().max(1e-9);
        gbs.push((size as f64 * count as f64) / t / 1e9);
    }
    let mut row = base_row(ch, label, Metric::BandwidthGbs, size);
    row.median = median(&gbs).unwrap_or(f64::NAN);
    row.min = gbs.iter().copied().reduce(f64::min);
    row.max = gbs.iter().copied().reduce(f64::max);
    row.iterations = count as u64;
    row.reps = plan.bw_reps as u64;
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::super::channel::System;
    use super::super::sockets::UnixSystem;
    use super::*;

    #[test]
    fn cmd_roundtrip_and_pattern() {
        let cmd = encode_cmd(OP_BW, 4096, 77);
        assert_eq!(decode_cmd(&cmd).expect("decode"), (OP_BW, 4096, 77));
        let p = pattern(4096);
        assert_eq!(p.len(), 4096);
        assert_ne!(p[0..256], p[256..512]);
    }

    #[test]
    fn iteration_counts_are_clamped() {
        let ms = Duration::from_millis;
        assert_eq!(
            iters_for(ms(300), Duration::from_micros(10), 200, 20_000),
            20_000
        );
        assert_eq!(iters_for(ms(300), ms(100), 200, 20_000), 200);
        assert_eq!(iters_for(ms(300), ms(1), 200, 20_000), 300);
        assert_eq!(iters_for(ms(300), Duration::ZERO, 1, 10), 10);
    }

    #[test]
    fn drive_and_serve_over_unix_socket() {
        let (addr, accept) = UnixSystem.listen(Mode::Blocking).expect("listen");
        let plan = Plan {
            lat_sizes: vec![0, 100],
            bw_sizes: vec![4096],
            lat_time: Duration::from_millis(2),
            lat_min_iters: 5,
            lat_max_iters: 50,
            bw_reps: 2,
            bw_rep_time: Duration::from_millis(2),
        };
        // Channels are not Send: each side makes its own in its own thread.
        let client = std::thread::spawn(move || -> io::Result<Vec<Row>> {
            let mut ch = UnixSystem.connect(Mode::Blocking, &addr)?;
            let label = RowLabel {
                system: "unix",
                mode: Mode::Blocking,
                pinned: false,
            };
            let mut rows = Vec::new();
            drive(ch.as_mut(), &label, &plan, &mut |r| {
                rows.push(r);
                Ok(())
            })?;
            Ok(rows)
        });
        let mut server = accept().expect("accept");
        serve(server.as_mut()).expect("serve");
        let rows = client.join().expect("join").expect("drive");
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.median.is_finite() && r.median > 0.0));
        assert_eq!(rows[2].metric, Metric::BandwidthGbs);
        assert_eq!(rows[2].reps, 2);
    }
}
