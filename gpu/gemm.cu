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
// Grouped matmuls (experts) take their row ranges from device memory, so
// routing never makes a host round trip. Offsets moe_route padded to the
// tile (8 or 64 rows) make the tiles implicit: tile i is rows [i x tile, (i +
// 1) x tile), its group found by a binary search of the offsets, padding
// rows (a negative row index) skipped, spare tiles past the end exiting.
// Other offsets go through a one-block kernel that turns them into a list of
// (group, first row) tiles. Either way the grid is sized by a bound the host
// knows. Quantized weights (fp8, int8, int4) take qgemm.cu's kernels on the
// same grid (mma.cuh's tile frame: the same padding); other weight dtypes
// (f16, f32) and quantized groups off the 32-input steps a plain fp32 path
// with the same interface.
#include "gpu/kernels.cuh"

#include "gpu/mma.cuh"
#include "gpu/plan.h"
#include "gpu/qlayout.h"

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

template <int NT>
__global__ void __launch_bounds__(MM_WARPS * 32) mm_bf16_kernel(const mm_params p)
{
    __shared__ float red[MM_WARPS][NT][4][32];
    int g, r0, r_end;
    if (!mm_tile(p, NT, &g, &r0, &r_end)) return;
    const uint16_t *w = p.wtab ? p.wtab[g] : p.w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int otile = (int)blockIdx.x * MM_OUTS, K = p.K;
    const bool live_lo = otile + gid < p.n_out, live_hi = otile + gid + 8 < p.n_out;
    const uint16_t *w_lo = w + (size_t)(p.o0 + otile + gid) * K;
    const uint16_t *w_hi = w + (size_t)(p.o0 + otile + gid + 8) * K;
    const float *xr[NT];
    mm_x_rows<NT>(p, r0, r_end, gid, xr);
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
    mm_store<NT>(p, red, acc, otile, r0, r_end);
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

// f16 / f32 weights, and quantized ones the tensor-core kernel does not
// read (ql_tensor_cores): one thread per (row, output), fp32 in k order.
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
    if ((p.x_rows && p.x_rows[r] < 0) || (p.y_rows && p.y_rows[r] < 0)) return; // padding
    const void *w = wtab_any ? wtab_any[g] : w_any;
    const float *x = p.x + (size_t)(p.x_rows ? p.x_rows[r] : r) * p.ldx;
    const size_t base = (size_t)(p.o0 + o) * p.K;
    float s = 0.0f;
    if (p.quant != QUANT_NONE) {
        const int row = p.o0 + o;
        const uint8_t *blk = (const uint8_t *)w + (size_t)(row / QUANT_BLOCK_ROWS) * p.block_bytes;
        for (int k = 0; k < p.K; k++)
            s += x[k] * ql_value(blk, (size_t)p.header_bytes, p.quant, p.K, p.group,
                                 row % QUANT_BLOCK_ROWS, k);
    } else {
        for (int k = 0; k < p.K; k++) s += x[k] * load_elem(w, wt, base + k);
    }
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
    if (m->quant != QUANT_NONE) {
        if (m->group <= 0) return cudaErrorInvalidValue;
        p.quant = m->quant;
        p.group = m->group;
        p.block_bytes = quant_block_bytes(m->quant, m->K, m->group);
        p.header_bytes = (int)quant_block_header_bytes(m->quant, m->K, m->group);
    }
    if (m->quant != QUANT_NONE ? !ql_tensor_cores(m->K, m->group, m->o0) : m->wtype != DTYPE_BF16) {
        const int n_groups = m->off ? m->n_groups : 1;
        // grid.y is at most 65535 blocks of 128 outputs: wider matrices go
        // in slices of outputs (each its own o0 and first column of y).
        const int slice = 65535 * 128;
        for (int o = 0; o < m->n_out; o += slice) {
            mm_params q = p;
            q.o0 = p.o0 + o;
            q.n_out = m->n_out - o < slice ? m->n_out - o : slice;
            q.y = p.y + o;
            dim3 grid((unsigned)m->max_rows, ceil_div_u((size_t)q.n_out, 128));
            mm_plain_kernel<<<grid, 128, 0, s>>>(q, (const void *const *)m->wtab, m->w, m->wtype,
                                                  n_groups, m->max_rows);
            cudaError_t e = launch_status();
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    p.w = (const uint16_t *)m->w;
    p.wtab = (const uint16_t *const *)m->wtab;
    // Quantized blocks are 64-byte aligned whatever K (gpu/qlayout.h).
    p.vec = (m->quant != QUANT_NONE || m->K % 8 == 0) && m->ldx % 4 == 0 && aligned16(m->x) &&
            (m->wtab || aligned16(m->w));
    // Few rows per group: eight rows a tile (decode); else 64. Offsets
    // padded to one of the two pick it.
    const bool padded = m->off && m->n_groups > 0 && (m->pad == 8 || m->pad == 64);
    const bool small = padded ? m->pad == 8 : m->max_group_rows <= 8;
    const int per_tile = small ? 8 : 64;
    unsigned ny;
    if (padded) {
        const size_t tiles = ((size_t)m->max_rows + per_tile - 1) / per_tile;
        if (tiles > 65535) return cudaErrorInvalidValue;
        p.pad = per_tile;
        p.n_groups = m->n_groups;
        ny = (unsigned)tiles;
    } else if (m->off && m->n_groups > 0) {
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
        if (!q.tiles && !q.pad && y0) {
            const size_t skip = (size_t)y0 * per_tile;
            q.x_rows = p.x_rows ? p.x_rows + skip : nullptr;
            q.y_rows = p.y_rows ? p.y_rows + skip : nullptr;
            if (!p.x_rows) q.x = p.x + skip * p.ldx;
            if (!p.y_rows) q.y = p.y + skip * p.ldy;
            q.rows = p.rows - (int)skip;
        }
        cudaError_t e;
        if (q.quant != QUANT_NONE) {
            e = cuda_qmm_launch(s, grid, small, q);
        } else {
            if (small) mm_bf16_kernel<1><<<grid, MM_WARPS * 32, 0, s>>>(q);
            else mm_bf16_kernel<8><<<grid, MM_WARPS * 32, 0, s>>>(q);
            e = launch_status();
        }
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
