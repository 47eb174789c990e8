// event_stream: the seam between the job that streams one chat answer and
// the APIs whose answers are typed events rather than chat chunks — the
// OpenAI Responses API (api/responses.h) and Anthropic's Messages API
// (api/anthropic.h). Each implements these ops over its own state: the
// output parser's events (api/output_parser.h) become that API's server-sent
// events (an event name and a JSON object each), and at the end the same
// state gives the whole answer as one response body. No sockets, no threads:
// server/job.c frames the events as SSE and moves the bytes.
#ifndef MOESERVE_API_EVENT_STREAM_H
#define MOESERVE_API_EVENT_STREAM_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api/openai.h"
#include "api/output_parser.h"

// What every answer repeats, known before the first token. The strings must
// outlive the stream state (the job holds them).
struct es_meta {
    const char *id;              // "resp_…", "msg_…"
    int64_t created;             // Unix seconds
    const char *model;           // the served name the client asked for
    int prompt_tokens;           // input tokens (the rendered prompt)
    const json_t *echo;          // the request's fields the response repeats, or NULL (borrowed,
                                 // read only while the state is created)
    bool continues;              // the answer continues the prompt's final message (a prefill):
                                 // its first text keeps its leading whitespace
};

// How the answer ended, after the output parser has had the whole text.
struct es_result {
    const char *finish;          // "stop", "length", "abort" or "tool_calls"
                                 // (output_parser_finish_reason's)
    const char *stop_str;        // the stop string that ended it, or NULL
    struct oa_usage usage;
    int reasoning_tokens;        // output tokens before the end of reasoning
    bool context_full;           // "length" at the end of the context, max_tokens cut to fit it
};

// Receives one event; takes the reference to data (NULL data: out of memory,
// the callee drops the event). ctx is the caller's.
typedef void (*es_emit_fn)(void *ctx, const char *event, json_t *data);

// One API's builder. A state is used by one thread at a time. Streamed: start,
// then feed for each batch of parser events, then finish (or failed instead of
// finish, or after it, when the answer breaks off). Whole: feed and finish with
// emit NULL (nothing emitted), then body. Each returns 0 or MS_ENOMEM (the
// state is then spent: later calls emit nothing more; destroy it).
struct event_stream_ops {
    // usage: the prompt's tokens and how many of them the prefix cache held
    // (known once the engine has taken the request), for a start event that
    // carries them (Anthropic's message_start).
    int (*start)(void *st, const struct oa_usage *usage, es_emit_fn emit, void *ctx);
    int (*feed)(void *st, const struct output_event *ev, size_t n, es_emit_fn emit, void *ctx);
    int (*finish)(void *st, const struct es_result *r, es_emit_fn emit, void *ctx);
    // The answer failed part way (an engine error): the API's error event(s).
    int (*failed)(void *st, const struct oa_error *e, es_emit_fn emit, void *ctx);
    // After finish: the whole response object, a new reference (NULL: out of memory).
    json_t *(*body)(void *st);
    void (*destroy)(void *st); // NULL is fine
};

#endif
