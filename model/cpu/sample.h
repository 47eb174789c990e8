// sample: the CPU backend's sampler — one row of logits to one token the way
// vLLM's sampler does it (backend.h's `sample` op, row by row), and the
// logprobs of a given token for prompt logprobs.
#ifndef MOESERVE_MODEL_CPU_SAMPLE_H
#define MOESERVE_MODEL_CPU_SAMPLE_H

#include "model/backend.h"
#include "model/cpu/kernels.h"

// Working memory for rows of up to `vocab` logits; one per sampling thread.
struct cpu_sample_scratch;
struct cpu_sample_scratch *cpu_sample_scratch_create(int vocab, const struct cpu_kernels *k);
void cpu_sample_scratch_destroy(struct cpu_sample_scratch *s);

// One row (see struct backend_sample_row): row->logits is modified in place.
// Returns 0, or MS_EINVAL when the parameters are out of range (the engine
// checked them at submission, so this is a caller's bug).
int cpu_sample_row(const struct backend_sample_row *row, int vocab, struct cpu_sample_scratch *s,
                   struct sample_token *out);

#endif
