// anthropic: Anthropic's Messages API (POST /v1/messages and
// /v1/messages/count_tokens), as Claude Code and other Anthropic clients
// speak it. The body (system, messages with text, tool_use, tool_result and
// thinking blocks, tools with input_schema, tool_choice auto|any|tool|none,
// max_tokens, stop_sequences, temperature/top_p/top_k, thinking (absent:
// off), output_config.format / output_format into response_format,
// context_management's clearing edits as no-ops) becomes an
// OpenAI chat request, so it runs as the same engine request as
// /v1/chat/completions; the output parser's events become the Message object
// and Anthropic's stream (message_start, content_block_start/delta/stop with
// text_delta, thinking_delta and input_json_delta, message_delta,
// message_stop). Errors take Anthropic's shape: {"type": "error", "error":
// {"type", "message"}}, plus "details" {error_code, unsupported} for a
// refused thread, as the SDK reads it.
#ifndef MOESERVE_API_ANTHROPIC_H
#define MOESERVE_API_ANTHROPIC_H

#include <jansson.h>
#include <stdbool.h>

#include "api/event_stream.h"
#include "api/openai.h"
#include "base/arena.h"

// Parses and validates a Messages body into *out (a chat request: release it
// with oa_chat_request_release); *echo is set to NULL (the Message repeats
// nothing of the request but the model). count_tokens: the body of
// /v1/messages/count_tokens (no max_tokens, nothing to sample). Errors name
// the Messages API's parameters ("max_tokens", "messages[1].content[0]").
int an_parse(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
             struct oa_chat_request *out, json_t **echo, struct oa_error *e);
int an_parse_count_tokens(const char *body, size_t len, const struct oa_limits *lim,
                          struct arena *a, struct oa_chat_request *out, struct oa_error *e);

// The error body in Anthropic's shape; its type from e->http
// (invalid_request_error, authentication_error, not_found_error,
// request_too_large, overloaded_error, api_error...). A new reference, or
// NULL when out of memory.
json_t *an_error_json(const struct oa_error *e);

// A stream state for one answer (event_stream.h's ops in an_stream_ops);
// NULL when out of memory. m's strings must outlive it.
void *an_stream_create(const struct es_meta *m);
extern const struct event_stream_ops an_stream_ops;

#endif
