// engine: the continuous-batching engine. One engine thread owns every
// sequence, the KV block managers of all ranks and the step loop; other
// threads use only the functions below, which are thread-safe.
#ifndef MOESERVE_SCHEDULER_ENGINE_H
#define MOESERVE_SCHEDULER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/sampling.h"
#include "tokenizer/tokenizer.h"

struct metrics; // scheduler/metrics.h
struct grammar; // grammar/grammar.h

struct engine_opts {
    enum backend_device device;  // --device: auto (the default), cpu, cuda
    int data_parallel_size;      // ranks (1)
    bool enable_expert_parallel; // shard experts over the ranks (required when ranks > 1)
    int n_threads;               // total compute threads, split between ranks (0: all cores)
    size_t kv_cache_bytes;       // total KV budget, split between ranks (0: a share of the
                                 // backend's free memory; on a GPU what the weights and the
                                 // workspace leave of gpu_memory_utilization)
    double gpu_memory_utilization; // (0, 1]: the share of each GPU's memory moeserve may use (0.9)
    enum dtype kv_dtype;         // DTYPE_BF16, DTYPE_F16 or DTYPE_F32
    int max_num_seqs;            // running sequences per rank, as vLLM's per engine (256)
    int max_num_batched_tokens;  // tokens per step per rank (2048)
    int max_model_len;           // 0: the config's max_position_embeddings
    bool enable_prefix_caching;  // true
    bool enable_chunked_prefill; // true
    int max_waiting_requests;    // submit fails with MS_EBUSY beyond this (0: unbounded)
    bool prefault_memory;        // fault in the KV pools, step workspaces and logits at start
                                 // (kv_pool_prefault, rank_prefault), not as the first steps
                                 // reach their pages (false)
    bool enforce_eager;          // vLLM's --enforce-eager: decode steps never replay graphs (on a
                                 // backend that records them, CUDA; else nothing changes)
    struct metrics *metrics;     // fed every step and at each request's milestones (NULL: none)
};
void engine_opts_default(struct engine_opts *o);

struct engine_stop {
    int max_tokens;              // generated tokens at most (> 0)
    // vLLM's min_tokens: until this many are generated, the model's eos ids
    // and the stop ids cannot be sampled and stop strings are not looked for
    // (0: off; at most max_tokens)
    int min_tokens;
    bool ignore_eos;
    bool include_stop_str;       // a matched stop string stays at the text's end (vLLM's
                                 // include_stop_str_in_output)
    const int32_t *stop_ids;     // extra stop token ids
    int n_stop_ids;
    const char *const *stop_strs; // matched on the detokenized text; never appear in output
    int n_stop_strs;
    bool skip_special_tokens;    // in the detokenized text (true by default)
};

struct engine_request {
    const int32_t *prompt;       // (n_prompt) token ids; copied by engine_submit
    int n_prompt;
    struct sampling_params sampling;
    struct engine_stop stop;     // strings and arrays copied by engine_submit
    // Structured output: every token drawn while the grammar is active is
    // one its matcher allows (the mask goes to the backend's sample op
    // before everything else). NULL: free text. engine_submit takes its own
    // reference; the grammar must have been compiled for the model's
    // vocabulary size.
    struct grammar *grammar;
    // vLLM's allowed_token_ids: only these may be drawn (with a grammar,
    // those the grammar allows too); NULL: any. Copied by engine_submit.
    const int32_t *allowed_ids;
    int n_allowed_ids;
    int32_t grammar_after;       // -1: from the first token; else once this id has been
                                 // generated (Qwen3's </think>: the reasoning stays free)
    // Stop strings are not matched from a stop_pause_open token to the next
    // stop_pause_close token (-1: never): a tool call's JSON is not cut. A
    // body that does not open as a call ('{' or '<' after any whitespace) is
    // matched again from its first text: it will be content.
    int32_t stop_pause_open, stop_pause_close;
};
void engine_request_default(struct engine_request *r);

enum engine_finish {
    FINISH_NONE = 0,             // more deltas follow
    FINISH_STOP,                 // eos, a stop id or a stop string
    FINISH_LENGTH,               // max_tokens or max_model_len
    FINISH_ABORT,                // cancelled, drained, or an internal error
    FINISH_COUNT_,
};
const char *engine_finish_name(enum engine_finish f); // "stop", "length", "abort"

// One batch of output for a request. Pointers are valid only during the call.
struct engine_delta {
    uint64_t request_id;
    const struct sample_token *prompt_tokens_lp; // prompt logprobs, once, before any token (or NULL)
    int n_prompt_tokens_lp;
    const struct sample_token *tokens;  // new tokens (usually one)
    int n_tokens;
    const char *text;                   // text released by this delta (held-back stop-string tails excluded)
    size_t text_len;
    enum engine_finish finish;          // not FINISH_NONE on the last delta, and only there
    const char *stop_str;               // the matched stop string, or NULL
    int32_t stop_id;                    // the matched stop_ids entry, or -1 (the model's eos too)
    int prompt_tokens;                  // usage, valid on every delta
    int completion_tokens;
    int cached_tokens;                  // prompt tokens served from the prefix cache
    const char *error;                  // on FINISH_ABORT after an internal error, its sentence
};

// Called on the engine thread: copy what you need and return quickly; never
// call engine functions from it. After the delta with finish set, never again.
struct engine_sink {
    void (*on_delta)(void *ctx, const struct engine_delta *d);
    void *ctx;
};

struct engine;

// Creates the ranks (a backend each, KV pools, thread shares, expert shards)
// and the engine thread. tok may be NULL (no text, no stop strings).
int engine_create(const struct model *m, const struct tokenizer *tok, const struct engine_opts *o,
                  struct engine **out, char *err, size_t errlen);
// Returns MS_ETOOLONG (prompt + max_tokens beyond max_model_len, both
// numbers in err), MS_ENOFIT (cannot fit one rank's KV pool), MS_EBUSY
// (queue full or draining), MS_EINVAL (bad parameters).
int engine_submit(struct engine *e, const struct engine_request *r, const struct engine_sink *sink,
                  uint64_t *id_out, char *err, size_t errlen);
// Frees the request's blocks at the next step; its sink receives a final
// FINISH_ABORT delta. Unknown or finished ids are ignored.
void engine_cancel(struct engine *e, uint64_t id);
// Stops admitting (submit returns MS_EBUSY), lets running requests finish for
// up to timeout_s, aborts the rest. Returns once nothing is in flight.
void engine_drain(struct engine *e, double timeout_s);
void engine_destroy(struct engine *e);

int engine_max_model_len(const struct engine *e);
// The compute threads of all ranks together (--threads, or every online core when 0).
int engine_threads(const struct engine *e);

#define ENGINE_MAX_RANKS 64

// Where a rank's step time goes: the forward pass's phases (model/forward.h's
// enum fwd_phase, in its order), then sampling.
enum engine_phase {
    ENGINE_PHASE_ATTENTION,      // embedding, attention, the norms before each MLP
    ENGINE_PHASE_MOE,            // the MLP / MoE layers, their exchanges included
    ENGINE_PHASE_LM_HEAD,        // final norm and lm_head, its exchanges included
    ENGINE_PHASE_SAMPLING,
    ENGINE_PHASES
};
extern const char *const engine_phase_names[ENGINE_PHASES]; // "attention", "moe", "lm_head", "sampling"

struct engine_rank_stats {
    int kv_blocks_total;
    int kv_blocks_used;          // referenced by running sequences
    int kv_blocks_cached;        // unreferenced, held by the prefix cache
    int num_running;
    // Cumulative wall time over all steps, in seconds.
    double phase_seconds[ENGINE_PHASES];
    // Of those, the decode steps' (every sequence one new token wanting its
    // logits; rank_stats' decode_steps): the rest is what the steps that
    // carried prompt tokens (or, on an expert-parallel rank, none) took.
    uint64_t decode_steps;
    double decode_phase_seconds[ENGINE_PHASES];
    double exchange_seconds;     // in MoE and lm_head exchanges (inside those phases)
    double forward_seconds;      // whole forward passes
    uint64_t padded_steps;       // decode steps run padded to a bucket
    uint64_t graph_steps;        // of those, replayed from a recorded graph
};

struct engine_stats {
    int num_running, num_waiting;
    int n_ranks;
    struct engine_rank_stats rank[ENGINE_MAX_RANKS];
    uint64_t prefix_cache_queries;   // prompt tokens looked up (a request's first admission)
    uint64_t prefix_cache_hits;      // prompt tokens found
    uint64_t num_preemptions;
    uint64_t prompt_tokens_total;    // of requests whose first token came (prefill done)
    uint64_t generation_tokens_total;
    uint64_t request_success[FINISH_COUNT_];
    uint64_t steps;
    double last_step_end;            // ms_now() at the end of the last step (liveness)
    bool draining;
};
void engine_get_stats(struct engine *e, struct engine_stats *out);

#endif
