// kv_blocks: one rank's KV block manager — the free list, reference counts,
// per-sequence block tables and the automatic prefix cache (full 16-token
// blocks shared by reference count, unreferenced ones evicted LRU first).
#ifndef MOESERVE_SCHEDULER_KV_BLOCKS_H
#define MOESERVE_SCHEDULER_KV_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/forward.h" // KV_BLOCK_TOKENS

// A cached block is keyed by its parent block (id and incarnation) and its own
// 16 tokens, compared exactly. By induction the key names every token before
// and in the block, as a hash chained over the prefix would, but a hash
// collision can never produce a wrong hit: the 64-bit hash only picks the
// bucket. Every structure is sized at kvb_create; nothing is allocated later.
struct kv_blocks;

int kvb_create(int n_blocks, bool prefix_caching, struct kv_blocks **out, char *err,
               size_t errlen);
void kvb_destroy(struct kv_blocks *b);

int kvb_total(const struct kv_blocks *b);
int kvb_num_free(const struct kv_blocks *b);   // allocatable now: free + evictable cached
int kvb_num_used(const struct kv_blocks *b);   // referenced by at least one table
int kvb_num_cached(const struct kv_blocks *b); // unreferenced, kept by the prefix cache
bool kvb_prefix_caching(const struct kv_blocks *b);

// A sequence's block table: ids[i] holds its tokens [16 i, 16 i + 16).
struct kvb_table {
    int32_t *ids;    // (cap) block ids into the rank's pool
    int n;           // blocks held
    int cap;
    int n_committed; // leading blocks already offered to the prefix cache
};
// cap_tokens: the most tokens the sequence will ever hold.
int kvb_table_init(struct kvb_table *t, int cap_tokens);
void kvb_table_free(struct kvb_table *t);

// Takes a reference on the longest run of cached blocks that starts the
// sequence and lies within its first max_tokens tokens. The table must be
// empty. Returns the number of tokens matched (a multiple of 16).
int kvb_match_prefix(struct kv_blocks *b, struct kvb_table *t, const int32_t *tokens,
                     int max_tokens);
// Grows the table to cover n_tokens. All or nothing: MS_ENOFIT when the
// pool (free + evictable) lacks blocks, or n_tokens exceeds the table.
int kvb_reserve(struct kv_blocks *b, struct kvb_table *t, int n_tokens);
// The most tokens t could cover if it took every allocatable block (bounded
// by its capacity): how far a chunk may reach when blocks are short.
int kvb_reachable_tokens(const struct kv_blocks *b, const struct kvb_table *t);
// Offers to the cache every block fully covered by the first n_computed
// tokens (their KV is written). A block whose key is already cached is
// replaced in the table by the cached one, so that equal prefixes converge
// on one chain of ids.
void kvb_commit(struct kv_blocks *b, struct kvb_table *t, const int32_t *tokens, int n_computed);
// Releases every block, last first: a sequence's tail goes to the LRU end
// that is evicted first, so its shared head survives longest.
void kvb_release_all(struct kv_blocks *b, struct kvb_table *t);

// Checks the invariants (free + cached + used = total, reference counts equal
// the references held by the given tables, LRU and hash chains consistent).
// For tests; returns 0 or MS_EINTERNAL with the first violation in err.
int kvb_check(const struct kv_blocks *b, const struct kvb_table *const *tables, int n_tables,
              char *err, size_t errlen);

#endif
