// quant: the weight formats moeserve computes with besides bf16/f16/f32 — FP8
// e4m3 with per-block scales, int8 with per-group scales, int4 with
// per-group scales and zero points — their formulas, quantization at load
// (--quantization), and the reading of quantized checkpoints (FP8
// block-wise, 4-bit GPTQ and AWQ, compressed-tensors int4, int8 and FP8)
// into one canonical row form that every backend packs from. Weights only:
// activations stay in fp32.
//
// The formulas (w: the weight a matmul multiplies by, q: the stored value,
// s: its group's scale, z: its group's zero point):
//   QUANT_FP8:  w = e4m3(q) * s      q an e4m3fn code (1 sign, 4 exponent bits
//                                    with bias 7, 3 mantissa bits); the two NaN
//                                    codes 0x7f / 0xff read as +-480
//   QUANT_INT8: w = q * s            q in -127..127 (-128 too where a
//                                    compressed-tensors checkpoint stores it)
//   QUANT_INT4: w = (q - z) * s      q in 0..15, z in 0..16 (GPTQ's v1 format
//                                    stores z - 1, hence 16)
// A group is G consecutive inputs of one output row (the last group of a
// row may be shorter); FP8 checkpoints share one scale over a block of
// block_rows outputs too, which the canonical form repeats per row.
#ifndef MOESERVE_MODEL_QUANT_H
#define MOESERVE_MODEL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/config.h"

enum quant_format {
    QUANT_NONE = 0, // the values as stored (bf16, f16, f32)
    QUANT_FP8,
    QUANT_INT8,
    QUANT_INT4,
};
const char *quant_format_name(enum quant_format f); // "none", "fp8", "int8", "int4"
// "fp8", "int8", "int4" (and "none"); MS_EINVAL otherwise.
int quant_format_parse(const char *s, enum quant_format *out);

// Inputs per scale group when moeserve quantizes at load (and in the planner).
#define QUANT_GROUP 128

// The format a config's quantization_config stores the projections in
// (QUANT_NONE without one), and the inputs per scale group that format's
// matrices have: the checkpoint's own (GPTQ's group_size, FP8's block
// columns; 0 for one group a row) where it stores f, else QUANT_GROUP.
enum quant_format quant_config_format(const struct model_config *cfg);
int quant_config_group(const struct model_config *cfg, enum quant_format f);
// Rows of a quantized block (the packed layout below).
#define QUANT_BLOCK_ROWS 16

// Where a quantized matrix's values come from.
enum quant_source {
    QUANT_SRC_AT_LOAD = 0, // tensor data (or a dummy recipe) in bf16/f16/f32, quantized at load
    QUANT_SRC_FP8,         // data: F8_E4M3 (rows, cols); scale: (ceil(rows / block_rows),
                           // ceil(cols / group)) in scale_dtype (weight_scale_inv)
    QUANT_SRC_GPTQ,        // data: qweight I32 (cols / 8, rows), value (k, o) in bits
                           // 4 (k % 8) of word (k / 8, o); scale: F16 (ceil(cols / group),
                           // rows); zeros: qzeros I32 (ceil(cols / group), rows / 8)
    QUANT_SRC_AWQ,         // data: qweight I32 (cols, rows / 8), value (k, o) in nibble
                           // quant_awq_nibble(o % 8) of word (k, o / 8); scale: scale_dtype
                           // (ceil(cols / group), rows); zeros: qzeros I32 (ceil(cols / group),
                           // rows / 8), packed as qweight, stored as they are
    QUANT_SRC_CT,          // compressed-tensors pack-quantized, b = 4 or 8 bits (the format's
                           // width), p = 32 / b: data: weight_packed I32 (rows, ceil(cols / p)),
                           // value (o, k) in bits b (k % p) of word (o, k / p), stored plus 2^(b-1);
                           // scale: scale_dtype (rows, groups); zeros (int4, asymmetric): I32
                           // (ceil(rows / 8), groups) packed along the outputs as the values, or
                           // (zeros_i8) I8 (rows, groups) signed; NULL when symmetric (8)
};

// How one matrix of a model is quantized (struct tensor.quant). format
// QUANT_NONE: not quantized, the tensor's data holds its values.
struct tensor_quant {
    enum quant_format format;  // what the backend holds
    enum quant_source source;
    int group;                 // inputs per scale group (the last one of a row may be shorter)
    int block_rows;            // QUANT_SRC_FP8: outputs sharing a scale (else 1)
    const void *scale;         // QUANT_SRC_FP8 / GPTQ: the checkpoint's scales (host memory)
    enum dtype scale_dtype;
    const void *zeros;         // QUANT_SRC_GPTQ / AWQ: qzeros
    int zero_offset;           // QUANT_SRC_GPTQ: added to a stored zero point (1: v1, 0: v2)
    bool sym;                  // QUANT_SRC_GPTQ: symmetric (informational; z is read either way)
    bool zeros_i8;             // QUANT_SRC_CT: zero points stored unpacked, I8 (before compressed-tensors 0.10)
    // QUANT_SRC_GPTQ / CT, an act-order checkpoint (GPTQ's desc_act,
    // compressed-tensors' actorder group), whose g_idx puts the inputs in
    // groups out of their order: (cols) input j of the canonical rows is
    // the checkpoint's input perm[j], so that each group's inputs are
    // consecutive there (j / group); the matmul reads x through the same
    // order (struct backend_mat.perm). NULL: the stored order. Host
    // memory the model owns.
    const int32_t *perm;
    // An MLP's gate or up projection whose down projection has a perm:
    // (rows) output o of the canonical rows is the checkpoint's output
    // row_perm[o] (down's perm), so that silu(gate) * up comes out in the
    // order down reads, and down's perm_folded says its inputs arrive so,
    // with no gather before it. NULL: the stored order. Host memory the
    // model owns.
    const int32_t *row_perm;
    bool perm_folded;
};

// Groups of a row of cols inputs.
static inline int quant_groups(int cols, int group)
{
    return group > 0 ? (cols + group - 1) / group : 1;
}

// ---- the formulas ----------------------------------------------------------------
#if defined(__CUDACC__)
#define QUANT_FN static inline __host__ __device__ // the CUDA kernels read the same formulas
#else
#define QUANT_FN static inline
#endif

// The nibble of an AWQ word that holds output 8j + i: AutoAWQ packs a
// word's outputs in the order 0, 2, 4, 6, 1, 3, 5, 7, so output i sits in
// nibble 0, 4, 1, 5, 2, 6, 3, 7.
QUANT_FN int quant_awq_nibble(int i) { return (int)((0x73625140u >> (4 * (i & 7))) & 15u); }

// e4m3fn code -> fp32, exactly: the magnitude bits shifted into an fp32's
// exponent and mantissa give the value times 2^-120 (normals and subnormals
// alike), then the sign.
QUANT_FN float quant_fp8_to_f32(uint8_t q)
{
    const uint32_t bits = (uint32_t)(q & 0x7f) << 20;
    float f;
    memcpy(&f, &bits, sizeof f);
    f *= 0x1p120f;
    return q & 0x80 ? -f : f;
}
// fp32 -> e4m3fn code, rounding to nearest even, saturating at +-448.
// Subnormals (below 2^-6) are multiples of 2^-9: rint rounds to even. Normals
// keep 3 of the fp32 mantissa's 23 bits, rounded to nearest even; a carry
// out of the mantissa moves to the next binade.
QUANT_FN uint8_t quant_f32_to_fp8(float x)
{
    if (x != x) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0x1p-6f) return sign | (uint8_t)rintf(a * 0x1p9f); // 8 is the smallest normal's code
    uint32_t bits;
    memcpy(&bits, &a, sizeof bits);
    int e = (int)(bits >> 23) - 127;
    uint32_t m = (bits >> 20) & 7u;
    const uint32_t rest = bits & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) m++;
    if (m == 8) {
        m = 0;
        e++;
    }
    const uint32_t code = (uint32_t)(e + 7) << 3 | m;
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

// ---- canonical rows: what a backend packs from ----------------------------------
// Rows [r0, r0 + n) of a quantized (rows, cols) matrix, one byte per value
// whatever the format: fp8 codes, int8 as two's complement, int4 0..15.
struct quant_rows {
    enum quant_format format;
    int n, cols, group, n_groups;
    uint8_t *q;      // (n, cols)
    float *scale;    // (n, n_groups)
    uint8_t *zero;   // (n, n_groups) int4 zero points (0..16); unused otherwise
};

// w for row i, input k.
static inline float quant_rows_value(const struct quant_rows *r, int i, int k)
{
    const int g = k / (r->group > 0 ? r->group : r->cols);
    const float s = r->scale[(size_t)i * r->n_groups + g];
    const uint8_t q = r->q[(size_t)i * r->cols + k];
    switch (r->format) {
    case QUANT_FP8: return quant_fp8_to_f32(q) * s;
    case QUANT_INT8: return (float)(int8_t)q * s;
    case QUANT_INT4: return (float)((int)q - (int)r->zero[(size_t)i * r->n_groups + g]) * s;
    default: return 0.0f;
    }
}

// Bytes of the buffers quant_rows_init lays out for n rows (and the fp32
// scratch quant_tensor_rows needs for one row of values).
size_t quant_rows_bytes(int n, int cols, enum quant_format f, int group);
// Points r's arrays into buf (quant_rows_bytes(n, ...) bytes, 8-byte aligned).
void quant_rows_init(struct quant_rows *r, void *buf, int n, int cols, enum quant_format f, int group);

// Quantizes one row of values (w, cols) into row i of r, with the group
// scales at load time chooses:
//   fp8:  s = max|w| / 448 over the group;        q = fp8(w / s)
//   int8: s = max|w| / 127;                       q = round(w / s)
//   int4: the group's range with 0 in it, [lo, hi], s = (hi - lo) / 15
//         rounded up to an fp16 value, z = round(-lo / s), q = clamp(round(w / s) + z, 0, 15)
// (an all-zero group gets s = 0: every w reads back 0).
void quant_rows_quantize(struct quant_rows *r, int i, const float *w);

// GPTQ's 4-bit rule for one row (make-model writes checkpoints with it):
// symmetric, s = 2 max|w| / 15 and z = 8; else as quant_rows_quantize's
// int4 but z >= 1 (the v1 format stores z - 1 in 4 bits).
void quant_rows_quantize_gptq(struct quant_rows *r, int i, const float *w, bool sym);

struct tensor; // model/model.h

// Rows [r0, r0 + n) of a quantized matrix tensor (t->quant.format !=
// QUANT_NONE) in canonical form: read from a quantized checkpoint's
// tensors (rows and inputs in t->quant.row_perm's and perm's orders where
// it has them), or made from
// its values (the mapped data, or the dummy recipe, rounded to the
// tensor's dtype first) and quantized. r must have been laid
// out for n rows of t's format and group; tmp holds t's cols floats.
// Thread-safe: reads t only.
void quant_tensor_rows(const struct tensor *t, int r0, int n, struct quant_rows *r, float *tmp);

// ---- what a backend holds ---------------------------------------------------------
// The packed layout every backend of moeserve holds a quantized matrix in
// on the host side, and the byte count the loader and the planner use:
// blocks of QUANT_BLOCK_ROWS outputs (the last one padded with zero rows),
// each a header of every group's scales (and zero points) followed by the
// values of its 16 rows, input-major, 64-byte aligned:
//   header, per group g: fp8 / int8: 16 fp32 scales (64 bytes);
//                        int4: 16 fp16 scales, then 16 uint8 zero points (48 bytes);
//           rounded up to 64 bytes in all
//   values: fp8 / int8: for each input k, 16 bytes (byte j: output j's q);
//           int4: for each 8 inputs k0..k0+7, 16 dwords (dword j: output j's
//           q of k0 + i in bits 4i..4i+3); the inputs past cols, up to a
//           multiple of 8, hold zeros
size_t quant_block_header_bytes(enum quant_format f, int cols, int group);
size_t quant_block_bytes(enum quant_format f, int cols, int group);
uint64_t quant_matrix_bytes(uint64_t rows, uint64_t cols, enum quant_format f, int group);

#endif
