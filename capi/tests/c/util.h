/* Helpers of the C tests: checks that name the line, bounded waits. */
#ifndef CAPI_TEST_UTIL_H
#define CAPI_TEST_UTIL_H
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "hcom4db.h"

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        long long _a = (long long)(a), _b = (long long)(b);                              \
        if (_a != _b) {                                                                  \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, \
                    #a, _a, #b, _b);                                                     \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Waits until *v >= want, at most `secs` seconds; returns whether it got there. */
static inline int wait_at_least(atomic_int *v, int want, double secs)
{
    double end = now_s() + secs;
    while (atomic_load(v) < want) {
        if (now_s() > end) {
            return 0;
        }
        struct timespec d = {0, 1000000};
        nanosleep(&d, NULL);
    }
    return 1;
}

/* A config of `n` pairs. */
static inline OckRpcCreateConfig make_cfg(RpcConfigPair *pairs, int n)
{
    OckRpcCreateConfig c;
    memset(&c, 0, sizeof(c));
    c.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    c.configs.size = n;
    c.configs.pairs = pairs;
    return c;
}

/* The communication type of the test's servers: $CAPI_COMM_TYPE (e.g. "UBC"), else "TCP". */
static inline const char *comm_type(void)
{
    const char *t = getenv("CAPI_COMM_TYPE");
    return t != NULL && t[0] != '\0' ? t : "TCP";
}

#define FN_VALUE(f) ((const char *)(uintptr_t)(f))

#endif
