// planner: parameter counts, weight/KV/workspace bytes per device under tp and
// dp-ep, and decode-step weight traffic, all from a model_config alone.
#include "model/planner.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/forward.h"
#include "model/quant.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

// ---- overflow-checked accumulation -------------------------------------------
// Config fields are ints a file chose; their products can exceed 64 bits for
// absurd values, so every size goes through these and a sticky flag.
struct ck {
    bool overflow;
};

static uint64_t ck_mul(struct ck *k, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (ms_mul_overflow_u64(a, b, &r)) {
        k->overflow = true;
        return UINT64_MAX;
    }
    return r;
}

static uint64_t ck_add(struct ck *k, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (ms_add_overflow_u64(a, b, &r)) {
        k->overflow = true;
        return UINT64_MAX;
    }
    return r;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// ---- names -------------------------------------------------------------------
const char *plan_dtype_name(enum plan_dtype t)
{
    switch (t) {
    case PLAN_BF16: return "bf16";
    case PLAN_F16: return "fp16";
    case PLAN_F32: return "fp32";
    case PLAN_FP8: return "fp8";
    case PLAN_INT8: return "int8";
    case PLAN_INT4: return "int4";
    }
    return "?";
}

int plan_dtype_parse(const char *s, enum plan_dtype *out, char *err, size_t errlen)
{
    static const struct {
        const char *name;
        enum plan_dtype t;
    } names[] = {
        {"bf16", PLAN_BF16}, {"bfloat16", PLAN_BF16}, {"fp16", PLAN_F16}, {"f16", PLAN_F16},
        {"float16", PLAN_F16}, {"fp32", PLAN_F32}, {"f32", PLAN_F32}, {"float32", PLAN_F32},
        {"fp8", PLAN_FP8}, {"int8", PLAN_INT8}, {"int4", PLAN_INT4},
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].t;
            return 0;
        }
    return ms_err(err, errlen, MS_EINVAL,
                  "unknown dtype '%s': expected bf16, fp16, fp32, fp8, int8 or int4", s ? s : "");
}

enum plan_dtype plan_dtype_from_dtype(enum dtype t)
{
    switch (t) {
    case DTYPE_F16: return PLAN_F16;
    case DTYPE_F32: return PLAN_F32;
    case DTYPE_BF16: break;
    }
    return PLAN_BF16;
}

const char *plan_layout_name(enum plan_layout l) { return l == PLAN_TP ? "tp" : "dp-ep"; }

int plan_layout_parse(const char *s, enum plan_layout *out, char *err, size_t errlen)
{
    if (s && !strcmp(s, "tp")) *out = PLAN_TP;
    else if (s && (!strcmp(s, "dp-ep") || !strcmp(s, "dp_ep") || !strcmp(s, "ep"))) *out = PLAN_DP_EP;
    else return ms_err(err, errlen, MS_EINVAL, "unknown layout '%s': expected tp or dp-ep", s ? s : "");
    return 0;
}

// ---- element sizes ---------------------------------------------------------------
static bool is_quantised(enum plan_dtype t) { return t == PLAN_FP8 || t == PLAN_INT8 || t == PLAN_INT4; }

// Quantised checkpoints (Qwen's FP8 releases, GPTQ/AWQ int4) quantise the
// attention, expert and MLP projections only; embeddings, lm_head, the router
// and the norms stay at the checkpoint's own 16-bit dtype.
static enum plan_dtype plain_dtype(const struct model_config *cfg, enum plan_dtype t)
{
    return is_quantised(t) ? plan_dtype_from_dtype(cfg->torch_dtype) : t;
}

static uint64_t plain_size(enum plan_dtype t) { return t == PLAN_F32 ? 4 : 2; }

enum plan_dtype plan_dtype_from_quant(enum quant_format f, enum dtype plain)
{
    switch (f) {
    case QUANT_FP8: return PLAN_FP8;
    case QUANT_INT8: return PLAN_INT8;
    case QUANT_INT4: return PLAN_INT4;
    case QUANT_NONE: break;
    }
    return plan_dtype_from_dtype(plain);
}

// The quantized formats count what the loader holds (model/quant.h's
// packed layout: blocks of 16 outputs, a scale per output and group of
// inputs, int4 with a zero point too), so that what the plan says fits is
// what loads.
uint64_t plan_matrix_bytes(uint64_t rows, uint64_t cols, enum plan_dtype t, int group)
{
    struct ck k = {false};
    uint64_t n = ck_mul(&k, rows, cols), r;
    switch (t) {
    case PLAN_BF16:
    case PLAN_F16: r = ck_mul(&k, n, 2); break;
    case PLAN_F32: r = ck_mul(&k, n, 4); break;
    case PLAN_FP8: r = quant_matrix_bytes(rows, cols, QUANT_FP8, group); break;
    case PLAN_INT8: r = quant_matrix_bytes(rows, cols, QUANT_INT8, group); break;
    case PLAN_INT4: r = quant_matrix_bytes(rows, cols, QUANT_INT4, group); break;
    default: r = 0;
    }
    return k.overflow ? UINT64_MAX : r;
}

// ---- config checks -------------------------------------------------------------
static bool layer_moe(const struct model_config *cfg, int i)
{
    return cfg->arch == ARCH_QWEN3_MOE && cfg->n_experts > 0 && cfg->layer_is_moe[i];
}

static int check_config(const struct model_config *cfg, char *err, size_t errlen)
{
    const struct {
        const char *name;
        int v;
    } pos[] = {
        {"hidden_size", cfg->hidden_size},       {"num_hidden_layers", cfg->n_layers},
        {"num_attention_heads", cfg->n_heads},   {"num_key_value_heads", cfg->n_kv_heads},
        {"head_dim", cfg->head_dim},             {"vocab_size", cfg->vocab_size},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return ms_err(err, errlen, MS_EINVAL, "config: %s is %d; the planner needs a positive value",
                          pos[i].name, pos[i].v);
    if (cfg->n_layers > CONFIG_MAX_LAYERS)
        return ms_err(err, errlen, MS_EINVAL, "config: num_hidden_layers is %d, more than %d",
                      cfg->n_layers, CONFIG_MAX_LAYERS);
    if (cfg->n_heads % cfg->n_kv_heads)
        return ms_err(err, errlen, MS_EINVAL,
                      "config: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      cfg->n_heads, cfg->n_kv_heads);
    bool any_moe = false, any_dense = false;
    for (int i = 0; i < cfg->n_layers; i++) {
        if (layer_moe(cfg, i)) any_moe = true;
        else any_dense = true;
    }
    if (any_moe) {
        if (cfg->moe_intermediate_size <= 0)
            return ms_err(err, errlen, MS_EINVAL, "config: moe_intermediate_size is %d; expected > 0",
                          cfg->moe_intermediate_size);
        if (cfg->n_experts_per_tok <= 0 || cfg->n_experts_per_tok > cfg->n_experts)
            return ms_err(err, errlen, MS_EINVAL,
                          "config: num_experts_per_tok is %d; expected 1..num_experts (%d)",
                          cfg->n_experts_per_tok, cfg->n_experts);
    }
    if (any_dense && cfg->intermediate_size <= 0)
        return ms_err(err, errlen, MS_EINVAL,
                      "config: intermediate_size is %d but %s dense MLP layers; expected > 0",
                      cfg->intermediate_size, any_moe ? "mlp_only_layers names" : "the model has");
    return 0;
}

// ---- parameters --------------------------------------------------------------------
int plan_count_params(const struct model_config *cfg, struct plan_params *out, char *err,
                      size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = check_config(cfg, err, errlen);
    if (rc) return rc;
    struct ck k = {false};
    const uint64_t H = (uint64_t)cfg->hidden_size, hd = (uint64_t)cfg->head_dim;
    const uint64_t q = (uint64_t)cfg->n_heads * hd, kv = (uint64_t)cfg->n_kv_heads * hd;
    const uint64_t V = (uint64_t)cfg->vocab_size;
    // q_proj (q, H) + k_proj, v_proj (kv, H) + o_proj (H, q)
    const uint64_t attn = ck_mul(&k, H, ck_add(&k, ck_mul(&k, 2, q), ck_mul(&k, 2, kv)));
    // input_layernorm, post_attention_layernorm (H each), q_norm, k_norm (head_dim each)
    const uint64_t norms = 2 * H + 2 * hd;
    if (cfg->arch == ARCH_QWEN3_MOE && cfg->n_experts > 0 && cfg->moe_intermediate_size > 0)
        out->one_expert = ck_mul(&k, 3, ck_mul(&k, (uint64_t)cfg->moe_intermediate_size, H));
    uint64_t active_experts = 0;
    for (int i = 0; i < cfg->n_layers; i++) {
        out->attention = ck_add(&k, out->attention, attn);
        out->norms = ck_add(&k, out->norms, norms);
        if (layer_moe(cfg, i)) {
            out->moe_layers++;
            out->router = ck_add(&k, out->router, ck_mul(&k, (uint64_t)cfg->n_experts, H));
            out->experts = ck_add(&k, out->experts, ck_mul(&k, (uint64_t)cfg->n_experts, out->one_expert));
            active_experts = ck_add(&k, active_experts,
                                    ck_mul(&k, (uint64_t)cfg->n_experts_per_tok, out->one_expert));
        } else {
            out->dense_mlp = ck_add(&k, out->dense_mlp,
                                    ck_mul(&k, 3, ck_mul(&k, (uint64_t)cfg->intermediate_size, H)));
        }
    }
    out->norms = ck_add(&k, out->norms, H); // model.norm
    out->embeddings = ck_mul(&k, V, H);
    out->lm_head = cfg->tie_word_embeddings ? 0 : out->embeddings;
    const uint64_t shared = ck_add(&k, ck_add(&k, ck_add(&k, out->attention, out->router),
                                              ck_add(&k, out->dense_mlp, out->norms)),
                                   ck_add(&k, out->embeddings, out->lm_head));
    out->total = ck_add(&k, shared, out->experts);
    // Active counts the embedding matrix whole, as model cards do (3.35B for
    // Qwen3-30B-A3B); the bytes a step actually reads gather one row of it.
    out->active = ck_add(&k, shared, active_experts);
    if (k.overflow)
        return ms_err(err, errlen, MS_EINVAL,
                      "config: the parameter count overflows 64 bits (hidden_size %d, %d layers, %d experts)",
                      cfg->hidden_size, cfg->n_layers, cfg->n_experts);
    return 0;
}

double plan_expected_unique_experts(int n_experts, int k, int batch)
{
    if (n_experts <= 0 || k <= 0 || batch <= 0) return 0.0;
    if (k >= n_experts) return (double)n_experts;
    // Each expert is missed by one token with probability 1 - k/E, by all
    // `batch` independent tokens with (1 - k/E)^batch.
    return n_experts * (1.0 - pow(1.0 - (double)k / n_experts, batch));
}

static uint64_t kv_elem(enum plan_dtype t) { return t == PLAN_F32 ? 4 : t == PLAN_FP8 ? 1 : 2; }

uint64_t plan_kv_bytes_per_token(const struct model_config *cfg, enum plan_dtype kv_dtype)
{
    const uint64_t elem = kv_elem(kv_dtype);
    // K and V, for every layer and KV head: 2 * layers * kv_heads * head_dim elements.
    return 2 * (uint64_t)cfg->n_layers * (uint64_t)cfg->n_kv_heads * (uint64_t)cfg->head_dim * elem;
}

// ---- one device of a layout ------------------------------------------------------
// The shape each device holds. Under tp (Megatron style, as vLLM shards
// Qwen3-MoE): q/k/v/gate/up are split by output rows, o/down by input columns,
// each expert's moe_intermediate width is split (every device holds a slice
// of all experts), embeddings and lm_head are split by vocabulary rows, and
// the router and norms are replicated. When there are more devices than KV
// heads each device keeps one whole KV head (replicated), as vLLM does.
// Under dp-ep everything but the experts is replicated and the experts are
// dealt out in contiguous blocks; the busiest device holds ceil(E/N).
struct shard {
    uint64_t q_rows, kv_rows, o_cols;     // attention
    uint64_t kv_heads;                    // per device
    uint64_t moe_ffn, n_experts;          // per expert width, experts held
    uint64_t dense_ffn;
    uint64_t vocab_rows;                  // embeddings / lm_head rows held
};

static int shard_of(const struct model_config *cfg, enum plan_layout layout, int devices,
                    struct shard *s, char *err, size_t errlen)
{
    int rc = check_config(cfg, err, errlen);
    if (rc) return rc;
    if (devices < 1 || devices > 4096)
        return ms_err(err, errlen, MS_EINVAL, "devices is %d; expected 1..4096", devices);
    const uint64_t N = (uint64_t)devices, hd = (uint64_t)cfg->head_dim;
    s->q_rows = (uint64_t)cfg->n_heads * hd;
    s->kv_heads = (uint64_t)cfg->n_kv_heads;
    s->o_cols = s->q_rows;
    s->moe_ffn = cfg->moe_intermediate_size > 0 ? (uint64_t)cfg->moe_intermediate_size : 0;
    s->n_experts = cfg->n_experts > 0 ? (uint64_t)cfg->n_experts : 0;
    s->dense_ffn = cfg->intermediate_size > 0 ? (uint64_t)cfg->intermediate_size : 0;
    s->vocab_rows = (uint64_t)cfg->vocab_size;
    struct plan_params p;
    rc = plan_count_params(cfg, &p, err, errlen);
    if (rc) return rc;
    if (layout == PLAN_TP && devices > 1) {
        if (cfg->n_heads % devices)
            return ms_err(err, errlen, MS_EINVAL,
                          "tp over %d devices: num_attention_heads %d is not a multiple of %d",
                          devices, cfg->n_heads, devices);
        if (cfg->n_kv_heads >= devices ? cfg->n_kv_heads % devices : devices % cfg->n_kv_heads)
            return ms_err(err, errlen, MS_EINVAL,
                          "tp over %d devices: num_key_value_heads %d must divide or be a multiple of %d",
                          devices, cfg->n_kv_heads, devices);
        if (p.moe_layers && cfg->moe_intermediate_size % devices)
            return ms_err(err, errlen, MS_EINVAL,
                          "tp over %d devices: moe_intermediate_size %d is not a multiple of %d",
                          devices, cfg->moe_intermediate_size, devices);
        if (p.dense_mlp && cfg->intermediate_size % devices)
            return ms_err(err, errlen, MS_EINVAL,
                          "tp over %d devices: intermediate_size %d is not a multiple of %d",
                          devices, cfg->intermediate_size, devices);
        s->q_rows /= N;
        s->o_cols /= N;
        s->kv_heads = cfg->n_kv_heads >= devices ? s->kv_heads / N : 1;
        s->moe_ffn /= N;
        s->dense_ffn /= N;
        s->vocab_rows = ceil_div(s->vocab_rows, N); // the last device pads
    } else if (layout == PLAN_DP_EP && devices > 1 && p.moe_layers) {
        if (cfg->n_experts < devices)
            return ms_err(err, errlen, MS_EINVAL,
                          "dp-ep over %d devices: only %d experts to share out; use at most %d devices",
                          devices, cfg->n_experts, cfg->n_experts);
        s->n_experts = ceil_div(s->n_experts, N);
    }
    s->kv_rows = s->kv_heads * hd;
    return 0;
}

// Bytes of everything but the experts and the embedding/lm_head matrices,
// for one layer kind, on one device.
struct dev_bytes {
    uint64_t attention_norms;   // per layer: q/k/v/o + the four norms
    uint64_t router;            // per MoE layer
    uint64_t expert;            // one expert as this device holds it
    uint64_t dense;             // per dense layer
    uint64_t vocab_matrix;      // embeddings or lm_head, as held
    uint64_t final_norm;
    uint64_t row;               // one embedding row
    // An act-order checkpoint's input orders (model.h's perms: 4 bytes an
    // input, one order shared by q, k and v, one by an MLP's gate and up,
    // down's its own): per layer for q/k/v and o, per expert, per dense
    // layer. 0 for the rest.
    uint64_t order_attention, order_expert, order_dense;
};

static void dev_bytes_of(const struct model_config *cfg, const struct shard *s, enum plan_dtype t,
                         struct dev_bytes *b, struct ck *k)
{
    const enum plan_dtype pt = plain_dtype(cfg, t);
    const enum quant_format qf = t == PLAN_FP8 ? QUANT_FP8 : t == PLAN_INT8 ? QUANT_INT8 : t == PLAN_INT4 ? QUANT_INT4
                                                                                                   : QUANT_NONE;
    const int g = quant_config_group(cfg, qf);
    const uint64_t H = (uint64_t)cfg->hidden_size, hd = (uint64_t)cfg->head_dim;
    b->attention_norms = ck_add(k, ck_add(k, plan_matrix_bytes(s->q_rows, H, t, g),
                                          ck_mul(k, 2, plan_matrix_bytes(s->kv_rows, H, t, g))),
                                ck_add(k, plan_matrix_bytes(H, s->o_cols, t, g),
                                       plan_matrix_bytes(1, 2 * H + 2 * hd, pt, 0)));
    b->router = plan_matrix_bytes((uint64_t)(cfg->n_experts > 0 ? cfg->n_experts : 0), H, pt, 0);
    b->expert = ck_add(k, ck_mul(k, 2, plan_matrix_bytes(s->moe_ffn, H, t, g)),
                       plan_matrix_bytes(H, s->moe_ffn, t, g));
    b->dense = ck_add(k, ck_mul(k, 2, plan_matrix_bytes(s->dense_ffn, H, t, g)),
                      plan_matrix_bytes(H, s->dense_ffn, t, g));
    b->vocab_matrix = plan_matrix_bytes(s->vocab_rows, H, pt, 0);
    b->final_norm = plan_matrix_bytes(1, H, pt, 0);
    b->row = H * plain_size(pt);
    b->order_attention = b->order_expert = b->order_dense = 0;
    if (qf != QUANT_NONE && cfg->quant.desc_act) {
        b->order_attention = 4 * (H + s->o_cols);
        b->order_expert = 4 * (H + s->moe_ffn);
        b->order_dense = 4 * (H + s->dense_ffn);
    }
    if (b->attention_norms == UINT64_MAX || b->router == UINT64_MAX || b->expert == UINT64_MAX ||
        b->dense == UINT64_MAX || b->vocab_matrix == UINT64_MAX)
        k->overflow = true;
}

int plan_weight_bytes(const struct model_config *cfg, enum plan_dtype t, enum plan_layout layout,
                      int devices, uint64_t *out, char *err, size_t errlen)
{
    struct shard s;
    int rc = shard_of(cfg, layout, devices, &s, err, errlen);
    if (rc) return rc;
    struct ck k = {false};
    struct dev_bytes b;
    dev_bytes_of(cfg, &s, t, &b, &k);
    uint64_t total = 0;
    for (int i = 0; i < cfg->n_layers; i++) {
        total = ck_add(&k, total, ck_add(&k, b.attention_norms, b.order_attention));
        if (layer_moe(cfg, i))
            total = ck_add(&k, total, ck_add(&k, b.router, ck_mul(&k, s.n_experts, ck_add(&k, b.expert, b.order_expert))));
        else
            total = ck_add(&k, total, ck_add(&k, b.dense, b.order_dense));
    }
    total = ck_add(&k, total, b.final_norm);
    total = ck_add(&k, total, ck_mul(&k, cfg->tie_word_embeddings ? 1 : 2, b.vocab_matrix));
    if (k.overflow)
        return ms_err(err, errlen, MS_EINVAL, "config: the weight bytes overflow 64 bits");
    *out = total;
    return 0;
}

int plan_decode_step_bytes(const struct model_config *cfg, enum plan_dtype t,
                           enum plan_layout layout, int devices, int batch, double *out,
                           char *err, size_t errlen)
{
    struct shard s;
    int rc = shard_of(cfg, layout, devices, &s, err, errlen);
    if (rc) return rc;
    if (batch < 1) return ms_err(err, errlen, MS_EINVAL, "batch size %d; expected >= 1", batch);
    struct ck k = {false};
    struct dev_bytes b;
    dev_bytes_of(cfg, &s, t, &b, &k);
    if (k.overflow) return ms_err(err, errlen, MS_EINVAL, "config: the weight bytes overflow 64 bits");
    // Every dense matrix the device holds is read once per step whatever the
    // batch; of the experts, only those some token of the batch was routed
    // to. A device holding n of the E experts expects n/E of the distinct ones
    // (uniform routing). The embedding is a gather: one row per token the
    // device embeds (batch/N of them, whether the vocabulary or the
    // sequences are split), unless it is tied to lm_head, read whole anyway.
    const double unique = plan_expected_unique_experts(cfg->n_experts, cfg->n_experts_per_tok, batch);
    const double held = cfg->n_experts > 0 ? (double)s.n_experts / cfg->n_experts : 0.0;
    double bytes = 0;
    for (int i = 0; i < cfg->n_layers; i++) {
        bytes += (double)b.attention_norms;
        if (layer_moe(cfg, i)) bytes += (double)b.router + unique * held * (double)b.expert;
        else bytes += (double)b.dense;
    }
    bytes += (double)b.final_norm + (double)b.vocab_matrix; // lm_head (or the tied embedding)
    if (!cfg->tie_word_embeddings) bytes += (double)batch / devices * (double)b.row;
    *out = bytes;
    return 0;
}

// ---- capacity ------------------------------------------------------------------------
void plan_opts_default(struct plan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->weight_dtype = PLAN_BF16;
    o->kv_dtype = PLAN_BF16;
    o->device_memory = (uint64_t)80 << 30;
    o->memory_utilization = 0.9;
    o->kv_cache_bytes = 0;
    o->max_model_len = 0;
    // vLLM's defaults on a large GPU (--max-num-batched-tokens, --max-num-seqs).
    o->max_num_batched_tokens = 8192;
    o->max_num_seqs = 1024;
    o->activation_bytes = 2;
    // 512 MiB of runtime (cuBLAS and NCCL buffers, allocator slack) and the
    // CUDA backend's two 256 MiB buffers of attention partials (its
    // backend_memory.scratch_bytes, which the engine adds the same way).
    o->runtime_reserve = (uint64_t)1 << 30;
    // The sampler's rows beyond the logits are the backend's to say
    // (backend_memory: the engine passes them); the forecast leaves them to
    // the headroom above memory_utilization, as the figures it reproduces do.
    o->sample_bytes_per_logit = 0;
    o->memory_bandwidth = 4.8e12;
}

// The activation-workspace allowance of one device. A step holds, per new
// token, the residual and normed hidden states (2 * hidden), q/k/v
// (q_rows + 2 kv_rows) and the attention output (q_rows), the fp32 router
// logits (n_experts), and for the MoE block the k dispatched input rows
// (k * hidden, the all-to-all send/receive buffer), their gate|up outputs
// (k * 2 * moe_ffn, SwiGLU written in place) and the k expert output rows
// (k * hidden) before the weighted combine — or for a dense layer its
// gate|up (2 * ffn). Layers run one after another, so one layer's worth is
// live at a time. Under tp every device sees every token but only its slice
// of heads and widths; under dp-ep a rank's experts receive k rows per token
// of its own batch on average (uniform routing; a rank that receives more
// processes them in chunks). On top: fp32 logits for every sequence that
// samples in the step (max_num_seqs * vocab; tp gathers the whole
// vocabulary on every device) and what the sampler allocates beside each
// (sample_bytes_per_logit), and a fixed runtime reserve (runtime context,
// GEMM workspace, communicator buffers, allocator slack, attention scratch).
uint64_t plan_workspace_bytes(const struct model_config *cfg, const struct plan_opts *o,
                              enum plan_layout layout, int devices)
{
    struct shard s;
    if (shard_of(cfg, layout, devices, &s, NULL, 0)) return UINT64_MAX;
    struct ck k = {false};
    const uint64_t H = (uint64_t)cfg->hidden_size, topk = (uint64_t)(cfg->n_experts_per_tok > 0 ? cfg->n_experts_per_tok : 0);
    const uint64_t attn = 2 * H + s.q_rows + 2 * s.kv_rows + s.q_rows;
    uint64_t mlp = 0;
    struct plan_params p;
    if (plan_count_params(cfg, &p, NULL, 0)) return UINT64_MAX;
    if (p.moe_layers) mlp = ck_add(&k, ck_mul(&k, topk, 2 * H), ck_mul(&k, topk, 2 * s.moe_ffn));
    if (p.dense_mlp && 2 * s.dense_ffn > mlp) mlp = 2 * s.dense_ffn;
    const uint64_t act = o->activation_bytes > 0 ? (uint64_t)o->activation_bytes : 2;
    uint64_t per_token = ck_add(&k, ck_mul(&k, ck_add(&k, attn, mlp), act),
                                p.moe_layers ? 4 * (uint64_t)cfg->n_experts : 0);
    const uint64_t tokens = o->max_num_batched_tokens > 0 ? (uint64_t)o->max_num_batched_tokens : 0;
    const uint64_t seqs = o->max_num_seqs > 0 ? (uint64_t)o->max_num_seqs : 0;
    uint64_t total = ck_mul(&k, per_token, tokens);
    total = ck_add(&k, total, ck_mul(&k, ck_mul(&k, seqs, (uint64_t)cfg->vocab_size),
                                     4 + (uint64_t)o->sample_bytes_per_logit));
    total = ck_add(&k, total, o->runtime_reserve);
    return k.overflow ? UINT64_MAX : total;
}

static double gib(uint64_t b) { return (double)b / GiB; }

int plan_device_compute(const struct model_config *cfg, const struct plan_opts *o,
                        enum plan_layout layout, int devices, struct plan_device *out,
                        char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->layout = layout;
    out->devices = devices;
    struct shard s;
    int rc = shard_of(cfg, layout, devices, &s, err, errlen);
    if (rc) return rc;
    if (o->kv_dtype != PLAN_BF16 && o->kv_dtype != PLAN_F16 && o->kv_dtype != PLAN_F32 &&
        o->kv_dtype != PLAN_FP8)
        return ms_err(err, errlen, MS_EINVAL, "kv dtype %s: expected bf16, fp16, fp32 or fp8",
                      plan_dtype_name(o->kv_dtype));
    if (!(o->memory_utilization > 0.0 && o->memory_utilization <= 1.0))
        return ms_err(err, errlen, MS_EINVAL, "gpu-memory-utilization %g: expected a value in (0, 1]",
                      o->memory_utilization);
    if (o->device_memory == 0)
        return ms_err(err, errlen, MS_EINVAL, "device memory is 0 bytes; give the device's size");
    int max_len = o->max_model_len > 0 ? o->max_model_len : cfg->max_position_embeddings;
    if (max_len <= 0)
        return ms_err(err, errlen, MS_EINVAL,
                      "no max-model-len: the config has no max_position_embeddings; pass one");
    if (cfg->max_position_embeddings > 0 && max_len > cfg->max_position_embeddings)
        return ms_err(err, errlen, MS_EINVAL,
                      "max-model-len %d is beyond the model's max_position_embeddings %d",
                      max_len, cfg->max_position_embeddings);
    out->max_model_len = max_len;
    // Ranks that are threads of one process (the CPU backend) map the weights
    // once and share one memory; each adds its own workspace and KV pool.
    const bool shared = o->shared_memory && layout == PLAN_DP_EP;
    const uint64_t R = shared ? (uint64_t)devices : 1;
    out->shared_memory = shared;
    rc = plan_weight_bytes(cfg, o->weight_dtype, shared ? PLAN_TP : layout, shared ? 1 : devices,
                           &out->weight_bytes, err, errlen);
    if (rc) return rc;
    if (o->weight_bytes) out->weight_bytes = o->weight_bytes;
    struct ck k = {false};
    uint64_t ws = plan_workspace_bytes(cfg, o, layout, devices);
    if (ws == UINT64_MAX)
        return ms_err(err, errlen, MS_EINVAL, "the activation workspace overflows 64 bits");
    out->workspace_bytes = ck_mul(&k, ws, R);
    // KV per token on this device: its KV heads, K and V, every layer.
    out->kv_bytes_per_token =
        2 * (uint64_t)cfg->n_layers * s.kv_heads * (uint64_t)cfg->head_dim * kv_elem(o->kv_dtype);
    const uint64_t block = out->kv_bytes_per_token * KV_BLOCK_TOKENS;
    // The usable share is rounded down to whole bytes, as the allocator sees it.
    double usable = floor((double)o->device_memory * o->memory_utilization);
    out->usable_bytes = usable >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)usable;
    const uint64_t fixed = ck_add(&k, out->weight_bytes, out->workspace_bytes);
    // kv_bytes is one rank's pool. A shared memory's explicit budget is the
    // total, split evenly between the ranks (the engine's --kv-cache-memory).
    if (o->kv_cache_bytes) out->kv_bytes = o->kv_cache_bytes / R;
    else out->kv_bytes = fixed < out->usable_bytes ? (out->usable_bytes - fixed) / R : 0;
    out->kv_blocks = out->kv_bytes / block;
    out->kv_tokens = out->kv_blocks * KV_BLOCK_TOKENS;
    out->seq_blocks = ceil_div((uint64_t)max_len, KV_BLOCK_TOKENS);
    out->max_len_seqs = out->kv_blocks / out->seq_blocks;
    out->need_bytes = ck_add(&k, fixed, ck_mul(&k, R, ck_mul(&k, out->seq_blocks, block)));
    out->used_bytes = ck_add(&k, fixed, ck_mul(&k, R, out->kv_bytes));
    if (k.overflow) return ms_err(err, errlen, MS_EINVAL, "the memory plan overflows 64 bits");
    out->fits = out->need_bytes <= out->usable_bytes && out->used_bytes <= out->usable_bytes &&
                out->kv_blocks >= out->seq_blocks;
    return 0;
}

int plan_check_fit(const struct plan_device *d, char *err, size_t errlen)
{
    if (d->fits) return 0;
    const uint64_t seq_kv = d->seq_blocks * d->kv_bytes_per_token * KV_BLOCK_TOKENS;
    const uint64_t R = d->shared_memory ? (uint64_t)d->devices : 1;
    char where[64];
    if (d->shared_memory && d->devices > 1)
        snprintf(where, sizeof where, "%d ranks sharing one memory", d->devices);
    else if (d->shared_memory)
        snprintf(where, sizeof where, "1 rank");
    else
        snprintf(where, sizeof where, "%s x%d, per device", plan_layout_name(d->layout), d->devices);
    if (d->used_bytes > d->usable_bytes && d->need_bytes <= d->usable_bytes)
        return ms_err(err, errlen, MS_ENOFIT,
                      "the model does not fit (%s): weights %.2f GiB + activation "
                      "workspace %.2f GiB + KV cache %.2f GiB = %.2f GiB, more than the %.2f GiB usable; "
                      "lower the KV cache size",
                      where, gib(d->weight_bytes), gib(d->workspace_bytes), gib(R * d->kv_bytes),
                      gib(d->used_bytes), gib(d->usable_bytes));
    if (d->need_bytes > d->usable_bytes)
        return ms_err(err, errlen, MS_ENOFIT,
                      "the model does not fit (%s): weights %.2f GiB + activation "
                      "workspace %.2f GiB + KV for one %d-token sequence%s %.2f GiB = %.2f GiB, more "
                      "than the %.2f GiB usable; use more devices, a smaller --max-model-len, or a "
                      "smaller --max-num-batched-tokens / --max-num-seqs",
                      where, gib(d->weight_bytes), gib(d->workspace_bytes), d->max_model_len,
                      R > 1 ? " per rank" : "", gib(R * seq_kv), gib(d->need_bytes), gib(d->usable_bytes));
    return ms_err(err, errlen, MS_ENOFIT,
                  "the KV cache does not hold one %d-token sequence (%s): %s%llu blocks "
                  "(%.2f GiB) of the %llu blocks (%.2f GiB) it needs; raise the KV cache size, or "
                  "lower --max-model-len to at most %llu (what the pool holds)",
                  d->max_model_len, where, R > 1 ? "each rank has " : "",
                  (unsigned long long)d->kv_blocks, gib(d->kv_bytes),
                  (unsigned long long)d->seq_blocks, gib(seq_kv),
                  (unsigned long long)d->kv_blocks * KV_BLOCK_TOKENS);
}

// ---- command-line numbers -----------------------------------------------------------
static int parse_scaled(const char *s, const char *what, bool rate, double *out, char *err,
                        size_t errlen)
{
    if (!s || !*s) return ms_err(err, errlen, MS_EINVAL, "%s: empty value", what);
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return ms_err(err, errlen, MS_EINVAL, "%s '%s': expected a non-negative number with a unit", what, s);
    while (*end == ' ') end++;
    char unit[16];
    size_t n = strlen(end);
    if (n >= sizeof unit) return ms_err(err, errlen, MS_EINVAL, "%s '%s': unknown unit", what, s);
    memcpy(unit, end, n + 1);
    if (rate) {
        // A rate needs "/s" (the unit names a per-second quantity).
        if (n < 2 || strcmp(unit + n - 2, "/s"))
            return ms_err(err, errlen, MS_EINVAL, "%s '%s': expected a unit like 4.8TB/s or 900GiB/s", what, s);
        unit[n - 2] = 0;
    }
    static const struct {
        const char *u;
        double f;
    } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"K", 1024.0}, {"M", 1048576.0}, {"G", GiB}, {"T", GiB * 1024},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", GiB}, {"TiB", GiB * 1024},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(unit, units[i].u) && !(rate && !*unit)) {
            *out = v * units[i].f;
            return 0;
        }
    return ms_err(err, errlen, MS_EINVAL, "%s '%s': unknown unit '%s' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB%s)",
                  what, s, unit, rate ? " per second, e.g. 4.8TB/s" : "");
}

int plan_parse_bytes(const char *s, uint64_t *out, char *err, size_t errlen)
{
    double v;
    int rc = parse_scaled(s, "size", false, &v, err, errlen);
    if (rc) return rc;
    if (v >= 18446744073709551615.0) return ms_err(err, errlen, MS_EINVAL, "size '%s' is too large", s);
    *out = (uint64_t)v;
    return 0;
}

int plan_parse_bandwidth(const char *s, double *out, char *err, size_t errlen)
{
    double v;
    int rc = parse_scaled(s, "memory bandwidth", true, &v, err, errlen);
    if (rc) return rc;
    if (v <= 0) return ms_err(err, errlen, MS_EINVAL, "memory bandwidth '%s' must be positive", s);
    *out = v;
    return 0;
}
