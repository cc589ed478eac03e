/* hcom4db.h - interim header of bypass's libhcom4db.so: the status codes, handle types, memory
 * regions, one-sided I/O and the memory allocator only. The full header (every OckRpc* declaration) comes with the C API's
 * foundation on branch wip-capi and replaces this file. Compiles standalone in C11 and C++17. */
#ifndef HCOM4DB_H
#define HCOM4DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
    OCK_RPC_ERR_INVALID_RKEY = -22,
} OckRpcStatus;

typedef uintptr_t OckRpcServer;
typedef uintptr_t OckRpcClient;

typedef void (*OckRpcDoneCallback)(OckRpcStatus status, void *arg);

/* Completion of an asynchronous call: cb(status, arg) runs exactly once. */
typedef struct {
    OckRpcDoneCallback cb;
    void *arg;
} OckRpcCallDone;

/* ---- memory regions ---- */

typedef uintptr_t OckRpcMemoryRegion;

typedef struct {
    uintptr_t lAddress; /* first byte, in this process */
    uint32_t lKey;      /* the key: lKey of local requests, rKey of the peer's */
    uint32_t size;
} OckRpcMemoryRegionInfo;

int OckRpcRegisterMemoryRegion(OckRpcServer server, uint64_t size, OckRpcMemoryRegion *mr);
int OckRpcRegisterAssignMemoryRegion(OckRpcServer server, uintptr_t address, uint64_t size, OckRpcMemoryRegion *mr);
int OckRpcGetMemoryRegionInfo(OckRpcMemoryRegion mr, OckRpcMemoryRegionInfo *info);
void OckRpcDestroyMemoryRegion(OckRpcServer server, OckRpcMemoryRegion mr);

/* ---- one-sided I/O ---- */

typedef struct {
    uintptr_t lAddress;
    uintptr_t rAddress;
    uint32_t lKey;
    uint32_t rKey;
    uint32_t size;
} __attribute__((packed)) OckRpcRequest;

typedef struct {
    OckRpcRequest *iov;
    uint16_t iovCount;
} __attribute__((packed)) OckRpcSglRequest;

int OckRpcRead(OckRpcClient client, OckRpcRequest *req, OckRpcCallDone *cb);
int OckRpcReadSgl(OckRpcClient client, OckRpcSglRequest *req, OckRpcCallDone *cb);
int OckRpcWrite(OckRpcClient client, OckRpcRequest *req, OckRpcCallDone *cb);
int OckRpcWriteSgl(OckRpcClient client, OckRpcSglRequest *req, OckRpcCallDone *cb);

/* ---- the memory allocator ---- */

/* Cache tier policy of a MEM_DYNAMIC_SIZE_WITH_CACHE allocator. */
typedef enum {
    MEM_TIER_TIMES = 0, /* tier i holds blocks of (i + 1) * minBlockSize bytes */
    MEM_TIER_POWER = 1, /* tier i holds blocks of 2^i * minBlockSize bytes */
} OckRpcMemoryAllocatorCacheTierPolicy;

typedef enum {
    MEM_DYNAMIC_SIZE = 0,
    MEM_DYNAMIC_SIZE_WITH_CACHE = 1,
} OckRpcMemoryAllocatorType;

typedef struct {
    uintptr_t address;              /* first byte of the managed range */
    uint64_t size;                  /* its length */
    uint32_t minBlockSize;          /* allocation unit; 0: 4096 */
    uint32_t bucketCount;           /* buckets of the address table; 0: 1024 */
    uint16_t alignedAddress;        /* non-zero: blocks aligned to minBlockSize */
    uint16_t cacheTierCount;        /* WITH_CACHE: tiers (at most 64); 0: 8 */
    uint16_t cacheBlockCountPerTier; /* WITH_CACHE: blocks kept per tier; 0: 16 */
    OckRpcMemoryAllocatorCacheTierPolicy cacheTierPolicy;
} OckRpcMemoryAllocatorOptions;

typedef uintptr_t OckRpcMemoryAllocator;

int OckRpcMemoryAllocatorCreate(OckRpcMemoryAllocatorType t, OckRpcMemoryAllocatorOptions *options,
                                OckRpcMemoryAllocator *allocator);
int OckRpcMemoryAllocatorDestroy(OckRpcMemoryAllocator allocator);
int OckRpcMemoryAllocatorSetMrKey(OckRpcMemoryAllocator allocator, uint32_t mrKey);
int OckRpcMemoryAllocatorMemOffset(OckRpcMemoryAllocator allocator, uintptr_t address, uintptr_t *offset);
int OckRpcMemoryAllocatorFreeSize(OckRpcMemoryAllocator allocator, uintptr_t *size);
int OckRpcMemoryAllocatorAllocate(OckRpcMemoryAllocator allocator, uint64_t size, uintptr_t *address,
                                  uint32_t *key);
int OckRpcMemoryAllocatorFree(OckRpcMemoryAllocator allocator, uintptr_t address);

#ifdef __cplusplus
}
#endif

#endif
