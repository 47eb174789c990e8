// routes_generate: the generation routes, POST /v1/chat/completions and
// POST /v1/completions (app.c's route table lists them), and the one path
// the other generation APIs (routes_responses.c, routes_anthropic.c) share.
#ifndef MOESERVE_SERVER_ROUTES_GENERATE_H
#define MOESERVE_SERVER_ROUTES_GENERATE_H

#include "api/event_stream.h"
#include "api/openai.h"
#include "base/arena.h"
#include "server/http.h"

// Handlers for struct http_route: app is the struct app; on an HTTP thread.
void routes_generate_chat(void *app, struct http_request *r);
void routes_generate_completions(void *app, struct http_request *r);

// An API whose body becomes a chat request and whose answer is typed events
// (api/event_stream.h): the Responses API, Anthropic's Messages. Its request
// runs exactly as a chat completion does (template, tools, reasoning,
// grammar, one choice); only the parse and the output differ.
struct generate_front {
    const char *param;               // where the prompt is, to name in errors: "input", "messages"
    const char *id_prefix;           // "resp_", "msg_"
    const char *call_id_prefix;      // tool call ids: "call_", "toolu_"
    const char *max_param;           // the output bound's name: "max_output_tokens", "max_tokens"
    // Anthropic's: a max_tokens past the room the prompt leaves is cut to it
    // (not a 400), and an answer that then fills the context says so
    // (es_result.context_full: stop_reason model_context_window_exceeded);
    // a prompt that alone is too long is refused as "prompt is too long".
    bool max_within_context;
    // The body into a chat request and the fields the answer repeats (*echo, or NULL).
    int (*parse)(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                 struct oa_chat_request *out, json_t **echo, struct oa_error *e);
    void *(*stream_create)(const struct es_meta *m);
    const struct event_stream_ops *ops;
};
// Serves r through f (which must outlive the request: a static table).
void routes_generate_front(void *app, struct http_request *r, const struct generate_front *f);

#endif
