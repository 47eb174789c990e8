// Pins the engine on the golden Qwen3-MoE checkpoint: greedy output matches
// llama.cpp's, and is token-for-token the same alone, batched with 31 others,
// in 7-token prefill chunks, after preemption, on a prefix-cache hit and on 2
// expert-parallel ranks; seeded sampling is batch-independent; admission
// limits, cancel and drain behave; blocks are all accounted for after
// thousands of random submits and cancels; prefault_memory makes the KV pool
// resident as the engine starts.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <unistd.h>

#include "engine_harness.h"
#include "model/forward.h"
#include "model/model.h"

static struct model *g_model;
static int g_vocab;

static int setup(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    if (!data) {
        fprintf(stderr, "MOESERVE_TEST_DATA is not set\n");
        return -1;
    }
    char dir[4096], err[512];
    snprintf(dir, sizeof dir, "%s/qwen3moe-v2048", data);
    if (model_load(dir, &g_model, err, sizeof err)) {
        fprintf(stderr, "model_load: %s\n", err);
        return -1;
    }
    g_vocab = g_model->cfg.vocab_size;
    // Verify block accounting after every step of every engine here.
    setenv("MOESERVE_CHECK_BLOCKS", "1", 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    model_destroy(g_model);
    return 0;
}

static void base_opts(struct engine_opts *o)
{
    engine_opts_default(o);
    o->n_threads = 2;
    o->kv_dtype = DTYPE_F32; // the golden margins are below bf16's resolution
    o->max_num_seqs = 32;
    o->max_num_batched_tokens = 512;
    o->kv_cache_bytes = 2000 * kv_block_bytes(&g_model->cfg, DTYPE_F32);
}

static struct engine *make_engine(const struct engine_opts *o)
{
    struct engine *e = NULL;
    char err[512] = "";
    int rc = engine_create(g_model, NULL, o, &e, err, sizeof err);
    if (rc) fail_msg("engine_create: %s", err);
    return e;
}

// A workload of requests with different prompt and output lengths.
struct work {
    int n;
    int32_t *prompts[64];
    int n_prompt[64];
    int max_tokens[64];
};

static void work_make(struct work *w, int n, int shared_prefix, uint64_t seed)
{
    w->n = n;
    int32_t prefix[256];
    h_tokens(prefix, shared_prefix, seed * 7 + 3, g_vocab);
    for (int i = 0; i < n; i++) {
        int len = shared_prefix + 1 + (int)((i * 37 + seed * 11) % 150);
        w->n_prompt[i] = len;
        w->max_tokens[i] = 1 + (int)((i * 13 + seed) % 30);
        w->prompts[i] = malloc((size_t)len * sizeof(int32_t));
        memcpy(w->prompts[i], prefix, (size_t)shared_prefix * sizeof(int32_t));
        h_tokens(w->prompts[i] + shared_prefix, len - shared_prefix, seed * 1000 + (uint64_t)i,
                 g_vocab);
    }
}

static void work_free(struct work *w)
{
    for (int i = 0; i < w->n; i++) free(w->prompts[i]);
}

static void work_request(const struct work *w, int i, struct engine_request *r)
{
    engine_request_default(r);
    r->prompt = w->prompts[i];
    r->n_prompt = w->n_prompt[i];
    r->sampling.temperature = 0;
    r->stop.max_tokens = w->max_tokens[i];
    r->stop.ignore_eos = true;
}

// Runs the requests of w on e, all at once (or one at a time when alone).
static struct h_batch *run_work(struct engine *e, const struct work *w, bool alone,
                                const struct sampling_params *sampling)
{
    struct h_batch *b = h_batch_new(w->n);
    for (int i = 0; i < w->n; i++) {
        struct engine_request r;
        work_request(w, i, &r);
        if (sampling) r.sampling = *sampling;
        char err[512];
        int rc = h_submit(e, b, i, &r, err, sizeof err);
        if (rc) fail_msg("submit %d: %s", i, err);
        if (alone) h_wait(b, i + 1);
    }
    h_wait(b, w->n);
    for (int i = 0; i < w->n; i++) {
        struct h_result *res = &b->res[i];
        if (res->has_error) fail_msg("request %d aborted: %s", i, res->error);
        assert_int_equal(res->protocol_errors, 0);
        assert_int_equal(res->n_tokens, w->max_tokens[i]);
        assert_int_equal(res->finish, FINISH_LENGTH);
        assert_int_equal(res->prompt_tokens, w->n_prompt[i]);
    }
    return b;
}

static void assert_same_tokens(const struct h_batch *a, const struct h_batch *b, const char *what)
{
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_int_equal(a->res[i].n_tokens, b->res[i].n_tokens);
        for (int t = 0; t < a->res[i].n_tokens; t++)
            if (a->res[i].tokens[t] != b->res[i].tokens[t])
                fail_msg("%s: request %d differs at token %d: %d vs %d", what, i, t,
                         a->res[i].tokens[t], b->res[i].tokens[t]);
    }
}

static void assert_blocks_returned(struct engine *e)
{
    struct engine_stats st;
    // The stats are published after the step that sent the last delta.
    for (int tries = 0; tries < 2000; tries++) {
        engine_get_stats(e, &st);
        if (st.num_running == 0 && st.num_waiting == 0) break;
        usleep(1000);
    }
    assert_int_equal(st.num_running, 0);
    for (int i = 0; i < st.n_ranks; i++) {
        assert_int_equal(st.rank[i].kv_blocks_used, 0);
        assert_true(st.rank[i].kv_blocks_cached <= st.rank[i].kv_blocks_total);
        assert_int_equal(st.rank[i].num_running, 0);
    }
}

// The reference: every request alone, prefix caching off.
static struct h_batch *reference(const struct work *w)
{
    struct engine_opts o;
    base_opts(&o);
    o.enable_prefix_caching = false;
    struct engine *e = make_engine(&o);
    struct h_batch *b = run_work(e, w, true, NULL);
    engine_destroy(e);
    return b;
}

static void greedy_matches_the_llama_cpp_reference(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen3moe-v2048/expected.json", data);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) fail_msg("%s: %s", path, jerr.text);
    double tol = json_real_value(json_object_get(root, "tolerance_logprob"));
    json_t *cases = json_object_get(root, "cases");
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    size_t n_cases = json_array_size(cases);
    struct h_batch *b = h_batch_new((int)n_cases);
    int32_t *prompts[16];
    // All cases at once: batched, and the long prompt spreads over chunks.
    for (size_t c = 0; c < n_cases; c++) {
        json_t *cs = json_array_get(cases, c);
        json_t *ids = json_object_get(cs, "prompt_ids");
        int n = (int)json_array_size(ids);
        prompts[c] = malloc((size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++) prompts[c][i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompts[c];
        r.n_prompt = n;
        r.sampling.temperature = 0;
        r.sampling.logprobs = 5;
        r.stop.max_tokens = (int)json_array_size(json_object_get(cs, "tokens"));
        r.stop.ignore_eos = true;
        char err[512];
        if (h_submit(e, b, (int)c, &r, err, sizeof err)) fail_msg("%s", err);
    }
    h_wait(b, (int)n_cases);
    for (size_t c = 0; c < n_cases; c++) {
        json_t *toks = json_object_get(json_array_get(cases, c), "tokens");
        struct h_result *res = &b->res[c];
        assert_int_equal(res->n_tokens, (int)json_array_size(toks));
        for (size_t t = 0; t < json_array_size(toks); t++) {
            json_t *tk = json_array_get(toks, t);
            int id = (int)json_integer_value(json_object_get(tk, "id"));
            if (res->tokens[t] != id)
                fail_msg("case %zu token %zu: %d, expected %d", c, t, res->tokens[t], id);
            double lp = json_real_value(json_object_get(tk, "logprob"));
            if (fabs(res->logprobs[t] - lp) > tol)
                fail_msg("case %zu token %zu: logprob %g, expected %g", c, t,
                         (double)res->logprobs[t], lp);
        }
        // The first token's alternatives, best first.
        json_t *top = json_object_get(json_array_get(toks, 0), "top_logprobs");
        assert_int_equal(res->first_token.n_top, 5);
        for (int k = 0; k < 5; k++) {
            json_t *alt = json_array_get(top, (size_t)k);
            assert_int_equal(res->first_token.top[k].id,
                             (int)json_integer_value(json_object_get(alt, "id")));
            assert_true(fabs(res->first_token.top[k].logprob -
                             json_real_value(json_object_get(alt, "logprob"))) <= tol);
        }
        free(prompts[c]);
    }
    h_batch_free(b);
    assert_blocks_returned(e);
    engine_destroy(e);
    json_decref(root);
}

static void greedy_is_the_same_batched_with_31_others(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 32, 0, 1);
    struct h_batch *ref = reference(&w);
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    struct h_batch *got = run_work(e, &w, false, NULL);
    assert_same_tokens(ref, got, "batched");
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(ref);
    h_batch_free(got);
    work_free(&w);
}

static void greedy_is_the_same_in_7_token_prefill_chunks(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 6, 0, 2);
    struct h_batch *ref = reference(&w);
    struct engine_opts o;
    base_opts(&o);
    o.max_num_batched_tokens = 7;
    o.max_num_seqs = 3;
    struct engine *e = make_engine(&o);
    struct h_batch *got = run_work(e, &w, false, NULL);
    assert_same_tokens(ref, got, "7-token chunks");
    struct engine_stats st;
    engine_get_stats(e, &st);
    int total = 0;
    for (int i = 0; i < w.n; i++) total += w.n_prompt[i];
    assert_true(st.steps >= (uint64_t)(total / 7)); // no step took more than 7 tokens
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(ref);
    h_batch_free(got);
    work_free(&w);
}

static void greedy_is_the_same_after_preemption_and_recompute(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 16, 0, 3);
    for (int i = 0; i < w.n; i++) w.max_tokens[i] = 20 + i % 7;
    struct h_batch *ref = reference(&w);
    struct engine_opts o;
    base_opts(&o);
    // Room for the longest request and little more: sequences must be
    // preempted to let older ones grow. (The pool must hold one
    // max-model-len sequence: 24 blocks are 384 tokens, every request fits.)
    o.kv_cache_bytes = 24 * kv_block_bytes(&g_model->cfg, DTYPE_F32);
    o.max_model_len = 24 * KV_BLOCK_TOKENS;
    for (int pc = 0; pc < 2; pc++) {
        o.enable_prefix_caching = pc == 1;
        o.prefault_memory = pc == 1; // its pool and workspace resident at start: the same tokens
        struct engine *e = make_engine(&o);
        struct h_batch *got = run_work(e, &w, false, NULL);
        assert_same_tokens(ref, got, pc ? "preempted, prefix cache on, pool faulted in" : "preempted");
        struct engine_stats st;
        engine_get_stats(e, &st);
        assert_true(st.num_preemptions > 0);
        // Each prompt counted once, readmissions after preemption not again
        // (they had inflated the prefix cache's queries with their outputs).
        uint64_t prompts = 0;
        for (int i = 0; i < w.n; i++) prompts += (uint64_t)w.n_prompt[i];
        assert_int_equal(st.prompt_tokens_total, prompts);
        assert_int_equal(st.prefix_cache_queries, pc ? prompts : 0);
        assert_true(st.prefix_cache_hits <= st.prefix_cache_queries);
        assert_blocks_returned(e);
        engine_destroy(e);
        h_batch_free(got);
    }
    h_batch_free(ref);
    work_free(&w);
}

static void greedy_is_the_same_on_a_prefix_cache_hit(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 8, 100, 4); // a 100-token system prompt in common
    struct h_batch *ref = reference(&w);
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    struct h_batch *got = run_work(e, &w, true, NULL);
    assert_same_tokens(ref, got, "prefix cache");
    assert_int_equal(got->res[0].cached_tokens, 0);
    for (int i = 1; i < w.n; i++) assert_int_equal(got->res[i].cached_tokens, 96);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_true(st.prefix_cache_hits >= 96u * 7u);
    assert_true(st.prefix_cache_queries >= st.prefix_cache_hits);
    // Run again: every prompt is now cached up to its last full block.
    struct h_batch *again = run_work(e, &w, true, NULL);
    assert_same_tokens(ref, again, "prefix cache, second pass");
    for (int i = 0; i < w.n; i++)
        assert_int_equal(again->res[i].cached_tokens, (w.n_prompt[i] - 1) / 16 * 16);
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(ref);
    h_batch_free(got);
    h_batch_free(again);
    work_free(&w);
}

// Each rank's step time is split into attention, MoE, lm_head and sampling:
// the forward pass's three phases add up to its whole time, the exchanges
// fit inside the MoE and lm_head phases, and nothing exceeds the wall time.
static void step_time_is_split_into_phases_on_every_rank(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 6, 0, 9);
    struct engine_opts o;
    base_opts(&o);
    o.data_parallel_size = 2;
    o.enable_expert_parallel = true;
    struct engine *e = make_engine(&o);
    struct engine_stats st0;
    engine_get_stats(e, &st0);
    for (int r = 0; r < 2; r++)
        for (int f = 0; f < ENGINE_PHASES; f++) assert_true(st0.rank[r].phase_seconds[f] == 0);
    const double t0 = ms_now();
    struct h_batch *got = run_work(e, &w, false, NULL);
    const double wall = ms_now() - t0;
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_true(st.steps > 0);
    for (int r = 0; r < 2; r++) {
        const double *ph = st.rank[r].phase_seconds;
        for (int f = 0; f < ENGINE_PHASES; f++)
            if (!(ph[f] > 0)) fail_msg("rank %d: no time in %s", r, engine_phase_names[f]);
        const double fwd = ph[ENGINE_PHASE_ATTENTION] + ph[ENGINE_PHASE_MOE] + ph[ENGINE_PHASE_LM_HEAD];
        if (fabs(fwd - st.rank[r].forward_seconds) > 1e-9 * (double)st.steps + 1e-12)
            fail_msg("rank %d: phases add to %.9f s, forward passes took %.9f s", r, fwd,
                     st.rank[r].forward_seconds);
        assert_true(st.rank[r].exchange_seconds > 0);
        assert_true(st.rank[r].exchange_seconds <= ph[ENGINE_PHASE_MOE] + ph[ENGINE_PHASE_LM_HEAD]);
        assert_true(fwd + ph[ENGINE_PHASE_SAMPLING] <= wall);
    }
    engine_destroy(e);
    h_batch_free(got);
    work_free(&w);
}

static void greedy_is_the_same_on_two_expert_parallel_ranks(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 12, 0, 5);
    struct h_batch *ref = reference(&w);
    struct engine_opts o;
    base_opts(&o);
    o.data_parallel_size = 2;
    o.enable_expert_parallel = true;
    struct engine *e = make_engine(&o);
    struct h_batch *got = run_work(e, &w, false, NULL);
    assert_same_tokens(ref, got, "2 ranks");
    // A lone request on 2 ranks: the idle rank joins every exchange.
    struct work one;
    work_make(&one, 1, 0, 6);
    struct h_batch *ref1 = reference(&one);
    struct h_batch *got1 = run_work(e, &one, false, NULL);
    assert_same_tokens(ref1, got1, "2 ranks, one request");
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.n_ranks, 2);
    // Both ranks held sequences: both keep cached blocks now.
    assert_true(st.rank[0].kv_blocks_cached > 0);
    assert_true(st.rank[1].kv_blocks_cached > 0);
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(ref);
    h_batch_free(got);
    h_batch_free(ref1);
    h_batch_free(got1);
    work_free(&w);
    work_free(&one);
}

static void seeded_sampling_is_the_same_alone_and_batched(void **state)
{
    (void)state;
    struct work w;
    work_make(&w, 10, 0, 7);
    for (int i = 0; i < w.n; i++) w.max_tokens[i] = 25;
    struct sampling_params sp;
    struct engine_request dflt;
    engine_request_default(&dflt);
    sp = dflt.sampling;
    sp.temperature = 0.9f;
    sp.top_p = 0.95f;
    sp.top_k = 50;
    sp.has_seed = true;
    sp.seed = 1234;
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    struct h_batch *alone = run_work(e, &w, true, &sp);
    struct h_batch *batched = run_work(e, &w, false, &sp);
    assert_same_tokens(alone, batched, "seeded sampling");
    // The samples really are random: not all the same as greedy.
    struct h_batch *greedy = run_work(e, &w, false, NULL);
    int differ = 0;
    for (int i = 0; i < w.n; i++)
        for (int t = 0; t < 25; t++) differ += alone->res[i].tokens[t] != greedy->res[i].tokens[t];
    assert_true(differ > 10);
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(alone);
    h_batch_free(batched);
    h_batch_free(greedy);
    work_free(&w);
}

// A prompt token's logprob equals the logprob the same token had when it was
// generated after the tokens before it; chunking does not change them.
static void prompt_logprobs_agree_with_generated_logprobs(void **state)
{
    (void)state;
    int32_t prompt[61];
    h_tokens(prompt, 60, 13, g_vocab);
    float first[60];
    for (int chunked = 0; chunked < 2; chunked++) {
        struct engine_opts o;
        base_opts(&o);
        if (chunked) {
            o.max_num_batched_tokens = 7;
            o.max_num_seqs = 4;
        }
        struct engine *e = make_engine(&o);
        struct h_batch *b = h_batch_new(2);
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompt;
        r.n_prompt = 60;
        r.sampling.temperature = 0;
        r.sampling.logprobs = 0;
        r.stop.max_tokens = 1;
        char err[512];
        assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), 0);
        h_wait(b, 1);
        prompt[60] = b->res[0].tokens[0];
        // A second request whose prompt ends with that token. It shares the
        // prefix, but prompt logprobs must bypass the cache.
        r.n_prompt = 61;
        r.sampling.prompt_logprobs = 2;
        assert_int_equal(h_submit(e, b, 1, &r, err, sizeof err), 0);
        h_wait(b, 2);
        struct h_result *res = &b->res[1];
        assert_int_equal(res->protocol_errors, 0);
        assert_int_equal(res->n_prompt_lp, 60);
        assert_int_equal(res->cached_tokens, 0);
        for (int i = 0; i < 60; i++) {
            assert_int_equal(res->plp_ids[i], prompt[i + 1]);
            assert_true(res->plp[i] <= 0 && isfinite(res->plp[i]));
        }
        if (fabsf(res->plp[59] - b->res[0].logprobs[0]) > 1e-3f)
            fail_msg("prompt logprob %g, generated logprob %g", (double)res->plp[59],
                     (double)b->res[0].logprobs[0]);
        for (int i = 0; i < 60; i++) {
            if (!chunked) first[i] = res->plp[i];
            else if (fabsf(first[i] - res->plp[i]) > 1e-3f)
                fail_msg("prompt logprob %d: %g in one chunk, %g in 7-token chunks", i,
                         (double)first[i], (double)res->plp[i]);
        }
        h_batch_free(b);
        assert_blocks_returned(e);
        engine_destroy(e);
    }
}

// A pool that cannot hold one max-model-len sequence on a rank is refused
// at creation with the numbers (and the length that would fit); then a
// request longer than max-model-len and malformed ones are refused at
// submission.
static void requests_too_long_or_too_big_for_one_rank_are_refused(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    o.max_model_len = 1000;
    o.data_parallel_size = 2;
    o.enable_expert_parallel = true;
    // 40 blocks in all, 20 (320 tokens) per rank.
    o.kv_cache_bytes = 40 * kv_block_bytes(&g_model->cfg, DTYPE_F32);
    struct engine *e = NULL;
    char cerr[512];
    assert_int_equal(engine_create(g_model, NULL, &o, &e, cerr, sizeof cerr), MS_ENOFIT);
    assert_non_null(strstr(cerr, "1000-token sequence"));
    assert_non_null(strstr(cerr, "2 ranks"));
    assert_non_null(strstr(cerr, "at most 320"));
    o.max_model_len = 320;
    e = make_engine(&o);
    assert_int_equal(engine_max_model_len(e), 320);
    int32_t prompt[1000];
    h_tokens(prompt, 1000, 9, g_vocab);
    struct engine_request r;
    engine_request_default(&r);
    r.prompt = prompt;
    r.n_prompt = 310;
    r.stop.max_tokens = 20;
    struct h_batch *b = h_batch_new(4);
    char err[512] = "";
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), MS_ETOOLONG);
    assert_non_null(strstr(err, "320"));
    assert_non_null(strstr(err, "330"));
    r.n_prompt = 0;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), MS_EINVAL);
    r.n_prompt = 3;
    prompt[1] = g_vocab;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "2048"));
    prompt[1] = 5;
    r.sampling.temperature = -1;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "temperature"));
    r.sampling.temperature = 0;
    const char *stops[] = {"x"};
    r.stop.stop_strs = stops;
    r.stop.n_stop_strs = 1;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), MS_EINVAL); // no tokenizer
    r.stop.n_stop_strs = 0;
    r.stop.max_tokens = 300; // 303 tokens fit one rank
    r.stop.ignore_eos = true;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), 0);
    h_wait(b, 1);
    assert_int_equal(b->res[0].n_tokens, 300);
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(b);

    // Options that cannot work are refused at creation.
    struct engine *bad = NULL;
    base_opts(&o);
    o.data_parallel_size = 2;
    assert_int_equal(engine_create(g_model, NULL, &o, &bad, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "--enable-expert-parallel"));
    base_opts(&o);
    o.max_model_len = 5000;
    assert_int_equal(engine_create(g_model, NULL, &o, &bad, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "4096"));
    base_opts(&o);
    o.enable_chunked_prefill = false;
    assert_int_equal(engine_create(g_model, NULL, &o, &bad, err, sizeof err), MS_EINVAL);
    base_opts(&o);
    o.max_num_batched_tokens = 8;
    assert_int_equal(engine_create(g_model, NULL, &o, &bad, err, sizeof err), MS_EINVAL);
    assert_null(bad);
}

// With chunked prefill off, prompt logprobs of a prompt longer than a
// step's logits rows (lm-eval's echo + logprobs scoring) are computed in
// pieces of the rows a step has, the same as in one piece; a request after
// it runs (it had waited behind it forever, and then was refused).
static void prompt_logprobs_past_a_steps_rows_run_in_pieces_without_chunked_prefill(void **state)
{
    (void)state;
    int32_t prompt[100];
    h_tokens(prompt, 100, 11, g_vocab);
    float whole[99];
    for (int small = 0; small < 2; small++) {
        struct engine_opts o;
        base_opts(&o);
        o.enable_chunked_prefill = false;
        o.max_num_seqs = small ? 4 : 64; // 4 + the spare rows: 68 logits rows, 64: 128
        o.max_num_batched_tokens = o.max_model_len = 512;
        struct engine *e = make_engine(&o);
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompt;
        r.n_prompt = 100;
        r.sampling.temperature = 0;
        r.sampling.prompt_logprobs = 0;
        r.stop.max_tokens = 2;
        struct h_batch *b = h_batch_new(2);
        char err[512] = "";
        assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), 0);
        r.sampling.prompt_logprobs = -1;
        assert_int_equal(h_submit(e, b, 1, &r, err, sizeof err), 0);
        h_wait(b, 2);
        assert_int_equal(b->res[0].protocol_errors, 0);
        assert_int_equal(b->res[0].n_prompt_lp, 99);
        assert_int_equal(b->res[1].n_tokens, 2);
        for (int i = 0; i < 99; i++) {
            if (!small) whole[i] = b->res[0].plp[i];
            else if (fabsf(whole[i] - b->res[0].plp[i]) > 1e-3f)
                fail_msg("prompt logprob %d: %g in one piece, %g in pieces of 68", i, (double)whole[i],
                         (double)b->res[0].plp[i]);
        }
        h_batch_free(b);
        assert_blocks_returned(e);
        engine_destroy(e);
    }
}

// vLLM's min_tokens: the model's eos and the request's stop ids cannot come
// before that many tokens, however the logits favour them; after, they
// stop as ever. Prompt logprobs of the same request are not biased by it.
static void min_tokens_hold_off_eos_and_stop_ids(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    int32_t prompt[12];
    h_tokens(prompt, 12, 17, g_vocab);
    const int32_t eos = g_model->cfg.eos_ids[0], stop = 5;
    struct sampling_logit_bias bias[2] = {{eos, 100}, {stop, 50}};
    struct h_batch *b = h_batch_new(4);
    char err[512];
    for (int i = 0; i < 4; i++) {
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompt;
        r.n_prompt = 12;
        r.sampling.temperature = 0;
        r.sampling.logit_bias = bias;
        r.sampling.n_logit_bias = i == 3 ? 1 : 2;
        r.stop.max_tokens = 10;
        r.stop.stop_ids = &stop;
        r.stop.n_stop_ids = i == 3 ? 0 : 1;
        r.stop.min_tokens = i == 0 ? 0 : i == 1 ? 4 : i == 2 ? 10 : 3;
        r.sampling.prompt_logprobs = i == 1 ? 0 : -1;
        assert_int_equal(h_submit(e, b, i, &r, err, sizeof err), 0);
    }
    h_wait(b, 4);
    // Without it the eos (bias 100) comes first; with 4, four tokens, none
    // of them the eos or the stop id, then the eos; with 10, all ten. (The
    // ending token is the last one reported.)
    assert_int_equal(b->res[0].finish, FINISH_STOP);
    assert_int_equal(b->res[0].n_tokens, 1);
    assert_int_equal(b->res[1].finish, FINISH_STOP);
    assert_int_equal(b->res[1].n_tokens, 5);
    assert_int_equal(b->res[1].tokens[4], eos);
    assert_int_equal(b->res[2].finish, FINISH_LENGTH);
    assert_int_equal(b->res[2].n_tokens, 10);
    for (int i = 1; i < 3; i++)
        for (int t = 0; t < (i == 1 ? 4 : 10); t++) {
            assert_int_not_equal(b->res[i].tokens[t], eos);
            assert_int_not_equal(b->res[i].tokens[t], stop);
        }
    assert_int_equal(b->res[3].n_tokens, 4);
    assert_int_equal(b->res[1].n_prompt_lp, 11);
    // Refused: more than max_tokens.
    struct engine_request r;
    engine_request_default(&r);
    r.prompt = prompt;
    r.n_prompt = 12;
    r.stop.max_tokens = 2;
    r.stop.min_tokens = 3;
    struct h_batch *b2 = h_batch_new(1);
    assert_int_equal(h_submit(e, b2, 0, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "min_tokens"));
    h_batch_free(b2);
    h_batch_free(b);
    assert_blocks_returned(e);
    engine_destroy(e);
}

// vLLM's allowed_token_ids: every token drawn is one of them, at any
// temperature; an id outside the vocabulary is refused.
static void only_allowed_token_ids_are_drawn(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    int32_t prompt[8];
    h_tokens(prompt, 8, 23, g_vocab);
    const int32_t allowed[3] = {5, 900, 1777};
    struct h_batch *b = h_batch_new(2);
    char err[512];
    for (int i = 0; i < 2; i++) {
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompt;
        r.n_prompt = 8;
        r.sampling.temperature = i ? 1.5f : 0;
        r.sampling.has_seed = true;
        r.sampling.seed = 7;
        r.stop.max_tokens = 12;
        r.stop.ignore_eos = true;
        r.allowed_ids = allowed;
        r.n_allowed_ids = 3;
        assert_int_equal(h_submit(e, b, i, &r, err, sizeof err), 0);
    }
    h_wait(b, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(b->res[i].n_tokens, 12);
        for (int t = 0; t < 12; t++) {
            const int32_t id = b->res[i].tokens[t];
            assert_true(id == 5 || id == 900 || id == 1777);
        }
    }
    struct engine_request r;
    engine_request_default(&r);
    r.prompt = prompt;
    r.n_prompt = 8;
    const int32_t bad = g_vocab;
    r.allowed_ids = &bad;
    r.n_allowed_ids = 1;
    struct h_batch *b2 = h_batch_new(1);
    assert_int_equal(h_submit(e, b2, 0, &r, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "allowed token id"));
    h_batch_free(b2);
    h_batch_free(b);
    assert_blocks_returned(e);
    engine_destroy(e);
}

static void cancel_frees_the_blocks_and_sends_abort(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    struct engine *e = make_engine(&o);
    int32_t prompt[200];
    h_tokens(prompt, 200, 10, g_vocab);
    struct engine_request r;
    engine_request_default(&r);
    r.prompt = prompt;
    r.n_prompt = 200;
    r.sampling.temperature = 0;
    r.stop.max_tokens = 3000;
    r.stop.ignore_eos = true;
    struct h_batch *b = h_batch_new(2);
    char err[512];
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), 0);
    // Wait for a few tokens, then cancel.
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int n = b->res[0].n_tokens;
        pthread_mutex_unlock(&b->mu);
        if (n >= 3) break;
        usleep(1000);
    }
    engine_cancel(e, b->res[0].id);
    engine_cancel(e, 987654321); // unknown ids are ignored
    h_wait(b, 1);
    assert_int_equal(b->res[0].finish, FINISH_ABORT);
    assert_false(b->res[0].has_error);
    assert_true(b->res[0].n_tokens < 3000);
    engine_cancel(e, b->res[0].id); // finished ids too
    assert_blocks_returned(e);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.request_success[FINISH_ABORT], 1);
    engine_destroy(e);
    assert_int_equal(b->res[0].protocol_errors, 0);
    h_batch_free(b);
}

static void drain_lets_requests_finish_then_aborts_at_the_deadline(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    int32_t prompt[50];
    h_tokens(prompt, 50, 11, g_vocab);
    struct engine_request r;
    engine_request_default(&r);
    r.prompt = prompt;
    r.n_prompt = 50;
    r.sampling.temperature = 0;
    r.stop.ignore_eos = true;
    char err[512];
    // A generous deadline: both requests run to their end.
    struct engine *e = make_engine(&o);
    struct h_batch *b = h_batch_new(3);
    r.stop.max_tokens = 4;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), 0);
    r.stop.max_tokens = 40;
    assert_int_equal(h_submit(e, b, 1, &r, err, sizeof err), 0);
    engine_drain(e, 60);
    assert_int_equal(b->n_done, 2);
    assert_int_equal(b->res[0].finish, FINISH_LENGTH);
    assert_int_equal(b->res[0].n_tokens, 4);
    assert_int_equal(b->res[1].finish, FINISH_LENGTH);
    assert_int_equal(b->res[1].n_tokens, 40);
    assert_int_equal(h_submit(e, b, 2, &r, err, sizeof err), MS_EBUSY);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_true(st.draining);
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(b);
    // No time left: what runs is aborted, with finish_reason abort.
    e = make_engine(&o);
    b = h_batch_new(2);
    r.stop.max_tokens = 4000;
    assert_int_equal(h_submit(e, b, 0, &r, err, sizeof err), 0);
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int n = b->res[0].n_tokens;
        pthread_mutex_unlock(&b->mu);
        if (n >= 1) break;
        usleep(500);
    }
    engine_drain(e, 0);
    assert_int_equal(b->n_done, 1);
    assert_int_equal(b->res[0].finish, FINISH_ABORT);
    assert_false(b->res[0].has_error);
    assert_int_equal(h_submit(e, b, 1, &r, err, sizeof err), MS_EBUSY);
    assert_blocks_returned(e);
    engine_destroy(e);
    assert_int_equal(b->res[0].protocol_errors, 0);
    h_batch_free(b);
}

static void a_full_waiting_queue_refuses_with_busy(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    o.max_waiting_requests = 2;
    o.max_num_seqs = 1;
    struct engine *e = make_engine(&o);
    int32_t prompt[20];
    h_tokens(prompt, 20, 12, g_vocab);
    struct engine_request r;
    engine_request_default(&r);
    r.prompt = prompt;
    r.n_prompt = 20;
    r.sampling.temperature = 0;
    r.stop.ignore_eos = true;
    r.stop.max_tokens = 3000;
    struct h_batch *b = h_batch_new(8);
    char err[512];
    int busy = 0, ok = 0;
    for (int i = 0; i < 8; i++) {
        int rc = h_submit(e, b, ok, &r, err, sizeof err);
        if (rc == MS_EBUSY) {
            busy++;
            assert_non_null(strstr(err, "--max-waiting-requests"));
        } else {
            assert_int_equal(rc, 0);
            ok++;
        }
    }
    // One may already run; at most two wait.
    assert_true(ok >= 2 && ok <= 3);
    assert_int_equal(busy, 8 - ok);
    for (int i = 0; i < ok; i++) engine_cancel(e, b->res[i].id);
    h_wait(b, ok);
    assert_blocks_returned(e);
    engine_destroy(e);
    h_batch_free(b);
}

// Thousands of random submits and cancels against a small pool with prefix
// caching (so preemption, sharing and eviction all happen); the engine checks
// its block accounting after every step (MOESERVE_CHECK_BLOCKS), and at the
// end every block is free or cached and every request got exactly one end.
// This process's resident bytes (/proc/self/statm).
static size_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    unsigned long size = 0, res = 0;
    assert_int_equal(fscanf(f, "%lu %lu", &size, &res), 2);
    fclose(f);
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

// An engine with a 64 MiB pool grows the process by what it prepares
// (weights, workspace) plus, with prefault_memory, the whole pool: without
// it no step has touched a page of the pool yet.
static void prefault_memory_makes_the_pool_resident_at_start(void **state)
{
    (void)state;
    struct engine_opts o;
    base_opts(&o);
    const size_t block = kv_block_bytes(&g_model->cfg, DTYPE_F32), pool = ((size_t)64 << 20) / block * block;
    o.kv_cache_bytes = pool;
    size_t grew[2];
    for (int pf = 0; pf < 2; pf++) {
        o.prefault_memory = pf == 1;
        const size_t before = resident_bytes();
        struct engine *e = make_engine(&o);
        const size_t after = resident_bytes();
        grew[pf] = after > before ? after - before : 0;
        engine_destroy(e);
    }
    if (grew[1] < grew[0] + pool / 10 * 9)
        fail_msg("the engine grew the process by %zu bytes with prefault_memory, %zu without: the %zu-byte "
                 "pool is not resident", grew[1], grew[0], pool);
}

static void block_accounting_survives_random_submits_and_cancels(void **state)
{
    (void)state;
    enum { N = 2000 };
    struct engine_opts o;
    base_opts(&o);
    o.max_num_seqs = 16;
    o.max_num_batched_tokens = 64;
    o.kv_cache_bytes = 30 * kv_block_bytes(&g_model->cfg, DTYPE_F32);
    o.data_parallel_size = 2;
    o.enable_expert_parallel = true;
    o.max_model_len = 240;
    struct engine *e = make_engine(&o);
    struct h_batch *b = h_batch_new(N);
    int32_t prefixes[3][64];
    for (int f = 0; f < 3; f++) h_tokens(prefixes[f], 64, 100 + (uint64_t)f, g_vocab);
    uint64_t x = 42;
    int submitted = 0, cancels = 0;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t rnd = (uint32_t)(x >> 33);
        int32_t prompt[200];
        int len = 1 + (int)(rnd % 150);
        int fam = (int)((rnd >> 8) % 4);
        h_tokens(prompt, len, (uint64_t)i, g_vocab);
        if (fam < 3) memcpy(prompt, prefixes[fam], (size_t)(len < 64 ? len : 64) * sizeof(int32_t));
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompt;
        r.n_prompt = len;
        r.sampling.temperature = (rnd >> 12) % 2 ? 0.0f : 0.7f;
        r.stop.max_tokens = 1 + (int)((rnd >> 14) % 8);
        r.stop.ignore_eos = true;
        char err[512];
        int rc = h_submit(e, b, submitted, &r, err, sizeof err);
        if (rc) fail_msg("submit %d: %s", i, err);
        submitted++;
        // Cancel a random earlier request (maybe running, maybe finished).
        if ((rnd >> 20) % 3 == 0) {
            int victim = (int)((rnd >> 4) % (uint32_t)submitted);
            pthread_mutex_lock(&b->mu);
            uint64_t id = b->res[victim].id;
            pthread_mutex_unlock(&b->mu);
            engine_cancel(e, id);
            cancels++;
        }
        if (i % 64 == 63) usleep(2000); // let the engine get ahead at times
    }
    h_wait(b, submitted);
    int aborted = 0;
    for (int i = 0; i < submitted; i++) {
        struct h_result *res = &b->res[i];
        if (res->has_error) fail_msg("request %d: %s", i, res->error);
        assert_int_equal(res->protocol_errors, 0);
        assert_true(res->finish == FINISH_LENGTH || res->finish == FINISH_ABORT);
        aborted += res->finish == FINISH_ABORT;
    }
    assert_true(cancels > 500);
    assert_true(aborted > 0);
    assert_blocks_returned(e);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.request_success[FINISH_ABORT] + st.request_success[FINISH_LENGTH],
                     (uint64_t)submitted);
    engine_destroy(e);
    h_batch_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_matches_the_llama_cpp_reference),
        cmocka_unit_test(greedy_is_the_same_batched_with_31_others),
        cmocka_unit_test(greedy_is_the_same_in_7_token_prefill_chunks),
        cmocka_unit_test(greedy_is_the_same_after_preemption_and_recompute),
        cmocka_unit_test(greedy_is_the_same_on_a_prefix_cache_hit),
        cmocka_unit_test(greedy_is_the_same_on_two_expert_parallel_ranks),
        cmocka_unit_test(step_time_is_split_into_phases_on_every_rank),
        cmocka_unit_test(seeded_sampling_is_the_same_alone_and_batched),
        cmocka_unit_test(prompt_logprobs_agree_with_generated_logprobs),
        cmocka_unit_test(prompt_logprobs_past_a_steps_rows_run_in_pieces_without_chunked_prefill),
        cmocka_unit_test(requests_too_long_or_too_big_for_one_rank_are_refused),
        cmocka_unit_test(min_tokens_hold_off_eos_and_stop_ids),
        cmocka_unit_test(only_allowed_token_ids_are_drawn),
        cmocka_unit_test(cancel_frees_the_blocks_and_sends_abort),
        cmocka_unit_test(drain_lets_requests_finish_then_aborts_at_the_deadline),
        cmocka_unit_test(a_full_waiting_queue_refuses_with_busy),
        cmocka_unit_test(block_accounting_survives_random_submits_and_cancels),
        cmocka_unit_test(prefault_memory_makes_the_pool_resident_at_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
