// forward: one rank's batched Qwen3 / Qwen3-MoE forward pass over its paged
// KV cache (the computation of Hugging Face's modeling code, in fp32 on the
// weights as stored), with each MoE layer as dispatch -> local experts -> combine.
#include "model/forward.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "model/cpu/kernels.h"
#include "model/cpu/ops.h"
#include "model/cpu/threadpool.h"

// ---- KV pool ------------------------------------------------------------------

static bool kv_dtype_ok(enum dtype t) { return t == DTYPE_BF16 || t == DTYPE_F16 || t == DTYPE_F32; }

// Elements of K (or V) in one layer of one block, over all KV heads.
static bool kv_block_elems(const struct model_config *cfg, size_t *out)
{
    return !ms_mul_overflow((size_t)cfg->n_kv_heads, (size_t)KV_BLOCK_TOKENS, out) &&
           !ms_mul_overflow(*out, (size_t)cfg->head_dim, out);
}

size_t kv_block_bytes(const struct model_config *cfg, enum dtype dtype)
{
    size_t n;
    if (!kv_block_elems(cfg, &n) || ms_mul_overflow(n, (size_t)cfg->n_layers, &n) ||
        ms_mul_overflow(n, 2 * dtype_size(dtype), &n))
        return 0;
    return n;
}

int kv_pool_create(const struct model_config *cfg, enum dtype dtype, int n_blocks,
                   struct kv_pool **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!kv_dtype_ok(dtype))
        return ms_err(err, errlen, MS_EINVAL, "the KV cache dtype must be bfloat16, float16 or "
                      "float32, not %s", dtype_name(dtype));
    if (n_blocks < 1)
        return ms_err(err, errlen, MS_EINVAL, "a KV pool needs at least one block of %d tokens, "
                      "not %d blocks", KV_BLOCK_TOKENS, n_blocks);
    size_t per_layer_block, bytes;
    if (!kv_block_elems(cfg, &per_layer_block) ||
        ms_mul_overflow(per_layer_block, (size_t)n_blocks, &bytes) ||
        ms_mul_overflow(bytes, (size_t)cfg->n_layers, &bytes) ||
        ms_mul_overflow(bytes, dtype_size(dtype), &bytes))
        return ms_err(err, errlen, MS_ENOFIT, "a KV pool of %d blocks overflows the address space",
                      n_blocks);
    struct kv_pool *kv = calloc(1, sizeof *kv);
    if (!kv) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the KV pool");
    kv->k = calloc(1, bytes);
    kv->v = kv->k ? calloc(1, bytes) : NULL;
    if (!kv->v) {
        free(kv->k);
        free(kv);
        return ms_err(err, errlen, MS_ENOMEM, "cannot allocate a KV pool of %d blocks "
                      "(2 x %.1f MiB)", n_blocks, (double)bytes / (1 << 20));
    }
    kv->dtype = dtype;
    kv->n_blocks = n_blocks;
    kv->n_layers = cfg->n_layers;
    kv->n_kv_heads = cfg->n_kv_heads;
    kv->head_dim = cfg->head_dim;
    kv->block_bytes = kv_block_bytes(cfg, dtype);
    *out = kv;
    return 0;
}

void kv_pool_destroy(struct kv_pool *kv)
{
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

// ---- the rank -------------------------------------------------------------------

struct rank {
    const struct model *m;
    const struct model_config *cfg;
    struct kv_pool *kv;
    struct rank_opts o;
    struct comm *comm;          // NULL when every expert is local
    int R, me;
    int E, topk;
    int *first_expert;          // (R + 1): rank p owns [first_expert[p], first_expert[p+1])
    int e_begin, e_end;
    struct threadpool *pool;
    struct cpu_exec ex;
    double *inv_freq;           // (head_dim / 2) rotary frequencies
    size_t kv_layer_elems;      // K elements of one layer: n_blocks * n_kv_heads * 16 * head_dim

    // Sizes the workspace was carved for.
    int max_tokens, max_seqs, max_pairs, max_recv, mlp_rows, mlp_width;

    // The workspace: one mapping, carved once.
    void *ws;
    size_t ws_bytes;
    int32_t *tok_id, *tok_pos, *tok_seq; // (T)
    int32_t *tiles;             // (T, 2) attention tiles: first token, tokens
    int n_tiles;
    float *x, *xn;              // (T, hidden) residual stream, normed input
    float *q, *kn, *vn;         // (T, n_heads * head_dim), (T, n_kv * head_dim) x 2
    float *att;                 // (T, n_heads * head_dim)
    float *g, *u;               // (mlp_rows, mlp_width) gate / up activations
    float *rl;                  // (T, E) router logits
    int32_t *top_id;            // (T, topk)
    float *top_w;               // (T, topk)
    int32_t *pair_slot;         // (T * topk) where pair (t, j)'s expert output lands
    int32_t *exp_x;             // (max_recv) x row of each expert-sorted row
    int32_t *exp_y;             // (max_recv) output row of each expert-sorted row
    int *exp_off;               // (E + 1) start of each expert's rows
    int *exp_fill;              // (E)
    int32_t *gather;            // (R, E + 1): pairs per expert from each rank, then its capacity
    int32_t *gather_send;       // (E + 1) this rank's part of gather
    size_t *a2a;                // (4, R): send bytes, send offsets, recv bytes, recv offsets
    float *send, *recv, *res;   // (T*topk, hidden), (max_recv, hidden) x 2; expert parallel only
    float *ret;                 // (T * topk, hidden) expert outputs back at their tokens
    float *xl;                  // (T, hidden) normed rows that want logits
    // Expert parallel only: the lm_head split by vocabulary over the ranks.
    int *first_vocab;           // (R + 1): rank p computes logits [first_vocab[p], first_vocab[p+1])
    int32_t *head_counts;       // (R) rows wanting logits on each rank this step
    float *xg;                  // (R * T, hidden) every rank's xl rows, rank-major
    float *slab;                // (R * T, vocab slice) this rank's slice of every gathered row
    float *lrecv;               // (T, vocab) this rank's rows, slice by slice, rank-major
    int32_t *logit_rows;        // (T)
    struct cpu_mm *jobs;        // (2 * E + 4)
    float *scratch;             // (threads, scratch stride)
    uint64_t *expert_tokens;    // (E)

    const struct fwd_batch *batch;
    int n_tok, n_logit_rows;
    int layer;                  // the layer the parallel pieces are working on
    int mlp_width_now;          // that layer's MLP width (dense or per expert)
    uint64_t steps, tokens;
    double last_step, a2a_time;
    double phase_time[FWD_PHASES], a2a_total, forward_total; // cumulative (rank_stats)
};

void rank_expert_range(const struct rank *r, int *begin, int *end)
{
    *begin = r->e_begin;
    *end = r->e_end;
}

struct carver {
    char *base;     // NULL: only measure
    size_t off;
    bool overflow;
};

static void *carve(struct carver *c, size_t count, size_t size)
{
    size_t n, off;
    if (ms_mul_overflow(count, size, &n) || ms_add_overflow(c->off, 63, &off)) {
        c->overflow = true;
        return NULL;
    }
    off &= ~(size_t)63;
    if (ms_add_overflow(off, n, &c->off)) {
        c->overflow = true;
        return NULL;
    }
    return c->base ? c->base + off : NULL;
}

static void carve_all(struct rank *r, struct carver *c)
{
    const struct model_config *cfg = r->cfg;
    const size_t T = (size_t)r->max_tokens, hd = (size_t)cfg->hidden_size;
    const size_t qd = (size_t)cfg->n_heads * cfg->head_dim, kvd = (size_t)cfg->n_kv_heads * cfg->head_dim;
    const size_t E = (size_t)r->E, P = (size_t)r->max_pairs;
    r->tok_id = carve(c, T, sizeof(int32_t));
    r->tok_pos = carve(c, T, sizeof(int32_t));
    r->tok_seq = carve(c, T, sizeof(int32_t));
    r->tiles = carve(c, 2 * T, sizeof(int32_t));
    r->x = carve(c, T * hd, sizeof(float));
    r->xn = carve(c, T * hd, sizeof(float));
    r->q = carve(c, T * qd, sizeof(float));
    r->kn = carve(c, T * kvd, sizeof(float));
    r->vn = carve(c, T * kvd, sizeof(float));
    r->att = carve(c, T * qd, sizeof(float));
    r->g = carve(c, (size_t)r->mlp_rows * r->mlp_width, sizeof(float));
    r->u = carve(c, (size_t)r->mlp_rows * r->mlp_width, sizeof(float));
    r->rl = carve(c, T * (E ? E : 1), sizeof(float));
    r->top_id = carve(c, P ? P : 1, sizeof(int32_t));
    r->top_w = carve(c, P ? P : 1, sizeof(float));
    r->pair_slot = carve(c, P ? P : 1, sizeof(int32_t));
    r->exp_x = carve(c, (size_t)r->max_recv + 1, sizeof(int32_t));
    r->exp_y = carve(c, (size_t)r->max_recv + 1, sizeof(int32_t));
    r->exp_off = carve(c, E + 1, sizeof(int));
    r->exp_fill = carve(c, E + 1, sizeof(int));
    r->gather = carve(c, (size_t)r->R * (E + 1), sizeof(int32_t));
    r->gather_send = carve(c, E + 1, sizeof(int32_t));
    r->a2a = carve(c, 4 * (size_t)r->R, sizeof(size_t));
    if (r->comm) {
        r->send = carve(c, P * hd, sizeof(float));
        r->recv = carve(c, (size_t)r->max_recv * hd, sizeof(float));
        r->res = carve(c, (size_t)r->max_recv * hd, sizeof(float));
    }
    r->ret = carve(c, (P ? P : 1) * hd, sizeof(float));
    r->xl = carve(c, T * hd, sizeof(float));
    if (r->comm) {
        const size_t R = (size_t)r->R, V = (size_t)cfg->vocab_size, slice = (V + R - 1) / R;
        r->first_vocab = carve(c, R + 1, sizeof(int));
        r->head_counts = carve(c, R, sizeof(int32_t));
        r->xg = carve(c, R * T * hd, sizeof(float));
        r->slab = carve(c, R * T * slice, sizeof(float));
        r->lrecv = carve(c, T * V, sizeof(float));
    }
    r->logit_rows = carve(c, T, sizeof(int32_t));
    r->jobs = carve(c, 2 * E + 4, sizeof(struct cpu_mm));
    r->scratch = carve(c, (size_t)threadpool_size(r->pool) * r->ex.scratch_stride, sizeof(float));
    r->expert_tokens = carve(c, E ? E : 1, sizeof(uint64_t));
}

static int max_int(int a, int b) { return a > b ? a : b; }

int rank_create(const struct model *m, struct kv_pool *kv, const struct rank_opts *o,
                struct rank **out, char *err, size_t errlen)
{
    *out = NULL;
    const struct model_config *cfg = &m->cfg;
    if (o->n_ranks < 1 || o->rank < 0 || o->rank >= o->n_ranks)
        return ms_err(err, errlen, MS_EINVAL, "rank %d of %d ranks does not exist", o->rank,
                      o->n_ranks);
    if (o->n_ranks > 1 && !o->comm)
        return ms_err(err, errlen, MS_EINVAL, "%d ranks need a communicator; none was given",
                      o->n_ranks);
    if (o->comm && (o->comm->n_ranks != o->n_ranks || o->comm->rank != o->rank))
        return ms_err(err, errlen, MS_EINVAL, "the communicator is rank %d of %d but the rank "
                      "options say rank %d of %d", o->comm->rank, o->comm->n_ranks, o->rank,
                      o->n_ranks);
    if (o->max_batch_tokens < 1 || o->max_batch_seqs < 1)
        return ms_err(err, errlen, MS_EINVAL, "max_batch_tokens (%d) and max_batch_seqs (%d) "
                      "must be at least 1", o->max_batch_tokens, o->max_batch_seqs);
    if (!kv || kv->n_layers != cfg->n_layers || kv->n_kv_heads != cfg->n_kv_heads ||
        kv->head_dim != cfg->head_dim || !kv_dtype_ok(kv->dtype))
        return ms_err(err, errlen, MS_EINVAL, "the KV pool does not match the model (layers, KV "
                      "heads or head_dim differ)");
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "num_attention_heads (%d) is not a multiple "
                      "of num_key_value_heads (%d)", cfg->n_heads, cfg->n_kv_heads);

    struct rank *r = calloc(1, sizeof *r);
    if (!r) return ms_err(err, errlen, MS_ENOMEM, "out of memory creating rank %d", o->rank);
    r->m = m;
    r->cfg = cfg;
    r->kv = kv;
    r->o = *o;
    r->R = o->n_ranks;
    r->me = o->rank;
    r->comm = o->n_ranks > 1 ? o->comm : NULL;
    bool any_moe = false, any_dense = false;
    for (int l = 0; l < cfg->n_layers; l++) {
        if (m->layers[l].is_moe) any_moe = true;
        else any_dense = true;
    }
    r->E = any_moe ? cfg->n_experts : 0;
    r->topk = any_moe ? cfg->n_experts_per_tok : 0;
    r->first_expert = calloc((size_t)r->R + 1, sizeof *r->first_expert);
    r->inv_freq = calloc((size_t)cfg->head_dim / 2 + 1, sizeof *r->inv_freq);
    int rc = MS_ENOMEM;
    if (!r->first_expert || !r->inv_freq) {
        ms_err(err, errlen, MS_ENOMEM, "out of memory creating rank %d", o->rank);
        goto fail;
    }
    for (int p = 0; p <= r->R; p++) r->first_expert[p] = (int)((long long)r->E * p / r->R);
    r->e_begin = r->first_expert[r->me];
    r->e_end = r->first_expert[r->me + 1];
    // As Hugging Face computes them: theta^(-2i / head_dim).
    for (int i = 0; i < cfg->head_dim / 2; i++)
        r->inv_freq[i] = pow(cfg->rope_theta, -2.0 * i / cfg->head_dim);
    r->kv_layer_elems = (size_t)kv->n_blocks * cfg->n_kv_heads * KV_BLOCK_TOKENS * cfg->head_dim;

    if ((rc = threadpool_create(o->n_threads, &r->pool, err, errlen))) goto fail;
    r->ex.pool = r->pool;
    r->ex.k = cpu_kernels_best();
    int max_in = max_int(max_int(cfg->hidden_size, cfg->n_heads * cfg->head_dim),
                         max_int(any_moe ? cfg->moe_intermediate_size : 0,
                                 any_dense ? cfg->intermediate_size : 0));
    r->ex.scratch_stride = (cpu_kernels_scratch_floats(max_in, cfg->n_heads / cfg->n_kv_heads,
                                                        cfg->head_dim) + 15) / 16 * 16;

    rc = MS_ENOFIT;
    r->max_tokens = o->max_batch_tokens;
    r->max_seqs = o->max_batch_seqs;
    long long pairs = (long long)r->max_tokens * r->topk, recv = pairs * (r->comm ? r->R : 1);
    if (recv > INT32_MAX / 2) {
        ms_err(err, errlen, MS_ENOFIT, "max_batch_tokens %d x top-k %d x %d ranks is too large "
               "for one step", r->max_tokens, r->topk, r->R);
        goto fail;
    }
    r->max_pairs = (int)pairs;
    r->max_recv = (int)recv;
    r->mlp_rows = max_int(any_dense ? r->max_tokens : 0, any_moe ? r->max_recv : 0);
    r->mlp_width = max_int(any_dense ? cfg->intermediate_size : 0,
                           any_moe ? cfg->moe_intermediate_size : 0);
    struct carver c = {0};
    carve_all(r, &c);
    if (c.overflow) {
        ms_err(err, errlen, MS_ENOFIT, "the workspace for max_batch_tokens %d overflows the "
               "address space", r->max_tokens);
        goto fail;
    }
    // Expert-parallel receive buffers are sized for the worst routing but
    // touched only as far as a step uses them: the pages stay virtual.
    r->ws_bytes = c.off;
    r->ws = mmap(NULL, r->ws_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
    if (r->ws == MAP_FAILED) {
        r->ws = NULL;
        ms_err(err, errlen, MS_ENOMEM, "cannot map a %.1f MiB workspace for rank %d",
               (double)r->ws_bytes / (1 << 20), o->rank);
        rc = MS_ENOMEM;
        goto fail;
    }
    c = (struct carver){.base = r->ws};
    carve_all(r, &c);
    r->ex.scratch = r->scratch;
    // Vocabulary slices of whole 16-output blocks, so that each keeps the
    // lm_head's packing (kernels.h).
    if (r->comm) {
        const long long nb = ((long long)cfg->vocab_size + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS;
        for (int p = 0; p <= r->R; p++) {
            const long long v = nb * p / r->R * CPU_PACK_OUTS;
            r->first_vocab[p] = (int)(v < cfg->vocab_size ? v : cfg->vocab_size);
        }
    }
    *out = r;
    return 0;
fail:
    rank_destroy(r);
    return rc;
}

void rank_destroy(struct rank *r)
{
    if (!r) return;
    if (r->ws) munmap(r->ws, r->ws_bytes);
    threadpool_destroy(r->pool);
    free(r->first_expert);
    free(r->inv_freq);
    free(r);
}

void rank_get_stats(const struct rank *r, struct rank_stats *out)
{
    out->steps = r->steps;
    out->tokens = r->tokens;
    out->last_step_seconds = r->last_step;
    out->last_a2a_seconds = r->a2a_time;
    out->expert_tokens = r->expert_tokens;
    memcpy(out->phase_seconds, r->phase_time, sizeof out->phase_seconds);
    out->a2a_seconds_total = r->a2a_total;
    out->forward_seconds_total = r->forward_total;
}

// ---- parallel helpers ----------------------------------------------------------

typedef void (*range_fn)(struct rank *r, int begin, int end, int tid);

struct par_ctx {
    struct rank *r;
    range_fn fn;
    int n;
    _Atomic int next;  // dynamic scheduling: the next item to take
    int chunk;
};

static void par_static(void *arg, int tid, int n_threads)
{
    struct par_ctx *c = arg;
    int b, e;
    threadpool_range(c->n, tid, n_threads, &b, &e);
    if (b < e) c->fn(c->r, b, e, tid);
}

// Splits [0, n) into equal contiguous ranges, one per thread.
static void par_for(struct rank *r, int n, range_fn fn)
{
    if (n <= 0) return;
    // One row (a decode step) is not worth waking the other threads for.
    if (n == 1) {
        fn(r, 0, 1, 0);
        return;
    }
    struct par_ctx c = {.r = r, .fn = fn, .n = n};
    threadpool_run(r->pool, par_static, &c);
}

static void par_dynamic(void *arg, int tid, int n_threads)
{
    (void)n_threads;
    struct par_ctx *c = arg;
    for (;;) {
        int b = atomic_fetch_add(&c->next, c->chunk);
        if (b >= c->n) return;
        c->fn(c->r, b, b + c->chunk < c->n ? b + c->chunk : c->n, tid);
    }
}

// Items of unequal cost (attention rows of a prefill), taken chunk by chunk.
static void par_for_dynamic(struct rank *r, int n, int chunk, range_fn fn)
{
    if (n <= 0) return;
    struct par_ctx c = {.r = r, .fn = fn, .n = n, .chunk = chunk};
    threadpool_run(r->pool, par_dynamic, &c);
}

static struct cpu_wmat wmat(const struct tensor *t)
{
    return (struct cpu_wmat){.data = t->data, .packed = t->packed, .dtype = t->dtype,
                             .out = (int)t->shape[0], .in = (int)t->shape[1]};
}

// ---- the step's pieces -----------------------------------------------------------

static int check_batch(const struct rank *r, const struct fwd_batch *b, const float *logits,
                       int *n_tok_out, int *n_logits_out, char *err, size_t errlen)
{
    const struct model_config *cfg = r->cfg;
    *n_tok_out = *n_logits_out = 0;
    if (!b) return ms_err(err, errlen, MS_EINVAL, "no batch given");
    if (b->n_seqs < 0 || b->n_seqs > r->max_seqs)
        return ms_err(err, errlen, MS_EINVAL, "a step has %d sequences; this rank was sized for "
                      "at most %d", b->n_seqs, r->max_seqs);
    if (b->n_seqs > 0 && !b->seqs) return ms_err(err, errlen, MS_EINVAL, "the batch has no sequences array");
    long long n_tok = 0, n_logits = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct fwd_seq *q = &b->seqs[s];
        if (q->n_new < 1 || !q->tokens)
            return ms_err(err, errlen, MS_EINVAL, "sequence %d of the step has %d new tokens; each "
                          "needs at least one", s, q->n_new);
        if (q->n_past < 0 || (long long)q->n_past + q->n_new > cfg->max_position_embeddings)
            return ms_err(err, errlen, MS_ETOOLONG, "sequence %d reaches position %lld, beyond "
                          "max_position_embeddings %d", s, (long long)q->n_past + q->n_new,
                          cfg->max_position_embeddings);
        if (q->n_logits < 0 || q->n_logits > q->n_new)
            return ms_err(err, errlen, MS_EINVAL, "sequence %d asks logits for %d of its %d new "
                          "tokens", s, q->n_logits, q->n_new);
        if (!q->blocks) return ms_err(err, errlen, MS_EINVAL, "sequence %d has no block table", s);
        int nb = (q->n_past + q->n_new + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
        for (int i = 0; i < nb; i++)
            if (q->blocks[i] < 0 || q->blocks[i] >= r->kv->n_blocks)
                return ms_err(err, errlen, MS_EINVAL, "sequence %d's block table entry %d is %d; "
                              "the pool has blocks 0..%d", s, i, q->blocks[i], r->kv->n_blocks - 1);
        for (int i = 0; i < q->n_new; i++)
            if (q->tokens[i] < 0 || q->tokens[i] >= cfg->vocab_size)
                return ms_err(err, errlen, MS_EINVAL, "sequence %d's token %d is %d, outside the "
                              "vocabulary of %d", s, i, q->tokens[i], cfg->vocab_size);
        n_tok += q->n_new;
        n_logits += q->n_logits;
    }
    if (n_tok > r->max_tokens)
        return ms_err(err, errlen, MS_EINVAL, "a step has %lld new tokens; this rank was sized for "
                      "at most %d (max_batch_tokens)", n_tok, r->max_tokens);
    if (n_logits > 0 && !logits) return ms_err(err, errlen, MS_EINVAL, "logits were asked for but no "
                                               "output buffer was given");
    *n_tok_out = (int)n_tok;
    *n_logits_out = (int)n_logits;
    return 0;
}

static void embed_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    const struct tensor *emb = &r->m->embed;
    const int hd = r->cfg->hidden_size;
    for (int t = b; t < e; t++) {
        float *x = r->x + (size_t)t * hd;
        size_t base = (size_t)r->tok_id[t] * hd;
        for (int i = 0; i < hd; i++) x[i] = cpu_load_weight(emb->data, emb->dtype, base + i);
    }
}

static void norm_rows(struct rank *r, int b, int e, const struct tensor *w, float *out)
{
    const int hd = r->cfg->hidden_size;
    for (int t = b; t < e; t++)
        r->ex.k->rmsnorm(r->x + (size_t)t * hd, w->data, w->dtype, hd, r->cfg->rms_norm_eps,
                         out + (size_t)t * hd);
}

static void attn_norm_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    norm_rows(r, b, e, &r->m->layers[r->layer].attn_norm, r->xn);
}

static void ffn_norm_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    norm_rows(r, b, e, &r->m->layers[r->layer].ffn_norm, r->xn);
}

// n values into the pool's dtype, element i at dst[i * stride]: a value row
// is contiguous (stride 1), a key is a column of its block (stride
// KV_BLOCK_TOKENS: keys are stored transposed, kernels.h).
static void store_kv(void *dst, enum dtype t, const float *src, int n, size_t stride)
{
    if (t == DTYPE_F32) {
        float *d = dst;
        for (int i = 0; i < n; i++) d[(size_t)i * stride] = src[i];
    } else {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++)
            d[(size_t)i * stride] = t == DTYPE_BF16 ? ms_f32_to_bf16(src[i]) : ms_f32_to_f16(src[i]);
    }
}

// Per token: q_norm / k_norm over each head, RoPE at the token's position,
// and K/V into the sequence's block for that position.
static void qk_rope_store(struct rank *r, int b, int e, int tid)
{
    const struct model_config *cfg = r->cfg;
    const struct layer_weights *L = &r->m->layers[r->layer];
    const int D = cfg->head_dim, half = D / 2, H = cfg->n_heads, KVH = cfg->n_kv_heads;
    float *cs = cpu_exec_scratch(&r->ex, tid), *sn = cs + half, *tmp = sn + half;
    const size_t esz = dtype_size(r->kv->dtype);
    char *kl = (char *)r->kv->k + (size_t)r->layer * r->kv_layer_elems * esz;
    char *vl = (char *)r->kv->v + (size_t)r->layer * r->kv_layer_elems * esz;
    for (int t = b; t < e; t++) {
        const int pos = r->tok_pos[t];
        cpu_rope_angles(pos, r->inv_freq, half, cs, sn);
        float *q = r->q + (size_t)t * H * D, *k = r->kn + (size_t)t * KVH * D;
        const float *v = r->vn + (size_t)t * KVH * D;
        for (int h = 0; h < H; h++) {
            float *qh = q + (size_t)h * D;
            r->ex.k->rmsnorm(qh, L->q_norm.data, L->q_norm.dtype, D, cfg->rms_norm_eps, tmp);
            memcpy(qh, tmp, (size_t)D * sizeof(float));
            cpu_rope_apply(qh, half, cs, sn);
        }
        const struct fwd_seq *sq = &r->batch->seqs[r->tok_seq[t]];
        const size_t blk = (size_t)sq->blocks[pos / KV_BLOCK_TOKENS], slot = (size_t)(pos % KV_BLOCK_TOKENS);
        for (int h = 0; h < KVH; h++) {
            float *kh = k + (size_t)h * D;
            r->ex.k->rmsnorm(kh, L->k_norm.data, L->k_norm.dtype, D, cfg->rms_norm_eps, tmp);
            memcpy(kh, tmp, (size_t)D * sizeof(float));
            cpu_rope_apply(kh, half, cs, sn);
            const size_t at = (blk * KVH + (size_t)h) * KV_BLOCK_TOKENS * D * esz;
            store_kv(kl + at + slot * esz, r->kv->dtype, kh, D, KV_BLOCK_TOKENS);
            store_kv(vl + at + slot * D * esz, r->kv->dtype, v + (size_t)h * D, D, 1);
        }
    }
}

// Items are (tile, KV head): up to CPU_ATTN_TILE consecutive tokens of one
// sequence with the query heads of one group share each converted K/V block.
static void attend_items(struct rank *r, int b, int e, int tid)
{
    const struct model_config *cfg = r->cfg;
    const int D = cfg->head_dim, H = cfg->n_heads, KVH = cfg->n_kv_heads, G = H / KVH;
    const size_t esz = dtype_size(r->kv->dtype);
    struct cpu_attn a = {
        .q_stride = (size_t)H * D,
        .out_stride = (size_t)H * D,
        .n_q = G,
        .head_dim = D,
        .scale = 1.0f / sqrtf((float)D),
        .k = (const char *)r->kv->k + (size_t)r->layer * r->kv_layer_elems * esz,
        .v = (const char *)r->kv->v + (size_t)r->layer * r->kv_layer_elems * esz,
        .kv_dtype = r->kv->dtype,
        .n_kv_heads = KVH,
    };
    float *scratch = cpu_exec_scratch(&r->ex, tid);
    for (int i = b; i < e; i++) {
        const int tile = i / KVH, h = i % KVH, t0 = r->tiles[2 * tile], n = r->tiles[2 * tile + 1];
        a.q = r->q + ((size_t)t0 * H + (size_t)h * G) * D;
        a.out = r->att + ((size_t)t0 * H + (size_t)h * G) * D;
        a.n_tok = n;
        a.first_pos = r->tok_pos[t0];
        a.blocks = r->batch->seqs[r->tok_seq[t0]].blocks;
        a.kv_head = h;
        r->ex.k->attend(&a, scratch);
    }
}

static void attention_block(struct rank *r, int T)
{
    const struct model_config *cfg = r->cfg;
    const struct layer_weights *L = &r->m->layers[r->layer];
    const size_t hd = (size_t)cfg->hidden_size, qd = (size_t)cfg->n_heads * cfg->head_dim;
    const size_t kvd = (size_t)cfg->n_kv_heads * cfg->head_dim;
    par_for(r, T, attn_norm_rows);
    struct cpu_mm qkv[3] = {
        {.w = wmat(&L->wq), .x = r->xn, .ldx = hd, .y = r->q, .ldy = qd, .rows = T},
        {.w = wmat(&L->wk), .x = r->xn, .ldx = hd, .y = r->kn, .ldy = kvd, .rows = T},
        {.w = wmat(&L->wv), .x = r->xn, .ldx = hd, .y = r->vn, .ldy = kvd, .rows = T},
    };
    cpu_matmul(&r->ex, qkv, 3);
    par_for(r, T, qk_rope_store);
    par_for_dynamic(r, r->n_tiles * cfg->n_kv_heads, 1, attend_items);
    struct cpu_mm o = {.w = wmat(&L->wo), .x = r->att, .ldx = qd, .y = r->x, .ldy = hd, .rows = T,
                       .accumulate = true};
    cpu_matmul(&r->ex, &o, 1);
}

static void silu_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    const size_t w = (size_t)r->mlp_width_now;
    r->ex.k->silu_mul(r->g + (size_t)b * w, r->u + (size_t)b * w, (int)((size_t)(e - b) * w));
}

static void dense_mlp(struct rank *r, int T)
{
    const struct layer_weights *L = &r->m->layers[r->layer];
    const size_t hd = (size_t)r->cfg->hidden_size, F = (size_t)r->cfg->intermediate_size;
    r->mlp_width_now = (int)F;
    struct cpu_mm gu[2] = {
        {.w = wmat(&L->gate), .x = r->xn, .ldx = hd, .y = r->g, .ldy = F, .rows = T},
        {.w = wmat(&L->up), .x = r->xn, .ldx = hd, .y = r->u, .ldy = F, .rows = T},
    };
    cpu_matmul(&r->ex, gu, 2);
    par_for(r, T, silu_rows);
    struct cpu_mm down = {.w = wmat(&L->down), .x = r->g, .ldx = F, .y = r->x, .ldy = hd, .rows = T,
                          .accumulate = true};
    cpu_matmul(&r->ex, &down, 1);
}

static void router_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    const int E = r->E, k = r->topk;
    for (int t = b; t < e; t++)
        cpu_router_topk(r->rl + (size_t)t * E, E, k, r->cfg->norm_topk_prob, r->top_id + (size_t)t * k,
                        r->top_w + (size_t)t * k);
}

static void copy_send_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    const size_t hd = (size_t)r->cfg->hidden_size;
    for (int i = b; i < e; i++)
        memcpy(r->send + (size_t)i * hd, r->xn + (size_t)r->exp_x[i] * hd, hd * sizeof(float));
}

// Each token's expert outputs, weighted, summed in top-k order, then added
// to the residual stream: the same order whatever the ranks or the batch.
static void combine_rows(struct rank *r, int b, int e, int tid)
{
    const int hd = r->cfg->hidden_size, k = r->topk;
    float *acc = cpu_exec_scratch(&r->ex, tid);
    for (int t = b; t < e; t++) {
        memset(acc, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < k; j++)
            r->ex.k->axpy(acc, r->top_w[(size_t)t * k + j],
                          r->ret + (size_t)r->pair_slot[(size_t)t * k + j] * hd, hd);
        r->ex.k->axpy(r->x + (size_t)t * hd, 1.0f, acc, hd);
    }
}

// Gate and up for every expert with rows, SwiGLU, then down into out (rows
// scattered through out_rows when non-NULL, else contiguous in expert order).
static void run_experts(struct rank *r, const float *x, const int32_t *x_rows, float *out,
                        const int32_t *out_rows, int e0, int e1, const int *off)
{
    const struct layer_weights *L = &r->m->layers[r->layer];
    const size_t hd = (size_t)r->cfg->hidden_size, F = (size_t)r->cfg->moe_intermediate_size;
    r->mlp_width_now = (int)F;
    int nj = 0;
    for (int e = e0; e < e1; e++) {
        int n = off[e - e0 + 1] - off[e - e0];
        if (n == 0) continue;
        const struct expert_weights *ew = &L->experts[e];
        const int32_t *rows = x_rows + off[e - e0];
        r->jobs[nj++] = (struct cpu_mm){.w = wmat(&ew->gate), .x = x, .ldx = hd, .x_rows = rows,
                                        .y = r->g + (size_t)off[e - e0] * F, .ldy = F, .rows = n};
        r->jobs[nj++] = (struct cpu_mm){.w = wmat(&ew->up), .x = x, .ldx = hd, .x_rows = rows,
                                        .y = r->u + (size_t)off[e - e0] * F, .ldy = F, .rows = n};
        r->expert_tokens[e] += (uint64_t)n;
    }
    cpu_matmul(&r->ex, r->jobs, nj);
    par_for(r, off[e1 - e0], silu_rows);
    nj = 0;
    for (int e = e0; e < e1; e++) {
        int n = off[e - e0 + 1] - off[e - e0];
        if (n == 0) continue;
        const struct expert_weights *ew = &L->experts[e];
        struct cpu_mm *j = &r->jobs[nj++];
        *j = (struct cpu_mm){.w = wmat(&ew->down), .x = r->g + (size_t)off[e - e0] * F, .ldx = F,
                             .y = out, .ldy = hd, .rows = n};
        if (out_rows) j->y_rows = out_rows + off[e - e0];
        else j->y = out + (size_t)off[e - e0] * hd;
    }
    cpu_matmul(&r->ex, r->jobs, nj);
}

static int comm_timed_a2a(struct rank *r, const void *send, const size_t *sb, const size_t *so,
                          void *recv, const size_t *rb, const size_t *ro)
{
    double t0 = ms_now();
    int rc = comm_all_to_all_v(r->comm, send, sb, so, recv, rb, ro);
    r->a2a_time += ms_now() - t0;
    return rc;
}

// Expert-parallel part of a MoE layer: the pairs are already sorted by
// expert (and so by owner rank) in the send layout.
static int moe_exchange(struct rank *r, char *err, size_t errlen)
{
    const int E = r->E, R = r->R, me = r->me;
    const size_t row = (size_t)r->cfg->hidden_size * sizeof(float);
    int32_t *local = r->gather_send;
    for (int e = 0; e < E; e++) local[e] = r->exp_off[e + 1] - r->exp_off[e];
    local[E] = r->max_recv;
    double t0 = ms_now();
    int rc = comm_all_gather(r->comm, local, (size_t)(E + 1) * sizeof(int32_t), r->gather);
    r->a2a_time += ms_now() - t0;
    if (rc) return ms_err(err, errlen, rc, "rank %d: exchanging the MoE token counts failed (%s)",
                          me, ms_status_name(rc));
    // Every rank sees the same counts, so every rank takes the same branch here.
    for (int q = 0; q < R; q++) {
        long long n = 0;
        for (int p = 0; p < R; p++)
            for (int e = r->first_expert[q]; e < r->first_expert[q + 1]; e++)
                n += r->gather[(size_t)p * (E + 1) + e];
        if (n > r->gather[(size_t)q * (E + 1) + E])
            return ms_err(err, errlen, MS_ENOFIT, "layer %d routes %lld token-expert pairs to rank "
                          "%d, whose workspace holds %d; give every rank the same max_batch_tokens",
                          r->layer, n, q, r->gather[(size_t)q * (E + 1) + E]);
    }
    size_t *sb = r->a2a, *so = sb + R, *rb = so + R, *ro = rb + R;
    size_t at = 0;
    for (int p = 0; p < R; p++) {
        so[p] = (size_t)r->exp_off[r->first_expert[p]] * row;
        sb[p] = (size_t)(r->exp_off[r->first_expert[p + 1]] - r->exp_off[r->first_expert[p]]) * row;
        size_t n = 0;
        for (int e = r->e_begin; e < r->e_end; e++) n += (size_t)r->gather[(size_t)p * (E + 1) + e];
        ro[p] = at;
        rb[p] = n * row;
        at += n * row;
    }
    par_for(r, r->exp_off[E], copy_send_rows);
    if ((rc = comm_timed_a2a(r, r->send, sb, so, r->recv, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: sending MoE rows to their experts failed (%s)", me,
                      ms_status_name(rc));
    // Local rows grouped by expert, then by source rank, in arrival order.
    const int nl = r->e_end - r->e_begin;
    int *off = r->exp_fill; // (nl + 1) offsets of the local experts
    off[0] = 0;
    for (int i = 0; i < nl; i++) {
        int e = r->e_begin + i, n = 0;
        for (int p = 0; p < R; p++) {
            size_t base = ro[p] / row;
            for (int e2 = r->e_begin; e2 < e; e2++) base += (size_t)r->gather[(size_t)p * (E + 1) + e2];
            int c = r->gather[(size_t)p * (E + 1) + e];
            for (int j = 0; j < c; j++) r->exp_y[off[i] + n + j] = (int32_t)(base + (size_t)j);
            n += c;
        }
        off[i + 1] = off[i] + n;
    }
    run_experts(r, r->recv, r->exp_y, r->res, r->exp_y, r->e_begin, r->e_end, off);
    if ((rc = comm_timed_a2a(r, r->res, rb, ro, r->ret, sb, so)))
        return ms_err(err, errlen, rc, "rank %d: returning MoE expert outputs failed (%s)", me,
                      ms_status_name(rc));
    return 0;
}

static int moe_block(struct rank *r, int T, char *err, size_t errlen)
{
    const struct layer_weights *L = &r->m->layers[r->layer];
    const int E = r->E, k = r->topk;
    const size_t hd = (size_t)r->cfg->hidden_size;
    struct cpu_mm router = {.w = wmat(&L->router), .x = r->xn, .ldx = hd, .y = r->rl, .ldy = (size_t)E,
                            .rows = T};
    cpu_matmul(&r->ex, &router, 1);
    par_for(r, T, router_rows);
    // Sort the (token, slot) pairs by expert, tokens ascending within one.
    memset(r->exp_off, 0, (size_t)(E + 1) * sizeof(int));
    memset(r->exp_fill, 0, (size_t)(E + 1) * sizeof(int));
    const int P = T * k;
    for (int p = 0; p < P; p++) r->exp_off[r->top_id[p] + 1]++;
    for (int e = 0; e < E; e++) r->exp_off[e + 1] += r->exp_off[e];
    for (int p = 0; p < P; p++) {
        int e = r->top_id[p], slot = r->exp_off[e] + r->exp_fill[e]++;
        r->pair_slot[p] = slot;
        r->exp_x[slot] = p / k;
    }
    int rc = 0;
    if (!r->comm) run_experts(r, r->xn, r->exp_x, r->ret, NULL, 0, E, r->exp_off);
    else rc = moe_exchange(r, err, errlen);
    if (rc == 0) par_for(r, T, combine_rows);
    return rc;
}

// The lm_head under expert parallelism. Replicated, it would be read whole
// by every rank each step (N ranks sharing one memory read it N times, and a
// rank with more sequences waits longest); instead each rank computes one
// slice of the vocabulary for every rank's rows: the rows are gathered, the
// slices computed, and each rank's slices sent back to it. A logit is the
// same function of its x row and weight row whichever rank computes it, so
// results do not depend on the number of ranks. Every rank joins both
// exchanges, with or without rows (all of them skip when no rank has any).
static int vocab_parallel_head(struct rank *r, int n_logits, float *logits, char *err, size_t errlen)
{
    const int R = r->R, me = r->me;
    const size_t hd = (size_t)r->cfg->hidden_size, V = (size_t)r->cfg->vocab_size;
    int32_t mine = n_logits;
    double t0 = ms_now();
    int rc = comm_all_gather(r->comm, &mine, sizeof mine, r->head_counts);
    r->a2a_time += ms_now() - t0;
    if (rc) return ms_err(err, errlen, rc, "rank %d: exchanging the logit row counts failed (%s)",
                          me, ms_status_name(rc));
    size_t total = 0;
    for (int p = 0; p < R; p++) {
        if (r->head_counts[p] < 0 || r->head_counts[p] > r->max_tokens)
            return ms_err(err, errlen, MS_ENOFIT, "rank %d wants logits for %d rows; a rank's "
                          "workspace holds %d", p, (int)r->head_counts[p], r->max_tokens);
        total += (size_t)r->head_counts[p];
    }
    if (total == 0) return 0;
    size_t *sb = r->a2a, *so = sb + R, *rb = so + R, *ro = rb + R;
    // 1. Every rank's rows to every rank.
    size_t at = 0;
    for (int p = 0; p < R; p++) {
        sb[p] = (size_t)n_logits * hd * sizeof(float);
        so[p] = 0;
        rb[p] = (size_t)r->head_counts[p] * hd * sizeof(float);
        ro[p] = at;
        at += rb[p];
    }
    if ((rc = comm_timed_a2a(r, r->xl, sb, so, r->xg, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: gathering the rows for the lm_head failed (%s)", me,
                      ms_status_name(rc));
    // 2. This rank's slice of the vocabulary for all of them.
    const int v0 = r->first_vocab[me], v1 = r->first_vocab[me + 1];
    const size_t slice = (size_t)(v1 - v0);
    if (slice > 0) {
        const struct cpu_wmat whole = wmat(&r->m->lm_head);
        const struct cpu_wmat w = cpu_wmat_slice(&whole, v0, (int)slice);
        struct cpu_mm head = {.w = w, .x = r->xg, .ldx = hd, .y = r->slab, .ldy = slice,
                              .rows = (int)total};
        cpu_matmul(&r->ex, &head, 1);
    }
    // 3. Each rank's rows of the slice back to it; this rank's from every
    // slice. Its own rows of its own slice stay where they are (a copy of
    // n_logits x slice floats saved: megabytes per step for a big vocabulary).
    size_t row0 = 0, own = 0;
    at = 0;
    for (int p = 0; p < R; p++) {
        if (p == me) own = row0;
        sb[p] = p == me ? 0 : (size_t)r->head_counts[p] * slice * sizeof(float);
        so[p] = row0 * slice * sizeof(float);
        row0 += (size_t)r->head_counts[p];
        const size_t ps = (size_t)(r->first_vocab[p + 1] - r->first_vocab[p]);
        rb[p] = p == me ? 0 : (size_t)n_logits * ps * sizeof(float);
        ro[p] = at;
        at += rb[p];
    }
    if ((rc = comm_timed_a2a(r, r->slab, sb, so, r->lrecv, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: returning the logit slices failed (%s)", me,
                      ms_status_name(rc));
    for (int p = 0; p < R; p++) {
        const size_t ps = (size_t)(r->first_vocab[p + 1] - r->first_vocab[p]);
        const float *src = p == me ? r->slab + own * slice : r->lrecv + ro[p] / sizeof(float);
        for (int i = 0; i < n_logits; i++)
            memcpy(logits + (size_t)i * V + (size_t)r->first_vocab[p], src + (size_t)i * ps,
                   ps * sizeof(float));
    }
    return 0;
}

static void final_norm_rows(struct rank *r, int b, int e, int tid)
{
    (void)tid;
    const struct tensor *w = &r->m->final_norm;
    const int hd = r->cfg->hidden_size;
    for (int i = b; i < e; i++)
        r->ex.k->rmsnorm(r->x + (size_t)r->logit_rows[i] * hd, w->data, w->dtype, hd,
                         r->cfg->rms_norm_eps, r->xl + (size_t)i * hd);
}

int rank_forward(struct rank *r, const struct fwd_batch *b, float *logits, char *err, size_t errlen)
{
    const double t0 = ms_now();
    r->a2a_time = 0;
    int T, n_logits;
    int rc = check_batch(r, b, logits, &T, &n_logits, err, errlen);
    if (rc) {
        // Run the step as an empty batch: peers still meet us in every exchange.
        T = n_logits = 0;
        r->n_tiles = 0;
        r->batch = NULL;
    } else {
        r->batch = b;
        int t = 0, nl = 0;
        r->n_tiles = 0;
        for (int s = 0; s < b->n_seqs; s++) {
            const struct fwd_seq *q = &b->seqs[s];
            for (int i = 0; i < q->n_new; i += CPU_ATTN_TILE) {
                r->tiles[2 * r->n_tiles] = t + i;
                r->tiles[2 * r->n_tiles + 1] = q->n_new - i < CPU_ATTN_TILE ? q->n_new - i : CPU_ATTN_TILE;
                r->n_tiles++;
            }
            for (int i = 0; i < q->n_new; i++, t++) {
                r->tok_id[t] = q->tokens[i];
                r->tok_pos[t] = q->n_past + i;
                r->tok_seq[t] = s;
                if (i >= q->n_new - q->n_logits) r->logit_rows[nl++] = t;
            }
        }
    }
    r->n_tok = T;
    par_for(r, T, embed_rows);
    int crc = 0;
    double tp = t0, tq; // the batch setup and embedding count with the first attention
    for (int l = 0; l < r->cfg->n_layers; l++) {
        r->layer = l;
        attention_block(r, T);
        par_for(r, T, ffn_norm_rows);
        tq = ms_now();
        r->phase_time[FWD_PHASE_ATTENTION] += tq - tp;
        if (r->m->layers[l].is_moe) {
            // After a failed exchange keep stepping through the layers, so
            // that the ranks stay in lockstep; report the first failure.
            int c = moe_block(r, T, crc || rc ? NULL : err, errlen);
            if (c && !crc) crc = c;
        } else {
            dense_mlp(r, T);
        }
        tp = ms_now();
        r->phase_time[FWD_PHASE_MOE] += tp - tq;
    }
    if (n_logits > 0) par_for(r, n_logits, final_norm_rows);
    if (r->comm) {
        int c = vocab_parallel_head(r, n_logits, logits, crc || rc ? NULL : err, errlen);
        if (c && !crc) crc = c;
    } else if (n_logits > 0) {
        const size_t hd = (size_t)r->cfg->hidden_size;
        struct cpu_mm head = {.w = wmat(&r->m->lm_head), .x = r->xl, .ldx = hd, .y = logits,
                              .ldy = (size_t)r->cfg->vocab_size, .rows = n_logits};
        cpu_matmul(&r->ex, &head, 1);
    }
    r->steps++;
    r->tokens += (uint64_t)T;
    const double t1 = ms_now();
    r->phase_time[FWD_PHASE_LM_HEAD] += t1 - tp;
    r->last_step = t1 - t0;
    r->forward_total += r->last_step;
    r->a2a_total += r->a2a_time;
    return rc ? rc : crc;
}
