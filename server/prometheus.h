// prometheus: the /metrics text (exposition format 0.0.4) — vLLM's series
// names under the prefix `moeserve:` (or `vllm:`, --metrics-prefix vllm) plus
// what MoE serving needs (tokens per expert and rank, per layer and rank,
// expert-load imbalance, all-to-all and step time), from the engine's stats
// and a snapshot of scheduler/metrics' counters.
#ifndef MOESERVE_SERVER_PROMETHEUS_H
#define MOESERVE_SERVER_PROMETHEUS_H

#include <stdbool.h>
#include <stddef.h>

#include "scheduler/engine.h"
#include "scheduler/metrics.h"

// What the page says about the server besides its counters.
struct prometheus_page {
    const char *prefix;              // before each series' colon: "moeserve", or "vllm" so that
                                     // dashboards and autoscalers built for vLLM read the same
    const char *model_name;          // the model_name label (escaped here: it may hold any bytes)
    // cache_config_info's labels, as vLLM gives them
    const char *cache_dtype;         // "bfloat16", "float32"...
    bool enable_prefix_caching;
    double gpu_memory_utilization;
};

// Renders engine gauges and counters from st, then the histograms and MoE
// series from ms, every sample labelled model_name. *out is malloc'd and
// NUL-terminated, *len its length; the caller frees it. Pure: reads only
// its arguments, so any thread.
int prometheus_render(const struct prometheus_page *pg, const struct engine_stats *st,
                      const struct metrics_snapshot *ms, char **out, size_t *len, char *err,
                      size_t errlen);

#endif
