// The CUDA backend's quantized layout (gpu/qlayout.h), on the CPU: a block
// holds exactly quant_block_bytes and gives back every code, scale and zero
// point by model/quant.h's formula, each in a byte (or nibble) of its own;
// the 16- and 8-byte loads of the tensor-core kernel hold a lane's two
// outputs' 8 inputs and its two scales; every fp8, int8 and int4 code
// becomes an exact bf16 in the kernel's pairs (the very functions the
// kernel calls); the warps' runs of K cover it in order on 32-input steps;
// and a whole matrix multiplied the kernel's way — lanes' loads, pairs,
// per-group sums scaled once, warps added in order, activations in bf16 —
// stays within bf16's rounding of the formula.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "gpu/qlayout.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float frand(void) { return (float)(next_u32() & 0xffffff) / 8388608.0f - 1.0f; }

static const enum quant_format formats[] = {QUANT_FP8, QUANT_INT8, QUANT_INT4};
// K on and off the 8-input units and 32-input steps; groups on the steps,
// off them (the plain kernel's) and wider than K.
static const int Ks[] = {1, 7, 8, 24, 31, 40, 96, 100, 130, 264};
static const int Gs[] = {8, 24, 32, 64, 128, 4096};

// n random canonical rows of a (>= n, K) matrix: every code the format has,
// positive scales (fp16 values for int4, as the format holds them), zero
// points 0..16.
static void *rows_make(struct quant_rows *r, enum quant_format f, int n, int K, int G)
{
    void *buf = malloc(quant_rows_bytes(n, K, f, G));
    assert_non_null(buf);
    quant_rows_init(r, buf, n, K, f, G);
    for (size_t i = 0; i < (size_t)n * K; i++) {
        const uint32_t v = next_u32();
        r->q[i] = f == QUANT_INT4 ? (uint8_t)(v & 15u) : f == QUANT_INT8 ? (uint8_t)(int8_t)((int)(v % 255) - 127)
                                                                    : (uint8_t)v;
    }
    for (size_t i = 0; i < (size_t)n * r->n_groups; i++) {
        float s = ldexpf(1.0f + frand() * 0.5f, -(int)(next_u32() % 12));
        if (f == QUANT_INT4) s = ms_f16_to_f32(ms_f32_to_f16(s));
        r->scale[i] = s;
        r->zero[i] = f == QUANT_INT4 ? (uint8_t)(next_u32() % 17) : 0;
    }
    return buf;
}

// A block packed from n rows, with guard bytes after it that must stay.
static uint8_t *block_make(const struct quant_rows *r, size_t *bytes)
{
    *bytes = quant_block_bytes(r->format, r->cols, r->group);
    uint8_t *b = malloc(*bytes + 64);
    assert_non_null(b);
    memset(b, 0xa5, *bytes + 64);
    ql_pack_block(r, b);
    for (size_t i = 0; i < 64; i++) assert_int_equal(b[*bytes + i], 0xa5);
    return b;
}

static void blocks_read_back_by_the_formula(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++)
                for (int n = 1; n <= 16; n += 15) {
                    const enum quant_format f = formats[fi];
                    const int K = Ks[ki], G = Gs[gi];
                    struct quant_rows r;
                    void *buf = rows_make(&r, f, n, K, G);
                    size_t bytes;
                    uint8_t *blk = block_make(&r, &bytes);
                    const size_t hb = quant_block_header_bytes(f, K, G);
                    for (int j = 0; j < QUANT_BLOCK_ROWS; j++)
                        for (int k = 0; k < K; k++) {
                            const float got = ql_value(blk, hb, f, K, G, j, k);
                            const float want = j < n ? quant_rows_value(&r, j, k) : 0.0f;
                            if (memcmp(&got, &want, sizeof got) != 0 && !(j >= n && got == 0.0f))
                                fail_msg("%s K %d G %d n %d: row %d input %d reads %.9g, the formula %.9g",
                                         quant_format_name(f), K, G, n, j, k, (double)got, (double)want);
                        }
                    free(blk);
                    free(buf);
                }
}

// Marks [at, at + len) of a map of `size` bytes as used, failing on a byte
// used twice or out of bounds (bits: int4 nibbles are half a byte).
static void claim(uint8_t *map, size_t size, size_t at, uint8_t bits, const char *what)
{
    if (at >= size) fail_msg("%s at %zu is past the %zu bytes", what, at, size);
    if (map[at] & bits) fail_msg("%s at %zu is used twice", what, at);
    map[at] |= bits;
}

static void every_value_has_its_own_place(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t gi = 0; gi < sizeof Gs / sizeof *Gs; gi++) {
                const enum quant_format f = formats[fi];
                const int K = Ks[ki], G = Gs[gi], ng = quant_groups(K, G);
                const size_t hb = quant_block_header_bytes(f, K, G), bb = quant_block_bytes(f, K, G);
                uint8_t *map = calloc(bb, 1);
                assert_non_null(map);
                for (int j = 0; j < QUANT_BLOCK_ROWS; j++) {
                    for (int g = 0; g < ng; g++) {
                        const size_t so = ql_scale_off(f, g, j);
                        const size_t sl = f == QUANT_INT4 ? 2 : 4;
                        for (size_t b = 0; b < sl; b++) claim(map, hb, so + b, 0xff, "a scale");
                        if (f == QUANT_INT4) claim(map, hb, ql_zero_off(g, j), 0xff, "a zero point");
                    }
                    for (int k = 0; k < K; k++) {
                        int sh;
                        const size_t at = ql_value_off(f, K, j, k, &sh);
                        claim(map + hb, bb - hb, at, f == QUANT_INT4 ? (uint8_t)(15u << sh) : 0xff, "a code");
                    }
                }
                free(map);
            }
}

// The tensor-core kernel's loads: lane j's 16 (8) bytes of a whole unit are
// output j's 8 codes then output j + 8's; its group load is their scales.
static void a_lane_loads_its_outputs_codes_and_scales(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
            const enum quant_format f = formats[fi];
            const int K = Ks[ki], G = 32;
            struct quant_rows r;
            void *buf = rows_make(&r, f, 16, K, G);
            size_t bytes;
            uint8_t *blk = block_make(&r, &bytes);
            const uint8_t *val = blk + quant_block_header_bytes(f, K, G);
            for (int j = 0; j < 8; j++) {
                for (int u = 0; 8 * u < K; u++) {
                    const uint8_t *at = val + ql_unit_off(f, u, j);
                    if (f == QUANT_INT4) {
                        uint32_t d[2];
                        memcpy(d, at, 8);
                        for (int i = 0; i < 8; i++) {
                            const int k = 8 * u + i;
                            for (int h = 0; h < 2; h++)
                                assert_int_equal((d[h] >> (4 * i)) & 15u, k < K ? r.q[(size_t)(j + 8 * h) * K + k] : 0);
                        }
                    } else if (8 * u + 8 <= K) {
                        for (int i = 0; i < 8; i++)
                            for (int h = 0; h < 2; h++)
                                assert_int_equal(at[8 * h + i], r.q[(size_t)(j + 8 * h) * K + 8 * u + i]);
                    }
                }
                for (int g = 0; g < r.n_groups; g++) {
                    const uint8_t *sp = blk + ql_scale_off(f, g, j);
                    for (int h = 0; h < 2; h++) {
                        const float want = r.scale[(size_t)(j + 8 * h) * r.n_groups + g];
                        if (f == QUANT_INT4) {
                            uint16_t s;
                            memcpy(&s, sp + 2 * h, 2);
                            assert_true(ms_f16_to_f32(s) == want);
                            assert_int_equal(blk[ql_zero_off(g, j) + (size_t)h], r.zero[(size_t)(j + 8 * h) * r.n_groups + g]);
                        } else {
                            float s;
                            memcpy(&s, sp + 4 * h, 4);
                            assert_true(s == want);
                        }
                    }
                }
            }
            free(blk);
            free(buf);
        }
}

static float bf16_lo(uint32_t pair) { return ms_bf16_to_f32((uint16_t)(pair & 0xffffu)); }
static float bf16_hi(uint32_t pair) { return ms_bf16_to_f32((uint16_t)(pair >> 16)); }

// The fp8 pair times 2^120 as the kernel's bf16 multiply computes it: the
// product is exact, so fp32 gives the same value (and it must be a bf16).
static float fp8_scaled(uint32_t pair, int half)
{
    const float v = (half ? bf16_hi(pair) : bf16_lo(pair)) * 0x1p120f;
    assert_true(ms_bf16_to_f32(ms_f32_to_bf16(v)) == v || v != v);
    return v;
}

static void codes_become_exact_bf16_pairs(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++)
        for (int i = 0; i < 4; i++) {
            const uint8_t c2 = (uint8_t)(255 - c);
            // Other bytes hold other codes: the pair must take byte i alone.
            const uint32_t w0 = (0x5a5a5a5au & ~(0xffu << (8 * i))) | (uint32_t)c << (8 * i);
            const uint32_t w1 = (0xc3c3c3c3u & ~(0xffu << (8 * i))) | (uint32_t)c2 << (8 * i);
            const uint32_t fp = ql_fp8_pair_bits(w0, w1, i);
            assert_true(fp8_scaled(fp, 0) == quant_fp8_to_f32((uint8_t)c));
            assert_true(fp8_scaled(fp, 1) == quant_fp8_to_f32(c2));
            assert_int_equal(signbit(fp8_scaled(fp, 0)) != 0, (c & 0x80) != 0); // -0 stays -0
            const uint32_t i8 = ql_int8_pair(w0, w1, i);
            assert_true(bf16_lo(i8) == (float)(int8_t)c);
            assert_true(bf16_hi(i8) == (float)(int8_t)c2);
        }
    for (int z = 0; z <= 16; z++) {
        const uint32_t zz = ql_int4_zero((uint32_t)z);
        assert_true(bf16_lo(zz) == 128.0f + (float)z && bf16_hi(zz) == 128.0f + (float)z);
        for (int q = 0; q < 16; q++)
            for (int i = 0; i < 4; i++) {
                const int q2 = 15 - q;
                const uint32_t d = (0x96969696u & ~(0xfu << (4 * i)) & ~(0xfu << (4 * (i + 4)))) |
                                   (uint32_t)q << (4 * i) | (uint32_t)q2 << (4 * (i + 4));
                const uint32_t p = ql_int4_pair_bits(d, i);
                // The kernel's bf16 subtraction is exact: fp32 gives its value.
                assert_true(bf16_lo(p) - bf16_lo(zz) == (float)(q - z));
                assert_true(bf16_hi(p) - bf16_hi(zz) == (float)(q2 - z));
            }
    }
}

static void warps_cover_k_in_order_on_steps(void **state)
{
    (void)state;
    for (int K = 1; K <= 700; K++)
        for (int nw = 1; nw <= 8; nw *= 2) {
            int at = 0;
            for (int w = 0; w < nw; w++) {
                int k0, k1;
                ql_warp_inputs(K, w, nw, &k0, &k1);
                assert_true(k0 <= k1);
                if (k0 == k1) continue;
                assert_int_equal(k0, at);
                assert_int_equal(k0 % QL_STEP, 0);
                assert_true(k1 % QL_STEP == 0 || k1 == K);
                at = k1;
            }
            assert_int_equal(at, K);
        }
}

static void tensor_cores_take_groups_on_steps(void **state)
{
    (void)state;
    for (int K = 1; K <= 300; K += 7)
        for (int G = 8; G <= 320; G += 8)
            for (int o0 = 0; o0 <= 32; o0 += 8) {
                bool steps = true;
                for (int b = G; b < K; b += G) steps = steps && b % QL_STEP == 0;
                assert_int_equal(ql_tensor_cores(K, G, o0) != 0, steps && o0 % 16 == 0);
            }
}

// Output o of a row, the tensor-core kernel's way (but for the order of
// the products inside one mma): lane (j, t) of warp w loads unit
// step / 8 + t of outputs j and j + 8, makes pairs (i, i + 4), sums the
// group's products of bf16 weights and bf16 activations in fp32, scales the
// sum once; the warps' sums are added in order.
static float kernel_way(const uint8_t *blk, enum quant_format f, int K, int G, int o, const float *x)
{
    const size_t hb = quant_block_header_bytes(f, K, G);
    const uint8_t *val = blk + hb;
    const int j = o % 8, h = o / 8;
    float y = 0.0f;
    for (int w = 0; w < 4; w++) {
        int k0, k1;
        ql_warp_inputs(K, w, 4, &k0, &k1);
        float acc = 0.0f;
        for (int kg = k0; kg < k1;) {
            const int g = kg / G, gend = k1 < (g + 1) * G ? k1 : (g + 1) * G;
            float s;
            uint32_t zz = 0;
            if (f == QUANT_INT4) {
                uint16_t s16[2];
                memcpy(s16, blk + ql_scale_off(f, g, j), 4);
                s = ms_f16_to_f32(s16[h]);
                zz = ql_int4_zero(blk[ql_zero_off(g, j) + (size_t)h]);
            } else {
                float s2[2];
                memcpy(s2, blk + ql_scale_off(f, g, j), 8);
                s = s2[h];
            }
            float sum = 0.0f;
            for (int kb = kg; kb < gend; kb += QL_STEP)
                for (int t = 0; t < 4; t++) {
                    const int u = kb / 8 + t;
                    if (8 * u >= K) continue;
                    uint32_t w0 = 0, w1 = 0;
                    if (f == QUANT_INT4) {
                        memcpy(&w0, val + ql_unit_off(f, u, j) + 4 * (size_t)h, 4);
                    } else if (8 * u + 8 <= K) {
                        memcpy(&w0, val + ql_unit_off(f, u, j) + 8 * (size_t)h, 4);
                        memcpy(&w1, val + ql_unit_off(f, u, j) + 8 * (size_t)h + 4, 4);
                    } else {
                        for (int i = 0; 8 * u + i < K; i++) {
                            int sh;
                            const uint32_t c = val[ql_value_off(f, K, o, 8 * u + i, &sh)];
                            if (i < 4) w0 |= c << (8 * i);
                            else w1 |= c << (8 * (i - 4));
                        }
                    }
                    for (int i = 0; i < 4; i++) {
                        float a, b;
                        if (f == QUANT_FP8) {
                            const uint32_t p = ql_fp8_pair_bits(w0, w1, i);
                            a = bf16_lo(p) * 0x1p120f, b = bf16_hi(p) * 0x1p120f;
                        } else if (f == QUANT_INT8) {
                            const uint32_t p = ql_int8_pair(w0, w1, i);
                            a = bf16_lo(p), b = bf16_hi(p);
                        } else {
                            const uint32_t p = ql_int4_pair_bits(w0, i);
                            a = bf16_lo(p) - bf16_lo(zz), b = bf16_hi(p) - bf16_hi(zz);
                        }
                        const int ka = 8 * u + i, kb2 = 8 * u + i + 4;
                        const float xa = ka < K ? ms_bf16_to_f32(ms_f32_to_bf16(x[ka])) : 0.0f;
                        const float xb = kb2 < K ? ms_bf16_to_f32(ms_f32_to_bf16(x[kb2])) : 0.0f;
                        sum += a * xa + b * xb;
                    }
                }
            acc = fmaf(sum, s, acc);
            kg = gend;
        }
        y = w ? y + acc : acc;
    }
    return y;
}

static void a_matrix_the_kernel_way_matches_the_formula(void **state)
{
    (void)state;
    const int Kt[] = {40, 96, 200, 264, 1000};
    const int Gt[] = {32, 64, 128, 100000};
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t ki = 0; ki < sizeof Kt / sizeof *Kt; ki++)
            for (size_t gi = 0; gi < sizeof Gt / sizeof *Gt; gi++) {
                const enum quant_format f = formats[fi];
                const int K = Kt[ki], G = Gt[gi] < K ? Gt[gi] : K;
                if (!ql_tensor_cores(K, G, 0)) continue;
                struct quant_rows r;
                void *buf = rows_make(&r, f, 16, K, G);
                size_t bytes;
                uint8_t *blk = block_make(&r, &bytes);
                float *x = malloc((size_t)K * sizeof *x);
                assert_non_null(x);
                for (int k = 0; k < K; k++) x[k] = frand();
                double want[16], scale = 1e-6;
                for (int o = 0; o < 16; o++) {
                    want[o] = 0;
                    for (int k = 0; k < K; k++) want[o] += (double)quant_rows_value(&r, o, k) * x[k];
                    double mag = 0;
                    for (int k = 0; k < K; k++) mag += fabs((double)quant_rows_value(&r, o, k) * x[k]);
                    if (mag > scale) scale = mag;
                }
                for (int o = 0; o < 16; o++) {
                    const float got = kernel_way(blk, f, K, G, o, x);
                    // bf16 activations: each product off by up to 2^-9.
                    if (!(fabs(got - want[o]) <= scale * 0x1p-8))
                        fail_msg("%s K %d G %d output %d: %.9g, the formula %.9g", quant_format_name(f), K,
                                 G, o, (double)got, want[o]);
                }
                free(x);
                free(blk);
                free(buf);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blocks_read_back_by_the_formula),
        cmocka_unit_test(every_value_has_its_own_place),
        cmocka_unit_test(a_lane_loads_its_outputs_codes_and_scales),
        cmocka_unit_test(codes_become_exact_bf16_pairs),
        cmocka_unit_test(warps_cover_k_in_order_on_steps),
        cmocka_unit_test(tensor_cores_take_groups_on_steps),
        cmocka_unit_test(a_matrix_the_kernel_way_matches_the_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
