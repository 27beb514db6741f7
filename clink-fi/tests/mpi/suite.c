/* MPI programs run on the clink provider (clink-fi/tests/provider.rs): every check aborts
 * the job with a message on failure; rank 0 prints "ok <name>" after each part passes.
 * Usage: suite [max_bytes [parts]]   (Send/Recv sizes up to max_bytes, default 64 MiB;
 * parts a comma-separated list, default all) */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

#define CHECK(c, ...)                                                   \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
            MPI_Abort(MPI_COMM_WORLD, 1);                               \
        }                                                               \
    } while (0)

static void ok(const char *what) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("ok %s\n", what);
        fflush(stdout);
    }
}

static unsigned char pattern(size_t i, int from, int salt) {
    return (unsigned char)(i * 131 + from * 17 + salt * 7 + (i >> 12));
}

static void fill(unsigned char *b, size_t n, int from, int salt) {
    for (size_t i = 0; i < n; i++) b[i] = pattern(i, from, salt);
}

static void verify(const unsigned char *b, size_t n, int from, int salt) {
    for (size_t i = 0; i < n; i++)
        CHECK(b[i] == pattern(i, from, salt), "byte %zu of %zu from %d wrong", i, n, from);
}

/* Send/Recv of every power of two (and neighbours) up to max between rank pairs. */
static void sizes(size_t max) {
    unsigned char *s = malloc(max + 1), *r = malloc(max + 1);
    CHECK(s && r, "out of memory");
    int peer = rank ^ 1;
    if (peer < size) {
        for (size_t n = 0; n <= max; n = n < 2 ? n + 1 : n * 2) {
            size_t ns[3] = {n, n + 1 <= max ? n + 1 : n, n > 2 ? n - 1 : n};
            for (int k = 0; k < 3; k++) {
                size_t m = ns[k];
                fill(s, m, rank, (int)k);
                MPI_Status st;
                if (rank < peer) {
                    MPI_Send(s, (int)m, MPI_BYTE, peer, 5, MPI_COMM_WORLD);
                    MPI_Recv(r, (int)m, MPI_BYTE, peer, 5, MPI_COMM_WORLD, &st);
                } else {
                    MPI_Recv(r, (int)m, MPI_BYTE, peer, 5, MPI_COMM_WORLD, &st);
                    MPI_Send(s, (int)m, MPI_BYTE, peer, 5, MPI_COMM_WORLD);
                }
                int got;
                MPI_Get_count(&st, MPI_BYTE, &got);
                CHECK((size_t)got == m && st.MPI_SOURCE == peer && st.MPI_TAG == 5,
                      "status of %zu bytes: count %d source %d tag %d", m, got, st.MPI_SOURCE,
                      st.MPI_TAG);
                verify(r, m, peer, (int)k);
            }
        }
    }
    free(s);
    free(r);
    ok("send_recv_sizes");
}

/* Many non-blocking sends and receives at once, mixed tags and sizes, any order. */
static void storm(void) {
    enum { N = 200 };
    MPI_Request req[2 * N * 8];
    int nreq = 0;
    unsigned char *bufs[8][N], *sbufs[8][N];
    size_t len[N];
    for (int i = 0; i < N; i++) len[i] = (size_t)((i * 7919) % 70000);
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        for (int i = 0; i < N; i++) {
            bufs[p][i] = malloc(len[i] + 1);
            MPI_Irecv(bufs[p][i], (int)len[i], MPI_BYTE, p, i % 13, MPI_COMM_WORLD, &req[nreq++]);
        }
    }
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        for (int i = 0; i < N; i++) {
            sbufs[p][i] = malloc(len[i] + 1);
            fill(sbufs[p][i], len[i], rank, i);
            MPI_Isend(sbufs[p][i], (int)len[i], MPI_BYTE, p, i % 13, MPI_COMM_WORLD, &req[nreq++]);
        }
    }
    MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
    for (int p = 0; p < size; p++) {
        if (p == rank) continue;
        for (int i = 0; i < N; i++) {
            verify(bufs[p][i], len[i], p, i);
            free(bufs[p][i]);
            free(sbufs[p][i]);
        }
    }
    ok("isend_irecv_storm");
}

/* Synchronous sends (their acknowledgement is a zero-length message without a buffer). */
static void ssend(void) {
    int peer = rank ^ 1;
    if (peer < size) {
        for (int n = 0; n <= 1 << 20; n = n ? n * 32 : 1) {
            unsigned char *b = malloc(n + 1);
            fill(b, n, rank, 3);
            if (rank < peer) {
                MPI_Ssend(b, n, MPI_BYTE, peer, 9, MPI_COMM_WORLD);
                MPI_Recv(b, n, MPI_BYTE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(b, n, MPI_BYTE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                verify(b, n, peer, 3);
                fill(b, n, rank, 3);
                MPI_Ssend(b, n, MPI_BYTE, peer, 9, MPI_COMM_WORLD);
            }
            if (rank < peer) verify(b, n, peer, 3);
            free(b);
        }
    }
    ok("ssend");
}

/* Probe, Iprobe, Mprobe/Mrecv, Improbe, any-source and any-tag receives. */
static void probes(void) {
    if (rank != 0) {
        unsigned char b[3000];
        for (int k = 0; k < 4; k++) {
            int n = 1000 + rank * 100 + k;
            fill(b, n, rank, k);
            MPI_Send(b, n, MPI_BYTE, 0, 20 + k, MPI_COMM_WORLD);
        }
    } else {
        for (int got = 0; got < (size - 1) * 4; got++) {
            MPI_Status st;
            int n, k = got % 4;
            unsigned char b[3000];
            if (k == 0) {
                MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
                MPI_Get_count(&st, MPI_BYTE, &n);
                MPI_Recv(b, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st);
            } else if (k == 1) {
                int flag = 0;
                while (!flag) MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
                MPI_Get_count(&st, MPI_BYTE, &n);
                MPI_Recv(b, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st);
            } else if (k == 2) {
                MPI_Message m;
                MPI_Mprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &m, &st);
                MPI_Get_count(&st, MPI_BYTE, &n);
                MPI_Mrecv(b, n, MPI_BYTE, &m, &st);
            } else {
                MPI_Message m;
                int flag = 0;
                while (!flag) MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &m, &st);
                MPI_Get_count(&st, MPI_BYTE, &n);
                MPI_Request r;
                MPI_Imrecv(b, n, MPI_BYTE, &m, &r);
                MPI_Wait(&r, &st);
            }
            int from = st.MPI_SOURCE, tag = st.MPI_TAG;
            CHECK(tag >= 20 && tag < 24 && n == 1000 + from * 100 + (tag - 20),
                  "probe said %d bytes, tag %d, from %d", n, tag, from);
            verify(b, n, from, tag - 20);
        }
    }
    ok("probe_iprobe_mprobe_improbe");
}

/* Messages to oneself: small and large, in order, received by source and by any source. */
static void self_messages(void) {
    size_t sizes[3] = {8, 70000, 3 << 20};
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        unsigned char *s = malloc(n), *r = malloc(n);
        MPI_Request q[2];
        fill(s, n, rank, 40 + k);
        MPI_Irecv(r, (int)n, MPI_BYTE, k == 1 ? MPI_ANY_SOURCE : rank, 40, MPI_COMM_WORLD, &q[0]);
        MPI_Isend(s, (int)n, MPI_BYTE, rank, 40, MPI_COMM_WORLD, &q[1]);
        MPI_Status st[2];
        MPI_Waitall(2, q, st);
        CHECK(st[0].MPI_SOURCE == rank, "a message to myself came from %d", st[0].MPI_SOURCE);
        verify(r, n, rank, 40 + k);
        free(s);
        free(r);
    }
    int a = rank, b = -1;
    MPI_Sendrecv(&a, 1, MPI_INT, rank, 41, &b, 1, MPI_INT, rank, 41, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CHECK(b == rank, "sendrecv with myself gave %d", b);
    ok("self");
}

/* A receive nobody sends to, cancelled. */
static void cancel(void) {
    char b[16];
    MPI_Request r;
    MPI_Status st;
    MPI_Irecv(b, sizeof b, MPI_BYTE, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &r);
    MPI_Cancel(&r);
    MPI_Wait(&r, &st);
    int c;
    MPI_Test_cancelled(&st, &c);
    CHECK(c, "the receive was not cancelled");
    ok("cancel");
}

/* A message longer than the receive buffer is an error, not an overrun. */
static void truncation(void) {
    int peer = rank ^ 1;
    if (peer < size) {
        char big[64] = {0}, small[8];
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (rank < peer) {
            MPI_Send(big, sizeof big, MPI_BYTE, peer, 30, MPI_COMM_WORLD);
        } else {
            MPI_Status st;
            int e = MPI_Recv(small, sizeof small, MPI_BYTE, peer, 30, MPI_COMM_WORLD, &st);
            int cls;
            MPI_Error_class(e, &cls);
            CHECK(cls == MPI_ERR_TRUNCATE, "a 64-byte message into 8 bytes gave class %d", cls);
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    }
    ok("truncation");
}

static void collectives(void) {
    long v = rank + 1, sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum == (long)size * (size + 1) / 2, "allreduce gave %ld", sum);
    enum { K = 4096 };
    int *s = malloc(sizeof(int) * K * size), *r = malloc(sizeof(int) * K * size);
    for (int p = 0; p < size; p++)
        for (int i = 0; i < K; i++) s[p * K + i] = rank * 1000000 + p * 10000 + i;
    MPI_Alltoall(s, K, MPI_INT, r, K, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < size; p++)
        for (int i = 0; i < K; i++)
            CHECK(r[p * K + i] == p * 1000000 + rank * 10000 + i, "alltoall element wrong");
    size_t n = 3 << 20;
    unsigned char *b = malloc(n);
    if (rank == 0) fill(b, n, 0, 11);
    MPI_Bcast(b, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    verify(b, n, 0, 11);
    double big[1 << 16], out[1 << 16];
    for (int i = 0; i < 1 << 16; i++) big[i] = rank + i;
    MPI_Allreduce(big, out, 1 << 16, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < 1 << 16; i++)
        CHECK(out[i] == (double)size * i + (double)size * (size - 1) / 2, "allreduce of doubles");
    free(s);
    free(r);
    free(b);
    ok("allreduce_alltoall_bcast");
}

/* MPI_THREAD_MULTIPLE: two threads per rank exchange with the neighbour concurrently. */
struct targ {
    int t;
};
static void *worker(void *p) {
    int t = ((struct targ *)p)->t;
    int peer = rank ^ 1;
    unsigned char s[5000], r[5000];
    for (int i = 0; i < 200; i++) {
        int n = (i * 37 + t * 11) % 5000;
        fill(s, n, rank, t * 1000 + i);
        MPI_Sendrecv(s, n, MPI_BYTE, peer, 100 + t, r, n, MPI_BYTE, peer, 100 + t, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        verify(r, n, peer, t * 1000 + i);
    }
    return NULL;
}
static void threads(int provided) {
    if (provided < MPI_THREAD_MULTIPLE) {
        if (rank == 0) printf("skipped threads (provided %d)\n", provided);
        return;
    }
    if ((rank ^ 1) < size) {
        pthread_t th[2];
        struct targ a[2] = {{0}, {1}};
        for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, &a[t]);
        for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    }
    ok("thread_multiple");
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(size <= 8, "at most 8 ranks");
    size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
    /* Parts to run: the second argument names them (comma-separated), default all. */
    const char *parts = argc > 2 ? argv[2] : "sizes,storm,ssend,probes,self,cancel,truncation,collectives,threads";
#define PART(name) (strstr(parts, name) != NULL)
    if (PART("sizes")) sizes(max);
    if (PART("storm")) storm();
    if (PART("ssend")) ssend();
    if (PART("probes")) probes();
    if (PART("self")) self_messages();
    if (PART("cancel")) cancel();
    if (PART("truncation")) truncation();
    if (PART("collectives")) collectives();
    if (PART("threads")) threads(provided);
    ok("all");
    MPI_Finalize();
    return 0;
}
