/* A non-blocking stream between two processes: the child keeps WINDOW isends in flight
 * from its own buffers (zero-copy: each buffer is reused only once its send completed),
 * the parent keeps WINDOW irecvs posted and completes them with clink_wait_any, checking
 * every message's sequence number and contents. Prints the goodput. */
#include "common_example.h"

#include <stdint.h>
#include <time.h>

#define WINDOW 8
#define MSG (256 * 1024)
#define COUNT 256

static void stamp(uint8_t *b, uint32_t seq) {
    memcpy(b, &seq, sizeof seq);
    for (size_t i = sizeof seq; i < MSG; i += 4096) b[i] = (uint8_t)(seq * 31 + i / 4096);
}

static int valid(const uint8_t *b, uint32_t seq) {
    uint32_t got;
    memcpy(&got, b, sizeof got);
    if (got != seq) return 0;
    for (size_t i = sizeof seq; i < MSG; i += 4096)
        if (b[i] != (uint8_t)(seq * 31 + i / 4096)) return 0;
    return 1;
}

int main(void) {
    clink_context_t *ctx;
    clink_endpoint_t *ep;
    clink_peer_t peer;
    pid_t pid = fork_pair(&ctx, &ep, &peer);
    uint8_t *bufs = calloc(WINDOW, MSG); /* every byte sent is initialised */
    if (!bufs) return 1;
    clink_request_t *reqs[WINDOW] = {0};
    uint32_t seq_of[WINDOW];
    clink_status_t st;
    size_t idx;
    if (pid == 0) {
        uint32_t next = 0, done = 0;
        while (done < COUNT) {
            /* Fill every free slot, then wait for any send to complete. */
            for (int i = 0; i < WINDOW && next < COUNT; i++) {
                if (reqs[i]) continue;
                stamp(bufs + (size_t)i * MSG, next);
                seq_of[i] = next;
                TRY(clink_isend(ep, peer, 1, bufs + (size_t)i * MSG, MSG, &reqs[i]));
                next++;
            }
            TRY(clink_wait_any(ep, reqs, WINDOW, 30000, &idx, &st));
            if (st.len != MSG || st.tag != 1) return 1;
            clink_request_free(reqs[idx]);
            reqs[idx] = NULL;
            done++;
        }
        (void)seq_of;
    } else {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < WINDOW; i++)
            TRY(clink_irecv(ep, clink_selector_exact(peer, 1), bufs + (size_t)i * MSG, MSG, &reqs[i]));
        /* Messages from one peer with one tag match the posted receives in order. */
        uint32_t expect = 0, posted = WINDOW;
        for (int i = 0; i < WINDOW; i++) seq_of[i] = (uint32_t)i;
        while (expect < COUNT) {
            TRY(clink_wait_any(ep, reqs, WINDOW, 30000, &idx, &st));
            if (st.len != MSG || !valid(bufs + idx * MSG, seq_of[idx])) {
                fprintf(stderr, "message %u corrupt or out of order\n", seq_of[idx]);
                return 1;
            }
            expect++;
            clink_request_free(reqs[idx]);
            reqs[idx] = NULL;
            if (posted < COUNT) {
                seq_of[idx] = posted++;
                TRY(clink_irecv(ep, clink_selector_exact(peer, 1), bufs + idx * MSG, MSG, &reqs[idx]));
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        printf("stream_nb: %d messages of %d KiB checked, %.2f GB/s\n", COUNT, MSG / 1024,
               (double)COUNT * MSG / s / 1e9);
        reap(pid);
    }
    free(bufs);
    TRY(clink_endpoint_free(ep));
    clink_context_free(ctx);
    return 0;
}
