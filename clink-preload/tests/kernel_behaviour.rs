//! The sockets layer behaves as kernel TCP does where programs can tell: half-close,
//! resets, a killed peer, descriptors passed between processes, calls the rings do not
//! carry, nested epoll sets and blocking waits, each checked in the four placements (both
//! ends under the sockets layer, server only, client only, neither).

mod common;

use common::*;

const ECHO_SERVER: &str = r#"
import asyncio, sys
async def handle(r, w):
    while True:
        data = await r.read(65536)
        if not data:
            break
        w.write(data)
        await w.drain()
    w.close()
    await w.wait_closed()
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"#;

const ECHO_CLIENT: &str = r#"
import asyncio, sys, random, hashlib
async def main():
    rng = random.Random(42)
    data = rng.randbytes(8 << 20)
    r, w = await asyncio.open_connection("127.0.0.1", int(sys.argv[1]))
    async def send():
        for i in range(0, len(data), 100000):
            w.write(data[i:i + 100000])
            await w.drain()
        w.write_eof()
    t = asyncio.create_task(send())
    got = bytearray()
    while True:
        chunk = await r.read(1 << 20)
        if not chunk:
            break
        got += chunk
    await t
    print("match" if bytes(got) == data else "MISMATCH %d" % len(got))
asyncio.run(main())
"#;

/// Runs a Python server (arguments: the port) and client (the port) in every placement:
/// the client prints `want`, and the statistics show the placement.
fn python_pair(name: &str, server: &str, client: &str, want: &str) {
    let dir = Scratch::new(name);
    let (srv, cli) = (dir.path("server.py"), dir.path("client.py"));
    std::fs::write(&srv, server).unwrap();
    std::fs::write(&cli, client).unwrap();
    for p in PLACEMENTS {
        let stats = dir.stats(p, "");
        let port = free_port();
        let ps = port.to_string();
        let _server = Proc::start(
            command("python3", &[srv.to_str().unwrap(), &ps], p.server, &stats),
            None,
        );
        wait_for_listen(port);
        expect_output(p, &cli, &ps, &stats, want);
        check_placement(p, &stats, port);
    }
}

#[test]
fn python_asyncio_echo_with_half_close() {
    python_pair("asyncio", ECHO_SERVER, ECHO_CLIENT, "match");
}

/// A Python server that accepts one connection on the port of its first argument (as `c`)
/// and then runs `body` (which imports what else it uses).
macro_rules! python_one_client_server {
    ($body:literal) => {
        concat!(
            "import socket, sys\n",
            "s = socket.socket()\n",
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n",
            "s.bind((\"127.0.0.1\", int(sys.argv[1])))\n",
            "s.listen()\n",
            "c, _ = s.accept()\n",
            $body
        )
    };
}

const SLOW_SERVER: &str = python_one_client_server!(
    r#"import time
# Well past the switch: the kernel socket then holds nothing unread, so the server's
# death sends a FIN, not a reset, and the client must draw the reset itself.
c.recv(8 << 20, socket.MSG_WAITALL)
print("read", flush=True)
time.sleep(600)
"#
);

const PUSHING_CLIENT: &str = r#"
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
if sys.argv[2] == "poll":
    c.settimeout(30)  # Python then waits in poll(2) and sends without blocking
chunk = b"x" * 65536
sent = 0
try:
    while True:
        sent += c.send(chunk)
        if sent > (1 << 30):
            print("no error after 1 GiB")
            break
except OSError as e:
    print(type(e).__name__)
"#;

#[test]
fn a_killed_server_gives_its_client_the_error_kernel_tcp_gives() {
    let dir = Scratch::new("killed");
    let (srv, cli) = (dir.path("server.py"), dir.path("client.py"));
    std::fs::write(&srv, SLOW_SERVER).unwrap();
    std::fs::write(&cli, PUSHING_CLIENT).unwrap();
    for mode in ["poll", "blocking"] {
        let mut errors = Vec::new();
        for p in [PLACEMENTS[0], PLACEMENTS[3]] {
            let stats = dir.stats(p, "");
            let port = free_port();
            let ps = port.to_string();
            let log = dir.path("server.log");
            let server = Proc::start(
                command("python3", &[srv.to_str().unwrap(), &ps], p.server, &stats),
                Some(&log),
            );
            wait_for_listen(port);
            let client = std::thread::spawn({
                let (cli, stats) = (cli.clone(), stats.clone());
                move || {
                    let args = [cli.to_str().unwrap(), &ps, mode];
                    run(command("python3", &args, p.client, &stats), None, LIMIT)
                }
            });
            wait_for_log(&log, "read", &format!("{p:?}: the server never read"));
            drop(server); // SIGKILL
            let out = client.join().unwrap();
            errors.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
        assert!(
            errors[1] == "ConnectionResetError" || errors[1] == "BrokenPipeError",
            "{mode}: kernel TCP: {}",
            errors[1]
        );
        assert_eq!(
            errors[0], errors[1],
            "{mode}: under clink the client saw another error than over kernel TCP"
        );
    }
}

const UNREAD_CLOSING_SERVER: &str = python_one_client_server!(
    r#"import select
c.recv(1 << 20, socket.MSG_WAITALL)  # well past the switch
c.sendall(b"k")
select.select([c], [], [], 30)  # more has come: closed unread
c.close()
print("closed", flush=True)
"#
);

const RESET_CLIENT: &str = r#"
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.settimeout(30)
c.sendall(b"x" * (1 << 20))
assert c.recv(1) == b"k"
c.sendall(b"y" * 65536)
try:
    print("eof" if c.recv(1) == b"" else "data")
except OSError as e:
    print(type(e).__name__)
"#;

/// Kernel TCP answers a close with bytes unread with a reset (the client's read fails with
/// ECONNRESET, checked in the placement with neither end under clink), whichever ends run
/// under clink.
#[test]
fn a_server_closing_with_bytes_unread_resets_its_client_as_kernel_tcp_does() {
    python_pair(
        "unread-close",
        UNREAD_CLOSING_SERVER,
        RESET_CLIENT,
        "ConnectionResetError",
    );
}

const PASSING_SERVER: &str = python_one_client_server!(
    r#"import hashlib
head = c.recv(1000, socket.MSG_WAITALL)
c.send(b"g")
head += c.recv(1000, socket.MSG_WAITALL)
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.connect(sys.argv[2])
socket.send_fds(u, [b"x"], [c.fileno()])
c.close()
u.recv(1)
print(hashlib.sha256(head).hexdigest(), flush=True)
"#
);

const RECEIVING_HELPER: &str = r#"
import socket, sys, hashlib, os
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind(sys.argv[1])
l.listen()
print("ready", flush=True)
u, _ = l.accept()
_, fds, _, _ = socket.recv_fds(u, 1, 1)
c = socket.socket(fileno=fds[0])
h = hashlib.sha256()
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    h.update(b)
c.close()
u.send(b"k")
print(h.hexdigest(), flush=True)
"#;

const SENDING_CLIENT: &str = r#"
import socket, sys, random
data = random.Random(9).randbytes(4 << 20)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(data[:1000])
assert c.recv(1) == b"g"
c.sendall(data[1000:])
c.shutdown(socket.SHUT_WR)
c.recv(1)
print("sent", flush=True)
"#;

#[test]
fn a_descriptor_passed_to_another_process_carries_the_rest_of_the_stream() {
    let dir = Scratch::new("fdpass");
    let (srv, helper, cli) = (
        dir.path("server.py"),
        dir.path("helper.py"),
        dir.path("client.py"),
    );
    std::fs::write(&srv, PASSING_SERVER).unwrap();
    std::fs::write(&helper, RECEIVING_HELPER).unwrap();
    std::fs::write(&cli, SENDING_CLIENT).unwrap();
    let data = run(
        command(
            "python3",
            &[
                "-c",
                "import random,sys; sys.stdout.buffer.write(random.Random(9).randbytes(4 << 20))",
            ],
            false,
            &srv,
        ),
        None,
        LIMIT,
    )
    .stdout;
    assert_eq!(data.len(), 4 << 20);
    let (head, rest) = (sha256(&data[..2000], &dir), sha256(&data[2000..], &dir));
    for p in PLACEMENTS {
        let stats = dir.stats(p, "");
        let port = free_port();
        let ps = port.to_string();
        let sock = dir.path("pass.sock");
        let _ = std::fs::remove_file(&sock);
        let hlog = dir.path("helper.log");
        let slog = dir.path("server.log");
        let mut h = Proc::start(
            command(
                "python3",
                &[helper.to_str().unwrap(), sock.to_str().unwrap()],
                p.server,
                &stats,
            ),
            Some(&hlog),
        );
        wait_for_log(&hlog, "ready", &format!("{p:?}: the helper never started"));
        let mut s = Proc::start(
            command(
                "python3",
                &[srv.to_str().unwrap(), &ps, sock.to_str().unwrap()],
                p.server,
                &stats,
            ),
            Some(&slog),
        );
        wait_for_listen(port);
        expect_output(p, &cli, &ps, &stats, "sent");
        assert!(
            h.child.wait().unwrap().success() && s.child.wait().unwrap().success(),
            "{p:?}"
        );
        let hl = std::fs::read_to_string(&hlog).unwrap();
        let sl = std::fs::read_to_string(&slog).unwrap();
        assert_eq!(sl.trim(), head, "{p:?}: the server's first 2000 bytes");
        assert_eq!(
            hl.lines().nth(1),
            Some(rest.as_str()),
            "{p:?}: the rest, read by the process the descriptor went to"
        );
        check_placement(p, &stats, port);
        expect_left(p, &stats);
    }
}

/// `escapes PORT MODE` reads two lines and writes "x" with ordinary calls, then writes
/// "yz\n" and reads the rest of the stream with calls the rings do not carry (MODE `mmsg`:
/// sendmmsg and recvmmsg; `splice`: splice through a pipe both ways; `oob`: "z" sent as
/// urgent data, then plain reads), or writes nothing and reads it through a stdio stream
/// (`stdio`: the C library reads the socket itself), and writes "HEAD N HASH\n" (the two
/// lines' bytes, the rest's bytes, FNV-1a of the rest).
const ESCAPES_C: &str = r#"
/* escapes PORT MODE: reads two lines and writes "x" through ordinary calls, then writes
 * "yz\n" and reads the rest of the stream with the calls MODE names (mmsg: sendmmsg and
 * recvmmsg; splice: splice through a pipe both ways; oob: send with MSG_OOB, then plain
 * reads; stdio: nothing written, the rest read with fgetc), and writes "HEAD N HASH\n"
 * (bytes of the two lines, bytes of the rest, FNV-1a of the rest) with write. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
static uint64_t h = 1469598103934665603ULL, n = 0;
static void hash(const unsigned char *p, size_t k) {
    for (size_t i = 0; i < k; i++) h = (h ^ p[i]) * 1099511628211ULL;
    n += k;
}
int main(int argc, char **argv) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1)) return 2;
    int c = accept(l, 0, 0);
    const char *mode = argv[2];
    char ch; size_t head = 0;
    do { if (read(c, &ch, 1) != 1) return 3; head++; } while (ch != '\n');
    if (write(c, "x", 1) != 1) return 4;
    do { if (read(c, &ch, 1) != 1) return 5; head++; } while (ch != '\n');
    static unsigned char buf[4][3000];
    if (!strcmp(mode, "mmsg")) {
        struct iovec out[2] = {{"y", 1}, {"z\n", 2}};
        struct mmsghdr om[2] = {{.msg_hdr = {.msg_iov = &out[0], .msg_iovlen = 1}},
                                {.msg_hdr = {.msg_iov = &out[1], .msg_iovlen = 1}}};
        if (sendmmsg(c, om, 2, 0) != 2 || om[0].msg_len != 1 || om[1].msg_len != 2) return 6;
        for (;;) {
            struct iovec iv[4];
            struct mmsghdr m[4];
            memset(m, 0, sizeof m);
            for (int i = 0; i < 4; i++) {
                iv[i] = (struct iovec){buf[i], sizeof buf[i]};
                m[i].msg_hdr.msg_iov = &iv[i];
                m[i].msg_hdr.msg_iovlen = 1;
            }
            int k = recvmmsg(c, m, 4, MSG_WAITFORONE, NULL);
            if (k < 0) return 7;
            int end = k == 0;
            for (int i = 0; i < k; i++) {
                if (m[i].msg_len == 0) { end = 1; break; }
                hash(buf[i], m[i].msg_len);
            }
            if (end) break;
        }
    } else if (!strcmp(mode, "splice")) {
        int p[2];
        if (pipe(p)) return 8;
        if (write(p[1], "yz\n", 3) != 3) return 9;
        if (splice(p[0], NULL, c, NULL, 3, 0) != 3) return 10;
        for (;;) {
            ssize_t k = splice(c, NULL, p[1], NULL, sizeof buf[0], 0);
            if (k < 0) return 11;
            if (k == 0) break;
            ssize_t r = read(p[0], buf[0], k);
            if (r != k) return 12;
            hash(buf[0], k);
        }
    } else if (!strcmp(mode, "oob")) {
        if (send(c, "y", 1, 0) != 1 || send(c, "z", 1, MSG_OOB) != 1 || send(c, "\n", 1, 0) != 1) return 13;
        ssize_t k;
        while ((k = read(c, buf[0], sizeof buf[0])) > 0) hash(buf[0], k);
        if (k < 0) return 14;
    } else if (!strcmp(mode, "stdio")) {
        FILE *f = fdopen(c, "r");
        int x;
        while ((x = fgetc(f)) != EOF) { unsigned char b = (unsigned char)x; hash(&b, 1); }
    } else return 15;
    char line[100];
    int len = snprintf(line, sizeof line, "%zu %llu %llu\n", head, (unsigned long long)n, (unsigned long long)h);
    if (write(c, line, len) != len) return 16;
    return 0;
}
"#;

/// Sends two lines around the server's "x", then 2 MiB of seeded bytes, shuts its sending
/// side and prints all it read after "x" (newlines as `|`).
const ESCAPES_CLIENT: &str = r#"
import socket, sys, random
data = random.Random(13).randbytes(2 << 20)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.settimeout(20)
c.sendall(b"hello\n")
assert c.recv(1) == b"x"
c.sendall(b"world\n")
c.sendall(data)
c.shutdown(socket.SHUT_WR)
got = b""
while True:
    try:
        k = c.recv(65536)
    except socket.timeout:
        print("timeout after", got)
        sys.exit(1)
    if not k:
        break
    got += k
print(got.decode(errors="replace").replace("\n", "|"))
"#;

#[test]
fn calls_the_rings_do_not_carry_and_stdio_hand_the_connection_to_the_kernel_first() {
    let dir = Scratch::new("escapes");
    let (src, bin, cli) = (
        dir.path("escapes.c"),
        dir.path("escapes"),
        dir.path("client.py"),
    );
    compile_c(ESCAPES_C, &src, &bin);
    std::fs::write(&cli, ESCAPES_CLIENT).unwrap();
    // The client's stream, made by Python itself.
    let data = run(
        command(
            "python3",
            &[
                "-c",
                "import random,sys; sys.stdout.buffer.write(random.Random(13).randbytes(2 << 20))",
            ],
            false,
            &src,
        ),
        None,
        LIMIT,
    )
    .stdout;
    let fnv = data.iter().fold(1469598103934665603u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(1099511628211)
    });
    let len = data.len();
    // What kernel TCP gives: urgent data is not in the stream (no SO_OOBINLINE).
    for (mode, reply, why) in [
        ("mmsg", "yz|", "sendmmsg, which the rings do not carry"),
        ("splice", "yz|", "splice, which the rings do not carry"),
        (
            "oob",
            "y|",
            "urgent data sent, which the rings do not carry",
        ),
        ("stdio", "", "its descriptor left this process"),
    ] {
        for p in PLACEMENTS {
            let stats = dir.stats(p, mode);
            let port = free_port();
            let ps = port.to_string();
            let mut server = Proc::start(
                command(bin.to_str().unwrap(), &[&ps, mode], p.server, &stats),
                None,
            );
            wait_for_listen(port);
            expect_output(p, &cli, &ps, &stats, &format!("{reply}12 {len} {fnv}|"));
            let st = server.wait_exit(LIMIT);
            assert!(st.success(), "{p:?} {mode}: server failed: {st}");
            check_placement(p, &stats, port);
            if p.server && p.client {
                let lines = stats_lines(&stats).join("\n");
                assert!(
                    lines.contains(&format!("handed to the kernel ({why})")),
                    "{mode}: the connection did not leave: {lines}"
                );
            }
        }
    }
}

/// The start of the Python servers below: listen on port `argv[1]`, say so, accept one
/// connection and make it non-blocking (`c`).
const ACCEPT_ONE: &str = r#"
import select, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
c, _ = s.accept()
c.setblocking(False)
"#;

/// After [`ACCEPT_ONE`].
const NESTED_SERVER: &str = r#"
inner = select.epoll()
inner.register(c.fileno(), select.EPOLLIN)
if sys.argv[2] == "epoll":
    outer = select.epoll()
    outer.register(inner.fileno(), select.EPOLLIN)
    wait = lambda: outer.poll(10)
else:
    outer = select.poll()
    outer.register(inner.fileno(), select.POLLIN)
    wait = lambda: outer.poll(10000)
while True:
    if not wait():
        print("timeout", flush=True)
        break
    for _ in inner.poll(0):
        try:
            data = c.recv(1 << 20)
        except BlockingIOError:
            continue
        if not data:
            sys.exit(0)
        c.setblocking(True)
        c.sendall(data)
        c.setblocking(False)
"#;

const PING_CLIENT: &str = r#"
import socket, sys, random
rng = random.Random(3)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.settimeout(20)
for i in range(300):
    msg = rng.randbytes(rng.choice([1, 100, 3000, 200000]))
    c.sendall(msg)
    got = b""
    while len(got) < len(msg):
        got += c.recv(len(msg) - len(got))
    assert got == msg, i
print("match")
"#;

#[test]
fn an_epoll_set_inside_epoll_or_poll_wakes_for_ring_data() {
    let dir = Scratch::new("nested");
    let (srv, cli) = (dir.path("server.py"), dir.path("client.py"));
    std::fs::write(&srv, format!("{ACCEPT_ONE}{NESTED_SERVER}")).unwrap();
    std::fs::write(&cli, PING_CLIENT).unwrap();
    for outer in ["epoll", "poll"] {
        for p in PLACEMENTS {
            ping_python_server(&dir, &srv, &cli, p, outer, &[outer]);
        }
    }
}

/// Runs Python server `srv` (port and `args` after it) in placement `p` against the
/// ping client `cli`, expecting its "match"; the server must exit cleanly (it writes its
/// end's statistics as it exits, on the client's end-of-stream: read only then) and the
/// connection must have gone the way `p` says. `label` names the statistics file.
fn ping_python_server(
    dir: &Scratch,
    srv: &std::path::Path,
    cli: &std::path::Path,
    p: Placement,
    label: &str,
    args: &[&str],
) {
    let stats = dir.stats(p, label);
    let port = free_port();
    let ps = port.to_string();
    let argv: Vec<&str> = [srv.to_str().unwrap(), &ps]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let mut server = Proc::start(command("python3", &argv, p.server, &stats), None);
    wait_for_listen(port);
    expect_match(p, cli, &ps, &stats);
    let st = server.wait_exit(LIMIT);
    assert!(st.success(), "{p:?} {label}: server failed: {st}");
    check_placement(p, &stats, port);
}

/// An event loop that takes its connection out of the epoll set and puts it back for
/// output on every round, then back to input (as redis' does): each wait reports exactly
/// the registration in force, never one taken out or replaced.
/// (After [`ACCEPT_ONE`].)
const TOGGLING_SERVER: &str = r#"
fd = c.fileno()
ep = select.epoll()
ep.register(fd, select.EPOLLOUT)
assert ep.poll(1) == [(fd, select.EPOLLOUT)]
ep.modify(fd, select.EPOLLIN)
rounds = 0
while True:
    evs = ep.poll(10)
    if not evs:
        print("timeout", flush=True)
        sys.exit(1)
    assert all(f == fd and e & select.EPOLLIN and not e & select.EPOLLOUT for f, e in evs), (rounds, evs)
    data = b""
    while True:
        try:
            got = c.recv(1 << 20)
        except BlockingIOError:
            break
        if not got:
            print("rounds", rounds, flush=True)
            sys.exit(0)
        data += got
    if not data:
        continue
    ep.unregister(fd)
    assert ep.poll(0) == [], (rounds, "reported while out of the set")
    ep.register(fd, select.EPOLLOUT)
    evs = ep.poll(1)
    assert evs == [(fd, select.EPOLLOUT)], (rounds, evs)
    c.setblocking(True)
    c.sendall(data)
    c.setblocking(False)
    ep.modify(fd, select.EPOLLIN)
    rounds += 1
"#;

#[test]
fn an_event_loop_that_takes_its_connection_out_and_back_sees_each_registration() {
    let dir = Scratch::new("toggling");
    let (srv, cli) = (dir.path("server.py"), dir.path("client.py"));
    std::fs::write(&srv, format!("{ACCEPT_ONE}{TOGGLING_SERVER}")).unwrap();
    std::fs::write(&cli, PING_CLIENT).unwrap();
    for p in PLACEMENTS {
        ping_python_server(&dir, &srv, &cli, p, "toggling", &[]);
    }
}

/// A blocking reader's waits, as kernel TCP gives them: `server PORT` echoes 8-byte
/// messages (kind 1), answers kind 2 never, kind 3 after 300 ms, kind 4 after 400 ms and
/// reading the bytes that follow; `client PORT` checks
/// 2000 echoed round trips, then a receive that SO_RCVTIMEO ends (EAGAIN), one that a
/// signal without SA_RESTART interrupts (EINTR), and one that a signal with SA_RESTART
/// does not (unless the socket has a timeout), a send into a full buffer a signal with
/// SA_RESTART does not end, that TCP_NODELAY reads back as it set it, and that closing
/// every other descriptor (one by one and with close_range) does not break the
/// connection. Under the sockets layer with no spinning,
/// every one of those receives sleeps in its own wait.
const BLOCKING_WAITS_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static int full(int fd, void *b, size_t n, int rd) {
    size_t k = 0;
    while (k < n) {
        ssize_t r = rd ? recv(fd, (char *)b + k, n - k, 0) : send(fd, (char *)b + k, n - k, 0);
        if (r <= 0) return -1;
        k += r;
    }
    return 0;
}
static volatile sig_atomic_t fired;
static void on_alarm(int s) { (void)s; fired = 1; }
static void alarm_in(int ms, int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGALRM, &sa, 0);
    struct itimerval it = {{0, 0}, {0, ms * 1000}};
    fired = 0;
    setitimer(ITIMER_REAL, &it, 0);
}
#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[2]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    if (!strcmp(argv[1], "server")) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) FAIL("listen: %s", strerror(errno));
        int c = accept(l, 0, 0);
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        uint64_t m[2];
        while (full(c, m, sizeof m, 1) == 0) {
            if (m[0] == 2) continue;
            if (m[0] == 3) usleep(300000);
            if (m[0] == 4) {
                /* Late, then m[1] bytes to read before the answer. */
                static char sink[1 << 16];
                usleep(400000);
                for (uint64_t left = m[1]; left > 0;) {
                    ssize_t r = recv(c, sink, left < sizeof sink ? left : sizeof sink, 0);
                    if (r <= 0) FAIL("server drain: %s", strerror(errno));
                    left -= r;
                }
            }
            if (full(c, m, sizeof m, 0)) FAIL("server send: %s", strerror(errno));
        }
        return 0;
    }
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) FAIL("connect: %s", strerror(errno));
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t m[2], b[2];
    for (uint64_t i = 0; i < 2000; i++) {
        m[0] = 1; m[1] = i * 0x9e3779b97f4a7c15ULL;
        if (full(c, m, sizeof m, 0) || full(c, b, sizeof b, 1)) FAIL("round trip %d failed", (int)i);
        if (b[1] != m[1]) FAIL("round trip %d: wrong bytes", (int)i);
    }
    /* Closing every descriptor it does not know of (as daemons do: one by one, then with
       close_range) leaves the library's own (the wake socket of a sleeping reader)
       alone. */
    for (int way = 0; way < 2; way++) {
        if (way == 0) {
            for (int f = 3; f < 256; f++)
                if (f != c) close(f);
        } else if ((c > 3 && close_range(3, c - 1, 0)) || close_range(c + 1, ~0U, 0)) {
            FAIL("close_range: %s", strerror(errno));
        }
        /* The numbers freed go to new descriptors of the program's, each holding a
           datagram the library must never read. */
        int sv[8][2];
        for (int k = 0; k < 8; k++) {
            if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv[k])) FAIL("socketpair: %s", strerror(errno));
            send(sv[k][0], "a", 1, 0);
            send(sv[k][1], "b", 1, 0);
        }
        for (uint64_t i = 0; i < 500; i++) {
            m[0] = 1; m[1] = i;
            if (full(c, m, sizeof m, 0) || full(c, b, sizeof b, 1) || b[1] != i) FAIL("after closing the others (%d): round trip %d", way, (int)i);
        }
        for (int k = 0; k < 8; k++) {
            char x[2];
            if (recv(sv[k][1], x, 2, MSG_DONTWAIT) != 1 || x[0] != 'a' || recv(sv[k][0], x, 2, MSG_DONTWAIT) != 1 || x[0] != 'b')
                FAIL("a datagram of the program's own sockets is gone (%d)", way);
        }
    }
    /* TCP_NODELAY reads back as the program set it (the library holds the socket at 1
       while the ring carries the data). */
    for (int want = 0; want < 2; want++) {
        int v = want, got = -1;
        socklen_t len = sizeof got;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v);
        getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &got, &len);
        if (got != want) FAIL("TCP_NODELAY set to %d reads %d", want, got);
        m[0] = 1; m[1] = want;
        if (full(c, m, sizeof m, 0) || full(c, b, sizeof b, 1) || b[1] != m[1]) FAIL("round trip after TCP_NODELAY");
    }
    /* SO_RCVTIMEO ends a receive nothing answers. */
    m[0] = 2;
    full(c, m, sizeof m, 0);
    struct timeval tv = {0, 200000};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    double t0 = now_ms();
    ssize_t r = recv(c, b, sizeof b, 0);
    double waited = now_ms() - t0;
    if (r != -1 || (errno != EAGAIN && errno != EWOULDBLOCK)) FAIL("timeout: recv gave %zd, %s", r, strerror(errno));
    if (waited < 150 || waited > 5000) FAIL("timeout after %.0f ms, not 200", waited);
    tv.tv_usec = 0;
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* A signal without SA_RESTART interrupts it. */
    full(c, m, sizeof m, 0);
    alarm_in(100, 0);
    r = recv(c, b, sizeof b, 0);
    if (r != -1 || errno != EINTR || !fired) FAIL("no SA_RESTART: recv gave %zd, %s", r, strerror(errno));
    /* With SA_RESTART the receive goes on until the late answer. */
    m[0] = 3; m[1] = 77;
    full(c, m, sizeof m, 0);
    alarm_in(100, 1);
    t0 = now_ms();
    r = recv(c, b, sizeof b, MSG_WAITALL);
    waited = now_ms() - t0;
    if (r != sizeof b || b[1] != 77) FAIL("SA_RESTART: recv gave %zd, %s", r, strerror(errno));
    if (!fired || waited < 250) FAIL("SA_RESTART: answer after %.0f ms, signal %d", waited, (int)fired);
    /* With a timeout on the socket even SA_RESTART does not restart it (signal(7)). */
    m[0] = 2;
    full(c, m, sizeof m, 0);
    tv.tv_sec = 5;
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    alarm_in(100, 1);
    r = recv(c, b, sizeof b, 0);
    if (r != -1 || errno != EINTR || !fired) FAIL("SA_RESTART and SO_RCVTIMEO: recv gave %zd, %s", r, strerror(errno));
    tv.tv_sec = 0;
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* A send that finds no room sleeps as a kernel send does: a signal with SA_RESTART
       does not end it; one without ends it with EINTR, or with what it sent if the room
       it found first moved a part. */
    size_t total = 32 << 20;
    char *big = calloc(total, 1);
    if (!big) FAIL("calloc");
    for (int restart = 1; restart >= 0; restart--) {
        m[0] = 4; m[1] = total;
        full(c, m, sizeof m, 0);
        size_t k = 0;
        for (;;) {
            r = send(c, big + k, total - k, MSG_DONTWAIT);
            if (r <= 0) break;
            k += r;
        }
        if (r != -1 || errno != EAGAIN) FAIL("filling: send gave %zd, %s", r, strerror(errno));
        alarm_in(100, restart);
        r = send(c, big + k, total - k, 0);
        if (!fired || (restart ? r <= 0 : r == 0 || (r < 0 && errno != EINTR)))
            FAIL("send into a full buffer, SA_RESTART %d: gave %zd (%s), signal %d", restart, r, strerror(errno), (int)fired);
        if (r > 0) k += r;
        if (full(c, big + k, total - k, 0) || full(c, b, sizeof b, 1) || b[0] != 4) FAIL("after the full buffer (%d)", restart);
    }
    free(big);
    close(c);
    puts("ok");
    return 0;
}
"#;

#[test]
fn a_blocking_reader_sleeps_and_wakes_as_on_kernel_tcp() {
    let dir = Scratch::new("blocking");
    let (src, bin) = (dir.path("waits.c"), dir.path("waits"));
    compile_c(BLOCKING_WAITS_C, &src, &bin);
    let bin = bin.to_str().unwrap();
    for wake in ["1", "0"] {
        for p in PLACEMENTS {
            let stats = dir.stats(p, &format!("wake{wake}"));
            let port = free_port();
            let ps = port.to_string();
            let cmd = |role: &str, preload: bool| {
                let mut c = command(bin, &[role, &ps], preload, &stats);
                c.env("CLINK_SOCKETS_SPIN_US", "0")
                    .env("CLINK_SOCKETS_WAKE", wake);
                c
            };
            let mut server = Proc::start(cmd("server", p.server), None);
            wait_for_listen(port);
            let out = run(cmd("client", p.client), None, LIMIT);
            assert!(
                out.status.success(),
                "{p:?} wake={wake}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let st = server.wait_exit(LIMIT);
            assert!(st.success(), "{p:?} wake={wake}: server failed: {st}");
            check_placement(p, &stats, port);
            // Both ends under clink: each reader slept in the library's wait 2000 times
            // and was woken through its wake socket (or, turned off, never so).
            if p.server && p.client {
                let wakes: Vec<u64> = stats_lines(&stats)
                    .iter()
                    .filter(|l| l.contains(&format!("127.0.0.1:{port}")))
                    .filter_map(|l| l.split(" wakes ").nth(1)?.split(' ').next()?.parse().ok())
                    .collect();
                assert_eq!(wakes.len(), 2, "{p:?} wake={wake}: {wakes:?}");
                if wake == "1" {
                    assert!(wakes.iter().all(|&w| w >= 100), "{wakes:?}");
                } else {
                    assert!(wakes.iter().all(|&w| w == 0), "{wakes:?}");
                }
            }
        }
    }
}
