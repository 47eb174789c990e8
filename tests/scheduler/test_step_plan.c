// Pins the step planner without a model: the token budget, decodes before
// prefills, chunked prefill, preemption of the youngest of the rank short of
// blocks only, progress on every step, placement on the rank with the most
// free blocks, and block accounting through thousands of random arrivals,
// finishes and cancels.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "scheduler/step_plan.h"

struct sim_seq {
    struct sched_seq q;
    int32_t tokens[400];
    int max_out;
    bool live;
    uint64_t order; // submission order
};

struct sim {
    struct sched s;
    struct kv_blocks *blocks[4];
    int n_ranks;
    struct sim_seq *seqs;
    int n_seqs;
};

static uint64_t rng_next(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static void sim_init(struct sim *m, int n_ranks, int blocks_per_rank, int max_seqs, int budget,
                     bool chunked, bool caching, int n_seqs)
{
    memset(m, 0, sizeof *m);
    char err[256];
    m->n_ranks = n_ranks;
    for (int i = 0; i < n_ranks; i++)
        assert_int_equal(kvb_create(blocks_per_rank, caching, &m->blocks[i], err, sizeof err), 0);
    if (sched_init(&m->s, n_ranks, m->blocks, max_seqs + 4, max_seqs, budget, chunked, err,
                   sizeof err))
        fail_msg("%s", err);
    m->seqs = calloc((size_t)n_seqs, sizeof *m->seqs);
    m->n_seqs = n_seqs;
}

static void sim_free(struct sim *m)
{
    for (int i = 0; i < m->n_seqs; i++)
        if (m->seqs[i].q.table.ids) sched_seq_free(&m->seqs[i].q);
    free(m->seqs);
    sched_free(&m->s);
    for (int i = 0; i < m->n_ranks; i++) kvb_destroy(m->blocks[i]);
}

static void sim_add(struct sim *m, int i, int n_prompt, int max_out, uint64_t salt, int family)
{
    struct sim_seq *q = &m->seqs[i];
    for (int t = 0; t < n_prompt; t++)
        q->tokens[t] = family >= 0 && t < 48 ? family * 100 + t : (int32_t)(salt * 31 + (uint64_t)t);
    assert_int_equal(sched_seq_init(&q->q, q->tokens, n_prompt, n_prompt + max_out), 0);
    q->max_out = max_out;
    q->live = true;
    q->order = (uint64_t)i;
    sched_add(&m->s, &q->q);
}

static void sim_finish(struct sim *m, struct sim_seq *q)
{
    sched_remove(&m->s, &q->q);
    sched_seq_free(&q->q);
    q->live = false;
}

static void check_accounting(struct sim *m)
{
    for (int r = 0; r < m->n_ranks; r++) {
        const struct kvb_table *tabs[512];
        int n = 0;
        for (struct sched_seq *q = m->s.running.head; q; q = q->next)
            if (q->rank == r) tabs[n++] = &q->table;
        char err[256];
        if (kvb_check(m->blocks[r], tabs, n, err, sizeof err)) fail_msg("rank %d: %s", r, err);
        int running = 0;
        for (struct sched_seq *q = m->s.running.head; q; q = q->next) running += q->rank == r;
        assert_int_equal(running, m->s.ranks[r].n_running);
    }
    for (struct sched_seq *q = m->s.waiting.head; q; q = q->next) {
        assert_int_equal(q->table.n, 0);
        assert_int_equal(q->rank, -1);
        assert_false(q->running);
    }
}

// One planned step, checked, then "run": fed tokens become computed, and a
// sequence that samples appends a token (and ends at its max).
static int sim_step(struct sim *m, uint64_t *rng)
{
    struct sched *s = &m->s;
    struct sched_seq *before[512];
    uint64_t adm[512];
    int rank_of[512];
    int n_before = 0;
    for (struct sched_seq *q = s->running.head; q; q = q->next) {
        adm[n_before] = q->admission;
        rank_of[n_before] = q->rank;
        before[n_before++] = q;
    }
    bool had_work = s->running.n + s->waiting.n > 0;
    int n = sched_plan(s);
    if (had_work) assert_true(n > 0);
    // Preempted sequences were the youngest of their rank: on each rank,
    // those of `before` still running form a prefix of its sequences.
    for (int rk = 0; rk < m->n_ranks; rk++) {
        bool gone = false;
        for (int i = 0; i < n_before; i++) {
            if (rank_of[i] != rk) continue;
            if (!before[i]->running || before[i]->admission != adm[i]) gone = true;
            else if (gone) fail_msg("rank %d: an older sequence was preempted before a younger one", rk);
        }
    }
    // The limits hold per rank, as vLLM's per data-parallel engine.
    int tokens[16] = {0}, sched = 0;
    bool prefill_scheduled[16] = {false}, decode_left_out[16] = {false};
    assert_true(m->n_ranks <= 16);
    for (struct sched_seq *q = s->running.head; q; q = q->next) {
        if (q->sched_new == 0) {
            if (q->n_tokens - q->n_computed == 1) decode_left_out[q->rank] = true;
            continue;
        }
        sched++;
        tokens[q->rank] += q->sched_new;
        assert_true(q->table.n * KV_BLOCK_TOKENS >= q->n_computed + q->sched_new);
        assert_true(q->n_computed + q->sched_new <= q->n_tokens);
        assert_int_equal(q->sched_sample, q->n_computed + q->sched_new == q->n_tokens);
        if (q->n_tokens - q->n_computed > 1) prefill_scheduled[q->rank] = true;
        if (!s->chunked_prefill && !q->wants_prompt_lp)
            assert_int_equal(q->sched_new, q->n_tokens - q->n_computed);
    }
    assert_int_equal(sched, n);
    for (int r = 0; r < m->n_ranks; r++) {
        assert_true(tokens[r] <= s->max_num_batched_tokens);
        assert_true(s->ranks[r].n_running <= s->max_num_seqs);
        // Decodes come first: a decode is left out only when decodes took its rank's budget.
        if (decode_left_out[r]) assert_false(prefill_scheduled[r]);
    }
    int in_batches = 0;
    for (int r = 0; r < m->n_ranks; r++) {
        assert_true(s->ranks[r].rows_used <= s->ranks[r].max_rows);
        in_batches += s->ranks[r].n_batch;
        for (int i = 0; i < s->ranks[r].n_batch; i++) assert_int_equal(s->ranks[r].batch[i]->rank, r);
    }
    assert_int_equal(in_batches, n);
    check_accounting(m);
    for (int r = 0; r < m->n_ranks; r++)
        for (int i = 0; i < s->ranks[r].n_batch; i++) {
            struct sched_seq *q = s->ranks[r].batch[i];
            bool sample = q->sched_sample;
            sched_commit(s, q);
            if (!sample) continue;
            struct sim_seq *ss = (struct sim_seq *)q;
            q->tokens[q->n_tokens++] = (int32_t)(rng_next(rng) % 1000);
            if (q->n_tokens - q->n_prompt >= ss->max_out) sim_finish(m, ss);
        }
    check_accounting(m);
    return n;
}

static void the_budget_splits_a_long_prompt_into_chunks(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 1, 100, 4, 7, true, true, 1);
    sim_add(&m, 0, 50, 3, 1, -1);
    uint64_t rng = 1;
    int steps = 0;
    int fed[20];
    while (m.seqs[0].live) {
        sim_step(&m, &rng);
        if (m.seqs[0].live && steps < 20) fed[steps] = m.seqs[0].q.n_computed;
        steps++;
    }
    // ceil(50 / 7) = 8 prefill steps (the last samples), then 2 decodes.
    assert_int_equal(steps, 10);
    assert_int_equal(fed[0], 7);
    assert_int_equal(fed[6], 49);
    sim_free(&m);
}

static void decodes_are_scheduled_before_new_prefills(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 1, 100, 4, 8, true, true, 2);
    uint64_t rng = 2;
    sim_add(&m, 0, 3, 10, 1, -1);
    sim_step(&m, &rng); // prefill of 0, samples its first token
    sim_add(&m, 1, 40, 2, 2, -1);
    sim_step(&m, &rng);
    // 0 decoded one token, 1 got the 7 tokens left.
    assert_int_equal(m.seqs[0].q.n_tokens - m.seqs[0].q.n_prompt, 2);
    assert_int_equal(m.seqs[1].q.n_computed, 7);
    sim_free(&m);
}

static void the_youngest_is_preempted_and_recomputed(void **state)
{
    (void)state;
    struct sim m;
    // 6 blocks: two sequences of 3 blocks' worth of prompt each fill it.
    sim_init(&m, 1, 6, 4, 200, true, false, 2);
    uint64_t rng = 3;
    sim_add(&m, 0, 48, 20, 1, -1);
    sim_add(&m, 1, 48, 20, 2, -1);
    sim_step(&m, &rng);
    assert_true(m.seqs[0].q.running && m.seqs[1].q.running);
    sim_step(&m, &rng); // both need a fourth block: the younger goes
    assert_true(m.seqs[0].q.running);
    assert_false(m.seqs[1].q.running);
    assert_int_equal(m.seqs[1].q.n_computed, 0);
    assert_int_equal(m.s.n_preemptions, 1);
    // It keeps its generated token and comes back once 0 is done.
    int kept = m.seqs[1].q.n_tokens;
    assert_int_equal(kept, 49);
    while (m.seqs[0].live) sim_step(&m, &rng);
    sim_step(&m, &rng);
    assert_true(m.seqs[1].q.running);
    assert_int_equal(m.seqs[1].q.n_computed, 49); // the prompt and its token, recomputed at once
    while (m.seqs[1].live) sim_step(&m, &rng);
    sim_free(&m);
}

// Two ranks each take max_num_seqs sequences and a step's budget of their
// own (vLLM's limits are per data-parallel engine): one rank's long prefill
// does not hold the other's back.
static void each_rank_has_its_own_sequence_limit_and_budget(void **state)
{
    (void)state;
    struct sim m;
    // Budgets: two 40-token prompts each get a rank's 16 tokens in the first step.
    sim_init(&m, 2, 100, 2, 16, true, true, 2);
    uint64_t rng = 4;
    sim_add(&m, 0, 40, 3, 1, -1);
    sim_add(&m, 1, 40, 3, 2, -1);
    sim_step(&m, &rng);
    assert_true(m.seqs[0].q.running && m.seqs[1].q.running);
    assert_int_not_equal(m.seqs[0].q.rank, m.seqs[1].q.rank);
    assert_int_equal(m.seqs[0].q.n_computed, 16);
    assert_int_equal(m.seqs[1].q.n_computed, 16);
    while (m.seqs[0].live || m.seqs[1].live) sim_step(&m, &rng);
    sim_free(&m);
    // Sequences: max_num_seqs 2 runs four on two ranks; a fifth waits.
    sim_init(&m, 2, 100, 2, 16, true, true, 5);
    for (int i = 0; i < 5; i++) sim_add(&m, i, 4, 3, (uint64_t)i + 1, -1);
    sim_step(&m, &rng);
    assert_int_equal(m.s.running.n, 4);
    assert_int_equal(m.s.ranks[0].n_running, 2);
    assert_int_equal(m.s.ranks[1].n_running, 2);
    assert_false(m.seqs[4].q.running);
    while (m.seqs[0].live || m.seqs[1].live || m.seqs[2].live || m.seqs[3].live || m.seqs[4].live)
        sim_step(&m, &rng);
    sim_free(&m);
}

// A prompt the block-richest rank's budget cannot take whole (chunked
// prefill off) goes to another rank that can, rather than waiting.
static void a_prompt_goes_to_the_rank_whose_budget_takes_it(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2, 100, 8, 256, false, false, 6);
    uint64_t rng = 5;
    sim_add(&m, 0, 200, 10, 1, -1); // rank 0: few free blocks, its budget idle after
    sim_step(&m, &rng);
    for (int i = 1; i <= 4; i++) sim_add(&m, i, 4, 10, (uint64_t)i + 1, -1);
    sim_step(&m, &rng);
    assert_int_equal(m.seqs[0].q.rank, 0);
    for (int i = 1; i <= 4; i++) assert_int_equal(m.seqs[i].q.rank, 1);
    // Rank 1 has the most free blocks but 252 tokens of budget after its
    // four decodes; rank 0 has 255.
    sim_add(&m, 5, 253, 2, 9, -1);
    sim_step(&m, &rng);
    assert_true(m.seqs[5].q.running);
    assert_int_equal(m.seqs[5].q.rank, 0);
    while (m.seqs[0].live || m.seqs[1].live || m.seqs[2].live || m.seqs[3].live || m.seqs[4].live ||
           m.seqs[5].live)
        sim_step(&m, &rng);
    sim_free(&m);
}

// A rank short of blocks preempts its own youngest, never a younger
// sequence of another rank (whose blocks would not help it).
static void a_rank_short_of_blocks_preempts_only_its_own(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2, 6, 8, 400, true, false, 4);
    uint64_t rng = 6;
    // Placed by free blocks: A rank 0, B rank 1, C rank 0 (a tie: fewer
    // running), D rank 1. Rank 0's 6 blocks then hold A and C whole.
    sim_add(&m, 0, 48, 20, 1, -1); // A
    sim_add(&m, 1, 48, 20, 2, -1); // B
    sim_add(&m, 2, 48, 20, 3, -1); // C
    sim_add(&m, 3, 16, 20, 4, -1); // D, the youngest
    sim_step(&m, &rng);
    const int want_rank[4] = {0, 1, 0, 1};
    for (int i = 0; i < 4; i++) {
        assert_true(m.seqs[i].q.running);
        assert_int_equal(m.seqs[i].q.rank, want_rank[i]);
    }
    assert_int_equal(kvb_num_free(m.blocks[0]), 0);
    // A's 49th token needs a fourth block on rank 0: C goes, D stays.
    sim_step(&m, &rng);
    assert_int_equal(m.s.n_preemptions, 1);
    assert_false(m.seqs[2].q.running);
    assert_true(m.seqs[0].q.running && m.seqs[1].q.running && m.seqs[3].q.running);
    while (m.s.running.n + m.s.waiting.n) sim_step(&m, &rng);
    sim_free(&m);
}

static void new_sequences_go_to_the_rank_with_most_free_blocks(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 2, 20, 8, 400, true, true, 4);
    uint64_t rng = 4;
    sim_add(&m, 0, 100, 5, 1, -1); // 7 blocks on rank 0
    sim_add(&m, 1, 20, 5, 2, -1);  // rank 1 has more free
    sim_add(&m, 2, 20, 5, 3, -1);  // rank 1: 18 free vs 13
    sim_add(&m, 3, 20, 5, 4, -1);  // rank 1: 16 free vs 13
    sim_step(&m, &rng);
    assert_int_equal(m.seqs[0].q.rank, 0);
    assert_int_equal(m.seqs[1].q.rank, 1);
    assert_int_equal(m.seqs[2].q.rank, 1);
    assert_int_equal(m.seqs[3].q.rank, 1);
    while (m.s.running.n) sim_step(&m, &rng);
    sim_free(&m);
}

static void without_chunked_prefill_prompts_run_whole(void **state)
{
    (void)state;
    struct sim m;
    sim_init(&m, 1, 100, 4, 64, false, true, 3);
    uint64_t rng = 5;
    sim_add(&m, 0, 60, 4, 1, -1);
    sim_add(&m, 1, 30, 4, 2, -1);
    sim_add(&m, 2, 5, 4, 3, -1);
    sim_step(&m, &rng);
    // 60 fit; 30 more would not, so 1 waits and 2 waits behind it (FIFO).
    assert_true(m.seqs[0].q.running);
    assert_false(m.seqs[1].q.running);
    assert_false(m.seqs[2].q.running);
    while (m.s.running.n + m.s.waiting.n) sim_step(&m, &rng);
    sim_free(&m);
}

// Thousands of arrivals with random lengths (some sharing prefixes) and
// random cancels on two small pools, for each mode: every step satisfies the
// planner's invariants, every sequence finishes, every block comes back.
static void random_workloads_keep_the_invariants_and_finish(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        bool chunked = mode != 1, caching = mode != 2;
        int n_ranks = mode == 3 ? 1 : 2;
        enum { N = 1500 };
        struct sim m;
        int budget = chunked ? 32 : 256;
        sim_init(&m, n_ranks, 24, 8, budget, chunked, caching, N);
        uint64_t rng = 77 + (uint64_t)mode;
        int added = 0, steps = 0, cancels = 0;
        while (added < N || m.s.running.n + m.s.waiting.n > 0) {
            uint64_t r = rng_next(&rng);
            if (added < N && r % 3 != 0) {
                int np = 1 + (int)(r >> 4) % 200, mo = 1 + (int)(r >> 12) % 40;
                int fam = (int)(r >> 20) % 5 - 2;
                sim_add(&m, added, np, mo, (uint64_t)added, fam);
                added++;
            }
            if ((r >> 24) % 7 == 0 && added > 0) {
                struct sim_seq *q = &m.seqs[rng_next(&rng) % (uint64_t)added];
                if (q->live) {
                    sim_finish(&m, q);
                    cancels++;
                }
            }
            sim_step(&m, &rng);
            if (++steps > 200000) fail_msg("mode %d: no end in sight", mode);
        }
        if (cancels <= 50 || m.s.n_preemptions == 0)
            fail_msg("mode %d: %d cancels, %llu preemptions, %llu prefix hits", mode, cancels,
                     (unsigned long long)m.s.n_preemptions, (unsigned long long)m.s.prefix_hits);
        if (mode != 2) assert_true(m.s.prefix_hits > 0);
        assert_true(m.s.n_preemptions > 0);
        for (int r = 0; r < n_ranks; r++) {
            assert_int_equal(kvb_num_used(m.blocks[r]), 0);
            assert_int_equal(kvb_num_free(m.blocks[r]), 24);
        }
        sim_free(&m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_budget_splits_a_long_prompt_into_chunks),
        cmocka_unit_test(decodes_are_scheduled_before_new_prefills),
        cmocka_unit_test(the_youngest_is_preempted_and_recomputed),
        cmocka_unit_test(each_rank_has_its_own_sequence_limit_and_budget),
        cmocka_unit_test(a_prompt_goes_to_the_rank_whose_budget_takes_it),
        cmocka_unit_test(a_rank_short_of_blocks_preempts_only_its_own),
        cmocka_unit_test(new_sequences_go_to_the_rank_with_most_free_blocks),
        cmocka_unit_test(without_chunked_prefill_prompts_run_whole),
        cmocka_unit_test(random_workloads_keep_the_invariants_and_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
