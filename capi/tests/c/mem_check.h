/* Assertion helpers shared by the memory, one-sided and allocator C tests. A failed check prints
 * the file, line, expression and the values involved, then exits non-zero, so the Rust driver
 * that runs the program reports it. */
#ifndef MEM_CHECK_H
#define MEM_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* `call` must return `want` (an int status). */
#define CHECK_RC(call, want)                                                                       \
    do {                                                                                           \
        long rc_ = (long)(call);                                                                   \
        if (rc_ != (long)(want)) {                                                                 \
            fprintf(stderr, "%s:%d: %s returned %ld, expected %ld\n", __FILE__, __LINE__, #call,   \
                    rc_, (long)(want));                                                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* `call` must fail (return a non-zero status). */
#define CHECK_FAILS(call)                                                                          \
    do {                                                                                           \
        long rc_ = (long)(call);                                                                   \
        if (rc_ == 0) {                                                                            \
            fprintf(stderr, "%s:%d: %s succeeded, expected an error\n", __FILE__, __LINE__,        \
                    #call);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
