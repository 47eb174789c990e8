// forward: one rank's batched Qwen3 / Qwen3-MoE forward pass over its paged
// KV cache (the computation of Hugging Face's modeling code, in fp32 on the
// weights as stored), with each MoE layer as dispatch -> local experts ->
// combine. This file is the choreography only — batch checks, the step's
// header exchange, flattening the batch into the step's layout (padded to a
// bucket for decode steps), the layer loop, expert routing, the exchanges
// (sized by counts, or fixed for padded decode steps), the vocabulary-
// parallel head, recording and replaying graphs, and the statistics; every
// byte of arithmetic goes through the rank's backend (model/backend.h).
#include "model/forward.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/fwd_plan.h"

// The step's header: what each rank brings, exchanged once at its start.
enum { HDR_SEQS, HDR_TOKENS, HDR_LOGITS, HDR_DECODE, HDR_CAP, HDR_INTS };

// The most rows moe_route pads an expert to (route_pad's answers are capped here).
#define ROUTE_MAX_PAD 64

// One decode bucket's recorded graph.
struct fwd_graph {
    int bucket;
    int eager_runs;             // its steps run eagerly (the first one warms the backend up)
    bool eager_only;            // recording it failed: it runs eagerly from now on
    struct backend_graph *g;
    float *logits;              // the logits buffer the graph writes
};

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
    int32_t *first_expert;      // (R + 1): rank p owns [first_expert[p], first_expert[p+1])
    int e_begin, e_end;

    // Sizes the workspace was carved for.
    int max_tokens, max_seqs, max_pairs, max_recv, mlp_rows, mlp_width, max_bt;
    int max_len;                         // positions a sequence may reach (rank_opts.max_seq_len)
    int all_tokens, all_pairs;  // rows and pairs a padded expert-parallel step routes: every rank's
    int route_rows;             // rows moe_route's index lists hold
    int bucket_cap;             // the largest decode bucket (0: decode steps are not padded)

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
    float *rl;                  // (all_tokens, E) router logits
    int32_t *top_id;            // (all_tokens, topk)
    float *top_w;               // (all_tokens, topk)
    int32_t *pair_slot;         // (all_pairs) where pair (t, j)'s expert output lands
    int32_t *exp_x;             // (route_rows) x row (token) of each expert-sorted row, -1: padding
    int32_t *exp_pair;          // (route_rows) pair of each expert-sorted row, -1: padding
    int32_t *exp_y;             // (max_recv) expert parallel: received row of each local expert row
    int32_t *exp_off;           // (E + 1) start of each expert's rows
    int32_t *cnt_all;           // (n_layers, E) pairs per expert and layer, when routed on the
                                // device without the host (read once at the step's end)
    int32_t *local_off;         // (E + 1) expert parallel: offsets of the local experts' rows
    int32_t *gather;            // (R, E + 1): pairs per expert from each rank, then its capacity
    int32_t *gather_send;       // (E + 1) this rank's part of gather
    float *send, *recv, *res;   // (T*topk, hidden), (max_recv, hidden) x 2; expert parallel only
    float *ret;                 // (T * topk, hidden) expert outputs back at their tokens
    float *xl;                  // (T, hidden) normed rows that want logits
    int32_t *logit_rows;        // (T)
    int32_t *live;              // (all_tokens) padded steps: 1 for a real token, 0 for padding
    int32_t *home;              // (T * topk) padded expert parallel: where each pair comes back
    int32_t *hdr_send, *hdr;    // (HDR_INTS), (R, HDR_INTS) the step's header
    // Expert parallel only: the lm_head split by vocabulary over the ranks.
    float *xg;                  // (R * T, hidden) every rank's xl rows, rank-major (and every
                                // rank's xn rows in a padded step's MoE layers)
    float *slab;                // (R * T, vocab slice) this rank's slice of every gathered row
    float *lrecv;               // (T, vocab) this rank's rows, slice by slice, rank-major

    // Host memory: the step's layout as built, and what the exchanges count.
    struct host {
        int32_t *tok_id, *tok_pos, *tok_seq, *seq_start, *bt_start, *bt, *logit_rows;
        int32_t *exp_off, *local_off, *exp_y; // (E + 1) x 2, (max_recv)
        int32_t *cnt_all;                     // (n_layers, E)
        int32_t *gather, *gather_send;        // (R, E + 1), (E + 1)
        int32_t *hdr;                         // (R, HDR_INTS)
        int32_t *live;                        // (all_tokens)
        int32_t *counts;                      // (R) logits rows of each rank this step
        size_t *a2a;                          // (4, R): send bytes, send offsets, recv bytes, recv offsets
        int *first_vocab;                     // (R + 1): rank p computes logits [first_vocab[p], first_vocab[p+1])
    } h;
    void *host_block;
    struct backend_step step;
    uint64_t *expert_tokens;    // (E) host
    uint64_t *layer_tokens;     // (n_layers) host: rows this rank's experts took in each layer

    struct fwd_graph *graphs;   // (n_graphs) one per decode bucket
    int n_graphs;

    int layer;                  // the layer being computed
    bool counted_on_device;     // this step's expert counts are in cnt_all
    int op_rc;                  // the first failed op of this step
    char op_err[640];
    uint64_t steps, tokens, padded_steps, graph_steps;
    double last_step, a2a_time, tp; // tp: when the current phase began
    double phase_time[FWD_PHASES], a2a_total, forward_total; // cumulative (rank_stats)
    uint64_t decode_steps;
    double decode_phase_time[FWD_PHASES]; // of phase_time, the decode steps' share
    bool last_decode;                     // the last step was a decode step
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
    const size_t AP = (size_t)r->all_pairs, AT = (size_t)r->all_tokens;
    r->rl = carve(c, AT * (E ? E : 1), sizeof(float));
    r->top_id = carve(c, AP ? AP : 1, sizeof(int32_t));
    r->top_w = carve(c, AP ? AP : 1, sizeof(float));
    r->pair_slot = carve(c, AP ? AP : 1, sizeof(int32_t));
    r->exp_x = carve(c, (size_t)r->route_rows + 1, sizeof(int32_t));
    r->exp_pair = carve(c, (size_t)r->route_rows + 1, sizeof(int32_t));
    r->exp_y = carve(c, (size_t)r->max_recv + 1, sizeof(int32_t));
    r->exp_off = carve(c, E + 1, sizeof(int32_t));
    r->cnt_all = carve(c, (size_t)cfg->n_layers * (E ? E : 1), sizeof(int32_t));
    r->local_off = carve(c, E + 1, sizeof(int32_t));
    r->live = carve(c, AT ? AT : 1, sizeof(int32_t));
    r->home = carve(c, P ? P : 1, sizeof(int32_t));
    r->hdr_send = carve(c, HDR_INTS, sizeof(int32_t));
    r->hdr = carve(c, (size_t)r->R * HDR_INTS, sizeof(int32_t));
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
    r->h.cnt_all = carve(c, (size_t)r->cfg->n_layers * (E ? E : 1), sizeof(int32_t));
    r->h.local_off = carve(c, E + 1, sizeof(int32_t));
    r->h.exp_y = carve(c, (size_t)r->max_recv + 1, sizeof(int32_t));
    r->h.gather = carve(c, R * (E + 1), sizeof(int32_t));
    r->h.gather_send = carve(c, E + 1, sizeof(int32_t));
    r->h.hdr = carve(c, R * HDR_INTS, sizeof(int32_t));
    r->h.live = carve(c, (size_t)r->all_tokens, sizeof(int32_t));
    r->h.counts = carve(c, R, sizeof(int32_t));
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
    if (o->decode < FWD_DECODE_EAGER || o->decode > FWD_DECODE_GRAPHS || o->max_logit_rows < 0)
        return ms_err(err, errlen, MS_EINVAL, "decode mode %d or max_logit_rows %d is out of range",
                      (int)o->decode, o->max_logit_rows);
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
    for (int p = 0; p <= r->R; p++) r->first_expert[p] = (int32_t)((long long)r->E * p / r->R);
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
    // Every sequence of a step may hold a whole context's block table: the
    // engine's max_model_len, not the model's max_position_embeddings (a
    // config may claim a million positions that no request will reach).
    r->max_len = o->max_seq_len > 0 && o->max_seq_len < cfg->max_position_embeddings ? o->max_seq_len
                                                                                    : cfg->max_position_embeddings;
    long long bt = (long long)r->max_seqs * ((r->max_len + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (recv > INT32_MAX / 2 || bt > INT32_MAX / 2 ||
        (long long)r->max_tokens * r->R > INT32_MAX / 2) {
        ms_err(err, errlen, MS_ENOFIT, "max_batch_tokens %d x top-k %d x %d ranks (or %d sequences "
               "of %d positions) is too large for one step: lower --max-num-batched-tokens, "
               "--max-num-seqs or --max-model-len", r->max_tokens, r->topk, r->R, r->max_seqs, r->max_len);
        goto fail;
    }
    r->max_pairs = (int)pairs;
    r->max_recv = (int)recv;
    r->max_bt = (int)bt;
    // A padded expert-parallel step routes every rank's pairs here (as many
    // as one rank can receive); moe_route pads each expert's rows.
    r->all_pairs = (int)recv;
    r->all_tokens = r->max_tokens * (r->comm ? r->R : 1);
    const int padded_rows = fwd_plan_route_rows(r->all_pairs, r->E, ROUTE_MAX_PAD);
    if (r->all_pairs > 0 && r->E > 0 && padded_rows == 0) {
        ms_err(err, errlen, MS_ENOFIT, "max_batch_tokens %d x top-k %d x %d ranks is too large for "
               "one step's routing", r->max_tokens, r->topk, r->R);
        goto fail;
    }
    r->route_rows = max_int(padded_rows, r->max_recv);
    if (o->decode != FWD_DECODE_EAGER && o->max_logit_rows > 0) {
        r->bucket_cap = r->max_seqs < r->max_tokens ? r->max_seqs : r->max_tokens;
        if (o->max_logit_rows < r->bucket_cap) r->bucket_cap = o->max_logit_rows;
        r->n_graphs = fwd_plan_buckets(r->bucket_cap, NULL, 0);
        r->graphs = calloc((size_t)r->n_graphs, sizeof *r->graphs);
        int *b = calloc((size_t)r->n_graphs, sizeof *b);
        if (!r->graphs || !b) {
            free(b);
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for rank %d's decode buckets", o->rank);
            goto fail;
        }
        fwd_plan_buckets(r->bucket_cap, b, r->n_graphs);
        for (int i = 0; i < r->n_graphs; i++) r->graphs[i].bucket = b[i];
        free(b);
    }
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

int rank_prefault(struct rank *r, char *err, size_t errlen)
{
    return backend_prefault(r->b, r->ws, r->ws_bytes, "the step workspace", err, errlen);
}

void rank_destroy(struct rank *r)
{
    if (!r) return;
    for (int i = 0; i < r->n_graphs; i++)
        if (r->graphs[i].g) r->b->ops->graph_free(r->b, r->graphs[i].g);
    free(r->graphs);
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
    out->padded_steps = r->padded_steps;
    out->graph_steps = r->graph_steps;
    out->last_a2a_seconds = r->a2a_time;
    out->expert_tokens = r->expert_tokens;
    out->layer_tokens = r->layer_tokens;
    memcpy(out->phase_seconds, r->phase_time, sizeof out->phase_seconds);
    out->decode_steps = r->decode_steps;
    out->last_step_decode = r->last_decode;
    memcpy(out->decode_phase_seconds, r->decode_phase_time, sizeof out->decode_phase_seconds);
    out->a2a_seconds_total = r->a2a_total;
    out->forward_seconds_total = r->forward_total;
}

// ---- the step's layout ----------------------------------------------------------

// Checks the batch; decode_out says whether it is a decode batch (every
// sequence one new token and its logits).
static int check_batch(const struct rank *r, const struct fwd_batch *b, const float *logits,
                       int *n_tok_out, int *n_logits_out, bool *decode_out, char *err,
                       size_t errlen)
{
    const struct model_config *cfg = r->cfg;
    *n_tok_out = *n_logits_out = 0;
    *decode_out = false;
    if (!b) return ms_err(err, errlen, MS_EINVAL, "no batch given");
    if (b->n_seqs < 0 || b->n_seqs > r->max_seqs)
        return ms_err(err, errlen, MS_EINVAL, "a step has %d sequences; this rank was sized for "
                      "at most %d", b->n_seqs, r->max_seqs);
    if (b->n_seqs > 0 && !b->seqs) return ms_err(err, errlen, MS_EINVAL, "the batch has no sequences array");
    long long n_tok = 0, n_logits = 0;
    bool decode = true;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct fwd_seq *q = &b->seqs[s];
        if (q->n_new < 1 || !q->tokens)
            return ms_err(err, errlen, MS_EINVAL, "sequence %d of the step has %d new tokens; each "
                          "needs at least one", s, q->n_new);
        if (q->n_past < 0 || (long long)q->n_past + q->n_new > r->max_len)
            return ms_err(err, errlen, MS_ETOOLONG, "sequence %d reaches position %lld, beyond the "
                          "%d positions this rank was sized for (max_model_len, at most the model's "
                          "max_position_embeddings)", s, (long long)q->n_past + q->n_new, r->max_len);
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
        decode &= q->n_new == 1 && q->n_logits == 1;
    }
    if (n_tok > r->max_tokens)
        return ms_err(err, errlen, MS_EINVAL, "a step has %lld new tokens; this rank was sized for "
                      "at most %d (max_batch_tokens)", n_tok, r->max_tokens);
    if (n_logits > 0 && !logits) return ms_err(err, errlen, MS_EINVAL, "logits were asked for but no "
                                               "output buffer was given");
    *n_tok_out = (int)n_tok;
    *n_logits_out = (int)n_logits;
    *decode_out = decode && b->n_seqs > 0;
    return 0;
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

// The step's header: every rank's sequences, tokens, logits rows, whether
// its batch is a decode batch and its largest bucket (0: it pads no step;
// also when it has no logits buffer to write padding rows into), in one
// exchange. Every rank decides from the same header whether the step runs
// padded, and every exchange of the step is sized from it or from counts.
static int step_header(struct rank *r, int n_seqs, int T, int n_logits, bool decode,
                       bool have_logits, char *err, size_t errlen)
{
    const int32_t mine[HDR_INTS] = {n_seqs, T, n_logits, decode, have_logits ? r->bucket_cap : 0};
    memset(r->h.hdr, 0, (size_t)r->R * HDR_INTS * sizeof(int32_t));
    memcpy(r->h.hdr + (size_t)r->me * HDR_INTS, mine, sizeof mine);
    if (!r->comm) return 0;
    struct backend *b = r->b;
    op(r, b->ops->upload(b, r->hdr_send, mine, sizeof mine));
    int rc = comm_timed_gather(r, r->hdr_send, sizeof mine, r->hdr);
    if (rc) {
        // Unknown peers: no padding, no logits from them.
        memset(r->h.hdr, 0, (size_t)r->R * HDR_INTS * sizeof(int32_t));
        memcpy(r->h.hdr + (size_t)r->me * HDR_INTS, mine, sizeof mine);
        r->h.hdr[(size_t)r->me * HDR_INTS + HDR_CAP] = 0;
        return ms_err(err, errlen, rc, "rank %d: exchanging the step's sizes failed (%s)", r->me,
                      ms_status_name(rc));
    }
    op(r, b->ops->download(b, r->h.hdr, r->hdr, (size_t)r->R * HDR_INTS * sizeof(int32_t)));
    return 0;
}

// The bucket this step is padded to, or 0 when it runs as it comes: every
// rank pads decode steps, no rank brings anything but decode sequences, and
// the longest batch fits the smallest rank's largest bucket.
static int padded_bucket(const struct rank *r)
{
    int n_max = 0, cap = INT_MAX;
    for (int p = 0; p < r->R; p++) {
        const int32_t *h = r->h.hdr + (size_t)p * HDR_INTS;
        if (h[HDR_CAP] <= 0 || (h[HDR_SEQS] > 0 && !h[HDR_DECODE])) return 0;
        if (h[HDR_SEQS] > n_max) n_max = h[HDR_SEQS];
        if (h[HDR_CAP] < cap) cap = h[HDR_CAP];
    }
    return n_max > 0 ? fwd_plan_bucket(n_max, cap) : 0;
}

// Flattens a checked batch into the step's layout on the host, then hands it
// to the backend in one upload per array. A padded step (B > 0) appends
// padding sequences up to B: one token (id 0 at position 0) each, in the
// pool's scratch block, with a logits row after the real ones; live marks
// the real tokens of every rank (each rank's B rows, rank-major, when the
// step exchanges fixed sizes).
static void layout_step(struct rank *r, const struct fwd_batch *b, int T, int n_logits, int B)
{
    int t = 0, nl = 0, nb = 0, max_ctx = 0;
    const int n_seqs = B > 0 ? B : b->n_seqs;
    for (int s = 0; s < n_seqs; s++) {
        r->h.seq_start[s] = t;
        r->h.bt_start[s] = nb;
        if (s >= b->n_seqs) {
            r->h.bt[nb++] = r->kv->n_blocks; // the scratch block
            r->h.tok_id[t] = 0;
            r->h.tok_pos[t] = 0;
            r->h.tok_seq[t] = s;
            r->h.logit_rows[nl++] = t++;
            if (max_ctx < 1) max_ctx = 1;
            continue;
        }
        const struct fwd_seq *q = &b->seqs[s];
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
    r->h.seq_start[n_seqs] = t;
    r->h.bt_start[n_seqs] = nb;
    if (B > 0) T = n_logits = B;
    r->step.n_tokens = T;
    r->step.n_seqs = n_seqs;
    r->step.max_ctx = max_ctx;
    struct backend *bk = r->b;
    const size_t i4 = sizeof(int32_t), S1 = (size_t)n_seqs + 1;
    op(r, bk->ops->upload(bk, r->tok_id, r->h.tok_id, (size_t)T * i4));
    op(r, bk->ops->upload(bk, r->tok_pos, r->h.tok_pos, (size_t)T * i4));
    op(r, bk->ops->upload(bk, r->tok_seq, r->h.tok_seq, (size_t)T * i4));
    op(r, bk->ops->upload(bk, r->seq_start, r->h.seq_start, S1 * i4));
    op(r, bk->ops->upload(bk, r->bt_start, r->h.bt_start, S1 * i4));
    op(r, bk->ops->upload(bk, r->bt, r->h.bt, (size_t)nb * i4));
    op(r, bk->ops->upload(bk, r->logit_rows, r->h.logit_rows, (size_t)n_logits * i4));
    if (B > 0) {
        const int ranks = r->comm ? r->R : 1;
        for (int p = 0; p < ranks; p++) {
            const int real = r->comm ? r->h.hdr[(size_t)p * HDR_INTS + HDR_SEQS] : b->n_seqs;
            for (int i = 0; i < B; i++) r->h.live[p * B + i] = i < real;
        }
        op(r, bk->ops->upload(bk, r->live, r->h.live, (size_t)ranks * B * i4));
    }
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

// Where one MoE layer's expert rows come from and go: gate and up read x
// (rows x_rows) and write g and u at rows mid_rows (NULL: in row order), SiLU
// runs over the first `mid` rows, down reads them back and writes y (rows
// y_rows). Experts [e0, e0 + n), group i's rows off[i]..off[i + 1] (rows at
// most, padded with pad); h_off is off on the host, or NULL when the host has
// not read it (the statistics are then counted at the step's end).
struct expert_pass {
    const float *x;
    const int32_t *x_rows;
    const int32_t *mid_rows;
    int mid;
    float *y;
    const int32_t *y_rows;
    int e0, n;
    const int32_t *off, *h_off;
    int pad, rows;
};

static void run_experts(struct rank *r, const struct expert_pass *ep)
{
    const struct backend_layer *L = &r->w->layers[r->layer];
    struct backend *b = r->b;
    const size_t hd = (size_t)r->cfg->hidden_size, F = (size_t)r->cfg->moe_intermediate_size;
    const int n = ep->n, e0 = ep->e0;
    if (ep->h_off) {
        for (int e = e0; e < e0 + n; e++)
            r->expert_tokens[e] += (uint64_t)(ep->h_off[e - e0 + 1] - ep->h_off[e - e0]);
        r->layer_tokens[r->layer] += (uint64_t)(ep->h_off[n] - ep->h_off[0]);
    }
    if (ep->rows == 0 || n == 0) return;
    const struct backend_gmm gu[2] = {
        {.w = L->expert_gate + e0, .n_groups = n, .off = ep->off, .h_off = ep->h_off,
         .max_rows = ep->rows, .x = ep->x, .ldx = hd, .x_rows = ep->x_rows, .y = r->g, .ldy = F,
         .y_rows = ep->mid_rows, .pad = ep->pad},
        {.w = L->expert_up + e0, .n_groups = n, .off = ep->off, .h_off = ep->h_off,
         .max_rows = ep->rows, .x = ep->x, .ldx = hd, .x_rows = ep->x_rows, .y = r->u, .ldy = F,
         .y_rows = ep->mid_rows, .pad = ep->pad},
    };
    op(r, b->ops->grouped_matmul(b, gu, 2));
    op(r, b->ops->silu_mul(b, r->g, r->u, (size_t)ep->mid * F));
    const struct backend_gmm down = {.w = L->expert_down + e0, .n_groups = n, .off = ep->off,
                                     .h_off = ep->h_off, .max_rows = ep->rows, .x = r->g,
                                     .ldx = F, .x_rows = ep->mid_rows, .y = ep->y, .ldy = hd,
                                     .y_rows = ep->y_rows, .pad = ep->pad};
    op(r, b->ops->grouped_matmul(b, &down, 1));
}

// The row padding moe_route uses for n_pairs pairs over n_groups experts.
static int route_pad(const struct rank *r, int n_pairs, int n_groups)
{
    const int pad = r->b->ops->route_pad(r->b, n_pairs, n_groups);
    return pad >= 1 && pad <= ROUTE_MAX_PAD ? pad : 1;
}

// Routes T rows' pairs (top_id, top_w from router logits of x) to experts
// [e0, e1): rows of dead tokens (live 0) are left out. Expert counts land
// in cnt_all (read at the step's end).
static void route_rows(struct rank *r, const float *x, int T, const int32_t *live, int e0, int e1,
                       int pad)
{
    const struct backend_layer *L = &r->w->layers[r->layer];
    struct backend *b = r->b;
    const int E = r->E, k = r->topk;
    const size_t hd = (size_t)r->cfg->hidden_size;
    const struct backend_mm router = {.w = &L->router, .x = x, .ldx = hd, .y = r->rl,
                                      .ldy = (size_t)E, .rows = T};
    op(r, b->ops->matmul(b, &router, 1));
    op(r, b->ops->router_topk(b, r->rl, T, E, k, r->cfg->norm_topk_prob, r->top_id, r->top_w));
    const struct backend_route route = {
        .ids = r->top_id, .live = live, .n_tokens = T, .k = k, .e0 = e0, .e1 = e1, .pad = pad,
        .off = r->exp_off, .count = r->cnt_all + (size_t)r->layer * E + e0, .slot = r->pair_slot,
        .token = r->exp_x, .pair = r->exp_pair};
    op(r, b->ops->moe_route(b, &route));
    r->counted_on_device = true;
}

// A single rank's MoE layer: every expert is local, so nothing is read back.
// With padded expert rows (a device's tiles) the experts' activations stay
// in pair order (row t * k + j), so that no op runs over the padding; with
// none they are in expert order, as the routing sorts them. Their outputs
// go to pair order too wherever every pair has a row (no dead tokens), so
// that the combine reads a token's k rows as one run where it gathered
// them from all over the experts' rows. Measured on the mid model (Zen 5,
// 2 threads, `bench-offline` of 64 x 128-token prompts, 2 rounds, two
// runs of each build): the combine over the prompt steps 417-486 ms
// before, 208-224 after; the down projection, which writes the same rows
// elsewhere, 1987-2222 before, 2060-2086 after.
static void moe_local(struct rank *r, int T, const int32_t *live)
{
    const int E = r->E, k = r->topk;
    const int pad = route_pad(r, T * k, E);
    route_rows(r, r->xn, T, live, 0, E, pad);
    const bool by_pair = pad > 1, out_by_pair = by_pair || !live;
    const struct expert_pass ep = {
        .x = r->xn, .x_rows = r->exp_x, .mid_rows = by_pair ? r->exp_pair : NULL, .mid = T * k,
        .y = r->ret, .y_rows = out_by_pair ? r->exp_pair : NULL, .e0 = 0, .n = E, .off = r->exp_off,
        .pad = pad, .rows = fwd_plan_route_rows(T * k, E, pad)};
    run_experts(r, &ep);
    struct backend *b = r->b;
    op(r, b->ops->moe_combine(b, r->x, r->ret, out_by_pair ? NULL : r->pair_slot, r->top_w, T, k,
                              r->cfg->hidden_size));
}

// Expert-parallel part of a MoE layer sized by counts: the pairs are already
// sorted by expert (and so by owner rank) in the send layout. Counts travel
// first, so that every rank knows what it sends and receives; the rows go to
// their experts' ranks, the local experts run, and the outputs come back.
// (The host reads the counts: one round trip per layer.)
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
    // Local rows grouped by expert, then by source rank, in arrival order:
    // known from the counts, and uploaded before the send is queued (on a
    // GPU an upload from pageable memory queued behind a pending NCCL
    // exchange can hold this thread inside the driver until the peers
    // arrive; cu_download's comment has the same hazard).
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
    op(r, b->ops->gather_rows(b, r->xn, (size_t)r->cfg->hidden_size, r->exp_x, r->h.exp_off[E],
                              r->cfg->hidden_size, r->send));
    if ((rc = comm_timed_a2a(r, r->send, sb, so, r->recv, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: sending MoE rows to their experts failed (%s)", me,
                      ms_status_name(rc));
    const struct expert_pass ep = {.x = r->recv, .x_rows = r->exp_y, .mid = off[nl], .y = r->res,
                                   .y_rows = r->exp_y, .e0 = r->e_begin, .n = nl,
                                   .off = r->local_off, .h_off = off, .pad = 1, .rows = off[nl]};
    run_experts(r, &ep);
    if ((rc = comm_timed_a2a(r, r->res, rb, ro, r->ret, sb, so)))
        return ms_err(err, errlen, rc, "rank %d: returning MoE expert outputs failed (%s)", me,
                      ms_status_name(rc));
    return 0;
}

// Expert-parallel part of a padded step's MoE layer, in sizes every rank
// knows from the header (B rows a rank), so that nothing is read back to
// the host: every rank's normed rows are gathered to every rank, which
// routes them all (the router is replicated and a row's logits are a fixed
// function of the row, so each rank routes a row exactly as its own rank
// does) and runs its local experts on the pairs routed to them, leaving
// each output at its pair's row; each rank then sends every peer one row per
// pair of the peer's tokens (its own experts' rows filled) and takes each of
// its pairs from its expert's owner, summed in top-k order as ever. The
// return moves every pair's row from every rank (R x what counts would
// send): the price of not asking the host.
static int moe_exchange_fixed(struct rank *r, int B, char *err, size_t errlen)
{
    const int R = r->R, me = r->me, k = r->topk, all = R * B;
    struct backend *b = r->b;
    const size_t row = (size_t)r->cfg->hidden_size * sizeof(float);
    int rc = comm_timed_gather(r, r->xn, (size_t)B * row, r->xg);
    if (rc) return ms_err(err, errlen, rc, "rank %d: gathering the ranks' MoE rows failed (%s)", me,
                          ms_status_name(rc));
    // About one pair in R is this rank's: the tile for that many.
    const int nl = r->e_end - r->e_begin, pad = route_pad(r, all * k / R, nl);
    route_rows(r, r->xg, all, r->live, r->e_begin, r->e_end, pad);
    const struct expert_pass ep = {
        .x = r->xg, .x_rows = r->exp_x, .mid_rows = r->exp_pair, .mid = all * k, .y = r->res,
        .y_rows = r->exp_pair, .e0 = r->e_begin, .n = nl, .off = r->exp_off, .pad = pad,
        .rows = fwd_plan_route_rows(all * k, nl, pad)};
    run_experts(r, &ep);
    size_t *sb = r->h.a2a, *so = sb + R, *rb = so + R, *ro = rb + R;
    const size_t part = (size_t)B * k * row;
    for (int p = 0; p < R; p++) {
        sb[p] = rb[p] = part;
        so[p] = ro[p] = (size_t)p * part;
    }
    if ((rc = comm_timed_a2a(r, r->res, sb, so, r->recv, rb, ro)))
        return ms_err(err, errlen, rc, "rank %d: returning MoE expert outputs failed (%s)", me,
                      ms_status_name(rc));
    const int32_t *ids = r->top_id + (size_t)me * B * k, *live = r->live + (size_t)me * B;
    op(r, b->ops->moe_return_slots(b, ids, live, B, k, r->first_expert, R, B * k, r->home));
    op(r, b->ops->moe_combine(b, r->x, r->recv, r->home, r->top_w + (size_t)me * B * k, B, k,
                              r->cfg->hidden_size));
    return 0;
}

// One MoE layer over T rows; B > 0: a padded step of B rows a rank.
static int moe_block(struct rank *r, int T, int B, char *err, size_t errlen)
{
    struct backend *b = r->b;
    const int E = r->E, k = r->topk;
    if (!r->comm) {
        if (T > 0) moe_local(r, T, B > 0 ? r->live : NULL);
        return 0;
    }
    if (B > 0) return moe_exchange_fixed(r, B, err, errlen);
    // Sorted by expert without padding: the send layout.
    route_rows(r, r->xn, T, NULL, 0, E, 1);
    r->counted_on_device = false; // counted on the host from here
    const size_t offb = (size_t)(E + 1) * sizeof(int32_t);
    op(r, b->ops->download(b, r->h.exp_off, r->exp_off, offb));
    int rc = moe_exchange(r, err, errlen);
    if (rc == 0)
        op(r, b->ops->moe_combine(b, r->x, r->ret, r->pair_slot, r->top_w, T, k, r->cfg->hidden_size));
    return rc;
}

// The lm_head under expert parallelism. Replicated, it would be read whole
// by every rank each step (N ranks sharing one memory read it N times, and a
// rank with more sequences waits longest); instead each rank computes one
// slice of the vocabulary for every rank's rows: the rows are gathered, the
// slices computed, and each rank's slices sent back to it. A logit is the
// same function of its x row and weight row whichever rank computes it, so
// results do not depend on the number of ranks. Every rank joins both
// exchanges, with or without rows (all of them skip when no rank has any);
// counts (R, host) are each rank's rows, from the step's header.
static int vocab_parallel_head(struct rank *r, const int32_t *counts, int n_logits, float *logits,
                               char *err, size_t errlen)
{
    const int R = r->R, me = r->me;
    struct backend *b = r->b;
    const size_t hd = (size_t)r->cfg->hidden_size, V = (size_t)r->cfg->vocab_size;
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
    int rc;
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

// ---- the step -------------------------------------------------------------------

// The layers, the final norm and the head over the step's layout: T rows,
// n_logits of them wanting logits; B > 0 for a padded step. After a failed
// exchange it keeps stepping through the layers, so that the ranks stay in
// lockstep, and returns the first failure.
static int run_layers(struct rank *r, int T, int n_logits, int B, float *logits, char *err,
                      size_t errlen)
{
    struct backend *bk = r->b;
    const struct model_config *cfg = r->cfg;
    if (T > 0) op(r, bk->ops->embed(bk, r->w, r->tok_id, T, r->x));
    int crc = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        r->layer = l;
        if (T > 0) attention_block(r, T);
        const double tq = ms_now();
        r->phase_time[FWD_PHASE_ATTENTION] += tq - r->tp;
        if (r->m->layers[l].is_moe) {
            int c = moe_block(r, T, B, crc ? NULL : err, errlen);
            if (c && !crc) crc = c;
        } else if (T > 0) {
            dense_mlp(r, T);
        }
        r->tp = ms_now();
        r->phase_time[FWD_PHASE_MOE] += r->tp - tq;
    }
    const size_t hd = (size_t)cfg->hidden_size;
    if (n_logits > 0)
        op(r, bk->ops->rmsnorm(bk, r->x, hd, r->logit_rows, n_logits, &r->w->final_norm,
                               cfg->rms_norm_eps, r->xl));
    if (r->comm) {
        for (int p = 0; p < r->R; p++)
            r->h.counts[p] = B > 0 ? B : r->h.hdr[(size_t)p * HDR_INTS + HDR_LOGITS];
        int c = vocab_parallel_head(r, r->h.counts, n_logits, logits, crc ? NULL : err, errlen);
        if (c && !crc) crc = c;
    } else if (n_logits > 0) {
        op(r, bk->ops->lm_head(bk, r->w, 0, cfg->vocab_size, r->xl, n_logits, logits,
                               (size_t)cfg->vocab_size));
    }
    return crc;
}

static struct fwd_graph *graph_of(struct rank *r, int B)
{
    for (int i = 0; i < r->n_graphs; i++)
        if (r->graphs[i].bucket == B) return &r->graphs[i];
    return NULL;
}

static bool has_graphs(const struct backend *b)
{
    return b->ops->graph_begin && b->ops->graph_end && b->ops->graph_launch && b->ops->graph_free;
}

// Records a padded step of bucket B as a graph; true when it is recorded
// (nothing of it has run). On failure it says so once and the bucket runs
// eagerly from then on; the step's op failures recorded so far are dropped.
static bool graph_record(struct rank *r, struct fwd_graph *gs, int B, float *logits)
{
    struct backend *b = r->b;
    char why[sizeof r->op_err] = "";
    int rc = b->ops->graph_begin(b);
    if (rc) {
        snprintf(why, sizeof why, "%s", b->err);
    } else {
        char err[512] = "";
        const int c = run_layers(r, B, B, B, logits, err, sizeof err);
        if (c) snprintf(why, sizeof why, "%s", err);
        else if (r->op_rc) snprintf(why, sizeof why, "%s", r->op_err);
        struct backend_graph *g = NULL;
        rc = b->ops->graph_end(b, &g);
        if (rc && !why[0]) snprintf(why, sizeof why, "%s", b->err);
        if (!why[0] && g) {
            gs->g = g;
            gs->logits = logits;
            return true;
        }
        if (g) b->ops->graph_free(b, g);
        r->op_rc = 0;
    }
    gs->eager_only = true;
    ms_log(MS_LOG_WARN, "rank %d: recording the decode step of %d sequences as a graph failed "
           "(%s); those steps run eagerly", r->me, B, why[0] ? why : "no reason given");
    return false;
}

// A padded step of bucket B: the bucket's graph when there is one (recorded
// at its second step: the first, eager, warms the backend's scratch up),
// else eagerly. Ranks may differ here — one replaying, another eager — since
// both run the same exchanges in the same sizes.
static int run_padded(struct rank *r, int B, float *logits, char *err, size_t errlen)
{
    struct backend *b = r->b;
    struct fwd_graph *gs = r->o.decode == FWD_DECODE_GRAPHS && has_graphs(b) ? graph_of(r, B) : NULL;
    if (gs && gs->g && gs->logits != logits) {
        // Another logits buffer: record the bucket again for it.
        b->ops->graph_free(b, gs->g);
        gs->g = NULL;
    }
    // (Not after an upload failed: that is the step's failure, not the graph's.)
    if (gs && !gs->g && !gs->eager_only && gs->eager_runs > 0 && !r->op_rc)
        graph_record(r, gs, B, logits);
    if (gs && gs->g) {
        const int rc = b->ops->graph_launch(b, gs->g);
        // The graph's exchanges do not look at the group's abort flag: ask.
        if (rc == 0 && r->comm && comm_check(r->comm)) {
            ms_err(err, errlen, MS_ECANCELLED, "rank %d: the expert-parallel group was aborted",
                   r->me);
            return MS_ECANCELLED;
        }
        if (rc == 0) {
            r->graph_steps++;
            // The recorded steps route every MoE layer (moe_route writes
            // this step's counts into cnt_all), as the eager ones do.
            r->counted_on_device = r->E > 0;
            const double now = ms_now();
            r->phase_time[FWD_PHASE_ATTENTION] += now - r->tp;
            r->tp = now;
            return 0;
        }
        ms_log(MS_LOG_INFO, "rank %d: the decode graph of %d sequences cannot run (%s); it is "
               "recorded again", r->me, B, b->err);
        b->ops->graph_free(b, gs->g);
        gs->g = NULL;
        gs->eager_runs = 0;
    }
    if (gs) gs->eager_runs++;
    return run_layers(r, B, B, B, logits, err, errlen);
}

// A single rank, or a padded step: each MoE layer's expert counts, in one
// read at the step's end.
static void count_experts(struct rank *r)
{
    const struct model_config *cfg = r->cfg;
    const size_t E = (size_t)r->E;
    struct backend *bk = r->b;
    op(r, bk->ops->download(bk, r->h.cnt_all, r->cnt_all, (size_t)cfg->n_layers * E * sizeof(int32_t)));
    if (r->op_rc) return;
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!r->m->layers[l].is_moe) continue;
        const int32_t *cnt = r->h.cnt_all + (size_t)l * E;
        for (int e = r->e_begin; e < r->e_end; e++) {
            r->expert_tokens[e] += (uint64_t)cnt[e];
            r->layer_tokens[l] += (uint64_t)cnt[e];
        }
    }
}

// Long because it is the step's outline: checks, the header, the layout,
// the layers (eager, padded, or a graph), the statistics.
int rank_forward(struct rank *r, const struct fwd_batch *b, float *logits, char *err, size_t errlen)
{
    const double t0 = ms_now();
    double phase0[FWD_PHASES];
    memcpy(phase0, r->phase_time, sizeof phase0);
    r->a2a_time = 0;
    r->op_rc = 0;
    r->layer = 0;
    r->counted_on_device = false;
    int T, n_logits;
    bool decode;
    int rc = check_batch(r, b, logits, &T, &n_logits, &decode, err, errlen);
    if (rc) {
        // Run the step as an empty batch: peers still meet us in every exchange.
        static const struct fwd_batch empty = {0};
        b = &empty;
        T = n_logits = 0;
        decode = false;
    }
    const int real_tokens = T;
    int crc = step_header(r, b->n_seqs, T, n_logits, decode, logits != NULL, rc ? NULL : err, errlen);
    // The header replaced the head's count exchange: its time counts there.
    const double th = ms_now();
    r->phase_time[FWD_PHASE_LM_HEAD] += th - t0;
    r->tp = th; // the layout and embedding count with the first attention
    const int B = padded_bucket(r);
    layout_step(r, b, T, n_logits, B);
    int c;
    if (B > 0) {
        r->padded_steps++;
        c = run_padded(r, B, logits, crc || rc ? NULL : err, errlen);
    } else {
        c = run_layers(r, T, n_logits, 0, logits, crc || rc ? NULL : err, errlen);
    }
    if (c && !crc) crc = c;
    if (r->counted_on_device && r->E > 0 && (T > 0 || B > 0)) count_experts(r);
    r->steps++;
    r->tokens += (uint64_t)real_tokens;
    const double t1 = ms_now();
    r->phase_time[FWD_PHASE_LM_HEAD] += t1 - r->tp;
    r->last_decode = decode;
    if (decode) {
        r->decode_steps++;
        for (int f = 0; f < FWD_PHASES; f++) r->decode_phase_time[f] += r->phase_time[f] - phase0[f];
    }
    r->last_step = t1 - t0;
    r->forward_total += r->last_step;
    r->a2a_total += r->a2a_time;
    if (rc) return rc;
    if (crc) return crc;
    if (r->op_rc) return ms_err(err, errlen, r->op_rc, "%s", r->op_err);
    return 0;
}
