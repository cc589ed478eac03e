/*
 * urma_api.h — the URMA C API (openEuler UMDK liburma, URMA_API_VERSION 0.9) as bypass's
 * simulated liburma implements it, written for this project from the facts in
 * shared/reference/urma-abi.md (x86_64 Linux layouts; sizes are checked with _Static_assert
 * below). It declares the subset of the API that library exports; a program written against it
 * builds against UMDK's own headers too.
 */
#ifndef BYPASS_URMA_API_H
#define BYPASS_URMA_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int urma_status_t;
#define URMA_SUCCESS 0
#define URMA_ENOPERM 1
#define URMA_EAGAIN 11
#define URMA_ENOMEM 12
#define URMA_EEXIST 17
#define URMA_EINVAL 22
#define URMA_ETIMEOUT 110
#define URMA_EINPROGRESS 115
#define URMA_FAIL 0x1000

#define URMA_MAX_NAME 64
#define URMA_MAX_PATH 4096
#define URMA_EID_SIZE 16
#define MAX_PORT_CNT 8
#define URMA_MAX_PRIORITY_CNT 16

typedef enum { URMA_TM_RM = 0x1, URMA_TM_RC = 0x2, URMA_TM_UM = 0x4 } urma_transport_mode_t;
typedef enum {
    URMA_TRANSPORT_INVALID = -1, URMA_TRANSPORT_UB = 0, URMA_TRANSPORT_IB = 1,
    URMA_TRANSPORT_IP = 2, URMA_TRANSPORT_SOFTUB = 3, URMA_TRANSPORT_HNS_UB = 5
} urma_transport_type_t;
typedef enum { URMA_RTP = 0, URMA_CTP = 1, URMA_UTP = 2 } urma_tp_type_t;
typedef enum { URMA_JFR = 0, URMA_JETTY = 1, URMA_JETTY_GROUP = 2 } urma_target_type_t;
typedef enum { URMA_DEF_ORDER = 0, URMA_OT = 1, URMA_OI = 2, URMA_OL = 3, URMA_NO = 4 } urma_order_type_t;
typedef enum {
    URMA_OPC_WRITE = 0x00, URMA_OPC_WRITE_IMM = 0x01, URMA_OPC_WRITE_NOTIFY = 0x02, URMA_OPC_READ = 0x10,
    URMA_OPC_CAS = 0x20, URMA_OPC_SWAP = 0x21, URMA_OPC_FADD = 0x22, URMA_OPC_FSUB = 0x23,
    URMA_OPC_FAND = 0x24, URMA_OPC_FOR = 0x25, URMA_OPC_FXOR = 0x26,
    URMA_OPC_SEND = 0x40, URMA_OPC_SEND_IMM = 0x41, URMA_OPC_SEND_INVALIDATE = 0x42,
    URMA_OPC_NOP = 0x51, URMA_OPC_WRITE_ATOMIC = 0x60, URMA_OPC_FLUSH_DMA = 0x80
} urma_opcode_t;
typedef enum {
    URMA_CR_SUCCESS = 0, URMA_CR_UNSUPPORTED_OPCODE_ERR, URMA_CR_LOC_LEN_ERR, URMA_CR_LOC_OPERATION_ERR,
    URMA_CR_LOC_ACCESS_ERR, URMA_CR_REM_RESP_LEN_ERR, URMA_CR_REM_UNSUPPORTED_REQ_ERR,
    URMA_CR_REM_OPERATION_ERR, URMA_CR_REM_ACCESS_ABORT_ERR, URMA_CR_ACK_TIMEOUT_ERR,
    URMA_CR_RNR_RETRY_CNT_EXC_ERR, URMA_CR_WR_FLUSH_ERR, URMA_CR_WR_SUSPEND_DONE,
    URMA_CR_WR_FLUSH_ERR_DONE, URMA_CR_WR_UNHANDLED, URMA_CR_LOC_DATA_POISON, URMA_CR_REM_DATA_POISON
} urma_cr_status_t;
typedef enum {
    URMA_CR_OPC_SEND = 0, URMA_CR_OPC_SEND_WITH_IMM, URMA_CR_OPC_SEND_WITH_INV,
    URMA_CR_OPC_WRITE_WITH_IMM, URMA_CR_OPC_FLUSH_WRITE
} urma_cr_opcode_t;
typedef enum {
    URMA_JETTY_STATE_RESET = 0, URMA_JETTY_STATE_READY, URMA_JETTY_STATE_SUSPENDED, URMA_JETTY_STATE_ERROR
} urma_jetty_state_t;
typedef enum { URMA_JFR_STATE_RESET = 0, URMA_JFR_STATE_READY, URMA_JFR_STATE_ERROR } urma_jfr_state_t;
typedef enum {
    URMA_TOKEN_NONE = 0, URMA_TOKEN_PLAIN_TEXT, URMA_TOKEN_SIGNED, URMA_TOKEN_ALL_ENCRYPTED, URMA_TOKEN_RESERVED
} urma_token_policy_t;
typedef enum {
    URMA_EVENT_JFC_ERR = 0, URMA_EVENT_JFS_ERR, URMA_EVENT_JFR_ERR, URMA_EVENT_JFR_LIMIT,
    URMA_EVENT_JETTY_ERR, URMA_EVENT_JETTY_LIMIT, URMA_EVENT_JETTY_GRP_ERR, URMA_EVENT_PORT_ACTIVE,
    URMA_EVENT_PORT_DOWN, URMA_EVENT_DEV_FATAL, URMA_EVENT_EID_CHANGE, URMA_EVENT_ELR_ERR, URMA_EVENT_ELR_DONE
} urma_async_event_type_t;
typedef enum { URMA_PORT_NOP = 0, URMA_PORT_DOWN, URMA_PORT_INIT, URMA_PORT_ARMED, URMA_PORT_ACTIVE, URMA_PORT_ACTIVE_DEFER } urma_port_state_t;
#define URMA_SEG_NOMAP 0
#define URMA_SEG_MAPPED 1
#define URMA_ACCESS_LOCAL_ONLY 0x1
#define URMA_ACCESS_READ 0x2
#define URMA_ACCESS_WRITE 0x4
#define URMA_ACCESS_ATOMIC 0x8
#define URMA_TYPICAL_RNR_RETRY 7
#define URMA_TYPICAL_ERR_TIMEOUT 17
#define URMA_TYPICAL_MIN_RNR_TIMER 12
#define URMA_MAX_PRIORITY 15
#define JETTY_RX_THRESHOLD 0x1
#define JETTY_STATE 0x2
#define JFR_RX_THRESHOLD 0x1
#define JFR_STATE 0x2
#define JFC_MODERATE_COUNT 0x1
#define JFC_MODERATE_PERIOD 0x2

typedef union urma_eid {
    uint8_t raw[URMA_EID_SIZE];
    struct { uint64_t reserved; uint32_t prefix; uint32_t addr; } in4;
    struct { uint64_t subnet_prefix; uint64_t interface_id; } in6;
} urma_eid_t;
typedef struct urma_token { uint32_t token; } urma_token_t;
typedef struct urma_init_attr { uint64_t token; uint32_t uasid; } urma_init_attr_t;
typedef struct urma_eid_info { urma_eid_t eid; uint32_t eid_index; } urma_eid_info_t;
typedef struct urma_jetty_id { urma_eid_t eid; uint32_t uasid; uint32_t id; } urma_jetty_id_t;
typedef urma_jetty_id_t urma_jfs_id_t, urma_jfr_id_t, urma_jfc_id_t;

typedef struct urma_device {
    char name[URMA_MAX_NAME];
    char path[URMA_MAX_PATH];
    urma_transport_type_t type;
    void *ops;
    void *sysfs_dev;
} urma_device_t;

typedef struct urma_context {
    urma_device_t *dev;
    void *ops;
    int dev_fd;
    int async_fd;
    uint64_t mutex_[5];      /* pthread_mutex_t, library-private */
    urma_eid_t eid;
    uint32_t eid_index;
    uint32_t uasid;
    uint64_t ref;
    uint32_t aggr_mode;
} urma_context_t;

typedef struct urma_port_attr {
    uint32_t max_mtu, state, active_width, active_speed, active_mtu;
} urma_port_attr_t;

/* A set of transport types (rm/rc/um_tp_cap, priority_info[].tp_type): bits, not a urma_tp_type_t. */
union urma_tp_type_en {
    struct { uint32_t rtp : 1, ctp : 1, utp : 1, reserved : 29; } bs;
    uint32_t value;
};
typedef union urma_tp_type_en urma_tp_type_cap_t;
typedef union urma_order_type_cap {
    struct { uint32_t ot : 1, oi : 1, ol : 1, no : 1, reserved : 28; } bs;
    uint32_t value;
} urma_order_type_cap_t;
typedef struct urma_device_cap {
    uint32_t feature;
    uint32_t max_jfc, max_jfs, max_jfr, max_jetty, max_jetty_grp, max_jetty_in_jetty_grp;
    uint32_t max_jfc_depth, max_jfs_depth, max_jfr_depth, max_jfs_inline_len;
    uint32_t max_jfs_sge, max_jfs_rsge, max_jfr_sge;
    uint64_t max_msg_size;
    uint32_t max_read_size, max_write_size, max_cas_size, max_swap_size;
    uint32_t max_fetch_and_add_size, max_fetch_and_sub_size, max_fetch_and_and_size;
    uint32_t max_fetch_and_or_size, max_fetch_and_xor_size;
    uint32_t atomic_feat;
    uint16_t trans_mode, reserved, congestion_ctrl_alg;
    uint32_t ceq_cnt, max_tp_in_tpg, max_eid_cnt;
    uint64_t page_size_cap;
    uint32_t max_oor_cnt, mn, max_netaddr_cnt;
    urma_order_type_cap_t rm_order_cap, rc_order_cap;
    urma_tp_type_cap_t rm_tp_cap, rc_tp_cap, um_tp_cap;
    uint32_t tp_feature;
    struct urma_sl_info { uint32_t SL; union urma_tp_type_en tp_type; } priority_info[URMA_MAX_PRIORITY_CNT];
} urma_device_cap_t;

typedef struct urma_device_attr {
    uint8_t guid[16];
    urma_device_cap_t dev_cap;
    uint8_t port_cnt;
    urma_port_attr_t port_attr[MAX_PORT_CNT];
    uint32_t reserved_jetty_id_min, reserved_jetty_id_max;
} urma_device_attr_t;

typedef struct urma_jfce { urma_context_t *urma_ctx; int fd; uint64_t ref; } urma_jfce_t;

typedef union urma_jfc_flag {
    struct { uint32_t lock_free : 1, jfc_inline : 1, non_blocking : 1, has_drv_ext : 1, reserved : 28; } bs;
    uint32_t value;
} urma_jfc_flag_t;
typedef struct urma_jfc_cfg {
    uint32_t depth;
    urma_jfc_flag_t flag;
    uint32_t ceqn;
    urma_jfce_t *jfce;
    uint64_t user_ctx;
} urma_jfc_cfg_t;
typedef struct urma_jfc {
    urma_context_t *urma_ctx;
    urma_jfc_id_t jfc_id;
    urma_jfc_cfg_t jfc_cfg;
    uint64_t handle;
    uint64_t event_mutex_[5];
    uint64_t event_cond_[6];
    uint32_t comp_events_acked;
    uint32_t async_events_acked;
    uint64_t opt_[10];
} urma_jfc_t;

typedef union urma_jfs_flag {
    struct {
        uint32_t lock_free : 1, error_suspend : 1, outorder_comp : 1, order_type : 8, multi_path : 1,
            ctp_rc_mul_path_mode : 1, non_blocking : 1, has_drv_ext : 1, reserved : 17;
    } bs;
    uint32_t value;
} urma_jfs_flag_t;
typedef struct urma_jfs_cfg {
    uint32_t depth;
    urma_jfs_flag_t flag;
    urma_transport_mode_t trans_mode;
    uint8_t priority, max_sge, max_rsge;
    uint32_t max_inline_data;
    uint8_t rnr_retry, err_timeout;
    urma_jfc_t *jfc;
    uint64_t user_ctx;
} urma_jfs_cfg_t;

typedef union urma_jfr_flag {
    struct {
        uint32_t token_policy : 3, tag_matching : 1, lock_free : 1, order_type : 8, has_drv_ext : 1,
            non_blocking : 1, reserved : 17;
    } bs;
    uint32_t value;
} urma_jfr_flag_t;
typedef struct urma_jfr_cfg {
    uint32_t id;
    uint32_t depth;
    urma_jfr_flag_t flag;
    urma_transport_mode_t trans_mode;
    uint8_t max_sge, min_rnr_timer;
    urma_jfc_t *jfc;
    urma_token_t token_value;
    uint64_t user_ctx;
} urma_jfr_cfg_t;
typedef struct urma_jfr {
    urma_context_t *urma_ctx;
    urma_jfr_id_t jfr_id;
    urma_jfr_cfg_t jfr_cfg;
    uint64_t handle;
    uint64_t event_mutex_[5];
    uint64_t event_cond_[6];
    uint32_t async_events_acked;
    uint64_t opt_[10];
} urma_jfr_t;

typedef union urma_jetty_flag {
    struct { uint32_t share_jfr : 1, non_blocking : 1, has_drv_ext : 1, has_user_info : 1, reserved : 28; } bs;
    uint32_t value;
} urma_jetty_flag_t;
struct urma_target_jetty;
typedef struct urma_jetty_cfg {
    uint32_t id;
    urma_jetty_flag_t flag;
    urma_jfs_cfg_t jfs_cfg;
    union {
        struct { urma_jfr_t *jfr; urma_jfc_t *jfc; } shared;
        urma_jfr_cfg_t *jfr_cfg;
    };
    void *jetty_grp;
    uint64_t user_ctx;
} urma_jetty_cfg_t;
typedef struct urma_jetty {
    urma_context_t *urma_ctx;
    urma_jetty_id_t jetty_id;
    struct urma_target_jetty *remote_jetty;
    urma_jetty_cfg_t jetty_cfg;
    uint64_t handle;
    uint64_t event_mutex_[5];
    uint64_t event_cond_[6];
    uint32_t async_events_acked;
    uint64_t opt_[15];
} urma_jetty_t;
typedef struct urma_jetty_attr { uint32_t mask; uint32_t rx_threshold; urma_jetty_state_t state; } urma_jetty_attr_t;
typedef struct urma_jfr_attr { uint32_t mask; uint32_t rx_threshold; urma_jfr_state_t state; } urma_jfr_attr_t;
typedef struct urma_jfc_attr { uint32_t mask; uint16_t moderate_count; uint16_t moderate_period; } urma_jfc_attr_t;
typedef struct urma_user_ctl_in { uint64_t addr; uint32_t len; uint32_t opcode; } urma_user_ctl_in_t;
typedef struct urma_user_ctl_out { uint64_t addr; uint32_t len; uint32_t reserved; } urma_user_ctl_out_t;

typedef union urma_import_jetty_flag {
    struct { uint32_t token_policy : 3, order_type : 8, share_tp : 1, has_drv_ext : 1, has_user_info : 1, reserved : 18; } bs;
    uint32_t value;
} urma_import_jetty_flag_t;
typedef struct urma_rjetty {
    urma_jetty_id_t jetty_id;
    urma_transport_mode_t trans_mode;
    uint32_t policy;
    urma_target_type_t type;
    urma_import_jetty_flag_t flag;
    urma_tp_type_t tp_type;
} urma_rjetty_t;
typedef struct urma_target_jetty {
    urma_context_t *urma_ctx;
    urma_jetty_id_t id;
    uint64_t handle;
    urma_transport_mode_t trans_mode;
    uint32_t tpn;
    urma_target_type_t type;
    urma_import_jetty_flag_t flag;
    uint32_t policy;
    urma_tp_type_t tp_type;
} urma_target_jetty_t;

typedef struct urma_token_id {
    urma_context_t *urma_ctx;
    uint32_t token_id;
    uint64_t handle;
    uint64_t ref;
    uint32_t flag;
} urma_token_id_t;
typedef union urma_reg_seg_flag {
    struct {
        uint32_t token_policy : 3, cacheable : 1, dsva : 1, access : 6, non_pin : 1, user_iova : 1,
            token_id_valid : 1, reserved : 18;
    } bs;
    uint32_t value;
} urma_reg_seg_flag_t;
typedef union urma_seg_attr {
    struct {
        uint32_t token_policy : 3, cacheable : 1, dsva : 1, access : 6, non_pin : 1, user_iova : 1,
            user_token_id : 1, has_user_info : 1, reserved : 17;
    } bs;
    uint32_t value;
} urma_seg_attr_t;
typedef union urma_import_seg_flag {
    struct { uint32_t cacheable : 1, access : 6, mapping : 1, reserved : 24; } bs;
    uint32_t value;
} urma_import_seg_flag_t;
typedef struct urma_seg_cfg {
    uint64_t va;
    uint64_t len;
    urma_token_id_t *token_id;
    urma_token_t token_value;
    urma_reg_seg_flag_t flag;
    uint64_t user_ctx;
    uint64_t iova;
} urma_seg_cfg_t;
typedef struct __attribute__((packed)) urma_ubva { urma_eid_t eid; uint32_t uasid; uint64_t va; } urma_ubva_t;
typedef struct urma_seg {
    urma_ubva_t ubva;
    uint64_t len;
    urma_seg_attr_t attr;
    uint32_t token_id;
} urma_seg_t;
typedef struct urma_target_seg {
    urma_seg_t seg;
    uint64_t user_ctx;
    uint64_t mva;
    urma_context_t *urma_ctx;
    urma_token_id_t *token_id;
    uint64_t handle;
} urma_target_seg_t;

typedef struct urma_user_tseg { uint32_t attr; uint32_t token_id; urma_token_t token_value; } urma_user_tseg_t;
typedef struct urma_sge {
    uint64_t addr;
    uint32_t len;
    urma_target_seg_t *tseg;
    urma_user_tseg_t *user_tseg;
} urma_sge_t;
typedef struct urma_sg { urma_sge_t *sge; uint32_t num_sge; } urma_sg_t;
typedef struct urma_rw_wr { urma_sg_t src; urma_sg_t dst; uint8_t target_hint; uint64_t notify_data; } urma_rw_wr_t;
typedef struct urma_send_wr { urma_sg_t src; uint8_t target_hint; uint64_t imm_data; urma_target_seg_t *tseg; } urma_send_wr_t;
typedef struct urma_cas_wr { urma_sge_t *dst; urma_sge_t *src; uint64_t cmp_data; uint64_t swap_data; } urma_cas_wr_t;
typedef struct urma_faa_wr { urma_sge_t *dst; urma_sge_t *src; uint64_t operand; } urma_faa_wr_t;
typedef union urma_jfs_wr_flag {
    struct {
        uint32_t place_order : 2, comp_order : 1, fence : 1, solicited_enable : 1, complete_enable : 1,
            inline_flag : 1, db_bypass : 1, udf : 1, has_drv_ext : 1, reserved : 22;
    } bs;
    uint32_t value;
} urma_jfs_wr_flag_t;
typedef struct urma_jfs_wr {
    urma_opcode_t opcode;
    urma_jfs_wr_flag_t flag;
    urma_target_jetty_t *tjetty;
    uint64_t user_ctx;
    union { urma_rw_wr_t rw; urma_send_wr_t send; urma_cas_wr_t cas; urma_faa_wr_t faa; };
    struct urma_jfs_wr *next;
} urma_jfs_wr_t;
typedef struct urma_jfr_wr {
    urma_sg_t src;
    uint64_t user_ctx;
    struct urma_jfr_wr *next;
} urma_jfr_wr_t;

typedef union urma_cr_flag {
    struct { uint8_t s_r : 1, jetty : 1, suspend_done : 1, flush_err_done : 1, reserved : 4; } bs;
    uint8_t value;
} urma_cr_flag_t;
typedef struct urma_cr {
    urma_cr_status_t status;
    uint64_t user_ctx;
    urma_cr_opcode_t opcode;
    urma_cr_flag_t flag;
    uint32_t completion_len;
    uint32_t local_id;
    urma_jetty_id_t remote_id;
    union { uint64_t imm_data; struct { uint32_t token_id; urma_token_t token_value; } invalid_token; };
    uint32_t tpn;
    uintptr_t user_data;
} urma_cr_t;

typedef struct urma_async_event {
    urma_context_t *urma_ctx;
    union { urma_jfc_t *jfc; void *jfs; urma_jfr_t *jfr; urma_jetty_t *jetty; void *jetty_grp; uint32_t port_id; uint32_t eid_idx; } element;
    urma_async_event_type_t event_type;
    void *priv;
} urma_async_event_t;

typedef void (*urma_log_cb_t)(int level, char *message);

urma_status_t urma_init(urma_init_attr_t *conf);
urma_status_t urma_uninit(void);
urma_device_t **urma_get_device_list(int *num_devices);
void urma_free_device_list(urma_device_t **device_list);
urma_device_t *urma_get_device_by_name(char *dev_name);
urma_device_t *urma_get_device_by_eid(urma_eid_t eid, urma_transport_type_t type);
urma_eid_info_t *urma_get_eid_list(urma_device_t *dev, uint32_t *cnt);
void urma_free_eid_list(urma_eid_info_t *eid_list);
urma_status_t urma_query_device(urma_device_t *dev, urma_device_attr_t *dev_attr);
urma_context_t *urma_create_context(urma_device_t *dev, uint32_t eid_index);
urma_status_t urma_delete_context(urma_context_t *ctx);
urma_jfce_t *urma_create_jfce(urma_context_t *ctx);
urma_status_t urma_delete_jfce(urma_jfce_t *jfce);
urma_jfc_t *urma_create_jfc(urma_context_t *ctx, urma_jfc_cfg_t *jfc_cfg);
urma_status_t urma_delete_jfc(urma_jfc_t *jfc);
urma_status_t urma_rearm_jfc(urma_jfc_t *jfc, bool solicited_only);
int urma_wait_jfc(urma_jfce_t *jfce, uint32_t jfc_cnt, int time_out, urma_jfc_t *jfc[]);
void urma_ack_jfc(urma_jfc_t *jfc[], uint32_t nevents[], uint32_t jfc_cnt);
int urma_poll_jfc(urma_jfc_t *jfc, int cr_cnt, urma_cr_t *cr);
urma_jfr_t *urma_create_jfr(urma_context_t *ctx, urma_jfr_cfg_t *jfr_cfg);
urma_status_t urma_delete_jfr(urma_jfr_t *jfr);
urma_jetty_t *urma_create_jetty(urma_context_t *ctx, urma_jetty_cfg_t *jetty_cfg);
urma_status_t urma_delete_jetty(urma_jetty_t *jetty);
urma_status_t urma_modify_jetty(urma_jetty_t *jetty, urma_jetty_attr_t *attr);
urma_status_t urma_query_jetty(urma_jetty_t *jetty, urma_jetty_cfg_t *cfg, urma_jetty_attr_t *attr);
int urma_flush_jetty(urma_jetty_t *jetty, int cr_cnt, urma_cr_t *cr);
urma_target_jetty_t *urma_import_jetty(urma_context_t *ctx, urma_rjetty_t *rjetty, urma_token_t *token_value);
urma_status_t urma_unimport_jetty(urma_target_jetty_t *tjetty);
urma_status_t urma_bind_jetty(urma_jetty_t *jetty, urma_target_jetty_t *tjetty);
urma_status_t urma_unbind_jetty(urma_jetty_t *jetty);
urma_status_t urma_get_rjetty(urma_jetty_t *jetty, urma_rjetty_t **rjetty, uint32_t *length);
void urma_put_rjetty(urma_rjetty_t *rjetty);
urma_token_id_t *urma_alloc_token_id(urma_context_t *ctx);
urma_status_t urma_free_token_id(urma_token_id_t *token_id);
urma_target_seg_t *urma_register_seg(urma_context_t *ctx, urma_seg_cfg_t *seg_cfg);
urma_status_t urma_unregister_seg(urma_target_seg_t *target_seg);
urma_target_seg_t *urma_import_seg(urma_context_t *ctx, urma_seg_t *seg, urma_token_t *token_value,
                                   uint64_t addr, urma_import_seg_flag_t flag);
urma_status_t urma_unimport_seg(urma_target_seg_t *tseg);
urma_status_t urma_get_seg_ctx(urma_target_seg_t *tseg, urma_seg_t **seg, uint32_t *size);
void urma_put_seg_ctx(urma_seg_t *seg);
urma_status_t urma_post_jetty_send_wr(urma_jetty_t *jetty, urma_jfs_wr_t *wr, urma_jfs_wr_t **bad_wr);
urma_status_t urma_post_jetty_recv_wr(urma_jetty_t *jetty, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr);
urma_status_t urma_post_jfr_wr(urma_jfr_t *jfr, urma_jfr_wr_t *wr, urma_jfr_wr_t **bad_wr);
urma_status_t urma_get_async_event(urma_context_t *ctx, urma_async_event_t *event);
void urma_ack_async_event(urma_async_event_t *event);
urma_status_t urma_register_log_func(urma_log_cb_t func);
urma_status_t urma_unregister_log_func(void);
urma_status_t urma_modify_jfc(urma_jfc_t *jfc, urma_jfc_attr_t *attr);
urma_status_t urma_modify_jfr(urma_jfr_t *jfr, urma_jfr_attr_t *attr);
urma_status_t urma_query_jfr(urma_jfr_t *jfr, urma_jfr_cfg_t *cfg, urma_jfr_attr_t *attr);
urma_status_t urma_user_ctl(urma_context_t *ctx, urma_user_ctl_in_t *in, urma_user_ctl_out_t *out);
void urma_log_set_level(int level);
int urma_str_to_eid(const char *buf, urma_eid_t *eid);
void urma_u32_to_eid(uint32_t ipv4, urma_eid_t *eid);

/* The layouts of shared/reference/urma-abi.md §3 (x86_64). */
#if defined(__x86_64__)
_Static_assert(sizeof(urma_eid_t) == 16 && _Alignof(urma_eid_t) == 8, "urma_eid_t");
_Static_assert(sizeof(urma_device_t) == 4184 && offsetof(urma_device_t, ops) == 4168, "urma_device_t");
_Static_assert(sizeof(urma_context_t) == 104 && offsetof(urma_context_t, eid) == 64 && offsetof(urma_context_t, uasid) == 84, "urma_context_t");
_Static_assert(sizeof(urma_device_cap_t) == 304 && offsetof(urma_device_cap_t, max_msg_size) == 56 && offsetof(urma_device_cap_t, page_size_cap) == 128 && offsetof(urma_device_cap_t, priority_info) == 172, "urma_device_cap_t");
_Static_assert(sizeof(urma_device_attr_t) == 496 && offsetof(urma_device_attr_t, port_cnt) == 320 && offsetof(urma_device_attr_t, port_attr) == 324 && offsetof(urma_device_attr_t, reserved_jetty_id_max) == 488, "urma_device_attr_t");
_Static_assert(sizeof(urma_jfce_t) == 24 && sizeof(urma_jfc_cfg_t) == 32 && offsetof(urma_jfc_cfg_t, jfce) == 16, "jfce / jfc_cfg");
_Static_assert(sizeof(urma_jfc_t) == 248 && offsetof(urma_jfc_t, comp_events_acked) == 160 && offsetof(urma_jfc_t, opt_) == 168, "urma_jfc_t");
_Static_assert(sizeof(urma_jfs_cfg_t) == 40 && offsetof(urma_jfs_cfg_t, max_inline_data) == 16 && offsetof(urma_jfs_cfg_t, rnr_retry) == 20 && offsetof(urma_jfs_cfg_t, jfc) == 24, "urma_jfs_cfg_t");
_Static_assert(sizeof(urma_jfr_cfg_t) == 48 && offsetof(urma_jfr_cfg_t, max_sge) == 16 && offsetof(urma_jfr_cfg_t, jfc) == 24 && offsetof(urma_jfr_cfg_t, token_value) == 32 && offsetof(urma_jfr_cfg_t, user_ctx) == 40, "urma_jfr_cfg_t");
_Static_assert(sizeof(urma_jfr_t) == 264 && offsetof(urma_jfr_t, handle) == 80 && offsetof(urma_jfr_t, async_events_acked) == 176, "urma_jfr_t");
_Static_assert(sizeof(urma_jetty_cfg_t) == 80 && offsetof(urma_jetty_cfg_t, shared) == 48 && offsetof(urma_jetty_cfg_t, jetty_grp) == 64, "urma_jetty_cfg_t");
_Static_assert(sizeof(urma_jetty_t) == 344 && offsetof(urma_jetty_t, remote_jetty) == 32 && offsetof(urma_jetty_t, jetty_cfg) == 40 && offsetof(urma_jetty_t, handle) == 120 && offsetof(urma_jetty_t, async_events_acked) == 216 && offsetof(urma_jetty_t, opt_) == 224, "urma_jetty_t");
_Static_assert(sizeof(urma_jetty_attr_t) == 12 && sizeof(urma_rjetty_t) == 48 && offsetof(urma_rjetty_t, tp_type) == 40, "jetty attr / rjetty");
_Static_assert(sizeof(urma_jfr_attr_t) == 12 && sizeof(urma_jfc_attr_t) == 8 && offsetof(urma_jfc_attr_t, moderate_period) == 6, "jfr / jfc attr");
_Static_assert(sizeof(urma_user_ctl_in_t) == 16 && offsetof(urma_user_ctl_in_t, opcode) == 12 && sizeof(urma_user_ctl_out_t) == 16, "user_ctl in / out");
_Static_assert(sizeof(urma_target_jetty_t) == 64 && offsetof(urma_target_jetty_t, tpn) == 44 && offsetof(urma_target_jetty_t, tp_type) == 60, "urma_target_jetty_t");
_Static_assert(sizeof(urma_token_id_t) == 40 && sizeof(urma_seg_cfg_t) == 48 && offsetof(urma_seg_cfg_t, flag) == 28 && offsetof(urma_seg_cfg_t, iova) == 40, "token id / seg cfg");
_Static_assert(sizeof(urma_ubva_t) == 28 && _Alignof(urma_ubva_t) == 1 && sizeof(urma_seg_t) == 48 && offsetof(urma_seg_t, len) == 32 && offsetof(urma_seg_t, token_id) == 44, "ubva / seg");
_Static_assert(sizeof(urma_target_seg_t) == 88 && offsetof(urma_target_seg_t, handle) == 80, "urma_target_seg_t");
_Static_assert(sizeof(urma_sge_t) == 32 && sizeof(urma_sg_t) == 16 && sizeof(urma_rw_wr_t) == 48 && offsetof(urma_rw_wr_t, notify_data) == 40, "sge / rw");
_Static_assert(sizeof(urma_send_wr_t) == 40 && offsetof(urma_send_wr_t, imm_data) == 24 && sizeof(urma_cas_wr_t) == 32 && sizeof(urma_faa_wr_t) == 24, "send / cas / faa");
_Static_assert(sizeof(urma_jfs_wr_t) == 80 && offsetof(urma_jfs_wr_t, rw) == 24 && offsetof(urma_jfs_wr_t, next) == 72, "urma_jfs_wr_t");
_Static_assert(sizeof(urma_jfr_wr_t) == 32 && offsetof(urma_jfr_wr_t, next) == 24, "urma_jfr_wr_t");
_Static_assert(sizeof(urma_cr_t) == 80 && offsetof(urma_cr_t, flag) == 20 && offsetof(urma_cr_t, completion_len) == 24 && offsetof(urma_cr_t, remote_id) == 32 && offsetof(urma_cr_t, imm_data) == 56 && offsetof(urma_cr_t, tpn) == 64 && offsetof(urma_cr_t, user_data) == 72, "urma_cr_t");
_Static_assert(sizeof(urma_async_event_t) == 32 && offsetof(urma_async_event_t, event_type) == 16, "urma_async_event_t");
#endif

#ifdef __cplusplus
}
#endif
#endif /* BYPASS_URMA_API_H */
