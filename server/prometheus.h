// prometheus: the /metrics text (exposition format 0.0.4) — vLLM's series
// names under the prefix `moeserve:` plus what MoE serving needs (tokens per
// expert and rank, expert-load imbalance, all-to-all and step time), from
// the engine's stats and a snapshot of scheduler/metrics' counters.
#ifndef MOESERVE_SERVER_PROMETHEUS_H
#define MOESERVE_SERVER_PROMETHEUS_H

#include <stddef.h>

#include "scheduler/engine.h"
#include "scheduler/metrics.h"

// Renders engine gauges and counters from st, then the histograms and MoE
// series from ms, every sample labelled model_name (escaped here: it may
// hold any bytes). *out is malloc'd and NUL-terminated, *len its length;
// the caller frees it. Pure: reads only its arguments, so any thread.
int prometheus_render(const char *model_name, const struct engine_stats *st,
                      const struct metrics_snapshot *ms, char **out, size_t *len, char *err,
                      size_t errlen);

#endif
