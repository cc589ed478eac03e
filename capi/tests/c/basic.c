/* One process, type TCP (the simulated NIC on the UDP wire): every server and client function
 * and the common config keys. Each step checks what a caller would notice. */
#include <pthread.h>
#include <unistd.h>
#include "util.h"

#define BIG (4u << 20)

/* libcomm's alias of OckRpcSetExternalLogger (exported, not in the header). */
void Hcom4dbSetLogFunc(OckRpcLogHandler h);

static atomic_int g_new, g_break, g_oneway_bytes, g_oneway_msgs, g_done, g_done_bad, g_logged_err;
static char g_payload[128];
static OckRpcClient g_last_new;

static int on_new(OckRpcClient client, uint64_t usrCtx, const char *payload)
{
    (void)usrCtx;
    snprintf(g_payload, sizeof(g_payload), "%s", payload);
    g_last_new = client;
    CHECK_EQ(OckRpcSetUpCtx(client, 42), 0); /* calls back into the library */
    atomic_fetch_add(&g_new, 1);
    return 0;
}

static int on_break(OckRpcClient client, uint64_t usrCtx, const char *payload)
{
    (void)client;
    (void)payload;
    CHECK_EQ(usrCtx, 42);
    atomic_fetch_add(&g_break, 1);
    return 0;
}

static void reply_bytes(OckRpcServerContext ctx, uint16_t id, void *data, size_t len)
{
    OckRpcMessage r = {data, len};
    CHECK_EQ(OckRpcServerReply(ctx, id, &r, NULL), OCK_RPC_OK);
}

static void h_echo(OckRpcServerContext ctx, OckRpcMessage msg)
{
    reply_bytes(ctx, 1, msg.data, msg.len);
    OckRpcServerCleanupCtx(ctx); /* deprecated; harmless */
}

static void h_oneway(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)ctx;
    atomic_fetch_add(&g_oneway_bytes, (int)msg.len);
    atomic_fetch_add(&g_oneway_msgs, 1);
}

static void h_empty(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)msg;
    char stackbuf[1];
    reply_bytes(ctx, 3, stackbuf, 0);
}

/* Reply later from another thread: clone, queue, reply with done -> DeCloneCtx. */
struct later {
    OckRpcServerContext clone;
    char data[64];
    size_t len;
};

static void later_done(OckRpcStatus st, void *arg)
{
    struct later *l = (struct later *)arg;
    CHECK_EQ(st, OCK_RPC_OK);
    OckRpcServerCleanupCtx(l->clone); /* harmless before DeClone */
    OckRpcDeCloneCtx(l->clone);
    free(l);
}

static void *later_thread(void *arg)
{
    struct later *l = (struct later *)arg;
    OckRpcMessage r = {l->data, l->len};
    OckRpcCallDone done = {later_done, l};
    CHECK_EQ(OckRpcServerReply(l->clone, 4, &r, &done), OCK_RPC_OK);
    return NULL;
}

static void h_later(OckRpcServerContext ctx, OckRpcMessage msg)
{
    struct later *l = (struct later *)calloc(1, sizeof(*l));
    l->clone = OckRpcCloneCtx(ctx);
    CHECK(l->clone != 0);
    l->len = msg.len < sizeof(l->data) ? msg.len : sizeof(l->data);
    memcpy(l->data, msg.data, l->len);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, later_thread, l), 0);
    pthread_detach(t);
}

static void h_upctx(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)msg;
    OckRpcClient c = 0;
    uint64_t v = 0;
    CHECK_EQ(OckRpcGetClient(ctx, &c), 0);
    CHECK_EQ(OckRpcGetUpCtx(c, &v), 0);
    reply_bytes(ctx, 5, &v, sizeof(v));
}

static void h_drop(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)ctx;
    (void)msg; /* never replies: the caller times out */
}

static void h_first(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)msg;
    reply_bytes(ctx, 7, "first", 5);
}

static void h_second(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)msg;
    reply_bytes(ctx, 7, "second", 6);
}

static void free_done(OckRpcStatus st, void *arg)
{
    if (st != OCK_RPC_OK) {
        atomic_fetch_add(&g_done_bad, 1);
    }
    free(arg);
    atomic_fetch_add(&g_done, 1);
}

static void logger(int level, const char *msg)
{
    if (level == 3 && strstr(msg, "1000") != NULL) {
        atomic_fetch_add(&g_logged_err, 1);
    }
}

struct async_rsp {
    OckRpcMessage rsp;
    char buf[32];
    atomic_int done;
    OckRpcStatus st;
    OckRpcClient client;
};

static void rsp_done(OckRpcStatus st, void *arg)
{
    struct async_rsp *a = (struct async_rsp *)arg;
    a->st = st;
    /* a done that calls back into the library, synchronously, on the worker thread */
    OckRpcMessage req = {"x", 1};
    OckRpcMessage rsp = {NULL, 0};
    CHECK_EQ(OckRpcClientCall(a->client, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK_EQ(rsp.len, 1);
    free(rsp.data);
    atomic_store(&a->done, 1);
}

static OckRpcServer make_server(const char *name, uint16_t port, const char *range)
{
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_SERVER_NAME, name},
        {OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
        {OCK_RPC_STR_SERVER_PORT_RANGE, range},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "65536"},
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "256"},
        {OCK_RPC_STR_WRK_THR_GRP, "1,1"},
        {OCK_RPC_STR_WRK_CPU_SET, "na,na"},
        {OCK_RPC_STR_ENABLE_POLL_WORKER, "no"},
        {OCK_RPC_STR_HEATBEAT_IDLE, "1"},
        {OCK_RPC_STR_ENABLE_TLS, "no"},
        {OCK_RPC_STR_CLIENT_NEW, FN_VALUE(on_new)},
        {OCK_RPC_STR_CLIENT_BREAK, FN_VALUE(on_break)},
        {"netstack.exclusive.enable", "yes"}, /* unknown: ignored */
    };
    OckRpcCreateConfig cfg = make_cfg(pairs, (int)(sizeof(pairs) / sizeof(pairs[0])));
    OckRpcServer s = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", port, &s, &cfg), OCK_RPC_OK);
    return s;
}

static OckRpcClient connect_to(uint16_t port)
{
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_CLIENT_CREATE_INFO, "hello-test"},
        {OCK_RPC_STR_ENABLE_SELFPOLLING, "no"},
    };
    OckRpcCreateConfig cfg = make_cfg(pairs, 2);
    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &cfg), OCK_RPC_OK);
    OckRpcClientSetTimeout(c, 20000);
    return c;
}

static uint16_t server_port(OckRpcServer s)
{
    char **ips = NULL;
    uint16_t *ports = NULL;
    int n = 0;
    CHECK(OckRpcGetOobIpAndPort(s, &ips, &ports, &n));
    CHECK_EQ(n, 1);
    CHECK(strcmp(ips[0], "127.0.0.1") == 0);
    uint16_t p = ports[0];
    free(ips[0]);
    free(ips);
    free(ports);
    return p;
}

int main(void)
{
    OckRpcDisableSecureHmac();
    CHECK_EQ(OckRpcServerCtxBuilderThreadLocal(0), 0);
    OckRpcServerCtxCleanupThreadLocal(0, 0);

    char range[32];
    int base = 20000 + (int)(getpid() % 20000);
    snprintf(range, sizeof(range), "%d-%d", base, base + 500);
    OckRpcServer s = make_server("service", 0, range);
    OckRpcService services[] = {{1, h_echo}, {2, h_oneway}, {3, h_empty}, {4, h_later}, {5, h_upctx}, {10, h_drop}};
    for (size_t i = 0; i < sizeof(services) / sizeof(services[0]); i++) {
        CHECK_EQ(OckRpcServerAddService(s, &services[i]), OCK_RPC_OK);
    }
    CHECK(!OckRpcGetOobIpAndPort(s, NULL, NULL, NULL));
    CHECK_EQ(OckRpcServerStart(s), OCK_RPC_OK);
    uint16_t port = server_port(s);
    CHECK(port >= base && port <= base + 500);

    OckRpcClient c = connect_to(port);
    CHECK(wait_at_least(&g_new, 1, 10));
    CHECK(strcmp(g_payload, "hello-test") == 0);

    /* Library-allocated reply. */
    OckRpcMessage req = {"ping", 4};
    OckRpcMessage rsp = {NULL, 0};
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK_EQ(rsp.len, 4);
    CHECK(memcmp(rsp.data, "ping", 4) == 0);
    free(rsp.data);

    /* Caller buffer: len becomes the actual length; too small is an error, not an overflow. */
    char buf[16];
    memset(buf, 'z', sizeof(buf));
    OckRpcMessage rb = {buf, sizeof(buf)};
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rb, NULL), OCK_RPC_OK);
    CHECK_EQ(rb.len, 4);
    CHECK(memcmp(buf, "ping", 4) == 0 && buf[4] == 'z');
    char small[2] = {'q', 'q'};
    OckRpcMessage rs = {small, 2};
    CHECK(OckRpcClientCall(c, 1, &req, &rs, NULL) != OCK_RPC_OK);
    CHECK(small[0] == 'q' && small[1] == 'q');

    /* One-way, synchronous and asynchronous (done frees the buffer). */
    OckRpcMessage ow = {"abc", 3};
    CHECK_EQ(OckRpcClientCall(c, 2, &ow, NULL, NULL), OCK_RPC_OK);
    enum { N = 200 };
    for (int i = 0; i < N; i++) {
        char *b = (char *)malloc(100);
        memset(b, i, 100);
        OckRpcMessage m = {b, 100};
        OckRpcCallDone d = {free_done, b};
        OckRpcStatus st;
        while ((st = OckRpcClientCall(c, 2, &m, NULL, &d)) != OCK_RPC_OK) {
            /* no credit right now: retry, as libcomm does */
            CHECK(st != OCK_RPC_ERR_INVALID_PARAM);
        }
    }
    CHECK(wait_at_least(&g_done, N, 20));
    CHECK_EQ(g_done_bad, 0);
    CHECK(wait_at_least(&g_oneway_msgs, N + 1, 20));
    CHECK_EQ(g_oneway_bytes, 3 + 100 * N);

    /* Async with a response; done calls back into the library. */
    struct async_rsp *a = (struct async_rsp *)calloc(1, sizeof(*a));
    a->rsp.data = a->buf;
    a->rsp.len = sizeof(a->buf);
    a->client = c;
    OckRpcCallDone ad = {rsp_done, a};
    OckRpcMessage hi = {"async", 5};
    CHECK_EQ(OckRpcClientCall(c, 1, &hi, &a->rsp, &ad), OCK_RPC_OK);
    CHECK(wait_at_least(&a->done, 1, 20));
    CHECK_EQ(a->st, OCK_RPC_OK);
    CHECK_EQ(a->rsp.len, 5);
    CHECK(memcmp(a->buf, "async", 5) == 0);
    free(a);

    /* CallWithParam: 4 buffers arrive as one message (the echo returns the concatenation). */
    char hdr[64];
    memset(hdr, 'H', sizeof(hdr));
    OckRpcMessage parts[4] = {{hdr, 64}, {"one", 3}, {"", 0}, {"two", 3}};
    char cat[128];
    OckRpcMessage crsp = {cat, sizeof(cat)};
    OckRpcClientCallParams p;
    memset(&p, 0, sizeof(p));
    p.client = c;
    p.msgId = 1;
    p.reqIov.count = 4;
    p.reqIov.msgs = parts;
    p.rspIov.count = 1;
    p.rspIov.msgs = &crsp;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_OK);
    CHECK_EQ(crsp.len, 70);
    CHECK(memcmp(cat, hdr, 64) == 0 && memcmp(cat + 64, "onetwo", 6) == 0);
    /* rspIov count 0: no response; msgs may be NULL. */
    p.msgId = 2;
    p.rspIov.count = 0;
    p.rspIov.msgs = NULL;
    int before = atomic_load(&g_oneway_msgs);
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_OK);
    CHECK(wait_at_least(&g_oneway_msgs, before + 1, 20));

    /* Zero-length replies, into a caller buffer and library-allocated. */
    OckRpcMessage z = {buf, sizeof(buf)};
    CHECK_EQ(OckRpcClientCall(c, 3, &req, &z, NULL), OCK_RPC_OK);
    CHECK_EQ(z.len, 0);
    OckRpcMessage zm = {NULL, 0};
    CHECK_EQ(OckRpcClientCall(c, 3, &req, &zm, NULL), OCK_RPC_OK);
    CHECK_EQ(zm.len, 0);
    free(zm.data);

    /* Reply from another thread through a cloned context. */
    OckRpcMessage lr = {buf, sizeof(buf)};
    OckRpcMessage lq = {"later", 5};
    CHECK_EQ(OckRpcClientCall(c, 4, &lq, &lr, NULL), OCK_RPC_OK);
    CHECK_EQ(lr.len, 5);
    CHECK(memcmp(buf, "later", 5) == 0);

    /* GetClient + GetUpCtx in the handler see what the new-client handler set. */
    uint64_t v = 0;
    OckRpcMessage vr = {&v, sizeof(v)};
    CHECK_EQ(OckRpcClientCall(c, 5, &req, &vr, NULL), OCK_RPC_OK);
    CHECK_EQ(v, 42);
    /* The client side's own up context. */
    CHECK_EQ(OckRpcSetUpCtx(c, 7), 0);
    CHECK_EQ(OckRpcGetUpCtx(c, &v), 0);
    CHECK_EQ(v, 7);

    /* 4 MiB each way (rendezvous under the hood). */
    char *big = (char *)malloc(BIG);
    char *back = (char *)malloc(BIG);
    for (size_t i = 0; i < BIG; i++) {
        big[i] = (char)(i * 7 + 3);
    }
    OckRpcMessage bq = {big, BIG};
    OckRpcMessage br = {back, BIG};
    CHECK_EQ(OckRpcClientCall(c, 1, &bq, &br, NULL), OCK_RPC_OK);
    CHECK_EQ(br.len, BIG);
    CHECK(memcmp(big, back, BIG) == 0);
    free(big);
    free(back);

    /* A service added after Start; the same id replaces it. */
    OckRpcService late = {7, h_first};
    CHECK_EQ(OckRpcServerAddService(s, &late), OCK_RPC_OK);
    OckRpcMessage lt = {buf, sizeof(buf)};
    CHECK_EQ(OckRpcClientCall(c, 7, &req, &lt, NULL), OCK_RPC_OK);
    CHECK(lt.len == 5 && memcmp(buf, "first", 5) == 0);
    late.handler = h_second;
    CHECK_EQ(OckRpcServerAddService(s, &late), OCK_RPC_OK);
    lt.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c, 7, &req, &lt, NULL), OCK_RPC_OK);
    CHECK(lt.len == 6 && memcmp(buf, "second", 6) == 0);

    /* Timeouts in ms, per client: a handler that never replies; an id with no service. */
    OckRpcClientSetTimeout(c, 150);
    double t0 = now_s();
    OckRpcMessage tr = {buf, sizeof(buf)};
    CHECK_EQ(OckRpcClientCall(c, 10, &req, &tr, NULL), OCK_RPC_ERR_UCP_TIMEOUT);
    double took = now_s() - t0;
    CHECK(took >= 0.1 && took < 5.0);
    CHECK_EQ(OckRpcClientCall(c, 11, &req, &tr, NULL), OCK_RPC_ERR_UCP_TIMEOUT);
    OckRpcClientSetTimeout(c, 0);
    CHECK(OckRpcClientCall(c, 10, &req, &tr, NULL) != OCK_RPC_OK);
    OckRpcClientSetTimeout(c, -1);
    tr.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &tr, NULL), OCK_RPC_OK);

    /* The external logger gets level-3 lines (a bad id names itself). */
    OckRpcSetExternalLogger(logger);
    CHECK_EQ(OckRpcClientCall(c, 1000, &req, &tr, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(g_logged_err, 1);
    Hcom4dbSetLogFunc(NULL);
    CHECK_EQ(OckRpcClientCall(c, 1000, &req, &tr, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(g_logged_err, 1);

    /* A client with the defaults (self-polling yes): async calls still complete, on the worker. */
    {
        OckRpcClient d = 0;
        OckRpcCreateConfig defaults;
        memset(&defaults, 0, sizeof(defaults)); /* mask 0: every key at its default */
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &d, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &d, &defaults), OCK_RPC_OK);
        CHECK(wait_at_least(&g_new, 2, 10));
        CHECK(strcmp(g_payload, "hello") == 0); /* the default client.create.info */
        int before_done = atomic_load(&g_done);
        char *b = (char *)malloc(10);
        memcpy(b, "selfpolled", 10);
        OckRpcMessage m = {b, 10};
        OckRpcCallDone fd = {free_done, b};
        CHECK_EQ(OckRpcClientCall(d, 2, &m, NULL, &fd), OCK_RPC_OK);
        CHECK(wait_at_least(&g_done, before_done + 1, 20));
        OckRpcClientDisconnect(d);
        CHECK(wait_at_least(&g_break, 1, 20));
        atomic_store(&g_break, 0);
    }

    /* Disconnect: the server's break handler runs with the up context; the handle is gone. */
    OckRpcClientDisconnect(c);
    CHECK(wait_at_least(&g_break, 1, 20));
    CHECK(OckRpcClientCall(c, 1, &req, &tr, NULL) != OCK_RPC_OK);
    CHECK(OckRpcSetUpCtx(g_last_new, 1) != 0); /* the server-side handle ended with the break */

    /* Reconnect after a server restarts on the same port. */
    OckRpcServer s2 = make_server("second", 0, range);
    CHECK_EQ(OckRpcServerAddService(s2, &services[0]), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerStart(s2), OCK_RPC_OK);
    uint16_t p2 = server_port(s2);
    OckRpcClient c2 = connect_to(p2);
    tr.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c2, 1, &req, &tr, NULL), OCK_RPC_OK);
    OckRpcServerDestroy(s2);
    OckRpcClientSetTimeout(c2, 2000);
    tr.len = sizeof(buf);
    CHECK(OckRpcClientCall(c2, 1, &req, &tr, NULL) != OCK_RPC_OK);
    OckRpcClientDisconnect(c2);
    s2 = make_server("second", p2, range);
    CHECK_EQ(OckRpcServerAddService(s2, &services[0]), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerStart(s2), OCK_RPC_OK);
    CHECK_EQ(server_port(s2), p2);
    c2 = connect_to(p2);
    tr.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c2, 1, &req, &tr, NULL), OCK_RPC_OK);
    CHECK(tr.len == 4 && memcmp(buf, "ping", 4) == 0);
    OckRpcClientDisconnect(c2);
    OckRpcServerDestroy(s2);

    OckRpcServerDestroy(s);
    CHECK_EQ(OckRpcServerStart(s), OCK_RPC_ERR_INVALID_PARAM); /* use after destroy */
    printf("basic ok\n");
    return 0;
}
