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

static int dummy_handler(OckRpcClient c, uint64_t ctx, const char *payload)
{
    (void)c;
    (void)ctx;
    (void)payload;
    return 0;
}

static void dummy_cert(const char **path)
{
    *path = NULL;
}

/* What the reference (CBB's hcom4db.cpp) refuses at create, with its status. `quiet`: run
 * after OckRpcSetExternalLogger(NULL), so the log line is not checked. */
static void server_table(int quiet)
{
    OckRpcServer s = 0;
    RpcConfigPair tcp[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}};
    OckRpcCreateConfig cfg = make_cfg(tcp, 1);
    g_last_error[0] = '\0';
    /* a NULL config pointer, and a NULL pair array with (or without) a count */
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, NULL), OCK_RPC_ERR_INVALID_PARAM);
    cfg.configs.pairs = NULL;
    cfg.configs.size = 3;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
    cfg.configs.size = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
    cfg = make_cfg(tcp, 1);
    /* privileged listen ports */
    uint16_t privileged[] = {1, 22, 80, 1023};
    for (size_t i = 0; i < sizeof(privileged) / sizeof(privileged[0]); i++) {
        g_last_error[0] = '\0';
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", privileged[i], &s, &cfg), OCK_RPC_ERR_INVALID_PARAM);
        CHECK(quiet || strstr(g_last_error, "1024") != NULL);
    }
    CHECK_EQ(s, 0);
    /* rendezvous on without its hooks: none, only malloc, only mfree */
    {
        RpcConfigPair none[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}, {OCK_RPC_STR_ENABLE_SEND_RNDV, "yes"}};
        OckRpcCreateConfig c = make_cfg(none, 2);
        g_last_error[0] = '\0';
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &c), OCK_RPC_ERR_INVALID_PARAM);
        CHECK(quiet || (strstr(g_last_error, "server.rndv.malloc") != NULL &&
                        strstr(g_last_error, "server.rndv.mfree") != NULL));
        RpcConfigPair only_free[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
                                     {OCK_RPC_STR_ENABLE_SEND_RNDV, "yes"},
                                     {OCK_RPC_STR_RNDV_MFREE, FN_VALUE(h_twice)}};
        c = make_cfg(only_free, 3);
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &c), OCK_RPC_ERR_INVALID_PARAM);
    }
    /* a NULL value, also of a function-pointer key */
    {
        RpcConfigPair nullv[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"}, {OCK_RPC_STR_CLIENT_NEW, NULL}};
        OckRpcCreateConfig c = make_cfg(nullv, 2);
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &c), OCK_RPC_ERR_INVALID_PARAM);
        nullv[1].key = "netstack.exclusive.enable";
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &c), OCK_RPC_ERR_INVALID_PARAM);
    }
    /* TLS asked for with a callback missing (the NDP server's SSL build passes getCaAndVerify NULL) */
    {
        OckRpcCreateConfig c = make_cfg(tcp, 1);
        c.mask |= OCK_RPC_CONFIG_USE_SSL_CALLBACK;
        c.getCert = dummy_cert;
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &c), OCK_RPC_ERR_INVALID_PARAM);
    }
    CHECK_EQ(s, 0);
    /* What the reference accepts: segcount 0, the function-pointer keys, an unknown key. */
    {
        RpcConfigPair ok[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
                              {OCK_RPC_STR_PRE_SEGMENT_COUNT, "0"},
                              {OCK_RPC_STR_CLIENT_NEW, FN_VALUE(dummy_handler)},
                              {"netstack.exclusive.enable", "yes"}};
        OckRpcCreateConfig c = make_cfg(ok, 4);
        CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 1024, &s, &c), OCK_RPC_OK);
        OckRpcServerDestroy(s);
        s = 0;
    }
}

/* What the reference refuses at connect, with its status (a live server of the default name
 * listens on `port`). */
static void client_table(uint16_t port, int quiet)
{
    OckRpcClient c = 0;
    OckRpcCreateConfig dflt;
    memset(&dflt, 0, sizeof(dflt));
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, NULL), OCK_RPC_ERR_INVALID_PARAM);
    OckRpcCreateConfig nopairs = make_cfg(NULL, 5);
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &nopairs), OCK_RPC_ERR_INVALID_PARAM);
    uint16_t privileged[] = {1, 443, 1023};
    for (size_t i = 0; i < sizeof(privileged) / sizeof(privileged[0]); i++) {
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", privileged[i], &c, &dflt), OCK_RPC_ERR_INVALID_PARAM);
    }
    /* port 0: the reference tries and fails the connect */
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", 0, &c, &dflt), OCK_RPC_ERR);
    /* The client's segment keys: the reference's CallWithParam pool bounds, OCK_RPC_ERR. */
    const char *bad_seg[][2] = {
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "65536"},
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "x"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "943718401"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, ""},
    };
    for (size_t i = 0; i < sizeof(bad_seg) / sizeof(bad_seg[0]); i++) {
        RpcConfigPair p[] = {{bad_seg[i][0], bad_seg[i][1]}};
        OckRpcCreateConfig cc = make_cfg(p, 1);
        g_last_error[0] = '\0';
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &cc), OCK_RPC_ERR);
        CHECK(quiet || strstr(g_last_error, bad_seg[i][0]) != NULL);
    }
    {
        RpcConfigPair p[] = {{OCK_RPC_STR_ENABLE_SELFPOLLING, "maybe"}};
        OckRpcCreateConfig cc = make_cfg(p, 1);
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &cc), OCK_RPC_ERR_INVALID_PARAM);
    }
    CHECK_EQ(c, 0);
    /* Accepted: libcomm's client pairs (segcount 0 = no pool; the bounds themselves), and
     * server-only keys, which a client does not read (the reference ignores them there). */
    const char *ok[][2] = {
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "0"},
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "65535"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "943718400"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "4096"},
        {OCK_RPC_STR_COMMUNICATION_TYPE, "anything"},
        {OCK_RPC_STR_WRK_THR_GRP, "junk"},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        RpcConfigPair p[] = {{ok[i][0], ok[i][1]}};
        OckRpcCreateConfig cc = make_cfg(p, 1);
        OckRpcClient d = 0;
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &d, &cc), OCK_RPC_OK);
        OckRpcClientDisconnect(d);
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
        {OCK_RPC_STR_PRE_SEGMENT_COUNT, "2000000"},
        {OCK_RPC_STR_PRE_SEGMENT_SIZE, "1073741825"}, /* above 1 GiB */
        {OCK_RPC_STR_COMMUNICATION_TYPE, "hccs"},
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
    server_table(0);
    OckRpcSetExternalLogger(NULL);
    server_table(1);
    OckRpcSetExternalLogger(logger);
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
    OckRpcCreateConfig dflt;
    memset(&dflt, 0, sizeof(dflt)); /* mask 0: every key at its default */
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, NULL, &dflt), OCK_RPC_ERR_INVALID_PARAM);
    CHECK_EQ(OckRpcClientConnectWithCfg(NULL, port, &c, &dflt), OCK_RPC_ERR_INVALID_PARAM);
    {
        RpcConfigPair other[] = {{OCK_RPC_STR_SERVER_NAME, "nosuch"}};
        OckRpcCreateConfig oc = make_cfg(other, 1);
        CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &oc), OCK_RPC_ERR_INVALID_PARAM);
    }
    client_table(port, 0);
    /* The same refusals with the logger set back to the default sink (libcomm's
     * Hcom4dbSetLogFunc(NULL)): the checks do not depend on a logger. */
    OckRpcSetExternalLogger(NULL);
    client_table(port, 1);
    OckRpcSetExternalLogger(logger);
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", (uint16_t)(base + 300), &c, &dflt), OCK_RPC_ERR_CONN_UNCONNECTED);
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &dflt), OCK_RPC_OK);
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
