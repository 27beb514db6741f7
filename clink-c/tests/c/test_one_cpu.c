/* Two processes on one CPU ping-pong, each waiting with clink_wait_any on its receive and on
 * a rendezvous send nobody receives (a wait over requests of two kinds). With the peer on the
 * same CPU a spin cannot see its answer (the scheduler keeps the spinner running), so such
 * waits must stop spinning, as the endpoint's own do: its spin gate closes, and most waits
 * sleep at once instead of spinning out on every hop. */
#include "common.h"

#include <sched.h>

#define HOPS 1000

/* Pins the calling process to the first CPU it may run on. */
static void pin_to_one_cpu(void) {
    cpu_set_t allowed, one;
    CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &allowed)) {
            CPU_SET(c, &one);
            break;
        }
    }
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
}

/* Waits for the message of `tag` with clink_wait_any over its receive and `pending`. */
static void wait_for(pair_t *p, uint64_t tag, clink_request_t *pending) {
    uint8_t got[8];
    clink_request_t *set[2] = {NULL, pending};
    OK(clink_irecv(p->ep, clink_selector_exact(p->peer, tag), got, sizeof got, &set[0]));
    size_t idx = 9;
    clink_status_t st;
    OK(clink_wait_any(p->ep, set, 2, 30000, &idx, &st));
    CHECK(idx == 0 && st.tag == tag && st.len == sizeof got);
    clink_request_free(set[0]);
}

static void run(pair_t *p) {
    size_t big = 4 << 20;
    uint8_t *b = malloc(big);
    CHECK(b != NULL);
    fill(b, big, 3);
    clink_request_t *pending = NULL;
    OK(clink_isend(p->ep, p->peer, 99, b, big, &pending));
    uint8_t msg[8] = {0};
    for (int i = 0; i < HOPS; i++) {
        if (p->is_child) {
            wait_for(p, 1, pending);
            OK(clink_send(p->ep, p->peer, 2, msg, sizeof msg));
        } else {
            OK(clink_send(p->ep, p->peer, 1, msg, sizeof msg));
            wait_for(p, 2, pending);
        }
    }
    int withdrawn = -1;
    OK(clink_cancel(p->ep, pending, &withdrawn));
    CHECK(withdrawn == 1);
    clink_request_free(pending);
    free(b);
    uint64_t failed = 0, closures = 0;
    OK(clink_endpoint_stat(p->ep, "spins_failed", &failed));
    OK(clink_endpoint_stat(p->ep, "spin_closures", &closures));
    printf("%s: %d waits, %llu spins failed, gate closed %llu times\n",
           p->is_child ? "child" : "parent", HOPS, (unsigned long long)failed,
           (unsigned long long)closures);
    CHECK(closures >= 1);
    CHECK(failed < HOPS / 2);
    /* Both have finished their waits before either closes. */
    if (p->is_child) {
        sync_send(p, 3);
        sync_recv(p, 4);
    } else {
        sync_recv(p, 3);
        sync_send(p, 4);
    }
}

int main(void) {
    pin_to_one_cpu();
    pair_t p;
    pair_open(&p);
    run(&p);
    pair_close(&p);
    printf("test_one_cpu: ok\n");
    return 0;
}
