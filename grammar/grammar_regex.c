// grammar_regex: regular expressions (the ECMAScript subset JSON Schema's
// "pattern" and vLLM's structured_outputs.regex use) to expressions over
// UTF-8 bytes. Within a JSON string each character is spelled as JSON
// requires (a quote as \", a newline as \n). Constructs that are not
// regular or that we do not implement (lookaround, backreferences, word
// boundaries, Unicode properties, flags) are refused by name.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/utf8.h"
#include "grammar/grammar_internal.h"

#define REGEX_MAX_DEPTH 100

struct rx {
    struct gbuild *b;
    const uint8_t *p, *end, *start;
    bool json;  // spell characters as a JSON string body
    int depth;
};

static int rx_fail(struct rx *r, int code, const char *what)
{
    return gb_fail(r->b, code, "regex: %s at offset %zu", what, (size_t)(r->p - r->start));
}

static int cls_add(struct rx *r, struct cp_class *c, uint32_t lo, uint32_t hi)
{
    if (cp_class_add(c, lo, hi)) return gb_fail(r->b, MS_ENOMEM, "out of memory compiling a regex");
    return 0;
}

// \d \w \s and their negations into c.
static int cls_shorthand(struct rx *r, struct cp_class *c, uint8_t e)
{
    struct cp_class t = {0};
    int rc = 0;
    switch (e | 0x20) {
    case 'd':
        rc = cls_add(r, &t, '0', '9');
        break;
    case 'w':
        rc = cls_add(r, &t, '0', '9') || cls_add(r, &t, 'A', 'Z') || cls_add(r, &t, '_', '_') ||
             cls_add(r, &t, 'a', 'z');
        break;
    case 's': {
        static const uint32_t ws[][2] = {{9, 13}, {32, 32}, {0xa0, 0xa0}, {0x1680, 0x1680}, {0x2000, 0x200a},
                                         {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000},
                                         {0xfeff, 0xfeff}};
        for (size_t i = 0; i < sizeof ws / sizeof *ws && !rc; i++) rc = cls_add(r, &t, ws[i][0], ws[i][1]);
        break;
    }
    }
    if (!rc && e >= 'A' && e <= 'Z' && cp_class_negate(&t)) rc = gb_fail(r->b, MS_ENOMEM, "out of memory");
    for (size_t i = 0; i < t.n && !rc; i++) rc = cls_add(r, c, t.r[i].lo, t.r[i].hi);
    cp_class_free(&t);
    return rc;
}

static int hex_digits(struct rx *r, int n, uint32_t *out)
{
    return gx_read_hex(&r->p, r->end, n, out) ? 0 : rx_fail(r, MS_EINVAL, "a bad or truncated hex escape");
}

// After a backslash: one character (*cp) or a shorthand class added to c
// (*cp = UINT32_MAX). in_class: \b means backspace there.
static int rx_escape(struct rx *r, struct cp_class *c, uint32_t *cp, bool in_class)
{
    if (r->p >= r->end) return rx_fail(r, MS_EINVAL, "a pattern ending in a backslash");
    uint8_t e = *r->p++;
    *cp = UINT32_MAX;
    switch (e) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return cls_shorthand(r, c, e);
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hex_digits(r, 2, cp);
    case 'u':
        if (r->p < r->end && *r->p == '{') {
            r->p++;
            uint32_t v = 0;
            int n = 0;
            while (r->p < r->end && *r->p != '}' && n < 7) {
                uint32_t d;
                if (hex_digits(r, 1, &d)) return r->b->status;
                v = v * 16 + d;
                n++;
            }
            if (r->p >= r->end || *r->p != '}' || n == 0 || v > 0x10ffff)
                return rx_fail(r, MS_EINVAL, "a bad \\u{...} escape");
            r->p++;
            *cp = v;
            return 0;
        }
        return hex_digits(r, 4, cp);
    case 'b':
        if (in_class) {
            *cp = 8;
            return 0;
        }
        return rx_fail(r, MS_EUNSUPPORTED, "word boundaries (\\b) are not supported");
    case 'B':
        return rx_fail(r, MS_EUNSUPPORTED, "\\B is not supported");
    case 'p': case 'P':
        return rx_fail(r, MS_EUNSUPPORTED, "Unicode property classes (\\p) are not supported");
    case 'c':
        return rx_fail(r, MS_EUNSUPPORTED, "control escapes (\\c) are not supported");
    case 'k':
        return rx_fail(r, MS_EUNSUPPORTED, "named backreferences are not supported");
    default:
        if (e >= '1' && e <= '9') return rx_fail(r, MS_EUNSUPPORTED, "backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return rx_fail(r, MS_EINVAL, "an unknown escape");
        if (e >= 0x80) {
            r->p--;
            uint32_t v;
            r->p += utf8_decode(r->p, (size_t)(r->end - r->p), &v);
            *cp = v;
            return 0;
        }
        *cp = e;
        return 0;
    }
}

static int rx_char(struct rx *r, uint32_t *cp)
{
    size_t n = utf8_decode(r->p, (size_t)(r->end - r->p), cp);
    if (*cp == UTF8_REPLACEMENT && !(n == 3 && r->p[0] == 0xef))
        return rx_fail(r, MS_EFORMAT, "the pattern is not valid UTF-8");
    r->p += n;
    return 0;
}

static int rx_class(struct rx *r, struct cp_class *c)
{
    bool neg = r->p < r->end && *r->p == '^';
    if (neg) r->p++;
    bool first = true;
    for (;;) {
        if (r->p >= r->end) return rx_fail(r, MS_EINVAL, "an unterminated character class");
        if (*r->p == ']' && !first) break;
        first = false;
        uint32_t lo;
        if (*r->p == '\\') {
            r->p++;
            if (rx_escape(r, c, &lo, true)) return r->b->status;
            if (lo == UINT32_MAX) continue;
        } else if (*r->p == '[' && r->p + 1 < r->end && (r->p[1] == ':' || r->p[1] == '=' || r->p[1] == '.')) {
            return rx_fail(r, MS_EUNSUPPORTED, "POSIX classes ([:alpha:]) are not supported");
        } else if (rx_char(r, &lo)) {
            return r->b->status;
        }
        uint32_t hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if (rx_escape(r, c, &hi, true)) return r->b->status;
                if (hi == UINT32_MAX) return rx_fail(r, MS_EINVAL, "a class shorthand as a range end");
            } else if (rx_char(r, &hi)) {
                return r->b->status;
            }
            if (hi < lo) return rx_fail(r, MS_EINVAL, "a character range out of order");
        }
        if (cls_add(r, c, lo, hi)) return r->b->status;
    }
    r->p++;
    cp_class_normalize(c);
    if (neg && cp_class_negate(c)) return gb_fail(r->b, MS_ENOMEM, "out of memory compiling a regex");
    return 0;
}

// One code point class as bytes: raw UTF-8, or as a JSON string spells it.
static struct gx *class_expr(struct gbuild *b, struct cp_class *c, bool json)
{
    cp_class_normalize(c);
    if (!json) return gx_utf8_class(b, c);
    struct cp_class plain = {0};
    struct gx_list alts = {0};
    for (size_t i = 0; i < c->n; i++) {
        for (uint32_t x = c->r[i].lo; x <= c->r[i].hi && x < 0x20; x++) {
            static const char short_esc[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
            char buf[8];
            if (x < sizeof short_esc && short_esc[x])
                snprintf(buf, sizeof buf, "\\%c", short_esc[x]);
            else
                snprintf(buf, sizeof buf, "\\u%04x", (unsigned)x);
            gx_list_push(b, &alts, gx_str(b, buf));
        }
        uint32_t lo = c->r[i].lo < 0x20 ? 0x20 : c->r[i].lo, hi = c->r[i].hi;
        for (uint32_t q = lo; q <= hi;) {
            // cut out '"' and '\\'
            uint32_t stop = hi;
            if (q <= '"' && hi >= '"') stop = q == '"' ? '"' : '"' - 1;
            else if (q <= '\\' && hi >= '\\') stop = q == '\\' ? '\\' : '\\' - 1;
            if (q == '"' || q == '\\') {
                gx_list_push(b, &alts, gx_str(b, q == '"' ? "\\\"" : "\\\\"));
            } else if (cp_class_add(&plain, q, stop)) {
                cp_class_free(&plain);
                gb_fail(b, MS_ENOMEM, "out of memory compiling a regex");
                return NULL;
            }
            if (stop == 0x10ffff) break;
            q = stop + 1;
        }
    }
    if (plain.n) gx_list_push(b, &alts, gx_utf8_class(b, &plain));
    cp_class_free(&plain);
    if (b->status) return NULL;
    return gx_altv(b, alts.kids, alts.n);
}

static struct gx *rx_alt(struct rx *r, bool top);

// {n}, {n,}, {n,m} at r->p (on '{'); false (r->p unchanged) when it is not one.
static bool rx_braces(struct rx *r, uint32_t *min, uint32_t *max)
{
    const uint8_t *save = r->p;
    r->p++;
    if (!gx_read_uint(&r->p, r->end, min)) goto no;
    *max = *min;
    if (r->p < r->end && *r->p == ',') {
        r->p++;
        if (!gx_read_uint(&r->p, r->end, max)) *max = GX_INF;
    }
    if (r->p >= r->end || *r->p != '}') goto no;
    r->p++;
    return true;
no:
    r->p = save;
    return false;
}

static struct gx *rx_atom(struct rx *r)
{
    struct gbuild *b = r->b;
    uint8_t c = *r->p;
    if (c == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') {
                r->p += 2;
            } else if (r->p + 1 < r->end && r->p[1] == '<' && r->p + 2 < r->end && r->p[2] != '=' && r->p[2] != '!') {
                const uint8_t *close = memchr(r->p, '>', (size_t)(r->end - r->p));
                if (!close) return rx_fail(r, MS_EINVAL, "an unterminated group name"), NULL;
                r->p = close + 1;
            } else if (r->p + 1 < r->end && (r->p[1] == '=' || r->p[1] == '!' || r->p[1] == '<')) {
                return rx_fail(r, MS_EUNSUPPORTED, "lookaround assertions are not supported"), NULL;
            } else {
                return rx_fail(r, MS_EUNSUPPORTED, "inline flags and other (? groups are not supported"), NULL;
            }
        }
        if (++r->depth > REGEX_MAX_DEPTH) return rx_fail(r, MS_ENOFIT, "groups nested too deeply"), NULL;
        struct gx *x = rx_alt(r, false);
        r->depth--;
        if (!x) return NULL;
        if (r->p >= r->end || *r->p != ')') return rx_fail(r, MS_EINVAL, "an unbalanced parenthesis"), NULL;
        r->p++;
        return x;
    }
    struct cp_class cls = {0};
    struct gx *x = NULL;
    if (c == '[') {
        r->p++;
        if (!rx_class(r, &cls)) x = class_expr(b, &cls, r->json);
    } else if (c == '.') {
        r->p++;
        if (!cls_add(r, &cls, '\n', '\n') && !cls_add(r, &cls, '\r', '\r') && !cls_add(r, &cls, 0x2028, 0x2029) &&
            !cp_class_negate(&cls))
            x = class_expr(b, &cls, r->json);
    } else if (c == '\\') {
        r->p++;
        uint32_t cp;
        if (!rx_escape(r, &cls, &cp, false)) {
            if (cp != UINT32_MAX && cls_add(r, &cls, cp, cp)) goto out;
            x = class_expr(b, &cls, r->json);
        }
    } else if (c == '*' || c == '+' || c == '?') {
        rx_fail(r, MS_EINVAL, "nothing to repeat");
    } else if (c == '^' || c == '$') {
        rx_fail(r, MS_EUNSUPPORTED, "anchors are supported only at the start and end of the pattern");
    } else {
        uint32_t cp;
        if (!rx_char(r, &cp) && !cls_add(r, &cls, cp, cp)) x = class_expr(b, &cls, r->json);
    }
out:
    cp_class_free(&cls);
    return x;
}

static struct gx *rx_seq(struct rx *r, bool top, bool *anchored_end)
{
    struct gx_list items = {0};
    *anchored_end = false;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (top && *r->p == '$' && (r->p + 1 == r->end || r->p[1] == '|')) {
            r->p++; // the end anchor: the match ends here anyway
            *anchored_end = true;
            continue;
        }
        struct gx *x = rx_atom(r);
        if (!x) return NULL;
        for (;;) {
            uint32_t min, max;
            if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?')) {
                min = *r->p == '+';
                max = *r->p == '?' ? 1 : GX_INF;
                r->p++;
            } else if (r->p + 1 < r->end && r->p[0] == '{' && r->p[1] == ',') {
                // Python reads {,n} as {0,n}, JavaScript as text (or an
                // error): refused rather than guessed.
                return rx_fail(r, MS_EINVAL, "a repetition {,n} (write {0,n})"), NULL;
            } else if (r->p < r->end && *r->p == '{' && rx_braces(r, &min, &max)) {
                if (min > GRAMMAR_MAX_REPEAT || (max != GX_INF && max > GRAMMAR_MAX_REPEAT))
                    return rx_fail(r, MS_ENOFIT, "a repetition bound above the limit"), NULL;
            } else {
                break;
            }
            if (r->p < r->end && *r->p == '?') r->p++; // lazy: the same language
            if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?'))
                return rx_fail(r, MS_EINVAL, "nothing to repeat"), NULL;
            x = gx_repeat(r->b, x, min, max);
            if (!x) return NULL;
            break;
        }
        gx_list_push(r->b, &items, x);
    }
    return gx_seqv(r->b, items.kids, items.n);
}

// In a JSON string, a pattern matches anywhere unless anchored: an
// unanchored side is padded with any string characters.
static struct gx *rx_alt(struct rx *r, bool top)
{
    struct gx_list alts = {0};
    for (;;) {
        bool anchored_start = false;
        if (top && r->p < r->end && *r->p == '^') {
            r->p++;
            anchored_start = true;
        }
        bool anchored_end;
        struct gx *x = rx_seq(r, top, &anchored_end);
        if (!x) return NULL;
        if (top && r->json) {
            struct gx *any = gx_star(r->b, gx_json_string_char(r->b));
            x = gx_seq3(r->b, anchored_start ? gx_empty(r->b) : any, x, anchored_end ? gx_empty(r->b) : any);
        }
        gx_list_push(r->b, &alts, x);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        break;
    }
    if (r->b->status) return NULL;
    return gx_altv(r->b, alts.kids, alts.n);
}

struct gx *grammar_regex_expr(struct gbuild *b, const char *pat, size_t len, bool json_string)
{
    struct rx r = {.b = b, .p = (const uint8_t *)pat, .end = (const uint8_t *)pat + len,
                   .start = (const uint8_t *)pat, .json = json_string};
    struct gx *x = rx_alt(&r, true);
    if (x && r.p < r.end) {
        rx_fail(&r, MS_EINVAL, "an unbalanced parenthesis");
        return NULL;
    }
    return x;
}

int grammar_regex_build(struct gbuild *b, const char *text, size_t len, int *root)
{
    struct gx *x = grammar_regex_expr(b, text, len, false);
    *root = gb_rule_new(b, "root");
    gb_rule_set(b, *root, x);
    return b->status;
}
