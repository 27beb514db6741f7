//! The per-process context: configuration, measured costs, host identity.

use crate::config::Config;
use crate::{calibrate, sys, Result};
use clink_proto::cost::Costs;
use std::sync::Arc;

pub(crate) struct CtxInner {
    pub config: Config,
    pub costs: Costs,
    pub calibrated: bool,
    pub costs_source: calibrate::Source,
    pub host: u64,
    pub pid: i32,
    /// Same-host peers each endpoint expects ([`crate::Endpoint::expect_peers`]); 0: unknown.
    pub local_peers: usize,
}

/// One per process: configuration (from `CLINK_*` variables), the measured cost model and
/// the host identity. Cheap to clone (shared). `Send + Sync`.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<CtxInner>,
}

/// Host key: the boot id and network namespace, hashed. Two endpoints can share memory
/// only when both match (abstract sockets are per network namespace).
fn host_key() -> u64 {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    // FNV-1a: stable across processes and builds (std's hasher is randomly keyed).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in boot.trim().bytes().chain([0]).chain(netns.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Context {
    /// A context configured from the environment (`CLINK_*`, see [`crate::config`]).
    pub fn new() -> Result<Context> {
        Context::with_config(Config::from_env()?)
    }

    /// A context with an explicit configuration.
    pub fn with_config(config: Config) -> Result<Context> {
        let (costs, source) = if config.calibrate {
            calibrate::host_costs(config.costs_cache.as_deref(), config.calibrate_fresh)
        } else {
            (Costs::default(), calibrate::Source::BuiltIn)
        };
        let calibrated = source != calibrate::Source::BuiltIn;
        Ok(Context {
            inner: Arc::new(CtxInner {
                config,
                costs,
                calibrated,
                costs_source: source,
                host: host_key(),
                pid: sys::getpid(),
                local_peers: 0,
            }),
        })
    }

    /// A context configured from the environment, for a process started by a launcher
    /// (`mpirun`, `srun`), with the job it belongs to: its rank, the job's size, and the
    /// exchange of endpoint addresses between the ranks ([`crate::launcher::Launcher`]).
    /// Fails with [`crate::Error::Launcher`] when no launcher started the process.
    /// Its endpoints expect the job's other ranks on this node as peers
    /// ([`crate::Endpoint::expect_peers`]) when the launcher says how many there are.
    pub fn from_launcher() -> Result<(Context, crate::launcher::Launcher)> {
        Context::from_launcher_with(Config::from_env()?)
    }

    /// [`Context::from_launcher`] with an explicit configuration.
    pub fn from_launcher_with(config: Config) -> Result<(Context, crate::launcher::Launcher)> {
        let job = crate::launcher::Launcher::from_env()?;
        let mut ctx = Context::with_config(config)?;
        if let Some(n) = job.local_size() {
            if let Some(inner) = Arc::get_mut(&mut ctx.inner) {
                inner.local_peers = n as usize - 1;
            }
        }
        Ok((ctx, job))
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The cost model's inputs (measured, or built-in when calibration is off).
    pub fn costs(&self) -> (Costs, bool) {
        (self.inner.costs, self.inner.calibrated)
    }

    /// Where the costs came from: measured here, read from the host's cache, or built in.
    pub fn costs_source(&self) -> &'static str {
        self.inner.costs_source.as_str()
    }

    /// The eager/rendezvous threshold for a peer with or without CMA, and the ring's limit.
    pub fn eager_threshold(&self, cma: bool) -> u64 {
        eager_threshold(&self.inner, cma, u64::from(self.inner.config.ring_cells))
    }

    /// The eager/rendezvous thresholds towards network peers: over reliable UDP, and over
    /// TCP (or unreliable UDP).
    pub fn net_eager_thresholds(&self) -> (u64, u64) {
        (
            net_eager_threshold(&self.inner, true),
            net_eager_threshold(&self.inner, false),
        )
    }

    /// The rendezvous method the cost model (or `CLINK_RNDV`) picks for `n` bytes.
    pub fn rendezvous_method(&self, n: u64, cma: bool) -> clink_proto::cost::Rndv {
        rendezvous_method(&self.inner, n, cma)
    }

    /// Chunk size of the pipelined rendezvous for an `n`-byte message.
    pub fn pipeline_chunk(&self, n: u64) -> u64 {
        pipeline_chunk(&self.inner, n, u64::from(self.inner.config.ring_cells))
    }

    /// Host key of this process (machine + network namespace).
    pub fn host(&self) -> u64 {
        self.inner.host
    }
}

/// Largest eager payload a ring of `cells` cells takes (a quarter of it, never more
/// than one record can hold).
pub(crate) fn ring_eager_limit(cells: u64) -> u64 {
    use crate::transport::shm::ring::{max_payload, CELL};
    (cells * CELL as u64 / 4)
        .min(max_payload(cells) as u64 - clink_proto::wire::EAGER_HEADER as u64)
}

/// Largest chunk of a pipelined rendezvous through a ring of `cells` cells (a quarter of
/// the ring, so several are in flight).
pub(crate) fn ring_chunk_limit(cells: u64) -> u64 {
    ring_eager_limit(cells) + clink_proto::wire::EAGER_HEADER as u64
        - clink_proto::wire::CHUNK_HEADER as u64
}

/// Chunk size of the pipelined rendezvous for an `n`-byte message through a ring of
/// `cells` cells.
pub(crate) fn pipeline_chunk(c: &CtxInner, n: u64, cells: u64) -> u64 {
    let max = ring_chunk_limit(cells);
    c.config
        .chunk
        .unwrap_or_else(|| c.costs.chunk_size(n, 16 << 10, max))
        .min(max)
}

/// The rendezvous method for an `n`-byte message from a peer whose memory we can (or
/// cannot) read with CMA.
pub(crate) fn rendezvous_method(c: &CtxInner, n: u64, cma: bool) -> clink_proto::cost::Rndv {
    use clink_proto::cost::Rndv;
    match c.config.rndv {
        Some(Rndv::Cma) if cma => Rndv::Cma,
        Some(_) => Rndv::Pipeline,
        None => c.costs.rendezvous_method(n, cma, c.config.cma_split),
    }
}

/// The eager threshold towards a peer (CMA or not) over a ring of `cells` cells: the
/// cost model's (or `CLINK_EAGER_MAX`), never more than the ring takes.
pub(crate) fn eager_threshold(c: &CtxInner, cma: bool, cells: u64) -> u64 {
    let limit = ring_eager_limit(cells);
    match c.config.eager_max {
        Some(v) => v,
        None => c.costs.eager_threshold(cma, limit),
    }
    .min(limit)
}

/// Eager limit over the network unless `CLINK_EAGER_MAX` says otherwise: above it a
/// message waits for its receive (rendezvous) instead of filling the receiver's memory.
const NET_EAGER_MAX: u64 = 64 << 10;
/// The same over a reliable UDP link. Above it the rendezvous's bulk transfer (fragments
/// sent from the caller's buffer, landed in the posted one, payloads left to the UDP
/// checksum) beats an eager message (copied into the connection, CRC-32C over every
/// payload, copied out) despite its extra round trip: one-way across two bridge hosts,
/// 32 KiB took 36-46 us against 60-71 eager, 64 KiB 62-69 against 79-97; at 16 KiB the
/// round trip costs more than the copies save (BENCHMARKS.md).
const UDP_EAGER_MAX: u64 = 16 << 10;
/// Largest frame payload a connection message carries, with room for the frame header
/// (the connection refuses longer messages: see `clink_proto::reliable::Config`).
const NET_FRAME_MAX: u64 = (1 << 30) - 64;

/// The eager/rendezvous threshold towards a network peer: over reliable UDP (`bulk`: a
/// rendezvous there is a bulk transfer), or over TCP and unreliable UDP (where a message is
/// one eager frame at most).
pub(crate) fn net_eager_threshold(c: &CtxInner, bulk: bool) -> u64 {
    let default = if bulk { UDP_EAGER_MAX } else { NET_EAGER_MAX };
    c.config.eager_max.unwrap_or(default).min(NET_FRAME_MAX)
}
