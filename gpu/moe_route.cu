// moe_route: the (token, slot) pairs sorted by expert on the device, tokens
// ascending within an expert (a stable counting sort), with no host round
// trip: one block counts, scans, then places the pairs in chunks of its
// threads — within a warp by __match_any_sync ranks, across warps through a
// per-chunk table of warp counts, so the order is the pairs' order whatever
// the timing. Pairs naming an expert out of range are left out (the CPU
// backend refuses them; the router never makes them).
#include "gpu/kernels.cuh"

#define ROUTE_THREADS 1024
#define ROUTE_WARPS (ROUTE_THREADS / 32)

__global__ void __launch_bounds__(ROUTE_THREADS) moe_route_kernel(const int32_t *ids, int P, int k,
                                                                  int E, int32_t *off,
                                                                  int32_t *slot, int32_t *token)
{
    extern __shared__ int32_t sm[];
    int32_t *cnt = sm;              // (E + 1) counts, then offsets
    int32_t *fill = cnt + E + 1;    // (E) rows placed so far
    int32_t *wc = fill + E;         // (ROUTE_WARPS, E) this chunk's count per warp, then its base
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e + 1], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) off[e] = cnt[e];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < P; base += ROUTE_THREADS) {
        for (int i = threadIdx.x; i < ROUTE_WARPS * E; i += blockDim.x) wc[i] = 0;
        __syncthreads();
        const int p = base + threadIdx.x;
        const int e = p < P ? ids[p] : -1;
        const bool live = e >= 0 && e < E;
        const unsigned same = __match_any_sync(0xffffffffu, live ? e : -1);
        const int rank = __popc(same & ((1u << lane) - 1));
        if (live && rank == 0) wc[warp * E + e] = __popc(same);
        __syncthreads();
        // Each expert's warps in order: counts become bases.
        for (int x = threadIdx.x; x < E; x += blockDim.x) {
            int at = fill[x];
            for (int w = 0; w < ROUTE_WARPS; w++) {
                const int c = wc[w * E + x];
                wc[w * E + x] = at;
                at += c;
            }
            fill[x] = at;
        }
        __syncthreads();
        if (live) {
            const int s = cnt[e] + wc[warp * E + e] + rank;
            slot[p] = s;
            token[s] = p / k;
        }
        __syncthreads();
    }
}

size_t cuda_moe_route_smem(int n_experts)
{
    return sizeof(int32_t) * ((size_t)2 * n_experts + 1 + (size_t)ROUTE_WARPS * n_experts);
}

cudaError_t cuda_moe_route(cudaStream_t s, const int32_t *ids, int n_tokens, int k, int n_experts,
                           int32_t *off, int32_t *slot, int32_t *token)
{
    const size_t smem = cuda_moe_route_smem(n_experts);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(moe_route_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    moe_route_kernel<<<1, ROUTE_THREADS, smem, s>>>(ids, n_tokens * k, k, n_experts, off, slot, token);
    return launch_status();
}
