// Pins the CPU kernels: every SIMD table against the scalar reference on
// random data at odd and even shapes, each matmul output independent of the
// batch around it and of the thread split (quantized int4, int8 and fp8
// matrices too, against their formulas), the thread pool, and the per-row
// operations (RMSNorm, RoPE, router top-k) against direct formulas.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/cpu/kernels.h"
#include "model/cpu/ops.h"
#include "model/cpu/threadpool.h"

static uint64_t rng_state = 88172645463325252ull;
static double rnd(void) // uniform in [-1, 1)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void *xmalloc(size_t n)
{
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 64, n ? n : 64), 0);
    return p;
}

static void *random_weights(enum dtype dt, size_t n)
{
    void *w = xmalloc(n * dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = (float)rnd();
        if (dt == DTYPE_BF16) ((uint16_t *)w)[i] = ms_f32_to_bf16(v);
        else if (dt == DTYPE_F16) ((uint16_t *)w)[i] = ms_f32_to_f16(v);
        else ((float *)w)[i] = v;
    }
    return w;
}

static float *random_floats(size_t n)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)rnd();
    return x;
}

static const struct cpu_kernels *simd_tables[3];
static int n_simd;
static const struct cpu_kernels *bf16_table; // avx512_bf16, when this CPU has it

static int setup(void **state)
{
    (void)state;
    n_simd = 0;
    if (cpu_kernels_avx2()) simd_tables[n_simd++] = cpu_kernels_avx2();
    if (cpu_kernels_avx512()) simd_tables[n_simd++] = cpu_kernels_avx512();
    if (cpu_kernels_amx()) simd_tables[n_simd++] = cpu_kernels_amx();
    else fprintf(stderr, "note: no AMX tile unit usable here; the amx table is not tested\n");
    if (n_simd == 0) fprintf(stderr, "note: this CPU has no SIMD tables; only scalar is tested\n");
    bf16_table = cpu_kernels_avx512_bf16();
    if (!bf16_table) fprintf(stderr, "note: no AVX512_BF16 here; the avx512_bf16 table is not tested\n");
    return 0;
}

static const int shapes[][3] = { // rows, in, out
    {1, 1, 1}, {1, 7, 5}, {2, 8, 4}, {3, 33, 17}, {4, 64, 12}, {5, 96, 50},
    {6, 16, 16}, {7, 130, 33}, {13, 100, 37}, {1, 512, 300}, {64, 256, 96}, {19, 1000, 7},
    // in a multiple of 32 (the amx table's tiles), rows on both sides of 16 and 32
    {16, 32, 64}, {17, 64, 70}, {32, 128, 129}, {33, 96, 15}, {45, 64, 200}, {3, 2048, 65},
    // odd in with the avx2 table's 5- and 6-row bf16 tiles (half a pair at a time)
    {6, 33, 20}, {11, 77, 40},
};

static void run_matmul(const struct cpu_kernels *k, const struct cpu_wmat *w, const float *x,
                       int rows, float *y, bool acc)
{
    float *scratch = xmalloc(cpu_kernels_scratch_floats(w->in, 1, 1) * sizeof(float));
    struct cpu_mm m = {.w = *w, .x = x, .ldx = (size_t)w->in, .y = y, .ldy = (size_t)w->out,
                       .rows = rows, .accumulate = acc};
    k->matmul(&m, 0, w->out, scratch);
    free(scratch);
}

static void simd_matmul_matches_scalar_at_every_shape_and_dtype(void **state)
{
    (void)state;
    const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (int t = 0; t < n_simd; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int d = 0; d < 3; d++) {
                int rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
                struct cpu_wmat w = {.data = random_weights(dts[d], (size_t)out * in), .dtype = dts[d], .out = out, .in = in};
                float *x = random_floats((size_t)rows * in);
                float *ref = xmalloc((size_t)rows * out * 4), *got = xmalloc((size_t)rows * out * 4);
                for (int acc = 0; acc < 2; acc++) {
                    for (int i = 0; i < rows * out; i++) ref[i] = got[i] = (float)i * 0.25f;
                    run_matmul(cpu_kernels_scalar(), &w, x, rows, ref, acc);
                    run_matmul(simd_tables[t], &w, x, rows, got, acc);
                    for (int i = 0; i < rows * out; i++) {
                        // |x|, |w| <= 1: rounding is bounded by in * eps of the magnitude.
                        double tol = 1e-6 * in + 1e-6 * fabs(ref[i]);
                        if (fabs(ref[i] - got[i]) > tol)
                            fail_msg("%s %s rows %d in %d out %d acc %d: [%d] %g vs scalar %g",
                                     simd_tables[t]->name, dtype_name(dts[d]), rows, in, out, acc,
                                     i, got[i], ref[i]);
                    }
                }
                free((void *)w.data);
                free(x);
                free(ref);
                free(got);
            }
}

// A row's outputs are bit-identical whether it is computed alone, inside a
// batch of any size, through gathered rows, or in any split of the outputs.
static void matmul_outputs_do_not_depend_on_batch_or_split(void **state)
{
    (void)state;
    const struct cpu_kernels *tables[4] = {cpu_kernels_scalar(), NULL, NULL, NULL};
    int nt = 1;
    for (int t = 0; t < n_simd; t++) tables[nt++] = simd_tables[t];
    const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (int t = 0; t < nt; t++)
        for (int d = 0; d < 6; d++) {
            // in 77 (a K tail in every SIMD table), then 96 (none)
            const int in = d < 3 ? 77 : 96, out = 45, rows = 23;
            struct cpu_wmat w = {.data = random_weights(dts[d % 3], (size_t)out * in), .dtype = dts[d % 3], .out = out, .in = in};
            float *x = random_floats((size_t)rows * in);
            float *all = xmalloc((size_t)rows * out * 4), *one = xmalloc((size_t)out * 4);
            float *scratch = xmalloc(cpu_kernels_scratch_floats(in, 1, 1) * 4);
            run_matmul(tables[t], &w, x, rows, all, false);
            for (int r = 0; r < rows; r++) {
                run_matmul(tables[t], &w, x + (size_t)r * in, 1, one, false);
                assert_memory_equal(one, all + (size_t)r * out, (size_t)out * 4);
            }
            // Gathered and scattered in reverse order, outputs split at odd points.
            int32_t idx[70];
            for (int r = 0; r < rows; r++) idx[r] = rows - 1 - r;
            float *scat = xmalloc((size_t)rows * out * 4);
            for (int nb = 1; nb <= rows; nb += 5) {
                struct cpu_mm m = {.w = w, .x = x, .ldx = in, .x_rows = idx, .y = scat, .ldy = out,
                                   .y_rows = idx, .rows = nb};
                int cuts[] = {0, 1, 13, 14, 30, out};
                for (int c = 0; c + 1 < 6; c++) tables[t]->matmul(&m, cuts[c], cuts[c + 1], scratch);
                for (int r = 0; r < nb; r++)
                    assert_memory_equal(scat + (size_t)idx[r] * out, all + (size_t)idx[r] * out,
                                        (size_t)out * 4);
            }
            free((void *)w.data);
            free(x);
            free(all);
            free(one);
            free(scat);
            free(scratch);
        }
}

// ---- quantized matrices -------------------------------------------------------------

// A random quantized (out, in) matrix in canonical rows (every code of the
// format, scales of both signs and a zero scale, zero points 0..16), packed.
struct qmat {
    struct cpu_wmat w;
    void *rows_buf;
    struct quant_rows r;   // (out, in) canonical
};

static void qmat_pack(struct qmat *q);

static void qmat_make(struct qmat *q, enum quant_format f, int out, int in, int group)
{
    q->w.packed = NULL;
    q->rows_buf = xmalloc(quant_rows_bytes(out, in, f, group));
    quant_rows_init(&q->r, q->rows_buf, out, in, f, group);
    for (size_t i = 0; i < (size_t)out * in; i++) {
        const uint32_t u = (uint32_t)((rnd() + 1.0) * 2147483647.0);
        uint8_t v = (uint8_t)u;
        if (f == QUANT_FP8 && (v & 0x7f) == 0x7f) v ^= 1;  // not the NaN codes
        // int8 codes take -128 too: compressed-tensors checkpoints store it
        // (their symmetric scale is the largest magnitude over 127.5).
        if (f == QUANT_INT4) v &= 15;
        q->r.q[i] = v;
    }
    for (int i = 0; i < out * q->r.n_groups; i++) {
        float s = (float)rnd() * 0.05f;
        if (i % 7 == 3) s = 0.0f;
        if (f == QUANT_INT4) s = ms_f16_to_f32(ms_f32_to_f16(s)); // int4 scales are fp16 values
        q->r.scale[i] = s;
        q->r.zero[i] = f == QUANT_INT4 ? (uint8_t)(i % 17) : 0;
    }
    qmat_pack(q);
}

// q->r packed into blocks (q->w), after its values were set or changed.
static void qmat_pack(struct qmat *q)
{
    const enum quant_format f = q->r.format;
    const int out = q->r.n, in = q->r.cols, group = q->r.group;
    free((void *)q->w.packed);
    q->w = (struct cpu_wmat){.dtype = DTYPE_BF16, .out = out, .in = in, .quant = f, .group = group};
    const size_t bb = quant_block_bytes(f, in, group);
    char *packed = xmalloc((size_t)((out + 15) / 16) * bb);
    void *tmp = xmalloc(quant_rows_bytes(16, in, f, group));
    for (int o = 0; o < out; o += 16) {
        struct quant_rows b;
        quant_rows_init(&b, tmp, 16, in, f, group);
        b.n = out - o < 16 ? out - o : 16;
        for (int i = 0; i < b.n; i++) {
            memcpy(b.q + (size_t)i * in, q->r.q + (size_t)(o + i) * in, (size_t)in);
            memcpy(b.scale + (size_t)i * b.n_groups, q->r.scale + (size_t)(o + i) * b.n_groups,
                   (size_t)b.n_groups * sizeof(float));
            memcpy(b.zero + (size_t)i * b.n_groups, q->r.zero + (size_t)(o + i) * b.n_groups,
                   (size_t)b.n_groups);
        }
        cpu_qpack_block(&b, packed + (size_t)(o / 16) * bb);
    }
    free(tmp);
    q->w.packed = packed;
}

static void qmat_free(struct qmat *q)
{
    free((void *)q->w.packed);
    free(q->rows_buf);
}

static const struct {
    enum quant_format f;
    int rows, in, out, group;
} qshapes[] = {
    {QUANT_INT4, 1, 8, 1, 128},     {QUANT_INT4, 3, 64, 17, 32},   {QUANT_INT4, 1, 77, 40, 128},
    {QUANT_INT4, 7, 300, 33, 128},  {QUANT_INT4, 17, 256, 70, 64}, {QUANT_INT4, 1, 2048, 96, 128},
    {QUANT_INT8, 1, 5, 3, 128},     {QUANT_INT8, 6, 200, 50, 128}, {QUANT_INT8, 13, 130, 37, 32},
    {QUANT_FP8, 1, 1, 1, 128},      {QUANT_FP8, 5, 96, 50, 128},   {QUANT_FP8, 9, 384, 129, 128},
    {QUANT_FP8, 2, 100, 16, 48},
    // int4 the amx table takes (k and groups in whole 32s, groups up to
    // 256): one tile of rows and several, more rows than a group of x rows
    // (64), a last scale group shorter than the others, blocks past the
    // last four
    {QUANT_INT4, 70, 320, 83, 128}, {QUANT_INT4, 9, 256, 64, 256},  {QUANT_INT4, 16, 96, 40, 32},
    // fp8 the amx table takes (the same rules), and int8 of such shapes
    // (which it leaves to its FMA path)
    {QUANT_FP8, 70, 320, 83, 128},  {QUANT_INT8, 9, 256, 64, 256},  {QUANT_INT8, 16, 96, 40, 32},
    {QUANT_FP8, 1, 2048, 96, 128},  {QUANT_INT8, 1, 2048, 96, 128}, {QUANT_INT8, 70, 320, 83, 128},
};

// The packed blocks dequantize to the canonical rows' formula values, and
// every table's matmul equals x . w^T on those values, within the rounding
// of another summation order (the scalar table: the same order, so close to
// exact).
static void quantized_matmul_matches_the_formula_on_every_table(void **state)
{
    (void)state;
    const struct cpu_kernels *tables[4] = {cpu_kernels_scalar(), NULL, NULL, NULL};
    int nt = 1;
    for (int t = 0; t < n_simd; t++) tables[nt++] = simd_tables[t];
    for (size_t si = 0; si < sizeof qshapes / sizeof qshapes[0]; si++) {
        const int rows = qshapes[si].rows, in = qshapes[si].in, out = qshapes[si].out;
        struct qmat q;
        qmat_make(&q, qshapes[si].f, out, in, qshapes[si].group);
        float *wf = xmalloc((size_t)out * in * 4), *row = xmalloc((size_t)in * 4);
        double wmax = 0;
        for (int o = 0; o < out; o++) {
            cpu_qpack_dequant_row(&q.w, o, row);
            for (int k = 0; k < in; k++) {
                wf[(size_t)o * in + k] = quant_rows_value(&q.r, o, k);
                assert_true(row[k] == wf[(size_t)o * in + k]);
                wmax = fmax(wmax, fabs(row[k]));
            }
        }
        float *x = random_floats((size_t)rows * in);
        float *got = xmalloc((size_t)rows * out * 4);
        for (int t = 0; t < nt; t++)
            for (int acc = 0; acc < 2; acc++) {
                for (int i = 0; i < rows * out; i++) got[i] = (float)i * 0.25f;
                run_matmul(tables[t], &q.w, x, rows, got, acc);
                for (int r = 0; r < rows; r++)
                    for (int o = 0; o < out; o++) {
                        double want = acc ? (double)(r * out + o) * 0.25 : 0.0;
                        for (int k = 0; k < in; k++) want += (double)x[(size_t)r * in + k] * wf[(size_t)o * in + k];
                        // |x| <= 1: rounding of in products of size wmax, and of
                        // the zero point's correction (int4: z <= 16 times the sum,
                        // z + 16 <= 31 on the tile path).
                        const double tol = 1e-6 * in * wmax * (qshapes[si].f == QUANT_INT4 ? 40 : 2) +
                                           1e-6 * fabs(want);
                        const double g = got[(size_t)r * out + o];
                        if (fabs(g - want) > tol)
                            fail_msg("%s %s rows %d in %d out %d group %d acc %d: y[%d][%d] = %.9g, "
                                     "the formula %.9g", tables[t]->name, quant_format_name(qshapes[si].f),
                                     rows, in, out, qshapes[si].group, acc, r, o, g, want);
                    }
            }
        free(wf);
        free(row);
        free(x);
        free(got);
        qmat_free(&q);
    }
}

// The tables whose quantized matmuls the tests hold side by side: scalar,
// the SIMD ones, and avx512_bf16's paths with quantized kernels of their
// own: its tile path where the tile unit is usable, its VDPBF16PS path
// (int4, int8 and fp8) where the CPU has AVX512_BF16. Returns how many.
static int quant_tables(const struct cpu_kernels *tables[6])
{
    int nt = 0;
    tables[nt++] = cpu_kernels_scalar();
    for (int t = 0; t < n_simd; t++) tables[nt++] = simd_tables[t];
    if (cpu_kernels_avx512_bf16_tiles()) tables[nt++] = cpu_kernels_avx512_bf16_tiles();
    if (bf16_table) tables[nt++] = cpu_kernels_avx512_bf16_path(false); // int4, int8 and fp8 on VDPBF16PS
    return nt;
}

// Every byte an fp8 or int8 weight can hold (int8's -128 and fp8's NaN
// codes too, which the formats' own writers never store) reads as
// quant.h's formula on every table, the tile unit's byte tables and
// avx512_bf16's bf16 pairs included:
// a one-hot x row picks one weight, so each output is exactly s * w. Row
// o's k-th weight is byte (16 o + k) mod 256, the scales powers of two and
// not. The 256 one-hot rows as one batch, and each alone (the one-row
// paths: the FMA path's wide tile, the tiles made as they are met).
static void every_fp8_and_int8_byte_reads_as_its_formula(void **state)
{
    (void)state;
    const struct cpu_kernels *tables[6];
    const int nt = quant_tables(tables);
    const enum quant_format fs[] = {QUANT_FP8, QUANT_INT8};
    const int out = 16, in = 256, rows = 256;
    float *x = xmalloc((size_t)rows * in * 4), *y = xmalloc((size_t)rows * out * 4), *w = xmalloc((size_t)in * 4);
    memset(x, 0, (size_t)rows * in * 4);
    for (int r = 0; r < rows; r++) x[(size_t)r * in + r] = 1.0f;
    for (int fi = 0; fi < 2; fi++) {
        struct qmat q;
        qmat_make(&q, fs[fi], out, in, 128);
        for (int o = 0; o < out; o++) {
            for (int k = 0; k < in; k++) q.r.q[(size_t)o * in + k] = (uint8_t)(16 * o + k);
            q.r.scale[o * 2] = o % 2 ? 0.375f : 1.0f;
            q.r.scale[o * 2 + 1] = 0x1p-7f * (float)(o + 1);
        }
        qmat_pack(&q);
        for (int t = 0; t < nt * 2; t++) {
            const bool alone = t >= nt;
            if (alone)
                for (int r = 0; r < rows; r++)
                    run_matmul(tables[t - nt], &q.w, x + (size_t)r * in, 1, y + (size_t)r * out, false);
            else
                run_matmul(tables[t], &q.w, x, rows, y, false);
            for (int o = 0; o < out; o++) {
                cpu_qpack_dequant_row(&q.w, o, w);
                for (int k = 0; k < in; k++) {
                    const float want = quant_rows_value(&q.r, o, k), got = y[(size_t)k * out + o];
                    assert_true(w[k] == want);
                    if (got != want)
                        fail_msg("%s %s%s: byte 0x%02x (output %d, k %d) reads %.9g, the formula %.9g",
                                 tables[alone ? t - nt : t]->name, quant_format_name(fs[fi]),
                                 alone ? " (rows alone)" : "", q.r.q[(size_t)o * in + k], o, k, got, want);
                }
            }
        }
        qmat_free(&q);
    }
    free(x);
    free(y);
    free(w);
}

// As for plain weights: a row's quantized outputs are bit-identical alone,
// in any batch, gathered, or in any split of the outputs (starting inside
// a block of 16 too). 200 outputs (13 blocks, the last one partial): a row
// alone meets the wide one-row tile (Q_NB1 blocks), then a Q_NB-wide one,
// then single blocks. int4 and fp8 of 320 inputs go to the tile unit where
// the amx table (or avx512_bf16's tile path) runs: 70 rows, two groups of x
// rows; alone, one row meets each weight tile as it is made.
static void quantized_outputs_do_not_depend_on_batch_or_split(void **state)
{
    (void)state;
    const struct cpu_kernels *tables[6];
    const int nt = quant_tables(tables);
    const enum quant_format fs[] = {QUANT_INT4, QUANT_INT8, QUANT_FP8, QUANT_INT4, QUANT_INT8, QUANT_FP8};
    for (int t = 0; t < nt; t++)
        for (int fi = 0; fi < 6; fi++) {
            const int in = fi == 0 ? 264 : fi >= 3 ? 320 : 77, out = 200, rows = fi >= 3 ? 70 : 23;
            struct qmat q;
            qmat_make(&q, fs[fi], out, in, 128);
            float *x = random_floats((size_t)rows * in);
            float *all = xmalloc((size_t)rows * out * 4), *one = xmalloc((size_t)out * 4);
            float *scratch = xmalloc(cpu_kernels_scratch_floats(in, 1, 1) * 4);
            run_matmul(tables[t], &q.w, x, rows, all, false);
            for (int r = 0; r < rows; r++) {
                run_matmul(tables[t], &q.w, x + (size_t)r * in, 1, one, false);
                if (memcmp(one, all + (size_t)r * out, (size_t)out * 4))
                    fail_msg("%s %s: row %d alone differs from the batch", tables[t]->name,
                             quant_format_name(fs[fi]), r);
            }
            int32_t idx[70];
            for (int r = 0; r < rows; r++) idx[r] = rows - 1 - r;
            float *scat = xmalloc((size_t)rows * out * 4);
            for (int nb = 1; nb <= rows; nb += 5) {
                struct cpu_mm m = {.w = q.w, .x = x, .ldx = in, .x_rows = idx, .y = scat, .ldy = out,
                                   .y_rows = idx, .rows = nb};
                int cuts[] = {0, 1, 13, 14, 30, 140, out};
                for (int c = 0; c + 1 < 7; c++) tables[t]->matmul(&m, cuts[c], cuts[c + 1], scratch);
                for (int r = 0; r < nb; r++)
                    assert_memory_equal(scat + (size_t)idx[r] * out, all + (size_t)idx[r] * out,
                                        (size_t)out * 4);
            }
            free(x);
            free(all);
            free(one);
            free(scat);
            free(scratch);
            qmat_free(&q);
        }
}

// The packed layout as kernels.h draws it: block b, k-major, 16 outputs per
// k (bf16: two k per dword, low half first), zeros past out and past an odd in.
static void packed_layout_holds_16_outputs_per_k(void **state)
{
    (void)state;
    const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (int d = 0; d < 3; d++) {
        const int out = 21, in = 5, nb = 2;
        struct cpu_wmat w = {.data = random_weights(dts[d], (size_t)out * in), .dtype = dts[d], .out = out, .in = in};
        const size_t bb = cpu_pack_block_bytes(dts[d], in);
        assert_int_equal(bb, dts[d] == DTYPE_BF16 ? 3 * 16 * 4 : (size_t)in * 16 * dtype_size(dts[d]));
        assert_int_equal(cpu_pack_bytes(&w), nb * bb);
        unsigned char *p = xmalloc(nb * bb);
        memset(p, 0xAB, nb * bb);
        cpu_pack_blocks(&w, 0, nb, p);
        for (int b = 0; b < nb; b++)
            for (int j = 0; j < 16; j++)
                for (int k = 0; k < in + 1; k++) {
                    const int o = 16 * b + j;
                    float want = o < out && k < in ? cpu_load_weight(w.data, dts[d], (size_t)o * in + k) : 0.0f;
                    float got;
                    if (dts[d] == DTYPE_BF16) {
                        uint32_t dw;
                        memcpy(&dw, p + b * bb + ((size_t)(k / 2) * 16 + j) * 4, 4);
                        got = ms_bf16_to_f32((uint16_t)(k % 2 ? dw >> 16 : dw & 0xFFFF));
                    } else if (k < in) {
                        got = cpu_load_weight(p + b * bb, dts[d], (size_t)k * 16 + j);
                    } else {
                        continue; // no padding k for f16 and f32
                    }
                    if (got != want || (want == 0.0f && signbit(got)))
                        fail_msg("%s block %d output %d k %d: %g, not %g", dtype_name(dts[d]), b, j, k, got, want);
                }
        // A slice on a block edge keeps the packing; elsewhere it drops it.
        w.packed = p;
        struct cpu_wmat s16 = cpu_wmat_slice(&w, 16, 5), s5 = cpu_wmat_slice(&w, 5, 11);
        assert_ptr_equal(s16.packed, p + bb);
        assert_null(s5.packed);
        assert_ptr_equal(s5.data, (const char *)w.data + 5 * in * dtype_size(dts[d]));
        assert_int_equal(s5.out, 11);
        free(p);
        free((void *)w.data);
    }
}

// The tables that read the packed layout (avx512, and amx for the matrices
// it leaves to avx512) give each output exactly one FMA chain over k in
// order from 0 — row-pointer tiles and transposed-x tiles alike —
// packed at load or not, at any batch size, with gathered rows, accumulated,
// and in any split of the outputs, on a block edge or not. What amx puts on
// the tile unit is no FMA chain: there each output must be, in all the same
// cases, exactly what its row alone gives through the weights as stored, and
// within fp32 rounding of the chain. avx512_bf16, on both of its paths, is
// held to the same for bf16 weights (each output what its row alone gives)
// and to the chain for the rest.
static void packed_matmul_is_one_fma_chain_per_output(void **state)
{
    (void)state;
    const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    const int shapes_p[][3] = {{1, 1, 1}, {2, 7, 5}, {6, 33, 16}, {7, 77, 17}, {13, 96, 45},
                               {16, 512, 300}, {33, 130, 70}, {5, 2, 64}, {1, 512, 1000},
                               // 7 to 16 rows and two blocks a row or more: the transposed-x
                               // tiles, three blocks wide up to 8 or 9 rows, two up to 12 (a
                               // block or two left over)
                               {16, 77, 1030}, {9, 64, 1024}, {7, 2, 1040}, {12, 512, 2100},
                               {8, 96, 275}, {11, 64, 384}, {13, 40, 420},
                               // amx: rows on both sides of its 16-row tiles and of a
                               // 64-row group of x (in 512), blocks past its chunks
                               {17, 32, 40}, {31, 64, 100}, {70, 512, 70}, {40, 1024, 4200},
                               // one packed block bigger than a 256 KiB chunk (a dense
                               // Qwen3's down projection has K up to 25600)
                               {3, 9216, 20},
                               // avx512_bf16: rounded rows past a 64-row batch of its FMA path
                               {40, 1024, 600}, {64, 384, 100},
                               // avx2: rows on both sides of its f16 widening to fp32 (16),
                               // a widened block bigger than its 256 KiB chunk
                               {16, 96, 40}, {17, 97, 40}, {18, 4100, 40}};
    // The SIMD tables, then avx512_bf16 on each of its paths (VDPBF16PS, and
    // FMAs in its order).
    const struct cpu_kernels *tables[8];
    const char *names[8];
    int n_tables = 0;
    for (int t = 0; t < n_simd; t++) {
        names[n_tables] = simd_tables[t]->name;
        tables[n_tables++] = simd_tables[t];
    }
    if (bf16_table) {
        names[n_tables] = "avx512_bf16 (VDPBF16PS)";
        tables[n_tables++] = cpu_kernels_avx512_bf16_path(false);
        names[n_tables] = "avx512_bf16 (FMAs)";
        tables[n_tables++] = cpu_kernels_avx512_bf16_path(true);
        if (cpu_kernels_avx512_bf16_tiles()) {
            names[n_tables] = "avx512_bf16 (tiles)";
            tables[n_tables++] = cpu_kernels_avx512_bf16_tiles();
        }
    }
    int tested = 0;
    for (int t = 0; t < n_tables; t++)
        for (size_t si = 0; si < sizeof shapes_p / sizeof shapes_p[0]; si++)
            for (int d = 0; d < 3; d++) {
                const int rows = shapes_p[si][0], in = shapes_p[si][1], out = shapes_p[si][2];
                struct cpu_wmat w = {.data = random_weights(dts[d], (size_t)out * in), .dtype = dts[d],
                                     .out = out, .in = in};
                const struct cpu_kernels *k = tables[t];
                const char *kname = names[t];
                if (!k->wants_packed || !k->wants_packed(&w)) {
                    free((void *)w.data);
                    continue;
                }
                tested++;
                void *pk = xmalloc(cpu_pack_bytes(&w));
                cpu_pack_blocks(&w, 0, (out + 15) / 16, pk);
                struct cpu_wmat wp = w;
                wp.packed = pk;
                float *x = random_floats((size_t)rows * in);
                float *want = xmalloc((size_t)rows * out * 4), *got = xmalloc((size_t)rows * out * 4);
                float *scratch = xmalloc(cpu_kernels_scratch_floats(in, 1, 1) * 4);
                for (int r = 0; r < rows; r++)
                    for (int o = 0; o < out; o++) {
                        float acc = 0.0f;
                        for (int kk = 0; kk < in; kk++)
                            acc = fmaf(x[(size_t)r * in + kk], cpu_load_weight(w.data, dts[d], (size_t)o * in + kk), acc);
                        want[(size_t)r * out + o] = acc;
                    }
                // Not FMA chains over fp32 x: the tile unit's own sums, and
                // bf16 activations (their tolerance: the bf16 tests below).
                const bool amx = !strcmp(k->name, "amx") && cpu_kernels_amx_takes(&w);
                if (amx || (k->bf16_activations && dts[d] == DTYPE_BF16)) {
                    for (int r = 0; r < rows; r++) {
                        run_matmul(k, &w, x + (size_t)r * in, 1, got + (size_t)r * out, false);
                        for (int o = 0; amx && o < out; o++) {
                            const float c = want[(size_t)r * out + o], a = got[(size_t)r * out + o];
                            if (fabs(a - c) > 1e-6 * in + 1e-6 * fabs(c))
                                fail_msg("amx rows %d in %d out %d: [%d][%d] %.9g, FMA chain %.9g", rows, in,
                                         out, r, o, a, c);
                        }
                    }
                    memcpy(want, got, (size_t)rows * out * 4);
                }
                const struct cpu_wmat *ws[2] = {&w, &wp};
                for (int v = 0; v < 2; v++) {
                    const char *how = v ? "packed" : "as stored";
                    run_matmul(k, ws[v], x, rows, got, false);
                    for (int i = 0; i < rows * out; i++)
                        if (got[i] != want[i])
                            fail_msg("%s %s %s rows %d in %d out %d: [%d] %.9g, not the FMA chain's %.9g", kname,
                                     how, dtype_name(dts[d]), rows, in, out, i, got[i], want[i]);
                    for (int r = 0; r < rows; r += 3) { // each third row alone
                        run_matmul(k, ws[v], x + (size_t)r * in, 1, got, false);
                        assert_memory_equal(got, want + (size_t)r * out, (size_t)out * 4);
                    }
                    // Rows gathered in reverse, outputs cut off the block edges,
                    // accumulated onto what y held.
                    int32_t idx[70];
                    for (int r = 0; r < rows; r++) idx[r] = rows - 1 - r;
                    for (int i = 0; i < rows * out; i++) got[i] = (float)(i % 5) - 1.5f;
                    struct cpu_mm m = {.w = *ws[v], .x = x, .ldx = in, .x_rows = idx, .y = got, .ldy = out,
                                       .y_rows = idx, .rows = rows, .accumulate = true};
                    int cuts[] = {0, out / 3, out / 3 + 1, out / 2 / 16 * 16, out};
                    for (int c = 1; c < 5; c++) // ascending, so that each output is done once
                        for (int e = c; e > 0 && cuts[e] < cuts[e - 1]; e--) {
                            int tmp = cuts[e];
                            cuts[e] = cuts[e - 1];
                            cuts[e - 1] = tmp;
                        }
                    if (cuts[3] > out) cuts[3] = out;
                    for (int c = 0; c + 1 < 5; c++)
                        if (cuts[c] < cuts[c + 1]) k->matmul(&m, cuts[c], cuts[c + 1], scratch);
                    for (int i = 0; i < rows * out; i++)
                        if (got[i] != ((float)(i % 5) - 1.5f) + want[i])
                            fail_msg("%s %s %s rows %d in %d out %d, gathered, split, accumulated: [%d] %.9g",
                                     kname, how, dtype_name(dts[d]), rows, in, out, i, got[i]);
                    // A slice of the outputs as a matrix of its own, on a block edge and off it.
                    const int s0[2] = {out > 16 ? 16 : 0, out > 1 ? 1 : 0};
                    for (int c = 0; c < 2; c++) {
                        struct cpu_wmat sl = cpu_wmat_slice(ws[v], s0[c], out - s0[c]);
                        float *ys = xmalloc((size_t)rows * sl.out * 4);
                        run_matmul(k, &sl, x, rows, ys, false);
                        for (int r = 0; r < rows; r++)
                            assert_memory_equal(ys + (size_t)r * sl.out, want + (size_t)r * out + s0[c],
                                                (size_t)sl.out * 4);
                        free(ys);
                    }
                }
                free(pk);
                free((void *)w.data);
                free(x);
                free(want);
                free(got);
                free(scratch);
            }
    if (!tested) fprintf(stderr, "note: no table here reads the packed layout; nothing to test\n");
}

// A matrix too big for the caches streams as stored for more rows than a
// small one does (avx512, avx2), or goes to the AMX tile unit in 16-row
// tiles (amx): each output is still the same whichever path, row count, row
// order or split of the outputs computes it (rows 1, 12, 16 one pass; 17,
// 24, 33 in blocks or tiles), and it matches the scalar reference. 4150
// outputs: groups of 64 end in a tail of 54.
static void big_matrix_outputs_do_not_depend_on_rows(void **state)
{
    (void)state;
    const int in = 512, out = 4150, maxr = 33; // 4150 x 512 bf16: a little over 4 MiB
    struct cpu_wmat w = {.data = random_weights(DTYPE_BF16, (size_t)out * in), .dtype = DTYPE_BF16, .out = out, .in = in};
    float *x = random_floats((size_t)maxr * in);
    float *ref = xmalloc((size_t)maxr * out * 4), *got = xmalloc((size_t)maxr * out * 4);
    float *scalar = xmalloc((size_t)maxr * out * 4);
    float *scratch = xmalloc(cpu_kernels_scratch_floats(in, 1, 1) * 4);
    run_matmul(cpu_kernels_scalar(), &w, x, maxr, scalar, false);
    for (int t = 0; t < n_simd; t++) {
        const char *name = simd_tables[t]->name;
        for (int r = 0; r < maxr; r++) run_matmul(simd_tables[t], &w, x + (size_t)r * in, 1, ref + (size_t)r * out, false);
        for (int i = 0; i < maxr * out; i++)
            if (fabs(ref[i] - scalar[i]) > 1e-6 * in + 1e-6 * fabs(scalar[i]))
                fail_msg("%s: [%d] %g vs scalar %g", name, i, ref[i], scalar[i]);
        const int rows[] = {8, 9, 12, 16, 17, 24, 33};
        for (int i = 0; i < 7; i++) {
            run_matmul(simd_tables[t], &w, x, rows[i], got, false);
            for (int r = 0; r < rows[i]; r++)
                if (memcmp(got + (size_t)r * out, ref + (size_t)r * out, (size_t)out * 4))
                    fail_msg("%s: row %d of a %d-row batch differs from the row alone", name, r, rows[i]);
        }
        // Rows gathered in reverse, outputs cut at odd points, accumulated
        // onto what y held: y + the row's outputs, exactly.
        int32_t idx[33];
        for (int r = 0; r < maxr; r++) idx[r] = maxr - 1 - r;
        for (int i = 0; i < maxr * out; i++) got[i] = (float)(i % 7) * 0.5f;
        struct cpu_mm m = {.w = w, .x = x, .ldx = in, .x_rows = idx, .y = got, .ldy = out, .y_rows = idx,
                           .rows = maxr, .accumulate = true};
        const int cuts[] = {0, 1, 63, 64, 1001, 4096, out};
        for (int c = 0; c + 1 < 7; c++) simd_tables[t]->matmul(&m, cuts[c], cuts[c + 1], scratch);
        for (int i = 0; i < maxr * out; i++)
            if (got[i] != (float)(i % 7) * 0.5f + ref[i])
                fail_msg("%s: accumulated, gathered and split, [%d] is %g, not %g + %g", name, i, got[i],
                         (float)(i % 7) * 0.5f, ref[i]);
    }
    free((void *)w.data);
    free(x);
    free(ref);
    free(got);
    free(scalar);
    free(scratch);
}

static void poison_kv(void *p, enum dtype dt, size_t i)
{
    if (dt == DTYPE_F32) ((float *)p)[i] = NAN;
    else ((uint16_t *)p)[i] = 0x7e00; // a quiet NaN in both bf16 and f16
}

static void fill_kv(void *p, enum dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)rnd() * 2.0f;
        if (dt == DTYPE_BF16) ((uint16_t *)p)[i] = ms_f32_to_bf16(v);
        else if (dt == DTYPE_F16) ((uint16_t *)p)[i] = ms_f32_to_f16(v);
        else ((float *)p)[i] = v;
    }
}

static void simd_attention_matches_scalar(void **state)
{
    (void)state;
    const enum dtype dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    // 8 heads a KV head (Qwen3-30B-A3B's): avx2 takes one token's as two groups of 4.
    const int groups[] = {1, 2, 4, 8}, dims[] = {16, 32, 36, 64, 130};
    // (first position, tokens in the tile): decode rows, tiles that start or
    // end inside a block, tiles spanning a block edge, a long context.
    const int tiles[][2] = {{0, 1}, {14, 1}, {15, 1}, {16, 1}, {0, 8}, {3, 7}, {10, 8}, {99, 2}, {290, 8}};
    const int n_blocks = 24, n_kv = 2;
    for (int t = 0; t < n_simd; t++)
        for (int d = 0; d < 3; d++)
            for (int gi = 0; gi < 4; gi++)
                for (int di = 0; di < 5; di++)
                    for (int ci = 0; ci < 9; ci++) {
                        int G = groups[gi], D = dims[di], first = tiles[ci][0], nq = tiles[ci][1];
                        size_t n = (size_t)n_blocks * n_kv * 16 * D;
                        void *k = xmalloc(n * dtype_size(dts[d])), *v = xmalloc(n * dtype_size(dts[d]));
                        fill_kv(k, dts[d], n);
                        fill_kv(v, dts[d], n);
                        int32_t blocks[24];
                        for (int b = 0; b < n_blocks; b++) blocks[b] = (b * 7 + 3) % n_blocks; // scattered
                        // Queries of 3 heads per token in the buffer, so strides are not G * D.
                        const size_t stride = (size_t)(G + 3) * D;
                        float *q = random_floats(nq * stride);
                        float *ref = xmalloc(nq * stride * 4), *got = xmalloc(nq * stride * 4);
                        float *one = xmalloc(stride * 4);
                        float *scratch = xmalloc(cpu_kernels_scratch_floats(1, G, D) * 4);
                        struct cpu_attn a = {.q = q, .q_stride = stride, .out_stride = stride,
                                             .n_tok = nq, .first_pos = first, .n_q = G,
                                             .head_dim = D, .scale = 1.0f / sqrtf((float)D),
                                             .blocks = blocks, .k = k, .v = v, .kv_dtype = dts[d],
                                             .n_kv_heads = n_kv, .kv_head = 1};
                        a.out = ref;
                        cpu_kernels_scalar()->attend(&a, scratch);
                        a.out = got;
                        simd_tables[t]->attend(&a, scratch);
                        for (int i = 0; i < nq; i++)
                            for (int e = 0; e < G * D; e++) {
                                float x = ref[i * stride + e], y = got[i * stride + e];
                                if (fabs(x - y) > 2e-5 * (1 + fabs(x)))
                                    fail_msg("%s attention %s G %d D %d tile at %d of %d: token %d "
                                             "[%d] %g vs scalar %g", simd_tables[t]->name,
                                             dtype_name(dts[d]), G, D, first, nq, i, e, y, x);
                            }
                        // Each row alone (a decode row at its position) gives the same bits;
                        // alone, a row of up to 4 heads scores two key blocks a pass in
                        // the avx512 table, and 8 heads go in two groups of 4 in avx2,
                        // where a tile of more rows takes one block at a time in
                        // full groups.
                        for (int i = 0; i < nq; i++) {
                            struct cpu_attn b1 = a;
                            b1.q = q + i * stride;
                            b1.out = one;
                            b1.n_tok = 1;
                            b1.first_pos = first + i;
                            simd_tables[t]->attend(&b1, scratch);
                            assert_memory_equal(one, got + i * stride, (size_t)G * D * 4);
                        }
                        // Whatever the last block holds past the context (NaN here)
                        // changes nothing: keys are (D, 16) per block, values (16, D).
                        const int end = first + nq;
                        for (int pos = end; pos % 16; pos++) {
                            const size_t at = ((size_t)blocks[pos / 16] * n_kv + 1) * 16 * D;
                            for (int e = 0; e < D; e++) {
                                poison_kv(k, dts[d], at + (size_t)e * 16 + pos % 16);
                                poison_kv(v, dts[d], at + (size_t)(pos % 16) * D + e);
                            }
                        }
                        a.out = one;
                        for (int i = 0; i < nq; i++) {
                            struct cpu_attn b1 = a;
                            b1.q = q + i * stride;
                            b1.n_tok = 1;
                            b1.first_pos = first + i;
                            simd_tables[t]->attend(&b1, scratch);
                            assert_memory_equal(one, got + i * stride, (size_t)G * D * 4);
                            cpu_kernels_scalar()->attend(&b1, scratch);
                            for (int e = 0; e < G * D; e++)
                                if (isnan(one[e])) fail_msg("scalar attention read past the context");
                        }
                        free(k);
                        free(v);
                        free(q);
                        free(ref);
                        free(got);
                        free(one);
                        free(scratch);
                    }
}

static void simd_silu_mul_matches_scalar_and_ignores_where_n_ends(void **state)
{
    (void)state;
    const int ns[] = {1, 7, 8, 9, 17, 100};
    for (int t = 0; t < n_simd; t++)
        for (int i = 0; i < 6; i++) {
            int n = ns[i];
            float *g = random_floats((size_t)n), *u = random_floats((size_t)n);
            for (int j = 0; j < n; j++) g[j] *= 30.0f; // far into both tails of the sigmoid
            float *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4), *one = xmalloc(4);
            memcpy(ref, g, (size_t)n * 4);
            memcpy(got, g, (size_t)n * 4);
            cpu_kernels_scalar()->silu_mul(ref, u, n);
            simd_tables[t]->silu_mul(got, u, n);
            for (int j = 0; j < n; j++) {
                if (fabs(ref[j] - got[j]) > 1e-6 * (1 + fabs(ref[j])))
                    fail_msg("%s silu_mul n %d [%d]: %g vs scalar %g", simd_tables[t]->name, n, j,
                             got[j], ref[j]);
                one[0] = g[j];
                simd_tables[t]->silu_mul(one, u + j, 1);
                assert_memory_equal(one, got + j, 4);
            }
            free(g);
            free(u);
            free(ref);
            free(got);
            free(one);
        }
}

// The sampler's softmax pass: every SIMD table against the scalar one (and
// expf) over a vocabulary-sized row with masked (-inf) entries, long enough
// to cross the fp32 partial-sum blocks, and at tails of every length.
static void simd_exp_sum_matches_scalar_and_zeroes_masked_entries(void **state)
{
    (void)state;
    const int ns[] = {1, 5, 16, 17, 1023, 1025, 4099, 151936};
    for (int t = 0; t < n_simd; t++)
        for (int i = 0; i < 8; i++) {
            int n = ns[i];
            float *x = random_floats((size_t)n);
            for (int j = 0; j < n; j++) x[j] = j % 13 == 3 ? -INFINITY : x[j] * 40.0f;
            float *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
            const float shift = 35.0f;
            const int nb = CPU_EXP_BLOCKS(n);
            double *bref = xmalloc((size_t)nb * sizeof(double)), *bgot = xmalloc((size_t)nb * sizeof(double));
            double sref = cpu_kernels_scalar()->exp_sum(x, shift, ref, n, bref);
            double sgot = simd_tables[t]->exp_sum(x, shift, got, n, bgot);
            assert_true(simd_tables[t]->exp_sum(x, shift, got, n, NULL) == sgot);
            for (int b = 0; b < nb; b++) {
                double direct_b = 0;
                for (int j = b * CPU_EXP_BLOCK; j < n && j < (b + 1) * CPU_EXP_BLOCK; j++) direct_b += got[j];
                if (fabs(bgot[b] - direct_b) > 1e-6 * direct_b || fabs(bref[b] - bgot[b]) > 2e-6 * direct_b)
                    fail_msg("%s exp_sum n %d block %d: %.9g, scalar %.9g, direct %.9g",
                             simd_tables[t]->name, n, b, bgot[b], bref[b], direct_b);
            }
            free(bref);
            free(bgot);
            double direct = 0;
            for (int j = 0; j < n; j++) {
                if (x[j] == -INFINITY) {
                    if (got[j] != 0.0f || ref[j] != 0.0f)
                        fail_msg("%s exp_sum n %d [%d]: masked entry gave %g", simd_tables[t]->name, n,
                                 j, got[j]);
                    continue;
                }
                double e = exp((double)(x[j] - shift)); // the argument rounded as the kernels round it
                direct += e;
                if (fabs(got[j] - e) > 4e-7 * e + 1e-37 || fabs(ref[j] - e) > 4e-7 * e + 1e-37)
                    fail_msg("%s exp_sum n %d [%d]: %g, scalar %g, exp %g", simd_tables[t]->name, n, j,
                             got[j], ref[j], e);
            }
            if (fabs(sgot - direct) > 1e-6 * direct || fabs(sref - direct) > 1e-6 * direct)
                fail_msg("%s exp_sum n %d: sum %.9g, scalar %.9g, direct %.9g", simd_tables[t]->name, n,
                         sgot, sref, direct);
            free(x);
            free(ref);
            free(got);
        }
}

// The sampler's scale pass: NaN becomes -inf, the rest is scaled, and the
// returned maximum is the largest scaled value, at every tail length.
static void simd_scale_max_matches_scalar_and_clears_nan(void **state)
{
    (void)state;
    const int ns[] = {1, 7, 16, 17, 33, 151936};
    for (int t = 0; t < n_simd; t++)
        for (int i = 0; i < 6; i++) {
            int n = ns[i];
            float *a = random_floats((size_t)n), *b = xmalloc((size_t)n * 4);
            for (int j = 0; j < n; j++) a[j] = j % 11 == 5 ? NAN : j % 17 == 2 ? -INFINITY : a[j] * 9;
            memcpy(b, a, (size_t)n * 4);
            float mref = cpu_kernels_scalar()->scale_max(a, 1.0f / 0.7f, n);
            float mgot = simd_tables[t]->scale_max(b, 1.0f / 0.7f, n);
            assert_memory_equal(a, b, (size_t)n * 4);
            if (mref != mgot) fail_msg("%s scale_max n %d: %g vs scalar %g", simd_tables[t]->name, n, mgot, mref);
            float want = -INFINITY;
            for (int j = 0; j < n; j++) {
                assert_false(isnan(b[j]));
                want = b[j] > want ? b[j] : want;
            }
            assert_true(mgot == want);
            free(a);
            free(b);
        }
}

static void simd_rmsnorm_and_axpy_match_scalar(void **state)
{
    (void)state;
    const int ns[] = {1, 7, 16, 33, 96, 130, 2048};
    const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (int t = 0; t < n_simd; t++)
        for (int i = 0; i < 7; i++)
            for (int d = 0; d < 3; d++) {
                int n = ns[i];
                float *x = random_floats((size_t)n), *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
                void *w = random_weights(dts[d], (size_t)n);
                cpu_kernels_scalar()->rmsnorm(x, w, dts[d], n, 1e-6f, ref);
                simd_tables[t]->rmsnorm(x, w, dts[d], n, 1e-6f, got);
                for (int j = 0; j < n; j++)
                    if (fabs(ref[j] - got[j]) > 1e-5 * (1 + fabs(ref[j])))
                        fail_msg("%s rmsnorm %s n %d [%d]: %g vs scalar %g", simd_tables[t]->name,
                                 dtype_name(dts[d]), n, j, got[j], ref[j]);
                float *y1 = random_floats((size_t)n), *y2 = xmalloc((size_t)n * 4);
                memcpy(y2, y1, (size_t)n * 4);
                cpu_kernels_scalar()->axpy(y1, 0.37f, x, n);
                simd_tables[t]->axpy(y2, 0.37f, x, n);
                assert_memory_equal(y1, y2, (size_t)n * 4); // one FMA per element: exact
                free(x);
                free(ref);
                free(got);
                free(w);
                free(y1);
                free(y2);
            }
}

// Every table rotates a head as the scalar one does, bit for bit (each
// product rounded on its own), out of place and in place, tails included.
static void simd_rope_matches_scalar_bit_for_bit(void **state)
{
    (void)state;
    const int halves[] = {1, 4, 7, 8, 16, 24, 32, 64, 65};
    for (int t = 0; t < n_simd; t++)
        for (int i = 0; i < 9; i++) {
            const int half = halves[i];
            float *x = random_floats((size_t)2 * half), *c = random_floats((size_t)half);
            float *s = random_floats((size_t)half), *ref = xmalloc((size_t)8 * half);
            float *got = xmalloc((size_t)8 * half), *inplace = xmalloc((size_t)8 * half);
            cpu_kernels_scalar()->rope(ref, x, half, c, s);
            simd_tables[t]->rope(got, x, half, c, s);
            if (memcmp(ref, got, (size_t)8 * half) != 0)
                fail_msg("%s rope half %d differs from the scalar table", simd_tables[t]->name, half);
            memcpy(inplace, x, (size_t)8 * half);
            simd_tables[t]->rope(inplace, inplace, half, c, s);
            assert_memory_equal(ref, inplace, (size_t)8 * half);
            free(x);
            free(c);
            free(s);
            free(ref);
            free(got);
            free(inplace);
        }
}

struct pool_ctx {
    _Atomic long sum;
    int n;
};

static void pool_work(void *arg, int tid, int n_threads)
{
    struct pool_ctx *c = arg;
    int b, e;
    threadpool_range(c->n, tid, n_threads, &b, &e);
    long s = 0;
    for (int i = b; i < e; i++) s += i;
    atomic_fetch_add(&c->sum, s);
}

static void threadpool_runs_every_range_exactly_once(void **state)
{
    (void)state;
    const int sizes[] = {1, 2, 3, 5};
    for (int s = 0; s < 4; s++) {
        struct threadpool *p;
        char err[256];
        assert_int_equal(threadpool_create(sizes[s], &p, err, sizeof err), 0);
        assert_int_equal(threadpool_size(p), sizes[s]);
        for (int rep = 0; rep < 2000; rep++) {
            struct pool_ctx c = {.n = rep % 37};
            threadpool_run(p, pool_work, &c);
            assert_int_equal(atomic_load(&c.sum), (long)c.n * (c.n - 1) / 2);
        }
        threadpool_destroy(p);
    }
    struct threadpool *p;
    char err[256];
    assert_int_equal(threadpool_create(-1, &p, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "threads"));
    assert_int_equal(threadpool_create(0, &p, err, sizeof err), 0);
    assert_int_equal(threadpool_size(p), ms_cpu_count());
    threadpool_destroy(p);
}

// A shared run: pieces from a counter, each marked by the thread that took
// it; a thread inside fn twice at once would show as a tid seen busy.
struct shared_ctx {
    _Atomic int next;
    int n;
    _Atomic int taken[64];
    _Atomic int busy[8];
    _Atomic int clash;
};

static void shared_work(void *arg, int tid, int n_threads)
{
    struct shared_ctx *c = arg;
    if (tid < 0 || tid >= n_threads || n_threads > 8) { // no cmocka asserts off the main thread
        atomic_store(&c->clash, 1);
        return;
    }
    if (atomic_fetch_add(&c->busy[tid], 1) != 0) atomic_store(&c->clash, 1);
    for (int i; (i = atomic_fetch_add(&c->next, 1)) < c->n;) atomic_fetch_add(&c->taken[i], 1);
    atomic_fetch_sub(&c->busy[tid], 1);
}

// Shared runs interleaved with full ones: every piece exactly once, by one
// thread at a time per tid, and the full runs still run on every thread
// (a worker left behind by a shared run must not run it later, nor miss
// the next full run).
static void threadpool_shared_runs_take_every_piece_once(void **state)
{
    (void)state;
    const int sizes[] = {1, 2, 3, 5};
    for (int s = 0; s < 4; s++) {
        struct threadpool *p;
        char err[256];
        assert_int_equal(threadpool_create(sizes[s], &p, err, sizeof err), 0);
        for (int rep = 0; rep < 3000; rep++) {
            struct shared_ctx c = {.n = rep % 65};
            threadpool_run_shared(p, shared_work, &c);
            for (int i = 0; i < 64; i++) assert_int_equal(atomic_load(&c.taken[i]), i < c.n ? 1 : 0);
            assert_int_equal(atomic_load(&c.clash), 0);
            if (rep % 3 == 0) {
                struct pool_ctx f = {.n = rep % 37};
                threadpool_run(p, pool_work, &f);
                assert_int_equal(atomic_load(&f.sum), (long)f.n * (f.n - 1) / 2);
            }
        }
        threadpool_destroy(p);
    }
}

// cpu_matmul over several jobs gives the same bits on any pool: one thread,
// two and three (each walks its run of pieces, then takes the others'
// last ones), and more threads than own runs (MM_MAX_OWNERS: the rest only
// take from the owners' runs). The first job is large enough to be split
// (a call below the threshold runs on the caller alone) and accumulates
// into y: a piece run twice, or never, leaves other sums than one run.
static void threaded_matmul_matches_single_thread(void **state)
{
    (void)state;
    const struct cpu_kernels *k = cpu_kernels_best();
    enum { O1 = 4096, K = 512, R = 40 };
    struct cpu_wmat w1 = {.data = random_weights(DTYPE_BF16, O1 * K), .dtype = DTYPE_BF16, .out = O1, .in = K};
    struct cpu_wmat w2 = {.data = random_weights(DTYPE_BF16, 5 * K), .dtype = DTYPE_BF16, .out = 5, .in = K};
    float *x = random_floats(R * K);
    const int sizes[] = {1, 2, 3, 70};
    float *y[4][2];
    for (int n = 0; n < 4; n++) {
        struct threadpool *p;
        char err[128];
        assert_int_equal(threadpool_create(sizes[n], &p, err, sizeof err), 0);
        size_t stride = cpu_kernels_scratch_floats(K, 1, 1);
        struct cpu_exec e = {.pool = p, .k = k, .scratch = xmalloc((size_t)sizes[n] * stride * 4),
                             .scratch_stride = stride};
        y[n][0] = xmalloc(R * O1 * 4);
        y[n][1] = xmalloc(2 * 5 * 4);
        for (int i = 0; i < R * O1; i++) y[n][0][i] = 0.25f * (float)(i % 7);
        struct cpu_mm jobs[3] = {
            {.w = w1, .x = x, .ldx = K, .y = y[n][0], .ldy = O1, .rows = R, .accumulate = true},
            {.w = w2, .x = x, .ldx = K, .y = y[n][1], .ldy = 5, .rows = 2},
            {.w = w2, .x = x, .ldx = K, .y = y[n][1], .ldy = 5, .rows = 0},
        };
        for (int rep = 0; rep < 3; rep++) cpu_matmul(&e, jobs, 3); // the runs dealt afresh each call
        if (n > 0) {
            assert_memory_equal(y[0][0], y[n][0], R * O1 * 4);
            assert_memory_equal(y[0][1], y[n][1], 2 * 5 * 4);
        }
        free(e.scratch);
        threadpool_destroy(p);
    }
    for (int n = 0; n < 4; n++) {
        free(y[n][0]);
        free(y[n][1]);
    }
    free((void *)w1.data);
    free((void *)w2.data);
    free(x);
}

static void rmsnorm_scales_by_root_mean_square(void **state)
{
    (void)state;
    float x[5] = {1, -2, 3, -4, 5}, out[5];
    uint16_t w[5];
    for (int i = 0; i < 5; i++) w[i] = ms_f32_to_bf16(0.5f * (float)(i + 1));
    cpu_rmsnorm(x, w, DTYPE_BF16, 5, 1e-6f, out);
    double rms = sqrt((1 + 4 + 9 + 16 + 25) / 5.0 + 1e-6);
    for (int i = 0; i < 5; i++) assert_float_equal(out[i], x[i] / rms * 0.5 * (i + 1), 1e-6);
}

static void rope_rotates_pairs_half_a_head_apart(void **state)
{
    (void)state;
    const int D = 8, half = 4;
    double inv[4];
    for (int i = 0; i < half; i++) inv[i] = pow(10000.0, -2.0 * i / D);
    float x[8], c[4], s[4];
    for (int i = 0; i < D; i++) x[i] = (float)(i + 1);
    cpu_rope_angles(7, inv, half, c, s);
    cpu_kernels_scalar()->rope(x, x, half, c, s);
    for (int i = 0; i < half; i++) {
        double a = 7 * inv[i], x0 = i + 1, x1 = i + 1 + half;
        assert_float_equal(x[i], x0 * cos(a) - x1 * sin(a), 1e-5);
        assert_float_equal(x[i + half], x1 * cos(a) + x0 * sin(a), 1e-5);
    }
    // Position 0 is the identity.
    float y[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y0[8];
    memcpy(y0, y, sizeof y);
    cpu_rope_angles(0, inv, half, c, s);
    cpu_kernels_scalar()->rope(y, y, half, c, s);
    assert_memory_equal(y, y0, sizeof y);
}

static void router_picks_top_k_lowest_index_on_ties(void **state)
{
    (void)state;
    const float logits[6] = {1.0f, 3.0f, 2.0f, 3.0f, NAN, 2.0f};
    int32_t ids[4];
    float w[4];
    cpu_router_topk(logits, 6, 4, true, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 2);
    assert_int_equal(ids[3], 5);
    double e3 = exp(0.0), e2 = exp(-1.0), sum = 2 * e3 + 2 * e2;
    assert_float_equal(w[0], e3 / sum, 1e-6);
    assert_float_equal(w[2], e2 / sum, 1e-6);
    // Without renormalisation the weights are the softmax over all (finite) experts.
    cpu_router_topk(logits, 6, 2, false, ids, w);
    double all = exp(-2.0) + 2 * e3 + 2 * e2;
    assert_float_equal(w[0], e3 / all, 1e-6);
    assert_float_equal(w[1], e3 / all, 1e-6);
    // Against a sort of all n by (value descending, index ascending), on
    // logits with many ties, NaNs and infinities, k from 1 to n.
    uint64_t seed = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        const int n = 1 + trial % 70, k = 1 + trial / 7 % n;
        float l[70];
        int32_t order[70], got[70];
        float wg[70];
        for (int i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const int r = (int)(seed >> 58); // 0..63: a few values, so ties
            l[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 ? INFINITY : (float)(r % 9) * 0.5f - 2.0f;
            order[i] = i;
        }
        for (int a = 1; a < n; a++) // insertion sort, stable: ties keep the lower index first
            for (int b = a; b > 0; b--) {
                const float vb = isnan(l[order[b]]) ? -INFINITY : l[order[b]];
                const float va = isnan(l[order[b - 1]]) ? -INFINITY : l[order[b - 1]];
                if (!(vb > va)) break;
                const int32_t t = order[b];
                order[b] = order[b - 1];
                order[b - 1] = t;
            }
        cpu_router_topk(l, n, k, trial % 2, got, wg);
        for (int j = 0; j < k; j++)
            if (got[j] != order[j]) fail_msg("n %d k %d: pick %d is %d, the sort's %d", n, k, j, got[j], order[j]);
    }
    // k past n: nothing picked.
    cpu_router_topk(logits, 2, 3, true, ids, w);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(ids[j], -1);
        assert_float_equal(w[j], 0.0f, 0.0);
    }
}

// ---- the bf16-activation table (avx512_bf16) --------------------------------------------

// Shapes for it: one row to 70, K odd and even (pairs with a zero above),
// 7 to 16 rows over 64 blocks or more (the tall tile), a block bigger than
// a 256 KiB chunk.
static const int bf16_shapes[][3] = {
    {1, 1, 1}, {2, 7, 5}, {6, 33, 16}, {7, 77, 17}, {13, 96, 45}, {16, 512, 300}, {33, 130, 70},
    {5, 2, 64}, {1, 512, 1000}, {16, 77, 1030}, {9, 64, 1024}, {7, 3, 1040}, {12, 512, 2100},
    {70, 512, 70}, {40, 1024, 600}, {3, 9216, 20}, {64, 384, 100}, {8, 131, 770},
};

static float *bf16_rounded(const float *x, size_t n)
{
    float *r = xmalloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++) r[i] = ms_bf16_to_f32(ms_f32_to_bf16(x[i]));
    return r;
}

// avx512_bf16's paths: VDPBF16PS, FMAs in its order, and the tile unit
// (NULL where it is not usable).
#define BF16_PATHS 3
static const struct cpu_kernels *bf16_path(int path)
{
    return path == 2 ? cpu_kernels_avx512_bf16_tiles() : cpu_kernels_avx512_bf16_path(path == 1);
}

// Against the scalar fp32 matmul: with x rounded to bf16 first, the same
// within fp32 rounding (the tolerance every fp32 table meets); with x as it
// is, within the stated 2^-8 * sum |w x| — and further off than fp32
// rounding somewhere, or this test could not tell the modes apart.
static void bf16_matmul_is_fp32_over_bf16_activations(void **state)
{
    (void)state;
    if (!bf16_table) skip();
    for (int path = 0; path < BF16_PATHS; path++) {
        const struct cpu_kernels *bf16_table = bf16_path(path);
        if (!bf16_table) continue;
        assert_true(bf16_table->bf16_activations);
        assert_false(cpu_kernels_avx512()->bf16_activations);
        int rounded_apart = 0;
        for (size_t si = 0; si < sizeof bf16_shapes / sizeof bf16_shapes[0]; si++)
            for (int packed = 0; packed < 2; packed++) {
                const int rows = bf16_shapes[si][0], in = bf16_shapes[si][1], out = bf16_shapes[si][2];
                struct cpu_wmat w = {.data = random_weights(DTYPE_BF16, (size_t)out * in), .dtype = DTYPE_BF16,
                                     .out = out, .in = in};
                void *pk = NULL;
                if (packed) {
                    pk = xmalloc(cpu_pack_bytes(&w));
                    cpu_pack_blocks(&w, 0, (out + 15) / 16, pk);
                    w.packed = pk;
                }
                float *x = random_floats((size_t)rows * in), *xr = bf16_rounded(x, (size_t)rows * in);
                float *ref = xmalloc((size_t)rows * out * 4), *refr = xmalloc((size_t)rows * out * 4);
                float *got = xmalloc((size_t)rows * out * 4);
                run_matmul(cpu_kernels_scalar(), &w, x, rows, ref, false);
                run_matmul(cpu_kernels_scalar(), &w, xr, rows, refr, false);
                run_matmul(bf16_table, &w, x, rows, got, false);
                for (int r = 0; r < rows; r++)
                    for (int o = 0; o < out; o++) {
                        const size_t i = (size_t)r * out + o;
                        double mag = 0;
                        for (int k = 0; k < in; k++)
                            mag += fabs((double)x[(size_t)r * in + k] *
                                        cpu_load_weight(w.data, DTYPE_BF16, (size_t)o * in + k));
                        const double fp32_tol = 1e-6 * in + 1e-6 * fabs(refr[i]);
                        if (fabs(got[i] - refr[i]) > fp32_tol)
                            fail_msg("rows %d in %d out %d %s: [%d][%d] %.9g, fp32 over bf16 x gives %.9g", rows,
                                     in, out, packed ? "packed" : "as stored", r, o, got[i], refr[i]);
                        if (fabs(got[i] - ref[i]) > 0x1p-8 * mag + 1e-7)
                            fail_msg("rows %d in %d out %d: [%d][%d] %.9g is further than 2^-8 * %.6g from the "
                                     "fp32 reference %.9g", rows, in, out, r, o, got[i], mag, ref[i]);
                        if (fabs(got[i] - ref[i]) > 1e-6 * in + 1e-6 * fabs(ref[i])) rounded_apart++;
                    }
                free(pk);
                free((void *)w.data);
                free(x);
                free(xr);
                free(ref);
                free(refr);
                free(got);
            }
        assert_true(rounded_apart > 0);
    }
}

// Only bf16 weights take bf16 activations: f16, f32 and the quantized
// matrices no path of the table takes (int8 of an odd number of inputs:
// VDPBF16PS pairs them) give exactly the avx512 table's outputs.
static void bf16_table_leaves_other_weights_to_avx512(void **state)
{
    (void)state;
    if (!bf16_table) skip();
    for (int path = 0; path < BF16_PATHS; path++) {
        const struct cpu_kernels *bf16_table = bf16_path(path);
        if (!bf16_table) continue;
        const struct cpu_kernels *ref = cpu_kernels_avx512();
        const enum dtype dts[] = {DTYPE_F16, DTYPE_F32};
        for (int d = 0; d < 3; d++) {
            const int rows = 9, in = d < 2 ? 96 : 95, out = 70;
            struct qmat q;
            struct cpu_wmat w;
            if (d < 2) {
                w = (struct cpu_wmat){.data = random_weights(dts[d], (size_t)out * in), .dtype = dts[d], .out = out,
                                      .in = in};
            } else {
                qmat_make(&q, QUANT_INT8, out, in, 0);
                w = q.w;
                assert_false(cpu_kernels_amx_takes_quant(&w));
                assert_false(bf16_table->wants_xq && bf16_table->wants_xq(&(struct cpu_mm){.w = w}));
            }
            float *x = random_floats((size_t)rows * in);
            float *a = xmalloc((size_t)rows * out * 4), *b = xmalloc((size_t)rows * out * 4);
            run_matmul(ref, &w, x, rows, a, false);
            run_matmul(bf16_table, &w, x, rows, b, false);
            assert_memory_equal(a, b, (size_t)rows * out * 4);
            if (d < 2) free((void *)w.data);
            else qmat_free(&q);
            free(x);
            free(a);
            free(b);
        }
    }
}

// A bf16-activation table's matmul of x (rows, w->in) with the rows rounded
// by the caller (round_xq, as cpu_matmul does), outputs [0, split) and then
// [split, out) into y (rows, w->out).
static void run_matmul_rounded_rows(const struct cpu_kernels *k, const struct cpu_wmat *w, const float *x,
                                    int rows, float *y, int split)
{
    const int in = w->in, np = (in + 1) / 2;
    uint32_t *xq = xmalloc((size_t)rows * np * 4);
    for (int r = 0; r < rows; r++) k->round_xq(x + (size_t)r * in, in, xq + (size_t)r * np);
    float *scratch = xmalloc(cpu_kernels_scratch_floats(in, 1, 1) * 4);
    struct cpu_mm m = {.w = *w, .x = x, .ldx = (size_t)in, .y = y, .ldy = (size_t)w->out, .rows = rows,
                       .xq = xq, .ldxq = (size_t)np};
    k->matmul(&m, 0, split, scratch);
    k->matmul(&m, split, w->out, scratch);
    free(xq);
    free(scratch);
}

// got (rows, q's out), from x (rows, q's in), against ref, the fp32 matmul
// on q's dequantized weights: each within 2^-8 * sum_k |w_k x_k| of it (the
// bf16-activation tables' bound, kernels_avx512bf16.c). Returns how many
// are further from it than fp32 rounding would put them.
static int quant_within_bf16_bound(const struct qmat *q, const float *x, int rows, const float *got,
                                   const float *ref)
{
    const int in = q->r.cols, out = q->r.n;
    int apart = 0;
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double mag = 0;
            for (int kk = 0; kk < in; kk++) mag += fabs((double)x[(size_t)r * in + kk] * quant_rows_value(&q->r, o, kk));
            const size_t i = (size_t)r * out + o;
            if (fabs(got[i] - ref[i]) > 0x1p-8 * mag + 1e-6)
                fail_msg("%s rows %d in %d out %d group %d: [%d][%d] %.9g is further than 2^-8 * %.6g from the "
                         "fp32 reference %.9g", quant_format_name(q->r.format), rows, in, out, q->r.group, r, o,
                         got[i], mag, ref[i]);
            if (fabs(got[i] - ref[i]) > 1e-5 * mag + 1e-6) apart++;
        }
    return apart;
}

// Where the tile unit is usable, the avx512_bf16 table's tile path takes
// the quantized matrices amx takes, over the same rounded x as its bf16 ones:
// within 2^-8 * sum |w x| of the fp32 matmul on the dequantized weights,
// the same bits from rows the caller rounded (m->xq) as from rows it
// rounds itself, and further from fp32 than fp32 rounding somewhere (or
// the rows were not rounded). An int4 matrix it does not take (264
// inputs), and an int8 one (it takes none), give the bits of the table's
// path below the tiles (the FMA path's: avx512's; or the VDPBF16PS
// path's own).
static void bf16_tile_path_takes_quantized_weights_over_rounded_rows(void **state)
{
    (void)state;
    const struct cpu_kernels *k = cpu_kernels_avx512_bf16_tiles();
    if (!k) skip();
    const int shapes_q[][5] = {{QUANT_INT4, 1, 2048, 96, 128}, {QUANT_INT4, 70, 320, 83, 128},
                               {QUANT_INT4, 9, 256, 64, 256},  {QUANT_INT4, 16, 96, 40, 32},
                               {QUANT_FP8, 1, 2048, 96, 128},  {QUANT_FP8, 70, 320, 83, 128},
                               {QUANT_FP8, 9, 256, 64, 256},   {QUANT_FP8, 16, 96, 40, 32}};
    int rounded_apart = 0;
    for (size_t c = 0; c < sizeof shapes_q / sizeof shapes_q[0]; c++) {
        const int rows = shapes_q[c][1], in = shapes_q[c][2], out = shapes_q[c][3];
        struct qmat q;
        qmat_make(&q, (enum quant_format)shapes_q[c][0], out, in, shapes_q[c][4]);
        assert_true(cpu_kernels_amx_takes_quant(&q.w));
        assert_true(k->wants_xq(&(struct cpu_mm){.w = q.w}));
        float *x = random_floats((size_t)rows * in), *ref = xmalloc((size_t)rows * out * 4);
        float *got = xmalloc((size_t)rows * out * 4), *viaq = xmalloc((size_t)rows * out * 4);
        run_matmul(cpu_kernels_scalar(), &q.w, x, rows, ref, false);
        run_matmul(k, &q.w, x, rows, got, false);
        run_matmul_rounded_rows(k, &q.w, x, rows, viaq, out);
        assert_memory_equal(viaq, got, (size_t)rows * out * 4);
        rounded_apart += quant_within_bf16_bound(&q, x, rows, got, ref);
        free(x);
        free(ref);
        free(got);
        free(viaq);
        qmat_free(&q);
    }
    assert_true(rounded_apart > 0);
    for (int c = 0; c < 2; c++) {
        struct qmat q;
        qmat_make(&q, c ? QUANT_INT8 : QUANT_INT4, 70, c ? 256 : 264, 128);
        assert_false(cpu_kernels_amx_takes_quant(&q.w));
        const int in = q.w.in;
        float *x = random_floats((size_t)9 * in), *a = xmalloc((size_t)9 * 70 * 4), *b = xmalloc((size_t)9 * 70 * 4);
        run_matmul(k, &q.w, x, 9, b, false);
        run_matmul(cpu_kernels_avx512(), &q.w, x, 9, a, false);
        if (memcmp(a, b, (size_t)9 * 70 * 4)) run_matmul(cpu_kernels_avx512_bf16_path(false), &q.w, x, 9, a, false);
        assert_memory_equal(a, b, (size_t)9 * 70 * 4);
        free(x);
        free(a);
        free(b);
        qmat_free(&q);
    }
}

// On its VDPBF16PS path the table multiplies int4, fp8 and int8 matrices
// by the rounded rows too (kernels_avx512bf16.c: each int4 code as 16 + q
// in bf16, the 16 taken out with the zero point; each fp8 and int8 code as
// the bf16 of its value, every code of the formats, fp8's subnormals and
// signs among them): within 2^-8 * sum |w x| of the fp32 matmul on the
// dequantized weights, and further from it than fp32 rounding somewhere
// (each format); the same bits from rows the caller rounded as from rows
// it rounds itself; each row the bits it has alone, whatever the batch,
// and an output range split inside a block the bits of the whole;
// accumulating adds the same values. Groups of 32 to 256, a last group
// shorter (264 and 320 inputs), one group a row, inputs not a multiple of
// 8; 1 to 330 rows (one-row tiles, 4-row blocks, several chunks of blocks;
// int4's rows prepared once a call, and once a chunk where 330 rows of 2048
// inputs overflow the scratch; the byte formats' pairs made in registers
// and, for two row blocks or more, once a chunk). The FMA path leaves all
// three to the avx512 table, and so does this path an fp8 or int8 matrix
// of an odd number of inputs.
static void bf16_dp_path_takes_quantized_weights_over_rounded_rows(void **state)
{
    (void)state;
    if (!bf16_table) skip();
    const struct cpu_kernels *k = cpu_kernels_avx512_bf16_path(false);
    // rows, in, out, group
    const int shapes_q[][4] = {{1, 2048, 96, 128}, {70, 320, 83, 128}, {9, 256, 600, 256}, {16, 96, 40, 32},
                               {5, 264, 70, 128},  {3, 36, 20, 0},     {2, 1000, 300, 40}, {17, 2048, 200, 128},
                               {330, 2048, 40, 128}};
    const enum quant_format fs[] = {QUANT_INT4, QUANT_FP8, QUANT_INT8};
    const size_t n_shapes = sizeof shapes_q / sizeof shapes_q[0];
    int rounded_apart[3] = {0};
    for (size_t c = 0; c < 3 * n_shapes; c++) {
        const size_t si = c % n_shapes;
        const enum quant_format f = fs[c / n_shapes];
        const int rows = shapes_q[si][0], in = shapes_q[si][1], out = shapes_q[si][2];
        struct qmat q;
        qmat_make(&q, f, out, in, shapes_q[si][3]);
        assert_true(k->wants_xq(&(struct cpu_mm){.w = q.w}));
        float *x = random_floats((size_t)rows * in), *ref = xmalloc((size_t)rows * out * 4);
        float *got = xmalloc((size_t)rows * out * 4), *other = xmalloc((size_t)rows * out * 4);
        run_matmul(cpu_kernels_scalar(), &q.w, x, rows, ref, false);
        run_matmul(k, &q.w, x, rows, got, false);
        // Rows rounded by the caller, the outputs in two ranges split inside a block.
        run_matmul_rounded_rows(k, &q.w, x, rows, other, out / 2 + 5);
        assert_memory_equal(other, got, (size_t)rows * out * 4);
        // Each row alone.
        for (int r = 0; r < rows; r++) {
            run_matmul(k, &q.w, x + (size_t)r * in, 1, other, false);
            if (memcmp(other, got + (size_t)r * out, (size_t)out * 4))
                fail_msg("in %d out %d: row %d of %d differs alone", in, out, r, rows);
        }
        // Accumulating: y + the same products.
        for (int i = 0; i < rows * out; i++) other[i] = (float)i * 0.25f;
        run_matmul(k, &q.w, x, rows, other, true);
        for (int i = 0; i < rows * out; i++) assert_true(other[i] == (float)i * 0.25f + got[i]);
        assert_false(cpu_kernels_avx512_bf16_path(true)->wants_xq);
        run_matmul(cpu_kernels_avx512_bf16_path(true), &q.w, x, rows, other, false);
        run_matmul(cpu_kernels_avx512(), &q.w, x, rows, ref, false);
        assert_memory_equal(other, ref, (size_t)rows * out * 4);
        run_matmul(cpu_kernels_scalar(), &q.w, x, rows, ref, false);
        rounded_apart[c / n_shapes] += quant_within_bf16_bound(&q, x, rows, got, ref);
        free(x);
        free(ref);
        free(got);
        free(other);
        qmat_free(&q);
    }
    for (int fi = 0; fi < 3; fi++)
        if (rounded_apart[fi] == 0)
            fail_msg("%s: no output further from fp32 than its rounding", quant_format_name(fs[fi]));
    for (int fi = 1; fi < 3; fi++) { // the byte formats, fp8 and int8: 37 inputs are not pairs
        struct qmat q;
        qmat_make(&q, fs[fi], 40, 37, 0);
        float *x = random_floats((size_t)3 * 37), *a = xmalloc((size_t)3 * 40 * 4), *b = xmalloc((size_t)3 * 40 * 4);
        assert_false(k->wants_xq(&(struct cpu_mm){.w = q.w}));
        run_matmul(cpu_kernels_avx512(), &q.w, x, 3, a, false);
        run_matmul(k, &q.w, x, 3, b, false);
        assert_memory_equal(a, b, (size_t)3 * 40 * 4);
        free(x);
        free(a);
        free(b);
        qmat_free(&q);
    }
}

// The table's two paths (VDPBF16PS, and FMAs in its order where it runs at
// half rate) give every output the same value, so the path a CPU's timing
// picks changes where the time goes, never a result; and the table by name
// is one of them, or, where the tile unit is usable, its tile path.
static void bf16_paths_give_the_same_results(void **state)
{
    (void)state;
    if (!bf16_table) skip();
    const struct cpu_kernels *dp = cpu_kernels_avx512_bf16_path(false), *fma = cpu_kernels_avx512_bf16_path(true);
    const struct cpu_kernels *tiles = cpu_kernels_avx512_bf16_tiles();
    if (tiles) assert_ptr_equal(bf16_table->matmul, tiles->matmul);
    else assert_true(bf16_table->matmul == dp->matmul || bf16_table->matmul == fma->matmul);
    assert_true(dp->matmul != fma->matmul);
    for (size_t si = 0; si < sizeof bf16_shapes / sizeof bf16_shapes[0]; si++)
        for (int packed = 0; packed < 2; packed++) {
            const int rows = bf16_shapes[si][0], in = bf16_shapes[si][1], out = bf16_shapes[si][2];
            struct cpu_wmat w = {.data = random_weights(DTYPE_BF16, (size_t)out * in), .dtype = DTYPE_BF16,
                                 .out = out, .in = in};
            void *pk = NULL;
            if (packed) {
                pk = xmalloc(cpu_pack_bytes(&w));
                cpu_pack_blocks(&w, 0, (out + 15) / 16, pk);
                w.packed = pk;
            }
            float *x = random_floats((size_t)rows * in);
            float *a = xmalloc((size_t)rows * out * 4), *b = xmalloc((size_t)rows * out * 4);
            run_matmul(dp, &w, x, rows, a, false);
            run_matmul(fma, &w, x, rows, b, false);
            for (int i = 0; i < rows * out; i++)
                if (a[i] != b[i])
                    fail_msg("rows %d in %d out %d %s: [%d] VDPBF16PS %.9g, FMAs in its order %.9g", rows, in, out,
                             packed ? "packed" : "as stored", i, a[i], b[i]);
            free(pk);
            free((void *)w.data);
            free(x);
            free(a);
            free(b);
        }
}

// A bf16 matrix (out, in), packed at load when `packed`; free with wmat_free.
static struct cpu_wmat bf16_wmat(int out, int in, bool packed)
{
    struct cpu_wmat w = {.data = random_weights(DTYPE_BF16, (size_t)out * in), .dtype = DTYPE_BF16, .out = out,
                         .in = in};
    if (packed) {
        void *pk = xmalloc(cpu_pack_bytes(&w));
        cpu_pack_blocks(&w, 0, (out + 15) / 16, pk);
        w.packed = pk;
    }
    return w;
}

static void wmat_free(struct cpu_wmat *w)
{
    free((void *)w->data);
    free((void *)w->packed);
}

// avx512_bf16's matmul reads x's rows as cpu_matmul rounded them (cpu_mm.xq)
// instead of rounding x itself, on each of its paths: rows from row
// pointers (5 rows), the interleaved tall tiles (12 gathered rows, packed,
// 512 outputs), row blocks over packed chunks (40 rows), more rows than its
// scratch holds (300, not packed). Given the rounding of another x, its
// outputs are those of that other x. The same of the tile path, where the
// tile unit is usable (its x groups hold 16 rows of 2048 inputs).
static void bf16_reads_rows_rounded(const struct cpu_kernels *k);
static void bf16_matmul_reads_rows_rounded_by_the_caller(void **state)
{
    (void)state;
    if (!cpu_kernels_avx512_bf16_path(false)) skip();
    for (int path = 0; path < BF16_PATHS; path += 2) {
        const struct cpu_kernels *k = bf16_path(path);
        if (k) bf16_reads_rows_rounded(k);
    }
}

static void bf16_reads_rows_rounded(const struct cpu_kernels *k)
{
    const struct {
        int rows, in, out;
        bool packed, gathered;
    } cases[] = {{5, 96, 70, false, false}, {12, 130, 512, true, true}, {40, 256, 100, true, false},
                 {300, 2048, 40, false, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int rows = cases[c].rows, in = cases[c].in, out = cases[c].out, np = (in + 1) / 2;
        struct cpu_wmat w = bf16_wmat(out, in, cases[c].packed);
        // Only where the path asks cpu_matmul for rounded rows (the tile
        // path leaves the matrices it does not take, 130 inputs, to its FMAs,
        // which round their own).
        if (!k->wants_xq(&(struct cpu_mm){.w = w})) {
            wmat_free(&w);
            continue;
        }
        float *xa = random_floats((size_t)rows * in), *xb = random_floats((size_t)rows * in);
        uint32_t *xq = xmalloc((size_t)rows * np * 4);
        int32_t *idx = xmalloc((size_t)rows * sizeof *idx);
        for (int r = 0; r < rows; r++) {
            idx[r] = cases[c].gathered ? rows - 1 - r : r;
            k->round_xq(xb + (size_t)r * in, in, xq + (size_t)r * np);
        }
        float *want = xmalloc((size_t)rows * out * 4), *got = xmalloc((size_t)rows * out * 4);
        float *scratch = xmalloc(cpu_kernels_scratch_floats(in, 1, 1) * 4);
        struct cpu_mm m = {.w = w, .x = xb, .ldx = (size_t)in, .x_rows = idx, .y = want, .ldy = (size_t)out,
                           .rows = rows};
        k->matmul(&m, 0, out, scratch);
        m.x = xa;
        m.xq = xq;
        m.ldxq = (size_t)np;
        m.y = got;
        k->matmul(&m, 0, out, scratch);
        if (memcmp(got, want, (size_t)rows * out * 4))
            fail_msg("rows %d in %d out %d: outputs do not follow the rows rounded by the caller", rows, in, out);
        free(scratch);
        free(want);
        free(got);
        free(idx);
        free(xq);
        free(xa);
        free(xb);
        wmat_free(&w);
    }
}

// cpu_matmul rounds a batch's activations once for avx512_bf16 (ops.h:
// cpu_xq) instead of in every piece of every matmul: the gate and up of
// every expert reading one x through their own gathered rows (one set), a
// down projection's experts at successive row offsets of another x, an
// expert of 12 rows over packed weights (the tall tiles), f16 weights (fp32
// x, left to themselves) in the same call, on 1 and 3 threads. Every output
// is the bits the same jobs give without it; the rounding pass ran (its
// buffer grew); a later call of another shape on the same buffers gives its
// own bits too; and a call of fewer than CPU_XQ_MIN_ROWS rows rounds
// nothing first.
static void matmul_rounds_a_batch_once_with_the_same_bits(void **state)
{
    (void)state;
    const struct cpu_kernels *k = cpu_kernels_avx512_bf16_path(false); // VDPBF16PS, wherever it runs
    if (!k) skip();
    enum { TOK = 150, K1 = 130, K2 = 77, OUT1 = 70, OUT2 = 96, E = 5, OUTP = 512 };
    float *x1 = random_floats((size_t)TOK * (K1 + 3)), *x2 = random_floats((size_t)TOK * 2 * K2);
    struct cpu_wmat wg[E], wd[E], wp = bf16_wmat(OUTP, K1, true);
    struct cpu_wmat wf = {.data = random_weights(DTYPE_F16, (size_t)OUT1 * K1), .dtype = DTYPE_F16, .out = OUT1,
                          .in = K1};
    for (int e = 0; e < E; e++) {
        wg[e] = bf16_wmat(OUT1, K1, e % 2);
        wd[e] = bf16_wmat(OUT2, K2, false);
    }
    // Expert e takes the tokens t with t % E != e (4 of every 5), in order;
    // the down jobs read successive blocks of x2 (stride 2 K2); the packed
    // expert 12 tokens from the end back.
    int32_t rows[E][TOK], n_rows[E], tall[12];
    for (int e = 0; e < E; e++) {
        n_rows[e] = 0;
        for (int t = 0; t < TOK; t++)
            if (t % E != e) rows[e][n_rows[e]++] = t;
    }
    for (int r = 0; r < 12; r++) tall[r] = TOK - 1 - 3 * r;
    // Per expert a band of TOK rows: gate, up, down, then the f16 job's
    // columns; the tall job's outputs in a band of their own.
    const size_t ldy = 320, ny = (size_t)(E + 1) * TOK * ldy; // OUTP x 12 fits a band
    float *want = xmalloc(ny * 4), *got = xmalloc(ny * 4);
    struct cpu_mm jobs[3 * E + 2];
    int nj = 0, down_at = 0;
    for (int e = 0; e < E; e++) {
        for (int h = 0; h < 2; h++) // gate and up: the same x and rows
            jobs[nj++] = (struct cpu_mm){.w = wg[e], .x = x1, .ldx = K1 + 3, .x_rows = rows[e], .rows = n_rows[e],
                                         .y = want + (size_t)e * TOK * ldy + (size_t)h * OUT1, .ldy = ldy};
        jobs[nj++] = (struct cpu_mm){.w = wd[e], .x = x2 + (size_t)down_at * 2 * K2, .ldx = 2 * K2,
                                     .rows = n_rows[e] / 5, .y = want + (size_t)e * TOK * ldy + 2 * OUT1,
                                     .ldy = ldy};
        down_at += n_rows[e] / 5;
    }
    jobs[nj++] = (struct cpu_mm){.w = wp, .x = x1, .ldx = K1 + 3, .x_rows = tall, .rows = 12,
                                 .y = want + (size_t)E * TOK * ldy, .ldy = OUTP};
    jobs[nj++] = (struct cpu_mm){.w = wf, .x = x1, .ldx = K1 + 3, .x_rows = rows[1], .rows = n_rows[1],
                                 .y = want + (size_t)(E - 1) * TOK * ldy + 2 * OUT1 + OUT2, .ldy = ldy};
    struct cpu_mm moved[3 * E + 2];
    for (int j = 0; j < nj; j++) {
        moved[j] = jobs[j];
        moved[j].y = got + (jobs[j].y - want);
    }
    // A small call (8 rows, above one thread's worth of work).
    struct cpu_wmat ws = bf16_wmat(2048, 64, true);
    float *ys = xmalloc((size_t)8 * 2048 * 4 * 2);
    const struct cpu_mm small = {.w = ws, .x = x1, .ldx = K1 + 3, .rows = 8, .y = ys, .ldy = 2048};
    struct cpu_mm small2 = small;
    small2.y = ys + 8 * 2048;
    const int sizes[] = {1, 3};
    for (int si = 0; si < 2; si++) {
        struct threadpool *p;
        char err[128];
        assert_int_equal(threadpool_create(sizes[si], &p, err, sizeof err), 0);
        const size_t stride = cpu_kernels_scratch_floats(K1, 1, 1);
        float *scratch = xmalloc((size_t)sizes[si] * stride * 4);
        struct cpu_exec plain = {.pool = p, .k = k, .scratch = scratch, .scratch_stride = stride};
        struct cpu_xq xq = {0};
        struct cpu_exec once = plain;
        once.xq = &xq;
        cpu_matmul(&once, &small, 1);
        assert_true(xq.cap == 0);
        cpu_matmul(&plain, &small2, 1);
        assert_memory_equal(ys, ys + 8 * 2048, (size_t)8 * 2048 * 4);
        memset(want, 0, ny * 4);
        cpu_matmul(&plain, jobs, nj);
        memset(got, 0, ny * 4);
        cpu_matmul(&once, moved, nj);
        assert_true(xq.cap > 0);
        assert_memory_equal(got, want, ny * 4);
        // Again on the grown buffers: the down jobs alone (fewer sets,
        // another K), then everything.
        memset(got, 0, ny * 4);
        struct cpu_mm downs[E];
        for (int e = 0; e < E; e++) downs[e] = moved[3 * e + 2];
        cpu_matmul(&once, downs, E);
        for (int e = 0; e < E; e++)
            for (int r = 0; r < downs[e].rows; r++)
                assert_memory_equal(got + (size_t)e * TOK * ldy + (size_t)r * ldy + 2 * OUT1,
                                    want + (size_t)e * TOK * ldy + (size_t)r * ldy + 2 * OUT1, OUT2 * 4);
        memset(got, 0, ny * 4);
        cpu_matmul(&once, moved, nj);
        assert_memory_equal(got, want, ny * 4);
        cpu_xq_free(&xq);
        free(scratch);
        threadpool_destroy(p);
    }
    for (int e = 0; e < E; e++) {
        wmat_free(&wg[e]);
        wmat_free(&wd[e]);
    }
    wmat_free(&wp);
    wmat_free(&ws);
    free((void *)wf.data);
    free(ys);
    free(x1);
    free(x2);
    free(want);
    free(got);
}

// The far prefetches (kernels.h: cpu_pf_mode) are a choice of time only:
// MOESERVE_CPU_FAR_PREFETCH names a plan (intel, amd, 0), anything else is
// refused and leaves it to the CPU (Intel's plan on Intel, Zen's on the
// others); the plans cover the rows they were measured to pay for.
static void far_prefetch_plan_follows_the_variable_then_the_cpu(void **state)
{
    (void)state;
    struct cpu_pf_plan p;
    assert_true(cpu_pf_plan_choose(NULL, true, &p));
    assert_true(p.min_rows == 1 && p.max_rows == 12 && p.far == CPU_PF_NEAR_FAR);
    assert_true(cpu_pf_plan_choose(NULL, false, &p));
    assert_true(p.min_rows == 7 && p.max_rows == 16 && p.far == CPU_PF_NEAR_FAR_LONG);
    assert_true(cpu_pf_plan_choose("amd", true, &p));
    assert_true(p.min_rows == 7 && p.far == CPU_PF_NEAR_FAR_LONG);
    assert_true(cpu_pf_plan_choose("intel", false, &p));
    assert_true(p.max_rows == 12 && p.far == CPU_PF_NEAR_FAR);
    assert_true(cpu_pf_plan_choose("0", true, &p));
    assert_true(p.min_rows > p.max_rows);
    const char *junk[] = {"", "1", "yes", "AMD", "intel "};
    for (int i = 0; i < 5; i++) {
        assert_false(cpu_pf_plan_choose(junk[i], true, &p));
        assert_true(p.max_rows == 12 && p.far == CPU_PF_NEAR_FAR);
        assert_false(cpu_pf_plan_choose(junk[i], false, &p));
        assert_true(p.max_rows == 16);
    }
    // A row block after the first never prefetches: it finds its weights in L2.
    for (int rows = 1; rows <= 70; rows++) assert_int_equal(cpu_pf_mode(false, rows), CPU_PF_NONE);
}

// The tall tiles' broadcast buffer: value i of row r at out[i * rows + r]
// for every row count they take and lengths on both sides of the 16-value
// blocks it moves at a time, and nothing written past the last value.
static void avx512_interleave_puts_row_r_value_i_at_i_rows_plus_r(void **state)
{
    (void)state;
    if (!cpu_kernels_avx512()) {
        skip();
        return;
    }
    const int lens[] = {1, 15, 16, 17, 39, 512, 513};
    for (int rows = 1; rows <= 16; rows++)
        for (int li = 0; li < 7; li++) {
            const int n = lens[li];
            uint32_t *src = xmalloc((size_t)rows * (size_t)n * sizeof *src);
            const void *rp[16];
            for (int r = 0; r < rows; r++) {
                for (int i = 0; i < n; i++) src[(size_t)r * (size_t)n + (size_t)i] = (uint32_t)(r * 100000 + i);
                rp[r] = src + (size_t)r * (size_t)n;
            }
            const size_t total = (size_t)rows * (size_t)n;
            uint32_t *out = xmalloc((total + 16) * sizeof *out);
            for (size_t i = 0; i < total + 16; i++) out[i] = 0xdeadbeefu;
            cpu_avx512_interleave_rows(rp, rows, n, out);
            for (int i = 0; i < n; i++)
                for (int r = 0; r < rows; r++)
                    assert_int_equal(out[(size_t)i * (size_t)rows + (size_t)r], (uint32_t)(r * 100000 + i));
            for (size_t i = total; i < total + 16; i++) assert_int_equal(out[i], 0xdeadbeefu);
            free(out);
            free(src);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(simd_matmul_matches_scalar_at_every_shape_and_dtype),
        cmocka_unit_test(matmul_outputs_do_not_depend_on_batch_or_split),
        cmocka_unit_test(big_matrix_outputs_do_not_depend_on_rows),
        cmocka_unit_test(packed_layout_holds_16_outputs_per_k),
        cmocka_unit_test(packed_matmul_is_one_fma_chain_per_output),
        cmocka_unit_test(avx512_interleave_puts_row_r_value_i_at_i_rows_plus_r),
        cmocka_unit_test(quantized_matmul_matches_the_formula_on_every_table),
        cmocka_unit_test(quantized_outputs_do_not_depend_on_batch_or_split),
        cmocka_unit_test(bf16_tile_path_takes_quantized_weights_over_rounded_rows),
        cmocka_unit_test(bf16_dp_path_takes_quantized_weights_over_rounded_rows),
        cmocka_unit_test(every_fp8_and_int8_byte_reads_as_its_formula),
        cmocka_unit_test(simd_attention_matches_scalar),
        cmocka_unit_test(simd_silu_mul_matches_scalar_and_ignores_where_n_ends),
        cmocka_unit_test(simd_rope_matches_scalar_bit_for_bit),
        cmocka_unit_test(simd_exp_sum_matches_scalar_and_zeroes_masked_entries),
        cmocka_unit_test(simd_scale_max_matches_scalar_and_clears_nan),
        cmocka_unit_test(simd_rmsnorm_and_axpy_match_scalar),
        cmocka_unit_test(threadpool_runs_every_range_exactly_once),
        cmocka_unit_test(threadpool_shared_runs_take_every_piece_once),
        cmocka_unit_test(threaded_matmul_matches_single_thread),
        cmocka_unit_test(rmsnorm_scales_by_root_mean_square),
        cmocka_unit_test(rope_rotates_pairs_half_a_head_apart),
        cmocka_unit_test(router_picks_top_k_lowest_index_on_ties),
        cmocka_unit_test(bf16_matmul_is_fp32_over_bf16_activations),
        cmocka_unit_test(bf16_table_leaves_other_weights_to_avx512),
        cmocka_unit_test(bf16_paths_give_the_same_results),
        cmocka_unit_test(far_prefetch_plan_follows_the_variable_then_the_cpu),
        cmocka_unit_test(bf16_matmul_reads_rows_rounded_by_the_caller),
        cmocka_unit_test(matmul_rounds_a_batch_once_with_the_same_bits),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
