"""The other process of the tests: connects to the address given on the command line
and runs one scenario. Each scenario checks what it receives and reports failures through
its exit code (and stderr)."""

import hashlib
import sys

import clink

T = 30.0  # bound of every wait


def main():
    role, address = sys.argv[1], sys.argv[2]
    ctx = clink.Context()
    ep = ctx.endpoint()
    peer = ep.connect(address)
    if role == "echo":
        # Echoes messages (tag + 1) until tag 0 arrives.
        buf = bytearray(1 << 20)
        while True:
            st = ep.recv_into(buf, peer, timeout=T)
            if st.tag == 0:
                break
            ep.send(peer, st.tag + 1, memoryview(buf)[: st.length])
    elif role == "big":
        # Receives a large numpy array into a numpy buffer, answers its sha256, then sends
        # it back.
        import numpy as np

        n = int(sys.argv[3])
        arr = np.empty(n, dtype=np.uint8)
        st = ep.recv_into(arr, peer, 1, timeout=120)
        assert st.length == n, st
        ep.send(peer, 2, hashlib.sha256(arr).digest())
        ep.send(peer, 3, arr)
        ep.recv(peer, 4, timeout=120)  # the parent's acknowledgement
    elif role == "hang":
        # Tells the parent it is ready, then waits to be killed.
        ep.send(peer, 1, b"ready")
        ep.recv(peer, 99, timeout=120)
    elif role == "rma":
        # Imports the parent's cookie, puts, adds, swaps, then notifies.
        msg = ep.recv(peer, 1, timeout=T)
        r = ep.import_cookie(peer, bytes(msg))
        ep.put(r, 0, b"hello from the child")
        old = ep.fetch_add(r, 64, 5)
        ep.send(peer, 2, old.to_bytes(8, "little"))
        ep.recv(peer, 3, timeout=T)
    elif role == "async":
        # Sends N numbered messages, then waits for the parent's reply to each batch.
        n = int(sys.argv[3])
        for i in range(n):
            ep.send(peer, 5, i.to_bytes(4, "little"))
        got = ep.recv(peer, 6, timeout=T)
        assert bytes(got) == b"done", bytes(got)
    else:
        raise SystemExit(f"unknown role {role}")
    ep.close()


if __name__ == "__main__":
    main()
