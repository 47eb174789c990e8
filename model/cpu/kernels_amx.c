// kernels_amx: the AVX-512 table with its big bf16 matmuls on the AMX tile
// unit (Sapphire Rapids and later). Compiled with the avx512 flags plus
// -mamx-tile -mamx-bf16 -mavx512bf16; reached only after cpu_kernels_amx()
// checked the CPU and got the kernel's permission to use tile state.
//
// Which matrices: bf16, K a multiple of 32, at least AMX_MIN_BYTES — the
// lm_head, and a big model's attention projections. The choice depends on
// the matrix alone, never on the rows, so a row's outputs stay the same in
// any batch. Smaller matrices keep the AVX-512 kernels: the tile unit's
// loads (16 rows of a weight matrix each, into tile registers that are not
// renamed) leave memory latency exposed, so where a matmul is bound by
// reading its weights (decode at a few rows) it reaches 60-75% of a core's
// read bandwidth against the AVX-512 stream's 100%. Above 4 MiB that cost
// is small at batch 1 for a big model and repaid once the rows make the
// matmul compute-bound (the lm_head at 16 rows alone, one core: 1.9x).
// For the demo model, whose lm_head is most of a decode step, it is not:
// hence a table only chosen by name.
//
// Why the split activations: TDPBF16PS multiplies bf16 by bf16. The weights
// are bf16 already, so they are exact; an fp32 activation x is written as
// hi + lo, hi = bf16(x) and lo = bf16(x - hi), which leaves |x - hi - lo| <=
// 2^-18 |x|. Each product of a bf16 weight with hi or lo is exact in fp32
// and the tile unit sums them in fp32, so the result is within a few fp32
// roundings of the fp32 matmul. Not bit-identical to any FMA chain: the unit
// has its own order and internal rounding (checked against sequential,
// pairwise and single-rounding sums on random tiles: none match), so no
// other table can stand in for it on some rows. Measured here, one core
// issues about 1.37 TFLOP/s of tile products (10x its AVX-512 FMA peak),
// half of that useful with hi and lo.
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "model/cpu/kernels.h"

const struct cpu_kernels *cpu_kernels_avx512_table(void);
const struct cpu_kernels *cpu_kernels_amx_table(void);

// Matrices from this size on go to the tile unit (the avx512 table streams
// them as stored up to 16 rows from the same size).
#define AMX_MIN_BYTES (4u << 20)

// One k-block is 32 bf16 values: a tile row of 64 bytes.
#define KB 32
// A B tile (16 k-pairs x 16 x rows of bf16 pairs) in 32-bit words.
#define BT_WORDS 256

// The tile register file: 0-3 accumulators (C), 4-5 weights (A), 6-7 the
// split activations (B hi, B lo). Every tile is 16 rows of 64 bytes.
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void tiles_begin(void)
{
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

// r[j] lane i = v[i] lane j, for sixteen vectors of sixteen 32-bit lanes:
// pairs, then quads, then 128-bit blocks twice.
static inline void transpose16(__m512i v[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // Now each 128-bit block holds a 4x4 square of the result: gather the
    // squares of four vectors four apart into place, two blocks at a time.
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

// x rows r0..r0+mb-1 (mb <= 32) as B tiles: for k-block kb and column tile
// mt, hi at xp + (kb * 2 + mt) * 2 * BT_WORDS and lo one tile after it.
// Word k2 of column c holds the bf16 pair for k = kb*32 + 2*k2, +1 of x row
// mt*16 + c: the pair order TDPBF16PS reads. Missing rows are zero. Each
// row's sixteen pairs are one vector; sixteen rows transposed give the
// tile's rows.
static void pack_x(const struct cpu_mm *m, int r0, int mb, int K, uint32_t *xp)
{
    const int nkb = K / KB;
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    for (int mt = 0; mt * 16 < mb; mt++) {
        const float *x[16];
        for (int c = 0; c < 16; c++) {
            const int i = mt * 16 + c, r = r0 + i;
            x[c] = i < mb ? m->x + (size_t)(m->x_rows ? m->x_rows[r] : r) * m->ldx : NULL;
        }
        for (int kb = 0; kb < nkb; kb++) {
            __m512i hi[16], lo[16];
            for (int c = 0; c < 16; c++) {
                if (!x[c]) {
                    hi[c] = lo[c] = _mm512_setzero_si512();
                    continue;
                }
                __m512 x0 = _mm512_loadu_ps(x[c] + kb * KB), x1 = _mm512_loadu_ps(x[c] + kb * KB + 16);
                hi[c] = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
                // hi back in fp32: bf16 is the top half of an fp32.
                __m512 h0 = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi[c])), 16));
                __m512 h1 = _mm512_castsi512_ps(
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi[c], 1)), 16));
                // x - hi is exact; where x is not finite, lo is 0 (not NaN).
                __m512 d0 = _mm512_maskz_sub_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x0), inf, _CMP_LT_OQ), x0, h0);
                __m512 d1 = _mm512_maskz_sub_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(x1), inf, _CMP_LT_OQ), x1, h1);
                lo[c] = (__m512i)_mm512_cvtne2ps_pbh(d1, d0);
            }
            transpose16(hi);
            transpose16(lo);
            uint32_t *b = xp + (size_t)(kb * 2 + mt) * 2 * BT_WORDS;
            for (int k2 = 0; k2 < 16; k2++) {
                _mm512_storeu_si512(b + k2 * 16, hi[k2]);
                _mm512_storeu_si512(b + BT_WORDS + k2 * 16, lo[k2]);
            }
        }
    }
}

// Weight rows o..o+n-1 (n < 16) copied into a zero-padded 16-row tile
// source, so that a tail never reads past the matrix.
static const uint16_t *pad_rows(const uint16_t *w, int o, int n, int K, uint16_t *pad)
{
    memcpy(pad, w + (size_t)o * K, (size_t)n * K * 2);
    memset(pad + (size_t)n * K, 0, (size_t)(16 - n) * K * 2);
    return pad;
}

// Accumulator tile (16 outputs o.. x 16 x rows from r0 + col0) into y.
// st: the tile as stored, st[i * 16 + j] = output o + i of x row col0 + j;
// transposed, each x row's outputs are one vector.
static void scatter_c(const struct cpu_mm *m, const float *st, int o, int no, int r0, int col0, int nrows)
{
    __m512i v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_loadu_si512(st + 16 * i);
    transpose16(v);
    const __mmask16 keep = (__mmask16)((1u << no) - 1u);
    for (int j = 0; j < nrows; j++) {
        const int r = r0 + col0 + j;
        float *y = m->y + (size_t)(m->y_rows ? m->y_rows[r] : r) * m->ldy + o;
        __m512 t = _mm512_castsi512_ps(v[j]);
        if (m->accumulate) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(keep, y));
        _mm512_mask_storeu_ps(y, keep, t);
    }
}

#define PF_GROUPS 2

// The four accumulators: cleared, and stored to st (tile t at st + 256 t).
static inline void zero4(void)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

static inline void store4(float *st)
{
    _tile_stored(0, st, 64);
    _tile_stored(1, st + 256, 64);
    _tile_stored(2, st + 512, 64);
    _tile_stored(3, st + 768, 64);
}

#define DP2(c, a) \
    do {                           \
        _tile_dpbf16ps(c, a, 6);   \
        _tile_dpbf16ps(c, a, 7);   \
    } while (0)

// Up to 16 x rows: groups of 64 outputs (four accumulators, one column
// tile), each k-block's B tiles loaded once for the four.
static void rows16(const struct cpu_mm *m, int o0, int o1, int r0, int mb, const uint32_t *xp, uint16_t *pad,
                   float *st)
{
    const int K = m->w.in, nkb = K / KB;
    const uint16_t *w = m->w.data;
    const size_t ws = (size_t)K * 2;
    for (int o = o0; o < o1; o += 64) {
        const int no = o1 - o < 64 ? o1 - o : 64;
        if (no == 64) {
            const uint16_t *a = w + (size_t)o * K;
            // A tile load takes 16 lines a row apart, which the hardware
            // prefetcher does not follow: the group PF_GROUPS ahead (64
            // contiguous rows) is fetched into L2, 1/nkb of it per k-block
            // (1 or 2 ahead: 80-88% of one core's read bandwidth on the
            // lm_head; none: 69-77%).
            const char *next =
                o + 64 * (PF_GROUPS + 1) <= o1 ? (const char *)(a + 64 * (size_t)PF_GROUPS * K) : NULL;
            const size_t pf_step = (size_t)64 * K * 2 / nkb;
            zero4();
            for (int kb = 0; kb < nkb; kb++) {
                const uint32_t *b = xp + (size_t)kb * 4 * BT_WORDS;
                const uint16_t *ak = a + kb * KB;
                if (next)
                    for (size_t p = 0; p < pf_step; p += 64) _mm_prefetch(next + kb * pf_step + p, _MM_HINT_T1);
                _tile_loadd(6, b, 64);
                _tile_loadd(7, b + BT_WORDS, 64);
                _tile_stream_loadd(4, ak, ws);
                _tile_stream_loadd(5, ak + 16 * (size_t)K, ws);
                DP2(0, 4);
                DP2(1, 5);
                _tile_stream_loadd(4, ak + 32 * (size_t)K, ws);
                _tile_stream_loadd(5, ak + 48 * (size_t)K, ws);
                DP2(2, 4);
                DP2(3, 5);
            }
            store4(st);
            for (int t = 0; t < 4; t++) scatter_c(m, st + 256 * t, o + 16 * t, 16, r0, 0, mb);
            continue;
        }
        // The tail, one 16-output tile at a time (the same arithmetic).
        for (int t = 0; t * 16 < no; t++) {
            const int n = no - 16 * t < 16 ? no - 16 * t : 16;
            const uint16_t *a = n == 16 ? w + (size_t)(o + 16 * t) * K : pad_rows(w, o + 16 * t, n, K, pad);
            _tile_zero(0);
            for (int kb = 0; kb < nkb; kb++) {
                const uint32_t *b = xp + (size_t)kb * 4 * BT_WORDS;
                _tile_loadd(6, b, 64);
                _tile_loadd(7, b + BT_WORDS, 64);
                _tile_stream_loadd(4, a + kb * KB, ws);
                DP2(0, 4);
            }
            _tile_stored(0, st, 64);
            scatter_c(m, st, o + 16 * t, n, r0, 0, mb);
        }
    }
}

// 17 to 32 x rows: groups of 32 outputs x two column tiles (four
// accumulators), each weight tile meeting both column tiles.
static void rows32(const struct cpu_mm *m, int o0, int o1, int r0, int mb, const uint32_t *xp, uint16_t *pad,
                   float *st)
{
    const int K = m->w.in, nkb = K / KB;
    const uint16_t *w = m->w.data;
    const size_t ws = (size_t)K * 2;
    for (int o = o0; o < o1; o += 32) {
        const int no = o1 - o < 32 ? o1 - o : 32;
        const int n0 = no < 16 ? no : 16, n1 = no - n0;
        const uint16_t *a0 = n0 == 16 ? w + (size_t)o * K : pad_rows(w, o, n0, K, pad);
        const uint16_t *a1 = n1 == 16 ? w + (size_t)(o + 16) * K
                             : n1 > 0 ? pad_rows(w, o + 16, n1, K, pad + 16 * (size_t)K)
                                      : a0; // unused outputs: any readable rows
        zero4();
        for (int kb = 0; kb < nkb; kb++) {
            const uint32_t *b = xp + (size_t)kb * 4 * BT_WORDS;
            _tile_loadd(4, a0 + kb * KB, ws);
            _tile_loadd(5, a1 + kb * KB, ws);
            _tile_loadd(6, b, 64);
            _tile_loadd(7, b + BT_WORDS, 64);
            DP2(0, 4);
            DP2(1, 5);
            _tile_loadd(6, b + 2 * BT_WORDS, 64);
            _tile_loadd(7, b + 3 * BT_WORDS, 64);
            DP2(2, 4);
            DP2(3, 5);
        }
        store4(st);
        scatter_c(m, st, o, n0, r0, 0, 16);
        scatter_c(m, st + 512, o, n0, r0, 16, mb - 16);
        if (n1 > 0) {
            scatter_c(m, st + 256, o + 16, n1, r0, 0, 16);
            scatter_c(m, st + 768, o + 16, n1, r0, 16, mb - 16);
        }
    }
}

// The tile path reads its matrices as stored; the rest go to the avx512
// matmul, which wants them packed.
static bool amx_takes(const struct cpu_wmat *w)
{
    return w->dtype == DTYPE_BF16 && w->in % KB == 0 && w->in > 0 &&
           (size_t)w->out * (size_t)w->in * 2 >= AMX_MIN_BYTES;
}

static bool amx_wants_packed(const struct cpu_wmat *w) { return !amx_takes(w); }

// Row blocks of 32 (then 16) x rows, each meeting all outputs [o0, o1).
// An output element gets the same sequence of tile operations — k-blocks in
// order, hi then lo — in rows16 and rows32 alike, so it depends only on its
// x row and w row.
static void amx_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    const int K = m->w.in;
    if (!amx_takes(&m->w)) {
        cpu_kernels_avx512_table()->matmul(m, o0, o1, scratch);
        return;
    }
    if (o1 <= o0 || m->rows <= 0) return;
    uint32_t *xp = (uint32_t *)scratch;                            // K / 32 x 4 B tiles
    float *st = scratch + (size_t)K / KB * 4 * BT_WORDS;           // four stored C tiles
    uint16_t *pad = (uint16_t *)(st + 4 * 256);                    // two 16-row weight tiles
    {
        // The first groups, which the loop's prefetch ahead does not reach.
        const char *w0 = (const char *)m->w.data + (size_t)o0 * K * 2;
        const int n = o1 - o0 < 64 * PF_GROUPS ? o1 - o0 : 64 * PF_GROUPS;
        for (size_t p = 0; p < (size_t)n * K * 2; p += 64) _mm_prefetch(w0 + p, _MM_HINT_T1);
    }
    tiles_begin();
    for (int r0 = 0; r0 < m->rows; r0 += 32) {
        const int mb = m->rows - r0 < 32 ? m->rows - r0 : 32;
        pack_x(m, r0, mb, K, xp);
        if (mb > 16)
            rows32(m, o0, o1, r0, mb, xp, pad, st);
        else
            rows16(m, o0, o1, r0, mb, xp, pad, st);
    }
    _tile_release();
}

static struct cpu_kernels amx_table;

static void amx_table_init(void)
{
    amx_table = *cpu_kernels_avx512_table();
    amx_table.name = "amx";
    amx_table.matmul = amx_matmul;
    amx_table.wants_packed = amx_wants_packed;
}

const struct cpu_kernels *cpu_kernels_amx_table(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_table_init);
    return &amx_table;
}
