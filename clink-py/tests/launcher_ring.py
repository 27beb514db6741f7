"""One rank of a job mpirun starts (tests/test_clink.py): the ranks find each other through
the launcher (clink.Context.from_launcher), each greets its right-hand neighbour and checks
the greeting of its left-hand one, then prints what it got."""

import clink

ctx, job = clink.Context.from_launcher()
ep = ctx.endpoint()
addrs = job.exchange_addresses(ep.address)
assert len(addrs) == job.size and addrs[job.rank] == ep.address, addrs
right = ep.connect(addrs[(job.rank + 1) % job.size])
ep.send(right, 7, f"hello from {job.rank}".encode())
buf = bytearray(64)
st = ep.recv_into(buf, timeout=60)
got = bytes(buf[: st.length]).decode()
left = (job.rank + job.size - 1) % job.size
assert got == f"hello from {left}", got
print(f"rank {job.rank} of {job.size}: got {got!r} from its left", flush=True)
print(f"rank {job.rank}: {job.local_size} ranks on this node", flush=True)
# Every rank has its greeting before any closes.
job.exchange_addresses(ep.address)
ep.close()
