/* The memory allocator as the rendezvous hooks, as callers use it: the server's
 * server.rndv.malloc/mfree hand out and take back blocks of an allocator over a region registered
 * on the server; the client sends 1 MiB with OckRpcClientCallRndv from a block of another
 * allocator over another registered region. The handler checks the bytes; afterwards every
 * block the library took through the hooks is back (free size full again). */
#include "mem_peer.h"

#define BIG (1u << 20)
#define RNDV_ID 9

static OckRpcMemoryAllocator hook_alloc;
static atomic_int hook_allocs, hook_frees, handled;

static int rndv_malloc(uint64_t size, uintptr_t *address, uint32_t *key) {
    atomic_fetch_add(&hook_allocs, 1);
    return OckRpcMemoryAllocatorAllocate(hook_alloc, size, address, key);
}

static int rndv_free(uintptr_t address) {
    atomic_fetch_add(&hook_frees, 1);
    return OckRpcMemoryAllocatorFree(hook_alloc, address);
}

static unsigned char expected(size_t i) { return (unsigned char)(i * 7u + (i >> 10)); }

static void on_rndv(OckRpcServerRndvContext ctx, OckRpcRndvMessage msg) {
    uint64_t total = 0, bad = 0;
    for (uint16_t m = 0; m < msg.cnt; m++) {
        const unsigned char *p = msg.msg[m].data;
        for (size_t i = 0; i < msg.msg[m].len; i++) {
            bad += p[i] != expected(total + i);
        }
        total += msg.msg[m].len;
    }
    uint64_t out[2] = {total, bad};
    OckRpcMessage reply = {out, sizeof out};
    /* Counted before the reply: the client checks the count as soon as its call returns, which
       may be before this worker runs another instruction after ReplyRndv. */
    atomic_fetch_add(&handled, 1);
    CHECK_RC(OckRpcServerReplyRndv(ctx, RNDV_ID, &reply, NULL), OCK_RPC_OK);
    CHECK_RC(OckRpcServerCleanupRndvCtx(ctx), 0);
}

static OckRpcMemoryAllocator allocator_over(OckRpcMemoryRegion mr) {
    OckRpcMemoryRegionInfo info;
    CHECK_RC(OckRpcGetMemoryRegionInfo(mr, &info), OCK_RPC_OK);
    OckRpcMemoryAllocatorOptions o;
    memset(&o, 0, sizeof o);
    o.address = info.lAddress;
    o.size = info.size;
    o.minBlockSize = 4096;
    o.alignedAddress = 1;
    o.cacheTierCount = 4;
    o.cacheBlockCountPerTier = 4;
    o.cacheTierPolicy = MEM_TIER_POWER;
    OckRpcMemoryAllocator a = 0;
    CHECK_RC(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE_WITH_CACHE, &o, &a), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorSetMrKey(a, info.lKey), OCK_RPC_OK);
    return a;
}

int main(void) {
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
        {OCK_RPC_STR_WRK_THR_GRP, "1"},
        {OCK_RPC_STR_WRK_CPU_SET, "na"},
        {OCK_RPC_STR_ENABLE_SEND_RNDV, "yes"},
        {OCK_RPC_STR_RNDV_MALLOC, (const char *)(uintptr_t)&rndv_malloc},
        {OCK_RPC_STR_RNDV_MFREE, (const char *)(uintptr_t)&rndv_free},
    };
    OckRpcCreateConfig cfg = peer_config(pairs, 6);
    OckRpcServer server = 0;
    uint16_t port = 0;
    int rc = -1;
    for (int attempt = 0; attempt < 50 && rc != OCK_RPC_OK; attempt++) {
        port = (uint16_t)(20000 + ((unsigned)getpid() * 17u + (unsigned)attempt * 613u) % 30000u);
        rc = OckRpcServerCreateWithCfg("127.0.0.1", port, &server, &cfg);
    }
    CHECK_RC(rc, OCK_RPC_OK);
    OckRpcMemoryRegion hook_mr = 0, src_mr = 0;
    CHECK_RC(OckRpcRegisterMemoryRegion(server, 4 * BIG, &hook_mr), OCK_RPC_OK);
    CHECK_RC(OckRpcRegisterMemoryRegion(server, 2 * BIG, &src_mr), OCK_RPC_OK);
    hook_alloc = allocator_over(hook_mr);
    OckRpcMemoryAllocator src_alloc = allocator_over(src_mr);
    uintptr_t hook_full = 0;
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(hook_alloc, &hook_full), OCK_RPC_OK);
    OckRpcRndvService svc = {RNDV_ID, on_rndv};
    CHECK_RC(OckRpcServerAddRndvService(server, &svc), OCK_RPC_OK);
    CHECK_RC(OckRpcServerStart(server), OCK_RPC_OK);

    OckRpcClient client = connect_client(port, "no");
    uintptr_t src = 0;
    uint32_t key = 0;
    CHECK_RC(OckRpcMemoryAllocatorAllocate(src_alloc, BIG, &src, &key), OCK_RPC_OK);
    for (size_t i = 0; i < BIG; i++) {
        ((unsigned char *)src)[i] = expected(i);
    }
    for (int round = 0; round < 3; round++) {
        OckRpcMessageInfo req = {src, key, BIG};
        uint64_t out[2] = {0, 99};
        OckRpcMessage rsp = {out, sizeof out};
        CHECK_RC(OckRpcClientCallRndv(client, RNDV_ID, &req, &rsp, NULL), OCK_RPC_OK);
        CHECK(rsp.len == sizeof out && out[0] == BIG && out[1] == 0);
    }
    CHECK(atomic_load(&handled) == 3);
    /* A request naming memory outside every registered region is refused before it is sent. */
    uint64_t stack_bytes[8] = {0};
    OckRpcMessageInfo bad = {(uintptr_t)stack_bytes, key, sizeof stack_bytes};
    uint64_t out[2];
    OckRpcMessage rsp = {out, sizeof out};
    CHECK_FAILS(OckRpcClientCallRndv(client, RNDV_ID, &bad, &rsp, NULL));

    OckRpcClientDisconnect(client);
    OckRpcServerDestroy(server);
    /* Every hook allocation was freed through the hook: the free size is whole again. */
    uintptr_t now = 0;
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(hook_alloc, &now), OCK_RPC_OK);
    CHECK(atomic_load(&hook_allocs) >= 3 && atomic_load(&hook_allocs) == atomic_load(&hook_frees));
    CHECK(now == hook_full);
    CHECK_RC(OckRpcMemoryAllocatorFree(src_alloc, src), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorDestroy(src_alloc), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorDestroy(hook_alloc), OCK_RPC_OK);
    printf("alloc_rndv: ok (%d hook allocations)\n", atomic_load(&hook_allocs));
    return 0;
}
