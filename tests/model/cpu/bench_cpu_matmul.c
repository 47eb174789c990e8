// bench_cpu_matmul: a benchmark, not a test — the CPU matmul of each kernel
// table on the shapes a Qwen3-MoE step multiplies (the mid model of
// `make-model --shape mid`: hidden 1024, experts of 384, a 151936-row
// lm_head), weights packed as at load, split over the threads as the
// backend splits them. Prints each table's FMA peak first (its fma_burn on
// every thread: what every GFLOP/s below is a fraction of), then ms per call,
// GFLOP/s and the weight bytes read per second (best of the repetitions:
// other processes only slow a run), by the wall clock and by the process's
// CPU time (what a core does while it runs: on a shared machine the
// steadier figure of the two).
//
//   meson compile -C build bench_cpu_matmul
//   build/tests/model/cpu/bench_cpu_matmul [THREADS [TABLE...]]
//
// BENCH_SHAPE=TEXT runs only the shapes whose name holds TEXT.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/base.h"
#include "model/cpu/kernels.h"
#include "model/cpu/ops.h"
#include "model/cpu/probe.h"
#include "model/cpu/threadpool.h"

struct shape {
    const char *what;
    int out, in, rows, mats; // mats: matrices of this shape in one call (experts)
    int sets;                // copies of them, a call each in turn: 12 of the experts
                             // (590 MB) are past any L3, as a model's layers are
    bool routed;             // rows as a router spreads rows x mats / 8 tokens x top-8
                             // (rows the mean): uneven per matrix, x rows gathered
    bool per_pair;           // routed, but x a row per (token, expert) pair in the
                             // experts' order and y written to pair order: the down
                             // projection as the forward pass runs it (its x the SiLU
                             // output, its outputs in pair order for the combine)
    enum quant_format quant; // the weights quantized as --quantization does (QUANT_NONE: bf16)
};

static const struct shape shapes[] = {
    {"lm_head, 1 row", 151936, 1024, 1, 1, 1, false, false, QUANT_NONE},
    {"demo lm_head, 1 row", 151936, 512, 1, 1, 1, false, false, QUANT_NONE},
    {"demo lm_head, 1 row, 4 copies (from memory)", 151936, 512, 1, 1, 4, false, false, QUANT_NONE},
    {"lm_head, 16 rows", 151936, 1024, 16, 1, 1, false, false, QUANT_NONE},
    {"lm_head, 64 rows", 151936, 1024, 64, 1, 1, false, false, QUANT_NONE},
    {"experts gate/up, 64 x 2 rows", 384, 1024, 2, 64, 1, false, false, QUANT_NONE},
    {"experts gate/up, 64 x 8 rows", 384, 1024, 8, 64, 1, false, false, QUANT_NONE},
    {"experts down, 64 x 8 rows", 1024, 384, 8, 64, 1, false, false, QUANT_NONE},
    {"experts gate/up, 64 x 8 rows, 12 layers (from memory)", 384, 1024, 8, 64, 12, false, false, QUANT_NONE},
    {"experts gate/up, 64 x 2 rows, 12 layers (from memory)", 384, 1024, 2, 64, 12, false, false, QUANT_NONE},
    {"experts gate/up, 16 tokens routed, 12 layers (from memory)", 384, 1024, 2, 64, 12, true, false, QUANT_NONE},
    {"experts down, 16 tokens routed, 12 layers (from memory)", 1024, 384, 2, 64, 12, true, false, QUANT_NONE},
    {"experts gate/up, 64 tokens routed, 12 layers (from memory)", 384, 1024, 8, 64, 12, true, false, QUANT_NONE},
    {"experts down, 64 tokens routed, 12 layers (from memory)", 1024, 384, 8, 64, 12, true, false, QUANT_NONE},
    {"experts gate/up, 64 x 64 rows (prefill 512)", 384, 1024, 64, 64, 1, false, false, QUANT_NONE},
    {"experts gate/up, 64 x 64 rows, 12 layers (from memory)", 384, 1024, 64, 64, 12, false, false, QUANT_NONE},
    {"experts gate/up, 512 tokens routed (uneven rows, gathered x)", 384, 1024, 64, 64, 1, true, false, QUANT_NONE},
    {"experts down, 512 tokens routed (uneven rows, gathered x)", 1024, 384, 64, 64, 1, true, false, QUANT_NONE},
    {"experts gate/up, 2048 tokens routed (uneven rows, gathered x)", 384, 1024, 256, 64, 1, true, false, QUANT_NONE},
    {"experts down, 2048 tokens routed (uneven rows, gathered x)", 1024, 384, 256, 64, 1, true, false, QUANT_NONE},
    {"experts down, 2048 tokens routed (x and y a row per pair, as in place)", 1024, 384, 256, 64, 1, true, true, QUANT_NONE},
    {"q projection, 512 rows (prefill)", 1024, 1024, 512, 1, 1, false, false, QUANT_NONE},
    {"q projection, 2048 rows (16 prefills of 128)", 1024, 1024, 2048, 1, 1, false, false, QUANT_NONE},
    // 16 KiB of bf16 weights for each of the 8 pieces of work of 2 threads,
    // in L1, against 1200 rows from L2: how close the tiles come to the FMA
    // peak printed first when nothing waits on memory (the avx512 and avx2
    // ones spend a vector op of their own on each weight vector's widening,
    // on the ports the FMAs use).
    {"weights in L1 (the tiles' own ceiling)", 512, 128, 1200, 1, 1, false, false, QUANT_NONE},
    // The full-size Qwen3-30B-A3B's experts in int4 (--quantization int4,
    // groups of 128, as every quantized shape here): a decode step's 8 of
    // each layer, 48 layers from memory, and a 512-token prefill's 32 rows
    // an expert; its q projection.
    {"int4 experts gate/up (full size), 1 row, 48 layers x 8 (from memory)", 768, 2048, 1, 8, 48, false, false,
     QUANT_INT4},
    {"int4 experts down (full size), 1 row, 48 layers x 8 (from memory)", 2048, 768, 1, 8, 48, false, false,
     QUANT_INT4},
    {"int4 experts gate/up (full size), 128 x 32 rows (prefill 512)", 768, 2048, 32, 128, 1, false, false,
     QUANT_INT4},
    // Two of them from L2 (about 800 KiB a thread): what one row costs in
    // instructions alone, with the memory out of the way.
    {"int4 experts gate/up (full size), 1 row, 2 (from L2)", 768, 2048, 1, 2, 1, false, false, QUANT_INT4},
    {"int4 q projection (full size), 512 rows (prefill)", 4096, 2048, 512, 1, 1, false, false, QUANT_INT4},
    {"int4 q projection (full size), 16 rows, 48 layers (from memory)", 4096, 2048, 16, 1, 48, false, false,
     QUANT_INT4},
    {"int4 q projection (full size), 1 row, 48 layers (from memory)", 4096, 2048, 1, 1, 48, false, false,
     QUANT_INT4},
    // The same experts in fp8 and int8.
    {"fp8 experts gate/up (full size), 1 row, 48 layers x 8 (from memory)", 768, 2048, 1, 8, 48, false, false,
     QUANT_FP8},
    {"fp8 experts gate/up (full size), 128 x 32 rows (prefill 512)", 768, 2048, 32, 128, 1, false, false,
     QUANT_FP8},
    {"int8 experts gate/up (full size), 1 row, 48 layers x 8 (from memory)", 768, 2048, 1, 8, 48, false, false,
     QUANT_INT8},
    {"int8 experts gate/up (full size), 128 x 32 rows (prefill 512)", 768, 2048, 32, 128, 1, false, false,
     QUANT_INT8},
    {"fp8 experts gate/up (full size), 1 row, 2 (from L2)", 768, 2048, 1, 2, 1, false, false, QUANT_FP8},
    {"int8 experts gate/up (full size), 1 row, 2 (from L2)", 768, 2048, 1, 2, 1, false, false, QUANT_INT8},
    // A 16-stream decode step's experts: nearly all 128 of a layer, 2 rows
    // each, 4 layers (805 MB in fp8 and int8) from memory.
    {"fp8 experts gate/up (full size), 128 x 2 rows, 4 layers (from memory)", 768, 2048, 2, 128, 4, false, false,
     QUANT_FP8},
    {"int8 experts gate/up (full size), 128 x 2 rows, 4 layers (from memory)", 768, 2048, 2, 128, 4, false, false,
     QUANT_INT8},
    {"int4 experts gate/up (full size), 128 x 2 rows, 4 layers (from memory)", 768, 2048, 2, 128, 4, false, false,
     QUANT_INT4},
    {"int4 experts gate/up (full size), 16 tokens routed, 8 layers (from memory)", 768, 2048, 1, 128, 8, true, false,
     QUANT_INT4},
    {"int4 experts down (full size), 16 tokens routed, 8 layers (from memory)", 2048, 768, 1, 128, 8, true, true,
     QUANT_INT4},
};

// Matrix e of the shape's bf16 weights w quantized and packed into dst
// (quant_block_bytes a block), as the backend prepares them at load.
static void quant_pack(const struct shape *sh, const uint16_t *w, void *dst)
{
    const int G = QUANT_GROUP, nb = (sh->out + 15) / 16;
    const size_t bb = quant_block_bytes(sh->quant, sh->in, G);
    void *buf = malloc(quant_rows_bytes(16, sh->in, sh->quant, G));
    float *row = malloc((size_t)sh->in * sizeof *row);
    if (!buf || !row) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int b = 0; b < nb; b++) {
        struct quant_rows r;
        const int n = sh->out - 16 * b < 16 ? sh->out - 16 * b : 16;
        quant_rows_init(&r, buf, n, sh->in, sh->quant, G);
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < sh->in; k++) row[k] = ms_bf16_to_f32(w[(size_t)(16 * b + i) * sh->in + k]);
            quant_rows_quantize(&r, i, row);
        }
        cpu_qpack_block(&r, (char *)dst + (size_t)b * bb);
    }
    free(buf);
    free(row);
}

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// A table by name; avx512_bf16:dp and avx512_bf16:fma force that table's path.
static const struct cpu_kernels *kernels_named(const char *name)
{
    if (!strcmp(name, "avx512_bf16:dp")) return cpu_kernels_avx512_bf16_path(false);
    if (!strcmp(name, "avx512_bf16:fma")) return cpu_kernels_avx512_bf16_path(true);
    return cpu_kernels_by_name(name);
}

// Buffers of 2 MiB and more (weights, x, y) on 2 MiB pages, as the engine
// maps its weights and workspace (ms_map_huge): on 4 KiB pages the TLB
// walks of rows written all over a 64 MB y cost the experts' down
// projection 10-15% here (Zen 5), which the engine does not pay. The
// mapping's size sits in the 64 bytes before the buffer, for xfree.
#define XALLOC_HEAD 64
static void *xalloc(size_t n)
{
    if (n >= (2u << 20)) {
        char *q = ms_map_huge(-1, n + XALLOC_HEAD, PROT_READ | PROT_WRITE);
        if (q == MAP_FAILED) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        *(size_t *)q = n + XALLOC_HEAD;
        return q + XALLOC_HEAD;
    }
    void *p = NULL;
    if (posix_memalign(&p, XALLOC_HEAD, n + XALLOC_HEAD)) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    *(size_t *)p = 0; // not mapped (for xfree)
    return (char *)p + XALLOC_HEAD;
}

static void xfree(void *p)
{
    if (!p) return;
    char *q = (char *)p - XALLOC_HEAD;
    const size_t mapped = *(size_t *)q;
    if (mapped) munmap(q, mapped);
    else free(q);
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *names[8] = {"avx512", "avx512_bf16", "avx2", NULL};
    int n_names = 3;
    if (argc > 2) {
        n_names = 0;
        for (int i = 2; i < argc && n_names < 8; i++) names[n_names++] = argv[i];
    }
    struct threadpool *pool;
    char err[256];
    if (threadpool_create(threads, &pool, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    // Each table's FMA peak on these threads (fma_burn on each, best of 5).
    for (int t = 0; t < n_names; t++) {
        const struct cpu_kernels *k = kernels_named(names[t]);
        if (!k || !k->fma_burn) continue;
        printf("%s FMA peak: %.1f GFLOP/s on %d threads\n", names[t], cpu_fma_peak(pool, k, 20000000, 5) / 1e9,
               threads);
    }
    uint64_t seed = 1;
    const char *only = getenv("BENCH_SHAPE");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const struct shape *sh = &shapes[s];
        if (only && !strstr(sh->what, only)) continue;
        const size_t welems = (size_t)sh->out * sh->in;
        const int sets = sh->sets, mats = sh->mats * sets;
        uint16_t *w = xalloc(welems * 2 * (size_t)mats);
        for (size_t i = 0; i < welems * (size_t)mats; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = ms_f32_to_bf16((float)((int)(seed >> 41) % 2001 - 1000) * 1e-3f);
        }
        float *x = xalloc((size_t)sh->rows * sh->mats * sh->in * 4);
        for (size_t i = 0; i < (size_t)sh->rows * sh->mats * sh->in; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
        float *y = xalloc((size_t)sh->rows * sh->mats * sh->out * 4);
        struct cpu_mm *jobs = xalloc((size_t)mats * sizeof *jobs);
        // routed: each of rows * mats / 8 tokens picks 8 distinct matrices
        // at random; matrix e's rows are tokens tok[cnt[e] .. cnt[e + 1]),
        // its outputs y's rows from cnt[e] on.
        int32_t *tok = NULL, *cnt = NULL, *pair = NULL;
        if (sh->routed) {
            const int n_tok = sh->rows * sh->mats / 8;
            tok = xalloc((size_t)n_tok * 8 * sizeof *tok);
            pair = xalloc((size_t)n_tok * 8 * sizeof *pair);
            cnt = xalloc(((size_t)sh->mats + 1) * sizeof *cnt);
            memset(cnt, 0, ((size_t)sh->mats + 1) * sizeof *cnt);
            int32_t *pick = xalloc((size_t)n_tok * 8 * sizeof *pick), *fill = xalloc((size_t)sh->mats * sizeof *fill);
            for (int t = 0; t < n_tok; t++)
                for (int j = 0; j < 8; j++) {
                    int e, dup;
                    do {
                        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                        e = (int)((seed >> 33) % (uint64_t)sh->mats);
                        dup = 0;
                        for (int i = 0; i < j; i++) dup |= pick[t * 8 + i] == e;
                    } while (dup);
                    pick[t * 8 + j] = e;
                    cnt[e + 1]++;
                }
            for (int e = 0; e < sh->mats; e++) cnt[e + 1] += cnt[e];
            memcpy(fill, cnt, (size_t)sh->mats * sizeof *fill);
            for (int i = 0; i < n_tok * 8; i++) {
                pair[fill[pick[i]]] = i;
                tok[fill[pick[i]]++] = i / 8;
            }
            xfree(fill);
            xfree(pick);
        }
        void *packed = NULL;
        const bool q = sh->quant != QUANT_NONE;
        const struct cpu_wmat w0 = {.data = q ? NULL : w, .dtype = DTYPE_BF16, .out = sh->out, .in = sh->in,
                                    .quant = sh->quant, .group = q ? QUANT_GROUP : 0};
        const size_t pb = cpu_pack_bytes(&w0);
        packed = xalloc(pb * (size_t)mats);
        for (int e = 0; e < mats; e++) {
            struct cpu_wmat we = w0;
            we.data = w + welems * (size_t)e;
            if (q) quant_pack(sh, w + welems * (size_t)e, (char *)packed + pb * (size_t)e);
            else cpu_pack_blocks(&we, 0, (sh->out + 15) / 16, (char *)packed + pb * (size_t)e);
        }
        // The bytes read: a routed matrix no token picked is not (until
        // 2026-12-07 they were counted too, which overstated the GB/s of
        // the routed shapes by the share of matrices left out).
        int read = sh->mats;
        if (sh->routed)
            for (int e = 0; e < sh->mats; e++) read -= cnt[e + 1] == cnt[e];
        const double flop = 2.0 * welems * sh->rows * sh->mats, bytes = (double)pb * read;
        printf("%s: %d x %d x %d, %d rows%s\n", sh->what, sh->out, sh->in, sh->mats, sh->rows,
               sh->routed ? " (their mean; matrices no token picked are not read)" : "");
        for (int t = 0; t < n_names; t++) {
            const struct cpu_kernels *k = kernels_named(names[t]);
            if (!k) {
                printf("  %-12s not on this CPU\n", names[t]);
                continue;
            }
            for (int e = 0; e < mats; e++) {
                struct cpu_wmat we = w0;
                if (!q) we.data = w + welems * (size_t)e;
                if (q || (k->wants_packed && k->wants_packed(&we))) we.packed = (char *)packed + pb * (size_t)e;
                const size_t i = (size_t)(e % sh->mats); // every set reads the same x, writes the same y
                jobs[e] = (struct cpu_mm){.w = we, .x = x + i * sh->rows * sh->in, .ldx = (size_t)sh->in,
                                          .y = y + i * sh->rows * sh->out, .ldy = (size_t)sh->out,
                                          .rows = sh->rows};
                if (sh->routed) {
                    jobs[e].rows = cnt[i + 1] - cnt[i];
                    if (sh->per_pair) { // x's rows in the experts' order, y's in pair order
                        jobs[e].x = x + (size_t)cnt[i] * sh->in;
                        jobs[e].y = y;
                        jobs[e].y_rows = pair + cnt[i];
                    } else { // x's rows gathered from the tokens', y's in the experts' order
                        jobs[e].x = x;
                        jobs[e].x_rows = tok + cnt[i];
                        jobs[e].y = y + (size_t)cnt[i] * sh->out;
                    }
                }
            }
            const size_t stride = cpu_kernels_scratch_floats(sh->in, 1, 1);
            struct cpu_xq xq = {0}; // as the backend runs it: a call's rows rounded once (ops.h)
            struct cpu_exec ex = {.pool = pool, .k = k, .scratch = xalloc((size_t)threads * stride * 4),
                                  .scratch_stride = stride, .xq = &xq};
            double best = 1e30, best_cpu = 1e30;
            cpu_matmul(&ex, jobs, sh->mats); // warm
            for (int rep = 0; rep < 7; rep++) {
                const struct cpu_mm *set = jobs + (size_t)((rep + 1) % sets) * sh->mats;
                const double t0 = ms_now(), c0 = cpu_now();
                cpu_matmul(&ex, set, sh->mats);
                const double dt = ms_now() - t0, dc = (cpu_now() - c0) / threads;
                if (dt < best) best = dt;
                if (dc < best_cpu) best_cpu = dc;
            }
            printf("  %-15s %8.2f ms  %7.1f GFLOP/s  %6.2f GB/s of weights | CPU time: %8.2f ms %7.1f GFLOP/s\n",
                   names[t], best * 1e3, flop / best / 1e9, bytes / best / 1e9, best_cpu * 1e3,
                   flop / best_cpu / 1e9);
            xfree(ex.scratch);
            cpu_xq_free(&xq);
        }
        xfree(jobs);
        xfree(tok);
        xfree(pair);
        xfree(cnt);
        xfree(packed);
        xfree(w);
        xfree(x);
        xfree(y);
    }
    threadpool_destroy(pool);
    return 0;
}
