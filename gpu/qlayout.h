// qlayout: how the CUDA backend holds a quantized matrix (model/quant.h's
// fp8, int8 and int4) in device memory, in plain C shared by the host packer
// (qlayout.c), the kernels (qgemm.cu, qmake.cu) and the CPU tests
// (tests/gpu/test_qlayout.c).
//
// The layout is a permutation, block by block, of model/quant.h's packed
// one: the same blocks of QUANT_BLOCK_ROWS (16) outputs, each of
// quant_block_bytes(f, K, G) bytes with a header of
// quant_block_header_bytes(f, K, G) bytes, so that the GPU holds exactly
// the bytes the loader and the planner count (tensor_bytes). Within a
// block the bytes are ordered for the tensor-core kernel: lane (j, t) of a
// warp (j = lane / 4, t = lane % 4) computes outputs j and j + 8 of the
// block over inputs 8t..8t+7 of each 32-input step, and finds them in one
// aligned 16-byte (fp8, int8) or 8-byte (int4) load, the warp's loads
// covering one contiguous stretch.
//
// Header, per group g of G inputs (j = 0..7):
//   fp8 / int8: at 64 g + 8 j: fp32 {s[j], s[j + 8]}
//   int4:       at 48 g + 4 j: fp16 {s[j], s[j + 8]};
//               at 48 g + 32 + 2 j: uint8 {z[j], z[j + 8]}
// Values, after the header, in units of 8 inputs (unit u: inputs 8u..8u+7):
//   fp8 / int8: unit u at 128 u; at 128 u + 16 j: row j's 8 codes (byte i:
//               input 8u + i), then row j + 8's. A last unit of v < 8 inputs
//               (K % 8) has 16 v bytes, input-major: row r's input 8u + i
//               at 128 u + 16 i + r.
//   int4:       unit u at 64 u; at 64 u + 8 j: row j's dword, then row
//               j + 8's (nibble i, bits 4i..4i+3: input 8u + i); inputs
//               past K hold 0.
// Rows past the matrix's last (the last block's padding) are zero.
#ifndef MOESERVE_GPU_QLAYOUT_H
#define MOESERVE_GPU_QLAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define QL_FN static inline __host__ __device__
#else
#define QL_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

#include "base/base.h"
#include "model/quant.h"

#define QL_STEP 32 // inputs per step of the tensor-core kernel (4 units)

// Header bytes of group g's entry.
QL_FN int ql_group_stride(enum quant_format f) { return f == QUANT_INT4 ? 48 : 64; }

// Byte offset, from the block's start, of row r's scale in group g (an
// fp32, or an fp16 for int4), and of its zero point (int4).
QL_FN size_t ql_scale_off(enum quant_format f, int g, int r)
{
    const size_t base = (size_t)g * (size_t)ql_group_stride(f);
    return f == QUANT_INT4 ? base + 4 * (size_t)(r % 8) + 2 * (size_t)(r / 8)
                           : base + 8 * (size_t)(r % 8) + 4 * (size_t)(r / 8);
}
QL_FN size_t ql_zero_off(int g, int r)
{
    return (size_t)g * 48 + 32 + 2 * (size_t)(r % 8) + (size_t)(r / 8);
}

// Offset, from the values' start, of lane j's load of unit u: 16 bytes
// (fp8, int8; a whole unit) or 8 bytes (int4).
QL_FN size_t ql_unit_off(enum quant_format f, int u, int j)
{
    return f == QUANT_INT4 ? 64 * (size_t)u + 8 * (size_t)j : 128 * (size_t)u + 16 * (size_t)j;
}

// Where row r's input k is, from the values' start: the byte, and for int4
// the shift of its nibble in that byte.
QL_FN size_t ql_value_off(enum quant_format f, int K, int r, int k, int *shift)
{
    const int u = k / 8, i = k % 8;
    if (f == QUANT_INT4) {
        *shift = 4 * (i % 2);
        return ql_unit_off(f, u, r % 8) + 4 * (size_t)(r / 8) + (size_t)(i / 2);
    }
    *shift = 0;
    if (8 * u + 8 <= K) return ql_unit_off(f, u, r % 8) + 8 * (size_t)(r / 8) + (size_t)i;
    return 128 * (size_t)u + 16 * (size_t)i + (size_t)r;
}

// Whether the tensor-core kernel reads the matrix: every group boundary
// falls on a 32-input step (so that each step's sum takes one scale) and the
// outputs start on a block. Other groups (a GPTQ group_size of 8 to 24, an
// odd FP8 block) and output slices take the plain kernel.
QL_FN int ql_tensor_cores(int K, int G, int o0)
{
    return (G % QL_STEP == 0 || G >= K) && o0 % QUANT_BLOCK_ROWS == 0;
}

// The inputs [*k0, *k1) that warp w of nw adds up in the tensor-core kernel:
// K in whole steps, split into nw runs of equal steps (the last may be
// short or empty), so that every output is summed in one order whatever the
// rows around it.
QL_FN void ql_warp_inputs(int K, int w, int nw, int *k0, int *k1)
{
    const int steps = (K + QL_STEP - 1) / QL_STEP, per = (steps + nw - 1) / nw;
    const int a = w * per * QL_STEP, b = (w + 1) * per * QL_STEP;
    *k0 = a < K ? a : K;
    *k1 = b < K ? b : K;
}

// Host only: the canonical rows r (r->n <= 16 of them, model/quant.h) as
// one block at dst (quant_block_bytes(r->format, r->cols, r->group) bytes,
// 8-byte aligned), every byte written.
void ql_pack_block(const struct quant_rows *r, void *dst);

// ---- codes to bf16, as the tensor-core kernel turns them (in registers) ----
// A lane holds a unit's codes of one output as w0 (inputs 0..3, byte i:
// input i) and w1 (inputs 4..7) for fp8 / int8, or one dword (nibble i:
// input i) for int4, and makes bf16 pairs (input i, input i + 4), i = 0..3,
// low half first: the mma's A registers. Exact for every code. The host
// copies of the device intrinsics let the CPU tests run these very lines.

// __byte_perm: byte n of the result is byte (s >> 4n) & 7 of y:x (every
// selector here has its sign-replicate bit clear).
QL_FN uint32_t ql_byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
#if defined(__CUDA_ARCH__)
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
    return r;
#endif
}

// fp8: the pair's bf16 bits times 2^-120: the code's magnitude bits shifted
// into the bf16's low exponent bits and mantissa (subnormals become bf16
// subnormals), its sign in place; a bf16 multiply by 2^120 (QL_BF16_2P120
// in each half) gives the value exactly, the NaN codes reading as +-480.
#define QL_BF16_2P120 0x7b807b80u
QL_FN uint32_t ql_fp8_pair_bits(uint32_t w0, uint32_t w1, int i)
{
    const uint32_t u = ql_byte_perm(w0, w1, (uint32_t)(i | i << 4 | (4 + i) << 8 | (4 + i) << 12));
    return (u & 0x80008000u) | ((u >> 4) & 0x07f007f0u);
}

QL_FN float ql_fsub(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

// int8: offset binary (the code xor 0x80) under 2^23 as an fp32, minus
// 2^23 + 128, is the code exactly; an integer of 8 bits is its fp32's top
// half, which is its bf16.
QL_FN uint32_t ql_int8_pair(uint32_t w0, uint32_t w1, int i)
{
    const uint32_t sel = 0x7540u + (uint32_t)i, m0 = ql_byte_perm(w0 ^ 0x80808080u, 0x4b000000u, sel);
    const uint32_t m1 = ql_byte_perm(w1 ^ 0x80808080u, 0x4b000000u, sel);
    float a, b;
    memcpy(&a, &m0, sizeof a);
    memcpy(&b, &m1, sizeof b);
    a = ql_fsub(a, 8388736.0f);
    b = ql_fsub(b, 8388736.0f);
    uint32_t ua, ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    return ql_byte_perm(ua, ub, 0x7632u);
}

// int4: the bf16 pair of 128 + q (0x4300 | q); a bf16 subtraction of
// ql_int4_zero(z) (128 + z in both halves) gives q - z exactly.
QL_FN uint32_t ql_int4_pair_bits(uint32_t d, int i)
{
    return ((d >> (4 * i)) & 0x000f000fu) | 0x43004300u;
}
QL_FN uint32_t ql_int4_zero(uint32_t z) { return (0x4300u + z) * 0x10001u; }

QL_FN float ql_f16_to_f32(uint16_t h)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    return ms_f16_to_f32(h);
#endif
}

// Row r's input k of the block at blk (a matrix of K inputs, groups of G,
// header_bytes = quant_block_header_bytes), dequantized by model/quant.h's
// formula: the weight the kernels multiply by (the plain kernel reads it
// so; the tests check every offset with it).
QL_FN float ql_value(const uint8_t *blk, size_t header_bytes, enum quant_format f, int K, int G,
                     int r, int k)
{
    const int g = k / (G > 0 ? G : K);
    int shift;
    const uint8_t q = blk[header_bytes + ql_value_off(f, K, r, k, &shift)];
    if (f == QUANT_INT4) {
        uint16_t h;
        memcpy(&h, blk + ql_scale_off(f, g, r), sizeof h);
        const int z = blk[ql_zero_off(g, r)];
        return (float)((int)((q >> shift) & 15u) - z) * ql_f16_to_f32(h);
    }
    float s;
    memcpy(&s, blk + ql_scale_off(f, g, r), sizeof s);
    return f == QUANT_FP8 ? quant_fp8_to_f32(q) * s : (float)(int8_t)q * s;
}

#ifdef __cplusplus
}
#endif

#endif
