// Pins the forward pass to an implementation no one here wrote: for every
// case in tests/data/*/expected.json (llama.cpp in fp32), every greedy token
// exactly and every top-5 logprob within tolerance_logprob, with an fp32 KV
// cache; and the bf16 KV cache stays close to it.
//
// Registered again by tests/gpu/ with MOESERVE_TEST_DEVICE=cuda: the CUDA
// backend multiplies in bf16 (activations rounded to 8 significant bits,
// fp32 accumulation), so on the GPU every case is held to the bf16 KV
// cache's bounds below (mean |diff| of the logprobs under 0.05, at most one
// greedy token in 20 flipped) instead of fp32's exactness.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>

#include "fwd_harness.h"

static const char *data_dir;

static int setup(void **state)
{
    (void)state;
    data_dir = getenv("MOESERVE_TEST_DATA");
    return data_dir ? 0 : -1;
}

struct golden_stats {
    int tokens, logprobs, token_mismatches;
    double worst, sum;
};

// Greedy decoding of every case, prompts prefilled in chunks of `chunk`.
static void check_golden_on(const char *variant, const char *name, enum dtype kv_dtype, int chunk,
                            double tol_scale, bool exact_tokens, struct golden_stats *st)
{
    char dir[1024], path[1100], err[512];
    snprintf(dir, sizeof dir, "%s/%s", data_dir, name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) fail_msg("%s: %s", path, je.text);
    double tol = json_number_value(json_object_get(root, "tolerance_logprob")) * tol_scale;
    assert_true(tol > 0);
    struct harness h;
    assert_int_equal(harness_open_on(&h, variant, dir, kv_dtype, 512, 0, 1024, 4), 0);
    const int V = h.m->cfg.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    double *lp = malloc((size_t)V * sizeof *lp);
    assert_non_null(logits);
    assert_non_null(lp);
    json_t *cases = json_object_get(root, "cases");
    size_t ci;
    json_t *c;
    memset(st, 0, sizeof *st);
    json_array_foreach(cases, ci, c) {
        json_t *pj = json_object_get(c, "prompt_ids"), *toks = json_object_get(c, "tokens");
        int n_prompt = (int)json_array_size(pj), n_gen = (int)json_array_size(toks);
        int32_t *seq = malloc((size_t)(n_prompt + n_gen) * sizeof *seq);
        assert_non_null(seq);
        for (int i = 0; i < n_prompt; i++) seq[i] = (int32_t)json_integer_value(json_array_get(pj, (size_t)i));
        h.next_block = 0;
        int32_t *blocks = harness_blocks(&h, n_prompt + n_gen);
        int n_past = 0;
        while (n_past < n_prompt) {
            int n = n_prompt - n_past < chunk ? n_prompt - n_past : chunk;
            struct fwd_seq s = {.tokens = seq + n_past, .n_new = n, .n_past = n_past, .blocks = blocks,
                                .n_logits = n_past + n == n_prompt};
            struct fwd_batch b = {.n_seqs = 1, .seqs = &s};
            assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), 0);
            n_past += n;
        }
        for (int g = 0; g < n_gen; g++) {
            json_t *tj = json_array_get(toks, (size_t)g);
            int want = (int)json_integer_value(json_object_get(tj, "id"));
            int got = argmax_lowest(logits, V);
            log_softmax(logits, V, lp);
            json_t *top = json_object_get(tj, "top_logprobs");
            size_t ti;
            json_t *e;
            json_array_foreach(top, ti, e) {
                int id = (int)json_integer_value(json_object_get(e, "id"));
                double want_lp = json_number_value(json_object_get(e, "logprob"));
                double d = fabs(lp[id] - want_lp);
                if (d > st->worst) st->worst = d;
                st->sum += d;
                if (d > tol)
                    fail_msg("%s case %zu (prompt %d tokens) step %d: logprob of %d is %.6f, "
                             "expected %.6f (|diff| %.2e > %.1e)", name, ci, n_prompt, g, id,
                             lp[id], want_lp, d, tol);
                st->logprobs++;
            }
            st->token_mismatches += got != want;
            if (exact_tokens && got != want)
                fail_msg("%s case %zu (prompt %d tokens) step %d: greedy token %d, expected %d", name,
                         ci, n_prompt, g, got, want);
            st->tokens++;
            // Continue along the reference's path either way.
            seq[n_prompt + g] = want;
            if (g + 1 < n_gen) {
                struct fwd_seq s = {.tokens = seq + n_prompt + g, .n_new = 1, .n_past = n_prompt + g,
                                    .blocks = blocks, .n_logits = 1};
                struct fwd_batch b = {.n_seqs = 1, .seqs = &s};
                assert_int_equal(harness_forward(&h, &b, logits, err, sizeof err), 0);
            }
        }
        free(blocks);
        free(seq);
    }
    free(logits);
    free(lp);
    harness_close(&h);
    json_decref(root);
}

static void check_golden(const char *name, enum dtype kv_dtype, int chunk, double tol_scale,
                         bool exact_tokens, struct golden_stats *st)
{
    if (harness_device == BACKEND_DEVICE_CUDA) {
        check_golden_on(NULL, name, kv_dtype, chunk, 1000.0, false, st);
        fprintf(stderr, "%s on the GPU: worst |diff| %.2e, mean %.2e, %d of %d tokens differ\n",
                name, st->worst, st->sum / st->logprobs, st->token_mismatches, st->tokens);
        assert_true(st->sum / st->logprobs < 0.05);
        assert_true(st->token_mismatches <= st->tokens / 20);
        return;
    }
    check_golden_on(NULL, name, kv_dtype, chunk, tol_scale, exact_tokens, st);
}

static void moe_matches_reference_with_fp32_kv(void **state)
{
    (void)state;
    struct golden_stats st;
    check_golden("qwen3moe-v2048", DTYPE_F32, 1 << 20, 1.0, true, &st);
    fprintf(stderr, "qwen3moe-v2048: %d greedy tokens, %d logprobs, worst |diff| %.2e\n", st.tokens,
            st.logprobs, st.worst);
    assert_true(st.tokens > 100);
}

static void dense_matches_reference_with_fp32_kv(void **state)
{
    (void)state;
    struct golden_stats st;
    check_golden("qwen3-dense-v2048", DTYPE_F32, 1 << 20, 1.0, true, &st);
    fprintf(stderr, "qwen3-dense-v2048: %d greedy tokens, %d logprobs, worst |diff| %.2e\n",
            st.tokens, st.logprobs, st.worst);
    assert_true(st.tokens > 100);
}

// Chunked prefill reaches the same numbers (the invariance tests pin bitwise
// equality; this pins it against the reference too).
static void moe_matches_reference_in_chunks_of_7(void **state)
{
    (void)state;
    struct golden_stats st;
    check_golden("qwen3moe-v2048", DTYPE_F32, 7, 1.0, true, &st);
}

// bf16 K/V round every cached value by up to 2^-9. This checkpoint is
// sensitive to it (scaled for peaked distributions: scalar, AVX2 and AVX-512
// all measure a mean |diff| of 1.8e-2, a worst of 0.84, 2 of 168 greedy
// tokens flipped), so the bf16 path is held to its typical error, which a
// wrong conversion or layout would exceed by orders of magnitude.
static void moe_stays_close_with_bf16_kv(void **state)
{
    (void)state;
    struct golden_stats st;
    check_golden("qwen3moe-v2048", DTYPE_BF16, 1 << 20, 1000.0, false, &st);
    fprintf(stderr, "qwen3moe-v2048 with bf16 KV: worst |diff| %.2e, mean %.2e, %d of %d tokens differ\n",
            st.worst, st.sum / st.logprobs, st.token_mismatches, st.tokens);
    assert_true(st.sum / st.logprobs < 0.05);
    assert_true(st.token_mismatches <= st.tokens / 20);
}

// Every kernel table this CPU has meets the reference, not just the default
// one the tests above use: the portable fallback, AVX2, and whichever of
// avx512 and amx is not the default here. A table with bf16 activations
// (avx512_bf16) is held, like the GPU, to the bf16 KV cache's bounds.
static void every_kernel_table_matches_reference(void **state)
{
    (void)state;
    if (harness_device != BACKEND_DEVICE_CPU) skip();
    const char *variants[8];
    const int n = backend_variants(BACKEND_DEVICE_CPU, variants, 8);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        static const char *const cases[] = {"qwen3moe-v2048", "qwen3-dense-v2048"};
        for (int c = 0; c < 2; c++) {
            struct golden_stats st;
            if (!backend_variant_bf16_activations(BACKEND_DEVICE_CPU, variants[i])) {
                check_golden_on(variants[i], cases[c], DTYPE_F32, 64, 1.0, true, &st);
                continue;
            }
            check_golden_on(variants[i], cases[c], DTYPE_F32, 64, 1000.0, false, &st);
            fprintf(stderr, "%s on %s kernels: worst |diff| %.2e, mean %.2e, %d of %d tokens differ\n",
                    cases[c], variants[i], st.worst, st.sum / st.logprobs, st.token_mismatches, st.tokens);
            assert_true(st.sum / st.logprobs < 0.05);
            assert_true(st.token_mismatches <= st.tokens / 20);
        }
        fprintf(stderr, "%s kernels: the golden set holds\n", variants[i]);
    }
}

int main(void)
{
    const int pick = harness_pick_device();
    if (pick) return pick;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(moe_matches_reference_with_fp32_kv),
        cmocka_unit_test(dense_matches_reference_with_fp32_kv),
        cmocka_unit_test(moe_matches_reference_in_chunks_of_7),
        cmocka_unit_test(moe_stays_close_with_bf16_kv),
        cmocka_unit_test(every_kernel_table_matches_reference),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
