// routes_generate: the generation routes, POST /v1/chat/completions and
// POST /v1/completions (app.c's route table lists them).
#ifndef MOESERVE_SERVER_ROUTES_GENERATE_H
#define MOESERVE_SERVER_ROUTES_GENERATE_H

#include "server/http.h"

// Handlers for struct http_route: app is the struct app; on an HTTP thread.
void routes_generate_chat(void *app, struct http_request *r);
void routes_generate_completions(void *app, struct http_request *r);

#endif
