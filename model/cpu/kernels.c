// kernels.c: the portable scalar tables (the numerical reference every SIMD
// kernel is tested against) and the run-time choice of a table.
#include "model/cpu/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__)
// Defined in kernels_avx2.c / kernels_avx512.c, compiled with their own flags.
const struct cpu_kernels *cpu_kernels_avx2_table(void);
const struct cpu_kernels *cpu_kernels_avx512_table(void);
const struct cpu_kernels *cpu_kernels_amx_table(void);
const struct cpu_kernels *cpu_kernels_avx512_bf16_table(void);
const struct cpu_kernels *cpu_kernels_avx512_bf16_path_table(bool fma);
const struct cpu_kernels *cpu_kernels_avx512_bf16_tiles_table(void);
#endif

static void scalar_matmul(const struct cpu_mm *m, int o0, int o1, float *scratch)
{
    const int in = m->w.in;
    for (int o = o0; o < o1; o++) {
        // Convert the weight row once, use it for every row of x; a
        // quantized row by the formula, w = (q - z) * s in fp32.
        if (m->w.quant != QUANT_NONE) cpu_qpack_dequant_row(&m->w, o, scratch);
        else
            for (int k = 0; k < in; k++)
                scratch[k] = cpu_load_weight(m->w.data, m->w.dtype, (size_t)o * in + k);
        for (int r = 0; r < m->rows; r++) {
            const float *x = m->x + (size_t)(m->x_rows ? m->x_rows[r] : r) * m->ldx;
            float *y = m->y + (size_t)(m->y_rows ? m->y_rows[r] : r) * m->ldy;
            float s = 0.0f;
            for (int k = 0; k < in; k++) s += x[k] * scratch[k];
            y[o] = m->accumulate ? y[o] + s : s;
        }
    }
}

// Where position pos's block starts for this head: (head_dim, 16) keys,
// (16, head_dim) values.
static size_t kv_block_at(const struct cpu_attn *a, int pos)
{
    size_t blk = (size_t)a->blocks[pos / 16];
    return (blk * (size_t)a->n_kv_heads + (size_t)a->kv_head) * 16 * (size_t)a->head_dim;
}

static float key_at(const struct cpu_attn *a, int pos, int d)
{
    return cpu_load_weight(a->k, a->kv_dtype, kv_block_at(a, pos) + (size_t)d * 16 + (size_t)(pos % 16));
}

static const void *value_row(const struct cpu_attn *a, int pos)
{
    size_t idx = kv_block_at(a, pos) + (size_t)(pos % 16) * (size_t)a->head_dim;
    return (const char *)a->v + idx * dtype_size(a->kv_dtype);
}

// Two passes in double per row (the maximum, then the normalised sum):
// obviously right rather than fast.
static void scalar_attend(const struct cpu_attn *a, float *scratch)
{
    (void)scratch;
    const int D = a->head_dim;
    double acc[4096];
    if (D > 4096) return; // config_parse bounds head_dim by 4096
    for (int i = 0; i < a->n_tok; i++)
        for (int h = 0; h < a->n_q; h++) {
            const float *q = a->q + (size_t)i * a->q_stride + (size_t)h * D;
            const int n_ctx = a->first_pos + i + 1;
            double mx = -INFINITY;
            for (int p = 0; p < n_ctx; p++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)q[d] * key_at(a, p, d);
                s *= a->scale;
                if (s > mx) mx = s;
            }
            double sum = 0;
            for (int d = 0; d < D; d++) acc[d] = 0;
            for (int p = 0; p < n_ctx; p++) {
                const void *vr = value_row(a, p);
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)q[d] * key_at(a, p, d);
                double w = exp(s * a->scale - mx);
                sum += w;
                for (int d = 0; d < D; d++) acc[d] += w * cpu_load_weight(vr, a->kv_dtype, d);
            }
            float *o = a->out + (size_t)i * a->out_stride + (size_t)h * D;
            for (int d = 0; d < D; d++) o[d] = (float)(acc[d] / sum);
        }
}

static void scalar_silu_mul(float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void scalar_rmsnorm(const float *x, const void *w, enum dtype wt, int n, float eps, float *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * cpu_load_weight(w, wt, (size_t)i);
}

static void scalar_axpy(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

static void scalar_rope(float *out, const float *x, int half, const float *c, const float *s)
{
    for (int i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        out[i] = a * c[i] - b * s[i];
        out[i + half] = b * c[i] + a * s[i];
    }
}

static double scalar_exp_sum(const float *x, float shift, float *out, int n, double *block_sums)
{
    double sum = 0;
    for (int b = 0; b * CPU_EXP_BLOCK < n; b++) {
        const int end = n - b * CPU_EXP_BLOCK > CPU_EXP_BLOCK ? (b + 1) * CPU_EXP_BLOCK : n;
        double bs = 0;
        for (int i = b * CPU_EXP_BLOCK; i < end; i++) {
            out[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - shift);
            bs += out[i];
        }
        if (block_sums) block_sums[b] = bs;
        sum += bs;
    }
    return sum;
}

static float scalar_scale_max(float *x, float scale, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        x[i] = isnan(x[i]) ? -INFINITY : x[i] * scale;
        mx = x[i] > mx ? x[i] : mx;
    }
    return mx;
}

static float scalar_stream_sum(const float *p, size_t n)
{
    float s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += p[i + j];
    for (; i < n; i++) s[0] += p[i];
    return s[0] + s[1] + s[2] + s[3];
}

static float scalar_fma_burn(long iters, float seed)
{
    float a[CPU_FMA_CHAINS];
    for (int j = 0; j < CPU_FMA_CHAINS; j++) a[j] = seed + (float)j;
    const float m = 0.999999f, c = 1e-7f;
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < CPU_FMA_CHAINS; j++) a[j] = fmaf(a[j], m, c);
    float s = 0;
    for (int j = 0; j < CPU_FMA_CHAINS; j++) s += a[j];
    return s;
}

static const struct cpu_kernels scalar_table = {
    .name = "scalar",
    .lanes = 1,
    .unit = 16,
    .matmul = scalar_matmul,
    .attend = scalar_attend,
    .silu_mul = scalar_silu_mul,
    .rmsnorm = scalar_rmsnorm,
    .axpy = scalar_axpy,
    .rope = scalar_rope,
    .exp_sum = scalar_exp_sum,
    .scale_max = scalar_scale_max,
    .stream_sum = scalar_stream_sum,
    .fma_burn = scalar_fma_burn,
};

const struct cpu_kernels *cpu_kernels_scalar(void) { return &scalar_table; }

#if defined(__x86_64__)
const struct cpu_kernels *cpu_kernels_avx2(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
    return cpu_kernels_avx2_table(); // also needs F16C, which every AVX2 CPU has
}

const struct cpu_kernels *cpu_kernels_avx512(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
        return NULL;
    return cpu_kernels_avx512_table();
}

// CPUID.(7,1).EAX bit 5: AVX512-BF16 (VCVTNE2PS2BF16, VDPBF16PS).
const struct cpu_kernels *cpu_kernels_avx512_bf16(void)
{
    unsigned a, b, c, d;
    if (!cpu_kernels_avx512()) return NULL;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return NULL;
    return cpu_kernels_avx512_bf16_table();
}

const struct cpu_kernels *cpu_kernels_avx512_bf16_path(bool fma)
{
    return cpu_kernels_avx512_bf16() ? cpu_kernels_avx512_bf16_path_table(fma) : NULL;
}

const struct cpu_kernels *cpu_kernels_avx512_bf16_tiles(void)
{
    return cpu_kernels_avx512_bf16() ? cpu_kernels_avx512_bf16_tiles_table() : NULL;
}

// CPUID.(7,0).EDX: AMX-BF16 (bit 22), AMX-TILE (bit 24); CPUID.(7,0).ECX:
// AVX512_VBMI (bit 1, the fp8 tiles' byte tables; every AMX CPU has it);
// CPUID.(7,1).EAX: AVX512-BF16 (bit 5); XCR0 bits 17-18: the OS saves tile
// state. Linux then hands out the 8 KiB of tile data per thread only on
// request.
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static bool amx_usable;

static void amx_probe(void)
{
    unsigned a, b, c, d;
    if (!cpu_kernels_avx512()) return;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)) || !(c & (1u << 1)))
        return;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    amx_usable = true;
}

const struct cpu_kernels *cpu_kernels_amx(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_probe);
    return amx_usable ? cpu_kernels_amx_table() : NULL;
}
#else
const struct cpu_kernels *cpu_kernels_avx2(void) { return NULL; }
const struct cpu_kernels *cpu_kernels_avx512(void) { return NULL; }
const struct cpu_kernels *cpu_kernels_avx512_bf16(void) { return NULL; }
const struct cpu_kernels *cpu_kernels_avx512_bf16_path(bool fma) { (void)fma; return NULL; }
const struct cpu_kernels *cpu_kernels_avx512_bf16_tiles(void) { return NULL; }
const struct cpu_kernels *cpu_kernels_amx(void) { return NULL; }
#endif

static const struct cpu_pf_plan pf_intel = {1, 12, CPU_PF_NEAR_FAR}, pf_amd = {7, 16, CPU_PF_NEAR_FAR_LONG},
                                 pf_none = {1, 0, CPU_PF_NEAR};

bool cpu_pf_plan_choose(const char *env, bool intel, struct cpu_pf_plan *out)
{
    *out = intel ? pf_intel : pf_amd;
    if (!env) return true;
    if (!strcmp(env, "intel")) *out = pf_intel;
    else if (!strcmp(env, "amd")) *out = pf_amd;
    else if (!strcmp(env, "0")) *out = pf_none;
    else return false;
    return true;
}

static struct cpu_pf_plan pf_plan;

static void pf_plan_decide(void)
{
    bool intel = false;
#if defined(__x86_64__)
    __builtin_cpu_init();
    intel = __builtin_cpu_is("intel");
#endif
    const char *env = getenv("MOESERVE_CPU_FAR_PREFETCH");
    if (!cpu_pf_plan_choose(env, intel, &pf_plan))
        ms_log(MS_LOG_WARN,
               "MOESERVE_CPU_FAR_PREFETCH=%s names no plan (intel, amd or 0); ignored, this CPU's (%s) taken",
               env, intel ? "intel" : "amd");
}

const struct cpu_pf_plan *cpu_pf_plan_get(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pf_plan_decide);
    return &pf_plan;
}

static const struct {
    const char *name;
    const struct cpu_kernels *(*get)(void);
} tables_by_name[] = {
    {"scalar", cpu_kernels_scalar},
    {"avx2", cpu_kernels_avx2},
    {"avx512", cpu_kernels_avx512},
    {"avx512_bf16", cpu_kernels_avx512_bf16},
    {"amx", cpu_kernels_amx},
};

const struct cpu_kernels *cpu_kernels_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof tables_by_name / sizeof tables_by_name[0]; i++)
        if (!strcmp(name, tables_by_name[i].name)) return tables_by_name[i].get();
    return NULL;
}

const struct cpu_kernels *cpu_kernels_best(void)
{
    const char *want = getenv("MOESERVE_CPU_KERNELS");
    const struct cpu_kernels *k = want && *want ? cpu_kernels_by_name(want) : NULL;
    // A typo or a table this CPU lacks would silently spoil a comparison.
    const bool unknown = want && *want && !k;
    bool known = false;
    for (size_t i = 0; unknown && i < sizeof tables_by_name / sizeof tables_by_name[0]; i++)
        known |= !strcmp(want, tables_by_name[i].name);
    if (!k) k = cpu_kernels_amx();
    if (!k) k = cpu_kernels_avx512();
    if (!k) k = cpu_kernels_avx2();
    if (!k) k = cpu_kernels_scalar();
    if (unknown)
        ms_log(MS_LOG_WARN, "MOESERVE_CPU_KERNELS=%s %s; ignored, %s taken", want,
               known ? "is a table this CPU cannot run" : "names no table (scalar, avx2, avx512, avx512_bf16 or amx)",
               k->name);
    return k;
}

size_t cpu_pack_block_bytes(enum dtype dt, int in)
{
    const size_t k = in > 0 ? (size_t)in : 0;
    if (dt == DTYPE_BF16) return (k + 1) / 2 * CPU_PACK_OUTS * 4;
    return k * CPU_PACK_OUTS * dtype_size(dt);
}

// The bytes of one block of w, quantized or not.
static size_t block_bytes_of(const struct cpu_wmat *w)
{
    if (w->quant != QUANT_NONE) return quant_block_bytes(w->quant, w->in, w->group);
    return cpu_pack_block_bytes(w->dtype, w->in);
}

size_t cpu_pack_bytes(const struct cpu_wmat *w)
{
    if (w->out <= 0 || w->in <= 0) return 0;
    return (size_t)((w->out + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS) * block_bytes_of(w);
}

void cpu_qpack_block(const struct quant_rows *r, void *dst)
{
    const int K = r->cols, ng = r->n_groups;
    const enum quant_format f = r->format;
    const size_t H = quant_block_header_bytes(f, K, r->group);
    char *d = dst;
    // Every byte is written once: the header's padding and the rows past
    // r->n are zeros, the rest is filled below (the block is usually being
    // touched for the first time: one pass, not a clear and a fill).
    const size_t hdr = (size_t)ng * (f == QUANT_INT4 ? 48 : 64);
    const size_t bb = quant_block_bytes(f, K, r->group);
    const size_t values = f == QUANT_INT4 ? (size_t)(K + 7) / 8 * 64 : (size_t)K * CPU_PACK_OUTS;
    memset(d + hdr, 0, H - hdr);
    memset(d + H + values, 0, bb - H - values);
    if (r->n < CPU_PACK_OUTS) memset(d, 0, bb);
    for (int j = 0; j < r->n && j < CPU_PACK_OUTS; j++) {
        const uint8_t *q = r->q + (size_t)j * K;
        for (int g = 0; g < ng; g++) {
            const float s = r->scale[(size_t)j * ng + g];
            if (f == QUANT_INT4) {
                const uint16_t h = ms_f32_to_f16(s);
                memcpy(d + (size_t)g * 48 + 2 * j, &h, 2);
                d[(size_t)g * 48 + 32 + j] = (char)r->zero[(size_t)j * ng + g];
            } else {
                memcpy(d + (size_t)g * 64 + 4 * j, &s, 4);
            }
        }
        if (f == QUANT_INT4) {
            int k8 = 0;
            for (; k8 * 8 + 8 <= K; k8++) {
                const uint8_t *p = q + k8 * 8;
                const uint32_t v = (p[0] & 15u) | (p[1] & 15u) << 4 | (p[2] & 15u) << 8 | (p[3] & 15u) << 12 |
                                   (p[4] & 15u) << 16 | (p[5] & 15u) << 20 | (p[6] & 15u) << 24 |
                                   (uint32_t)(p[7] & 15u) << 28;
                memcpy(d + H + (size_t)k8 * 64 + 4 * j, &v, 4);
            }
            if (k8 * 8 < K) {
                uint32_t v = 0;
                for (int i = 0; k8 * 8 + i < K; i++) v |= (uint32_t)(q[k8 * 8 + i] & 15u) << (4 * i);
                memcpy(d + H + (size_t)k8 * 64 + 4 * j, &v, 4);
            }
        } else {
            for (int k = 0; k < K; k++) d[H + (size_t)k * CPU_PACK_OUTS + j] = (char)q[k];
        }
    }
}

void cpu_qpack_dequant_row(const struct cpu_wmat *w, int o, float *out)
{
    const int K = w->in, G = w->group > 0 ? w->group : K, ng = quant_groups(K, G);
    const size_t bb = quant_block_bytes(w->quant, K, w->group);
    const size_t H = quant_block_header_bytes(w->quant, K, w->group);
    const uint8_t *blk = (const uint8_t *)w->packed + (size_t)(o / CPU_PACK_OUTS) * bb;
    const int j = o % CPU_PACK_OUTS;
    for (int g = 0; g < ng; g++) {
        const int k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
        if (w->quant == QUANT_INT4) {
            uint16_t h;
            memcpy(&h, blk + (size_t)g * 48 + 2 * j, 2);
            const float s = ms_f16_to_f32(h);
            const int z = blk[(size_t)g * 48 + 32 + j];
            for (int k = k0; k < k1; k++) {
                uint32_t v;
                memcpy(&v, blk + H + (size_t)(k / 8) * 64 + 4 * j, 4);
                out[k] = (float)((int)((v >> (4 * (k % 8))) & 15u) - z) * s;
            }
        } else {
            float s;
            memcpy(&s, blk + (size_t)g * 64 + 4 * j, 4);
            for (int k = k0; k < k1; k++) {
                const uint8_t q = blk[H + (size_t)k * CPU_PACK_OUTS + j];
                out[k] = (w->quant == QUANT_FP8 ? quant_fp8_to_f32(q) : (float)(int8_t)q) * s;
            }
        }
    }
}

void cpu_pack_blocks(const struct cpu_wmat *w, int b0, int b1, void *dst)
{
    const size_t K = (size_t)w->in, esz = dtype_size(w->dtype);
    char *d = dst;
    for (int b = b0; b < b1; b++) {
        for (int j = 0; j < CPU_PACK_OUTS; j++) {
            const int o = b * CPU_PACK_OUTS + j;
            const char *row = (const char *)w->data + (size_t)o * K * esz;
            if (w->dtype == DTYPE_BF16) {
                const uint16_t *src = (const uint16_t *)row;
                uint32_t *pd = (uint32_t *)d + j;
                for (size_t p = 0; p < (K + 1) / 2; p++) {
                    uint32_t lo = 0, hi = 0;
                    if (o < w->out) {
                        lo = src[2 * p];
                        if (2 * p + 1 < K) hi = src[2 * p + 1];
                    }
                    pd[p * CPU_PACK_OUTS] = lo | hi << 16;
                }
            } else {
                for (size_t k = 0; k < K; k++) {
                    char *e = d + (k * CPU_PACK_OUTS + (size_t)j) * esz;
                    if (o < w->out) memcpy(e, row + k * esz, esz);
                    else memset(e, 0, esz);
                }
            }
        }
        d += cpu_pack_block_bytes(w->dtype, w->in);
    }
}

const char *cpu_packed_blocks(const struct cpu_wmat *w, int b0, int b1, void *buf)
{
    if (w->packed) return (const char *)w->packed + (size_t)b0 * block_bytes_of(w);
    cpu_pack_blocks(w, b0, b1, buf);
    return buf;
}

struct cpu_wmat cpu_wmat_slice(const struct cpu_wmat *w, int o0, int n)
{
    struct cpu_wmat s = *w;
    // A matrix held only packed (dummy weights) has no rows to offset.
    if (w->data) s.data = (const char *)w->data + (size_t)o0 * (size_t)w->in * dtype_size(w->dtype);
    s.out = n;
    s.packed = NULL;
    if (w->packed && o0 % CPU_PACK_OUTS == 0)
        s.packed = (const char *)w->packed + (size_t)(o0 / CPU_PACK_OUTS) * block_bytes_of(w);
    return s;
}

size_t cpu_kernels_scratch_floats(int max_in, int max_q, int head_dim)
{
    size_t kp = ((size_t)(max_in > 0 ? max_in : 1) + 15) / 16 * 16;
    // The avx512 matmul: 256 KiB of packed blocks or one f32 block (16
    // floats per k) for weights not packed at load, 4 rows of slack, 16 x
    // rows transposed; the avx2 matmul: that, then a chunk of f16 weights
    // widened to fp32 (cpu_pk_scratch_floats, cpu_p2_scratch_floats).
    size_t mm = cpu_p2_scratch_floats(max_in);
    // The amx matmul: 256 KiB of packed blocks (or one bf16 block, 8 floats
    // per k, when that is more), a group of x rows split in two (32768
    // floats, or one 16-row tile when K is larger), four C tiles.
    const size_t amx = (8 * kp > 65536 ? 8 * kp : 65536) + (16 * kp > 32768 ? 16 * kp : 32768) + 1024;
    if (mm < amx) mm = amx;
    // Its quantized path: four blocks' weight tiles over a scale group of up to
    // 256 inputs (8192 floats), four C tiles, and 64 x rows (hi and lo, a
    // group sum per 32 inputs at most, 64 output sums each).
    const size_t amx_q = 8192 + 1024 + 16 + 64 * (kp + kp / 32 + 64);
    if (mm < amx_q) mm = amx_q;
    // (The FMA path's quantized matmuls of many rows use what is left of
    // this beyond their x rows for a chunk of weights in fp32, at most 512
    // KiB, when four blocks (avx512) or one (avx2) fit: K up to 2048 or
    // 8192 with the terms above. Wider matrices take their direct path.)
    // The avx512_bf16 matmul: 256 KiB of packed blocks (or one block, 8
    // floats per k) for weights not packed at load, then CPU_BF16_ROWS x rows
    // rounded to bf16 pairs (half a float per k each), so that a matmul of
    // that many rows rounds each row once.
    size_t bf = (8 * kp > 65536 ? 8 * kp : 65536) + (size_t)CPU_BF16_ROWS * kp / 2 + kp;
    // (Its quantized matmuls on VDPBF16PS take less: up to 6 rows
    // prepared for a tile, and fp8's and int8's pairs of a chunk of blocks
    // in what is left, at most 512 KiB, when four blocks fit.)
    // Its FMA path (where VDPBF16PS runs at half rate): the avx512 matmul's
    // scratch, then CPU_BF16_FMA_ROWS x rows rounded to bf16, as fp32.
    const size_t bf_fma = cpu_pk_scratch_floats(max_in) + (size_t)CPU_BF16_FMA_ROWS * kp;
    if (bf < bf_fma) bf = bf_fma;
    if (mm < bf) mm = bf;
    // Attention, per row: accumulator, max, sum in up to 16 lanes, its query
    // transposed; a padding row's accumulator; a row group's 16
    // probabilities each; a key block's keys and values widened to fp32;
    // the queries of 16 padding rows.
    size_t rows = (size_t)max_q * CPU_ATTN_TILE;
    size_t at = rows * (2 * (size_t)head_dim + 17) + (size_t)head_dim + 16 * 16 + 2 * 16 * (size_t)head_dim +
                16 * (size_t)head_dim + 64;
    return (mm > at ? mm : at) + 16;
}
