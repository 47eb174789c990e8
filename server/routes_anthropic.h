// routes_anthropic: Anthropic's Messages API (api/anthropic.h) —
// POST /v1/messages on the chat completions' path (routes_generate.h) and
// POST /v1/messages/count_tokens, which renders and counts without
// generating. Their routes answer errors in Anthropic's shape (an_error_json).
#ifndef MOESERVE_SERVER_ROUTES_ANTHROPIC_H
#define MOESERVE_SERVER_ROUTES_ANTHROPIC_H

#include "server/http.h"

// Handlers for struct http_route: app is the struct app.
void routes_anthropic_messages(void *app, struct http_request *r);
void routes_anthropic_count_tokens(void *app, struct http_request *r);

#endif
