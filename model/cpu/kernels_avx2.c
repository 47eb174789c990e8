// kernels_avx2: the AVX2+FMA(+F16C) table, 8 fp32 lanes. Compiled with
// -mavx2 -mfma -mf16c; reached only after cpu_kernels_avx2() checked the CPU.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "model/cpu/kernels.h"

#define VF __m256
#define W 8
#define VZERO() _mm256_setzero_ps()
#define VLOADU(p) _mm256_loadu_ps(p)
#define VSTOREU(p, v) _mm256_storeu_ps((p), (v))
#define VSET1(x) _mm256_set1_ps(x)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
// Lanes whose idx is below n keep v, the others take other.
#define VSEL_LT(v, idx, n, other) \
    _mm256_blendv_ps((other), (v), _mm256_cmp_ps((idx), _mm256_set1_ps((float)(n)), _CMP_LT_OQ))
#define VLOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VLOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

// Packed tiles: MM_MR rows x MM_NR outputs of accumulators, the x rows in L1
// across a whole packed chunk of MM_PACK_FLOATS weights (in L2).
#define MM_MR 6
#define MM_NR 2
#define MM_PACK_FLOATS 65536
#define MM_UNIT 12
#define GV_MR 2
#define GV_NR 4
// Attention rows per group: their score accumulators fill the registers.
#define ATT_RB 6
#define GEMM_MIN_ROWS 4
#define GV_STREAM_MAX_ROWS (GEMM_MIN_ROWS - 1)
#define GV_STREAM_MIN_BYTES 1u

// The canonical lane-sum tree: adjacent pairs, then pairs of pairs, then the
// two 128-bit halves. reduce4 computes exactly this tree for four vectors.
static inline float reduce1(__m256 v)
{
    __m256 h = _mm256_hadd_ps(v, v);
    h = _mm256_hadd_ps(h, h);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return _mm_cvtss_f32(r);
}

static inline void reduce4(__m256 a, __m256 b, __m256 c, __m256 d, float out[4])
{
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

static inline float hmax1(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

// exp to about 1 ulp: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 Taylor
// polynomial for e^r, and 2^n built in the exponent bits. Clamped to the
// range where 2^n stays a normal float.
static inline __m256 vexp(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Lanes where a > b keep v, the others are 0.
#define VKEEP_GT(v, a, b) _mm256_and_ps((v), _mm256_cmp_ps((a), (b), _CMP_GT_OQ))

// Lanes where a == b (ordered: not NaN) keep v, the others take other.
#define VSEL_EQ(v, a, b, other) _mm256_blendv_ps((other), (v), _mm256_cmp_ps((a), (b), _CMP_EQ_OQ))

// The quantized matmul's pieces (kernels_simd.inc): 4 rows x one block of
// 16 outputs (two vectors) per tile fills the 16 registers.
#define Q_MR 4
#define Q_NB 1
#define VI __m256i
#define VLOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define VFNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VLOAD_Q8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VLOAD_U8(p) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
// e4m3 bytes: sign-extended, the 7 magnitude bits shifted into an fp32's
// exponent and mantissa (the sign's copies cleared from the exponent), times
// 2^120 (model/quant.h).
static inline __m256 vload_fp8(const void *p)
{
    __m256i t = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    t = _mm256_and_si256(_mm256_slli_epi32(t, 20), _mm256_set1_epi32((int)0x87f00000u));
    return _mm256_mul_ps(_mm256_castsi256_ps(t), _mm256_set1_ps(0x1p120f));
}
#define VLOAD_FP8(p) vload_fp8(p)
// Nibble i of each dword times 16^i; AVX2 converts signed dwords only, so
// the top nibble is shifted down and its x left unscaled.
static inline __m256 vnib(__m256i v, int i)
{
    if (i == 7) return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15 << (4 * i))));
}
#define VNIB(v, i) vnib((v), (i))
static const float nib_xscale[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
#define NIB_XSCALE(i) nib_xscale[i]

#include "model/cpu/kernels_simd.inc"

static const struct cpu_kernels avx2_table = {
    .name = "avx2",
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

const struct cpu_kernels *cpu_kernels_avx2_table(void);
const struct cpu_kernels *cpu_kernels_avx2_table(void) { return &avx2_table; }
