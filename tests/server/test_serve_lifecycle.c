// Pins the server's life cycle: the API key (flag and environment) guards
// everything but /health; SIGTERM/SIGINT turn /health and new requests to
// 503, let running requests finish within --shutdown-timeout, abort the rest
// with finish_reason abort, and exit 0; under systemd it says READY=1 once
// serving and STOPPING=1 when draining.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moeserve_build.h"
#include "tests/server/harness.h"

static void api_key_guards_everything_but_health(void **state)
{
    (void)state;
    struct srv s;
    const char *extra[] = {"--api-key", "sekret", NULL};
    assert_int_equal(srv_start(&s, extra), 0);
    struct resp r = srv_request(&s, "GET", "/health", NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    const char *paths[][2] = {{"GET", "/v1/models"},   {"GET", "/version"},
                              {"POST", "/tokenize"},   {"POST", "/detokenize"},
                              {"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"}};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        r = srv_request(&s, paths[i][0], paths[i][1], "{}", 2, NULL);
        assert_int_equal(r.status, 401);
        json_t *j = json_loads(r.body, 0, NULL);
        assert_non_null(json_object_get(json_object_get(j, "error"), "message"));
        json_decref(j);
        resp_free(&r);
        r = srv_request(&s, paths[i][0], paths[i][1], "{}", 2, "wrong");
        assert_int_equal(r.status, 401);
        resp_free(&r);
    }
    r = srv_request(&s, "GET", "/v1/models", NULL, 0, "sekret");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    const char *body = "{\"prompt\": \"hi\", \"max_tokens\": 2}";
    r = srv_request(&s, "POST", "/v1/completions", body, strlen(body), "sekret");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    assert_int_equal(srv_stop(&s, SIGTERM, 30), 0);

    // Several keys, as vLLM's --api-key takes: any one of them; a later
    // --api-key replaces an earlier one's (argparse's last flag wins).
    const char *two[] = {"--api-key", "stale", "--api-key", "first", "second", NULL};
    assert_int_equal(srv_start(&s, two), 0);
    const char *tries[][2] = {{"first", "200"}, {"second", "200"}, {"third", "401"}, {NULL, "401"},
                              {"stale", "401"}};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        r = srv_request(&s, "GET", "/v1/models", NULL, 0, tries[i][0]);
        assert_int_equal(r.status, atoi(tries[i][1]));
        resp_free(&r);
    }
    assert_int_equal(srv_stop(&s, SIGTERM, 30), 0);

    // From the environment, as vLLM users set it; an empty MOESERVE_API_KEY
    // counts as unset and does not hide it (the server must not run open).
    setenv("VLLM_API_KEY", "fromenv", 1);
    setenv("MOESERVE_API_KEY", "", 1);
    assert_int_equal(srv_start(&s, NULL), 0);
    unsetenv("VLLM_API_KEY");
    unsetenv("MOESERVE_API_KEY");
    r = srv_request(&s, "GET", "/v1/models", NULL, 0, NULL);
    assert_int_equal(r.status, 401);
    resp_free(&r);
    r = srv_request(&s, "GET", "/v1/models", NULL, 0, "fromenv");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    assert_int_equal(srv_stop(&s, SIGTERM, 30), 0);
}

struct bg {
    struct srv *s;
    const char *body;
    struct sse out;
};

static void *bg_stream(void *arg)
{
    struct bg *b = arg;
    b->out = srv_stream(b->s, "/v1/completions", b->body);
    return NULL;
}

static const char *last_finish(const struct sse *e)
{
    const char *fr = NULL;
    size_t i;
    json_t *ev;
    json_array_foreach(e->events, i, ev) {
        json_t *f = json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "finish_reason");
        if (json_is_string(f)) fr = json_string_value(f);
    }
    return fr;
}

static void wait_running(struct srv *s)
{
    for (int i = 0; i < 1000; i++) {
        if (srv_health_field(s, "num_running") >= 1) return;
        usleep(5000);
    }
    fail_msg("the request never started running");
}

static void sigterm_aborts_what_outlives_the_timeout_and_exits_zero(void **state)
{
    (void)state;
    struct srv s;
    const char *extra[] = {"--shutdown-timeout", "1", "--max-model-len", "32768", NULL};
    assert_int_equal(srv_start(&s, extra), 0);
    struct bg b = {&s,
                   "{\"prompt\": \"on and on\", \"max_tokens\": 30000, \"temperature\": 0, "
                   "\"ignore_eos\": true, \"stream\": true}",
                   {0}};
    pthread_t th;
    pthread_create(&th, NULL, bg_stream, &b);
    wait_running(&s);
    kill(s.pid, SIGTERM);
    // Draining: /health says so, new work is refused with Retry-After.
    long st = 0;
    for (int i = 0; i < 200; i++) {
        json_t *h = srv_get_json(&s, "/health", &st);
        json_decref(h);
        if (st == 503) break;
        usleep(5000);
    }
    assert_int_equal(st, 503);
    const char *body = "{\"prompt\": \"hi\", \"max_tokens\": 2}";
    struct resp r = srv_request(&s, "POST", "/v1/completions", body, strlen(body), NULL);
    assert_int_equal(r.status, 503);
    assert_true(r.retry_after[0] != 0);
    resp_free(&r);
    pthread_join(th, NULL);
    assert_int_equal(b.out.status, 200);
    assert_true(b.out.done);
    assert_non_null(last_finish(&b.out));
    assert_string_equal(last_finish(&b.out), "abort");
    sse_free(&b.out);
    assert_int_equal(srv_stop(&s, 0, 30), 0); // already going: just wait
}

static void sigint_lets_running_requests_finish(void **state)
{
    (void)state;
    struct srv s;
    const char *extra[] = {"--shutdown-timeout", "60", NULL};
    assert_int_equal(srv_start(&s, extra), 0);
    struct bg b = {&s,
                   "{\"prompt\": \"count\", \"max_tokens\": 300, \"temperature\": 0, "
                   "\"ignore_eos\": true, \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
                   {0}};
    pthread_t th;
    pthread_create(&th, NULL, bg_stream, &b);
    wait_running(&s);
    kill(s.pid, SIGINT);
    pthread_join(th, NULL);
    assert_true(b.out.done);
    assert_string_equal(last_finish(&b.out), "length");
    json_t *last = json_array_get(b.out.events, json_array_size(b.out.events) - 1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(last, "usage"), "completion_tokens")), 300);
    sse_free(&b.out);
    assert_int_equal(srv_stop(&s, 0, 60), 0);
}

#if MOESERVE_HAVE_SYSTEMD
// One datagram from the notify socket within timeout_s, into buf; false if none.
static bool notify_recv(int fd, char *buf, size_t cap, double timeout_s)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(timeout_s * 1000)) != 1) return false;
    ssize_t n = recv(fd, buf, cap - 1, 0);
    if (n < 0) return false;
    buf[n] = 0;
    return true;
}
#endif

// Under systemd (Type=notify, $NOTIFY_SOCKET): STATUS while loading, READY=1
// once requests are served (and not before: /health says 200 by then), and
// STOPPING=1 when a signal starts the drain. Without READY=1 systemd kills
// the unit after TimeoutStartSec and starts it again, forever.
static void systemd_is_told_ready_then_stopping(void **state)
{
    (void)state;
#if MOESERVE_HAVE_SYSTEMD
    char path[108];
    snprintf(path, sizeof path, "/tmp/moeserve-notify-%d", (int)getpid());
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    struct srv s;
    const int started = srv_start(&s, NULL);
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(started, 0);
    char msg[1024];
    bool ready = false, loading = false;
    while (!ready && notify_recv(fd, msg, sizeof msg, 30)) {
        loading |= strstr(msg, "STATUS=loading") != NULL;
        ready = strstr(msg, "READY=1") != NULL;
    }
    assert_true(loading);
    assert_true(ready);
    struct resp r = srv_request(&s, "GET", "/health", NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    kill(s.pid, SIGTERM);
    bool stopping = false;
    while (!stopping && notify_recv(fd, msg, sizeof msg, 30)) stopping = strstr(msg, "STOPPING=1") != NULL;
    assert_true(stopping);
    assert_int_equal(srv_stop(&s, 0, 30), 0);
    close(fd);
    unlink(path);
#else
    skip();
#endif
}

// `moeserve serve ARGS...` run to its exit: the status (128 + signal if
// killed), and when log is not NULL the start of its stderr (NUL-ended).
static int serve_exit_status_log(const char *const *args, char *log, size_t cap)
{
    const char *argv[16] = {getenv("MOESERVE_BIN"), "serve"};
    int n = 2;
    for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
    argv[n] = NULL;
    int pipefd[2] = {-1, -1};
    if (log) assert_int_equal(pipe(pipefd), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const int to = log ? pipefd[1] : open("/dev/null", O_WRONLY);
        if (to >= 0) dup2(to, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (log) {
        close(pipefd[1]);
        size_t got = 0;
        ssize_t r;
        char sink[4096];
        while ((r = read(pipefd[0], got + 1 < cap ? log + got : sink,
                         got + 1 < cap ? cap - 1 - got : sizeof sink)) > 0)
            if (got + 1 < cap) got += (size_t)r;
        log[got] = 0;
        close(pipefd[0]);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int serve_exit_status(const char *const *args) { return serve_exit_status_log(args, NULL, 0); }

// A start that cannot succeed however often it is tried (a KV cache too
// small for one sequence, a bad flag) exits 2, which the systemd unit's
// RestartPreventExitStatus=2 does not restart; a model directory that is
// not there (yet: a mount at boot) exits 1, which it does.
static void a_start_that_cannot_succeed_exits_2(void **state)
{
    (void)state;
    const char *model = getenv("MOESERVE_TINY_MODEL");
    const char *missing[] = {"/nonexistent/model", "--port", "0", NULL};
    assert_int_equal(serve_exit_status(missing), 1);
    const char *no_fit[] = {model, "--port", "0", "--kv-cache-memory", "1", NULL};
    assert_int_equal(serve_exit_status(no_fit), 2);
    const char *bad_flag[] = {model, "--port", "0", "--health-timeout", "0", NULL};
    assert_int_equal(serve_exit_status(bad_flag), 2);
    const char *empty_key[] = {model, "--port", "0", "--api-key", "", NULL}; // would serve open
    assert_int_equal(serve_exit_status(empty_key), 2);
    // A bad generation-config override is refused before the engine is made
    // (its KV pool: here one too small, which would be refused too).
    char log[8192];
    const char *bad_override[] = {model, "--port", "0", "--kv-cache-memory", "1",
                                  "--override-generation-config", "{\"temperature\": \"hot\"}", NULL};
    assert_int_equal(serve_exit_status_log(bad_override, log, sizeof log), 2);
    if (!strstr(log, "--override-generation-config") || strstr(log, "engine"))
        fail_msg("wanted the override refused before the engine: %s", log);
    // CORS's other flags without origins do nothing, and the log says so.
    const char *cors_alone[] = {model, "--port", "0", "--kv-cache-memory", "1", "--allowed-methods", "GET",
                                "--allow-credentials", NULL};
    assert_int_equal(serve_exit_status_log(cors_alone, log, sizeof log), 2);
    if (!strstr(log, "nothing without --allowed-origins")) fail_msg("wanted CORS's warning: %s", log);
    // --uvicorn-log-level holds for what flags before it log while parsed.
    const char *quiet[] = {model, "--port", "0", "--seed", "1", "--uvicorn-log-level", "warning",
                           "--kv-cache-memory", "1", NULL};
    assert_int_equal(serve_exit_status_log(quiet, log, sizeof log), 2);
    if (strstr(log, " INFO ")) fail_msg("wanted no INFO line at --uvicorn-log-level warning: %s", log);
}

static void a_full_waiting_queue_gets_503_with_retry_after(void **state)
{
    (void)state;
    struct srv s;
    const char *extra[] = {"--max-num-seqs", "1", "--max-waiting-requests", "1",
                           "--shutdown-timeout", "0", NULL};
    assert_int_equal(srv_start(&s, extra), 0);
    const char *long_body = "{\"prompt\": \"on and on\", \"max_tokens\": 2000, \"temperature\": 0, "
                            "\"ignore_eos\": true, \"stream\": true}";
    struct bg a = {&s, long_body, {0}}, b = {&s, long_body, {0}};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, bg_stream, &a);
    wait_running(&s);
    pthread_create(&tb, NULL, bg_stream, &b);
    for (int i = 0; i < 1000 && srv_health_field(&s, "num_waiting") < 1; i++) usleep(5000);
    assert_int_equal(srv_health_field(&s, "num_waiting"), 1);
    const char *body = "{\"prompt\": \"hi\", \"max_tokens\": 2}";
    struct resp r = srv_request(&s, "POST", "/v1/completions", body, strlen(body), NULL);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.retry_after, "1");
    json_t *j = json_loads(r.body, 0, NULL);
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                           "--max-waiting-requests"));
    json_decref(j);
    resp_free(&r);
    // Shutting down with a zero timeout aborts both at once.
    assert_int_equal(srv_stop(&s, SIGTERM, 30), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_string_equal(last_finish(&a.out), "abort");
    sse_free(&a.out);
    sse_free(&b.out);
}

static int setup(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(api_key_guards_everything_but_health),
        cmocka_unit_test(sigterm_aborts_what_outlives_the_timeout_and_exits_zero),
        cmocka_unit_test(sigint_lets_running_requests_finish),
        cmocka_unit_test(a_full_waiting_queue_gets_503_with_retry_after),
        cmocka_unit_test(systemd_is_told_ready_then_stopping),
        cmocka_unit_test(a_start_that_cannot_succeed_exits_2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
