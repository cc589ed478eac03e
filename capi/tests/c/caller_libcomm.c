/* Shaped like openGauss's libcomm data channel (lib_hcom4db/libhcom.cpp): every node runs a
 * server "hcom_server" (type "HCCS" by default, libcomm's own default; $CAPI_COMM_TYPE
 * overrides), started BEFORE its services are added, with function-pointer new/break handlers;
 * the new-client handler parses the payload (the connecting node's listen port) and keeps a
 * per-client peer record with OckRpcSetUpCtx; the command handler finds it again through
 * OckRpcGetClient + OckRpcGetUpCtx. A client connects with libcomm's five pairs (segcount "0",
 * segsize "4096", self-polling "no") in a retry loop, sends the connect command (a sync call
 * with a caller buffer), then async one-way data whose `done` frees the buffer.
 *
 *   caller_libcomm one RANGE           both sides in one process
 *   caller_libcomm server RANGE        prints "PORT n", serves until stdin closes, checks
 *   caller_libcomm client PORT RANGE   a node that connects to PORT and sends
 */
#include <pthread.h>
#include <unistd.h>
#include "util.h"

/* libcomm resolves this alias of OckRpcSetExternalLogger by name; the header does not declare it. */
void Hcom4dbSetLogFunc(OckRpcLogHandler func);

#define NODES_MAX 8
#define MSGS 200
#define STREAM_BUFFER_SIZE 32768 /* the data of one libcomm packet (segsize 33768 holds it) */

struct connect_package {
    char nodename[64];
    char host[64];
};

struct accept_package {
    uint16_t result;
    int nodeindex;
};

struct msg_head {
    uint16_t version;
    uint16_t logic_id;
    int nodeindex;
    uint32_t msg_len;
    int cindex;
};

struct send_buf {
    struct msg_head head;
    char msg[STREAM_BUFFER_SIZE];
};

struct peer {
    int cindex;
    int port; /* parsed from the new-client payload */
    char host[64];
    int nodeindex;
};

static struct peer *g_peers[NODES_MAX];
static atomic_int g_npeers, g_cmds, g_msgs, g_bad, g_done, g_breaks;
static atomic_llong g_bytes;

static unsigned char pattern(int seq, int i)
{
    return (unsigned char)(seq * 31 + i * 7);
}

static int on_new(OckRpcClient client, uint64_t usr_ctx, const char *payload)
{
    (void)usr_ctx;
    int n = atomic_fetch_add(&g_npeers, 1);
    if (n >= NODES_MAX) {
        return OCK_RPC_ERR;
    }
    struct peer *p = calloc(1, sizeof(*p));
    CHECK(p != NULL);
    p->cindex = n;
    CHECK_EQ(sscanf(payload, "%d", &p->port), 1);
    g_peers[n] = p;
    CHECK_EQ(OckRpcSetUpCtx(client, (uint64_t)(uintptr_t)p), OCK_RPC_OK);
    return OCK_RPC_OK;
}

static int on_break(OckRpcClient client, uint64_t usr_ctx, const char *payload)
{
    (void)client;
    (void)usr_ctx;
    (void)payload;
    atomic_fetch_add(&g_breaks, 1);
    return OCK_RPC_OK;
}

/* gs_accept_data_connection: the peer record through GetClient + GetUpCtx. */
static void handle_cmd(OckRpcServerContext ctx, OckRpcMessage msg)
{
    struct accept_package ack = {1, -1};
    OckRpcMessage rsp = {&ack, sizeof(ack)};
    OckRpcClient client = 0;
    struct peer *p = NULL;
    if (msg.len != sizeof(struct connect_package) || OckRpcGetClient(ctx, &client) != OCK_RPC_OK ||
        OckRpcGetUpCtx(client, (uint64_t *)&p) != OCK_RPC_OK || p == NULL) {
        atomic_fetch_add(&g_bad, 1);
        CHECK_EQ(OckRpcServerReply(ctx, 0, &rsp, NULL), OCK_RPC_OK);
        OckRpcServerCleanupCtx(ctx);
        return;
    }
    const struct connect_package *pkg = msg.data;
    snprintf(p->host, sizeof(p->host), "%s", pkg->host);
    p->nodeindex = p->cindex + 1;
    ack.result = 0;
    ack.nodeindex = p->nodeindex;
    CHECK_EQ(OckRpcServerReply(ctx, 0, &rsp, NULL), OCK_RPC_OK);
    OckRpcServerCleanupCtx(ctx);
    atomic_fetch_add(&g_cmds, 1);
}

static void handle_recv(OckRpcServerContext ctx, OckRpcMessage msg)
{
    const struct send_buf *b = msg.data;
    int ok = msg.len >= sizeof(struct msg_head) && b->head.logic_id > 0 &&
             msg.len == sizeof(struct msg_head) + b->head.msg_len && b->head.nodeindex > 0;
    for (uint32_t i = 0; ok && i < b->head.msg_len; i++) {
        ok = (unsigned char)b->msg[i] == pattern(b->head.version, (int)i);
    }
    if (!ok) {
        atomic_fetch_add(&g_bad, 1);
    }
    atomic_fetch_add(&g_msgs, 1);
    atomic_fetch_add(&g_bytes, (long long)msg.len);
    OckRpcServerCleanupCtx(ctx);
}

/* The test's own service (id 2): how many data messages the server has handled. A one-way
 * send completes when the peer's NIC has the message, not when its handler ran; libcomm keeps
 * its connections, the test's node disconnects, so it first waits for the handlers here. */
static void handle_count(OckRpcServerContext ctx, OckRpcMessage msg)
{
    (void)msg;
    int n = atomic_load(&g_msgs);
    OckRpcMessage rsp = {&n, sizeof(n)};
    CHECK_EQ(OckRpcServerReply(ctx, 2, &rsp, NULL), OCK_RPC_OK);
}

static void logger(int level, const char *msg)
{
    if (level >= 2) {
        fprintf(stderr, "[lib %d] %s\n", level, msg);
    }
}

/* hcom_server_listener_init: libcomm's ten pairs (+ the test's port range). */
static OckRpcServer listener_init(const char *range)
{
    const char *type = getenv("CAPI_COMM_TYPE");
    if (type == NULL || type[0] == '\0') {
        type = "HCCS";
    }
    /* libcomm busy-polls ("yes"); the test polls adaptively unless asked, so that four
     * spinning workers per process do not starve a shared 2-core machine or valgrind. */
    const char *poll = getenv("CAPI_BUSY_POLL") != NULL ? getenv("CAPI_BUSY_POLL") : "no";
    OckRpcCreateConfig configs = {0};
    RpcConfigPair pairs[11];
    configs.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    configs.configs.size = 11;
    configs.configs.pairs = pairs;
    pairs[0] = (RpcConfigPair){OCK_RPC_STR_WRK_THR_GRP, "4"};
    pairs[1] = (RpcConfigPair){OCK_RPC_STR_SERVER_NAME, "hcom_server"};
    pairs[2] = (RpcConfigPair){OCK_RPC_STR_COMMUNICATION_TYPE, type};
    pairs[3] = (RpcConfigPair){OCK_RPC_STR_CLIENT_NEW, FN_VALUE(on_new)};
    pairs[4] = (RpcConfigPair){OCK_RPC_STR_CLIENT_BREAK, FN_VALUE(on_break)};
    pairs[5] = (RpcConfigPair){OCK_RPC_STR_HEATBEAT_IDLE, "60"};
    pairs[6] = (RpcConfigPair){OCK_RPC_STR_PRE_SEGMENT_COUNT, "2048"};
    pairs[7] = (RpcConfigPair){OCK_RPC_STR_PRE_SEGMENT_SIZE, "33768"};
    pairs[8] = (RpcConfigPair){OCK_RPC_STR_ENABLE_POLL_WORKER, poll};
    pairs[9] = (RpcConfigPair){OCK_RPC_STR_WRK_CPU_SET, "1-4"}; /* unpinned where CPUs are missing */
    pairs[10] = (RpcConfigPair){OCK_RPC_STR_SERVER_PORT_RANGE, range};
    Hcom4dbSetLogFunc(NULL);
    OckRpcSetExternalLogger(logger);
    OckRpcServer s = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &configs), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerStart(s), OCK_RPC_OK);
    OckRpcService cmd = {0, handle_cmd}, recv = {1, handle_recv}, count = {2, handle_count};
    CHECK_EQ(OckRpcServerAddService(s, &cmd), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerAddService(s, &recv), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerAddService(s, &count), OCK_RPC_OK);
    return s;
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

static void free_sent(OckRpcStatus st, void *arg)
{
    CHECK_EQ(st, OCK_RPC_OK);
    free(arg);
    atomic_fetch_add(&g_done, 1);
}

/* hcom_client_connect + hcom_client_sendcmd + hcom_client_sendbuf. */
static void node_talks(uint16_t port, uint16_t local_port)
{
    OckRpcCreateConfig configs; /* libcomm leaves the rest of the struct uninitialised */
    RpcConfigPair pairs[5];
    configs.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    configs.configs.size = 5;
    configs.configs.pairs = pairs;
    char payload[6] = {0};
    snprintf(payload, sizeof(payload), "%u", (unsigned)local_port);
    pairs[0] = (RpcConfigPair){OCK_RPC_STR_SERVER_NAME, "hcom_server"};
    pairs[1] = (RpcConfigPair){OCK_RPC_STR_CLIENT_CREATE_INFO, payload};
    pairs[2] = (RpcConfigPair){OCK_RPC_STR_ENABLE_SELFPOLLING, "no"};
    pairs[3] = (RpcConfigPair){OCK_RPC_STR_PRE_SEGMENT_COUNT, "0"};
    pairs[4] = (RpcConfigPair){OCK_RPC_STR_PRE_SEGMENT_SIZE, "4096"};
    OckRpcClient c = 0;
    /* libcomm retries without end; the test bounds it (the first attempt must do). */
    int attempts = 0;
    double end = now_s() + 30;
    while (OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &configs) != OCK_RPC_OK) {
        attempts++;
        CHECK(now_s() < end);
    }
    CHECK_EQ(attempts, 0);
    struct peer me = {0, local_port, "127.0.0.1", -1};
    CHECK_EQ(OckRpcSetUpCtx(c, (uint64_t)(uintptr_t)&me), OCK_RPC_OK);
    uint64_t back = 0;
    CHECK_EQ(OckRpcGetUpCtx(c, &back), OCK_RPC_OK);
    CHECK(back == (uint64_t)(uintptr_t)&me);

    struct connect_package pkg; /* as libcomm: only the two strings are written, the rest of
                                 * the struct goes out uninitialised (see valgrind.supp) */
    snprintf(pkg.nodename, sizeof(pkg.nodename), "dn_%u", (unsigned)local_port);
    snprintf(pkg.host, sizeof(pkg.host), "127.0.0.1");
    OckRpcMessage packet = {&pkg, sizeof(pkg)};
    struct accept_package ack = {7, -7};
    OckRpcMessage resp = {&ack, sizeof(ack)};
    OckRpcStatus st = OckRpcClientCall(c, 0, &packet, &resp, NULL);
    for (int retry = 0; retry < 10 && st != OCK_RPC_OK; retry++) {
        usleep(10);
        st = OckRpcClientCall(c, 0, &packet, &resp, NULL);
    }
    CHECK_EQ(st, OCK_RPC_OK);
    CHECK_EQ(resp.len, sizeof(ack));
    CHECK_EQ(ack.result, 0);
    CHECK(ack.nodeindex > 0);
    me.nodeindex = ack.nodeindex;

    long long sent = 0;
    for (int i = 0; i < MSGS; i++) {
        struct send_buf *b = malloc(sizeof(*b));
        CHECK(b != NULL);
        uint32_t len = (uint32_t)((i * 977) % STREAM_BUFFER_SIZE) + 1;
        b->head.version = (uint16_t)i;
        b->head.logic_id = (uint16_t)(1 + i % 7);
        b->head.nodeindex = me.nodeindex;
        b->head.msg_len = len;
        b->head.cindex = 0;
        for (uint32_t k = 0; k < len; k++) {
            b->msg[k] = (char)pattern(i, (int)k);
        }
        OckRpcMessage m = {b, sizeof(struct msg_head) + len};
        OckRpcCallDone done = {free_sent, b};
        /* libcomm loops until the send is taken; bounded here */
        double until = now_s() + 30;
        while (OckRpcClientCall(c, 1, &m, NULL, &done) != OCK_RPC_OK) {
            CHECK(now_s() < until);
        }
        sent += (long long)m.len;
    }
    CHECK(wait_at_least(&g_done, MSGS, 60));
    int handled = 0;
    double until = now_s() + 60;
    while (handled < MSGS) {
        OckRpcMessage q = {"?", 1}, a = {&handled, sizeof(handled)};
        CHECK_EQ(OckRpcClientCall(c, 2, &q, &a, NULL), OCK_RPC_OK);
        CHECK(now_s() < until);
    }
    printf("client sent %d messages, %lld bytes\n", MSGS, sent);
    OckRpcClientDisconnect(c);
}

static void check_server(int nodes)
{
    CHECK(wait_at_least(&g_cmds, nodes, 60));
    CHECK(wait_at_least(&g_msgs, nodes * MSGS, 60));
    CHECK_EQ(atomic_load(&g_bad), 0);
    CHECK_EQ(atomic_load(&g_msgs), nodes * MSGS);
    for (int i = 0; i < atomic_load(&g_npeers) && i < NODES_MAX; i++) {
        CHECK(g_peers[i]->port > 0);
        CHECK(strcmp(g_peers[i]->host, "127.0.0.1") == 0);
    }
}

static void free_peers(void)
{
    for (int i = 0; i < NODES_MAX; i++) {
        free(g_peers[i]);
        g_peers[i] = NULL;
    }
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3);
    if (strcmp(argv[1], "one") == 0) {
        OckRpcServer s = listener_init(argv[2]);
        uint16_t port = port_of(s);
        node_talks(port, port);
        check_server(1);
        CHECK_EQ(g_peers[0]->port, port);
        OckRpcServerDestroy(s);
        free_peers();
        printf("libcomm one ok\n");
    } else if (strcmp(argv[1], "server") == 0) {
        OckRpcServer s = listener_init(argv[2]);
        printf("PORT %u\n", (unsigned)port_of(s));
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof(buf)) > 0) {
        }
        check_server(1);
        printf("COUNT %d\n", atomic_load(&g_msgs));
        printf("PEERPORT %d\n", g_peers[0]->port);
        OckRpcServerDestroy(s);
        free_peers();
        printf("libcomm server ok\n");
    } else {
        CHECK(argc == 4);
        OckRpcServer s = listener_init(argv[3]); /* every node listens too */
        uint16_t local = port_of(s);
        node_talks((uint16_t)atoi(argv[2]), local);
        printf("LOCALPORT %u\n", (unsigned)local);
        OckRpcServerDestroy(s);
        printf("libcomm client ok\n");
    }
    return 0;
}
