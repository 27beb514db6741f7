/* Two processes: blocking tagged messages of every size class with their contents,
 * selectors (peer, tag, mask), status, truncation, probe, batches, in-place receives,
 * claimed send slots, peer information, statistics, an endpoint bound to a thread, and a
 * peer that exits. */
#include "common.h"

#include <pthread.h>

static const size_t SIZES[] = {0, 1, 8, 4096, 65536, 1 << 20, (3 << 20) + 7};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define BIG (4 << 20)

/* Runs f(arg) on a thread of its own and returns what it returned. */
static intptr_t on_thread(void *(*f)(void *), void *arg) {
    pthread_t th;
    void *res = NULL;
    CHECK(pthread_create(&th, NULL, f, arg) == 0);
    CHECK(pthread_join(th, &res) == 0);
    return (intptr_t)res;
}

static void *progress_from_thread(void *ep) {
    return (void *)(intptr_t)clink_progress((clink_endpoint_t *)ep);
}

static void *bind_from_thread(void *ep) {
    return (void *)(intptr_t)clink_endpoint_bind_thread((clink_endpoint_t *)ep);
}

static void *release_from_thread(void *m) {
    clink_inplace_release((clink_inplace_t *)m);
    return NULL;
}

static void child(pair_t *p) {
    /* The child's whole conversation runs with its endpoint bound to this thread. */
    OK(clink_endpoint_bind_thread(p->ep));
    OK(clink_endpoint_bind_thread(p->ep)); /* again: nothing to do */
    uint8_t *buf = malloc(BIG);
    CHECK(buf != NULL);
    int connected = -1;
    OK(clink_peer_joined(p->ep, p->peer, &connected, NULL, NULL));
    CHECK(connected == 1);
    /* 1: every size class, tag 2, contents seeded by the size index. */
    for (size_t i = 0; i < NSIZES; i++) {
        fill(buf, SIZES[i], (unsigned)i);
        OK(clink_send(p->ep, p->peer, 2, buf, SIZES[i]));
    }
    /* 2: tags for the mask selector, in this order. */
    OK(clink_send(p->ep, p->peer, 0x100, "first", 5));
    OK(clink_send(p->ep, p->peer, 0x201, "second", 6));
    /* 3: 100 bytes into a 10-byte buffer. */
    fill(buf, 100, 4);
    OK(clink_send(p->ep, p->peer, 4, buf, 100));
    /* 4: for the probe. */
    fill(buf, 16, 5);
    OK(clink_send(p->ep, p->peer, 5, buf, 16));
    /* 5: a batch of three. */
    uint8_t a[10], b[3000], c[200000];
    fill(a, sizeof a, 61);
    fill(b, sizeof b, 62);
    fill(c, sizeof c, 63);
    clink_iov_t iov[3] = {{a, sizeof a}, {b, sizeof b}, {c, sizeof c}};
    OK(clink_send_batch(p->ep, p->peer, 6, iov, 3));
    /* 6: for the in-place receives (the second while the parent's endpoint is bound). */
    OK(clink_send(p->ep, p->peer, 7, "in place", 8));
    OK(clink_send(p->ep, p->peer, 7, "held", 4));
    /* 7: the parent's claimed message. */
    char got[64];
    clink_status_t st;
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 8), got, sizeof got, 30000, &st));
    CHECK(st.len == 32 && st.tag == 8 && st.peer == p->peer);
    CHECK(check_pat(got, 32, 8));
    clink_stats_t s;
    OK(clink_endpoint_stats(p->ep, &s));
    CHECK(s.eager_sends >= 10 && s.rendezvous_sends >= 2 && s.frames_received >= 1);
    CHECK(s.peers_connected == 1);
    uint64_t by_name = 0;
    OK(clink_endpoint_stat(p->ep, "eager_sends", &by_name));
    CHECK(by_name == s.eager_sends);
    /* 8: goodbye, then exit (the parent sees this peer go). */
    OK(clink_send(p->ep, p->peer, 9, "bye", 3));
    free(buf);
    pair_close(p);
}

static void parent(pair_t *p) {
    uint8_t *buf = malloc(BIG);
    CHECK(buf != NULL);
    clink_status_t st;

    const char *transport = NULL;
    uint64_t eager_max = 0;
    int cma = -1;
    OK(clink_peer_info(p->ep, p->peer, &transport, &eager_max, &cma));
    CHECK(strcmp(transport, "shm") == 0 && eager_max > 0 && (cma == 0 || cma == 1));
    /* The child connected; nobody else did. */
    int connected = -1, crossed = -1, superseded = -1;
    OK(clink_peer_joined(p->ep, p->peer, &connected, &crossed, &superseded));
    CHECK(connected == 0 && crossed == 0 && superseded == 0);
    uint32_t n = 0;
    OK(clink_peer_count(p->ep, &n));
    CHECK(n == 1 && p->peer == 0);

    for (size_t i = 0; i < NSIZES; i++) {
        memset(buf, 0xee, SIZES[i] + 1);
        OK(clink_recv(p->ep, clink_selector_exact(p->peer, 2), buf, BIG, 30000, &st));
        CHECK(st.peer == p->peer && st.tag == 2 && st.len == SIZES[i]);
        CHECK(check_pat(buf, SIZES[i], (unsigned)i));
        CHECK(buf[SIZES[i]] == 0xee); /* nothing written past the message */
    }

    /* Mask: bits 0xf00 must be 0x200: the second message, though the first came first. */
    clink_selector_t masked = {.peer = CLINK_PEER_ANY, .tag = 0x200, .mask = 0xf00};
    OK(clink_recv(p->ep, masked, buf, BIG, 30000, &st));
    CHECK(st.tag == 0x201 && st.len == 6 && memcmp(buf, "second", 6) == 0);
    OK(clink_recv(p->ep, clink_selector_any(), buf, BIG, 30000, &st));
    CHECK(st.tag == 0x100 && st.len == 5 && memcmp(buf, "first", 5) == 0);

    /* Truncation: the buffer holds the first bytes, the status the full length. */
    uint8_t small[10];
    CHECK_RC(clink_recv(p->ep, clink_selector_exact(p->peer, 4), small, sizeof small, 30000, &st),
             CLINK_ERR_TRUNCATED);
    CHECK(st.len == 100 && st.tag == 4 && st.peer == p->peer);
    CHECK(check_pat(small, sizeof small, 4));
    CHECK(strstr(clink_last_error(), "truncated") != NULL);

    /* Probe: seen without being received, then received. */
    double end = now_s() + 30;
    int rc;
    while ((rc = clink_probe(p->ep, clink_selector_exact(p->peer, 5), &st)) == CLINK_AGAIN)
        CHECK(now_s() < end);
    OK(rc);
    CHECK(st.len == 16 && st.tag == 5 && st.peer == p->peer);
    OK(clink_probe(p->ep, clink_selector_exact(p->peer, 5), &st)); /* still there */
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 5), buf, BIG, 0, &st));
    CHECK(st.len == 16 && check_pat(buf, 16, 5));

    /* The batch, in order. */
    const size_t blen[3] = {10, 3000, 200000};
    for (unsigned i = 0; i < 3; i++) {
        OK(clink_recv(p->ep, clink_selector_exact(p->peer, 6), buf, BIG, 30000, &st));
        CHECK(st.len == blen[i] && check_pat(buf, blen[i], 61 + i));
    }

    /* In place: while the message is held, the endpoint refuses other calls. */
    clink_inplace_t *m = NULL;
    OK(clink_recv_in_place(p->ep, clink_selector_exact(p->peer, 7), 30000, &m));
    size_t len = 0;
    const void *data = clink_inplace_data(m, &len);
    CHECK(len == 8 && memcmp(data, "in place", 8) == 0);
    OK(clink_inplace_status(m, &st));
    CHECK(st.len == 8 && st.tag == 7 && st.peer == p->peer);
    CHECK_RC(clink_send(p->ep, p->peer, 1, "x", 1), CLINK_ERR_BUSY);
    CHECK_RC(clink_endpoint_free(p->ep), CLINK_ERR_BUSY);
    CHECK_RC(clink_endpoint_bind_thread(p->ep), CLINK_ERR_BUSY);
    clink_inplace_release(m);

    /* Bound to this thread: other threads are refused; an in-place message is still
     * held against the owner's calls and may be given back from another thread. */
    OK(clink_endpoint_bind_thread(p->ep));
    CHECK(on_thread(progress_from_thread, p->ep) == CLINK_ERR_BUSY);
    CHECK(on_thread(bind_from_thread, p->ep) == CLINK_ERR_BUSY);
    CHECK(clink_progress(p->ep) >= 0); /* CLINK_OK or CLINK_AGAIN: allowed */
    OK(clink_recv_in_place(p->ep, clink_selector_exact(p->peer, 7), 30000, &m));
    data = clink_inplace_data(m, &len);
    CHECK(len == 4 && memcmp(data, "held", 4) == 0);
    CHECK_RC(clink_progress(p->ep), CLINK_ERR_BUSY);
    CHECK_RC(clink_endpoint_unbind_thread(p->ep), CLINK_ERR_BUSY);
    on_thread(release_from_thread, m);
    CHECK(clink_progress(p->ep) >= 0); /* the borrow given back frees the owner's calls */
    OK(clink_endpoint_unbind_thread(p->ep));
    OK(clink_endpoint_unbind_thread(p->ep)); /* not bound: nothing to do */
    CHECK(on_thread(progress_from_thread, p->ep) >= 0);

    /* A claimed slot: written in the peer's ring, then committed. */
    clink_slot_t *slot = NULL;
    CHECK_RC(clink_claim(p->ep, p->peer, 8, (size_t)eager_max + 1, 1000, &slot), CLINK_ERR_TOO_LARGE);
    CHECK(slot == NULL);
    OK(clink_claim(p->ep, p->peer, 8, 32, 30000, &slot));
    size_t slen = 0;
    void *sb = clink_slot_buf(slot, &slen);
    CHECK(sb != NULL && slen == 32);
    CHECK_RC(clink_progress(p->ep), CLINK_ERR_BUSY);
    fill(sb, 32, 8);
    OK(clink_slot_commit(slot));
    /* An abandoned slot sends nothing. */
    OK(clink_claim(p->ep, p->peer, 8, 16, 30000, &slot));
    clink_slot_abandon(slot);

    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 9), buf, BIG, 30000, &st));
    CHECK(st.len == 3 && memcmp(buf, "bye", 3) == 0);
    clink_stats_t s;
    OK(clink_endpoint_stats(p->ep, &s));
    CHECK(s.frames_received >= 15 && s.peers_connected == 1);

    /* The child exits: its peer is gone. */
    pair_reap(p);
    CHECK_RC(clink_recv(p->ep, clink_selector_exact(p->peer, 10), buf, BIG, 30000, &st),
             CLINK_ERR_PEER_DEAD);
    CHECK_RC(clink_send(p->ep, p->peer, 10, "x", 1), CLINK_ERR_PEER_DEAD);
    int alive = 1;
    OK(clink_peer_alive(p->ep, p->peer, &alive));
    CHECK(alive == 0);
    free(buf);
    OK(clink_endpoint_free(p->ep));
    clink_context_free(p->ctx);
}

int main(void) {
    pair_t p;
    pair_open(&p);
    if (p.is_child)
        child(&p);
    else
        parent(&p);
    printf("test_tagged: ok\n");
    return 0;
}
