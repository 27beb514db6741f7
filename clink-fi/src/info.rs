//! `fi_getinfo`: what the provider offers, filtered by the application's hints (the core
//! does not filter for external providers).

use crate::abi::*;
use crate::{c_calloc, c_strdup, NAME};
use std::ffi::{c_char, c_int, CStr};

/// Primary and secondary capabilities.
pub const CAPS: u64 = FI_TAGGED
    | FI_MSG
    | FI_SEND
    | FI_RECV
    | FI_LOCAL_COMM
    | FI_REMOTE_COMM
    | FI_DIRECTED_RECV
    | FI_SOURCE;
/// Operation flags the data path understands.
const OP_FLAGS: u64 =
    FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE;
/// Largest message: clink's rendezvous has no practical limit; this is what the info says.
pub const MAX_MSG: usize = 1 << 40;
/// Largest inject (copied at the call, never completed).
pub const INJECT_MAX: usize = 16 << 10;
/// Scatter-gather entries per operation (several are gathered into one message).
pub const IOV_LIMIT: usize = 8;
/// Queue depths the info advertises (the provider queues without a fixed limit).
const QUEUE: usize = 1 << 16;

fn name_is(p: *const c_char, want: &str) -> bool {
    // SAFETY: a NUL-terminated string from the application's hints.
    p.is_null() || unsafe { CStr::from_ptr(p) }.to_bytes() == want.as_bytes()
}

/// Whether the hints can be met, and if not, why (logged at debug level by the caller).
fn unmet(h: &fi_info) -> Option<&'static str> {
    if h.caps & !CAPS != 0 {
        return Some(
            "capabilities beyond FI_TAGGED, FI_MSG, FI_DIRECTED_RECV, FI_SOURCE, local and remote",
        );
    }
    if h.addr_format != FI_FORMAT_UNSPEC {
        return Some("an address format other than FI_FORMAT_UNSPEC");
    }
    // SAFETY: the attribute pointers of the hints are NULL or valid.
    unsafe {
        if let Some(e) = h.ep_attr.as_ref() {
            if e.type_ != FI_EP_UNSPEC && e.type_ != FI_EP_RDM {
                return Some("an endpoint type other than FI_EP_RDM");
            }
            if e.max_msg_size > MAX_MSG {
                return Some("a larger max_msg_size");
            }
        }
        if let Some(d) = h.domain_attr.as_ref() {
            if !name_is(d.name, NAME) {
                return Some("another domain name");
            }
            if ![FI_AV_UNSPEC, FI_AV_MAP, FI_AV_TABLE].contains(&d.av_type) {
                return Some("an unknown address vector type");
            }
        }
        if let Some(f) = h.fabric_attr.as_ref() {
            if !name_is(f.name, NAME) || !name_is(f.prov_name, NAME) {
                return Some("another fabric or provider name");
            }
        }
        if let Some(t) = h.tx_attr.as_ref() {
            if t.caps & !CAPS != 0 || t.op_flags & !OP_FLAGS != 0 {
                return Some("transmit capabilities or flags it lacks");
            }
            if t.inject_size > INJECT_MAX || t.iov_limit > IOV_LIMIT {
                return Some("a larger inject size or iov limit");
            }
        }
        if let Some(r) = h.rx_attr.as_ref() {
            if r.caps & !CAPS != 0 || r.op_flags & !FI_COMPLETION != 0 {
                return Some("receive capabilities or flags it lacks");
            }
        }
    }
    None
}

/// The provider's `getinfo`: one `FI_EP_RDM` entry, or `-FI_ENODATA` when the hints ask
/// for what it does not have.
pub unsafe extern "C" fn getinfo(
    _version: u32,
    _node: *const c_char,
    _service: *const c_char,
    _flags: u64,
    hints: *const fi_info,
    out: *mut *mut fi_info,
) -> c_int {
    crate::guard(|| {
        if out.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: `out` is writable; `hints` NULL or valid (libfabric's contract).
        unsafe {
            *out = std::ptr::null_mut();
            let h = hints.as_ref();
            if let Some(why) = h.and_then(unmet) {
                crate::log(&format!(
                    "the hints ask for {why} (caps {:#x})",
                    h.map_or(0, |h| h.caps)
                ));
                return -FI_ENODATA;
            }
            match build(h) {
                Some(i) => {
                    *out = i;
                    0
                }
                None => -FI_ENOMEM,
            }
        }
    })
}

/// Allocates one info the way the core frees it (`fi_freeinfo`: each part with `free`).
/// `prov_name` stays NULL: the core fills it.
unsafe fn build(h: Option<&fi_info>) -> Option<*mut fi_info> {
    let info = c_calloc::<fi_info>();
    let tx = c_calloc::<fi_tx_attr>();
    let rx = c_calloc::<fi_rx_attr>();
    let ep = c_calloc::<fi_ep_attr>();
    let dom = c_calloc::<fi_domain_attr>();
    let fab = c_calloc::<fi_fabric_attr>();
    let parts = [
        info as usize,
        tx as usize,
        rx as usize,
        ep as usize,
        dom as usize,
        fab as usize,
    ];
    if parts.contains(&0) {
        for p in parts {
            // SAFETY: each from calloc or NULL.
            unsafe { libc::free(p as *mut libc::c_void) };
        }
        return None;
    }
    // SAFETY: all freshly allocated and zeroed; the hints' parts NULL or valid.
    unsafe {
        let want = |c: u64| if c != 0 { c & CAPS } else { CAPS };
        let caps = want(h.map_or(0, |h| h.caps));
        let tx_flags = h
            .and_then(|h| h.tx_attr.as_ref())
            .map_or(0, |t| t.op_flags & OP_FLAGS);
        let rx_flags = h
            .and_then(|h| h.rx_attr.as_ref())
            .map_or(0, |r| r.op_flags & FI_COMPLETION);
        let hd = h.and_then(|h| h.domain_attr.as_ref());
        // The application serialises calls on the domain's objects unless it asks for
        // less of itself (any finer model gets the locks of FI_THREAD_SAFE).
        let threading = match hd.map_or(FI_THREAD_UNSPEC, |d| d.threading) {
            FI_THREAD_UNSPEC | FI_THREAD_DOMAIN => FI_THREAD_DOMAIN,
            _ => FI_THREAD_SAFE,
        };
        *tx = fi_tx_attr {
            caps: caps & !FI_RECV,
            mode: 0,
            op_flags: tx_flags,
            msg_order: FI_ORDER_SAS,
            comp_order: 0,
            inject_size: INJECT_MAX,
            size: QUEUE,
            iov_limit: IOV_LIMIT,
            rma_iov_limit: 0,
            tclass: 0,
        };
        *rx = fi_rx_attr {
            caps: caps & !FI_SEND,
            mode: 0,
            op_flags: rx_flags,
            msg_order: FI_ORDER_SAS,
            comp_order: 0,
            total_buffered_recv: 0,
            size: QUEUE,
            iov_limit: IOV_LIMIT,
        };
        *ep = fi_ep_attr {
            type_: FI_EP_RDM,
            protocol: FI_PROTO_UNSPEC,
            protocol_version: 1,
            max_msg_size: MAX_MSG,
            msg_prefix_size: 0,
            max_order_raw_size: 0,
            max_order_war_size: 0,
            max_order_waw_size: 0,
            // With untagged messages too, they take the top bit (see ep::MSG_TAG).
            mem_tag_format: if caps & FI_MSG != 0 && caps & FI_TAGGED != 0 {
                u64::MAX >> 1
            } else {
                u64::MAX
            },
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            auth_key_size: 0,
            auth_key: std::ptr::null_mut(),
        };
        *dom = fi_domain_attr {
            domain: std::ptr::null_mut(),
            name: c_strdup(NAME),
            threading,
            control_progress: FI_PROGRESS_MANUAL,
            data_progress: FI_PROGRESS_MANUAL,
            resource_mgmt: FI_RM_ENABLED,
            av_type: hd.map_or(FI_AV_UNSPEC, |d| d.av_type),
            mr_mode: 0,
            mr_key_size: 0,
            cq_data_size: 0,
            cq_cnt: QUEUE,
            ep_cnt: QUEUE,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            max_ep_stx_ctx: 0,
            max_ep_srx_ctx: 0,
            cntr_cnt: 0,
            mr_iov_limit: 1,
            caps: FI_LOCAL_COMM | FI_REMOTE_COMM,
            mode: 0,
            auth_key: std::ptr::null_mut(),
            auth_key_size: 0,
            max_err_data: 0,
            mr_cnt: 0,
            tclass: 0,
        };
        *fab = fi_fabric_attr {
            fabric: std::ptr::null_mut(),
            name: c_strdup(NAME),
            prov_name: std::ptr::null_mut(),
            prov_version: crate::VERSION,
            api_version: fi_version(1, 17),
        };
        *info = fi_info {
            next: std::ptr::null_mut(),
            caps,
            mode: 0,
            addr_format: FI_FORMAT_UNSPEC,
            src_addrlen: 0,
            dest_addrlen: 0,
            src_addr: std::ptr::null_mut(),
            dest_addr: std::ptr::null_mut(),
            handle: std::ptr::null_mut(),
            tx_attr: tx,
            rx_attr: rx,
            ep_attr: ep,
            domain_attr: dom,
            fabric_attr: fab,
            nic: std::ptr::null_mut(),
        };
    }
    Some(info)
}
