// plan: the attention work plan and grouped-matmul tile arithmetic shared by
// the CUDA backend's host code and kernels (plan.h).
#include "gpu/plan.h"

#include <stddef.h>

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

int plan_attention(const int32_t *seq_start, const int32_t *tok_pos, int n_seqs,
                   const struct plan_attn_opts *o, struct plan_attn_item *items, int items_cap,
                   struct plan_attn_combine *combine, int combine_cap, struct plan_attn *out)
{
    out->n_items = out->n_combine = out->n_part_rows = 0;
    if (n_seqs < 0 || o->tile_tokens < 1 || o->kv_heads < 1 || o->n_heads < 1 ||
        o->chunk < 16 || o->chunk % 16 || o->max_split < 1 || o->max_part_rows < 0)
        return -1;
    // Tiles first: how many, to decide whether KV is split at all.
    long long n_tiles = 0;
    for (int s = 0; s < n_seqs; s++) {
        const int n = seq_start[s + 1] - seq_start[s];
        if (n < 0) return -1;
        n_tiles += ceil_div(n, o->tile_tokens);
    }
    int split_to = 1;
    if (o->target_ctas > 0 && n_tiles > 0 && n_tiles * o->kv_heads < o->target_ctas) {
        long long want = (o->target_ctas + n_tiles * o->kv_heads - 1) / (n_tiles * o->kv_heads);
        split_to = want > o->max_split ? o->max_split : (int)want;
    }
    int ni = 0, nc = 0;
    long long parts = 0;
    for (int s = 0; s < n_seqs; s++) {
        const int first = seq_start[s], n = seq_start[s + 1] - first;
        for (int i = 0; i < n; i += o->tile_tokens) {
            const int nt = n - i < o->tile_tokens ? n - i : o->tile_tokens;
            const int t0 = first + i;
            const int ctx = tok_pos[t0 + nt - 1] + 1; // the tile's last token sees the most
            if (ctx < 1) return -1;
            const int n_chunk = ceil_div(ctx, o->chunk);
            // Whole chunks per item; no split when the partials would not fit.
            const int per = ceil_div(n_chunk, split_to);
            int n_split = ceil_div(n_chunk, per);
            const long long rows = (long long)n_chunk * nt * o->n_heads;
            if (n_split > 1 && parts + rows > o->max_part_rows) n_split = 1;
            const int span = n_split > 1 ? per : n_chunk;
            for (int j = 0; j < n_split; j++) {
                if (items) {
                    if (ni >= items_cap) return -1;
                    const int p0 = j * span * o->chunk, end = (j + 1) * span * o->chunk;
                    items[ni] = (struct plan_attn_item){
                        .t0 = t0, .n_tok = nt, .seq = s, .p0 = p0, .p1 = end < ctx ? end : ctx,
                        .part = n_split > 1 ? (int32_t)(parts + (long long)j * span * nt * o->n_heads)
                                            : -1};
                }
                ni++;
            }
            if (n_split > 1) {
                if (combine) {
                    if (nc >= combine_cap) return -1;
                    combine[nc] = (struct plan_attn_combine){.t0 = t0, .n_tok = nt,
                                                             .n_chunk = n_chunk,
                                                             .part0 = (int32_t)parts};
                }
                nc++;
                parts += rows;
                if (parts > INT32_MAX) return -1;
            }
        }
    }
    out->n_items = ni;
    out->n_combine = nc;
    out->n_part_rows = (int)parts;
    return 0;
}

int plan_group_tiles_bound(int n_groups, int max_rows, int per_tile)
{
    if (n_groups < 0 || max_rows < 0 || per_tile < 1) return 0;
    // sum ceil(n_g / t) <= sum (n_g / t + 1) over the non-empty groups.
    const int nonempty = n_groups < max_rows ? n_groups : max_rows;
    return max_rows / per_tile + nonempty;
}

int plan_group_tiles(const int32_t *off, int n_groups, int per_tile, int32_t *tiles, int cap)
{
    int n = 0;
    for (int g = 0; g < n_groups; g++)
        for (int r = off[g]; r < off[g + 1]; r += per_tile) {
            if (n < cap) {
                tiles[2 * n] = g;
                tiles[2 * n + 1] = r;
            }
            n++;
        }
    return n;
}
