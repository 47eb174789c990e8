// Pins the counters behind /metrics: each observation lands in the bucket
// its value belongs to (negative and NaN ones are not observed), steps
// record all-to-all times and the experts each rank holds, the imbalance
// gauge covers only its sliding window, and a snapshot copies all of it.
// The text rendered from a snapshot is pinned in tests/server/test_prometheus.c.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "scheduler/metrics.h"
#include "tests/metrics_fixture.h"

static void snap(struct metrics *m, struct metrics_snapshot *s)
{
    char err[256];
    assert_int_equal(metrics_take_snapshot(m, s, err, sizeof err), 0);
}

// The observations in the bucket whose upper bound is `bound` (INFINITY:
// the last, open one); fails when the histogram has no such bound.
static uint64_t in_bucket(const struct metrics_hist *h, double bound)
{
    if (isinf(bound)) return h->counts[h->n];
    for (int i = 0; i < h->n; i++)
        if (h->bounds[i] == bound) return h->counts[i];
    fail_msg("no bucket bound %g", bound);
    return 0;
}

static uint64_t all_buckets(const struct metrics_hist *h)
{
    uint64_t n = 0;
    for (int i = 0; i <= h->n; i++) n += h->counts[i];
    return n;
}

static void a_new_object_counts_nothing(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(2, 8, 10);
    struct metrics_snapshot s;
    snap(m, &s);
    assert_int_equal(s.n_ranks, 2);
    assert_int_equal(s.n_experts, 8);
    for (int h = 0; h < METRICS_HISTS; h++) {
        assert_true(s.hist[h].n > 0);
        assert_int_equal(all_buckets(&s.hist[h]), 0);
        assert_int_equal(s.hist[h].count, 0);
        assert_true(s.hist[h].sum == 0.0);
        for (int i = 1; i < s.hist[h].n; i++) assert_true(s.hist[h].bounds[i - 1] < s.hist[h].bounds[i]);
    }
    for (int r = 0; r < 2; r++) assert_int_equal(s.a2a[r].count, 0);
    for (int i = 0; i < 2 * 8; i++) {
        assert_int_equal(s.expert_tokens[i], 0);
        assert_false(s.expert_held[i]);
    }
    assert_true(s.imbalance == 0.0);
    metrics_snapshot_release(&s);
    assert_null(s.expert_tokens);
    metrics_destroy(m);

    m = metrics_fixture_create(1, 0, 0); // dense: no expert arrays
    snap(m, &s);
    assert_null(s.expert_tokens);
    assert_null(s.expert_held);
    metrics_snapshot_release(&s);
    metrics_destroy(m);
}

static void observations_land_in_their_buckets(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(2, 4, 10);
    metrics_fixture_observe(m);
    metrics_observe_first_token(m, 1e9);         // beyond every bound
    metrics_observe_first_token(m, NAN);         // not observed
    metrics_observe_inter_token(m, 0.5, 0);      // no tokens: nothing
    metrics_observe_request(m, &(struct metrics_request){NAN, -1, -1, -1, -1, 0}); // not observed

    struct metrics_snapshot s;
    snap(m, &s);
    const struct metrics_hist *ttft = &s.hist[METRICS_TTFT];
    assert_int_equal(ttft->count, 3);
    assert_int_equal(in_bucket(ttft, 0.02), 0);
    assert_int_equal(in_bucket(ttft, 0.04), 1);
    assert_int_equal(in_bucket(ttft, 5.0), 1);
    assert_int_equal(in_bucket(ttft, INFINITY), 1);
    assert_int_equal(all_buckets(ttft), 3);
    assert_true(fabs(ttft->sum - (3.03 + 1e9)) < 1e-3);
    const struct metrics_hist *itl = &s.hist[METRICS_ITL];
    assert_int_equal(itl->count, 4);
    assert_int_equal(in_bucket(itl, 0.025), 1);
    assert_int_equal(in_bucket(itl, 0.05), 3);
    assert_true(fabs(itl->sum - 0.11) < 1e-12);
    assert_int_equal(s.hist[METRICS_E2E].count, 2);
    assert_int_equal(s.hist[METRICS_QUEUE].count, 1);
    assert_int_equal(s.hist[METRICS_PREFILL].count, 1);
    assert_int_equal(in_bucket(&s.hist[METRICS_DECODE], 5.0), 1);
    assert_int_equal(in_bucket(&s.hist[METRICS_ITER_TOKENS], 64), 1);
    assert_int_equal(in_bucket(&s.hist[METRICS_STEP], 0.005), 1);
    assert_int_equal(in_bucket(&s.a2a[0], 0.001), 1);
    assert_int_equal(in_bucket(&s.a2a[1], 0.0005), 1);
    // Per layer and rank, as the ranks reported them.
    assert_int_equal(s.n_layers, 3);
    assert_int_equal(s.layer_tokens[0 * 3 + 2], 8);
    assert_int_equal(s.layer_tokens[1 * 3 + 0], 1);
    assert_int_equal(s.layer_tokens[1 * 3 + 1], 0);
    // The request's sizes and params; the aborted one had no prompt to count.
    assert_int_equal(s.hist[METRICS_PROMPT_TOKENS].count, 1);
    assert_true(s.hist[METRICS_GEN_TOKENS].sum == 38);
    assert_true(fabs(s.hist[METRICS_INFERENCE].sum - 3.9) < 1e-12);
    assert_true(fabs(s.hist[METRICS_TPOT].sum - 0.1) < 1e-12);
    assert_int_equal(s.hist[METRICS_PARAMS_N].count, 2);
    assert_int_equal(s.hist[METRICS_PARAMS_MAX_TOKENS].count, 1);
    // Each rank reports only the experts it holds.
    assert_int_equal(s.expert_tokens[0 * 4 + 1], 7);
    assert_int_equal(s.expert_tokens[1 * 4 + 3], 3);
    assert_true(s.expert_held[0 * 4 + 0] && s.expert_held[0 * 4 + 1]);
    assert_false(s.expert_held[0 * 4 + 2] || s.expert_held[0 * 4 + 3]);
    assert_false(s.expert_held[1 * 4 + 0] || s.expert_held[1 * 4 + 1]);
    assert_true(s.expert_held[1 * 4 + 2] && s.expert_held[1 * 4 + 3]);
    // Loads 12 and 4: max 12 over mean 8.
    assert_true(fabs(s.imbalance - 1.5) < 1e-12);
    metrics_snapshot_release(&s);
    metrics_destroy(m);
}

static double imbalance(struct metrics *m)
{
    struct metrics_snapshot s;
    snap(m, &s);
    double v = s.imbalance;
    metrics_snapshot_release(&s);
    return v;
}

static void imbalance_forgets_steps_older_than_the_window(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(2, 2, 3);
    assert_true(imbalance(m) == 0.0);
    uint64_t a[2] = {0, 0}, b[2] = {0, 0};
    struct metrics_step s = {.n_ranks = 2};
    s.rank[0].expert_tokens = a;
    s.rank[0].expert_begin = 0;
    s.rank[0].expert_end = 1;
    s.rank[1].expert_tokens = b;
    s.rank[1].expert_begin = 1;
    s.rank[1].expert_end = 2;
    // One skewed step: rank 0 gets everything.
    a[0] = 30;
    metrics_observe_step(m, &s);
    assert_true(fabs(imbalance(m) - 2.0) < 1e-12);
    // Three balanced steps push it out of the 3-step window.
    for (int i = 1; i <= 3; i++) {
        a[0] += 10;
        b[1] += 10;
        metrics_observe_step(m, &s);
    }
    assert_true(fabs(imbalance(m) - 1.0) < 1e-12);
    // One more skewed toward rank 1: loads 20 and 30 over the window.
    b[1] += 10;
    metrics_observe_step(m, &s);
    assert_true(fabs(imbalance(m) - 30.0 / 25.0) < 1e-12);
    metrics_destroy(m);
}

static void a_snapshot_is_a_copy(void **state)
{
    (void)state;
    struct metrics *m = metrics_fixture_create(1, 2, 10);
    uint64_t e[2] = {4, 6};
    struct metrics_step st = {.seconds = 0.002, .tokens = 3, .n_ranks = 1};
    st.rank[0].expert_tokens = e;
    st.rank[0].expert_end = 2;
    metrics_observe_step(m, &st);
    struct metrics_snapshot s;
    snap(m, &s);
    e[0] = 40;
    metrics_observe_step(m, &st);
    metrics_observe_first_token(m, 0.5);
    // The first snapshot still holds the moment it was taken.
    assert_int_equal(s.hist[METRICS_STEP].count, 1);
    assert_int_equal(s.hist[METRICS_TTFT].count, 0);
    assert_int_equal(s.expert_tokens[0], 4);
    metrics_snapshot_release(&s);
    snap(m, &s);
    assert_int_equal(s.hist[METRICS_STEP].count, 2);
    assert_int_equal(s.hist[METRICS_TTFT].count, 1);
    assert_int_equal(s.expert_tokens[0], 40);
    metrics_snapshot_release(&s);
    metrics_destroy(m);
}

static void bad_options_are_refused(void **state)
{
    (void)state;
    struct metrics_opts o = {.n_ranks = 0};
    struct metrics *m;
    char err[256];
    assert_int_equal(metrics_create(&o, &m, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "ranks"));
    o.n_ranks = METRICS_MAX_RANKS + 1;
    assert_int_equal(metrics_create(&o, &m, err, sizeof err), MS_EINVAL);
    o.n_ranks = 1;
    o.n_experts = -1;
    assert_int_equal(metrics_create(&o, &m, err, sizeof err), MS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_new_object_counts_nothing),
        cmocka_unit_test(observations_land_in_their_buckets),
        cmocka_unit_test(imbalance_forgets_steps_older_than_the_window),
        cmocka_unit_test(a_snapshot_is_a_copy),
        cmocka_unit_test(bad_options_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
