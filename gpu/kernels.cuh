// kernels.cuh: the launchers of the CUDA backend's kernels, one .cu each,
// and the argument blocks they take. Each launcher queues its work on the
// given stream and returns the launch status (cudaGetLastError), which
// backend_cuda.cu turns into a backend failure with CUDA's sentence.
// Pointers are device memory unless a field says otherwise.
#ifndef MOESERVE_GPU_KERNELS_CUH
#define MOESERVE_GPU_KERNELS_CUH

#include "gpu/common.cuh"
#include "gpu/plan.h"

cudaError_t cuda_embed(cudaStream_t s, const void *table, enum dtype t, int hidden,
                       const int32_t *ids, int n, float *x);
cudaError_t cuda_rmsnorm(cudaStream_t s, const float *x, size_t ldx, const int32_t *rows, int n,
                         const void *w, enum dtype wt, int width, float eps, float *out);
cudaError_t cuda_silu_mul(cudaStream_t s, float *g, const float *u, size_t n);
cudaError_t cuda_gather_rows(cudaStream_t s, const float *src, size_t ld, const int32_t *rows,
                             int n, int width, float *dst);
cudaError_t cuda_moe_combine(cudaStream_t s, float *x, const float *expert_out, const int32_t *slot,
                             const float *weights, int n_tokens, int k, int width);
cudaError_t cuda_router_topk(cudaStream_t s, const float *logits, int n, int n_experts, int k,
                             bool norm_topk, int32_t *ids, float *weights);
// The routing (moe_route.cu): backend_route's fields.
struct cuda_route {
    const int32_t *ids, *live;
    int n_tokens, k, e0, e1, pad;
    int32_t *off, *count, *slot, *token, *pair;
};
size_t cuda_moe_route_smem(int n_experts);
cudaError_t cuda_moe_route(cudaStream_t s, const struct cuda_route *r);

// Return slots of a fixed-size exchange (moe_return.cu); first is copied
// into the launch.
#define CUDA_MAX_RANKS 64
struct cuda_return {
    const int32_t *ids, *live;
    int n_tokens, k, n_ranks, stride;
    int32_t first[CUDA_MAX_RANKS + 1];
    int32_t *slot;
};
cudaError_t cuda_moe_return(cudaStream_t s, const struct cuda_return *p);
cudaError_t cuda_dummy_fill(cudaStream_t s, const struct tensor *t, size_t n, void *dst);
// A quantized matrix (t->quant.format != QUANT_NONE) into dst, tensor_bytes(t)
// bytes of device memory, in gpu/qlayout.h's blocks (qweights.cu); st is
// scratch the caller keeps across calls and frees with cuda_qstage_free.
struct cuda_qstage {
    void *p;
    size_t cap;
};
cudaError_t cuda_qweight_fill(cudaStream_t s, const struct tensor *t, void *dst, struct cuda_qstage *st);
void cuda_qstage_free(struct cuda_qstage *st);
// Queues `blocks` x 256 threads of fp32 FMA chains; flops_out: the FLOPs queued.
cudaError_t cuda_fma_burn(cudaStream_t s, int blocks, long iters, float *sink, double *flops_out);

// One matmul or grouped matmul (gemm.cu).
struct cuda_mm {
    enum dtype wtype;
    const void *w;                  // the matrix (dense), or NULL with wtab
    const void *const *wtab;        // (n_groups) each group's matrix (grouped)
    int o0, n_out, K;
    const float *x;
    size_t ldx;
    const int32_t *x_rows;
    float *y;
    size_t ldy;
    const int32_t *y_rows;
    const int32_t *off;             // (n_groups + 1) grouped row offsets, or NULL: `rows` rows
    int n_groups;
    int rows;                       // dense rows
    int max_rows;                   // bound on the rows in all (dense: rows)
    int max_group_rows;             // bound on one group's rows (picks the tile)
    int2 *tiles;                    // grouped: scratch of tiles_cap tiles, and their count
    int *n_tiles;
    int tiles_cap;
    int pad;                        // grouped: 8 or 64 when off is padded to it (no tile list)
    bool accumulate;
    enum quant_format quant;        // QUANT_NONE, or w / wtab hold gpu/qlayout.h's blocks
    int group;                      // quantized: inputs per scale group
};
cudaError_t cuda_matmul(cudaStream_t s, const struct cuda_mm *m);

// q/k norm + RoPE + KV store (rope_store.cu).
struct cuda_rope {
    int n_tokens, n_heads, n_kv_heads, head_dim;
    float eps;
    const void *q_norm, *k_norm;
    enum dtype q_norm_t, k_norm_t;
    const double *inv_freq;         // (head_dim / 2)
    const int32_t *tok_pos, *tok_seq, *bt_start, *bt;
    float *q, *k;
    const float *v;
    void *kl, *vl;                  // this layer's K and V
    enum dtype kv_dtype;
};
cudaError_t cuda_rope_store(cudaStream_t s, const struct cuda_rope *p);

// Paged attention over plan_attention's items (attention.cu), or, with
// items NULL, a decode step's items derived on the device: n_items = n_seqs
// x split, n_combine = n_seqs (0 when split is 1).
struct cuda_attn {
    const struct plan_attn_item *items;
    int n_items;
    const struct plan_attn_combine *combine;
    int n_combine;
    int split, max_chunks;          // decode: items per sequence, partial sets per sequence
    int tile_tokens;                // the plan's tile (shared memory is sized by it)
    int chunk;                      // the plan's chunk of KV positions
    int n_kv_heads, n_q, head_dim;  // n_q: query heads per KV head
    float scale;
    const int32_t *tok_pos, *bt_start, *bt;
    const void *k, *v;              // this layer's K and V
    enum dtype kv_dtype;
    const float *q;
    float *out;
    float *part_acc, *part_m, *part_l; // split-KV partial rows
};
size_t cuda_attention_smem(int rows, int head_dim);
cudaError_t cuda_attention(cudaStream_t s, const struct cuda_attn *p);

// Sampling (sample.cu): one row's parameters and its slices of the tables.
struct cuda_sample_row {
    const float *logits;
    float temperature, top_p, min_p, rep, freq, pres;
    int top_k, logprobs, prompt_logprobs;
    int32_t score;
    uint64_t seed;
    uint32_t stream, position;
    int32_t bias_off, n_bias, pen_off, n_pen, allowed_off; // allowed_off < 0: no mask
};
// A distinct token of the prompt or output: in either (repetition), and its
// count in the output (frequency, presence).
struct cuda_penalty {
    int32_t id, seen, count;
};
struct cuda_sample {
    const struct cuda_sample_row *rows;
    const struct sampling_logit_bias *bias;
    const struct cuda_penalty *pen;
    const uint32_t *words;
    int vocab;
    float *work, *probs;            // (rows, vocab) each
    struct sample_token *out;       // (rows)
};
cudaError_t cuda_sample(cudaStream_t s, const struct cuda_sample *p, int n);

// A CUDA backend's stream and GPU (backend_cuda.cu), for the communicator;
// NULL / -1 when b is not a CUDA backend.
cudaStream_t backend_cuda_stream(const struct backend *b);
int backend_cuda_device(const struct backend *b);

#endif
