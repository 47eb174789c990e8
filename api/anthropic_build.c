// anthropic_build: the Message object, Anthropic's stream events and its
// error shape (see anthropic.h). As in responses_build.c, one state machine
// serves both forms: parser events open, fill and close content blocks
// (thinking, text, tool_use); a stream emits each step, a whole answer keeps
// the closed blocks.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/anthropic.h"
#include "api/text_trim.h"
#include "base/base.h"
#include "base/buf.h"
#include "base/json.h"

// ---- errors ---------------------------------------------------------------------------

// Anthropic's error types by HTTP status.
static const char *error_type(int http)
{
    static const struct {
        int http;
        const char *type;
    } types[] = {
        {401, "authentication_error"}, {403, "permission_error"}, {404, "not_found_error"},
        {413, "request_too_large"},    {429, "rate_limit_error"}, {503, "overloaded_error"},
        {529, "overloaded_error"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (types[i].http == http) return types[i].type;
    return http >= 500 ? "api_error" : "invalid_request_error";
}

json_t *an_error_json(const struct oa_error *e)
{
    // The OpenAI envelope's message is already made safe (lossy UTF-8); reuse it.
    json_t *oa = oa_error_json(e), *msg = json_object_get(json_object_get(oa, "error"), "message");
    json_t *r = msg ? json_pack("{s:s, s:{s:s, s:O}}", "type", "error", "error", "type",
                                error_type(e->http), "message", msg)
                    : NULL;
    json_decref(oa);
    // What the SDK reads off a refused thread (ThreadState's unsupportedFeatures).
    if (r && e->code && !strcmp(e->code, "thread_unsupported_request") &&
        json_object_set_new(json_object_get(r, "error"), "details",
                            json_pack("{s:s, s:[s]}", "error_code", e->code, "unsupported", e->param))) {
        json_decref(r);
        return NULL;
    }
    return r;
}

// ---- the Message ------------------------------------------------------------------------

enum block_kind { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL };

struct an_stream {
    char id[96];
    char *model;
    int prompt_tokens;
    json_t *content;                 // the blocks closed so far
    bool spent;
    // the open block
    enum block_kind kind;
    int call_index;
    struct ms_buf text;
    // Text and thinking blocks are trimmed as Anthropic's are (text_trim.h):
    // `run` is the kind whose text is arriving, its block open or not yet.
    enum block_kind run;
    struct text_trim trim;
    char call_id[OUTPUT_PARSER_MAX_ID];
    char *name;
    // the end
    const char *stop_reason;
    const char *stop_sequence;       // owned copy in stop_buf
    char *stop_buf;
    struct oa_usage usage;
};

void *an_stream_create(const struct es_meta *m)
{
    struct an_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    snprintf(s->id, sizeof s->id, "%s", m->id);
    s->model = strdup(m->model);
    s->prompt_tokens = m->prompt_tokens;
    s->content = json_array();
    if (!s->model || !s->content) {
        free(s->model);
        json_decref(s->content);
        free(s);
        return NULL;
    }
    s->usage.prompt_tokens = m->prompt_tokens;
    s->trim.keep_lead = m->continues;
    return s;
}

static void an_destroy(void *st)
{
    struct an_stream *s = st;
    if (!s) return;
    free(s->model);
    free(s->name);
    free(s->stop_buf);
    ms_buf_free(&s->text);
    text_trim_free(&s->trim);
    json_decref(s->content);
    free(s);
}

// Anthropic counts cache reads apart from input_tokens. The fields the SDK
// types as present but nullable come as null (a client's === null checks).
static json_t *usage_json(const struct oa_usage *u)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:n, s:n, s:s}", "input_tokens", u->prompt_tokens - u->cached_tokens,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", u->cached_tokens,
                     "output_tokens", u->completion_tokens, "cache_creation", "server_tool_use",
                     "service_tier", "standard");
}

static json_t *message_json(const struct an_stream *s, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:s?, s:n, s:n, s:o}", "id", s->id, "type", "message",
                     "role", "assistant", "model", s->model, "content", content, "stop_reason",
                     s->stop_reason, "stop_sequence", s->stop_sequence, "stop_details", "container",
                     "usage", usage_json(&s->usage));
}

// ---- events ---------------------------------------------------------------------------

static int send(struct an_stream *s, es_emit_fn emit, void *ctx, const char *type, json_t *ev)
{
    if (!ev || json_object_set_new(ev, "type", json_string(type))) {
        json_decref(ev);
        s->spent = true;
        return MS_ENOMEM;
    }
    if (emit) emit(ctx, type, ev);
    else json_decref(ev);
    return 0;
}

static int an_start(void *st, const struct oa_usage *usage, es_emit_fn emit, void *ctx)
{
    struct an_stream *s = st;
    if (s->spent) return MS_ENOMEM;
    if (!emit) return 0;
    // As message_delta will count them: a cached prefix apart from input_tokens.
    if (usage) s->usage.prompt_tokens = usage->prompt_tokens, s->usage.cached_tokens = usage->cached_tokens;
    int rc = send(s, emit, ctx, "message_start",
                  json_pack("{s:o}", "message", message_json(s, json_array())));
    return rc ? rc : send(s, emit, ctx, "ping", json_object());
}

static json_t *block_json(const struct an_stream *s, bool whole)
{
    json_t *text = json_stringn(whole && s->text.data ? s->text.data : "", whole ? s->text.len : 0);
    if (!text) return NULL;
    switch (s->kind) {
    case BLOCK_THINKING:
        return json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", text, "signature", "");
    case BLOCK_TEXT: return json_pack("{s:s, s:o}", "type", "text", "text", text);
    case BLOCK_TOOL: {
        json_decref(text);
        // The parser kept the call only when its arguments are one JSON object.
        json_t *input = whole ? json_loadb_wide(s->text.data ? s->text.data : "{}", s->text.len ? s->text.len : 2,
                                                0)
                              : json_object();
        if (!json_is_object(input)) {
            json_decref(input);
            input = json_object();
        }
        return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", s->call_id, "name",
                         s->name, "input", input);
    }
    default: json_decref(text); return NULL;
    }
}

static int open_block(struct an_stream *s, enum block_kind k, const struct output_event *ev,
                      es_emit_fn emit, void *ctx)
{
    s->kind = k;
    s->text.len = 0;
    if (k == BLOCK_TOOL) {
        s->call_index = ev->index;
        snprintf(s->call_id, sizeof s->call_id, "%s", ev->id ? ev->id : "toolu_0");
        free(s->name);
        s->name = strndup(ev->text, ev->len);
        if (!s->name) return s->spent = true, MS_ENOMEM;
    }
    if (!emit) return 0;
    json_t *b = block_json(s, false);
    return send(s, emit, ctx, "content_block_start",
                b ? json_pack("{s:i, s:o}", "index", (int)json_array_size(s->content),
                              "content_block", b)
                  : NULL);
}

static int delta(struct an_stream *s, const char *text, size_t len, es_emit_fn emit, void *ctx)
{
    if (ms_buf_append(&s->text, text, len)) return s->spent = true, MS_ENOMEM;
    if (!emit) return 0;
    static const char *const kinds[][2] = {[BLOCK_THINKING] = {"thinking_delta", "thinking"},
                                           [BLOCK_TEXT] = {"text_delta", "text"},
                                           [BLOCK_TOOL] = {"input_json_delta", "partial_json"}};
    json_t *d = json_stringn(text, len);
    return send(s, emit, ctx, "content_block_delta",
                d ? json_pack("{s:i, s:{s:s, s:o}}", "index", (int)json_array_size(s->content),
                              "delta", "type", kinds[s->kind][0], kinds[s->kind][1], d)
                  : NULL);
}

static int close_block(struct an_stream *s, es_emit_fn emit, void *ctx)
{
    text_trim_end(&s->trim);
    s->run = BLOCK_NONE;
    if (s->kind == BLOCK_NONE) return 0;
    int index = (int)json_array_size(s->content);
    json_t *b = block_json(s, true);
    if (!b || json_array_append_new(s->content, b)) return s->spent = true, MS_ENOMEM;
    s->kind = BLOCK_NONE;
    return emit ? send(s, emit, ctx, "content_block_stop", json_pack("{s:i}", "index", index)) : 0;
}

static enum block_kind kind_of(enum output_event_kind k)
{
    switch (k) {
    case OUTPUT_EVENT_REASONING: return BLOCK_THINKING;
    case OUTPUT_EVENT_CONTENT: return BLOCK_TEXT;
    default: return BLOCK_TOOL;
    }
}

struct trim_ctx {
    struct an_stream *s;
    enum block_kind k;
    const struct output_event *e;
    es_emit_fn emit;
    void *ctx;
};

static int trim_open(void *p)
{
    struct trim_ctx *t = p;
    return open_block(t->s, t->k, t->e, t->emit, t->ctx);
}

static int trim_send(void *p, const char *text, size_t len)
{
    struct trim_ctx *t = p;
    return delta(t->s, text, len, t->emit, t->ctx);
}

// A text or thinking event, trimmed (text_trim.h).
static int text_event(struct an_stream *s, enum block_kind k, const struct output_event *e, es_emit_fn emit,
                      void *ctx)
{
    static const struct text_trim_ops ops = {trim_open, trim_send};
    if (s->run != k) {
        if (close_block(s, emit, ctx)) return MS_ENOMEM;
        s->run = k;
    }
    struct trim_ctx t = {s, k, e, emit, ctx};
    return text_trim_feed(&s->trim, e->text, e->len, &ops, &t) ? (s->spent = true, MS_ENOMEM) : 0;
}

static int an_feed(void *st, const struct output_event *ev, size_t n, es_emit_fn emit, void *ctx)
{
    struct an_stream *s = st;
    for (size_t i = 0; i < n && !s->spent; i++) {
        const struct output_event *e = &ev[i];
        enum block_kind k = kind_of(e->kind);
        if (k != BLOCK_TOOL) {
            if (text_event(s, k, e, emit, ctx)) break;
            continue;
        }
        bool same = s->kind == k && e->kind == OUTPUT_EVENT_TOOL_ARGS && e->index == s->call_index;
        s->run = BLOCK_NONE;
        s->trim.keep_lead = false; // a call came first: text after it starts a new run
        if (!same && (close_block(s, emit, ctx) || open_block(s, k, e, emit, ctx))) break;
        if (e->kind != OUTPUT_EVENT_TOOL_BEGIN && e->len && delta(s, e->text, e->len, emit, ctx)) break;
    }
    return s->spent ? MS_ENOMEM : 0;
}

static const char *stop_reason(const struct es_result *r)
{
    static const struct {
        const char *finish, *reason;
    } map[] = {{"tool_calls", "tool_use"}, {"length", "max_tokens"}, {"stop", "end_turn"},
               {"abort", "end_turn"}};
    if (!strcmp(r->finish, "stop") && r->stop_str) return "stop_sequence";
    if (r->context_full) return "model_context_window_exceeded";
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].finish, r->finish)) return map[i].reason;
    return "end_turn";
}

static int an_finish(void *st, const struct es_result *r, es_emit_fn emit, void *ctx)
{
    struct an_stream *s = st;
    if (s->spent || close_block(s, emit, ctx)) return MS_ENOMEM;
    s->stop_reason = stop_reason(r);
    if (!strcmp(s->stop_reason, "stop_sequence")) {
        s->stop_buf = strdup(r->stop_str);
        if (!s->stop_buf) return s->spent = true, MS_ENOMEM;
        s->stop_sequence = s->stop_buf;
    }
    s->usage = r->usage;
    if (!emit) return 0;
    int rc = send(s, emit, ctx, "message_delta",
                  json_pack("{s:{s:s, s:s?, s:n}, s:o}", "delta", "stop_reason", s->stop_reason,
                            "stop_sequence", s->stop_sequence, "stop_details", "usage",
                            usage_json(&s->usage)));
    return rc ? rc : send(s, emit, ctx, "message_stop", json_object());
}

static int an_fail(void *st, const struct oa_error *e, es_emit_fn emit, void *ctx)
{
    struct an_stream *s = st;
    if (!emit) return 0;
    json_t *err = an_error_json(e);
    if (!err) return s->spent = true, MS_ENOMEM;
    emit(ctx, "error", err);
    return 0;
}

static json_t *an_body(void *st)
{
    struct an_stream *s = st;
    json_t *content = s->spent ? NULL : json_deep_copy(s->content);
    return content ? message_json(s, content) : NULL;
}

const struct event_stream_ops an_stream_ops = {
    .start = an_start,
    .feed = an_feed,
    .finish = an_finish,
    .failed = an_fail,
    .body = an_body,
    .destroy = an_destroy,
};
