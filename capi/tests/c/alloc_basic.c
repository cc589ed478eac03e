/* The memory allocator from C, one thread: every OckRpcMemoryAllocator* function, both policies,
 * exact offsets and free sizes, and the bad inputs that must return errors. The managed range is
 * plain heap memory here (the allocator never reads or writes it); onesided_*.c run it over a
 * registered region. */
#include "hcom4db.h"
#include "mem_check.h"

#include <string.h>

#define UNIT 4096u
#define UNITS 64u

static OckRpcMemoryAllocatorOptions options_over(void *base, uint64_t size) {
    OckRpcMemoryAllocatorOptions o;
    memset(&o, 0, sizeof o);
    o.address = (uintptr_t)base;
    o.size = size;
    o.minBlockSize = UNIT;
    o.bucketCount = 128;
    o.alignedAddress = 1;
    o.cacheTierCount = 4;
    o.cacheBlockCountPerTier = 2;
    o.cacheTierPolicy = MEM_TIER_POWER;
    return o;
}

static void exercise(OckRpcMemoryAllocatorType type, unsigned char *base) {
    OckRpcMemoryAllocatorOptions o = options_over(base, (uint64_t)UNIT * UNITS);
    OckRpcMemoryAllocator a = 0;
    CHECK_RC(OckRpcMemoryAllocatorCreate(type, &o, &a), OCK_RPC_OK);
    CHECK(a != 0);

    uintptr_t free_size = 0;
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(a, &free_size), OCK_RPC_OK);
    CHECK(free_size == (uintptr_t)UNIT * UNITS);

    /* Before SetMrKey the key is 0; after it, every block carries the key. */
    uintptr_t x = 0;
    uint32_t key = 77;
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, 100, &x, &key), OCK_RPC_OK);
    CHECK(key == 0);
    CHECK_RC(OckRpcMemoryAllocatorFree(a, x), OCK_RPC_OK);
    CHECK_RC(OckRpcMemoryAllocatorSetMrKey(a, 0xabcd1234u), OCK_RPC_OK);

    uintptr_t b1 = 0, b2 = 0;
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, 1, &b1, &key), OCK_RPC_OK);
    CHECK(key == 0xabcd1234u);
    CHECK(b1 >= (uintptr_t)base && b1 + 1 <= (uintptr_t)base + (uintptr_t)UNIT * UNITS);
    CHECK(b1 % UNIT == 0);
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, 3 * UNIT + 1, &b2, &key), OCK_RPC_OK);
    CHECK(b2 % UNIT == 0);
    CHECK(b2 >= b1 + UNIT || b2 + 4 * UNIT <= b1);
    /* The memory is the caller's to use. */
    memset((void *)b1, 0x11, 1);
    memset((void *)b2, 0x22, 3 * UNIT + 1);

    /* One unit for b1; b2 rounds up to 4 units (the POWER tier of 4 when cached). */
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(a, &free_size), OCK_RPC_OK);
    CHECK(free_size == (uintptr_t)UNIT * (UNITS - 5));

    uintptr_t off = 1;
    CHECK_RC(OckRpcMemoryAllocatorMemOffset(a, b2, &off), OCK_RPC_OK);
    CHECK(off == b2 - (uintptr_t)base);
    CHECK_RC(OckRpcMemoryAllocatorMemOffset(a, (uintptr_t)base + 17, &off), OCK_RPC_OK);
    CHECK(off == 17);
    CHECK_FAILS(OckRpcMemoryAllocatorMemOffset(a, (uintptr_t)base - 1, &off));
    CHECK_FAILS(OckRpcMemoryAllocatorMemOffset(a, (uintptr_t)base + (uintptr_t)UNIT * UNITS, &off));
    CHECK_FAILS(OckRpcMemoryAllocatorMemOffset(a, b2, NULL));

    /* Bad frees: inside a block, unaligned, never allocated, outside, twice. */
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, b2 + UNIT));
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, b2 + 1));
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, (uintptr_t)base + (uintptr_t)UNIT * (UNITS - 1)));
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, 0));
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, (uintptr_t)base + (uintptr_t)UNIT * UNITS));
    CHECK_RC(OckRpcMemoryAllocatorFree(a, b2), OCK_RPC_OK);
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, b2));
    CHECK_RC(OckRpcMemoryAllocatorFree(a, b1), OCK_RPC_OK);
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, b1));
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(a, &free_size), OCK_RPC_OK);
    CHECK(free_size == (uintptr_t)UNIT * UNITS);

    /* Bad allocations: zero bytes, more than the range, NULL outputs. */
    CHECK_FAILS(OckRpcMemoryAllocatorAllocate(a, 0, &x, &key));
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, (uint64_t)UNIT * UNITS + 1, &x, &key), OCK_RPC_ERR_NO_MEMORY);
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, UINT64_MAX, &x, &key), OCK_RPC_ERR_NO_MEMORY);
    CHECK_FAILS(OckRpcMemoryAllocatorAllocate(a, 64, NULL, &key));
    CHECK_FAILS(OckRpcMemoryAllocatorAllocate(a, 64, &x, NULL));
    CHECK_FAILS(OckRpcMemoryAllocatorFreeSize(a, NULL));

    /* Exhaustion, then everything back: the blocks coalesce into the whole range again. */
    uintptr_t blocks[UNITS];
    for (unsigned i = 0; i < UNITS; i++) {
        CHECK_RC(OckRpcMemoryAllocatorAllocate(a, UNIT, &blocks[i], &key), OCK_RPC_OK);
    }
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, 1, &x, &key), OCK_RPC_ERR_NO_MEMORY);
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(a, &free_size), OCK_RPC_OK);
    CHECK(free_size == 0);
    /* In address order (cached blocks come back first, so allocation order is not it), free
     * every other block: half the range is free but no two units are contiguous. */
    for (unsigned i = 1; i < UNITS; i++) {
        for (unsigned j = i; j > 0 && blocks[j - 1] > blocks[j]; j--) {
            uintptr_t t = blocks[j];
            blocks[j] = blocks[j - 1];
            blocks[j - 1] = t;
        }
    }
    for (unsigned i = 0; i < UNITS; i++) {
        CHECK(blocks[i] == (uintptr_t)base + (uintptr_t)i * UNIT);
    }
    for (unsigned i = 0; i < UNITS; i += 2) {
        CHECK_RC(OckRpcMemoryAllocatorFree(a, blocks[i]), OCK_RPC_OK);
    }
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, 2 * UNIT, &x, &key), OCK_RPC_ERR_NO_MEMORY);
    for (unsigned i = 1; i < UNITS; i += 2) {
        CHECK_RC(OckRpcMemoryAllocatorFree(a, blocks[i]), OCK_RPC_OK);
    }
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, (uint64_t)UNIT * UNITS, &x, &key), OCK_RPC_OK);
    CHECK(x == (uintptr_t)base);
    CHECK_RC(OckRpcMemoryAllocatorFree(a, x), OCK_RPC_OK);

    /* Destroy, then the handle is dead for every function. */
    CHECK_RC(OckRpcMemoryAllocatorDestroy(a), OCK_RPC_OK);
    CHECK_FAILS(OckRpcMemoryAllocatorDestroy(a));
    CHECK_FAILS(OckRpcMemoryAllocatorAllocate(a, 64, &x, &key));
    CHECK_FAILS(OckRpcMemoryAllocatorFree(a, (uintptr_t)base));
    CHECK_FAILS(OckRpcMemoryAllocatorFreeSize(a, &free_size));
    CHECK_FAILS(OckRpcMemoryAllocatorMemOffset(a, (uintptr_t)base, &off));
    CHECK_FAILS(OckRpcMemoryAllocatorSetMrKey(a, 1));
}

static void bad_creation(unsigned char *base) {
    OckRpcMemoryAllocatorOptions o = options_over(base, (uint64_t)UNIT * UNITS);
    OckRpcMemoryAllocator a = 12345;
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, NULL, &a));
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, &o, NULL));
    CHECK_FAILS(OckRpcMemoryAllocatorCreate((OckRpcMemoryAllocatorType)7, &o, &a));
    CHECK_FAILS(OckRpcMemoryAllocatorCreate((OckRpcMemoryAllocatorType)-1, &o, &a));
    o.cacheTierPolicy = (OckRpcMemoryAllocatorCacheTierPolicy)9;
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE_WITH_CACHE, &o, &a));
    o = options_over(base, 0);
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, &o, &a));
    o = options_over(NULL, 4096);
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, &o, &a));
    o = options_over((void *)(UINTPTR_MAX - 100), 4096);
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, &o, &a));
    o = options_over(base, UNIT - 1); /* smaller than one block */
    CHECK_FAILS(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE, &o, &a));
    CHECK(a == 12345); /* a failed create leaves the output alone */

    /* Handles that were never created. */
    uintptr_t x, size;
    uint32_t key;
    const OckRpcMemoryAllocator garbage[] = {0, 1, 0xdeadbeef, UINTPTR_MAX, (uintptr_t)&o};
    for (unsigned i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        CHECK_FAILS(OckRpcMemoryAllocatorDestroy(garbage[i]));
        CHECK_FAILS(OckRpcMemoryAllocatorSetMrKey(garbage[i], 1));
        CHECK_FAILS(OckRpcMemoryAllocatorAllocate(garbage[i], 64, &x, &key));
        CHECK_FAILS(OckRpcMemoryAllocatorFree(garbage[i], (uintptr_t)base));
        CHECK_FAILS(OckRpcMemoryAllocatorFreeSize(garbage[i], &size));
        CHECK_FAILS(OckRpcMemoryAllocatorMemOffset(garbage[i], (uintptr_t)base, &size));
    }
}

/* Defaults: minBlockSize 0 means 4096, unaligned start kept when alignedAddress is 0. */
static void defaults(unsigned char *base) {
    OckRpcMemoryAllocatorOptions o;
    memset(&o, 0, sizeof o);
    o.address = (uintptr_t)base + 8;
    o.size = 4 * 4096;
    OckRpcMemoryAllocator a = 0;
    CHECK_RC(OckRpcMemoryAllocatorCreate(MEM_DYNAMIC_SIZE_WITH_CACHE, &o, &a), OCK_RPC_OK);
    uintptr_t x = 0, size = 0;
    uint32_t key;
    CHECK_RC(OckRpcMemoryAllocatorAllocate(a, 10, &x, &key), OCK_RPC_OK);
    CHECK(x == (uintptr_t)base + 8);
    CHECK_RC(OckRpcMemoryAllocatorFreeSize(a, &size), OCK_RPC_OK);
    CHECK(size == 3 * 4096);
    CHECK_RC(OckRpcMemoryAllocatorDestroy(a), OCK_RPC_OK);
}

int main(void) {
    unsigned char *base = aligned_alloc(UNIT, (size_t)UNIT * UNITS + UNIT);
    CHECK(base != NULL);
    exercise(MEM_DYNAMIC_SIZE, base);
    exercise(MEM_DYNAMIC_SIZE_WITH_CACHE, base);
    bad_creation(base);
    defaults(base);
    free(base);
    printf("alloc_basic: ok\n");
    return 0;
}
