// makemodel: writes a random-weight checkpoint in Hugging Face layout
// (config.json, generation_config.json, model.safetensors in bf16, or with
// FP8 or GPTQ projections, tokenizer files) for demos and tests, streamed to
// disk and renamed into place.
#ifndef MOESERVE_MODEL_MAKEMODEL_H
#define MOESERVE_MODEL_MAKEMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/model.h"

#define MAKEMODEL_MAX_MLP_ONLY 16

// The architecture to write. makemodel_spec_for_shape fills the named
// shapes; tests may edit a spec to cover dense, tied or mixed layouts.
struct makemodel_spec {
    enum model_arch arch;
    int vocab_size;
    int hidden_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int intermediate_size;      // dense MLP width (written for MoE too, as HF does)
    int moe_intermediate_size;  // per-expert width (MoE only)
    int n_experts;              // MoE only
    int n_experts_per_tok;      // MoE only
    bool norm_topk_prob;
    int decoder_sparse_step;
    int n_mlp_only;
    int mlp_only_layers[MAKEMODEL_MAX_MLP_ONLY];
    bool tie_word_embeddings;
    double rope_theta;
    double rms_norm_eps;
    int max_position_embeddings;
    // The projections' format on disk: QUANT_METHOD_NONE (bf16), FP8
    // (e4m3 with weight_scale_inv blocks, as Qwen's FP8 releases) or GPTQ
    // (4-bit qweight/qzeros/scales/g_idx, v1 format, as Qwen's GPTQ-Int4),
    // quantized from the very bf16 values the plain checkpoint of the same
    // seed holds. Everything else stays bf16.
    // AWQ (AutoAWQ's GEMM layout) and compressed-tensors (CT_INT:
    // pack-quantized int4 or int8 by group; CT_FP8: float-quantized FP8 by
    // channel, as RedHatAI's FP8-dynamic releases) are written the same way.
    enum quant_method quant;
    int quant_group;            // FP8 block (rows and inputs), GPTQ/AWQ/CT_INT group_size; 0: 128
    bool quant_asym;            // GPTQ, CT_INT int4: asymmetric zero points (sym: every zero 8)
    int quant_bits;             // CT_INT: 4 or 8 (0: 4)
    // GPTQ, CT_INT: act-order, as GPTQ's desc_act (compressed-tensors'
    // actorder group) writes it: each projection's inputs quantized in a
    // random order of their own (the same for the matrices that read one
    // input: an expert's gate and up, q, k and v), G at a time, and g_idx
    // (weight_g_idx) saying each input's group.
    bool quant_act_order;
};

// What a weight is for, which sets how it is drawn.
enum weight_role {
    ROLE_EMBED, ROLE_NORM, ROLE_QK_NORM, ROLE_QKV, ROLE_O, ROLE_ROUTER,
    ROLE_EXPERT_IN,   // an expert's gate_proj or up_proj
    ROLE_EXPERT_DOWN,
    ROLE_DENSE_IN,    // a dense MLP's gate_proj or up_proj
    ROLE_DENSE_DOWN,
    ROLE_LM_HEAD,
};
// How make-model (and --load-format dummy) draws a weight of that role in a
// model of that size; ffn is the MLP width of the weight's layer (per
// expert for experts), q_dim n_heads * head_dim.
struct weight_init {
    enum tensor_init init;
    float scale;
};
struct weight_init makemodel_weight_init(enum weight_role r, int hidden, int n_layers, int q_dim,
                                         int ffn);

// "tiny", "demo" or "mid"; MS_EINVAL with a sentence for anything else.
int makemodel_spec_for_shape(const char *shape, struct makemodel_spec *spec, char *err,
                             size_t errlen);

// Number of parameters the spec's checkpoint holds (lm_head counted unless tied).
uint64_t makemodel_param_count(const struct makemodel_spec *spec);

// Writes the checkpoint into out_dir (created if missing), quantized as
// spec->quant says. Weights come from
// a generator seeded by seed, so the same seed gives the same bytes. When
// tokenizer_dir is non-NULL its tokenizer.json and tokenizer_config.json are
// copied in; NULL writes no tokenizer. Each file is written under a temporary
// name and renamed into place, config.json last.
int makemodel_write(const struct makemodel_spec *spec, const char *out_dir, uint64_t seed,
                    const char *tokenizer_dir, char *err, size_t errlen);

#endif
