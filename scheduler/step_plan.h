// step_plan: step planning over the sequences of every rank — the waiting queue,
// the running list in admission order, rank placement, the per-step token
// budget with decodes first and chunked prefills after, and preemption of the
// most recently admitted sequence of a rank when that rank's KV blocks run
// out (another rank's blocks would not help it). No model, no
// threads: the engine runs what sched_plan decides. Its names keep the
// short `sched_` prefix (struct sched is the engine's planner state).
#ifndef MOESERVE_SCHEDULER_STEP_PLAN_H
#define MOESERVE_SCHEDULER_STEP_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/kv_blocks.h"

// The scheduling state of one sequence (embedded in the engine's sequence).
struct sched_seq {
    int32_t *tokens;             // (cap) the prompt, then the generated tokens; owned by the caller
    int n_tokens;                // the caller appends a token after each sample
    int n_prompt;
    bool wants_prompt_lp;        // a logits row for every position fed (prompt logprobs)

    // Owned by sched.
    bool running;
    int rank;                    // -1 while waiting
    struct kvb_table table;
    int n_computed;              // tokens whose KV is in the rank's pool
    int n_cached;                // prompt tokens its first admission found in the prefix cache
    bool admitted_once;
    uint64_t admission;          // numbers admissions: a preempted and readmitted sequence gets a new one
    struct sched_seq *prev, *next;

    // This step's plan: feed tokens [n_computed, n_computed + sched_new),
    // with logits for the last sched_rows of them at rows [row, row +
    // sched_rows) of the rank's buffer; sample after the last when sched_sample.
    int sched_new;
    int sched_rows;
    int row;
    bool sched_sample;
};

struct sched_list {
    struct sched_seq *head, *tail;
    int n;
};

struct sched_rank {
    struct kv_blocks *blocks;
    int n_running;
    int max_rows;                // logits rows the rank's buffer holds
    int rows_used;
    int budget;                  // tokens this step may still take on the rank
    bool tried;                  // an admission found no room here this time
    struct sched_seq **batch;    // (max_num_seqs) this step's sequences, in feed order
    int n_batch;
};

struct sched {
    int n_ranks;
    struct sched_rank *ranks;    // (n_ranks)
    int max_num_seqs;            // running sequences on each rank, at most
    int max_num_batched_tokens;  // tokens a step takes on each rank, at most
    bool chunked_prefill;        // off: a prompt runs whole (one wanting prompt logprobs is cut to the rows)
    struct sched_list waiting;   // FIFO; preempted sequences return to the front
    struct sched_list running;   // oldest admission first
    uint64_t n_admissions;
    uint64_t n_preemptions;
    uint64_t prefix_queries;     // prompt tokens looked up in the prefix cache (first admissions)
    uint64_t prefix_hits;        // tokens found
};

// blocks: one manager per rank (owned by the caller). max_rows must be at
// least max_num_seqs, and max_num_batched_tokens at least max_num_seqs.
int sched_init(struct sched *s, int n_ranks, struct kv_blocks *const *blocks, int max_rows,
               int max_num_seqs, int max_num_batched_tokens, bool chunked_prefill, char *err,
               size_t errlen);
void sched_free(struct sched *s);

// cap_tokens: the most tokens the sequence will hold (prompt + max_tokens).
int sched_seq_init(struct sched_seq *q, int32_t *tokens, int n_prompt, int cap_tokens);
void sched_seq_free(struct sched_seq *q);

// Appends a new sequence to the waiting queue.
void sched_add(struct sched *s, struct sched_seq *q);
// Takes a finished or cancelled sequence out, releasing its blocks.
void sched_remove(struct sched *s, struct sched_seq *q);

// Plans one step into ranks[].batch; returns the number of sequences
// scheduled (at least one whenever any sequence waits or runs).
int sched_plan(struct sched *s);
// After the step ran: the fed tokens count as computed and their full blocks
// go to the prefix cache.
void sched_commit(struct sched *s, struct sched_seq *q);

#endif
