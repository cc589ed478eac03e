/* Two processes over the TCP type (or $CAPI_COMM_TYPE, e.g. UBC). `proc server LOW-HIGH` serves echo (id 1) and a one-way
 * counter (id 2, whose total it prints at the end) until stdin closes; `proc client PORT` talks
 * to it and exits. */
#include <unistd.h>
#include "util.h"

static atomic_int g_msgs, g_done;

static void h_echo(OckRpcServerContext ctx, OckRpcMessage msg)
{
    OckRpcMessage r = {msg.data, msg.len};
    CHECK_EQ(OckRpcServerReply(ctx, 1, &r, NULL), OCK_RPC_OK);
}

static void h_count(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)ctx;
    (void)msg;
    atomic_fetch_add(&g_msgs, 1);
}

static void free_done(OckRpcStatus st, void *arg)
{
    CHECK_EQ(st, OCK_RPC_OK);
    free(arg);
    atomic_fetch_add(&g_done, 1);
}

static OckRpcServer make(const char *range)
{
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, comm_type()},
        {OCK_RPC_STR_SERVER_PORT_RANGE, range},
        {OCK_RPC_STR_WRK_THR_GRP, "2"},
        {OCK_RPC_STR_ENABLE_POLL_WORKER, "no"},
    };
    OckRpcCreateConfig cfg = make_cfg(pairs, 4);
    OckRpcServer s = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_OK);
    return s;
}

int main(int argc, char **argv)
{
    CHECK(argc == 3);
    if (strcmp(argv[1], "server") == 0) {
        OckRpcServer s = make(argv[2]);
        OckRpcService a = {1, h_echo}, b = {2, h_count};
        CHECK_EQ(OckRpcServerAddService(s, &a), OCK_RPC_OK);
        CHECK_EQ(OckRpcServerAddService(s, &b), OCK_RPC_OK);
        CHECK_EQ(OckRpcServerStart(s), OCK_RPC_OK);
        char **ips;
        uint16_t *ports;
        int n;
        CHECK(OckRpcGetOobIpAndPort(s, &ips, &ports, &n));
        printf("PORT %u\n", (unsigned)ports[0]);
        fflush(stdout);
        free(ips[0]);
        free(ips);
        free(ports);
        char c;
        while (read(0, &c, 1) > 0) {
        }
        printf("COUNT %d\n", atomic_load(&g_msgs));
        OckRpcServerDestroy(s);
        return 0;
    }
    /* The client needs a server of its name ("service") in its process: it uses its device. */
    char range[32];
    int base = 40000 + (int)(getpid() % 20000);
    snprintf(range, sizeof(range), "%d-%d", base, base + 100);
    OckRpcServer local = make(range);
    RpcConfigPair pairs[] = {{OCK_RPC_STR_ENABLE_SELFPOLLING, "no"}};
    OckRpcCreateConfig cfg = make_cfg(pairs, 1);
    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", (uint16_t)atoi(argv[2]), &c, &cfg), OCK_RPC_OK);
    OckRpcClientSetTimeout(c, 10000);
    OckRpcMessage req = {"across", 6};
    OckRpcMessage rsp = {NULL, 0};
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK(rsp.len == 6 && memcmp(rsp.data, "across", 6) == 0);
    free(rsp.data);
    enum { N = 100 };
    for (int i = 0; i < N; i++) {
        char *b = (char *)malloc(64);
        memset(b, i, 64);
        OckRpcMessage m = {b, 64};
        OckRpcCallDone d = {free_done, b};
        while (OckRpcClientCall(c, 2, &m, NULL, &d) != OCK_RPC_OK) {
        }
    }
    CHECK(wait_at_least(&g_done, N, 20));
    /* A sync call after the one-way ones: on one queue, they were all delivered before it. */
    OckRpcMessage parts[3] = {{"a", 1}, {"bc", 2}, {"def", 3}};
    char out[16];
    OckRpcMessage o = {out, sizeof(out)};
    OckRpcClientCallParams p;
    memset(&p, 0, sizeof(p));
    p.client = c;
    p.msgId = 1;
    p.reqIov.count = 3;
    p.reqIov.msgs = parts;
    p.rspIov.count = 1;
    p.rspIov.msgs = &o;
    CHECK_EQ(OckRpcClientCallWithParam(&p), OCK_RPC_OK);
    CHECK(o.len == 6 && memcmp(out, "abcdef", 6) == 0);
    OckRpcClientDisconnect(c);
    OckRpcServerDestroy(local);
    printf("client ok\n");
    return 0;
}
