/* Ranks started by a launcher find each other (clink_context_from_launcher, clink_job_*).
 * Under mpirun (tests/run.sh runs it with three ranks) each rank greets its right-hand
 * neighbour and checks the greeting of its left-hand one. Started without a launcher
 * (the suite's plain, sanitizer and valgrind runs), the call fails with CLINK_ERR_CONFIG
 * and says why, and the job accessors answer NULL jobs safely. */
#include "common.h"

static int alone(void) {
    clink_context_t *ctx = NULL;
    clink_job_t *job = NULL;
    CHECK_RC(clink_context_from_launcher(&ctx, &job), CLINK_ERR_CONFIG);
    CHECK(ctx == NULL && job == NULL);
    CHECK(strstr(clink_last_error(), "not started by a PMIx launcher") != NULL);
    printf("launcher: none; refused with \"%s\"\n", clink_last_error());
    CHECK_RC(clink_context_from_launcher(NULL, &job), CLINK_ERR_NULL);
    CHECK_RC(clink_job_exchange(NULL, "x"), CLINK_ERR_NULL);
    CHECK(clink_job_rank(NULL) == 0 && clink_job_size(NULL) == 0 && clink_job_local_size(NULL) == 0);
    CHECK(clink_job_address(NULL, 0) == NULL);
    clink_job_free(NULL);
    return 0;
}

int main(void) {
    if (getenv("PMIX_NAMESPACE") == NULL)
        return alone();
    clink_context_t *ctx = NULL;
    clink_job_t *job = NULL;
    OK(clink_context_from_launcher(&ctx, &job));
    uint32_t rank = clink_job_rank(job), size = clink_job_size(job);
    CHECK(size >= 1 && rank < size);
    CHECK(clink_job_address(job, 0) == NULL); /* nothing before the exchange */
    /* Open MPI's PMIx says how many ranks share the node: all of them here. */
    CHECK(clink_job_local_size(job) == size);
    clink_endpoint_t *ep = NULL;
    OK(clink_endpoint_create(ctx, &ep));
    OK(clink_endpoint_expect_peers(ep, size - 1));
    CHECK_RC(clink_job_exchange(job, NULL), CLINK_ERR_NULL);
    OK(clink_job_exchange(job, clink_endpoint_address(ep)));
    CHECK(strcmp(clink_job_address(job, rank), clink_endpoint_address(ep)) == 0);
    CHECK(clink_job_address(job, size) == NULL);
    if (size > 1) {
        clink_peer_t right;
        OK(clink_connect(ep, clink_job_address(job, (rank + 1) % size), &right));
        char msg[64], got[64];
        snprintf(msg, sizeof msg, "hello from %u", rank);
        OK(clink_send(ep, right, 7, msg, strlen(msg)));
        clink_status_t st;
        OK(clink_recv(ep, clink_selector_any(), got, sizeof got - 1, 30000, &st));
        got[st.len] = 0;
        snprintf(msg, sizeof msg, "hello from %u", (rank + size - 1) % size);
        CHECK(strcmp(got, msg) == 0);
        printf("rank %u of %u: got \"%s\" from its left\n", rank, size, got);
    }
    /* Every rank has its greeting before any leaves. */
    OK(clink_job_exchange(job, clink_endpoint_address(ep)));
    OK(clink_endpoint_free(ep));
    clink_job_free(job);
    clink_context_free(ctx);
    return 0;
}
