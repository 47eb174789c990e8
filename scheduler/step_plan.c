// step_plan: the step planner (see step_plan.h).
#include "scheduler/step_plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static void list_remove(struct sched_list *l, struct sched_seq *q)
{
    if (q->prev) q->prev->next = q->next;
    else l->head = q->next;
    if (q->next) q->next->prev = q->prev;
    else l->tail = q->prev;
    q->prev = q->next = NULL;
    l->n--;
}

static void list_push_tail(struct sched_list *l, struct sched_seq *q)
{
    q->next = NULL;
    q->prev = l->tail;
    if (l->tail) l->tail->next = q;
    else l->head = q;
    l->tail = q;
    l->n++;
}

static void list_push_head(struct sched_list *l, struct sched_seq *q)
{
    q->prev = NULL;
    q->next = l->head;
    if (l->head) l->head->prev = q;
    else l->tail = q;
    l->head = q;
    l->n++;
}

int sched_init(struct sched *s, int n_ranks, struct kv_blocks *const *blocks, int max_rows,
               int max_num_seqs, int max_num_batched_tokens, bool chunked_prefill, char *err,
               size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (n_ranks < 1 || max_num_seqs < 1 || max_rows < max_num_seqs ||
        max_num_batched_tokens < max_num_seqs)
        return ms_err(err, errlen, MS_EINVAL,
                      "scheduler limits are inconsistent: %d ranks, %d logits rows, %d sequences, "
                      "%d tokens per step",
                      n_ranks, max_rows, max_num_seqs, max_num_batched_tokens);
    s->ranks = calloc((size_t)n_ranks, sizeof *s->ranks);
    if (!s->ranks) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the scheduler");
    s->n_ranks = n_ranks;
    for (int i = 0; i < n_ranks; i++) {
        s->ranks[i].blocks = blocks[i];
        s->ranks[i].max_rows = max_rows;
        s->ranks[i].batch = calloc((size_t)max_num_seqs, sizeof *s->ranks[i].batch);
        if (!s->ranks[i].batch) {
            sched_free(s);
            return ms_err(err, errlen, MS_ENOMEM, "out of memory for the scheduler");
        }
    }
    s->max_num_seqs = max_num_seqs;
    s->max_num_batched_tokens = max_num_batched_tokens;
    s->chunked_prefill = chunked_prefill;
    return 0;
}

void sched_free(struct sched *s)
{
    if (s->ranks)
        for (int i = 0; i < s->n_ranks; i++) free(s->ranks[i].batch);
    free(s->ranks);
    memset(s, 0, sizeof *s);
}

int sched_seq_init(struct sched_seq *q, int32_t *tokens, int n_prompt, int cap_tokens)
{
    memset(q, 0, sizeof *q);
    q->tokens = tokens;
    q->n_tokens = q->n_prompt = n_prompt;
    q->rank = -1;
    return kvb_table_init(&q->table, cap_tokens);
}

void sched_seq_free(struct sched_seq *q) { kvb_table_free(&q->table); }

void sched_add(struct sched *s, struct sched_seq *q)
{
    q->running = false;
    q->rank = -1;
    q->n_computed = 0;
    q->sched_new = 0;
    list_push_tail(&s->waiting, q);
}

static void release(struct sched *s, struct sched_seq *q)
{
    if (q->rank < 0) return;
    struct sched_rank *r = &s->ranks[q->rank];
    kvb_release_all(r->blocks, &q->table);
    r->n_running--;
    q->rank = -1;
}

void sched_remove(struct sched *s, struct sched_seq *q)
{
    list_remove(q->running ? &s->running : &s->waiting, q);
    release(s, q);
    q->running = false;
}

// Frees the sequence's blocks and sends it to the front of the queue: it is
// recomputed (from the prefix cache where its blocks survive) when readmitted.
static void preempt(struct sched *s, struct sched_seq *q)
{
    list_remove(&s->running, q);
    release(s, q);
    q->running = false;
    q->n_computed = 0;
    q->sched_new = 0;
    list_push_head(&s->waiting, q);
    s->n_preemptions++;
}

static void batch_add(struct sched_rank *r, struct sched_seq *q, int n_new, int rows, bool sample)
{
    q->sched_new = n_new;
    q->sched_rows = rows;
    q->sched_sample = sample;
    q->row = r->rows_used;
    r->rows_used += rows;
    r->batch[r->n_batch++] = q;
}

// How many tokens of q fit this step on rank r: the budget, the logits rows
// (a prompt-logprob chunk takes one row per token), its KV blocks. Reserves
// the blocks. Returns 0 when nothing fits for want of rows or budget, and -1
// when blocks are what is missing (preempting someone may help). Without
// chunked prefill a prompt runs whole, except one that wants prompt
// logprobs: a row a token, it may be longer than a step's rows, and is cut
// to them (as vLLM scores a prompt of any length).
static int fit_chunk(const struct sched *s, struct sched_rank *r, struct sched_seq *q, int budget)
{
    const bool may_cut = s->chunked_prefill || q->wants_prompt_lp;
    int remaining = q->n_tokens - q->n_computed;
    int chunk = remaining < budget ? remaining : budget;
    if (q->wants_prompt_lp && chunk > r->max_rows - r->rows_used)
        chunk = r->max_rows - r->rows_used;
    else if (r->rows_used >= r->max_rows && q->n_computed + chunk == q->n_tokens)
        chunk = remaining - 1; // no row left to sample with: stop short of the last token
    if (chunk <= 0) return 0;
    if (!may_cut && chunk < remaining) return 0;
    int reach = kvb_reachable_tokens(r->blocks, &q->table) - q->n_computed;
    if (chunk > reach) {
        if (!may_cut || reach <= 0) return -1;
        chunk = reach;
    }
    if (kvb_reserve(r->blocks, &q->table, q->n_computed + chunk)) return -1;
    return chunk;
}

static void schedule_chunk(struct sched_rank *r, struct sched_seq *q, int chunk)
{
    bool sample = q->n_computed + chunk == q->n_tokens;
    int rows = q->wants_prompt_lp ? chunk : sample ? 1 : 0;
    batch_add(r, q, chunk, rows, sample);
}

// The most recently admitted running sequence on rank, or NULL: the one a
// shortage of that rank's blocks preempts first (preempting one on another
// rank frees nothing there).
static struct sched_seq *youngest_on_rank(const struct sched *s, int rank)
{
    struct sched_seq *v = s->running.tail;
    while (v && v->rank != rank) v = v->prev;
    return v;
}

// Of the ranks with room for one more sequence and some of this step's
// budget left, the one with the most free blocks (then the fewest
// sequences); -1 when none has.
static int pick_rank(const struct sched *s)
{
    int best = -1;
    for (int i = 0; i < s->n_ranks; i++) {
        const struct sched_rank *r = &s->ranks[i];
        if (r->n_running >= s->max_num_seqs || r->budget <= 0 || r->tried) continue;
        if (best < 0) {
            best = i;
            continue;
        }
        int fi = kvb_num_free(r->blocks), fb = kvb_num_free(s->ranks[best].blocks);
        if (fi > fb || (fi == fb && r->n_running < s->ranks[best].n_running)) best = i;
    }
    return best;
}

// max_num_seqs and max_num_batched_tokens bound each rank, as vLLM's bound
// each data-parallel engine: a rank is its own engine that steps in lockstep
// with the others, and one rank's long prefill leaves the others their own
// budget.
int sched_plan(struct sched *s)
{
    int n_sched = 0;
    uint64_t preemptions = s->n_preemptions;
    for (int i = 0; i < s->n_ranks; i++) {
        s->ranks[i].n_batch = 0;
        s->ranks[i].rows_used = 0;
        s->ranks[i].budget = s->max_num_batched_tokens;
    }
    for (struct sched_seq *q = s->running.head; q; q = q->next) q->sched_new = 0;

    // 1. One decode token for every running sequence past its prefill,
    // oldest first. When its rank's blocks run out the most recently
    // admitted sequence there is preempted, which may be this one. Victims
    // are younger than q (q is on their rank), so they come after it in the
    // list: its successor is read once they are gone.
    for (struct sched_seq *q = s->running.head, *next; q; q = next) {
        next = q->next;
        if (q->n_tokens - q->n_computed != 1) continue;
        struct sched_rank *r = &s->ranks[q->rank];
        if (r->budget <= 0) continue;
        bool preempted_self = false;
        while (kvb_reserve(r->blocks, &q->table, q->n_computed + 1)) {
            struct sched_seq *victim = youngest_on_rank(s, q->rank); // q at the latest
            if (victim == q) {
                next = q->next;
                preempt(s, q);
                preempted_self = true;
                break;
            }
            preempt(s, victim);
        }
        if (preempted_self) continue; // the younger ones of its rank went before it
        next = q->next;
        batch_add(r, q, 1, 1, true);
        r->budget--;
        n_sched++;
    }

    // 2. Chunks of running sequences still in their prefill, oldest first. One
    // that finds no block may preempt younger ones of its rank not yet
    // scheduled (victims come after q: its successor is read after them).
    for (struct sched_seq *q = s->running.head, *next; q; q = next) {
        next = q->next;
        if (q->sched_new || q->n_tokens - q->n_computed <= 1) continue;
        struct sched_rank *r = &s->ranks[q->rank];
        if (r->budget <= 0) continue;
        int chunk;
        while ((chunk = fit_chunk(s, r, q, r->budget)) < 0) {
            struct sched_seq *victim = youngest_on_rank(s, q->rank);
            if (victim == q || victim->sched_new) break;
            preempt(s, victim);
        }
        next = q->next;
        if (chunk <= 0) continue;
        schedule_chunk(r, q, chunk);
        r->budget -= chunk;
        n_sched++;
    }

    // 3. Admit waiting sequences in order while some rank's budget, sequence
    // limit and blocks allow; a new sequence never preempts, and none is
    // admitted in a step that had to preempt (it would take the blocks back).
    // The ranks are tried in pick_rank's order: one whose budget or rows
    // cannot take the sequence (a whole prompt without chunked prefill) must
    // not keep it from another rank that is idle.
    while (s->waiting.head && s->n_preemptions == preemptions) {
        struct sched_seq *q = s->waiting.head;
        for (int i = 0; i < s->n_ranks; i++) s->ranks[i].tried = false;
        int ri, hit = 0, chunk = 0;
        while ((ri = pick_rank(s)) >= 0) {
            struct sched_rank *r = &s->ranks[ri];
            hit = 0;
            if (kvb_prefix_caching(r->blocks) && !q->wants_prompt_lp) // never all of it: the last token gives logits
                hit = kvb_match_prefix(r->blocks, &q->table, q->tokens, q->n_tokens - 1);
            q->n_computed = hit;
            chunk = fit_chunk(s, r, q, r->budget);
            if (chunk > 0) break;
            kvb_release_all(r->blocks, &q->table);
            q->n_computed = 0;
            r->tried = true;
        }
        if (ri < 0) break;
        struct sched_rank *r = &s->ranks[ri];
        if (!q->admitted_once) {
            // A new request's lookup only, as vLLM counts it: a preempted
            // one's readmission (its own blocks, its output too) would
            // inflate both.
            if (kvb_prefix_caching(r->blocks) && !q->wants_prompt_lp) {
                s->prefix_queries += (uint64_t)q->n_tokens;
                s->prefix_hits += (uint64_t)hit;
            }
            q->n_cached = hit < q->n_prompt ? hit : q->n_prompt;
            q->admitted_once = true;
        }
        list_remove(&s->waiting, q);
        q->running = true;
        q->admission = ++s->n_admissions;
        q->rank = ri;
        r->n_running++;
        list_push_tail(&s->running, q);
        schedule_chunk(r, q, chunk);
        r->budget -= chunk;
        n_sched++;
    }
    return n_sched;
}

void sched_commit(struct sched *s, struct sched_seq *q)
{
    if (q->rank < 0 || q->sched_new == 0) return;
    q->n_computed += q->sched_new;
    q->sched_new = 0;
    kvb_commit(s->ranks[q->rank].blocks, &q->table, q->tokens, q->n_computed);
}
