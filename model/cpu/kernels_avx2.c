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

// The matmul reads the packed layout (below), as the avx512 table does.
#define MM_UNIT 16
// Attention rows per group: their score accumulators fill the registers.
#define ATT_RB 6
// A decode token's 4 heads in one group of 4, its 8 in two (kernels_simd.inc).
#define ATT_RB_SMALL 4
// Key blocks a small row group (ATT_RB_SMALL rows) scores in one pass: one
// (2 vectors a row already; two blocks would not fit the 16 registers).
#define ATT_KB 1

// The canonical lane-sum tree: adjacent pairs, then pairs of pairs, then the
// two 128-bit halves.
static inline float reduce1(__m256 v)
{
    __m256 h = _mm256_hadd_ps(v, v);
    h = _mm256_hadd_ps(h, h);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return _mm_cvtss_f32(r);
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
#define Q_MRB 6 // the tiles over weights made fp32 once a chunk (kernels_simd.inc): 2-5% over 4 rows
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

// ---- the matmul over packed weights ------------------------------------------
//
// The avx512 table's layout (blocks of 16 outputs stored k by k, bf16 in
// pairs of k) and its arithmetic: every output is one FMA chain over k in
// order, from 0, then y_old + that when accumulating; so this table's
// results are the avx512 table's, bit for bit, at half the vector width. A
// block's 16 outputs are two vectors of 8; a tile holds MR rows x NB blocks
// of such chains and feeds each k's weight vectors to MR broadcast x values.
// Sixteen registers: 6 x 1 blocks (12 chains) over fp32 weights, f16 ones
// widened to fp32, or bf16 ones read as packed a half of each pair at a
// time; 4 x 1 over f16 (and bf16 tiles of 3 or 4 rows, both halves at
// once), 2 x 2, and 1 x 4 for one row (8 chains, enough to cover the FMA
// latency while streaming).

#define P2_MAX_MR 6       // rows of an fp32 or bf16 tile: 12 chains, 2 weight vectors, 1 broadcast
#define P2_MAX_MR_F16 4   // rows of an f16 tile (6 not measured)
#define P2_MAX_MR_PAIRS 4 // the most rows a bf16 tile takes both halves of a pair at once
                          // for: 8 chains, 4 weight vectors
// Rows above which f16 chunks are widened to fp32 (below). bf16 chunks were
// too, while GCC kept five of the 6-row bf16 tile's chains on the stack
// (p2_high_words): on an Intel Xeon, with 4-row bf16 tiles, the lm_head at
// 64 rows ran at 66-73 GFLOP/s widened, 53-60 not. Since that spill went,
// the bf16 tiles are the faster at every row count measured (Zen 5,
// bench_cpu_matmul 2 avx2, alternating): the lm_head over 64 rows 91-100 ms
// against 100-122 widened, 64 experts of 512 tokens' prefill 15-17 ms
// against 18-19; and bench-offline on the mid model (64 prompts of 128
// tokens, 64 out, two rounds alternating) 64 streams 159 output tokens/s
// both rounds against 141 and 152, 16 streams 134 and 134 against 127 and
// 133. The f16 tiles (4 rows) were not measured again.
#define P2_WIDE_ROWS 16
#define P2_MAX_NB 4
#define P2_CHUNK_BYTES (128u << 10) // packed weights each row block meets while they sit in L2
#define P2_PF 2048                  // how far ahead in its block the first row block prefetches

// Lanes [lo, hi) of 8 set, as a maskload/maskstore mask.
static inline __m256i p2_mask8(int lo, int hi)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx),
                            _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1)));
}

// A bf16 pair's odd half as fp32: v's high words, the low ones cleared.
// The mask is an operand in memory that the asm reads each time, so it
// holds no register. A 6-row tile's 12 chains, two weight vectors and a
// broadcast take 15 of the 16; with the mask hoisted into the 16th, GCC 12
// kept five of the chains on the stack, a store and a reload in each of
// them every pair (and the 2-row tile over two blocks one). Measured with
// bench_cpu_matmul 2 avx2 (Zen 5, three runs alternating): the lm_head over
// 12 rows 24-25.5 ms before, 17-19 after; over 16 rows 31-32, 24.5-26.5;
// 64 experts of 384 x 1024 over 12 rows 4.3-4.4, 3.0-3.2; down over 16
// rows 5.1-5.6, 4.3-4.5. The same bits.
static inline __m256i p2_high_words(__m256i v)
{
    static const uint32_t high[8] __attribute__((aligned(32))) = {
        0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u};
    __m256i r;
    __asm__("vpand %2, %1, %0" : "=x"(r) : "x"(v), "m"(high));
    return r;
}

AI void p2_tile(const int MR, const int NB, const enum dtype dt, const int PFM, const float *const *xr,
                const char *wp, size_t bb, int K, float *const *yr, int o, int o0, int o1, bool accumulate,
                enum cpu_pf pf, struct cpu_ahead *ahead)
{
    struct cpu_ahead ah = PFM == CPU_PFM_AHEAD ? *ahead : (struct cpu_ahead){0};
    __m256 acc[P2_MAX_MR][2 * P2_MAX_NB];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm256_setzero_ps();
    // Sixteen registers: each broadcast x serves the FMAs of all its
    // weight vectors right away, and no more weight vectors are live than
    // fit beside the chains (P2_MAX_MR, P2_MAX_MR_F16 and P2_MAX_MR_PAIRS:
    // how many rows each dtype and shape takes).
    if (dt == DTYPE_BF16) {
        // A pair's dword holds k = 2p in its low half and 2p + 1 in its
        // high half: a shift and a mask make the two fp32 vectors. Tiles of
        // 5 and 6 rows take the halves one after the other, each reloading
        // the pair's words (both halves' four vectors do not fit beside 12
        // chains): every weight vector then serves 5 or 6 rows' FMAs, not 4,
        // for the same shift or mask. Measured with bench-offline on the mid
        // model, avx2, builds alternating: 16 streams 91-95 output tokens/s
        // before, 95-99 after (the lm_head over 16 rows 39-41 ms a step, 36-37
        // after); 64 streams 202-208, 219-222 (the experts, 5 to 14 rows each,
        // 144-146 ms a step, 126).
        const int np = K / 2;
        const bool split = MR > P2_MAX_MR_PAIRS && NB == 1;
        for (int p = 0; p < np; p++) {
            if (split) {
                const char *a = wp + (size_t)p * 64;
                if (PFM == CPU_PFM_TILE) cpu_pf_tile(pf, wp, bb, NB, 0, (size_t)p * 64, P2_PF);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    // Empty, but the compiler must assume a changed: the
                    // second half reloads the words, not the first's kept.
                    __asm__("" : "+r"(a));
                    const __m256i v0 = _mm256_loadu_si256((const __m256i *)a);
                    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(a + 32));
                    const __m256 w0 = _mm256_castsi256_ps(h ? p2_high_words(v0) : _mm256_slli_epi32(v0, 16));
                    const __m256 w1 = _mm256_castsi256_ps(h ? p2_high_words(v1) : _mm256_slli_epi32(v1, 16));
#pragma GCC unroll 6
                    for (int r = 0; r < MR; r++) {
                        const __m256 xb = _mm256_broadcast_ss(xr[r] + 2 * p + h);
                        acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
                    }
                }
            } else {
#pragma GCC unroll 4
                for (int n = 0; n < NB; n++) {
                    const char *a = wp + (size_t)n * bb + (size_t)p * 64;
                    if (PFM == CPU_PFM_TILE) cpu_pf_tile(pf, wp, bb, NB, n, (size_t)p * 64, P2_PF);
                    const __m256i v0 = _mm256_loadu_si256((const __m256i *)a);
                    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(a + 32));
                    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
                    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
                    const __m256 d0 = _mm256_castsi256_ps(p2_high_words(v0));
                    const __m256 d1 = _mm256_castsi256_ps(p2_high_words(v1));
#pragma GCC unroll 6
                    for (int r = 0; r < MR; r++) {
                        const __m256 xe = _mm256_broadcast_ss(xr[r] + 2 * p);
                        acc[r][2 * n] = _mm256_fmadd_ps(xe, e0, acc[r][2 * n]);
                        acc[r][2 * n + 1] = _mm256_fmadd_ps(xe, e1, acc[r][2 * n + 1]);
                        const __m256 xo = _mm256_broadcast_ss(xr[r] + 2 * p + 1);
                        acc[r][2 * n] = _mm256_fmadd_ps(xo, d0, acc[r][2 * n]);
                        acc[r][2 * n + 1] = _mm256_fmadd_ps(xo, d1, acc[r][2 * n + 1]);
                    }
                }
            }
            if (PFM == CPU_PFM_AHEAD)
                cpu_ahead_step(&ah);
        }
        if (K & 1) {
#pragma GCC unroll 4
            for (int n = 0; n < NB; n++) {
                const char *a = wp + (size_t)n * bb + (size_t)np * 64;
                const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)a), 16));
                const __m256 e1 =
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(a + 32)), 16));
#pragma GCC unroll 6
                for (int r = 0; r < MR; r++) {
                    const __m256 xe = _mm256_broadcast_ss(xr[r] + K - 1);
                    acc[r][2 * n] = _mm256_fmadd_ps(xe, e0, acc[r][2 * n]);
                    acc[r][2 * n + 1] = _mm256_fmadd_ps(xe, e1, acc[r][2 * n + 1]);
                }
            }
        }
    } else {
        const size_t kb = dt == DTYPE_F16 ? 32 : 64; // bytes of one k's 16 weights
        for (int k = 0; k < K; k++) {
#pragma GCC unroll 4
            for (int n = 0; n < NB; n++) {
                const char *a = wp + (size_t)n * bb + (size_t)k * kb;
                if (PFM == CPU_PFM_TILE && (((size_t)k * kb) & 63) == 0)
                    cpu_pf_tile(pf, wp, bb, NB, n, (size_t)k * kb, P2_PF);
                const __m256 w0 = dt == DTYPE_F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a))
                                                  : _mm256_loadu_ps((const float *)a);
                const __m256 w1 = dt == DTYPE_F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 16)))
                                                  : _mm256_loadu_ps((const float *)a + 8);
#pragma GCC unroll 6
                for (int r = 0; r < MR; r++) {
                    const __m256 xb = _mm256_broadcast_ss(xr[r] + k);
                    acc[r][2 * n] = _mm256_fmadd_ps(xb, w0, acc[r][2 * n]);
                    acc[r][2 * n + 1] = _mm256_fmadd_ps(xb, w1, acc[r][2 * n + 1]);
                }
            }
            if (PFM == CPU_PFM_AHEAD && ((k & 1) || k + 1 == K))
                cpu_ahead_step(&ah);
        }
    }
    if (PFM == CPU_PFM_AHEAD) ahead->at = ah.at;
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NB; v++) {
        const int on = o + 8 * v;
        if (on >= o0 && on + 8 <= o1) {
#pragma GCC unroll 6
            for (int r = 0; r < MR; r++) {
                float *y = yr[r] + on;
                __m256 t = acc[r][v];
                if (accumulate) t = _mm256_add_ps(_mm256_loadu_ps(y), t);
                _mm256_storeu_ps(y, t);
            }
        } else if (on + 8 > o0 && on < o1) {
            // Lanes outside [o0, o1) are neither read nor written.
            const __m256i mk = p2_mask8(o0 - on, o1 - on);
            // Unrolled like every loop over the accumulators: one that is
            // not makes GCC keep them in memory, stored after every FMA.
#pragma GCC unroll 6
            for (int r = 0; r < MR; r++) {
                float *y = yr[r] + on;
                __m256 t = acc[r][v];
                if (accumulate) t = _mm256_add_ps(_mm256_maskload_ps(y, mk), t);
                _mm256_maskstore_ps(y, mk, t);
            }
        }
    }
}

// The tile shapes: one row over 4 blocks, two over 2 (8 chains each), more
// rows over one block; nb is that shape's NB, or 1 for the blocks left over
// at the end of a range.
AI int p2_nb(int mr) { return mr == 1 ? 4 : mr == 2 ? 2 : 1; }

#define P2_TILE_MODE(PFM, MR, NB, DT) p2_tile(MR, NB, DT, PFM, xr, wp, bb, K, yr, o, o0, o1, acc, pf, ahead)
#define P2_CASE(DT, MR)                                                                                    \
    case MR:                                                                                               \
        if (nb > 1) {                                                                                      \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), P2_TILE_MODE, MR, p2_nb(MR), DT)                            \
        } else {                                                                                           \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), P2_TILE_MODE, MR, 1, DT)                                    \
        }                                                                                                  \
        break;
#define P2_TILES(NAME, DT)                                                                          \
    static void NAME(int mr, int nb, const float *const *xr, const char *wp, size_t bb, int K,       \
                     float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf, struct cpu_ahead *ahead) \
    {                                                                                               \
        switch (mr) {                                                                               \
            P2_CASE(DT, 1) P2_CASE(DT, 2) P2_CASE(DT, 3) P2_CASE(DT, 4) P2_CASE(DT, 5) P2_CASE(DT, 6) \
        }                                                                                           \
    }
P2_TILES(p2_tiles_bf16, DTYPE_BF16)
P2_TILES(p2_tiles_f16, DTYPE_F16)
P2_TILES(p2_tiles_f32, DTYPE_F32)

typedef void (*p2_tiles_fn)(int mr, int nb, const float *const *xr, const char *wp, size_t bb, int K,
                            float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf, struct cpu_ahead *ahead);

// nblk packed f16 blocks of K inputs as packed fp32 blocks (16 floats per
// k): the same values, so the fp32 tile over them gives the same bits as the
// f16 tile over the originals.
static void p2_widen_f16_blocks(const char *src, size_t bb, int nblk, int K, float *dst)
{
    for (int b = 0; b < nblk; b++) {
        const char *s = src + (size_t)b * bb;
        float *d = dst + (size_t)b * K * 16;
        for (int k = 0; k < K; k++)
            for (int h = 0; h < 2; h++)
                _mm256_store_ps(d + (size_t)k * 16 + 8 * h,
                                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + (size_t)k * 32 + 16 * h))));
    }
}

// Outputs [o0, o1) of every row. Chunks of packed blocks (read from memory
// once, by the first row block, then from L2) meet every row block in turn;
// weights not packed at load are packed chunk by chunk into scratch.
static void p2_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (m->w.quant != QUANT_NONE) {
        simd_qmatmul(m, o0, o1, scratch);
        return;
    }
    if (m->rows <= 0 || o0 >= o1) return;
    const int K = m->w.in;
    const size_t bb = cpu_pack_block_bytes(m->w.dtype, K);
    const p2_tiles_fn tiles = m->w.dtype == DTYPE_BF16 ? p2_tiles_bf16
                              : m->w.dtype == DTYPE_F16 ? p2_tiles_f16
                                                        : p2_tiles_f32;
    // f16 over many rows: each chunk widened to fp32 once, every row block
    // then on the fp32 tile (a conversion per weight vector is a third of
    // the work of the f16 tile's FMAs with 8 lanes). The widened chunk takes
    // 256 KiB of scratch, or one block.
    const bool wide = m->w.dtype == DTYPE_F16 && m->rows > P2_WIDE_ROWS;
    const int bh = cpu_block_height(m->rows, wide || m->w.dtype != DTYPE_F16 ? P2_MAX_MR : P2_MAX_MR_F16);
    const int tnb = p2_nb(bh);
    int chunk = cpu_pack_chunk_blocks(P2_CHUNK_BYTES, bb, P2_MAX_NB, m->w.packed);
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    const float *xr[P2_MAX_MR];
    float *yr[P2_MAX_MR];
    const int n_rb = (m->rows + bh - 1) / bh, kstep = m->w.dtype == DTYPE_BF16 ? K / 2 : (K + 1) / 2;
    float *wbuf = scratch + cpu_pk_scratch_floats(K);
    const size_t wbb = (size_t)K * 16 * sizeof(float);
    if (wide) {
        chunk = (int)((256u << 10) / wbb);
        if (chunk < 1) chunk = 1;
    }
    const int n_l2 = wide ? n_rb : n_rb - 1;
    for (int cb = b0; cb < b1; cb += chunk) {
        const int ce = b1 - cb < chunk ? b1 : cb + chunk;
        const char *wc = cpu_packed_blocks(&m->w, cb, ce, scratch);
        if (wide) p2_widen_f16_blocks(wc, bb, ce - cb, K, wbuf);
        // The row blocks that read the chunk from L2 bring the next one there.
        struct cpu_ahead ahead = cpu_ahead_plan(m->w.packed, bb, ce, b1, chunk,
                                                (size_t)n_l2 * (size_t)((ce - cb) / tnb + (ce - cb) % tnb) *
                                                    (size_t)kstep);
        for (int rb = 0; rb < m->rows; rb += bh) {
            const int mr = m->rows - rb < bh ? m->rows - rb : bh, nb = p2_nb(mr);
            cpu_mm_rows(m, rb, mr, xr, yr);
            const enum cpu_pf pf = cpu_pf_mode(rb == 0 && m->w.packed && !wide, m->rows);
            struct cpu_ahead *pa = (rb > 0 || wide) && ahead.at ? &ahead : NULL;
            const p2_tiles_fn t = wide ? p2_tiles_f32 : tiles;
            const char *w = wide ? (const char *)wbuf : wc;
            const size_t tb = wide ? wbb : bb;
            int b = cb;
            for (; b + nb <= ce; b += nb)
                t(mr, nb, xr, w + (size_t)(b - cb) * tb, tb, K, yr, b * CPU_PACK_OUTS, o0, o1, m->accumulate,
                  pf, pa);
            for (; b < ce; b++)
                t(mr, 1, xr, w + (size_t)(b - cb) * tb, tb, K, yr, b * CPU_PACK_OUTS, o0, o1, m->accumulate, pf,
                  pa);
        }
    }
}

static bool p2_wants_packed(const struct cpu_wmat *w) { return w->out > 0 && w->in > 0; }

static const struct cpu_kernels avx2_table = {
    .name = "avx2",
    .lanes = W,
    .unit = MM_UNIT,
    .matmul = p2_matmul,
    .wants_packed = p2_wants_packed,
    .attend = simd_attend,
    .silu_mul = simd_silu_mul,
    .rmsnorm = simd_rmsnorm,
    .axpy = simd_axpy,
    .rope = simd_rope,
    .exp_sum = simd_exp_sum,
    .scale_max = simd_scale_max,
    .stream_sum = simd_stream_sum,
    .fma_burn = simd_fma_burn,
};

const struct cpu_kernels *cpu_kernels_avx2_table(void);
const struct cpu_kernels *cpu_kernels_avx2_table(void) { return &avx2_table; }
