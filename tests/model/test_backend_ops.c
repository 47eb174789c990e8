// Every op of every backend this build and machine have, against the CPU
// backend's scalar table (the reference), at several shapes including the
// edges: one row, rows across 16-row tiles and KV block boundaries, odd head
// counts (3 query heads over 1 KV head), a vocabulary that is no multiple of
// 16, empty groups, and empty batches (which must change nothing). On a
// machine with only the CPU backend it runs every kernel table the CPU has
// (ggml's test-backend-ops; llm.c's dev/cuda). Weights come from dummy
// loads of small configs written here, made by each backend itself, some
// with their projections quantized at load (int4, int8, fp8).
//
// Tolerances: ops that move bytes (embedding rows, routing, gathers, copies,
// KV layout) must agree exactly; arithmetic may differ by the rounding of
// other summation orders and vector exp, so within 1e-4 relative to the
// magnitude of the reference (the kernel tests pin the tables tighter).
// The CUDA backend's projections (matmul, grouped matmul, lm_head) take
// their activations in bf16 (8 significant bits: each product off by up to
// 2^-9 relative, fp32 accumulation), as does the CPU's avx512_bf16 table, so
// they are held to 1e-2 of the reference's largest magnitude (BF16_MM_TOL);
// their other ops to 1e-4.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "base/base.h"
#include "model/backend_registry.h"
#include "model/cpu/backend_cpu.h"
#include "model/fwd_plan.h"

#define TOL 1e-4
#define BF16_MM_TOL 1e-2

static double mm_tol = TOL; // the projections' tolerance on the target under test

// ---- shapes: small configs, loaded dummy ------------------------------------------

struct shape {
    const char *name;
    const char *edits; // JSON object merged into the golden MoE config
    enum quant_format quant; // projections quantized at load (--quantization)
};

static const struct shape shapes[] = {
    {"golden", "{}", QUANT_NONE},
    // Odd heads (3 over 1 KV head), a vocabulary off the 16-row grid, a dense
    // layer between MoE ones, top-k weights not renormalised.
    {"odd", "{\"hidden_size\": 80, \"num_attention_heads\": 3, \"num_key_value_heads\": 1,"
            " \"head_dim\": 16, \"num_experts\": 5, \"num_experts_per_tok\": 2,"
            " \"moe_intermediate_size\": 24, \"intermediate_size\": 40, \"vocab_size\": 1000,"
            " \"num_hidden_layers\": 3, \"mlp_only_layers\": [1], \"norm_topk_prob\": false,"
            " \"bos_token_id\": 999, \"eos_token_id\": 999}", QUANT_NONE},
    // Wider rows: K of 256 and 384 (whole tiles for the AMX table), 64-dim heads.
    {"wide", "{\"hidden_size\": 256, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
             " \"head_dim\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 3,"
             " \"moe_intermediate_size\": 96, \"intermediate_size\": 384, \"vocab_size\": 4099,"
             " \"num_hidden_layers\": 2, \"bos_token_id\": 4098, \"eos_token_id\": 4098}", QUANT_NONE},
    // Quantized projections: int4 groups over K of 96 (one group) and 48;
    // int8 with ragged groups (K 80 and 24, a dense layer of 40); fp8 with
    // whole and ragged groups (K 256 = 2 x 128, 384, 96).
    {"golden-int4", "{}", QUANT_INT4},
    {"odd-int8", "{\"hidden_size\": 80, \"num_attention_heads\": 3, \"num_key_value_heads\": 1,"
                 " \"head_dim\": 16, \"num_experts\": 5, \"num_experts_per_tok\": 2,"
                 " \"moe_intermediate_size\": 24, \"intermediate_size\": 40, \"vocab_size\": 1000,"
                 " \"num_hidden_layers\": 3, \"mlp_only_layers\": [1], \"norm_topk_prob\": false,"
                 " \"bos_token_id\": 999, \"eos_token_id\": 999}", QUANT_INT8},
    {"wide-fp8", "{\"hidden_size\": 256, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
                 " \"head_dim\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 3,"
                 " \"moe_intermediate_size\": 96, \"intermediate_size\": 384, \"vocab_size\": 4099,"
                 " \"num_hidden_layers\": 2, \"bos_token_id\": 4098, \"eos_token_id\": 4098}", QUANT_FP8},
    {"wide-int4", "{\"hidden_size\": 256, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
                  " \"head_dim\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 3,"
                  " \"moe_intermediate_size\": 96, \"intermediate_size\": 384, \"vocab_size\": 4099,"
                  " \"num_hidden_layers\": 2, \"bos_token_id\": 4098, \"eos_token_id\": 4098}", QUANT_INT4},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static char cfg_dirs[N_SHAPES][128];

static int setup(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    if (!data) return -1;
    char path[1024];
    snprintf(path, sizeof path, "%s/qwen3moe-v2048/config.json", data);
    for (size_t i = 0; i < N_SHAPES; i++) {
        json_error_t je;
        json_t *c = json_load_file(path, 0, &je), *ed = json_loads(shapes[i].edits, 0, &je);
        if (!c || !ed) return -1;
        json_object_update(c, ed);
        snprintf(cfg_dirs[i], sizeof cfg_dirs[i], "/tmp/moeserve-ops-%d-%s", (int)getpid(),
                 shapes[i].name);
        mkdir(cfg_dirs[i], 0700);
        char out[1024];
        snprintf(out, sizeof out, "%s/config.json", cfg_dirs[i]);
        if (json_dump_file(c, out, JSON_INDENT(1))) return -1;
        json_decref(c);
        json_decref(ed);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_SHAPES; i++) {
        char out[1024];
        snprintf(out, sizeof out, "%s/config.json", cfg_dirs[i]);
        unlink(out);
        rmdir(cfg_dirs[i]);
    }
    return 0;
}

// ---- the backends under test --------------------------------------------------

struct target {
    char name[64];
    enum backend_device device;
    const char *variant;
};

// Set by MOESERVE_TEST_DEVICE=cuda (tests/gpu/ registers this test again
// that way): only the CUDA backend is put against the reference.
static bool only_cuda;

// The CPU's kernel tables (the scalar one too: it must agree with itself
// across thread counts) and, when present, the other devices.
static int targets(struct target *t, int max)
{
    const char *v[8];
    int n = only_cuda ? 0 : backend_variants(BACKEND_DEVICE_CPU, v, 8), k = 0;
    for (int i = 0; i < n && k < max; i++, k++) {
        snprintf(t[k].name, sizeof t[k].name, "cpu/%s", v[i]);
        t[k].device = BACKEND_DEVICE_CPU;
        t[k].variant = v[i];
    }
    enum backend_device d;
    if (k < max && backend_device_resolve(BACKEND_DEVICE_CUDA, &d, NULL, 0, NULL, 0) == 0) {
        snprintf(t[k].name, sizeof t[k].name, "cuda");
        t[k].device = BACKEND_DEVICE_CUDA;
        t[k].variant = NULL;
        k++;
    }
    return k;
}

// One side of a comparison: a backend and the model's weights on it.
struct side {
    struct backend *b;
    struct backend_weights *w;
};

static struct model *model_of(size_t shape)
{
    struct model *m;
    char err[512];
    const struct model_load_opts o = {.format = LOAD_FORMAT_DUMMY, .seed = 11,
                                      .quantization = shapes[shape].quant, .cache_dir = "none"};
    if (model_load_opts(cfg_dirs[shape], &o, &m, err, sizeof err))
        fail_msg("%s: %s", shapes[shape].name, err);
    assert_int_equal(m->quant, shapes[shape].quant);
    return m;
}

static void side_open(struct side *s, enum backend_device d, const char *variant, int threads,
                      const struct model *m)
{
    char err[512];
    struct backend_opts bo = {.n_threads = threads, .variant = variant};
    if (backend_create(d, &bo, &s->b, err, sizeof err)) fail_msg("%s", err);
    if (s->b->ops->prepare_weights(s->b, m, 0, m->cfg.n_experts, &s->w)) fail_msg("%s", s->b->err);
}

static void side_close(struct side *s)
{
    s->b->ops->release_weights(s->b, s->w);
    backend_destroy(s->b);
}

// Backend memory holding a copy of host data (or zeros when src is NULL).
static void *dev(struct side *s, const void *src, size_t bytes)
{
    void *p;
    if (s->b->ops->alloc(s->b, bytes ? bytes : 1, &p)) fail_msg("%s", s->b->err);
    if (src && bytes) assert_int_equal(s->b->ops->upload(s->b, p, src, bytes), 0);
    return p;
}

static void *host(struct side *s, const void *p, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    if (bytes) assert_int_equal(s->b->ops->download(s->b, h, p, bytes), 0);
    return h;
}

static void release(struct side *s, void *p) { s->b->ops->free(s->b, p); }

static uint64_t rng_state = 88172645463325252ull;

static float frand(void) // [-1, 1)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

static int irand(int n) { return (int)((frand() + 1.0f) * 0.5f * (float)n) % n; }

static float *frand_array(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof *a);
    assert_non_null(a);
    for (size_t i = 0; i < n; i++) a[i] = frand();
    return a;
}

// |got - want| within tol of the reference's magnitude.
static void assert_close_tol(const char *what, const char *who, const float *got, const float *want,
                             size_t n, double tol)
{
    double scale = 1e-3;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (size_t i = 0; i < n; i++) {
        bool both_nan = isnan(got[i]) && isnan(want[i]);
        if (!both_nan && !(fabs((double)got[i] - want[i]) <= tol * scale))
            fail_msg("%s on %s: element %zu is %.9g, the reference %.9g", what, who, i,
                     (double)got[i], (double)want[i]);
    }
}

static void assert_close(const char *what, const char *who, const float *got, const float *want,
                         size_t n)
{
    assert_close_tol(what, who, got, want, n, TOL);
}

// ---- the op tests: each runs the reference and one target on the same inputs ---

struct pair {
    struct side ref, t;
    const struct model *m;
    const char *who;
};

static void embed_gathers_rows(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int counts[] = {0, 1, 17};
    for (size_t ci = 0; ci < 3; ci++) {
        const int n = counts[ci];
        int32_t ids[17];
        for (int i = 0; i < n; i++) ids[i] = i == 0 ? c->vocab_size - 1 : irand(c->vocab_size);
        const size_t xb = (size_t)(n ? n : 1) * c->hidden_size * sizeof(float);
        struct side *s[2] = {&p->ref, &p->t};
        float *out[2];
        for (int k = 0; k < 2; k++) {
            int32_t *d_ids = dev(s[k], ids, (size_t)n * sizeof *ids);
            float *x = dev(s[k], NULL, xb);
            assert_int_equal(s[k]->b->ops->embed(s[k]->b, s[k]->w, d_ids, n, x), 0);
            out[k] = host(s[k], x, xb);
            release(s[k], d_ids);
            release(s[k], x);
        }
        assert_memory_equal(out[0], out[1], xb);
        free(out[0]);
        free(out[1]);
    }
}

static void rmsnorm_normalises_gathered_rows(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int H = c->hidden_size, ldx = H + 5, n_rows = 33;
    float *x = frand_array((size_t)n_rows * ldx);
    int32_t rows[33];
    for (int i = 0; i < n_rows; i++) rows[i] = (i * 7) % n_rows;
    const int counts[] = {0, 1, 5, 33};
    for (size_t ci = 0; ci < 4; ci++) {
        const int n = counts[ci];
        for (int gathered = 0; gathered < 2; gathered++) {
            struct side *s[2] = {&p->ref, &p->t};
            float *out[2];
            for (int k = 0; k < 2; k++) {
                float *dx = dev(s[k], x, (size_t)n_rows * ldx * sizeof *x);
                int32_t *dr = dev(s[k], rows, sizeof rows);
                float *o = dev(s[k], NULL, (size_t)n_rows * H * sizeof *o);
                const struct backend_mat *w = &s[k]->w->layers[0].attn_norm;
                assert_int_equal(s[k]->b->ops->rmsnorm(s[k]->b, dx, (size_t)ldx,
                                                       gathered ? dr : NULL, n, w,
                                                       c->rms_norm_eps, o), 0);
                out[k] = host(s[k], o, (size_t)n_rows * H * sizeof *o);
                release(s[k], dx);
                release(s[k], dr);
                release(s[k], o);
            }
            assert_close("rmsnorm", p->who, out[1], out[0], (size_t)n_rows * H);
            free(out[0]);
            free(out[1]);
        }
    }
    free(x);
}

// Dense projections: whole matrices and output slices (on and off the
// 16-row grid), gathered and scattered rows, accumulation.
static void matmul_matches_at_every_row_count(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int H = c->hidden_size, maxr = 40;
    const int Q = c->n_heads * c->head_dim;
    float *x = frand_array((size_t)maxr * H), *y0 = frand_array((size_t)maxr * c->vocab_size);
    int32_t xr[40], yr[40];
    for (int i = 0; i < maxr; i++) {
        xr[i] = (i * 11) % maxr;
        yr[i] = maxr - 1 - i;
    }
    const int row_counts[] = {0, 1, 3, 16, 17, 40};
    for (size_t ri = 0; ri < 6; ri++) {
        for (int variant = 0; variant < 4; variant++) {
            const int rows = row_counts[ri];
            struct side *s[2] = {&p->ref, &p->t};
            float *out[2];
            const bool head = variant == 3;
            const int outs = head ? c->vocab_size : Q;
            const size_t yb = (size_t)maxr * outs * sizeof(float);
            for (int k = 0; k < 2; k++) {
                float *dx = dev(s[k], x, (size_t)maxr * H * sizeof *x);
                float *dy = dev(s[k], y0, yb);
                int32_t *dxr = dev(s[k], xr, sizeof xr), *dyr = dev(s[k], yr, sizeof yr);
                struct backend_mm j = {.w = head ? &s[k]->w->lm_head : &s[k]->w->layers[0].wq,
                                       .x = dx, .ldx = (size_t)H, .y = dy, .ldy = (size_t)outs,
                                       .rows = rows};
                if (variant == 1) j.x_rows = dxr, j.y_rows = dyr, j.accumulate = true;
                if (variant == 2) j.o0 = 16, j.n_out = Q - 16 - 3; // a slice ending off the grid
                if (head) j.o0 = 32, j.n_out = outs - 32 - 5, j.y = dy + 32; // a vocabulary slice
                assert_int_equal(s[k]->b->ops->matmul(s[k]->b, &j, 1), 0);
                out[k] = host(s[k], dy, yb);
                release(s[k], dx);
                release(s[k], dy);
                release(s[k], dxr);
                release(s[k], dyr);
            }
            assert_close_tol("matmul", p->who, out[1], out[0], yb / sizeof(float), mm_tol);
            free(out[0]);
            free(out[1]);
        }
    }
    free(x);
    free(y0);
}

// Experts as groups: empty groups, one row, many rows; gate and up in one
// call, then down scattered back through row lists.
static void grouped_matmul_runs_each_group_on_its_rows(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int E = c->n_experts, H = c->hidden_size, F = c->moe_intermediate_size;
    int32_t off[65] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (e % 3 == 1 ? 0 : e % 3 == 2 ? 1 : 1 + e);
    const int rows = off[E];
    float *x = frand_array((size_t)rows * H);
    int32_t perm[512];
    for (int i = 0; i < rows; i++) perm[i] = (i * 5 + 3) % rows;
    struct side *s[2] = {&p->ref, &p->t};
    float *g[2], *y[2];
    for (int k = 0; k < 2; k++) {
        const struct backend_layer *L = &s[k]->w->layers[0];
        float *dx = dev(s[k], x, (size_t)rows * H * sizeof *x);
        float *dg = dev(s[k], NULL, (size_t)rows * F * sizeof(float));
        float *du = dev(s[k], NULL, (size_t)rows * F * sizeof(float));
        float *dy = dev(s[k], NULL, (size_t)rows * H * sizeof(float));
        int32_t *doff = dev(s[k], off, (size_t)(E + 1) * sizeof *off);
        int32_t *dp = dev(s[k], perm, (size_t)rows * sizeof *perm);
        const struct backend_gmm gu[2] = {
            {.w = L->expert_gate, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows,
             .x = dx, .ldx = (size_t)H, .x_rows = dp, .y = dg, .ldy = (size_t)F},
            {.w = L->expert_up, .n_groups = E, .off = doff, .h_off = NULL, .max_rows = rows,
             .x = dx, .ldx = (size_t)H, .y = du, .ldy = (size_t)F},
        };
        assert_int_equal(s[k]->b->ops->grouped_matmul(s[k]->b, gu, 2), 0);
        const struct backend_gmm down = {.w = L->expert_down, .n_groups = E, .off = doff,
                                         .h_off = off, .max_rows = rows, .x = dg,
                                         .ldx = (size_t)F, .y = dy, .ldy = (size_t)H,
                                         .y_rows = dp};
        assert_int_equal(s[k]->b->ops->grouped_matmul(s[k]->b, &down, 1), 0);
        g[k] = host(s[k], du, (size_t)rows * F * sizeof(float));
        y[k] = host(s[k], dy, (size_t)rows * H * sizeof(float));
        release(s[k], dx);
        release(s[k], dg);
        release(s[k], du);
        release(s[k], dy);
        release(s[k], doff);
        release(s[k], dp);
    }
    assert_close_tol("grouped matmul (up)", p->who, g[1], g[0], (size_t)rows * F, mm_tol);
    assert_close_tol("grouped matmul (down, scattered)", p->who, y[1], y[0], (size_t)rows * H, mm_tol);
    for (int k = 0; k < 2; k++) {
        free(g[k]);
        free(y[k]);
    }
    free(x);
}

// ---- act-order matrices -----------------------------------------------------------------

// A shuffle of 0..n-1 into p.
static void shuffle(int32_t *p, int n)
{
    for (int i = 0; i < n; i++) p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = irand(i + 1);
        const int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

// dst row r (rows, n) = src row (rows_of ? rows_of[r] : r) (ld apart), its
// inputs in order: what a matmul of a matrix with that order reads.
static float *gather_in_order(const float *src, size_t ld, const int32_t *rows_of, int rows, const int32_t *order,
                              int n)
{
    float *d = malloc((size_t)(rows ? rows : 1) * n * sizeof *d);
    assert_non_null(d);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) d[(size_t)r * n + j] = src[(size_t)(rows_of ? rows_of[r] : r) * ld + order[j]];
    return d;
}

// Side k's matmul of wq (given order) over rows of x picked by xr, and the
// same matmul of wq as it is over x gathered into that order on the host:
// the same bits. Returns the first's output, or NULL where the backend
// refuses matrices with an order (the CUDA one, with its sentence).
static float *ordered_matmul(struct side *s, const float *x, const int32_t *xr, int rows, const int32_t *order)
{
    const struct model_config *c = s->w->cfg;
    const int H = c->hidden_size, Q = c->n_heads * c->head_dim;
    const size_t yb = (size_t)(rows ? rows : 1) * Q * sizeof(float);
    float *dx = dev(s, x, (size_t)40 * H * sizeof *x), *dy = dev(s, NULL, yb), *dy2 = dev(s, NULL, yb);
    int32_t *dxr = dev(s, xr, (size_t)40 * sizeof *xr), *dord = dev(s, order, (size_t)H * sizeof *order);
    float *xg = gather_in_order(x, (size_t)H, xr, rows, order, H);
    float *dxg = dev(s, xg, (size_t)(rows ? rows : 1) * H * sizeof *xg);
    struct backend_mat w = s->w->layers[0].wq;
    w.perm = dord;
    const struct backend_mm a = {.w = &w, .x = dx, .ldx = (size_t)H, .x_rows = dxr, .y = dy, .ldy = (size_t)Q,
                                 .rows = rows};
    const struct backend_mm b = {.w = &s->w->layers[0].wq, .x = dxg, .ldx = (size_t)H, .y = dy2,
                                 .ldy = (size_t)Q, .rows = rows};
    float *out = NULL;
    const int rc = s->b->ops->matmul(s->b, &a, 1);
    if (rc) {
        assert_int_equal(rc, MS_EUNSUPPORTED);
        assert_non_null(strstr(s->b->err, "act-order"));
    } else {
        assert_int_equal(s->b->ops->matmul(s->b, &b, 1), 0);
        out = host(s, dy, yb);
        float *plain = host(s, dy2, yb);
        assert_memory_equal(out, plain, yb);
        free(plain);
    }
    free(xg);
    release(s, dx);
    release(s, dy);
    release(s, dy2);
    release(s, dxr);
    release(s, dord);
    release(s, dxg);
    return out;
}

// The orders' grouped matmuls of ordered experts on side s (gate and up
// over xs's rows through rowp, down over the gate's output): out[0..2] the
// gate's, up's and down's outputs, each checked against the same matmuls
// without orders over inputs gathered here.
struct grouped_orders {
    int E, H, F, rows;
    const int32_t *off, *rowp, *og, *ou, *od;
    const float *xs;
};

static void ordered_grouped(struct side *s, const struct grouped_orders *q, const char *who, float *out[3])
{
    const int E = q->E, H = q->H, F = q->F, rows = q->rows;
    const int32_t *off = q->off, *rowp = q->rowp, *og = q->og, *ou = q->ou, *od = q->od;
    const float *xs = q->xs;
    const struct backend_layer *L = &s->w->layers[0];
    struct backend_mat *wg = malloc((size_t)E * 3 * sizeof *wg), *wu = wg + E, *wd = wu + E;
    assert_non_null(wg);
    int32_t *dog = dev(s, og, (size_t)E * H * 4), *dou = dev(s, ou, (size_t)E * H * 4);
    int32_t *dod = dev(s, od, (size_t)E * F * 4);
    for (int e = 0; e < E; e++) {
        wg[e] = L->expert_gate[e];
        wg[e].perm = dog + (size_t)e * H;
        // The even experts' up share the gate's order, as its pointer.
        wu[e] = L->expert_up[e];
        wu[e].perm = e % 2 ? dou + (size_t)e * H : wg[e].perm;
        wd[e] = L->expert_down[e];
        wd[e].perm = dod + (size_t)e * F;
    }
    float *dx = dev(s, xs, (size_t)rows * H * sizeof *xs);
    int32_t *doff = dev(s, off, (size_t)(E + 1) * sizeof *off), *dr = dev(s, rowp, (size_t)rows * 4);
    float *dg = dev(s, NULL, (size_t)rows * F * 4), *du = dev(s, NULL, (size_t)rows * F * 4);
    float *dy = dev(s, NULL, (size_t)rows * H * 4);
    const struct backend_gmm gu[2] = {
        {.w = wg, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows, .x = dx, .ldx = (size_t)H,
         .x_rows = dr, .y = dg, .ldy = (size_t)F},
        {.w = wu, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows, .x = dx, .ldx = (size_t)H,
         .x_rows = dr, .y = du, .ldy = (size_t)F},
    };
    assert_int_equal(s->b->ops->grouped_matmul(s->b, gu, 2), 0);
    const struct backend_gmm down = {.w = wd, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows,
                                     .x = dg, .ldx = (size_t)F, .y = dy, .ldy = (size_t)H};
    assert_int_equal(s->b->ops->grouped_matmul(s->b, &down, 1), 0);
    out[0] = host(s, dg, (size_t)rows * F * 4);
    out[1] = host(s, du, (size_t)rows * F * 4);
    out[2] = host(s, dy, (size_t)rows * H * 4);
    // The same without orders, over inputs gathered here group by group.
    float *xg = malloc((size_t)rows * H * 4), *xu = malloc((size_t)rows * H * 4);
    float *xd = malloc((size_t)rows * F * 4);
    assert_true(xg && xu && xd);
    for (int e = 0; e < E; e++)
        for (int i = off[e]; i < off[e + 1]; i++)
            for (int j = 0; j < H; j++) {
                xg[(size_t)i * H + j] = xs[(size_t)rowp[i] * H + og[(size_t)e * H + j]];
                xu[(size_t)i * H + j] = xs[(size_t)rowp[i] * H + ou[(size_t)e * H + j]];
                if (j < F) xd[(size_t)i * F + j] = out[0][(size_t)i * F + od[(size_t)e * F + j]];
            }
    float *dxg = dev(s, xg, (size_t)rows * H * 4), *dxu = dev(s, xu, (size_t)rows * H * 4);
    float *dxd = dev(s, xd, (size_t)rows * F * 4);
    const struct backend_gmm pg[3] = {
        {.w = L->expert_gate, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows, .x = dxg,
         .ldx = (size_t)H, .y = dg, .ldy = (size_t)F},
        {.w = L->expert_up, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows, .x = dxu,
         .ldx = (size_t)H, .y = du, .ldy = (size_t)F},
        {.w = L->expert_down, .n_groups = E, .off = doff, .h_off = off, .max_rows = rows, .x = dxd,
         .ldx = (size_t)F, .y = dy, .ldy = (size_t)H},
    };
    assert_int_equal(s->b->ops->grouped_matmul(s->b, pg, 3), 0);
    float *plain[3] = {host(s, dg, (size_t)rows * F * 4), host(s, du, (size_t)rows * F * 4),
                       host(s, dy, (size_t)rows * H * 4)};
    const size_t n[3] = {(size_t)rows * F, (size_t)rows * F, (size_t)rows * H};
    for (int i = 0; i < 3; i++) {
        if (memcmp(plain[i], out[i], n[i] * 4))
            fail_msg("grouped matmul in input orders (%s) on %s: not the bits of the gathered inputs'",
                     i == 0 ? "gate" : i == 1 ? "up" : "down", who);
        free(plain[i]);
    }
    free(xg);
    free(xu);
    free(xd);
    void *bufs[] = {dog, dou, dod, dx, doff, dr, dg, du, dy, dxg, dxu, dxd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) release(s, bufs[i]);
    free(wg);
}

// Act-order checkpoints' matrices (backend_mat.perm): a matmul reads x
// through its matrix's input order, giving the bits a matmul of the matrix
// without one gives over x gathered into that order first, at 1, 17 and 40
// rows through a row list; grouped, with an order per expert, the gate and
// up of even experts sharing one (as act-order checkpoints have them) and
// odd ones each their own, and down's orders over the intermediate width.
// Each against the reference too. The CUDA backend refuses them.
static void matmul_reads_inputs_in_the_matrix_order(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int H = c->hidden_size, Q = c->n_heads * c->head_dim, E = c->n_experts, F = c->moe_intermediate_size;
    float *x = frand_array((size_t)40 * H);
    int32_t xr[40], *order = malloc((size_t)H * sizeof *order);
    assert_non_null(order);
    for (int i = 0; i < 40; i++) xr[i] = (i * 7 + 3) % 40;
    shuffle(order, H);
    const int row_counts[] = {1, 17, 40};
    for (int ri = 0; ri < 3; ri++) {
        float *got = ordered_matmul(&p->t, x, xr, row_counts[ri], order);
        if (!got) goto done; // refused, with the sentence
        float *want = ordered_matmul(&p->ref, x, xr, row_counts[ri], order);
        assert_close_tol("matmul in an input order", p->who, got, want, (size_t)row_counts[ri] * Q, mm_tol);
        free(got);
        free(want);
    }

    int32_t off[65] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (e % 3 == 1 ? 0 : e % 3 == 2 ? 1 : 2 + e);
    const int rows = off[E];
    int32_t rowp[512];
    for (int i = 0; i < rows; i++) rowp[i] = (i * 5 + 3) % rows;
    float *xs = frand_array((size_t)rows * H);
    int32_t *og = malloc((size_t)E * H * sizeof *og), *ou = malloc((size_t)E * H * sizeof *ou);
    int32_t *od = malloc((size_t)E * F * sizeof *od);
    assert_true(og && ou && od);
    for (int e = 0; e < E; e++) {
        shuffle(og + (size_t)e * H, H);
        if (e % 2) shuffle(ou + (size_t)e * H, H);
        else memcpy(ou + (size_t)e * H, og + (size_t)e * H, (size_t)H * sizeof *ou);
        shuffle(od + (size_t)e * F, F);
    }
    struct side *s[2] = {&p->ref, &p->t};
    float *res[2][3];
    const struct grouped_orders q = {.E = E, .H = H, .F = F, .rows = rows, .off = off, .rowp = rowp,
                                     .og = og, .ou = ou, .od = od, .xs = xs};
    for (int k = 0; k < 2; k++) ordered_grouped(s[k], &q, k ? p->who : "the reference", res[k]);
    // A CPU backend copying a row or so at a time (every gather split by
    // rows into batches of their own) gives the same bits.
    if (p->t.b->device == BACKEND_DEVICE_CPU) {
        const size_t was = backend_cpu_set_gather_floats(p->t.b, (size_t)H + H / 2);
        float *small[3];
        ordered_grouped(&p->t, &q, p->who, small);
        for (int i = 0; i < 3; i++) {
            if (memcmp(small[i], res[1][i], (size_t)rows * (i == 2 ? H : F) * 4))
                fail_msg("grouped matmul in input orders on %s: other bits when gathered a row at a time", p->who);
            free(small[i]);
        }
        float *one = ordered_matmul(&p->t, x, xr, 40, order);
        backend_cpu_set_gather_floats(p->t.b, was);
        float *all = ordered_matmul(&p->t, x, xr, 40, order);
        assert_memory_equal(one, all, (size_t)40 * Q * sizeof *one);
        free(one);
        free(all);
    }
    assert_close_tol("grouped matmul in input orders (gate)", p->who, res[1][0], res[0][0], (size_t)rows * F, mm_tol);
    assert_close_tol("grouped matmul in input orders (up)", p->who, res[1][1], res[0][1], (size_t)rows * F, mm_tol);
    assert_close_tol("grouped matmul in input orders (down)", p->who, res[1][2], res[0][2], (size_t)rows * H, mm_tol);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) free(res[k][i]);
    free(xs);
    free(og);
    free(ou);
    free(od);
done:
    free(x);
    free(order);
}

// The step layout of three sequences: a prefill from 0, a decode crossing
// into a new KV block, and a chunk straddling a block boundary.
struct step_spec {
    int n_seqs;
    int n_past[3], n_new[3];
};

struct step_dev {
    struct backend_step s;
    int32_t *buf; // backend memory holding every array
    int32_t h[4096];
};

static void step_make(struct side *sd, const struct step_spec *sp, struct step_dev *st)
{
    int32_t *h = st->h;
    int T = 0, nb = 0, at = 0, max_ctx = 0;
    for (int q = 0; q < sp->n_seqs; q++) T += sp->n_new[q];
    int32_t *tok_pos = h + at; at += T;
    int32_t *tok_seq = h + at; at += T;
    int32_t *seq_start = h + at; at += sp->n_seqs + 1;
    int32_t *bt_start = h + at; at += sp->n_seqs + 1;
    int32_t *bt = h + at;
    int t = 0;
    for (int q = 0; q < sp->n_seqs; q++) {
        seq_start[q] = t;
        bt_start[q] = nb;
        const int ctx = sp->n_past[q] + sp->n_new[q], blocks = (ctx + 15) / 16;
        if (ctx > max_ctx) max_ctx = ctx;
        // Block ids interleaved and descending: tables are never the identity
        // (but for a lone long sequence, which takes the pool's blocks in order).
        for (int b = 0; b < blocks; b++) bt[nb++] = sp->n_seqs == 1 ? b : 40 - (b * 3 + q);
        for (int i = 0; i < sp->n_new[q]; i++, t++) {
            tok_pos[t] = sp->n_past[q] + i;
            tok_seq[t] = q;
        }
    }
    seq_start[sp->n_seqs] = t;
    bt_start[sp->n_seqs] = nb;
    at += nb;
    st->buf = dev(sd, h, (size_t)at * sizeof *h);
    const ptrdiff_t o_pos = tok_pos - h, o_seq = tok_seq - h, o_ss = seq_start - h,
                    o_bs = bt_start - h, o_bt = bt - h;
    st->s = (struct backend_step){.n_tokens = T, .n_seqs = sp->n_seqs, .max_ctx = max_ctx,
                                  .tok_pos = st->buf + o_pos, .tok_seq = st->buf + o_seq,
                                  .seq_start = st->buf + o_ss, .bt_start = st->buf + o_bs,
                                  .bt = st->buf + o_bt, .h_tok_pos = tok_pos, .h_tok_seq = tok_seq,
                                  .h_seq_start = seq_start, .h_bt_start = bt_start, .h_bt = bt};
}

// q/k norm + RoPE + the KV store, then attention, over two steps (the first
// fills the positions the second attends to), in both KV dtypes; the K and
// V pools must hold the same bytes, layer 1 untouched.
static void attention_over_paged_kv_matches(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    const struct step_spec first = {3, {0, 0, 0}, {20, 31, 15}};
    const struct step_spec second = {3, {20, 31, 15}, {5, 1, 17}};
    const enum dtype dts[] = {DTYPE_F32, DTYPE_BF16};
    for (int di = 0; di < 2; di++) {
        struct side *s[2] = {&p->ref, &p->t};
        struct kv_pool *kv[2];
        float *qo[2], *ko[2], *ao[2];
        void *kk[2], *vv[2];
        size_t kvb = 0;
        int T = 0;
        for (int k = 0; k < 2; k++) {
            char err[256];
            assert_int_equal(kv_pool_create(s[k]->b, c, dts[di], 48, &kv[k], err, sizeof err), 0);
            kvb = kv[k]->layer_elems * (size_t)c->n_layers * dtype_size(dts[di]);
            rng_state = 12345; // the same inputs on both sides
            for (int stepi = 0; stepi < 2; stepi++) {
                struct step_dev st;
                step_make(s[k], stepi ? &second : &first, &st);
                T = st.s.n_tokens;
                float *q = frand_array((size_t)T * H * D), *kn = frand_array((size_t)T * KVH * D);
                float *v = frand_array((size_t)T * KVH * D);
                float *dq = dev(s[k], q, (size_t)T * H * D * sizeof *q);
                float *dk = dev(s[k], kn, (size_t)T * KVH * D * sizeof *kn);
                float *dv = dev(s[k], v, (size_t)T * KVH * D * sizeof *v);
                float *dout = dev(s[k], NULL, (size_t)T * H * D * sizeof(float));
                assert_int_equal(s[k]->b->ops->qk_norm_rope_store(s[k]->b, s[k]->w, 0, &st.s,
                                                                  kv[k], dq, dk, dv), 0);
                assert_int_equal(s[k]->b->ops->attention(s[k]->b, s[k]->w, 0, &st.s, kv[k], dq,
                                                         dout), 0);
                if (stepi == 1) {
                    qo[k] = host(s[k], dq, (size_t)T * H * D * sizeof(float));
                    ko[k] = host(s[k], dk, (size_t)T * KVH * D * sizeof(float));
                    ao[k] = host(s[k], dout, (size_t)T * H * D * sizeof(float));
                }
                release(s[k], dq);
                release(s[k], dk);
                release(s[k], dv);
                release(s[k], dout);
                release(s[k], st.buf);
                free(q);
                free(kn);
                free(v);
            }
            kk[k] = host(s[k], kv[k]->k, kvb);
            vv[k] = host(s[k], kv[k]->v, kvb);
        }
        assert_close("q norm + rope", p->who, qo[1], qo[0], (size_t)T * H * D);
        assert_close("k norm + rope", p->who, ko[1], ko[0], (size_t)T * KVH * D);
        assert_close("attention", p->who, ao[1], ao[0], (size_t)T * H * D);
        if (dts[di] == DTYPE_F32) {
            assert_close("K pool", p->who, kk[1], kk[0], kvb / 4);
            assert_close("V pool", p->who, vv[1], vv[0], kvb / 4);
        } else {
            // Values are stored exactly; keys are normed and rotated
            // (arithmetic), so compare them within one bf16 step.
            assert_memory_equal(vv[1], vv[0], kvb);
            const uint16_t *a = kk[1], *b = kk[0];
            for (size_t i = 0; i < kvb / 2; i++)
                if (abs((int)a[i] - (int)b[i]) > 1)
                    fail_msg("K pool (bf16) on %s: element %zu differs by more than a step", p->who, i);
        }
        // Only layer 0 was written: the rest of the pool is still zero.
        const size_t l0 = kv[0]->layer_elems * dtype_size(dts[di]);
        for (size_t i = l0; i < kvb; i++) assert_int_equal(((uint8_t *)kk[1])[i], 0);
        for (int k = 0; k < 2; k++) {
            kv_pool_destroy(s[k]->b, kv[k]);
            free(qo[k]);
            free(ko[k]);
            free(ao[k]);
            free(kk[k]);
            free(vv[k]);
        }
    }
}

// Fills a bf16 pool's K and V with NaN, as slots hold whatever their
// previous owner wrote: a backend must never read past a row's context.
static void kv_poison(struct side *s, const struct kv_pool *kv)
{
    assert_int_equal(kv->dtype, DTYPE_BF16);
    const size_t n = kv->layer_elems * (size_t)kv->n_layers;
    uint16_t *nan16 = malloc(n * sizeof *nan16);
    assert_non_null(nan16);
    for (size_t i = 0; i < n; i++) nan16[i] = 0x7fc0;
    assert_int_equal(s->b->ops->upload(s->b, kv->k, nan16, n * sizeof *nan16), 0);
    assert_int_equal(s->b->ops->upload(s->b, kv->v, nan16, n * sizeof *nan16), 0);
    free(nan16);
}

// Decode steps (one new token per sequence: a device plans them item by
// item, and splits a long context over CTAs) after a prefill that wrote
// their contexts: three short sequences, and one of 700 positions (three
// 256-position chunks, split on a GPU). The pool starts as NaN, so a read
// of a slot past a row's context shows.
static void decode_attention_matches(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    const struct step_spec steps[2][2] = {
        {{3, {0, 0, 0}, {20, 31, 15}}, {3, {20, 31, 15}, {1, 1, 1}}},
        {{1, {0}, {700}}, {1, {700}, {1}}},
    };
    for (int sc = 0; sc < 2; sc++) {
        struct side *s[2] = {&p->ref, &p->t};
        float *ao[2];
        int T = 0;
        for (int k = 0; k < 2; k++) {
            char err[256];
            struct kv_pool *kv;
            assert_int_equal(kv_pool_create(s[k]->b, c, DTYPE_BF16, 48, &kv, err, sizeof err), 0);
            kv_poison(s[k], kv);
            rng_state = 777; // the same inputs on both sides
            for (int stepi = 0; stepi < 2; stepi++) {
                struct step_dev st;
                step_make(s[k], &steps[sc][stepi], &st);
                T = st.s.n_tokens;
                float *q = frand_array((size_t)T * H * D), *kn = frand_array((size_t)T * KVH * D);
                float *v = frand_array((size_t)T * KVH * D);
                float *dq = dev(s[k], q, (size_t)T * H * D * sizeof *q);
                float *dk = dev(s[k], kn, (size_t)T * KVH * D * sizeof *kn);
                float *dv = dev(s[k], v, (size_t)T * KVH * D * sizeof *v);
                float *dout = dev(s[k], NULL, (size_t)T * H * D * sizeof(float));
                assert_int_equal(s[k]->b->ops->qk_norm_rope_store(s[k]->b, s[k]->w, 0, &st.s, kv,
                                                                  dq, dk, dv), 0);
                assert_int_equal(s[k]->b->ops->attention(s[k]->b, s[k]->w, 0, &st.s, kv, dq,
                                                         dout), 0);
                if (stepi == 1) ao[k] = host(s[k], dout, (size_t)T * H * D * sizeof(float));
                void *all[] = {dq, dk, dv, dout, st.buf};
                for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(s[k], all[i]);
                free(q);
                free(kn);
                free(v);
            }
            kv_pool_destroy(s[k]->b, kv);
        }
        for (size_t i = 0; i < (size_t)T * H * D; i++)
            if (!isfinite(ao[0][i]) || !isfinite(ao[1][i]))
                fail_msg("decode attention on %s: output %zu read a slot past its context", p->who, i);
        assert_close("decode attention", p->who, ao[1], ao[0], (size_t)T * H * D);
        free(ao[0]);
        free(ao[1]);
    }
}

// Router top-k (ties to the lowest id), the routing sort, silu-mul, the
// gather and the combine in top-k order.
static void moe_pieces_match(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int E = c->n_experts, K = c->n_experts_per_tok, H = c->hidden_size;
    const int counts[] = {0, 1, 7};
    for (size_t ci = 0; ci < 3; ci++) {
        const int n = counts[ci], P = n * K;
        float *logits = frand_array((size_t)(n ? n : 1) * E);
        if (n > 1) logits[E + 2] = logits[E + 3] = 5.0f; // a tie at the top of row 1
        float *x = frand_array((size_t)(n ? n : 1) * H), *eo = frand_array((size_t)(P ? P : 1) * H);
        float *g = frand_array(5000), *u = frand_array(5000);
        struct side *s[2] = {&p->ref, &p->t};
        int32_t *ids[2], *off[2], *slot[2], *tok[2];
        float *w[2], *xo[2], *go[2], *ga[2];
        for (int k = 0; k < 2; k++) {
            struct backend *b = s[k]->b;
            float *dl = dev(s[k], logits, (size_t)n * E * sizeof(float));
            int32_t *di = dev(s[k], NULL, (size_t)P * sizeof(int32_t));
            float *dw = dev(s[k], NULL, (size_t)P * sizeof(float));
            assert_int_equal(b->ops->router_topk(b, dl, n, E, K, c->norm_topk_prob, di, dw), 0);
            int32_t *doff = dev(s[k], NULL, (size_t)(E + 1) * sizeof(int32_t));
            int32_t *dslot = dev(s[k], NULL, (size_t)P * sizeof(int32_t));
            int32_t *dtok = dev(s[k], NULL, (size_t)P * sizeof(int32_t));
            const struct backend_route rt = {.ids = di, .n_tokens = n, .k = K, .e0 = 0, .e1 = E,
                                             .pad = 1, .off = doff, .slot = dslot, .token = dtok};
            assert_int_equal(b->ops->moe_route(b, &rt), 0);
            float *dx = dev(s[k], x, (size_t)n * H * sizeof(float));
            float *deo = dev(s[k], eo, (size_t)P * H * sizeof(float));
            assert_int_equal(b->ops->moe_combine(b, dx, deo, dslot, dw, n, K, H), 0);
            float *dg = dev(s[k], g, 5000 * sizeof(float)), *du = dev(s[k], u, 5000 * sizeof(float));
            assert_int_equal(b->ops->silu_mul(b, dg, du, 4999), 0);
            float *dga = dev(s[k], NULL, (size_t)P * H * sizeof(float));
            assert_int_equal(b->ops->gather_rows(b, dx, (size_t)H, dtok, P, H, dga), 0);
            ids[k] = host(s[k], di, (size_t)P * sizeof(int32_t));
            w[k] = host(s[k], dw, (size_t)P * sizeof(float));
            off[k] = host(s[k], doff, (size_t)(E + 1) * sizeof(int32_t));
            slot[k] = host(s[k], dslot, (size_t)P * sizeof(int32_t));
            tok[k] = host(s[k], dtok, (size_t)P * sizeof(int32_t));
            xo[k] = host(s[k], dx, (size_t)n * H * sizeof(float));
            go[k] = host(s[k], dg, 5000 * sizeof(float));
            ga[k] = host(s[k], dga, (size_t)P * H * sizeof(float));
            void *all[] = {dl, di, dw, doff, dslot, dtok, dx, deo, dg, du, dga};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(s[k], all[i]);
        }
        if (P) assert_memory_equal(ids[1], ids[0], (size_t)P * sizeof(int32_t));
        if (n > 1) assert_int_equal(ids[0][K], 2); // the tie goes to the lower id
        assert_close("router weights", p->who, w[1], w[0], (size_t)P);
        assert_memory_equal(off[1], off[0], (size_t)(E + 1) * sizeof(int32_t));
        assert_int_equal(off[0][E], P);
        if (P) assert_memory_equal(slot[1], slot[0], (size_t)P * sizeof(int32_t));
        if (P) assert_memory_equal(tok[1], tok[0], (size_t)P * sizeof(int32_t));
        assert_close("moe combine", p->who, xo[1], xo[0], (size_t)n * H);
        assert_close("silu mul", p->who, go[1], go[0], 4999);
        assert_true(go[1][4999] == g[4999]); // past n: untouched
        assert_close("gather rows", p->who, ga[1], ga[0], (size_t)P * H);
        for (int k = 0; k < 2; k++) {
            free(ids[k]);
            free(w[k]);
            free(off[k]);
            free(slot[k]);
            free(tok[k]);
            free(xo[k]);
            free(go[k]);
            free(ga[k]);
        }
        free(logits);
        free(x);
        free(eo);
        free(g);
        free(u);
    }
}

// A layer's routing on the device, for several token counts, padded to 1,
// 8 and the target's own pad, over every expert and over a rank's range,
// with dead tokens: offsets, counts, slots and the row lists agree exactly
// with the reference (and so with fwd_plan_route). Then where each pair
// comes back in a fixed-size exchange, and the combine over those slots
// (skipping the dead) and over pair-ordered rows (slot NULL).
static void routing_pads_ranges_and_returns(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int E = c->n_experts, K = c->n_experts_per_tok, H = c->hidden_size;
    const int counts[] = {0, 1, 7, 40};
    const int32_t first[] = {0, E / 3, E - 1, E}; // three ranks' experts, the last owning one
    for (size_t ci = 0; ci < 4; ci++) {
        const int n = counts[ci], P = n * K;
        int32_t ids[40 * 8], live[40];
        for (int t = 0; t < n; t++) {
            live[t] = t % 4 != 3;
            for (int j = 0; j < K; j++) ids[t * K + j] = (t * 3 + j * 5 + (t % 2) * j) % E;
        }
        for (int cfgi = 0; cfgi < 6; cfgi++) {
            const int e0 = cfgi % 2 ? E / 3 : 0, e1 = cfgi % 2 ? E - 1 : E;
            const int pad = cfgi < 2 ? 1 : cfgi < 4 ? 8 : p->t.b->ops->route_pad(p->t.b, P, e1 - e0);
            const bool with_live = cfgi % 3 == 1;
            const int rows = fwd_plan_route_rows(P, e1 - e0, pad), G = e1 - e0;
            struct side *s[2] = {&p->ref, &p->t};
            int32_t *h[2][6];
            float *xo[2][2];
            float *x = frand_array((size_t)(n ? n : 1) * H), *w = frand_array((size_t)(P ? P : 1));
            float *eo = frand_array((size_t)(3 * (P ? P : 1)) * H);
            for (int k = 0; k < 2; k++) {
                struct backend *b = s[k]->b;
                int32_t *di = dev(s[k], ids, (size_t)P * sizeof *ids);
                int32_t *dl = dev(s[k], live, (size_t)n * sizeof *live);
                int32_t *doff = dev(s[k], NULL, (size_t)(G + 1) * sizeof(int32_t));
                int32_t *dcnt = dev(s[k], NULL, (size_t)(G ? G : 1) * sizeof(int32_t));
                int32_t *dslot = dev(s[k], NULL, (size_t)(P ? P : 1) * sizeof(int32_t));
                int32_t *dtok = dev(s[k], NULL, (size_t)(rows ? rows : 1) * sizeof(int32_t));
                int32_t *dpair = dev(s[k], NULL, (size_t)(rows ? rows : 1) * sizeof(int32_t));
                int32_t *dhome = dev(s[k], NULL, (size_t)(P ? P : 1) * sizeof(int32_t));
                const struct backend_route rt = {
                    .ids = di, .live = with_live ? dl : NULL, .n_tokens = n, .k = K, .e0 = e0,
                    .e1 = e1, .pad = pad, .off = doff, .count = dcnt, .slot = dslot, .token = dtok,
                    .pair = dpair};
                assert_int_equal(b->ops->moe_route(b, &rt), 0);
                assert_int_equal(b->ops->moe_return_slots(b, di, with_live ? dl : NULL, n, K, first,
                                                          3, P, dhome), 0);
                h[k][0] = host(s[k], doff, (size_t)(G + 1) * sizeof(int32_t));
                h[k][1] = host(s[k], dcnt, (size_t)G * sizeof(int32_t));
                h[k][2] = host(s[k], dslot, (size_t)P * sizeof(int32_t));
                h[k][5] = host(s[k], dhome, (size_t)P * sizeof(int32_t));
                const int used = h[k][0][G];
                h[k][3] = host(s[k], dtok, (size_t)used * sizeof(int32_t));
                h[k][4] = host(s[k], dpair, (size_t)used * sizeof(int32_t));
                // The combine over the return slots (rows from three ranks' blocks),
                // and over pair-ordered rows.
                float *dx = dev(s[k], x, (size_t)n * H * sizeof(float));
                float *dx2 = dev(s[k], x, (size_t)n * H * sizeof(float));
                float *dw = dev(s[k], w, (size_t)P * sizeof(float));
                float *deo = dev(s[k], eo, (size_t)3 * P * H * sizeof(float));
                assert_int_equal(b->ops->moe_combine(b, dx, deo, dhome, dw, n, K, H), 0);
                assert_int_equal(b->ops->moe_combine(b, dx2, deo, NULL, dw, n, K, H), 0);
                xo[k][0] = host(s[k], dx, (size_t)n * H * sizeof(float));
                xo[k][1] = host(s[k], dx2, (size_t)n * H * sizeof(float));
                void *all[] = {di, dl, doff, dcnt, dslot, dtok, dpair, dhome, dx, dx2, dw, deo};
                for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(s[k], all[i]);
            }
            assert_memory_equal(h[1][0], h[0][0], (size_t)(G + 1) * sizeof(int32_t));
            assert_true(h[0][0][G] <= rows);
            if (G) assert_memory_equal(h[1][1], h[0][1], (size_t)G * sizeof(int32_t));
            if (P) assert_memory_equal(h[1][2], h[0][2], (size_t)P * sizeof(int32_t));
            if (P) assert_memory_equal(h[1][5], h[0][5], (size_t)P * sizeof(int32_t));
            if (h[0][0][G]) {
                assert_memory_equal(h[1][3], h[0][3], (size_t)h[0][0][G] * sizeof(int32_t));
                assert_memory_equal(h[1][4], h[0][4], (size_t)h[0][0][G] * sizeof(int32_t));
            }
            for (int t = 0; t < n; t++)
                for (int j = 0; j < K; j++) {
                    const int32_t want = with_live && !live[t] ? -1
                                         : fwd_plan_return_slot(ids[t * K + j], t, j, K, first, 3, P);
                    assert_int_equal(h[0][5][t * K + j], want);
                }
            assert_close("moe combine (return slots)", p->who, xo[1][0], xo[0][0], (size_t)n * H);
            assert_close("moe combine (pair rows)", p->who, xo[1][1], xo[0][1], (size_t)n * H);
            for (int k = 0; k < 2; k++) {
                for (int i = 0; i < 6; i++) free(h[k][i]);
                free(xo[k][0]);
                free(xo[k][1]);
            }
            free(x);
            free(w);
            free(eo);
        }
    }
}

// Experts over routed, padded rows, as a padded decode step runs them: gate
// and up read their tokens and write each pair's row, down reads and writes
// the pair rows; padding rows are neither read nor written (their y rows
// keep a sentinel).
static void grouped_matmul_skips_padding_rows(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int E = c->n_experts, K = c->n_experts_per_tok, H = c->hidden_size;
    const int F = c->moe_intermediate_size;
    const int counts[] = {1, 9, 40};
    for (size_t ci = 0; ci < 3; ci++) {
        const int n = counts[ci], P = n * K;
        int32_t ids[40 * 8];
        for (int t = 0; t < n; t++)
            for (int j = 0; j < K; j++) ids[t * K + j] = (t + j * (1 + t % 3)) % E;
        // Distinct experts per token (the router's): shift duplicates along.
        for (int t = 0; t < n; t++)
            for (int j = 1; j < K; j++)
                for (int i = 0; i < j; i++)
                    if (ids[t * K + j] == ids[t * K + i]) ids[t * K + j] = (ids[t * K + j] + 1) % E, i = -1;
        const int pads[] = {8, 64, p->t.b->ops->route_pad(p->t.b, P, E)};
        for (int pi = 0; pi < 3; pi++) {
            const int pad = pads[pi], rows = fwd_plan_route_rows(P, E, pad);
            float *x = frand_array((size_t)n * H);
            float *y0 = malloc((size_t)P * H * sizeof *y0);
            assert_non_null(y0);
            for (size_t i = 0; i < (size_t)P * H; i++) y0[i] = 1234.5f;
            struct side *s[2] = {&p->ref, &p->t};
            float *y[2];
            for (int k = 0; k < 2; k++) {
                struct backend *b = s[k]->b;
                const struct backend_layer *L = &s[k]->w->layers[0];
                int32_t *di = dev(s[k], ids, (size_t)P * sizeof *ids);
                int32_t *doff = dev(s[k], NULL, (size_t)(E + 1) * sizeof(int32_t));
                int32_t *dslot = dev(s[k], NULL, (size_t)P * sizeof(int32_t));
                int32_t *dtok = dev(s[k], NULL, (size_t)rows * sizeof(int32_t));
                int32_t *dpair = dev(s[k], NULL, (size_t)rows * sizeof(int32_t));
                const struct backend_route rt = {.ids = di, .n_tokens = n, .k = K, .e0 = 0, .e1 = E,
                                                 .pad = pad, .off = doff, .slot = dslot,
                                                 .token = dtok, .pair = dpair};
                assert_int_equal(b->ops->moe_route(b, &rt), 0);
                float *dx = dev(s[k], x, (size_t)n * H * sizeof(float));
                float *dg = dev(s[k], NULL, (size_t)P * F * sizeof(float));
                float *du = dev(s[k], NULL, (size_t)P * F * sizeof(float));
                float *dy = dev(s[k], y0, (size_t)P * H * sizeof(float));
                const struct backend_gmm gu[2] = {
                    {.w = L->expert_gate, .n_groups = E, .off = doff, .max_rows = rows, .x = dx,
                     .ldx = (size_t)H, .x_rows = dtok, .y = dg, .ldy = (size_t)F, .y_rows = dpair,
                     .pad = pad},
                    {.w = L->expert_up, .n_groups = E, .off = doff, .max_rows = rows, .x = dx,
                     .ldx = (size_t)H, .x_rows = dtok, .y = du, .ldy = (size_t)F, .y_rows = dpair,
                     .pad = pad},
                };
                assert_int_equal(b->ops->grouped_matmul(b, gu, 2), 0);
                assert_int_equal(b->ops->silu_mul(b, dg, du, (size_t)P * F), 0);
                const struct backend_gmm down = {.w = L->expert_down, .n_groups = E, .off = doff,
                                                 .max_rows = rows, .x = dg, .ldx = (size_t)F,
                                                 .x_rows = dpair, .y = dy, .ldy = (size_t)H,
                                                 .y_rows = dpair, .pad = pad};
                assert_int_equal(b->ops->grouped_matmul(b, &down, 1), 0);
                y[k] = host(s[k], dy, (size_t)P * H * sizeof(float));
                void *all[] = {di, doff, dslot, dtok, dpair, dx, dg, du, dy};
                for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) release(s[k], all[i]);
            }
            // Every pair's row was written (no sentinel left), and agrees.
            for (size_t i = 0; i < (size_t)P * H; i++) assert_true(y[0][i] != 1234.5f);
            assert_close_tol("grouped matmul over padded rows", p->who, y[1], y[0], (size_t)P * H, mm_tol);
            free(y[0]);
            free(y[1]);
            free(x);
            free(y0);
        }
    }
}

static void lm_head_slices_match(struct pair *p)
{
    const struct model_config *c = &p->m->cfg;
    const int V = c->vocab_size, H = c->hidden_size;
    const int slices[][2] = {{0, 0}, {0, 1}, {16, 48}, {V - 21, 21}};
    float *x = frand_array((size_t)5 * H);
    for (int si = 0; si < 4; si++) {
        const int v0 = slices[si][0], n_out = slices[si][1] ? slices[si][1] : V;
        for (int n = 0; n <= 5; n += 5) {
            struct side *s[2] = {&p->ref, &p->t};
            float *out[2];
            const size_t yb = (size_t)5 * n_out * sizeof(float);
            for (int k = 0; k < 2; k++) {
                float *dx = dev(s[k], x, (size_t)5 * H * sizeof *x), *dy = dev(s[k], NULL, yb);
                assert_int_equal(s[k]->b->ops->lm_head(s[k]->b, s[k]->w, v0, n_out, dx, n, dy,
                                                       (size_t)n_out), 0);
                out[k] = host(s[k], dy, yb);
                release(s[k], dx);
                release(s[k], dy);
            }
            assert_close_tol("lm_head", p->who, out[1], out[0], yb / sizeof(float), mm_tol);
            free(out[0]);
            free(out[1]);
        }
    }
    free(x);
}

// Greedy rows and score rows agree exactly (ids) and within tolerance
// (logprobs); draws agree wherever the exp rounding does not move a boundary
// (all but a few in a hundred).
static void sample_matches_greedy_scores_and_draws(struct pair *p)
{
    const int V = p->m->cfg.vocab_size, R = 100;
    float *l = frand_array((size_t)R * V);
    for (size_t i = 0; i < (size_t)R * V; i++) l[i] *= 6;
    struct sampling_params sp[3];
    for (int i = 0; i < 3; i++) {
        sampling_params_default(&sp[i]);
        sp[i].seed = 5;
        sp[i].logprobs = 3;
        sp[i].prompt_logprobs = 2;
    }
    sp[0].temperature = 0;
    sp[2].top_p = 0.8f;
    sp[2].top_k = 40;
    struct backend_sample_row rows[100];
    struct sample_token out[2][100];
    struct side *s[2] = {&p->ref, &p->t};
    for (int k = 0; k < 2; k++) {
        float *dl = dev(s[k], l, (size_t)R * V * sizeof *l);
        for (int r = 0; r < R; r++)
            rows[r] = (struct backend_sample_row){.logits = dl + (size_t)r * V, .p = &sp[r % 3],
                                                  .position = (uint32_t)r,
                                                  .score = r % 10 == 9 ? r : -1};
        assert_int_equal(s[k]->b->ops->sample(s[k]->b, rows, R, V, out[k]), 0);
        assert_int_equal(s[k]->b->ops->sample(s[k]->b, rows, 0, V, out[k] + R - 1), 0); // empty
        release(s[k], dl);
    }
    int differ = 0;
    for (int r = 0; r < R; r++) {
        const bool exact = r % 3 == 0 || r % 10 == 9;
        if (exact) assert_int_equal(out[1][r].id, out[0][r].id);
        assert_int_equal(out[1][r].rank, out[0][r].rank); // scored rows' ranks; 0 for drawn ones
        differ += out[1][r].id != out[0][r].id;
        assert_int_equal(out[1][r].n_top, out[0][r].n_top);
        // A draw allowed to differ (sums in another order move a boundary)
        // has its own token's logprob.
        if (out[1][r].id == out[0][r].id)
            assert_true(fabsf(out[1][r].logprob - out[0][r].logprob) <= 1e-4f * (1 + fabsf(out[0][r].logprob)));
    }
    if (differ > R / 20) fail_msg("sample on %s: %d of %d draws differ from the reference", p->who, differ, R);
    free(l);
}

static void copies_and_round_trips_are_exact(struct pair *p)
{
    float src[6 * 10], got[6 * 10];
    for (int i = 0; i < 60; i++) src[i] = frand();
    struct side *t = &p->t;
    float *a = dev(t, src, sizeof src), *b = dev(t, NULL, sizeof src);
    assert_int_equal(t->b->ops->copy_2d(t->b, b + 1, 10 * sizeof(float), a, 7 * sizeof(float),
                                        5 * sizeof(float), 6), 0);
    assert_int_equal(t->b->ops->sync(t->b), 0);
    assert_int_equal(t->b->ops->download(t->b, got, b, sizeof got), 0);
    for (int r = 0; r < 6; r++)
        for (int i = 0; i < 5; i++) assert_true(got[r * 10 + 1 + i] == src[r * 7 + i]);
    assert_true(got[0] == 0 && got[6] == 0);
    release(t, a);
    release(t, b);
}

typedef void (*op_test)(struct pair *p);

static void run_on_every_target(op_test fn)
{
    struct target ts[8];
    const int nt = targets(ts, 8);
    assert_true(nt >= 1);
    for (size_t si = 0; si < N_SHAPES; si++) {
        struct model *m = model_of(si);
        for (int ti = 0; ti < nt; ti++) {
            struct pair p = {.m = m};
            char who[768];
            snprintf(who, sizeof who, "%s, %s shape", ts[ti].name, shapes[si].name);
            p.who = who;
            side_open(&p.ref, BACKEND_DEVICE_CPU, "scalar", 1, m);
            side_open(&p.t, ts[ti].device, ts[ti].variant, 2, m);
            rng_state = 88172645463325252ull + si * 1000 + (uint64_t)ti;
            mm_tol = backend_variant_bf16_activations(ts[ti].device, ts[ti].variant) ? BF16_MM_TOL : TOL;
            fn(&p);
            side_close(&p.t);
            side_close(&p.ref);
        }
        model_destroy(m);
    }
}

#define OP_TEST(name) \
    static void test_##name(void **state) { (void)state; run_on_every_target(name); }
OP_TEST(embed_gathers_rows)
OP_TEST(rmsnorm_normalises_gathered_rows)
OP_TEST(matmul_matches_at_every_row_count)
OP_TEST(grouped_matmul_runs_each_group_on_its_rows)
OP_TEST(matmul_reads_inputs_in_the_matrix_order)
OP_TEST(attention_over_paged_kv_matches)
OP_TEST(decode_attention_matches)
OP_TEST(moe_pieces_match)
OP_TEST(routing_pads_ranges_and_returns)
OP_TEST(grouped_matmul_skips_padding_rows)
OP_TEST(lm_head_slices_match)
OP_TEST(sample_matches_greedy_scores_and_draws)
OP_TEST(copies_and_round_trips_are_exact)

int main(void)
{
    const char *dev = getenv("MOESERVE_TEST_DEVICE");
    if (dev && !strcmp(dev, "cuda")) {
        enum backend_device d;
        char why[512];
        if (backend_device_resolve(BACKEND_DEVICE_CUDA, &d, NULL, 0, why, sizeof why)) {
            fprintf(stderr, "skipped: no GPU to run on (%s)\n", why);
            return 77;
        }
        only_cuda = true;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_gathers_rows),
        cmocka_unit_test(test_rmsnorm_normalises_gathered_rows),
        cmocka_unit_test(test_matmul_matches_at_every_row_count),
        cmocka_unit_test(test_grouped_matmul_runs_each_group_on_its_rows),
        cmocka_unit_test(test_matmul_reads_inputs_in_the_matrix_order),
        cmocka_unit_test(test_attention_over_paged_kv_matches),
        cmocka_unit_test(test_decode_attention_matches),
        cmocka_unit_test(test_moe_pieces_match),
        cmocka_unit_test(test_routing_pads_ranges_and_returns),
        cmocka_unit_test(test_grouped_matmul_skips_padding_rows),
        cmocka_unit_test(test_lm_head_slices_match),
        cmocka_unit_test(test_sample_matches_greedy_scores_and_draws),
        cmocka_unit_test(test_copies_and_round_trips_are_exact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
