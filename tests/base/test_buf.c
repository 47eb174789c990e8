// Pins the shared byte buffer: growth keeps the bytes, sizes that overflow
// and appends past the cap are refused with the buffer unchanged, formatting
// of any length, and the allocator hook.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "base/buf.h"

static void appends_grow_and_keep_every_byte(void **state)
{
    (void)state;
    struct ms_buf b = {0};
    assert_null(b.data);
    size_t last_cap = 0;
    int growths = 0;
    for (int i = 0; i < 100000; i++) {
        char c = (char)('a' + i % 26);
        assert_int_equal(ms_buf_append(&b, &c, 1), 0);
        if (b.cap != last_cap) {
            assert_true(b.cap >= 2 * last_cap); // at least doubles: appends are amortized O(1)
            last_cap = b.cap;
            growths++;
        }
    }
    assert_int_equal(b.len, 100000);
    assert_true(growths < 20);
    for (size_t i = 0; i < b.len; i++) assert_int_equal(b.data[i], 'a' + i % 26);
    assert_int_equal(b.data[b.len], 0); // always a C string
    ms_buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
}

static void an_empty_append_allocates_an_empty_string(void **state)
{
    (void)state;
    struct ms_buf b = {0};
    assert_int_equal(ms_buf_append(&b, NULL, 0), 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    ms_buf_free(&b);
}

static void sizes_that_overflow_are_refused_unchanged(void **state)
{
    (void)state;
    struct ms_buf b = {0};
    assert_int_equal(ms_buf_append(&b, "xy", 2), 0);
    char *data = b.data;
    size_t cap = b.cap;
    // len + n wraps around: refused before anything is read from p or allocated.
    assert_int_equal(ms_buf_append(&b, "", SIZE_MAX), MS_ETOOLONG);
    assert_int_equal(ms_buf_append(&b, "", SIZE_MAX - 2), MS_ETOOLONG); // only the NUL wraps
    assert_int_equal(ms_buf_reserve(&b, SIZE_MAX - 1), MS_ETOOLONG);
    assert_ptr_equal(b.data, data);
    assert_int_equal(b.cap, cap);
    assert_int_equal(b.len, 2);
    assert_string_equal(b.data, "xy");
    ms_buf_free(&b);
}

static void the_cap_bounds_length_and_allocation(void **state)
{
    (void)state;
    struct ms_buf b = {.max = 1000};
    char chunk[300];
    memset(chunk, 'z', sizeof chunk);
    assert_int_equal(ms_buf_append(&b, chunk, 300), 0);
    assert_int_equal(ms_buf_append(&b, chunk, 300), 0);
    assert_int_equal(ms_buf_append(&b, chunk, 300), 0);
    assert_int_equal(ms_buf_append(&b, chunk, 300), MS_ETOOLONG); // 1200 > 1000
    assert_int_equal(b.len, 900);
    assert_int_equal(ms_buf_append(&b, chunk, 100), 0);        // exactly the cap
    assert_int_equal(b.len, 1000);
    assert_true(b.cap <= 1001);                                 // never allocates past max + NUL
    assert_int_equal(ms_buf_append(&b, chunk, 1), MS_ETOOLONG);
    assert_int_equal(ms_buf_append(&b, chunk, 0), 0);           // nothing more is still fine
    assert_int_equal(ms_buf_append_fmt(&b, "%d", 7), MS_ETOOLONG);
    assert_int_equal(b.len, 1000);
    assert_int_equal(b.data[1000], 0);
    ms_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.max, 1000);
    assert_int_equal(ms_buf_append(&b, chunk, 300), 0);
    ms_buf_free(&b);
}

static void formatting_works_at_any_length(void **state)
{
    (void)state;
    struct ms_buf b = {0};
    assert_int_equal(ms_buf_append_fmt(&b, "%s=%d", "n", 42), 0);
    assert_string_equal(b.data, "n=42");
    // Longer than what is left: the buffer grows and the text is formatted again.
    char big[5000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(ms_buf_append_fmt(&b, "[%s]", big), 0);
    assert_int_equal(b.len, 4 + 1 + 4999 + 1);
    assert_memory_equal(b.data, "n=42[qqq", 8);
    assert_int_equal(b.data[b.len - 1], ']');
    assert_int_equal(b.data[b.len], 0);
    assert_int_equal(ms_buf_append_fmt(&b, "%s", ""), 0);
    assert_int_equal(b.len, 4 + 1 + 4999 + 1);
    // A capped buffer refuses text past the cap and keeps what it had.
    struct ms_buf c = {.max = 8};
    assert_int_equal(ms_buf_append_fmt(&c, "%s", "12345"), 0);
    assert_int_equal(ms_buf_append_fmt(&c, "%s", "6789"), MS_ETOOLONG);
    assert_string_equal(c.data, "12345");
    assert_int_equal(ms_buf_append_fmt(&c, "%d", 678), 0);
    assert_string_equal(c.data, "12345678");
    ms_buf_free(&c);
    ms_buf_free(&b);
}

static void drop_front_reset_and_steal(void **state)
{
    (void)state;
    struct ms_buf b = {0};
    assert_int_equal(ms_buf_append(&b, "hello world", 11), 0);
    ms_buf_drop_front(&b, 6);
    assert_string_equal(b.data, "world");
    assert_int_equal(b.len, 5);
    ms_buf_drop_front(&b, 99);
    assert_string_equal(b.data, "");
    assert_int_equal(ms_buf_append(&b, "abc", 3), 0);
    size_t len = 0;
    char *s = ms_buf_steal(&b, &len);
    assert_string_equal(s, "abc");
    assert_int_equal(len, 3);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    free(s);
    // Stealing from a buffer that never held anything still gives a string.
    s = ms_buf_steal(&b, &len);
    assert_non_null(s);
    assert_string_equal(s, "");
    assert_int_equal(len, 0);
    free(s);
}

// An allocator like the Jinja renderer's: blocks from a fixed pool, never
// freed one by one; it runs dry after `left` bytes.
struct pool {
    char mem[4096];
    size_t used, left;
    int grows, releases;
};

static void *pool_grow(void *ctx, void *old, size_t len, size_t new_cap)
{
    struct pool *p = ctx;
    p->grows++;
    if (new_cap > p->left || new_cap > sizeof p->mem - p->used) return NULL;
    char *n = p->mem + p->used;
    p->used += new_cap;
    p->left -= new_cap;
    if (len) memcpy(n, old, len);
    return n;
}

static void pool_release(void *ctx, void *block)
{
    (void)block;
    ((struct pool *)ctx)->releases++;
}

static void an_allocator_supplies_the_memory_and_its_failure_is_reported(void **state)
{
    (void)state;
    struct pool p = {.left = 256 + 512};
    struct ms_buf_alloc a = {pool_grow, pool_release, &p};
    struct ms_buf b = {.alloc = &a};
    char chunk[300];
    memset(chunk, 'k', sizeof chunk);
    assert_int_equal(ms_buf_append(&b, chunk, 200), 0); // 256 from the pool
    assert_true(b.data >= p.mem && b.data < p.mem + sizeof p.mem);
    assert_int_equal(ms_buf_append(&b, chunk, 200), 0); // 512: the first 200 bytes were copied
    assert_int_equal(p.grows, 2);
    for (size_t i = 0; i < 400; i++) assert_int_equal(b.data[i], 'k');
    char *before = b.data;
    assert_int_equal(ms_buf_append(&b, chunk, 200), MS_ENOMEM); // the pool is dry
    assert_ptr_equal(b.data, before);
    assert_int_equal(b.len, 400);
    assert_int_equal(b.data[400], 0);
    ms_buf_free(&b);
    assert_int_equal(p.releases, 1);
    assert_null(b.data);
    assert_ptr_equal(b.alloc, &a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(appends_grow_and_keep_every_byte),
        cmocka_unit_test(an_empty_append_allocates_an_empty_string),
        cmocka_unit_test(sizes_that_overflow_are_refused_unchanged),
        cmocka_unit_test(the_cap_bounds_length_and_allocation),
        cmocka_unit_test(formatting_works_at_any_length),
        cmocka_unit_test(drop_front_reset_and_steal),
        cmocka_unit_test(an_allocator_supplies_the_memory_and_its_failure_is_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
