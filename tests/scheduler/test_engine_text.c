// Pins the engine's text output on the tiny model with the real Qwen3
// tokenizer: streamed text equals the full decode; stop strings never appear,
// never cut a character, and are found when split across tokens; stop token
// ids and eos end generation without their text.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>

#include "engine_harness.h"
#include "grammar/grammar.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static struct model *g_model;
static struct tokenizer *g_tok;
static struct engine *g_engine;
static int32_t g_byte_c3 = -1, g_byte_a9 = -1; // byte-level tokens for the two bytes of "é"

static int setup(void **state)
{
    (void)state;
    const char *dir = getenv("MOESERVE_TINY_MODEL");
    char err[512];
    if (!dir) {
        fprintf(stderr, "MOESERVE_TINY_MODEL is not set\n");
        return -1;
    }
    if (model_load(dir, &g_model, err, sizeof err) || tok_load(dir, &g_tok, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", dir, err);
        return -1;
    }
    for (int32_t id = 0; id < tok_vocab_size(g_tok); id++) {
        size_t n;
        const uint8_t *b = tok_token_bytes(g_tok, id, &n);
        if (b && n == 1 && b[0] == 0xc3) g_byte_c3 = id;
        if (b && n == 1 && b[0] == 0xa9) g_byte_a9 = id;
    }
    setenv("MOESERVE_CHECK_BLOCKS", "1", 1);
    struct engine_opts o;
    engine_opts_default(&o);
    o.n_threads = 2;
    o.max_num_seqs = 8;
    o.max_num_batched_tokens = 256;
    o.max_model_len = 512;
    o.kv_cache_bytes = 400 * kv_block_bytes(&g_model->cfg, DTYPE_BF16);
    if (engine_create(g_model, g_tok, &o, &g_engine, err, sizeof err)) {
        fprintf(stderr, "engine_create: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    engine_destroy(g_engine);
    tok_destroy(g_tok);
    model_destroy(g_model);
    return 0;
}

static void base_request(struct engine_request *r, const int32_t *prompt, int n, int max_tokens)
{
    engine_request_default(r);
    r->prompt = prompt;
    r->n_prompt = n;
    r->sampling.temperature = 0;
    r->stop.max_tokens = max_tokens;
    r->stop.ignore_eos = true;
}

static struct h_batch *run_one(const struct engine_request *r)
{
    struct h_batch *b = h_batch_new(1);
    char err[512];
    if (h_submit(g_engine, b, 0, r, err, sizeof err)) fail_msg("submit: %s", err);
    h_wait(b, 1);
    struct h_result *res = &b->res[0];
    if (res->has_error) fail_msg("aborted: %s", res->error);
    assert_int_equal(res->protocol_errors, 0); // incl. every delta's text being whole characters
    return b;
}

static void prompt_of(const char *text, int32_t **ids, int *n)
{
    size_t nn;
    char err[256];
    if (tok_encode(g_tok, text, strlen(text), ids, &nn, err, sizeof err)) fail_msg("%s", err);
    *n = (int)nn;
}

// A test's reference: text's tokens as the prompt (*prompt, the caller's to
// free after the last run of *r), *r the greedy request of max_tokens
// (ignore_eos), and that request run alone.
static struct h_batch *run_reference(const char *text, int max_tokens, int32_t **prompt,
                                     struct engine_request *r)
{
    int n;
    prompt_of(text, prompt, &n);
    base_request(r, *prompt, n, max_tokens);
    return run_one(r);
}

// base with the one stop string stop (and min_tokens), run alone.
static struct h_batch *run_with_stop(const struct engine_request *base, const char *stop,
                                     int min_tokens)
{
    struct engine_request r = *base;
    const char *strs[] = {stop};
    r.stop.stop_strs = strs;
    r.stop.n_stop_strs = 1;
    r.stop.min_tokens = min_tokens;
    return run_one(&r);
}

static void streamed_text_equals_the_full_decode(void **state)
{
    (void)state;
    int32_t *prompt;
    int n;
    prompt_of("The quick brown fox jumps over the lazy dog.", &prompt, &n);
    struct engine_request r;
    base_request(&r, prompt, n, 80);
    struct h_batch *b = run_one(&r);
    struct h_result *res = &b->res[0];
    assert_int_equal(res->n_tokens, 80);
    char *full;
    size_t len;
    char err[256];
    // Ids past the tokenizer's vocabulary have no text; leave them out.
    int32_t ids[80];
    int k = 0;
    for (int i = 0; i < 80; i++)
        if (res->tokens[i] < tok_vocab_size(g_tok)) ids[k++] = res->tokens[i];
    assert_int_equal(tok_decode(g_tok, ids, (size_t)k, true, &full, &len, err, sizeof err), 0);
    assert_int_equal(res->text_len, len);
    assert_memory_equal(res->text, full, len);
    assert_true(len > 0);
    free(full);
    h_batch_free(b);
    free(prompt);
}

// The text of tokens[0..k) as the stream produced it.
static size_t decoded_len(const int32_t *tokens, int k)
{
    int32_t ids[H_MAX_TOKENS];
    int m = 0;
    for (int i = 0; i < k; i++)
        if (tokens[i] < tok_vocab_size(g_tok)) ids[m++] = tokens[i];
    struct tok_stream ts;
    tok_stream_init(&ts, g_tok, true);
    size_t total = 0;
    char buf[1024];
    for (int i = 0; i < m; i++) {
        size_t n;
        assert_int_equal(tok_stream_feed(&ts, ids[i], buf, sizeof buf, &n), 0);
        total += n;
    }
    return total;
}

// The cut a stop string makes in text: where the first occurrence to
// complete begins (SIZE_MAX when none).
static size_t reference_cut(const char *text, size_t len, const char *stop)
{
    const char *p = memmem(text, len, stop, strlen(stop));
    return p ? (size_t)(p - text) : SIZE_MAX;
}

// Runs r without stop strings, then with each stop string in turn, and
// checks the cut, the finish reason and that the tokens are a prefix.
static void check_stop(const struct engine_request *base, const struct h_result *ref,
                       const char *stop)
{
    size_t cut = reference_cut(ref->text, ref->text_len, stop);
    assert_true(cut != SIZE_MAX);
    struct h_batch *b = run_with_stop(base, stop, base->stop.min_tokens);
    struct h_result *res = &b->res[0];
    assert_int_equal(res->finish, FINISH_STOP);
    assert_string_equal(res->stop_str, stop);
    if (res->text_len != cut || memcmp(res->text, ref->text, cut) != 0)
        fail_msg("stop \"%s\": got %zu bytes \"%.*s\", expected %zu", stop, res->text_len,
                 (int)res->text_len, res->text, cut);
    assert_null(memmem(res->text, res->text_len, stop, strlen(stop)));
    // Generation stopped at the token that completed the stop string.
    assert_true(res->n_tokens < ref->n_tokens);
    for (int i = 0; i < res->n_tokens; i++) assert_int_equal(res->tokens[i], ref->tokens[i]);
    assert_true(decoded_len(res->tokens, res->n_tokens) >= cut + strlen(stop));
    assert_true(decoded_len(res->tokens, res->n_tokens - 1) < cut + strlen(stop));
    h_batch_free(b);
}

static void stop_strings_split_across_tokens_cut_the_text_and_never_appear(void **state)
{
    (void)state;
    int32_t *prompt;
    struct engine_request r;
    struct h_batch *rb = run_reference("Once upon a time", 120, &prompt, &r);
    struct h_result *ref = &rb->res[0];
    // Stop strings made of the end of one token's text and the start of the
    // next one's, at several places in the output.
    int tried = 0;
    for (int k = 2; k < ref->n_tokens && tried < 6; k += 7) {
        size_t a = decoded_len(ref->tokens, k - 1), bnd = decoded_len(ref->tokens, k),
               c = decoded_len(ref->tokens, k + 1);
        if (a == bnd || bnd == c) continue; // one of them has no text yet
        // The last character before the boundary and the first after it.
        size_t s = bnd - 1;
        while (s > 0 && ((unsigned char)ref->text[s] & 0xc0) == 0x80) s--;
        size_t e = bnd + 1;
        while (e < c && ((unsigned char)ref->text[e] & 0xc0) == 0x80) e++;
        char stop[64];
        if (e - s >= sizeof stop) continue;
        memcpy(stop, ref->text + s, e - s);
        stop[e - s] = 0;
        check_stop(&r, ref, stop);
        tried++;
    }
    assert_true(tried >= 3);
    h_batch_free(rb);
    free(prompt);
}

// vLLM's min_tokens holds stop strings off too: they are looked for only
// once more than min_tokens tokens are out, so the answer runs past an
// earlier occurrence and stops at the first one that ends in later text.
static void stop_strings_wait_for_min_tokens(void **state)
{
    (void)state;
    int32_t *prompt;
    struct engine_request r;
    struct h_batch *rb = run_reference("Once upon a time", 120, &prompt, &r);
    struct h_result *ref = &rb->res[0];
    // The stop string: the ref's first character, so it occurs early; then
    // min_tokens past the token that completes that occurrence.
    size_t cl = 1;
    while (cl < ref->text_len && ((unsigned char)ref->text[cl] & 0xc0) == 0x80) cl++;
    char stop[8];
    assert_true(cl < sizeof stop);
    memcpy(stop, ref->text, cl);
    stop[cl] = 0;
    int tried = 0;
    for (int m = 1; m < ref->n_tokens - 1 && tried < 4; m++) {
        const size_t before = decoded_len(ref->tokens, m);
        if (before < cl) continue;
        // The eos is masked within min_tokens: keep to outputs without one.
        bool has_eos = false;
        for (int i = 0; i <= m; i++)
            for (int k = 0; k < g_model->cfg.n_eos; k++) has_eos |= ref->tokens[i] == g_model->cfg.eos_ids[k];
        if (has_eos) break;
        // The first occurrence that ends in text after the first m tokens'.
        const size_t from = before - cl + 1;
        const char *later = memmem(ref->text + from, ref->text_len - from, stop, cl);
        struct h_batch *b = run_with_stop(&r, stop, m);
        struct h_result *res = &b->res[0];
        if (later) {
            const size_t cut = (size_t)(later - ref->text);
            assert_int_equal(res->finish, FINISH_STOP);
            assert_string_equal(res->stop_str, stop);
            assert_int_equal(res->text_len, cut);
            assert_true(res->n_tokens > m);
        } else {
            assert_int_equal(res->finish, FINISH_LENGTH);
            assert_int_equal(res->text_len, ref->text_len);
        }
        assert_memory_equal(res->text, ref->text, res->text_len);
        h_batch_free(b);
        tried++;
        m += 9;
    }
    assert_true(tried >= 2);
    h_batch_free(rb);
    free(prompt);
}

// Sampling from nothing but the two byte tokens of "é" (C3, A9) makes
// characters that are split across tokens, and invalid sequences that decode
// to U+FFFD; a stop string "é" is found across the split and no delta ever
// carries half a character.
static void a_character_split_across_tokens_is_never_cut(void **state)
{
    (void)state;
    if (g_byte_c3 < 0 || g_byte_a9 < 0) fail_msg("the tokenizer has no byte tokens C3 and A9");
    int32_t *prompt;
    int n;
    prompt_of("Caf", &prompt, &n);
    struct sampling_logit_bias bias[] = {{g_byte_c3, 100}, {g_byte_a9, 100}};
    int found = 0;
    for (uint64_t seed = 1; seed < 40 && found < 3; seed++) {
        struct engine_request r;
        base_request(&r, prompt, n, 40);
        r.sampling.temperature = 1;
        r.sampling.frequency_penalty = 2; // alternate between the two bytes
        r.sampling.has_seed = true;
        r.sampling.seed = seed;
        r.sampling.logit_bias = bias;
        r.sampling.n_logit_bias = 2;
        struct h_batch *rb = run_one(&r);
        struct h_result *ref = &rb->res[0];
        for (int i = 0; i < ref->n_tokens; i++)
            assert_true(ref->tokens[i] == g_byte_c3 || ref->tokens[i] == g_byte_a9);
        if (reference_cut(ref->text, ref->text_len, "\xc3\xa9") != SIZE_MAX) {
            check_stop(&r, ref, "\xc3\xa9");
            // And one more character after it, when there is one.
            size_t cut = reference_cut(ref->text, ref->text_len, "\xc3\xa9");
            if (cut + 5 <= ref->text_len) {
                char two[8];
                size_t l = 2 + ((unsigned char)ref->text[cut + 2] == 0xef ? 3 : 2);
                memcpy(two, ref->text + cut, l);
                two[l] = 0;
                if (stop_utf8_valid(two, l)) check_stop(&r, ref, two);
            }
            found++;
        }
        h_batch_free(rb);
    }
    assert_true(found >= 1);
    free(prompt);
}

static void stop_token_ids_and_eos_end_generation_without_their_text(void **state)
{
    (void)state;
    int32_t *prompt;
    struct engine_request r;
    struct h_batch *rb = run_reference("Hello", 60, &prompt, &r);
    struct h_result *ref = &rb->res[0];
    // Stop on the id of the 10th generated token.
    int32_t sid = ref->tokens[9];
    int first = 0;
    while (ref->tokens[first] != sid) first++;
    struct engine_request rs = r;
    rs.stop.stop_ids = &sid;
    rs.stop.n_stop_ids = 1;
    struct h_batch *b = run_one(&rs);
    struct h_result *res = &b->res[0];
    assert_int_equal(res->finish, FINISH_STOP);
    assert_int_equal(res->stop_id, sid);
    assert_int_equal(res->n_tokens, first + 1);
    assert_int_equal(res->completion_tokens, first + 1);
    size_t want = decoded_len(ref->tokens, first);
    assert_true(res->text_len >= want); // a pending partial character is flushed as U+FFFD
    assert_memory_equal(res->text, ref->text, want);
    h_batch_free(b);

    // eos: force it with a bias; ignore_eos lets generation go on.
    int32_t eos = g_model->cfg.eos_ids[0];
    struct sampling_logit_bias bias = {eos, 100};
    struct engine_request re = r;
    re.sampling.logit_bias = &bias;
    re.sampling.n_logit_bias = 1;
    re.stop.ignore_eos = false;
    b = run_one(&re);
    assert_int_equal(b->res[0].finish, FINISH_STOP);
    assert_int_equal(b->res[0].stop_id, -1); // the model's own end: stop_reason null, as vLLM

    assert_int_equal(b->res[0].n_tokens, 1);
    assert_int_equal(b->res[0].text_len, 0);
    h_batch_free(b);
    re.stop.ignore_eos = true;
    re.stop.max_tokens = 5;
    b = run_one(&re);
    assert_int_equal(b->res[0].finish, FINISH_LENGTH);
    assert_int_equal(b->res[0].n_tokens, 5);
    h_batch_free(b);
    h_batch_free(rb);
    free(prompt);
}

// Structured output through the engine: random sampling at temperature 1
// under a JSON schema ends at EOS with text that parses and fits the schema,
// for several seeds, batched together (half of them with ignore_eos, which
// the grammar's end outlasts no more); with grammar_after, the first token
// (forced by a bias) is free and what follows is one of the choices.
static void grammar_constrained_output_is_always_in_the_language(void **state)
{
    (void)state;
    char err[512];
    struct grammar_vocab *v;
    assert_int_equal(grammar_vocab_create(g_tok, g_model->cfg.vocab_size, g_model->cfg.eos_ids,
                                          g_model->cfg.n_eos, &v, err, sizeof err), 0);
    const char *schema = "{\"type\": \"object\", \"properties\": {\"answer\": {\"enum\": "
                         "[\"yes\", \"no\"]}, \"n\": {\"type\": \"integer\", \"minimum\": 0, "
                         "\"maximum\": 99}}, \"required\": [\"answer\", \"n\"]}";
    struct grammar *g;
    const struct grammar_source src = {.kind = GRAMMAR_JSON_SCHEMA, .text = schema,
                                       .len = strlen(schema)};
    assert_int_equal(grammar_compile(v, &src, &g, err, sizeof err), 0);
    int32_t *prompt;
    int n;
    prompt_of("Answer in JSON:", &prompt, &n);
    enum { SEEDS = 4 };
    struct h_batch *b = h_batch_new(SEEDS);
    for (int i = 0; i < SEEDS; i++) {
        struct engine_request r;
        base_request(&r, prompt, n, 120);
        r.sampling.temperature = 1;
        r.sampling.has_seed = true;
        r.sampling.seed = 100 + (uint64_t)i;
        r.stop.ignore_eos = i % 2 == 1;
        r.grammar = g;
        if (h_submit(g_engine, b, i, &r, err, sizeof err)) fail_msg("submit: %s", err);
    }
    grammar_unref(g); // the engine holds its own references
    h_wait(b, SEEDS);
    for (int i = 0; i < SEEDS; i++) {
        struct h_result *res = &b->res[i];
        if (res->has_error) fail_msg("seed %d aborted: %s", i, res->error);
        assert_int_equal(res->finish, FINISH_STOP);
        json_error_t je;
        json_t *j = json_loads(res->text, 0, &je);
        if (!j) fail_msg("seed %d: not JSON: '%s'", i, res->text);
        const char *a = json_string_value(json_object_get(j, "answer"));
        json_t *nv = json_object_get(j, "n");
        if (!a || (strcmp(a, "yes") && strcmp(a, "no")) || !json_is_integer(nv) ||
            json_integer_value(nv) < 0 || json_integer_value(nv) > 99 || json_object_size(j) != 2)
            fail_msg("seed %d: '%s' does not fit the schema", i, res->text);
        json_decref(j);
    }
    h_batch_free(b);

    const char *choices = "[\" Alpha\", \" Beta\"]";
    const struct grammar_source csrc = {.kind = GRAMMAR_CHOICE, .text = choices,
                                        .len = strlen(choices)};
    assert_int_equal(grammar_compile(v, &csrc, &g, err, sizeof err), 0);
    const int32_t first = tok_find_token(g_tok, "Hello");
    assert_true(first >= 0);
    struct engine_request r;
    base_request(&r, prompt, n, 10);
    r.stop.ignore_eos = false;
    const struct sampling_logit_bias bias = {.id = first, .bias = 100};
    r.sampling.logit_bias = &bias;
    r.sampling.n_logit_bias = 1;
    r.grammar = g;
    r.grammar_after = first;
    b = run_one(&r);
    struct h_result *res = &b->res[0];
    assert_int_equal(res->tokens[0], first);
    if (strcmp(res->text, "Hello Alpha") && strcmp(res->text, "Hello Beta"))
        fail_msg("after the free token: '%s'", res->text);
    assert_int_equal(res->finish, FINISH_STOP);
    h_batch_free(b);
    grammar_unref(g);

    // Stop strings rest inside a tool call: a grammar forces the text
    // "<tool_call>\n{\"q\": \"ABC\"}\n</tool_call> done" (a bias makes the tags
    // the single tokens a trained model writes); "ABC" inside the call does
    // not stop it, " done" after it does. Without the pause, "ABC" would. A
    // body that does not open as a call ("<tool_call>\nABC...") is content:
    // "ABC" stops it even with the pause.
    const char *const forced[2] = {"[\"<tool_call>\\n{\\\"q\\\": \\\"ABC\\\"}\\n</tool_call> done\"]",
                                   "[\"<tool_call>\\nABC\\n</tool_call> done\"]"};
    const char *stops[2] = {"ABC", " done"};
    const struct sampling_logit_bias tags[2] = {{tok_find_token(g_tok, "<tool_call>"), 100},
                                                {tok_find_token(g_tok, "</tool_call>"), 100}};
    for (int body = 0; body < 2; body++) {
        const struct grammar_source fsrc = {.kind = GRAMMAR_CHOICE, .text = forced[body],
                                            .len = strlen(forced[body])};
        assert_int_equal(grammar_compile(v, &fsrc, &g, err, sizeof err), 0);
        for (int pause = 0; pause < 2; pause++) {
            base_request(&r, prompt, n, 30);
            r.stop.ignore_eos = false;
            r.grammar = g;
            r.sampling.logit_bias = tags;
            r.sampling.n_logit_bias = 2;
            r.stop.stop_strs = stops;
            r.stop.n_stop_strs = 2;
            r.stop.skip_special_tokens = false;
            if (pause) {
                r.stop_pause_open = tok_find_token(g_tok, "<tool_call>");
                r.stop_pause_close = tok_find_token(g_tok, "</tool_call>");
                assert_true(r.stop_pause_open >= 0 && r.stop_pause_close >= 0);
            }
            b = run_one(&r);
            res = &b->res[0];
            assert_int_equal(res->finish, FINISH_STOP);
            if (pause && body == 0) {
                assert_string_equal(res->text, "<tool_call>\n{\"q\": \"ABC\"}\n</tool_call>");
                assert_string_equal(res->stop_str, " done");
            } else {
                assert_string_equal(res->text, body == 0 ? "<tool_call>\n{\"q\": \"" : "<tool_call>\n");
                assert_string_equal(res->stop_str, "ABC");
            }
            h_batch_free(b);
        }
        grammar_unref(g);
    }
    grammar_vocab_destroy(v);
    free(prompt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(streamed_text_equals_the_full_decode),
        cmocka_unit_test(stop_strings_split_across_tokens_cut_the_text_and_never_appear),
        cmocka_unit_test(stop_strings_wait_for_min_tokens),
        cmocka_unit_test(a_character_split_across_tokens_is_never_cut),
        cmocka_unit_test(stop_token_ids_and_eos_end_generation_without_their_text),
        cmocka_unit_test(grammar_constrained_output_is_always_in_the_language),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
