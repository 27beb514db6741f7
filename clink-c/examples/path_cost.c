/* CPU cost of one hop through the C API, without the cross-core transfer: two endpoints
 * of one process connected over shared memory, driven alternately by one thread, each
 * hop an 8-byte clink_send on one and the clink_recv that takes it on the other (as
 * `clink/examples/path_cost.rs` measures the Rust API's hop: the difference is the C
 * layer's own cost).
 *
 *   path_cost [HOPS]     three rounds of HOPS hops (default 1000000)
 */
#include "common_example.h"

#include <pthread.h>
#include <stdint.h>
#include <time.h>

struct joiner {
    clink_endpoint_t *ep;
    const char *address;
    clink_peer_t peer;
};

/* `clink_connect` waits for the handshake, which `clink_accept` on the main thread
 * answers. */
static void *connect_thread(void *arg) {
    struct joiner *j = arg;
    TRY(clink_connect(j->ep, j->address, &j->peer));
    return NULL;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    long hops = argc >= 2 ? atol(argv[1]) : 1000000;
    if (hops < 1) hops = 1;
    clink_context_t *ctx_a, *ctx_b;
    clink_endpoint_t *a, *b;
    TRY(clink_context_create(&ctx_a));
    TRY(clink_context_create(&ctx_b));
    TRY(clink_endpoint_create(ctx_a, &a));
    TRY(clink_endpoint_create(ctx_b, &b));
    struct joiner j = {b, clink_endpoint_address(a), 0};
    pthread_t t;
    if (pthread_create(&t, NULL, connect_thread, &j) != 0) return 1;
    clink_peer_t pa;
    TRY(clink_accept(a, 10000, &pa));
    if (pthread_join(t, NULL) != 0) return 1;
    /* Both used by this thread from here on (the shortest claim, as in the ping-pong). */
    TRY(clink_endpoint_bind_thread(a));
    TRY(clink_endpoint_bind_thread(b));
    clink_selector_t sel = clink_selector_exact(j.peer, 5);
    for (int round = 0; round < 3; round++) {
        uint64_t v = 0, got = 0;
        clink_status_t st;
        double t0 = now_ns();
        for (long i = 0; i < hops; i++) {
            v = (uint64_t)i;
            TRY(clink_send(a, pa, 5, &v, sizeof v));
            TRY(clink_recv(b, sel, &got, sizeof got, CLINK_FOREVER, &st));
            if (got != v || st.len != sizeof v) {
                fprintf(stderr, "path_cost: hop %ld delivered %llu\n", i, (unsigned long long)got);
                return 1;
            }
        }
        printf("path_cost round %d: ns per hop: tagged 8 B through the C API %.1f\n", round,
               (now_ns() - t0) / (double)hops);
    }
    TRY(clink_endpoint_free(a));
    TRY(clink_endpoint_free(b));
    clink_context_free(ctx_a);
    clink_context_free(ctx_b);
    return 0;
}
