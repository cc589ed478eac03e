/* Loads the library as CBB does: dlopen $OCK_RPC_LIB_PATH/libhcom4db.so and resolve the 14
 * symbols it refuses to start without (plus libcomm's Hcom4dbSetLogFunc). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    static const char *const names[] = {
        "OckRpcServerCtxBuilderThreadLocal", "OckRpcServerCtxCleanupThreadLocal", "OckRpcServerCreateWithCfg",
        "OckRpcServerAddService", "OckRpcServerStart", "OckRpcServerDestroy", "OckRpcServerReply",
        "OckRpcServerCleanupCtx", "OckRpcClientConnectWithCfg", "OckRpcClientDisconnect", "OckRpcClientCall",
        "OckRpcClientCallWithParam", "OckRpcClientSetTimeout", "OckRpcDisableSecureHmac", "Hcom4dbSetLogFunc",
    };
    const char *dir = getenv("OCK_RPC_LIB_PATH");
    if (dir == NULL) {
        fprintf(stderr, "OCK_RPC_LIB_PATH is not set\n");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/libhcom4db.so", dir);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (dlsym(lib, names[i]) == NULL) {
            fprintf(stderr, "missing symbol %s\n", names[i]);
            return 1;
        }
    }
    if (dlsym(lib, "OckRpcNoSuchFunction") != NULL) {
        fprintf(stderr, "a symbol that does not exist resolved\n");
        return 1;
    }
    /* Call two of them as a smoke test: the deprecated functions are harmless. */
    void (*disable)(void);
    *(void **)(&disable) = dlsym(lib, "OckRpcDisableSecureHmac");
    disable();
    printf("dlopen ok: %zu symbols\n", sizeof(names) / sizeof(names[0]));
    dlclose(lib);
    return 0;
}
