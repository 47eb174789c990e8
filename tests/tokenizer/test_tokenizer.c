// Pins the tokenizer: the streaming decoder's guarantees on the whole corpus,
// refusal of malformed or unsupported tokenizer files, thread safety of the
// shared cache, long inputs, and the Unicode details the encoder relies on.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "base/base.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "moeserve_build.h"
#include "tests/hostile_json.h"

static struct tokenizer *qwen;
static char **corpus;
static size_t n_corpus;

static char *data_path(const char *name)
{
    const char *dir = getenv("MOESERVE_TEST_DATA");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", dir ? dir : MOESERVE_SOURCE_ROOT "/tests/data", name);
    return buf;
}

static int load_corpus(void)
{
    FILE *f = fopen(data_path("tokenizer_corpus.jsonl"), "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY, NULL);
        if (!json_is_string(v)) return -1;
        corpus = realloc(corpus, (n_corpus + 1) * sizeof *corpus);
        corpus[n_corpus++] = strdup(json_string_value(v));
        json_decref(v);
    }
    free(line);
    fclose(f);
    return n_corpus > 1000 ? 0 : -1;
}

static int group_setup(void **state)
{
    (void)state;
    char err[1024];
    if (tok_load(MOESERVE_TOKENIZER_DIR, &qwen, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", MOESERVE_TOKENIZER_DIR, err);
        return -1;
    }
    return load_corpus();
}

static int group_teardown(void **state)
{
    (void)state;
    tok_destroy(qwen);
    for (size_t i = 0; i < n_corpus; i++) free(corpus[i]);
    free(corpus);
    return 0;
}

// ---- the streaming decoder ----

static bool complete_utf8(const char *s, size_t n)
{
    return utf8_valid_prefix((const uint8_t *)s, n) == n;
}

// Feeds ids one at a time and checks every promise of tok_stream: each
// chunk is whole characters, everything fed so far plus what finish would
// add equals tok_decode of those ids (so a character is out as soon as its
// last byte is in), and the whole equals tok_decode.
static void check_stream(const int32_t *ids, size_t n, bool skip)
{
    char *whole;
    size_t whole_len;
    char err[256];
    assert_int_equal(tok_decode(qwen, ids, n, skip, &whole, &whole_len, err, sizeof err), 0);
    size_t cap = tok_stream_max_output(qwen);
    char *chunk = malloc(cap);
    char *acc = malloc(whole_len + 16);
    assert_non_null(chunk);
    assert_non_null(acc);
    struct tok_stream s;
    tok_stream_init(&s, qwen, skip);
    size_t got = 0;
    for (size_t k = 0; k < n; k++) {
        size_t w;
        assert_int_equal(tok_stream_feed(&s, ids[k], chunk, cap, &w), 0);
        assert_true(complete_utf8(chunk, w));
        assert_true(got + w <= whole_len);
        memcpy(acc + got, chunk, w);
        got += w;
        // What a full decode of the first k+1 ids gives, the stream has
        // given too, but for at most one U+FFFD that finishing would add.
        struct tok_stream copy = s;
        size_t fw;
        char tail[8];
        assert_int_equal(tok_stream_finish(&copy, tail, sizeof tail, &fw), 0);
        char *prefix;
        size_t plen;
        assert_int_equal(tok_decode(qwen, ids, k + 1, skip, &prefix, &plen, err, sizeof err), 0);
        assert_int_equal(plen, got + fw);
        assert_memory_equal(prefix, acc, got);
        if (fw) assert_memory_equal(prefix + got, "\xef\xbf\xbd", 3);
        free(prefix);
    }
    size_t w;
    assert_int_equal(tok_stream_finish(&s, chunk, cap, &w), 0);
    memcpy(acc + got, chunk, w);
    got += w;
    assert_int_equal(got, whole_len);
    assert_memory_equal(acc, whole, whole_len);
    free(chunk);
    free(acc);
    free(whole);
}

static void stream_decoder_equals_decode_on_every_corpus_string(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_corpus; i++) {
        int32_t *ids;
        size_t n;
        char err[256];
        assert_int_equal(tok_encode(qwen, corpus[i], strlen(corpus[i]), &ids, &n, err, sizeof err), 0);
        check_stream(ids, n, false);
        check_stream(ids, n, true);
        free(ids);
    }
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

static void stream_decoder_repairs_broken_utf8_like_decode(void **state)
{
    (void)state;
    // Single-byte tokens (ids below 256 in this vocabulary are all the
    // bytes) make truncated and stray sequences; specials come and go.
    uint32_t seed = 7;
    int32_t ids[40];
    for (int r = 0; r < 3000; r++) {
        size_t n = 1 + lcg(&seed) % 40;
        for (size_t k = 0; k < n; k++) {
            uint32_t x = lcg(&seed) % 10;
            ids[k] = x < 6 ? qwen->byte_id[lcg(&seed) % 256]
                   : x < 8 ? (int32_t)(151643 + lcg(&seed) % 26)
                           : (int32_t)(lcg(&seed) % 151643);
        }
        check_stream(ids, n, r & 1);
    }
}

static void stream_refuses_small_buffers_and_bad_ids_without_changing_state(void **state)
{
    (void)state;
    struct tok_stream s;
    tok_stream_init(&s, qwen, false);
    char out[256];
    size_t w = 99;
    int32_t e4 = qwen->byte_id[0xe4], bd = qwen->byte_id[0xbd], a0 = qwen->byte_id[0xa0];
    assert_int_equal(tok_stream_feed(&s, e4, out, sizeof out, &w), 0);
    assert_int_equal(w, 0); // the first byte of 你 waits
    assert_int_equal(tok_stream_feed(&s, -1, out, sizeof out, &w), MS_EINVAL);
    assert_int_equal(tok_stream_feed(&s, tok_vocab_size(qwen), out, sizeof out, &w), MS_EINVAL);
    assert_int_equal(tok_stream_feed(&s, bd, out, 1, &w), 0); // still incomplete: fits in 1
    assert_int_equal(w, 0);
    assert_int_equal(tok_stream_feed(&s, a0, out, 2, &w), MS_EINVAL); // 3 bytes do not fit in 2
    assert_int_equal(tok_stream_feed(&s, a0, out, 3, &w), 0);
    assert_int_equal(w, 3);
    assert_memory_equal(out, "\xe4\xbd\xa0", 3);
    assert_true(tok_stream_max_output(qwen) >= 3 * (qwen->max_token_bytes + 3));
    // The longest token (128 bytes of valid text) fits in its length + 3,
    // the size the engine gives; broken bytes need room for U+FFFD each.
    int32_t longest = -1;
    for (int32_t id = 0; id < tok_vocab_size(qwen); id++)
        if (qwen->bytes_len[id] == qwen->max_token_bytes) longest = id;
    assert_true(longest >= 0);
    char big[512];
    size_t cap = qwen->max_token_bytes + 3;
    tok_stream_init(&s, qwen, false);
    assert_int_equal(tok_stream_feed(&s, longest, big, cap, &w), 0);
    assert_int_equal(w, qwen->max_token_bytes);
    int32_t ff = qwen->byte_id[0xff]; // never valid: 3 bytes out for 1 in
    assert_int_equal(tok_stream_feed(&s, ff, big, 2, &w), MS_EINVAL);
    assert_int_equal(tok_stream_feed(&s, ff, big, 3, &w), 0);
    assert_int_equal(w, 3);
    assert_memory_equal(big, "\xef\xbf\xbd", 3);
}

static void decode_refuses_ids_outside_the_vocabulary(void **state)
{
    (void)state;
    char *text = (char *)1;
    size_t len;
    char err[256];
    int32_t ids[] = {9707, 151669};
    assert_int_equal(tok_decode(qwen, ids, 2, false, &text, &len, err, sizeof err), MS_EINVAL);
    assert_null(text);
    assert_non_null(strstr(err, "151669"));
    int32_t neg[] = {-5};
    assert_int_equal(tok_decode(qwen, neg, 1, false, &text, &len, err, sizeof err), MS_EINVAL);
    assert_int_equal(tok_decode(qwen, NULL, 0, false, &text, &len, err, sizeof err), 0);
    assert_string_equal(text, "");
    free(text);
}

// ---- encoding ----

static void encode_refuses_invalid_utf8(void **state)
{
    (void)state;
    const char *bad[] = {"\xc0\xaf", "a\xe0\x80\xafz", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe4\xbd",
                         "\x80", "ok\xff", "\xf0\x9f\x98"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n;
        char err[256];
        assert_int_equal(tok_encode(qwen, bad[i], strlen(bad[i]), &ids, &n, err, sizeof err), MS_EFORMAT);
        assert_null(ids);
        assert_non_null(strstr(err, "UTF-8"));
    }
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(tok_encode(qwen, "", 0, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_non_null(ids);
    free(ids);
    // A NUL inside the text is a character like any other.
    assert_int_equal(tok_encode(qwen, "a\0b", 3, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    free(ids);
}

static void special_tokens_in_text_are_matched_and_known(void **state)
{
    (void)state;
    int32_t *ids;
    size_t n;
    char err[256];
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    assert_int_equal(tok_encode(qwen, s, strlen(s), &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 151644);
    assert_int_equal(ids[4], 151645);
    free(ids);
    assert_int_equal(tok_find_token(qwen, "<|im_end|>"), 151645);
    assert_int_equal(tok_find_token(qwen, "<think>"), 151667);
    assert_int_equal(tok_find_token(qwen, "Hello"), 9707);
    assert_int_equal(tok_find_token(qwen, "no such token here"), -1);
    assert_true(tok_is_special(qwen, 151645));
    assert_false(tok_is_special(qwen, 151667)); // <think> is added but not special
    assert_false(tok_is_special(qwen, 9707));
    assert_false(tok_is_special(qwen, 1 << 30));
    assert_int_equal(tok_vocab_size(qwen), 151669);
    size_t len;
    const uint8_t *b = tok_token_bytes(qwen, 9707, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(b, "Hello", 5);
    b = tok_token_bytes(qwen, 220, &len); // "Ġ" is a space
    assert_int_equal(len, 1);
    assert_int_equal(b[0], ' ');
    assert_null(tok_token_bytes(qwen, 151669, &len));
    assert_string_equal(tok_eos_token(qwen), "<|im_end|>");
    assert_null(tok_bos_token(qwen));
    assert_non_null(strstr(tok_chat_template(qwen), "<|im_start|>"));
}

struct thread_job {
    size_t start, step;
    int32_t **expect;
    size_t *expect_n;
    int failures;
};

static void *encode_thread(void *arg)
{
    struct thread_job *j = arg;
    for (int rep = 0; rep < 2; rep++)
        for (size_t i = j->start; i < n_corpus; i += j->step) {
            int32_t *ids;
            size_t n;
            char err[256];
            if (tok_encode(qwen, corpus[i], strlen(corpus[i]), &ids, &n, err, sizeof err) ||
                n != j->expect_n[i] || memcmp(ids, j->expect[i], n * sizeof *ids))
                j->failures++;
            free(ids);
        }
    return NULL;
}

static void threads_sharing_one_tokenizer_get_the_same_ids(void **state)
{
    (void)state;
    int32_t **expect = calloc(n_corpus, sizeof *expect);
    size_t *expect_n = calloc(n_corpus, sizeof *expect_n);
    tok_set_cache(qwen, false);
    for (size_t i = 0; i < n_corpus; i++) {
        char err[256];
        assert_int_equal(tok_encode(qwen, corpus[i], strlen(corpus[i]), &expect[i], &expect_n[i], err,
                                    sizeof err), 0);
    }
    tok_set_cache(qwen, true); // the threads fill and read it together
    enum { N = 6 };
    pthread_t th[N];
    struct thread_job jobs[N];
    for (int k = 0; k < N; k++) {
        // Overlapping slices: every string is encoded by two threads at once.
        jobs[k] = (struct thread_job){(size_t)k / 2, N / 2, expect, expect_n, 0};
        assert_int_equal(pthread_create(&th[k], NULL, encode_thread, &jobs[k]), 0);
    }
    for (int k = 0; k < N; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(jobs[k].failures, 0);
    }
    for (size_t i = 0; i < n_corpus; i++) free(expect[i]);
    free(expect);
    free(expect_n);
}

static void long_runs_encode_and_round_trip(void **state)
{
    (void)state;
    // One pre-token of two million letters: the merge loop must not be quadratic.
    const char *units[] = {"a", " ", "\xe4\xb8\xad" /* 中 */, "ab", "\n"};
    size_t counts[] = {2000000, 1000000, 300000, 500000, 500000};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t ul = strlen(units[u]), n = counts[u] * ul;
        char *s = malloc(n + 1);
        for (size_t i = 0; i < counts[u]; i++) memcpy(s + i * ul, units[u], ul);
        s[n] = 0;
        int32_t *ids;
        size_t n_ids;
        char err[256];
        assert_int_equal(tok_encode(qwen, s, n, &ids, &n_ids, err, sizeof err), 0);
        assert_true(n_ids > 0 && n_ids < n);
        char *back;
        size_t blen;
        assert_int_equal(tok_decode(qwen, ids, n_ids, false, &back, &blen, err, sizeof err), 0);
        assert_int_equal(blen, n);
        assert_memory_equal(back, s, n);
        free(back);
        free(ids);
        free(s);
    }
}

// ---- Unicode details ----

// NFC_QC=Maybe code points with combining class 0 (DerivedNormalizationProps):
// characters that may compose with what precedes them.
static const uint32_t maybe_ccc0[][2] = {
    {0x09be, 0x09be}, {0x09d7, 0x09d7}, {0x0b3e, 0x0b3e}, {0x0b56, 0x0b57}, {0x0bbe, 0x0bbe},
    {0x0bd7, 0x0bd7}, {0x0cc2, 0x0cc2}, {0x0cd5, 0x0cd6}, {0x0d3e, 0x0d3e}, {0x0d57, 0x0d57},
    {0x0dcf, 0x0dcf}, {0x0ddf, 0x0ddf}, {0x102e, 0x102e}, {0x1161, 0x1175}, {0x11a8, 0x11c2},
    {0x1b35, 0x1b35}, {0x3099, 0x309a},
};
bool tok_nfc_inert(uint32_t cp);

static void nfc_fast_path_skips_only_characters_nfc_never_touches(void **state)
{
    (void)state;
    size_t inert = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        if (!tok_nfc_inert(cp)) continue;
        inert++;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        assert_int_equal(p->combining_class, 0);
        for (size_t k = 0; k < sizeof maybe_ccc0 / sizeof maybe_ccc0[0]; k++)
            assert_false(cp >= maybe_ccc0[k][0] && cp <= maybe_ccc0[k][1]);
        uint8_t u[4];
        int l = (int)utf8_encode(cp, u);
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t r = utf8proc_map(u, l, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert_int_equal(r, l);
        assert_memory_equal(nfc, u, (size_t)l);
        free(nfc);
    }
    assert_true(inert > 40000);
}

// utf8proc_map's normalization of s by kind, the reference (quadratic on
// long runs of marks of mixed classes; fine at these sizes).
static void utf8proc_reference(enum tok_norm kind, const uint8_t *s, size_t n, utf8proc_uint8_t **out, size_t *len)
{
    const int opt = UTF8PROC_STABLE | (kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                    (kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD ? UTF8PROC_COMPAT : 0);
    utf8proc_ssize_t r = utf8proc_map(s, (utf8proc_ssize_t)n, out, (utf8proc_option_t)opt);
    assert_true(r >= 0);
    *len = (size_t)r;
}

// The normalizers give utf8proc_map's bytes (its canonical ordering done in
// linear time instead): random strings of letters, precomposed and
// compatibility characters, Hangul, and combining marks of mixed classes,
// in all four forms; then one long run of alternating marks (classes 220
// and 230), the input that took utf8proc_map quadratic time.
static void normalization_matches_utf8proc_in_every_form(void **state)
{
    (void)state;
    const uint32_t alpha[] = {'a', 'e', 'A', ' ', 0xe9, 0xc5, 0x212b, 0x1e0b, 0x0323, 0x0307, 0x0301, 0x0316,
                              0x0300, 0x0327, 0x0345, 0x05b0, 0x0e38, 0x302a, 0xac00, 0xd4db, 0x1100, 0x1161,
                              0x11a8, 0xfb01, 0x2460, 0xff76, 0x3099, 0x304b, 0x00bd, 0x4e2d, 0x1f600, 0x0344};
    const enum tok_norm kinds[] = {TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD};
    uint64_t x = 12345;
    uint8_t buf[4 * 64];
    for (int it = 0; it < 3000; it++) {
        size_t n = 0;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int len = 1 + (int)(x >> 58);
        for (int i = 0; i < len; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            n += utf8_encode(alpha[(x >> 33) % (sizeof alpha / sizeof alpha[0])], buf + n);
        }
        for (int k = 0; k < 4; k++) {
            struct tok_buf got = {0};
            assert_int_equal(tok_normalize(&kinds[k], 1, buf, n, &got), 0);
            utf8proc_uint8_t *want;
            size_t wl;
            utf8proc_reference(kinds[k], buf, n, &want, &wl);
            if (got.len != wl || memcmp(got.p, want, wl)) fail_msg("form %d differs from utf8proc on string %d", k, it);
            free(want);
            free(got.p);
        }
    }
    enum { PAIRS = 3000 };
    uint8_t *big = malloc(1 + 4 * PAIRS);
    size_t n = 0;
    big[n++] = 'a';
    for (int i = 0; i < PAIRS; i++) {
        n += utf8_encode(0x0316, big + n);
        n += utf8_encode(0x0301, big + n);
    }
    for (int k = 0; k < 4; k++) {
        struct tok_buf got = {0};
        assert_int_equal(tok_normalize(&kinds[k], 1, big, n, &got), 0);
        utf8proc_uint8_t *want;
        size_t wl;
        utf8proc_reference(kinds[k], big, n, &want, &wl);
        assert_int_equal(got.len, wl);
        assert_memory_equal(got.p, want, wl);
        free(want);
        free(got.p);
    }
    free(big);
}

static void regexes_read_backslash_s_as_oniguruma_does(void **state)
{
    (void)state;
    struct tok_regex re;
    char err[256];
    assert_int_equal(tok_regex_compile(&re, "\\s+", 3, false, err, sizeof err), 0);
    struct tok_matcher m = {0};
    // U+0085 is White_Space; U+180E and U+FEFF are not (PCRE2's own \s takes U+180E).
    const char *s = "a\xc2\x85" "b\xe1\xa0\x8e" "c\xef\xbb\xbf" "d";
    struct tok_spans out = {0};
    assert_int_equal(tok_split_span(&re, TOK_SPLIT_REMOVED, false, &m, (const uint8_t *)s,
                                    (struct tok_span){0, (uint32_t)strlen(s)}, &out, err, sizeof err), 0);
    assert_int_equal(out.len, 2);
    assert_int_equal(out.p[0].len, 1); // "a"
    assert_int_equal(out.p[1].len, strlen(s) - 3);
    tok_regex_free(&re);
    // \h is a hexadecimal digit, \w takes marks, \W outside a class works, inside is refused.
    assert_int_equal(tok_regex_compile(&re, "\\h+", 3, false, err, sizeof err), 0);
    out.len = 0;
    const char *h = "xx09afAFzz";
    assert_int_equal(tok_split_span(&re, TOK_SPLIT_ISOLATED, true, &m, (const uint8_t *)h,
                                    (struct tok_span){0, 10}, &out, err, sizeof err), 0);
    assert_int_equal(out.len, 3);
    assert_int_equal(out.p[1].off, 2);
    assert_int_equal(out.p[1].len, 6);
    tok_regex_free(&re);
    assert_int_equal(tok_regex_compile(&re, "[\\W]", 4, false, err, sizeof err), MS_EUNSUPPORTED);
    assert_int_equal(tok_regex_compile(&re, "[a-z&&[^c]]", 11, false, err, sizeof err), MS_EUNSUPPORTED);
    assert_int_equal(tok_regex_compile(&re, "(ab", 3, false, err, sizeof err), MS_EFORMAT);
    assert_int_equal(tok_regex_compile(&re, "\\u00e9", 6, false, err, sizeof err), 0);
    tok_regex_free(&re);
    free(out.p);
    tok_matcher_free(&m);
}

static void split_behaviours_follow_the_hugging_face_examples(void **state)
{
    (void)state;
    // tokenizers' documentation: "the-final--countdown" split on '-'.
    const char *s = "the-final--countdown";
    const char *expect[] = {
        "the|final|countdown",        // Removed
        "the|-|final|-|-|countdown",  // Isolated
        "the-|final-|-|countdown",    // MergedWithPrevious
        "the|-final|-|-countdown",    // MergedWithNext
        "the|-|final|--|countdown",   // Contiguous
    };
    struct tok_regex re;
    char err[256];
    assert_int_equal(tok_regex_compile(&re, "-", 1, true, err, sizeof err), 0);
    struct tok_matcher m = {0};
    for (int b = 0; b < 5; b++) {
        struct tok_spans out = {0};
        assert_int_equal(tok_split_span(&re, (enum tok_split_behavior)b, false, &m, (const uint8_t *)s,
                                        (struct tok_span){0, (uint32_t)strlen(s)}, &out, err, sizeof err), 0);
        char joined[64] = "";
        for (size_t i = 0; i < out.len; i++) {
            if (i) strcat(joined, "|");
            strncat(joined, s + out.p[i].off, out.p[i].len);
        }
        assert_string_equal(joined, expect[b]);
        free(out.p);
    }
    tok_regex_free(&re);
    tok_matcher_free(&m);
}

// ---- malformed and unsupported files ----

// A small byte-level BPE tokenizer: the 256 byte tokens, a few merges, two added tokens.
static uint32_t byte_cp[256];
static void alphabet(void)
{
    uint32_t extra = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        byte_cp[b] = printable ? (uint32_t)b : extra++;
    }
}

static json_t *tiny_tokenizer(void)
{
    alphabet();
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        uint8_t u[5] = {0};
        utf8_encode(byte_cp[b], u);
        json_object_set_new(vocab, (char *)u, json_integer(b));
    }
    const char *merged[][3] = {{"h", "e", "he"}, {"l", "l", "ll"}, {"he", "ll", "hell"},
                               {"hell", "o", "hello"}, {"\xc4\xa0", "w", "\xc4\xa0w"}};
    json_t *merges = json_array();
    for (int i = 0; i < 5; i++) {
        json_object_set_new(vocab, merged[i][2], json_integer(256 + i));
        json_array_append_new(merges, json_pack("[ss]", merged[i][0], merged[i][1]));
    }
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}, {s:i, s:s, s:b, s:b, s:b, s:b, s:b}],"
        " s:{s:s}, s:{s:s, s:b, s:b, s:b}, s:{s:s}, s:{s:s}, s:{s:s, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens",
        "id", 261, "content", "<|end|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1,
        "id", 262, "content", "<tool>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0,
        "normalizer", "type", "NFC",
        "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 1,
        "post_processor", "type", "ByteLevel",
        "decoder", "type", "ByteLevel",
        "model", "type", "BPE", "vocab", vocab, "merges", merges);
    assert_non_null(root);
    return root;
}

static char tmpdir[256];

static void write_file(const char *name, const char *text, size_t len)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

// Writes tok (and cfg when given) and loads them; returns the status, err filled.
static int load_case(json_t *tok, const char *raw, const char *cfg, char *err, size_t errlen)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moeserve-tok-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    if (tok) {
        char *s = json_dumps(tok, JSON_COMPACT);
        write_file("tokenizer.json", s, strlen(s));
        free(s);
    } else if (raw) {
        write_file("tokenizer.json", raw, strlen(raw));
    }
    if (cfg) write_file("tokenizer_config.json", cfg, strlen(cfg));
    struct tokenizer *t = NULL;
    err[0] = 0;
    int rc = tok_load(tmpdir, &t, err, errlen);
    if (rc == 0) {
        assert_non_null(t);
        tok_destroy(t);
    } else {
        assert_null(t);
        assert_true(strlen(err) > 10);
    }
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tmpdir);
    unlink(p);
    rmdir(tmpdir);
    return rc;
}

#define EXPECT_REFUSED(tok, raw, cfg, code, needle)                                        \
    do {                                                                                   \
        char e_[1024];                                                                     \
        int rc_ = load_case((tok), (raw), (cfg), e_, sizeof e_);                           \
        if (rc_ != (code) || !strstr(e_, (needle)))                                        \
            fail_msg("expected %s with \"%s\", got %d: %s", #code, (needle), rc_, e_);     \
    } while (0)

static void tiny_tokenizer_loads_and_encodes(void **state)
{
    (void)state;
    json_t *tok = tiny_tokenizer();
    char err[1024];
    assert_int_equal(load_case(tok, NULL, NULL, err, sizeof err), 0);
    // And split_special_tokens makes a special token's text plain text.
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moeserve-tok-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    char *s = json_dumps(tok, JSON_COMPACT);
    write_file("tokenizer.json", s, strlen(s));
    free(s);
    struct tokenizer *t;
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_load(tmpdir, &t, err, sizeof err), 0);
    assert_int_equal(tok_encode(t, "hello world<|end|><tool>", 24, &ids, &n, err, sizeof err), 0);
    // "hello" merges whole; " world" only as far as "Ġw"; the bytes are their own ids.
    int32_t expect[] = {259, 260, 'o', 'r', 'l', 'd', 261, 262};
    assert_int_equal(n, 8);
    assert_memory_equal(ids, expect, sizeof expect);
    free(ids);
    tok_destroy(t);
    // A token tokenizer_config.json names is special, whatever tokenizer.json says.
    const char *named = "{\"additional_special_tokens\": [{\"content\": \"<tool>\"}]}";
    write_file("tokenizer_config.json", named, strlen(named));
    assert_int_equal(tok_load(tmpdir, &t, err, sizeof err), 0);
    assert_true(tok_is_special(t, 262));
    int32_t two[] = {259, 262};
    char *text;
    size_t tl;
    assert_int_equal(tok_decode(t, two, 2, true, &text, &tl, err, sizeof err), 0);
    assert_string_equal(text, "hello");
    free(text);
    tok_destroy(t);
    const char *cfg = "{\"split_special_tokens\": true}";
    write_file("tokenizer_config.json", cfg, strlen(cfg));
    assert_int_equal(tok_load(tmpdir, &t, err, sizeof err), 0);
    assert_int_equal(tok_encode(t, "<|end|><tool>", 13, &ids, &n, err, sizeof err), 0);
    assert_true(n > 2);
    assert_int_equal(ids[n - 1], 262); // <tool> is not special: still matched
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 261);
    free(ids);
    tok_destroy(t);
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tmpdir);
    unlink(p);
    rmdir(tmpdir);
    json_decref(tok);
}

// Values of every JSON type and at the edges of every numeric range.
static const char *hostile[] = {
    "null", "true", "false", "0", "-1", "1", "2147483647", "2147483648", "-2147483649", "1e308",
    "0.5", "\"\"", "\"x\"", "\"<|end|>\"", "\"BPE\"", "\"ByteLevel\"", "[]", "[null]",
    "[1, \"a\", {}]", "[\"h e\"]", "[[\"h\", \"e\"]]", "{}", "{\"type\": \"ByteLevel\"}",
    "{\"content\": 5}", "{\"content\": \"<tool>\"}",
};

// Loads the files as they stand after each edit of the sweep: root as
// tokenizer.json, and cfg (when not NULL) as tokenizer_config.json; loaded,
// or refused with a reason (load_case checks that).
struct tok_sweep {
    json_t *root, *cfg;
    int loaded, refused;
};

static void load_swept(const char *key, const char *value, void *ctx)
{
    (void)key;
    (void)value;
    struct tok_sweep *t = ctx;
    char err[1024];
    char *c = t->cfg ? json_dumps(t->cfg, 0) : NULL;
    if (load_case(t->root, NULL, c, err, sizeof err) == 0) t->loaded++;
    else t->refused++;
    free(c);
}

// Every field of tokenizer.json (at the top, in the model, in an added
// token) and of tokenizer_config.json replaced in turn by every hostile
// value: loaded or refused with a reason, never a crash (the AddressSanitizer
// pass of the test command found a read past the end this way).
static void every_field_replaced_by_a_hostile_value_is_loaded_or_refused(void **state)
{
    (void)state;
    json_t *tok = tiny_tokenizer();
    struct tok_sweep t = {.root = tok};
    const size_t n = sizeof hostile / sizeof hostile[0];
    hostile_json_sweep(tok, hostile, n, load_swept, &t);
    hostile_json_sweep(json_object_get(tok, "model"), hostile, n, load_swept, &t);
    hostile_json_sweep(json_object_get(tok, "pre_tokenizer"), hostile, n, load_swept, &t);
    hostile_json_sweep(json_array_get(json_object_get(tok, "added_tokens"), 1), hostile, n, load_swept, &t);
    t.cfg = json_pack("{s:s, s:s, s:n, s:[s], s:b, s:b, s:i, s:s}", "bos_token", "<|end|>",
                      "eos_token", "<|end|>", "unk_token", "additional_special_tokens", "<tool>",
                      "clean_up_tokenization_spaces", 0, "split_special_tokens", 0,
                      "model_max_length", 131072, "tokenizer_class", "Qwen2Tokenizer");
    assert_non_null(t.cfg);
    hostile_json_sweep(t.cfg, hostile, n, load_swept, &t);
    json_decref(t.cfg);
    json_decref(tok);
    assert_true(t.loaded > 0 && t.refused > 0);
}

static void malformed_files_are_refused_with_a_reason(void **state)
{
    (void)state;
    json_t *t;
    // Not JSON, truncated, the wrong top-level type.
    EXPECT_REFUSED(NULL, "{\"model\": ", NULL, MS_EFORMAT, "not valid JSON");
    EXPECT_REFUSED(NULL, "[1, 2]", NULL, MS_EFORMAT, "JSON object");
    {
        char *full = NULL;
        size_t len;
        char err[256];
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", MOESERVE_TOKENIZER_DIR);
        assert_int_equal(ms_read_file(path, (size_t)1 << 30, &full, &len, err, sizeof err), 0);
        for (size_t cut = 1; cut < len; cut = cut * 7 + 13) {
            char saved = full[cut];
            full[cut] = 0; // the file cut short at several places
            EXPECT_REFUSED(NULL, full, NULL, MS_EFORMAT, "not valid JSON");
            full[cut] = saved;
        }
        free(full);
    }
    // Components we do not implement, refused by name.
    t = tiny_tokenizer();
    json_object_set_new(json_object_get(t, "model"), "type", json_string("WordPiece"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "\"WordPiece\" model");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(t, "normalizer", json_pack("{s:s}", "type", "Lowercase"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "\"Lowercase\" normalizer");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(t, "pre_tokenizer", json_pack("{s:s,s:[{s:s},{s:s}]}", "type", "Sequence", "pretokenizers",
                                                      "type", "Metaspace", "type", "ByteLevel"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "\"Metaspace\" pre-tokenizer");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(t, "decoder", json_pack("{s:s}", "type", "WordPiece"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "\"WordPiece\" decoder");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(t, "post_processor", json_pack("{s:s}", "type", "RobertaProcessing"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "\"RobertaProcessing\" post-processor");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(t, "pre_tokenizer", json_null());
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "ByteLevel");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(json_object_get(t, "model"), "dropout", json_real(0.1));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "dropout");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(t, "truncation", json_pack("{s:i}", "max_length", 8));
    EXPECT_REFUSED(t, NULL, NULL, MS_EUNSUPPORTED, "truncation");
    json_decref(t);
    // Merges that name tokens the vocabulary lacks.
    t = tiny_tokenizer();
    json_array_append_new(json_object_get(json_object_get(t, "model"), "merges"), json_string("zz q"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "\"zz\", which is not in model.vocab");
    json_decref(t);
    t = tiny_tokenizer();
    json_array_append_new(json_object_get(json_object_get(t, "model"), "merges"), json_pack("[ss]", "q", "q"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "makes \"qq\"");
    json_decref(t);
    t = tiny_tokenizer();
    json_array_append_new(json_object_get(json_object_get(t, "model"), "merges"), json_string("a b c"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "one space");
    json_decref(t);
    // Ids out of range, negative, not integers, shared.
    t = tiny_tokenizer();
    json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "big", json_integer(1000000000));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "out of range");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "neg", json_integer(-3));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "out of range");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "str", json_string("7"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "integer id");
    json_decref(t);
    t = tiny_tokenizer();
    json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "dup", json_integer(5));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "gives id 5 to both");
    json_decref(t);
    EXPECT_REFUSED(NULL, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}}}", NULL, MS_EFORMAT,
                   "duplicate");
    t = tiny_tokenizer();
    json_t *added = json_array_get(json_object_get(t, "added_tokens"), 0);
    json_object_set_new(added, "id", json_integer(4000));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "out of range");
    json_object_set_new(added, "id", json_integer(262));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "Hugging Face would give it id 261");
    json_object_set_new(added, "id", json_integer(3));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "would give it id 261");
    json_object_set_new(added, "content", json_string(""));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "non-empty");
    json_object_set_new(added, "id", json_integer(261));
    json_object_set_new(added, "content", json_string("<|end|>"));
    json_object_set_new(added, "special", json_string("yes"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "special must be true or false");
    json_decref(t);
    // A byte missing from a byte-level vocabulary.
    t = tiny_tokenizer();
    json_object_del(json_object_get(json_object_get(t, "model"), "vocab"), "A");
    json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "AA", json_integer('A'));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "byte 0x41");
    json_decref(t);
    // A Split regex PCRE2 cannot compile, and a behaviour that does not exist.
    t = tiny_tokenizer();
    json_object_set_new(t, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s}]}", "type", "Sequence", "pretokenizers",
                                  "type", "Split", "pattern", "Regex", "(a|b", "behavior", "Isolated", "invert", 0,
                                  "type", "ByteLevel"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "does not compile");
    json_object_set_new(json_array_get(json_object_get(json_object_get(t, "pre_tokenizer"), "pretokenizers"), 0),
                        "pattern", json_pack("{s:s}", "Regex", "a"));
    json_object_set_new(json_array_get(json_object_get(json_object_get(t, "pre_tokenizer"), "pretokenizers"), 0),
                        "behavior", json_string("Sideways"));
    EXPECT_REFUSED(t, NULL, NULL, MS_EFORMAT, "\"Sideways\"");
    json_decref(t);
    // tokenizer_config.json problems.
    t = tiny_tokenizer();
    EXPECT_REFUSED(t, NULL, "{\"chat_template\": ", MS_EFORMAT, "tokenizer_config.json");
    EXPECT_REFUSED(t, NULL, "{\"chat_template\": 42}", MS_EFORMAT, "chat_template");
    EXPECT_REFUSED(t, NULL, "{\"eos_token\": [1]}", MS_EFORMAT, "eos_token");
    EXPECT_REFUSED(t, NULL, "{\"added_tokens_decoder\": {\"261\": {\"content\": \"<|other|>\"}}}", MS_EFORMAT,
                   "added_tokens_decoder");
    EXPECT_REFUSED(t, NULL, "{\"clean_up_tokenization_spaces\": true}", MS_EUNSUPPORTED, "clean_up");
    EXPECT_REFUSED(t, NULL, "{\"pad_token\": \"<pad>\"}", MS_EUNSUPPORTED, "pad_token \"<pad>\"");
    EXPECT_REFUSED(t, NULL, "{\"additional_special_tokens\": [\"<|end|>\", \"hello\"]}", MS_EUNSUPPORTED,
                   "additional_special_tokens \"hello\"");
    char err[1024];
    assert_int_equal(load_case(t, NULL, "{\"chat_template\": [{\"name\": \"default\", \"template\": \"x\"}],"
                                        " \"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|end|>\"}}",
                               err, sizeof err), 0);
    json_decref(t);
    // No tokenizer.json at all.
    EXPECT_REFUSED(NULL, NULL, NULL, MS_ENOTFOUND, "tokenizer.json");
}

// tok_encode_max gives the same ids up to its limit and stops past it with
// MS_ETOOLONG; the byte floor holds: no text encodes to fewer ids than its
// bytes over tok_max_bytes_per_id.
static void encoding_stops_at_a_limit_and_bytes_bound_the_ids(void **state)
{
    (void)state;
    const char *text = "The quick brown fox jumps over the lazy dog, again and again and again.";
    int32_t *all, *some;
    size_t n, m;
    char err[256];
    assert_int_equal(tok_encode(qwen, text, strlen(text), &all, &n, err, sizeof err), 0);
    assert_int_equal(tok_encode_max(qwen, text, strlen(text), n, true, &some, &m, err, sizeof err), 0);
    assert_int_equal(m, n);
    assert_memory_equal(all, some, n * sizeof *all);
    free(some);
    assert_int_equal(tok_encode_max(qwen, text, strlen(text), n - 1, true, &some, &m, err, sizeof err),
                     MS_ETOOLONG);
    assert_non_null(strstr(err, "more than"));
    free(all);
    const size_t per = tok_max_bytes_per_id(qwen);
    assert_true(per >= 128); // Qwen3's longest token is a run of spaces
    char *spaces = malloc(20000);
    memset(spaces, ' ', 20000);
    assert_int_equal(tok_encode(qwen, spaces, 20000, &all, &n, err, sizeof err), 0);
    assert_true(n >= 20000 / per);
    free(all);
    free(spaces);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stream_decoder_equals_decode_on_every_corpus_string),
        cmocka_unit_test(encoding_stops_at_a_limit_and_bytes_bound_the_ids),
        cmocka_unit_test(stream_decoder_repairs_broken_utf8_like_decode),
        cmocka_unit_test(stream_refuses_small_buffers_and_bad_ids_without_changing_state),
        cmocka_unit_test(decode_refuses_ids_outside_the_vocabulary),
        cmocka_unit_test(encode_refuses_invalid_utf8),
        cmocka_unit_test(special_tokens_in_text_are_matched_and_known),
        cmocka_unit_test(threads_sharing_one_tokenizer_get_the_same_ids),
        cmocka_unit_test(long_runs_encode_and_round_trip),
        cmocka_unit_test(nfc_fast_path_skips_only_characters_nfc_never_touches),
        cmocka_unit_test(normalization_matches_utf8proc_in_every_form),
        cmocka_unit_test(regexes_read_backslash_s_as_oniguruma_does),
        cmocka_unit_test(split_behaviours_follow_the_hugging_face_examples),
        cmocka_unit_test(tiny_tokenizer_loads_and_encodes),
        cmocka_unit_test(malformed_files_are_refused_with_a_reason),
        cmocka_unit_test(every_field_replaced_by_a_hostile_value_is_loaded_or_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
