// tokenizer_bpe: byte-pair merging of one pre-token (a heap of candidate
// pairs over a linked list of symbols, O(n log n)), the merge table and the
// shared cache of recent pre-tokens.
#include <stdlib.h>
#include <string.h>

#include "model/base.h"
#include "model/tokenizer_internal.h"

// ---- the merge table: (left id, right id) -> (rank, merged id) ----

static inline size_t merge_hash(uint64_t key, size_t mask)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 29) & mask;
}

int tok_merges_init(struct tok_merges *m, size_t n_merges)
{
    size_t cap = 16;
    while (cap < n_merges * 2 + 16) {
        if (ms_mul_overflow(cap, 2, &cap)) return MS_ENOMEM;
    }
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return MS_ENOMEM;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

void tok_merges_free(struct tok_merges *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void tok_merges_put(struct tok_merges *m, int32_t left, int32_t right, uint32_t rank,
                    int32_t merged)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t i = merge_hash(key, m->mask);
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].key == UINT64_MAX) m->count++;
    m->slots[i] = (struct tok_merge_slot){key, rank, merged};
}

const struct tok_merge_slot *tok_merges_get(const struct tok_merges *m, int32_t left,
                                            int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t i = merge_hash(key, m->mask);
    for (;;) {
        const struct tok_merge_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}

// ---- the cache ----

int tok_cache_init(struct tok_cache *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        c->shards[i].entries = calloc(TOK_CACHE_SLOTS, sizeof *c->shards[i].entries);
        if (!c->shards[i].entries || pthread_mutex_init(&c->shards[i].lock, NULL) != 0) {
            free(c->shards[i].entries);
            c->shards[i].entries = NULL;
            for (int k = 0; k < i; k++) {
                pthread_mutex_destroy(&c->shards[k].lock);
                free(c->shards[k].entries);
                c->shards[k].entries = NULL;
            }
            return MS_ENOMEM;
        }
    }
    c->enabled = true;
    return 0;
}

void tok_cache_free(struct tok_cache *c)
{
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        if (!c->shards[i].entries) continue;
        pthread_mutex_destroy(&c->shards[i].lock);
        free(c->shards[i].entries);
        c->shards[i].entries = NULL;
    }
    c->enabled = false;
}

static inline uint64_t bytes_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, p + i, n - i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h;
}

// The cache is written through a const tokenizer: it is the one part of it
// that changes after load, and its shards' locks make that safe.
static bool cache_get(struct tok_cache *c, uint64_t h, const uint8_t *w, size_t n,
                      struct tok_ids *out, int *rc)
{
    struct tok_cache_shard *sh = &c->shards[h >> 58];
    struct tok_cache_entry *e = &sh->entries[h & (TOK_CACHE_SLOTS - 1)];
    int32_t ids[TOK_CACHE_IDS_MAX];
    int n_ids = -1;
    pthread_mutex_lock(&sh->lock);
    if (e->key_len == n && e->hash == h && memcmp(e->key, w, n) == 0) {
        n_ids = e->n_ids;
        memcpy(ids, e->ids, (size_t)n_ids * sizeof ids[0]);
    }
    pthread_mutex_unlock(&sh->lock);
    if (n_ids < 0) return false;
    for (int i = 0; i < n_ids; i++)
        if ((*rc = tok_ids_push(out, ids[i]))) return true;
    *rc = 0;
    return true;
}

static void cache_put(struct tok_cache *c, uint64_t h, const uint8_t *w, size_t n,
                      const int32_t *ids, size_t n_ids)
{
    struct tok_cache_shard *sh = &c->shards[h >> 58];
    struct tok_cache_entry *e = &sh->entries[h & (TOK_CACHE_SLOTS - 1)];
    pthread_mutex_lock(&sh->lock);
    e->hash = h;
    e->key_len = (uint8_t)n;
    e->n_ids = (uint8_t)n_ids;
    memcpy(e->key, w, n);
    memcpy(e->ids, ids, n_ids * sizeof *ids);
    pthread_mutex_unlock(&sh->lock);
}

// ---- merging ----

void tok_bpe_scratch_free(struct tok_bpe_scratch *s)
{
    free(s->ids);
    free(s->prev);
    free(s->next);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static int scratch_reserve(struct tok_bpe_scratch *s, size_t n)
{
    if (n <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) {
        if (ms_mul_overflow(cap, 2, &cap)) return MS_ENOMEM;
    }
    size_t heap_cap, bytes;
    if (ms_mul_overflow(cap, 3, &heap_cap) || ms_mul_overflow(heap_cap, sizeof(uint64_t), &bytes))
        return MS_ENOMEM;
    int32_t *ids = realloc(s->ids, cap * sizeof *ids);
    if (ids) s->ids = ids;
    int32_t *prev = realloc(s->prev, cap * sizeof *prev);
    if (prev) s->prev = prev;
    int32_t *next = realloc(s->next, cap * sizeof *next);
    if (next) s->next = next;
    uint64_t *heap = realloc(s->heap, bytes);
    if (heap) s->heap = heap;
    if (!ids || !prev || !next || !heap) return MS_ENOMEM;
    s->cap = cap;
    s->heap_cap = heap_cap;
    return 0;
}

static inline void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0];
    uint64_t v = h[--(*n)];
    size_t i = 0, len = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= len) break;
        size_t c = (l + 1 < len && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (len) h[i] = v;
    return top;
}

int tok_bpe_word(const struct tokenizer *t, struct tok_bpe_scratch *s, const uint8_t *w,
                 size_t n, struct tok_ids *out)
{
    if (n == 0) return 0;
    if (n == 1) return tok_ids_push(out, t->byte_id[w[0]]);
    if (n > (size_t)INT32_MAX - 1) return MS_ENOMEM;

    struct tok_cache *cache = (struct tok_cache *)&t->cache;
    bool cacheable = cache->enabled && n <= TOK_CACHE_KEY_MAX;
    uint64_t h = 0;
    if (cacheable) {
        h = bytes_hash(w, n);
        int rc = 0;
        if (cache_get(cache, h, w, n, out, &rc)) return rc;
    }

    int rc = scratch_reserve(s, n);
    if (rc) return rc;
    int32_t *ids = s->ids, *prev = s->prev, *next = s->next;
    uint64_t *heap = s->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        ids[i] = t->byte_id[w[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const struct tok_merge_slot *m = tok_merges_get(&t->merges, ids[i], ids[i + 1]);
        if (m) heap_push(heap, &nh, ((uint64_t)m->rank << 32) | i);
    }
    // Lowest rank first, leftmost among equals: Hugging Face's order. An
    // entry is stale when its pair has changed since it was pushed; ranks are
    // unique per pair, so re-reading the pair's rank detects that.
    while (nh) {
        uint64_t top = heap_pop(heap, &nh);
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(uint32_t)top;
        if (ids[pos] < 0) continue;
        int32_t nx = next[pos];
        if (nx < 0) continue;
        const struct tok_merge_slot *m = tok_merges_get(&t->merges, ids[pos], ids[nx]);
        if (!m || m->rank != rank) continue;
        ids[pos] = m->merged;
        ids[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = pos;
        if (prev[pos] >= 0) {
            const struct tok_merge_slot *ml = tok_merges_get(&t->merges, ids[prev[pos]], ids[pos]);
            if (ml) heap_push(heap, &nh, ((uint64_t)ml->rank << 32) | (uint32_t)prev[pos]);
        }
        if (next[pos] >= 0) {
            const struct tok_merge_slot *mr = tok_merges_get(&t->merges, ids[pos], ids[next[pos]]);
            if (mr) heap_push(heap, &nh, ((uint64_t)mr->rank << 32) | (uint32_t)pos);
        }
    }
    size_t first = out->len;
    for (int32_t i = 0; i >= 0; i = next[i])
        if ((rc = tok_ids_push(out, ids[i]))) return rc;
    size_t produced = out->len - first;
    if (cacheable && produced <= TOK_CACHE_IDS_MAX) cache_put(cache, h, w, n, out->p + first, produced);
    return 0;
}
