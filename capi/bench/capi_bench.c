/* capi_bench: the C API's cost, measured from C.
 *
 *   capi_bench [-n ITERS] [-s BYTES] [-w WINDOW] [--check-zero-alloc] [--oneway-only]
 *              [--malloc-reply-at CALL]
 *
 * Two tests against a server in this process (its type comes from BYPASS_BACKEND or "TCP"):
 *   lat     sync OckRpcClientCall of BYTES with a caller-provided response buffer; the server's
 *           handler echoes the request. Reports the round trip's p50/p90/p99 and the call rate.
 *   oneway  async one-way sends (response NULL, done callback) of BYTES with at most WINDOW in
 *           flight; reports the send rate.
 *
 * Heap allocations are counted by this program's own malloc/calloc/realloc/memalign family,
 * which forward to glibc's __libc_* entry points. The executable's definitions interpose on
 * the library's (and glibc's own internal) calls without LD_PRELOAD, because the dynamic linker
 * searches the executable first. The count covers every thread of the process - the client, the
 * server's worker and the library's threads - during the measured sync calls only, and
 * separately the calling thread's (what the call itself costs the caller). With
 * --check-zero-alloc the program exits 1 if the calling thread allocated during a sync call,
 * after printing on stderr where: the call number and size of the first few such allocations
 * and their backtraces (backtrace_symbols_fd: a frame of the library's internals shows as
 * libhcom4db.so(+0xOFFSET), which `addr2line -f -C -i -e libhcom4db.so 0xOFFSET` names; the
 * test driver, tests/mem_c.rs, does that on failure).
 * --oneway-only      one sync call instead of the lat run (to profile the one-way sends).
 * --malloc-reply-at CALL  measured sync call number CALL lets the library malloc its reply
 *                    (response data NULL): an allocation on the calling thread inside the
 *                    library, so the test can check that the report names where it happened. */
#include "hcom4db.h"

#include <errno.h>
#include <execinfo.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- counting allocator ---------------------------------------------------------------- */

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_int counting;
static atomic_ulong allocations;        /* every thread */
static atomic_ulong caller_allocations; /* the thread making the sync calls */
static _Thread_local int is_caller;

/* Where the calling thread allocated: the first TRACES counted allocations, with the number of
 * the sync call they happened in. Only the calling thread writes these (is_caller), while
 * counting; main reads them after counting stopped. */
enum { TRACES = 4, FRAMES = 48 };
struct trace {
    long call;
    size_t size;
    int depth;
    void *frames[FRAMES];
};
static struct trace traces[TRACES];
static int traced;
static long current_call;      /* the calling thread's sync call, counted from the first measured */
static _Thread_local int in_trace; /* backtrace() itself may allocate: do not recurse */

static inline void count(size_t n) {
    if (atomic_load_explicit(&counting, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
        if (is_caller) {
            atomic_fetch_add_explicit(&caller_allocations, 1, memory_order_relaxed);
            if (traced < TRACES && !in_trace) {
                in_trace = 1;
                struct trace *t = &traces[traced++];
                t->call = current_call;
                t->size = n;
                t->depth = backtrace(t->frames, FRAMES);
                in_trace = 0;
            }
        }
    }
}

/* Prints the recorded traces on stderr (backtrace_symbols_fd allocates nothing). */
static void print_traces(void) {
    for (int i = 0; i < traced; i++) {
        fprintf(stderr, "capi_bench: allocation %d of the calling thread: %zu bytes in sync call %ld of the measured ones; "
                        "backtrace:\n",
                i + 1, traces[i].size, traces[i].call);
        fflush(stderr);
        backtrace_symbols_fd(traces[i].frames, traces[i].depth, 2);
    }
}

void *malloc(size_t n) {
    count(n);
    return __libc_malloc(n);
}
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t m) {
    count(n * m);
    return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n) {
    count(n);
    return __libc_realloc(p, n);
}
void *memalign(size_t a, size_t n) {
    count(n);
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) {
    count(n);
    return __libc_memalign(a, n);
}
int posix_memalign(void **out, size_t a, size_t n) {
    count(n);
    void *p = __libc_memalign(a, n);
    if (p == NULL) {
        return ENOMEM;
    }
    *out = p;
    return 0;
}

/* ---- the server ------------------------------------------------------------------------- */

#define ECHO 1
#define SINK 2

static void echo(OckRpcServerContext ctx, OckRpcMessage msg) {
    OckRpcMessage reply = {msg.data, msg.len};
    if (OckRpcServerReply(ctx, ECHO, &reply, NULL) != OCK_RPC_OK) {
        fprintf(stderr, "capi_bench: OckRpcServerReply failed\n");
        exit(2);
    }
    OckRpcServerCleanupCtx(ctx);
}

static atomic_ulong sunk;

static void sink(OckRpcServerContext ctx, OckRpcMessage msg) {
    (void)msg;
    atomic_fetch_add_explicit(&sunk, 1, memory_order_relaxed);
    OckRpcServerCleanupCtx(ctx);
}

static void die(const char *what, int rc) {
    fprintf(stderr, "capi_bench: %s failed: %d\n", what, rc);
    exit(2);
}

static OckRpcCreateConfig config_of(RpcConfigPair *pairs, int n) {
    OckRpcCreateConfig c;
    memset(&c, 0, sizeof c);
    c.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    c.configs.size = n;
    c.configs.pairs = pairs;
    return c;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static atomic_ulong sent_done;
static atomic_int send_errors;

static void on_sent(OckRpcStatus status, void *arg) {
    (void)arg;
    if (status != OCK_RPC_OK) {
        atomic_fetch_add(&send_errors, 1);
    }
    atomic_fetch_add_explicit(&sent_done, 1, memory_order_release);
}

static OckRpcClient connect_to(uint16_t port, const char *selfpolling) {
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
        {OCK_RPC_STR_ENABLE_SELFPOLLING, selfpolling},
    };
    OckRpcCreateConfig cfg = config_of(pairs, 2);
    OckRpcClient client = 0;
    int rc = OckRpcClientConnectWithCfg("127.0.0.1", port, &client, &cfg);
    if (rc != OCK_RPC_OK) {
        die("OckRpcClientConnectWithCfg", rc);
    }
    return client;
}

int main(int argc, char **argv) {
    long iters = 100000, bytes = 64, window = 32;
    int check_zero = 0, oneway_only = 0;
    long malloc_reply_at = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            iters = atol(argv[++i]);
        } else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
            bytes = atol(argv[++i]);
        } else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc) {
            window = atol(argv[++i]);
        } else if (strcmp(argv[i], "--check-zero-alloc") == 0) {
            check_zero = 1;
        } else if (strcmp(argv[i], "--oneway-only") == 0) {
            oneway_only = 1;
        } else if (strcmp(argv[i], "--malloc-reply-at") == 0 && i + 1 < argc) {
            malloc_reply_at = atol(argv[++i]);
        } else {
            fprintf(stderr, "usage: capi_bench [-n ITERS] [-s BYTES] [-w WINDOW] [--check-zero-alloc] [--oneway-only] "
                            "[--malloc-reply-at CALL]\n");
            return 2;
        }
    }
    if (iters < 1 || bytes < 1 || bytes > 16384 || window < 1) {
        fprintf(stderr, "capi_bench: need -n >= 1, 1 <= -s <= 16384, -w >= 1\n");
        return 2;
    }

    RpcConfigPair spairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
        {OCK_RPC_STR_WRK_THR_GRP, "1"},
        {OCK_RPC_STR_WRK_CPU_SET, "na"},
        {OCK_RPC_STR_ENABLE_POLL_WORKER, "yes"},
    };
    OckRpcCreateConfig scfg = config_of(spairs, 4);
    OckRpcServer server = 0;
    uint16_t port = 0;
    int rc = -1;
    for (int attempt = 0; attempt < 20 && rc != OCK_RPC_OK; attempt++) {
        port = (uint16_t)(20000 + (getpid() * 7 + attempt * 131) % 20000);
        rc = OckRpcServerCreateWithCfg("127.0.0.1", port, &server, &scfg);
        if (rc == OCK_RPC_OK) {
            OckRpcService e = {ECHO, echo}, s = {SINK, sink};
            if ((rc = OckRpcServerAddService(server, &e)) != OCK_RPC_OK) die("AddService", rc);
            if ((rc = OckRpcServerAddService(server, &s)) != OCK_RPC_OK) die("AddService", rc);
            rc = OckRpcServerStart(server);
            if (rc != OCK_RPC_OK) {
                OckRpcServerDestroy(server);
            }
        }
    }
    if (rc != OCK_RPC_OK) die("OckRpcServerCreateWithCfg/Start", rc);

    /* ---- lat: sync calls with caller-provided buffers ---- */
    OckRpcClient client = connect_to(port, "yes");
    char *req_buf = malloc((size_t)bytes), *rsp_buf = malloc((size_t)bytes);
    uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)iters);
    if (!req_buf || !rsp_buf || !lat) die("malloc", -1);
    memset(req_buf, 'x', (size_t)bytes);
    long warmup = iters / 10 < 1000 ? 1000 : iters / 10;
    /* --oneway-only (for profiling the one-way sends): one sync call, no warmup. */
    long lat_iters = oneway_only ? 1 : iters;
    if (oneway_only) warmup = 0;
    for (long i = 0; i < warmup + lat_iters; i++) {
        if (i == warmup) {
            /* The first backtrace() loads the unwinder (which allocates): do it before counting. */
            void *frame[1];
            (void)backtrace(frame, 1);
            atomic_store(&allocations, 0);
            atomic_store(&caller_allocations, 0);
            is_caller = 1;
            atomic_store(&counting, 1);
        }
        OckRpcMessage req = {req_buf, (size_t)bytes};
        OckRpcMessage rsp = {rsp_buf, (size_t)bytes};
        current_call = i - warmup;
        int library_reply = i >= warmup && current_call == malloc_reply_at;
        if (library_reply) {
            rsp.data = NULL;
            rsp.len = 0;
        }
        uint64_t t0 = now_ns();
        rc = OckRpcClientCall(client, ECHO, &req, &rsp, NULL);
        uint64_t t1 = now_ns();
        if (rc != OCK_RPC_OK) die("OckRpcClientCall", rc);
        if (library_reply) {
            if (rsp.data == NULL || rsp.len != (size_t)bytes || memcmp(rsp.data, req_buf, (size_t)bytes) != 0)
                die("echo check (library reply)", -1);
            free(rsp.data);
            rsp.data = rsp_buf;
        }
        if (rsp.len != (size_t)bytes || memcmp(rsp_buf, req_buf, (size_t)bytes) != 0) die("echo check", -1);
        if (i >= warmup) {
            lat[i - warmup] = t1 - t0;
        }
    }
    atomic_store(&counting, 0);
    is_caller = 0;
    unsigned long sync_allocs = atomic_load(&allocations);
    unsigned long caller_allocs = atomic_load(&caller_allocations);
    uint64_t total = 0;
    for (long i = 0; i < lat_iters; i++) total += lat[i];
    qsort(lat, (size_t)lat_iters, sizeof lat[0], cmp_u64);
    printf("capi  lat     %6ld B %9ld iters  p50 %8.3f us  p90 %8.3f us  p99 %8.3f us  rate %10.0f calls/s\n",
           bytes, lat_iters, lat[lat_iters / 2] / 1e3, lat[lat_iters * 9 / 10] / 1e3,
           lat[lat_iters * 99 / 100] / 1e3, lat_iters / (total / 1e9));
    printf("capi  heap allocations during %ld sync calls: %lu on the calling thread, %lu in the process "
           "(%.4f per call)\n",
           lat_iters, caller_allocs, sync_allocs, (double)sync_allocs / (double)lat_iters);
    OckRpcClientDisconnect(client);

    /* ---- oneway: async sends, done on send completion ---- */
    if (!check_zero) {
        OckRpcClient async_client = connect_to(port, "no");
        OckRpcCallDone done = {on_sent, NULL};
        uint64_t t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            /* The window is full: the library's worker thread completes the sends and runs `done`.
             * Yield to it instead of spinning (on 2 CPUs a spinning caller, the client's worker and
             * the server's worker are three busy threads, and the spin starves the worker). */
            while ((long)(i - (long)atomic_load_explicit(&sent_done, memory_order_acquire)) >= window) {
                sched_yield();
            }
            OckRpcMessage req = {req_buf, (size_t)bytes};
            rc = OckRpcClientCall(async_client, SINK, &req, NULL, &done);
            if (rc != OCK_RPC_OK) die("OckRpcClientCall (one-way)", rc);
        }
        while ((long)atomic_load_explicit(&sent_done, memory_order_acquire) < iters) {
            sched_yield();
        }
        uint64_t t1 = now_ns();
        if (atomic_load(&send_errors) != 0) die("one-way sends", atomic_load(&send_errors));
        printf("capi  oneway  %6ld B %9ld sends  window %ld  rate %10.0f sends/s  (%.3f us each)\n", bytes,
               iters, window, iters / ((t1 - t0) / 1e9), (t1 - t0) / 1e3 / iters);
        OckRpcClientDisconnect(async_client);
    }

    OckRpcServerDestroy(server);
    free(lat);
    free(req_buf);
    free(rsp_buf);
    if (check_zero && caller_allocs != 0) {
        fprintf(stderr, "capi_bench: %lu heap allocations on the calling thread in %ld steady-state sync calls "
                        "(want 0)\n",
                caller_allocs, iters);
        print_traces();
        return 1;
    }
    return 0;
}
