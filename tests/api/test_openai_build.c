// Pins the response side of the wire format with the real Qwen3 tokenizer:
// lossy UTF-8, ids, chat/legacy logprobs (token strings, bytes, -inf, token
// ids as names, text offsets), responses, stream chunks and usage.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai.h"
#include "base/base.h"
#include "moeserve_build.h"

static struct tokenizer *tok;

static void lossy_utf8_replaces_maximal_invalid_subparts(void **state)
{
    (void)state;
    char out[64];
    struct {
        const char *in;
        size_t len;
        const char *want;
    } cases[] = {
        {"abc", 3, "abc"},
        {"\xc3\xa9", 2, "\xc3\xa9"},
        {"\xe2\x82", 2, "\xef\xbf\xbd"},            // truncated 3-byte: one replacement
        {"\xf0\x9f\x98", 3, "\xef\xbf\xbd"},        // truncated 4-byte: one
        {"\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80"}, // complete emoji
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"}, // overlong: each byte
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, // surrogate
        {"a\xffz", 3, "a\xef\xbf\xbdz"},
        {"\xe2\x82x", 3, "\xef\xbf\xbdx"},
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, // > U+10FFFF
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = oa_utf8_lossy((const uint8_t *)cases[i].in, cases[i].len, out);
        assert_int_equal(n, strlen(cases[i].want));
        assert_string_equal(out, cases[i].want);
    }
    assert_int_equal(oa_utf8_chars("h\xc3\xa9\xf0\x9f\x98\x80", 7), 3);
}

static void ids_have_the_prefix_and_differ(void **state)
{
    (void)state;
    char a[64], b[64];
    oa_make_id(a, sizeof a, "chatcmpl-");
    oa_make_id(b, sizeof b, "chatcmpl-");
    assert_true(!strncmp(a, "chatcmpl-", 9));
    assert_int_equal(strlen(a), 9 + 24);
    assert_string_not_equal(a, b);
}

static struct oa_meta meta(int logprobs, bool as_ids)
{
    struct oa_meta m = {.id = "chatcmpl-x", .created = 1700000000, .model = "m", .tok = tok,
                        .tokens_as_ids = as_ids, .logprobs = logprobs, .prompt_logprobs = -1};
    return m;
}

// vLLM's prompt_logprobs: null for the first token, then per token a dict
// keyed by id, the token first with its rank, then k alternatives ranked
// 1..k; the token among them keeps its place and takes their rank; -inf is
// -9999.0; decoded_token is the token's text even with token ids asked for.
static void prompt_logprobs_are_vllms_dicts(void **state)
{
    (void)state;
    const int32_t a = tok_find_token(tok, "Hello"), b = tok_find_token(tok, "\xc4\xa0world");
    assert_true(a >= 0 && b >= 0);
    struct oa_token t[3] = {{.id = a}};
    t[1] = (struct oa_token){.id = b, .logprob = -2.5f, .rank = 3, .has_logprob = true, .n_top = 2};
    t[1].top[0] = (struct oa_logprob){a, -0.5f};
    t[1].top[1] = (struct oa_logprob){7, -1.0f};
    t[2] = (struct oa_token){.id = a, .logprob = -INFINITY, .rank = 9, .has_logprob = true, .n_top = 2};
    t[2].top[0] = (struct oa_logprob){b, -0.2f};
    t[2].top[1] = (struct oa_logprob){a, -INFINITY};
    struct oa_meta m = meta(-1, true);
    m.prompt_logprobs = 1; // one alternative shown of the two held
    json_t *j = oa_prompt_logprobs(&m, t, 3);
    char *s = json_dumps(j, JSON_COMPACT);
    char want[512];
    snprintf(want, sizeof want,
             "[null,{\"%d\":{\"logprob\":-2.5,\"rank\":3,\"decoded_token\":\" world\"},"
             "\"%d\":{\"logprob\":-0.5,\"rank\":1,\"decoded_token\":\"Hello\"}},"
             "{\"%d\":{\"logprob\":-9999.0,\"rank\":9,\"decoded_token\":\"Hello\"},"
             "\"%d\":{\"logprob\":-0.20000000298023224,\"rank\":1,\"decoded_token\":\" world\"}}]",
             (int)b, (int)a, (int)a, (int)b);
    assert_string_equal(s, want);
    free(s);
    json_decref(j);
    // Two alternatives: the token is the second, and takes its rank.
    m.prompt_logprobs = 2;
    j = oa_prompt_logprobs(&m, t, 3);
    json_t *e = json_object_get(json_array_get(j, 2), (snprintf(want, sizeof want, "%d", (int)a), want));
    assert_int_equal(json_integer_value(json_object_get(e, "rank")), 2);
    assert_int_equal(json_object_size(json_array_get(j, 2)), 2);
    const char *first = json_object_iter_key(json_object_iter(json_array_get(j, 2)));
    assert_string_equal(first, want); // still first
    json_decref(j);
    // In the responses: beside chat's choices, in each completion choice.
    struct oa_choice ch = {.index = 0, .text = "x", .text_len = 1, .finish_reason = "stop", .stop_id = -1,
                           .prompt_tokens = t, .n_prompt_tokens = 3};
    struct oa_usage u = {.prompt_tokens = 3, .completion_tokens = 1};
    json_t *r = oa_chat_response(&m, &ch, 1, &u);
    assert_int_equal(json_array_size(json_object_get(r, "prompt_logprobs")), 3);
    json_decref(r);
    r = oa_completion_response(&m, &ch, 1, &u);
    assert_int_equal(json_array_size(json_object_get(json_array_get(json_object_get(r, "choices"), 0),
                                                     "prompt_logprobs")), 3);
    assert_null(json_object_get(r, "prompt_logprobs"));
    json_decref(r);
    m.prompt_logprobs = -1;
    r = oa_completion_response(&m, &ch, 1, &u);
    assert_null(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "prompt_logprobs"));
    json_decref(r);
}

static void chat_logprobs_name_tokens_and_their_bytes(void **state)
{
    (void)state;
    int32_t hello = tok_find_token(tok, "Hello");
    assert_true(hello >= 0);
    struct oa_token t[2] = {0};
    t[0].id = hello;
    t[0].logprob = -0.5f;
    t[0].has_logprob = true;
    t[0].n_top = 2;
    t[0].top[0] = (struct oa_logprob){hello, -0.5f};
    t[0].top[1] = (struct oa_logprob){0, -INFINITY};
    t[1].id = 0;
    t[1].logprob = -1.25f;
    t[1].has_logprob = true;
    struct oa_meta m = meta(1, false);
    json_t *j = oa_chat_logprobs(&m, t, 2);
    json_t *c = json_object_get(j, "content");
    assert_int_equal(json_array_size(c), 2);
    json_t *e0 = json_array_get(c, 0);
    assert_string_equal(json_string_value(json_object_get(e0, "token")), "Hello");
    json_t *bytes = json_object_get(e0, "bytes");
    assert_int_equal(json_array_size(bytes), 5);
    assert_int_equal(json_integer_value(json_array_get(bytes, 0)), 'H');
    // Only as many alternatives as asked for (1 of the 2 given).
    assert_int_equal(json_array_size(json_object_get(e0, "top_logprobs")), 1);
    json_decref(j);
    // -inf cannot be JSON: it becomes -9999.
    m = meta(2, false);
    j = oa_chat_logprobs(&m, t, 1);
    json_t *alt = json_array_get(json_object_get(json_array_get(json_object_get(j, "content"), 0), "top_logprobs"), 1);
    assert_true(json_real_value(json_object_get(alt, "logprob")) == -9999.0);
    json_decref(j);
    // return_tokens_as_token_ids
    m = meta(0, true);
    j = oa_chat_logprobs(&m, t, 1);
    json_t *e = json_array_get(json_object_get(j, "content"), 0);
    char want[32];
    snprintf(want, sizeof want, "token_id:%d", hello);
    assert_string_equal(json_string_value(json_object_get(e, "token")), want);
    assert_int_equal(json_array_size(json_object_get(e, "bytes")), strlen(want));
    json_decref(j);
    // A token that is half of a UTF-8 character: its name gets U+FFFD, its bytes stay raw.
    char buf[64];
    int32_t half = -1;
    for (int32_t id = 0; id < 5000 && half < 0; id++) {
        size_t n;
        const uint8_t *b = tok_token_bytes(tok, id, &n);
        if (b && n == 1 && b[0] >= 0x80) half = id;
    }
    assert_true(half >= 0);
    m = meta(0, false);
    size_t n = oa_token_str(&m, half, buf, sizeof buf);
    assert_int_equal(n, 3);
    assert_string_equal(buf, "\xef\xbf\xbd");
}

static void legacy_logprobs_have_parallel_lists_and_offsets(void **state)
{
    (void)state;
    int32_t a = tok_find_token(tok, "Hello"), b = tok_find_token(tok, "\xc4\xa0world");
    assert_true(a >= 0 && b >= 0);
    struct oa_token t[3] = {0};
    t[0].id = a; // an echoed first prompt token: no logprob
    t[1].id = b;
    t[1].logprob = -2.0f;
    t[1].has_logprob = true;
    t[1].n_top = 1;
    t[1].top[0] = (struct oa_logprob){a, -1.0f};
    t[2].id = a;
    t[2].logprob = -0.1f;
    t[2].has_logprob = true;
    t[2].n_top = 1;
    t[2].top[0] = (struct oa_logprob){a, -0.1f}; // the chosen one: one entry, not two
    struct oa_meta m = meta(1, false);
    long off = 0;
    json_t *j = oa_legacy_logprobs(&m, t, 3, &off);
    assert_int_equal(off, 5 + 6 + 5);
    json_t *toks = json_object_get(j, "tokens"), *lps = json_object_get(j, "token_logprobs"),
           *tops = json_object_get(j, "top_logprobs"), *offs = json_object_get(j, "text_offset");
    assert_string_equal(json_string_value(json_array_get(toks, 1)), " world");
    assert_true(json_is_null(json_array_get(lps, 0)));
    assert_true(json_is_null(json_array_get(tops, 0)));
    assert_true(json_real_value(json_array_get(lps, 1)) == -2.0);
    assert_int_equal(json_object_size(json_array_get(tops, 1)), 2); // alternative + chosen
    assert_int_equal(json_object_size(json_array_get(tops, 2)), 1);
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(offs, 1)), 5);
    assert_int_equal(json_integer_value(json_array_get(offs, 2)), 11);
    json_decref(j);
}

static void responses_and_chunks_have_openai_shapes(void **state)
{
    (void)state;
    struct oa_meta m = meta(-1, false);
    struct oa_usage u = {.prompt_tokens = 7, .completion_tokens = 3, .cached_tokens = 2};
    struct oa_choice ch[2] = {
        {.index = 0, .text = "abc", .text_len = 3, .finish_reason = "stop", .stop_str = "X", .stop_id = -1},
        {.index = 1, .text = "de", .text_len = 2, .finish_reason = "length", .stop_id = -1},
    };
    json_t *r = oa_chat_response(&m, ch, 2, &u);
    assert_string_equal(json_string_value(json_object_get(r, "object")), "chat.completion");
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "message"), "content")), "abc");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "message"), "role")), "assistant");
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    assert_string_equal(json_string_value(json_object_get(c0, "stop_reason")), "X");
    json_t *c1 = json_array_get(json_object_get(r, "choices"), 1);
    assert_true(json_is_null(json_object_get(c1, "stop_reason")));
    json_t *usage = json_object_get(r, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 10);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens")), 2);
    json_decref(r);

    // Completions: echo goes first in the text.
    ch[0].echo_text = "Q: ";
    ch[0].echo_len = 3;
    r = oa_completion_response(&m, ch, 1, &u);
    assert_string_equal(json_string_value(json_object_get(r, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "text")), "Q: abc");
    json_decref(r);

    json_t *k = oa_chat_chunk(&m, 0, "assistant", "", 0, NULL, 0, NULL, NULL, -1, NULL);
    json_t *d = json_object_get(json_array_get(json_object_get(k, "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(d, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(d, "content")), "");
    assert_string_equal(json_string_value(json_object_get(k, "object")), "chat.completion.chunk");
    assert_null(json_object_get(k, "usage"));
    json_decref(k);
    k = oa_chat_chunk(&m, 2, NULL, "hi", 2, NULL, 0, "stop", NULL, 151645, &u);
    json_t *c = json_array_get(json_object_get(k, "choices"), 0);
    assert_int_equal(json_integer_value(json_object_get(c, "index")), 2);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "delta"), "content")), "hi");
    assert_null(json_object_get(json_object_get(c, "delta"), "role"));
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "stop");
    assert_int_equal(json_integer_value(json_object_get(c, "stop_reason")), 151645);
    assert_non_null(json_object_get(k, "usage"));
    json_decref(k);
    k = oa_usage_chunk(&m, "text_completion", &u);
    assert_int_equal(json_array_size(json_object_get(k, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(k, "usage"), "completion_tokens")), 3);
    json_decref(k);
    long off = 0;
    k = oa_completion_chunk(&m, 0, "x", 1, NULL, 0, &off, NULL, NULL, -1, NULL);
    c = json_array_get(json_object_get(k, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), "x");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    assert_true(json_is_null(json_object_get(c, "logprobs")));
    json_decref(k);
}

static int setup(void **state)
{
    (void)state;
    char err[512];
    if (tok_load(MOESERVE_TOKENIZER_DIR, &tok, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tok_destroy(tok);
    return 0;
}

// The SDK shows `400 {"type": ...}` when the envelope has no message: the
// builder must keep it whatever bytes the message quotes.
static void error_envelopes_keep_their_message_on_any_bytes(void **state)
{
    (void)state;
    struct oa_error e;
    // A quoted client string of 2-byte characters cut at 40 bytes, mid-character
    // when it starts at an odd offset.
    char role[64] = "x";
    for (int i = 0; i < 25; i++) strcat(role, "\xc3\xa9");
    oa_errorf(&e, MS_EINVAL, "invalid_value", "messages[0].role", "unknown role '%.40s'", role);
    json_t *j = oa_error_json(&e);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "unknown role 'x\xc3\xa9"));
    json_decref(j);
    // A message over the buffer ends on a character boundary.
    char *long_role = malloc(2001);
    long_role[0] = 'y';
    for (int i = 0; i < 1000; i++) memcpy(long_role + 1 + 2 * i, "\xc3\xa9", 2);
    long_role[2001 - 1] = 0;
    oa_errorf(&e, MS_EINVAL, "invalid_value", NULL, "unknown role '%s'", long_role);
    free(long_role);
    j = oa_error_json(&e);
    msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_non_null(msg);
    assert_true(strlen(msg) > 700);
    assert_null(strstr(msg, "\xef\xbf\xbd")); // cut before the broken character, not replaced
    json_decref(j);
    // Bytes that are not UTF-8 anywhere in the message or the param.
    memset(&e, 0, sizeof e);
    oa_error_http(&e, 400, "invalid_json", "a\xff", "invalid escape near '\"\\u0\xe9\"' (%s)", "x");
    j = oa_error_json(&e);
    json_t *inner = json_object_get(j, "error");
    msg = json_string_value(json_object_get(inner, "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "invalid escape near"));
    assert_non_null(strstr(msg, "\xef\xbf\xbd"));
    assert_string_equal(json_string_value(json_object_get(inner, "param")), "a\xef\xbf\xbd");
    assert_string_equal(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
    json_decref(j);
    // The parser's own refusal of such a body.
    struct arena *a = arena_create(4096);
    struct oa_limits lim = {.vocab_size = 1000, .max_model_len = 100};
    struct oa_chat_request cr;
    const char *bodies[] = {"{\"a\":\"\\u0\xc3\xa9\"}",
                            "{\"model\":\"m\",\"messages\":[{\"role\":"
                            "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                            "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                            "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\","
                            "\"content\":\"hi\"}]}"};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        memset(&e, 0, sizeof e);
        assert_true(oa_parse_chat(bodies[i], strlen(bodies[i]), &lim, a, &cr, &e) < 0);
        j = oa_error_json(&e);
        msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        if (!msg) fail_msg("body %zu: no message for '%s'", i, e.message);
        json_decref(j);
    }
    arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lossy_utf8_replaces_maximal_invalid_subparts),
        cmocka_unit_test(ids_have_the_prefix_and_differ),
        cmocka_unit_test(error_envelopes_keep_their_message_on_any_bytes),
        cmocka_unit_test(chat_logprobs_name_tokens_and_their_bytes),
        cmocka_unit_test(legacy_logprobs_have_parallel_lists_and_offsets),
        cmocka_unit_test(prompt_logprobs_are_vllms_dicts),
        cmocka_unit_test(responses_and_chunks_have_openai_shapes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
