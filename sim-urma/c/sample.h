/*
 * sample.h — what the two-process C programs of sim-urma/c share: the CHECK macro (a failed
 * check prints where and exits 1), and the TCP side channel over which a server and a client
 * exchange their ids (the server prints "PORT <n>" for the test driver, which passes <n> to the
 * client), as UMDK's sample does. Header-only: each program is one translation unit (plus
 * badinput.c for rc_sample).
 */
#ifndef SIM_URMA_SAMPLE_H
#define SIM_URMA_SAMPLE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* "server" or "client", for failure messages. */
static const char *role = "?";

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "[%s] FAILED %s:%d: ", role, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

/* Writes (out) or reads all n bytes of the side channel. */
static inline void xfer(int fd, void *p, size_t n, int out)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t r = out ? write(fd, b, n) : read(fd, b, n);
        CHECK(r > 0, "TCP %s failed: %s", out ? "write" : "read", r == 0 ? "peer closed" : strerror(errno));
        b += r;
        n -= (size_t)r;
    }
}

/* One byte each way marks a step both sides reached. */
static inline void sync_byte(int fd, int out)
{
    char c = 's';
    xfer(fd, &c, 1, out);
}

static inline uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Listens on a free loopback port and prints "PORT <n>" (flushed); returns the socket. */
static inline int listen_and_announce(void)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(ls, (struct sockaddr *)&a, sizeof a) == 0 && listen(ls, 1) == 0, "listen: %s", strerror(errno));
    socklen_t al = sizeof a;
    getsockname(ls, (struct sockaddr *)&a, &al);
    printf("PORT %u\n", ntohs(a.sin_port));
    fflush(stdout);
    return ls;
}

/* Accepts the one client of listening socket ls. */
static inline int accept_one(int ls)
{
    int fd = accept(ls, NULL, NULL);
    CHECK(fd >= 0, "accept: %s", strerror(errno));
    return fd;
}

/* Connects to the server on 127.0.0.1:port. */
static inline int connect_loopback(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s", strerror(errno));
    return fd;
}

#endif
