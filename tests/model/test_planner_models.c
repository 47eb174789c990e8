// Pins the planner against real configs and checkpoints: config_load of the
// Qwen3 fixtures gives the figures issue 6 states, and for every model we can
// load the planner's weight and decode-step bytes equal what model_load maps,
// and a rank's share is what the engine sizes a GPU with.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/makemodel.h"
#include "model/model.h"
#include "model/planner.h"

static void load_config(const char *sub, struct model_config *c)
{
    const char *data = getenv("MOESERVE_TEST_DATA");
    assert_non_null(data);
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", data, sub);
    int rc = config_load(path, c, err, sizeof err);
    if (rc) fail_msg("%s", err);
}

static void qwen3_30b_a3b_config_json_gives_the_issue_figures(void **state)
{
    (void)state;
    struct model_config *c = malloc(sizeof *c);
    assert_non_null(c);
    load_config("qwen3-30b-a3b/config.json", c);
    struct plan_params p;
    char err[512];
    assert_int_equal(plan_count_params(c, &p, err, sizeof err), 0);
    assert_int_equal(p.total, 30532122624ull);
    assert_int_equal(p.active, 3353032704ull);
    assert_int_equal(p.moe_layers, 48);
    assert_int_equal(plan_kv_bytes_per_token(c, PLAN_BF16), 96 * 1024);
    uint64_t tp2;
    assert_int_equal(plan_weight_bytes(c, PLAN_BF16, PLAN_TP, 2, &tp2, err, sizeof err), 0);
    assert_true(fabs(tp2 / (1024.0 * 1024 * 1024) - 28.5) < 0.1);
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_device d;
    assert_int_equal(plan_device_compute(c, &o, PLAN_TP, 1, &d, err, sizeof err), 0);
    assert_true(fabs(d.kv_bytes / (1024.0 * 1024 * 1024) - 13.0) < 0.5);
    assert_true(d.kv_tokens > 135000 && d.kv_tokens < 145000);
    free(c);
}

static void qwen3_0_6b_config_json_is_dense_and_tied(void **state)
{
    (void)state;
    struct model_config *c = malloc(sizeof *c);
    assert_non_null(c);
    load_config("qwen3-0.6b", c);
    struct plan_params p;
    char err[512];
    assert_int_equal(plan_count_params(c, &p, err, sizeof err), 0);
    assert_int_equal(p.total, 596049920ull);
    assert_int_equal(p.lm_head, 0);
    assert_int_equal(p.moe_layers, 0);
    free(c);
}

// What the planner predicts from the config alone equals the bytes of the
// tensors model_load binds, and its batch-1 decode traffic equals
// model_active_bytes (k experts per layer, one embedding row, lm_head).
static void check_against_loaded(const char *dir)
{
    char err[1024];
    struct model *m = NULL;
    int rc = model_load(dir, &m, err, sizeof err);
    if (rc) fail_msg("%s: %s", dir, err);
    uint64_t w;
    assert_int_equal(plan_weight_bytes(&m->cfg, PLAN_BF16, PLAN_TP, 1, &w, err, sizeof err), 0);
    assert_int_equal(w, m->weight_bytes);
    double step;
    assert_int_equal(plan_decode_step_bytes(&m->cfg, PLAN_BF16, PLAN_TP, 1, 1, &step, err, sizeof err), 0);
    assert_true(fabs(step - (double)model_active_bytes(m)) < 1e-6 * step);
    struct plan_params p;
    assert_int_equal(plan_count_params(&m->cfg, &p, err, sizeof err), 0);
    assert_int_equal(2 * p.total, m->weight_bytes);
    model_destroy(m);
}

static void planner_bytes_equal_loaded_checkpoints(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA"), *tiny = getenv("MOESERVE_TINY_MODEL");
    assert_non_null(data);
    assert_non_null(tiny);
    char path[1024];
    snprintf(path, sizeof path, "%s/qwen3moe-v2048", data);
    check_against_loaded(path);
    snprintf(path, sizeof path, "%s/qwen3-dense-v2048", data);
    check_against_loaded(path);
    check_against_loaded(tiny);
}

// A rank holds the replicated tensors and its experts as loaded: over the
// ranks of forward.c's split the busiest one is what the planner counts for
// dp-ep (bf16), the ranks together hold the model once plus the replicated
// part R - 1 more times, and a checkpoint quantized in groups of 32 holds
// what the planner counts from its config (its own groups, not
// QUANT_GROUP's); the engine hands the planner the model's own count
// (plan_opts.weight_bytes) all the same.
static void ranks_hold_their_experts_as_loaded(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    assert_non_null(data);
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/qwen3moe-v2048", data);
    struct model *m;
    if (model_load(path, &m, err, sizeof err)) fail_msg("%s", err);
    const int E = m->cfg.n_experts;
    const uint64_t shared = model_rank_weight_bytes(m, 0, 0);
    assert_int_equal(model_rank_weight_bytes(m, 0, E), m->weight_bytes);
    for (int R = 1; R <= 3; R++) {
        uint64_t busiest = 0, sum = 0, planned;
        for (int r = 0; r < R; r++) {
            const uint64_t b = model_rank_weight_bytes(m, E * r / R, E * (r + 1) / R);
            sum += b;
            if (b > busiest) busiest = b;
        }
        assert_int_equal(sum, m->weight_bytes + (uint64_t)(R - 1) * shared);
        assert_int_equal(plan_weight_bytes(&m->cfg, PLAN_BF16, PLAN_DP_EP, R, &planned, err, sizeof err), 0);
        assert_int_equal(busiest, planned);
    }
    model_destroy(m);

    char dir[] = "/tmp/moeserve-planq-XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct makemodel_spec s;
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    s.vocab_size = 2048;
    s.quant = QUANT_METHOD_GPTQ;
    s.quant_group = 32;
    if (makemodel_write(&s, dir, 5, NULL, err, sizeof err)) fail_msg("%s", err);
    if (model_load(dir, &m, err, sizeof err)) fail_msg("%s", err);
    uint64_t estimate;
    assert_int_equal(plan_weight_bytes(&m->cfg, PLAN_INT4, PLAN_TP, 1, &estimate, err, sizeof err), 0);
    const uint64_t held = model_rank_weight_bytes(m, 0, m->cfg.n_experts);
    assert_int_equal(held, m->weight_bytes);
    assert_int_equal(held, estimate);
    struct plan_opts o;
    plan_opts_default(&o);
    o.weight_dtype = PLAN_INT4;
    o.weight_bytes = held;
    struct plan_device d;
    assert_int_equal(plan_device_compute(&m->cfg, &o, PLAN_DP_EP, 1, &d, err, sizeof err), 0);
    assert_int_equal(d.weight_bytes, held);
    model_destroy(m);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
}

// The planner's KV bytes per token are the forward pass's block bytes over
// its 16 tokens, for every config and KV dtype the engine allocates.
static void kv_per_token_equals_the_forward_pass_block_over_16(void **state)
{
    (void)state;
    const char *dirs[] = {"qwen3-30b-a3b", "qwen3-0.6b", "qwen3moe-v2048", "qwen3-dense-v2048"};
    struct model_config *c = malloc(sizeof *c);
    assert_non_null(c);
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        load_config(dirs[i], c);
        assert_int_equal(plan_kv_bytes_per_token(c, PLAN_BF16) * KV_BLOCK_TOKENS,
                         kv_block_bytes(c, DTYPE_BF16));
        assert_int_equal(plan_kv_bytes_per_token(c, PLAN_F32) * KV_BLOCK_TOKENS,
                         kv_block_bytes(c, DTYPE_F32));
    }
    assert_int_equal(kv_block_bytes(c, DTYPE_BF16) % KV_BLOCK_TOKENS, 0);
    load_config("qwen3-30b-a3b", c);
    assert_int_equal(kv_block_bytes(c, DTYPE_BF16) / KV_BLOCK_TOKENS, 96 * 1024);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen3_30b_a3b_config_json_gives_the_issue_figures),
        cmocka_unit_test(qwen3_0_6b_config_json_is_dense_and_tied),
        cmocka_unit_test(planner_bytes_equal_loaded_checkpoints),
        cmocka_unit_test(ranks_hold_their_experts_as_loaded),
        cmocka_unit_test(kv_per_token_equals_the_forward_pass_block_over_16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
