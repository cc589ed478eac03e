/* One-sided READ and WRITE between a client and a server of this process, over the "TCP" type:
 * the server registers a region and sends {address, key, size} in an RPC reply; the client
 * writes and reads it (single requests and SGLs, sync and with a callback) from a caller-assigned
 * region and from blocks of a memory allocator over a library-allocated region; then the bad
 * inputs of every memory-region and one-sided function, and finally remote refusals (bad rKey,
 * out of range), which return errors without crashing. */
#include "mem_peer.h"

#define REMOTE_SIZE 65536u
#define LOCAL_SIZE 65536u

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(seed * 31u + i * 7u);
    }
}

int main(void) {
    OckRpcServer server = 0;
    uint16_t port = start_server(&server, NULL, 0);
    OckRpcMemoryRegion exposed = expose_region(server, REMOTE_SIZE);
    unsigned char *remote_bytes = (unsigned char *)(uintptr_t)exposed_region.address;

    OckRpcClient client = connect_client(port, "no");
    struct wire_region remote = fetch_region(client);
    CHECK(remote.address == exposed_region.address && remote.key == exposed_region.key);
    CHECK(remote.size == REMOTE_SIZE);

    /* A caller-assigned local region. */
    unsigned char *buf = aligned_alloc(4096, LOCAL_SIZE);
    CHECK(buf != NULL);
    OckRpcMemoryRegion local = 0;
    CHECK_RC(OckRpcRegisterAssignMemoryRegion(server, (uintptr_t)buf, LOCAL_SIZE, &local), OCK_RPC_OK);
    OckRpcMemoryRegionInfo li;
    CHECK_RC(OckRpcGetMemoryRegionInfo(local, &li), OCK_RPC_OK);
    CHECK(li.lAddress == (uintptr_t)buf && li.size == LOCAL_SIZE);
    CHECK(li.lKey != exposed_region.key);

    /* Sync WRITE of 4000 bytes at remote offset 100, then READ them back elsewhere. */
    fill(buf, 4000, 1);
    OckRpcRequest w = request((uintptr_t)buf, li.lKey, remote.address + 100, remote.key, 4000);
    CHECK_RC(OckRpcWrite(client, &w, NULL), OCK_RPC_OK);
    CHECK(memcmp(remote_bytes + 100, buf, 4000) == 0);
    memset(buf + 8192, 0, 4000);
    OckRpcRequest r = request((uintptr_t)buf + 8192, li.lKey, remote.address + 100, remote.key, 4000);
    CHECK_RC(OckRpcRead(client, &r, NULL), OCK_RPC_OK);
    CHECK(memcmp(buf + 8192, buf, 4000) == 0);

    /* Async WRITE: the callback runs exactly once, with OK. */
    struct waiter wt = {0, 99};
    OckRpcCallDone done = {waiter_cb, &wt};
    fill(buf + 100, 512, 2);
    OckRpcRequest aw = request((uintptr_t)buf + 100, li.lKey, remote.address + 20000, remote.key, 512);
    CHECK_RC(OckRpcWrite(client, &aw, &done), OCK_RPC_OK);
    CHECK_RC(wait_done(&wt), OCK_RPC_OK);
    CHECK(memcmp(remote_bytes + 20000, buf + 100, 512) == 0);

    /* SGL WRITE gathering four pieces to four remote places, then an async SGL READ back. */
    OckRpcRequest iov[4];
    for (unsigned i = 0; i < 4; i++) {
        fill(buf + 16384 + i * 1024, 1000, 10 + i);
        iov[i] = request((uintptr_t)buf + 16384 + i * 1024, li.lKey, remote.address + 30000 + i * 3000,
                         remote.key, 1000);
    }
    OckRpcSglRequest sgl = {iov, 4};
    CHECK_RC(OckRpcWriteSgl(client, &sgl, NULL), OCK_RPC_OK);
    for (unsigned i = 0; i < 4; i++) {
        CHECK(memcmp(remote_bytes + 30000 + i * 3000, buf + 16384 + i * 1024, 1000) == 0);
        iov[i].lAddress = (uintptr_t)buf + 32768 + i * 1024;
    }
    memset(buf + 32768, 0, 4096);
    struct waiter ws = {0, 99};
    OckRpcCallDone sdone = {waiter_cb, &ws};
    CHECK_RC(OckRpcReadSgl(client, &sgl, &sdone), OCK_RPC_OK);
    CHECK_RC(wait_done(&ws), OCK_RPC_OK);
    for (unsigned i = 0; i < 4; i++) {
        CHECK(memcmp(buf + 32768 + i * 1024, buf + 16384 + i * 1024, 1000) == 0);
    }

    /* The allocator over a library-allocated region: its blocks carry the region's key. */
    OckRpcMemoryRegion pool = 0;
    CHECK_RC(OckRpcRegisterMemoryRegion(server, 1u << 20, &pool), OCK_RPC_OK);
    OckRpcMemoryRegionInfo pi;
    CHECK_RC(OckRpcGetMemoryRegionInfo(pool, &pi), OCK_RPC_OK);
    OckRpcMemoryAllocatorOptions ao;
    memset(&ao, 0, sizeof ao);
    ao.address = pi.lAddress;
    ao.size = pi.size;
    ao.minBlockSize = 4096;
    ao.alignedAddress = 1;
    OckRpcMemoryAllocator alloc = 0;
    CHECK_RC(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE_WITH_CACHE, &ao, &alloc), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorSetMrKey(alloc, pi.lKey), OCK_RPC_OK);
    uintptr_t blk = 0;
    uint32_t blk_key = 0;
    CHECK_RC(OckRpcMemoryAllocatorAllocate(alloc, 6000, &blk, &blk_key), OCK_RPC_OK);
    CHECK(blk_key == pi.lKey);
    OckRpcRequest ar = request(blk, blk_key, remote.address + 30000, remote.key, 6000);
    CHECK_RC(OckRpcRead(client, &ar, NULL), OCK_RPC_OK);
    CHECK(memcmp((void *)blk, remote_bytes + 30000, 6000) == 0);
    CHECK_RC(OckRpcMemoryAllocatorFree(alloc, blk), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorDestroy(alloc), OCK_RPC_OK);

    /* ---- bad inputs: errors, and the connection stays usable ---- */
    OckRpcMemoryRegion mr = 0;
    OckRpcMemoryRegionInfo info;
    CHECK_FAILS(OckRpcRegisterMemoryRegion(0, 4096, &mr));
    CHECK_FAILS(OckRpcRegisterMemoryRegion(0xdeadbeef, 4096, &mr));
    CHECK_FAILS(OckRpcRegisterMemoryRegion(server, 0, &mr));
    CHECK_FAILS(OckRpcRegisterMemoryRegion(server, 4096, NULL));
    CHECK_FAILS(OckRpcRegisterMemoryRegion(server, UINT64_MAX, &mr));
    CHECK_FAILS(OckRpcRegisterAssignMemoryRegion(server, 0, 4096, &mr));
    CHECK_FAILS(OckRpcRegisterAssignMemoryRegion(server, (uintptr_t)buf, 0, &mr));
    CHECK_FAILS(OckRpcRegisterAssignMemoryRegion(server, (uintptr_t)buf, 4096, NULL));
    CHECK_FAILS(OckRpcRegisterAssignMemoryRegion(server, UINTPTR_MAX - 10, 4096, &mr));
    CHECK_FAILS(OckRpcRegisterAssignMemoryRegion(12345, (uintptr_t)buf, 4096, &mr));
    CHECK(mr == 0);
    CHECK_FAILS(OckRpcGetMemoryRegionInfo(0, &info));
    CHECK_FAILS(OckRpcGetMemoryRegionInfo(0x1234567, &info));
    CHECK_FAILS(OckRpcGetMemoryRegionInfo(local, NULL));
    CHECK_FAILS(OckRpcGetMemoryRegionInfo((OckRpcMemoryRegion)client, &info)); /* wrong kind */
    OckRpcDestroyMemoryRegion(server, 0);                                      /* harmless */
    OckRpcDestroyMemoryRegion(server, 0xabcdef);                               /* harmless */
    OckRpcDestroyMemoryRegion(0, local);          /* no server: harmless, region stays */
    CHECK_RC(OckRpcGetMemoryRegionInfo(local, &info), OCK_RPC_OK);

    OckRpcRequest good = request((uintptr_t)buf, li.lKey, remote.address, remote.key, 64);
    OckRpcRequest bad_lkey = request((uintptr_t)buf, li.lKey ^ 0x5a5a5a00u, remote.address, remote.key, 64);
    OckRpcRequest bad_lrange = request((uintptr_t)buf + LOCAL_SIZE - 10, li.lKey, remote.address, remote.key, 64);
    OckRpcRequest unregistered = request((uintptr_t)&info, li.lKey, remote.address, remote.key, 8);
    OckRpcRequest zero = request((uintptr_t)buf, li.lKey, remote.address, remote.key, 0);
    const OckRpcRequest bad_reqs[] = {bad_lkey, bad_lrange, unregistered, zero};
    struct waiter never = {0, 99};
    OckRpcCallDone never_done = {waiter_cb, &never};
    for (unsigned i = 0; i < sizeof bad_reqs / sizeof bad_reqs[0]; i++) {
        OckRpcRequest b = bad_reqs[i];
        CHECK_RC(OckRpcRead(client, &b, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_RC(OckRpcWrite(client, &b, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_RC(OckRpcWrite(client, &b, &never_done), OCK_RPC_ERR_INVALID_PARAM);
        OckRpcRequest pair[2] = {good, b};
        OckRpcSglRequest s = {pair, 2};
        CHECK_RC(OckRpcReadSgl(client, &s, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_RC(OckRpcWriteSgl(client, &s, &never_done), OCK_RPC_ERR_INVALID_PARAM);
    }
    CHECK_FAILS(OckRpcRead(client, NULL, NULL));
    CHECK_FAILS(OckRpcWrite(client, NULL, &never_done));
    CHECK_FAILS(OckRpcReadSgl(client, NULL, NULL));
    OckRpcSglRequest empty = {iov, 0};
    CHECK_FAILS(OckRpcReadSgl(client, &empty, NULL));
    OckRpcSglRequest null_iov = {NULL, 3};
    CHECK_FAILS(OckRpcWriteSgl(client, &null_iov, NULL));
    const OckRpcClient garbage[] = {0, 1, 0xdeadbeef, (uintptr_t)&good, (OckRpcClient)local};
    for (unsigned i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        CHECK_FAILS(OckRpcRead(garbage[i], &good, NULL));
        CHECK_FAILS(OckRpcWrite(garbage[i], &good, &never_done));
        CHECK_FAILS(OckRpcReadSgl(garbage[i], &sgl, NULL));
        CHECK_FAILS(OckRpcWriteSgl(garbage[i], &sgl, &never_done));
    }
    CHECK(atomic_load(&never.calls) == 0);
    /* Still connected and working. */
    CHECK_RC(OckRpcRead(client, &good, NULL), OCK_RPC_OK);

    /* A destroyed region's key is dead locally, and the server's own region once destroyed is
     * refused by the server's NIC. */
    OckRpcDestroyMemoryRegion(server, local);
    CHECK_FAILS(OckRpcGetMemoryRegionInfo(local, &info));
    CHECK_RC(OckRpcRead(client, &good, NULL), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcDestroyMemoryRegion(server, local); /* twice: harmless */

    /* Remote refusals come back as errors (the connection may be broken by them, as on a real
     * reliable connection, so they come last, each on a fresh client). */
    CHECK_RC(OckRpcRegisterAssignMemoryRegion(server, (uintptr_t)buf, LOCAL_SIZE, &local), OCK_RPC_OK);
    CHECK_RC(OckRpcGetMemoryRegionInfo(local, &li), OCK_RPC_OK);
    OckRpcRequest bad_rkey = request((uintptr_t)buf, li.lKey, remote.address, remote.key ^ 0x77000000u, 64);
    CHECK_FAILS(OckRpcRead(client, &bad_rkey, NULL));
    OckRpcClientDisconnect(client);

    client = connect_client(port, "no");
    OckRpcRequest out_of_range =
        request((uintptr_t)buf, li.lKey, remote.address + REMOTE_SIZE - 10, remote.key, 64);
    struct waiter wr = {0, 99};
    OckRpcCallDone rdone = {waiter_cb, &wr};
    int rc = OckRpcWrite(client, &out_of_range, &rdone);
    if (rc == OCK_RPC_OK) {
        CHECK(wait_done(&wr) != OCK_RPC_OK);
    }
    OckRpcClientDisconnect(client);

    client = connect_client(port, "no");
    OckRpcDestroyMemoryRegion(server, exposed);
    OckRpcRequest gone = request((uintptr_t)buf, li.lKey, remote.address, remote.key, 64);
    CHECK_FAILS(OckRpcWrite(client, &gone, NULL));
    OckRpcClientDisconnect(client);

    OckRpcDestroyMemoryRegion(server, local);
    OckRpcDestroyMemoryRegion(server, pool);
    OckRpcServerDestroy(server);
    CHECK(atomic_load(&wt.calls) == 1 && atomic_load(&ws.calls) == 1 && atomic_load(&wr.calls) <= 1);
    free(buf);
    printf("onesided_local: ok\n");
    return 0;
}
