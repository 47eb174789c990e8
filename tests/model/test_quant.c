// Pins model/quant.h's formulas: every e4m3 code decodes to the OCP value,
// encoding rounds to the nearest code (ties to even) and saturates, rows
// quantized at load read back within half a step of their values, and the
// canonical rows of FP8 and GPTQ checkpoint tensors (hand-packed here) and
// of dummy tensors are what their formats say; the packed sizes.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/model.h"
#include "model/quant.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) // [-1, 1)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

// The OCP e4m3fn value of a code: (-1)^s 2^(e - 7) (1 + m / 8), or
// (-1)^s 2^-6 m / 8 when e is 0.
static double fp8_formula(uint8_t c)
{
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

static void fp8_codes_decode_to_their_values(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        const float got = quant_fp8_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) { // the NaN codes read as +-480
            assert_true(got == (c & 0x80 ? -480.0f : 480.0f));
            continue;
        }
        if ((double)got != fp8_formula((uint8_t)c))
            fail_msg("code 0x%02x decodes to %.9g, the formula gives %.9g", c, (double)got,
                     fp8_formula((uint8_t)c));
    }
    assert_true(quant_fp8_to_f32(0x7e) == 448.0f);
    assert_true(quant_fp8_to_f32(0x01) == 0x1p-9f);
}

static void fp8_encoding_rounds_to_the_nearest_code(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) assert_int_equal(quant_f32_to_fp8(quant_fp8_to_f32((uint8_t)c)), c);
    // Ties go to the even code: halfway between 1 (0x38) and 1.125 (0x39),
    // and between 1.125 and 1.25 (0x3a).
    assert_int_equal(quant_f32_to_fp8(1.0625f), 0x38);
    assert_int_equal(quant_f32_to_fp8(1.1875f), 0x3a);
    assert_int_equal(quant_f32_to_fp8(0x1p-10f), 0x00);         // half the smallest subnormal
    assert_int_equal(quant_f32_to_fp8(3 * 0x1p-10f), 0x02);     // 1.5 of it
    assert_int_equal(quant_f32_to_fp8(1e6f), 0x7e);             // saturates
    assert_int_equal(quant_f32_to_fp8(-460.0f), 0xfe);
    assert_int_equal(quant_f32_to_fp8(-0.0f), 0x80);
    // Random values: no code is nearer than the one chosen.
    for (int i = 0; i < 20000; i++) {
        const float x = frand() * ldexpf(1.0f, (int)(frand() * 12.0f) - 4);
        const uint8_t q = quant_f32_to_fp8(x);
        const double d = fabs((double)x - quant_fp8_to_f32(q));
        for (int c = 0; c < 256; c++)
            if ((c & 0x7f) != 0x7f && fabs((double)x - fp8_formula((uint8_t)c)) < d)
                fail_msg("%.9g encodes to 0x%02x (%g) but 0x%02x (%g) is nearer", (double)x, q,
                         (double)quant_fp8_to_f32(q), c, fp8_formula((uint8_t)c));
    }
}

// Each format's rows, quantized at load, read back within half a step:
// int8 and int4 s / 2 (the range is covered, so nothing clips), fp8 half a
// code's spacing at the value's binade. All-zero groups read back 0.
static void rows_quantized_at_load_read_back_within_half_a_step(void **state)
{
    (void)state;
    const enum quant_format fs[] = {QUANT_INT8, QUANT_INT4, QUANT_FP8};
    const int cols[] = {1, 8, 100, 128, 300};
    for (int fi = 0; fi < 3; fi++)
        for (int ci = 0; ci < 5; ci++) {
            const int K = cols[ci], G = 128;
            float *w = malloc((size_t)K * 4);
            void *buf = malloc(quant_rows_bytes(3, K, fs[fi], G));
            assert_true(w && buf);
            struct quant_rows r;
            quant_rows_init(&r, buf, 3, K, fs[fi], G);
            for (int i = 0; i < 3; i++) {
                // Row 0 symmetric, row 1 all positive, row 2 zero in its first group.
                for (int k = 0; k < K; k++)
                    w[k] = i == 0 ? frand() * 0.03f : i == 1 ? 0.5f + frand() * 0.1f : k < G ? 0.0f : frand();
                quant_rows_quantize(&r, i, w);
                for (int k = 0; k < K; k++) {
                    const int g = k / G;
                    const float s = r.scale[i * r.n_groups + g], got = quant_rows_value(&r, i, k);
                    double tol;
                    if (fs[fi] == QUANT_FP8) {
                        const double a = fabs((double)w[k]) / (s > 0 ? s : 1);
                        const int e = a >= 0x1p-6 ? (int)floor(log2(a)) : -6;
                        tol = ldexp(1.0, e - 4) * s * 1.0000001;
                    } else {
                        tol = s / 2 * 1.0000001;
                    }
                    if (fabs((double)got - w[k]) > tol + 1e-12)
                        fail_msg("%s row %d k %d of %d: %.9g reads back %.9g (scale %g)",
                                 quant_format_name(fs[fi]), i, k, K, (double)w[k], (double)got, (double)s);
                    if (i == 2 && k < G) assert_true(got == 0.0f);
                }
                if (fs[fi] == QUANT_INT4)
                    for (int g = 0; g < r.n_groups; g++) {
                        const float s = r.scale[i * r.n_groups + g];
                        assert_true(ms_f16_to_f32(ms_f32_to_f16(s)) == s); // an fp16 value
                        assert_true(r.zero[i * r.n_groups + g] <= 15);
                    }
            }
            free(w);
            free(buf);
        }
    // A group whose range passes fp16's (a weight near 1e6) reads back
    // finite: the int4 scale stops at 65504 and the extremes clamp.
    float w[128];
    for (int k = 0; k < 128; k++) w[k] = k < 4 ? (k & 1 ? -6e5f : 6e5f) : frand();
    void *buf = malloc(quant_rows_bytes(1, 128, QUANT_INT4, 128));
    assert_non_null(buf);
    struct quant_rows r;
    quant_rows_init(&r, buf, 1, 128, QUANT_INT4, 128);
    quant_rows_quantize(&r, 0, w);
    assert_true(r.scale[0] == 65504.0f);
    for (int k = 0; k < 128; k++) assert_true(isfinite(quant_rows_value(&r, 0, k)));
    assert_true(quant_rows_value(&r, 0, 0) > 3e5f && quant_rows_value(&r, 0, 1) < -3e5f);
    free(buf);
}

// GPTQ: symmetric rows have every zero point 8; the v1 rule keeps z >= 1.
static void gptq_rule_is_symmetric_or_keeps_zero_points_from_one(void **state)
{
    (void)state;
    float w[64];
    for (int k = 0; k < 64; k++) w[k] = 0.25f + 0.5f * frand() * frand(); // all positive: z would be 0
    void *buf = malloc(quant_rows_bytes(2, 64, QUANT_INT4, 32));
    assert_non_null(buf);
    struct quant_rows r;
    quant_rows_init(&r, buf, 2, 64, QUANT_INT4, 32);
    quant_rows_quantize_gptq(&r, 0, w, true);
    quant_rows_quantize_gptq(&r, 1, w, false);
    for (int g = 0; g < 2; g++) {
        assert_int_equal(r.zero[g], 8);
        assert_true(r.zero[2 + g] >= 1);
    }
    // Symmetric: within half a step; the asymmetric row gave up one step of
    // its range to z >= 1, so its top values may clip by one more.
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 64; k++) {
            const double step = r.scale[i * 2 + k / 32] * 1.0000001;
            assert_true(fabs((double)quant_rows_value(&r, i, k) - w[k]) <= (i == 0 ? step / 2 : step * 1.5));
        }
    free(buf);
}

// A GPTQ tensor packed by hand: value (k, o) in bits 4 (k % 8) of
// qweight[k / 8][o]; zero (g, o) in bits 4 (o % 8) of qzeros[g][o / 8],
// plus the offset; scales (g, o) in fp16.
static void gptq_tensors_read_as_their_format_says(void **state)
{
    (void)state;
    enum { R = 16, C = 24, G = 8, NG = 3 };
    uint8_t q[R][C], z[NG][R];
    float s[NG][R];
    uint32_t qweight[C / 8][R] = {{0}}, qzeros[NG][R / 8] = {{0}};
    uint16_t scales[NG][R];
    for (int o = 0; o < R; o++)
        for (int k = 0; k < C; k++) {
            q[o][k] = (uint8_t)((o * 7 + k * 3) % 16);
            qweight[k / 8][o] |= (uint32_t)q[o][k] << (4 * (k % 8));
        }
    for (int g = 0; g < NG; g++)
        for (int o = 0; o < R; o++) {
            z[g][o] = (uint8_t)((g + o) % 16);
            qzeros[g][o / 8] |= (uint32_t)z[g][o] << (4 * (o % 8));
            scales[g][o] = ms_f32_to_f16(0.01f * (float)(1 + g * R + o));
            s[g][o] = ms_f16_to_f32(scales[g][o]);
        }
    for (int offset = 0; offset < 2; offset++) {
        struct tensor t = {.data = qweight, .dtype = DTYPE_BF16, .ndim = 2, .shape = {R, C}};
        t.quant = (struct tensor_quant){.format = QUANT_INT4, .source = QUANT_SRC_GPTQ, .group = G,
                                        .block_rows = 1, .scale = scales, .scale_dtype = DTYPE_F16,
                                        .zeros = qzeros, .zero_offset = offset};
        void *buf = malloc(quant_rows_bytes(5, C, QUANT_INT4, G));
        float tmp[C];
        struct quant_rows r;
        quant_rows_init(&r, buf, 5, C, QUANT_INT4, G);
        quant_tensor_rows(&t, 9, 5, &r, tmp); // rows 9..13
        for (int i = 0; i < 5; i++) {
            const int o = 9 + i;
            for (int k = 0; k < C; k++) {
                assert_int_equal(r.q[i * C + k], q[o][k]);
                const float want = (float)((int)q[o][k] - (int)z[k / G][o] - offset) * s[k / G][o];
                assert_true(quant_rows_value(&r, i, k) == want);
            }
            for (int g = 0; g < NG; g++) assert_int_equal(r.zero[i * NG + g], z[g][o] + offset);
        }
        free(buf);
    }
}

// An AWQ tensor packed by hand the way AutoAWQ's GEMM packer packs it:
// word j of input k holds outputs 8j + order[i] in nibble i, with order 0,
// 2, 4, 6, 1, 3, 5, 7; the zero points (stored as they are) likewise; the
// scales in fp16, then in bf16.
static void awq_tensors_read_as_autoawq_packs_them(void **state)
{
    (void)state;
    enum { R = 16, C = 24, G = 8, NG = 3 };
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    uint8_t q[R][C], z[NG][R];
    float s[2][NG][R];
    uint32_t qweight[C][R / 8] = {{0}}, qzeros[NG][R / 8] = {{0}};
    uint16_t scales[2][NG][R];
    for (int o = 0; o < R; o++)
        for (int k = 0; k < C; k++) q[o][k] = (uint8_t)((o * 7 + k * 3) % 16);
    for (int g = 0; g < NG; g++)
        for (int o = 0; o < R; o++) {
            z[g][o] = (uint8_t)((g * 5 + o) % 16);
            scales[0][g][o] = ms_f32_to_f16(0.01f * (float)(1 + g * R + o));
            s[0][g][o] = ms_f16_to_f32(scales[0][g][o]);
            scales[1][g][o] = ms_f32_to_bf16(0.03f * (float)(1 + g * R + o));
            s[1][g][o] = ms_bf16_to_f32(scales[1][g][o]);
        }
    for (int j = 0; j < R / 8; j++)
        for (int i = 0; i < 8; i++) {
            const int o = 8 * j + order[i];
            for (int k = 0; k < C; k++) qweight[k][j] |= (uint32_t)q[o][k] << (4 * i);
            for (int g = 0; g < NG; g++) qzeros[g][j] |= (uint32_t)z[g][o] << (4 * i);
        }
    for (int bf = 0; bf < 2; bf++) {
        struct tensor t = {.data = qweight, .dtype = DTYPE_BF16, .ndim = 2, .shape = {R, C}};
        t.quant = (struct tensor_quant){.format = QUANT_INT4, .source = QUANT_SRC_AWQ, .group = G,
                                        .block_rows = 1, .scale = scales[bf],
                                        .scale_dtype = bf ? DTYPE_BF16 : DTYPE_F16, .zeros = qzeros};
        void *buf = malloc(quant_rows_bytes(R, C, QUANT_INT4, G));
        float tmp[C];
        struct quant_rows r;
        quant_rows_init(&r, buf, R, C, QUANT_INT4, G);
        quant_tensor_rows(&t, 0, R, &r, tmp);
        for (int o = 0; o < R; o++) {
            for (int k = 0; k < C; k++) {
                assert_int_equal(r.q[o * C + k], q[o][k]);
                const float want = (float)((int)q[o][k] - (int)z[k / G][o]) * s[bf][k / G][o];
                assert_true(quant_rows_value(&r, o, k) == want);
            }
            for (int g = 0; g < NG; g++) assert_int_equal(r.zero[o * NG + g], z[g][o]);
        }
        free(buf);
    }
}

// compressed-tensors pack-quantized tensors packed by hand as its
// pack_to_int32 packs them: row o's word j holds inputs 8j + i (int4; 4j + i
// for int8) in bits 4i (8i), each stored as its signed value plus 8 (128);
// asymmetric int4 zero points likewise plus 8, packed along the outputs
// (word (o / 8, g), bits 4 (o % 8)) or, as older files store them, one I8 a
// value; symmetric int4 reads every zero point as 8; scales (rows, groups).
static void compressed_tensors_tensors_read_as_pack_to_int32_packs_them(void **state)
{
    (void)state;
    enum { R = 16, C = 24, G = 8, NG = 3 };
    int8_t q4[R][C], q8[R][C], z[R][NG];
    float s[R][NG];
    uint16_t sb[R][NG];
    uint32_t p4[R][C / 8] = {{0}}, p8[R][C / 4] = {{0}}, zp[R / 8][NG] = {{0}};
    for (int o = 0; o < R; o++) {
        for (int k = 0; k < C; k++) {
            q4[o][k] = (int8_t)((o * 7 + k * 3) % 16 - 8);
            q8[o][k] = (int8_t)((o * 37 + k * 11) % 256 - 128); // -128 too
            p4[o][k / 8] |= (uint32_t)(q4[o][k] + 8) << (4 * (k % 8));
            p8[o][k / 4] |= (uint32_t)(q8[o][k] + 128) << (8 * (k % 4));
        }
        for (int g = 0; g < NG; g++) {
            z[o][g] = (int8_t)((g * 5 + o) % 16 - 8);
            zp[o / 8][g] |= (uint32_t)(z[o][g] + 8) << (4 * (o % 8));
            sb[o][g] = ms_f32_to_bf16(0.02f * (float)(1 + o * NG + g));
            s[o][g] = ms_bf16_to_f32(sb[o][g]);
        }
    }
    // 0: int4 symmetric, 1: int4 with packed zero points, 2: with I8 ones, 3: int8.
    for (int v = 0; v < 4; v++) {
        const enum quant_format f = v == 3 ? QUANT_INT8 : QUANT_INT4;
        struct tensor t = {.data = v == 3 ? (void *)p8 : (void *)p4, .dtype = DTYPE_BF16, .ndim = 2, .shape = {R, C}};
        t.quant = (struct tensor_quant){.format = f, .source = QUANT_SRC_CT, .group = G, .block_rows = 1,
                                        .scale = sb, .scale_dtype = DTYPE_BF16,
                                        .zeros = v == 1 ? (const void *)zp : v == 2 ? (const void *)z : NULL,
                                        .zeros_i8 = v == 2};
        void *buf = malloc(quant_rows_bytes(R, C, f, G));
        float tmp[C];
        struct quant_rows r;
        quant_rows_init(&r, buf, R, C, f, G);
        quant_tensor_rows(&t, 0, R, &r, tmp);
        for (int o = 0; o < R; o++)
            for (int k = 0; k < C; k++) {
                const int g = k / G, zero = v == 0 ? 0 : z[o][g];
                const float want = v == 3 ? (float)q8[o][k] * s[o][g] : (float)(q4[o][k] - (v == 0 ? 0 : zero)) * s[o][g];
                if (quant_rows_value(&r, o, k) != want)
                    fail_msg("case %d, (%d, %d): %g, expected %g", v, o, k, quant_rows_value(&r, o, k), want);
            }
        free(buf);
    }
}

// FP8 checkpoints: a block's scale (f32 or bf16) repeats for each of its rows.
static void fp8_tensors_repeat_their_block_scales_per_row(void **state)
{
    (void)state;
    enum { R = 5, C = 6, BR = 2, BC = 4 };
    uint8_t w[R][C];
    for (int o = 0; o < R; o++)
        for (int k = 0; k < C; k++) w[o][k] = (uint8_t)(o * 16 + k * 3 + 1);
    const float sf[3][2] = {{1.0f, 2.0f}, {0.5f, 0.25f}, {3.0f, -1.0f}};
    uint16_t sb[3][2];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) sb[i][j] = ms_f32_to_bf16(sf[i][j]);
    for (int bf = 0; bf < 2; bf++) {
        struct tensor t = {.data = w, .dtype = DTYPE_BF16, .ndim = 2, .shape = {R, C}};
        t.quant = (struct tensor_quant){.format = QUANT_FP8, .source = QUANT_SRC_FP8, .group = BC,
                                        .block_rows = BR, .scale = bf ? (const void *)sb : (const void *)sf,
                                        .scale_dtype = bf ? DTYPE_BF16 : DTYPE_F32};
        char buf[1024];
        float tmp[C];
        struct quant_rows r;
        assert_true(quant_rows_bytes(R, C, QUANT_FP8, BC) <= sizeof buf);
        quant_rows_init(&r, buf, R, C, QUANT_FP8, BC);
        quant_tensor_rows(&t, 0, R, &r, tmp);
        for (int o = 0; o < R; o++)
            for (int k = 0; k < C; k++)
                assert_true(quant_rows_value(&r, o, k) == quant_fp8_to_f32(w[o][k]) * sf[o / BR][k / BC]);
    }
}

// A dummy tensor quantized at load is its bf16 dummy values quantized.
static void dummy_rows_quantize_the_dummy_bf16_values(void **state)
{
    (void)state;
    enum { R = 3, C = 200 };
    struct tensor t = {.dtype = DTYPE_BF16, .ndim = 2, .shape = {R, C}, .init = TENSOR_INIT_UNIFORM,
                       .init_scale = 0.02f, .init_key = 77};
    t.quant = (struct tensor_quant){.format = QUANT_INT4, .source = QUANT_SRC_AT_LOAD, .group = 128,
                                    .block_rows = 1};
    // Zeroed: the buffers' alignment padding is compared too.
    void *b1 = calloc(1, quant_rows_bytes(R, C, QUANT_INT4, 128)), *b2 = calloc(1, quant_rows_bytes(R, C, QUANT_INT4, 128));
    float tmp[C], v[C];
    struct quant_rows r1, r2;
    quant_rows_init(&r1, b1, R, C, QUANT_INT4, 128);
    quant_rows_init(&r2, b2, R, C, QUANT_INT4, 128);
    quant_tensor_rows(&t, 0, R, &r1, tmp);
    for (int o = 0; o < R; o++) {
        for (int k = 0; k < C; k++) v[k] = ms_bf16_to_f32(ms_f32_to_bf16(tensor_dummy_value(&t, (size_t)o * C + k)));
        quant_rows_quantize(&r2, o, v);
    }
    assert_memory_equal(b1, b2, quant_rows_bytes(R, C, QUANT_INT4, 128));
    free(b1);
    free(b2);
}

// Blocks of 16 rows; per group 64 header bytes (fp8, int8) or 48 (int4),
// rounded to 64 in all; values 1 byte (fp8, int8) or half a byte (int4,
// inputs rounded to 8), rounded to 64.
static void packed_sizes_follow_the_layout(void **state)
{
    (void)state;
    assert_int_equal(quant_block_bytes(QUANT_FP8, 2048, 128), 16 * 64 + 2048 * 16);
    assert_int_equal(quant_block_bytes(QUANT_INT4, 2048, 128), 16 * 48 + 2048 * 8);
    assert_int_equal(quant_block_bytes(QUANT_INT4, 768, 128), 320 + 768 * 8);
    assert_int_equal(quant_block_bytes(QUANT_INT8, 5, 128), 64 + 128);
    assert_int_equal(quant_block_bytes(QUANT_INT4, 5, 128), 64 + 64);
    assert_int_equal(quant_matrix_bytes(17, 2048, QUANT_INT4, 128), 2 * (16 * 48 + 2048 * 8));
    assert_int_equal(quant_matrix_bytes(0, 2048, QUANT_INT4, 128), 0);
    assert_int_equal(quant_groups(300, 128), 3);
    enum quant_format f;
    assert_int_equal(quant_format_parse("int4", &f), 0);
    assert_int_equal(f, QUANT_INT4);
    assert_int_equal(quant_format_parse("q4_0", &f), MS_EINVAL);
    assert_string_equal(quant_format_name(QUANT_FP8), "fp8");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp8_codes_decode_to_their_values),
        cmocka_unit_test(fp8_encoding_rounds_to_the_nearest_code),
        cmocka_unit_test(rows_quantized_at_load_read_back_within_half_a_step),
        cmocka_unit_test(gptq_rule_is_symmetric_or_keeps_zero_points_from_one),
        cmocka_unit_test(gptq_tensors_read_as_their_format_says),
        cmocka_unit_test(awq_tensors_read_as_autoawq_packs_them),
        cmocka_unit_test(compressed_tensors_tensors_read_as_pack_to_int32_packs_them),
        cmocka_unit_test(fp8_tensors_repeat_their_block_scales_per_row),
        cmocka_unit_test(dummy_rows_quantize_the_dummy_bf16_values),
        cmocka_unit_test(packed_sizes_follow_the_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
