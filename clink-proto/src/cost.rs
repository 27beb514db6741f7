//! The cost model behind the protocol thresholds (BIP: "model all you can").
//!
//! The runtime measures a few costs on the machine it runs on ([`Costs`]); these pure
//! functions turn them into the eager/rendezvous threshold and the pipeline chunk size.
//! Each is a crossover of two simple linear cost formulas, so `clink info` can print not
//! only the numbers but why.

/// Measured costs of the primitive operations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// memcpy bandwidth for cache-sized buffers, bytes per nanosecond (= GB/s).
    pub copy_bytes_per_ns: f64,
    /// Single-copy cross-process read (process_vm_readv) bandwidth, bytes per nanosecond.
    pub cma_bytes_per_ns: f64,
    /// Fixed cost of one process_vm_readv call, nanoseconds.
    pub cma_call_ns: f64,
    /// memcpy bandwidth for buffers larger than the last-level cache, bytes per ns.
    pub copy_dram_bytes_per_ns: f64,
    /// CMA bandwidth for buffers larger than the last-level cache, bytes per ns.
    pub cma_dram_bytes_per_ns: f64,
    /// Size of the last-level cache, bytes.
    pub cache_bytes: u64,
    /// Cost of one control message between the two processes (one ring hop), nanoseconds.
    pub hop_ns: f64,
}

impl Default for Costs {
    /// Conservative figures for a current x86 server, used when measuring is disabled.
    fn default() -> Self {
        Costs {
            copy_bytes_per_ns: 10.0,
            cma_bytes_per_ns: 8.0,
            cma_call_ns: 1500.0,
            copy_dram_bytes_per_ns: 5.0,
            cma_dram_bytes_per_ns: 4.0,
            cache_bytes: 8 << 20,
            hop_ns: 300.0,
        }
    }
}

/// How a rendezvous message is moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rndv {
    /// One copy: the receiver reads the sender's buffer with process_vm_readv.
    Cma,
    /// Two copies in a pipeline: the sender copies chunks into the ring while the receiver
    /// copies earlier chunks out (the two cores work at once).
    Pipeline,
}

/// Smallest threshold the model will choose.
pub const MIN_EAGER: u64 = 1024;

/// Smallest CMA rendezvous (bytes received) split between the two sides, the sender
/// writing the first half while the receiver reads the second: below it the extra
/// round trip and the second call cost more than half a copy saves.
pub const CMA_SPLIT_MIN: u64 = 128 << 10;

/// First line of the host cost cache's text (format version 1).
pub const CACHE_HEADER: &str = "clink-costs 1";

/// What a machine clink runs on can measure for each figure; a measurement outside these
/// bounds was disturbed (a 12 us ring hop measured while 32 processes start on 2 cores)
/// and must not choose the protocols.
const PLAUSIBLE: [(&str, f64, f64); 7] = [
    ("copy_bytes_per_ns", 0.5, 500.0),
    ("cma_bytes_per_ns", 0.1, 500.0),
    ("cma_call_ns", 50.0, 100_000.0),
    ("copy_dram_bytes_per_ns", 0.1, 500.0),
    ("cma_dram_bytes_per_ns", 0.05, 500.0),
    ("cache_bytes", 65_536.0, 16.0 * 1_073_741_824.0),
    ("hop_ns", 10.0, 5_000.0),
];

impl Costs {
    fn fields(&self) -> [f64; 7] {
        [
            self.copy_bytes_per_ns,
            self.cma_bytes_per_ns,
            self.cma_call_ns,
            self.copy_dram_bytes_per_ns,
            self.cma_dram_bytes_per_ns,
            self.cache_bytes as f64,
            self.hop_ns,
        ]
    }

    /// The figures that are outside what any machine could measure (see `PLAUSIBLE`),
    /// replaced by the built-in ones; returns the corrected costs and the names replaced.
    pub fn sanitized(&self) -> (Costs, Vec<&'static str>) {
        let d = Costs::default();
        let mut c = *self;
        let mut bad = Vec::new();
        let defaults = d.fields();
        let slots: [&mut f64; 6] = [
            &mut c.copy_bytes_per_ns,
            &mut c.cma_bytes_per_ns,
            &mut c.cma_call_ns,
            &mut c.copy_dram_bytes_per_ns,
            &mut c.cma_dram_bytes_per_ns,
            &mut c.hop_ns,
        ];
        for (i, slot) in [0usize, 1, 2, 3, 4, 6].into_iter().zip(slots) {
            let (name, lo, hi) = PLAUSIBLE[i];
            if !(lo..=hi).contains(slot) || !slot.is_finite() {
                *slot = defaults[i];
                bad.push(name);
            }
        }
        let (name, lo, hi) = PLAUSIBLE[5];
        if !(lo..=hi).contains(&(c.cache_bytes as f64)) {
            c.cache_bytes = d.cache_bytes;
            bad.push(name);
        }
        (c, bad)
    }

    /// The host cost cache's text for costs measured during boot `boot` (the kernel's boot
    /// id: a cache from another boot, or another machine, is not used).
    pub fn to_cache_text(&self, boot: &str) -> String {
        let mut t = format!("{CACHE_HEADER}\nboot {}\n", boot.trim());
        for ((name, _, _), v) in PLAUSIBLE.iter().zip(self.fields()) {
            t.push_str(&format!("{name} {v}\n"));
        }
        t
    }

    /// Parses [`Costs::to_cache_text`]'s text: the boot id it was measured in and the
    /// costs. Anything missing, unknown, repeated or implausible is an error (the caller
    /// then measures again).
    pub fn from_cache_text(text: &str) -> Result<(String, Costs), String> {
        let mut lines = text.lines();
        if lines.next() != Some(CACHE_HEADER) {
            return Err("not a clink cost cache (or another version)".into());
        }
        let boot = lines
            .next()
            .and_then(|l| l.strip_prefix("boot "))
            .filter(|b| !b.is_empty() && b.len() <= 64)
            .ok_or("no boot id")?
            .to_string();
        let mut vals: [Option<f64>; 7] = [None; 7];
        for l in lines {
            let (name, v) = l.split_once(' ').ok_or_else(|| format!("bad line {l:?}"))?;
            let i = PLAUSIBLE
                .iter()
                .position(|(n, _, _)| *n == name)
                .ok_or_else(|| format!("unknown figure {name:?}"))?;
            let v: f64 = v.parse().map_err(|_| format!("bad value in {l:?}"))?;
            let (_, lo, hi) = PLAUSIBLE[i];
            if !(lo..=hi).contains(&v) {
                return Err(format!("{name} {v} is outside {lo}..={hi}"));
            }
            if vals[i].replace(v).is_some() {
                return Err(format!("{name} given twice"));
            }
        }
        let f = |i: usize| vals[i].ok_or_else(|| format!("{} missing", PLAUSIBLE[i].0));
        Ok((
            boot,
            Costs {
                copy_bytes_per_ns: f(0)?,
                cma_bytes_per_ns: f(1)?,
                cma_call_ns: f(2)?,
                copy_dram_bytes_per_ns: f(3)?,
                cma_dram_bytes_per_ns: f(4)?,
                cache_bytes: f(5)? as u64,
                hop_ns: f(6)?,
            },
        ))
    }

    /// Nanoseconds to move `n` bytes eagerly: copied into the ring and out of it.
    pub fn eager_ns(&self, n: u64) -> f64 {
        2.0 * n as f64 / self.copy_bytes_per_ns
    }

    /// Extra nanoseconds (beyond the request hop an eager send also pays) to move `n`
    /// bytes by rendezvous with one CMA copy (at the in-cache or the memory rate).
    pub fn rendezvous_ns(&self, n: u64) -> f64 {
        let bw = if 2 * n <= self.cache_bytes {
            self.cma_bytes_per_ns
        } else {
            self.cma_dram_bytes_per_ns
        };
        self.cma_call_ns + n as f64 / bw
    }

    /// The eager/rendezvous threshold: the largest size still sent eagerly. It is where
    /// the two costs cross, clamped to `[MIN_EAGER, max_eager]` (`max_eager` is set by the
    /// ring size: an eager frame must fit comfortably in the ring).
    pub fn eager_threshold(&self, cma: bool, max_eager: u64) -> u64 {
        let max_eager = max_eager.max(MIN_EAGER);
        if !cma {
            // Without CMA the alternative is the pipeline, which also copies twice and
            // adds hops per chunk: eager wins up to the ring limit.
            return max_eager;
        }
        let per_byte = 2.0 / self.copy_bytes_per_ns - 1.0 / self.cma_bytes_per_ns;
        if per_byte <= 0.0 {
            return max_eager;
        }
        let n = self.cma_call_ns / per_byte;
        (n as u64).clamp(MIN_EAGER, max_eager)
    }

    /// Nanoseconds to move `n` bytes through the two-copy pipeline: a request/answer
    /// round trip, then the slower of the two (concurrent) copy streams, at the cache rate
    /// while sender buffer, receiver buffer and ring fit in the cache together, else at
    /// the memory rate.
    pub fn pipeline_ns(&self, n: u64) -> f64 {
        let bw = if 2 * n <= self.cache_bytes {
            self.copy_bytes_per_ns
        } else {
            self.copy_dram_bytes_per_ns
        };
        2.0 * self.hop_ns + n as f64 / bw
    }

    /// Extra nanoseconds of a split CMA rendezvous (see [`CMA_SPLIT_MIN`]): the push and
    /// its answer, then one call on each side moving half the bytes at once.
    pub fn split_rendezvous_ns(&self, n: u64) -> f64 {
        2.0 * self.hop_ns + self.rendezvous_ns(n.div_ceil(2))
    }

    /// The rendezvous method for an `n`-byte message: the cheaper of [`Rndv::Cma`] (when
    /// permitted; split between the two sides when `split` and `n` is at least
    /// [`CMA_SPLIT_MIN`]) and [`Rndv::Pipeline`].
    pub fn rendezvous_method(&self, n: u64, cma: bool, split: bool) -> Rndv {
        let cma_ns = if split && n >= CMA_SPLIT_MIN {
            self.split_rendezvous_ns(n)
        } else {
            self.rendezvous_ns(n)
        };
        if cma && self.hop_ns + cma_ns < self.pipeline_ns(n) {
            Rndv::Cma
        } else {
            Rndv::Pipeline
        }
    }

    /// Chunk size of the pipeline for an `n`-byte message: minimises
    /// `(n / c) * hop + c / B` (per-chunk hops against the time to fill the pipeline), i.e.
    /// `c = sqrt(n * hop * B)`, clamped to `[min_chunk, slot_bytes]`.
    pub fn chunk_size(&self, n: u64, min_chunk: u64, slot_bytes: u64) -> u64 {
        let c = (n as f64 * self.hop_ns * self.copy_bytes_per_ns).sqrt() as u64;
        // Whole cache lines, so chunks land aligned.
        let c = c.clamp(min_chunk.min(slot_bytes), slot_bytes);
        if c >= 64 {
            c & !63
        } else {
            c
        }
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_cache_text_round_trips_and_refuses_what_is_off() {
        let c = Costs {
            hop_ns: 57.5,
            cache_bytes: 32 << 20,
            ..Costs::default()
        };
        let t = c.to_cache_text("abc-123\n");
        assert_eq!(Costs::from_cache_text(&t), Ok(("abc-123".to_string(), c)));
        assert!(
            Costs::from_cache_text(&t.replace("hop_ns 57.5", "hop_ns 12000")).is_err(),
            "a disturbed hop"
        );
        assert!(Costs::from_cache_text(&t.replace("clink-costs 1", "clink-costs 2")).is_err());
        assert!(
            Costs::from_cache_text(&format!("{t}hop_ns 60\n")).is_err(),
            "repeated"
        );
        assert!(
            Costs::from_cache_text(&t.replace("hop_ns 57.5\n", "")).is_err(),
            "missing"
        );
        let (fixed, bad) = Costs {
            hop_ns: 12_000.0,
            copy_bytes_per_ns: f64::NAN,
            ..c
        }
        .sanitized();
        assert_eq!(bad, vec!["copy_bytes_per_ns", "hop_ns"]);
        assert_eq!(fixed.hop_ns, Costs::default().hop_ns);
        assert_eq!(c.sanitized(), (c, vec![]));
    }

    proptest! {
        /// The cache is a file other processes wrote: any text parses or is refused.
        #[test]
        fn any_cache_text_is_parsed_or_refused(t in ".{0,300}") {
            if let Ok((_, c)) = Costs::from_cache_text(&t) {
                prop_assert!(c.sanitized().1.is_empty());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn threshold_is_the_crossover() {
        let c = Costs {
            copy_bytes_per_ns: 10.0,
            cma_bytes_per_ns: 10.0,
            cma_call_ns: 1000.0,
            hop_ns: 300.0,
            ..Costs::default()
        };
        let t = c.eager_threshold(true, 1 << 20);
        assert_eq!(t, 10_000);
        assert!(c.eager_ns(t - 100) < c.rendezvous_ns(t - 100));
        assert!(c.eager_ns(t + 100) > c.rendezvous_ns(t + 100));
        assert_eq!(c.eager_threshold(false, 1 << 16), 1 << 16);
    }

    #[test]
    fn pipeline_in_cache_cma_beyond() {
        let c = Costs {
            copy_bytes_per_ns: 30.0,
            cma_bytes_per_ns: 9.0,
            cma_call_ns: 1500.0,
            copy_dram_bytes_per_ns: 6.0,
            cma_dram_bytes_per_ns: 7.0,
            cache_bytes: 16 << 20,
            hop_ns: 100.0,
        };
        assert_eq!(c.rendezvous_method(1 << 20, true, false), Rndv::Pipeline);
        assert_eq!(c.rendezvous_method(64 << 20, true, false), Rndv::Cma);
        assert_eq!(c.rendezvous_method(64 << 20, false, false), Rndv::Pipeline);
    }

    #[test]
    fn a_split_halves_the_cma_copy() {
        let c = Costs {
            copy_bytes_per_ns: 30.0,
            cma_bytes_per_ns: 25.0,
            cma_call_ns: 1500.0,
            cache_bytes: 64 << 20,
            hop_ns: 100.0,
            ..Costs::default()
        };
        // 4 MiB: pipeline 0.2 + 139.8 us, CMA 0.1 + 1.5 + 167.8 us whole, 0.3 + 1.5 +
        // 83.9 us split.
        assert_eq!(c.rendezvous_method(4 << 20, true, false), Rndv::Pipeline);
        assert_eq!(c.rendezvous_method(4 << 20, true, true), Rndv::Cma);
        // Just under the split size a split would beat the pipeline (0.3 + 1.5 + 2.6 us
        // against 0.2 + 4.4), but nothing is split there: CMA whole loses (0.1 + 1.5 + 5.2).
        let n = CMA_SPLIT_MIN - 1;
        assert!(c.hop_ns + c.split_rendezvous_ns(n) < c.pipeline_ns(n));
        assert_eq!(c.rendezvous_method(n, true, true), Rndv::Pipeline);
        assert_eq!(c.rendezvous_method(CMA_SPLIT_MIN, true, true), Rndv::Cma);
    }

    #[test]
    fn slow_cma_means_eager_up_to_the_limit() {
        let c = Costs {
            copy_bytes_per_ns: 10.0,
            cma_bytes_per_ns: 4.0,
            cma_call_ns: 1000.0,
            hop_ns: 300.0,
            ..Costs::default()
        };
        assert_eq!(c.eager_threshold(true, 65536), 65536);
    }

    proptest! {
        #[test]
        fn outputs_stay_in_bounds(copy in 0.1f64..100.0, cma in 0.1f64..100.0, call in 0.0f64..1e6, hop in 0.0f64..1e5, n in 0u64..(1u64 << 40), max in 0u64..(1 << 24)) {
            let c = Costs { copy_bytes_per_ns: copy, cma_bytes_per_ns: cma, cma_call_ns: call, hop_ns: hop, ..Costs::default() };
            prop_assert_eq!(c.rendezvous_method(n, false, true), Rndv::Pipeline);
            let t = c.eager_threshold(true, max);
            prop_assert!(t >= MIN_EAGER && t <= max.max(MIN_EAGER));
            let k = c.chunk_size(n, 16 << 10, 1 << 20);
            prop_assert!((16 << 10..=1 << 20).contains(&k));
        }
    }
}

/// Learns which rendezvous method is faster towards one peer, from the transfers it makes.
///
/// The start-time model is a snapshot, and the machine changes under it (on the
/// development VMs the cross-core path flips between two speeds within seconds, which
/// moves the pipeline by 2x and CMA hardly at all). So the receiver times every
/// rendezvous it makes, keeps a moving average of nanoseconds per byte per method and
/// size class (fits in the cache or not), uses the faster one, and tries the other one
/// message in [`RndvChooser::EXPLORE`] so a change is noticed.
#[derive(Clone, Debug, Default)]
pub struct RndvChooser {
    /// `[size class][method]`: moving average of ns per byte, 0 when not yet measured.
    ns_per_byte: [[f64; 2]; 2],
    count: u64,
}

fn slot(m: Rndv) -> usize {
    match m {
        Rndv::Cma => 0,
        Rndv::Pipeline => 1,
    }
}

impl RndvChooser {
    /// One rendezvous in this many tries the method that is not the current favourite.
    pub const EXPLORE: u64 = 16;
    /// Weight of a new sample in the moving average.
    const ALPHA: f64 = 0.25;

    fn class(costs: &Costs, n: u64) -> usize {
        usize::from(2 * n > costs.cache_bytes)
    }

    /// The method for an `n`-byte message. `cma` says whether CMA is possible at all;
    /// `model` is the cost model's choice, used until both methods have been measured.
    pub fn choose(&mut self, costs: &Costs, n: u64, cma: bool, model: Rndv) -> Rndv {
        if !cma {
            return Rndv::Pipeline;
        }
        self.count += 1;
        let m = self.ns_per_byte[Self::class(costs, n)];
        let (c, p) = (m[0], m[1]);
        let best = if c == 0.0 || p == 0.0 {
            model
        } else if c <= p {
            Rndv::Cma
        } else {
            Rndv::Pipeline
        };
        let other = match best {
            Rndv::Cma => Rndv::Pipeline,
            Rndv::Pipeline => Rndv::Cma,
        };
        let unmeasured = m[slot(other)] == 0.0;
        if self.count.is_multiple_of(Self::EXPLORE) || (unmeasured && self.count.is_multiple_of(4))
        {
            other
        } else {
            best
        }
    }

    /// Records that moving `n` bytes with `method` took `ns` nanoseconds.
    pub fn record(&mut self, costs: &Costs, method: Rndv, n: u64, ns: f64) {
        if n == 0 || !ns.is_finite() || ns <= 0.0 {
            return;
        }
        let v = ns / n as f64;
        let e = &mut self.ns_per_byte[Self::class(costs, n)][slot(method)];
        // A sample faster than the average replaces it; slower ones move it by ALPHA.
        // Interference only ever slows a transfer down (the first ones into a fresh
        // buffer fault its pages in), so a fast sample shows what the method does; a slow
        // first sample averaged in kept the method unused for many explorations (64 MiB
        // arrays from Python went by the pipeline at 0.7x the Rust figure).
        *e = if *e == 0.0 || v < *e {
            v
        } else {
            *e + Self::ALPHA * (v - *e)
        };
    }

    /// Moving averages in GB/s as `[size class][Cma, Pipeline]` (0 = not measured), for
    /// diagnostics.
    pub fn rates_gbs(&self) -> [[f64; 2]; 2] {
        self.ns_per_byte
            .map(|c| c.map(|v| if v > 0.0 { 1.0 / v } else { 0.0 }))
    }
}

#[cfg(test)]
mod chooser_tests {
    use super::*;

    #[test]
    fn a_slow_first_transfer_does_not_keep_the_faster_method_unused() {
        // The first CMA transfer faults in the receiver's fresh pages (10x slower); from
        // then on CMA is twice as fast as the pipeline. One exploration later it is the
        // favourite again.
        let c = Costs::default();
        let mut ch = RndvChooser::default();
        let n = 64 << 20;
        let mut picks = Vec::new();
        for i in 0..48 {
            let m = ch.choose(&c, n, true, Rndv::Cma);
            picks.push(m);
            let ns = match m {
                Rndv::Cma if i == 0 => 1_000_000_000.0,
                Rndv::Cma => 10_000_000.0,
                Rndv::Pipeline => 20_000_000.0,
            };
            ch.record(&c, m, n, ns);
        }
        let cma_late = picks[16..].iter().filter(|&&m| m == Rndv::Cma).count();
        assert!(cma_late >= 30, "{picks:?}");
    }

    #[test]
    fn follows_the_faster_method_and_keeps_exploring() {
        let c = Costs::default();
        let mut ch = RndvChooser::default();
        let n = 1 << 20;
        // Pipeline is twice as fast: after both are measured it is chosen most of the time.
        let mut picks = [0u32; 2];
        for _ in 0..320 {
            let m = ch.choose(&c, n, true, Rndv::Cma);
            picks[slot(m)] += 1;
            let ns = match m {
                Rndv::Cma => 100_000.0,
                Rndv::Pipeline => 50_000.0,
            };
            ch.record(&c, m, n, ns);
        }
        assert!(picks[1] > 250, "{picks:?}");
        assert!(
            picks[0] >= 320 / RndvChooser::EXPLORE as u32 - 2,
            "still explores: {picks:?}"
        );
        // The machine changes: CMA becomes faster; the chooser follows.
        let mut late = [0u32; 2];
        for i in 0..640 {
            let m = ch.choose(&c, n, true, Rndv::Cma);
            if i >= 320 {
                late[slot(m)] += 1;
            }
            let ns = match m {
                Rndv::Cma => 30_000.0,
                Rndv::Pipeline => 50_000.0,
            };
            ch.record(&c, m, n, ns);
        }
        assert!(late[0] > 250, "{late:?}");
        assert_eq!(
            RndvChooser::default().choose(&c, n, false, Rndv::Cma),
            Rndv::Pipeline
        );
    }
}
