// router_topk: per token the k largest router logits (ties: lowest id, NaN
// never wins), softmax weights over all experts in double, renormalised over
// the k when norm_topk — cpu_router_topk's arithmetic, one thread per row
// (a router row is a few hundred floats).
#include "gpu/kernels.cuh"

__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ double softmax_num(float v, double mx)
{
    return isnan(v) ? 0.0 : exp((double)v - mx);
}

__global__ void router_topk_kernel(const float *logits, int n, int n_experts, int k, bool norm,
                                   int32_t *ids, float *w)
{
    // In size_t: blockIdx.x x blockDim.x passes INT_MAX in the last blocks of
    // a grid for n near it.
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n) return;
    const float *l = logits + (size_t)t * n_experts;
    int32_t *id = ids + (size_t)t * k;
    float *wt = w + (size_t)t * k;
    float prev_v = INFINITY;
    int prev_i = -1;
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bv = -INFINITY;
        for (int i = 0; i < n_experts; i++) {
            const float v = isnan(l[i]) ? -INFINITY : l[i];
            if (j > 0 && !ranks_before(prev_v, prev_i, v, i)) continue;
            if (best < 0 || ranks_before(v, i, bv, best)) {
                best = i;
                bv = v;
            }
        }
        id[j] = best;
        prev_v = bv;
        prev_i = best;
    }
    double mx = l[id[0]];
    if (!isfinite(mx)) mx = 0;
    double den = 0;
    if (norm)
        for (int j = 0; j < k; j++) den += softmax_num(l[id[j]], mx);
    else
        for (int i = 0; i < n_experts; i++) den += softmax_num(l[i], mx);
    for (int j = 0; j < k; j++)
        wt[j] = den > 0 ? (float)(softmax_num(l[id[j]], mx) / den) : 1.0f / (float)k;
}

cudaError_t cuda_router_topk(cudaStream_t s, const float *logits, int n, int n_experts, int k,
                             bool norm_topk, int32_t *ids, float *weights)
{
    if (n <= 0) return cudaSuccess;
    router_topk_kernel<<<ceil_div_u((size_t)n, 64), 64, 0, s>>>(logits, n, n_experts, k, norm_topk,
                                                                ids, weights);
    return launch_status();
}
