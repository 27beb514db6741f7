/* Two processes: the parent owns an aperture and exports it; the child imports the cookies
 * and puts, gets, adds and swaps, maps the window and stores into it directly, rings the
 * doorbell; refusals (read-only cookie, out of range, revoked); the parent's tripwire
 * events, and a message received straight into the aperture. */
#include "common.h"

#define AP_LEN (1 << 20)
#define TRIP_OFF 4096
#define CNT_OFF 8192
#define MAP_OFF 16384
#define RECV_OFF 65536

static void child(pair_t *p) {
    clink_cookie_t rw, ro;
    clink_status_t st;
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 1), &rw, sizeof rw, 30000, &st));
    CHECK(st.len == sizeof rw);
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, 2), &ro, sizeof ro, 30000, &st));
    clink_remote_t *r = NULL, *rr = NULL;
    OK(clink_import(p->ep, p->peer, &rw, &r));
    OK(clink_import(p->ep, p->peer, &ro, &rr));
    CHECK(clink_remote_len(r) == AP_LEN && clink_remote_len(rr) == 4096);

    /* Put, then get back. */
    uint8_t data[4096], back[4096];
    fill(data, sizeof data, 21);
    OK(clink_put(p->ep, r, 0, data, sizeof data));
    memset(back, 0, sizeof back);
    OK(clink_get(p->ep, r, 0, back, sizeof back));
    CHECK(memcmp(back, data, sizeof data) == 0);
    OK(clink_get(p->ep, rr, 100, back, 100)); /* reads through the read-only cookie */
    CHECK(memcmp(back, data + 100, 100) == 0);

    /* Atomics. */
    uint64_t old = 99;
    for (uint64_t i = 0; i < 3; i++) {
        OK(clink_fetch_add(p->ep, r, CNT_OFF, 5, &old));
        CHECK(old == 5 * i);
    }
    OK(clink_compare_swap(p->ep, r, CNT_OFF, 15, 100, &old));
    CHECK(old == 15);
    OK(clink_compare_swap(p->ep, r, CNT_OFF, 15, 7, &old));
    CHECK(old == 100); /* not swapped */
    CHECK_RC(clink_fetch_add(p->ep, r, CNT_OFF + 1, 1, &old), CLINK_ERR_REFUSED); /* misaligned */

    /* Refusals: writes through a read-only cookie, accesses out of the window. */
    CHECK_RC(clink_put(p->ep, rr, 0, data, 8), CLINK_ERR_REFUSED);
    CHECK_RC(clink_get(p->ep, rr, 4000, back, 200), CLINK_ERR_REFUSED);
    CHECK_RC(clink_put(p->ep, r, AP_LEN - 4, data, 8), CLINK_ERR_REFUSED);
    CHECK(strstr(clink_last_error(), "refused") != NULL);

    /* A put on the tripwire's range fires it (the parent sees the event). */
    OK(clink_put(p->ep, r, TRIP_OFF, "trip", 4));

    /* Non-blocking put and get. */
    uint8_t idata[300], iback[300];
    fill(idata, sizeof idata, 22);
    clink_request_t *q = NULL, *g = NULL;
    OK(clink_iput(p->ep, r, 20000, idata, sizeof idata, &q));
    OK(clink_wait(p->ep, q, 30000, &st));
    clink_request_free(q);
    OK(clink_iget(p->ep, r, 20000, iback, sizeof iback, &g));
    OK(clink_wait(p->ep, g, 30000, &st));
    CHECK(st.len == sizeof iback && memcmp(iback, idata, sizeof idata) == 0);
    int withdrawn = 0;
    OK(clink_cancel(p->ep, g, &withdrawn)); /* complete already: nothing to withdraw */
    CHECK(withdrawn == 0);
    clink_request_free(g);
    size_t inl = 0;
    OK(clink_rma_inline_max(p->ep, p->peer, &inl));
    CHECK(inl > 0);
    OK(clink_put_nowait(p->ep, r, 20400, "nowait", 6));
    OK(clink_flush_rma(p->ep, CLINK_PEER_ANY));

    /* Same host: map the window and store into it directly, then ring the doorbell. */
    clink_window_t *w = NULL;
    OK(clink_map(p->ep, r, &w));
    CHECK(clink_window_len(w) == AP_LEN && clink_window_writable(w) == 1);
    OK(clink_window_store_u64(w, MAP_OFF, 42));
    OK(clink_window_fetch_add_u64(w, MAP_OFF, 1, &old));
    CHECK(old == 42);
    OK(clink_window_write(w, MAP_OFF + 8, "mapped", 6));
    OK(clink_fence(p->ep, p->peer));
    OK(clink_notify(p->ep, r, TRIP_OFF, 8));
    OK(clink_notify_nowait(p->ep, r, TRIP_OFF, 8));
    OK(clink_flush_rma(p->ep, p->peer));
    CHECK_RC(clink_window_store_u64(w, AP_LEN, 1), CLINK_ERR_REFUSED);
    clink_window_t *wr = NULL;
    OK(clink_map(p->ep, rr, &wr));
    CHECK(clink_window_writable(wr) == 0 && clink_window_len(wr) == 4096);
    CHECK_RC(clink_window_store_u64(wr, 0, 1), CLINK_ERR_REFUSED);
    OK(clink_window_read(wr, 0, back, 64));
    CHECK(memcmp(back, data, 64) == 0);
    clink_window_free(wr);

    /* Phase 1 over; the parent revokes the read-only cookie. */
    sync_send(p, 3);
    sync_recv(p, 4);
    CHECK_RC(clink_get(p->ep, rr, 0, back, 8), CLINK_ERR_REFUSED);
    CHECK(strstr(clink_last_error(), "revoked") != NULL);

    /* A message received straight into the parent's aperture. */
    uint8_t m[1000];
    fill(m, sizeof m, 23);
    OK(clink_send(p->ep, p->peer, 5, m, sizeof m));
    sync_recv(p, 6);
    /* The window still maps the aperture: the parent's marker is visible here. */
    OK(clink_window_load_u64(w, MAP_OFF, &old));
    CHECK(old == 0xabcdef);
    clink_window_free(w);
    clink_remote_free(r);
    clink_remote_free(rr);
    pair_close(p);
}

static void parent(pair_t *p) {
    clink_aperture_t ap;
    OK(clink_aperture_alloc(p->ep, AP_LEN, &ap));
    clink_tripwire_t trip;
    OK(clink_tripwire(p->ep, ap, TRIP_OFF, 64, NULL, &trip));
    OK(clink_set_interest(p->ep, CLINK_EVENTS_TRIPWIRES));
    clink_cookie_t rw, ro;
    OK(clink_export(p->ep, ap, 0, AP_LEN, CLINK_READ | CLINK_WRITE, &rw));
    OK(clink_export(p->ep, ap, 0, 4096, CLINK_READ, &ro));
    OK(clink_send(p->ep, p->peer, 1, &rw, sizeof rw));
    OK(clink_send(p->ep, p->peer, 2, &ro, sizeof ro));

    /* The receive into the aperture is posted before the child sends it. */
    clink_request_t *q = NULL;
    OK(clink_irecv_into_aperture(p->ep, clink_selector_exact(p->peer, 5), ap, RECV_OFF, 4096, &q));
    CHECK_RC(clink_aperture_destroy(p->ep, ap), CLINK_ERR_INVALID); /* busy with the receive */

    sync_recv(p, 3); /* serves the child's accesses meanwhile */
    clink_window_t *w = NULL;
    OK(clink_aperture_window(p->ep, ap, &w));
    const uint8_t *mem = clink_window_ptr(w);
    CHECK(check_pat(mem, 4096, 21)); /* the child's first put */
    uint64_t v = 0;
    OK(clink_window_load_u64(w, CNT_OFF, &v));
    CHECK(v == 100);
    OK(clink_window_load_u64(w, MAP_OFF, &v));
    CHECK(v == 43);
    CHECK(memcmp(mem + MAP_OFF + 8, "mapped", 6) == 0);
    CHECK(memcmp(mem + TRIP_OFF, "trip", 4) == 0);
    CHECK(memcmp(mem + 20400, "nowait", 6) == 0);
    uint8_t idata[300];
    fill(idata, sizeof idata, 22);
    CHECK(memcmp(mem + 20000, idata, sizeof idata) == 0);

    /* Tripwire events: the put by the child, then its two doorbells. */
    clink_event_t ev;
    int puts = 0, notifies = 0;
    for (int i = 0; i < 3; i++) {
        OK(clink_wait_event(p->ep, 30000, &ev));
        CHECK(ev.kind == CLINK_EVENT_TRIPWIRE && ev.trip.index == trip.index);
        CHECK(ev.peer == p->peer && ev.write == 1 && ev.offset == TRIP_OFF);
        if (ev.len == 4) puts++;
        if (ev.len == 8) notifies++;
    }
    CHECK(puts == 1 && notifies == 2);
    uint64_t count = 0;
    int fired = 0;
    OK(clink_tripwire_state(p->ep, trip, &fired, &count));
    CHECK(fired == 1 && count == 3);

    clink_stats_t s;
    OK(clink_endpoint_stats(p->ep, &s));
    CHECK(s.rma_refused >= 4 && s.rma_put_bytes >= 4096 && s.rma_get_bytes >= 4096);
    CHECK(s.tripwires_fired == 3);

    OK(clink_revoke(p->ep, &ro));
    sync_send(p, 4);

    /* The message lands in the aperture. */
    clink_status_t st;
    OK(clink_wait(p->ep, q, 30000, &st));
    CHECK(st.len == 1000 && st.tag == 5 && st.peer == p->peer);
    CHECK(check_pat(mem + RECV_OFF, 1000, 23));
    clink_request_free(q);
    OK(clink_window_store_u64(w, MAP_OFF, 0xabcdef));
    sync_send(p, 6);
    pair_reap(p);
    OK(clink_aperture_destroy(p->ep, ap));
    clink_window_free(w);
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
    printf("test_rma: ok\n");
    return 0;
}
