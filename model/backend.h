// backend: the seam between the forward pass's choreography (forward.c) and
// the arithmetic. One `struct backend` per rank owns a compute device (a
// group of CPU threads, or one GPU and its stream); forward.c and the engine
// do every memory and arithmetic operation of a step through its op table,
// and never look inside it. The CPU backend implements it (the numerical
// reference); gpu/ implements it for CUDA. backend_registry.c picks one.
//
// The contract every implementation keeps:
// - Memory. Tensors, workspaces, weights and the KV pool live in backend
//   memory: pointers from `alloc` (and the weights from `prepare_weights`).
//   The host reads and writes them only through `upload` and `download`
//   (on the CPU backend backend memory is host memory, but callers do not
//   rely on it). Pointer arguments of ops are backend memory unless the
//   field says "host".
// - Order. Ops on one backend run in the order they are called, each seeing
//   the results of the ones before it. An op may return before its work is
//   done (a GPU queues it); `download` and `sync` return only when every
//   earlier op has finished, so their results are then visible to the host.
//   Host buffers passed to an op (its "host" arguments) are read before the
//   op returns and may be reused at once.
// - Errors. Every op returns 0 or a negative `enum ms_status` code and then
//   leaves a sentence in `b->err` (what failed and, where it helps, what to
//   do). No op aborts or exits. A failed op may leave its outputs undefined;
//   later ops still run (so that expert-parallel ranks stay in lockstep).
// - Threads. A backend is used by one thread at a time (its rank's).
// - Ownership. `backend_create` (backend_registry.h) makes a backend and
//   `destroy` frees it; everything allocated or prepared on a backend
//   (memory, weights) must be freed on it before it is destroyed. Weights
//   prepared from a model must not outlive the model.
// - Results. Every op's result for one row depends only on that row's
//   inputs (never on the other rows of the batch, nor on how the batch is
//   split), so a sequence computes the same alone or batched. The CPU
//   backend's scalar table is the reference every other table and backend
//   is tested against (tests/model/test_backend_ops.c).
#ifndef MOESERVE_MODEL_BACKEND_H
#define MOESERVE_MODEL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/model.h"
#include "model/quant.h"
#include "model/sampling.h"

#define KV_BLOCK_TOKENS 16

enum backend_device {
    BACKEND_DEVICE_AUTO = 0,     // CUDA when built and a GPU is visible, else the CPU
    BACKEND_DEVICE_CPU,
    BACKEND_DEVICE_CUDA,
};

struct backend;

// A weight matrix (rows = outputs, cols = inputs) or vector (1, n) as the
// backend holds it: `data` row-major as stored, and/or the backend's own
// layout `priv` (the CPU backend's packed blocks). At least one is set.
//
// A quantized matrix (quant != QUANT_NONE; model/quant.h has the formulas)
// is held, in its row-major form, as
//   QUANT_FP8:  data  uint8 e4m3fn codes (rows, cols);
//               scale fp32 (ceil(rows / group_rows), ceil(cols / group_cols));
//               w = e4m3(q) * scale
//   QUANT_INT8: data  int8 (rows, cols); scale as for FP8; w = q * scale
//   QUANT_INT4: data  uint8 (rows, ceil(cols / 2)), input c in byte c / 2, the
//                     low nibble for even c, values 0..15;
//               scale as for FP8 (values an fp16 holds exactly);
//               zero  uint8 (ceil(rows / group_rows), ceil(cols / group_cols)), 0..16;
//               w = (q - zero) * scale
// (the last group of a row may be shorter), and/or in the backend's own
// layout: the CPU backend keeps only model/quant.h's packed blocks, in
// priv; the CUDA backend keeps only gpu/qlayout.h's blocks (the same
// bytes, ordered for its kernels), in data (scale and zero NULL; both:
// group_rows 1, group_cols the tensor's group). Activations stay fp32: only
// the weights are quantized.
struct backend_mat {
    enum dtype dtype;            // DTYPE_BF16, DTYPE_F16 or DTYPE_F32 (quantized: the model's dtype)
    int rows, cols;
    const void *data;            // (rows, cols) row-major, backend memory, or NULL
    const void *priv;            // backend-private layout, or NULL
    // Quantized matrices only (QUANT_NONE and zeros otherwise):
    enum quant_format quant;
    int group_rows, group_cols;  // outputs and inputs sharing one scale (FP8 checkpoints
                                 // 128 x 128; int8 / int4: 1 x 128 or the checkpoint's group)
    const void *scale;           // backend memory, or NULL
    const void *zero;            // QUANT_INT4: backend memory, or NULL
    // An act-order checkpoint's matrix (struct tensor_quant.perm): (cols)
    // backend memory, input j of the held matrix multiplies input perm[j]
    // of x, so a matmul computes y = x[:, perm] . w^T; NULL: x as it is
    // (also for an expert's down projection whose order its gate and up
    // write their outputs in: tensor_quant.perm_folded). The CPU backend
    // points it at the model's copy (which outlives the weights); the CUDA
    // backend refuses such matrices.
    const int32_t *perm;
};

// One layer's weights on this rank.
struct backend_layer {
    struct backend_mat attn_norm;   // (1, hidden)
    struct backend_mat wq;          // (n_heads * head_dim, hidden)
    struct backend_mat wk, wv;      // (n_kv_heads * head_dim, hidden)
    struct backend_mat wo;          // (hidden, n_heads * head_dim)
    struct backend_mat q_norm;      // (1, head_dim)
    struct backend_mat k_norm;      // (1, head_dim)
    struct backend_mat ffn_norm;    // (1, hidden)
    bool is_moe;
    struct backend_mat router;      // (n_experts, hidden)
    // (n_experts) each, indexed by global expert id; only [expert_begin,
    // expert_end) are held (the others are zero-sized).
    struct backend_mat *expert_gate; // (moe_ffn, hidden) each
    struct backend_mat *expert_up;   // (moe_ffn, hidden) each
    struct backend_mat *expert_down; // (hidden, moe_ffn) each
    struct backend_mat gate, up;    // dense layers: (ffn, hidden)
    struct backend_mat down;        // dense layers: (hidden, ffn)
};

// A model's weights as one backend holds them for one rank: the replicated
// non-expert weights and the experts [expert_begin, expert_end). Made by
// prepare_weights, freed by release_weights; read-only in between, so that
// ranks sharing a memory may share them (the CPU backend does).
struct backend_weights {
    const struct model_config *cfg; // the model's, which must outlive this
    struct backend_mat embed;       // (vocab, hidden)
    struct backend_mat final_norm;  // (1, hidden)
    struct backend_mat lm_head;     // (vocab, hidden)
    struct backend_layer *layers;   // (n_layers)
    int expert_begin, expert_end;
    double *rope_inv_freq;          // (head_dim / 2) theta^(-2i / head_dim), host memory
    void *priv;                     // the backend's bookkeeping
};

// A rank's paged KV cache. Keys are stored transposed within their block, so
// that attention reads one dimension of 16 keys as one vector. Block ids
// 0..n_blocks-1 are the sequences'; one more block, id n_blocks, is scratch
// that no sequence owns: the padding rows of a decode step padded to its
// bucket (forward.c) write their K and V there.
struct kv_pool {
    enum dtype dtype;            // DTYPE_BF16, DTYPE_F16 or DTYPE_F32
    int n_blocks;                // the sequences' blocks (the pool holds n_blocks + 1)
    int n_layers, n_kv_heads, head_dim;
    size_t block_bytes;          // K and V of one block over all layers
    size_t layer_elems;          // K (or V) elements of one layer: (n_blocks + 1) * n_kv_heads * 16 * head_dim
    void *k;                     // (n_layers, n_blocks + 1, n_kv_heads, head_dim, KV_BLOCK_TOKENS)
    void *v;                     // (n_layers, n_blocks + 1, n_kv_heads, KV_BLOCK_TOKENS, head_dim)
};

// The token layout of one step, in backend memory, with the same arrays on
// the host for plans a backend makes there. Sequences' new tokens are
// consecutive: sequence s owns tokens [seq_start[s], seq_start[s + 1]).
struct backend_step {
    int n_tokens;                // T
    int n_seqs;                  // S
    int max_ctx;                 // the longest n_past + n_new of the step
    const int32_t *tok_pos;      // (T) each new token's position in its sequence
    const int32_t *tok_seq;      // (T) its sequence
    const int32_t *seq_start;    // (S + 1)
    const int32_t *bt_start;     // (S + 1) where each sequence's block table starts in bt
    const int32_t *bt;           // (bt_start[S]) block ids into the pool
    const int32_t *h_tok_pos, *h_tok_seq, *h_seq_start, *h_bt_start, *h_bt; // host copies
};

// One matmul: y (rows, n_out) (=|+=) x (rows, w.cols) . w[o0 : o0 + n_out]^T,
// in fp32. Rows are gathered from x and scattered into y through index
// lists (both backend memory), which is how experts read their tokens
// without copying them. n_out 0 means every output row of w from o0.
struct backend_mm {
    const struct backend_mat *w; // host pointer to a prepared matrix
    int o0, n_out;
    const float *x;              // row r at x + (x_rows ? x_rows[r] : r) * ldx
    size_t ldx;
    const int32_t *x_rows;       // (rows) or NULL
    float *y;                    // row r at y + (y_rows ? y_rows[r] : r) * ldy
    size_t ldy;
    const int32_t *y_rows;       // (rows) or NULL
    int rows;
    bool accumulate;             // y += x . w^T (a residual add)
};

// Grouped experts: group g multiplies rows [off[g], off[g + 1]) by w[g].
// The row ranges live in backend memory, so that a device can route tokens
// without telling the host; h_off is the same array on the host when the
// caller has it (else NULL), and max_rows bounds off[n_groups] for sizing.
// x row i is x[x_rows ? x_rows[i] : i]; y row i is y[y_rows ? y_rows[i] : i].
// Padded groups (moe_route's offsets, pad > 1): every group's rows are a
// multiple of pad, and its padding rows, which follow its real ones, carry
// a negative x_rows (or y_rows) entry: they are neither read nor written.
struct backend_gmm {
    const struct backend_mat *w; // (n_groups) host array of prepared matrices, same shape
    int n_groups;
    const int32_t *off;          // (n_groups + 1)
    const int32_t *h_off;        // (n_groups + 1) host, or NULL
    int max_rows;
    const float *x;
    size_t ldx;
    const int32_t *x_rows;       // (off[n_groups]) or NULL
    float *y;
    size_t ldy;
    const int32_t *y_rows;       // (off[n_groups]) or NULL
    int pad;                     // 0 or 1: any offsets; > 1: padded as moe_route pads with it
};

// The routing of one MoE layer's (token, slot) pairs to experts [e0, e1)
// (fwd_plan_route is the host twin; all arrays backend memory): pairs p =
// t * k + j whose expert ids[p] is in [e0, e1), and whose token is live, are
// sorted by expert, tokens ascending within one, each expert's rows padded
// to a multiple of pad. Pairs of other experts and of dead tokens are left
// out (slot -1): the rank's other experts, another rank's, the padding
// tokens of a padded decode step.
struct backend_route {
    const int32_t *ids;          // (n_tokens, k) each pair's expert (any value)
    const int32_t *live;         // (n_tokens) 0 for a token to leave out, or NULL: all live
    int n_tokens, k;
    int e0, e1;                  // the experts routed
    int pad;                     // >= 1: each expert's rows a multiple of pad (route_pad's)
    int32_t *off;                // (e1 - e0 + 1) each expert's first row; off[e1 - e0]: rows in all
    int32_t *count;              // (e1 - e0) each expert's pairs (its rows without padding), or NULL
    int32_t *slot;               // (n_tokens * k) each pair's row, -1 when left out
    int32_t *token;              // (fwd_plan_route_rows(n_tokens * k, e1 - e0, pad)) each row's
                                 // token, -1 for a padding row
    int32_t *pair;               // (as token) each row's pair t * k + j, -1 for padding, or NULL
};

// A recorded sequence of ops (graph_begin .. graph_end), replayed by graph_launch.
struct backend_graph;

// One row to sample from (host memory; the arrays it points to are host
// memory too unless marked). The logits row is modified in place (bias,
// penalties, temperature, filters).
struct backend_sample_row {
    float *logits;               // (vocab) backend memory
    const struct sampling_params *p;
    const int32_t *prompt;       // (n_prompt) host: the sequence's prompt, for the penalties
    int n_prompt;
    const int32_t *output;       // (n_output) host: tokens generated so far
    int n_output;
    uint32_t position;           // index in the sequence of the token drawn (the generator's counter)
    const uint32_t *allowed;     // ((vocab + 31) / 32) host bitmask of the tokens allowed, or NULL: all
    int32_t score;               // >= 0: no draw; the logprob of this id and p->prompt_logprobs
                                 // alternatives from the raw row (a prompt token); -1: draw
};

// What a backend can hold and how fast it runs, for sizing and benchmarks.
struct backend_memory {
    uint64_t total_bytes;        // the device's memory (the host's RAM on the CPU)
    uint64_t free_bytes;         // available now
    bool host_shared;            // the host and the backend share this memory
    // The most the backend allocates for itself, beyond what callers alloc,
    // once steps run (a GPU's split-KV attention partials): the planner
    // counts it in the runtime reserve, so that the KV pool leaves it room.
    uint64_t scratch_bytes;
    // Bytes the sampler allocates per logit of a call (rows x vocab) beyond
    // the logits themselves (a GPU's work and probability rows): the
    // planner adds them to its logits allowance (max_num_seqs x vocab).
    uint32_t sample_bytes_per_logit;
};

struct backend_limits {
    double read_bytes_per_s;     // streaming read bandwidth, measured now
    double flops;                // fp32 FMA peak, measured now
};

struct backend_ops {
    const char *name;            // "cpu", "cuda"

    // ---- memory ----------------------------------------------------------------
    // bytes of backend memory, 64-byte aligned, zeroed. Pages may be committed
    // lazily: a workspace sized for the worst step costs only what steps touch.
    int (*alloc)(struct backend *b, size_t bytes, void **out);
    void (*free)(struct backend *b, void *p);
    // dst (backend) <- src (host), and dst (host) <- src (backend).
    int (*upload)(struct backend *b, void *dst, const void *src, size_t bytes);
    int (*download)(struct backend *b, void *dst, const void *src, size_t bytes);
    // Within backend memory: rows of `bytes` bytes, dst_pitch and src_pitch
    // bytes apart (a strided copy; rows 1 is a plain one). The areas must
    // not overlap.
    int (*copy_2d)(struct backend *b, void *dst, size_t dst_pitch, const void *src,
                   size_t src_pitch, size_t bytes, int rows);
    // Returns when every op called before it has finished.
    int (*sync)(struct backend *b);
    int (*memory)(struct backend *b, struct backend_memory *out);
    // Measures read bandwidth and FMA peak (a second or so; benchmarks only).
    int (*measure_limits)(struct backend *b, struct backend_limits *out);
    // The kernel variant in use, for logs ("avx512", "amx", "sm_90", ...).
    const char *(*variant)(const struct backend *b);

    // ---- weights ---------------------------------------------------------------
    // Makes m's weights usable by this backend: the CPU repacks them into its
    // layout (once per model, shared by every CPU rank), a GPU uploads the
    // replicated weights and the experts [expert_begin, expert_end). A model
    // loaded with --load-format dummy has no weight bytes: its weights are
    // made here, in backend memory (model.h says how).
    int (*prepare_weights)(struct backend *b, const struct model *m, int expert_begin,
                           int expert_end, struct backend_weights **out);
    void (*release_weights)(struct backend *b, struct backend_weights *w);
    // A KV pool of n_blocks blocks and its scratch block in backend memory
    // (kv_pool_create checks the arguments and sizes; this allocates and
    // fills in k and v).
    int (*kv_alloc)(struct backend *b, struct kv_pool *kv);
    void (*kv_free)(struct backend *b, struct kv_pool *kv);
    // Makes [p, p + bytes) of memory from alloc or kv_alloc resident now
    // (kv_pool_prefault, rank_prefault): where those map pages lazily, a
    // step otherwise pays each page's first touch. NULL on a backend whose
    // memory is committed when allocated (cudaMalloc).
    int (*prefault)(struct backend *b, void *p, size_t bytes);

    // ---- ops over batches of rows ---------------------------------------------
    // ids (n) -> x (n, hidden): rows of the embedding, in fp32.
    int (*embed)(struct backend *b, const struct backend_weights *w, const int32_t *ids, int n,
                 float *x);
    // x (rows of ldx, gathered through rows when non-NULL) (n, w.cols) ->
    // out (n, w.cols) contiguous: x / sqrt(mean(x^2) + eps) * w.
    int (*rmsnorm)(struct backend *b, const float *x, size_t ldx, const int32_t *rows, int n,
                   const struct backend_mat *w, float eps, float *out);
    // Runs every job (in any order or together: their outputs must not overlap).
    int (*matmul)(struct backend *b, const struct backend_mm *jobs, int n_jobs);
    int (*grouped_matmul)(struct backend *b, const struct backend_gmm *jobs, int n_jobs);
    // Layer l's q_norm / k_norm over each head, NeoX RoPE at each token's
    // position, then K and V into the token's slot of its sequence's block:
    // q (T, n_heads * head_dim) in place; k (T, n_kv_heads * head_dim) in
    // place; v (T, n_kv_heads * head_dim) read.
    int (*qk_norm_rope_store)(struct backend *b, const struct backend_weights *w, int layer,
                              const struct backend_step *s, struct kv_pool *kv, float *q, float *k,
                              const float *v);
    // Causal attention of every new token over its sequence's positions
    // 0..its own, in layer l of the pool (prefill chunks and decode rows in
    // one call): q (T, n_heads * head_dim) -> out (T, n_heads * head_dim).
    int (*attention)(struct backend *b, const struct backend_weights *w, int layer,
                     const struct backend_step *s, const struct kv_pool *kv, const float *q,
                     float *out);
    // logits (n, n_experts) -> ids (n, k), weights (n, k): the k largest
    // (ties: lowest id; a NaN logit ranks as -inf), their softmax weights
    // (over all n_experts, in double), renormalised over the k when norm_topk.
    int (*router_topk)(struct backend *b, const float *logits, int n, int n_experts, int k,
                       bool norm_topk, int32_t *ids, float *weights);
    // Routes a MoE layer's pairs (struct backend_route), on the backend:
    // nothing is read back to the host.
    int (*moe_route)(struct backend *b, const struct backend_route *r);
    // The pad moe_route should use for n_pairs pairs over n_groups experts:
    // the row tile this backend's grouped matmul runs (1: none needed).
    int (*route_pad)(const struct backend *b, int n_pairs, int n_groups);
    // Where each pair's expert output comes back in a fixed-size exchange
    // (fwd_plan_return_slot): ids (n_tokens, k) -> slot (n_tokens * k),
    // rank p owning experts [first[p], first[p + 1]) (first: host, n_ranks +
    // 1), stride rows from each rank; -1 for tokens with live[t] == 0 (live
    // NULL: all live) and experts no rank owns.
    int (*moe_return_slots)(struct backend *b, const int32_t *ids, const int32_t *live,
                            int n_tokens, int k, const int32_t *first, int n_ranks, int stride,
                            int32_t *slot);
    // g (n) = silu(g) * u.
    int (*silu_mul)(struct backend *b, float *g, const float *u, size_t n);
    // dst row i (n, width) = src row rows[i].
    int (*gather_rows)(struct backend *b, const float *src, size_t ld, const int32_t *rows, int n,
                       int width, float *dst);
    // x (n_tokens, width) += sum over j in 0..k-1, in that order, of
    // weights[t, j] * expert_out row slot[t, j]: the same sum whatever the
    // ranks or the batch. A pair whose slot is negative adds nothing; slot
    // NULL reads pair (t, j) at row t * k + j.
    int (*moe_combine)(struct backend *b, float *x, const float *expert_out, const int32_t *slot,
                       const float *weights, int n_tokens, int k, int width);
    // logits (n, n_out) = x (n, hidden) . lm_head[v0 : v0 + n_out]^T, rows
    // ldy apart (a vocabulary slice under expert parallelism).
    int (*lm_head)(struct backend *b, const struct backend_weights *w, int v0, int n_out,
                   const float *x, int n, float *logits, size_t ldy);
    // One token per row (or a score, see backend_sample_row) into out (n,
    // host), as vLLM's sampler: the allowed mask first, then logit_bias,
    // repetition / frequency / presence penalties, then greedy or
    // temperature, min_p, top_k, top_p and a draw keyed by (p->seed,
    // p->stream, position). Logprobs come from the raw row (log-softmax at
    // temperature 1); greedy takes the lowest id among equal maxima.
    int (*sample)(struct backend *b, const struct backend_sample_row *rows, int n, int vocab,
                  struct sample_token *out);

    // ---- captured steps (optional: all four NULL on a backend without them) ---
    // From graph_begin to graph_end, the ops called on this backend (and the
    // communicator calls enqueued on it) are recorded, not run. A recorded
    // op keeps the host arguments it was called with — sizes, pointers, the
    // host arrays it read — and reads backend memory when the graph runs, so
    // only steps whose host arguments are the same every time may be
    // recorded (forward.c's padded decode steps; attention then plans on the
    // device: one new token per sequence). alloc, upload, download and sync
    // cannot be recorded: calling them fails the recording.
    int (*graph_begin)(struct backend *b);
    // Ends the recording: *out is a graph to launch, or NULL with the failure
    // (an op that failed or could not be recorded, or the device refusing the
    // graph). Nothing recorded has run either way.
    int (*graph_end)(struct backend *b, struct backend_graph **out);
    // Runs a recorded graph after the ops before it (queued like an op). It
    // fails, changing nothing, when memory the graph used has been moved
    // since it was recorded (the backend's own scratch grew): record it again.
    int (*graph_launch)(struct backend *b, struct backend_graph *g);
    // Frees a graph (after its queued launches); before the backend is destroyed.
    void (*graph_free)(struct backend *b, struct backend_graph *g);

    void (*destroy)(struct backend *b);
};

struct backend {
    const struct backend_ops *ops;
    enum backend_device device;
    int index;                   // the rank it serves (logs)
    char err[480];               // the sentence of the last failed op
    void *impl;
};

// Writes the sentence of a failing op into b->err and returns code.
int backend_fail(struct backend *b, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// K+V bytes of one 16-token block over all layers; the planner uses the same.
size_t kv_block_bytes(const struct model_config *cfg, enum dtype dtype);
// Checks the arguments, sizes the pool and allocates it on b. The pool must
// be destroyed on the same backend, before it.
int kv_pool_create(struct backend *b, const struct model_config *cfg, enum dtype dtype,
                   int n_blocks, struct kv_pool **out, char *err, size_t errlen);
void kv_pool_destroy(struct backend *b, struct kv_pool *kv);
// Bytes of the pool's K, and of its V: what kv_alloc allocates for each.
static inline size_t kv_pool_bytes(const struct kv_pool *kv)
{
    return kv->layer_elems * (size_t)kv->n_layers * dtype_size(kv->dtype);
}
// [p, p + bytes) of b's memory resident now (ops->prefault; nothing where
// b has none: its memory is committed when allocated). On failure the
// sentence names what (the KV pool, a rank's workspace, ...).
int backend_prefault(struct backend *b, void *p, size_t bytes, const char *what, char *err,
                     size_t errlen);
// Faults in every page of the pool now (ops->prefault), as llama.cpp's
// server clears its KV buffer at start: where kv_alloc maps memory lazily
// (the CPU), the first steps otherwise pay each page's first touch (on VMs
// whose host takes back free guest memory, 2 MiB of it cost 10-15 ms), and
// on a machine short of memory the kernel's OOM killer acts mid-request
// instead of while the server starts. MS_ENOMEM with a sentence where the
// kernel says the memory is not there (it often kills a process first).
int kv_pool_prefault(struct backend *b, struct kv_pool *kv, char *err, size_t errlen);

#endif
