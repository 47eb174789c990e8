// ops: cost-balanced parallel matmuls and the scalar per-row operations.
#include "model/cpu/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Threads that own a run of a call's pieces; on a larger pool the others
// take theirs from the owners' runs.
#define MM_MAX_OWNERS 64

// A run of pieces [front, back): its owner takes from the front, any other
// thread from the back. One word, so that the two cannot both win the last
// piece; a line of its own, since the owner moves it at every piece.
struct mm_run {
    _Alignas(64) _Atomic uint64_t fb; // front << 32 | back
};

struct mm_ctx {
    const struct cpu_exec *e;
    const struct cpu_mm *jobs;
    int n_jobs;
    uint64_t total;
    int n_pieces;
    const struct cpu_xq *xq; // the rounded rows of this call, or NULL
    int owners;              // runs in use: run[t] belongs to thread t
    struct mm_run *run;      // (MM_MAX_OWNERS): only the first owners set (mm_deal)
};

// One distinct x of a call (its base, row stride and width): row i, where
// some job reads it, rounded at buf + off + i * np.
struct cpu_xq_set {
    const float *x;
    size_t ldx;
    int K, np, span; // span: rows [0, span) hold every row its jobs read
    size_t off;
    size_t row0;     // its rows' first entry in the call's marks (cpu_xq.mark)
};

void cpu_xq_free(struct cpu_xq *q)
{
    if (!q) return;
    free(q->buf);
    free(q->sets);
    free(q->set_of);
    free(q->todo);
    free(q->mark);
    *q = (struct cpu_xq){0};
}

// Pieces per thread: a thread that finishes early (or a pool whose other
// thread is off its core) takes the rest.
#define MM_PIECES_PER_THREAD 4

// Each thread walks a run of consecutive pieces from its front, then takes
// what is left of the others' runs from their backs. Why runs: a piece's
// last tiles prefetch the lines past its range, which are the next piece's
// first, and the thread's weight streams go on from one piece to the next;
// taking pieces from one shared counter, a thread's next piece lay two or
// more pieces on and started cold. Measured on Zen 5 (2 threads, each
// matmul of a model's 48 layers in turn, from memory, medians of six
// rounds, avx512_bf16, with the int4 tiles' prefetches past their range):
// the full-size int4 q projection at one row 49.8 -> 60.0 GB/s, its o
// projection 47.3 -> 61.2, its experts 51-56 -> 53-58 (the prefetches
// alone: 48-52, level). A whole decode step moved less than the machine
// swings (bench/CPU_LOG.md, 2026-12-08).
static int mm_take(struct mm_ctx *c, int t, bool front)
{
    _Atomic uint64_t *fb = &c->run[t].fb;
    uint64_t v = atomic_load(fb);
    for (;;) {
        const uint32_t f = (uint32_t)(v >> 32), b = (uint32_t)v;
        if (f >= b) return -1;
        if (atomic_compare_exchange_weak(fb, &v, front ? v + ((uint64_t)1 << 32) : v - 1))
            return (int)(front ? f : b - 1);
    }
}

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
                if (c->xq && c->xq->set_of[j] >= 0) {
                    const struct cpu_xq_set *set = &c->xq->sets[c->xq->set_of[j]];
                    struct cpu_mm mq = *m;
                    mq.xq = c->xq->buf + set->off;
                    mq.ldxq = (size_t)set->np;
                    c->e->k->matmul(&mq, o0, o1, scratch);
                } else {
                    c->e->k->matmul(m, o0, o1, scratch);
                }
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
    int i;
    if (tid < c->owners)
        while ((i = mm_take(c, tid, true)) >= 0) mm_piece(c, i, scratch);
    for (int o = 1; o <= c->owners; o++) {
        const int t = (tid + o) % c->owners;
        while ((i = mm_take(c, t, false)) >= 0) mm_piece(c, i, scratch);
    }
}

// The call's n_pieces dealt into runs of consecutive pieces, one per owner.
static void mm_deal(struct mm_ctx *c, int threads)
{
    c->owners = threads < MM_MAX_OWNERS ? threads : MM_MAX_OWNERS;
    for (int t = 0; t < c->owners; t++) {
        const uint64_t f = (uint64_t)c->n_pieces * (uint64_t)t / (uint64_t)c->owners;
        const uint64_t b = (uint64_t)c->n_pieces * (uint64_t)(t + 1) / (uint64_t)c->owners;
        atomic_init(&c->run[t].fb, f << 32 | b);
    }
}

// The rows a job reads of its x lie in [0, span); 0 when a gathered row
// index is negative (padding), which leaves the job to round its own rows.
static int xq_span(const struct cpu_mm *m)
{
    if (!m->x_rows) return m->rows;
    int span = 0;
    for (int r = 0; r < m->rows; r++) {
        if (m->x_rows[r] < 0) return 0;
        if (m->x_rows[r] >= span) span = m->x_rows[r] + 1;
    }
    return span;
}

static bool xq_same_x(const struct cpu_xq_set *set, const struct cpu_mm *m)
{
    return set->x == m->x && set->ldx == m->ldx && set->K == m->w.in;
}

static bool grow_to(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap) return true;
    if (n > SIZE_MAX / size) return false;
    void *q = realloc(*p, n * size);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

// Groups the jobs the table wants rounded rows for by their x (the gate and
// up of every expert read one x through their own x_rows: one set), lists
// the rows some job reads once each (todo) and sizes the buffer. Returns
// the rows to round, or 0, with every job left to round its own rows, when
// the call reads too few to pay for a pass of its own or without memory.
static size_t xq_plan(const struct cpu_exec *e, const struct cpu_mm *jobs, int n_jobs)
{
    struct cpu_xq *q = e->xq;
    size_t read = 0;
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].rows > 0 && jobs[j].w.out > 0 && e->k->wants_xq(&jobs[j])) read += (size_t)jobs[j].rows;
    if (read < CPU_XQ_MIN_ROWS) return 0;
    if (n_jobs > q->jobs_cap) {
        int32_t *so = realloc(q->set_of, (size_t)n_jobs * sizeof *so);
        if (!so) return 0;
        q->set_of = so;
        struct cpu_xq_set *st = realloc(q->sets, (size_t)n_jobs * sizeof *st);
        if (!st) return 0;
        q->sets = st;
        q->jobs_cap = n_jobs;
    }
    int n_sets = 0, last = -1;
    for (int j = 0; j < n_jobs; j++) {
        const struct cpu_mm *m = &jobs[j];
        q->set_of[j] = -1;
        if (m->rows <= 0 || m->w.out <= 0 || !e->k->wants_xq(m)) continue;
        const int span = xq_span(m);
        if (span <= 0) continue;
        // The set of the job before first: gate and up of an expert, and
        // the experts of one gathered x, come one after another.
        int s = last;
        if (s < 0 || !xq_same_x(&q->sets[s], m))
            for (s = 0; s < n_sets && !xq_same_x(&q->sets[s], m); s++) {}
        last = s;
        if (s == n_sets)
            q->sets[n_sets++] = (struct cpu_xq_set){.x = m->x, .ldx = m->ldx, .K = m->w.in, .np = (m->w.in + 1) / 2};
        if (span > q->sets[s].span) q->sets[s].span = span;
        q->set_of[j] = s;
    }
    // A set's buffer spans its rows; only the rows some job reads are
    // rounded (todo: at most the rows the jobs read), each once (mark: one
    // entry per row of every set's span).
    size_t dwords = 0, rows = 0;
    for (int s = 0; s < n_sets; s++) {
        q->sets[s].off = dwords;
        q->sets[s].row0 = rows;
        const size_t d = (size_t)q->sets[s].span * (size_t)q->sets[s].np;
        if (d > SIZE_MAX / 4 - dwords) return 0;
        dwords += d;
        rows += (size_t)q->sets[s].span;
    }
    if (!grow_to((void **)&q->mark, &q->mark_cap, rows, 1) ||
        !grow_to((void **)&q->todo, &q->todo_cap, read * 2, sizeof *q->todo))
        return 0;
    memset(q->mark, 0, rows);
    size_t n_todo = 0;
    for (int j = 0; j < n_jobs; j++) {
        const int s = q->set_of[j];
        if (s < 0) continue;
        const struct cpu_mm *m = &jobs[j];
        for (int r = 0; r < m->rows; r++) {
            const int i = m->x_rows ? m->x_rows[r] : r;
            uint8_t *seen = &q->mark[q->sets[s].row0 + (size_t)i];
            if (*seen) continue;
            *seen = 1;
            q->todo[2 * n_todo] = s;
            q->todo[2 * n_todo + 1] = i;
            n_todo++;
        }
    }
    if (dwords > q->cap) {
        uint32_t *b = NULL;
        if (posix_memalign((void **)&b, 64, dwords * 4)) return 0;
        free(q->buf);
        q->buf = b;
        q->cap = dwords;
    }
    return n_todo;
}

struct xq_round_ctx {
    const struct cpu_exec *e;
    size_t n_todo;
    _Atomic size_t next; // the next entry of todo a thread takes
};

// Rows a thread takes at a time: enough that the shared counter is not
// contended, few enough that two threads share a small call.
#define XQ_ROWS_PER_TAKE 16

static void xq_round_worker(void *arg, int tid, int n_threads)
{
    (void)tid, (void)n_threads;
    struct xq_round_ctx *c = arg;
    const struct cpu_xq *q = c->e->xq;
    for (size_t t0; (t0 = atomic_fetch_add(&c->next, XQ_ROWS_PER_TAKE)) < c->n_todo;) {
        const size_t t1 = t0 + XQ_ROWS_PER_TAKE < c->n_todo ? t0 + XQ_ROWS_PER_TAKE : c->n_todo;
        for (size_t t = t0; t < t1; t++) {
            const struct cpu_xq_set *set = &q->sets[q->todo[2 * t]];
            const size_t i = (size_t)q->todo[2 * t + 1];
            c->e->k->round_xq(set->x + i * set->ldx, set->K, q->buf + set->off + i * (size_t)set->np);
        }
    }
}

void cpu_matmul(const struct cpu_exec *e, const struct cpu_mm *jobs, int n_jobs)
{
    // The runs outside the initializer, which would zero all 4 KiB of them
    // at every call: mm_deal sets the ones in use.
    struct mm_run run[MM_MAX_OWNERS];
    struct mm_ctx c = {.e = e, .jobs = jobs, .n_jobs = n_jobs, .n_pieces = 1, .run = run};
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].rows > 0 && jobs[j].w.out > 0)
            c.total += (uint64_t)n_units(&jobs[j], e->k->unit) * unit_cost(e->k, &jobs[j], e->k->unit);
    if (c.total == 0) return;
    // Below this (a router at batch 1, say) waking the threads costs more
    // than the work; the split does not change any result.
    if (c.total < (1u << 17)) {
        mm_deal(&c, 1);
        mm_worker(&c, 0, 1);
        return;
    }
    size_t n_todo;
    if (e->xq && e->k->wants_xq && e->k->round_xq && (n_todo = xq_plan(e, jobs, n_jobs)) > 0) {
        struct xq_round_ctx r = {.e = e, .n_todo = n_todo};
        threadpool_run_shared(e->pool, xq_round_worker, &r);
        c.xq = e->xq;
    }
    c.n_pieces = threadpool_size(e->pool) * MM_PIECES_PER_THREAD;
    mm_deal(&c, threadpool_size(e->pool));
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
