// mma.cuh: what the projection kernels share — gemm.cu's bf16 weights and
// qgemm.cu's quantized ones: the argument block, the tensor-core
// instruction (mma.sync m16n8k16, bf16 inputs, fp32 accumulation), the
// activation loads, and the frame every CTA of them has: which rows its
// tile holds, and the epilogue in which warp 0 adds the warps' partial sums
// in warp order and stores them. Every output is therefore summed in one
// order whatever the rows around it (backend.h: alone or batched).
//
// A CTA computes MM_OUTS (16) outputs for NT x 8 rows: the weights are the
// mma's 16-row A side (lane l holds outputs l / 4 and l / 4 + 8), the rows
// its 8-column B side; its MM_WARPS warps each add up one run of K.
#ifndef MOESERVE_GPU_MMA_CUH
#define MOESERVE_GPU_MMA_CUH

#include <cuda_bf16.h>

#include "gpu/common.cuh"
#include "gpu/plan.h"

#define MM_WARPS 4
#define MM_OUTS 16

struct mm_params {
    const uint16_t *w;              // the matrix (bf16 rows of K; quantized: its blocks), or NULL with wtab
    const uint16_t *const *wtab;    // per group: its matrix (grouped)
    int o0, n_out, K;
    const float *x;
    size_t ldx;
    const int32_t *x_rows;
    float *y;
    size_t ldy;
    const int32_t *y_rows;
    const int32_t *off;             // (n_groups + 1) device, or NULL: one group of `rows`
    int rows;
    const int2 *tiles;              // (group, first row) per blockIdx.y, or NULL: blockIdx.y * rows per tile
    const int *n_tiles;
    int pad;                        // > 0: off (n_groups + 1) padded to tiles of pad (= NT x 8) rows
    int n_groups;
    bool accumulate;
    bool vec;                       // 16-byte loads allowed (K % 8 == 0, ldx % 4 == 0, aligned)
    // Quantized matrices (qgemm.cu; gpu/qlayout.h): format, inputs per
    // group, and the blocks' sizes (quant_block_bytes, its header).
    enum quant_format quant;
    int group;
    size_t block_bytes;
    int header_bytes;
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Eight activations of one row from k (zeros past kend, or for no row).
__device__ __forceinline__ void load_x8(const float *row, int k, int kend, bool vec, float f[8])
{
    if (!row) {
        for (int i = 0; i < 8; i++) f[i] = 0.0f;
        return;
    }
    if (vec && k + 8 <= kend) {
        const float4 a = *reinterpret_cast<const float4 *>(row + k);
        const float4 b = *reinterpret_cast<const float4 *>(row + k + 4);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
        f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        return;
    }
    for (int i = 0; i < 8; i++) f[i] = k + i < kend ? row[k + i] : 0.0f;
}

// This CTA's rows: group *g's [*r0, *r_end), from padded offsets (tile
// blockIdx.y, its group by a binary search: fwd_plan_group_of_row), the
// tile list (grouped) or blockIdx.y. False when the CTA has none (a spare
// tile).
__device__ __forceinline__ bool mm_tile(const mm_params &p, int nt, int *g, int *r0, int *r_end)
{
    *g = 0;
    if (p.pad > 0) {
        *r0 = (int)blockIdx.y * nt * 8;
        if (*r0 >= p.off[p.n_groups]) return false;
        *g = fwd_plan_group_of_row(p.off, p.n_groups, *r0);
        *r_end = p.off[*g + 1];
        return true;
    }
    if (p.tiles) {
        if ((int)blockIdx.y >= *p.n_tiles) return false;
        const int2 t = p.tiles[blockIdx.y];
        *g = t.x;
        *r0 = t.y;
        *r_end = p.off[t.x + 1];
        return true;
    }
    *r0 = (int)blockIdx.y * nt * 8;
    *r_end = p.off ? p.off[1] : p.rows;
    return *r0 < *r_end;
}

// Lane gid's activation row in each 8-row slice of the tile (nullptr past its
// end, and for a padding row: a negative x_rows or y_rows entry, which
// backend.h says is neither read nor written).
template <int NT>
__device__ __forceinline__ void mm_x_rows(const mm_params &p, int r0, int r_end, int gid,
                                          const float *xr[NT])
{
    for (int t = 0; t < NT; t++) {
        const int r = r0 + t * 8 + gid;
        const bool pad = r < r_end && p.y_rows && p.y_rows[r] < 0;
        const int xi = r < r_end && !pad ? (p.x_rows ? p.x_rows[r] : r) : -1;
        xr[t] = xi >= 0 ? p.x + (size_t)xi * p.ldx : nullptr;
    }
}

// The epilogue: every warp leaves its partial sums in red; warp 0 adds them
// in warp order and stores (or adds) outputs otile.. of rows r0.. .
template <int NT>
__device__ __forceinline__ void mm_store(const mm_params &p, float (*red)[NT][4][32],
                                         float acc[NT][4], int otile, int r0, int r_end)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < 4; i++) red[warp][t][i][lane] = acc[t][i];
    __syncthreads();
    if (warp != 0) return;
    for (int t = 0; t < NT; t++) {
        for (int i = 0; i < 4; i++) {
            float s = red[0][t][i][lane];
            for (int q = 1; q < MM_WARPS; q++) s += red[q][t][i][lane];
            const int o = otile + gid + (i >= 2 ? 8 : 0);
            const int r = r0 + t * 8 + tig * 2 + (i & 1);
            if (o >= p.n_out || r >= r_end) continue;
            if ((p.x_rows && p.x_rows[r] < 0) || (p.y_rows && p.y_rows[r] < 0)) continue; // padding
            float *y = p.y + (size_t)(p.y_rows ? p.y_rows[r] : r) * p.ldy + o;
            *y = p.accumulate ? *y + s : s;
        }
    }
}

// The quantized kernels' launcher (qgemm.cu), called by cuda_matmul with its
// grid: blocks of 16 outputs x tiles of 8 (small) or 64 rows.
cudaError_t cuda_qmm_launch(cudaStream_t s, dim3 grid, bool small, const mm_params &p);

#endif
