// sampler: one row of logits to one token under a request's sampling
// parameters (penalties, logit_bias, temperature, top-k, top-p, min-p), and
// the logprobs of the raw distribution. Randomness comes from a per-sequence
// generator, so a seeded request samples the same whatever else is batched.
#ifndef MOESERVE_SCHEDULER_SAMPLER_H
#define MOESERVE_SCHEDULER_SAMPLER_H

#include <stdint.h>

#include "scheduler/engine.h"

struct sampler_rng {
    uint64_t s[4];
};
void sampler_rng_seed(struct sampler_rng *rng, uint64_t seed);
double sampler_rng_uniform(struct sampler_rng *rng); // [0, 1)

// Working memory for one row of `vocab` logits; one per engine thread.
struct sampler_scratch;
struct sampler_scratch *sampler_scratch_create(int vocab);
void sampler_scratch_destroy(struct sampler_scratch *s);

// Samples from logits (vocab entries, modified in place). prompt/output are
// the sequence's tokens so far, for the penalties. out->logprob and out->top
// come from the unmodified distribution (log-softmax at temperature 1), with
// p->logprobs alternatives. Temperature 0 (or top_k 1) is greedy: the
// lowest id among equal maxima.
int sampler_sample(const struct engine_sampling *p, float *logits, int vocab,
                   const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                   struct sampler_rng *rng, struct sampler_scratch *scratch,
                   struct engine_token *out);

// Fills out->logprob for token id and out->top with k alternatives from a raw
// logits row (no sampling); used for prompt logprobs.
void sampler_logprobs(const float *logits, int vocab, int32_t id, int k,
                      struct sampler_scratch *scratch, struct engine_token *out);

#endif
