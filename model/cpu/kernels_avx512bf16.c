// kernels_avx512bf16: the avx512 table with its bf16 matmuls on AVX512_BF16
// dot products (VDPBF16PS; Zen 4 and later, Cooper Lake, Sapphire Rapids and
// later), the activations rounded to bf16 as GPUs and llama.cpp multiply.
// Compiled with the avx512 flags plus -mavx512bf16; reached only after
// cpu_kernels_avx512_bf16() checked the CPU, and only by name
// (MOESERVE_CPU_KERNELS=avx512_bf16): the fp32 tables stay the reference and
// the default. Everything but the bf16 and quantized matmuls (f16 and f32
// weights, attention, norms, the sampler's passes) is the avx512 table's;
// int4, int8 and fp8 run on VDPBF16PS too (their sections below), or, int4
// and fp8, on the tile unit.
//
// Why it pays: the packed bf16 layout (kernels.h) holds in each dword the
// weights of k = 2p and 2p + 1 for one output, which is what VDPBF16PS takes:
// one instruction multiplies a pair of k for 16 outputs and adds both
// products into fp32, where the fp32 matmul needs a shift, a mask and two
// FMAs. Compute-bound matmuls (prefill, experts and the lm_head at 16 and
// more rows) take half the instructions; bandwidth-bound ones (decode) read
// the same bytes as before.
//
// Where it does not pay: some cores run VDPBF16PS at half rate (the Intel
// Xeon measured: 85 GFLOP/s a core against 169 for FMAs), so two FMAs do a
// pair in less time. The table times both once (bf16_table_init) and there
// takes the FMA path (bf_matmul_fma): the same rounded x, the same pairs, in
// the instruction's own order (odd product first), so the same results
// (but for subnormal weights and sums, which VDPBF16PS flushes to zero and
// FMAs keep: a difference below 2^-126).
//
// Where the AMX tile unit is usable (Sapphire Rapids and later), the table's
// bf16 matrices that the tiles take go to it instead (kernels_amx.c: the same
// rounded x, one tile product a k-block), and so do the int4 and fp8 ones amx
// takes (there this table's results for them are over bf16 x too, within the same
// bound; elsewhere they are avx512's): two to four times the FMA path's
// speed on prefill, within the same bound below, but in the unit's own order
// of sums rather than one chain per output (bf16_table_init says which path
// it took).
//
// The numbers: x is rounded to bf16 (nearest even, VCVTNE2PS2BF16: 8
// significant bits, each activation off by at most 2^-9 of itself; NaN stays
// NaN, subnormal activations flush to zero), once per row. A product of two
// bf16 is exact in fp32. Every output is one chain over the k pairs in order
// from 0: y = dp(... dp(dp(0, w[0:2], x[0:2]), w[2:4], x[2:4]) ..., w[K-2:K],
// x[K-2:K]) (an odd K's last pair holds zeros above), then y_old + y when
// accumulating. Any tile, row block, chunk or output split gives an output
// the same bits, so a row's results do not depend on its batch. Against the
// fp32 reference, |y - y_fp32| <= 2^-8 * sum_k |w_k x_k| for K up to 2^15
// (the rounding of x, 2^-9, plus fp32 sums): the tolerance the kernel tests
// hold it to; the forward tests hold whole models to the CUDA backend's bf16
// bounds.
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "model/cpu/kernels.h"

const struct cpu_kernels *cpu_kernels_avx512_table(void);
const struct cpu_kernels *cpu_kernels_avx512_bf16_table(void);
const struct cpu_kernels *cpu_kernels_amx_bf16_table(const struct cpu_kernels *base);

#define AI static inline __attribute__((always_inline))

#define BF_MR 6                     // rows per tile of BF_NB blocks: 24 accumulators
#define BF_NB 4
#define BF_XP_MAX_ROWS 16           // rows an interleaved-x tile takes
#define BF_XP_WIDE3_ROWS 9          // up to these, three blocks wide (27 accumulators)
#define BF_XP_WIDE_ROWS 12          // up to these, two blocks wide (24 accumulators)
#define BF_XP_BLOCKS_PER_ROW 2      // blocks of outputs per row that pay for interleaving x
#define BF_CHUNK_BYTES (192u << 10) // packed weights each row block meets while they sit in L2
#define BF_PF 2048                  // how far ahead in its block the first row block prefetches
// ... and a tile of 7 to 9 rows three blocks wide (which takes no far
// prefetches): each of its three streams waits on memory less with lines
// twice as far ahead. In one process choosing call by call (Zen 5, 2
// threads, the mid model's experts over 12 layers from memory, medians):
// experts of 7 to 9 rows 5-12% faster than at 2 KiB on gate/up, 1-12% on
// down (3 KiB: 3-7%, 5 KiB: 2-7%); 64 tokens routed 1-6%, 48 tokens 0-2%.
// (The avx512 table's three-block tiles, bound by their FMAs, gained
// nothing: they stay at 2 KiB.)
#define BF_PF3 4096

// The matrices this table multiplies with bf16 activations: bf16 weights,
// not quantized; the rest go to the avx512 table as they are.
static bool bf_takes(const struct cpu_mm *m) { return m->w.quant == QUANT_NONE && m->w.dtype == DTYPE_BF16; }

// One tile: MR rows x NB blocks of 16 outputs. The rows' bf16 pairs come
// from row pointers (xr[r][p]: up to BF_MR rows), or, when XP, from one
// buffer holding them interleaved (xq[p * MR + r]), so that one pointer
// serves the broadcasts of a tall tile. wp: the first block; bb: bytes from
// a block to the next.
#define BF_X(r, p) (XP ? xq[(size_t)(p) * MR + (r)] : xr[r][p])

AI void bf_tile(const int MR, const int NB, const bool XP, const int PFM, const uint32_t *const *xr,
                const uint32_t *xq, const char *wp, size_t bb, int np, float *const *yr, int o, int o0, int o1,
                bool accumulate, enum cpu_pf pf, struct cpu_ahead *ahead)
{
    struct cpu_ahead ah = PFM == CPU_PFM_AHEAD ? *ahead : (struct cpu_ahead){0};
    __m512 acc[BF_XP_MAX_ROWS][BF_NB];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int n = 0; n < NB; n++) acc[r][n] = _mm512_setzero_ps();
    for (int p = 0; p < np; p++) {
        __m512bh wv[BF_NB];
#pragma GCC unroll 4
        for (int n = 0; n < NB; n++) {
            const char *a = wp + (size_t)n * bb + (size_t)p * 64;
            if (PFM == CPU_PFM_TILE) cpu_pf_tile(pf, wp, bb, NB, n, (size_t)p * 64, XP && NB == 3 ? BF_PF3 : BF_PF);
            wv[n] = (__m512bh)_mm512_loadu_si512(a);
        }
        if (PFM == CPU_PFM_AHEAD)
            cpu_ahead_step(&ah);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)BF_X(r, p));
#pragma GCC unroll 4
            for (int n = 0; n < NB; n++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], wv[n], xb);
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

#define BF_TILE_MODE(PFM, MR, NB) bf_tile(MR, NB, false, PFM, xr, NULL, wp, bb, np, yr, o, o0, o1, acc, pf, ahead)
#define BF_CASE(MR)                                                                               \
    case MR:                                                                                      \
        if (nb == BF_NB) {                                                                        \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), BF_TILE_MODE, MR, BF_NB)                           \
        } else if (nb == 3) {                                                                     \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), BF_TILE_MODE, MR, 3)                               \
        } else if (nb == 2) {                                                                     \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), BF_TILE_MODE, MR, 2)                               \
        } else {                                                                                  \
            CPU_PFM_SWITCH(cpu_pfm(pf, ahead), BF_TILE_MODE, MR, 1)                               \
        }                                                                                         \
        break;
// mr rows (1 to BF_MR) from row pointers x nb blocks: nb is BF_NB, or 1 to
// 3 for the blocks left at the end of a range (cpu_chunk_tiles).
static void bf_tiles(int mr, int nb, const uint32_t *const *xr, const char *wp, size_t bb, int np,
                     float *const *yr, int o, int o0, int o1, bool acc, enum cpu_pf pf, struct cpu_ahead *ahead)
{
    switch (mr) { BF_CASE(1) BF_CASE(2) BF_CASE(3) BF_CASE(4) BF_CASE(5) BF_CASE(6) }
}

// 7 to 16 interleaved rows x nb blocks: nb 3 (up to BF_XP_WIDE3_ROWS rows:
// 27 accumulators, 3 weight vectors and the broadcast fill the 32
// registers), 2 (up to BF_XP_WIDE_ROWS rows) or 1. Two blocks give the dot
// products twice the independent chains to cover a late line with; three
// keep a third stream of weights in flight, and a tile of 7 to 9 rows that
// reads its experts from memory waits on them less: measured on Zen 5 (2
// threads, 64 experts of 384 x 1024 and 1024 x 384 from 12 layers on 2 MiB
// pages, one process alternating against two blocks with far prefetches,
// medians), experts of 7 to 9 rows 13-14% faster (the weights' read),
// 48 and 64 tokens routed at random (rows per expert spread around 6 and
// 8) 3-6%; the same bits. (Ten rows take 30 accumulators: too many with the
// weights. Two blocks up to 14 rows, or 10 to 16 rows in two passes of
// three-block tiles, were no faster.)
#define BF_XCASE(MR)                                                                          \
    case MR:                                                                                  \
        if (MR <= BF_XP_WIDE3_ROWS && nb == 3)                                                \
            bf_tile(MR, 3, true, CPU_PFM_TILE, NULL, xq, wp, bb, np, yr, o, o0, o1, acc, pf, NULL); \
        else if (MR <= BF_XP_WIDE_ROWS && nb == 2)                                            \
            bf_tile(MR, 2, true, CPU_PFM_TILE, NULL, xq, wp, bb, np, yr, o, o0, o1, acc, pf, NULL); \
        else bf_tile(MR, 1, true, CPU_PFM_TILE, NULL, xq, wp, bb, np, yr, o, o0, o1, acc, pf, NULL); \
        break;
static void bf_xtiles(int mr, int nb, const uint32_t *xq, const char *wp, size_t bb, int np, float *const *yr,
                      int o, int o0, int o1, bool acc, enum cpu_pf pf)
{
    switch (mr) {
        BF_XCASE(7) BF_XCASE(8) BF_XCASE(9) BF_XCASE(10) BF_XCASE(11) BF_XCASE(12) BF_XCASE(13)
        BF_XCASE(14) BF_XCASE(15) BF_XCASE(16)
    }
}

// One row of x as bf16 pairs into d (np dwords; an odd K's last pair has 0
// above): 32 values a step, bf16 i of a step being x[k + i], so that dword i
// is pair k/2 + i.
static void bf_round_row(const float *x, int K, uint32_t *d)
{
    for (int k = 0; k < K; k += 32) {
        const int left = K - k;
        const __mmask16 lo = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
        const __mmask16 hi = left >= 32 ? 0xFFFF : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1u);
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + k + 16), _mm512_maskz_loadu_ps(lo, x + k));
        const int pairs = left >= 32 ? 16 : (left + 1) / 2;
        _mm512_mask_storeu_epi32(d + k / 2, (__mmask16)((1u << pairs) - 1u), (__m512i)v);
    }
}

// Row r of m's x as bf16 pairs: the row cpu_matmul rounded (m->xq), or
// that row rounded now into d.
static const uint32_t *bf_row(const struct cpu_mm *m, int r, uint32_t *d)
{
    const int xi = m->x_rows ? m->x_rows[r] : r;
    if (m->xq) return m->xq + (size_t)xi * m->ldxq;
    bf_round_row(m->x + (size_t)xi * m->ldx, m->w.in, d);
    return d;
}

// Rows rb..rb+mr-1 of x rounded into xb (row r at xb + r * np; called only
// where cpu_matmul did not round them); their x pointers into xr and y rows
// into yr.
static void bf_pack_rows(const struct cpu_mm *m, int rb, int mr, uint32_t *xb, const uint32_t **xr, float **yr)
{
    const int np = (m->w.in + 1) / 2;
    for (int r = 0; r < mr; r++) {
        const int yi = m->y_rows ? m->y_rows[rb + r] : rb + r;
        yr[r] = m->y + (size_t)yi * m->ldy;
        xr[r] = bf_row(m, rb + r, xb + (size_t)r * np);
    }
}

// All rows (up to BF_XP_MAX_ROWS) as pairs, interleaved: pair p of row r
// at xq[p * rows + r]; tmp holds the rows cpu_matmul did not round (row r
// at tmp + r * np) on the way.
static void bf_pack_interleaved(const struct cpu_mm *m, uint32_t *xq, uint32_t *tmp, float **yr)
{
    const int np = (m->w.in + 1) / 2, rows = m->rows;
    const void *xr[BF_XP_MAX_ROWS];
    for (int r = 0; r < rows; r++) {
        const int yi = m->y_rows ? m->y_rows[r] : r;
        yr[r] = m->y + (size_t)yi * m->ldy;
        xr[r] = bf_row(m, r, tmp + (size_t)r * np);
    }
    cpu_avx512_interleave_rows(xr, rows, np, xq);
}

// ---- int4 on VDPBF16PS ----------------------------------------------------------
//
// int4 matrices (model/quant.h's packed blocks) multiplied by the same
// rounded x as the bf16 ones, on VDPBF16PS too, where the avx512 table's
// FMA path turns every nibble into fp32 and takes one FMA a weight (bound by
// those instructions at batch 1 as in prefill: int4 read at 51 GB/s from L2
// on 2 Zen 5 cores, prefill at 60% of the fp32 FMA peak).
//
// The codes go into bf16 exactly and in two instructions a vector: 16 + q
// (q in 0..15) is 2^4 (1 + q / 16), the bf16 0x4180 | q << 3, so a shift
// that puts nibbles i and i + 4 of an 8-input dword at bits 3..6 and 19..22
// and one ternary-logic op (mask, then or the exponent in) give each
// output's pair (16 + q[k0 + i], 16 + q[k0 + i + 4]). x is paired to match
// (bq_prep_row: the rounded row's bf16 in the order k0, k0 + 4, k0 + 1,
// k0 + 5, ...), and the 16 the codes carry is taken out with the zero
// point per group, as the FMA path takes z out:
//   t_g = dp chain over the group's pairs from 0 (each pair's k0 + i + 4
//         product first, then k0 + i, as VDPBF16PS rounds)
//   y   = fma(s_g, t_g - (16 + z_g) * xs_g, y)  over g in order, from y = 0,
// where xs_g is the fp32 sum of the group's rounded x (a fixed vector
// order, once per row). Every tile, row block, chunk and output split
// gives an output these bits, so a row's results do not depend on its
// batch. Against the fp32 matmul on the dequantized weights the only new
// rounding is x's (2^-9 of each activation, as for bf16 weights) and the
// fp32 sums over 16 + q: within the table's 2^-8 * sum |w x| (the kernel
// test holds it there). The table's FMA path keeps int4 on the avx512
// matmul (fp32 x); the tile path, where the tile unit is usable, leaves
// the int4 matrices it does not take to whichever of the two paths the
// CPU's timing picked (the FMA one on the Xeons measured).
#define BQ_MR 4          // rows per tile of BQ_NB blocks
#define BQ_NB 4
#define BQ_NB1 8         // blocks of a tile of one or two rows: 8 streams of weights in flight
#define BQ_PF 1024       // how far ahead the first row block prefetches
#define BQ_CHUNK_BYTES (192u << 10)

static bool bq_takes(const struct cpu_mm *m) { return m->w.quant == QUANT_INT4 && m->w.packed; }

// Pair i (0..3) of an 8-input step's dwords: (16 + nibble i, 16 + nibble i + 4) in bf16.
AI __m512bh bq_pair(__m512i raw, const int i)
{
    const __m512i s = i == 0 ? _mm512_slli_epi32(raw, 3) : _mm512_srli_epi32(raw, (unsigned)(4 * i - 3));
    // (s & 0x00780078) | 0x41804180
    return (__m512bh)_mm512_ternarylogic_epi32(s, _mm512_set1_epi32(0x00780078), _mm512_set1_epi32(0x41804180),
                                               0xEA);
}

// One row for the tiles: its bf16 pairs (np of them, an odd K's last pair
// with 0 above) as bq_pair pairs the codes, kp / 2 dwords (zeros past K),
// and each group's sum of the rounded x (ng floats).
static void bq_prep_row(const uint32_t *xn, int K, int G, int ng, uint32_t *xs, float *xsum)
{
    const int np = (K + 1) / 2, n4 = (K + 7) / 8 * 4;
    // Words 0..7 of each 16 bytes in the order 0, 4, 1, 5, 2, 6, 3, 7.
    const __m512i ord = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
    for (int d = 0; d < n4; d += 16) {
        const int left = np - d;
        const __mmask16 mk = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
        const __m512i v = _mm512_shuffle_epi8(_mm512_maskz_loadu_epi32(mk, xn + d), ord);
        const int st = n4 - d >= 16 ? 16 : n4 - d;
        _mm512_mask_storeu_epi32(xs + d, (__mmask16)((1u << st) - 1u), v);
    }
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int g = 0; g < ng; g++) {
        const int d0 = g * G / 2, d1 = g == ng - 1 ? np : (g + 1) * G / 2;
        __m512 acc = _mm512_setzero_ps();
        for (int d = d0; d < d1; d += 16) {
            const int left = d1 - d;
            const __mmask16 mk = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
            const __m512i v = _mm512_maskz_loadu_epi32(mk, xn + d);
            acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
            acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_and_si512(v, hi)));
        }
        xsum[g] = _mm512_reduce_add_ps(acc);
    }
}

// Whether a tile makes one block's pair at a time, just before its
// products, rather than every block's first: where the accumulators, the
// raw codes, the pairs and the broadcasts would not fit the 32 registers
// (two rows x 8 blocks). Where they fit, every pair first (one row from L2
// on Zen 5, bench_cpu_matmul, builds alternating: 71-84 GB/s of int4 over
// four runs, against 71-75 one at a time). Two rows over 8 blocks rather
// than 4 keep twice the streams of weights in flight: 16 tokens' routed
// experts from memory (most of them one or two rows) at 40-47 GB/s against
// 32-42, 128 experts of two rows each at 35-44 against 29-38.
#define BQ_ONE_PAIR(MR, NB) ((MR) * (NB) + 2 * (NB) + (MR) > 30)

// One tile: MR rows (their prepared pairs at xs + r * xs_ld, group sums at
// xsum + r * ng) x NB blocks from wp, bb bytes apart; the outputs' sums
// into yb (row r, block n at yb + (r * NB + n) * 16).
AI void bq_tile(const int MR, const int NB, const uint32_t *xs, size_t xs_ld, const float *xsum, const char *wp,
                size_t bb, size_t H, int K, int G, int ng, float *yb, bool pf)
{
    for (int i = 0; i < MR * NB * 16; i += 16) _mm512_storeu_ps(yb + i, _mm512_setzero_ps());
    for (int g = 0; g < ng; g++) {
        const int k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
        __m512 acc[BQ_MR][BQ_NB1 > BQ_NB ? BQ_NB1 : BQ_NB];
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
            for (int n = 0; n < NB; n++) acc[r][n] = _mm512_setzero_ps();
        for (int k = k0; k < k1; k += 8) {
            const char *a = wp + H + (size_t)k * 8;
            __m512i raw[BQ_NB1 > BQ_NB ? BQ_NB1 : BQ_NB];
#pragma GCC unroll 8
            for (int n = 0; n < NB; n++) {
                if (pf) _mm_prefetch(cpu_pf_ahead(wp, bb, NB, n, (size_t)(a - wp), BQ_PF), _MM_HINT_T0);
                raw[n] = _mm512_loadu_si512(a + (size_t)n * bb);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512bh xb[BQ_MR], wv[BQ_NB1 > BQ_NB ? BQ_NB1 : BQ_NB];
#pragma GCC unroll 8
                for (int r = 0; r < MR; r++)
                    xb[r] = (__m512bh)_mm512_set1_epi32((int)xs[(size_t)r * xs_ld + (size_t)k / 2 + i]);
                if (BQ_ONE_PAIR(MR, NB)) {
#pragma GCC unroll 8
                    for (int n = 0; n < NB; n++) {
                        const __m512bh w = bq_pair(raw[n], i);
#pragma GCC unroll 8
                        for (int r = 0; r < MR; r++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], w, xb[r]);
                    }
                } else {
#pragma GCC unroll 8
                    for (int n = 0; n < NB; n++) wv[n] = bq_pair(raw[n], i);
#pragma GCC unroll 8
                    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
                        for (int n = 0; n < NB; n++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], wv[n], xb[r]);
                }
            }
        }
#pragma GCC unroll 8
        for (int n = 0; n < NB; n++) {
            const char *h = wp + (size_t)n * bb + (size_t)g * 48;
            const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
            const __m512 z = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(h + 32)))),
                                           _mm512_set1_ps(16.0f));
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const __m512 t = _mm512_fnmadd_ps(z, _mm512_set1_ps(xsum[(size_t)r * ng + g]), acc[r][n]);
                float *y = yb + ((size_t)r * NB + (size_t)n) * 16;
                _mm512_storeu_ps(y, _mm512_fmadd_ps(s, t, _mm512_loadu_ps(y)));
            }
        }
    }
}

#define BQ_TILE(MR, NB) bq_tile(MR, NB, xs, xs_ld, xsum, wp, bb, H, K, G, ng, yb, pf)
#define BQ_CASE(MR)                                                                                \
    case MR:                                                                                       \
        if (MR <= 2 && nb == BQ_NB1) BQ_TILE(MR, BQ_NB1);                                          \
        else if (nb == BQ_NB) BQ_TILE(MR, BQ_NB);                                                  \
        else BQ_TILE(MR, 1);                                                                       \
        break;
// mr rows (1 to BQ_MR) x nb blocks: BQ_NB1 (one or two rows), BQ_NB or 1.
static void bq_tiles(int mr, int nb, const uint32_t *xs, size_t xs_ld, const float *xsum, const char *wp,
                     size_t bb, size_t H, int K, int G, int ng, float *yb, bool pf)
{
    switch (mr) { BQ_CASE(1) BQ_CASE(2) BQ_CASE(3) BQ_CASE(4) }
}

// The tile's sums into y: the lanes of outputs [o0, o1) only (a thread's
// range may start or end inside a block).
static void bq_store(const float *yb, int mr, int nb, int o, int o0, int o1, float *const *yr, bool accumulate)
{
    for (int r = 0; r < mr; r++)
        for (int n = 0; n < nb; n++) {
            const __mmask16 mk = cpu_lane_mask16(o + 16 * n, o0, o1);
            if (!mk) continue;
            float *y = yr[r] + o + 16 * n;
            __m512 v = _mm512_loadu_ps(yb + ((size_t)r * nb + (size_t)n) * 16);
            if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, y), v);
            _mm512_mask_storeu_ps(y, mk, v);
        }
}

// Outputs [o0, o1) of every row of an int4 matrix. Chunks of blocks (read
// from memory by the first row block, then from L2) meet every row block in
// turn; a single row block (decode) streams the range in one. The codes are
// made bf16 in registers by every row block: two instructions a vector
// beside BQ_MR dot products, where the FMA path needed its chunks made
// fp32 once into L2. The rows' pairs and group sums are prepared once a
// call when all of them fit the scratch (the experts of a prefill, not its
// 512-row projections of 2048 inputs), else for each chunk, a row block at
// a time. The first row block's last tile prefetches past the range, as
// the bf16 tiles do: the lines there start what the thread reads next (its
// next piece of the call, cpu_matmul, or the next expert's matrix), and
// those past the end of the weights are never loaded (a prefetch does not
// fault).
static void bq_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (m->rows <= 0 || o0 >= o1) return;
    const int K = m->w.in, G = m->w.group > 0 ? m->w.group : K, ng = quant_groups(K, G);
    const int n4 = (K + 7) / 8 * 4, np = (K + 1) / 2;
    const size_t bb = quant_block_bytes(QUANT_INT4, K, m->w.group);
    const size_t H = quant_block_header_bytes(QUANT_INT4, K, m->w.group);
    const int bh = cpu_block_height(m->rows, BQ_MR);
    _Static_assert(2 * BQ_NB1 <= BQ_MR * BQ_NB, "a two-row tile's sums fit a full tile's");
    // Scratch: the prepared rows (all of them, or a row block's), their
    // group sums, one tile's sums, a row rounded here.
    const size_t xs_f = ((size_t)m->rows * (size_t)n4 + 15) / 16 * 16;
    const size_t xsum_f = ((size_t)m->rows * (size_t)ng + 15) / 16 * 16;
    const bool once = m->rows > bh && xs_f + xsum_f + (size_t)BQ_MR * BQ_NB * 16 + (size_t)np <=
                                          cpu_kernels_scratch_floats(K, 1, 1);
    const int held = once ? m->rows : BQ_MR;
    uint32_t *xs = (uint32_t *)scratch;                                       // (held, n4)
    float *xsum = scratch + ((size_t)held * (size_t)n4 + 15) / 16 * 16;       // (held, ng)
    float *yb = xsum + ((size_t)held * (size_t)ng + 15) / 16 * 16;            // (BQ_MR, BQ_NB * 16) or (2, BQ_NB1 * 16)
    uint32_t *tmp = (uint32_t *)(yb + (size_t)BQ_MR * BQ_NB * 16);            // (np): a row rounded here
    if (once)
        for (int r = 0; r < m->rows; r++)
            bq_prep_row(bf_row(m, r, tmp), K, G, ng, xs + (size_t)r * n4, xsum + (size_t)r * ng);
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    int chunk = b1 - b0;
    if (m->rows > bh) {
        chunk = (int)(BQ_CHUNK_BYTES / bb) / BQ_NB * BQ_NB;
        if (chunk < BQ_NB) chunk = BQ_NB;
    }
    float *yr[BQ_MR];
    for (int cb = b0; cb < b1; cb += chunk) {
        const int ce = b1 - cb < chunk ? b1 : cb + chunk;
        const char *wc = (const char *)m->w.packed + (size_t)cb * bb;
        for (int rb = 0; rb < m->rows; rb += bh) {
            const int mr = m->rows - rb < bh ? m->rows - rb : bh;
            const uint32_t *xb = once ? xs + (size_t)rb * n4 : xs;
            const float *sb = once ? xsum + (size_t)rb * ng : xsum;
            for (int r = 0; r < mr; r++) {
                const int yi = m->y_rows ? m->y_rows[rb + r] : rb + r;
                yr[r] = m->y + (size_t)yi * m->ldy;
                if (!once)
                    bq_prep_row(bf_row(m, rb + r, tmp), K, G, ng, xs + (size_t)r * n4, xsum + (size_t)r * ng);
            }
            const bool pf = rb == 0;
            int b = cb;
            // The widest tiles first, then BQ_NB-wide ones, then single blocks.
            const int widths[2] = {mr <= 2 ? BQ_NB1 : BQ_NB, BQ_NB};
            for (int wi = 0; wi < 2; wi++)
                for (const int nb = widths[wi]; b + nb <= ce; b += nb) {
                    bq_tiles(mr, nb, xb, (size_t)n4, sb, wc + (size_t)(b - cb) * bb, bb, H, K, G, ng, yb, pf);
                    bq_store(yb, mr, nb, b * CPU_PACK_OUTS, o0, o1, yr, m->accumulate);
                }
            for (; b < ce; b++) {
                bq_tiles(mr, 1, xb, (size_t)n4, sb, wc + (size_t)(b - cb) * bb, bb, H, K, G, ng, yb, false);
                bq_store(yb, mr, 1, b * CPU_PACK_OUTS, o0, o1, yr, m->accumulate);
            }
        }
    }
}

// ---- fp8 and int8 on VDPBF16PS -------------------------------------------------
//
// The one-byte formats (bf8_*: fp8 and int8, whose blocks share a layout:
// 16 codes an input, 16 fp32 scales a group) multiplied by the rounded x on
// VDPBF16PS too. Every value of both is a bf16 value, so a code goes into
// bf16 exactly:
// - fp8 (e4m3: 4 significant bits, exponents 2^-9 to 2^8): a normal code by
//   moving its exponent and mantissa bits up 4 and adding 120 to the
//   exponent, the 8 subnormal magnitudes (and zero) from a table, the sign
//   bit up 8 (8 instructions for 32 codes, an input pair of 16 outputs, the
//   load included);
// - int8 (q in -128..127: at most 8 significant bits): sign-extended and
//   converted to fp32, whose upper half is then q's bf16 (6 instructions for
//   the same 32 codes).
// Per output and scale group g: t_g = dp chain over the group's input
// pairs (2p, 2p + 1) in order from 0, then y = fma(s_g, t_g, y) over g in
// order, from y = 0. A matmul of one row block makes the pairs in
// registers; more row blocks make each chunk's pairs once into scratch
// (bf8_fill: the same values) and read them there. Within the table's 2^-8
// * sum |w x| of the fp32 matmul (x's rounding; the products are exact), as
// the kernel test holds it. Matrices with an odd number of inputs or groups
// stay on avx512. (int8 does not go the way of int4's 16 + q: one nibble a
// bf16 value would take two dot products an input, as many as the FMA
// path's FMAs.)
#define BF8_MR 4         // rows per tile that makes its pairs (their constants take 6 registers)
#define BF8_MRB 6        // rows per tile over pairs made once a chunk
#define BF8_NB 4
#define BF8_NB1 8        // blocks of a one-row tile
#define BF8_PF 1024
#define BF8_CHUNK_BYTES (192u << 10)
#define BF8_BUF_FLOATS (128u << 10) // a chunk's pairs: 512 KiB at most

static bool bf8_takes(const struct cpu_mm *m)
{
    const int G = m->w.group > 0 ? m->w.group : m->w.in;
    return (m->w.quant == QUANT_FP8 || m->w.quant == QUANT_INT8) && m->w.packed && m->w.in % 2 == 0 && G % 2 == 0;
}

// Input pair (k, k + 1) of a block's 16 outputs as bf16 pairs, from the 32
// codes at p (k's 16, then k + 1's): fp8 codes, or int8 ones (I8).
AI __m512i bf8_pair(const bool I8, const char *p)
{
    if (I8) {
        const __m128i *src = (const __m128i *)p;
        const __m512i a = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src))));
        const __m512i b = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(src + 1))));
        // (a >> 16) | (b & 0xFFFF0000): k's bf16 low, k + 1's high.
        return _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 16), b, _mm512_set1_epi32((int)0xFFFF0000u), 0xF8);
    }
    // Words: k's outputs 0..15, then k + 1's; interleaved, then each a code.
    const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                        6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    // The subnormal magnitudes m * 2^-9 (m = 0..7) in bf16.
    const __m512i sub = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0x3C60, 0x3C40, 0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0);
    // Sign-extended, so that the sign bit lands at bit 15 with the rest.
    const __m512i c = _mm512_permutexvar_epi16(il, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)));
    __m512i r = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(c, 4), _mm512_set1_epi16((short)0x87F0)),
                                 _mm512_set1_epi16(0x3C00));
    r = _mm512_mask_permutexvar_epi16(r, _mm512_testn_epi16_mask(c, _mm512_set1_epi16(0x0078)), c, sub);
    // The table's magnitudes take their sign: r | (c & 0x8000).
    return _mm512_ternarylogic_epi32(r, c, _mm512_set1_epi16((short)0x8000), 0xF8);
}

// Blocks [0, nb) at wp as bf8_pair makes them, into qb: block n's pair p
// at qb + n qbs + 16 p (K / 2 pairs); bf8_fill_of below for a run-time I8.
AI void bf8_fill(const bool I8, const char *wp, size_t bb, size_t H, int nb, int K, uint32_t *qb, size_t qbs)
{
    for (int n = 0; n < nb; n++)
        for (int p = 0; p < K / 2; p++)
            _mm512_storeu_si512(qb + (size_t)n * qbs + (size_t)p * 16,
                                bf8_pair(I8, wp + (size_t)n * bb + H + (size_t)p * 32));
}

// One tile: MR rows (their bf16 pairs at xr[r]) x NB blocks, the pairs
// made here from the codes at wp (BUF false; int8 ones where I8) or read
// from qb; the sums into yb (row r, block n at yb + (r * NB + n) * 16).
AI void bf8_tile(const bool I8, const int MR, const int NB, const bool BUF, const uint32_t *const *xr,
                 const char *wp, size_t bb, size_t H, const uint32_t *qb, size_t qbs, int K, int G, int ng,
                 float *yb, bool pf)
{
    for (int i = 0; i < MR * NB * 16; i += 16) _mm512_storeu_ps(yb + i, _mm512_setzero_ps());
    for (int g = 0; g < ng; g++) {
        const int p0 = g * G / 2, p1 = g == ng - 1 ? K / 2 : (g + 1) * G / 2;
        __m512 acc[BF8_MRB][BF8_NB1];
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
            for (int n = 0; n < NB; n++) acc[r][n] = _mm512_setzero_ps();
        for (int p = p0; p < p1; p++) {
            __m512bh wv[BF8_NB1];
#pragma GCC unroll 8
            for (int n = 0; n < NB; n++) {
                if (BUF) {
                    wv[n] = (__m512bh)_mm512_loadu_si512(qb + (size_t)n * qbs + (size_t)p * 16);
                } else {
                    const char *a = wp + (size_t)n * bb + H + (size_t)p * 32;
                    if (pf && (p & 1) == 0) _mm_prefetch(cpu_pf_ahead(wp, bb, NB, n, (size_t)(a - wp) - (size_t)n * bb, BF8_PF), _MM_HINT_T0);
                    wv[n] = (__m512bh)bf8_pair(I8, a);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xr[r][p]);
#pragma GCC unroll 8
                for (int n = 0; n < NB; n++) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], wv[n], xb);
            }
        }
#pragma GCC unroll 8
        for (int n = 0; n < NB; n++) {
            const __m512 s = _mm512_loadu_ps((const float *)(wp + (size_t)n * bb + (size_t)g * 64));
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                float *y = yb + ((size_t)r * NB + (size_t)n) * 16;
                _mm512_storeu_ps(y, _mm512_fmadd_ps(s, acc[r][n], _mm512_loadu_ps(y)));
            }
        }
    }
}

#define BF8_TILE(MR, NB, BUF) bf8_tile(I8, MR, NB, BUF, xr, wp, bb, H, qb, qbs, K, G, ng, yb, pf)
#define BF8_CASE(MR)                                                                               \
    case MR:                                                                                       \
        if (qb) {                                                                                  \
            if (nb == BF8_NB) BF8_TILE(MR, BF8_NB, true);                                          \
            else BF8_TILE(MR, 1, true);                                                            \
        } else if (MR <= BF8_MR) {                                                                 \
            if (MR == 1 && nb == BF8_NB1) BF8_TILE(1, BF8_NB1, false);                             \
            else if (nb == BF8_NB) BF8_TILE(MR <= BF8_MR ? MR : BF8_MR, BF8_NB, false);            \
            else BF8_TILE(MR <= BF8_MR ? MR : BF8_MR, 1, false);                                   \
        }                                                                                          \
        break;
// mr rows x nb blocks: from qb (mr up to BF8_MRB; nb BF8_NB or 1), or
// making their pairs (mr up to BF8_MR; nb BF8_NB1 for one row, BF8_NB or 1),
// of fp8 codes, or int8 ones (I8).
AI void bf8_tiles_of(const bool I8, int mr, int nb, const uint32_t *const *xr, const char *wp, size_t bb,
                     size_t H, const uint32_t *qb, size_t qbs, int K, int G, int ng, float *yb, bool pf)
{
    switch (mr) { BF8_CASE(1) BF8_CASE(2) BF8_CASE(3) BF8_CASE(4) BF8_CASE(5) BF8_CASE(6) }
}

// bf8_tiles_of and bf8_fill for a run-time i8: the int8 and fp8 instances.
static void bf8_tiles(bool i8, int mr, int nb, const uint32_t *const *xr, const char *wp, size_t bb, size_t H,
                      const uint32_t *qb, size_t qbs, int K, int G, int ng, float *yb, bool pf)
{
    if (i8) bf8_tiles_of(true, mr, nb, xr, wp, bb, H, qb, qbs, K, G, ng, yb, pf);
    else bf8_tiles_of(false, mr, nb, xr, wp, bb, H, qb, qbs, K, G, ng, yb, pf);
}

static void bf8_fill_of(bool i8, const char *wp, size_t bb, size_t H, int nb, int K, uint32_t *qb, size_t qbs)
{
    if (i8) bf8_fill(true, wp, bb, H, nb, K, qb, qbs);
    else bf8_fill(false, wp, bb, H, nb, K, qb, qbs);
}

// Outputs [o0, o1) of every row of an fp8 or int8 matrix: chunks of blocks meet
// every row block in turn (a single row block streams the range in one),
// their pairs made once a chunk where there are two row blocks or more.
static void bf8_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (m->rows <= 0 || o0 >= o1) return;
    const int K = m->w.in, G = m->w.group > 0 ? m->w.group : K, ng = quant_groups(K, G), np = K / 2;
    const bool i8 = m->w.quant == QUANT_INT8;
    const size_t bb = quant_block_bytes(m->w.quant, K, m->w.group);
    const size_t H = quant_block_header_bytes(m->w.quant, K, m->w.group);
    float *yb = scratch;                                                      // (BF8_MRB, BF8_NB * 16)
    uint32_t *xb = (uint32_t *)(yb + (size_t)BF8_MRB * BF8_NB1 * 16);         // (BF8_MRB, np): rows rounded here
    uint32_t *qb = xb + ((size_t)BF8_MRB * (size_t)np + 15) / 16 * 16;        // (chunk, np, 16) where made once
    const size_t qbs = (size_t)np * 16;
    int bh = cpu_block_height(m->rows, BF8_MR);
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    int chunk = b1 - b0;
    bool buf = false;
    if (m->rows > bh) {
        chunk = (int)(BF8_CHUNK_BYTES / bb) / BF8_NB * BF8_NB;
        if (chunk < BF8_NB) chunk = BF8_NB;
        size_t room = (cpu_kernels_scratch_floats(K, 1, 1) - (size_t)((float *)qb - scratch));
        if (room > BF8_BUF_FLOATS) room = BF8_BUF_FLOATS;
        const int qchunk = (int)(room / qbs) / BF8_NB * BF8_NB;
        if (qchunk >= BF8_NB) {
            buf = true;
            chunk = qchunk;
            bh = cpu_block_height(m->rows, BF8_MRB);
        }
    }
    const uint32_t *xr[BF8_MRB];
    float *yr[BF8_MRB];
    for (int cb = b0; cb < b1; cb += chunk) {
        const int ce = b1 - cb < chunk ? b1 : cb + chunk;
        const char *wc = (const char *)m->w.packed + (size_t)cb * bb;
        if (buf) bf8_fill_of(i8, wc, bb, H, ce - cb, K, qb, qbs);
        for (int rb = 0; rb < m->rows; rb += bh) {
            const int mr = m->rows - rb < bh ? m->rows - rb : bh;
            for (int r = 0; r < mr; r++) {
                const int yi = m->y_rows ? m->y_rows[rb + r] : rb + r;
                yr[r] = m->y + (size_t)yi * m->ldy;
                xr[r] = bf_row(m, rb + r, xb + (size_t)r * np);
            }
            const bool pf = rb == 0 && !buf;
            int b = cb;
            const int widths[2] = {mr == 1 && !buf ? BF8_NB1 : BF8_NB, BF8_NB};
            for (int wi = 0; wi < 2; wi++)
                for (const int nb = widths[wi]; b + nb <= ce; b += nb) {
                    bf8_tiles(i8, mr, nb, xr, wc + (size_t)(b - cb) * bb, bb, H,
                              buf ? qb + (size_t)(b - cb) * qbs : NULL, qbs, K, G, ng, yb, pf && b + 2 * nb <= b1);
                    bq_store(yb, mr, nb, b * CPU_PACK_OUTS, o0, o1, yr, m->accumulate);
                }
            for (; b < ce; b++) {
                bf8_tiles(i8, mr, 1, xr, wc + (size_t)(b - cb) * bb, bb, H, buf ? qb + (size_t)(b - cb) * qbs : NULL,
                          qbs, K, G, ng, yb, false);
                bq_store(yb, mr, 1, b * CPU_PACK_OUTS, o0, o1, yr, m->accumulate);
            }
        }
    }
}

// Outputs [o0, o1) of every row. 7 to 16 rows against an output range of at
// least BF_XP_BLOCKS_PER_ROW blocks a row (the lm_head of a decode step; experts
// of 384 outputs at up to 12 rows, as a batch of about 64 gives them) go
// through one tall tile, as in the avx512 table, so that each weight byte is
// read from memory once and meets every row; otherwise chunks of packed blocks
// (read from memory by the first row block, then from L2) meet every row
// block in turn. Weights not packed at load are packed chunk by chunk.
static void bf_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (bq_takes(m)) {
        bq_matmul(m, o0, o1, scratch);
        return;
    }
    if (bf8_takes(m)) {
        bf8_matmul(m, o0, o1, scratch);
        return;
    }
    if (!bf_takes(m)) {
        cpu_kernels_avx512_table()->matmul(m, o0, o1, scratch);
        return;
    }
    if (m->rows <= 0 || o0 >= o1) return;
    const int K = m->w.in, np = (K + 1) / 2;
    const size_t bb = cpu_pack_block_bytes(DTYPE_BF16, K);
    // Scratch (cpu_kernels_scratch_floats): 256 KiB or one block of packed
    // weights when they were not packed at load, then the rounded x rows:
    // all of them when they fit (each row rounded once per call), else a
    // row block at a time, for each chunk of weights.
    const size_t kp = ((size_t)K + 15) / 16 * 16, have = cpu_kernels_scratch_floats(K, 1, 1);
    const size_t wfloats = m->w.packed ? 0 : 8 * kp > 65536 ? 8 * kp : 65536;
    uint32_t *xb = (uint32_t *)(scratch + wfloats);
    const size_t fit = (have - wfloats) / (size_t)np;
    float *yr[BF_XP_MAX_ROWS];
    const uint32_t *xr[BF_MR];
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    if (m->w.packed && m->rows > BF_MR && m->rows <= BF_XP_MAX_ROWS &&
        (o1 - o0) / CPU_PACK_OUTS >= BF_XP_BLOCKS_PER_ROW * m->rows) {
        bf_pack_interleaved(m, xb, xb + (size_t)BF_XP_MAX_ROWS * np, yr);
        const int nb = m->rows <= BF_XP_WIDE3_ROWS ? 3 : m->rows <= BF_XP_WIDE_ROWS ? 2 : 1;
        const enum cpu_pf pf = cpu_pf_mode_blocks(m->rows, nb);
        const char *w = m->w.packed;
        int b = b0;
        for (; b + nb <= b1; b += nb)
            bf_xtiles(m->rows, nb, xb, w + (size_t)b * bb, bb, np, yr, b * CPU_PACK_OUTS, o0, o1, m->accumulate, pf);
        for (; b < b1; b++)
            bf_xtiles(m->rows, 1, xb, w + (size_t)b * bb, bb, np, yr, b * CPU_PACK_OUTS, o0, o1, m->accumulate, pf);
        return;
    }
    const int bh = cpu_block_height(m->rows, BF_MR);
    const int chunk = cpu_pack_chunk_blocks(BF_CHUNK_BYTES, bb, BF_NB, m->w.packed);
    // Rows cpu_matmul rounded are read where they are; others are rounded
    // once per call when they fit.
    const bool once = m->xq || (size_t)m->rows <= fit;
    if (once && !m->xq)
        for (int r = 0; r < m->rows; r++) (void)bf_row(m, r, xb + (size_t)r * np);
    const int n_rb = (m->rows + bh - 1) / bh;
    for (int cb = b0; cb < b1; cb += chunk) {
        const int ce = b1 - cb < chunk ? b1 : cb + chunk;
        const char *wc = cpu_packed_blocks(&m->w, cb, ce, scratch);
        // The row blocks after the first share the next chunk's prefetch
        // (measured: experts of 64 rows at 200 GFLOP/s a core without it,
        // against the tiles' 420 from L2).
        struct cpu_ahead ahead = cpu_ahead_plan(m->w.packed, bb, ce, b1, chunk,
                                                (size_t)(n_rb - 1) * (size_t)cpu_chunk_tiles(ce - cb, BF_NB) *
                                                    (size_t)np);
        for (int rb = 0; rb < m->rows; rb += bh) {
            const int mr = m->rows - rb < bh ? m->rows - rb : bh;
            if (!once) {
                bf_pack_rows(m, rb, mr, xb, xr, yr);
            } else {
                for (int r = 0; r < mr; r++) {
                    const int yi = m->y_rows ? m->y_rows[rb + r] : rb + r;
                    yr[r] = m->y + (size_t)yi * m->ldy;
                    xr[r] = m->xq ? bf_row(m, rb + r, NULL) : xb + (size_t)(rb + r) * np;
                }
            }
            const enum cpu_pf pf = cpu_pf_mode(rb == 0 && m->w.packed, m->rows);
            struct cpu_ahead *pa = rb > 0 && ahead.at ? &ahead : NULL;
            int b = cb;
            for (; b + BF_NB <= ce; b += BF_NB)
                bf_tiles(mr, BF_NB, xr, wc + (size_t)(b - cb) * bb, bb, np, yr, b * CPU_PACK_OUTS, o0, o1,
                         m->accumulate, pf, pa);
            if (b < ce)
                bf_tiles(mr, ce - b, xr, wc + (size_t)(b - cb) * bb, bb, np, yr, b * CPU_PACK_OUTS, o0, o1,
                         m->accumulate, pf, pa);
        }
    }
}

// One row of x rounded to bf16 as bf_round_row rounds it, kept as fp32
// (the value VDPBF16PS multiplies), into d (K floats).
static void bf_round_row_f32(const float *x, int K, float *d)
{
    for (int k = 0; k < K; k += 16) {
        const int left = K - k;
        const __mmask16 mk = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, x + k));
        const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
        _mm512_mask_storeu_ps(d + k, mk, _mm512_castsi512_ps(w));
    }
}

// The same products and sums as bf_matmul, with FMAs (where VDPBF16PS runs
// at half their rate, as on the Intel cores measured): x rounded as above,
// CPU_BF16_FMA_ROWS rows at a time, then the avx512 matmul in VDPBF16PS's
// order (cpu_kernels_avx512_matmul_dp_order). Any row batch gives a row's
// outputs the same bits, as in bf_matmul.
static void bf_matmul_fma(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (!bf_takes(m)) {
        cpu_kernels_avx512_table()->matmul(m, o0, o1, scratch);
        return;
    }
    if (m->rows <= 0 || o0 >= o1) return;
    const int K = m->w.in;
    float *xs = scratch + cpu_pk_scratch_floats(K);
    for (int r0 = 0; r0 < m->rows; r0 += CPU_BF16_FMA_ROWS) {
        const int n = m->rows - r0 < CPU_BF16_FMA_ROWS ? m->rows - r0 : CPU_BF16_FMA_ROWS;
        for (int r = 0; r < n; r++) {
            const int xi = m->x_rows ? m->x_rows[r0 + r] : r0 + r;
            bf_round_row_f32(m->x + (size_t)xi * m->ldx, K, xs + (size_t)r * (size_t)K);
        }
        struct cpu_mm b = *m;
        b.x = xs;
        b.ldx = (size_t)K;
        b.x_rows = NULL;
        b.rows = n;
        if (m->y_rows) b.y_rows = m->y_rows + r0;
        else b.y = m->y + (size_t)r0 * m->ldy;
        cpu_kernels_avx512_matmul_dp_order(&b, o0, o1, scratch);
    }
}

// The matrices whose rows cpu_matmul rounds once per call for this path.
static bool bf_wants_xq(const struct cpu_mm *m) { return bf_takes(m) || bq_takes(m) || bf8_takes(m); }

// A row's pass costs half the fp32 matmul's FMAs (bf16 and int4 alike); the
// weights' read the same.
static uint64_t bf_row_cost(const struct cpu_mm *m)
{
    if (bf_takes(m) || bq_takes(m) || bf8_takes(m)) return (uint64_t)m->rows + 4;
    return (uint64_t)m->rows * 2 + 4;
}

// fma_burn's work (iters * CPU_FMA_CHAINS * 16 * 2 FLOPs) in VDPBF16PS,
// which does two of an FMA's products per lane: iters / 2 rounds.
static float bf_dp_burn(long iters, float seed)
{
    __m512 acc[CPU_FMA_CHAINS];
#pragma GCC unroll 16
    for (int j = 0; j < CPU_FMA_CHAINS; j++) acc[j] = _mm512_set1_ps(seed + (float)j);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (long i = 0; i < iters / 2; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < CPU_FMA_CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    }
    __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < CPU_FMA_CHAINS; j++) s = _mm512_add_ps(s, acc[j]);
    return _mm512_reduce_add_ps(s);
}

// The time of the same FLOPs in VDPBF16PS over FMAs, best of five each,
// alternating (about 5 ms in all). It only picks where the time goes: both
// paths give the same results.
static double bf_dp_rate(void)
{
    const struct cpu_kernels *f = cpu_kernels_avx512_table();
    volatile float sink = 0;
    double t_dp = 1e30, t_fma = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = ms_now();
        sink += bf_dp_burn(40000, (float)i);
        double t1 = ms_now();
        sink += f->fma_burn(40000, (float)i);
        double t2 = ms_now();
        if (t1 - t0 < t_dp) t_dp = t1 - t0;
        if (t2 - t1 < t_fma) t_fma = t2 - t1;
    }
    (void)sink;
    return t_dp > 0 ? t_fma / t_dp : 2.0;
}

static struct cpu_kernels bf16_table, bf16_dp_table, bf16_fma_table, bf16_tile_base;
static const struct cpu_kernels *bf16_tiles; // NULL where the tile unit is not usable

// VDPBF16PS pays where it multiplies at least 1.25 times as fast as FMAs
// (about 2x on Zen 4 and 5); where it runs at half rate (0.5x on the Intel
// Xeon measured here: 85 against 169 GFLOP/s a core), the FMA path.
#define BF_DP_MIN_RATE 1.25

static void bf16_table_init(void)
{
    bf16_fma_table = *cpu_kernels_avx512_table();
    bf16_fma_table.name = "avx512_bf16";
    bf16_fma_table.bf16_activations = true;
    bf16_fma_table.matmul = bf_matmul_fma;
    bf16_dp_table = bf16_fma_table;
    bf16_dp_table.matmul = bf_matmul;
    bf16_dp_table.row_cost = bf_row_cost;
    bf16_dp_table.fma_burn = bf_dp_burn;
    bf16_dp_table.wants_xq = bf_wants_xq;
    bf16_dp_table.round_xq = bf_round_row;
    const double rate = bf_dp_rate();
    const bool dp = rate >= BF_DP_MIN_RATE;
    bf16_table = dp ? bf16_dp_table : bf16_fma_table;
    if (cpu_kernels_amx()) {
        // The tiles keep what they do not take on the faster of the two
        // paths, and read the rows cpu_matmul rounded once per call.
        bf16_tile_base = bf16_table;
        bf16_tile_base.round_xq = bf_round_row;
        bf16_tiles = cpu_kernels_amx_bf16_table(&bf16_tile_base);
        bf16_table = *bf16_tiles;
        ms_log(MS_LOG_INFO, "avx512_bf16 kernels: the bf16, int4 and fp8 matmuls run on the AMX tile unit (x in bf16, "
                            "one tile product a k-block)");
    } else if (!dp) {
        ms_log(MS_LOG_INFO,
               "avx512_bf16 kernels: VDPBF16PS multiplies at %.2fx the FMA rate on this CPU, so the bf16 "
               "matmuls use FMAs in its order (the same results)",
               rate);
    }
}

static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

const struct cpu_kernels *cpu_kernels_avx512_bf16_table(void)
{
    pthread_once(&bf16_once, bf16_table_init);
    return &bf16_table;
}

const struct cpu_kernels *cpu_kernels_avx512_bf16_path_table(bool fma);
const struct cpu_kernels *cpu_kernels_avx512_bf16_path_table(bool fma)
{
    pthread_once(&bf16_once, bf16_table_init);
    return fma ? &bf16_fma_table : &bf16_dp_table;
}

const struct cpu_kernels *cpu_kernels_avx512_bf16_tiles_table(void);
const struct cpu_kernels *cpu_kernels_avx512_bf16_tiles_table(void)
{
    pthread_once(&bf16_once, bf16_table_init);
    return bf16_tiles;
}
