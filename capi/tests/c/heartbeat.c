/* Heartbeat detection of a dead peer, from the client's side.
 *
 *   heartbeat PORT IDLE LIMIT
 *
 * connects to a proc.c server on PORT with `server.heartbeat.idle` = IDLE seconds and a break
 * handler, checks one call, prints READY and waits for a line on stdin: the driver has frozen
 * (SIGSTOP) or killed the server by then. The program then starts an async call (no timeout, so
 * only the break can end it) and requires, within LIMIT seconds: the break handler ran once,
 * the outstanding call's done ran with OCK_RPC_ERR_CONN_BROKEN, a later call fails with
 * OCK_RPC_ERR_CONN_BROKEN. It prints "DETECTED <seconds>" and, after a disconnect (which must
 * not run the handler again), "heartbeat ok". */
#include <unistd.h>
#include "util.h"

static atomic_int g_breaks, g_done, g_status;

static int on_break(OckRpcClient client, uint64_t ctx, const char *payload)
{
    (void)client;
    (void)ctx;
    (void)payload;
    atomic_fetch_add(&g_breaks, 1);
    return 0;
}

static void on_done(OckRpcStatus st, void *arg)
{
    (void)arg;
    atomic_store(&g_status, (int)st);
    atomic_fetch_add(&g_done, 1);
}

int main(int argc, char **argv)
{
    CHECK(argc == 4);
    double limit = atof(argv[3]);
    CHECK(limit > 0);
    /* The client needs a server of its name in its process: it uses its device. */
    char range[32];
    int base = 40000 + (int)(getpid() % 20000);
    snprintf(range, sizeof(range), "%d-%d", base, base + 100);
    RpcConfigPair spairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, comm_type()},
        {OCK_RPC_STR_SERVER_PORT_RANGE, range},
        {OCK_RPC_STR_ENABLE_POLL_WORKER, "no"},
    };
    OckRpcCreateConfig scfg = make_cfg(spairs, 3);
    OckRpcServer local = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &local, &scfg), OCK_RPC_OK);

    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_ENABLE_SELFPOLLING, "no"},
        {OCK_RPC_STR_HEATBEAT_IDLE, argv[2]},
        {OCK_RPC_STR_CLIENT_BREAK, FN_VALUE(on_break)},
    };
    OckRpcCreateConfig cfg = make_cfg(pairs, 3);
    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", (uint16_t)atoi(argv[1]), &c, &cfg), OCK_RPC_OK);
    char buf[16];
    OckRpcMessage req = {"alive", 5};
    OckRpcMessage rsp = {buf, sizeof(buf)};
    OckRpcClientSetTimeout(c, 10000);
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK(rsp.len == 5 && memcmp(buf, "alive", 5) == 0);
    CHECK_EQ(atomic_load(&g_breaks), 0);

    printf("READY\n");
    fflush(stdout);
    char line[16];
    CHECK(fgets(line, sizeof(line), stdin) != NULL);

    /* No timeout: only the peer's detected death can end this call. */
    OckRpcClientSetTimeout(c, -1);
    double t0 = now_s();
    OckRpcCallDone d = {on_done, NULL};
    OckRpcMessage held = {"held", 4};
    OckRpcStatus st = OckRpcClientCall(c, 1, &held, NULL, &d);
    if (st != OCK_RPC_OK) {
        /* The break was already seen (a killed server's socket closes at once): the call is
         * refused, and its done never runs. */
        CHECK_EQ(st, OCK_RPC_ERR_CONN_BROKEN);
        atomic_store(&g_status, (int)st);
        atomic_fetch_add(&g_done, 1);
    }
    CHECK(wait_at_least(&g_breaks, 1, limit));
    double detected = now_s() - t0;
    CHECK(wait_at_least(&g_done, 1, 5));
    CHECK_EQ(atomic_load(&g_status), OCK_RPC_ERR_CONN_BROKEN);
    rsp.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_ERR_CONN_BROKEN);
    printf("DETECTED %.2f\n", detected);
    fflush(stdout);

    OckRpcClientDisconnect(c);
    OckRpcServerDestroy(local);
    CHECK_EQ(atomic_load(&g_breaks), 1);
    CHECK_EQ(atomic_load(&g_done), 1);
    printf("heartbeat ok\n");
    return 0;
}
