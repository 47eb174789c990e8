// tokenizer_text: the text side of encoding — UTF-8, Unicode normalization,
// regexes (Oniguruma semantics on PCRE2), the Split behaviours and added-token matching.
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/base.h"
#include "tokenizer/tokenizer_internal.h"

// ---- growable buffers ----

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ms_mul_overflow(ncap, 2, &ncap)) return MS_ENOMEM;
    }
    size_t bytes;
    if (ms_mul_overflow(ncap, elem, &bytes)) return MS_ENOMEM;
    void *np = realloc(*p, bytes);
    if (!np) return MS_ENOMEM;
    *p = np;
    *cap = ncap;
    return 0;
}

int tok_buf_reserve(struct tok_buf *b, size_t extra)
{
    size_t need;
    if (ms_add_overflow(b->len, extra, &need) || ms_add_overflow(need, 1, &need)) return MS_ENOMEM;
    return grow((void **)&b->p, &b->cap, need, 1);
}

int tok_buf_push(struct tok_buf *b, const void *src, size_t n)
{
    int rc = tok_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int tok_ids_push(struct tok_ids *v, int32_t id)
{
    if (v->len == v->cap) {
        int rc = grow((void **)&v->p, &v->cap, v->len + 1, sizeof *v->p);
        if (rc) return rc;
    }
    v->p[v->len++] = id;
    return 0;
}

int tok_spans_push(struct tok_spans *v, uint32_t off, uint32_t len)
{
    if (v->len == v->cap) {
        int rc = grow((void **)&v->p, &v->cap, v->len + 1, sizeof *v->p);
        if (rc) return rc;
    }
    v->p[v->len++] = (struct tok_span){off, len};
    return 0;
}

int tok_pieces_push(struct tok_pieces *v, uint32_t off, uint32_t len, int32_t added)
{
    if (v->len == v->cap) {
        int rc = grow((void **)&v->p, &v->cap, v->len + 1, sizeof *v->p);
        if (rc) return rc;
    }
    v->p[v->len++] = (struct tok_piece){off, len, added};
    return 0;
}

// ---- Unicode properties ----

bool tok_is_white_space(uint32_t cp)
{
    // PropList.txt White_Space: what Rust's char::is_whitespace and `\s` of
    // Oniguruma and the regex crate use (lstrip/rstrip, Split patterns).
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

bool tok_is_word_char(uint32_t cp)
{
    // Rust regex `\w`: Alphabetic, marks, decimal digits, connector
    // punctuation and the joiners. Alphabetic is the letters, Nl, and the
    // few symbols with Other_Alphabetic (circled and squared Latin letters).
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    if (cp == 0x200c || cp == 0x200d) return true;
    if ((cp >= 0x24b6 && cp <= 0x24e9) || (cp >= 0x1f130 && cp <= 0x1f149) ||
        (cp >= 0x1f150 && cp <= 0x1f169) || (cp >= 0x1f170 && cp <= 0x1f189))
        return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

// ---- normalization ----

// Code points that NFC never changes, in any context: canonical combining
// class 0, NFC_QC=Yes, and never the second of a composition. A piece made
// only of these skips utf8proc (the common case for English and Chinese).
// tests/model/test_tokenizer_unit.c checks every range against utf8proc.
static bool nfc_inert(uint32_t cp)
{
    if (cp < 0x300) return true;
    if (cp < 0x3000) {
        return (cp >= 0x391 && cp <= 0x3a9) || (cp >= 0x3b1 && cp <= 0x3c9) ||
               (cp >= 0x400 && cp <= 0x482) || (cp >= 0x48a && cp <= 0x52f) ||
               (cp >= 0x5d0 && cp <= 0x5ea) || (cp >= 0x621 && cp <= 0x63a) ||
               (cp >= 0x641 && cp <= 0x64a) || (cp >= 0x904 && cp <= 0x939) ||
               (cp >= 0xe01 && cp <= 0xe30) || (cp >= 0x2010 && cp <= 0x2027) ||
               (cp >= 0x2030 && cp <= 0x205e);
    }
    return (cp <= 0x3029) || (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30a1 && cp <= 0x30fa) ||
           (cp >= 0x3400 && cp <= 0x4dbf) || (cp >= 0x4e00 && cp <= 0x9fff) ||
           (cp >= 0xac00 && cp <= 0xd7a3) || (cp >= 0xff01 && cp <= 0xffef);
}

bool tok_nfc_inert(uint32_t cp); // for the unit test
bool tok_nfc_inert(uint32_t cp)
{
    return nfc_inert(cp);
}

static bool all_ascii(const uint8_t *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) return false;
    }
    for (; i < n; i++)
        if (s[i] & 0x80) return false;
    return true;
}

static bool nfc_unchanged(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        i += (size_t)utf8_decode(s + i, n - i, &cp);
        if (!nfc_inert(cp)) return false;
    }
    return true;
}

static uint8_t ccc(utf8proc_int32_t cp) { return (uint8_t)utf8proc_get_property(cp)->combining_class; }

// The canonical ordering of a run of combining marks (class > 0), stable:
// by counting over the 255 classes, linear in the run. (utf8proc_map orders
// them with adjacent swaps, quadratic in a run of marks of mixed classes: a
// 160 KB prompt of alternating U+0316 U+0301 took 10 s to tokenize.)
static void order_marks(utf8proc_int32_t *run, size_t n, utf8proc_int32_t *tmp)
{
    if (n < 2) return;
    size_t at[257] = {0};
    for (size_t i = 0; i < n; i++) at[ccc(run[i]) + 1]++;
    for (int c = 1; c <= 256; c++) at[c] += at[c - 1];
    for (size_t i = 0; i < n; i++) tmp[at[ccc(run[i])]++] = run[i];
    memcpy(run, tmp, n * sizeof *run);
}

// s (valid UTF-8 or MS_EFORMAT) in normalization form kind: each code point
// decomposed, the marks canonically ordered (order_marks), then composed
// (NFC, NFKC) and encoded by utf8proc: what utf8proc_map gives, in linear
// time.
static int normalize_step(enum tok_norm kind, const uint8_t *s, size_t n, struct tok_buf *out)
{
    out->len = 0;
    bool same = all_ascii(s, n) || (kind == TOK_NORM_NFC && nfc_unchanged(s, n));
    if (same) return tok_buf_push(out, s, n);
    // Code points out: at most 18 a code point in (utf8proc's longest
    // decomposition), as 4-byte words, twice (the sort's scratch).
    if (n > (size_t)PTRDIFF_MAX / 256) return MS_ENOMEM;
    const bool compose = kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC;
    const bool compat = kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD;
    const utf8proc_option_t dopt = (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0));
    size_t cap = 4 * n + 32, len = 0;
    utf8proc_int32_t *cps = malloc(cap * sizeof *cps);
    if (!cps) return MS_ENOMEM;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        const utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) {
            free(cps);
            return MS_EFORMAT;
        }
        i += (size_t)k;
        for (;;) {
            const utf8proc_ssize_t w = utf8proc_decompose_char(cp, cps + len, (utf8proc_ssize_t)(cap - len), dopt, NULL);
            if (w < 0) {
                free(cps);
                return w == UTF8PROC_ERROR_NOMEM ? MS_ENOMEM : MS_EFORMAT;
            }
            if ((size_t)w <= cap - len) {
                len += (size_t)w;
                break;
            }
            utf8proc_int32_t *g = realloc(cps, 2 * cap * sizeof *cps);
            if (!g) {
                free(cps);
                return MS_ENOMEM;
            }
            cps = g;
            cap *= 2;
        }
    }
    utf8proc_int32_t *tmp = malloc((len ? len : 1) * sizeof *tmp);
    if (!tmp) {
        free(cps);
        return MS_ENOMEM;
    }
    for (size_t i = 0; i < len;) {
        if (ccc(cps[i]) == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && ccc(cps[j]) != 0) j++;
        order_marks(cps + i, j - i, tmp);
        i = j;
    }
    free(tmp);
    // utf8proc_reencode composes, then writes the UTF-8 over the words (at
    // most 4 bytes a word, so in place).
    const utf8proc_ssize_t r = utf8proc_reencode(cps, (utf8proc_ssize_t)len,
                                                 (utf8proc_option_t)(UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : 0)));
    int rc = r < 0 ? (r == UTF8PROC_ERROR_NOMEM ? MS_ENOMEM : MS_EFORMAT) : tok_buf_push(out, cps, (size_t)r);
    free(cps);
    return rc;
}

int tok_normalize(const enum tok_norm *steps, int n_steps, const uint8_t *s, size_t n,
                  struct tok_buf *out)
{
    if (n_steps <= 1) {
        if (n_steps == 0) {
            out->len = 0;
            return tok_buf_push(out, s, n);
        }
        return normalize_step(steps[0], s, n, out);
    }
    struct tok_buf tmp = {0};
    int rc = tok_buf_push(&tmp, s, n);
    for (int i = 0; i < n_steps && rc == 0; i++) {
        rc = normalize_step(steps[i], tmp.p, tmp.len, out);
        if (rc == 0 && i + 1 < n_steps) {
            tmp.len = 0;
            rc = tok_buf_push(&tmp, out->p, out->len);
        }
    }
    free(tmp.p);
    return rc;
}

// ---- regexes ----

// Hugging Face tokenizers compiles Split patterns with Oniguruma (Ruby
// syntax). PCRE2 reads the same syntax but gives a few escapes other
// meanings; we rewrite those so that matches are Oniguruma's:
//   \s \S  Oniguruma: White_Space. PCRE2 (UCP): \p{Z}, \h, \v (adds U+180E).
//   \w \W  Oniguruma: letters, marks, decimal digits, connector punctuation.
//          PCRE2 10.42: letters, all numbers and '_'.
//   \h \H  Oniguruma: a hexadecimal digit. PCRE2: horizontal space.
//   \uHHHH Oniguruma: a code point. PCRE2: an error.
// Constructs PCRE2 has no equivalent for (nested classes, && intersections,
// and the negated \W or \H inside a class) are refused rather than guessed.
static int translate_pattern(const char *p, size_t n, bool literal, struct tok_buf *out,
                             char *err, size_t errlen)
{
#define PUT(str) do { if (tok_buf_push(out, (str), strlen(str))) return MS_ENOMEM; } while (0)
#define PUTN(ptr, len) do { if (tok_buf_push(out, (ptr), (len))) return MS_ENOMEM; } while (0)
    out->len = 0;
    if (literal) {
        // Every non-alphanumeric ASCII character is escaped; others stand for themselves.
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)p[i];
            if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                              (c >= 'A' && c <= 'Z'))) {
                if (c == 0) {
                    PUT("\\x{0}");
                    continue;
                }
                PUTN("\\", 1);
            }
            PUTN(&p[i], 1);
        }
        return 0;
    }
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\') {
            if (i + 1 >= n)
                return ms_err(err, errlen, MS_EFORMAT, "the pattern ends with a lone backslash");
            char e = p[i + 1];
            i++;
            switch (e) {
            case 's': PUT("\\p{White_Space}"); break;
            case 'S': PUT("\\P{White_Space}"); break;
            case 'w': PUT(in_class ? "\\p{L}\\p{M}\\p{Nd}\\p{Pc}" : "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]"); break;
            case 'W':
                if (in_class)
                    return ms_err(err, errlen, MS_EUNSUPPORTED,
                                  "\\W inside a character class (offset %zu) is not supported", i - 1);
                PUT("[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]");
                break;
            case 'h': PUT(in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"); break;
            case 'H':
                if (in_class)
                    return ms_err(err, errlen, MS_EUNSUPPORTED,
                                  "\\H inside a character class (offset %zu) is not supported", i - 1);
                PUT("[^0-9a-fA-F]");
                break;
            case 'u': {
                size_t k = 0;
                while (k < 4 && i + 1 + k < n &&
                       strchr("0123456789abcdefABCDEF", p[i + 1 + k]) && p[i + 1 + k])
                    k++;
                if (k != 4)
                    return ms_err(err, errlen, MS_EFORMAT,
                                  "\\u at offset %zu needs four hexadecimal digits", i - 1);
                PUT("\\x{");
                PUTN(p + i + 1, 4);
                PUT("}");
                i += 4;
                break;
            }
            default: {
                char two[2] = {'\\', e};
                PUTN(two, 2);
            }
            }
            continue;
        }
        if (in_class) {
            if (c == '[') {
                if (i + 1 < n && p[i + 1] == ':') { // a POSIX class such as [:alpha:]
                    const char *end = NULL;
                    for (size_t k = i + 2; k + 1 < n; k++)
                        if (p[k] == ':' && p[k + 1] == ']') {
                            end = p + k;
                            break;
                        }
                    if (!end)
                        return ms_err(err, errlen, MS_EFORMAT,
                                      "unterminated [: at offset %zu", i);
                    PUTN(p + i, (size_t)(end - (p + i)) + 2);
                    i = (size_t)(end - p) + 1;
                    continue;
                }
                return ms_err(err, errlen, MS_EUNSUPPORTED,
                              "a nested character class (offset %zu) is not supported", i);
            }
            if (c == '&' && i + 1 < n && p[i + 1] == '&')
                return ms_err(err, errlen, MS_EUNSUPPORTED,
                              "class intersection && (offset %zu) is not supported", i);
            // A ']' right after '[' or '[^' is a literal in both engines.
            if (c == ']' && !(i == class_start || (i == class_start + 1 && p[class_start] == '^')))
                in_class = false;
            PUTN(&c, 1);
            continue;
        }
        if (c == '[') {
            in_class = true;
            class_start = i + 1;
        }
        PUTN(&c, 1);
    }
    if (in_class) return ms_err(err, errlen, MS_EFORMAT, "unterminated character class");
    return 0;
#undef PUT
#undef PUTN
}

int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, bool literal,
                      char *err, size_t errlen)
{
    re->code = NULL;
    re->jit = false;
    struct tok_buf pat = {0};
    int rc = translate_pattern(pattern, len, literal, &pat, err, errlen);
    if (rc) {
        free(pat.p);
        return rc;
    }
    pcre2_compile_context *cctx = pcre2_compile_context_create(NULL);
    if (!cctx) {
        free(pat.p);
        return MS_ENOMEM;
    }
    // Oniguruma: '.' and '$' know only \n as a newline; \R is any Unicode line break.
    pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
    pcre2_set_bsr(cctx, PCRE2_BSR_UNICODE);
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    re->code = pcre2_compile(pat.p ? pat.p : (const uint8_t *)"", pat.len,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &ecode, &eoff, cctx);
    pcre2_compile_context_free(cctx);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        rc = ms_err(err, errlen, MS_EFORMAT, "the pattern does not compile (as %.*s): %s at offset %zu",
                    (int)(pat.len > 200 ? 200 : pat.len), (const char *)pat.p, (const char *)msg,
                    (size_t)eoff);
        free(pat.p);
        return rc;
    }
    free(pat.p);
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

void tok_regex_free(struct tok_regex *re)
{
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

void tok_matcher_free(struct tok_matcher *m)
{
    if (m->md) pcre2_match_data_free(m->md);
    if (m->mctx) pcre2_match_context_free(m->mctx);
    if (m->jit_stack) pcre2_jit_stack_free(m->jit_stack);
    free(m->segs);
    memset(m, 0, sizeof *m);
}

static int matcher_ready(struct tok_matcher *m)
{
    if (!m->md) {
        // Two ovector pairs are enough: we only read the whole match.
        m->md = pcre2_match_data_create(2, NULL);
        if (!m->md) return MS_ENOMEM;
    }
    if (!m->mctx) {
        m->mctx = pcre2_match_context_create(NULL);
        if (!m->mctx) return MS_ENOMEM;
        // Long runs of one character backtrack once per character; the
        // default limits would refuse a few megabytes of spaces.
        pcre2_set_match_limit(m->mctx, UINT32_MAX);
        pcre2_set_depth_limit(m->mctx, UINT32_MAX);
    }
    return 0;
}

static int run_match(const struct tok_regex *re, struct tok_matcher *m, const uint8_t *s, size_t n,
                     size_t start)
{
    for (;;) {
        int rc = re->jit ? pcre2_jit_match(re->code, s, n, start, 0, m->md, m->mctx)
                         : pcre2_match(re->code, s, n, start, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || m->jit_stack) return rc;
        // The machine-stack default was too small for this subject: give the JIT its own.
        m->jit_stack = pcre2_jit_stack_create(64 * 1024, 512 * 1024 * 1024, NULL);
        if (!m->jit_stack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(m->mctx, NULL, m->jit_stack);
    }
}

static int push_seg(struct tok_matcher *m, size_t *n, uint32_t start, uint32_t end, bool match)
{
    if (*n == m->segs_cap) {
        int rc = grow((void **)&m->segs, &m->segs_cap, *n + 1, sizeof *m->segs);
        if (rc) return rc;
    }
    m->segs[(*n)++] = (struct tok_seg){start, end, match};
    return 0;
}

static size_t next_char(const uint8_t *s, size_t n, size_t i)
{
    i++;
    while (i < n && (s[i] & 0xc0) == 0x80) i++;
    return i;
}

int tok_split_span(const struct tok_regex *re, enum tok_split_behavior behavior, bool invert,
                   struct tok_matcher *m, const uint8_t *s, struct tok_span span,
                   struct tok_spans *out, char *err, size_t errlen)
{
    if (span.len == 0) return 0;
    int rc = matcher_ready(m);
    if (rc) return rc;
    const uint8_t *sub = s + span.off;
    size_t n = span.len;
    // 1. The whole span as (match / not match) segments, as find_matches does.
    size_t nseg = 0, prev = 0, start = 0;
    bool have_last = false;
    size_t last_end = 0;
    while (start <= n) {
        int r = run_match(re, m, sub, n, start);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            return ms_err(err, errlen, r == PCRE2_ERROR_NOMEMORY ? MS_ENOMEM : MS_EINTERNAL,
                          "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me) {
            // Oniguruma's iterator refuses an empty match right where the
            // previous match ended, then moves one character on.
            if (!(have_last && last_end == ms)) {
                if (prev != ms && (rc = push_seg(m, &nseg, (uint32_t)prev, (uint32_t)ms, false))) return rc;
                if ((rc = push_seg(m, &nseg, (uint32_t)ms, (uint32_t)me, true))) return rc;
                prev = me;
                have_last = true;
                last_end = me;
            }
            if (ms >= n) break;
            start = next_char(sub, n, ms);
            continue;
        }
        if (prev != ms && (rc = push_seg(m, &nseg, (uint32_t)prev, (uint32_t)ms, false))) return rc;
        if ((rc = push_seg(m, &nseg, (uint32_t)ms, (uint32_t)me, true))) return rc;
        prev = me;
        have_last = true;
        last_end = me;
        start = me;
    }
    if (prev != n && (rc = push_seg(m, &nseg, (uint32_t)prev, (uint32_t)n, false))) return rc;
    if (invert)
        for (size_t i = 0; i < nseg; i++) m->segs[i].match = !m->segs[i].match;

    // 2. The behaviour decides which segments merge and which go; then empty ones are dropped.
    struct tok_seg *g = m->segs;
    size_t nout = 0; // compacted in place: (start, end, remove)
    switch (behavior) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < nseg; i++) g[i].match = false;
        nout = nseg;
        break;
    case TOK_SPLIT_REMOVED:
        nout = nseg; // a match is removed
        break;
    case TOK_SPLIT_CONTIGUOUS: {
        bool prev_match = false;
        for (size_t i = 0; i < nseg; i++) {
            bool im = g[i].match;
            if (nout > 0 && im == prev_match) {
                g[nout - 1].end = g[i].end;
            } else {
                g[nout] = (struct tok_seg){g[i].start, g[i].end, false};
                nout++;
            }
            prev_match = im;
        }
        break;
    }
    case TOK_SPLIT_MERGED_WITH_PREVIOUS: {
        bool prev_match = false;
        for (size_t i = 0; i < nseg; i++) {
            bool im = g[i].match;
            if (nout > 0 && im && !prev_match) {
                g[nout - 1].end = g[i].end;
            } else {
                g[nout] = (struct tok_seg){g[i].start, g[i].end, false};
                nout++;
            }
            prev_match = im;
        }
        break;
    }
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        // Walk backwards, merging a match into the segment after it; the
        // result is built from the end of the array towards the front.
        bool prev_match = false;
        size_t w = nseg; // segments live at g[w .. nseg)
        for (size_t k = nseg; k-- > 0;) {
            struct tok_seg cur = g[k];
            if (w < nseg && cur.match && !prev_match) {
                g[w].start = cur.start;
            } else {
                w--;
                g[w] = (struct tok_seg){cur.start, cur.end, false};
            }
            prev_match = cur.match;
        }
        nout = nseg - w;
        memmove(g, g + w, nout * sizeof *g);
        break;
    }
    }
    for (size_t i = 0; i < nout; i++) {
        if (g[i].match || g[i].end == g[i].start) continue;
        if ((rc = tok_spans_push(out, span.off + g[i].start, g[i].end - g[i].start))) return rc;
    }
    return 0;
}

// ---- added tokens ----

static int trie_new_node(struct tok_trie *t, uint8_t byte, uint32_t *idx)
{
    if (t->n_nodes == t->cap) {
        size_t cap = t->cap;
        int rc = grow((void **)&t->nodes, &cap, (size_t)t->n_nodes + 1, sizeof *t->nodes);
        if (rc) return rc;
        if (cap > UINT32_MAX - 1) return MS_ENOMEM;
        t->cap = (uint32_t)cap;
    }
    t->nodes[t->n_nodes] = (struct tok_trie_node){TOK_TRIE_NONE, TOK_TRIE_NONE, -1, byte};
    *idx = t->n_nodes++;
    return 0;
}

int tok_trie_build(struct tok_trie *trie, const struct tok_added *added, size_t n_added,
                   bool normalized_set, bool skip_special)
{
    memset(trie, 0, sizeof *trie);
    trie->empty = true;
    uint32_t root;
    int rc = trie_new_node(trie, 0, &root);
    if (rc) return rc;
    for (size_t i = 0; i < n_added; i++) {
        const struct tok_added *a = &added[i];
        if (a->normalized != normalized_set || a->pattern_len == 0) continue;
        if (skip_special && a->special) continue;
        uint32_t node = root;
        for (size_t k = 0; k < a->pattern_len; k++) {
            uint8_t b = a->pattern[k];
            uint32_t c = trie->nodes[node].first_child;
            while (c != TOK_TRIE_NONE && trie->nodes[c].byte != b) c = trie->nodes[c].next_sibling;
            if (c == TOK_TRIE_NONE) {
                if ((rc = trie_new_node(trie, b, &c))) return rc;
                trie->nodes[c].next_sibling = trie->nodes[node].first_child;
                trie->nodes[node].first_child = c;
            }
            node = c;
        }
        // When two tokens share a pattern the first keeps it.
        if (trie->nodes[node].token < 0) trie->nodes[node].token = (int32_t)i;
        trie->first_byte[a->pattern[0]] = true;
        trie->empty = false;
    }
    return 0;
}

void tok_trie_free(struct tok_trie *trie)
{
    free(trie->nodes);
    memset(trie, 0, sizeof *trie);
}

static bool word_char_before(const uint8_t *s, size_t pos)
{
    if (pos == 0) return false;
    size_t i = pos - 1;
    while (i > 0 && (s[i] & 0xc0) == 0x80) i--;
    uint32_t cp;
    utf8_decode(s + i, pos - i, &cp);
    return tok_is_word_char(cp);
}

static bool word_char_at(const uint8_t *s, size_t n, size_t pos)
{
    if (pos >= n) return false;
    uint32_t cp;
    utf8_decode(s + pos, n - pos, &cp);
    return tok_is_word_char(cp);
}

int tok_added_split(const struct tok_trie *trie, const struct tok_added *added,
                    const uint8_t *s, size_t n, struct tok_pieces *out)
{
    int rc;
    if (trie->empty) return n ? tok_pieces_push(out, 0, (uint32_t)n, -1) : 0;
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        if (!trie->first_byte[s[pos]]) {
            pos++;
            continue;
        }
        // The longest pattern starting here (leftmost-longest, as Aho-Corasick's
        // LeftmostLongest finds them: the leftmost start wins, then length).
        uint32_t node = 0;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t k = pos; k < n; k++) {
            uint32_t c = trie->nodes[node].first_child;
            while (c != TOK_TRIE_NONE && trie->nodes[c].byte != s[k]) c = trie->nodes[c].next_sibling;
            if (c == TOK_TRIE_NONE) break;
            node = c;
            if (trie->nodes[node].token >= 0) {
                best = trie->nodes[node].token;
                best_end = k + 1;
            }
        }
        if (best < 0) {
            pos++;
            continue;
        }
        const struct tok_added *a = &added[best];
        size_t start = pos, stop = best_end;
        if (a->single_word && (word_char_before(s, start) || word_char_at(s, n, stop))) {
            pos = best_end; // the matcher goes on after the refused match
            continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > start_offset) {
                size_t i = ns - 1;
                while (i > 0 && (s[i] & 0xc0) == 0x80) i--;
                uint32_t cp;
                utf8_decode(s + i, ns - i, &cp);
                if (!tok_is_white_space(cp)) break;
                ns = i;
            }
            start = ns;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int l = (int)utf8_decode(s + stop, n - stop, &cp);
                if (!tok_is_white_space(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start &&
            (rc = tok_pieces_push(out, (uint32_t)start_offset, (uint32_t)(start - start_offset), -1)))
            return rc;
        if ((rc = tok_pieces_push(out, (uint32_t)start, (uint32_t)(stop - start), best))) return rc;
        start_offset = stop;
        pos = stop;
    }
    if (start_offset < n &&
        (rc = tok_pieces_push(out, (uint32_t)start_offset, (uint32_t)(n - start_offset), -1)))
        return rc;
    return 0;
}
