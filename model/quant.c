// quant: the quantized weight formats' arithmetic (see quant.h): FP8
// encoding, quantization of a row at load, the canonical rows of a
// checkpoint's FP8 or GPTQ tensors, and the sizes of the packed layout.
#include "model/quant.h"

#include <math.h>
#include <string.h>

#include "base/base.h"
#include "model/model.h"

static const char *const format_names[] = {"none", "fp8", "int8", "int4"};

const char *quant_format_name(enum quant_format f)
{
    return (unsigned)f < sizeof format_names / sizeof format_names[0] ? format_names[f] : "?";
}

int quant_format_parse(const char *s, enum quant_format *out)
{
    for (size_t i = 0; s && i < sizeof format_names / sizeof format_names[0]; i++)
        if (!strcmp(s, format_names[i])) {
            *out = (enum quant_format)i;
            return 0;
        }
    return MS_EINVAL;
}

// ---- canonical rows ------------------------------------------------------------------

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

size_t quant_rows_bytes(int n, int cols, enum quant_format f, int group)
{
    const size_t ng = (size_t)quant_groups(cols, group), rows = n > 0 ? (size_t)n : 0;
    (void)f;
    return align8(rows * (size_t)cols) + align8(rows * ng * sizeof(float)) + align8(rows * ng);
}

void quant_rows_init(struct quant_rows *r, void *buf, int n, int cols, enum quant_format f, int group)
{
    const size_t ng = (size_t)quant_groups(cols, group);
    char *p = buf;
    r->format = f;
    r->n = n;
    r->cols = cols;
    r->group = group > 0 ? group : cols;
    r->n_groups = (int)ng;
    r->q = (uint8_t *)p;
    p += align8((size_t)n * (size_t)cols);
    r->scale = (float *)p;
    p += align8((size_t)n * ng * sizeof(float));
    r->zero = (uint8_t *)p;
}

// The loops that make and quantize a model at load run for every weight of
// a 30B model (minutes on two cores as plain scalar code): on x86-64 they
// get an AVX-512 clone, picked at run time, that the compiler vectorizes.
// Both clones do the same IEEE operations in the same order on each element
// (integer hashing, exact conversions, one multiply, a division, rounding to
// nearest even), so they make the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QUANT_HOT __attribute__((target_clones("arch=x86-64-v4", "default"), \
                                 optimize("vect-cost-model=dynamic")))
#else
#define QUANT_HOT
#endif

// rint for |x| < 2^22 in the default rounding mode, written so that it vectorizes.
static inline float rint_small(float x) { return (x + 0x1.8p23f) - 0x1.8p23f; }

// The smallest fp16 value >= s (s >= 0 and finite).
static float f16_at_least(float s)
{
    float h = ms_f16_to_f32(ms_f32_to_f16(s));
    if (h < s) {
        uint16_t b = ms_f32_to_f16(s);
        h = ms_f16_to_f32((uint16_t)(b + 1)); // the next fp16 up (s is positive)
    }
    return h;
}

// The smallest and largest of n values and 0 (non-finite values read as 0),
// in 16 lanes that vectorize (min and max are exact in any order).
QUANT_HOT static void group_range(const float *w, int n, float *lo_out, float *hi_out)
{
    float lo[16] = {0}, hi[16] = {0};
    int k = 0;
    for (; k + 16 <= n; k += 16)
        for (int j = 0; j < 16; j++) {
            const float v = w[k + j] - w[k + j] == 0.0f ? w[k + j] : 0.0f;
            lo[j] = v < lo[j] ? v : lo[j];
            hi[j] = v > hi[j] ? v : hi[j];
        }
    for (; k < n; k++) {
        const float v = w[k] - w[k] == 0.0f ? w[k] : 0.0f;
        lo[0] = v < lo[0] ? v : lo[0];
        hi[0] = v > hi[0] ? v : hi[0];
    }
    for (int j = 1; j < 16; j++) {
        lo[0] = lo[j] < lo[0] ? lo[j] : lo[0];
        hi[0] = hi[j] > hi[0] ? hi[j] : hi[0];
    }
    *lo_out = lo[0];
    *hi_out = hi[0];
}

// q = clamp(rint(w / s) + z, 0, 15) over a group (non-finite w read as 0).
QUANT_HOT static void int4_values(const float *w, int n, float s, float zf, uint8_t *q)
{
    for (int k = 0; k < n; k++) {
        const float v = w[k] - w[k] == 0.0f ? w[k] : 0.0f;
        float x = s > 0 ? rint_small(v / s) + zf : zf;
        x = x < 0 ? 0 : x;
        x = x > 15 ? 15 : x;
        q[k] = (uint8_t)(int)x;
    }
}

// int4 over one group: the range with 0 in it (symmetric: +-max|w|), s the
// range over 15 rounded up to an fp16 value, z = round(-lo / s) (8 when
// symmetric) within [zmin, 15].
static void int4_group(const float *w, int k0, int k1, bool sym, int zmin, uint8_t *q, float *s_out,
                       uint8_t *z_out)
{
    float lo, hi;
    group_range(w + k0, k1 - k0, &lo, &hi);
    if (sym) {
        hi = fmaxf(hi, -lo);
        lo = -hi;
    }
    // At most fp16's largest, 65504: a range past 15 x 65504 (a weight near
    // 1e6) clamps its extremes where an inf scale read every value back NaN.
    const float s = hi > lo ? f16_at_least(fminf((hi - lo) / 15.0f, 65504.0f)) : 0.0f;
    float zf = sym ? 8.0f : s > 0 ? rintf(-lo / s) : 8.0f;
    zf = zf < (float)zmin ? (float)zmin : zf > 15 ? 15 : zf;
    int4_values(w + k0, k1 - k0, s, zf, q + k0);
    *s_out = s;
    *z_out = (uint8_t)zf;
}

void quant_rows_quantize_gptq(struct quant_rows *r, int i, const float *w, bool sym)
{
    const int K = r->cols, G = r->group;
    for (int g = 0; g < r->n_groups; g++)
        int4_group(w, g * G, g * G + G < K ? g * G + G : K, sym, 1, r->q + (size_t)i * K,
                   &r->scale[(size_t)i * r->n_groups + g], &r->zero[(size_t)i * r->n_groups + g]);
}

void quant_rows_quantize(struct quant_rows *r, int i, const float *w)
{
    const int K = r->cols, G = r->group;
    uint8_t *q = r->q + (size_t)i * K;
    for (int g = 0; g < r->n_groups; g++) {
        const int k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
        float s = 0.0f, lo, hi;
        uint8_t z = 0;
        if (r->format == QUANT_INT4) {
            int4_group(w, k0, k1, false, 0, q, &s, &z);
        } else {
            group_range(w + k0, k1 - k0, &lo, &hi);
            const float amax = fmaxf(hi, -lo);
            if (r->format == QUANT_FP8) {
                s = amax / 448.0f;
                for (int k = k0; k < k1; k++) q[k] = s > 0 && isfinite(w[k]) ? quant_f32_to_fp8(w[k] / s) : 0;
            } else {
                s = amax / 127.0f;
                for (int k = k0; k < k1; k++) {
                    float v = s > 0 && isfinite(w[k]) ? rintf(w[k] / s) : 0.0f;
                    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                    q[k] = (uint8_t)(int8_t)v;
                }
            }
        }
        r->scale[(size_t)i * r->n_groups + g] = s;
        r->zero[(size_t)i * r->n_groups + g] = z;
    }
}

static float scale_at(const void *p, enum dtype t, size_t i)
{
    switch (t) {
    case DTYPE_BF16: return ms_bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_F16: return ms_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

// A dummy row's values rounded to bf16, as a dummy bf16 model holds them.
QUANT_HOT static void dummy_row_bf16(struct tensor d, size_t base, int K, float *out)
{
    for (int k = 0; k < K; k++) out[k] = ms_bf16_to_f32(ms_f32_to_bf16(tensor_dummy_value(&d, base + (size_t)k)));
}

// A row of values as the tensor holds them (a dummy's rounded to its dtype,
// as a dummy model of that dtype would hold it).
static void plain_row(const struct tensor *t, int row, float *out)
{
    const int K = (int)t->shape[1];
    const size_t base = (size_t)row * (size_t)K;
    if (t->data) {
        for (int k = 0; k < K; k++) out[k] = scale_at(t->data, t->dtype, base + (size_t)k);
    } else if (t->dtype == DTYPE_BF16) {
        dummy_row_bf16(*t, base, K, out);
    } else if (t->dtype == DTYPE_F16) {
        for (int k = 0; k < K; k++) out[k] = ms_f16_to_f32(ms_f32_to_f16(tensor_dummy_value(t, base + (size_t)k)));
    } else {
        for (int k = 0; k < K; k++) out[k] = tensor_dummy_value(t, base + (size_t)k);
    }
}

void quant_tensor_rows(const struct tensor *t, int r0, int n, struct quant_rows *r, float *tmp)
{
    const struct tensor_quant *tq = &t->quant;
    const int rows = (int)t->shape[0], K = (int)t->shape[1], ng = r->n_groups, G = r->group;
    for (int i = 0; i < n; i++) {
        const int o = tq->row_perm ? tq->row_perm[r0 + i] : r0 + i;
        uint8_t *q = r->q + (size_t)i * K;
        float *s = r->scale + (size_t)i * ng;
        uint8_t *z = r->zero + (size_t)i * ng;
        switch (tq->source) {
        case QUANT_SRC_AT_LOAD:
            plain_row(t, o, tmp);
            quant_rows_quantize(r, i, tmp);
            break;
        case QUANT_SRC_FP8: {
            memcpy(q, (const uint8_t *)t->data + (size_t)o * K, (size_t)K);
            const int br = tq->block_rows > 0 ? tq->block_rows : rows;
            for (int g = 0; g < ng; g++) s[g] = scale_at(tq->scale, tq->scale_dtype, (size_t)(o / br) * ng + g);
            memset(z, 0, (size_t)ng);
            break;
        }
        case QUANT_SRC_GPTQ: {
            const uint32_t *qw = t->data, *qz = tq->zeros;
            for (int j = 0; j < K; j++) {
                const int k = tq->perm ? tq->perm[j] : j;
                q[j] = (uint8_t)((qw[(size_t)(k / 8) * rows + o] >> (4 * (k % 8))) & 15u);
            }
            for (int g = 0; g < ng; g++) {
                s[g] = scale_at(tq->scale, DTYPE_F16, (size_t)g * rows + o);
                const uint32_t word = qz[(size_t)g * (rows / 8) + o / 8];
                z[g] = (uint8_t)(((word >> (4 * (o % 8))) & 15u) + (uint32_t)tq->zero_offset);
            }
            (void)G;
            break;
        }
        case QUANT_SRC_CT: {
            const int bits = t->quant.format == QUANT_INT4 ? 4 : 8, per = 32 / bits;
            const uint32_t mask = (1u << bits) - 1u, half = 1u << (bits - 1);
            const size_t words = (size_t)(K + per - 1) / (size_t)per;
            const uint32_t *row = (const uint32_t *)t->data + (size_t)o * words;
            for (int j = 0; j < K; j++) {
                const int k = tq->perm ? tq->perm[j] : j;
                const uint32_t u = (row[k / per] >> (bits * (k % per))) & mask;
                // int4 keeps the stored value (its zero point is 8 when
                // symmetric); int8 is signed: the value less 128.
                q[j] = bits == 4 ? (uint8_t)u : (uint8_t)(int8_t)((int)u - (int)half);
            }
            for (int g = 0; g < ng; g++) {
                s[g] = scale_at(tq->scale, tq->scale_dtype, (size_t)o * ng + g);
                if (bits == 8) z[g] = 0;
                else if (!tq->zeros) z[g] = 8;
                else if (tq->zeros_i8) z[g] = (uint8_t)(((const int8_t *)tq->zeros)[(size_t)o * ng + g] + 8);
                else z[g] = (uint8_t)((((const uint32_t *)tq->zeros)[(size_t)(o / 8) * ng + g] >> (4 * (o % 8))) & 15u);
            }
            break;
        }
        case QUANT_SRC_AWQ: {
            const uint32_t *qw = t->data, *qz = tq->zeros;
            const size_t words = (size_t)rows / 8;
            const int shift = 4 * quant_awq_nibble(o % 8);
            for (int k = 0; k < K; k++) q[k] = (uint8_t)((qw[(size_t)k * words + (size_t)(o / 8)] >> shift) & 15u);
            for (int g = 0; g < ng; g++) {
                s[g] = scale_at(tq->scale, tq->scale_dtype, (size_t)g * rows + o);
                z[g] = (uint8_t)((qz[(size_t)g * words + (size_t)(o / 8)] >> shift) & 15u);
            }
            break;
        }
        }
    }
}

// ---- sizes -----------------------------------------------------------------------------

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

enum quant_format quant_config_format(const struct model_config *cfg)
{
    switch (cfg->quant.method) {
    case QUANT_METHOD_FP8: return QUANT_FP8;
    case QUANT_METHOD_GPTQ:
    case QUANT_METHOD_AWQ: return QUANT_INT4;
    case QUANT_METHOD_CT_INT: return cfg->quant.bits == 8 ? QUANT_INT8 : QUANT_INT4;
    case QUANT_METHOD_CT_FP8: return QUANT_FP8;
    case QUANT_METHOD_NONE: break;
    }
    return QUANT_NONE;
}

int quant_config_group(const struct model_config *cfg, enum quant_format f)
{
    if (f == QUANT_NONE || f != quant_config_format(cfg)) return QUANT_GROUP;
    return f == QUANT_FP8 ? cfg->quant.block_cols : cfg->quant.group;
}

size_t quant_block_header_bytes(enum quant_format f, int cols, int group)
{
    const size_t ng = (size_t)quant_groups(cols, group);
    return round64(ng * (f == QUANT_INT4 ? 48 : 64));
}

size_t quant_block_bytes(enum quant_format f, int cols, int group)
{
    const size_t K = cols > 0 ? (size_t)cols : 0;
    const size_t values = f == QUANT_INT4 ? (K + 7) / 8 * 64 : K * 16;
    return round64(quant_block_header_bytes(f, cols, group) + values);
}

uint64_t quant_matrix_bytes(uint64_t rows, uint64_t cols, enum quant_format f, int group)
{
    if (!rows || !cols || cols > INT32_MAX) return 0;
    const uint64_t blocks = (rows + QUANT_BLOCK_ROWS - 1) / QUANT_BLOCK_ROWS;
    uint64_t r;
    if (ms_mul_overflow_u64(blocks, quant_block_bytes(f, (int)cols, group), &r)) return UINT64_MAX;
    return r;
}
