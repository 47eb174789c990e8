// http: the HTTP/1.1 front end on libmicrohttpd's epoll thread pool —
// routing, API-key auth, request bodies, and responses that wait (deferred
// or streamed) without holding a thread, resumed by whoever produces them.
#ifndef MOESERVE_SERVER_HTTP_H
#define MOESERVE_SERVER_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/openai.h"
#include "base/buf.h"

struct http_server;
struct http_request; // one HTTP request, valid from its handler until it completes
struct http_async;   // a response that waits: deferred (one body later) or streamed

struct http_route {
    const char *method;          // "GET", "POST"
    const char *path;            // exact
    bool public_;                // no API key needed (/health, /metrics)
    void (*handle)(void *app, struct http_request *r);
};

struct http_opts {
    const char *host;            // "127.0.0.1"; a name or an IPv6 literal works too
    int port;                    // 0: any free port (http_port says which)
    int threads;                 // the epoll thread pool (>= 1)
    size_t max_body;             // 413 beyond
    const char *api_key;         // NULL or "": no auth
    double keepalive_s;          // an SSE comment after this long without stream output (0: never)
    unsigned connection_timeout_s; // idle connections closed after this (0: never)
    unsigned max_connections;
    const struct http_route *routes;
    int n_routes;
    void *app;                   // passed to the handlers
};

int http_start(const struct http_opts *o, struct http_server **out, char *err, size_t errlen);
int http_port(const struct http_server *s);
// Streams and deferred responses still open.
int http_open_async(struct http_server *s);
// Ends what is still open (streams cut, deferred ones answered 503), waits up
// to timeout_s for them to complete, then stops the daemon and frees s.
void http_stop(struct http_server *s, double timeout_s);

// ---- inside a handler (on an HTTP thread) ----
const char *http_method(const struct http_request *r);
const char *http_path(const struct http_request *r);
const char *http_header(const struct http_request *r, const char *name); // or NULL
const char *http_body(const struct http_request *r, size_t *len);        // NUL-terminated
// Extra headers for the response queued next (Retry-After, Allow...).
void http_add_header(struct http_request *r, const char *name, const char *value);
// Token counts for the request's log line.
void http_set_log_tokens(struct http_request *r, int prompt, int completion);

// Each returns 0, or -1 when the response could not be queued (the client
// is gone); body is copied. http_respond_json takes j (and json_decrefs it).
int http_respond(struct http_request *r, int status, const char *content_type, const char *body,
                 size_t len);
int http_respond_json(struct http_request *r, int status, json_t *j);
int http_respond_error(struct http_request *r, const struct oa_error *e);

// ---- responses that wait ----
struct http_async_ops {
    // Streams: on an HTTP thread when the connection can take bytes; appends
    // what is ready to out (the shared byte buffer, base/buf.h) and returns
    // true once the stream is complete.
    bool (*fill)(void *ctx, struct ms_buf *out);
    // Deferred: on an HTTP thread after a wake; responds (http_respond*) when
    // the answer is ready, or returns without responding to wait on.
    void (*ready)(void *ctx, struct http_request *r);
    // The client went away before the response completed (any thread, at most once).
    void (*gone)(void *ctx);
    // The HTTP side will not call any op again (once, last).
    void (*release)(void *ctx);
};

// Both return an async holding two references: the caller's (drop it with
// http_async_unref once nothing will wake it any more) and the connection's.
// NULL when out of memory (nothing queued then). Call them from a handler.
struct http_async *http_defer(struct http_request *r, const struct http_async_ops *ops, void *ctx);
// headers now; body from ops->fill.
struct http_async *http_stream(struct http_request *r, int status, const char *content_type,
                               const struct http_async_ops *ops, void *ctx);
// Any thread: output is ready (fill or ready runs soon). A no-op once the
// connection completed.
void http_async_wake(struct http_async *a);
void http_async_set_log_tokens(struct http_async *a, int prompt, int completion);
void http_async_unref(struct http_async *a);

#endif
