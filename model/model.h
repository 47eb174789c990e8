// model: a loaded checkpoint — its config and views of every weight tensor,
// memory-mapped from safetensors as stored (nothing copied).
#ifndef MOESERVE_MODEL_MODEL_H
#define MOESERVE_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

// A view of one tensor inside a mapped file. Row-major; shape[0] is the
// outermost dimension (for a Linear weight: (out_features, in_features)).
struct tensor {
    const void *data;
    const void *packed; // NULL, or this matrix in the CPU kernels' packed layout (model_load)
    enum dtype dtype;
    int ndim;
    int64_t shape[4];
};

struct expert_weights {
    struct tensor gate;  // (moe_ffn, hidden)
    struct tensor up;    // (moe_ffn, hidden)
    struct tensor down;  // (hidden, moe_ffn)
};

struct layer_weights {
    struct tensor attn_norm;  // (hidden)                     input_layernorm
    struct tensor wq;         // (n_heads * head_dim, hidden)  q_proj
    struct tensor wk;         // (n_kv_heads * head_dim, hidden)
    struct tensor wv;         // (n_kv_heads * head_dim, hidden)
    struct tensor wo;         // (hidden, n_heads * head_dim)  o_proj
    struct tensor q_norm;     // (head_dim)
    struct tensor k_norm;     // (head_dim)
    struct tensor ffn_norm;   // (hidden)                     post_attention_layernorm
    bool is_moe;
    // MoE layers
    struct tensor router;            // (n_experts, hidden)   mlp.gate
    struct expert_weights *experts;  // (n_experts) views, mlp.experts.{e}.*
    // dense layers
    struct tensor gate;   // (ffn, hidden)
    struct tensor up;     // (ffn, hidden)
    struct tensor down;   // (hidden, ffn)
};

struct model {
    struct model_config cfg;
    struct tensor embed;          // (vocab, hidden)  model.embed_tokens
    struct tensor final_norm;     // (hidden)         model.norm
    struct tensor lm_head;        // (vocab, hidden)  lm_head, or embed when tied
    struct layer_weights *layers; // (n_layers)
    size_t weight_bytes;          // sum over all tensors
    void *packed;                 // every matrix repacked for the CPU kernels, one mapping (or NULL)
    size_t packed_bytes;
    void *storage;                // the safetensors set (opaque to callers)
    char dir[4096];
};

// Loads DIR's config.json (+ generation_config.json) and maps its
// safetensors (single file or model.safetensors.index.json shards). Checks
// every tensor the config implies for presence, dtype and shape, printing
// expected against actual in err. When the CPU kernel table in use reads
// the packed layout faster (model/cpu/kernels.h), every matrix is repacked
// into one anonymous mapping and the file's pages for it are let go.
int model_load(const char *dir, struct model **out, char *err, size_t errlen);
void model_destroy(struct model *m);

// Bytes of weights a decode step reads for one token on a single rank:
// attention + norms + router + top-k experts per MoE layer + lm_head + one
// embedding row. Used by benchmarks and the planner's bandwidth bound.
size_t model_active_bytes(const struct model *m);

#endif
