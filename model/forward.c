// forward: one rank's batched Qwen3 / Qwen3-MoE forward pass over its paged
// KV cache (the computation of Hugging Face's modeling code, in fp32 on the
// weights as stored), with each MoE layer as dispatch -> local experts ->
// combine. This file is the choreography only — batch checks, flattening
// the batch into the step's layout, the layer loop, expert bucketing, the
// exchanges, the vocabulary-parallel head and the statistics; every byte of
// arithmetic goes through the rank's backend (model/backend.h).
#include "model/forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct rank {
    const struct model *m;
    const struct model_config *cfg;
    struct backend *b;
    struct backend_weights *w;
    struct kv_pool *kv;
    struct rank_opts o;
    struct comm *comm;          // NULL when every expert is local
    int R, me;
    int E, topk;
    int *first_expert;          // (R + 1): rank p owns [first_expert[p], first_expert[p+1])
    int e_begin, e_end;

    // Sizes the workspace was carved for.
    int max_tokens, max_seqs, max_pairs, max_recv, mlp_rows, mlp_width, max_bt;

    // The workspace in backend memory: one allocation, carved once.
    void *ws;
    size_t ws_bytes;
    int32_t *tok_id, *tok_pos, *tok_seq; // (T)
    int32_t *seq_start, *bt_start;       // (S + 1)
    int32_t *bt;                         // (max_bt) block tables, sequence by sequence
    float *x, *xn;              // (T, hidden) residual stream, normed input
    float *q, *kn, *vn;         // (T, n_heads * head_dim), (T, n_kv * head_dim) x 2
    float *att;                 // (T, n_heads * head_dim)
    float *g, *u;               // (mlp_rows, mlp_width) gate / up activations
    float *rl;                  // (T, E) router logits
    int32_t *top_id;            // (T, topk)
    float *top_w;               // (T, topk)
    int32_t *pair_slot;         // (T * topk) where pair (t, j)'s expert output lands
    int32_t *exp_x;             // (max_recv) x row of each expert-sorted row
    int32_t *exp_y;             // (max_recv) expert parallel: received row of each local expert row
    int32_t *exp_off;           // (E + 1) start of each expert's rows
    int32_t *exp_off_all;       // (n_layers, E + 1) single rank: each layer's exp_off, read once a step
    int32_t *local_off;         // (E + 1) expert parallel: offsets of the local experts' rows
    int32_t *gather;            // (R, E + 1): pairs per expert from each rank, then its capacity
    int32_t *gather_send;       // (E + 1) this rank's part of gather
    float *send, *recv, *res;   // (T*topk, hidden), (max_recv, hidden) x 2; expert parallel only
    float *ret;                 // (T * topk, hidden) expert outputs back at their tokens
    float *xl;                  // (T, hidden) normed rows that want logits
    int32_t *logit_rows;        // (T)
    // Expert parallel only: the lm_head split by vocabulary over the ranks.
    int32_t *head_counts;       // (R) rows wanting logits on each rank this step
    int32_t *head_send;         // (1)
    float *xg;                  // (R * T, hidden) every rank's xl rows, rank-major
    float *slab;                // (R * T, vocab slice) this rank's slice of every gathered row
    float *lrecv;               // (T, vocab) this rank's rows, slice by slice, rank-major

    // Host memory: the step's layout as built, and what the exchanges count.
    struct host {
        int32_t *tok_id, *tok_pos, *tok_seq, *seq_start, *bt_start, *bt, *logit_rows;
        int32_t *exp_off, *local_off, *exp_y; // (E + 1) x 2, (max_recv)
        int32_t *exp_off_all;                 // (n_layers, E + 1)
        int32_t *gather, *gather_send;        // (R, E + 1), (E + 1)
        int32_t *head_counts;                 // (R)
        size_t *a2a;                          // (4, R): send bytes, send offsets, recv bytes, recv offsets
        int *first_vocab;                     // (R + 1): rank p computes logits [first_vocab[p], first_vocab[p+1])
    } h;
    void *host_block;
    struct backend_step step;
    uint64_t *expert_tokens;    // (E) host
    uint64_t *layer_tokens;     // (n_layers) host: rows this rank's experts took in each layer

    int layer;                  // the layer being computed
    int op_rc;                  // the first failed op of this step
    char op_err[640];
    uint64_t steps, tokens;
    double last_step, a2a_time;
    double phase_time[FWD_PHASES], a2a_total, forward_total; // cumulative (rank_stats)
};

void rank_expert_range(const struct rank *r, int *begin, int *end)
{
    *begin = r->e_begin;
    *end = r->e_end;
}

// Records an op's failure (the first of the step); the step goes on so that
// expert-parallel peers still meet this rank in every exchange.
static void op(struct rank *r, int rc)
{
    if (rc && !r->op_rc) {
        r->op_rc = rc;
        snprintf(r->op_err, sizeof r->op_err, "layer %d: %s", r->layer, r->b->err);
    }
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

// The backend workspace. Expert-parallel receive buffers are sized for the
// worst routing but touched only as far as a step uses them.
static void carve_backend(struct rank *r, struct carver *c)
{
    const struct model_config *cfg = r->cfg;
    const size_t T = (size_t)r->max_tokens, S = (size_t)r->max_seqs, hd = (size_t)cfg->hidden_size;
    const size_t qd = (size_t)cfg->n_heads * cfg->head_dim, kvd = (size_t)cfg->n_kv_heads * cfg->head_dim;
    const size_t E = (size_t)r->E, P = (size_t)r->max_pairs;
    r->tok_id = carve(c, T, sizeof(int32_t));
    r->tok_pos = carve(c, T, sizeof(int32_t));
    r->tok_seq = carve(c, T, sizeof(int32_t));
    r->seq_start = carve(c, S + 1, sizeof(int32_t));
    r->bt_start = carve(c, S + 1, sizeof(int32_t));
    r->bt = carve(c, (size_t)r->max_bt, sizeof(int32_t));
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
    r->exp_off = carve(c, E + 1, sizeof(int32_t));
    r->exp_off_all = carve(c, (size_t)cfg->n_layers * (E + 1), sizeof(int32_t));
    r->local_off = carve(c, E + 1, sizeof(int32_t));
    r->gather = carve(c, (size_t)r->R * (E + 1), sizeof(int32_t));
    r->gather_send = carve(c, E + 1, sizeof(int32_t));
    if (r->comm) {
        r->send = carve(c, P * hd, sizeof(float));
        r->recv = carve(c, (size_t)r->max_recv * hd, sizeof(float));
        r->res = carve(c, (size_t)r->max_recv * hd, sizeof(float));
    }
    r->ret = carve(c, (P ? P : 1) * hd, sizeof(float));
    r->xl = carve(c, T * hd, sizeof(float));
    r->logit_rows = carve(c, T, sizeof(int32_t));
    if (r->comm) {
        const size_t R = (size_t)r->R, V = (size_t)cfg->vocab_size, slice = (V + R - 1) / R;
        r->head_counts = carve(c, R, sizeof(int32_t));
        r->head_send = carve(c, 1, sizeof(int32_t));
        r->xg = carve(c, R * T * hd, sizeof(float));
        r->slab = carve(c, R * T * slice, sizeof(float));
        r->lrecv = carve(c, T * V, sizeof(float));
    }
}

static void carve_host(struct rank *r, struct carver *c)
{
    const size_t T = (size_t)r->max_tokens, S = (size_t)r->max_seqs, E = (size_t)r->E;
    const size_t R = (size_t)r->R;
    r->h.tok_id = carve(c, T, sizeof(int32_t));
    r->h.tok_pos = carve(c, T, sizeof(int32_t));
    r->h.tok_seq = carve(c, T, sizeof(int32_t));
    r->h.seq_start = carve(c, S + 1, sizeof(int32_t));
    r->h.bt_start = carve(c, S + 1, sizeof(int32_t));
    r->h.bt = carve(c, (size_t)r->max_bt, sizeof(int32_t));
    r->h.logit_rows = carve(c, T, sizeof(int32_t));
    r->h.exp_off = carve(c, E + 1, sizeof(int32_t));
    r->h.exp_off_all = carve(c, (size_t)r->cfg->n_layers * (E + 1), sizeof(int32_t));
    r->h.local_off = carve(c, E + 1, sizeof(int32_t));
    r->h.exp_y = carve(c, (size_t)r->max_recv + 1, sizeof(int32_t));
    r->h.gather = carve(c, R * (E + 1), sizeof(int32_t));
    r->h.gather_send = carve(c, E + 1, sizeof(int32_t));
    r->h.head_counts = carve(c, R, sizeof(int32_t));
    r->h.a2a = carve(c, 4 * R, sizeof(size_t));
    r->h.first_vocab = carve(c, R + 1, sizeof(int));
    r->expert_tokens = carve(c, E ? E : 1, sizeof(uint64_t));
    r->layer_tokens = carve(c, (size_t)r->cfg->n_layers, sizeof(uint64_t));
}

static int max_int(int a, int b) { return a > b ? a : b; }

static int check_opts(const struct model *m, struct backend *b, const struct kv_pool *kv,
                      const struct rank_opts *o, char *err, size_t errlen)
{
    const struct model_config *cfg = &m->cfg;
    if (!b) return ms_err(err, errlen, MS_EINVAL, "a rank needs a backend; none was given");
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
        kv->head_dim != cfg->head_dim)
        return ms_err(err, errlen, MS_EINVAL, "the KV pool does not match the model (layers, KV "
                      "heads or head_dim differ)");
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "num_attention_heads (%d) is not a multiple "
                      "of num_key_value_heads (%d)", cfg->n_heads, cfg->n_kv_heads);
    return 0;
}

int rank_create(const struct model *m, struct backend *b, struct kv_pool *kv,
                const struct rank_opts *o, struct rank **out, char *err, size_t errlen)
{
    *out = NULL;
    const struct model_config *cfg = &m->cfg;
    int rc = check_opts(m, b, kv, o, err, errlen);
    if (rc) return rc;
    struct rank *r = calloc(1, sizeof *r);
    if (!r) return ms_err(err, errlen, MS_ENOMEM, "out of memory creating rank %d", o->rank);
    r->m = m;
    r->cfg = cfg;
    r->b = b;
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
    rc = MS_ENOMEM;
    if (!r->first_expert) {
        ms_err(err, errlen, MS_ENOMEM, "out of memory creating rank %d", o->rank);
        goto fail;
    }
    for (int p = 0; p <= r->R; p++) r->first_expert[p] = (int)((long long)r->E * p / r->R);
    r->e_begin = r->first_expert[r->me];
    r->e_end = r->first_expert[r->me + 1];
    if ((rc = b->ops->prepare_weights(b, m, r->e_begin, r->e_end, &r->w))) {
        ms_err(err, errlen, rc, "rank %d: %s", o->rank, b->err);
        goto fail;
    }

    rc = MS_ENOFIT;
    r->max_tokens = o->max_batch_tokens;
    r->max_seqs = o->max_batch_seqs;
    long long pairs = (long long)r->max_tokens * r->topk, recv = pairs * (r->comm ? r->R : 1);
    // Every sequence of a step may hold a whole context's block table.
    long long bt = (long long)r->max_seqs *
                   ((cfg->max_position_embeddings + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (recv > INT32_MAX / 2 || bt > INT32_MAX / 2) {
        ms_err(err, errlen, MS_ENOFIT, "max_batch_tokens %d x top-k %d x %d ranks (or %d sequences "
               "of %d positions) is too large for one step", r->max_tokens, r->topk, r->R,
               r->max_seqs, cfg->max_position_embeddings);
        goto fail;
    }
    r->max_pairs = (int)pairs;
    r->max_recv = (int)recv;
    r->max_bt = (int)bt;
    r->mlp_rows = max_int(any_dense ? r->max_tokens : 0, any_moe ? r->max_recv : 0);
    r->mlp_width = max_int(any_dense ? cfg->intermediate_size : 0,
                           any_moe ? cfg->moe_intermediate_size : 0);
    struct carver c = {0}, hc = {0};
    carve_backend(r, &c);
    carve_host(r, &hc);
    if (c.overflow || hc.overflow) {
        ms_err(err, errlen, MS_ENOFIT, "the workspace for max_batch_tokens %d overflows the "
               "address space", r->max_tokens);
        goto fail;
    }
    r->ws_bytes = c.off;
    if ((rc = b->ops->alloc(b, r->ws_bytes, &r->ws))) {
        ms_err(err, errlen, rc, "rank %d's workspace of %.1f MiB: %s", o->rank,
               (double)r->ws_bytes / (1 << 20), b->err);
        goto fail;
    }
    r->host_block = aligned_alloc(64, (hc.off + 63) / 64 * 64);
    if (!r->host_block) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for rank %d's step tables", o->rank);
        goto fail;
    }
    memset(r->host_block, 0, hc.off);
    c = (struct carver){.base = r->ws};
    carve_backend(r, &c);
    hc = (struct carver){.base = r->host_block};
    carve_host(r, &hc);
    r->step = (struct backend_step){.tok_pos = r->tok_pos, .tok_seq = r->tok_seq,
                                    .seq_start = r->seq_start, .bt_start = r->bt_start, .bt = r->bt,
                                    .h_tok_pos = r->h.tok_pos, .h_tok_seq = r->h.tok_seq,
                                    .h_seq_start = r->h.seq_start, .h_bt_start = r->h.bt_start,
                                    .h_bt = r->h.bt};
    // Vocabulary slices of whole 16-output blocks, so that each keeps a
    // 16-row blocked weight layout intact (the CPU backend's packing).
    if (r->comm) {
        const long long nb = ((long long)cfg->vocab_size + 15) / 16;
        for (int p = 0; p <= r->R; p++) {
            const long long v = nb * p / r->R * 16;
            r->h.first_vocab[p] = (int)(v < cfg->vocab_size ? v : cfg->vocab_size);
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
    if (r->ws) r->b->ops->free(r->b, r->ws);
    if (r->w) r->b->ops->release_weights(r->b, r->w);
    free(r->host_block);
    free(r->first_expert);
    free(r);
}

void rank_get_stats(const struct rank *r, struct rank_stats *out)
{
    out->steps = r->steps;
    out->tokens = r->tokens;
    out->last_step_seconds = r->last_step;
    out->last_a2a_seconds = r->a2a_time;
    out->expert_tokens = r->expert_tokens;
    out->layer_tokens = r->layer_tokens;
    memcpy(out->phase_seconds, r->phase_time, sizeof out->phase_seconds);
    out->a2a_seconds_total = r->a2a_total;
    out->forward_seconds_total = r->forward_total;
}

// ---- the step's layout ----------------------------------------------------------

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

// Flattens a checked batch into the step's layout on the host, then hands it
// to the backend in one upload per array.
static void layout_step(struct rank *r, const struct fwd_batch *b, int T, int n_logits)
{
    int t = 0, nl = 0, nb = 0, max_ctx = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct fwd_seq *q = &b->seqs[s];
        r->h.seq_start[s] = t;
        r->h.bt_start[s] = nb;
        const int ctx = q->n_past + q->n_new, blocks = (ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
        memcpy(r->h.bt + nb, q->blocks, (size_t)blocks * sizeof *q->blocks);
        nb += blocks;
        if (ctx > max_ctx) max_ctx = ctx;
        for (int i = 0; i < q->n_new; i++, t++) {
            r->h.tok_id[t] = q->tokens[i];
            r->h.tok_pos[t] = q->n_past + i;
            r->h.tok_seq[t] = s;
            if (i >= q->n_new - q->n_logits) r->h.logit_rows[nl++] = t;
        }
    }
    r->h.seq_start[b->n_seqs] = t;
    r->h.bt_start[b->n_seqs] = nb;
    r->step.n_tokens = T;
    r->step.n_seqs = b->n_seqs;
    r->step.max_ctx = max_ctx;
    struct backend *bk = r->b;
    const size_t i4 = sizeof(int32_t), S1 = (size_t)b->n_seqs + 1;
    op(r, bk->ops->upload(bk, r->tok_id, r->h.tok_id, (size_t)T * i4));
    op(r, bk->ops->upload(bk, r->tok_pos, r->h.tok_pos, (size_t)T * i4));
    op(r, bk->ops->upload(bk, r->tok_seq, r->h.tok_seq, (size_t)T * i4));
    op(r, bk->ops->upload(bk, r->seq_start, r->h.seq_start, S1 * i4));
    op(r, bk->ops->upload(bk, r->bt_start, r->h.bt_start, S1 * i4));
    op(r, bk->ops->upload(bk, r->bt, r->h.bt, (size_t)nb * i4));
    op(r, bk->ops->upload(bk, r->logit_rows, r->h.logit_rows, (size_t)n_logits * i4));
}

// ---- the layers -----------------------------------------------------------------

static void attention_block(struct rank *r, int T)
{
    const struct model_config *cfg = r->cfg;
    const struct backend_layer *L = &r->w->layers[r->layer];
    struct backend *b = r->b;
    const size_t hd = (size_t)cfg->hidden_size, qd = (size_t)cfg->n_heads * cfg->head_dim;
    const size_t kvd = (size_t)cfg->n_kv_heads * cfg->head_dim;
    op(r, b->ops->rmsnorm(b, r->x, hd, NULL, T, &L->attn_norm, cfg->rms_norm_eps, r->xn));
    const struct backend_mm qkv[3] = {
        {.w = &L->wq, .x = r->xn, .ldx = hd, .y = r->q, .ldy = qd, .rows = T},
        {.w = &L->wk, .x = r->xn, .ldx = hd, .y = r->kn, .ldy = kvd, .rows = T},
        {.w = &L->wv, .x = r->xn, .ldx = hd, .y = r->vn, .ldy = kvd, .rows = T},
    };
    op(r, b->ops->matmul(b, qkv, 3));
    op(r, b->ops->qk_norm_rope_store(b, r->w, r->layer, &r->step, r->kv, r->q, r->kn, r->vn));
    op(r, b->ops->attention(b, r->w, r->layer, &r->step, r->kv, r->q, r->att));
    const struct backend_mm o = {.w = &L->wo, .x = r->att, .ldx = qd, .y = r->x, .ldy = hd,
                                 .rows = T, .accumulate = true};
    op(r, b->ops->matmul(b, &o, 1));
    op(r, b->ops->rmsnorm(b, r->x, hd, NULL, T, &L->ffn_norm, cfg->rms_norm_eps, r->xn));
}

static void dense_mlp(struct rank *r, int T)
{
    const struct backend_layer *L = &r->w->layers[r->layer];
    struct backend *b = r->b;
    const size_t hd = (size_t)r->cfg->hidden_size, F = (size_t)r->cfg->intermediate_size;
    const struct backend_mm gu[2] = {
        {.w = &L->gate, .x = r->xn, .ldx = hd, .y = r->g, .ldy = F, .rows = T},
        {.w = &L->up, .x = r->xn, .ldx = hd, .y = r->u, .ldy = F, .rows = T},
    };
    op(r, b->ops->matmul(b, gu, 2));
    op(r, b->ops->silu_mul(b, r->g, r->u, (size_t)T * F));
    const struct backend_mm down = {.w = &L->down, .x = r->g, .ldx = F, .y = r->x, .ldy = hd,
                                    .rows = T, .accumulate = true};
    op(r, b->ops->matmul(b, &down, 1));
}

// Gate and up of experts [e0, e1) (group i's rows at off[i]..off[i+1]),
// SwiGLU, then down into out (scattered through out_rows when non-NULL,
// else contiguous in expert order). h_off is off on the host, or NULL when
// the host has not read it (a single rank: the rows are then all T x top-k
// pairs, and the statistics are counted at the step's end).
static void run_experts(struct rank *r, const float *x, const int32_t *x_rows, float *out,
                        const int32_t *out_rows, int e0, int e1, const int32_t *off,
                        const int32_t *h_off, int rows)
{
    const struct backend_layer *L = &r->w->layers[r->layer];
    struct backend *b = r->b;
    const size_t hd = (size_t)r->cfg->hidden_size, F = (size_t)r->cfg->moe_intermediate_size;
    const int n = e1 - e0;
    if (h_off) {
        for (int e = e0; e < e1; e++) r->expert_tokens[e] += (uint64_t)(h_off[e - e0 + 1] - h_off[e - e0]);
        r->layer_tokens[r->layer] += (uint64_t)(h_off[n] - h_off[0]);
    }
    if (rows == 0) return;
    const struct backend_gmm gu[2] = {
        {.w = L->expert_gate + e0, .n_groups = n, .off = off, .h_off = h_off, .max_rows = rows,
         .x = x, .ldx = hd, .x_rows = x_rows, .y = r->g, .ldy = F},
        {.w = L->expert_up + e0, .n_groups = n, .off = off, .h_off = h_off, .max_rows = rows,
         .x = x, .ldx = hd, .x_rows = x_rows, .y = r->u, .ldy = F},
    };
    op(r, b->ops->grouped_matmul(b, gu, 2));
    op(r, b->ops->silu_mul(b, r->g, r->u, (size_t)rows * F));
    const struct backend_gmm down = {.w = L->expert_down + e0, .n_groups = n, .off = off,
                                     .h_off = h_off, .max_rows = rows, .x = r->g, .ldx = F,
                                     .y = out, .ldy = hd, .y_rows = out_rows};
    op(r, b->ops->grouped_matmul(b, &down, 1));
}

static int comm_timed_a2a(struct rank *r, const void *send, const size_t *sb, const size_t *so,
                          void *recv, const size_t *rb, const size_t *ro)
{
    double t0 = ms_now();
    int rc = comm_all_to_all_v(r->comm, send, sb, so, recv, rb, ro);
    r->a2a_time += ms_now() - t0;
    return rc;
}

static int comm_timed_gather(struct rank *r, const void *send, size_t bytes, void *recv)
{
    double t0 = ms_now();
    int rc = comm_all_gather(r->comm, send, bytes, recv);
    r->a2a_time += ms_now() - t0;
    return rc;
}

// Expert-parallel part of a MoE layer: the pairs are already sorted by
// expert (and so by owner rank) in the send layout. Counts travel first, so
// that every rank knows what it sends and receives; the rows go to their
// experts' ranks, the local experts run, and the outputs come back.
static int moe_exchange(struct rank *r, char *err, size_t errlen)
{
    const int E = r->E, R = r->R, me = r->me;
    struct backend *b = r->b;
    const size_t row = (size_t)r->cfg->hidden_size * sizeof(float), i4 = sizeof(int32_t);
    int32_t *local = r->h.gather_send;
    for (int e = 0; e < E; e++) local[e] = r->h.exp_off[e + 1] - r->h.exp_off[e];
    local[E] = r->max_recv;
    op(r, b->ops->upload(b, r->gather_send, local, (size_t)(E + 1) * i4));
    int rc = comm_timed_gather(r, r->gather_send, (size_t)(E + 1) * i4, r->gather);
    if (rc) return ms_err(err, errlen, rc, "rank %d: exchanging the MoE token counts failed (%s)",
                          me, ms_status_name(rc));
    op(r, b->ops->download(b, r->h.gather, r->gather, (size_t)R * (E + 1) * i4));
    const int32_t *gather = r->h.gather;
    // Every rank sees the same counts, so every rank takes the same branch here.
    for (int q = 0; q < R; q++) {
        long long n = 0;
        for (int p = 0; p < R; p++)
            for (int e = r->first_expert[q]; e < r->first_expert[q + 1]; e++)
                n += gather[(size_t)p * (E + 1) + e];
        if (n > gather[(size_t)q * (E + 1) + E])
            return ms_err(err, errlen, MS_ENOFIT, "layer %d routes %lld token-expert pairs to rank "
                          "%d, whose workspace holds %d; give every rank the same max_batch_tokens",
                          r->layer, n, q, gather[(size_t)q * (E + 1) + E]);
    }
    size_t *sb = r->h.a2a, *so = sb + R, *rb = so + R, *ro = rb + R;
    size_t at = 0;
    for (int p = 0; p < R; p++) {
        so[p] = (size_t)r->h.exp_off[r->first_expert[p]] * row;
        sb[p] = (size_t)(r->h.exp_off[r->first_expert[p + 1]] - r->h.exp_off[r->first_expert[p]]) * row;
        size_t n = 0;
        for (int e = r->e_begin; e < r->e_end; e++) n += (size_t)gather[(size_t)p * (E + 1) + e];
        ro[p] = at;
        rb[p] = n * row;
        at += n * row;
    }
    op(r, b->ops->gather_rows(b, r->xn, (size_t)r->cfg->hidden_size, r->exp_x, r->h.exp_off[E],
                              r->cfg->hidden_size, r->send));
    if ((rc = comm_timed_a2a(r, r->send, sb, so, r->recv, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: sending MoE rows to their experts failed (%s)", me,
                      ms_status_name(rc));
    // Local rows grouped by expert, then by source rank, in arrival order.
    const int nl = r->e_end - r->e_begin;
    int32_t *off = r->h.local_off; // (nl + 1) offsets of the local experts
    off[0] = 0;
    for (int i = 0; i < nl; i++) {
        int e = r->e_begin + i, n = 0;
        for (int p = 0; p < R; p++) {
            size_t base = ro[p] / row;
            for (int e2 = r->e_begin; e2 < e; e2++) base += (size_t)gather[(size_t)p * (E + 1) + e2];
            int c = gather[(size_t)p * (E + 1) + e];
            for (int j = 0; j < c; j++) r->h.exp_y[off[i] + n + j] = (int32_t)(base + (size_t)j);
            n += c;
        }
        off[i + 1] = off[i] + n;
    }
    op(r, b->ops->upload(b, r->local_off, off, (size_t)(nl + 1) * i4));
    op(r, b->ops->upload(b, r->exp_y, r->h.exp_y, (size_t)off[nl] * i4));
    run_experts(r, r->recv, r->exp_y, r->res, r->exp_y, r->e_begin, r->e_end, r->local_off, off,
                off[nl]);
    if ((rc = comm_timed_a2a(r, r->res, rb, ro, r->ret, sb, so)))
        return ms_err(err, errlen, rc, "rank %d: returning MoE expert outputs failed (%s)", me,
                      ms_status_name(rc));
    return 0;
}

static int moe_block(struct rank *r, int T, char *err, size_t errlen)
{
    const struct backend_layer *L = &r->w->layers[r->layer];
    struct backend *b = r->b;
    const int E = r->E, k = r->topk;
    const size_t hd = (size_t)r->cfg->hidden_size;
    const struct backend_mm router = {.w = &L->router, .x = r->xn, .ldx = hd, .y = r->rl,
                                      .ldy = (size_t)E, .rows = T};
    op(r, b->ops->matmul(b, &router, 1));
    op(r, b->ops->router_topk(b, r->rl, T, E, k, r->cfg->norm_topk_prob, r->top_id, r->top_w));
    // Sort the (token, slot) pairs by expert, tokens ascending within one.
    // The exchanges need the counts on the host now; a single rank does not
    // (its experts read their rows from the device's offsets), so it keeps
    // them for the statistics and reads every layer's at the step's end —
    // no host round trip inside the step.
    op(r, b->ops->moe_route(b, r->top_id, T, k, E, r->exp_off, r->pair_slot, r->exp_x));
    const size_t offb = (size_t)(E + 1) * sizeof(int32_t);
    int rc = 0;
    if (!r->comm) {
        op(r, b->ops->copy_2d(b, r->exp_off_all + (size_t)r->layer * (E + 1), offb, r->exp_off, offb,
                              offb, 1));
        run_experts(r, r->xn, r->exp_x, r->ret, NULL, 0, E, r->exp_off, NULL, T * k);
    } else {
        op(r, b->ops->download(b, r->h.exp_off, r->exp_off, offb));
        rc = moe_exchange(r, err, errlen);
    }
    if (rc == 0) op(r, b->ops->moe_combine(b, r->x, r->ret, r->pair_slot, r->top_w, T, k, (int)hd));
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
    struct backend *b = r->b;
    const size_t hd = (size_t)r->cfg->hidden_size, V = (size_t)r->cfg->vocab_size;
    int32_t mine = n_logits;
    op(r, b->ops->upload(b, r->head_send, &mine, sizeof mine));
    int rc = comm_timed_gather(r, r->head_send, sizeof mine, r->head_counts);
    if (rc) return ms_err(err, errlen, rc, "rank %d: exchanging the logit row counts failed (%s)",
                          me, ms_status_name(rc));
    op(r, b->ops->download(b, r->h.head_counts, r->head_counts, (size_t)R * sizeof(int32_t)));
    const int32_t *counts = r->h.head_counts;
    size_t total = 0;
    for (int p = 0; p < R; p++) {
        if (counts[p] < 0 || counts[p] > r->max_tokens)
            return ms_err(err, errlen, MS_ENOFIT, "rank %d wants logits for %d rows; a rank's "
                          "workspace holds %d", p, (int)counts[p], r->max_tokens);
        total += (size_t)counts[p];
    }
    if (total == 0) return 0;
    size_t *sb = r->h.a2a, *so = sb + R, *rb = so + R, *ro = rb + R;
    // 1. Every rank's rows to every rank.
    size_t at = 0;
    for (int p = 0; p < R; p++) {
        sb[p] = (size_t)n_logits * hd * sizeof(float);
        so[p] = 0;
        rb[p] = (size_t)counts[p] * hd * sizeof(float);
        ro[p] = at;
        at += rb[p];
    }
    if ((rc = comm_timed_a2a(r, r->xl, sb, so, r->xg, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: gathering the rows for the lm_head failed (%s)", me,
                      ms_status_name(rc));
    // 2. This rank's slice of the vocabulary for all of them.
    const int v0 = r->h.first_vocab[me], v1 = r->h.first_vocab[me + 1];
    const size_t slice = (size_t)(v1 - v0);
    if (slice > 0) op(r, b->ops->lm_head(b, r->w, v0, (int)slice, r->xg, (int)total, r->slab, slice));
    // 3. Each rank's rows of the slice back to it; this rank's from every
    // slice. Its own rows of its own slice stay where they are (a copy of
    // n_logits x slice floats saved: megabytes per step for a big vocabulary).
    size_t row0 = 0, own = 0;
    at = 0;
    for (int p = 0; p < R; p++) {
        if (p == me) own = row0;
        sb[p] = p == me ? 0 : (size_t)counts[p] * slice * sizeof(float);
        so[p] = row0 * slice * sizeof(float);
        row0 += (size_t)counts[p];
        const size_t ps = (size_t)(r->h.first_vocab[p + 1] - r->h.first_vocab[p]);
        rb[p] = p == me ? 0 : (size_t)n_logits * ps * sizeof(float);
        ro[p] = at;
        at += rb[p];
    }
    if ((rc = comm_timed_a2a(r, r->slab, sb, so, r->lrecv, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: returning the logit slices failed (%s)", me,
                      ms_status_name(rc));
    // Each slice's rows into their columns of the logits.
    for (int p = 0; p < R && n_logits > 0; p++) {
        const size_t ps = (size_t)(r->h.first_vocab[p + 1] - r->h.first_vocab[p]);
        const float *src = p == me ? r->slab + own * slice : r->lrecv + ro[p] / sizeof(float);
        if (ps > 0)
            op(r, b->ops->copy_2d(b, logits + (size_t)r->h.first_vocab[p], V * sizeof(float), src,
                                  ps * sizeof(float), ps * sizeof(float), n_logits));
    }
    return 0;
}

int rank_forward(struct rank *r, const struct fwd_batch *b, float *logits, char *err, size_t errlen)
{
    const double t0 = ms_now();
    r->a2a_time = 0;
    r->op_rc = 0;
    r->layer = 0;
    int T, n_logits;
    int rc = check_batch(r, b, logits, &T, &n_logits, err, errlen);
    if (rc) {
        // Run the step as an empty batch: peers still meet us in every exchange.
        static const struct fwd_batch empty = {0};
        T = n_logits = 0;
        layout_step(r, &empty, 0, 0);
    } else {
        layout_step(r, b, T, n_logits);
    }
    struct backend *bk = r->b;
    const struct model_config *cfg = r->cfg;
    if (T > 0) op(r, bk->ops->embed(bk, r->w, r->tok_id, T, r->x));
    int crc = 0;
    double tp = t0, tq; // the batch setup and embedding count with the first attention
    for (int l = 0; l < cfg->n_layers; l++) {
        r->layer = l;
        if (T > 0) attention_block(r, T);
        tq = ms_now();
        r->phase_time[FWD_PHASE_ATTENTION] += tq - tp;
        if (r->m->layers[l].is_moe) {
            // After a failed exchange keep stepping through the layers, so
            // that the ranks stay in lockstep; report the first failure.
            int c = moe_block(r, T, crc || rc ? NULL : err, errlen);
            if (c && !crc) crc = c;
        } else if (T > 0) {
            dense_mlp(r, T);
        }
        tp = ms_now();
        r->phase_time[FWD_PHASE_MOE] += tp - tq;
    }
    const size_t hd = (size_t)cfg->hidden_size;
    if (n_logits > 0)
        op(r, bk->ops->rmsnorm(bk, r->x, hd, r->logit_rows, n_logits, &r->w->final_norm,
                               cfg->rms_norm_eps, r->xl));
    if (r->comm) {
        int c = vocab_parallel_head(r, n_logits, logits, crc || rc ? NULL : err, errlen);
        if (c && !crc) crc = c;
    } else if (n_logits > 0) {
        op(r, bk->ops->lm_head(bk, r->w, 0, cfg->vocab_size, r->xl, n_logits, logits,
                               (size_t)cfg->vocab_size));
    }
    if (!r->comm && r->E > 0 && T > 0) {
        // A single rank's expert statistics: every MoE layer's offsets in one read.
        const size_t E1 = (size_t)r->E + 1;
        op(r, bk->ops->download(bk, r->h.exp_off_all, r->exp_off_all,
                                (size_t)cfg->n_layers * E1 * sizeof(int32_t)));
        for (int l = 0; l < cfg->n_layers; l++) {
            if (!r->m->layers[l].is_moe) continue;
            const int32_t *off = r->h.exp_off_all + (size_t)l * E1;
            for (int e = 0; e < r->E; e++) r->expert_tokens[e] += (uint64_t)(off[e + 1] - off[e]);
            r->layer_tokens[l] += (uint64_t)(off[r->E] - off[0]);
        }
    }
    r->steps++;
    r->tokens += (uint64_t)T;
    const double t1 = ms_now();
    r->phase_time[FWD_PHASE_LM_HEAD] += t1 - tp;
    r->last_step = t1 - t0;
    r->forward_total += r->last_step;
    r->a2a_total += r->a2a_time;
    if (rc) return rc;
    if (crc) return crc;
    if (r->op_rc) return ms_err(err, errlen, r->op_rc, "%s", r->op_err);
    return 0;
}
