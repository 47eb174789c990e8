// plan: the index arithmetic the CUDA backend's host code and kernels share,
// in plain C so that it is unit-tested on any machine (tests/gpu/): how a
// step's attention is cut into work items (tiles of a sequence's new tokens
// x ranges of its KV positions, with the split-KV partials they leave for
// the combine), how many row tiles a grouped (expert) matmul can need, and
// which captured batch-size bucket a decode step replays.
//
// Nothing here allocates; callers size the arrays with the counting calls.
#ifndef MOESERVE_GPU_PLAN_H
#define MOESERVE_GPU_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Attention is computed over fixed chunks of KV positions — [0, chunk),
// [chunk, 2 chunk), ... whatever the step — each chunk's softmax state
// folded into the token's in chunk order by one function, in the CTA when
// a tile's chunks stay together and in the combine kernel when they are
// split over CTAs. A token's result therefore depends only on its own
// context, never on the tile or the split (the backend contract's "alone or
// batched"); the split only decides how much runs in parallel.

// One attention work item, per KV head: tokens [t0, t0 + n_tok) of one
// sequence (consecutive positions) over KV positions [p0, p1), p0 on a chunk
// boundary. part < 0: the item covers every chunk its tokens see and writes
// the output itself; else it leaves one partial set per chunk, chunk c of
// the tile's at part0 + c * n_tok * n_heads rows (part is its first chunk's),
// row i * n_heads + head within a set.
struct plan_attn_item {
    int32_t t0, n_tok, seq, p0, p1, part;
};

// A tile split over several items: its n_chunk partial sets from part0 are
// folded in chunk order into the output.
struct plan_attn_combine {
    int32_t t0, n_tok, n_chunk, part0;
};

struct plan_attn_opts {
    int tile_tokens;      // tokens per item (>= 1)
    int kv_heads;         // CTAs per item
    int target_ctas;      // split KV until items x kv_heads reaches this (0: never split)
    int chunk;            // positions per chunk (a multiple of 16)
    int max_split;        // most items one tile is split into
    int n_heads;          // query heads (partial rows per token)
    long long max_part_rows; // split no further once the partial rows would pass this
};

struct plan_attn {
    int n_items, n_combine;
    int n_part_rows;      // partial rows the items write (0 when nothing splits)
};

// Plans a step's attention: seq_start (n_seqs + 1) and tok_pos (T) as in
// backend_step. items / combine may be NULL to count (then caps are
// ignored). Returns 0, or -1 when an array is too small or an argument is
// out of range.
int plan_attention(const int32_t *seq_start, const int32_t *tok_pos, int n_seqs,
                   const struct plan_attn_opts *o, struct plan_attn_item *items, int items_cap,
                   struct plan_attn_combine *combine, int combine_cap, struct plan_attn *out);

// The most row tiles a grouped matmul of n_groups groups over at most
// max_rows rows in all can have, `per_tile` rows a tile (each non-empty
// group rounds up once).
int plan_group_tiles_bound(int n_groups, int max_rows, int per_tile);
// The tiles of groups with offsets off (n_groups + 1): (group, first row)
// pairs into tiles (2 ints each), returns their number (the kernel's twin).
int plan_group_tiles(const int32_t *off, int n_groups, int per_tile, int32_t *tiles, int cap);

// CUDA graph batch buckets: decode steps of n sequences replay the graph
// captured for the smallest bucket >= n. The buckets are 1, 2, 4, 8, then
// multiples of 8 up to 64, then multiples of 32 up to max_seqs (vLLM's
// capture sizes, coarser). Returns the bucket, or 0 when n > max_seqs or n < 1.
int plan_graph_bucket(int n, int max_seqs);
// All buckets up to max_seqs, ascending, into out (cap entries); returns how many.
int plan_graph_buckets(int max_seqs, int *out, int cap);

#ifdef __cplusplus
}
#endif

#endif
