// Pins the backend's `sample` op (model/backend.h) parameter by parameter
// against vLLM's definitions: greedy ties, temperature, top_k (ties kept),
// top_p (nucleus edge), min_p, repetition / frequency / presence penalties,
// logit_bias, the allowed-token mask (before everything), raw logprobs with
// top alternatives, parameter validation, and draws that are a function of
// (seed, stream, position) alone: the same alone or in any batch.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/backend_registry.h"

// One row at a time through a CPU backend's sample op: the logits go to
// backend memory and come back modified (the penalties' effect is pinned).
struct sampler_scratch {
    struct backend *b;
    float *d;
    int cap;
};

// The generator's key and counter, as the engine keeps them per sequence.
struct sampler_rng {
    uint64_t seed;
    uint32_t position;
};

static void sampler_rng_seed(struct sampler_rng *r, uint64_t seed)
{
    r->seed = seed;
    r->position = 0;
}

static struct sampler_scratch *sampler_scratch_create(int vocab)
{
    struct sampler_scratch *s = calloc(1, sizeof *s);
    char err[256];
    struct backend_opts bo = {.n_threads = 1};
    assert_int_equal(backend_create(BACKEND_DEVICE_CPU, &bo, &s->b, err, sizeof err), 0);
    assert_int_equal(s->b->ops->alloc(s->b, (size_t)vocab * sizeof(float), (void **)&s->d), 0);
    s->cap = vocab;
    return s;
}

static void sampler_scratch_destroy(struct sampler_scratch *s)
{
    s->b->ops->free(s->b, s->d);
    backend_destroy(s->b);
    free(s);
}

static int sampler_sample(const struct sampling_params *p, float *logits, int vocab,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          struct sampler_rng *rng, struct sampler_scratch *s, struct sample_token *out)
{
    assert_true(vocab <= s->cap);
    struct sampling_params q = *p;
    q.seed = rng->seed;
    struct backend *b = s->b;
    b->ops->upload(b, s->d, logits, (size_t)vocab * sizeof *logits);
    const struct backend_sample_row row = {.logits = s->d, .p = &q, .prompt = prompt,
                                           .n_prompt = n_prompt, .output = output,
                                           .n_output = n_output, .position = rng->position++,
                                           .score = -1};
    int rc = b->ops->sample(b, &row, 1, vocab, out);
    b->ops->download(b, logits, s->d, (size_t)vocab * sizeof *logits);
    return rc;
}

// A prompt-logprob row: the logprob of id and k alternatives, no draw.
static void sampler_logprobs(const float *logits, int vocab, int32_t id, int k,
                             struct sampler_scratch *s, struct sample_token *out)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.prompt_logprobs = k;
    s->b->ops->upload(s->b, s->d, logits, (size_t)vocab * sizeof *logits);
    const struct backend_sample_row row = {.logits = s->d, .p = &p, .score = id};
    assert_int_equal(s->b->ops->sample(s->b, &row, 1, vocab, out), 0);
}

static struct sampling_params greedy(void)
{
    return (struct sampling_params){.temperature = 0, .top_p = 1, .top_k = 0, .min_p = 0,
                                    .repetition_penalty = 1, .logprobs = -1, .prompt_logprobs = -1};
}

static struct sampling_params random_sampling(void)
{
    struct sampling_params p = greedy();
    p.temperature = 1;
    return p;
}

static int sample(const struct sampling_params *p, const float *logits, int n, struct sampler_rng *rng,
                  struct sampler_scratch *s)
{
    float buf[64];
    memcpy(buf, logits, (size_t)n * sizeof *buf);
    struct sample_token t;
    assert_int_equal(sampler_sample(p, buf, n, NULL, 0, NULL, 0, rng, s, &t), 0);
    return t.id;
}

// Frequencies of n draws.
static void histogram(const struct sampling_params *p, const float *logits, int n, int draws,
                      uint64_t seed, double *freq)
{
    struct sampler_scratch *s = sampler_scratch_create(n);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) freq[i] = 0;
    for (int d = 0; d < draws; d++) freq[sample(p, logits, n, &rng, s)] += 1.0 / draws;
    sampler_scratch_destroy(s);
}

// The generator: a function of (seed, stream, position), uniform in [0, 1).
static void generator_is_keyed_counted_and_uniform(void **state)
{
    (void)state;
    int differ_seed = 0, differ_stream = 0;
    double sum = 0;
    for (uint32_t i = 0; i < 100000; i++) {
        double x = sampling_uniform(42, 0, i), y = sampling_uniform(42, 0, i);
        double z = sampling_uniform(43, 0, i), w = sampling_uniform(42, 1, i);
        assert_true(x == y);
        assert_true(x >= 0 && x < 1);
        differ_seed += x != z;
        differ_stream += x != w;
        sum += x;
    }
    assert_true(differ_seed > 99990);
    assert_true(differ_stream > 99990);
    assert_float_equal(sum / 100000, 0.5, 0.005);
}

static void greedy_takes_the_lowest_id_among_equal_maxima(void **state)
{
    (void)state;
    struct sampler_scratch *s = sampler_scratch_create(6);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 1);
    const float l[6] = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.0f};
    struct sampling_params p = greedy();
    assert_int_equal(sample(&p, l, 6, &rng, s), 1);
    // top_k 1 is greedy too, whatever the temperature.
    p = random_sampling();
    p.top_k = 1;
    p.temperature = 5;
    for (int i = 0; i < 50; i++) assert_int_equal(sample(&p, l, 6, &rng, s), 1);
    sampler_scratch_destroy(s);
}

// Greedy over a vocabulary longer than a vector and the first-match scan's
// blocks of 64: the largest value's lowest id wherever it falls, NaN never
// winning (nor an all-NaN row: id 0), +0 and -0 one value.
static void greedy_finds_the_first_maximum_anywhere(void **state)
{
    (void)state;
    const int n = 1000, firsts[] = {0, 1, 15, 16, 63, 64, 65, 500, 998, 999};
    struct sampler_scratch *s = sampler_scratch_create(n);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 5);
    float *l = malloc((size_t)n * sizeof *l);
    assert_non_null(l);
    const struct sampling_params p = greedy();
    for (size_t f = 0; f < sizeof firsts / sizeof firsts[0]; f++) {
        for (int i = 0; i < n; i++) l[i] = (float)((i * 37) % 101) * 0.01f - 2.0f;
        for (int i = 3; i < n; i += 41) l[i] = NAN;
        l[firsts[f]] = 7.5f;
        if (firsts[f] + 1 < n) l[n - 1] = 7.5f; // a later tie
        struct sample_token t;
        assert_int_equal(sampler_sample(&p, l, n, NULL, 0, NULL, 0, &rng, s, &t), 0);
        assert_int_equal(t.id, firsts[f]);
    }
    for (int i = 0; i < n; i++) l[i] = -1.0f;
    l[700] = 0.0f;
    l[300] = -0.0f;
    struct sample_token t;
    assert_int_equal(sampler_sample(&p, l, n, NULL, 0, NULL, 0, &rng, s, &t), 0);
    assert_int_equal(t.id, 300);
    for (int i = 0; i < n; i++) l[i] = NAN;
    assert_int_equal(sampler_sample(&p, l, n, NULL, 0, NULL, 0, &rng, s, &t), 0);
    assert_int_equal(t.id, 0);
    free(l);
    sampler_scratch_destroy(s);
}

// An infinite logit leaves no distribution to draw from: sampling takes the
// lowest id at +inf wherever it falls (inside, at the edges of and past the
// scan's blocks of 64, at the last id), as greedy would.
static void an_infinite_logit_is_taken_at_its_lowest_id(void **state)
{
    (void)state;
    const int n = 300, firsts[] = {0, 1, 63, 64, 65, 127, 128, 200, 255, 256, 298, 299};
    struct sampler_scratch *s = sampler_scratch_create(n);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 3);
    float *l = malloc((size_t)n * sizeof *l);
    assert_non_null(l);
    struct sampling_params p = random_sampling();
    for (size_t f = 0; f < sizeof firsts / sizeof firsts[0]; f++) {
        for (int i = 0; i < n; i++) l[i] = (float)(i % 7) * 0.1f;
        l[firsts[f]] = INFINITY;
        if (firsts[f] + 1 < n) l[n - 1] = INFINITY; // a later tie
        struct sample_token t;
        assert_int_equal(sampler_sample(&p, l, n, NULL, 0, NULL, 0, &rng, s, &t), 0);
        assert_int_equal(t.id, firsts[f]);
    }
    free(l);
    sampler_scratch_destroy(s);
}

static void temperature_scales_the_softmax(void **state)
{
    (void)state;
    const float l[4] = {1.0f, 0.0f, -1.0f, 0.5f};
    for (int ti = 0; ti < 2; ti++) {
        float T = ti ? 2.0f : 0.5f;
        struct sampling_params p = random_sampling();
        p.temperature = T;
        double f[4], z = 0, want[4];
        histogram(&p, l, 4, 40000, 7, f);
        for (int i = 0; i < 4; i++) z += exp(l[i] / T);
        for (int i = 0; i < 4; i++) {
            want[i] = exp(l[i] / T) / z;
            // Four sigma of a binomial proportion over 40000 draws.
            assert_float_equal(f[i], want[i], 4 * sqrt(want[i] * (1 - want[i]) / 40000) + 1e-3);
        }
    }
}

static void top_k_keeps_the_k_best_and_their_ties(void **state)
{
    (void)state;
    const float l[6] = {2.0f, 1.0f, 3.0f, 1.0f, 0.0f, 2.5f};
    struct sampling_params p = random_sampling();
    p.top_k = 2;
    double f[6];
    histogram(&p, l, 6, 20000, 3, f);
    assert_true(f[2] > 0 && f[5] > 0);
    assert_true(f[0] == 0 && f[1] == 0 && f[3] == 0 && f[4] == 0);
    assert_float_equal(f[2], exp(3.0) / (exp(3.0) + exp(2.5)), 0.02);
    // k = 4 lands on the tied 1.0s: vLLM keeps every value >= the k-th.
    p.top_k = 4;
    histogram(&p, l, 6, 20000, 3, f);
    assert_true(f[1] > 0 && f[3] > 0);
    assert_true(f[4] == 0);
}

// One draw from orig's logits under p, generator seeded with seed; got
// holds the logits as the sampler left them (its filters' -inf included).
static struct sample_token sample_filtered(const struct sampling_params *p, const float *orig, float *got, int n,
                                           uint64_t seed, struct sampler_scratch *s)
{
    struct sampler_rng rng;
    sampler_rng_seed(&rng, seed);
    memcpy(got, orig, (size_t)n * sizeof *got);
    struct sample_token tok;
    assert_int_equal(sampler_sample(p, got, n, NULL, 0, NULL, 0, &rng, s, &tok), 0);
    return tok;
}

static int desc_cmp(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

// top_k over a vocabulary in orders that stress a selection (rising,
// falling, shuffled, few distinct values, half -inf): the logits that come
// back are exactly those at or above the k-th largest (ties kept), the rest
// -inf, for k on both sides of the one-pass selection's limit.
static void top_k_keeps_the_values_at_or_above_the_kth_in_any_order(void **state)
{
    (void)state;
    enum { N = 6000 };
    struct sampler_scratch *s = sampler_scratch_create(N);
    float *orig = malloc(N * sizeof *orig), *got = malloc(N * sizeof *got), *sorted = malloc(N * sizeof *sorted);
    const int ks[] = {2, 3, 20, 255, 256, 257, 1000, N - 1}; // (top_k 1 is greedy: nothing masked)
    uint64_t r = 7;
    for (int order = 0; order < 5; order++) {
        for (int i = 0; i < N; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const float u = (float)(r >> 40) / (float)(1 << 24);
            orig[i] = order == 0   ? (float)i * 0.01f
                      : order == 1 ? (float)(N - i) * 0.01f
                      : order == 2 ? u * 20.0f - 10.0f
                      : order == 3 ? (float)(int)(u * 8.0f)
                                   : (i & 1 ? -INFINITY : u * 4.0f);
        }
        for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
            struct sampling_params p = random_sampling();
            p.top_k = ks[t];
            const struct sample_token tok = sample_filtered(&p, orig, got, N, 5, s);
            memcpy(sorted, orig, N * sizeof *sorted);
            qsort(sorted, N, sizeof *sorted, desc_cmp);
            const float kth = sorted[ks[t] - 1];
            for (int i = 0; i < N; i++) {
                const float want = orig[i] >= kth ? orig[i] : -INFINITY;
                if (memcmp(&got[i], &want, sizeof want)) fail_msg("order %d, k %d: logit %d", order, ks[t], i);
            }
            assert_true(orig[tok.id] >= kth);
        }
    }
    free(orig);
    free(got);
    free(sorted);
    sampler_scratch_destroy(s);
}

// top_k then top_p, as vLLM applies them: the nucleus is taken over the
// softmax of the k kept logits. What comes back finite is the smallest set
// of the best of those whose mass reaches top_p (computed here in double
// from the definition), each logit unchanged.
static void top_p_takes_its_nucleus_from_what_top_k_kept(void **state)
{
    (void)state;
    enum { N = 4000, K = 50 };
    struct sampler_scratch *s = sampler_scratch_create(N);
    float *orig = malloc(N * sizeof *orig), *got = malloc(N * sizeof *got), *sorted = malloc(N * sizeof *sorted);
    uint64_t r = 11;
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        orig[i] = (float)(r >> 40) / (float)(1 << 24) * 8.0f;
    }
    memcpy(sorted, orig, N * sizeof *sorted);
    qsort(sorted, N, sizeof *sorted, desc_cmp);
    const float top_ps[] = {0.05f, 0.3f, 0.6f, 0.95f};
    for (size_t t = 0; t < sizeof top_ps / sizeof top_ps[0]; t++) {
        double z = 0;
        for (int j = 0; j < K; j++) z += exp((double)sorted[j] - (double)sorted[0]);
        double above = 0;
        int keep = 0;
        while (keep < K && (keep == 0 || above < top_ps[t]))
            above += exp((double)sorted[keep++] - (double)sorted[0]) / z;
        struct sampling_params p = random_sampling();
        p.top_k = K;
        p.top_p = top_ps[t];
        const struct sample_token tok = sample_filtered(&p, orig, got, N, 9, s);
        int kept = 0;
        for (int i = 0; i < N; i++) {
            if (got[i] == -INFINITY) continue;
            kept++;
            assert_true(got[i] == orig[i]);
            assert_true(orig[i] >= sorted[keep - 1]);
        }
        assert_int_equal(kept, keep);
        assert_true(orig[tok.id] >= sorted[keep - 1]);
    }
    free(orig);
    free(got);
    free(sorted);
    sampler_scratch_destroy(s);
}

static void top_p_keeps_the_smallest_nucleus(void **state)
{
    (void)state;
    // Probabilities 0.5, 0.3, 0.15, 0.05.
    const float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    struct sampling_params p = random_sampling();
    double f[4];
    p.top_p = 0.7f; // 0.5 alone is short of 0.7: the 0.3 joins
    histogram(&p, l, 4, 20000, 11, f);
    assert_true(f[0] > 0 && f[1] > 0 && f[2] == 0 && f[3] == 0);
    assert_float_equal(f[0], 0.5 / 0.8, 0.02);
    p.top_p = 0.85f;
    histogram(&p, l, 4, 20000, 11, f);
    assert_true(f[2] > 0 && f[3] == 0);
    p.top_p = 0.1f; // the best token always stays
    histogram(&p, l, 4, 2000, 11, f);
    assert_float_equal(f[0], 1.0, 1e-9);
}

static void top_p_over_a_large_flat_vocabulary(void **state)
{
    (void)state;
    // 5000 equal tokens: the nucleus of 0.5 is the first 2500 ids (ties by id).
    enum { N = 5000 };
    float *l = calloc(N, sizeof *l), *buf = malloc(N * sizeof *buf);
    struct sampler_scratch *s = sampler_scratch_create(N);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 5);
    struct sampling_params p = random_sampling();
    p.top_p = 0.5f;
    int max_id = 0;
    for (int d = 0; d < 3000; d++) {
        memcpy(buf, l, N * sizeof *buf);
        struct sample_token t;
        assert_int_equal(sampler_sample(&p, buf, N, NULL, 0, NULL, 0, &rng, s, &t), 0);
        max_id = t.id > max_id ? t.id : max_id;
    }
    assert_true(max_id >= 2400 && max_id < 2501);
    free(l);
    free(buf);
    sampler_scratch_destroy(s);
}

static void min_p_drops_tokens_below_a_share_of_the_best(void **state)
{
    (void)state;
    const float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    struct sampling_params p = random_sampling();
    p.min_p = 0.25f; // threshold 0.125: 0.05 goes
    double f[4];
    histogram(&p, l, 4, 20000, 13, f);
    assert_true(f[2] > 0 && f[3] == 0);
    p.min_p = 0.7f; // threshold 0.35: only 0.5 stays
    histogram(&p, l, 4, 2000, 13, f);
    assert_float_equal(f[0], 1.0, 1e-9);
}

static void penalties_follow_vllm(void **state)
{
    (void)state;
    struct sampler_scratch *s = sampler_scratch_create(6);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 1);
    float l[6] = {2.0f, -2.0f, 1.0f, 4.0f, 0.0f, 3.0f};
    const int32_t prompt[2] = {0, 1}, output[4] = {3, 3, 5, 1};
    struct sampling_params p = greedy();
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    struct sample_token t;
    assert_int_equal(sampler_sample(&p, l, 6, prompt, 2, output, 4, &rng, s, &t), 0);
    // Repetition over prompt and output: positive / 2, negative * 2.
    // Frequency (count) and presence over the output only.
    assert_float_equal(l[0], 1.0f, 1e-6);
    assert_float_equal(l[1], -4.0f - 0.5f - 0.25f, 1e-6);
    assert_float_equal(l[2], 1.0f, 1e-6);
    assert_float_equal(l[3], 2.0f - 1.0f - 0.25f, 1e-6);
    assert_float_equal(l[4], 0.0f, 1e-6);
    assert_float_equal(l[5], 1.5f - 0.5f - 0.25f, 1e-6);
    assert_int_equal(t.id, 0); // ids 0 and 2 tie at 1.0: the lower id
    // Scratch counters are left clean: the same call again penalises once.
    float l2[6] = {2.0f, -2.0f, 1.0f, 4.0f, 0.0f, 3.0f};
    assert_int_equal(sampler_sample(&p, l2, 6, prompt, 2, output, 4, &rng, s, &t), 0);
    assert_memory_equal(l, l2, sizeof l);
    sampler_scratch_destroy(s);
}

static void logit_bias_shifts_chosen_tokens(void **state)
{
    (void)state;
    struct sampler_scratch *s = sampler_scratch_create(4);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 1);
    const float l[4] = {5.0f, 1.0f, 0.0f, 4.0f};
    const struct sampling_logit_bias bias[2] = {{.id = 0, .bias = -100}, {.id = 2, .bias = 4.5f}};
    struct sampling_params p = greedy();
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    assert_int_equal(sample(&p, l, 4, &rng, s), 2);
    p = random_sampling();
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    for (int i = 0; i < 500; i++) assert_int_not_equal(sample(&p, l, 4, &rng, s), 0);
    const struct sampling_logit_bias bad = {.id = 4, .bias = 1};
    p.logit_bias = &bad;
    float buf[4];
    memcpy(buf, l, sizeof buf);
    struct sample_token t;
    assert_int_equal(sampler_sample(&p, buf, 4, NULL, 0, NULL, 0, &rng, s, &t), MS_EINVAL);
    sampler_scratch_destroy(s);
}

static void logprobs_come_from_the_raw_distribution(void **state)
{
    (void)state;
    struct sampler_scratch *s = sampler_scratch_create(5);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 9);
    const float raw[5] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(raw[i]);
    const struct sampling_logit_bias bias = {.id = 3, .bias = 50};
    struct sampling_params p = random_sampling();
    p.temperature = 0.3f;
    p.logit_bias = &bias;
    p.n_logit_bias = 1;
    p.logprobs = 3;
    float buf[5];
    memcpy(buf, raw, sizeof buf);
    struct sample_token t;
    assert_int_equal(sampler_sample(&p, buf, 5, NULL, 0, NULL, 0, &rng, s, &t), 0);
    assert_int_equal(t.id, 3); // the bias decides the draw ...
    assert_float_equal(t.logprob, -2.0 - log(z), 1e-5); // ... not the reported logprob
    assert_int_equal(t.n_top, 3);
    assert_int_equal(t.top[0].id, 1); // ties: lower id first
    assert_int_equal(t.top[1].id, 2);
    assert_int_equal(t.top[2].id, 0);
    assert_float_equal(t.top[0].logprob, 3.0 - log(z), 1e-5);
    assert_float_equal(t.top[2].logprob, 1.0 - log(z), 1e-5);
    // logprobs 0: the sampled token's logprob, no alternatives; -1: nothing.
    p.logprobs = 0;
    memcpy(buf, raw, sizeof buf);
    assert_int_equal(sampler_sample(&p, buf, 5, NULL, 0, NULL, 0, &rng, s, &t), 0);
    assert_int_equal(t.n_top, 0);
    assert_float_equal(t.logprob, -2.0 - log(z), 1e-5);
    assert_int_equal(t.rank, 0); // a drawn row has none
    p.logprobs = SAMPLING_MAX_LOGPROBS + 1;
    assert_int_equal(sampler_sample(&p, buf, 5, NULL, 0, NULL, 0, &rng, s, &t), MS_EINVAL);
    // Prompt logprobs: any id, its rank (vLLM's: the tokens at least as
    // likely, itself and ties included), k alternatives.
    sampler_logprobs(raw, 5, 4, 2, s, &t);
    assert_int_equal(t.id, 4);
    assert_float_equal(t.logprob, 0.5 - log(z), 1e-5);
    assert_int_equal(t.rank, 4);
    assert_int_equal(t.n_top, 2);
    assert_int_equal(t.top[0].id, 1);
    const int32_t ranks[5] = {3, 2, 2, 5, 4};
    for (int32_t id = 0; id < 5; id++) {
        sampler_logprobs(raw, 5, id, 0, s, &t);
        assert_int_equal(t.rank, ranks[id]);
    }
    sampler_scratch_destroy(s);
}

static void bad_parameters_are_refused(void **state)
{
    (void)state;
    struct sampler_scratch *s = sampler_scratch_create(3);
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 1);
    float l[3] = {0, 1, 2};
    struct sample_token t;
    struct sampling_params p = random_sampling();
    p.temperature = -1;
    assert_int_equal(sampler_sample(&p, l, 3, NULL, 0, NULL, 0, &rng, s, &t), MS_EINVAL);
    p = random_sampling();
    p.top_p = 0;
    assert_int_equal(sampler_sample(&p, l, 3, NULL, 0, NULL, 0, &rng, s, &t), MS_EINVAL);
    p = random_sampling();
    p.min_p = 1.5f;
    assert_int_equal(sampler_sample(&p, l, 3, NULL, 0, NULL, 0, &rng, s, &t), MS_EINVAL);
    p = random_sampling();
    p.repetition_penalty = 0;
    assert_int_equal(sampler_sample(&p, l, 3, NULL, 0, NULL, 0, &rng, s, &t), MS_EINVAL);
    p = random_sampling();
    const struct backend_sample_row row = {.logits = s->d, .p = &p, .score = -1};
    assert_int_equal(s->b->ops->sample(s->b, &row, 1, 0, &t), MS_EINVAL); // no vocabulary
    assert_non_null(strstr(s->b->err, "vocabulary"));
    sampler_scratch_destroy(s);
}

// Same seed, same draws, whatever else the sampler did in between (the draw
// is keyed by the sequence's seed and counted by position); another seed
// draws differently.
static void a_seed_reproduces_the_draws(void **state)
{
    (void)state;
    enum { N = 50 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)sin(i * 1.7) * 2;
    struct sampler_scratch *s = sampler_scratch_create(N);
    struct sampling_params p = random_sampling();
    p.top_p = 0.9f;
    p.top_k = 30;
    int a[200], b[200], c[200];
    struct sampler_rng r1, r2, r3, other;
    sampler_rng_seed(&r1, 1234);
    sampler_rng_seed(&r2, 1234);
    sampler_rng_seed(&r3, 99);
    sampler_rng_seed(&other, 5);
    for (int i = 0; i < 200; i++) {
        a[i] = sample(&p, l, N, &r1, s);
        (void)sample(&p, l, N, &other, s); // another sequence interleaved
        c[i] = sample(&p, l, N, &r3, s);
    }
    for (int i = 0; i < 200; i++) b[i] = sample(&p, l, N, &r2, s);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    sampler_scratch_destroy(s);
}

// Rows sampled together in one call (split over the threads) draw exactly
// what each draws alone: the batch never enters the draw.
static void draws_do_not_depend_on_the_batch(void **state)
{
    (void)state;
    enum { V = 3000, ROWS = 24 };
    struct backend *b;
    char err[256];
    struct backend_opts bo = {.n_threads = 2};
    assert_int_equal(backend_create(BACKEND_DEVICE_CPU, &bo, &b, err, sizeof err), 0);
    float *d, *host = malloc((size_t)ROWS * V * sizeof *host);
    assert_int_equal(b->ops->alloc(b, (size_t)ROWS * V * sizeof(float), (void **)&d), 0);
    for (int i = 0; i < ROWS * V; i++) host[i] = (float)sin(i * 0.37) * 3;
    struct sampling_params p[ROWS];
    struct backend_sample_row rows[ROWS];
    struct sample_token together[ROWS], alone;
    const int32_t hist[3] = {5, 7, 5};
    for (int r = 0; r < ROWS; r++) {
        sampling_params_default(&p[r]);
        p[r].seed = 1000 + (uint64_t)(r % 3);
        p[r].stream = (uint32_t)(r % 2);
        p[r].top_k = r % 4 ? 50 : 0;
        p[r].top_p = r % 5 ? 0.9f : 1.0f;
        p[r].presence_penalty = r % 3 ? 0.5f : 0.0f;
        p[r].logprobs = 2;
        rows[r] = (struct backend_sample_row){.logits = d + (size_t)r * V, .p = &p[r],
                                              .output = hist, .n_output = 3,
                                              .position = (uint32_t)(r * 7), .score = -1};
    }
    b->ops->upload(b, d, host, (size_t)ROWS * V * sizeof *host);
    assert_int_equal(b->ops->sample(b, rows, ROWS, V, together), 0);
    for (int r = 0; r < ROWS; r++) {
        b->ops->upload(b, d + (size_t)r * V, host + (size_t)r * V, V * sizeof *host);
        assert_int_equal(b->ops->sample(b, &rows[r], 1, V, &alone), 0);
        assert_int_equal(alone.id, together[r].id);
        assert_true(alone.logprob == together[r].logprob);
        assert_int_equal(alone.n_top, 2);
        assert_int_equal(alone.top[1].id, together[r].top[1].id);
    }
    b->ops->free(b, d);
    backend_destroy(b);
    free(host);
}

// The allowed mask (structured output's) comes before everything: greedy
// and draws stay inside it, a bias cannot lift a token out of it, and the
// reported logprobs are still those of the raw row.
static void the_allowed_mask_comes_before_everything(void **state)
{
    (void)state;
    enum { N = 70 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)(i % 10);
    uint32_t allowed[3] = {0};
    const int ok[] = {3, 41, 66};
    for (int i = 0; i < 3; i++) allowed[ok[i] >> 5] |= 1u << (ok[i] & 31);
    struct sampler_scratch *s = sampler_scratch_create(N);
    struct sampling_params p = greedy();
    const struct sampling_logit_bias bias = {.id = 9, .bias = 100};
    p.logit_bias = &bias;
    p.n_logit_bias = 1;
    p.logprobs = 1;
    float buf[N];
    struct sample_token t;
    for (int mode = 0; mode < 2; mode++) {
        p.temperature = mode ? 1.0f : 0.0f;
        for (uint32_t pos = 0; pos < 300; pos++) {
            memcpy(buf, l, sizeof buf);
            p.seed = 77;
            s->b->ops->upload(s->b, s->d, buf, sizeof buf);
            const struct backend_sample_row row = {.logits = s->d, .p = &p, .position = pos,
                                                   .allowed = allowed, .score = -1};
            assert_int_equal(s->b->ops->sample(s->b, &row, 1, N, &t), 0);
            assert_true(t.id == 3 || t.id == 41 || t.id == 66);
            if (!mode) assert_int_equal(t.id, 66); // the best allowed (value 6)
            assert_int_equal(t.top[0].id, 9);      // the raw row's best
        }
    }
    sampler_scratch_destroy(s);
}

// A vocabulary spanning many of the draw's blocks: frequencies follow the
// softmax (mass placed in early, middle and last blocks), NaN logits are
// never drawn, and the mass per block matches.
static void draws_over_a_large_vocabulary_follow_the_softmax(void **state)
{
    (void)state;
    enum { V = 151936, DRAWS = 20000 };
    float *logits = malloc(V * sizeof *logits), *buf = malloc(V * sizeof *buf);
    for (int i = 0; i < V; i++) logits[i] = -10.0f + (float)(i % 7) * 0.1f; // together about a third of the mass
    const int hot[] = {3, 1500, 70001, 151935};
    const float hl[] = {2.0f, 1.0f, 1.5f, 0.5f};
    for (int i = 0; i < 4; i++) logits[hot[i]] = hl[i];
    for (int i = 200; i < V; i += 997) logits[i] = NAN;
    double z = 0;
    for (int i = 0; i < V; i++)
        if (!isnan(logits[i])) z += exp((double)logits[i]);
    struct sampler_scratch *s = sampler_scratch_create(V);
    struct sampling_params p = random_sampling();
    struct sampler_rng rng;
    sampler_rng_seed(&rng, 7);
    int count[4] = {0}, other = 0;
    for (int d = 0; d < DRAWS; d++) {
        memcpy(buf, logits, V * sizeof *buf);
        struct sample_token t;
        assert_int_equal(sampler_sample(&p, buf, V, NULL, 0, NULL, 0, &rng, s, &t), 0);
        assert_false(isnan(logits[t.id]));
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (t.id == hot[i]) k = i;
        if (k >= 0) count[k]++;
        else other++;
    }
    double p_other = 1;
    for (int i = 0; i < 4; i++) {
        double want = exp((double)hl[i]) / z, got = (double)count[i] / DRAWS;
        p_other -= want;
        if (fabs(got - want) > 4 * sqrt(want * (1 - want) / DRAWS) + 1e-3)
            fail_msg("token %d: frequency %.4f, softmax %.4f", hot[i], got, want);
    }
    double got_other = (double)other / DRAWS;
    if (fabs(got_other - p_other) > 4 * sqrt(p_other * (1 - p_other) / DRAWS) + 1e-3)
        fail_msg("the cold tokens: frequency %.4f, softmax %.4f", got_other, p_other);
    sampler_scratch_destroy(s);
    free(logits);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(draws_over_a_large_vocabulary_follow_the_softmax),
        cmocka_unit_test(generator_is_keyed_counted_and_uniform),
        cmocka_unit_test(greedy_takes_the_lowest_id_among_equal_maxima),
        cmocka_unit_test(greedy_finds_the_first_maximum_anywhere),
        cmocka_unit_test(an_infinite_logit_is_taken_at_its_lowest_id),
        cmocka_unit_test(temperature_scales_the_softmax),
        cmocka_unit_test(top_k_keeps_the_k_best_and_their_ties),
        cmocka_unit_test(top_k_keeps_the_values_at_or_above_the_kth_in_any_order),
        cmocka_unit_test(top_p_takes_its_nucleus_from_what_top_k_kept),
        cmocka_unit_test(top_p_keeps_the_smallest_nucleus),
        cmocka_unit_test(top_p_over_a_large_flat_vocabulary),
        cmocka_unit_test(min_p_drops_tokens_below_a_share_of_the_best),
        cmocka_unit_test(penalties_follow_vllm),
        cmocka_unit_test(logit_bias_shifts_chosen_tokens),
        cmocka_unit_test(logprobs_come_from_the_raw_distribution),
        cmocka_unit_test(bad_parameters_are_refused),
        cmocka_unit_test(a_seed_reproduces_the_draws),
        cmocka_unit_test(draws_do_not_depend_on_the_batch),
        cmocka_unit_test(the_allowed_mask_comes_before_everything),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
