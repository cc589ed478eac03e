//! The C types of `hcom4db.h`, `#[repr(C)]` (or packed, where the header packs), and the status
//! codes. Layouts are checked by the tests from Rust (below) and from C (`tests/c/layout.c`).

use std::ffi::{c_char, c_int, c_void};

/// `OckRpcStatus`.
pub type OckRpcStatus = c_int;
/// Success.
pub const OCK_RPC_OK: OckRpcStatus = 0;
/// Generic failure.
pub const OCK_RPC_ERR: OckRpcStatus = -1;
/// A parameter (handle, pointer, size, config value, id) is invalid.
pub const OCK_RPC_ERR_INVALID_PARAM: OckRpcStatus = -2;
/// The message id has no service on the peer.
pub const OCK_RPC_ERR_MISMATCH_MSG_ID: OckRpcStatus = -3;
/// Connecting failed.
pub const OCK_RPC_ERR_CONN_UNCONNECTED: OckRpcStatus = -4;
/// Out of memory.
pub const OCK_RPC_ERR_NO_MEMORY: OckRpcStatus = -7;
/// The communication type's backend is not compiled in or has no device.
pub const OCK_RPC_ERR_RDMA_NOT_ENABLE: OckRpcStatus = -8;
/// Not supported.
pub const OCK_RPC_ERR_UNSUPPORT: OckRpcStatus = -14;
/// The call's deadline passed.
pub const OCK_RPC_ERR_UCP_TIMEOUT: OckRpcStatus = -19;
/// The connection is closed.
pub const OCK_RPC_ERR_UCP_CLOSE: OckRpcStatus = -20;
/// The connection broke.
pub const OCK_RPC_ERR_CONN_BROKEN: OckRpcStatus = -21;
/// A remote key was refused.
pub const OCK_RPC_ERR_INVALID_RKEY: OckRpcStatus = -22;

/// `OckRpcServer`, `OckRpcClient`, contexts, regions, allocators: a handle (see [`crate::handle`]).
pub type Handle = usize;

/// `OckRpcClientHandler`.
pub type OckRpcClientHandler =
    Option<unsafe extern "C" fn(client: Handle, usr_ctx: u64, payload: *const c_char) -> c_int>;
/// `OckRpcTlsKeypassErase`.
pub type OckRpcTlsKeypassErase = Option<unsafe extern "C" fn(keypass: *mut c_char)>;
/// `OckRpcTlsGetPrivateKey`.
pub type OckRpcTlsGetPrivateKey = Option<
    unsafe extern "C" fn(
        path: *mut *const c_char,
        keypass: *mut *mut c_char,
        erase: *mut OckRpcTlsKeypassErase,
    ),
>;
/// `OckRpcTlsGetCert`.
pub type OckRpcTlsGetCert = Option<unsafe extern "C" fn(path: *mut *const c_char)>;
/// `OckRpcTlsCertVerify`: `x509` points to an [`OckRpcTlsPeerCert`].
pub type OckRpcTlsCertVerify =
    Option<unsafe extern "C" fn(x509: *mut c_void, crl_path: *const c_char) -> c_int>;
/// `OckRpcTlsGetCAAndVerify`.
pub type OckRpcTlsGetCAAndVerify = Option<
    unsafe extern "C" fn(ca: *mut *const c_char, crl: *mut *const c_char, verify: *mut OckRpcTlsCertVerify),
>;

/// `OckRpcTlsPeerCert` (a bypass extension): what the verify callback's `x509` points to.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcTlsPeerCert {
    /// The peer's end-entity certificate, DER.
    pub der: *const u8,
    /// Its length.
    pub len: usize,
    /// 1: the peer is a server (we are its client); 0: the peer is a client.
    pub peer_is_server: c_int,
}

/// `OckRpcMessage`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcMessage {
    /// The bytes.
    pub data: *mut c_void,
    /// Their length.
    pub len: usize,
}

/// `OckRpcMessageInfo`: `size` bytes at `l_address` of a region registered with key `l_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcMessageInfo {
    /// Address.
    pub l_address: usize,
    /// Local key of the region.
    pub l_key: u32,
    /// Length.
    pub size: u32,
}

/// `OckRpcMessageIov`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcMessageIov {
    /// Number of messages.
    pub count: usize,
    /// The messages.
    pub msgs: *mut OckRpcMessage,
}

/// `OckRpcMessageInfoIov`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcMessageInfoIov {
    /// Number of infos.
    pub count: usize,
    /// The infos.
    pub reqs: *mut OckRpcMessageInfo,
}

/// `OckRpcRndvMessage`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcRndvMessage {
    /// Messages used.
    pub cnt: u16,
    /// The messages.
    pub msg: [OckRpcMessage; 4],
}

/// `OckRpcMsgHandler`.
pub type OckRpcMsgHandler = Option<unsafe extern "C" fn(ctx: Handle, msg: OckRpcMessage)>;
/// `OckRpcMsgRndvHandler`.
pub type OckRpcMsgRndvHandler = Option<unsafe extern "C" fn(ctx: Handle, msg: OckRpcRndvMessage)>;
/// `OckRpcDoneCallback`.
pub type OckRpcDoneCallback = Option<unsafe extern "C" fn(status: OckRpcStatus, arg: *mut c_void)>;
/// `OckRpcServerCtxBuilderHandler` (deprecated).
pub type OckRpcServerCtxBuilderHandler = Option<unsafe extern "C" fn(server: Handle) -> Handle>;
/// `OckRpcServerCtxCleanupHandler` (deprecated).
pub type OckRpcServerCtxCleanupHandler = Option<unsafe extern "C" fn(server: Handle, ctx: Handle)>;
/// `OckRpcRndvMemAllocate`.
pub type OckRpcRndvMemAllocate =
    Option<unsafe extern "C" fn(size: u64, address: *mut usize, key: *mut u32) -> c_int>;
/// `OckRpcRndvMemFree`.
pub type OckRpcRndvMemFree = Option<unsafe extern "C" fn(address: usize) -> c_int>;
/// `OckRpcLogHandler`.
pub type OckRpcLogHandler = Option<unsafe extern "C" fn(level: c_int, msg: *const c_char)>;

/// `OckRpcService`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcService {
    /// Message id, 0..999.
    pub id: u16,
    /// The handler.
    pub handler: OckRpcMsgHandler,
}

/// `OckRpcRndvService`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcRndvService {
    /// Message id, 0..999.
    pub id: u16,
    /// The handler.
    pub handler: OckRpcMsgRndvHandler,
}

/// `OckRpcCallDone`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcCallDone {
    /// Called once with the outcome.
    pub cb: OckRpcDoneCallback,
    /// Passed to `cb`.
    pub arg: *mut c_void,
}

/// `RpcConfigPair`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RpcConfigPair {
    /// Key string.
    pub key: *const c_char,
    /// Value string (or a function pointer for the function keys).
    pub value: *const c_char,
}

/// `RpcConfigs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RpcConfigs {
    /// Number of pairs.
    pub size: c_int,
    /// The pairs.
    pub pairs: *mut RpcConfigPair,
}

/// `OCK_RPC_CONFIG_USE_RPC_CONFIGS`.
pub const OCK_RPC_CONFIG_USE_RPC_CONFIGS: u64 = 1;
/// `OCK_RPC_CONFIG_USE_SERVER_CTX_BUILD` (deprecated).
pub const OCK_RPC_CONFIG_USE_SERVER_CTX_BUILD: u64 = 2;
/// `OCK_RPC_CONFIG_USE_SSL_CALLBACK`.
pub const OCK_RPC_CONFIG_USE_SSL_CALLBACK: u64 = 4;

/// `OckRpcCreateConfig`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcCreateConfig {
    /// `OCK_RPC_CONFIG_*` bits.
    pub mask: u64,
    /// Key/value pairs (read with `OCK_RPC_CONFIG_USE_RPC_CONFIGS`).
    pub configs: RpcConfigs,
    /// Deprecated.
    pub server_ctx_builder: OckRpcServerCtxBuilderHandler,
    /// Deprecated.
    pub server_ctx_cleanup: OckRpcServerCtxCleanupHandler,
    /// TLS: CA, CRL and verify callback.
    pub get_ca_and_verify: OckRpcTlsGetCAAndVerify,
    /// TLS: certificate.
    pub get_cert: OckRpcTlsGetCert,
    /// TLS: private key and passphrase.
    pub get_pri_key: OckRpcTlsGetPrivateKey,
}

/// `OckRpcClientCallParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcClientCallParams {
    /// `OCK_RPC_CLIENT_CALL_DEFAULT`.
    pub mask: u64,
    /// The client.
    pub client: Handle,
    /// Unused.
    pub context: Handle,
    /// Message id.
    pub msg_id: u16,
    /// Request buffers (1..8), sent as one message.
    pub req_iov: OckRpcMessageIov,
    /// Response buffers (count 0: no response).
    pub rsp_iov: OckRpcMessageIov,
    /// NULL: synchronous.
    pub done: *mut OckRpcCallDone,
}

/// `OckRpcMemoryRegionInfo`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcMemoryRegionInfo {
    /// Address of the region's first byte.
    pub l_address: usize,
    /// Local key.
    pub l_key: u32,
    /// Size in bytes.
    pub size: u32,
}

/// `OckRpcRequest` (packed, 28 bytes).
#[repr(C, packed)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcRequest {
    /// Local address.
    pub l_address: usize,
    /// Remote address.
    pub r_address: usize,
    /// Local key.
    pub l_key: u32,
    /// Remote key.
    pub r_key: u32,
    /// Bytes.
    pub size: u32,
}

/// `OckRpcSglRequest` (packed, 10 bytes).
#[repr(C, packed)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcSglRequest {
    /// The requests.
    pub iov: *mut OckRpcRequest,
    /// How many.
    pub iov_count: u16,
}

/// `OckRpcMemoryAllocatorOptions`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OckRpcMemoryAllocatorOptions {
    /// Base address.
    pub address: usize,
    /// Size.
    pub size: u64,
    /// Smallest block.
    pub min_block_size: u32,
    /// Buckets.
    pub bucket_count: u32,
    /// Alignment.
    pub aligned_address: u16,
    /// Cache tiers.
    pub cache_tier_count: u16,
    /// Blocks per tier.
    pub cache_block_count_per_tier: u16,
    /// `OckRpcMemoryAllocatorCacheTierPolicy`.
    pub cache_tier_policy: c_int,
}

/// `MEM_TIER_TIMES`.
pub const MEM_TIER_TIMES: c_int = 0;
/// `MEM_TIER_POWER`.
pub const MEM_TIER_POWER: c_int = 1;
/// `MEM_DYNAMIC_SIZE`.
pub const MEM_DYNAMIC_SIZE: c_int = 0;
/// `MEM_DYNAMIC_SIZE_WITH_CACHE`.
pub const MEM_DYNAMIC_SIZE_WITH_CACHE: c_int = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_reference_on_x86_64() {
        assert_eq!(size_of::<OckRpcMessage>(), 16);
        assert_eq!(size_of::<OckRpcMessageIov>(), 16);
        assert_eq!(size_of::<OckRpcMessageInfo>(), 16);
        assert_eq!(size_of::<OckRpcMessageInfoIov>(), 16);
        assert_eq!(size_of::<OckRpcRndvMessage>(), 72);
        assert_eq!(offset_of!(OckRpcRndvMessage, msg), 8);
        assert_eq!(size_of::<OckRpcService>(), 16);
        assert_eq!(size_of::<OckRpcRndvService>(), 16);
        assert_eq!(size_of::<OckRpcCallDone>(), 16);
        assert_eq!(size_of::<RpcConfigs>(), 16);
        assert_eq!(size_of::<RpcConfigPair>(), 16);
        assert_eq!(size_of::<OckRpcCreateConfig>(), 64);
        assert_eq!(offset_of!(OckRpcCreateConfig, configs), 8);
        assert_eq!(offset_of!(OckRpcCreateConfig, server_ctx_builder), 24);
        assert_eq!(offset_of!(OckRpcCreateConfig, server_ctx_cleanup), 32);
        assert_eq!(offset_of!(OckRpcCreateConfig, get_ca_and_verify), 40);
        assert_eq!(offset_of!(OckRpcCreateConfig, get_cert), 48);
        assert_eq!(offset_of!(OckRpcCreateConfig, get_pri_key), 56);
        assert_eq!(size_of::<OckRpcClientCallParams>(), 72);
        assert_eq!(offset_of!(OckRpcClientCallParams, client), 8);
        assert_eq!(offset_of!(OckRpcClientCallParams, context), 16);
        assert_eq!(offset_of!(OckRpcClientCallParams, msg_id), 24);
        assert_eq!(offset_of!(OckRpcClientCallParams, req_iov), 32);
        assert_eq!(offset_of!(OckRpcClientCallParams, rsp_iov), 48);
        assert_eq!(offset_of!(OckRpcClientCallParams, done), 64);
        assert_eq!(size_of::<OckRpcRequest>(), 28);
        assert_eq!(size_of::<OckRpcSglRequest>(), 10);
        assert_eq!(size_of::<OckRpcMemoryRegionInfo>(), 16);
        assert_eq!(size_of::<OckRpcMemoryAllocatorOptions>(), 40);
        assert_eq!(offset_of!(OckRpcMemoryAllocatorOptions, cache_tier_policy), 32);
    }
}
