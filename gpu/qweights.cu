// qweights: a quantized matrix into device memory, in gpu/qlayout.h's
// blocks (tensor_bytes(t) bytes, what the loader and the planner count):
// made on the device from what the checkpoint holds — the dummy recipe or
// the bf16/f16/f32 rows quantized at load (model/quant.h's formulas, the
// same bits as the CPU's quant_rows_quantize), the FP8 codes with their
// block scales, the GPTQ nibbles with their scales and zero points — or,
// for groups that split a unit of 8 inputs (an FP8 block width off the
// multiples of 8), packed on the host from quant_tensor_rows and uploaded.
// The GPU test compares both ways bit for bit.
#include "gpu/kernels.cuh"

#include <stdlib.h>

#include "gpu/qlayout.h"

struct qmake_params {
    struct tensor t;             // the recipe, dtype and quant of the matrix (its host pointers unused)
    const void *data;            // device copy of t.data (NULL: a dummy)
    const void *scale, *zeros;   // device copies of t.quant.scale / zeros (FP8, GPTQ)
    int rows, K, G, ng;
    enum quant_format f;
    size_t block_bytes;
    int header_bytes;
    uint8_t *dst;
};

// Row o's input k as the at-load quantizer sees it: the stored value, or
// the dummy's rounded to the tensor's dtype (quant.c's plain_row).
__device__ __forceinline__ float qm_plain(const qmake_params &p, int o, int k)
{
    const size_t i = (size_t)o * (size_t)p.K + (size_t)k;
    if (p.data) return load_elem(p.data, p.t.dtype, i);
    const float v = tensor_dummy_value(&p.t, i);
    switch (p.t.dtype) {
    case DTYPE_BF16: return bf16_to_f32(f32_to_bf16(v));
    case DTYPE_F16: return f16_to_f32(f32_to_f16(v));
    default: return v;
    }
}

// The smallest fp16 value >= s (s >= 0, finite): quant.c's f16_at_least.
__device__ __forceinline__ float qm_f16_at_least(float s)
{
    const uint16_t b = f32_to_f16(s);
    const float h = f16_to_f32(b);
    return h < s ? f16_to_f32((uint16_t)(b + 1)) : h;
}

// One group's scale and zero point at load from its range [lo, hi] (0 in
// it): quant_rows_quantize's rules.
__device__ __forceinline__ void qm_params(enum quant_format f, float lo, float hi, float *s, float *zf)
{
    const float amax = fmaxf(hi, -lo);
    *zf = 0.0f;
    if (f == QUANT_FP8) {
        *s = amax / 448.0f;
    } else if (f == QUANT_INT8) {
        *s = amax / 127.0f;
    } else {
        *s = hi > lo ? qm_f16_at_least(fminf((hi - lo) / 15.0f, 65504.0f)) : 0.0f; // fp16's largest at most
        float z = *s > 0 ? rintf(-lo / *s) : 8.0f;
        *zf = z < 0.0f ? 0.0f : z > 15.0f ? 15.0f : z;
    }
}

// One value's code at load (quant_rows_quantize, int4_values).
__device__ __forceinline__ uint32_t qm_code(enum quant_format f, float w, float s, float zf)
{
    const bool fin = w - w == 0.0f;
    if (f == QUANT_FP8) return s > 0 && fin ? quant_f32_to_fp8(w / s) : 0u;
    if (f == QUANT_INT8) {
        float v = s > 0 && fin ? rintf(w / s) : 0.0f;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        return (uint32_t)(uint8_t)(int8_t)v;
    }
    const float v = fin ? w : 0.0f;
    float x = s > 0 ? rintf(v / s) + zf : zf;
    x = x < 0.0f ? 0.0f : x > 15.0f ? 15.0f : x;
    return (uint32_t)(int)x;
}

// Row o's codes of unit u (8 inputs from 8u, zeros past K) from a
// quantized checkpoint: fp8 bytes (w0: inputs 0..3, w1: 4..7) or the GPTQ
// dword, which is already a unit (nibble i: input 8u + i).
__device__ __forceinline__ void qm_stored_unit(const qmake_params &p, int o, int u, uint32_t *w0,
                                               uint32_t *w1)
{
    *w0 = *w1 = 0;
    if (p.t.quant.source == QUANT_SRC_GPTQ) {
        *w0 = reinterpret_cast<const uint32_t *>(p.data)[(size_t)u * (size_t)p.rows + (size_t)o];
        return;
    }
    const uint8_t *row = reinterpret_cast<const uint8_t *>(p.data) + (size_t)o * (size_t)p.K;
    for (int i = 0; i < 8 && 8 * u + i < p.K; i++) {
        const uint32_t b = row[8 * u + i];
        if (i < 4) *w0 |= b << (8 * i);
        else *w1 |= b << (8 * (i - 4));
    }
}

// Writes row j's codes of unit u into the block's values (fp8 / int8: w0
// inputs 0..3, w1 4..7; int4: w0 the dword).
__device__ __forceinline__ void qm_put_unit(const qmake_params &p, uint8_t *val, int j, int u,
                                            uint32_t w0, uint32_t w1)
{
    if (p.f == QUANT_INT4) {
        *reinterpret_cast<uint32_t *>(val + ql_unit_off(p.f, u, j % 8) + 4 * (size_t)(j / 8)) = w0;
    } else if (8 * u + 8 <= p.K) {
        *reinterpret_cast<uint2 *>(val + ql_unit_off(p.f, u, j % 8) + 8 * (size_t)(j / 8)) =
            make_uint2(w0, w1);
    } else {
        for (int i = 0; 8 * u + i < p.K; i++) {
            int sh;
            val[ql_value_off(p.f, p.K, j, 8 * u + i, &sh)] = (uint8_t)((i < 4 ? w0 >> (8 * i) : w1 >> (8 * (i - 4))) & 0xffu);
        }
    }
}

// One CTA per (block of 16 outputs, group): 16 threads per output, each
// taking every 16th unit of the group. Groups hold whole units (qm_device).
__global__ void __launch_bounds__(256) qmake_kernel(const qmake_params p)
{
    const int j = (int)threadIdx.x / 16, l = (int)threadIdx.x % 16, g = (int)blockIdx.y;
    // The padding rows past the matrix stay zero: their threads compute the
    // last row again (the shuffles need every lane) and write nothing.
    const bool live = (int)blockIdx.x * QUANT_BLOCK_ROWS + j < p.rows;
    const int o = live ? (int)blockIdx.x * QUANT_BLOCK_ROWS + j : p.rows - 1;
    uint8_t *blk = p.dst + (size_t)blockIdx.x * p.block_bytes, *val = blk + p.header_bytes;
    const int k0 = g * p.G, k1 = min(p.K, k0 + p.G), u0 = k0 / 8, u1 = (k1 + 7) / 8;
    const enum quant_source src = p.t.quant.source;
    float s, zf = 0.0f;
    if (src == QUANT_SRC_AT_LOAD) {
        float lo = 0.0f, hi = 0.0f; // quant.c's group_range: non-finite values read as 0
        for (int u = u0 + l; u < u1; u += 16)
            for (int i = 0; i < 8 && 8 * u + i < k1; i++) {
                float v = qm_plain(p, o, 8 * u + i);
                v = v - v == 0.0f ? v : 0.0f;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
        for (int m = 8; m > 0; m >>= 1) {
            const float a = __shfl_xor_sync(0xffffffffu, lo, m, 16);
            const float b = __shfl_xor_sync(0xffffffffu, hi, m, 16);
            lo = a < lo ? a : lo;
            hi = b > hi ? b : hi;
        }
        qm_params(p.f, lo, hi, &s, &zf);
    } else if (src == QUANT_SRC_FP8) {
        const int br = p.t.quant.block_rows > 0 ? p.t.quant.block_rows : p.rows;
        s = load_elem(p.scale, p.t.quant.scale_dtype, (size_t)(o / br) * (size_t)p.ng + (size_t)g);
    } else {
        s = f16_to_f32(reinterpret_cast<const uint16_t *>(p.scale)[(size_t)g * p.rows + o]);
        const uint32_t word = reinterpret_cast<const uint32_t *>(p.zeros)[(size_t)g * (p.rows / 8) + o / 8];
        zf = (float)(((word >> (4 * (o % 8))) & 15u) + (uint32_t)p.t.quant.zero_offset);
    }
    if (!live) return;
    if (l == 0) {
        if (p.f == QUANT_INT4) {
            *reinterpret_cast<uint16_t *>(blk + ql_scale_off(p.f, g, j)) = f32_to_f16(s);
            blk[ql_zero_off(g, j)] = (uint8_t)zf;
        } else {
            *reinterpret_cast<float *>(blk + ql_scale_off(p.f, g, j)) = s;
        }
    }
    for (int u = u0 + l; u < u1; u += 16) {
        uint32_t w0 = 0, w1 = 0;
        if (src != QUANT_SRC_AT_LOAD) {
            qm_stored_unit(p, o, u, &w0, &w1);
        } else {
            for (int i = 0; i < 8 && 8 * u + i < k1; i++) {
                const uint32_t q = qm_code(p.f, qm_plain(p, o, 8 * u + i), s, zf);
                if (p.f == QUANT_INT4) w0 |= q << (4 * i);
                else if (i < 4) w0 |= q << (8 * i);
                else w1 |= q << (8 * (i - 4));
            }
        }
        qm_put_unit(p, val, j, u, w0, w1);
    }
}

// Whether qmake_kernel can make t: every group holds whole units of 8
// inputs (and a GPTQ matrix is whole dwords, which its loader checks).
static bool qm_device(const struct tensor *t)
{
    const int K = (int)t->shape[1], G = t->quant.group > 0 ? t->quant.group : K;
    return G % 8 == 0 || G >= K;
}

// Device scratch for a checkpoint's tensor on its way (grown, never shrunk).
// The last tensor's qmake_kernel on s may still read the old buffer: s is
// drained before it is freed.
static cudaError_t stage_need(cudaStream_t s, struct cuda_qstage *st, size_t bytes)
{
    if (bytes <= st->cap) return cudaSuccess;
    if (st->p) {
        cudaError_t e = cudaStreamSynchronize(s);
        if (e == cudaSuccess) e = cudaFree(st->p);
        if (e != cudaSuccess) return e;
    }
    st->p = nullptr;
    st->cap = 0;
    cudaError_t e = cudaMalloc(&st->p, bytes);
    if (e != cudaSuccess) {
        st->p = nullptr;
        return e;
    }
    st->cap = bytes;
    return cudaSuccess;
}

void cuda_qstage_free(struct cuda_qstage *st)
{
    cuda_release_check(cudaFree(st->p), "the quantized staging buffer");
    st->p = nullptr;
    st->cap = 0;
}

static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

// The bytes of t's companions on the host: its stored data, scales, zeros.
static void stored_sizes(const struct tensor *t, size_t *data, size_t *scale, size_t *zeros)
{
    const struct tensor_quant *q = &t->quant;
    const size_t rows = (size_t)t->shape[0], K = (size_t)t->shape[1];
    const size_t ng = (size_t)quant_groups((int)K, q->group);
    *data = *scale = *zeros = 0;
    switch (q->source) {
    case QUANT_SRC_AT_LOAD: *data = t->data ? rows * K * dtype_size(t->dtype) : 0; break;
    case QUANT_SRC_FP8: {
        const size_t br = q->block_rows > 0 ? (size_t)q->block_rows : rows;
        *data = rows * K;
        *scale = (rows + br - 1) / br * ng * dtype_size(q->scale_dtype);
        break;
    }
    case QUANT_SRC_GPTQ:
    case QUANT_SRC_AWQ:
        *data = K / 8 * rows * 4; // the same dwords, (K / 8, rows) or (K, rows / 8)
        *scale = ng * rows * (q->source == QUANT_SRC_AWQ ? dtype_size(q->scale_dtype) : 2);
        *zeros = ng * (rows / 8) * 4;
        break;
    case QUANT_SRC_CT: { // made on the host (below): the sizes only for completeness
        const size_t per = q->format == QUANT_INT4 ? 8 : 4;
        *data = rows * ((K + per - 1) / per) * 4;
        *scale = rows * ng * dtype_size(q->scale_dtype);
        *zeros = !q->zeros ? 0 : q->zeros_i8 ? rows * ng : (rows + 7) / 8 * ng * 4;
        break;
    }
    }
}

// The host way: canonical rows (quant_tensor_rows), packed block by block.
static cudaError_t fill_on_host(cudaStream_t s, const struct tensor *t, void *dst)
{
    const int rows = (int)t->shape[0], K = (int)t->shape[1];
    const enum quant_format f = t->quant.format;
    const int G = t->quant.group > 0 ? t->quant.group : K;
    const size_t bb = quant_block_bytes(f, K, G), n_blocks = (size_t)(rows + 15) / 16;
    const size_t qb = quant_rows_bytes(QUANT_BLOCK_ROWS, K, f, G);
    char *h = (char *)malloc(n_blocks * bb + qb + (size_t)K * sizeof(float));
    if (!h) return cudaErrorMemoryAllocation;
    char *buf = h + n_blocks * bb;
    struct quant_rows r;
    quant_rows_init(&r, buf, QUANT_BLOCK_ROWS, K, f, G);
    for (size_t b = 0; b < n_blocks; b++) {
        const int o = (int)b * QUANT_BLOCK_ROWS;
        r.n = rows - o < QUANT_BLOCK_ROWS ? rows - o : QUANT_BLOCK_ROWS;
        quant_tensor_rows(t, o, r.n, &r, (float *)(buf + qb));
        ql_pack_block(&r, h + b * bb);
    }
    // From pageable memory the copy has taken h when it returns.
    cudaError_t e = cudaMemcpyAsync(dst, h, n_blocks * bb, cudaMemcpyHostToDevice, s);
    free(h);
    return e;
}

cudaError_t cuda_qweight_fill(cudaStream_t s, const struct tensor *t, void *dst, struct cuda_qstage *st)
{
    if (t->ndim != 2 || t->quant.format == QUANT_NONE) return cudaErrorInvalidValue;
    qmake_params p;
    memset(&p, 0, sizeof p);
    p.t = *t;
    p.rows = (int)t->shape[0];
    p.K = (int)t->shape[1];
    p.f = t->quant.format;
    p.G = t->quant.group > 0 ? t->quant.group : p.K;
    p.ng = quant_groups(p.K, p.G);
    const size_t n_blocks = (size_t)(p.rows + 15) / 16;
    // AWQ's words hold 8 outputs of one input, and compressed-tensors'
    // values are offset and laid out by row, where the kernel takes a word
    // of 8 inputs of one output (GPTQ's): those are made on the host.
    if (!qm_device(t) || t->quant.source == QUANT_SRC_AWQ || t->quant.source == QUANT_SRC_CT || p.ng > 65535 ||
        n_blocks > 0x7fffffff)
        return fill_on_host(s, t, dst);
    p.block_bytes = quant_block_bytes(p.f, p.K, p.G);
    p.header_bytes = (int)quant_block_header_bytes(p.f, p.K, p.G);
    p.dst = (uint8_t *)dst;
    size_t db, sb, zb;
    stored_sizes(t, &db, &sb, &zb);
    cudaError_t e = stage_need(s, st, round256(db) + round256(sb) + round256(zb));
    if (e != cudaSuccess) return e;
    char *d = (char *)st->p;
    const void *parts[3] = {t->data, t->quant.scale, t->quant.zeros};
    const size_t sizes[3] = {db, sb, zb};
    const void **outs[3] = {&p.data, &p.scale, &p.zeros};
    for (int i = 0; i < 3; i++) {
        if (!sizes[i] || !parts[i]) continue;
        if ((e = cudaMemcpyAsync(d, parts[i], sizes[i], cudaMemcpyHostToDevice, s)) != cudaSuccess) return e;
        *outs[i] = d;
        d += round256(sizes[i]);
    }
    if ((e = cudaMemsetAsync(dst, 0, n_blocks * p.block_bytes, s)) != cudaSuccess) return e;
    qmake_kernel<<<dim3((unsigned)n_blocks, (unsigned)p.ng), 256, 0, s>>>(p);
    return launch_status();
}
