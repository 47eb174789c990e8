// The registry's device choice on this machine: without a usable GPU,
// --device cuda is refused with a sentence naming what is missing (no CUDA
// backend in the build, no driver, no visible device) and auto resolves to
// the CPU with a note saying why; with one, both resolve to CUDA, and a rank
// asking for a GPU past the visible ones is refused with the count.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/backend_registry.h"

static void cuda_is_chosen_when_visible_and_refused_with_a_reason_when_not(void **state)
{
    (void)state;
    enum backend_device d = BACKEND_DEVICE_AUTO;
    char err[512] = "", note[512] = "";
    const int gpus = backend_device_count(BACKEND_DEVICE_CUDA);
    const int rc = backend_device_resolve(BACKEND_DEVICE_CUDA, &d, NULL, 0, err, sizeof err);
    assert_int_equal(backend_device_resolve(BACKEND_DEVICE_AUTO, &d, note, sizeof note, NULL, 0) , 0);
    if (gpus == 0) {
        assert_int_equal(rc, MS_EUNSUPPORTED);
        assert_non_null(strstr(err, "--device cuda: "));
        assert_true(strstr(err, "no usable NVIDIA driver") || strstr(err, "no CUDA device is visible") ||
                    strstr(err, "has no CUDA backend") || strstr(err, "cannot reach a GPU"));
        assert_int_equal(d, BACKEND_DEVICE_CPU);
        assert_non_null(strstr(note, "--device auto: "));
        assert_non_null(strstr(note, "running on the CPU"));
        struct backend *b;
        struct backend_opts bo = {.n_threads = 1};
        assert_int_not_equal(backend_create(BACKEND_DEVICE_CUDA, &bo, &b, err, sizeof err), 0);
        print_message("no GPU here: %s\n", note);
        return;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(d, BACKEND_DEVICE_CUDA);
    assert_string_equal(note, "");
    struct backend *b;
    struct backend_opts bo = {.device_index = gpus};
    assert_int_equal(backend_create(BACKEND_DEVICE_CUDA, &bo, &b, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "visible"));
    bo.device_index = 0;
    assert_int_equal(backend_create(BACKEND_DEVICE_CUDA, &bo, &b, err, sizeof err), 0);
    assert_string_equal(b->ops->name, "cuda");
    backend_destroy(b);
}

static void the_cpu_is_always_there(void **state)
{
    (void)state;
    enum backend_device d;
    assert_int_equal(backend_device_resolve(BACKEND_DEVICE_CPU, &d, NULL, 0, NULL, 0), 0);
    assert_int_equal(d, BACKEND_DEVICE_CPU);
    assert_int_equal(backend_device_count(BACKEND_DEVICE_CPU), 1);
    assert_int_equal(backend_device_parse("cuda", &d), 0);
    assert_int_equal(d, BACKEND_DEVICE_CUDA);
    assert_int_equal(backend_device_parse("gpu", &d), MS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cuda_is_chosen_when_visible_and_refused_with_a_reason_when_not),
        cmocka_unit_test(the_cpu_is_always_there),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
