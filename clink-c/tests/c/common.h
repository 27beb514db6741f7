/* Helpers of the C test suite: checks that exit on failure, and a pair of processes
 * (a forked child) with connected endpoints. */
#ifndef CLINK_TEST_COMMON_H
#define CLINK_TEST_COMMON_H

#define _GNU_SOURCE
#include "clink.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "[%d] %s:%d: check failed: %s (last error: %s)\n", getpid(), \
                    __FILE__, __LINE__, #cond, clink_last_error());                      \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define CHECK_RC(expr, want)                                                             \
    do {                                                                                 \
        int rc_ = (expr);                                                                \
        if (rc_ != (want)) {                                                             \
            fprintf(stderr, "[%d] %s:%d: %s returned %d (%s), wanted %d (%s); last error: %s\n", \
                    getpid(), __FILE__, __LINE__, #expr, rc_, clink_strerror(rc_), (want),   \
                    clink_strerror(want), clink_last_error());                           \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define OK(expr) CHECK_RC((expr), CLINK_OK)

/* Byte i of a test pattern seeded by `seed`. */
static inline uint8_t pat(size_t i, unsigned seed) {
    return (uint8_t)((i * 131u + seed * 7u + (i >> 8)) & 0xff);
}

static inline void fill(void *buf, size_t len, unsigned seed) {
    uint8_t *b = buf;
    for (size_t i = 0; i < len; i++) b[i] = pat(i, seed);
}

static inline int check_pat(const void *buf, size_t len, unsigned seed) {
    const uint8_t *b = buf;
    for (size_t i = 0; i < len; i++)
        if (b[i] != pat(i, seed)) return 0;
    return 1;
}

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    clink_context_t *ctx;
    clink_endpoint_t *ep;
    clink_peer_t peer; /* the other process */
    pid_t child;       /* in the parent */
    int is_child;
} pair_t;

static inline void write_full(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        CHECK(w > 0);
        c += w;
        n -= (size_t)w;
    }
}

static inline void read_full(int fd, void *p, size_t n) {
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        CHECK(r > 0);
        c += r;
        n -= (size_t)r;
    }
}

/* Forks; both processes create a context and an endpoint; the parent sends its address
 * through a pipe and accepts, the child connects. A backstop alarm ends both processes
 * should anything hang (the runner's timeout bounds the parent too). */
static inline void pair_open(pair_t *p) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    memset(p, 0, sizeof *p);
    p->child = pid;
    p->is_child = pid == 0;
    alarm(150);
    OK(clink_context_create(&p->ctx));
    OK(clink_endpoint_create(p->ctx, &p->ep));
    if (!p->is_child) {
        close(fds[0]);
        const char *addr = clink_endpoint_address(p->ep);
        CHECK(addr != NULL && strncmp(addr, "clink:", 6) == 0);
        uint32_t n = (uint32_t)strlen(addr);
        write_full(fds[1], &n, sizeof n);
        write_full(fds[1], addr, n);
        close(fds[1]);
        OK(clink_accept(p->ep, 30000, &p->peer));
    } else {
        close(fds[1]);
        uint32_t n = 0;
        read_full(fds[0], &n, sizeof n);
        CHECK(n > 0 && n < 4096);
        char *addr = calloc(1, n + 1);
        CHECK(addr != NULL);
        read_full(fds[0], addr, n);
        close(fds[0]);
        OK(clink_connect(p->ep, addr, &p->peer));
        free(addr);
    }
}

/* The child frees its endpoint and exits 0; the parent waits for the child (its exit
 * status must be 0) before freeing its own. */
static inline void pair_close(pair_t *p) {
    if (p->is_child) {
        OK(clink_endpoint_free(p->ep));
        clink_context_free(p->ctx);
        exit(0);
    }
    int st = 0;
    CHECK(waitpid(p->child, &st, 0) == p->child);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child failed (status %d)\n", st);
        exit(1);
    }
    OK(clink_endpoint_free(p->ep));
    clink_context_free(p->ctx);
}

/* Waits for the child to exit (successfully) without freeing anything. */
static inline void pair_reap(pair_t *p) {
    int st = 0;
    CHECK(waitpid(p->child, &st, 0) == p->child);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child failed (status %d)\n", st);
        exit(1);
    }
    p->child = 0;
}

/* A small control message: `tag` with no payload, and its receipt. */
static inline void sync_send(pair_t *p, uint64_t tag) { OK(clink_send(p->ep, p->peer, tag, NULL, 0)); }
static inline void sync_recv(pair_t *p, uint64_t tag) {
    clink_status_t st;
    OK(clink_recv(p->ep, clink_selector_exact(p->peer, tag), NULL, 0, 30000, &st));
    CHECK(st.len == 0 && st.tag == tag);
}

#endif
