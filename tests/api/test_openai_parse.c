// Pins request validation: every parameter's type and range, malformed and
// hostile bodies, defaults from generation_config, and the error envelope.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/openai.h"
#include "base/base.h"
#include "tests/hostile_json.h"

static const struct oa_limits limits = {.gen = NULL, .vocab_size = 1000, .max_model_len = 512};

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static int chat(const char *body, struct oa_chat_request *r, struct oa_error *e,
                struct arena *a, const struct oa_limits *lim)
{
    return oa_parse_chat(body, strlen(body), lim ? lim : &limits, a, r, e);
}

static void expect_chat_error(const char *body, int http, const char *param)
{
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    int rc = chat(body, &r, &e, a, NULL);
    if (rc == 0) fail_msg("accepted: %s", body);
    if (e.http != http || strcmp(e.param, param)) {
        fail_msg("%s: got %d param '%s' (%s), want %d '%s'", body, e.http, e.param, e.message,
                 http, param);
    }
    assert_true(e.message[0] != 0);
    arena_destroy(a);
}

static void expect_completion_error(const char *body, int http, const char *param)
{
    struct arena *a = arena_create(4096);
    struct oa_completion_request r;
    struct oa_error e;
    int rc = oa_parse_completion(body, strlen(body), &limits, a, &r, &e);
    if (rc == 0) fail_msg("accepted: %s", body);
    if (e.http != http || strcmp(e.param, param))
        fail_msg("%s: got %d param '%s' (%s), want %d '%s'", body, e.http, e.param, e.message,
                 http, param);
    arena_destroy(a);
}

static void malformed_json_is_400_without_param(void **state)
{
    (void)state;
    const char *bodies[] = {
        "",
        "{",
        "{\"messages\": [",
        "{\"messages\": []} trailing",
        "[1, 2]",
        "\"just a string\"",
        "null",
        "{\"a\": 1, \"a\": 2}",          // duplicate keys
        "{\"model\": \"x\" \"n\": 1}",   // missing comma
        "{\"temperature\": NaN}",
        "{\"temperature\": Infinity}",
        "{\"n\": 99999999999999999999999}", // beyond any integer type
        "{\"temperature\": 1e999}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) expect_chat_error(bodies[i], 400, "");
    // A NUL character in a string: refused in the user's terms, with where.
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    const char *nul = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}";
    assert_int_not_equal(chat(nul, &r, &e, a, NULL), 0);
    assert_int_equal(e.http, 400);
    assert_non_null(strstr(e.message, "NUL character"));
    assert_non_null(strstr(e.message, "column"));
    assert_null(strstr(e.message, "JSON_ALLOW_NUL"));
    arena_destroy(a);
}

static void invalid_utf8_is_refused(void **state)
{
    (void)state;
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", 400, "");
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", 400, "");
    // A lone surrogate escape is invalid too.
    expect_chat_error("{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", 400, "");
    // Embedded NUL bytes in the body are not JSON.
    const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\0b\"}]}";
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    assert_int_not_equal(oa_parse_chat(body, sizeof body - 1, &limits, a, &r, &e), 0);
    assert_int_equal(e.http, 400);
    arena_destroy(a);
}

struct wrong {
    const char *param;
    const char *value;
};

static void wrong_types_name_the_parameter(void **state)
{
    (void)state;
    const struct wrong cases[] = {
        {"model", "1"},
        {"max_tokens", "\"10\""},
        {"max_tokens", "1.5"},
        {"max_completion_tokens", "true"},
        {"temperature", "\"hot\""},
        {"top_p", "[1]"},
        {"top_k", "2.5"},
        {"min_p", "{}"},
        {"n", "\"2\""},
        {"stop", "5"},
        {"seed", "\"42\""},
        {"presence_penalty", "false"},
        {"frequency_penalty", "\"0\""},
        {"repetition_penalty", "[]"},
        {"logit_bias", "[1,2]"},
        {"logprobs", "1"},
        {"top_logprobs", "\"3\""},
        {"stream", "\"yes\""},
        {"stream_options", "true"},
        {"ignore_eos", "0"},
        {"chat_template_kwargs", "\"enable_thinking\""},
        {"return_tokens_as_token_ids", "\"true\""},
        {"user", "7"},
        {"add_generation_prompt", "1"},
        {"stop_token_ids", "3"},
        {"skip_special_tokens", "\"no\""},
        {"request_id", "12"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" MSGS ", \"%s\": %s}", cases[i].param, cases[i].value);
        expect_chat_error(body, 400, cases[i].param);
    }
    // Elements carry their index.
    expect_chat_error("{" MSGS ", \"stop\": [\"a\", 3]}", 400, "stop[1]");
    expect_chat_error("{" MSGS ", \"stop_token_ids\": [1, \"x\"]}", 400, "stop_token_ids[1]");
    expect_chat_error("{" MSGS ", \"logit_bias\": {\"5\": \"x\"}}", 400, "logit_bias[5]");
    expect_chat_error("{" MSGS ", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}",
                      400, "stream_options.include_usage");
}

static void wrong_types_in_completions(void **state)
{
    (void)state;
    const struct wrong cases[] = {
        {"prompt", "5"},
        {"prompt", "{}"},
        {"logprobs", "true"},
        {"echo", "\"yes\""},
        {"best_of", "\"2\""},
        {"max_tokens", "\"1\""},
        {"temperature", "null, \"temperature\": \"x\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        if (!strcmp(cases[i].param, "prompt"))
            snprintf(body, sizeof body, "{\"prompt\": %s}", cases[i].value);
        else
            snprintf(body, sizeof body, "{\"prompt\": \"hi\", \"%s\": %s}", cases[i].param,
                     cases[i].value);
        // Duplicate keys are malformed JSON, which names no parameter.
        expect_completion_error(body, 400, strstr(body, "null,") ? "" : cases[i].param);
    }
    expect_completion_error("{\"prompt\": [\"a\", 1]}", 400, "prompt[1]");
    expect_completion_error("{\"prompt\": [[1, 2], \"a\"]}", 400, "prompt[1]");
    expect_completion_error("{\"prompt\": [[1, 2], []]}", 400, "prompt[1]");
    expect_completion_error("{\"prompt\": [1, \"a\"]}", 400, "prompt[1]");
    expect_completion_error("{\"prompt\": [1, 1000]}", 400, "prompt[1]"); // beyond the vocabulary
    expect_completion_error("{\"prompt\": [-1]}", 400, "prompt[0]");
    expect_completion_error("{\"prompt\": []}", 400, "prompt");
    expect_completion_error("{\"prompt\": [true]}", 400, "prompt[0]");
    expect_completion_error("{}", 400, "prompt");
    expect_completion_error("{\"prompt\": \"a\", \"logprobs\": 21}", 400, "logprobs");
    expect_completion_error("{\"prompt\": \"a\", \"best_of\": 3}", 400, "best_of");
    expect_completion_error("{\"prompt\": \"a\", \"suffix\": \"b\"}", 400, "suffix");
}

// A model's vocabulary is padded past the tokenizer's (Qwen3: 151936 rows,
// 151669 ids with text): prompt and detokenize ids must have text, while
// logit_bias and stop_token_ids may name any row of the logits.
static void prompt_ids_must_have_text_while_logit_ids_may_be_padding(void **state)
{
    (void)state;
    const struct oa_limits padded = {.vocab_size = 1000, .text_vocab_size = 900, .max_model_len = 512};
    struct arena *a = arena_create(4096);
    assert_non_null(a);
    struct oa_completion_request r;
    struct oa_detokenize_request d;
    struct oa_error e;
    const char *ok = "{\"prompt\": [1, 899], \"logit_bias\": {\"950\": 5}, \"stop_token_ids\": [999]}";
    assert_int_equal(oa_parse_completion(ok, strlen(ok), &padded, a, &r, &e), 0);
    assert_int_equal(r.prompts[0].ids[1], 899);
    const char *bad[][2] = {
        {"{\"prompt\": [1, 900]}", "prompt[1]"},
        {"{\"prompt\": [[1], [2, 950]]}", "prompt[1][1]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_not_equal(oa_parse_completion(bad[i][0], strlen(bad[i][0]), &padded, a, &r, &e), 0);
        assert_int_equal(e.http, 400);
        assert_string_equal(e.param, bad[i][1]);
        if (!strstr(e.message, "0 to 899")) fail_msg("message: %s", e.message);
    }
    const char *dt = "{\"tokens\": [950]}";
    assert_int_not_equal(oa_parse_detokenize(dt, strlen(dt), &padded, a, &d, &e), 0);
    assert_string_equal(e.param, "tokens[0]");
    arena_destroy(a);
}

static void out_of_range_values_are_refused(void **state)
{
    (void)state;
    const struct wrong cases[] = {
        {"max_tokens", "-1"},
        {"max_tokens", "0"},
        {"max_tokens", "-99999999999"},
        {"max_tokens", "99999999999"},
        {"max_tokens", "1e30"},
        {"max_completion_tokens", "-5"},
        {"temperature", "-0.1"},
        {"temperature", "2.5"},
        {"temperature", "1e308"},
        {"top_p", "0"},
        {"top_p", "1.01"},
        {"top_p", "1e-50"}, // above 0, but 0 as the float the engine takes
        {"repetition_penalty", "1e-50"},
        {"top_k", "-2"},
        {"top_k", "9999999999"},
        {"min_p", "1.5"},
        {"n", "0"},
        {"n", "129"},
        {"n", "-3"},
        {"presence_penalty", "2.1"},
        {"frequency_penalty", "-3"},
        {"repetition_penalty", "0"},
        {"repetition_penalty", "1e39"}, // any finite value above 0 (vLLM's), as a float
        {"top_logprobs", "21"},
        {"top_logprobs", "-1"},
        {"stop", "\"\""},
        {"stop", "[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\","
                 "\"n\",\"o\",\"p\",\"q\"]"},
        {"request_id", "\"has space\""},
        {"request_id", "\"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" MSGS ", \"%s\": %s}", cases[i].param, cases[i].value);
        expect_chat_error(body, 400, cases[i].param);
    }
    expect_chat_error("{" MSGS ", \"stop\": [\"\"]}", 400, "stop[0]");
    // A stop string longer than the engine takes, named here rather than
    // refused by the engine under the messages' name.
    char longstop[OA_MAX_STOP_BYTES + 2], body[OA_MAX_STOP_BYTES + 256];
    memset(longstop, 'a', sizeof longstop - 1);
    longstop[sizeof longstop - 1] = 0;
    snprintf(body, sizeof body, "{" MSGS ", \"stop\": [\"x\", \"%s\"]}", longstop);
    expect_chat_error(body, 400, "stop[1]");
    snprintf(body, sizeof body, "{" MSGS ", \"stop\": \"%s\"}", longstop);
    expect_chat_error(body, 400, "stop");
    longstop[OA_MAX_STOP_BYTES] = 0; // exactly the limit: taken
    snprintf(body, sizeof body, "{" MSGS ", \"stop\": [\"%s\"]}", longstop);
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    assert_int_equal(chat(body, &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.n_stop, 1);
    oa_chat_request_release(&r);
    arena_destroy(a);
    expect_chat_error("{" MSGS ", \"logit_bias\": {\"1000\": 1}}", 400, "logit_bias[1000]");
    expect_chat_error("{" MSGS ", \"logit_bias\": {\"-1\": 1}}", 400, "logit_bias[-1]");
    expect_chat_error("{" MSGS ", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias[abc]");
    expect_chat_error("{" MSGS ", \"stop_token_ids\": [1000]}", 400, "stop_token_ids[0]");
    // What vLLM takes where OpenAI's range is narrower: a logit_bias beyond
    // +-100 is clamped to it (1e39 too, past a float), repetition_penalty above 10 is taken, and a seed
    // of -1 is no seed.
    a = arena_create(4096);
    assert_int_equal(chat("{" MSGS ", \"logit_bias\": {\"5\": 150, \"6\": -1e6, \"7\": 1e39}, \"repetition_penalty\": 12,"
                          " \"seed\": -1}", &r, &e, a, NULL), 0);
    assert_float_equal(r.gen.sampling.logit_bias[0].bias, 100.0f, 0);
    assert_float_equal(r.gen.sampling.logit_bias[1].bias, -100.0f, 0);
    assert_float_equal(r.gen.sampling.logit_bias[2].bias, 100.0f, 0); // past a float, clamped all the same
    assert_float_equal(r.gen.sampling.repetition_penalty, 12.0f, 0);
    assert_false(r.gen.sampling.has_seed);
    oa_chat_request_release(&r);
    arena_destroy(a);
    // Keys that name one id are one entry, the last winning (vLLM's
    // {int(k): v}): never two biases added past 100.
    a = arena_create(4096);
    assert_int_equal(chat("{" MSGS ", \"logit_bias\": {\"5\": 50, \"6\": 1, \"005\": 60}}", &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.sampling.n_logit_bias, 2);
    assert_int_equal(r.gen.sampling.logit_bias[0].id, 5);
    assert_float_equal(r.gen.sampling.logit_bias[0].bias, 60.0f, 0);
    assert_int_equal(r.gen.sampling.logit_bias[1].id, 6);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

static void max_tokens_beyond_context_says_both_numbers(void **state)
{
    (void)state;
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    assert_int_equal(chat("{" MSGS ", \"max_tokens\": 99999999999}", &r, &e, a, NULL), MS_ETOOLONG);
    assert_int_equal(e.http, 400);
    assert_string_equal(e.code, "context_length_exceeded");
    assert_non_null(strstr(e.message, "99999999999"));
    assert_non_null(strstr(e.message, "512"));
    arena_destroy(a);
}

static void messages_are_validated(void **state)
{
    (void)state;
    expect_chat_error("{}", 400, "messages");
    expect_chat_error("{\"messages\": []}", 400, "messages");
    expect_chat_error("{\"messages\": null}", 400, "messages");
    expect_chat_error("{\"messages\": {}}", 400, "messages");
    expect_chat_error("{\"messages\": [\"hi\"]}", 400, "messages[0]");
    expect_chat_error("{\"messages\": [{\"content\": \"hi\"}]}", 400, "messages[0].role");
    expect_chat_error("{\"messages\": [{\"role\": 1, \"content\": \"hi\"}]}", 400,
                      "messages[0].role");
    expect_chat_error("{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", 400,
                      "messages[0].role");
    expect_chat_error("{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content");
    expect_chat_error("{\"messages\": [{\"role\": \"user\", \"content\": null}]}", 400,
                      "messages[0].content");
    expect_chat_error("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400,
                      "messages[0].content");
    expect_chat_error("{\"messages\": [{\"role\": \"user\", \"content\": [5]}]}", 400,
                      "messages[0].content[0]");
    expect_chat_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"text\": \"a\"}]}]}",
                      400, "messages[0].content[0].type");
    expect_chat_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
                      400, "messages[0].content[0].text");
    expect_chat_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\","
                      " \"image_url\": {\"url\": \"http://x\"}}]}]}",
                      400, "messages[0].content[0].type");
    expect_chat_error("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": "
                      "\"user\", \"content\": [{\"type\": \"text\", \"text\": 3}]}]}",
                      400, "messages[1].content[0].text");
}

static void text_parts_join_with_newlines_and_other_keys_pass_through(void **state)
{
    (void)state;
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                       "\"text\": \"one\"}, {\"type\": \"text\", \"text\": \"two\"}]}, {\"role\": "
                       "\"assistant\", \"content\": null, \"reasoning_content\": \"r\"}]}";
    assert_int_equal(chat(body, &r, &e, a, NULL), 0);
    assert_int_equal(json_array_size(r.messages), 2);
    json_t *m0 = json_array_get(r.messages, 0);
    assert_string_equal(json_string_value(json_object_get(m0, "content")), "one\ntwo");
    json_t *m1 = json_array_get(r.messages, 1);
    assert_string_equal(json_string_value(json_object_get(m1, "content")), "");
    assert_string_equal(json_string_value(json_object_get(m1, "reasoning_content")), "r");
    assert_true(r.add_generation_prompt);
    oa_chat_request_release(&r);
    // As vLLM hands them to templates: an assistant's reasoning (our own
    // answers' name for it) is its reasoning_content, over one also given;
    // call arguments are the JSON object their text holds, {} where the
    // text holds none (not JSON, or a list: vLLM since its PR 48922).
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": "
           "\"\", \"reasoning\": \"think A\", \"reasoning_content\": \"old\", \"tool_calls\": ["
           "{\"id\": \"1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"not json\"}},"
           "{\"id\": \"2\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"[1,2]\"}},"
           "{\"id\": \"3\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]}]}";
    assert_int_equal(chat(body, &r, &e, a, NULL), 0);
    m1 = json_array_get(r.messages, 1);
    assert_string_equal(json_string_value(json_object_get(m1, "reasoning_content")), "think A");
    json_t *calls = json_object_get(m1, "tool_calls");
    json_t *none = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    assert_true(json_is_object(none) && json_object_size(none) == 0);
    json_t *list = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
    assert_true(json_is_object(list) && json_object_size(list) == 0);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(json_object_get(json_array_get(calls, 2), "function"), "arguments"), "x")), 1);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

static void omitted_sampling_comes_from_generation_config(void **state)
{
    (void)state;
    struct gen_defaults g = {.has_temperature = true, .temperature = 0.6f, .has_top_p = true,
                             .top_p = 0.95f, .has_top_k = true, .top_k = 20};
    struct oa_limits lim = limits;
    lim.gen = &g;
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    assert_int_equal(chat("{" MSGS "}", &r, &e, a, &lim), 0);
    assert_float_equal(r.gen.sampling.temperature, 0.6f, 1e-6);
    assert_float_equal(r.gen.sampling.top_p, 0.95f, 1e-6);
    assert_int_equal(r.gen.sampling.top_k, 20);
    assert_float_equal(r.gen.sampling.min_p, 0.0f, 0);
    assert_float_equal(r.gen.sampling.repetition_penalty, 1.0f, 0);
    assert_int_equal(r.gen.max_tokens, 0);
    assert_int_equal(r.gen.n, 1);
    assert_int_equal(r.gen.logprobs, -1);
    assert_true(r.gen.skip_special_tokens);
    oa_chat_request_release(&r);
    // What the request gives wins, null included as "not given".
    assert_int_equal(chat("{" MSGS ", \"temperature\": 0, \"top_k\": -1, \"top_p\": null}", &r,
                          &e, a, &lim), 0);
    assert_float_equal(r.gen.sampling.temperature, 0.0f, 0);
    assert_int_equal(r.gen.sampling.top_k, 0);
    assert_float_equal(r.gen.sampling.top_p, 0.95f, 1e-6);
    oa_chat_request_release(&r);
    // Without generation_config: vLLM's neutral defaults.
    assert_int_equal(chat("{" MSGS "}", &r, &e, a, NULL), 0);
    assert_float_equal(r.gen.sampling.temperature, 1.0f, 0);
    assert_float_equal(r.gen.sampling.top_p, 1.0f, 0);
    assert_int_equal(r.gen.sampling.top_k, 0);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

static void every_parameter_lands_in_the_request(void **state)
{
    (void)state;
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    const char *body =
        "{\"model\": \"m\", " MSGS ", \"max_tokens\": 7, \"max_completion_tokens\": 9, "
        "\"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 5, \"min_p\": 0.1, \"n\": 3, "
        "\"stop\": [\"x\", \"yz\"], \"seed\": -42, \"presence_penalty\": 0.5, "
        "\"frequency_penalty\": -0.5, \"repetition_penalty\": 1.1, \"logit_bias\": {\"5\": -100, "
        "\"7\": 2.5}, \"logprobs\": true, \"top_logprobs\": 4, \"stream\": true, "
        "\"stream_options\": {\"include_usage\": true, \"continuous_usage_stats\": false}, "
        "\"ignore_eos\": true, \"chat_template_kwargs\": {\"enable_thinking\": false}, "
        "\"return_tokens_as_token_ids\": true, \"user\": \"u\", \"add_generation_prompt\": false, "
        "\"stop_token_ids\": [3, 4], \"skip_special_tokens\": false, \"request_id\": \"abc-1\", "
        "\"tools\": [], \"tool_choice\": \"none\", \"store\": false, \"weird_field\": 1}";
    assert_int_equal(chat(body, &r, &e, a, NULL), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.gen.max_tokens, 9); // max_completion_tokens wins
    assert_float_equal(r.gen.sampling.temperature, 0.5f, 1e-6);
    assert_float_equal(r.gen.sampling.top_p, 0.9f, 1e-6);
    assert_int_equal(r.gen.sampling.top_k, 5);
    assert_float_equal(r.gen.sampling.min_p, 0.1f, 1e-6);
    assert_int_equal(r.gen.n, 3);
    assert_int_equal(r.gen.n_stop, 2);
    assert_string_equal(r.gen.stop[1], "yz");
    assert_true(r.gen.sampling.has_seed);
    assert_int_equal(r.gen.sampling.seed, -42);
    assert_float_equal(r.gen.sampling.presence_penalty, 0.5f, 1e-6);
    assert_float_equal(r.gen.sampling.frequency_penalty, -0.5f, 1e-6);
    assert_float_equal(r.gen.sampling.repetition_penalty, 1.1f, 1e-6);
    assert_int_equal(r.gen.sampling.n_logit_bias, 2);
    assert_int_equal(r.gen.sampling.logit_bias[0].id, 5);
    assert_float_equal(r.gen.sampling.logit_bias[0].bias, -100.0f, 0);
    assert_int_equal(r.gen.logprobs, 4);
    assert_true(r.gen.stream);
    assert_true(r.gen.include_usage);
    assert_false(r.gen.continuous_usage_stats);
    assert_true(r.gen.ignore_eos);
    assert_true(json_is_false(json_object_get(r.chat_template_kwargs, "enable_thinking")));
    assert_true(r.gen.return_tokens_as_token_ids);
    assert_string_equal(r.gen.user, "u");
    assert_false(r.add_generation_prompt);
    assert_int_equal(r.gen.n_stop_token_ids, 2);
    assert_int_equal(r.gen.stop_token_ids[1], 4);
    assert_false(r.gen.skip_special_tokens);
    assert_string_equal(r.gen.request_id, "abc-1");
    assert_string_equal(r.ignored, "weird_field");
    oa_chat_request_release(&r);
    // logprobs without top_logprobs: the chosen token only.
    assert_int_equal(chat("{" MSGS ", \"logprobs\": true}", &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.logprobs, 0);
    assert_null(r.ignored);
    oa_chat_request_release(&r);
    // Integral reals count as integers.
    assert_int_equal(chat("{" MSGS ", \"max_tokens\": 16.0, \"n\": 2.0}", &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.max_tokens, 16);
    assert_int_equal(r.gen.n, 2);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

// Values of every JSON type and at the edges of every numeric range.
static const char *hostile[] = {
    "null", "true", "false", "0", "-1", "1", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "-9223372036854775808", "1e308", "-1e308", "0.5", "-0.0", "1e-320",
    "\"\"", "\"x\"", "\"\\u0000\"", "[]", "[null]", "[1, \"a\", {}]", "{}", "{\"a\": {\"b\": []}}",
};

struct chat_sweep {
    json_t *root;
    int taken, refused;
};

// The request as it stands after one edit of the sweep: taken, or refused
// as a 4xx with a message.
static void parse_swept(const char *key, const char *value, void *ctx)
{
    struct chat_sweep *c = ctx;
    char *text = json_dumps(c->root, 0);
    assert_non_null(text);
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    memset(&e, 0, sizeof e);
    if (chat(text, &r, &e, a, NULL) == 0) {
        c->taken++;
        oa_chat_request_release(&r);
    } else {
        c->refused++;
        if (e.http < 400 || e.http > 499 || !e.message[0])
            fail_msg("%s = %s: http %d, message '%s'", key, value, e.http, e.message);
    }
    arena_destroy(a);
    free(text);
}

// Every parameter of a request that sets them all (and each field of its
// message) replaced in turn by every hostile value: the request is either
// taken or refused as a 4xx with a message — never a crash, which the
// AddressSanitizer pass of the test command checks for memory errors too.
static void every_parameter_replaced_by_a_hostile_value_is_taken_or_refused(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"m\", " MSGS ", \"max_tokens\": 7, \"max_completion_tokens\": 9, "
        "\"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 5, \"min_p\": 0.1, \"n\": 3, "
        "\"stop\": [\"x\", \"yz\"], \"seed\": -42, \"presence_penalty\": 0.5, "
        "\"frequency_penalty\": -0.5, \"repetition_penalty\": 1.1, \"logit_bias\": {\"5\": -100}, "
        "\"logprobs\": true, \"top_logprobs\": 4, \"stream\": true, "
        "\"stream_options\": {\"include_usage\": true}, \"ignore_eos\": true, "
        "\"chat_template_kwargs\": {\"enable_thinking\": false}, \"return_tokens_as_token_ids\": true, "
        "\"user\": \"u\", \"add_generation_prompt\": false, \"stop_token_ids\": [3, 4], "
        "\"skip_special_tokens\": false, \"request_id\": \"abc-1\", \"tools\": [], "
        "\"tool_choice\": \"none\"}";
    json_t *root = json_loads(body, 0, NULL);
    assert_non_null(root);
    {
        struct arena *a = arena_create(4096);
        struct oa_chat_request r;
        struct oa_error e;
        if (chat(body, &r, &e, a, NULL)) fail_msg("the unedited request is refused: %s", e.message);
        oa_chat_request_release(&r);
        arena_destroy(a);
    }
    struct chat_sweep c = {.root = root};
    // Top-level keys, then the message's own fields.
    json_t *msg = json_array_get(json_object_get(root, "messages"), 0);
    hostile_json_sweep(root, hostile, sizeof hostile / sizeof hostile[0], parse_swept, &c);
    hostile_json_sweep(msg, hostile, sizeof hostile / sizeof hostile[0], parse_swept, &c);
    assert_true(c.taken > 0 && c.refused > 0);
    json_decref(root);
}

static void unimplemented_parameters_are_refused_by_name(void **state)
{
    (void)state;
    const struct wrong cases[] = {
        {"functions", "[{\"name\": \"f\"}]"},
        {"use_beam_search", "true"},
        {"echo", "true"},
        {"chat_template", "\"{{ messages }}\""},
        {"audio", "{}"},
        {"modalities", "[\"audio\"]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" MSGS ", \"%s\": %s}", cases[i].param, cases[i].value);
        expect_chat_error(body, 400, cases[i].param);
    }
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    assert_int_equal(chat("{" MSGS ", \"use_beam_search\": true}", &r, &e, a, NULL), MS_EUNSUPPORTED);
    assert_string_equal(e.code, "unsupported_parameter");
    assert_non_null(strstr(e.message, "use_beam_search"));
    // min_tokens is served now (vLLM's); beyond max_tokens it is refused.
    assert_int_equal(chat("{" MSGS ", \"min_tokens\": 3}", &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.min_tokens, 3);
    oa_chat_request_release(&r);
    expect_chat_error("{" MSGS ", \"min_tokens\": 9, \"max_tokens\": 4}", 400, "min_tokens");
    expect_chat_error("{" MSGS ", \"min_tokens\": 9, \"n_predict\": 4}", 400, "min_tokens");
    // Their "off" values and nulls are fine.
    assert_int_equal(chat("{" MSGS ", \"response_format\": null, \"tools\": null, \"echo\": false,"
                          " \"min_tokens\": 0, \"use_beam_search\": false}", &r, &e, a, NULL), 0);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

// What agents send: tools with tool_choice, reasoning switches and every
// spelling of structured output are parsed into the request, and their
// malformed or contradictory forms are refused naming the parameter.
static void agent_fields_are_parsed_and_checked(void **state)
{
    (void)state;
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
#define TOOL "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}"
    assert_int_equal(chat("{" MSGS ", \"tools\": [" TOOL "], \"tool_choice\": {\"type\": \"function\", "
                          "\"function\": {\"name\": \"get_weather\"}}, \"parallel_tool_calls\": false, "
                          "\"reasoning_effort\": \"none\", \"include_reasoning\": false, \"store\": true, "
                          "\"modalities\": [\"text\"]}", &r, &e, a, NULL), 0);
    assert_int_equal(json_array_size(r.tools), 1);
    assert_int_equal(r.tool_choice, OA_TOOL_NAMED);
    assert_string_equal(r.tool_choice_name, "get_weather");
    assert_false(r.parallel_tool_calls);
    assert_int_equal(r.thinking, 0);
    assert_false(r.include_reasoning);
    oa_chat_request_release(&r);
    // The template gets tools as vLLM's pydantic models dump them: type
    // (given or not), then function's name, description, parameters (null
    // when absent), then each level's other keys as the client wrote them,
    // nulls too, in its order.
    assert_int_equal(chat("{" MSGS ", \"tools\": [{\"function\": {\"parameters\": {\"type\": \"object\"}, \"x-extra\": 1, "
                          "\"strict\": true, \"name\": \"f\"}, \"cache_control\": {\"type\": \"ephemeral\"}, "
                          "\"type\": \"function\"}, {\"function\": {\"name\": \"g\", \"strict\": null}}]}",
                          &r, &e, a, NULL), 0);
    char *dumped = json_dumps(r.tools, JSON_COMPACT);
    assert_string_equal(dumped, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":null,"
                                "\"parameters\":{\"type\":\"object\"},\"x-extra\":1,\"strict\":true},"
                                "\"cache_control\":{\"type\":\"ephemeral\"}},{\"type\":\"function\","
                                "\"function\":{\"name\":\"g\",\"description\":null,\"parameters\":null,"
                                "\"strict\":null}}]");
    free(dumped);
    oa_chat_request_release(&r);
    assert_int_equal(chat("{" MSGS "}", &r, &e, a, NULL), 0);
    assert_null(r.tools);
    assert_int_equal(r.tool_choice, OA_TOOL_AUTO);
    assert_int_equal(r.thinking, -1);
    assert_int_equal(r.gen.structured.kind, OA_SO_NONE);
    oa_chat_request_release(&r);
    // The SDK's newer efforts think; names as long as Anthropic's (128) pass.
    assert_int_equal(chat("{" MSGS ", \"reasoning_effort\": \"xhigh\"}", &r, &e, a, NULL), 0);
    assert_int_equal(r.thinking, 1);
    oa_chat_request_release(&r);
    assert_int_equal(chat("{" MSGS ", \"reasoning_effort\": \"max\"}", &r, &e, a, NULL), 0);
    assert_int_equal(r.thinking, 1);
    oa_chat_request_release(&r);
    char longname[400], n128[129], n129[130];
    memset(n128, 'a', 128);
    n128[128] = 0;
    memset(n129, 'a', 129);
    n129[129] = 0;
    snprintf(longname, sizeof longname, "{" MSGS ", \"tools\": [{\"type\": \"function\", \"function\": "
             "{\"name\": \"%s\"}}]}", n128);
    assert_int_equal(chat(longname, &r, &e, a, NULL), 0);
    oa_chat_request_release(&r);
    snprintf(longname, sizeof longname, "{" MSGS ", \"tools\": [{\"type\": \"function\", \"function\": "
             "{\"name\": \"%s\"}}]}", n129);
    expect_chat_error(longname, 400, "tools[0].function.name");
    const struct {
        const char *field;
        enum oa_structured_kind kind;
        const char *text;
    } so[] = {
        {"\"response_format\": {\"type\": \"text\"}", OA_SO_NONE, NULL},
        {"\"response_format\": {\"type\": \"json_object\"}", OA_SO_JSON_OBJECT, ""},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
         "\"schema\": {\"type\": \"integer\"}, \"strict\": true}}", OA_SO_JSON_SCHEMA,
         "{\"type\": \"integer\"}"},
        {"\"structured_outputs\": {\"regex\": \"[0-9]+\"}", OA_SO_REGEX, "[0-9]+"},
        {"\"structured_outputs\": {\"choice\": [\"a\", \"b\"], \"disable_any_whitespace\": true}",
         OA_SO_CHOICE, "[\"a\", \"b\"]"},
        {"\"structured_outputs\": {\"grammar\": \"root ::= \\\"x\\\"\"}", OA_SO_GRAMMAR, "root ::= \"x\""},
        {"\"guided_json\": {\"type\": \"string\"}", OA_SO_JSON_SCHEMA, "{\"type\": \"string\"}"},
        {"\"guided_choice\": [\"yes\"]", OA_SO_CHOICE, "[\"yes\"]"},
        {"\"json_schema\": {\"type\": \"boolean\"}", OA_SO_JSON_SCHEMA, "{\"type\": \"boolean\"}"},
        {"\"grammar\": \"root ::= [0-9]\"", OA_SO_GRAMMAR, "root ::= [0-9]"},
    };
    for (size_t i = 0; i < sizeof so / sizeof so[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" MSGS ", %s}", so[i].field);
        if (chat(body, &r, &e, a, NULL)) fail_msg("%s: %s", body, e.message);
        assert_int_equal(r.gen.structured.kind, so[i].kind);
        assert_int_equal(r.gen.structured.compact_json, strstr(so[i].field, "disable_any_whitespace") != NULL);
        if (so[i].text) {
            // Schemas come back as compact JSON: compare as JSON.
            json_t *want = json_loads(so[i].text, JSON_DECODE_ANY, NULL);
            json_t *got = json_loads(r.gen.structured.text, JSON_DECODE_ANY, NULL);
            if (want && got) assert_true(json_equal(want, got));
            else assert_string_equal(r.gen.structured.text, so[i].text);
            json_decref(want);
            json_decref(got);
        }
        oa_chat_request_release(&r);
    }
    const struct wrong bad[] = {
        {"tools", "{}"},
        {"tools[0].type", "[{\"type\": \"retrieval\"}]"},
        {"tools[0].function.name", "[{\"type\": \"function\", \"function\": {\"name\": \"has space\"}}]"},
        {"tools[1].function.name", "[" TOOL ", " TOOL "]"},
        {"tools[0].function.parameters", "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]"},
        {"tool_choice", "\"sometimes\""},
        {"reasoning_effort", "\"extreme\""},
        {"response_format.type", "{\"type\": \"yaml\"}"},
        {"response_format.json_schema.schema", "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": 5}}"},
        {"structured_outputs.choice", "{\"choice\": []}"},
        {"structured_outputs.structural_tag", "{\"structural_tag\": \"x\"}"},
        {"n_predict", "0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[768];
        const char *field = strchr(bad[i].param, '.') || strchr(bad[i].param, '[')
                                ? strndup(bad[i].param, strcspn(bad[i].param, ".["))
                                : strdup(bad[i].param);
        snprintf(body, sizeof body, "{" MSGS ", \"%s\": %s}", field, bad[i].value);
        expect_chat_error(body, 400, bad[i].param);
        free((void *)field);
    }
    // Cross-field: a named choice must name a tool; a forced call needs tools
    // and excludes another format; two formats at once are refused.
    expect_chat_error("{" MSGS ", \"tools\": [" TOOL "], \"tool_choice\": {\"type\": \"function\", "
                      "\"function\": {\"name\": \"other\"}}}", 400, "tool_choice.function.name");
    expect_chat_error("{" MSGS ", \"tool_choice\": \"required\"}", 400, "tool_choice");
    // continue_final_message: the final message must be the assistant's, and
    // there is no generation prompt beside it (vLLM's rules).
#define PREFILL "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"The\"}]"
    assert_int_equal(chat("{" PREFILL ", \"continue_final_message\": true, \"add_generation_prompt\": false}", &r, &e, a,
                          NULL), 0);
    assert_true(r.continue_final_message);
    assert_false(r.add_generation_prompt);
    oa_chat_request_release(&r);
    expect_chat_error("{" PREFILL ", \"continue_final_message\": true}", 400, "continue_final_message");
    expect_chat_error("{" MSGS ", \"continue_final_message\": true, \"add_generation_prompt\": false}", 400,
                      "continue_final_message");
#undef PREFILL
    expect_chat_error("{" MSGS ", \"tools\": [" TOOL "], \"tool_choice\": \"required\", "
                      "\"response_format\": {\"type\": \"json_object\"}}", 400, "tool_choice");
    expect_chat_error("{" MSGS ", \"guided_regex\": \"a\", \"response_format\": {\"type\": "
                      "\"json_object\"}}", 400, "response_format");
#undef TOOL
    arena_destroy(a);
}

static void cross_field_rules(void **state)
{
    (void)state;
    expect_chat_error("{" MSGS ", \"stream_options\": {\"include_usage\": true}}", 400,
                      "stream_options");
    expect_chat_error("{" MSGS ", \"stream\": false, \"stream_options\": {}}", 400, "stream_options");
    expect_chat_error("{" MSGS ", \"stream\": true, \"stream_options\": {\"other\": true}}", 400,
                      "stream_options.other");
    expect_chat_error("{" MSGS ", \"top_logprobs\": 3}", 400, "top_logprobs");
    expect_chat_error("{" MSGS ", \"logprobs\": false, \"top_logprobs\": 3}", 400, "top_logprobs");
    // llama-server's n_predict beside max_tokens: which one wins would hang
    // on the order of the keys, so neither does; alone it sets the length.
    // vLLM's prompt_logprobs: 0 to 20 (its max_logprobs), never streamed.
    expect_chat_error("{" MSGS ", \"prompt_logprobs\": -1}", 400, "prompt_logprobs");
    expect_chat_error("{" MSGS ", \"prompt_logprobs\": 21}", 400, "prompt_logprobs");
    expect_chat_error("{" MSGS ", \"prompt_logprobs\": 2, \"stream\": true}", 400, "prompt_logprobs");
    expect_chat_error("{" MSGS ", \"n_predict\": 5, \"max_tokens\": 7}", 400, "n_predict");
    expect_chat_error("{" MSGS ", \"max_tokens\": 7, \"n_predict\": 5}", 400, "n_predict");
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    const char *b = "{" MSGS ", \"n_predict\": 5}";
    assert_int_equal(chat(b, &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.max_tokens, 5);
    assert_int_equal(r.gen.prompt_logprobs, -1);
    oa_chat_request_release(&r);
    assert_int_equal(chat("{" MSGS ", \"prompt_logprobs\": 0}", &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.prompt_logprobs, 0);
    oa_chat_request_release(&r);
    assert_int_equal(chat("{" MSGS ", \"prompt_logprobs\": 0, \"stream\": true}", &r, &e, a, NULL), 0);
    assert_int_equal(r.gen.prompt_logprobs, -1); // vLLM lets 0 stream, and streams none
    oa_chat_request_release(&r);
    arena_destroy(a);
}

static void completion_prompts_in_every_shape(void **state)
{
    (void)state;
    struct arena *a = arena_create(4096);
    struct oa_completion_request r;
    struct oa_error e;
    const char *b1 = "{\"prompt\": \"hello\", \"echo\": true, \"logprobs\": 2, \"n\": 2}";
    assert_int_equal(oa_parse_completion(b1, strlen(b1), &limits, a, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "hello");
    assert_int_equal(r.prompts[0].text_len, 5);
    assert_true(r.echo);
    assert_int_equal(r.gen.logprobs, 2);
    assert_int_equal(r.gen.n, 2);
    assert_true(r.gen.add_special_tokens); // vLLM's default for a raw prompt
    const char *b1n = "{\"prompt\": \"hello\", \"add_special_tokens\": false}";
    assert_int_equal(oa_parse_completion(b1n, strlen(b1n), &limits, a, &r, &e), 0);
    assert_false(r.gen.add_special_tokens);
    struct oa_chat_request c;
    const char *c1 = "{" MSGS "}", *c2 = "{" MSGS ", \"add_special_tokens\": true}";
    assert_int_equal(oa_parse_chat(c1, strlen(c1), &limits, a, &c, &e), 0);
    assert_false(c.gen.add_special_tokens); // and not for a rendered chat
    oa_chat_request_release(&c);
    assert_int_equal(oa_parse_chat(c2, strlen(c2), &limits, a, &c, &e), 0);
    assert_true(c.gen.add_special_tokens);
    oa_chat_request_release(&c);
    const char *b2 = "{\"prompt\": [\"a\", \"bc\", \"\"]}";
    assert_int_equal(oa_parse_completion(b2, strlen(b2), &limits, a, &r, &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[1].text, "bc");
    assert_int_equal(r.prompts[2].text_len, 0);
    const char *b3 = "{\"prompt\": [1, 2, 999]}";
    assert_int_equal(oa_parse_completion(b3, strlen(b3), &limits, a, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 999);
    const char *b4 = "{\"prompt\": [[1], [2, 3]], \"best_of\": 1}";
    assert_int_equal(oa_parse_completion(b4, strlen(b4), &limits, a, &r, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[1].n_ids, 2);
    assert_int_equal(r.prompts[1].ids[1], 3);
    assert_int_equal(r.gen.logprobs, -1);
    arena_destroy(a);
}

static void tokenize_and_detokenize_bodies(void **state)
{
    (void)state;
    struct arena *a = arena_create(4096);
    struct oa_tokenize_request t;
    struct oa_detokenize_request d;
    struct oa_error e;
    const char *b1 = "{\"model\": \"m\", \"prompt\": \"hi there\"}";
    assert_int_equal(oa_parse_tokenize(b1, strlen(b1), &limits, a, &t, &e), 0);
    assert_false(t.is_chat);
    assert_string_equal(t.prompt, "hi there");
    assert_true(t.add_special_tokens);
    oa_tokenize_request_release(&t);
    const char *b2 = "{" MSGS ", \"add_generation_prompt\": false}";
    assert_int_equal(oa_parse_tokenize(b2, strlen(b2), &limits, a, &t, &e), 0);
    assert_true(t.is_chat);
    assert_false(t.add_generation_prompt);
    assert_false(t.add_special_tokens);
    assert_int_equal(json_array_size(t.messages), 1);
    oa_tokenize_request_release(&t);
    const char *b3 = "{\"prompt\": \"a\", " MSGS "}";
    assert_int_not_equal(oa_parse_tokenize(b3, strlen(b3), &limits, a, &t, &e), 0);
    assert_int_equal(e.http, 400);
    const char *b4 = "{\"model\": \"m\"}";
    assert_int_not_equal(oa_parse_tokenize(b4, strlen(b4), &limits, a, &t, &e), 0);
    assert_string_equal(e.param, "prompt");
    const char *b5 = "{\"prompt\": 5}";
    assert_int_not_equal(oa_parse_tokenize(b5, strlen(b5), &limits, a, &t, &e), 0);
    assert_string_equal(e.param, "prompt");

    const char *d1 = "{\"tokens\": [1, 2, 3]}";
    assert_int_equal(oa_parse_detokenize(d1, strlen(d1), &limits, a, &d, &e), 0);
    assert_int_equal(d.n_tokens, 3);
    assert_int_equal(d.tokens[2], 3);
    const char *d2 = "{\"tokens\": [1, 5000]}";
    assert_int_not_equal(oa_parse_detokenize(d2, strlen(d2), &limits, a, &d, &e), 0);
    assert_string_equal(e.param, "tokens[1]");
    // The id as sent, also when written as a real.
    const char *d2r = "{\"tokens\": [1, 5e12]}";
    assert_int_not_equal(oa_parse_detokenize(d2r, strlen(d2r), &limits, a, &d, &e), 0);
    assert_string_equal(e.param, "tokens[1]");
    if (!strstr(e.message, "5000000000000")) fail_msg("message: %s", e.message);
    const char *d3 = "{\"tokens\": \"abc\"}";
    assert_int_not_equal(oa_parse_detokenize(d3, strlen(d3), &limits, a, &d, &e), 0);
    assert_string_equal(e.param, "tokens");
    const char *d4 = "{}";
    assert_int_not_equal(oa_parse_detokenize(d4, strlen(d4), &limits, a, &d, &e), 0);
    assert_string_equal(e.param, "tokens");
    arena_destroy(a);
}

static void error_envelope_has_openai_shape(void **state)
{
    (void)state;
    struct oa_error e;
    assert_int_equal(oa_errorf(&e, MS_EINVAL, "invalid_value", "temperature", "bad %d", 3),
                     MS_EINVAL);
    json_t *j = oa_error_json(&e);
    json_t *in = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(in, "message")), "bad 3");
    assert_string_equal(json_string_value(json_object_get(in, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(in, "param")), "temperature");
    assert_string_equal(json_string_value(json_object_get(in, "code")), "invalid_value");
    json_decref(j);
    oa_error_http(&e, 401, "invalid_api_key", NULL, "wrong key");
    j = oa_error_json(&e);
    in = json_object_get(j, "error");
    assert_true(json_is_null(json_object_get(in, "param")));
    assert_string_equal(json_string_value(json_object_get(in, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(in, "code")), "invalid_api_key");
    json_decref(j);
    assert_int_equal(oa_http_status(MS_ENOTFOUND), 404);
    assert_int_equal(oa_http_status(MS_EBUSY), 503);
    assert_int_equal(oa_http_status(MS_ETOOLONG), 400);
    assert_int_equal(oa_http_status(MS_ENOFIT), 400);
    assert_int_equal(oa_http_status(MS_ENOMEM), 500);
    assert_int_equal(oa_http_status(MS_EINTERNAL), 500);
}

static void deep_nesting_and_big_bodies_do_not_crash(void **state)
{
    (void)state;
    // 100k nested arrays: jansson's depth limit refuses them.
    size_t depth = 100000;
    char *body = malloc(2 * depth + 64);
    assert_non_null(body);
    size_t at = (size_t)sprintf(body, "{\"messages\": ");
    for (size_t i = 0; i < depth; i++) body[at++] = '[';
    for (size_t i = 0; i < depth; i++) body[at++] = ']';
    body[at++] = '}';
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    assert_int_not_equal(oa_parse_chat(body, at, &limits, a, &r, &e), 0);
    assert_int_equal(e.http, 400);
    free(body);
    // 10k messages are fine.
    size_t n = 10000;
    body = malloc(n * 48 + 64);
    at = (size_t)sprintf(body, "{\"messages\": [");
    for (size_t i = 0; i < n; i++)
        at += (size_t)sprintf(body + at, "%s{\"role\":\"user\",\"content\":\"m%zu\"}", i ? "," : "", i);
    at += (size_t)sprintf(body + at, "]}");
    assert_int_equal(oa_parse_chat(body, at, &limits, a, &r, &e), 0);
    assert_int_equal(json_array_size(r.messages), n);
    oa_chat_request_release(&r);
    free(body);
    arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_json_is_400_without_param),
        cmocka_unit_test(invalid_utf8_is_refused),
        cmocka_unit_test(wrong_types_name_the_parameter),
        cmocka_unit_test(wrong_types_in_completions),
        cmocka_unit_test(prompt_ids_must_have_text_while_logit_ids_may_be_padding),
        cmocka_unit_test(out_of_range_values_are_refused),
        cmocka_unit_test(max_tokens_beyond_context_says_both_numbers),
        cmocka_unit_test(messages_are_validated),
        cmocka_unit_test(text_parts_join_with_newlines_and_other_keys_pass_through),
        cmocka_unit_test(omitted_sampling_comes_from_generation_config),
        cmocka_unit_test(every_parameter_lands_in_the_request),
        cmocka_unit_test(every_parameter_replaced_by_a_hostile_value_is_taken_or_refused),
        cmocka_unit_test(unimplemented_parameters_are_refused_by_name),
        cmocka_unit_test(agent_fields_are_parsed_and_checked),
        cmocka_unit_test(cross_field_rules),
        cmocka_unit_test(completion_prompts_in_every_shape),
        cmocka_unit_test(tokenize_and_detokenize_bodies),
        cmocka_unit_test(error_envelope_has_openai_shape),
        cmocka_unit_test(deep_nesting_and_big_bodies_do_not_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
