/*
 * urpc_patterns.c — the ways UMDK's URPC framework and urma_sample use URMA beyond the plain RC
 * sequence of rc_sample.c, written only against include/urma_api.h:
 *
 *   urpc_patterns objects          one process: modify_jfc, user_ctl, the log hooks, and the JFR
 *                                  state machine (READY -> ERROR flushes -> RESET -> READY)
 *   urpc_patterns priority         one process: the priority table read as URPC reads it
 *   urpc_patterns eid              one process on the UDP wire: the EID is IPv4-mapped
 *   urpc_patterns server <scen>    prints "PORT <n>", then serves one client
 *   urpc_patterns client <port> <scen>
 *
 * Two-process scenarios (both ends: one JFR, its JFC on a JFCE, two RC jettys on it with
 * share_jfr = 1 and shared.jfc NULL, as URPC creates them; server jettys A, B, client CA, CB,
 * bound A-CA and B-CB):
 *
 *   shared_jfr    receives are posted through the first jetty only; the client SENDs on CA and
 *                 on CB, and both arrive (the one on B consumes a receive posted through A)
 *   rc_tjetty     the server SENDs on B naming CA in wr->tjetty (not B's bound target): UDMA
 *                 ignores tjetty on RC, so the message goes to CB
 *   event_queued  the server's reply is in the client's JFC before the client rearms it: the
 *                 rearm raises the event at once (urma_sample -e waits exactly like this)
 *   ack_floor     jettys with URPC's err_timeout 2 (16.4 us); the client process is stopped for
 *                 40 ms while the server's SEND is in flight, and the SEND still succeeds (the
 *                 byte wires raise the ACK timeout to a floor, as hardware timers have one)
 *   peer_stall    as ack_floor, the client stopped for 500 ms: longer than the eight ACK timeouts
 *                 (7 retries x 16.8 ms at the floor, ~134 ms) a fixed timer allows; the SEND
 *                 still succeeds (on the byte wires each timeout without progress doubles the
 *                 next wait, as a host may deschedule a process for that long)
 *
 * Every wait is bounded. Exit status 0 means every check passed.
 */
#define _GNU_SOURCE
#include "urma_api.h"
#include "sample.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOKEN 0x5EED
#define SEG_LEN 8192
#define WAIT_MS 10000
#define SLOT 256
#define NRECV 8


struct side {
    urma_device_t *dev;
    urma_device_attr_t attr;
    urma_context_t *ctx;
    urma_jfce_t *jfce;
    urma_jfc_t *send_jfc, *jfr_jfc;
    urma_jfr_t *jfr;
    urma_jetty_t *jetty[2];
    urma_target_jetty_t *peer[2];
    urma_target_seg_t *seg;
    uint8_t *buf;
};

struct __attribute__((packed)) ids {
    uint8_t eid[16];
    uint32_t uasid;
    uint32_t jetty[2];
};

static uint8_t g_err_timeout = URMA_TYPICAL_ERR_TIMEOUT;

static urma_jetty_t *make_jetty(struct side *s, uint8_t priority)
{
    urma_jetty_cfg_t jc = {
        .flag.bs.share_jfr = 1,
        .jfs_cfg = {.depth = 64, .trans_mode = URMA_TM_RC, .priority = priority, .max_sge = 1,
                    .rnr_retry = URMA_TYPICAL_RNR_RETRY, .err_timeout = g_err_timeout,
                    .jfc = s->send_jfc},
        .shared.jfr = s->jfr, /* shared.jfc NULL: the JFR's JFC, as URPC does */
    };
    urma_jetty_t *j = urma_create_jetty(s->ctx, &jc);
    CHECK(j != NULL, "urma_create_jetty (errno %d)", errno);
    return j;
}

static void setup(struct side *s, const char *dev, int two_jettys)
{
    s->dev = urma_get_device_by_name((char *)dev);
    CHECK(s->dev != NULL, "no device %s", dev);
    CHECK(urma_query_device(s->dev, &s->attr) == URMA_SUCCESS, "urma_query_device");
    s->ctx = urma_create_context(s->dev, 0);
    CHECK(s->ctx != NULL, "urma_create_context");
    s->jfce = urma_create_jfce(s->ctx);
    CHECK(s->jfce != NULL, "urma_create_jfce");
    urma_jfc_cfg_t sc = {.depth = 256};
    s->send_jfc = urma_create_jfc(s->ctx, &sc);
    urma_jfc_cfg_t rc = {.depth = 256, .jfce = s->jfce};
    s->jfr_jfc = urma_create_jfc(s->ctx, &rc);
    CHECK(s->send_jfc != NULL && s->jfr_jfc != NULL, "urma_create_jfc");
    urma_jfr_cfg_t fc = {.depth = 64, .trans_mode = URMA_TM_RC, .min_rnr_timer = URMA_TYPICAL_MIN_RNR_TIMER,
                         .jfc = s->jfr_jfc, .token_value = {TOKEN}, .max_sge = 1};
    s->jfr = urma_create_jfr(s->ctx, &fc);
    CHECK(s->jfr != NULL, "urma_create_jfr");
    s->jetty[0] = make_jetty(s, 0);
    if (two_jettys)
        s->jetty[1] = make_jetty(s, 0);
    CHECK(posix_memalign((void **)&s->buf, 4096, SEG_LEN) == 0, "posix_memalign");
    memset(s->buf, 0, SEG_LEN);
    urma_seg_cfg_t g = {.va = (uint64_t)(uintptr_t)s->buf, .len = SEG_LEN, .token_value = {TOKEN}};
    g.flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE;
    s->seg = urma_register_seg(s->ctx, &g);
    CHECK(s->seg != NULL, "urma_register_seg");
}

static urma_status_t post_recv(struct side *s, int via, uint32_t slot, uint64_t id)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(s->buf + slot * SLOT), .len = SLOT, .tseg = s->seg};
    urma_jfr_wr_t wr = {.src = {&sge, 1}, .user_ctx = id}, *bad = NULL;
    urma_status_t st = urma_post_jetty_recv_wr(s->jetty[via], &wr, &bad);
    CHECK(st == URMA_SUCCESS || bad == &wr, "a refused receive names itself in bad_wr");
    return st;
}

static urma_status_t post_jfr(struct side *s, urma_jfr_t *jfr, uint32_t slot, uint64_t id)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(s->buf + slot * SLOT), .len = SLOT, .tseg = s->seg};
    urma_jfr_wr_t wr = {.src = {&sge, 1}, .user_ctx = id}, *bad = NULL;
    urma_status_t st = urma_post_jfr_wr(jfr, &wr, &bad);
    CHECK(st == URMA_SUCCESS || bad == &wr, "a refused receive names itself in bad_wr");
    return st;
}

static urma_status_t post_send(struct side *s, int via, urma_target_jetty_t *tj, const char *msg, uint64_t id)
{
    uint32_t off = SEG_LEN - SLOT * (uint32_t)(1 + id % 8); /* a buffer per id: sends overlap */
    memcpy(s->buf + off, msg, strlen(msg) + 1);
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(s->buf + off), .len = (uint32_t)strlen(msg) + 1,
                      .tseg = s->seg};
    urma_jfs_wr_t wr = {.opcode = URMA_OPC_SEND, .tjetty = tj, .user_ctx = id}, *bad = NULL;
    wr.flag.bs.complete_enable = 1;
    wr.send.src = (urma_sg_t){&sge, 1};
    return urma_post_jetty_send_wr(s->jetty[via], &wr, &bad);
}

/* Polls `jfc` until one record arrives (bounded). */
static urma_cr_t poll_one(urma_jfc_t *jfc, const char *what)
{
    urma_cr_t cr;
    for (long i = 0; i < 200000000L; i++) {
        int n = urma_poll_jfc(jfc, 1, &cr);
        CHECK(n >= 0, "urma_poll_jfc returned %d", n);
        if (n == 1)
            return cr;
        if (i % 1000 == 999)
            usleep(50);
    }
    CHECK(0, "no record for %s", what);
    return cr;
}

static void connect_pair(struct side *s, struct ids *peer, int n)
{
    for (int i = 0; i < n; i++) {
        urma_rjetty_t rj = {.trans_mode = URMA_TM_RC, .type = URMA_JETTY, .tp_type = URMA_RTP};
        memcpy(rj.jetty_id.eid.raw, peer->eid, 16);
        rj.jetty_id.uasid = peer->uasid;
        rj.jetty_id.id = peer->jetty[i];
        urma_token_t t = {TOKEN};
        s->peer[i] = urma_import_jetty(s->ctx, &rj, &t);
        CHECK(s->peer[i] != NULL, "urma_import_jetty");
        CHECK(urma_bind_jetty(s->jetty[i], s->peer[i]) == URMA_SUCCESS, "urma_bind_jetty %d", i);
    }
}

static struct ids my_ids(struct side *s)
{
    struct ids me = {0};
    memcpy(me.eid, s->ctx->eid.raw, 16);
    me.uasid = s->ctx->uasid;
    me.jetty[0] = s->jetty[0]->jetty_id.id;
    me.jetty[1] = s->jetty[1] ? s->jetty[1]->jetty_id.id : 0;
    return me;
}

/* ------------------------------------------------------------------ one-process checks */

static int log_lines;
static void count_log(int level, char *msg)
{
    (void)level;
    (void)msg;
    log_lines++;
}

static int objects(void)
{
    role = "objects";
    CHECK(urma_init(NULL) == URMA_SUCCESS, "urma_init");
    struct side a = {0}, b = {0};
    setup(&a, "bypass_sim0", 0);
    setup(&b, "bypass_sim1", 0);

    /* modify_jfc: URPC sets a moderation count of 1; UDMA's limits are checked. */
    urma_jfc_attr_t ja = {.mask = JFC_MODERATE_COUNT, .moderate_count = 1};
    CHECK(urma_modify_jfc(a.jfr_jfc, &ja) == URMA_SUCCESS, "modify_jfc count 1");
    ja = (urma_jfc_attr_t){.mask = JFC_MODERATE_COUNT | JFC_MODERATE_PERIOD, .moderate_count = 4,
                           .moderate_period = 64};
    CHECK(urma_modify_jfc(a.jfr_jfc, &ja) == URMA_SUCCESS, "modify_jfc count 4 period 64");
    ja = (urma_jfc_attr_t){.mask = 0};
    CHECK(urma_modify_jfc(a.jfr_jfc, &ja) == URMA_EINVAL, "modify_jfc with no mask");
    ja = (urma_jfc_attr_t){.mask = JFC_MODERATE_COUNT, .moderate_count = 1024};
    CHECK(urma_modify_jfc(a.jfr_jfc, &ja) == URMA_EINVAL, "modify_jfc count 1024");
    ja = (urma_jfc_attr_t){.mask = JFC_MODERATE_PERIOD, .moderate_period = 65535};
    CHECK(urma_modify_jfc(a.jfr_jfc, &ja) == URMA_EINVAL, "modify_jfc period 65535");
    CHECK(urma_modify_jfc(a.jfr_jfc, NULL) == URMA_EINVAL, "modify_jfc NULL attr");

    /* user_ctl: no driver-specific operations, refused as UDMA refuses an unknown opcode. */
    uint64_t inbuf = 0, outbuf = 0;
    urma_user_ctl_in_t in = {.addr = (uint64_t)(uintptr_t)&inbuf, .len = 8, .opcode = 3};
    urma_user_ctl_out_t out = {.addr = (uint64_t)(uintptr_t)&outbuf, .len = 8};
    CHECK(urma_user_ctl(a.ctx, &in, &out) == URMA_ENOPERM, "user_ctl is URMA_ENOPERM");
    CHECK(urma_user_ctl(a.ctx, NULL, &out) == URMA_EINVAL, "user_ctl NULL in");
    CHECK(urma_user_ctl(NULL, &in, &out) == URMA_EINVAL, "user_ctl NULL ctx");

    /* The log hooks: lines reach the callback until it is unregistered. */
    urma_log_set_level(7);
    CHECK(urma_register_log_func(count_log) == URMA_SUCCESS, "register_log_func");
    (void)urma_modify_jfc(a.jfr_jfc, NULL);
    CHECK(log_lines > 0, "an error line reached the callback");
    CHECK(urma_unregister_log_func() == URMA_SUCCESS, "unregister_log_func");
    int before = log_lines;
    (void)urma_modify_jfc(a.jfr_jfc, NULL);
    CHECK(log_lines == before, "no line reaches an unregistered callback");
    urma_log_set_level(3);

    /* A JFR of its own for the state machine, filled with urma_post_jfr_wr. */
    urma_jfr_cfg_t fc = {.depth = 64, .trans_mode = URMA_TM_RC, .min_rnr_timer = URMA_TYPICAL_MIN_RNR_TIMER,
                         .jfc = a.jfr_jfc, .token_value = {TOKEN}, .max_sge = 1};
    urma_jfr_t *jfr = urma_create_jfr(a.ctx, &fc);
    CHECK(jfr != NULL, "create_jfr");

    /* query_jfr: the configuration and READY. */
    urma_jfr_cfg_t qc;
    urma_jfr_attr_t qa;
    CHECK(urma_query_jfr(jfr, &qc, &qa) == URMA_SUCCESS, "query_jfr");
    CHECK(qc.depth == 64 && qc.jfc == a.jfr_jfc && qa.state == URMA_JFR_STATE_READY,
          "query_jfr: depth %u state %d", qc.depth, qa.state);
    CHECK(urma_query_jfr(jfr, NULL, &qa) == URMA_EINVAL, "query_jfr NULL cfg");

    /* ERROR flushes the posted receives, oldest first, on the JFR's JFC, and wakes its waiter. */
    for (int i = 0; i < 3; i++)
        CHECK(post_jfr(&a, jfr, (uint32_t)i, 100 + (uint64_t)i) == URMA_SUCCESS, "post_jfr_wr %d", i);
    CHECK(urma_rearm_jfc(a.jfr_jfc, false) == URMA_SUCCESS, "rearm");
    urma_jfr_attr_t st = {.mask = JFR_STATE, .state = URMA_JFR_STATE_RESET};
    CHECK(urma_modify_jfr(jfr, &st) == URMA_EINVAL, "READY -> RESET is refused");
    st.state = URMA_JFR_STATE_ERROR;
    CHECK(urma_modify_jfr(jfr, &st) == URMA_SUCCESS, "READY -> ERROR");
    urma_jfc_t *ev[1];
    CHECK(urma_wait_jfc(a.jfce, 1, WAIT_MS, ev) == 1 && ev[0] == a.jfr_jfc, "the flush raised the event");
    uint32_t one = 1;
    urma_ack_jfc(ev, &one, 1);
    urma_cr_t cr[8];
    int n = urma_poll_jfc(a.jfr_jfc, 8, cr);
    CHECK(n == 3, "3 flush records, got %d", n);
    for (int i = 0; i < 3; i++)
        CHECK(cr[i].status == URMA_CR_WR_FLUSH_ERR && cr[i].user_ctx == 100 + (uint64_t)i && cr[i].flag.bs.s_r == 1,
              "flush record %d: status %d user_ctx %llu s_r %d", i, cr[i].status,
              (unsigned long long)cr[i].user_ctx, cr[i].flag.bs.s_r);
    CHECK(urma_query_jfr(jfr, &qc, &qa) == URMA_SUCCESS && qa.state == URMA_JFR_STATE_ERROR, "state ERROR");
    CHECK(post_jfr(&a, jfr, 0, 1) == URMA_EINVAL, "a JFR in ERROR refuses receives");
    st.state = URMA_JFR_STATE_READY;
    CHECK(urma_modify_jfr(jfr, &st) == URMA_EINVAL, "ERROR -> READY is refused");
    st.state = URMA_JFR_STATE_RESET;
    CHECK(urma_modify_jfr(jfr, &st) == URMA_SUCCESS, "ERROR -> RESET");
    st.state = URMA_JFR_STATE_READY;
    CHECK(urma_modify_jfr(jfr, &st) == URMA_SUCCESS, "RESET -> READY");
    st = (urma_jfr_attr_t){.mask = JFR_RX_THRESHOLD, .rx_threshold = 65};
    CHECK(urma_modify_jfr(jfr, &st) == URMA_EINVAL, "rx_threshold above the depth");
    st.mask = 0;
    CHECK(urma_modify_jfr(jfr, &st) == URMA_EINVAL, "no mask");

    /* READY again: a receive posted now serves a message to a jetty on the JFR. */
    CHECK(post_jfr(&a, jfr, 4, 200) == URMA_SUCCESS, "post_jfr_wr after READY");
    a.jfr = jfr;
    a.jetty[0] = make_jetty(&a, 0);
    struct ids ia = my_ids(&a), ib = my_ids(&b);
    connect_pair(&a, &ib, 1);
    connect_pair(&b, &ia, 1);
    CHECK(post_send(&b, 0, b.peer[0], "after recovery", 7) == URMA_SUCCESS, "post SEND");
    urma_cr_t c = poll_one(b.send_jfc, "the SEND");
    CHECK(c.status == URMA_CR_SUCCESS && c.user_ctx == 7, "SEND status %d", c.status);
    c = poll_one(a.jfr_jfc, "the receive");
    CHECK(c.status == URMA_CR_SUCCESS && c.user_ctx == 200 && strcmp((char *)a.buf + 4 * SLOT, "after recovery") == 0,
          "receive after recovery: status %d user_ctx %llu", c.status, (unsigned long long)c.user_ctx);
    printf("objects: all checks passed\n");
    return 0;
}

static int priority(void)
{
    role = "priority";
    CHECK(urma_init(NULL) == URMA_SUCCESS, "urma_init");
    urma_device_t *dev = urma_get_device_by_name("bypass_sim0");
    CHECK(dev != NULL, "device");
    urma_device_attr_t attr;
    CHECK(urma_query_device(dev, &attr) == URMA_SUCCESS, "query_device");
    /* URPC's urpc_default_priority_get: the first priority whose tp set is RTP alone. */
    int prio = -1;
    for (int i = 0; i < URMA_MAX_PRIORITY_CNT && prio < 0; i++) {
        union urma_tp_type_en t = attr.dev_cap.priority_info[i].tp_type;
        if (t.bs.rtp == 1 && t.bs.ctp == 0 && t.bs.utp == 0)
            prio = i;
    }
    CHECK(prio >= 0, "there is no priority for tp_type rtp");
    CHECK(attr.dev_cap.rc_tp_cap.bs.rtp == 1, "rc_tp_cap has RTP (value %#x)", attr.dev_cap.rc_tp_cap.value);
    CHECK(attr.dev_cap.rc_order_cap.bs.ol == 1, "rc_order_cap has OL (value %#x)", attr.dev_cap.rc_order_cap.value);
    struct side s = {0};
    setup(&s, "bypass_sim0", 0);
    urma_jetty_t *j = make_jetty(&s, (uint8_t)prio);
    CHECK(j->jetty_cfg.jfs_cfg.priority == prio, "the jetty keeps its priority");
    printf("priority: %d is RTP; all checks passed\n", prio);
    return 0;
}

/* URPC's device lookup by name takes an EID as IPv4 only when it is IPv4-mapped with the reserved
 * bits zero (is_eid_ipv6 in its jetty provider); run on the UDP wire. */
static int eid_v4(void)
{
    role = "eid";
    CHECK(urma_init(NULL) == URMA_SUCCESS, "urma_init");
    urma_device_t *dev = urma_get_device_by_name("bypass_sim0");
    CHECK(dev != NULL, "device");
    uint32_t cnt = 0;
    urma_eid_info_t *eids = urma_get_eid_list(dev, &cnt);
    CHECK(eids != NULL && cnt == 1, "one EID");
    urma_eid_t e = eids[0].eid;
    urma_free_eid_list(eids);
    CHECK(e.in4.reserved == 0 && e.in4.prefix == htonl(0x0000ffff),
          "the EID is not IPv4-mapped with zero reserved bits: reserved %#llx prefix %#x",
          (unsigned long long)e.in4.reserved, ntohl(e.in4.prefix));
    CHECK(ntohl(e.in4.addr) == 0x7f000001, "the EID is ::ffff:127.0.0.1 (addr %#x)", ntohl(e.in4.addr));
    CHECK(urma_get_device_by_eid(e, URMA_TRANSPORT_UB) == dev, "urma_get_device_by_eid finds the device");
    urma_context_t *ctx = urma_create_context(dev, 0);
    CHECK(ctx != NULL && memcmp(ctx->eid.raw, e.raw, 16) == 0, "the context has the device's EID");
    CHECK(ctx->uasid >= 1 && ctx->uasid <= 65535, "the uasid is the device's UDP port (%u)", ctx->uasid);
    printf("eid: all checks passed\n");
    return 0;
}

/* ------------------------------------------------------------------ two processes */

enum scen { SHARED_JFR, RC_TJETTY, EVENT_QUEUED, ACK_FLOOR, PEER_STALL };

static enum scen parse(const char *s)
{
    if (strcmp(s, "shared_jfr") == 0)
        return SHARED_JFR;
    if (strcmp(s, "rc_tjetty") == 0)
        return RC_TJETTY;
    if (strcmp(s, "ack_floor") == 0) {
        g_err_timeout = 2; /* URPC's: 4.096 us x 2^2 = 16.4 us */
        return ACK_FLOOR;
    }
    if (strcmp(s, "peer_stall") == 0) {
        g_err_timeout = 2;
        return PEER_STALL;
    }
    CHECK(strcmp(s, "event_queued") == 0, "unknown scenario %s", s);
    return EVENT_QUEUED;
}

/* Receives: through the first jetty only (URPC) in shared_jfr, else NRECV through each. */
static void post_receives(struct side *s, enum scen sc)
{
    for (int i = 0; i < NRECV; i++) {
        CHECK(post_recv(s, 0, (uint32_t)i, 1000 + (uint64_t)i) == URMA_SUCCESS, "post_recv A %d", i);
        if (sc != SHARED_JFR)
            CHECK(post_recv(s, 1, (uint32_t)(NRECV + i), 2000 + (uint64_t)i) == URMA_SUCCESS, "post_recv B %d", i);
    }
}

static uint8_t *payload(struct side *s, urma_cr_t cr)
{
    uint64_t slot = cr.user_ctx >= 2000 ? NRECV + cr.user_ctx - 2000 : cr.user_ctx - 1000;
    CHECK(slot < 2 * NRECV, "user_ctx %llu is none of ours", (unsigned long long)cr.user_ctx);
    return s->buf + slot * SLOT;
}

static int server(enum scen sc)
{
    role = "server";
    int ls = listen_and_announce();
    CHECK(urma_init(NULL) == URMA_SUCCESS, "urma_init");
    struct side s = {0};
    setup(&s, "bypass_sim0", 1);
    post_receives(&s, sc);
    int fd = accept_one(ls);
    struct ids me = my_ids(&s), peer;
    xfer(fd, &me, sizeof me, 1);
    xfer(fd, &peer, sizeof peer, 0);
    connect_pair(&s, &peer, 2);
    sync_byte(fd, 1);
    sync_byte(fd, 0); /* both ends are bound */

    if (sc == SHARED_JFR) {
        int seen[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            urma_cr_t cr = poll_one(s.jfr_jfc, "a client SEND");
            CHECK(cr.status == URMA_CR_SUCCESS && cr.flag.bs.s_r == 1, "receive status %d", cr.status);
            CHECK(cr.user_ctx >= 1000 && cr.user_ctx < 1000 + NRECV, "a receive posted through A");
            int on = cr.local_id == s.jetty[1]->jetty_id.id;
            CHECK(on || cr.local_id == s.jetty[0]->jetty_id.id, "local_id %u names A or B", cr.local_id);
            CHECK(strcmp((char *)payload(&s, cr), on ? "to B" : "to A") == 0, "payload on %c", on ? 'B' : 'A');
            seen[on]++;
        }
        CHECK(seen[0] == 1 && seen[1] == 1, "one message on each jetty");
    } else if (sc == ACK_FLOOR || sc == PEER_STALL) {
        /* The client process (its simulated device included) sleeps 40 ms (ack_floor) or 500 ms
         * (peer_stall) while our SEND is in flight: a 16.4 us ACK timeout would run out its
         * retries long before it wakes, and so would eight fixed 16.8 ms ones. */
        int32_t pid = 0;
        xfer(fd, &pid, sizeof pid, 0);
        CHECK(kill(pid, SIGSTOP) == 0, "SIGSTOP the client: %s", strerror(errno));
        CHECK(post_send(&s, 1, NULL, "while you slept", 9) == URMA_SUCCESS, "post SEND");
        usleep(sc == ACK_FLOOR ? 40000 : 500000);
        CHECK(kill(pid, SIGCONT) == 0, "SIGCONT the client: %s", strerror(errno));
        urma_cr_t cr = poll_one(s.send_jfc, "the SEND");
        CHECK(cr.status == URMA_CR_SUCCESS,
              "SEND status %d (9: ACK timeout; %s)", cr.status,
              sc == ACK_FLOOR ? "err_timeout 2 was not raised to the byte wire's floor"
                              : "the retransmission timer gave up while the peer was stopped");
    } else {
        /* rc_tjetty: name the other connection's target; event_queued: the bound one. */
        urma_target_jetty_t *tj = sc == RC_TJETTY ? s.peer[0] : s.peer[1];
        CHECK(post_send(&s, 1, tj, "reply on B", 9) == URMA_SUCCESS,
              "an RC SEND whose tjetty is not the bound target is posted (UDMA uses the bound one)");
        urma_cr_t cr = poll_one(s.send_jfc, "the reply");
        CHECK(cr.status == URMA_CR_SUCCESS && cr.user_ctx == 9, "reply status %d", cr.status);
    }
    sync_byte(fd, 1);
    sync_byte(fd, 0);
    close(fd);
    close(ls);
    printf("server: all checks passed\n");
    return 0;
}

static int client(int port, enum scen sc)
{
    role = "client";
    CHECK(urma_init(NULL) == URMA_SUCCESS, "urma_init");
    struct side s = {0};
    setup(&s, "bypass_sim0", 1);
    post_receives(&s, sc);
    int fd = connect_loopback(port);
    struct ids me = my_ids(&s), peer;
    xfer(fd, &peer, sizeof peer, 0);
    xfer(fd, &me, sizeof me, 1);
    connect_pair(&s, &peer, 2);
    sync_byte(fd, 0);
    sync_byte(fd, 1); /* both ends are bound */

    if (sc == SHARED_JFR) {
        CHECK(post_send(&s, 0, s.peer[0], "to A", 1) == URMA_SUCCESS, "SEND on CA");
        CHECK(post_send(&s, 1, s.peer[1], "to B", 2) == URMA_SUCCESS, "SEND on CB");
        for (int k = 0; k < 2; k++) {
            urma_cr_t cr = poll_one(s.send_jfc, "a SEND");
            CHECK(cr.status == URMA_CR_SUCCESS, "SEND %llu status %d (an RNR here: B found no receive)",
                  (unsigned long long)cr.user_ctx, cr.status);
        }
        sync_byte(fd, 0);
    } else if (sc == ACK_FLOOR || sc == PEER_STALL) {
        int32_t pid = (int32_t)getpid();
        xfer(fd, &pid, sizeof pid, 1);
        sync_byte(fd, 0);
        urma_cr_t cr = poll_one(s.jfr_jfc, "the SEND sent while we were stopped");
        CHECK(cr.status == URMA_CR_SUCCESS && cr.local_id == s.jetty[1]->jetty_id.id, "receive status %d",
              cr.status);
        CHECK(strcmp((char *)payload(&s, cr), "while you slept") == 0, "payload");
    } else {
        sync_byte(fd, 0); /* the reply is sent and acknowledged: it is in our JFC */
        urma_cr_t cr;
        if (sc == EVENT_QUEUED) {
            CHECK(urma_rearm_jfc(s.jfr_jfc, false) == URMA_SUCCESS, "rearm");
            urma_jfc_t *ev[1];
            int n = urma_wait_jfc(s.jfce, 1, WAIT_MS, ev);
            CHECK(n == 1 && ev[0] == s.jfr_jfc,
                  "urma_wait_jfc returned %d: a rearm with a record already in the JFC raised no event", n);
            uint32_t one = 1;
            urma_ack_jfc(ev, &one, 1);
            CHECK(urma_poll_jfc(s.jfr_jfc, 1, &cr) == 1, "the record behind the event");
        } else {
            cr = poll_one(s.jfr_jfc, "the reply");
        }
        CHECK(cr.status == URMA_CR_SUCCESS && cr.flag.bs.s_r == 1, "reply status %d", cr.status);
        CHECK(cr.local_id == s.jetty[1]->jetty_id.id, "the reply reached CB (B's bound target), local_id %u",
              cr.local_id);
        CHECK(strcmp((char *)payload(&s, cr), "reply on B") == 0, "reply payload");
    }
    sync_byte(fd, 1);
    close(fd);
    printf("client: all checks passed\n");
    return 0;
}

int main(int argc, char **argv)
{
    alarm(60); /* a bound on the whole run, whatever happens */
    if (argc >= 2 && strcmp(argv[1], "objects") == 0)
        return objects();
    if (argc >= 2 && strcmp(argv[1], "priority") == 0)
        return priority();
    if (argc >= 2 && strcmp(argv[1], "eid") == 0)
        return eid_v4();
    if (argc >= 3 && strcmp(argv[1], "server") == 0)
        return server(parse(argv[2]));
    if (argc >= 4 && strcmp(argv[1], "client") == 0)
        return client(atoi(argv[2]), parse(argv[3]));
    fprintf(stderr, "usage: %s objects | priority | eid | server <scenario> | client <port> <scenario>\n", argv[0]);
    return 2;
}
