// kernels_avx512: the AVX-512 (F, BW, DQ, VL) table, 16 fp32 lanes. Compiled
// with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c; reached only
// after cpu_kernels_avx512() checked the CPU.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "model/cpu/kernels.h"

#define VF __m512
#define W 16
#define VZERO() _mm512_setzero_ps()
#define VLOADU(p) _mm512_loadu_ps(p)
#define VSTOREU(p, v) _mm512_storeu_ps((p), (v))
#define VSET1(x) _mm512_set1_ps(x)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
// Lanes whose idx is below n keep v, the others take other.
#define VSEL_LT(v, idx, n, other) \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask((idx), _mm512_set1_ps((float)(n)), _CMP_LT_OQ), (other), (v))
#define VLOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VLOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))

// Packed tiles: MM_MR rows x MM_NR outputs of accumulators, the x rows in L1
// across a whole packed chunk of MM_PACK_FLOATS weights (in L2).
#define MM_MR 6
#define MM_NR 4
#define MM_PACK_FLOATS 65536
#define MM_UNIT 16
#define GV_MR 8
#define GV_NR 3
// Attention rows per group: their score accumulators fill the registers.
#define ATT_RB 8
#define GEMM_MIN_ROWS 6
// Up to this many rows a matrix too big for the caches is still streamed as
// stored: 8 x 3 tiles keep the FMAs busy while the weights arrive, where
// packing would read them from memory and then again from L2 (the lm_head
// at batch 16: 34 ms instead of 48 on one core).
#define GV_STREAM_MAX_ROWS 16
#define GV_STREAM_MIN_BYTES (4u << 20)

// The canonical tree: lane i + lane i+8, then the AVX2 tree on the 8 sums.
static inline __m256 fold512(__m512 v)
{
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

static inline float reduce1(__m512 v)
{
    __m256 h = fold512(v);
    h = _mm256_hadd_ps(h, h);
    h = _mm256_hadd_ps(h, h);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return _mm_cvtss_f32(r);
}

static inline void reduce4(__m512 a, __m512 b, __m512 c, __m512 d, float out[4])
{
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold512(a), fold512(b)),
                              _mm256_hadd_ps(fold512(c), fold512(d)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

// reduce1 of sixteen vectors at once: out[k] is reduce1(v[k]) exactly — the
// same pairs added in the same order (lane i + lane i+8, then adjacent
// pairs, then pairs of pairs, then the two halves), by shuffling two
// vectors' lanes side by side at each level instead of folding one vector.
#define HAVE_REDUCE16 1
static inline void reduce16(const __m512 *v, float *out)
{
    __m512 c[8], e[4], g[2];
    for (int p = 0; p < 8; p++) // lanes 0-7: v[2p]'s i + (i+8); lanes 8-15: v[2p+1]'s
        c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int q = 0; q < 4; q++) // adjacent pairs, per 128-bit block: [c, c, c', c']
        e[q] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * q], c[2 * q + 1], 0x88),
                             _mm512_shuffle_ps(c[2 * q], c[2 * q + 1], 0xDD));
    for (int t = 0; t < 2; t++) // pairs of pairs: block k lane i is c[4t + i]'s block k
        g[t] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * t], e[2 * t + 1], 0x88),
                             _mm512_shuffle_ps(e[2 * t], e[2 * t + 1], 0xDD));
    // The halves: blocks 0+1 and 2+3 of each g; then lanes back in order.
    __m512 h = _mm512_add_ps(_mm512_shuffle_f32x4(g[0], g[1], 0x88), _mm512_shuffle_f32x4(g[0], g[1], 0xDD));
    const __m512i idx = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, h));
}

static inline float hmax1(__m512 v) { return _mm512_reduce_max_ps(v); }

// exp as in kernels_avx2.c, with scalef for the 2^n.
static inline __m512 vexp(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// Lanes where a > b keep v, the others are 0.
#define VKEEP_GT(v, a, b) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((a), (b), _CMP_GT_OQ), (v))

// Lanes where a == b (ordered: not NaN) keep v, the others take other.
#define VSEL_EQ(v, a, b, other) _mm512_mask_blend_ps(_mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ), (other), (v))

#include "model/cpu/kernels_simd.inc"

static const struct cpu_kernels avx512_table = {
    .name = "avx512",
    .lanes = W,
    .unit = MM_UNIT,
    .matmul = simd_matmul,
    .attend = simd_attend,
    .silu_mul = simd_silu_mul,
    .rmsnorm = simd_rmsnorm,
    .axpy = simd_axpy,
    .exp_sum = simd_exp_sum,
    .scale_max = simd_scale_max,
    .stream_sum = simd_stream_sum,
    .fma_burn = simd_fma_burn,
};

const struct cpu_kernels *cpu_kernels_avx512_table(void);
const struct cpu_kernels *cpu_kernels_avx512_table(void) { return &avx512_table; }
