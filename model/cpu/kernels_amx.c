// kernels_amx: the AVX-512 table with its bf16 matmuls on the AMX tile unit
// (Sapphire Rapids and later). Compiled with the avx512 flags plus
// -mamx-tile -mamx-bf16 -mavx512bf16 -mavx512vbmi; reached only after
// cpu_kernels_amx() checked the CPU and got the kernel's permission to use
// tile state.
//
// Which matrices: bf16 with K a multiple of 32 — every matrix of the Qwen3
// family — and int4 and fp8 with K and their scale groups in whole 32s
// (below: each weight tile dequantized into L1 first). The rest (f16, f32,
// odd K, int8) keep the AVX-512 matmul. The choice
// depends on the matrix alone, never on the rows, so a row's outputs stay
// the same in any batch.
//
// The layout: the weights are read in the packed layout of kernels.h, which
// for bf16 is already what the tile unit wants of its second operand. In a
// block of 16 outputs, the 32 k of k-block kb are 16 pairs of 16 dwords
// (pair p, output j: w[j][2p] | w[j][2p+1] << 16), 1 KiB at kb KiB: one B
// tile, read as one contiguous run. The x rows (up to 16) are the A tile,
// row-major, and the accumulator C holds 16 x rows by 16 outputs, stored
// straight to their y rows. A weight tile is so read from memory once for
// up to 16 rows, in sequential runs the hardware prefetcher follows (weights
// as A tiles, 16 lines a row apart, left memory latency exposed: 60-75% of
// a core's read bandwidth at batch 1). Measured on one core against the
// avx512 matmul, the demo lm_head (151936 x 512): 0.85-0.92x at one row,
// 1.5-1.7x at 16; a 2048 x 512 matrix at 512 rows (prefill): 3.6x. (Those
// figures are from before the prefetches below were fixed; see AMX_PF.)
//
// Why the split activations: TDPBF16PS multiplies bf16 by bf16. The weights
// are bf16 already, so they are exact; an fp32 activation x is written as
// hi + lo, hi = bf16(x) and lo = bf16(x - hi), which leaves |x - hi - lo| <=
// 2^-18 |x|. Each product of a bf16 weight with hi or lo is exact in fp32
// and the tile unit sums them in fp32, so the result is within a few fp32
// roundings of the fp32 matmul. Not bit-identical to any FMA chain: the unit
// has its own order and internal rounding (checked against sequential,
// pairwise and single-rounding sums on random tiles: none match), so no
// other table can stand in for it on some rows. Each output gets the same
// sequence of tile products whatever the rows around it: for kb in order,
// hi then lo, into one accumulator that starts at zero.
//
// The same tiles serve the avx512_bf16 table where the tile unit is usable
// (cpu_kernels_amx_bf16_table): there x is rounded to bf16 once per row (the
// rows cpu_matmul rounded, m->xq), as that table promises, and each k-block
// takes one tile product instead of two. Every output is one accumulator over
// the k-blocks in order, from zero, whatever the rows around it; against the
// fp32 reference within the table's bound (2^-8 of sum |w x|: the rounding of
// x, and fp32 sums), not the bits of its VDPBF16PS path (the unit's own order
// of sums). Measured with bench_cpu_matmul on Sapphire Rapids (2 cores),
// against the split x: prefill shapes 25-40% faster, the lm_head over 64
// rows 17%, 16 rows 8%, one row the same.
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "model/cpu/kernels.h"

const struct cpu_kernels *cpu_kernels_avx512_table(void);
const struct cpu_kernels *cpu_kernels_amx_table(void);
const struct cpu_kernels *cpu_kernels_amx_bf16_table(const struct cpu_kernels *base);

// One k-block is 32 bf16 values: a tile row of 64 bytes, and in the packed
// layout 1 KiB of a block (16 pairs of 16 dwords).
#define KB 32
#define KB_BYTES 1024
// x rows per A tile, and output blocks per group: four accumulators.
#define AMX_MR 16
#define AMX_NB 4
// Packed weights a group of x rows meets while they sit in L2; weights not
// packed at load are packed chunk by chunk into the start of scratch.
#define AMX_CHUNK_BYTES (256u << 10)
// The split x rows of one group (hi and lo: one float per k per row); at
// least one tile of 16 rows whatever K.
#define AMX_X_FLOATS 32768
// How far ahead in each block stream a matmul of up to AMX_MR rows
// prefetches into L1, with the CPU's plan of far ones into L2 and the
// lines past a block's end taken from the next group's block
// (cpu_pf_tile). The tile unit runs out of order far less than the FMA
// stream does (a load into a tile waits for the products still reading
// it), so at a few rows the weights reach it only as fast as lines are
// already on their way. Measured with bench_cpu_matmul on Sapphire Rapids
// (2 cores, bf16 weights of the mid model), against prefetching 2 KiB
// ahead inside each block only: the one-row lm_head 8.6-8.7 ms against
// 11.4 (avx512: 9.0), experts of 2 to 8 rows read from memory 8-17%
// faster. Matmuls of more rows prefetch nothing: their first tile's
// products take long enough for the hardware's streams (the same or 3-15%
// faster than the in-block prefetches; the continuation across blocks
// made them 5-17% slower).
#define AMX_PF 2048

// The tile register file, for group4: 0-3 accumulators (C), 4-5 the split x
// rows (A hi, A lo), 6-7 weights (B). A and C have as many rows as the tile
// has x rows; B is always 16 k-pairs.
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void tiles_config(int mr)
{
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = (uint8_t)(t < 6 ? mr : 16);
    }
    _tile_loadconfig(&c);
}

// 16 bf16 values as fp32 (a bf16 is the top half of an fp32).
static inline __m512 bf16x16(__m256i v)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// GCC's tile loads (_tile_loadd) are asm statements that name no memory,
// so the compiler may move stores past them: each buffer a tile load reads
// is written, then this, then loaded (a compiler barrier; no instruction).
static inline __attribute__((always_inline)) void tiles_after_stores(void) { __asm__ volatile("" ::: "memory"); }

// x rows r0..r0+mr-1 split into hi and lo, row i at xh + i ld and xl + i ld;
// hi alone when xl is NULL (x rounded to bf16: the same rounding as the
// avx512_bf16 table's, VCVTNE2PS2BF16).
static void split_x(const struct cpu_mm *m, int r0, int mr, int K, uint16_t *xh, uint16_t *xl, size_t ld)
{
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    for (int i = 0; i < mr; i++) {
        const int r = r0 + i;
        const float *x = m->x + (size_t)(m->x_rows ? m->x_rows[r] : r) * m->ldx;
        uint16_t *h = xh + (size_t)i * ld, *l = xl ? xl + (size_t)i * ld : NULL;
        for (int k = 0; k < K; k += KB) {
            const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
            _mm512_storeu_si512(h + k, hi);
            if (!l) continue;
            // hi back in fp32.
            const __m512 h0 = bf16x16(_mm512_castsi512_si256(hi)), h1 = bf16x16(_mm512_extracti64x4_epi64(hi, 1));
            // x - hi is exact; where x is not finite, lo is 0 (not NaN).
            const __m512 d0 = _mm512_maskz_sub_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x0), inf, _CMP_LT_OQ), x0, h0);
            const __m512 d1 = _mm512_maskz_sub_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x1), inf, _CMP_LT_OQ), x1, h1);
            _mm512_storeu_si512(l + k, (__m512i)_mm512_cvtne2ps_pbh(d1, d0));
        }
    }
}

// A stored accumulator (st[i * 16 + j]: x row r0 + i, output o + j) into y.
static void store_c(const struct cpu_mm *m, const float *st, int o, int o0, int o1, int r0, int mr)
{
    const __mmask16 keep = cpu_lane_mask16(o, o0, o1);
    if (!keep) return;
    for (int i = 0; i < mr; i++) {
        const int r = r0 + i;
        float *y = m->y + (size_t)(m->y_rows ? m->y_rows[r] : r) * m->ldy + o;
        __m512 t = _mm512_loadu_ps(st + 16 * i);
        if (m->accumulate) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(keep, y));
        _mm512_mask_storeu_ps(y, keep, t);
    }
}

// The prefetches of k-block kb of block n of the group at wp (nb blocks).
static inline __attribute__((always_inline)) void prefetch_kb(enum cpu_pf pf, const char *wp, size_t bb, int nb,
                                                              int n, int kb)
{
    const size_t off = (size_t)kb * KB_BYTES;
    for (int l = 0; l < KB_BYTES; l += 64) cpu_pf_tile(pf, wp, bb, nb, n, off + (size_t)l, AMX_PF);
}

// Four blocks of 16 outputs (wp, wp + bb, ...) against the x tile: st gets
// the four accumulators, block n at st + 256 n. SPLIT: x as hi and lo (two
// products a k-block), else x in bf16 (xh alone, one product).
static inline __attribute__((always_inline)) void group4_t(const bool SPLIT, const char *wp, size_t bb, int nkb,
                                                           const uint16_t *xh, const uint16_t *xl, size_t xs,
                                                           float *st, enum cpu_pf pf)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int kb = 0; kb < nkb; kb++) {
        const char *b = wp + (size_t)kb * KB_BYTES;
        if (pf != CPU_PF_NONE)
            for (int n = 0; n < AMX_NB; n++) prefetch_kb(pf, wp, bb, AMX_NB, n, kb);
        _tile_loadd(4, xh + kb * KB, xs);
        if (SPLIT) _tile_loadd(5, xl + kb * KB, xs);
        _tile_loadd(6, b, 64);
        _tile_loadd(7, b + bb, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (SPLIT) {
            _tile_dpbf16ps(0, 5, 6);
            _tile_dpbf16ps(1, 5, 7);
        }
        _tile_loadd(6, b + 2 * bb, 64);
        _tile_loadd(7, b + 3 * bb, 64);
        _tile_dpbf16ps(2, 4, 6);
        _tile_dpbf16ps(3, 4, 7);
        if (SPLIT) {
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, st, 64);
    _tile_stored(1, st + 256, 64);
    _tile_stored(2, st + 512, 64);
    _tile_stored(3, st + 768, 64);
}

static void group4(const char *wp, size_t bb, int nkb, const uint16_t *xh, const uint16_t *xl, size_t xs,
                   float *st, enum cpu_pf pf)
{
    if (xl) group4_t(true, wp, bb, nkb, xh, xl, xs, st, pf);
    else group4_t(false, wp, bb, nkb, xh, NULL, xs, st, pf);
}

// One block (C 0, A 2-3, B 6): the same products in the same order as
// group4's (xl NULL: x in bf16, one product a k-block).
static void group1(const char *wp, int nkb, const uint16_t *xh, const uint16_t *xl, size_t xs, float *st)
{
    _tile_zero(0);
    for (int kb = 0; kb < nkb; kb++) {
        _tile_loadd(2, xh + kb * KB, xs);
        _tile_loadd(6, wp + (size_t)kb * KB_BYTES, 64);
        _tile_dpbf16ps(0, 2, 6);
        if (!xl) continue;
        _tile_loadd(3, xl + kb * KB, xs);
        _tile_dpbf16ps(0, 3, 6);
    }
    _tile_stored(0, st, 64);
}

// x rows r0..r0+mr-1 as cpu_matmul rounded them (m->xq, bf16 pairs: the
// order of a tile row), row i at xh + i K.
static void copy_xq(const struct cpu_mm *m, int r0, int mr, int K, uint16_t *xh)
{
    for (int i = 0; i < mr; i++) {
        const int r = r0 + i;
        memcpy(xh + (size_t)i * K, m->xq + (size_t)(m->x_rows ? m->x_rows[r] : r) * m->ldxq, (size_t)K * 2);
    }
}

// x rows r0..r0+mr-1 as the tiles read them: split into hi and lo (xl not
// NULL; row i at xh + i ld and xl + i ld), or in bf16, as the caller
// rounded them (m->xq; ld is then K) or rounded here.
static void tiles_x(const struct cpu_mm *m, int r0, int mr, int K, uint16_t *xh, uint16_t *xl, size_t ld)
{
    if (!xl && m->xq) copy_xq(m, r0, mr, K, xh);
    else split_x(m, r0, mr, K, xh, xl, ld);
}

// A matmul of up to AMX_MR rows of packed weights is one tile of rows,
// which reads the weights from memory and prefetches them (AMX_PF, by the
// CPU's plan); more rows prefetch nothing.
static enum cpu_pf tiles_pf(const struct cpu_mm *m)
{
    return m->w.packed && m->rows <= AMX_MR ? cpu_pf_mode(true, m->rows) : CPU_PF_NONE;
}

// Groups of up to AMX_X_FLOATS / K x rows (split once, or rounded), each
// meeting the weights chunk by chunk, one tile of 16 rows at a time, four
// blocks of outputs at a time. The first tile of a group reads a chunk from
// memory (prefetching ahead), the others from L2. split: x as hi and lo
// (the amx table), else in bf16 (the avx512_bf16 table's tile path).
static void tiles_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch, bool split)
{
    if (o1 <= o0 || m->rows <= 0) return;
    const int K = m->w.in, nkb = K / KB;
    const size_t bb = cpu_pack_block_bytes(DTYPE_BF16, K), xs = (size_t)K * 2;
    int group = AMX_X_FLOATS / K / AMX_MR * AMX_MR;
    if (group < AMX_MR) group = AMX_MR;
    // Weights not packed at load are packed here a chunk at a time: 256 KiB,
    // or one block when a block is bigger (K above 8192).
    const size_t wfloats = (bb > AMX_CHUNK_BYTES ? bb : AMX_CHUNK_BYTES) / 4;
    char *wbuf = (char *)scratch;                               // (wfloats) floats
    uint16_t *xh = (uint16_t *)(scratch + wfloats);             // (group, K) bf16
    uint16_t *xl = split ? xh + (size_t)group * K : NULL;       // (group, K) bf16
    float *st = scratch + wfloats + (size_t)group * K;          // four C tiles
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    int chunk = (int)(AMX_CHUNK_BYTES / bb) / AMX_NB * AMX_NB;
    if (chunk < AMX_NB) chunk = AMX_CHUNK_BYTES / bb >= 1 ? (int)(AMX_CHUNK_BYTES / bb) : 1;
    // Packed weights and one tile of rows: no chunk needs to stay in L2.
    if (m->w.packed && m->rows <= AMX_MR) chunk = b1 - b0;
    const enum cpu_pf pf = tiles_pf(m);
    int config_rows = 0;
    for (int g0 = 0; g0 < m->rows; g0 += group) {
        const int gn = m->rows - g0 < group ? m->rows - g0 : group;
        tiles_x(m, g0, gn, K, xh, xl, (size_t)K);
        tiles_after_stores();
        for (int cb = b0; cb < b1; cb += chunk) {
            const int ce = b1 - cb < chunk ? b1 : cb + chunk;
            const char *wc = cpu_packed_blocks(&m->w, cb, ce, wbuf);
            for (int t0 = 0; t0 < gn; t0 += AMX_MR) {
                const int mr = gn - t0 < AMX_MR ? gn - t0 : AMX_MR;
                if (mr != config_rows) {
                    tiles_config(mr);
                    config_rows = mr;
                }
                const uint16_t *th = xh + (size_t)t0 * K, *tl = xl ? xl + (size_t)t0 * K : NULL;
                int b = cb;
                for (; b + AMX_NB <= ce; b += AMX_NB) {
                    group4(wc + (size_t)(b - cb) * bb, bb, nkb, th, tl, xs, st, pf);
                    for (int n = 0; n < AMX_NB; n++)
                        store_c(m, st + 256 * n, (b + n) * CPU_PACK_OUTS, o0, o1, g0 + t0, mr);
                }
                for (; b < ce; b++) {
                    group1(wc + (size_t)(b - cb) * bb, nkb, th, tl, xs, st);
                    store_c(m, st, b * CPU_PACK_OUTS, o0, o1, g0 + t0, mr);
                }
            }
        }
    }
    if (config_rows) _tile_release();
}

// ---- int4 and fp8 weights on the tile unit ------------------------------------------
//
// Why: the FMA path (kernels_simd.inc) turns every int4 weight into fp32
// and does one FMA per weight and row, with 16 rows a tile at most: the
// full-size Qwen3-30B-A3B in int4 prefilled 30 tokens/s on two Sapphire
// Rapids cores. Here a weight tile (32 k of a block of 16 outputs) becomes
// bf16 once, in L1, and the tile unit multiplies it by up to 16 x rows a
// product. What it becomes is 16 + q (16..31: exact in bf16, below); the
// scale and zero point are applied per group, as the FMA path applies them:
//   y = fma(s_g, C_g - (z_g + 16) * xsum_g, y) over the groups g in order,
// from 0, where C_g is the tile unit's sum of x_k (16 + q_k) over group g
// (its own order, as for bf16 weights) and xsum_g the sum of the group's x
// — the x the tiles read: hi + lo (amx, within a few fp32 roundings of the
// fp32 matmul) or x rounded to bf16 (avx512_bf16, within its 2^-8 bound).
//
// The pairs: a packed dword holds 8 k of one output (k0 + i in bits 4i..).
// Shifted so that nibble i lands on bits 3..6 (left by 3, right by 1, 5,
// 9), masked to those bits of each half and ORed with bf16(16) (0x4180:
// exponent 4, its 7-bit mantissa in steps of 1/8, so q in the top four
// bits is 16 + q), it holds the bf16 of k0 + i and k0 + i + 4 in its
// halves: the pair a tile row takes, a shift and one VPTERNLOGD. (It was
// bf16(q) by VPERMW over a table, a third instruction on the one port that
// runs it: one row 20% slower from L2, `bench_cpu_matmul`'s "from L2"
// shape, and the full-size model's 16-stream MoE phase 6% slower.) So pair
// p = 4d + i of a k-block (dword d) is (k0 + 8d + i, k0 + 8d + i + 4), and
// the x rows are permuted to match once per call (q4_prep_x): two
// instructions and a store per 32 weights, where the FMA path spends four
// on conversions and then one FMA per weight and row. The bias costs
// precision only in the sums (the products stay exact): their terms grow
// from q |x| <= 15 |x| to (16 + q) |x| <= 31 |x|, and the correction takes
// (z + 16) xsum rather than z xsum, so about three times the rounding of
// before for typical q (a simulated group of 128: 2.8 times the mean
// error), far inside the tests' tolerance and the int4 rounding of the
// weights themselves.
//
// fp8 weights the same way with their own tiles (fp8_dequant: the bf16 of
// each e4m3 value, exact) and y = fma(s_g, C_g, y), their FMA path's
// formula; int8 stays on the FMA path (there, why).
//
// The split x: a row's hi and lo go in as two rows of one A tile (8 x
// rows a tile), so that each weight tile takes one product whatever the
// rows (the tile unit takes as long for one row as for 16: 12 TSC cycles
// a product here, measured); the row's C is then its two rows' sum. A
// row's results do not depend on the rows beside it either way.
//
// The order: x rows in groups of up to QT_ROWS (what the scratch holds);
// per group, four blocks of outputs at a time, per scale group their
// weight tiles turned into bf16 (16 KiB at 128 inputs) and met by every
// tile of x rows, whose C tiles are then scaled into fp32 sums kept in
// scratch until the blocks end. Each output gets the same products and
// the same fma chain whatever the rows around it.
#define QT_ROWS 64

// The bias above: added to the zero points, and as bf16 in both halves of
// a dword.
#define Q4_BIAS 16
#define Q4_BF16_BIAS 0x41804180u
#define Q4_MANT_MASK 0x00780078u // mantissa bits 3..6 of both halves
#define Q4_TERNLOG_AND_OR 0xEA   // (a & b) | c

// A dword vector shifted so that its two nibbles sit on bits 3..6 of each
// half, as the bf16 pairs (16 + q, 16 + q').
static inline __m512i q4_pairs(__m512i shifted)
{
    return _mm512_ternarylogic_epi32(shifted, _mm512_set1_epi32((int)Q4_MANT_MASK),
                                     _mm512_set1_epi32((int)Q4_BF16_BIAS), Q4_TERNLOG_AND_OR);
}

// Weight tiles of nb blocks (block n at wp + n bb, its values H bytes in),
// k-blocks [kb0, kb0 + nkb), into bq: block n's tile kb at bq + (n nkb + kb
// - kb0) 512 words, pair p as tile row p. pf: the prefetches of a matmul
// that streams these blocks from memory as a group of AMX_NB.
static inline __attribute__((always_inline)) void q4_dequant(const char *wp, size_t bb, size_t H, int nb, int kb0,
                                                             int nkb, uint16_t *bq, enum cpu_pf pf)
{
    for (int n = 0; n < nb; n++)
        for (int kb = 0; kb < nkb; kb++) {
            const size_t off = H + (size_t)(kb0 + kb) * 256;
            uint16_t *t = bq + ((size_t)n * nkb + kb) * 512;
            for (int d = 0; d < 4; d++) {
                cpu_pf_tile(pf, wp, bb, AMX_NB, n, off + 64 * (size_t)d, AMX_PF);
                const __m512i v = _mm512_loadu_si512(wp + (size_t)n * bb + off + 64 * (size_t)d);
                // Nibble i (bits 4i..) and i + 4 (4i + 16..) to bits 3..6 of each half.
                _mm512_storeu_si512(t + (4 * d + 0) * 32, q4_pairs(_mm512_slli_epi32(v, 3)));
                _mm512_storeu_si512(t + (4 * d + 1) * 32, q4_pairs(_mm512_srli_epi32(v, 1)));
                _mm512_storeu_si512(t + (4 * d + 2) * 32, q4_pairs(_mm512_srli_epi32(v, 5)));
                _mm512_storeu_si512(t + (4 * d + 3) * 32, q4_pairs(_mm512_srli_epi32(v, 9)));
            }
        }
}

// The byte tables of fp8 weight tiles (fp8_dequant): 128 entries a table,
// two registers, as VPERMI2B reads them. Set once, before either tile
// table is handed out (fp8_tables_init).
static struct {
    uint8_t lo[128], hi[128]; // the bf16 of e4m3 magnitude c (its NaN code: 480, as quant.h reads it)
    uint8_t pair[2][64];      // tile rows 2d and 2d + 1 from the low and high bytes of k 4d..4d+3
} fp8_tab __attribute__((aligned(64)));

static void fp8_tables_init(void)
{
    for (int c = 0; c < 128; c++) {
        const uint16_t f = ms_f32_to_bf16(quant_fp8_to_f32((uint8_t)c)); // exact: 4 significant bits
        fp8_tab.lo[c] = (uint8_t)f;
        fp8_tab.hi[c] = (uint8_t)(f >> 8);
    }
    // Dword j of tile row 2d + r: the bf16 of k = 4d + 2r and 4d + 2r + 1 of
    // output j, low bytes from the first register (index < 64), high bytes
    // from the second.
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 16; j++) {
            fp8_tab.pair[r][4 * j + 0] = (uint8_t)(32 * r + j);
            fp8_tab.pair[r][4 * j + 1] = (uint8_t)(64 + 32 * r + j);
            fp8_tab.pair[r][4 * j + 2] = (uint8_t)(32 * r + 16 + j);
            fp8_tab.pair[r][4 * j + 3] = (uint8_t)(64 + 32 * r + 16 + j);
        }
}

#define FP8_SIGN_OR 0xF8 // VPTERNLOGD: a | (b & c)

// q4_dequant for fp8 weights. Their packed values are 16 bytes a k (byte
// j: output j), so a 64-byte line is four k of a block and two rows of its
// tile, pairs (k, k + 1) in order (the x rows need no permutation). A
// byte's bf16 comes by table: its low and high bytes looked up by
// VPERMI2B in 128 entries (the byte's low seven bits, the magnitude), the
// sign bit ORed into the high byte, then one VPERMT2B a tile row lays the
// two out as its pairs: five instructions and two stores a line, where a
// conversion through fp32 (the FMA path's, then truncation) took twelve.
//
// Why not int8 as well: its bf16 needs all eight bits (two's complement:
// no sign to OR in), so two table pairs and a pick by the sign, nine
// instructions a line. On the tiles that way (measured, bench_cpu_matmul
// and bench-offline on the mid model, 2 threads, alternating with the FMA
// path): a 512-token prefill's experts 1.75 times as fast, but one row from
// L2 at 32-35 GB/s against the FMA path's 71, the MoE phase of a decode
// step 27-35% slower at 1 stream and 30-40% at 16. It stays on the FMA
// path. fp8 the same way: one row 41-42 GB/s from L2 against 46-47 (28-32
// from memory against 35-37), the experts of a 512-token prefill 2.2 times
// as fast; in place, below.
static inline __attribute__((always_inline)) void fp8_dequant(const char *wp, size_t bb, size_t H, int nb, int kb0,
                                                              int nkb, uint16_t *bq, enum cpu_pf pf)
{
    const __m512i lo0 = _mm512_load_si512(fp8_tab.lo), lo1 = _mm512_load_si512(fp8_tab.lo + 64);
    const __m512i hi0 = _mm512_load_si512(fp8_tab.hi), hi1 = _mm512_load_si512(fp8_tab.hi + 64);
    const __m512i pair0 = _mm512_load_si512(fp8_tab.pair[0]), pair1 = _mm512_load_si512(fp8_tab.pair[1]);
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    for (int n = 0; n < nb; n++)
        for (int kb = 0; kb < nkb; kb++) {
            const size_t off = H + (size_t)(kb0 + kb) * KB * CPU_PACK_OUTS;
            uint16_t *t = bq + ((size_t)n * nkb + kb) * 512;
            for (int d = 0; d < 8; d++) {
                cpu_pf_tile(pf, wp, bb, AMX_NB, n, off + 64 * (size_t)d, AMX_PF);
                const __m512i v = _mm512_loadu_si512(wp + (size_t)n * bb + off + 64 * (size_t)d);
                const __m512i lo = _mm512_permutex2var_epi8(lo0, v, lo1);
                const __m512i hi =
                    _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, v, hi1), v, sign, FP8_SIGN_OR);
                _mm512_storeu_si512(t + 64 * d, _mm512_permutex2var_epi8(lo, pair0, hi));
                _mm512_storeu_si512(t + 64 * d + 32, _mm512_permutex2var_epi8(lo, pair1, hi));
            }
        }
}

// The weight tiles of format F (q4_dequant, fp8_dequant).
static inline __attribute__((always_inline)) void qt_dequant(const enum quant_format F, const char *wp, size_t bb,
                                                             size_t H, int nb, int kb0, int nkb, uint16_t *bq,
                                                             enum cpu_pf pf)
{
    if (F == QUANT_INT4) q4_dequant(wp, bb, H, nb, kb0, nkb, bq, pf);
    else fp8_dequant(wp, bb, H, nb, kb0, nkb, bq, pf);
}

// The C tiles of NB (4 or 1) blocks over nkb k-blocks of the A rows at xa
// (row stride xs bytes), in order; st gets block n's at st + 256 n. The
// weight tiles: qt_dequant's of those k-blocks at bq, or (FUSED: a
// matmul of one tile of rows, which meets each weight tile once) made
// here a k-block at a time from the blocks at wp, into bq: 4 KiB in L1
// where a group's took 16 (the group's made first ran 10-15% behind the
// avx512 matmul on experts at one row; two buffers of them, 25-40%).
static inline __attribute__((always_inline)) void qt_products(const enum quant_format F, const int NB,
                                                              const bool FUSED, uint16_t *bq, int nkb,
                                                              const uint16_t *xa, size_t xs, float *st,
                                                              const char *wp, size_t bb, size_t H, int kb0,
                                                              enum cpu_pf pf)
{
    const size_t ns = FUSED ? 512 : (size_t)nkb * 512; // from a block's weight tile to the next's
    _tile_zero(0);
    if (NB == AMX_NB) {
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int kb = 0; kb < nkb; kb++) {
        if (FUSED) {
            qt_dequant(F, wp, bb, H, NB, kb0 + kb, 1, bq, pf);
            tiles_after_stores();
        }
        const uint16_t *b = FUSED ? bq : bq + (size_t)kb * 512;
        _tile_loadd(4, xa + kb * KB, xs);
        _tile_loadd(6, b, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (NB != AMX_NB) continue;
        _tile_loadd(7, b + ns, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(6, b + 2 * ns, 64);
        _tile_dpbf16ps(2, 4, 6);
        _tile_loadd(7, b + 3 * ns, 64);
        _tile_dpbf16ps(3, 4, 7);
    }
    _tile_stored(0, st, 64);
    if (NB == AMX_NB) {
        _tile_stored(1, st + 256, 64);
        _tile_stored(2, st + 512, 64);
        _tile_stored(3, st + 768, 64);
    }
}

// A block's group g into its mr x rows' sums (ys[i * 16 + j]: row i,
// output j), the block's header at h, C row i of c, or rows 2i + 2i + 1
// (hi, lo) where split: ys = fma(s, C - (z + 16) * xsum, ys) for int4,
// ys = fma(s, C, ys) for fp8 (as its FMA path).
static void qt_apply(enum quant_format f, const char *h, int g, const float *c, int mr, bool split,
                     const float *xsum, int ng, float *ys)
{
    const bool q4 = f == QUANT_INT4;
    const __m512 s = q4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + (size_t)g * 48)))
                        : _mm512_loadu_ps((const float *)(h + (size_t)g * 64));
    const __m512 z = q4 ? _mm512_cvtepi32_ps(_mm512_add_epi32(
                              _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(h + (size_t)g * 48 + 32))),
                              _mm512_set1_epi32(Q4_BIAS)))
                        : _mm512_setzero_ps();
    for (int i = 0; i < mr; i++) {
        __m512 t = split ? _mm512_add_ps(_mm512_loadu_ps(c + 32 * i), _mm512_loadu_ps(c + 32 * i + 16))
                         : _mm512_loadu_ps(c + 16 * i);
        if (q4) t = _mm512_fnmadd_ps(z, _mm512_set1_ps(xsum[(size_t)i * ng + g]), t);
        _mm512_storeu_ps(ys + 16 * i, _mm512_fmadd_ps(s, t, _mm512_loadu_ps(ys + 16 * i)));
    }
}

// The rows' group sums of the x the tiles read (hi + lo, or hi alone; in
// 16 lanes, then across them), then each row permuted into the pairs of
// the weight tiles (within every 8 k: 0, 4, 1, 5, 2, 6, 3, 7). Row i's hi
// at xa + i ld, its lo (split) K further on.
static void q4_prep_x(uint16_t *xa, size_t ld, bool split, int rows, int K, int G, int ng, float *xsum)
{
    static const uint16_t perm[32] __attribute__((aligned(64))) = {
        0,  4,  1,  5,  2,  6,  3,  7,  8,  12, 9,  13, 10, 14, 11, 15,
        16, 20, 17, 21, 18, 22, 19, 23, 24, 28, 25, 29, 26, 30, 27, 31};
    const __m512i idx = _mm512_load_si512(perm);
    for (int i = 0; i < rows; i++) {
        uint16_t *h = xa + (size_t)i * ld, *l = split ? h + K : NULL;
        for (int g = 0; g < ng; g++) {
            const int k1 = (g + 1) * G < K ? (g + 1) * G : K;
            __m512 sum = _mm512_setzero_ps();
            for (int k = g * G; k < k1; k += 16) {
                sum = _mm512_add_ps(sum, bf16x16(_mm256_loadu_si256((const __m256i *)(h + k))));
                if (l) sum = _mm512_add_ps(sum, bf16x16(_mm256_loadu_si256((const __m256i *)(l + k))));
            }
            xsum[(size_t)i * ng + g] = _mm512_reduce_add_ps(sum);
        }
        for (int k = 0; k < K; k += KB) {
            _mm512_storeu_si512(h + k, _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(h + k)));
            if (l) _mm512_storeu_si512(l + k, _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(l + k)));
        }
    }
}

// The weight tiles of nb blocks over k-blocks [kb0, kb0 + nkb) into bq
// (qt_dequant), for a group of x rows of more than one tile.
static void qt_dequant_group(enum quant_format f, const char *wp, size_t bb, size_t H, int nb, int kb0, int nkb,
                             uint16_t *bq, enum cpu_pf pf)
{
    if (f == QUANT_INT4) qt_dequant(QUANT_INT4, wp, bb, H, nb, kb0, nkb, bq, pf);
    else qt_dequant(QUANT_FP8, wp, bb, H, nb, kb0, nkb, bq, pf);
}

// qt_products of format f, nb (AMX_NB or 1) blocks, fused or not: one
// instance of each, the format and shape fixed inside.
static void qt_products_run(enum quant_format f, int nb, bool fused, uint16_t *bq, int nkb, const uint16_t *xa,
                            size_t xs, float *st, const char *wp, size_t bb, size_t H, int kb0, enum cpu_pf pf)
{
#define QT_SHAPES(F)                                                                                  \
    do {                                                                                              \
        if (fused && nb == AMX_NB) qt_products(F, AMX_NB, true, bq, nkb, xa, xs, st, wp, bb, H, kb0, pf); \
        else if (fused) qt_products(F, 1, true, bq, nkb, xa, xs, st, wp, bb, H, kb0, pf);              \
        else if (nb == AMX_NB) qt_products(F, AMX_NB, false, bq, nkb, xa, xs, st, wp, bb, H, kb0, pf);  \
        else qt_products(F, 1, false, bq, nkb, xa, xs, st, wp, bb, H, kb0, pf);                         \
    } while (0)
    if (f == QUANT_INT4) QT_SHAPES(QUANT_INT4);
    else QT_SHAPES(QUANT_FP8);
#undef QT_SHAPES
}

// Outputs [o0, o1) of a quantized matrix (cpu_kernels_amx_takes_quant) on
// the tile unit. split: x as hi and lo (amx), else rounded to bf16
// (avx512_bf16's tile path, from m->xq where the caller rounded it).
static void qt_tiles_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch, bool split)
{
    if (o1 <= o0 || m->rows <= 0) return;
    const int K = m->w.in, G = m->w.group > 0 ? m->w.group : K, ng = quant_groups(K, G), nkg = G / KB;
    const enum quant_format f = m->w.quant;
    const size_t bb = quant_block_bytes(f, K, m->w.group), H = quant_block_header_bytes(f, K, m->w.group);
    // x rows a tile: 16, or 8 split (their hi and lo, 16 A rows).
    const int tr = split ? AMX_MR / 2 : AMX_MR, ar = split ? 2 : 1;
    const size_t ld = (size_t)ar * K, xs = (size_t)K * 2; // an A tile row: hi, lo, hi of the next row, ...
    // Scratch: the weight tiles of four blocks over one scale group, four C
    // tiles, then per x row its hi (and lo), its group sums and the sums of
    // four blocks' outputs (cpu_kernels_scratch_floats leaves room for
    // QT_ROWS of them; at least a tile whatever K).
    const size_t fixed = (size_t)AMX_NB * nkg * 256 + 1024 + 16, per_row = (size_t)K + (size_t)ng + AMX_NB * 16;
    const size_t have = cpu_kernels_scratch_floats(K, 1, 1);
    int rg = have > fixed + AMX_MR * per_row ? (int)((have - fixed) / per_row) / AMX_MR * AMX_MR : AMX_MR;
    if (rg > QT_ROWS) rg = QT_ROWS;
    uint16_t *bq = (uint16_t *)scratch;                     // (AMX_NB, nkg, 512) bf16
    float *st = scratch + (size_t)AMX_NB * nkg * 256;
    uint16_t *xa = (uint16_t *)(st + 1024);                 // (rg, ar K) bf16
    float *xsum = (float *)(xa + 2 * (size_t)rg * K);       // (rg, ng)
    float *ys = xsum + ((size_t)rg * ng + 15) / 16 * 16;    // (AMX_NB, rg, 16)
    const int b0 = o0 / CPU_PACK_OUTS, b1 = (o1 + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
    const enum cpu_pf pf = tiles_pf(m);
    int config_rows = 0;
    for (int g0 = 0; g0 < m->rows; g0 += rg) {
        const int gn = m->rows - g0 < rg ? m->rows - g0 : rg;
        const bool fused = gn <= tr; // one tile of rows: each weight tile made as it is met
        tiles_x(m, g0, gn, K, xa, split ? xa + K : NULL, ld);
        if (f == QUANT_INT4) q4_prep_x(xa, ld, split, gn, K, G, ng, xsum);
        tiles_after_stores();
        for (int b = b0; b < b1;) {
            const int nb = b1 - b >= AMX_NB ? AMX_NB : 1;
            const char *wp = (const char *)m->w.packed + (size_t)b * bb;
            memset(ys, 0, (size_t)nb * gn * 16 * sizeof *ys);
            const enum cpu_pf bpf = nb == AMX_NB ? pf : CPU_PF_NONE;
            for (int g = 0; g < ng; g++) {
                const int nkb = ((g + 1) * G < K ? G : K - g * G) / KB;
                if (!fused) {
                    qt_dequant_group(f, wp, bb, H, nb, g * nkg, nkb, bq, bpf);
                    tiles_after_stores();
                }
                for (int t0 = 0; t0 < gn; t0 += tr) {
                    const int mr = gn - t0 < tr ? gn - t0 : tr;
                    if (mr * ar != config_rows) {
                        tiles_config(mr * ar);
                        config_rows = mr * ar;
                    }
                    const uint16_t *xt = xa + (size_t)t0 * ld + (size_t)g * G;
                    qt_products_run(f, nb, fused, bq, nkb, xt, xs, st, wp, bb, H, fused ? g * nkg : 0, bpf);
                    for (int n = 0; n < nb; n++)
                        qt_apply(f, wp + (size_t)n * bb, g, st + 256 * n, mr, split, xsum + (size_t)t0 * ng, ng,
                                 ys + ((size_t)n * gn + t0) * 16);
                }
            }
            for (int n = 0; n < nb; n++)
                for (int t0 = 0; t0 < gn; t0 += tr)
                    store_c(m, ys + ((size_t)n * gn + t0) * 16, (b + n) * CPU_PACK_OUTS, o0, o1, g0 + t0,
                            gn - t0 < tr ? gn - t0 : tr);
            b += nb;
        }
    }
    if (config_rows) _tile_release();
}

// The matrices the tile unit takes (bf16 and quantized), and their matmul there.
static bool tiles_take(const struct cpu_wmat *w)
{
    return cpu_kernels_amx_takes(w) || cpu_kernels_amx_takes_quant(w);
}

static void tiles_run(const struct cpu_mm *m, int o0, int o1, float *scratch, bool split)
{
    if (cpu_kernels_amx_takes(&m->w)) tiles_matmul(m, o0, o1, scratch, split);
    else qt_tiles_matmul(m, o0, o1, scratch, split);
}

static void amx_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (tiles_take(&m->w)) tiles_run(m, o0, o1, scratch, true);
    else cpu_kernels_avx512_table()->matmul(m, o0, o1, scratch);
}

// The avx512_bf16 table whose tile path this is (set once, before any call).
static const struct cpu_kernels *bf16_base;

static void amx_bf16_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (tiles_take(&m->w)) tiles_run(m, o0, o1, scratch, false);
    else bf16_base->matmul(m, o0, o1, scratch);
}

// The rows cpu_matmul rounds once per call: those of the matrices the
// tiles take, and those the base path reads so (its VDPBF16PS one).
static bool amx_bf16_wants_xq(const struct cpu_mm *m)
{
    return tiles_take(&m->w) || (bf16_base->wants_xq && bf16_base->wants_xq(m));
}

// A tile of 16 rows costs about what reading its weights does (on the
// demo model at 16 sequences, with rows + 2 instead, the threads' shares of
// the experts came out unequal: MoE phase 8% longer).
static uint64_t amx_row_cost(const struct cpu_mm *m)
{
    if (!tiles_take(&m->w)) return (uint64_t)m->rows + 2;
    // (The bf16 path's tiles take half the products: it keeps the split
    // one's cost, which only balances the threads' shares.)
    return 2 + 2 * (((uint64_t)m->rows + AMX_MR - 1) / AMX_MR);
}

static struct cpu_kernels amx_table;

// The byte tables of fp8 tiles, set by whichever tile table is made first.
static void fp8_tables_once(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fp8_tables_init);
}

static void amx_table_init(void)
{
    fp8_tables_once();
    amx_table = *cpu_kernels_avx512_table();
    amx_table.name = "amx";
    amx_table.matmul = amx_matmul;
    amx_table.row_cost = amx_row_cost;
}

const struct cpu_kernels *cpu_kernels_amx_table(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_table_init);
    return &amx_table;
}

static struct cpu_kernels amx_bf16_table;

// base: the avx512_bf16 table's own path (VDPBF16PS or FMAs), which keeps
// the matrices the tiles do not take, with its round_xq set (the rounding
// the tiles read). Called once, from that table's initialisation, and only
// where cpu_kernels_amx() found the unit usable.
const struct cpu_kernels *cpu_kernels_amx_bf16_table(const struct cpu_kernels *base)
{
    fp8_tables_once();
    bf16_base = base;
    amx_bf16_table = *base;
    amx_bf16_table.matmul = amx_bf16_matmul;
    amx_bf16_table.row_cost = amx_row_cost;
    amx_bf16_table.wants_xq = amx_bf16_wants_xq;
    return &amx_bf16_table;
}
