// backend: what every backend shares — the failure sentence and the KV
// pool's arithmetic and checks (the bytes come from the backend's kv_alloc).
#include "model/backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

int backend_fail(struct backend *b, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
    return code;
}

static bool kv_dtype_ok(enum dtype t) { return t == DTYPE_BF16 || t == DTYPE_F16 || t == DTYPE_F32; }

// Elements of K (or V) in one layer of one block, over all KV heads.
static bool kv_block_elems(const struct model_config *cfg, size_t *out)
{
    return !ms_mul_overflow((size_t)cfg->n_kv_heads, (size_t)KV_BLOCK_TOKENS, out) &&
           !ms_mul_overflow(*out, (size_t)cfg->head_dim, out);
}

size_t kv_block_bytes(const struct model_config *cfg, enum dtype dtype)
{
    size_t n;
    if (!kv_block_elems(cfg, &n) || ms_mul_overflow(n, (size_t)cfg->n_layers, &n) ||
        ms_mul_overflow(n, 2 * dtype_size(dtype), &n))
        return 0;
    return n;
}

int kv_pool_create(struct backend *b, const struct model_config *cfg, enum dtype dtype,
                   int n_blocks, struct kv_pool **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!kv_dtype_ok(dtype))
        return ms_err(err, errlen, MS_EINVAL, "the KV cache dtype must be bfloat16, float16 or "
                      "float32, not %s", dtype_name(dtype));
    if (n_blocks < 1)
        return ms_err(err, errlen, MS_EINVAL, "a KV pool needs at least one block of %d tokens, "
                      "not %d blocks", KV_BLOCK_TOKENS, n_blocks);
    size_t per_layer_block, layer, bytes;
    if (!kv_block_elems(cfg, &per_layer_block) ||
        ms_mul_overflow(per_layer_block, (size_t)n_blocks + 1, &layer) || // + the scratch block
        ms_mul_overflow(layer, (size_t)cfg->n_layers, &bytes) ||
        ms_mul_overflow(bytes, dtype_size(dtype), &bytes))
        return ms_err(err, errlen, MS_ENOFIT, "a KV pool of %d blocks overflows the address space",
                      n_blocks);
    struct kv_pool *kv = calloc(1, sizeof *kv);
    if (!kv) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the KV pool");
    kv->dtype = dtype;
    kv->n_blocks = n_blocks;
    kv->n_layers = cfg->n_layers;
    kv->n_kv_heads = cfg->n_kv_heads;
    kv->head_dim = cfg->head_dim;
    kv->block_bytes = kv_block_bytes(cfg, dtype);
    kv->layer_elems = layer;
    int rc = b->ops->kv_alloc(b, kv);
    if (rc) {
        free(kv);
        return ms_err(err, errlen, rc, "%s", b->err);
    }
    *out = kv;
    return 0;
}

int backend_prefault(struct backend *b, void *p, size_t bytes, const char *what, char *err,
                     size_t errlen)
{
    if (!b->ops->prefault) return 0;
    const int rc = b->ops->prefault(b, p, bytes);
    return rc ? ms_err(err, errlen, rc, "%s: %s", what, b->err) : 0;
}

int kv_pool_prefault(struct backend *b, struct kv_pool *kv, char *err, size_t errlen)
{
    int rc = backend_prefault(b, kv->k, kv_pool_bytes(kv), "the KV pool's keys", err, errlen);
    return rc ? rc : backend_prefault(b, kv->v, kv_pool_bytes(kv), "the KV pool's values", err, errlen);
}

void kv_pool_destroy(struct backend *b, struct kv_pool *kv)
{
    if (!kv) return;
    b->ops->kv_free(b, kv);
    free(kv);
}
