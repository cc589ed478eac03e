/* Shaped like CBB's MES over RDMA/UB (src/cm_mes/mes_rdma_rpc.c, mes_rpc_dl.c): the library is
 * dlopened from $OCK_RPC_LIB_PATH and every function called through the symbols CBB resolves
 * (this program does not link it). Each node creates a server with CBB's mask (ctx builders +
 * configs) and its four pairs — worker groups, busy poll, cpuset, type "RDMA" (or
 * $CAPI_COMM_TYPE, e.g. "UBC") — on an explicit port, adds services 0..3, then starts it. Per
 * channel a client connects with CBB's one pair (netstack.exclusive.enable, which the library
 * ignores) and a 5000 ms timeout, handshakes (a sync call on id 1 whose 8-byte reply the library
 * mallocs, then a one-way call on id 2), and sends one-way data on id 0 under the channel's
 * send lock from several threads: one buffer, or OckRpcClientCallWithParam with up to 4 buffers,
 * each message starting with MES's 64-byte header; plus a heartbeat on id 3.
 *
 *   caller_mes one LOW-HIGH          both nodes in one process
 *   caller_mes server LOW-HIGH       prints "PORT n", serves until stdin closes, checks
 *   caller_mes client PORT LOW-HIGH  the sending node
 */
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#include "util.h"

#define CHANNELS 2
#define SENDERS 2 /* threads per channel */
#define MSGS 100  /* per sender */
#define PROTO_CODE 0x5AA5u
#define CMD_DATA 7
#define CMD_HEARTBEAT 9
#define CMD_CONNECT 10

/* MES's message head: 64 bytes. */
struct mes_head {
    uint8_t cmd;
    uint8_t flags;
    uint16_t src_inst;
    uint16_t dst_inst;
    uint16_t caller_tid; /* the channel */
    uint32_t size;       /* the whole message */
    uint32_t seq;
    uint64_t ruid;
    uint32_t checksum;
    uint8_t pad[36];
};
_Static_assert(sizeof(struct mes_head) == 64, "MES's head is 64 bytes");

struct version_proto {
    uint32_t version;
    uint32_t proto_code;
};

struct link_ack {
    uint8_t endian;
    uint8_t pad;
    uint16_t flags;
    uint32_t version;
};

/* What CBB's mes_rpc_dl.c resolves. */
static struct {
    OckRpcServerContext (*ctx_build)(OckRpcServer);
    void (*ctx_cleanup)(OckRpcServer, OckRpcServerContext);
    OckRpcStatus (*create)(const char *, uint16_t, OckRpcServer *, OckRpcCreateConfig *);
    OckRpcStatus (*add)(OckRpcServer, OckRpcService *);
    OckRpcStatus (*start)(OckRpcServer);
    void (*destroy)(OckRpcServer);
    OckRpcStatus (*reply)(OckRpcServerContext, uint16_t, OckRpcMessage *, OckRpcCallDone *);
    void (*cleanup)(OckRpcServerContext);
    OckRpcStatus (*connect)(const char *, uint16_t, OckRpcClient *, OckRpcCreateConfig *);
    void (*disconnect)(OckRpcClient);
    OckRpcStatus (*call)(OckRpcClient, uint16_t, OckRpcMessage *, OckRpcMessage *, OckRpcCallDone *);
    OckRpcStatus (*call_param)(OckRpcClientCallParams *);
    void (*set_timeout)(OckRpcClient, int64_t);
    void (*disable_hmac)(void);
} rpc;

static void *g_lib;

static void load(void)
{
    const char *dir = getenv("OCK_RPC_LIB_PATH");
    CHECK(dir != NULL);
    char path[4096];
    snprintf(path, sizeof(path), "%s/libhcom4db.so", dir);
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_lib == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
#define SYM(field, name)                                   \
    do {                                                   \
        *(void **)(&rpc.field) = dlsym(g_lib, name);       \
        if (rpc.field == NULL) {                           \
            fprintf(stderr, "missing symbol %s\n", name);  \
            exit(1);                                       \
        }                                                  \
    } while (0)
    SYM(ctx_build, "OckRpcServerCtxBuilderThreadLocal");
    SYM(ctx_cleanup, "OckRpcServerCtxCleanupThreadLocal");
    SYM(create, "OckRpcServerCreateWithCfg");
    SYM(add, "OckRpcServerAddService");
    SYM(start, "OckRpcServerStart");
    SYM(destroy, "OckRpcServerDestroy");
    SYM(reply, "OckRpcServerReply");
    SYM(cleanup, "OckRpcServerCleanupCtx");
    SYM(connect, "OckRpcClientConnectWithCfg");
    SYM(disconnect, "OckRpcClientDisconnect");
    SYM(call, "OckRpcClientCall");
    SYM(call_param, "OckRpcClientCallWithParam");
    SYM(set_timeout, "OckRpcClientSetTimeout");
    SYM(disable_hmac, "OckRpcDisableSecureHmac");
#undef SYM
}

/* The receiving side's per-channel state: which sequence numbers arrived (a message resent after
 * a reconnect may arrive twice). */
static atomic_int g_active[CHANNELS], g_handshakes, g_heartbeats, g_bad;
static atomic_int g_data[CHANNELS];
static atomic_uchar g_seen[CHANNELS][SENDERS * MSGS + 1];
static atomic_int g_reconnects;
static uint16_t g_port;

static uint32_t checksum(const unsigned char *p, size_t n)
{
    uint32_t s = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        s = (s ^ p[i]) * 16777619u;
    }
    return s;
}

static void proc_default(OckRpcServerContext handle, OckRpcMessage msg)
{
    const struct mes_head *h = msg.data;
    if (msg.len < sizeof(*h) || h->size != msg.len || h->caller_tid >= CHANNELS) {
        atomic_fetch_add(&g_bad, 1);
        rpc.cleanup(handle);
        return;
    }
    if (h->cmd == CMD_HEARTBEAT) {
        atomic_fetch_add(&g_heartbeats, 1);
        rpc.cleanup(handle);
        return;
    }
    /* mes_alloc_buf_item_fc + memcpy, then the message queue: a copy, checked */
    unsigned char *copy = malloc(h->size);
    CHECK(copy != NULL);
    memcpy(copy, msg.data, h->size);
    const struct mes_head *c = (const struct mes_head *)copy;
    if (c->cmd != CMD_DATA || checksum(copy + sizeof(*c), c->size - sizeof(*c)) != c->checksum) {
        atomic_fetch_add(&g_bad, 1);
    }
    if (c->seq >= 1 && c->seq <= SENDERS * MSGS) {
        atomic_store(&g_seen[c->caller_tid][c->seq], 1);
    } else {
        atomic_fetch_add(&g_bad, 1);
    }
    atomic_fetch_add(&g_data[c->caller_tid], 1);
    free(copy);
    rpc.cleanup(handle);
}

static void proc_connection(OckRpcServerContext handle, OckRpcMessage msg)
{
    if (msg.len != sizeof(struct mes_head) + sizeof(struct version_proto)) {
        atomic_fetch_add(&g_bad, 1);
        rpc.cleanup(handle);
        return;
    }
    const struct version_proto *vp =
        (const struct version_proto *)((const char *)msg.data + sizeof(struct mes_head));
    if (vp->proto_code != PROTO_CODE) {
        atomic_fetch_add(&g_bad, 1);
        rpc.cleanup(handle);
        return;
    }
    struct link_ack ack = {0, 0, 0, 3};
    OckRpcMessage reply = {&ack, sizeof(ack)};
    CHECK_EQ(rpc.reply(handle, 1, &reply, NULL), OCK_RPC_OK);
    rpc.cleanup(handle);
    atomic_fetch_add(&g_handshakes, 1);
}

static void proc_connection_cmd(OckRpcServerContext handle, OckRpcMessage msg)
{
    (void)handle;
    const struct mes_head *h = msg.data;
    if (msg.len != sizeof(*h) || h->cmd != CMD_CONNECT || h->caller_tid >= CHANNELS) {
        atomic_fetch_add(&g_bad, 1);
        return;
    }
    atomic_store(&g_active[h->caller_tid], 1);
}

static void proc_heartbeat(OckRpcServerContext handle, OckRpcMessage msg)
{
    (void)handle;
    (void)msg;
}

/* mes_init_ock_server_configs + mes_init_rdma_rpc_server + mes_register_rdma_rpc_proc_func +
 * start, on the first port of `range` that starts (CBB passes its configured port). */
static OckRpcServer node_server(const char *range, uint16_t *port_out)
{
    unsigned lo = 0, hi = 0;
    CHECK_EQ(sscanf(range, "%u-%u", &lo, &hi), 2);
    const char *type = getenv("CAPI_COMM_TYPE");
    if (type == NULL || type[0] == '\0') {
        type = "RDMA";
    }
    for (unsigned port = lo; port <= hi; port++) {
        RpcConfigPair pairs[4];
        OckRpcCreateConfig configs;
        char workers[16];
        snprintf(workers, sizeof(workers), "%d", 2); /* end_cpu - start_cpu + 1 */
        configs.configs.size = 4;
        configs.mask = (uint64_t)OCK_RPC_CONFIG_USE_SERVER_CTX_BUILD | (uint64_t)OCK_RPC_CONFIG_USE_RPC_CONFIGS;
        configs.serverCtxbuilder = rpc.ctx_build;
        configs.serverCtxCleanup = rpc.ctx_cleanup;
        configs.configs.pairs = pairs;
        pairs[0] = (RpcConfigPair){"worker.thread.groups", workers};
        pairs[1] = (RpcConfigPair){"worker.poll.enable", "no"};
        pairs[2] = (RpcConfigPair){"worker.thread.cpuset", "0-1"};
        pairs[3] = (RpcConfigPair){"server.create.type", type};
        OckRpcServer s = 0;
        CHECK_EQ(rpc.create("127.0.0.1", (uint16_t)port, &s, &configs), OCK_RPC_OK);
        OckRpcService svc[4] = {
            {0, proc_default}, {1, proc_connection}, {2, proc_connection_cmd}, {3, proc_heartbeat}};
        for (int i = 0; i < 4; i++) {
            CHECK_EQ(rpc.add(s, &svc[i]), OCK_RPC_OK);
        }
        if (rpc.start(s) == OCK_RPC_OK) {
            *port_out = (uint16_t)port;
            return s;
        }
        rpc.destroy(s); /* the port is taken: the next one */
    }
    fprintf(stderr, "no port of %s could be bound\n", range);
    exit(1);
}

struct channel {
    OckRpcClient client;
    pthread_rwlock_t send_lock;
    int id;
    atomic_uint seq;
};

static struct channel g_ch[CHANNELS];

static void fill(unsigned char *p, size_t n, uint32_t seq)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(seq + i * 3);
    }
}

static void connect_channel(struct channel *ch, uint16_t port)
{
    OckRpcCreateConfig cfgs; /* CBB sets the mask and the configs only */
    cfgs.mask = OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    RpcConfigPair pairs;
    RpcConfigs configs;
    configs.size = 1;
    configs.pairs = &pairs;
    pairs.key = "netstack.exclusive.enable";
    pairs.value = "yes";
    cfgs.configs = configs;
    CHECK_EQ(rpc.connect("127.0.0.1", port, &ch->client, &cfgs), OCK_RPC_OK);
    rpc.set_timeout(ch->client, 5000);
    /* mes_rdma_send_connect_protocode: a sync call whose 8-byte reply the library mallocs */
    struct {
        struct mes_head head;
        struct version_proto vp;
    } req;
    memset(&req, 0, sizeof(req));
    req.head.caller_tid = (uint16_t)ch->id;
    req.head.size = sizeof(req);
    req.vp.proto_code = PROTO_CODE;
    OckRpcMessage request = {&req, sizeof(req)}, response = {NULL, 0};
    CHECK_EQ(rpc.call(ch->client, 1, &request, &response, NULL), OCK_RPC_OK);
    CHECK_EQ(response.len, sizeof(struct link_ack));
    CHECK_EQ(((struct link_ack *)response.data)->version, 3);
    free(response.data);
    /* then CONNECT_CMD, one-way */
    struct mes_head head;
    memset(&head, 0, sizeof(head));
    head.cmd = CMD_CONNECT;
    head.caller_tid = (uint16_t)ch->id;
    head.size = sizeof(head);
    OckRpcMessage cmd = {&head, sizeof(head)};
    CHECK_EQ(rpc.call(ch->client, 2, &cmd, NULL, NULL), OCK_RPC_OK);
}

/* CBB on a failed send: disconnect, connect again (with the handshake), and the message is sent
 * again. (Under valgrind the simulated NIC of a starved peer can miss the transport's ACK
 * timer, about 1 s of retries, which fails the queue as a lost link would.) */
static void reconnect(struct channel *ch, OckRpcStatus st)
{
    fprintf(stderr, "channel %d: send failed (%d): reconnecting\n", ch->id, (int)st);
    atomic_fetch_add(&g_reconnects, 1);
    CHECK(atomic_load(&g_reconnects) <= 20);
    rpc.disconnect(ch->client);
    connect_channel(ch, g_port);
}

/* mes_rdma_rpc_send_data / mes_rdma_rpc_send_bufflist, under the channel's send lock. */
static void *sender(void *arg)
{
    struct channel *ch = arg;
    unsigned char body[3][2048];
    for (int i = 0; i < MSGS; i++) {
        uint32_t seq = atomic_fetch_add(&ch->seq, 1) + 1;
        struct mes_head head;
        memset(&head, 0, sizeof(head));
        head.cmd = CMD_DATA;
        head.caller_tid = (uint16_t)ch->id;
        head.seq = seq;
        int parts = 1 + (int)(seq % 4); /* the head plus 0..3 body buffers */
        size_t lens[3] = {0, 0, 0}, body_len = 0;
        for (int k = 0; k + 1 < parts; k++) {
            lens[k] = 1 + (seq * 131 + (uint32_t)k * 17) % sizeof(body[k]);
            body_len += lens[k];
        }
        head.size = (uint32_t)(sizeof(head) + body_len);
        pthread_rwlock_wrlock(&ch->send_lock);
        if (parts == 1 || seq % 2 == 0) {
            /* one buffer: head and body together */
            unsigned char *msg = malloc(head.size);
            CHECK(msg != NULL);
            fill(msg + sizeof(head), body_len, seq);
            head.checksum = checksum(msg + sizeof(head), body_len);
            memcpy(msg, &head, sizeof(head));
            OckRpcMessage request = {msg, head.size};
            OckRpcStatus st;
            while ((st = rpc.call(ch->client, 0, &request, NULL, NULL)) != OCK_RPC_OK) {
                reconnect(ch, st);
            }
            free(msg);
        } else {
            unsigned char all[3 * 2048];
            fill(all, body_len, seq);
            head.checksum = checksum(all, body_len);
            OckRpcMessage msgs[4] = {{&head, sizeof(head)}};
            size_t off = 0;
            for (int k = 0; k + 1 < parts; k++) {
                memcpy(body[k], all + off, lens[k]);
                msgs[k + 1] = (OckRpcMessage){body[k], lens[k]};
                off += lens[k];
            }
            OckRpcClientCallParams param;
            param.mask = 0;
            param.client = ch->client;
            param.context = 0;
            param.msgId = 0;
            param.reqIov.count = (size_t)parts;
            param.reqIov.msgs = msgs;
            param.rspIov.count = 0;
            param.rspIov.msgs = NULL;
            param.done = NULL;
            OckRpcStatus st;
            while ((st = rpc.call_param(&param)) != OCK_RPC_OK) {
                reconnect(ch, st);
                param.client = ch->client;
            }
        }
        pthread_rwlock_unlock(&ch->send_lock);
    }
    return NULL;
}

static void node_sends(uint16_t port)
{
    g_port = port;
    for (int c = 0; c < CHANNELS; c++) {
        g_ch[c].id = c;
        CHECK_EQ(pthread_rwlock_init(&g_ch[c].send_lock, NULL), 0);
        connect_channel(&g_ch[c], port);
    }
    pthread_t t[CHANNELS * SENDERS];
    for (int i = 0; i < CHANNELS * SENDERS; i++) {
        CHECK_EQ(pthread_create(&t[i], NULL, sender, &g_ch[i % CHANNELS]), 0);
    }
    for (int i = 0; i < CHANNELS * SENDERS; i++) {
        pthread_join(t[i], NULL);
    }
    for (int c = 0; c < CHANNELS; c++) {
        struct mes_head hb;
        memset(&hb, 0, sizeof(hb));
        hb.cmd = CMD_HEARTBEAT;
        hb.caller_tid = (uint16_t)c;
        hb.size = sizeof(hb);
        OckRpcMessage m = {&hb, sizeof(hb)};
        CHECK_EQ(rpc.call(g_ch[c].client, 0, &m, NULL, NULL), OCK_RPC_OK); /* MES_CMD_HEARTBEAT */
        CHECK_EQ(rpc.call(g_ch[c].client, 3, &m, NULL, NULL), OCK_RPC_OK); /* the heartbeat service */
    }
    /* a sync round trip per channel: everything sent before it has been handled */
    for (int c = 0; c < CHANNELS; c++) {
        struct {
            struct mes_head head;
            struct version_proto vp;
        } req;
        memset(&req, 0, sizeof(req));
        req.head.caller_tid = (uint16_t)c;
        req.head.size = sizeof(req);
        req.vp.proto_code = PROTO_CODE;
        OckRpcMessage request = {&req, sizeof(req)}, response = {NULL, 0};
        CHECK_EQ(rpc.call(g_ch[c].client, 1, &request, &response, NULL), OCK_RPC_OK);
        free(response.data);
        rpc.disconnect(g_ch[c].client);
        pthread_rwlock_destroy(&g_ch[c].send_lock);
    }
    printf("node sent %d messages, %d reconnects\n", CHANNELS * SENDERS * MSGS, atomic_load(&g_reconnects));
}

static void check_receiver(void)
{
    const int per_channel = SENDERS * MSGS;
    for (int c = 0; c < CHANNELS; c++) {
        CHECK(wait_at_least(&g_data[c], per_channel, 60));
        for (int seq = 1; seq <= per_channel; seq++) {
            if (!atomic_load(&g_seen[c][seq])) {
                fprintf(stderr, "channel %d: message %d never arrived\n", c, seq);
                exit(1);
            }
        }
        CHECK_EQ(atomic_load(&g_active[c]), 1);
    }
    CHECK(wait_at_least(&g_heartbeats, CHANNELS, 60));
    CHECK(wait_at_least(&g_handshakes, 2 * CHANNELS, 60));
    printf("received %d %d messages\n", atomic_load(&g_data[0]), atomic_load(&g_data[1]));
    CHECK_EQ(atomic_load(&g_bad), 0);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3);
    load();
    rpc.disable_hmac();
    uint16_t port = 0;
    if (strcmp(argv[1], "one") == 0) {
        OckRpcServer s = node_server(argv[2], &port);
        node_sends(port);
        check_receiver();
        rpc.destroy(s);
        printf("mes one ok\n");
    } else if (strcmp(argv[1], "server") == 0) {
        OckRpcServer s = node_server(argv[2], &port);
        printf("PORT %u\n", (unsigned)port);
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof(buf)) > 0) {
        }
        check_receiver();
        rpc.destroy(s);
        printf("mes server ok\n");
    } else {
        CHECK(argc == 4);
        OckRpcServer s = node_server(argv[3], &port); /* every node serves too */
        node_sends((uint16_t)atoi(argv[2]));
        rpc.destroy(s);
        printf("mes client ok\n");
    }
    dlclose(g_lib);
    return 0;
}
