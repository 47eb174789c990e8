// Pins quantized models end to end: make-model's FP8, GPTQ (symmetric and
// asymmetric), AWQ and compressed-tensors (int4, int8, FP8) checkpoints load
// with their formats bound, act-order ones (GPTQ desc_act, compressed-
// tensors actorder group) with each matrix's input order, as do bf16
// checkpoints quantized at load (--quantization fp8|int8|int4), with the
// bytes the planner counts; their logits equal those of the same model run
// on its dequantized weights in fp32 (bit for bit on the scalar table, whose
// quantized matmul is that computation; within 1e-4 of the largest logit on
// the best table), and stay near those of the bf16 original (int8 within 2%
// of the largest logit, fp8 and int4 within 15%, every position of a
// 24-token prompt); inconsistent or hostile quantized checkpoints are
// refused with a sentence naming what was expected and what was found.
#include <math.h>
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

#include "fwd_harness.h"
#include "base/base.h"
#include "model/makemodel.h"
#include "model/planner.h"
#include "model/quant.h"
#include "model/safetensors.h"

static char tmpdir[256];

// The checkpoints every test reads: tiny (vocabulary cut to 2048), seed 5.
enum ckpt {
    C_BF16, C_FP8, C_GPTQ, C_GPTQ_ASYM, C_FP8_128, C_GPTQ_128, C_AWQ, C_AWQ_128,
    C_CT_W4, C_CT_W4_ASYM_128, C_CT_W8_128, C_CT_FP8, C_GPTQ_ACT, C_CT_W4_ACT, C_CT_W8_ACT, C_BF16_DENSE1,
    N_CKPT
};
static const struct {
    const char *sub;
    enum quant_method q;
    int group;
    bool asym;
    int bits;
    bool act; // act-order (desc_act, actorder group)
} ckpts[N_CKPT] = {
    {"bf16", QUANT_METHOD_NONE, 0, false, 0, false},     {"fp8", QUANT_METHOD_FP8, 32, false, 0, false},
    {"gptq", QUANT_METHOD_GPTQ, 32, false, 0, false},    {"gptq-asym", QUANT_METHOD_GPTQ, 32, true, 0, false},
    {"fp8-128", QUANT_METHOD_FP8, 0, false, 0, false},   {"gptq-128", QUANT_METHOD_GPTQ, 0, false, 0, false},
    {"awq", QUANT_METHOD_AWQ, 32, false, 0, false},      {"awq-128", QUANT_METHOD_AWQ, 0, false, 0, false},
    {"ct-w4", QUANT_METHOD_CT_INT, 32, false, 4, false}, {"ct-w4-asym-128", QUANT_METHOD_CT_INT, 0, true, 4, false},
    {"ct-w8-128", QUANT_METHOD_CT_INT, 0, false, 8, false}, {"ct-fp8", QUANT_METHOD_CT_FP8, 0, false, 0, false},
    // Groups smaller than tiny's widths (64 and 32), so that every matrix's
    // inputs change groups.
    {"gptq-act", QUANT_METHOD_GPTQ, 16, true, 0, true}, {"ct-w4-act", QUANT_METHOD_CT_INT, 8, true, 4, true}, // with zero points: five tensors a weight
    {"ct-w8-act", QUANT_METHOD_CT_INT, 16, false, 8, true}, // its layer 1 dense
    {"bf16-dense1", QUANT_METHOD_NONE, 0, false, 0, false}, // ct-w8-act's bf16 original
};

static void ckpt_dir(enum ckpt c, char *out, size_t len) { snprintf(out, len, "%s/%s", tmpdir, ckpts[c].sub); }

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moeserve-quant-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    for (int c = 0; c < N_CKPT; c++) {
        struct makemodel_spec s;
        char err[512], dir[512];
        if (makemodel_spec_for_shape("tiny", &s, err, sizeof err)) return -1;
        s.vocab_size = 2048;
        s.quant = ckpts[c].q;
        s.quant_group = ckpts[c].group;
        s.quant_asym = ckpts[c].asym;
        s.quant_bits = ckpts[c].bits;
        s.quant_act_order = ckpts[c].act;
        if (c == C_CT_W8_ACT || c == C_BF16_DENSE1) { // a dense MLP layer too (Qwen3-MoE's mlp_only_layers)
            s.n_mlp_only = 1;
            s.mlp_only_layers[0] = 1;
        }
        ckpt_dir((enum ckpt)c, dir, sizeof dir);
        if (makemodel_write(&s, dir, 5, NULL, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static struct model *load_q(const char *dir, enum quant_format q)
{
    struct model *m;
    char err[1024];
    const struct model_load_opts o = {.quantization = q, .cache_dir = "none"};
    if (model_load_opts(dir, &o, &m, err, sizeof err)) fail_msg("%s", err);
    return m;
}

static struct model *load_ckpt(enum ckpt c, enum quant_format q)
{
    char dir[512];
    ckpt_dir(c, dir, sizeof dir);
    return load_q(dir, q);
}

// ---- walking the projections --------------------------------------------------------

typedef void (*pair_fn)(const struct tensor *q, struct tensor *p, void *ctx);

// The projections of two models of one config, pairwise.
static void for_each_projection(const struct model *a, struct model *b, pair_fn fn, void *ctx)
{
    for (int i = 0; i < a->cfg.n_layers; i++) {
        const struct layer_weights *L = &a->layers[i];
        struct layer_weights *M = &b->layers[i];
        fn(&L->wq, &M->wq, ctx);
        fn(&L->wk, &M->wk, ctx);
        fn(&L->wv, &M->wv, ctx);
        fn(&L->wo, &M->wo, ctx);
        if (L->is_moe) {
            for (int e = 0; e < a->cfg.n_experts; e++) {
                fn(&L->experts[e].gate, &M->experts[e].gate, ctx);
                fn(&L->experts[e].up, &M->experts[e].up, ctx);
                fn(&L->experts[e].down, &M->experts[e].down, ctx);
            }
        } else {
            fn(&L->gate, &M->gate, ctx);
            fn(&L->up, &M->up, ctx);
            fn(&L->down, &M->down, ctx);
        }
    }
}

struct dequant {
    enum quant_format want;
    enum quant_source source;
    float *bufs[4096];
    int n;
};

// p becomes q's values dequantized by the formula (model/quant.h), in fp32,
// each at its place (canonical input k is the stored perm[k], canonical row
// o the stored row_perm[o]).
static void dequantize_into(const struct tensor *q, struct tensor *p, void *ctx)
{
    struct dequant *d = ctx;
    assert_int_equal(q->quant.format, d->want);
    assert_int_equal(q->quant.source, d->source);
    const int R = (int)q->shape[0], C = (int)q->shape[1];
    float *v = malloc((size_t)R * C * sizeof *v), *tmp = malloc((size_t)C * sizeof *tmp);
    void *buf = malloc(quant_rows_bytes(1, C, q->quant.format, q->quant.group));
    assert_true(v && tmp && buf);
    struct quant_rows r;
    quant_rows_init(&r, buf, 1, C, q->quant.format, q->quant.group);
    for (int o = 0; o < R; o++) {
        quant_tensor_rows(q, o, 1, &r, tmp);
        const size_t row = (size_t)(q->quant.row_perm ? q->quant.row_perm[o] : o);
        for (int k = 0; k < C; k++)
            v[row * C + (size_t)(q->quant.perm ? q->quant.perm[k] : k)] = quant_rows_value(&r, 0, k);
    }
    free(tmp);
    free(buf);
    p->data = v;
    p->dtype = DTYPE_F32;
    assert_true(d->n < 4096);
    d->bufs[d->n++] = v;
}

// ---- logits ---------------------------------------------------------------------------

#define N_TOK 24

// Logits at every position of a fixed prompt (N_TOK, vocab); takes m.
static float *prompt_logits(struct model *m, const char *variant)
{
    struct harness h;
    if (harness_open_model(&h, variant, m, DTYPE_F32, 4, 2, N_TOK, 1)) fail_msg("harness");
    int32_t tok[N_TOK];
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)((i * 709 + 13) % m->cfg.vocab_size);
    int32_t *blocks = harness_blocks(&h, N_TOK);
    const struct fwd_seq s = {.tokens = tok, .n_new = N_TOK, .n_past = 0, .blocks = blocks, .n_logits = N_TOK};
    const struct fwd_batch b = {.n_seqs = 1, .seqs = &s};
    const size_t V = (size_t)m->cfg.vocab_size;
    float *logits = malloc((size_t)N_TOK * V * sizeof *logits);
    assert_non_null(logits);
    char err[512];
    if (harness_forward(&h, &b, logits, err, sizeof err)) fail_msg("forward: %s", err);
    free(blocks);
    harness_close(&h);
    return logits;
}

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

// sqrt(mean((a - b)^2)) / sqrt(mean(b^2)).
static double rms_ratio(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / s);
}

// Positions whose greedy token is the same in both.
static int same_argmax(const float *a, const float *b, int rows, int n)
{
    int same = 0;
    for (int r = 0; r < rows; r++)
        same += argmax_lowest(a + (size_t)r * n, n) == argmax_lowest(b + (size_t)r * n, n);
    return same;
}

// The quantized model against its dequantized twin (fp32 projections, the
// rest as the bf16 checkpoint holds it) and the bf16 original, on the
// scalar table and the best one. An act-order model sums each row's
// products in its inputs' order, the twin in the stored one: within 1e-4
// of the largest logit on the scalar table too.
static void check_logits_of(struct model *(*load_quantized)(void), enum ckpt original, enum quant_format f,
                            enum quant_source src, double rms_tol, int min_same, const char *what)
{
    const char *variants[] = {"scalar", NULL};
    for (int vi = 0; vi < 2; vi++) {
        struct model *q = load_quantized(), *deq = load_ckpt(original, QUANT_NONE);
        struct dequant d = {.want = f, .source = src};
        for_each_projection(q, deq, dequantize_into, &d);
        const bool exact = variants[vi] && q->n_perms == 0; // prompt_logits takes q
        float *lq = prompt_logits(q, variants[vi]);
        float *ld = prompt_logits(deq, variants[vi]);
        float *lb = prompt_logits(load_ckpt(original, QUANT_NONE), variants[vi]);
        const size_t n = (size_t)N_TOK * 2048;
        const double scale = max_abs(ld, n), dd = max_diff(lq, ld, n), db = rms_ratio(lq, lb, n);
        const int same = same_argmax(lq, lb, N_TOK, 2048);
        if (!exact ? dd > 1e-4 * scale : memcmp(lq, ld, n * sizeof *lq) != 0)
            fail_msg("%s on %s: logits differ from the dequantized fp32 model's by %.3g (largest "
                     "logit %.3g)", what, variants[vi] ? variants[vi] : "the best table", dd, scale);
        if (db > rms_tol || same < min_same)
            fail_msg("%s: logits differ from the bf16 original's by %.1f%% (rms, at most %.0f%%) and "
                     "agree on the greedy token at %d of %d positions (at least %d)", what, 100 * db,
                     100 * rms_tol, same, N_TOK, min_same);
        if (db == 0) fail_msg("%s: the logits equal the bf16 original's: nothing was quantized", what);
        for (int i = 0; i < d.n; i++) free(d.bufs[i]);
        free(lq);
        free(ld);
        free(lb);
    }
}

static void check_logits(struct model *(*load_quantized)(void), enum quant_format f, enum quant_source src,
                         double rms_tol, int min_same, const char *what)
{
    check_logits_of(load_quantized, C_BF16, f, src, rms_tol, min_same, what);
}

static struct model *fp8_ckpt(void) { return load_ckpt(C_FP8, QUANT_NONE); }
static struct model *gptq_ckpt(void) { return load_ckpt(C_GPTQ, QUANT_NONE); }
static struct model *gptq_asym_ckpt(void) { return load_ckpt(C_GPTQ_ASYM, QUANT_NONE); }
static struct model *awq_ckpt(void) { return load_ckpt(C_AWQ, QUANT_NONE); }
static struct model *ct_w4_ckpt(void) { return load_ckpt(C_CT_W4, QUANT_NONE); }
static struct model *ct_fp8_ckpt(void) { return load_ckpt(C_CT_FP8, QUANT_NONE); }
static struct model *gptq_act_ckpt(void) { return load_ckpt(C_GPTQ_ACT, QUANT_NONE); }
static struct model *ct_w4_act_ckpt(void) { return load_ckpt(C_CT_W4_ACT, QUANT_NONE); }
static struct model *ct_w8_act_ckpt(void) { return load_ckpt(C_CT_W8_ACT, QUANT_NONE); }
static struct model *int8_at_load(void) { return load_ckpt(C_BF16, QUANT_INT8); }
static struct model *int4_at_load(void) { return load_ckpt(C_BF16, QUANT_INT4); }
static struct model *fp8_at_load(void) { return load_ckpt(C_BF16, QUANT_FP8); }

static void checkpoint_logits_match_their_dequantized_weights(void **state)
{
    (void)state;
    check_logits(fp8_ckpt, QUANT_FP8, QUANT_SRC_FP8, 0.15, 20, "the fp8 checkpoint");
    check_logits(gptq_ckpt, QUANT_INT4, QUANT_SRC_GPTQ, 0.40, 12, "the gptq checkpoint");
    check_logits(gptq_asym_ckpt, QUANT_INT4, QUANT_SRC_GPTQ, 0.40, 12, "the asymmetric gptq checkpoint");
    check_logits(awq_ckpt, QUANT_INT4, QUANT_SRC_AWQ, 0.40, 12, "the awq checkpoint");
    check_logits(ct_w4_ckpt, QUANT_INT4, QUANT_SRC_CT, 0.40, 12, "the compressed-tensors int4 checkpoint");
    check_logits(ct_fp8_ckpt, QUANT_FP8, QUANT_SRC_FP8, 0.15, 20, "the compressed-tensors fp8 checkpoint");
    check_logits(gptq_act_ckpt, QUANT_INT4, QUANT_SRC_GPTQ, 0.40, 12, "the act-order gptq checkpoint");
    check_logits(ct_w4_act_ckpt, QUANT_INT4, QUANT_SRC_CT, 0.40, 12, "the actorder-group compressed-tensors int4 checkpoint");
    check_logits_of(ct_w8_act_ckpt, C_BF16_DENSE1, QUANT_INT8, QUANT_SRC_CT, 0.06, 22,
                    "the actorder-group compressed-tensors int8 checkpoint (a dense layer among its MoE ones)");
}

// make-model's AWQ checkpoint quantizes its bf16 values by the rule
// --quantization int4 applies at load (asymmetric, zero points 0 to 15, as
// AutoAWQ's), so at the same groups of 128 the two hold the same codes,
// scales and zero points, and give the same logits bit for bit: the AWQ
// tensors' packing is read back exactly as it was written.
static void same_logits_as_at_load(enum ckpt c, enum quant_source src, enum quant_format f, const char *what)
{
    const char *variants[] = {"scalar", NULL};
    for (int vi = 0; vi < 2; vi++) {
        struct model *a = load_ckpt(c, QUANT_NONE), *b = load_ckpt(C_BF16, f);
        assert_int_equal(a->layers[1].experts[3].down.quant.source, src);
        assert_int_equal(a->layers[1].experts[3].down.quant.format, f);
        assert_int_equal(b->layers[1].experts[3].down.quant.source, QUANT_SRC_AT_LOAD);
        float *la = prompt_logits(a, variants[vi]), *lb = prompt_logits(b, variants[vi]);
        if (memcmp(la, lb, (size_t)N_TOK * 2048 * sizeof *la) != 0)
            fail_msg("on %s: %s's logits differ from %s at load's by %.3g", variants[vi] ? variants[vi] : "the best table",
                     what, quant_format_name(f), max_diff(la, lb, (size_t)N_TOK * 2048));
        free(la);
        free(lb);
    }
}

static void an_awq_checkpoint_holds_what_int4_at_load_makes(void **state)
{
    (void)state;
    same_logits_as_at_load(C_AWQ_128, QUANT_SRC_AWQ, QUANT_INT4, "the awq checkpoint");
}

// The same for compressed-tensors: its asymmetric int4 rule is the at-load
// one (zero point z + 8 and value q + 8 as stored are ours), its int8 one
// too (fp32 scales, values stored plus 128), so at groups of 128 the
// checkpoints give --quantization int4's and int8's logits bit for bit.
static void compressed_tensors_checkpoints_hold_what_quantizing_at_load_makes(void **state)
{
    (void)state;
    same_logits_as_at_load(C_CT_W4_ASYM_128, QUANT_SRC_CT, QUANT_INT4, "the asymmetric compressed-tensors int4 checkpoint");
    same_logits_as_at_load(C_CT_W8_128, QUANT_SRC_CT, QUANT_INT8, "the compressed-tensors int8 checkpoint");
}

static void logits_quantized_at_load_match_their_dequantized_weights(void **state)
{
    (void)state;
    check_logits(int8_at_load, QUANT_INT8, QUANT_SRC_AT_LOAD, 0.06, 22, "--quantization int8");
    check_logits(int4_at_load, QUANT_INT4, QUANT_SRC_AT_LOAD, 0.40, 12, "--quantization int4");
    check_logits(fp8_at_load, QUANT_FP8, QUANT_SRC_AT_LOAD, 0.15, 20, "--quantization fp8");
}

// ---- binding ------------------------------------------------------------------------------

static void assert_plain(const struct tensor *t) { assert_int_equal(t->quant.format, QUANT_NONE); }

static void checkpoints_bind_their_formats_and_the_planner_counts_their_bytes(void **state)
{
    (void)state;
    struct model *m = load_ckpt(C_GPTQ, QUANT_NONE);
    assert_int_equal(m->quant, QUANT_INT4);
    const struct tensor *e = &m->layers[1].experts[3].down;
    assert_int_equal(e->quant.source, QUANT_SRC_GPTQ);
    assert_int_equal(e->quant.group, 32);
    assert_int_equal(e->quant.zero_offset, 1);
    assert_int_equal(m->layers[0].wq.quant.format, QUANT_INT4);
    assert_plain(&m->layers[0].router);
    assert_plain(&m->embed);
    assert_plain(&m->lm_head);
    assert_plain(&m->final_norm);
    model_destroy(m);
    m = load_ckpt(C_FP8, QUANT_NONE);
    assert_int_equal(m->quant, QUANT_FP8);
    assert_int_equal(m->layers[0].wk.quant.source, QUANT_SRC_FP8);
    assert_int_equal(m->layers[0].wk.quant.block_rows, 32);
    assert_plain(&m->layers[1].router);
    model_destroy(m);
    // What the loader holds is what the planner counts: checkpoints (with
    // their own groups, 32 or 128) and quantization at load alike.
    const struct {
        enum ckpt c;
        enum quant_format q;
        enum plan_dtype t;
    } cases[] = {
        {C_FP8_128, QUANT_NONE, PLAN_FP8}, {C_GPTQ_128, QUANT_NONE, PLAN_INT4},
        {C_FP8, QUANT_NONE, PLAN_FP8},     {C_GPTQ, QUANT_NONE, PLAN_INT4},
        {C_AWQ, QUANT_NONE, PLAN_INT4},    {C_AWQ_128, QUANT_NONE, PLAN_INT4},
        {C_CT_W4, QUANT_NONE, PLAN_INT4},  {C_CT_W4_ASYM_128, QUANT_NONE, PLAN_INT4},
        {C_CT_W8_128, QUANT_NONE, PLAN_INT8}, {C_CT_FP8, QUANT_NONE, PLAN_FP8},
        {C_GPTQ_ACT, QUANT_NONE, PLAN_INT4}, {C_CT_W8_ACT, QUANT_NONE, PLAN_INT8},
        {C_BF16, QUANT_INT8, PLAN_INT8},   {C_BF16, QUANT_INT4, PLAN_INT4},
        {C_BF16, QUANT_FP8, PLAN_FP8},     {C_BF16, QUANT_NONE, PLAN_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        m = load_ckpt(cases[i].c, cases[i].q);
        uint64_t planned;
        char err[256];
        assert_int_equal(plan_weight_bytes(&m->cfg, cases[i].t, PLAN_TP, 1, &planned, err, sizeof err), 0);
        assert_int_equal(plan_dtype_from_quant(m->quant, m->cfg.torch_dtype), cases[i].t);
        if (planned != m->weight_bytes)
            fail_msg("case %zu: the planner counts %llu bytes, the loader holds %zu", i,
                     (unsigned long long)planned, m->weight_bytes);
        // The act-order ones' input orders are in both counts.
        assert_int_equal(m->perm_bytes > 0, cases[i].c == C_GPTQ_ACT || cases[i].c == C_CT_W8_ACT);
        if (m->perm_bytes) {
            struct model_config plain = m->cfg;
            plain.quant.desc_act = false;
            uint64_t without;
            assert_int_equal(plan_weight_bytes(&plain, cases[i].t, PLAN_TP, 1, &without, err, sizeof err), 0);
            assert_int_equal(planned - without, m->perm_bytes);
        }
        model_destroy(m);
    }
}

// ---- hostile checkpoints -----------------------------------------------------------------

// An edit of one tensor of a checkpoint: renamed (to "" to drop it), or
// given another dtype and shape (zeros), or (g_idx) its first and last
// entries swapped, or its first set to first.
struct edit {
    const char *name;
    const char *rename;
    const char *dtype;
    int ndim;
    int64_t shape[2];
    bool swap_first;
    bool set_first;
    int32_t first;
};

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *len, f), *len);
    fclose(f);
    b[*len] = 0;
    return b;
}

static size_t dtype_bytes(const char *d)
{
    return !strcmp(d, "F32") || !strcmp(d, "I32") ? 4 : !strcmp(d, "I64") ? 8 : !strcmp(d, "F8_E4M3") ? 1 : 2;
}

// Copies checkpoint c into tmpdir/sub with the edit applied to its
// safetensors (offsets recomputed) and config.json's text cfg_from replaced
// by cfg_to.
static void copy_edited(enum ckpt c, const char *sub, const struct edit *e, const char *cfg_from,
                        const char *cfg_to, char *dir, size_t dirlen)
{
    char src[512], path[1024];
    ckpt_dir(c, src, sizeof src);
    snprintf(dir, dirlen, "%s/%s", tmpdir, sub);
    snprintf(path, sizeof path, "rm -rf '%s' && mkdir -p '%s' && cp '%s/config.json' '%s/'", dir, dir, src, dir);
    assert_int_equal(system(path), 0);
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    char *b = slurp(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (uint8_t)b[i];
    json_t *h = json_loadb(b + 8, hlen, 0, NULL), *out = json_object();
    assert_non_null(h);
    const uint8_t *data = (const uint8_t *)b + 8 + hlen;
    // Pieces in the original order (make-model writes them in offset order).
    struct piece {
        const uint8_t *p;
        size_t n;
        bool zero, swap, set;
        int32_t first;
    } *pieces = calloc(json_object_size(h), sizeof *pieces);
    size_t np = 0, off = 0;
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        json_t *o = json_object_get(v, "data_offsets");
        const size_t b0 = (size_t)json_integer_value(json_array_get(o, 0));
        const size_t b1 = (size_t)json_integer_value(json_array_get(o, 1));
        struct piece pc = {.p = data + b0, .n = b1 - b0};
        json_t *nv = json_deep_copy(v);
        const char *new_name = name;
        if (e && !strcmp(name, e->name)) {
            if (e->rename) new_name = e->rename;
            if (e->dtype) {
                json_t *shape = json_array();
                size_t n = dtype_bytes(e->dtype);
                for (int i = 0; i < e->ndim; i++) {
                    json_array_append_new(shape, json_integer(e->shape[i]));
                    n *= (size_t)e->shape[i];
                }
                json_object_set_new(nv, "dtype", json_string(e->dtype));
                json_object_set_new(nv, "shape", shape);
                pc.n = n;
                pc.zero = true;
            }
            pc.swap = e->swap_first;
            pc.set = e->set_first;
            pc.first = e->first;
        }
        if (!*new_name) {
            json_decref(nv);
            continue;
        }
        json_object_set_new(nv, "data_offsets", json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + pc.n)));
        off += pc.n;
        json_object_set_new(out, new_name, nv);
        pieces[np++] = pc;
    }
    char *text = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t tl = strlen(text), padded = (tl + 7) & ~(size_t)7;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(text, 1, tl, f);
    fwrite("        ", 1, padded - tl, f);
    for (size_t i = 0; i < np; i++) {
        if (pieces[i].zero) {
            for (size_t k = 0; k < pieces[i].n; k++) fputc(0, f);
        } else if (pieces[i].swap || pieces[i].set) {
            int32_t *g = malloc(pieces[i].n);
            memcpy(g, pieces[i].p, pieces[i].n);
            const int32_t t = g[0];
            g[0] = pieces[i].set ? pieces[i].first : g[pieces[i].n / 4 - 1];
            if (pieces[i].swap) g[pieces[i].n / 4 - 1] = t;
            fwrite(g, 1, pieces[i].n, f);
            free(g);
        } else {
            fwrite(pieces[i].p, 1, pieces[i].n, f);
        }
    }
    assert_int_equal(fclose(f), 0);
    free(text);
    free(pieces);
    json_decref(out);
    json_decref(h);
    free(b);
    if (cfg_from) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        char *cfg = slurp(path, &len), *at = strstr(cfg, cfg_from);
        assert_non_null(at);
        f = fopen(path, "wb");
        fwrite(cfg, 1, (size_t)(at - cfg), f);
        fputs(cfg_to, f);
        fputs(at + strlen(cfg_from), f);
        fclose(f);
        free(cfg);
    }
}

static void expect_refused(const char *dir, enum quant_format q, const char *const *want, const char *what)
{
    struct model *m = NULL;
    char err[1024] = "";
    const struct model_load_opts o = {.quantization = q, .cache_dir = "none"};
    const int rc = model_load_opts(dir, &o, &m, err, sizeof err);
    if (rc == 0) fail_msg("%s: loaded", what);
    if (getenv("SHOW_ERRORS")) fprintf(stderr, "%s: %s\n", what, err);
    for (int i = 0; want[i]; i++)
        if (!strstr(err, want[i])) fail_msg("%s: \"%s\" does not say \"%s\"", what, err, want[i]);
}

#define L0 "model.layers.0.mlp.experts.2.down_proj"
#define G0 "model.layers.0.mlp.experts.2.gate_proj"

// tiny: hidden 64, moe_intermediate 32; GPTQ and FP8 groups of 32.
// --quantization naming a checkpoint's method (vLLM's gptq, awq,
// compressed-tensors): read as it is where the checkpoint is of it, refused
// with a sentence naming both where not.
static void a_named_checkpoint_method_must_be_the_checkpoints(void **state)
{
    (void)state;
    const struct {
        enum ckpt c;
        enum quant_method m;
        const char *refused; // NULL: loads
    } cases[] = {
        {C_GPTQ, QUANT_METHOD_GPTQ, NULL},   {C_AWQ, QUANT_METHOD_AWQ, NULL},
        {C_CT_W4, QUANT_METHOD_CT_INT, NULL}, {C_CT_FP8, QUANT_METHOD_CT_INT, NULL},
        {C_AWQ, QUANT_METHOD_GPTQ, "says awq"}, {C_GPTQ, QUANT_METHOD_CT_INT, "says gptq"},
        {C_FP8, QUANT_METHOD_AWQ, "says fp8"},  {C_BF16, QUANT_METHOD_GPTQ, "says none"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char dir[512], err[1024] = "";
        ckpt_dir(cases[k].c, dir, sizeof dir);
        struct model *m = NULL;
        const struct model_load_opts o = {.method = cases[k].m, .cache_dir = "none"};
        const int rc = model_load_opts(dir, &o, &m, err, sizeof err);
        if (!cases[k].refused) {
            if (rc) fail_msg("%s: %s", ckpts[cases[k].c].sub, err);
            model_destroy(m);
        } else {
            assert_int_equal(rc, MS_EINVAL);
            if (!strstr(err, cases[k].refused) || !strstr(err, "--quantization"))
                fail_msg("%s: wanted a sentence with '%s', got: %s", ckpts[cases[k].c].sub, cases[k].refused, err);
        }
    }
}

static void inconsistent_checkpoints_are_refused_with_expected_and_actual(void **state)
{
    (void)state;
    char dir[512];
    const struct {
        enum ckpt c;
        struct edit e;
        const char *cfg_from, *cfg_to;
        enum quant_format q;
        const char *want[5];
    } cases[] = {
        // GPTQ: (64 x 32) down_proj: qweight (4, 64), qzeros (1, 8), scales (1, 64), g_idx (32).
        {C_GPTQ, {L0 ".qzeros", NULL, "I32", 2, {2, 8}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qzeros", "[2, 8]", "[1, 8]", NULL}},
        {C_GPTQ, {L0 ".scales", NULL, "F32", 2, {1, 64}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".scales", "F32", "F16", NULL}},
        {C_GPTQ, {L0 ".qweight", NULL, "I64", 2, {4, 64}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qweight", "I64", "I32", NULL}},
        {C_GPTQ, {L0 ".qweight", NULL, "I32", 2, {4, 32}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qweight", "[4, 32]", "[4, 64]", NULL}},
        {C_GPTQ, {L0 ".qzeros", "", NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qzeros", "no tensor", NULL}},
        // gate_proj (32 x 64): two groups of 32. A group past the last, and
        // an input moved from group 0 to 1 (31 and 33): no order a quantizer
        // writes (act_order_checkpoints_read_each_input_in_its_group reads one).
        {C_GPTQ, {G0 ".g_idx", NULL, NULL, 0, {0}, false, true, 2}, NULL, NULL, QUANT_NONE,
         {G0 ".g_idx[0] is 2", "groups 0 to 1", NULL}},
        {C_GPTQ, {G0 ".g_idx", NULL, NULL, 0, {0}, false, true, -5}, NULL, NULL, QUANT_NONE,
         {G0 ".g_idx[0] is -5", NULL}},
        {C_GPTQ, {G0 ".g_idx", NULL, NULL, 0, {0}, false, true, 1}, NULL, NULL, QUANT_NONE,
         {G0 ".g_idx", "puts 31 inputs in group 0", "gives that group 32", NULL}},
        // act-order said, and no g_idx to say each input's group.
        {C_GPTQ, {G0 ".g_idx", "", NULL, 0, {0}, false, false, 0}, "\"desc_act\": false", "\"desc_act\": true",
         QUANT_NONE, {"desc_act true", G0 ".g_idx", "missing", NULL}},
        // GPTQ tensors and no quantization_config (an old quantize_config.json's file).
        {C_GPTQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"quantization_config\"", "\"x_quantization_config\"",
         QUANT_NONE, {".qweight", "a GPTQ tensor", "no quantization_config", NULL}},
        // A group size the tensors were not made with.
        {C_GPTQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"group_size\": 32", "\"group_size\": 16",
         QUANT_NONE, {"group_size 16", "qzeros", "[2, 8]", "[4, 8]"}},
        {C_GPTQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"quant_method\": \"gptq\"",
         "\"quant_method\": \"fp8\"", QUANT_NONE, {"no tensor", "q_proj.weight", NULL}},
        {C_GPTQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_FP8,
         {"GPTQ", "--quantization fp8", NULL}},
        // AWQ: (64 x 32) down_proj: qweight (32, 8), qzeros (1, 8), scales (1, 64).
        {C_AWQ, {L0 ".qweight", NULL, "I32", 2, {4, 64}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qweight", "[4, 64]", "[32, 8]", "in_features, out_features / 8"}},
        {C_AWQ, {L0 ".scales", NULL, "F32", 2, {1, 64}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".scales", "F32", "F16", NULL}},
        {C_AWQ, {L0 ".qzeros", NULL, "I32", 2, {1, 64}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qzeros", "[1, 64]", "[1, 8]", NULL}},
        {C_AWQ, {L0 ".qzeros", "", NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".qzeros", "no tensor", NULL}},
        {C_AWQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"version\": \"gemm\"", "\"version\": \"gemv\"",
         QUANT_NONE, {"version", "gemv", "\"gemm\"", NULL}},
        {C_AWQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"zero_point\": true", "\"zero_point\": false",
         QUANT_NONE, {"zero_point is false", NULL}},
        {C_AWQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"group_size\": 32", "\"group_size\": 16",
         QUANT_NONE, {"group_size 16", "qzeros", "[2, 8]", "[4, 8]"}},
        {C_AWQ, {"none", NULL, NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_FP8,
         {"AWQ", "--quantization fp8", NULL}},
        // compressed-tensors int4, group 32: (64 x 32) down_proj: weight_packed (64, 4),
        // weight_scale (64, 1) F16, weight_shape [64, 32]; asymmetric, group 128:
        // weight_zero_point (8, 1).
        {C_CT_W4, {L0 ".weight_packed", NULL, "I32", 2, {64, 8}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_packed", "[64, 8]", "[64, 4]", NULL}},
        {C_CT_W4, {L0 ".weight_scale", NULL, "F16", 2, {1, 64}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_scale", "[1, 64]", "[64, 1]", NULL}},
        {C_CT_W4, {L0 ".weight_shape", NULL, "I64", 1, {2}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_shape", "[0, 0]", "[64, 32]", NULL}},
        {C_CT_W4, {L0 ".weight_shape", "", NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_shape", "no tensor", NULL}},
        {C_CT_W4_ASYM_128, {L0 ".weight_zero_point", "", NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_zero_point", "no tensor", "[8, 1]", NULL}},
        {C_CT_W4_ASYM_128, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"symmetric\": false", "\"symmetric\": true",
         QUANT_NONE, {"weight_zero_point", "symmetric", NULL}},
        {C_CT_W4, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"actorder\": null", "\"actorder\": \"group\"",
         QUANT_NONE, {"actorder group", "weight_g_idx", "missing", NULL}},
        {C_CT_W4, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"input_activations\": null",
         "\"input_activations\": {\"num_bits\": 8, \"dynamic\": false}", QUANT_NONE,
         {"static input activations", NULL}},
        {C_CT_W4, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"sparsity_config\": {}",
         "\"sparsity_config\": {\"format\": \"sparse-24-bitmask\"}", QUANT_NONE, {"sparsity_config", NULL}},
        // A group's own format wins over the top level's (vLLM reads it so).
        {C_CT_W4, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"format\": \"pack-quantized\"\n",
         "\"format\": \"marlin-24\"\n", QUANT_NONE, {"marlin-24", "pack-quantized", NULL}},
        {C_CT_W4, {"none", NULL, NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_FP8,
         {"compressed-tensors", "--quantization fp8", NULL}},
        // compressed-tensors FP8 by channel: (64 x 32) down_proj: weight_scale (64, 1) BF16.
        {C_CT_FP8, {L0 ".weight_scale", NULL, "BF16", 2, {1, 1}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_scale", "[1, 1]", "[64, 1]", "channel", NULL}},
        {C_CT_FP8, {L0 ".weight_scale", "", NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_scale", "no tensor", NULL}},
        // FP8: (64 x 32) down_proj with 32 x 32 blocks: weight_scale_inv (2, 1).
        {C_FP8, {L0 ".weight_scale_inv", NULL, "F32", 2, {2, 2}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_scale_inv", "[2, 2]", "[2, 1]", NULL}},
        {C_FP8, {L0 ".weight_scale_inv", NULL, "I32", 2, {2, 1}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_scale_inv", "I32", "F32, BF16 or F16", NULL}},
        {C_FP8, {L0 ".weight_scale_inv", "", NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight_scale_inv", "no tensor", NULL}},
        {C_FP8, {L0 ".weight", NULL, "F8_E4M3", 2, {64, 16}, false, false, 0}, NULL, NULL, QUANT_NONE,
         {L0 ".weight", "[64, 16]", "config.json implies [64, 32]", NULL}},
        {C_FP8, {"model.embed_tokens.weight", NULL, "F8_E4M3", 2, {2048, 64}, false, false, 0}, NULL, NULL,
         QUANT_NONE, {"embedding", "model.embed_tokens", NULL}},
        {C_FP8, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"quantization_config\"", "\"no_quantization\"",
         QUANT_NONE, {"F8_E4M3", "quantization_config", NULL}},
        {C_FP8, {"none", NULL, NULL, 0, {0}, false, false, 0}, NULL, NULL, QUANT_INT4,
         {"FP8", "--quantization int4", NULL}},
        // Block scales in the file, no weight_block_size in the config: the
        // missing key is named (not a [1, 1] shape for a size never given).
        {C_FP8, {"none", NULL, NULL, 0, {0}, false, false, 0}, "\"weight_block_size\"", "\"x_weight_block_size\"",
         QUANT_NONE, {"weight_scale_inv holds block scales", "no weight_block_size", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sub[32], what[64];
        snprintf(sub, sizeof sub, "hostile-%zu", i);
        snprintf(what, sizeof what, "case %zu", i);
        copy_edited(cases[i].c, sub, &cases[i].e, cases[i].cfg_from, cases[i].cfg_to, dir, sizeof dir);
        expect_refused(dir, cases[i].q, cases[i].want, what);
    }
    // The untouched copy loads: the edits, not the copying, are refused.
    copy_edited(C_GPTQ, "copy", NULL, NULL, NULL, dir, sizeof dir);
    model_destroy(load_q(dir, QUANT_NONE));
}

// An input order (of C inputs) against its checkpoint's g_idx (tensor
// name): a permutation of the inputs, input perm[j] in group j / G,
// ascending within a group, and not the stored order.
static void check_order(const struct model *m, const int32_t *perm, int C, const char *name, int G)
{
    const struct st_tensor *gi = safetensors_find(m->storage, name);
    if (!gi || !perm) fail_msg("%s: %s", name, gi ? "no input order" : "not in the checkpoint");
    const int32_t *g = gi->data;
    assert_int_equal(gi->nbytes, (size_t)C * 4);
    bool *seen = calloc((size_t)C, 1), stored = true;
    assert_non_null(seen);
    for (int j = 0; j < C; j++) {
        const int k = perm[j];
        assert_true(k >= 0 && k < C && !seen[k]);
        seen[k] = true;
        if (g[k] != j / G) fail_msg("%s: input %d, at %d in the order, is in group %d, not %d", name, k, j, g[k], j / G);
        if (j % G) assert_true(perm[j - 1] < k);
        stored &= k == j;
    }
    free(seen);
    if (stored) fail_msg("%s: the order is the stored one", name);
}

// GPTQ's desc_act and compressed-tensors' actorder group: each projection
// reads its inputs in the order its g_idx groups them, one order shared by
// the matrices that read one input (an expert's gate and up; q, k and v)
// and allocated once; down's order is its gate's and up's output rows'
// too (row_perm), so that it reads their product as it comes (folded);
// checkpoints without act-order keep none. A g_idx
// whose first and last inputs trade groups (0 and 1 of 64 inputs in groups
// of 32) is such an order too: the first group is inputs 1 to 31 and 63.
static void act_order_checkpoints_read_each_input_in_its_group(void **state)
{
    (void)state;
    const enum ckpt cs[] = {C_GPTQ_ACT, C_CT_W4_ACT, C_CT_W8_ACT};
    for (int c = 0; c < 3; c++) {
        struct model *m = load_ckpt(cs[c], QUANT_NONE);
        const char *gi = ckpts[cs[c]].q == QUANT_METHOD_GPTQ ? "g_idx" : "weight_g_idx";
        const int G = ckpts[cs[c]].group;
        char name[160];
        for (int i = 0; i < m->cfg.n_layers; i++) {
            const struct layer_weights *L = &m->layers[i];
            const char *at[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
            const struct tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo};
            for (int j = 0; j < 4; j++) {
                snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.%s", i, at[j], gi);
                check_order(m, ts[j]->quant.perm, (int)ts[j]->shape[1], name, G);
                assert_null(ts[j]->quant.row_perm);
            }
            assert_ptr_equal(L->wq.quant.perm, L->wk.quant.perm);
            assert_ptr_equal(L->wq.quant.perm, L->wv.quant.perm);
            assert_ptr_not_equal(L->wq.quant.perm, L->wo.quant.perm);
            if (!L->is_moe) {
                const char *mp[] = {"gate_proj", "up_proj", "down_proj"};
                const struct tensor *mt[] = {&L->gate, &L->up, &L->down};
                for (int j = 0; j < 3; j++) {
                    snprintf(name, sizeof name, "model.layers.%d.mlp.%s.%s", i, mp[j], gi);
                    check_order(m, mt[j]->quant.perm, (int)mt[j]->shape[1], name, G);
                }
                assert_ptr_equal(L->gate.quant.perm, L->up.quant.perm);
                assert_true(L->down.quant.perm_folded);
                assert_ptr_equal(L->gate.quant.row_perm, L->down.quant.perm);
                assert_ptr_equal(L->up.quant.row_perm, L->down.quant.perm);
                continue;
            }
            for (int e = 0; e < m->cfg.n_experts; e++) {
                const struct expert_weights *x = &L->experts[e];
                const int H = m->cfg.hidden_size, F = m->cfg.moe_intermediate_size;
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.gate_proj.%s", i, e, gi);
                check_order(m, x->gate.quant.perm, H, name, G);
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.%s", i, e, gi);
                check_order(m, x->up.quant.perm, H, name, G);
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.%s", i, e, gi);
                check_order(m, x->down.quant.perm, F, name, G);
                assert_true(x->down.quant.perm_folded);
                assert_ptr_equal(x->gate.quant.row_perm, x->down.quant.perm);
                assert_null(x->down.quant.row_perm);
                assert_ptr_equal(x->gate.quant.perm, x->up.quant.perm);
                assert_ptr_equal(x->gate.quant.row_perm, x->up.quant.row_perm);
                if (e) assert_ptr_not_equal(x->gate.quant.perm, L->experts[e - 1].gate.quant.perm);
            }
        }
        // Per layer: q/k/v's, o's, and each expert's (or the dense MLP's) gate/up and down.
        size_t want = 0;
        for (int i = 0; i < m->cfg.n_layers; i++) want += 2 + 2 * (m->layers[i].is_moe ? (size_t)m->cfg.n_experts : 1);
        assert_int_equal(m->n_perms, want);
        model_destroy(m);
    }
    struct model *m = load_ckpt(C_GPTQ, QUANT_NONE);
    assert_int_equal(m->n_perms, 0);
    assert_null(m->layers[1].experts[2].gate.quant.perm);
    model_destroy(m);

    char dir[512];
    const struct edit swap = {"model.layers.0.mlp.experts.2.gate_proj.g_idx", NULL, NULL, 0, {0}, true, false, 0};
    copy_edited(C_GPTQ, "swapped", &swap, NULL, NULL, dir, sizeof dir);
    m = load_q(dir, QUANT_NONE);
    const int32_t *perm = m->layers[0].experts[2].gate.quant.perm;
    assert_non_null(perm);
    for (int j = 0; j < 64; j++) assert_int_equal(perm[j], j < 31 ? j + 1 : j == 31 ? 63 : j == 32 ? 0 : j - 1);
    assert_null(m->layers[0].experts[2].up.quant.perm);
    model_destroy(m);
}

// A quantized config loaded dummy makes its own format (fp8, or int4 for gptq).
static void dummy_loads_of_quantized_configs_make_their_format(void **state)
{
    (void)state;
    const enum ckpt cs[] = {C_FP8, C_GPTQ, C_AWQ, C_CT_W4, C_CT_W8_128, C_CT_FP8};
    const enum quant_format fs[] = {QUANT_FP8, QUANT_INT4, QUANT_INT4, QUANT_INT4, QUANT_INT8, QUANT_FP8};
    for (int i = 0; i < 6; i++) {
        char dir[512], err[512];
        ckpt_dir(cs[i], dir, sizeof dir);
        struct model *m;
        const struct model_load_opts o = {.format = LOAD_FORMAT_DUMMY, .seed = 3, .cache_dir = "none"};
        assert_int_equal(model_load_opts(dir, &o, &m, err, sizeof err), 0);
        assert_int_equal(m->quant, fs[i]);
        assert_int_equal(m->layers[0].experts[0].up.quant.source, QUANT_SRC_AT_LOAD);
        assert_plain(&m->layers[0].router);
        model_destroy(m);
    }
}

// make-model lays the tensors out as safetensors does, wider elements
// first, so that each starts aligned to its elements with no gap: at the
// shapes the GPU test uses (hidden 200, experts of 72, head_dim 40),
// compressed-tensors' I64 weight_shape had come after F16 scales of an odd
// number of 4-byte words, which the reader refuses. Every format loads.
static void make_model_writes_every_format_aligned(void **state)
{
    (void)state;
    static const struct {
        enum quant_method q;
        int group, bits;
        bool asym;
    } fs[] = {
        {QUANT_METHOD_FP8, 40, 0, false},     {QUANT_METHOD_GPTQ, 24, 0, true},
        {QUANT_METHOD_AWQ, 40, 0, false},     {QUANT_METHOD_CT_INT, 32, 4, false},
        {QUANT_METHOD_CT_INT, 64, 4, true},   {QUANT_METHOD_CT_INT, 128, 8, false},
        {QUANT_METHOD_CT_FP8, 0, 0, false},
    };
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        struct makemodel_spec s;
        char err[512], dir[512];
        assert_int_equal(makemodel_spec_for_shape("tiny", &s, err, sizeof err), 0);
        s.vocab_size = 256;
        s.n_layers = 1;
        s.hidden_size = 200;
        s.moe_intermediate_size = 72;
        s.n_heads = 4;
        s.n_kv_heads = 2;
        s.head_dim = 40;
        s.quant = fs[i].q;
        s.quant_group = fs[i].group;
        s.quant_bits = fs[i].bits;
        s.quant_asym = fs[i].asym;
        snprintf(dir, sizeof dir, "%s/aligned-%zu", tmpdir, i);
        if (makemodel_write(&s, dir, 7, NULL, err, sizeof err)) fail_msg("format %zu: %s", i, err);
        model_destroy(load_q(dir, QUANT_NONE));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(checkpoints_bind_their_formats_and_the_planner_counts_their_bytes),
        cmocka_unit_test(checkpoint_logits_match_their_dequantized_weights),
        cmocka_unit_test(act_order_checkpoints_read_each_input_in_its_group),
        cmocka_unit_test(an_awq_checkpoint_holds_what_int4_at_load_makes),
        cmocka_unit_test(compressed_tensors_checkpoints_hold_what_quantizing_at_load_makes),
        cmocka_unit_test(logits_quantized_at_load_match_their_dequantized_weights),
        cmocka_unit_test(inconsistent_checkpoints_are_refused_with_expected_and_actual),
        cmocka_unit_test(a_named_checkpoint_method_must_be_the_checkpoints),
        cmocka_unit_test(dummy_loads_of_quantized_configs_make_their_format),
        cmocka_unit_test(make_model_writes_every_format_aligned),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
