/* One process: result codes and messages, NULL and bad arguments, configuration errors,
 * requests that time out or are cancelled, own apertures, windows, tripwires, events
 * posted from another thread. */
#include "common.h"

#include <pthread.h>

#define POSTS 100

static void *poster(void *arg) {
    clink_event_sender_t *s = arg;
    for (uint64_t v = 1; v <= POSTS; v++) {
        int rc;
        while ((rc = clink_event_post(s, v)) == CLINK_AGAIN) sched_yield();
        if (rc != CLINK_OK) return (void *)1;
    }
    return NULL;
}

static void codes(void) {
    CHECK(strlen(clink_version()) > 0);
    CHECK(strcmp(clink_last_error(), "") == 0);
    const char *unknown = clink_strerror(-1000);
    CHECK(strstr(unknown, "unknown") != NULL);
    for (int c = 1; c >= CLINK_ERR_UNSUPPORTED; c--) {
        CHECK(clink_strerror(c) != NULL);
        CHECK(strcmp(clink_strerror(c), unknown) != 0);
        if (c < 1) CHECK(strcmp(clink_strerror(c), clink_strerror(c + 1)) != 0);
    }
    CHECK(strcmp(clink_strerror(CLINK_ERR_TRUNCATED), "message truncated") == 0);
}

static void nulls(void) {
    CHECK_RC(clink_context_create(NULL), CLINK_ERR_NULL);
    CHECK(strstr(clink_last_error(), "clink_context_create") != NULL);
    CHECK(strstr(clink_last_error(), "NULL") != NULL);
    clink_endpoint_t *ep = NULL;
    CHECK_RC(clink_endpoint_create(NULL, &ep), CLINK_ERR_NULL);
    CHECK(ep == NULL);
    CHECK_RC(clink_send(NULL, 0, 1, "x", 1), CLINK_ERR_NULL);
    CHECK_RC(clink_recv(NULL, clink_selector_any(), NULL, 0, 0, NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_progress(NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_endpoint_fd(NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_test(NULL, NULL, NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_window_store_u64(NULL, 0, 1), CLINK_ERR_NULL);
    CHECK_RC(clink_event_post(NULL, 1), CLINK_ERR_NULL);
    CHECK_RC(clink_cookie_info(NULL, NULL, NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_slot_commit(NULL), CLINK_ERR_NULL);
    CHECK(clink_endpoint_address(NULL) == NULL);
    CHECK(clink_window_ptr(NULL) == NULL && clink_window_len(NULL) == 0);
    CHECK(clink_request_id(NULL) == 0 && clink_remote_len(NULL) == 0);
    CHECK(clink_context_host(NULL) == 0);
    size_t len = 99;
    CHECK(clink_inplace_data(NULL, &len) == NULL && len == 0);
    /* Freeing NULL is a no-op. */
    CHECK_RC(clink_endpoint_free(NULL), CLINK_OK);
    clink_context_free(NULL);
    clink_request_free(NULL);
    clink_remote_free(NULL);
    clink_window_free(NULL);
    clink_event_sender_free(NULL);
    clink_inplace_release(NULL);
    clink_slot_abandon(NULL);
}

static void config_error(void) {
    clink_context_t *ctx = NULL;
    CHECK(setenv("CLINK_NO_SUCH_SETTING", "1", 1) == 0);
    CHECK_RC(clink_context_create(&ctx), CLINK_ERR_CONFIG);
    CHECK(ctx == NULL);
    CHECK(strstr(clink_last_error(), "CLINK_NO_SUCH_SETTING") != NULL);
    CHECK(unsetenv("CLINK_NO_SUCH_SETTING") == 0);
    CHECK(setenv("CLINK_RING_CELLS", "7", 1) == 0);
    CHECK_RC(clink_context_create(&ctx), CLINK_ERR_CONFIG);
    CHECK(unsetenv("CLINK_RING_CELLS") == 0);
}

static void endpoint_alone(clink_context_t *ctx, clink_endpoint_t *ep) {
    const char *addr = clink_endpoint_address(ep);
    CHECK(addr != NULL && strncmp(addr, "clink:", 6) == 0);
    CHECK(clink_context_host(ctx) != 0);
    CHECK(clink_endpoint_fd(ep) >= 0);
    int p = clink_progress(ep);
    CHECK(p == 0 || p == 1);

    clink_peer_t peer = 12345;
    CHECK_RC(clink_accept(ep, 0, &peer), CLINK_ERR_TIMEOUT);
    CHECK(peer == 12345);
    CHECK_RC(clink_accept(ep, 0, NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_connect(ep, "not an address", &peer), CLINK_ERR_ADDRESS);
    CHECK_RC(clink_connect(ep, NULL, &peer), CLINK_ERR_NULL);
    CHECK_RC(clink_connect(ep, addr, &peer), CLINK_ERR_CONNECT);
    uint32_t n = 99;
    OK(clink_peer_count(ep, &n));
    CHECK(n == 0);
    int alive = 1;
    OK(clink_peer_alive(ep, 0, &alive));
    CHECK(alive == 0);
    CHECK_RC(clink_peer_info(ep, 0, NULL, NULL, NULL), CLINK_ERR_UNKNOWN_PEER);
    CHECK_RC(clink_peer_joined(ep, 0, NULL, NULL, NULL), CLINK_ERR_UNKNOWN_PEER);
    CHECK_RC(clink_send(ep, 3, 1, "abc", 3), CLINK_ERR_UNKNOWN_PEER);
    CHECK_RC(clink_send(ep, 3, 1, NULL, 3), CLINK_ERR_NULL);

    char buf[64];
    clink_status_t st;
    CHECK_RC(clink_recv(ep, clink_selector_exact(7, 1), buf, sizeof buf, 0, &st),
             CLINK_ERR_UNKNOWN_PEER);
    CHECK_RC(clink_recv(ep, clink_selector_any(), buf, sizeof buf, 0, &st), CLINK_ERR_TIMEOUT);
    CHECK_RC(clink_recv(ep, clink_selector_any(), NULL, sizeof buf, 0, &st), CLINK_ERR_NULL);
    CHECK_RC(clink_probe(ep, clink_selector_any(), &st), CLINK_AGAIN);
    clink_inplace_t *m = NULL;
    CHECK_RC(clink_recv_in_place(ep, clink_selector_any(), 0, &m), CLINK_ERR_TIMEOUT);
    CHECK(m == NULL);
    /* The endpoint is usable again after the failed in-place receive. */
    OK(clink_peer_count(ep, &n));

    clink_stats_t s;
    OK(clink_endpoint_stats(ep, &s));
    CHECK(s.frames_sent == 0 && s.frames_received == 0 && s.peers_connected == 0);
    CHECK_RC(clink_endpoint_stats(ep, NULL), CLINK_ERR_NULL);
    /* Every counter by name, the struct's and the others, listed until NULL. */
    size_t names = 0;
    int saw_spins = 0, saw_frames = 0;
    for (const char *name; (name = clink_stat_name(names)) != NULL; names++) {
        uint64_t v = UINT64_MAX;
        OK(clink_endpoint_stat(ep, name, &v));
        CHECK(v != UINT64_MAX);
        saw_spins |= strcmp(name, "spins_failed") == 0;
        saw_frames |= strcmp(name, "frames_sent") == 0;
    }
    CHECK(names > 60 && saw_spins && saw_frames);
    uint64_t v = 0;
    CHECK_RC(clink_endpoint_stat(ep, "no_such_counter", &v), CLINK_ERR_INVALID);
    CHECK_RC(clink_endpoint_stat(ep, NULL, &v), CLINK_ERR_NULL);
    CHECK_RC(clink_endpoint_stat(ep, "frames_sent", NULL), CLINK_ERR_NULL);
    char diag[8];
    size_t dlen = 1;
    CHECK_RC(clink_endpoint_diagnostic(ep, diag, sizeof diag, &dlen), CLINK_AGAIN);
    CHECK(dlen == 0 && diag[0] == 0);
}

static void requests(clink_context_t *ctx, clink_endpoint_t *ep) {
    char buf[32];
    clink_request_t *r = NULL;
    clink_status_t st;
    OK(clink_irecv(ep, clink_selector_any(), buf, sizeof buf, &r));
    CHECK(r != NULL && clink_request_id(r) != 0);
    CHECK_RC(clink_wait(ep, r, 5, &st), CLINK_ERR_TIMEOUT);
    CHECK_RC(clink_test(ep, r, &st), CLINK_AGAIN);
    size_t idx = 99;
    clink_request_t *set[3] = {NULL, r, NULL};
    CHECK_RC(clink_wait_any(ep, set, 3, 5, &idx, &st), CLINK_ERR_TIMEOUT);
    CHECK(idx == 99);
    int withdrawn = -1;
    OK(clink_cancel(ep, r, &withdrawn));
    CHECK(withdrawn == 1);
    CHECK_RC(clink_wait(ep, r, 1000, &st), CLINK_ERR_CANCELLED);
    CHECK_RC(clink_test(ep, r, &st), CLINK_ERR_CANCELLED); /* the result stays */
    CHECK_RC(clink_wait_any(ep, set, 3, 0, &idx, &st), CLINK_ERR_CANCELLED);
    CHECK(idx == 1);
    clink_request_free(r);

    clink_request_t *none[2] = {NULL, NULL};
    CHECK_RC(clink_wait_any(ep, none, 2, 0, &idx, &st), CLINK_ERR_INVALID);
    CHECK_RC(clink_irecv(ep, clink_selector_any(), buf, sizeof buf, NULL), CLINK_ERR_NULL);
    CHECK_RC(clink_irecv(ep, clink_selector_any(), NULL, 8, &r), CLINK_ERR_NULL);

    /* A request of another endpoint is refused. */
    clink_endpoint_t *ep2 = NULL;
    OK(clink_endpoint_create(ctx, &ep2));
    clink_request_t *r2 = NULL;
    OK(clink_irecv(ep2, clink_selector_any(), buf, sizeof buf, &r2));
    CHECK_RC(clink_test(ep, r2, &st), CLINK_ERR_INVALID);
    CHECK(strstr(clink_last_error(), "another endpoint") != NULL);
    OK(clink_cancel(ep2, r2, NULL));
    clink_request_free(r2);
    OK(clink_endpoint_free(ep2));
}

static void apertures(clink_endpoint_t *ep) {
    clink_aperture_t ap;
    OK(clink_aperture_alloc(ep, 8192, &ap));
    uint64_t len = 0;
    OK(clink_aperture_len(ep, ap, &len));
    CHECK(len == 8192);
    char msg[100];
    fill(msg, sizeof msg, 3);
    OK(clink_aperture_write(ep, ap, 100, msg, sizeof msg));
    char back[100] = {0};
    OK(clink_aperture_read(ep, ap, 100, back, sizeof back));
    CHECK(memcmp(back, msg, sizeof msg) == 0);
    CHECK(clink_aperture_read(ep, ap, 8150, back, sizeof back) < 0);
    clink_aperture_t bogus = {.id = 999};
    CHECK_RC(clink_aperture_len(ep, bogus, &len), CLINK_ERR_INVALID);

    clink_window_t *w = NULL;
    OK(clink_aperture_window(ep, ap, &w));
    CHECK(clink_window_len(w) == 8192 && clink_window_writable(w) == 1);
    CHECK(memcmp((char *)clink_window_ptr(w) + 100, msg, sizeof msg) == 0);
    OK(clink_window_store_u64(w, 4096, 0x1122334455667788ull));
    uint64_t v = 0, old = 0;
    OK(clink_window_load_u64(w, 4096, &v));
    CHECK(v == 0x1122334455667788ull);
    OK(clink_window_fetch_add_u64(w, 4096, 8, &old));
    CHECK(old == 0x1122334455667788ull);
    OK(clink_window_compare_swap_u64(w, 4096, 0x1122334455667790ull, 5, &old));
    CHECK(old == 0x1122334455667790ull);
    OK(clink_window_load_u64(w, 4096, &v));
    CHECK(v == 5);
    CHECK(clink_window_load_u64(w, 4097, &v) < 0);  /* misaligned */
    CHECK(clink_window_load_u64(w, 8192, &v) < 0);  /* out of range */
    CHECK(clink_window_read(w, 8190, back, 8) < 0);

    /* A tripwire on the aperture fires on writes made through clink, with an event. */
    OK(clink_set_interest(ep, CLINK_EVENTS_TRIPWIRES));
    clink_tripwire_t t;
    clink_trip_options_t o = clink_trip_options_default();
    CHECK(o.writes == 1 && o.reads == 0 && o.once == 0 && o.event == 1);
    OK(clink_tripwire(ep, ap, 0, 64, &o, &t));
    CHECK(clink_tripwire(ep, ap, 8190, 64, NULL, &t) < 0);
    int fired = 1;
    uint64_t count = 9;
    OK(clink_tripwire_state(ep, t, &fired, &count));
    CHECK(fired == 0 && count == 0);
    OK(clink_aperture_write(ep, ap, 8, "hi", 2));
    OK(clink_tripwire_state(ep, t, &fired, &count));
    CHECK(fired == 1 && count == 1);
    clink_event_t ev;
    OK(clink_next_event(ep, &ev));
    CHECK(ev.kind == CLINK_EVENT_TRIPWIRE && ev.trip.index == t.index && ev.trip.gen == t.gen);
    CHECK(ev.peer == CLINK_PEER_ANY && ev.offset == 8 && ev.len == 2 && ev.write == 1);
    CHECK_RC(clink_next_event(ep, &ev), CLINK_AGAIN);
    OK(clink_wait_tripwire(ep, t, 1000)); /* the bit was set: returns at once, clears it */
    OK(clink_tripwire_state(ep, t, &fired, NULL));
    CHECK(fired == 0);
    CHECK_RC(clink_wait_tripset(ep, &t, 1, 5, NULL), CLINK_ERR_TIMEOUT);
    int removed = 0;
    OK(clink_tripwire_remove(ep, t, &removed));
    CHECK(removed == 1);
    OK(clink_tripwire_remove(ep, t, &removed));
    CHECK(removed == 0);
    OK(clink_set_interest(ep, 0));

    clink_cookie_t c;
    OK(clink_export(ep, ap, 0, 4096, CLINK_READ, &c));
    uint8_t rights = 0;
    OK(clink_cookie_info(&c, &len, &rights));
    CHECK(len == 4096 && rights == CLINK_READ);
    clink_cookie_t junk;
    memset(&junk, 0xab, sizeof junk);
    CHECK_RC(clink_cookie_info(&junk, &len, &rights), CLINK_ERR_INVALID);
    CHECK_RC(clink_export(ep, ap, 4096, 8192, CLINK_READ, &c), CLINK_ERR_INVALID);
    OK(clink_revoke(ep, &c));
    clink_remote_t *rem = NULL;
    CHECK_RC(clink_import(ep, 0, &c, &rem), CLINK_ERR_UNKNOWN_PEER);
    CHECK(rem == NULL);

    /* A registered aperture holds a copy of the bytes given. */
    clink_aperture_t reg;
    OK(clink_aperture_register(ep, msg, sizeof msg, &reg));
    OK(clink_aperture_read(ep, reg, 0, back, sizeof back));
    CHECK(memcmp(back, msg, sizeof msg) == 0);
    clink_window_t *w3 = NULL;
    CHECK(clink_aperture_window(ep, reg, &w3) < 0 && w3 == NULL); /* allocated ones only */
    OK(clink_aperture_destroy(ep, reg));
    CHECK(clink_aperture_len(ep, reg, &len) < 0);

    OK(clink_aperture_destroy(ep, ap));
    /* The window keeps its memory mapped after the aperture is gone. */
    OK(clink_window_load_u64(w, 4096, &v));
    CHECK(v == 5);
    clink_window_free(w);
}

static void user_events(clink_endpoint_t *ep) {
    clink_event_sender_t *s = NULL;
    OK(clink_event_sender_create(ep, &s));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, poster, s) == 0);
    for (uint64_t want = 1; want <= POSTS; want++) {
        clink_event_t ev;
        OK(clink_wait_event(ep, 10000, &ev));
        CHECK(ev.kind == CLINK_EVENT_USER && ev.value == want);
    }
    void *res = (void *)1;
    CHECK(pthread_join(th, &res) == 0 && res == NULL);
    clink_event_t ev;
    CHECK_RC(clink_wait_event(ep, 0, &ev), CLINK_ERR_TIMEOUT);
    clink_event_sender_free(s);
}

int main(void) {
    alarm(150);
    codes();
    nulls();
    config_error();
    clink_context_t *ctx = NULL;
    clink_endpoint_t *ep = NULL;
    OK(clink_context_create(&ctx));
    OK(clink_endpoint_create(ctx, &ep));
    endpoint_alone(ctx, ep);
    requests(ctx, ep);
    apertures(ep);
    user_events(ep);
    OK(clink_endpoint_close(ep));
    OK(clink_endpoint_free(ep));
    clink_context_free(ctx);
    printf("test_basics: ok\n");
    return 0;
}
