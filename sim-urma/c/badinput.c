/*
 * badinput.c — the bad-input table: every row calls the library with something wrong and checks
 * the documented answer (a status, or NULL / -1 with errno). A crash fails the whole run.
 */
#include "urma_api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, rows;

static void row(const char *what, long got, long want, int err, int want_err)
{
    rows++;
    int ok = got == want && (want_err == 0 || err == want_err);
    printf("%-4s %-64s got %ld errno %d (want %ld errno %d)\n", ok ? "ok" : "FAIL", what, got, err, want, want_err);
    if (!ok)
        failures++;
}
#define PTR(what, expr, want_errno)                          \
    do {                                                     \
        errno = 0;                                           \
        void *p_ = (void *)(expr);                           \
        row(what, p_ != NULL, 0, errno, want_errno);         \
    } while (0)
#define STATUS(what, expr, want) row(what, (long)(expr), want, 0, 0)
#define COUNT(what, expr, want_errno)                        \
    do {                                                     \
        errno = 0;                                           \
        long n_ = (long)(expr);                              \
        row(what, n_, -1, errno, want_errno);                \
    } while (0)

int badinput(void)
{
    PTR("get_device_list before urma_init", urma_get_device_list(&(int){0}), ENODEV);
    STATUS("urma_init", urma_init(NULL), URMA_SUCCESS);
    STATUS("urma_init twice", urma_init(NULL), URMA_EEXIST);
    PTR("get_device_list(NULL)", urma_get_device_list(NULL), EINVAL);
    PTR("get_device_by_name(NULL)", urma_get_device_by_name(NULL), EINVAL);
    PTR("get_device_by_name(unknown)", urma_get_device_by_name("mlx5_0"), ENODEV);
    urma_device_t fake_dev;
    memset(&fake_dev, 0, sizeof fake_dev);
    PTR("get_eid_list(a device not from the library)", urma_get_eid_list(&fake_dev, &(uint32_t){0}), EINVAL);
    urma_device_t *dev = urma_get_device_by_name("bypass_sim0");
    row("get_device_by_name(bypass_sim0)", dev != NULL, 1, 0, 0);
    urma_device_attr_t attr;
    STATUS("query_device(dev, NULL)", urma_query_device(dev, NULL), URMA_EINVAL);
    STATUS("query_device", urma_query_device(dev, &attr), URMA_SUCCESS);
    PTR("create_context(dev, eid_index 1)", urma_create_context(dev, 1), EINVAL);
    PTR("create_context(NULL, 0)", urma_create_context(NULL, 0), EINVAL);
    urma_context_t *ctx = urma_create_context(dev, 0);
    urma_context_t fake_ctx;
    memset(&fake_ctx, 0, sizeof fake_ctx);
    PTR("create_jfce(a context not from the library)", urma_create_jfce(&fake_ctx), EINVAL);
    urma_jfce_t *jfce = urma_create_jfce(ctx);
    PTR("create_jfc(ctx, NULL)", urma_create_jfc(ctx, NULL), EINVAL);
    PTR("create_jfc depth 0", urma_create_jfc(ctx, &(urma_jfc_cfg_t){.depth = 0}), EINVAL);
    PTR("create_jfc depth above max_jfc_depth",
        urma_create_jfc(ctx, &(urma_jfc_cfg_t){.depth = attr.dev_cap.max_jfc_depth + 1}), EINVAL);
    urma_jfce_t fake_jfce = {0};
    PTR("create_jfc on a JFCE not from the library", urma_create_jfc(ctx, &(urma_jfc_cfg_t){.depth = 8, .jfce = &fake_jfce}), EINVAL);
    urma_jfc_t *jfc = urma_create_jfc(ctx, &(urma_jfc_cfg_t){.depth = 64, .jfce = jfce});
    urma_jfc_t fake_jfc;
    memset(&fake_jfc, 0, sizeof fake_jfc);
    urma_cr_t cr[2];
    COUNT("poll_jfc(unknown JFC)", urma_poll_jfc(&fake_jfc, 1, cr), EINVAL);
    COUNT("poll_jfc(jfc, -1, cr)", urma_poll_jfc(jfc, -1, cr), EINVAL);
    COUNT("poll_jfc(jfc, 1, NULL)", urma_poll_jfc(jfc, 1, NULL), EINVAL);
    STATUS("poll_jfc(jfc, 0, NULL) is 0", urma_poll_jfc(jfc, 0, NULL), 0);
    COUNT("wait_jfc(jfce, 0, ...)", urma_wait_jfc(jfce, 0, 10, (urma_jfc_t *[1]){0}), EINVAL);
    STATUS("wait_jfc times out with 0", urma_wait_jfc(jfce, 1, 20, (urma_jfc_t *[1]){0}), 0);
    STATUS("rearm_jfc(unknown)", urma_rearm_jfc(&fake_jfc, false), URMA_EINVAL);
    urma_ack_jfc(NULL, NULL, 1); /* must not crash */
    PTR("create_jfr depth 0", urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = 0, .trans_mode = URMA_TM_RC, .jfc = jfc}), EINVAL);
    PTR("create_jfr depth above max_jfr_depth",
        urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = attr.dev_cap.max_jfr_depth + 1, .trans_mode = URMA_TM_RC, .jfc = jfc}), EINVAL);
    PTR("create_jfr with an unknown JFC", urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = 8, .trans_mode = URMA_TM_RC, .jfc = &fake_jfc}), EINVAL);
    PTR("create_jfr max_sge above max_jfr_sge",
        urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = 8, .trans_mode = URMA_TM_RC, .jfc = jfc, .max_sge = 255}), EINVAL);
    urma_jfr_t *jfr = urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = 8, .trans_mode = URMA_TM_RC, .jfc = jfc, .max_sge = 1});
    urma_jetty_cfg_t jc = {.flag.bs.share_jfr = 1,
                           .jfs_cfg = {.depth = 8, .trans_mode = URMA_TM_RC, .max_sge = 1, .rnr_retry = 7, .jfc = jfc},
                           .shared = {.jfr = jfr, .jfc = jfc}}; /* the JFR's JFC named: per-jetty receives */
    urma_jetty_cfg_t bad = jc;
    bad.flag.bs.share_jfr = 0;
    PTR("create_jetty share_jfr = 0", urma_create_jetty(ctx, &bad), EINVAL);
    bad = jc;
    bad.jfs_cfg.depth = 0;
    PTR("create_jetty jfs depth 0", urma_create_jetty(ctx, &bad), EINVAL);
    bad.jfs_cfg.depth = attr.dev_cap.max_jfs_depth + 1;
    PTR("create_jetty jfs depth above max_jfs_depth", urma_create_jetty(ctx, &bad), EINVAL);
    bad = jc;
    bad.jfs_cfg.max_inline_data = attr.dev_cap.max_jfs_inline_len + 1;
    PTR("create_jetty inline above max_jfs_inline_len", urma_create_jetty(ctx, &bad), EINVAL);
    bad = jc;
    bad.jfs_cfg.trans_mode = URMA_TM_UM;
    PTR("create_jetty UM on an RC JFR", urma_create_jetty(ctx, &bad), EINVAL);
    urma_jfr_t fake_jfr;
    memset(&fake_jfr, 0, sizeof fake_jfr);
    bad = jc;
    bad.shared.jfr = &fake_jfr;
    PTR("create_jetty on an unknown JFR", urma_create_jetty(ctx, &bad), EINVAL);
    urma_jetty_t *jetty = urma_create_jetty(ctx, &jc);
    row("create_jetty", jetty != NULL, 1, 0, 0);

    static uint8_t mem[8192] __attribute__((aligned(4096)));
    urma_seg_cfg_t sc = {.va = (uint64_t)(uintptr_t)mem, .len = sizeof mem, .token_value = {7}};
    sc.flag.bs.access = URMA_ACCESS_LOCAL_ONLY | URMA_ACCESS_READ;
    PTR("register_seg LOCAL_ONLY|READ", urma_register_seg(ctx, &sc), EINVAL);
    sc.flag.bs.access = URMA_ACCESS_WRITE;
    PTR("register_seg WRITE without READ", urma_register_seg(ctx, &sc), EINVAL);
    sc.flag.bs.access = URMA_ACCESS_READ;
    sc.va = 0;
    PTR("register_seg va 0", urma_register_seg(ctx, &sc), EINVAL);
    sc.va = (uint64_t)(uintptr_t)mem;
    sc.len = 0;
    PTR("register_seg len 0", urma_register_seg(ctx, &sc), EINVAL);
    sc.len = sizeof mem;
    sc.flag.bs.access = URMA_ACCESS_READ | URMA_ACCESS_WRITE;
    urma_target_seg_t *seg = urma_register_seg(ctx, &sc);
    row("register_seg", seg != NULL, 1, 0, 0);
    PTR("import_seg(ctx, NULL, ...)", urma_import_seg(ctx, NULL, &(urma_token_t){7}, 0, (urma_import_seg_flag_t){0}), EINVAL);
    PTR("import_seg token NULL", urma_import_seg(ctx, &seg->seg, NULL, 0, (urma_import_seg_flag_t){0}), EINVAL);
    PTR("import_seg mapping = MAPPED", urma_import_seg(ctx, &seg->seg, &(urma_token_t){7}, 0, (urma_import_seg_flag_t){.bs.mapping = 1}), EINVAL);

    urma_sge_t sge = {.addr = (uint64_t)(uintptr_t)mem, .len = 8, .tseg = seg};
    urma_jfs_wr_t wr = {.opcode = URMA_OPC_SEND, .send.src = {&sge, 1}}, *bad_wr = NULL;
    wr.flag.bs.complete_enable = 1;
    STATUS("post_send bad_wr NULL", urma_post_jetty_send_wr(jetty, &wr, NULL), URMA_EINVAL);
    STATUS("post_send on an unbound jetty", urma_post_jetty_send_wr(jetty, &wr, &bad_wr), URMA_EINVAL);
    row("  ... bad_wr names the refused WR", bad_wr == &wr, 1, 0, 0);
    urma_jetty_t fake_jetty;
    memset(&fake_jetty, 0, sizeof fake_jetty);
    STATUS("post_send on an unknown jetty", urma_post_jetty_send_wr(&fake_jetty, &wr, &bad_wr), URMA_EINVAL);
    urma_jfr_wr_t rwr = {.src = {&sge, 1}}, *bad_rwr = NULL;
    STATUS("post_recv bad_wr NULL", urma_post_jetty_recv_wr(jetty, &rwr, NULL), URMA_EINVAL);
    urma_target_seg_t fake_seg;
    memset(&fake_seg, 0, sizeof fake_seg);
    urma_sge_t fsge = {.addr = (uint64_t)(uintptr_t)mem, .len = 8, .tseg = &fake_seg};
    urma_jfr_wr_t frwr = {.src = {&fsge, 1}};
    STATUS("post_recv with an unknown segment", urma_post_jetty_recv_wr(jetty, &frwr, &bad_rwr), URMA_EINVAL);
    urma_sge_t two[2] = {sge, sge};
    urma_jfr_wr_t wide = {.src = {two, 2}};
    STATUS("post_recv more SGEs than max_sge", urma_post_jetty_recv_wr(jetty, &wide, &bad_rwr), URMA_EINVAL);
    STATUS("post_recv before bind (held by the JFR)", urma_post_jetty_recv_wr(jetty, &rwr, &bad_rwr), URMA_SUCCESS);

    /* urma_post_jfr_wr, and a JFR shared by its jettys. */
    PTR("create_jfr depth 0", urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = 0, .trans_mode = URMA_TM_RC, .jfc = jfc}), EINVAL);
    STATUS("post_jfr_wr(NULL jfr)", urma_post_jfr_wr(NULL, &rwr, &bad_rwr), URMA_EINVAL);
    STATUS("post_jfr_wr on an unknown JFR", urma_post_jfr_wr(&fake_jfr, &rwr, &bad_rwr), URMA_EINVAL);
    STATUS("post_jfr_wr bad_wr NULL", urma_post_jfr_wr(jfr, &rwr, NULL), URMA_EINVAL);
    STATUS("post_jfr_wr to a JFR whose jetty keeps its own receives", urma_post_jfr_wr(jfr, &rwr, &bad_rwr), URMA_EINVAL);
    urma_jfr_t *sjfr = urma_create_jfr(ctx, &(urma_jfr_cfg_t){.depth = 4, .trans_mode = URMA_TM_RC, .jfc = jfc, .max_sge = 1});
    row("create_jfr depth 4 (to be shared)", sjfr != NULL, 1, 0, 0);
    STATUS("post_jfr_wr more SGEs than max_sge", urma_post_jfr_wr(sjfr, &wide, &bad_rwr), URMA_EINVAL);
    STATUS("post_jfr_wr with an unknown segment", urma_post_jfr_wr(sjfr, &frwr, &bad_rwr), URMA_EINVAL);
    urma_jfr_wr_t four[4];
    for (int i = 0; i < 4; i++)
        four[i] = (urma_jfr_wr_t){.src = {&sge, 1}, .user_ctx = (uint64_t)i, .next = i < 3 ? &four[i + 1] : NULL};
    STATUS("post_jfr_wr 4 receives (the depth)", urma_post_jfr_wr(sjfr, four, &bad_rwr), URMA_SUCCESS);
    STATUS("post_jfr_wr a fifth (full)", urma_post_jfr_wr(sjfr, &rwr, &bad_rwr), URMA_EAGAIN);
    urma_jetty_cfg_t sjc = jc;
    sjc.shared.jfr = sjfr;
    urma_jetty_t *sjetty = urma_create_jetty(ctx, &sjc);
    row("create_jetty on the shared JFR", sjetty != NULL, 1, 0, 0);
    STATUS("post_recv through it goes to the full JFR", urma_post_jetty_recv_wr(sjetty, &rwr, &bad_rwr), URMA_EAGAIN);
    STATUS("delete_jetty on the shared JFR", urma_delete_jetty(sjetty), URMA_SUCCESS);
    STATUS("delete_jfr (shared)", urma_delete_jfr(sjfr), URMA_SUCCESS);

    urma_rjetty_t rj = {.jetty_id = jetty->jetty_id, .trans_mode = URMA_TM_RC, .type = URMA_JETTY};
    PTR("import_jetty token NULL", urma_import_jetty(ctx, &rj, NULL), EINVAL);
    PTR("import_jetty rjetty NULL", urma_import_jetty(ctx, NULL, &(urma_token_t){7}), EINVAL);
    urma_rjetty_t bad_mode = rj;
    bad_mode.trans_mode = 8; /* RM 1, RC 2, UM 4 are the modes */
    PTR("import_jetty trans_mode 8 (no such mode)", urma_import_jetty(ctx, &bad_mode, &(urma_token_t){7}), EINVAL);
    urma_rjetty_t um = rj;
    um.trans_mode = URMA_TM_UM;
    urma_target_jetty_t *tj_rm = urma_import_jetty(ctx, &um, &(urma_token_t){7});
    STATUS("bind to a non-RC (UM) target", urma_bind_jetty(jetty, tj_rm), URMA_ENOPERM);
    urma_rjetty_t ot = rj;
    ot.flag.bs.order_type = URMA_OT;
    urma_target_jetty_t *tj_ot = urma_import_jetty(ctx, &ot, &(urma_token_t){7});
    STATUS("bind with a different order_type", urma_bind_jetty(jetty, tj_ot), URMA_ENOPERM);
    urma_target_jetty_t fake_tj;
    memset(&fake_tj, 0, sizeof fake_tj);
    STATUS("bind to an unknown target jetty", urma_bind_jetty(jetty, &fake_tj), URMA_EINVAL);
    STATUS("unbind an unbound jetty", urma_unbind_jetty(jetty), URMA_EINVAL);
    urma_jetty_attr_t ja = {.mask = JETTY_STATE, .state = URMA_JETTY_STATE_SUSPENDED};
    STATUS("modify_jetty to SUSPENDED (not simulated)", urma_modify_jetty(jetty, &ja), URMA_EINVAL);
    ja.state = 9;
    STATUS("modify_jetty to state 9", urma_modify_jetty(jetty, &ja), URMA_EINVAL);
    STATUS("modify_jetty attr NULL", urma_modify_jetty(jetty, NULL), URMA_EINVAL);
    COUNT("flush_jetty on a jetty not in ERROR", urma_flush_jetty(jetty, 2, cr), EINVAL);
    STATUS("query_jetty cfg NULL", urma_query_jetty(jetty, NULL, &ja), URMA_EINVAL);
    urma_async_event_t ev;
    STATUS("get_async_event event NULL", urma_get_async_event(ctx, NULL), URMA_EINVAL);
    STATUS("get_async_event unknown context", urma_get_async_event(&fake_ctx, &ev), URMA_EINVAL);
    urma_ack_async_event(NULL); /* must not crash */
    COUNT("str_to_eid(\"not an eid\")", urma_str_to_eid("not an eid", &(urma_eid_t){0}), EINVAL);
    urma_eid_t e4, e6;
    urma_u32_to_eid(0x0a000001, &e4);
    STATUS("str_to_eid(\"::ffff:10.0.0.1\")", urma_str_to_eid("::ffff:10.0.0.1", &e6), 0);
    row("  ... equals urma_u32_to_eid(10.0.0.1)", memcmp(&e4, &e6, 16) == 0, 1, 0, 0);
    urma_free_device_list((urma_device_t **)mem); /* not ours: refused, not freed */
    urma_free_eid_list((urma_eid_info_t *)mem);

    STATUS("delete_jetty twice (1)", urma_delete_jetty(jetty), URMA_SUCCESS);
    STATUS("delete_jetty twice (2)", urma_delete_jetty(jetty), URMA_EINVAL);
    STATUS("post_send on a deleted jetty", urma_post_jetty_send_wr(jetty, &wr, &bad_wr), URMA_EINVAL);
    STATUS("unimport_jetty", urma_unimport_jetty(tj_rm), URMA_SUCCESS);
    STATUS("unimport_jetty", urma_unimport_jetty(tj_ot), URMA_SUCCESS);
    STATUS("unregister_seg", urma_unregister_seg(seg), URMA_SUCCESS);
    STATUS("unregister_seg twice", urma_unregister_seg(seg), URMA_EINVAL);
    STATUS("delete_jfr", urma_delete_jfr(jfr), URMA_SUCCESS);
    STATUS("delete_jfce with a JFC on it", urma_delete_jfce(jfce), URMA_EINVAL);
    STATUS("delete_jfc", urma_delete_jfc(jfc), URMA_SUCCESS);
    STATUS("delete_jfce", urma_delete_jfce(jfce), URMA_SUCCESS);
    STATUS("delete_context", urma_delete_context(ctx), URMA_SUCCESS);
    STATUS("delete_context twice", urma_delete_context(ctx), URMA_EINVAL);
    STATUS("urma_uninit", urma_uninit(), URMA_SUCCESS);
    PTR("get_eid_list on a device from before urma_uninit", urma_get_eid_list(dev, &(uint32_t){0}), EINVAL);
    printf("%d of %d rows as documented\n", rows - failures, rows);
    return failures == 0 ? 0 : 1;
}
