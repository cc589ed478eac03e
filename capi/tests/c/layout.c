/* Sizes and offsets of every struct hcom4db.md lists (x86_64). */
#include <stddef.h>
#include "util.h"

int main(void)
{
    CHECK_EQ(sizeof(OckRpcServer), 8);
    CHECK_EQ(sizeof(OckRpcMessage), 16);
    CHECK_EQ(offsetof(OckRpcMessage, len), 8);
    CHECK_EQ(sizeof(OckRpcMessageIov), 16);
    CHECK_EQ(sizeof(OckRpcMessageInfo), 16);
    CHECK_EQ(offsetof(OckRpcMessageInfo, lKey), 8);
    CHECK_EQ(offsetof(OckRpcMessageInfo, size), 12);
    CHECK_EQ(sizeof(OckRpcMessageInfoIov), 16);
    CHECK_EQ(sizeof(OckRpcRndvMessage), 72);
    CHECK_EQ(offsetof(OckRpcRndvMessage, msg), 8);
    CHECK_EQ(sizeof(OckRpcService), 16);
    CHECK_EQ(offsetof(OckRpcService, handler), 8);
    CHECK_EQ(sizeof(OckRpcRndvService), 16);
    CHECK_EQ(sizeof(OckRpcCallDone), 16);
    CHECK_EQ(offsetof(OckRpcCallDone, arg), 8);
    CHECK_EQ(sizeof(RpcConfigPair), 16);
    CHECK_EQ(sizeof(RpcConfigs), 16);
    CHECK_EQ(offsetof(RpcConfigs, pairs), 8);
    CHECK_EQ(sizeof(OckRpcCreateConfig), 64);
    CHECK_EQ(offsetof(OckRpcCreateConfig, mask), 0);
    CHECK_EQ(offsetof(OckRpcCreateConfig, configs), 8);
    CHECK_EQ(offsetof(OckRpcCreateConfig, serverCtxbuilder), 24);
    CHECK_EQ(offsetof(OckRpcCreateConfig, serverCtxCleanup), 32);
    CHECK_EQ(offsetof(OckRpcCreateConfig, getCaAndVerify), 40);
    CHECK_EQ(offsetof(OckRpcCreateConfig, getCert), 48);
    CHECK_EQ(offsetof(OckRpcCreateConfig, getPriKey), 56);
    CHECK_EQ(sizeof(OckRpcClientCallParams), 72);
    CHECK_EQ(offsetof(OckRpcClientCallParams, mask), 0);
    CHECK_EQ(offsetof(OckRpcClientCallParams, client), 8);
    CHECK_EQ(offsetof(OckRpcClientCallParams, context), 16);
    CHECK_EQ(offsetof(OckRpcClientCallParams, msgId), 24);
    CHECK_EQ(offsetof(OckRpcClientCallParams, reqIov), 32);
    CHECK_EQ(offsetof(OckRpcClientCallParams, rspIov), 48);
    CHECK_EQ(offsetof(OckRpcClientCallParams, done), 64);
    CHECK_EQ(sizeof(OckRpcMemoryRegionInfo), 16);
    CHECK_EQ(sizeof(OckRpcRequest), 28);
    CHECK_EQ(offsetof(OckRpcRequest, rAddress), 8);
    CHECK_EQ(offsetof(OckRpcRequest, lKey), 16);
    CHECK_EQ(offsetof(OckRpcRequest, rKey), 20);
    CHECK_EQ(offsetof(OckRpcRequest, size), 24);
    CHECK_EQ(sizeof(OckRpcSglRequest), 10);
    CHECK_EQ(offsetof(OckRpcSglRequest, iovCount), 8);
    CHECK_EQ(sizeof(OckRpcMemoryAllocatorOptions), 40);
    CHECK_EQ(offsetof(OckRpcMemoryAllocatorOptions, cacheTierPolicy), 32);
    CHECK_EQ(sizeof(OckRpcStatus), 4);
    CHECK_EQ(OCK_RPC_ERR_INVALID_RKEY, -22);
    CHECK_EQ(OCK_RPC_CONFIG_USE_SSL_CALLBACK, OCK_RPC_BIT(2));
    printf("layout ok\n");
    return 0;
}
