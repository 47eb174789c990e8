// tokenizer_bpe: byte-pair merging of one pre-token (a heap of candidate
// pairs over a linked list of symbols, O(n log n)), the merge table and the
// shared cache of recent pre-tokens.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tokenizer_internal.h"

// ---- the merge table ----

static inline size_t merge_hash(uint64_t key40, size_t mask)
{
    return (size_t)((key40 * 0x9E3779B97F4A7C15ull) >> 24) & mask;
}

int tok_merges_init(struct tok_merges *m, size_t n_merges)
{
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    // A load factor up to 0.6: linear probing stays short and the table small.
    while (cap * 3 < n_merges * 5 + 16) {
        if (ms_mul_overflow(cap, 2, &cap)) return MS_ENOMEM;
    }
    m->slots = malloc(cap * sizeof *m->slots);
    m->merged = malloc((n_merges ? n_merges : 1) * sizeof *m->merged);
    if (!m->slots || !m->merged) {
        free(m->slots);
        free(m->merged);
        m->slots = NULL;
        m->merged = NULL;
        return MS_ENOMEM;
    }
    memset(m->slots, 0xff, cap * sizeof *m->slots);
    m->mask = cap - 1;
    for (size_t i = 0; i < 256 * 256; i++) m->byte_pair[i] = TOK_NO_MERGE;
    return 0;
}

void tok_merges_free(struct tok_merges *m)
{
    free(m->slots);
    free(m->merged);
    m->slots = NULL;
    m->merged = NULL;
}

void tok_merges_put(struct tok_merges *m, int32_t left, int32_t right, uint32_t rank,
                    int32_t merged)
{
    uint64_t key = ((uint64_t)(uint32_t)left << TOK_MERGE_BITS) | (uint32_t)right;
    size_t i = merge_hash(key, m->mask);
    while (m->slots[i] != UINT64_MAX && (m->slots[i] >> TOK_MERGE_BITS) != key) i = (i + 1) & m->mask;
    m->slots[i] = (key << TOK_MERGE_BITS) | rank;
    m->merged[rank] = merged;
    if (rank + 1 > m->n_ranks) m->n_ranks = rank + 1;
}

uint32_t tok_merges_rank(const struct tok_merges *m, int32_t left, int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << TOK_MERGE_BITS) | (uint32_t)right;
    size_t i = merge_hash(key, m->mask);
    for (;;) {
        uint64_t s = m->slots[i];
        if ((s >> TOK_MERGE_BITS) == key) return (uint32_t)(s & (TOK_MERGE_MAX - 1));
        if (s == UINT64_MAX) return TOK_NO_MERGE;
        i = (i + 1) & m->mask;
    }
}

void tok_merges_index_bytes(struct tok_merges *m, const int32_t byte_id[256])
{
    m->offset = m->n_ranks ? m->merged[0] : 0;
    m->affine = true;
    for (uint32_t r = 0; r < m->n_ranks && m->affine; r++)
        if (m->merged[r] != (int32_t)r + m->offset) m->affine = false;
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++)
            m->byte_pair[a * 256 + b] = tok_merges_rank(m, byte_id[a], byte_id[b]);
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
    free(s->ranks);
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
    uint32_t *ranks = realloc(s->ranks, cap * sizeof *ranks);
    if (ranks) s->ranks = ranks;
    uint64_t *heap = realloc(s->heap, bytes);
    if (heap) s->heap = heap;
    if (!ids || !prev || !next || !ranks || !heap) return MS_ENOMEM;
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

// Words up to this many bytes merge by scanning an array of pair ranks: for
// short words that beats a heap. Longer ones take the heap (O(n log n)).
#define SHORT_WORD 48

// Both orders merge the pair of lowest rank, leftmost among equals: Hugging
// Face's order (its heap compares rank, then position).
static size_t merge_short(const struct tok_merges *mg, const uint8_t *w, size_t n, int32_t *ids,
                          uint32_t *ranks, const int32_t *byte_id)
{
    for (size_t i = 0; i < n; i++) ids[i] = byte_id[w[i]];
    for (size_t i = 0; i + 1 < n; i++) ranks[i] = mg->byte_pair[w[i] * 256 + w[i + 1]];
    for (;;) {
        uint32_t best = TOK_NO_MERGE;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (ranks[i] < best) {
                best = ranks[i];
                at = i;
            }
        if (best == TOK_NO_MERGE) return n;
        ids[at] = tok_merged_id(mg, best);
        for (size_t i = at + 1; i + 1 < n; i++) ids[i] = ids[i + 1];
        for (size_t i = at + 1; i + 2 < n; i++) ranks[i] = ranks[i + 1];
        n--;
        if (at > 0) ranks[at - 1] = tok_merges_rank(mg, ids[at - 1], ids[at]);
        if (at + 1 < n) ranks[at] = tok_merges_rank(mg, ids[at], ids[at + 1]);
    }
}

// Each heap entry is (rank, left position). An entry is stale when its pair
// has changed since it was pushed; ranks are unique per pair, so re-reading
// the pair's rank detects that.
static int merge_long(const struct tok_merges *mg, struct tok_bpe_scratch *s, const uint8_t *w,
                      size_t n, const int32_t *byte_id, struct tok_ids *out)
{
    int32_t *ids = s->ids, *prev = s->prev, *next = s->next;
    uint64_t *heap = s->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        ids[i] = byte_id[w[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = mg->byte_pair[w[i] * 256 + w[i + 1]];
        if (r != TOK_NO_MERGE) heap_push(heap, &nh, ((uint64_t)r << 32) | i);
    }
    while (nh) {
        uint64_t top = heap_pop(heap, &nh);
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(uint32_t)top;
        if (ids[pos] < 0) continue;
        int32_t nx = next[pos];
        if (nx < 0 || tok_merges_rank(mg, ids[pos], ids[nx]) != rank) continue;
        ids[pos] = tok_merged_id(mg, rank);
        ids[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = pos;
        if (prev[pos] >= 0) {
            uint32_t r = tok_merges_rank(mg, ids[prev[pos]], ids[pos]);
            if (r != TOK_NO_MERGE) heap_push(heap, &nh, ((uint64_t)r << 32) | (uint32_t)prev[pos]);
        }
        if (next[pos] >= 0) {
            uint32_t r = tok_merges_rank(mg, ids[pos], ids[next[pos]]);
            if (r != TOK_NO_MERGE) heap_push(heap, &nh, ((uint64_t)r << 32) | (uint32_t)pos);
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) {
        int rc = tok_ids_push(out, ids[i]);
        if (rc) return rc;
    }
    return 0;
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
    int rc = 0;
    if (cacheable) {
        h = bytes_hash(w, n);
        if (cache_get(cache, h, w, n, out, &rc)) return rc;
    }
    if ((rc = scratch_reserve(s, n))) return rc;
    size_t first = out->len;
    if (n <= SHORT_WORD) {
        size_t m = merge_short(t->merges, w, n, s->ids, s->ranks, t->byte_id);
        for (size_t i = 0; i < m; i++)
            if ((rc = tok_ids_push(out, s->ids[i]))) return rc;
    } else if ((rc = merge_long(t->merges, s, w, n, t->byte_id, out))) {
        return rc;
    }
    size_t produced = out->len - first;
    if (cacheable && produced <= TOK_CACHE_IDS_MAX) cache_put(cache, h, w, n, out->p + first, produced);
    return 0;
}
