// Pins the /metrics text rendered from real counters: valid for `promtool
// check metrics` (whose only complaints may be about vLLM's naming), every
// series present at zero, histogram buckets cumulative, engine gauges and
// counters as given, expert counters only under the rank that holds them,
// and label values escaped.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "scheduler/metrics.h"
#include "server/prometheus.h"
#include "tests/metrics_fixture.h"
#include "tests/server/promtool.h"

static char *render(const char *model, struct metrics *m, const struct engine_stats *st)
{
    struct metrics_snapshot ms;
    char *out, err[256];
    size_t len;
    assert_int_equal(metrics_take_snapshot(m, &ms, err, sizeof err), 0);
    struct prometheus_page pg = {.model_name = model, .cache_dtype = "bfloat16",
                                 .enable_prefix_caching = true, .gpu_memory_utilization = 0.9};
    assert_int_equal(prometheus_render(&pg, st, &ms, &out, &len, err, sizeof err), 0);
    metrics_snapshot_release(&ms);
    assert_int_equal(strlen(out), len);
    return out;
}

static void assert_line(const char *text, const char *line)
{
    char want[512];
    snprintf(want, sizeof want, "\n%s\n", line);
    if (!strstr(text, want)) fail_msg("line '%s' missing from:\n%s", line, text);
}

static void a_fresh_engine_renders_every_series_at_zero(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(2, 8, 10);
    struct engine_stats st = {0};
    st.n_ranks = 2;
    st.rank[0].kv_blocks_total = st.rank[1].kv_blocks_total = 100;
    char *t = render("qwen3", m, &st);
    const char *names[] = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                           "prefix_cache_queries_total", "prefix_cache_hits_total",
                           "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
                           "request_success_total", "time_to_first_token_seconds",
                           "inter_token_latency_seconds", "e2e_request_latency_seconds",
                           "request_queue_time_seconds", "iteration_tokens_total",
                           "all_to_all_seconds", "step_duration_seconds", "expert_load_imbalance",
                           "step_phase_seconds_total"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char type[128];
        snprintf(type, sizeof type, "# TYPE moeserve:%s ", names[i]);
        if (!strstr(t, type)) fail_msg("%s missing", names[i]);
    }
    assert_line(t, "moeserve:kv_cache_usage_perc{model_name=\"qwen3\",rank=\"1\"} 0");
    assert_line(t, "moeserve:request_success_total{model_name=\"qwen3\",finished_reason=\"length\"} 0");
    assert_line(t, "moeserve:all_to_all_seconds_count{model_name=\"qwen3\",rank=\"1\"} 0");
    assert_line(t, "moeserve:step_phase_seconds_total{model_name=\"qwen3\",rank=\"1\",phase=\"sampling\"} 0.000000");
    promtool_check_metrics(t);
    free(t);
    metrics_destroy(m);
}

static void observations_move_the_series(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(2, 4, 10);
    metrics_fixture_observe(m);
    struct engine_stats st = {0};
    st.n_ranks = 2;
    st.num_running = 3;
    st.num_waiting = 1;
    st.rank[0].kv_blocks_total = 200;
    st.rank[0].kv_blocks_used = 50;
    st.rank[1].kv_blocks_total = 200;
    st.prompt_tokens_total = 1234;
    st.generation_tokens_total = 99;
    st.request_success[FINISH_STOP] = 2;
    st.request_success[FINISH_ABORT] = 1;
    st.prefix_cache_queries = 1000;
    st.prefix_cache_hits = 250;
    st.rank[1].phase_seconds[ENGINE_PHASE_LM_HEAD] = 1.25;
    st.rank[0].phase_seconds[ENGINE_PHASE_MOE] = 0.5;
    char *t = render("qwen3", m, &st);
    assert_line(t, "moeserve:step_phase_seconds_total{model_name=\"qwen3\",rank=\"1\",phase=\"lm_head\"} 1.250000");
    assert_line(t, "moeserve:step_phase_seconds_total{model_name=\"qwen3\",rank=\"0\",phase=\"moe\"} 0.500000");
    assert_line(t, "moeserve:step_phase_seconds_total{model_name=\"qwen3\",rank=\"0\",phase=\"attention\"} 0.000000");
    assert_line(t, "moeserve:num_requests_running{model_name=\"qwen3\"} 3");
    assert_line(t, "moeserve:kv_cache_usage_perc{model_name=\"qwen3\",rank=\"0\"} 0.25");
    assert_line(t, "moeserve:prompt_tokens_total{model_name=\"qwen3\"} 1234");
    assert_line(t, "moeserve:prefix_cache_hits_total{model_name=\"qwen3\"} 250");
    assert_line(t, "moeserve:request_success_total{model_name=\"qwen3\",finished_reason=\"stop\"} 2");
    assert_line(t, "moeserve:request_success_total{model_name=\"qwen3\",finished_reason=\"abort\"} 1");
    // Buckets are cumulative: 0.03 <= 0.04, 3.0 <= 5.0.
    assert_line(t, "moeserve:time_to_first_token_seconds_bucket{model_name=\"qwen3\",le=\"0.02\"} 0");
    assert_line(t, "moeserve:time_to_first_token_seconds_bucket{model_name=\"qwen3\",le=\"0.04\"} 1");
    assert_line(t, "moeserve:time_to_first_token_seconds_bucket{model_name=\"qwen3\",le=\"2.5\"} 1");
    assert_line(t, "moeserve:time_to_first_token_seconds_bucket{model_name=\"qwen3\",le=\"5\"} 2");
    assert_line(t, "moeserve:time_to_first_token_seconds_bucket{model_name=\"qwen3\",le=\"+Inf\"} 2");
    assert_line(t, "moeserve:time_to_first_token_seconds_count{model_name=\"qwen3\"} 2");
    assert_line(t, "moeserve:time_to_first_token_seconds_sum{model_name=\"qwen3\"} 3.03");
    assert_line(t, "moeserve:inter_token_latency_seconds_count{model_name=\"qwen3\"} 4");
    assert_line(t, "moeserve:inter_token_latency_seconds_bucket{model_name=\"qwen3\",le=\"0.025\"} 1");
    assert_line(t, "moeserve:inter_token_latency_seconds_bucket{model_name=\"qwen3\",le=\"0.05\"} 4");
    assert_line(t, "moeserve:e2e_request_latency_seconds_count{model_name=\"qwen3\"} 2");
    assert_line(t, "moeserve:request_queue_time_seconds_count{model_name=\"qwen3\"} 1");
    assert_line(t, "moeserve:iteration_tokens_total_bucket{model_name=\"qwen3\",le=\"32\"} 0");
    assert_line(t, "moeserve:iteration_tokens_total_bucket{model_name=\"qwen3\",le=\"64\"} 1");
    assert_line(t, "moeserve:all_to_all_seconds_bucket{model_name=\"qwen3\",rank=\"1\",le=\"0.0005\"} 1");
    assert_line(t, "moeserve:all_to_all_seconds_bucket{model_name=\"qwen3\",rank=\"0\",le=\"0.0005\"} 0");
    assert_line(t, "moeserve:expert_tokens_total{model_name=\"qwen3\",rank=\"0\",expert=\"1\"} 7");
    assert_line(t, "moeserve:expert_tokens_total{model_name=\"qwen3\",rank=\"1\",expert=\"3\"} 3");
    // Only the experts a rank holds appear under it.
    assert_null(strstr(t, "rank=\"0\",expert=\"2\""));
    assert_null(strstr(t, "rank=\"1\",expert=\"0\""));
    // Loads 12 and 4: max 12 over mean 8.
    assert_line(t, "moeserve:expert_load_imbalance{model_name=\"qwen3\"} 1.5");
    promtool_check_metrics(t);
    free(t);
    metrics_destroy(m);
}

// --metrics-prefix vllm: every series under vLLM's prefix, and the families
// vLLM has that the engine feeds (request sizes and params, inference time,
// time per output token, cache_config_info) with the fixture's values.
static void the_vllm_prefix_names_every_series_as_vllm_does(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(2, 4, 10);
    metrics_fixture_observe(m);
    struct engine_stats st = {0};
    st.n_ranks = 2;
    st.num_waiting = 7;
    st.rank[0].kv_blocks_total = st.rank[1].kv_blocks_total = 100;
    struct metrics_snapshot ms;
    char *t, err[256];
    size_t len;
    assert_int_equal(metrics_take_snapshot(m, &ms, err, sizeof err), 0);
    struct prometheus_page pg = {.prefix = "vllm", .model_name = "qwen3", .cache_dtype = "bfloat16",
                                 .enable_prefix_caching = true, .gpu_memory_utilization = 0.9};
    assert_int_equal(prometheus_render(&pg, &st, &ms, &t, &len, err, sizeof err), 0);
    metrics_snapshot_release(&ms);
    assert_null(strstr(t, "moeserve:"));
    const char *vllm[] = {"num_requests_waiting gauge", "num_requests_running gauge",
                          "kv_cache_usage_perc gauge", "prompt_tokens_total counter",
                          "generation_tokens_total counter", "request_success_total counter",
                          "time_to_first_token_seconds histogram",
                          "inter_token_latency_seconds histogram",
                          "e2e_request_latency_seconds histogram",
                          "request_queue_time_seconds histogram",
                          "request_prefill_time_seconds histogram",
                          "request_decode_time_seconds histogram",
                          "request_inference_time_seconds histogram",
                          "request_time_per_output_token_seconds histogram",
                          "request_prompt_tokens histogram", "request_generation_tokens histogram",
                          "request_params_n histogram", "request_params_max_tokens histogram",
                          "cache_config_info gauge", "prefix_cache_queries_total counter",
                          "prefix_cache_hits_total counter", "num_preemptions_total counter"};
    for (size_t i = 0; i < sizeof vllm / sizeof vllm[0]; i++) {
        char type[128];
        snprintf(type, sizeof type, "# TYPE vllm:%s\n", vllm[i]);
        if (!strstr(t, type)) fail_msg("'%s' missing", type);
    }
    assert_line(t, "vllm:num_requests_waiting{model_name=\"qwen3\"} 7");
    assert_line(t, "vllm:cache_config_info{model_name=\"qwen3\",block_size=\"16\",cache_dtype=\"bfloat16\","
                   "enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"200\"} 1");
    // One request ran: 30 prompt tokens, 38 generated, prefill 0.2 + decode 3.7.
    assert_line(t, "vllm:request_prompt_tokens_sum{model_name=\"qwen3\"} 30");
    assert_line(t, "vllm:request_prompt_tokens_count{model_name=\"qwen3\"} 1");
    assert_line(t, "vllm:request_prompt_tokens_bucket{model_name=\"qwen3\",le=\"20\"} 0");
    assert_line(t, "vllm:request_prompt_tokens_bucket{model_name=\"qwen3\",le=\"50\"} 1");
    assert_line(t, "vllm:request_generation_tokens_sum{model_name=\"qwen3\"} 38");
    assert_line(t, "vllm:request_inference_time_seconds_sum{model_name=\"qwen3\"} 3.9");
    assert_line(t, "vllm:request_time_per_output_token_seconds_sum{model_name=\"qwen3\"} 0.1");
    // The token histograms stop at the first 1-2-5 bound at or above max_model_len (4096).
    assert_line(t, "vllm:request_prompt_tokens_bucket{model_name=\"qwen3\",le=\"5000\"} 1");
    assert_null(strstr(t, "vllm:request_prompt_tokens_bucket{model_name=\"qwen3\",le=\"10000\"}"));
    // n 2 with max_tokens 100, n 1 without.
    assert_line(t, "vllm:request_params_n_sum{model_name=\"qwen3\"} 3");
    assert_line(t, "vllm:request_params_n_count{model_name=\"qwen3\"} 2");
    assert_line(t, "vllm:request_params_max_tokens_sum{model_name=\"qwen3\"} 100");
    assert_line(t, "vllm:request_params_max_tokens_count{model_name=\"qwen3\"} 1");
    // The MoE series keep their own names under the prefix; per layer too.
    assert_line(t, "vllm:expert_layer_tokens_total{model_name=\"qwen3\",rank=\"0\",layer=\"2\"} 8");
    assert_line(t, "vllm:expert_layer_tokens_total{model_name=\"qwen3\",rank=\"1\",layer=\"0\"} 1");
    promtool_check_metrics(t);
    free(t);
    metrics_destroy(m);
}

static void label_values_are_escaped(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(1, 0, 0);
    struct engine_stats st = {0};
    st.n_ranks = 1;
    char *t = render("we\"ird\\na\nme", m, &st);
    assert_non_null(strstr(t, "model_name=\"we\\\"ird\\\\na\\nme\""));
    assert_null(strstr(t, "expert_tokens_total")); // dense: no expert series
    promtool_check_metrics(t);
    free(t);
    metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_fresh_engine_renders_every_series_at_zero),
        cmocka_unit_test(observations_move_the_series),
        cmocka_unit_test(the_vllm_prefix_names_every_series_as_vllm_does),
        cmocka_unit_test(label_values_are_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
