// moe_route: a MoE layer's (token, slot) pairs of experts [e0, e1) sorted by
// expert on the device, tokens ascending within an expert (a stable counting
// sort), each expert's rows padded to a multiple of the grouped matmul's
// tile — fwd_plan_route's twin, with no host round trip. One block counts,
// scans, marks the padding rows, then places the pairs in chunks of its
// threads: within a warp by __match_any_sync ranks, across warps through a
// per-chunk table of warp counts, so the order is the pairs' order whatever
// the timing. Pairs of other experts and of dead tokens get slot -1.
#include "gpu/kernels.cuh"

#define ROUTE_THREADS 1024
#define ROUTE_WARPS (ROUTE_THREADS / 32)

__global__ void __launch_bounds__(ROUTE_THREADS) moe_route_kernel(const struct cuda_route r)
{
    extern __shared__ int32_t sm[];
    const int n = r.e1 - r.e0, P = r.n_tokens * r.k;
    int32_t *cnt = sm;              // (n + 1) counts, then padded offsets
    int32_t *fill = cnt + n + 1;    // (n) rows placed so far
    int32_t *wc = fill + n;         // (ROUTE_WARPS, n) this chunk's count per warp, then its base
    int32_t *real = wc + ROUTE_WARPS * n; // (n) each expert's pairs
    for (int e = threadIdx.x; e <= n; e += blockDim.x) cnt[e] = 0;
    for (int e = threadIdx.x; e < n; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        // Compared before subtracting: an id is any int32, and id - e0 could overflow.
        const int id = r.ids[p];
        if (id >= r.e0 && id < r.e1 && (!r.live || r.live[p / r.k])) atomicAdd(&cnt[id - r.e0 + 1], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0; e < n; e++) {
            real[e] = cnt[e + 1];
            cnt[e + 1] = cnt[e] + fwd_plan_padded(real[e], r.pad);
        }
    __syncthreads();
    for (int e = threadIdx.x; e <= n; e += blockDim.x) r.off[e] = cnt[e];
    if (r.count)
        for (int e = threadIdx.x; e < n; e += blockDim.x) r.count[e] = real[e];
    // Padding rows: each expert's last (padded - real) rows.
    for (int e = 0; e < n; e++)
        for (int i = real[e] + (int)threadIdx.x; cnt[e] + i < cnt[e + 1]; i += blockDim.x) {
            r.token[cnt[e] + i] = -1;
            if (r.pair) r.pair[cnt[e] + i] = -1;
        }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < P; base += ROUTE_THREADS) {
        for (int i = threadIdx.x; i < ROUTE_WARPS * n; i += blockDim.x) wc[i] = 0;
        __syncthreads();
        const int p = base + threadIdx.x;
        int e = p < P && r.ids[p] >= r.e0 && r.ids[p] < r.e1 ? r.ids[p] - r.e0 : -1;
        if (p < P && r.live && !r.live[p / r.k]) e = -1;
        const bool placed = e >= 0;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(same & ((1u << lane) - 1));
        if (placed && rank == 0) wc[warp * n + e] = __popc(same);
        __syncthreads();
        // Each expert's warps in order: counts become bases.
        for (int x = threadIdx.x; x < n; x += blockDim.x) {
            int at = fill[x];
            for (int w = 0; w < ROUTE_WARPS; w++) {
                const int c = wc[w * n + x];
                wc[w * n + x] = at;
                at += c;
            }
            fill[x] = at;
        }
        __syncthreads();
        if (p < P) {
            if (placed) {
                const int s = cnt[e] + wc[warp * n + e] + rank;
                r.slot[p] = s;
                r.token[s] = p / r.k;
                if (r.pair) r.pair[s] = p;
            } else {
                r.slot[p] = -1;
            }
        }
        __syncthreads();
    }
}

size_t cuda_moe_route_smem(int n_experts)
{
    return sizeof(int32_t) * ((size_t)3 * n_experts + 1 + (size_t)ROUTE_WARPS * n_experts);
}

cudaError_t cuda_moe_route(cudaStream_t s, const struct cuda_route *r)
{
    const size_t smem = cuda_moe_route_smem(r->e1 - r->e0);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(moe_route_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    moe_route_kernel<<<1, ROUTE_THREADS, smem, s>>>(*r);
    return launch_status();
}
