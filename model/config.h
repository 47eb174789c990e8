// config: the model's config.json and generation_config.json, reduced to the
// fields that change the computation, with everything we do not implement refused.
#ifndef MOESERVE_MODEL_CONFIG_H
#define MOESERVE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define CONFIG_MAX_LAYERS 512
#define CONFIG_MAX_EOS 16

enum model_arch {
    ARCH_QWEN3_MOE, // Qwen3MoeForCausalLM
    ARCH_QWEN3,     // Qwen3ForCausalLM (dense)
};

enum dtype {
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F32,
};

const char *dtype_name(enum dtype t);
size_t dtype_size(enum dtype t);

// How config.json's quantization_config says the checkpoint's projections
// are stored (model/quant.h reads them; model.c binds them).
enum quant_method {
    QUANT_METHOD_NONE = 0, // no quantization_config
    QUANT_METHOD_FP8,      // "fp8": F8_E4M3 weights with weight_scale_inv blocks (or one weight_scale)
    QUANT_METHOD_GPTQ,     // "gptq": 4-bit qweight, qzeros, scales, g_idx
    QUANT_METHOD_AWQ,      // "awq": 4-bit qweight, qzeros, scales in AutoAWQ's GEMM layout
    QUANT_METHOD_CT_INT,   // "compressed-tensors", pack-quantized: weight_packed, weight_scale, weight_shape
    QUANT_METHOD_CT_FP8,   // "compressed-tensors", float-quantized: F8_E4M3 weight, weight_scale
};

struct quant_config {
    enum quant_method method;
    int block_rows, block_cols; // fp8 weight_block_size; 0, 0: one scale per tensor (weight_scale)
    int group;                  // gptq and awq group_size; 0: one group over all inputs (-1 in the file)
    bool sym;                   // gptq, ct_int
    bool desc_act;              // gptq, ct_int (actorder group): g_idx may put the inputs in groups out of
                                // their order (the loader reads it into an input order: model.h's perms)
    int zero_offset;            // gptq: added to a stored zero point (1 for the v1 format, 0 for v2)
    int bits;                   // ct_int: 4 or 8
    bool channel;               // ct_fp8: one scale per output (weight_scale [out, 1])
};

// Default sampling from generation_config.json; has_* says the file set it.
struct gen_defaults {
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty;
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
    int max_new_tokens; // 0 when unset
};

struct model_config {
    enum model_arch arch;
    char model_type[32];             // "qwen3_moe", "qwen3"
    int hidden_size;
    int n_layers;                    // num_hidden_layers
    int n_heads;                     // num_attention_heads
    int n_kv_heads;                  // num_key_value_heads
    int head_dim;                    // may differ from hidden_size / n_heads
    int intermediate_size;           // dense MLP width (dense layers, Qwen3ForCausalLM)
    int moe_intermediate_size;       // per-expert width
    int n_experts;                   // num_experts (0 for dense)
    int n_experts_per_tok;           // num_experts_per_tok (top-k)
    bool norm_topk_prob;
    int decoder_sparse_step;
    bool layer_is_moe[CONFIG_MAX_LAYERS]; // from decoder_sparse_step and mlp_only_layers
    float rms_norm_eps;
    double rope_theta;
    int max_position_embeddings;
    bool tie_word_embeddings;
    int vocab_size;
    enum dtype torch_dtype;          // the checkpoint's declared dtype
    struct quant_config quant;       // quantization_config (method NONE when absent)
    int bos_token_id;                // -1 when none
    int eos_ids[CONFIG_MAX_EOS];     // generation_config.json's list when present, else config's
    int n_eos;
    struct gen_defaults gen;
    // The config.json config_load read, as it was read (zero when parsed
    // from text): what the weights cache keys on, so that weights prepared
    // under this config are never filed under a later one's version.
    struct ms_file_id file;
};

// Parses config.json text. Refuses, with a sentence naming the field and its
// value, architectures and settings we do not implement (rope_scaling other
// than default, sliding windows, attention bias, activations other than silu,
// quantization methods other than fp8 block-wise and 4-bit GPTQ).
int config_parse(const char *json, size_t len, struct model_config *cfg,
                 char *err, size_t errlen);
// Merges generation_config.json text (eos list, default sampling) into cfg.
int config_parse_generation(const char *json, size_t len, struct model_config *cfg,
                            char *err, size_t errlen);
// Reads DIR/config.json and, when present, DIR/generation_config.json.
// path may also name a config.json file directly.
int config_load(const char *path, struct model_config *cfg, char *err, size_t errlen);

#endif
