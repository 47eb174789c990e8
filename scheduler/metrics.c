// metrics: histograms, per-expert counters and the imbalance window behind
// one mutex, and the Prometheus text rendering.
#include "scheduler/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
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
static const double step_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};

#define NB(a) ((int)(sizeof a / sizeof a[0]))

struct hist {
    const double *bounds;
    int n;
    uint64_t counts[32];   // per bucket (not cumulative); counts[n] is +Inf
    double sum;
    uint64_t count;
};

static void hist_init(struct hist *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n = n;
}

static void hist_add(struct hist *h, double v, uint64_t times)
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
    char *model_label;          // escaped
    int n_ranks, n_experts;
    struct hist ttft, itl, e2e, queue, prefill, decode, iter_tokens, step;
    struct hist a2a[METRICS_MAX_RANKS];
    uint64_t *expert_tokens;    // (n_ranks, n_experts) latest cumulative counts
    bool *expert_held;          // (n_ranks, n_experts)
    // Imbalance: per-step expert load of each rank over the last `window` steps.
    int window, win_pos, win_fill;
    uint64_t *win_load;         // (window, n_ranks)
    uint64_t *win_sum;          // (n_ranks)
    uint64_t *prev_load;        // (n_ranks) cumulative load at the previous step
    bool have_prev;
};

// Label values may hold any bytes a user chose (--served-model-name):
// backslash, double quote and newline are escaped, per the text format.
static char *escape_label(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(2 * n + 1);
    if (!o) return NULL;
    char *p = o;
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            *p++ = '\\';
            *p++ = *s;
        } else if (*s == '\n') {
            *p++ = '\\';
            *p++ = 'n';
        } else {
            *p++ = *s;
        }
    }
    *p = 0;
    return o;
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
    m->model_label = escape_label(o->model_name ? o->model_name : "");
    size_t re = (size_t)o->n_ranks * (size_t)(o->n_experts ? o->n_experts : 1);
    m->expert_tokens = calloc(re, sizeof *m->expert_tokens);
    m->expert_held = calloc(re, sizeof *m->expert_held);
    m->win_load = calloc((size_t)m->window * (size_t)o->n_ranks, sizeof *m->win_load);
    m->win_sum = calloc((size_t)o->n_ranks, sizeof *m->win_sum);
    m->prev_load = calloc((size_t)o->n_ranks, sizeof *m->prev_load);
    if (!m->model_label || !m->expert_tokens || !m->expert_held || !m->win_load || !m->win_sum ||
        !m->prev_load || pthread_mutex_init(&m->mu, NULL)) {
        free(m->model_label);
        free(m->expert_tokens);
        free(m->expert_held);
        free(m->win_load);
        free(m->win_sum);
        free(m->prev_load);
        free(m);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory for metrics");
    }
    hist_init(&m->ttft, ttft_bounds, NB(ttft_bounds));
    hist_init(&m->itl, itl_bounds, NB(itl_bounds));
    hist_init(&m->e2e, request_bounds, NB(request_bounds));
    hist_init(&m->queue, request_bounds, NB(request_bounds));
    hist_init(&m->prefill, request_bounds, NB(request_bounds));
    hist_init(&m->decode, request_bounds, NB(request_bounds));
    hist_init(&m->iter_tokens, tokens_bounds, NB(tokens_bounds));
    hist_init(&m->step, step_bounds, NB(step_bounds));
    for (int r = 0; r < o->n_ranks; r++) hist_init(&m->a2a[r], step_bounds, NB(step_bounds));
    *out = m;
    return 0;
}

void metrics_destroy(struct metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->model_label);
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
    hist_add(&m->ttft, ttft, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_inter_token(struct metrics *m, double gap, int n)
{
    if (n < 1) return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, gap / n, (uint64_t)n);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_request(struct metrics *m, double e2e, double queue, double prefill,
                             double decode)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->e2e, e2e, 1);
    hist_add(&m->queue, queue, 1);
    hist_add(&m->prefill, prefill, 1);
    hist_add(&m->decode, decode, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_step(struct metrics *m, const struct metrics_step *s)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->step, s->seconds, 1);
    if (s->tokens > 0) hist_add(&m->iter_tokens, (double)s->tokens, 1);
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

double metrics_imbalance(struct metrics *m)
{
    pthread_mutex_lock(&m->mu);
    double v = imbalance_locked(m);
    pthread_mutex_unlock(&m->mu);
    return v;
}

// ---- rendering --------------------------------------------------------------------------------
struct buf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void head(struct buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP moeserve:%s %s\n# TYPE moeserve:%s %s\n", name, help, name, type);
}

static void hist_render(struct buf *b, const char *model, const char *name, const char *extra,
                        const struct hist *h)
{
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        if (i < h->n)
            put(b, "moeserve:%s_bucket{model_name=\"%s\"%s,le=\"%.6g\"} %llu\n", name, model, extra,
                h->bounds[i], (unsigned long long)cum);
        else
            put(b, "moeserve:%s_bucket{model_name=\"%s\"%s,le=\"+Inf\"} %llu\n", name, model, extra,
                (unsigned long long)cum);
    }
    put(b, "moeserve:%s_sum{model_name=\"%s\"%s} %.9g\n", name, model, extra, h->sum);
    put(b, "moeserve:%s_count{model_name=\"%s\"%s} %llu\n", name, model, extra,
        (unsigned long long)h->count);
}

int metrics_render(struct metrics *m, const struct engine_stats *st, char **out, size_t *len,
                   char *err, size_t errlen)
{
    struct buf b = {.cap = 16384};
    b.p = malloc(b.cap);
    if (!b.p) return ms_err(err, errlen, MS_ENOMEM, "out of memory rendering metrics");
    b.p[0] = 0;
    const char *ml = m->model_label;
    int nr = st->n_ranks < m->n_ranks ? st->n_ranks : m->n_ranks;

    head(&b, "num_requests_running", "gauge", "Requests in the running batches of all ranks.");
    put(&b, "moeserve:num_requests_running{model_name=\"%s\"} %d\n", ml, st->num_running);
    head(&b, "num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
    put(&b, "moeserve:num_requests_waiting{model_name=\"%s\"} %d\n", ml, st->num_waiting);
    head(&b, "kv_cache_usage_perc", "gauge",
         "Share of the rank's KV blocks held by running sequences (1 = full).");
    for (int r = 0; r < nr; r++) {
        const struct engine_rank_stats *rs = &st->rank[r];
        double u = rs->kv_blocks_total > 0 ? (double)rs->kv_blocks_used / rs->kv_blocks_total : 0.0;
        put(&b, "moeserve:kv_cache_usage_perc{model_name=\"%s\",rank=\"%d\"} %.6g\n", ml, r, u);
    }
    head(&b, "num_requests_running_per_rank", "gauge", "Running sequences placed on each rank.");
    for (int r = 0; r < nr; r++)
        put(&b, "moeserve:num_requests_running_per_rank{model_name=\"%s\",rank=\"%d\"} %d\n", ml, r,
            st->rank[r].num_running);
    const struct {
        const char *name, *help;
        uint64_t v;
    } counters[] = {
        {"prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", st->prefix_cache_queries},
        {"prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", st->prefix_cache_hits},
        {"num_preemptions_total", "Sequences preempted to free KV blocks.", st->num_preemptions},
        {"prompt_tokens_total", "Prompt tokens processed.", st->prompt_tokens_total},
        {"generation_tokens_total", "Tokens generated.", st->generation_tokens_total},
        {"engine_steps_total", "Engine steps run (all ranks in lockstep).", st->steps},
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        head(&b, counters[i].name, "counter", counters[i].help);
        put(&b, "moeserve:%s{model_name=\"%s\"} %llu\n", counters[i].name, ml,
            (unsigned long long)counters[i].v);
    }
    head(&b, "request_success_total", "counter", "Requests finished, by finish reason.");
    // vLLM's label values, spelled here so that this file needs no engine code.
    static const char *const reasons[FINISH_COUNT_] = {
        [FINISH_STOP] = "stop", [FINISH_LENGTH] = "length", [FINISH_ABORT] = "abort"};
    for (int f = FINISH_STOP; f < FINISH_COUNT_; f++)
        put(&b, "moeserve:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n", ml,
            reasons[f], (unsigned long long)st->request_success[f]);

    pthread_mutex_lock(&m->mu);
    head(&b, "time_to_first_token_seconds", "histogram", "Submission to first generated token.");
    hist_render(&b, ml, "time_to_first_token_seconds", "", &m->ttft);
    head(&b, "inter_token_latency_seconds", "histogram", "Time between successive generated tokens.");
    hist_render(&b, ml, "inter_token_latency_seconds", "", &m->itl);
    head(&b, "e2e_request_latency_seconds", "histogram", "Submission to the end of the request.");
    hist_render(&b, ml, "e2e_request_latency_seconds", "", &m->e2e);
    head(&b, "request_queue_time_seconds", "histogram", "Submission until first scheduled.");
    hist_render(&b, ml, "request_queue_time_seconds", "", &m->queue);
    head(&b, "request_prefill_time_seconds", "histogram", "First scheduled until the first token.");
    hist_render(&b, ml, "request_prefill_time_seconds", "", &m->prefill);
    head(&b, "request_decode_time_seconds", "histogram", "First token until the end of the request.");
    hist_render(&b, ml, "request_decode_time_seconds", "", &m->decode);
    head(&b, "iteration_tokens_total", "histogram", "Tokens processed per engine step, all ranks.");
    hist_render(&b, ml, "iteration_tokens_total", "", &m->iter_tokens);
    head(&b, "step_duration_seconds", "histogram", "Wall time of one engine step.");
    hist_render(&b, ml, "step_duration_seconds", "", &m->step);
    head(&b, "all_to_all_seconds", "histogram", "Time a rank spends in MoE all-to-all exchanges per step.");
    for (int r = 0; r < m->n_ranks; r++) {
        char extra[32];
        snprintf(extra, sizeof extra, ",rank=\"%d\"", r);
        hist_render(&b, ml, "all_to_all_seconds", extra, &m->a2a[r]);
    }
    // Where the step time goes, per rank: a counter per phase, so that
    // rate() over any window gives each phase's share of the wall time.
    head(&b, "step_phase_seconds_total", "counter",
         "Wall time of each rank's steps by phase: attention, moe (with its exchanges), "
         "lm_head, sampling.");
    for (int r = 0; r < st->n_ranks && r < ENGINE_MAX_RANKS; r++)
        for (int f = 0; f < ENGINE_PHASES; f++)
            put(&b, "moeserve:step_phase_seconds_total{model_name=\"%s\",rank=\"%d\",phase=\"%s\"} %.6f\n",
                ml, r, engine_phase_names[f], st->rank[r].phase_seconds[f]);
    if (m->n_experts) {
        head(&b, "expert_tokens_total", "counter",
             "Tokens routed to each expert on each rank, summed over MoE layers.");
        for (int r = 0; r < m->n_ranks; r++)
            for (int x = 0; x < m->n_experts; x++) {
                size_t i = (size_t)r * (size_t)m->n_experts + (size_t)x;
                if (!m->expert_held[i]) continue;
                put(&b, "moeserve:expert_tokens_total{model_name=\"%s\",rank=\"%d\",expert=\"%d\"} %llu\n",
                    ml, r, x, (unsigned long long)m->expert_tokens[i]);
            }
        head(&b, "expert_load_imbalance", "gauge",
             "Busiest rank's expert tokens over the mean across ranks, over the last steps "
             "(1 = balanced, 0 = no load yet).");
        put(&b, "moeserve:expert_load_imbalance{model_name=\"%s\"} %.6g\n", ml, imbalance_locked(m));
    }
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory rendering metrics");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
