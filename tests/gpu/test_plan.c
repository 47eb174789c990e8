// The CUDA backend's shared plans (gpu/plan.h), on the CPU: attention work
// items cover every (token, visible position) pair exactly once, start on
// chunk boundaries (so a token's chunks are the same in any tile or batch),
// split only when a step has few tiles, with one partial set per chunk that
// no other item writes; the
// grouped-matmul tile bound holds for every routing and the tile list is
// the groups' rows in order; decode steps planned item by item on the device
// cut the same chunks as the host plan.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpu/plan.h"

struct layout {
    int n_seqs;
    int32_t seq_start[9];
    int32_t tok_pos[256];
};

// Sequence s gets n_new[s] new tokens after n_past[s] cached ones.
static void layout_make(struct layout *l, int n, const int *n_past, const int *n_new)
{
    int t = 0;
    l->n_seqs = n;
    for (int s = 0; s < n; s++) {
        l->seq_start[s] = t;
        for (int i = 0; i < n_new[s]; i++) l->tok_pos[t++] = n_past[s] + i;
    }
    l->seq_start[n] = t;
}

static struct plan_attn_opts opts(int tile, int target)
{
    return (struct plan_attn_opts){.tile_tokens = tile, .kv_heads = 4, .target_ctas = target,
                                   .chunk = 32, .max_split = 8, .n_heads = 8,
                                   .max_part_rows = 1 << 20};
}

// Every token sees positions 0..its own exactly once over the items that
// hold it; parts are disjoint and inside n_part_rows.
static void check_cover(const struct layout *l, const struct plan_attn_opts *o, int *splits_out)
{
    struct plan_attn pa;
    assert_int_equal(plan_attention(l->seq_start, l->tok_pos, l->n_seqs, o, NULL, 0, NULL, 0, &pa), 0);
    struct plan_attn_item *it = calloc((size_t)pa.n_items + 1, sizeof *it);
    struct plan_attn_combine *cb = calloc((size_t)pa.n_combine + 1, sizeof *cb);
    assert_non_null(it);
    assert_non_null(cb);
    struct plan_attn pb;
    assert_int_equal(plan_attention(l->seq_start, l->tok_pos, l->n_seqs, o, it, pa.n_items, cb,
                                    pa.n_combine, &pb), 0);
    assert_memory_equal(&pa, &pb, sizeof pa);
    const int T = l->seq_start[l->n_seqs];
    int *seen = calloc((size_t)T * 4096, sizeof *seen);
    char *part_used = calloc((size_t)pa.n_part_rows + 1, 1);
    assert_non_null(seen);
    assert_non_null(part_used);
    int max_split = 1;
    for (int i = 0; i < pa.n_items; i++) {
        assert_true(it[i].n_tok >= 1 && it[i].n_tok <= o->tile_tokens);
        assert_int_equal(it[i].p0 % o->chunk, 0);
        assert_true(it[i].p0 < it[i].p1);
        assert_true(it[i].t0 >= l->seq_start[it[i].seq] &&
                    it[i].t0 + it[i].n_tok <= l->seq_start[it[i].seq + 1]);
        for (int k = 0; k < it[i].n_tok; k++) {
            const int t = it[i].t0 + k;
            for (int p = it[i].p0; p < it[i].p1 && p <= l->tok_pos[t]; p++) seen[t * 4096 + p]++;
        }
        if (it[i].part >= 0) {
            const int sets = (it[i].p1 - it[i].p0 + o->chunk - 1) / o->chunk;
            for (int r = 0; r < sets * it[i].n_tok * o->n_heads; r++) {
                assert_true(it[i].part + r < pa.n_part_rows);
                assert_int_equal(part_used[it[i].part + r], 0);
                part_used[it[i].part + r] = 1;
            }
        }
    }
    for (int t = 0; t < T; t++)
        for (int p = 0; p < 4096; p++) assert_int_equal(seen[t * 4096 + p], p <= l->tok_pos[t] ? 1 : 0);
    for (int c = 0; c < pa.n_combine; c++) {
        int items_of_tile = 0;
        for (int i = 0; i < pa.n_items; i++) {
            if (it[i].t0 != cb[c].t0) continue;
            items_of_tile++;
            // Its sets sit where the combine looks for its chunks.
            assert_int_equal(it[i].part, cb[c].part0 + it[i].p0 / o->chunk * cb[c].n_tok * o->n_heads);
        }
        if (items_of_tile > max_split) max_split = items_of_tile;
        assert_true(items_of_tile >= 2 && items_of_tile <= o->max_split);
        const int ctx = l->tok_pos[cb[c].t0 + cb[c].n_tok - 1] + 1;
        assert_int_equal(cb[c].n_chunk, (ctx + o->chunk - 1) / o->chunk);
    }
    for (int r = 0; r < pa.n_part_rows; r++) assert_int_equal(part_used[r], 1);
    if (splits_out) *splits_out = max_split;
    free(it);
    free(cb);
    free(seen);
    free(part_used);
}

static void attention_items_cover_each_visible_position_once(void **state)
{
    (void)state;
    struct layout l;
    const int past[] = {0, 31, 1000, 15, 0}, nw[] = {20, 1, 1, 17, 64};
    layout_make(&l, 5, past, nw);
    for (int tile = 1; tile <= 20; tile += 3)
        for (int target = 0; target <= 512; target += 128) {
            struct plan_attn_opts o = opts(tile, target);
            check_cover(&l, &o, NULL);
        }
}

static void decode_steps_split_long_contexts_and_prefill_does_not(void **state)
{
    (void)state;
    struct layout l;
    const int past[] = {3000}, one[] = {1};
    layout_make(&l, 1, past, one);
    struct plan_attn_opts o = opts(8, 264);
    int splits;
    check_cover(&l, &o, &splits);
    assert_int_equal(splits, 8); // a lone decode row over 3001 positions: split as far as allowed
    o.max_part_rows = 10; // and not at all when its partial sets would not fit
    check_cover(&l, &o, &splits);
    assert_int_equal(splits, 1);
    o = opts(8, 264);
    const int p0[] = {0, 0, 0, 0}, big[] = {64, 64, 64, 64};
    layout_make(&l, 4, p0, big);
    o = opts(1, 16); // 256 tiles x 4 heads: enough work without splitting
    struct plan_attn pa;
    assert_int_equal(plan_attention(l.seq_start, l.tok_pos, l.n_seqs, &o, NULL, 0, NULL, 0, &pa), 0);
    assert_int_equal(pa.n_combine, 0);
    assert_int_equal(pa.n_part_rows, 0);
    const int short_past[] = {5}; // a context within one chunk is never split
    layout_make(&l, 1, short_past, one);
    o = opts(8, 1000);
    assert_int_equal(plan_attention(l.seq_start, l.tok_pos, l.n_seqs, &o, NULL, 0, NULL, 0, &pa), 0);
    assert_int_equal(pa.n_items, 1);
}

static void attention_plan_refuses_bad_input_and_small_arrays(void **state)
{
    (void)state;
    struct layout l;
    const int past[] = {100}, nw[] = {3};
    layout_make(&l, 1, past, nw);
    struct plan_attn pa;
    struct plan_attn_opts o = opts(0, 0);
    assert_int_equal(plan_attention(l.seq_start, l.tok_pos, 1, &o, NULL, 0, NULL, 0, &pa), -1);
    o = opts(1, 0);
    o.chunk = 24; // not whole blocks
    assert_int_equal(plan_attention(l.seq_start, l.tok_pos, 1, &o, NULL, 0, NULL, 0, &pa), -1);
    o = opts(1, 0);
    struct plan_attn_item it[2];
    struct plan_attn_combine cb[1];
    assert_int_equal(plan_attention(l.seq_start, l.tok_pos, 1, &o, it, 2, cb, 1, &pa), -1); // needs 3
    int32_t bad_start[2] = {3, 0};
    assert_int_equal(plan_attention(bad_start, l.tok_pos, 1, &o, NULL, 0, NULL, 0, &pa), -1);
}

static void group_tiles_stay_within_the_bound(void **state)
{
    (void)state;
    uint64_t x = 12345;
    int32_t off[65], tiles[2 * 2048];
    for (int trial = 0; trial < 500; trial++) {
        const int G = 1 + trial % 64, rows = trial % 300, per = trial % 2 ? 8 : 64;
        // rows spread over the groups at random (many empty groups too)
        int cnt[64] = {0};
        for (int r = 0; r < rows; r++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            cnt[(trial % 3 ? x % (uint64_t)G : x % 3 % (uint64_t)G)]++;
        }
        off[0] = 0;
        for (int g = 0; g < G; g++) off[g + 1] = off[g] + cnt[g];
        const int n = plan_group_tiles(off, G, per, tiles, 2048);
        assert_true(n <= plan_group_tiles_bound(G, rows, per));
        int at = 0;
        for (int i = 0; i < n; i++) {
            const int g = tiles[2 * i], r0 = tiles[2 * i + 1];
            assert_true(r0 >= off[g] && r0 < off[g + 1]);
            assert_int_equal(r0, at);
            at = r0 + per < off[g + 1] ? r0 + per : off[g + 1];
        }
        assert_int_equal(at, rows);
    }
}

// A decode step planned item by item (as the device does) cuts each token's
// context into the chunks plan_attention cuts, covers every visible position
// once, keeps each sequence's partial sets in its own fixed rows, and makes a
// combine entry exactly for the split tokens.
static void decode_items_match_the_host_plan(void **state)
{
    (void)state;
    const int H = 8, chunk = 32, max_chunks = 64; // contexts up to 2048
    const int pos_sets[][6] = {{0, 31, 32, 1000, 2047, 63}, {5, 5, 5, 5, 5, 5}, {2047, 0, 64, 95, 96, 1}};
    for (size_t ps = 0; ps < 3; ps++)
        for (int n = 1; n <= 6; n++)
            for (int target = 0; target <= 300; target += 100) {
                struct layout l;
                int past[6], one[6];
                for (int s = 0; s < n; s++) past[s] = pos_sets[ps][s], one[s] = 1;
                layout_make(&l, n, past, one);
                struct plan_attn_opts o = opts(1, target);
                o.chunk = chunk;
                o.n_heads = H;
                o.max_split = 8;
                struct plan_attn pa;
                struct plan_attn_item it[64];
                struct plan_attn_combine cb[8];
                assert_int_equal(plan_attention(l.seq_start, l.tok_pos, n, &o, it, 64, cb, 8, &pa), 0);
                const int split = plan_decode_split(n, o.kv_heads, target, o.max_split);
                int seen[6][2048] = {{0}};
                int n_items = 0, n_comb = 0;
                char *used = calloc((size_t)n * max_chunks * H, 1);
                assert_non_null(used);
                for (int s = 0; s < n; s++) {
                    for (int j = 0; j < split; j++) {
                        struct plan_attn_item d;
                        if (!plan_decode_item(s, l.tok_pos[s], j, split, chunk, H, max_chunks, &d))
                            continue;
                        // The host plan's item, but for where its partial sets go.
                        const struct plan_attn_item *h = &it[n_items++];
                        assert_int_equal(d.t0, h->t0);
                        assert_int_equal(d.n_tok, 1);
                        assert_int_equal(d.seq, h->seq);
                        assert_int_equal(d.p0, h->p0);
                        assert_int_equal(d.p1, h->p1);
                        assert_int_equal(d.part < 0, h->part < 0);
                        for (int p = d.p0; p < d.p1; p++) seen[s][p]++;
                        for (int c = d.p0 / chunk; d.part >= 0 && c * chunk < d.p1; c++) {
                            const int row0 = d.part + (c - d.p0 / chunk) * H;
                            assert_true(row0 >= s * max_chunks * H && row0 + H <= (s + 1) * max_chunks * H);
                            for (int r = 0; r < H; r++) {
                                assert_int_equal(used[row0 + r], 0);
                                used[row0 + r] = 1;
                            }
                        }
                    }
                    struct plan_attn_combine c;
                    if (plan_decode_combine(s, l.tok_pos[s], split, chunk, H, max_chunks, &c)) {
                        const struct plan_attn_combine *h = &cb[n_comb++];
                        assert_int_equal(c.t0, h->t0);
                        assert_int_equal(c.n_chunk, h->n_chunk);
                        assert_int_equal(c.part0, s * max_chunks * H);
                        for (int k = 0; k < c.n_chunk * H; k++) assert_int_equal(used[c.part0 + k], 1);
                    }
                    for (int p = 0; p < 2048; p++) assert_int_equal(seen[s][p], p <= l.tok_pos[s]);
                }
                assert_int_equal(n_items, pa.n_items);
                assert_int_equal(n_comb, pa.n_combine);
                free(used);
            }
    // Splitting stops once the step alone fills the target.
    assert_int_equal(plan_decode_split(1, 4, 264, 64), 64);
    assert_int_equal(plan_decode_split(8, 4, 264, 64), 9);
    assert_int_equal(plan_decode_split(66, 4, 264, 64), 1);
    assert_int_equal(plan_decode_split(3, 4, 0, 64), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attention_items_cover_each_visible_position_once),
        cmocka_unit_test(decode_steps_split_long_contexts_and_prefill_does_not),
        cmocka_unit_test(attention_plan_refuses_bad_input_and_small_arrays),
        cmocka_unit_test(group_tiles_stay_within_the_bound),
        cmocka_unit_test(decode_items_match_the_host_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
