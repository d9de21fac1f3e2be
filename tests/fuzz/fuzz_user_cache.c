/* Shared-memory user-cache records, as another process of the same user may leave them: a
 * table of valid records is patched (input: u32 offset into the buckets, then the bytes
 * written there; the bucket mutexes are left alone, the header too: attach validates it)
 * and every user it may hold is read back. A hit must be within the table's bounds and its
 * slot lengths must add up to its ids; anything else must read as a miss or an error. */
#include <stdatomic.h>
#include <string.h>

#include "ucache/user_cache.h"
#include "fuzz.h"

#define SLOTS 3
#define MAX_IDS 16
#define MAX_DENSE 4
#define USERS 24

static flame_user_cache *cache;
static unsigned char *pristine;
static size_t region; /* bytes after the header */

static void unlink_table(void)
{
    char name[64];
    snprintf(name, sizeof name, "/flame-fuzz-uc-%d", (int)getpid());
    flame_user_cache_unlink(name);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char name[64];
    snprintf(name, sizeof name, "/flame-fuzz-uc-%d", (int)getpid());
    flame_user_cache_unlink(name);
    flame_user_cache_params p = {.struct_size = sizeof p, .capacity = 16, .num_slots = SLOTS, .max_ids = MAX_IDS,
                                 .max_dense = MAX_DENSE};
    if (flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &cache)) abort();
    atexit(unlink_table);
    for (int64_t u = 0; u < USERS; u++) {
        int64_t ids[MAX_IDS];
        uint32_t lens[SLOTS] = {(uint32_t)(u % 5), (uint32_t)(u % 3), (uint32_t)(u % 7)};
        float dense[MAX_DENSE] = {1, 2, 3, 4};
        for (int i = 0; i < MAX_IDS; i++) ids[i] = u * 100 + i;
        flame_user_features f = {.struct_size = sizeof f, .ids = ids, .num_ids = lens[0] + lens[1] + lens[2],
                                 .slot_lens = lens, .dense = dense, .num_dense = (size_t)(u % 5)};
        if (flame_user_cache_put(cache, u, &f)) abort();
    }
    region = cache->bytes - FL_UC_HEADER_BYTES;
    pristine = malloc(region);
    memcpy(pristine, cache->base + FL_UC_HEADER_BYTES, region);
    return 0;
}

static void read_user(int64_t u)
{
    int64_t ids[MAX_IDS];
    uint32_t lens[SLOTS];
    float dense[MAX_DENSE];
    flame_user_features f = {.struct_size = sizeof f, .ids = ids, .slot_lens = lens, .dense = dense,
                             .ids_capacity = MAX_IDS, .dense_capacity = MAX_DENSE};
    int32_t found = -1;
    flame_status st = flame_user_cache_get(cache, u, &f, &found);
    FZ_CHECK_ERROR(st);
    if (st != FLAME_OK || !found) return;
    FZ_ASSERT(f.num_ids <= MAX_IDS && f.num_dense <= MAX_DENSE, "user %lld: %zu ids, %zu dense", (long long)u,
              f.num_ids, f.num_dense);
    /* a read validates what it returns: slot lengths that do not add up are a miss */
    uint64_t sum = 0;
    for (int s = 0; s < SLOTS; s++) sum += lens[s];
    FZ_ASSERT(sum == f.num_ids, "user %lld: slot lengths sum to %llu, the record has %zu ids", (long long)u,
              (unsigned long long)sum, f.num_ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    unsigned char *buckets = cache->base + FL_UC_HEADER_BYTES;
    memcpy(buckets, pristine, region);
    uint32_t at;
    memcpy(&at, data, 4);
    size_t bucket_bytes = cache->hdr->bucket_bytes;
    for (size_t i = 4, off = at % region; i < size && off < region; i++, off++) {
        if (off % bucket_bytes < sizeof(pthread_mutex_t)) off += sizeof(pthread_mutex_t) - off % bucket_bytes;
        if (off >= region) break;
        buckets[off] = data[i];
    }
    for (int64_t u = 0; u < USERS + 2; u++) read_user(u);
    for (uint64_t b = 0; b < cache->hdr->num_buckets; b++)
        for (unsigned w = 0; w < FL_UC_WAYS; w++) read_user(atomic_load(&fl_uc_bucket_at(cache, b)->hint[w]));
    return 0;
}
