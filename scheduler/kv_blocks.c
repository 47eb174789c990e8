// kv_blocks: the per-rank block manager and prefix cache (see kv_blocks.h).
#include "scheduler/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct kv_blocks {
    int n_blocks;
    bool caching;
    int n_used;          // blocks with ref > 0
    int32_t *ref;        // (n_blocks) tables holding the block
    uint32_t *gen;       // (n_blocks) incarnation, bumped at every allocation
    int32_t *free_stack; // (n_blocks) unreferenced, uncached blocks
    int n_free;
    // Unreferenced cached blocks, least recently released at the head.
    int32_t *lru_prev;   // (n_blocks)
    int32_t *lru_next;   // (n_blocks)
    int32_t lru_head, lru_tail;
    int n_lru;
    // The prefix cache: a chained hash table over the blocks' keys.
    uint8_t *cached;     // (n_blocks) 1 when the block is in the table
    uint64_t *hash;      // (n_blocks)
    int32_t *key_parent; // (n_blocks) parent block id, -1 for a sequence's first block
    uint32_t *key_pgen;  // (n_blocks) the parent's incarnation when the key was made
    int32_t *key_tokens; // (n_blocks, KV_BLOCK_TOKENS)
    int32_t *bucket;     // (n_buckets) first block in the chain, -1 when empty
    int32_t *bnext;      // (n_blocks) next block in the chain
    uint32_t bucket_mask;
};

static uint64_t mix64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return h;
}

static uint64_t key_hash(int32_t parent, uint32_t pgen, const int32_t *tokens)
{
    uint64_t h = mix64(0x6a09e667f3bcc908ull, (uint64_t)(uint32_t)parent << 32 | pgen);
    for (int i = 0; i < KV_BLOCK_TOKENS; i += 2)
        h = mix64(h, (uint64_t)(uint32_t)tokens[i] << 32 | (uint32_t)tokens[i + 1]);
    return h;
}

int kvb_create(int n_blocks, bool prefix_caching, struct kv_blocks **out, char *err,
               size_t errlen)
{
    *out = NULL;
    if (n_blocks < 1 || n_blocks > (1 << 28))
        return ms_err(err, errlen, MS_EINVAL,
                      "a KV pool needs between 1 and %d blocks, not %d", 1 << 28, n_blocks);
    uint32_t n_buckets = 16;
    while (n_buckets < (uint32_t)n_blocks * 2u) n_buckets <<= 1;
    struct kv_blocks *b = calloc(1, sizeof *b);
    if (!b) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the KV block manager");
    size_t n = (size_t)n_blocks;
    b->n_blocks = n_blocks;
    b->caching = prefix_caching;
    b->ref = calloc(n, sizeof *b->ref);
    b->gen = calloc(n, sizeof *b->gen);
    b->free_stack = malloc(n * sizeof *b->free_stack);
    b->lru_prev = malloc(n * sizeof *b->lru_prev);
    b->lru_next = malloc(n * sizeof *b->lru_next);
    b->cached = calloc(n, 1);
    b->hash = calloc(n, sizeof *b->hash);
    b->key_parent = calloc(n, sizeof *b->key_parent);
    b->key_pgen = calloc(n, sizeof *b->key_pgen);
    b->key_tokens = calloc(n * KV_BLOCK_TOKENS, sizeof *b->key_tokens);
    b->bucket = malloc((size_t)n_buckets * sizeof *b->bucket);
    b->bnext = malloc(n * sizeof *b->bnext);
    if (!b->ref || !b->gen || !b->free_stack || !b->lru_prev || !b->lru_next || !b->cached ||
        !b->hash || !b->key_parent || !b->key_pgen || !b->key_tokens || !b->bucket ||
        !b->bnext) {
        kvb_destroy(b);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory for the KV block manager (%d blocks)",
                      n_blocks);
    }
    b->bucket_mask = n_buckets - 1;
    for (uint32_t i = 0; i < n_buckets; i++) b->bucket[i] = -1;
    // Stack order hands out block 0 first, which keeps small tests readable.
    for (int i = 0; i < n_blocks; i++) {
        b->free_stack[i] = n_blocks - 1 - i;
        b->lru_prev[i] = b->lru_next[i] = -1;
        b->bnext[i] = -1;
    }
    b->n_free = n_blocks;
    b->lru_head = b->lru_tail = -1;
    *out = b;
    return 0;
}

void kvb_destroy(struct kv_blocks *b)
{
    if (!b) return;
    free(b->ref);
    free(b->gen);
    free(b->free_stack);
    free(b->lru_prev);
    free(b->lru_next);
    free(b->cached);
    free(b->hash);
    free(b->key_parent);
    free(b->key_pgen);
    free(b->key_tokens);
    free(b->bucket);
    free(b->bnext);
    free(b);
}

int kvb_total(const struct kv_blocks *b) { return b->n_blocks; }
int kvb_num_free(const struct kv_blocks *b) { return b->n_free + b->n_lru; }
int kvb_num_used(const struct kv_blocks *b) { return b->n_used; }
int kvb_num_cached(const struct kv_blocks *b) { return b->n_lru; }
bool kvb_prefix_caching(const struct kv_blocks *b) { return b->caching; }

static void lru_remove(struct kv_blocks *b, int32_t id)
{
    int32_t p = b->lru_prev[id], n = b->lru_next[id];
    if (p >= 0) b->lru_next[p] = n;
    else b->lru_head = n;
    if (n >= 0) b->lru_prev[n] = p;
    else b->lru_tail = p;
    b->lru_prev[id] = b->lru_next[id] = -1;
    b->n_lru--;
}

static void lru_push_tail(struct kv_blocks *b, int32_t id)
{
    b->lru_prev[id] = b->lru_tail;
    b->lru_next[id] = -1;
    if (b->lru_tail >= 0) b->lru_next[b->lru_tail] = id;
    else b->lru_head = id;
    b->lru_tail = id;
    b->n_lru++;
}

static void hash_remove(struct kv_blocks *b, int32_t id)
{
    int32_t *link = &b->bucket[b->hash[id] & b->bucket_mask];
    while (*link >= 0 && *link != id) link = &b->bnext[*link];
    if (*link == id) *link = b->bnext[id];
    b->bnext[id] = -1;
    b->cached[id] = 0;
}

static int32_t hash_find(const struct kv_blocks *b, uint64_t h, int32_t parent, uint32_t pgen,
                         const int32_t *tokens)
{
    for (int32_t id = b->bucket[h & b->bucket_mask]; id >= 0; id = b->bnext[id]) {
        if (b->hash[id] == h && b->key_parent[id] == parent && b->key_pgen[id] == pgen &&
            !memcmp(b->key_tokens + (size_t)id * KV_BLOCK_TOKENS, tokens,
                    KV_BLOCK_TOKENS * sizeof *tokens))
            return id;
    }
    return -1;
}

static void hash_insert(struct kv_blocks *b, int32_t id, uint64_t h, int32_t parent,
                        uint32_t pgen, const int32_t *tokens)
{
    b->hash[id] = h;
    b->key_parent[id] = parent;
    b->key_pgen[id] = pgen;
    memcpy(b->key_tokens + (size_t)id * KV_BLOCK_TOKENS, tokens, KV_BLOCK_TOKENS * sizeof *tokens);
    uint32_t slot = (uint32_t)(h & b->bucket_mask);
    b->bnext[id] = b->bucket[slot];
    b->bucket[slot] = id;
    b->cached[id] = 1;
}

static void block_acquire(struct kv_blocks *b, int32_t id)
{
    if (b->ref[id]++ == 0) {
        lru_remove(b, id); // only cached blocks are found unreferenced
        b->n_used++;
    }
}

static void block_release(struct kv_blocks *b, int32_t id)
{
    if (--b->ref[id] > 0) return;
    b->n_used--;
    if (b->cached[id]) lru_push_tail(b, id);
    else b->free_stack[b->n_free++] = id;
}

// A fresh block: an uncached free one first, else the least recently used
// cached one, whose entry is dropped. The new incarnation makes every key
// that names the block as parent stale.
static int32_t block_alloc(struct kv_blocks *b)
{
    int32_t id;
    if (b->n_free > 0) {
        id = b->free_stack[--b->n_free];
    } else if (b->lru_head >= 0) {
        id = b->lru_head;
        lru_remove(b, id);
        hash_remove(b, id);
    } else {
        return -1;
    }
    b->gen[id]++;
    b->ref[id] = 1;
    b->n_used++;
    return id;
}

int kvb_table_init(struct kvb_table *t, int cap_tokens)
{
    memset(t, 0, sizeof *t);
    if (cap_tokens < 1) cap_tokens = 1;
    t->cap = (cap_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    t->ids = malloc((size_t)t->cap * sizeof *t->ids);
    return t->ids ? 0 : MS_ENOMEM;
}

void kvb_table_free(struct kvb_table *t)
{
    free(t->ids);
    memset(t, 0, sizeof *t);
}

static void parent_of(const struct kv_blocks *b, const struct kvb_table *t, int i,
                      int32_t *parent, uint32_t *pgen)
{
    *parent = i > 0 ? t->ids[i - 1] : -1;
    *pgen = i > 0 ? b->gen[*parent] : 0;
}

int kvb_match_prefix(struct kv_blocks *b, struct kvb_table *t, const int32_t *tokens,
                     int max_tokens)
{
    if (!b->caching || t->n != 0) return 0;
    int i = 0;
    while ((i + 1) * KV_BLOCK_TOKENS <= max_tokens && i < t->cap) {
        int32_t parent;
        uint32_t pgen;
        parent_of(b, t, i, &parent, &pgen);
        const int32_t *tk = tokens + (size_t)i * KV_BLOCK_TOKENS;
        int32_t id = hash_find(b, key_hash(parent, pgen, tk), parent, pgen, tk);
        if (id < 0) break;
        block_acquire(b, id);
        t->ids[t->n++] = id;
        i++;
    }
    t->n_committed = t->n;
    return t->n * KV_BLOCK_TOKENS;
}

int kvb_reserve(struct kv_blocks *b, struct kvb_table *t, int n_tokens)
{
    int need = (n_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    if (need > t->cap) return MS_ENOFIT;
    if (need - t->n > b->n_free + b->n_lru) return MS_ENOFIT;
    while (t->n < need) t->ids[t->n++] = block_alloc(b);
    return 0;
}

int kvb_reachable_tokens(const struct kv_blocks *b, const struct kvb_table *t)
{
    int blocks = t->n + b->n_free + b->n_lru;
    if (blocks > t->cap) blocks = t->cap;
    return blocks * KV_BLOCK_TOKENS;
}

void kvb_commit(struct kv_blocks *b, struct kvb_table *t, const int32_t *tokens, int n_computed)
{
    int n_full = n_computed / KV_BLOCK_TOKENS;
    if (n_full > t->n) n_full = t->n;
    if (!b->caching) {
        if (t->n_committed < n_full) t->n_committed = n_full;
        return;
    }
    for (int i = t->n_committed; i < n_full; i++) {
        int32_t parent;
        uint32_t pgen;
        parent_of(b, t, i, &parent, &pgen);
        const int32_t *tk = tokens + (size_t)i * KV_BLOCK_TOKENS;
        uint64_t h = key_hash(parent, pgen, tk);
        int32_t found = hash_find(b, h, parent, pgen, tk);
        if (found < 0) {
            hash_insert(b, t->ids[i], h, parent, pgen, tk);
        } else if (found != t->ids[i]) {
            // Someone computed the same prefix first: share theirs, free ours.
            block_acquire(b, found);
            block_release(b, t->ids[i]);
            t->ids[i] = found;
        }
        t->n_committed = i + 1;
    }
}

void kvb_release_all(struct kv_blocks *b, struct kvb_table *t)
{
    for (int i = t->n - 1; i >= 0; i--) block_release(b, t->ids[i]);
    t->n = 0;
    t->n_committed = 0;
}

int kvb_check(const struct kv_blocks *b, const struct kvb_table *const *tables, int n_tables,
              char *err, size_t errlen)
{
    int rc = 0;
    int32_t *count = calloc((size_t)b->n_blocks, sizeof *count);
    uint8_t *seen = calloc((size_t)b->n_blocks, 1);
    if (!count || !seen) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory checking the KV blocks");
        goto out;
    }
    for (int t = 0; t < n_tables; t++)
        for (int i = 0; i < tables[t]->n; i++) {
            int32_t id = tables[t]->ids[i];
            if (id < 0 || id >= b->n_blocks) {
                rc = ms_err(err, errlen, MS_EINTERNAL, "table %d holds block id %d out of range",
                            t, id);
                goto out;
            }
            count[id]++;
        }
    int used = 0;
    for (int id = 0; id < b->n_blocks; id++) {
        if (count[id] != b->ref[id]) {
            rc = ms_err(err, errlen, MS_EINTERNAL,
                        "block %d has reference count %d but %d tables hold it", id, b->ref[id],
                        count[id]);
            goto out;
        }
        if (b->ref[id] > 0) used++;
    }
    if (used != b->n_used || used + b->n_free + b->n_lru != b->n_blocks) {
        rc = ms_err(err, errlen, MS_EINTERNAL,
                    "block counts disagree: %d used (%d counted) + %d free + %d cached != %d",
                    b->n_used, used, b->n_free, b->n_lru, b->n_blocks);
        goto out;
    }
    for (int i = 0; i < b->n_free; i++) {
        int32_t id = b->free_stack[i];
        if (seen[id] || b->ref[id] || b->cached[id]) {
            rc = ms_err(err, errlen, MS_EINTERNAL,
                        "free block %d is listed twice, referenced or cached", id);
            goto out;
        }
        seen[id] = 1;
    }
    int n_lru = 0;
    for (int32_t id = b->lru_head, prev = -1; id >= 0; prev = id, id = b->lru_next[id]) {
        if (seen[id] || b->ref[id] || !b->cached[id] || b->lru_prev[id] != prev ||
            ++n_lru > b->n_lru) {
            rc = ms_err(err, errlen, MS_EINTERNAL, "the LRU list is inconsistent at block %d", id);
            goto out;
        }
        seen[id] = 1;
    }
    if (n_lru != b->n_lru) {
        rc = ms_err(err, errlen, MS_EINTERNAL, "the LRU list holds %d blocks, not %d", n_lru,
                    b->n_lru);
        goto out;
    }
    for (int id = 0; id < b->n_blocks; id++) {
        if (!b->cached[id]) continue;
        const int32_t *tk = b->key_tokens + (size_t)id * KV_BLOCK_TOKENS;
        if (key_hash(b->key_parent[id], b->key_pgen[id], tk) != b->hash[id]) {
            rc = ms_err(err, errlen, MS_EINTERNAL, "cached block %d has a stale hash", id);
            goto out;
        }
        int32_t j = b->bucket[b->hash[id] & b->bucket_mask];
        while (j >= 0 && j != id) j = b->bnext[j];
        if (j != id) {
            rc = ms_err(err, errlen, MS_EINTERNAL, "cached block %d is missing from its bucket",
                        id);
            goto out;
        }
    }
out:
    free(count);
    free(seen);
    return rc;
}
