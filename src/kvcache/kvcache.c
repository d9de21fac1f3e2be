/* The KV cache's bookkeeping (kvcache.h): a hash map of users, an LRU list, a free list of
 * block indices, one mutex and one condition variable (writers publishing or aborting wake the
 * calls waiting for their user). Lookups are rare next to the forward pass they save (one per
 * request), so one lock costs nothing measurable. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "kvcache/kvcache.h"

struct fl_kv_entry {
    int64_t user;
    uint64_t version, hash; /* published */
    int32_t tokens;         /* published rows */
    int32_t pub_blocks;     /* blocks holding published rows */
    int32_t nblocks;        /* blocks held (published + reserved by the writer) */
    int32_t pins;
    bool writing, dead;     /* dead: unlinked, freed at its last release */
    fl_kv_entry *hnext, *lprev, *lnext; /* hash chain; LRU list (lprev toward the most recent) */
    int32_t blocks[];       /* [max_blocks] */
};

struct fl_kv_cache {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fl_kv_params p;
    int32_t num_blocks, max_blocks;
    uint64_t block_bytes;
    int32_t *free_blocks; /* stack of free block indices */
    int32_t nfree;
    fl_kv_entry **buckets;
    size_t nbuckets, nentries;
    fl_kv_entry *lru_head, *lru_tail; /* head = most recently used */
    fl_kv_stats st;
};

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

flame_status fl_kv_cache_create(const fl_kv_params *p, fl_kv_cache **out)
{
    *out = NULL;
    if (p->block_tokens < 1) return fl_error(FLAME_ERR_INVALID_ARG, "KV cache block_tokens = %d, must be >= 1", p->block_tokens);
    if (p->token_bytes == 0 || p->max_tokens < 1)
        return fl_error(FLAME_ERR_INVALID_ARG, "KV cache token_bytes = %llu, max_tokens = %d: both must be >= 1",
                        (unsigned long long)p->token_bytes, p->max_tokens);
    uint64_t block_bytes;
    if (!fl_mul_u64(p->token_bytes, (uint64_t)p->block_tokens, &block_bytes))
        return fl_error(FLAME_ERR_INVALID_ARG, "KV cache block of %d tokens overflows", p->block_tokens);
    uint64_t nb = p->budget_bytes / block_bytes;
    if (nb == 0)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "KV cache budget of %llu bytes holds no block of %d tokens (%llu bytes a block)",
                        (unsigned long long)p->budget_bytes, p->block_tokens, (unsigned long long)block_bytes);
    if (nb > INT32_MAX) /* block indices are 32-bit: a larger budget would be silently capped */
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "KV cache budget of %llu bytes is %llu blocks of %d tokens, more than 2^31 - 1: give larger "
                        "blocks or a smaller budget",
                        (unsigned long long)p->budget_bytes, (unsigned long long)nb, p->block_tokens);
    fl_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating the KV cache");
    c->p = *p;
    c->num_blocks = (int32_t)nb;
    c->block_bytes = block_bytes;
    c->max_blocks = (p->max_tokens + p->block_tokens - 1) / p->block_tokens;
    c->free_blocks = malloc((size_t)nb * sizeof *c->free_blocks);
    c->nbuckets = 64;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->free_blocks || !c->buckets || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->free_blocks);
        free(c->buckets);
        free(c);
        return fl_error(FLAME_ERR_NOMEM, "out of memory allocating the KV cache's %llu block indices",
                        (unsigned long long)nb);
    }
    if (pthread_cond_init(&c->cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(c->free_blocks);
        free(c->buckets);
        free(c);
        return fl_error(FLAME_ERR_INTERNAL, "pthread_cond_init failed");
    }
    /* lowest indices on top: a small working set stays in the first blocks */
    for (int32_t i = 0; i < c->num_blocks; i++) c->free_blocks[i] = c->num_blocks - 1 - i;
    c->nfree = c->num_blocks;
    *out = c;
    return FLAME_OK;
}

static void free_entry_blocks(fl_kv_cache *c, fl_kv_entry *e, int32_t keep)
{
    for (int32_t i = keep; i < e->nblocks; i++) c->free_blocks[c->nfree++] = e->blocks[i];
    c->st.blocks_in_use -= (uint64_t)(e->nblocks - keep);
    e->nblocks = keep;
}

void fl_kv_cache_destroy(fl_kv_cache *c)
{
    if (!c) return;
    for (fl_kv_entry *e = c->lru_head, *next; e; e = next) {
        next = e->lnext;
        free(e);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->free_blocks);
    free(c->buckets);
    free(c);
}

int32_t fl_kv_block_tokens(const fl_kv_cache *c)
{
    return c->p.block_tokens;
}
int32_t fl_kv_num_blocks(const fl_kv_cache *c)
{
    return c->num_blocks;
}
uint64_t fl_kv_block_bytes(const fl_kv_cache *c)
{
    return c->block_bytes;
}

/* ---- map and LRU list (under mu) */

static fl_kv_entry **slot_of(fl_kv_cache *c, int64_t user)
{
    fl_kv_entry **s = &c->buckets[mix64((uint64_t)user) & (c->nbuckets - 1)];
    while (*s && (*s)->user != user) s = &(*s)->hnext;
    return s;
}

static void grow_map(fl_kv_cache *c)
{
    size_t nb = c->nbuckets * 2;
    fl_kv_entry **b = calloc(nb, sizeof *b);
    if (!b) return; /* longer chains, still correct */
    for (size_t i = 0; i < c->nbuckets; i++)
        for (fl_kv_entry *e = c->buckets[i], *next; e; e = next) {
            next = e->hnext;
            fl_kv_entry **s = &b[mix64((uint64_t)e->user) & (nb - 1)];
            e->hnext = *s;
            *s = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = nb;
}

static void lru_remove(fl_kv_cache *c, fl_kv_entry *e)
{
    if (e->lprev) e->lprev->lnext = e->lnext;
    else c->lru_head = e->lnext;
    if (e->lnext) e->lnext->lprev = e->lprev;
    else c->lru_tail = e->lprev;
    e->lprev = e->lnext = NULL;
}

static void lru_push(fl_kv_cache *c, fl_kv_entry *e)
{
    e->lprev = NULL;
    e->lnext = c->lru_head;
    if (c->lru_head) c->lru_head->lprev = e;
    c->lru_head = e;
    if (!c->lru_tail) c->lru_tail = e;
}

static void touch(fl_kv_cache *c, fl_kv_entry *e)
{
    lru_remove(c, e);
    lru_push(c, e);
}

/* Takes e out of the map and the list; frees it now when nobody pins it, else at its last release. */
static void unlink_entry(fl_kv_cache *c, fl_kv_entry *e)
{
    fl_kv_entry **s = slot_of(c, e->user);
    if (*s == e) *s = e->hnext;
    lru_remove(c, e);
    c->nentries--;
    c->st.entries = c->nentries;
    e->dead = true;
    if (e->pins == 0) {
        free_entry_blocks(c, e, 0);
        free(e);
    }
}

/* ---- lookup, reserve, publish, abort, release */

static void pin(fl_kv_entry *e, fl_kv_ticket *t, fl_kv_kind kind, int32_t cached, int32_t tokens, bool writer)
{
    e->pins++;
    *t = (fl_kv_ticket){.entry = e, .kind = kind, .cached = cached, .tokens = tokens, .writer = writer,
                        .blocks = e->blocks};
}

fl_kv_kind fl_kv_lookup(fl_kv_cache *c, const fl_kv_key *key, fl_kv_ticket *t)
{
    memset(t, 0, sizeof *t);
    t->tokens = key->tokens;
    pthread_mutex_lock(&c->mu);
    fl_kv_entry *e = *slot_of(c, key->user);
    bool waited = false;
    while (e && e->writing) { /* single flight: the writer's result decides */
        if (!waited) c->st.waits++;
        waited = true;
        pthread_cond_wait(&c->cv, &c->mu);
        e = *slot_of(c, key->user);
    }
    const int32_t n = key->tokens;
    if (key->prefix) c->st.hashed++;
    if (e && e->tokens == n && ((key->version && e->version == key->version) || (key->prefix && e->hash == key->prefix[n]))) {
        /* a hit by hash under another caller's version: the entry takes that version, so the
         * caller's next call with it is a hit without hashing (versions are metadata, read and
         * written only under mu; the rows are not touched) */
        if (key->version) e->version = key->version;
        pin(e, t, FL_KV_HIT, n, n, false);
        touch(c, e);
        c->st.hits++;
        pthread_mutex_unlock(&c->mu);
        return FL_KV_HIT;
    }
    if (!key->prefix) {
        pthread_mutex_unlock(&c->mu);
        t->kind = FL_KV_NEED_HASH;
        return FL_KV_NEED_HASH;
    }
    if (e && key->extendable && e->tokens > 0 && e->tokens < n && e->hash == key->prefix[e->tokens]) {
        e->writing = true;
        pin(e, t, FL_KV_EXTEND, e->tokens, n, true);
        touch(c, e);
        c->st.extensions++;
        pthread_mutex_unlock(&c->mu);
        return FL_KV_EXTEND;
    }
    c->st.misses++;
    if (e) unlink_entry(c, e); /* another history: the old rows are of no use any more */
    fl_kv_entry *ne = calloc(1, sizeof *ne + (size_t)c->max_blocks * sizeof(int32_t));
    if (ne) { /* (without memory for the bookkeeping the call scores without storing) */
        ne->user = key->user;
        ne->writing = true;
        fl_kv_entry **s = slot_of(c, key->user);
        *s = ne;
        lru_push(c, ne);
        if (++c->nentries > c->nbuckets) grow_map(c);
        c->st.entries = c->nentries;
        pin(ne, t, FL_KV_MISS, 0, n, true);
    } else {
        t->kind = FL_KV_MISS;
    }
    pthread_mutex_unlock(&c->mu);
    return FL_KV_MISS;
}

bool fl_kv_reserve(fl_kv_cache *c, fl_kv_ticket *t)
{
    fl_kv_entry *e = t->entry;
    if (!e || !t->writer) return false;
    const int32_t need = (t->tokens + c->p.block_tokens - 1) / c->p.block_tokens;
    pthread_mutex_lock(&c->mu);
    bool ok = need <= c->max_blocks && need <= c->num_blocks; /* an entry longer than the budget is never stored */
    if (ok && c->nfree < need - e->nblocks) { /* evict only when that frees enough: a reserve that fails
                                                * anyway must not drop other users' entries */
        int64_t evictable = c->nfree;
        for (fl_kv_entry *v = c->lru_tail; v && evictable < need - e->nblocks; v = v->lprev)
            if (v != e && v->pins == 0 && !v->writing) evictable += v->nblocks;
        ok = evictable >= need - e->nblocks;
    }
    /* evict from the least recently used end until the blocks are free */
    for (fl_kv_entry *v = c->lru_tail, *prev; ok && c->nfree < need - e->nblocks && v; v = prev) {
        prev = v->lprev;
        if (v == e || v->pins > 0 || v->writing) continue;
        unlink_entry(c, v);
        c->st.evictions++;
    }
    ok = ok && c->nfree >= need - e->nblocks;
    if (ok) {
        while (e->nblocks < need) e->blocks[e->nblocks++] = c->free_blocks[--c->nfree];
        c->st.blocks_in_use = (uint64_t)(c->num_blocks - c->nfree);
        if (c->st.blocks_in_use > c->st.peak_blocks_in_use) c->st.peak_blocks_in_use = c->st.blocks_in_use;
        t->reserved = true;
    } else {
        c->st.store_skipped++;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void fl_kv_publish(fl_kv_cache *c, fl_kv_ticket *t, uint64_t version, uint64_t hash)
{
    fl_kv_entry *e = t->entry;
    pthread_mutex_lock(&c->mu);
    e->tokens = t->tokens;
    e->pub_blocks = e->nblocks;
    e->version = version;
    e->hash = hash;
    e->writing = false;
    if (!e->dead) touch(c, e);
    t->cached = t->tokens;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void fl_kv_abort(fl_kv_cache *c, fl_kv_ticket *t)
{
    fl_kv_entry *e = t->entry;
    if (!e || !t->writer) return;
    pthread_mutex_lock(&c->mu);
    e->writing = false;
    if (t->kind == FL_KV_EXTEND) {
        free_entry_blocks(c, e, e->pub_blocks); /* rows past the published ones were never visible */
    } else if (!e->dead) {
        unlink_entry(c, e); /* pinned by this call: freed at its release */
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void fl_kv_release(fl_kv_cache *c, fl_kv_ticket *t)
{
    fl_kv_entry *e = t->entry;
    if (!e) return;
    pthread_mutex_lock(&c->mu);
    if (--e->pins == 0 && e->dead) {
        free_entry_blocks(c, e, 0);
        free(e);
    }
    pthread_mutex_unlock(&c->mu);
    memset(t, 0, sizeof *t);
}

void fl_kv_count_tokens(fl_kv_cache *c, uint64_t computed, uint64_t saved)
{
    pthread_mutex_lock(&c->mu);
    c->st.tokens_computed += computed;
    c->st.tokens_saved += saved;
    pthread_mutex_unlock(&c->mu);
}

void fl_kv_get_stats(fl_kv_cache *c, fl_kv_stats *s)
{
    pthread_mutex_lock(&c->mu);
    *s = c->st;
    s->blocks_in_use = (uint64_t)(c->num_blocks - c->nfree);
    pthread_mutex_unlock(&c->mu);
}

/* The hashes' seed: a secret drawn once per process from the system's random source. Each step
 * h = mix(h ^ id) is a bijection of h, so with a known seed two windows whose states differ by
 * d collide at the next items if those differ by d (XOR): a birthday search over a few million
 * two-item prefixes finds such windows for a 16k-item catalogue. Without the seed no state is
 * known, and finding a colliding pair takes guesses the process would have to answer. */
static uint64_t kv_seed;
static void draw_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) { /* no entropy source: time and addresses */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&ts);
    }
    kv_seed = mix64(s ^ 0x6b76636163686531ull);
}

void fl_kv_prefix_hashes(const int64_t *items, const fl_kv_bags_view *side, int num_side, int64_t first,
                         int32_t tokens, uint64_t *prefix)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, draw_seed);
    uint64_t h = kv_seed;
    prefix[0] = h;
    for (int32_t k = 0; k < tokens; k++) {
        h = mix64(h ^ (uint64_t)items[first + k]);
        for (int s = 0; s < num_side; s++) {
            const int64_t lo = side[s].offsets[first + k], hi = side[s].offsets[first + k + 1];
            h = mix64(h ^ (0xa5a5a5a5ull + (uint64_t)(hi - lo)));
            for (int64_t i = lo; i < hi; i++) h = mix64(h ^ (uint64_t)side[s].ids[i]);
        }
        prefix[k + 1] = h;
    }
}
