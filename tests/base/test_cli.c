// Pins command-line number parsing: whole values in range are taken; empty
// text, trailing junk, signs where none belong, overflow and values out of
// range are refused, all with the one sentence `FLAG must be WHAT, not "VALUE"`.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "base/cli.h"

static char err[256];

static void integers_in_range_are_read(void **state)
{
    (void)state;
    int64_t v = 0;
    assert_int_equal(cli_parse_int("--port", "8000", 0, 65535, &v, err, sizeof err), 0);
    assert_int_equal(v, 8000);
    assert_int_equal(cli_parse_int("--port", "0", 0, 65535, &v, err, sizeof err), 0);
    assert_int_equal(v, 0);
    assert_int_equal(cli_parse_int("--port", "65535", 0, 65535, &v, err, sizeof err), 0);
    assert_int_equal(v, 65535);
    assert_int_equal(cli_parse_int("--top-k", "-1", -1, 100, &v, err, sizeof err), 0);
    assert_int_equal(v, -1);
    assert_int_equal(cli_parse_int("--n", "9223372036854775807", 0, INT64_MAX, &v, err, sizeof err), 0);
    assert_true(v == INT64_MAX);
}

static void malformed_integers_are_refused_with_the_one_sentence(void **state)
{
    (void)state;
    const char *bad[] = {"", "abc", "12abc", "12 ", "1.5", "0x10", "65536", "-1",
                         "99999999999999999999", "-99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 42;
        assert_int_equal(cli_parse_int("--port", bad[i], 0, 65535, &v, err, sizeof err), MS_EINVAL);
        assert_int_equal(v, 42); // untouched
        char want[128];
        snprintf(want, sizeof want, "--port must be a whole number from 0 to 65535, not \"%s\"", bad[i]);
        assert_string_equal(err, want);
    }
    int64_t v;
    assert_int_equal(cli_parse_int("--n", "x", 1, INT64_MAX, &v, err, sizeof err), MS_EINVAL);
    assert_string_equal(err, "--n must be a whole number >= 1, not \"x\"");
}

static void seeds_take_all_64_bits_and_no_sign(void **state)
{
    (void)state;
    uint64_t v = 0;
    assert_int_equal(cli_parse_u64("--seed", "18446744073709551615", &v, err, sizeof err), 0);
    assert_true(v == UINT64_MAX);
    assert_int_equal(cli_parse_u64("--seed", "0", &v, err, sizeof err), 0);
    assert_true(v == 0);
    const char *bad[] = {"", "-1", " -1", "18446744073709551616", "7x", "1e3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 5;
        assert_int_equal(cli_parse_u64("--seed", bad[i], &v, err, sizeof err), MS_EINVAL);
        assert_true(v == 5);
        assert_non_null(strstr(err, "--seed must be a whole number from 0 to 18446744073709551615"));
    }
}

static void numbers_in_range_are_read_and_nan_never(void **state)
{
    (void)state;
    double d = 0;
    assert_int_equal(cli_parse_double("--temperature", "0.7", 0, 2, &d, err, sizeof err), 0);
    assert_true(d == 0.7);
    assert_int_equal(cli_parse_double("--temperature", "2", 0, 2, &d, err, sizeof err), 0);
    assert_int_equal(cli_parse_double("--timeout", "inf", 0, INFINITY, &d, err, sizeof err), 0);
    assert_true(isinf(d));
    const char *bad[] = {"", "x", "0.5s", "nan", "-0.1", "2.0001", "1e999", "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d = 9;
        assert_int_equal(cli_parse_double("--temperature", bad[i], 0, 2, &d, err, sizeof err), MS_EINVAL);
        assert_true(d == 9);
        char want[128];
        snprintf(want, sizeof want, "--temperature must be a number from 0 to 2, not \"%s\"", bad[i]);
        assert_string_equal(err, want);
    }
    assert_int_equal(cli_parse_double("--timeout", "-1", 0, INFINITY, &d, err, sizeof err), MS_EINVAL);
    assert_string_equal(err, "--timeout must be a number >= 0, not \"-1\"");
}

static void counts_read_like_vllm(void **state)
{
    (void)state;
    int64_t v;
    static const struct {
        const char *s;
        int64_t want;
    } good[] = {{"32K", 32768}, {"32k", 32000}, {"25.6k", 25600}, {"1M", 1 << 20}, {"1m", 1000000},
                {"1e3", 1000}, {"7", 7}, {"1G", 1 << 30}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(cli_parse_count("--max-model-len", good[i].s, 1, 1 << 30, &v, err, sizeof err), 0);
        assert_int_equal(v, good[i].want);
    }
    const char *bad[] = {"", "-3", "+3", "1.5", "3GiB", "2.5K1", "abc", "0", "0x10", "inf", "2M"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 11;
        assert_int_equal(cli_parse_count("--max-num-seqs", bad[i], 1, 1000000, &v, err, sizeof err), MS_EINVAL);
        assert_int_equal(v, 11);
        char want[160];
        snprintf(want, sizeof want,
                 "--max-num-seqs must be a whole number from 1 to 1000000 (2K = 2048, 2k = 2000), not \"%s\"",
                 bad[i]);
        assert_string_equal(err, want);
    }
    // A range too small for a suffix to matter does not mention them.
    assert_int_equal(cli_parse_count("--rounds", "9", 1, 8, &v, err, sizeof err), MS_EINVAL);
    assert_string_equal(err, "--rounds must be a whole number from 1 to 8, not \"9\"");
}

static void sizes_read_like_vllm(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        unsigned long long want;
    } good[] = {{"4GiB", 4ull << 30}, {"4G", 4ull << 30}, {"4GB", 4000000000ull}, {"4g", 4000000000ull},
                {"512MiB", 512ull << 20}, {"1e9", 1000000000ull}, {"1.5GiB", 3ull << 29}, {"123", 123},
                {"0", 0}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t b;
        assert_int_equal(cli_parse_bytes("--kv-cache-memory", good[i].s, 0, &b, err, sizeof err), 0);
        assert_true(b == good[i].want);
    }
    const char *bad[] = {"", "-1", "4X", "4GiBs", "0x10", "inf", "nan", "1e400", "GiB", "4 GiB",
                         "99999999999999999999999T"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t b = 3;
        assert_int_equal(cli_parse_bytes("--kv-cache-memory", bad[i], 1, &b, err, sizeof err), MS_EINVAL);
        assert_true(b == 3);
        assert_non_null(strstr(err, "--kv-cache-memory must be a positive size (e.g. 4GiB"));
    }
    size_t b;
    assert_int_equal(cli_parse_bytes("--max-request-body", "1000", 1024, &b, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "--max-request-body must be a size of at least 1024 bytes"));
    assert_non_null(strstr(err, "not \"1000\""));
    assert_int_equal(cli_parse_bytes("--max-request-body", "1KiB", 1024, &b, err, sizeof err), 0);
    assert_int_equal(b, 1024);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(integers_in_range_are_read),
        cmocka_unit_test(malformed_integers_are_refused_with_the_one_sentence),
        cmocka_unit_test(seeds_take_all_64_bits_and_no_sign),
        cmocka_unit_test(numbers_in_range_are_read_and_nan_never),
        cmocka_unit_test(counts_read_like_vllm),
        cmocka_unit_test(sizes_read_like_vllm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
