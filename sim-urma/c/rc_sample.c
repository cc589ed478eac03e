/*
 * rc_sample.c — UMDK's RC setup sequence (urma-abi.md §5) written only against the public URMA
 * API (include/urma_api.h), run as two processes that exchange their segment and jetty over TCP:
 *
 *   rc_sample server            prints "PORT <n>", then serves one client
 *   rc_sample client <port>     connects to 127.0.0.1:<port>
 *
 * The client SENDs, WRITEs, SEND_IMMs and READs; both sides take completions in event mode
 * (rearm, wait, poll, ack). Then the client WRITEs with a wrong token: its record fails with
 * REM_ACCESS_ABORT_ERR, the server's bytes stay as they were and the server gets an async
 * JETTY_ERR event; the client's jetty is in ERROR and flushes a later WR. Every wait is bounded.
 * Exit status 0 means every check passed.
 */
#define _GNU_SOURCE
#include "urma_api.h"
#include "sample.h"

#include <sched.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOKEN 0xACFE
#define SEG_LEN 4096
#define WAIT_MS 10000


struct __attribute__((packed)) record {
    uint8_t eid[16];
    uint32_t uasid;
    uint64_t seg_va;
    uint64_t seg_len;
    uint32_t seg_flag;
    uint32_t seg_token_id;
    urma_jetty_id_t jetty_id;
};
_Static_assert(sizeof(struct record) == 68, "the sample's exchange record is 68 bytes");

struct res {
    urma_device_t *dev;
    urma_device_attr_t attr;
    urma_context_t *ctx;
    urma_jfce_t *jfce;
    urma_jfc_t *jfc;
    urma_jfr_t *jfr;
    urma_jetty_t *jetty;
    urma_target_seg_t *seg;
    uint8_t *buf;
    urma_target_seg_t *rseg;
    urma_target_jetty_t *tjetty;
    struct record peer;
};

static void setup(struct res *r, const char *dev_name)
{
    urma_init_attr_t init = {.uasid = 0};
    CHECK(urma_init(&init) == URMA_SUCCESS, "urma_init");
    r->dev = urma_get_device_by_name((char *)dev_name);
    CHECK(r->dev != NULL, "no device %s", dev_name);
    CHECK(urma_query_device(r->dev, &r->attr) == URMA_SUCCESS, "urma_query_device");
    uint32_t cnt = 0;
    urma_eid_info_t *eids = urma_get_eid_list(r->dev, &cnt);
    CHECK(eids != NULL && cnt >= 1, "urma_get_eid_list");
    uint32_t idx = eids[0].eid_index;
    urma_free_eid_list(eids);
    r->ctx = urma_create_context(r->dev, idx);
    CHECK(r->ctx != NULL, "urma_create_context");
    r->jfce = urma_create_jfce(r->ctx);
    CHECK(r->jfce != NULL && r->jfce->fd >= 0, "urma_create_jfce");
    urma_jfc_cfg_t jc = {.depth = r->attr.dev_cap.max_jfc_depth, .jfce = r->jfce};
    r->jfc = urma_create_jfc(r->ctx, &jc);
    CHECK(r->jfc != NULL, "urma_create_jfc");
    CHECK(urma_rearm_jfc(r->jfc, false) == URMA_SUCCESS, "urma_rearm_jfc");
    urma_jfr_cfg_t rc = {.depth = 256, .trans_mode = URMA_TM_RC, .min_rnr_timer = URMA_TYPICAL_MIN_RNR_TIMER,
                         .jfc = r->jfc, .token_value = {TOKEN}, .max_sge = 1};
    r->jfr = urma_create_jfr(r->ctx, &rc);
    CHECK(r->jfr != NULL, "urma_create_jfr");
    urma_jetty_cfg_t jcfg = {
        .flag.bs.share_jfr = 1,
        .jfs_cfg = {.depth = 256, .trans_mode = URMA_TM_RC, .priority = URMA_MAX_PRIORITY, .max_sge = 1,
                    .rnr_retry = URMA_TYPICAL_RNR_RETRY, .err_timeout = URMA_TYPICAL_ERR_TIMEOUT, .jfc = r->jfc},
        .shared.jfr = r->jfr,
    };
    r->jetty = urma_create_jetty(r->ctx, &jcfg);
    CHECK(r->jetty != NULL, "urma_create_jetty");
    CHECK(jcfg.jfs_cfg.flag.bs.order_type == URMA_OL, "create_jetty rewrote order_type 0 to OL, got %u",
          jcfg.jfs_cfg.flag.bs.order_type);
    CHECK(posix_memalign((void **)&r->buf, 4096, SEG_LEN) == 0, "posix_memalign");
    memset(r->buf, 0, SEG_LEN);
    urma_seg_cfg_t sc = {.va = (uint64_t)(uintptr_t)r->buf, .len = SEG_LEN, .token_value = {TOKEN}};
    sc.flag.bs.token_policy = URMA_TOKEN_NONE;
    sc.flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC;
    r->seg = urma_register_seg(r->ctx, &sc);
    CHECK(r->seg != NULL, "urma_register_seg");
}

static void exchange(struct res *r, int fd)
{
    struct record me = {0};
    memcpy(me.eid, r->ctx->eid.raw, 16);
    me.uasid = r->ctx->uasid;
    me.seg_va = r->seg->seg.ubva.va;
    me.seg_len = r->seg->seg.len;
    me.seg_flag = r->seg->seg.attr.value;
    me.seg_token_id = r->seg->seg.token_id;
    me.jetty_id = r->jetty->jetty_id;
    xfer(fd, &me, sizeof me, 1);
    xfer(fd, &r->peer, sizeof r->peer, 0);
}

static urma_target_seg_t *import_peer_seg(struct res *r, uint32_t token)
{
    urma_seg_t s = {0};
    memcpy(s.ubva.eid.raw, r->peer.eid, 16);
    s.ubva.uasid = r->peer.uasid;
    s.ubva.va = r->peer.seg_va;
    s.len = r->peer.seg_len;
    s.attr.value = r->peer.seg_flag;
    s.token_id = r->peer.seg_token_id;
    urma_token_t t = {token};
    urma_import_seg_flag_t f = {.bs = {.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE | URMA_ACCESS_ATOMIC,
                                       .mapping = URMA_SEG_NOMAP}};
    urma_target_seg_t *ts = urma_import_seg(r->ctx, &s, &t, 0, f);
    CHECK(ts != NULL, "urma_import_seg");
    return ts;
}

static void connect_jetty(struct res *r)
{
    urma_rjetty_t rj = {.jetty_id = r->peer.jetty_id, .trans_mode = URMA_TM_RC, .type = URMA_JETTY,
                        .tp_type = URMA_RTP};
    urma_token_t t = {TOKEN};
    r->tjetty = urma_import_jetty(r->ctx, &rj, &t);
    CHECK(r->tjetty != NULL, "urma_import_jetty");
    CHECK(rj.flag.bs.order_type == URMA_OL, "import_jetty rewrote order_type to OL");
    CHECK(urma_bind_jetty(r->jetty, r->tjetty) == URMA_SUCCESS, "urma_bind_jetty");
    CHECK(urma_bind_jetty(r->jetty, r->tjetty) == URMA_EEXIST, "a second bind returns URMA_EEXIST");
}

/* Event mode: wait for the JFC's event, poll one record, ack, rearm. */
static urma_cr_t next_cr(struct res *r)
{
    urma_cr_t cr;
    for (;;) {
        int n = urma_poll_jfc(r->jfc, 1, &cr);
        CHECK(n >= 0, "urma_poll_jfc returned %d", n);
        if (n == 1)
            return cr;
        urma_jfc_t *ev[1];
        n = urma_wait_jfc(r->jfce, 1, WAIT_MS, ev);
        CHECK(n == 1, "urma_wait_jfc returned %d (0 = no event within %d ms)", n, WAIT_MS);
        CHECK(ev[0] == r->jfc, "the event names our JFC");
        uint32_t one = 1;
        urma_ack_jfc(ev, &one, 1);
        CHECK(urma_rearm_jfc(r->jfc, false) == URMA_SUCCESS, "urma_rearm_jfc");
    }
}

static void post_recv(struct res *r, uint32_t off, uint32_t len, uint64_t id)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(r->buf + off), .len = len, .tseg = r->seg};
    urma_jfr_wr_t wr = {.src = {&sge, 1}, .user_ctx = id}, *bad = NULL;
    CHECK(urma_post_jetty_recv_wr(r->jetty, &wr, &bad) == URMA_SUCCESS, "urma_post_jetty_recv_wr");
}

static urma_status_t post_send(struct res *r, urma_opcode_t op, uint32_t off, uint32_t len, urma_target_seg_t *rseg,
                               uint64_t roff, uint64_t imm, uint64_t id)
{
    urma_sge_t local = {.addr = (uint64_t)(uintptr_t)(r->buf + off), .len = len, .tseg = r->seg};
    urma_sge_t remote = {.addr = r->peer.seg_va + roff, .len = len, .tseg = rseg};
    urma_jfs_wr_t wr = {.opcode = op, .tjetty = r->tjetty, .user_ctx = id};
    wr.flag.bs.complete_enable = 1;
    if (op == URMA_OPC_SEND || op == URMA_OPC_SEND_IMM) {
        wr.send.src = (urma_sg_t){&local, 1};
        wr.send.imm_data = imm;
    } else if (op == URMA_OPC_READ) {
        wr.rw.src = (urma_sg_t){&remote, 1};
        wr.rw.dst = (urma_sg_t){&local, 1};
    } else {
        wr.rw.src = (urma_sg_t){&local, 1};
        wr.rw.dst = (urma_sg_t){&remote, 1};
        wr.rw.notify_data = imm;
    }
    urma_jfs_wr_t *bad = NULL;
    return urma_post_jetty_send_wr(r->jetty, &wr, &bad);
}

static void expect_cr(urma_cr_t cr, uint64_t id, urma_cr_status_t st, int recv)
{
    CHECK(cr.user_ctx == id && cr.status == st && cr.flag.bs.s_r == recv,
          "record: user_ctx %llu status %d s_r %d, expected %llu %d %d", (unsigned long long)cr.user_ctx,
          cr.status, cr.flag.bs.s_r, (unsigned long long)id, st, recv);
}

static void teardown(struct res *r)
{
    CHECK(urma_unbind_jetty(r->jetty) == URMA_SUCCESS, "urma_unbind_jetty");
    CHECK(urma_unimport_jetty(r->tjetty) == URMA_SUCCESS, "urma_unimport_jetty");
    if (r->rseg)
        CHECK(urma_unimport_seg(r->rseg) == URMA_SUCCESS, "urma_unimport_seg");
    CHECK(urma_unregister_seg(r->seg) == URMA_SUCCESS, "urma_unregister_seg");
    CHECK(urma_delete_jetty(r->jetty) == URMA_SUCCESS, "urma_delete_jetty");
    CHECK(urma_delete_jfr(r->jfr) == URMA_SUCCESS, "urma_delete_jfr");
    CHECK(urma_delete_jfc(r->jfc) == URMA_SUCCESS, "urma_delete_jfc");
    CHECK(urma_delete_jfce(r->jfce) == URMA_SUCCESS, "urma_delete_jfce");
    CHECK(urma_delete_context(r->ctx) == URMA_SUCCESS, "urma_delete_context");
    CHECK(urma_uninit() == URMA_SUCCESS, "urma_uninit");
    free(r->buf);
}

static int server(void)
{
    role = "server";
    struct res r = {0};
    int ls = listen_and_announce();
    setup(&r, "bypass_sim0");
    int fd = accept_one(ls);
    exchange(&r, fd);
    connect_jetty(&r);
    post_recv(&r, 0, 256, 100);
    post_recv(&r, 256, 256, 101);
    sync_byte(fd, 1);

    urma_cr_t cr = next_cr(&r);
    expect_cr(cr, 100, URMA_CR_SUCCESS, 1);
    CHECK(cr.opcode == URMA_CR_OPC_SEND && cr.completion_len == 18, "SEND record: opcode %d len %u", cr.opcode,
          cr.completion_len);
    CHECK(memcmp(r.buf, "hello from client", 18) == 0, "SEND payload");
    CHECK(cr.remote_id.id == r.peer.jetty_id.id && memcmp(cr.remote_id.eid.raw, r.peer.eid, 16) == 0,
          "remote_id names the client's jetty");
    cr = next_cr(&r);
    expect_cr(cr, 101, URMA_CR_SUCCESS, 1);
    CHECK(cr.opcode == URMA_CR_OPC_SEND_WITH_IMM && cr.imm_data == 0x1234, "SEND_IMM: opcode %d imm %#llx",
          cr.opcode, (unsigned long long)cr.imm_data);
    CHECK(memcmp(r.buf + 1024, "written by the client", 22) == 0, "WRITE landed before the SEND_IMM");

    memcpy(r.buf + 2048, "served for READ", 16);
    memset(r.buf + 3000, 0x5a, 64);
    sync_byte(fd, 1); /* the client may READ now */
    sync_byte(fd, 0); /* the client tried a WRITE with a wrong token */

    for (int i = 0; i < 64; i++)
        CHECK(r.buf[3000 + i] == 0x5a, "a WRITE with a wrong token moved a byte (offset %d)", 3000 + i);
    struct pollfd p = {.fd = r.ctx->async_fd, .events = POLLIN};
    int n = 0;
    urma_async_event_t ev;
    for (;;) {
        n = poll(&p, 1, WAIT_MS);
        CHECK(n == 1, "no async event within %d ms", WAIT_MS);
        CHECK(urma_get_async_event(r.ctx, &ev) == URMA_SUCCESS, "urma_get_async_event");
        if (ev.event_type == URMA_EVENT_JETTY_ERR)
            break;
        urma_ack_async_event(&ev);
    }
    CHECK(ev.element.jetty == r.jetty, "the JETTY_ERR event names our jetty");
    urma_ack_async_event(&ev);
    CHECK(r.jetty->async_events_acked == 1, "ack counted on the jetty");
    urma_jetty_cfg_t qc;
    urma_jetty_attr_t qa;
    CHECK(urma_query_jetty(r.jetty, &qc, &qa) == URMA_SUCCESS && qa.state == URMA_JETTY_STATE_ERROR,
          "the responder's jetty is in ERROR (state %d)", qa.state);
    sync_byte(fd, 1);
    sync_byte(fd, 0);
    teardown(&r);
    close(fd);
    close(ls);
    printf("server: all checks passed\n");
    return 0;
}

static int client(int port)
{
    role = "client";
    struct res r = {0};
    setup(&r, "bypass_sim0");
    int fd = connect_loopback(port);
    exchange(&r, fd);
    r.rseg = import_peer_seg(&r, TOKEN);
    connect_jetty(&r);
    sync_byte(fd, 0); /* the server's receives are posted */

    memcpy(r.buf, "hello from client", 18);
    CHECK(post_send(&r, URMA_OPC_SEND, 0, 18, NULL, 0, 0, 1) == URMA_SUCCESS, "post SEND");
    expect_cr(next_cr(&r), 1, URMA_CR_SUCCESS, 0);
    memcpy(r.buf + 100, "written by the client", 22);
    CHECK(post_send(&r, URMA_OPC_WRITE, 100, 22, r.rseg, 1024, 0, 2) == URMA_SUCCESS, "post WRITE");
    expect_cr(next_cr(&r), 2, URMA_CR_SUCCESS, 0);
    CHECK(post_send(&r, URMA_OPC_SEND_IMM, 0, 4, NULL, 0, 0x1234, 3) == URMA_SUCCESS, "post SEND_IMM");
    expect_cr(next_cr(&r), 3, URMA_CR_SUCCESS, 0);

    sync_byte(fd, 0);
    CHECK(post_send(&r, URMA_OPC_READ, 512, 16, r.rseg, 2048, 0, 4) == URMA_SUCCESS, "post READ");
    urma_cr_t cr = next_cr(&r);
    expect_cr(cr, 4, URMA_CR_SUCCESS, 0);
    CHECK(memcmp(r.buf + 512, "served for READ", 16) == 0, "READ brought the server's bytes");

    urma_target_seg_t *wrong = import_peer_seg(&r, TOKEN ^ 1);
    memset(r.buf + 600, 0xee, 64);
    CHECK(post_send(&r, URMA_OPC_WRITE, 600, 64, wrong, 3000, 0, 5) == URMA_SUCCESS, "post WRITE (wrong token)");
    cr = next_cr(&r);
    expect_cr(cr, 5, URMA_CR_REM_ACCESS_ABORT_ERR, 0);
    sync_byte(fd, 1);

    urma_jetty_cfg_t qc;
    urma_jetty_attr_t qa;
    CHECK(urma_query_jetty(r.jetty, &qc, &qa) == URMA_SUCCESS && qa.state == URMA_JETTY_STATE_ERROR,
          "the requester's jetty is in ERROR (state %d)", qa.state);
    CHECK(post_send(&r, URMA_OPC_SEND, 0, 4, NULL, 0, 0, 6) == URMA_SUCCESS, "a jetty in ERROR accepts posts");
    urma_cr_t fl[4];
    int n = 0;
    /* The device flushes the WR on its own thread: poll with a deadline, not a try count (a
     * loaded host may not schedule that thread within any fixed number of tries). */
    for (uint64_t until = now_ms() + WAIT_MS; n == 0 && now_ms() < until; sched_yield())
        n = urma_flush_jetty(r.jetty, 4, fl);
    CHECK(n == 1, "urma_flush_jetty returned %d within %d ms", n, WAIT_MS);
    expect_cr(fl[0], 6, URMA_CR_WR_FLUSH_ERR, 0);
    CHECK(urma_unimport_seg(wrong) == URMA_SUCCESS, "unimport the wrong-token segment");
    sync_byte(fd, 0);
    sync_byte(fd, 1);
    teardown(&r);
    close(fd);
    printf("client: all checks passed\n");
    return 0;
}

int badinput(void);

int main(int argc, char **argv)
{
    alarm(60); /* a bound on the whole run, whatever happens */
    if (argc >= 2 && strcmp(argv[1], "server") == 0)
        return server();
    if (argc >= 3 && strcmp(argv[1], "client") == 0)
        return client(atoi(argv[2]));
    if (argc >= 2 && strcmp(argv[1], "badinput") == 0)
        return badinput();
    fprintf(stderr, "usage: %s server | client <port> | badinput\n", argv[0]);
    return 2;
}
