//! The compatibility suite: real programs from Debian's packages, unmodified, in the four
//! placements (both ends under the sockets layer, server only, client only, neither), with
//! byte-exact checks of what crossed and a check, from the library's own statistics, that
//! both-ends runs were accelerated and mixed runs stayed on the kernel.

mod common;

use common::*;
use std::time::Duration;

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
