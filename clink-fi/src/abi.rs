//! The part of libfabric 1.17's public ABI (`rdma/fabric.h`, `rdma/fi_*.h`,
//! `rdma/providers/fi_prov.h`) this provider implements, written out by hand from those
//! headers so the build needs none. Programs built against the real headers exercise it
//! (`tests/provider.rs`: fi_info, fi_pingpong, Open MPI).
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

pub type fi_addr_t = u64;
/// A table slot this provider does not implement: every such slot points at a function
/// returning `-FI_ENOSYS` (libfabric's inline wrappers call slots without a NULL check).
pub type Slot = unsafe extern "C" fn() -> isize;

pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;

// Capabilities and operation flags.
pub const FI_MSG: u64 = 1 << 1;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_PEEK: u64 = 1 << 19;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_INJECT: u64 = 1 << 25;
pub const FI_INJECT_COMPLETE: u64 = 1 << 26;
pub const FI_TRANSMIT_COMPLETE: u64 = 1 << 27;
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
pub const FI_LOCAL_COMM: u64 = 1 << 51;
pub const FI_REMOTE_COMM: u64 = 1 << 52;
pub const FI_SOURCE: u64 = 1 << 57;
pub const FI_DIRECTED_RECV: u64 = 1 << 59;
pub const FI_CLAIM: u64 = 1 << 59;
pub const FI_DISCARD: u64 = 1 << 58;
pub const FI_SELECTIVE_COMPLETION: u64 = 1 << 59;
pub const FI_ORDER_SAS: u64 = 1 << 8;
// Mode bits.
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;

// Enumerations.
pub const FI_FORMAT_UNSPEC: u32 = 0;
pub const FI_AV_UNSPEC: c_int = 0;
pub const FI_AV_MAP: c_int = 1;
pub const FI_AV_TABLE: c_int = 2;
pub const FI_PROGRESS_MANUAL: c_int = 2;
pub const FI_THREAD_UNSPEC: c_int = 0;
pub const FI_THREAD_SAFE: c_int = 1;
pub const FI_THREAD_DOMAIN: c_int = 3;
pub const FI_RM_ENABLED: c_int = 2;
pub const FI_EP_UNSPEC: c_int = 0;
pub const FI_EP_RDM: c_int = 3;
pub const FI_PROTO_UNSPEC: u32 = 0;
pub const FI_CLASS_FABRIC: usize = 1;
pub const FI_CLASS_DOMAIN: usize = 2;
pub const FI_CLASS_EP: usize = 3;
pub const FI_CLASS_AV: usize = 11;
pub const FI_CLASS_EQ: usize = 13;
pub const FI_CLASS_CQ: usize = 14;
pub const FI_ENABLE: c_int = 6;
pub const FI_CQ_FORMAT_UNSPEC: c_int = 0;
pub const FI_CQ_FORMAT_CONTEXT: c_int = 1;
pub const FI_CQ_FORMAT_MSG: c_int = 2;
pub const FI_CQ_FORMAT_DATA: c_int = 3;
pub const FI_CQ_FORMAT_TAGGED: c_int = 4;
pub const FI_WAIT_NONE: c_int = 0;
pub const FI_WAIT_UNSPEC: c_int = 1;

// Errors (positive; returned negated).
pub const FI_ENOENT: c_int = libc::ENOENT;
pub const FI_EIO: c_int = libc::EIO;
pub const FI_EAGAIN: c_int = libc::EAGAIN;
pub const FI_ENOMEM: c_int = libc::ENOMEM;
pub const FI_EINVAL: c_int = libc::EINVAL;
pub const FI_ENOSYS: c_int = libc::ENOSYS;
pub const FI_ENOMSG: c_int = libc::ENOMSG;
pub const FI_ENODATA: c_int = libc::ENODATA;
pub const FI_ECANCELED: c_int = libc::ECANCELED;
pub const FI_ENOPROTOOPT: c_int = libc::ENOPROTOOPT;
pub const FI_ETOOSMALL: c_int = 257;
pub const FI_EAVAIL: c_int = 259;
pub const FI_EBADFLAGS: c_int = 260;
pub const FI_ETRUNC: c_int = 265;

pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

#[repr(C)]
pub struct fi_context {
    pub internal: [*mut c_void; 4],
}

#[repr(C)]
pub struct fi_provider {
    pub version: u32,
    pub fi_version: u32,
    pub context: fi_context,
    pub name: *const c_char,
    pub getinfo: unsafe extern "C" fn(
        u32,
        *const c_char,
        *const c_char,
        u64,
        *const fi_info,
        *mut *mut fi_info,
    ) -> c_int,
    pub fabric:
        unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int,
    pub cleanup: unsafe extern "C" fn(),
}

#[repr(C)]
pub struct fi_tx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_rx_attr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
pub struct fi_ep_attr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[repr(C)]
pub struct fi_domain_attr {
    pub domain: *mut fid_domain,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[repr(C)]
pub struct fi_fabric_attr {
    pub fabric: *mut fid_fabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_info {
    pub next: *mut fi_info,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut fid,
    pub tx_attr: *mut fi_tx_attr,
    pub rx_attr: *mut fi_rx_attr,
    pub ep_attr: *mut fi_ep_attr,
    pub domain_attr: *mut fi_domain_attr,
    pub fabric_attr: *mut fi_fabric_attr,
    pub nic: *mut c_void,
}

#[repr(C)]
pub struct fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *const fi_ops,
}

#[repr(C)]
pub struct fi_ops {
    pub size: usize,
    pub close: unsafe extern "C" fn(*mut fid) -> c_int,
    pub bind: unsafe extern "C" fn(*mut fid, *mut fid, u64) -> c_int,
    pub control: unsafe extern "C" fn(*mut fid, c_int, *mut c_void) -> c_int,
    pub ops_open: Slot,
    pub tostr: Slot,
    pub ops_set: Slot,
}

#[repr(C)]
pub struct fi_ops_fabric {
    pub size: usize,
    pub domain: unsafe extern "C" fn(
        *mut fid_fabric,
        *mut fi_info,
        *mut *mut fid_domain,
        *mut c_void,
    ) -> c_int,
    pub passive_ep: Slot,
    pub eq_open:
        unsafe extern "C" fn(*mut fid_fabric, *mut c_void, *mut *mut fid_eq, *mut c_void) -> c_int,
    pub wait_open: Slot,
    pub trywait: unsafe extern "C" fn(*mut fid_fabric, *mut *mut fid, c_int) -> c_int,
    pub domain2: Slot,
}

#[repr(C)]
pub struct fid_fabric {
    pub fid: fid,
    pub ops: *const fi_ops_fabric,
    pub api_version: u32,
}

#[repr(C)]
pub struct fi_ops_domain {
    pub size: usize,
    pub av_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_av_attr,
        *mut *mut fid_av,
        *mut c_void,
    ) -> c_int,
    pub cq_open: unsafe extern "C" fn(
        *mut fid_domain,
        *mut fi_cq_attr,
        *mut *mut fid_cq,
        *mut c_void,
    ) -> c_int,
    pub endpoint:
        unsafe extern "C" fn(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int,
    pub scalable_ep: Slot,
    pub cntr_open: Slot,
    pub poll_open: Slot,
    pub stx_ctx: Slot,
    pub srx_ctx: Slot,
    pub query_atomic: Slot,
    pub query_collective: Slot,
    pub endpoint2: Slot,
}

#[repr(C)]
pub struct fi_ops_mr {
    pub size: usize,
    pub reg: Slot,
    pub regv: Slot,
    pub regattr: Slot,
}

#[repr(C)]
pub struct fid_domain {
    pub fid: fid,
    pub ops: *const fi_ops_domain,
    pub mr: *const fi_ops_mr,
}

#[repr(C)]
pub struct fi_av_attr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

#[repr(C)]
pub struct fi_ops_av {
    pub size: usize,
    pub insert: unsafe extern "C" fn(
        *mut fid_av,
        *const c_void,
        usize,
        *mut fi_addr_t,
        u64,
        *mut c_void,
    ) -> c_int,
    pub insertsvc: Slot,
    pub insertsym: Slot,
    pub remove: unsafe extern "C" fn(*mut fid_av, *mut fi_addr_t, usize, u64) -> c_int,
    pub lookup: unsafe extern "C" fn(*mut fid_av, fi_addr_t, *mut c_void, *mut usize) -> c_int,
    pub straddr:
        unsafe extern "C" fn(*mut fid_av, *const c_void, *mut c_char, *mut usize) -> *const c_char,
    pub av_set: Slot,
}

#[repr(C)]
pub struct fid_av {
    pub fid: fid,
    pub ops: *const fi_ops_av,
}

#[repr(C)]
pub struct fi_cq_attr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fi_cq_tagged_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
}

#[repr(C)]
#[derive(Debug)]
pub struct fi_cq_err_entry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

#[repr(C)]
pub struct fi_ops_cq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize) -> isize,
    pub readfrom: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize, *mut fi_addr_t) -> isize,
    pub readerr: unsafe extern "C" fn(*mut fid_cq, *mut fi_cq_err_entry, u64) -> isize,
    pub sread: unsafe extern "C" fn(*mut fid_cq, *mut c_void, usize, *const c_void, c_int) -> isize,
    pub sreadfrom: unsafe extern "C" fn(
        *mut fid_cq,
        *mut c_void,
        usize,
        *mut fi_addr_t,
        *const c_void,
        c_int,
    ) -> isize,
    pub signal: Slot,
    pub strerror: unsafe extern "C" fn(
        *mut fid_cq,
        c_int,
        *const c_void,
        *mut c_char,
        usize,
    ) -> *const c_char,
}

#[repr(C)]
pub struct fid_cq {
    pub fid: fid,
    pub ops: *const fi_ops_cq,
}

#[repr(C)]
pub struct fi_ops_ep {
    pub size: usize,
    pub cancel: unsafe extern "C" fn(*mut fid, *mut c_void) -> isize,
    pub getopt: unsafe extern "C" fn(*mut fid, c_int, c_int, *mut c_void, *mut usize) -> c_int,
    pub setopt: unsafe extern "C" fn(*mut fid, c_int, c_int, *const c_void, usize) -> c_int,
    pub tx_ctx: Slot,
    pub rx_ctx: Slot,
    pub rx_size_left: Slot,
    pub tx_size_left: Slot,
}

#[repr(C)]
pub struct fi_ops_cm {
    pub size: usize,
    pub setname: Slot,
    pub getname: unsafe extern "C" fn(*mut fid, *mut c_void, *mut usize) -> c_int,
    pub getpeer: Slot,
    pub connect: Slot,
    pub listen: Slot,
    pub accept: Slot,
    pub reject: Slot,
    pub shutdown: Slot,
    pub join: Slot,
}

#[repr(C)]
pub struct fi_msg_tagged {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: fi_addr_t,
    pub tag: u64,
    pub ignore: u64,
    pub context: *mut c_void,
    pub data: u64,
}

#[repr(C)]
pub struct fi_ops_tagged {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvv: unsafe extern "C" fn(
        *mut fid_ep,
        *const libc::iovec,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvmsg: unsafe extern "C" fn(*mut fid_ep, *const fi_msg_tagged, u64) -> isize,
    pub send: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        u64,
        *mut c_void,
    ) -> isize,
    pub sendv: unsafe extern "C" fn(
        *mut fid_ep,
        *const libc::iovec,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        u64,
        *mut c_void,
    ) -> isize,
    pub sendmsg: unsafe extern "C" fn(*mut fid_ep, *const fi_msg_tagged, u64) -> isize,
    pub inject: unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, fi_addr_t, u64) -> isize,
    pub senddata: Slot,
    pub injectdata: Slot,
}

#[repr(C)]
pub struct fi_msg {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: fi_addr_t,
    pub context: *mut c_void,
    pub data: u64,
}

#[repr(C)]
pub struct fi_ops_msg {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut fid_ep,
        *mut c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        *mut c_void,
    ) -> isize,
    pub recvv: unsafe extern "C" fn(
        *mut fid_ep,
        *const libc::iovec,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        *mut c_void,
    ) -> isize,
    pub recvmsg: unsafe extern "C" fn(*mut fid_ep, *const fi_msg, u64) -> isize,
    pub send: unsafe extern "C" fn(
        *mut fid_ep,
        *const c_void,
        usize,
        *mut c_void,
        fi_addr_t,
        *mut c_void,
    ) -> isize,
    pub sendv: unsafe extern "C" fn(
        *mut fid_ep,
        *const libc::iovec,
        *mut *mut c_void,
        usize,
        fi_addr_t,
        *mut c_void,
    ) -> isize,
    pub sendmsg: unsafe extern "C" fn(*mut fid_ep, *const fi_msg, u64) -> isize,
    pub inject: unsafe extern "C" fn(*mut fid_ep, *const c_void, usize, fi_addr_t) -> isize,
    pub senddata: Slot,
    pub injectdata: Slot,
}

/// A table of which every slot is unimplemented (`fi_ops_msg`, `fi_ops_rma`,
/// `fi_ops_atomic`, `fi_ops_collective`: each a size and function pointers).
#[repr(C)]
pub struct fi_ops_none<const N: usize> {
    pub size: usize,
    pub slots: [Slot; N],
}

#[repr(C)]
pub struct fid_ep {
    pub fid: fid,
    pub ops: *const fi_ops_ep,
    pub cm: *const fi_ops_cm,
    pub msg: *const fi_ops_msg,
    pub rma: *const fi_ops_none<9>,
    pub tagged: *const fi_ops_tagged,
    pub atomic: *const fi_ops_none<13>,
    pub collective: *const fi_ops_none<11>,
}

#[repr(C)]
pub struct fi_ops_eq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut fid_eq, *mut u32, *mut c_void, usize, u64) -> isize,
    pub readerr: unsafe extern "C" fn(*mut fid_eq, *mut c_void, u64) -> isize,
    pub write: Slot,
    pub sread: unsafe extern "C" fn(*mut fid_eq, *mut u32, *mut c_void, usize, c_int, u64) -> isize,
    pub strerror: Slot,
}

#[repr(C)]
pub struct fid_eq {
    pub fid: fid,
    pub ops: *const fi_ops_eq,
}
