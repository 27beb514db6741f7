import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import clink
from conftest import SKIP_NETNS, Child

T = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------ errors


def test_error_codes_match_the_c_header():
    header = open(os.path.join(ROOT, "clink-c", "include", "clink.h")).read()
    codes = {m[0]: int(m[1]) for m in re.findall(r"^\s+(CLINK_[A-Z_]+) = (-?\d+),", header, re.M)
             if not m[0].startswith("CLINK_EVENT")}
    assert codes, "no codes found in clink.h"
    assert codes == clink.ERROR_CODES
    for cls in (clink.PeerDead, clink.Timeout, clink.Truncated, clink.Busy, clink.Refused):
        assert issubclass(cls, clink.Error)
        assert cls.code in codes.values() and cls.code < 0
    assert clink.PeerDead.code == codes["CLINK_ERR_PEER_DEAD"]
    assert clink.Timeout.code == codes["CLINK_ERR_TIMEOUT"]
    assert clink.Truncated.code == codes["CLINK_ERR_TRUNCATED"]


def test_errors(ctx, pair):
    a, pa, b, pb = pair
    with pytest.raises(clink.Timeout) as e:
        a.recv_into(bytearray(8), pa, 1, timeout=0.05)
    assert e.value.code == clink.ERROR_CODES["CLINK_ERR_TIMEOUT"]
    with pytest.raises(clink.AddressError):
        a.connect("not an address")
    with pytest.raises(clink.UnknownPeer) as e:
        a.send(77, 1, b"x")
    assert e.value.peer == 77
    # Truncation: the buffer holds the first bytes, the error the full length.
    b.send(pb, 3, b"0123456789")
    small = bytearray(4)
    with pytest.raises(clink.Truncated) as e:
        a.recv_into(small, pa, 3, timeout=T)
    assert (e.value.length, e.value.capacity) == (10, 4)
    assert bytes(small) == b"0123"
    with pytest.raises(BufferError):
        a.recv_into(b"read-only", pa, 3, timeout=0.01)
    with pytest.raises(clink.InvalidArgument):
        a.recv_into(bytearray(1), pa, timeout=-1)
    with pytest.raises(clink.InvalidArgument):
        a.probe(mask=3)
    a.close()
    with pytest.raises(clink.InvalidArgument):
        a.send(pa, 1, b"x")


# ------------------------------------------------------------------ tagged, one process


def test_send_recv_buffers(pair):
    a, pa, b, pb = pair
    payloads = [b"", b"x", bytearray(b"bytearray"), memoryview(b"0123456789")[2:7],
                np.arange(100, dtype=np.float64)]
    for i, p in enumerate(payloads):
        b.send(pb, 10 + i, p)
    for i, p in enumerate(payloads):
        want = bytes(memoryview(p).cast("B"))
        msg = a.recv(pa, 10 + i, timeout=T)
        assert bytes(msg) == want and msg.status.tag == 10 + i and msg.peer == pa
        assert len(msg) == len(want)
    # recv_into a numpy array, with a selector on any peer.
    arr = np.zeros(16, dtype=np.int32)
    b.send(pb, 5, np.arange(16, dtype=np.int32))
    st = a.recv_into(arr, timeout=T)
    assert (st.peer, st.tag, st.length) == (pa, 5, 64)
    assert (arr == np.arange(16)).all()
    # Non-contiguous input is refused, not copied behind the caller's back.
    with pytest.raises(BufferError):
        b.send(pb, 1, np.arange(10)[::2])
    # A batch: every buffer its own message, in order.
    b.send_batch(pb, 6, payloads)
    for p in payloads:
        assert bytes(a.recv(pa, 6, timeout=T)) == bytes(memoryview(p).cast("B"))
    with pytest.raises(BufferError):
        b.send_batch(pb, 6, [b"ok", np.arange(10)[::2]])


def test_probe_and_masks(pair):
    a, pa, b, pb = pair
    assert a.probe() is None
    b.send(pb, 0x1234, b"abc")
    st = None
    for _ in range(10000):
        st = a.probe(tag=0x1200, mask=0xFF00)
        if st is not None:
            break
    assert st is not None and (st.tag, st.length, st.peer) == (0x1234, 3, pa)
    assert a.probe(tag=0x9900, mask=0xFF00) is None
    assert bytes(a.recv(tag=0x1200, mask=0xFF00, timeout=T)) == b"abc"


def test_nonblocking_requests(pair):
    a, pa, b, pb = pair
    big = np.random.default_rng(1).integers(0, 255, 4 << 20, dtype=np.uint8)  # rendezvous
    r1 = a.irecv(len(big), pa, 1)
    r2 = a.irecv(16, pa, 2)
    assert r1.test() is None
    s = b.isend(pb, 1, big)
    s2 = b.isend(pb, 2, b"small")
    # Drive both sides until everything completes (one thread: the sender's progress
    # answers the receiver's rendezvous).
    done = None
    for _ in range(1_000_000):
        b.progress()
        if done is None:
            done = r1.test()
        if done is not None and s.test():
            break
    assert done is not None and s.test() is True
    assert np.array_equal(np.frombuffer(done, dtype=np.uint8), big)
    assert s2.test() is True
    idx, m = a.wait_any([r2], timeout=T)
    assert idx == 0 and bytes(m) == b"small"
    with pytest.raises(clink.Consumed):
        r2.test()
    # Cancel a receive that matched nothing.
    r3 = a.irecv(8, pa, 3)
    assert r3.cancel() is True
    # wait with timeout leaves the request pending.
    r4 = a.irecv(8, pa, 4)
    with pytest.raises(clink.Timeout):
        r4.wait(timeout=0.02)
    b.send(pb, 4, b"four")
    assert bytes(r4.wait(timeout=T)) == b"four"


def test_in_place_and_claim(pair):
    a, pa, b, pb = pair
    with b.claim(pb, 9, 32, timeout=T) as slot:
        mv = memoryview(slot)
        mv[:] = bytes(range(32))
        mv.release()
    with a.recv_in_place(pa, 9, timeout=T) as msg:
        assert msg.status.length == 32 and msg.held
        view = memoryview(msg)
        assert view.readonly and bytes(view) == bytes(range(32))
        # The endpoint is reserved while the message is held.
        with pytest.raises(clink.Busy):
            a.probe()
        # It cannot be released while a view exists.
        with pytest.raises(BufferError):
            msg.release()
        view.release()
    assert not msg.held
    with pytest.raises(BufferError):
        memoryview(msg)
    assert a.probe() is None  # usable again
    # An abandoned slot sends nothing.
    slot = b.claim(pb, 10, 8)
    assert slot.abandon() is True
    b.send(pb, 11, b"after")
    assert bytes(a.recv(pa, timeout=T)) == b"after"


def test_concurrent_use_raises_busy(pair):
    a, pa, b, pb = pair
    entered = threading.Event()
    errors = []

    def blocker():
        entered.set()
        try:
            a.recv_into(bytearray(8), pa, 42, timeout=5)
        except clink.Error as e:
            errors.append(e)

    t = threading.Thread(target=blocker)
    t.start()
    entered.wait(T)
    busy = False
    for _ in range(100000):
        try:
            a.probe(tag=1)
        except clink.Busy as e:
            assert e.code == clink.ERROR_CODES["CLINK_ERR_BUSY"]
            busy = True
            break
    assert busy, "a second thread's call did not raise Busy while the first waited"
    b.send(pb, 42, b"wake")
    t.join(T)
    assert not errors


class Interrupted(Exception):
    pass


def test_signals_interrupt_blocking_waits(pair):
    """A signal handler that raises (Ctrl-C's KeyboardInterrupt included) ends a blocking
    wait at once, as it ends time.sleep, instead of when the wait's timeout runs out; the
    endpoint works on afterwards."""
    a, pa, b, pb = pair

    def raise_it(signum, frame):
        raise Interrupted()

    waits = {
        "recv": lambda: a.recv(pa, 7, timeout=20),
        "recv_into": lambda: a.recv_into(bytearray(8), pa, 7, timeout=20),
        "recv_in_place": lambda: a.recv_in_place(pa, 7, timeout=20),
        "accept": lambda: a.accept(timeout=20),
        "request wait": lambda: req.wait(timeout=20),
        "wait_any": lambda: a.wait_any([req], timeout=20),
        "wait_event": lambda: a.wait_event(timeout=20),
    }
    req = a.irecv(8, pa, 7)
    old = signal.signal(signal.SIGALRM, raise_it)
    try:
        for name, wait in waits.items():
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            with pytest.raises(Interrupted):
                wait()
            took = time.monotonic() - t0
            assert took < 5, f"{name}: the handler's exception came after {took:.2f} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # (wait_any gave the request back when interrupted.)
    assert req.cancel(), "the interrupted request had matched nothing"
    # Ctrl-C: SIGINT with Python's own handler, installed here: a Python started with
    # SIGINT ignored (a background job of a non-interactive shell) leaves it ignored, and
    # the signal would never reach the wait.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            a.recv(pa, 7, timeout=20)
        assert time.monotonic() - t0 < 5
    finally:
        signal.signal(signal.SIGINT, old)
    b.send(pb, 7, b"after")
    assert bytes(a.recv(pa, 7, timeout=T)) == b"after"


def test_stats_peers_fd(pair):
    a, pa, b, pb = pair
    b.send(pb, 1, b"x" * 10)
    a.recv(timeout=T)
    s = b.stats()
    assert isinstance(s, dict) and s["eager_sends"] >= 1 and s["frames_sent"] >= 1
    # Every counter, not only the common ones.
    assert len(s) > 60 and s["spins_failed"] >= 0 and s["board_wakeups"] >= 0
    assert all(isinstance(v, int) for v in s.values())
    assert a.peers() == [pa] and a.is_alive(pa)
    assert a.transport(pa) == "shm"
    # b connected to a; neither connected to the other at the same time.
    assert a.joined(pa) == (False, False, False)
    assert b.joined(pb) == (True, False, False)
    assert a.eager_max(pa) > 0
    assert isinstance(a.fileno(), int) and a.fileno() >= 0
    if a.prepare_wait():
        a.finish_wait()


# ------------------------------------------------------------------ one-sided


def test_apertures_tripwires_events(pair):
    a, pa, b, pb = pair
    ap = a.aperture_alloc(4096)
    view = memoryview(ap)
    assert len(view) == 4096 and not view.readonly
    view[100:105] = b"owner"
    cookie = a.export(ap, 0, 4096, clink.READ | clink.WRITE)
    assert isinstance(cookie, bytes)
    a.set_interest(clink.ALL)
    trip = a.tripwire(ap, 0, 64)
    # The owner applies one-sided accesses when it makes progress: a thread drives it
    # while this one uses b.
    stop = threading.Event()

    def owner():
        while not stop.is_set():
            a.progress()

    t = threading.Thread(target=owner)
    t.start()
    try:
        r = b.import_cookie(pb, cookie)
        assert len(r) == 4096 and r.peer == pb
        b.put(r, 0, b"hello")
        assert bytes(view[:5]) == b"hello"
        assert b.get(r, 100, 5) == b"owner"
        out = bytearray(5)
        b.get_into(r, 100, out)
        assert out == b"owner"
        assert b.fetch_add(r, 64, 7) == 0
        assert b.compare_swap(r, 64, 7, 9) == 7
        assert int.from_bytes(view[64:72], "little") == 9
        # A mapped window: plain stores into the owner's aperture.
        w = b.map(r)
        mw = memoryview(w)
        mw[200:204] = b"map!"
        assert bytes(view[200:204]) == b"map!"
        mw.release()
    finally:
        stop.set()
        t.join(T)
    ev = None
    for _ in range(100):
        ev = a.wait_event(timeout=T)
        if ev.kind == "tripwire":
            break
    assert ev.kind == "tripwire" and ev.tripwire == trip and ev.write and ev.offset == 0
    assert a.tripwire_count(trip) >= 1
    # Revoked cookies are refused.
    a.revoke(cookie)
    stop.clear()
    t = threading.Thread(target=owner)
    t.start()
    try:
        with pytest.raises(clink.Refused):
            b.put(r, 0, b"x")
    finally:
        stop.set()
        t.join(T)
    view.release()


# ------------------------------------------------------------------ two processes


def test_from_launcher_without_a_launcher_raises_config_error():
    assert "PMIX_NAMESPACE" not in os.environ, "this test must run outside a launcher"
    with pytest.raises(clink.ConfigError, match="not started by a PMIx launcher") as e:
        clink.Context.from_launcher()
    assert e.value.code == clink.ERROR_CODES["CLINK_ERR_CONFIG"]


def test_ranks_started_by_mpirun_find_each_other():
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is not installed (Debian: openmpi-bin; .ci/run installs it)"
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "3"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    ring = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher_ring.py")
    p = subprocess.Popen(
        [*cmd, sys.executable, ring],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)  # mpirun and its ranks: their own process group
        p.communicate()
        raise
    assert p.returncode == 0, out
    for r in range(3):
        assert f"rank {r} of 3: got 'hello from {(r + 2) % 3}' from its left" in out, out
        assert f"rank {r}: 3 ranks on this node" in out, out


def test_two_processes_echo(ctx):
    ep = ctx.endpoint()
    child = Child(ep, "echo")
    try:
        buf = bytearray(1 << 20)
        for n in (1, 8, 100, 4096, 100_000, 1 << 20):
            data = os.urandom(n)
            ep.send(child.peer, 7, data)
            st = ep.recv_into(buf, child.peer, 8, timeout=T)
            assert st.length == n and bytes(buf[:n]) == data
        # isend of a numpy array (rendezvous: the child reads it in place); the request
        # holds the array's buffer until the send completes, here during the receive.
        arr = np.arange(1 << 17, dtype=np.float64)
        req = ep.isend(child.peer, 7, arr)
        st = ep.recv_into(buf, child.peer, 8, timeout=T)
        assert st.length == arr.nbytes and bytes(buf[: arr.nbytes]) == arr.tobytes()
        req.wait(timeout=T)
        assert req.test() is True
        ep.send(child.peer, 0, b"")
        child.wait()
    finally:
        child.kill()


def test_one_gib_numpy(ctx):
    n = 1 << 30
    ep = ctx.endpoint()
    child = Child(ep, "big", n)
    try:
        arr = np.empty(n, dtype=np.uint8)
        arr.view(np.uint64)[:] = np.arange(n // 8, dtype=np.uint64) * 0x9E3779B97F4A7C15
        digest = hashlib.sha256(arr).digest()
        ep.send(child.peer, 1, arr)
        assert bytes(ep.recv(child.peer, 2, timeout=120)) == digest
        back = np.zeros(n, dtype=np.uint8)
        st = ep.recv_into(back, child.peer, 3, timeout=120)
        assert st.length == n
        rng = np.random.default_rng(7)
        idx = rng.integers(0, n, 10000)
        assert np.array_equal(back[idx], arr[idx])
        assert hashlib.sha256(back).digest() == digest
        ep.send(child.peer, 4, b"ok")
        child.wait()
    finally:
        child.kill()


def test_killed_peer_raises_peer_dead(ctx):
    ep = ctx.endpoint()
    child = Child(ep, "hang")
    try:
        assert bytes(ep.recv(child.peer, 1, timeout=T)) == b"ready"
        req = ep.irecv(8, child.peer, 2)
        child.proc.kill()  # SIGKILL
        with pytest.raises(clink.PeerDead) as e:
            req.wait(timeout=T)
        assert e.value.peer == child.peer
        with pytest.raises(clink.PeerDead):
            ep.recv_into(bytearray(8), child.peer, 3, timeout=T)
        assert not ep.is_alive(child.peer)
    finally:
        child.kill()


def test_rma_across_processes(ctx):
    ep = ctx.endpoint()
    child = Child(ep, "rma")
    try:
        ap = ep.aperture_alloc(4096)
        view = np.frombuffer(ap, dtype=np.uint8)
        view[64:72] = np.frombuffer((40).to_bytes(8, "little"), dtype=np.uint8)
        ep.send(child.peer, 1, ep.export(ap))
        old = int.from_bytes(bytes(ep.recv(child.peer, 2, timeout=T)), "little")
        assert old == 40
        assert bytes(view[:20]) == b"hello from the child"
        assert int.from_bytes(bytes(view[64:72]), "little") == 45
        ep.send(child.peer, 3, b"bye")
        child.wait()
    finally:
        child.kill()


# ------------------------------------------------------------------ asyncio


def test_asyncio_round_trips(ctx):
    ep = ctx.endpoint()
    child = Child(ep, "echo")

    async def main():
        buf = bytearray(1 << 20)
        for n in (8, 5000, 300_000):
            data = os.urandom(n)
            await ep.send_async(child.peer, 7, data)
            st = await asyncio.wait_for(ep.recv_async(buf, child.peer, 8), T)
            assert st.length == n and bytes(buf[:n]) == data
        # Several coroutines waiting on the same endpoint at once.
        async def one(i):
            b = bytearray(16)
            st = await asyncio.wait_for(ep.recv_async(b, child.peer, 100 + i), T)
            return bytes(b[: st.length])

        tasks = [asyncio.create_task(one(i)) for i in range(3)]
        await asyncio.sleep(0)
        for i in range(3):
            await ep.send_async(child.peer, 99 + i, f"m{i}".encode())
        assert await asyncio.gather(*tasks) == [b"m0", b"m1", b"m2"]
        req = ep.irecv(8, child.peer, 500)
        await ep.send_async(child.peer, 499, b"req")
        assert bytes(await asyncio.wait_for(req.wait_async(), T)) == b"req"
        # Events.
        ep.set_interest(clink.MESSAGES)
        await ep.send_async(child.peer, 599, b"ev")
        ev = await asyncio.wait_for(ep.wait_event_async(), T)
        assert ev.kind == "message" and ev.tag == 600 and ev.peer == child.peer
        assert bytes(ep.recv(child.peer, 600, timeout=T)) == b"ev"
        await ep.send_async(child.peer, 0, b"")

    try:
        asyncio.run(main())
        child.wait()
    finally:
        child.kill()


def test_asyncio_cancel_leaves_nothing_posted(pair):
    a, pa, b, pb = pair

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(a.recv_async(bytearray(8), pa, 1), 0.05)
        b.send(pb, 1, b"later")
        buf = bytearray(8)
        st = await asyncio.wait_for(a.recv_async(buf, pa, 1), T)
        assert bytes(buf[: st.length]) == b"later"

    asyncio.run(main())


# ------------------------------------------------------------------ network namespaces


def _netns_unavailable():
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    return None


def test_udp_between_network_namespaces():
    why = _netns_unavailable()
    if why:
        if SKIP_NETNS:
            pytest.skip(f"CLINK_SKIP_NETNS=1: {why}")
        pytest.fail(f"the network namespace test needs root and iproute2 ({why}); "
                    "set CLINK_SKIP_NETNS=1 to skip it explicitly")
    tag = uuid.uuid4().hex[:6]
    ns1, ns2 = f"clpy{tag}a", f"clpy{tag}b"
    v1, v2 = f"cp{tag}a", f"cp{tag}b"
    octet = int(tag[:2], 16) % 200 + 20
    ip1, ip2 = f"10.{octet}.77.1", f"10.{octet}.77.2"

    def ip(*args):
        subprocess.run(["ip", *args], check=True, timeout=30)

    try:
        ip("netns", "add", ns1)
        ip("netns", "add", ns2)
        ip("link", "add", v1, "type", "veth", "peer", "name", v2)
        ip("link", "set", v1, "netns", ns1)
        ip("link", "set", v2, "netns", ns2)
        for ns, dev, addr in ((ns1, v1, ip1), (ns2, v2, ip2)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        env = dict(os.environ, CLINK_TRANSPORT="udp")
        # This process cannot enter a namespace itself: run the receiving side (a small
        # script) in ns1 and the echo peer in ns2.
        script = (
            "import os, sys, clink, subprocess\n"
            "ep = clink.Context().endpoint()\n"
            "p = subprocess.Popen(['ip','netns','exec',sys.argv[1],sys.executable,sys.argv[2],'echo',ep.address])\n"
            "peer = ep.accept(timeout=60)\n"
            "assert ep.transport(peer) == 'udp', ep.transport(peer)\n"
            "buf = bytearray(1 << 20)\n"
            "for n in (8, 1400, 64000, 1 << 20):\n"
            "    data = os.urandom(n)\n"
            "    ep.send(peer, 7, data)\n"
            "    st = ep.recv_into(buf, peer, 8, timeout=30)\n"
            "    assert st.length == n and bytes(buf[:n]) == data, n\n"
            "ep.send(peer, 0, b'')\n"
            "assert p.wait(timeout=60) == 0\n"
            "print('netns ok')\n"
        )
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(
            ["ip", "netns", "exec", ns1, sys.executable, "-c", script, ns2,
             os.path.join(here, "peer.py")],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert out.returncode == 0 and "netns ok" in out.stdout, out.stdout + out.stderr
    finally:
        for ns in (ns1, ns2):
            subprocess.run(["ip", "netns", "del", ns], timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_the_benchmark_script_runs_and_prints_rows():
    # A short run of bench.py: every system it measures gives well-formed rows.
    bench = os.path.join(os.path.dirname(__file__), "..", "bench.py")
    out = subprocess.run(
        [sys.executable, bench, "--rounds", "300", "--bulk-rounds", "1", "--json"],
        check=True, capture_output=True, text=True, timeout=240,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    seen = {(r["system"], r["metric"]) for r in rows}
    for want in [("clink-py", "latency_us"), ("clink-py", "bandwidth_gbs"),
                 ("socket", "latency_us"), ("socket", "bandwidth_gbs")]:
        assert want in seen, (want, rows)
    assert all(r["median"] > 0 for r in rows), rows
