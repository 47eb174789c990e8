// routes_responses: POST /v1/responses, the OpenAI Responses API
// (api/responses.h) on the chat completions' path (routes_generate.h).
#ifndef MOESERVE_SERVER_ROUTES_RESPONSES_H
#define MOESERVE_SERVER_ROUTES_RESPONSES_H

#include "server/http.h"

// A handler for struct http_route: app is the struct app.
void routes_responses_create(void *app, struct http_request *r);

#endif
