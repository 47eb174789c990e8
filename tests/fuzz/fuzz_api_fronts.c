// fuzz_api_fronts: request bodies of the Responses API and Anthropic's
// Messages API (the first byte picks one; its second bit, count_tokens)
// through their translations into chat requests (api/responses_parse.c,
// api/anthropic_parse.c, api/translate.c), and, when taken, the body's own
// bytes as a model's output through the output parser into that API's
// builder, streamed and whole. Promises: a body is taken with a non-empty
// messages array, or refused as a 4xx with a message each API's error shape
// keeps; a taken body's answer builds as events and as a body; nothing
// leaks (LeakSanitizer) and nothing reads out of bounds (ASan).
#include "api/anthropic.h"
#include "api/output_parser.h"
#include "api/responses.h"
#include "base/arena.h"
#include "base/base.h"
#include "tests/fuzz/fuzz.h"

enum { VOCAB = 1000, MAX_LEN = 4096 };

static void count_event(void *ctx, const char *event, json_t *data)
{
    FUZZ_CHECK(event && event[0] && data, "an event without a name or data");
    ++*(int *)ctx;
    json_decref(data);
}

// text as a model's whole output, split once at `cut`, through the parser
// into the builder: streamed (start, feeds, finish), then whole.
static void build(const struct event_stream_ops *ops, void *(*create)(const struct es_meta *),
                  const char *text, size_t len)
{
    struct es_meta m = {.id = "id_1", .created = 1, .model = "m", .prompt_tokens = 3};
    struct es_result res = {.finish = "stop", .usage = {3, 5, 1}};
    struct output_parser_opts po = {.reasoning = true, .tools = true};
    for (int whole = 0; whole < 2; whole++) {
        struct output_parser *p;
        char err[128];
        void *st = create(&m);
        if (!st || output_parser_create(&po, &p, err, sizeof err)) {
            if (st) ops->destroy(st);
            return;
        }
        int events = 0;
        es_emit_fn emit = whole ? NULL : count_event;
        const struct output_event *ev;
        size_t n_ev, cut = whole ? len : len / 2;
        int rc = emit ? ops->start(st, NULL, emit, &events) : 0;
        if (!rc) rc = output_parser_feed(p, text, cut, &ev, &n_ev, err, sizeof err);
        if (!rc) rc = ops->feed(st, ev, n_ev, emit, &events);
        if (!rc) rc = output_parser_feed(p, text + cut, len - cut, &ev, &n_ev, err, sizeof err);
        if (!rc) rc = ops->feed(st, ev, n_ev, emit, &events);
        if (!rc) rc = output_parser_finish(p, &ev, &n_ev, err, sizeof err);
        if (!rc) rc = ops->feed(st, ev, n_ev, emit, &events);
        res.finish = output_parser_finish_reason(p, "stop");
        if (!rc) rc = ops->finish(st, &res, emit, &events);
        FUZZ_CHECK(rc == 0, "the builder failed (%d)", rc);
        if (whole) {
            json_t *body = ops->body(st);
            FUZZ_CHECK(body, "no body");
            json_decref(body);
        } else {
            FUZZ_CHECK(events >= 2, "%d events", events);
        }
        output_parser_destroy(p);
        ops->destroy(st);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = n - 1;
    struct oa_limits lim = {.vocab_size = VOCAB, .max_model_len = MAX_LEN};
    struct arena *a = arena_create(4096);
    if (!a) return 0;
    struct oa_error e;
    struct oa_chat_request r;
    json_t *echo = NULL;
    memset(&r, 0, sizeof r);
    int rc, api = data[0] % 3;
    if (api == 0) rc = rs_parse(body, len, &lim, a, &r, &echo, &e);
    else if (api == 1) rc = an_parse(body, len, &lim, a, &r, &echo, &e);
    else rc = an_parse_count_tokens(body, len, &lim, a, &r, &e);
    if (rc) {
        FUZZ_CHECK(rc < 0 && e.http >= 400 && e.http < 500, "rc %d http %d: %s", rc, e.http, e.message);
        FUZZ_CHECK(strlen(e.message) > 8, "rc %d with message '%s'", rc, e.message);
        json_t *j = api ? an_error_json(&e) : oa_error_json(&e);
        FUZZ_CHECK(j, "no error body for '%s'", e.message);
        json_decref(j);
    } else {
        FUZZ_CHECK(json_array_size(r.messages) > 0, "taken without messages");
        // 0 when not given. One beyond the context is taken here: only the server,
        // which knows the prompt's length, can refuse it (context_length_exceeded
        // at submission, as vLLM does), so the parser promises no upper bound.
        FUZZ_CHECK(r.gen.max_tokens >= 0, "max_tokens %d", r.gen.max_tokens);
        if (api == 0) build(&rs_stream_ops, rs_stream_create, body, len);
        if (api == 1) build(&an_stream_ops, an_stream_create, body, len);
    }
    oa_chat_request_release(&r);
    json_decref(echo);
    arena_destroy(a);
    return 0;
}
