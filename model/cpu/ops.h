// ops: the CPU backend's operations over a batch of rows — matmuls split
// across a rank's thread pool, and the per-row pieces of a decoder layer
// (RMSNorm, NeoX RoPE, router top-k) that the forward pass runs inside its
// own parallel loops.
#ifndef MOESERVE_MODEL_CPU_OPS_H
#define MOESERVE_MODEL_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/cpu/kernels.h"
#include "model/cpu/threadpool.h"

// A batch's activations rounded once by cpu_matmul for a table that
// multiplies rounded ones (its wants_xq and round_xq), and the bookkeeping
// of a call; grown as needed and kept between calls. Zero it before first
// use; cpu_xq_free releases it.
struct cpu_xq {
    uint32_t *buf;         // (cap) dwords: the rows each distinct x of a call has read, rounded
    size_t cap;
    struct cpu_xq_set *sets;
    int32_t *set_of;       // (jobs_cap): a job's set, or -1 (the matmul rounds its rows itself)
    int jobs_cap;
    int32_t *todo;         // (todo_cap): the rows to round, as (set, row) pairs
    size_t todo_cap;
    uint8_t *mark;         // (mark_cap): which rows of each set's span some job reads
    size_t mark_cap;
};
void cpu_xq_free(struct cpu_xq *q);

// What a rank's threads compute with: the pool, the kernel table, one
// scratch area per thread, and where a batch's rounded activations go
// (NULL: each matmul rounds the rows it reads). The rank's own thread calls
// cpu_matmul; nothing here is shared between ranks.
struct cpu_exec {
    struct threadpool *pool;
    const struct cpu_kernels *k;
    float *scratch;        // (n_threads, scratch_stride) floats, 64-byte aligned rows
    size_t scratch_stride;
    struct cpu_xq *xq;
};

static inline float *cpu_exec_scratch(const struct cpu_exec *e, int tid)
{
    return e->scratch + (size_t)tid * e->scratch_stride;
}

// Runs every job in one parallel region: their outputs are cut into units
// of k->unit and the units into contiguous pieces of about equal cost
// (weight bytes plus FLOPs), a few per thread: each thread takes a run of
// consecutive pieces in order, and one that finishes early takes the
// others' last pieces (threadpool_run_shared), so one small matrix or many
// experts alike keep every thread busy and a thread off its core holds
// nothing up.
// Results do not depend on the thread count or on who takes which piece.
// Where the table rounds activations (wants_xq) and e->xq is set, a call
// whose jobs read at least CPU_XQ_MIN_ROWS rows (summed over the jobs, so
// gate and up count twice; a call small enough to run on one thread never
// does) first rounds each distinct x row once, on all threads: a prefill's
// rows were otherwise rounded again by every piece of every matmul that
// reads them, and again per chunk of weights when they overflow scratch.
// The same bits either way. Below 64 rows a pass of its own costs more
// than the rounding it saves (a decode step of a few streams). Without
// memory for it the matmuls round their rows as before. The buffer spans
// each x up to the highest row read, and keeps its largest size.
#define CPU_XQ_MIN_ROWS 64
void cpu_matmul(const struct cpu_exec *e, const struct cpu_mm *jobs, int n_jobs);

// out = x / sqrt(mean(x^2) + eps) * w, the sum of squares in double.
void cpu_rmsnorm(const float *x, const void *w, enum dtype wt, int n, float eps, float *out);

// cos/sin of pos * inv_freq[i] for the head_dim/2 rotary pairs.
void cpu_rope_angles(int pos, const double *inv_freq, int half, float *cos_out, float *sin_out);
// (The rotation itself is the kernel tables' rope: NeoX pairs (x[i], x[i + half]).)

// Router: the k largest of n logits (ties: lowest index first; a NaN ranks
// as -inf), their softmax weights over all n, renormalised over the k when
// norm_topk. 1 <= k <= n; otherwise every id is -1 and every weight 0.
void cpu_router_topk(const float *logits, int n, int k, bool norm_topk, int32_t *ids, float *w);

#endif
