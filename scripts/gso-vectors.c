// What one header per datagram costs the kernel's UDP send path: a sender's rate of
// segmentation-offload sends (UDP_SEGMENT) of 44 datagrams of 1472 bytes each, the
// bytes given as one vector (a flat buffer) or as two vectors per datagram, a header of
// HDR bytes and its payload, as clink's bulk fragments are sent. Nothing listens at the
// destination's port 9: the datagrams cross the path and are dropped at the far end
// (the port-unreachable answers are ignored), so only the send path is timed.
//
//   cc -O2 -o gso-vectors scripts/gso-vectors.c
//   ip netns exec A taskset -c 0 ./gso-vectors ADDR-IN-B [HDR] [BUFFER-BYTES]
//
// Prints GB/s of UDP payload for each layout, two seconds each.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

enum { SEG = 1472, NSEG = 44 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Sends for two seconds, `split` choosing the layout; returns GB/s.
static double run(int s, char *buf, size_t size, int hdr, int split) {
    static char headers[NSEG][64];
    struct iovec iov[2 * NSEG];
    char cb[CMSG_SPACE(sizeof(unsigned short))] = {0};
    struct msghdr m = {.msg_iov = iov, .msg_control = cb, .msg_controllen = sizeof cb};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(unsigned short));
    *(unsigned short *)CMSG_DATA(c) = SEG;
    size_t off = 0, total = 0;
    double t0 = now(), t = t0;
    while (t - t0 < 2.0) {
        size_t pay = split ? SEG - hdr : SEG;
        if (off + pay * NSEG > size) off = 0;
        int n = 0;
        if (split) {
            for (int k = 0; k < NSEG; k++) {
                iov[n++] = (struct iovec){headers[k], (size_t)hdr};
                iov[n++] = (struct iovec){buf + off, pay};
                off += pay;
            }
        } else {
            iov[n++] = (struct iovec){buf + off, pay * NSEG};
            off += pay * NSEG;
        }
        m.msg_iovlen = n;
        if (sendmsg(s, &m, 0) < 0 && errno != ECONNREFUSED) {
            perror("sendmsg");
            exit(1);
        }
        total += (size_t)SEG * NSEG;
        t = now();
    }
    return total / (t - t0) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s ADDR [HDR] [BUFFER-BYTES]\n", argv[0]);
        return 2;
    }
    int hdr = argc > 2 ? atoi(argv[2]) : 24;
    size_t size = argc > 3 ? strtoul(argv[3], NULL, 0) : 1 << 20;
    if (hdr < 1 || hdr > 64 || size < (size_t)SEG * NSEG) {
        fprintf(stderr, "HDR must be 1-64 and BUFFER-BYTES at least %d\n", SEG * NSEG);
        return 2;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)};
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[1]);
        return 2;
    }
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("socket");
        return 1;
    }
    int sz = 64 << 20;
    setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz);
    char *buf = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    memset(buf, 7, size);
    printf("one vector per send:          %.2f GB/s\n", run(s, buf, size, hdr, 0));
    printf("header + payload per datagram: %.2f GB/s (header %d bytes)\n",
           run(s, buf, size, hdr, 1), hdr);
    return 0;
}
