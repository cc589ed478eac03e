/* Hostile input: every bad value must return an error (and never crash). Run also under a
 * memory checker in CI. argv[1] = "verbs" if the library has the verbs backend. */
#include <unistd.h>
#include "util.h"

static atomic_int g_second_reply;

static void h_twice(OckRpcServerContext ctx, OckRpcMessage msg)
{
    OckRpcMessage r = {msg.data, msg.len};
    CHECK_EQ(OckRpcServerReply(ctx, 1, &r, NULL), OCK_RPC_OK);
    atomic_store(&g_second_reply, OckRpcServerReply(ctx, 1, &r, NULL));
}

static char g_last_error[1024];

static void logger(int level, const char *msg)
{
    if (level == 3) {
        snprintf(g_last_error, sizeof(g_last_error), "%s", msg);
    }
}

/* Creating with one bad pair must fail with INVALID_PARAM and a log line naming the key. */
static void bad_pair(const char *key, const char *value)
{
    RpcConfigPair pairs[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}, {key, value}};
    OckRpcCreateConfig cfg = make_cfg(pairs, 2);
    OckRpcServer s = 0;
    OckRpcStatus st = OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg);
    if (st != OCK_RPC_ERR_INVALID_PARAM) {
        fprintf(stderr, "key %s value %s: status %d, expected INVALID_PARAM\n", key, value ? value : "(null)", st);
        exit(1);
    }
    CHECK_EQ(s, 0);
    if (strstr(g_last_error, key) == NULL) {
        fprintf(stderr, "key %s: the error line does not name it: %s\n", key, g_last_error);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int has_verbs = argc > 1 && strcmp(argv[1], "verbs") == 0;
    uintptr_t garbage[] = {0, 1, 0xdeadbeef, (uintptr_t)-1, (uintptr_t)&garbage};

    OckRpcSetExternalLogger(logger);
    /* Config values. */
    char unterminated[100];
    memset(unterminated, 'a', sizeof(unterminated));
    const char *bad[][2] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, "tcp"},
        {OCK_RPC_STR_COMMUNICATION_TYPE, ""},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "abc"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "0"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "99999999999999999999"},
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "-1"},
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "0"},
        {OCK_RPC_STR_WRK_THR_GRP, "0"},
        {OCK_RPC_STR_WRK_THR_GRP, "a,b"},
        {OCK_RPC_STR_WRK_THR_GRP, ""},
        {OCK_RPC_STR_WRK_CPU_SET, "4-1"},
        {OCK_RPC_STR_WRK_CPU_SET, "x"},
        {OCK_RPC_STR_WRK_CPU_SET, "1-2,3-4"}, /* two sets for the one default group */
        {OCK_RPC_STR_ENABLE_POLL_WORKER, "maybe"},
        {OCK_RPC_STR_ENABLE_SEND_RNDV, "1"},
        {OCK_RPC_STR_HEATBEAT_IDLE, "0"},
        {OCK_RPC_STR_HEATBEAT_IDLE, "soon"},
        {OCK_RPC_STR_ENABLE_TLS, "y"},
        {OCK_RPC_STR_SERVER_PORT_RANGE, "100-200"},
        {OCK_RPC_STR_SERVER_PORT_RANGE, "5000-4000"},
        {OCK_RPC_STR_SERVER_PORT_RANGE, "4000"},
        {OCK_RPC_STR_SERVER_NAME, ""},
        {OCK_RPC_STR_ENABLE_SELFPOLLING, "si"},
        {OCK_RPC_STR_SERVER_NAME, NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        bad_pair(bad[i][0], bad[i][1]);
    }
    bad_pair(OCK_RPC_STR_SERVER_NAME, unterminated);     /* no NUL within 64 */
    bad_pair(OCK_RPC_STR_CLIENT_CREATE_INFO, unterminated);
    {
        /* rndv enabled with only one of the two hooks */
        RpcConfigPair pairs[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
                                 {OCK_RPC_STR_ENABLE_SEND_RNDV, "yes"},
                                 {OCK_RPC_STR_RNDV_MALLOC, FN_VALUE(h_twice)}};
        OckRpcCreateConfig cfg = make_cfg(pairs, 3);
        OckRpcServer s = 0;
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
    }
    OckRpcServer s = 0;
    {
        RpcConfigPair pairs[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}};
        OckRpcCreateConfig cfg = make_cfg(pairs, 1);
        cfg.configs.size = -1;
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        cfg.configs.size = 2;
        cfg.configs.pairs = NULL;
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        RpcConfigPair nokey[] = {{NULL, "x"}};
        cfg.configs.size = 1;
        cfg.configs.pairs = nokey;
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        cfg.configs.pairs = pairs;
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, NULL, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_EQ(OckRpcServerCreateWithCfg(NULL, 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_EQ(OckRpcServerCreateWithCfg("not-an-ip", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_EQ(OckRpcServerCreateWithCfg(unterminated, 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        /* Without the USE_RPC_CONFIGS bit the pairs are not read at all (even bad ones). */
        RpcConfigPair ignored[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}, {OCK_RPC_STR_PRE_SEGMENT_SIZE, "junk"}};
        OckRpcCreateConfig nomask = make_cfg(ignored, 2);
        nomask.mask = 0;
        OckRpcStatus st = OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &nomask);
        /* the default type is RDMA: no verbs in this build means RDMA_NOT_ENABLE */
        if (!has_verbs) {
            CHECK_EQ(st, OCK_RPC_ERR_RDMA_NOT_ENABLE);
        } else if (st == OCK_RPC_OK) {
            OckRpcServerDestroy(s);
        }
    }
    {
        RpcConfigPair pairs[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "UBC"}};
        OckRpcCreateConfig cfg = make_cfg(pairs, 1);
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_RDMA_NOT_ENABLE);
        if (!has_verbs) {
            pairs[0].value = "RDMA";
            CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_RDMA_NOT_ENABLE);
        }
    }

    /* A real server and client for the handle checks. */
    char range[32];
    int base = 45000 + (int)(getpid() % 15000);
    snprintf(range, sizeof(range), "%d-%d", base, base + 200);
    RpcConfigPair pairs[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}, {OCK_RPC_STR_SERVER_PORT_RANGE, range},
                             {OCK_RPC_STR_PRE_SEGMENT_SIZE, "1024"}};
    OckRpcCreateConfig cfg = make_cfg(pairs, 3);
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_OK);
    OckRpcService svc = {1, h_twice};
    CHECK_EQ(OckRpcServerAddService(s, NULL), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcService nohandler = {1, NULL};
    CHECK_EQ(OckRpcServerAddService(s, &nohandler), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcService big_id = {1000, h_twice};
    CHECK_EQ(OckRpcServerAddService(s, &big_id), OCK_RPC_ERR_INVALID_PARAM);
    big_id.id = 65535;
    CHECK_EQ(OckRpcServerAddService(s, &big_id), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcRndvService rbig = {1000, NULL};
    CHECK_EQ(OckRpcServerAddRndvService(s, &rbig), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcServerAddRndvService(s, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcServerAddService(s, &svc), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerStart(s), OCK_RPC_OK);
    char **ips;
    uint16_t *ports;
    int n;
    CHECK(OckRpcGetOobIpAndPort(s, &ips, &ports, &n));
    uint16_t port = ports[0];
    free(ips[0]);
    free(ips);
    free(ports);

    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, NULL, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientConnectWithCfg(NULL, port, &c, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", 0, &c, NULL), OCK_RPC_ERR_INVALID_PARAM);
    {
        RpcConfigPair other[] = {{OCK_RPC_STR_SERVER_NAME, "nosuch"}};
        OckRpcCreateConfig oc = make_cfg(other, 1);
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &oc), OCK_RPC_ERR_INVALID_PARAM);
    }
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", (uint16_t)(base + 300), &c, NULL), OCK_RPC_ERR_CONN_UNCONNECTED);
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, NULL), OCK_RPC_OK);
    OckRpcClientSetTimeout(c, 10000);

    /* Garbage handles of every kind, and handles of the wrong kind. */
    OckRpcMessage req = {"x", 1};
    char buf[8];
    OckRpcMessage rsp = {buf, sizeof(buf)};
    uint64_t v;
    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]) + 1; i++) {
        /* the last round: the server handle as a client and context, the client as a server */
        uintptr_t h = i < 5 ? garbage[i] : s;
        uintptr_t as_server = i < 5 ? h : c;
        uintptr_t as_client = h;
        CHECK(OckRpcServerStart(as_server) != OCK_RPC_OK);
        CHECK(OckRpcServerAddService(as_server, &svc) != OCK_RPC_OK);
        CHECK(!OckRpcGetOobIpAndPort(as_server, &ips, &ports, &n));
        CHECK(OckRpcClientCall(as_client, 1, &req, &rsp, NULL) != OCK_RPC_OK);
        CHECK(OckRpcSetUpCtx(as_client, 1) != 0);
        CHECK(OckRpcGetUpCtx(as_client, &v) != 0);
        OckRpcClientSetTimeout(as_client, 5);
        CHECK(OckRpcServerReply(h, 1, &req, NULL) != OCK_RPC_OK);
        CHECK(OckRpcServerReplyRndv(h, 1, &req, NULL) != OCK_RPC_OK);
        CHECK(OckRpcCloneCtx(h) == 0);
        OckRpcDeCloneCtx(h);
        OckRpcServerCleanupCtx(h);
        CHECK(OckRpcServerCleanupRndvCtx(h) != 0);
        OckRpcClient got;
        CHECK(OckRpcGetClient(h, &got) != 0);
        CHECK(OckRpcGetRndvClient(h, &got) != 0);
        if (i < 5) {
            OckRpcServerDestroy(h);
            OckRpcClientDisconnect(h);
            OckRpcClientDisconnectBreakHandler(h);
        }
    }

    /* Bad ids, NULLs and sizes on a live client. */
    CHECK_EQ(OckRpcClientCall(c, 1000, &req, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientCall(c, 1, NULL, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcMessage nulldata = {NULL, 5};
    CHECK_EQ(OckRpcClientCall(c, 1, &nulldata, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcGetUpCtx(c, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientCallWithParam(NULL), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcClientCallParams p;
    memset(&p, 0, sizeof(p));
    p.client = c;
    p.msgId = 1;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM); /* count 0 */
    OckRpcMessage nine[9];
    for (int i = 0; i < 9; i++) {
        nine[i] = req;
    }
    p.reqIov.count = 9;
    p.reqIov.msgs = nine;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM);
    p.reqIov.count = 2;
    p.reqIov.msgs = NULL;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM);
    char *huge = (char *)calloc(1, 4096);
    OckRpcMessage toolarge[2] = {{huge, 4096}, {"x", 1}}; /* above segsize 1024 */
    p.reqIov.msgs = toolarge;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM);
    free(huge);
    p.reqIov.msgs = nine;
    p.rspIov.count = 2;
    p.rspIov.msgs = NULL;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM);
    p.msgId = 1000;
    p.rspIov.count = 0;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcMessageInfo info = {(uintptr_t)buf, 1, 8};
    CHECK_EQ(OckRpcClientCallRndv(c, 1, &info, NULL, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientCallRndv(c, 1, NULL, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientCallRndv(c, 1, &info, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM); /* not registered */
    CHECK_EQ(OckRpcClientCallRndv(c, 1000, &info, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcMessageInfoIov iov = {0, &info};
    CHECK_EQ(OckRpcClientCallRndvIov(c, 1, &iov, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    iov.count = 5;
    CHECK_EQ(OckRpcClientCallRndvIov(c, 1, &iov, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientCallRndvIov(c, 1, NULL, &rsp, NULL), OCK_RPC_ERR_INVALID_PARAM);

    /* A request answered twice: the second reply is refused. */
    rsp.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK_EQ(atomic_load(&g_second_reply), OCK_RPC_ERR_INVALID_PARAM);

    /* Use after destroy. */
    OckRpcClientDisconnect(c);
    CHECK(OckRpcClientCall(c, 1, &req, &rsp, NULL) != OCK_RPC_OK);
    CHECK(OckRpcSetUpCtx(c, 1) != 0);
    OckRpcClientDisconnect(c);
    OckRpcServerDestroy(s);
    CHECK(OckRpcServerStart(s) != OCK_RPC_OK);
    CHECK(OckRpcServerAddService(s, &svc) != OCK_RPC_OK);
    OckRpcServerDestroy(s);
    printf("badinput ok\n");
    return 0;
}
