// grammar_gbnf: llama.cpp's GBNF (rules `name ::= ...`, "literals",
// [classes], ( groups ), . and the quantifiers * + ? {m,n}) to expressions.
// The start rule is "root". Token references (<...>) are refused.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/utf8.h"
#include "grammar/grammar_internal.h"

#define GBNF_MAX_DEPTH 100

struct gp {
    struct gbuild *b;
    const uint8_t *p, *end, *start;
    int depth;
    uint8_t *defined; // per rule: defined already
    size_t cap_defined;
};

static int gp_fail(struct gp *g, int code, const char *what)
{
    // the line of the failure, for the sentence
    int line = 1;
    for (const uint8_t *q = g->start; q < g->p && q < g->end; q++) line += *q == '\n';
    return gb_fail(g->b, code, "%s at line %d", what, line);
}

static bool word_char(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// Skips blanks and comments; newlines too when nl_ok.
static void gp_space(struct gp *g, bool nl_ok)
{
    while (g->p < g->end) {
        uint8_t c = *g->p;
        if (c == ' ' || c == '\t' || (nl_ok && (c == '\n' || c == '\r'))) {
            g->p++;
        } else if (c == '#') {
            while (g->p < g->end && *g->p != '\n') g->p++;
        } else {
            break;
        }
    }
}

static int gp_hex(struct gp *g, int n, uint32_t *out)
{
    if (!gx_read_hex(&g->p, g->end, n, out)) return gp_fail(g, MS_EINVAL, "a bad or truncated hex escape");
    if (*out > 0x10ffff) return gp_fail(g, MS_EINVAL, "an escape beyond U+10FFFF");
    return 0;
}

// One character of a literal or class: an escape or a UTF-8 character.
static int gp_char(struct gp *g, uint32_t *cp)
{
    if (g->p >= g->end) return gp_fail(g, MS_EINVAL, "unexpected end of grammar");
    if (*g->p != '\\') {
        size_t n = utf8_decode(g->p, (size_t)(g->end - g->p), cp);
        if (*cp == UTF8_REPLACEMENT && !(n == 3 && g->p[0] == 0xef)) return gp_fail(g, MS_EFORMAT, "invalid UTF-8");
        g->p += n;
        return 0;
    }
    g->p++;
    if (g->p >= g->end) return gp_fail(g, MS_EINVAL, "a grammar ending in a backslash");
    uint8_t e = *g->p++;
    switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': *cp = e; return 0;
    case 'x': return gp_hex(g, 2, cp);
    case 'u': return gp_hex(g, 4, cp);
    case 'U': return gp_hex(g, 8, cp);
    }
    return gp_fail(g, MS_EINVAL, "an unknown escape");
}

static int gp_rule_ref(struct gp *g, const uint8_t *name, size_t len)
{
    int r = gb_rule_find(g->b, (const char *)name, len);
    if (r >= 0) return r;
    char buf[128];
    if (len >= sizeof buf) return gp_fail(g, MS_EINVAL, "a rule name longer than 127 bytes"), -1;
    memcpy(buf, name, len);
    buf[len] = 0;
    return gb_rule_new(g->b, buf);
}

static struct gx *gp_alternates(struct gp *g);

static struct gx *gp_literal(struct gp *g)
{
    struct gbuild *b = g->b;
    g->p++; // opening quote
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    while (g->p < g->end && *g->p != '"') {
        uint32_t cp;
        if (gp_char(g, &cp)) goto fail;
        if (n + 4 > cap) {
            size_t c = cap ? 2 * cap : 64;
            uint8_t *nb = realloc(buf, c);
            if (!nb) {
                gb_fail(b, MS_ENOMEM, "out of memory parsing a grammar");
                goto fail;
            }
            buf = nb;
            cap = c;
        }
        n += utf8_encode(cp, buf + n);
    }
    if (g->p >= g->end) {
        gp_fail(g, MS_EINVAL, "an unterminated string literal");
        goto fail;
    }
    g->p++;
    gb_note_literal(b, buf, n);
    struct gx *x = gx_lit(b, buf, n);
    free(buf);
    return x;
fail:
    free(buf);
    return NULL;
}

static struct gx *gp_class(struct gp *g)
{
    g->p++; // [
    bool neg = g->p < g->end && *g->p == '^';
    if (neg) g->p++;
    struct cp_class c = {0};
    struct gx *x = NULL;
    while (g->p < g->end && *g->p != ']') {
        uint32_t lo, hi;
        if (gp_char(g, &lo)) goto out;
        hi = lo;
        if (g->p + 1 < g->end && *g->p == '-' && g->p[1] != ']') {
            g->p++;
            if (gp_char(g, &hi)) goto out;
            if (hi < lo) {
                gp_fail(g, MS_EINVAL, "a character range out of order");
                goto out;
            }
        }
        if (cp_class_add(&c, lo, hi)) {
            gb_fail(g->b, MS_ENOMEM, "out of memory parsing a grammar");
            goto out;
        }
    }
    if (g->p >= g->end) {
        gp_fail(g, MS_EINVAL, "an unterminated character class");
        goto out;
    }
    g->p++;
    cp_class_normalize(&c);
    if (neg && cp_class_negate(&c)) {
        gb_fail(g->b, MS_ENOMEM, "out of memory parsing a grammar");
        goto out;
    }
    x = gx_utf8_class(g->b, &c);
out:
    cp_class_free(&c);
    return x;
}

static struct gx *gp_quantify(struct gp *g, struct gx *x, bool nested)
{
    struct gbuild *b = g->b;
    for (;;) {
        if (g->p >= g->end) return x;
        uint8_t c = *g->p;
        uint32_t min, max;
        if (c == '*' || c == '+' || c == '?') {
            g->p++;
            min = c == '+';
            max = c == '?' ? 1 : GX_INF;
        } else if (c == '{') {
            g->p++;
            gp_space(g, nested);
            bool has_min = gx_read_uint(&g->p, g->end, &min);
            if (!has_min) min = 0;
            gp_space(g, nested);
            max = min;
            if (g->p < g->end && *g->p == ',') {
                g->p++;
                gp_space(g, nested);
                if (!gx_read_uint(&g->p, g->end, &max)) max = GX_INF;
                gp_space(g, nested);
            } else if (!has_min) {
                return gp_fail(g, MS_EINVAL, "a bad repetition {}"), NULL;
            }
            if (g->p >= g->end || *g->p != '}') return gp_fail(g, MS_EINVAL, "an unterminated repetition {"), NULL;
            g->p++;
        } else {
            return x;
        }
        x = gx_repeat(b, x, min, max);
        if (!x) return NULL;
        gp_space(g, nested);
    }
}

static struct gx *gp_sequence(struct gp *g, bool nested)
{
    struct gbuild *b = g->b;
    struct gx_list items = {0};
    for (;;) {
        gp_space(g, nested);
        if (g->p >= g->end) break;
        uint8_t c = *g->p;
        struct gx *x;
        if (c == '"') {
            x = gp_literal(g);
        } else if (c == '[') {
            x = gp_class(g);
        } else if (c == '.') {
            g->p++;
            struct cp_class all = {0};
            if (cp_class_add(&all, 0, 0x10ffff)) return gb_fail(b, MS_ENOMEM, "out of memory"), NULL;
            x = gx_utf8_class(b, &all);
            cp_class_free(&all);
        } else if (c == '(') {
            g->p++;
            if (++g->depth > GBNF_MAX_DEPTH) return gp_fail(g, MS_ENOFIT, "groups nested too deeply"), NULL;
            x = gp_alternates(g);
            g->depth--;
            if (!x) return NULL;
            gp_space(g, true);
            if (g->p >= g->end || *g->p != ')') return gp_fail(g, MS_EINVAL, "an unbalanced parenthesis"), NULL;
            g->p++;
        } else if (c == '<') {
            return gp_fail(g, MS_EUNSUPPORTED, "token references (<...>) are not supported"), NULL;
        } else if (word_char(c)) {
            const uint8_t *s = g->p;
            while (g->p < g->end && word_char(*g->p)) g->p++;
            // a name followed by ::= starts the next rule
            const uint8_t *save = g->p;
            gp_space(g, false);
            if (!nested && g->end - g->p >= 3 && memcmp(g->p, "::=", 3) == 0) {
                g->p = s;
                break;
            }
            g->p = save;
            x = gx_call(b, gp_rule_ref(g, s, (size_t)(save - s)));
        } else {
            break;
        }
        if (!x) return NULL;
        gp_space(g, nested);
        x = gp_quantify(g, x, nested);
        if (!x) return NULL;
        gx_list_push(b, &items, x);
    }
    return gx_seqv(b, items.kids, items.n);
}

static struct gx *gp_alternates(struct gp *g)
{
    bool nested = g->depth > 0;
    struct gx_list alts = {0};
    for (;;) {
        gx_list_push(g->b, &alts, gp_sequence(g, nested));
        if (g->b->status) return NULL;
        gp_space(g, nested);
        if (!nested && g->p < g->end && (*g->p == '\n' || *g->p == '\r')) {
            const uint8_t *save = g->p;
            gp_space(g, true);
            if (g->p >= g->end || *g->p != '|') g->p = save;
        }
        if (g->p < g->end && *g->p == '|') {
            g->p++;
            continue;
        }
        break;
    }
    return gx_altv(g->b, alts.kids, alts.n);
}

int grammar_gbnf_build(struct gbuild *b, const char *text, size_t len, int *root)
{
    struct gp g = {.b = b, .p = (const uint8_t *)text, .end = (const uint8_t *)text + len,
                   .start = (const uint8_t *)text};
    uint8_t *defined = NULL;
    for (;;) {
        gp_space(&g, true);
        if (g.p >= g.end) break;
        const uint8_t *s = g.p;
        while (g.p < g.end && word_char(*g.p)) g.p++;
        if (g.p == s) {
            gp_fail(&g, MS_EINVAL, "expected a rule name");
            break;
        }
        int r = gp_rule_ref(&g, s, (size_t)(g.p - s));
        if (r < 0) break;
        gp_space(&g, false);
        if (g.end - g.p < 3 || memcmp(g.p, "::=", 3) != 0) {
            // "start: ..." is Lark's rule syntax, which vLLM also takes.
            gp_fail(&g, MS_EINVAL, g.p < g.end && *g.p == ':' ? "expected ::= after a rule name (a Lark grammar? only "
                                                                 "GBNF is taken: root ::= ...)"
                                                               : "expected ::= after a rule name");
            break;
        }
        g.p += 3;
        gp_space(&g, true); // the body may start on the next line
        uint8_t *d = realloc(defined, (size_t)b->n_rules);
        if (!d) {
            gb_fail(b, MS_ENOMEM, "out of memory parsing a grammar");
            break;
        }
        for (size_t i = g.cap_defined; i < (size_t)b->n_rules; i++) d[i] = 0;
        defined = d;
        g.cap_defined = (size_t)b->n_rules;
        if (defined[r]) {
            gp_fail(&g, MS_EINVAL, "a rule defined twice");
            break;
        }
        defined[r] = 1;
        struct gx *body = gp_alternates(&g);
        if (!body) break;
        gb_rule_set(b, r, body);
        gp_space(&g, false);
        if (g.p < g.end && *g.p != '\n' && *g.p != '\r') {
            gp_fail(&g, MS_EINVAL, "unexpected character");
            break;
        }
    }
    free(defined);
    if (b->status) return b->status;
    *root = gb_rule_find(b, "root", 4);
    if (*root < 0 || !b->rules[*root].body) return gb_fail(b, MS_EINVAL, "the grammar has no rule 'root'");
    for (int r = 0; r < b->n_rules; r++)
        if (!b->rules[r].body) return gb_fail(b, MS_EINVAL, "rule '%s' is used but not defined", b->rules[r].name);
    return 0;
}
