// metrics: the Prometheus series moeserve exports on /metrics — vLLM's names
// under the prefix `moeserve:` plus what MoE serving needs (tokens per
// expert and rank, expert-load imbalance, all-to-all and step time). The
// engine feeds observations; the server renders the text format.
#ifndef MOESERVE_SCHEDULER_METRICS_H
#define MOESERVE_SCHEDULER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/engine.h"

#define METRICS_MAX_RANKS ENGINE_MAX_RANKS

struct metrics_opts {
    const char *model_name;   // the `model_name` label (the first served model name)
    int n_ranks;              // the `rank` label takes 0..n_ranks-1
    int n_experts;            // experts per MoE layer (0 for a dense model)
    int imbalance_window;     // steps in the imbalance gauge's sliding window (100)
};

struct metrics;

int metrics_create(const struct metrics_opts *o, struct metrics **out, char *err, size_t errlen);
void metrics_destroy(struct metrics *m);

// All observation and render functions are thread-safe (one mutex; each
// observation is a few additions). Times are seconds.

// A request's first generated token arrived ttft seconds after it was submitted.
void metrics_observe_first_token(struct metrics *m, double ttft);
// n more tokens arrived `gap` seconds after the previous ones (n > 1 when a
// step emits several at once: each counts once, at gap / n).
void metrics_observe_inter_token(struct metrics *m, double gap, int n);
// A request ended. queue: submitted until first scheduled; prefill: first
// scheduled until its first token; decode: first token until the end; e2e:
// submitted until the end. A negative value means "did not happen" (an
// aborted request that never ran) and is not observed.
void metrics_observe_request(struct metrics *m, double e2e, double queue, double prefill,
                             double decode);

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
    } rank[METRICS_MAX_RANKS];
};
void metrics_observe_step(struct metrics *m, const struct metrics_step *s);

// The text exposition format (version 0.0.4): engine gauges and counters
// from st, then the histograms and MoE series. *out is malloc'd.
int metrics_render(struct metrics *m, const struct engine_stats *st, char **out, size_t *len,
                   char *err, size_t errlen);

// Busiest rank's expert load over the mean, over the sliding window
// (1 = balanced; 0 before any expert load). Exposed for tests.
double metrics_imbalance(struct metrics *m);

#endif
