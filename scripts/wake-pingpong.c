// The floor of a blocking ping-pong on this machine: two processes pinned to CPUs 0 and 1
// wake each other through a pair of eventfds, a pair of futexes in shared memory, or a
// Unix stream socket pair (8 bytes each way). Prints the one-way latency (round trip / 2),
// the median of 5 batches of N round trips.
//
//   cc -O2 -o wake-pingpong scripts/wake-pingpong.c
//   ./wake-pingpong unix|eventfd|futex [N]
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}
static void fwait(uint32_t *w, uint32_t v) {
    while (__atomic_load_n(w, __ATOMIC_ACQUIRE) == v)
        syscall(SYS_futex, w, FUTEX_WAIT, v, NULL, NULL, 0);
}
static void fwake(uint32_t *w) {
    __atomic_add_fetch(w, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0);
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "unix";
    long n = argc > 2 ? atol(argv[2]) : 20000;
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    int e[2] = {eventfd(0, 0), eventfd(0, 0)};
    uint32_t *f = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    f[0] = f[16] = 0;
    long total = 5 * n;
    pid_t p = fork();
    char b[8] = {0};
    uint64_t one = 1, got;
    if (p == 0) {
        pin(1);
        for (long i = 0; i < total; i++) {
            if (!strcmp(mode, "unix")) {
                if (read(sv[1], b, 8) != 8 || write(sv[1], b, 8) != 8) return 1;
            } else if (!strcmp(mode, "eventfd")) {
                if (read(e[0], &got, 8) != 8 || write(e[1], &one, 8) != 8) return 1;
            } else {
                fwait(&f[0], (uint32_t)i);
                fwake(&f[16]);
            }
        }
        return 0;
    }
    pin(0);
    double r[5];
    for (int k = 0; k < 5; k++) {
        double t = now();
        for (long i = k * n; i < (k + 1) * n; i++) {
            if (!strcmp(mode, "unix")) {
                if (write(sv[0], b, 8) != 8 || read(sv[0], b, 8) != 8) return 1;
            } else if (!strcmp(mode, "eventfd")) {
                if (write(e[0], &one, 8) != 8 || read(e[1], &got, 8) != 8) return 1;
            } else {
                fwake(&f[0]);
                fwait(&f[16], (uint32_t)i);
            }
        }
        r[k] = (now() - t) / n / 2 * 1e6;
    }
    waitpid(p, NULL, 0);
    qsort(r, 5, sizeof r[0], cmp);
    printf("%s %.2f us one-way (median of 5 x %ld)\n", mode, r[2], n);
    return 0;
}
