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

// The matmul is below, over the packed layout (kernels.h); the rest of the
// table comes from kernels_simd.inc.
#define MM_UNIT 16
// Attention rows per group: their score accumulators fill the registers.
#define ATT_RB 8
// Key blocks a small row group (ATT_RB_SMALL, ATT_RB / 2 rows: a decode
// token's 4 query heads) scores in one pass: two, 8 chains of FMAs in
// flight, not 4.
#define ATT_KB 2

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

// The quantized matmul's pieces (kernels_simd.inc): 4 rows x 4 blocks of
// 16 outputs per tile, 16 chains in registers beside the weight vectors.
#define Q_MR 4
#define Q_MRB 4 // the tiles over weights made fp32 once a chunk (kernels_simd.inc): 6 rows ran 0-7% slower
#define Q_NB 4
#define Q_NB1 8 // one row: 8 chains, the FMA latency times its two pipes
#define VI __m512i
#define VLOADI(p) _mm512_loadu_si512(p)
#define VFNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define VLOAD_Q8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VLOAD_U8(p) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p))))
// e4m3 bytes as in kernels_avx2.c.
static inline __m512 vload_fp8(const void *p)
{
    __m512i t = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    t = _mm512_and_si512(_mm512_slli_epi32(t, 20), _mm512_set1_epi32((int)0x87f00000u));
    return _mm512_mul_ps(_mm512_castsi512_ps(t), _mm512_set1_ps(0x1p120f));
}
#define VLOAD_FP8(p) vload_fp8(p)
// Nibble i of each dword, in place: q * 16^i, converted unsigned.
#define VNIB(v, i) _mm512_cvtepu32_ps(_mm512_and_si512((v), _mm512_set1_epi32((int)(15u << (4 * (i))))))
static const float nib_xscale[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 0x1p-28f};
#define NIB_XSCALE(i) nib_xscale[i]

#include "model/cpu/kernels_simd.inc"

// ---- the matmul over packed weights ------------------------------------------
//
// Every output is one FMA chain over k in order, from 0: y = fma(x[K-1],
// w[K-1], ... fma(x[0], w[0], 0)), then y_old + that when accumulating. A
// tile of MR rows x NB blocks of 16 outputs holds MR x NB such chains in
// registers and feeds each k's 16-output weight vector to MR broadcast x
// values, so no lane sums are needed and any MR, NB, row gathering or output
// split gives every output the same bits.

#define PK_MAX_MR 6
#define PK_XP_MAX_ROWS 16           // rows a transposed-x tile takes
#define PK_XP_WIDE3_ROWS 8          // up to these, three blocks wide (24 accumulators)
#define PK_XP_WIDE_ROWS 12          // up to these, two blocks wide (24 accumulators)
#define PK_XP_BLOCKS_PER_ROW 2      // blocks of outputs per row that pay for transposing x
#define PK_NB 4                     // blocks of 16 outputs per tile: 6 x 4 = 24 accumulators
#define PK_CHUNK_BYTES (192u << 10) // packed weights each row block meets while they sit in L2
#define PK_PF 2048                  // how far ahead in its block the first row block prefetches

// x from row pointers (xr[r][k]), or, when XP, from one buffer holding the
// rows transposed (xp[k * MR + r]): the broadcasts then need no pointer
// registers, which lets a tile be 16 rows tall.
#define PK_X(r, k) (XP ? xp[(size_t)(k) * MR + (r)] : xr[r][k])

AI void pk_tile(const int MR, const int NB, const bool XP, const enum dtype dt, const bool DP, const int PFM,
                const float *const *xr, const float *xp, const char *wp, size_t bb, int K, float *const *yr,
                int o, int o0, int o1, bool accumulate, enum cpu_pf pf, struct cpu_ahead *ahead)
{
    struct cpu_ahead ah = PFM == CPU_PFM_AHEAD ? *ahead : (struct cpu_ahead){0};
    __m512 acc[PK_XP_MAX_ROWS][PK_NB];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int n = 0; n < NB; n++) acc[r][n] = _mm512_setzero_ps();
    if (dt == DTYPE_BF16) {
        // A pair's dword holds k = 2p in its low half and 2p + 1 in its high
        // half. Tiles of 4 and more rows x 3 or PK_NB blocks take the halves
        // one at a time, each reloading its words: with both halves of 4 blocks
        // live beside 24 accumulators (34 vectors) GCC kept accumulators on
        // the stack. There the odd half is a zero-masked load of the high
        // words (no ALU op) and the even one a shift. Measured in place, in
        // real prefill of the mid model (one process alternating the two
        // codes call by call, 4 runs): the experts' gate/up matmuls took
        // 0.5-1.8% fewer cycles, down 0.3-2.1% fewer. Short tiles (decode)
        // keep loading each pair once, a shift and a mask making the halves.
        const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
        const int np = K / 2;
        const bool split = MR >= 4 && NB >= 3;
        for (int p = 0; p < np; p++) {
            __m512 we[PK_NB], wo[PK_NB];
            if (split) {
#pragma GCC unroll 4
                for (int n = 0; n < NB; n++)
                    if (PFM == CPU_PFM_TILE) cpu_pf_tile(pf, wp, bb, NB, n, (size_t)p * 64, PK_PF);
            } else {
#pragma GCC unroll 4
                for (int n = 0; n < NB; n++) {
                    const char *a = wp + (size_t)n * bb + (size_t)p * 64;
                    if (PFM == CPU_PFM_TILE) cpu_pf_tile(pf, wp, bb, NB, n, (size_t)p * 64, PK_PF);
                    const __m512i v = _mm512_loadu_si512(a);
                    we[n] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                    wo[n] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
                }
            }
            if (PFM == CPU_PFM_AHEAD)
                cpu_ahead_step(&ah);
            const char *pw = wp + (size_t)p * 64;
            // DP: VDPBF16PS's order, the odd k's product first.
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int odd = DP ? h == 0 : h == 1;
                __m512 w[PK_NB];
                if (split) {
                    // Empty, but the compiler must assume pw changed: the
                    // second half reloads the words, not the first's kept.
                    __asm__("" : "+r"(pw));
#pragma GCC unroll 4
                    for (int n = 0; n < NB; n++) {
                        const char *a = pw + (size_t)n * bb;
                        w[n] = _mm512_castsi512_ps(odd ? _mm512_maskz_loadu_epi16(0xAAAAAAAAu, a)
                                                       : _mm512_slli_epi32(_mm512_loadu_si512(a), 16));
                    }
                } else {
#pragma GCC unroll 4
                    for (int n = 0; n < NB; n++) w[n] = odd ? wo[n] : we[n];
                }
#pragma GCC unroll 16
                for (int r = 0; r < MR; r++) {
                    const __m512 xb = _mm512_set1_ps(PK_X(r, 2 * p + odd));
#pragma GCC unroll 4
                    for (int n = 0; n < NB; n++) acc[r][n] = _mm512_fmadd_ps(xb, w[n], acc[r][n]);
                }
            }
        }
        if (K & 1) {
#pragma GCC unroll 4
            for (int n = 0; n < NB; n++) {
                const __m512i v = _mm512_loadu_si512(wp + (size_t)n * bb + (size_t)np * 64);
                const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
#pragma GCC unroll 16
                for (int r = 0; r < MR; r++)
                    acc[r][n] = _mm512_fmadd_ps(_mm512_set1_ps(PK_X(r, K - 1)), we, acc[r][n]);
            }
        }
    } else {
        const size_t kb = dt == DTYPE_F16 ? 32 : 64; // bytes of one k's 16 weights
        for (int k = 0; k < K; k++) {
            __m512 wv[PK_NB];
#pragma GCC unroll 4
            for (int n = 0; n < NB; n++) {
                const char *a = wp + (size_t)n * bb + (size_t)k * kb;
                if (PFM == CPU_PFM_TILE && (((size_t)k * kb) & 63) == 0)
                    cpu_pf_tile(pf, wp, bb, NB, n, (size_t)k * kb, PK_PF);
                wv[n] = dt == DTYPE_F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)a))
                                        : _mm512_loadu_ps((const float *)a);
            }
            if (PFM == CPU_PFM_AHEAD)
                cpu_ahead_step(&ah);
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++) {
                const __m512 xb = _mm512_set1_ps(PK_X(r, k));
#pragma GCC unroll 4
                for (int n = 0; n < NB; n++) acc[r][n] = _mm512_fmadd_ps(xb, wv[n], acc[r][n]);
            }
        }
    }
    if (PFM == CPU_PFM_AHEAD) ahead->at = ah.at;
#pragma GCC unroll 4
    for (int n = 0; n < NB; n++) {
        const int on = o + 16 * n;
        const __mmask16 mk = cpu_lane_mask16(on, o0, o1);
        if (mk == 0xFFFF) {
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++) {
                float *y = yr[r] + on;
                __m512 v = acc[r][n];
                if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(y), v);
                _mm512_storeu_ps(y, v);
            }
        } else if (mk) {
            // Unrolled like every loop over the accumulators: one that is
            // not makes GCC keep them in memory, stored after every FMA.
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++) {
                float *y = yr[r] + on;
                __m512 v = acc[r][n];
                if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, y), v);
                _mm512_mask_storeu_ps(y, mk, v);
            }
        }
    }
}

#define PK_TILE_MODE(PFM, MR, NB, DT, DP) pk_tile(MR, NB, false, DT, DP, PFM, xr, NULL, wp, bb, K, yr, o, o0, o1, acc, pf, ahead)
#define PK_CASE(DT, DP, MR)                                                                    \
    case MR:                                                                                 \
        if (nb == PK_NB) {                                                                   \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), PK_TILE_MODE, MR, PK_NB, DT, DP)              \
        } else if (nb == 3) {                                                                \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), PK_TILE_MODE, MR, 3, DT, DP)                  \
        } else if (nb == 2) {                                                                \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), PK_TILE_MODE, MR, 2, DT, DP)                  \
        } else {                                                                             \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), PK_TILE_MODE, MR, 1, DT, DP)                  \
        }                                                                                    \
        break;
// nb is PK_NB, or 1 to 3 for the blocks left over at the end of a range
// (cpu_chunk_tiles).
#define PK_TILES(NAME, DT, DP)                                                               \
    static void NAME(int mr, int nb, const float *const *xr, const char *wp, size_t bb, int K,  \
                     float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf,       \
                     struct cpu_ahead *ahead)                                                 \
    {                                                                                        \
        switch (mr) {                                                                        \
            PK_CASE(DT, DP, 1) PK_CASE(DT, DP, 2) PK_CASE(DT, DP, 3)                     \
            PK_CASE(DT, DP, 4) PK_CASE(DT, DP, 5) PK_CASE(DT, DP, 6)                     \
        }                                                                                    \
    }
PK_TILES(pk_tiles_bf16, DTYPE_BF16, false)
PK_TILES(pk_tiles_bf16_dp, DTYPE_BF16, true)
PK_TILES(pk_tiles_f16, DTYPE_F16, false)
PK_TILES(pk_tiles_f32, DTYPE_F32, false)

// Transposed-x tiles: MR rows (up to 16) x nb blocks, nb 3 (up to
// PK_XP_WIDE3_ROWS rows), 2 (up to PK_XP_WIDE_ROWS rows) or 1. Two blocks
// give the FMAs twice the independent chains to cover a late line with;
// three keep a third stream of weights in flight, with near prefetches only
// (the far ones crowd three streams), so that experts read from memory wait
// less: in one process against two blocks with the far prefetches,
// alternating (Zen 5, 2 threads, 64 bf16 experts of 384 x 1024 and 1024 x
// 384 from 12 layers on 2 MiB pages), 7 rows 16-22% faster, 8 rows 14-25%
// (gate/up and down), 64 tokens routed at random 5-8%, 48 tokens 1-3%. Nine
// rows (27 accumulators beside the weights' halves) spilled, and were no
// faster.
#define PK_XCASE(DT, DP, MR)                                                                       \
    case MR:                                                                                       \
        if (MR <= PK_XP_WIDE3_ROWS && nb == 3)                                                     \
            pk_tile(MR, 3, true, DT, DP, CPU_PFM_TILE, NULL, xp, wp, bb, K, yr, o, o0, o1, acc, pf, NULL); \
        else if (MR <= PK_XP_WIDE_ROWS && nb == 2)                                                 \
            pk_tile(MR, 2, true, DT, DP, CPU_PFM_TILE, NULL, xp, wp, bb, K, yr, o, o0, o1, acc, pf, NULL); \
        else pk_tile(MR, 1, true, DT, DP, CPU_PFM_TILE, NULL, xp, wp, bb, K, yr, o, o0, o1, acc, pf, NULL); \
        break;
#define PK_XTILES(NAME, DT, DP)                                                                   \
    static void NAME(int mr, int nb, const float *xp, const char *wp, size_t bb, int K,            \
                     float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf)           \
    {                                                                                             \
        switch (mr) {                                                                             \
            PK_XCASE(DT, DP, 7) PK_XCASE(DT, DP, 8) PK_XCASE(DT, DP, 9) PK_XCASE(DT, DP, 10)      \
            PK_XCASE(DT, DP, 11) PK_XCASE(DT, DP, 12) PK_XCASE(DT, DP, 13) PK_XCASE(DT, DP, 14)   \
            PK_XCASE(DT, DP, 15) PK_XCASE(DT, DP, 16)                                             \
        }                                                                                         \
    }
PK_XTILES(pk_xtiles_bf16, DTYPE_BF16, false)
PK_XTILES(pk_xtiles_bf16_dp, DTYPE_BF16, true)
PK_XTILES(pk_xtiles_f16, DTYPE_F16, false)
PK_XTILES(pk_xtiles_f32, DTYPE_F32, false)

// 16 x 16 blocks transposed in registers (two rounds of unpacks, two of
// 128-bit shuffles), where a scalar loop stored one value at a time. Every
// tall tile's matmul call interleaves its rows afresh (gate and up of an
// expert each: about 140 calls a layer in a 64-stream decode step).
// Measured on Zen 5: 512 values of 7 to 16 rows in 0.3-0.5 us against
// 1.2-2.9; the mid model's experts over 12 layers from memory (2 threads,
// one process choosing the scalar loop or this call by call, medians):
// gate/up of 64 tokens routed 1-2% faster (avx512_bf16) and 4% (avx512),
// of 8 and 10 rows each 3-4%, 16 rows the same.
void cpu_avx512_interleave_rows(const void *const *rows, int n_rows, int n, void *out)
{
    uint32_t *o = out;
    const __mmask16 keep = (__mmask16)((1u << n_rows) - 1u);
    for (int i0 = 0; i0 < n; i0 += 16) {
        const int left = n - i0 < 16 ? n - i0 : 16;
        const __mmask16 lm = (__mmask16)((1u << left) - 1u);
        __m512i a[16], b[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++)
            a[r] = r < n_rows ? _mm512_maskz_loadu_epi32(lm, (const uint32_t *)rows[r] + i0) : _mm512_setzero_si512();
        // b[2j], b[2j + 1]: rows 2j and 2j + 1 side by side, values 4L + {0, 1} and {2, 3} of lane L
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            b[2 * j] = _mm512_unpacklo_epi32(a[2 * j], a[2 * j + 1]);
            b[2 * j + 1] = _mm512_unpackhi_epi32(a[2 * j], a[2 * j + 1]);
        }
        // a[4j + c], lane L: rows 4j to 4j + 3 of value 4L + c
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            a[4 * j] = _mm512_unpacklo_epi64(b[4 * j], b[4 * j + 2]);
            a[4 * j + 1] = _mm512_unpackhi_epi64(b[4 * j], b[4 * j + 2]);
            a[4 * j + 2] = _mm512_unpacklo_epi64(b[4 * j + 1], b[4 * j + 3]);
            a[4 * j + 3] = _mm512_unpackhi_epi64(b[4 * j + 1], b[4 * j + 3]);
        }
        // then the lanes: rows 8j to 8j + 7, then all 16, of one value each
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                b[8 * j + c] = _mm512_shuffle_i32x4(a[8 * j + c], a[8 * j + 4 + c], 0x88);
                b[8 * j + 4 + c] = _mm512_shuffle_i32x4(a[8 * j + c], a[8 * j + 4 + c], 0xdd);
            }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            a[c] = _mm512_shuffle_i32x4(b[c], b[8 + c], 0x88);
            a[8 + c] = _mm512_shuffle_i32x4(b[c], b[8 + c], 0xdd);
        }
        // a[c]: value i0 + c of every row
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++)
            if (c < left) _mm512_mask_storeu_epi32(o + (size_t)(i0 + c) * (size_t)n_rows, keep, a[c]);
    }
}

typedef void (*pk_xtiles_fn)(int mr, int nb, const float *xp, const char *wp, size_t bb, int K,
                             float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf);

// 7 to 16 rows against an output range of at least PK_XP_BLOCKS_PER_ROW blocks a
// row (the lm_head of a decode step; experts of 384 outputs at up to 12
// rows, as a batch of about 64 gives them): all rows in one tile, so that
// each weight byte is read from memory once and meets every row (a block of
// 6 rows would be bound by memory, the others by L2), with x transposed
// once into scratch for the broadcasts (on narrower matrices the
// transposing costs more than it saves).
static void pk_matmul_xp(const struct cpu_mm *m, int o0, int o1, float *xp, bool dp)
{
    const int K = m->w.in, mr = m->rows;
    const size_t bb = cpu_pack_block_bytes(m->w.dtype, K);
    const pk_xtiles_fn tiles = m->w.dtype == DTYPE_BF16  ? (dp ? pk_xtiles_bf16_dp : pk_xtiles_bf16)
                               : m->w.dtype == DTYPE_F16 ? pk_xtiles_f16
                                                         : pk_xtiles_f32;
    float *yr[PK_XP_MAX_ROWS];
    const void *xr[PK_XP_MAX_ROWS];
    for (int r = 0; r < mr; r++) {
        xr[r] = m->x + (size_t)(m->x_rows ? m->x_rows[r] : r) * m->ldx;
        yr[r] = m->y + (size_t)(m->y_rows ? m->y_rows[r] : r) * m->ldy;
    }
    cpu_avx512_interleave_rows(xr, mr, K, xp);
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    const int nb = mr <= PK_XP_WIDE3_ROWS ? 3 : mr <= PK_XP_WIDE_ROWS ? 2 : 1;
    const enum cpu_pf pf = cpu_pf_mode_blocks(mr, nb);
    const char *w = m->w.packed;
    int b = b0;
    for (; b + nb <= b1; b += nb)
        tiles(mr, nb, xp, w + (size_t)b * bb, bb, K, yr, b * CPU_PACK_OUTS, o0, o1, m->accumulate, pf);
    for (; b < b1; b++)
        tiles(mr, 1, xp, w + (size_t)b * bb, bb, K, yr, b * CPU_PACK_OUTS, o0, o1, m->accumulate, pf);
}

typedef void (*pk_tiles_fn)(int mr, int nb, const float *const *xr, const char *wp, size_t bb, int K,
                            float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf, struct cpu_ahead *ahead);


// Outputs [o0, o1) of every row. Chunks of packed blocks (read from memory
// once, by the first row block, then from L2) meet every row block in turn;
// weights not packed at load are packed chunk by chunk into scratch.
static void pk_matmul_in(const struct cpu_mm *m, int o0, int o1, float *scratch, bool dp)
{
    if (m->w.quant != QUANT_NONE) {
        simd_qmatmul(m, o0, o1, scratch);
        return;
    }
    if (m->rows <= 0 || o0 >= o1) return;
    const int K = m->w.in;
    if (m->w.packed && m->rows > PK_MAX_MR && m->rows <= PK_XP_MAX_ROWS &&
        (o1 - o0) / CPU_PACK_OUTS >= PK_XP_BLOCKS_PER_ROW * m->rows) {
        pk_matmul_xp(m, o0, o1, scratch, dp);
        return;
    }
    const size_t bb = cpu_pack_block_bytes(m->w.dtype, K);
    const pk_tiles_fn tiles = m->w.dtype == DTYPE_BF16  ? (dp ? pk_tiles_bf16_dp : pk_tiles_bf16)
                              : m->w.dtype == DTYPE_F16 ? pk_tiles_f16
                                                        : pk_tiles_f32;
    // Row blocks of at most PK_MAX_MR rows (cpu_block_height). Six rows, not
    // more: their six x pointers, the weights' and the loop's stay in general
    // registers, where twelve spill (measured: 6 x 4 tiles 122 GFLOP/s on
    // one core against 83 for 12 x 2).
    const int bh = cpu_block_height(m->rows, PK_MAX_MR);
    const int chunk = cpu_pack_chunk_blocks(PK_CHUNK_BYTES, bb, PK_NB, m->w.packed);
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    const float *xr[PK_MAX_MR];
    float *yr[PK_MAX_MR];
    const int n_rb = (m->rows + bh - 1) / bh, kstep = m->w.dtype == DTYPE_BF16 ? K / 2 : K;
    for (int cb = b0; cb < b1; cb += chunk) {
        const int ce = b1 - cb < chunk ? b1 : cb + chunk;
        const char *wc = cpu_packed_blocks(&m->w, cb, ce, scratch);
        // The row blocks after the first bring the next chunk into L2.
        struct cpu_ahead ahead = cpu_ahead_plan(m->w.packed, bb, ce, b1, chunk,
                                                (size_t)(n_rb - 1) * (size_t)cpu_chunk_tiles(ce - cb, PK_NB) *
                                                    (size_t)kstep);
        for (int rb = 0; rb < m->rows; rb += bh) {
            const int mr = m->rows - rb < bh ? m->rows - rb : bh;
            cpu_mm_rows(m, rb, mr, xr, yr);
            const enum cpu_pf pf = cpu_pf_mode(rb == 0 && m->w.packed, m->rows);
            struct cpu_ahead *pa = rb > 0 && ahead.at ? &ahead : NULL;
            int b = cb;
            for (; b + PK_NB <= ce; b += PK_NB)
                tiles(mr, PK_NB, xr, wc + (size_t)(b - cb) * bb, bb, K, yr, b * CPU_PACK_OUTS, o0, o1,
                      m->accumulate, pf, pa);
            if (b < ce)
                tiles(mr, ce - b, xr, wc + (size_t)(b - cb) * bb, bb, K, yr, b * CPU_PACK_OUTS, o0, o1,
                      m->accumulate, pf, pa);
        }
    }
}

static void pk_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    pk_matmul_in(m, o0, o1, scratch, false);
}

void cpu_kernels_avx512_matmul_dp_order(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    pk_matmul_in(m, o0, o1, scratch, true); // the order only bf16 tiles have
}

static bool pk_wants_packed(const struct cpu_wmat *w) { return w->out > 0 && w->in > 0; }

static const struct cpu_kernels avx512_table = {
    .name = "avx512",
    .lanes = W,
    .unit = MM_UNIT,
    .matmul = pk_matmul,
    .wants_packed = pk_wants_packed,
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

const struct cpu_kernels *cpu_kernels_avx512_table(void);
const struct cpu_kernels *cpu_kernels_avx512_table(void) { return &avx512_table; }
