// forward: one rank's batched forward pass over its paged KV cache — the
// interface the scheduler drives. One call runs one step for several
// sequences, each appending a prefill chunk or one decode token. The
// arithmetic goes through the rank's backend (model/backend.h); this module
// is the choreography, the same on every backend.
#ifndef MOESERVE_MODEL_FORWARD_H
#define MOESERVE_MODEL_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/comm.h"
#include "model/config.h"
#include "model/model.h"

// How decode steps run. A decode step is one where every rank's sequences
// each bring one new token and want its logits (a rank with none joins in).
enum fwd_decode {
    // Every step as it comes (vLLM's --enforce-eager).
    FWD_DECODE_EAGER = 0,
    // Decode steps are padded to a bucket of sequences (fwd_plan_bucket):
    // padding sequences of one token write the pool's scratch block, their
    // logits rows follow the real ones, they route to no expert; MoE rows
    // are exchanged in sizes known at the step's start (all-gather of the
    // ranks' rows, one row back per pair). From the step's header to its
    // end nothing is read back to the host. Run eagerly: the choreography a
    // graph records, on any backend.
    FWD_DECODE_PADDED,
    // As PADDED, each bucket's step recorded once as a graph (backend.h's
    // graph ops) and replayed; eager where the backend has no graph ops or
    // the recording fails (said once in the log).
    FWD_DECODE_GRAPHS,
};

struct rank_opts {
    int rank;              // this rank's index
    int n_ranks;           // ranks in the expert-parallel group
    struct comm *comm;     // NULL when n_ranks == 1: every expert is local
    int max_batch_tokens;  // most new tokens in one step on this rank (sizes the workspace)
    int max_batch_seqs;    // most sequences in one step on this rank
    int max_seq_len;       // longest sequence a step may reach (sizes the block tables; the
                           // engine's max_model_len); 0 or above it: max_position_embeddings
    enum fwd_decode decode; // every rank of a group the same
    int max_logit_rows;    // rows every logits buffer handed to rank_forward holds: padded steps
                           // write a row per bucket row (0: decode steps are never padded)
};

struct rank;

// Prepares the model's weights on backend b for this rank (the replicated
// ones and experts [expert_begin, expert_end): contiguous blocks of E/R) and
// maps the step workspace there. m, b and kv (a pool made on b) must
// outlive the rank; rank_destroy releases what rank_create made.
int rank_create(const struct model *m, struct backend *b, struct kv_pool *kv,
                const struct rank_opts *o, struct rank **out, char *err, size_t errlen);
void rank_destroy(struct rank *r);
// Faults in the rank's step workspace now (its backend's ops->prefault),
// which the first steps of the largest sizes would otherwise touch afresh
// (kv_pool_prefault says why that matters). MS_ENOMEM with a sentence.
int rank_prefault(struct rank *r, char *err, size_t errlen);
void rank_expert_range(const struct rank *r, int *begin, int *end);

struct fwd_seq {
    const int32_t *tokens; // (n_new) host: token ids appended this step
    int n_new;             // >= 1
    int n_past;            // tokens already in this sequence's KV: positions 0..n_past-1
    const int32_t *blocks; // host: block table, ceil((n_past + n_new) / 16) ids into the rank's pool
    int n_logits;          // logits wanted for the last n_logits new tokens (0..n_new)
};

struct fwd_batch {
    int n_seqs;            // 0 is valid: the rank still joins every MoE exchange
    const struct fwd_seq *seqs;
};

// Runs one step: writes the new tokens' K/V into their blocks and, for each
// sequence in order, n_logits rows of fp32 logits into logits (sum of
// n_logits, vocab), which is backend memory (the engine samples there; read
// it on the host with the backend's download). A padded decode step
// (rank_opts.decode) writes logits rows for its padding sequences after the
// real ones, up to max_logit_rows. Under expert parallelism every rank must
// call this for every step, in lockstep, with whatever batch it has
// (possibly empty); every rank's step starts with one exchange of the step's
// sizes (its header).
int rank_forward(struct rank *r, const struct fwd_batch *b, float *logits,
                 char *err, size_t errlen);

// The parts of a step whose wall time rank_stats accumulates: the embedding,
// attention and the norms before each MLP; the MLP or MoE layers with their
// exchanges; the final norm and the lm_head (with its exchanges under
// expert parallelism, and the step's header exchange). A replayed graph's
// launch counts as attention.
enum fwd_phase { FWD_PHASE_ATTENTION, FWD_PHASE_MOE, FWD_PHASE_LM_HEAD, FWD_PHASES };

// Counters the metrics read; updated by rank_forward.
struct rank_stats {
    uint64_t steps;
    uint64_t tokens;            // new tokens processed
    double last_step_seconds;   // wall time of the last rank_forward
    uint64_t padded_steps;      // decode steps run padded to a bucket
    uint64_t graph_steps;       // of those, replayed from a recorded graph
    double last_a2a_seconds;    // time in all-to-all exchanges during the last step
    const uint64_t *expert_tokens; // (n_experts) tokens this rank's local experts processed, all layers
    const uint64_t *layer_tokens;  // (n_layers) tokens this rank's local experts processed per layer
    // Cumulative over all steps, in seconds: each phase, the exchanges
    // (inside the MoE and lm_head phases), and whole forward passes.
    double phase_seconds[FWD_PHASES];
    // Of those, the decode steps' (every sequence one new token wanting its
    // logits): what the steps that carry prompt tokens took is the rest.
    uint64_t decode_steps;
    double decode_phase_seconds[FWD_PHASES];
    bool last_step_decode;      // the last rank_forward counted as a decode step
    double a2a_seconds_total;
    double forward_seconds_total;
};
void rank_get_stats(const struct rank *r, struct rank_stats *out);

#endif
