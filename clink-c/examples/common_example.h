/* Shared by the examples: a checked call, and a forked pair of connected processes. */
#ifndef CLINK_EXAMPLE_H
#define CLINK_EXAMPLE_H
#define _GNU_SOURCE
#include <clink.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TRY(expr)                                                                     \
    do {                                                                              \
        int rc_ = (expr);                                                             \
        if (rc_ != CLINK_OK) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #expr,        \
                    clink_strerror(rc_), clink_last_error());                         \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* Forks. Both processes get their own context and endpoint; the child connects to the
 * parent. Returns the child's pid in the parent, 0 in the child. */
static inline pid_t fork_pair(clink_context_t **ctx, clink_endpoint_t **ep, clink_peer_t *peer) {
    int fds[2];
    if (pipe(fds) != 0) exit(1);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) exit(1);
    TRY(clink_context_create(ctx));
    TRY(clink_endpoint_create(*ctx, ep));
    if (pid == 0) {
        close(fds[1]);
        char addr[1024] = {0};
        size_t n = 0;
        ssize_t r;
        while (n < sizeof addr - 1 && (r = read(fds[0], addr + n, sizeof addr - 1 - n)) > 0)
            n += (size_t)r;
        close(fds[0]);
        TRY(clink_connect(*ep, addr, peer));
    } else {
        close(fds[0]);
        const char *a = clink_endpoint_address(*ep);
        if (write(fds[1], a, strlen(a)) != (ssize_t)strlen(a)) exit(1);
        close(fds[1]);
        TRY(clink_accept(*ep, 30000, peer));
    }
    return pid;
}

/* In the parent: waits for the child; exits 1 if it failed. */
static inline void reap(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child failed (status %d)\n", st);
        exit(1);
    }
}
#endif
