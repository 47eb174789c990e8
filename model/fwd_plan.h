// fwd_plan: the index arithmetic of a step that forward.c, every backend's
// host code and the CUDA kernels share, in plain C so that it is unit-tested
// on any machine (tests/model/test_fwd_plan.c):
// - MoE routing: the (token, slot) pairs of some experts sorted by expert,
//   tokens ascending within one, each expert's rows padded to a multiple of
//   a tile (vLLM's moe_align_block_size), as index lists over the pairs;
//   the bound on the padded rows; which padded row belongs to which expert;
// - fixed-size expert-parallel exchanges: the owner rank of an expert and
//   the row where a pair's expert output comes back;
// - decode batch buckets: the sizes a decode step is padded to, so that a
//   captured graph per bucket serves every batch.
// The inline functions are also compiled into CUDA kernels (MS_HD), so the
// host and the device compute them with the same code.
//
// Nothing here allocates or fails but where it says so.
#ifndef MOESERVE_MODEL_FWD_PLAN_H
#define MOESERVE_MODEL_FWD_PLAN_H

#include <stdint.h>

#ifdef __CUDACC__
#define MS_HD __host__ __device__
#else
#define MS_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ---- MoE routing --------------------------------------------------------------------

// n rows padded up to a multiple of pad (>= 1).
static inline MS_HD int fwd_plan_padded(int n, int pad) { return (n + pad - 1) / pad * pad; }

// The most rows the routing of n_pairs pairs over n_groups experts can take
// once each expert's rows are padded to a multiple of pad: every non-empty
// expert adds at most pad - 1. (0 for bad arguments.)
int fwd_plan_route_rows(int n_pairs, int n_groups, int pad);

// The last i in [0, n) with a[i] <= v (a ascending, n >= 1; 0 when none is).
static inline MS_HD int fwd_plan_last_at_most(const int32_t *a, int n, int v)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (a[mid] <= v) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The expert of padded row `row`: the g with off[g] <= row < off[g + 1]
// (off (n_groups + 1) ascending, as fwd_plan_route writes it); n_groups - 1
// for rows past the end. Empty experts are skipped.
static inline MS_HD int fwd_plan_group_of_row(const int32_t *off, int n_groups, int row)
{
    return fwd_plan_last_at_most(off, n_groups, row);
}

// The host twin of the backends' moe_route op (model/backend.h has the
// contract): pairs p = t * k + j of ids (n_tokens, k) whose expert e is in
// [e0, e1) and whose token is live (live NULL, or live[t] != 0) are sorted
// by expert, tokens ascending within one; expert e's rows start at
// off[e - e0] and are padded to a multiple of pad.
//   off    (e1 - e0 + 1) padded starts; off[e1 - e0] the padded rows in all
//   count  (e1 - e0) each expert's pairs
//   slot   (n_tokens * k) each pair's row, -1 when it is left out
//   token  (rows) each row's token, -1 for a padding row
//   pair   (rows) or NULL: each row's pair, -1 for a padding row
//   cursor (e1 - e0) scratch
// rows is at most fwd_plan_route_rows(n_tokens * k, e1 - e0, pad).
void fwd_plan_route(const int32_t *ids, const int32_t *live, int n_tokens, int k, int e0, int e1,
                     int pad, int32_t *off, int32_t *count, int32_t *slot, int32_t *token,
                     int32_t *pair, int32_t *cursor);

// ---- fixed-size expert-parallel exchanges -------------------------------------------

// The rank owning expert e, when rank p owns [first[p], first[p + 1])
// (first (n_ranks + 1) ascending); -1 when no rank does.
static inline MS_HD int fwd_plan_owner(int e, const int32_t *first, int n_ranks)
{
    if (n_ranks < 1 || e < first[0] || e >= first[n_ranks]) return -1;
    return fwd_plan_last_at_most(first, n_ranks, e);
}

// In a fixed-size return every rank sends each peer one row per pair of the
// peer's tokens (stride rows in all, pair t * k + j at row t * k + j), and
// the peer receives rank q's rows at q * stride: pair (t, j), routed to
// expert e, comes back at owner(e) * stride + t * k + j (-1 when no rank
// owns e).
static inline MS_HD int32_t fwd_plan_return_slot(int e, int t, int j, int k, const int32_t *first,
                                                  int n_ranks, int stride)
{
    const int q = fwd_plan_owner(e, first, n_ranks);
    return q < 0 ? -1 : (int32_t)(q * stride + t * k + j);
}

// ---- decode batch buckets -----------------------------------------------------------

// Decode steps of n sequences run padded to the smallest bucket >= n: 1, 2,
// 4, 8, then multiples of 8 up to 64, then multiples of 32 (vLLM's capture
// sizes, coarser), never past cap (cap itself is the last bucket). Returns
// the bucket, or 0 when n < 1 or n > cap.
int fwd_plan_bucket(int n, int cap);
// All buckets up to cap, ascending, into out (max entries); returns how many
// (out NULL: how many there are).
int fwd_plan_buckets(int cap, int *out, int max);

#ifdef __cplusplus
}
#endif

#endif
