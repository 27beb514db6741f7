//! The measurement loops run over a [`Channel`]: the client drives, the server
//! mirrors.
//!
//! The client tells the server what comes next with a 24-byte command message
//! (`op`, `size`, `count`, little-endian u64 each):
//! - `LAT`: `count` round trips of `size` bytes (server echoes each message);
//! - `BW`: the client streams `count` messages of `size` bytes, the server
//!   answers with one 16-byte ack after the last one: a status and the payload
//!   bytes it received (all of them, except on a lossy channel such as plain UDP,
//!   where bandwidth is the goodput: bytes received per second);
//! - `BW_CHECK`: like `BW`, but the server verifies the payload pattern before
//!   acking (used for the untimed warm-up round only). A lossy channel that lost
//!   data in this round answers `ACK_LOSSY` instead, and the client repeats the
//!   round (up to [`CHECK_TRIES`] times) until one arrives whole and verified;
//! - `CPU`: the server answers with 16 bytes, the CPU seconds (f64 bits) its
//!   process used during the `BW` rounds since the previous `CPU` command, then
//!   the part of them spent in the kernel;
//! - `DONE`: the server returns.
//!
//! CPU accounting: each side reads its own process CPU time
//! (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`) around each timed streaming
//! round (the client from sending the command to receiving the ack, the server
//! from receiving the command to sending the ack); after the timed rounds the
//! client asks for the server's sum with `CPU`, and the row's `cpu_s_per_gb` is
//! (client + server CPU seconds) / GB received. In busy mode both sides spin,
//! so it is about 2 / (GB/s); blocking mode shows what the work really costs.
//! `kernel_s_per_gb` is the part of it in the kernel (system time, from
//! `/proc/self/stat`, read around the same rounds: in clock ticks of 10 ms, so
//! each read is good to about a tick and the figure to a tick per round and
//! side; capped at the total), softirq work done on the process's CPU while it ran included (kernels
//! without interrupt-time accounting count it as the process's).
//!
//! Buffers are allocated once per size and written before use, so their pages
//! are resident; one buffer per side is reused for every message of a size.

use std::io::{self, ErrorKind};
use std::time::{Duration, Instant};

use super::channel::{Channel, Mode};
use super::plan::Plan;
use super::report::{Metric, Row, HOST_PLACEMENT};
use super::stats::{median, percentile};

const OP_DONE: u64 = 0;
const OP_LAT: u64 = 1;
const OP_BW: u64 = 2;
const OP_BW_CHECK: u64 = 3;
const OP_CPU: u64 = 4;

const CMD_LEN: usize = 24;
const ACK_LEN: usize = 16;
const ACK_OK: u64 = 0;
const ACK_CORRUPT: u64 = 1;
/// The check round lost data (lossy channels only): nothing could be verified.
const ACK_LOSSY: u64 = 2;
/// Attempts at a verification round that loses nothing, on a lossy channel.
pub const CHECK_TRIES: usize = 5;

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

/// CPU seconds this process has used so far (all threads).
pub fn process_cpu_secs() -> f64 {
    cpu_secs(rustix::time::ClockId::ProcessCPUTime)
}

/// CPU seconds this process has used so far, and the part of them in the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    /// All CPU seconds (`CLOCK_PROCESS_CPUTIME_ID`).
    pub total: f64,
    /// System seconds (`/proc/self/stat`; 0 where it cannot be read).
    pub kernel: f64,
}

impl CpuTimes {
    /// This process's times now.
    pub fn now() -> CpuTimes {
        let kernel = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| system_ticks(&s))
            .map_or(0.0, |t| {
                t as f64 / rustix::param::clock_ticks_per_second() as f64
            });
        CpuTimes {
            total: process_cpu_secs(),
            kernel,
        }
    }

    /// The times from `earlier` to `self`.
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            total: self.total - earlier.total,
            kernel: self.kernel - earlier.kernel,
        }
    }

    /// Adds `d` to these times.
    pub fn add(&mut self, d: CpuTimes) {
        self.total += d.total;
        self.kernel += d.kernel;
    }
}

/// The system time (`stime`, field 15, in clock ticks) of a `/proc/PID/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces and parentheses itself:
/// the fields are counted from the last `)`.
fn system_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so stime (15) is the 13th.
    rest.split_ascii_whitespace().nth(12)?.parse().ok()
}

/// CPU seconds the calling thread has used so far.
pub fn thread_cpu_secs() -> f64 {
    cpu_secs(rustix::time::ClockId::ThreadCPUTime)
}

fn cpu_secs(clock: rustix::time::ClockId) -> f64 {
    let ts = rustix::time::clock_gettime(clock);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn encode_ack(status: u64, received: u64) -> [u8; ACK_LEN] {
    let mut out = [0u8; ACK_LEN];
    out[0..8].copy_from_slice(&status.to_le_bytes());
    out[8..16].copy_from_slice(&received.to_le_bytes());
    out
}

fn decode_ack(ack: &[u8; ACK_LEN]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&ack[0..8]);
    b.copy_from_slice(&ack[8..16]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}

/// Server side: obeys the client's commands until `DONE` (or an error).
pub fn serve(ch: &mut dyn Channel) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut cmd = [0u8; CMD_LEN];
    let mut cpu = CpuTimes::default();
    loop {
        ch.recv(&mut cmd)?;
        let (op, size, count) = decode_cmd(&cmd)?;
        if matches!(op, OP_LAT | OP_BW | OP_BW_CHECK) && buf.len() != size {
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
                let cpu0 = CpuTimes::now();
                ch.recv_stream(&mut buf, count)?;
                let sent = (size as u64).saturating_mul(count as u64);
                let received = ch.stream_received().unwrap_or(sent);
                let status = if op == OP_BW {
                    ACK_OK
                } else if received != sent {
                    ACK_LOSSY
                } else if buf
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == pattern_byte(size, i))
                {
                    ACK_OK
                } else {
                    ACK_CORRUPT
                };
                ch.send(&encode_ack(status, received))?;
                if op == OP_BW {
                    cpu.add(CpuTimes::now().since(cpu0));
                }
            }
            OP_CPU => {
                let mut answer = [0u8; 16];
                answer[..8].copy_from_slice(&cpu.total.to_bits().to_le_bytes());
                answer[8..].copy_from_slice(&cpu.kernel.to_bits().to_le_bytes());
                ch.send(&answer)?;
                cpu = CpuTimes::default();
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
        copies_per_byte: Some(ch.copies_per_byte(size)),
        iterations: 0,
        reps: 1,
        pinned: label.pinned,
        round: 0,
        note: None,
        placement: HOST_PLACEMENT.to_string(),
        mtu: None,
        cpu_s_per_gb: None,
        kernel_s_per_gb: None,
        lost_pct: None,
        loss_pct: None,
        rate: None,
        tcp_cc: None,
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

/// What one streaming round measured.
struct Round {
    /// From the first send to the ack.
    elapsed: Duration,
    /// Payload bytes the server received.
    received: u64,
    /// Whether a check round lost data (so nothing was verified).
    lossy: bool,
}

/// Streams `count` messages and waits for the server's ack.
fn stream_once(ch: &mut dyn Channel, buf: &[u8], count: usize, check: bool) -> io::Result<Round> {
    let op = if check { OP_BW_CHECK } else { OP_BW };
    ch.send(&encode_cmd(op, buf.len(), count))?;
    let mut ack = [0u8; ACK_LEN];
    let start = Instant::now();
    ch.send_stream(buf, count)?;
    ch.recv(&mut ack)?;
    let elapsed = start.elapsed();
    let (status, received) = decode_ack(&ack);
    let round = |lossy| Round {
        elapsed,
        received,
        lossy,
    };
    match status {
        ACK_OK => Ok(round(false)),
        ACK_LOSSY if check => Ok(round(true)),
        ACK_CORRUPT => Err(bad_data(format!(
            "bandwidth size {}: the server received a corrupted payload",
            buf.len()
        ))),
        other => Err(bad_data(format!("unexpected ack value {other}"))),
    }
}

/// Asks the server for its CPU seconds in `BW` rounds since the last ask.
fn server_cpu(ch: &mut dyn Channel) -> io::Result<CpuTimes> {
    ch.send(&encode_cmd(OP_CPU, 0, 0))?;
    let mut answer = [0u8; 16];
    ch.recv(&mut answer)?;
    let word = |k: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&answer[8 * k..8 * k + 8]);
        f64::from_bits(u64::from_le_bytes(w))
    };
    Ok(CpuTimes {
        total: word(0),
        kernel: word(1),
    })
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
    // Untimed round that also verifies the payload (repeated while a lossy channel
    // loses data in it), then a round for the rate.
    let mut verified = false;
    for _ in 0..CHECK_TRIES {
        if !stream_once(ch, &buf, warm_count, true)?.lossy {
            verified = true;
            break;
        }
    }
    if !verified {
        return Err(bad_data(format!(
            "bandwidth size {size}: every one of {CHECK_TRIES} verification rounds lost \
             data, so the payload could not be checked"
        )));
    }
    let warm = stream_once(ch, &buf, warm_count, false)?.elapsed;
    let per_msg = warm / warm_count as u32;
    let count = iters_for(plan.bw_rep_time, per_msg, 1, BW_MAX_COUNT)
        .max(plan.bw_min_bytes.div_ceil(size).min(BW_MAX_COUNT));
    // Discard the server's CPU time of the warm-up rounds.
    server_cpu(ch)?;
    let mut gbs = Vec::with_capacity(plan.bw_reps);
    let mut client_cpu = CpuTimes::default();
    let mut received = 0u64;
    for _ in 0..plan.bw_reps {
        let cpu0 = CpuTimes::now();
        let r = stream_once(ch, &buf, count, false)?;
        client_cpu.add(CpuTimes::now().since(cpu0));
        received += r.received;
        gbs.push(r.received as f64 / r.elapsed.as_secs_f64().max(1e-9) / 1e9);
    }
    let server_cpu = server_cpu(ch)?;
    let sent = size as f64 * count as f64 * plan.bw_reps as f64;
    let mut row = base_row(ch, label, Metric::BandwidthGbs, size);
    row.median = median(&gbs).unwrap_or(f64::NAN);
    row.min = gbs.iter().copied().reduce(f64::min);
    row.max = gbs.iter().copied().reduce(f64::max);
    row.iterations = count as u64;
    row.reps = plan.bw_reps as u64;
    if received > 0 {
        let gb = received as f64 / 1e9;
        row.cpu_s_per_gb = Some((client_cpu.total + server_cpu.total) / gb);
        // (Ticks can put it a little above the precise total in short runs: capped.)
        let kernel =
            (client_cpu.kernel + server_cpu.kernel).min(client_cpu.total + server_cpu.total);
        row.kernel_s_per_gb = Some(kernel / gb);
    }
    // (A reliable channel reports no count: `received` is then what was sent.)
    if !ch.reliable() {
        let lost_pct = 100.0 * (1.0 - received as f64 / sent);
        row.lost_pct = Some(lost_pct);
        if received as f64 != sent {
            row.note = Some(format!(
                "lost {lost_pct:.2}% of the bytes sent (no reliability); bandwidth is \
                 goodput (bytes received)"
            ));
        }
    }
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
        let (addr, accept) = UnixSystem.listen(Mode::Blocking, None).expect("listen");
        let plan = Plan {
            lat_sizes: vec![0, 100],
            bw_sizes: vec![4096],
            lat_time: Duration::from_millis(2),
            lat_min_iters: 5,
            lat_max_iters: 50,
            bw_reps: 2,
            // No time target: the byte floor alone sizes the repetitions.
            bw_rep_time: Duration::ZERO,
            bw_min_bytes: 64 << 10,
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
        assert_eq!(rows[2].iterations, 16, "64 KiB in messages of 4 KiB");
        assert!(
            rows[2].cpu_s_per_gb.is_some_and(|c| c > 0.0),
            "{:?}",
            rows[2]
        );
        assert!(
            rows[2]
                .kernel_s_per_gb
                .is_some_and(|k| k >= 0.0 && k <= rows[2].cpu_s_per_gb.unwrap()),
            "{:?}",
            rows[2]
        );
        assert_eq!(rows[2].lost_pct, None);
    }

    #[test]
    fn system_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194304 100 0 0 0 37 1234 0 0 20 0 1 0";
        assert_eq!(system_ticks(line), Some(1234));
        assert_eq!(system_ticks("4242 (cut) S 1 2"), None);
        assert_eq!(system_ticks("no name at all"), None);
        let mine = std::fs::read_to_string("/proc/self/stat").expect("procfs");
        assert!(system_ticks(&mine).is_some(), "{mine}");
    }
}
