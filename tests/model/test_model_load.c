// Pins model_load on the golden checkpoints, on copies with one tensor
// broken (the error names it, expected against actual), on sharded copies,
// and the make-model round trip (what it writes loads with the config's shapes).
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>

#include "base/base.h"
#include "model/makemodel.h"
#include "model/model.h"
#include "model/safetensors.h"

static char tmpdir[256];
static const char *data_dir;

static int setup(void **state)
{
    (void)state;
    data_dir = getenv("MOESERVE_TEST_DATA");
    if (!data_dir) return -1;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moeserve-model-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void golden(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", data_dir, name);
}

// noinline: inlined, GCC mistakes the returned buffer for a dangling local.
__attribute__((noinline)) static char *read_all(const char *path, size_t *len)
{
    char *buf = NULL, err[512];
    assert_int_equal(ms_read_file(path, 256u << 20, &buf, len, err, sizeof err), 0);
    return buf;
}

static void write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

// Copies golden checkpoint `name` into tmpdir/sub, replacing in the
// safetensors header the first occurrence of `from` by `to` (same length,
// so offsets stay valid) and in config.json `cfg_from` by `cfg_to`.
static void copy_edited(const char *name, const char *sub, const char *from, const char *to,
                        const char *cfg_from, const char *cfg_to, char *dir, size_t dirlen)
{
    char src[512], dst[512];
    snprintf(dir, dirlen, "%s/%s", tmpdir, sub);
    char cmd[1200];
    golden(src, sizeof src, name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s'/*.json '%s'/", dir, dir,
             src, dir);
    assert_int_equal(system(cmd), 0);
    size_t len;
    snprintf(src, sizeof src, "%s/%s/model.safetensors", data_dir, name);
    char *b = read_all(src, &len);
    if (from) {
        assert_int_equal(strlen(from), strlen(to));
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (uint8_t)b[i];
        char saved = b[8 + hlen];
        b[8 + hlen] = 0;
        char *at = strstr(b + 8, from);
        assert_non_null(at);
        memcpy(at, to, strlen(to));
        b[8 + hlen] = saved;
    }
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    write_all(dst, b, len);
    free(b);
    if (cfg_from) {
        snprintf(dst, sizeof dst, "%s/config.json", dir);
        char *c = read_all(dst, &len);
        char *at = strstr(c, cfg_from);
        assert_non_null(at);
        size_t n = strlen(c) - strlen(cfg_from) + strlen(cfg_to);
        char *out = malloc(n + 1);
        assert_non_null(out);
        size_t pre = (size_t)(at - c);
        memcpy(out, c, pre);
        strcpy(out + pre, cfg_to);
        strcat(out, at + strlen(cfg_from));
        write_all(dst, out, strlen(out));
        free(out);
        free(c);
    }
}

static void assert_shape2(const struct tensor *t, int64_t a, int64_t b)
{
    assert_non_null(t->data);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], a);
    assert_int_equal(t->shape[1], b);
}

static void assert_shape1(const struct tensor *t, int64_t a)
{
    assert_non_null(t->data);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], a);
}

// Every view points at the bytes the file stores under its HF name.
static void assert_bound_to(const struct model *m, const struct tensor *t, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const struct st_tensor *s = safetensors_find(m->storage, name);
    if (!s || s->data != t->data) fail_msg("%s is not bound to its stored bytes", name);
}

static size_t file_data_bytes(const struct model *m)
{
    size_t n = 0;
    for (size_t i = 0; i < safetensors_count(m->storage); i++)
        n += safetensors_get(m->storage, i)->nbytes;
    return n;
}

static void golden_moe_checkpoint_binds_every_tensor(void **state)
{
    (void)state;
    char dir[512], err[1024] = "";
    golden(dir, sizeof dir, "qwen3moe-v2048");
    struct model *m = NULL;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    const struct model_config *c = &m->cfg;
    assert_int_equal(c->arch, ARCH_QWEN3_MOE);
    assert_int_equal(c->n_layers, 3);
    assert_int_equal(c->n_experts, 16);
    assert_shape2(&m->embed, 2048, 96);
    assert_shape2(&m->lm_head, 2048, 96);
    assert_ptr_not_equal(m->lm_head.data, m->embed.data);
    assert_shape1(&m->final_norm, 96);
    assert_bound_to(m, &m->embed, "model.embed_tokens.weight");
    assert_bound_to(m, &m->lm_head, "lm_head.weight");
    assert_bound_to(m, &m->final_norm, "model.norm.weight");
    for (int i = 0; i < 3; i++) {
        const struct layer_weights *L = &m->layers[i];
        assert_true(L->is_moe);
        assert_shape1(&L->attn_norm, 96);
        assert_shape2(&L->wq, 4 * 32, 96);
        assert_shape2(&L->wk, 2 * 32, 96);
        assert_shape2(&L->wv, 2 * 32, 96);
        assert_shape2(&L->wo, 96, 4 * 32);
        assert_shape1(&L->q_norm, 32);
        assert_shape1(&L->k_norm, 32);
        assert_shape1(&L->ffn_norm, 96);
        assert_shape2(&L->router, 16, 96);
        assert_null(L->gate.data);
        assert_bound_to(m, &L->wq, "model.layers.%d.self_attn.q_proj.weight", i);
        assert_bound_to(m, &L->wo, "model.layers.%d.self_attn.o_proj.weight", i);
        assert_bound_to(m, &L->k_norm, "model.layers.%d.self_attn.k_norm.weight", i);
        assert_bound_to(m, &L->ffn_norm, "model.layers.%d.post_attention_layernorm.weight", i);
        assert_bound_to(m, &L->router, "model.layers.%d.mlp.gate.weight", i);
        for (int e = 0; e < 16; e++) {
            assert_shape2(&L->experts[e].gate, 48, 96);
            assert_shape2(&L->experts[e].up, 48, 96);
            assert_shape2(&L->experts[e].down, 96, 48);
            assert_bound_to(m, &L->experts[e].gate, "model.layers.%d.mlp.experts.%d.gate_proj.weight", i, e);
            assert_bound_to(m, &L->experts[e].down, "model.layers.%d.mlp.experts.%d.down_proj.weight", i, e);
        }
    }
    // The golden file holds exactly the tensors the config implies.
    assert_int_equal(m->weight_bytes, file_data_bytes(m));
    // Active bytes: per layer attention (q, k, v, o) + 4 norms + router +
    // 4 of 16 experts; then final norm, lm_head and one embedding row.
    size_t attn = (128 * 96 + 64 * 96 * 2 + 96 * 128) * 2, norms = (96 * 2 + 32 * 2) * 2;
    size_t per_layer = attn + norms + 16 * 96 * 2 + 4 * (3 * 48 * 96 * 2);
    size_t want = 3 * per_layer + 96 * 2 + 2048 * 96 * 2 + 96 * 2;
    assert_int_equal(model_active_bytes(m), want);
    model_destroy(m);
}

static void golden_dense_checkpoint_binds_mlp_weights(void **state)
{
    (void)state;
    char dir[512], err[1024] = "";
    golden(dir, sizeof dir, "qwen3-dense-v2048");
    struct model *m = NULL;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    assert_int_equal(m->cfg.arch, ARCH_QWEN3);
    for (int i = 0; i < 3; i++) {
        const struct layer_weights *L = &m->layers[i];
        assert_false(L->is_moe);
        assert_null(L->experts);
        assert_null(L->router.data);
        assert_shape2(&L->gate, 192, 96);
        assert_shape2(&L->up, 192, 96);
        assert_shape2(&L->down, 96, 192);
        assert_bound_to(m, &L->up, "model.layers.%d.mlp.up_proj.weight", i);
    }
    assert_int_equal(m->weight_bytes, file_data_bytes(m));
    model_destroy(m);
}

// Loads a broken copy and expects rc with every string of want in the error.
static void expect_load_error(const char *dir, int rc, const char *const *want)
{
    struct model *m = NULL;
    char err[1024] = "";
    int got = model_load(dir, &m, err, sizeof err);
    if (got != rc || m) fail_msg("%s: rc %d (want %d), err \"%s\"", dir, got, rc, err);
    for (const char *const *w = want; *w; w++)
        if (!strstr(err, *w)) fail_msg("error \"%s\" lacks \"%s\"", err, *w);
}

static void wrong_shape_names_tensor_with_expected_and_actual(void **state)
{
    (void)state;
    char dir[512];
    copy_edited("qwen3moe-v2048", "shape",
                "\"model.layers.1.self_attn.k_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[64,96]",
                "\"model.layers.1.self_attn.k_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[96,64]",
                NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_EFORMAT,
                      (const char *const[]){"model.layers.1.self_attn.k_proj.weight",
                                            "has shape [96, 64]", "implies [64, 96]",
                                            "num_key_value_heads", NULL});

    copy_edited("qwen3moe-v2048", "expert",
                "\"model.layers.2.mlp.experts.7.down_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[96,48]",
                "\"model.layers.2.mlp.experts.7.down_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[48,96]",
                NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_EFORMAT,
                      (const char *const[]){"model.layers.2.mlp.experts.7.down_proj.weight",
                                            "[48, 96]", "[96, 48]", NULL});

    // The config disagrees with the weights: 17 experts against 16 stored.
    copy_edited("qwen3moe-v2048", "experts17", NULL, NULL, "\"num_experts\": 16",
                "\"num_experts\": 17", dir, sizeof dir);
    expect_load_error(dir, MS_EFORMAT,
                      (const char *const[]){"model.layers.0.mlp.gate.weight", "[16, 96]",
                                            "[17, 96]", NULL});
}

static void missing_tensor_is_named(void **state)
{
    (void)state;
    char dir[512];
    copy_edited("qwen3moe-v2048", "missing", "model.layers.2.self_attn.q_norm.weight",
                "model.layers.2.self_attn.q_morm.weight", NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_ENOTFOUND,
                      (const char *const[]){"no tensor model.layers.2.self_attn.q_norm.weight",
                                            "[32]", "head_dim", NULL});
    copy_edited("qwen3moe-v2048", "noexpert", "model.layers.0.mlp.experts.15.up_proj.weight",
                "model.layers.0.mlp.experts.15.up_prok.weight", NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_ENOTFOUND,
                      (const char *const[]){"model.layers.0.mlp.experts.15.up_proj.weight", NULL});
    copy_edited("qwen3moe-v2048", "nohead", "\"lm_head.weight\"", "\"lm_heax.weight\"", NULL,
                NULL, dir, sizeof dir);
    expect_load_error(dir, MS_ENOTFOUND,
                      (const char *const[]){"lm_head.weight", "tie_word_embeddings", NULL});
}

static void mixed_dtypes_are_refused(void **state)
{
    (void)state;
    char dir[512];
    copy_edited("qwen3moe-v2048", "mixed", "\"model.norm.weight\":{\"dtype\":\"BF16\"",
                "\"model.norm.weight\":{\"dtype\":\"F16\" ", NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_EUNSUPPORTED,
                      (const char *const[]){"model.norm.weight is F16", "BF16", "one dtype",
                                            NULL});
    copy_edited("qwen3moe-v2048", "i16", "\"model.norm.weight\":{\"dtype\":\"BF16\"",
                "\"model.norm.weight\":{\"dtype\":\"I16\" ", NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_EUNSUPPORTED,
                      (const char *const[]){"model.norm.weight is stored as I16", NULL});
}

static void unsupported_config_is_refused_by_model_load(void **state)
{
    (void)state;
    char dir[512];
    copy_edited("qwen3moe-v2048", "gelu", NULL, NULL, "\"hidden_act\": \"silu\"",
                "\"hidden_act\": \"gelu\"", dir, sizeof dir);
    expect_load_error(dir, MS_EUNSUPPORTED, (const char *const[]){"hidden_act", "gelu", NULL});
    copy_edited("qwen3moe-v2048", "truncated", "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[96],\"data_offsets\":[2345472,2345664]",
                "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[96],\"data_offsets\":[2345472,9345664]",
                NULL, NULL, dir, sizeof dir);
    expect_load_error(dir, MS_EFORMAT, (const char *const[]){"model.norm.weight", "past the end", NULL});
}

static void tied_config_uses_the_embedding_and_dtype_follows_the_weights(void **state)
{
    (void)state;
    char dir[512], err[1024] = "";
    copy_edited("qwen3moe-v2048", "tied", NULL, NULL, "\"tie_word_embeddings\": false",
                "\"tie_word_embeddings\": true", dir, sizeof dir);
    struct model *m = NULL;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    assert_ptr_equal(m->lm_head.data, m->embed.data);
    assert_int_equal(m->weight_bytes, file_data_bytes(m) - 2048 * 96 * 2);
    model_destroy(m);

    copy_edited("qwen3moe-v2048", "f32decl", NULL, NULL, "\"torch_dtype\": \"bfloat16\"",
                "\"torch_dtype\": \"float32\"", dir, sizeof dir);
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    assert_int_equal(m->cfg.torch_dtype, DTYPE_BF16);
    model_destroy(m);
}

// Splits the golden tensors over two shards (alternating) with an index.
static void sharded_copy_loads_like_the_single_file(void **state)
{
    (void)state;
    char src[512], dir[512], path[600], err[1024] = "";
    golden(src, sizeof src, "qwen3moe-v2048/model.safetensors");
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open_file(src, &st, err, sizeof err), 0);
    copy_edited("qwen3moe-v2048", "sharded", NULL, NULL, NULL, NULL, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    json_t *map = json_object();
    for (int s = 0; s < 2; s++) {
        char shard[64];
        snprintf(shard, sizeof shard, "model-%05d-of-00002.safetensors", s + 1);
        json_t *h = json_object();
        size_t off = 0;
        for (size_t i = (size_t)s; i < safetensors_count(st); i += 2) {
            const struct st_tensor *t = safetensors_get(st, i);
            json_t *shape = json_array();
            for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
            json_object_set_new(h, t->name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", t->dtype_str,
                                                      "shape", shape, "data_offsets",
                                                      (json_int_t)off, (json_int_t)(off + t->nbytes)));
            off += t->nbytes;
            json_object_set_new(map, t->name, json_string(shard));
        }
        char *text = json_dumps(h, JSON_COMPACT);
        json_decref(h);
        size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        for (int k = 0; k < 8; k++) fputc((int)((padded >> (8 * k)) & 0xff), f);
        fputs(text, f);
        for (size_t k = hl; k < padded; k++) fputc(' ', f);
        for (size_t i = (size_t)s; i < safetensors_count(st); i += 2) {
            const struct st_tensor *t = safetensors_get(st, i);
            assert_int_equal(fwrite(t->data, 1, t->nbytes, f), t->nbytes);
        }
        assert_int_equal(fclose(f), 0);
        free(text);
    }
    json_t *index = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)0,
                              "weight_map", map);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(index, path, 0), 0);
    json_decref(index);

    struct model *m = NULL, *ref = NULL;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    golden(src, sizeof src, "qwen3moe-v2048");
    assert_int_equal(model_load(src, &ref, err, sizeof err), 0);
    assert_int_equal(m->weight_bytes, ref->weight_bytes);
    assert_memory_equal(m->embed.data, ref->embed.data, 2048 * 96 * 2);
    assert_memory_equal(m->layers[2].experts[9].down.data, ref->layers[2].experts[9].down.data,
                        96 * 48 * 2);
    assert_memory_equal(m->final_norm.data, ref->final_norm.data, 96 * 2);
    model_destroy(m);
    model_destroy(ref);

    // A shard deleted after the index was written.
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    expect_load_error(dir, MS_ENOTFOUND,
                      (const char *const[]){"model-00002-of-00002.safetensors", "missing", NULL});
    safetensors_close(st);
}

// ---- make-model ----

static void bf16_stats(const struct tensor *t, double *mean, double *std, float *lo, float *hi)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    const uint16_t *p = t->data;
    double s = 0, s2 = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float x = ms_bf16_to_f32(p[i]);
        s += x;
        s2 += (double)x * x;
        if (x < *lo) *lo = x;
        if (x > *hi) *hi = x;
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
}

static struct model *write_and_load(const struct makemodel_spec *spec, const char *sub,
                                    uint64_t seed)
{
    char dir[512], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    int rc = makemodel_write(spec, dir, seed, NULL, err, sizeof err);
    if (rc) fail_msg("makemodel_write: %s", err);
    struct model *m = NULL;
    rc = model_load(dir, &m, err, sizeof err);
    if (rc) fail_msg("model_load of what make-model wrote: %s", err);
    return m;
}

static void assert_matches_spec(const struct model *m, const struct makemodel_spec *s)
{
    const struct model_config *c = &m->cfg;
    assert_int_equal(c->arch, s->arch);
    assert_int_equal(c->vocab_size, s->vocab_size);
    assert_int_equal(c->hidden_size, s->hidden_size);
    assert_int_equal(c->n_layers, s->n_layers);
    assert_int_equal(c->n_heads, s->n_heads);
    assert_int_equal(c->n_kv_heads, s->n_kv_heads);
    assert_int_equal(c->head_dim, s->head_dim);
    assert_int_equal(c->tie_word_embeddings, s->tie_word_embeddings);
    assert_true(c->rope_theta == s->rope_theta);
    assert_int_equal(c->max_position_embeddings, s->max_position_embeddings);
    int64_t V = s->vocab_size, H = s->hidden_size, D = s->head_dim;
    assert_shape2(&m->embed, V, H);
    assert_shape2(&m->lm_head, V, H);
    for (int i = 0; i < s->n_layers; i++) {
        const struct layer_weights *L = &m->layers[i];
        assert_shape2(&L->wq, s->n_heads * D, H);
        assert_shape2(&L->wk, s->n_kv_heads * D, H);
        assert_shape2(&L->wo, H, s->n_heads * D);
        assert_shape1(&L->q_norm, D);
        if (L->is_moe) {
            assert_int_equal(c->n_experts, s->n_experts);
            assert_int_equal(c->n_experts_per_tok, s->n_experts_per_tok);
            assert_shape2(&L->router, s->n_experts, H);
            for (int e = 0; e < s->n_experts; e++)
                assert_shape2(&L->experts[e].down, H, s->moe_intermediate_size);
        } else {
            assert_shape2(&L->gate, s->intermediate_size, H);
            assert_shape2(&L->down, H, s->intermediate_size);
        }
    }
    assert_int_equal(m->weight_bytes, makemodel_param_count(s) * 2);
}

static void make_model_round_trip_matches_its_spec(void **state)
{
    (void)state;
    struct makemodel_spec s;
    char err[512];
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    s.vocab_size = 4096; // the full vocabulary is tested on the built tiny model
    struct model *m = write_and_load(&s, "rt", 7);
    assert_matches_spec(m, &s);
    for (int i = 0; i < s.n_layers; i++) assert_true(m->layers[i].is_moe);
    assert_true(m->cfg.norm_topk_prob);
    assert_int_equal(m->cfg.torch_dtype, DTYPE_BF16);

    // The scales make-model promises: embeddings of RMS 1, logits of std
    // ~4.5 (lm_head std 4.5 / sqrt(hidden)), norms near 1, q/k norms near 1.6.
    double mean, std;
    float lo, hi;
    bf16_stats(&m->embed, &mean, &std, &lo, &hi);
    assert_true(fabs(mean) < 0.02 && fabs(std - 1.0) < 0.02);
    bf16_stats(&m->lm_head, &mean, &std, &lo, &hi);
    assert_true(fabs(std * sqrt(64.0) - 4.5) < 0.1);
    bf16_stats(&m->final_norm, &mean, &std, &lo, &hi);
    assert_true(lo >= 0.89f && hi <= 1.11f && std > 0.01);
    bf16_stats(&m->layers[1].q_norm, &mean, &std, &lo, &hi);
    assert_true(lo >= 1.49f && hi <= 1.71f);
    bf16_stats(&m->layers[0].router, &mean, &std, &lo, &hi);
    assert_true(fabs(std * 8.0 - 1.5) < 0.15);
    // Every tensor has its own stream: experts are not copies of each other.
    assert_memory_not_equal(m->layers[0].experts[0].gate.data, m->layers[0].experts[1].gate.data,
                            32 * 64 * 2);
    model_destroy(m);

    // No temporary files are left behind.
    char dir[512];
    snprintf(dir, sizeof dir, "%s/rt", tmpdir);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || !strcmp(e->d_name, ".."))) continue;
        assert_null(strstr(e->d_name, ".tmp"));
        files++;
    }
    closedir(d);
    assert_int_equal(files, 3); // config.json, generation_config.json, model.safetensors
}

static void make_model_is_deterministic_per_seed(void **state)
{
    (void)state;
    struct makemodel_spec s;
    char err[512], a[512], b[512], c[512];
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    s.vocab_size = 1024;
    snprintf(a, sizeof a, "%s/seed-a", tmpdir);
    snprintf(b, sizeof b, "%s/seed-b", tmpdir);
    snprintf(c, sizeof c, "%s/seed-c", tmpdir);
    assert_int_equal(makemodel_write(&s, a, 42, NULL, err, sizeof err), 0);
    assert_int_equal(makemodel_write(&s, b, 42, NULL, err, sizeof err), 0);
    assert_int_equal(makemodel_write(&s, c, 43, NULL, err, sizeof err), 0);
    // Rewriting over an existing checkpoint replaces it.
    assert_int_equal(makemodel_write(&s, a, 42, NULL, err, sizeof err), 0);
    char pa[600], pb[600], pc[600];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    snprintf(pc, sizeof pc, "%s/model.safetensors", c);
    size_t la, lb, lc;
    char *da = read_all(pa, &la), *db = read_all(pb, &lb), *dc = read_all(pc, &lc);
    assert_int_equal(la, lb);
    assert_int_equal(la, lc);
    assert_memory_equal(da, db, la);
    assert_memory_not_equal(da, dc, la);
    free(da);
    free(db);
    free(dc);
}

static void make_model_writes_dense_tied_and_mixed_layouts(void **state)
{
    (void)state;
    struct makemodel_spec s;
    char err[512];
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    s.vocab_size = 512;

    struct makemodel_spec dense = s;
    dense.arch = ARCH_QWEN3;
    dense.intermediate_size = 96;
    struct model *m = write_and_load(&dense, "dense", 1);
    assert_matches_spec(m, &dense);
    assert_false(m->layers[0].is_moe);
    assert_int_equal(m->cfg.n_experts, 0);
    model_destroy(m);

    struct makemodel_spec tied = s;
    tied.tie_word_embeddings = true;
    m = write_and_load(&tied, "tied", 1);
    assert_matches_spec(m, &tied);
    assert_ptr_equal(m->lm_head.data, m->embed.data);
    assert_null(safetensors_find(m->storage, "lm_head.weight"));
    model_destroy(m);

    struct makemodel_spec mixed = s;
    mixed.n_layers = 4;
    mixed.decoder_sparse_step = 2;
    mixed.n_mlp_only = 1;
    mixed.mlp_only_layers[0] = 3;
    mixed.head_dim = 24; // differs from hidden / heads = 16
    m = write_and_load(&mixed, "mixed", 1);
    assert_matches_spec(m, &mixed);
    const bool want[4] = {false, true, false, false};
    for (int i = 0; i < 4; i++) assert_int_equal(m->layers[i].is_moe, want[i]);
    model_destroy(m);
}

// The mid shape is the one the llama.cpp comparisons run (bench/compare_llama_cpp.sh):
// its sizes are the ones the README's figures name.
static void make_model_mid_shape_has_the_compared_sizes(void **state)
{
    (void)state;
    struct makemodel_spec s;
    char err[256];
    assert_int_equal(makemodel_spec_for_shape("mid", &s, err, sizeof err), 0);
    assert_int_equal(s.hidden_size, 1024);
    assert_int_equal(s.n_layers, 12);
    assert_int_equal(s.n_experts, 64);
    assert_int_equal(s.n_experts_per_tok, 8);
    assert_int_equal(s.moe_intermediate_size, 384);
    assert_int_equal(s.n_heads, 16);
    assert_int_equal(s.n_kv_heads, 4);
    assert_int_equal(s.head_dim, 64);
    assert_int_equal(s.vocab_size, 151936);
    const uint64_t p = makemodel_param_count(&s);
    assert_true(p > 1240000000u && p < 1260000000u);
}

static void make_model_refuses_bad_shapes_and_paths(void **state)
{
    (void)state;
    struct makemodel_spec s;
    char err[512] = "", dir[512];
    assert_int_equal(makemodel_spec_for_shape("huge", &s, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "huge"));
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    struct makemodel_spec bad = s;
    bad.n_experts_per_tok = 9;
    snprintf(dir, sizeof dir, "%s/bad", tmpdir);
    assert_int_equal(makemodel_write(&bad, dir, 1, NULL, err, sizeof err), MS_EINVAL);
    // A regular file where the directory should be.
    snprintf(dir, sizeof dir, "%s/afile", tmpdir);
    write_all(dir, "x", 1);
    snprintf(dir, sizeof dir, "%s/afile/model", tmpdir);
    s.vocab_size = 256;
    assert_int_equal(makemodel_write(&s, dir, 1, NULL, err, sizeof err), MS_EIO);
    // A tokenizer folder without the files says how to get them.
    snprintf(dir, sizeof dir, "%s/notok", tmpdir);
    assert_int_equal(makemodel_write(&s, dir, 1, tmpdir, err, sizeof err), MS_ENOTFOUND);
    assert_non_null(strstr(err, "tokenizer.json"));
}

// The checkpoint tests/meson.build generates with `moeserve make-model --shape tiny`.
static void built_tiny_model_loads_with_tokenizer_and_chat_defaults(void **state)
{
    (void)state;
    const char *dir = getenv("MOESERVE_TINY_MODEL");
    assert_non_null(dir);
    char err[1024] = "", path[600];
    struct model *m = NULL;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    struct makemodel_spec s;
    assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
    assert_matches_spec(m, &s);
    assert_int_equal(m->cfg.vocab_size, 151936);
    assert_int_equal(m->cfg.n_eos, 2);
    assert_int_equal(m->cfg.eos_ids[0], 151645);
    assert_int_equal(m->cfg.eos_ids[1], 151643);
    assert_int_equal(m->cfg.bos_token_id, 151643);
    assert_true(m->cfg.gen.has_temperature && m->cfg.gen.temperature == 0.6f);
    assert_true(m->cfg.gen.has_top_p && m->cfg.gen.top_p == 0.95f);
    assert_true(m->cfg.gen.has_top_k && m->cfg.gen.top_k == 20);
    model_destroy(m);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        assert_int_equal(access(path, R_OK), 0);
    }
}

int main(void)
{
    ms_log_level = MS_LOG_ERROR;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_moe_checkpoint_binds_every_tensor),
        cmocka_unit_test(make_model_mid_shape_has_the_compared_sizes),
        cmocka_unit_test(golden_dense_checkpoint_binds_mlp_weights),
        cmocka_unit_test(wrong_shape_names_tensor_with_expected_and_actual),
        cmocka_unit_test(missing_tensor_is_named),
        cmocka_unit_test(mixed_dtypes_are_refused),
        cmocka_unit_test(unsupported_config_is_refused_by_model_load),
        cmocka_unit_test(tied_config_uses_the_embedding_and_dtype_follows_the_weights),
        cmocka_unit_test(sharded_copy_loads_like_the_single_file),
        cmocka_unit_test(make_model_round_trip_matches_its_spec),
        cmocka_unit_test(make_model_is_deterministic_per_seed),
        cmocka_unit_test(make_model_writes_dense_tied_and_mixed_layouts),
        cmocka_unit_test(make_model_refuses_bad_shapes_and_paths),
        cmocka_unit_test(built_tiny_model_loads_with_tokenizer_and_chat_defaults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
