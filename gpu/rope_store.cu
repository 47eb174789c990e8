// rope_store: layer l's q_norm / k_norm over each head, NeoX RoPE at each
// token's position, then K (transposed: (head_dim, 16) per block) and V
// ((16, head_dim) per block) into the token's slot of its sequence's block —
// the CPU backend's layout, so that either backend reads the other's pool.
// One warp per (token, head); the angles in double as the CPU computes them.
#include "gpu/kernels.cuh"

#define ROPE_WARPS 4

__global__ void rope_store_kernel(const struct cuda_rope p)
{
    extern __shared__ float sh[]; // (ROPE_WARPS, head_dim)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x, head = (int)blockIdx.y * ROPE_WARPS + warp;
    const int H = p.n_heads, KVH = p.n_kv_heads, D = p.head_dim, half = D / 2;
    if (head >= H + KVH) return;
    const bool is_q = head < H;
    const int h = is_q ? head : head - H;
    float *x = is_q ? p.q + ((size_t)t * H + h) * D : p.k + ((size_t)t * KVH + h) * D;
    const void *nw = is_q ? p.q_norm : p.k_norm;
    const enum dtype nt = is_q ? p.q_norm_t : p.k_norm_t;
    float *tmp = sh + (size_t)warp * D;
    double ss = 0;
    for (int i = lane; i < D; i += 32) ss += (double)x[i] * x[i];
    ss = warp_sum_d(ss);
    const float scale = 1.0f / sqrtf((float)(ss / D) + p.eps);
    for (int i = lane; i < D; i += 32) tmp[i] = x[i] * scale * load_elem(nw, nt, i);
    __syncwarp();
    const int pos = p.tok_pos[t];
    for (int i = lane; i < half; i += 32) {
        const double a = (double)pos * p.inv_freq[i];
        const float c = (float)cos(a), s = (float)sin(a);
        const float x0 = tmp[i], x1 = tmp[i + half];
        // Each product rounded on its own, as the CPU tables' rope (no FMA
        // contraction) computes them: nvcc would otherwise fuse one of them.
        x[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        x[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
    if (is_q) return;
    __syncwarp();
    const int32_t *blocks = p.bt + p.bt_start[p.tok_seq[t]];
    const size_t blk = (size_t)blocks[pos / KV_BLOCK_TOKENS], slot = (size_t)(pos % KV_BLOCK_TOKENS);
    const size_t at = (blk * KVH + (size_t)h) * KV_BLOCK_TOKENS * D;
    const float *v = p.v + ((size_t)t * KVH + h) * D;
    for (int i = lane; i < D; i += 32) {
        store_elem(p.kl, p.kv_dtype, at + (size_t)i * KV_BLOCK_TOKENS + slot, x[i]);
        store_elem(p.vl, p.kv_dtype, at + slot * D + i, v[i]);
    }
}

cudaError_t cuda_rope_store(cudaStream_t s, const struct cuda_rope *p)
{
    if (p->n_tokens <= 0) return cudaSuccess;
    dim3 grid((unsigned)p->n_tokens, ceil_div_u((size_t)(p->n_heads + p->n_kv_heads), ROPE_WARPS));
    const size_t smem = (size_t)ROPE_WARPS * p->head_dim * sizeof(float);
    // Past 48 KiB (head_dim above 3072, which config.json may give) only
    // with the opt-in, as attention.cu does.
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(rope_store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) return e;
    }
    rope_store_kernel<<<grid, ROPE_WARPS * 32, smem, s>>>(*p);
    return launch_status();
}
