// kernels: the single-threaded CPU kernels behind the forward pass, one table
// per instruction set (portable scalar reference, AVX2+FMA, AVX-512), picked
// at run time from what the CPU supports (and AVX-512 with the AMX tile unit
// for the bf16 and int4 matmuls). Every table also multiplies by quantized
// weights (fp8, int8, int4: model/quant.h), dequantizing them in registers
// (the amx table: int4 a weight tile at a time into L1, for the tile unit);
// the activations stay fp32 (avx512_bf16: bf16, and int4, int8 and fp8
// codes made bf16 for its dot products), so AVX-512 VNNI (integer dot
// products of int8 activations) has nothing to do here.
#ifndef MOESERVE_MODEL_CPU_KERNELS_H
#define MOESERVE_MODEL_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "model/config.h"
#include "model/quant.h"

// A weight matrix as stored in the checkpoint (bf16, f16 or f32), and
// optionally the same weights repacked once at load time for the tables that
// read the packed layout (see cpu_pack_bytes).
struct cpu_wmat {
    const void *data;   // (out, in) row-major; NULL when only the packed copy exists (dummy weights)
    const void *packed; // NULL, or (ceil(out / 16), the block) in the packed layout
    enum dtype dtype;
    int out, in;
    // Quantized weights (quant != QUANT_NONE) exist only packed, in
    // model/quant.h's blocks of 16 outputs with groups of `group` inputs;
    // every table reads them so and dequantizes in registers.
    enum quant_format quant;
    int group;
};

// The packed layout: outputs in blocks of CPU_PACK_OUTS, block b holding
// outputs 16b..16b+15 for every k, k-major, so that one vector load gives one
// k's weights for 16 outputs (what a broadcast-and-FMA kernel wants):
//   bf16: ceil(in / 2) pairs of 16 dwords; dword j of pair p is
//         w[16b + j][2p] | w[16b + j][2p + 1] << 16 (a shift or a mask makes fp32)
//   f16:  in rows of 16 halves;  f32: in rows of 16 floats.
// Outputs past out in the last block and the k past an odd in are zero.
#define CPU_PACK_OUTS 16
size_t cpu_pack_block_bytes(enum dtype dt, int in);
size_t cpu_pack_bytes(const struct cpu_wmat *w);
// Blocks [b0, b1) of w into dst (their cpu_pack_block_bytes each, in order).
void cpu_pack_blocks(const struct cpu_wmat *w, int b0, int b1, void *dst);
// Blocks [b0, b1) of w packed: where they lie when w was packed at load,
// else packed now into buf.
const char *cpu_packed_blocks(const struct cpu_wmat *w, int b0, int b1, void *buf);
// Of the 16 outputs of the block starting at o, those in [o0, o1): bit j
// for output o + j (the store mask of a vector of 16 outputs).
static inline uint16_t cpu_lane_mask16(int o, int o0, int o1)
{
    int lo = o0 - o, hi = o1 - o;
    if (lo < 0) lo = 0;
    if (hi > 16) hi = 16;
    if (hi <= lo) return 0;
    return (uint16_t)(((1u << (hi - lo)) - 1u) << lo);
}
// The next chunk of a packed matrix, brought into L2 while the row blocks
// after a chunk's first work on that chunk from L2 (without it the first
// row block of every chunk waits on memory with too little work to hide
// it): each tile step of those row blocks prefetches `per` lines from `at`
// on, up to `end`. steps: the tile steps the row blocks after the first
// take on the chunk. An empty plan (at NULL) when there is nothing ahead.
struct cpu_ahead {
    const char *at, *end;
    int per;
};
static inline struct cpu_ahead cpu_ahead_plan(const void *packed, size_t bb, int ce, int b1, int chunk,
                                              size_t steps)
{
    struct cpu_ahead a = {0};
    if (!packed || ce >= b1 || steps == 0) return a;
    const int ne = b1 - ce < chunk ? b1 : ce + chunk;
    const size_t lines = (size_t)(ne - ce) * bb / 64;
    a.at = (const char *)packed + (size_t)ce * bb;
    a.end = (const char *)packed + (size_t)ne * bb;
    a.per = (int)((lines + steps - 1) / steps);
    return a;
}

// Where a tile streaming NB packed blocks from memory prefetches when at
// byte off of its block n: dist bytes further on in the same block, and,
// past its end, as far into block n + NB, the first block of the tile that
// follows. The next tile's blocks then start warm instead of each waiting
// on memory for its first dist bytes (the hardware's streams do not cross
// into blocks the tile has not touched). Measured with generate --bench on
// the mid model, avx512, 2 threads, alternating: decode at batch 1 82% of
// the read bandwidth without, 89% with (means of four runs each).
// Prefetches past the matrix fault nothing.
static inline const char *cpu_pf_ahead(const char *wp, size_t bb, int NB, int n, size_t off, size_t dist)
{
    const size_t to = off + dist;
    return to < bb ? wp + (size_t)n * bb + to : wp + (size_t)(n + NB) * bb + (to - bb);
}

// One tile step's share of the plan: its per lines from at on (up to
// end) into L2, at moved past them. A tile works on its own copy of the
// plan and writes at back when it ends, for the tile after it.
static inline __attribute__((always_inline)) void cpu_ahead_step(struct cpu_ahead *a)
{
    for (int i = 0; i < a->per && a->at < a->end; i++, a->at += 64) __builtin_prefetch(a->at, 0, 2);
}

// What a tile prefetches of its own blocks: nothing (a row block after the
// first, which finds them in L2), lines `near` bytes ahead (cpu_pf_ahead)
// into L1, or those and lines further ahead into L2 (the far ones): the
// first row block of a matmul whose rows the CPU's plan names
// (cpu_pf_mode). Why the far ones: a line a T0 prefetch brings holds one of
// a core's few L1 fill buffers until it arrives, which caps the lines one
// core has in flight; T1 ones wait in L2's longer queue.
//
// Which tiles they pay for depends on the core, so each vendor has its
// plan, measured in place (2 threads, one process choosing with or without
// at random call by call):
// - Intel (the Xeon of README's CPU section): CPU_PF_FAR ahead, matmuls of
//   up to 12 rows. The avx512 table's two-block transposed-x tiles over the
//   mid model's experts at batch 64 (8 rows each on average) 22-23%
//   faster, a one-row lm_head 2-3%; the avx2 table's (bound by their FMAs
//   there) 1.5-2.4% and 1-3%. Prefill (64 rows an expert): no faster.
// - AMD Zen 5: CPU_PF_FAR_LONG ahead, matmuls of 7 to 16 rows. There the far
//   lines cost the memory-bound tiles of one or two rows 9-16% (avx512_bf16;
//   3-14% with 6 KiB in every table), nothing at 8 rows, and pay where a
//   tile's dot products take about as long as its reads: avx512_bf16's
//   lm_head 7% faster at 12 rows, 14% at 13, 28% at 16, the experts at 8
//   to 16 rows 4-8%; 64 rows 5% slower. (Those were two-block tiles: the
//   three-block ones that avx512 and avx512_bf16 now give 7 to 8 or 9
//   rows take near lines only, which measured faster there.)
// Other CPUs take Zen's plan.
enum cpu_pf { CPU_PF_NONE, CPU_PF_NEAR, CPU_PF_NEAR_FAR, CPU_PF_NEAR_FAR_LONG };
#define CPU_PF_FAR 6144
#define CPU_PF_FAR_LONG 16384

// The far prefetches' plan: matmuls of min_rows to max_rows rows (the
// matmul's, whichever tile its row blocks take) take
// `far` (CPU_PF_NEAR_FAR or CPU_PF_NEAR_FAR_LONG); an empty range, none.
struct cpu_pf_plan {
    int min_rows, max_rows;
    enum cpu_pf far;
};

// The plan of this CPU, or the one MOESERVE_CPU_FAR_PREFETCH names: intel,
// amd, or 0 (none); to measure the choice on another CPU. Decided once per
// process; no result depends on it, only the time. cpu_pf_plan_choose: the
// rule, given the variable's value (NULL when unset) and whether the CPU
// is Intel's; false when the value names no plan (then the CPU decides).
const struct cpu_pf_plan *cpu_pf_plan_get(void);
bool cpu_pf_plan_choose(const char *env, bool intel, struct cpu_pf_plan *out);

static inline enum cpu_pf cpu_pf_mode(bool streams, int rows)
{
    if (!streams) return CPU_PF_NONE;
    const struct cpu_pf_plan *p = cpu_pf_plan_get();
    return rows >= p->min_rows && rows <= p->max_rows ? p->far : CPU_PF_NEAR;
}

// A tile of `rows` rows that streams nb blocks side by side (the avx512 and
// avx512_bf16 tiles of 7 to 16 rows): three blocks or more keep enough
// lines in flight with the near prefetches alone, and the plan's far ones
// (Zen's, from 7 rows on) only crowded them (3-10% slower with them on
// 7-9-row bf16 experts read from memory, Zen 5, 2 threads).
static inline enum cpu_pf cpu_pf_mode_blocks(int rows, int nb)
{
    return nb >= 3 ? CPU_PF_NEAR : cpu_pf_mode(true, rows);
}

// What a tile's loop prefetches, a constant each tile is compiled with
// (cpu_pfm picks one at run time): nothing (CPU_PFM_OFF), the next chunk's
// lines (CPU_PFM_AHEAD, struct cpu_ahead: the row blocks after a chunk's
// first) or its own streams (CPU_PFM_TILE, cpu_pf_tile: the first row
// block). One loop for every mode kept the pointers of all of them live,
// and GCC spilled a 6 x 4 tile's row and weight pointers to the stack,
// updated there every step: apart, measured in one process against that
// loop, alternating (medians, Zen 5, 2 threads, avx512_bf16), experts of
// 64 and 256 rows ran 6-28% faster, a 2048-row projection 11-14%, the
// lm_head over 64 rows 22%; 1 to 16 rows within 2%. The fp32 tiles spilled
// less: avx512 1-6% faster on the same shapes, avx2 2-12% (two runs).
enum cpu_pfm { CPU_PFM_OFF, CPU_PFM_AHEAD, CPU_PFM_TILE };

// A row block is given a cpu_ahead only where its pf is CPU_PF_NONE (the
// matmuls pass one or the other), so one mode covers what it does.
static inline enum cpu_pfm cpu_pfm(enum cpu_pf pf, const struct cpu_ahead *ahead)
{
    return ahead ? CPU_PFM_AHEAD : pf == CPU_PF_NONE ? CPU_PFM_OFF : CPU_PFM_TILE;
}

// One tile call per mode, the mode a constant in each: CALL(mode, ...).
#define CPU_PFM_SWITCH(pfm, CALL, ...)                                                             \
    switch (pfm) {                                                                                 \
    case CPU_PFM_OFF: CALL(CPU_PFM_OFF, __VA_ARGS__); break;                                       \
    case CPU_PFM_AHEAD: CALL(CPU_PFM_AHEAD, __VA_ARGS__); break;                                   \
    default: CALL(CPU_PFM_TILE, __VA_ARGS__); break;                                               \
    }

// The prefetches of mode pf for a tile at byte off of its block n. Always
// inlined: where GCC 12 (-O2) left it out of line, it found the function
// free of side effects (a prefetch has none it counts) and deleted the
// calls. So went the amx table's first use of it (no prefetch left in the
// loop) and 40 of the avx512 table's prefetches in its f16 tiles.
static inline __attribute__((always_inline)) void cpu_pf_tile(enum cpu_pf pf, const char *wp, size_t bb, int NB,
                                                              int n, size_t off, size_t near)
{
    if (pf == CPU_PF_NONE) return;
    __builtin_prefetch(cpu_pf_ahead(wp, bb, NB, n, off, near), 0, 3);
    if (pf == CPU_PF_NEAR_FAR) __builtin_prefetch(cpu_pf_ahead(wp, bb, NB, n, off, CPU_PF_FAR), 0, 2);
    else if (pf == CPU_PF_NEAR_FAR_LONG)
        __builtin_prefetch(cpu_pf_ahead(wp, bb, NB, n, off, CPU_PF_FAR_LONG), 0, 2);
}

// Rows [0, r->n) of canonical quantized rows (r->n <= 16) as one packed
// block of model/quant.h's layout (quant_block_bytes) at dst; the rows past
// r->n are zero.
void cpu_qpack_block(const struct quant_rows *r, void *dst);
// Output o of a packed quantized w, dequantized by the formula (the
// scalar table's matmul and the tests read weights so): out (w.in).
void cpu_qpack_dequant_row(const struct cpu_wmat *w, int o, float *out);
// Outputs [o0, o0 + n) of w as a matrix of their own; a packed w keeps its
// packing only when o0 is a multiple of CPU_PACK_OUTS.
struct cpu_wmat cpu_wmat_slice(const struct cpu_wmat *w, int o0, int n);

// One matmul problem: y (rows, w.out) = x (rows, w.in) . w^T, in fp32.
// Rows may be gathered and scattered through index lists, which is how the
// MoE experts read their tokens without copying them.
struct cpu_mm {
    struct cpu_wmat w;
    const float *x;        // row r at x + (x_rows ? x_rows[r] : r) * ldx
    size_t ldx;
    const int32_t *x_rows; // (rows) or NULL
    float *y;              // row r at y + (y_rows ? y_rows[r] : r) * ldy
    size_t ldy;
    const int32_t *y_rows; // (rows) or NULL
    int rows;
    bool accumulate;       // y += x . w^T (a residual add) instead of y = x . w^T
    // x's rows already rounded by the table's round_xq (row r at xq +
    // (x_rows ? x_rows[r] : r) * ldxq dwords), or NULL. cpu_matmul sets it
    // where the table wants it (wants_xq), so that a batch's rows are
    // rounded once rather than by every piece of every matmul that reads
    // them; the results are the same bits either way.
    const uint32_t *xq;
    size_t ldxq;
};

// The height of the row blocks of a matmul: the fewest blocks of at most
// max rows, as tall as that needs (7 rows at most 6: 4 and 3, not 6 and 1;
// 16 rows: 6, 6 and 4): a last block of a row or two has too few
// accumulators to hide the FMA latency.
static inline int cpu_block_height(int rows, int max)
{
    const int n_blocks = (rows + max - 1) / max;
    return (rows + n_blocks - 1) / n_blocks;
}

// The tiles a row block takes over a chunk of `blocks` blocks: nb blocks
// each, then one tile of the 1 to nb - 1 blocks left (a piece of a matmul
// that starts or ends inside a group of nb, as the cost split cuts them:
// one tile of three blocks, where three one-block tiles each ran a third of
// the accumulators; Zen 5, a 384 x 1024 matrix of 256 rows on 2 threads, 8
// pieces of 3 blocks, builds alternating: avx512_bf16 324-340 GFLOP/s
// before, 525-566 after; avx512 266-278, 342-361).
static inline int cpu_chunk_tiles(int blocks, int nb) { return blocks / nb + (blocks % nb != 0); }

// Packed blocks of bb bytes per chunk of a matmul that meets every row
// block while the chunk sits in L2: about chunk_bytes, a multiple of nb (at
// least nb). Weights not packed at load are packed into scratch chunk by
// chunk, which holds 256 KiB of them or one block
// (cpu_kernels_scratch_floats).
static inline int cpu_pack_chunk_blocks(size_t chunk_bytes, size_t bb, int nb, bool packed_at_load)
{
    if (bb == 0) bb = 1;
    int chunk = (int)(chunk_bytes / bb) / nb * nb;
    if (chunk < nb) chunk = nb;
    const int fits = (int)((256u << 10) / bb);
    if (!packed_at_load && chunk > fits) chunk = fits > 1 ? fits : 1;
    return chunk;
}

// Rows [rb, rb + mr) of m: where each one's x is read and its y written.
static inline void cpu_mm_rows(const struct cpu_mm *m, int rb, int mr, const float **xr, float **yr)
{
    for (int r = 0; r < mr; r++) {
        const int xi = m->x_rows ? m->x_rows[rb + r] : rb + r;
        const int yi = m->y_rows ? m->y_rows[rb + r] : rb + r;
        xr[r] = m->x + (size_t)xi * m->ldx;
        yr[r] = m->y + (size_t)yi * m->ldy;
    }
}

// Attention for a tile of consecutive new tokens of one sequence and the
// query heads that share one KV head, over a paged KV cache. Token i of the
// tile sits at position first_pos + i and attends positions 0..first_pos + i
// (causal). Each (token, head) row's result depends only on that row and the
// cache, not on the tile around it.
#define CPU_ATTN_TILE 16
struct cpu_attn {
    const float *q;        // token i, head g at q + i * q_stride + g * head_dim
    size_t q_stride;
    float *out;            // token i, head g at out + i * out_stride + g * head_dim
    size_t out_stride;
    int n_tok;             // 1..CPU_ATTN_TILE
    int first_pos;
    int n_q;               // query heads per KV head (GQA group)
    int head_dim;
    float scale;           // 1 / sqrt(head_dim)
    const int32_t *blocks; // the sequence's block table
    // One layer of the pool. Keys are transposed within their block, so that
    // one vector load gives one dimension of 16 keys (no transpose per step):
    const void *k;         // (n_blocks, n_kv_heads, head_dim, 16)
    const void *v;         // (n_blocks, n_kv_heads, 16, head_dim)
    enum dtype kv_dtype;   // DTYPE_BF16, DTYPE_F16 or DTYPE_F32
    int n_kv_heads, kv_head;
};

struct cpu_kernels {
    const char *name;      // "scalar", "avx2", "avx512", "avx512_bf16", "amx"
    int lanes;             // fp32 lanes per vector (also the matmul's reduction width)
    // The bf16 matmuls round their activations to bf16 (kernels_avx512bf16.c
    // states the tolerance); false: fp32 within the reference's roundings.
    bool bf16_activations;
    int unit;              // the matmul's natural split of outputs between threads
    // Outputs [o0, o1) of every row of m. Each output element depends only on
    // its x row, its w row and the table (never on rows, o0/o1 or the path
    // taken), so results do not depend on how a batch is composed or split.
    // scratch: cpu_kernels_scratch_floats(...) floats, 64-byte aligned.
    void (*matmul)(const struct cpu_mm *m, int o0, int o1, float *scratch);
    // Whether this table reads w faster in the packed layout (NULL: never).
    // Results are the same either way; this is only where the time goes.
    bool (*wants_packed)(const struct cpu_wmat *w);
    // The time of a matmul per weight and per output, in units of one FMA
    // pass of one row, for splitting matmuls between threads (NULL: the
    // weights' read counts two passes, each row one: rows + 2).
    uint64_t (*row_cost)(const struct cpu_mm *m);
    // Tables whose matmuls multiply rounded activations (avx512_bf16 on
    // VDPBF16PS; NULL for the others): whether m's matmul reads x rounded
    // (wants_xq), and one row of x rounded as it reads it, (K + 1) / 2 dwords
    // of bf16 pairs (round_xq). cpu_matmul uses them to round a batch once.
    bool (*wants_xq)(const struct cpu_mm *m);
    void (*round_xq)(const float *x, int K, uint32_t *d);
    void (*attend)(const struct cpu_attn *a, float *scratch);
    // g[i] = silu(g[i]) * u[i]
    void (*silu_mul)(float *g, const float *u, int n);
    // out = x / sqrt(mean(x^2) + eps) * w (w as stored)
    void (*rmsnorm)(const float *x, const void *w, enum dtype wt, int n, float eps, float *out);
    // y[i] = a * x[i] + y[i], one rounding (FMA)
    void (*axpy)(float *y, float a, const float *x, int n);
    // NeoX RoPE (rotate-half) of one head: out[i] = x[i] c[i] - x[i + half]
    // s[i], out[i + half] = x[i + half] c[i] + x[i] s[i], each product rounded
    // on its own (no FMA), so every table gives the scalar's bits. out may be x.
    void (*rope)(float *out, const float *x, int half, const float *c, const float *s);
    // out[i] = exp(x[i] - shift), exactly 0 where x[i] is -inf; returns the
    // sum of out. A softmax's numerators and denominator in one pass: the
    // sampler's hot loop over the whole vocabulary. block_sums (NULL, or
    // CPU_EXP_BLOCKS(n) entries) receives the sum of each CPU_EXP_BLOCK
    // consecutive entries, so that a draw can skip to its block.
    double (*exp_sum)(const float *x, float shift, float *out, int n, double *block_sums);
    // x[i] = x[i] * scale, NaN becoming -inf; returns the largest result.
    float (*scale_max)(float *x, float scale, int n);
    // For the benchmarks: the sum of n floats read once, and iters rounds of
    // FMAs on CPU_FMA_CHAINS independent vectors (iters * CPU_FMA_CHAINS *
    // lanes * 2 FLOPs); both return a value so that nothing is optimised away.
    float (*stream_sum)(const float *p, size_t n);
    float (*fma_burn)(long iters, float seed);
};

#define CPU_EXP_BLOCK 1024
#define CPU_EXP_BLOCKS(n) (((n) + CPU_EXP_BLOCK - 1) / CPU_EXP_BLOCK)

// Enough independent chains to cover the FMA latency on every port.
#define CPU_FMA_CHAINS 12

const struct cpu_kernels *cpu_kernels_scalar(void);
// NULL when this CPU (or this build) lacks the instructions.
const struct cpu_kernels *cpu_kernels_avx2(void);
const struct cpu_kernels *cpu_kernels_avx512(void);
// The avx512 table with bf16 activations in its bf16 matmuls (AVX512_BF16):
// on the AMX tile unit where it is usable, else on VDPBF16PS where that
// runs faster than FMAs, else FMAs in its order (the same results as
// VDPBF16PS; picked once by timing both, kernels_avx512bf16.c). Its
// quantized matmuls take the rounded x too: int4, int8 and fp8 on
// VDPBF16PS, int4 and fp8 on the tile unit (each path in its own order of
// sums); its FMA path leaves them to avx512, and its tile path int8 to the
// path below the tiles.
const struct cpu_kernels *cpu_kernels_avx512_bf16(void);
// That table with its path forced (fma: FMAs in VDPBF16PS's order; else
// VDPBF16PS), for the tests and benchmarks that hold the paths side by side;
// _tiles: its tile-unit path, NULL where cpu_kernels_amx() is NULL.
const struct cpu_kernels *cpu_kernels_avx512_bf16_path(bool fma);
const struct cpu_kernels *cpu_kernels_avx512_bf16_tiles(void);
// AMX-BF16 and AMX-TILE, with AVX512_VBMI and AVX512_BF16 (every CPU with
// the tile unit has both); also needs Linux to grant this process the tile
// state (arch_prctl).
const struct cpu_kernels *cpu_kernels_amx(void);
// The bf16 matrices the amx table runs on the tile unit: those whose k fill
// whole 32-value tile rows (the rest, and the quantized matrices but those
// below, go to its avx512 matmul).
static inline bool cpu_kernels_amx_takes(const struct cpu_wmat *w)
{
    return w->quant == QUANT_NONE && w->dtype == DTYPE_BF16 && w->in > 0 && w->in % 32 == 0 && w->out > 0;
}
// The quantized matrices (int4 and fp8; int8 is faster on FMAs) the amx
// table (and avx512_bf16's tile path) run on the tile unit, dequantized a
// tile at a time (kernels_amx.c): k and the scale groups in whole tile
// rows of 32, groups of at most 256 inputs (GPTQ's, FP8 checkpoints' and
// --quantization's 128, and 32 and 64). Others stay on the FMA path.
static inline bool cpu_kernels_amx_takes_quant(const struct cpu_wmat *w)
{
    const int G = w->group > 0 ? w->group : w->in;
    return (w->quant == QUANT_INT4 || w->quant == QUANT_FP8) && w->packed && w->in > 0 && w->in % 32 == 0 && G % 32 == 0 && G <= 256 &&
           w->out > 0;
}
// The fastest fp32 table this CPU runs (amx, else avx512, else avx2, else
// scalar); MOESERVE_CPU_KERNELS=scalar|avx2|avx512|avx512_bf16|amx picks one
// (falling back to the best available when the CPU lacks it): avx512_bf16
// is never the default, only asked for.
const struct cpu_kernels *cpu_kernels_best(void);

// The table of that name ("scalar", "avx2", "avx512", "avx512_bf16", "amx")
// when this CPU runs it, else NULL.
const struct cpu_kernels *cpu_kernels_by_name(const char *name);

// Per-thread scratch any table needs for matmuls with in <= max_in and
// attention with n_q <= max_q heads of head_dim (tiles of CPU_ATTN_TILE).
// A matrix of in = K may count on cpu_kernels_scratch_floats(K, 1, 1).
#define CPU_BF16_ROWS 256 // x rows the avx512_bf16 matmul rounds once per call
#define CPU_BF16_FMA_ROWS 64 // x rows its FMA path rounds (as fp32) at a time
size_t cpu_kernels_scratch_floats(int max_in, int max_q, int head_dim);
// Of that, what the avx512 matmul itself takes for in = K: 256 KiB of
// packed blocks or 4 rows of weights not packed at load, 4 rows of slack,
// 16 x rows transposed. The avx512_bf16 table's FMA path puts its rounded x
// rows after it.
static inline size_t cpu_pk_scratch_floats(int K)
{
    const size_t kp = ((size_t)(K > 0 ? K : 1) + 15) / 16 * 16;
    return (65536 > 4 * kp ? 65536 : 4 * kp) + 4 * kp + 16 * kp;
}

// The avx2 matmul: the avx512 one's, then a chunk of f16 weights widened to
// fp32 (256 KiB, or one block of 16 floats per k).
static inline size_t cpu_p2_scratch_floats(int K)
{
    const size_t kp = ((size_t)(K > 0 ? K : 1) + 15) / 16 * 16;
    return cpu_pk_scratch_floats(K) + (65536 > 16 * kp ? 65536 : 16 * kp);
}

// The avx512 matmul of bf16 weights in VDPBF16PS's order: within each pair
// of k, the product of k = 2p + 1 first, then of 2p, each one FMA (Intel's
// definition of the instruction: measured here bit for bit against it on
// normal numbers; it flushes subnormals, FMAs keep them). With x already
// rounded to bf16 (the products are then exact in fp32) it gives
// VDPBF16PS's results at the fp32 FMA rate, twice VDPBF16PS's on CPUs that
// run it at half rate (kernels_avx512bf16.c).
// Other weights: the avx512 matmul. Scratch: cpu_pk_scratch_floats(K).
void cpu_kernels_avx512_matmul_dp_order(const struct cpu_mm *m, int o0, int o1, float *scratch);

// Rows of n 32-bit values (row r at rows[r], 1 <= n_rows <= 16) interleaved:
// value i of row r at out[i * n_rows + r], the buffer the avx512 and
// avx512_bf16 tiles of 7 to 16 rows broadcast from. AVX-512: only those
// tables call it.
void cpu_avx512_interleave_rows(const void *const *rows, int n_rows, int n, void *out);

// Element i of a bf16, f16 or f32 array, as fp32.
static inline float cpu_load_weight(const void *p, enum dtype t, size_t i)
{
    switch (t) {
    case DTYPE_BF16: return ms_bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_F16: return ms_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

#endif
