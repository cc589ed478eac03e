/*
 * hcom4db.h: the OckRpc* C API (the interface openGauss's libhcom4db.so offers), implemented by
 * bypass's libhcom4db.so. Written for bypass from the interface's specification: the same
 * names, types, struct layouts and status codes, and self-contained (it compiles on its own in
 * C11 and C++17). Semantics and the differences from the reference are in docs/capi.md.
 */
#ifndef HCOM_HCOM4DB_H
#define HCOM_HCOM4DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Callers usually test for OCK_RPC_OK only; the others say why. */
typedef enum {
    OCK_RPC_OK = 0,
    OCK_RPC_ERR = -1,
    OCK_RPC_ERR_INVALID_PARAM = -2,
    OCK_RPC_ERR_MISMATCH_MSG_ID = -3,
    OCK_RPC_ERR_CONN_UNCONNECTED = -4,
    OCK_RPC_ERR_SERIALIZE = -5,
    OCK_RPC_ERR_DESERIALIZE = -6,
    OCK_RPC_ERR_NO_MEMORY = -7,
    OCK_RPC_ERR_RDMA_NOT_ENABLE = -8,
    OCK_RPC_ERR_UNPACK_RKEY = -9,
    OCK_RPC_ERR_UCP_TAG_SEND = -10,
    OCK_RPC_ERR_UCP_TAG_RECV = -11,
    OCK_RPC_ERR_UCP_PUT = -12,
    OCK_RPC_ERR_UCP_GET = -13,
    OCK_RPC_ERR_UNSUPPORT = -14,
    OCK_RPC_ERR_SERVICE_EXIST = -15,
    OCK_RPC_ERR_ENCRYPT = -16,
    OCK_RPC_ERR_DECRYPT = -17,
    OCK_RPC_ERR_SINATURE = -18,
    OCK_RPC_ERR_UCP_TIMEOUT = -19,
    OCK_RPC_ERR_UCP_CLOSE = -20,
    OCK_RPC_ERR_CONN_BROKEN = -21,
    OCK_RPC_ERR_INVALID_RKEY = -22
} OckRpcStatus;

/* Configuration keys (RpcConfigPair.key). Values are NUL-terminated strings, except for the
 * four function-pointer keys, whose value IS the function pointer cast to const char *. */
#define OCK_RPC_STR_SERVER_NAME "server.create.name"           /* <= 64 chars, default "service" */
#define OCK_RPC_STR_SERVER_PORT_RANGE "server.create.range"    /* "4000-5000", used for port 0 */
#define OCK_RPC_STR_COMMUNICATION_TYPE "server.create.type"    /* "TCP", "RDMA", "UBC" or "HCCS" */
#define OCK_RPC_STR_PRE_SEGMENT_SIZE "server.create.segsize"   /* largest two-sided message */
#define OCK_RPC_STR_PRE_SEGMENT_COUNT "server.create.segcount" /* preallocated segments */
#define OCK_RPC_STR_CLIENT_NEW "server.client.new"             /* OckRpcClientHandler */
#define OCK_RPC_STR_CLIENT_BREAK "server.client.break"         /* OckRpcClientHandler */
#define OCK_RPC_STR_SEP_THR_GRP ","
#define OCK_RPC_STR_SEP_CPU_SET "-"
#define OCK_RPC_STR_WRK_THR_GRP "worker.thread.groups"         /* "4" or "1,2,3" */
#define OCK_RPC_STR_WRK_CPU_SET "worker.thread.cpuset"         /* "1-4" or "1-1,2-3,na" */
#define OCK_RPC_STR_ENABLE_POLL_WORKER "worker.poll.enable"    /* "yes" busy poll, "no" events */
#define OCK_RPC_STR_ENABLE_SEND_RNDV "server.rndv.enable"      /* "yes" (with malloc, mfree) / "no" */
#define OCK_RPC_STR_RNDV_MALLOC "server.rndv.malloc"           /* OckRpcRndvMemAllocate */
#define OCK_RPC_STR_RNDV_MFREE "server.rndv.mfree"             /* OckRpcRndvMemFree */
#define OCK_RPC_STR_HEATBEAT_IDLE "server.heartbeat.idle"      /* seconds, >= 1, default 1 */
#define OCK_RPC_STR_ENABLE_TLS "server.tls.enable"             /* "yes" / "no" */
#define OCK_RPC_STR_CLIENT_CREATE_INFO "client.create.info"    /* <= 64 chars, default "hello" */
#define OCK_RPC_STR_ENABLE_SELFPOLLING "client.enable.selfpolling" /* "yes" / "no" */

#define OCK_RPC_BIT(i) (1UL << (i))

typedef uintptr_t OckRpcServer;
typedef uintptr_t OckRpcClient;
typedef uintptr_t OckRpcServerContext;
typedef uintptr_t OckRpcClientContext;
typedef uintptr_t OckRpcServerRndvContext;

/* A connection event: a client connected (new) or a connection ended (break). */
typedef int (*OckRpcClientHandler)(OckRpcClient client, uint64_t usrCtx, const char *payLoad);

/* TLS callbacks. */
typedef void (*OckRpcTlsKeypassErase)(char *keypass);
typedef void (*OckRpcTlsGetPrivateKey)(const char **priKeyPath, char **keypass, OckRpcTlsKeypassErase *erase);
typedef void (*OckRpcTlsGetCert)(const char **certPath);
/* bypass: x509 points to an OckRpcTlsPeerCert (the peer's certificates in DER, already verified
 * against the CA file and CRL by rustls); return 1 to accept, -1 to refuse. */
typedef int (*OckRpcTlsCertVerify)(void *x509, const char *crlPath);
typedef void (*OckRpcTlsGetCAAndVerify)(const char **caPath, const char **crlPath, OckRpcTlsCertVerify *verify);

/* bypass extension: what OckRpcTlsCertVerify's x509 points to. */
typedef struct {
    const uint8_t *der;     /* the peer's end-entity certificate, DER */
    size_t len;             /* its length in bytes */
    int peerIsServer;       /* 1: we are the client checking a server; 0: the reverse */
} OckRpcTlsPeerCert;

typedef struct {
    void *data;
    size_t len;
} OckRpcMessage;

typedef struct {
    uintptr_t lAddress;
    uint32_t lKey;
    uint32_t size;
} OckRpcMessageInfo;

typedef struct {
    size_t count;
    OckRpcMessage *msgs;
} OckRpcMessageIov;

typedef struct {
    size_t count;
    OckRpcMessageInfo *reqs;
} OckRpcMessageInfoIov;

typedef struct {
    uint16_t cnt;
    OckRpcMessage msg[4];
} OckRpcRndvMessage;

/* A request handler; ctx and msg stay valid until the reply (or, for a cloned ctx, until
 * OckRpcDeCloneCtx). */
typedef void (*OckRpcMsgHandler)(OckRpcServerContext ctx, OckRpcMessage msg);
typedef void (*OckRpcMsgRndvHandler)(OckRpcServerRndvContext ctx, OckRpcRndvMessage msg);

/* Completion of an asynchronous operation: runs exactly once, with the outcome. */
typedef void (*OckRpcDoneCallback)(OckRpcStatus status, void *arg);

/* Deprecated (UCX-era) server context hooks. */
typedef OckRpcServerContext (*OckRpcServerCtxBuilderHandler)(OckRpcServer server);
typedef void (*OckRpcServerCtxCleanupHandler)(OckRpcServer server, OckRpcServerContext ctx);

OckRpcServerContext OckRpcServerCtxBuilderThreadLocal(OckRpcServer server);
void OckRpcServerCtxCleanupThreadLocal(OckRpcServer server, OckRpcServerContext ctx);

/* Rendezvous memory hooks (server.rndv.malloc / server.rndv.mfree). */
typedef int (*OckRpcRndvMemAllocate)(uint64_t size, uintptr_t *address, uint32_t *key);
typedef int (*OckRpcRndvMemFree)(uintptr_t address);

typedef struct {
    uint16_t id;
    OckRpcMsgHandler handler;
} OckRpcService;

typedef struct {
    uint16_t id;
    OckRpcMsgRndvHandler handler;
} OckRpcRndvService;

typedef struct {
    OckRpcDoneCallback cb;
    void *arg;
} OckRpcCallDone;

typedef struct {
    const char *key;
    const char *value;
} RpcConfigPair;

typedef struct {
    int size;
    RpcConfigPair *pairs;
} RpcConfigs;

typedef enum {
    OCK_RPC_CONFIG_USE_RPC_CONFIGS = 1,       /* OCK_RPC_BIT(0) */
    OCK_RPC_CONFIG_USE_SERVER_CTX_BUILD = 2,  /* OCK_RPC_BIT(1), deprecated */
    OCK_RPC_CONFIG_USE_SSL_CALLBACK = 4       /* OCK_RPC_BIT(2) */
} OckRpcCreateConfigMask;

typedef struct {
    uint64_t mask;
    RpcConfigs configs;
    OckRpcServerCtxBuilderHandler serverCtxbuilder; /* deprecated, ignored */
    OckRpcServerCtxCleanupHandler serverCtxCleanup; /* deprecated, ignored */
    OckRpcTlsGetCAAndVerify getCaAndVerify;
    OckRpcTlsGetCert getCert;
    OckRpcTlsGetPrivateKey getPriKey;
} OckRpcCreateConfig;

typedef enum {
    OCK_RPC_CLIENT_CALL_DEFAULT = 0
} OckcRpcClientCallParamsMask;

typedef struct {
    uint64_t mask;
    OckRpcClient client;
    OckRpcClientContext context; /* unused, may be 0 */
    uint16_t msgId;
    OckRpcMessageIov reqIov;     /* 1..8 buffers, sent as one message */
    OckRpcMessageIov rspIov;     /* count 0: no response; {NULL, 0}: the library mallocs it */
    OckRpcCallDone *done;        /* NULL: synchronous */
} OckRpcClientCallParams;

/* level 0/1/2/3 = debug/info/warn/error. */
typedef void (*OckRpcLogHandler)(int level, const char *msg);

void OckRpcSetExternalLogger(OckRpcLogHandler h);

OckRpcStatus OckRpcServerCreateWithCfg(
    const char *ip, uint16_t port, OckRpcServer *server, OckRpcCreateConfig *configs);
bool OckRpcGetOobIpAndPort(OckRpcServer server, char ***ipArray, uint16_t **portArray, int *length);
OckRpcStatus OckRpcServerAddService(OckRpcServer server, OckRpcService *service);
OckRpcStatus OckRpcServerAddRndvService(OckRpcServer server, OckRpcRndvService *service);
OckRpcStatus OckRpcServerStart(OckRpcServer server);
void OckRpcServerDestroy(OckRpcServer server);
OckRpcStatus OckRpcServerReply(OckRpcServerContext ctx, uint16_t msgId, OckRpcMessage *reply, OckRpcCallDone *done);
OckRpcStatus OckRpcServerReplyRndv(
    OckRpcServerRndvContext ctx, uint16_t msgId, OckRpcMessage *reply, OckRpcCallDone *done);
int OckRpcGetClient(OckRpcServerContext ctx, OckRpcClient *client);
int OckRpcGetRndvClient(OckRpcServerRndvContext ctx, OckRpcClient *client);
OckRpcServerContext OckRpcCloneCtx(OckRpcServerContext ctx);
void OckRpcDeCloneCtx(OckRpcServerContext ctx);
void OckRpcServerCleanupCtx(OckRpcServerContext ctx);
int OckRpcServerCleanupRndvCtx(OckRpcServerRndvContext ctx);

OckRpcStatus OckRpcClientConnectWithCfg(const char *ip, uint16_t port, OckRpcClient *client,
    OckRpcCreateConfig *configs);
void OckRpcClientDisconnect(OckRpcClient client);
void OckRpcClientDisconnectBreakHandler(OckRpcClient client);
int OckRpcSetUpCtx(OckRpcClient client, uint64_t ctx);
int OckRpcGetUpCtx(OckRpcClient client, uint64_t *ctx);
OckRpcStatus OckRpcClientCall(
    OckRpcClient client, uint16_t msgId, OckRpcMessage *request, OckRpcMessage *response, OckRpcCallDone *done);
OckRpcStatus OckRpcClientCallWithParam(OckRpcClientCallParams *params);
OckRpcStatus OckRpcClientCallRndv(
    OckRpcClient client, uint16_t msgId, OckRpcMessageInfo *request, OckRpcMessage *response, OckRpcCallDone *done);
OckRpcStatus OckRpcClientCallRndvIov(
    OckRpcClient client, uint16_t msgId, OckRpcMessageInfoIov *request, OckRpcMessage *response, OckRpcCallDone *done);

/* Memory regions. */
typedef uintptr_t OckRpcMemoryRegion;

typedef struct {
    uintptr_t lAddress;
    uint32_t lKey;
    uint32_t size;
} OckRpcMemoryRegionInfo;

int OckRpcRegisterMemoryRegion(OckRpcServer server, uint64_t size, OckRpcMemoryRegion *mr);
int OckRpcRegisterAssignMemoryRegion(OckRpcServer server, uintptr_t address, uint64_t size, OckRpcMemoryRegion *mr);
int OckRpcGetMemoryRegionInfo(OckRpcMemoryRegion mr, OckRpcMemoryRegionInfo *info);
void OckRpcDestroyMemoryRegion(OckRpcServer server, OckRpcMemoryRegion mr);

/* One-sided I/O. */
#pragma pack(push, 1)
typedef struct {
    uintptr_t lAddress;
    uintptr_t rAddress;
    uint32_t lKey;
    uint32_t rKey;
    uint32_t size;
} OckRpcRequest;

typedef struct {
    OckRpcRequest *iov;
    uint16_t iovCount;
} OckRpcSglRequest;
#pragma pack(pop)

int OckRpcRead(OckRpcClient client, OckRpcRequest *req, OckRpcCallDone *cb);
int OckRpcReadSgl(OckRpcClient client, OckRpcSglRequest *req, OckRpcCallDone *cb);
int OckRpcWrite(OckRpcClient client, OckRpcRequest *req, OckRpcCallDone *cb);
int OckRpcWriteSgl(OckRpcClient client, OckRpcSglRequest *req, OckRpcCallDone *cb);

/* Milliseconds; < 0: never; 0: immediate. Per client. Default -1. */
void OckRpcClientSetTimeout(OckRpcClient client, int64_t timeout);

/* The memory allocator. */
typedef enum {
    MEM_TIER_TIMES = 0,
    MEM_TIER_POWER = 1
} OckRpcMemoryAllocatorCacheTierPolicy;

typedef enum {
    MEM_DYNAMIC_SIZE = 0,
    MEM_DYNAMIC_SIZE_WITH_CACHE = 1
} OckRpcMemoryAllocatorType;

typedef struct {
    uintptr_t address;
    uint64_t size;
    uint32_t minBlockSize;
    uint32_t bucketCount;
    uint16_t alignedAddress;
    uint16_t cacheTierCount;
    uint16_t cacheBlockCountPerTier;
    OckRpcMemoryAllocatorCacheTierPolicy cacheTierPolicy;
} OckRpcMemoryAllocatorOptions;

typedef uintptr_t OckRpcMemoryAllocator;

int OckRpcMemoryAllocatorCreate(
    OckRpcMemoryAllocatorType t, OckRpcMemoryAllocatorOptions *options, OckRpcMemoryAllocator *allocator);
int OckRpcMemoryAllocatorDestroy(OckRpcMemoryAllocator allocator);
int OckRpcMemoryAllocatorSetMrKey(OckRpcMemoryAllocator allocator, uint32_t mrKey);
int OckRpcMemoryAllocatorMemOffset(OckRpcMemoryAllocator allocator, uintptr_t address, uintptr_t *offset);
int OckRpcMemoryAllocatorFreeSize(OckRpcMemoryAllocator allocator, uintptr_t *size);
int OckRpcMemoryAllocatorAllocate(OckRpcMemoryAllocator allocator, uint64_t size, uintptr_t *address, uint32_t *key);
int OckRpcMemoryAllocatorFree(OckRpcMemoryAllocator allocator, uintptr_t address);

/* Deprecated: a no-op. */
void OckRpcDisableSecureHmac(void);

#ifdef __cplusplus
}
#endif

#endif /* HCOM_HCOM4DB_H */
