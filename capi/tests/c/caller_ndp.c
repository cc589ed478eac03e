/* Shaped like openGauss's NDP plugin (src/common/component/rpc/rpc.cpp): the storage side runs
 * a server (type "TCP", its name, segsize 16 MiB, four workers; $CAPI_COMM_TYPE overrides the
 * type) whose IO handler clones its context and queues the work to a pool of worker threads,
 * which reply later with a `done` that de-clones the context (and call OckRpcServerCleanupCtx
 * on the clone after the reply); its admin handler replies at once from a stack buffer. The
 * compute side creates a server of the same name and starts it (a client needs one), connects
 * with self-polling "no" and a 60 s reply timeout, and sends admin calls and async IO requests
 * into preallocated 4 MiB responses (some empty, some error-sized). A segment-sized (16 MiB)
 * request, reply and one-way message cross too.
 *
 *   caller_ndp one RANGE            both sides in one process (two servers)
 *   caller_ndp server RANGE         the storage side: prints "PORT n", serves until stdin closes
 *   caller_ndp client PORT RANGE    the compute side
 */
#include <pthread.h>
#include <unistd.h>
#include "util.h"

#define RPC_ADMIN_REQ 0
#define RPC_IO_REQ 1
#define RPC_BIG_REQ 2
#define RPC_BIG_ONEWAY 3
#define SEGMENT (16u << 20)
#define RESPONSE_MAX (4u << 20)
#define IO_CALLS 12
#define IO_WINDOW 4
#define POOL_THREADS 2

struct io_request {
    uint32_t task_id;
    uint32_t pages; /* the response holds `pages` 8 KiB pages; 0: an empty reply */
};

struct io_task {
    OckRpcServerContext handle;
    struct io_request req;
    struct io_task *next;
    void *reply; /* freed when the reply's done runs */
};

/* The worker pool (NDP's globalWorkerManager). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static struct io_task *g_head, *g_tail;
static int g_stop;
static pthread_t g_pool[POOL_THREADS];
static atomic_int g_replied, g_big_oneway, g_bad;

static unsigned char byte_of(uint32_t task, uint32_t i)
{
    return (unsigned char)(task * 13 + i);
}

static void server_call_done(OckRpcStatus status, void *arg)
{
    struct io_task *t = arg;
    if (status != OCK_RPC_OK) {
        atomic_fetch_add(&g_bad, 1);
    }
    OckRpcDeCloneCtx(t->handle);
    free(t->reply);
    free(t);
    atomic_fetch_add(&g_replied, 1);
}

static void *pool_worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        while (g_head == NULL && !g_stop) {
            pthread_cond_wait(&g_cond, &g_lock);
        }
        struct io_task *t = g_head;
        if (t == NULL) {
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
        g_head = t->next;
        if (g_head == NULL) {
            g_tail = NULL;
        }
        pthread_mutex_unlock(&g_lock);
        size_t len = (size_t)t->req.pages * 8192;
        OckRpcMessage reply = {NULL, len};
        if (len > 0) {
            t->reply = malloc(len);
            CHECK(t->reply != NULL);
            memset(t->reply, 0, len); /* the pages NDP reads; marked every 4 KiB */
            for (size_t i = 0; i < len; i += 4096) {
                ((unsigned char *)t->reply)[i] = byte_of(t->req.task_id, (uint32_t)i);
            }
            reply.data = t->reply;
        }
        OckRpcServerContext h = t->handle;
        OckRpcCallDone done = {server_call_done, t};
        CHECK_EQ(OckRpcServerReply(h, RPC_IO_REQ, &reply, &done), OCK_RPC_OK);
        OckRpcServerCleanupCtx(h); /* on the clone, after the reply: harmless */
    }
}

static void rpc_io_proc(OckRpcServerContext handle, OckRpcMessage msg)
{
    OckRpcServerContext c = OckRpcCloneCtx(handle);
    CHECK(c != 0);
    struct io_task *t = calloc(1, sizeof(*t));
    CHECK(t != NULL);
    t->handle = c;
    CHECK_EQ(msg.len, sizeof(t->req));
    memcpy(&t->req, msg.data, sizeof(t->req));
    pthread_mutex_lock(&g_lock);
    if (g_tail != NULL) {
        g_tail->next = t;
    } else {
        g_head = t;
    }
    g_tail = t;
    pthread_cond_signal(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

static void rpc_admin_proc(OckRpcServerContext handle, OckRpcMessage msg)
{
    int resp[4] = {0, (int)msg.len, 0, 0};
    OckRpcMessage reply = {resp, 2 * sizeof(int)}; /* only the leading fields, as NDP */
    CHECK_EQ(OckRpcServerReply(handle, RPC_ADMIN_REQ, &reply, NULL), OCK_RPC_OK);
    OckRpcServerCleanupCtx(handle);
}

/* A segment-sized request: checked, answered with a segment-sized reply. */
static void rpc_big_proc(OckRpcServerContext handle, OckRpcMessage msg)
{
    int ok = msg.len == SEGMENT;
    for (size_t i = 0; ok && i < msg.len; i += 4099) {
        ok = ((unsigned char *)msg.data)[i] == (unsigned char)(i % 251);
    }
    if (!ok) {
        atomic_fetch_add(&g_bad, 1);
    }
    OckRpcMessage reply = {msg.data, msg.len}; /* echo */
    CHECK_EQ(OckRpcServerReply(handle, RPC_BIG_REQ, &reply, NULL), OCK_RPC_OK);
}

static void rpc_big_oneway(OckRpcServerContext handle, OckRpcMessage msg)
{
    (void)handle;
    int ok = msg.len == SEGMENT && ((unsigned char *)msg.data)[SEGMENT - 1] == 0x5a;
    if (!ok) {
        atomic_fetch_add(&g_bad, 1);
    }
    atomic_fetch_add(&g_big_oneway, 1);
}

static const char *type_of(void)
{
    const char *t = getenv("CAPI_COMM_TYPE");
    return t != NULL && t[0] != '\0' ? t : "TCP";
}

/* InitRpcServer / RpcClientInit: the four pairs (+ the test's port range). */
static OckRpcServer ndp_server(const char *range)
{
    OckRpcCreateConfig cfg;
    cfg.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    RpcConfigPair pairs[5];
    cfg.configs.size = 5;
    cfg.configs.pairs = pairs;
    pairs[0] = (RpcConfigPair){"server.create.type", type_of()};
    pairs[1] = (RpcConfigPair){"server.create.name", "ndp_hcom"};
    pairs[2] = (RpcConfigPair){"server.create.segsize", "16777216"};
    pairs[3] = (RpcConfigPair){"worker.thread.groups", "4"};
    pairs[4] = (RpcConfigPair){"server.create.range", range};
    OckRpcServer s = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_OK);
    return s;
}

static OckRpcServer storage_start(const char *range)
{
    OckRpcServer s = ndp_server(range);
    OckRpcService admin = {RPC_ADMIN_REQ, rpc_admin_proc}, io = {RPC_IO_REQ, rpc_io_proc};
    OckRpcService big = {RPC_BIG_REQ, rpc_big_proc}, oneway = {RPC_BIG_ONEWAY, rpc_big_oneway};
    CHECK_EQ(OckRpcServerAddService(s, &admin), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerAddService(s, &io), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerAddService(s, &big), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerAddService(s, &oneway), OCK_RPC_OK);
    for (int i = 0; i < POOL_THREADS; i++) {
        CHECK_EQ(pthread_create(&g_pool[i], NULL, pool_worker, NULL), 0);
    }
    CHECK_EQ(OckRpcServerStart(s), OCK_RPC_OK);
    return s;
}

static void storage_stop(OckRpcServer s)
{
    pthread_mutex_lock(&g_lock);
    g_stop = 1;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < POOL_THREADS; i++) {
        pthread_join(g_pool[i], NULL);
    }
    OckRpcServerDestroy(s);
}

static uint16_t port_of(OckRpcServer s)
{
    char **ips;
    uint16_t *ports;
    int n;
    CHECK(OckRpcGetOobIpAndPort(s, &ips, &ports, &n));
    uint16_t port = ports[0];
    free(ips[0]);
    free(ips);
    free(ports);
    return port;
}

struct io_call {
    struct io_request req;
    OckRpcMessage rsp;
    atomic_int status; /* 1 + status once done */
};

static atomic_int g_io_done;

static void io_done(OckRpcStatus status, void *arg)
{
    struct io_call *c = arg;
    atomic_store(&c->status, 1 + (int)status);
    atomic_fetch_add(&g_io_done, 1);
}

static void compute_side(uint16_t port, const char *range)
{
    /* RpcClientInit: a server of the same name, started, for the client's device. */
    OckRpcServer local = ndp_server(range);
    CHECK_EQ(OckRpcServerStart(local), OCK_RPC_OK);
    OckRpcCreateConfig cfg;
    cfg.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    RpcConfigPair pairs[2];
    cfg.configs.size = 2;
    cfg.configs.pairs = pairs;
    pairs[0] = (RpcConfigPair){"server.create.name", "ndp_hcom"};
    pairs[1] = (RpcConfigPair){"client.enable.selfpolling", "no"};
    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &cfg), OCK_RPC_OK);
    OckRpcClientSetTimeout(c, 60000);

    /* RpcSendAdminReq */
    char admin[40] = "admin";
    int resp[4] = {-1, -1, -1, -1};
    OckRpcMessage req = {admin, sizeof(admin)}, rsp = {resp, sizeof(resp)};
    CHECK_EQ(OckRpcClientCall(c, RPC_ADMIN_REQ, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK_EQ(rsp.len, 2 * sizeof(int));
    CHECK_EQ(resp[1], sizeof(admin));

    /* RpcSendIOReq: async into preallocated 4 MiB responses */
    struct io_call *calls = calloc(IO_CALLS, sizeof(*calls));
    CHECK(calls != NULL);
    for (int i = 0; i < IO_CALLS; i++) {
        calls[i].req.task_id = (uint32_t)i;
        calls[i].req.pages = (uint32_t)(i % 4 == 0 ? 0 : (i * 37) % (RESPONSE_MAX / 8192) + 1);
        calls[i].rsp.data = malloc(RESPONSE_MAX);
        CHECK(calls[i].rsp.data != NULL);
        calls[i].rsp.len = RESPONSE_MAX;
        OckRpcMessage r = {&calls[i].req, sizeof(calls[i].req)};
        OckRpcCallDone done = {io_done, &calls[i]};
        /* at most IO_WINDOW requests in flight (a scan's prefetch depth): 12 responses of up to
         * 4 MiB at once sometimes overran the simulator's UDP wire on a loaded machine (its retries
         * ran out and the connection broke) */
        CHECK(wait_at_least(&g_io_done, i - IO_WINDOW + 1, 120));
        CHECK_EQ(OckRpcClientCall(c, RPC_IO_REQ, &r, &calls[i].rsp, &done), OCK_RPC_OK);
    }
    CHECK(wait_at_least(&g_io_done, IO_CALLS, 120));
    for (int i = 0; i < IO_CALLS; i++) {
        CHECK_EQ(atomic_load(&calls[i].status), 1 + OCK_RPC_OK);
        size_t want = (size_t)calls[i].req.pages * 8192;
        CHECK_EQ(calls[i].rsp.len, want);
        for (size_t k = 0; k < want; k += 4096) {
            CHECK_EQ(((unsigned char *)calls[i].rsp.data)[k], byte_of((uint32_t)i, (uint32_t)k));
        }
        free(calls[i].rsp.data);
    }
    free(calls);

    /* A segment-sized request and reply (library-malloc'd), and a segment-sized one-way. */
    unsigned char *big = malloc(SEGMENT);
    CHECK(big != NULL);
    for (size_t i = 0; i < SEGMENT; i++) {
        big[i] = (unsigned char)(i % 251);
    }
    OckRpcMessage breq = {big, SEGMENT}, brsp = {NULL, 0};
    CHECK_EQ(OckRpcClientCall(c, RPC_BIG_REQ, &breq, &brsp, NULL), OCK_RPC_OK);
    CHECK_EQ(brsp.len, SEGMENT);
    CHECK(memcmp(brsp.data, big, SEGMENT) == 0);
    free(brsp.data);
    big[SEGMENT - 1] = 0x5a;
    CHECK_EQ(OckRpcClientCall(c, RPC_BIG_ONEWAY, &breq, NULL, NULL), OCK_RPC_OK);
    /* one more than a segment is refused by CallWithParam's per-buffer check */
    OckRpcMessage over[1] = {{big, (size_t)SEGMENT + 1}};
    OckRpcClientCallParams p;
    memset(&p, 0, sizeof(p));
    p.client = c;
    p.msgId = RPC_BIG_ONEWAY;
    p.reqIov.count = 1;
    p.reqIov.msgs = over;
    free(big);
    big = calloc(1, (size_t)SEGMENT + 1);
    CHECK(big != NULL);
    over[0].data = big;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM);
    free(big);

    OckRpcClientDisconnect(c);
    OckRpcServerDestroy(local);
    printf("compute side ok\n");
}

static void storage_check(void)
{
    CHECK(wait_at_least(&g_replied, IO_CALLS, 60));
    CHECK(wait_at_least(&g_big_oneway, 1, 60));
    CHECK_EQ(atomic_load(&g_bad), 0);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3);
    if (strcmp(argv[1], "one") == 0) {
        OckRpcServer s = storage_start(argv[2]);
        compute_side(port_of(s), argv[2]);
        storage_check();
        storage_stop(s);
        printf("ndp one ok\n");
    } else if (strcmp(argv[1], "server") == 0) {
        OckRpcServer s = storage_start(argv[2]);
        printf("PORT %u\n", (unsigned)port_of(s));
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof(buf)) > 0) {
        }
        storage_check();
        storage_stop(s);
        printf("ndp server ok\n");
    } else {
        CHECK(argc == 4);
        compute_side((uint16_t)atoi(argv[2]), argv[3]);
        printf("ndp client ok\n");
    }
    return 0;
}
