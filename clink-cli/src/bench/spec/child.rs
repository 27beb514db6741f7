//! The two sides of one speculation experiment, each a child process in its namespace:
//! the receiver (posts, checks every byte, reports its counters as a JSON line) and the
//! senders (with the interfering stream when the variant asks).

use super::*;

/// Role of a child process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Accepts the senders, receives and checks, prints its counters.
    Receiver,
    /// Connects and streams (and, with `--interfere`, sends stray datagrams).
    Sender,
}

/// Arguments of the hidden child subcommand ([`CHILD_SUBCOMMAND`]).
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// Receiver or sender.
    #[arg(long, value_enum)]
    pub role: Role,
    /// Message size in bytes.
    #[arg(long)]
    pub size: usize,
    /// Messages per sender.
    #[arg(long)]
    pub count: u64,
    /// Receiver: number of senders.
    #[arg(long, default_value_t = 1)]
    pub senders: usize,
    /// Sender: the receiver's address.
    #[arg(long)]
    pub addr: Option<String>,
    /// Sender: its index (selects its payload pattern).
    #[arg(long, default_value_t = 0)]
    pub index: usize,
    /// Sender: stray datagrams to send to the receiver's UDP port during the transfer.
    #[arg(long, default_value_t = 0)]
    pub interfere: u64,
    /// Seed of the stray datagrams' contents.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CPU to pin this process to.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Bound on every wait, seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
}

/// Child entry point: one receiver or sender of one run.
pub fn run_child(args: ChildArgs) -> Result<(), String> {
    if let Some(cpu) = args.cpu {
        affinity::pin_self(cpu).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs.max(1));
    match args.role {
        Role::Receiver => receiver(&args, deadline).map_err(|e| format!("receiver: {e}")),
        Role::Sender => sender(&args, deadline).map_err(|e| format!("sender: {e}")),
    }
}

/// The children's configuration: the environment's `CLINK_*` (the variant's settings),
/// clink's default waiting (spin, then block: two senders share one core here, and a
/// refused sender that never blocked would take half of it from the granted one; the
/// receiver tests its receives in a loop and so never blocks), no calibration (nothing
/// here depends on the cost model: messages of 1 MiB go by rendezvous over UDP), UDP only.
fn context() -> Result<Context, String> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    cfg.calibrate = false;
    cfg.prefer_tcp = false;
    cfg.tcp = None;
    if cfg.udp.is_none() {
        return Err("the experiments need UDP (CLINK_UDP is off)".into());
    }
    Context::with_config(cfg).map_err(|e| e.to_string())
}

fn left(deadline: Instant) -> Option<Duration> {
    Some(deadline.saturating_duration_since(Instant::now()))
}

fn expect_udp(ep: &Endpoint, peer: PeerId) -> Result<(), String> {
    match ep.transport(peer).map_err(|e| e.to_string())? {
        "udp" => Ok(()),
        other => Err(format!("the peer is reached over {other}, not udp")),
    }
}

fn print_line(line: &str) -> Result<(), String> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot print: {e}"))
}

fn receiver(a: &ChildArgs, deadline: Instant) -> Result<(), String> {
    let err = |e: clink::Error| e.to_string();
    let ctx = context()?;
    let mut ep = ctx.endpoint().map_err(err)?;
    print_line(&format!("{ADDR_PREFIX}{}", ep.address()))?;
    let (size, count, n) = (a.size, a.count, a.senders);
    let mut peers = Vec::with_capacity(n);
    let mut index = Vec::with_capacity(n);
    for _ in 0..n {
        let p = ep.accept(left(deadline)).map_err(err)?;
        expect_udp(&ep, p)?;
        let mut b = [0u8; 8];
        ep.recv_timeout(Selector::exact(Some(p), TAG_HELLO), &mut b, left(deadline))
            .map_err(err)?;
        peers.push(p);
        index.push(u64::from_le_bytes(b) as usize);
    }
    // Expected payloads, written before the clock starts.
    let expected: Vec<[Vec<u8>; 3]> = index
        .iter()
        .map(|&s| [0, 1, 2].map(|j| pattern(s, j, size)))
        .collect();
    let sel = |k: usize| Selector::exact(Some(peers[k]), TAG_DATA);
    // Two receives posted per sender (buffers written, so their pages are resident), and
    // for each: which sender (accept order) and which of its messages.
    let mut reqs = Vec::new();
    let mut slots = Vec::new();
    for k in 0..n {
        for msg in 0..count.min(2) {
            reqs.push(ep.irecv(sel(k), vec![0xEE; size]).map_err(err)?);
            slots.push((k, msg));
        }
    }
    let mut next = vec![count.min(2); n];
    for &p in &peers {
        ep.send(p, TAG_GO, &[]).map_err(err)?;
    }
    let t0 = Instant::now();
    let cpu0 = process_cpu_secs();
    let total = count * n as u64;
    let (mut got, mut bad) = (0u64, 0u64);
    let mut first_bad = None;
    while got < total {
        // Busy-polls all the posted receives at once: a zero timeout makes up to 16
        // progress passes and never sleeps (the receiver spins, as it did when it tested
        // each receive in turn with `test_recv`, a progress pass per receive: four per
        // sweep with two senders, two with one, which cost two senders' aggregate 0.83x
        // -> 0.90-0.95x one sender). Sleeping after the spin time instead (the timeout
        // `left(deadline)`) read the same but for 5% loss, 0.11 -> 0.07 GB/s.
        let (i, r) = match ep.wait_any_recv(&reqs, Some(Duration::ZERO)) {
            Ok(done) => done,
            Err(clink::Error::Timeout) if Instant::now() < deadline => continue,
            Err(clink::Error::Timeout) => {
                return Err(format!(
                    "{got} of {total} messages after {:.1} s: stalled",
                    t0.elapsed().as_secs_f64()
                ))
            }
            Err(e) => return Err(e.to_string()),
        };
        let r = r.map_err(err)?;
        let (k, msg) = slots[i];
        let want = &expected[k][(msg % 3) as usize];
        // A slice comparison (memcmp): a byte loop here costs the receiver dearly.
        if r.buf != *want {
            bad += 1;
            let at = r.buf.iter().zip(want.iter()).position(|(x, y)| x != y);
            first_bad.get_or_insert_with(|| {
                format!(
                    "sender {} message {msg}: {} bytes, first wrong byte at {at:?}",
                    index[k],
                    r.buf.len()
                )
            });
        }
        got += 1;
        if next[k] < count {
            let mut buf = r.buf;
            buf.resize(size, 0);
            reqs[i] = ep.irecv(sel(k), buf).map_err(err)?;
            slots[i] = (k, next[k]);
            next[k] += 1;
        } else {
            let _done = reqs.swap_remove(i);
            slots.swap_remove(i);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu0;
    let s = ep.stats();
    for &p in &peers {
        ep.send(p, TAG_STOP, &[]).map_err(err)?;
    }
    let result = json!({
        "bytes": total * size as u64,
        "secs": secs,
        "cpu_s": cpu,
        "bad": bad,
        "first_bad": first_bad,
        "hits": s.spec_hits,
        "misses": s.spec_misses,
        "backoffs": s.spec_backoffs,
        "hit_bytes": s.spec_hit_bytes,
        "cleanup_bytes": s.cleanup_bytes,
        "hit_rate": s.spec_hit_rate(),
        "granted_hit_rate": s.granted_hit_rate(),
        "granted_fragments": s.granted_fragments,
        "steered_datagrams": s.steered_datagrams,
        "fast_grants": s.fast_grants,
        "fast_refusals": s.fast_refusals,
        "fast_revocations": s.fast_revocations,
        "stray_dropped": s.stray_dropped,
        "faults_injected": s.faults_injected,
        "duplicates_dropped": s.duplicates_dropped,
        "naks_sent": s.naks_sent,
        "datagrams_received": s.datagrams_received,
    });
    print_line(&format!("{RESULT_PREFIX}{result}"))?;
    ep.close();
    Ok(())
}

/// Bound on the interferer thread getting its first burst out ([`Interferer::go`]).
const START_WAIT: Duration = Duration::from_secs(1);

/// The stray-datagram thread of the interference experiment.
struct Interferer {
    go: Arc<AtomicBool>,
    /// Set by the thread once its first burst went out (see [`Interferer::go`]).
    started: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<(u64, f64)>,
}

impl Interferer {
    /// Starts a thread that, once [`Interferer::go`] is called, sends `n` stray datagrams
    /// to `target`, spread over the `count` messages whose completions `progress` counts
    /// (each message's share while it is under way, at the pace of the messages so far).
    fn start(
        target: std::net::SocketAddr,
        n: u64,
        count: u64,
        size: usize,
        seed: u64,
        progress: Arc<AtomicU64>,
    ) -> io::Result<Interferer> {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.connect(target)?; // (send() then skips the per-datagram route lookup)
        let go = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, st, s) = (go.clone(), started.clone(), stop.clone());
        let handle = thread::Builder::new()
            .name("interferer".into())
            .spawn(move || {
                while !g.load(Ordering::Acquire) && !s.load(Ordering::Acquire) {
                    thread::sleep(Duration::from_micros(100));
                }
                let share = n as f64 / count as f64;
                let t0 = Instant::now();
                // A first guess of a message's time (1 GB/s), then the measured mean.
                let mut per_msg = size as f64 / 1e9;
                let (mut last_done, mut last_change) = (0u64, t0);
                let mut rng = seed | 1;
                let mut buf = [0u8; 1400];
                let mut sent = 0u64;
                loop {
                    let done = progress.load(Ordering::Acquire);
                    let now = Instant::now();
                    if done != last_done {
                        last_done = done;
                        last_change = now;
                        per_msg = (now - t0).as_secs_f64() / done as f64;
                    }
                    if done >= count || s.load(Ordering::Acquire) {
                        break;
                    }
                    // Half a message ahead, so that the last strays go while the last
                    // message is still under way.
                    let frac = ((now - last_change).as_secs_f64() / per_msg).min(1.0);
                    let due = (((done as f64 + frac + 0.5) * share).ceil() as u64).min(n);
                    while sent < due {
                        // xorshift64
                        let mut next = || {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng
                        };
                        let len = 64 + (next() % (1400 - 64 + 1)) as usize;
                        for chunk in buf[..len].chunks_mut(8) {
                            let r = next().to_le_bytes();
                            chunk.copy_from_slice(&r[..chunk.len()]);
                        }
                        if sock.send(&buf[..len]).is_ok() {
                            sent += 1;
                        } else {
                            break; // (ENOBUFS and the like: try again at the next turn)
                        }
                    }
                    st.store(true, Ordering::Release);
                    // Sleep until the next stray is due at this pace, at least 200 us (a
                    // dense interferer sends its strays in bursts of a few dozen) and at
                    // most 2 ms: every wake-up preempts the sender on its core (waking
                    // every 20-40 us cost a quarter of the goodput even with 100 strays).
                    let next_at = (sent + 1) as f64 / share - 0.5 - done as f64; // messages
                    let wait =
                        (next_at * per_msg - (now - last_change).as_secs_f64()).clamp(200e-6, 2e-3);
                    thread::sleep(Duration::from_secs_f64(wait));
                }
                (sent, thread_cpu_secs())
            })?;
        Ok(Interferer {
            go,
            started,
            stop,
            handle,
        })
    }

    /// Lets the thread go and waits (at most [`START_WAIT`]) until its first burst is out:
    /// a short stream (`--quick`: a few milliseconds) could otherwise end before the
    /// thread, asleep between its checks of `go`, sent anything (the CLI test saw 0 strays).
    fn go(&self) {
        self.go.store(true, Ordering::Release);
        let until = Instant::now() + START_WAIT;
        while !self.started.load(Ordering::Acquire)
            && !self.handle.is_finished()
            && Instant::now() < until
        {
            thread::yield_now();
        }
    }

    /// Stops the thread: (datagrams sent, its CPU seconds).
    fn finish(self) -> Result<(u64, f64), String> {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .map_err(|_| "the interferer thread panicked".to_string())
    }
}

fn sender(a: &ChildArgs, deadline: Instant) -> Result<(), String> {
    let err = |e: clink::Error| e.to_string();
    let addr = a.addr.as_deref().ok_or("a sender needs --addr")?;
    let ctx = context()?;
    let mut ep = ctx.endpoint().map_err(err)?;
    let peer = ep.connect(addr).map_err(err)?;
    expect_udp(&ep, peer)?;
    ep.send(peer, TAG_HELLO, &(a.index as u64).to_le_bytes())
        .map_err(err)?;
    let pats: [Bytes; 3] = [0, 1, 2].map(|j| Bytes::from(pattern(a.index, j, a.size)));
    let progress = Arc::new(AtomicU64::new(0));
    let interferer = if a.interfere > 0 {
        let target = clink_proto::addr::Address::parse(addr)
            .map_err(|e| e.to_string())?
            .udp
            .first()
            .copied()
            .ok_or("the receiver's address has no udp= part")?;
        let i = Interferer::start(
            target,
            a.interfere,
            a.count,
            a.size,
            a.seed,
            progress.clone(),
        )
        .map_err(|e| format!("cannot start the interferer: {e}"))?;
        Some(i)
    } else {
        None
    };
    ep.recv_timeout(Selector::exact(Some(peer), TAG_GO), &mut [], left(deadline))
        .map_err(err)?;
    let cpu0 = process_cpu_secs();
    if let Some(i) = &interferer {
        i.go();
    }
    let mut inflight = VecDeque::with_capacity(WINDOW);
    let (mut next, mut done) = (0u64, 0u64);
    while done < a.count {
        while inflight.len() < WINDOW && next < a.count {
            let data = pats[(next % 3) as usize].clone();
            inflight.push_back(ep.isend(peer, TAG_DATA, data).map_err(err)?);
            next += 1;
        }
        let front = inflight.front().expect("a send in flight");
        ep.wait_send(front, left(deadline))
            .map_err(|e| format!("message {done} of {}: {e}", a.count))?;
        inflight.pop_front();
        done += 1;
        progress.store(done, Ordering::Release);
    }
    let cpu = process_cpu_secs() - cpu0;
    let (strays, stray_cpu) = match interferer {
        Some(i) => i.finish()?,
        None => (0, 0.0),
    };
    ep.recv_timeout(
        Selector::exact(Some(peer), TAG_STOP),
        &mut [],
        left(deadline),
    )
    .map_err(err)?;
    let s = ep.stats();
    let result = json!({
        "cpu_s": (cpu - stray_cpu).max(0.0),
        "interfering": strays,
        "interferer_cpu_s": stray_cpu,
        "retransmissions": s.retransmissions,
        "timeouts": s.timeouts,
        "window_cuts": s.window_cuts,
        "fast_granted": s.fast_granted,
        "fast_refused": s.fast_refused,
        "datagrams_sent": s.datagrams_sent,
    });
    print_line(&format!("{RESULT_PREFIX}{result}"))?;
    ep.close();
    Ok(())
}
