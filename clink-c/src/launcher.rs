//! Ranks of a job started by a launcher (`mpirun`, `srun`) finding each other through the
//! launcher's PMIx service, as `clink::Context::from_launcher` does in Rust.

use crate::*;
use clink_rs::launcher::Launcher;
use clink_rs::Context;
use std::ffi::{c_char, c_int, CString};

/// The job a launcher started this process in (`clink_context_from_launcher`): this
/// process's rank, the job's size, and after `clink_job_exchange` every rank's endpoint
/// address.
pub struct clink_job_t {
    job: Launcher,
    addrs: Vec<CString>,
}

/// Creates a context configured from the `CLINK_*` environment variables and joins the
/// job of the launcher that started this process (`mpirun`, `srun`: its PMIx service,
/// `libpmix.so.2`, loaded at run time). Fails with `CLINK_ERR_CONFIG` when no launcher
/// started the process, or the launcher's service fails (`clink_last_error` says which).
///
/// Ownership: on success `*ctx` is a new context (`clink_context_free`) and `*job` a new
/// job (`clink_job_free`). Thread safety: any thread; call it once per process.
///
/// # Safety
/// `ctx` and `job` must point to writable storage for a pointer (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_context_from_launcher(
    ctx: *mut *mut clink_context_t,
    job: *mut *mut clink_job_t,
) -> c_int {
    ffi("clink_context_from_launcher", || {
        need_out(ctx, "ctx")?;
        need_out(job, "job")?;
        let (c, j) = Context::from_launcher()?;
        ctx.write(Box::into_raw(Box::new(clink_context_t::new(c))));
        job.write(Box::into_raw(Box::new(clink_job_t {
            job: j,
            addrs: Vec::new(),
        })));
        Ok(OK)
    })
}

/// This process's rank in its job, from 0 (0 for a NULL job).
///
/// Thread safety: any thread.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn clink_job_rank(job: *const clink_job_t) -> u32 {
    job.as_ref().map_or(0, |j| j.job.rank())
}

/// The number of ranks in the job (0 for a NULL job).
///
/// Thread safety: any thread.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn clink_job_size(job: *const clink_job_t) -> u32 {
    job.as_ref().map_or(0, |j| j.job.size())
}

/// The number of the job's ranks on this node (this one included), or 0 when the
/// launcher does not say (or for a NULL job). Endpoints of the job's context expect the
/// others as peers already (`clink_endpoint_expect_peers`).
///
/// Thread safety: any thread.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn clink_job_local_size(job: *const clink_job_t) -> u32 {
    job.as_ref().and_then(|j| j.job.local_size()).unwrap_or(0)
}

/// Publishes `address` (this rank's endpoint address, `clink_endpoint_address`) and
/// fetches every rank's, which `clink_job_address` then returns. Collective: every rank
/// of the job calls it, and it returns when all have published. A second call publishes
/// again and replaces the addresses.
///
/// Thread safety: one thread at a time per job.
///
/// # Safety
/// `job` a live job; `address` a NUL-terminated string (NULL refused).
#[no_mangle]
pub unsafe extern "C" fn clink_job_exchange(
    job: *mut clink_job_t,
    address: *const c_char,
) -> c_int {
    ffi("clink_job_exchange", || {
        let j = job.as_mut().ok_or_else(|| Fail::null("job"))?;
        let a = c_str(address, "address")?;
        let addrs = j.job.exchange_addresses(a)?;
        j.addrs = addrs
            .into_iter()
            .map(|s| CString::new(s).map_err(|_| Fail::invalid("an address with a NUL byte")))
            .collect::<R<_>>()?;
        Ok(OK)
    })
}

/// The endpoint address rank `rank` published, a NUL-terminated string; NULL before
/// `clink_job_exchange`, for a rank outside the job, or for a NULL job.
///
/// Ownership: the string belongs to the job and stays valid until the next
/// `clink_job_exchange` or `clink_job_free`. Thread safety: any thread, not during a
/// `clink_job_exchange` of the same job.
///
/// # Safety
/// `job` must be NULL or a live job.
#[no_mangle]
pub unsafe extern "C" fn clink_job_address(job: *const clink_job_t, rank: u32) -> *const c_char {
    job.as_ref()
        .and_then(|j| j.addrs.get(rank as usize))
        .map_or(std::ptr::null(), |s| s.as_ptr())
}

/// Frees a job and leaves the launcher's service (`PMIx_Finalize`); contexts and
/// endpoints made meanwhile stay valid. NULL is ignored.
///
/// Thread safety: no other call may be using this job.
///
/// # Safety
/// `job` must be NULL or a job from `clink_context_from_launcher` not freed yet.
#[no_mangle]
pub unsafe extern "C" fn clink_job_free(job: *mut clink_job_t) {
    if !job.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(job))));
    }
}
