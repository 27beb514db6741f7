//! A connection's pairing against a process that is not its peer.

use super::pairing::{recv_with_fds, to_c};
use super::*;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// A TCP socket of the C library (not the wrappers), bound to loopback port 0.
fn tcp_socket() -> c_int {
    // SAFETY: plain socket calls on a socket of our own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let (a, len) = to_c(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)));
        assert_eq!(
            libc::bind(fd, &a as *const _ as *const libc::sockaddr, len),
            0
        );
        fd
    }
}

/// A process of the host that holds a plain client's rendezvous name (the client is not
/// under clink, so the name is free) gets the server's Hello and its mapping, writes a
/// switch and bytes of its own into the ring, and never sends the Ack that would prove it
/// holds the client's socket: the server reads the client's bytes from the kernel, never
/// the forged ones.
#[test]
fn a_switch_written_by_a_process_that_never_acked_is_not_believed() {
    let l = tcp_socket();
    let c = tcp_socket();
    let server = sys::local_addr(l).unwrap();
    let client_port = sys::local_addr(c).unwrap().port();
    // SAFETY: socket calls on sockets of our own, with valid addresses and buffers.
    unsafe {
        assert_eq!(libc::listen(l, 1), 0);
        // The impostor's listener on the client's rendezvous name.
        let imp = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let (a, len) = sys::abstract_addr(&rendezvous_name(server, client_port));
        assert_eq!(
            libc::bind(imp, &a as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(libc::listen(imp, 1), 0);
        let (sa, slen) = to_c(server);
        assert_eq!(
            real::connect(c, &sa as *const _ as *const libc::sockaddr, slen),
            0
        );
        let s = real::accept4(l, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(s >= 0);
        let conn = Conn::accepted(s, 64 << 10).expect("the Hello goes to the name's holder");
        // The impostor takes the Hello and the mapping.
        let u = real::accept4(imp, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        assert!(u >= 0);
        let mut buf = [0u8; MSG_LEN];
        let mut fds = [-1; 2];
        let (n, nfds) = recv_with_fds(u, &mut buf, &mut fds, 0);
        assert_eq!((n, nfds), (MSG_LEN as isize, 2));
        let hello = Hello::decode(&buf).unwrap();
        let forged = Shared::attach(fds[0], hello.ring).expect("the mapping");
        // It switches the client's direction at byte 0 and puts its own bytes there.
        let rx = conn.rx_dir();
        forged.switch_at(rx).store(0, Ordering::SeqCst);
        let lie = b"forged";
        let iov = [iovec {
            iov_base: lie.as_ptr() as *mut libc::c_void,
            iov_len: lie.len(),
        }];
        assert_eq!(forged.write(rx, &iov, 0, lie.len()), Ok(lie.len()));
        // The real client writes by the kernel.
        let truth = b"the client";
        let sent = real::send(c, truth.as_ptr() as *const libc::c_void, truth.len(), 0);
        assert_eq!(sent, truth.len() as isize);
        let mut got = [0u8; 32];
        let iov = [iovec {
            iov_base: got.as_mut_ptr() as *mut libc::c_void,
            iov_len: got.len(),
        }];
        let n = conn.recv(s, &iov, 0);
        assert_eq!(&got[..n.max(0) as usize], truth, "read the forged ring");
        assert!(!conn.rx_in_ring());
        for fd in [u, fds[1], imp, s, c, l] {
            close_fd(fd);
        }
    }
}
