// metrics_fixture: one set of observations on 2 ranks and 4 experts that
// the counter test (tests/scheduler/test_metrics.c) and the text test
// (tests/server/test_prometheus.c) both start from; what each asserts
// follows from the values here. Include it after cmocka.h and
// scheduler/metrics.h.
#ifndef MOESERVE_TESTS_METRICS_FIXTURE_H
#define MOESERVE_TESTS_METRICS_FIXTURE_H

// A metrics object the test destroys.
static struct metrics *metrics_fixture_create(int ranks, int experts, int window)
{
    struct metrics_opts o = {.n_ranks = ranks, .n_experts = experts, .n_layers = 3,
                             .imbalance_window = window, .max_model_len = 4096};
    struct metrics *m;
    char err[256];
    if (metrics_create(&o, &m, err, sizeof err)) fail_msg("%s", err);
    return m;
}

// m: 2 ranks, 4 experts. TTFT 0.03 and 3.0; inter-token 0.02 once and
// 0.09 over 3 tokens (0.03 each); one request of e2e 4.0 / queue 0.1 /
// prefill 0.2 / decode 3.7 (30 prompt tokens, 38 generated: inference 3.9,
// 0.1 per output token after the first) and one aborted before it ran (e2e
// 1.0 only); requests with n 2 and max_tokens 100, and n 1 without one;
// one step of 0.004 s and 48 tokens in which rank 0 (experts 0-1, loads 5
// and 7) spent 0.001 s in all-to-all and rank 1 (experts 2-3, loads 1 and
// 3) 0.0003 s: loads 12 and 4, imbalance 1.5; by layer (3 layers, the
// second dense) rank 0 took 4, 0, 8 and rank 1 1, 0, 3.
static void metrics_fixture_observe(struct metrics *m)
{
    metrics_observe_first_token(m, 0.03);
    metrics_observe_first_token(m, 3.0);
    metrics_observe_inter_token(m, 0.02, 1);
    metrics_observe_inter_token(m, 0.09, 3);
    metrics_observe_request(m, &(struct metrics_request){4.0, 0.1, 0.2, 3.7, 30, 38});
    metrics_observe_request(m, &(struct metrics_request){1.0, -1, -1, -1, -1, 0});
    metrics_observe_params(m, 2, 100);
    metrics_observe_params(m, 1, 0);
    static const uint64_t e0[4] = {5, 7, 0, 0}, e1[4] = {0, 0, 1, 3};
    static const uint64_t l0[3] = {4, 0, 8}, l1[3] = {1, 0, 3};
    struct metrics_step s = {.seconds = 0.004, .tokens = 48, .n_ranks = 2};
    s.rank[0].a2a_seconds = 0.001;
    s.rank[0].expert_tokens = e0;
    s.rank[0].expert_begin = 0;
    s.rank[0].expert_end = 2;
    s.rank[1].a2a_seconds = 0.0003;
    s.rank[1].expert_tokens = e1;
    s.rank[1].expert_begin = 2;
    s.rank[1].expert_end = 4;
    s.rank[0].layer_tokens = l0;
    s.rank[1].layer_tokens = l1;
    metrics_observe_step(m, &s);
}

#endif
