// plan: the index arithmetic the CUDA backend's host code and kernels share,
// in plain C so that it is unit-tested on any machine (tests/gpu/): how a
// step's attention is cut into work items (tiles of a sequence's new tokens
// x ranges of its KV positions, with the split-KV partials they leave for
// the combine) — planned on the host for any step, or item by item on the
// device for a decode step (so that a captured graph replays any decode
// step of its size) — and how many row tiles a grouped (expert) matmul can
// need. (The routing, exchange and bucket arithmetic forward.c shares too is
// in model/fwd_plan.h.)
//
// Nothing here allocates; callers size the arrays with the counting calls.
#ifndef MOESERVE_GPU_PLAN_H
#define MOESERVE_GPU_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "model/fwd_plan.h"

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

// ---- decode steps, planned on the device -------------------------------------------
// In a decode step every sequence s has one new token, token s. Its items
// are (s, j) for j < split: the same chunks as plan_attention cuts, each
// sequence's partial sets at fixed rows (s * max_chunks * n_heads, room for
// the longest context's chunks), so that a kernel derives its item from the
// token's position alone and the launch grid (n_seqs x split items, spare
// ones exiting) depends only on the number of sequences.

// Items per sequence of a decode step of n_seqs sequences: plan_attention's
// split for n_seqs one-token tiles.
static inline MS_HD int plan_decode_split(int n_seqs, int kv_heads, int target_ctas, int max_split)
{
    const long long have = (long long)n_seqs * kv_heads;
    if (target_ctas <= 0 || n_seqs < 1 || have >= target_ctas) return 1;
    const long long want = (target_ctas + have - 1) / have;
    return want > max_split ? max_split : (int)want;
}

// Chunks of a context of ctx positions cut into `split` items: per item,
// and how many items are not empty.
static inline MS_HD void plan_decode_cut(int ctx, int split, int chunk, int *n_chunk, int *per,
                                         int *n_split)
{
    *n_chunk = (ctx + chunk - 1) / chunk;
    *per = (*n_chunk + split - 1) / split;
    *n_split = *per > 0 ? (*n_chunk + *per - 1) / *per : 0;
}

// Item j of sequence s, whose token is at position pos: false when the
// sequence has no item j (its context has fewer chunks).
static inline MS_HD bool plan_decode_item(int s, int pos, int j, int split, int chunk, int n_heads,
                                          int max_chunks, struct plan_attn_item *it)
{
    int n_chunk, per, n_split;
    const int ctx = pos + 1;
    plan_decode_cut(ctx, split, chunk, &n_chunk, &per, &n_split);
    if (j >= n_split) return false;
    const int end = (j + 1) * per * chunk;
    it->t0 = s;
    it->n_tok = 1;
    it->seq = s;
    it->p0 = j * per * chunk;
    it->p1 = end < ctx ? end : ctx;
    it->part = n_split > 1 ? (int32_t)(s * max_chunks * n_heads + j * per * n_heads) : -1;
    return true;
}

// Sequence s's combine entry: false when its context is not split.
static inline MS_HD bool plan_decode_combine(int s, int pos, int split, int chunk, int n_heads,
                                             int max_chunks, struct plan_attn_combine *c)
{
    int n_chunk, per, n_split;
    plan_decode_cut(pos + 1, split, chunk, &n_chunk, &per, &n_split);
    if (n_split < 2) return false;
    c->t0 = s;
    c->n_tok = 1;
    c->n_chunk = n_chunk;
    c->part0 = (int32_t)(s * max_chunks * n_heads);
    return true;
}

#ifdef __cplusplus
}
#endif

#endif
