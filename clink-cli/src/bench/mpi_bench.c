/* OSU-style MPI measurements for `clink bench --mpi` (compiled by the bench with mpicc).
 * Usage: mpi_bench EXPERIMENT SIZE ITERATIONS     (2 ranks)
 * Prints one number on rank 0: one-way latency in microseconds (latency, allreduce),
 * MB/s (bw, bw_cold, bibw) or messages per second (rate).
 * bw and bibw send every message of a window from one buffer and receive them all into
 * one, as OSU's osu_bw and osu_bibw do; bw_cold gives each message of the window its own
 * part of a window-sized buffer (64 MiB for 1 MiB messages: copies from and to memory
 * that is not in cache). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WINDOW = 64 };

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 4 || size != 2) {
        if (rank == 0) fprintf(stderr, "usage: mpi_bench latency|bw|bw_cold|bibw|rate|allreduce SIZE ITERS (2 ranks)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *exp = argv[1];
    size_t n = strtoull(argv[2], NULL, 0);
    int iters = atoi(argv[3]), warm = iters / 10 + 1;
    int peer = 1 - rank;
    char *s = malloc(n * WINDOW + 1), *r = malloc(n * WINDOW + 1);
    memset(s, 1, n * WINDOW + 1);
    MPI_Request q[2 * WINDOW];
    double t0 = 0, result = 0;
    for (int i = 0; i < warm + iters; i++) {
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (!strcmp(exp, "latency")) {
            if (rank == 0) {
                MPI_Send(s, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(r, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(r, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(s, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            }
        } else if (!strcmp(exp, "bw") || !strcmp(exp, "bw_cold") || !strcmp(exp, "rate")) {
            /* A window of sends, then a zero-byte acknowledgement. */
            size_t step = strcmp(exp, "bw_cold") ? 0 : n;
            if (rank == 0) {
                for (int w = 0; w < WINDOW; w++)
                    MPI_Isend(s + w * step, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &q[w]);
                MPI_Waitall(WINDOW, q, MPI_STATUSES_IGNORE);
                MPI_Recv(r, 0, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                for (int w = 0; w < WINDOW; w++)
                    MPI_Irecv(r + w * step, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &q[w]);
                MPI_Waitall(WINDOW, q, MPI_STATUSES_IGNORE);
                MPI_Send(s, 0, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
            }
        } else if (!strcmp(exp, "bibw")) {
            for (int w = 0; w < WINDOW; w++)
                MPI_Irecv(r, (int)n, MPI_BYTE, peer, 4, MPI_COMM_WORLD, &q[w]);
            for (int w = 0; w < WINDOW; w++)
                MPI_Isend(s, (int)n, MPI_BYTE, peer, 4, MPI_COMM_WORLD, &q[WINDOW + w]);
            MPI_Waitall(2 * WINDOW, q, MPI_STATUSES_IGNORE);
        } else if (!strcmp(exp, "allreduce")) {
            size_t k = n / sizeof(double) ? n / sizeof(double) : 1;
            MPI_Allreduce(s, r, (int)k, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        } else {
            if (rank == 0) fprintf(stderr, "unknown experiment %s\n", exp);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    double t = MPI_Wtime() - t0;
    if (!strcmp(exp, "latency")) result = t / iters / 2 * 1e6;
    else if (!strcmp(exp, "allreduce")) result = t / iters * 1e6;
    else if (!strcmp(exp, "bw") || !strcmp(exp, "bw_cold")) result = (double)n * WINDOW * iters / t / 1e6;
    else if (!strcmp(exp, "bibw")) result = 2.0 * n * WINDOW * iters / t / 1e6;
    else result = (double)WINDOW * iters / t;
    if (rank == 0) printf("%.6f\n", result);
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
