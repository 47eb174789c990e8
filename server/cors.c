// cors: the allowed lists and the CORS decisions (see cors.h).
#include "server/cors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

#define CORS_MAX_ITEMS 64

struct list {
    bool any;                    // "*"
    int n;
    char *items[CORS_MAX_ITEMS];
};

struct cors {
    struct list origins, methods, headers;
    bool credentials;
};

static void list_free(struct list *l)
{
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    l->n = 0;
}

static int list_add(struct list *l, const char *s, size_t n, const char *flag, char *err,
                    size_t errlen)
{
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (!n) return ms_err(err, errlen, MS_EINVAL, "%s has an empty entry", flag);
    if (n == 1 && *s == '*') {
        l->any = true;
        return 0;
    }
    if (l->n == CORS_MAX_ITEMS) return ms_err(err, errlen, MS_EINVAL, "%s takes at most %d entries", flag, CORS_MAX_ITEMS);
    if (!(l->items[l->n] = strndup(s, n))) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    l->n++;
    return 0;
}

// '["a", "b"]' (vLLM's JSON form) or "a,b".
static int list_parse(struct list *l, const char *text, const char *flag, char *err, size_t errlen)
{
    if (!text) {
        l->any = true;
        return 0;
    }
    const char *p = text;
    while (*p == ' ') p++;
    if (*p == '[') {
        json_error_t je;
        json_t *a = json_loads(text, 0, &je);
        if (!json_is_array(a)) {
            json_decref(a);
            return ms_err(err, errlen, MS_EINVAL, "%s must be a JSON list of strings or a comma-"
                          "separated list, not \"%.80s\"", flag, text);
        }
        size_t i;
        json_t *x;
        int rc = 0;
        json_array_foreach(a, i, x) {
            if (!json_is_string(x))
                rc = ms_err(err, errlen, MS_EINVAL, "%s: entry %zu is not a string", flag, i);
            if (!rc) rc = list_add(l, json_string_value(x), json_string_length(x), flag, err, errlen);
            if (rc) break;
        }
        json_decref(a);
        return rc;
    }
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        int rc = list_add(l, p, n, flag, err, errlen);
        if (rc || !comma) return rc;
        p = comma + 1;
    }
}

int cors_create(const struct cors_opts *o, struct cors **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->origins) {
        // CORS is off without origins (vLLM's default is any): the others
        // would do nothing, which a command line copied from vLLM should hear.
        if (o->methods || o->headers || o->credentials)
            ms_log(MS_LOG_WARN, "--allowed-methods, --allowed-headers and --allow-credentials do "
                   "nothing without --allowed-origins: CORS stays off (give the origins, '*' for any)");
        return 0;
    }
    struct cors *c = calloc(1, sizeof *c);
    if (!c) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    int rc = list_parse(&c->origins, o->origins, "--allowed-origins", err, errlen);
    if (!rc) rc = list_parse(&c->methods, o->methods, "--allowed-methods", err, errlen);
    if (!rc) rc = list_parse(&c->headers, o->headers, "--allowed-headers", err, errlen);
    if (!rc && !c->origins.any && !c->origins.n)
        rc = ms_err(err, errlen, MS_EINVAL, "--allowed-origins names no origin");
    if (rc) {
        cors_destroy(c);
        return rc;
    }
    // Any origin with credentials would let every site a visitor opens act
    // with the visitor's cookies or client certificate here: credentials
    // go only to origins named one by one.
    c->credentials = o->credentials && !c->origins.any;
    if (o->credentials && c->origins.any)
        ms_log(MS_LOG_WARN, "--allow-credentials with --allowed-origins '*': credentials are allowed to "
               "no origin (any site could use a visitor's); name the origins that may have them");
    *out = c;
    return 0;
}

void cors_destroy(struct cors *c)
{
    if (!c) return;
    list_free(&c->origins);
    list_free(&c->methods);
    list_free(&c->headers);
    free(c);
}

static bool list_has(const struct list *l, const char *s, size_t n, bool nocase)
{
    if (l->any) return true;
    for (int i = 0; i < l->n; i++)
        if (strlen(l->items[i]) == n &&
            (nocase ? !strncasecmp(l->items[i], s, n) : !strncmp(l->items[i], s, n)))
            return true;
    return false;
}

static void put(struct cors_headers *h, const char *name, const char *value)
{
    if (h->n == CORS_MAX_HEADERS) return;
    h->h[h->n].name = name;
    snprintf(h->h[h->n].value, sizeof h->h[0].value, "%s", value);
    h->n++;
}

// "null" (sandboxed frames, file: pages, redirects) is no origin that "*"
// stands for: it is allowed only listed by name.
static bool origin_allowed(const struct cors *c, const char *origin)
{
    if (c->origins.any && !strcmp(origin, "null")) {
        for (int i = 0; i < c->origins.n; i++)
            if (!strcmp(c->origins.items[i], "null")) return true;
        return false;
    }
    return list_has(&c->origins, origin, strlen(origin), false);
}

// Allow-Origin: "*" for any origin without credentials (a response any
// cache may share); the origin itself otherwise, with Vary: Origin.
static void allow_origin(const struct cors *c, const char *origin, struct cors_headers *out)
{
    if (c->origins.any && !c->credentials) {
        put(out, "Access-Control-Allow-Origin", "*");
    } else {
        put(out, "Access-Control-Allow-Origin", origin);
        put(out, "Vary", "Origin");
    }
    if (c->credentials) put(out, "Access-Control-Allow-Credentials", "true");
}

void cors_response_headers(const struct cors *c, const char *origin, struct cors_headers *out)
{
    out->n = 0;
    if (!c || !origin || !origin_allowed(c, origin)) return;
    allow_origin(c, origin, out);
}

// Each name of a comma-separated header list must be allowed.
static bool headers_allowed(const struct cors *c, const char *list, char *bad, size_t badlen)
{
    if (!list || c->headers.any) return true;
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, ", ");
        if (n && !list_has(&c->headers, p, n, true)) {
            snprintf(bad, badlen, "%.*s", (int)(n < 100 ? n : 100), p);
            return false;
        }
        p += n;
    }
    return true;
}

int cors_preflight(const struct cors *c, const char *origin, const char *method,
                   const char *request_headers, struct cors_headers *out, char *msg, size_t msglen)
{
    out->n = 0;
    if (!origin_allowed(c, origin)) {
        snprintf(msg, msglen, "the origin '%.200s' may not call this server from a browser "
                 "(--allowed-origins)", origin);
        return 403;
    }
    if (!list_has(&c->methods, method, strlen(method), false)) {
        snprintf(msg, msglen, "CORS: method %.40s is not allowed (--allowed-methods)", method);
        return 400;
    }
    char bad[128];
    if (!headers_allowed(c, request_headers, bad, sizeof bad)) {
        snprintf(msg, msglen, "CORS: header '%s' is not allowed (--allowed-headers)", bad);
        return 400;
    }
    allow_origin(c, origin, out);
    // With "*" the request's own method and headers are repeated: a literal
    // "*" means nothing to browsers when credentials are allowed.
    char joined[512] = "";
    size_t at = 0;
    for (int i = 0; i < c->methods.n && at < sizeof joined; i++)
        at += (size_t)snprintf(joined + at, sizeof joined - at, "%s%s", i ? ", " : "", c->methods.items[i]);
    put(out, "Access-Control-Allow-Methods", c->methods.any ? method : joined);
    if (request_headers && *request_headers) {
        at = 0;
        joined[0] = 0;
        for (int i = 0; i < c->headers.n && at < sizeof joined; i++)
            at += (size_t)snprintf(joined + at, sizeof joined - at, "%s%s", i ? ", " : "",
                                   c->headers.items[i]);
        put(out, "Access-Control-Allow-Headers", c->headers.any ? request_headers : joined);
    }
    put(out, "Access-Control-Max-Age", "600");
    return 204;
}
