// attention: causal attention of every new token over its sequence's paged
// KV (keys (head_dim, 16) and values (16, head_dim) per block), prefill
// chunks and decode rows in one launch, driven by plan_attention's items —
// or, for a decode step, by items each CTA derives from its token's position
// (plan_decode_item), so that the launch depends only on the number of
// sequences and a recorded graph replays any decode step of its size.
//
// One CTA per (item, KV head): a tile of a sequence's new tokens with every
// query head of the KV head's group, so each KV block is read from memory
// once for all of them. Scores, an online softmax and the weighted values
// stay in shared memory. The KV positions are cut into fixed chunks (plan.h):
// each chunk starts a fresh softmax state, and chunk states are folded into
// the token's result in chunk order by fold() — in the CTA, or, when a
// decode step splits a tile's chunks over several CTAs (split-KV) to fill
// the GPU, in the combine kernel from the partial sets they leave. Either
// way the same operations run in the same order, so a token's output does
// not depend on its tile, its batch or the split. fp32 throughout (the CPU
// reference uses double: within 1e-5 of it).
#include "gpu/kernels.cuh"

#include <math.h>

#define ATT_THREADS 256

// Shared floats one CTA uses for `rows` rows of head_dim d: Q, the chunk's
// accumulator, the folded numerator, a K and a V block, the scores, and six
// per-row scalars.
size_t cuda_attention_smem(int rows, int d)
{
    return sizeof(float) * ((size_t)3 * rows * d + (size_t)2 * KV_BLOCK_TOKENS * d +
                            (size_t)rows * KV_BLOCK_TOKENS + 6 * (size_t)rows);
}

// The weights that fold a chunk state (m, l) into a running state (M, D):
// new = old * a + chunk * b, both at the new maximum. The intrinsics keep
// the compiler from contracting differently in the two kernels.
struct fold_w {
    float a, b, m;
};

__device__ __forceinline__ fold_w fold_weights(float M, float m)
{
    fold_w w;
    w.m = fmaxf(M, m);
    w.a = M == -INFINITY ? 0.0f : expf(__fsub_rn(M, w.m));
    w.b = m == -INFINITY ? 0.0f : expf(__fsub_rn(m, w.m));
    return w;
}

__device__ __forceinline__ float fold(float old, float chunk, const fold_w &w)
{
    return __fadd_rn(__fmul_rn(old, w.a), __fmul_rn(chunk, w.b));
}

__global__ void __launch_bounds__(ATT_THREADS) attention_kernel(const struct cuda_attn p)
{
    extern __shared__ float sm[];
    const int h = blockIdx.y, D = p.head_dim, G = p.n_q, H = p.n_kv_heads * G;
    struct plan_attn_item it;
    if (p.items) {
        it = p.items[blockIdx.x];
    } else {
        const int s = (int)blockIdx.x / p.split, j = (int)blockIdx.x % p.split;
        if (!plan_decode_item(s, p.tok_pos[s], j, p.split, p.chunk, H, p.max_chunks, &it)) return;
    }
    const int R = it.n_tok * G, CH = p.chunk;
    float *Q = sm, *ACC = Q + (size_t)R * D, *NUM = ACC + (size_t)R * D;
    float *Ks = NUM + (size_t)R * D, *Vs = Ks + (size_t)KV_BLOCK_TOKENS * D;
    float *S = Vs + (size_t)KV_BLOCK_TOKENS * D, *M = S + (size_t)R * KV_BLOCK_TOKENS;
    float *L = M + R, *C = L + R, *FM = C + R, *FD = FM + R, *FA = FD + R;
    // Rows are token-major: row r is token r / G, query head h * G + r % G.
    for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        Q[idx] = p.q[((size_t)(it.t0 + r / G) * H + (size_t)h * G + r % G) * D + d];
        NUM[idx] = 0.0f;
    }
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        FM[r] = -INFINITY;
        FD[r] = 0.0f;
    }
    // The output loop reads FM and FD from other threads. The chunk loop's
    // barriers order those reads after these writes only when the item has
    // positions; this one orders them for any item.
    __syncthreads();
    const int first_pos = p.tok_pos[it.t0];
    const int32_t *blocks = p.bt + p.bt_start[it.seq];
    const size_t blk_elems = (size_t)KV_BLOCK_TOKENS * D;
    for (int c0 = it.p0; c0 < it.p1; c0 += CH) {
        const int c1 = min(c0 + CH, it.p1);
        // A fresh softmax state for the chunk.
        for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) ACC[idx] = 0.0f;
        for (int r = threadIdx.x; r < R; r += blockDim.x) {
            M[r] = -INFINITY;
            L[r] = 0.0f;
        }
        __syncthreads();
        for (int p0 = c0; p0 < c1; p0 += KV_BLOCK_TOKENS) {
            const size_t at = ((size_t)blocks[p0 / KV_BLOCK_TOKENS] * p.n_kv_heads + h) * blk_elems;
            for (int idx = threadIdx.x; idx < KV_BLOCK_TOKENS * D; idx += blockDim.x) {
                Ks[idx] = load_elem(p.k, p.kv_dtype, at + idx);
                Vs[idx] = load_elem(p.v, p.kv_dtype, at + idx);
            }
            __syncthreads();
            for (int idx = threadIdx.x; idx < R * KV_BLOCK_TOKENS; idx += blockDim.x) {
                const int r = idx / KV_BLOCK_TOKENS, j = idx % KV_BLOCK_TOKENS, pos = p0 + j;
                float s = -INFINITY;
                if (pos < c1 && pos <= first_pos + r / G) {
                    const float *qr = Q + (size_t)r * D;
                    float dot = 0.0f;
                    for (int d = 0; d < D; d++) dot = fmaf(qr[d], Ks[d * KV_BLOCK_TOKENS + j], dot);
                    s = dot * p.scale;
                }
                S[idx] = s;
            }
            __syncthreads();
            for (int r = threadIdx.x; r < R; r += blockDim.x) {
                float *sr = S + (size_t)r * KV_BLOCK_TOKENS;
                float mx = M[r];
                for (int j = 0; j < KV_BLOCK_TOKENS; j++) mx = fmaxf(mx, sr[j]);
                float corr = 1.0f, sum = 0.0f;
                if (mx == -INFINITY) {
                    for (int j = 0; j < KV_BLOCK_TOKENS; j++) sr[j] = 0.0f;
                } else {
                    corr = M[r] == -INFINITY ? 0.0f : expf(M[r] - mx);
                    for (int j = 0; j < KV_BLOCK_TOKENS; j++) {
                        sr[j] = sr[j] == -INFINITY ? 0.0f : expf(sr[j] - mx);
                        sum += sr[j];
                    }
                }
                L[r] = L[r] * corr + sum;
                C[r] = corr;
                M[r] = mx;
            }
            __syncthreads();
            for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
                const int r = idx / D, d = idx % D;
                const float *sr = S + (size_t)r * KV_BLOCK_TOKENS;
                float a = ACC[idx] * C[r];
                // Only the slots the row may see: the rest of the block holds
                // what its previous owner wrote, and a weight of 0 times an
                // Inf or NaN there is NaN (the CPU twin never reads them).
                const int jn = max(0, min(KV_BLOCK_TOKENS, min(c1, first_pos + r / G + 1) - p0));
                for (int j = 0; j < jn; j++) a = fmaf(sr[j], Vs[j * D + d], a);
                ACC[idx] = a;
            }
            __syncthreads();
        }
        if (it.part >= 0) {
            // Split: this chunk's state goes to its partial set.
            const size_t set = (size_t)it.part + (size_t)((c0 - it.p0) / CH) * it.n_tok * H;
            for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
                const int r = idx / D, d = idx % D;
                const size_t row = set + (size_t)(r / G) * H + h * G + r % G;
                p.part_acc[row * D + d] = ACC[idx];
                if (d == 0) {
                    p.part_m[row] = M[r];
                    p.part_l[row] = L[r];
                }
            }
        } else {
            // Whole: fold the chunk into the running state.
            for (int r = threadIdx.x; r < R; r += blockDim.x) {
                const fold_w w = fold_weights(FM[r], M[r]);
                FA[r] = w.a;
                C[r] = w.b;
                FD[r] = fold(FD[r], L[r], w);
                FM[r] = w.m;
            }
            __syncthreads();
            for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
                const int r = idx / D;
                fold_w w;
                w.a = FA[r];
                w.b = C[r];
                NUM[idx] = fold(NUM[idx], ACC[idx], w);
            }
        }
        __syncthreads();
    }
    if (it.part >= 0) return;
    for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        p.out[((size_t)(it.t0 + r / G) * H + h * G + r % G) * D + d] =
            FD[r] > 0 ? NUM[idx] / FD[r] : 0.0f;
    }
}

// One CTA per (combine entry, token of its tile, query head): the chunk
// states folded in chunk order, exactly as the attention kernel folds them.
__global__ void attention_combine_kernel(const struct cuda_attn p)
{
    const int i = blockIdx.y, head = blockIdx.z, D = p.head_dim, H = p.n_kv_heads * p.n_q;
    struct plan_attn_combine c;
    if (p.combine) c = p.combine[blockIdx.x];
    else if (!plan_decode_combine((int)blockIdx.x, p.tok_pos[blockIdx.x], p.split, p.chunk, H,
                                  p.max_chunks, &c))
        return;
    if (i >= c.n_tok) return;
    const size_t stride = (size_t)c.n_tok * H, row0 = (size_t)c.part0 + (size_t)i * H + head;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float fm = -INFINITY, fd = 0.0f, num = 0.0f;
        for (int s = 0; s < c.n_chunk; s++) {
            const size_t row = row0 + s * stride;
            const fold_w w = fold_weights(fm, p.part_m[row]);
            fd = fold(fd, p.part_l[row], w);
            num = fold(num, p.part_acc[row * D + d], w);
            fm = w.m;
        }
        p.out[((size_t)(c.t0 + i) * H + head) * D + d] = fd > 0 ? num / fd : 0.0f;
    }
}

cudaError_t cuda_attention(cudaStream_t s, const struct cuda_attn *p)
{
    if (p->n_items <= 0) return cudaSuccess;
    const size_t smem = cuda_attention_smem(p->tile_tokens * p->n_q, p->head_dim);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attention_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    attention_kernel<<<dim3((unsigned)p->n_items, (unsigned)p->n_kv_heads), ATT_THREADS, smem, s>>>(*p);
    cudaError_t e = launch_status();
    if (e != cudaSuccess || p->n_combine <= 0) return e;
    const unsigned H = (unsigned)(p->n_kv_heads * p->n_q);
    attention_combine_kernel<<<dim3((unsigned)p->n_combine, (unsigned)p->tile_tokens, H), 128, 0, s>>>(*p);
    return launch_status();
}
