// sampling: what a request asks of the sampler — the parameters (vLLM's
// SamplingParams), the one place their ranges are checked and
// generation_config.json's defaults merged, the sampled token with its
// logprobs, and the counter-based generator every backend draws from.
//
// The generator is Philox-4x32-10 keyed by the request's seed and counted by
// (stream, position): stream is the choice index of an n > 1 request and
// position the index in the sequence of the token being drawn. A draw is
// therefore a pure function of (seed, stream, position) and the logits, so
// the same token comes out whatever else is batched, whichever rank or
// backend computes it, and after a preemption recomputes the sequence.
#ifndef MOESERVE_MODEL_SAMPLING_H
#define MOESERVE_MODEL_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define SAMPLING_MAX_LOGPROBS 20

struct sampling_logit_bias {
    int32_t id;
    float bias;                  // [-100, 100]
};

struct sampling_params {
    float temperature;           // [0, 2] as OpenAI bounds it; 0: greedy
    float top_p;                 // (0, 1]; 1: off
    int top_k;                   // <= 0: off (-1 as vLLM spells it)
    float min_p;                 // [0, 1]; 0: off
    float presence_penalty;      // [-2, 2]; 0: off
    float frequency_penalty;     // [-2, 2]; 0: off
    float repetition_penalty;    // (0, 10]; 1: off
    bool has_seed;
    uint64_t seed;               // the generator's key (a random one when !has_seed)
    uint32_t stream;             // the choice index: choices of one seeded request differ
    const struct sampling_logit_bias *logit_bias; // (n_logit_bias), ids distinct or not: added in order
    int n_logit_bias;
    int logprobs;                // -1: none; k >= 0: the sampled token's logprob and k alternatives
    int prompt_logprobs;         // -1: none; k >= 0: the same for every prompt token after the first
};

// vLLM's neutral defaults: temperature 1, every filter and penalty off,
// no logprobs.
void sampling_params_default(struct sampling_params *p);

// Which fields a request set itself; the rest may come from the checkpoint.
struct sampling_set {
    bool temperature, top_p, top_k, min_p, repetition_penalty;
};

// generation_config.json's sampling defaults (temperature, top_p, top_k,
// min_p, repetition_penalty) for every field the request left unset, as vLLM
// does; g may be NULL (vLLM's neutral defaults stay).
void sampling_params_merge_defaults(struct sampling_params *p, const struct sampling_set *set,
                                    const struct gen_defaults *g);

// The one range check of every parameter (the API reports its sentence as a
// 400 with the parameter's name in param_out when non-NULL). vocab bounds
// logit_bias ids. Returns 0 or MS_EINVAL.
int sampling_params_check(const struct sampling_params *p, int vocab, const char **param_out,
                          char *err, size_t errlen);

// The range of a float parameter by its name ("temperature", "top_p",
// "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
// [lo, hi], lo itself excluded when *lo_open. False for any other name. The
// API checks each field with it as it parses, sampling_params_check the
// whole set: one table of ranges for both.
bool sampling_param_range(const char *name, double *lo, double *hi, bool *lo_open);

struct sample_logprob {
    int32_t id;
    float logprob;
};

// One sampled (or scored) token.
struct sample_token {
    int32_t id;
    float logprob;                      // of id in the raw distribution, when asked
    // A scored row's (a prompt token's): how many tokens of the raw row are
    // at least as likely as id (1: the most likely), vLLM's rank; 0 on a
    // drawn row.
    int32_t rank;
    int n_top;                          // alternatives in top, best first
    struct sample_logprob top[SAMPLING_MAX_LOGPROBS];
};

// ---- the counter-based generator ----------------------------------------------
// Plain C with no state and no library calls, so that a device compiler can
// use the same lines (gpu/ includes this header).

#if defined(__CUDACC__)
#define SAMPLING_FN static inline __host__ __device__
#else
#define SAMPLING_FN static inline
#endif

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): ten rounds of multiply-xor over a 128-bit counter under a
// 64-bit key.
SAMPLING_FN void sampling_philox(uint32_t ctr[4], uint64_t key)
{
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0], p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        const uint32_t h0 = (uint32_t)(p0 >> 32), l0 = (uint32_t)p0;
        const uint32_t h1 = (uint32_t)(p1 >> 32), l1 = (uint32_t)p1;
        const uint32_t c1 = ctr[1], c3 = ctr[3];
        ctr[0] = h1 ^ c1 ^ k0;
        ctr[1] = l1;
        ctr[2] = h0 ^ c3 ^ k1;
        ctr[3] = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// The uniform in [0, 1) (53 random bits) that draws token `position` of
// choice `stream` of a request seeded with `seed`.
SAMPLING_FN double sampling_uniform(uint64_t seed, uint32_t stream, uint32_t position)
{
    uint32_t c[4] = {position, stream, 0x6d6f6573u /* "moes" */, 0};
    sampling_philox(c, seed);
    const uint64_t bits = ((uint64_t)c[0] << 32 | c[1]) >> 11;
    return (double)bits * (1.0 / 9007199254740992.0); // 2^-53
}

#endif
