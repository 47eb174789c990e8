// backend_cpu: the CPU backend's op table. It owns a rank's thread pool, its
// per-thread scratch, the weights packed once per model for the kernel table
// (shared by every CPU rank of the process; quantized ones in model/quant.h's
// blocks, made and quantized here at load, kept in a weights cache file that
// the next start maps: weights_cache.h), dummy weights, and the parallel
// loops that split each op over the threads. Every op runs synchronously:
// when it returns, its results are in memory.
#include "model/cpu/backend_cpu.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "model/cpu/ops.h"
#include "model/cpu/probe.h"
#include "model/cpu/sample.h"
#include "model/cpu/threadpool.h"
#include "model/cpu/weights_cache.h"
#include "model/fwd_plan.h"

struct cpu_backend {
    struct backend b;
    const struct cpu_kernels *k;
    struct threadpool *pool;
    struct cpu_exec ex;            // pool, k, per-thread scratch, xq
    struct cpu_xq xq;              // a matmul call's rounded activations (ops.h)
    size_t scratch_floats;         // per thread, as allocated
    struct cpu_sample_scratch **sample; // (threads) for rows of up to sample_vocab
    int sample_vocab;
    struct cpu_mm *jobs;           // matmul jobs of one op
    int jobs_cap;
    const int32_t **job_perm;      // each job's act-order input order, or NULL
    int job_perm_cap;
    // An op's act-order inputs (matmul_permuted): x gathered into each
    // order, the distinct gathers, and the pieces the threads take.
    float *xp;
    size_t xp_cap;                 // floats
    size_t xp_limit;               // the most a batch copies (XP_CAP_FLOATS; tests lower it)
    struct xp_gather *xg;
    int xg_cap;
    int32_t *xg_of;                // (jobs) each job's gather, -1: none
    int xg_of_cap;
    int32_t *xg_hash;              // open addressing over the gathers, -1: empty
    int xg_hash_cap;
    int32_t *xg_first;             // (gathers) a batch's first piece of each
    int xg_first_cap;
    struct cpu_mm *bjobs;          // the jobs of one batch of gathers
    int bjobs_cap;
    struct xp_piece *xpc;
    int xpc_cap;
    int32_t *tiles;                // attention tiles: (first token, tokens) pairs
    int tiles_cap;
    int32_t *fill;                 // moe_route: each expert's pairs, then its next free row
    int fill_cap;
    // RoPE's cos and sin for the tokens of a step, (rope_n, 2, half): every
    // layer of a step rotates by the same angles, so they are computed when
    // the positions (or the frequencies) differ from the last call's.
    float *rope_cs;
    int32_t *rope_pos;             // (rope_n) the positions they are for
    double *rope_inv;              // (rope_half) the frequencies they are for
    int rope_n, rope_half, rope_cap, rope_pos_cap, rope_inv_cap; // rope_n -1: none
};

static struct cpu_backend *cpu_of(struct backend *b) { return (struct cpu_backend *)b; }

// ---- parallel loops ------------------------------------------------------------

typedef void (*range_fn)(void *ctx, int begin, int end, int tid);

struct par_ctx {
    range_fn fn;
    void *ctx;
    int n;
    int chunk;
    _Atomic int next;  // dynamic scheduling: the next item to take
};

static void par_dynamic(void *arg, int tid, int n_threads)
{
    (void)n_threads;
    struct par_ctx *c = arg;
    for (;;) {
        int b = atomic_fetch_add(&c->next, c->chunk);
        if (b >= c->n) return;
        c->fn(c->ctx, b, b + c->chunk < c->n ? b + c->chunk : c->n, tid);
    }
}

// Items taken chunk by chunk by whichever thread is free (a thread off its
// core holds nothing up: threadpool_run_shared). Items of unequal cost
// (attention rows of a prefill, sampled rows) go one at a time.
static void par_for_dynamic(struct cpu_backend *c, int n, int chunk, range_fn fn, void *ctx)
{
    if (n <= 0) return;
    // One row (a decode step) is not worth waking the other threads for.
    if (n == 1) {
        fn(ctx, 0, 1, 0);
        return;
    }
    struct par_ctx p = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
    threadpool_run_shared(c->pool, par_dynamic, &p);
}

// Items of equal cost: a few chunks per thread.
static void par_for(struct cpu_backend *c, int n, range_fn fn, void *ctx)
{
    const int pieces = 4 * threadpool_size(c->pool);
    par_for_dynamic(c, n, (n + pieces - 1) / pieces, fn, ctx);
}

static struct cpu_wmat wmat_of(const struct backend_mat *m)
{
    return (struct cpu_wmat){.data = m->data, .packed = m->priv, .dtype = m->dtype,
                             .out = m->rows, .in = m->cols, .quant = m->quant,
                             .group = m->group_cols};
}

static int grow(struct cpu_backend *c, void **p, int *cap, int want, size_t elem, const char *what)
{
    if (want <= *cap) return 0;
    int n = *cap ? *cap : 16;
    while (n < want) n = n > INT32_MAX / 2 ? want : n * 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return backend_fail(&c->b, MS_ENOMEM, "out of memory for %d %s", want, what);
    *p = q;
    *cap = n;
    return 0;
}

// ---- memory ----------------------------------------------------------------------

// Every allocation is its own mapping with a 64-byte header that remembers
// its length: zeroed pages, committed only when touched (a workspace sized
// for the worst step costs only what steps use). From 2 MiB on, on 2 MiB
// pages (ms_map_huge): the first steps of a server touch its workspace
// afresh, and in 4 KiB pages that was a fault per page at 8.7 us each on
// the VMs we run on.
#define HDR 64
#define HUGE_FROM ((size_t)2 << 20)

static int cpu_alloc(struct backend *b, size_t bytes, void **out)
{
    *out = NULL;
    size_t total;
    if (ms_add_overflow(bytes, HDR, &total))
        return backend_fail(b, MS_ENOMEM, "an allocation of %zu bytes overflows", bytes);
    void *p = total >= HUGE_FROM ? ms_map_huge(-1, total, PROT_READ | PROT_WRITE)
                                 : mmap(NULL, total, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return backend_fail(b, MS_ENOMEM, "cannot map %.1f MiB of memory",
                            (double)bytes / (1 << 20));
    memcpy(p, &total, sizeof total);
    *out = (char *)p + HDR;
    return 0;
}

static void cpu_free(struct backend *b, void *p)
{
    (void)b;
    if (!p) return;
    char *base = (char *)p - HDR;
    size_t total;
    memcpy(&total, base, sizeof total);
    munmap(base, total);
}

static int cpu_copy(struct backend *b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

static int cpu_copy_2d(struct backend *b, void *dst, size_t dst_pitch, const void *src,
                       size_t src_pitch, size_t bytes, int rows)
{
    (void)b;
    for (int i = 0; i < rows; i++)
        memcpy((char *)dst + (size_t)i * dst_pitch, (const char *)src + (size_t)i * src_pitch, bytes);
    return 0;
}

static int cpu_sync(struct backend *b)
{
    (void)b;
    return 0;
}

static int cpu_memory(struct backend *b, struct backend_memory *out)
{
    (void)b;
    memset(out, 0, sizeof *out);
    out->host_shared = true;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) out->total_bytes = (uint64_t)pages * (uint64_t)page;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                out->free_bytes = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    if (!out->free_bytes) {
        long avail = sysconf(_SC_AVPHYS_PAGES);
        if (avail > 0 && page > 0) out->free_bytes = (uint64_t)avail * (uint64_t)page;
    }
    return 0;
}

static int cpu_measure_limits(struct backend *b, struct backend_limits *out)
{
    struct cpu_backend *c = cpu_of(b);
    struct cpu_read_probe probe;
    char err[256];
    int rc = cpu_read_probe_create((size_t)1 << 30, &probe, err, sizeof err);
    if (rc) return backend_fail(b, rc, "%s", err);
    // Best of three passes: one pass on a shared machine is often slowed.
    out->read_bytes_per_s = cpu_read_probe_run(&probe, c->pool, c->k, 3);
    cpu_read_probe_destroy(&probe);
    out->flops = cpu_fma_peak(c->pool, c->k, 4000000, 1);
    return 0;
}

static const char *cpu_variant(const struct backend *b)
{
    return ((const struct cpu_backend *)b)->k->name;
}

// ---- weights: packed once per model, shared by the ranks -------------------------

// One model's weights for one kernel table, shared by every CPU rank of the
// process (they share the memory, so one packed copy serves all of them).
struct shared_weights {
    const struct model *m;
    const struct cpu_kernels *k;
    int refs;
    struct backend_weights w;   // expert range: all
    void *map;                  // one mapping holding both areas below (anonymous, or a
    size_t map_bytes;           // weights cache file: weights_cache.h), or NULL
    char *packed;               // the packed blocks
    size_t packed_bytes;
    char *made;                 // the weights not packed that live here: a dummy load's, and
                                // the embedding (copied from the file)
    size_t made_bytes;
    int cache;                  // 0: not cached; 1: mapped from a cache file; 2: written to one
    struct shared_weights *next;
};

static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static struct shared_weights *shared_list;

typedef void (*tensor_fn)(const struct tensor *t, struct backend_mat *out, void *ctx);

// Every tensor of the model with its backend_mat, in one fixed order.
static void for_each_tensor(const struct model *m, struct backend_weights *w, tensor_fn fn, void *ctx)
{
    fn(&m->embed, &w->embed, ctx);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const struct layer_weights *L = &m->layers[i];
        struct backend_layer *B = &w->layers[i];
        fn(&L->attn_norm, &B->attn_norm, ctx);
        fn(&L->wq, &B->wq, ctx);
        fn(&L->wk, &B->wk, ctx);
        fn(&L->wv, &B->wv, ctx);
        fn(&L->wo, &B->wo, ctx);
        fn(&L->q_norm, &B->q_norm, ctx);
        fn(&L->k_norm, &B->k_norm, ctx);
        fn(&L->ffn_norm, &B->ffn_norm, ctx);
        if (L->is_moe) {
            fn(&L->router, &B->router, ctx);
            for (int e = 0; e < m->cfg.n_experts; e++) {
                fn(&L->experts[e].gate, &B->expert_gate[e], ctx);
                fn(&L->experts[e].up, &B->expert_up[e], ctx);
                fn(&L->experts[e].down, &B->expert_down[e], ctx);
            }
        } else {
            fn(&L->gate, &B->gate, ctx);
            fn(&L->up, &B->up, ctx);
            fn(&L->down, &B->down, ctx);
        }
    }
    fn(&m->final_norm, &w->final_norm, ctx);
    // A tied lm_head is the embedding's bytes, multiplied: packed like any matrix.
    fn(&m->lm_head, &w->lm_head, ctx);
}

struct prep_job {
    const struct tensor *t;
    struct backend_mat *mat;
    size_t packed_off;          // SIZE_MAX: not packed
    size_t made_off;            // SIZE_MAX: nothing to make here
};

struct prep_ctx {
    const struct model *m;
    const struct cpu_kernels *k;
    struct prep_job *jobs;      // NULL on the counting pass
    size_t n_jobs;
    size_t packed_bytes, made_bytes, tmp_bytes;
    size_t qrows_bytes;         // a block's canonical quantized rows and a row of floats
    char *packed, *made;
    _Atomic size_t next;        // the next job a worker takes
    _Atomic int failed;
};

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

// Plans one tensor: a matrix the table reads packed gets a packed slot; a
// dummy tensor that is not packed gets room where its values are made, and
// so does the embedding, copied there from the file. Its lookups read rows
// at random: from the file's mapping each row a token had not met before
// took a page fault (a 64-stream decode step of random tokens 0.9 ms of
// them on the VMs measured here, a 2048-token prompt step 22 ms), where the
// areas here are on 2 MiB pages and, in a weights cache, locked.
static void plan_tensor(const struct tensor *t, struct backend_mat *mat, void *arg)
{
    struct prep_ctx *c = arg;
    const bool quant = t->quant.format != QUANT_NONE;
    *mat = (struct backend_mat){.dtype = t->dtype, .rows = t->ndim == 2 ? (int)t->shape[0] : 1,
                                .cols = t->ndim == 2 ? (int)t->shape[1] : (int)t->shape[0],
                                .data = quant ? NULL : t->data};
    if (quant) {
        mat->quant = t->quant.format;
        mat->group_rows = 1;
        mat->group_cols = t->quant.group;
        // A folded order: the gate and up write down's inputs in it.
        mat->perm = t->quant.perm_folded ? NULL : t->quant.perm;
    }
    struct prep_job j = {.t = t, .mat = mat, .packed_off = SIZE_MAX, .made_off = SIZE_MAX};
    const struct cpu_wmat w = {.data = t->data, .dtype = t->dtype, .out = mat->rows, .in = mat->cols,
                               .quant = mat->quant, .group = mat->group_cols};
    const size_t bytes = tensor_elems(t) * dtype_size(t->dtype);
    // The embedding is read row by row in a lookup, never multiplied; a
    // quantized matrix exists only packed, for every table.
    const bool pack = t->ndim == 2 && t != &c->m->embed &&
                      (quant || (c->k->wants_packed && c->k->wants_packed(&w)));
    if (pack && quant) {
        j.packed_off = c->packed_bytes;
        c->packed_bytes += round64(cpu_pack_bytes(&w));
        const size_t q = quant_rows_bytes(CPU_PACK_OUTS, mat->cols, mat->quant, mat->group_cols) +
                         (size_t)mat->cols * sizeof(float);
        if (q > c->qrows_bytes) c->qrows_bytes = q;
    } else if (pack) {
        j.packed_off = c->packed_bytes;
        c->packed_bytes += round64(cpu_pack_bytes(&w));
        if (!t->data && bytes > c->tmp_bytes) c->tmp_bytes = bytes;
    } else if (!t->data || t == &c->m->embed) {
        j.made_off = c->made_bytes;
        c->made_bytes += round64(bytes);
    }
    if (pack || j.made_off != SIZE_MAX) {
        if (c->jobs) c->jobs[c->n_jobs] = j;
        c->n_jobs++;
    }
}

// Element values of a dummy tensor into dst, in its dtype.
static void make_dummy(const struct tensor *t, void *dst)
{
    const size_t n = tensor_elems(t);
    for (size_t i = 0; i < n; i++) {
        const float v = tensor_dummy_value(t, i);
        if (t->dtype == DTYPE_F32) ((float *)dst)[i] = v;
        else if (t->dtype == DTYPE_F16) ((uint16_t *)dst)[i] = ms_f32_to_f16(v);
        else ((uint16_t *)dst)[i] = ms_f32_to_bf16(v);
    }
}

// A quantized matrix, block by block: its canonical rows (read from the
// checkpoint's format, or made and quantized here: a dummy's values never
// exist for more than 16 rows at a time), packed.
static void pack_quantized(const struct tensor *t, const struct backend_mat *mat, char *dst, void *buf)
{
    const int K = mat->cols;
    struct quant_rows r;
    quant_rows_init(&r, buf, CPU_PACK_OUTS, K, mat->quant, mat->group_cols);
    float *row = (float *)((char *)buf + quant_rows_bytes(CPU_PACK_OUTS, K, mat->quant, mat->group_cols));
    const size_t bb = quant_block_bytes(mat->quant, K, mat->group_cols);
    for (int o = 0; o < mat->rows; o += CPU_PACK_OUTS) {
        const int n = mat->rows - o < CPU_PACK_OUTS ? mat->rows - o : CPU_PACK_OUTS;
        r.n = n;
        quant_tensor_rows(t, o, n, &r, row);
        cpu_qpack_block(&r, dst + (size_t)(o / CPU_PACK_OUTS) * bb);
    }
}

// Gives the whole pages of a tensor's file bytes back to the page cache:
// they are not read again once packed.
static void drop_pages(const void *p, size_t bytes)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    const uintptr_t lo = (a + pg - 1) / pg * pg, hi = (a + bytes) / pg * pg;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void *prep_worker(void *arg)
{
    struct prep_ctx *c = arg;
    void *tmp = NULL, *qbuf = NULL;
    if (c->tmp_bytes) tmp = malloc(c->tmp_bytes);
    if (c->qrows_bytes) qbuf = malloc(c->qrows_bytes);
    if ((c->tmp_bytes && !tmp) || (c->qrows_bytes && !qbuf)) {
        free(tmp);
        free(qbuf);
        atomic_store(&c->failed, 1);
        return NULL;
    }
    for (size_t i; (i = atomic_fetch_add(&c->next, 1)) < c->n_jobs;) {
        const struct prep_job *j = &c->jobs[i];
        const struct tensor *t = j->t;
        if (j->made_off != SIZE_MAX) {
            if (t->data) {
                const size_t bytes = tensor_elems(t) * dtype_size(t->dtype);
                memcpy(c->made + j->made_off, t->data, bytes);
                drop_pages(t->data, bytes);
            } else {
                make_dummy(t, c->made + j->made_off);
            }
            j->mat->data = c->made + j->made_off;
            continue;
        }
        if (j->mat->quant != QUANT_NONE) {
            pack_quantized(t, j->mat, c->packed + j->packed_off, qbuf);
            j->mat->priv = c->packed + j->packed_off;
            // The file's values are not read again: bf16 rows, FP8 bytes, packed int8 bytes and
            // int4 nibbles.
            const size_t n = tensor_elems(t);
            if (t->data)
                drop_pages(t->data, t->quant.source == QUANT_SRC_AT_LOAD                          ? n * dtype_size(t->dtype)
                                    : t->quant.source == QUANT_SRC_FP8 || t->quant.format == QUANT_INT8 ? n
                                                                                                        : n / 2);
            continue;
        }
        struct cpu_wmat w = {.data = t->data ? t->data : tmp, .dtype = t->dtype,
                             .out = j->mat->rows, .in = j->mat->cols};
        if (!t->data) make_dummy(t, tmp);
        cpu_pack_blocks(&w, 0, (w.out + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS, c->packed + j->packed_off);
        j->mat->priv = c->packed + j->packed_off;
        // The file's copy is not read again (a tied embedding's lookups read
        // its copy in the made area).
        if (t->data) drop_pages(t->data, tensor_elems(t) * dtype_size(t->dtype));
    }
    free(tmp);
    free(qbuf);
    return NULL;
}

// Tens of GB touched once each, on 2 MiB pages (ms_map_huge).
static void *map_anon(size_t bytes)
{
    if (!bytes) return NULL;
    void *p = ms_map_huge(-1, bytes, PROT_READ | PROT_WRITE);
    return p == MAP_FAILED ? NULL : p;
}

static size_t round_page(size_t n)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

// Where the packed and made areas live: a weights cache file (mapped as
// found, or created to be written), else anonymous memory. Sets *cached:
// 1 when the file holds them already, 2 when it is being written, 0 not.
static bool map_areas(struct shared_weights *s, struct weights_cache *wc, int use_cache, int *cached)
{
    *cached = 0;
    if (use_cache > 0 && (weights_cache_map(wc) || weights_cache_create(wc))) {
        *cached = wc->fd >= 0 ? 2 : 1;
        s->map = wc->map;
        s->map_bytes = wc->map_bytes;
        s->packed = (char *)wc->map + wc->data_off;
        s->made = (char *)wc->map + wc->made_off;
        return true;
    }
    s->map_bytes = round_page(s->packed_bytes) + round_page(s->made_bytes);
    s->map = map_anon(s->map_bytes);
    if (!s->map) return s->map_bytes == 0;
    s->packed = s->map;
    s->made = (char *)s->map + round_page(s->packed_bytes);
    return true;
}

// Points every matrix at its place in areas that already hold the weights.
static void bind_areas(const struct prep_ctx *c)
{
    for (size_t i = 0; i < c->n_jobs; i++) {
        const struct prep_job *j = &c->jobs[i];
        if (j->made_off != SIZE_MAX) j->mat->data = c->made + j->made_off;
        else j->mat->priv = c->packed + j->packed_off;
    }
}

static void shared_free(struct shared_weights *s)
{
    if (!s) return;
    if (s->w.layers) {
        for (int i = 0; i < s->m->cfg.n_layers; i++) free(s->w.layers[i].expert_gate);
        free(s->w.layers);
    }
    free(s->w.rope_inv_freq);
    if (s->map) munmap(s->map, s->map_bytes);
    free(s);
}

// Builds the shared weights: plans every tensor, maps the packed and made
// areas, then packs (and makes) on every core — a 30B checkpoint is tens of
// GB to reorder, and minutes on one thread.
static int shared_build(struct backend *b, const struct model *m, const struct cpu_kernels *k,
                        struct shared_weights **out)
{
    const struct model_config *cfg = &m->cfg;
    struct shared_weights *s = calloc(1, sizeof *s);
    if (!s) return backend_fail(b, MS_ENOMEM, "out of memory for the weights");
    s->m = m;
    s->k = k;
    s->w.cfg = cfg;
    s->w.expert_begin = 0;
    s->w.expert_end = cfg->n_experts;
    s->w.layers = calloc((size_t)cfg->n_layers, sizeof *s->w.layers);
    s->w.rope_inv_freq = calloc((size_t)cfg->head_dim / 2 + 1, sizeof *s->w.rope_inv_freq);
    bool ok = s->w.layers && s->w.rope_inv_freq;
    for (int i = 0; ok && i < cfg->n_layers; i++) {
        struct backend_layer *B = &s->w.layers[i];
        B->is_moe = m->layers[i].is_moe;
        if (!B->is_moe) continue;
        // One allocation for the three arrays of the layer.
        B->expert_gate = calloc((size_t)cfg->n_experts * 3, sizeof *B->expert_gate);
        ok = B->expert_gate != NULL;
        if (ok) {
            B->expert_up = B->expert_gate + cfg->n_experts;
            B->expert_down = B->expert_up + cfg->n_experts;
        }
    }
    if (!ok) {
        shared_free(s);
        return backend_fail(b, MS_ENOMEM, "out of memory for the weight tables");
    }
    // As Hugging Face computes them: theta^(-2i / head_dim).
    for (int i = 0; i < cfg->head_dim / 2; i++)
        s->w.rope_inv_freq[i] = pow(cfg->rope_theta, -2.0 * i / cfg->head_dim);

    const double t0 = ms_now();
    struct prep_ctx c = {.m = m, .k = k};
    for_each_tensor(m, &s->w, plan_tensor, &c);
    if (c.n_jobs) {
        s->packed_bytes = c.packed_bytes;
        s->made_bytes = c.made_bytes;
        struct weights_cache wc;
        const int use_cache = weights_cache_open(&wc, m, k->name, c.packed_bytes, c.made_bytes);
        int cached = 0;
        c.jobs = calloc(c.n_jobs, sizeof *c.jobs);
        if (use_cache < 0 || !c.jobs || !map_areas(s, &wc, use_cache, &cached)) {
            free(c.jobs);
            weights_cache_close(&wc);
            shared_free(s);
            return backend_fail(b, MS_ENOMEM, "cannot map %.1f MiB for the weights prepared for the "
                                "%s kernels", (double)(c.packed_bytes + c.made_bytes) / (1 << 20),
                                k->name);
        }
        c.packed = s->packed;
        c.made = s->made;
        c.n_jobs = c.packed_bytes = c.made_bytes = 0;
        for_each_tensor(m, &s->w, plan_tensor, &c);
        int threads = 1;
        if (cached == 1) {
            bind_areas(&c);
        } else {
            threads = threadpool_run_once(prep_worker, &c, c.n_jobs > 64 ? 64 : (int)c.n_jobs);
        }
        free(c.jobs);
        if (atomic_load(&c.failed)) {
            weights_cache_close(&wc);
            shared_free(s);
            return backend_fail(b, MS_ENOMEM, "out of memory making the dummy weights");
        }
        if (cached == 2 && !weights_cache_commit(&wc)) {
            cached = 0;
            if (wc.damaged) {
                // The weights in memory are the file's pages read back: damaged.
                weights_cache_close(&wc);
                shared_free(s);
                return backend_fail(b, MS_EIO, "the weights cache file read back from the disk differs "
                                    "from what was written to it (the disk or file system damaged it); "
                                    "--cache-dir none prepares the weights in memory without it");
            }
        }
        const char *how = cached == 1 ? "mapped from the cache" : cached == 2 ? "written to the cache" : "";
        ms_log(MS_LOG_INFO, "prepared %zu tensors for the %s kernels (%.1f MiB packed%s%s%s%s) in "
               "%.2f s%s%s on %d thread%s", c.n_jobs, k->name, (double)s->packed_bytes / (1 << 20),
               m->quant != QUANT_NONE ? ", projections " : "",
               m->quant != QUANT_NONE ? quant_format_name(m->quant) : "",
               m->n_perms ? " in act-order" : "",
               m->dummy ? ", dummy weights made here" : "", ms_now() - t0, cached ? ", " : "", how,
               threads, threads > 1 ? "s" : "");
        if (cached) ms_log(MS_LOG_INFO, "weights cache: %s", wc.path);
        s->cache = cached;
        weights_cache_close(&wc);
    }
    *out = s;
    return 0;
}

static int cpu_prepare_weights(struct backend *b, const struct model *m, int expert_begin,
                               int expert_end, struct backend_weights **out)
{
    struct cpu_backend *c = cpu_of(b);
    *out = NULL;
    const struct model_config *cfg = &m->cfg;
    if (expert_begin < 0 || expert_end < expert_begin || expert_end > cfg->n_experts)
        return backend_fail(b, MS_EINVAL, "expert range [%d, %d) is outside the model's %d experts",
                            expert_begin, expert_end, cfg->n_experts);
    struct backend_weights *w = calloc(1, sizeof *w);
    if (!w) return backend_fail(b, MS_ENOMEM, "out of memory for the weights");
    pthread_mutex_lock(&shared_mu);
    struct shared_weights *s = shared_list;
    while (s && !(s->m == m && s->k == c->k)) s = s->next;
    int rc = 0;
    if (!s && (rc = shared_build(b, m, c->k, &s)) == 0) {
        s->next = shared_list;
        shared_list = s;
    }
    if (s) s->refs++;
    pthread_mutex_unlock(&shared_mu);
    if (rc) {
        free(w);
        return rc;
    }
    *w = s->w;
    w->expert_begin = expert_begin;
    w->expert_end = expert_end;
    w->priv = s;
    // Scratch for the widest matmul input and the attention of this model.
    const int max_in = cfg->hidden_size > cfg->n_heads * cfg->head_dim
                           ? cfg->hidden_size : cfg->n_heads * cfg->head_dim;
    int widest = max_in;
    if (cfg->moe_intermediate_size > widest) widest = cfg->moe_intermediate_size;
    if (cfg->intermediate_size > widest) widest = cfg->intermediate_size;
    const size_t need = (cpu_kernels_scratch_floats(widest, cfg->n_heads / cfg->n_kv_heads,
                                                    cfg->head_dim) + 15) / 16 * 16;
    if (need > c->scratch_floats) {
        const int n = threadpool_size(c->pool);
        float *sc = aligned_alloc(64, round64((size_t)n * need * sizeof(float)));
        if (!sc) {
            b->ops->release_weights(b, w);
            return backend_fail(b, MS_ENOMEM, "out of memory for %d threads' scratch", n);
        }
        free(c->ex.scratch);
        c->ex.scratch = sc;
        c->ex.scratch_stride = need;
        c->scratch_floats = need;
    }
    *out = w;
    return 0;
}

static void cpu_release_weights(struct backend *b, struct backend_weights *w)
{
    (void)b;
    if (!w) return;
    struct shared_weights *s = w->priv;
    pthread_mutex_lock(&shared_mu);
    if (s && --s->refs == 0) {
        struct shared_weights **p = &shared_list;
        while (*p && *p != s) p = &(*p)->next;
        if (*p) *p = s->next;
    } else {
        s = NULL;
    }
    pthread_mutex_unlock(&shared_mu);
    shared_free(s);
    free(w);
}

// The pool's K and V, each one mapping of zeroed pages on 2 MiB pages
// (ms_map_huge): new sequences write into blocks never touched before until
// the whole pool has been used once, and in 4 KiB pages each of those
// writes was a page fault (8.7 us each on the VMs we run on). With the
// workspace's (cpu_alloc): `bench-offline` of 64 streams of 128-token
// prompts on the mid model took 104,000 faults, 13,400 on 2 MiB pages.
static size_t kv_bytes(const struct kv_pool *kv)
{
    const size_t n = kv_pool_bytes(kv);
    return n ? n : 1;
}

static int cpu_kv_alloc(struct backend *b, struct kv_pool *kv)
{
    const size_t bytes = kv_bytes(kv);
    void *k = ms_map_huge(-1, bytes, PROT_READ | PROT_WRITE);
    void *v = k == MAP_FAILED ? MAP_FAILED : ms_map_huge(-1, bytes, PROT_READ | PROT_WRITE);
    if (v == MAP_FAILED) {
        if (k != MAP_FAILED) munmap(k, bytes);
        kv->k = kv->v = NULL;
        return backend_fail(b, MS_ENOMEM, "cannot allocate a KV pool of %d blocks (2 x %.1f MiB)",
                            kv->n_blocks, (double)bytes / (1 << 20));
    }
    kv->k = k;
    kv->v = v;
    return 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 // Linux 5.14
#endif

// The range's whole pages in 2 MiB pieces, faulted in by the threads side
// by side: a fault's cost is the kernel's (and on a VM its host's) work on
// one page, which the threads share.
struct prefault_ctx {
    char *start;
    size_t bytes, pieces;
    bool populate;   // the kernel knows MADV_POPULATE_WRITE
    _Atomic int err; // the first errno
};

static void prefault_pieces(void *arg, int tid, int n_threads)
{
    struct prefault_ctx *c = arg;
    int begin, end;
    threadpool_range((int)c->pieces, tid, n_threads, &begin, &end);
    for (int i = begin; i < end && !atomic_load(&c->err); i++) {
        const size_t off = (size_t)i << 21;
        char *p = c->start + off;
        const size_t len = c->bytes - off < ((size_t)1 << 21) ? c->bytes - off : (size_t)1 << 21;
        if (c->populate) {
            if (madvise(p, len, MADV_POPULATE_WRITE) == 0) continue;
            int none = 0;
            atomic_compare_exchange_strong(&c->err, &none, errno);
            return;
        }
        // A kernel without it (before 5.14): a write to each 4 KiB page
        // that neither reads first nor changes a byte, a compare-exchange
        // of 0 for 0 (x86's LOCK CMPXCHG writes whether or not it matches).
        // A read first would map the shared zero page, and a write to that
        // splits a 2 MiB range into 4 KiB pages on the kernels of that age
        // (5.8 on). Not an atomic add of 0: clang makes that a plain load
        // (with or without volatile), GCC kept it.
        for (size_t o = 0; o < len; o += 4096) {
            char zero = 0;
            __atomic_compare_exchange_n(p + o, &zero, 0, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        }
    }
}

static int cpu_prefault(struct backend *b, void *p, size_t bytes)
{
    if (!p || bytes == 0) return 0;
    // Whole pages: every page the range touches belongs to its mapping.
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    const uintptr_t lo = a / pg * pg, hi = (a + bytes + pg - 1) / pg * pg;
    // Zero bytes: 0 where the kernel knows the advice, EINVAL where not (any
    // later EINVAL is an error: a mapping it cannot populate).
    struct prefault_ctx c = {.start = (char *)lo, .bytes = hi - lo,
                             .populate = madvise((void *)lo, 0, MADV_POPULATE_WRITE) == 0};
    c.pieces = (c.bytes + ((size_t)1 << 21) - 1) >> 21;
    if (c.pieces > INT_MAX)
        return backend_fail(b, MS_ENOFIT, "%zu bytes are too many to fault in", bytes);
    threadpool_run(cpu_of(b)->pool, prefault_pieces, &c);
    const int e = atomic_load(&c.err);
    if (e)
        return backend_fail(b, MS_ENOMEM, "cannot make %.1f MiB resident (%s): free memory, or lower "
                            "--kv-cache-memory or --max-num-batched-tokens", (double)bytes / (1 << 20), strerror(e));
    return 0;
}

static void cpu_kv_free(struct backend *b, struct kv_pool *kv)
{
    (void)b;
    if (kv->k) munmap(kv->k, kv_bytes(kv));
    if (kv->v) munmap(kv->v, kv_bytes(kv));
    kv->k = kv->v = NULL;
}

// ---- the ops -----------------------------------------------------------------------

struct embed_ctx {
    const struct backend_mat *table;
    const int32_t *ids;
    float *x;
};

static void embed_rows(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct embed_ctx *c = arg;
    const int hd = c->table->cols;
    for (int t = b; t < e; t++) {
        float *x = c->x + (size_t)t * hd;
        const size_t base = (size_t)c->ids[t] * hd;
        for (int i = 0; i < hd; i++) x[i] = cpu_load_weight(c->table->data, c->table->dtype, base + i);
    }
}

static int cpu_embed(struct backend *b, const struct backend_weights *w, const int32_t *ids, int n,
                     float *x)
{
    struct embed_ctx c = {.table = &w->embed, .ids = ids, .x = x};
    par_for(cpu_of(b), n, embed_rows, &c);
    return 0;
}

struct norm_ctx {
    const struct cpu_kernels *k;
    const float *x;
    size_t ldx;
    const int32_t *rows;
    const struct backend_mat *w;
    float eps;
    float *out;
};

static void norm_rows(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct norm_ctx *c = arg;
    const int n = c->w->cols;
    for (int i = b; i < e; i++)
        c->k->rmsnorm(c->x + (size_t)(c->rows ? c->rows[i] : i) * c->ldx, c->w->data, c->w->dtype, n,
                      c->eps, c->out + (size_t)i * n);
}

static int cpu_rmsnorm_op(struct backend *b, const float *x, size_t ldx, const int32_t *rows, int n,
                          const struct backend_mat *w, float eps, float *out)
{
    struct cpu_backend *c = cpu_of(b);
    struct norm_ctx nc = {.k = c->k, .x = x, .ldx = ldx, .rows = rows, .w = w, .eps = eps, .out = out};
    par_for(c, n, norm_rows, &nc);
    return 0;
}

// ---- act-order inputs -------------------------------------------------------------
// A matrix of an act-order checkpoint holds its inputs in the order that
// makes each scale group's inputs consecutive (backend_mat.perm), so its
// job reads x gathered into that order: once per distinct (order, x, rows)
// of an op, since an expert's gate and up share one order and one x, into
// c->xp, and the job then reads that copy. At 16 decode streams that is a
// few hundred KiB against the tens of MiB of weights the experts read; a
// prefill's is a row of the hidden size per (token, expert), so the copies
// are made and multiplied XP_CAP_FLOATS at a time (the CPU's runtime
// reserve in the memory plan is 64 MiB), a gather of more rows than that
// split by rows: a row's result does not depend on the rows beside it.
struct xp_gather {
    const int32_t *perm;
    const float *x;
    size_t ldx;
    const int32_t *x_rows;
    int rows, in;
};

// Rows [r0, r1) of a gather, copied to c->xp + off (in floats apart).
struct xp_piece {
    int gather, r0, r1;
    size_t off;
};

#define XP_CAP_FLOATS ((size_t)8 << 20)
#define XP_PIECE_ROWS 32
// Small batches are copied on the calling thread: waking the pool costs
// more than copying a decode step's few rows of q, k and v.
#define XP_INLINE_FLOATS ((size_t)64 << 10)

static void xp_pieces(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct cpu_backend *c = arg;
    for (int i = b; i < e; i++) {
        const struct xp_piece *pc = &c->xpc[i];
        const struct xp_gather *g = &c->xg[pc->gather];
        for (int r = pc->r0; r < pc->r1; r++) {
            float *dst = c->xp + pc->off + (size_t)(r - pc->r0) * (size_t)g->in;
            const int xi = g->x_rows ? g->x_rows[r] : r;
            if (xi < 0) {
                memset(dst, 0, (size_t)g->in * sizeof *dst); // a padding row: read by nobody
                continue;
            }
            const float *src = g->x + (size_t)xi * g->ldx;
            for (int k = 0; k < g->in; k++) dst[k] = src[g->perm[k]];
        }
    }
}

static uint64_t xp_key(const int32_t *perm, const struct cpu_mm *m)
{
    uint64_t h = (uint64_t)(uintptr_t)perm * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)(uintptr_t)m->x + (uint64_t)(uintptr_t)m->x_rows * 31u + (uint64_t)m->rows) * 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

static bool xp_same(const struct xp_gather *g, const int32_t *perm, const struct cpu_mm *m)
{
    return g->perm == perm && g->x == m->x && g->ldx == m->ldx && g->x_rows == m->x_rows && g->rows == m->rows &&
           g->in == m->w.in;
}

// Finds the distinct gathers of jobs[0, n) (c->xg) and each job's
// (c->xg_of, -1 for a job without an order) through a hash of (order, x,
// rows): a MoE layer's call holds two jobs for each of up to a few hundred
// experts. Returns how many, or an error.
static int xp_plan(struct cpu_backend *c, const struct cpu_mm *jobs, const int32_t *const *perms, int n)
{
    int rc, hcap = 16;
    while (hcap < 2 * n) hcap *= 2;
    if ((rc = grow(c, (void **)&c->xg_of, &c->xg_of_cap, n, sizeof *c->xg_of, "act-order gathers")) ||
        (rc = grow(c, (void **)&c->xg_hash, &c->xg_hash_cap, hcap, sizeof *c->xg_hash, "act-order gathers")))
        return rc;
    memset(c->xg_hash, 0xff, (size_t)hcap * sizeof *c->xg_hash);
    int ng = 0;
    for (int i = 0; i < n; i++) {
        c->xg_of[i] = -1;
        if (!perms[i] || jobs[i].rows <= 0 || jobs[i].w.out <= 0) continue;
        size_t h = (size_t)(xp_key(perms[i], &jobs[i]) & (uint64_t)(hcap - 1));
        while (c->xg_hash[h] >= 0 && !xp_same(&c->xg[c->xg_hash[h]], perms[i], &jobs[i]))
            h = (h + 1) & (size_t)(hcap - 1);
        if (c->xg_hash[h] < 0) {
            if ((rc = grow(c, (void **)&c->xg, &c->xg_cap, ng + 1, sizeof *c->xg, "act-order gathers")))
                return rc;
            c->xg[ng] = (struct xp_gather){.perm = perms[i], .x = jobs[i].x, .ldx = jobs[i].ldx,
                                           .x_rows = jobs[i].x_rows, .rows = jobs[i].rows, .in = jobs[i].w.in};
            c->xg_hash[h] = ng++;
        }
        c->xg_of[i] = c->xg_hash[h];
    }
    return ng;
}

// Runs jobs[0, n) (cpu_matmul), those whose perms[i] is set over x
// gathered into that order (see above), XP_CAP_FLOATS of copies at a time.
// Why it is long: it plans the gathers, runs the jobs without one, then
// walks the gathers in batches, each a copy and a matmul of the jobs (or
// the row ranges of them) that read it.
static int matmul_permuted(struct cpu_backend *c, struct cpu_mm *jobs, const int32_t *const *perms, int n)
{
    const int ng = xp_plan(c, jobs, perms, n);
    if (ng < 0) return ng;
    int rc, nb = 0;
    if ((rc = grow(c, (void **)&c->bjobs, &c->bjobs_cap, n, sizeof *c->bjobs, "matmul jobs")) ||
        (rc = grow(c, (void **)&c->xg_first, &c->xg_first_cap, ng, sizeof *c->xg_first, "act-order gathers")))
        return rc;
    for (int i = 0; i < n; i++)
        if (c->xg_of[i] < 0) c->bjobs[nb++] = jobs[i];
    cpu_matmul(&c->ex, c->bjobs, nb);
    size_t need = 0;
    for (int g = 0; g < ng && need < c->xp_limit; g++) need += (size_t)c->xg[g].rows * (size_t)c->xg[g].in;
    if (need > c->xp_limit) need = c->xp_limit;
    for (int g = 0; g < ng; g++) // a row of a gather always fits, however wide
        if ((size_t)c->xg[g].in > need) need = (size_t)c->xg[g].in;
    if (need > c->xp_cap) {
        float *xp = NULL;
        if (posix_memalign((void **)&xp, 64, need * sizeof *xp))
            return backend_fail(&c->b, MS_ENOMEM, "out of memory for %.1f MiB of act-order inputs",
                                (double)need * sizeof *xp / (1 << 20));
        free(c->xp);
        c->xp = xp;
        c->xp_cap = need;
    }
    int g = 0, r = 0;
    while (g < ng) {
        // This batch's pieces: the rows from (g, r) on that fit.
        int npc = 0;
        size_t used = 0;
        const int g0 = g;
        while (g < ng) {
            const struct xp_gather *G = &c->xg[g];
            const size_t room = (need - used) / (size_t)G->in;
            const int fit = room > INT_MAX ? INT_MAX : (int)room;
            if (fit <= 0) break;
            const int r1 = G->rows - r < fit ? G->rows : r + fit;
            for (int a = r; a < r1; a += XP_PIECE_ROWS) {
                if ((rc = grow(c, (void **)&c->xpc, &c->xpc_cap, npc + 1, sizeof *c->xpc, "act-order pieces")))
                    return rc;
                c->xpc[npc++] = (struct xp_piece){.gather = g, .r0 = a,
                                                  .r1 = a + XP_PIECE_ROWS < r1 ? a + XP_PIECE_ROWS : r1,
                                                  .off = used + (size_t)(a - r) * (size_t)G->in};
            }
            used += (size_t)(r1 - r) * (size_t)G->in;
            if (r1 < G->rows) {
                r = r1;
                break;
            }
            g++;
            r = 0;
        }
        if (used <= XP_INLINE_FLOATS) xp_pieces(c, 0, npc, 0);
        else par_for(c, npc, xp_pieces, c);
        // The jobs reading this batch, each over the rows of its gather the
        // batch holds: gathers [g0, gl], each one's pieces consecutive.
        const int gl = c->xpc[npc - 1].gather;
        for (int p = npc - 1; p >= 0; p--) c->xg_first[c->xpc[p].gather] = p;
        nb = 0;
        for (int i = 0; i < n; i++) {
            const int gi = c->xg_of[i];
            if (gi < g0 || gi > gl) continue;
            const int first = c->xg_first[gi];
            int last = first;
            while (last + 1 < npc && c->xpc[last + 1].gather == gi) last++;
            const int a = c->xpc[first].r0;
            struct cpu_mm m = jobs[i];
            m.x = c->xp + c->xpc[first].off;
            m.ldx = (size_t)m.w.in;
            m.x_rows = NULL;
            if (m.y_rows) m.y_rows += a;
            else m.y += (size_t)a * m.ldy;
            m.rows = c->xpc[last].r1 - a;
            c->bjobs[nb++] = m;
        }
        cpu_matmul(&c->ex, c->bjobs, nb);
    }
    return 0;
}

// The nj jobs gathered in c->jobs (their perms in c->job_perm): over
// gathered inputs when any has a perm.
static int run_jobs(struct cpu_backend *c, int nj, bool permuted)
{
    if (permuted) return matmul_permuted(c, c->jobs, c->job_perm, nj);
    cpu_matmul(&c->ex, c->jobs, nj);
    return 0;
}

static struct cpu_mm mm_of(const struct backend_mm *j)
{
    struct cpu_wmat w = wmat_of(j->w);
    const int n = j->n_out > 0 ? j->n_out : w.out - j->o0;
    if (j->o0 != 0 || n != w.out) w = cpu_wmat_slice(&w, j->o0, n);
    return (struct cpu_mm){.w = w, .x = j->x, .ldx = j->ldx, .x_rows = j->x_rows, .y = j->y,
                           .ldy = j->ldy, .y_rows = j->y_rows, .rows = j->rows,
                           .accumulate = j->accumulate};
}

// An output slice that starts inside a packed block of a matrix held only
// packed (dummy weights keep no rows): compute from the block's start into a
// temporary, then move the wanted columns. The forward pass never asks for
// one (its vocabulary slices are whole blocks); the contract allows it.
static int matmul_unaligned(struct cpu_backend *c, const struct backend_mm *j)
{
    const int n = j->n_out > 0 ? j->n_out : j->w->rows - j->o0, lead = j->o0 % CPU_PACK_OUTS;
    const size_t width = (size_t)(n + lead);
    float *tmp = malloc((size_t)(j->rows ? j->rows : 1) * width * sizeof *tmp);
    if (!tmp) return backend_fail(&c->b, MS_ENOMEM, "out of memory for a %d-row matmul", j->rows);
    struct backend_mm a = *j;
    a.o0 = j->o0 - lead;
    a.n_out = (int)width;
    a.y = tmp;
    a.ldy = width;
    a.y_rows = NULL;
    a.accumulate = false;
    struct cpu_mm m = mm_of(&a);
    const int32_t *perm = j->w->perm;
    int rc = 0;
    if (perm) rc = matmul_permuted(c, &m, &perm, 1);
    else cpu_matmul(&c->ex, &m, 1);
    if (rc) {
        free(tmp);
        return rc;
    }
    for (int r = 0; r < j->rows; r++) {
        float *y = j->y + (size_t)(j->y_rows ? j->y_rows[r] : r) * j->ldy;
        const float *t = tmp + (size_t)r * width + lead;
        for (int o = 0; o < n; o++) y[o] = j->accumulate ? y[o] + t[o] : t[o];
    }
    free(tmp);
    return 0;
}

static int cpu_matmul_op(struct backend *b, const struct backend_mm *jobs, int n_jobs)
{
    struct cpu_backend *c = cpu_of(b);
    int rc;
    if ((rc = grow(c, (void **)&c->jobs, &c->jobs_cap, n_jobs, sizeof *c->jobs, "matmul jobs")) ||
        (rc = grow(c, (void **)&c->job_perm, &c->job_perm_cap, n_jobs, sizeof *c->job_perm, "matmul jobs")))
        return rc;
    int nj = 0;
    bool permuted = false;
    for (int i = 0; i < n_jobs; i++) {
        const struct backend_mm *j = &jobs[i];
        if (j->o0 < 0 || j->n_out < 0 || j->o0 + j->n_out > j->w->rows)
            return backend_fail(b, MS_EINVAL, "matmul outputs [%d, %d) are outside the matrix's %d",
                                j->o0, j->o0 + j->n_out, j->w->rows);
        if (!j->w->data && j->o0 % CPU_PACK_OUTS) {
            if ((rc = matmul_unaligned(c, j))) return rc;
            continue;
        }
        c->job_perm[nj] = j->w->perm;
        permuted |= j->w->perm != NULL;
        c->jobs[nj++] = mm_of(j);
    }
    return run_jobs(c, nj, permuted);
}

// All groups of all jobs in one parallel region (gate and up of every
// expert together), so that many small experts keep every thread busy.
static int cpu_grouped_matmul(struct backend *b, const struct backend_gmm *jobs, int n_jobs)
{
    struct cpu_backend *c = cpu_of(b);
    int total = 0;
    for (int i = 0; i < n_jobs; i++) total += jobs[i].n_groups;
    int rc;
    if ((rc = grow(c, (void **)&c->jobs, &c->jobs_cap, total, sizeof *c->jobs, "matmul jobs")) ||
        (rc = grow(c, (void **)&c->job_perm, &c->job_perm_cap, total, sizeof *c->job_perm, "matmul jobs")))
        return rc;
    int nj = 0;
    bool permuted = false;
    for (int i = 0; i < n_jobs; i++) {
        const struct backend_gmm *j = &jobs[i];
        const int32_t *off = j->h_off ? j->h_off : j->off; // host memory either way here
        for (int g = 0; g < j->n_groups; g++) {
            int n = off[g + 1] - off[g];
            // A padded group's padding rows follow its real ones.
            while (j->pad > 1 && n > 0 &&
                   ((j->x_rows && j->x_rows[off[g] + n - 1] < 0) ||
                    (j->y_rows && j->y_rows[off[g] + n - 1] < 0)))
                n--;
            if (n <= 0) continue;
            c->job_perm[nj] = j->w[g].perm;
            permuted |= j->w[g].perm != NULL;
            struct cpu_mm *m = &c->jobs[nj++];
            *m = (struct cpu_mm){.w = wmat_of(&j->w[g]), .x = j->x, .ldx = j->ldx, .y = j->y,
                                 .ldy = j->ldy, .rows = n};
            if (j->x_rows) m->x_rows = j->x_rows + off[g];
            else m->x = j->x + (size_t)off[g] * j->ldx;
            if (j->y_rows) m->y_rows = j->y_rows + off[g];
            else m->y = j->y + (size_t)off[g] * j->ldy;
        }
    }
    return run_jobs(c, nj, permuted);
}

// n values into the pool's dtype, element i at dst[i * stride]: a value row
// is contiguous (stride 1), a key is a column of its block (stride
// KV_BLOCK_TOKENS: keys are stored transposed).
static void store_kv(void *dst, enum dtype t, const float *src, int n, size_t stride)
{
    if (t == DTYPE_F32) {
        float *d = dst;
        for (int i = 0; i < n; i++) d[(size_t)i * stride] = src[i];
    } else {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++)
            d[(size_t)i * stride] = t == DTYPE_BF16 ? ms_f32_to_bf16(src[i]) : ms_f32_to_f16(src[i]);
    }
}

struct rope_ctx {
    struct cpu_backend *c;
    const struct backend_weights *w;
    const struct backend_layer *L;
    const struct backend_step *s;
    struct kv_pool *kv;
    int layer;
    float *q, *k;
    const float *v;
};

// Per token: q_norm / k_norm over each head, RoPE at the token's position,
// and K/V into the sequence's block for that position.
static void rope_rows(void *arg, int b, int e, int tid)
{
    const struct rope_ctx *r = arg;
    const struct model_config *cfg = r->w->cfg;
    const struct cpu_kernels *kt = r->c->k;
    const int D = cfg->head_dim, half = D / 2, H = cfg->n_heads, KVH = cfg->n_kv_heads;
    float *tmp = cpu_exec_scratch(&r->c->ex, tid);
    const size_t esz = dtype_size(r->kv->dtype);
    char *kl = (char *)r->kv->k + (size_t)r->layer * r->kv->layer_elems * esz;
    char *vl = (char *)r->kv->v + (size_t)r->layer * r->kv->layer_elems * esz;
    const float eps = cfg->rms_norm_eps;
    for (int t = b; t < e; t++) {
        const int pos = r->s->tok_pos[t];
        const float *cs = r->c->rope_cs + (size_t)t * 2 * half, *sn = cs + half;
        float *q = r->q + (size_t)t * H * D, *k = r->k + (size_t)t * KVH * D;
        const float *v = r->v + (size_t)t * KVH * D;
        for (int h = 0; h < H; h++) {
            float *qh = q + (size_t)h * D;
            kt->rmsnorm(qh, r->L->q_norm.data, r->L->q_norm.dtype, D, eps, tmp);
            kt->rope(qh, tmp, half, cs, sn);
        }
        const int32_t *blocks = r->s->bt + r->s->bt_start[r->s->tok_seq[t]];
        const size_t blk = (size_t)blocks[pos / KV_BLOCK_TOKENS], slot = (size_t)(pos % KV_BLOCK_TOKENS);
        for (int h = 0; h < KVH; h++) {
            float *kh = k + (size_t)h * D;
            kt->rmsnorm(kh, r->L->k_norm.data, r->L->k_norm.dtype, D, eps, tmp);
            kt->rope(kh, tmp, half, cs, sn);
            const size_t at = (blk * KVH + (size_t)h) * KV_BLOCK_TOKENS * D * esz;
            store_kv(kl + at + slot * esz, r->kv->dtype, kh, D, KV_BLOCK_TOKENS);
            store_kv(vl + at + slot * D * esz, r->kv->dtype, v + (size_t)h * D, D, 1);
        }
    }
}

static void rope_angle_rows(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct cpu_backend *c = arg;
    const int half = c->rope_half;
    for (int t = b; t < e; t++) {
        float *cs = c->rope_cs + (size_t)t * 2 * half;
        cpu_rope_angles(c->rope_pos[t], c->rope_inv, half, cs, cs + half);
    }
}

// The step's angles in c->rope_cs: those of the last call when the step's
// positions and the frequencies are the same (the other layers of a step).
static int rope_angles_for(struct cpu_backend *c, const struct backend_weights *w,
                           const struct backend_step *s)
{
    const int n = s->n_tokens, half = w->cfg->head_dim / 2;
    if (n <= 0) return 0;
    if (n == c->rope_n && half == c->rope_half &&
        memcmp(c->rope_pos, s->tok_pos, (size_t)n * sizeof *s->tok_pos) == 0 &&
        memcmp(c->rope_inv, w->rope_inv_freq, (size_t)half * sizeof *c->rope_inv) == 0)
        return 0;
    c->rope_n = -1; // until they are all computed
    if ((size_t)n * 2 * (size_t)half > (size_t)c->rope_cap) {
        const size_t want = (size_t)n * 2 * (size_t)half;
        if (want > INT_MAX)
            return backend_fail(&c->b, MS_EINVAL, "a step of %d tokens of head_dim %d is too large "
                                "for the RoPE angle table: split it", n, 2 * half);
        float *cs = realloc(c->rope_cs, want * sizeof *cs);
        if (!cs) return backend_fail(&c->b, MS_ENOMEM, "out of memory for RoPE angles");
        c->rope_cs = cs;
        c->rope_cap = (int)want;
    }
    if (n > c->rope_pos_cap) {
        int32_t *pos = realloc(c->rope_pos, (size_t)n * sizeof *pos);
        if (!pos) return backend_fail(&c->b, MS_ENOMEM, "out of memory for RoPE angles");
        c->rope_pos = pos;
        c->rope_pos_cap = n;
    }
    if (half > c->rope_inv_cap) {
        double *inv = realloc(c->rope_inv, (size_t)half * sizeof *inv);
        if (!inv) return backend_fail(&c->b, MS_ENOMEM, "out of memory for RoPE angles");
        c->rope_inv = inv;
        c->rope_inv_cap = half;
    }
    memcpy(c->rope_pos, s->tok_pos, (size_t)n * sizeof *s->tok_pos);
    memcpy(c->rope_inv, w->rope_inv_freq, (size_t)half * sizeof *c->rope_inv);
    c->rope_half = half;
    par_for(c, n, rope_angle_rows, c);
    c->rope_n = n;
    return 0;
}

static int cpu_qk_norm_rope_store(struct backend *b, const struct backend_weights *w, int layer,
                                  const struct backend_step *s, struct kv_pool *kv, float *q,
                                  float *k, const float *v)
{
    struct rope_ctx r = {.c = cpu_of(b), .w = w, .L = &w->layers[layer], .s = s, .kv = kv,
                         .layer = layer, .q = q, .k = k, .v = v};
    int rc = rope_angles_for(r.c, w, s);
    if (rc) return rc;
    par_for(r.c, s->n_tokens, rope_rows, &r);
    return 0;
}

struct attn_ctx {
    struct cpu_backend *c;
    const struct backend_step *s;
    struct cpu_attn a;          // the fields every item shares
    const float *q;
    float *out;
};

// Items are (tile, KV head): up to CPU_ATTN_TILE consecutive tokens of one
// sequence with the query heads of one group share each K/V block read.
static void attend_items(void *arg, int b, int e, int tid)
{
    const struct attn_ctx *ac = arg;
    struct cpu_attn a = ac->a;
    const int D = a.head_dim, KVH = a.n_kv_heads, G = a.n_q, H = KVH * G;
    const int32_t *tiles = ac->c->tiles;
    float *scratch = cpu_exec_scratch(&ac->c->ex, tid);
    for (int i = b; i < e; i++) {
        const int tile = i / KVH, h = i % KVH, t0 = tiles[2 * tile], n = tiles[2 * tile + 1];
        a.q = ac->q + ((size_t)t0 * H + (size_t)h * G) * D;
        a.out = ac->out + ((size_t)t0 * H + (size_t)h * G) * D;
        a.n_tok = n;
        a.first_pos = ac->s->tok_pos[t0];
        a.blocks = ac->s->bt + ac->s->bt_start[ac->s->tok_seq[t0]];
        a.kv_head = h;
        ac->c->k->attend(&a, scratch);
    }
}

static int cpu_attention(struct backend *b, const struct backend_weights *w, int layer,
                         const struct backend_step *s, const struct kv_pool *kv, const float *q,
                         float *out)
{
    struct cpu_backend *c = cpu_of(b);
    const struct model_config *cfg = w->cfg;
    // Tiles: each sequence's new tokens in runs of CPU_ATTN_TILE.
    int n_tiles = 0;
    for (int q0 = 0; q0 < s->n_seqs; q0++) {
        const int n = s->h_seq_start[q0 + 1] - s->h_seq_start[q0];
        n_tiles += (n + CPU_ATTN_TILE - 1) / CPU_ATTN_TILE;
    }
    int rc = grow(c, (void **)&c->tiles, &c->tiles_cap, 2 * n_tiles, sizeof *c->tiles, "attention tiles");
    if (rc) return rc;
    n_tiles = 0;
    for (int q0 = 0; q0 < s->n_seqs; q0++) {
        const int first = s->h_seq_start[q0], n = s->h_seq_start[q0 + 1] - first;
        for (int i = 0; i < n; i += CPU_ATTN_TILE) {
            c->tiles[2 * n_tiles] = first + i;
            c->tiles[2 * n_tiles + 1] = n - i < CPU_ATTN_TILE ? n - i : CPU_ATTN_TILE;
            n_tiles++;
        }
    }
    const int D = cfg->head_dim, H = cfg->n_heads, KVH = cfg->n_kv_heads;
    const size_t esz = dtype_size(kv->dtype);
    struct attn_ctx ac = {
        .c = c,
        .s = s,
        .q = q,
        .out = out,
        .a = {
            .q_stride = (size_t)H * D,
            .out_stride = (size_t)H * D,
            .n_q = H / KVH,
            .head_dim = D,
            .scale = 1.0f / sqrtf((float)D),
            .k = (const char *)kv->k + (size_t)layer * kv->layer_elems * esz,
            .v = (const char *)kv->v + (size_t)layer * kv->layer_elems * esz,
            .kv_dtype = kv->dtype,
            .n_kv_heads = KVH,
        },
    };
    // A thread takes a tile's KV heads together, where items taken one at a
    // time went to either thread: a block holds the heads side by side, so
    // (likely) the lines the hardware's streams fetch past one head's keys
    // or values are the next head's, on the same core. Measured with per-op
    // timers in
    // `bench-offline /tmp/mid --num-prompts 64 --input-len 128 --output-len
    // 64 --max-concurrency 64` (avx512_bf16, Zen 5, 2 threads), the builds
    // alternating three times: the decode steps' attention 628-676 ms in all
    // before, 525-573 after; the prompt steps' 325-390 and 295-331.
    par_for_dynamic(c, n_tiles * KVH, KVH, attend_items, &ac);
    return 0;
}

struct router_ctx {
    const float *logits;
    int n_experts, k;
    bool norm;
    int32_t *ids;
    float *weights;
};

static void router_rows(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct router_ctx *r = arg;
    for (int t = b; t < e; t++)
        cpu_router_topk(r->logits + (size_t)t * r->n_experts, r->n_experts, r->k, r->norm,
                        r->ids + (size_t)t * r->k, r->weights + (size_t)t * r->k);
}

static int cpu_router_topk_op(struct backend *b, const float *logits, int n, int n_experts, int k,
                              bool norm_topk, int32_t *ids, float *weights)
{
    if (k < 1 || k > n_experts)
        return backend_fail(b, MS_EINVAL, "top-%d of %d experts", k, n_experts);
    struct router_ctx r = {.logits = logits, .n_experts = n_experts, .k = k, .norm = norm_topk,
                           .ids = ids, .weights = weights};
    par_for(cpu_of(b), n, router_rows, &r);
    return 0;
}

// fwd_plan_route, the host twin every backend is held to (its memory is
// the host's here).
static int cpu_moe_route(struct backend *b, const struct backend_route *r)
{
    const int n = r->e1 - r->e0;
    if (n < 0 || r->n_tokens < 0 || r->k < 1 || r->pad < 1)
        return backend_fail(b, MS_EINVAL, "routing %d tokens x top-%d to experts [%d, %d) padded "
                            "to %d rows", r->n_tokens, r->k, r->e0, r->e1, r->pad);
    struct cpu_backend *c = cpu_of(b);
    int rc = grow(c, (void **)&c->fill, &c->fill_cap, 2 * n + 1, sizeof *c->fill,
                  "routing counters");
    if (rc) return rc;
    fwd_plan_route(r->ids, r->live, r->n_tokens, r->k, r->e0, r->e1, r->pad, r->off,
                    r->count ? r->count : c->fill + n, r->slot, r->token, r->pair, c->fill);
    return 0;
}

// The CPU's matmul takes any rows: no padding.
static int cpu_route_pad(const struct backend *b, int n_pairs, int n_groups)
{
    (void)b, (void)n_pairs, (void)n_groups;
    return 1;
}

static int cpu_moe_return_slots(struct backend *b, const int32_t *ids, const int32_t *live,
                                int n_tokens, int k, const int32_t *first, int n_ranks, int stride,
                                int32_t *slot)
{
    (void)b;
    for (int t = 0; t < n_tokens; t++)
        for (int j = 0; j < k; j++)
            slot[t * k + j] = live && !live[t] ? -1
                                               : fwd_plan_return_slot(ids[t * k + j], t, j, k, first,
                                                                       n_ranks, stride);
    return 0;
}

struct silu_ctx {
    const struct cpu_kernels *k;
    float *g;
    const float *u;
    size_t n;
};

#define SILU_CHUNK 4096

static void silu_chunks(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct silu_ctx *s = arg;
    size_t lo = (size_t)b * SILU_CHUNK, hi = (size_t)e * SILU_CHUNK;
    if (hi > s->n) hi = s->n;
    s->k->silu_mul(s->g + lo, s->u + lo, (int)(hi - lo));
}

static int cpu_silu_mul(struct backend *b, float *g, const float *u, size_t n)
{
    struct cpu_backend *c = cpu_of(b);
    struct silu_ctx s = {.k = c->k, .g = g, .u = u, .n = n};
    par_for(c, (int)((n + SILU_CHUNK - 1) / SILU_CHUNK), silu_chunks, &s);
    return 0;
}

struct gather_ctx {
    const float *src;
    size_t ld;
    const int32_t *rows;
    int width;
    float *dst;
};

static void gather_range(void *arg, int b, int e, int tid)
{
    (void)tid;
    const struct gather_ctx *g = arg;
    for (int i = b; i < e; i++)
        memcpy(g->dst + (size_t)i * g->width, g->src + (size_t)g->rows[i] * g->ld,
               (size_t)g->width * sizeof(float));
}

static int cpu_gather_rows(struct backend *b, const float *src, size_t ld, const int32_t *rows, int n,
                           int width, float *dst)
{
    struct gather_ctx g = {.src = src, .ld = ld, .rows = rows, .width = width, .dst = dst};
    par_for(cpu_of(b), n, gather_range, &g);
    return 0;
}

struct combine_ctx {
    struct cpu_backend *c;
    float *x;
    const float *out;
    const int32_t *slot;
    const float *w;
    int k, width;
};

// Each token's expert outputs, weighted, summed in top-k order, then added
// to the residual stream: the same order whatever the ranks or the batch.
static void combine_rows(void *arg, int b, int e, int tid)
{
    const struct combine_ctx *cc = arg;
    const int hd = cc->width, k = cc->k;
    float *acc = cpu_exec_scratch(&cc->c->ex, tid);
    for (int t = b; t < e; t++) {
        memset(acc, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < k; j++) {
            const size_t p = (size_t)t * k + j;
            const int32_t row = cc->slot ? cc->slot[p] : (int32_t)p;
            if (row >= 0) cc->c->k->axpy(acc, cc->w[p], cc->out + (size_t)row * hd, hd);
        }
        cc->c->k->axpy(cc->x + (size_t)t * hd, 1.0f, acc, hd);
    }
}

static int cpu_moe_combine(struct backend *b, float *x, const float *expert_out, const int32_t *slot,
                           const float *weights, int n_tokens, int k, int width)
{
    struct combine_ctx cc = {.c = cpu_of(b), .x = x, .out = expert_out, .slot = slot, .w = weights,
                             .k = k, .width = width};
    par_for(cc.c, n_tokens, combine_rows, &cc);
    return 0;
}

static int cpu_lm_head(struct backend *b, const struct backend_weights *w, int v0, int n_out,
                       const float *x, int n, float *logits, size_t ldy)
{
    const struct backend_mm j = {.w = &w->lm_head, .o0 = v0, .n_out = n_out, .x = x,
                                 .ldx = (size_t)w->cfg->hidden_size, .y = logits, .ldy = ldy,
                                 .rows = n};
    if (n <= 0 || n_out <= 0) return 0;
    return cpu_matmul_op(b, &j, 1);
}

struct sample_ctx {
    struct cpu_backend *c;
    const struct backend_sample_row *rows;
    int vocab;
    struct sample_token *out;
    _Atomic int rc;
};

static void sample_rows(void *arg, int b, int e, int tid)
{
    struct sample_ctx *s = arg;
    for (int i = b; i < e; i++) {
        int rc = cpu_sample_row(&s->rows[i], s->vocab, s->c->sample[tid], &s->out[i]);
        if (rc) atomic_store(&s->rc, rc);
    }
}

// Rows are handed out one at a time: their costs differ (prompt-logprob
// rows, penalties over long outputs). Over a 150k vocabulary a row costs as
// much as a small model's forward pass, so it is worth every thread.
static int cpu_sample(struct backend *b, const struct backend_sample_row *rows, int n, int vocab,
                      struct sample_token *out)
{
    struct cpu_backend *c = cpu_of(b);
    if (vocab < 1) return backend_fail(b, MS_EINVAL, "sampling over a vocabulary of %d", vocab);
    if (vocab > c->sample_vocab) {
        const int nt = threadpool_size(c->pool);
        for (int t = 0; t < nt; t++) {
            cpu_sample_scratch_destroy(c->sample[t]);
            c->sample[t] = cpu_sample_scratch_create(vocab, c->k);
            if (!c->sample[t]) {
                c->sample_vocab = 0;
                for (int u = 0; u < t; u++) {
                    cpu_sample_scratch_destroy(c->sample[u]);
                    c->sample[u] = NULL;
                }
                return backend_fail(b, MS_ENOMEM, "out of memory for sampling over %d logits", vocab);
            }
        }
        c->sample_vocab = vocab;
    }
    struct sample_ctx s = {.c = c, .rows = rows, .vocab = vocab, .out = out};
    par_for_dynamic(c, n, 1, sample_rows, &s);
    int rc = atomic_load(&s.rc);
    if (rc) return backend_fail(b, rc, "a row's sampling parameters are out of range");
    return 0;
}

static void cpu_destroy(struct backend *b)
{
    if (!b) return;
    struct cpu_backend *c = cpu_of(b);
    if (c->sample) {
        for (int t = 0; t < threadpool_size(c->pool); t++) cpu_sample_scratch_destroy(c->sample[t]);
        free(c->sample);
    }
    threadpool_destroy(c->pool);
    free(c->ex.scratch);
    cpu_xq_free(&c->xq);
    free(c->jobs);
    free(c->job_perm);
    free(c->xp);
    free(c->xg);
    free(c->xg_of);
    free(c->xg_hash);
    free(c->xg_first);
    free(c->bjobs);
    free(c->xpc);
    free(c->tiles);
    free(c->fill);
    free(c->rope_cs);
    free(c->rope_pos);
    free(c->rope_inv);
    free(c);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .sync = cpu_sync,
    .memory = cpu_memory,
    .measure_limits = cpu_measure_limits,
    .variant = cpu_variant,
    .prepare_weights = cpu_prepare_weights,
    .release_weights = cpu_release_weights,
    .kv_alloc = cpu_kv_alloc,
    .kv_free = cpu_kv_free,
    .prefault = cpu_prefault,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm_op,
    .matmul = cpu_matmul_op,
    .grouped_matmul = cpu_grouped_matmul,
    .qk_norm_rope_store = cpu_qk_norm_rope_store,
    .attention = cpu_attention,
    .router_topk = cpu_router_topk_op,
    .moe_route = cpu_moe_route,
    .route_pad = cpu_route_pad,
    .moe_return_slots = cpu_moe_return_slots,
    .silu_mul = cpu_silu_mul,
    .gather_rows = cpu_gather_rows,
    .moe_combine = cpu_moe_combine,
    .lm_head = cpu_lm_head,
    .sample = cpu_sample,
    .destroy = cpu_destroy,
};

int backend_cpu_create(int n_threads, const struct cpu_kernels *k, struct backend **out,
                       char *err, size_t errlen)
{
    *out = NULL;
    struct cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return ms_err(err, errlen, MS_ENOMEM, "out of memory for a CPU backend");
    c->b.ops = &cpu_ops;
    c->b.device = BACKEND_DEVICE_CPU;
    c->b.impl = c;
    c->rope_n = -1;
    c->xp_limit = XP_CAP_FLOATS;
    c->k = k ? k : cpu_kernels_best();
    int rc = threadpool_create(n_threads, &c->pool, err, errlen);
    if (rc) {
        free(c);
        return rc;
    }
    c->ex.pool = c->pool;
    c->ex.k = c->k;
    c->ex.xq = &c->xq;
    c->sample = calloc((size_t)threadpool_size(c->pool), sizeof *c->sample);
    if (!c->sample) {
        cpu_destroy(&c->b);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory for a CPU backend");
    }
    *out = &c->b;
    return 0;
}

const struct cpu_kernels *backend_cpu_kernels(const struct backend *b)
{
    return ((const struct cpu_backend *)b)->k;
}

size_t backend_cpu_set_gather_floats(struct backend *b, size_t floats)
{
    struct cpu_backend *c = cpu_of(b);
    const size_t was = c->xp_limit;
    c->xp_limit = floats ? floats : XP_CAP_FLOATS;
    return was;
}

int backend_cpu_weights_cached(const struct backend_weights *w)
{
    const struct shared_weights *s = w ? w->priv : NULL;
    return s ? s->cache : 0;
}
