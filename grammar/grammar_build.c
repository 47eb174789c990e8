// grammar_build: the expression builder every compiler writes into — rules,
// byte classes, sequences, alternations, repetitions, calls — plus code-point
// classes and their exact UTF-8 byte expressions.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/base.h"
#include "grammar/grammar_internal.h"

int gb_init(struct gbuild *b)
{
    memset(b, 0, sizeof *b);
    b->arena = arena_create(1 << 16);
    return b->arena ? 0 : MS_ENOMEM;
}

void gb_free(struct gbuild *b)
{
    arena_destroy(b->arena);
    free(b->rules);
    free(b->literals);
    free(b->literal_lens);
    memset(b, 0, sizeof *b);
}

int gb_fail(struct gbuild *b, int code, const char *fmt, ...)
{
    if (b->status) return b->status;
    b->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
    return code;
}

static void *gb_alloc(struct gbuild *b, size_t n)
{
    if (b->status) return NULL;
    void *p = arena_alloc(b->arena, n);
    if (!p) gb_fail(b, MS_ENOMEM, "out of memory while compiling the grammar");
    return p;
}

int gb_rule_new(struct gbuild *b, const char *name)
{
    if (b->status) return -1;
    if (b->n_rules >= GRAMMAR_MAX_RULES) {
        gb_fail(b, MS_ENOFIT, "the grammar needs more than %d rules", GRAMMAR_MAX_RULES);
        return -1;
    }
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? 2 * b->cap_rules : 16;
        struct gb_rule *r = realloc(b->rules, (size_t)cap * sizeof *r);
        if (!r) {
            gb_fail(b, MS_ENOMEM, "out of memory while compiling the grammar");
            return -1;
        }
        b->rules = r;
        b->cap_rules = cap;
    }
    const char *copy = arena_strdup(b->arena, name ? name : "");
    if (!copy) {
        gb_fail(b, MS_ENOMEM, "out of memory while compiling the grammar");
        return -1;
    }
    b->rules[b->n_rules] = (struct gb_rule){.name = copy, .body = NULL};
    return b->n_rules++;
}

int gb_rule_find(const struct gbuild *b, const char *name, size_t len)
{
    for (int i = 0; i < b->n_rules; i++)
        if (strlen(b->rules[i].name) == len && memcmp(b->rules[i].name, name, len) == 0) return i;
    return -1;
}

void gb_rule_set(struct gbuild *b, int rule, struct gx *body)
{
    if (b->status || rule < 0 || rule >= b->n_rules || !body) return;
    b->rules[rule].body = body;
}

void gb_note_literal(struct gbuild *b, const uint8_t *s, size_t n)
{
    if (b->status || n == 0) return;
    if (b->n_literals == b->cap_literals) {
        int cap = b->cap_literals ? 2 * b->cap_literals : 8;
        char **l = realloc(b->literals, (size_t)cap * sizeof *l);
        if (!l) {
            gb_fail(b, MS_ENOMEM, "out of memory while compiling the grammar");
            return;
        }
        b->literals = l;
        size_t *ll = realloc(b->literal_lens, (size_t)cap * sizeof *ll);
        if (!ll) {
            gb_fail(b, MS_ENOMEM, "out of memory while compiling the grammar");
            return;
        }
        b->literal_lens = ll;
        b->cap_literals = cap;
    }
    char *copy = gb_alloc(b, n);
    if (!copy) return;
    memcpy(copy, s, n);
    b->literals[b->n_literals] = copy;
    b->literal_lens[b->n_literals++] = n;
}

// ---- expression constructors ----

static struct gx *gx_new(struct gbuild *b, uint8_t kind)
{
    if (b->status) return NULL;
    if (++b->n_nodes > GRAMMAR_MAX_EXPR_NODES) {
        gb_fail(b, MS_ENOFIT, "the grammar needs more than %d expression nodes",
                GRAMMAR_MAX_EXPR_NODES);
        return NULL;
    }
    struct gx *x = gb_alloc(b, sizeof *x);
    if (!x) return NULL;
    memset(x, 0, sizeof *x);
    x->kind = kind;
    return x;
}

struct gx *gx_empty(struct gbuild *b)
{
    return gx_new(b, GX_EMPTY);
}

struct gx *gx_class(struct gbuild *b, const uint8_t cls[32])
{
    struct gx *x = gx_new(b, GX_CLASS);
    if (x) memcpy(x->cls, cls, 32);
    return x;
}

struct gx *gx_range(struct gbuild *b, uint8_t lo, uint8_t hi)
{
    uint8_t cls[32] = {0};
    for (unsigned c = lo; c <= hi; c++) gx_cls_set(cls, c);
    return gx_class(b, cls);
}

struct gx *gx_byte(struct gbuild *b, uint8_t c)
{
    return gx_range(b, c, c);
}

struct gx *gx_lit(struct gbuild *b, const void *s, size_t n)
{
    if (n == 0) return gx_empty(b);
    if (n == 1) return gx_byte(b, *(const uint8_t *)s);
    struct gx *x = gx_new(b, GX_SEQ);
    if (!x) return NULL;
    size_t bytes;
    if (ms_mul_overflow(n, sizeof *x->kids, &bytes)) {
        gb_fail(b, MS_ENOFIT, "a literal is too long");
        return NULL;
    }
    x->kids = gb_alloc(b, bytes);
    if (!x->kids) return NULL;
    for (size_t i = 0; i < n; i++) {
        x->kids[i] = gx_byte(b, ((const uint8_t *)s)[i]);
        if (!x->kids[i]) return NULL;
    }
    x->n_kids = (uint32_t)n;
    return x;
}

struct gx *gx_str(struct gbuild *b, const char *s)
{
    return gx_lit(b, s, strlen(s));
}

static struct gx *gx_listv(struct gbuild *b, uint8_t kind, struct gx *const *kids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!kids[i]) return NULL;
    if (n == 0) return gx_empty(b);
    if (n == 1) return kids[0];
    if (n > UINT32_MAX) {
        gb_fail(b, MS_ENOFIT, "a sequence is too long");
        return NULL;
    }
    struct gx *x = gx_new(b, kind);
    if (!x) return NULL;
    x->kids = gb_alloc(b, n * sizeof *x->kids);
    if (!x->kids) return NULL;
    memcpy(x->kids, kids, n * sizeof *x->kids);
    x->n_kids = (uint32_t)n;
    return x;
}

struct gx *gx_seqv(struct gbuild *b, struct gx *const *kids, size_t n)
{
    return gx_listv(b, GX_SEQ, kids, n);
}

struct gx *gx_altv(struct gbuild *b, struct gx *const *kids, size_t n)
{
    if (n == 0) {
        gb_fail(b, MS_EINVAL, "an empty alternation matches nothing");
        return NULL;
    }
    return gx_listv(b, GX_ALT, kids, n);
}

struct gx *gx_seq2(struct gbuild *b, struct gx *x, struct gx *y)
{
    struct gx *k[2] = {x, y};
    return gx_seqv(b, k, 2);
}

struct gx *gx_seq3(struct gbuild *b, struct gx *x, struct gx *y, struct gx *z)
{
    struct gx *k[3] = {x, y, z};
    return gx_seqv(b, k, 3);
}

struct gx *gx_alt2(struct gbuild *b, struct gx *x, struct gx *y)
{
    struct gx *k[2] = {x, y};
    return gx_altv(b, k, 2);
}

struct gx *gx_repeat(struct gbuild *b, struct gx *x, uint32_t min, uint32_t max)
{
    if (!x) return NULL;
    if (min > max) {
        gb_fail(b, MS_EINVAL, "a repetition's minimum %u is above its maximum %u", min, max);
        return NULL;
    }
    if (min > GRAMMAR_MAX_REPEAT || (max != GX_INF && max > GRAMMAR_MAX_REPEAT)) {
        gb_fail(b, MS_ENOFIT, "a repetition bound above %d", GRAMMAR_MAX_REPEAT);
        return NULL;
    }
    if (min == 1 && max == 1) return x;
    if (max == 0) return gx_empty(b);
    struct gx *r = gx_new(b, GX_REPEAT);
    if (!r) return NULL;
    r->kids = gb_alloc(b, sizeof *r->kids);
    if (!r->kids) return NULL;
    r->kids[0] = x;
    r->n_kids = 1;
    r->min = min;
    r->max = max;
    return r;
}

struct gx *gx_opt(struct gbuild *b, struct gx *x)
{
    return gx_repeat(b, x, 0, 1);
}

struct gx *gx_star(struct gbuild *b, struct gx *x)
{
    return gx_repeat(b, x, 0, GX_INF);
}

struct gx *gx_call(struct gbuild *b, int rule)
{
    if (rule < 0) return NULL;
    struct gx *x = gx_new(b, GX_CALL);
    if (x) x->rule = rule;
    return x;
}

struct gx *gx_props(struct gbuild *b, struct gx *const *members, const bool *optional, size_t n,
                    struct gx *sep, struct gx *extra)
{
    for (size_t i = 0; i < n; i++)
        if (!members[i]) return NULL;
    if (!sep || n > UINT32_MAX - 2) return NULL;
    struct gx *x = gx_new(b, GX_PROPS);
    if (!x) return NULL;
    x->kids = gb_alloc(b, (n + 2) * sizeof *x->kids);
    x->opt = gb_alloc(b, n + 1);
    if (!x->kids || !x->opt) return NULL;
    for (size_t i = 0; i < n; i++) {
        x->kids[i] = members[i];
        x->opt[i] = optional[i];
    }
    x->kids[n] = sep;
    x->kids[n + 1] = extra;
    x->min = (uint32_t)n;
    x->n_kids = (uint32_t)n + 2;
    return x;
}

void gx_list_push(struct gbuild *b, struct gx_list *l, struct gx *x)
{
    if (b->status) return;
    if (!x) {
        if (!b->status) gb_fail(b, MS_EINTERNAL, "an expression is missing");
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        struct gx **k = gb_alloc(b, cap * sizeof *k);
        if (!k) return;
        if (l->n) memcpy(k, l->kids, l->n * sizeof *k);
        l->kids = k;
        l->cap = cap;
    }
    l->kids[l->n++] = x;
}

// ---- readers ----

bool gx_read_uint(const uint8_t **p, const uint8_t *end, uint32_t *v)
{
    const uint8_t *s = *p;
    uint64_t x = 0;
    while (*p < end && **p >= '0' && **p <= '9') {
        x = x * 10 + (uint64_t)(*(*p)++ - '0');
        if (x > UINT32_MAX - 1) x = UINT32_MAX - 1;
    }
    *v = (uint32_t)x;
    return *p > s;
}

bool gx_read_hex(const uint8_t **p, const uint8_t *end, int n, uint32_t *v)
{
    uint32_t x = 0;
    for (int i = 0; i < n; i++) {
        if (*p >= end) return false;
        uint8_t c = **p, l = c | 0x20;
        int d = c >= '0' && c <= '9' ? c - '0' : l >= 'a' && l <= 'f' ? l - 'a' + 10 : -1;
        if (d < 0) return false;
        (*p)++;
        x = x * 16 + (uint32_t)d;
    }
    *v = x;
    return true;
}

// ---- code-point classes ----

int cp_class_add(struct cp_class *c, uint32_t lo, uint32_t hi)
{
    if (lo > hi) return 0;
    if (hi > 0x10ffff) hi = 0x10ffff;
    if (lo > hi) return 0;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        struct cp_range *r = realloc(c->r, cap * sizeof *r);
        if (!r) return MS_ENOMEM;
        c->r = r;
        c->cap = cap;
    }
    c->r[c->n++] = (struct cp_range){lo, hi};
    return 0;
}

static int cp_range_cmp(const void *a, const void *b)
{
    const struct cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void cp_class_normalize(struct cp_class *c)
{
    if (c->n == 0) return;
    qsort(c->r, c->n, sizeof *c->r, cp_range_cmp);
    size_t k = 0;
    for (size_t i = 1; i < c->n; i++) {
        if (c->r[i].lo <= c->r[k].hi + 1) {
            if (c->r[i].hi > c->r[k].hi) c->r[k].hi = c->r[i].hi;
        } else {
            c->r[++k] = c->r[i];
        }
    }
    c->n = k + 1;
}

int cp_class_negate(struct cp_class *c)
{
    cp_class_normalize(c);
    struct cp_class out = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->r[i].lo > next && cp_class_add(&out, next, c->r[i].lo - 1)) goto fail;
        next = c->r[i].hi + 1;
    }
    if (next <= 0x10ffff && cp_class_add(&out, next, 0x10ffff)) goto fail;
    cp_class_free(c);
    *c = out;
    return 0;
fail:
    cp_class_free(&out);
    return MS_ENOMEM;
}

void cp_class_free(struct cp_class *c)
{
    free(c->r);
    memset(c, 0, sizeof *c);
}

// Encodes the bytes of cp, which needs exactly n bytes.
static void utf8_bytes_n(uint32_t cp, int n, uint8_t out[4])
{
    static const uint8_t lead[5] = {0, 0, 0xc0, 0xe0, 0xf0};
    for (int i = n - 1; i > 0; i--) {
        out[i] = (uint8_t)(0x80 | (cp & 0x3f));
        cp >>= 6;
    }
    out[0] = (uint8_t)(n == 1 ? cp : (lead[n] | cp));
}

// Appends to alts the byte-range sequences that match exactly [lo, hi]
// (which excludes surrogates): split at encoding-length boundaries, then
// wherever a continuation byte's range is not complete, until each piece
// is a product of byte ranges (as Go's regexp/syntax and utf8-ranges do).
static void utf8_range_expr(struct gbuild *b, struct gx_list *alts, uint32_t lo, uint32_t hi)
{
    static const uint32_t max_of_len[4] = {0x7f, 0x7ff, 0xffff, 0x10ffff};
    if (b->status || lo > hi) return;
    for (int i = 0; i < 3; i++) {
        if (lo <= max_of_len[i] && hi > max_of_len[i]) {
            utf8_range_expr(b, alts, lo, max_of_len[i]);
            utf8_range_expr(b, alts, max_of_len[i] + 1, hi);
            return;
        }
    }
    int n = hi <= 0x7f ? 1 : hi <= 0x7ff ? 2 : hi <= 0xffff ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range_expr(b, alts, lo, lo | m);
                utf8_range_expr(b, alts, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_range_expr(b, alts, lo, (hi & ~m) - 1);
                utf8_range_expr(b, alts, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t a[4], z[4];
    utf8_bytes_n(lo, n, a);
    utf8_bytes_n(hi, n, z);
    struct gx *parts[4];
    for (int i = 0; i < n; i++) parts[i] = gx_range(b, a[i], z[i]);
    gx_list_push(b, alts, gx_seqv(b, parts, (size_t)n));
}

struct gx *gx_utf8_class(struct gbuild *b, const struct cp_class *c)
{
    struct gx_list alts = {0};
    for (size_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi;
        // Surrogates are not scalar values: UTF-8 has no encoding for them.
        if (lo <= 0xdfff && hi >= 0xd800) {
            if (lo < 0xd800) utf8_range_expr(b, &alts, lo, 0xd7ff);
            if (hi > 0xdfff) utf8_range_expr(b, &alts, 0xe000, hi);
        } else {
            utf8_range_expr(b, &alts, lo, hi);
        }
    }
    if (b->status) return NULL;
    if (alts.n == 0) {
        gb_fail(b, MS_EINVAL, "a character class matches no character");
        return NULL;
    }
    return gx_altv(b, alts.kids, alts.n);
}

struct gx *gx_json_string_char(struct gbuild *b)
{
    struct cp_class c = {0};
    if (cp_class_add(&c, 0x20, 0x21) || cp_class_add(&c, 0x23, 0x5b) ||
        cp_class_add(&c, 0x5d, 0x10ffff)) {
        cp_class_free(&c);
        gb_fail(b, MS_ENOMEM, "out of memory while compiling the grammar");
        return NULL;
    }
    struct gx *plain = gx_utf8_class(b, &c);
    cp_class_free(&c);
    uint8_t hex[32] = {0}, esc[32] = {0}, not_d[32] = {0}, d[32] = {0}, below_8[32] = {0},
            high[32] = {0}, low[32] = {0};
    for (const char *p = "0123456789abcdefABCDEF"; *p; p++) gx_cls_set(hex, (uint8_t)*p);
    for (const char *p = "0123456789abcefABCEF"; *p; p++) gx_cls_set(not_d, (uint8_t)*p);
    for (const char *p = "dD"; *p; p++) gx_cls_set(d, (uint8_t)*p);
    for (const char *p = "01234567"; *p; p++) gx_cls_set(below_8, (uint8_t)*p);
    for (const char *p = "89abAB"; *p; p++) gx_cls_set(high, (uint8_t)*p);
    for (const char *p = "cdefCDEF"; *p; p++) gx_cls_set(low, (uint8_t)*p);
    for (const char *p = "\"\\/bfnrt"; *p; p++) gx_cls_set(esc, (uint8_t)*p);
    // \uXXXX outside D800-DFFF, or \uD8xx-\uDBxx followed by \uDCxx-\uDFxx.
    struct gx *bmp = gx_alt2(b, gx_seq2(b, gx_class(b, not_d), gx_repeat(b, gx_class(b, hex), 3, 3)),
                             gx_seq3(b, gx_class(b, d), gx_class(b, below_8),
                                     gx_repeat(b, gx_class(b, hex), 2, 2)));
    struct gx *pair = gx_seq3(b, gx_seq2(b, gx_class(b, d), gx_class(b, high)),
                              gx_repeat(b, gx_class(b, hex), 2, 2),
                              gx_seq3(b, gx_str(b, "\\u"), gx_seq2(b, gx_class(b, d), gx_class(b, low)),
                                      gx_repeat(b, gx_class(b, hex), 2, 2)));
    struct gx *u = gx_seq2(b, gx_byte(b, 'u'), gx_alt2(b, bmp, pair));
    struct gx *escape = gx_seq2(b, gx_byte(b, '\\'), gx_alt2(b, gx_class(b, esc), u));
    return gx_alt2(b, plain, escape);
}
