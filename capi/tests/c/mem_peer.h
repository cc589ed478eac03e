/* A server exposing one memory region and a client that learns it over an RPC, as callers of
 * one-sided I/O do: the server registers a region and answers REGION_INFO with a
 * struct wire_region {address, key, size}; the client reads and writes it with OckRpcRead/Write.
 * Shared by the onesided_*.c tests. */
#ifndef MEM_PEER_H
#define MEM_PEER_H

#include "hcom4db.h"
#include "mem_check.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REGION_INFO 5
#define CHECK_PATTERN 6
#define QUIT 7

/* What travels in the REGION_INFO reply (both ends are this program, same layout). */
struct wire_region {
    uint64_t address;
    uint32_t key;
    uint32_t size;
};

static struct wire_region exposed_region;

static inline void on_region_info(OckRpcServerContext ctx, OckRpcMessage msg) {
    (void)msg;
    OckRpcMessage reply = {&exposed_region, sizeof exposed_region};
    CHECK_RC(OckRpcServerReply(ctx, REGION_INFO, &reply, NULL), OCK_RPC_OK);
    OckRpcServerCleanupCtx(ctx);
}

static inline OckRpcCreateConfig peer_config(RpcConfigPair *pairs, int n) {
    OckRpcCreateConfig c;
    memset(&c, 0, sizeof c);
    c.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    c.configs.size = n;
    c.configs.pairs = pairs;
    return c;
}

/* The communication type of the servers and clients: $CAPI_COMM_TYPE (e.g. "UBC"), else "TCP". */
static inline const char *peer_comm_type(void) {
    const char *t = getenv("CAPI_COMM_TYPE");
    return t != NULL && t[0] != '\0' ? t : "TCP";
}

/* Creates and starts a "TCP" (or $CAPI_COMM_TYPE) server on a free port of 127.0.0.1 with the REGION_INFO service
 * (plus `extra`, if non-NULL); returns the port. */
static inline uint16_t start_server(OckRpcServer *server, const OckRpcService *extra, int n_extra) {
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, peer_comm_type()},
        {OCK_RPC_STR_WRK_THR_GRP, "1"},
        {OCK_RPC_STR_WRK_CPU_SET, "na"},
    };
    OckRpcCreateConfig cfg = peer_config(pairs, 3);
    int rc = -1;
    uint16_t port = 0;
    for (int attempt = 0; attempt < 50 && rc != OCK_RPC_OK; attempt++) {
        port = (uint16_t)(20000 + ((unsigned)getpid() * 13u + (unsigned)attempt * 977u) % 30000u);
        rc = OckRpcServerCreateWithCfg("127.0.0.1", port, server, &cfg);
        if (rc != OCK_RPC_OK) {
            continue;
        }
        OckRpcService info = {REGION_INFO, on_region_info};
        CHECK_RC(OckRpcServerAddService(*server, &info), OCK_RPC_OK);
        for (int i = 0; i < n_extra; i++) {
            OckRpcService s = extra[i];
            CHECK_RC(OckRpcServerAddService(*server, &s), OCK_RPC_OK);
        }
        rc = OckRpcServerStart(*server);
        if (rc != OCK_RPC_OK) {
            OckRpcServerDestroy(*server);
        }
    }
    CHECK_RC(rc, OCK_RPC_OK);
    return port;
}

/* Registers `size` bytes on `server` and publishes them as the region REGION_INFO answers. */
static inline OckRpcMemoryRegion expose_region(OckRpcServer server, uint32_t size) {
    OckRpcMemoryRegion mr = 0;
    CHECK_RC(OckRpcRegisterMemoryRegion(server, size, &mr), OCK_RPC_OK);
    OckRpcMemoryRegionInfo info;
    CHECK_RC(OckRpcGetMemoryRegionInfo(mr, &info), OCK_RPC_OK);
    CHECK(info.size == size && info.lAddress != 0);
    exposed_region.address = info.lAddress;
    exposed_region.key = info.lKey;
    exposed_region.size = info.size;
    return mr;
}

static inline OckRpcClient connect_client(uint16_t port, const char *selfpolling) {
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, peer_comm_type()},
        {OCK_RPC_STR_ENABLE_SELFPOLLING, selfpolling},
    };
    OckRpcCreateConfig cfg = peer_config(pairs, 2);
    OckRpcClient client = 0;
    CHECK_RC(OckRpcClientConnectWithCfg("127.0.0.1", port, &client, &cfg), OCK_RPC_OK);
    OckRpcClientSetTimeout(client, 10000);
    return client;
}

/* Asks the server which region it exposes (a library-allocated reply, freed with free()). */
static inline struct wire_region fetch_region(OckRpcClient client) {
    OckRpcMessage req = {"?", 1};
    OckRpcMessage rsp = {NULL, 0};
    CHECK_RC(OckRpcClientCall(client, REGION_INFO, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK(rsp.data != NULL && rsp.len == sizeof(struct wire_region));
    struct wire_region r;
    memcpy(&r, rsp.data, sizeof r);
    free(rsp.data);
    return r;
}

static inline OckRpcRequest request(uintptr_t l_address, uint32_t l_key, uintptr_t r_address, uint32_t r_key,
                             uint32_t size) {
    OckRpcRequest r;
    r.lAddress = l_address;
    r.rAddress = r_address;
    r.lKey = l_key;
    r.rKey = r_key;
    r.size = size;
    return r;
}

/* An OckRpcCallDone whose callback records its status and how often it ran. */
struct waiter {
    atomic_int calls;
    atomic_int status;
};

static inline void waiter_cb(OckRpcStatus status, void *arg) {
    struct waiter *w = arg;
    atomic_store(&w->status, (int)status);
    atomic_fetch_add(&w->calls, 1);
}

static inline uint64_t mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* Waits (at most 20 s) for the callback; returns its status. */
static inline int wait_done(struct waiter *w) {
    uint64_t deadline = mono_ms() + 20000;
    while (atomic_load(&w->calls) == 0) {
        CHECK(mono_ms() < deadline);
        usleep(100);
    }
    return atomic_load(&w->status);
}

#endif
