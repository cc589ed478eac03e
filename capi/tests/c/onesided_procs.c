/* One-sided READ and WRITE between two processes over the "TCP" type (or $CAPI_COMM_TYPE).
 *
 *   onesided_procs server          prints "port N", serves until a client sends QUIT
 *   onesided_procs client PORT     reads the server's pattern, writes its own, has it checked
 *
 * The server registers a region, fills it with a pattern and sends {address, key, size} to the
 * client in an RPC reply; the client READs the pattern into a block of a memory allocator over
 * a library-allocated region, WRITEs another pattern back, and asks the server (CHECK_PATTERN)
 * whether its memory now holds it. */
#include "mem_peer.h"

#define SIZE 65536u
#define SPLIT 8192u

static atomic_int quit;

static unsigned char pattern(unsigned seed, size_t i) { return (unsigned char)(seed * 131u + i * 13u + (i >> 8)); }

static void on_check(OckRpcServerContext ctx, OckRpcMessage msg) {
    (void)msg;
    const unsigned char *p = (const unsigned char *)(uintptr_t)exposed_region.address;
    unsigned char ok = 1;
    for (size_t i = SPLIT; i < SIZE; i++) {
        ok &= p[i] == pattern(9, i);
    }
    OckRpcMessage reply = {&ok, 1};
    CHECK_RC(OckRpcServerReply(ctx, CHECK_PATTERN, &reply, NULL), OCK_RPC_OK);
    OckRpcServerCleanupCtx(ctx);
}

static void on_quit(OckRpcServerContext ctx, OckRpcMessage msg) {
    (void)msg;
    OckRpcMessage reply = {"", 0};
    CHECK_RC(OckRpcServerReply(ctx, QUIT, &reply, NULL), OCK_RPC_OK);
    OckRpcServerCleanupCtx(ctx);
    atomic_store(&quit, 1);
}

static int serve(void) {
    OckRpcServer server = 0;
    OckRpcService extra[] = {{CHECK_PATTERN, on_check}, {QUIT, on_quit}};
    uint16_t port = start_server(&server, extra, 2);
    OckRpcMemoryRegion mr = expose_region(server, SIZE);
    unsigned char *p = (unsigned char *)(uintptr_t)exposed_region.address;
    for (size_t i = 0; i < SIZE; i++) {
        p[i] = pattern(5, i);
    }
    printf("port %u\n", port);
    fflush(stdout);
    uint64_t deadline = mono_ms() + 60000;
    while (!atomic_load(&quit)) {
        CHECK(mono_ms() < deadline);
        usleep(1000);
    }
    OckRpcDestroyMemoryRegion(server, mr);
    OckRpcServerDestroy(server);
    printf("server: ok\n");
    return 0;
}

static int client(uint16_t port) {
    /* The client side needs a server of its own in this process (the API's rule for connect);
     * it also owns the local region. */
    OckRpcServer own = 0;
    start_server(&own, NULL, 0);
    OckRpcClient c = connect_client(port, "no");
    struct wire_region remote = fetch_region(c);
    CHECK(remote.size == SIZE);

    OckRpcMemoryRegion pool = 0;
    CHECK_RC(OckRpcRegisterMemoryRegion(own, 4 * SIZE, &pool), OCK_RPC_OK);
    OckRpcMemoryRegionInfo pi;
    CHECK_RC(OckRpcGetMemoryRegionInfo(pool, &pi), OCK_RPC_OK);
    OckRpcMemoryAllocatorOptions ao;
    memset(&ao, 0, sizeof ao);
    ao.address = pi.lAddress;
    ao.size = pi.size;
    ao.minBlockSize = 4096;
    ao.alignedAddress = 1;
    OckRpcMemoryAllocator alloc = 0;
    CHECK_RC(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, &ao, &alloc), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorSetMrKey(alloc, pi.lKey), OCK_RPC_OK);
    uintptr_t blk = 0;
    uint32_t key = 0;
    CHECK_RC(OckRpcMemoryAllocatorAllocate(alloc, SIZE, &blk, &key), OCK_RPC_OK);
    unsigned char *b = (unsigned char *)blk;

    /* READ the server's pattern: the first part sync, the rest as an async SGL. */
    OckRpcRequest r = request(blk, key, remote.address, remote.key, SPLIT);
    CHECK_RC(OckRpcRead(c, &r, NULL), OCK_RPC_OK);
    OckRpcRequest iov[2] = {
        request(blk + SPLIT, key, remote.address + SPLIT, remote.key, (SIZE - SPLIT) / 2),
        request(blk + SPLIT + (SIZE - SPLIT) / 2, key, remote.address + SPLIT + (SIZE - SPLIT) / 2,
                remote.key, (SIZE - SPLIT) / 2),
    };
    OckRpcSglRequest sgl = {iov, 2};
    struct waiter w = {0, 99};
    OckRpcCallDone done = {waiter_cb, &w};
    CHECK_RC(OckRpcReadSgl(c, &sgl, &done), OCK_RPC_OK);
    CHECK_RC(wait_done(&w), OCK_RPC_OK);
    for (size_t i = 0; i < SIZE; i++) {
        CHECK(b[i] == pattern(5, i));
    }

    /* WRITE a new pattern over all but the first part, have the server check it. */
    for (size_t i = SPLIT; i < SIZE; i++) {
        b[i] = pattern(9, i);
    }
    OckRpcRequest wr = request(blk + SPLIT, key, remote.address + SPLIT, remote.key, SIZE - SPLIT);
    CHECK_RC(OckRpcWrite(c, &wr, NULL), OCK_RPC_OK);
    OckRpcMessage req = {"?", 1};
    unsigned char ok = 0;
    OckRpcMessage rsp = {&ok, 1};
    CHECK_RC(OckRpcClientCall(c, CHECK_PATTERN, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK(rsp.len == 1 && ok == 1);

    /* A key the server never issued is refused by the server's NIC. */
    OckRpcRequest bad = request(blk, key, remote.address, remote.key + 0x100, 64);
    CHECK_FAILS(OckRpcRead(c, &bad, NULL));
    OckRpcClientDisconnect(c);

    c = connect_client(port, "no");
    char empty[1];
    OckRpcMessage qrsp = {empty, sizeof empty};
    CHECK_RC(OckRpcClientCall(c, QUIT, &req, &qrsp, NULL), OCK_RPC_OK);
    OckRpcClientDisconnect(c);
    CHECK_RC(OckRpcMemoryAllocatorFree(alloc, blk), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorDestroy(alloc), OCK_RPC_OK);
    OckRpcDestroyMemoryRegion(own, pool);
    OckRpcServerDestroy(own);
    CHECK(atomic_load(&w.calls) == 1);
    printf("client: ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "server") == 0) {
        return serve();
    }
    if (argc == 3 && strcmp(argv[1], "client") == 0) {
        return client((uint16_t)atoi(argv[2]));
    }
    fprintf(stderr, "usage: onesided_procs server | client PORT\n");
    return 2;
}
