"""Latency and bandwidth from Python, two processes on one host.

Prints the one-way latency (half the median round trip) of an 8-byte message for clink,
Python's own Unix socket pair (socket.socketpair, the child forked) and pyzmq over
ipc:// (when pyzmq is installed: pip install pyzmq), and the bandwidth of 64 MiB numpy
arrays sent by clink (send from the array, recv_into an array) and over the socket pair
(sendall / recv_into). With --json, rows in the shape of `clink bench --json` (system
clink-py, socket, pyzmq), to set beside the Rust figures of the same run.

    python bench.py [--rounds N] [--bulk-rounds N] [--repeat N] [--json]

Run it on a quiet machine: nothing else building or benchmarking."""

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

# numpy's OpenBLAS starts a thread per CPU that spins after import, taking a core's worth
# of time from the two processes measured on a small machine; nothing here uses BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import clink  # noqa: E402

BIG = 64 << 20
# Untimed 64 MiB messages before the timed ones (page faults of the receiving array).
WARM_BULK = 2


def _clink_child(address, rounds, bulk_rounds):
    ep = clink.Context().endpoint()
    peer = ep.connect(address)
    buf = bytearray(8)
    for _ in range(rounds):
        ep.recv_into(buf, peer, 1)
        ep.send(peer, 1, buf)
    arr = np.empty(BIG, dtype=np.uint8)
    for _ in range(bulk_rounds + WARM_BULK):
        ep.recv_into(arr, peer, 2)
    ep.send(peer, 3, b"done")
    ep.recv(peer, 4, timeout=30)


def bench_clink(rounds, bulk_rounds):
    ep = clink.Context().endpoint()
    child = mp.get_context("spawn").Process(
        target=_clink_child, args=(ep.address, rounds, bulk_rounds)
    )
    child.start()
    try:
        peer = ep.accept(timeout=60)
        msg, buf = bytearray(8), bytearray(8)
        times = []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            ep.send(peer, 1, msg)
            ep.recv_into(buf, peer, 1)
            times.append(time.perf_counter_ns() - t)
        arr = np.ones(BIG, dtype=np.uint8)
        for _ in range(WARM_BULK):  # the receiver's array is touched, the paths warm
            ep.send(peer, 2, arr)
        t = time.perf_counter()
        for _ in range(bulk_rounds):
            ep.send(peer, 2, arr)
        ep.recv(peer, 3, timeout=60)  # the last array is in the child's buffer
        secs = time.perf_counter() - t
        ep.send(peer, 4, b"")
        return times, BIG * bulk_rounds / secs
    finally:
        child.join(60)


def _sock_child(s, rounds, bulk_rounds):
    buf = bytearray(8)
    for _ in range(rounds):
        n = 0
        while n < 8:
            n += s.recv_into(memoryview(buf)[n:])
        s.sendall(buf)
    arr = np.empty(BIG, dtype=np.uint8)
    mv = memoryview(arr)
    for _ in range(bulk_rounds + WARM_BULK):
        n = 0
        while n < BIG:
            n += s.recv_into(mv[n:])
    s.sendall(b"d")
    os._exit(0)


def bench_socketpair(rounds, bulk_rounds):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        a.close()
        _sock_child(b, rounds, bulk_rounds)
    b.close()
    msg, buf = bytearray(8), bytearray(8)
    times = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        a.sendall(msg)
        n = 0
        while n < 8:
            n += a.recv_into(memoryview(buf)[n:])
        times.append(time.perf_counter_ns() - t)
    arr = np.ones(BIG, dtype=np.uint8)
    for _ in range(WARM_BULK):
        a.sendall(arr)
    t = time.perf_counter()
    for _ in range(bulk_rounds):
        a.sendall(arr)
    a.recv(1)
    secs = time.perf_counter() - t
    os.waitpid(pid, 0)
    return times, BIG * bulk_rounds / secs


def _zmq_child(path, rounds):
    import zmq

    z = zmq.Context()
    s = z.socket(zmq.PAIR)
    s.connect(path)
    for _ in range(rounds):
        s.send(s.recv(copy=True))
    s.close()
    z.term()


def bench_zmq(rounds):
    try:
        import zmq
    except ImportError:
        return None
    path = f"ipc:///tmp/clink-bench-{os.getpid()}"
    z = zmq.Context()
    s = z.socket(zmq.PAIR)
    s.bind(path)
    child = mp.get_context("spawn").Process(target=_zmq_child, args=(path, rounds))
    child.start()
    msg = b"x" * 8
    times = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        s.send(msg)
        s.recv(copy=True)
        times.append(time.perf_counter_ns() - t)
    child.join(60)
    s.close()
    z.term()
    return times


def rows(system, times, warm, bw, rnd):
    """JSON rows in the shape of `clink bench --json`: the one-way latency (half the
    median round trip) and, when measured, the 64 MiB bandwidth."""
    lat = statistics.median(times[warm:]) / 2000.0
    out = [{"system": system, "metric": "latency_us", "size": 8, "median": round(lat, 4),
            "iterations": len(times) - warm, "mode": "blocking", "placement": "host",
            "round": rnd}]
    if bw is not None:
        out.append({"system": system, "metric": "bandwidth_gbs", "size": BIG,
                    "median": round(bw / 1e9, 4), "mode": "blocking", "placement": "host",
                    "round": rnd})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20000, help="8-byte round trips")
    ap.add_argument("--bulk-rounds", type=int, default=40, help="timed 64 MiB messages")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every system this many times, interleaved")
    ap.add_argument("--json", action="store_true",
                    help="one JSON object per line (as clink bench --json), no table")
    args = ap.parse_args()
    warm = args.rounds // 10
    out = []
    for rnd in range(args.repeat):
        c, cbw = bench_clink(args.rounds, args.bulk_rounds)
        out += rows("clink-py", c, warm, cbw, rnd)
        s, sbw = bench_socketpair(args.rounds, args.bulk_rounds)
        out += rows("socket", s, warm, sbw, rnd)
        z = bench_zmq(args.rounds)
        if z is not None:
            out += rows("pyzmq", z, warm, None, rnd)
    if args.json:
        for r in out:
            print(json.dumps(r, sort_keys=True))
        return
    print(f"python {sys.version.split()[0]}, clink {clink.__version__}, "
          f"{args.rounds} round trips of 8 B, {args.bulk_rounds} x 64 MiB, "
          f"medians of {args.repeat} run(s)")
    print(f"{'':22} {'8 B one-way (median)':>22} {'64 MiB bandwidth':>18}")
    for system, name in [("clink-py", "clink"), ("socket", "socket.socketpair"),
                         ("pyzmq", "pyzmq ipc://")]:
        def med(metric):
            v = [r["median"] for r in out if r["system"] == system and r["metric"] == metric]
            return statistics.median(v) if v else None
        lat, bw = med("latency_us"), med("bandwidth_gbs")
        if lat is None:
            print(f"{name:22} {'(not installed)':>22}")
            continue
        bws = f"{bw:13.2f} GB/s" if bw is not None else f"{'-':>18}"
        print(f"{name:22} {lat:19.3f} us {bws}")


if __name__ == "__main__":
    main()
