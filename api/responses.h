// responses: the OpenAI Responses API (POST /v1/responses), its stateless
// core as vLLM serves it. The body (input as a string or a list of items —
// messages, function_call and function_call_output items, reasoning items —
// instructions, function tools, tool_choice, text.format, reasoning.effort,
// max_output_tokens, sampling) becomes an OpenAI chat request, so it runs as
// the same engine request as /v1/chat/completions (template, tools,
// reasoning, grammar); the output parser's events become the Response object
// and its typed stream (response.created, response.output_item.added,
// response.output_text.delta, response.function_call_arguments.delta,
// response.reasoning_text.delta, …, response.completed).
//
// Nothing is stored: `store` false (or left out) is served, `store` true and
// `previous_response_id` are refused with a 400 that says the server is
// stateless and the client must send the whole conversation in `input`.
#ifndef MOESERVE_API_RESPONSES_H
#define MOESERVE_API_RESPONSES_H

#include <jansson.h>

#include "api/event_stream.h"
#include "api/openai.h"
#include "base/arena.h"

// Parses and validates a Responses body into *out (a chat request: see
// oa_parse_chat for ownership; release it with oa_chat_request_release) and
// *echo, a new object with the request fields the Response repeats
// (instructions, tools, tool_choice, temperature, …). Errors name the
// Responses API's parameters ("input[2].content", "max_output_tokens").
int rs_parse(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
             struct oa_chat_request *out, json_t **echo, struct oa_error *e);

// A stream state for one answer (event_stream.h's ops in rs_stream_ops);
// NULL when out of memory. m's strings must outlive it.
void *rs_stream_create(const struct es_meta *m);
extern const struct event_stream_ops rs_stream_ops;

#endif
