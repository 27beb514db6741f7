/* One-sided access: the parent allocates an aperture, arms a tripwire on its doorbell
 * word and exports it; the child imports the cookie, maps the window (same host: plain
 * stores), writes a message into it, bumps a counter with a remote fetch-add and rings the
 * doorbell with clink_notify. The parent learns of each doorbell from its event queue and
 * reads the message in place. */
#include "common_example.h"

#include <stdint.h>

#define AP_LEN 65536
#define DOORBELL 0
#define COUNTER 64
#define DATA 4096
#define ROUNDS 10

int main(void) {
    clink_context_t *ctx;
    clink_endpoint_t *ep;
    clink_peer_t peer;
    pid_t pid = fork_pair(&ctx, &ep, &peer);
    clink_status_t st;
    if (pid == 0) {
        clink_cookie_t cookie;
        TRY(clink_recv(ep, clink_selector_exact(peer, 1), &cookie, sizeof cookie, 30000, &st));
        clink_remote_t *r;
        TRY(clink_import(ep, peer, &cookie, &r));
        clink_window_t *w;
        TRY(clink_map(ep, r, &w));
        for (uint64_t i = 0; i < ROUNDS; i++) {
            char msg[64];
            int n = snprintf(msg, sizeof msg, "message %llu written in place", (unsigned long long)i);
            TRY(clink_window_write(w, DATA, msg, (size_t)n + 1));
            uint64_t old;
            TRY(clink_fetch_add(ep, r, COUNTER, 1, &old));
            if (old != i) return 1;
            TRY(clink_window_store_u64(w, DOORBELL, i + 1));
            TRY(clink_notify(ep, r, DOORBELL, 8));
            /* The parent answers each round before the next overwrites the message. */
            TRY(clink_recv(ep, clink_selector_exact(peer, 2), NULL, 0, 30000, &st));
        }
        clink_window_free(w);
        clink_remote_free(r);
    } else {
        clink_aperture_t ap;
        TRY(clink_aperture_alloc(ep, AP_LEN, &ap));
        clink_tripwire_t trip;
        TRY(clink_tripwire(ep, ap, DOORBELL, 8, NULL, &trip));
        TRY(clink_set_interest(ep, CLINK_EVENTS_TRIPWIRES | CLINK_EVENTS_PEERS));
        clink_cookie_t cookie;
        TRY(clink_export(ep, ap, 0, AP_LEN, CLINK_READ | CLINK_WRITE, &cookie));
        TRY(clink_send(ep, peer, 1, &cookie, sizeof cookie));
        clink_window_t *own;
        TRY(clink_aperture_window(ep, ap, &own));
        const char *mem = clink_window_ptr(own);
        for (uint64_t i = 0; i < ROUNDS; i++) {
            clink_event_t ev;
            do TRY(clink_wait_event(ep, 30000, &ev));
            while (ev.kind != CLINK_EVENT_TRIPWIRE);
            uint64_t bell, count;
            TRY(clink_window_load_u64(own, DOORBELL, &bell));
            TRY(clink_window_load_u64(own, COUNTER, &count));
            char expect[64];
            snprintf(expect, sizeof expect, "message %llu written in place", (unsigned long long)i);
            if (ev.peer != peer || bell != i + 1 || count != i + 1 || strcmp(mem + DATA, expect) != 0) {
                fprintf(stderr, "round %llu: bell %llu count %llu text '%s'\n", (unsigned long long)i,
                        (unsigned long long)bell, (unsigned long long)count, mem + DATA);
                return 1;
            }
            if (i == ROUNDS - 1) printf("apertures: last doorbell %llu, counter %llu, '%s'\n",
                                        (unsigned long long)bell, (unsigned long long)count, mem + DATA);
            TRY(clink_send(ep, peer, 2, NULL, 0));
        }
        uint64_t fired;
        TRY(clink_tripwire_state(ep, trip, NULL, &fired));
        printf("apertures: tripwire fired %llu times, %d rounds checked\n", (unsigned long long)fired,
               ROUNDS);
        clink_window_free(own);
        reap(pid);
    }
    TRY(clink_endpoint_free(ep));
    clink_context_free(ctx);
    return 0;
}
