//! Enum values, flag bits and status codes against urma-abi.md §2 and §3.6.

use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;

#[test]
fn status_codes_are_errno_numbers() {
    assert_eq!(
        [URMA_SUCCESS, URMA_ENOPERM, URMA_EAGAIN, URMA_ENOMEM, URMA_EEXIST, URMA_EINVAL],
        [0, 1, 11, 12, 17, 22]
    );
    assert_eq!([URMA_ETIMEOUT, URMA_EINPROGRESS, URMA_FAIL], [110, 115, 0x1000]);
    assert_eq!(status_name(URMA_EEXIST), Some("URMA_EEXIST"));
    assert_eq!(status_name(5), None, "EIO passes through unnamed");
}

#[test]
fn cr_status_runs_0_to_16_in_order() {
    assert_eq!(URMA_CR_WR_FLUSH_ERR, 11);
    assert_eq!(URMA_CR_REM_DATA_POISON, 16);
    assert_eq!(cr_status_name(URMA_CR_REM_ACCESS_ABORT_ERR), Some("URMA_CR_REM_ACCESS_ABORT_ERR"));
    assert_eq!(cr_status_name(0), Some("URMA_CR_SUCCESS"));
    assert_eq!(cr_status_name(17), None);
}

#[test]
fn enums() {
    assert_eq!([URMA_TM_RM, URMA_TM_RC, URMA_TM_UM], [1, 2, 4]);
    assert_eq!(URMA_TRANSPORT_INVALID, -1);
    assert_eq!(URMA_TRANSPORT_HNS_UB, 5);
    assert_eq!([URMA_OPC_WRITE, URMA_OPC_READ, URMA_OPC_SEND, URMA_OPC_NOP], [0, 0x10, 0x40, 0x51]);
    assert_eq!([URMA_OPC_WRITE_ATOMIC, URMA_OPC_FLUSH_DMA], [0x60, 0x80]);
    assert_eq!(URMA_JETTY_STATE_ERROR, 3);
    assert_eq!(URMA_JFR_STATE_ERROR, 2);
    assert_eq!(URMA_CR_OPC_WRITE_WITH_IMM, 3);
}

#[test]
fn default_order_type_rewrite() {
    assert_eq!(default_order_type(URMA_TM_RM), URMA_OI);
    assert_eq!(default_order_type(URMA_TM_RC), URMA_OL);
    assert_eq!(default_order_type(URMA_TM_UM), URMA_NO);
}

#[test]
fn flag_fields() {
    assert_eq!(WR_FLAG_COMPLETE_ENABLE, 0x20);
    assert_eq!(URMA_OL << JFS_FLAG_ORDER_TYPE_SHIFT & !JFS_FLAG_ORDER_TYPE_MASK, 0);
    assert_eq!(0xff << JFS_FLAG_ORDER_TYPE_SHIFT, JFS_FLAG_ORDER_TYPE_MASK);
    assert_eq!(0xff << JFR_FLAG_ORDER_TYPE_SHIFT, JFR_FLAG_ORDER_TYPE_MASK);
    assert_eq!(0xff << IMPORT_JETTY_ORDER_TYPE_SHIFT, IMPORT_JETTY_ORDER_TYPE_MASK);
    assert_eq!(0x3f << REG_SEG_ACCESS_SHIFT, REG_SEG_ACCESS_MASK);
    assert_eq!(0x3f << IMPORT_SEG_ACCESS_SHIFT, IMPORT_SEG_ACCESS_MASK);
    assert_eq!(URMA_SEG_MAPPED << 7, IMPORT_SEG_MAPPING);
    assert_eq!(FEATURE_UBOE, 1 << 19);
}

#[test]
fn symbol_list_is_complete_and_unique() {
    let s = bypass_urma_abi::fns::SYMBOLS;
    // urma-abi.md's 48, plus urma_post_jfr_wr (shared JFRs) and the five UMDK's URPC calls
    // (urma_modify_jfc, urma_modify_jfr, urma_query_jfr, urma_user_ctl,
    // urma_unregister_log_func).
    assert_eq!(s.len(), 54);
    let mut v = s.to_vec();
    v.sort_unstable();
    v.dedup();
    assert_eq!(v.len(), s.len());
    for name in bypass_urma_abi::legacy::SYMBOLS_SINCE_26 {
        assert!(s.contains(name));
    }
}
