// Pins what the forward pass must not depend on: how a prompt is cut into
// chunks, what else shares the step (prefill and decode rows mixed), the
// thread count, the number of expert-parallel ranks (2 and 3 ranks as
// threads through the in-process communicator), and whether decode steps
// run padded to a bucket with fixed-size exchanges (and, on a GPU, replayed
// from recorded graphs). Every comparison is bitwise:
// each matmul output is a fixed function of its row (see kernels_simd.inc),
// attention and norms are per row, and MoE outputs are summed in top-k order,
// so no tolerance is needed. Also: a rank handed a bad batch still joins the
// exchanges, so its peers finish their step. The same holds for models whose
// projections are quantized at load (int4, int8, fp8), and for an act-order
// GPTQ checkpoint, whose matmuls read their inputs gathered into each
// matrix's order.
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>
#include <jansson.h>

#include "fwd_harness.h"
#include "base/base.h"
#include "model/makemodel.h"

#define N_SEQS 4
#define MAX_STEPS 512

static const char *data_dir;

// A sequence: golden prompt + its reference continuation, fed token by token
// in chunks; logits are taken at every position.
struct seqdef {
    int32_t tok[1024];
    int len;
    int prompt_len;
    int first;         // > 0: the first chunk's size, before the cycle
    int chunks[4];     // chunk sizes, cycled
    int n_chunks;
    int start_step;
};

struct plan {
    struct seqdef seq[N_SEQS];
    int n_seqs;
    bool serial;       // one sequence at a time, each alone in its steps
};

struct result {
    float *logits[N_SEQS]; // (len, vocab)
};

static struct model *moe, *dense;
static const char *variant; // the CPU kernel table the ranks run (NULL: the default)

// The golden checkpoint as stored, or with its projections quantized at load.
static struct model *load_as(const char *name, enum quant_format q)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/%s", data_dir, name);
    struct model *m;
    const struct model_load_opts o = {.format = LOAD_FORMAT_AUTO, .quantization = q, .cache_dir = "none"};
    if (model_load_opts(dir, &o, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    return m;
}

static struct model *load(const char *name) { return load_as(name, QUANT_NONE); }

static void load_seq(const char *name, size_t ci, struct seqdef *s)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s/expected.json", data_dir, name);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *c = json_array_get(json_object_get(root, "cases"), ci);
    json_t *p = json_object_get(c, "prompt_ids"), *t = json_object_get(c, "tokens");
    s->len = 0;
    for (size_t i = 0; i < json_array_size(p); i++)
        s->tok[s->len++] = (int32_t)json_integer_value(json_array_get(p, i));
    s->prompt_len = s->len;
    for (size_t i = 0; i < json_array_size(t); i++)
        s->tok[s->len++] = (int32_t)json_integer_value(json_object_get(json_array_get(t, i), "id"));
    json_decref(root);
}

static int setup(void **state)
{
    (void)state;
    data_dir = getenv("MOESERVE_TEST_DATA");
    if (!data_dir) return -1;
    moe = load("qwen3moe-v2048");
    dense = load("qwen3-dense-v2048");
    return moe && dense ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    model_destroy(moe);
    model_destroy(dense);
    return 0;
}

// Cases 1, 3, 4, 2 of expected.json: prompts of 5, 33, 100 and 16 tokens.
static void base_plan(const char *name, struct plan *p)
{
    memset(p, 0, sizeof *p);
    p->n_seqs = N_SEQS;
    const size_t cases[N_SEQS] = {1, 3, 4, 2};
    for (int s = 0; s < N_SEQS; s++) load_seq(name, cases[s], &p->seq[s]);
}

static void set_chunks(struct seqdef *s, int a, int b, int c, int d, int n, int start)
{
    s->chunks[0] = a;
    s->chunks[1] = b;
    s->chunks[2] = c;
    s->chunks[3] = d;
    s->n_chunks = n;
    s->start_step = start;
}

struct rank_run {
    const struct model *m;
    const struct plan *p;
    struct result *res;
    struct comm *comm;
    struct backend *bk; // made by run_plan (NCCL ranks: the communicator needs them first), or NULL
    int rank, n_ranks, threads;
    enum dtype kv_dtype;
    int fail_step;     // this rank submits a bad batch at this step (-1: never)
    int stop_after;    // the last step this rank runs (-1: until the plan ends)
    enum fwd_decode decode;
    int rc;
    int steps;
    uint64_t expert_rows;  // rows this rank's experts processed, all layers
    uint64_t padded_steps, graph_steps;
};

// The size of chunk c of sequence q.
static int chunk_size(const struct seqdef *q, int c)
{
    return c == 0 && q->first > 0 ? q->first : q->chunks[c % q->n_chunks];
}

// Which sequences take how many tokens at each step: the same schedule on
// every rank, each rank keeping the sequences s with s % n_ranks == rank.
static int schedule(const struct plan *p, int step, const int *done, int *take)
{
    int active = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        take[s] = 0;
        const struct seqdef *q = &p->seq[s];
        if (done[s] >= q->len || step < q->start_step) continue;
        if (p->serial) {
            bool earlier_busy = false;
            for (int e = 0; e < s; e++) earlier_busy |= done[e] < p->seq[e].len;
            if (earlier_busy) continue;
        }
        int k = 0;
        for (int c = 0, at = 0; at < done[s]; c++) at += chunk_size(q, c), k = c + 1;
        int n = chunk_size(q, k);
        take[s] = n < q->len - done[s] ? n : q->len - done[s];
        active++;
    }
    return active;
}

// Rank `rank`'s backend (on device `rank`: one GPU each on CUDA).
static int rank_backend(int rank, int threads, struct backend **out, char *err, size_t errlen)
{
    const struct backend_opts bo = {.n_threads = threads, .rank = rank, .device_index = rank,
                                    .variant = variant};
    return backend_create(harness_device, &bo, out, err, errlen);
}

static void *rank_main(void *arg)
{
    struct rank_run *rr = arg;
    const struct plan *p = rr->p;
    char err[512];
    struct backend *bk;
    struct kv_pool *kv;
    struct rank *r;
    if (rr->bk) bk = rr->bk;
    else if ((rr->rc = rank_backend(rr->rank, rr->threads, &bk, err, sizeof err))) return NULL;
    rr->rc = kv_pool_create(bk, &rr->m->cfg, rr->kv_dtype, 64 * N_SEQS, &kv, err, sizeof err);
    if (rr->rc) {
        if (!rr->bk) backend_destroy(bk);
        return NULL;
    }
    struct rank_opts o = {.rank = rr->rank, .n_ranks = rr->n_ranks, .comm = rr->comm,
                          .max_batch_tokens = 512, .max_batch_seqs = N_SEQS,
                          .decode = rr->decode, .max_logit_rows = 512};
    float *d_logits = NULL;
    if ((rr->rc = rank_create(rr->m, bk, kv, &o, &r, err, sizeof err)) ||
        (rr->rc = bk->ops->alloc(bk, (size_t)512 * rr->m->cfg.vocab_size * sizeof(float),
                                 (void **)&d_logits))) {
        fprintf(stderr, "%s\n", err);
        kv_pool_destroy(bk, kv);
        if (!rr->bk) backend_destroy(bk);
        return NULL;
    }
    const int V = rr->m->cfg.vocab_size;
    int32_t blocks[N_SEQS][64];
    for (int s = 0; s < N_SEQS; s++)
        for (int b = 0; b < 64; b++) blocks[s][b] = (int32_t)(s * 64 + 63 - b);
    int done[N_SEQS] = {0}, take[N_SEQS];
    float *logits = malloc((size_t)512 * V * sizeof(float));
    int32_t bad_token = (int32_t)V; // outside the vocabulary
    for (int step = 0; step < MAX_STEPS; step++) {
        if (!schedule(p, step, done, take)) break;
        struct fwd_seq seqs[N_SEQS];
        int ids[N_SEQS], n = 0;
        for (int s = 0; s < p->n_seqs; s++) {
            if (!take[s] || s % rr->n_ranks != rr->rank) continue;
            seqs[n] = (struct fwd_seq){.tokens = p->seq[s].tok + done[s], .n_new = take[s],
                                       .n_past = done[s], .blocks = blocks[s], .n_logits = take[s]};
            ids[n++] = s;
        }
        if (step == rr->fail_step && n > 0) seqs[0].tokens = &bad_token, seqs[0].n_new = 1;
        struct fwd_batch b = {.n_seqs = n, .seqs = seqs};
        int rc = rank_forward(r, &b, d_logits, err, sizeof err);
        if (step == rr->fail_step && n > 0) {
            if (rc != MS_EINVAL) rr->rc = -100;
            break; // the bad rank stops; the others must still have finished this step
        }
        if (rc) {
            fprintf(stderr, "rank %d step %d: %s\n", rr->rank, step, err);
            rr->rc = rc;
            break;
        }
        size_t row = 0, rows = 0;
        for (int i = 0; i < n; i++) rows += (size_t)take[ids[i]];
        bk->ops->download(bk, logits, d_logits, rows * V * sizeof(float));
        for (int i = 0; i < n; i++) {
            int s = ids[i];
            memcpy(rr->res->logits[s] + (size_t)done[s] * V, logits + row * V,
                   (size_t)take[s] * V * sizeof(float));
            row += (size_t)take[s];
        }
        for (int s = 0; s < p->n_seqs; s++) done[s] += take[s];
        rr->steps = step + 1;
        if (step == rr->stop_after) break;
    }
    free(logits);
    struct rank_stats st;
    rank_get_stats(r, &st);
    rr->padded_steps = st.padded_steps;
    rr->graph_steps = st.graph_steps;
    int eb, ee;
    rank_expert_range(r, &eb, &ee);
    for (int e = 0; e < rr->m->cfg.n_experts; e++) {
        if (e >= eb && e < ee) rr->expert_rows += st.expert_tokens[e];
        else if (st.expert_tokens[e]) rr->rc = -101; // only local experts run here
    }
    rank_destroy(r);
    bk->ops->free(bk, d_logits);
    kv_pool_destroy(bk, kv);
    if (!rr->bk) backend_destroy(bk);
    return NULL;
}

static void result_alloc(const struct model *m, const struct plan *p, struct result *res)
{
    for (int s = 0; s < p->n_seqs; s++) {
        res->logits[s] = calloc((size_t)p->seq[s].len * m->cfg.vocab_size, sizeof(float));
        assert_non_null(res->logits[s]);
    }
}

static void result_free(const struct plan *p, struct result *res)
{
    for (int s = 0; s < p->n_seqs; s++) free(res->logits[s]);
}

static uint64_t last_expert_rows; // summed over the ranks of the last run_plan
static uint64_t last_padded_steps, last_graph_steps; // rank 0's, in the last run_plan
static enum fwd_decode run_decode; // how run_plan's ranks run decode steps

static void run_plan(const struct model *m, const struct plan *p, int n_ranks, int threads,
                     enum dtype kv_dtype, struct result *res)
{
    last_expert_rows = 0;
    result_alloc(m, p, res);
    struct comm *comms[4] = {0};
    struct backend *made[4] = {0};
    char err[256];
    if (n_ranks > 1 && harness_device != BACKEND_DEVICE_CPU) {
        // NCCL: one GPU per rank, the group over their backends, made here.
        for (int i = 0; i < n_ranks; i++)
            if (rank_backend(i, threads, &made[i], err, sizeof err)) fail_msg("%s", err);
        if (backend_comm_create(harness_device, n_ranks, made, comms, err, sizeof err)) fail_msg("%s", err);
    } else if (n_ranks > 1) {
        assert_int_equal(backend_comm_create(BACKEND_DEVICE_CPU, n_ranks, NULL, comms, err, sizeof err), 0);
    }
    struct rank_run rr[4];
    pthread_t th[4];
    for (int i = 0; i < n_ranks; i++) {
        rr[i] = (struct rank_run){.m = m, .p = p, .res = res, .comm = comms[i], .bk = made[i], .rank = i,
                                  .n_ranks = n_ranks, .threads = threads, .kv_dtype = kv_dtype,
                                  .fail_step = -1, .stop_after = -1, .decode = run_decode};
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &rr[i]), 0);
    }
    for (int i = 0; i < n_ranks; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(rr[i].rc, 0);
        last_expert_rows += rr[i].expert_rows;
    }
    last_padded_steps = rr[0].padded_steps;
    last_graph_steps = rr[0].graph_steps;
    for (int i = 0; i < n_ranks; i++)
        if (comms[i]) comms[i]->ops->destroy(comms[i]);
    for (int i = 0; i < n_ranks; i++) // after the endpoints, which use them
        if (made[i]) backend_destroy(made[i]);
}

// Whether this machine runs R ranks of the harness's device: any number on
// the CPU, one GPU each on CUDA (NCCL).
static bool ranks_fit(int R)
{
    return harness_device == BACKEND_DEVICE_CPU || backend_device_count(harness_device) >= R;
}

static void assert_same_logits(const struct model *m, const struct plan *p, const struct result *a,
                               const struct result *b, const char *what)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    if (harness_device != BACKEND_DEVICE_CPU) {
        // The GPU's ops are built to be batch-invariant too (its matmuls sum
        // in one order whatever the rows around them; attention folds fixed
        // chunks of positions whatever the tile or split), so every logit
        // should match bitwise; until a GPU run has confirmed that, the test
        // holds them within 1e-2 of the row's largest |logit| and prints how
        // many differ at all.
        size_t differ = 0, total = 0;
        for (int s = 0; s < p->n_seqs; s++)
            for (int i = 0; i < p->seq[s].len; i++) {
                const float *x = a->logits[s] + i * V, *y = b->logits[s] + i * V;
                double mx = 1e-3;
                for (size_t k = 0; k < V; k++) mx = fmax(mx, fabs((double)x[k]));
                for (size_t k = 0; k < V; k++) {
                    differ += memcmp(&x[k], &y[k], sizeof x[k]) != 0;
                    if (!(fabs((double)x[k] - y[k]) <= 1e-2 * mx))
                        fail_msg("%s (GPU): sequence %d position %d logit %zu: %.9g vs %.9g", what,
                                 s, i, k, x[k], y[k]);
                }
                total += V;
            }
        fprintf(stderr, "%s (GPU): %zu of %zu logits differ bitwise\n", what, differ, total);
        return;
    }
    for (int s = 0; s < p->n_seqs; s++)
        for (int i = 0; i < p->seq[s].len; i++)
            if (memcmp(a->logits[s] + i * V, b->logits[s] + i * V, V * sizeof(float))) {
                size_t k = 0;
                while (a->logits[s][i * V + k] == b->logits[s][i * V + k]) k++;
                fail_msg("%s: sequence %d position %d differs first at logit %zu: %.9g vs %.9g", what,
                         s, i, k, a->logits[s][i * V + k], b->logits[s][i * V + k]);
            }
}

// Each sequence alone in one chunk: the reference every other plan meets.
static void reference_plan(const char *name, struct plan *p)
{
    base_plan(name, p);
    p->serial = true;
    for (int s = 0; s < N_SEQS; s++) set_chunks(&p->seq[s], p->seq[s].len, 0, 0, 0, 1, 0);
}

static void chunk_plan(const char *name, struct plan *p)
{
    base_plan(name, p);
    p->serial = true;
    for (int s = 0; s < N_SEQS; s++) set_chunks(&p->seq[s], 1, 7, 16, 33, 4, 0);
}

// Sequences arriving at different steps, each a prefill chunk then decode
// rows, so steps mix prefill chunks and single decode tokens.
static void mixed_plan(const char *name, struct plan *p)
{
    base_plan(name, p);
    set_chunks(&p->seq[0], 5, 1, 1, 1, 4, 0);
    set_chunks(&p->seq[1], 16, 1, 1, 1, 4, 1);
    set_chunks(&p->seq[2], 33, 40, 1, 1, 4, 2);
    set_chunks(&p->seq[3], 7, 1, 1, 1, 4, 4);
}

// Each prompt in one chunk, then its continuation one token a step; the
// sequences start two steps apart and end at different steps, so decode
// steps hold 4, 3, 2 and 1 sequences (padded to 4, 4, 2, 1), across ranks
// unevenly, some steps mixing a prompt with decode rows.
static void decode_plan(const char *name, struct plan *p)
{
    base_plan(name, p);
    for (int s = 0; s < N_SEQS; s++) {
        set_chunks(&p->seq[s], 1, 0, 0, 0, 1, 2 * s);
        p->seq[s].first = p->seq[s].prompt_len;
    }
}

static void check_plan_against_reference(const struct model *m, const char *name,
                                         void (*make)(const char *, struct plan *), int n_ranks,
                                         int threads, enum dtype kv, const char *what)
{
    struct plan ref, p;
    struct result a, b;
    reference_plan(name, &ref);
    make(name, &p);
    const enum fwd_decode decode = run_decode;
    run_decode = FWD_DECODE_EAGER; // the reference runs every step as it comes
    run_plan(m, &ref, 1, 1, kv, &a);
    run_decode = decode;
    uint64_t ref_rows = last_expert_rows;
    run_plan(m, &p, n_ranks, threads, kv, &b);
    assert_same_logits(m, &ref, &a, &b, what);
    // Every token met its top-k experts once per MoE layer, whichever rank ran them.
    assert_int_equal(last_expert_rows, ref_rows);
    result_free(&ref, &a);
    result_free(&p, &b);
}

static void chunked_prefill_gives_the_same_logits(void **state)
{
    (void)state;
    check_plan_against_reference(moe, "qwen3moe-v2048", chunk_plan, 1, 1, DTYPE_F32, "moe chunks 1/7/16/33");
    check_plan_against_reference(dense, "qwen3-dense-v2048", chunk_plan, 1, 1, DTYPE_F32, "dense chunks");
    check_plan_against_reference(moe, "qwen3moe-v2048", chunk_plan, 1, 1, DTYPE_BF16, "moe chunks, bf16 KV");
}

static void mixed_batches_give_the_same_logits_per_sequence(void **state)
{
    (void)state;
    check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 1, 1, DTYPE_F32, "moe mixed batch");
    check_plan_against_reference(dense, "qwen3-dense-v2048", mixed_plan, 1, 1, DTYPE_F32, "dense mixed batch");
    check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 1, 1, DTYPE_BF16, "moe mixed, bf16 KV");
}

static void thread_count_does_not_change_logits(void **state)
{
    (void)state;
    check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 1, 3, DTYPE_F32, "moe on 3 threads");
}

// Ranks own sequences s % R and experts [E r / R, E (r+1) / R); with 3 ranks
// the third has nothing to do in the first steps and still joins them.
static void expert_parallel_ranks_give_the_same_logits(void **state)
{
    (void)state;
    if (!ranks_fit(2)) skip(); // one GPU: NCCL's own suite is tests/model/test_comm.c
    check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 2, 1, DTYPE_F32, "2 ranks");
    check_plan_against_reference(dense, "qwen3-dense-v2048", mixed_plan, 2, 1, DTYPE_F32, "dense 2 ranks");
    if (!ranks_fit(3)) return;
    check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 3, 1, DTYPE_F32, "3 ranks");
    check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 3, 2, DTYPE_BF16, "3 ranks, bf16 KV");
}

// Decode steps padded to their bucket (padding sequences in the scratch
// block, fixed-size exchanges, rows of every rank routed everywhere) give
// the same logits, bitwise, as every sequence alone; on 1, 2 and 3 ranks,
// dense and MoE, interleaved with unpadded prefill steps. On a GPU the
// padded steps replay graphs recorded per bucket, their NCCL exchanges
// inside them where the machine has a GPU for each rank.
static void padded_decode_steps_give_the_same_logits(void **state)
{
    (void)state;
    const bool gpu = harness_device != BACKEND_DEVICE_CPU;
    run_decode = gpu ? FWD_DECODE_GRAPHS : FWD_DECODE_PADDED;
    const char *moe_name = "qwen3moe-v2048", *dense_name = "qwen3-dense-v2048";
    check_plan_against_reference(moe, moe_name, decode_plan, 1, 1, DTYPE_F32, "padded decode");
    assert_true(last_padded_steps > 10); // it did pad
    if (gpu) assert_true(last_graph_steps > 5); // and replayed graphs
    check_plan_against_reference(moe, moe_name, mixed_plan, 1, 2, DTYPE_BF16, "padded, mixed");
    check_plan_against_reference(dense, dense_name, decode_plan, 1, 1, DTYPE_F32, "dense padded");
    if (ranks_fit(2)) {
        check_plan_against_reference(moe, moe_name, decode_plan, 2, 1, DTYPE_F32, "padded, 2 ranks");
        assert_true(last_padded_steps > 10);
        if (gpu) assert_true(last_graph_steps > 5);
        check_plan_against_reference(dense, dense_name, mixed_plan, 2, 1, DTYPE_F32, "dense padded, 2 ranks");
    }
    if (ranks_fit(3))
        check_plan_against_reference(moe, moe_name, mixed_plan, 3, 1, DTYPE_BF16, "padded, 3 ranks");
}

// Rank 1 is handed a token outside the vocabulary at step 3: it reports the
// error but runs the step empty, so rank 0 completes the step with its own
// sequences' logits unchanged.
static void a_bad_batch_on_one_rank_does_not_hang_the_others(void **state)
{
    (void)state;
    if (harness_device != BACKEND_DEVICE_CPU) skip();
    struct plan ref, p;
    reference_plan("qwen3moe-v2048", &ref);
    mixed_plan("qwen3moe-v2048", &p);
    p.n_seqs = 2; // sequence 0 on rank 0, sequence 1 on rank 1
    ref.n_seqs = 2;
    struct result a, b;
    run_plan(moe, &ref, 1, 1, DTYPE_F32, &a);
    result_alloc(moe, &p, &b);
    struct comm *comms[2];
    char err[256];
    assert_int_equal(backend_comm_create(BACKEND_DEVICE_CPU, 2, NULL, comms, err, sizeof err), 0);
    struct rank_run rr[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        rr[i] = (struct rank_run){.m = moe, .p = &p, .res = &b, .comm = comms[i], .rank = i,
                                  .n_ranks = 2, .threads = 1, .kv_dtype = DTYPE_F32,
                                  .fail_step = i == 1 ? 3 : -1, .stop_after = 3};
    }
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, rank_main, &rr[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_int_equal(rr[0].rc, 0);
    assert_int_equal(rr[1].rc, 0);
    assert_int_equal(rr[0].steps, 4);
    const size_t V = (size_t)moe->cfg.vocab_size;
    // Sequence 0's chunks 5, 1, 1, 1 cover positions 0..7 in steps 0..3.
    assert_memory_equal(a.logits[0], b.logits[0], (size_t)8 * V * sizeof(float));
    for (int i = 0; i < 2; i++) comms[i]->ops->destroy(comms[i]);
    result_free(&ref, &a);
    result_free(&p, &b);
}

// The formats the projections are quantized to at load.
static const enum quant_format quant_formats[] = {QUANT_INT4, QUANT_INT8, QUANT_FP8};

// The golden MoE quantized to f at load, held to the invariants: chunked
// prompts, a mixed batch on 3 threads (KV in kv_threads), 2 ranks (KV in
// kv_ranks); prefix names the case in a failure.
static void check_quantized_model(enum quant_format f, const char *prefix, enum dtype kv_threads,
                                  enum dtype kv_ranks)
{
    struct model *q = load_as("qwen3moe-v2048", f);
    assert_non_null(q);
    assert_int_equal(q->quant, f);
    char what[64];
    snprintf(what, sizeof what, "%s%s chunks", prefix, quant_format_name(f));
    check_plan_against_reference(q, "qwen3moe-v2048", chunk_plan, 1, 1, DTYPE_F32, what);
    snprintf(what, sizeof what, "%s%s mixed batch on 3 threads", prefix, quant_format_name(f));
    check_plan_against_reference(q, "qwen3moe-v2048", mixed_plan, 1, 3, kv_threads, what);
    snprintf(what, sizeof what, "%s%s on 2 ranks", prefix, quant_format_name(f));
    check_plan_against_reference(q, "qwen3moe-v2048", mixed_plan, 2, 1, kv_ranks, what);
    model_destroy(q);
}

// The quantized matmuls keep every output a fixed function of its row: the
// same invariants, bitwise, with the projections in int4, int8 and fp8.
static void quantized_models_keep_the_invariants(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof quant_formats / sizeof quant_formats[0]; i++)
        check_quantized_model(quant_formats[i], "", DTYPE_F32, DTYPE_BF16);
}

// An act-order GPTQ checkpoint of the golden MoE's shape (groups of 16, so
// every matrix's inputs change groups): gathering each row's inputs into
// its matrix's order keeps the invariants, bitwise.
static void act_order_models_keep_the_invariants(void **state)
{
    (void)state;
    if (harness_device != BACKEND_DEVICE_CPU) skip(); // the CUDA backend refuses act-order checkpoints
    struct makemodel_spec s;
    char err[512], dir[64];
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    s.vocab_size = moe->cfg.vocab_size;
    s.hidden_size = moe->cfg.hidden_size;
    s.n_layers = moe->cfg.n_layers;
    s.n_heads = moe->cfg.n_heads;
    s.n_kv_heads = moe->cfg.n_kv_heads;
    s.head_dim = moe->cfg.head_dim;
    s.moe_intermediate_size = moe->cfg.moe_intermediate_size;
    s.intermediate_size = moe->cfg.intermediate_size;
    s.n_experts = moe->cfg.n_experts;
    s.n_experts_per_tok = moe->cfg.n_experts_per_tok;
    s.quant = QUANT_METHOD_GPTQ;
    s.quant_group = 16;
    s.quant_act_order = true;
    snprintf(dir, sizeof dir, "/tmp/moeserve-actorder-XXXXXX");
    assert_non_null(mkdtemp(dir));
    if (makemodel_write(&s, dir, 9, NULL, err, sizeof err)) fail_msg("%s", err);
    struct model *q;
    const struct model_load_opts o = {.cache_dir = "none"};
    if (model_load_opts(dir, &o, &q, err, sizeof err)) fail_msg("%s", err);
    assert_true(q->n_perms > 0);
    check_plan_against_reference(q, "qwen3moe-v2048", chunk_plan, 1, 1, DTYPE_F32, "act-order chunks");
    check_plan_against_reference(q, "qwen3moe-v2048", mixed_plan, 1, 3, DTYPE_F32, "act-order mixed batch on 3 threads");
    check_plan_against_reference(q, "qwen3moe-v2048", mixed_plan, 2, 1, DTYPE_BF16, "act-order on 2 ranks");
    model_destroy(q);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

// Every test starts with decode steps run as they come.
static int eager_decode(void **state)
{
    (void)state;
    run_decode = FWD_DECODE_EAGER;
    return 0;
}

// Activations rounded to bf16 (the avx512_bf16 table) change the numbers,
// not what they depend on: the same invariants, bitwise; also for int4,
// int8 and fp8 weights, which that table multiplies over the rounded
// activations too (on VDPBF16PS or the tile unit).
static void bf16_activations_keep_the_invariants(void **state)
{
    (void)state;
    if (harness_device != BACKEND_DEVICE_CPU) skip();
    const char *v[8];
    const int n = backend_variants(BACKEND_DEVICE_CPU, v, 8);
    for (int i = 0; i < n; i++) {
        if (!backend_variant_bf16_activations(BACKEND_DEVICE_CPU, v[i])) continue;
        variant = v[i];
        check_plan_against_reference(moe, "qwen3moe-v2048", chunk_plan, 1, 1, DTYPE_F32, "bf16 chunks");
        check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 1, 3, DTYPE_BF16,
                                     "bf16 mixed batch on 3 threads");
        check_plan_against_reference(moe, "qwen3moe-v2048", mixed_plan, 2, 1, DTYPE_F32, "bf16 on 2 ranks");
        check_plan_against_reference(dense, "qwen3-dense-v2048", mixed_plan, 1, 2, DTYPE_F32,
                                     "bf16 dense mixed batch");
        for (size_t f = 0; f < sizeof quant_formats / sizeof quant_formats[0]; f++)
            check_quantized_model(quant_formats[f], "bf16 ", DTYPE_BF16, DTYPE_F32);
        variant = NULL;
        fprintf(stderr, "%s kernels keep the invariants\n", v[i]);
        return;
    }
    skip(); // no table with bf16 activations on this CPU
}

int main(void)
{
    const int pick = harness_pick_device();
    if (pick) return pick;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(chunked_prefill_gives_the_same_logits, eager_decode),
        cmocka_unit_test_setup(mixed_batches_give_the_same_logits_per_sequence, eager_decode),
        cmocka_unit_test_setup(thread_count_does_not_change_logits, eager_decode),
        cmocka_unit_test_setup(expert_parallel_ranks_give_the_same_logits, eager_decode),
        cmocka_unit_test_setup(padded_decode_steps_give_the_same_logits, eager_decode),
        cmocka_unit_test_setup(a_bad_batch_on_one_rank_does_not_hang_the_others, eager_decode),
        cmocka_unit_test_setup(quantized_models_keep_the_invariants, eager_decode),
        cmocka_unit_test_setup(act_order_models_keep_the_invariants, eager_decode),
        cmocka_unit_test_setup(bf16_activations_keep_the_invariants, eager_decode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
