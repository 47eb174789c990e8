// Pins the forward pass's API edges: KV pool and rank creation refuse what
// cannot work (with a sentence), a malformed step is refused without
// touching the cache, an empty step is valid, and rank_get_stats counts
// steps, tokens and the tokens each local expert processed.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fwd_harness.h"
#include "base/base.h"

static char dir[1024];

static int setup(void **state)
{
    (void)state;
    const char *d = getenv("MOESERVE_TEST_DATA");
    if (!d) return -1;
    snprintf(dir, sizeof dir, "%s/qwen3moe-v2048", d);
    return 0;
}

static void pools_and_ranks_refuse_impossible_settings(void **state)
{
    (void)state;
    struct model *m;
    char err[512];
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    struct backend *b;
    struct backend_opts bo = {.n_threads = 1};
    assert_int_equal(backend_create(BACKEND_DEVICE_CPU, &bo, &b, err, sizeof err), 0);
    struct kv_pool *kv;
    assert_int_equal(kv_pool_create(b, &m->cfg, DTYPE_F32, 0, &kv, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "0 blocks"));
    assert_int_equal(kv_pool_create(b, &m->cfg, DTYPE_F32, 1 << 30, &kv, err, sizeof err) < 0, 1);
    assert_int_equal(kv_pool_create(b, &m->cfg, DTYPE_F32, 4, &kv, err, sizeof err), 0);
    // K and V, 3 layers, 2 KV heads, 16 tokens, head_dim 32, 4 bytes.
    assert_int_equal(kv->block_bytes, 2 * 3 * 2 * 16 * 32 * 4);
    assert_int_equal(kv_block_bytes(&m->cfg, DTYPE_BF16), 2 * 3 * 2 * 16 * 32 * 2);
    struct rank *r;
    struct rank_opts o = {.rank = 0, .n_ranks = 2, .max_batch_tokens = 8, .max_batch_seqs = 1};
    assert_int_equal(rank_create(m, b, kv, &o, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "communicator"));
    o = (struct rank_opts){.rank = 0, .n_ranks = 1, .max_batch_tokens = 0, .max_batch_seqs = 1};
    assert_int_equal(rank_create(m, b, kv, &o, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "max_batch_tokens"));
    o.max_batch_tokens = 8;
    assert_int_equal(rank_create(m, NULL, kv, &o, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "backend"));
    struct backend *bad;
    bo.n_threads = -2;
    assert_int_equal(backend_create(BACKEND_DEVICE_CPU, &bo, &bad, err, sizeof err), MS_EINVAL);
    kv_pool_destroy(b, kv);
    backend_destroy(b);
    model_destroy(m);
}

static void malformed_steps_are_refused_and_empty_steps_are_fine(void **state)
{
    (void)state;
    struct harness h;
    assert_int_equal(harness_open(&h, dir, DTYPE_F32, 8, 1, 16, 2), 0);
    const int V = h.m->cfg.vocab_size;
    float *logits = malloc((size_t)2 * V * sizeof *logits);
    char err[512];
    int32_t toks[20] = {1, 2, 3}, blocks[2] = {0, 1}, bad_blocks[1] = {8};
    struct {
        struct fwd_seq s;
        int n_seqs;
        int rc;
        const char *needle;
    } cases[] = {
        {{.tokens = toks, .n_new = 0, .blocks = blocks}, 1, MS_EINVAL, "at least one"},
        {{.tokens = toks, .n_new = 1, .n_past = -1, .blocks = blocks}, 1, MS_ETOOLONG, "position"},
        {{.tokens = toks, .n_new = 1, .n_past = 4096, .blocks = blocks}, 1, MS_ETOOLONG,
         "4096 positions"},
        {{.tokens = toks, .n_new = 2, .blocks = blocks, .n_logits = 3}, 1, MS_EINVAL, "logits for 3"},
        {{.tokens = toks, .n_new = 1, .blocks = bad_blocks}, 1, MS_EINVAL, "blocks 0..7"},
        {{.tokens = toks, .n_new = 17, .blocks = blocks}, 1, MS_EINVAL, "max_batch_tokens"},
        {{.tokens = toks, .n_new = 1, .blocks = blocks}, 3, MS_EINVAL, "at most 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fwd_seq seqs[3] = {cases[i].s, cases[i].s, cases[i].s};
        struct fwd_batch b = {.n_seqs = cases[i].n_seqs, .seqs = seqs};
        err[0] = 0;
        int rc = harness_forward(&h, &b, logits, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].needle))
            fail_msg("case %zu: rc %d, err '%s'", i, rc, err);
    }
    toks[0] = V;
    struct fwd_seq s = {.tokens = toks, .n_new = 1, .blocks = blocks, .n_logits = 1};
    struct fwd_batch b = {.n_seqs = 1, .seqs = &s};
    assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "vocabulary"));
    assert_int_equal(harness_forward(&h, &b, NULL, err, sizeof err), MS_EINVAL);
    struct fwd_batch empty = {.n_seqs = 0};
    assert_int_equal(harness_forward(&h, &empty, NULL, err, sizeof err), 0);
    // A rank sized for 32 positions (the engine's max_model_len, below the
    // model's 4096): its block tables hold 2 blocks a sequence, and a step
    // past position 32 is refused, not written past them.
    rank_destroy(h.r);
    struct rank_opts o = {.rank = 0, .n_ranks = 1, .max_batch_tokens = 16, .max_batch_seqs = 2, .max_seq_len = 32};
    assert_int_equal(rank_create(h.m, h.b, h.kv, &o, &h.r, err, sizeof err), 0);
    toks[0] = 1;
    s = (struct fwd_seq){.tokens = toks, .n_new = 1, .n_past = 31, .blocks = blocks, .n_logits = 1};
    assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), 0);
    s.n_past = 32;
    assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), MS_ETOOLONG);
    assert_non_null(strstr(err, "32 positions"));
    free(logits);
    harness_close(&h);
}

static void stats_count_steps_tokens_decode_steps_and_expert_rows(void **state)
{
    (void)state;
    struct harness h;
    assert_int_equal(harness_open(&h, dir, DTYPE_F32, 8, 2, 16, 2), 0);
    const struct model_config *c = &h.m->cfg;
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    char err[512];
    int32_t toks[7] = {5, 6, 7, 8, 9, 10, 11}, blocks[1] = {3};
    struct fwd_seq s = {.tokens = toks, .n_new = 7, .blocks = blocks, .n_logits = 1};
    struct fwd_batch b = {.n_seqs = 1, .seqs = &s};
    assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), 0);
    struct rank_stats st;
    rank_get_stats(h.r, &st);
    assert_false(st.last_step_decode);
    s = (struct fwd_seq){.tokens = toks, .n_new = 1, .n_past = 7, .blocks = blocks, .n_logits = 1};
    assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), 0);
    rank_get_stats(h.r, &st);
    assert_true(st.last_step_decode);
    assert_int_equal(st.steps, 2);
    assert_int_equal(st.tokens, 8);
    // The second step was a decode step: its phases are a part of the whole.
    assert_int_equal(st.decode_steps, 1);
    for (int f = 0; f < FWD_PHASES; f++)
        assert_true(st.decode_phase_seconds[f] > 0 && st.decode_phase_seconds[f] < st.phase_seconds[f]);
    assert_true(st.last_step_seconds > 0);
    assert_true(st.last_a2a_seconds == 0); // one rank: no exchanges
    uint64_t sum = 0;
    for (int e = 0; e < c->n_experts; e++) sum += st.expert_tokens[e];
    assert_int_equal(sum, (uint64_t)8 * c->n_experts_per_tok * c->n_layers);
    int b0, e0;
    rank_expert_range(h.r, &b0, &e0);
    assert_int_equal(b0, 0);
    assert_int_equal(e0, c->n_experts);
    free(logits);
    harness_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pools_and_ranks_refuse_impossible_settings),
        cmocka_unit_test(malformed_steps_are_refused_and_empty_steps_are_fine),
        cmocka_unit_test(stats_count_steps_tokens_decode_steps_and_expert_rows),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
