// model: binds every tensor a Qwen3 / Qwen3-MoE config implies to its
// Hugging Face name in the mapped safetensors, checking presence, dtype and shape.
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/makemodel.h"
#include "model/safetensors.h"

struct binder {
    struct model *m;
    const struct safetensors *st; // NULL: a dummy load, every tensor made by the backend
    uint64_t seed;                // dummy loads
    enum dtype dummy_dtype;
    size_t bound;          // tensors bound so far (distinct)
    bool have_dtype;       // the first bound tensor fixes the weights' dtype
    enum dtype dtype;
    const char *dtype_from; // the tensor that fixed it
};

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t off = 0;
    off += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

static int bind(struct binder *b, struct tensor *out, enum weight_role role, int ffn,
                const char *why, int ndim, const int64_t *shape, char *err, size_t errlen,
                const char *fmt, ...) __attribute__((format(printf, 10, 11)));

// A dummy tensor: the config's shape, the recipe make-model would use, and a
// key of its own (the bound count) under the seed.
static void bind_dummy(struct binder *b, struct tensor *out, enum weight_role role, int ffn,
                       int ndim, const int64_t *shape)
{
    const struct model_config *c = &b->m->cfg;
    const struct weight_init wi = makemodel_weight_init(role, c->hidden_size, c->n_layers,
                                                        c->n_heads * c->head_dim, ffn);
    memset(out, 0, sizeof *out);
    out->dtype = b->dummy_dtype;
    out->ndim = ndim;
    for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
    out->init = wi.init;
    out->init_scale = wi.scale;
    out->init_key = b->seed ^ (0xd1b54a32d192ed03ull * (b->bound + 1));
    b->bound++;
}

// Binds tensor `name` of the given shape into *out. why names the config
// fields the shape comes from, so that a mismatch says what to fix; role
// and ffn say how a dummy load draws it.
static int bind(struct binder *b, struct tensor *out, enum weight_role role, int ffn,
                const char *why, int ndim, const int64_t *shape, char *err, size_t errlen,
                const char *fmt, ...)
{
    if (!b->st) {
        bind_dummy(b, out, role, ffn, ndim, shape);
        return 0;
    }
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    char want[128], got[128];
    shape_str(want, sizeof want, ndim, shape);
    const struct st_tensor *t = safetensors_find(b->st, name);
    if (!t)
        return ms_err(err, errlen, MS_ENOTFOUND,
                      "the checkpoint has no tensor %s, which config.json implies with shape %s "
                      "(%s)", name, want, why);
    if (!t->supported)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "tensor %s is stored as %s; moeserve computes with BF16, F16 or F32 weights",
                      name, t->dtype_str);
    shape_str(got, sizeof got, t->ndim, t->shape);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return ms_err(err, errlen, MS_EFORMAT,
                      "tensor %s has shape %s, but config.json implies %s (%s)", name, got, want,
                      why);
    if (!b->have_dtype) {
        b->have_dtype = true;
        b->dtype = t->dtype;
        b->dtype_from = t->name;
    } else if (t->dtype != b->dtype) {
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "tensor %s is %s but %s is %s; moeserve needs every weight in one dtype "
                      "(convert the checkpoint, e.g. to BF16)", name, dtype_name(t->dtype),
                      b->dtype_from, dtype_name(b->dtype));
    }
    out->data = t->data;
    out->dtype = t->dtype;
    out->ndim = ndim;
    memset(out->shape, 0, sizeof out->shape);
    for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
    b->bound++;
    return 0;
}

#define SHAPE1(a) 1, (const int64_t[]){(a)}
#define SHAPE2(a, b) 2, (const int64_t[]){(a), (b)}

size_t tensor_elems(const struct tensor *t)
{
    if (t->ndim == 0) return 0;
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

static size_t tensor_bytes(const struct tensor *t) { return tensor_elems(t) * dtype_size(t->dtype); }

static int bind_layer(struct binder *b, int i, char *err, size_t errlen)
{
    const struct model_config *c = &b->m->cfg;
    struct layer_weights *L = &b->m->layers[i];
    const char *P = "model.layers";
    int64_t H = c->hidden_size, D = c->head_dim, q = (int64_t)c->n_heads * D,
            kv = (int64_t)c->n_kv_heads * D;
    int rc;
    if ((rc = bind(b, &L->attn_norm, ROLE_NORM, 0, "hidden_size", SHAPE1(H), err, errlen,
                   "%s.%d.input_layernorm.weight", P, i)) ||
        (rc = bind(b, &L->wq, ROLE_QKV, 0, "num_attention_heads x head_dim, hidden_size", SHAPE2(q, H), err,
                   errlen, "%s.%d.self_attn.q_proj.weight", P, i)) ||
        (rc = bind(b, &L->wk, ROLE_QKV, 0, "num_key_value_heads x head_dim, hidden_size", SHAPE2(kv, H), err,
                   errlen, "%s.%d.self_attn.k_proj.weight", P, i)) ||
        (rc = bind(b, &L->wv, ROLE_QKV, 0, "num_key_value_heads x head_dim, hidden_size", SHAPE2(kv, H), err,
                   errlen, "%s.%d.self_attn.v_proj.weight", P, i)) ||
        (rc = bind(b, &L->wo, ROLE_O, 0, "hidden_size, num_attention_heads x head_dim", SHAPE2(H, q), err,
                   errlen, "%s.%d.self_attn.o_proj.weight", P, i)) ||
        (rc = bind(b, &L->q_norm, ROLE_QK_NORM, 0, "head_dim", SHAPE1(D), err, errlen,
                   "%s.%d.self_attn.q_norm.weight", P, i)) ||
        (rc = bind(b, &L->k_norm, ROLE_QK_NORM, 0, "head_dim", SHAPE1(D), err, errlen,
                   "%s.%d.self_attn.k_norm.weight", P, i)) ||
        (rc = bind(b, &L->ffn_norm, ROLE_NORM, 0, "hidden_size", SHAPE1(H), err, errlen,
                   "%s.%d.post_attention_layernorm.weight", P, i)))
        return rc;
    L->is_moe = c->layer_is_moe[i];
    if (!L->is_moe) {
        int64_t F = c->intermediate_size;
        if ((rc = bind(b, &L->gate, ROLE_DENSE_IN, (int)F, "intermediate_size, hidden_size", SHAPE2(F, H), err, errlen,
                       "%s.%d.mlp.gate_proj.weight", P, i)) ||
            (rc = bind(b, &L->up, ROLE_DENSE_IN, (int)F, "intermediate_size, hidden_size", SHAPE2(F, H), err, errlen,
                       "%s.%d.mlp.up_proj.weight", P, i)) ||
            (rc = bind(b, &L->down, ROLE_DENSE_DOWN, (int)F, "hidden_size, intermediate_size", SHAPE2(H, F), err, errlen,
                       "%s.%d.mlp.down_proj.weight", P, i)))
            return rc;
        return 0;
    }
    int64_t E = c->n_experts, F = c->moe_intermediate_size;
    if ((rc = bind(b, &L->router, ROLE_ROUTER, 0, "num_experts, hidden_size", SHAPE2(E, H), err, errlen,
                   "%s.%d.mlp.gate.weight", P, i)))
        return rc;
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!L->experts) return ms_err(err, errlen, MS_ENOMEM, "out of memory for %lld experts",
                                   (long long)E);
    for (int e = 0; e < E; e++) {
        struct expert_weights *x = &L->experts[e];
        if ((rc = bind(b, &x->gate, ROLE_EXPERT_IN, (int)F, "moe_intermediate_size, hidden_size", SHAPE2(F, H), err,
                       errlen, "%s.%d.mlp.experts.%d.gate_proj.weight", P, i, e)) ||
            (rc = bind(b, &x->up, ROLE_EXPERT_IN, (int)F, "moe_intermediate_size, hidden_size", SHAPE2(F, H), err,
                       errlen, "%s.%d.mlp.experts.%d.up_proj.weight", P, i, e)) ||
            (rc = bind(b, &x->down, ROLE_EXPERT_DOWN, (int)F, "hidden_size, moe_intermediate_size", SHAPE2(H, F), err,
                       errlen, "%s.%d.mlp.experts.%d.down_proj.weight", P, i, e)))
            return rc;
    }
    return 0;
}

static size_t layer_bytes(const struct layer_weights *L, const struct model_config *c, bool all)
{
    size_t n = tensor_bytes(&L->attn_norm) + tensor_bytes(&L->wq) + tensor_bytes(&L->wk) +
               tensor_bytes(&L->wv) + tensor_bytes(&L->wo) + tensor_bytes(&L->q_norm) +
               tensor_bytes(&L->k_norm) + tensor_bytes(&L->ffn_norm);
    if (!L->is_moe) return n + tensor_bytes(&L->gate) + tensor_bytes(&L->up) +
                           tensor_bytes(&L->down);
    n += tensor_bytes(&L->router);
    int experts = all ? c->n_experts : c->n_experts_per_tok;
    if (L->experts && experts > 0) {
        const struct expert_weights *x = &L->experts[0];
        n += (size_t)experts * (tensor_bytes(&x->gate) + tensor_bytes(&x->up) +
                                tensor_bytes(&x->down));
    }
    return n;
}

static int bind_all(struct binder *b, char *err, size_t errlen)
{
    struct model *m = b->m;
    const struct model_config *c = &m->cfg;
    int64_t V = c->vocab_size, H = c->hidden_size;
    int rc;
    if ((rc = bind(b, &m->embed, ROLE_EMBED, 0, "vocab_size, hidden_size", SHAPE2(V, H), err, errlen,
                   "model.embed_tokens.weight")))
        return rc;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = bind_layer(b, i, err, errlen))) return rc;
    if ((rc = bind(b, &m->final_norm, ROLE_NORM, 0, "hidden_size", SHAPE1(H), err, errlen, "model.norm.weight")))
        return rc;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if ((rc = bind(b, &m->lm_head, ROLE_LM_HEAD, 0, "vocab_size, hidden_size; tie_word_embeddings is false",
                          SHAPE2(V, H), err, errlen, "lm_head.weight"))) {
        return rc;
    }
    return 0;
}

// The shared part of both load formats: the model, its path and config.
static int model_begin(const char *dir, struct model **out, char *err, size_t errlen)
{
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    if (snprintf(m->dir, sizeof m->dir, "%s", dir) >= (int)sizeof m->dir) {
        free(m);
        return ms_err(err, errlen, MS_EINVAL, "model path %s is too long", dir);
    }
    int rc = config_load(dir, &m->cfg, err, errlen);
    if (rc) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

static size_t model_total_bytes(const struct model *m)
{
    size_t total = tensor_bytes(&m->embed) + tensor_bytes(&m->final_norm);
    if (!m->cfg.tie_word_embeddings) total += tensor_bytes(&m->lm_head);
    for (int i = 0; i < m->cfg.n_layers; i++) total += layer_bytes(&m->layers[i], &m->cfg, true);
    return total;
}

int model_load(const char *dir, struct model **out, char *err, size_t errlen)
{
    struct model *m;
    int rc = model_begin(dir, &m, err, errlen);
    if (rc) return rc;
    struct safetensors *st = NULL;
    if ((rc = safetensors_open_dir(dir, &st, err, errlen))) {
        free(m);
        return rc;
    }
    m->storage = st;
    struct binder b = {.m = m, .st = st};
    char sub[1024];
    if ((rc = bind_all(&b, sub, sizeof sub))) {
        ms_err(err, errlen, rc, "%s: %s", dir, sub);
        model_destroy(m);
        return rc;
    }
    if (b.dtype != m->cfg.torch_dtype) {
        ms_log(MS_LOG_WARN, "%s: config.json declares torch_dtype %s but the weights are %s; "
               "using %s", dir, dtype_name(m->cfg.torch_dtype), dtype_name(b.dtype),
               dtype_name(b.dtype));
        m->cfg.torch_dtype = b.dtype;
    }
    // Extras are usually harmless (a tied lm_head stored anyway, rotary
    // buffers), but a bias we would ignore changes the result: say so.
    size_t extra = safetensors_count(st) - b.bound;
    if (m->cfg.tie_word_embeddings && safetensors_find(st, "lm_head.weight")) extra--;
    if (extra > 0) {
        const char *example = NULL;
        for (size_t i = 0; i < safetensors_count(st) && !example; i++) {
            const char *n = safetensors_get(st, i)->name;
            if (strstr(n, ".bias")) example = n;
        }
        ms_log(MS_LOG_WARN, "%s: %zu tensors in the checkpoint are not used by this config%s%s",
               dir, extra, example ? ", for example " : "", example ? example : "");
    }
    m->weight_bytes = model_total_bytes(m);
    *out = m;
    return 0;
}

int load_format_parse(const char *s, enum load_format *out)
{
    if (!strcmp(s, "auto") || !strcmp(s, "safetensors")) *out = LOAD_FORMAT_AUTO;
    else if (!strcmp(s, "dummy")) *out = LOAD_FORMAT_DUMMY;
    else return MS_EINVAL;
    return 0;
}

int model_load_format(const char *dir, enum load_format f, uint64_t seed, struct model **out,
                      char *err, size_t errlen)
{
    if (f == LOAD_FORMAT_AUTO) return model_load(dir, out, err, errlen);
    struct model *m;
    int rc = model_begin(dir, &m, err, errlen);
    if (rc) return rc;
    // The checkpoint's dtype when the backends compute with it, else bf16.
    const enum dtype t = m->cfg.torch_dtype;
    struct binder b = {.m = m, .seed = seed,
                       .dummy_dtype = t == DTYPE_F16 || t == DTYPE_F32 ? t : DTYPE_BF16};
    char sub[1024];
    if ((rc = bind_all(&b, sub, sizeof sub))) {
        ms_err(err, errlen, rc, "%s: %s", dir, sub);
        model_destroy(m);
        return rc;
    }
    m->cfg.torch_dtype = b.dummy_dtype;
    m->dummy = true;
    m->weight_bytes = model_total_bytes(m);
    *out = m;
    return 0;
}

void model_destroy(struct model *m)
{
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->cfg.n_layers; i++) free(m->layers[i].experts);
    free(m->layers);
    safetensors_close(m->storage);
    free(m);
}

size_t model_active_bytes(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    size_t n = tensor_bytes(&m->final_norm) + tensor_bytes(&m->lm_head) +
               (size_t)c->hidden_size * dtype_size(m->embed.dtype);
    for (int i = 0; i < c->n_layers; i++) n += layer_bytes(&m->layers[i], c, false);
    return n;
}
