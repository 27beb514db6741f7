import os
import subprocess
import sys
import threading

import pytest

import clink

# Read here and removed from the environment: clink refuses unknown CLINK_* variables.
SKIP_NETNS = os.environ.pop("CLINK_SKIP_NETNS", None) == "1"

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")


class Child:
    """A peer process (tests/peer.py) connected to an endpoint of this process."""

    def __init__(self, ep, role, *args, prefix=(), env=None, address=None):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, PEER, role, address or ep.address, *map(str, args)],
            env=e,
        )
        try:
            self.peer = ep.accept(timeout=60)
        except BaseException:
            self.kill()
            raise

    def wait(self, timeout=120):
        rc = self.proc.wait(timeout=timeout)
        assert rc == 0, f"peer process failed with exit code {rc}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def ctx():
    # Creating a context calibrates the machine's costs (about a second): once per run.
    return clink.Context()


@pytest.fixture
def pair(ctx):
    """Two connected endpoints of this process: (a, peer of b at a, b, peer of a at b)."""
    a = ctx.endpoint()
    b = ctx.endpoint()
    got = {}

    def acc():
        got["p"] = a.accept(timeout=30)

    t = threading.Thread(target=acc)
    t.start()
    pb = b.connect(a.address)
    t.join(timeout=30)
    assert "p" in got, "accept did not return"
    yield a, got["p"], b, pb
    for e in (a, b):
        try:
            e.close()
        except clink.Error:
            pass
