//! The compatibility suite: real programs from Debian's packages, unmodified, in the four
//! placements (both ends under the sockets layer, server only, client only, neither), with
//! byte-exact checks of what crossed and a check, from the library's own statistics, that
//! both-ends runs were accelerated and mixed runs stayed on the kernel.

mod common;

use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn sha256(data: &[u8], dir: &Scratch) -> String {
    let p = dir.path("sha-input");
    std::fs::write(&p, data).unwrap();
    let out = run(
        command("sha256sum", &[p.to_str().unwrap()], false, &p),
        None,
        LIMIT,
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn socat_carries_a_stream_byte_for_byte() {
    let dir = Scratch::new("socat-stream");
    let data = random_bytes(24 << 20, 7);
    let src = dir.path("src");
    std::fs::write(&src, &data).unwrap();
    for p in PLACEMENTS {
        let stats = dir.stats(p, "");
        let port = free_port();
        let dst = dir.path("dst");
        let _ = std::fs::remove_file(&dst);
        let listen = format!("TCP-LISTEN:{port},reuseaddr,bind=127.0.0.1");
        let out_addr = format!("CREATE:{}", dst.display());
        let mut server = Proc::start(
            command("socat", &["-u", &listen, &out_addr], p.server, &stats),
            None,
        );
        wait_for_listen(port);
        let from = format!("OPEN:{}", src.display());
        let to = format!("TCP:127.0.0.1:{port}");
        let out = run(
            command("socat", &["-u", &from, &to], p.client, &stats),
            None,
            LIMIT,
        );
        assert!(
            out.status.success(),
            "{p:?}: client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let st = server.child.wait().unwrap();
        assert!(st.success(), "{p:?}: server failed");
        assert!(
            std::fs::read(&dst).unwrap() == data,
            "{p:?}: the received file differs"
        );
        check_placement(p, &stats, port);
    }
}

/// Sends `input` with socat to the server on `port`, which runs sha256sum over the
/// connection after an exec, and checks the digest that comes back; then that the
/// accepting end left (with both ends under the library; the connecting end may have
/// paired before the exec, then it resends what its ring held, or not, then it never
/// left the kernel), or that a mixed placement stayed on the kernel.
fn digest_back_and_leave(
    p: Placement,
    port: u16,
    input: &std::path::Path,
    stats: &std::path::Path,
    want: &str,
    what: &str,
) {
    let to = format!("TCP:127.0.0.1:{port}");
    let out = run(
        command("socat", &["-t", "30", "-", &to], p.client, stats),
        Some(input),
        LIMIT,
    );
    assert!(
        out.status.success(),
        "{what}: client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        got.split_whitespace().next(),
        Some(want),
        "{what}: wrong digest"
    );
    if p.server && p.client {
        expect_left(p, stats);
    } else {
        check_placement(p, stats, port);
    }
}

#[test]
fn socat_exec_half_close_and_a_program_without_the_library() {
    let dir = Scratch::new("socat-exec");
    let data = random_bytes(8 << 20, 11);
    let src = dir.path("src");
    std::fs::write(&src, &data).unwrap();
    let want = sha256(&data, &dir);
    for (p, program) in PLACEMENTS
        .iter()
        .map(|p| (*p, "sha256sum"))
        .chain([(PLACEMENTS[0], "env -u LD_PRELOAD sha256sum")])
    {
        let stats = dir.stats(p, &program.len().to_string());
        let port = free_port();
        // The connection's descriptor becomes sha256sum's stdin and stdout (dup2, then
        // exec): the program reads to the client's half-close and answers on the same
        // connection.
        let listen = format!("TCP-LISTEN:{port},reuseaddr,bind=127.0.0.1");
        let exec = format!("EXEC:{program},nofork");
        let _server = Proc::start(command("socat", &[&listen, &exec], p.server, &stats), None);
        wait_for_listen(port);
        let what = format!("{p:?} {program}");
        digest_back_and_leave(p, port, &src, &stats, &want, &what);
    }
}

/// Accepts one connection on 127.0.0.1 port argv[1], makes it the program's stdin and
/// stdout, and runs sha256sum (argv[3], or found on the PATH) over it through the list
/// form of exec named by argv[2]: the C library runs those through its internal execve.
const EXECL_SERVER_C: &str = r#"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) { perror("listen"); return 1; }
    int c = accept(s, NULL, NULL);
    if (c < 0) { perror("accept"); return 1; }
    close(s);
    dup2(c, 0);
    dup2(c, 1);
    close(c);
    if (!strcmp(argv[2], "execl")) execl(argv[3], "sha256sum", (char *)NULL);
    else if (!strcmp(argv[2], "execlp")) execlp("sha256sum", "sha256sum", (char *)NULL);
    else if (!strcmp(argv[2], "execle")) execle(argv[3], "sha256sum", (char *)NULL, environ);
    perror(argv[2]);
    return 127;
}
"#;

#[test]
fn a_program_run_with_execl_execlp_or_execle_gets_the_connection() {
    let dir = Scratch::new("execl");
    let (src, bin) = (dir.path("execl_server.c"), dir.path("execl_server"));
    compile_c(EXECL_SERVER_C, &src, &bin);
    let data = random_bytes(4 << 20, 17);
    let input = dir.path("input");
    std::fs::write(&input, &data).unwrap();
    let want = sha256(&data, &dir);
    let sha = tool("sha256sum");
    for mode in ["execl", "execlp", "execle"] {
        for p in PLACEMENTS {
            let stats = dir.stats(p, mode);
            let port = free_port();
            let ps = port.to_string();
            let args = [ps.as_str(), mode, sha.to_str().unwrap()];
            let mut server = Proc::start(
                command(bin.to_str().unwrap(), &args, p.server, &stats),
                None,
            );
            wait_for_listen(port);
            digest_back_and_leave(p, port, &input, &stats, &want, &format!("{p:?} {mode}"));
            let st = server.wait_exit(LIMIT);
            assert!(st.success(), "{p:?} {mode}: the server failed: {st}");
        }
    }
}

#[test]
fn sockperf_ping_pong_and_throughput_with_epoll_poll_and_select() {
    let dir = Scratch::new("sockperf");
    for p in PLACEMENTS {
        for mux in ["e", "p", "s"] {
            let stats = dir.stats(p, mux);
            let port = free_port();
            let feed = dir.path("feed");
            std::fs::write(&feed, format!("T:127.0.0.1:{port}\n")).unwrap();
            let _server = Proc::start(
                command(
                    "sockperf",
                    &["sr", "-f", feed.to_str().unwrap(), "-F", mux],
                    p.server,
                    &stats,
                ),
                None,
            );
            wait_for_listen(port);
            let ps = port.to_string();
            for (mode, size) in [("pp", "64"), ("tp", "60000")] {
                if mode == "tp" && mux != "e" {
                    continue;
                }
                let args = [
                    mode,
                    "--tcp",
                    "-i",
                    "127.0.0.1",
                    "-p",
                    &ps,
                    "-m",
                    size,
                    "-t",
                    "1",
                ];
                let out = run(command("sockperf", &args, p.client, &stats), None, LIMIT);
                let text = String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "{p:?} -F {mux} {mode}: {text}");
                assert!(!text.contains("ERROR"), "{p:?} -F {mux} {mode}: {text}");
                if mode == "pp" {
                    assert!(
                        text.contains("# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0"),
                        "{p:?} -F {mux}: {text}"
                    );
                    assert!(
                        text.contains("Summary: Latency is"),
                        "{p:?} -F {mux}: {text}"
                    );
                } else {
                    assert!(text.contains("Summary: BandWidth is"), "{p:?} tp: {text}");
                }
            }
            drop(_server);
            check_placement(p, &stats, port);
        }
    }
}

/// Both ends under the library and pinned to one CPU: each process's blocking calls stop
/// spinning once their spins keep failing (a spinning call holds the CPU the other end
/// needs to answer it), instead of failing a spin per message.
#[test]
fn sockperf_ping_pong_on_one_cpu_stops_spinning() {
    let dir = Scratch::new("one-cpu");
    let p = PLACEMENTS[0];
    let stats = dir.stats(p, "one-cpu");
    let port = free_port();
    let ps = port.to_string();
    let sockperf = tool("sockperf");
    let sockperf = sockperf.to_str().unwrap();
    let on_cpu0 = |args: &[&str]| {
        let mut all = vec!["-c", "0", sockperf];
        all.extend_from_slice(args);
        command("taskset", &all, true, &stats)
    };
    let server = Proc::start(
        on_cpu0(&["sr", "--tcp", "-i", "127.0.0.1", "-p", &ps]),
        None,
    );
    wait_for_listen(port);
    let client = format!("pp --tcp -i 127.0.0.1 -p {port} -m 64 -t 1");
    let client: Vec<&str> = client.split(' ').collect();
    let out = run(on_cpu0(&client), None, LIMIT);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let rounds: u64 = text
        .split("[Total Run]")
        .nth(1)
        .and_then(|t| t.split("ReceivedMessages=").nth(1))
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no message count: {text}"));
    drop(server);
    check_placement(p, &stats, port);
    // Each process's last line has its totals.
    let mut per_pid = std::collections::BTreeMap::new();
    for l in stats_lines(&stats)
        .iter()
        .filter(|l| l.contains(&format!("127.0.0.1:{port}")))
    {
        let field = |name: &str| -> u64 {
            l.split(name)
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {name:?} in {l}"))
        };
        let pid = l
            .split("pid ")
            .nth(1)
            .and_then(|t| t.split(':').next())
            .unwrap_or_default()
            .to_string();
        let e = per_pid.entry(pid).or_insert((0, 0));
        *e = (e.0.max(field(" spins failed ")), e.1.max(field(" closed ")));
    }
    let failed: u64 = per_pid.values().map(|v| v.0).sum();
    let closed: u64 = per_pid.values().map(|v| v.1).sum();
    eprintln!("{rounds} round trips, {failed} failed spins, {closed} closures: {per_pid:?}");
    assert_eq!(per_pid.len(), 2, "{per_pid:?}");
    assert!(closed >= 1, "the spin never closed ({failed} failed spins)");
    assert!(
        failed < rounds / 4,
        "{failed} failed spins in {rounds} round trips"
    );
}

fn json_u64(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("no {path:?} in iperf3's report")) as u64
}

#[test]
fn iperf3_forward_reverse_bidirectional_and_parallel() {
    let dir = Scratch::new("iperf3");
    for p in PLACEMENTS {
        for mode in [&[][..], &["-R"][..], &["--bidir"][..], &["-P", "4"][..]] {
            let stats = dir.stats(p, &mode.len().to_string());
            let port = free_port();
            let ps = port.to_string();
            let _server = Proc::start(
                command(
                    "iperf3",
                    &["-s", "-1", "-B", "127.0.0.1", "-p", &ps],
                    p.server,
                    &stats,
                ),
                None,
            );
            wait_for_listen(port);
            let mut args = vec!["-c", "127.0.0.1", "-p", &ps, "-t", "1", "-J"];
            args.extend_from_slice(mode);
            let out = run(command("iperf3", &args, p.client, &stats), None, LIMIT);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{p:?} {mode:?}: {text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(v["error"].is_null(), "{p:?} {mode:?}: {}", v["error"]);
            let sent = json_u64(&v, &["end", "sum_sent", "bytes"]);
            let received = json_u64(&v, &["end", "sum_received", "bytes"]);
            // iperf3 stops reading at the end of the test, so what the client wrote last may
            // count as sent and never as received (over kernel TCP as well); content is
            // checked by the socat, Python and nginx cases.
            assert!(
                sent > 0 && received > 0 && received <= sent,
                "{p:?} {mode:?}: sent {sent} received {received}"
            );
            drop(_server);
            check_placement(p, &stats, port);
        }
    }
}

#[test]
fn redis_with_a_replica_and_redis_benchmark() {
    let dir = Scratch::new("redis");
    let value = String::from_utf8(
        random_bytes(200_000, 3)
            .iter()
            .map(|b| b'a' + b % 26)
            .collect(),
    )
    .unwrap();
    let vfile = dir.path("value");
    std::fs::write(&vfile, &value).unwrap();
    for p in PLACEMENTS {
        let stats = dir.stats(p, "");
        let (port, rport) = (free_port(), free_port());
        let (ps, rps) = (port.to_string(), rport.to_string());
        let common = [
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            "--dir",
        ];
        let d = dir.0.to_str().unwrap();
        let mut a: Vec<&str> = vec!["--port", &ps];
        a.extend_from_slice(&common);
        a.extend_from_slice(&[
            d,
            "--repl-diskless-sync-delay",
            "0",
            "--dbfilename",
            "master.rdb",
        ]);
        let _master = Proc::start(command("redis-server", &a, p.server, &stats), None);
        wait_for_listen(port);
        let cli = |args: &[&str], input: Option<&std::path::Path>| {
            let mut v = vec!["-p", args[0]];
            v.extend_from_slice(&args[1..]);
            run(command("redis-cli", &v, p.client, &stats), input, LIMIT)
        };
        let out = cli(&[&ps, "-x", "SET", "big"], Some(&vfile));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "{p:?}");
        let mut r: Vec<&str> = vec!["--port", &rps];
        r.extend_from_slice(&common);
        r.extend_from_slice(&[
            d,
            "--dbfilename",
            "replica.rdb",
            "--replicaof",
            "127.0.0.1",
            &ps,
        ]);
        let _replica = Proc::start(command("redis-server", &r, p.server, &stats), None);
        wait_for_listen(rport);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !String::from_utf8_lossy(&cli(&[&rps, "INFO", "replication"], None).stdout)
            .contains("master_link_status:up")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{p:?}: the replica never synchronised"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let got = cli(&[&rps, "GET", "big"], None);
        assert!(
            String::from_utf8_lossy(&got.stdout).trim() == value,
            "{p:?}: the replica holds another value"
        );
        let bench = run(
            command(
                "redis-benchmark",
                &[
                    "-p", &ps, "-q", "-n", "20000", "-c", "20", "-P", "8", "-d", "512", "-t",
                    "set,get",
                ],
                p.client,
                &stats,
            ),
            None,
            LIMIT,
        );
        let text = String::from_utf8_lossy(&bench.stdout);
        assert!(
            bench.status.success() && text.contains("GET:") && text.contains("SET:"),
            "{p:?}: {text}"
        );
        let bg = cli(&[&ps, "BGSAVE"], None);
        assert!(
            String::from_utf8_lossy(&bg.stdout).contains("Background saving started"),
            "{p:?}"
        );
        let after = cli(&[&ps, "SET", "after", "fork"], None);
        assert_eq!(String::from_utf8_lossy(&after.stdout).trim(), "OK", "{p:?}");
        check_placement(p, &stats, port);
    }
}

#[test]
fn nginx_serves_files_to_curl_over_http_and_https_and_to_wrk() {
    let dir = Scratch::new("nginx");
    let www = dir.path("www");
    std::fs::create_dir_all(&www).unwrap();
    let file = random_bytes(3 << 20, 5);
    std::fs::write(www.join("big"), &file).unwrap();
    std::fs::write(www.join("small"), b"hello\n").unwrap();
    // A self-signed certificate for the HTTPS server (TLS in the programs, not kTLS: the
    // sockets layer carries its records like any bytes).
    let (cert, key) = (dir.path("cert.pem"), dir.path("key.pem"));
    run_ok(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ],
    );
    for p in PLACEMENTS {
        let stats = dir.stats(p, "");
        let (port, tls_port) = free_ports();
        let conf = dir.path("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "daemon off; master_process on; worker_processes 2; pid {d}/ng.pid; error_log {d}/err.log; user root;\n\
                 events {{}} http {{ sendfile on; tcp_nopush on; access_log off;\n\
                 server {{ listen 127.0.0.1:{port}; root {w}; }}\n\
                 server {{ listen 127.0.0.1:{tls_port} ssl; ssl_certificate {c}; ssl_certificate_key {k}; root {w}; }} }}\n",
                d = dir.0.display(),
                w = www.display(),
                c = cert.display(),
                k = key.display()
            ),
        )
        .unwrap();
        let _nginx = Proc::start(
            command(
                "nginx",
                &["-p", dir.0.to_str().unwrap(), "-c", conf.to_str().unwrap()],
                p.server,
                &stats,
            ),
            None,
        );
        wait_for_listen(port);
        wait_for_listen(tls_port);
        for url in [
            format!("http://127.0.0.1:{port}/big"),
            format!("https://127.0.0.1:{tls_port}/big"),
        ] {
            let out = run(
                command("curl", &["-sS", "--fail", "-k", &url], p.client, &stats),
                None,
                LIMIT,
            );
            assert!(
                out.status.success() && out.stdout == file,
                "{p:?}: curl {url} got {} bytes: {}",
                out.stdout.len(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let small = format!("http://127.0.0.1:{port}/small");
        let w = run(
            command("wrk", &["-t2", "-c16", "-d1s", &small], p.client, &stats),
            None,
            LIMIT,
        );
        let text = String::from_utf8_lossy(&w.stdout);
        assert!(
            w.status.success() && text.contains("Requests/sec"),
            "{p:?}: {text}"
        );
        assert!(
            !text.contains("Socket errors") && !text.contains("Non-2xx"),
            "{p:?}: {text}"
        );
        // nginx's master takes its workers down with it on SIGTERM (not on SIGKILL).
        let mut nginx = _nginx;
        nginx.terminate();
        assert!(
            matches!(nginx.child.try_wait(), Ok(Some(_))),
            "{p:?}: nginx did not stop"
        );
        check_placement(p, &stats, port);
        check_placement(p, &stats, tls_port);
    }
}

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

/// With both ends under clink: the server's end was accelerated, then left.
fn expect_left(p: Placement, stats: &std::path::Path) {
    if p.server && p.client {
        let lines = stats_lines(stats).join("\n");
        assert!(
            lines.contains("its descriptor left this process"),
            "{p:?}: the connection did not leave: {lines}"
        );
    }
}

/// Runs a Python client (arguments: the port) and checks the line it prints.
fn expect_output(
    p: Placement,
    client: &std::path::Path,
    port: &str,
    stats: &std::path::Path,
    want: &str,
) {
    let out = run(
        command(
            "python3",
            &[client.to_str().unwrap(), port],
            p.client,
            stats,
        ),
        None,
        LIMIT,
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(stdout.trim(), want, "{p:?}: {stderr}");
}

/// [`expect_output`] for a client that prints "match" when everything came back right.
fn expect_match(p: Placement, client: &std::path::Path, port: &str, stats: &std::path::Path) {
    expect_output(p, client, port, stats, "match");
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
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("read")
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{p:?}: the server never read"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
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
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&hlog)
            .unwrap_or_default()
            .contains("ready")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{p:?}: the helper never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
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

const MEMCACHED_CLIENT: &str = r#"
import socket, sys, random
rng = random.Random(5)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = c.makefile("rb")
values = {}
for i in range(600):
    k = "key%d" % i
    v = rng.randbytes(rng.choice([1, 100, 5000, 60000, 400000]))
    values[k] = v
    c.sendall(b"set %s 0 0 %d\r\n" % (k.encode(), len(v)) + v + b"\r\n")
    line = f.readline()
    assert line == b"STORED\r\n", line
def get(keys):
    c.sendall(b"get " + b" ".join(k.encode() for k in keys) + b"\r\n")
    got = {}
    while True:
        line = f.readline()
        if line == b"END\r\n":
            return got
        _, k, _, n = line.split()
        got[k.decode()] = f.read(int(n))
        assert f.read(2) == b"\r\n"
keys = list(values)
rng.shuffle(keys)
for i in range(0, len(keys), 25):
    batch = keys[i:i + 25]
    got = get(batch)
    assert got == {k: values[k] for k in batch}, "mismatch"
print("match")
"#;

#[test]
fn memcached_returns_every_value_it_stored() {
    let dir = Scratch::new("memcached");
    let cli = dir.path("client.py");
    std::fs::write(&cli, MEMCACHED_CLIENT).unwrap();
    for p in PLACEMENTS {
        let stats = dir.stats(p, "");
        let port = free_port();
        let ps = port.to_string();
        let args = [
            "-u",
            "root",
            "-l",
            "127.0.0.1",
            "-p",
            &ps,
            "-t",
            "2",
            "-m",
            "512",
            "-I",
            "2m",
        ];
        let _server = Proc::start(command("memcached", &args, p.server, &stats), None);
        wait_for_listen(port);
        expect_match(p, &cli, &ps, &stats);
        drop(_server);
        check_placement(p, &stats, port);
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

const NESTED_SERVER: &str = r#"
import select, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
c, _ = s.accept()
c.setblocking(False)
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
    std::fs::write(&srv, NESTED_SERVER).unwrap();
    std::fs::write(&cli, PING_CLIENT).unwrap();
    for outer in ["epoll", "poll"] {
        for p in PLACEMENTS {
            let stats = dir.stats(p, outer);
            let port = free_port();
            let ps = port.to_string();
            let mut server = Proc::start(
                command(
                    "python3",
                    &[srv.to_str().unwrap(), &ps, outer],
                    p.server,
                    &stats,
                ),
                None,
            );
            wait_for_listen(port);
            expect_match(p, &cli, &ps, &stats);
            // The server writes its end's statistics as it exits, on the client's
            // end-of-stream: read them only then.
            let st = server.wait_exit(LIMIT);
            assert!(st.success(), "{p:?} {outer}: server failed: {st}");
            check_placement(p, &stats, port);
        }
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
