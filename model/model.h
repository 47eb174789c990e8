// model: a loaded checkpoint — its config and views of every weight tensor,
// memory-mapped from safetensors as stored (nothing copied), or, for
// --load-format dummy, the recipe of random weights a backend makes itself.
#ifndef MOESERVE_MODEL_MODEL_H
#define MOESERVE_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/quant.h"

// A view of one tensor inside a mapped file. Row-major; shape[0] is the
// outermost dimension (for a Linear weight: (out_features, in_features)).
enum tensor_init {
    TENSOR_INIT_NONE = 0,       // the values are in data
    TENSOR_INIT_UNIFORM,        // uniform with standard deviation init_scale
    TENSOR_INIT_NORM,           // a norm weight: init_scale + NORM_JITTER x uniform(-1, 1)
};

struct tensor {
    const void *data;   // host memory (the mapped file), or NULL for a dummy load; a
                        // quantized checkpoint's values as quant.source says
    enum dtype dtype;   // of data (unused for a quantized checkpoint's tensor)
    int ndim;           // 0: not bound (a dense MLP in a MoE layer, say)
    int64_t shape[4];
    // --load-format dummy: element i is tensor_dummy_value(t, i).
    enum tensor_init init;
    float init_scale;
    uint64_t init_key;
    // A quantized matrix (format != QUANT_NONE): stored so in the checkpoint,
    // or quantized by the backend at load (model/quant.h).
    struct tensor_quant quant;
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
    size_t weight_bytes;          // sum over all tensors, quantized ones as a backend holds them
                                  // (quant_matrix_bytes), and the input orders below
    enum quant_format quant;      // the format of its quantized projections (QUANT_NONE: none)
    bool dummy;                   // --load-format dummy: no weight bytes on the host
    void *storage;                // the safetensors set (opaque to callers), NULL when dummy
    char dir[4096];
    // Where a backend may keep the form it prepares the weights in, keyed by
    // this checkpoint (--cache-dir): "" for the default ($XDG_CACHE_HOME/
    // moeserve, used when the prepared weights are large), "none" for never.
    char cache_dir[4096];
    uint64_t seed;                // the dummy weights' seed
    // The input orders of an act-order checkpoint's matrices (struct
    // tensor_quant.perm), each allocated once: matrices that read the same
    // input in the same order (an expert's gate and up; q, k and v) share one.
    int32_t **perms;
    size_t n_perms;
    size_t perm_bytes;            // theirs, 4 bytes an input (in weight_bytes)
};

// Loads DIR's config.json (+ generation_config.json) and maps its
// safetensors (single file or model.safetensors.index.json shards). Checks
// every tensor the config implies for presence, dtype and shape, printing
// expected against actual in err. A backend's prepare_weights then makes the
// weights usable by it (model/backend.h).
int model_load(const char *dir, struct model **out, char *err, size_t errlen);

// vLLM's --load-format: auto reads the safetensors, dummy reads only
// config.json (+ generation_config.json) and describes random weights of the
// shapes it implies, scaled as `moeserve make-model` scales them (so that
// the next-token distribution is peaked, not flat), drawn from seed; the
// backend makes them in its own memory. Full-size benchmarks need no
// checkpoint on disk.
enum load_format { LOAD_FORMAT_AUTO = 0, LOAD_FORMAT_DUMMY };
int load_format_parse(const char *s, enum load_format *out); // "auto" | "dummy"; MS_EINVAL else
int model_load_format(const char *dir, enum load_format f, uint64_t seed, struct model **out,
                      char *err, size_t errlen);

// Everything a load may be asked for (the engine flags --load-format,
// --quantization and --cache-dir).
struct model_load_opts {
    enum load_format format;
    uint64_t seed;                 // dummy weights
    // --quantization (vLLM's name): the projections (attention q/k/v/o, the
    // experts and dense MLPs) of a bf16/f16/f32 checkpoint are quantized at
    // load to this format with groups of QUANT_GROUP inputs; the router,
    // norms, embeddings and lm_head stay as stored. A quantized checkpoint
    // keeps its own format: asking for another one is refused. QUANT_NONE:
    // as the checkpoint is (a dummy load of a quantized config makes its
    // format: fp8, or int4 for gptq).
    enum quant_format quantization;
    // --quantization naming a checkpoint's method as vLLM takes it (gptq,
    // awq, compressed-tensors and their marlin kernels): the checkpoint's
    // quantization_config must be that method (compressed-tensors: CT_INT
    // stands for both of its kinds); it is then read as it is.
    // QUANT_METHOD_NONE: not named.
    enum quant_method method;
    const char *cache_dir;         // NULL or "": the default; "none": no cache
};
int model_load_opts(const char *dir, const struct model_load_opts *o, struct model **out,
                    char *err, size_t errlen);
void model_destroy(struct model *m);

#if defined(__CUDACC__)
#define TENSOR_FN static inline __host__ __device__
#else
#define TENSOR_FN static inline
#endif

// The dummy value of element i: a counter-based hash of (init_key, i), so
// that any backend makes the same bits in any order and in parallel.
TENSOR_FN float tensor_dummy_value(const struct tensor *t, uint64_t i)
{
    uint64_t z = t->init_key + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = (float)(int64_t)(z >> 40) * (1.0f / 8388608.0f) - 1.0f; // [-1, 1)
#ifdef __CUDA_ARCH__
    // nvcc contracts a * b + c into one FMA by default (the C side builds
    // with -ffp-contract=off): rounded apart, as the CPU does.
    if (t->init == TENSOR_INIT_NORM) return __fadd_rn(t->init_scale, __fmul_rn(0.1f, u));
#else
    if (t->init == TENSOR_INIT_NORM) return t->init_scale + 0.1f * u;
#endif
    return t->init_scale * 1.7320508f * u; // uniform on [-a, a] has std a / sqrt(3)
}

// Elements of a bound tensor (0 when not bound).
size_t tensor_elems(const struct tensor *t);
// Bytes a backend holds it in: its elements in its dtype, or quant_matrix_bytes.
size_t tensor_bytes(const struct tensor *t);

// Bytes of weights a decode step reads for one token on a single rank:
// attention + norms + router + top-k experts per MoE layer + lm_head + one
// embedding row. Used by benchmarks and the planner's bandwidth bound.
size_t model_active_bytes(const struct model *m);

// Bytes of weights a rank holding experts [expert_begin, expert_end) keeps
// (tensor_bytes: quantized matrices as the loader counts them): every
// non-expert tensor (a tied lm_head once) and those experts of each MoE
// layer. The engine sizes a GPU's memory with it.
size_t model_rank_weight_bytes(const struct model *m, int expert_begin, int expert_end);

#endif
