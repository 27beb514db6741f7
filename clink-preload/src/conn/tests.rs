//! A connection's accepting end against a peer the test plays by hand: one that holds the
//! rendezvous name but never acks, and one that pairs and then goes back to the kernel.

use super::pairing::{recv_with_fds, send_with_fds, to_c};
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

/// An accepted connection whose client end is played by hand.
struct Played {
    /// The server's end.
    conn: Conn,
    /// Its socket.
    s: c_int,
    /// The client's socket (plain: the test writes its kernel bytes).
    c: c_int,
    /// The Unix connection the server's Hello came on, and its listener.
    u: c_int,
    named: c_int,
    /// The rings as the client maps them.
    rings: Shared,
    /// The client's socket as the Hello passed it (the server's end, to the client).
    passed: c_int,
    listener: c_int,
}

impl Played {
    /// Connects a plain client socket to a server socket whose end is followed
    /// ([`Conn::accepted`]), with the client's rendezvous name held by the test, which takes
    /// the Hello and maps the rings.
    fn accept() -> Played {
        let listener = tcp_socket();
        let c = tcp_socket();
        let server = sys::local_addr(listener).unwrap();
        let client_port = sys::local_addr(c).unwrap().port();
        // SAFETY: socket calls on sockets of our own, with valid addresses and buffers.
        unsafe {
            assert_eq!(libc::listen(listener, 1), 0);
            let named = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let (a, len) = sys::abstract_addr(&rendezvous_name(server, client_port));
            assert_eq!(
                libc::bind(named, &a as *const _ as *const libc::sockaddr, len),
                0
            );
            assert_eq!(libc::listen(named, 1), 0);
            let (sa, slen) = to_c(server);
            assert_eq!(
                real::connect(c, &sa as *const _ as *const libc::sockaddr, slen),
                0
            );
            let s = real::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            assert!(s >= 0);
            let conn = Conn::accepted(s, 64 << 10).expect("the Hello goes to the name's holder");
            let u = real::accept4(named, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            assert!(u >= 0);
            let mut buf = [0u8; MSG_LEN];
            let mut fds = [-1; 2];
            let (n, nfds) = recv_with_fds(u, &mut buf, &mut fds, 0);
            assert_eq!((n, nfds), (MSG_LEN as isize, 2));
            let hello = Hello::decode(&buf).unwrap();
            let rings = Shared::attach(fds[0], hello.ring).expect("the mapping");
            Played {
                conn,
                s,
                c,
                u,
                named,
                rings,
                passed: fds[1],
                listener,
            }
        }
    }

    /// Writes `bytes` into the ring of the client's sending direction.
    fn write_ring(&self, bytes: &[u8]) {
        let iov = [iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        }];
        // SAFETY: `iov` describes `bytes`; the test is the ring's only writer.
        let n = unsafe { self.rings.write(self.conn.rx_dir(), &iov, 0, bytes.len()) };
        assert_eq!(n, Ok(bytes.len()));
    }

    /// Writes `bytes` on the client's socket (the kernel stream).
    fn write_kernel(&self, bytes: &[u8]) {
        // SAFETY: sending from a buffer of ours on a socket of ours.
        let n = unsafe {
            real::send(
                self.c,
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                0,
            )
        };
        assert_eq!(n, bytes.len() as isize);
    }

    /// What the server's end reads now (at most 32 bytes).
    fn read(&self) -> Vec<u8> {
        let mut got = [0u8; 32];
        let iov = [iovec {
            iov_base: got.as_mut_ptr() as *mut libc::c_void,
            iov_len: got.len(),
        }];
        let n = self.conn.recv(self.s, &iov, 0);
        assert!(n >= 0, "recv failed: {}", errno());
        got[..n as usize].to_vec()
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        for fd in [
            self.u,
            self.named,
            self.passed,
            self.s,
            self.c,
            self.listener,
        ] {
            close_fd(fd);
        }
    }
}

/// A process of the host that holds a plain client's rendezvous name (the client is not
/// under clink, so the name is free) gets the server's Hello and its mapping, writes a
/// switch and bytes of its own into the ring, and never sends the Ack that would prove it
/// holds the client's socket: the server reads the client's bytes from the kernel, never
/// the forged ones.
#[test]
fn a_switch_written_by_a_process_that_never_acked_is_not_believed() {
    let p = Played::accept();
    p.rings
        .switch_at(p.conn.rx_dir())
        .store(0, Ordering::SeqCst);
    p.write_ring(b"forged");
    p.write_kernel(b"the client");
    assert_eq!(p.read(), b"the client", "read the forged ring");
    assert!(!p.conn.rx_in_ring());
}

/// A paired client writes to the ring, then goes back to the kernel (its descriptor
/// escaped): a wake-up byte, then data by the kernel. A reader that takes the wake-up and
/// the data after it in one read of the kernel (as one asleep there does) still reads the
/// ring's bytes first.
#[test]
fn bytes_after_the_writer_went_back_to_the_kernel_follow_the_rings_last_bytes() {
    let p = Played::accept();
    assert!(send_with_fds(p.u, &Ack.encode(), &[p.c]), "the Ack");
    let rx = p.conn.rx_dir();
    p.rings.switch_at(rx).store(0, Ordering::SeqCst);
    p.write_ring(b"ring");
    // Going back, as `Conn::leave` does for its sending direction: a counted wake-up,
    // where the kernel carries data again, where the ring ends; then the data.
    p.rings.bells_sent(rx).fetch_add(1, Ordering::SeqCst);
    p.write_kernel(&[0]);
    p.rings.resume_at(rx).store(1, Ordering::SeqCst);
    let tail = p.rings.tail(rx).load(Ordering::SeqCst);
    p.rings.unswitch_at(rx).store(tail, Ordering::SeqCst);
    p.write_kernel(b"kernel");
    // The wake-up and the data after it in one read of the kernel socket.
    let mut ready = libc::pollfd {
        fd: p.s,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one pollfd of ours.
    assert_eq!(unsafe { real::poll(&mut ready, 1, 5000) }, 1);
    p.conn.drain(p.s);
    assert!(
        p.conn.carried.load(Ordering::Acquire),
        "data kept from the kernel"
    );
    let mut got = p.read();
    while got.len() < b"ringkernel".len() {
        let more = p.read();
        assert!(!more.is_empty(), "end of stream after {got:?}");
        got.extend(more);
    }
    assert_eq!(got, b"ringkernel");
}
