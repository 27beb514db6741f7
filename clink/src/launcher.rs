//! Ranks of a job started by a launcher (`mpirun`, `srun`) find each other through the
//! launcher's PMIx service: each publishes its endpoint's address, a fence makes them
//! visible, and each reads everyone's. `libpmix.so.2` (Debian's libpmix2, which Open MPI
//! and Slurm bring) is loaded at run time, so programs that never ask need no PMIx.
//!
//! ```no_run
//! let (ctx, job) = clink::Context::from_launcher()?;
//! let mut ep = ctx.endpoint()?;
//! let addrs = job.exchange_addresses(&ep.address())?;
//! println!("rank {} of {}: {} addresses", job.rank(), job.size(), addrs.len());
//! # Ok::<(), clink::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::sys::pmix;
use std::ffi::CString;

fn fail(what: impl Into<String>) -> Error {
    Error::Launcher(what.into())
}

/// This process's place in a launched job, and the launcher's key-value service.
pub struct Launcher {
    pmix: pmix::Client,
    size: u32,
    local_size: Option<u32>,
}

impl Launcher {
    /// Joins the job that started this process. Fails with [`Error::Launcher`] when no
    /// launcher did (no `PMIX_NAMESPACE` in the environment) or its service answers with
    /// an error.
    pub fn from_env() -> Result<Launcher> {
        if std::env::var_os("PMIX_NAMESPACE").is_none() {
            return Err(fail(
                "this process was not started by a PMIx launcher (mpirun, srun): PMIX_NAMESPACE is not set",
            ));
        }
        let pmix = pmix::Client::init().map_err(fail)?;
        let size = pmix.get_u32(None, c"pmix.job.size").map_err(fail)?;
        let size = size
            .filter(|&n| n > 0)
            .ok_or_else(|| fail("the job size is not a positive number"))?;
        // Optional: a launcher that does not say leaves the rings sized as peers come.
        let local_size = pmix
            .get_u32(None, c"pmix.local.size")
            .ok()
            .flatten()
            .filter(|&n| n > 0 && n <= size);
        Ok(Launcher {
            pmix,
            size,
            local_size,
        })
    }

    /// This process's rank (0-based).
    pub fn rank(&self) -> u32 {
        self.pmix.rank()
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Number of the job's ranks on this node (this one included), when the launcher
    /// says (`pmix.local.size`).
    pub fn local_size(&self) -> Option<u32> {
        self.local_size
    }

    /// Publishes `addr` as this rank's endpoint address and returns every rank's, indexed
    /// by rank (this one's included). Collective: every rank of the job must call it.
    pub fn exchange_addresses(&self, addr: &str) -> Result<Vec<String>> {
        let key = c"clink.address";
        let text = CString::new(addr).map_err(|_| fail("an address with a NUL byte"))?;
        self.pmix.put_string(key, &text).map_err(fail)?;
        self.pmix.commit().map_err(fail)?;
        self.pmix.fence().map_err(fail)?;
        (0..self.size)
            .map(|rank| {
                self.pmix
                    .get_string(Some(rank), key)
                    .map_err(fail)?
                    .ok_or_else(|| fail(format!("rank {rank} published no address")))
            })
            .collect()
    }
}
