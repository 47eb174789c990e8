// Pins what the CPU backend's prepare_weights makes: with a kernel table that
// reads the packed layout, every matrix the forward pass multiplies by (and
// nothing else) is packed, each equal to packing its file data; with one that
// does not, none; ranks of one process share one packed copy per model and
// table, released with the last; a dummy load (--load-format dummy) gets its
// values made here, element by element tensor_dummy_value, packed or not.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/backend.h"
#include "model/cpu/backend_cpu.h"
#include "model/cpu/kernels.h"
#include "model/model.h"

static char dir[1024];

static int setup(void **state)
{
    (void)state;
    const char *d = getenv("MOESERVE_TEST_DATA");
    if (!d) return -1;
    snprintf(dir, sizeof dir, "%s/qwen3moe-v2048", d);
    return 0;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matrices_are_packed_when_the_kernels_want_it),
        cmocka_unit_test(ranks_share_one_packed_copy),
        cmocka_unit_test(dummy_weights_are_made_by_the_backend),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
