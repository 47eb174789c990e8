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
    enum quant_format want;       // projections quantized at load to this (QUANT_NONE: none)
    size_t bound;          // tensors bound so far (distinct)
    bool have_dtype;       // the first bound tensor fixes the weights' dtype
    enum dtype dtype;
    const char *dtype_from; // the tensor that fixed it
    const int32_t *last_perm; // the act-order input order kept last (keep_perm), of
    int64_t last_perm_cols;   // this many inputs
    size_t perms_cap;         // m->perms' room
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

// The projections: what a quantized checkpoint stores quantized and
// --quantization quantizes. The router, norms, embeddings and lm_head stay.
static bool is_projection(enum weight_role r)
{
    return r == ROLE_QKV || r == ROLE_O || r == ROLE_EXPERT_IN || r == ROLE_EXPERT_DOWN ||
           r == ROLE_DENSE_IN || r == ROLE_DENSE_DOWN;
}

// A projection left as stored gets the format asked for at load.
static void mark_at_load(struct binder *b, struct tensor *out, enum weight_role role)
{
    if (b->want == QUANT_NONE || !is_projection(role) || out->quant.format != QUANT_NONE) return;
    // A dummy load of a quantized config takes the checkpoint's own groups.
    out->quant = (struct tensor_quant){.format = b->want, .source = QUANT_SRC_AT_LOAD,
                                       .group = quant_config_group(&b->m->cfg, b->want), .block_rows = 1};
}

static const struct st_tensor *find_part(const struct binder *b, const char *base, const char *part)
{
    char name[300];
    if (snprintf(name, sizeof name, "%s.%s", base, part) >= (int)sizeof name) return NULL;
    return safetensors_find(b->st, name);
}

// Checks that a quantized checkpoint's companion tensor has the dtype and
// shape its weight implies.
static int check_part(const struct st_tensor *t, const char *base, const char *part,
                      const char *dtype, int ndim, const int64_t *shape, const char *why,
                      char *err, size_t errlen)
{
    char want[128], got[128];
    shape_str(want, sizeof want, ndim, shape);
    if (!t)
        return ms_err(err, errlen, MS_ENOTFOUND, "the checkpoint has no tensor %s.%s, which its "
                      "quantized weight needs with shape %s (%s)", base, part, want, why);
    if (strcmp(t->dtype_str, dtype) != 0)
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.%s is %s; expected %s", base, part,
                      t->dtype_str, dtype);
    shape_str(got, sizeof got, t->ndim, t->shape);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.%s has shape %s, but its weight implies "
                      "%s (%s)", base, part, got, want, why);
    return 0;
}

// An FP8 weight (F8_E4M3, rows x cols) and its scales: weight_scale_inv
// blocks of weight_block_size, or one weight_scale for the tensor.
static int bind_fp8(struct binder *b, struct tensor *out, const struct st_tensor *t, const char *base,
                    int64_t rows, int64_t cols, char *err, size_t errlen)
{
    const struct quant_config *qc = &b->m->cfg.quant;
    // compressed-tensors names every strategy's scales weight_scale, and
    // has one a row (channel) beside blocks and one a tensor.
    const bool ct = qc->method == QUANT_METHOD_CT_FP8, blocks = qc->block_rows > 0 || qc->channel;
    const int br = qc->channel ? 1 : blocks ? qc->block_rows : (int)rows,
              bc = qc->channel ? (int)cols : blocks ? qc->block_cols : (int)cols;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    const char *part = blocks && !ct ? "weight_scale_inv" : "weight_scale";
    const struct st_tensor *s = find_part(b, base, part);
    char why[96];
    int rc;
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight has shape %s, but config.json "
                      "implies [%lld, %lld]", base, got, (long long)rows, (long long)cols);
    }
    if (qc->channel) snprintf(why, sizeof why, "strategy channel: one scale an output");
    else snprintf(why, sizeof why, "%s [%d, %d]", ct ? "block_structure" : "weight_block_size", br, bc);
    if (!s && !blocks && !ct) {
        // Per-tensor scales: say which config key is missing when block
        // scales are what the file holds.
        if (find_part(b, base, "weight_scale_inv"))
            return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight_scale_inv holds block scales, but "
                          "config.json's quantization_config has no weight_block_size: add it (FP8 "
                          "checkpoints such as Qwen's use [128, 128])", base);
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight_scale is missing: an FP8 checkpoint "
                      "without weight_block_size needs one scale per tensor", base);
    }
    if (!s) return check_part(s, base, part, "F32", 2, (const int64_t[]){sr, sc}, why, err, errlen);
    const char *sd = s->dtype_str;
    if (strcmp(sd, "F32") && strcmp(sd, "BF16") && strcmp(sd, "F16"))
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.%s is %s; FP8 scales must be F32, BF16 "
                      "or F16", base, part, sd);
    if (blocks) {
        if ((rc = check_part(s, base, part, sd, 2, (const int64_t[]){sr, sc}, why, err, errlen)))
            return rc;
    } else {
        // One value in any shape ([], [1], [1, 1]): the safetensors reader
        // has checked the bytes against the shape.
        const size_t esz = strcmp(sd, "F32") ? 2 : 4;
        if (s->nbytes != esz)
            return ms_err(err, errlen, MS_EFORMAT, "tensor %s.%s holds %zu values; a checkpoint "
                          "without weight_block_size has one scale per tensor", base, part, s->nbytes / esz);
    }
    out->data = t->data;
    out->quant = (struct tensor_quant){.format = QUANT_FP8, .source = QUANT_SRC_FP8, .group = bc,
                                       .block_rows = br, .scale = s->data, .scale_dtype = s->dtype};
    b->bound += 2;
    if (find_part(b, base, "input_scale")) b->bound++; // static activation scales: fp32 here anyway
    return 0;
}

// Keeps perm (cols entries, malloc'd) as the model's, or, where the last
// one kept is the same order, frees it and gives that one: the matrices
// bound one after another that read one input (an expert's gate and up; q,
// k and v) were quantized in one order, since act-order sorts by the
// input's statistics, and sharing it lets the matmul gather that input once.
static int keep_perm(struct binder *b, int32_t *perm, int64_t cols, const int32_t **out)
{
    struct model *m = b->m;
    if (b->last_perm && b->last_perm_cols == cols && !memcmp(b->last_perm, perm, (size_t)cols * sizeof *perm)) {
        free(perm);
        *out = b->last_perm;
        return 0;
    }
    if (m->n_perms == b->perms_cap) {
        // Doubling: a 30B model's experts keep about 12,000 orders.
        const size_t cap = b->perms_cap ? 2 * b->perms_cap : 64;
        int32_t **grown = realloc(m->perms, cap * sizeof *grown);
        if (!grown) {
            free(perm);
            return MS_ENOMEM;
        }
        m->perms = grown;
        b->perms_cap = cap;
    }
    m->perms[m->n_perms++] = perm;
    m->perm_bytes += (size_t)cols * sizeof *perm;
    b->last_perm = perm;
    b->last_perm_cols = cols;
    *out = perm;
    return 0;
}

// Input k's group by g_idx: -1 (compressed-tensors' unset, where
// bind_g_idx lets it through) is the place's own.
static int64_t g_idx_group(const int32_t *g, int64_t k, int G) { return g[k] == -1 ? k / G : g[k]; }

// A GPTQ g_idx or compressed-tensors weight_g_idx: each input's group. In
// the stored order (input k in group k / G) it says nothing; an act-order
// file's (GPTQ's desc_act, compressed-tensors' actorder group) puts the
// inputs in groups out of their order, G to a group as the quantizer took
// them (the last one shorter): *perm becomes the order that makes each
// group's inputs consecutive, the group's inputs ascending (what vLLM's
// GPTQ kernels sort g_idx into), or NULL for the stored order. Anything
// else — a group out of range, a group with more or fewer inputs than G —
// is no order a quantizer writes, and is refused. unset_ok: -1
// (compressed-tensors' unset) reads as the place's group. Missing is an
// error only where the config (setting) says the file has one.
static int bind_g_idx(struct binder *b, const char *base, const char *part, int64_t cols, int G,
                      bool expected, bool unset_ok, const char *setting, const int32_t **perm,
                      char *err, size_t errlen)
{
    *perm = NULL;
    const struct st_tensor *gi = find_part(b, base, part);
    if (!gi) {
        if (!expected) return 0;
        return ms_err(err, errlen, MS_EFORMAT, "quantization_config says %s but %s.%s, which says each "
                      "input's group, is missing", setting, base, part);
    }
    int rc = check_part(gi, base, part, "I32", 1, (const int64_t[]){cols}, "in_features", err, errlen);
    if (rc) return rc;
    b->bound++;
    const int32_t *g = gi->data;
    const int64_t ng = (cols + G - 1) / G;
    bool stored = true;
    for (int64_t k = 0; k < cols; k++) {
        const int64_t want = k / G;
        if (g[k] == want || (unset_ok && g[k] == -1)) continue;
        if (g[k] < 0 || g[k] >= ng)
            return ms_err(err, errlen, MS_EFORMAT, "%s.%s[%lld] is %d, but group_size %d over %lld inputs "
                          "makes groups 0 to %lld", base, part, (long long)k, (int)g[k], G, (long long)cols,
                          (long long)(ng - 1));
        stored = false;
    }
    if (stored) return 0;
    // A counting sort by group: start[g] is where group g's inputs begin.
    int64_t *start = calloc((size_t)ng + 1, sizeof *start);
    int32_t *p = malloc((size_t)cols * sizeof *p);
    if (!start || !p) {
        free(start);
        free(p);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory for %s.%s's input order", base, part);
    }
    for (int64_t k = 0; k < cols; k++) start[g_idx_group(g, k, G) + 1]++;
    for (int64_t i = 0; i < ng; i++) {
        const int64_t size = i + 1 < ng ? G : cols - i * G;
        if (start[i + 1] != size) {
            const long long n = (long long)start[i + 1];
            free(start);
            free(p);
            return ms_err(err, errlen, MS_EFORMAT, "%s.%s puts %lld inputs in group %lld, but group_size %d "
                          "over %lld inputs gives that group %lld (an act-order quantizer fills every "
                          "group)", base, part, n, (long long)i, G, (long long)cols, (long long)size);
        }
        start[i + 1] += start[i];
    }
    for (int64_t k = 0; k < cols; k++) p[start[g_idx_group(g, k, G)]++] = (int32_t)k;
    free(start);
    if ((rc = keep_perm(b, p, cols, perm)))
        return ms_err(err, errlen, rc, "out of memory for %s.%s's input order", base, part);
    return 0;
}

// A 4-bit GPTQ projection: qweight, qzeros, scales and g_idx, checked
// against each other and the config's group size.
static int bind_gptq(struct binder *b, struct tensor *out, const struct st_tensor *qw, const char *base,
                     int64_t rows, int64_t cols, char *err, size_t errlen)
{
    const struct quant_config *qc = &b->m->cfg.quant;
    const int G = qc->group > 0 ? qc->group : (int)cols;
    if (cols % 8 || rows % 8)
        return ms_err(err, errlen, MS_EFORMAT, "%s is (%lld, %lld): 4-bit GPTQ packs 8 values per "
                      "int32 along both dimensions, which must be multiples of 8", base,
                      (long long)rows, (long long)cols);
    const int64_t ng = (cols + G - 1) / G;
    char why[96];
    snprintf(why, sizeof why, "group_size %d over %lld inputs", G, (long long)cols);
    int rc;
    if ((rc = check_part(qw, base, "qweight", "I32", 2, (const int64_t[]){cols / 8, rows},
                         "in_features / 8, out_features", err, errlen)) ||
        (rc = check_part(find_part(b, base, "qzeros"), base, "qzeros", "I32", 2,
                         (const int64_t[]){ng, rows / 8}, why, err, errlen)) ||
        (rc = check_part(find_part(b, base, "scales"), base, "scales", "F16", 2,
                         (const int64_t[]){ng, rows}, why, err, errlen)))
        return rc;
    const int32_t *perm;
    if ((rc = bind_g_idx(b, base, "g_idx", cols, G, qc->desc_act, false, "desc_act true", &perm, err, errlen)))
        return rc;
    out->data = qw->data;
    out->quant = (struct tensor_quant){.format = QUANT_INT4, .source = QUANT_SRC_GPTQ, .group = G,
                                       .block_rows = 1,
                                       .scale = find_part(b, base, "scales")->data,
                                       .scale_dtype = DTYPE_F16,
                                       .zeros = find_part(b, base, "qzeros")->data,
                                       .zero_offset = qc->zero_offset, .sym = qc->sym, .perm = perm};
    b->bound += 3;
    return 0;
}

// A 4-bit AWQ projection (AutoAWQ's GEMM layout): qweight and qzeros hold
// 8 outputs of one input a dword, scales F16 (or BF16) by group and output.
static int bind_awq(struct binder *b, struct tensor *out, const struct st_tensor *qw, const char *base,
                    int64_t rows, int64_t cols, char *err, size_t errlen)
{
    const struct quant_config *qc = &b->m->cfg.quant;
    const int G = qc->group > 0 ? qc->group : (int)cols;
    if (rows % 8)
        return ms_err(err, errlen, MS_EFORMAT, "%s has %lld outputs: 4-bit AWQ packs 8 outputs per "
                      "int32, so they must be a multiple of 8", base, (long long)rows);
    const int64_t ng = (cols + G - 1) / G;
    char why[96];
    snprintf(why, sizeof why, "group_size %d over %lld inputs", G, (long long)cols);
    const struct st_tensor *sc = find_part(b, base, "scales");
    const char *sd = sc && !strcmp(sc->dtype_str, "BF16") ? "BF16" : "F16";
    int rc;
    if ((rc = check_part(qw, base, "qweight", "I32", 2, (const int64_t[]){cols, rows / 8},
                         "in_features, out_features / 8", err, errlen)) ||
        (rc = check_part(find_part(b, base, "qzeros"), base, "qzeros", "I32", 2,
                         (const int64_t[]){ng, rows / 8}, why, err, errlen)) ||
        (rc = check_part(sc, base, "scales", sd, 2, (const int64_t[]){ng, rows}, why, err, errlen)))
        return rc;
    out->data = qw->data;
    out->quant = (struct tensor_quant){.format = QUANT_INT4, .source = QUANT_SRC_AWQ, .group = G,
                                       .block_rows = 1, .scale = sc->data, .scale_dtype = sc->dtype,
                                       .zeros = find_part(b, base, "qzeros")->data};
    b->bound += 3;
    return 0;
}

// A compressed-tensors pack-quantized projection (int4 or int8 values
// packed into int32 along the inputs, stored plus 2^(bits-1)): weight_packed,
// weight_scale and weight_shape, and where the config says so
// weight_zero_point (int4 asymmetric) and weight_g_idx (actorder group).
static int bind_ct_int(struct binder *b, struct tensor *out, const struct st_tensor *wp, const char *base,
                       int64_t rows, int64_t cols, char *err, size_t errlen)
{
    const struct quant_config *qc = &b->m->cfg.quant;
    const int G = qc->group > 0 ? qc->group : (int)cols, per = 32 / qc->bits;
    const int64_t ng = (cols + G - 1) / G;
    char why[96];
    if (qc->group > 0) snprintf(why, sizeof why, "group_size %d over %lld inputs", G, (long long)cols);
    else snprintf(why, sizeof why, "strategy channel: one scale an output");
    const struct st_tensor *sc = find_part(b, base, "weight_scale"), *shp = find_part(b, base, "weight_shape");
    const char *sd = sc && (!strcmp(sc->dtype_str, "BF16") || !strcmp(sc->dtype_str, "F32")) ? sc->dtype_str : "F16";
    int rc;
    if ((rc = check_part(wp, base, "weight_packed", "I32", 2, (const int64_t[]){rows, (cols + per - 1) / per},
                         qc->bits == 4 ? "out_features, in_features / 8" : "out_features, in_features / 4",
                         err, errlen)) ||
        (rc = check_part(sc, base, "weight_scale", sd, 2, (const int64_t[]){rows, ng}, why, err, errlen)))
        return rc;
    // weight_shape says the unpacked shape: the config's, or the file is
    // another model's (it is [out, in] as int64; int32 in some writers).
    if (!shp)
        return ms_err(err, errlen, MS_ENOTFOUND, "the checkpoint has no tensor %s.weight_shape, which its "
                      "packed weight needs", base);
    int64_t got[2] = {0, 0};
    if (!strcmp(shp->dtype_str, "I64") && shp->nbytes == 16) {
        memcpy(got, shp->data, 16);
    } else if (!strcmp(shp->dtype_str, "I32") && shp->nbytes == 8) {
        int32_t g32[2];
        memcpy(g32, shp->data, 8);
        got[0] = g32[0];
        got[1] = g32[1];
    } else {
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight_shape is %s of %zu bytes; expected two "
                      "I64 (or I32) values", base, shp->dtype_str, shp->nbytes);
    }
    if (got[0] != rows || got[1] != cols)
        return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight_shape says [%lld, %lld], but config.json "
                      "implies [%lld, %lld]", base, (long long)got[0], (long long)got[1], (long long)rows,
                      (long long)cols);
    const struct st_tensor *zp = find_part(b, base, "weight_zero_point");
    bool zeros_i8 = false;
    if (!qc->sym) {
        // Packed along the outputs since compressed-tensors 0.10, I8 a value before.
        zeros_i8 = zp && !strcmp(zp->dtype_str, "I8");
        if ((rc = zeros_i8 ? check_part(zp, base, "weight_zero_point", "I8", 2, (const int64_t[]){rows, ng}, why,
                                        err, errlen)
                           : check_part(zp, base, "weight_zero_point", "I32", 2,
                                        (const int64_t[]){(rows + 7) / 8, ng}, why, err, errlen)))
            return rc;
        if (zeros_i8) {
            const int8_t *z = zp->data;
            for (int64_t i = 0; i < rows * ng; i++)
                if (z[i] < -8 || z[i] > 7)
                    return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight_zero_point holds %d; an int4 "
                                  "zero point is -8 to 7", base, z[i]);
        }
        b->bound++;
    } else if (zp) {
        // Files older than compressed-tensors' _skip_zp stored symmetric
        // zero points too: I8 zeros, which say the same as none.
        bool zeros = !strcmp(zp->dtype_str, "I8") && zp->nbytes == (size_t)(rows * ng);
        for (size_t i = 0; zeros && i < zp->nbytes; i++) zeros = ((const int8_t *)zp->data)[i] == 0;
        if (!zeros)
            return ms_err(err, errlen, MS_EFORMAT, "tensor %s.weight_zero_point is there, but the config says "
                          "symmetric (only an older file's I8 zeros go with that): which one is right is "
                          "unclear", base);
        b->bound++;
    }
    const int32_t *perm;
    if ((rc = bind_g_idx(b, base, "weight_g_idx", cols, G, qc->desc_act, true, "actorder group", &perm, err,
                         errlen)))
        return rc;
    out->data = wp->data;
    out->quant = (struct tensor_quant){.format = qc->bits == 4 ? QUANT_INT4 : QUANT_INT8, .source = QUANT_SRC_CT,
                                       .group = G, .block_rows = 1, .scale = sc->data, .scale_dtype = sc->dtype,
                                       .zeros = qc->sym ? NULL : zp->data, .zeros_i8 = zeros_i8,
                                       .sym = qc->sym, .perm = perm};
    b->bound += 3;
    return 0;
}

// A matrix the checkpoint may hold quantized, as config.json's
// quantization_config says. Returns 1 when it bound one, 0 when the tensor
// is stored plain, or an error.
static int bind_quantized(struct binder *b, struct tensor *out, enum weight_role role,
                          const char *name, const int64_t *shape, char *err, size_t errlen)
{
    const enum quant_method method = b->m->cfg.quant.method;
    char base[256];
    const size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 7, ".weight") != 0 || n - 7 >= sizeof base) return 0;
    memcpy(base, name, n - 7);
    base[n - 7] = 0;
    const struct st_tensor *t = safetensors_find(b->st, name);
    const struct st_tensor *qw =
        (method == QUANT_METHOD_GPTQ || method == QUANT_METHOD_AWQ) && !t   ? find_part(b, base, "qweight")
        : method == QUANT_METHOD_CT_INT && !t                                ? find_part(b, base, "weight_packed")
                                                                             : NULL;
    const bool fp8 = (method == QUANT_METHOD_FP8 || method == QUANT_METHOD_CT_FP8) && t &&
                     !strcmp(t->dtype_str, "F8_E4M3");
    if (!fp8 && !qw) return 0;
    if (role == ROLE_EMBED)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "the embedding %s is stored quantized; moeserve "
                      "reads rows of it and needs it as BF16, F16 or F32", base);
    memset(out, 0, sizeof *out);
    out->ndim = 2;
    out->shape[0] = shape[0];
    out->shape[1] = shape[1];
    out->dtype = DTYPE_BF16;
    int rc = fp8                          ? bind_fp8(b, out, t, base, shape[0], shape[1], err, errlen)
             : method == QUANT_METHOD_AWQ ? bind_awq(b, out, qw, base, shape[0], shape[1], err, errlen)
             : method == QUANT_METHOD_CT_INT ? bind_ct_int(b, out, qw, base, shape[0], shape[1], err, errlen)
                                          : bind_gptq(b, out, qw, base, shape[0], shape[1], err, errlen);
    if (rc) return rc;
    if (b->m->quant == QUANT_NONE) b->m->quant = out->quant.format;
    return 1;
}

// Binds tensor `name` of the given shape into *out. why names the config
// fields the shape comes from, so that a mismatch says what to fix; role
// and ffn say how a dummy load draws it and whether it is a projection.
static int bind(struct binder *b, struct tensor *out, enum weight_role role, int ffn,
                const char *why, int ndim, const int64_t *shape, char *err, size_t errlen,
                const char *fmt, ...)
{
    if (!b->st) {
        bind_dummy(b, out, role, ffn, ndim, shape);
        mark_at_load(b, out, role);
        return 0;
    }
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (ndim == 2 && b->m->cfg.quant.method != QUANT_METHOD_NONE) {
        const int rc = bind_quantized(b, out, role, name, shape, err, errlen);
        if (rc < 0) return rc;
        if (rc == 1) return 0;
    }
    char want[128], got[128];
    shape_str(want, sizeof want, ndim, shape);
    const struct st_tensor *t = safetensors_find(b->st, name);
    if (!t) {
        // GPTQ tensors where config.json says nothing of them: older tools
        // wrote quantize_config.json beside it, which transformers does not
        // read either.
        char qname[270];
        const size_t nl = strlen(name);
        if (b->m->cfg.quant.method == QUANT_METHOD_NONE && nl > 7 && !strcmp(name + nl - 7, ".weight") &&
            snprintf(qname, sizeof qname, "%.*s.qweight", (int)(nl - 7), name) < (int)sizeof qname &&
            safetensors_find(b->st, qname))
            return ms_err(err, errlen, MS_EUNSUPPORTED,
                          "the checkpoint holds %s, a GPTQ tensor, but config.json has no "
                          "quantization_config to say how to read it (a quantize_config.json beside "
                          "it is not read): put its settings in config.json as quantization_config "
                          "with \"quant_method\": \"gptq\"", qname);
        return ms_err(err, errlen, MS_ENOTFOUND,
                      "the checkpoint has no tensor %s, which config.json implies with shape %s "
                      "(%s)", name, want, why);
    }
    if (!t->supported)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "tensor %s is stored as %s; moeserve computes with BF16, F16 or F32 weights%s",
                      name, t->dtype_str,
                      b->m->cfg.quant.method == QUANT_METHOD_NONE
                          ? " (config.json has no quantization_config saying how to read it)" : "");
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
    mark_at_load(b, out, role);
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

size_t tensor_bytes(const struct tensor *t)
{
    if (t->quant.format != QUANT_NONE && t->ndim == 2)
        return (size_t)quant_matrix_bytes((uint64_t)t->shape[0], (uint64_t)t->shape[1],
                                          t->quant.format, t->quant.group);
    return tensor_elems(t) * dtype_size(t->dtype);
}

// An act-order down projection reads the MLP's intermediate activations
// in its own order. Its gate's and up's outputs put in that order (their
// rows permuted, row_perm) make silu(gate x) * (up x) come out in it, so
// down reads its input as it is: one gather an expert fewer per step.
// Where gate or up is held plain (packed as stored), down keeps its order
// and the matmul gathers.
static void fold_down_order(struct tensor *gate, struct tensor *up, struct tensor *down)
{
    if (!down->quant.perm || gate->quant.format == QUANT_NONE || up->quant.format == QUANT_NONE) return;
    gate->quant.row_perm = up->quant.row_perm = down->quant.perm;
    down->quant.perm_folded = true;
}

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
        fold_down_order(&L->gate, &L->up, &L->down);
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
        fold_down_order(&x->gate, &x->up, &x->down);
    }
    return 0;
}

// One layer's bytes with `experts` of its experts (a MoE layer).
static size_t layer_bytes(const struct layer_weights *L, int experts)
{
    size_t n = tensor_bytes(&L->attn_norm) + tensor_bytes(&L->wq) + tensor_bytes(&L->wk) +
               tensor_bytes(&L->wv) + tensor_bytes(&L->wo) + tensor_bytes(&L->q_norm) +
               tensor_bytes(&L->k_norm) + tensor_bytes(&L->ffn_norm);
    if (!L->is_moe) return n + tensor_bytes(&L->gate) + tensor_bytes(&L->up) +
                           tensor_bytes(&L->down);
    n += tensor_bytes(&L->router);
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
    for (int i = 0; i < m->cfg.n_layers; i++) total += layer_bytes(&m->layers[i], m->cfg.n_experts);
    return total;
}

// quantization_config's quant_method as the file spells it ("none" without one).
static const char *method_name(enum quant_method m)
{
    switch (m) {
    case QUANT_METHOD_NONE: return "none";
    case QUANT_METHOD_FP8: return "fp8";
    case QUANT_METHOD_GPTQ: return "gptq";
    case QUANT_METHOD_AWQ: return "awq";
    case QUANT_METHOD_CT_INT:
    case QUANT_METHOD_CT_FP8: return "compressed-tensors";
    }
    return "?";
}

// The format asked for against the one the checkpoint has: the same, or
// nothing asked, or a bf16/f16/f32 checkpoint to quantize.
static int resolve_quant(struct model *m, const struct model_load_opts *o, enum quant_format *want,
                         char *err, size_t errlen)
{
    const enum quant_method qm = m->cfg.quant.method;
    const enum quant_format has = quant_config_format(&m->cfg);
    *want = o->quantization;
    const bool ct = qm == QUANT_METHOD_CT_INT || qm == QUANT_METHOD_CT_FP8;
    if (o->method != QUANT_METHOD_NONE && !(o->method == qm || (o->method == QUANT_METHOD_CT_INT && ct)))
        return ms_err(err, errlen, MS_EINVAL, "--quantization %s names the checkpoint's method, but %s's "
                      "quantization_config says %s%s: drop the flag (the checkpoint's own is read as it is)",
                      method_name(o->method), m->dir, method_name(qm),
                      qm == QUANT_METHOD_NONE ? " (a bf16 checkpoint: --quantization fp8, int8 or int4 "
                                                "quantizes it at load)" : "");
    if (has != QUANT_NONE && *want != QUANT_NONE && *want != has)
        return ms_err(err, errlen, MS_EINVAL, "%s is %s checkpoint (%s weights); --quantization %s "
                      "asks for %s: drop the flag, or start from a bf16 checkpoint", m->dir,
                      qm == QUANT_METHOD_FP8 ? "an FP8" : qm == QUANT_METHOD_AWQ ? "an AWQ"
                      : qm == QUANT_METHOD_GPTQ ? "a GPTQ" : "a compressed-tensors", quant_format_name(has),
                      quant_format_name(*want), quant_format_name(*want));
    // A dummy load makes a quantized config's format itself; a real one
    // reads it from the tensors.
    if (*want == QUANT_NONE && o->format == LOAD_FORMAT_DUMMY) *want = has;
    if (o->format == LOAD_FORMAT_AUTO && has != QUANT_NONE) *want = QUANT_NONE;
    return 0;
}

// Extras are usually harmless (a tied lm_head stored anyway, rotary
// buffers), but a bias we would ignore changes the result: say so.
static void warn_unused(const struct model *m, const struct safetensors *st, size_t bound)
{
    size_t extra = safetensors_count(st) - bound;
    if (m->cfg.tie_word_embeddings && safetensors_find(st, "lm_head.weight")) extra--;
    if (extra == 0) return;
    const char *example = NULL;
    for (size_t i = 0; i < safetensors_count(st) && !example; i++) {
        const char *n = safetensors_get(st, i)->name;
        if (strstr(n, ".bias")) example = n;
    }
    ms_log(MS_LOG_WARN, "%s: %zu tensors in the checkpoint are not used by this config%s%s",
           m->dir, extra, example ? ", for example " : "", example ? example : "");
}

int model_load_opts(const char *dir, const struct model_load_opts *o, struct model **out,
                    char *err, size_t errlen)
{
    struct model *m;
    int rc = model_begin(dir, &m, err, errlen);
    if (rc) return rc;
    m->seed = o->seed;
    if (o->cache_dir && snprintf(m->cache_dir, sizeof m->cache_dir, "%s", o->cache_dir) >=
                            (int)sizeof m->cache_dir) {
        free(m);
        return ms_err(err, errlen, MS_EINVAL, "--cache-dir %s is too long", o->cache_dir);
    }
    enum quant_format want;
    if ((rc = resolve_quant(m, o, &want, err, errlen))) {
        free(m);
        return rc;
    }
    struct binder b = {.m = m, .want = want};
    if (o->format == LOAD_FORMAT_DUMMY) {
        // The checkpoint's dtype when the backends compute with it, else bf16.
        const enum dtype t = m->cfg.torch_dtype;
        b.seed = o->seed;
        b.dummy_dtype = t == DTYPE_F16 || t == DTYPE_F32 ? t : DTYPE_BF16;
        m->dummy = true;
    } else {
        struct safetensors *st = NULL;
        if ((rc = safetensors_open_dir(dir, &st, err, errlen))) {
            free(m);
            return rc;
        }
        m->storage = st;
        b.st = st;
    }
    char sub[1024];
    if ((rc = bind_all(&b, sub, sizeof sub))) {
        ms_err(err, errlen, rc, "%s: %s", dir, sub);
        model_destroy(m);
        return rc;
    }
    if (m->dummy) {
        m->cfg.torch_dtype = b.dummy_dtype;
    } else {
        if (b.dtype != m->cfg.torch_dtype) {
            ms_log(MS_LOG_WARN, "%s: config.json declares torch_dtype %s but the weights are %s; "
                   "using %s", dir, dtype_name(m->cfg.torch_dtype), dtype_name(b.dtype),
                   dtype_name(b.dtype));
            m->cfg.torch_dtype = b.dtype;
        }
        warn_unused(m, b.st, b.bound);
        if (m->cfg.quant.method != QUANT_METHOD_NONE && m->quant == QUANT_NONE)
            ms_log(MS_LOG_WARN, "%s: config.json has a quantization_config, but no projection is "
                   "stored quantized", dir);
    }
    if (want != QUANT_NONE) m->quant = want;
    m->weight_bytes = model_total_bytes(m) + m->perm_bytes;
    *out = m;
    return 0;
}

int model_load(const char *dir, struct model **out, char *err, size_t errlen)
{
    const struct model_load_opts o = {.format = LOAD_FORMAT_AUTO};
    return model_load_opts(dir, &o, out, err, errlen);
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
    const struct model_load_opts o = {.format = f, .seed = seed};
    return model_load_opts(dir, &o, out, err, errlen);
}

void model_destroy(struct model *m)
{
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->cfg.n_layers; i++) free(m->layers[i].experts);
    free(m->layers);
    for (size_t i = 0; i < m->n_perms; i++) free(m->perms[i]);
    free(m->perms);
    safetensors_close(m->storage);
    free(m);
}

size_t model_active_bytes(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    size_t n = tensor_bytes(&m->final_norm) + tensor_bytes(&m->lm_head) +
               (size_t)c->hidden_size * dtype_size(m->embed.dtype);
    for (int i = 0; i < c->n_layers; i++) n += layer_bytes(&m->layers[i], c->n_experts_per_tok);
    return n;
}

size_t model_rank_weight_bytes(const struct model *m, int expert_begin, int expert_end)
{
    const struct model_config *c = &m->cfg;
    size_t n = tensor_bytes(&m->embed) + tensor_bytes(&m->final_norm);
    if (!c->tie_word_embeddings) n += tensor_bytes(&m->lm_head);
    const int experts = expert_end > expert_begin ? expert_end - expert_begin : 0;
    for (int i = 0; i < c->n_layers; i++) n += layer_bytes(&m->layers[i], experts);
    return n;
}
