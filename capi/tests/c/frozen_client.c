/* Heartbeat detection of a frozen client, from the server's side (driven by tests/c_heartbeat.rs).
 *
 *   frozen_client server LOW-HIGH IDLE
 *
 * serves echo (id 1) and a one-way counter (id 2, as proc.c's server does, so proc.c's client
 * can be the second client) with `server.heartbeat.idle` = IDLE and new/break handlers. It prints
 * "PORT p", then "NEW n" as the n-th client arrives (its handle gets the up-context n) and
 * "BREAK n" when the break handler runs for it. It reads commands from stdin:
 *   "freed N"   checks that client N's server-side handle has ended (OckRpcGetUpCtx and
 *               OckRpcSetUpCtx refuse it: the server freed what it held for that client) and
 *               prints "FREED N";
 *   end of file destroys the server and prints "BREAKS b1 b2 ..." (the break handler's runs per
 *               client), "COUNT c" (one-way messages served) and "server ok".
 *
 *   frozen_client client PORT IDLE LIMIT QUIET
 *
 * connects with `server.heartbeat.idle` = IDLE and a break handler, checks one call, then stays
 * quiet for QUIET seconds before printing READY. The server judges a client's silence only once
 * the client's first keepalive probe has announced its interval (docs/protocol.md §13), and a
 * client sends its first probe after IDLE seconds without hearing from the server: the driver
 * gives 3 × IDLE (0 to freeze a client that has not probed yet). The driver
 * then freezes it (SIGSTOP), waits for the server's "BREAK", thaws it (SIGCONT) and writes a line.
 * The program then requires, within LIMIT seconds: an async call fails with
 * OCK_RPC_ERR_CONN_BROKEN (refused, or its done), the break handler ran exactly once, and a
 * later sync call fails with OCK_RPC_ERR_CONN_BROKEN. It prints "BROKEN <seconds>" and, after a
 * disconnect that does not run the handler again, "client ok". */
#include <unistd.h>
#include "util.h"

enum { MAX_CLIENTS = 8 };

/* ---- the server ---- */

static atomic_int g_new, g_msgs;
static atomic_int g_breaks_of[MAX_CLIENTS + 1];
static OckRpcClient g_clients[MAX_CLIENTS + 1];

static int on_new(OckRpcClient client, uint64_t ctx, const char *payload)
{
    (void)ctx;
    (void)payload;
    int n = atomic_fetch_add(&g_new, 1) + 1;
    if (n > MAX_CLIENTS) {
        return 1; /* refused: the test never connects this many */
    }
    g_clients[n] = client;
    CHECK_EQ(OckRpcSetUpCtx(client, (uint64_t)n), OCK_RPC_OK);
    printf("NEW %d\n", n);
    fflush(stdout);
    return 0;
}

static int on_server_break(OckRpcClient client, uint64_t ctx, const char *payload)
{
    (void)client;
    (void)payload;
    CHECK(ctx >= 1 && ctx <= MAX_CLIENTS);
    atomic_fetch_add(&g_breaks_of[ctx], 1);
    printf("BREAK %d\n", (int)ctx);
    fflush(stdout);
    return 0;
}

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

static int serve(const char *range, const char *idle)
{
    RpcConfigPair pairs[] = {
        {OCK_RPC_STR_COMMUNICATION_TYPE, comm_type()},
        {OCK_RPC_STR_SERVER_PORT_RANGE, range},
        {OCK_RPC_STR_WRK_THR_GRP, "2"},
        {OCK_RPC_STR_ENABLE_POLL_WORKER, "no"},
        {OCK_RPC_STR_HEATBEAT_IDLE, idle},
        {OCK_RPC_STR_CLIENT_NEW, FN_VALUE(on_new)},
        {OCK_RPC_STR_CLIENT_BREAK, FN_VALUE(on_server_break)},
    };
    OckRpcCreateConfig cfg = make_cfg(pairs, 7);
    OckRpcServer s = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_OK);
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

    char line[64];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        int which = 0;
        CHECK(sscanf(line, "freed %d", &which) == 1);
        CHECK(which >= 1 && which <= atomic_load(&g_new) && which <= MAX_CLIENTS);
        /* The break handler ran (the driver saw its line); the handle ends once it returned
         * (the library frees it right after the handler): wait for that, at most 5 s. */
        CHECK_EQ(atomic_load(&g_breaks_of[which]), 1);
        uint64_t v = 0;
        double end = now_s() + 5;
        while (OckRpcGetUpCtx(g_clients[which], &v) == OCK_RPC_OK) {
            CHECK(now_s() < end);
            struct timespec d = {0, 1000000};
            nanosleep(&d, NULL);
        }
        CHECK(OckRpcSetUpCtx(g_clients[which], 99) != OCK_RPC_OK);
        printf("FREED %d\n", which);
        fflush(stdout);
    }
    /* Destroying the server ends the connections still open (their break handlers run). */
    OckRpcServerDestroy(s);
    int clients = atomic_load(&g_new);
    printf("BREAKS");
    for (int i = 1; i <= clients && i <= MAX_CLIENTS; i++) {
        printf(" %d", atomic_load(&g_breaks_of[i]));
    }
    printf("\nCOUNT %d\n", atomic_load(&g_msgs));
    for (int i = 1; i <= clients && i <= MAX_CLIENTS; i++) {
        CHECK_EQ(atomic_load(&g_breaks_of[i]), 1);
    }
    printf("server ok\n");
    return 0;
}

/* ---- the client ---- */

static atomic_int g_breaks, g_done, g_status;

static int on_client_break(OckRpcClient client, uint64_t ctx, const char *payload)
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

static int client(const char *port, const char *idle, double limit, int quiet_s)
{
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
        {OCK_RPC_STR_HEATBEAT_IDLE, idle},
        {OCK_RPC_STR_CLIENT_BREAK, FN_VALUE(on_client_break)},
    };
    OckRpcCreateConfig cfg = make_cfg(pairs, 3);
    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", (uint16_t)atoi(port), &c, &cfg), OCK_RPC_OK);
    char buf[16];
    OckRpcMessage req = {"alive", 5};
    OckRpcMessage rsp = {buf, sizeof(buf)};
    OckRpcClientSetTimeout(c, 10000);
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK(rsp.len == 5 && memcmp(buf, "alive", 5) == 0);

    /* Quiet: the first probe goes after one idle interval (see the top of the file). */
    struct timespec quiet = {quiet_s, 0};
    while (nanosleep(&quiet, &quiet) != 0) {
    }
    CHECK_EQ(atomic_load(&g_breaks), 0);
    printf("READY\n");
    fflush(stdout);
    char line[16];
    CHECK(fgets(line, sizeof(line), stdin) != NULL);

    /* Thawed: the server has closed this connection. No timeout, so a hang fails the bound. */
    OckRpcClientSetTimeout(c, -1);
    double t0 = now_s();
    OckRpcCallDone d = {on_done, NULL};
    OckRpcMessage held = {"held", 4};
    OckRpcStatus st = OckRpcClientCall(c, 1, &held, NULL, &d);
    if (st != OCK_RPC_OK) {
        /* The close was seen already: the call is refused and its done never runs. */
        CHECK_EQ(st, OCK_RPC_ERR_CONN_BROKEN);
        atomic_store(&g_status, (int)st);
        atomic_fetch_add(&g_done, 1);
    }
    CHECK(wait_at_least(&g_done, 1, limit));
    CHECK_EQ(atomic_load(&g_status), OCK_RPC_ERR_CONN_BROKEN);
    CHECK(wait_at_least(&g_breaks, 1, limit));
    double broken = now_s() - t0;
    rsp.len = sizeof(buf);
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_ERR_CONN_BROKEN);
    printf("BROKEN %.2f\n", broken);
    fflush(stdout);

    OckRpcClientDisconnect(c);
    OckRpcServerDestroy(local);
    CHECK_EQ(atomic_load(&g_breaks), 1);
    CHECK_EQ(atomic_load(&g_done), 1);
    printf("client ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "server") == 0) {
        return serve(argv[2], argv[3]);
    }
    if (argc == 6 && strcmp(argv[1], "client") == 0) {
        double limit = atof(argv[4]);
        CHECK(limit > 0);
        CHECK(atoi(argv[5]) >= 0);
        return client(argv[2], argv[3], limit, atoi(argv[5]));
    }
    fprintf(stderr, "usage: frozen_client server LOW-HIGH IDLE | frozen_client client PORT IDLE LIMIT QUIET\n");
    return 2;
}
