/* Two processes: isend/irecv of every size class completed by wait_any, truncation of a
 * non-blocking receive, cancellation of receives and of a rendezvous send, waits that time
 * out, request-completion events, and a wait on the endpoint's fd. */
#include "common.h"

#include <poll.h>

#define N 4
static const size_t SIZES[N] = {8, 1000, 200000, 2 << 20};

static void child(pair_t *p) {
    /* 1: four messages in flight at once, tags 4..1, zero-copy from these buffers. */
    uint8_t *bufs[N];
    clink_request_t *reqs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(SIZES[i]);
        CHECK(bufs[i] != NULL);
        fill(bufs[i], SIZES[i], 10 + i);
    }
    for (int i = N - 1; i >= 0; i--)
        OK(clink_isend(p->ep, p->peer, (uint64_t)i + 1, bufs[i], SIZES[i], &reqs[i]));
    for (int done = 0; done < N; done++) {
        size_t idx = 99;
        clink_status_t st;
        OK(clink_wait_any(p->ep, reqs, N, 30000, &idx, &st));
        CHECK(idx < N && st.tag == idx + 1 && st.len == SIZES[idx] && st.peer == p->peer);
        clink_request_free(reqs[idx]);
        reqs[idx] = NULL;
    }
    for (int i = 0; i < N; i++) free(bufs[i]);

    /* 2: 64 bytes for a 16-byte receive. */
    uint8_t msg[64];
    fill(msg, sizeof msg, 5);
    OK(clink_send(p->ep, p->peer, 5, msg, sizeof msg));

    /* 3: for the request event. */
    OK(clink_send(p->ep, p->peer, 6, "event", 5));

    /* 4: a rendezvous send nobody receives, withdrawn (the parent makes progress in its
     * receive of tag 9 meanwhile). */
    size_t big = 4 << 20;
    uint8_t *b = malloc(big);
    CHECK(b != NULL);
    fill(b, big, 8);
    clink_request_t *r = NULL;
    OK(clink_isend(p->ep, p->peer, 8, b, big, &r));
    clink_status_t st;
    CHECK_RC(clink_test(p->ep, r, &st), CLINK_AGAIN);
    int withdrawn = -1;
    OK(clink_cancel(p->ep, r, &withdrawn));
    CHECK(withdrawn == 1);
    CHECK_RC(clink_wait(p->ep, r, 0, &st), CLINK_ERR_CANCELLED);
    clink_request_free(r);
    free(b);
    OK(clink_send(p->ep, p->peer, 9, "after cancel", 12));

    /* 5: the fd wait: answer the parent's go. */
    sync_recv(p, 11);
    OK(clink_send(p->ep, p->peer, 10, "woke", 4));
    sync_recv(p, 12);
    pair_close(p);
}

static void parent(pair_t *p) {
    clink_status_t st;
    /* 1: receives posted for tags 1..4, completed in any order. */
    uint8_t *bufs[N];
    clink_request_t *reqs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(SIZES[i]);
        CHECK(bufs[i] != NULL);
        OK(clink_irecv(p->ep, clink_selector_exact(p->peer, (uint64_t)i + 1), bufs[i], SIZES[i],
                       &reqs[i]));
    }
    int seen[N] = {0};
    for (int done = 0; done < N; done++) {
        size_t idx = 99;
        OK(clink_wait_any(p->ep, reqs, N, 30000, &idx, &st));
        CHECK(idx < N && !seen[idx]);
        seen[idx] = 1;
        CHECK(st.tag == idx + 1 && st.len == SIZES[idx] && st.peer == p->peer);
        CHECK(check_pat(bufs[idx], SIZES[idx], 10 + (unsigned)idx));
        OK(clink_test(p->ep, reqs[idx], &st)); /* the result stays */
        clink_request_free(reqs[idx]);
        reqs[idx] = NULL;
    }
    for (int i = 0; i < N; i++) free(bufs[i]);

    /* 2: a truncated non-blocking receive: first bytes in the buffer, full length. */
    uint8_t small[16];
    clink_request_t *r = NULL;
    OK(clink_irecv(p->ep, clink_selector_exact(p->peer, 5), small, sizeof small, &r));
    CHECK_RC(clink_wait(p->ep, r, 30000, &st), CLINK_ERR_TRUNCATED);
    CHECK(st.len == 64 && st.tag == 5 && st.peer == p->peer);
    CHECK(check_pat(small, sizeof small, 5));
    clink_request_free(r);

    /* 3: the completion of a receive as an event carrying the request's number. */
    OK(clink_set_interest(p->ep, CLINK_EVENTS_REQUESTS));
    char ebuf[8];
    OK(clink_irecv(p->ep, clink_selector_exact(p->peer, 6), ebuf, sizeof ebuf, &r));
    clink_event_t ev;
    do {
        OK(clink_wait_event(p->ep, 30000, &ev));
    } while (ev.kind != CLINK_EVENT_RECV_DONE);
    CHECK(ev.req == clink_request_id(r) && ev.ok == 1);
    OK(clink_test(p->ep, r, &st));
    CHECK(st.len == 5 && memcmp(ebuf, "event", 5) == 0);
    clink_request_free(r);
    OK(clink_set_interest(p->ep, 0));

    /* 4: a posted receive that nothing matches, withdrawn. */
    char never[4];
    OK(clink_irecv(p->ep, clink_selector_exact(p->peer, 77), never, sizeof never, &r));
    CHECK_RC(clink_wait(p->ep, r, 10, &st), CLINK_ERR_TIMEOUT);
    int withdrawn = -1;
    OK(clink_cancel(p->ep, r, &withdrawn));
    CHECK(withdrawn == 1);
    CHECK_RC(clink_test(p->ep, r, &st), CLINK_ERR_CANCELLED);
    clink_request_free(r);

    /* The child's cancelled send never arrives; its next message does. */
    char after[16];
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 9), after, sizeof after, 30000, &st));
    CHECK(st.len == 12 && memcmp(after, "after cancel", 12) == 0);
    CHECK_RC(clink_probe(p->ep, clink_selector_exact(p->peer, 8), &st), CLINK_AGAIN);

    /* 5: sleep on the endpoint's fd until the child's message is there. */
    int fd = clink_endpoint_fd(p->ep);
    CHECK(fd >= 0);
    sync_send(p, 11);
    double end = now_s() + 30;
    while (clink_probe(p->ep, clink_selector_exact(p->peer, 10), &st) == CLINK_AGAIN) {
        CHECK(now_s() < end);
        int safe = clink_prepare_wait(p->ep);
        CHECK(safe == 0 || safe == 1);
        if (safe) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            CHECK(poll(&pfd, 1, 30000) >= 0);
            OK(clink_finish_wait(p->ep));
        }
    }
    CHECK(st.len == 4);
    char woke[4];
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 10), woke, sizeof woke, 0, &st));
    CHECK(memcmp(woke, "woke", 4) == 0);
    sync_send(p, 12);
    pair_close(p);
}

int main(void) {
    pair_t p;
    pair_open(&p);
    if (p.is_child)
        child(&p);
    else
        parent(&p);
    printf("test_nonblocking: ok\n");
    return 0;
}
