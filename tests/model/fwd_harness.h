// fwd_harness: what the forward-pass tests share — loading a checkpoint with
// a backend, a KV pool and one rank, handing out block tables, running a
// step into the backend's memory and reading its logits back, and
// log-softmax of a logits row.
#ifndef MOESERVE_TESTS_MODEL_FWD_HARNESS_H
#define MOESERVE_TESTS_MODEL_FWD_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend_registry.h"
#include "model/forward.h"
#include "model/model.h"

// The device the forward tests run on: the CPU, or CUDA when the test is
// registered with MOESERVE_TEST_DEVICE=cuda (tests/gpu/ registers the
// forward tests again that way). harness_pick_device returns 77 (meson's
// skip) when CUDA is asked for and this build or machine has no GPU.
static enum backend_device harness_device = BACKEND_DEVICE_CPU;

static inline int harness_pick_device(void)
{
    const char *d = getenv("MOESERVE_TEST_DEVICE");
    if (!d || strcmp(d, "cuda") != 0) return 0;
    if (backend_device_count(BACKEND_DEVICE_CUDA) < 1) {
        enum backend_device dv;
        char why[512];
        backend_device_resolve(BACKEND_DEVICE_CUDA, &dv, NULL, 0, why, sizeof why);
        fprintf(stderr, "skipped: no GPU to run on (%s)\n", why);
        return 77;
    }
    harness_device = BACKEND_DEVICE_CUDA;
    return 0;
}

struct harness {
    struct model *m;
    struct backend *b;
    struct kv_pool *kv;
    struct rank *r;
    float *d_logits;       // (max_tokens, vocab) backend memory
    int next_block;
};

// A loaded model m (the harness owns it from here) on a CPU backend running
// the kernel table `variant` (NULL: the best; the names come from
// backend_variants) with `threads` threads.
static inline int harness_open_model(struct harness *h, const char *variant, struct model *m,
                                     enum dtype kv_dtype, int n_blocks, int threads, int max_tokens,
                                     int max_seqs)
{
    char err[1024];
    memset(h, 0, sizeof *h);
    h->m = m;
    struct backend_opts bo = {.n_threads = threads, .variant = variant};
    if (backend_create(harness_device, &bo, &h->b, err, sizeof err)) {
        fprintf(stderr, "backend_create: %s\n", err);
        return -1;
    }
    if (kv_pool_create(h->b, &h->m->cfg, kv_dtype, n_blocks, &h->kv, err, sizeof err)) {
        fprintf(stderr, "kv_pool_create: %s\n", err);
        return -1;
    }
    struct rank_opts o = {.rank = 0, .n_ranks = 1, .max_batch_tokens = max_tokens,
                          .max_batch_seqs = max_seqs};
    if (rank_create(h->m, h->b, h->kv, &o, &h->r, err, sizeof err)) {
        fprintf(stderr, "rank_create: %s\n", err);
        return -1;
    }
    if (h->b->ops->alloc(h->b, (size_t)max_tokens * h->m->cfg.vocab_size * sizeof(float),
                         (void **)&h->d_logits)) {
        fprintf(stderr, "logits: %s\n", h->b->err);
        return -1;
    }
    return 0;
}

// The checkpoint in dir, as harness_open_model.
static inline int harness_open_on(struct harness *h, const char *variant, const char *dir,
                                  enum dtype kv_dtype, int n_blocks, int threads, int max_tokens,
                                  int max_seqs)
{
    char err[1024];
    struct model *m;
    memset(h, 0, sizeof *h);
    if (model_load(dir, &m, err, sizeof err)) {
        fprintf(stderr, "model_load %s: %s\n", dir, err);
        return -1;
    }
    return harness_open_model(h, variant, m, kv_dtype, n_blocks, threads, max_tokens, max_seqs);
}

static inline int harness_open(struct harness *h, const char *dir, enum dtype kv_dtype, int n_blocks,
                               int threads, int max_tokens, int max_seqs)
{
    return harness_open_on(h, NULL, dir, kv_dtype, n_blocks, threads, max_tokens, max_seqs);
}

static inline void harness_close(struct harness *h)
{
    rank_destroy(h->r);
    if (h->b) {
        if (h->d_logits) h->b->ops->free(h->b, h->d_logits);
        kv_pool_destroy(h->b, h->kv);
        backend_destroy(h->b);
    }
    model_destroy(h->m);
}

// One step on the rank; its logits rows (every sequence's n_logits, in
// order) read back into logits (host). logits NULL passes no buffer.
static inline int harness_forward(struct harness *h, const struct fwd_batch *b, float *logits,
                                  char *err, size_t errlen)
{
    int rc = rank_forward(h->r, b, logits ? h->d_logits : NULL, err, errlen);
    if (rc || !logits) return rc;
    size_t rows = 0;
    for (int s = 0; s < b->n_seqs; s++) rows += (size_t)b->seqs[s].n_logits;
    return h->b->ops->download(h->b, logits, h->d_logits,
                               rows * (size_t)h->m->cfg.vocab_size * sizeof(float));
}

// Blocks for a sequence of up to n tokens, taken from the top of the pool
// downwards so that tables are not the identity.
static inline int32_t *harness_blocks(struct harness *h, int n_tokens)
{
    int nb = (n_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    int32_t *b = malloc((size_t)nb * sizeof *b);
    if (!b) abort();
    for (int i = 0; i < nb; i++) {
        if (h->next_block >= h->kv->n_blocks) abort();
        b[i] = h->kv->n_blocks - 1 - h->next_block++;
    }
    return b;
}

static inline void log_softmax(const float *logits, int n, double *out)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    double ls = log(s) + mx;
    for (int i = 0; i < n; i++) out[i] = (double)logits[i] - ls;
}

static inline int argmax_lowest(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

#endif
