// gemm: every projection of the forward pass — dense matmuls, the lm_head and
// grouped expert matmuls — as y (rows, n_out) (=|+=) x . w[o0 : o0 + n_out]^T
// with rows gathered from x and scattered into y through index lists.
//
// bf16 weights run on the tensor cores (mma.sync m16n8k16, bf16 inputs, fp32
// accumulation): the weights are the 16-row A side, eight activation rows the
// B side, converted from fp32 to bf16 as they are loaded. One CTA computes 16
// outputs for 8 (decode) or 64 (prefill) rows; its 4 warps split K into fixed
// quarters and add their partial sums in warp order. Every output element is
// therefore summed in the same order whatever the number of rows, the tile a
// row lands in or the path taken: a row computes the same alone or batched.
// The decode path is memory-bound (each weight byte is read once per 8 rows);
// the prefill path reads it once per 64 rows.
//
// Grouped matmuls (experts) take their row ranges from device memory: a
// one-block kernel turns the offsets into a list of (group, first row) tiles,
// and the main grid is sized by a bound the host knows (n_groups + rows / 64),
// so routing never makes a host round trip. Other weight dtypes (f16, f32)
// take a plain fp32 path with the same interface.
#include "gpu/kernels.cuh"

#include <cuda_bf16.h>

#include "gpu/plan.h"

#define MM_WARPS 4
#define MM_OUTS 16

struct mm_params {
    const uint16_t *w;              // bf16 (rows of w, K), or NULL when wtab is used
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
    bool accumulate;
    bool vec;                       // 16-byte loads allowed (K % 8 == 0, ldx % 4 == 0, aligned)
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

// Eight consecutive weights of one row from k (zeros past kend or past the
// matrix's rows), as four bf16 pairs.
__device__ __forceinline__ uint4 load_w8(const uint16_t *row, bool live, int k, int kend, bool vec)
{
    uint4 r = make_uint4(0, 0, 0, 0);
    if (!live) return r;
    if (vec && k + 8 <= kend) return __ldg(reinterpret_cast<const uint4 *>(row + k));
    uint32_t v[4];
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = k + 2 * i < kend ? row[k + 2 * i] : 0;
        const uint32_t hi = k + 2 * i + 1 < kend ? row[k + 2 * i + 1] : 0;
        v[i] = lo | hi << 16;
    }
    return make_uint4(v[0], v[1], v[2], v[3]);
}

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

template <int NT>
__global__ void __launch_bounds__(MM_WARPS * 32) mm_bf16_kernel(const mm_params p)
{
    __shared__ float red[MM_WARPS][NT][4][32];
    int g = 0, r0, r_end;
    if (p.tiles) {
        if ((int)blockIdx.y >= *p.n_tiles) return;
        const int2 t = p.tiles[blockIdx.y];
        g = t.x;
        r0 = t.y;
        r_end = p.off[g + 1];
    } else {
        r0 = (int)blockIdx.y * NT * 8;
        r_end = p.off ? p.off[1] : p.rows;
        if (r0 >= r_end) return;
    }
    const uint16_t *w = p.wtab ? p.wtab[g] : p.w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int otile = (int)blockIdx.x * MM_OUTS, K = p.K;
    const bool live_lo = otile + gid < p.n_out, live_hi = otile + gid + 8 < p.n_out;
    const uint16_t *w_lo = w + (size_t)(p.o0 + otile + gid) * K;
    const uint16_t *w_hi = w + (size_t)(p.o0 + otile + gid + 8) * K;
    const float *xr[NT];
    for (int t = 0; t < NT; t++) {
        const int r = r0 + t * 8 + gid;
        xr[t] = r < r_end ? p.x + (size_t)(p.x_rows ? p.x_rows[r] : r) * p.ldx : nullptr;
    }
    float acc[NT][4];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    // This warp's quarter of K, in whole 32-element steps.
    const int steps = (K + 31) / 32, per = (steps + MM_WARPS - 1) / MM_WARPS;
    const int k_begin = warp * per * 32, k_end = min(K, (warp + 1) * per * 32);
    for (int kb = k_begin; kb < k_end; kb += 32) {
        const int k = kb + tig * 8;
        const uint4 a = load_w8(w_lo, live_lo, k, k_end, p.vec);
        const uint4 b = load_w8(w_hi, live_hi, k, k_end, p.vec);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float f[8];
            load_x8(xr[t], k, k_end, p.vec, f);
            mma_bf16(acc[t], a.x, b.x, a.y, b.y, pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]));
            mma_bf16(acc[t], a.z, b.z, a.w, b.w, pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
        }
    }
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < 4; i++) red[warp][t][i][lane] = acc[t][i];
    __syncthreads();
    // Warp 0 adds the quarters in order; the others are done.
    if (warp != 0) return;
    for (int t = 0; t < NT; t++) {
        for (int i = 0; i < 4; i++) {
            float s = red[0][t][i][lane];
            for (int q = 1; q < MM_WARPS; q++) s += red[q][t][i][lane];
            const int o = otile + gid + (i >= 2 ? 8 : 0);
            const int r = r0 + t * 8 + tig * 2 + (i & 1);
            if (o >= p.n_out || r >= r_end) continue;
            float *y = p.y + (size_t)(p.y_rows ? p.y_rows[r] : r) * p.ldy + o;
            *y = p.accumulate ? *y + s : s;
        }
    }
}

// The tiles of every group (plan_group_tiles's twin): group g's rows [off[g], off[g + 1]) in runs of
// `rows_per_tile`, groups in order. One block; n_groups is small (experts).
__global__ void mm_tiles_kernel(const int32_t *off, int n_groups, int rows_per_tile, int2 *tiles,
                                int *n_tiles, int max_tiles)
{
    __shared__ int base[1025];
    if (threadIdx.x == 0) {
        int at = 0;
        for (int g = 0; g < n_groups; g++) {
            base[g] = at;
            const int n = off[g + 1] - off[g];
            at += n > 0 ? (n + rows_per_tile - 1) / rows_per_tile : 0;
        }
        base[n_groups] = at;
        *n_tiles = at < max_tiles ? at : max_tiles;
    }
    __syncthreads();
    for (int g = threadIdx.x; g < n_groups; g += blockDim.x)
        for (int i = base[g]; i < base[g + 1] && i < max_tiles; i++)
            tiles[i] = make_int2(g, off[g] + (i - base[g]) * rows_per_tile);
}

// f16 / f32 weights: one thread per (row, output), fp32 in k order.
__global__ void mm_plain_kernel(const mm_params p, const void *const *wtab_any, const void *w_any,
                                enum dtype wt, int n_groups, int total_rows)
{
    const int o = (int)(blockIdx.y * blockDim.x + threadIdx.x), r = (int)blockIdx.x;
    if (o >= p.n_out || r >= total_rows) return;
    int g = 0;
    if (p.off) {
        if (r >= p.off[n_groups]) return;
        while (g + 1 < n_groups && p.off[g + 1] <= r) g++;
    }
    const void *w = wtab_any ? wtab_any[g] : w_any;
    const float *x = p.x + (size_t)(p.x_rows ? p.x_rows[r] : r) * p.ldx;
    const size_t base = (size_t)(p.o0 + o) * p.K;
    float s = 0.0f;
    for (int k = 0; k < p.K; k++) s += x[k] * load_elem(w, wt, base + k);
    float *y = p.y + (size_t)(p.y_rows ? p.y_rows[r] : r) * p.ldy + o;
    *y = p.accumulate ? *y + s : s;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

cudaError_t cuda_matmul(cudaStream_t s, const struct cuda_mm *m)
{
    if (m->n_out <= 0 || (!m->off && m->rows <= 0) || m->max_rows <= 0) return cudaSuccess;
    mm_params p = {};
    p.o0 = m->o0;
    p.n_out = m->n_out;
    p.K = m->K;
    p.x = m->x;
    p.ldx = m->ldx;
    p.x_rows = m->x_rows;
    p.y = m->y;
    p.ldy = m->ldy;
    p.y_rows = m->y_rows;
    p.off = m->off;
    p.rows = m->rows;
    p.accumulate = m->accumulate;
    const unsigned ox = ceil_div_u((size_t)m->n_out, MM_OUTS);
    if (m->wtype != DTYPE_BF16) {
        const int n_groups = m->off ? m->n_groups : 1;
        dim3 grid((unsigned)m->max_rows, ceil_div_u((size_t)m->n_out, 128));
        mm_plain_kernel<<<grid, 128, 0, s>>>(p, (const void *const *)m->wtab, m->w, m->wtype,
                                              n_groups, m->max_rows);
        return launch_status();
    }
    p.w = (const uint16_t *)m->w;
    p.wtab = (const uint16_t *const *)m->wtab;
    p.vec = m->K % 8 == 0 && m->ldx % 4 == 0 && aligned16(m->x) &&
            (m->wtab || aligned16(m->w));
    // Few rows per group: eight rows a tile (decode); else 64.
    const bool small = m->max_group_rows <= 8;
    const int per_tile = small ? 8 : 64;
    unsigned ny;
    if (m->off && m->n_groups > 0) {
        if (m->n_groups > 1024) return cudaErrorInvalidValue;
        const int max_tiles = plan_group_tiles_bound(m->n_groups, m->max_rows, per_tile);
        if (max_tiles <= 0) return cudaSuccess;
        if (max_tiles > m->tiles_cap || max_tiles > 65535) return cudaErrorInvalidValue;
        mm_tiles_kernel<<<1, 256, 0, s>>>(m->off, m->n_groups, per_tile, m->tiles, m->n_tiles,
                                          max_tiles);
        cudaError_t e = launch_status();
        if (e != cudaSuccess) return e;
        p.tiles = m->tiles;
        p.n_tiles = m->n_tiles;
        ny = (unsigned)max_tiles;
    } else {
        p.off = nullptr;
        ny = ceil_div_u((size_t)m->rows, (size_t)per_tile);
    }
    for (unsigned y0 = 0; y0 < ny; y0 += 65535) {
        // grid.y is at most 65535: longer row lists go in slices of tiles.
        dim3 grid(ox, ny - y0 < 65535 ? ny - y0 : 65535);
        mm_params q = p;
        if (!q.tiles && y0) {
            const size_t skip = (size_t)y0 * per_tile;
            q.x_rows = p.x_rows ? p.x_rows + skip : nullptr;
            q.y_rows = p.y_rows ? p.y_rows + skip : nullptr;
            if (!p.x_rows) q.x = p.x + skip * p.ldx;
            if (!p.y_rows) q.y = p.y + skip * p.ldy;
            q.rows = p.rows - (int)skip;
        }
        if (small) mm_bf16_kernel<1><<<grid, MM_WARPS * 32, 0, s>>>(q);
        else mm_bf16_kernel<8><<<grid, MM_WARPS * 32, 0, s>>>(q);
        cudaError_t e = launch_status();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
