// Pins the bench client: SSE reassembly, statistics and arrivals, and whole
// runs against a real HTTP/SSE server on loopback (openai_stream_server.js,
// which can misbehave on request) — counts, usage, TTFT from content
// chunks only, concurrency cap, failures, the printed block and the JSON.
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "bench/bench.h"
#include "bench/sse.h"
#include "base/base.h"

// ---- SSE ---------------------------------------------------------------------------------
struct events {
    char buf[4096];
    size_t len;
    int n;
    int stop_at; // return non-zero on this event (0: never)
};

static int collect_event(void *ctx, const char *data, size_t len)
{
    struct events *e = ctx;
    assert_int_equal(strlen(data), len); // NUL-terminated, no embedded NULs here
    e->len += (size_t)snprintf(e->buf + e->len, sizeof e->buf - e->len, "[%s]", data);
    e->n++;
    return e->n == e->stop_at ? 42 : 0;
}

static const char stream_text[] =
    ": comment\n"
    "data: {\"a\":1}\n\n"
    "event: message\r\n"
    "data: two\r\n"
    "data:  lines\r\n\r\n"
    "id: 7\r"
    "data:nospace\r\r"
    "data\n\n"
    "retry: 100\n"
    "data: [DONE]\n\n";
static const char stream_want[] = "[{\"a\":1}][two\n lines][nospace][][[DONE]]";

static void sse_reassembles_events_split_anywhere(void **state)
{
    (void)state;
    size_t n = strlen(stream_text);
    for (size_t cut = 0; cut <= n; cut++) {
        struct events e = {0};
        struct sse_parser *p = sse_create(1024, collect_event, &e);
        assert_non_null(p);
        assert_int_equal(sse_feed(p, stream_text, cut), 0);
        assert_int_equal(sse_feed(p, stream_text + cut, n - cut), 0);
        assert_int_equal(sse_finish(p), 0);
        assert_string_equal(e.buf, stream_want);
        sse_destroy(p);
    }
    struct events e = {0};
    struct sse_parser *p = sse_create(1024, collect_event, &e);
    for (size_t i = 0; i < n; i++) assert_int_equal(sse_feed(p, stream_text + i, 1), 0);
    assert_string_equal(e.buf, stream_want);
    sse_destroy(p);
}

static void sse_refuses_lines_and_events_beyond_the_bound(void **state)
{
    (void)state;
    struct events e = {0};
    char line[200];
    memset(line, 'x', sizeof line);
    struct sse_parser *p = sse_create(64, collect_event, &e);
    assert_int_equal(sse_feed(p, line, sizeof line), MS_EFORMAT);
    sse_destroy(p);
    // Many short data lines that add up past the bound.
    p = sse_create(64, collect_event, &e);
    int rc = 0;
    for (int i = 0; i < 20 && !rc; i++) rc = sse_feed(p, "data: 0123456789\n", 17);
    assert_int_equal(rc, MS_EFORMAT);
    assert_int_equal(e.n, 0);
    sse_destroy(p);
}

static void sse_dispatches_a_trailing_event_and_stops_when_told(void **state)
{
    (void)state;
    struct events e = {0};
    struct sse_parser *p = sse_create(1024, collect_event, &e);
    assert_int_equal(sse_feed(p, "data: last", 10), 0);
    assert_int_equal(e.n, 0);
    assert_int_equal(sse_finish(p), 0);
    assert_string_equal(e.buf, "[last]");
    sse_destroy(p);
    struct events s = {.stop_at = 2};
    p = sse_create(1024, collect_event, &s);
    assert_int_equal(sse_feed(p, "data: 1\n\ndata: 2\n\ndata: 3\n\n", 27), 42);
    assert_int_equal(s.n, 2);
    sse_destroy(p);
}

// ---- statistics and arrivals --------------------------------------------------------------
static void percentiles_interpolate_like_numpy(void **state)
{
    (void)state;
    const double a[] = {1, 2, 3, 4};
    assert_true(fabs(bench_percentile(a, 4, 50) - 2.5) < 1e-12);
    assert_true(fabs(bench_percentile(a, 4, 99) - 3.97) < 1e-12);
    const double b[] = {15, 20, 35, 40, 50};
    assert_true(fabs(bench_percentile(b, 5, 99) - 49.6) < 1e-12);
    assert_true(fabs(bench_percentile(b, 5, 50) - 35) < 1e-12);
    assert_true(bench_percentile(b, 1, 99) == 15);
    assert_true(bench_percentile(b, 0, 99) == 0);
    double v[] = {4, 1, 3, 2};
    struct bench_stats s;
    bench_stats_of(v, 4, &s);
    assert_true(s.mean == 2.5 && s.median == 2.5);
    assert_true(fabs(s.std - sqrt(1.25)) < 1e-12);
    assert_true(fabs(s.p99 - 3.97) < 1e-12);
}

static void arrivals_are_poisson_at_the_rate_and_seeded(void **state)
{
    (void)state;
    enum { N = 20000 };
    double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(bench_arrivals(N, INFINITY, 1, a), 0);
    for (int i = 0; i < N; i++) assert_true(a[i] == 0);
    assert_int_equal(bench_arrivals(N, 10.0, 1, a), 0);
    assert_true(a[0] == 0);
    double sumsq = 0;
    for (int i = 1; i < N; i++) {
        assert_true(a[i] >= a[i - 1]);
        double g = a[i] - a[i - 1];
        sumsq += g * g;
    }
    double mean = a[N - 1] / (N - 1);
    assert_true(fabs(mean - 0.1) < 0.003);
    // Exponential gaps: the standard deviation equals the mean.
    double sd = sqrt(sumsq / (N - 1) - mean * mean);
    assert_true(fabs(sd - 0.1) < 0.005);
    assert_int_equal(bench_arrivals(N, 10.0, 1, b), 0);
    assert_memory_equal(a, b, N * sizeof *a);
    assert_int_equal(bench_arrivals(N, 10.0, 2, b), 0);
    assert_true(memcmp(a, b, N * sizeof *a) != 0);
    assert_int_equal(bench_arrivals(N, 0, 1, b), MS_EINVAL);
    free(a);
    free(b);
}

// ---- the fixture server --------------------------------------------------------------------
static pid_t fixture_pid;
static char fixture_url[64];

static void fixture_start(const char *const *extra)
{
    const char *node_path = getenv("MOESERVE_NODE");
    const char *script = getenv("MOESERVE_BENCH_FIXTURE");
    assert_non_null(script);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    const char *argv[32] = {node_path ? node_path : "node", script};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    fixture_pid = fork();
    assert_true(fixture_pid >= 0);
    if (fixture_pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    char line[32] = "";
    size_t got = 0;
    while (got < sizeof line - 1) {
        ssize_t r = read(fd[0], line + got, 1);
        if (r <= 0 || line[got] == '\n') break;
        got++;
    }
    line[got] = 0;
    close(fd[0]);
    int port = atoi(line);
    if (port <= 0) fail_msg("the fixture server did not print its port (got '%s')", line);
    snprintf(fixture_url, sizeof fixture_url, "http://127.0.0.1:%d", port);
}

static void fixture_stop(void)
{
    if (fixture_pid > 0) {
        kill(fixture_pid, SIGTERM);
        waitpid(fixture_pid, NULL, 0);
        fixture_pid = 0;
    }
}

static size_t into_buf(char *p, size_t s, size_t n, void *ud)
{
    char **b = ud;
    size_t have = *b ? strlen(*b) : 0;
    char *nb = realloc(*b, have + s * n + 1);
    if (!nb) return 0;
    memcpy(nb + have, p, s * n);
    nb[have + s * n] = 0;
    *b = nb;
    return s * n;
}

static json_t *fixture_stats(void)
{
    char url[128], *body = NULL;
    snprintf(url, sizeof url, "%s/stats", fixture_url);
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, into_buf);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    assert_int_equal(curl_easy_perform(e), CURLE_OK);
    curl_easy_cleanup(e);
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    assert_non_null(j);
    return j;
}

static int teardown_fixture(void **state)
{
    (void)state;
    fixture_stop();
    return 0;
}

static void opts_for_fixture(struct bench_opts *o, int n, int in, int out)
{
    bench_opts_default(o);
    o->base_url = fixture_url;
    o->model = "fixture-model";
    o->num_prompts = n;
    o->random_input_len = in;
    o->random_output_len = out;
    o->request_timeout = 60;
}

static void completions_stream_with_usage_under_a_concurrency_cap(void **state)
{
    (void)state;
    const char *args[] = {"--ttft-ms", "30", "--itl-ms", "2", "--api-key", "k1", NULL};
    fixture_start(args);
    struct bench_opts o;
    opts_for_fixture(&o, 12, 16, 8);
    o.max_concurrency = 4;
    o.ignore_eos = true;
    o.api_key = "k1";
    o.seed = 3;
    struct bench_result r;
    char err[512];
    int rc = bench_run(&o, &r, NULL, err, sizeof err);
    if (rc) fail_msg("%s", err);
    assert_int_equal(r.completed, 12);
    assert_int_equal(r.failed, 0);
    assert_int_equal(r.total_input, 12 * 16);
    assert_int_equal(r.total_output, 12 * 8);
    assert_false(r.usage_missing);
    assert_true(r.peak_concurrency <= 4);
    for (int i = 0; i < 12; i++) {
        const struct bench_request *q = &r.reqs[i];
        assert_true(q->success);
        assert_null(q->error);
        // The server waits 30 ms before the first token; node's timers count
        // from the event loop's cached clock, so they can fire a few ms
        // early by ours (seen once: a failure of a strict >= 30 ms).
        if (!(q->ttft >= 0.025)) fail_msg("request %d: TTFT %.4f s, the server waits 0.030", i, q->ttft);
        assert_true(q->latency >= q->ttft);
        assert_int_equal(q->n_itl, 7);
        assert_int_equal(q->output_tokens, 8);
    }
    assert_int_equal(r.ttft.n, 12);
    assert_int_equal(r.itl.n, 12 * 7);
    assert_int_equal(r.tpot.n, 12);
    assert_true(r.ttft.mean >= 25.0 && r.ttft.p99 >= r.ttft.median);
    assert_true(r.output_throughput > 0 && r.request_throughput > 0);
    assert_true(fabs(r.total_token_throughput - (double)(12 * 24) / r.duration) < 1e-6 * r.total_token_throughput);
    json_t *st = fixture_stats();
    assert_int_equal(json_integer_value(json_object_get(st, "requests")), 13); // + the initial test
    assert_true(json_integer_value(json_object_get(st, "max_in_flight")) <= 4);
    json_t *bodies = json_object_get(st, "bodies"), *b;
    size_t i;
    json_array_foreach(bodies, i, b) {
        assert_string_equal(json_string_value(json_object_get(b, "model")), "fixture-model");
        assert_true(json_is_true(json_object_get(b, "stream")));
        assert_true(json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage")));
        assert_true(json_is_true(json_object_get(b, "ignore_eos")));
        assert_int_equal(json_integer_value(json_object_get(b, "max_tokens")), 8);
        json_t *p = json_object_get(b, "prompt"), *id;
        assert_int_equal(json_array_size(p), 16);
        size_t k;
        json_array_foreach(p, k, id) {
            json_int_t v = json_integer_value(id);
            assert_true(v >= 100 && v < 30000);
        }
    }
    json_t *auth = json_object_get(st, "auth"), *a;
    json_array_foreach(auth, i, a) assert_string_equal(json_string_value(a), "Bearer k1");
    json_decref(st);
    bench_result_free(&r);
    fixture_stop();
}

static void chat_ttft_counts_content_not_the_role_chunk(void **state)
{
    (void)state;
    const char *args[] = {"--ttft-ms", "40", NULL};
    fixture_start(args);
    struct bench_opts o;
    opts_for_fixture(&o, 6, 10, 5);
    o.endpoint = "/v1/chat/completions";
    o.model = NULL; // discovered from /v1/models
    struct bench_result r;
    char err[512];
    int rc = bench_run(&o, &r, NULL, err, sizeof err);
    if (rc) fail_msg("%s", err);
    assert_string_equal(r.model, "fixture-model");
    assert_int_equal(r.completed, 6);
    assert_int_equal(r.total_output, 30);
    assert_int_equal(r.total_input, 60); // the fixture counts words
    // The role chunk comes at once; the first content 40 ms later (less a
    // few ms of node's timer slack, as above): TTFT counts the content.
    for (int i = 0; i < 6; i++)
        if (!(r.reqs[i].ttft >= 0.035)) fail_msg("request %d: TTFT %.4f s, the content comes 0.040 s after the role", i, r.reqs[i].ttft);
    json_t *st = fixture_stats();
    json_t *b = json_array_get(json_object_get(st, "bodies"), 1);
    assert_int_equal(json_integer_value(json_object_get(b, "max_completion_tokens")), 5);
    const char *content = json_string_value(json_object_get(json_array_get(json_object_get(b, "messages"), 0), "content"));
    assert_non_null(content);
    int words = 1;
    for (const char *c = content; *c; c++) words += *c == ' ';
    assert_int_equal(words, 10);
    json_decref(st);
    bench_result_free(&r);
    fixture_stop();
}

static void failures_are_counted_with_their_reasons(void **state)
{
    (void)state;
    const char *args[] = {"--fail-every", "3", "--break-every", "5", "--error-event-every", "7", NULL};
    fixture_start(args);
    struct bench_opts o;
    opts_for_fixture(&o, 20, 4, 6);
    o.initial_test = false;
    o.max_concurrency = 3;
    struct bench_result r;
    char err[512];
    int rc = bench_run(&o, &r, NULL, err, sizeof err);
    if (rc) fail_msg("%s", err);
    // Of requests 1..20 as the server numbers them: 500 for 3,6,..,18 (6);
    // dropped mid-stream 5,10,20 (3); an error event in 7,14 (2).
    assert_int_equal(r.failed, 11);
    assert_int_equal(r.completed, 9);
    assert_int_equal(r.total_output, 9 * 6);
    int http500 = 0, event = 0, dropped = 0;
    for (int i = 0; i < 20; i++) {
        const struct bench_request *q = &r.reqs[i];
        if (q->success) continue;
        assert_non_null(q->error);
        if (strstr(q->error, "HTTP 500") && strstr(q->error, "fixture failure")) http500++;
        else if (strstr(q->error, "engine fell over")) event++;
        else dropped++;
    }
    assert_int_equal(http500, 6);
    assert_int_equal(event, 2);
    assert_int_equal(dropped, 3);
    bench_result_free(&r);
    fixture_stop();
}

static void split_crlf_streams_without_usage_count_chunks(void **state)
{
    (void)state;
    const char *args[] = {"--split", "--crlf", "--no-usage", NULL};
    fixture_start(args);
    struct bench_opts o;
    opts_for_fixture(&o, 5, 8, 7);
    struct bench_result r;
    char err[512];
    int rc = bench_run(&o, &r, NULL, err, sizeof err);
    if (rc) fail_msg("%s", err);
    assert_int_equal(r.completed, 5);
    assert_true(r.usage_missing);
    assert_int_equal(r.total_output, 5 * 7);
    assert_int_equal(r.total_input, 5 * 8); // no usage: the lengths sent
    bench_result_free(&r);
    fixture_stop();
}

// A token whose text is a NUL byte ("\u0000", valid JSON: a random model
// emits one now and then) is a token like any other, in both APIs, not a
// stream that fails to parse.
static void nul_byte_tokens_count_as_tokens(void **state)
{
    (void)state;
    const char *args[] = {"--nul-text", "--no-usage", NULL};
    fixture_start(args);
    for (int chat = 0; chat < 2; chat++) {
        struct bench_opts o;
        opts_for_fixture(&o, 4, 8, 6);
        if (chat) o.endpoint = "/v1/chat/completions";
        struct bench_result r;
        char err[512];
        int rc = bench_run(&o, &r, NULL, err, sizeof err);
        if (rc) fail_msg("%s", err);
        assert_int_equal(r.completed, 4);
        assert_int_equal(r.failed, 0);
        assert_int_equal(r.total_output, 4 * 6);
        bench_result_free(&r);
    }
    fixture_stop();
}

static void poisson_requests_never_start_before_their_arrival(void **state)
{
    (void)state;
    fixture_start(NULL);
    struct bench_opts o;
    opts_for_fixture(&o, 10, 4, 2);
    o.request_rate = 40;
    o.seed = 9;
    struct bench_result r;
    char err[512];
    int rc = bench_run(&o, &r, NULL, err, sizeof err);
    if (rc) fail_msg("%s", err);
    double a[10];
    bench_arrivals(10, 40, 9, a);
    for (int i = 0; i < 10; i++) assert_true(r.reqs[i].start >= a[i]);
    assert_true(r.duration >= a[9]);
    assert_int_equal(r.completed, 10);
    bench_result_free(&r);
    fixture_stop();
}

static void a_failing_initial_test_stops_the_run_with_its_error(void **state)
{
    (void)state;
    fixture_start(NULL);
    struct bench_opts o;
    opts_for_fixture(&o, 50, 4, 2);
    o.model = "no-such-model";
    struct bench_result r;
    char err[512];
    assert_int_equal(bench_run(&o, &r, NULL, err, sizeof err), MS_EIO);
    assert_non_null(strstr(err, "initial test"));
    assert_non_null(strstr(err, "HTTP 404"));
    assert_non_null(strstr(err, "no-such-model"));
    json_t *st = fixture_stats();
    assert_int_equal(json_integer_value(json_object_get(st, "requests")), 1);
    json_decref(st);
    fixture_stop();
    // Nobody listening: the error names the connection failure.
    opts_for_fixture(&o, 5, 4, 2);
    assert_int_not_equal(bench_run(&o, &r, NULL, err, sizeof err), 0);
    assert_non_null(strstr(err, "initial test"));
    opts_for_fixture(&o, 5, 4, 2);
    o.endpoint = "/v1/chat/completions";
    o.prompt_kind = BENCH_PROMPT_IDS;
    assert_int_equal(bench_run(&o, &r, NULL, err, sizeof err), MS_EINVAL);
}

// --extra-body's members reach every request, replacing ours of the same name;
// anything but a JSON object is refused before a request is sent.
static void extra_body_members_join_every_request(void **state)
{
    (void)state;
    fixture_start(NULL);
    struct bench_opts o;
    opts_for_fixture(&o, 3, 4, 6);
    o.extra_body = "{\"top_k\": 20, \"max_tokens\": 2, \"logit_bias\": {\"7\": -100}}";
    struct bench_result r;
    char err[512];
    int rc = bench_run(&o, &r, NULL, err, sizeof err);
    if (rc) fail_msg("%s", err);
    assert_int_equal(r.completed, 3);
    json_t *st = fixture_stats();
    json_t *bodies = json_object_get(st, "bodies"), *b;
    assert_int_equal(json_array_size(bodies), 4); // + the initial test
    size_t i;
    json_array_foreach(bodies, i, b) {
        assert_int_equal(json_integer_value(json_object_get(b, "top_k")), 20);
        assert_int_equal(json_integer_value(json_object_get(b, "max_tokens")), 2);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "logit_bias"), "7")), -100);
        assert_int_equal(json_array_size(json_object_get(b, "prompt")), 4);
    }
    json_decref(st);
    bench_result_free(&r);
    const char *bad[] = {"[1, 2]", "{\"top_k\": ", "7", ""};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        opts_for_fixture(&o, 3, 4, 6);
        o.extra_body = bad[k];
        assert_int_equal(bench_run(&o, &r, NULL, err, sizeof err), MS_EINVAL);
        assert_non_null(strstr(err, "--extra-body"));
    }
    st = fixture_stats();
    assert_int_equal(json_array_size(json_object_get(st, "bodies")), 4); // nothing more was sent
    json_decref(st);
    fixture_stop();
}

// ---- the command --------------------------------------------------------------------------------
static int run_cli(const char *args, char *out, size_t outlen)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' bench %s 2>&1", getenv("MOESERVE_BIN"), args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void the_command_prints_vllms_block_and_saves_its_keys(void **state)
{
    (void)state;
    fixture_start(NULL);
    char path[] = "/tmp/moeserve-bench-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char args[512], out[16384];
    snprintf(args, sizeof args, "--base-url %s --model fixture-model --num-prompts 8 --max-concurrency 2 "
             "--random-input-len 5 --random-output-len 4 --ignore-eos --seed 1 --save-result %s",
             fixture_url, path);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    const char *want[] = {"============ Serving Benchmark Result ============",
                          "Successful requests:                     8",
                          "Failed requests:                         0",
                          "Maximum request concurrency:             2",
                          "Total input tokens:                      40",
                          "Total generated tokens:                  32",
                          "Request throughput (req/s):", "Output token throughput (tok/s):",
                          "Peak output token throughput (tok/s):", "Total Token throughput (tok/s):",
                          "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):",
                          "P99 ITL (ms):", "Median E2EL (ms):", "[8/8]"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("'%s' missing from:\n%s", want[i], out);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    const char *keys[] = {"completed", "failed", "request_throughput", "output_throughput",
                          "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                          "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                          "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
                          "duration", "total_input_tokens", "total_output_tokens"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!json_is_number(json_object_get(j, keys[i]))) fail_msg("key %s missing from %s", keys[i], path);
    assert_int_equal(json_integer_value(json_object_get(j, "completed")), 8);
    assert_int_equal(json_array_size(json_object_get(j, "itls")), 8);
    assert_string_equal(json_string_value(json_object_get(j, "request_rate")), "inf");
    json_decref(j);
    unlink(path);
    fixture_stop();
    // Usage errors.
    const struct {
        const char *args;
        int status;
        const char *says;
    } bad[] = {
        {"--endpoint /v1/embeddings", 2, "--endpoint"},
        {"--num-prompts 0", 2, "--num-prompts"},
        {"--request-rate -1", 2, "--request-rate"},
        {"--random-range-ratio 1.5", 2, "below 1"},
        {"--random-vocab-range 5:5", 2, "LO:HI"},
        {"--prompt-kind bytes", 2, "ids or words"},
        {"--endpoint /v1/chat/completions --prompt-kind ids --model m", 2, "completions"},
        {"--base-url http://127.0.0.1:1 --model m --num-prompts 2", 1, "initial test"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = run_cli(bad[i].args, out, sizeof out);
        if (st != bad[i].status || !strstr(out, bad[i].says))
            fail_msg("bench %s: status %d (want %d): %s", bad[i].args, st, bad[i].status, out);
    }
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sse_reassembles_events_split_anywhere),
        cmocka_unit_test(sse_refuses_lines_and_events_beyond_the_bound),
        cmocka_unit_test(sse_dispatches_a_trailing_event_and_stops_when_told),
        cmocka_unit_test(percentiles_interpolate_like_numpy),
        cmocka_unit_test(arrivals_are_poisson_at_the_rate_and_seeded),
        cmocka_unit_test_teardown(completions_stream_with_usage_under_a_concurrency_cap, teardown_fixture),
        cmocka_unit_test_teardown(chat_ttft_counts_content_not_the_role_chunk, teardown_fixture),
        cmocka_unit_test_teardown(failures_are_counted_with_their_reasons, teardown_fixture),
        cmocka_unit_test_teardown(split_crlf_streams_without_usage_count_chunks, teardown_fixture),
        cmocka_unit_test_teardown(nul_byte_tokens_count_as_tokens, teardown_fixture),
        cmocka_unit_test_teardown(poisson_requests_never_start_before_their_arrival, teardown_fixture),
        cmocka_unit_test_teardown(a_failing_initial_test_stops_the_run_with_its_error, teardown_fixture),
        cmocka_unit_test_teardown(extra_body_members_join_every_request, teardown_fixture),
        cmocka_unit_test_teardown(the_command_prints_vllms_block_and_saves_its_keys, teardown_fixture),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
