// sample: logits to a token the way vLLM's sampler does it — the allowed
// mask, logit_bias, then repetition/frequency/presence penalties, then greedy
// or temperature, min_p, top_k, top_p and a draw from the counter-based
// generator (model/sampling.h); logprobs always from the raw distribution.
#include "model/cpu/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

// vLLM treats temperatures below this as greedy.
#define SAMPLING_EPS 1e-5f

struct cand {
    float p;
    int32_t id;
};

struct cpu_sample_scratch {
    int vocab;
    const struct cpu_kernels *k; // scale_max and exp_sum: the passes over the whole vocabulary
    float *raw;      // (vocab) the logits as they came, for logprobs
    float *work;     // (vocab) selection workspace
    float *probs;    // (vocab)
    int32_t *count;  // (vocab) occurrences in the output so far; zero between calls
    uint8_t *seen;   // (vocab) in prompt or output; zero between calls
    struct cand *cand; // (vocab) top_p candidates
    int32_t *live;     // (vocab) the ids top_k kept, ascending
    double *blocks;    // (CPU_EXP_BLOCKS(vocab)) sums of the draw's weights, block by block
};

struct cpu_sample_scratch *cpu_sample_scratch_create(int vocab, const struct cpu_kernels *k)
{
    if (vocab < 1 || !k) return NULL;
    struct cpu_sample_scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->vocab = vocab;
    s->k = k;
    s->raw = malloc((size_t)vocab * sizeof *s->raw);
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->seen = calloc((size_t)vocab, 1);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->live = malloc((size_t)vocab * sizeof *s->live);
    s->blocks = malloc((size_t)CPU_EXP_BLOCKS(vocab) * sizeof *s->blocks);
    if (!s->raw || !s->work || !s->probs || !s->count || !s->seen || !s->cand || !s->live || !s->blocks) {
        cpu_sample_scratch_destroy(s);
        return NULL;
    }
    return s;
}

void cpu_sample_scratch_destroy(struct cpu_sample_scratch *s)
{
    if (!s) return;
    free(s->raw);
    free(s->work);
    free(s->probs);
    free(s->count);
    free(s->seen);
    free(s->cand);
    free(s->live);
    free(s->blocks);
    free(s);
}

static float clean(float v) { return isnan(v) ? -INFINITY : v; }

// Copies a row of logits into s->raw with NaN as -inf and returns its
// log(sum(exp)): the raw distribution the logprobs come from.
static double raw_log_sum_exp(const float *logits, int vocab, struct cpu_sample_scratch *s)
{
    memcpy(s->raw, logits, (size_t)vocab * sizeof *logits);
    const float mx = s->k->scale_max(s->raw, 1.0f, vocab); // x * 1 is exact: only NaN changes
    if (!isfinite(mx)) return mx;
    return mx + log(s->k->exp_sum(s->raw, mx, s->probs, vocab, NULL));
}

// The k best of a row by (value descending, id ascending), by insertion into
// a short sorted list: almost every element fails the first comparison.
static void top_alternatives(const float *x, int n, int k, double lse, struct sample_token *out)
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
        out->top[at] = (struct sample_logprob){.id = i, .logprob = v};
    }
    for (int j = 0; j < m; j++) out->top[j].logprob = (float)((double)out->top[j].logprob - lse);
    out->n_top = m;
}

static float raw_logprob(float v, double lse)
{
    v = clean(v);
    return v == -INFINITY ? -INFINITY : (float)((double)v - lse);
}

// GCC vectorizes the two scans below at -O2 only when asked; clang does
// without, and has no `optimize` attribute (it warns, an error here).
#if defined(__GNUC__) && !defined(__clang__)
#define SAMPLE_VECTORIZED __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define SAMPLE_VECTORIZED
#endif

// How many of x (NaN as -inf) are >= v: one pass without branches, which
// the compiler turns into vector compares.
SAMPLE_VECTORIZED static int32_t count_at_least(const float *x, int n, float v)
{
    int32_t c = 0;
    for (int i = 0; i < n; i++) c += clean(x[i]) >= v;
    return c;
}

// The logprob of id, its rank and k alternatives from a raw row (no draw).
// The rank compares logits, which orders the tokens as their logprobs do
// (vLLM compares the fp32 logprobs: a tie there that the logits break
// counts once more in its rank).
static void score_row(const float *logits, int vocab, int32_t id, int k,
                      struct cpu_sample_scratch *scratch, struct sample_token *out)
{
    if (k > SAMPLING_MAX_LOGPROBS) k = SAMPLING_MAX_LOGPROBS;
    out->id = id;
    out->n_top = 0;
    out->logprob = -INFINITY;
    out->rank = 0;
    if (!scratch || vocab < 1 || vocab > scratch->vocab) return;
    const double lse = raw_log_sum_exp(logits, vocab, scratch);
    if (id >= 0 && id < vocab) {
        out->logprob = raw_logprob(scratch->raw[id], lse);
        out->rank = count_at_least(scratch->raw, vocab, clean(scratch->raw[id]));
    }
    if (k > 0) top_alternatives(scratch->raw, vocab, k, lse, out);
}

// The first i with x[i] == v, else n - 1. Blocks of 64 without an early
// exit inside, which the compiler turns into vector compares: a scalar scan
// to the maximum took about a third of sampling a 152k vocabulary.
SAMPLE_VECTORIZED static int first_equal(const float *x, int n, float v)
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

// Up to this k, the k-th largest comes from one pass that keeps the k
// largest values seen (kth_largest_pass); above it, from quickselect.
// Qwen3's generation config asks for top_k 20, and quickselect (a copy of
// the vocabulary, then partitions) took 2 ms a row over 152k logits, on
// one thread per rank: at one stream 5.6% of the samples of `generate
// /tmp/mid --max-tokens 300 --ignore-eos` under perf, 2.6% with the pass,
// and that decode 3-8% faster (three alternating runs, Zen 5).
#define TOPK_PASS_MAX 256

// kth_largest's value (counted with repeats: the k-th of the values sorted
// in descending order, k <= n) for small k: keep (k floats) holds the k
// largest seen so far in ascending order, so that most values lose one
// compare against keep[0]. A value equal to keep[0] leaves the kept values
// as they are, so it need not enter.
static float kth_largest_pass(const float *a, int n, int k, float *keep)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        const float v = a[i];
        int j;
        if (m < k) {
            for (j = m++; j > 0 && keep[j - 1] > v; j--) keep[j] = keep[j - 1];
        } else {
            if (!(v > keep[0])) continue;
            for (j = 0; j + 1 < k && keep[j + 1] < v; j++) keep[j] = keep[j + 1];
        }
        keep[j] = v;
    }
    return keep[0];
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
                        struct cpu_sample_scratch *s, const int32_t *live, int n_live)
{
    // Only the ids top_k kept (live, ascending) can have probs above 0:
    // the passes below visit those alone, in the same order, so the sums
    // and the candidates are the same as over the whole vocabulary. With
    // kth_largest_pass, this took the sampler from 5.6% to 1.1% of a
    // one-stream decode's samples (Qwen3's top_k 20, top_p 0.95), and
    // `generate /tmp/mid --max-tokens 300 --ignore-eos` from 71-73 to 77-81
    // tokens/s (three alternating runs, Zen 5), the same tokens for a seed.
    const int n = live ? n_live : vocab;
#define TOP_P_ID(j) (live ? live[j] : (j))
    float pmax = 0;
    for (int j = 0; j < n; j++) pmax = probs[TOP_P_ID(j)] > pmax ? probs[TOP_P_ID(j)] : pmax;
    double t = (double)pmax * 1e-3;
    for (;;) {
        double mass = 0;
        for (int j = 0; j < n; j++) {
            const int i = TOP_P_ID(j);
            if (probs[i] > 0 && probs[i] >= t) mass += probs[i];
        }
        if (mass >= top_p || t == 0) break;
        t = t > 1e-30 ? t * 1e-3 : 0;
    }
    int m = 0;
    for (int j = 0; j < n; j++) {
        const int i = TOP_P_ID(j);
        if (probs[i] > 0 && probs[i] >= t) s->cand[m++] = (struct cand){.p = probs[i], .id = i};
    }
#undef TOP_P_ID
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
                         const struct cpu_sample_scratch *s)
{
    double sum = s->k->exp_sum(logits, mx, probs, vocab, NULL);
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < vocab; i++) probs[i] *= inv;
}

static bool valid_id(int32_t id, int vocab) { return id >= 0 && id < vocab; }

// vLLM's apply_penalties: repetition over prompt and output (divide positive
// logits, multiply negative ones), then frequency x count and presence over
// the output alone.
static void apply_penalties(const struct sampling_params *p, float *logits, int vocab,
                            const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                            struct cpu_sample_scratch *s)
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

// Every token outside the allowed mask to -inf (before anything else, so
// that bias, penalties and filters see only allowed tokens).
static void apply_mask(float *logits, int vocab, const uint32_t *allowed)
{
    for (int i = 0; i < vocab; i++)
        if (!(allowed[i >> 5] >> (i & 31) & 1u)) logits[i] = -INFINITY;
}

int cpu_sample_row(const struct backend_sample_row *row, int vocab, struct cpu_sample_scratch *s,
                   struct sample_token *out)
{
    const struct sampling_params *p = row->p;
    float *logits = row->logits;
    const int32_t *prompt = row->prompt, *output = row->output;
    const int n_prompt = row->n_prompt, n_output = row->n_output;
    if (!p || !logits || !s || !out || vocab < 1 || vocab > s->vocab) return MS_EINVAL;
    if (row->score >= 0) {
        if (row->score >= vocab) return MS_EINVAL;
        score_row(logits, vocab, row->score, p->prompt_logprobs, s, out);
        return 0;
    }
    if (!(p->temperature >= 0) || !isfinite(p->temperature) || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
        !isfinite(p->repetition_penalty) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || p->logprobs > SAMPLING_MAX_LOGPROBS ||
        n_prompt < 0 || n_output < 0 || (n_prompt && !prompt) || (n_output && !output) ||
        (p->n_logit_bias && !p->logit_bias))
        return MS_EINVAL;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (!valid_id(p->logit_bias[i].id, vocab) || !isfinite(p->logit_bias[i].bias)) return MS_EINVAL;
    out->n_top = 0;
    out->logprob = 0;
    out->rank = 0;
    double lse = 0;
    const bool want_lp = p->logprobs >= 0;
    if (want_lp) {
        // NaN stays in logits for now: the bias and penalties keep it NaN, and
        // the greedy argmax or scale_max below turn it into -inf.
        lse = raw_log_sum_exp(logits, vocab, s);
        if (p->logprobs > 0) top_alternatives(s->raw, vocab, p->logprobs, lse, out);
    }
    if (row->allowed) apply_mask(logits, vocab, row->allowed);
    for (int i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias[i].id] += p->logit_bias[i].bias;
    apply_penalties(p, logits, vocab, prompt, n_prompt, output, n_output, s);

    int id;
    if (p->temperature < SAMPLING_EPS || p->top_k == 1) {
        // The largest (NaN as -inf) in one vector pass, then its lowest id:
        // a scalar scan with the running best in the loop took 0.5 ms a row
        // over 152k logits, more than the lm_head per row at 64 rows.
        id = first_equal(logits, vocab, s->k->scale_max(logits, 1.0f, vocab));
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
        const int32_t *live = NULL; // the ids top_k keeps, when it runs
        int n_live = 0;
        if (p->top_k > 0 && p->top_k < vocab) {
            float kth;
            if (p->top_k <= TOPK_PASS_MAX) {
                kth = kth_largest_pass(logits, vocab, p->top_k, s->work);
            } else {
                memcpy(s->work, logits, (size_t)vocab * sizeof *logits);
                kth = kth_largest(s->work, vocab, p->top_k);
            }
            for (int i = 0; i < vocab; i++) {
                if (logits[i] < kth) logits[i] = -INFINITY;
                else s->live[n_live++] = i;
            }
            live = s->live;
        }
        if (p->top_p < 1.0f) {
            softmax_into(logits, vocab, mx, s->probs, s);
            apply_top_p(logits, s->probs, vocab, p->top_p, s, live, n_live);
        }
        // The draw: unnormalised weights, their total and block sums from one
        // pass; whole blocks below u * total are skipped, then a walk to the
        // first token whose running sum passes it.
        const double total = s->k->exp_sum(logits, mx, s->probs, vocab, s->blocks);
        const double target = sampling_uniform(p->seed, p->stream, row->position) * total;
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
    // A mask can leave nothing live (a grammar's dead end, or a logit_bias of
    // -100 on every allowed token is still live): the draw then stays inside
    // the mask, at its lowest id.
    if (row->allowed && !(row->allowed[id >> 5] >> (id & 31) & 1u)) {
        for (int i = 0; i < vocab; i++)
            if (row->allowed[i >> 5] >> (i & 31) & 1u) {
                id = i;
                break;
            }
    }
    out->id = id;
    if (want_lp) out->logprob = raw_logprob(s->raw[id], lse);
    return 0;
}
