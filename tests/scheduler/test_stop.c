// Pins the stop conditions: token stops, length limits, and stop strings
// that never reach the output, never cut a character, and are found when
// split across chunks (tokens).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "scheduler/stop.h"

struct collected {
    char text[4096];
    size_t len;
};

static void init_strs(struct stop_state *s, const char *const *strs, int n)
{
    struct engine_request r;
    engine_request_default(&r);
    r.stop.max_tokens = 100;
    r.stop.stop_strs = strs;
    r.stop.n_stop_strs = n;
    char err[256] = "";
    int rc = stop_init(s, &r.stop, NULL, 0, err, sizeof err);
    if (rc) fail_msg("%s", err);
}

// Feeds pieces; returns the matched index (or -1) and collects the output.
static int feed_all(struct stop_state *s, const char *const *pieces, int n, struct collected *c)
{
    c->len = 0;
    for (int i = 0; i < n; i++) {
        const char *out;
        size_t out_len;
        int m;
        assert_int_equal(stop_feed_text(s, pieces[i], strlen(pieces[i]), &m, &out, &out_len), 0);
        memcpy(c->text + c->len, out, out_len);
        c->len += out_len;
        if (m >= 0) {
            c->text[c->len] = 0;
            return m;
        }
    }
    const char *out;
    size_t out_len;
    stop_flush(s, &out, &out_len);
    memcpy(c->text + c->len, out, out_len);
    c->len += out_len;
    c->text[c->len] = 0;
    return -1;
}

static void a_stop_string_inside_one_chunk_cuts_the_output_before_it(void **state)
{
    (void)state;
    const char *strs[] = {"END"};
    struct stop_state s;
    init_strs(&s, strs, 1);
    struct collected c;
    const char *pieces[] = {"hello ", "worldEND and more"};
    assert_int_equal(feed_all(&s, pieces, 2, &c), 0);
    assert_string_equal(c.text, "hello world");
    stop_free(&s);
}

// vLLM's include_stop_str_in_output: the text is cut after the stop
// string instead of before it, also when the string came in pieces.
static void include_stop_str_keeps_the_string_and_cuts_after_it(void **state)
{
    (void)state;
    const char *strs[] = {"</answer>", "END"};
    struct engine_request r;
    engine_request_default(&r);
    r.stop.max_tokens = 100;
    r.stop.stop_strs = strs;
    r.stop.n_stop_strs = 2;
    r.stop.include_stop_str = true;
    struct stop_state s;
    char err[256] = "";
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), 0);
    struct collected c;
    const char *pieces[] = {"42 <", "/ans", "wer>tail END"};
    assert_int_equal(feed_all(&s, pieces, 3, &c), 0);
    assert_string_equal(c.text, "42 </answer>");
    stop_free(&s);
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), 0);
    const char *whole[] = {"hello ", "worldEND and more"};
    assert_int_equal(feed_all(&s, whole, 2, &c), 1);
    assert_string_equal(c.text, "hello worldEND");
    stop_free(&s);
}

static void a_stop_string_split_across_chunks_is_held_back_then_dropped(void **state)
{
    (void)state;
    const char *strs[] = {"</answer>"};
    struct stop_state s;
    init_strs(&s, strs, 1);
    const char *out;
    size_t n;
    int m;
    assert_int_equal(stop_feed_text(&s, "42 <", 4, &m, &out, &n), 0);
    assert_int_equal(m, -1);
    assert_int_equal(n, 3); // "42 " released, "<" held
    assert_memory_equal(out, "42 ", 3);
    assert_int_equal(stop_feed_text(&s, "/ans", 4, &m, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(stop_feed_text(&s, "wer", 3, &m, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(stop_feed_text(&s, ">tail", 5, &m, &out, &n), 0);
    assert_int_equal(m, 0);
    assert_int_equal(n, 0);
    stop_free(&s);
}

static void a_held_tail_that_does_not_become_a_stop_string_is_released(void **state)
{
    (void)state;
    const char *strs[] = {"abc"};
    struct stop_state s;
    init_strs(&s, strs, 1);
    const char *out;
    size_t n;
    int m;
    assert_int_equal(stop_feed_text(&s, "xab", 3, &m, &out, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(stop_feed_text(&s, "d", 1, &m, &out, &n), 0);
    assert_int_equal(m, -1);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "abd", 3);
    // And at the end of the sequence a held tail comes out through flush.
    assert_int_equal(stop_feed_text(&s, "zzab", 4, &m, &out, &n), 0);
    assert_int_equal(n, 2);
    stop_flush(&s, &out, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(out, "ab", 2);
    stop_free(&s);
    // Within min_tokens text passes unmatched, its tail held as ever; after
    // it a string that began there and ends in new text is found.
    init_strs(&s, strs, 1);
    assert_int_equal(stop_feed_text(&s, "xab", 3, &m, &out, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(stop_pass_text(&s, "cabcab", 6, &out, &n), 0);
    assert_int_equal(n, 6);
    assert_memory_equal(out, "abcabc", 6);
    assert_int_equal(stop_feed_text(&s, "c!abc", 5, &m, &out, &n), 0);
    assert_int_equal(m, 0);
    assert_int_equal(n, 0);
    stop_free(&s);
    // Not found in passed text alone: the first match ends in later text.
    init_strs(&s, strs, 1);
    assert_int_equal(stop_pass_text(&s, "abc", 3, &out, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(stop_feed_text(&s, "!abc", 4, &m, &out, &n), 0);
    assert_int_equal(m, 0);
    assert_int_equal(n, 1);
    assert_memory_equal(out, "!", 1);
    stop_free(&s);
}

static void the_stop_string_completing_first_wins(void **state)
{
    (void)state;
    const char *strs[] = {"world", "o w", "lo w"};
    struct stop_state s;
    init_strs(&s, strs, 3);
    struct collected c;
    const char *pieces[] = {"hel", "lo world"};
    // "o w" and "lo w" both end at byte 7, before "world": the longer decides.
    assert_int_equal(feed_all(&s, pieces, 2, &c), 2);
    assert_string_equal(c.text, "hel");
    stop_free(&s);
    // A longer stop string that started earlier but completes later loses,
    // however the text is chunked.
    const char *strs2[] = {"abcd", "bc"};
    const char *one[] = {"xabcd"};
    const char *split[] = {"xa", "bc", "d"};
    init_strs(&s, strs2, 2);
    assert_int_equal(feed_all(&s, one, 1, &c), 1);
    assert_string_equal(c.text, "xa");
    stop_free(&s);
    init_strs(&s, strs2, 2);
    assert_int_equal(feed_all(&s, split, 3, &c), 1);
    assert_string_equal(c.text, "xa");
    stop_free(&s);
}

static void held_back_text_never_cuts_a_character(void **state)
{
    (void)state;
    // U+00E9 then '!' as a stop string: "caf" can go out, the 2-byte "é" waits.
    const char *strs[] = {"\xc3\xa9!"};
    struct stop_state s;
    init_strs(&s, strs, 1);
    const char *out;
    size_t n;
    int m;
    assert_int_equal(stop_feed_text(&s, "caf\xc3\xa9", 5, &m, &out, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(stop_feed_text(&s, "s", 1, &m, &out, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xc3\xa9s", 3);
    assert_int_equal(stop_feed_text(&s, "\xc3\xa9", 2, &m, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(stop_feed_text(&s, "!", 1, &m, &out, &n), 0);
    assert_int_equal(m, 0);
    assert_int_equal(n, 0);
    stop_free(&s);
}

static void bad_stop_conditions_are_refused_with_a_reason(void **state)
{
    (void)state;
    struct engine_request r;
    engine_request_default(&r);
    struct stop_state s;
    char err[256];
    r.stop.max_tokens = 0;
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "max_tokens"));
    r.stop.max_tokens = 5;
    const char *empty[] = {""};
    r.stop.stop_strs = empty;
    r.stop.n_stop_strs = 1;
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "empty"));
    const char *bad[] = {"ok", "\xc3("};
    r.stop.stop_strs = bad;
    r.stop.n_stop_strs = 2;
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "UTF-8"));
    char *longs = malloc(STOP_MAX_STRING_BYTES + 2);
    memset(longs, 'a', STOP_MAX_STRING_BYTES + 1);
    longs[STOP_MAX_STRING_BYTES + 1] = 0;
    const char *lp[] = {longs};
    r.stop.stop_strs = lp;
    r.stop.n_stop_strs = 1;
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), MS_EINVAL);
    free(longs);
    r.stop.n_stop_strs = 0;
    int32_t neg[] = {-3};
    r.stop.stop_ids = neg;
    r.stop.n_stop_ids = 1;
    assert_int_equal(stop_init(&s, &r.stop, NULL, 0, err, sizeof err), MS_EINVAL);
    assert_false(stop_utf8_valid("\xed\xa0\x80", 3)); // a surrogate
    assert_false(stop_utf8_valid("\xc0\xaf", 2));     // overlong
    assert_false(stop_utf8_valid("\xf4\x90\x80\x80", 4));
    assert_true(stop_utf8_valid("\xf0\x9f\x98\x80", 4));
}

static void token_stops_and_length_limits(void **state)
{
    (void)state;
    struct engine_request r;
    engine_request_default(&r);
    r.stop.max_tokens = 3;
    int32_t ids[] = {77};
    r.stop.stop_ids = ids;
    r.stop.n_stop_ids = 1;
    int eos[] = {5, 6};
    struct stop_state s;
    char err[256];
    int32_t sid;
    assert_int_equal(stop_init(&s, &r.stop, eos, 2, err, sizeof err), 0);
    assert_int_equal(stop_check_token(&s, 5, 1, 10, 100, &sid), FINISH_STOP);
    assert_int_equal(sid, -1); // the model's eos is no stop_token_ids entry
    // generation_config's other eos ids stop as vLLM's stop_token_ids do, by name
    assert_int_equal(stop_check_token(&s, 6, 1, 10, 100, &sid), FINISH_STOP);
    assert_int_equal(sid, 6);
    assert_int_equal(stop_check_token(&s, 77, 1, 10, 100, &sid), FINISH_STOP);
    assert_int_equal(sid, 77);
    assert_int_equal(stop_check_token(&s, 1, 2, 10, 100, &sid), FINISH_NONE);
    assert_int_equal(sid, -1);
    assert_int_equal(stop_check_token(&s, 1, 3, 10, 100, &sid), FINISH_LENGTH);
    assert_int_equal(stop_check_token(&s, 1, 1, 100, 100, &sid), FINISH_LENGTH);
    // A stop token on the last allowed step is still a stop.
    assert_int_equal(stop_check_token(&s, 5, 3, 10, 100, &sid), FINISH_STOP);
    stop_free(&s);
    r.stop.ignore_eos = true;
    assert_int_equal(stop_init(&s, &r.stop, eos, 2, err, sizeof err), 0);
    assert_int_equal(stop_check_token(&s, 5, 1, 10, 100, &sid), FINISH_NONE);
    assert_int_equal(stop_check_token(&s, 77, 1, 10, 100, &sid), FINISH_STOP);
    stop_free(&s);
    // The request lists the model's eos too: still the model's end (null),
    // as vLLM checks the eos before stop_token_ids; ignoring eos, its own.
    int32_t with_eos[] = {77, 5};
    r.stop.stop_ids = with_eos;
    r.stop.n_stop_ids = 2;
    r.stop.ignore_eos = false;
    assert_int_equal(stop_init(&s, &r.stop, eos, 2, err, sizeof err), 0);
    assert_int_equal(stop_check_token(&s, 5, 1, 10, 100, &sid), FINISH_STOP);
    assert_int_equal(sid, -1);
    assert_int_equal(stop_check_token(&s, 77, 1, 10, 100, &sid), FINISH_STOP);
    assert_int_equal(sid, 77);
    stop_free(&s);
    r.stop.ignore_eos = true;
    assert_int_equal(stop_init(&s, &r.stop, eos, 2, err, sizeof err), 0);
    assert_int_equal(stop_check_token(&s, 5, 1, 10, 100, &sid), FINISH_STOP);
    assert_int_equal(sid, 5);
    stop_free(&s);
}

// Random texts over an alphabet with 1-4 byte characters, cut into random
// chunks at character boundaries, against random stop strings: the output is
// exactly the text up to the earliest stop string, and every piece released
// ends on a character boundary.
static void random_texts_and_chunkings_match_the_reference_cut(void **state)
{
    (void)state;
    static const char *alpha[] = {"a", "b", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", " "};
    uint64_t rng = 99;
#define NEXT() (rng = rng * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(rng >> 33))
    for (int iter = 0; iter < 3000; iter++) {
        char text[512];
        size_t tlen = 0;
        size_t bounds[200];
        int n_chars = 1 + NEXT() % 60;
        for (int i = 0; i < n_chars; i++) {
            const char *ch = alpha[NEXT() % 6];
            memcpy(text + tlen, ch, strlen(ch));
            tlen += strlen(ch);
            bounds[i] = tlen;
        }
        text[tlen] = 0;
        char sbuf[4][64];
        const char *strs[4];
        int n_strs = 1 + NEXT() % 4;
        for (int k = 0; k < n_strs; k++) {
            size_t l = 0;
            int nc = 1 + NEXT() % 3;
            for (int i = 0; i < nc; i++) {
                const char *ch = alpha[NEXT() % 6];
                memcpy(sbuf[k] + l, ch, strlen(ch));
                l += strlen(ch);
            }
            sbuf[k][l] = 0;
            strs[k] = sbuf[k];
        }
        // Reference: the occurrence that completes first (longest on ties).
        size_t cut = tlen, cut_end = SIZE_MAX;
        for (int k = 0; k < n_strs; k++) {
            const char *p = strstr(text, strs[k]);
            if (!p) continue;
            size_t at = (size_t)(p - text), end = at + strlen(strs[k]);
            if (end < cut_end || (end == cut_end && at < cut)) {
                cut = at;
                cut_end = end;
            }
        }
        struct stop_state s;
        init_strs(&s, strs, n_strs);
        char got[512];
        size_t glen = 0, fed = 0;
        int matched = -1;
        int ci = 0;
        while (fed < tlen && matched < 0) {
            int step = 1 + NEXT() % 4;
            ci = ci + step < n_chars ? ci + step : n_chars;
            size_t end = bounds[ci - 1];
            const char *out;
            size_t n;
            assert_int_equal(stop_feed_text(&s, text + fed, end - fed, &matched, &out, &n), 0);
            fed = end;
            memcpy(got + glen, out, n);
            glen += n;
            // Released text stays a prefix of the answer and ends on a boundary.
            assert_true(glen <= cut);
            assert_memory_equal(got, text, glen);
            assert_true(glen == 0 || glen == tlen || ((unsigned char)text[glen] & 0xc0) != 0x80);
        }
        if (matched < 0) {
            const char *out;
            size_t n;
            stop_flush(&s, &out, &n);
            memcpy(got + glen, out, n);
            glen += n;
        }
        assert_int_equal(glen, cut);
        assert_memory_equal(got, text, cut);
        assert_int_equal(matched >= 0, cut < tlen);
        stop_free(&s);
    }
#undef NEXT
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_stop_string_inside_one_chunk_cuts_the_output_before_it),
        cmocka_unit_test(a_stop_string_split_across_chunks_is_held_back_then_dropped),
        cmocka_unit_test(include_stop_str_keeps_the_string_and_cuts_after_it),
        cmocka_unit_test(a_held_tail_that_does_not_become_a_stop_string_is_released),
        cmocka_unit_test(the_stop_string_completing_first_wins),
        cmocka_unit_test(held_back_text_never_cuts_a_character),
        cmocka_unit_test(bad_stop_conditions_are_refused_with_a_reason),
        cmocka_unit_test(token_stops_and_length_limits),
        cmocka_unit_test(random_texts_and_chunkings_match_the_reference_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
