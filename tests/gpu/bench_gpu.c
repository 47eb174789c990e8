// bench_gpu: the CUDA backend's microbenchmarks for tests/gpu/device_check.sh,
// printed as markdown table rows: the copy bandwidth and fp32 FMA peak
// (measure_limits), the expert GEMM of Qwen3-30B-A3B (128 experts of 768 x
// 2048, gate + up + down) at 1..256 rows per expert against the bandwidth
// roofline, in bf16 and quantized at load to fp8, int8 and int4, decode attention over 1k, 8k and 32k contexts, and the NCCL
// calls over every visible GPU. Weights are one dummy layer of the config
// given, made on the GPU. Exits 77 (a skip) with a note where no GPU is
// visible. Timings are wall clock around ops followed by a sync, best of
// several repeats.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "base/base.h"
#include "model/backend_registry.h"

#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) {                            \
            fprintf(stderr, "bench_gpu: " __VA_ARGS__); \
            fputc('\n', stderr);                  \
            exit(1);                              \
        }                                         \
    } while (0)

static struct backend *b;

static void *dmalloc(size_t bytes)
{
    void *p;
    CHECK(b->ops->alloc(b, bytes, &p) == 0, "%s", b->err);
    return p;
}

// Best wall time of `reps` runs of fn (each followed by a sync).
static double best_of(int reps, void (*fn)(void *), void *ctx)
{
    double best = INFINITY;
    fn(ctx); // warm-up
    CHECK(b->ops->sync(b) == 0, "%s", b->err);
    for (int i = 0; i < reps; i++) {
        const double t0 = ms_now();
        fn(ctx);
        CHECK(b->ops->sync(b) == 0, "%s", b->err);
        const double t = ms_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

struct gemm_ctx {
    const struct backend_layer *L;
    int E, H, F, rows;
    int32_t *off, *h_off;
    float *x, *g, *u, *y;
};

static void run_experts(void *arg)
{
    struct gemm_ctx *c = arg;
    const struct backend_gmm gu[2] = {
        {.w = c->L->expert_gate, .n_groups = c->E, .off = c->off, .h_off = c->h_off,
         .max_rows = c->rows, .x = c->x, .ldx = (size_t)c->H, .y = c->g, .ldy = (size_t)c->F},
        {.w = c->L->expert_up, .n_groups = c->E, .off = c->off, .h_off = c->h_off,
         .max_rows = c->rows, .x = c->x, .ldx = (size_t)c->H, .y = c->u, .ldy = (size_t)c->F},
    };
    CHECK(b->ops->grouped_matmul(b, gu, 2) == 0, "%s", b->err);
    const struct backend_gmm down = {.w = c->L->expert_down, .n_groups = c->E, .off = c->off,
                                     .h_off = c->h_off, .max_rows = c->rows, .x = c->g,
                                     .ldx = (size_t)c->F, .y = c->y, .ldy = (size_t)c->H};
    CHECK(b->ops->grouped_matmul(b, &down, 1) == 0, "%s", b->err);
}

// The expert GEMM of layer 0 (m's experts as w holds them) at 1..256 rows
// per expert; the weight bytes are what the format holds (tensor_bytes).
static void bench_gemm(const struct model *m, const struct backend_weights *w, double bw)
{
    const struct model_config *cfg = w->cfg;
    struct gemm_ctx c = {.L = &w->layers[0], .E = cfg->n_experts, .H = cfg->hidden_size,
                         .F = cfg->moe_intermediate_size};
    const struct expert_weights *x = &m->layers[0].experts[0];
    const double wbytes = (double)c.E * (double)(tensor_bytes(&x->gate) + tensor_bytes(&x->up) +
                                                 tensor_bytes(&x->down));
    const int per[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    printf("\n| expert GEMM, %s weights (%d experts, gate+up+down of %dx%d, %.0f MiB) rows/expert | "
           "ms | weight GB/s | TFLOP/s | of the bandwidth roofline |\n|---|---|---|---|---|\n",
           m->quant != QUANT_NONE ? quant_format_name(m->quant) : dtype_name(x->gate.dtype), c.E, c.F,
           c.H, wbytes / (1 << 20));
    const int max_rows = 256 * c.E;
    c.x = dmalloc((size_t)max_rows * c.H * sizeof(float));
    c.y = dmalloc((size_t)max_rows * c.H * sizeof(float));
    c.g = dmalloc((size_t)max_rows * c.F * sizeof(float));
    c.u = dmalloc((size_t)max_rows * c.F * sizeof(float));
    c.off = dmalloc((size_t)(c.E + 1) * sizeof(int32_t));
    c.h_off = malloc((size_t)(c.E + 1) * sizeof(int32_t));
    CHECK(c.h_off, "out of memory");
    for (size_t i = 0; i < sizeof per / sizeof *per; i++) {
        c.rows = per[i] * c.E;
        for (int e = 0; e <= c.E; e++) c.h_off[e] = e * per[i];
        CHECK(b->ops->upload(b, c.off, c.h_off, (size_t)(c.E + 1) * sizeof(int32_t)) == 0, "%s", b->err);
        const double t = best_of(5, run_experts, &c);
        const double abytes = (double)c.rows * (c.H * 2.0 + c.F * 3.0) * 4;
        const double flops = 2.0 * 3.0 * c.rows * (double)c.F * c.H;
        printf("| %d | %.3f | %.0f | %.1f | %.0f%% |\n", per[i], t * 1e3, wbytes / t / 1e9,
               flops / t / 1e12, 100.0 * ((wbytes + abytes) / bw) / t);
    }
    free(c.h_off);
    void *all[] = {c.x, c.y, c.g, c.u, c.off};
    for (size_t i = 0; i < 5; i++) b->ops->free(b, all[i]);
}

struct attn_ctx {
    const struct backend_weights *w;
    struct backend_step s;
    struct kv_pool *kv;
    float *q, *out;
};

static void run_attention(void *arg)
{
    struct attn_ctx *a = arg;
    CHECK(b->ops->attention(b, a->w, 0, &a->s, a->kv, a->q, a->out) == 0, "%s", b->err);
}

static void bench_attention(const struct backend_weights *w, double bw)
{
    const struct model_config *cfg = w->cfg;
    const int ctxs[] = {1024, 8192, 32768}, batches[] = {1, 32};
    printf("\n| decode attention (%d heads / %d KV heads x %d, bf16 KV) | batch | ms | KV GB/s | "
           "of the copy bandwidth |\n|---|---|---|---|---|\n", cfg->n_heads, cfg->n_kv_heads,
           cfg->head_dim);
    for (size_t ci = 0; ci < 3; ci++)
        for (size_t bi = 0; bi < 2; bi++) {
            const int ctx = ctxs[ci], B = batches[bi], nb = (ctx + 15) / 16;
            char err[256];
            struct attn_ctx a = {.w = w};
            CHECK(kv_pool_create(b, cfg, DTYPE_BF16, B * nb, &a.kv, err, sizeof err) == 0, "%s", err);
            int32_t *h = malloc(((size_t)4 * B + 2 + (size_t)B * nb + 4) * sizeof(int32_t));
            CHECK(h, "out of memory");
            int32_t *pos = h, *seq = pos + B, *ss = seq + B, *bs = ss + B + 1, *bt = bs + B + 1;
            for (int s = 0; s < B; s++) {
                pos[s] = ctx - 1;
                seq[s] = s;
                ss[s] = s;
                bs[s] = s * nb;
                for (int k = 0; k < nb; k++) bt[s * nb + k] = s * nb + k;
            }
            ss[B] = B;
            bs[B] = B * nb;
            const size_t n = (size_t)(bt + B * nb - h);
            int32_t *d = dmalloc(n * sizeof(int32_t));
            CHECK(b->ops->upload(b, d, h, n * sizeof(int32_t)) == 0, "%s", b->err);
            a.s = (struct backend_step){.n_tokens = B, .n_seqs = B, .max_ctx = ctx,
                                        .tok_pos = d + (pos - h), .tok_seq = d + (seq - h),
                                        .seq_start = d + (ss - h), .bt_start = d + (bs - h),
                                        .bt = d + (bt - h), .h_tok_pos = pos, .h_tok_seq = seq,
                                        .h_seq_start = ss, .h_bt_start = bs, .h_bt = bt};
            const size_t qd = (size_t)cfg->n_heads * cfg->head_dim;
            a.q = dmalloc((size_t)B * qd * sizeof(float));
            a.out = dmalloc((size_t)B * qd * sizeof(float));
            const double t = best_of(10, run_attention, &a);
            const double kvb = 2.0 * B * ctx * (double)cfg->n_kv_heads * cfg->head_dim * 2;
            printf("| %d | %d | %.3f | %.0f | %.0f%% |\n", ctx, B, t * 1e3, kvb / t / 1e9,
                   100.0 * (kvb / bw) / t);
            b->ops->free(b, a.q);
            b->ops->free(b, a.out);
            b->ops->free(b, d);
            free(h);
            kv_pool_destroy(b, a.kv);
        }
}

struct nccl_peer {
    struct comm *c;
    struct backend *b;
    size_t bytes;
    int reps;
    double a2a, gather;
};

static void *nccl_main(void *arg)
{
    struct nccl_peer *p = arg;
    struct backend *bk = p->b;
    const int R = p->c->n_ranks;
    void *send, *recv;
    CHECK(bk->ops->alloc(bk, p->bytes * R, &send) == 0 && bk->ops->alloc(bk, p->bytes * R, &recv) == 0,
          "%s", bk->err);
    size_t sb[64], so[64];
    for (int q = 0; q < R; q++) sb[q] = p->bytes, so[q] = p->bytes * q;
    for (int rep = 0; rep <= p->reps; rep++) {
        double t0 = ms_now();
        CHECK(comm_all_to_all_v(p->c, send, sb, so, recv, sb, so) == 0, "all_to_all_v failed");
        CHECK(bk->ops->sync(bk) == 0, "%s", bk->err);
        if (rep) p->a2a += ms_now() - t0;
        t0 = ms_now();
        CHECK(comm_all_gather(p->c, send, p->bytes, recv) == 0, "all_gather failed");
        CHECK(bk->ops->sync(bk) == 0, "%s", bk->err);
        if (rep) p->gather += ms_now() - t0;
    }
    bk->ops->free(bk, send);
    bk->ops->free(bk, recv);
    return NULL;
}

static void bench_nccl(void)
{
    const int R = backend_device_count(BACKEND_DEVICE_CUDA) < 8 ? backend_device_count(BACKEND_DEVICE_CUDA) : 8;
    struct backend *bs[8];
    struct comm *cs[8];
    char err[512];
    bs[0] = b;
    for (int r = 1; r < R; r++) {
        struct backend_opts bo = {.device_index = r, .rank = r};
        CHECK(backend_create(BACKEND_DEVICE_CUDA, &bo, &bs[r], err, sizeof err) == 0, "%s", err);
    }
    CHECK(backend_comm_create(BACKEND_DEVICE_CUDA, R, bs, cs, err, sizeof err) == 0, "%s", err);
    printf("\n| NCCL over %d GPU%s | bytes per peer | all_to_all_v ms | all_gather ms |\n"
           "|---|---|---|---|\n", R, R > 1 ? "s" : "");
    const size_t sizes[] = {(size_t)64 << 10, (size_t)4 << 20};
    for (int si = 0; si < 2; si++) {
        struct nccl_peer p[8];
        pthread_t th[8];
        for (int r = 0; r < R; r++) {
            p[r] = (struct nccl_peer){.c = cs[r], .b = bs[r], .bytes = sizes[si], .reps = 20};
            CHECK(pthread_create(&th[r], NULL, nccl_main, &p[r]) == 0, "no thread");
        }
        for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
        printf("| rank 0 | %zu | %.3f | %.3f |\n", sizes[si], p[0].a2a / 20 * 1e3,
               p[0].gather / 20 * 1e3);
    }
    for (int r = 0; r < R; r++) cs[r]->ops->destroy(cs[r]);
    for (int r = 1; r < R; r++) backend_destroy(bs[r]);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench_gpu CONFIG.json (a Qwen3-MoE config; one layer of it is made)\n");
        return 2;
    }
    enum backend_device d;
    char err[512];
    if (backend_device_resolve(BACKEND_DEVICE_CUDA, &d, NULL, 0, err, sizeof err)) {
        fprintf(stderr, "bench_gpu: skipped: %s\n", err);
        return 77;
    }
    json_error_t je;
    json_t *c = json_load_file(argv[1], 0, &je);
    CHECK(c, "%s: %s", argv[1], je.text);
    json_object_set_new(c, "num_hidden_layers", json_integer(1));
    char dir[] = "/tmp/bench_gpu_XXXXXX", path[64];
    CHECK(mkdtemp(dir), "no temporary folder");
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(json_dump_file(c, path, 0) == 0, "cannot write %s", path);
    json_decref(c);
    struct backend_opts bo = {.device_index = 0};
    CHECK(backend_create(BACKEND_DEVICE_CUDA, &bo, &b, err, sizeof err) == 0, "%s", err);
    struct backend_limits lim;
    CHECK(b->ops->measure_limits(b, &lim) == 0, "%s", b->err);
    printf("| GPU | copy bandwidth (read + write) | fp32 FMA peak |\n|---|---|---|\n"
           "| %s | %.0f GB/s | %.1f TFLOP/s |\n", b->ops->variant(b), lim.read_bytes_per_s / 1e9,
           lim.flops / 1e12);
    // The layer as the config has it, then with its projections quantized
    // at load (made on the GPU): the expert GEMM in every weight format.
    const enum quant_format formats[] = {QUANT_NONE, QUANT_FP8, QUANT_INT8, QUANT_INT4};
    for (size_t fi = 0; fi < sizeof formats / sizeof *formats; fi++) {
        struct model *m;
        const struct model_load_opts lo = {.format = LOAD_FORMAT_DUMMY, .seed = 1,
                                           .quantization = formats[fi], .cache_dir = "none"};
        CHECK(model_load_opts(dir, &lo, &m, err, sizeof err) == 0, "%s", err);
        struct backend_weights *w;
        CHECK(b->ops->prepare_weights(b, m, 0, m->cfg.n_experts, &w) == 0, "%s", b->err);
        bench_gemm(m, w, lim.read_bytes_per_s);
        if (fi == 0) bench_attention(w, lim.read_bytes_per_s);
        b->ops->release_weights(b, w);
        model_destroy(m);
    }
    unlink(path);
    rmdir(dir);
    bench_nccl();
    backend_destroy(b);
    return 0;
}
