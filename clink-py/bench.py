"""Round-trip latency and bandwidth from Python, two processes on one host.

Prints the median round trip of an 8-byte message for clink, Python's own Unix socket
pair (socket.socketpair, the child forked) and pyzmq over ipc:// (when pyzmq is
installed: pip install pyzmq), and the bandwidth of 64 MiB numpy arrays sent by clink
(send from the array, recv_into an array) and over the socket pair (sendall / recv_into).

    python bench.py [--rounds N] [--bulk-rounds N]

Run it on a quiet machine: nothing else building or benchmarking.
"""

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import numpy as np

import clink

BIG = 64 << 20


def _clink_child(address, rounds, bulk_rounds):
    ep = clink.Context().endpoint()
    peer = ep.connect(address)
    buf = bytearray(8)
    for _ in range(rounds):
        ep.recv_into(buf, peer, 1)
        ep.send(peer, 1, buf)
    arr = np.empty(BIG, dtype=np.uint8)
    for _ in range(bulk_rounds):
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
    for _ in range(bulk_rounds):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--bulk-rounds", type=int, default=20)
    args = ap.parse_args()
    warm = args.rounds // 10

    def med(ts):
        return statistics.median(ts[warm:]) / 1000.0

    print(f"python {sys.version.split()[0]}, clink {clink.__version__}, "
          f"{args.rounds} round trips of 8 B, {args.bulk_rounds} x 64 MiB")
    c, cbw = bench_clink(args.rounds, args.bulk_rounds)
    s, sbw = bench_socketpair(args.rounds, args.bulk_rounds)
    z = bench_zmq(args.rounds)
    print(f"{'':22} {'8 B round trip (median)':>24} {'64 MiB bandwidth':>18}")
    print(f"{'clink':22} {med(c):21.2f} us {cbw / 1e9:15.2f} GB/s")
    print(f"{'socket.socketpair':22} {med(s):21.2f} us {sbw / 1e9:15.2f} GB/s")
    if z is None:
        print(f"{'pyzmq ipc://':22} {'(pyzmq not installed)':>24}")
    else:
        print(f"{'pyzmq ipc://':22} {med(z):21.2f} us {'-':>18}")


if __name__ == "__main__":
    main()
