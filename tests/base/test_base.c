// Pins the base helpers: bf16/f16 rounding, overflow checks, arena alignment.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/arena.h"
#include "base/base.h"

static void bf16_rounds_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(ms_f32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 is exactly halfway between two bf16 values: rounds to even (1.0).
    assert_int_equal(ms_f32_to_bf16(1.00390625f), 0x3f80);
    // 1 + 3*2^-8 is halfway too: rounds up to the even neighbour.
    assert_int_equal(ms_f32_to_bf16(1.01171875f), 0x3f82);
    assert_true(ms_bf16_to_f32(ms_f32_to_bf16(-2.5f)) == -2.5f);
}

static void f16_round_trips_normals_and_subnormals(void **state)
{
    (void)state;
    const float vals[] = {0.0f, 1.0f, -1.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        assert_true(ms_f16_to_f32(ms_f32_to_f16(vals[i])) == vals[i]);
    assert_int_equal(ms_f32_to_f16(1e6f), 0x7c00); // overflow to inf
}

static void size_arithmetic_reports_overflow(void **state)
{
    (void)state;
    size_t r;
    assert_true(ms_add_overflow(SIZE_MAX, 1, &r));
    assert_false(ms_add_overflow(1, 2, &r));
    assert_int_equal(r, 3);
    assert_true(ms_mul_overflow(SIZE_MAX / 2 + 1, 2, &r));
}

static void arena_allocations_are_aligned_and_distinct(void **state)
{
    (void)state;
    struct arena *a = arena_create(256);
    assert_non_null(a);
    char *prev = NULL;
    for (int i = 1; i < 200; i++) {
        char *p = arena_alloc(a, (size_t)i);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 0xab, (size_t)i);
        assert_ptr_not_equal(p, prev);
        prev = p;
    }
    char *big = arena_alloc(a, 100000);
    assert_non_null(big);
    memset(big, 1, 100000);
    assert_null(arena_alloc(a, SIZE_MAX));
    assert_string_equal(arena_strdup(a, "hello"), "hello");
    arena_destroy(a);
}

static void err_fills_buffer_and_returns_code(void **state)
{
    (void)state;
    char err[32];
    assert_int_equal(ms_err(err, sizeof err, MS_EINVAL, "bad %s", "thing"), MS_EINVAL);
    assert_string_equal(err, "bad thing");
    assert_int_equal(ms_err(NULL, 0, MS_EIO, "ignored"), MS_EIO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_rounds_to_nearest_even),
        cmocka_unit_test(f16_round_trips_normals_and_subnormals),
        cmocka_unit_test(size_arithmetic_reports_overflow),
        cmocka_unit_test(arena_allocations_are_aligned_and_distinct),
        cmocka_unit_test(err_fills_buffer_and_returns_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
