// responses_build: the Response object and its typed events (see
// responses.h). One state machine serves both forms: the output parser's
// events open, fill and close output items (reasoning, message, function
// call) in order; a stream emits each step as OpenAI's events, a whole answer
// runs the same steps silently and takes the finished items.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"
#include "api/text_trim.h"
#include "base/base.h"
#include "base/buf.h"

enum item_kind { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

struct rs_stream {
    char id[96];
    int64_t created;
    char *model;
    int prompt_tokens;
    json_t *echo;                    // owned copy of the request's repeated fields
    json_t *output;                  // the items closed so far
    long seq;                        // sequence_number of the next event
    bool spent;                      // out of memory once: nothing more is emitted
    // the open item
    enum item_kind kind;
    int call_index;
    char item_id[96];
    struct ms_buf text;              // its text, reasoning or arguments so far
    char call_id[OUTPUT_PARSER_MAX_ID];
    char *name;
    // Reasoning and message text trimmed as OpenAI's are (text_trim.h):
    // `run` is the kind whose text is arriving, its item open or not yet.
    enum item_kind run;
    struct text_trim trim;
    // the end
    const char *status;              // "in_progress", then completed | incomplete | failed
    const char *incomplete;          // incomplete_details.reason, or NULL
    json_t *error;                   // the Response's error object when failed
    struct oa_usage usage;
    int reasoning_tokens;
    bool ended;
};

void *rs_stream_create(const struct es_meta *m)
{
    struct rs_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    snprintf(s->id, sizeof s->id, "%s", m->id);
    s->created = m->created;
    s->model = strdup(m->model);
    s->prompt_tokens = m->prompt_tokens;
    s->echo = m->echo ? json_deep_copy(m->echo) : json_object();
    s->output = json_array();
    s->status = "in_progress";
    s->trim.keep_lead = m->continues;
    if (!s->model || !s->echo || !s->output) {
        free(s->model);
        json_decref(s->echo);
        json_decref(s->output);
        free(s);
        return NULL;
    }
    return s;
}

static void rs_destroy(void *st)
{
    struct rs_stream *s = st;
    if (!s) return;
    free(s->model);
    free(s->name);
    ms_buf_free(&s->text);
    text_trim_free(&s->trim);
    json_decref(s->echo);
    json_decref(s->output);
    json_decref(s->error);
    free(s);
}

// ---- the Response object --------------------------------------------------------------

static json_t *usage_json(const struct rs_stream *s)
{
    const struct oa_usage *u = &s->usage;
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:I}", "input_tokens", u->prompt_tokens,
                     "input_tokens_details", "cached_tokens", u->cached_tokens, "output_tokens",
                     u->completion_tokens, "output_tokens_details", "reasoning_tokens",
                     s->reasoning_tokens, "total_tokens",
                     (json_int_t)u->prompt_tokens + u->completion_tokens);
}

static json_t *response_json(const struct rs_stream *s)
{
    json_t *r = json_deep_copy(s->echo);
    if (!r) return NULL;
    json_t *fields = json_pack(
        "{s:s, s:s, s:I, s:s, s:b, s:O, s:o, s:s, s:o, s:n, s:b, s:s, s:s, s:i, s:n, s:n}",
        "id", s->id, "object", "response", "created_at", (json_int_t)s->created, "status",
        s->status, "background", 0, "error", s->error ? s->error : json_null(),
        "incomplete_details",
        s->incomplete ? json_pack("{s:s}", "reason", s->incomplete) : json_null(), "model",
        s->model, "output", json_deep_copy(s->output), "previous_response_id", "store", 0,
        "truncation", "disabled", "service_tier", "default", "top_logprobs", 0,
        "max_tool_calls", "prompt_cache_key");
    if (!fields || json_object_update(r, fields)) {
        json_decref(fields);
        json_decref(r);
        return NULL;
    }
    json_decref(fields);
    if (json_object_set_new(r, "usage", s->ended ? usage_json(s) : json_null())) {
        json_decref(r);
        return NULL;
    }
    return r;
}

// ---- events -------------------------------------------------------------------------

// Adds type and sequence_number and hands ev to emit (or drops it when the
// answer is built whole). A failed allocation spends the state.
static int send(struct rs_stream *s, es_emit_fn emit, void *ctx, const char *type, json_t *ev)
{
    if (!ev || json_object_set_new(ev, "type", json_string(type)) ||
        json_object_set_new(ev, "sequence_number", json_integer(s->seq))) {
        json_decref(ev);
        s->spent = true;
        return MS_ENOMEM;
    }
    s->seq++;
    if (emit) emit(ctx, type, ev);
    else json_decref(ev);
    return 0;
}

static int send_response(struct rs_stream *s, es_emit_fn emit, void *ctx, const char *type)
{
    if (!emit) return 0;
    json_t *r = response_json(s);
    return send(s, emit, ctx, type, r ? json_pack("{s:o}", "response", r) : NULL);
}

static int rs_start(void *st, const struct oa_usage *usage, es_emit_fn emit, void *ctx)
{
    (void)usage; // the Response object carries usage only once it is done
    struct rs_stream *s = st;
    if (s->spent) return MS_ENOMEM;
    int rc = send_response(s, emit, ctx, "response.created");
    return rc ? rc : send_response(s, emit, ctx, "response.in_progress");
}

static const char *part_type(enum item_kind k)
{
    return k == ITEM_REASONING ? "reasoning_text" : "output_text";
}

// The open item: as output_item.added announces it (status "in_progress",
// no content parts yet: content_part.added brings them), or whole.
static json_t *item_json(const struct rs_stream *s, const char *status)
{
    bool added = !strcmp(status, "in_progress");
    json_t *text = json_stringn(s->text.data ? s->text.data : "", s->text.len);
    json_t *parts = s->kind == ITEM_REASONING
                        ? json_pack("[{s:s, s:O}]", "type", "reasoning_text", "text", text)
                        : json_pack("[{s:s, s:O, s:[], s:[]}]", "type", "output_text", "text",
                                    text, "annotations", "logprobs");
    if (!text || !parts || (added && json_array_clear(parts))) {
        json_decref(text);
        json_decref(parts);
        return NULL;
    }
    switch (s->kind) {
    case ITEM_REASONING:
        json_decref(text);
        return json_pack("{s:s, s:s, s:[], s:o, s:s}", "id", s->item_id, "type", "reasoning",
                         "summary", "content", parts, "status", status);
    case ITEM_MESSAGE:
        json_decref(text);
        return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", s->item_id, "type", "message",
                         "status", status, "role", "assistant", "content", parts);
    case ITEM_CALL:
        json_decref(parts);
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "id", s->item_id, "type",
                         "function_call", "status", status, "call_id", s->call_id, "name", s->name,
                         "arguments", text);
    default: json_decref(text); json_decref(parts); return NULL;
    }
}

static json_t *empty_part(enum item_kind k)
{
    if (k == ITEM_REASONING) return json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "");
    return json_pack("{s:s, s:s, s:[], s:[]}", "type", "output_text", "text", "", "annotations",
                     "logprobs");
}

// Opens an item: output_item.added, and for text items content_part.added.
static int open_item(struct rs_stream *s, enum item_kind k, const struct output_event *ev,
                     es_emit_fn emit, void *ctx)
{
    static const char *const prefixes[] = {[ITEM_REASONING] = "rs_", [ITEM_MESSAGE] = "msg_",
                                           [ITEM_CALL] = "fc_"};
    s->kind = k;
    s->text.len = 0;
    oa_make_id(s->item_id, sizeof s->item_id, prefixes[k]);
    if (k == ITEM_CALL) {
        s->call_index = ev->index;
        snprintf(s->call_id, sizeof s->call_id, "%s", ev->id ? ev->id : "call_0");
        free(s->name);
        s->name = strndup(ev->text, ev->len);
        if (!s->name) return s->spent = true, MS_ENOMEM;
    }
    int oi = (int)json_array_size(s->output);
    if (!emit) return 0;
    json_t *item = item_json(s, "in_progress");
    int rc = send(s, emit, ctx, "response.output_item.added",
                  item ? json_pack("{s:i, s:o}", "output_index", oi, "item", item) : NULL);
    if (rc || k == ITEM_CALL) return rc;
    json_t *part = empty_part(k);
    return send(s, emit, ctx, "response.content_part.added",
                part ? json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index", oi,
                                 "content_index", 0, "part", part)
                     : NULL);
}

static int delta(struct rs_stream *s, const char *text, size_t len, es_emit_fn emit, void *ctx)
{
    if (ms_buf_append(&s->text, text, len)) return s->spent = true, MS_ENOMEM;
    if (!emit) return 0;
    int oi = (int)json_array_size(s->output);
    json_t *d = json_stringn(text, len);
    if (s->kind == ITEM_CALL)
        return send(s, emit, ctx, "response.function_call_arguments.delta",
                    d ? json_pack("{s:s, s:i, s:o}", "item_id", s->item_id, "output_index", oi,
                                  "delta", d)
                      : NULL);
    if (s->kind == ITEM_REASONING)
        return send(s, emit, ctx, "response.reasoning_text.delta",
                    d ? json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index", oi,
                                  "content_index", 0, "delta", d)
                      : NULL);
    return send(s, emit, ctx, "response.output_text.delta",
                d ? json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", s->item_id, "output_index",
                              oi, "content_index", 0, "delta", d, "logprobs")
                  : NULL);
}

// Closes the open item: the .done events with the whole text, then
// output_item.done; the item joins output. status: "completed", or
// "incomplete" when the answer was cut inside it.
static int close_item(struct rs_stream *s, const char *status, es_emit_fn emit, void *ctx)
{
    text_trim_end(&s->trim);
    s->run = ITEM_NONE;
    if (s->kind == ITEM_NONE) return 0;
    int oi = (int)json_array_size(s->output), rc = 0;
    json_t *whole = json_stringn(s->text.data ? s->text.data : "", s->text.len);
    if (!whole) return s->spent = true, MS_ENOMEM;
    if (emit && s->kind == ITEM_CALL) {
        rc = send(s, emit, ctx, "response.function_call_arguments.done",
                  json_pack("{s:s, s:i, s:s, s:O}", "item_id", s->item_id, "output_index", oi,
                            "name", s->name, "arguments", whole));
    } else if (emit) {
        const char *done = s->kind == ITEM_REASONING ? "response.reasoning_text.done"
                                                     : "response.output_text.done";
        rc = s->kind == ITEM_REASONING
                 ? send(s, emit, ctx, done,
                        json_pack("{s:s, s:i, s:i, s:O}", "item_id", s->item_id, "output_index", oi,
                                  "content_index", 0, "text", whole))
                 : send(s, emit, ctx, done,
                        json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", s->item_id,
                                  "output_index", oi, "content_index", 0, "text", whole, "logprobs"));
        json_t *part = s->kind == ITEM_REASONING
                           ? json_pack("{s:s, s:O}", "type", part_type(s->kind), "text", whole)
                           : json_pack("{s:s, s:O, s:[], s:[]}", "type", "output_text", "text",
                                       whole, "annotations", "logprobs");
        if (!rc)
            rc = send(s, emit, ctx, "response.content_part.done",
                      part ? json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index",
                                       oi, "content_index", 0, "part", part)
                           : NULL);
        else
            json_decref(part);
    }
    json_decref(whole);
    json_t *item = rc ? NULL : item_json(s, status);
    if (!item || json_array_append(s->output, item)) {
        json_decref(item);
        return s->spent = true, MS_ENOMEM;
    }
    s->kind = ITEM_NONE;
    if (emit) rc = send(s, emit, ctx, "response.output_item.done",
                        json_pack("{s:i, s:o}", "output_index", oi, "item", item));
    else json_decref(item);
    return rc;
}

static enum item_kind kind_of(enum output_event_kind k)
{
    switch (k) {
    case OUTPUT_EVENT_REASONING: return ITEM_REASONING;
    case OUTPUT_EVENT_CONTENT: return ITEM_MESSAGE;
    default: return ITEM_CALL;
    }
}

struct trim_ctx {
    struct rs_stream *s;
    enum item_kind k;
    const struct output_event *e;
    es_emit_fn emit;
    void *ctx;
};

static int trim_open(void *p)
{
    struct trim_ctx *t = p;
    return open_item(t->s, t->k, t->e, t->emit, t->ctx);
}

static int trim_send(void *p, const char *text, size_t len)
{
    struct trim_ctx *t = p;
    return delta(t->s, text, len, t->emit, t->ctx);
}

static int rs_feed(void *st, const struct output_event *ev, size_t n, es_emit_fn emit, void *ctx)
{
    static const struct text_trim_ops ops = {trim_open, trim_send};
    struct rs_stream *s = st;
    for (size_t i = 0; i < n && !s->spent; i++) {
        const struct output_event *e = &ev[i];
        enum item_kind k = kind_of(e->kind);
        if (k != ITEM_CALL) { // text, trimmed: its item opens at its first non-space byte
            if (s->run != k) {
                if (close_item(s, "completed", emit, ctx)) break;
                s->run = k;
            }
            struct trim_ctx t = {s, k, e, emit, ctx};
            if (text_trim_feed(&s->trim, e->text, e->len, &ops, &t)) s->spent = true;
            continue;
        }
        // A new call closes the open item; its arguments go on in it. Text
        // after a call starts a new run, also where the call came first.
        s->trim.keep_lead = false;
        bool same = s->kind == k && e->kind == OUTPUT_EVENT_TOOL_ARGS && e->index == s->call_index;
        if (!same) {
            if (close_item(s, "completed", emit, ctx)) break;
            if (open_item(s, k, e, emit, ctx)) break;
        }
        if (e->kind != OUTPUT_EVENT_TOOL_BEGIN && e->len && delta(s, e->text, e->len, emit, ctx)) break;
    }
    return s->spent ? MS_ENOMEM : 0;
}

static int rs_finish(void *st, const struct es_result *r, es_emit_fn emit, void *ctx)
{
    struct rs_stream *s = st;
    if (s->spent) return MS_ENOMEM;
    bool cut = !strcmp(r->finish, "length") || !strcmp(r->finish, "abort");
    s->status = cut ? "incomplete" : "completed";
    s->incomplete = !strcmp(r->finish, "length") ? "max_output_tokens" : cut ? "cancelled" : NULL;
    if (close_item(s, cut ? "incomplete" : "completed", emit, ctx)) return MS_ENOMEM;
    s->usage = r->usage;
    s->reasoning_tokens = r->reasoning_tokens;
    s->ended = true;
    return send_response(s, emit, ctx, cut ? "response.incomplete" : "response.completed");
}

static int rs_fail(void *st, const struct oa_error *e, es_emit_fn emit, void *ctx)
{
    struct rs_stream *s = st;
    s->status = "failed";
    json_decref(s->error);
    s->error = json_pack("{s:s, s:s}", "code", e->code ? e->code : "server_error", "message",
                         e->message);
    s->ended = true;
    if (!emit) return 0;
    int rc = send(s, emit, ctx, "error",
                  json_pack("{s:s, s:s, s:s*}", "code", e->code ? e->code : "server_error",
                            "message", e->message, "param", e->param[0] ? e->param : NULL));
    return rc ? rc : send_response(s, emit, ctx, "response.failed");
}

static json_t *rs_body(void *st)
{
    struct rs_stream *s = st;
    return s->spent ? NULL : response_json(s);
}

const struct event_stream_ops rs_stream_ops = {
    .start = rs_start,
    .feed = rs_feed,
    .finish = rs_finish,
    .failed = rs_fail,
    .body = rs_body,
    .destroy = rs_destroy,
};
