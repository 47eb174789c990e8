// Pins `moeserve serve` end to end on the tiny model over loopback: response
// and stream shapes, streamed == non-streamed, every prompt shape, n > 1,
// logprobs, stop strings, errors naming their parameter, hostile bodies,
// clients that hang up (generation seen running, then stopped, KV freed),
// and 64 concurrent streams whose greedy output equals each request run
// alone.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/server/harness.h"

static struct srv S;

static json_t *post(const char *path, const char *body, long want_status)
{
    long st = 0;
    json_t *j = srv_post_json(&S, path, body, &st);
    if (st != want_status) fail_msg("%s %s: status %ld, want %ld", path, body, st, want_status);
    assert_non_null(j);
    return j;
}

// "a.b.0.c" walks objects and arrays.
static json_t *at(json_t *j, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = j;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        if (json_is_array(cur)) cur = json_array_get(cur, (size_t)atoi(tok));
        else cur = json_object_get(cur, tok);
    }
    return cur;
}

static const char *str(json_t *j, const char *path)
{
    json_t *v = at(j, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static long num(json_t *j, const char *path)
{
    json_t *v = at(j, path);
    if (!json_is_integer(v)) fail_msg("%s is not an integer", path);
    return (long)json_integer_value(v);
}

static void expect_idle(void)
{
    if (!srv_wait_idle(&S, 20)) fail_msg("the server did not return to idle (KV blocks still held)");
}

// ---- shapes ---------------------------------------------------------------------------

static void health_models_and_version(void **state)
{
    (void)state;
    long st;
    json_t *h = srv_get_json(&S, "/health", &st);
    assert_int_equal(st, 200);
    assert_string_equal(str(h, "status"), "ok");
    assert_true(num(h, "kv_blocks_total") > 0);
    json_decref(h);
    json_t *m = srv_get_json(&S, "/v1/models", &st);
    assert_int_equal(st, 200);
    assert_string_equal(str(m, "object"), "list");
    assert_string_equal(str(m, "data.0.id"), "tiny");
    assert_string_equal(str(m, "data.1.id"), "tiny-alias");
    assert_string_equal(str(m, "data.0.object"), "model");
    assert_int_equal(num(m, "data.0.max_model_len"), 2048);
    json_decref(m);
    json_t *v = srv_get_json(&S, "/version", &st);
    assert_int_equal(st, 200);
    assert_non_null(str(v, "version"));
    json_decref(v);
}

static void chat_completion_has_the_openai_shape(void **state)
{
    (void)state;
    json_t *r = post("/v1/chat/completions",
                     "{\"model\": \"tiny-alias\", \"messages\": [{\"role\": \"user\", \"content\": "
                     "\"Hello there\"}], \"max_tokens\": 8, \"temperature\": 0}",
                     200);
    assert_string_equal(str(r, "object"), "chat.completion");
    assert_true(!strncmp(str(r, "id"), "chatcmpl-", 9));
    assert_string_equal(str(r, "model"), "tiny-alias");
    assert_true(json_is_integer(at(r, "created")));
    assert_int_equal(json_array_size(at(r, "choices")), 1);
    assert_int_equal(num(r, "choices.0.index"), 0);
    assert_string_equal(str(r, "choices.0.message.role"), "assistant");
    assert_non_null(str(r, "choices.0.message.content"));
    const char *fr = str(r, "choices.0.finish_reason");
    assert_true(!strcmp(fr, "stop") || !strcmp(fr, "length"));
    assert_true(json_is_null(at(r, "choices.0.logprobs")));
    long p = num(r, "usage.prompt_tokens"), c = num(r, "usage.completion_tokens");
    assert_int_equal(num(r, "usage.total_tokens"), p + c);
    assert_true(c >= 1 && c <= 8);
    if (!strcmp(fr, "length")) assert_int_equal(c, 8);
    // The prompt is what /tokenize makes of the same messages.
    json_t *t = post("/tokenize",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}]}", 200);
    assert_int_equal(num(t, "count"), p);
    assert_int_equal(json_array_size(at(t, "tokens")), (size_t)p);
    json_decref(t);
    json_decref(r);
}

static void completions_take_every_prompt_shape(void **state)
{
    (void)state;
    json_t *r = post("/v1/completions",
                     "{\"model\": \"tiny\", \"prompt\": \"Once upon a time\", \"max_tokens\": 5, "
                     "\"temperature\": 0, \"ignore_eos\": true}",
                     200);
    assert_string_equal(str(r, "object"), "text_completion");
    assert_true(!strncmp(str(r, "id"), "cmpl-", 5));
    assert_non_null(str(r, "choices.0.text"));
    assert_string_equal(str(r, "choices.0.finish_reason"), "length");
    assert_int_equal(num(r, "usage.completion_tokens"), 5);
    json_decref(r);

    r = post("/v1/completions",
             "{\"prompt\": [\"one\", \"two three\"], \"max_tokens\": 3, \"temperature\": 0, "
             "\"ignore_eos\": true, \"n\": 2}",
             200);
    assert_int_equal(json_array_size(at(r, "choices")), 4);
    for (int i = 0; i < 4; i++) {
        char p[32];
        snprintf(p, sizeof p, "choices.%d.index", i);
        assert_int_equal(num(r, p), i);
    }
    assert_int_equal(num(r, "usage.completion_tokens"), 12);
    // Greedy: both choices of one prompt agree.
    assert_string_equal(str(r, "choices.0.text"), str(r, "choices.1.text"));
    json_decref(r);

    r = post("/v1/completions",
             "{\"prompt\": [9707, 11, 1879], \"max_tokens\": 2, \"temperature\": 0, \"ignore_eos\": "
             "true}",
             200);
    assert_int_equal(num(r, "usage.prompt_tokens"), 3);
    json_decref(r);
    r = post("/v1/completions",
             "{\"prompt\": [[9707, 11], [1879, 0, 1]], \"max_tokens\": 2, \"temperature\": 0, "
             "\"ignore_eos\": true}",
             200);
    assert_int_equal(num(r, "usage.prompt_tokens"), 5);
    assert_int_equal(json_array_size(at(r, "choices")), 2);
    json_decref(r);
    // Text and ids of the same prompt continue alike.
    json_t *t = post("/tokenize", "{\"prompt\": \"Hello, world\"}", 200);
    char body[512];
    char *ids = json_dumps(at(t, "tokens"), JSON_COMPACT);
    snprintf(body, sizeof body,
             "{\"prompt\": %s, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true}", ids);
    free(ids);
    json_t *a = post("/v1/completions", body, 200);
    json_t *b = post("/v1/completions",
                     "{\"prompt\": \"Hello, world\", \"max_tokens\": 6, \"temperature\": 0, "
                     "\"ignore_eos\": true}",
                     200);
    assert_string_equal(str(a, "choices.0.text"), str(b, "choices.0.text"));
    json_decref(a);
    json_decref(b);
    json_decref(t);
    expect_idle();
}

static void streamed_answers_concatenate_to_the_unstreamed_one(void **state)
{
    (void)state;
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story\"}], "
                       "\"max_tokens\": 24, \"temperature\": 0, \"ignore_eos\": true%s}";
    char body[512];
    snprintf(body, sizeof body, chat, "");
    json_t *whole = post("/v1/chat/completions", body, 200);
    snprintf(body, sizeof body, chat,
             ", \"stream\": true, \"stream_options\": {\"include_usage\": true}");
    struct sse e = srv_stream(&S, "/v1/chat/completions", body);
    assert_int_equal(e.status, 200);
    assert_true(e.done);
    size_t n = json_array_size(e.events);
    assert_true(n >= 3);
    json_t *first = json_array_get(e.events, 0);
    assert_string_equal(str(first, "object"), "chat.completion.chunk");
    assert_string_equal(str(first, "choices.0.delta.role"), "assistant");
    // The last event is the usage chunk, the one before it carries the finish reason.
    json_t *last = json_array_get(e.events, n - 1);
    assert_int_equal(json_array_size(at(last, "choices")), 0);
    assert_int_equal(num(last, "usage.completion_tokens"), 24);
    assert_int_equal(num(last, "usage.prompt_tokens"), num(whole, "usage.prompt_tokens"));
    json_t *fin = json_array_get(e.events, n - 2);
    assert_string_equal(str(fin, "choices.0.finish_reason"), "length");
    for (size_t i = 0; i + 2 < n; i++)
        assert_true(json_is_null(at(json_array_get(e.events, i), "choices.0.finish_reason")));
    char *text = sse_text(&e, 0);
    assert_string_equal(text, str(whole, "choices.0.message.content"));
    free(text);
    // Every chunk shares the id.
    for (size_t i = 0; i < n; i++) assert_string_equal(str(json_array_get(e.events, i), "id"), str(first, "id"));
    sse_free(&e);
    json_decref(whole);

    const char *cmpl = "{\"prompt\": \"The quick brown\", \"max_tokens\": 20, \"temperature\": 0, "
                       "\"ignore_eos\": true, \"n\": 2%s}";
    snprintf(body, sizeof body, cmpl, "");
    whole = post("/v1/completions", body, 200);
    snprintf(body, sizeof body, cmpl, ", \"stream\": true");
    e = srv_stream(&S, "/v1/completions", body);
    assert_true(e.done);
    for (int i = 0; i < 2; i++) {
        char p[32];
        snprintf(p, sizeof p, "choices.%d.text", i);
        text = sse_text(&e, i);
        assert_string_equal(text, str(whole, p));
        free(text);
    }
    // Without include_usage there is no usage chunk.
    json_t *lastc = json_array_get(e.events, json_array_size(e.events) - 1);
    assert_int_equal(json_array_size(at(lastc, "choices")), 1);
    sse_free(&e);
    json_decref(whole);
    expect_idle();
}

static void chat_streams_with_n_give_every_choice_its_role_and_finish(void **state)
{
    (void)state;
    struct sse e = srv_stream(&S, "/v1/chat/completions",
                              "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 3, "
                              "\"max_tokens\": 6, \"temperature\": 0.9, \"seed\": 5, \"stream\": true}");
    assert_true(e.done);
    int roles[3] = {0}, finishes[3] = {0};
    size_t i;
    json_t *ev;
    json_array_foreach(e.events, i, ev) {
        json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
        long idx = (long)json_integer_value(json_object_get(ch, "index"));
        assert_true(idx >= 0 && idx < 3);
        if (json_object_get(json_object_get(ch, "delta"), "role")) roles[idx]++;
        if (json_is_string(json_object_get(ch, "finish_reason"))) finishes[idx]++;
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(roles[k], 1);
        assert_int_equal(finishes[k], 1);
    }
    sse_free(&e);
    // The same seed gives the same choices again.
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 3, "
                       "\"max_tokens\": 6, \"temperature\": 0.9, \"seed\": 5}";
    json_t *a = post("/v1/chat/completions", body, 200);
    json_t *b = post("/v1/chat/completions", body, 200);
    for (int k = 0; k < 3; k++) {
        char p[64];
        snprintf(p, sizeof p, "choices.%d.message.content", k);
        assert_string_equal(str(a, p), str(b, p));
    }
    json_decref(a);
    json_decref(b);
}

static void logprobs_come_in_the_chat_and_the_legacy_shape(void **state)
{
    (void)state;
    json_t *r = post("/v1/chat/completions",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 6, "
                     "\"temperature\": 0, \"ignore_eos\": true, \"logprobs\": true, "
                     "\"top_logprobs\": 3}",
                     200);
    json_t *content = at(r, "choices.0.logprobs.content");
    assert_int_equal(json_array_size(content), 6);
    size_t i;
    json_t *e;
    json_array_foreach(content, i, e) {
        assert_true(json_is_string(json_object_get(e, "token")));
        double lp = json_number_value(json_object_get(e, "logprob"));
        assert_true(lp <= 0);
        assert_true(json_is_array(json_object_get(e, "bytes")));
        json_t *top = json_object_get(e, "top_logprobs");
        assert_int_equal(json_array_size(top), 3);
        // Greedy picks the most likely token: it leads the alternatives.
        assert_true(fabs(json_number_value(json_object_get(json_array_get(top, 0), "logprob")) - lp) < 1e-4);
    }
    json_decref(r);

    r = post("/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4, "
             "\"temperature\": 0, \"ignore_eos\": true, \"logprobs\": true, "
             "\"return_tokens_as_token_ids\": true}",
             200);
    json_array_foreach(at(r, "choices.0.logprobs.content"), i, e) {
        const char *t = json_string_value(json_object_get(e, "token"));
        assert_true(!strncmp(t, "token_id:", 9));
        assert_int_equal(json_array_size(json_object_get(e, "top_logprobs")), 0);
    }
    json_decref(r);

    r = post("/v1/completions",
             "{\"prompt\": \"Hello world\", \"max_tokens\": 5, \"temperature\": 0, \"ignore_eos\": "
             "true, \"logprobs\": 2}",
             200);
    json_t *lp = at(r, "choices.0.logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 5);
    assert_int_equal(json_array_size(json_object_get(lp, "token_logprobs")), 5);
    assert_int_equal(json_array_size(json_object_get(lp, "text_offset")), 5);
    json_array_foreach(json_object_get(lp, "top_logprobs"), i, e) {
        assert_true(json_is_object(e));
        assert_true(json_object_size(e) >= 1 && json_object_size(e) <= 3);
    }
    long prev = -1;
    json_array_foreach(json_object_get(lp, "text_offset"), i, e) {
        assert_true(json_integer_value(e) >= prev);
        prev = (long)json_integer_value(e);
    }
    json_decref(r);

    // echo: the prompt first, its first token without a logprob.
    r = post("/v1/completions",
             "{\"prompt\": \"Hello world\", \"max_tokens\": 3, \"temperature\": 0, \"ignore_eos\": "
             "true, \"logprobs\": 1, \"echo\": true}",
             200);
    assert_true(!strncmp(str(r, "choices.0.text"), "Hello world", 11));
    long pt = num(r, "usage.prompt_tokens");
    lp = at(r, "choices.0.logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), (size_t)(pt + 3));
    assert_true(json_is_null(json_array_get(json_object_get(lp, "token_logprobs"), 0)));
    assert_true(json_is_number(json_array_get(json_object_get(lp, "token_logprobs"), 1)));
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0)), 0);

    // vLLM's prompt_logprobs beside echo's: the same scoring of the prompt,
    // each output with its own count of alternatives; null first, then the
    // token's entry (first, its rank) and 2 alternatives ranked 1 and 2.
    json_t *pl = post("/v1/completions",
                      "{\"prompt\": \"Hello world\", \"max_tokens\": 3, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"logprobs\": 1, \"echo\": true, \"prompt_logprobs\": 2}",
                      200);
    json_t *plp = at(pl, "choices.0.prompt_logprobs"), *lp2 = at(pl, "choices.0.logprobs");
    assert_int_equal(json_array_size(plp), (size_t)pt);
    assert_true(json_is_null(json_array_get(plp, 0)));
    assert_true(json_equal(json_object_get(lp2, "top_logprobs"), json_object_get(lp, "top_logprobs")));
    for (size_t k = 1; k < (size_t)pt; k++) {
        json_t *d = json_array_get(plp, k);
        assert_true(json_object_size(d) >= 2 && json_object_size(d) <= 3);
        // The token's entry is first, with echo's logprob for it.
        void *it = json_object_iter(d);
        json_t *own = json_object_iter_value(it);
        assert_true(json_real_value(json_object_get(own, "logprob")) ==
                    json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), k)));
        const long rank = (long)json_integer_value(json_object_get(own, "rank"));
        assert_true(rank >= 1);
        assert_true(json_is_string(json_object_get(own, "decoded_token")));
        long seen = 0;
        const char *key;
        json_t *v;
        json_object_foreach(d, key, v) {
            const long rk = (long)json_integer_value(json_object_get(v, "rank"));
            if (v != own) assert_true(rk == 1 || rk == 2);
            seen |= 1L << (rk > 2 ? 3 : rk);
        }
        assert_true((seen & 6) == 6); // ranks 1 and 2 both there
    }
    json_decref(pl);
    // n choices: the first scores the prompt for all of them.
    pl = post("/v1/completions",
              "{\"prompt\": \"Hello world\", \"max_tokens\": 2, \"n\": 3, \"seed\": 1, "
              "\"prompt_logprobs\": 1}",
              200);
    for (int c = 1; c < 3; c++) {
        char path[64];
        snprintf(path, sizeof path, "choices.%d.prompt_logprobs", c);
        assert_true(json_equal(at(pl, path), at(pl, "choices.0.prompt_logprobs")));
    }
    assert_int_equal(json_array_size(at(pl, "choices.2.prompt_logprobs")), (size_t)pt);
    json_decref(pl);
    json_decref(r);
    // Chat: beside the choices, for the templated prompt; refused streaming.
    r = post("/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, "
             "\"prompt_logprobs\": 0}",
             200);
    plp = at(r, "prompt_logprobs");
    assert_int_equal(json_array_size(plp), (size_t)num(r, "usage.prompt_tokens"));
    assert_true(json_is_null(json_array_get(plp, 0)));
    assert_int_equal(json_object_size(json_array_get(plp, 1)), 1);
    assert_null(json_object_get(at(r, "choices.0"), "prompt_logprobs"));
    json_decref(r);
    json_decref(post("/v1/chat/completions",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true, "
                     "\"prompt_logprobs\": 1}",
                     400));
    expect_idle();
}

static void stop_strings_end_the_output_before_them(void **state)
{
    (void)state;
    const char *fmt = "{\"prompt\": \"Write something:\", \"max_tokens\": 32, \"temperature\": 0, "
                      "\"ignore_eos\": true%s}";
    char body[512];
    snprintf(body, sizeof body, fmt, "");
    json_t *r = post("/v1/completions", body, 200);
    const char *full = str(r, "choices.0.text");
    // A stop string from the middle of the greedy output: two printable ASCII characters.
    size_t len = strlen(full), k;
    for (k = len / 3; k + 1 < len; k++)
        if (full[k] > ' ' && full[k] < 127 && full[k + 1] > ' ' && full[k + 1] < 127 && full[k] != '"' &&
            full[k] != '\\' && full[k + 1] != '"' && full[k + 1] != '\\')
            break;
    if (k + 1 >= len) fail_msg("no ASCII pair in the greedy output to stop on: %s", full);
    char stop[3] = {full[k], full[k + 1], 0};
    size_t first = (size_t)(strstr(full, stop) - full);
    char extra[64];
    snprintf(extra, sizeof extra, ", \"stop\": [\"%s\"]", stop);
    snprintf(body, sizeof body, fmt, extra);
    json_t *s = post("/v1/completions", body, 200);
    assert_string_equal(str(s, "choices.0.finish_reason"), "stop");
    assert_string_equal(str(s, "choices.0.stop_reason"), stop);
    const char *cut = str(s, "choices.0.text");
    assert_int_equal(strlen(cut), first);
    assert_memory_equal(cut, full, first);
    // Streamed, the stop string never shows either.
    snprintf(extra, sizeof extra, ", \"stop\": \"%s\", \"stream\": true", stop);
    snprintf(body, sizeof body, fmt, extra);
    struct sse e = srv_stream(&S, "/v1/completions", body);
    char *text = sse_text(&e, 0);
    assert_string_equal(text, cut);
    free(text);
    sse_free(&e);
    json_decref(s);
    json_decref(r);
}

static void tokenize_and_detokenize_round_trip(void **state)
{
    (void)state;
    json_t *t = post("/tokenize", "{\"model\": \"tiny\", \"prompt\": \"Hello world, 你好\", "
                                  "\"return_token_strs\": true}",
                     200);
    assert_true(num(t, "count") > 2);
    assert_int_equal(num(t, "max_model_len"), 2048);
    assert_string_equal(str(t, "token_strs.0"), "Hello");
    assert_string_equal(str(t, "token_strs.1"), "\xc4\xa0world"); // "Ġworld"
    char body[1024];
    char *ids = json_dumps(at(t, "tokens"), JSON_COMPACT);
    snprintf(body, sizeof body, "{\"tokens\": %s}", ids);
    free(ids);
    json_t *d = post("/detokenize", body, 200);
    assert_string_equal(str(d, "prompt"), "Hello world, 你好");
    json_decref(d);
    json_decref(t);
}

// ---- errors ----------------------------------------------------------------------------------

static void expect_error(const char *path, const char *body, long status, const char *param)
{
    long st = 0;
    json_t *j = srv_post_json(&S, path, body, &st);
    if (st != status) fail_msg("%s: status %ld, want %ld", body, st, status);
    json_t *err = json_object_get(j, "error");
    assert_non_null(err);
    assert_true(json_is_string(json_object_get(err, "message")));
    assert_true(json_is_string(json_object_get(err, "type")));
    json_t *p = json_object_get(err, "param");
    if (param) {
        if (!json_is_string(p) || strcmp(json_string_value(p), param))
            fail_msg("%s: param %s, want %s", body, json_is_string(p) ? json_string_value(p) : "null", param);
    }
    json_decref(j);
}

static void errors_name_what_is_wrong(void **state)
{
    (void)state;
    const char *chat = "/v1/chat/completions";
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": \"hot\"}", 400, "temperature");
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": -1}", 400, "max_tokens");
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 1e300}", 400, "max_tokens");
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 100000000000000000000}", 400, NULL);
    expect_error(chat, "{\"messages\": []}", 400, "messages");
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}", 400, NULL);
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"", 400, NULL);
    expect_error(chat, "", 400, NULL);
    expect_error(chat, "[]", 400, NULL);
    // A schema the grammar engine cannot enforce exactly is refused, never loosened.
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": \"object\", \"patternProperties\": {\"^a\": {}}}}}}", 400, "response_format.json_schema.schema");
    expect_error(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f g\"}}]}", 400, "tools[0].function.name");
    expect_error(chat, "{\"model\": \"gpt-4\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 404, "model");
    long st;
    json_t *j = srv_post_json(&S, chat, "{\"model\": \"gpt-4\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &st);
    assert_string_equal(str(j, "error.code"), "model_not_found");
    json_decref(j);
    // Too long: the prompt alone, and prompt plus max_tokens; both numbers in the message.
    json_t *ids = json_array();
    for (int i = 0; i < 2100; i++) json_array_append_new(ids, json_integer(100 + i % 50));
    char *ids_s = json_dumps(ids, JSON_COMPACT);
    char *body = malloc(strlen(ids_s) + 64);
    sprintf(body, "{\"prompt\": %s, \"max_tokens\": 1}", ids_s);
    j = srv_post_json(&S, "/v1/completions", body, &st);
    assert_int_equal(st, 400);
    assert_non_null(strstr(str(j, "error.message"), "2048"));
    assert_non_null(strstr(str(j, "error.message"), "2100"));
    json_decref(j);
    free(body);
    free(ids_s);
    json_decref(ids);
    j = srv_post_json(&S, "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 5000}", &st);
    assert_int_equal(st, 400);
    assert_non_null(strstr(str(j, "error.message"), "2048"));
    assert_string_equal(str(j, "error.code"), "context_length_exceeded");
    json_decref(j);
    // Far over the context, refused before any tokenizing: 900 KB of text
    // cannot be 2048 tokens of at most 128 bytes (x3 for NFC) each; the
    // sentence says the bytes decided it. A few times over: the tokenizer
    // stops at the context instead of counting it all.
    for (int chat_ep = 0; chat_ep < 2; chat_ep++) {
        const size_t n = 900000;
        char *text = malloc(n + 1), *b = malloc(n + 256);
        for (size_t i = 0; i < n; i++) text[i] = "abcdefghij klmnop "[i % 18];
        text[n] = 0;
        if (chat_ep) sprintf(b, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", text);
        else sprintf(b, "{\"prompt\": \"%s\", \"max_tokens\": 1}", text);
        j = srv_post_json(&S, chat_ep ? chat : "/v1/completions", b, &st);
        assert_int_equal(st, 400);
        assert_string_equal(str(j, "error.code"), "context_length_exceeded");
        assert_non_null(strstr(str(j, "error.message"), "900000 bytes"));
        json_decref(j);
        text[30000] = 0; // about 6,000 tokens
        if (chat_ep) sprintf(b, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", text);
        else sprintf(b, "{\"prompt\": \"%s\", \"max_tokens\": 1}", text);
        j = srv_post_json(&S, chat_ep ? chat : "/v1/completions", b, &st);
        assert_int_equal(st, 400);
        assert_string_equal(str(j, "error.code"), "context_length_exceeded");
        assert_non_null(strstr(str(j, "error.message"), "more than 2048 tokens"));
        json_decref(j);
        free(text);
        free(b);
    }
    // Paths and methods.
    struct resp r = srv_request(&S, "GET", "/v1/nothing", NULL, 0, NULL);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    r = srv_request(&S, "GET", chat, NULL, 0, NULL);
    assert_int_equal(r.status, 405);
    resp_free(&r);
    r = srv_request(&S, "DELETE", "/v1/models", NULL, 0, NULL);
    assert_int_equal(r.status, 405);
    resp_free(&r);
    // Over --max-request-body (1MiB here).
    size_t big = 2u << 20;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    memcpy(huge, "{\"prompt\": \"", 12);
    huge[big - 2] = '"';
    huge[big - 1] = '}';
    huge[big] = 0;
    r = srv_request(&S, "POST", "/v1/completions", huge, big, NULL);
    assert_int_equal(r.status, 413);
    resp_free(&r);
    free(huge);
    expect_idle();
}

static void wrong_types_for_every_parameter_are_400(void **state)
{
    (void)state;
    const char *params[][2] = {
        {"model", "5"}, {"max_tokens", "\"8\""}, {"max_completion_tokens", "[]"},
        {"temperature", "{}"}, {"top_p", "\"x\""}, {"top_k", "1.5"}, {"min_p", "true"},
        {"n", "\"2\""}, {"stop", "7"}, {"seed", "\"s\""}, {"presence_penalty", "[]"},
        {"frequency_penalty", "\"0\""}, {"repetition_penalty", "false"}, {"logit_bias", "[]"},
        {"logprobs", "3"}, {"top_logprobs", "true"}, {"stream", "1"}, {"stream_options", "[]"},
        {"ignore_eos", "\"y\""}, {"chat_template_kwargs", "1"},
        {"return_tokens_as_token_ids", "0"}, {"user", "1"},
    };
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"%s\": %s}",
                 params[i][0], params[i][1]);
        expect_error("/v1/chat/completions", body, 400, params[i][0]);
    }
    expect_error("/v1/completions", "{\"prompt\": \"a\", \"logprobs\": true}", 400, "logprobs");
    expect_error("/v1/completions", "{\"prompt\": \"a\", \"echo\": 1}", 400, "echo");
    expect_error("/v1/completions", "{\"prompt\": 12}", 400, "prompt");
    expect_error("/v1/completions", "{\"prompt\": [200000]}", 400, "prompt[0]");
    expect_error("/tokenize", "{\"prompt\": 1}", 400, "prompt");
    expect_error("/detokenize", "{\"tokens\": [\"a\"]}", 400, "tokens[0]");
    expect_idle();
}

// Raw sockets: what curl will not send.
static int connect_raw(void)
{
    int fd = client_connect_raw(S.port, 30);
    assert_true(fd >= 0);
    return fd;
}

static void malformed_http_and_slow_bodies_leave_the_server_serving(void **state)
{
    (void)state;
    const char *bad[] = {
        "BLAH\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nContent-Length: zz\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nnothex\r\n",
        "GET /health HTTP/1.1\r\n\x01\x02\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"prompt\":",
    };
    char buf[8192];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int fd = connect_raw();
        send(fd, bad[i], strlen(bad[i]), MSG_NOSIGNAL);
        shutdown(fd, SHUT_WR);
        size_t n = client_read_until(fd, buf, sizeof buf, NULL);
        if (n) assert_null(strstr(buf, " 200 "));
        close(fd);
    }
    // A request sent a few bytes at a time.
    const char *body = "{\"prompt\": \"slow\", \"max_tokens\": 2, \"temperature\": 0}";
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
             strlen(body), body);
    int fd = connect_raw();
    // Up to the request's end only: stepping by 3 from a length that is not
    // a multiple of 3 went past its NUL, into whatever the stack held after
    // it (sent after the server had answered and closed: EPIPE, now and then).
    const size_t len = strlen(req);
    for (size_t i = 0; i < len; i += 3) {
        const size_t k = len - i < 3 ? len - i : 3;
        assert_int_equal(send(fd, req + i, k, MSG_NOSIGNAL), (ssize_t)k);
        usleep(2000);
    }
    client_read_until(fd, buf, sizeof buf, NULL);
    assert_non_null(strstr(buf, " 200 "));
    assert_non_null(strstr(buf, "text_completion"));
    close(fd);
    long st;
    json_t *h = srv_get_json(&S, "/health", &st);
    assert_int_equal(st, 200);
    json_decref(h);
    expect_idle();
}

// ---- hang-ups --------------------------------------------------------------------------------

// generation_tokens_total on /health (the engine's counter) once it has
// passed `above`, polled for up to 10 s; -1 when it never did.
static long generation_above(long above)
{
    double end = now_s() + 10;
    do {
        long g = srv_health_field(&S, "generation_tokens_total");
        if (g > above) return g;
        usleep(1000);
    } while (now_s() < end);
    return -1;
}

// A stream that hangs up after `limit` bytes, noting the token counter then.
struct abort_after {
    size_t bytes, limit;
    long gen_before;                 // the counter before the request
    long gen_at_hangup;              // the counter as it hung up (-1: it never rose)
};

static size_t abort_writer(char *p, size_t sz, size_t n, void *ud)
{
    (void)p;
    struct abort_after *a = ud;
    a->bytes += sz * n;
    if (a->bytes <= a->limit) return sz * n;
    a->gen_at_hangup = generation_above(a->gen_before);
    return 0; // less than given: curl hangs up
}

// Each half proves first that the request was generating (the counter rose
// while it ran), then that it stopped: the server is idle again long before
// the 1900 tokens asked for.
static void clients_that_hang_up_have_their_requests_cancelled(void **state)
{
    (void)state;
    expect_idle();
    long gen0 = srv_health_field(&S, "generation_tokens_total");
    assert_true(gen0 >= 0);
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", S.port);
    const char *body = "{\"prompt\": \"Go on forever\", \"max_tokens\": 1900, \"temperature\": 0, "
                       "\"ignore_eos\": true, \"stream\": true}";
    struct abort_after aa = {.limit = 600, .gen_before = gen0};
    struct curl_slist *json = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, json);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, abort_writer);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &aa);
    CURLcode rc = curl_easy_perform(c);
    assert_int_equal(rc, CURLE_WRITE_ERROR);
    curl_easy_cleanup(c);
    curl_slist_free_all(json);
    if (aa.gen_at_hangup < 0) fail_msg("the stream's tokens never reached generation_tokens_total");
    expect_idle();
    long gen1 = srv_health_field(&S, "generation_tokens_total");
    assert_true(gen1 >= aa.gen_at_hangup);
    assert_true(gen1 - gen0 < 1900);

    // Not streaming: the client gives up while the server is still generating.
    int fd = connect_raw();
    const char *b2 = "{\"prompt\": \"Go on forever\", \"max_tokens\": 1900, \"temperature\": 0, "
                     "\"ignore_eos\": true}";
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(b2), b2);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    long started = generation_above(gen1);
    if (started < 0) fail_msg("the request never generated a token");
    close(fd);
    expect_idle();
    long gen2 = srv_health_field(&S, "generation_tokens_total");
    assert_true(gen2 >= started);
    assert_true(gen2 - gen1 < 1900);
}

// ---- load --------------------------------------------------------------------------------------

enum { N_LOAD = 64, LOAD_TOKENS = 12 };

static void concurrent_streams_match_their_solo_runs(void **state)
{
    (void)state;
    char *solo[N_LOAD];
    long solo_prompt[N_LOAD];
    char bodies[N_LOAD][512];
    for (int i = 0; i < N_LOAD; i++) {
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Request number %d: %.*s\"}], "
                 "\"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true%%s}",
                 i, i % 7 * 3, "abcdefghijklmnopqrstuvwxyz", LOAD_TOKENS);
        char body[600];
        snprintf(body, sizeof body, bodies[i], "");
        json_t *r = post("/v1/chat/completions", body, 200);
        solo[i] = strdup(str(r, "choices.0.message.content"));
        solo_prompt[i] = num(r, "usage.prompt_tokens");
        json_decref(r);
    }
    CURL *h[N_LOAD];
    struct resp rep[N_LOAD];
    char streams[N_LOAD][600];
    static const char *const json[] = {"Content-Type: application/json", NULL};
    for (int i = 0; i < N_LOAD; i++) {
        snprintf(streams[i], sizeof streams[i], bodies[i],
                 ", \"stream\": true, \"stream_options\": {\"include_usage\": true}");
        h[i] = client_prepare(&rep[i], S.port, "POST", "/v1/chat/completions", streams[i],
                              strlen(streams[i]), NULL, json, 300);
    }
    assert_int_equal(client_perform_all(h, N_LOAD), 0);
    for (int i = 0; i < N_LOAD; i++) {
        client_finish(h[i], &rep[i]);
        assert_int_equal(rep[i].status, 200);
        struct sse e;
        sse_parse(rep[i].body, rep[i].len, &e);
        assert_true(e.done);
        json_t *last = json_array_get(e.events, json_array_size(e.events) - 1);
        assert_int_equal(num(last, "usage.completion_tokens"), LOAD_TOKENS);
        assert_int_equal(num(last, "usage.prompt_tokens"), solo_prompt[i]);
        char *text = sse_text(&e, 0);
        if (strcmp(text, solo[i])) fail_msg("request %d under load: \"%s\", alone: \"%s\"", i, text, solo[i]);
        free(text);
        json_decref(e.events);
        resp_free(&rep[i]);
        free(solo[i]);
    }
    expect_idle();
}

static int setup(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    // The model by vLLM's --model, then two names after one flag (the
    // second was once read as a second model).
    const char *extra[] = {"--model", getenv("MOESERVE_TINY_MODEL"), "--served-model-name", "tiny", "tiny-alias",
                           "--max-request-body", "1MiB", NULL};
    return srv_start(&S, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = srv_stop(&S, SIGTERM, 30);
    curl_global_cleanup();
    if (rc != 0) fprintf(stderr, "server exit status %d\n", rc);
    return rc == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(health_models_and_version),
        cmocka_unit_test(chat_completion_has_the_openai_shape),
        cmocka_unit_test(completions_take_every_prompt_shape),
        cmocka_unit_test(streamed_answers_concatenate_to_the_unstreamed_one),
        cmocka_unit_test(chat_streams_with_n_give_every_choice_its_role_and_finish),
        cmocka_unit_test(logprobs_come_in_the_chat_and_the_legacy_shape),
        cmocka_unit_test(stop_strings_end_the_output_before_them),
        cmocka_unit_test(tokenize_and_detokenize_round_trip),
        cmocka_unit_test(errors_name_what_is_wrong),
        cmocka_unit_test(wrong_types_for_every_parameter_are_400),
        cmocka_unit_test(malformed_http_and_slow_bodies_leave_the_server_serving),
        cmocka_unit_test(clients_that_hang_up_have_their_requests_cancelled),
        cmocka_unit_test(concurrent_streams_match_their_solo_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
