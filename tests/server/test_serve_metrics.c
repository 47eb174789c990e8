// Pins GET /metrics on a running server: open without the API key, valid for
// `promtool check metrics`, labelled with the served model name, and its
// counters and histograms move by exactly what the requests did (tokens from
// the responses' usage, one success per request, one TTFT and e2e sample
// each), with per-rank expert loads (by expert and by layer) and all-to-all
// times on 2 EP ranks under vLLM's names (--metrics-prefix vllm).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/server/harness.h"
#include "tests/server/promtool.h"

#define KEY "metrics-key"

static char *get_metrics(const struct srv *s)
{
    struct resp r = srv_request(s, "GET", "/metrics", NULL, 0, NULL);
    assert_int_equal(r.status, 200);
    char *text = strdup(r.body);
    resp_free(&r);
    assert_non_null(text);
    return text;
}

// The sum of every sample of `series` whose labels contain `labels` (may be
// ""), e.g. series "moeserve:prompt_tokens_total". -1 when none is present.
static double sample_sum(const char *text, const char *series, const char *labels)
{
    double sum = -1;
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (*p == '#' || strncmp(p, series, n) || (p[n] != '{' && p[n] != ' ')) continue;
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (len >= sizeof line) continue;
        memcpy(line, p, len);
        line[len] = 0;
        char *close = strrchr(line, '}');
        if (labels[0] && (!close || !strstr(line, labels))) continue;
        char *val = strrchr(line, ' ');
        if (!val) continue;
        if (sum < 0) sum = 0;
        sum += strtod(val + 1, NULL);
    }
    return sum;
}

// n completions of max_tokens each (ignore_eos, so every one ends by length);
// returns the prompt tokens their usage reported.
static long run_requests(const struct srv *s, int n, int max_tokens)
{
    long prompt = 0;
    for (int i = 0; i < n; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\": \"tiny\", \"prompt\": \"metrics request %d says hello\", "
                 "\"max_tokens\": %d, \"ignore_eos\": true}", i, max_tokens);
        struct resp r = srv_request(s, "POST", "/v1/completions", body, strlen(body), KEY);
        assert_int_equal(r.status, 200);
        json_t *j = json_loads(r.body, 0, NULL);
        assert_non_null(j);
        json_t *u = json_object_get(j, "usage");
        assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), max_tokens);
        prompt += (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        json_decref(j);
        resp_free(&r);
    }
    return prompt;
}

#define DELTA(series, labels) (sample_sum(after, series, labels) - sample_sum(before, series, labels))

static void metrics_are_valid_and_count_what_requests_did(void **state)
{
    (void)state;
    struct srv s;
    const char *extra[] = {"--api-key", KEY, "--served-model-name", "tiny", NULL};
    assert_int_equal(srv_start(&s, extra), 0);
    char *before = get_metrics(&s); // no key: /metrics is open, like /health
    promtool_check_metrics(before);
    assert_non_null(strstr(before, "model_name=\"tiny\""));

    const int n = 3, max_tokens = 5;
    long prompt = run_requests(&s, n, max_tokens);
    assert_true(srv_wait_idle(&s, 10));
    char *after = get_metrics(&s);
    promtool_check_metrics(after);

    assert_true(DELTA("moeserve:prompt_tokens_total", "") == (double)prompt);
    assert_true(DELTA("moeserve:generation_tokens_total", "") == (double)(n * max_tokens));
    assert_true(DELTA("moeserve:request_success_total", "finished_reason=\"length\"") == n);
    assert_true(DELTA("moeserve:request_success_total", "finished_reason=\"stop\"") == 0);
    assert_true(DELTA("moeserve:time_to_first_token_seconds_count", "") == n);
    assert_true(DELTA("moeserve:e2e_request_latency_seconds_count", "") == n);
    assert_true(DELTA("moeserve:request_queue_time_seconds_count", "") == n);
    // Each request's tokens after its first are inter-token samples.
    assert_true(DELTA("moeserve:inter_token_latency_seconds_count", "") == n * (max_tokens - 1));
    assert_true(DELTA("moeserve:step_duration_seconds_count", "") >= max_tokens);
    // Every step's tokens, prompt and generated, are in the iteration histogram
    // (a request's last sampled token is never fed back).
    assert_true(DELTA("moeserve:iteration_tokens_total_sum", "") ==
                (double)(prompt + n * (max_tokens - 1)));
    assert_true(DELTA("moeserve:prefix_cache_queries_total", "") >= 0);
    // The tiny model routes k experts per token in every MoE layer.
    assert_true(DELTA("moeserve:expert_tokens_total", "rank=\"0\"") > 0);
    assert_true(sample_sum(after, "moeserve:num_requests_running", "") == 0);
    assert_true(sample_sum(after, "moeserve:kv_cache_usage_perc", "rank=\"0\"") >= 0);
    free(before);
    free(after);
    assert_int_equal(srv_stop(&s, SIGTERM, 30), 0);
}

// Under vLLM's names (--metrics-prefix vllm), as its dashboards and
// autoscalers read them: promtool-clean, vLLM's request families moved.
static void two_ranks_report_expert_loads_and_exchanges_per_rank(void **state)
{
    (void)state;
    struct srv s;
    const char *extra[] = {"--api-key", KEY, "--served-model-name", "tiny", "--data-parallel-size", "2",
                           "--enable-expert-parallel", "--threads", "2", "--metrics-prefix", "vllm",
                           NULL};
    assert_int_equal(srv_start(&s, extra), 0);
    run_requests(&s, 2, 4);
    assert_true(srv_wait_idle(&s, 10));
    char *text = get_metrics(&s);
    promtool_check_metrics(text);
    assert_null(strstr(text, "moeserve:"));
    // Both ranks joined every step's exchanges, and both hold experts that ran.
    double a2a0 = sample_sum(text, "vllm:all_to_all_seconds_count", "rank=\"0\"");
    double a2a1 = sample_sum(text, "vllm:all_to_all_seconds_count", "rank=\"1\"");
    assert_true(a2a0 > 0 && a2a0 == a2a1);
    for (int r = 0; r < 2; r++) {
        char rank[16];
        snprintf(rank, sizeof rank, "rank=\"%d\"", r);
        double experts = sample_sum(text, "vllm:expert_tokens_total", rank);
        assert_true(experts > 0);
        // By layer or by expert, a rank's experts took the same tokens.
        assert_true(sample_sum(text, "vllm:expert_layer_tokens_total", rank) == experts);
    }
    double imb = sample_sum(text, "vllm:expert_load_imbalance", "");
    assert_true(imb >= 1.0 && imb <= 2.0);
    assert_true(sample_sum(text, "vllm:kv_cache_usage_perc", "rank=\"1\"") >= 0);
    // vLLM's request families: two requests of 4 generated tokens, max_tokens 4, n 1.
    assert_true(sample_sum(text, "vllm:request_prompt_tokens_count", "") == 2);
    assert_true(sample_sum(text, "vllm:request_generation_tokens_sum", "") == 8);
    assert_true(sample_sum(text, "vllm:request_params_max_tokens_sum", "") == 8);
    assert_true(sample_sum(text, "vllm:request_params_n_sum", "") == 2);
    assert_true(sample_sum(text, "vllm:request_inference_time_seconds_count", "") == 2);
    assert_true(sample_sum(text, "vllm:request_time_per_output_token_seconds_count", "") == 2);
    assert_true(sample_sum(text, "vllm:num_requests_waiting", "") == 0);
    assert_true(sample_sum(text, "vllm:cache_config_info", "block_size=\"16\"") == 1);
    free(text);
    assert_int_equal(srv_stop(&s, SIGTERM, 30), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(metrics_are_valid_and_count_what_requests_did),
        cmocka_unit_test(two_ranks_report_expert_loads_and_exchanges_per_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
