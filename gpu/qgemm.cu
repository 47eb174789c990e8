// qgemm: projections whose weights are quantized (model/quant.h's fp8, int8
// and int4, held in gpu/qlayout.h's blocks) on the tensor cores, on
// gemm.cu's grid and frame (gpu/mma.cuh): one CTA computes 16 outputs for 8
// rows (decode: memory-bound, every weight byte read once per 8 rows) or 64
// (prefill), its 4 warps each adding up one run of K.
//
// Weights only are quantized, and dequantized in registers: each lane loads
// its two outputs' 8 inputs of a step in one 16-byte (fp8, int8) or 8-byte
// (int4) load, turns the codes into bf16 exactly (e4m3, int8 and an int4
// minus its zero point all fit bf16's 8 significant bits), and the mma
// multiplies them by the activations (rounded to bf16, as in gemm.cu) into
// fp32. The group's scale is applied once per group and output, to the
// group's fp32 sum: one scale load per group per lane, and no rounding of
// the weights. So, for output o of row r:
//   y = sum over the warps in order of
//       (sum over the warp's groups in order of s_g * mma-sum of q * x)
// the same sequence whatever the tile (8 or 64 rows) or the rows around r.
// Groups must fall on 32-input steps (ql_tensor_cores); others take
// gemm.cu's plain kernel.
//
// Within a unit of 8 inputs the lane pairs input i with input i + 4 (pair
// i, i = 0..3; gpu/qlayout.h turns the codes into such pairs), which the
// int4 nibble trick makes free; the activations are paired the same way, so
// the mma sums the right products.
#include "gpu/kernels.cuh"

#include "gpu/mma.cuh"
#include "gpu/qlayout.h"

// One lane's codes for one unit of 8 inputs: outputs j (lo) and j + 8 (hi).
// fp8 / int8: w0 inputs 0..3 (byte i: input i), w1 inputs 4..7; int4: w0
// the dword (nibble i: input i), w1 unused.
struct qfrag {
    uint32_t lo0, lo1, hi0, hi1;
};

template <enum quant_format F>
__device__ __forceinline__ qfrag q_fetch(const uint8_t *val, int u, int K, int j)
{
    qfrag r = {0, 0, 0, 0};
    if (8 * u >= K) return r;
    if (F == QUANT_INT4) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(val + ql_unit_off(F, u, j)));
        r.lo0 = v.x;
        r.hi0 = v.y;
        return r;
    }
    if (8 * u + 8 <= K) {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(val + ql_unit_off(F, u, j)));
        r.lo0 = v.x;
        r.lo1 = v.y;
        r.hi0 = v.z;
        r.hi1 = v.w;
        return r;
    }
    // The matrix's last unit, of fewer than 8 inputs, byte by byte.
    for (int i = 0; i < K - 8 * u; i++) {
        int sh;
        const uint32_t lo = val[ql_value_off(F, K, j, 8 * u + i, &sh)];
        const uint32_t hi = val[ql_value_off(F, K, j + 8, 8 * u + i, &sh)];
        if (i < 4) {
            r.lo0 |= lo << (8 * i);
            r.hi0 |= hi << (8 * i);
        } else {
            r.lo1 |= lo << (8 * (i - 4));
            r.hi1 |= hi << (8 * (i - 4));
        }
    }
    return r;
}

__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }
__device__ __forceinline__ __nv_bfloat162 bits_bf162(uint32_t u) { return *reinterpret_cast<__nv_bfloat162 *>(&u); }

// The pairs of gpu/qlayout.h, finished with a bf16 multiply or subtraction
// (exact: the operands and the results are all bf16 values).
__device__ __forceinline__ uint32_t fp8_pair(uint32_t w0, uint32_t w1, int i)
{
    return bf162_bits(__hmul2(bits_bf162(ql_fp8_pair_bits(w0, w1, i)), bits_bf162(QL_BF16_2P120)));
}

__device__ __forceinline__ uint32_t int4_pair(uint32_t d, int i, uint32_t zz)
{
    return bf162_bits(__hsub2(bits_bf162(ql_int4_pair_bits(d, i)), bits_bf162(zz)));
}

// A unit's codes as the mma's A registers: lo[i] / hi[i] = pair i of
// output j / j + 8.
template <enum quant_format F>
__device__ __forceinline__ void q_dequant(const qfrag &w, uint32_t z_lo, uint32_t z_hi,
                                          uint32_t lo[4], uint32_t hi[4])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (F == QUANT_FP8) {
            lo[i] = fp8_pair(w.lo0, w.lo1, i);
            hi[i] = fp8_pair(w.hi0, w.hi1, i);
        } else if constexpr (F == QUANT_INT8) {
            lo[i] = ql_int8_pair(w.lo0, w.lo1, i);
            hi[i] = ql_int8_pair(w.hi0, w.hi1, i);
        } else {
            lo[i] = int4_pair(w.lo0, i, z_lo);
            hi[i] = int4_pair(w.hi0, i, z_hi);
        }
    }
}

// Group g's scales of outputs j and j + 8 (and int4's 128 + zero point, twice).
template <enum quant_format F>
__device__ __forceinline__ void q_scales(const uint8_t *blk, int g, int j, float *s_lo, float *s_hi,
                                         uint32_t *z_lo, uint32_t *z_hi)
{
    if constexpr (F == QUANT_INT4) {
        const uint32_t h = __ldg(reinterpret_cast<const unsigned *>(blk + ql_scale_off(F, g, j)));
        *s_lo = ql_f16_to_f32((uint16_t)(h & 0xffffu));
        *s_hi = ql_f16_to_f32((uint16_t)(h >> 16));
        const uint32_t z = __ldg(reinterpret_cast<const unsigned short *>(blk + ql_zero_off(g, j)));
        *z_lo = ql_int4_zero(z & 0xffu);
        *z_hi = ql_int4_zero(z >> 8);
    } else {
        const float2 s = __ldg(reinterpret_cast<const float2 *>(blk + ql_scale_off(F, g, j)));
        *s_lo = s.x;
        *s_hi = s.y;
        *z_lo = *z_hi = 0;
    }
}

// Steps of a group fetched together, so that each lane has this many loads
// in flight (decode is bound by how many bytes are on their way).
#define Q_BATCH 4

template <enum quant_format F, int NT>
__global__ void __launch_bounds__(MM_WARPS * 32) qmm_kernel(const mm_params p)
{
    __shared__ float red[MM_WARPS][NT][4][32];
    int grp_mat, r0, r_end;
    if (!mm_tile(p, NT, &grp_mat, &r0, &r_end)) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int otile = (int)blockIdx.x * MM_OUTS, K = p.K, G = p.group;
    const uint8_t *w = reinterpret_cast<const uint8_t *>(p.wtab ? p.wtab[grp_mat] : p.w);
    const uint8_t *blk = w + (size_t)((p.o0 + otile) / QUANT_BLOCK_ROWS) * p.block_bytes;
    const uint8_t *val = blk + p.header_bytes;
    const float *xr[NT];
    mm_x_rows<NT>(p, r0, r_end, gid, xr);
    float acc[NT][4];
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    int k0, k1;
    ql_warp_inputs(K, warp, MM_WARPS, &k0, &k1);
    for (int kg = k0; kg < k1;) {
        const int g = kg / G, gend = min(k1, (g + 1) * G);
        float s_lo, s_hi;
        uint32_t z_lo, z_hi;
        q_scales<F>(blk, g, gid, &s_lo, &s_hi, &z_lo, &z_hi);
        float sum[NT][4];
        for (int t = 0; t < NT; t++) sum[t][0] = sum[t][1] = sum[t][2] = sum[t][3] = 0.0f;
        for (int kb = kg; kb < gend; kb += Q_BATCH * QL_STEP) {
            qfrag wf[Q_BATCH];
#pragma unroll
            for (int i = 0; i < Q_BATCH; i++)
                wf[i] = kb + i * QL_STEP < gend ? q_fetch<F>(val, (kb + i * QL_STEP) / 8 + tig, K, gid)
                                               : qfrag{0, 0, 0, 0};
#pragma unroll
            for (int i = 0; i < Q_BATCH; i++) {
                if (kb + i * QL_STEP >= gend) break;
                const int k = kb + i * QL_STEP + tig * 8;
                uint32_t lo[4], hi[4];
                q_dequant<F>(wf[i], z_lo, z_hi, lo, hi);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float f[8];
                    load_x8(xr[t], k, k1, p.vec, f);
                    mma_bf16(sum[t], lo[0], hi[0], lo[1], hi[1], pack_bf16(f[0], f[4]),
                             pack_bf16(f[1], f[5]));
                    mma_bf16(sum[t], lo[2], hi[2], lo[3], hi[3], pack_bf16(f[2], f[6]),
                             pack_bf16(f[3], f[7]));
                }
            }
        }
        // C fragment: [0], [1] are output j's, [2], [3] output j + 8's.
        for (int t = 0; t < NT; t++) {
            acc[t][0] = fmaf(sum[t][0], s_lo, acc[t][0]);
            acc[t][1] = fmaf(sum[t][1], s_lo, acc[t][1]);
            acc[t][2] = fmaf(sum[t][2], s_hi, acc[t][2]);
            acc[t][3] = fmaf(sum[t][3], s_hi, acc[t][3]);
        }
        kg = gend;
    }
    mm_store<NT>(p, red, acc, otile, r0, r_end);
}

template <int NT>
static cudaError_t qmm_launch_nt(cudaStream_t s, dim3 grid, const mm_params &p)
{
    switch (p.quant) {
    case QUANT_FP8: qmm_kernel<QUANT_FP8, NT><<<grid, MM_WARPS * 32, 0, s>>>(p); break;
    case QUANT_INT8: qmm_kernel<QUANT_INT8, NT><<<grid, MM_WARPS * 32, 0, s>>>(p); break;
    case QUANT_INT4: qmm_kernel<QUANT_INT4, NT><<<grid, MM_WARPS * 32, 0, s>>>(p); break;
    default: return cudaErrorInvalidValue;
    }
    return launch_status();
}

cudaError_t cuda_qmm_launch(cudaStream_t s, dim3 grid, bool small, const mm_params &p)
{
    return small ? qmm_launch_nt<1>(s, grid, p) : qmm_launch_nt<8>(s, grid, p);
}
