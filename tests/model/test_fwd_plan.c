// model/fwd_plan.h on the CPU: the routing sort keeps each expert's pairs
// in token order within its padded rows, leaves out other experts' pairs and
// dead tokens, and stays within its row bound for every routing; a padded
// row maps back to its expert; the owner of an expert and the row a pair
// comes back at in a fixed-size exchange; decode buckets are the smallest
// bucket that holds a batch.
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "model/fwd_plan.h"

static uint64_t rng = 88172645463325252ull;

static uint32_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

// Checks one routing against its definition, pair by pair and row by row.
static void check_route(const int32_t *ids, const int32_t *live, int T, int k, int e0, int e1, int pad)
{
    const int n = e1 - e0, P = T * k, cap = fwd_plan_route_rows(P, n, pad);
    int32_t *off = calloc((size_t)n + 1, sizeof *off), *count = calloc((size_t)n + 1, sizeof *count);
    int32_t *slot = calloc((size_t)P + 1, sizeof *slot), *cursor = calloc((size_t)n + 1, sizeof *cursor);
    int32_t *token = malloc(((size_t)cap + 1) * sizeof *token), *pair = malloc(((size_t)cap + 1) * sizeof *pair);
    assert_true(off && count && slot && cursor && token && pair);
    memset(token, 0x5a, ((size_t)cap + 1) * sizeof *token); // rows past the end stay untouched
    fwd_plan_route(ids, live, T, k, e0, e1, pad, off, count, slot, token, pair, cursor);
    assert_int_equal(off[0], 0);
    assert_true(off[n] <= cap);
    assert_int_equal(token[cap], 0x5a5a5a5a);
    for (int g = 0; g < n; g++) {
        assert_int_equal((off[g + 1] - off[g]) % pad, 0);
        assert_int_equal(off[g + 1] - off[g], fwd_plan_padded(count[g], pad));
        int last = -1;
        for (int r = off[g]; r < off[g + 1]; r++) {
            assert_int_equal(fwd_plan_group_of_row(off, n, r) == g || count[g] == 0, 1);
            if (r < off[g] + count[g]) {
                assert_true(token[r] > last); // tokens ascend within the expert
                last = token[r];
                assert_int_equal(pair[r] / k, token[r]);
                assert_int_equal(ids[pair[r]], e0 + g);
                assert_int_equal(slot[pair[r]], r);
            } else {
                assert_int_equal(token[r], -1); // padding
                assert_int_equal(pair[r], -1);
            }
        }
        // The expert of a non-empty group's rows is that group.
        if (count[g]) assert_int_equal(fwd_plan_group_of_row(off, n, off[g]), g);
    }
    for (int p = 0; p < P; p++) {
        const bool in = ids[p] >= e0 && ids[p] < e1 && (!live || live[p / k]);
        if (!in) assert_int_equal(slot[p], -1);
        else assert_true(slot[p] >= 0 && slot[p] < off[n]);
    }
    free(off);
    free(count);
    free(slot);
    free(cursor);
    free(token);
    free(pair);
}

static void routing_sorts_pads_and_leaves_out(void **state)
{
    (void)state;
    int32_t ids[300 * 8], live[300];
    for (int trial = 0; trial < 400; trial++) {
        const int E = 1 + (int)(next() % 64), k = 1 + (int)(next() % (E < 8 ? E : 8));
        const int T = (int)(next() % 300), pad = (int[]){1, 8, 64, 3}[trial % 4];
        for (int t = 0; t < T; t++) {
            // k distinct experts per token, skewed towards a few hot ones half the time
            for (int j = 0; j < k; j++) {
                int e;
                bool dup;
                do {
                    e = trial % 2 ? (int)(next() % (uint32_t)E) : (int)(next() % (uint32_t)(k + 1 < E ? k + 1 : E));
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
                } while (dup);
                ids[t * k + j] = e;
            }
            live[t] = next() % 5 != 0;
        }
        const int e0 = (int)(next() % (uint32_t)E), e1 = e0 + 1 + (int)(next() % (uint32_t)(E - e0));
        check_route(ids, trial % 3 ? NULL : live, T, k, 0, E, pad);
        check_route(ids, trial % 3 ? live : NULL, T, k, e0, e1, pad);
    }
    // The bound is reached: every expert one pair, each padded to a whole tile.
    int32_t one[16];
    for (int e = 0; e < 16; e++) one[e] = e;
    check_route(one, NULL, 16, 1, 0, 16, 8);
    assert_int_equal(fwd_plan_route_rows(16, 16, 8), 128);
    assert_int_equal(fwd_plan_route_rows(3, 16, 8), 3 + 3 * 7); // at most 3 non-empty experts
    assert_int_equal(fwd_plan_route_rows(5, 4, 1), 5);
    assert_int_equal(fwd_plan_route_rows(5, 4, 0), 0); // a pad below 1 is refused
    check_route(one, NULL, 0, 1, 0, 16, 8);             // no tokens: empty offsets
}

static void owners_and_return_rows_follow_the_expert_blocks(void **state)
{
    (void)state;
    const int32_t first[] = {0, 42, 85, 128}; // 128 experts over 3 ranks
    assert_int_equal(fwd_plan_owner(0, first, 3), 0);
    assert_int_equal(fwd_plan_owner(41, first, 3), 0);
    assert_int_equal(fwd_plan_owner(42, first, 3), 1);
    assert_int_equal(fwd_plan_owner(127, first, 3), 2);
    assert_int_equal(fwd_plan_owner(128, first, 3), -1);
    assert_int_equal(fwd_plan_owner(-1, first, 3), -1);
    const int32_t uneven[] = {0, 0, 5, 5, 9}; // ranks owning nothing are never the owner
    assert_int_equal(fwd_plan_owner(0, uneven, 4), 1);
    assert_int_equal(fwd_plan_owner(5, uneven, 4), 3);
    // Token 3, slot 2 of 8, expert 90 (rank 2), 16 tokens a rank: rank 2's block, row 3 * 8 + 2.
    assert_int_equal(fwd_plan_return_slot(90, 3, 2, 8, first, 3, 16 * 8), 2 * 128 + 26);
    assert_int_equal(fwd_plan_return_slot(200, 3, 2, 8, first, 3, 128), -1);
    // Every pair of every token lands on a distinct row.
    char seen[3 * 64] = {0};
    for (int t = 0; t < 8; t++)
        for (int j = 0; j < 8; j++) {
            const int r = fwd_plan_return_slot((t * 37 + j * 11) % 128, t, j, 8, first, 3, 64);
            assert_true(r >= 0 && r < 3 * 64);
            assert_int_equal(seen[r], 0);
            seen[r] = 1;
        }
}

static void decode_buckets_hold_each_batch(void **state)
{
    (void)state;
    assert_int_equal(fwd_plan_bucket(1, 256), 1);
    assert_int_equal(fwd_plan_bucket(3, 256), 4);
    assert_int_equal(fwd_plan_bucket(9, 256), 16);
    assert_int_equal(fwd_plan_bucket(65, 256), 96);
    assert_int_equal(fwd_plan_bucket(250, 256), 256);
    assert_int_equal(fwd_plan_bucket(257, 256), 0);
    assert_int_equal(fwd_plan_bucket(0, 256), 0);
    assert_int_equal(fwd_plan_bucket(100, 100), 100); // capped
    assert_int_equal(fwd_plan_bucket(5, 6), 6);
    int b[64];
    const int n = fwd_plan_buckets(256, b, 64);
    assert_int_equal(n, 4 + 7 + 6); // 1 2 4 8, 16..64, 96..256
    for (int i = 1; i < n; i++) assert_true(b[i] > b[i - 1]);
    assert_int_equal(b[n - 1], 256);
    for (int s = 1; s <= 256; s++) {
        const int k = fwd_plan_bucket(s, 256);
        assert_true(k >= s);
        int found = 0;
        for (int i = 0; i < n; i++) found |= b[i] == k;
        assert_true(found);
        if (s > 1) assert_true(k >= fwd_plan_bucket(s - 1, 256)); // monotonic
    }
    assert_int_equal(fwd_plan_buckets(256, NULL, 0), n); // counting
    assert_int_equal(fwd_plan_buckets(256, b, 3), 3);    // a short array takes the first ones
    assert_int_equal(b[2], 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(routing_sorts_pads_and_leaves_out),
        cmocka_unit_test(owners_and_return_rows_follow_the_expert_blocks),
        cmocka_unit_test(decode_buckets_hold_each_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
