// Pins the KV block manager: reference counts, prefix-cache hits on full
// blocks chained over the prefix, LRU eviction order, and block accounting.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "scheduler/kv_blocks.h"

#define B KV_BLOCK_TOKENS

static void check_ok(const struct kv_blocks *kv, const struct kvb_table *const *t, int n)
{
    char err[256] = "";
    int rc = kvb_check(kv, t, n, err, sizeof err);
    if (rc) fail_msg("%s", err);
}

static void fill(int32_t *tok, int n, int32_t base)
{
    for (int i = 0; i < n; i++) tok[i] = base + i;
}

static void blocks_return_to_the_pool_after_release(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(8, true, &kv, err, sizeof err), 0);
    struct kvb_table t;
    assert_int_equal(kvb_table_init(&t, 100), 0);
    assert_int_equal(kvb_reserve(kv, &t, 33), 0);
    assert_int_equal(t.n, 3);
    assert_int_equal(kvb_num_used(kv), 3);
    assert_int_equal(kvb_num_free(kv), 5);
    const struct kvb_table *tabs[] = {&t};
    check_ok(kv, tabs, 1);
    // Growing within the last block takes nothing new.
    assert_int_equal(kvb_reserve(kv, &t, 48), 0);
    assert_int_equal(t.n, 3);
    kvb_release_all(kv, &t);
    assert_int_equal(kvb_num_used(kv), 0);
    assert_int_equal(kvb_num_free(kv), 8);
    assert_int_equal(kvb_num_cached(kv), 0); // nothing was committed
    check_ok(kv, tabs, 1);
    kvb_table_free(&t);
    kvb_destroy(kv);
}

static void reserve_is_all_or_nothing(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(4, true, &kv, err, sizeof err), 0);
    struct kvb_table a, b;
    assert_int_equal(kvb_table_init(&a, 1000), 0);
    assert_int_equal(kvb_table_init(&b, 1000), 0);
    assert_int_equal(kvb_reserve(kv, &a, 3 * B), 0);
    assert_int_equal(kvb_reserve(kv, &b, 2 * B), MS_ENOFIT);
    assert_int_equal(b.n, 0);
    assert_int_equal(kvb_num_free(kv), 1);
    assert_int_equal(kvb_reachable_tokens(kv, &b), B);
    assert_int_equal(kvb_reachable_tokens(kv, &a), 4 * B);
    // A table's capacity bounds it too.
    struct kvb_table small;
    assert_int_equal(kvb_table_init(&small, B), 0);
    assert_int_equal(kvb_reserve(kv, &small, B + 1), MS_ENOFIT);
    const struct kvb_table *tabs[] = {&a, &b, &small};
    check_ok(kv, tabs, 3);
    kvb_release_all(kv, &a);
    kvb_table_free(&a);
    kvb_table_free(&b);
    kvb_table_free(&small);
    kvb_destroy(kv);
}

static void full_blocks_of_a_shared_prefix_are_reused(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(16, true, &kv, err, sizeof err), 0);
    int32_t ta[50], tb[50];
    fill(ta, 50, 100);
    memcpy(tb, ta, sizeof tb);
    tb[40] = 7; // differs in the third block
    struct kvb_table a, b;
    assert_int_equal(kvb_table_init(&a, 50), 0);
    assert_int_equal(kvb_table_init(&b, 50), 0);
    assert_int_equal(kvb_match_prefix(kv, &a, ta, 49), 0);
    assert_int_equal(kvb_reserve(kv, &a, 50), 0);
    kvb_commit(kv, &a, ta, 50); // three full blocks, one partial
    assert_int_equal(a.n_committed, 3);
    // While a still runs, b shares its first two full blocks.
    assert_int_equal(kvb_match_prefix(kv, &b, tb, 49), 2 * B);
    assert_int_equal(b.ids[0], a.ids[0]);
    assert_int_equal(b.ids[1], a.ids[1]);
    assert_int_equal(kvb_num_used(kv), 4);
    assert_int_equal(kvb_reserve(kv, &b, 50), 0);
    assert_int_not_equal(b.ids[2], a.ids[2]);
    const struct kvb_table *tabs[] = {&a, &b};
    check_ok(kv, tabs, 2);
    // Releasing a keeps the shared blocks for b; a's own full block is cached.
    kvb_release_all(kv, &a);
    assert_int_equal(kvb_num_used(kv), 4);
    assert_int_equal(kvb_num_cached(kv), 1);
    check_ok(kv, tabs, 2);
    kvb_release_all(kv, &b);
    assert_int_equal(kvb_num_used(kv), 0);
    assert_int_equal(kvb_num_cached(kv), 3); // b committed nothing of its own
    // The whole of a is found again, but never beyond max_tokens.
    assert_int_equal(kvb_match_prefix(kv, &a, ta, 47), 2 * B);
    kvb_release_all(kv, &a);
    assert_int_equal(kvb_match_prefix(kv, &a, ta, 48), 3 * B);
    kvb_release_all(kv, &a);
    check_ok(kv, tabs, 2);
    kvb_table_free(&a);
    kvb_table_free(&b);
    kvb_destroy(kv);
}

static void equal_blocks_after_different_prefixes_do_not_match(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(8, true, &kv, err, sizeof err), 0);
    int32_t ta[2 * B], tb[2 * B];
    fill(ta, 2 * B, 1);
    memcpy(tb, ta, sizeof tb);
    tb[3] = 999; // first block differs, second block is identical
    struct kvb_table a, b;
    assert_int_equal(kvb_table_init(&a, 2 * B), 0);
    assert_int_equal(kvb_table_init(&b, 2 * B), 0);
    assert_int_equal(kvb_reserve(kv, &a, 2 * B), 0);
    kvb_commit(kv, &a, ta, 2 * B);
    kvb_release_all(kv, &a);
    assert_int_equal(kvb_match_prefix(kv, &b, tb, 2 * B), 0);
    assert_int_equal(b.n, 0);
    kvb_table_free(&a);
    kvb_table_free(&b);
    kvb_destroy(kv);
}

static void eviction_takes_the_least_recently_released_tail_first(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(4, true, &kv, err, sizeof err), 0);
    int32_t ta[2 * B], tb[2 * B];
    fill(ta, 2 * B, 10);
    fill(tb, 2 * B, 5000);
    struct kvb_table a, b, c;
    assert_int_equal(kvb_table_init(&a, 2 * B), 0);
    assert_int_equal(kvb_table_init(&b, 2 * B), 0);
    assert_int_equal(kvb_table_init(&c, 4 * B), 0);
    assert_int_equal(kvb_reserve(kv, &a, 2 * B), 0);
    kvb_commit(kv, &a, ta, 2 * B);
    assert_int_equal(kvb_reserve(kv, &b, 2 * B), 0);
    kvb_commit(kv, &b, tb, 2 * B);
    int32_t a0 = a.ids[0], a1 = a.ids[1];
    kvb_release_all(kv, &a); // LRU: a1, a0
    kvb_release_all(kv, &b); // LRU: a1, a0, b1, b0
    assert_int_equal(kvb_num_cached(kv), 4);
    assert_int_equal(kvb_num_free(kv), 4);
    // One new block evicts a's tail; a's head still matches.
    assert_int_equal(kvb_reserve(kv, &c, 1), 0);
    assert_int_equal(c.ids[0], a1);
    struct kvb_table probe;
    assert_int_equal(kvb_table_init(&probe, 2 * B), 0);
    assert_int_equal(kvb_match_prefix(kv, &probe, ta, 2 * B), B);
    assert_int_equal(probe.ids[0], a0);
    // Touching a0 again makes b's blocks the oldest.
    kvb_release_all(kv, &probe);
    assert_int_equal(kvb_reserve(kv, &c, 3 * B), 0);
    assert_int_equal(kvb_match_prefix(kv, &probe, tb, 2 * B), 0);
    assert_int_equal(kvb_match_prefix(kv, &probe, ta, 2 * B), B);
    kvb_release_all(kv, &probe);
    const struct kvb_table *tabs[] = {&a, &b, &c, &probe};
    check_ok(kv, tabs, 4);
    kvb_release_all(kv, &c);
    check_ok(kv, tabs, 4);
    kvb_table_free(&a);
    kvb_table_free(&b);
    kvb_table_free(&c);
    kvb_table_free(&probe);
    kvb_destroy(kv);
}

// Children are always evicted before their parent, so a cached chain is
// matchable from its head while its tail goes block by block.
static void a_chain_shrinks_from_its_tail_under_pressure(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(4, true, &kv, err, sizeof err), 0);
    int32_t ta[4 * B + 1];
    fill(ta, 4 * B + 1, 77);
    struct kvb_table a, other, probe;
    assert_int_equal(kvb_table_init(&a, 4 * B + 1), 0);
    assert_int_equal(kvb_table_init(&other, 4 * B), 0);
    assert_int_equal(kvb_table_init(&probe, 4 * B + 1), 0);
    assert_int_equal(kvb_reserve(kv, &a, 4 * B), 0);
    kvb_commit(kv, &a, ta, 4 * B);
    kvb_release_all(kv, &a);
    const struct kvb_table *tabs[] = {&a, &other, &probe};
    for (int kept = 4; kept >= 0; kept--) {
        assert_int_equal(kvb_match_prefix(kv, &probe, ta, 4 * B + 1), kept * B);
        kvb_release_all(kv, &probe);
        check_ok(kv, tabs, 3);
        if (kept > 0) assert_int_equal(kvb_reserve(kv, &other, (4 - kept + 1) * B), 0);
    }
    // A fresh chain reusing the same ids with other tokens never matches a's.
    int32_t tb[4 * B];
    fill(tb, 4 * B, 9000);
    kvb_commit(kv, &other, tb, 4 * B);
    kvb_release_all(kv, &other);
    assert_int_equal(kvb_match_prefix(kv, &probe, ta, 4 * B), 0);
    assert_int_equal(kvb_match_prefix(kv, &probe, tb, 4 * B), 4 * B);
    kvb_release_all(kv, &probe);
    check_ok(kv, tabs, 3);
    kvb_table_free(&a);
    kvb_table_free(&other);
    kvb_table_free(&probe);
    kvb_destroy(kv);
}

static void concurrent_duplicates_converge_on_one_block(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(8, true, &kv, err, sizeof err), 0);
    int32_t tk[2 * B + 3];
    fill(tk, 2 * B + 3, 40);
    struct kvb_table a, b;
    assert_int_equal(kvb_table_init(&a, 64), 0);
    assert_int_equal(kvb_table_init(&b, 64), 0);
    assert_int_equal(kvb_reserve(kv, &a, 2 * B + 3), 0);
    assert_int_equal(kvb_reserve(kv, &b, 2 * B + 3), 0);
    assert_int_equal(kvb_num_used(kv), 6);
    kvb_commit(kv, &a, tk, 2 * B + 3);
    kvb_commit(kv, &b, tk, 2 * B + 3);
    assert_int_equal(b.ids[0], a.ids[0]);
    assert_int_equal(b.ids[1], a.ids[1]);
    assert_int_not_equal(b.ids[2], a.ids[2]);
    assert_int_equal(kvb_num_used(kv), 4);
    const struct kvb_table *tabs[] = {&a, &b};
    check_ok(kv, tabs, 2);
    kvb_release_all(kv, &a);
    kvb_release_all(kv, &b);
    assert_int_equal(kvb_num_cached(kv), 2);
    check_ok(kv, tabs, 2);
    kvb_table_free(&a);
    kvb_table_free(&b);
    kvb_destroy(kv);
}

static void prefix_caching_off_never_matches_or_keeps(void **state)
{
    (void)state;
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(8, false, &kv, err, sizeof err), 0);
    assert_false(kvb_prefix_caching(kv));
    int32_t tk[3 * B];
    fill(tk, 3 * B, 3);
    struct kvb_table a;
    assert_int_equal(kvb_table_init(&a, 3 * B), 0);
    assert_int_equal(kvb_reserve(kv, &a, 3 * B), 0);
    kvb_commit(kv, &a, tk, 3 * B);
    kvb_release_all(kv, &a);
    assert_int_equal(kvb_num_cached(kv), 0);
    assert_int_equal(kvb_match_prefix(kv, &a, tk, 3 * B), 0);
    assert_int_equal(kvb_num_free(kv), 8);
    kvb_table_free(&a);
    kvb_destroy(kv);
}

static void bad_pool_sizes_are_refused(void **state)
{
    (void)state;
    struct kv_blocks *kv = (struct kv_blocks *)1;
    char err[256] = "";
    assert_int_equal(kvb_create(0, true, &kv, err, sizeof err), MS_EINVAL);
    assert_null(kv);
    assert_non_null(strstr(err, "0"));
    assert_int_equal(kvb_create(-5, true, &kv, err, sizeof err), MS_EINVAL);
}

// Thousands of random admissions (with prefix matches over a few shared
// prefixes), growths, commits and releases; after each the invariants hold,
// and at the end every block is free or cached.
static void random_events_keep_every_block_accounted_for(void **state)
{
    (void)state;
    enum { N_SEQ = 12, MAXT = 200, N_BLOCKS = 40 };
    struct kv_blocks *kv;
    char err[256];
    assert_int_equal(kvb_create(N_BLOCKS, true, &kv, err, sizeof err), 0);
    struct kvb_table tab[N_SEQ];
    int32_t tok[N_SEQ][MAXT];
    int len[N_SEQ], computed[N_SEQ];
    bool live[N_SEQ];
    const struct kvb_table *tabs[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) {
        assert_int_equal(kvb_table_init(&tab[i], MAXT), 0);
        tabs[i] = &tab[i];
        live[i] = false;
    }
    uint64_t rng = 12345;
    int hits = 0;
    for (int step = 0; step < 6000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(rng >> 33);
        int s = (int)(r % N_SEQ);
        if (!live[s]) {
            // New sequence: one of three prefixes, then its own tokens.
            len[s] = 1 + (int)((r >> 8) % MAXT);
            int family = (int)((r >> 16) % 3);
            for (int i = 0; i < len[s]; i++)
                tok[s][i] = i < 3 * B + family * 5 ? family * 1000 + i : (int32_t)(r + i);
            computed[s] = kvb_match_prefix(kv, &tab[s], tok[s], len[s] - 1);
            hits += computed[s] > 0;
            live[s] = true;
        } else if ((r >> 8) % 5 == 0) {
            kvb_release_all(kv, &tab[s]);
            live[s] = false;
        } else if (computed[s] < len[s]) {
            int chunk = 1 + (int)((r >> 12) % 40);
            if (computed[s] + chunk > len[s]) chunk = len[s] - computed[s];
            int reach = kvb_reachable_tokens(kv, &tab[s]);
            if (computed[s] + chunk > reach) chunk = reach - computed[s];
            if (chunk > 0) {
                assert_int_equal(kvb_reserve(kv, &tab[s], computed[s] + chunk), 0);
                computed[s] += chunk;
                kvb_commit(kv, &tab[s], tok[s], computed[s]);
            } else {
                // Out of blocks: preempt, as the engine does.
                kvb_release_all(kv, &tab[s]);
                live[s] = false;
            }
        }
        check_ok(kv, tabs, N_SEQ);
    }
    assert_true(hits > 100);
    for (int i = 0; i < N_SEQ; i++) kvb_release_all(kv, &tab[i]);
    assert_int_equal(kvb_num_used(kv), 0);
    assert_int_equal(kvb_num_free(kv), N_BLOCKS);
    check_ok(kv, tabs, N_SEQ);
    for (int i = 0; i < N_SEQ; i++) kvb_table_free(&tab[i]);
    kvb_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blocks_return_to_the_pool_after_release),
        cmocka_unit_test(reserve_is_all_or_nothing),
        cmocka_unit_test(full_blocks_of_a_shared_prefix_are_reused),
        cmocka_unit_test(equal_blocks_after_different_prefixes_do_not_match),
        cmocka_unit_test(eviction_takes_the_least_recently_released_tail_first),
        cmocka_unit_test(a_chain_shrinks_from_its_tail_under_pressure),
        cmocka_unit_test(concurrent_duplicates_converge_on_one_block),
        cmocka_unit_test(prefix_caching_off_never_matches_or_keeps),
        cmocka_unit_test(bad_pool_sizes_are_refused),
        cmocka_unit_test(random_events_keep_every_block_accounted_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
