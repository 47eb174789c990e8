// Pins the shared UTF-8 codec: every code point round-trips, and malformed
// bytes (overlong forms, surrogates, past U+10FFFF, truncated and stray
// continuation bytes) are refused by validation and decode as U+FFFD.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/utf8.h"

static void every_scalar_value_round_trips(void **state)
{
    (void)state;
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        uint8_t b[4];
        size_t n = utf8_encode(cp, b);
        assert_int_equal(n, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
        assert_int_equal(utf8_valid_prefix(b, n), n);
        uint32_t back;
        assert_int_equal(utf8_decode(b, n, &back), n);
        assert_int_equal(back, cp);
    }
}

struct bad {
    const char *what;
    const char *bytes;
    size_t valid; // how much of it utf8_valid_prefix accepts
};

static void malformed_sequences_are_refused_and_replaced(void **state)
{
    (void)state;
    static const struct bad cases[] = {
        {"overlong NUL", "\xc0\x80", 0},
        {"overlong slash", "a\xc1\xaf", 1},
        {"overlong 3-byte", "\xe0\x80\xaf", 0},
        {"overlong 4-byte", "\xf0\x8f\xbf\xbf", 0},
        {"surrogate", "ab\xed\xa0\x80", 2},
        {"past U+10FFFF", "\xf4\x90\x80\x80", 0},
        {"lead byte F5", "\xf5\x80\x80\x80", 0},
        {"lone continuation", "x\x80y", 1},
        {"truncated 2-byte", "\xc3", 0},
        {"truncated 3-byte", "\xe2\x82", 0},
        {"truncated 4-byte", "ok\xf0\x9f\x98", 2},
        {"bad continuation", "\xe2\x28\xa1", 0},
        {"FF byte", "\xff", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint8_t *s = (const uint8_t *)cases[i].bytes;
        size_t n = strlen(cases[i].bytes);
        if (utf8_valid_prefix(s, n) != cases[i].valid) fail_msg("%s: wrong valid prefix", cases[i].what);
        uint32_t cp;
        size_t used = utf8_decode(s + cases[i].valid, n - cases[i].valid, &cp);
        if (used != 1 || cp != UTF8_REPLACEMENT) fail_msg("%s: not replaced", cases[i].what);
    }
}

static void decode_never_reads_past_the_end(void **state)
{
    (void)state;
    // A 4-byte lead with only one byte available: one byte used, U+FFFD.
    uint8_t b[4] = {0xf0, 0x9f, 0x98, 0x80};
    uint32_t cp;
    assert_int_equal(utf8_decode(b, 1, &cp), 1);
    assert_int_equal(cp, UTF8_REPLACEMENT);
    assert_int_equal(utf8_decode(b, 4, &cp), 4);
    assert_int_equal(cp, 0x1f600);
    // Walking arbitrary bytes always advances.
    uint8_t junk[256];
    for (int i = 0; i < 256; i++) junk[i] = (uint8_t)(255 - i);
    size_t i = 0, steps = 0;
    while (i < sizeof junk) {
        size_t k = utf8_decode(junk + i, sizeof junk - i, &cp);
        assert_true(k >= 1 && i + k <= sizeof junk);
        i += k;
        steps++;
    }
    assert_true(steps <= sizeof junk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_scalar_value_round_trips),
        cmocka_unit_test(malformed_sequences_are_refused_and_replaced),
        cmocka_unit_test(decode_never_reads_past_the_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
