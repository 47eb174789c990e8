// http: libmicrohttpd glue. Routing, auth and bodies in the access handler;
// deferred and streamed responses suspend their connection and are resumed
// by http_async_wake; a watcher thread notices clients that hang up while
// suspended (MHD does not) and keeps idle streams alive with SSE comments.
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

#define MAX_EXTRA_HEADERS 4
#define STREAM_BLOCK 16384

struct http_server {
    struct MHD_Daemon *d;
    struct http_opts o;
    char *api_key;
    int port;
    int epfd, evfd;
    pthread_t watcher;
    bool watcher_started;
    atomic_bool quit;
    atomic_bool stopping;
    pthread_mutex_t mu;          // guards the list of open asyncs
    struct http_async *head;
    int n_open;
    uint64_t next_id;
};

struct http_request {
    struct http_server *s;
    struct MHD_Connection *c;
    const struct http_route *route;
    char method[16];
    char *path;
    char peer[64];
    struct ms_buf body;          // capped at max_body
    bool too_large, responded, dispatched;
    int status;
    double t0;
    int prompt_tokens, completion_tokens;
    int n_hdr;
    struct {
        char name[40];
        char value[160];
    } hdr[MAX_EXTRA_HEADERS];
    struct http_async *async;    // the connection's reference
};

struct http_async {
    struct http_server *s;
    struct MHD_Connection *c;
    const struct http_async_ops *ops;
    void *ctx;
    bool streaming;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending;                // woken since the last fill/ready
    bool suspended;              // we suspended the connection and nobody resumed it yet
    bool closed;                 // the request completed
    bool complete;               // fill said the stream is complete
    bool gone_sent;
    bool gone_seen;              // the watcher saw the hang-up
    int in_gone;                 // gone() calls running on the watcher
    bool keepalive_due;
    double last_out;
    struct ms_buf out;           // streams: bytes not yet handed to MHD (connection thread only)
    size_t off;
    // watcher registration (under s->mu)
    uint64_t id;
    int fd;
    bool listed, watched;
    struct http_async *prev, *next;
    atomic_int log_prompt, log_completion;
};

// ---- asyncs ----------------------------------------------------------------------------

static void async_unlist(struct http_server *s, struct http_async *a)
{
    pthread_mutex_lock(&s->mu);
    if (a->watched) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, a->fd, NULL);
        a->watched = false;
    }
    if (a->listed) {
        if (a->prev) a->prev->next = a->next;
        else s->head = a->next;
        if (a->next) a->next->prev = a->prev;
        a->listed = false;
        s->n_open--;
    }
    pthread_mutex_unlock(&s->mu);
}

void http_async_unref(struct http_async *a)
{
    if (!a) return;
    if (atomic_fetch_sub(&a->refs, 1) != 1) return;
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    ms_buf_free(&a->out);
    free(a);
}

void http_async_wake(struct http_async *a)
{
    pthread_mutex_lock(&a->mu);
    a->pending = true;
    bool resume = a->suspended && !a->closed;
    if (resume) a->suspended = false;
    pthread_mutex_unlock(&a->mu);
    // Outside our lock: MHD takes its own, and only we resume what we suspended.
    if (resume) MHD_resume_connection(a->c);
}

void http_async_set_log_tokens(struct http_async *a, int prompt, int completion)
{
    atomic_store(&a->log_prompt, prompt);
    atomic_store(&a->log_completion, completion);
}

// From the watcher: the peer hung up while we were waiting.
static void async_notify_gone(struct http_async *a)
{
    pthread_mutex_lock(&a->mu);
    // A response already complete has nothing left to cancel: the client
    // just closed after reading it.
    if (a->gone_sent || a->closed || a->complete) {
        pthread_mutex_unlock(&a->mu);
        return;
    }
    a->gone_sent = true;
    a->gone_seen = true;
    a->in_gone++;
    pthread_mutex_unlock(&a->mu);
    a->ops->gone(a->ctx);
    pthread_mutex_lock(&a->mu);
    a->in_gone--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static struct http_async *async_new(struct http_request *r, const struct http_async_ops *ops,
                                    void *ctx, bool streaming)
{
    struct http_server *s = r->s;
    if (r->async || r->responded) return NULL;
    struct http_async *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->s = s;
    a->c = r->c;
    a->ops = ops;
    a->ctx = ctx;
    a->streaming = streaming;
    atomic_init(&a->refs, 2);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->last_out = ms_now();
    a->fd = -1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&s->mu);
    a->id = ++s->next_id;
    a->next = s->head;
    if (s->head) s->head->prev = a;
    s->head = a;
    a->listed = true;
    s->n_open++;
    if (ci) {
        a->fd = ci->connect_fd;
        // Only hang-ups: EPOLLRDHUP (peer closed) plus the implicit HUP/ERR.
        struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = a->id};
        a->watched = epoll_ctl(s->epfd, EPOLL_CTL_ADD, a->fd, &ev) == 0;
    }
    pthread_mutex_unlock(&s->mu);
    r->async = a;
    return a;
}

// ---- responses ---------------------------------------------------------------------------

static void add_headers(struct http_request *r, struct MHD_Response *resp)
{
    for (int i = 0; i < r->n_hdr; i++) MHD_add_response_header(resp, r->hdr[i].name, r->hdr[i].value);
    r->n_hdr = 0;
}

int http_respond(struct http_request *r, int status, const char *content_type, const char *body,
                 size_t len)
{
    if (r->responded) return -1;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!resp) return -1;
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    add_headers(r, resp);
    enum MHD_Result ok = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ok != MHD_YES) return -1;
    r->responded = true;
    r->status = status;
    return 0;
}

int http_respond_json(struct http_request *r, int status, json_t *j)
{
    if (!j) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        return http_respond(r, 500, "application/json", oom, sizeof oom - 1);
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!s) return http_respond_json(r, status, NULL);
    int rc = http_respond(r, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

int http_respond_error(struct http_request *r, const struct oa_error *e)
{
    return http_respond_json(r, e->http, oa_error_json(e));
}

static void respond_simple_error(struct http_request *r, int http, const char *code,
                                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void respond_simple_error(struct http_request *r, int http, const char *code,
                                 const char *fmt, ...)
{
    struct oa_error e;
    memset(&e, 0, sizeof e);
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof e.message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    oa_error_http(&e, http, code, NULL, "%s", msg);
    http_respond_error(r, &e);
}

void http_add_header(struct http_request *r, const char *name, const char *value)
{
    if (r->n_hdr >= MAX_EXTRA_HEADERS) return;
    snprintf(r->hdr[r->n_hdr].name, sizeof r->hdr[0].name, "%s", name);
    snprintf(r->hdr[r->n_hdr].value, sizeof r->hdr[0].value, "%s", value);
    r->n_hdr++;
}

void http_set_log_tokens(struct http_request *r, int prompt, int completion)
{
    r->prompt_tokens = prompt;
    r->completion_tokens = completion;
}

const char *http_method(const struct http_request *r) { return r->method; }
const char *http_path(const struct http_request *r) { return r->path; }

const char *http_header(const struct http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, name);
}

const char *http_body(const struct http_request *r, size_t *len)
{
    if (len) *len = r->body.len;
    return r->body.data ? r->body.data : "";
}

// ---- streams -------------------------------------------------------------------------------

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct http_async *a = cls;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        if (a->off < a->out.len) {
            size_t n = a->out.len - a->off;
            if (n > max) n = max;
            memcpy(buf, a->out.data + a->off, n);
            a->off += n;
            if (a->off == a->out.len) {
                a->off = 0;
                ms_buf_reset(&a->out);
            }
            a->last_out = ms_now();
            pthread_mutex_unlock(&a->mu);
            return (ssize_t)n;
        }
        if (a->complete) {
            pthread_mutex_unlock(&a->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (a->closed) {
            pthread_mutex_unlock(&a->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (a->pending) {
            a->pending = false;
            pthread_mutex_unlock(&a->mu);
            // out is touched only on this connection's thread, so fill runs unlocked.
            bool done = a->ops->fill(a->ctx, &a->out);
            pthread_mutex_lock(&a->mu);
            if (done) a->complete = true;
            continue;
        }
        if (a->keepalive_due) {
            a->keepalive_due = false;
            static const char comment[] = ": keep-alive\n\n";
            if (ms_buf_append(&a->out, comment, sizeof comment - 1) == 0) continue;
        }
        if (atomic_load(&a->s->stopping)) {
            pthread_mutex_unlock(&a->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        a->suspended = true;
        MHD_suspend_connection(a->c);
        pthread_mutex_unlock(&a->mu);
        return 0;
    }
}

static void stream_free(void *cls)
{
    http_async_unref(cls);
}

struct http_async *http_defer(struct http_request *r, const struct http_async_ops *ops, void *ctx)
{
    return async_new(r, ops, ctx, false);
}

struct http_async *http_stream(struct http_request *r, int status, const char *content_type,
                               const struct http_async_ops *ops, void *ctx)
{
    struct http_async *a = async_new(r, ops, ctx, true);
    if (!a) return NULL;
    a->pending = true; // the first read fills
    atomic_fetch_add(&a->refs, 1); // the response's
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_reader, a, stream_free);
    if (!resp) {
        atomic_fetch_sub(&a->refs, 1);
        // The connection's reference goes at completion, with release.
        return a;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no"); // nginx: do not buffer SSE
    add_headers(r, resp);
    if (MHD_queue_response(r->c, (unsigned)status, resp) == MHD_YES) {
        r->responded = true;
        r->status = status;
    }
    MHD_destroy_response(resp);
    return a;
}

// ---- the access handler -------------------------------------------------------------------

static bool key_matches(const char *have, const char *want)
{
    // Constant time in the key's length, so timing does not leak a prefix.
    size_t hl = strlen(have), wl = strlen(want);
    unsigned diff = (unsigned)(hl ^ wl);
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < hl ? have[i] : 0);
    return diff == 0;
}

static bool authorized(struct http_request *r)
{
    const char *key = r->s->api_key;
    if (!key || r->route->public_) return true;
    const char *h = http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    return key_matches(h, key);
}

static const struct http_route *find_route(struct http_server *s, const char *method,
                                           const char *path, bool *path_known, char *allow,
                                           size_t allow_len)
{
    *path_known = false;
    allow[0] = 0;
    const char *m = strcmp(method, "HEAD") ? method : "GET";
    const struct http_route *hit = NULL;
    for (int i = 0; i < s->o.n_routes; i++) {
        const struct http_route *rt = &s->o.routes[i];
        if (strcmp(rt->path, path)) continue;
        *path_known = true;
        size_t al = strlen(allow);
        snprintf(allow + al, allow_len - al, "%s%s", al ? ", " : "", rt->method);
        if (!strcmp(rt->method, m)) hit = rt;
    }
    return hit;
}

static enum MHD_Result wait_deferred(struct http_request *r)
{
    struct http_async *a = r->async;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        if (a->pending) {
            a->pending = false;
            pthread_mutex_unlock(&a->mu);
            a->ops->ready(a->ctx, r);
            if (r->responded) {
                pthread_mutex_lock(&a->mu);
                a->complete = true;
                pthread_mutex_unlock(&a->mu);
                return MHD_YES;
            }
            continue;
        }
        if (atomic_load(&r->s->stopping)) {
            pthread_mutex_unlock(&a->mu);
            respond_simple_error(r, 503, "service_unavailable", "the server is shutting down");
            return MHD_YES;
        }
        a->suspended = true;
        MHD_suspend_connection(r->c);
        pthread_mutex_unlock(&a->mu);
        return MHD_YES;
    }
}

static enum MHD_Result first_call(struct http_server *s, struct MHD_Connection *c, const char *url,
                                  const char *method, void **con_cls)
{
    struct http_request *r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->s = s;
    r->c = c;
    r->t0 = ms_now();
    snprintf(r->method, sizeof r->method, "%s", method);
    r->path = strdup(url);
    if (!r->path) {
        free(r);
        return MHD_NO;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, r->peer,
                      sizeof r->peer);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                      r->peer, sizeof r->peer);
    }
    *con_cls = r;

    bool known;
    char allow[128];
    r->route = find_route(s, method, url, &known, allow, sizeof allow);
    if (!r->route) {
        if (known) {
            http_add_header(r, "Allow", allow);
            respond_simple_error(r, 405, "method_not_allowed", "%s is not allowed on %s; use %s",
                                 method, url, allow);
        } else {
            respond_simple_error(r, 404, "not_found", "no such endpoint: %s %s", method, url);
        }
        return MHD_YES;
    }
    if (!authorized(r)) {
        http_add_header(r, "WWW-Authenticate", "Bearer");
        respond_simple_error(r, 401, "invalid_api_key",
                             "missing or wrong API key: send the header 'Authorization: Bearer "
                             "<key>' with the key the server was started with");
        return MHD_YES;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (!errno && end != cl && n > s->o.max_body) {
            respond_simple_error(r, 413, "request_too_large",
                                 "the request body is %llu bytes; this server takes at most %zu "
                                 "(--max-request-body)",
                                 n, s->o.max_body);
            return MHD_YES;
        }
    }
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    (void)version;
    struct http_server *s = cls;
    struct http_request *r = *con_cls;
    if (!r) return first_call(s, c, url, method, con_cls);
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->responded || r->too_large) return MHD_YES; // discarded
        // The buffer's cap is max_body; 0 would mean no cap, but here it means no body.
        r->body.max = s->o.max_body;
        int rc = s->o.max_body ? ms_buf_append(&r->body, upload_data, n) : MS_ETOOLONG;
        if (rc == MS_ETOOLONG) {
            r->too_large = true;
            ms_buf_free(&r->body);
            return MHD_YES;
        }
        return rc ? MHD_NO : MHD_YES;
    }
    if (r->responded) return MHD_YES;
    if (r->too_large) {
        respond_simple_error(r, 413, "request_too_large",
                             "the request body is over %zu bytes (--max-request-body)", s->o.max_body);
        return MHD_YES;
    }
    if (r->async) return wait_deferred(r);
    if (!r->dispatched) {
        r->dispatched = true;
        if (atomic_load(&s->stopping) && !r->route->public_) {
            http_add_header(r, "Retry-After", "5");
            respond_simple_error(r, 503, "service_unavailable", "the server is shutting down");
            return MHD_YES;
        }
        r->route->handle(s->o.app, r);
        if (r->responded) return MHD_YES;
        if (r->async && !r->async->streaming) return wait_deferred(r);
        if (r->async) return MHD_NO; // a stream that could not be queued
    }
    respond_simple_error(r, 500, "internal_error", "the handler for %s %s gave no answer", r->method,
                         r->path);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)c;
    struct http_server *s = cls;
    struct http_request *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    struct http_async *a = r->async;
    bool gone_seen = false;
    if (a) {
        async_unlist(s, a);
        pthread_mutex_lock(&a->mu);
        a->closed = true;
        bool need_gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !a->gone_sent && !a->complete;
        a->gone_sent = true;
        while (a->in_gone) pthread_cond_wait(&a->cv, &a->mu);
        gone_seen = a->gone_seen;
        pthread_mutex_unlock(&a->mu);
        if (need_gone) a->ops->gone(a->ctx);
        // Streams report their counts through the async; deferred ones may
        // have set them on the request already.
        if (atomic_load(&a->log_prompt) || atomic_load(&a->log_completion)) {
            r->prompt_tokens = atomic_load(&a->log_prompt);
            r->completion_tokens = atomic_load(&a->log_completion);
        }
        a->ops->release(a->ctx);
        http_async_unref(a);
    }
    const char *how = "";
    if (gone_seen || toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT ||
        toe == MHD_REQUEST_TERMINATED_READ_ERROR)
        how = " (client gone)";
    else if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) how = " (timeout)";
    else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) how = " (aborted)";
    ms_log(MS_LOG_INFO, "%s %s %s %d prompt_tokens=%d completion_tokens=%d %.3fs%s",
           r->peer[0] ? r->peer : "-", r->method, r->path, r->status, r->prompt_tokens,
           r->completion_tokens, ms_now() - r->t0, how);
    ms_buf_free(&r->body);
    free(r->path);
    free(r);
}

// ---- the watcher ------------------------------------------------------------------------------

static struct http_async *take_by_id(struct http_server *s, uint64_t id)
{
    struct http_async *hit = NULL;
    pthread_mutex_lock(&s->mu);
    for (struct http_async *a = s->head; a; a = a->next)
        if (a->id == id) {
            if (a->watched) {
                epoll_ctl(s->epfd, EPOLL_CTL_DEL, a->fd, NULL);
                a->watched = false;
            }
            atomic_fetch_add(&a->refs, 1);
            hit = a;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return hit;
}

static void keepalive_scan(struct http_server *s)
{
    double now = ms_now();
    pthread_mutex_lock(&s->mu);
    int cap = s->n_open;
    struct http_async **due = cap ? malloc((size_t)cap * sizeof *due) : NULL;
    int n = 0;
    for (struct http_async *a = s->head; a && due && n < cap; a = a->next) {
        if (!a->streaming) continue;
        pthread_mutex_lock(&a->mu);
        bool idle = !a->closed && !a->complete && !a->keepalive_due &&
                    now - a->last_out >= s->o.keepalive_s;
        if (idle) a->keepalive_due = true;
        pthread_mutex_unlock(&a->mu);
        if (idle) {
            atomic_fetch_add(&a->refs, 1);
            due[n++] = a;
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        // keepalive_due alone must not count as output: the reader adds the comment.
        pthread_mutex_lock(&due[i]->mu);
        bool resume = due[i]->suspended && !due[i]->closed;
        if (resume) due[i]->suspended = false;
        pthread_mutex_unlock(&due[i]->mu);
        if (resume) MHD_resume_connection(due[i]->c);
        http_async_unref(due[i]);
    }
    free(due);
}

static void *watcher_main(void *arg)
{
    struct http_server *s = arg;
    pthread_setname_np(pthread_self(), "http-watcher");
    struct epoll_event ev[64];
    double last_scan = ms_now();
    int tick_ms = 1000;
    if (s->o.keepalive_s > 0) {
        tick_ms = (int)(s->o.keepalive_s * 250);
        if (tick_ms < 20) tick_ms = 20;
        if (tick_ms > 1000) tick_ms = 1000;
    }
    while (!atomic_load(&s->quit)) {
        int n = epoll_wait(s->epfd, ev, 64, tick_ms);
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0) { // the stop signal
                uint64_t v;
                ssize_t rd = read(s->evfd, &v, sizeof v);
                (void)rd;
                continue;
            }
            struct http_async *a = take_by_id(s, ev[i].data.u64);
            if (!a) continue;
            async_notify_gone(a);
            http_async_wake(a);
            http_async_unref(a);
        }
        if (s->o.keepalive_s > 0 && ms_now() - last_scan >= tick_ms / 1000.0) {
            last_scan = ms_now();
            keepalive_scan(s);
        }
    }
    return NULL;
}

// ---- start and stop ------------------------------------------------------------------------------

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    ms_log(MS_LOG_DEBUG, "libmicrohttpd: %s", buf);
}

int http_start(const struct http_opts *o, struct http_server **out, char *err, size_t errlen)
{
    *out = NULL;
    if (o->port < 0 || o->port > 65535)
        return ms_err(err, errlen, MS_EINVAL, "--port must be 0 to 65535, got %d", o->port);
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return ms_err(err, errlen, MS_ENOMEM, "out of memory starting the HTTP server");
    s->o = *o;
    if (s->o.threads < 1) s->o.threads = 1;
    if (o->api_key && o->api_key[0]) {
        s->api_key = strdup(o->api_key);
        if (!s->api_key) {
            free(s);
            return ms_err(err, errlen, MS_ENOMEM, "out of memory");
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = 0;
    if (s->epfd < 0 || s->evfd < 0) {
        rc = ms_err(err, errlen, MS_EIO, "epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->evfd, &ev);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host && o->host[0] ? o->host : NULL, port, &hints, &ai);
    if (gai || !ai) {
        rc = ms_err(err, errlen, MS_EINVAL, "--host %s: %s", o->host ? o->host : "(any)",
                    gai ? gai_strerror(gai) : "no address");
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct sockaddr_storage ss;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    unsigned limit = o->max_connections ? o->max_connections : 4096;
    s->d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_access, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, (void *)NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->o.threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, limit,
        MHD_OPTION_CONNECTION_TIMEOUT, o->connection_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
        MHD_OPTION_END);
    if (!s->d) {
        rc = ms_err(err, errlen, MS_EIO,
                    "cannot listen on %s port %d (in use, or not an address of this machine?)",
                    o->host ? o->host : "*", o->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    if (pthread_create(&s->watcher, NULL, watcher_main, s)) {
        rc = ms_err(err, errlen, MS_EIO, "cannot start the HTTP watcher thread");
        goto fail;
    }
    s->watcher_started = true;
    *out = s;
    return 0;
fail:
    if (s->d) MHD_stop_daemon(s->d);
    if (s->epfd >= 0) close(s->epfd);
    if (s->evfd >= 0) close(s->evfd);
    pthread_mutex_destroy(&s->mu);
    free(s->api_key);
    free(s);
    return rc;
}

int http_port(const struct http_server *s)
{
    return s->port;
}

int http_open_async(struct http_server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_open;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void wake_all(struct http_server *s)
{
    pthread_mutex_lock(&s->mu);
    int cap = s->n_open, n = 0;
    struct http_async **all = cap ? malloc((size_t)cap * sizeof *all) : NULL;
    for (struct http_async *a = s->head; a && all && n < cap; a = a->next) {
        atomic_fetch_add(&a->refs, 1);
        all[n++] = a;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        http_async_wake(all[i]);
        http_async_unref(all[i]);
    }
    free(all);
}

void http_stop(struct http_server *s, double timeout_s)
{
    if (!s) return;
    atomic_store(&s->stopping, true);
    double end = ms_now() + timeout_s;
    // MHD must not be stopped with connections suspended: wake them until they are done.
    do {
        wake_all(s);
        if (http_open_async(s) == 0) break;
        usleep(20000);
    } while (ms_now() < end);
    if (http_open_async(s))
        ms_log(MS_LOG_WARN, "http: %d responses still open at shutdown", http_open_async(s));
    MHD_stop_daemon(s->d);
    atomic_store(&s->quit, true);
    uint64_t one = 1;
    ssize_t w = write(s->evfd, &one, sizeof one);
    (void)w;
    if (s->watcher_started) pthread_join(s->watcher, NULL);
    close(s->epfd);
    close(s->evfd);
    pthread_mutex_destroy(&s->mu);
    free(s->api_key);
    free(s);
}
