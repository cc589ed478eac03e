//! Every struct's size and every field offset urma-abi.md §3 lists (x86_64, UMDK 26.06 headers),
//! plus the alignments it calls out.

use bypass_urma_abi::*;
use core::mem::{align_of, offset_of, size_of};

macro_rules! layout {
    ($t:ty, $size:expr $(, $field:ident @ $off:expr)* $(,)?) => {{
        assert_eq!(size_of::<$t>(), $size, "sizeof {}", stringify!($t));
        $(assert_eq!(offset_of!($t, $field), $off, "{}.{}", stringify!($t), stringify!($field));)*
    }};
}

#[test]
fn identity_and_device() {
    layout!(UrmaEid, 16, raw @ 0);
    assert_eq!(align_of::<UrmaEid>(), 8);
    layout!(UrmaToken, 4, token @ 0);
    layout!(UrmaInitAttr, 16, token @ 0, uasid @ 8);
    layout!(UrmaEidInfo, 24, eid @ 0, eid_index @ 16);
    layout!(UrmaJettyId, 24, eid @ 0, uasid @ 16, id @ 20);
    layout!(UrmaDevice, 4184, name @ 0, path @ 64, type_ @ 4160, ops @ 4168, sysfs_dev @ 4176);
    layout!(
        UrmaContext, 104,
        dev @ 0, ops @ 8, dev_fd @ 16, async_fd @ 20, mutex @ 24, eid @ 64, eid_index @ 80,
        uasid @ 84, ref_ @ 88, aggr_mode @ 96,
    );
    layout!(
        UrmaPortAttr, 20,
        max_mtu @ 0, state @ 4, active_width @ 8, active_speed @ 12, active_mtu @ 16,
    );
    layout!(
        UrmaDeviceAttr, 496,
        guid @ 0, dev_cap @ 16, port_cnt @ 320, port_attr @ 324, reserved_jetty_id_min @ 484,
        reserved_jetty_id_max @ 488,
    );
    assert_eq!(size_of::<[UrmaPortAttr; URMA_MAX_PORT_CNT]>(), 160);
}

#[test]
fn device_cap() {
    layout!(
        UrmaDeviceCap, 304,
        feature @ 0, max_jfc @ 4, max_jfs @ 8, max_jfr @ 12, max_jetty @ 16, max_jetty_grp @ 20,
        max_jetty_in_jetty_grp @ 24, max_jfc_depth @ 28, max_jfs_depth @ 32, max_jfr_depth @ 36,
        max_jfs_inline_len @ 40, max_jfs_sge @ 44, max_jfs_rsge @ 48, max_jfr_sge @ 52,
        max_msg_size @ 56, max_read_size @ 64, max_write_size @ 68, max_cas_size @ 72,
        max_swap_size @ 76, max_fetch_and_add_size @ 80, max_fetch_and_sub_size @ 84,
        max_fetch_and_and_size @ 88, max_fetch_and_or_size @ 92, max_fetch_and_xor_size @ 96,
        atomic_feat @ 100, trans_mode @ 104, reserved @ 106, congestion_ctrl_alg @ 108,
        ceq_cnt @ 112, max_tp_in_tpg @ 116, max_eid_cnt @ 120, page_size_cap @ 128,
        max_oor_cnt @ 136, mn @ 140, max_netaddr_cnt @ 144, rm_order_cap @ 148,
        rc_order_cap @ 152, rm_tp_cap @ 156, rc_tp_cap @ 160, um_tp_cap @ 164, tp_feature @ 168,
        priority_info @ 172,
    );
    assert_eq!(size_of::<[UrmaPriorityInfo; URMA_MAX_PRIORITY_CNT]>(), 128);
}

#[test]
fn queues() {
    layout!(UrmaJfce, 24, urma_ctx @ 0, fd @ 8, ref_ @ 16);
    layout!(UrmaJfcCfg, 32, depth @ 0, flag @ 4, ceqn @ 8, jfce @ 16, user_ctx @ 24);
    layout!(
        UrmaJfc, 248,
        urma_ctx @ 0, jfc_id @ 8, jfc_cfg @ 32, handle @ 64, event_mutex @ 72, event_cond @ 112,
        comp_events_acked @ 160, async_events_acked @ 164, urma_jfc_opt @ 168,
    );
    layout!(
        UrmaJfsCfg, 40,
        depth @ 0, flag @ 4, trans_mode @ 8, priority @ 12, max_sge @ 13, max_rsge @ 14,
        max_inline_data @ 16, rnr_retry @ 20, err_timeout @ 21, jfc @ 24, user_ctx @ 32,
    );
    layout!(UrmaJfs, 256, urma_ctx @ 0, jfs_id @ 8, jfs_cfg @ 32, handle @ 72);
    layout!(
        UrmaJfrCfg, 48,
        id @ 0, depth @ 4, flag @ 8, trans_mode @ 12, max_sge @ 16, min_rnr_timer @ 17,
        jfc @ 24, token_value @ 32, user_ctx @ 40,
    );
    layout!(
        UrmaJfr, 264,
        urma_ctx @ 0, jfr_id @ 8, jfr_cfg @ 32, handle @ 80, event_mutex @ 88, event_cond @ 128,
        async_events_acked @ 176, urma_jfr_opt @ 184,
    );
    layout!(
        UrmaJettyCfg, 80,
        id @ 0, flag @ 4, jfs_cfg @ 8, recv @ 48, jetty_grp @ 64, user_ctx @ 72,
    );
    layout!(UrmaJettyShared, 16, jfr @ 0, jfc @ 8);
    assert_eq!(size_of::<UrmaJettyRecv>(), 16);
    layout!(
        UrmaJetty, 344,
        urma_ctx @ 0, jetty_id @ 8, remote_jetty @ 32, jetty_cfg @ 40, handle @ 120,
        event_mutex @ 128, event_cond @ 168, async_events_acked @ 216, urma_jetty_opt @ 224,
    );
    assert_eq!(offset_of!(UrmaJetty, jetty_id), legacy::JETTY_ID_OFFSET);
    layout!(UrmaJettyAttr, 12, mask @ 0, rx_threshold @ 4, state @ 8);
    layout!(UrmaJfsAttr, 8, mask @ 0, state @ 4);
    layout!(UrmaJfcAttr, 8, mask @ 0, moderate_count @ 4, moderate_period @ 6);
    layout!(UrmaUserCtlIn, 16, addr @ 0, len @ 8, opcode @ 12);
    layout!(UrmaUserCtlOut, 16, addr @ 0, len @ 8, reserved @ 12);
}

#[test]
fn remote_jetty() {
    layout!(UrmaRjetty, 48, jetty_id @ 0, trans_mode @ 24, policy @ 28, type_ @ 32, flag @ 36, tp_type @ 40);
    layout!(
        UrmaTargetJetty, 64,
        urma_ctx @ 0, id @ 8, handle @ 32, trans_mode @ 40, tpn @ 44, type_ @ 48, flag @ 52,
        policy @ 56, tp_type @ 60,
    );
    layout!(UrmaRjfr, 40, jfr_id @ 0, trans_mode @ 24, flag @ 28, tp_type @ 32);
}

#[test]
fn segments() {
    layout!(UrmaTokenId, 40, urma_ctx @ 0, token_id @ 8, handle @ 16, ref_ @ 24, flag @ 32);
    layout!(
        UrmaSegCfg, 48,
        va @ 0, len @ 8, token_id @ 16, token_value @ 24, flag @ 28, user_ctx @ 32, iova @ 40,
    );
    layout!(UrmaUbva, 28, eid @ 0, uasid @ 16, va @ 20);
    assert_eq!(align_of::<UrmaUbva>(), 1);
    layout!(UrmaSeg, 48, ubva @ 0, len @ 32, attr @ 40, token_id @ 44);
    layout!(
        UrmaTargetSeg, 88,
        seg @ 0, user_ctx @ 48, mva @ 56, urma_ctx @ 64, token_id @ 72, handle @ 80,
    );
}

#[test]
fn work_requests_and_completions() {
    layout!(UrmaSge, 32, addr @ 0, len @ 8, tseg @ 16, user_tseg @ 24);
    layout!(UrmaUserTseg, 12, attr @ 0, token_id @ 4, token_value @ 8);
    layout!(UrmaSg, 16, sge @ 0, num_sge @ 8);
    layout!(UrmaRwWr, 48, src @ 0, dst @ 16, target_hint @ 32, notify_data @ 40);
    layout!(UrmaSendWr, 40, src @ 0, target_hint @ 16, imm_data @ 24, tseg @ 32);
    layout!(UrmaCasWr, 32, dst @ 0, src @ 8, cmp_data @ 16, swap_data @ 24);
    layout!(UrmaFaaWr, 24, dst @ 0, src @ 8, operand @ 16);
    assert_eq!(size_of::<UrmaJfsWrBody>(), 48);
    layout!(UrmaJfsWr, 80, opcode @ 0, flag @ 4, tjetty @ 8, user_ctx @ 16, body @ 24, next @ 72);
    layout!(UrmaJfrWr, 32, src @ 0, user_ctx @ 16, next @ 24);
    layout!(
        UrmaCr, 80,
        status @ 0, user_ctx @ 8, opcode @ 16, flag @ 20, completion_len @ 24, local_id @ 28,
        remote_id @ 32, data @ 56, tpn @ 64, user_data @ 72,
    );
    assert_eq!(size_of::<UrmaCrData>(), 8);
    layout!(UrmaAsyncEvent, 32, urma_ctx @ 0, element @ 8, event_type @ 16, priv_ @ 24);
}

#[test]
fn legacy_sizes_differ_from_current() {
    // The older releases' numbers must differ where §3.7 says they do, or a size check could not
    // tell them apart.
    assert_ne!(legacy::v25_12::DEVICE_ATTR_SIZE, size_of::<UrmaDeviceAttr>());
    assert_ne!(legacy::v25_12::JETTY_SIZE, size_of::<UrmaJetty>());
    assert_ne!(legacy::v24_12_lts::SGE_SIZE, size_of::<UrmaSge>());
    assert_ne!(legacy::v24_12_lts::RJETTY_SIZE, size_of::<UrmaRjetty>());
    assert_ne!(legacy::v24_12_lts::CONTEXT_SIZE, size_of::<UrmaContext>());
}
