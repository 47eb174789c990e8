// routes_text: the routes that generate nothing — POST /tokenize and
// /detokenize, GET /v1/models and /v1/models/{id}, /version, /health and
// /metrics (app.c's
// route table lists them).
#ifndef MOESERVE_SERVER_ROUTES_TEXT_H
#define MOESERVE_SERVER_ROUTES_TEXT_H

#include "server/http.h"

// Handlers for struct http_route: app is the struct app; on an HTTP thread.
void routes_text_tokenize(void *app, struct http_request *r);
void routes_text_detokenize(void *app, struct http_request *r);
void routes_text_models(void *app, struct http_request *r);
// GET /v1/models/{id} (a prefix route).
void routes_text_model(void *app, struct http_request *r);
void routes_text_version(void *app, struct http_request *r);
// /health, and the same answer on /v1/health (llama-server's) and /ping
// (SageMaker's, as vLLM serves it).
void routes_text_health(void *app, struct http_request *r);
void routes_text_metrics(void *app, struct http_request *r);
// GET /dashboard: the live page (server/dashboard.h).
void routes_text_dashboard(void *app, struct http_request *r);

#endif
