// prometheus: the text format written line by line into one growing buffer;
// a failed allocation is remembered and reported once at the end.
#include "server/prometheus.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"
#include "model/backend.h"

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

// ---- the page's text --------------------------------------------------------------------------
// The shared byte buffer, with the first failure remembered so that the many
// put calls need no checks: render reports it once at the end.
struct buf {
    struct ms_buf text;
    bool oom;
    const char *prefix;              // "moeserve", "vllm"
    const char *model;               // the escaped model_name label
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    if (ms_buf_append_vfmt(&b->text, fmt, ap)) b->oom = true;
    va_end(ap);
}

static void head(struct buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s:%s %s\n# TYPE %s:%s %s\n", b->prefix, name, help, b->prefix, name, type);
}

// One sample: prefix:name{model_name="…"<labels>} value (labels: ",k=\"v\"…" or "").
static void sample(struct buf *b, const char *name, const char *labels, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void sample(struct buf *b, const char *name, const char *labels, const char *fmt, ...)
{
    put(b, "%s:%s{model_name=\"%s\"%s} ", b->prefix, name, b->model, labels);
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    if (ms_buf_append_vfmt(&b->text, fmt, ap)) b->oom = true;
    va_end(ap);
    put(b, "\n");
}

static void hist_render(struct buf *b, const char *name, const char *extra,
                        const struct metrics_hist *h)
{
    char labels[96], series[96];
    uint64_t cum = 0;
    snprintf(series, sizeof series, "%s_bucket", name);
    for (int i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        if (i < h->n) snprintf(labels, sizeof labels, "%s,le=\"%.6g\"", extra, h->bounds[i]);
        else snprintf(labels, sizeof labels, "%s,le=\"+Inf\"", extra);
        sample(b, series, labels, "%llu", (unsigned long long)cum);
    }
    snprintf(series, sizeof series, "%s_sum", name);
    sample(b, series, extra, "%.9g", h->sum);
    snprintf(series, sizeof series, "%s_count", name);
    sample(b, series, extra, "%llu", (unsigned long long)h->count);
}

// The histograms in the order they are listed, with their help lines.
static const struct {
    enum metrics_hist_id id;
    const char *name, *help;
} hists[] = {
    {METRICS_TTFT, "time_to_first_token_seconds", "Submission to first generated token."},
    {METRICS_ITL, "inter_token_latency_seconds", "Time between successive generated tokens."},
    {METRICS_E2E, "e2e_request_latency_seconds", "Submission to the end of the request."},
    {METRICS_QUEUE, "request_queue_time_seconds", "Submission until first scheduled."},
    {METRICS_PREFILL, "request_prefill_time_seconds", "First scheduled until the first token."},
    {METRICS_DECODE, "request_decode_time_seconds", "First token until the end of the request."},
    {METRICS_ITER_TOKENS, "iteration_tokens_total", "Tokens processed per engine step, all ranks."},
    {METRICS_STEP, "step_duration_seconds", "Wall time of one engine step."},
    {METRICS_INFERENCE, "request_inference_time_seconds", "First scheduled until the end (prefill and decode)."},
    {METRICS_TPOT, "request_time_per_output_token_seconds", "A request's decode time per token after its first."},
    {METRICS_PROMPT_TOKENS, "request_prompt_tokens", "Prompt tokens per request."},
    {METRICS_GEN_TOKENS, "request_generation_tokens", "Tokens generated per request."},
    {METRICS_PARAMS_N, "request_params_n", "The n parameter of each API request."},
    {METRICS_PARAMS_MAX_TOKENS, "request_params_max_tokens", "The max_tokens parameter of each API request that gave one."},
};

// Long because it is the page itself: every series in the order Prometheus
// users see it, each a head line and its samples.
int prometheus_render(const struct prometheus_page *pg, const struct engine_stats *st,
                      const struct metrics_snapshot *ms, char **out, size_t *len, char *err,
                      size_t errlen)
{
    char *ml = escape_label(pg->model_name ? pg->model_name : "");
    struct buf b = {.prefix = pg->prefix ? pg->prefix : "moeserve", .model = ml};
    if (ms_buf_reserve(&b.text, 16384) || !ml) {
        ms_buf_free(&b.text);
        free(ml);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory rendering metrics");
    }
    int nr = st->n_ranks < ms->n_ranks ? st->n_ranks : ms->n_ranks;
    char lab[128];

    head(&b, "num_requests_running", "gauge", "Requests in the running batches of all ranks.");
    sample(&b, "num_requests_running", "", "%d", st->num_running);
    head(&b, "num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
    sample(&b, "num_requests_waiting", "", "%d", st->num_waiting);
    head(&b, "kv_cache_usage_perc", "gauge",
         "Share of the rank's KV blocks held by running sequences (1 = full).");
    long blocks = 0;
    for (int r = 0; r < nr; r++) {
        const struct engine_rank_stats *rs = &st->rank[r];
        double u = rs->kv_blocks_total > 0 ? (double)rs->kv_blocks_used / rs->kv_blocks_total : 0.0;
        snprintf(lab, sizeof lab, ",rank=\"%d\"", r);
        sample(&b, "kv_cache_usage_perc", lab, "%.6g", u);
        blocks += rs->kv_blocks_total;
    }
    head(&b, "num_requests_running_per_rank", "gauge", "Running sequences placed on each rank.");
    for (int r = 0; r < nr; r++) {
        snprintf(lab, sizeof lab, ",rank=\"%d\"", r);
        sample(&b, "num_requests_running_per_rank", lab, "%d", st->rank[r].num_running);
    }
    head(&b, "cache_config_info", "gauge", "Information of the KV cache (the labels; the value is 1).");
    char info[320];
    snprintf(info, sizeof info, ",block_size=\"%d\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\","
             "gpu_memory_utilization=\"%g\",num_gpu_blocks=\"%ld\"", KV_BLOCK_TOKENS,
             pg->cache_dtype ? pg->cache_dtype : "auto", pg->enable_prefix_caching ? "True" : "False",
             pg->gpu_memory_utilization, blocks);
    sample(&b, "cache_config_info", info, "1");
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
        sample(&b, counters[i].name, "", "%llu", (unsigned long long)counters[i].v);
    }
    head(&b, "request_success_total", "counter", "Requests finished, by finish reason.");
    for (int f = FINISH_STOP; f < FINISH_COUNT_; f++) { // vLLM's label values
        snprintf(lab, sizeof lab, ",finished_reason=\"%s\"", engine_finish_name((enum engine_finish)f));
        sample(&b, "request_success_total", lab, "%llu", (unsigned long long)st->request_success[f]);
    }

    for (size_t i = 0; i < sizeof hists / sizeof hists[0]; i++) {
        head(&b, hists[i].name, "histogram", hists[i].help);
        hist_render(&b, hists[i].name, "", &ms->hist[hists[i].id]);
    }
    head(&b, "all_to_all_seconds", "histogram", "Time a rank spends in MoE all-to-all exchanges per step.");
    for (int r = 0; r < ms->n_ranks; r++) {
        snprintf(lab, sizeof lab, ",rank=\"%d\"", r);
        hist_render(&b, "all_to_all_seconds", lab, &ms->a2a[r]);
    }
    // Where the step time goes, per rank: a counter per phase, so that
    // rate() over any window gives each phase's share of the wall time.
    head(&b, "step_phase_seconds_total", "counter",
         "Wall time of each rank's steps by phase: attention, moe (with its exchanges), "
         "lm_head, sampling.");
    for (int r = 0; r < st->n_ranks && r < ENGINE_MAX_RANKS; r++)
        for (int f = 0; f < ENGINE_PHASES; f++) {
            snprintf(lab, sizeof lab, ",rank=\"%d\",phase=\"%s\"", r, engine_phase_names[f]);
            sample(&b, "step_phase_seconds_total", lab, "%.6f", st->rank[r].phase_seconds[f]);
        }
    if (ms->n_experts) {
        head(&b, "expert_tokens_total", "counter",
             "Tokens routed to each expert on each rank, summed over MoE layers.");
        for (int r = 0; r < ms->n_ranks; r++)
            for (int x = 0; x < ms->n_experts; x++) {
                size_t i = (size_t)r * (size_t)ms->n_experts + (size_t)x;
                if (!ms->expert_held[i]) continue;
                snprintf(lab, sizeof lab, ",rank=\"%d\",expert=\"%d\"", r, x);
                sample(&b, "expert_tokens_total", lab, "%llu", (unsigned long long)ms->expert_tokens[i]);
            }
        if (ms->n_layers) {
            head(&b, "expert_layer_tokens_total", "counter",
                 "Tokens routed to the experts each rank holds, per layer (0 for dense layers).");
            for (int r = 0; r < ms->n_ranks; r++)
                for (int l = 0; l < ms->n_layers; l++) {
                    snprintf(lab, sizeof lab, ",rank=\"%d\",layer=\"%d\"", r, l);
                    sample(&b, "expert_layer_tokens_total", lab, "%llu",
                           (unsigned long long)ms->layer_tokens[(size_t)r * (size_t)ms->n_layers + (size_t)l]);
                }
        }
        head(&b, "expert_load_imbalance", "gauge",
             "Busiest rank's expert tokens over the mean across ranks, over the last steps "
             "(1 = balanced, 0 = no load yet).");
        sample(&b, "expert_load_imbalance", "", "%.6g", ms->imbalance);
    }
    free(ml);
    if (b.oom) {
        ms_buf_free(&b.text);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory rendering metrics");
    }
    *out = ms_buf_steal(&b.text, len);
    return 0;
}
