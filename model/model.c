// model: binds every tensor a Qwen3 / Qwen3-MoE config implies to its
// Hugging Face name in the mapped safetensors, checking presence, dtype and shape.
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "model/cpu/kernels.h"
#include "model/safetensors.h"

struct binder {
    struct model *m;
    const struct safetensors *st;
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

// Binds tensor `name` of the given shape into *out. why names the config
// fields the shape comes from, so that a mismatch says what to fix.
static int bind(struct binder *b, struct tensor *out, const char *why, int ndim,
                const int64_t *shape, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static int bind(struct binder *b, struct tensor *out, const char *why, int ndim,
                const int64_t *shape, char *err, size_t errlen, const char *fmt, ...)
{
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

static size_t tensor_bytes(const struct tensor *t)
{
    if (!t->data) return 0;
    size_t n = dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

static int bind_layer(struct binder *b, int i, char *err, size_t errlen)
{
    const struct model_config *c = &b->m->cfg;
    struct layer_weights *L = &b->m->layers[i];
    const char *P = "model.layers";
    int64_t H = c->hidden_size, D = c->head_dim, q = (int64_t)c->n_heads * D,
            kv = (int64_t)c->n_kv_heads * D;
    int rc;
    if ((rc = bind(b, &L->attn_norm, "hidden_size", SHAPE1(H), err, errlen,
                   "%s.%d.input_layernorm.weight", P, i)) ||
        (rc = bind(b, &L->wq, "num_attention_heads x head_dim, hidden_size", SHAPE2(q, H), err,
                   errlen, "%s.%d.self_attn.q_proj.weight", P, i)) ||
        (rc = bind(b, &L->wk, "num_key_value_heads x head_dim, hidden_size", SHAPE2(kv, H), err,
                   errlen, "%s.%d.self_attn.k_proj.weight", P, i)) ||
        (rc = bind(b, &L->wv, "num_key_value_heads x head_dim, hidden_size", SHAPE2(kv, H), err,
                   errlen, "%s.%d.self_attn.v_proj.weight", P, i)) ||
        (rc = bind(b, &L->wo, "hidden_size, num_attention_heads x head_dim", SHAPE2(H, q), err,
                   errlen, "%s.%d.self_attn.o_proj.weight", P, i)) ||
        (rc = bind(b, &L->q_norm, "head_dim", SHAPE1(D), err, errlen,
                   "%s.%d.self_attn.q_norm.weight", P, i)) ||
        (rc = bind(b, &L->k_norm, "head_dim", SHAPE1(D), err, errlen,
                   "%s.%d.self_attn.k_norm.weight", P, i)) ||
        (rc = bind(b, &L->ffn_norm, "hidden_size", SHAPE1(H), err, errlen,
                   "%s.%d.post_attention_layernorm.weight", P, i)))
        return rc;
    L->is_moe = c->layer_is_moe[i];
    if (!L->is_moe) {
        int64_t F = c->intermediate_size;
        if ((rc = bind(b, &L->gate, "intermediate_size, hidden_size", SHAPE2(F, H), err, errlen,
                       "%s.%d.mlp.gate_proj.weight", P, i)) ||
            (rc = bind(b, &L->up, "intermediate_size, hidden_size", SHAPE2(F, H), err, errlen,
                       "%s.%d.mlp.up_proj.weight", P, i)) ||
            (rc = bind(b, &L->down, "hidden_size, intermediate_size", SHAPE2(H, F), err, errlen,
                       "%s.%d.mlp.down_proj.weight", P, i)))
            return rc;
        return 0;
    }
    int64_t E = c->n_experts, F = c->moe_intermediate_size;
    if ((rc = bind(b, &L->router, "num_experts, hidden_size", SHAPE2(E, H), err, errlen,
                   "%s.%d.mlp.gate.weight", P, i)))
        return rc;
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!L->experts) return ms_err(err, errlen, MS_ENOMEM, "out of memory for %lld experts",
                                   (long long)E);
    for (int e = 0; e < E; e++) {
        struct expert_weights *x = &L->experts[e];
        if ((rc = bind(b, &x->gate, "moe_intermediate_size, hidden_size", SHAPE2(F, H), err,
                       errlen, "%s.%d.mlp.experts.%d.gate_proj.weight", P, i, e)) ||
            (rc = bind(b, &x->up, "moe_intermediate_size, hidden_size", SHAPE2(F, H), err,
                       errlen, "%s.%d.mlp.experts.%d.up_proj.weight", P, i, e)) ||
            (rc = bind(b, &x->down, "hidden_size, moe_intermediate_size", SHAPE2(H, F), err,
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
    if ((rc = bind(b, &m->embed, "vocab_size, hidden_size", SHAPE2(V, H), err, errlen,
                   "model.embed_tokens.weight")))
        return rc;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = bind_layer(b, i, err, errlen))) return rc;
    if ((rc = bind(b, &m->final_norm, "hidden_size", SHAPE1(H), err, errlen, "model.norm.weight")))
        return rc;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if ((rc = bind(b, &m->lm_head, "vocab_size, hidden_size; tie_word_embeddings is false",
                          SHAPE2(V, H), err, errlen, "lm_head.weight"))) {
        return rc;
    }
    return 0;
}

// ---- packing for the CPU kernels -------------------------------------------------

typedef void (*matrix_fn)(struct tensor *t, void *ctx);

// Every matrix the forward pass multiplies by.
static void for_each_matrix(struct model *m, matrix_fn fn, void *ctx)
{
    for (int i = 0; i < m->cfg.n_layers; i++) {
        struct layer_weights *L = &m->layers[i];
        fn(&L->wq, ctx);
        fn(&L->wk, ctx);
        fn(&L->wv, ctx);
        fn(&L->wo, ctx);
        if (L->is_moe) {
            fn(&L->router, ctx);
            for (int e = 0; e < m->cfg.n_experts; e++) {
                fn(&L->experts[e].gate, ctx);
                fn(&L->experts[e].up, ctx);
                fn(&L->experts[e].down, ctx);
            }
        } else {
            fn(&L->gate, ctx);
            fn(&L->up, ctx);
            fn(&L->down, ctx);
        }
    }
    fn(&m->lm_head, ctx);
}

struct pack_job {
    struct tensor *t;
    size_t off;        // into the packed mapping
};

struct pack_ctx {
    const struct cpu_kernels *k;
    const void *keep;  // the embedding, which lookups still read from the file
    struct pack_job *jobs; // NULL on the counting pass
    size_t n_jobs, bytes;
    char *base;
    atomic_size_t next;    // the next job a packing thread takes
};

static struct cpu_wmat tensor_wmat(const struct tensor *t)
{
    return (struct cpu_wmat){.data = t->data, .dtype = t->dtype, .out = (int)t->shape[0],
                             .in = (int)t->shape[1]};
}

static void plan_one(struct tensor *t, void *arg)
{
    struct pack_ctx *c = arg;
    const struct cpu_wmat w = tensor_wmat(t);
    if (!c->k->wants_packed(&w)) return;
    if (c->jobs) c->jobs[c->n_jobs] = (struct pack_job){.t = t, .off = c->bytes};
    c->n_jobs++;
    c->bytes += (cpu_pack_bytes(&w) + 63) / 64 * 64;
}

static void *pack_worker(void *arg)
{
    struct pack_ctx *c = arg;
    for (size_t i; (i = atomic_fetch_add(&c->next, 1)) < c->n_jobs;) {
        struct tensor *t = c->jobs[i].t;
        const struct cpu_wmat w = tensor_wmat(t);
        cpu_pack_blocks(&w, 0, (w.out + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS, c->base + c->jobs[i].off);
        t->packed = c->base + c->jobs[i].off;
        // The file's copy is not read again (except by a tied embedding):
        // give its whole pages back to the page cache.
        if (t->data != c->keep) {
            const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)t->data;
            const uintptr_t lo = (a + pg - 1) / pg * pg, hi = (a + tensor_bytes(t)) / pg * pg;
            if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
        }
    }
    return NULL;
}

// On every core: a 30B checkpoint is tens of GB to reorder.
static int pack_matrices(struct model *m, char *err, size_t errlen)
{
    const struct cpu_kernels *k = cpu_kernels_best();
    if (!k->wants_packed) return 0;
    struct pack_ctx c = {.k = k, .keep = m->embed.data};
    for_each_matrix(m, plan_one, &c);
    if (c.bytes == 0) return 0;
    const double t0 = ms_now();
    c.jobs = calloc(c.n_jobs, sizeof *c.jobs);
    void *p = mmap(NULL, c.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!c.jobs || p == MAP_FAILED) {
        free(c.jobs);
        if (p != MAP_FAILED) munmap(p, c.bytes);
        return ms_err(err, errlen, MS_ENOMEM, "cannot map %.1f MiB for the weights packed for the "
                      "%s kernels", (double)c.bytes / (1 << 20), k->name);
    }
    m->packed = c.base = p;
    m->packed_bytes = c.bytes;
    c.n_jobs = c.bytes = 0;
    for_each_matrix(m, plan_one, &c);
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = n_cpu < 1 ? 1 : n_cpu > 64 ? 64 : (int)n_cpu;
    if ((size_t)n_threads > c.n_jobs) n_threads = (int)c.n_jobs;
    pthread_t th[64];
    int started = 0;
    for (; started < n_threads - 1; started++)
        if (pthread_create(&th[started], NULL, pack_worker, &c)) break;
    pack_worker(&c); // and whatever threads could not be started leave to this one
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(c.jobs);
    ms_log(MS_LOG_INFO, "packed %zu matrices (%.1f MiB) for the %s kernels in %.2f s on %d threads",
           c.n_jobs, (double)c.bytes / (1 << 20), k->name, ms_now() - t0, started + 1);
    return 0;
}

int model_load(const char *dir, struct model **out, char *err, size_t errlen)
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
    size_t total = tensor_bytes(&m->embed) + tensor_bytes(&m->final_norm);
    if (!m->cfg.tie_word_embeddings) total += tensor_bytes(&m->lm_head);
    for (int i = 0; i < m->cfg.n_layers; i++) total += layer_bytes(&m->layers[i], &m->cfg, true);
    m->weight_bytes = total;
    if ((rc = pack_matrices(m, err, errlen))) {
        model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void model_destroy(struct model *m)
{
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->cfg.n_layers; i++) free(m->layers[i].experts);
    free(m->layers);
    if (m->packed) munmap(m->packed, m->packed_bytes);
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
