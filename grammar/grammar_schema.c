// grammar_schema: JSON Schema (the subset grammar.h lists) to expressions.
// Objects, arrays and scalars are inlined where they appear; $ref targets
// become rules (so recursion works); strings without constraints share one
// rule, and "any JSON value" is a small set of shared rules. Every keyword
// is looked up in one table: annotations are ignored, supported keywords
// are honoured exactly, the rest are refused by name.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/utf8.h"
#include "grammar/grammar_internal.h"

enum kw_class { KW_ANNOTATION, KW_GENERAL, KW_OBJECT, KW_ARRAY, KW_STRING, KW_NUMBER, KW_UNSUPPORTED };

static const struct {
    const char *name;
    enum kw_class cls;
} keywords[] = {
    {"title", KW_ANNOTATION}, {"description", KW_ANNOTATION}, {"$schema", KW_ANNOTATION},
    {"$id", KW_ANNOTATION}, {"$comment", KW_ANNOTATION}, {"default", KW_ANNOTATION},
    {"examples", KW_ANNOTATION}, {"deprecated", KW_ANNOTATION}, {"readOnly", KW_ANNOTATION},
    {"writeOnly", KW_ANNOTATION}, {"contentEncoding", KW_ANNOTATION}, {"contentMediaType", KW_ANNOTATION},
    {"$defs", KW_ANNOTATION}, {"definitions", KW_ANNOTATION}, {"strict", KW_ANNOTATION},
    {"type", KW_GENERAL}, {"enum", KW_GENERAL}, {"const", KW_GENERAL}, {"anyOf", KW_GENERAL},
    {"oneOf", KW_GENERAL}, {"allOf", KW_GENERAL}, {"$ref", KW_GENERAL},
    {"properties", KW_OBJECT}, {"required", KW_OBJECT}, {"additionalProperties", KW_OBJECT},
    {"items", KW_ARRAY}, {"prefixItems", KW_ARRAY}, {"minItems", KW_ARRAY}, {"maxItems", KW_ARRAY},
    {"additionalItems", KW_ARRAY}, {"uniqueItems", KW_ARRAY},
    {"pattern", KW_STRING}, {"format", KW_STRING}, {"minLength", KW_STRING}, {"maxLength", KW_STRING},
    {"minimum", KW_NUMBER}, {"maximum", KW_NUMBER}, {"exclusiveMinimum", KW_NUMBER},
    {"exclusiveMaximum", KW_NUMBER},
    {"not", KW_UNSUPPORTED}, {"if", KW_UNSUPPORTED}, {"then", KW_UNSUPPORTED}, {"else", KW_UNSUPPORTED},
    {"dependentRequired", KW_UNSUPPORTED}, {"dependentSchemas", KW_UNSUPPORTED},
    {"dependencies", KW_UNSUPPORTED}, {"patternProperties", KW_UNSUPPORTED},
    {"propertyNames", KW_UNSUPPORTED}, {"unevaluatedProperties", KW_UNSUPPORTED},
    {"unevaluatedItems", KW_UNSUPPORTED}, {"contains", KW_UNSUPPORTED}, {"minContains", KW_UNSUPPORTED},
    {"maxContains", KW_UNSUPPORTED}, {"minProperties", KW_UNSUPPORTED}, {"maxProperties", KW_UNSUPPORTED},
    {"multipleOf", KW_UNSUPPORTED}, {"$dynamicRef", KW_UNSUPPORTED}, {"$recursiveRef", KW_UNSUPPORTED},
    {"$dynamicAnchor", KW_UNSUPPORTED}, {"$recursiveAnchor", KW_UNSUPPORTED}, {"$anchor", KW_UNSUPPORTED},
};

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

static const struct {
    const char *name;
    int bit;
} type_names[] = {{"null", T_NULL},   {"boolean", T_BOOL}, {"integer", T_INT}, {"number", T_NUM},
                  {"string", T_STR},  {"array", T_ARR},    {"object", T_OBJ}};

struct ref_memo {
    json_t *target;
    int rule;
};

struct sc {
    struct gbuild *b;
    json_t *doc;
    struct ref_memo *refs;
    size_t n_refs, cap_refs;
    int r_string, r_value, r_object, r_array; // shared rules, -1 until made
};

#define ARRAY_RULE_ABOVE 4 // item counts above this call the item as a rule

static struct gx *sc_value(struct sc *s, json_t *sch, int depth);

static enum kw_class kw_lookup(const char *k)
{
    for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++)
        if (strcmp(keywords[i].name, k) == 0) return keywords[i].cls;
    return KW_ANNOTATION; // unknown keywords are annotations in JSON Schema
}

static struct gx *fail(struct sc *s, int code, const char *fmt, const char *arg)
{
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg);
    gb_fail(s->b, code, "%s", msg);
    return NULL;
}

// ---- pieces of JSON syntax ----

static struct gx *ws(struct sc *s)
{
    if (s->b->json_compact) return gx_empty(s->b);
    uint8_t cls[32] = {0};
    gx_cls_set(cls, ' ');
    gx_cls_set(cls, '\t');
    gx_cls_set(cls, '\n');
    gx_cls_set(cls, '\r');
    return gx_repeat(s->b, gx_class(s->b, cls), 0, GRAMMAR_JSON_MAX_WS);
}

// ws c ws
static struct gx *punct(struct sc *s, char c)
{
    if (s->b->json_compact) return gx_str(s->b, c == ',' ? ", " : c == ':' ? ": " : (char[]){c, 0});
    return gx_seq3(s->b, ws(s), gx_byte(s->b, (uint8_t)c), ws(s));
}

static struct gx *json_literal(struct sc *s, json_t *v)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return fail(s, MS_ENOMEM, "out of memory%s", "");
    struct gx *x = gx_str(s->b, text);
    free(text);
    return x;
}

static struct gx *digits(struct sc *s, uint32_t min, uint32_t max)
{
    return gx_repeat(s->b, gx_range(s->b, '0', '9'), min, max);
}

static int shared_rule(struct sc *s, int *slot, const char *name, struct gx *(*body)(struct sc *));

static struct gx *string_body(struct sc *s)
{
    return gx_seq3(s->b, gx_byte(s->b, '"'), gx_star(s->b, gx_json_string_char(s->b)), gx_byte(s->b, '"'));
}

static struct gx *any_string(struct sc *s)
{
    return gx_call(s->b, shared_rule(s, &s->r_string, "string", string_body));
}

// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? with bounded digit runs
static struct gx *number_any(struct sc *s, bool integer)
{
    struct gbuild *b = s->b;
    struct gx *intpart = gx_alt2(b, gx_byte(b, '0'),
                                 gx_seq2(b, gx_range(b, '1', '9'), digits(s, 0, GRAMMAR_JSON_MAX_DIGITS - 1)));
    struct gx *x = gx_seq2(b, gx_opt(b, gx_byte(b, '-')), intpart);
    if (integer) return x;
    uint8_t e[32] = {0}, pm[32] = {0};
    gx_cls_set(e, 'e');
    gx_cls_set(e, 'E');
    gx_cls_set(pm, '+');
    gx_cls_set(pm, '-');
    struct gx *frac = gx_opt(b, gx_seq2(b, gx_byte(b, '.'), digits(s, 1, GRAMMAR_JSON_MAX_DIGITS)));
    // Two exponent digits: 20 digits and e99 stay within a double, where
    // e400 is a number our own tool-call parser (jansson) refuses.
    struct gx *exp = gx_opt(b, gx_seq3(b, gx_class(b, e), gx_opt(b, gx_class(b, pm)), digits(s, 1, 2)));
    return gx_seq3(b, x, frac, exp);
}

// ---- "any JSON value": shared rules ----

static struct gx *value_body(struct sc *s);

static struct gx *object_any_body(struct sc *s)
{
    struct gbuild *b = s->b;
    int value = shared_rule(s, &s->r_value, "value", value_body);
    struct gx *member = gx_seq3(b, any_string(s), punct(s, ':'), gx_call(b, value));
    struct gx *members = gx_seq2(b, member, gx_star(b, gx_seq2(b, punct(s, ','), member)));
    return gx_seq3(b, gx_seq2(b, gx_byte(b, '{'), ws(s)), gx_opt(b, gx_seq2(b, members, ws(s))), gx_byte(b, '}'));
}

static struct gx *array_any_body(struct sc *s)
{
    struct gbuild *b = s->b;
    struct gx *value = gx_call(b, shared_rule(s, &s->r_value, "value", value_body));
    struct gx *items = gx_seq2(b, value, gx_star(b, gx_seq2(b, punct(s, ','), value)));
    return gx_seq3(b, gx_seq2(b, gx_byte(b, '['), ws(s)), gx_opt(b, gx_seq2(b, items, ws(s))), gx_byte(b, ']'));
}

static struct gx *value_body(struct sc *s)
{
    struct gbuild *b = s->b;
    struct gx *k[] = {
        gx_call(b, shared_rule(s, &s->r_object, "object", object_any_body)),
        gx_call(b, shared_rule(s, &s->r_array, "array", array_any_body)),
        any_string(s),
        number_any(s, false),
        gx_str(b, "true"),
        gx_str(b, "false"),
        gx_str(b, "null"),
    };
    return gx_altv(b, k, sizeof k / sizeof *k);
}

// The rule in *slot, made on first use (its body may use the rule itself).
static int shared_rule(struct sc *s, int *slot, const char *name, struct gx *(*body)(struct sc *))
{
    if (*slot >= 0) return *slot;
    *slot = gb_rule_new(s->b, name);
    if (*slot < 0) return -1;
    gb_rule_set(s->b, *slot, body(s));
    return *slot;
}

static struct gx *any_value(struct sc *s)
{
    return gx_call(s->b, shared_rule(s, &s->r_value, "value", value_body));
}

// ---- integers and numbers with bounds ----

static int ndigits(uint64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

// Decimal strings of equal length from lo to hi (inclusive).
static struct gx *same_len_range(struct sc *s, const char *lo, const char *hi, size_t n)
{
    struct gbuild *b = s->b;
    if (n == 0) return gx_empty(b);
    if (n == 1) return gx_range(b, (uint8_t)lo[0], (uint8_t)hi[0]);
    if (lo[0] == hi[0]) return gx_seq2(b, gx_byte(b, (uint8_t)lo[0]), same_len_range(s, lo + 1, hi + 1, n - 1));
    bool lo_zeros = strspn(lo + 1, "0") >= n - 1, hi_nines = strspn(hi + 1, "9") >= n - 1;
    char nines[24], zeros[24];
    memset(nines, '9', n - 1);
    memset(zeros, '0', n - 1);
    nines[n - 1] = zeros[n - 1] = 0;
    struct gx_list alts = {0};
    char first_lo = lo[0], first_hi = hi[0];
    if (!lo_zeros) {
        gx_list_push(b, &alts, gx_seq2(b, gx_byte(b, (uint8_t)lo[0]), same_len_range(s, lo + 1, nines, n - 1)));
        first_lo++;
    }
    if (!hi_nines) first_hi--;
    if (first_lo <= first_hi)
        gx_list_push(b, &alts, gx_seq2(b, gx_range(b, (uint8_t)first_lo, (uint8_t)first_hi), digits(s, (uint32_t)n - 1, (uint32_t)n - 1)));
    if (!hi_nines)
        gx_list_push(b, &alts, gx_seq2(b, gx_byte(b, (uint8_t)hi[0]), same_len_range(s, zeros, hi + 1, n - 1)));
    return gx_altv(b, alts.kids, alts.n);
}

// Non-negative integers lo..hi without leading zeros; hi_inf: no upper
// bound (up to GRAMMAR_JSON_MAX_DIGITS digits).
static struct gx *uint_range(struct sc *s, uint64_t lo, uint64_t hi, bool hi_inf)
{
    struct gbuild *b = s->b;
    struct gx_list alts = {0};
    int dl = ndigits(lo), dh = hi_inf ? GRAMMAR_JSON_MAX_DIGITS : ndigits(hi);
    if (dl > dh) return NULL;
    for (int d = dl; d <= dh; d++) {
        uint64_t pow = 1;
        for (int i = 1; i < d; i++) pow *= 10;
        uint64_t a = d == 1 ? 0 : pow;
        if (a < lo) a = lo;
        if (hi_inf && d > 19) {
            // beyond uint64: every d-digit number
            gx_list_push(b, &alts, gx_seq2(b, gx_range(b, '1', '9'), digits(s, (uint32_t)d - 1, (uint32_t)d - 1)));
            continue;
        }
        uint64_t z = d >= 20 ? UINT64_MAX : pow * 10 - 1;
        if (!hi_inf && z > hi) z = hi;
        if (a > z) continue;
        char as[24], zs[24];
        snprintf(as, sizeof as, "%llu", (unsigned long long)a);
        snprintf(zs, sizeof zs, "%llu", (unsigned long long)z);
        gx_list_push(b, &alts, same_len_range(s, as, zs, (size_t)d));
    }
    if (!alts.n) return NULL;
    return gx_altv(b, alts.kids, alts.n);
}

struct bound {
    bool set, excl;
    double v;
};

static int read_bounds(struct sc *s, json_t *sch, struct bound *lo, struct bound *hi)
{
    const char *names[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    memset(lo, 0, sizeof *lo);
    memset(hi, 0, sizeof *hi);
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(sch, names[i]);
        if (!v) continue;
        if (json_is_boolean(v))
            return fail(s, MS_EUNSUPPORTED, "%s as a boolean (draft 4) is not supported", names[i]), -1;
        if (!json_is_number(v)) return fail(s, MS_EINVAL, "%s is not a number", names[i]), -1;
        double x = json_number_value(v);
        if (!isfinite(x) || fabs(x) > 9e18) return fail(s, MS_EUNSUPPORTED, "%s beyond +-9e18 is not supported", names[i]), -1;
        struct bound *bd = i < 2 ? lo : hi;
        bool excl = i & 1;
        bool tighter = !bd->set || (i < 2 ? (x > bd->v || (x == bd->v && excl)) : (x < bd->v || (x == bd->v && excl)));
        if (tighter) *bd = (struct bound){true, excl, x};
    }
    return 0;
}

static struct gx *integer_expr(struct sc *s, json_t *sch)
{
    struct bound lo, hi;
    if (read_bounds(s, sch, &lo, &hi)) return NULL;
    if (!lo.set && !hi.set) return number_any(s, true);
    // integers in [a, b]
    int64_t a = INT64_MIN, z = INT64_MAX;
    if (lo.set) a = (int64_t)(lo.excl ? floor(lo.v) + 1 : ceil(lo.v));
    if (hi.set) z = (int64_t)(hi.excl ? ceil(hi.v) - 1 : floor(hi.v));
    if (lo.set && hi.set && a > z) return fail(s, MS_EINVAL, "integer bounds admit no value%s", "");
    struct gbuild *b = s->b;
    struct gx_list alts = {0};
    if (!hi.set || z >= 0) {
        uint64_t from = a > 0 ? (uint64_t)a : 0;
        gx_list_push(b, &alts, uint_range(s, from, hi.set ? (uint64_t)z : 0, !hi.set));
    }
    if (!lo.set || a < 0) {
        // magnitudes 1 .. -a (or unbounded), at least -z when z < 0
        uint64_t from = hi.set && z < 0 ? (uint64_t)(-(z + 1)) + 1 : 1;
        bool inf = !lo.set;
        uint64_t to = inf ? 0 : (uint64_t)(-(a + 1)) + 1;
        gx_list_push(b, &alts, gx_seq2(b, gx_byte(b, '-'), uint_range(s, from, to, inf)));
    }
    return gx_altv(b, alts.kids, alts.n);
}

// A bound's magnitude as a decimal: the fewest digits that read back as its
// double (what a client's validator compares against), split at the point;
// the fraction without trailing zeros. |x| <= 9e18 (read_bounds).
struct dec {
    uint64_t ip;
    char frac[40];
    int flen;
};

static void dec_of(double x, struct dec *d)
{
    char buf[48];
    for (int p = 0; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p, fabs(x));
        if (strtod(buf, NULL) == fabs(x)) break;
    }
    char dig[24];
    int nd = 0;
    const char *c = buf;
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9' && nd < (int)sizeof dig) dig[nd++] = *c;
    const int point = atoi(c + 1) + 1; // the value is 0.dig x 10^point
    memset(d, 0, sizeof *d);
    for (int i = 0; i < point; i++) d->ip = d->ip * 10 + (uint64_t)(i < nd ? dig[i] - '0' : 0);
    if (nd - point > (int)sizeof d->frac - 1) { // 1e-40: past any fraction kept; refused by its length
        d->flen = (int)sizeof d->frac;
        return;
    }
    for (int i = point; i < nd; i++) d->frac[d->flen++] = i < 0 ? '0' : dig[i];
    while (d->flen && d->frac[d->flen - 1] == '0') d->flen--;
}

// Fraction digit strings f with lo <= .f <= hi as decimals (zeros padded;
// lo or hi NULL: no bound there; lo_ex, hi_ex: strict), from position i on,
// at most r more digits; at i == 0 a non-empty f is written after its '.',
// an empty one as nothing. NULL where no string fits.
static struct gx *frac_range(struct sc *s, const struct dec *lo, bool lo_ex, const struct dec *hi, bool hi_ex,
                             int i, int r)
{
    struct gbuild *b = s->b;
    struct gx_list alts = {0};
    // Ending here: the rest is zeros, equal to a bound with no digits left.
    const bool lo_done = !lo || i >= lo->flen, hi_done = !hi || i >= hi->flen;
    if ((!lo || (lo_done && !lo_ex)) && (!hi || !hi_done || !hi_ex)) gx_list_push(b, &alts, gx_empty(b));
    if (r > 0) {
        const int l = lo && !lo_done ? lo->frac[i] - '0' : 0, h = hi ? (hi_done ? 0 : hi->frac[i] - '0') : 9;
        struct gx *next[2] = {NULL, NULL}; // the digit keeping lo, the one keeping hi
        uint8_t first[2] = {0, 0};
        if (lo && hi && l == h) { // one digit keeps both bounds
            next[0] = frac_range(s, lo, lo_ex, hi, hi_ex, i + 1, r - 1), first[0] = (uint8_t)('0' + l);
        } else if (l < h || !lo || !hi) {
            if (lo && l <= h) next[0] = frac_range(s, lo, lo_ex, NULL, false, i + 1, r - 1), first[0] = (uint8_t)('0' + l);
            if (hi && h >= l) next[1] = frac_range(s, NULL, false, hi, hi_ex, i + 1, r - 1), first[1] = (uint8_t)('0' + h);
            const int a = l + (lo ? 1 : 0), z = h - (hi ? 1 : 0);
            if (a <= z) gx_list_push(b, &alts, gx_seq2(b, i ? gx_empty(b) : gx_byte(b, '.'),
                                                       gx_seq2(b, gx_range(b, (uint8_t)('0' + a), (uint8_t)('0' + z)),
                                                               digits(s, 0, (uint32_t)r - 1))));
        }
        for (int k = 0; k < 2; k++)
            if (next[k])
                gx_list_push(b, &alts, gx_seq3(b, i ? gx_empty(b) : gx_byte(b, '.'), gx_byte(b, first[k]), next[k]));
    }
    if (!alts.n) return NULL;
    return gx_altv(b, alts.kids, alts.n);
}

// Magnitudes m = n[.f] with p <= m (p < m when pex) and m <= q (m < q when
// qex; qinf: no q): the whole numbers strictly between the bounds' integer
// parts with any fraction, and the bounds' integer parts themselves with
// the fractions their bounds leave. An output has at most as many
// significant digits as a double keeps apart (15) beside the larger bound,
// so that it reads back on the side of the bound it was made on
// (0.99999999999999999 under an exclusive maximum of 1 would read back as
// 1.0); a bound with more fraction digits than that leaves is refused.
static struct gx *magnitude_expr(struct sc *s, const struct dec *p, bool pex, const struct dec *q, bool qex,
                                 bool qinf)
{
    struct gbuild *b = s->b;
    if (!qinf && p->ip > q->ip) return NULL;
    char buf[24];
    const int bound_digits = snprintf(buf, sizeof buf, "%llu", (unsigned long long)(qinf ? p->ip : q->ip));
    const int p_digits = snprintf(buf, sizeof buf, "%llu", (unsigned long long)p->ip);
    // Past 14 integer digits an output beside an exclusive bound can read
    // back as the bound itself; beside an inclusive one it stays on its
    // side (rounding keeps order), so one fraction digit is left there.
    if ((pex && p_digits >= 15) || (!qinf && qex && bound_digits >= 15))
        return fail(s, MS_EUNSUPPORTED, "exclusive number bounds of 1e14 or more are not supported%s", "");
    const int fd = bound_digits < 14 ? 15 - bound_digits : 1;
    if (p->flen > fd || (!qinf && q->flen > fd))
        return fail(s, MS_EUNSUPPORTED, "number bounds with more than 15 significant digits are not supported%s", "");
    struct gx_list alts = {0};
    if (!qinf && p->ip == q->ip) {
        struct gx *f = frac_range(s, p, pex, q, qex, 0, fd);
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)p->ip);
        if (f) gx_list_push(b, &alts, gx_seq2(b, gx_str(b, buf), f));
    } else {
        struct gx *f = frac_range(s, p, pex, NULL, false, 0, fd);
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)p->ip);
        if (f) gx_list_push(b, &alts, gx_seq2(b, gx_str(b, buf), f));
        if (qinf || q->ip - p->ip >= 2) {
            struct gx *n = uint_range(s, p->ip + 1, qinf ? 0 : q->ip - 1, qinf);
            if (n) gx_list_push(b, &alts, gx_seq2(b, n, frac_range(s, NULL, false, NULL, false, 0, fd)));
        }
        if (!qinf) {
            f = frac_range(s, NULL, false, q, qex, 0, fd);
            snprintf(buf, sizeof buf, "%llu", (unsigned long long)q->ip);
            if (f) gx_list_push(b, &alts, gx_seq2(b, gx_str(b, buf), f));
        }
    }
    if (!alts.n) return NULL;
    return gx_altv(b, alts.kids, alts.n);
}

// Decimal bounds are compared as the digits of their doubles (dec_of).
static struct gx *number_expr(struct sc *s, json_t *sch)
{
    struct bound lo, hi;
    if (read_bounds(s, sch, &lo, &hi)) return NULL;
    if (!lo.set && !hi.set) return number_any(s, false);
    if (lo.set && hi.set && (lo.v > hi.v || (lo.v == hi.v && (lo.excl || hi.excl))))
        return fail(s, MS_EINVAL, "number bounds admit no value%s", "");
    struct dec dl = {0}, dh = {0}, zero = {0};
    if (lo.set) dec_of(lo.v, &dl);
    if (hi.set) dec_of(hi.v, &dh);
    struct gbuild *b = s->b;
    struct gx_list alts = {0};
    // x >= 0: magnitudes from max(lo, 0) up to hi
    if (!hi.set || hi.v >= 0) {
        const bool from_lo = lo.set && lo.v >= 0;
        struct gx *x = magnitude_expr(s, from_lo ? &dl : &zero, from_lo && lo.excl, &dh, hi.set && hi.excl, !hi.set);
        if (x) gx_list_push(b, &alts, x);
    }
    // x < 0: x = -m with m > 0 (never "-0"), m >= -hi when hi < 0, m <= -lo when lo is set
    if (!lo.set || lo.v < 0) {
        const bool from_hi = hi.set && hi.v < 0;
        struct gx *x = magnitude_expr(s, from_hi ? &dh : &zero, from_hi ? hi.excl : true, &dl, lo.set && lo.excl,
                                      !lo.set);
        if (x) gx_list_push(b, &alts, gx_seq2(b, gx_byte(b, '-'), x));
    }
    if (b->status) return NULL;
    if (!alts.n) return fail(s, MS_EINVAL, "number bounds admit no value%s", "");
    return gx_altv(b, alts.kids, alts.n);
}

// ---- strings ----

// RFC 3339 full-date: year 0001 on, each month's days (February to 28: a
// leap day would need the year's arithmetic, and leaving it out is safe).
#define RFC3339_DATE "(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|" \
                     "(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"

static const struct {
    const char *name;
    const char *regex; // over the decoded string, anchored
} formats[] = {
    {"date", "^" RFC3339_DATE "$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time", "^" RFC3339_DATE "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                  "(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
    // RFC 5321's dot-atom local part and a host name of at least two labels,
    // none starting or ending with '-' (xgrammar's and ajv-formats' rules
    // agree on what this allows).
    {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
              "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"},
};

static struct gx *string_expr(struct sc *s, json_t *sch)
{
    struct gbuild *b = s->b;
    json_t *pat = json_object_get(sch, "pattern"), *fmt = json_object_get(sch, "format");
    json_t *minl = json_object_get(sch, "minLength"), *maxl = json_object_get(sch, "maxLength");
    int n_constraints = !!pat + !!fmt + !!(minl || maxl);
    if (n_constraints > 1)
        return fail(s, MS_EUNSUPPORTED, "a string with more than one of pattern, format and min/maxLength is not supported%s", "");
    if (pat) {
        if (!json_is_string(pat)) return fail(s, MS_EINVAL, "pattern is not a string%s", "");
        struct gx *x = grammar_regex_expr(b, json_string_value(pat), json_string_length(pat), true);
        return gx_seq3(b, gx_byte(b, '"'), x, gx_byte(b, '"'));
    }
    if (fmt) {
        if (!json_is_string(fmt)) return fail(s, MS_EINVAL, "format is not a string%s", "");
        for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
            if (strcmp(formats[i].name, json_string_value(fmt)) != 0) continue;
            struct gx *x = grammar_regex_expr(b, formats[i].regex, strlen(formats[i].regex), true);
            return gx_seq3(b, gx_byte(b, '"'), x, gx_byte(b, '"'));
        }
        return fail(s, MS_EUNSUPPORTED, "string format '%s' is not supported", json_string_value(fmt));
    }
    if (minl || maxl) {
        if ((minl && !json_is_integer(minl)) || (maxl && !json_is_integer(maxl)))
            return fail(s, MS_EINVAL, "minLength and maxLength must be integers%s", "");
        json_int_t lo = minl ? json_integer_value(minl) : 0, hi = maxl ? json_integer_value(maxl) : -1;
        if (lo < 0 || (maxl && hi < lo)) return fail(s, MS_EINVAL, "string lengths admit no value%s", "");
        if (lo > 256 || hi > 256)
            return fail(s, MS_ENOFIT, "minLength or maxLength above 256 is not supported%s", "");
        struct gx *x = gx_repeat(b, gx_json_string_char(b), (uint32_t)lo, maxl ? (uint32_t)hi : GX_INF);
        return gx_seq3(b, gx_byte(b, '"'), x, gx_byte(b, '"'));
    }
    return any_string(s);
}

// ---- objects ----

// A JSON string of plain characters (no escapes) that is none of names:
// a trie over the names, where leaving the trie at any point frees the rest.
static struct gx *key_not_in(struct sc *s, const char **names, size_t n, size_t depth_off)
{
    struct gbuild *b = s->b;
    if (b->status) return NULL; // a limit hit deeper down: stop descending
    struct cp_class plain = {0}, taken = {0};
    struct gx_list alts = {0};
    bool is_name = false;
    // children: the code point at depth_off of each name that is long enough
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len == depth_off) {
            is_name = true;
            continue;
        }
        uint32_t cp;
        utf8_decode((const uint8_t *)names[i] + depth_off, len - depth_off, &cp);
        bool seen = false;
        for (size_t j = 0; j < taken.n; j++) seen |= taken.r[j].lo == cp;
        if (seen) continue;
        if (cp_class_add(&taken, cp, cp)) goto nomem;
    }
    for (size_t j = 0; j < taken.n; j++) {
        uint32_t cp = taken.r[j].lo;
        uint8_t enc[4];
        size_t el = utf8_encode(cp, enc);
        // the names continuing with cp
        const char **sub = malloc(n * sizeof *sub);
        if (!sub) goto nomem;
        size_t ns = 0;
        for (size_t i = 0; i < n; i++) {
            size_t len = strlen(names[i]);
            if (len > depth_off && memcmp(names[i] + depth_off, enc, el) == 0) sub[ns++] = names[i];
        }
        gx_list_push(b, &alts, gx_seq2(b, gx_lit(b, enc, el), key_not_in(s, sub, ns, depth_off + el)));
        free(sub);
    }
    if (cp_class_add(&plain, 0x20, 0x21) || cp_class_add(&plain, 0x23, 0x5b) || cp_class_add(&plain, 0x5d, 0x10ffff))
        goto nomem;
    for (size_t j = 0; j < taken.n; j++) {
        // remove taken code points from plain
        struct cp_class t = {0};
        if (cp_class_add(&t, taken.r[j].lo, taken.r[j].lo) || cp_class_negate(&t)) {
            cp_class_free(&t);
            goto nomem;
        }
        struct cp_class inter = {0};
        for (size_t a = 0; a < plain.n; a++)
            for (size_t c = 0; c < t.n; c++) {
                uint32_t lo = plain.r[a].lo > t.r[c].lo ? plain.r[a].lo : t.r[c].lo;
                uint32_t hi = plain.r[a].hi < t.r[c].hi ? plain.r[a].hi : t.r[c].hi;
                if (lo <= hi && cp_class_add(&inter, lo, hi)) {
                    cp_class_free(&t);
                    cp_class_free(&inter);
                    goto nomem;
                }
            }
        cp_class_free(&t);
        cp_class_free(&plain);
        plain = inter;
    }
    struct cp_class all = {0};
    if (cp_class_add(&all, 0x20, 0x21) || cp_class_add(&all, 0x23, 0x5b) || cp_class_add(&all, 0x5d, 0x10ffff)) {
        cp_class_free(&all);
        goto nomem;
    }
    if (plain.n)
        gx_list_push(b, &alts, gx_seq3(b, gx_utf8_class(b, &plain), gx_star(b, gx_utf8_class(b, &all)), gx_byte(b, '"')));
    cp_class_free(&all);
    // the end of the key: allowed unless this prefix is a name
    if (!is_name) gx_list_push(b, &alts, gx_byte(b, '"'));
    cp_class_free(&plain);
    cp_class_free(&taken);
    if (b->status) return NULL;
    return gx_altv(b, alts.kids, alts.n);
nomem:
    cp_class_free(&plain);
    cp_class_free(&taken);
    return fail(s, MS_ENOMEM, "out of memory%s", "");
}

static bool needs_escape(const char *name)
{
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == '"' || *p == '\\') return true;
    return false;
}

static struct gx *object_expr(struct sc *s, json_t *sch, int depth)
{
    struct gbuild *b = s->b;
    json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required");
    json_t *addl = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props)) return fail(s, MS_EINVAL, "properties is not an object%s", "");
    if (req && !json_is_array(req)) return fail(s, MS_EINVAL, "required is not an array%s", "");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(s, MS_EINVAL, "additionalProperties is not a schema%s", "");
    size_t n_req = req ? json_array_size(req) : 0;
    for (size_t i = 0; i < n_req; i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return fail(s, MS_EINVAL, "required holds a non-string%s", "");
        if (!props || !json_object_get(props, json_string_value(r))) {
            return fail(s, MS_EUNSUPPORTED,
                        "required property '%s' is not listed in properties (not supported)", json_string_value(r));
        }
    }
    size_t n = props ? json_object_size(props) : 0;
    struct gx **members = calloc(n ? n : 1, sizeof *members);
    bool *opt = calloc(n ? n : 1, sizeof *opt);
    const char **names = calloc(n ? n : 1, sizeof *names);
    if (!members || !opt || !names) {
        free(members);
        free(opt);
        free(names);
        return fail(s, MS_ENOMEM, "out of memory%s", "");
    }
    size_t m = 0, n_names = 0;
    const char *key;
    json_t *ps;
    if (props) {
        json_object_foreach(props, key, ps) {
            bool required = false;
            for (size_t i = 0; i < n_req; i++) required |= strcmp(json_string_value(json_array_get(req, i)), key) == 0;
            if (!needs_escape(key)) names[n_names++] = key;
            if (json_is_false(ps)) {
                if (required) {
                    free(members);
                    free(opt);
                    free(names);
                    return fail(s, MS_EINVAL, "required property '%s' has schema false", key);
                }
                continue;
            }
            json_t *kj = json_string(key);
            struct gx *k = kj ? json_literal(s, kj) : NULL;
            json_decref(kj);
            members[m] = gx_seq3(b, k, punct(s, ':'), sc_value(s, ps, depth + 1));
            opt[m++] = !required;
        }
    }
    struct gx *extra = NULL;
    if (addl && !json_is_false(addl)) {
        // key_not_in descends one level a code point of the longest name.
        for (size_t i = 0; i < n_names; i++)
            if (strlen(names[i]) > GRAMMAR_MAX_KEY_BYTES) {
                free(members);
                free(opt);
                free(names);
                char msg[120];
                snprintf(msg, sizeof msg, "a property name over %d bytes beside additionalProperties is not supported",
                         GRAMMAR_MAX_KEY_BYTES);
                return fail(s, MS_ENOFIT, "%s", msg);
            }
        struct gx *value = json_is_true(addl) ? any_value(s) : sc_value(s, addl, depth + 1);
        struct gx *k = gx_seq2(b, gx_byte(b, '"'), key_not_in(s, names, n_names, 0));
        extra = gx_seq3(b, k, punct(s, ':'), value);
    }
    struct gx *sep = punct(s, ',');
    struct gx *body = gx_props(b, members, opt, m, sep, extra);
    free(members);
    free(opt);
    free(names);
    return gx_seq3(b, gx_seq2(b, gx_byte(b, '{'), ws(s)), gx_seq2(b, body, ws(s)), gx_byte(b, '}'));
}

// ---- arrays ----

static int count_of(struct sc *s, json_t *sch, const char *name, json_int_t dflt, json_int_t *out)
{
    json_t *v = json_object_get(sch, name);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) return fail(s, MS_EINVAL, "%s is not a non-negative integer", name), -1;
    *out = json_integer_value(v);
    if (*out > GRAMMAR_MAX_REPEAT) return fail(s, MS_ENOFIT, "%s above the repetition limit is not supported", name), -1;
    return 0;
}

static struct gx *array_expr(struct sc *s, json_t *sch, int depth)
{
    struct gbuild *b = s->b;
    json_t *items = json_object_get(sch, "items"), *prefix = json_object_get(sch, "prefixItems");
    json_t *uniq = json_object_get(sch, "uniqueItems");
    if (uniq && !json_is_false(uniq)) return fail(s, MS_EUNSUPPORTED, "uniqueItems is not supported%s", "");
    json_t *addi = json_object_get(sch, "additionalItems");
    if (json_is_array(items)) { // draft 4-7 tuples
        if (prefix) return fail(s, MS_EINVAL, "items as an array beside prefixItems%s", "");
        prefix = items;
        items = addi;
    } else if (addi) {
        return fail(s, MS_EUNSUPPORTED, "additionalItems without an items array is not supported%s", "");
    }
    if (prefix && !json_is_array(prefix)) return fail(s, MS_EINVAL, "prefixItems is not an array%s", "");
    json_int_t min, max;
    if (count_of(s, sch, "minItems", 0, &min) || count_of(s, sch, "maxItems", -1, &max)) return NULL;
    if (max >= 0 && max < min) return fail(s, MS_EINVAL, "maxItems is below minItems%s", "");
    size_t np = prefix ? json_array_size(prefix) : 0;
    if (np > GRAMMAR_MAX_REPEAT) return fail(s, MS_ENOFIT, "prefixItems is too long%s", "");
    bool rest_allowed = !items || !json_is_false(items);
    // the elements: prefix i (position i < np), then the items schema
    struct gx_list seq = {0};
    struct gx *sep = punct(s, ',');
    struct gx *lb = gx_seq2(b, gx_byte(b, '['), ws(s)), *rb = gx_seq2(b, ws(s), gx_byte(b, ']'));
    // Closing after k elements is allowed when min <= k (and k <= max).
    // Written as nested options: e0 (sep e1 (sep e2 ...)?)?, with the
    // first min elements required.
    json_int_t limit = max >= 0 ? max : -1;
    if (!rest_allowed) {
        if (min > (json_int_t)np) return fail(s, MS_EINVAL, "minItems is above the number of items allowed%s", "");
        if (limit < 0 || limit > (json_int_t)np) limit = (json_int_t)np;
    }
    struct gx *rest_item = NULL;
    if (rest_allowed) {
        rest_item = items && !json_is_true(items) ? sc_value(s, items, depth + 1) : any_value(s);
        json_int_t count = limit >= 0 ? limit : min;
        if (count - (json_int_t)np > ARRAY_RULE_ABOVE && rest_item) {
            int r = gb_rule_new(b, "item");
            gb_rule_set(b, r, rest_item);
            rest_item = gx_call(b, r);
        }
    }
    // Build from the back: tail(k) = what may follow after k elements.
    // tail(k) = (sep elem_k tail(k+1)) optional when k >= min.
    json_int_t fixed_end = limit >= 0 ? limit : (min > (json_int_t)np ? min : (json_int_t)np);
    struct gx *tail;
    if (limit >= 0) {
        tail = gx_empty(b);
    } else {
        tail = gx_star(b, gx_seq2(b, sep, rest_item)); // unbounded after fixed_end
    }
    for (json_int_t k = fixed_end - 1; k >= 0; k--) {
        struct gx *elem = k < (json_int_t)np ? sc_value(s, json_array_get(prefix, (size_t)k), depth + 1) : rest_item;
        struct gx *step = k == 0 ? gx_seq2(b, elem, tail) : gx_seq3(b, sep, elem, tail);
        if (k >= min) step = gx_opt(b, step);
        tail = step;
        if (b->status) return NULL;
    }
    if (fixed_end == 0 && limit < 0) {
        // no fixed elements: ( elem (sep elem)* )?
        tail = gx_opt(b, gx_seq2(b, rest_item, gx_star(b, gx_seq2(b, sep, rest_item))));
    }
    gx_list_push(b, &seq, lb);
    gx_list_push(b, &seq, tail);
    gx_list_push(b, &seq, rb);
    return gx_seqv(b, seq.kids, seq.n);
}

// ---- references ----

static json_t *resolve_ref(struct sc *s, const char *ref)
{
    if (ref[0] != '#') return fail(s, MS_EUNSUPPORTED, "$ref '%s' outside this document is not supported", ref), NULL;
    json_t *cur = s->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') return fail(s, MS_EUNSUPPORTED, "$ref '%s' to an anchor is not supported", ref), NULL;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~' && (*p == '0' || *p == '1')) c = *p++ == '0' ? '~' : '/';
            if (n + 1 >= sizeof tok) return fail(s, MS_EINVAL, "$ref '%s' has a segment too long", ref), NULL;
            tok[n++] = c;
        }
        tok[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            cur = *tok && !*end ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
        if (!cur) return fail(s, MS_EINVAL, "$ref '%s' points nowhere", ref), NULL;
    }
    return cur;
}

static struct gx *ref_expr(struct sc *s, const char *ref, int depth)
{
    json_t *target = resolve_ref(s, ref);
    if (!target) return NULL;
    for (size_t i = 0; i < s->n_refs; i++)
        if (s->refs[i].target == target) return gx_call(s->b, s->refs[i].rule);
    if (s->n_refs == s->cap_refs) {
        size_t cap = s->cap_refs ? 2 * s->cap_refs : 8;
        struct ref_memo *r = realloc(s->refs, cap * sizeof *r);
        if (!r) return fail(s, MS_ENOMEM, "out of memory%s", "");
        s->refs = r;
        s->cap_refs = cap;
    }
    int rule = gb_rule_new(s->b, ref);
    if (rule < 0) return NULL;
    s->refs[s->n_refs++] = (struct ref_memo){target, rule};
    gb_rule_set(s->b, rule, sc_value(s, target, depth + 1));
    return gx_call(s->b, rule);
}

// ---- the value dispatcher ----

static int value_types(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_INTEGER: return T_INT | T_NUM;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? T_INT | T_NUM : T_NUM;
    case JSON_STRING: return T_STR;
    case JSON_ARRAY: return T_ARR;
    case JSON_OBJECT: return T_OBJ;
    }
    return 0;
}

// The JSON types a schema can produce (for oneOf's disjointness check).
// *budget bounds the schemas visited: $refs and alternatives are followed
// without a memo, and eight alternatives each referring back to the root
// would otherwise take 8^depth visits; past it, any type (so such a oneOf
// is refused as possibly overlapping).
#define SCHEMA_TYPES_BUDGET 4096
static int schema_types(struct sc *s, json_t *sch, int depth, int *budget)
{
    if (depth > GRAMMAR_MAX_JSON_DEPTH || !json_is_object(sch) || --*budget < 0) return T_ANY;
    json_t *ref = json_object_get(sch, "$ref");
    if (json_is_string(ref)) {
        json_t *t = resolve_ref(s, json_string_value(ref));
        return t ? schema_types(s, t, depth + 1, budget) : T_ANY;
    }
    json_t *en = json_object_get(sch, "enum"), *c = json_object_get(sch, "const");
    if (c) return value_types(c);
    if (json_is_array(en)) {
        int t = 0;
        size_t i;
        json_t *v;
        json_array_foreach(en, i, v) t |= value_types(v);
        return t;
    }
    json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty)) {
        for (size_t i = 0; i < sizeof type_names / sizeof *type_names; i++)
            if (strcmp(type_names[i].name, json_string_value(ty)) == 0)
                return type_names[i].bit == T_NUM ? T_NUM | T_INT : type_names[i].bit;
    }
    json_t *alts = json_object_get(sch, "anyOf");
    if (!alts) alts = json_object_get(sch, "oneOf");
    if (json_is_array(alts)) {
        int t = 0;
        size_t i;
        json_t *v;
        json_array_foreach(alts, i, v) t |= schema_types(s, v, depth + 1, budget);
        return t;
    }
    return T_ANY;
}

static bool has_class(json_t *sch, enum kw_class cls)
{
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) if (kw_lookup(k) == cls) return true;
    return false;
}

// Keywords beside $ref / anyOf / allOf that would need an intersection.
static const char *constraint_beside(json_t *sch, const char *except)
{
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) {
        if (strcmp(k, except) == 0) continue;
        enum kw_class c = kw_lookup(k);
        if (c != KW_ANNOTATION) return k;
    }
    return NULL;
}

static struct gx *enum_expr(struct sc *s, json_t *sch, int types)
{
    json_t *c = json_object_get(sch, "const"), *en = json_object_get(sch, "enum");
    if (c && en) return fail(s, MS_EUNSUPPORTED, "enum beside const is not supported%s", "");
    if (en && (!json_is_array(en) || json_array_size(en) == 0)) return fail(s, MS_EINVAL, "enum is not a non-empty array%s", "");
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) {
        enum kw_class kc = kw_lookup(k);
        if (kc != KW_ANNOTATION && strcmp(k, "type") && strcmp(k, "enum") && strcmp(k, "const"))
            return fail(s, MS_EUNSUPPORTED, "'%s' beside enum or const is not supported", k);
    }
    struct gx_list alts = {0};
    size_t n = c ? 1 : json_array_size(en);
    for (size_t i = 0; i < n; i++) {
        json_t *val = c ? c : json_array_get(en, i);
        if (!(value_types(val) & types)) continue;
        gx_list_push(s->b, &alts, json_literal(s, val));
    }
    if (s->b->status) return NULL;
    if (!alts.n) return fail(s, MS_EINVAL, "no enum or const value has the schema's type%s", "");
    return gx_altv(s->b, alts.kids, alts.n);
}

static struct gx *typed_expr(struct sc *s, json_t *sch, int bit, int depth)
{
    struct gbuild *b = s->b;
    switch (bit) {
    case T_NULL: return gx_str(b, "null");
    case T_BOOL: return gx_alt2(b, gx_str(b, "true"), gx_str(b, "false"));
    case T_INT: return integer_expr(s, sch);
    case T_NUM: return number_expr(s, sch);
    case T_STR: return string_expr(s, sch);
    case T_ARR: return array_expr(s, sch, depth);
    case T_OBJ: return object_expr(s, sch, depth);
    }
    return fail(s, MS_EINTERNAL, "unknown type%s", "");
}

// The types named by "type" (or implied by the keywords present when it is absent).
static int declared_types(struct sc *s, json_t *sch)
{
    json_t *ty = json_object_get(sch, "type");
    if (!ty) {
        int t = 0;
        if (has_class(sch, KW_OBJECT)) t |= T_OBJ;
        if (has_class(sch, KW_ARRAY)) t |= T_ARR;
        if (has_class(sch, KW_STRING)) t |= T_STR;
        if (has_class(sch, KW_NUMBER)) t |= T_NUM;
        return t ? t : T_ANY;
    }
    json_t *list = ty;
    if (json_is_string(ty)) {
        list = json_array();
        if (!list) return fail(s, MS_ENOMEM, "out of memory%s", ""), -1;
        json_array_append(list, ty);
    }
    if (!json_is_array(list)) return fail(s, MS_EINVAL, "type is not a string or an array%s", ""), -1;
    int t = 0;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        int bit = 0;
        for (size_t j = 0; j < sizeof type_names / sizeof *type_names && json_is_string(v); j++)
            if (strcmp(type_names[j].name, json_string_value(v)) == 0) bit = type_names[j].bit;
        if (!bit) {
            if (list != ty) json_decref(list);
            return fail(s, MS_EINVAL, "unknown type '%s'", json_is_string(v) ? json_string_value(v) : "?"), -1;
        }
        t |= bit;
    }
    if (list != ty) json_decref(list);
    if (!t) return fail(s, MS_EINVAL, "type is an empty list%s", ""), -1;
    return t;
}

static struct gx *alternatives_expr(struct sc *s, json_t *sch, const char *kw, int depth)
{
    json_t *alts = json_object_get(sch, kw);
    if (!json_is_array(alts) || json_array_size(alts) == 0) return fail(s, MS_EINVAL, "%s is not a non-empty array", kw);
    const char *other = constraint_beside(sch, kw);
    if (other) {
        char msg[160];
        snprintf(msg, sizeof msg, "'%s' beside %s is not supported", other, kw);
        return fail(s, MS_EUNSUPPORTED, "%s", msg);
    }
    if (strcmp(kw, "oneOf") == 0) {
        int seen = 0;
        size_t i;
        json_t *v;
        json_array_foreach(alts, i, v) {
            int budget = SCHEMA_TYPES_BUDGET;
            int t = schema_types(s, v, depth + 1, &budget);
            if (s->b->status) return NULL;
            if (t & seen)
                return fail(s, MS_EUNSUPPORTED,
                            "oneOf whose alternatives may overlap (the same JSON type twice) is not supported; "
                            "use anyOf%s", "");
            seen |= t;
        }
    }
    struct gx_list l = {0};
    size_t i;
    json_t *v;
    json_array_foreach(alts, i, v) gx_list_push(s->b, &l, sc_value(s, v, depth + 1));
    if (s->b->status) return NULL;
    return gx_altv(s->b, l.kids, l.n);
}

// Whether v holds a "$ref" anywhere (depth bounded as the document is).
static bool holds_ref(json_t *v, int depth)
{
    if (depth > GRAMMAR_MAX_JSON_DEPTH) return true;
    const char *k;
    size_t i;
    json_t *x;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x) if (holds_ref(x, depth + 1)) return true;
    } else if (json_is_object(v)) {
        json_object_foreach(v, k, x) if (!strcmp(k, "$ref") || holds_ref(x, depth + 1)) return true;
    }
    return false;
}

static struct gx *sc_value(struct sc *s, json_t *sch, int depth)
{
    if (s->b->status) return NULL;
    if (depth > GRAMMAR_MAX_JSON_DEPTH) return fail(s, MS_ENOFIT, "the schema nests deeper than the limit%s", "");
    if (json_is_true(sch)) return any_value(s);
    if (json_is_false(sch)) return fail(s, MS_EINVAL, "schema false admits no value%s", "");
    if (!json_is_object(sch)) return fail(s, MS_EINVAL, "a schema must be an object or a boolean%s", "");
    const char *k;
    json_t *v;
    json_object_foreach(sch, k, v) {
        if (kw_lookup(k) == KW_UNSUPPORTED) return fail(s, MS_EUNSUPPORTED, "keyword '%s' is not supported", k);
    }
    // An $id below the root makes the $refs under it relative to itself; we
    // resolve every $ref from the document's root, so that would point
    // elsewhere than the schema means.
    if (sch != s->doc && json_object_get(sch, "$id") && holds_ref(sch, depth))
        return fail(s, MS_EUNSUPPORTED, "an $id below the root with a $ref under it is not supported (its $refs "
                    "would be resolved against it)%s", "");
    json_t *ref = json_object_get(sch, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(s, MS_EINVAL, "$ref is not a string%s", "");
        const char *other = constraint_beside(sch, "$ref");
        if (other) return fail(s, MS_EUNSUPPORTED, "'%s' beside $ref is not supported", other);
        return ref_expr(s, json_string_value(ref), depth);
    }
    json_t *all = json_object_get(sch, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1 || constraint_beside(sch, "allOf"))
            return fail(s, MS_EUNSUPPORTED, "allOf is supported only with one schema and nothing beside it%s", "");
        return sc_value(s, json_array_get(all, 0), depth + 1);
    }
    if (json_object_get(sch, "anyOf")) return alternatives_expr(s, sch, "anyOf", depth);
    if (json_object_get(sch, "oneOf")) return alternatives_expr(s, sch, "oneOf", depth);
    int types = declared_types(s, sch);
    if (types < 0) return NULL;
    if (json_object_get(sch, "enum") || json_object_get(sch, "const")) return enum_expr(s, sch, types);
    if (types == T_ANY && !json_object_get(sch, "type")) return any_value(s);
    if ((types & T_INT) && (types & T_NUM)) types &= ~T_INT; // number covers integer
    struct gx_list alts = {0};
    for (int bit = 1; bit <= T_OBJ; bit <<= 1)
        if (types & bit) gx_list_push(s->b, &alts, typed_expr(s, sch, bit, depth));
    if (s->b->status) return NULL;
    return gx_altv(s->b, alts.kids, alts.n);
}

int grammar_schema_build(struct gbuild *b, const char *text, size_t len, bool any_object, int *root)
{
    struct sc s = {.b = b, .r_string = -1, .r_value = -1, .r_object = -1, .r_array = -1};
    if (any_object) {
        *root = shared_rule(&s, &s.r_object, "object", object_any_body);
        return b->status;
    }
    json_error_t je;
    s.doc = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!s.doc) return gb_fail(b, MS_EFORMAT, "the schema is not JSON (%s at line %d)", je.text, je.line);
    *root = gb_rule_new(b, "root");
    gb_rule_set(b, *root, sc_value(&s, s.doc, 0));
    json_decref(s.doc);
    free(s.refs);
    if (!b->status && !b->rules[*root].body) gb_fail(b, MS_EINTERNAL, "the schema compiled to nothing");
    return b->status;
}
