//! Transports: the "network interfaces" of clink. They move frames and bytes and own the
//! system calls and `unsafe`; protocol decisions stay in `clink-proto` and the endpoint.
//!
//! Only the shared-memory transport exists so far (same host). The network transports
//! (UDP, TCP) are tracked by their own issue and will implement the same frame-link
//! contract the endpoint uses on [`shm::ShmPeer`]: send a frame or report full, poll the
//! next received frame, release it, pull a rendezvous payload.

pub mod shm;
