/* An epoll loop over the endpoint's fd: the parent sleeps in epoll_wait until clink says
 * a message may be there, receives everything pending without blocking, and sleeps again.
 * The child sends COUNT numbered messages in bursts, pausing between bursts so that the
 * parent really sleeps. */
#include "common_example.h"

#include <stdint.h>
#include <sys/epoll.h>

#define COUNT 200
#define BURST 20

int main(void) {
    clink_context_t *ctx;
    clink_endpoint_t *ep;
    clink_peer_t peer;
    pid_t pid = fork_pair(&ctx, &ep, &peer);
    if (pid == 0) {
        for (uint32_t i = 0; i < COUNT; i++) {
            TRY(clink_send(ep, peer, 7, &i, sizeof i));
            if (i % BURST == BURST - 1) usleep(2000); /* pacing only */
        }
        /* Wait for the parent's acknowledgement before going away. */
        clink_status_t st;
        TRY(clink_recv(ep, clink_selector_exact(peer, 8), NULL, 0, 30000, &st));
    } else {
        int efd = epoll_create1(EPOLL_CLOEXEC);
        int fd = clink_endpoint_fd(ep);
        if (efd < 0 || fd < 0) return 1;
        struct epoll_event want = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(efd, EPOLL_CTL_ADD, fd, &want) != 0) return 1;
        uint32_t next = 0;
        unsigned wakeups = 0;
        while (next < COUNT) {
            /* Drain: a receive with timeout 0 takes what is there. */
            uint32_t v;
            clink_status_t st;
            int rc;
            while ((rc = clink_recv(ep, clink_selector_exact(peer, 7), &v, sizeof v, 0, &st)) ==
                   CLINK_OK) {
                if (v != next) {
                    fprintf(stderr, "got %u, expected %u\n", v, next);
                    return 1;
                }
                next++;
            }
            if (rc != CLINK_ERR_TIMEOUT) TRY(rc);
            if (next == COUNT) break;
            /* Nothing pending: arm the doorbells, and sleep only if nothing came meanwhile. */
            rc = clink_prepare_wait(ep);
            if (rc < 0) TRY(rc);
            if (rc == 1) {
                struct epoll_event got;
                int n = epoll_wait(efd, &got, 1, 30000);
                TRY(clink_finish_wait(ep));
                if (n < 0) return 1;
                if (n == 0) {
                    fprintf(stderr, "no message for 30 s\n");
                    return 1;
                }
                wakeups++;
            }
        }
        TRY(clink_send(ep, peer, 8, NULL, 0));
        printf("epoll: %u messages received in order, %u epoll wake-ups\n", next, wakeups);
        close(efd);
        reap(pid);
    }
    TRY(clink_endpoint_free(ep));
    clink_context_free(ctx);
    return 0;
}
