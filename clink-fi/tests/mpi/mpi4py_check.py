"""mpi4py on the clink provider (clink-fi/tests/provider.rs): pickled objects, a buffer of
8 MiB both ways, allreduce, and non-blocking any-source receives; rank 0 prints "ok mpi4py"."""
from array import array
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
peer = rank ^ 1
obj = comm.sendrecv({"rank": rank, "data": list(range(rank, rank + 5))}, dest=peer, source=peer)
assert obj == {"rank": peer, "data": list(range(peer, peer + 5))}, obj
n = 1 << 20
a = array("d", (i * (rank + 1) for i in range(n)))
b = array("d", bytes(8 * n))
if rank == 0:
    comm.Send(a, dest=1, tag=3)
    comm.Recv(b, source=1, tag=3)
else:
    comm.Recv(b, source=0, tag=3)
    comm.Send(a, dest=0, tag=3)
assert b == array("d", (i * (peer + 1) for i in range(n)))
assert comm.allreduce(rank + 1) == size * (size + 1) // 2
req = comm.irecv(source=MPI.ANY_SOURCE, tag=9)
comm.isend(rank, dest=peer, tag=9).wait()
assert req.wait() == peer
if rank == 0:
    print("ok mpi4py", flush=True)
