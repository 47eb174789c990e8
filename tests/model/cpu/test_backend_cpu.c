// Pins what the CPU backend's prepare_weights makes: with a kernel table that
// reads the packed layout, every matrix the forward pass multiplies by (and
// nothing else) is packed, each equal to packing its file data; with one that
// does not, none; ranks of one process share one packed copy per model and
// table, released with the last; a dummy load (--load-format dummy) gets its
// values made here, element by element tensor_dummy_value, packed or not;
// projections quantized at load are packed blocks for every table; the
// weights cache file is written, mapped, and rebuilt when stale or corrupt,
// and read again into 2 MiB pages when the page cache holds it in small ones;
// a step's RoPE angles, kept for its other layers, follow its positions;
// prefault (kv_pool_prefault for the pool) makes every page of the pool and
// of an allocation resident, their bytes as they were, also on a kernel
// without MADV_POPULATE_WRITE.
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/backend.h"
#include "model/cpu/backend_cpu.h"
#include "model/cpu/kernels.h"
#include "model/cpu/weights_cache.h"
#include "model/model.h"

static char dir[1024];
static char cache_root[256];

static int setup(void **state)
{
    (void)state;
    const char *d = getenv("MOESERVE_TEST_DATA");
    if (!d) return -1;
    snprintf(dir, sizeof dir, "%s/qwen3moe-v2048", d);
    snprintf(cache_root, sizeof cache_root, "/tmp/moeserve-cache-XXXXXX");
    return mkdtemp(cache_root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_root);
    return system(cmd) == 0 ? 0 : -1;
}

// The tensor's values as stored (its data) or as a dummy load makes them.
static void *values_of(const struct tensor *t)
{
    const size_t n = tensor_elems(t), esz = dtype_size(t->dtype);
    void *v = malloc(n * esz);
    assert_non_null(v);
    if (t->data) {
        memcpy(v, t->data, n * esz);
        return v;
    }
    assert_int_equal(t->dtype, DTYPE_BF16);
    for (size_t i = 0; i < n; i++) ((uint16_t *)v)[i] = ms_f32_to_bf16(tensor_dummy_value(t, i));
    return v;
}

// A prepared matrix holds t's values: packed when want_packed (and then
// equal to packing them), else as rows.
static void assert_prepared_like(const struct tensor *t, const struct backend_mat *mat, bool want_packed)
{
    void *v = values_of(t);
    const struct cpu_wmat w = {.data = v, .dtype = t->dtype, .out = mat->rows, .in = mat->cols};
    assert_int_equal((size_t)mat->rows * (size_t)mat->cols, tensor_elems(t));
    if (!want_packed) {
        assert_null(mat->priv);
        assert_non_null(mat->data);
        assert_memory_equal(mat->data, v, tensor_elems(t) * dtype_size(t->dtype));
        free(v);
        return;
    }
    assert_non_null(mat->priv);
    assert_int_equal((uintptr_t)mat->priv % 64, 0);
    const size_t n = cpu_pack_bytes(&w);
    void *ref = malloc(n);
    assert_non_null(ref);
    cpu_pack_blocks(&w, 0, (w.out + CPU_PACK_OUTS - 1) / CPU_PACK_OUTS, ref);
    assert_memory_equal(mat->priv, ref, n);
    free(ref);
    free(v);
}

static void check_prepared(const struct model *m, const struct backend_weights *w, bool packs)
{
    assert_prepared_like(&m->lm_head, &w->lm_head, packs);
    assert_prepared_like(&m->embed, &w->embed, false);
    // The embedding's lookups read the backend's own copy, not the file's
    // mapping (whose rows each faulted in on a token's first use).
    if (m->embed.data) assert_ptr_not_equal(w->embed.data, m->embed.data);
    assert_prepared_like(&m->final_norm, &w->final_norm, false);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *L = &m->layers[l];
        const struct backend_layer *B = &w->layers[l];
        assert_prepared_like(&L->wq, &B->wq, packs);
        assert_prepared_like(&L->wk, &B->wk, packs);
        assert_prepared_like(&L->wv, &B->wv, packs);
        assert_prepared_like(&L->wo, &B->wo, packs);
        assert_prepared_like(&L->router, &B->router, packs);
        assert_prepared_like(&L->attn_norm, &B->attn_norm, false);
        assert_prepared_like(&L->q_norm, &B->q_norm, false);
        for (int e = 0; e < m->cfg.n_experts; e++) {
            assert_prepared_like(&L->experts[e].gate, &B->expert_gate[e], packs);
            assert_prepared_like(&L->experts[e].up, &B->expert_up[e], packs);
            assert_prepared_like(&L->experts[e].down, &B->expert_down[e], packs);
        }
    }
}

static void matrices_are_packed_when_the_kernels_want_it(void **state)
{
    (void)state;
    const char *tables[] = {"avx512", "scalar"};
    for (int i = 0; i < 2; i++) {
        const struct cpu_kernels *k = cpu_kernels_by_name(tables[i]);
        if (!k) {
            fprintf(stderr, "note: no %s here; packing is not tested\n", tables[i]);
            continue;
        }
        char err[512];
        struct model *m;
        assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
        struct backend *b;
        assert_int_equal(backend_cpu_create(1, k, &b, err, sizeof err), 0);
        struct backend_weights *w;
        assert_int_equal(b->ops->prepare_weights(b, m, 0, m->cfg.n_experts, &w), 0);
        check_prepared(m, w, k->wants_packed != NULL);
        assert_ptr_equal(w->cfg, &m->cfg);
        b->ops->release_weights(b, w);
        b->ops->destroy(b);
        model_destroy(m);
    }
}

// Two ranks' backends with the same table get the same packed bytes (one
// copy), each with its own expert range; the copy stays until both release.
static void ranks_share_one_packed_copy(void **state)
{
    (void)state;
    char err[512];
    struct model *m;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    struct backend *b0, *b1;
    assert_int_equal(backend_cpu_create(1, NULL, &b0, err, sizeof err), 0);
    assert_int_equal(backend_cpu_create(1, NULL, &b1, err, sizeof err), 0);
    struct backend_weights *w0, *w1;
    const int E = m->cfg.n_experts;
    assert_int_equal(b0->ops->prepare_weights(b0, m, 0, E / 2, &w0), 0);
    assert_int_equal(b1->ops->prepare_weights(b1, m, E / 2, E, &w1), 0);
    assert_int_equal(w0->expert_end, E / 2);
    assert_int_equal(w1->expert_begin, E / 2);
    assert_ptr_equal(w0->layers, w1->layers);
    b0->ops->release_weights(b0, w0);
    // Still readable through the other rank's handle.
    const bool packs = backend_cpu_kernels(b1)->wants_packed != NULL;
    check_prepared(m, w1, packs);
    b1->ops->release_weights(b1, w1);
    assert_int_equal(b0->ops->prepare_weights(b0, m, 0, E + 1, &w0), MS_EINVAL);
    assert_non_null(strstr(b0->err, "expert range"));
    b0->ops->destroy(b0);
    b1->ops->destroy(b1);
    model_destroy(m);
}

// q/k norm + RoPE of one step, layer `layer`, on b: q and k out (fresh
// inputs of the same seed every call).
static void rope_step(struct backend *b, const struct backend_weights *w, struct kv_pool *kv,
                      int layer, const int32_t *pos, int n, float *q, float *k)
{
    const struct model_config *c = w->cfg;
    const size_t nq = (size_t)n * c->n_heads * c->head_dim, nk = (size_t)n * c->n_kv_heads * c->head_dim;
    float *v = calloc(nk, sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < nq; i++) q[i] = (float)((i * 7919) % 97) / 97.0f - 0.5f;
    for (size_t i = 0; i < nk; i++) k[i] = (float)((i * 104729) % 89) / 89.0f - 0.5f;
    const int32_t seq[4] = {0, 0, 0, 0}, seq_start[2] = {0, n}, bt_start[2] = {0, 1}, bt[1] = {0};
    const struct backend_step st = {.n_tokens = n, .n_seqs = 1, .max_ctx = pos[n - 1] + 1,
                                    .tok_pos = pos, .tok_seq = seq, .seq_start = seq_start,
                                    .bt_start = bt_start, .bt = bt, .h_tok_pos = pos, .h_tok_seq = seq,
                                    .h_seq_start = seq_start, .h_bt_start = bt_start, .h_bt = bt};
    assert_int_equal(b->ops->qk_norm_rope_store(b, w, layer, &st, kv, q, k, v), 0);
    free(v);
}

// The backend keeps a step's RoPE angles for its other layers: a step with
// the same number of tokens at other positions, or the same positions under
// other frequencies (other weights on the same backend), must rotate by its
// own angles, the same bits as a backend that never saw a step before it.
static void rope_angles_follow_the_step_positions(void **state)
{
    (void)state;
    char err[512];
    struct model *m;
    assert_int_equal(model_load(dir, &m, err, sizeof err), 0);
    const struct model_config *c = &m->cfg;
    const size_t nq = 4 * (size_t)c->n_heads * c->head_dim, nk = 4 * (size_t)c->n_kv_heads * c->head_dim;
    float *q[2], *k[2];
    const int32_t first[4] = {0, 1, 2, 3}, later[4] = {9, 10, 11, 12}, again[4] = {9, 10, 11, 13};
    for (int run = 0; run < 2; run++) {
        struct backend *b;
        struct backend_weights *w;
        struct kv_pool *kv;
        assert_int_equal(backend_cpu_create(1, NULL, &b, err, sizeof err), 0);
        assert_int_equal(b->ops->prepare_weights(b, m, 0, c->n_experts, &w), 0);
        assert_int_equal(kv_pool_create(b, c, DTYPE_F32, 4, &kv, err, sizeof err), 0);
        q[run] = malloc(nq * sizeof(float));
        k[run] = malloc(nk * sizeof(float));
        assert_true(q[run] && k[run]);
        if (run == 0) { // the positions move under the same token count
            rope_step(b, w, kv, 0, first, 4, q[run], k[run]);
            rope_step(b, w, kv, 1, first, 4, q[run], k[run]);
            rope_step(b, w, kv, 1, later, 4, q[run], k[run]);
            rope_step(b, w, kv, 0, again, 4, q[run], k[run]);
        }
        // Then the frequencies change under the same positions.
        for (int i = 0; i < c->head_dim / 2; i++) w->rope_inv_freq[i] *= 1.5;
        rope_step(b, w, kv, 0, again, 4, q[run], k[run]);
        kv_pool_destroy(b, kv);
        b->ops->release_weights(b, w);
        b->ops->destroy(b);
    }
    assert_memory_equal(q[0], q[1], nq * sizeof(float));
    assert_memory_equal(k[0], k[1], nk * sizeof(float));
    for (int run = 0; run < 2; run++) {
        free(q[run]);
        free(k[run]);
    }
    model_destroy(m);
}

// A dummy load reads only config.json: no weight bytes on the host, every
// tensor's recipe set; prepare_weights makes exactly tensor_dummy_value's
// bits (packed for the tables that pack), and the same seed makes the same
// model while another seed does not.
static void dummy_weights_are_made_by_the_backend(void **state)
{
    (void)state;
    char err[512];
    struct model *m, *same, *other;
    assert_int_equal(model_load_format(dir, LOAD_FORMAT_DUMMY, 7, &m, err, sizeof err), 0);
    assert_int_equal(model_load_format(dir, LOAD_FORMAT_DUMMY, 7, &same, err, sizeof err), 0);
    assert_int_equal(model_load_format(dir, LOAD_FORMAT_DUMMY, 8, &other, err, sizeof err), 0);
    assert_true(m->dummy);
    assert_null(m->storage);
    assert_null(m->layers[0].wq.data);
    assert_int_equal(m->layers[0].q_norm.init, TENSOR_INIT_NORM);
    assert_int_equal(m->layers[0].wq.init, TENSOR_INIT_UNIFORM);
    assert_true(tensor_dummy_value(&m->layers[1].wo, 5) == tensor_dummy_value(&same->layers[1].wo, 5));
    assert_true(tensor_dummy_value(&m->layers[1].wo, 5) != tensor_dummy_value(&other->layers[1].wo, 5));
    // The real checkpoint of the same config binds the same shapes and bytes.
    struct model *real;
    assert_int_equal(model_load(dir, &real, err, sizeof err), 0);
    assert_int_equal(m->weight_bytes, real->weight_bytes);
    model_destroy(real);
    const char *tables[] = {"avx512", "scalar"};
    for (int i = 0; i < 2; i++) {
        const struct cpu_kernels *k = cpu_kernels_by_name(tables[i]);
        if (!k) continue;
        struct backend *b;
        assert_int_equal(backend_cpu_create(1, k, &b, err, sizeof err), 0);
        struct backend_weights *w;
        assert_int_equal(b->ops->prepare_weights(b, m, 0, m->cfg.n_experts, &w), 0);
        check_prepared(m, w, k->wants_packed != NULL);
        b->ops->release_weights(b, w);
        b->ops->destroy(b);
    }
    model_destroy(m);
    model_destroy(same);
    model_destroy(other);
}

// --quantization: every projection is held packed in model/quant.h's
// blocks for every table (no rows), equal to packing its canonical rows;
// the router, norms, embedding and lm_head are prepared as before.
static void quantized_projections_are_packed_for_every_table(void **state)
{
    (void)state;
    char err[512];
    struct model *m;
    const struct model_load_opts o = {.quantization = QUANT_INT4, .cache_dir = "none"};
    assert_int_equal(model_load_opts(dir, &o, &m, err, sizeof err), 0);
    const char *tables[] = {"avx512", "avx2", "scalar"};
    for (int i = 0; i < 3; i++) {
        const struct cpu_kernels *k = cpu_kernels_by_name(tables[i]);
        if (!k) continue;
        struct backend *b;
        assert_int_equal(backend_cpu_create(1, k, &b, err, sizeof err), 0);
        struct backend_weights *w;
        assert_int_equal(b->ops->prepare_weights(b, m, 0, m->cfg.n_experts, &w), 0);
        const struct tensor *ts[] = {&m->layers[0].wq, &m->layers[1].wo, &m->layers[2].experts[5].down};
        const struct backend_mat *ms[] = {&w->layers[0].wq, &w->layers[1].wo, &w->layers[2].expert_down[5]};
        for (int j = 0; j < 3; j++) {
            const struct tensor *t = ts[j];
            const struct backend_mat *bm = ms[j];
            assert_int_equal(bm->quant, QUANT_INT4);
            assert_null(bm->data);
            assert_non_null(bm->priv);
            assert_int_equal(bm->group_cols, QUANT_GROUP);
            const int R = (int)t->shape[0], C = (int)t->shape[1];
            const size_t bb = quant_block_bytes(QUANT_INT4, C, QUANT_GROUP);
            char *block = malloc(bb);
            void *buf = malloc(quant_rows_bytes(16, C, QUANT_INT4, QUANT_GROUP));
            float *tmp = malloc((size_t)C * sizeof *tmp);
            assert_true(block && buf && tmp);
            for (int r0 = 0; r0 < R; r0 += 16) {
                struct quant_rows r;
                quant_rows_init(&r, buf, 16, C, QUANT_INT4, QUANT_GROUP);
                r.n = R - r0 < 16 ? R - r0 : 16;
                quant_tensor_rows(t, r0, r.n, &r, tmp);
                cpu_qpack_block(&r, block);
                assert_memory_equal((const char *)bm->priv + (size_t)(r0 / 16) * bb, block, bb);
            }
            free(block);
            free(buf);
            free(tmp);
        }
        assert_int_equal(w->layers[0].router.quant, QUANT_NONE);
        assert_int_equal(w->lm_head.quant, QUANT_NONE);
        assert_int_equal(w->embed.quant, QUANT_NONE);
        b->ops->release_weights(b, w);
        b->ops->destroy(b);
    }
    model_destroy(m);
}

// ---- the weights cache ----------------------------------------------------------------

// Prepares the checkpoint in ckpt (int4 at load) with the cache in cdir:
// returns where the weights came from (backend_cpu_weights_cached) and, in
// *packed, a copy of one expert's packed blocks (for comparing runs).
static int prepare_cached(const char *ckpt, const char *cdir, void **packed, size_t *n)
{
    char err[512];
    struct model *m;
    const struct model_load_opts o = {.quantization = QUANT_INT4, .cache_dir = cdir};
    assert_int_equal(model_load_opts(ckpt, &o, &m, err, sizeof err), 0);
    struct backend *b;
    assert_int_equal(backend_cpu_create(1, NULL, &b, err, sizeof err), 0);
    struct backend_weights *w;
    assert_int_equal(b->ops->prepare_weights(b, m, 0, m->cfg.n_experts, &w), 0);
    const int cached = backend_cpu_weights_cached(w);
    const struct backend_mat *e = &w->layers[1].expert_up[3];
    const struct cpu_wmat wm = {.out = e->rows, .in = e->cols, .quant = e->quant, .group = e->group_cols};
    *n = cpu_pack_bytes(&wm);
    *packed = malloc(*n);
    assert_non_null(*packed);
    memcpy(*packed, e->priv, *n);
    b->ops->release_weights(b, w);
    b->ops->destroy(b);
    model_destroy(m);
    return cached;
}

// The one cache file in cdir (fails unless there is exactly one, with no
// temporary left beside it).
static void cache_file(const char *cdir, char *out, size_t len)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls '%s'", cdir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        assert_null(strstr(line, ".tmp."));
        snprintf(out, len, "%s/%s", cdir, line);
        n++;
    }
    pclose(p);
    assert_int_equal(n, 1);
}

static void flip_byte(const char *path, long at)
{
    assert_int_equal(chmod(path, 0644), 0); // committed read-only
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, at, SEEK_SET);
    const int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x20, f);
    fclose(f);
}

// A copy of the tiny checkpoint in cache_root/name (*ckpt) and where its
// cache goes, cache_root/cache (*cdir): each test changes its own copy.
static void copy_checkpoint(const char *name, const char *cache, char *ckpt, size_t ckpt_len, char *cdir,
                            size_t cdir_len)
{
    char cmd[2200];
    snprintf(ckpt, ckpt_len, "%s/%s", cache_root, name);
    snprintf(cdir, cdir_len, "%s/%s", cache_root, cache);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/* '%s/'", ckpt, dir, ckpt);
    assert_int_equal(system(cmd), 0);
}

// The first start writes the file, the next maps it and gets the same
// bytes; a header flipped anywhere (magic, sizes, key, checksum), a
// truncated file or a checkpoint touched since is noticed and the file
// rebuilt, never used; cache_dir none writes nothing.
static void the_weights_cache_is_written_mapped_and_rebuilt_when_stale_or_corrupt(void **state)
{
    (void)state;
    char ckpt[512], cdir[512], file[1024], cmd[2200];
    copy_checkpoint("ckpt", "cache", ckpt, sizeof ckpt, cdir, sizeof cdir);
    void *ref, *got;
    size_t n, n2;
    assert_int_equal(prepare_cached(ckpt, "none", &ref, &n), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2); // written
    assert_int_equal(n2, n);
    assert_memory_equal(got, ref, n);
    free(got);
    cache_file(cdir, file, sizeof file);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 1); // mapped
    assert_memory_equal(got, ref, n);
    free(got);
    // Corruptions: the magic, the format, a size, the number of data sums,
    // the header's checksum, the key's text, a data sum, then the data: the
    // first packed byte, one deep in the packed area, the made area's last.
    struct stat fs;
    assert_int_equal(stat(file, &fs), 0);
    uint64_t hdr[10]; // magic, format, data_off, packed, made_off, made, file, key_len, n_sums, checksum
    FILE *hf = fopen(file, "rb");
    assert_non_null(hf);
    assert_int_equal(fread(hdr, sizeof hdr, 1, hf), 1);
    fclose(hf);
    assert_int_equal(hdr[8], 1); // this small file has one data sum
    const long key_at = (long)sizeof hdr, sums_at = key_at + (long)hdr[7], data_at = (long)hdr[2];
    assert_true(data_at + 100003 < fs.st_size);
    const long at[] = {0, 8, 24, 64, 72, key_at + 16, sums_at + 3, data_at, data_at + 100003, (long)fs.st_size - 1};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        flip_byte(file, at[i]);
        if (prepare_cached(ckpt, cdir, &got, &n2) != 2) fail_msg("byte %ld flipped: the file was used", at[i]);
        assert_memory_equal(got, ref, n);
        free(got);
        assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 1); // rebuilt whole
        free(got);
    }
    // Truncated: a header alone, then a file short of its last page.
    const long sizes[] = {40, -4096};
    for (int i = 0; i < 2; i++) {
        struct stat sb;
        assert_int_equal(stat(file, &sb), 0);
        assert_int_equal(chmod(file, 0644), 0);
        assert_int_equal(truncate(file, sizes[i] > 0 ? sizes[i] : sb.st_size + sizes[i]), 0);
        assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
        assert_memory_equal(got, ref, n);
        free(got);
    }
    // A checkpoint changed since (its mtime): stale, rebuilt in place.
    snprintf(cmd, sizeof cmd, "touch -d '2001-01-01' '%s/model.safetensors'", ckpt);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    free(got);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 1);
    free(got);
    cache_file(cdir, file, sizeof file); // replaced, not added beside
    free(ref);
}

// Only a file this process's user wrote, and nobody else can write, is
// trusted, and only for the very files it was made from: a checkpoint
// replaced by a copy of the same size and modification time (cp -p, a
// normalized mtime) is another file; a group-writable cache file, a symlink
// or a FIFO at its name is not used (nor waited on); the file is committed
// read-only; a temporary file no writer holds (a start killed while
// preparing) is removed, one a writer holds is not.
static void the_weights_cache_trusts_only_its_own_files(void **state)
{
    (void)state;
    char ckpt[512], cdir[512], file[1024], cmd[6000], other[1100];
    copy_checkpoint("ckpt2", "cache2", ckpt, sizeof ckpt, cdir, sizeof cdir);
    void *ref, *got;
    size_t n, n2;
    assert_int_equal(prepare_cached(ckpt, "none", &ref, &n), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    free(got);
    cache_file(cdir, file, sizeof file);
    struct stat sb;
    assert_int_equal(stat(file, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0444);
    // The same bytes' size and mtime in another file (a new inode and ctime).
    snprintf(cmd, sizeof cmd, "cd '%s' && cp -p model.safetensors x && mv x model.safetensors", ckpt);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    free(got);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 1);
    free(got);
    // Writable by the group: not used, replaced.
    assert_int_equal(chmod(file, 0664), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    free(got);
    // A symlink to a good copy of it, and a FIFO: neither is used.
    snprintf(other, sizeof other, "%s/elsewhere.weights", cache_root);
    snprintf(cmd, sizeof cmd, "cp -p '%s' '%s' && rm '%s' && ln -s '%s' '%s'", file, other, file, other, file);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    free(got);
    assert_int_equal(unlink(file), 0);
    assert_int_equal(mkfifo(file, 0600), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    assert_memory_equal(got, ref, n);
    free(got);
    cache_file(cdir, file, sizeof file);
    assert_int_equal(lstat(file, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    // Temporary files: an orphan is removed when the file is next written;
    // one a writer holds (locked) stays.
    char orphan[1100], held[1100];
    snprintf(orphan, sizeof orphan, "%s.tmp.dead01", file);
    snprintf(held, sizeof held, "%s.tmp.live01", file);
    const int of = open(orphan, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    const int hf = open(held, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(of >= 0 && hf >= 0);
    close(of);
    assert_int_equal(flock(hf, LOCK_EX), 0);
    snprintf(cmd, sizeof cmd, "touch -d '2002-02-02' '%s/config.json'", ckpt);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(prepare_cached(ckpt, cdir, &got, &n2), 2);
    free(got);
    assert_int_not_equal(access(orphan, F_OK), 0);
    assert_int_equal(access(held, F_OK), 0);
    close(hf);
    assert_int_equal(unlink(held), 0);
    cache_file(cdir, file, sizeof file);
    free(ref);
}

// The key holds config.json as it was read, not as it is when the key is
// made: a config replaced in between (edited while a server starts) must
// not file weights prepared under the old one under the new one's version,
// where every later start would trust them.
static void the_weights_cache_is_keyed_by_the_config_as_read(void **state)
{
    (void)state;
    char ckpt[512], cdir[512], cmd[2200], err[512];
    copy_checkpoint("ckpt3", "cache3", ckpt, sizeof ckpt, cdir, sizeof cdir);
    const struct model_load_opts o = {.cache_dir = cdir};
    struct model *before, *after;
    assert_int_equal(model_load_opts(ckpt, &o, &before, err, sizeof err), 0);
    snprintf(cmd, sizeof cmd, "cd '%s' && cp config.json x && mv x config.json", ckpt);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(model_load_opts(ckpt, &o, &after, err, sizeof err), 0);
    struct weights_cache a, a2, b;
    assert_int_equal(weights_cache_open(&a, before, "test", 4096, 0), 1);
    assert_int_equal(weights_cache_open(&a2, before, "test", 4096, 0), 1);
    assert_int_equal(weights_cache_open(&b, after, "test", 4096, 0), 1);
    assert_string_equal(a.key, a2.key);
    if (!strcmp(a.key, b.key)) fail_msg("the config read before its replacement keys as the new one:\n%s", a.key);
    weights_cache_close(&a);
    weights_cache_close(&a2);
    weights_cache_close(&b);
    model_destroy(before);
    model_destroy(after);
}

// Leaves the file's pages in the page cache as 4 KiB folios: dropped, then
// read back one page at a time in an order that defeats readahead, through
// a mapping that asks for no huge pages.
static void cache_in_small_pages(const char *path)
{
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    const size_t n = (size_t)sb.st_size, pages = n / 4096;
    const volatile char *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    madvise((void *)p, n, MADV_RANDOM);
    for (size_t i = 0; i < pages; i++) (void)p[(i * 7919) % pages * 4096];
    munmap((void *)p, n);
    close(fd);
}

// Bytes of fd's first n on 2 MiB page table entries, mapped as the
// cache maps it (2 MiB-aligned, asking for huge pages) and touched.
static long long pmd_bytes_of(int fd, size_t n)
{
    char *p = ms_map_huge(fd, n, PROT_READ);
    assert_true(p != MAP_FAILED);
    for (size_t i = 0; i < n; i += 4096) (void)((volatile char *)p)[i];
    const long long b = weights_cache_pmd_bytes(p, n);
    munmap(p, n);
    return b;
}

// Whether this kernel keeps a file of dir's file system in 2 MiB folios
// read through a 2 MiB-aligned mapping that asks for huge pages.
static bool large_folios_in(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/probe", dir);
    const size_t huge = (size_t)2 << 20;
    const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    char *buf = calloc(1, huge);
    assert_non_null(buf);
    assert_int_equal(pwrite(fd, buf, huge, 0), (ssize_t)huge);
    free(buf);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    const bool large = pmd_bytes_of(fd, huge) == (long long)huge;
    close(fd);
    unlink(path);
    return large;
}

// A cache file whose pages the page cache holds in 4 KiB folios (read by
// something else, or kept from an older start) is read again into 2 MiB
// pages when mapped, where the kernel can, with the same bytes.
static void the_weights_cache_is_read_again_into_huge_pages(void **state)
{
    (void)state;
    char cdir[512], err[512];
    snprintf(cdir, sizeof cdir, "%s/huge", cache_root);
    assert_int_equal(mkdir(cdir, 0755), 0);
    struct model *m;
    const struct model_load_opts o = {.cache_dir = cdir};
    assert_int_equal(model_load_opts(dir, &o, &m, err, sizeof err), 0);
    // 12 MiB of packed bytes, each a function of its offset.
    const uint64_t packed = (uint64_t)12 << 20;
    struct weights_cache c;
    assert_int_equal(weights_cache_open(&c, m, "test", packed, 0), 1);
    assert_false(weights_cache_map(&c));
    assert_true(weights_cache_create(&c));
    uint32_t *d = (uint32_t *)((char *)c.map + c.data_off);
    for (size_t i = 0; i < packed / 4; i++) d[i] = (uint32_t)(i * 2654435761u);
    assert_true(weights_cache_commit(&c));
    char path[sizeof c.path];
    memcpy(path, c.path, sizeof path);
    munmap(c.map, c.map_bytes);
    weights_cache_close(&c);

    cache_in_small_pages(path);
    // Whether the case arose: the file in 4 KiB folios, mapped as the cache maps it.
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    const size_t whole = (size_t)12 << 20;
    const bool small = pmd_bytes_of(fd, whole) < (long long)(whole / 10);
    close(fd);
    assert_int_equal(weights_cache_open(&c, m, "test", packed, 0), 1);
    assert_true(weights_cache_map(&c));
    d = (uint32_t *)((char *)c.map + c.data_off);
    for (size_t i = 0; i < packed / 4; i++)
        if (d[i] != (uint32_t)(i * 2654435761u)) fail_msg("word %zu changed after mapping", i);
    const long long pmd = weights_cache_pmd_bytes(c.map, c.map_bytes);
    // It reads again only what it could lock (the locked-memory limit).
    const bool locked = mlock(c.map, c.map_bytes) == 0, large = large_folios_in(cdir);
    if (small && locked && large) {
        if ((double)pmd < 0.9 * (double)whole)
            fail_msg("%lld of %zu bytes of the cache in 2 MiB pages", pmd, c.map_bytes);
    } else {
        fprintf(stderr, "(the 2 MiB pages not checked: the file %s in 4 KiB folios, the mapping %s "
                "locked, this file system's pages %s kept in 2 MiB folios)\n", small ? "was" : "was not",
                locked ? "could be" : "could not be", large ? "are" : "are not");
    }
    munmap(c.map, c.map_bytes);
    weights_cache_close(&c);
    model_destroy(m);
}

// Pages of [p, p + bytes) resident and this process's own now: present and
// exclusively mapped in /proc/self/pagemap (bits 63 and 56, shown without
// privileges). A page only read is not: a read maps the kernel's shared
// zero page, which mincore counts as resident, so a prefault that read
// instead of writing would pass a mincore check and fault again at a
// step's first write. SIZE_MAX, said on stderr, where it cannot tell (no
// cmocka asserts: a forked child calls it).
static size_t written_pages(const void *p, size_t bytes)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t first = (uintptr_t)p / pg, n = ((uintptr_t)p + bytes + pg - 1) / pg - first;
    uint64_t *e = malloc(n * sizeof *e);
    const int fd = open("/proc/self/pagemap", O_RDONLY);
    const ssize_t want = (ssize_t)(n * sizeof *e);
    const bool ok = e && fd >= 0 && pread(fd, e, (size_t)want, (off_t)(first * sizeof *e)) == want;
    if (!ok) fprintf(stderr, "/proc/self/pagemap over %zu bytes: %s\n", bytes, e ? strerror(errno) : "out of memory");
    if (fd >= 0) close(fd);
    size_t r = 0;
    for (size_t i = 0; ok && i < n; i++) r += (e[i] >> 63 & 1) && (e[i] >> 56 & 1);
    free(e);
    return ok ? r : SIZE_MAX;
}

// A pool of 40 blocks and a 5 MiB allocation (a workspace: it starts 64
// bytes into its mapping, past the length header) are mapped lazily: no
// page is written until a step writes one (but the header's). After the
// prefaults every page of K, V and the allocation is (written_pages),
// every byte still zero. NULL when all holds, else what did not (no cmocka asserts: a forked
// child runs it too, where a failed one would jump back into the parent's
// copy of the test runner).
static const char *prefault_check(void)
{
    static char msg[600];
    char err[512];
    struct model *m;
    if (model_load(dir, &m, err, sizeof err)) return snprintf(msg, sizeof msg, "model_load: %s", err), msg;
    const struct model_config *c = &m->cfg;
    struct backend *b;
    struct kv_pool *kv;
    if (backend_cpu_create(2, NULL, &b, err, sizeof err) ||
        kv_pool_create(b, c, DTYPE_BF16, 40, &kv, err, sizeof err))
        return snprintf(msg, sizeof msg, "backend or pool: %s", err), msg;
    const size_t bytes = kv_pool_bytes(kv);
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), pages = (bytes + pg - 1) / pg;
    if (written_pages(kv->k, bytes) || written_pages(kv->v, bytes)) return "pool resident before the prefault";
    if (kv_pool_prefault(b, kv, err, sizeof err)) return snprintf(msg, sizeof msg, "kv_pool_prefault: %s", err), msg;
    if (written_pages(kv->k, bytes) != pages || written_pages(kv->v, bytes) != pages)
        return "a page of the pool not written after the prefault";
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)kv->k)[i] || ((const unsigned char *)kv->v)[i])
            return snprintf(msg, sizeof msg, "byte %zu of the pool is not 0", i), msg;
    const size_t ws_bytes = (size_t)5 << 20;
    unsigned char *ws;
    if (b->ops->alloc(b, ws_bytes, (void **)&ws)) return "alloc";
    const uintptr_t lo = (uintptr_t)ws / pg * pg, hi = ((uintptr_t)ws + ws_bytes + pg - 1) / pg * pg;
    // Only the page that took the header: 2 MiB of the 5 (one huge page).
    if (written_pages((void *)lo, hi - lo) > ((size_t)2 << 20) / pg) return "allocation resident before the prefault";
    if (b->ops->prefault(b, ws, ws_bytes)) return "prefault of the allocation failed";
    if (written_pages((void *)lo, hi - lo) != (hi - lo) / pg) return "a page of the allocation not written after";
    for (size_t i = 0; i < ws_bytes; i++)
        if (ws[i]) return snprintf(msg, sizeof msg, "byte %zu of the allocation is not 0", i), msg;
    b->ops->free(b, ws);
    kv_pool_destroy(b, kv);
    b->ops->destroy(b);
    model_destroy(m);
    return NULL;
}

static void prefault_makes_every_page_of_the_pool_and_an_allocation_resident(void **state)
{
    (void)state;
    const char *why = prefault_check();
    if (why) fail_msg("%s", why);
}

// A kernel older than 5.14 answers MADV_POPULATE_WRITE with EINVAL. A child
// made one such (a seccomp filter returning EINVAL for that advice, which
// it checks took) runs the same check, through the fallback's page writes.
// Skipped where the child cannot install a filter (exit status 2).
static void prefault_works_on_kernels_without_populate_write(void **state)
{
    (void)state;
#if (defined(__x86_64__) || defined(__aarch64__)) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        // A crash is the child's own (exit by signal), not cmocka's handler
        // running the parent's remaining tests in the child.
        const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
#if defined(__x86_64__)
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
#else
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_AARCH64, 1, 0),
#endif
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
            // the advice's low 32 bits (little-endian)
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 23 /* MADV_POPULATE_WRITE */, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {.len = (unsigned short)(sizeof f / sizeof f[0]), .filter = f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
            fprintf(stderr, "seccomp: %s\n", strerror(errno));
            _exit(2);
        }
        char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || madvise(p, 4096, 23) == 0 || errno != EINVAL) {
            fprintf(stderr, "the filter did not refuse MADV_POPULATE_WRITE\n");
            _exit(3);
        }
        const char *why = prefault_check();
        if (why) fprintf(stderr, "without MADV_POPULATE_WRITE: %s\n", why);
        _exit(why ? 1 : 0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st)) fail_msg("the child died of signal %d", WTERMSIG(st));
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 2) skip(); // no seccomp here: said on stderr
    assert_int_equal(WEXITSTATUS(st), 0);
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matrices_are_packed_when_the_kernels_want_it),
        cmocka_unit_test(ranks_share_one_packed_copy),
        cmocka_unit_test(dummy_weights_are_made_by_the_backend),
        cmocka_unit_test(quantized_projections_are_packed_for_every_table),
        cmocka_unit_test(the_weights_cache_is_written_mapped_and_rebuilt_when_stale_or_corrupt),
        cmocka_unit_test(the_weights_cache_trusts_only_its_own_files),
        cmocka_unit_test(the_weights_cache_is_keyed_by_the_config_as_read),
        cmocka_unit_test(the_weights_cache_is_read_again_into_huge_pages),
        cmocka_unit_test(rope_angles_follow_the_step_positions),
        cmocka_unit_test(prefault_makes_every_page_of_the_pool_and_an_allocation_resident),
        cmocka_unit_test(prefault_works_on_kernels_without_populate_write),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
