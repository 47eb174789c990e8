// makemodel: random Qwen3 / Qwen3-MoE checkpoints in Hugging Face layout,
// scaled so the next-token distribution is peaked rather than flat.
#include "model/makemodel.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "model/quant.h"

#define QWEN3_VOCAB 151936
#define QWEN3_BOS 151643     // <|endoftext|>
#define QWEN3_EOS 151645     // <|im_end|>
#define TOKENIZER_MAX_BYTES (64u << 20)
// Elements generated per write: bounds memory whatever the tensor size.
#define CHUNK_ELEMS (1u << 16)

// Scales. Every projection reads an RMS-normalised input (RMS about 1), so
// a weight of std g/sqrt(fan_in) gives outputs of std about g.
//  - Embedding rows have RMS 1; the sublayers together add roughly as much
//    variance again (each of the 2L sublayer outputs has RMS about
//    1/sqrt(2L)), so the current token stays visible in the residual while
//    context and experts move it: greedy decoding wanders instead of
//    locking onto one token.
//  - q_norm/k_norm weights near 1.6 give attention scores of std ~2.5:
//    attention prefers some positions rather than averaging them all.
//  - Router logits of std ~1.5: routing is uneven but every expert is used.
//  - lm_head gives logits of std ~4.5 over 151936 ids; for Gaussian logits
//    that puts the top-1 probability between about 0.1 and 0.6, far from
//    the 7e-6 of a flat distribution.
#define SCALE_QK_NORM 1.6f
#define SCALE_ROUTER 1.5f
#define SCALE_LOGITS 4.5f
// RMS of silu(g) * u for g, u ~ N(0, 1), and the extra shrink of a weighted
// sum over the top-k experts; the down projections divide them out.
#define GAIN_SWIGLU 0.6f
#define GAIN_TOPK 0.7f
#define NORM_JITTER 0.1f

int makemodel_spec_for_shape(const char *shape, struct makemodel_spec *s, char *err,
                             size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->arch = ARCH_QWEN3_MOE;
    s->vocab_size = QWEN3_VOCAB;
    s->norm_topk_prob = true;
    s->decoder_sparse_step = 1;
    s->tie_word_embeddings = false;
    s->rope_theta = 1000000.0;
    s->rms_norm_eps = 1e-6;
    s->max_position_embeddings = 40960;
    if (!strcmp(shape, "demo")) {
        s->hidden_size = 512;
        s->n_layers = 8;
        s->n_heads = 8;
        s->n_kv_heads = 2;
        s->head_dim = 64;
        s->intermediate_size = 1536;
        s->moe_intermediate_size = 256;
        s->n_experts = 32;
        s->n_experts_per_tok = 4;
        return 0;
    }
    // The size of the issue-19 comparisons with llama.cpp: 1.25B parameters,
    // Qwen3-30B-A3B's expert count and top-k at a fraction of its width.
    if (!strcmp(shape, "mid")) {
        s->hidden_size = 1024;
        s->n_layers = 12;
        s->n_heads = 16;
        s->n_kv_heads = 4;
        s->head_dim = 64;
        s->intermediate_size = 3072;
        s->moe_intermediate_size = 384;
        s->n_experts = 64;
        s->n_experts_per_tok = 8;
        return 0;
    }
    if (!strcmp(shape, "tiny")) {
        s->hidden_size = 64;
        s->n_layers = 2;
        s->n_heads = 4;
        s->n_kv_heads = 2;
        s->head_dim = 16;
        s->intermediate_size = 192;
        s->moe_intermediate_size = 32;
        s->n_experts = 8;
        s->n_experts_per_tok = 2;
        return 0;
    }
    return ms_err(err, errlen, MS_EINVAL, "unknown model shape \"%s\"; use tiny, demo or mid", shape);
}

static bool spec_layer_is_moe(const struct makemodel_spec *s, int i)
{
    if (s->arch != ARCH_QWEN3_MOE || s->n_experts == 0) return false;
    for (int j = 0; j < s->n_mlp_only; j++)
        if (s->mlp_only_layers[j] == i) return false;
    return (i + 1) % s->decoder_sparse_step == 0;
}

static int spec_check(const struct makemodel_spec *s, char *err, size_t errlen)
{
    if (s->vocab_size < 1 || s->hidden_size < 1 || s->n_layers < 1 ||
        s->n_layers > CONFIG_MAX_LAYERS || s->n_heads < 1 || s->n_kv_heads < 1 ||
        s->n_heads % s->n_kv_heads || s->head_dim < 2 || s->head_dim % 2 ||
        s->decoder_sparse_step < 1 || s->n_mlp_only < 0 || s->n_mlp_only > MAKEMODEL_MAX_MLP_ONLY)
        return ms_err(err, errlen, MS_EINVAL, "model spec has a non-positive or inconsistent size");
    bool any_moe = false, any_dense = false;
    for (int i = 0; i < s->n_layers; i++) {
        if (spec_layer_is_moe(s, i)) any_moe = true;
        else any_dense = true;
    }
    if (any_moe && (s->moe_intermediate_size < 1 || s->n_experts_per_tok < 1 ||
                    s->n_experts_per_tok > s->n_experts))
        return ms_err(err, errlen, MS_EINVAL, "model spec: MoE layers need moe_intermediate_size "
                      "> 0 and 1 <= num_experts_per_tok <= num_experts");
    if (any_dense && s->intermediate_size < 1)
        return ms_err(err, errlen, MS_EINVAL, "model spec: dense layers need intermediate_size > 0");
    if (s->quant_act_order && s->quant != QUANT_METHOD_GPTQ && s->quant != QUANT_METHOD_CT_INT)
        return ms_err(err, errlen, MS_EINVAL, "model spec: act-order is GPTQ's and compressed-tensors "
                      "int's (their g_idx); the other formats have none");
    return 0;
}

// ---- the tensor list ----

struct wspec {
    char name[96];
    int ndim;
    int64_t shape[2];
    struct weight_init init; // std for TENSOR_INIT_UNIFORM, centre for TENSOR_INIT_NORM
    bool proj;               // a projection: stored quantized when the spec asks
    uint64_t count;
};

struct wlist {
    struct wspec *w;
    size_t n, cap;
};

static int wlist_add(struct wlist *l, struct weight_init init, int ndim, int64_t a, int64_t b,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int wlist_add(struct wlist *l, struct weight_init init, int ndim, int64_t a, int64_t b,
                     const char *fmt, ...)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        struct wspec *w = realloc(l->w, cap * sizeof *w);
        if (!w) return MS_ENOMEM;
        l->w = w;
        l->cap = cap;
    }
    struct wspec *w = &l->w[l->n++];
    memset(w, 0, sizeof *w);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof w->name, fmt, ap);
    va_end(ap);
    w->ndim = ndim;
    w->shape[0] = a;
    w->shape[1] = b;
    w->init = init;
    w->count = (uint64_t)a * (uint64_t)(ndim == 2 ? b : 1);
    w->proj = init.scale > 0 && ndim == 2; // refined by build_list
    return 0;
}

struct weight_init makemodel_weight_init(enum weight_role r, int hidden, int n_layers, int q_dim,
                                         int ffn)
{
    const float in_h = 1.0f / sqrtf((float)hidden);
    const float sub = 1.0f / sqrtf(2.0f * (float)n_layers); // RMS of each sublayer's output
    switch (r) {
    case ROLE_EMBED: return (struct weight_init){TENSOR_INIT_UNIFORM, 1.0f};
    case ROLE_NORM: return (struct weight_init){TENSOR_INIT_NORM, 1.0f};
    case ROLE_QK_NORM: return (struct weight_init){TENSOR_INIT_NORM, SCALE_QK_NORM};
    case ROLE_QKV: return (struct weight_init){TENSOR_INIT_UNIFORM, in_h};
    case ROLE_O: return (struct weight_init){TENSOR_INIT_UNIFORM, sub / sqrtf((float)q_dim)};
    case ROLE_ROUTER: return (struct weight_init){TENSOR_INIT_UNIFORM, SCALE_ROUTER * in_h};
    case ROLE_EXPERT_IN:
    case ROLE_DENSE_IN: return (struct weight_init){TENSOR_INIT_UNIFORM, in_h};
    case ROLE_EXPERT_DOWN:
        return (struct weight_init){TENSOR_INIT_UNIFORM,
                                    sub / (GAIN_SWIGLU * GAIN_TOPK) / sqrtf((float)ffn)};
    case ROLE_DENSE_DOWN:
        return (struct weight_init){TENSOR_INIT_UNIFORM, sub / GAIN_SWIGLU / sqrtf((float)ffn)};
    case ROLE_LM_HEAD: return (struct weight_init){TENSOR_INIT_UNIFORM, SCALE_LOGITS * in_h};
    }
    return (struct weight_init){TENSOR_INIT_UNIFORM, in_h};
}

static int build_list(const struct makemodel_spec *s, struct wlist *l)
{
    int64_t V = s->vocab_size, H = s->hidden_size, D = s->head_dim;
    int64_t Q = (int64_t)s->n_heads * D, KV = (int64_t)s->n_kv_heads * D;
    int rc = 0;
#define INIT(role, ffn) makemodel_weight_init(role, (int)H, s->n_layers, (int)Q, (int)(ffn))
#define ADD(...) do { if ((rc = wlist_add(l, __VA_ARGS__))) return rc; } while (0)
    ADD(INIT(ROLE_EMBED, 0), 2, V, H, "model.embed_tokens.weight");
    for (int i = 0; i < s->n_layers; i++) {
        const char *p = "model.layers";
        ADD(INIT(ROLE_NORM, 0), 1, H, 0, "%s.%d.input_layernorm.weight", p, i);
        ADD(INIT(ROLE_QKV, 0), 2, Q, H, "%s.%d.self_attn.q_proj.weight", p, i);
        ADD(INIT(ROLE_QKV, 0), 2, KV, H, "%s.%d.self_attn.k_proj.weight", p, i);
        ADD(INIT(ROLE_QKV, 0), 2, KV, H, "%s.%d.self_attn.v_proj.weight", p, i);
        ADD(INIT(ROLE_O, 0), 2, H, Q, "%s.%d.self_attn.o_proj.weight", p, i);
        ADD(INIT(ROLE_QK_NORM, 0), 1, D, 0, "%s.%d.self_attn.q_norm.weight", p, i);
        ADD(INIT(ROLE_QK_NORM, 0), 1, D, 0, "%s.%d.self_attn.k_norm.weight", p, i);
        ADD(INIT(ROLE_NORM, 0), 1, H, 0, "%s.%d.post_attention_layernorm.weight", p, i);
        if (spec_layer_is_moe(s, i)) {
            int64_t F = s->moe_intermediate_size;
            ADD(INIT(ROLE_ROUTER, 0), 2, s->n_experts, H, "%s.%d.mlp.gate.weight", p, i);
            for (int e = 0; e < s->n_experts; e++) {
                ADD(INIT(ROLE_EXPERT_IN, F), 2, F, H, "%s.%d.mlp.experts.%d.gate_proj.weight", p, i, e);
                ADD(INIT(ROLE_EXPERT_IN, F), 2, F, H, "%s.%d.mlp.experts.%d.up_proj.weight", p, i, e);
                ADD(INIT(ROLE_EXPERT_DOWN, F), 2, H, F, "%s.%d.mlp.experts.%d.down_proj.weight", p, i, e);
            }
        } else {
            int64_t F = s->intermediate_size;
            ADD(INIT(ROLE_DENSE_IN, F), 2, F, H, "%s.%d.mlp.gate_proj.weight", p, i);
            ADD(INIT(ROLE_DENSE_IN, F), 2, F, H, "%s.%d.mlp.up_proj.weight", p, i);
            ADD(INIT(ROLE_DENSE_DOWN, F), 2, H, F, "%s.%d.mlp.down_proj.weight", p, i);
        }
    }
    ADD(INIT(ROLE_NORM, 0), 1, H, 0, "model.norm.weight");
    if (!s->tie_word_embeddings)
        ADD(INIT(ROLE_LM_HEAD, 0), 2, V, H, "lm_head.weight");
#undef ADD
#undef INIT
    // The projections: attention and MLP / expert matrices (not the router
    // mlp.gate, the embedding or lm_head), as quantized checkpoints hold them.
    for (size_t i = 0; i < l->n; i++)
        l->w[i].proj = strstr(l->w[i].name, "_proj.weight") != NULL;
    return 0;
}

uint64_t makemodel_param_count(const struct makemodel_spec *s)
{
    struct wlist l = {0};
    uint64_t n = 0;
    if (build_list(s, &l) == 0)
        for (size_t i = 0; i < l.n; i++) n += l.w[i].count;
    free(l.w);
    return n;
}

// ---- the generator: splitmix64, one independent stream per tensor ----

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [-1, 1).
static float uniform_pm1(uint64_t *state)
{
    return (float)(splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// ---- files ----

static int write_all(FILE *f, const void *p, size_t n, const char *path, char *err,
                     size_t errlen)
{
    if (n && fwrite(p, 1, n, f) != n)
        return ms_err(err, errlen, MS_EIO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

// Closes f and renames tmp to final; on failure removes tmp.
static int commit_file(FILE *f, const char *tmp, const char *final, char *err, size_t errlen)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return ms_err(err, errlen, MS_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, final) != 0) {
        int e = errno;
        unlink(tmp);
        return ms_err(err, errlen, MS_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(e));
    }
    return 0;
}

static int open_tmp(const char *dir, const char *name, char *tmp, char *final, size_t len,
                    FILE **out, char *err, size_t errlen)
{
    char tname[256];
    snprintf(tname, sizeof tname, ".%s.tmp.%ld", name, (long)getpid());
    if (ms_path_join(final, len, dir, name) || ms_path_join(tmp, len, dir, tname))
        return ms_err(err, errlen, MS_EINVAL, "path %s is too long", dir);
    *out = fopen(tmp, "wb");
    if (!*out) return ms_err(err, errlen, MS_EIO, "cannot create %s: %s", tmp, strerror(errno));
    return 0;
}

static int write_bytes_atomic(const char *dir, const char *name, const void *p, size_t n,
                              char *err, size_t errlen)
{
    char tmp[4096], final[4096];
    FILE *f;
    int rc = open_tmp(dir, name, tmp, final, sizeof tmp, &f, err, errlen);
    if (rc) return rc;
    if ((rc = write_all(f, p, n, tmp, err, errlen))) {
        fclose(f);
        unlink(tmp);
        return rc;
    }
    return commit_file(f, tmp, final, err, errlen);
}

static int write_json_atomic(const char *dir, const char *name, json_t *j, char *err,
                             size_t errlen)
{
    // 15 digits print 0.6 as 0.6 rather than 0.59999999999999998.
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (!text) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    }
    line[n] = '\n'; // a trailing newline, as the Hugging Face tools write
    line[n + 1] = 0;
    int rc = write_bytes_atomic(dir, name, line, n + 1, err, errlen);
    free(line);
    return rc;
}

static int mkdir_p(const char *dir, char *err, size_t errlen)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return ms_err(err, errlen, MS_EINVAL, "path %s is too long", dir);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return ms_err(err, errlen, MS_EIO, "cannot create directory %s: %s", buf,
                              strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ms_err(err, errlen, MS_EIO, "%s is not a directory", dir);
    return 0;
}

// ---- the file's tensors -------------------------------------------------------
// A weight is one tensor of the file, or, quantized, the 2 (FP8), 4 (GPTQ)
// or 3 (AWQ) tensors of its format, next to each other.
enum part_kind {
    PART_BF16,
    PART_FP8_WEIGHT,      // F8_E4M3 (rows, cols)
    PART_FP8_SCALE,       // F32 (ceil(rows / B), ceil(cols / B)) weight_scale_inv
    PART_GPTQ_QWEIGHT,    // I32 (cols / 8, rows)
    PART_GPTQ_QZEROS,     // I32 (ceil(cols / G), rows / 8); AWQ's the same shape
    PART_GPTQ_SCALES,     // F16 (ceil(cols / G), rows); AWQ's the same
    PART_GPTQ_G_IDX,      // I32 (cols); compressed-tensors' weight_g_idx the same
    PART_AWQ_QWEIGHT,     // I32 (cols, rows / 8)
    PART_CT_PACKED,       // I32 (rows, cols / (32 / bits)) weight_packed
    PART_CT_SCALE_F16,    // F16 (rows, ceil(cols / G)) weight_scale (int4)
    PART_CT_SCALE_F32,    // F32 (rows, ceil(cols / G)) weight_scale (int8)
    PART_CT_SHAPE,        // I64 [2]: rows, cols
    PART_CT_ZERO,         // I32 (rows / 8, ceil(cols / G)) weight_zero_point (int4 asymmetric)
    PART_CT_FP8_SCALE,    // BF16 (rows, 1) weight_scale
};

struct fpart {
    size_t w;             // its weight in the list
    enum part_kind kind;
    char name[128];
    const char *dtype;
    int ndim;
    int64_t shape[2];
    uint64_t bytes;
    uint64_t esz;         // bytes an element: its alignment in the file
    uint64_t off;         // where in the data area (write_safetensors)
};

// The most file tensors one weight writes: compressed-tensors int4 with
// zero points in act-order (packed, scale, shape, zero point, g_idx).
#define PARTS_PER_WEIGHT_MAX 5

struct plist {
    struct fpart *p;
    size_t n, cap;
};

static int add_part(struct plist *pl, size_t w, const struct wspec *ws, enum part_kind k,
                    const char *suffix, const char *dtype, int ndim, int64_t a, int64_t b, uint64_t esz)
{
    if (pl->n == pl->cap) return MS_EINTERNAL; // a format past PARTS_PER_WEIGHT_MAX
    struct fpart *p = &pl->p[pl->n++];
    memset(p, 0, sizeof *p);
    p->w = w;
    p->kind = k;
    const size_t base = strlen(ws->name) - (k == PART_BF16 ? 0 : strlen("weight"));
    if (base + strlen(suffix) >= sizeof p->name) return MS_EINVAL;
    memcpy(p->name, ws->name, base);
    strcpy(p->name + base, suffix);
    p->dtype = dtype;
    p->ndim = ndim;
    p->shape[0] = a;
    p->shape[1] = b;
    p->bytes = (uint64_t)a * (uint64_t)(ndim == 2 ? b : 1) * esz;
    p->esz = esz;
    return 0;
}

static int quant_group_of(const struct makemodel_spec *s) { return s->quant_group > 0 ? s->quant_group : 128; }

static int build_parts(const struct makemodel_spec *s, const struct wlist *l, struct plist *pl,
                       char *err, size_t errlen)
{
    pl->p = calloc(l->n * PARTS_PER_WEIGHT_MAX, sizeof *pl->p);
    if (!pl->p) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    pl->cap = l->n * PARTS_PER_WEIGHT_MAX;
    const int64_t B = quant_group_of(s);
    for (size_t i = 0; i < l->n; i++) {
        const struct wspec *w = &l->w[i];
        const int64_t R = w->shape[0], C = w->shape[1];
        int rc = 0;
        if (!w->proj || s->quant == QUANT_METHOD_NONE) {
            rc = add_part(pl, i, w, PART_BF16, "", "BF16", w->ndim, R, C, 2);
        } else if (s->quant == QUANT_METHOD_FP8) {
            rc = add_part(pl, i, w, PART_FP8_WEIGHT, "weight", "F8_E4M3", 2, R, C, 1);
            if (!rc) rc = add_part(pl, i, w, PART_FP8_SCALE, "weight_scale_inv", "F32", 2,
                                   (R + B - 1) / B, (C + B - 1) / B, 4);
        } else if (s->quant == QUANT_METHOD_CT_INT) {
            const int per = s->quant_bits == 8 ? 4 : 8;
            if (R % 8 || C % per)
                return ms_err(err, errlen, MS_EINVAL, "%s is (%lld, %lld): pack-quantized needs the outputs a "
                              "multiple of 8 and the inputs of %d", w->name, (long long)R, (long long)C, per);
            const int64_t ng = (C + B - 1) / B;
            rc = add_part(pl, i, w, PART_CT_PACKED, "weight_packed", "I32", 2, R, C / per, 4);
            if (!rc) rc = per == 8 ? add_part(pl, i, w, PART_CT_SCALE_F16, "weight_scale", "F16", 2, R, ng, 2)
                                   : add_part(pl, i, w, PART_CT_SCALE_F32, "weight_scale", "F32", 2, R, ng, 4);
            if (!rc) rc = add_part(pl, i, w, PART_CT_SHAPE, "weight_shape", "I64", 1, 2, 0, 8);
            if (!rc && s->quant_asym)
                rc = add_part(pl, i, w, PART_CT_ZERO, "weight_zero_point", "I32", 2, R / 8, ng, 4);
            if (!rc && s->quant_act_order)
                rc = add_part(pl, i, w, PART_GPTQ_G_IDX, "weight_g_idx", "I32", 1, C, 0, 4);
        } else if (s->quant == QUANT_METHOD_CT_FP8) {
            rc = add_part(pl, i, w, PART_FP8_WEIGHT, "weight", "F8_E4M3", 2, R, C, 1);
            if (!rc) rc = add_part(pl, i, w, PART_CT_FP8_SCALE, "weight_scale", "BF16", 2, R, 1, 2);
        } else if (s->quant == QUANT_METHOD_AWQ) {
            if (R % 8)
                return ms_err(err, errlen, MS_EINVAL, "%s has %lld outputs: AWQ needs a multiple of 8",
                              w->name, (long long)R);
            const int64_t ng = (C + B - 1) / B;
            rc = add_part(pl, i, w, PART_AWQ_QWEIGHT, "qweight", "I32", 2, C, R / 8, 4);
            if (!rc) rc = add_part(pl, i, w, PART_GPTQ_QZEROS, "qzeros", "I32", 2, ng, R / 8, 4);
            if (!rc) rc = add_part(pl, i, w, PART_GPTQ_SCALES, "scales", "F16", 2, ng, R, 2);
        } else {
            if (R % 8 || C % 8)
                return ms_err(err, errlen, MS_EINVAL, "%s is (%lld, %lld): GPTQ needs both sizes "
                              "multiples of 8", w->name, (long long)R, (long long)C);
            const int64_t ng = (C + B - 1) / B;
            rc = add_part(pl, i, w, PART_GPTQ_QWEIGHT, "qweight", "I32", 2, C / 8, R, 4);
            if (!rc) rc = add_part(pl, i, w, PART_GPTQ_QZEROS, "qzeros", "I32", 2, ng, R / 8, 4);
            if (!rc) rc = add_part(pl, i, w, PART_GPTQ_SCALES, "scales", "F16", 2, ng, R, 2);
            if (!rc) rc = add_part(pl, i, w, PART_GPTQ_G_IDX, "g_idx", "I32", 1, C, 0, 4);
        }
        if (rc == MS_EINTERNAL)
            return ms_err(err, errlen, rc, "%s: more than %d tensors for one weight (a bug: raise "
                          "PARTS_PER_WEIGHT_MAX)", w->name, PARTS_PER_WEIGHT_MAX);
        if (rc) return ms_err(err, errlen, MS_EINVAL, "tensor name %s is too long", w->name);
    }
    return 0;
}

// Weight i's stream of values: one generator per weight, keyed by its index.
static uint64_t gen_start(size_t i, uint64_t seed)
{
    uint64_t state = seed ^ (0xd1b54a32d192ed03ull * (i + 1));
    splitmix64(&state);
    return state;
}

// The next n of a weight's values, as the bf16 checkpoint of the same seed holds them.
static void gen_values(const struct wspec *w, float *out, uint64_t n, uint64_t *state)
{
    // Uniform on [-a, a] has std a / sqrt(3).
    const float a = w->init.scale * 1.7320508f;
    for (uint64_t k = 0; k < n; k++) {
        const float x = w->init.init == TENSOR_INIT_NORM ? w->init.scale + NORM_JITTER * uniform_pm1(state)
                                                         : a * uniform_pm1(state);
        out[k] = ms_bf16_to_f32(ms_f32_to_bf16(x));
    }
}

// The quantized parts of one projection, made from its values at once.
struct qtensor {
    uint8_t *fp8;        // (R, C)
    float *fp8_scale;    // (ceil(R / B), ceil(C / B))
    uint32_t *qweight, *qzeros;
    uint16_t *scales;
    int32_t *g_idx;
    int64_t shape[2];    // compressed-tensors' weight_shape
};

static void qtensor_free(struct qtensor *q)
{
    free(q->fp8);
    free(q->fp8_scale);
    free(q->qweight);
    free(q->qzeros);
    free(q->scales);
    free(q->g_idx);
    memset(q, 0, sizeof *q);
}

// FP8 block-wise: one scale per B x B block, amax / 448.
static int make_fp8(const float *v, int64_t R, int64_t C, int64_t B, struct qtensor *q)
{
    const int64_t br = (R + B - 1) / B, bc = (C + B - 1) / B;
    q->fp8 = malloc((size_t)(R * C));
    q->fp8_scale = malloc((size_t)(br * bc) * sizeof(float));
    if (!q->fp8 || !q->fp8_scale) return MS_ENOMEM;
    for (int64_t rb = 0; rb < br; rb++)
        for (int64_t cb = 0; cb < bc; cb++) {
            float amax = 0;
            for (int64_t r = rb * B; r < R && r < (rb + 1) * B; r++)
                for (int64_t c = cb * B; c < C && c < (cb + 1) * B; c++) amax = fmaxf(amax, fabsf(v[r * C + c]));
            const float s = amax / 448.0f;
            q->fp8_scale[rb * bc + cb] = s;
            for (int64_t r = rb * B; r < R && r < (rb + 1) * B; r++)
                for (int64_t c = cb * B; c < C && c < (cb + 1) * B; c++)
                    q->fp8[r * C + c] = s > 0 ? quant_f32_to_fp8(v[r * C + c] / s) : 0;
        }
    return 0;
}

// The order act-order quantizes weight w's inputs in: GPTQ sorts them by
// the Hessian's diagonal, which the matrices reading one input share (an
// expert's gate and up; q, k and v), so the order here is keyed by the
// input's matrix (the gate's, or q's, name) and drawn from seed: a shuffle.
// Its inverse is what the checkpoint's g_idx says (input perm[j] in group
// j / G). NULL without act-order, or without memory.
static int32_t *act_order_perm(const struct makemodel_spec *s, const struct wspec *w, uint64_t seed)
{
    if (!s->quant_act_order) return NULL;
    const int64_t C = w->shape[1];
    int32_t *perm = malloc((size_t)C * sizeof *perm);
    if (!perm) return NULL;
    char key[sizeof w->name + 8];
    const char *at = strstr(w->name, "up_proj");
    if (at) snprintf(key, sizeof key, "%.*sgate%s", (int)(at - w->name), w->name, at + 2);
    else snprintf(key, sizeof key, "%s", w->name);
    char *kv = strstr(key, "k_proj");
    if (!kv) kv = strstr(key, "v_proj");
    if (kv) *kv = 'q';
    uint64_t h = 0xcbf29ce484222325ull ^ seed; // FNV-1a of the key
    for (const char *c = key; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    for (int64_t k = 0; k < C; k++) perm[k] = (int32_t)k;
    for (int64_t k = C - 1; k > 0; k--) {
        const int64_t j = (int64_t)(splitmix64(&h) % (uint64_t)(k + 1));
        const int32_t t = perm[k];
        perm[k] = perm[j];
        perm[j] = t;
    }
    return perm;
}

// Weight values v (R, C) with their inputs in perm's order (a copy), or v
// itself without one.
static const float *permuted_values(const float *v, int64_t R, int64_t C, const int32_t *perm, float **owned)
{
    *owned = NULL;
    if (!perm) return v;
    float *p = malloc((size_t)(R * C) * sizeof *p);
    if (!p) return NULL;
    for (int64_t o = 0; o < R; o++)
        for (int64_t j = 0; j < C; j++) p[o * C + j] = v[o * C + perm[j]];
    *owned = p;
    return p;
}

// g_idx: input k's group, as the quantizer took the inputs (perm's order,
// or the stored one).
static int32_t *make_g_idx(int64_t C, int G, const int32_t *perm)
{
    int32_t *g = malloc((size_t)C * 4);
    if (g)
        for (int64_t j = 0; j < C; j++) g[perm ? perm[j] : j] = (int32_t)(j / G);
    return g;
}

// GPTQ v1: per output and group of G inputs (taken in perm's order when
// act-order), quant_rows_quantize_gptq's scales and zeros; the zeros
// stored minus one; each value at its input's place.
static int make_gptq(const float *v0, int64_t R, int64_t C, int G, bool sym, const int32_t *perm, struct qtensor *q)
{
    const int ng = quant_groups((int)C, G);
    float *owned;
    const float *v = permuted_values(v0, R, C, perm, &owned);
    void *buf = malloc(quant_rows_bytes((int)R, (int)C, QUANT_INT4, G));
    q->qweight = calloc((size_t)(C / 8 * R), 4);
    q->qzeros = calloc((size_t)ng * (size_t)(R / 8), 4);
    q->scales = malloc((size_t)ng * (size_t)R * 2);
    q->g_idx = make_g_idx(C, G, perm);
    if (!v || !buf || !q->qweight || !q->qzeros || !q->scales || !q->g_idx) {
        free(owned);
        free(buf);
        return MS_ENOMEM;
    }
    struct quant_rows r;
    quant_rows_init(&r, buf, (int)R, (int)C, QUANT_INT4, G);
    for (int64_t o = 0; o < R; o++) quant_rows_quantize_gptq(&r, (int)o, v + o * C, sym);
    for (int64_t o = 0; o < R; o++) {
        for (int64_t j = 0; j < C; j++) {
            const int64_t k = perm ? perm[j] : j;
            q->qweight[(k / 8) * R + o] |= (uint32_t)r.q[o * C + j] << (4 * (k % 8));
        }
        for (int g = 0; g < ng; g++) {
            q->scales[(size_t)g * R + o] = ms_f32_to_f16(r.scale[o * ng + g]);
            q->qzeros[(size_t)g * (R / 8) + o / 8] |= ((uint32_t)(r.zero[o * ng + g] - 1) & 15u) << (4 * (o % 8));
        }
    }
    free(owned);
    free(buf);
    return 0;
}

// AWQ (AutoAWQ's GEMM layout): per output and group of G inputs, the
// at-load int4 rule's scales and zero points (0 to 15, as AutoAWQ's
// zero_point rule makes them); a dword holds 8 outputs of one input, output
// 8j + i in nibble quant_awq_nibble(i), the zero points likewise.
static int make_awq(const float *v, int64_t R, int64_t C, int G, struct qtensor *q)
{
    const int ng = quant_groups((int)C, G);
    void *buf = malloc(quant_rows_bytes((int)R, (int)C, QUANT_INT4, G));
    q->qweight = calloc((size_t)C * (size_t)(R / 8), 4);
    q->qzeros = calloc((size_t)ng * (size_t)(R / 8), 4);
    q->scales = malloc((size_t)ng * (size_t)R * 2);
    if (!buf || !q->qweight || !q->qzeros || !q->scales) {
        free(buf);
        return MS_ENOMEM;
    }
    struct quant_rows r;
    quant_rows_init(&r, buf, (int)R, (int)C, QUANT_INT4, G);
    for (int64_t o = 0; o < R; o++) quant_rows_quantize(&r, (int)o, v + o * C);
    for (int64_t o = 0; o < R; o++) {
        const int shift = 4 * quant_awq_nibble((int)(o % 8));
        for (int64_t k = 0; k < C; k++)
            q->qweight[(size_t)k * (size_t)(R / 8) + (size_t)(o / 8)] |= (uint32_t)r.q[o * C + k] << shift;
        for (int g = 0; g < ng; g++) {
            q->scales[(size_t)g * R + o] = ms_f32_to_f16(r.scale[o * ng + g]);
            q->qzeros[(size_t)g * (R / 8) + o / 8] |= ((uint32_t)r.zero[o * ng + g] & 15u) << shift;
        }
    }
    free(buf);
    return 0;
}

// compressed-tensors pack-quantized: int4 by the at-load rule when
// asymmetric (its zero point z + 8 is ours, its value q + 8 too) or GPTQ's
// symmetric one (every zero 8), int8 by the at-load rule (fp32 scales);
// values stored plus 2^(bits-1), packed low bits first along the inputs;
// asymmetric zero points packed along the outputs.
static int make_ct_int(const float *v0, int64_t R, int64_t C, int G, int bits, bool asym, const int32_t *perm,
                       struct qtensor *q)
{
    const int ng = quant_groups((int)C, G), per = 32 / bits;
    const size_t words = (size_t)C / (size_t)per;
    const enum quant_format f = bits == 8 ? QUANT_INT8 : QUANT_INT4;
    float *owned;
    const float *v = permuted_values(v0, R, C, perm, &owned);
    void *buf = malloc(quant_rows_bytes((int)R, (int)C, f, G));
    q->qweight = calloc((size_t)R * words, 4);
    q->qzeros = asym ? calloc((size_t)(R / 8) * (size_t)ng, 4) : NULL;
    if (bits == 8) q->fp8_scale = malloc((size_t)R * (size_t)ng * sizeof(float));
    else q->scales = malloc((size_t)R * (size_t)ng * 2);
    if (perm) q->g_idx = make_g_idx(C, G, perm);
    if (!v || !buf || !q->qweight || (asym && !q->qzeros) || (bits == 8 ? !q->fp8_scale : !q->scales) ||
        (perm && !q->g_idx)) {
        free(owned);
        free(buf);
        return MS_ENOMEM;
    }
    struct quant_rows r;
    quant_rows_init(&r, buf, (int)R, (int)C, f, G);
    for (int64_t o = 0; o < R; o++) {
        if (bits == 4 && !asym) quant_rows_quantize_gptq(&r, (int)o, v + o * C, true);
        else quant_rows_quantize(&r, (int)o, v + o * C);
    }
    for (int64_t o = 0; o < R; o++) {
        for (int64_t j = 0; j < C; j++) {
            const int64_t k = perm ? perm[j] : j;
            const uint8_t c = r.q[o * C + j];
            const uint32_t u = bits == 4 ? c : (uint32_t)((int)(int8_t)c + 128);
            q->qweight[(size_t)o * words + (size_t)(k / per)] |= u << (bits * (k % per));
        }
        for (int g = 0; g < ng; g++) {
            if (bits == 8) q->fp8_scale[(size_t)o * ng + g] = r.scale[o * ng + g];
            else q->scales[(size_t)o * ng + g] = ms_f32_to_f16(r.scale[o * ng + g]);
            if (asym) q->qzeros[(size_t)(o / 8) * ng + g] |= ((uint32_t)r.zero[o * ng + g] & 15u) << (4 * (o % 8));
        }
    }
    q->shape[0] = R;
    q->shape[1] = C;
    free(owned);
    free(buf);
    return 0;
}

// compressed-tensors FP8 by channel (FP8_DYNAMIC): a bf16 scale per row,
// amax / 448, and each value e4m3 of w / s.
static int make_ct_fp8(const float *v, int64_t R, int64_t C, struct qtensor *q)
{
    q->fp8 = malloc((size_t)(R * C));
    q->scales = malloc((size_t)R * 2);
    if (!q->fp8 || !q->scales) return MS_ENOMEM;
    for (int64_t o = 0; o < R; o++) {
        float amax = 0;
        for (int64_t k = 0; k < C; k++) amax = fmaxf(amax, fabsf(v[o * C + k]));
        q->scales[o] = ms_f32_to_bf16(amax / 448.0f);
        const float s = ms_bf16_to_f32(q->scales[o]);
        for (int64_t k = 0; k < C; k++) q->fp8[o * C + k] = s > 0 ? quant_f32_to_fp8(v[o * C + k] / s) : 0;
    }
    return 0;
}

static const void *part_bytes(const struct fpart *p, const struct qtensor *q)
{
    switch (p->kind) {
    case PART_FP8_WEIGHT: return q->fp8;
    case PART_FP8_SCALE: return q->fp8_scale;
    case PART_GPTQ_QWEIGHT:
    case PART_AWQ_QWEIGHT:
    case PART_CT_PACKED: return q->qweight;
    case PART_CT_SCALE_F16:
    case PART_CT_FP8_SCALE: return q->scales;
    case PART_CT_SCALE_F32: return q->fp8_scale;
    case PART_CT_SHAPE: return q->shape;
    case PART_CT_ZERO: return q->qzeros;
    case PART_GPTQ_QZEROS: return q->qzeros;
    case PART_GPTQ_SCALES: return q->scales;
    case PART_GPTQ_G_IDX: return q->g_idx;
    default: return NULL;
    }
}

// To part p's place in the file (its parts are not in the file's order).
static int seek_part(FILE *f, const char *tmp, uint64_t data_at, const struct fpart *p, char *err, size_t errlen)
{
    if (data_at + p->off > (uint64_t)INT64_MAX || fseeko(f, (off_t)(data_at + p->off), SEEK_SET) != 0)
        return ms_err(err, errlen, MS_EIO, "cannot seek in %s: %s", tmp, strerror(errno));
    return 0;
}

// One weight into f: streamed in chunks when bf16; a projection to quantize
// is made whole (a few MiB at most), quantized, and its parts written.
static int write_weight(FILE *f, const char *tmp, uint64_t data_at, const struct makemodel_spec *s,
                        const struct wlist *l, const struct plist *pl, size_t *pi, uint64_t seed, float *chunk,
                        uint16_t *buf, char *err, size_t errlen)
{
    const struct fpart *p = &pl->p[*pi];
    const struct wspec *w = &l->w[p->w];
    uint64_t state = gen_start(p->w, seed);
    int rc = seek_part(f, tmp, data_at, p, err, errlen);
    if (rc) return rc;
    if (p->kind == PART_BF16) {
        for (uint64_t done = 0; done < w->count && !rc;) {
            size_t n = w->count - done < CHUNK_ELEMS ? (size_t)(w->count - done) : CHUNK_ELEMS;
            gen_values(w, chunk, n, &state);
            for (size_t k = 0; k < n; k++) buf[k] = ms_f32_to_bf16(chunk[k]);
            rc = write_all(f, buf, n * sizeof *buf, tmp, err, errlen);
            done += n;
        }
        (*pi)++;
        return rc;
    }
    float *v = malloc((size_t)w->count * sizeof *v);
    if (!v) return ms_err(err, errlen, MS_ENOMEM, "out of memory for %s", w->name);
    gen_values(w, v, w->count, &state);
    struct qtensor q = {0};
    const int64_t R = w->shape[0], C = w->shape[1];
    const int G = quant_group_of(s);
    int32_t *perm = act_order_perm(s, w, seed);
    switch (s->quant) {
    case QUANT_METHOD_FP8: rc = make_fp8(v, R, C, G, &q); break;
    case QUANT_METHOD_AWQ: rc = make_awq(v, R, C, G, &q); break;
    case QUANT_METHOD_CT_INT:
        rc = make_ct_int(v, R, C, G, s->quant_bits == 8 ? 8 : 4, s->quant_asym, perm, &q);
        break;
    case QUANT_METHOD_CT_FP8: rc = make_ct_fp8(v, R, C, &q); break;
    default: rc = make_gptq(v, R, C, G, !s->quant_asym, perm, &q); break;
    }
    if (s->quant_act_order && !perm) rc = MS_ENOMEM;
    free(perm);
    free(v);
    if (rc) rc = ms_err(err, errlen, MS_ENOMEM, "out of memory quantizing %s", w->name);
    for (; !rc && *pi < pl->n && pl->p[*pi].w == p->w; (*pi)++)
        if (!(rc = seek_part(f, tmp, data_at, &pl->p[*pi], err, errlen)))
            rc = write_all(f, part_bytes(&pl->p[*pi], &q), pl->p[*pi].bytes, tmp, err, errlen);
    qtensor_free(&q);
    return rc;
}

static int write_safetensors(const char *dir, const struct makemodel_spec *s, const struct wlist *l,
                             uint64_t seed, char *err, size_t errlen)
{
    struct plist pl = {0};
    int rc = build_parts(s, l, &pl, err, errlen);
    if (rc) {
        free(pl.p);
        return rc;
    }
    json_t *h = json_object();
    if (!h) {
        free(pl.p);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    // The data laid out as safetensors lays it out, wider elements first
    // (8-byte, then 4, 2, 1), so that every tensor starts aligned to its
    // elements with no gap between tensors (the format allows none):
    // compressed-tensors' I64 weight_shape beside F16 scales of any size.
    uint64_t off = 0;
    for (uint64_t esz = 8; esz >= 1; esz /= 2)
        for (size_t i = 0; i < pl.n; i++)
            if (pl.p[i].esz == esz) {
                pl.p[i].off = off;
                off += pl.p[i].bytes;
            }
    for (size_t i = 0; i < pl.n; i++) {
        const struct fpart *p = &pl.p[i];
        const uint64_t begin = p->off, end = p->off + p->bytes;
        json_t *shape = p->ndim == 2 ? json_pack("[I,I]", (json_int_t)p->shape[0], (json_int_t)p->shape[1])
                                     : json_pack("[I]", (json_int_t)p->shape[0]);
        json_object_set_new(h, p->name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", p->dtype, "shape", shape,
                                      "data_offsets", (json_int_t)begin, (json_int_t)end));
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!text) {
        free(pl.p);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    }
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7; // data stays 8-byte aligned

    char tmp[4096], final[4096];
    FILE *f;
    rc = open_tmp(dir, "model.safetensors", tmp, final, sizeof tmp, &f, err, errlen);
    if (rc) {
        free(text);
        free(pl.p);
        return rc;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    uint16_t *buf = malloc(CHUNK_ELEMS * sizeof *buf);
    float *chunk = malloc(CHUNK_ELEMS * sizeof *chunk);
    if (!buf || !chunk) rc = ms_err(err, errlen, MS_ENOMEM, "out of memory");
    if (!rc) rc = write_all(f, len8, 8, tmp, err, errlen);
    if (!rc) rc = write_all(f, text, hlen, tmp, err, errlen);
    if (!rc) rc = write_all(f, "        ", padded - hlen, tmp, err, errlen);
    for (size_t pi = 0; pi < pl.n && !rc;)
        rc = write_weight(f, tmp, 8 + (uint64_t)padded, s, l, &pl, &pi, seed, chunk, buf, err, errlen);
    free(buf);
    free(chunk);
    free(text);
    free(pl.p);
    if (rc) {
        fclose(f);
        unlink(tmp);
        return rc;
    }
    return commit_file(f, tmp, final, err, errlen);
}

// compressed-tensors' quantization_config as llm-compressor saves it: one
// group over every Linear, the lm_head and the routers left out.
static json_t *ct_config(const struct makemodel_spec *s)
{
    const bool fp8 = s->quant == QUANT_METHOD_CT_FP8;
    const char *format = fp8 ? "float-quantized" : "pack-quantized";
    json_t *w = fp8 ? json_pack("{s:i,s:s,s:b,s:s,s:n,s:b,s:n,s:n,s:s,s:{}}", "num_bits", 8, "type", "float",
                                "symmetric", 1, "strategy", "channel", "group_size", "dynamic", 0, "actorder",
                                "block_structure", "observer", "minmax", "observer_kwargs")
                    : json_pack("{s:i,s:s,s:b,s:s,s:i,s:b,s:o,s:n,s:s,s:{}}", "num_bits",
                                s->quant_bits == 8 ? 8 : 4, "type", "int", "symmetric", !s->quant_asym,
                                "strategy", "group", "group_size", quant_group_of(s), "dynamic", 0, "actorder",
                                s->quant_act_order ? json_string("group") : json_null(),
                                "block_structure", "observer", "minmax", "observer_kwargs");
    json_t *in = fp8 ? json_pack("{s:i,s:s,s:b,s:s,s:n,s:b,s:n}", "num_bits", 8, "type", "float", "symmetric", 1,
                                 "strategy", "token", "group_size", "dynamic", 1, "observer")
                     : json_null();
    return json_pack("{s:{s:{s:[s],s:o,s:o,s:n,s:s}},s:s,s:n,s:[s,s],s:n,s:s,s:s,s:{},s:{},s:s}", "config_groups",
                     "group_0", "targets", "Linear", "weights", w, "input_activations", in, "output_activations",
                     "format", format, "format", format, "global_compression_ratio", "ignore", "lm_head",
                     "re:.*mlp.gate$", "kv_cache_scheme", "quant_method", "compressed-tensors",
                     "quantization_status", "compressed", "sparsity_config", "transform_config", "version",
                     "0.10.2");
}

static json_t *config_json(const struct makemodel_spec *s)
{
    bool moe = s->arch == ARCH_QWEN3_MOE;
    json_t *c = json_object();
    if (!c) return NULL;
    json_object_set_new(c, "architectures",
                        json_pack("[s]", moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
    json_object_set_new(c, "model_type", json_string(moe ? "qwen3_moe" : "qwen3"));
    json_object_set_new(c, "vocab_size", json_integer(s->vocab_size));
    json_object_set_new(c, "hidden_size", json_integer(s->hidden_size));
    json_object_set_new(c, "num_hidden_layers", json_integer(s->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(s->n_heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(s->n_kv_heads));
    json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    json_object_set_new(c, "intermediate_size", json_integer(s->intermediate_size));
    if (moe) {
        json_object_set_new(c, "moe_intermediate_size", json_integer(s->moe_intermediate_size));
        json_object_set_new(c, "num_experts", json_integer(s->n_experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(s->n_experts_per_tok));
        json_object_set_new(c, "norm_topk_prob", json_boolean(s->norm_topk_prob));
        json_object_set_new(c, "decoder_sparse_step", json_integer(s->decoder_sparse_step));
        json_t *mo = json_array();
        for (int i = 0; i < s->n_mlp_only; i++)
            json_array_append_new(mo, json_integer(s->mlp_only_layers[i]));
        json_object_set_new(c, "mlp_only_layers", mo);
        json_object_set_new(c, "output_router_logits", json_false());
        json_object_set_new(c, "router_aux_loss_coef", json_real(0.001));
    }
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "rms_norm_eps", json_real(s->rms_norm_eps));
    json_object_set_new(c, "rope_theta", json_real(s->rope_theta));
    json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "max_position_embeddings", json_integer(s->max_position_embeddings));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "max_window_layers", json_integer(s->n_layers));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(s->tie_word_embeddings));
    json_object_set_new(c, "bos_token_id", json_integer(QWEN3_BOS));
    json_object_set_new(c, "eos_token_id", json_integer(QWEN3_EOS));
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    if (s->quant == QUANT_METHOD_FP8)
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s,s:s,s:s,s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3",
                                      "activation_scheme", "dynamic", "weight_block_size",
                                      quant_group_of(s), quant_group_of(s)));
    else if (s->quant == QUANT_METHOD_GPTQ)
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s,s:i,s:i,s:b,s:b,s:f,s:b,s:b,s:s}", "quant_method", "gptq",
                                      "bits", 4, "group_size", quant_group_of(s), "desc_act", s->quant_act_order,
                                      "sym", !s->quant_asym, "damp_percent", 0.01,
                                      "true_sequential", 1, "static_groups", 0,
                                      "checkpoint_format", "gptq"));
    else if (s->quant == QUANT_METHOD_CT_INT || s->quant == QUANT_METHOD_CT_FP8)
        json_object_set_new(c, "quantization_config", ct_config(s));
    else if (s->quant == QUANT_METHOD_AWQ)
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s,s:i,s:i,s:b,s:s,s:n}", "quant_method", "awq", "bits", 4,
                                      "group_size", quant_group_of(s), "zero_point", 1, "version", "gemm",
                                      "modules_to_not_convert"));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "transformers_version", json_string("4.51.0"));
    return c;
}

static int copy_tokenizer(const char *src_dir, const char *out_dir, char *err, size_t errlen)
{
    static const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < 2; i++) {
        char path[4096], sub[512];
        if (ms_path_join(path, sizeof path, src_dir, names[i]))
            return ms_err(err, errlen, MS_EINVAL, "path %s is too long", src_dir);
        char *text;
        size_t len;
        int rc = ms_read_file(path, TOKENIZER_MAX_BYTES, &text, &len, sub, sizeof sub);
        if (rc)
            return ms_err(err, errlen, rc, "cannot read the Qwen3 tokenizer: %s (run "
                          "deploy/setup.sh, or pass --tokenizer-dir DIR holding tokenizer.json "
                          "and tokenizer_config.json)", sub);
        rc = write_bytes_atomic(out_dir, names[i], text, len, err, errlen);
        free(text);
        if (rc) return rc;
    }
    return 0;
}

int makemodel_write(const struct makemodel_spec *spec, const char *out_dir, uint64_t seed,
                    const char *tokenizer_dir, char *err, size_t errlen)
{
    int rc = spec_check(spec, err, errlen);
    if (rc) return rc;
    if ((rc = mkdir_p(out_dir, err, errlen))) return rc;
    // config.json goes last: a reader that finds it finds a complete checkpoint.
    char cfgpath[4096];
    if (ms_path_join(cfgpath, sizeof cfgpath, out_dir, "config.json"))
        return ms_err(err, errlen, MS_EINVAL, "path %s is too long", out_dir);
    if (unlink(cfgpath) != 0 && errno != ENOENT)
        return ms_err(err, errlen, MS_EIO, "cannot replace %s: %s", cfgpath, strerror(errno));
    if (tokenizer_dir && (rc = copy_tokenizer(tokenizer_dir, out_dir, err, errlen))) return rc;

    struct wlist l = {0};
    if (build_list(spec, &l)) {
        free(l.w);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    }
    rc = write_safetensors(out_dir, spec, &l, seed, err, errlen);
    free(l.w);
    if (rc) return rc;

    json_t *g = json_pack("{s:i,s:[i,i],s:i,s:b,s:f,s:i,s:f,s:s}", "bos_token_id", QWEN3_BOS,
                          "eos_token_id", QWEN3_EOS, QWEN3_BOS, "pad_token_id", QWEN3_BOS,
                          "do_sample", 1, "temperature", 0.6, "top_k", 20, "top_p", 0.95,
                          "transformers_version", "4.51.0");
    if (!g) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    rc = write_json_atomic(out_dir, "generation_config.json", g, err, errlen);
    json_decref(g);
    if (rc) return rc;
    json_t *c = config_json(spec);
    if (!c) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    rc = write_json_atomic(out_dir, "config.json", c, err, errlen);
    json_decref(c);
    return rc;
}
