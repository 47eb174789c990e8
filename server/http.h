// http: the HTTP/1.1 front end — a gate thread that accepts connections,
// holds each to the connection limits and checks its first request head
// (server/http_head.h) so that every refusal is JSON, then libmicrohttpd's
// epoll thread pool: routing, API-key auth, request bodies, and responses
// that wait (deferred or streamed) without holding a thread, resumed by
// whoever produces them.
#ifndef MOESERVE_SERVER_HTTP_H
#define MOESERVE_SERVER_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/openai.h"
#include "base/buf.h"
#include "server/cors.h"

struct http_server;
struct http_request; // one HTTP request, valid from its handler until it completes
struct http_async;   // a response that waits: deferred (one body later) or streamed

// A route's handler runs once per request: a GET's on the HTTP thread, a
// POST's on a request worker when http_opts.workers > 0 (the connection
// waits, suspended). Either way it answers with http_respond*, or starts a
// response that waits (http_defer, http_stream), before it returns.
struct http_route {
    const char *method;          // "GET", "POST"
    const char *path;            // exact, or with prefix a path prefix ("/v1/models/")
    bool public_;                // no API key needed (/health, /metrics)
    void (*handle)(void *app, struct http_request *r);
    // The body of every error on this route, the HTTP layer's own (401,
    // 413, 415...) and the handler's http_respond_error: a new reference, or
    // NULL when out of memory. NULL: OpenAI's envelope (oa_error_json).
    json_t *(*error_json)(const struct oa_error *e);
    bool prefix;                 // path matches every longer path that starts with it
};
// An API key comes as 'Authorization: Bearer KEY' or (Anthropic's clients)
// 'x-api-key: KEY'.
// Every body is JSON: a request with a body must say Content-Type:
// application/json (or application/...+json) or gets 415, so that a web page
// cannot drive a local server with a form or text/plain post (those need no
// CORS preflight).

// Every limit below is what one client, hostile or careless, can hold of the
// server; 0 means no limit (the server's flags choose the defaults).
struct http_opts {
    const char *host;            // "127.0.0.1"; a name or an IPv6 literal works too
    int port;                    // 0: any free port (http_port says which)
    bool reuse_port;             // SO_REUSEPORT: share the port with other servers on purpose;
                                 // otherwise a port in use is an error
    int threads;                 // the epoll thread pool (>= 1)
    int workers;                 // threads that run POST handlers (parse, template, tokenize),
                                 // so that a slow one never stalls the streams an HTTP thread
                                 // writes; 0: handlers run on the HTTP threads
    size_t max_body;             // 413 beyond
    const char *const *api_keys; // (n_api_keys, each non-empty) any one is accepted; none: no auth
    int n_api_keys;
    double keepalive_s;          // an SSE comment after this long without stream output (0: never)
    unsigned idle_timeout_s;     // a connection with no traffic for this long is closed (0: never);
                                 // a response that waits (deferred, or a stream with nothing to
                                 // send) is not idle
    double header_timeout_s;     // a request's headers must be in within this long of the
                                 // connection's start (slowloris); after a response, within
                                 // the longer of this and idle_timeout_s
    double body_timeout_s;       // and its body within this long of its headers
    unsigned max_connections;    // at once, all clients together (beyond: 503 and closed)
    unsigned max_connections_per_client; // at once from one address, or one IPv6 /64
                                         // (beyond: 503 and closed)
    size_t max_buffered_bytes;   // request bodies held in memory, all connections together (503)
    size_t max_buffered_bytes_per_client; // the same for one address (503)
    // Host header names (no port; case-insensitive) requests may carry, to
    // refuse DNS rebinding; NULL or none: any Host.
    const char *const *allowed_hosts;
    int n_allowed_hosts;
    // CORS (server/cors.h), or NULL: no CORS headers, no preflight answers.
    // Must outlive the server.
    const struct cors *cors;
    bool no_access_log;          // no log line per request (--disable-uvicorn-access-log)
    // A path prefix a reverse proxy keeps (vLLM's --root-path): "/api" serves
    // "/api/v1/models" as "/v1/models" (paths without it are served too).
    const char *root_path;
    const struct http_route *routes;
    int n_routes;
    void *app;                   // passed to the handlers
};

// Binds and listens (exclusively unless reuse_port: a port another server
// listens on is MS_EBUSY, "port N is in use"), then serves on o->threads
// threads. o and what it points to (routes, allowed_hosts, api_keys) are
// copied or must outlive the server.
int http_start(const struct http_opts *o, struct http_server **out, char *err, size_t errlen);
int http_port(const struct http_server *s);
// Streams and deferred responses still open.
int http_open_async(struct http_server *s);
// Ends what is still open (streams cut, deferred ones answered 503), waits up
// to timeout_s for them to complete and for the requests still coming on
// kept-alive connections to be answered (until none has been in flight for
// 0.1 s), then stops the daemon and frees s.
void http_stop(struct http_server *s, double timeout_s);

// ---- inside a handler (on an HTTP thread or a request worker) ----
const char *http_method(const struct http_request *r);
const char *http_path(const struct http_request *r);   // without the root path
// What a prefix route's path leaves of the request's ("/v1/models/" on
// "/v1/models/tiny" leaves "tiny"); "" for exact routes.
const char *http_path_rest(const struct http_request *r);
const char *http_header(const struct http_request *r, const char *name); // or NULL
// NUL-terminated; valid during the handler call only (the HTTP layer frees
// the body when the handler returns, so a long response does not hold it).
const char *http_body(const struct http_request *r, size_t *len);
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
