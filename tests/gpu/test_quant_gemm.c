// The CUDA backend's quantized projections against the CPU backend's twin
// (its scalar table, the reference), on the GPU; skips (77) where none is
// visible. Models of one MoE layer written here by make-model — FP8
// checkpoints with blocks of 128, 64, 40 and 36, GPTQ ones with groups of
// 32 (symmetric), 64 and 24 (asymmetric), AWQ with groups of 40,
// compressed-tensors int4 (32 symmetric, 64 with zero points), int8 (128)
// and FP8 (by channel), a bf16 one quantized at load to
// int4, int8 and fp8 — and dummy loads quantized at load whose K (100, 44)
// is not even a multiple of 8. For each:
// - the weights the GPU made (or packed) are, byte for byte, the host's
//   packing of model/quant.h's canonical rows (gpu/qlayout.h);
// - grouped expert matmuls over ragged groups (0 to 70 rows: the 8-row
//   decode tiles and the 64-row prefill tiles) and dense projections (whole
//   matrices, 1 to 130 rows, and an output slice off the 16-row blocks,
//   which the plain kernel takes) agree with the CPU within GPU_MM_TOL of the
//   largest output: the activations go to the tensor cores in bf16;
// - one-hot rows read each weight of q_proj to within a few fp32 roundings
//   of the CPU's value (the decoding of every code, fp8 subnormals too);
// - a row computes the same bits alone or in a 70-row group, and alone or
//   in a 130-row dense call (backend.h's alone-or-batched).
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

#include "base/base.h"
#include "gpu/qlayout.h"
#include "model/backend_registry.h"
#include "model/makemodel.h"

#define GPU_MM_TOL 1e-2

struct qcase {
    const char *name;
    enum quant_method ckpt;   // what make-model writes
    int group;                // its FP8 block or GPTQ group
    bool asym;
    enum quant_format at_load; // --quantization
    bool dummy;               // --load-format dummy of the config alone
    int hidden, moe_ffn;
    int bits;                 // compressed-tensors int: 4 or 8
};

static const struct qcase cases[] = {
    {"fp8-128", QUANT_METHOD_FP8, 128, false, QUANT_NONE, false, 200, 72, 0},
    {"fp8-64", QUANT_METHOD_FP8, 64, false, QUANT_NONE, false, 200, 72, 0},
    {"fp8-40", QUANT_METHOD_FP8, 40, false, QUANT_NONE, false, 200, 72, 0},
    {"fp8-36", QUANT_METHOD_FP8, 36, false, QUANT_NONE, false, 200, 72, 0},
    {"gptq-32", QUANT_METHOD_GPTQ, 32, false, QUANT_NONE, false, 200, 72, 0},
    {"gptq-64-asym", QUANT_METHOD_GPTQ, 64, true, QUANT_NONE, false, 200, 72, 0},
    {"gptq-24-asym", QUANT_METHOD_GPTQ, 24, true, QUANT_NONE, false, 200, 72, 0},
    {"awq-40", QUANT_METHOD_AWQ, 40, false, QUANT_NONE, false, 200, 72, 0},
    {"ct-w4-32", QUANT_METHOD_CT_INT, 32, false, QUANT_NONE, false, 200, 72, 4},
    {"ct-w4-64-asym", QUANT_METHOD_CT_INT, 64, true, QUANT_NONE, false, 200, 72, 4},
    {"ct-w8-128", QUANT_METHOD_CT_INT, 128, false, QUANT_NONE, false, 200, 72, 8},
    {"ct-fp8", QUANT_METHOD_CT_FP8, 0, false, QUANT_NONE, false, 200, 72, 0},
    {"bf16-int4", QUANT_METHOD_NONE, 0, false, QUANT_INT4, false, 200, 72, 0},
    {"bf16-int8", QUANT_METHOD_NONE, 0, false, QUANT_INT8, false, 200, 72, 0},
    {"bf16-fp8", QUANT_METHOD_NONE, 0, false, QUANT_FP8, false, 200, 72, 0},
    {"dummy-int4", QUANT_METHOD_NONE, 0, false, QUANT_INT4, true, 100, 44, 0},
    {"dummy-int8", QUANT_METHOD_NONE, 0, false, QUANT_INT8, true, 100, 44, 0},
    {"dummy-fp8", QUANT_METHOD_NONE, 0, false, QUANT_FP8, true, 100, 44, 0},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moeserve-qgemm-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    for (size_t c = 0; c < N_CASES; c++) {
        struct makemodel_spec s;
        char err[512], dir[512];
        if (makemodel_spec_for_shape("tiny", &s, err, sizeof err)) return -1;
        s.vocab_size = 256;
        s.n_layers = 1;
        s.hidden_size = cases[c].hidden;
        s.moe_intermediate_size = cases[c].moe_ffn;
        s.n_heads = 4;
        s.n_kv_heads = 2;
        s.head_dim = 40;
        s.n_experts = 8;
        s.quant = cases[c].ckpt;
        s.quant_group = cases[c].group;
        s.quant_asym = cases[c].asym;
        s.quant_bits = cases[c].bits;
        snprintf(dir, sizeof dir, "%s/%s", tmpdir, cases[c].name);
        if (makemodel_write(&s, dir, 7, NULL, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", cases[c].name, err);
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

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

static float *frand_array(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof *a);
    assert_non_null(a);
    for (size_t i = 0; i < n; i++) a[i] = frand();
    return a;
}

// A model of the case, and its weights on the CPU's scalar table and on the GPU.
struct sides {
    struct model *m;
    struct backend *b[2];          // [0] the reference, [1] CUDA
    struct backend_weights *w[2];
};

static void sides_open(const struct qcase *c, struct sides *s)
{
    char dir[512], err[1024];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, c->name);
    const struct model_load_opts o = {.format = c->dummy ? LOAD_FORMAT_DUMMY : LOAD_FORMAT_AUTO,
                                      .seed = 3, .quantization = c->at_load, .cache_dir = "none"};
    if (model_load_opts(dir, &o, &s->m, err, sizeof err)) fail_msg("%s: %s", c->name, err);
    assert_int_not_equal(s->m->quant, QUANT_NONE);
    const struct backend_opts cpu = {.n_threads = 2, .variant = "scalar"}, gpu = {.device_index = 0};
    if (backend_create(BACKEND_DEVICE_CPU, &cpu, &s->b[0], err, sizeof err) ||
        backend_create(BACKEND_DEVICE_CUDA, &gpu, &s->b[1], err, sizeof err))
        fail_msg("%s: %s", c->name, err);
    for (int k = 0; k < 2; k++)
        if (s->b[k]->ops->prepare_weights(s->b[k], s->m, 0, s->m->cfg.n_experts, &s->w[k]))
            fail_msg("%s on %s: %s", c->name, s->b[k]->ops->name, s->b[k]->err);
}

static void sides_close(struct sides *s)
{
    for (int k = 0; k < 2; k++) {
        s->b[k]->ops->release_weights(s->b[k], s->w[k]);
        backend_destroy(s->b[k]);
    }
    model_destroy(s->m);
}

static void *dev(struct backend *b, const void *src, size_t bytes)
{
    void *p;
    if (b->ops->alloc(b, bytes ? bytes : 1, &p)) fail_msg("%s", b->err);
    if (src && bytes) assert_int_equal(b->ops->upload(b, p, src, bytes), 0);
    return p;
}

static void *host(struct backend *b, const void *p, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    if (bytes && b->ops->download(b, h, p, bytes)) fail_msg("%s", b->err);
    return h;
}

static void assert_close(const char *what, const char *who, const float *got, const float *want, size_t n)
{
    double scale = 1e-3;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= GPU_MM_TOL * scale))
            fail_msg("%s (%s): element %zu is %.9g on the GPU, %.9g on the CPU", what, who, i,
                     (double)got[i], (double)want[i]);
}

// ---- the weights ---------------------------------------------------------------------

// The matrix t as the GPU holds it against the host's packing of its
// canonical rows.
static void same_bytes(const struct qcase *c, struct backend *b, const struct tensor *t,
                       const struct backend_mat *mat, const char *what)
{
    const int rows = (int)t->shape[0], K = (int)t->shape[1], G = mat->group_cols;
    const enum quant_format f = t->quant.format;
    assert_int_equal(mat->quant, f);
    const size_t bb = quant_block_bytes(f, K, G), n_blocks = ((size_t)rows + 15) / 16;
    assert_int_equal(n_blocks * bb, tensor_bytes(t));
    uint8_t *got = host(b, mat->data, n_blocks * bb), *want = malloc(n_blocks * bb);
    void *buf = malloc(quant_rows_bytes(16, K, f, G) + (size_t)K * sizeof(float));
    assert_true(want && buf);
    struct quant_rows r;
    quant_rows_init(&r, buf, 16, K, f, G);
    for (size_t bl = 0; bl < n_blocks; bl++) {
        const int o = (int)bl * 16;
        r.n = rows - o < 16 ? rows - o : 16;
        quant_tensor_rows(t, o, r.n, &r, (float *)((char *)buf + quant_rows_bytes(16, K, f, G)));
        ql_pack_block(&r, want + bl * bb);
    }
    for (size_t i = 0; i < n_blocks * bb; i++)
        if (got[i] != want[i])
            fail_msg("%s: %s (%d x %d, %s, groups of %d): byte %zu of block %zu is 0x%02x on the GPU, "
                     "0x%02x packed on the host", c->name, what, rows, K, quant_format_name(f), G,
                     i % bb, i / bb, got[i], want[i]);
    free(got);
    free(want);
    free(buf);
}

static void made_weights_equal_the_host_packing(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_CASES; ci++) {
        struct sides s;
        sides_open(&cases[ci], &s);
        const struct layer_weights *L = &s.m->layers[0];
        const struct backend_layer *B = &s.w[1]->layers[0];
        same_bytes(&cases[ci], s.b[1], &L->wq, &B->wq, "q_proj");
        same_bytes(&cases[ci], s.b[1], &L->wo, &B->wo, "o_proj");
        for (int e = 0; e < s.m->cfg.n_experts; e++) {
            same_bytes(&cases[ci], s.b[1], &L->experts[e].gate, &B->expert_gate[e], "an expert's gate");
            same_bytes(&cases[ci], s.b[1], &L->experts[e].down, &B->expert_down[e], "an expert's down");
        }
        sides_close(&s);
    }
}

// ---- the matmuls -----------------------------------------------------------------------

// Experts with {0, 1, 3, 8, 9, 64, 70, 2} rows, gate then down scattered
// back, on both sides; out[k] holds (rows, hidden) from the down call.
// small: every group 8 rows or fewer (the decode tiles).
static void experts_on_both(struct sides *s, bool small, float *out[2], float *gate_out[2], int *rows_out)
{
    const struct model_config *c = &s->m->cfg;
    const int E = c->n_experts, H = c->hidden_size, F = c->moe_intermediate_size;
    const int big[8] = {0, 1, 3, 8, 9, 64, 70, 2}, few[8] = {0, 1, 3, 8, 5, 2, 1, 7};
    int32_t off[9] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (small ? few : big)[e];
    const int rows = off[E];
    float *x = frand_array((size_t)rows * H), *g = frand_array((size_t)rows * F);
    int32_t *perm = malloc((size_t)rows * sizeof *perm);
    assert_non_null(perm);
    for (int i = 0; i < rows; i++) perm[i] = (i * 7 + 3) % rows;
    for (int k = 0; k < 2; k++) {
        struct backend *b = s->b[k];
        const struct backend_layer *L = &s->w[k]->layers[0];
        float *dx = dev(b, x, (size_t)rows * H * sizeof *x), *dg = dev(b, g, (size_t)rows * F * sizeof *g);
        float *dgo = dev(b, NULL, (size_t)rows * F * sizeof(float));
        float *dy = dev(b, NULL, (size_t)rows * H * sizeof(float));
        int32_t *doff = dev(b, off, sizeof off), *dp = dev(b, perm, (size_t)rows * sizeof *perm);
        const struct backend_gmm gate = {.w = L->expert_gate, .n_groups = E, .off = doff, .h_off = off,
                                         .max_rows = rows, .x = dx, .ldx = (size_t)H, .x_rows = dp,
                                         .y = dgo, .ldy = (size_t)F};
        const struct backend_gmm down = {.w = L->expert_down, .n_groups = E, .off = doff, .h_off = NULL,
                                         .max_rows = rows, .x = dg, .ldx = (size_t)F, .y = dy,
                                         .ldy = (size_t)H, .y_rows = dp};
        if (b->ops->grouped_matmul(b, &gate, 1) || b->ops->grouped_matmul(b, &down, 1))
            fail_msg("%s", b->err);
        gate_out[k] = host(b, dgo, (size_t)rows * F * sizeof(float));
        out[k] = host(b, dy, (size_t)rows * H * sizeof(float));
        void *all[] = {dx, dg, dgo, dy, doff, dp};
        for (size_t i = 0; i < 6; i++) b->ops->free(b, all[i]);
    }
    *rows_out = rows;
    free(x);
    free(g);
    free(perm);
}

static void dense_on(struct backend *b, const struct backend_mat *w, int o0, const float *x, int rows,
                     float **out)
{
    const int K = w->cols, n = w->rows - o0;
    float *dx = dev(b, x, (size_t)rows * K * sizeof *x), *dy = dev(b, NULL, (size_t)rows * n * sizeof(float));
    const struct backend_mm j = {.w = w, .o0 = o0, .x = dx, .ldx = (size_t)K, .y = dy, .ldy = (size_t)n,
                                 .rows = rows};
    if (b->ops->matmul(b, &j, 1)) fail_msg("%s", b->err);
    *out = host(b, dy, (size_t)rows * n * sizeof(float));
    b->ops->free(b, dx);
    b->ops->free(b, dy);
}

static void quantized_matmuls_match_the_cpu(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_CASES; ci++) {
        struct sides s;
        sides_open(&cases[ci], &s);
        const struct model_config *c = &s.m->cfg;
        for (int small = 0; small < 2; small++) {
            float *y[2], *g[2];
            int rows;
            experts_on_both(&s, small, y, g, &rows);
            char what[96];
            snprintf(what, sizeof what, "experts' gate, %s tiles", small ? "decode" : "prefill");
            assert_close(what, cases[ci].name, g[1], g[0], (size_t)rows * c->moe_intermediate_size);
            snprintf(what, sizeof what, "experts' down, scattered, %s tiles", small ? "decode" : "prefill");
            assert_close(what, cases[ci].name, y[1], y[0], (size_t)rows * c->hidden_size);
            for (int k = 0; k < 2; k++) {
                free(y[k]);
                free(g[k]);
            }
        }
        const int row_counts[] = {1, 17, 130};
        for (size_t ri = 0; ri < 3; ri++)
            for (int slice = 0; slice < 2; slice++) {
                const int rows = row_counts[ri], o0 = slice ? 8 : 0; // 8: off the blocks
                const struct backend_mat *wq[2] = {&s.w[0]->layers[0].wq, &s.w[1]->layers[0].wq};
                float *x = frand_array((size_t)rows * wq[0]->cols), *y[2];
                for (int k = 0; k < 2; k++) dense_on(s.b[k], wq[k], o0, x, rows, &y[k]);
                char what[96];
                snprintf(what, sizeof what, "q_proj over %d rows from output %d", rows, o0);
                assert_close(what, cases[ci].name, y[1], y[0], (size_t)rows * (wq[0]->rows - o0));
                free(x);
                free(y[0]);
                free(y[1]);
            }
        sides_close(&s);
    }
}

// One-hot rows read each weight alone: row k of y is column k of W, so the
// GPU's decoding of every code the matrix holds (fp8 subnormals, which its
// bf16 multiply must not flush, int8's -128, int4 with its zero points)
// must give the CPU's value to within a few fp32 roundings of that value
// itself, where the test above allows 1% of the largest output.
static void one_hot_rows_read_each_weight_exactly(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_CASES; ci++) {
        struct sides s;
        sides_open(&cases[ci], &s);
        const struct backend_mat *wq[2] = {&s.w[0]->layers[0].wq, &s.w[1]->layers[0].wq};
        const int K = wq[0]->cols, N = wq[0]->rows;
        float *x = calloc((size_t)K * K, sizeof *x), *y[2];
        assert_non_null(x);
        for (int k = 0; k < K; k++) x[(size_t)k * K + k] = 1.0f;
        for (int k = 0; k < 2; k++) dense_on(s.b[k], wq[k], 0, x, K, &y[k]);
        for (size_t i = 0; i < (size_t)K * N; i++)
            if (!(fabs((double)y[1][i] - y[0][i]) <= 0x1p-21 * fabs((double)y[0][i])))
                fail_msg("%s: weight (%zu, %zu) reads %.9g on the GPU, %.9g on the CPU", cases[ci].name,
                         i % (size_t)N, i / (size_t)N, (double)y[1][i], (double)y[0][i]);
        free(x);
        free(y[0]);
        free(y[1]);
        sides_close(&s);
    }
}

// ---- alone or batched ---------------------------------------------------------------------

static void a_row_computes_the_same_alone_or_batched(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_CASES; ci++) {
        struct sides s;
        sides_open(&cases[ci], &s);
        struct backend *b = s.b[1];
        const struct model_config *c = &s.m->cfg;
        const int H = c->hidden_size, F = c->moe_intermediate_size, E = c->n_experts, R = 70;
        const struct backend_layer *L = &s.w[1]->layers[0];
        float *x = frand_array((size_t)R * H), *y[2];
        float *dx = dev(b, x, (size_t)R * H * sizeof *x), *dy = dev(b, NULL, (size_t)R * F * sizeof(float));
        // Expert 5 alone with R rows (prefill tiles), then with its last row alone (decode tiles).
        for (int k = 0; k < 2; k++) {
            int32_t off[9];
            for (int e = 0; e <= E; e++) off[e] = e <= 5 ? 0 : (k ? 1 : R);
            const int n = off[E];
            int32_t *doff = dev(b, off, sizeof off);
            const struct backend_gmm j = {.w = L->expert_gate, .n_groups = E, .off = doff, .h_off = off,
                                          .max_rows = n, .x = k ? dx + (size_t)(R - 1) * H : dx,
                                          .ldx = (size_t)H, .y = dy, .ldy = (size_t)F};
            if (b->ops->grouped_matmul(b, &j, 1)) fail_msg("%s", b->err);
            float *h = host(b, dy, (size_t)n * F * sizeof(float));
            y[k] = h;
            b->ops->free(b, doff);
        }
        if (memcmp(y[0] + (size_t)(R - 1) * F, y[1], (size_t)F * sizeof(float)) != 0)
            fail_msg("%s: an expert row differs alone and in a group of %d", cases[ci].name, R);
        free(y[0]);
        free(y[1]);
        b->ops->free(b, dx);
        b->ops->free(b, dy);
        free(x);
        // A dense row alone and among 130 (8-row and 64-row tiles).
        const struct backend_mat *wq = &s.w[1]->layers[0].wq;
        float *xd = frand_array((size_t)130 * wq->cols), *d[2];
        dense_on(b, wq, 0, xd, 130, &d[0]);
        dense_on(b, wq, 0, xd + (size_t)77 * wq->cols, 1, &d[1]);
        if (memcmp(d[0] + (size_t)77 * wq->rows, d[1], (size_t)wq->rows * sizeof(float)) != 0)
            fail_msg("%s: a q_proj row differs alone and among 130", cases[ci].name);
        free(d[0]);
        free(d[1]);
        free(xd);
        sides_close(&s);
    }
}

int main(void)
{
    enum backend_device d;
    char why[512];
    if (backend_device_resolve(BACKEND_DEVICE_CUDA, &d, NULL, 0, why, sizeof why)) {
        fprintf(stderr, "skipped: no GPU to run on (%s)\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(made_weights_equal_the_host_packing),
        cmocka_unit_test(quantized_matmuls_match_the_cpu),
        cmocka_unit_test(one_hot_rows_read_each_weight_exactly),
        cmocka_unit_test(a_row_computes_the_same_alone_or_batched),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
