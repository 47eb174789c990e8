// backend_cuda: the CUDA backend's op table (model/backend.h) — device
// memory, the weights uploaded (or made, for dummy loads) per rank with only
// the rank's experts (quantized ones in gpu/qlayout.h's blocks), the KV pool,
// the host-side plans each op needs (the attention work items, the
// grouped-matmul tile scratch, the sampler's packed tables), recording and replaying graphs (stream capture), and the error
// handling: every CUDA call is checked and its failure becomes a negative
// ms_status with CUDA's own sentence in b->err. Nothing here aborts. The
// kernels are in one .cu per op (kernels.cuh).
#include "gpu/backend_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kernels.cuh"

// Device scratch that grows (freeing the old one first, in stream order:
// the work queued before may still read it).
// Split-KV attention partials, per buffer (prefill and decode): at most this
// (plus 16 bytes of alignment), else the step runs unsplit. Reported as
// scratch_bytes, which the planner keeps free of the KV pool.
#define ATTN_PARTS_MAX ((size_t)256 << 20)
#define ATTN_PARTS_BUF (ATTN_PARTS_MAX + 16)

// Rows sampled per kernel launch: the work rows (2 x vocab floats each) are
// held for at most this many rows, 78 MB for Qwen3's vocabulary, not for
// every row of a step (a 1024-sequence step with prompt logprobs would ask
// for 2 GB after the KV pool has taken its share).
#define SAMPLE_CHUNK_ROWS 64

struct dbuf {
    void *p;
    size_t cap;
    size_t max;                     // if nonzero, growth never allocates more than this
    bool exact;                     // growth allocates what is asked, no more (a planned bound)
    bool no_graph;                  // never used by an op a graph records (see cu_create)
};

struct cuda_backend {
    struct backend b;
    int dev;
    cudaStream_t stream;
    cudaDeviceProp prop;
    char variant[16];
    struct dbuf tiles;              // gemm: tiles and their count
    struct dbuf ptrs;               // gemm: group matrices when not in the weights' table
    struct dbuf plan;               // attention items and combine entries
    struct dbuf parts;              // attention partial rows
    struct dbuf dparts;             // decode attention partial rows (fixed rows per sequence)
    struct dbuf stab;               // sampling: packed row tables
    struct dbuf swork;              // sampling: work and probs rows
    struct dbuf sout;               // sampling: results
    // Host copies.
    void *h_plan;                   // the attention plan as last uploaded
    size_t h_plan_bytes, h_plan_cap;
    void *h_new;                    // the plan being built
    size_t h_new_cap;
    void *h_stab;                   // the sampling tables being packed
    size_t h_stab_cap;
    uint8_t *h_seen;                // (vocab) zero between calls
    int32_t *h_count;               // (vocab) zero between calls
    int h_vocab;
    // Graphs: a recording is under way; an op failed or could not be
    // recorded during it; gen counts the times device scratch moved (a graph
    // recorded before runs no more).
    bool recording, rec_failed;
    uint64_t gen, rec_gen;
};

// A recorded graph, ready to launch.
struct backend_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    uint64_t gen;                   // the scratch generation it was recorded in
};

static struct cuda_backend *cuda_of(struct backend *b) { return (struct cuda_backend *)b; }

static int status_of(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation: return MS_ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice: return MS_EUNSUPPORTED;
    case cudaErrorInvalidValue: return MS_EINVAL;
    default: return MS_EIO;
    }
}

// Every failure of an op goes through here (cu_fail, fail_cuda): while a
// graph is being recorded the recording fails with it, so that graph_end
// reports it (backend.h) instead of returning a graph without the op.
static struct backend *mark_failed(struct backend *b)
{
    struct cuda_backend *c = (struct cuda_backend *)b->impl;
    if (c && c->recording) c->rec_failed = true;
    return b;
}
#define cu_fail(b, ...) backend_fail(mark_failed(b), __VA_ARGS__)

// A failed CUDA call, reported; its error is cleared, so that the next
// launch's cudaGetLastError (launch_status) does not report it as its own
// (a sticky error, from a fault, comes back from every later call anyway).
static int fail_cuda(struct backend *b, cudaError_t e, const char *what)
{
    cudaGetLastError();
    return cu_fail(b, status_of(e), "%s on GPU %d failed: %s (%s)", what,
                   b->impl ? ((struct cuda_backend *)b->impl)->dev : -1, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

#define CK(b, call, what)                                         \
    do {                                                          \
        cudaError_t ck_ = (call);                                 \
        if (ck_ != cudaSuccess) return fail_cuda((b), ck_, what); \
    } while (0)

// Every op starts here: the calling thread's current device is the backend's.
#define ON_DEVICE(c) CK(&(c)->b, cudaSetDevice((c)->dev), "selecting the device")

// Refuses what a recording cannot hold (an allocation, a read back), failing it.
static int not_while_recording(struct cuda_backend *c, const char *what)
{
    if (!c->recording) return 0;
    c->rec_failed = true;
    return cu_fail(&c->b, MS_EINVAL, "%s cannot be recorded in a graph (GPU %d)", what, c->dev);
}

static int dbuf_need(struct cuda_backend *c, struct dbuf *d, size_t bytes, const char *what)
{
    if (bytes <= d->cap) return 0;
    int rc = not_while_recording(c, what);
    if (rc) return rc;
    if (!d->no_graph) c->gen++; // graphs may hold the old buffer
    size_t want = d->exact ? bytes : bytes + bytes / 2;
    if (d->max && want > d->max) want = bytes > d->max ? bytes : d->max;
    // Stream-ordered where the device has memory pools: cudaFree waits for
    // the whole device, and a rank's NCCL kernel in flight may be waiting
    // for a peer thread that is itself blocked in the driver (the peer's
    // pageable copy or allocation) — the multi-GPU, one-process deadlock.
    const bool pooled = c->prop.memoryPoolsSupported;
    if (d->p) {
        cudaError_t e = pooled ? cudaFreeAsync(d->p, c->stream) : cudaFree(d->p);
        d->p = NULL;
        d->cap = 0;
        if (e != cudaSuccess) {
            cudaGetLastError(); // handled here: the next op must not report it again
            return fail_cuda(&c->b, e, what);
        }
    }
    cudaError_t e = pooled ? cudaMallocAsync(&d->p, want, c->stream) : cudaMalloc(&d->p, want);
    if (e != cudaSuccess) {
        d->p = NULL;
        cudaGetLastError(); // an allocation failure is not sticky: clear it
        return cu_fail(&c->b, MS_ENOMEM, "%s: cannot allocate %.1f MiB on GPU %d (%s)", what,
                       (double)want / (1 << 20), c->dev, cudaGetErrorString(e));
    }
    d->cap = want;
    return 0;
}

static void dbuf_free(struct dbuf *d)
{
    cuda_release_check(cudaFree(d->p), "a work buffer");
    d->p = NULL;
    d->cap = 0;
}

static int host_need(struct backend *b, void **p, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap) return 0;
    size_t want = bytes + bytes / 2;
    void *q = realloc(*p, want);
    if (!q) return cu_fail(b, MS_ENOMEM, "out of host memory for %s (%zu bytes)", what, want);
    *p = q;
    *cap = want;
    return 0;
}

// ---- memory --------------------------------------------------------------------

static int cu_alloc(struct backend *b, size_t bytes, void **out)
{
    struct cuda_backend *c = cuda_of(b);
    *out = NULL;
    int rc = not_while_recording(c, "an allocation");
    if (rc) return rc;
    ON_DEVICE(c);
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        cudaGetLastError(); // an allocation failure is not sticky: clear it
        return cu_fail(b, MS_ENOMEM, "cannot allocate %.1f MiB on GPU %d (%.1f MiB free of "
                       "%.1f MiB)", (double)bytes / (1 << 20), c->dev,
                       (double)fr / (1 << 20), (double)tot / (1 << 20));
    }
    if ((e = cudaMemsetAsync(*out, 0, bytes, c->stream)) != cudaSuccess) {
        cuda_release_check(cudaFree(*out), "an allocation that could not be zeroed");
        *out = NULL;
        return fail_cuda(b, e, "zeroing an allocation");
    }
    return 0;
}

static void cu_free(struct backend *b, void *p)
{
    struct cuda_backend *c = cuda_of(b);
    if (!p) return;
    cudaSetDevice(c->dev);
    cuda_release_check(cudaFree(p), "an allocation"); // waits for the work that may still use it
}

static int cu_upload(struct backend *b, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cuda_of(b);
    if (!bytes) return 0;
    int rc = not_while_recording(c, "an upload (from pageable host memory)");
    if (rc) return rc;
    ON_DEVICE(c);
    // From pageable memory the copy has taken src when it returns.
    CK(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "an upload");
    return 0;
}

static int cu_download(struct backend *b, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cuda_of(b);
    int rc = not_while_recording(c, "a download");
    if (rc) return rc;
    ON_DEVICE(c);
    // Wait for the stream first, then copy: a copy into pageable memory
    // queued behind a NCCL kernel would wait for it inside the driver, where
    // it blocks another rank's thread from allocating, and that rank may be
    // the peer the kernel waits for (XLA and XGBoost met this hang).
    CK(b, cudaStreamSynchronize(c->stream), "a download (or an op before it)");
    if (bytes) CK(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "a download");
    CK(b, cudaStreamSynchronize(c->stream), "a download (or an op before it)");
    return 0;
}

static int cu_copy_2d(struct backend *b, void *dst, size_t dst_pitch, const void *src,
                      size_t src_pitch, size_t bytes, int rows)
{
    struct cuda_backend *c = cuda_of(b);
    if (rows <= 0 || !bytes) return 0;
    ON_DEVICE(c);
    CK(b, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, bytes, (size_t)rows,
                            cudaMemcpyDeviceToDevice, c->stream), "a strided copy");
    return 0;
}

static int cu_sync(struct backend *b)
{
    struct cuda_backend *c = cuda_of(b);
    int rc = not_while_recording(c, "waiting for the GPU");
    if (rc) return rc;
    ON_DEVICE(c);
    CK(b, cudaStreamSynchronize(c->stream), "waiting for the GPU's queued work");
    return 0;
}

static int cu_memory(struct backend *b, struct backend_memory *out)
{
    struct cuda_backend *c = cuda_of(b);
    memset(out, 0, sizeof *out);
    ON_DEVICE(c);
    size_t fr, tot;
    CK(b, cudaMemGetInfo(&fr, &tot), "reading the GPU's memory");
    out->total_bytes = tot;
    out->free_bytes = fr;
    out->host_shared = false;
    // Decode and prefill each keep a buffer of attention partials, each at
    // most ATTN_PARTS_MAX: both are allocated at the first steps that split,
    // after the KV pool has taken its share.
    out->scratch_bytes = 2 * ATTN_PARTS_BUF;
    // The sampler's work and probability rows (swork): 8 bytes a logit.
    out->sample_bytes_per_logit = 2 * sizeof(float);
    return 0;
}

// Copy bandwidth (bytes read plus bytes written per second, a device-to-
// device copy of 2 x 512 MiB) and the fp32 FMA peak, each timed with events.
static int cu_measure_limits(struct backend *b, struct backend_limits *out)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    const size_t n = (size_t)512 << 20;
    void *a = NULL, *d = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0;
    double flops = 0;
    int rc = 0;
    cudaError_t e;
    if ((e = cudaMalloc(&a, n)) != cudaSuccess || (e = cudaMalloc(&d, n)) != cudaSuccess ||
        (e = cudaEventCreate(&e0)) != cudaSuccess || (e = cudaEventCreate(&e1)) != cudaSuccess ||
        (e = cudaMemsetAsync(a, 1, n, c->stream)) != cudaSuccess ||
        (e = cudaMemcpyAsync(d, a, n, cudaMemcpyDeviceToDevice, c->stream)) != cudaSuccess ||
        (e = cudaEventRecord(e0, c->stream)) != cudaSuccess) {
        rc = fail_cuda(b, e, "measuring the copy bandwidth");
        goto out;
    }
    for (int i = 0; i < 10; i++)
        if ((e = cudaMemcpyAsync(i % 2 ? a : d, i % 2 ? d : a, n, cudaMemcpyDeviceToDevice,
                                 c->stream)) != cudaSuccess) {
            rc = fail_cuda(b, e, "measuring the copy bandwidth");
            goto out;
        }
    if ((e = cudaEventRecord(e1, c->stream)) != cudaSuccess ||
        (e = cudaEventSynchronize(e1)) != cudaSuccess ||
        (e = cudaEventElapsedTime(&ms, e0, e1)) != cudaSuccess) {
        rc = fail_cuda(b, e, "measuring the copy bandwidth");
        goto out;
    }
    out->read_bytes_per_s = ms > 0 ? 2.0 * 10 * (double)n / (ms * 1e-3) : 0;
    if ((e = cudaEventRecord(e0, c->stream)) != cudaSuccess ||
        (e = cuda_fma_burn(c->stream, c->prop.multiProcessorCount * 8, 20000, (float *)a, &flops)) !=
            cudaSuccess ||
        (e = cudaEventRecord(e1, c->stream)) != cudaSuccess ||
        (e = cudaEventSynchronize(e1)) != cudaSuccess ||
        (e = cudaEventElapsedTime(&ms, e0, e1)) != cudaSuccess) {
        rc = fail_cuda(b, e, "measuring the FMA peak");
        goto out;
    }
    out->flops = ms > 0 ? flops / (ms * 1e-3) : 0;
out:
    if (e0) cuda_release_check(cudaEventDestroy(e0), "the probe's event");
    if (e1) cuda_release_check(cudaEventDestroy(e1), "the probe's event");
    cuda_release_check(cudaFree(a), "the probe's buffer");
    cuda_release_check(cudaFree(d), "the probe's buffer");
    return rc;
}

static const char *cu_variant(const struct backend *b)
{
    return ((const struct cuda_backend *)b)->variant;
}

// ---- weights ---------------------------------------------------------------------

// What prepare_weights keeps: one device block for every tensor, the table
// of expert matrices (device) a grouped matmul reads its groups from, and
// the RoPE frequencies on the device.
struct cuda_weights {
    void *block;
    size_t bytes;
    const void **ptr_table;         // device: (n_layers, 3, n_experts)
    double *inv_freq;               // device: (head_dim / 2)
};

enum { KIND_GATE, KIND_UP, KIND_DOWN };

// Every tensor this rank holds, with its backend_mat, in one fixed order:
// `fn` gets the expert slot (layer, kind, expert) or -1 for the others.
typedef int (*tensor_fn)(const struct tensor *t, struct backend_mat *out, long slot, void *ctx);

static int for_each_tensor(const struct model *m, struct backend_weights *w, int e0, int e1,
                           tensor_fn fn, void *ctx)
{
    const int E = m->cfg.n_experts;
    int rc = fn(&m->embed, &w->embed, -1, ctx);
    for (int i = 0; !rc && i < m->cfg.n_layers; i++) {
        const struct layer_weights *L = &m->layers[i];
        struct backend_layer *B = &w->layers[i];
        const struct tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                     &L->q_norm, &L->k_norm, &L->ffn_norm};
        struct backend_mat *bs[] = {&B->attn_norm, &B->wq, &B->wk, &B->wv, &B->wo,
                                    &B->q_norm, &B->k_norm, &B->ffn_norm};
        for (int j = 0; !rc && j < 8; j++) rc = fn(ts[j], bs[j], -1, ctx);
        if (rc) break;
        if (L->is_moe) {
            rc = fn(&L->router, &B->router, -1, ctx);
            for (int e = e0; !rc && e < e1; e++) {
                const long base = ((long)i * 3) * E + e;
                rc = fn(&L->experts[e].gate, &B->expert_gate[e], base + (long)KIND_GATE * E, ctx);
                if (!rc) rc = fn(&L->experts[e].up, &B->expert_up[e], base + (long)KIND_UP * E, ctx);
                if (!rc) rc = fn(&L->experts[e].down, &B->expert_down[e], base + (long)KIND_DOWN * E, ctx);
            }
        } else {
            rc = fn(&L->gate, &B->gate, -1, ctx);
            if (!rc) rc = fn(&L->up, &B->up, -1, ctx);
            if (!rc) rc = fn(&L->down, &B->down, -1, ctx);
        }
    }
    if (!rc) rc = fn(&m->final_norm, &w->final_norm, -1, ctx);
    // A tied lm_head is the embedding's bytes: it shares them (see place()).
    if (!rc) rc = fn(&m->lm_head, &w->lm_head, -1, ctx);
    return rc;
}

struct place_ctx {
    struct cuda_backend *c;
    const struct model *m;
    struct backend_weights *w;
    char *base;                     // NULL: the sizing pass
    size_t off;
    const void **h_ptrs;            // host copy of the expert table
    const void **d_ptrs;            // its device address
    size_t done, total;             // bytes placed, for the progress line
    double t0, last_log;
    struct cuda_qstage qstage;      // a quantized checkpoint tensor on its way
};

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Sizes (first pass) or places, uploads or makes (second pass) one tensor.
static int place(const struct tensor *t, struct backend_mat *mat, long slot, void *arg)
{
    struct place_ctx *p = (struct place_ctx *)arg;
    mat->dtype = t->dtype;
    mat->rows = t->ndim == 2 ? (int)t->shape[0] : 1;
    mat->cols = t->ndim == 2 ? (int)t->shape[1] : (int)t->shape[0];
    mat->data = NULL;
    mat->priv = NULL;
    if (t->ndim == 0) {
        mat->rows = mat->cols = 0;
        return 0;
    }
    if (t == &p->m->lm_head && p->m->cfg.tie_word_embeddings) {
        mat->data = p->w->embed.data;
        return 0;
    }
    // A quantized matrix: gpu/qlayout.h's blocks, the bytes the loader counts.
    const bool quant = t->quant.format != QUANT_NONE && t->ndim == 2;
    const size_t n = tensor_elems(t), bytes = quant ? tensor_bytes(t) : n * dtype_size(t->dtype);
    if (quant) {
        mat->quant = t->quant.format;
        mat->group_rows = 1;
        mat->group_cols = t->quant.group > 0 ? t->quant.group : mat->cols;
    }
    const size_t at = p->off;
    p->off += align256(bytes);
    if (!p->base) return 0;
    char *dst = p->base + at;
    struct cuda_backend *c = p->c;
    if (quant) {
        CK(&c->b, cuda_qweight_fill(c->stream, t, dst, &p->qstage), "making a quantized weight");
    } else if (t->data) {
        CK(&c->b, cudaMemcpyAsync(dst, t->data, bytes, cudaMemcpyHostToDevice, c->stream),
           "uploading a weight");
    } else {
        CK(&c->b, cuda_dummy_fill(c->stream, t, n, dst), "making a dummy weight");
    }
    mat->data = dst;
    if (slot >= 0) {
        p->h_ptrs[slot] = dst;
        mat->priv = p->d_ptrs + slot;
    }
    p->done += bytes;
    const double now = ms_now();
    if (now - p->last_log >= 2.0) {
        p->last_log = now;
        ms_log(MS_LOG_INFO, "rank %d (GPU %d): %s weights %.1f of %.1f GiB (%.0f%%)", c->b.index,
               c->dev, p->m->dummy ? "made" : "uploaded", (double)p->done / (1 << 30),
               (double)p->total / (1 << 30), 100.0 * (double)p->done / (double)(p->total ? p->total : 1));
    }
    return 0;
}

static void cu_release_weights(struct backend *b, struct backend_weights *w)
{
    if (!w) return;
    struct cuda_backend *c = cuda_of(b);
    cudaSetDevice(c->dev);
    struct cuda_weights *cw = (struct cuda_weights *)w->priv;
    if (cw) {
        cuda_release_check(cudaFree(cw->block), "the weights");
        cuda_release_check(cudaFree((void *)cw->ptr_table), "the weights' pointer table");
        cuda_release_check(cudaFree(cw->inv_freq), "the rope frequencies");
        free(cw);
    }
    if (w->layers) {
        for (int i = 0; i < w->cfg->n_layers; i++) free(w->layers[i].expert_gate);
        free(w->layers);
    }
    free(w->rope_inv_freq);
    free(w);
}

// Long because it is one sequence: tables, sizing pass, one device block,
// placing pass (upload or make), the expert table and the RoPE frequencies.
static int cu_prepare_weights(struct backend *b, const struct model *m, int expert_begin,
                              int expert_end, struct backend_weights **out)
{
    struct cuda_backend *c = cuda_of(b);
    *out = NULL;
    const struct model_config *cfg = &m->cfg;
    if (expert_begin < 0 || expert_end < expert_begin || expert_end > cfg->n_experts)
        return cu_fail(b, MS_EINVAL, "expert range [%d, %d) is outside the model's %d experts",
                       expert_begin, expert_end, cfg->n_experts);
    // An act-order checkpoint's matrices read x in their own input order
    // (tensor_quant.perm): a gather per expert before the GEMM, which the
    // CUDA kernels do not have yet. Said before anything is uploaded.
    if (m->n_perms)
        return cu_fail(b, MS_EUNSUPPORTED, "%s is an act-order checkpoint (GPTQ desc_act or "
                       "compressed-tensors actorder group, with inputs grouped out of their order), "
                       "which the CUDA backend does not run yet: serve it with --device cpu, or use "
                       "a checkpoint quantized without act-order (desc_act false, actorder weight "
                       "or none)", m->dir);
    ON_DEVICE(c);
    const double t0 = ms_now();
    struct backend_weights *w = (struct backend_weights *)calloc(1, sizeof *w);
    struct cuda_weights *cw = (struct cuda_weights *)calloc(1, sizeof *cw);
    const int E = cfg->n_experts, NL = cfg->n_layers;
    const size_t n_ptrs = (size_t)NL * 3 * (E > 0 ? E : 1);
    const void **h_ptrs = (const void **)calloc(n_ptrs, sizeof *h_ptrs);
    if (w) {
        w->cfg = cfg;
        w->priv = cw;
        w->expert_begin = expert_begin;
        w->expert_end = expert_end;
        w->layers = (struct backend_layer *)calloc((size_t)NL, sizeof *w->layers);
        w->rope_inv_freq = (double *)calloc((size_t)cfg->head_dim / 2 + 1, sizeof(double));
    }
    bool ok = w && cw && h_ptrs && w->layers && w->rope_inv_freq;
    for (int i = 0; ok && i < NL; i++) {
        struct backend_layer *B = &w->layers[i];
        B->is_moe = m->layers[i].is_moe;
        if (!B->is_moe) continue;
        B->expert_gate = (struct backend_mat *)calloc((size_t)E * 3, sizeof *B->expert_gate);
        ok = B->expert_gate != NULL;
        if (ok) {
            B->expert_up = B->expert_gate + E;
            B->expert_down = B->expert_up + E;
        }
    }
    if (!ok) {
        free(h_ptrs);
        if (!w) free(cw); // else cu_release_weights frees it
        cu_release_weights(b, w);
        return cu_fail(b, MS_ENOMEM, "out of host memory for the weight tables");
    }
    for (int i = 0; i < cfg->head_dim / 2; i++)
        w->rope_inv_freq[i] = pow(cfg->rope_theta, -2.0 * i / cfg->head_dim);
    struct place_ctx p;
    memset(&p, 0, sizeof p);
    p.c = c;
    p.m = m;
    p.w = w;
    p.h_ptrs = h_ptrs;
    for_each_tensor(m, w, expert_begin, expert_end, place, &p);
    p.total = p.off;
    int rc = 0;
    cudaError_t e;
    if ((e = cudaMalloc(&cw->block, p.total ? p.total : 1)) != cudaSuccess) {
        cw->block = NULL;
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        rc = cu_fail(b, MS_ENOFIT, "rank %d's weights (%.2f GiB: the replicated ones and "
                     "experts [%d, %d)) do not fit GPU %d (%.2f GiB free of %.2f GiB)",
                     b->index, (double)p.total / (1 << 30), expert_begin, expert_end, c->dev,
                     (double)fr / (1 << 30), (double)tot / (1 << 30));
        goto fail;
    }
    cw->bytes = p.total;
    if ((e = cudaMalloc((void **)&cw->ptr_table, n_ptrs * sizeof(void *))) != cudaSuccess ||
        (e = cudaMalloc((void **)&cw->inv_freq, ((size_t)cfg->head_dim / 2 + 1) * sizeof(double))) !=
            cudaSuccess) {
        rc = fail_cuda(b, e, "allocating the weight tables");
        goto fail;
    }
    p.base = (char *)cw->block;
    p.d_ptrs = cw->ptr_table;
    p.off = 0;
    p.t0 = p.last_log = t0;
    if ((rc = for_each_tensor(m, w, expert_begin, expert_end, place, &p))) goto fail;
    if ((e = cudaMemcpyAsync((void *)cw->ptr_table, h_ptrs, n_ptrs * sizeof(void *),
                             cudaMemcpyHostToDevice, c->stream)) != cudaSuccess ||
        (e = cudaMemcpyAsync(cw->inv_freq, w->rope_inv_freq, (size_t)cfg->head_dim / 2 * sizeof(double),
                             cudaMemcpyHostToDevice, c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
        rc = fail_cuda(b, e, "uploading the weights");
        goto fail;
    }
    cuda_qstage_free(&p.qstage);
    free(h_ptrs);
    {
        const double dt = ms_now() - t0;
        ms_log(MS_LOG_INFO, "rank %d (GPU %d): %s %.2f GiB of weights (experts [%d, %d) of %d) in "
               "%.2f s (%.1f GB/s)", b->index, c->dev, m->dummy ? "made" : "uploaded",
               (double)p.total / (1 << 30), expert_begin, expert_end, E, dt,
               dt > 0 ? (double)p.total / dt / 1e9 : 0.0);
    }
    *out = w;
    return 0;
fail:
    cuda_qstage_free(&p.qstage);
    free(h_ptrs);
    cu_release_weights(b, w);
    return rc;
}

static int cu_kv_alloc(struct backend *b, struct kv_pool *kv)
{
    struct cuda_backend *c = cuda_of(b);
    const size_t bytes = kv_pool_bytes(kv);
    int rc = cu_alloc(b, bytes, &kv->k);
    if (rc) return rc;
    if ((rc = cu_alloc(b, bytes, &kv->v))) {
        cu_free(b, kv->k);
        kv->k = NULL;
        return cu_fail(b, rc, "cannot allocate a KV pool of %d blocks (2 x %.1f MiB) on GPU %d",
                       kv->n_blocks, (double)bytes / (1 << 20), c->dev);
    }
    return 0;
}

static void cu_kv_free(struct backend *b, struct kv_pool *kv)
{
    cu_free(b, kv->k);
    cu_free(b, kv->v);
    kv->k = kv->v = NULL;
}

// ---- ops -------------------------------------------------------------------------

static int cu_embed(struct backend *b, const struct backend_weights *w, const int32_t *ids, int n,
                    float *x)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    CK(b, cuda_embed(c->stream, w->embed.data, w->embed.dtype, w->embed.cols, ids, n, x),
       "the embedding gather");
    return 0;
}

static int cu_rmsnorm(struct backend *b, const float *x, size_t ldx, const int32_t *rows, int n,
                      const struct backend_mat *w, float eps, float *out)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    CK(b, cuda_rmsnorm(c->stream, x, ldx, rows, n, w->data, w->dtype, w->cols, eps, out), "RMSNorm");
    return 0;
}

static int mm_check(struct backend *b, const struct backend_mat *w, const char *what)
{
    if (!w->data || w->rows <= 0 || w->cols <= 0)
        return cu_fail(b, MS_EINVAL, "%s: the matrix is not on this GPU (an expert outside "
                       "the rank's range, or a tensor the model does not bind)", what);
    if (w->perm)
        return cu_fail(b, MS_EUNSUPPORTED, "%s: the matrix reads its inputs in an act-order "
                       "checkpoint's order, which the CUDA kernels do not gather", what);
    return 0;
}

static int cu_matmul(struct backend *b, const struct backend_mm *jobs, int n_jobs)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    for (int i = 0; i < n_jobs; i++) {
        const struct backend_mm *j = &jobs[i];
        int rc = mm_check(b, j->w, "a matmul");
        if (rc) return rc;
        if (j->o0 < 0 || j->n_out < 0 || j->o0 + j->n_out > j->w->rows)
            return cu_fail(b, MS_EINVAL, "matmul outputs [%d, %d) are outside the matrix's %d",
                           j->o0, j->o0 + j->n_out, j->w->rows);
        if (j->rows <= 0) continue;
        struct cuda_mm m;
        memset(&m, 0, sizeof m);
        m.wtype = j->w->dtype;
        m.w = j->w->data;
        m.o0 = j->o0;
        m.n_out = j->n_out > 0 ? j->n_out : j->w->rows - j->o0;
        m.K = j->w->cols;
        m.x = j->x;
        m.ldx = j->ldx;
        m.x_rows = j->x_rows;
        m.y = j->y;
        m.ldy = j->ldy;
        m.y_rows = j->y_rows;
        m.rows = m.max_rows = m.max_group_rows = j->rows;
        m.accumulate = j->accumulate;
        m.quant = j->w->quant;
        m.group = j->w->group_cols;
        CK(b, cuda_matmul(c->stream, &m), "a matmul");
    }
    return 0;
}

static int cu_grouped_matmul(struct backend *b, const struct backend_gmm *jobs, int n_jobs)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    for (int i = 0; i < n_jobs; i++) {
        const struct backend_gmm *j = &jobs[i];
        if (j->n_groups <= 0 || j->max_rows <= 0) continue;
        // Offsets moe_route padded to a tile need no tile list.
        const bool padded = j->pad == 8 || j->pad == 64;
        int max_group = j->max_rows;
        if (j->h_off && !padded) {
            if (j->h_off[j->n_groups] == 0) continue;
            max_group = 0;
            for (int g = 0; g < j->n_groups; g++)
                if (j->h_off[g + 1] - j->h_off[g] > max_group) max_group = j->h_off[g + 1] - j->h_off[g];
        }
        // The groups' matrices: a run of the weights' expert table, or uploaded.
        const void *const *wtab = (const void *const *)j->w[0].priv;
        for (int g = 0; g < j->n_groups; g++) {
            int rc = mm_check(b, &j->w[g], "a grouped matmul");
            if (rc) return rc;
            if (j->w[g].dtype != j->w[0].dtype || j->w[g].rows != j->w[0].rows ||
                j->w[g].cols != j->w[0].cols || j->w[g].quant != j->w[0].quant ||
                j->w[g].group_cols != j->w[0].group_cols)
                return cu_fail(b, MS_EINVAL, "grouped matmul: group %d's matrix differs in "
                               "shape, dtype or quantization from group 0's", g);
            if (wtab && (const void *const *)j->w[g].priv != wtab + g) wtab = NULL;
        }
        if (!wtab) {
            // The table is copied from a host buffer freed below.
            int rc = not_while_recording(c, "uploading a matrix table");
            if (rc) return rc;
            rc = dbuf_need(c, &c->ptrs, (size_t)j->n_groups * sizeof(void *), "matrix table");
            if (rc) return rc;
            const void **h = (const void **)malloc((size_t)j->n_groups * sizeof *h);
            if (!h) return cu_fail(b, MS_ENOMEM, "out of host memory for a matrix table");
            for (int g = 0; g < j->n_groups; g++) h[g] = j->w[g].data;
            cudaError_t e = cudaMemcpyAsync(c->ptrs.p, h, (size_t)j->n_groups * sizeof *h,
                                            cudaMemcpyHostToDevice, c->stream);
            free(h);
            if (e != cudaSuccess) return fail_cuda(b, e, "uploading a matrix table");
            wtab = (const void *const *)c->ptrs.p;
        }
        // Tiles of 8 rows when every group has few (decode), or when the
        // offsets are unknown here but average 8 or fewer a group; else 64.
        // Either tile computes the same numbers.
        const bool small = max_group <= 8 || (!j->h_off && j->max_rows <= 8 * j->n_groups);
        const int per_tile = small ? 8 : 64;
        if (small) max_group = 8;
        const int cap = padded ? 0 : plan_group_tiles_bound(j->n_groups, j->max_rows, per_tile);
        // Only the counted (expert-parallel prefill) path has a tile list,
        // and no graph records it: c->tiles is no_graph.
        int rc = padded ? 0 : not_while_recording(c, "a grouped matmul's tile list");
        if (!rc && !padded)
            rc = dbuf_need(c, &c->tiles, (size_t)cap * sizeof(int2) + sizeof(int), "matmul tiles");
        if (rc) return rc;
        struct cuda_mm m;
        memset(&m, 0, sizeof m);
        m.wtype = j->w[0].dtype;
        m.wtab = wtab;
        m.n_out = j->w[0].rows;
        m.K = j->w[0].cols;
        m.x = j->x;
        m.ldx = j->ldx;
        m.x_rows = j->x_rows;
        m.y = j->y;
        m.ldy = j->ldy;
        m.y_rows = j->y_rows;
        m.off = j->off;
        m.n_groups = j->n_groups;
        m.max_rows = j->max_rows;
        m.max_group_rows = max_group;
        if (padded) {
            m.pad = j->pad;
        } else {
            m.tiles = (int2 *)c->tiles.p;
            m.n_tiles = (int *)((int2 *)c->tiles.p + cap);
            m.tiles_cap = cap;
        }
        m.quant = j->w[0].quant;
        m.group = j->w[0].group_cols;
        CK(b, cuda_matmul(c->stream, &m), "a grouped (expert) matmul");
    }
    return 0;
}

static int cu_qk_norm_rope_store(struct backend *b, const struct backend_weights *w, int layer,
                                 const struct backend_step *s, struct kv_pool *kv, float *q, float *k,
                                 const float *v)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    const struct model_config *cfg = w->cfg;
    const struct backend_layer *L = &w->layers[layer];
    const size_t esz = dtype_size(kv->dtype), lo = (size_t)layer * kv->layer_elems * esz;
    struct cuda_rope r;
    memset(&r, 0, sizeof r);
    r.n_tokens = s->n_tokens;
    r.n_heads = cfg->n_heads;
    r.n_kv_heads = cfg->n_kv_heads;
    r.head_dim = cfg->head_dim;
    r.eps = cfg->rms_norm_eps;
    r.q_norm = L->q_norm.data;
    r.k_norm = L->k_norm.data;
    r.q_norm_t = L->q_norm.dtype;
    r.k_norm_t = L->k_norm.dtype;
    r.inv_freq = ((struct cuda_weights *)w->priv)->inv_freq;
    r.tok_pos = s->tok_pos;
    r.tok_seq = s->tok_seq;
    r.bt_start = s->bt_start;
    r.bt = s->bt;
    r.q = q;
    r.k = k;
    r.v = v;
    r.kl = (char *)kv->k + lo;
    r.vl = (char *)kv->v + lo;
    r.kv_dtype = kv->dtype;
    CK(b, cuda_rope_store(c->stream, &r), "q/k norm, RoPE and the KV store");
    return 0;
}

// Positions per attention chunk: each token's softmax is folded chunk by
// chunk (plan.h), whatever the split; 256 positions (16 blocks) keep the
// fold's cost small and still split a 1k context four ways.
#define ATTN_CHUNK 256

// The largest tile of tokens whose rows (tile x query heads per KV head)
// fit the device's shared memory, at most 64 rows.
static int attn_tile(const struct cuda_backend *c, int n_q, int head_dim)
{
    int t = 64 / n_q > 1 ? 64 / n_q : 1;
    while (t > 1 && cuda_attention_smem(t * n_q, head_dim) > c->prop.sharedMemPerBlockOptin) t--;
    return t;
}

// What every attention launch takes from the model, the step and the pool.
static void attn_args(struct cuda_attn *a, const struct model_config *cfg, int layer,
                      const struct backend_step *s, const struct kv_pool *kv, int chunk,
                      const float *q, float *out)
{
    const size_t esz = dtype_size(kv->dtype), lo = (size_t)layer * kv->layer_elems * esz;
    memset(a, 0, sizeof *a);
    a->chunk = chunk;
    a->n_kv_heads = cfg->n_kv_heads;
    a->n_q = cfg->n_heads / cfg->n_kv_heads;
    a->head_dim = cfg->head_dim;
    a->scale = 1.0f / sqrtf((float)cfg->head_dim);
    a->tok_pos = s->tok_pos;
    a->bt_start = s->bt_start;
    a->bt = s->bt;
    a->k = (const char *)kv->k + lo;
    a->v = (const char *)kv->v + lo;
    a->kv_dtype = kv->dtype;
    a->q = q;
    a->out = out;
}


// A decode step (one new token per sequence): the items come from each
// token's position on the device (plan_decode_item), the grid from the
// number of sequences alone, and the partial sets sit at fixed rows of a
// buffer sized once, for the most sequences that split and the longest
// context the pool holds — so that the op records into a graph that any
// decode step of the same size replays.
static int attention_decode(struct cuda_backend *c, const struct backend_weights *w, int layer,
                            const struct backend_step *s, const struct kv_pool *kv, const float *q,
                            float *out, const struct plan_attn_opts *o)
{
    struct backend *b = &c->b;
    const struct model_config *cfg = w->cfg;
    const int H = cfg->n_heads, KVH = cfg->n_kv_heads, D = cfg->head_dim;
    long long ctx = (long long)(kv->n_blocks + 1) * KV_BLOCK_TOKENS;
    if (ctx > cfg->max_position_embeddings) ctx = cfg->max_position_embeddings;
    const int max_chunks = (int)((ctx + o->chunk - 1) / o->chunk);
    // The most sequences a step splits: n x KV heads below the target.
    const int most = o->target_ctas > KVH ? (o->target_ctas - 1) / KVH : 0;
    const size_t rows = (size_t)most * (size_t)max_chunks * (size_t)H;
    const size_t bytes = rows * ((size_t)D + 2) * sizeof(float);
    int split = plan_decode_split(s->n_seqs, KVH, o->target_ctas, o->max_split);
    if (bytes > ATTN_PARTS_MAX || (size_t)s->n_seqs * max_chunks * H > rows) split = 1;
    if (split > 1) {
        int rc = dbuf_need(c, &c->dparts, bytes + 16, "decode attention partials");
        if (rc) return rc;
    }
    struct cuda_attn a;
    attn_args(&a, cfg, layer, s, kv, o->chunk, q, out);
    a.n_items = s->n_seqs * split;
    a.n_combine = split > 1 ? s->n_seqs : 0;
    a.split = split;
    a.max_chunks = max_chunks;
    a.tile_tokens = 1;
    if (split > 1) {
        a.part_acc = (float *)c->dparts.p;
        a.part_m = a.part_acc + rows * (size_t)D;
        a.part_l = a.part_m + rows;
    }
    CK(b, cuda_attention(c->stream, &a), "paged attention (decode)");
    return 0;
}

static int cu_attention(struct backend *b, const struct backend_weights *w, int layer,
                        const struct backend_step *s, const struct kv_pool *kv, const float *q,
                        float *out)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    if (s->n_tokens <= 0) return 0;
    const struct model_config *cfg = w->cfg;
    const int G = cfg->n_heads / cfg->n_kv_heads;
    struct plan_attn_opts o;
    memset(&o, 0, sizeof o);
    o.tile_tokens = attn_tile(c, G, cfg->head_dim);
    if (cuda_attention_smem(o.tile_tokens * G, cfg->head_dim) > c->prop.sharedMemPerBlockOptin)
        return cu_fail(b, MS_EUNSUPPORTED, "attention: %d query heads per KV head of "
                       "dimension %d need more shared memory than GPU %d has", G,
                       cfg->head_dim, c->dev);
    o.kv_heads = cfg->n_kv_heads;
    o.target_ctas = 2 * c->prop.multiProcessorCount;
    o.chunk = ATTN_CHUNK;
    o.max_split = 64;
    o.n_heads = cfg->n_heads;
    // Partial sets of at most ATTN_PARTS_MAX; a step that would need more runs unsplit.
    o.max_part_rows = (long long)(ATTN_PARTS_MAX / (((size_t)cfg->head_dim + 2) * sizeof(float)));
    if (s->n_tokens == s->n_seqs) return attention_decode(c, w, layer, s, kv, q, out, &o);
    // A prefill's plan and partials live in buffers the next eager step
    // rewrites in place (plan, parts: no_graph), so a graph cannot hold them.
    int rc = not_while_recording(c, "a prefill step's attention");
    if (rc) return rc;
    struct plan_attn pa;
    if (plan_attention(s->h_seq_start, s->h_tok_pos, s->n_seqs, &o, NULL, 0, NULL, 0, &pa))
        return cu_fail(b, MS_EINVAL, "attention: the step's layout is inconsistent");
    const size_t ib = (size_t)pa.n_items * sizeof(struct plan_attn_item);
    const size_t bytes = ib + (size_t)pa.n_combine * sizeof(struct plan_attn_combine);
    rc = host_need(b, &c->h_new, &c->h_new_cap, bytes, "the attention plan");
    if (rc) return rc;
    struct plan_attn_item *items = (struct plan_attn_item *)c->h_new;
    struct plan_attn_combine *comb = (struct plan_attn_combine *)((char *)c->h_new + ib);
    if (plan_attention(s->h_seq_start, s->h_tok_pos, s->n_seqs, &o, items, pa.n_items, comb,
                       pa.n_combine, &pa))
        return cu_fail(b, MS_EINVAL, "attention: the step's layout is inconsistent");
    // Every layer of a step has the same plan: upload it once.
    if (bytes != c->h_plan_bytes || memcmp(c->h_new, c->h_plan, bytes) != 0) {
        // A replay would read the host plan as it is then, not as it is now.
        // No cached plan until the upload is queued: a failed growth (which
        // frees the old buffer) or upload is retried by the next layer.
        c->h_plan_bytes = 0;
        if ((rc = dbuf_need(c, &c->plan, bytes, "the attention plan"))) return rc;
        if ((rc = host_need(b, &c->h_plan, &c->h_plan_cap, bytes, "the attention plan"))) return rc;
        memcpy(c->h_plan, c->h_new, bytes);
        CK(b, cudaMemcpyAsync(c->plan.p, c->h_plan, bytes, cudaMemcpyHostToDevice, c->stream),
           "uploading the attention plan");
        c->h_plan_bytes = bytes;
    }
    const size_t D = (size_t)cfg->head_dim;
    if ((rc = dbuf_need(c, &c->parts, (size_t)pa.n_part_rows * (D + 2) * sizeof(float) + 16,
                        "attention partials")))
        return rc;
    struct cuda_attn a;
    attn_args(&a, cfg, layer, s, kv, o.chunk, q, out);
    a.items = (const struct plan_attn_item *)c->plan.p;
    a.n_items = pa.n_items;
    a.combine = (const struct plan_attn_combine *)((char *)c->plan.p + ib);
    a.n_combine = pa.n_combine;
    a.tile_tokens = o.tile_tokens;
    a.part_acc = (float *)c->parts.p;
    a.part_m = a.part_acc + (size_t)pa.n_part_rows * D;
    a.part_l = a.part_m + pa.n_part_rows;
    CK(b, cuda_attention(c->stream, &a), "paged attention");
    return 0;
}

static int cu_router_topk(struct backend *b, const float *logits, int n, int n_experts, int k,
                          bool norm_topk, int32_t *ids, float *weights)
{
    struct cuda_backend *c = cuda_of(b);
    if (k < 1 || k > n_experts) return cu_fail(b, MS_EINVAL, "top-%d of %d experts", k, n_experts);
    ON_DEVICE(c);
    CK(b, cuda_router_topk(c->stream, logits, n, n_experts, k, norm_topk, ids, weights),
       "the router's top-k");
    return 0;
}

static int cu_moe_route(struct backend *b, const struct backend_route *r)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    const int n = r->e1 - r->e0;
    if (n < 0 || r->n_tokens < 0 || r->k < 1 || r->pad < 1)
        return cu_fail(b, MS_EINVAL, "routing %d tokens x top-%d to experts [%d, %d) padded "
                       "to %d rows", r->n_tokens, r->k, r->e0, r->e1, r->pad);
    if (cuda_moe_route_smem(n) > c->prop.sharedMemPerBlockOptin)
        return cu_fail(b, MS_EUNSUPPORTED, "routing over %d experts needs more shared memory "
                       "than GPU %d has", n, c->dev);
    struct cuda_route d;
    memset(&d, 0, sizeof d);
    d.ids = r->ids;
    d.live = r->live;
    d.n_tokens = r->n_tokens;
    d.k = r->k;
    d.e0 = r->e0;
    d.e1 = r->e1;
    d.pad = r->pad;
    d.off = r->off;
    d.count = r->count;
    d.slot = r->slot;
    d.token = r->token;
    d.pair = r->pair;
    CK(b, cuda_moe_route(c->stream, &d), "sorting the tokens by expert");
    return 0;
}

// The grouped matmul's tile: 8 rows when experts average 8 rows or fewer
// (decode), else 64 (cu_grouped_matmul picks the same).
static int cu_route_pad(const struct backend *b, int n_pairs, int n_groups)
{
    (void)b;
    return n_pairs <= 8 * n_groups ? 8 : 64;
}

static int cu_moe_return_slots(struct backend *b, const int32_t *ids, const int32_t *live,
                               int n_tokens, int k, const int32_t *first, int n_ranks, int stride,
                               int32_t *slot)
{
    struct cuda_backend *c = cuda_of(b);
    if (n_ranks < 1 || n_ranks > CUDA_MAX_RANKS || k < 1 || n_tokens < 0)
        return cu_fail(b, MS_EINVAL, "return slots of %d tokens x top-%d over %d ranks (at "
                       "most %d)", n_tokens, k, n_ranks, CUDA_MAX_RANKS);
    ON_DEVICE(c);
    struct cuda_return d;
    memset(&d, 0, sizeof d);
    d.ids = ids;
    d.live = live;
    d.n_tokens = n_tokens;
    d.k = k;
    d.n_ranks = n_ranks;
    d.stride = stride;
    memcpy(d.first, first, (size_t)(n_ranks + 1) * sizeof *first);
    d.slot = slot;
    CK(b, cuda_moe_return(c->stream, &d), "the MoE return slots");
    return 0;
}

static int cu_silu_mul(struct backend *b, float *g, const float *u, size_t n)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    CK(b, cuda_silu_mul(c->stream, g, u, n), "SiLU x up");
    return 0;
}

static int cu_gather_rows(struct backend *b, const float *src, size_t ld, const int32_t *rows, int n,
                          int width, float *dst)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    CK(b, cuda_gather_rows(c->stream, src, ld, rows, n, width, dst), "gathering rows");
    return 0;
}

static int cu_moe_combine(struct backend *b, float *x, const float *expert_out, const int32_t *slot,
                          const float *weights, int n_tokens, int k, int width)
{
    struct cuda_backend *c = cuda_of(b);
    ON_DEVICE(c);
    CK(b, cuda_moe_combine(c->stream, x, expert_out, slot, weights, n_tokens, k, width),
       "the MoE combine");
    return 0;
}

static int cu_lm_head(struct backend *b, const struct backend_weights *w, int v0, int n_out,
                      const float *x, int n, float *logits, size_t ldy)
{
    if (n <= 0 || n_out <= 0) return 0;
    struct backend_mm j;
    memset(&j, 0, sizeof j);
    j.w = &w->lm_head;
    j.o0 = v0;
    j.n_out = n_out;
    j.x = x;
    j.ldx = (size_t)w->cfg->hidden_size;
    j.y = logits;
    j.ldy = ldy;
    j.rows = n;
    return cu_matmul(b, &j, 1);
}

// ---- sampling -----------------------------------------------------------------------

// cpu_sample_row's parameter checks, so both backends refuse the same rows.
static bool row_ok(const struct backend_sample_row *row, int vocab)
{
    const struct sampling_params *p = row->p;
    if (!p || !row->logits) return false;
    if (row->score >= 0) return row->score < vocab;
    if (!(p->temperature >= 0) || !isfinite(p->temperature) || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
        !isfinite(p->repetition_penalty) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || p->logprobs > SAMPLING_MAX_LOGPROBS ||
        row->n_prompt < 0 || row->n_output < 0 || (row->n_prompt && !row->prompt) ||
        (row->n_output && !row->output) || (p->n_logit_bias && !p->logit_bias) || p->n_logit_bias < 0)
        return false;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || p->logit_bias[i].id >= vocab || !isfinite(p->logit_bias[i].bias))
            return false;
    return true;
}

static size_t round8(size_t n) { return (n + 7) / 8 * 8; }

// Long because it packs every row's tables into one upload: the rows, the
// biases, the masks and the distinct penalty ids (the CPU applies each
// once), the last at the end so that only the ids found are uploaded.
static int sample_chunk(struct cuda_backend *c, const struct backend_sample_row *rows, int n,
                        int vocab, struct sample_token *out)
{
    struct backend *b = &c->b;
    if (vocab > c->h_vocab) {
        free(c->h_seen);
        free(c->h_count);
        c->h_seen = (uint8_t *)calloc((size_t)vocab, 1);
        c->h_count = (int32_t *)calloc((size_t)vocab, sizeof(int32_t));
        c->h_vocab = c->h_seen && c->h_count ? vocab : 0;
        if (!c->h_vocab) return cu_fail(b, MS_ENOMEM, "out of host memory for sampling");
    }
    size_t n_bias = 0, n_pen = 0, n_words = 0;
    const size_t words = ((size_t)vocab + 31) / 32;
    for (int i = 0; i < n; i++) {
        if (!row_ok(&rows[i], vocab))
            return cu_fail(b, MS_EINVAL, "a row's sampling parameters are out of range");
        if (rows[i].score >= 0) continue;
        const struct sampling_params *p = rows[i].p;
        n_bias += (size_t)p->n_logit_bias;
        if (p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)
            n_pen += (size_t)rows[i].n_prompt + (size_t)rows[i].n_output;
        if (rows[i].allowed) n_words += words;
    }
    const size_t o_rows = 0, o_bias = round8((size_t)n * sizeof(struct cuda_sample_row));
    const size_t o_words = o_bias + round8(n_bias * sizeof(struct sampling_logit_bias));
    const size_t o_pen = o_words + round8(n_words * sizeof(uint32_t));
    const size_t total = o_pen + n_pen * sizeof(struct cuda_penalty); // n_pen: at most
    int rc = host_need(b, &c->h_stab, &c->h_stab_cap, total, "the sampling tables");
    if (rc) return rc;
    char *h = (char *)c->h_stab;
    struct cuda_sample_row *hr = (struct cuda_sample_row *)(h + o_rows);
    struct sampling_logit_bias *hb = (struct sampling_logit_bias *)(h + o_bias);
    struct cuda_penalty *hp = (struct cuda_penalty *)(h + o_pen);
    uint32_t *hw = (uint32_t *)(h + o_words);
    size_t nb = 0, np = 0, nw = 0;
    for (int i = 0; i < n; i++) {
        const struct backend_sample_row *r = &rows[i];
        const struct sampling_params *p = r->p;
        struct cuda_sample_row d;
        memset(&d, 0, sizeof d);
        d.logits = r->logits;
        d.temperature = p->temperature;
        d.top_p = p->top_p;
        d.min_p = p->min_p;
        d.rep = p->repetition_penalty;
        d.freq = p->frequency_penalty;
        d.pres = p->presence_penalty;
        d.top_k = p->top_k;
        d.logprobs = p->logprobs;
        d.prompt_logprobs = p->prompt_logprobs;
        d.score = r->score;
        d.seed = p->seed;
        d.stream = p->stream;
        d.position = r->position;
        d.allowed_off = -1;
        if (r->score < 0) {
            d.bias_off = (int32_t)nb;
            d.n_bias = p->n_logit_bias;
            memcpy(hb + nb, p->logit_bias, (size_t)p->n_logit_bias * sizeof *hb);
            nb += (size_t)p->n_logit_bias;
            d.pen_off = (int32_t)np;
            if (p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                p->presence_penalty != 0.0f) {
                // Distinct ids of prompt and output, each with its count in the output.
                for (int j = 0; j < r->n_output; j++)
                    if (r->output[j] >= 0 && r->output[j] < vocab) c->h_count[r->output[j]]++;
                for (int pass = 0; pass < 2; pass++) {
                    const int32_t *ids = pass ? r->output : r->prompt;
                    const int m = pass ? r->n_output : r->n_prompt;
                    for (int j = 0; j < m; j++) {
                        const int32_t id = ids[j];
                        if (id < 0 || id >= vocab || c->h_seen[id]) continue;
                        c->h_seen[id] = 1;
                        hp[np].id = id;
                        hp[np].seen = 1;
                        hp[np].count = c->h_count[id];
                        np++;
                    }
                }
                for (size_t j = (size_t)d.pen_off; j < np; j++) {
                    c->h_seen[hp[j].id] = 0;
                    c->h_count[hp[j].id] = 0;
                }
            }
            d.n_pen = (int32_t)(np - (size_t)d.pen_off);
            if (r->allowed) {
                d.allowed_off = (int32_t)nw;
                memcpy(hw + nw, r->allowed, words * sizeof(uint32_t));
                nw += words;
            }
        }
        hr[i] = d;
    }
    const size_t used = o_pen + np * sizeof(struct cuda_penalty);
    if ((rc = dbuf_need(c, &c->stab, total, "the sampling tables")) ||
        // Whole steps of 64 rows: a batch growing one sequence at a time
        // reallocates every 64th, and the planner's bound (its logits rows,
        // sample_bytes_per_logit) holds to within one step.
        (rc = dbuf_need(c, &c->swork, (((size_t)n + 63) & ~(size_t)63) * vocab * 2 * sizeof(float),
                        "sampling rows")) ||
        (rc = dbuf_need(c, &c->sout, (size_t)n * sizeof(struct sample_token), "sampled tokens")))
        return rc;
    // The copies below are from and to pageable memory: drain the stream
    // first, as cu_download does (its comment: an NCCL exchange queued
    // ahead of them and a peer rank's thread held in the driver).
    CK(b, cudaStreamSynchronize(c->stream), "sampling");
    CK(b, cudaMemcpyAsync(c->stab.p, h, used, cudaMemcpyHostToDevice, c->stream),
       "uploading the sampling tables");
    struct cuda_sample sp;
    memset(&sp, 0, sizeof sp);
    char *d = (char *)c->stab.p;
    sp.rows = (const struct cuda_sample_row *)(d + o_rows);
    sp.bias = (const struct sampling_logit_bias *)(d + o_bias);
    sp.pen = (const struct cuda_penalty *)(d + o_pen);
    sp.words = (const uint32_t *)(d + o_words);
    sp.vocab = vocab;
    sp.work = (float *)c->swork.p;
    sp.probs = sp.work + (size_t)n * vocab;
    sp.out = (struct sample_token *)c->sout.p;
    CK(b, cuda_sample(c->stream, &sp, n), "sampling");
    CK(b, cudaMemcpyAsync(out, c->sout.p, (size_t)n * sizeof *out, cudaMemcpyDeviceToHost, c->stream),
       "downloading the sampled tokens");
    CK(b, cudaStreamSynchronize(c->stream), "sampling");
    return 0;
}

// Rows are independent (each draw is keyed by its own seed, stream and
// position), so chunks of SAMPLE_CHUNK_ROWS give the same tokens as one pass.
static int cu_sample(struct backend *b, const struct backend_sample_row *rows, int n, int vocab,
                     struct sample_token *out)
{
    struct cuda_backend *c = cuda_of(b);
    if (vocab < 1) return cu_fail(b, MS_EINVAL, "sampling over a vocabulary of %d", vocab);
    if (n <= 0) return 0;
    ON_DEVICE(c);
    for (int i = 0; i < n; i += SAMPLE_CHUNK_ROWS) {
        const int m = n - i < SAMPLE_CHUNK_ROWS ? n - i : SAMPLE_CHUNK_ROWS;
        int rc = sample_chunk(c, rows + i, m, vocab, out + i);
        if (rc) return rc;
    }
    return 0;
}

// ---- graphs ---------------------------------------------------------------------

// Stream capture, local to this thread (other ranks' threads record their
// own graphs, or run, meanwhile).
static int cu_graph_begin(struct backend *b)
{
    struct cuda_backend *c = cuda_of(b);
    if (c->recording) return cu_fail(b, MS_EINVAL, "a graph is already being recorded");
    ON_DEVICE(c);
    CK(b, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
       "starting to record a graph");
    c->recording = true;
    c->rec_failed = false;
    c->rec_gen = c->gen;
    return 0;
}

static int cu_graph_end(struct backend *b, struct backend_graph **out)
{
    struct cuda_backend *c = cuda_of(b);
    *out = NULL;
    if (!c->recording) return cu_fail(b, MS_EINVAL, "no graph is being recorded");
    c->recording = false;
    ON_DEVICE(c);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError(); // a failed capture is not the context's failure
        return fail_cuda(b, e, "recording a graph");
    }
    if (c->rec_failed || c->gen != c->rec_gen) {
        cudaGraphDestroy(g);
        return cu_fail(b, MS_EINVAL, "an op failed or moved scratch memory while the graph "
                       "was recorded on GPU %d", c->dev);
    }
    struct backend_graph *bg = (struct backend_graph *)calloc(1, sizeof *bg);
    if (!bg) {
        cudaGraphDestroy(g);
        return cu_fail(b, MS_ENOMEM, "out of host memory for a graph");
    }
    if ((e = cudaGraphInstantiate(&bg->exec, g, 0)) != cudaSuccess) {
        cudaGraphDestroy(g);
        free(bg);
        cudaGetLastError();
        return fail_cuda(b, e, "instantiating a recorded graph");
    }
    bg->graph = g;
    bg->gen = c->gen;
    *out = bg;
    return 0;
}

static int cu_graph_launch(struct backend *b, struct backend_graph *g)
{
    struct cuda_backend *c = cuda_of(b);
    if (g->gen != c->gen)
        return cu_fail(b, MS_EINVAL, "the graph was recorded before GPU %d's scratch memory "
                       "moved", c->dev);
    int rc = not_while_recording(c, "launching a graph");
    if (rc) return rc;
    ON_DEVICE(c);
    CK(b, cudaGraphLaunch(g->exec, c->stream), "replaying a graph");
    return 0;
}

static void cu_graph_free(struct backend *b, struct backend_graph *g)
{
    if (!g) return;
    cudaSetDevice(cuda_of(b)->dev);
    // After the launches queued before it.
    cuda_release_check(cudaGraphExecDestroy(g->exec), "a graph");
    cuda_release_check(cudaGraphDestroy(g->graph), "a graph");
    free(g);
}

static void cu_destroy(struct backend *b)
{
    if (!b) return;
    struct cuda_backend *c = cuda_of(b);
    cudaSetDevice(c->dev);
    struct dbuf *bufs[] = {&c->tiles, &c->ptrs, &c->plan, &c->parts, &c->dparts, &c->stab,
                           &c->swork, &c->sout};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dbuf_free(bufs[i]);
    if (c->stream) cuda_release_check(cudaStreamDestroy(c->stream), "the stream");
    free(c->h_plan);
    free(c->h_new);
    free(c->h_stab);
    free(c->h_seen);
    free(c->h_count);
    free(c);
}

static const struct backend_ops cuda_ops = {
    "cuda",
    cu_alloc,
    cu_free,
    cu_upload,
    cu_download,
    cu_copy_2d,
    cu_sync,
    cu_memory,
    cu_measure_limits,
    cu_variant,
    cu_prepare_weights,
    cu_release_weights,
    cu_kv_alloc,
    cu_kv_free,
    nullptr, // prefault: cudaMalloc's memory is resident already
    cu_embed,
    cu_rmsnorm,
    cu_matmul,
    cu_grouped_matmul,
    cu_qk_norm_rope_store,
    cu_attention,
    cu_router_topk,
    cu_moe_route,
    cu_route_pad,
    cu_moe_return_slots,
    cu_silu_mul,
    cu_gather_rows,
    cu_moe_combine,
    cu_lm_head,
    cu_sample,
    cu_graph_begin,
    cu_graph_end,
    cu_graph_launch,
    cu_graph_free,
    cu_destroy,
};

cudaStream_t backend_cuda_stream(const struct backend *b)
{
    return b && b->ops == &cuda_ops ? ((const struct cuda_backend *)b)->stream : NULL;
}

int backend_cuda_device(const struct backend *b)
{
    return b && b->ops == &cuda_ops ? ((const struct cuda_backend *)b)->dev : -1;
}

int backend_cuda_probe(int *n_devices, char *err, size_t errlen)
{
    *n_devices = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (e == cudaErrorInsufficientDriver)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "no usable NVIDIA driver: the CUDA runtime "
                      "finds no driver (libcuda) new enough for it on this machine (%s)",
                      cudaGetErrorString(e));
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
        return ms_err(err, errlen, MS_EUNSUPPORTED, "no CUDA device is visible%s%s%s",
                      vis ? " (CUDA_VISIBLE_DEVICES=\"" : "", vis ? vis : "", vis ? "\")" : "");
    if (e != cudaSuccess)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "the CUDA runtime cannot reach a GPU: %s (%s)",
                      cudaGetErrorString(e), cudaGetErrorName(e));
    *n_devices = n;
    return 0;
}

int backend_cuda_create(int device_index, int rank, struct backend **out, char *err, size_t errlen)
{
    *out = NULL;
    int n;
    int rc = backend_cuda_probe(&n, err, errlen);
    if (rc) return rc;
    if (device_index < 0 || device_index >= n)
        return ms_err(err, errlen, MS_EINVAL, "rank %d wants GPU %d, but %d GPU%s visible (one "
                      "GPU per rank: lower --data-parallel-size or set CUDA_VISIBLE_DEVICES)",
                      rank, device_index, n, n == 1 ? " is" : "s are");
    struct cuda_backend *c = (struct cuda_backend *)calloc(1, sizeof *c);
    if (!c) return ms_err(err, errlen, MS_ENOMEM, "out of memory for a CUDA backend");
    c->b.ops = &cuda_ops;
    c->b.device = BACKEND_DEVICE_CUDA;
    c->b.index = rank;
    c->b.impl = c;
    c->dev = device_index;
    // Buffers no recorded op reads (sampling; a prefill's attention plan and
    // partials; an uploaded matrix table; a counted grouped matmul's tile
    // list): growing them keeps the graphs.
    c->stab.no_graph = c->swork.no_graph = c->sout.no_graph = true;
    c->swork.exact = true; // the planner's bound: sample_bytes_per_logit (cu_memory)
    c->plan.no_graph = c->parts.no_graph = c->ptrs.no_graph = c->tiles.no_graph = true;
    c->parts.max = c->dparts.max = ATTN_PARTS_BUF; // as scratch_bytes reports them
    cudaError_t e;
    if ((e = cudaSetDevice(device_index)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&c->prop, device_index)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        return ms_err(err, errlen, status_of(e), "GPU %d cannot be used: %s (%s)", device_index,
                      cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (c->prop.major < 8) {
        const int major = c->prop.major, minor = c->prop.minor;
        cudaStreamDestroy(c->stream);
        free(c);
        return ms_err(err, errlen, MS_EUNSUPPORTED, "GPU %d is compute capability %d.%d; the CUDA "
                      "backend needs 8.0 or newer (bf16 tensor cores)", device_index, major, minor);
    }
    snprintf(c->variant, sizeof c->variant, "sm_%d%d", c->prop.major, c->prop.minor);
    ms_log(MS_LOG_INFO, "rank %d: GPU %d is %s (%s, %d SMs, %.1f GiB)", rank, device_index,
           c->prop.name, c->variant, c->prop.multiProcessorCount,
           (double)c->prop.totalGlobalMem / (1 << 30));
    *out = &c->b;
    return 0;
}
