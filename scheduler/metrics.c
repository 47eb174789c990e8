// metrics: histograms, per-expert counters and the imbalance window behind
// one mutex, and the snapshot that copies them out.
#include "scheduler/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

// Bucket bounds: vLLM's for the series it has (so dashboards built for it
// read the same), our own for the MoE ones (steps are milliseconds on a GPU).
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                     640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double request_bounds[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                        30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                                        1920.0, 7680.0};
static const double tokens_bounds[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                       16384};
// vLLM's n buckets, and its 1-2-5 steps for token counts (cut at max_model_len).
static const double n_bounds[] = {1, 2, 5, 10, 20};
static const double one_two_five[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4,
                                      5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7};
static const double step_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};

#define NB(a) ((int)(sizeof a / sizeof a[0]))
_Static_assert(NB(ttft_bounds) <= METRICS_MAX_BOUNDS && NB(itl_bounds) <= METRICS_MAX_BOUNDS &&
                   NB(request_bounds) <= METRICS_MAX_BOUNDS &&
                   NB(tokens_bounds) <= METRICS_MAX_BOUNDS && NB(step_bounds) <= METRICS_MAX_BOUNDS &&
                   NB(one_two_five) <= METRICS_MAX_BOUNDS,
               "struct metrics_hist holds METRICS_MAX_BOUNDS bounds");

static void hist_init(struct metrics_hist *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n = n;
}

static void hist_add(struct metrics_hist *h, double v, uint64_t times)
{
    if (!(v >= 0) || !isfinite(v) || times == 0) return; // NaN, negative: "did not happen"
    int b = 0;
    while (b < h->n && v > h->bounds[b]) b++;
    h->counts[b] += times;
    h->sum += v * (double)times;
    h->count += times;
}

struct metrics {
    pthread_mutex_t mu;
    int n_ranks, n_experts;
    struct metrics_hist hist[METRICS_HISTS];
    struct metrics_hist a2a[METRICS_MAX_RANKS];
    uint64_t *expert_tokens;    // (n_ranks, n_experts) latest cumulative counts
    bool *expert_held;          // (n_ranks, n_experts)
    // Imbalance: per-step expert load of each rank over the last `window` steps.
    int window, win_pos, win_fill;
    uint64_t *win_load;         // (window, n_ranks)
    uint64_t *win_sum;          // (n_ranks)
    uint64_t *prev_load;        // (n_ranks) cumulative load at the previous step
    bool have_prev;
    int n_layers;
    uint64_t *layer_tokens;     // (n_ranks, n_layers) latest cumulative counts, or NULL
};

// The 1-2-5 bounds up to the first at or above max_len.
static int bounds_upto(int max_len)
{
    double top = max_len > 0 ? max_len : 1e6;
    int n = 0;
    while (n < NB(one_two_five) && (n == 0 || one_two_five[n - 1] < top)) n++;
    return n;
}

int metrics_create(const struct metrics_opts *o, struct metrics **out, char *err, size_t errlen)
{
    *out = NULL;
    if (o->n_ranks < 1 || o->n_ranks > METRICS_MAX_RANKS)
        return ms_err(err, errlen, MS_EINVAL, "metrics: %d ranks; expected 1..%d", o->n_ranks,
                      METRICS_MAX_RANKS);
    if (o->n_experts < 0 || o->n_experts > 1 << 16)
        return ms_err(err, errlen, MS_EINVAL, "metrics: %d experts; expected 0..65536", o->n_experts);
    struct metrics *m = calloc(1, sizeof *m);
    if (!m) return ms_err(err, errlen, MS_ENOMEM, "out of memory for metrics");
    m->n_ranks = o->n_ranks;
    m->n_experts = o->n_experts;
    m->window = o->imbalance_window > 0 ? o->imbalance_window : 100;
    size_t re = (size_t)o->n_ranks * (size_t)(o->n_experts ? o->n_experts : 1);
    m->expert_tokens = calloc(re, sizeof *m->expert_tokens);
    m->expert_held = calloc(re, sizeof *m->expert_held);
    m->win_load = calloc((size_t)m->window * (size_t)o->n_ranks, sizeof *m->win_load);
    m->win_sum = calloc((size_t)o->n_ranks, sizeof *m->win_sum);
    m->prev_load = calloc((size_t)o->n_ranks, sizeof *m->prev_load);
    m->n_layers = o->n_experts && o->n_layers > 0 ? o->n_layers : 0;
    if (m->n_layers > 4096) m->n_layers = 4096;
    if (m->n_layers)
        m->layer_tokens = calloc((size_t)o->n_ranks * (size_t)m->n_layers, sizeof *m->layer_tokens);
    if (!m->expert_tokens || !m->expert_held || !m->win_load || !m->win_sum ||
        !m->prev_load || (m->n_layers && !m->layer_tokens) || pthread_mutex_init(&m->mu, NULL)) {
        free(m->layer_tokens);
        free(m->expert_tokens);
        free(m->expert_held);
        free(m->win_load);
        free(m->win_sum);
        free(m->prev_load);
        free(m);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory for metrics");
    }
    hist_init(&m->hist[METRICS_TTFT], ttft_bounds, NB(ttft_bounds));
    hist_init(&m->hist[METRICS_ITL], itl_bounds, NB(itl_bounds));
    hist_init(&m->hist[METRICS_E2E], request_bounds, NB(request_bounds));
    hist_init(&m->hist[METRICS_QUEUE], request_bounds, NB(request_bounds));
    hist_init(&m->hist[METRICS_PREFILL], request_bounds, NB(request_bounds));
    hist_init(&m->hist[METRICS_DECODE], request_bounds, NB(request_bounds));
    hist_init(&m->hist[METRICS_ITER_TOKENS], tokens_bounds, NB(tokens_bounds));
    hist_init(&m->hist[METRICS_STEP], step_bounds, NB(step_bounds));
    hist_init(&m->hist[METRICS_INFERENCE], request_bounds, NB(request_bounds));
    hist_init(&m->hist[METRICS_TPOT], itl_bounds, NB(itl_bounds));
    int tb = bounds_upto(o->max_model_len);
    hist_init(&m->hist[METRICS_PROMPT_TOKENS], one_two_five, tb);
    hist_init(&m->hist[METRICS_GEN_TOKENS], one_two_five, tb);
    hist_init(&m->hist[METRICS_PARAMS_N], n_bounds, NB(n_bounds));
    hist_init(&m->hist[METRICS_PARAMS_MAX_TOKENS], one_two_five, tb);
    for (int r = 0; r < o->n_ranks; r++) hist_init(&m->a2a[r], step_bounds, NB(step_bounds));
    *out = m;
    return 0;
}

void metrics_destroy(struct metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->layer_tokens);
    free(m->expert_tokens);
    free(m->expert_held);
    free(m->win_load);
    free(m->win_sum);
    free(m->prev_load);
    free(m);
}

void metrics_observe_first_token(struct metrics *m, double ttft)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->hist[METRICS_TTFT], ttft, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_inter_token(struct metrics *m, double gap, int n)
{
    if (n < 1) return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->hist[METRICS_ITL], gap / n, (uint64_t)n);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_request(struct metrics *m, const struct metrics_request *r)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->hist[METRICS_E2E], r->e2e, 1);
    hist_add(&m->hist[METRICS_QUEUE], r->queue, 1);
    hist_add(&m->hist[METRICS_PREFILL], r->prefill, 1);
    hist_add(&m->hist[METRICS_DECODE], r->decode, 1);
    if (r->prefill >= 0 && r->decode >= 0) hist_add(&m->hist[METRICS_INFERENCE], r->prefill + r->decode, 1);
    if (r->decode >= 0 && r->generation_tokens > 1)
        hist_add(&m->hist[METRICS_TPOT], r->decode / (r->generation_tokens - 1), 1);
    if (r->prompt_tokens >= 0) {
        hist_add(&m->hist[METRICS_PROMPT_TOKENS], r->prompt_tokens, 1);
        hist_add(&m->hist[METRICS_GEN_TOKENS], r->generation_tokens, 1);
    }
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_params(struct metrics *m, int n, int max_tokens)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->hist[METRICS_PARAMS_N], n, 1);
    if (max_tokens > 0) hist_add(&m->hist[METRICS_PARAMS_MAX_TOKENS], max_tokens, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_step(struct metrics *m, const struct metrics_step *s)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->hist[METRICS_STEP], s->seconds, 1);
    if (s->tokens > 0) hist_add(&m->hist[METRICS_ITER_TOKENS], (double)s->tokens, 1);
    int nr = s->n_ranks < m->n_ranks ? s->n_ranks : m->n_ranks;
    uint64_t load[METRICS_MAX_RANKS] = {0};
    bool any_experts = false;
    for (int r = 0; r < nr; r++) {
        hist_add(&m->a2a[r], s->rank[r].a2a_seconds, 1);
        const uint64_t *et = s->rank[r].expert_tokens;
        if (!et || !m->n_experts) continue;
        any_experts = true;
        int b = s->rank[r].expert_begin < 0 ? 0 : s->rank[r].expert_begin;
        int e = s->rank[r].expert_end > m->n_experts ? m->n_experts : s->rank[r].expert_end;
        uint64_t *row = m->expert_tokens + (size_t)r * (size_t)m->n_experts;
        bool *held = m->expert_held + (size_t)r * (size_t)m->n_experts;
        for (int x = b; x < e; x++) {
            row[x] = et[x];
            held[x] = true;
            load[r] += et[x];
        }
        if (m->n_layers && s->rank[r].layer_tokens)
            memcpy(m->layer_tokens + (size_t)r * (size_t)m->n_layers, s->rank[r].layer_tokens,
                   (size_t)m->n_layers * sizeof *m->layer_tokens);
    }
    if (any_experts) {
        // The window holds each step's load per rank: cumulative now minus
        // cumulative at the previous step (counters only grow).
        uint64_t *slot = m->win_load + (size_t)m->win_pos * (size_t)m->n_ranks;
        for (int r = 0; r < m->n_ranks; r++) {
            uint64_t d = m->have_prev && load[r] >= m->prev_load[r] ? load[r] - m->prev_load[r] : 0;
            if (!m->have_prev) d = load[r];
            if (m->win_fill == m->window) m->win_sum[r] -= slot[r];
            slot[r] = d;
            m->win_sum[r] += d;
            m->prev_load[r] = load[r];
        }
        m->have_prev = true;
        m->win_pos = (m->win_pos + 1) % m->window;
        if (m->win_fill < m->window) m->win_fill++;
    }
    pthread_mutex_unlock(&m->mu);
}

static double imbalance_locked(const struct metrics *m)
{
    uint64_t max = 0, sum = 0;
    for (int r = 0; r < m->n_ranks; r++) {
        sum += m->win_sum[r];
        if (m->win_sum[r] > max) max = m->win_sum[r];
    }
    if (!sum) return 0.0;
    return (double)max / ((double)sum / m->n_ranks);
}

int metrics_take_snapshot(struct metrics *m, struct metrics_snapshot *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    size_t re = (size_t)m->n_ranks * (size_t)m->n_experts;
    if (re) {
        s->expert_tokens = malloc(re * sizeof *s->expert_tokens);
        s->expert_held = malloc(re * sizeof *s->expert_held);
        if (!s->expert_tokens || !s->expert_held) {
            metrics_snapshot_release(s);
            return ms_err(err, errlen, MS_ENOMEM, "out of memory copying the metrics");
        }
    }
    size_t rl = (size_t)m->n_ranks * (size_t)m->n_layers;
    if (rl && !(s->layer_tokens = malloc(rl * sizeof *s->layer_tokens))) {
        metrics_snapshot_release(s);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory copying the metrics");
    }
    s->n_ranks = m->n_ranks;
    s->n_experts = m->n_experts;
    s->n_layers = m->n_layers;
    pthread_mutex_lock(&m->mu);
    if (rl) memcpy(s->layer_tokens, m->layer_tokens, rl * sizeof *s->layer_tokens);
    memcpy(s->hist, m->hist, sizeof s->hist);
    memcpy(s->a2a, m->a2a, (size_t)m->n_ranks * sizeof s->a2a[0]);
    if (re) {
        memcpy(s->expert_tokens, m->expert_tokens, re * sizeof *s->expert_tokens);
        memcpy(s->expert_held, m->expert_held, re * sizeof *s->expert_held);
    }
    s->imbalance = imbalance_locked(m);
    pthread_mutex_unlock(&m->mu);
    return 0;
}

void metrics_snapshot_release(struct metrics_snapshot *s)
{
    free(s->expert_tokens);
    free(s->expert_held);
    free(s->layer_tokens);
    s->expert_tokens = NULL;
    s->expert_held = NULL;
    s->layer_tokens = NULL;
}
