// engine_harness: what the engine tests share — a sink that records every
// delta of a request and checks the delta protocol, and helpers that submit a
// set of requests and wait for all of them.
#ifndef MOESERVE_TESTS_ENGINE_HARNESS_H
#define MOESERVE_TESTS_ENGINE_HARNESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "scheduler/engine.h"
#include "scheduler/stop.h"

#define H_MAX_TOKENS 512
#define H_MAX_TEXT 16384

struct h_result {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *n_done;
    uint64_t id;
    int32_t tokens[H_MAX_TOKENS];
    float logprobs[H_MAX_TOKENS];
    struct sample_token first_token; // with its top alternatives
    int n_tokens;
    char text[H_MAX_TEXT];
    size_t text_len;
    enum engine_finish finish;
    char stop_str[128];
    int32_t stop_id;
    int n_deltas;
    int protocol_errors;   // deltas after the final one, bad usage counts, a cut character
    int prompt_tokens, completion_tokens, cached_tokens;
    int n_prompt_lp;
    float *plp;          // (n_prompt_lp) the logprob of each prompt token after the first
    int32_t *plp_ids;    // (n_prompt_lp)
    bool has_error;
    char error[256];
};

static inline void h_on_delta(void *ctx, const struct engine_delta *d)
{
    struct h_result *r = ctx;
    pthread_mutex_lock(r->mu);
    if (r->finish != FINISH_NONE) r->protocol_errors++;
    if (r->id == 0) r->id = d->request_id;
    if (d->request_id != r->id) r->protocol_errors++;
    for (int i = 0; i < d->n_tokens; i++) {
        if (r->n_tokens == 0) r->first_token = d->tokens[i];
        if (r->n_tokens < H_MAX_TOKENS) {
            r->tokens[r->n_tokens] = d->tokens[i].id;
            r->logprobs[r->n_tokens] = d->tokens[i].logprob;
        }
        r->n_tokens++;
    }
    if (d->text_len > 0) {
        if (!d->text || !stop_utf8_valid(d->text, d->text_len)) r->protocol_errors++;
        if (r->text_len + d->text_len < H_MAX_TEXT) {
            memcpy(r->text + r->text_len, d->text, d->text_len);
            r->text_len += d->text_len;
            r->text[r->text_len] = 0;
        }
    }
    if (d->prompt_tokens_lp) {
        if (r->plp) r->protocol_errors++; // sent twice
        r->n_prompt_lp = d->n_prompt_tokens_lp;
        r->plp = malloc((size_t)d->n_prompt_tokens_lp * sizeof *r->plp + 1);
        r->plp_ids = malloc((size_t)d->n_prompt_tokens_lp * sizeof *r->plp_ids + 1);
        if (!r->plp || !r->plp_ids) abort();
        for (int i = 0; i < d->n_prompt_tokens_lp; i++) {
            r->plp[i] = d->prompt_tokens_lp[i].logprob;
            r->plp_ids[i] = d->prompt_tokens_lp[i].id;
        }
    }
    if (d->completion_tokens != r->n_tokens) r->protocol_errors++;
    r->prompt_tokens = d->prompt_tokens;
    r->completion_tokens = d->completion_tokens;
    r->cached_tokens = d->cached_tokens;
    r->n_deltas++;
    if (d->finish != FINISH_NONE) {
        r->finish = d->finish;
        r->stop_id = d->stop_id;
        if (d->stop_str) snprintf(r->stop_str, sizeof r->stop_str, "%s", d->stop_str);
        if (d->error) {
            r->has_error = true;
            snprintf(r->error, sizeof r->error, "%s", d->error);
        }
        (*r->n_done)++;
        pthread_cond_broadcast(r->cv);
    }
    pthread_mutex_unlock(r->mu);
}

struct h_batch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;
    int n;
    struct h_result *res; // (n)
};

static inline struct h_batch *h_batch_new(int n)
{
    struct h_batch *b = calloc(1, sizeof *b);
    b->res = calloc((size_t)n, sizeof *b->res);
    if (!b->res) abort();
    b->n = n;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    for (int i = 0; i < n; i++) {
        b->res[i].mu = &b->mu;
        b->res[i].cv = &b->cv;
        b->res[i].n_done = &b->n_done;
        b->res[i].stop_id = -1;
    }
    return b;
}

static inline void h_batch_free(struct h_batch *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->res[i].plp);
        free(b->res[i].plp_ids);
    }
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b->res);
    free(b);
}

// Submits request i into result slot i; returns the engine's status.
static inline int h_submit(struct engine *e, struct h_batch *b, int i, const struct engine_request *r,
                    char *err, size_t errlen)
{
    struct engine_sink sink = {h_on_delta, &b->res[i]};
    uint64_t id = 0;
    int rc = engine_submit(e, r, &sink, &id, err, errlen);
    pthread_mutex_lock(&b->mu);
    if (rc == 0) {
        if (b->res[i].id != 0 && b->res[i].id != id) b->res[i].protocol_errors++;
        b->res[i].id = id; // the first delta may have set it already
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static inline void h_wait(struct h_batch *b, int n_expected)
{
    pthread_mutex_lock(&b->mu);
    while (b->n_done < n_expected) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

// A deterministic token sequence for tests.
static inline void h_tokens(int32_t *out, int n, uint64_t seed, int vocab)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

#endif
