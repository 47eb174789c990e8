// cors: Cross-Origin Resource Sharing, so that a browser UI served from
// another origin can call the server directly — which origins, methods and
// headers may (--allowed-origins, --allowed-methods, --allowed-headers,
// --allow-credentials, vLLM's names), the answer to an OPTIONS preflight, and
// the headers every response to an allowed origin carries. Off unless
// origins are given: then no CORS header is ever sent and OPTIONS is not
// answered as a preflight, so browsers keep other origins out. Pure
// decisions on strings: http.c reads the request's headers and writes these.
#ifndef MOESERVE_SERVER_CORS_H
#define MOESERVE_SERVER_CORS_H

#include <stdbool.h>
#include <stddef.h>

// Each list as vLLM takes it (a JSON array of strings, '["*"]') or as a
// comma-separated list ("http://a.example,http://b.example"); "*" allows any.
struct cors_opts {
    const char *origins;         // NULL: CORS off
    const char *methods;         // NULL: "*" (GET, POST, OPTIONS, HEAD here)
    const char *headers;         // NULL: "*"
    bool credentials;            // Access-Control-Allow-Credentials: true
};

struct cors;

// *out is NULL (and 0 returned) when o->origins is NULL. A list that parses
// as neither form, or holds an empty entry, is MS_EINVAL with a sentence
// naming the flag. The caller destroys it after the HTTP server has stopped.
int cors_create(const struct cors_opts *o, struct cors **out, char *err, size_t errlen);
void cors_destroy(struct cors *c); // NULL is fine

#define CORS_MAX_HEADERS 6
struct cors_headers {
    int n;
    struct {
        const char *name;        // static
        char value[512];
    } h[CORS_MAX_HEADERS];
};

// The headers a response to a request with this Origin carries (none when
// c is NULL, origin is NULL or the origin is not allowed).
void cors_response_headers(const struct cors *c, const char *origin, struct cors_headers *out);

// A preflight (OPTIONS with Origin and Access-Control-Request-Method; the
// request headers as sent, or NULL): 204 with its headers in *out, or 403
// (origin not allowed) / 400 (method or header not allowed) with a sentence
// in msg. c must not be NULL.
int cors_preflight(const struct cors *c, const char *origin, const char *method,
                   const char *request_headers, struct cors_headers *out, char *msg, size_t msglen);

#endif
