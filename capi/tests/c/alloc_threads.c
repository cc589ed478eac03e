/* The memory allocator from several C threads at once: each thread allocates blocks of seeded
 * random sizes, fills each with its own pattern, checks the pattern is intact before freeing it
 * (a block handed to two threads would be overwritten by the other), and frees everything; then
 * the free size must be the whole range again. */
#include "hcom4db.h"
#include "mem_check.h"

#include <pthread.h>
#include <string.h>

#define THREADS 4
#define ROUNDS 5000
#define LIVE 32
#define SIZE (8u << 20)

static OckRpcMemoryAllocator allocator;

struct block {
    uintptr_t addr;
    uint64_t len;
    unsigned char fill;
};

static uint64_t next_rand(uint64_t *s) {
    /* xorshift64*: deterministic per seed. */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void check_block(const struct block *b) {
    const unsigned char *p = (const unsigned char *)b->addr;
    for (uint64_t i = 0; i < b->len; i += 61) {
        CHECK(p[i] == b->fill);
    }
    CHECK(p[b->len - 1] == b->fill);
}

static void *worker(void *arg) {
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uintptr_t)arg + 1;
    struct block live[LIVE];
    unsigned n = 0;
    for (unsigned r = 0; r < ROUNDS; r++) {
        if (n == 0 || (n < LIVE && next_rand(&seed) % 3 != 0)) {
            uint64_t len = 1 + next_rand(&seed) % (next_rand(&seed) % 8 == 0 ? 65536 : 2048);
            uintptr_t addr = 0;
            uint32_t key = 0;
            int rc = OckRpcMemoryAllocatorAllocate(allocator, len, &addr, &key);
            if (rc == OCK_RPC_ERR_NO_MEMORY) {
                continue;
            }
            CHECK_RC(rc, OCK_RPC_OK);
            CHECK(key == 42);
            live[n].addr = addr;
            live[n].len = len;
            live[n].fill = (unsigned char)next_rand(&seed);
            memset((void *)addr, live[n].fill, len);
            n++;
        } else {
            unsigned i = (unsigned)(next_rand(&seed) % n);
            check_block(&live[i]);
            CHECK_RC(OckRpcMemoryAllocatorFree(allocator, live[i].addr), OCK_RPC_OK);
            live[i] = live[--n];
        }
    }
    while (n > 0) {
        check_block(&live[n - 1]);
        CHECK_RC(OckRpcMemoryAllocatorFree(allocator, live[--n].addr), OCK_RPC_OK);
    }
    return NULL;
}

static void run(OckRpcMemoryAllocatorType type, void *base) {
    OckRpcMemoryAllocatorOptions o;
    memset(&o, 0, sizeof o);
    o.address = (uintptr_t)base;
    o.size = SIZE;
    o.minBlockSize = 64;
    o.bucketCount = 256;
    o.alignedAddress = 1;
    o.cacheTierCount = 8;
    o.cacheBlockCountPerTier = 8;
    o.cacheTierPolicy = MEM_TIER_TIMES;
    CHECK_RC(OckRpcMemoryAllocatorCreate(type, &o, &allocator), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorSetMrKey(allocator, 42), OCK_RPC_OK);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++) {
        CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + 1)) == 0);
    }
    for (unsigned i = 0; i < THREADS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    uintptr_t free_size = 0;
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(allocator, &free_size), OCK_RPC_OK);
    CHECK(free_size == SIZE);
    CHECK_RC(OckRpcMemoryAllocatorDestroy(allocator), OCK_RPC_OK);
}

int main(void) {
    void *base = aligned_alloc(4096, SIZE);
    CHECK(base != NULL);
    run(MEM_DYNAMIC_SIZE, base);
    run(MEM_DYNAMIC_SIZE_WITH_CACHE, base);
    free(base);
    printf("alloc_threads: ok\n");
    return 0;
}
