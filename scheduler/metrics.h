// metrics: the counters behind /metrics that the engine feeds — vLLM's
// latency histograms, step and all-to-all times, tokens per expert and rank,
// and the expert-load imbalance over a sliding window of steps. Readers take
// a consistent snapshot; rendering it as text is the server's
// (server/prometheus.h), so nothing here formats a byte.
#ifndef MOESERVE_SCHEDULER_METRICS_H
#define MOESERVE_SCHEDULER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/engine.h"

#define METRICS_MAX_RANKS ENGINE_MAX_RANKS

struct metrics_opts {
    int n_ranks;              // the `rank` label takes 0..n_ranks-1
    int n_experts;            // experts per MoE layer (0 for a dense model)
    int n_layers;             // layers (the `layer` label of the per-layer expert load); 0: none
    int imbalance_window;     // steps in the imbalance gauge's sliding window (100)
    int max_model_len;        // the token-count histograms' last bound (1-2-5 steps up to it); 0: 10^6
};

struct metrics;

int metrics_create(const struct metrics_opts *o, struct metrics **out, char *err, size_t errlen);
void metrics_destroy(struct metrics *m);

// All observation and snapshot functions are thread-safe (one mutex; each
// observation is a few additions). Times are seconds.

// A request's first generated token arrived ttft seconds after it was submitted.
void metrics_observe_first_token(struct metrics *m, double ttft);
// n more tokens arrived `gap` seconds after the previous ones (n > 1 when a
// step emits several at once: each counts once, at gap / n).
void metrics_observe_inter_token(struct metrics *m, double gap, int n);
// A request ended. queue: submitted until first scheduled; prefill: first
// scheduled until its first token; decode: first token until the end; e2e:
// submitted until the end. A negative value means "did not happen" (an
// aborted request that never ran) and is not observed. Inference time is
// prefill + decode, time per output token decode over the tokens after the
// first (observed when there were any).
struct metrics_request {
    double e2e, queue, prefill, decode;
    int prompt_tokens;        // its prompt (-1: not observed)
    int generation_tokens;    // tokens it generated
};
void metrics_observe_request(struct metrics *m, const struct metrics_request *r);
// The parameters of one API request, once (not per choice): n and max_tokens
// (0: not given, not observed).
void metrics_observe_params(struct metrics *m, int n, int max_tokens);

// One engine step over all ranks.
struct metrics_step {
    double seconds;                     // wall time of the step
    int tokens;                         // tokens processed, all ranks (iteration_tokens_total)
    int n_ranks;
    struct {
        double seconds;                 // this rank's forward
        double a2a_seconds;             // in all-to-all exchanges
        const uint64_t *expert_tokens;  // (n_experts) cumulative tokens each expert processed
                                        // on this rank, all layers; NULL: none
        int expert_begin, expert_end;   // the experts this rank holds: [begin, end)
        const uint64_t *layer_tokens;   // (n_layers) cumulative tokens this rank's experts
                                        // processed in each layer; NULL: none
    } rank[METRICS_MAX_RANKS];
};
void metrics_observe_step(struct metrics *m, const struct metrics_step *s);

// A histogram: counts per bucket, not cumulative.
#define METRICS_MAX_BOUNDS 31
struct metrics_hist {
    const double *bounds;                  // (n) upper bounds, ascending; static storage
    int n;
    uint64_t counts[METRICS_MAX_BOUNDS + 1]; // counts[i]: observations in (bounds[i-1], bounds[i]];
                                           // counts[n]: above the last bound (+Inf)
    double sum;
    uint64_t count;
};

// The histograms every server has, in the order /metrics lists them.
enum metrics_hist_id {
    METRICS_TTFT,          // submission to first token
    METRICS_ITL,           // between successive tokens
    METRICS_E2E,           // submission to the end
    METRICS_QUEUE,         // submission until first scheduled
    METRICS_PREFILL,       // first scheduled until the first token
    METRICS_DECODE,        // first token until the end
    METRICS_ITER_TOKENS,   // tokens per step, all ranks
    METRICS_STEP,          // wall time of a step
    METRICS_INFERENCE,     // first scheduled until the end (prefill + decode)
    METRICS_TPOT,          // a request's decode time per token after its first
    METRICS_PROMPT_TOKENS, // prompt tokens per request
    METRICS_GEN_TOKENS,    // generated tokens per request
    METRICS_PARAMS_N,      // n per API request
    METRICS_PARAMS_MAX_TOKENS, // max_tokens per API request that gave one
    METRICS_HISTS,
};

// Every counter at one moment (copied under the lock).
struct metrics_snapshot {
    struct metrics_hist hist[METRICS_HISTS];
    int n_ranks, n_experts;
    struct metrics_hist a2a[METRICS_MAX_RANKS]; // (n_ranks) time in all-to-all exchanges per step
    uint64_t *expert_tokens;  // (n_ranks, n_experts) latest cumulative tokens per expert; NULL when n_experts is 0
    bool *expert_held;        // (n_ranks, n_experts) whether the rank holds (and reported) the expert
    int n_layers;
    uint64_t *layer_tokens;   // (n_ranks, n_layers) latest cumulative tokens of the rank's experts
                              // per layer; NULL when n_layers or n_experts is 0
    double imbalance;         // busiest rank's expert load over the mean, over the
                              // sliding window (1 = balanced; 0 before any expert load)
};

// Fills *s. Its arrays are malloc'd (MS_ENOMEM when they cannot be);
// metrics_snapshot_release frees them (and sets them to NULL).
int metrics_take_snapshot(struct metrics *m, struct metrics_snapshot *s, char *err, size_t errlen);
void metrics_snapshot_release(struct metrics_snapshot *s);

#endif
