// ops: cost-balanced parallel matmuls and the scalar per-row operations.
#include "model/cpu/ops.h"

#include <math.h>
#include <stdatomic.h>

struct mm_ctx {
    const struct cpu_exec *e;
    const struct cpu_mm *jobs;
    int n_jobs;
    uint64_t total;
    int n_pieces;
    _Atomic int next;  // the next piece a thread takes
};

// Pieces per thread: a thread that finishes early (or a pool whose other
// thread is off its core) takes the rest.
#define MM_PIECES_PER_THREAD 4

static uint64_t unit_cost(const struct cpu_kernels *k, const struct cpu_mm *m, int unit)
{
    if (k->row_cost) return (uint64_t)unit * (uint64_t)m->w.in * k->row_cost(m);
    // Streaming the weights costs about as much as two FMA passes per row.
    return (uint64_t)unit * (uint64_t)m->w.in * ((uint64_t)m->rows + 2);
}

static int n_units(const struct cpu_mm *m, int unit) { return (m->w.out + unit - 1) / unit; }

static uint64_t ceil_div_u64(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Piece i is the units whose starting cost lies in [total i / n, total (i + 1) / n).
static void mm_piece(const struct mm_ctx *c, int piece, float *scratch)
{
    const int unit = c->e->k->unit;
    const unsigned n = (unsigned)c->n_pieces;
    uint64_t lo = (uint64_t)((unsigned __int128)c->total * (unsigned)piece / n);
    uint64_t hi = (uint64_t)((unsigned __int128)c->total * (unsigned)(piece + 1) / n);
    uint64_t start = 0;
    for (int j = 0; j < c->n_jobs && start < hi; j++) {
        const struct cpu_mm *m = &c->jobs[j];
        if (m->rows <= 0 || m->w.out <= 0) continue;
        uint64_t cu = unit_cost(c->e->k, m, unit);
        uint64_t nu = (uint64_t)n_units(m, unit), end = start + nu * cu;
        if (end > lo) {
            uint64_t u0 = lo > start ? ceil_div_u64(lo - start, cu) : 0;
            uint64_t u1 = ceil_div_u64(hi - start, cu);
            if (u1 > nu) u1 = nu;
            if (u0 < u1) {
                int o0 = (int)u0 * unit, o1 = (int)u1 * unit;
                if (o1 > m->w.out) o1 = m->w.out;
                c->e->k->matmul(m, o0, o1, scratch);
            }
        }
        start = end;
    }
}

static void mm_worker(void *arg, int tid, int n_threads)
{
    (void)n_threads;
    struct mm_ctx *c = arg;
    float *scratch = cpu_exec_scratch(c->e, tid);
    for (int i; (i = atomic_fetch_add(&c->next, 1)) < c->n_pieces;) mm_piece(c, i, scratch);
}

void cpu_matmul(const struct cpu_exec *e, const struct cpu_mm *jobs, int n_jobs)
{
    struct mm_ctx c = {.e = e, .jobs = jobs, .n_jobs = n_jobs, .n_pieces = 1};
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].rows > 0 && jobs[j].w.out > 0)
            c.total += (uint64_t)n_units(&jobs[j], e->k->unit) * unit_cost(e->k, &jobs[j], e->k->unit);
    if (c.total == 0) return;
    // Below this (a router at batch 1, say) waking the threads costs more
    // than the work; the split does not change any result.
    if (c.total < (1u << 17)) {
        mm_worker(&c, 0, 1);
        return;
    }
    c.n_pieces = threadpool_size(e->pool) * MM_PIECES_PER_THREAD;
    threadpool_run_shared(e->pool, mm_worker, &c);
}

void cpu_rmsnorm(const float *x, const void *w, enum dtype wt, int n, float eps, float *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * cpu_load_weight(w, wt, (size_t)i);
}

void cpu_rope_angles(int pos, const double *inv_freq, int half, float *c, float *s)
{
    for (int i = 0; i < half; i++) {
        double a = (double)pos * inv_freq[i];
        c[i] = (float)cos(a);
        s[i] = (float)sin(a);
    }
}

// Candidates ordered by (value descending, index ascending): the first k
// of that order.
static bool ranks_before(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

static float router_value(const float *logits, int i) { return isnan(logits[i]) ? -INFINITY : logits[i]; }

static double softmax_num(float v, double mx) { return isnan(v) ? 0.0 : exp((double)v - mx); }

void cpu_router_topk(const float *logits, int n, int k, bool norm_topk, int32_t *ids, float *w)
{
    if (k < 1 || n < k) {
        for (int j = 0; j < k; j++) {
            ids[j] = -1;
            w[j] = 0.0f;
        }
        return;
    }
    // One pass keeping the best k so far in order in ids (a NaN logit
    // compares as -inf, so it never wins): most candidates lose to the k-th
    // at once, where k passes over all n took k times the comparisons (1%
    // of a prefill step of the mid model at top-8).
    int have = 0;
    for (int i = 0; i < n; i++) {
        const float v = router_value(logits, i);
        if (have == k && !ranks_before(v, i, router_value(logits, ids[k - 1]), ids[k - 1])) continue;
        int at = have < k ? have++ : k - 1;
        for (; at > 0 && ranks_before(v, i, router_value(logits, ids[at - 1]), ids[at - 1]); at--)
            ids[at] = ids[at - 1];
        ids[at] = i;
    }
    double mx = logits[ids[0]];
    if (!isfinite(mx)) mx = 0;
    double den = 0;
    if (norm_topk)
        for (int j = 0; j < k; j++) den += softmax_num(logits[ids[j]], mx);
    else
        for (int i = 0; i < n; i++) den += softmax_num(logits[i], mx);
    for (int j = 0; j < k; j++)
        w[j] = den > 0 ? (float)(softmax_num(logits[ids[j]], mx) / den) : 1.0f / (float)k;
}
