// config: parses config.json and generation_config.json into struct model_config,
// refusing with a named field and value every setting the forward pass does not implement.
#include "model/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "base/base.h"
#include "base/json.h"

// config.json of the largest real models is a few KiB; anything past this is not a config.
#define CONFIG_MAX_FILE_BYTES (16u << 20)
// Bounds that keep every size derived from the config far from overflow
// while admitting every real checkpoint (the largest have hidden 16384, vocab ~260k).
#define CONFIG_MAX_DIM (1 << 20)
#define CONFIG_MAX_HEADS 4096
#define CONFIG_MAX_EXPERTS 4096
#define CONFIG_MAX_VOCAB (1 << 24)

const char *dtype_name(enum dtype t)
{
    switch (t) {
    case DTYPE_BF16: return "BF16";
    case DTYPE_F16: return "F16";
    case DTYPE_F32: return "F32";
    }
    return "unknown";
}

size_t dtype_size(enum dtype t)
{
    switch (t) {
    case DTYPE_BF16: return 2;
    case DTYPE_F16: return 2;
    case DTYPE_F32: return 4;
    }
    return 0;
}

// A value as a refusal shows it: a string quoted (at most 60 bytes of it),
// anything else by its kind.
static const char *shown(const json_t *v, char *buf, size_t n)
{
    if (!json_is_string(v)) return json_kind(v);
    snprintf(buf, n, "\"%.60s\"", json_string_value(v));
    return buf;
}

// Reads an integer field in [lo, hi]. Absent or null leaves *out untouched
// unless required. Integral reals (4096.0) are accepted: some exporters write them.
static int get_int(const json_t *o, const char *file, const char *key, bool required,
                   long long lo, long long hi, int *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return ms_err(err, errlen, MS_EFORMAT, "%s has no %s, which the model needs", file, key);
        return 0;
    }
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v);
    } else {
        return ms_err(err, errlen, MS_EFORMAT, "%s field %s must be an integer, not %s", file,
                      key, json_kind(v));
    }
    if (x < lo || x > hi)
        return ms_err(err, errlen, MS_EFORMAT, "%s field %s is %lld, outside the range %lld..%lld",
                      file, key, x, lo, hi);
    *out = (int)x;
    return 0;
}

static int get_num(const json_t *o, const char *file, const char *key, bool *present,
                   double *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (present) *present = false;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return ms_err(err, errlen, MS_EFORMAT, "%s field %s must be a number, not %s", file, key,
                      json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x))
        return ms_err(err, errlen, MS_EFORMAT, "%s field %s is not finite", file, key);
    *out = x;
    if (present) *present = true;
    return 0;
}

static int get_bool(const json_t *o, const char *file, const char *key, bool *out, char *err,
                    size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return ms_err(err, errlen, MS_EFORMAT, "%s field %s must be true or false, not %s", file,
                      key, json_kind(v));
    *out = json_is_true(v);
    return 0;
}

// eos_token_id is an integer or a list of integers in both files.
static int get_eos(const json_t *o, const char *file, int *ids, int *n, bool *present,
                   char *err, size_t errlen)
{
    json_t *v = json_object_get(o, "eos_token_id");
    *present = false;
    if (!v || json_is_null(v)) return 0;
    int count = 0;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > CONFIG_MAX_VOCAB)
            return ms_err(err, errlen, MS_EFORMAT, "%s field eos_token_id is %lld, not a token id",
                          file, (long long)x);
        ids[count++] = (int)x;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        if (json_array_size(v) > CONFIG_MAX_EOS)
            return ms_err(err, errlen, MS_EFORMAT,
                          "%s field eos_token_id lists %zu ids; at most %d are supported", file,
                          json_array_size(v), CONFIG_MAX_EOS);
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > CONFIG_MAX_VOCAB)
                return ms_err(err, errlen, MS_EFORMAT,
                              "%s field eos_token_id[%zu] must be a non-negative token id",
                              file, i);
            ids[count++] = (int)json_integer_value(e);
        }
    } else {
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s field eos_token_id must be an integer or a list of integers, not %s",
                      file, json_kind(v));
    }
    *n = count;
    *present = true;
    return 0;
}

// Ids the vocabulary cannot produce would never match; dropping them keeps
// every consumer free to index vocab-sized arrays by eos id.
static int keep_in_vocab(const char *file, const int *ids, int n, int vocab, int *out)
{
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < vocab) out[kept++] = ids[i];
        else
            ms_log(MS_LOG_INFO, "%s: eos_token_id %d is outside the vocabulary (%d ids); "
                   "ignoring it", file, ids[i], vocab);
    }
    return kept;
}

static int parse_dtype_name(const char *s, enum dtype *out)
{
    if (!strcmp(s, "bfloat16")) *out = DTYPE_BF16;
    else if (!strcmp(s, "float16") || !strcmp(s, "half")) *out = DTYPE_F16;
    else if (!strcmp(s, "float32") || !strcmp(s, "float")) *out = DTYPE_F32;
    else return -1;
    return 0;
}

// A rotation over only part of each head (transformers builds a shorter
// one; we rotate the whole head_dim): 1 or absent only.
static int check_partial_rotary(const json_t *obj, const char *where, char *err, size_t errlen)
{
    bool has;
    double f = 1.0;
    int rc = get_num(obj, "config.json", "partial_rotary_factor", &has, &f, err, errlen);
    if (rc || !has || f == 1.0) return rc;
    return ms_err(err, errlen, MS_EUNSUPPORTED, "config.json field %spartial_rotary_factor is %g; "
                  "moeserve rotates the whole head_dim", where, f);
}

// rope_scaling (and rope_parameters, its successor in newer transformers)
// must be absent, null or of type "default": we implement plain RoPE only.
// transformers 5 may key rope_parameters by layer type ({"full_attention":
// {...}}): every layer here is full attention, so that entry is the one.
// *theta_given: a rope_theta was read so far (the top level's, or an
// earlier key's).
static int check_rope(const json_t *root, const char *key, struct model_config *cfg, bool *theta_given,
                      char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    char where[64];
    snprintf(where, sizeof where, "%s", key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json field %s is %s; only null or {\"rope_type\": \"default\"} is "
                      "supported", key, json_kind(v));
    json_t *by_type = json_object_get(v, "full_attention");
    if (json_is_object(by_type)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
            if (strcmp(k, "full_attention"))
                return ms_err(err, errlen, MS_EUNSUPPORTED, "config.json field %s is keyed by layer "
                              "type and has \"%.40s\"; moeserve runs full attention only", key, k);
        v = by_type;
        snprintf(where, sizeof where, "%s.full_attention", key);
    }
    json_t *rt = json_object_get(v, "rope_type"), *ty = json_object_get(v, "type");
    if ((rt && !json_is_null(rt) && !json_is_string(rt)) || (ty && !json_is_null(ty) && !json_is_string(ty)))
        return ms_err(err, errlen, MS_EFORMAT, "config.json field %s.rope_type must be a string", where);
    // transformers 4 copies "type" over "rope_type"; a file where they differ says two things.
    if (json_is_string(rt) && json_is_string(ty) && strcmp(json_string_value(rt), json_string_value(ty)))
        return ms_err(err, errlen, MS_EFORMAT, "config.json field %s has rope_type \"%.40s\" but type "
                      "\"%.40s\"; which RoPE the model was trained with is unclear", where,
                      json_string_value(rt), json_string_value(ty));
    json_t *t = json_is_string(rt) ? rt : json_is_string(ty) ? ty : NULL;
    const char *type = t ? json_string_value(t) : "default";
    if (strcmp(type, "default") != 0)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json field %s has rope_type \"%s\"; only plain RoPE (null or "
                      "\"default\") is supported", where, type);
    char pre[80];
    snprintf(pre, sizeof pre, "%s.", where);
    int rc = check_partial_rotary(v, pre, err, errlen);
    if (rc) return rc;
    bool has_theta;
    double theta = cfg->rope_theta;
    if ((rc = get_num(v, "config.json", "rope_theta", &has_theta, &theta, err, errlen))) return rc;
    // rope_parameters' own theta is the one (transformers 5 puts the top
    // level's in only where it has none). rope_scaling's: transformers 4
    // ignores it, 5 takes it: where it and the top level's differ, refused.
    if (has_theta && *theta_given && theta != cfg->rope_theta && !strcmp(key, "rope_scaling"))
        return ms_err(err, errlen, MS_EFORMAT, "config.json has rope_theta %g but %s.rope_theta %g; "
                      "which one the model was trained with is unclear", cfg->rope_theta, where, theta);
    if (has_theta) {
        cfg->rope_theta = theta;
        *theta_given = true;
    }
    return 0;
}

// quantization_config: FP8 block-wise (Qwen's FP8 releases; one scale per
// tensor when weight_block_size is absent) and 4-bit GPTQ. Whatever else a
// GPTQ's and AWQ's bits (4) and group_size (-1, one group a row: 0 here, or
// a positive multiple of 8).
static int int4_bits_and_group(const json_t *q, const char *F, const char *what, int *group_out, char *err,
                               size_t errlen)
{
    int bits = 0, group = 0, rc;
    if ((rc = get_int(q, F, "bits", true, 1, 64, &bits, err, errlen))) return rc;
    if (bits != 4)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field bits is %d; moeserve reads 4-bit %s "
                      "checkpoints only", F, bits, what);
    if ((rc = get_int(q, F, "group_size", true, -1, CONFIG_MAX_DIM, &group, err, errlen))) return rc;
    if (group == 0 || (group > 0 && group % 8))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field group_size is %d; expected -1 or a positive "
                      "multiple of 8", F, group);
    *group_out = group < 0 ? 0 : group;
    return 0;
}

// ---- compressed-tensors ------------------------------------------------------------
//
// llm-compressor's format (vLLM's "compressed-tensors"), as RedHatAI's
// FP8-dynamic and w4a16 checkpoints are published. Its config says, per
// group of modules, how weights and activations are quantized; moeserve
// reads checkpoints with one weight scheme for every quantized module: int4
// or int8 weights packed into int32 (pack-quantized; int4 symmetric or with
// zero points, int8 symmetric) by group or channel, or FP8 weights
// (float-quantized) by tensor, channel or block. Activations stay
// unquantized here, as for Qwen's own FP8 files: a dynamic activation
// scheme has nothing stored, a static one (an input_scale to apply) is
// refused. Which modules are quantized is read off the tensors (a
// weight_packed or an F8_E4M3 weight), not the config's targets and ignore.

struct ct_weights {
    int bits;
    bool is_float, sym, g_idx;
    int strategy; // 0 tensor, 1 channel, 2 group, 3 block
    int group, block_rows, block_cols;
};

static const char *const ct_strategies[] = {"tensor", "channel", "group", "block"};

// One group's "weights" QuantizationArgs (compressed-tensors' defaults for
// what is absent: 8 bits, int, symmetric, the strategy inferred from
// group_size). Long because each of its fields has a default, a check and
// a sentence for what moeserve does not compute.
static int ct_parse_weights(const json_t *w, const char *F, const char *g, struct ct_weights *a, char *err,
                            size_t errlen)
{
    char vb[64]; // shown()'s buffer
    char K[160];
    snprintf(K, sizeof K, "%s config_groups.%.40s.weights", F, g);
    if (!json_is_object(w))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s is %s; moeserve reads checkpoints whose "
                      "weights are quantized (an activation-only scheme has nothing to read)", K,
                      w ? json_kind(w) : "missing");
    memset(a, 0, sizeof *a);
    a->bits = 8;
    a->sym = true;
    int rc;
    if ((rc = get_int(w, K, "num_bits", false, 1, 64, &a->bits, err, errlen)) ||
        (rc = get_bool(w, K, "symmetric", &a->sym, err, errlen)))
        return rc;
    const json_t *t = json_object_get(w, "type");
    if (t && !json_is_null(t)) {
        if (!json_is_string(t) || (strcmp(json_string_value(t), "int") && strcmp(json_string_value(t), "float")))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field type is %s; expected \"int\" or "
                          "\"float\"", K, shown(t, vb, sizeof vb));
        a->is_float = !strcmp(json_string_value(t), "float");
    }
    const json_t *dyn = json_object_get(w, "dynamic");
    if (dyn && !json_is_null(dyn) && !json_is_false(dyn))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field dynamic is set: weights quantized at run "
                      "time have no scales in the file to read", K);
    int gs = 0;
    bool has_gs = json_object_get(w, "group_size") && !json_is_null(json_object_get(w, "group_size"));
    if ((rc = get_int(w, K, "group_size", false, -1, CONFIG_MAX_DIM, &gs, err, errlen))) return rc;
    const json_t *st = json_object_get(w, "strategy");
    if (st && !json_is_null(st)) {
        if (!json_is_string(st))
            return ms_err(err, errlen, MS_EFORMAT, "%s field strategy must be a string, not %s", K, json_kind(st));
        a->strategy = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(json_string_value(st), ct_strategies[i])) a->strategy = i;
        if (a->strategy < 0)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field strategy is \"%.40s\"; moeserve reads "
                          "tensor, channel, group and block weight scales", K, json_string_value(st));
    } else {
        a->strategy = !has_gs ? 0 : gs == -1 ? 1 : 2;
    }
    if (a->strategy == 2) {
        if (!has_gs || gs <= 0 || gs % 8)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has strategy group with group_size %d; "
                          "expected a positive multiple of 8", K, has_gs ? gs : 0);
        a->group = gs;
    }
    if (a->strategy == 3) {
        const json_t *bs = json_object_get(w, "block_structure");
        int v[2] = {0, 0};
        if (json_is_array(bs) && json_array_size(bs) == 2) {
            for (int i = 0; i < 2; i++) {
                const json_t *e = json_array_get(bs, (size_t)i);
                v[i] = json_is_integer(e) && json_integer_value(e) > 0 && json_integer_value(e) <= CONFIG_MAX_DIM
                           ? (int)json_integer_value(e) : 0;
            }
        } else if (json_is_string(bs)) {
            char x;
            if (sscanf(json_string_value(bs), "%d%c%d", &v[0], &x, &v[1]) != 3 || x != 'x') v[0] = 0;
        }
        if (v[0] <= 0 || v[1] <= 0 || v[0] > CONFIG_MAX_DIM || v[1] > CONFIG_MAX_DIM)
            return ms_err(err, errlen, MS_EFORMAT, "%s has strategy block but no block_structure of two "
                          "positive sizes", K);
        a->block_rows = v[0];
        a->block_cols = v[1];
    }
    const json_t *ao = json_object_get(w, "actorder");
    if (json_is_true(ao) ||
        (json_is_string(ao) && (!strcmp(json_string_value(ao), "group") || !strcmp(json_string_value(ao), "dynamic"))))
        a->g_idx = true;
    else if (ao && !json_is_null(ao) && !json_is_false(ao) &&
             !(json_is_string(ao) && (!strcmp(json_string_value(ao), "weight") || !strcmp(json_string_value(ao), "static"))))
        return ms_err(err, errlen, MS_EFORMAT, "%s field actorder must be null, \"group\" or \"weight\", not %s",
                      K, json_kind(ao));
    if (a->is_float) {
        if (a->bits != 8)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has %d-bit float weights; moeserve reads FP8 "
                          "(8-bit float, e4m3) compressed-tensors checkpoints", K, a->bits);
        if (!a->sym)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has asymmetric float weights; FP8 weights have "
                          "no zero points", K);
        if (a->strategy == 2)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has FP8 weights by group; moeserve reads them "
                          "by tensor, channel or block", K);
    } else {
        if (a->bits != 4 && a->bits != 8)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has %d-bit int weights; moeserve reads 4- and "
                          "8-bit ones", K, a->bits);
        if (a->strategy != 1 && a->strategy != 2)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has int weights by %s; moeserve reads them by "
                          "group or channel", K, ct_strategies[a->strategy]);
        if (a->bits == 8 && !a->sym)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has asymmetric int8 weights; moeserve reads "
                          "int8 weights symmetric, int4 ones either way", K);
    }
    return 0;
}

// A preset scheme's name as a group ("W4A16": ["Linear"]): its weights.
static bool ct_preset(const char *name, struct ct_weights *a)
{
    memset(a, 0, sizeof *a);
    a->sym = true;
    if (!strcmp(name, "W4A16") || !strcmp(name, "W4A16_ASYM")) {
        *a = (struct ct_weights){.bits = 4, .sym = !strcmp(name, "W4A16"), .strategy = 2, .group = 128};
    } else if (!strcmp(name, "W8A16")) {
        *a = (struct ct_weights){.bits = 8, .sym = true, .strategy = 1};
    } else if (!strcmp(name, "FP8_DYNAMIC")) {
        *a = (struct ct_weights){.bits = 8, .is_float = true, .sym = true, .strategy = 1};
    } else if (!strcmp(name, "FP8_BLOCK")) {
        *a = (struct ct_weights){.bits = 8, .is_float = true, .sym = true, .strategy = 3, .block_rows = 128,
                                 .block_cols = 128};
    } else {
        return false;
    }
    return true;
}

// The whole quantization_config: the top level's refusals, then every
// group's scheme (one for all), then the format that stores it.
static int parse_ct(const json_t *q, struct quant_config *out, char *err, size_t errlen)
{
    static const char *F = "config.json quantization_config";
    const json_t *fmt = json_object_get(q, "format");
    const char *format = json_is_string(fmt) ? json_string_value(fmt) : NULL;
    if (!format)
        return ms_err(err, errlen, MS_EFORMAT, "%s (compressed-tensors) has no format string, which says "
                      "how the weights are stored", F);
    const json_t *sp = json_object_get(q, "sparsity_config");
    if (sp && !json_is_null(sp) && !(json_is_object(sp) && !json_object_size(sp)))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has a sparsity_config: moeserve reads dense "
                      "compressed-tensors checkpoints only", F);
    const json_t *tc = json_object_get(q, "transform_config");
    if (tc && !json_is_null(tc) && !(json_is_object(tc) && !json_object_size(tc)))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has a transform_config (rotations applied to the "
                      "weights), which moeserve does not apply", F);
    const json_t *qs = json_object_get(q, "quantization_status");
    if (json_is_string(qs) && strcmp(json_string_value(qs), "compressed"))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field quantization_status is \"%.20s\"; moeserve "
                      "reads checkpoints saved \"compressed\"", F, json_string_value(qs));
    const json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || !json_object_size(groups))
        return ms_err(err, errlen, MS_EFORMAT, "%s (compressed-tensors) has no config_groups", F);
    struct ct_weights w = {0}, gw;
    const char *gname;
    json_t *g;
    bool first = true;
    const char *gfmt = format;
    json_object_foreach((json_t *)groups, gname, g) {
        int rc;
        if (json_is_array(g)) {
            if (!ct_preset(gname, &gw))
                return ms_err(err, errlen, MS_EUNSUPPORTED, "%s config_groups names the preset scheme "
                              "\"%.40s\"; moeserve reads W4A16, W4A16_ASYM, W8A16, FP8_DYNAMIC and FP8_BLOCK",
                              F, gname);
        } else if (!json_is_object(g)) {
            return ms_err(err, errlen, MS_EFORMAT, "%s config_groups.%.40s must be an object, not %s", F, gname,
                          json_kind(g));
        } else {
            if ((rc = ct_parse_weights(json_object_get(g, "weights"), F, gname, &gw, err, errlen))) return rc;
            const json_t *ia = json_object_get(g, "input_activations");
            if (ia && !json_is_null(ia)) {
                const json_t *d = json_object_get(ia, "dynamic");
                if (!json_is_object(ia) || !(json_is_true(d) || (json_is_string(d) && !strcmp(json_string_value(d), "local"))))
                    return ms_err(err, errlen, MS_EUNSUPPORTED, "%s config_groups.%.40s has static input "
                                  "activations (an input_scale to apply); moeserve computes activations "
                                  "unquantized and reads dynamic or weight-only schemes", F, gname);
            }
            const json_t *oa = json_object_get(g, "output_activations");
            if (oa && !json_is_null(oa))
                return ms_err(err, errlen, MS_EUNSUPPORTED, "%s config_groups.%.40s quantizes output "
                              "activations, which moeserve does not", F, gname);
            const json_t *gf = json_object_get(g, "format");
            if (json_is_string(gf)) gfmt = json_string_value(gf);
        }
        if (!first && (gw.bits != w.bits || gw.is_float != w.is_float || gw.sym != w.sym || gw.g_idx != w.g_idx ||
                       gw.strategy != w.strategy || gw.group != w.group || gw.block_rows != w.block_rows ||
                       gw.block_cols != w.block_cols))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s has config_groups with different weight "
                          "schemes; moeserve reads one scheme for every quantized module", F);
        w = gw;
        first = false;
    }
    if (!strcmp(gfmt, "mixed-precision"))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s format is \"mixed-precision\" without a format per "
                      "group", F);
    const bool packed = !strcmp(gfmt, "pack-quantized"),
               floated = !strcmp(gfmt, "float-quantized") || !strcmp(gfmt, "naive-quantized");
    if (w.is_float ? !floated : !packed)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s format is \"%.40s\" with %s weights; moeserve reads "
                      "pack-quantized int4 and int8 and float-quantized FP8 compressed-tensors checkpoints",
                      F, gfmt, w.is_float ? "float" : "int");
    if (w.is_float) {
        out->method = QUANT_METHOD_CT_FP8;
        out->channel = w.strategy == 1;
        out->block_rows = w.block_rows;
        out->block_cols = w.block_cols;
    } else {
        out->method = QUANT_METHOD_CT_INT;
        out->bits = w.bits;
        out->group = w.strategy == 2 ? w.group : 0;
        out->sym = w.sym;
        out->desc_act = w.g_idx;
    }
    return 0;
}

// file names is refused with the method in the sentence.
static int parse_quant(const json_t *q, struct quant_config *out, char *err, size_t errlen)
{
    char vb[64]; // shown()'s buffer
    static const char *F = "config.json quantization_config";
    memset(out, 0, sizeof *out);
    if (!q || json_is_null(q)) return 0;
    if (!json_is_object(q))
        return ms_err(err, errlen, MS_EFORMAT, "%s must be an object, not %s", F, json_kind(q));
    const json_t *qm = json_object_get(q, "quant_method");
    const char *method = json_is_string(qm) ? json_string_value(qm) : NULL;
    int rc;
    if (method && !strcmp(method, "fp8")) {
        out->method = QUANT_METHOD_FP8;
        const json_t *fmt = json_object_get(q, "fmt");
        if (fmt && !json_is_null(fmt) &&
            (!json_is_string(fmt) || strcmp(json_string_value(fmt), "e4m3") != 0))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field fmt is %s; moeserve reads "
                          "FP8 weights in e4m3 only", F, shown(fmt, vb, sizeof vb));
        // Static activations come with an input_scale a kernel must apply
        // to its activations (vLLM does); ours stay unquantized, so such a
        // file would compute something else than it was calibrated for.
        const json_t *as = json_object_get(q, "activation_scheme");
        if (as && !json_is_null(as) && (!json_is_string(as) || strcmp(json_string_value(as), "dynamic")))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field activation_scheme is %s; moeserve "
                          "reads \"dynamic\" FP8 checkpoints only (it computes activations unquantized "
                          "and has no use for an input_scale)", F, shown(as, vb, sizeof vb));
        const json_t *bs = json_object_get(q, "weight_block_size");
        if (bs && !json_is_null(bs)) {
            if (!json_is_array(bs) || json_array_size(bs) != 2)
                return ms_err(err, errlen, MS_EFORMAT, "%s field weight_block_size must be a list "
                              "of two integers", F);
            int v[2];
            for (int i = 0; i < 2; i++) {
                const json_t *e = json_array_get(bs, (size_t)i);
                if (!json_is_integer(e) || json_integer_value(e) < 1 ||
                    json_integer_value(e) > CONFIG_MAX_DIM)
                    return ms_err(err, errlen, MS_EFORMAT, "%s field weight_block_size[%d] must be "
                                  "an integer from 1 to %d", F, i, CONFIG_MAX_DIM);
                v[i] = (int)json_integer_value(e);
            }
            out->block_rows = v[0];
            out->block_cols = v[1];
        }
        return 0;
    }
    if (method && !strcmp(method, "gptq")) {
        out->method = QUANT_METHOD_GPTQ;
        out->sym = true;
        out->zero_offset = 1;
        if ((rc = int4_bits_and_group(q, F, "GPTQ", &out->group, err, errlen))) return rc;
        if ((rc = get_bool(q, F, "sym", &out->sym, err, errlen)) ||
            (rc = get_bool(q, F, "desc_act", &out->desc_act, err, errlen)))
            return rc;
        // The zero points' convention: AutoGPTQ 0.8 and GPTQModel write it as
        // "format", older files as "checkpoint_format" (GPTQModel now both).
        // v1 stores each zero minus one, v2 as it is: read wrong, every
        // weight is off by a step of its scale, with nothing to say so.
        const char *fmt = NULL;
        static const char *const fmt_keys[] = {"checkpoint_format", "format"};
        for (int i = 0; i < 2; i++) {
            const json_t *cf = json_object_get(q, fmt_keys[i]);
            if (!cf || json_is_null(cf)) continue;
            const char *s = json_is_string(cf) ? json_string_value(cf) : "";
            if (strcmp(s, "gptq_v2") && strcmp(s, "gptq"))
                return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field %s is \"%.40s\"; moeserve reads "
                              "\"gptq\" and \"gptq_v2\"", F, fmt_keys[i], s);
            if (fmt && strcmp(fmt, s))
                return ms_err(err, errlen, MS_EFORMAT, "%s says checkpoint_format \"%s\" but format "
                              "\"%s\"; which zero points the file holds is unclear", F, fmt, s);
            fmt = s;
        }
        if (fmt && !strcmp(fmt, "gptq_v2")) out->zero_offset = 0;
        const json_t *marlin = json_object_get(q, "is_marlin_format");
        if (json_is_true(marlin))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field is_marlin_format is true; moeserve "
                          "reads GPTQ's own layout (qweight, qzeros, scales), not Marlin's", F);
        const json_t *dyn = json_object_get(q, "dynamic");
        if (dyn && !json_is_null(dyn) && !(json_is_object(dyn) && !json_object_size(dyn)))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field dynamic sets per-module overrides; "
                          "moeserve reads one bits and group_size for every module", F);
        return 0;
    }
    if (method && !strcmp(method, "compressed-tensors")) return parse_ct(q, out, err, errlen);
    if (method && !strcmp(method, "awq")) {
        // AutoAWQ's (and llm-compressor's AWQ export's) GEMM layout, the one
        // vLLM's "awq" reads: zero points always stored, as they are.
        out->method = QUANT_METHOD_AWQ;
        if ((rc = int4_bits_and_group(q, F, "AWQ", &out->group, err, errlen))) return rc;
        bool zp = true;
        if ((rc = get_bool(q, F, "zero_point", &zp, err, errlen))) return rc;
        if (!zp)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field zero_point is false; moeserve "
                          "reads AWQ checkpoints with zero points (AutoAWQ's GEMM format stores "
                          "them always)", F);
        const json_t *v = json_object_get(q, "version");
        if (v && !json_is_null(v) && (!json_is_string(v) || strcasecmp(json_string_value(v), "gemm")))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s field version is %s; moeserve "
                          "reads AWQ's \"gemm\" layout (qweight of in_features x out_features / 8), "
                          "as vLLM's awq does", F, shown(v, vb, sizeof vb));
        const json_t *nc = json_object_get(q, "modules_to_not_convert");
        if (nc && !json_is_null(nc) && !json_is_array(nc))
            return ms_err(err, errlen, MS_EFORMAT, "%s field modules_to_not_convert must be a list "
                          "of module names or null, not %s", F, json_kind(nc));
        // Those modules are stored plain (a .weight, not a .qweight), which
        // is how every tensor is told apart anyway.
        out->sym = false;
        out->zero_offset = 0;
        return 0;
    }
    return ms_err(err, errlen, MS_EUNSUPPORTED,
                  "config.json has quantization_config (quant_method \"%s\"); moeserve reads "
                  "fp8 (block-wise e4m3), 4-bit gptq, 4-bit awq and compressed-tensors (int4, int8, "
                  "fp8) checkpoints, or quantizes bf16 ones at load with --quantization fp8|int8|int4",
                  method ? method : "?");
}

static int parse_root(json_t *root, struct model_config *cfg, char *err, size_t errlen)
{
    char vb[64]; // shown()'s buffer
    const char *F = "config.json";
    int rc;
    if (!json_is_object(root))
        return ms_err(err, errlen, MS_EFORMAT, "config.json must hold a JSON object, not %s",
                      json_kind(root));
    memset(cfg, 0, sizeof *cfg);

    // ---- architecture ----
    json_t *archs = json_object_get(root, "architectures");
    json_t *mt = json_object_get(root, "model_type");
    if (mt && !json_is_string(mt))
        return ms_err(err, errlen, MS_EFORMAT, "config.json field model_type must be a string");
    const char *model_type = mt ? json_string_value(mt) : NULL;
    const char *arch = NULL;
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || json_array_size(archs) != 1 ||
            !json_is_string(json_array_get(archs, 0)))
            return ms_err(err, errlen, MS_EUNSUPPORTED,
                          "config.json field architectures must list exactly one architecture "
                          "name (Qwen3MoeForCausalLM or Qwen3ForCausalLM)");
        arch = json_string_value(json_array_get(archs, 0));
    }
    if (arch) {
        if (!strcmp(arch, "Qwen3MoeForCausalLM")) cfg->arch = ARCH_QWEN3_MOE;
        else if (!strcmp(arch, "Qwen3ForCausalLM")) cfg->arch = ARCH_QWEN3;
        else
            return ms_err(err, errlen, MS_EUNSUPPORTED,
                          "config.json field architectures is [\"%s\"]; moeserve implements "
                          "Qwen3MoeForCausalLM and Qwen3ForCausalLM", arch);
    } else if (model_type && !strcmp(model_type, "qwen3_moe")) {
        cfg->arch = ARCH_QWEN3_MOE;
    } else if (model_type && !strcmp(model_type, "qwen3")) {
        cfg->arch = ARCH_QWEN3;
    } else {
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json names no supported architecture (architectures is absent and "
                      "model_type is \"%s\"); moeserve implements Qwen3MoeForCausalLM and "
                      "Qwen3ForCausalLM", model_type ? model_type : "(absent)");
    }
    const char *want_type = cfg->arch == ARCH_QWEN3_MOE ? "qwen3_moe" : "qwen3";
    if (model_type && strcmp(model_type, want_type) != 0)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json field model_type is \"%s\" but architectures says %s, whose "
                      "model_type is \"%s\"", model_type,
                      cfg->arch == ARCH_QWEN3_MOE ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM",
                      want_type);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", want_type);

    // ---- settings we do not implement ----
    // Early compressed-tensors files name it compression_config, which
    // transformers and vLLM read when quantization_config is absent.
    const json_t *qc = json_object_get(root, "quantization_config");
    if (!qc || json_is_null(qc)) qc = json_object_get(root, "compression_config");
    if ((rc = parse_quant(qc, &cfg->quant, err, errlen)))
        return rc;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act)) {
        if (!json_is_string(act))
            return ms_err(err, errlen, MS_EFORMAT, "config.json field hidden_act must be a string");
        // transformers' ACT2FN maps "swish" to the same SiLU.
        if (strcmp(json_string_value(act), "silu") && strcmp(json_string_value(act), "swish"))
            return ms_err(err, errlen, MS_EUNSUPPORTED,
                          "config.json field hidden_act is \"%s\"; only \"silu\" is supported",
                          json_string_value(act));
    }
    bool flag = false;
    if ((rc = get_bool(root, F, "attention_bias", &flag, err, errlen))) return rc;
    if (flag)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json field attention_bias is true; only attention without bias is "
                      "supported");
    flag = false;
    if ((rc = get_bool(root, F, "use_sliding_window", &flag, err, errlen))) return rc;
    if (flag)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json field use_sliding_window is true; only full attention is "
                      "supported");
    // transformers' per-layer attribute overrides: every layer here reads
    // the one set of values above.
    json_t *plc = json_object_get(root, "per_layer_config");
    if (plc && !json_is_null(plc) && !((json_is_object(plc) && !json_object_size(plc)) ||
                                      (json_is_array(plc) && !json_array_size(plc))))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "config.json field per_layer_config overrides "
                      "settings layer by layer; moeserve reads one value of each for every layer");
    json_t *lt = json_object_get(root, "layer_types");
    if (lt && json_is_array(lt)) {
        size_t i;
        json_t *e;
        json_array_foreach(lt, i, e) {
            if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention") != 0)
                return ms_err(err, errlen, MS_EUNSUPPORTED,
                              "config.json field layer_types[%zu] is %s; only "
                              "\"full_attention\" is supported", i,
                              shown(e, vb, sizeof vb));
        }
    }

    // ---- shapes ----
    if ((rc = get_int(root, F, "hidden_size", true, 1, CONFIG_MAX_DIM, &cfg->hidden_size, err,
                      errlen)))
        return rc;
    if ((rc = get_int(root, F, "num_hidden_layers", true, 1, CONFIG_MAX_LAYERS, &cfg->n_layers,
                      err, errlen)))
        return rc;
    if ((rc = get_int(root, F, "num_attention_heads", true, 1, CONFIG_MAX_HEADS, &cfg->n_heads,
                      err, errlen)))
        return rc;
    cfg->n_kv_heads = cfg->n_heads; // the transformers default when absent
    if ((rc = get_int(root, F, "num_key_value_heads", false, 1, CONFIG_MAX_HEADS,
                      &cfg->n_kv_heads, err, errlen)))
        return rc;
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ms_err(err, errlen, MS_EFORMAT,
                      "config.json: num_attention_heads (%d) is not a multiple of "
                      "num_key_value_heads (%d)", cfg->n_heads, cfg->n_kv_heads);
    // The modeling code falls back to hidden/heads when head_dim is absent.
    if (!json_object_get(root, "head_dim") || json_is_null(json_object_get(root, "head_dim"))) {
        if (cfg->hidden_size % cfg->n_heads != 0)
            return ms_err(err, errlen, MS_EFORMAT,
                          "config.json has no head_dim and hidden_size (%d) is not a multiple of "
                          "num_attention_heads (%d)", cfg->hidden_size, cfg->n_heads);
        cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    } else if ((rc = get_int(root, F, "head_dim", true, 2, 4096, &cfg->head_dim, err, errlen))) {
        return rc;
    }
    if (cfg->head_dim % 2 != 0)
        return ms_err(err, errlen, MS_EUNSUPPORTED,
                      "config.json field head_dim is %d; rotary embeddings need an even head_dim",
                      cfg->head_dim);
    if ((long long)cfg->n_heads * cfg->head_dim > CONFIG_MAX_DIM)
        return ms_err(err, errlen, MS_EFORMAT,
                      "config.json: num_attention_heads x head_dim = %lld is too large",
                      (long long)cfg->n_heads * cfg->head_dim);
    if ((rc = get_int(root, F, "vocab_size", true, 1, CONFIG_MAX_VOCAB, &cfg->vocab_size, err,
                      errlen)))
        return rc;

    // ---- MLP / MoE ----
    cfg->decoder_sparse_step = 1;
    if (cfg->arch == ARCH_QWEN3_MOE) {
        // Newer transformers may save num_experts under its attribute_map
        // name, num_local_experts.
        int local = -1;
        if ((rc = get_int(root, F, "num_local_experts", false, 0, CONFIG_MAX_EXPERTS, &local, err,
                          errlen)))
            return rc;
        bool named = json_object_get(root, "num_experts") && !json_is_null(json_object_get(root, "num_experts"));
        if ((rc = get_int(root, F, "num_experts", local < 0 || named, 0, CONFIG_MAX_EXPERTS, &cfg->n_experts,
                          err, errlen)))
            return rc;
        if (!named) cfg->n_experts = local;
        else if (local >= 0 && local != cfg->n_experts)
            return ms_err(err, errlen, MS_EFORMAT, "config.json has num_experts %d but num_local_experts "
                          "%d; which is the model's is unclear", cfg->n_experts, local);
        if ((rc = get_int(root, F, "decoder_sparse_step", false, 1, CONFIG_MAX_LAYERS,
                          &cfg->decoder_sparse_step, err, errlen)))
            return rc;
        cfg->norm_topk_prob = false; // the transformers default
        if ((rc = get_bool(root, F, "norm_topk_prob", &cfg->norm_topk_prob, err, errlen)))
            return rc;
        for (int i = 0; i < cfg->n_layers; i++)
            cfg->layer_is_moe[i] = cfg->n_experts > 0 && (i + 1) % cfg->decoder_sparse_step == 0;
        json_t *mo = json_object_get(root, "mlp_only_layers");
        if (mo && !json_is_null(mo)) {
            if (!json_is_array(mo))
                return ms_err(err, errlen, MS_EFORMAT,
                              "config.json field mlp_only_layers must be a list of layer "
                              "indices, not %s", json_kind(mo));
            size_t i;
            json_t *e;
            json_array_foreach(mo, i, e) {
                if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                    json_integer_value(e) >= cfg->n_layers)
                    return ms_err(err, errlen, MS_EFORMAT,
                                  "config.json field mlp_only_layers[%zu] must be a layer index "
                                  "in 0..%d", i, cfg->n_layers - 1);
                cfg->layer_is_moe[json_integer_value(e)] = false;
            }
        }
    }
    bool any_moe = false, any_dense = false;
    for (int i = 0; i < cfg->n_layers; i++) {
        if (cfg->layer_is_moe[i]) any_moe = true;
        else any_dense = true;
    }
    if (any_moe) {
        if ((rc = get_int(root, F, "moe_intermediate_size", true, 1, CONFIG_MAX_DIM,
                          &cfg->moe_intermediate_size, err, errlen)))
            return rc;
        if ((rc = get_int(root, F, "num_experts_per_tok", true, 1, cfg->n_experts,
                          &cfg->n_experts_per_tok, err, errlen)))
            return rc;
    }
    if (any_dense) {
        if ((rc = get_int(root, F, "intermediate_size", true, 1, CONFIG_MAX_DIM,
                          &cfg->intermediate_size, err, errlen)))
            return rc;
    } else if ((rc = get_int(root, F, "intermediate_size", false, 0, CONFIG_MAX_DIM,
                             &cfg->intermediate_size, err, errlen))) {
        return rc;
    }

    // ---- numerics ----
    double x = 1e-6;
    if ((rc = get_num(root, F, "rms_norm_eps", NULL, &x, err, errlen))) return rc;
    if (!(x > 0 && x < 1))
        return ms_err(err, errlen, MS_EFORMAT, "config.json field rms_norm_eps is %g; it must lie "
                      "in (0, 1)", x);
    cfg->rms_norm_eps = (float)x;
    cfg->rope_theta = 10000.0; // the transformers default
    bool theta_given = false;
    if ((rc = get_num(root, F, "rope_theta", &theta_given, &cfg->rope_theta, err, errlen))) return rc;
    if ((rc = check_partial_rotary(root, "", err, errlen))) return rc;
    if ((rc = check_rope(root, "rope_scaling", cfg, &theta_given, err, errlen))) return rc;
    if ((rc = check_rope(root, "rope_parameters", cfg, &theta_given, err, errlen))) return rc;
    if (!(cfg->rope_theta > 1))
        return ms_err(err, errlen, MS_EFORMAT, "config.json field rope_theta is %g; it must be "
                      "greater than 1", cfg->rope_theta);
    cfg->max_position_embeddings = 32768; // the transformers default
    if ((rc = get_int(root, F, "max_position_embeddings", false, 1, 1 << 30,
                      &cfg->max_position_embeddings, err, errlen)))
        return rc;
    cfg->tie_word_embeddings = false;
    if ((rc = get_bool(root, F, "tie_word_embeddings", &cfg->tie_word_embeddings, err, errlen)))
        return rc;

    // ---- dtype: "torch_dtype", renamed "dtype" in newer transformers ----
    cfg->torch_dtype = DTYPE_BF16;
    json_t *dt = json_object_get(root, "torch_dtype");
    if (!dt || json_is_null(dt)) dt = json_object_get(root, "dtype");
    if (dt && !json_is_null(dt)) {
        if (!json_is_string(dt) || parse_dtype_name(json_string_value(dt), &cfg->torch_dtype))
            return ms_err(err, errlen, MS_EUNSUPPORTED,
                          "config.json field torch_dtype is %s; moeserve serves bfloat16, "
                          "float16 or float32 weights", shown(dt, vb, sizeof vb));
    }

    // ---- special tokens ----
    cfg->bos_token_id = -1;
    if ((rc = get_int(root, F, "bos_token_id", false, 0, CONFIG_MAX_VOCAB, &cfg->bos_token_id,
                      err, errlen)))
        return rc;
    if (cfg->bos_token_id >= cfg->vocab_size) cfg->bos_token_id = -1;
    int ids[CONFIG_MAX_EOS], n = 0;
    bool has_eos;
    if ((rc = get_eos(root, F, ids, &n, &has_eos, err, errlen))) return rc;
    cfg->n_eos = keep_in_vocab(F, ids, n, cfg->vocab_size, cfg->eos_ids);
    return 0;
}

int config_parse(const char *json, size_t len, struct model_config *cfg, char *err,
                 size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ms_err(err, errlen, MS_EFORMAT, "config.json is not valid JSON (line %d: %s)",
                      je.line, je.text);
    int rc = parse_root(root, cfg, err, errlen);
    json_decref(root);
    return rc;
}

static int parse_generation(json_t *root, struct model_config *cfg, char *err, size_t errlen)
{
    const char *F = "generation_config.json";
    int rc;
    if (!json_is_object(root))
        return ms_err(err, errlen, MS_EFORMAT,
                      "generation_config.json must hold a JSON object, not %s", json_kind(root));
    int ids[CONFIG_MAX_EOS], n = 0;
    bool has_eos;
    if ((rc = get_eos(root, F, ids, &n, &has_eos, err, errlen))) return rc;
    if (has_eos) {
        int kept[CONFIG_MAX_EOS];
        int n_kept = keep_in_vocab(F, ids, n, cfg->vocab_size, kept);
        // A list with nothing the model can produce leaves config.json's in place.
        if (n_kept > 0) {
            memcpy(cfg->eos_ids, kept, (size_t)n_kept * sizeof kept[0]);
            cfg->n_eos = n_kept;
        }
    }
    int bos = -1;
    if ((rc = get_int(root, F, "bos_token_id", false, 0, CONFIG_MAX_VOCAB, &bos, err, errlen)))
        return rc;
    if (bos >= 0 && bos < cfg->vocab_size) cfg->bos_token_id = bos;

    // Each field present here overrides; absent ones keep what cfg had.
    struct gen_defaults *g = &cfg->gen;
    double x = 0;
    bool has = false;
    if ((rc = get_num(root, F, "temperature", &has, &x, err, errlen))) return rc;
    if (has) {
        if (x < 0)
            return ms_err(err, errlen, MS_EFORMAT,
                          "generation_config.json field temperature is %g; it must be >= 0", x);
        g->temperature = (float)x;
        g->has_temperature = true;
    }
    if ((rc = get_num(root, F, "top_p", &has, &x, err, errlen))) return rc;
    if (has) {
        if (!(x > 0 && x <= 1))
            return ms_err(err, errlen, MS_EFORMAT,
                          "generation_config.json field top_p is %g; it must lie in (0, 1]", x);
        g->top_p = (float)x;
        g->has_top_p = true;
    }
    if ((rc = get_num(root, F, "min_p", &has, &x, err, errlen))) return rc;
    if (has) {
        if (!(x >= 0 && x <= 1))
            return ms_err(err, errlen, MS_EFORMAT,
                          "generation_config.json field min_p is %g; it must lie in [0, 1]", x);
        g->min_p = (float)x;
        g->has_min_p = true;
    }
    if ((rc = get_num(root, F, "repetition_penalty", &has, &x, err, errlen))) return rc;
    if (has) {
        if (!(x > 0))
            return ms_err(err, errlen, MS_EFORMAT,
                          "generation_config.json field repetition_penalty is %g; it must be > 0",
                          x);
        g->repetition_penalty = (float)x;
        g->has_repetition_penalty = true;
    }
    json_t *tk = json_object_get(root, "top_k");
    if (tk && !json_is_null(tk)) {
        if ((rc = get_int(root, F, "top_k", true, -1, CONFIG_MAX_VOCAB, &g->top_k, err, errlen)))
            return rc;
        g->has_top_k = true;
    }
    if ((rc = get_int(root, F, "max_new_tokens", false, 0, 1 << 30, &g->max_new_tokens, err,
                      errlen)))
        return rc;
    return 0;
}

int config_parse_generation(const char *json, size_t len, struct model_config *cfg, char *err,
                            size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ms_err(err, errlen, MS_EFORMAT,
                      "generation_config.json is not valid JSON (line %d: %s)", je.line, je.text);
    int rc = parse_generation(root, cfg, err, errlen);
    json_decref(root);
    return rc;
}

int config_load(const char *path, struct model_config *cfg, char *err, size_t errlen)
{
    char dir[4096], file[4096];
    struct stat st;
    if (stat(path, &st) != 0)
        return ms_err(err, errlen, errno == ENOENT ? MS_ENOTFOUND : MS_EIO, "cannot open %s: %s",
                      path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
            return ms_err(err, errlen, MS_EINVAL, "path %s is too long", path);
    } else {
        const char *slash = strrchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : 0;
        if (n >= sizeof dir) return ms_err(err, errlen, MS_EINVAL, "path %s is too long", path);
        if (slash) {
            memcpy(dir, path, n);
            dir[n] = 0;
            if (n == 0) snprintf(dir, sizeof dir, "/");
        } else {
            snprintf(dir, sizeof dir, ".");
        }
    }
    int rc;
    if (S_ISDIR(st.st_mode)) {
        if ((rc = ms_path_join(file, sizeof file, dir, "config.json")))
            return ms_err(err, errlen, rc, "path %s is too long", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    char *text = NULL;
    size_t len = 0;
    char sub[512];
    struct ms_file_id id;
    if ((rc = ms_read_file_id(file, CONFIG_MAX_FILE_BYTES, &text, &len, &id, sub, sizeof sub)))
        return ms_err(err, errlen, rc, "%s", sub);
    rc = config_parse(text, len, cfg, sub, sizeof sub);
    free(text);
    if (rc) return ms_err(err, errlen, rc, "%s: %s", file, sub);
    cfg->file = id;

    if ((rc = ms_path_join(file, sizeof file, dir, "generation_config.json")))
        return ms_err(err, errlen, rc, "path %s is too long", dir);
    rc = ms_read_file(file, CONFIG_MAX_FILE_BYTES, &text, &len, sub, sizeof sub);
    if (rc == MS_ENOTFOUND) return 0; // optional
    if (rc) return ms_err(err, errlen, rc, "%s", sub);
    rc = config_parse_generation(text, len, cfg, sub, sizeof sub);
    free(text);
    if (rc) return ms_err(err, errlen, rc, "%s: %s", file, sub);
    return 0;
}
