// sampler: logits to a token the way vLLM's sampler does it — logit_bias,
// then repetition/frequency/presence penalties, then greedy or temperature,
// min_p, top_k, top_p and a draw from a per-sequence xoshiro256** generator;
// logprobs always from the raw distribution.
#include "scheduler/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/cpu/kernels.h"

// vLLM treats temperatures below this as greedy.
#define SAMPLING_EPS 1e-5f

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sampler_rng_seed(struct sampler_rng *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(struct sampler_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double sampler_rng_uniform(struct sampler_rng *rng)
{
    return (double)(xoshiro_next(rng) >> 11) * 0x1.0p-53;
}

struct cand {
    float p;
    int32_t id;
};

struct sampler_scratch {
    int vocab;
    const struct cpu_kernels *k; // scale_max and exp_sum: the passes over the whole vocabulary
    float *raw;      // (vocab) the logits as they came, for logprobs
    float *work;     // (vocab) selection workspace
    float *probs;    // (vocab)
    int32_t *count;  // (vocab) occurrences in the output so far; zero between calls
    uint8_t *seen;   // (vocab) in prompt or output; zero between calls
    struct cand *cand; // (vocab) top_p candidates
    double *blocks;    // (CPU_EXP_BLOCKS(vocab)) sums of the draw's weights, block by block
};

struct sampler_scratch *sampler_scratch_create(int vocab)
{
    if (vocab < 1) return NULL;
    struct sampler_scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->vocab = vocab;
    s->k = cpu_kernels_best();
    s->raw = malloc((size_t)vocab * sizeof *s->raw);
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->seen = calloc((size_t)vocab, 1);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->blocks = malloc((size_t)CPU_EXP_BLOCKS(vocab) * sizeof *s->blocks);
    if (!s->raw || !s->work || !s->probs || !s->count || !s->seen || !s->cand || !s->blocks) {
        sampler_scratch_destroy(s);
        return NULL;
    }
    return s;
}

void sampler_scratch_destroy(struct sampler_scratch *s)
{
    if (!s) return;
    free(s->raw);
    free(s->work);
    free(s->probs);
    free(s->count);
    free(s->seen);
    free(s->cand);
    free(s->blocks);
    free(s);
}

static float clean(float v) { return isnan(v) ? -INFINITY : v; }

// Copies a row of logits into s->raw with NaN as -inf and returns its
// log(sum(exp)): the raw distribution the logprobs come from.
static double raw_log_sum_exp(const float *logits, int vocab, struct sampler_scratch *s)
{
    memcpy(s->raw, logits, (size_t)vocab * sizeof *logits);
    const float mx = s->k->scale_max(s->raw, 1.0f, vocab); // x * 1 is exact: only NaN changes
    if (!isfinite(mx)) return mx;
    return mx + log(s->k->exp_sum(s->raw, mx, s->probs, vocab, NULL));
}

// The k best of a row by (value descending, id ascending), by insertion into
// a short sorted list: almost every element fails the first comparison.
static void top_alternatives(const float *x, int n, int k, double lse, struct engine_token *out)
{
    if (k > n) k = n;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = clean(x[i]);
        if (m == k && !(v > out->top[m - 1].logprob)) continue;
        int at = m < k ? m++ : m - 1;
        while (at > 0 && v > out->top[at - 1].logprob) {
            out->top[at] = out->top[at - 1];
            at--;
        }
        out->top[at] = (struct engine_logprob){.id = i, .logprob = v};
    }
    for (int j = 0; j < m; j++) out->top[j].logprob = (float)((double)out->top[j].logprob - lse);
    out->n_top = m;
}

static float raw_logprob(float v, double lse)
{
    v = clean(v);
    return v == -INFINITY ? -INFINITY : (float)((double)v - lse);
}

void sampler_logprobs(const float *logits, int vocab, int32_t id, int k,
                      struct sampler_scratch *scratch, struct engine_token *out)
{
    if (k > ENGINE_MAX_LOGPROBS) k = ENGINE_MAX_LOGPROBS;
    out->id = id;
    out->n_top = 0;
    out->logprob = -INFINITY;
    if (!scratch || vocab < 1 || vocab > scratch->vocab) return;
    const double lse = raw_log_sum_exp(logits, vocab, scratch);
    if (id >= 0 && id < vocab) out->logprob = raw_logprob(scratch->raw[id], lse);
    if (k > 0) top_alternatives(scratch->raw, vocab, k, lse, out);
}

static int argmax_lowest(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (clean(x[i]) > clean(x[b])) b = i;
    return b;
}

// The first i with x[i] == v, else n - 1. Blocks of 64 without an early
// exit inside, which the compiler turns into vector compares: a scalar scan
// to the maximum took about a third of sampling a 152k vocabulary.
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) static int first_equal(const float *x, int n, float v)
{
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        int hit = 0;
        for (int j = 0; j < 64; j++) hit |= x[i + j] == v;
        if (hit) break;
    }
    while (i < n - 1 && !(x[i] == v)) i++;
    return i;
}

// The k-th largest of n values (1-based), by quickselect on a copy.
static float kth_largest(float *a, int n, int k)
{
    int lo = 0, hi = n - 1, want = k - 1; // position in descending order
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want];
    }
    return a[want];
}

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

// Masks to -inf every token outside the top_p nucleus of probs (which sum to
// 1 over the live tokens): a token stays when the mass ranked strictly above
// it is below top_p, as vLLM's cumulative mask keeps it. Only tokens that can
// matter are sorted: those at or above a threshold, lowered until they carry
// top_p (everything below it ranks after all of them).
static void apply_top_p(float *logits, const float *probs, int vocab, float top_p,
                        struct sampler_scratch *s)
{
    float pmax = 0;
    for (int i = 0; i < vocab; i++) pmax = probs[i] > pmax ? probs[i] : pmax;
    double t = (double)pmax * 1e-3;
    for (;;) {
        double mass = 0;
        for (int i = 0; i < vocab; i++)
            if (probs[i] > 0 && probs[i] >= t) mass += probs[i];
        if (mass >= top_p || t == 0) break;
        t = t > 1e-30 ? t * 1e-3 : 0;
    }
    int m = 0;
    for (int i = 0; i < vocab; i++)
        if (probs[i] > 0 && probs[i] >= t) s->cand[m++] = (struct cand){.p = probs[i], .id = i};
    qsort(s->cand, (size_t)m, sizeof *s->cand, cand_cmp);
    double above = 0;
    int keep = 0;
    while (keep < m && (keep == 0 || above < top_p)) above += s->cand[keep++].p;
    for (int j = 0; j < keep; j++) s->work[j] = logits[s->cand[j].id];
    for (int i = 0; i < vocab; i++) logits[i] = -INFINITY;
    for (int j = 0; j < keep; j++) logits[s->cand[j].id] = s->work[j];
}

// Softmax of the live (finite) logits, whose largest is mx, into probs.
static void softmax_into(const float *logits, int vocab, float mx, float *probs,
                         const struct sampler_scratch *s)
{
    double sum = s->k->exp_sum(logits, mx, probs, vocab, NULL);
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < vocab; i++) probs[i] *= inv;
}

static bool valid_id(int32_t id, int vocab) { return id >= 0 && id < vocab; }

// vLLM's apply_penalties: repetition over prompt and output (divide positive
// logits, multiply negative ones), then frequency x count and presence over
// the output alone.
static void apply_penalties(const struct engine_sampling *p, float *logits, int vocab,
                            const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                            struct sampler_scratch *s)
{
    if (p->repetition_penalty != 1.0f) {
        const float rp = p->repetition_penalty;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? output : prompt;
            int n = pass ? n_output : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t id = ids[i];
                if (!valid_id(id, vocab) || s->seen[id]) continue;
                s->seen[id] = 1;
                logits[id] = logits[id] > 0 ? logits[id] / rp : logits[id] * rp;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? output : prompt;
            int n = pass ? n_output : n_prompt;
            for (int i = 0; i < n; i++)
                if (valid_id(ids[i], vocab)) s->seen[ids[i]] = 0;
        }
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        for (int i = 0; i < n_output; i++)
            if (valid_id(output[i], vocab)) s->count[output[i]]++;
        for (int i = 0; i < n_output; i++) {
            int32_t id = output[i];
            if (!valid_id(id, vocab) || s->count[id] == 0) continue;
            logits[id] -= p->frequency_penalty * (float)s->count[id] + p->presence_penalty;
            s->count[id] = 0; // applied once per distinct token; leaves the scratch clean
        }
    }
}

int sampler_sample(const struct engine_sampling *p, float *logits, int vocab,
                   const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                   struct sampler_rng *rng, struct sampler_scratch *s, struct engine_token *out)
{
    if (!p || !logits || !s || !out || !rng || vocab < 1 || vocab > s->vocab) return MS_EINVAL;
    if (!(p->temperature >= 0) || !isfinite(p->temperature) || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
        !isfinite(p->repetition_penalty) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || p->logprobs > ENGINE_MAX_LOGPROBS ||
        n_prompt < 0 || n_output < 0 || (n_prompt && !prompt) || (n_output && !output) ||
        (p->n_logit_bias && !p->logit_bias))
        return MS_EINVAL;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (!valid_id(p->logit_bias[i].id, vocab) || !isfinite(p->logit_bias[i].bias)) return MS_EINVAL;
    out->n_top = 0;
    out->logprob = 0;
    double lse = 0;
    const bool want_lp = p->logprobs >= 0;
    if (want_lp) {
        // NaN stays in logits for now: the bias and penalties keep it NaN, and
        // the greedy argmax or scale_max below turn it into -inf.
        lse = raw_log_sum_exp(logits, vocab, s);
        if (p->logprobs > 0) top_alternatives(s->raw, vocab, p->logprobs, lse, out);
    }
    for (int i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias[i].id] += p->logit_bias[i].bias;
    apply_penalties(p, logits, vocab, prompt, n_prompt, output, n_output, s);

    int id;
    if (p->temperature < SAMPLING_EPS || p->top_k == 1) {
        id = argmax_lowest(logits, vocab);
    } else {
        // Scale (NaN to -inf) and find the largest in one vector pass; the
        // best token (lowest id among equal maxima) survives every filter.
        const float mx = s->k->scale_max(logits, 1.0f / p->temperature, vocab);
        const int best = first_equal(logits, vocab, mx);
        if (!isfinite(mx)) {
            id = best; // nothing live (or an infinite logit): no distribution to draw from
            goto done;
        }
        if (p->min_p > 0) {
            // probs[i] < min_p * max(probs) is x[i] - mx < log(min_p): no softmax needed.
            const float thr = mx + logf(p->min_p);
            for (int i = 0; i < vocab; i++)
                if (logits[i] < thr && i != best) logits[i] = -INFINITY;
        }
        if (p->top_k > 0 && p->top_k < vocab) {
            memcpy(s->work, logits, (size_t)vocab * sizeof *logits);
            float kth = kth_largest(s->work, vocab, p->top_k);
            for (int i = 0; i < vocab; i++)
                if (logits[i] < kth) logits[i] = -INFINITY;
        }
        if (p->top_p < 1.0f) {
            softmax_into(logits, vocab, mx, s->probs, s);
            apply_top_p(logits, s->probs, vocab, p->top_p, s);
        }
        // The draw: unnormalised weights, their total and block sums from one
        // pass; whole blocks below u * total are skipped, then a walk to the
        // first token whose running sum passes it.
        const double total = s->k->exp_sum(logits, mx, s->probs, vocab, s->blocks);
        const double target = sampler_rng_uniform(rng) * total;
        const int nb = CPU_EXP_BLOCKS(vocab);
        double acc = 0;
        int b = 0;
        for (; b < nb - 1 && acc + s->blocks[b] <= target; b++) acc += s->blocks[b];
        id = best;
        for (int i = b * CPU_EXP_BLOCK; i < vocab; i++) {
            if (s->probs[i] <= 0) continue;
            acc += s->probs[i];
            id = i;
            if (acc > target) break;
        }
    }
done:
    out->id = id;
    if (want_lp) out->logprob = raw_logprob(s->raw[id], lse);
    return 0;
}
