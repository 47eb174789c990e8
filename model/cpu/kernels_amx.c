// kernels_amx: the AVX-512 table with its bf16 matmuls on the AMX tile unit
// (Sapphire Rapids and later). Compiled with the avx512 flags plus
// -mamx-tile -mamx-bf16 -mavx512bf16; reached only after cpu_kernels_amx()
// checked the CPU and got the kernel's permission to use tile state.
//
// Which matrices: bf16 with K a multiple of 32 — every matrix of the Qwen3
// family. The rest (f16, f32, odd K, and quantized matrices, whose weights
// the tile unit cannot take without dequantizing a whole tile first) keep
// the AVX-512 matmul. The choice
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

// x rows r0..r0+mr-1 split into hi and lo, row i at xh + i K and xl + i K;
// hi alone when xl is NULL (x rounded to bf16: the same rounding as the
// avx512_bf16 table's, VCVTNE2PS2BF16).
static void split_x(const struct cpu_mm *m, int r0, int mr, int K, uint16_t *xh, uint16_t *xl)
{
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    for (int i = 0; i < mr; i++) {
        const int r = r0 + i;
        const float *x = m->x + (size_t)(m->x_rows ? m->x_rows[r] : r) * m->ldx;
        uint16_t *h = xh + (size_t)i * K, *l = xl ? xl + (size_t)i * K : NULL;
        for (int k = 0; k < K; k += KB) {
            const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
            _mm512_storeu_si512(h + k, hi);
            if (!l) continue;
            // hi back in fp32: bf16 is the top half of an fp32.
            const __m512 h0 =
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
            const __m512 h1 =
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
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
    // A matmul of up to AMX_MR rows is one tile, which reads the weights
    // from memory and prefetches them (AMX_PF); more rows prefetch nothing.
    const enum cpu_pf pf = m->w.packed && m->rows <= AMX_MR ? cpu_pf_mode(true, m->rows) : CPU_PF_NONE;
    int config_rows = 0;
    for (int g0 = 0; g0 < m->rows; g0 += group) {
        const int gn = m->rows - g0 < group ? m->rows - g0 : group;
        if (!split && m->xq) copy_xq(m, g0, gn, K, xh);
        else split_x(m, g0, gn, K, xh, xl);
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

static void amx_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (cpu_kernels_amx_takes(&m->w)) tiles_matmul(m, o0, o1, scratch, true);
    else cpu_kernels_avx512_table()->matmul(m, o0, o1, scratch);
}

// The avx512_bf16 table whose tile path this is (set once, before any call).
static const struct cpu_kernels *bf16_base;

static void amx_bf16_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    if (cpu_kernels_amx_takes(&m->w)) tiles_matmul(m, o0, o1, scratch, false);
    else bf16_base->matmul(m, o0, o1, scratch);
}

// The rows cpu_matmul rounds once per call: those of the matrices the
// tiles take, and those the base path reads so (its VDPBF16PS one).
static bool amx_bf16_wants_xq(const struct cpu_mm *m)
{
    return cpu_kernels_amx_takes(&m->w) || (bf16_base->wants_xq && bf16_base->wants_xq(m));
}

// A tile of 16 rows costs about what reading its weights does (on the
// demo model at 16 sequences, with rows + 2 instead, the threads' shares of
// the experts came out unequal: MoE phase 8% longer).
static uint64_t amx_row_cost(const struct cpu_mm *m)
{
    if (!cpu_kernels_amx_takes(&m->w)) return (uint64_t)m->rows + 2;
    // (The bf16 path's tiles take half the products: it keeps the split
    // one's cost, which only balances the threads' shares.)
    return 2 + 2 * (((uint64_t)m->rows + AMX_MR - 1) / AMX_MR);
}

static struct cpu_kernels amx_table;

static void amx_table_init(void)
{
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
    bf16_base = base;
    amx_bf16_table = *base;
    amx_bf16_table.matmul = amx_bf16_matmul;
    amx_bf16_table.row_cost = amx_row_cost;
    amx_bf16_table.wants_xq = amx_bf16_wants_xq;
    return &amx_bf16_table;
}
