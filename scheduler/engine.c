// engine: the continuous-batching engine thread — admission, step planning
// (decodes first, then chunked prefills under the token budget), preemption,
// the lockstep step over all DP ranks, sampling, stops and output deltas.
#include "scheduler/engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/base.h"
#include "base/buf.h"
#include "grammar/grammar.h"
#include "model/backend_registry.h"
#include "model/forward.h"
#include "model/fwd_plan.h"
#include "model/planner.h"
#include "scheduler/kv_blocks.h"
#include "scheduler/metrics.h"
#include "scheduler/step_plan.h"
#include "scheduler/stop.h"

// Logits rows beyond one per sequence, for prompt-logprob chunks.
#define EXTRA_LOGIT_ROWS 64

// The logits rows of one step: every sequence's, and up to EXTRA_LOGIT_ROWS
// more for prompt rows scored, within max_num_batched_tokens.
static int engine_logit_rows(const struct engine_opts *o)
{
    const int rows = o->max_num_seqs + EXTRA_LOGIT_ROWS;
    return rows > o->max_num_batched_tokens ? o->max_num_batched_tokens : rows;
}

struct seq {
    struct sched_seq q;                // first: the planner's view (tokens, blocks, plan)
    uint64_t id;
    struct engine_sink sink;
    struct sampling_params sampling;   // logit_bias points at bias
    struct sampling_logit_bias *bias;    // (n_logit_bias)
    // Before min_tokens are generated, the sampled row's parameters: bias
    // and a bias that no eos or stop id can outrun (prompt-logprob rows keep
    // sampling, unbiased by it).
    int min_tokens;
    struct sampling_params sampling_min; // logit_bias points at bias_min
    struct sampling_logit_bias *bias_min;
    int cap;                           // q.tokens holds cap = prompt + max_tokens
    struct stop_state stop;
    bool skip_special;
    struct tok_stream ts;
    struct sample_token *prompt_lp;    // (n_prompt - 1) when prompt_logprobs >= 0
    bool prompt_lp_sent;
    struct seq *inbox_next;
    struct sample_token sampled;       // written by the rank thread
    // Structured output: the matcher (NULL: free text), whether it governs
    // the next token yet, the id that switches it on, its mask (written by
    // the rank thread before sampling) and a failure to build it.
    struct grammar_matcher *gm;
    bool gm_active;
    int32_t pause_open, pause_close;   // stop strings rest between these tokens
    bool paused;
    bool pause_body;                   // the paused call's body has begun (non-space text came)
    int32_t gm_after;
    uint32_t *mask;
    uint32_t *allowed_ids;             // (vocab / 32) allowed_token_ids' bits, or NULL
    bool allowed_conflict;             // a step found none of them the grammar allows
    int gm_rc;
    // Milestones for the latency metrics (ms_now(); 0: not yet).
    double t_submit, t_scheduled, t_first, t_last;
    bool prompt_counted;               // in the engine's prompt_tokens
};

static struct seq *seq_of(struct sched_seq *q) { return (struct seq *)q; }

const char *const engine_phase_names[ENGINE_PHASES] = {"attention", "moe", "lm_head", "sampling"};
_Static_assert((int)ENGINE_PHASE_ATTENTION == (int)FWD_PHASE_ATTENTION &&
                   (int)ENGINE_PHASE_MOE == (int)FWD_PHASE_MOE &&
                   (int)ENGINE_PHASE_LM_HEAD == (int)FWD_PHASE_LM_HEAD &&
                   (int)ENGINE_PHASE_SAMPLING == (int)FWD_PHASES,
               "the engine's phases extend the forward pass's, in its order");

struct rank_slot {
    int index;
    struct engine *e;
    struct backend *b;                 // the rank's device: forward pass and sampling
    struct kv_pool *kv;
    struct rank *rank;
    struct kv_blocks *blocks;
    float *logits;                     // (max_rows, vocab) backend memory
    // One sampling call per step over every row that wants a token or a
    // prompt logprob: the row, its result, and where the result goes.
    struct backend_sample_row *rows;   // (max_rows)
    struct sample_token *row_out;      // (max_rows)
    struct sample_token **row_dst;     // (max_rows)
    struct fwd_seq *fseqs;             // (max_num_seqs)
    struct sched_rank *plan;           // this rank's batch in the scheduler
    int rc;                            // of the last step
    char err[768];
    double sample_seconds;             // cumulative wall time sampling this rank's rows
    double decode_sample_seconds;      // of which in decode steps (rank_stats' decode_steps)
    pthread_t thread;
    bool thread_started;
};

struct inbox_cancel {
    uint64_t id;
    struct inbox_cancel *next;
};

struct engine {
    const struct model *m;
    const struct tokenizer *tok;
    struct engine_opts o;
    int vocab;
    int max_model_len;
    int n_threads;              // all ranks' compute threads
    int n_ranks;
    struct rank_slot *ranks;           // (n_ranks)
    struct comm **comms;               // (n_ranks) or NULL
    int blocks_per_rank;

    // Shared with other threads, under mu.
    pthread_mutex_t mu;
    pthread_cond_t wake;               // the engine thread waits here when idle
    pthread_cond_t idle;               // engine_drain waits here
    struct seq *inbox_head, *inbox_tail;
    struct inbox_cancel *cancels;
    int n_inbox;
    uint64_t next_id;
    int in_flight;                     // submitted and not yet finished
    int n_waiting_shared;              // the waiting queue as the engine thread last saw it
    bool draining;
    double drain_deadline;
    bool quit;
    struct engine_stats stats;
    uint64_t rng_state;

    // Rank worker threads (ranks 1..n-1; the engine thread runs rank 0).
    pthread_mutex_t step_mu;
    pthread_cond_t step_go, step_done;
    uint64_t step_gen;
    int step_pending;
    bool step_quit;

    // Engine thread only.
    pthread_t thread;
    bool thread_started;
    struct sched sched;                // the waiting queue, the running list, the plan
    bool sched_ready;
    struct ms_buf text;                // a delta's text
    char *tsbuf;                       // one token's decoded text
    size_t tsbuf_cap;
    bool check_blocks;                 // MOESERVE_CHECK_BLOCKS=1: verify accounting each step
    uint64_t generation_tokens, steps;
    uint64_t prompt_tokens;            // prompts whose prefill ended (their first token came)
    uint64_t request_success[FINISH_COUNT_];
};

// ---- sequences --------------------------------------------------------------

static void seq_free(struct seq *s)
{
    if (!s) return;
    free(s->bias);
    free(s->bias_min);
    free(s->q.tokens);
    free(s->prompt_lp);
    grammar_matcher_destroy(s->gm);
    free(s->mask);
    free(s->allowed_ids);
    stop_free(&s->stop);
    sched_seq_free(&s->q);
    free(s);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Validates and copies a request into a new sequence (on the caller's thread).
static int seq_create(struct engine *e, const struct engine_request *r,
                      const struct engine_sink *sink, struct seq **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!sink || !sink->on_delta)
        return ms_err(err, errlen, MS_EINVAL, "a request needs a sink for its output");
    if (!r->prompt || r->n_prompt < 1)
        return ms_err(err, errlen, MS_EINVAL, "the prompt is empty; it needs at least one token");
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->vocab)
            return ms_err(err, errlen, MS_EINVAL,
                          "prompt token %d is id %d; ids run from 0 to %d", i, (int)r->prompt[i],
                          e->vocab - 1);
    if (r->stop.max_tokens < 1)
        return ms_err(err, errlen, MS_EINVAL, "max_tokens must be at least 1, not %d",
                      r->stop.max_tokens);
    int64_t total = (int64_t)r->n_prompt + r->stop.max_tokens;
    if (total > e->max_model_len)
        return ms_err(err, errlen, MS_ETOOLONG,
                      "This model's maximum context length is %d tokens. However, you requested "
                      "%lld tokens (%d in the prompt, %d for the completion). Please reduce the "
                      "prompt or max_tokens.",
                      e->max_model_len, (long long)total, r->n_prompt, r->stop.max_tokens);
    int64_t need_blocks = (total + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    if (need_blocks > e->blocks_per_rank)
        return ms_err(err, errlen, MS_ENOFIT,
                      "the request needs KV cache for %lld tokens (%d prompt + %d max_tokens) but "
                      "one rank's KV pool holds %lld tokens (%d blocks of %d; %d ranks hold %lld "
                      "together, and a sequence must fit on one rank): lower max_tokens or raise "
                      "--kv-cache-memory",
                      (long long)total, r->n_prompt, r->stop.max_tokens,
                      (long long)e->blocks_per_rank * KV_BLOCK_TOKENS, e->blocks_per_rank,
                      KV_BLOCK_TOKENS, e->n_ranks,
                      (long long)e->blocks_per_rank * KV_BLOCK_TOKENS * e->n_ranks);
    int rc = sampling_params_check(&r->sampling, e->vocab, NULL, err, errlen);
    if (rc) return rc;
    if (r->stop.n_stop_strs > 0 && !e->tok)
        return ms_err(err, errlen, MS_EINVAL,
                      "stop strings need a tokenizer, and this engine runs without one");
    for (int i = 0; i < r->stop.n_stop_ids; i++)
        if (r->stop.stop_ids && (r->stop.stop_ids[i] < 0 || r->stop.stop_ids[i] >= e->vocab))
            return ms_err(err, errlen, MS_EINVAL,
                          "stop_token_ids names id %d; ids run from 0 to %d",
                          (int)r->stop.stop_ids[i], e->vocab - 1);

    struct seq *s = calloc(1, sizeof *s);
    if (!s) return ms_err(err, errlen, MS_ENOMEM, "out of memory for a request");
    rc = stop_init(&s->stop, &r->stop, e->m->cfg.eos_ids, e->m->cfg.n_eos, err, errlen);
    if (rc) {
        free(s);
        return rc;
    }
    s->cap = (int)total;
    int32_t *tokens = malloc((size_t)s->cap * sizeof *tokens);
    if (!tokens) goto oom;
    memcpy(tokens, r->prompt, (size_t)r->n_prompt * sizeof *tokens);
    if (sched_seq_init(&s->q, tokens, r->n_prompt, s->cap)) {
        free(tokens);
        s->q.tokens = NULL;
        goto oom;
    }
    s->sampling = r->sampling;
    if (r->sampling.n_logit_bias > 0) {
        s->bias = malloc((size_t)r->sampling.n_logit_bias * sizeof *s->bias);
        if (!s->bias) goto oom;
        memcpy(s->bias, r->sampling.logit_bias, (size_t)r->sampling.n_logit_bias * sizeof *s->bias);
    }
    s->sampling.logit_bias = s->bias;
    if (r->stop.min_tokens > 0) {
        // -1e30, not -inf: the samplers take finite biases only, and a
        // logit that low has probability 0 under any temperature.
        const int n_eos = e->m->cfg.n_eos, nb = r->sampling.n_logit_bias, n = nb + n_eos + r->stop.n_stop_ids;
        s->bias_min = malloc((size_t)n * sizeof *s->bias_min);
        if (!s->bias_min) goto oom;
        if (nb) memcpy(s->bias_min, r->sampling.logit_bias, (size_t)nb * sizeof *s->bias_min);
        for (int i = 0; i < n_eos; i++) s->bias_min[nb + i] = (struct sampling_logit_bias){e->m->cfg.eos_ids[i], -1e30f};
        for (int i = 0; i < r->stop.n_stop_ids; i++)
            s->bias_min[nb + n_eos + i] = (struct sampling_logit_bias){r->stop.stop_ids[i], -1e30f};
        s->sampling_min = s->sampling;
        s->sampling_min.logit_bias = s->bias_min;
        s->sampling_min.n_logit_bias = n;
        s->min_tokens = r->stop.min_tokens;
    }
    if (r->sampling.prompt_logprobs >= 0 && r->n_prompt > 1) {
        s->prompt_lp = calloc((size_t)r->n_prompt - 1, sizeof *s->prompt_lp);
        if (!s->prompt_lp) goto oom;
        s->q.wants_prompt_lp = true;
    }
    s->skip_special = r->stop.skip_special_tokens;
    if (e->tok) tok_stream_init(&s->ts, e->tok, s->skip_special);
    s->sink = *sink;
    if (r->n_allowed_ids > 0) {
        s->allowed_ids = calloc(((size_t)e->vocab + 31) / 32, sizeof *s->allowed_ids);
        if (!s->allowed_ids) goto oom;
        for (int i = 0; i < r->n_allowed_ids; i++) {
            const int32_t id = r->allowed_ids[i];
            if (id < 0 || id >= e->vocab) {
                seq_free(s);
                return ms_err(err, errlen, MS_EINVAL, "allowed token id %d is outside the vocabulary (0 to %d)",
                              (int)id, e->vocab - 1);
            }
            s->allowed_ids[id >> 5] |= 1u << (id & 31);
        }
    }
    if (r->grammar) {
        s->mask = malloc(((size_t)e->vocab + 31) / 32 * sizeof *s->mask);
        if (!s->mask) goto oom;
        if ((rc = grammar_matcher_create(r->grammar, &s->gm, err, errlen))) {
            seq_free(s);
            return rc;
        }
        s->gm_after = r->grammar_after;
        s->gm_active = r->grammar_after < 0;
    }
    s->pause_open = r->stop_pause_open;
    s->pause_close = r->stop_pause_close;
    *out = s;
    return 0;
oom:
    seq_free(s);
    return ms_err(err, errlen, MS_ENOMEM, "out of memory for a request of %lld tokens",
                  (long long)total);
}

// ---- output -----------------------------------------------------------------

static int text_append(struct engine *e, const char *p, size_t n)
{
    return ms_buf_append(&e->text, p, n);
}

static void seq_emit(struct engine *e, struct seq *s, const struct sample_token *tok, int n_tok,
                     enum engine_finish fin, const char *stop_str, int32_t stop_id,
                     const char *error)
{
    struct engine_delta d;
    memset(&d, 0, sizeof d);
    d.request_id = s->id;
    if (n_tok > 0 && s->prompt_lp && !s->prompt_lp_sent) {
        d.prompt_tokens_lp = s->prompt_lp;
        d.n_prompt_tokens_lp = s->q.n_prompt - 1;
        s->prompt_lp_sent = true;
        s->q.wants_prompt_lp = false; // a recompute after preemption needs no rows for them
    }
    d.tokens = tok;
    d.n_tokens = n_tok;
    d.text = e->text.len ? e->text.data : "";
    d.text_len = e->text.len;
    d.finish = fin;
    d.stop_str = stop_str;
    d.stop_id = stop_id;
    d.prompt_tokens = s->q.n_prompt;
    d.completion_tokens = s->q.n_tokens - s->q.n_prompt;
    d.cached_tokens = s->q.n_cached;
    d.error = error;
    if (n_tok > 0 && !s->prompt_counted) {
        // Counted once its prefill has ended, as vLLM counts it: a request
        // cancelled before its first token adds nothing.
        s->prompt_counted = true;
        e->prompt_tokens += (uint64_t)s->q.n_prompt;
    }
    if (n_tok > 0 && e->o.metrics) {
        double now = ms_now();
        if (!s->t_first) {
            s->t_first = now;
            metrics_observe_first_token(e->o.metrics, now - s->t_submit);
        } else {
            metrics_observe_inter_token(e->o.metrics, now - s->t_last, n_tok);
        }
        s->t_last = now;
    }
    s->sink.on_delta(s->sink.ctx, &d);
}

// Sends the final delta and frees the sequence, wherever it is.
static void seq_finish(struct engine *e, struct seq *s, const struct sample_token *tok, int n_tok,
                       enum engine_finish fin, const char *stop_str, int32_t stop_id,
                       const char *error)
{
    sched_remove(&e->sched, &s->q);
    seq_emit(e, s, tok, n_tok, fin, stop_str, stop_id, error);
    e->request_success[fin]++;
    if (e->o.metrics) {
        // A phase that never began is passed as negative, and not observed.
        double now = ms_now();
        double queue = s->t_scheduled ? s->t_scheduled - s->t_submit : -1;
        double prefill = s->t_first ? s->t_first - s->t_scheduled : -1;
        double decode = s->t_first ? now - s->t_first : -1;
        struct metrics_request mr = {.e2e = now - s->t_submit, .queue = queue, .prefill = prefill,
                                     .decode = decode, .prompt_tokens = s->q.n_prompt,
                                     .generation_tokens = s->q.n_tokens - s->q.n_prompt};
        metrics_observe_request(e->o.metrics, &mr);
    }
    seq_free(s);
    pthread_mutex_lock(&e->mu);
    if (--e->in_flight == 0) pthread_cond_broadcast(&e->idle);
    pthread_mutex_unlock(&e->mu);
}

static void seq_abort(struct engine *e, struct seq *s, const char *error)
{
    ms_buf_reset(&e->text);
    seq_finish(e, s, NULL, 0, FINISH_ABORT, NULL, -1, error);
}

static void abort_all(struct engine *e, const char *error)
{
    while (e->sched.running.head) seq_abort(e, seq_of(e->sched.running.head), error);
    while (e->sched.waiting.head) seq_abort(e, seq_of(e->sched.waiting.head), error);
}

// Decodes a just-sampled token, applies the stop rules and emits its delta.
// The grammar's view of a sampled token: refused (a mask that could not be
// built, or a token outside it: a bug) ends the request with a sentence.
static bool seq_grammar_accept(struct seq *s, int32_t id, char *msg, size_t len)
{
    if (!s->gm) return true;
    if (!s->gm_active) {
        s->gm_active = id == s->gm_after;
        return true;
    }
    if (s->gm_rc) {
        snprintf(msg, len, "structured output could not go on (%s): the output nests deeper or "
                 "is more ambiguous than the grammar's limits", ms_status_name(s->gm_rc));
        return false;
    }
    if (s->allowed_conflict) {
        snprintf(msg, len, "allowed_token_ids leave no token the structured output allows here; "
                 "allow the tokens its format needs");
        return false;
    }
    char err[256];
    if (grammar_matcher_accept(s->gm, id, err, sizeof err)) {
        snprintf(msg, len, "structured output: token %d does not continue the grammar (%s)",
                 (int)id, err);
        return false;
    }
    return true;
}

static void seq_accept_token(struct engine *e, struct seq *s)
{
    int32_t id = s->sampled.id;
    char gmsg[384];
    if (!seq_grammar_accept(s, id, gmsg, sizeof gmsg)) {
        ms_log(MS_LOG_ERROR, "request %llu: %s", (unsigned long long)s->id, gmsg);
        seq_abort(e, s, gmsg);
        return;
    }
    s->q.tokens[s->q.n_tokens++] = id;
    int n_out = s->q.n_tokens - s->q.n_prompt;
    e->generation_tokens++;
    int32_t stop_id;
    enum engine_finish fin = stop_check_token(&s->stop, id, n_out, s->q.n_tokens,
                                              e->max_model_len, &stop_id);
    // A grammar that took EOS is complete: the answer ends there, also with
    // ignore_eos, which would sample on into a mask of EOS alone and then
    // abort on a token after the grammar's end.
    if (fin == FINISH_NONE && s->gm && s->gm_active && grammar_matcher_is_terminated(s->gm)) fin = FINISH_STOP;
    ms_buf_reset(&e->text);
    const char *stop_str = NULL;
    int matched = -1;
    if (e->tok) {
        const char *out;
        size_t n_out_text, n_dec = 0;
        int rc = 0;
        // Ids past the tokenizer's vocabulary (the model's may be padded)
        // have no text.
        if (fin != FINISH_STOP && id < tok_vocab_size(e->tok)) {
            rc = tok_stream_feed(&s->ts, id, e->tsbuf, e->tsbuf_cap, &n_dec);
            if (!rc && id == s->pause_open && !s->paused) {
                // A tool call begins: what the stop strings held back goes
                // out, and until the call ends its text is not matched.
                stop_flush(&s->stop, &out, &n_out_text);
                rc = text_append(e, out, n_out_text);
                s->paused = true;
                s->pause_body = false;
            } else if (!rc && s->paused && !s->pause_body) {
                // Not a call after all where its body does not open as one
                // ('{' of a JSON call, '<' of an XML one): stop strings
                // apply again from here, as the text will be content.
                size_t k = 0;
                while (k < n_dec && (e->tsbuf[k] == ' ' || e->tsbuf[k] == '\t' || e->tsbuf[k] == '\n' ||
                                     e->tsbuf[k] == '\r'))
                    k++;
                if (k < n_dec) {
                    s->pause_body = true;
                    s->paused = e->tsbuf[k] == '{' || e->tsbuf[k] == '<';
                }
            }
            if (!rc && s->paused) {
                rc = text_append(e, e->tsbuf, n_dec);
            } else if (!rc && n_out <= s->min_tokens) {
                rc = stop_pass_text(&s->stop, e->tsbuf, n_dec, &out, &n_out_text);
                if (!rc) rc = text_append(e, out, n_out_text);
            } else if (!rc) {
                rc = stop_feed_text(&s->stop, e->tsbuf, n_dec, &matched, &out, &n_out_text);
                if (!rc) rc = text_append(e, out, n_out_text);
            }
            if (id == s->pause_close) s->paused = false;
        }
        if (!rc && matched < 0 && fin != FINISH_NONE) {
            // The end: an incomplete character becomes U+FFFD (as a full
            // decode would), then whatever the stop strings held back.
            rc = tok_stream_finish(&s->ts, e->tsbuf, e->tsbuf_cap, &n_dec);
            if (!rc && s->paused) {
                rc = text_append(e, e->tsbuf, n_dec);
            } else if (!rc) {
                rc = stop_feed_text(&s->stop, e->tsbuf, n_dec, &matched, &out, &n_out_text);
                if (!rc) rc = text_append(e, out, n_out_text);
            }
            if (!rc && matched < 0) {
                stop_flush(&s->stop, &out, &n_out_text);
                rc = text_append(e, out, n_out_text);
            }
        }
        if (rc) {
            char msg[160];
            snprintf(msg, sizeof msg, "detokenizing token %d failed (%s)", (int)id,
                     ms_status_name(rc));
            seq_finish(e, s, &s->sampled, 1, FINISH_ABORT, NULL, -1, msg);
            return;
        }
        if (matched >= 0) {
            fin = FINISH_STOP;
            stop_id = -1;
            stop_str = s->stop.strs[matched];
        }
    }
    if (fin == FINISH_NONE) {
        seq_emit(e, s, &s->sampled, 1, FINISH_NONE, NULL, -1, NULL);
        return;
    }
    // stop_str points into the sequence, which outlives the delta.
    seq_finish(e, s, &s->sampled, 1, fin, stop_str, stop_id, NULL);
}

// ---- the step -------------------------------------------------------------------

// The sampling rows of one sequence: a score row for each prompt token its
// logits rows predict (prompt logprobs), then the row that draws its next
// token. Returns the rows added.
static int seq_rows(struct rank_slot *r, struct sched_seq *q, int n)
{
    struct engine *e = r->e;
    struct seq *s = seq_of(q);
    if (q->sched_rows == 0) return 0;
    const size_t V = (size_t)e->vocab;
    float *rows = r->logits + (size_t)q->row * V;
    int added = 0;
    if (q->wants_prompt_lp) {
        int first_pos = q->n_computed + q->sched_new - q->sched_rows;
        for (int j = 0; j < q->sched_rows; j++) {
            int pos = first_pos + j; // row j predicts token pos + 1
            if (pos + 1 >= q->n_prompt) continue;
            r->rows[n + added] = (struct backend_sample_row){
                .logits = rows + (size_t)j * V, .p = &s->sampling, .score = q->tokens[pos + 1]};
            r->row_dst[n + added++] = &s->prompt_lp[pos];
        }
    }
    if (q->sched_sample) {
        const uint32_t *allowed = s->allowed_ids;
        if (s->gm && s->gm_active && !s->gm_rc) {
            s->gm_rc = grammar_matcher_fill_mask(s->gm, s->mask);
            if (!s->gm_rc) {
                // Both: the tokens each allows (none: the request ends, said below).
                if (s->allowed_ids) {
                    uint32_t any = 0;
                    for (size_t w = 0; w < ((size_t)e->vocab + 31) / 32; w++) any |= s->mask[w] &= s->allowed_ids[w];
                    s->allowed_conflict = !any;
                }
                allowed = s->mask;
            }
        }
        r->rows[n + added] = (struct backend_sample_row){
            .logits = rows + (size_t)(q->sched_rows - 1) * V,
            .p = q->n_tokens - q->n_prompt < s->min_tokens ? &s->sampling_min : &s->sampling,
            .prompt = q->tokens,
            .n_prompt = q->n_prompt,
            .output = q->tokens + q->n_prompt,
            .n_output = q->n_tokens - q->n_prompt,
            .position = (uint32_t)q->n_tokens,
            .allowed = allowed,
            .score = -1,
        };
        r->row_dst[n + added++] = &s->sampled;
    }
    return added;
}

// Runs a rank's forward pass over its planned batch and samples its
// sequences (on the rank's own thread), all on its backend.
static void rank_run_step(struct rank_slot *r)
{
    struct sched_rank *p = r->plan;
    for (int i = 0; i < p->n_batch; i++) {
        struct sched_seq *q = p->batch[i];
        struct fwd_seq *f = &r->fseqs[i];
        f->tokens = q->tokens + q->n_computed;
        f->n_new = q->sched_new;
        f->n_past = q->n_computed;
        f->blocks = q->table.ids;
        f->n_logits = q->sched_rows;
    }
    struct fwd_batch b = {.n_seqs = p->n_batch, .seqs = r->fseqs};
    r->err[0] = 0;
    r->rc = rank_forward(r->rank, &b, r->logits, r->err, sizeof r->err);
    if (r->rc) return;
    const double t0 = ms_now();
    int n = 0;
    for (int i = 0; i < p->n_batch; i++) n += seq_rows(r, p->batch[i], n);
    if (n > 0) {
        r->rc = r->b->ops->sample(r->b, r->rows, n, r->e->vocab, r->row_out);
        if (r->rc) snprintf(r->err, sizeof r->err, "sampling failed: %s", r->b->err);
        else
            for (int i = 0; i < n; i++) *r->row_dst[i] = r->row_out[i];
    }
    const double dt = ms_now() - t0;
    r->sample_seconds += dt;
    // A decode step as rank_forward counted it.
    struct rank_stats rs;
    rank_get_stats(r->rank, &rs);
    if (rs.last_step_decode) r->decode_sample_seconds += dt;
}

static void *rank_worker(void *arg)
{
    struct rank_slot *r = arg;
    struct engine *e = r->e;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&e->step_mu);
        while (e->step_gen == seen && !e->step_quit) pthread_cond_wait(&e->step_go, &e->step_mu);
        if (e->step_quit) {
            pthread_mutex_unlock(&e->step_mu);
            return NULL;
        }
        seen = e->step_gen;
        pthread_mutex_unlock(&e->step_mu);
        rank_run_step(r);
        pthread_mutex_lock(&e->step_mu);
        if (--e->step_pending == 0) pthread_cond_signal(&e->step_done);
        pthread_mutex_unlock(&e->step_mu);
    }
}

// Every rank runs the step, in lockstep, even with an empty batch: under
// expert parallelism each joins every MoE exchange.
static void run_ranks(struct engine *e)
{
    if (e->n_ranks > 1) {
        pthread_mutex_lock(&e->step_mu);
        e->step_pending = e->n_ranks - 1;
        e->step_gen++;
        pthread_cond_broadcast(&e->step_go);
        pthread_mutex_unlock(&e->step_mu);
    }
    rank_run_step(&e->ranks[0]);
    if (e->n_ranks > 1) {
        pthread_mutex_lock(&e->step_mu);
        while (e->step_pending > 0) pthread_cond_wait(&e->step_done, &e->step_mu);
        pthread_mutex_unlock(&e->step_mu);
    }
}

static void check_block_accounting(struct engine *e)
{
    const struct kvb_table **tabs = malloc(((size_t)e->sched.running.n + 1) * sizeof *tabs);
    if (!tabs) return;
    char err[256] = "";
    int rc = 0, ri = 0;
    for (struct sched_seq *q = e->sched.waiting.head; q && !rc; q = q->next)
        if (q->table.n || q->rank >= 0)
            rc = ms_err(err, sizeof err, MS_EINTERNAL, "a waiting sequence holds KV blocks");
    for (; ri < e->n_ranks && !rc; ri++) {
        int n = 0;
        for (struct sched_seq *q = e->sched.running.head; q; q = q->next)
            if (q->rank == ri) tabs[n++] = &q->table;
        rc = kvb_check(e->ranks[ri].blocks, tabs, n, err, sizeof err);
    }
    free(tabs);
    if (rc) {
        char msg[320];
        snprintf(msg, sizeof msg, "KV block accounting (rank %d): %s", ri - 1, err);
        ms_log(MS_LOG_ERROR, "%s", msg);
        abort_all(e, msg);
    }
}

// One step's figures for /metrics: its time, its tokens, and each rank's
// forward, all-to-all time and cumulative expert loads.
static void observe_step(struct engine *e, double seconds, int tokens)
{
    struct metrics_step ms;
    memset(&ms, 0, sizeof ms);
    ms.seconds = seconds;
    ms.tokens = tokens;
    ms.n_ranks = e->n_ranks < METRICS_MAX_RANKS ? e->n_ranks : METRICS_MAX_RANKS;
    for (int ri = 0; ri < ms.n_ranks; ri++) {
        struct rank_stats rs;
        rank_get_stats(e->ranks[ri].rank, &rs);
        ms.rank[ri].seconds = rs.last_step_seconds;
        ms.rank[ri].a2a_seconds = rs.last_a2a_seconds;
        ms.rank[ri].expert_tokens = rs.expert_tokens;
        ms.rank[ri].layer_tokens = rs.layer_tokens;
        rank_expert_range(e->ranks[ri].rank, &ms.rank[ri].expert_begin, &ms.rank[ri].expert_end);
    }
    metrics_observe_step(e->o.metrics, &ms);
}

static void step(struct engine *e)
{
    if (sched_plan(&e->sched) == 0) return;
    double t0 = ms_now();
    int tokens = 0;
    for (int ri = 0; ri < e->n_ranks; ri++) {
        struct sched_rank *p = e->ranks[ri].plan;
        for (int i = 0; i < p->n_batch; i++) {
            struct seq *s = seq_of(p->batch[i]);
            if (!s->t_scheduled) s->t_scheduled = t0;
            tokens += p->batch[i]->sched_new;
        }
    }
    run_ranks(e);
    if (e->o.metrics) observe_step(e, ms_now() - t0, tokens);
    for (int ri = 0; ri < e->n_ranks; ri++) {
        struct sched_rank *p = e->ranks[ri].plan;
        if (e->ranks[ri].rc) {
            // A failed forward pass (or sampling) leaves its sequences' KV
            // or next token undefined.
            char msg[832];
            snprintf(msg, sizeof msg, "the step failed on rank %d: %s", ri, e->ranks[ri].err);
            ms_log(MS_LOG_ERROR, "%s", msg);
            for (int i = 0; i < p->n_batch; i++) seq_abort(e, seq_of(p->batch[i]), msg);
            p->n_batch = 0;
        }
    }
    for (int ri = 0; ri < e->n_ranks; ri++) {
        struct sched_rank *p = e->ranks[ri].plan;
        for (int i = 0; i < p->n_batch; i++) {
            struct sched_seq *q = p->batch[i];
            struct seq *s = seq_of(q);
            bool sample = q->sched_sample;
            sched_commit(&e->sched, q);
            if (!sample) continue;
            seq_accept_token(e, s);
        }
        p->n_batch = 0;
    }
    e->steps++;
    if (e->check_blocks) check_block_accounting(e);
}

// ---- the engine thread ----------------------------------------------------------

static void publish_stats(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    struct engine_stats *st = &e->stats;
    st->num_running = e->sched.running.n;
    e->n_waiting_shared = e->sched.waiting.n;
    st->num_waiting = e->sched.waiting.n + e->n_inbox;
    st->n_ranks = e->n_ranks;
    for (int i = 0; i < e->n_ranks && i < ENGINE_MAX_RANKS; i++) {
        st->rank[i].kv_blocks_total = kvb_total(e->ranks[i].blocks);
        st->rank[i].kv_blocks_used = kvb_num_used(e->ranks[i].blocks);
        st->rank[i].kv_blocks_cached = kvb_num_cached(e->ranks[i].blocks);
        st->rank[i].num_running = e->sched.ranks[i].n_running;
        struct rank_stats rs;
        rank_get_stats(e->ranks[i].rank, &rs);
        for (int f = 0; f < FWD_PHASES; f++) st->rank[i].phase_seconds[f] = rs.phase_seconds[f];
        st->rank[i].phase_seconds[ENGINE_PHASE_SAMPLING] = e->ranks[i].sample_seconds;
        st->rank[i].decode_steps = rs.decode_steps;
        for (int f = 0; f < FWD_PHASES; f++) st->rank[i].decode_phase_seconds[f] = rs.decode_phase_seconds[f];
        st->rank[i].decode_phase_seconds[ENGINE_PHASE_SAMPLING] = e->ranks[i].decode_sample_seconds;
        st->rank[i].exchange_seconds = rs.a2a_seconds_total;
        st->rank[i].forward_seconds = rs.forward_seconds_total;
        st->rank[i].padded_steps = rs.padded_steps;
        st->rank[i].graph_steps = rs.graph_steps;
    }
    st->prefix_cache_queries = e->sched.prefix_queries;
    st->prefix_cache_hits = e->sched.prefix_hits;
    st->num_preemptions = e->sched.n_preemptions;
    st->prompt_tokens_total = e->prompt_tokens;
    st->generation_tokens_total = e->generation_tokens;
    memcpy(st->request_success, e->request_success, sizeof st->request_success);
    st->steps = e->steps;
    st->last_step_end = ms_now();
    st->draining = e->draining;
    pthread_mutex_unlock(&e->mu);
}

static struct seq *find_seq(struct sched_list *l, uint64_t id)
{
    for (struct sched_seq *q = l->head; q; q = q->next)
        if (seq_of(q)->id == id) return seq_of(q);
    return NULL;
}

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    struct sched *sc = &e->sched;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        for (;;) {
            bool work = sc->running.n > 0 || sc->waiting.n > 0;
            if (e->quit || e->inbox_head || e->cancels || work) break;
            pthread_cond_wait(&e->wake, &e->mu);
        }
        struct seq *in = e->inbox_head;
        // Taken requests count as waiting at once, so that the queue limit
        // never misses them between the two places.
        e->n_waiting_shared = sc->waiting.n + e->n_inbox;
        e->inbox_head = e->inbox_tail = NULL;
        e->n_inbox = 0;
        struct inbox_cancel *cancels = e->cancels;
        e->cancels = NULL;
        bool quit = e->quit;
        bool expired = e->draining && ms_now() >= e->drain_deadline;
        pthread_mutex_unlock(&e->mu);

        while (in) {
            struct seq *next = in->inbox_next;
            sched_add(sc, &in->q);
            in = next;
        }
        while (cancels) {
            struct inbox_cancel *next = cancels->next;
            struct seq *s = find_seq(&sc->running, cancels->id);
            if (!s) s = find_seq(&sc->waiting, cancels->id);
            if (s) seq_abort(e, s, NULL);
            free(cancels);
            cancels = next;
        }
        if (quit) {
            abort_all(e, "the engine is shutting down");
            publish_stats(e);
            return NULL;
        }
        if (expired) abort_all(e, NULL); // drain timeout: finish_reason abort
        if (sc->running.n > 0 || sc->waiting.n > 0) step(e);
        publish_stats(e);
    }
}

// ---- creation -----------------------------------------------------------------

// A quarter of the backend's free memory, at most 4 GiB (vLLM's CPU
// default); the planner's fit check below bounds it on every device.
static size_t default_kv_bytes(const struct backend_memory *mem)
{
    size_t cap = (size_t)4 << 30;
    size_t b = (size_t)(mem->free_bytes / 4);
    if (!b || b > cap) b = cap;
    return b;
}

// The planner's options for this engine on a device with memory `mem`:
// RAM shared by the ranks (the CPU: 90% of it, fp32 activations) or one GPU
// per rank (--gpu-memory-utilization of it, fp32 activations too: the CUDA
// backend rounds them to bf16 only inside its matmuls). kv_per_device is
// each device's KV pool, or 0: what the weights and workspace leave.
static void fit_opts(const struct model *m, const struct engine_opts *o,
                     const struct backend_memory *mem, int max_len, uint64_t kv_per_device,
                     struct plan_opts *po)
{
    plan_opts_default(po);
    // Quantized projections count as the loader holds them: the format, and
    // the bytes of the model itself (its checkpoint's groups), on the
    // busiest rank (experts split as forward.c splits them) or, for ranks
    // sharing the memory, once.
    po->weight_dtype = plan_dtype_from_quant(m->quant, m->cfg.torch_dtype);
    const int R = o->data_parallel_size > 0 ? o->data_parallel_size : 1, E = m->cfg.n_experts;
    po->weight_bytes = mem->host_shared ? model_rank_weight_bytes(m, 0, E) : 0;
    for (int r = 0; !mem->host_shared && r < R; r++) {
        const uint64_t b = model_rank_weight_bytes(m, (int)((long long)E * r / R),
                                                   (int)((long long)E * (r + 1) / R));
        if (b > po->weight_bytes) po->weight_bytes = b;
    }
    po->kv_dtype = plan_dtype_from_dtype(o->kv_dtype);
    po->device_memory = mem->total_bytes;
    // The CPU keeps the rest for the OS, the HTTP side and the page cache.
    po->memory_utilization = mem->host_shared ? 0.9 : o->gpu_memory_utilization;
    po->kv_cache_bytes = kv_per_device;
    po->shared_memory = mem->host_shared;
    po->max_model_len = max_len;
    po->max_num_batched_tokens = o->max_num_batched_tokens;
    // The planner's logits rows: as many as a step may sample or score
    // (engine_logit_rows), beyond max_num_seqs by the prompt rows a step
    // scores for prompt logprobs.
    po->max_num_seqs = engine_logit_rows(o);
    po->activation_bytes = 4;
    po->runtime_reserve = (mem->host_shared ? (uint64_t)64 << 20 : (uint64_t)512 << 20) +
                          mem->scratch_bytes;
    po->sample_bytes_per_logit = mem->sample_bytes_per_logit;
}

// A GPU's default KV pool: what --gpu-memory-utilization leaves after the
// weights (the rank's share of the experts) and the activation workspace,
// for every rank (one GPU each). 0 when nothing is left (check_fit refuses).
static size_t gpu_kv_bytes(const struct model *m, const struct engine_opts *o,
                           const struct backend_memory *mem, int n_ranks, int max_len)
{
    struct plan_opts po;
    fit_opts(m, o, mem, max_len, 0, &po);
    struct plan_device d;
    char err[256];
    if (plan_device_compute(&m->cfg, &po, PLAN_DP_EP, n_ranks, &d, err, sizeof err)) return 0;
    return (size_t)d.kv_bytes * (size_t)n_ranks;
}

// The start-up fit check, with the planner's arithmetic (what `moeserve
// plan` prints): the memory must hold the weights (mapped once for every
// rank when the ranks share it), each rank's activation workspace and KV
// pool, and at least one max-model-len sequence per rank (on a GPU this is
// a refusal; on the CPU, whose pool the flags may choose small, a warning).
// Logs the plan either way.
static int check_fit(const struct model *m, const struct engine_opts *o,
                     const struct backend_memory *mem, int n_ranks, int max_len, size_t kv_total,
                     char *err, size_t errlen)
{
    const struct model_config *cfg = &m->cfg;
    if (!mem->total_bytes) return 0; // no way to know: the kernel will tell
    // The planner takes the CPU's pool as the ranks' total, a GPU's per device.
    const size_t kv_dev = mem->host_shared ? kv_total : kv_total / (size_t)n_ranks;
    struct plan_opts po;
    fit_opts(m, o, mem, max_len, kv_dev ? kv_dev : 1, &po);
    struct plan_device d;
    int rc = plan_device_compute(cfg, &po, PLAN_DP_EP, n_ranks, &d, err, errlen);
    if (rc) return rc;
    const double G = 1024.0 * 1024.0 * 1024.0;
    ms_log(MS_LOG_INFO,
           "memory plan: weights %.2f GiB + activation workspace %.2f GiB + KV %.2f GiB "
           "(%d rank%s x %llu tokens) = %.2f GiB of %.2f GiB usable (%.0f%% of %s); one "
           "%d-token sequence needs %llu of a rank's %llu blocks",
           (double)d.weight_bytes / G, (double)d.workspace_bytes / G, (double)kv_dev / G, n_ranks,
           n_ranks > 1 ? "s" : "", (unsigned long long)d.kv_tokens, (double)d.used_bytes / G,
           (double)d.usable_bytes / G, 100 * po.memory_utilization,
           mem->host_shared ? "RAM" : "each GPU's memory", max_len,
           (unsigned long long)d.seq_blocks, (unsigned long long)d.kv_blocks);
    // A pool that cannot hold one --max-model-len sequence would refuse, one
    // by one, the requests the server promises to take: refuse to start
    // instead, with the numbers and the length that would fit (vLLM does).
    if (d.need_bytes > d.usable_bytes || d.used_bytes > d.usable_bytes ||
        d.kv_blocks < d.seq_blocks)
        return plan_check_fit(&d, err, errlen);
    return 0;
}

int engine_create(const struct model *m, const struct tokenizer *tok, const struct engine_opts *o,
                  struct engine **out, char *err, size_t errlen)
{
    *out = NULL;
    const struct model_config *cfg = &m->cfg;
    int n_ranks = o->data_parallel_size;
    if (n_ranks < 1 || n_ranks > ENGINE_MAX_RANKS)
        return ms_err(err, errlen, MS_EINVAL, "--data-parallel-size must be from 1 to %d, not %d",
                      ENGINE_MAX_RANKS, n_ranks);
    if (n_ranks > 1 && !o->enable_expert_parallel)
        return ms_err(err, errlen, MS_EINVAL,
                      "--data-parallel-size %d needs --enable-expert-parallel: ranks share the "
                      "MoE layers by splitting the experts between them", n_ranks);
    if (o->kv_dtype != DTYPE_BF16 && o->kv_dtype != DTYPE_F16 && o->kv_dtype != DTYPE_F32)
        return ms_err(err, errlen, MS_EINVAL, "the KV cache dtype must be bfloat16, float16 or "
                      "float32, not %s", dtype_name(o->kv_dtype));
    if (o->max_num_seqs < 1)
        return ms_err(err, errlen, MS_EINVAL, "--max-num-seqs must be at least 1, not %d",
                      o->max_num_seqs);
    if (o->max_num_batched_tokens < o->max_num_seqs)
        return ms_err(err, errlen, MS_EINVAL,
                      "--max-num-batched-tokens (%d) must be at least --max-num-seqs (%d), so "
                      "that every running sequence can decode in one step",
                      o->max_num_batched_tokens, o->max_num_seqs);
    int max_len = o->max_model_len > 0 ? o->max_model_len : cfg->max_position_embeddings;
    if (max_len > cfg->max_position_embeddings)
        return ms_err(err, errlen, MS_EINVAL,
                      "--max-model-len %d is beyond the model's max_position_embeddings (%d)",
                      max_len, cfg->max_position_embeddings);
    if (max_len < 1)
        return ms_err(err, errlen, MS_EINVAL, "the maximum model length must be at least 1");
    if (!o->enable_chunked_prefill && o->max_num_batched_tokens < max_len)
        return ms_err(err, errlen, MS_EINVAL,
                      "without chunked prefill a whole prompt must fit one step: "
                      "--max-num-batched-tokens (%d) must be at least --max-model-len (%d)",
                      o->max_num_batched_tokens, max_len);
    if (!(o->gpu_memory_utilization > 0 && o->gpu_memory_utilization <= 1))
        return ms_err(err, errlen, MS_EINVAL, "--gpu-memory-utilization must be in (0, 1], not %g",
                      o->gpu_memory_utilization);
    if (o->max_waiting_requests < 0)
        return ms_err(err, errlen, MS_EINVAL, "--max-waiting-requests must be 0 or more, not %d",
                      o->max_waiting_requests);

    struct engine *e = calloc(1, sizeof *e);
    if (!e) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the engine");
    e->m = m;
    e->tok = tok;
    e->o = *o;
    e->vocab = cfg->vocab_size;
    e->max_model_len = max_len;
    e->n_ranks = n_ranks;
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->idle, NULL);
    pthread_mutex_init(&e->step_mu, NULL);
    pthread_cond_init(&e->step_go, NULL);
    pthread_cond_init(&e->step_done, NULL);
    if (getrandom(&e->rng_state, sizeof e->rng_state, 0) != (ssize_t)sizeof e->rng_state)
        e->rng_state = (uint64_t)(ms_now() * 1e9) ^ (uint64_t)getpid();
    const char *chk = getenv("MOESERVE_CHECK_BLOCKS");
    e->check_blocks = chk && *chk && strcmp(chk, "0") != 0;
    int rc = 0;

    // Threads: the total split between ranks, the first ranks taking the remainder.
    int n_threads = o->n_threads;
    if (n_threads <= 0) n_threads = ms_cpu_count();
    enum backend_device dev;
    char note[256];
    if ((rc = backend_device_resolve(o->device, &dev, note, sizeof note, err, errlen))) goto fail;
    if (note[0]) ms_log(MS_LOG_INFO, "%s", note);
    e->ranks = calloc((size_t)n_ranks, sizeof *e->ranks);
    if (!e->ranks) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for the ranks");
        goto fail;
    }
    for (int i = 0; i < n_ranks; i++) {
        struct backend_opts bo = {
            .n_threads = n_threads / n_ranks + (i < n_threads % n_ranks ? 1 : 0),
            .device_index = i,
            .rank = i,
        };
        if (bo.n_threads < 1) bo.n_threads = 1; // more ranks than threads: one each all the same
        e->n_threads += bo.n_threads;
        e->ranks[i].index = i;
        e->ranks[i].e = e;
        if ((rc = backend_create(dev, &bo, &e->ranks[i].b, err, errlen))) goto fail;
    }
    // Every rank's device is alike: the first one's memory sizes them all.
    struct backend_memory mem;
    struct backend *b0 = e->ranks[0].b;
    if ((rc = b0->ops->memory(b0, &mem))) {
        rc = ms_err(err, errlen, rc, "%s", b0->err);
        goto fail;
    }
    size_t kv_bytes = o->kv_cache_bytes;
    if (!kv_bytes)
        kv_bytes = mem.host_shared ? default_kv_bytes(&mem)
                                   : gpu_kv_bytes(m, o, &mem, n_ranks, max_len);
    size_t block_bytes = kv_block_bytes(cfg, o->kv_dtype);
    size_t per_rank = kv_bytes / (size_t)n_ranks;
    size_t n_blocks = block_bytes ? per_rank / block_bytes : 0;
    if (!o->kv_cache_bytes) {
        // The default never takes more than every sequence at full length needs.
        size_t most = (size_t)o->max_num_seqs * (((size_t)max_len + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
        if (n_blocks > most) n_blocks = most;
    }
    rc = check_fit(m, o, &mem, n_ranks, max_len, n_blocks * block_bytes * (size_t)n_ranks, err,
                   errlen);
    if (rc) goto fail;
    if (n_blocks > (1u << 28)) n_blocks = 1u << 28; // block ids are int32; 4G tokens a rank
    if (n_blocks < 1) {
        rc = ms_err(err, errlen, MS_ENOFIT,
                    "the KV cache budget (%zu bytes, %zu per rank over %d ranks) holds no block "
                    "of %zu bytes (%d tokens): raise --kv-cache-memory",
                    kv_bytes, per_rank, n_ranks, block_bytes, KV_BLOCK_TOKENS);
        goto fail;
    }
    e->blocks_per_rank = (int)n_blocks;

    if (n_ranks > 1) {
        e->comms = calloc((size_t)n_ranks, sizeof *e->comms);
        if (!e->comms) {
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for the communicators");
            goto fail;
        }
        struct backend *bs[ENGINE_MAX_RANKS];
        for (int i = 0; i < n_ranks; i++) bs[i] = e->ranks[i].b;
        rc = backend_comm_create(dev, n_ranks, bs, e->comms, err, errlen);
        if (rc) goto fail;
    }
    int max_rows = engine_logit_rows(o);
    // Decode steps replay graphs where the backend records them (CUDA).
    const struct backend_ops *ops0 = e->ranks[0].b->ops;
    const bool graphs = !o->enforce_eager && ops0->graph_begin;
    if (graphs) {
        int cap = o->max_num_seqs < max_rows ? o->max_num_seqs : max_rows, bk[64];
        const int nb = fwd_plan_buckets(cap, bk, 64);
        ms_log(MS_LOG_INFO, "decode steps of up to %d sequences run padded to %d buckets (%d, %d, "
               "..., %d), each replaying a %s graph recorded at its second step; --enforce-eager "
               "runs them eagerly", cap, nb, bk[0], nb > 1 ? bk[1] : bk[0], bk[nb - 1], ops0->name);
    } else if (o->enforce_eager && ops0->graph_begin) {
        ms_log(MS_LOG_INFO, "--enforce-eager: decode steps run eagerly, as they come (no graphs)");
    } else if (o->enforce_eager) {
        ms_log(MS_LOG_INFO, "--enforce-eager: the %s backend records no graphs, so steps run "
               "eagerly already; the flag changes nothing", ops0->name);
    }
    for (int i = 0; i < n_ranks; i++) {
        struct rank_slot *r = &e->ranks[i];
        rc = kv_pool_create(r->b, cfg, o->kv_dtype, (int)n_blocks, &r->kv, err, errlen);
        if (rc) goto fail;
        rc = kvb_create((int)n_blocks, o->enable_prefix_caching, &r->blocks, err, errlen);
        if (rc) goto fail;
        struct rank_opts ro = {
            .rank = i,
            .n_ranks = n_ranks,
            .comm = n_ranks > 1 ? e->comms[i] : NULL,
            .max_batch_tokens = o->max_num_batched_tokens,
            .max_batch_seqs = o->max_num_seqs,
            .max_seq_len = max_len,
            .decode = graphs ? FWD_DECODE_GRAPHS : FWD_DECODE_EAGER,
            .max_logit_rows = max_rows,
        };
        rc = rank_create(m, r->b, r->kv, &ro, &r->rank, err, errlen);
        if (rc) goto fail;
        size_t logit_bytes = (size_t)max_rows * (size_t)e->vocab * sizeof *r->logits;
        if ((rc = r->b->ops->alloc(r->b, logit_bytes, (void **)&r->logits))) {
            rc = ms_err(err, errlen, rc, "rank %d's logits (%d rows of %d): %s", i, max_rows,
                        e->vocab, r->b->err);
            goto fail;
        }
        if (o->prefault_memory) { // the pool, the workspace and the logits: what steps write
            const double t0 = ms_now();
            if ((rc = kv_pool_prefault(r->b, r->kv, err, errlen)) || (rc = rank_prefault(r->rank, err, errlen)) ||
                (rc = backend_prefault(r->b, r->logits, logit_bytes, "the logits", err, errlen)))
                goto fail;
            ms_log(MS_LOG_INFO, "rank %d: KV pool (%.1f MiB), step workspace and logits resident in %.2f s", i,
                   2.0 * (double)kv_pool_bytes(r->kv) / (1 << 20), ms_now() - t0);
        }
        r->rows = calloc((size_t)max_rows, sizeof *r->rows);
        r->row_out = calloc((size_t)max_rows, sizeof *r->row_out);
        r->row_dst = calloc((size_t)max_rows, sizeof *r->row_dst);
        r->fseqs = calloc((size_t)o->max_num_seqs, sizeof *r->fseqs);
        if (!r->rows || !r->row_out || !r->row_dst || !r->fseqs) {
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for rank %d's step tables", i);
            goto fail;
        }
    }
    struct kv_blocks *blocks[ENGINE_MAX_RANKS];
    for (int i = 0; i < n_ranks; i++) blocks[i] = e->ranks[i].blocks;
    rc = sched_init(&e->sched, n_ranks, blocks, max_rows, o->max_num_seqs,
                    o->max_num_batched_tokens, o->enable_chunked_prefill, err, errlen);
    if (rc) goto fail;
    e->sched_ready = true;
    for (int i = 0; i < n_ranks; i++) e->ranks[i].plan = &e->sched.ranks[i];
    if (tok) {
        e->tsbuf_cap = tok_stream_max_output(tok);
        e->tsbuf = malloc(e->tsbuf_cap);
    }
    if ((tok && !e->tsbuf) || ms_buf_reserve(&e->text, 4096)) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for the engine's text buffers");
        goto fail;
    }
    for (int i = 1; i < n_ranks; i++) {
        if (pthread_create(&e->ranks[i].thread, NULL, rank_worker, &e->ranks[i])) {
            rc = ms_err(err, errlen, MS_ENOMEM, "cannot start the thread of rank %d", i);
            goto fail;
        }
        e->ranks[i].thread_started = true;
    }
    publish_stats(e);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        rc = ms_err(err, errlen, MS_ENOMEM, "cannot start the engine thread");
        goto fail;
    }
    e->thread_started = true;
    ms_log(MS_LOG_INFO,
           "engine: %d rank%s on %s (%s kernels), %d thread%s, KV %d blocks of %d tokens per rank "
           "(%s, %.1f MiB each), max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
           "prefix caching %s, chunked prefill %s",
           n_ranks, n_ranks > 1 ? "s" : "", backend_device_name(dev),
           b0->ops->variant(b0), e->n_threads, e->n_threads > 1 ? "s" : "", (int)n_blocks, KV_BLOCK_TOKENS,
           dtype_name(o->kv_dtype), (double)n_blocks * (double)block_bytes / 1048576.0, max_len,
           o->max_num_seqs, o->max_num_batched_tokens, o->enable_prefix_caching ? "on" : "off",
           o->enable_chunked_prefill ? "on" : "off");
    *out = e;
    return 0;
fail:
    engine_destroy(e);
    return rc ? rc : MS_EINTERNAL;
}

void engine_destroy(struct engine *e)
{
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->quit = true;
        pthread_cond_broadcast(&e->wake);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    // Requests submitted after the engine thread left never ran.
    while (e->inbox_head) {
        struct seq *s = e->inbox_head;
        e->inbox_head = s->inbox_next;
        seq_free(s);
    }
    while (e->cancels) {
        struct inbox_cancel *c = e->cancels;
        e->cancels = c->next;
        free(c);
    }
    pthread_mutex_lock(&e->step_mu);
    e->step_quit = true;
    pthread_cond_broadcast(&e->step_go);
    pthread_mutex_unlock(&e->step_mu);
    if (e->ranks) {
        for (int i = 0; i < e->n_ranks; i++)
            if (e->ranks[i].thread_started) pthread_join(e->ranks[i].thread, NULL);
        for (int i = 0; i < e->n_ranks; i++) {
            struct rank_slot *r = &e->ranks[i];
            if (r->rank) rank_destroy(r->rank);
            kvb_destroy(r->blocks);
            if (r->b) {
                kv_pool_destroy(r->b, r->kv);
                if (r->logits) r->b->ops->free(r->b, r->logits);
            }
            free(r->rows);
            free(r->row_out);
            free(r->row_dst);
            free(r->fseqs);
        }
    }
    if (e->sched_ready) sched_free(&e->sched);
    if (e->comms) {
        for (int i = 0; i < e->n_ranks; i++)
            if (e->comms[i]) e->comms[i]->ops->destroy(e->comms[i]);
        free(e->comms);
    }
    if (e->ranks)
        for (int i = 0; i < e->n_ranks; i++) backend_destroy(e->ranks[i].b);
    free(e->ranks);
    ms_buf_free(&e->text);
    free(e->tsbuf);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->idle);
    pthread_mutex_destroy(&e->step_mu);
    pthread_cond_destroy(&e->step_go);
    pthread_cond_destroy(&e->step_done);
    free(e);
}

// ---- the thread-safe API ----------------------------------------------------------

int engine_submit(struct engine *e, const struct engine_request *r, const struct engine_sink *sink,
                  uint64_t *id_out, char *err, size_t errlen)
{
    if (id_out) *id_out = 0;
    struct seq *s;
    int rc = seq_create(e, r, sink, &s, err, errlen);
    if (rc) return rc;
    s->t_submit = ms_now();
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->quit) {
        pthread_mutex_unlock(&e->mu);
        seq_free(s);
        return ms_err(err, errlen, MS_EBUSY, "the server is shutting down and takes no new requests");
    }
    if (e->o.max_waiting_requests > 0 &&
        e->n_waiting_shared + e->n_inbox >= e->o.max_waiting_requests) {
        int n = e->n_waiting_shared + e->n_inbox;
        pthread_mutex_unlock(&e->mu);
        seq_free(s);
        return ms_err(err, errlen, MS_EBUSY,
                      "%d requests are already waiting (--max-waiting-requests %d); retry later", n,
                      e->o.max_waiting_requests);
    }
    s->id = e->next_id++;
    // An unseeded request draws under a key of its own.
    if (!s->sampling.has_seed) s->sampling.seed = splitmix64(&e->rng_state);
    s->sampling_min.seed = s->sampling.seed; // one stream of draws, with or without the min bias
    s->inbox_next = NULL;
    if (e->inbox_tail) e->inbox_tail->inbox_next = s;
    else e->inbox_head = s;
    e->inbox_tail = s;
    e->n_inbox++;
    e->in_flight++;
    if (id_out) *id_out = s->id;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void engine_cancel(struct engine *e, uint64_t id)
{
    struct inbox_cancel *c = malloc(sizeof *c);
    if (!c) return; // the request runs to its end instead
    c->id = id;
    pthread_mutex_lock(&e->mu);
    // Appended in order so a cancel follows its own submission.
    c->next = NULL;
    struct inbox_cancel **p = &e->cancels;
    while (*p) p = &(*p)->next;
    *p = c;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void engine_drain(struct engine *e, double timeout_s)
{
    pthread_mutex_lock(&e->mu);
    if (!e->draining) {
        e->draining = true;
        e->stats.draining = true;
        e->drain_deadline = ms_now() + (timeout_s > 0 ? timeout_s : 0);
    }
    pthread_cond_broadcast(&e->wake);
    while (e->in_flight > 0) {
        double now = ms_now();
        if (now >= e->drain_deadline) {
            // Past the deadline the engine thread aborts what is left; wake it
            // in case it sleeps, then wait for the aborts to arrive.
            pthread_cond_broadcast(&e->wake);
            pthread_cond_wait(&e->idle, &e->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double wait = e->drain_deadline - now + 0.001;
        ts.tv_sec += (time_t)wait;
        ts.tv_nsec += (long)((wait - floor(wait)) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&e->idle, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
}

int engine_max_model_len(const struct engine *e) { return e->max_model_len; }

int engine_threads(const struct engine *e) { return e->n_threads; }

void engine_get_stats(struct engine *e, struct engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->num_waiting = e->n_waiting_shared + e->n_inbox;
    out->draining = e->draining;
    // An idle engine thread sleeps and is alive: only a step that does not
    // end makes last_step_end grow old.
    if (e->in_flight == 0) out->last_step_end = ms_now();
    pthread_mutex_unlock(&e->mu);
}
