// Pins the HTTP layer on loopback with libcurl and raw sockets: routing,
// 404/405/401/413 (after a body sent at once), deferred and streamed responses woken from other
// threads, hang-up detection while suspended, keep-alive comments, bodies
// sent slowly, malformed HTTP (answered in the error envelope by the front
// gate), and many concurrent streams on few threads; then what one hostile
// client can hold: the port, connections, buffered bodies (declared, or over
// the budget mid-way), slow requests, and what it can slip past (NUL paths,
// non-JSON bodies, foreign Host names, half-closes, requests on refused
// connections).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/buf.h"
#include "server/http.h"
#include "tests/server/client.h"

static atomic_int g_gone, g_released, g_echoed;
static struct http_server *g_srv;
static int g_port;

// ---- a small app over the HTTP layer ---------------------------------------------

struct tctx {
    pthread_mutex_t mu;
    int refs;
    struct http_async *a;
    struct ms_buf pending;
    bool done, gone;
    int total;
    char answer[64];
};

static struct tctx *tctx_new(void)
{
    struct tctx *t = calloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->refs = 1;
    return t;
}

static void tctx_unref(struct tctx *t)
{
    pthread_mutex_lock(&t->mu);
    int left = --t->refs;
    pthread_mutex_unlock(&t->mu);
    if (left) return;
    http_async_unref(t->a);
    ms_buf_free(&t->pending);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static bool t_fill(void *ctx, struct ms_buf *out)
{
    struct tctx *t = ctx;
    pthread_mutex_lock(&t->mu);
    if (t->pending.len) ms_buf_append(out, t->pending.data, t->pending.len);
    ms_buf_reset(&t->pending);
    bool done = t->done;
    pthread_mutex_unlock(&t->mu);
    return done;
}

static void t_ready(void *ctx, struct http_request *r)
{
    struct tctx *t = ctx;
    pthread_mutex_lock(&t->mu);
    char answer[64];
    snprintf(answer, sizeof answer, "%s", t->answer);
    pthread_mutex_unlock(&t->mu);
    if (answer[0]) http_respond(r, 200, "text/plain", answer, strlen(answer));
}

static void t_gone(void *ctx)
{
    struct tctx *t = ctx;
    pthread_mutex_lock(&t->mu);
    t->gone = true;
    // What an app does on a hang-up: stop the work and answer, so the connection ends.
    snprintf(t->answer, sizeof t->answer, "cancelled");
    t->done = true;
    struct http_async *a = t->a;
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_add(&g_gone, 1);
    if (a) http_async_wake(a);
}

static void t_release(void *ctx)
{
    atomic_fetch_add(&g_released, 1);
    tctx_unref(ctx);
}

static const struct http_async_ops t_ops = {t_fill, t_ready, t_gone, t_release};

static void h_hello(void *app, struct http_request *r)
{
    (void)app;
    http_respond(r, 200, "text/plain", "hi", 2);
}

static void h_echo(void *app, struct http_request *r)
{
    (void)app;
    atomic_fetch_add(&g_echoed, 1);
    size_t n;
    const char *b = http_body(r, &n);
    http_respond(r, 200, "application/octet-stream", b, n);
}

static void *later_thread(void *arg)
{
    struct tctx *t = arg;
    usleep(30000);
    pthread_mutex_lock(&t->mu);
    snprintf(t->answer, sizeof t->answer, "later");
    struct http_async *a = t->a;
    pthread_mutex_unlock(&t->mu);
    http_async_wake(a);
    tctx_unref(t);
    return NULL;
}

static void h_later(void *app, struct http_request *r)
{
    (void)app;
    struct tctx *t = tctx_new();
    t->refs = 2; // the HTTP side and the producer
    t->a = http_defer(r, &t_ops, t);
    pthread_t th;
    pthread_create(&th, NULL, later_thread, t);
    pthread_detach(th);
}

static void h_never(void *app, struct http_request *r)
{
    (void)app;
    struct tctx *t = tctx_new();
    t->a = http_defer(r, &t_ops, t);
}

static void *stream_thread(void *arg)
{
    struct tctx *t = arg;
    for (int i = 0; i < t->total; i++) {
        usleep(1000);
        char line[64];
        int n = snprintf(line, sizeof line, "data: %d\n\n", i);
        pthread_mutex_lock(&t->mu);
        bool gone = t->gone;
        if (!gone) ms_buf_append(&t->pending, line, (size_t)n);
        pthread_mutex_unlock(&t->mu);
        if (gone) break;
        http_async_wake(t->a);
    }
    pthread_mutex_lock(&t->mu);
    ms_buf_append(&t->pending, "data: [DONE]\n\n", 14);
    t->done = true;
    pthread_mutex_unlock(&t->mu);
    http_async_wake(t->a);
    tctx_unref(t);
    return NULL;
}

static void h_stream(void *app, struct http_request *r)
{
    (void)app;
    struct tctx *t = tctx_new();
    t->refs = 2;
    t->total = 20;
    t->a = http_stream(r, 200, "text/event-stream", &t_ops, t);
    pthread_t th;
    pthread_create(&th, NULL, stream_thread, t);
    pthread_detach(th);
}

static void h_forever(void *app, struct http_request *r)
{
    (void)app;
    struct tctx *t = tctx_new();
    t->a = http_stream(r, 200, "text/event-stream", &t_ops, t);
}

// Holds its worker until the stream test says its stream got through (or
// 10 s pass), then answers whether it did.
static atomic_int g_block_entered, g_stream_through;
static void h_block(void *app, struct http_request *r)
{
    (void)app;
    atomic_store(&g_block_entered, 1);
    for (int i = 0; i < 1000 && !atomic_load(&g_stream_through); i++) usleep(10000);
    const char *a = atomic_load(&g_stream_through) ? "streams flowed" : "streams stalled";
    http_respond(r, 200, "text/plain", a, strlen(a));
}

// A prefix route answers with what follows its path.
static void h_rest(void *app, struct http_request *r)
{
    (void)app;
    const char *rest = http_path_rest(r);
    http_respond(r, 200, "text/plain", rest, strlen(rest));
}

// An error shape of the route's own.
static json_t *shaped_error(const struct oa_error *e)
{
    return json_pack("{s:s, s:i}", "shaped", e->message, "status", e->http);
}

static const struct http_route routes[] = {
    {.method = "GET", .path = "/items/", .handle = h_rest, .prefix = true},
    {.method = "GET", .path = "/shaped", .handle = h_hello, .error_json = shaped_error},
    {.method = "POST", .path = "/block", .public_ = false, .handle = h_block},
    {.method = "GET", .path = "/hello", .public_ = false, .handle = h_hello},
    {.method = "POST", .path = "/echo", .public_ = false, .handle = h_echo},
    {.method = "GET", .path = "/later", .public_ = false, .handle = h_later},
    {.method = "GET", .path = "/never", .public_ = false, .handle = h_never},
    {.method = "GET", .path = "/stream", .public_ = false, .handle = h_stream},
    {.method = "GET", .path = "/forever", .public_ = false, .handle = h_forever},
    {.method = "GET", .path = "/open", .public_ = true, .handle = h_hello},
};

// ---- clients -------------------------------------------------------------------------

static struct resp request(const char *method, const char *path, const char *body, size_t len,
                           const char *key)
{
    struct resp r = client_request(g_port, method, path, body, len, key, NULL, 20);
    if (r.curl_code != CURLE_OK) fail_msg("%s %s: %s", method, path, curl_easy_strerror(r.curl_code));
    return r;
}

// A connection to g_port from the loopback address src (NULL: the kernel's
// choice, 127.0.0.1), so that tests can be several clients.
static int connect_from(const char *src)
{
    int fd = client_connect_from(g_port, src, 10);
    assert_true(fd >= 0);
    return fd;
}

static int connect_raw(void)
{
    return connect_from(NULL);
}

static void send_all(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        s += w;
        n -= (size_t)w;
    }
}

static void wait_counter(atomic_int *c, int want)
{
    for (int i = 0; i < 500 && atomic_load(c) < want; i++) usleep(10000);
    assert_true(atomic_load(c) >= want);
}

// The options of the suite's server; tests that need other limits start a
// second server with these changed.
static const char *const test_keys[] = {"k"};

static struct http_opts test_opts(void)
{
    struct http_opts o = {
        .host = "127.0.0.1",
        .port = 0,
        .threads = 2,
        .workers = 2,
        .max_body = 256 * 1024,
        .api_keys = test_keys,
        .n_api_keys = 1,
        .keepalive_s = 0.2,
        .idle_timeout_s = 30,
        .routes = routes,
        .n_routes = (int)(sizeof routes / sizeof routes[0]),
    };
    return o;
}

// Starts a server with o and points the clients (g_port) at it; end_other
// stops it and points them back.
static int g_main_port;
static struct http_server *start_other(const struct http_opts *o)
{
    struct http_server *s;
    char err[256];
    if (http_start(o, &s, err, sizeof err)) fail_msg("http_start: %s", err);
    g_main_port = g_port;
    g_port = http_port(s);
    return s;
}

static void end_other(struct http_server *s)
{
    http_stop(s, 5);
    g_port = g_main_port;
}

// ---- tests ----------------------------------------------------------------------------

static void routes_answer_and_unknown_paths_get_404_or_405(void **state)
{
    (void)state;
    struct resp r = request("GET", "/hello", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hi");
    free(r.body);
    r = request("GET", "/nope", NULL, 0, "k");
    assert_int_equal(r.status, 404);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(json_object_get(json_object_get(j, "error"), "message"));
    json_decref(j);
    free(r.body);
    r = request("POST", "/hello", "{}", 2, "k");
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.allow, "GET"));
    free(r.body);
    r = request("DELETE", "/echo", NULL, 0, "k");
    assert_int_equal(r.status, 405);
    free(r.body);
}

// A whole raw exchange (request text as given), the answer's head and body.
static void raw_exchange(const char *req, char *buf, size_t cap)
{
    int fd = client_connect_raw(g_port, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    client_read_until(fd, buf, cap, NULL);
    close(fd);
}

static void prefix_routes_keys_beside_bearer_and_error_shapes_per_route(void **state)
{
    (void)state;
    struct resp r = request("GET", "/items/abc", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "abc");
    free(r.body);
    r = request("GET", "/items/", NULL, 0, "k"); // a prefix route needs something after it
    assert_int_equal(r.status, 404);
    free(r.body);
    // Anthropic's clients send x-api-key.
    char buf[2048];
    raw_exchange("GET /hello HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nConnection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    raw_exchange("GET /hello HTTP/1.1\r\nHost: x\r\nx-api-key: kk\r\nConnection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 401"));
    // The HTTP layer's own refusals take the route's error shape.
    r = request("GET", "/shaped", NULL, 0, NULL);
    assert_int_equal(r.status, 401);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "status")), 401);
    assert_non_null(strstr(json_string_value(json_object_get(j, "shaped")), "x-api-key"));
    json_decref(j);
    free(r.body);
}

static void root_path_and_cors(void **state)
{
    (void)state;
    struct cors *cors;
    char err[256];
    struct cors_opts co = {.origins = "[\"http://a.example\", \"http://b.example\"]", .methods = "GET, POST",
                           .headers = "content-type,authorization"};
    assert_int_equal(cors_create(&co, &cors, err, sizeof err), 0);
    struct http_opts o = test_opts();
    o.root_path = "/api";
    o.cors = cors;
    struct http_server *s = start_other(&o);
    char buf[4096];
    // The root path is stripped; paths without it are served too; a longer word is not it.
    raw_exchange("GET /api/hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n",
                 buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    assert_null(strstr(buf, "Access-Control"));
    raw_exchange("GET /hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    raw_exchange("GET /apix/hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n",
                 buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 404"));
    // A preflight from an allowed origin: 204 with the lists, no key needed.
    raw_exchange("OPTIONS /api/echo HTTP/1.1\r\nHost: x\r\nOrigin: http://b.example\r\n"
                 "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: Content-Type\r\n"
                 "Connection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 204"));
    assert_non_null(strstr(buf, "Access-Control-Allow-Origin: http://b.example\r\n"));
    assert_non_null(strstr(buf, "Access-Control-Allow-Methods: GET, POST\r\n"));
    assert_non_null(strstr(buf, "Access-Control-Allow-Headers: content-type, authorization\r\n"));
    assert_non_null(strstr(buf, "Vary: Origin\r\n"));
    // A method, a header or an origin not on the lists.
    raw_exchange("OPTIONS /echo HTTP/1.1\r\nHost: x\r\nOrigin: http://b.example\r\n"
                 "Access-Control-Request-Method: DELETE\r\nConnection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 400"));
    raw_exchange("OPTIONS /echo HTTP/1.1\r\nHost: x\r\nOrigin: http://b.example\r\n"
                 "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: x-secret\r\n"
                 "Connection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 400"));
    assert_non_null(strstr(buf, "x-secret"));
    raw_exchange("OPTIONS /echo HTTP/1.1\r\nHost: x\r\nOrigin: http://c.example\r\n"
                 "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 403"));
    assert_null(strstr(buf, "Access-Control-Allow-Origin"));
    // Answers to an allowed origin carry its header, refusals included.
    raw_exchange("GET /hello HTTP/1.1\r\nHost: x\r\nOrigin: http://a.example\r\nConnection: close\r\n\r\n",
                 buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 401"));
    assert_non_null(strstr(buf, "Access-Control-Allow-Origin: http://a.example\r\n"));
    end_other(s);
    cors_destroy(cors);
    // "*" answers "*", also asked for credentials: those go to origins named
    // one by one (any site could otherwise act with a visitor's), and never
    // to "null" unless it is named.
    struct cors_headers h;
    co = (struct cors_opts){.origins = "*"};
    for (int cred = 0; cred < 2; cred++) {
        co.credentials = cred;
        assert_int_equal(cors_create(&co, &cors, err, sizeof err), 0);
        cors_response_headers(cors, "http://z.example", &h);
        assert_int_equal(h.n, 1);
        assert_string_equal(h.h[0].value, "*");
        cors_response_headers(cors, "null", &h);
        assert_int_equal(h.n, 0);
        char msg[256];
        assert_int_equal(cors_preflight(cors, "null", "POST", NULL, &h, msg, sizeof msg), 403);
        cors_destroy(cors);
    }
    co = (struct cors_opts){.origins = "http://z.example, null", .credentials = true};
    assert_int_equal(cors_create(&co, &cors, err, sizeof err), 0);
    cors_response_headers(cors, "http://z.example", &h);
    assert_string_equal(h.h[0].value, "http://z.example");
    assert_int_equal(h.n, 3);
    cors_response_headers(cors, "null", &h);
    assert_string_equal(h.h[0].value, "null");
    cors_destroy(cors);
    // "*" beside a named "null" lets "null" in too (it is named).
    co = (struct cors_opts){.origins = "*, null"};
    assert_int_equal(cors_create(&co, &cors, err, sizeof err), 0);
    cors_response_headers(cors, "null", &h);
    assert_int_equal(h.n, 1);
    assert_string_equal(h.h[0].value, "*");
    cors_destroy(cors);
    // No origins, no CORS; malformed lists are refused naming the flag.
    co = (struct cors_opts){0};
    assert_int_equal(cors_create(&co, &cors, err, sizeof err), 0);
    assert_null(cors);
    static const char *const bad[] = {"[\"a\",", "[1]", "a,,b", "[]", " "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        co.origins = bad[i];
        assert_int_equal(cors_create(&co, &cors, err, sizeof err), MS_EINVAL);
        assert_non_null(strstr(err, "--allowed-origins"));
    }
}

static void api_key_is_required_except_on_public_routes(void **state)
{
    (void)state;
    struct resp r = request("GET", "/hello", NULL, 0, NULL);
    assert_int_equal(r.status, 401);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "invalid_api_key");
    json_decref(j);
    free(r.body);
    r = request("GET", "/hello", NULL, 0, "wrong");
    assert_int_equal(r.status, 401);
    free(r.body);
    r = request("GET", "/hello", NULL, 0, "kk");
    assert_int_equal(r.status, 401);
    free(r.body);
    r = request("GET", "/open", NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    free(r.body);
}

// Sends head, then the whole body at once (as SDKs do, no waiting for a
// 100 Continue), then reads the answer up to its JSON's end into buf.
// Returns the bytes of the body the connection would not take (0: all sent).
static size_t send_whole_then_read(const char *head, const char *body, size_t n, char *buf, size_t cap)
{
    int fd = connect_raw();
    send_all(fd, head);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t left = n;
    for (const char *p = body; left;) {
        ssize_t w = send(fd, p, left, MSG_NOSIGNAL);
        if (w <= 0) break;
        p += w;
        left -= (size_t)w;
    }
    client_read_until(fd, buf, cap, "}}");
    close(fd);
    return left;
}

static void bodies_arrive_whole_and_oversized_ones_get_413(void **state)
{
    (void)state;
    size_t n = 100000;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
    struct resp r = request("POST", "/echo", big, n, "k");
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, n);
    assert_memory_equal(r.body, big, n);
    free(r.body);
    free(big);
    n = 300000; // over the 256 KiB limit
    big = calloc(1, n);
    memset(big, 'x', n);
    r = request("POST", "/echo", big, n, "k");
    assert_int_equal(r.status, 413);
    free(r.body);
    free(big);
    // Declared over the limit and sent at once, without waiting for a 100
    // Continue (as SDKs do): the client must be able to send it all and then
    // read the 413, every time (answered before the body was read, the close
    // reset the connection mid-send, and clients such as curl then report
    // the reset, not the answer).
    static char over[600000];
    memset(over, 'z', sizeof over);
    for (int k = 0; k < 10; k++) {
        char head[256], buf[4096];
        snprintf(head, sizeof head,
                 "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 sizeof over);
        const size_t left = send_whole_then_read(head, over, sizeof over, buf, sizeof buf);
        if (left) fail_msg("try %d: the connection was cut with %zu bytes of the body unsent", k, left);
        if (!strstr(buf, " 413 ") || !strstr(buf, "600000 bytes"))
            fail_msg("try %d: wanted the 413 in the error envelope, got: %.300s", k, buf);
    }
    // Chunked, so the size is not known up front.
    int fd = connect_raw();
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    char chunk[70000];
    memset(chunk, 'y', sizeof chunk);
    char head[32];
    for (int i = 0; i < 5; i++) {
        snprintf(head, sizeof head, "%zx\r\n", sizeof chunk);
        send_all(fd, head);
        if (send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) <= 0) break;
        send_all(fd, "\r\n");
    }
    send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL);
    char buf[4096];
    client_read_until(fd, buf, sizeof buf, "\r\n\r\n");
    assert_non_null(strstr(buf, " 413 "));
    close(fd);
}

// A POST refused from its head (no such path, a method the path does not
// take, no key, not JSON) with a body sent at once (no Expect: 100-continue,
// as SDKs send): the client can send it all and then reads the refusal,
// every time (answered before the body, the close reset the connection
// mid-send: a broken pipe where the answer should be). With Expect:
// 100-continue the refusal comes at once, before any of the body.
static void head_refusals_of_a_post_come_after_its_body(void **state)
{
    (void)state;
    static char body[600000];
    memset(body, ' ', sizeof body);
    const struct {
        const char *line, *auth, *type, *want;
    } cases[] = {
        {"POST /nope HTTP/1.1", "Authorization: Bearer k\r\n", "application/json", " 404 "},
        {"PUT /echo HTTP/1.1", "Authorization: Bearer k\r\n", "application/json", " 405 "},
        {"POST /echo HTTP/1.1", "", "application/json", " 401 "},
        {"POST /echo HTTP/1.1", "Authorization: Bearer k\r\n", "text/plain", " 415 "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int k = 0; k < 3; k++) {
            char head[512], buf[4096];
            snprintf(head, sizeof head, "%s\r\nHost: x\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                     cases[i].line, cases[i].auth, cases[i].type, sizeof body);
            const size_t left = send_whole_then_read(head, body, sizeof body, buf, sizeof buf);
            if (left) fail_msg("%s (%s): cut with %zu bytes of the body unsent", cases[i].line, cases[i].want, left);
            if (!strstr(buf, cases[i].want) || !strstr(buf, "\"error\""))
                fail_msg("%s: wanted%sin the error envelope, got: %.300s", cases[i].line, cases[i].want, buf);
        }
    int fd = connect_raw();
    char head[256];
    snprintf(head, sizeof head, "POST /nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                                "Content-Type: application/json\r\nContent-Length: %zu\r\nExpect: 100-continue\r\n\r\n",
             sizeof body);
    send_all(fd, head);
    char buf[4096];
    client_read_until(fd, buf, sizeof buf, "}}");
    close(fd);
    if (!strstr(buf, " 404 ")) fail_msg("with Expect: 100-continue: %.300s", buf);
}

static void deferred_responses_wait_without_a_thread(void **state)
{
    (void)state;
    struct resp r = request("GET", "/later", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "later");
    free(r.body);
}

static void streams_deliver_every_event_in_order(void **state)
{
    (void)state;
    struct resp r = request("GET", "/stream", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    char want[1024] = "";
    for (int i = 0; i < 20; i++) sprintf(want + strlen(want), "data: %d\n\n", i);
    strcat(want, "data: [DONE]\n\n");
    assert_string_equal(r.body, want);
    free(r.body);
}

static void hangup_while_streaming_is_noticed(void **state)
{
    (void)state;
    int before = atomic_load(&g_gone), rel = atomic_load(&g_released);
    int fd = connect_raw();
    send_all(fd, "GET /forever HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    char buf[4096];
    client_read_until(fd, buf, sizeof buf, "\r\n\r\n");
    assert_non_null(strstr(buf, " 200 "));
    close(fd);
    wait_counter(&g_gone, before + 1);
    wait_counter(&g_released, rel + 1);
}

static void hangup_while_deferred_is_noticed(void **state)
{
    (void)state;
    int before = atomic_load(&g_gone), rel = atomic_load(&g_released);
    int fd = connect_raw();
    send_all(fd, "GET /never HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    usleep(50000); // let it suspend
    close(fd);
    wait_counter(&g_gone, before + 1);
    wait_counter(&g_released, rel + 1);
}

static void idle_streams_get_keepalive_comments(void **state)
{
    (void)state;
    int fd = connect_raw();
    send_all(fd, "GET /forever HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    char buf[8192];
    client_read_until(fd, buf, sizeof buf, ": keep-alive\n\n");
    assert_non_null(strstr(buf, ": keep-alive\n\n"));
    close(fd);
}

static void slow_bodies_and_malformed_http(void **state)
{
    (void)state;
    int fd = connect_raw();
    const char *req = "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                      "Content-Type: application/json\r\nContent-Length: 11\r\n"
                      "Connection: close\r\n\r\nhello world";
    for (const char *p = req; *p; p++) {
        assert_int_equal(send(fd, p, 1, MSG_NOSIGNAL), 1);
        usleep(1000);
    }
    char buf[4096];
    client_read_until(fd, buf, sizeof buf, NULL);
    assert_non_null(strstr(buf, " 200 "));
    assert_non_null(strstr(buf, "hello world"));
    close(fd);

    // Heads MHD would answer with its own HTML page get the error envelope
    // from the gate (issue 21 item 9), each with its status.
    static char big[80 * 1024];
    memset(big, 0, sizeof big);
    strcpy(big, "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(big + strlen(big), 'a', 70 * 1024);
    strcat(big, "\r\n\r\n");
    static char many[4096]; // short, but more fields than MHD's memory holds well
    int m = snprintf(many, sizeof many, "GET /hello HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 150; i++) m += snprintf(many + m, sizeof many - (size_t)m, "a: b\r\n");
    snprintf(many + m, sizeof many - (size_t)m, "\r\n");
    const struct {
        const char *head;
        const char *status;
    } bad[] = {
        {"GARBAGE\r\n\r\n", " 400 "},
        {"GET / HTTP/9.9\r\n\r\n", " 505 "},
        {"GET /hello HTTP/2.0\r\nHost: x\r\n\r\n", " 505 "},
        {"GET /hello HTTP/1.1\r\nNo-Colon-Header\r\n\r\n", " 400 "},
        {"GET /hello HTTP/1.1\r\nAuthorization: Bearer k\r\n\r\n", " 400 "}, // no Host
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", " 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
         " 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", " 501 "},
        {"\x01\x02\x03\xff\r\n\r\n", " 400 "},
        {big, " 431 "},
        {many, " 431 "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fd = connect_raw();
        send_all(fd, bad[i].head);
        shutdown(fd, SHUT_WR);
        size_t n = client_read_until(fd, buf, sizeof buf, NULL);
        close(fd);
        if (!n || !strstr(buf, bad[i].status) || !strstr(buf, "application/json") ||
            !strstr(buf, "\"message\""))
            fail_msg("head %zu: wanted%sin the error envelope, got: %.300s", i, bad[i].status, buf);
    }
    // A malformed chunked body is past the head: MHD's page, or a close; never a 200.
    fd = connect_raw();
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    shutdown(fd, SHUT_WR);
    if (client_read_until(fd, buf, sizeof buf, NULL)) assert_null(strstr(buf, " 200 "));
    close(fd);
    // Half a request, then silence, then gone.
    fd = connect_raw();
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc");
    close(fd);
    struct resp r = request("GET", "/hello", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    free(r.body);
}

static void many_concurrent_streams_on_two_threads(void **state)
{
    (void)state;
    enum { N = 200 };
    CURL *h[N];
    struct resp rep[N];
    for (int i = 0; i < N; i++) h[i] = client_prepare(&rep[i], g_port, "GET", "/stream", NULL, 0, "k", NULL, 60);
    assert_int_equal(client_perform_all(h, N), 0);
    for (int i = 0; i < N; i++) {
        client_finish(h[i], &rep[i]);
        assert_int_equal(rep[i].status, 200);
        assert_non_null(strstr(rep[i].body, "data: 19\n\ndata: [DONE]\n\n"));
        resp_free(&rep[i]);
    }
}

// ---- what one hostile client can do (issue 21) --------------------------------------

static void a_busy_port_is_refused_unless_shared_on_purpose(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.port = g_port; // the suite's server listens there
    struct http_server *s = NULL;
    char err[256];
    assert_int_equal(http_start(&o, &s, err, sizeof err), MS_EBUSY);
    assert_null(s);
    char want[64];
    snprintf(want, sizeof want, "port %d is in use", g_port);
    assert_non_null(strstr(err, want));
    // Two that both ask to share may.
    o.port = 0;
    o.reuse_port = true;
    struct http_server *a = start_other(&o);
    o.port = g_port;
    struct http_server *b = NULL;
    assert_int_equal(http_start(&o, &b, err, sizeof err), 0);
    http_stop(b, 1);
    end_other(a);
}

// One address holding its maximum leaves room for everyone else, /health too.
static void one_address_cannot_take_every_connection(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.max_connections = 64;
    o.max_connections_per_client = 4;
    struct http_server *s = start_other(&o);
    int held[4];
    char buf[4096];
    for (int i = 0; i < 4; i++) {
        held[i] = connect_from("127.0.0.2");
        send_all(held[i], "GET /open HTTP/1.1\r\nHost: x\r\n\r\n");
        client_read_until(held[i], buf, sizeof buf, "hi");
        assert_non_null(strstr(buf, " 200 "));
    }
    // The fifth from that address is refused in the error envelope ...
    int fd = connect_from("127.0.0.2");
    size_t n = client_read_until(fd, buf, sizeof buf, NULL);
    close(fd);
    assert_true(n > 0);
    assert_non_null(strstr(buf, " 503 "));
    assert_non_null(strstr(buf, "\"too_many_connections\""));
    assert_non_null(strstr(buf, "\"message\""));
    // ... and another address is served.
    struct resp r = request("GET", "/open", NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    free(r.body);
    for (int i = 0; i < 4; i++) close(held[i]);
    end_other(s);
}

// Sockets on the server's port in CLOSE_WAIT (the client hung up, the
// server has not closed its end), from /proc/net/tcp.
static int close_waits(int port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned lport, st;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x", &lport, &st) == 2 && (int)lport == port &&
            st == 0x08)
            n++;
    }
    if (f) fclose(f);
    return n;
}

// At the connection limit, a new connection is answered 503 in the error
// envelope at once and closed. (Left to MHD, it waited in the kernel's
// queue, and one whose client gave up there sat in CLOSE-WAIT until the
// idle timeout, 30 s here: issue 21 item 5.) A client that connects and
// leaves before sending anything is closed promptly too.
static void connections_over_the_limit_are_refused_at_once(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.max_connections = 2;
    o.max_connections_per_client = 16;
    struct http_server *s = start_other(&o);
    char buf[4096];
    int held[2];
    for (int i = 0; i < 2; i++) {
        held[i] = connect_from("127.0.0.1");
        send_all(held[i], "GET /open HTTP/1.1\r\nHost: x\r\n\r\n");
        client_read_until(held[i], buf, sizeof buf, "hi");
    }
    for (int i = 0; i < 5; i++) {
        double t0 = ms_now();
        int fd = connect_from("127.0.0.1");
        size_t n = client_read_until(fd, buf, sizeof buf, NULL);
        close(fd);
        assert_true(n > 0);
        assert_non_null(strstr(buf, " 503 "));
        assert_non_null(strstr(buf, "\"too_many_connections\""));
        assert_non_null(strstr(buf, "--max-connections"));
        assert_true(ms_now() - t0 < 5);
    }
    // Clients that connect and leave while the limit holds leave nothing behind.
    for (int i = 0; i < 5; i++) close(connect_from("127.0.0.1"));
    int left = -1;
    for (int t = 0; t < 100 && left != 0; t++) {
        left = close_waits(g_port);
        if (left) usleep(50 * 1000);
    }
    assert_int_equal(left, 0);
    // Room comes back as soon as a held connection ends.
    close(held[0]);
    struct resp r;
    for (int t = 0; t < 50; t++) {
        r = request("GET", "/open", NULL, 0, NULL);
        if (r.status == 200) break;
        free(r.body);
        usleep(20 * 1000);
    }
    assert_int_equal(r.status, 200);
    free(r.body);
    close(held[1]);
    end_other(s);
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

// 24 clients each send all but the last byte of a 1 MiB body: the server
// holds at most its 4 MiB budget of them, reads and drops the rest, and its
// memory stays flat (before the budget, 24 MiB); once their last bytes are
// in, those get their 503 (kept until then: a client sending at once would
// see a reset, not the answer).
static void half_sent_bodies_hold_no_more_than_the_budget(void **state)
{
    (void)state;
    enum { N = 24, BODY = 1 << 20 };
    struct http_opts o = test_opts();
    o.max_body = 2 << 20;
    o.max_buffered_bytes = 4 << 20;
    o.max_buffered_bytes_per_client = 3 << 20;
    struct http_server *s = start_other(&o);
    static char chunk[BODY];
    memset(chunk, '1', sizeof chunk);
    long before = rss_kib();
    int fd[N], refused = 0;
    char head[256], buf[4096];
    snprintf(head, sizeof head,
             "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
             "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", BODY);
    for (int i = 0; i < N; i++) {
        // Two addresses: the per-address budget (3 MiB) refuses the second
        // address's later bodies too, while the total (4 MiB) refuses both.
        fd[i] = connect_from(i % 2 ? "127.0.0.3" : "127.0.0.1");
        send_all(fd[i], head);
        struct timeval tv = {.tv_sec = 2};
        setsockopt(fd[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        size_t left = BODY - 1;
        for (const char *p = chunk; left;) {
            ssize_t w = send(fd[i], p, left, MSG_NOSIGNAL);
            if (w <= 0) break; // refused: the server stopped reading
            p += w;
            left -= (size_t)w;
        }
    }
    usleep(200000);
    long during = rss_kib();
    for (int i = 0; i < N; i++) send(fd[i], "1", 1, MSG_NOSIGNAL);
    for (int i = 0; i < N; i++) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = 300000};
        setsockopt(fd[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ssize_t r = recv(fd[i], buf, sizeof buf - 1, 0);
        if (r > 0) {
            buf[r] = 0;
            if (strstr(buf, " 503 ") && strstr(buf, "\"message\"")) refused++;
        }
    }
    for (int i = 0; i < N; i++) close(fd[i]);
    end_other(s);
    print_message("rss before %ld KiB, with %d half-sent 1 MiB bodies %ld KiB; %d refused\n", before,
                  N, during, refused);
    assert_true(refused >= N - 4);
#if defined(__SANITIZE_ADDRESS__)
    // AddressSanitizer keeps freed memory in quarantine (256 MiB) and it
    // counts as resident: the bodies refused part-way would. The bound
    // holds in the plain build.
    (void)during;
#else
    assert_true(during - before < 12 * 1024);
#endif
}

// A declared Content-Length over the buffered-bytes budget, the body sent
// at once (no Expect: 100-continue, as SDKs send): the client can send it
// all and then reads the 503 with its Retry-After, every time (answered
// before the body, the close reset the connection mid-send: a broken pipe
// where the answer should be). With Expect: 100-continue it comes at once.
static void a_declared_body_over_the_budget_gets_503_after_it(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.max_body = 16 << 20;
    o.max_buffered_bytes = 16 << 20;
    o.max_buffered_bytes_per_client = 64 << 10;
    struct http_server *s = start_other(&o);
    int before = atomic_load(&g_echoed);
    static char body[8 << 20]; // past what the sockets buffer between the two ends
    memset(body, ' ', sizeof body);
    char head[512], buf[4096];
    snprintf(head, sizeof head,
             "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", sizeof body);
    for (int k = 0; k < 3; k++) {
        const size_t left = send_whole_then_read(head, body, sizeof body, buf, sizeof buf);
        if (left) fail_msg("try %d: cut with %zu bytes of the body unsent", k, left);
        if (!strstr(buf, " 503 ") || !strstr(buf, "Retry-After: 1") || !strstr(buf, "\"server_busy\"") ||
            !strstr(buf, "--max-buffered-bytes-per-client"))
            fail_msg("try %d: wanted a 503 with Retry-After in the error envelope, got: %.300s", k, buf);
    }
    int fd = connect_raw();
    snprintf(head, sizeof head,
             "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nExpect: 100-continue\r\n\r\n", sizeof body);
    send_all(fd, head);
    client_read_until(fd, buf, sizeof buf, "}}");
    close(fd);
    if (!strstr(buf, " 503 ")) fail_msg("with Expect: 100-continue: %.300s", buf);
    usleep(100 * 1000);
    assert_int_equal(atomic_load(&g_echoed), before);
    end_other(s);
}

// A body with no declared length (chunked) that goes over the per-address
// budget while arriving is answered 503 at once in the error envelope (MHD
// takes no response mid-body: it was dropped, and the request ran on an
// emptied body), and the handler never runs.
static void a_body_over_the_budget_mid_way_gets_503(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.max_body = 1 << 20;
    o.max_buffered_bytes = 16 << 20;
    o.max_buffered_bytes_per_client = 64 << 10;
    struct http_server *s = start_other(&o);
    int before = atomic_load(&g_echoed);
    int fd = connect_raw();
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    static char chunk[16384 + 16];
    snprintf(chunk, sizeof chunk, "4000\r\n");
    memset(chunk + 6, '1', 16384);
    memcpy(chunk + 6 + 16384, "\r\n", 3);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 16; i++) // 256 KiB in all
        if (send(fd, chunk, 6 + 16384 + 2, MSG_NOSIGNAL) <= 0) break;
    send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL);
    char buf[4096];
    size_t n = client_read_until(fd, buf, sizeof buf, "}}");
    close(fd);
    assert_true(n > 0);
    if (!strstr(buf, " 503 ") || !strstr(buf, "\"server_busy\"") ||
        !strstr(buf, "--max-buffered-bytes-per-client"))
        fail_msg("wanted a 503 in the error envelope, got: %.300s", buf);
    usleep(100 * 1000);
    assert_int_equal(atomic_load(&g_echoed), before);
    end_other(s);
}

// A declared Content-Length is checked against the budgets but reserved
// only as its bytes arrive: clients that declare large bodies and send
// nothing hold no budget, and others' bodies are taken meanwhile.
static void declared_lengths_hold_nothing_until_their_bytes_arrive(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.max_body = 1 << 20;
    o.max_buffered_bytes = 2 << 20;
    o.max_buffered_bytes_per_client = 2 << 20;
    struct http_server *s = start_other(&o);
    const char *from[] = {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"};
    int idle[4];
    char head[256];
    snprintf(head, sizeof head,
             "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
             "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", 900 << 10);
    for (int i = 0; i < 4; i++) {
        idle[i] = connect_from(from[i]);
        send_all(idle[i], head);
    }
    usleep(100 * 1000);
    size_t len = 600 << 10;
    char *body = malloc(len);
    memset(body, '2', len);
    struct resp r = request("POST", "/echo", body, len, "k");
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, len);
    free(r.body);
    free(body);
    for (int i = 0; i < 4; i++) close(idle[i]);
    end_other(s);
}

// A connection over its address's limit is answered 503 and closed before
// MHD reads from it: a request its client sent at once is never run.
static void a_refused_connection_runs_no_request(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.max_connections_per_client = 2;
    struct http_server *s = start_other(&o);
    char buf[4096];
    int held[2];
    for (int i = 0; i < 2; i++) {
        held[i] = connect_from("127.0.0.6");
        send_all(held[i], "GET /open HTTP/1.1\r\nHost: x\r\n\r\n");
        client_read_until(held[i], buf, sizeof buf, "hi");
    }
    int before = atomic_load(&g_echoed);
    int fd = connect_from("127.0.0.6");
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                 "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
    size_t n = client_read_until(fd, buf, sizeof buf, NULL);
    close(fd);
    assert_true(n > 0);
    assert_non_null(strstr(buf, " 503 "));
    assert_non_null(strstr(buf, "\"too_many_connections\""));
    usleep(200 * 1000);
    assert_int_equal(atomic_load(&g_echoed), before);
    for (int i = 0; i < 2; i++) close(held[i]);
    end_other(s);
}

// A request must arrive whole in time, however slowly its bytes trickle.
static void slow_requests_are_cut_at_their_deadline(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.header_timeout_s = 0.5;
    o.body_timeout_s = 0.5;
    struct http_server *s = start_other(&o);
    const char *heads[] = {
        "GET /hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaa",
        "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\nbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    };
    for (int k = 0; k < 2; k++) {
        int fd = connect_raw();
        bool closed = false;
        // One byte every 100 ms: never idle, never done. 80 bytes is 8 s.
        for (const char *p = heads[k]; *p && !closed; p++) {
            if (send(fd, p, 1, MSG_NOSIGNAL) != 1) closed = true;
            char c;
            if (recv(fd, &c, 1, MSG_DONTWAIT) == 0) closed = true;
            usleep(100000);
        }
        close(fd);
        assert_true(closed);
    }
    // A request sent at once is unaffected.
    struct resp r = request("GET", "/hello", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    free(r.body);
    end_other(s);
}

// The gate and MHD agree: a head the gate passes on, however unusual
// (bare LF, leading blank lines, HTTP/1.9, HTTP/1.0 without
// Host, obs-text bytes, a 30 KiB field, 99 fields), is served by MHD, not
// answered with one of its HTML pages.
static void unusual_heads_the_gate_passes_are_served(void **state)
{
    (void)state;
    static char big[31 * 1024], many[2048];
    int n = snprintf(big, sizeof big, "GET /open HTTP/1.1\r\nHost: x\r\nX-L: ");
    memset(big + n, 'a', 30000);
    strcpy(big + n + 30000, "\r\n\r\n");
    n = snprintf(many, sizeof many, "GET /open HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 98; i++) n += snprintf(many + n, sizeof many - (size_t)n, "X-%d: v\r\n", i);
    snprintf(many + n, sizeof many - (size_t)n, "\r\n");
    const char *heads[] = {
        "GET /open HTTP/1.1\nHost: x\n\n",
        "\r\n\r\nGET /open HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /open HTTP/1.9\r\nHost: x\r\n\r\n",
        "GET /open HTTP/1.0\r\n\r\n",
        "GET /open HTTP/1.1\r\nHost: x\r\nX-B: \xff\xfe\tv\r\n\r\n",
        "GET /open HTTP/1.1\r\nHost:\r\n\r\n",
        "GET /open?x=%zz HTTP/1.1\r\nHost: x\r\n\r\n",
        big,
        many,
    };
    char buf[4096];
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        int fd = connect_raw();
        send_all(fd, heads[i]);
        shutdown(fd, SHUT_WR);
        size_t got = client_read_until(fd, buf, sizeof buf, "hi");
        close(fd);
        if (!got || !strstr(buf, " 200 ") || !strstr(buf, "hi") || strstr(buf, "<html"))
            fail_msg("head %zu (%.40s...): wanted a 200, got: %.200s", i, heads[i], buf);
    }
}

// The second request of a kept-alive connection (which MHD reads, not the
// gate) framed two ways is refused as the gate refuses a first one, and the
// connection closes: MHD would take the first Content-Length, or decode
// chunked beside one and read on, and a pipelined request could hide in the
// body (request smuggling behind a proxy that frames it otherwise).
static void later_requests_framed_two_ways_are_refused_and_closed(void **state)
{
    (void)state;
    const char *first = "GET /open HTTP/1.1\r\nHost: x\r\n\r\n";
    const struct {
        const char *second;
        const char *status;
    } cases[] = {
        {"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
         "Content-Length: 2\r\nContent-Length: 60\r\n\r\n{}", " 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
         "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", " 400 "},
        {"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", " 501 "},
        {"POST /echo HTTP/1.0\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", " 400 "},
    };
    char buf[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = connect_raw();
        send_all(fd, first);
        size_t got = client_read_until(fd, buf, sizeof buf, "hi");
        if (!got || !strstr(buf, " 200 ")) fail_msg("case %zu: the first request got %.200s", i, buf);
        send_all(fd, cases[i].second);
        send_all(fd, "GET /open HTTP/1.1\r\nHost: x\r\n\r\n"); // pipelined: never answered
        got = client_read_until(fd, buf, sizeof buf, NULL); // to the close
        close(fd);
        if (!strstr(buf, cases[i].status) || !strstr(buf, "frames its body") || strstr(buf, "hi"))
            fail_msg("case %zu: wanted%sand the close, got: %.400s", i, cases[i].status, buf);
    }
}

static void a_nul_in_the_path_is_a_400(void **state)
{
    (void)state;
    struct resp r = request("GET", "/open%00x", NULL, 0, NULL);
    assert_int_equal(r.status, 400);
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(json_string_value(json_object_get(json_object_get(j, "error"), "message")));
    json_decref(j);
    free(r.body);
}

static struct resp post_typed(const char *path, const char *type, const char *body)
{
    char ct[256];
    // "Content-Type:" alone: curl sends none.
    snprintf(ct, sizeof ct, "Content-Type:%s%s", type ? " " : "", type ? type : "");
    const char *headers[] = {ct, NULL};
    struct resp r = client_request(g_port, "POST", path, body, strlen(body), "k", headers, 20);
    if (r.curl_code != CURLE_OK) fail_msg("POST %s: %s", path, curl_easy_strerror(r.curl_code));
    return r;
}

// A web page can post text/plain or a form cross-site without a preflight:
// such bodies are not taken as JSON.
static void bodies_must_be_declared_json(void **state)
{
    (void)state;
    const char *refused[] = {"text/plain", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", NULL};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        struct resp r = post_typed("/echo", refused[i], "{\"a\":1}");
        assert_int_equal(r.status, 415);
        assert_non_null(strstr(r.body, "application/json"));
        free(r.body);
    }
    const char *taken[] = {"application/json", "Application/JSON; charset=utf-8",
                           "application/vnd.api+json"};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        struct resp r = post_typed("/echo", taken[i], "{\"a\":1}");
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, "{\"a\":1}");
        free(r.body);
    }
}

static void only_allowed_host_names_are_answered(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    const char *hosts[] = {"localhost", "127.0.0.1", "::1"};
    o.allowed_hosts = hosts;
    o.n_allowed_hosts = 3;
    struct http_server *s = start_other(&o);
    const char *cases[][2] = {
        {"localhost", " 200 "}, {"LOCALHOST:8000", " 200 "}, {"127.0.0.1:1", " 200 "},
        {"[::1]:8000", " 200 "}, {"evil.example", " 403 "}, {"localhost.evil.example", " 403 "},
        {NULL, " 403 "},
    };
    char req[256], buf[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = connect_raw();
        if (cases[i][0])
            snprintf(req, sizeof req, "GET /open HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                     cases[i][0]);
        else
            snprintf(req, sizeof req, "GET /open HTTP/1.0\r\n\r\n");
        send_all(fd, req);
        client_read_until(fd, buf, sizeof buf, NULL);
        close(fd);
        if (!strstr(buf, cases[i][1])) fail_msg("Host %s: %s", cases[i][0], buf);
    }
    end_other(s);
}

// shutdown(SHUT_WR) after the request is no hang-up: the answer comes whole.
static void a_half_closed_client_gets_its_whole_answer(void **state)
{
    (void)state;
    char buf[8192];
    int fd = connect_raw();
    send_all(fd, "GET /stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    shutdown(fd, SHUT_WR);
    client_read_until(fd, buf, sizeof buf, "data: [DONE]");
    close(fd);
    // Chunked on the wire: each event may be a chunk of its own.
    assert_non_null(strstr(buf, "data: 0\n\n"));
    assert_non_null(strstr(buf, "data: 19\n\n"));
    assert_non_null(strstr(buf, "data: [DONE]\n\n"));

    fd = connect_raw();
    send_all(fd, "GET /later HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    shutdown(fd, SHUT_WR);
    client_read_until(fd, buf, sizeof buf, "later");
    close(fd);
    if (!strstr(buf, "\r\n\r\nlater")) fail_msg("deferred answer: %.300s", buf);

    // A POST, whose handler runs on a request worker while the connection waits.
    for (int i = 0; i < 5; i++) {
        fd = connect_raw();
        send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                     "Content-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}");
        shutdown(fd, SHUT_WR);
        client_read_until(fd, buf, sizeof buf, "{\"a\":1}");
        close(fd);
        if (!strstr(buf, " 200 ") || !strstr(buf, "{\"a\":1}")) fail_msg("worker's answer: %.300s", buf);
    }
}

// A client that closes its socket while its answer is awaited is noticed,
// though nothing was being sent to it.
static void a_closed_client_is_noticed_while_deferred(void **state)
{
    (void)state;
    int before = atomic_load(&g_gone);
    int fd = connect_raw();
    send_all(fd, "GET /never HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    close(fd);
    wait_counter(&g_gone, before + 1);
}

// An HTTP/1.0 client that shuts its sending side while its one answer is
// awaited is gone: nothing it understands (no 1xx) could tell a closed
// socket from one still reading, so its request is not run for nobody.
// Keeping its socket open changes nothing. An HTTP/1.1 one is probed
// instead, and still reading, is not gone (a_half_closed_client_gets_its_whole_answer).
static void an_http10_client_that_half_closes_while_deferred_is_gone(void **state)
{
    (void)state;
    int before = atomic_load(&g_gone);
    int fd = connect_raw();
    send_all(fd, "GET /never HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    shutdown(fd, SHUT_WR);
    wait_counter(&g_gone, before + 1);
    close(fd);

    before = atomic_load(&g_gone);
    fd = connect_raw();
    send_all(fd, "GET /never HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
    shutdown(fd, SHUT_WR);
    usleep(300000);
    assert_int_equal(atomic_load(&g_gone), before);
    close(fd);
    wait_counter(&g_gone, before + 1);
}

static void *post_block(void *arg)
{
    struct resp *r = arg;
    *r = request("POST", "/block", "{}", 2, "k");
    return NULL;
}

// A handler that takes long (a huge prompt's template and tokens) runs on a
// request worker: the one HTTP thread keeps writing other streams meanwhile.
static void slow_handlers_do_not_stall_streams(void **state)
{
    (void)state;
    struct http_opts o = test_opts();
    o.threads = 1;
    struct http_server *s = start_other(&o);
    atomic_store(&g_block_entered, 0);
    atomic_store(&g_stream_through, 0);
    struct resp blocked;
    pthread_t th;
    pthread_create(&th, NULL, post_block, &blocked);
    for (int i = 0; i < 1000 && !atomic_load(&g_block_entered); i++) usleep(10000);
    assert_true(atomic_load(&g_block_entered));
    struct resp r = request("GET", "/stream", NULL, 0, "k");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "data: 19\n\ndata: [DONE]\n\n"));
    free(r.body);
    atomic_store(&g_stream_through, 1);
    pthread_join(th, NULL);
    assert_int_equal(blocked.status, 200);
    assert_string_equal(blocked.body, "streams flowed");
    free(blocked.body);
    end_other(s);
}

static int setup(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct http_opts o = test_opts();
    char err[256];
    if (http_start(&o, &g_srv, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    g_port = http_port(g_srv);
    return g_port > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    // Nothing may stay open: every async was released.
    for (int i = 0; i < 200 && http_open_async(g_srv); i++) usleep(10000);
    int open = http_open_async(g_srv);
    http_stop(g_srv, 5);
    curl_global_cleanup();
    return open == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(routes_answer_and_unknown_paths_get_404_or_405),
        cmocka_unit_test(api_key_is_required_except_on_public_routes),
        cmocka_unit_test(prefix_routes_keys_beside_bearer_and_error_shapes_per_route),
        cmocka_unit_test(root_path_and_cors),
        cmocka_unit_test(bodies_arrive_whole_and_oversized_ones_get_413),
        cmocka_unit_test(head_refusals_of_a_post_come_after_its_body),
        cmocka_unit_test(deferred_responses_wait_without_a_thread),
        cmocka_unit_test(streams_deliver_every_event_in_order),
        cmocka_unit_test(hangup_while_streaming_is_noticed),
        cmocka_unit_test(hangup_while_deferred_is_noticed),
        cmocka_unit_test(idle_streams_get_keepalive_comments),
        cmocka_unit_test(slow_bodies_and_malformed_http),
        cmocka_unit_test(many_concurrent_streams_on_two_threads),
        cmocka_unit_test(a_busy_port_is_refused_unless_shared_on_purpose),
        cmocka_unit_test(one_address_cannot_take_every_connection),
        cmocka_unit_test(connections_over_the_limit_are_refused_at_once),
        cmocka_unit_test(half_sent_bodies_hold_no_more_than_the_budget),
        cmocka_unit_test(a_body_over_the_budget_mid_way_gets_503),
        cmocka_unit_test(a_declared_body_over_the_budget_gets_503_after_it),
        cmocka_unit_test(declared_lengths_hold_nothing_until_their_bytes_arrive),
        cmocka_unit_test(a_refused_connection_runs_no_request),
        cmocka_unit_test(slow_requests_are_cut_at_their_deadline),
        cmocka_unit_test(unusual_heads_the_gate_passes_are_served),
        cmocka_unit_test(a_nul_in_the_path_is_a_400),
        cmocka_unit_test(later_requests_framed_two_ways_are_refused_and_closed),
        cmocka_unit_test(bodies_must_be_declared_json),
        cmocka_unit_test(only_allowed_host_names_are_answered),
        cmocka_unit_test(a_half_closed_client_gets_its_whole_answer),
        cmocka_unit_test(an_http10_client_that_half_closes_while_deferred_is_gone),
        cmocka_unit_test(a_closed_client_is_noticed_while_deferred),
        cmocka_unit_test(slow_handlers_do_not_stall_streams),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
