/*
 * um_sample.c — connectionless jettys, UM (unreliable message) or RM (reliable message), as
 * UMDK's sample and URPC use them, written only against the public URMA API
 * (include/urma_api.h), run as two processes that exchange their jetty ids over TCP:
 *
 *   um_sample server um|rm           prints "PORT <n>", then serves one client
 *   um_sample client <port> um|rm    connects to 127.0.0.1:<port>
 *
 * The server has two UM jettys (A and B, each on a UM JFR of its own) and the client one (C).
 * Each side imports the other's jettys with trans_mode UM. The client posts one WR list from C
 * whose two SENDs name different targets in wr->tjetty (A, then B with an immediate). The server
 * checks each receive record: its payload, the receiving jetty (local_id) and the sender
 * (remote_id: C's EID, uasid and id). Before that the client WRITEs into and READs from the
 * server's segment through A (UM memory operations, as UMDK's sample does). The server then replies from A to the sender the record named;
 * the client checks that record's remote_id is A. Also: urma_query_device reports UM with a UTP
 * transport; a UM jetty refuses urma_bind_jetty (URMA_ENOPERM) and a send without wr->tjetty
 * (URMA_EINVAL, bad_wr set) or naming a target imported with the other mode. Every wait is
 * bounded. Exit 0: all checks passed.
 *
 * The same exchange runs in either mode (everything above holds for both); RM adds what makes it
 * reliable: the client's SEND to B is posted before B has a receive, and the server posts that
 * receive only after the client saw the SEND to A complete. UM drops a datagram that finds no
 * receive; RM retries it (RNR) until the receive is there, so B's record must arrive.
 */
#define _GNU_SOURCE
#include "urma_api.h"
#include "sample.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOKEN 0xACFE
#define SEG_LEN 4096
#define WAIT_MS 10000

/* URMA_TM_UM or URMA_TM_RM (argv). */
static urma_transport_mode_t mode = URMA_TM_UM;
#define MODE_NAME (mode == URMA_TM_RM ? "RM" : "UM")

/* What the server sends: its two jettys and its segment. */
struct __attribute__((packed)) offer {
    urma_jetty_id_t jetty[2];
    uint64_t seg_va, seg_len;
    uint32_t seg_flag, seg_token_id;
};

struct res {
    urma_device_attr_t attr;
    urma_context_t *ctx;
    urma_jfc_t *jfc;
    urma_jfr_t *jfr[2];
    urma_jetty_t *jetty[2];
    urma_target_seg_t *seg;
    uint8_t *buf;
    urma_target_jetty_t *tj[2];
    urma_jetty_id_t peer[2];
    urma_target_jetty_t *other; /* the client's jetty imported with the other mode */
};

static urma_jetty_t *um_jetty(struct res *r, int i)
{
    urma_jfr_cfg_t rc = {.depth = 64, .trans_mode = mode, .min_rnr_timer = URMA_TYPICAL_MIN_RNR_TIMER,
                         .jfc = r->jfc, .token_value = {TOKEN}, .max_sge = 1};
    r->jfr[i] = urma_create_jfr(r->ctx, &rc);
    CHECK(r->jfr[i] != NULL, "urma_create_jfr (%s)", MODE_NAME);
    urma_jetty_cfg_t jcfg = {
        .flag.bs.share_jfr = 1,
        .jfs_cfg = {.depth = 64, .trans_mode = mode, .priority = URMA_MAX_PRIORITY, .max_sge = 1,
                    .rnr_retry = URMA_TYPICAL_RNR_RETRY, .err_timeout = URMA_TYPICAL_ERR_TIMEOUT, .jfc = r->jfc},
        .shared.jfr = r->jfr[i],
    };
    urma_jetty_t *j = urma_create_jetty(r->ctx, &jcfg);
    CHECK(j != NULL, "urma_create_jetty (%s)", MODE_NAME);
    urma_order_type_t order = mode == URMA_TM_RM ? URMA_OI : URMA_NO;
    CHECK(jcfg.jfs_cfg.flag.bs.order_type == order, "create_jetty rewrote %s's order_type 0 to %u, got %u", MODE_NAME,
          order, jcfg.jfs_cfg.flag.bs.order_type);
    return j;
}

static void setup(struct res *r, int jettys)
{
    urma_init_attr_t init = {.uasid = 0};
    CHECK(urma_init(&init) == URMA_SUCCESS, "urma_init");
    urma_device_t *dev = urma_get_device_by_name("bypass_sim0");
    CHECK(dev != NULL, "no device bypass_sim0");
    CHECK(urma_query_device(dev, &r->attr) == URMA_SUCCESS, "urma_query_device");
    CHECK(r->attr.dev_cap.trans_mode & mode, "the device reports %s (trans_mode %#x)", MODE_NAME,
          r->attr.dev_cap.trans_mode);
    if (mode == URMA_TM_RM)
        CHECK(r->attr.dev_cap.rm_tp_cap.bs.rtp == 1, "the device reports RM over RTP");
    else
        CHECK(r->attr.dev_cap.um_tp_cap.bs.utp == 1, "the device reports UM over UTP");
    r->ctx = urma_create_context(dev, 0);
    CHECK(r->ctx != NULL, "urma_create_context");
    urma_jfc_cfg_t jc = {.depth = 256};
    r->jfc = urma_create_jfc(r->ctx, &jc);
    CHECK(r->jfc != NULL, "urma_create_jfc");
    for (int i = 0; i < jettys; i++)
        r->jetty[i] = um_jetty(r, i);
    CHECK(posix_memalign((void **)&r->buf, 4096, SEG_LEN) == 0, "posix_memalign");
    memset(r->buf, 0, SEG_LEN);
    urma_seg_cfg_t sc = {.va = (uint64_t)(uintptr_t)r->buf, .len = SEG_LEN, .token_value = {TOKEN}};
    sc.flag.bs.token_policy = URMA_TOKEN_NONE;
    sc.flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE;
    r->seg = urma_register_seg(r->ctx, &sc);
    CHECK(r->seg != NULL, "urma_register_seg");
}

static urma_target_jetty_t *import_as(struct res *r, urma_jetty_id_t id, urma_transport_mode_t m)
{
    urma_rjetty_t rj = {.jetty_id = id, .trans_mode = m, .type = URMA_JETTY,
                        .tp_type = m == URMA_TM_RM ? URMA_RTP : URMA_UTP};
    urma_token_t t = {TOKEN};
    urma_target_jetty_t *tj = urma_import_jetty(r->ctx, &rj, &t);
    CHECK(tj != NULL, "urma_import_jetty (trans_mode %d)", m);
    return tj;
}

static urma_target_jetty_t *import_um(struct res *r, urma_jetty_id_t id)
{
    return import_as(r, id, mode);
}

static void post_recv(struct res *r, int j, uint32_t off, uint64_t id)
{
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(r->buf + off), .len = 256, .tseg = r->seg};
    urma_jfr_wr_t wr = {.src = {&sge, 1}, .user_ctx = id}, *bad = NULL;
    CHECK(urma_post_jetty_recv_wr(r->jetty[j], &wr, &bad) == URMA_SUCCESS, "urma_post_jetty_recv_wr");
}

/* The next record, polling with a deadline. */
static urma_cr_t next_cr(struct res *r)
{
    uint64_t until = now_ms() + WAIT_MS;
    urma_cr_t cr;
    for (;;) {
        int n = urma_poll_jfc(r->jfc, 1, &cr);
        CHECK(n >= 0, "urma_poll_jfc returned %d", n);
        if (n == 1)
            return cr;
        CHECK(now_ms() < until, "no record within %d ms", WAIT_MS);
        sched_yield();
    }
}

static void send_wr(urma_jfs_wr_t *wr, urma_sge_t *sge, urma_target_jetty_t *to, urma_opcode_t op, uint64_t id)
{
    memset(wr, 0, sizeof *wr);
    wr->opcode = op;
    wr->tjetty = to;
    wr->user_ctx = id;
    wr->flag.bs.complete_enable = 1;
    wr->send.src = (urma_sg_t){sge, 1};
    wr->send.imm_data = op == URMA_OPC_SEND_IMM ? 0x77 : 0;
}

static int same_jetty(urma_jetty_id_t a, urma_jetty_id_t b)
{
    return a.id == b.id && a.uasid == b.uasid && memcmp(a.eid.raw, b.eid.raw, 16) == 0;
}

static void refusals(struct res *r, urma_target_jetty_t *to)
{
    CHECK(urma_bind_jetty(r->jetty[0], to) == URMA_ENOPERM, "an %s jetty binds to no one", MODE_NAME);
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)r->buf, .len = 8, .tseg = r->seg};
    urma_jfs_wr_t wr, *bad = NULL;
    send_wr(&wr, &sge, to, URMA_OPC_SEND, 9);
    wr.tjetty = NULL;
    CHECK(urma_post_jetty_send_wr(r->jetty[0], &wr, &bad) == URMA_EINVAL && bad == &wr,
          "an %s send without wr->tjetty is refused and named in bad_wr", MODE_NAME);
    send_wr(&wr, &sge, r->other, URMA_OPC_SEND, 9);
    bad = NULL;
    CHECK(urma_post_jetty_send_wr(r->jetty[0], &wr, &bad) == URMA_EINVAL && bad == &wr,
          "an %s send to a target imported with the other mode is refused", MODE_NAME);
    CHECK(urma_unimport_jetty(r->other) == URMA_SUCCESS, "urma_unimport_jetty");
}

static void teardown(struct res *r, int jettys, int tjs)
{
    for (int i = 0; i < tjs; i++)
        CHECK(urma_unimport_jetty(r->tj[i]) == URMA_SUCCESS, "urma_unimport_jetty");
    CHECK(urma_unregister_seg(r->seg) == URMA_SUCCESS, "urma_unregister_seg");
    for (int i = 0; i < jettys; i++) {
        CHECK(urma_delete_jetty(r->jetty[i]) == URMA_SUCCESS, "urma_delete_jetty");
        CHECK(urma_delete_jfr(r->jfr[i]) == URMA_SUCCESS, "urma_delete_jfr");
    }
    CHECK(urma_delete_jfc(r->jfc) == URMA_SUCCESS, "urma_delete_jfc");
    CHECK(urma_delete_context(r->ctx) == URMA_SUCCESS, "urma_delete_context");
    CHECK(urma_uninit() == URMA_SUCCESS, "urma_uninit");
    free(r->buf);
}

static int server(void)
{
    role = "server";
    struct res r = {0};
    int ls = listen_and_announce();
    setup(&r, 2);
    int fd = accept_one(ls);
    urma_jetty_id_t mine[2] = {r.jetty[0]->jetty_id, r.jetty[1]->jetty_id};
    struct offer o = {.jetty = {mine[0], mine[1]}, .seg_va = r.seg->seg.ubva.va, .seg_len = r.seg->seg.len,
                      .seg_flag = r.seg->seg.attr.value, .seg_token_id = r.seg->seg.token_id};
    memcpy(r.buf + 3584, "for the READ", 13);
    xfer(fd, &o, sizeof o, 1);
    xfer(fd, &r.peer[0], sizeof r.peer[0], 0);
    r.tj[0] = import_um(&r, r.peer[0]);
    r.other = import_as(&r, r.peer[0], mode == URMA_TM_RM ? URMA_TM_UM : URMA_TM_RM);
    post_recv(&r, 0, 0, 100);
    if (mode == URMA_TM_UM)
        post_recv(&r, 1, 256, 200);
    sync_byte(fd, 1); /* imported, receives posted: the client may send */
    sync_byte(fd, 0); /* the client WRITE and READ our segment through A */
    CHECK(memcmp(r.buf + 3072, "UM WRITE", 9) == 0, "the client's WRITE landed");
    if (mode == URMA_TM_RM) {
        /* The client's SEND to B is posted and its SEND to A completed: only now has B a receive. */
        sync_byte(fd, 0);
        post_recv(&r, 1, 256, 200);
    }
    int seen_a = 0, seen_b = 0;
    urma_jetty_id_t from = {0};
    for (int k = 0; k < 2; k++) {
        urma_cr_t cr = next_cr(&r);
        CHECK(cr.status == URMA_CR_SUCCESS && cr.flag.bs.s_r == 1, "receive record: status %d s_r %d", cr.status,
              cr.flag.bs.s_r);
        CHECK(same_jetty(cr.remote_id, r.peer[0]), "remote_id names the client's jetty (id %#x, expected %#x)",
              cr.remote_id.id, r.peer[0].id);
        if (cr.user_ctx == 100) {
            CHECK(cr.local_id == mine[0].id, "the datagram to A arrived on A");
            CHECK(cr.completion_len == 7 && memcmp(r.buf, "to A!!", 7) == 0, "A's payload");
            from = cr.remote_id;
            seen_a++;
        } else {
            CHECK(cr.user_ctx == 200 && cr.local_id == mine[1].id, "the datagram to B arrived on B");
            CHECK(cr.opcode == URMA_CR_OPC_SEND_WITH_IMM && cr.imm_data == 0x77, "B's immediate");
            CHECK(cr.completion_len == 7 && memcmp(r.buf + 256, "to B!!", 7) == 0, "B's payload");
            seen_b++;
        }
    }
    CHECK(seen_a == 1 && seen_b == 1, "one datagram each");
    /* Reply from A to whoever sent, found by the record's remote_id. */
    CHECK(same_jetty(from, r.peer[0]), "the sender is the imported jetty");
    memcpy(r.buf + 1024, "reply", 6);
    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)(r.buf + 1024), .len = 6, .tseg = r.seg};
    urma_jfs_wr_t wr, *bad = NULL;
    send_wr(&wr, &sge, r.tj[0], URMA_OPC_SEND, 300);
    CHECK(urma_post_jetty_send_wr(r.jetty[0], &wr, &bad) == URMA_SUCCESS, "reply");
    urma_cr_t cr = next_cr(&r);
    CHECK(cr.user_ctx == 300 && cr.status == URMA_CR_SUCCESS && cr.flag.bs.s_r == 0, "the reply's send record");
    refusals(&r, r.tj[0]);
    sync_byte(fd, 0); /* the client has its reply */
    teardown(&r, 2, 1);
    close(fd);
    printf("server: all checks passed\n");
    return 0;
}

static int client(int port)
{
    role = "client";
    struct res r = {0};
    setup(&r, 1);
    int fd = connect_loopback(port);
    struct offer o;
    xfer(fd, &o, sizeof o, 0);
    r.peer[0] = o.jetty[0];
    r.peer[1] = o.jetty[1];
    urma_jetty_id_t mine = r.jetty[0]->jetty_id;
    xfer(fd, &mine, sizeof mine, 1);
    r.tj[0] = import_um(&r, r.peer[0]);
    r.tj[1] = import_um(&r, r.peer[1]);
    post_recv(&r, 0, 2048, 500);
    sync_byte(fd, 0);
    /* WRITE then READ the server's segment through A, as UMDK's sample does in UM mode. */
    urma_seg_t seg = {0};
    seg.ubva.eid = o.jetty[0].eid;
    seg.ubva.uasid = o.jetty[0].uasid;
    seg.ubva.va = o.seg_va;
    seg.len = o.seg_len;
    seg.attr.value = o.seg_flag;
    seg.token_id = o.seg_token_id;
    urma_import_seg_flag_t sf = {.bs = {.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE, .mapping = URMA_SEG_NOMAP}};
    urma_target_seg_t *rseg = urma_import_seg(r.ctx, &seg, &(urma_token_t){TOKEN}, 0, sf);
    CHECK(rseg != NULL, "urma_import_seg");
    memcpy(r.buf + 1024, "UM WRITE", 9);
    urma_sge_t loc = {.addr = (uint64_t)(uintptr_t)(r.buf + 1024), .len = 9, .tseg = r.seg};
    urma_sge_t rem = {.addr = o.seg_va + 3072, .len = 9, .tseg = rseg};
    urma_jfs_wr_t rw = {.opcode = URMA_OPC_WRITE, .tjetty = r.tj[0], .user_ctx = 10}, *rbad = NULL;
    rw.flag.bs.complete_enable = 1;
    rw.rw.src = (urma_sg_t){&loc, 1};
    rw.rw.dst = (urma_sg_t){&rem, 1};
    CHECK(urma_post_jetty_send_wr(r.jetty[0], &rw, &rbad) == URMA_SUCCESS, "UM WRITE");
    urma_cr_t wcr = next_cr(&r);
    CHECK(wcr.user_ctx == 10 && wcr.status == URMA_CR_SUCCESS, "UM WRITE record: status %d", wcr.status);
    urma_sge_t into = {.addr = (uint64_t)(uintptr_t)(r.buf + 1536), .len = 13, .tseg = r.seg};
    urma_sge_t from = {.addr = o.seg_va + 3584, .len = 13, .tseg = rseg};
    rw.opcode = URMA_OPC_READ;
    rw.user_ctx = 11;
    rw.rw.src = (urma_sg_t){&from, 1};
    rw.rw.dst = (urma_sg_t){&into, 1};
    CHECK(urma_post_jetty_send_wr(r.jetty[0], &rw, &rbad) == URMA_SUCCESS, "UM READ");
    wcr = next_cr(&r);
    CHECK(wcr.user_ctx == 11 && wcr.status == URMA_CR_SUCCESS, "UM READ record: status %d", wcr.status);
    CHECK(memcmp(r.buf + 1536, "for the READ", 13) == 0, "the UM READ brought the server's bytes");
    sync_byte(fd, 1);
    /* One WR list, two targets. */
    memcpy(r.buf, "to A!!", 7);
    memcpy(r.buf + 8, "to B!!", 7);
    urma_sge_t s0 = {.addr = (uint64_t)(uintptr_t)r.buf, .len = 7, .tseg = r.seg};
    urma_sge_t s1 = {.addr = (uint64_t)(uintptr_t)(r.buf + 8), .len = 7, .tseg = r.seg};
    urma_jfs_wr_t w[2], *bad = NULL;
    send_wr(&w[0], &s0, r.tj[0], URMA_OPC_SEND, 1);
    send_wr(&w[1], &s1, r.tj[1], URMA_OPC_SEND_IMM, 2);
    w[0].next = &w[1];
    CHECK(urma_post_jetty_send_wr(r.jetty[0], &w[0], &bad) == URMA_SUCCESS, "post two messages");
    int sends = 0, got_reply = 0;
    while (sends < 2 || !got_reply) {
        urma_cr_t cr = next_cr(&r);
        CHECK(cr.status == URMA_CR_SUCCESS, "record status %d (user_ctx %llu)", cr.status,
              (unsigned long long)cr.user_ctx);
        if (cr.flag.bs.s_r == 0) {
            CHECK(cr.user_ctx == (uint64_t)sends + 1, "send records in posting order");
            sends++;
            if (mode == URMA_TM_RM && sends == 1)
                sync_byte(fd, 1); /* A's SEND completed: the server may give B its receive now */
        } else {
            CHECK(cr.user_ctx == 500 && cr.completion_len == 6 && memcmp(r.buf + 2048, "reply", 6) == 0,
                  "the reply");
            CHECK(same_jetty(cr.remote_id, r.peer[0]), "the reply's remote_id names A (id %#x, expected %#x)",
                  cr.remote_id.id, r.peer[0].id);
            got_reply = 1;
        }
    }
    sync_byte(fd, 1);
    CHECK(urma_unimport_seg(rseg) == URMA_SUCCESS, "urma_unimport_seg");
    teardown(&r, 1, 2);
    close(fd);
    printf("client: all checks passed\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *m = argc >= 3 ? argv[argc - 1] : "";
    if (strcmp(m, "rm") == 0)
        mode = URMA_TM_RM;
    else if (strcmp(m, "um") != 0)
        argc = 0;
    if (argc == 3 && strcmp(argv[1], "server") == 0)
        return server();
    if (argc == 4 && strcmp(argv[1], "client") == 0)
        return client(atoi(argv[2]));
    fprintf(stderr, "usage: %s server um|rm | client <port> um|rm\n", argv[0]);
    return 2;
}
