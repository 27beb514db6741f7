/* Two processes on one host bounce an 8-byte message; prints the mean one-way latency (as
 * the Rust example `clink/examples/pingpong.rs` does) and the median round trip.
 *
 *   pingpong [ITERS]            forks: the child connects to the parent
 *   pingpong server [ITERS]     prints its address, waits for a client
 *   pingpong client ADDRESS     connects to a server
 */
#define _GNU_SOURCE
#include <clink.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TRY(expr)                                                                     \
    do {                                                                              \
        int rc_ = (expr);                                                             \
        if (rc_ != CLINK_OK) {                                                        \
            fprintf(stderr, "%s: %s (%s)\n", #expr, clink_strerror(rc_), clink_last_error()); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

enum { TAG_PING = 1, TAG_PONG = 2, TAG_ITERS = 3 };

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One round trip of ping number i; exits on a wrong answer. */
static void round_trip(clink_endpoint_t *ep, clink_peer_t peer, clink_selector_t sel, uint64_t i) {
    uint64_t msg = i, back = 0;
    clink_status_t st;
    TRY(clink_send(ep, peer, TAG_PING, &msg, sizeof msg));
    TRY(clink_recv(ep, sel, &back, sizeof back, CLINK_FOREVER, &st));
    if (st.len != 8 || back != i + 1) {
        fprintf(stderr, "bad pong: len %llu value %llu\n", (unsigned long long)st.len,
                (unsigned long long)back);
        exit(1);
    }
}

/* The measuring side: sends the iteration count, then pings: a warm-up, `iters` round
 * trips timed as a whole (the mean, as the Rust example reports it), then `iters` timed
 * one by one (median and p99; the clock reads add to each). */
static void ping(clink_endpoint_t *ep, clink_peer_t peer, uint32_t iters) {
    TRY(clink_send(ep, peer, TAG_ITERS, &iters, sizeof iters));
    uint32_t warm = iters / 10 + 10;
    double *rtt = malloc(sizeof(double) * iters);
    if (!rtt) exit(1);
    clink_selector_t sel = clink_selector_exact(peer, TAG_PONG);
    uint64_t i = 0;
    for (; i < warm; i++) round_trip(ep, peer, sel, i);
    double t0 = now_us();
    for (uint32_t k = 0; k < iters; k++, i++) round_trip(ep, peer, sel, i);
    double mean = (now_us() - t0) / iters;
    for (uint32_t k = 0; k < iters; k++, i++) {
        double t1 = now_us();
        round_trip(ep, peer, sel, i);
        rtt[k] = now_us() - t1;
    }
    qsort(rtt, iters, sizeof(double), cmp);
    printf("clink C ping-pong, 8 B, %u round trips: %.3f us one-way (mean); "
           "median round trip %.2f us, p99 %.2f us\n",
           iters, mean / 2, rtt[iters / 2], rtt[(size_t)(iters * 0.99)]);
    free(rtt);
}

/* The echoing side. */
static void pong(clink_endpoint_t *ep, clink_peer_t peer) {
    uint32_t iters = 0;
    clink_status_t st;
    TRY(clink_recv(ep, clink_selector_exact(peer, TAG_ITERS), &iters, sizeof iters, 30000, &st));
    uint32_t total = iters / 10 + 10 + 2 * iters;
    clink_selector_t sel = clink_selector_exact(peer, TAG_PING);
    for (uint32_t i = 0; i < total; i++) {
        uint64_t v = 0;
        TRY(clink_recv(ep, sel, &v, sizeof v, CLINK_FOREVER, &st));
        v += 1;
        TRY(clink_send(ep, peer, TAG_PONG, &v, sizeof v));
    }
}

/* Each side's endpoint is used by its main thread only: binding it there
 * (clink_endpoint_bind_thread) makes every call claim it with a plain load and store
 * instead of an atomic read-modify-write. */
int main(int argc, char **argv) {
    clink_context_t *ctx;
    clink_endpoint_t *ep;
    clink_peer_t peer;
    if (argc >= 3 && strcmp(argv[1], "client") == 0) {
        TRY(clink_context_create(&ctx));
        TRY(clink_endpoint_create(ctx, &ep));
        TRY(clink_endpoint_bind_thread(ep));
        TRY(clink_connect(ep, argv[2], &peer));
        pong(ep, peer);
    } else if (argc >= 2 && strcmp(argv[1], "server") == 0) {
        uint32_t iters = argc >= 3 ? (uint32_t)atoi(argv[2]) : 100000;
        TRY(clink_context_create(&ctx));
        TRY(clink_endpoint_create(ctx, &ep));
        TRY(clink_endpoint_bind_thread(ep));
        printf("%s\n", clink_endpoint_address(ep));
        fflush(stdout);
        TRY(clink_accept(ep, CLINK_FOREVER, &peer));
        ping(ep, peer, iters);
    } else {
        uint32_t iters = argc >= 2 ? (uint32_t)atoi(argv[1]) : 100000;
        if (iters == 0) iters = 1;
        int fds[2];
        if (pipe(fds) != 0) return 1;
        pid_t pid = fork();
        if (pid < 0) return 1;
        /* Each process makes its own context after the fork. */
        TRY(clink_context_create(&ctx));
        TRY(clink_endpoint_create(ctx, &ep));
        TRY(clink_endpoint_bind_thread(ep));
        if (pid == 0) {
            close(fds[1]);
            char addr[1024] = {0};
            size_t n = 0;
            ssize_t r;
            while (n < sizeof addr - 1 && (r = read(fds[0], addr + n, sizeof addr - 1 - n)) > 0)
                n += (size_t)r;
            TRY(clink_connect(ep, addr, &peer));
            pong(ep, peer);
            TRY(clink_endpoint_free(ep));
            clink_context_free(ctx);
            return 0;
        }
        close(fds[0]);
        const char *a = clink_endpoint_address(ep);
        if (write(fds[1], a, strlen(a)) != (ssize_t)strlen(a)) return 1;
        close(fds[1]);
        TRY(clink_accept(ep, 30000, &peer));
        ping(ep, peer, iters);
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
    }
    TRY(clink_endpoint_free(ep));
    clink_context_free(ctx);
    return 0;
}
