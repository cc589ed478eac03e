/* The layouts of the memory structs, as callers compiled against the reference header see them
 * (x86_64), and the memory functions' answers to handles that name nothing: no server, no
 * client, garbage, NULL. */
#include "hcom4db.h"
#include "mem_check.h"

#include <stddef.h>

_Static_assert(sizeof(OckRpcMemoryRegionInfo) == 16, "OckRpcMemoryRegionInfo is 16 bytes");
_Static_assert(offsetof(OckRpcMemoryRegionInfo, lKey) == 8, "lKey at 8");
_Static_assert(offsetof(OckRpcMemoryRegionInfo, size) == 12, "size at 12");
_Static_assert(sizeof(OckRpcRequest) == 28, "OckRpcRequest is packed, 28 bytes");
_Static_assert(offsetof(OckRpcRequest, rAddress) == 8, "rAddress at 8");
_Static_assert(offsetof(OckRpcRequest, lKey) == 16, "lKey at 16");
_Static_assert(offsetof(OckRpcRequest, rKey) == 20, "rKey at 20");
_Static_assert(offsetof(OckRpcRequest, size) == 24, "size at 24");
_Static_assert(sizeof(OckRpcSglRequest) == 10, "OckRpcSglRequest is packed, 10 bytes");
_Static_assert(offsetof(OckRpcSglRequest, iovCount) == 8, "iovCount at 8");
_Static_assert(sizeof(OckRpcMemoryAllocatorOptions) == 40, "OckRpcMemoryAllocatorOptions is 40 bytes");
_Static_assert(offsetof(OckRpcMemoryAllocatorOptions, minBlockSize) == 16, "minBlockSize at 16");
_Static_assert(offsetof(OckRpcMemoryAllocatorOptions, bucketCount) == 20, "bucketCount at 20");
_Static_assert(offsetof(OckRpcMemoryAllocatorOptions, alignedAddress) == 24, "alignedAddress at 24");
_Static_assert(offsetof(OckRpcMemoryAllocatorOptions, cacheTierCount) == 26, "cacheTierCount at 26");
_Static_assert(offsetof(OckRpcMemoryAllocatorOptions, cacheBlockCountPerTier) == 28, "per tier at 28");
_Static_assert(offsetof(OckRpcMemoryAllocatorOptions, cacheTierPolicy) == 32, "policy at 32");
_Static_assert(sizeof(OckRpcCallDone) == 16, "OckRpcCallDone is 16 bytes");

int main(void) {
    const uintptr_t handles[] = {0, 1, 42, 0xdeadbeef, UINTPTR_MAX};
    unsigned char buf[256];
    OckRpcMemoryRegion mr = 7;
    OckRpcMemoryRegionInfo info;
    OckRpcRequest req = {(uintptr_t)buf, (uintptr_t)buf, 1, 1, 16};
    OckRpcSglRequest sgl = {&req, 1};
    OckRpcCallDone done = {NULL, NULL};
    for (unsigned i = 0; i < sizeof handles / sizeof handles[0]; i++) {
        uintptr_t h = handles[i];
        CHECK_FAILS(OckRpcRegisterMemoryRegion(h, 4096, &mr));
        CHECK_FAILS(OckRpcRegisterAssignMemoryRegion(h, (uintptr_t)buf, sizeof buf, &mr));
        CHECK(mr == 7);
        CHECK_FAILS(OckRpcGetMemoryRegionInfo(h, &info));
        OckRpcDestroyMemoryRegion(h, h); /* harmless */
        CHECK_RC(OckRpcRead(h, &req, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_RC(OckRpcWrite(h, &req, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_RC(OckRpcReadSgl(h, &sgl, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_RC(OckRpcWriteSgl(h, &sgl, NULL), OCK_RPC_ERR_INVALID_PARAM);
        CHECK_FAILS(OckRpcRead(h, NULL, NULL));
        CHECK_FAILS(OckRpcWriteSgl(h, NULL, NULL));
        CHECK_FAILS(OckRpcWrite(h, &req, &done)); /* cb->cb NULL */
    }
    printf("mem_layout: ok\n");
    return 0;
}
