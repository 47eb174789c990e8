// jinja_builtins: the filters, tests, globals (range, namespace, dict,
// raise_exception, strftime_now), str/dict/list methods and loop attributes that
// chat templates use, each with the semantics of Python and Jinja2 3.1. The
// table at the end holds every name with what it takes and the function that
// runs it; dispatch, argument checks and the lists of known names all read it.
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "api/jinja_impl.h"
#include "base/base.h"

// ---- rows and calls ------------------------------------------------------------------------
#define JB_MAX_PARAMS 4
#define TM(t) (1u << (t)) // a set of value types

// What a row's arguments must look like before its function runs.
enum jb_args {
    JA_NONE,   // none at all
    JA_ONE,    // exactly one positional argument
    JA_PARAMS, // bound to the row's parameter names, Python style
    JA_RAW,    // anything: the function checks them
};

struct bcall;
typedef int (*builtin_fn)(struct jrender *r, struct bcall *c, struct jv *out);

struct jb_row {
    const char *name;
    uint8_t kind;       // enum jb_kind
    uint8_t args;       // enum jb_args
    uint16_t recv;      // JB_METHOD and JB_ATTR: the value types that have it (TM(JV_STR)...)
    unsigned mode;      // which variant, for names that share a function
    builtin_fn fn;      // tests answer with a bool value
    const char *params[JB_MAX_PARAMS]; // JA_PARAMS: Python's parameter names, in order
};

// One call of a builtin, as its function sees it.
struct bcall {
    const struct jb_row *row;
    struct jstr name;    // as the template wrote it ('d' calls default's function)
    struct jv self;      // the filter's operand, the tested value, the method's object
    struct jcallargs *a; // the arguments as given
    struct jv vals[JB_MAX_PARAMS]; // JA_PARAMS: the arguments bound to the parameters
    bool given[JB_MAX_PARAMS];
};

static int call_row(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out);

// ---- helpers --------------------------------------------------------------------------------
// A method bound to its object, or a global: a function value that runs its row when called.
static struct jv mkfunc(struct jrender *r, const struct jb_row *row, struct jv self)
{
    struct jfunc *f = jr_alloc(r, sizeof *f);
    struct jv v = jv_undef();
    if (!f) return v; // the error is set; callers check r via the returned undefined
    f->name = row->name;
    f->fn = call_row;
    f->self = self;
    f->row = row;
    v.t = JV_FUNC;
    v.fn = f;
    return v;
}

static struct jv list_value(struct jlist *l, int type)
{
    struct jv v = jv_undef();
    v.t = (uint8_t)type;
    v.l = l;
    return v;
}

static struct jv dict_value(struct jdict *d, int type)
{
    struct jv v = jv_undef();
    v.t = (uint8_t)type;
    v.d = d;
    return v;
}

// The type a method row belongs to, as Python names it in errors.
static const char *owner(const struct jb_row *row)
{
    if (row->recv & TM(JV_STR)) return "str";
    if (row->recv & TM(JV_DICT)) return "dict";
    if (row->recv & TM(JV_LIST)) return "list";
    if (row->recv & TM(JV_LOOP)) return "loop";
    return "";
}

// How error sentences name the callee: "filter 'd'", "test 'odd'", "str.split()".
static const char *describe(const struct bcall *c, char *buf, size_t n)
{
    int len = (int)(c->name.n > 40 ? 40 : c->name.n);
    if (c->row->kind == JB_FILTER) snprintf(buf, n, "filter '%.*s'", len, c->name.p);
    else if (c->row->kind == JB_TEST) snprintf(buf, n, "test '%.*s'", len, c->name.p);
    else if (*owner(c->row)) snprintf(buf, n, "%s.%s()", owner(c->row), c->row->name);
    else snprintf(buf, n, "%s()", c->row->name);
    return buf;
}

// Binds positional and keyword arguments to the row's parameter names,
// Python style, into c->vals / c->given.
static int bind(struct jrender *r, struct bcall *c)
{
    const char *const *names = c->row->params;
    struct jcallargs *a = c->a;
    size_t n = 0;
    while (n < JB_MAX_PARAMS && names[n]) n++;
    char what[96];
    for (size_t i = 0; i < n; i++) c->given[i] = false;
    if (a->npos > n)
        return jr_fail(r, "%s takes at most %zu argument%s (%zu given)", describe(c, what, sizeof what),
                       n, n == 1 ? "" : "s", a->npos);
    for (size_t i = 0; i < a->npos; i++) {
        c->vals[i] = a->pos[i];
        c->given[i] = true;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < n && !jstr_eq(a->kwn[k], names[i])) i++;
        if (i == n)
            return jr_fail(r, "%s got an unexpected keyword argument '%.*s'",
                           describe(c, what, sizeof what), (int)a->kwn[k].n, a->kwn[k].p);
        if (c->given[i])
            return jr_fail(r, "%s got multiple values for argument '%s'",
                           describe(c, what, sizeof what), names[i]);
        c->vals[i] = a->kwv[k];
        c->given[i] = true;
    }
    return 0;
}

// Checks (and binds) a call's arguments against its row, with the sentences
// Jinja2 and Python give.
static int check_args(struct jrender *r, struct bcall *c)
{
    struct jcallargs *a = c->a;
    char what[96];
    switch (c->row->args) {
    case JA_NONE:
        if (!a->npos && !a->nkw) return 0;
        break;
    case JA_ONE:
        if (a->npos == 1 && !a->nkw) return 0;
        break;
    case JA_PARAMS: return bind(r, c);
    default: return 0;
    }
    if (c->row->kind == JB_TEST)
        return jr_fail(r, "%s got the wrong number of arguments", describe(c, what, sizeof what));
    return jr_fail(r, c->row->args == JA_NONE ? "%s takes no arguments"
                                              : "%s takes exactly one argument",
                   describe(c, what, sizeof what));
}

static int want_str(struct jrender *r, const char *what, struct jv v, struct jstr *out)
{
    if (v.t == JV_STR) {
        *out = v.s;
        return 0;
    }
    if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
    return jr_fail(r, "%s must be a string, not %s", what, jv_type_name(v.t));
}

static int want_int(struct jrender *r, const char *what, struct jv v, int64_t *out)
{
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *out = v.t == JV_BOOL ? v.b : v.i;
        return 0;
    }
    if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
    return jr_fail(r, "%s: '%s' object cannot be interpreted as an integer", what,
                   jv_type_name(v.t));
}

// want_str / want_int for a method's argument: the method is named only
// when there is an error to report.
static int arg_str(struct jrender *r, const struct bcall *c, struct jv v, struct jstr *out)
{
    char what[96];
    if (v.t == JV_STR) {
        *out = v.s;
        return 0;
    }
    return want_str(r, describe(c, what, sizeof what), v, out);
}

static int arg_int(struct jrender *r, const struct bcall *c, struct jv v, int64_t *out)
{
    char what[96];
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *out = v.t == JV_BOOL ? v.b : v.i;
        return 0;
    }
    return want_int(r, describe(c, what, sizeof what), v, out);
}

static bool contains_cp(const uint32_t *set, size_t n, uint32_t cp)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == cp) return true;
    return false;
}

// Whether strip removes the character at p (k bytes, code point cp): white
// space when chars is NULL, else one of chars (looked up in set, or in chars
// itself when it has more than set holds).
static bool strip_hit(const struct jstr *chars, const uint32_t *set, size_t nset, bool big,
                      const char *p, size_t k, uint32_t cp)
{
    if (!chars) return ju_is_space(cp);
    if (big) return memmem(chars->p, chars->n, p, k) != NULL;
    return contains_cp(set, nset, cp);
}

// Python str.strip / lstrip / rstrip: chars.p NULL strips whitespace.
static struct jstr strip(struct jstr s, const struct jstr *chars, bool left, bool right)
{
    uint32_t set[64];
    size_t nset = 0;
    bool big = false;
    if (chars) {
        for (size_t i = 0; i < chars->n;) {
            uint32_t cp;
            i += ju_decode(chars->p + i, chars->n - i, &cp);
            if (nset < 64) set[nset++] = cp;
            else big = true;
        }
    }
    size_t b = 0, e = s.n;
    while (left && b < e) {
        uint32_t cp;
        size_t k = ju_decode(s.p + b, e - b, &cp);
        if (!strip_hit(chars, set, nset, big, s.p + b, k, cp)) break;
        b += k;
    }
    while (right && e > b) {
        size_t st = e - 1;
        while (st > b && ((unsigned char)s.p[st] & 0xc0) == 0x80) st--;
        uint32_t cp;
        size_t k = ju_decode(s.p + st, e - st, &cp);
        if (!strip_hit(chars, set, nset, big, s.p + st, k, cp)) break;
        e = st;
    }
    return (struct jstr){s.p + b, e - b};
}

enum casemode { CASE_UPPER, CASE_LOWER, CASE_PYTITLE, CASE_CAPITALIZE, CASE_JTITLE };

static bool is_cased(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

// Case mapping with Unicode simple mappings (Python uses full mappings for a few
// characters such as ß -> SS; those keep their simple mapping here).
static int change_case(struct jrender *r, struct jstr s, int mode, struct jv *out)
{
    struct ms_buf b = jsb_new(r);
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        size_t k = ju_decode(s.p + i, s.n - i, &cp);
        uint32_t o = cp;
        if (cp == 0xdf && mode == CASE_UPPER) {
            // Python's full mapping; other special cases keep their simple mapping.
            int rc = jsb_put(r, &b, "SS", 2);
            if (rc) return rc;
            i += k;
            first = false;
            continue;
        }
        switch (mode) {
        case CASE_UPPER: o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); break;
        case CASE_LOWER: o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); break;
        case CASE_CAPITALIZE:
            o = first ? (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp)
                      : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            break;
        case CASE_PYTITLE:
            if (is_cased(cp)) {
                o = prev_cased ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)
                               : (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
                prev_cased = true;
            } else {
                prev_cased = false;
            }
            break;
        case CASE_JTITLE:
            // Jinja's title: words start after whitespace or one of -({[<.
            if (ju_is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<') {
                word_start = true;
            } else {
                o = word_start ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp)
                               : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
                word_start = false;
            }
            break;
        }
        first = false;
        char enc[4];
        int rc = (o == cp) ? jsb_put(r, &b, s.p + i, k) : jsb_put(r, &b, enc, ju_encode(o, enc));
        if (rc) return rc;
        i += k;
    }
    *out = jsb_str(&b);
    return 0;
}

static int replace_str(struct jrender *r, struct jstr s, struct jstr old, struct jstr new_,
                       int64_t count, struct jv *out)
{
    if (count == 0) {
        *out = jv_str(s.p, s.n);
        return 0;
    }
    struct ms_buf b = jsb_new(r);
    int rc = 0;
    int64_t done = 0;
    if (old.n == 0) {
        // Python inserts `new` before every character and at the end.
        size_t i = 0;
        while (!rc) {
            if (count < 0 || done < count) {
                rc = jsb_put(r, &b, new_.p, new_.n);
                done++;
            }
            if (i >= s.n || rc) break;
            uint32_t cp;
            size_t k = ju_decode(s.p + i, s.n - i, &cp);
            rc = jsb_put(r, &b, s.p + i, k);
            i += k;
        }
        if (!rc && i < s.n) rc = jsb_put(r, &b, s.p + i, s.n - i);
        if (rc) return rc;
        *out = jsb_str(&b);
        return 0;
    }
    size_t i = 0;
    while (!rc && i <= s.n) {
        const char *hit = (count < 0 || done < count) ? memmem(s.p + i, s.n - i, old.p, old.n) : NULL;
        if (!hit) {
            rc = jsb_put(r, &b, s.p + i, s.n - i);
            break;
        }
        size_t at = (size_t)(hit - s.p);
        rc = jsb_put(r, &b, s.p + i, at - i);
        if (!rc) rc = jsb_put(r, &b, new_.p, new_.n);
        i = at + old.n;
        done++;
    }
    if (rc) return rc;
    *out = jsb_str(&b);
    return 0;
}

static int list_append(struct jrender *r, struct jlist *l, size_t *cap, struct jv v)
{
    if (l->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        struct jv *nv = jr_alloc(r, nc * sizeof *nv);
        if (!nv) return MS_EINVAL;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        *cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

// str.split / str.rsplit.
static int split_str(struct jrender *r, struct jstr s, const struct jstr *sep, int64_t maxsplit,
                     bool from_right, struct jv *out)
{
    struct jlist *l = jv_list_new(r, 0);
    if (!l) return MS_EINVAL;
    size_t cap = 0;
    int rc = 0;
    if (!sep) {
        // Runs of whitespace separate; no empty strings at either end.
        struct jlist *words = jv_list_new(r, 0);
        if (!words) return MS_EINVAL;
        size_t wcap = 0;
        size_t i = 0;
        while (i < s.n && !rc) {
            uint32_t cp;
            size_t k;
            while (i < s.n && (k = ju_decode(s.p + i, s.n - i, &cp)) && ju_is_space(cp)) i += k;
            if (i >= s.n) break;
            size_t st = i;
            while (i < s.n && (k = ju_decode(s.p + i, s.n - i, &cp)) && !ju_is_space(cp)) i += k;
            rc = list_append(r, words, &wcap, jv_str(s.p + st, i - st));
        }
        if (rc) return rc;
        if (maxsplit < 0 || (int64_t)words->n <= maxsplit + 1) {
            *out = list_value(words, JV_LIST);
            return 0;
        }
        // With maxsplit, the rest of the string (from the first unsplit word) stays whole.
        size_t keep = (size_t)maxsplit;
        if (!from_right) {
            for (size_t w = 0; w < keep && !rc; w++) rc = list_append(r, l, &cap, words->v[w]);
            // Python keeps the remainder as it is, trailing whitespace included.
            const char *rest = words->v[keep].s.p;
            if (!rc) rc = list_append(r, l, &cap, jv_str(rest, (size_t)(s.p + s.n - rest)));
        } else {
            size_t first_kept = words->n - keep;
            const char *end = words->v[first_kept - 1].s.p + words->v[first_kept - 1].s.n;
            rc = list_append(r, l, &cap, jv_str(s.p, (size_t)(end - s.p)));
            for (size_t w = first_kept; w < words->n && !rc; w++) rc = list_append(r, l, &cap, words->v[w]);
        }
        if (rc) return rc;
        *out = list_value(l, JV_LIST);
        return 0;
    }
    if (sep->n == 0) return jr_fail(r, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(s.p + i, s.n - i, sep->p, sep->n) : NULL;
            if (!hit) {
                rc = list_append(r, l, &cap, jv_str(s.p + i, s.n - i));
                break;
            }
            size_t at = (size_t)(hit - s.p);
            if ((rc = list_append(r, l, &cap, jv_str(s.p + i, at - i)))) break;
            i = at + sep->n;
            done++;
        }
    } else {
        // Collect pieces from the right, then reverse.
        size_t e = s.n;
        int64_t done = 0;
        for (;;) {
            size_t at = SIZE_MAX;
            if ((maxsplit < 0 || done < maxsplit) && e >= sep->n)
                for (size_t p = e - sep->n + 1; p-- > 0;)
                    if (memcmp(s.p + p, sep->p, sep->n) == 0) {
                        at = p;
                        break;
                    }
            if (at == SIZE_MAX) {
                rc = list_append(r, l, &cap, jv_str(s.p, e));
                break;
            }
            if ((rc = list_append(r, l, &cap, jv_str(s.p + at + sep->n, e - at - sep->n)))) break;
            e = at;
            done++;
        }
        for (size_t i = 0; i < l->n / 2; i++) {
            struct jv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    }
    if (rc) return rc;
    *out = list_value(l, JV_LIST);
    return 0;
}

static bool is_line_break(uint32_t cp)
{
    return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d ||
           cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static int splitlines(struct jrender *r, struct jstr s, bool keepends, struct jlist **out)
{
    struct jlist *l = jv_list_new(r, 0);
    if (!l) return MS_EINVAL;
    size_t cap = 0, st = 0, i = 0;
    int rc = 0;
    while (i < s.n && !rc) {
        uint32_t cp;
        size_t k = ju_decode(s.p + i, s.n - i, &cp);
        if (!is_line_break(cp)) {
            i += k;
            continue;
        }
        size_t eol = i;
        i += k;
        if (cp == '\r' && i < s.n && s.p[i] == '\n') i++;
        rc = list_append(r, l, &cap, jv_str(s.p + st, (keepends ? i : eol) - st));
        st = i;
    }
    if (!rc && st < s.n) rc = list_append(r, l, &cap, jv_str(s.p + st, s.n - st));
    if (rc) return rc;
    *out = l;
    return 0;
}

static int py_len(struct jrender *r, struct jv v, int64_t *n)
{
    switch (v.t) {
    case JV_STR: *n = (int64_t)ju_count(v.s.p, v.s.n); return 0;
    case JV_LIST: case JV_TUPLE: *n = (int64_t)v.l->n; return 0;
    case JV_DICT: *n = (int64_t)v.d->n; return 0;
    case JV_UNDEF: *n = 0; return 0;
    case JV_LOOP: *n = (int64_t)v.loop->length; return 0;
    default: return jr_fail(r, "object of type '%s' has no len()", jv_type_name(v.t));
    }
}

// Jinja's attribute paths for map/sort/selectattr...: "a.b.0".
static int get_path(struct jrender *r, struct jv obj, struct jstr path, struct jv *out)
{
    size_t i = 0;
    while (i <= path.n) {
        size_t e = i;
        while (e < path.n && path.p[e] != '.') e++;
        struct jstr part = {path.p + i, e - i};
        bool numeric = part.n > 0;
        int64_t idx = 0;
        for (size_t k = 0; k < part.n; k++) {
            if (part.p[k] < '0' || part.p[k] > '9') numeric = false;
            else if (idx < 100000000) idx = idx * 10 + (part.p[k] - '0');
        }
        if (obj.t == JV_UNDEF) return jv_undef_fail(r, obj);
        const struct jv *hit = NULL;
        if (obj.t == JV_DICT || obj.t == JV_NS) {
            hit = jv_dict_get_str(r, obj.d, part.p, part.n);
            if (!hit && numeric && obj.t == JV_DICT) hit = jv_dict_get(r, obj.d, jv_int(idx));
        } else if ((obj.t == JV_LIST || obj.t == JV_TUPLE) && numeric && (size_t)idx < obj.l->n) {
            hit = &obj.l->v[idx];
        }
        if (hit) obj = *hit;
        else {
            int rc = 0;
            if (!(obj.t != JV_DICT && jb_method(r, obj, part, &obj, &rc))) obj = jv_undef_attr(obj.t, part);
            if (rc) return rc;
        }
        i = e + 1;
    }
    *out = obj;
    return 0;
}

// ---- tojson ---------------------------------------------------------------------------------
// transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
static int f_tojson(struct jrender *r, struct bcall *c, struct jv *out)
{
    const struct jv *vals = c->vals;
    const bool *given = c->given;
    int rc;
    struct jjson_opts o = {0};
    o.ensure_ascii = given[0] && jv_truthy(vals[0]);
    o.sort_keys = given[3] && jv_truthy(vals[3]);
    if (given[1] && vals[1].t != JV_NONE) {
        o.has_indent = true;
        if (vals[1].t == JV_STR) {
            o.indent = vals[1].s;
        } else {
            int64_t n;
            if ((rc = want_int(r, "tojson indent", vals[1], &n))) return rc;
            if (n > 1000) return jr_fail(r, "tojson indent %lld is too large", (long long)n);
            char *sp = jr_alloc(r, n > 0 ? (size_t)n : 1);
            if (!sp) return MS_EINVAL;
            if (n > 0) memset(sp, ' ', (size_t)n);
            o.indent = (struct jstr){sp, n > 0 ? (size_t)n : 0};
        }
    }
    o.item_sep = o.has_indent ? (struct jstr){",", 1} : (struct jstr){", ", 2};
    o.key_sep = (struct jstr){": ", 2};
    if (given[2] && vals[2].t != JV_NONE) {
        struct jv s = vals[2];
        if ((s.t != JV_LIST && s.t != JV_TUPLE) || s.l->n != 2 || s.l->v[0].t != JV_STR ||
            s.l->v[1].t != JV_STR)
            return jr_fail(r, "tojson separators must be a pair of strings (item_separator, key_separator)");
        o.item_sep = s.l->v[0].s;
        o.key_sep = s.l->v[1].s;
    }
    struct ms_buf b = jsb_new(r);
    if ((rc = jv_to_json(r, c->self, &o, &b, 0))) return rc;
    *out = jsb_str(&b);
    return 0;
}

// ---- %-formatting (str % args, the format filter) ------------------------------------------------
// A conversion's flags, width and precision (the text between '%' and the
// conversion character), as %s and a large float's %d apply them
// themselves; printf reads the same spec for the other conversions.
struct pct_spec {
    bool minus, plus, space, zero;
    size_t width;
    size_t prec; // SIZE_MAX: none given
};

static struct pct_spec pct_spec_parse(const char *spec)
{
    struct pct_spec p = {.prec = SIZE_MAX};
    size_t k = 1;
    for (; spec[k] && strchr("-+ #0", spec[k]); k++) {
        p.minus |= spec[k] == '-';
        p.plus |= spec[k] == '+';
        p.space |= spec[k] == ' ';
        p.zero |= spec[k] == '0';
    }
    for (; spec[k] >= '0' && spec[k] <= '9'; k++) p.width = p.width * 10 + (size_t)(spec[k] - '0');
    if (spec[k] == '.')
        for (p.prec = 0, k++; spec[k] >= '0' && spec[k] <= '9'; k++) p.prec = p.prec * 10 + (size_t)(spec[k] - '0');
    return p;
}

// %d of a float whose integer part is past long long's range (|f| >= 2^63,
// finite): the exact decimal digits of that integer (glibc prints a double's
// exact value), with spec's flags, width and precision as printf applies
// them to an integer.
static int percent_big_integer(struct jrender *r, struct ms_buf *b, const char *spec, double f)
{
    char digits[320]; // DBL_MAX has 309
    snprintf(digits, sizeof digits, "%.0f", fabs(trunc(f)));
    const struct pct_spec p = pct_spec_parse(spec);
    const bool has_prec = p.prec != SIZE_MAX;
    const char *sign = f < 0 ? "-" : p.plus ? "+" : p.space ? " " : "";
    const size_t nd = strlen(digits), zeros = has_prec && p.prec > nd ? p.prec - nd : 0;
    const size_t body = strlen(sign) + zeros + nd, pad = p.width > body ? p.width - body : 0;
    const bool zero_pad = p.zero && !p.minus && !has_prec;
    int rc = 0;
    for (size_t i = 0; !p.minus && !zero_pad && i < pad && !rc; i++) rc = jsb_putc(r, b, ' ');
    if (!rc) rc = jsb_put(r, b, sign, strlen(sign));
    for (size_t i = 0; zero_pad && i < pad && !rc; i++) rc = jsb_putc(r, b, '0');
    for (size_t i = 0; i < zeros && !rc; i++) rc = jsb_putc(r, b, '0');
    if (!rc) rc = jsb_put(r, b, digits, nd);
    for (size_t i = 0; p.minus && i < pad && !rc; i++) rc = jsb_putc(r, b, ' ');
    return rc;
}

int jb_percent_format(struct jrender *r, struct jstr fmt, struct jv args, struct jv *out)
{
    struct ms_buf b = jsb_new(r);
    size_t argi = 0;
    bool is_tuple = args.t == JV_TUPLE;
    size_t nargs = is_tuple ? args.l->n : 1;
    int rc = 0;
    for (size_t i = 0; i < fmt.n && !rc;) {
        const char *pct = memchr(fmt.p + i, '%', fmt.n - i);
        if (!pct) {
            rc = jsb_put(r, &b, fmt.p + i, fmt.n - i);
            break;
        }
        size_t at = (size_t)(pct - fmt.p);
        if ((rc = jsb_put(r, &b, fmt.p + i, at - i))) break;
        i = at + 1;
        struct jv arg;
        bool have_key = false;
        if (i < fmt.n && fmt.p[i] == '(') {
            const char *close = memchr(fmt.p + i, ')', fmt.n - i);
            if (!close) return jr_fail(r, "incomplete format key");
            if (args.t != JV_DICT) return jr_fail(r, "format requires a mapping");
            const struct jv *hit = jv_dict_get_str(r, args.d, fmt.p + i + 1, (size_t)(close - fmt.p) - i - 1);
            if (!hit) return jr_fail(r, "format key '%.*s' is missing", (int)((size_t)(close - fmt.p) - i - 1), fmt.p + i + 1);
            arg = *hit;
            have_key = true;
            i = (size_t)(close - fmt.p) + 1;
        }
        char spec[32];
        size_t sn = 0;
        spec[sn++] = '%';
        while (i < fmt.n && strchr("-+ #0", fmt.p[i]) && sn < 8) spec[sn++] = fmt.p[i++];
        while (i < fmt.n && fmt.p[i] >= '0' && fmt.p[i] <= '9' && sn < 16) spec[sn++] = fmt.p[i++];
        if (i < fmt.n && fmt.p[i] == '.') {
            spec[sn++] = fmt.p[i++];
            while (i < fmt.n && fmt.p[i] >= '0' && fmt.p[i] <= '9' && sn < 24) spec[sn++] = fmt.p[i++];
        }
        if (i >= fmt.n) return jr_fail(r, "incomplete format");
        char conv = fmt.p[i++];
        if (conv == '%') {
            rc = jsb_putc(r, &b, '%');
            continue;
        }
        if (!have_key) {
            if (argi >= nargs) return jr_fail(r, "not enough arguments for format string");
            arg = is_tuple ? args.l->v[argi] : args;
            argi++;
        }
        spec[sn] = 0;
        switch (conv) {
        case 's': case 'r': {
            struct ms_buf t = jsb_new(r);
            rc = conv == 's' ? jv_to_str(r, arg, &t) : jv_to_repr(r, arg, &t, 0);
            if (rc) break;
            // Width and precision count characters.
            const struct pct_spec p = pct_spec_parse(spec);
            size_t bytes = 0, chars = 0;
            while (bytes < t.len && chars < p.prec) {
                uint32_t cp;
                bytes += ju_decode(t.data + bytes, t.len - bytes, &cp);
                chars++;
            }
            for (size_t pad = chars; !p.minus && pad < p.width && !rc; pad++) rc = jsb_putc(r, &b, ' ');
            if (!rc) rc = jsb_put(r, &b, t.data, bytes);
            for (size_t pad = chars; p.minus && pad < p.width && !rc; pad++) rc = jsb_putc(r, &b, ' ');
            break;
        }
        case 'c': {
            // Python's rules: an int in range(0x110000), or a string of one character.
            uint32_t cp = 0;
            if (arg.t == JV_STR) {
                if (arg.s.n == 0 || ju_decode(arg.s.p, arg.s.n, &cp) != arg.s.n)
                    return jr_fail(r, "%%c requires int or char, not a string of another length");
            } else if (arg.t == JV_INT || arg.t == JV_BOOL) {
                const int64_t v = arg.t == JV_BOOL ? arg.b : arg.i;
                if (v < 0 || v >= 0x110000) return jr_fail(r, "%%c arg not in range(0x110000)");
                cp = (uint32_t)v;
            } else {
                return jr_fail(r, "%%c requires int or char, not %s", jv_type_name(arg.t));
            }
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return jr_fail(r, "%%c of U+%04X: a lone surrogate has no UTF-8 form", (unsigned)cp);
            char enc[4];
            rc = jsb_put(r, &b, enc, ju_encode(cp, enc));
            break;
        }
        case 'd': case 'i': case 'x': case 'X': case 'o': {
            if (!jv_is_number(arg)) return jr_fail(r, "%%%c format: a number is required, not %s", conv, jv_type_name(arg.t));
            if (arg.t == JV_FLOAT && conv != 'd' && conv != 'i')
                return jr_fail(r, "%%%c format: an integer is required, not float", conv);
            if (arg.t == JV_FLOAT && !isfinite(arg.f))
                return jr_fail(r, "cannot convert float %s to integer", isnan(arg.f) ? "NaN" : "infinity");
            // A float's integer part past long long's range: its exact digits, as Python's int() gives.
            if (arg.t == JV_FLOAT && !(arg.f > -9223372036854775808.0 && arg.f < 9223372036854775808.0)) {
                rc = percent_big_integer(r, &b, spec, arg.f);
                break;
            }
            long long v = arg.t == JV_FLOAT ? (long long)arg.f : arg.t == JV_BOOL ? arg.b : arg.i;
            spec[sn++] = 'l';
            spec[sn++] = 'l';
            spec[sn++] = conv == 'i' ? 'd' : conv;
            spec[sn] = 0;
            rc = jsb_printf(r, &b, spec, v);
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
            if (!jv_is_number(arg)) return jr_fail(r, "%%%c format: a number is required, not %s", conv, jv_type_name(arg.t));
            spec[sn++] = conv;
            spec[sn] = 0;
            rc = jsb_printf(r, &b, spec, jv_num(arg));
            break;
        }
        default:
            return jr_fail(r, "unsupported format character '%c'", conv);
        }
    }
    if (rc) return rc;
    if (is_tuple && argi < nargs) return jr_fail(r, "not all arguments converted during string formatting");
    *out = jsb_str(&b);
    return 0;
}

// str.format with {} / {0} / {name} fields and {{ }} escapes.
static int str_format(struct jrender *r, struct jstr fmt, struct jcallargs *a, struct jv *out)
{
    struct ms_buf b = jsb_new(r);
    size_t auto_idx = 0;
    int rc = 0;
    for (size_t i = 0; i < fmt.n && !rc;) {
        char c = fmt.p[i];
        if (c == '}') {
            if (i + 1 < fmt.n && fmt.p[i + 1] == '}') {
                rc = jsb_putc(r, &b, '}');
                i += 2;
                continue;
            }
            return jr_fail(r, "single '}' encountered in format string");
        }
        if (c != '{') {
            rc = jsb_putc(r, &b, c);
            i++;
            continue;
        }
        if (i + 1 < fmt.n && fmt.p[i + 1] == '{') {
            rc = jsb_putc(r, &b, '{');
            i += 2;
            continue;
        }
        const char *close = memchr(fmt.p + i, '}', fmt.n - i);
        if (!close) return jr_fail(r, "single '{' encountered in format string");
        struct jstr field = {fmt.p + i + 1, (size_t)(close - fmt.p) - i - 1};
        i = (size_t)(close - fmt.p) + 1;
        bool repr = false;
        if (field.n >= 2 && field.p[field.n - 2] == '!') {
            repr = field.p[field.n - 1] == 'r';
            field.n -= 2;
        }
        if (memchr(field.p, ':', field.n)) return jr_fail(r, "format specs in str.format are not supported");
        struct jv arg;
        if (field.n == 0) {
            if (auto_idx >= a->npos) return jr_fail(r, "str.format: not enough positional arguments");
            arg = a->pos[auto_idx++];
        } else if (field.p[0] >= '0' && field.p[0] <= '9') {
            size_t idx = (size_t)strtoul(field.p, NULL, 10);
            if (idx >= a->npos) return jr_fail(r, "str.format: replacement index %zu out of range", idx);
            arg = a->pos[idx];
        } else {
            size_t k = 0;
            while (k < a->nkw && !(a->kwn[k].n == field.n && memcmp(a->kwn[k].p, field.p, field.n) == 0)) k++;
            if (k == a->nkw) return jr_fail(r, "str.format: missing keyword '%.*s'", (int)field.n, field.p);
            arg = a->kwv[k];
        }
        rc = repr ? jv_to_repr(r, arg, &b, 0) : jv_to_str(r, arg, &b);
    }
    if (rc) return rc;
    *out = jsb_str(&b);
    return 0;
}

// ---- str methods ------------------------------------------------------------------------------
static int m_str_format(struct jrender *r, struct bcall *c, struct jv *out)
{
    return str_format(r, c->self.s, c->a, out);
}

static int m_str_join(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s = c->self.s;
    struct jlist *items;
    int rc = jv_iterate(r, c->a->pos[0], &items);
    if (rc) return rc;
    struct ms_buf b = jsb_new(r);
    for (size_t i = 0; i < items->n; i++) {
        if (items->v[i].t != JV_STR)
            return jr_fail(r, "sequence item %zu: expected str instance, %s found", i,
                           jv_type_name(items->v[i].t));
        if (i && (rc = jsb_put(r, &b, s.p, s.n))) return rc;
        if ((rc = jsb_put(r, &b, items->v[i].s.p, items->v[i].s.n))) return rc;
    }
    *out = jsb_str(&b);
    return 0;
}

enum { STRIP_LEFT = 1, STRIP_RIGHT = 2 };

static int m_str_strip(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr chars, *cp = NULL;
    if (c->given[0] && c->vals[0].t != JV_NONE) {
        int rc = arg_str(r, c, c->vals[0], &chars);
        if (rc) return rc;
        cp = &chars;
    }
    struct jstr o = strip(c->self.s, cp, c->row->mode & STRIP_LEFT, c->row->mode & STRIP_RIGHT);
    *out = jv_str(o.p, o.n);
    return 0;
}

// split (mode 0) and rsplit (mode 1).
static int m_str_split(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr sep, *sp = NULL;
    int64_t maxsplit = -1;
    int rc;
    if (c->given[0] && c->vals[0].t != JV_NONE) {
        if ((rc = arg_str(r, c, c->vals[0], &sep))) return rc;
        sp = &sep;
    }
    if (c->given[1] && (rc = arg_int(r, c, c->vals[1], &maxsplit))) return rc;
    return split_str(r, c->self.s, sp, maxsplit, c->row->mode, out);
}

// startswith (mode 0) and endswith (mode 1).
static int m_str_affix(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s = c->self.s;
    struct jcallargs *a = c->a;
    char what[32];
    int rc;
    if (a->npos < 1 || a->npos > 3 || a->nkw)
        return jr_fail(r, "%s takes 1 to 3 arguments", describe(c, what, sizeof what));
    struct jv pre = a->pos[0];
    // start/end narrow the string, counted in characters.
    struct jstr sub = s;
    if (a->npos > 1) {
        struct jlist *chars;
        if ((rc = jv_iterate(r, jv_str(s.p, s.n), &chars))) return rc;
        int64_t n = (int64_t)chars->n, st = 0, en = n;
        if (a->pos[1].t != JV_NONE && (rc = arg_int(r, c, a->pos[1], &st))) return rc;
        if (a->npos > 2 && a->pos[2].t != JV_NONE && (rc = arg_int(r, c, a->pos[2], &en))) return rc;
        if (st < 0) st = st + n < 0 ? 0 : st + n;
        if (en < 0) en = en + n < 0 ? 0 : en + n;
        if (st > n) st = n;
        if (en > n) en = n;
        if (st > en) {
            *out = jv_bool(false);
            return 0;
        }
        const char *b0 = st < n ? chars->v[st].s.p : s.p + s.n;
        const char *e0 = en < n ? chars->v[en].s.p : s.p + s.n;
        sub = (struct jstr){b0, (size_t)(e0 - b0)};
    }
    size_t np = (pre.t == JV_LIST || pre.t == JV_TUPLE) ? pre.l->n : 1;
    for (size_t i = 0; i < np; i++) {
        struct jv p = (pre.t == JV_LIST || pre.t == JV_TUPLE) ? pre.l->v[i] : pre;
        if (p.t != JV_STR)
            return jr_fail(r, "%s first arg must be str or a tuple of str, not %s",
                           describe(c, what, sizeof what), jv_type_name(p.t));
        if (p.s.n <= sub.n && memcmp(c->row->mode ? sub.p + sub.n - p.s.n : sub.p, p.s.p, p.s.n) == 0) {
            *out = jv_bool(true);
            return 0;
        }
    }
    *out = jv_bool(false);
    return 0;
}

static int m_str_replace(struct jrender *r, struct bcall *c, struct jv *out)
{
    char what[32];
    if (!c->given[0] || !c->given[1])
        return jr_fail(r, "%s takes at least 2 arguments", describe(c, what, sizeof what));
    struct jstr old, new_;
    int64_t count = -1;
    int rc;
    if ((rc = arg_str(r, c, c->vals[0], &old)) || (rc = arg_str(r, c, c->vals[1], &new_))) return rc;
    if (c->given[2] && (rc = arg_int(r, c, c->vals[2], &count))) return rc;
    return replace_str(r, c->self.s, old, new_, count, out);
}

// find, rfind, index, rindex and count.
enum { FIND_REV = 1, FIND_RAISE = 2, FIND_COUNT = 4 };

static int m_str_find(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s = c->self.s;
    char what[32];
    struct jstr sub = {"", 0};
    if (!c->given[0]) return jr_fail(r, "%s takes at least 1 argument", describe(c, what, sizeof what));
    int rc = arg_str(r, c, c->vals[0], &sub);
    if (rc) return rc;
    if (c->given[1] || c->given[2])
        return jr_fail(r, "%s with start/end is not supported", describe(c, what, sizeof what));
    if (c->row->mode & FIND_COUNT) {
        int64_t n = 0;
        if (sub.n == 0) n = (int64_t)ju_count(s.p, s.n) + 1;
        else
            for (size_t i = 0; i + sub.n <= s.n;) {
                const char *h = memmem(s.p + i, s.n - i, sub.p, sub.n);
                if (!h) break;
                n++;
                i = (size_t)(h - s.p) + sub.n;
            }
        *out = jv_int(n);
        return 0;
    }
    const char *hit = NULL;
    if (!(c->row->mode & FIND_REV)) hit = sub.n ? memmem(s.p, s.n, sub.p, sub.n) : s.p;
    else if (sub.n <= s.n)
        for (size_t p = s.n - sub.n + 1; p-- > 0;)
            if (memcmp(s.p + p, sub.p, sub.n) == 0) {
                hit = s.p + p;
                break;
            }
    if (!hit) {
        if (c->row->mode & FIND_RAISE) return jr_fail(r, "substring not found");
        *out = jv_int(-1);
        return 0;
    }
    *out = jv_int((int64_t)ju_count(s.p, (size_t)(hit - s.p)));
    return 0;
}

static int m_str_splitlines(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jlist *l;
    int rc = splitlines(r, c->self.s, c->given[0] && jv_truthy(c->vals[0]), &l);
    if (rc) return rc;
    *out = list_value(l, JV_LIST);
    return 0;
}

// upper, lower, title and capitalize (mode: enum casemode).
static int m_str_case(struct jrender *r, struct bcall *c, struct jv *out)
{
    return change_case(r, c->self.s, (int)c->row->mode, out);
}

// The is* predicates: true when s is not empty and every character
// qualifies; islower / isupper: some character is cased and none of the other case.
enum str_class { IS_DIGIT, IS_ALPHA, IS_ALNUM, IS_SPACE, IS_LOWER, IS_UPPER };

static bool str_is(struct jstr s, unsigned which)
{
    bool all = s.n > 0, any_cased = false, ok_lower = true, ok_upper = true;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        i += ju_decode(s.p + i, s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool alpha = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL ||
                     c == UTF8PROC_CATEGORY_LT || c == UTF8PROC_CATEGORY_LM ||
                     c == UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        switch (which) {
        case IS_DIGIT: all &= digit; break;
        case IS_ALPHA: all &= alpha; break;
        case IS_ALNUM: all &= alpha || digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO; break;
        case IS_SPACE: all &= ju_is_space(cp); break;
        }
        if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) {
            any_cased = true;
            ok_lower = false;
        }
        if (c == UTF8PROC_CATEGORY_LL) {
            any_cased = true;
            ok_upper = false;
        }
    }
    if (which == IS_LOWER) return any_cased && ok_lower;
    if (which == IS_UPPER) return any_cased && ok_upper;
    return all;
}

static int m_str_is(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    *out = jv_bool(str_is(c->self.s, c->row->mode));
    return 0;
}

// ---- dict and list methods ---------------------------------------------------------------------
static int items_of(struct jrender *r, struct jdict *d, struct jv *out)
{
    struct jlist *l = jv_list_new(r, d->n);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < d->n; i++) {
        struct jlist *pair = jv_list_new(r, 2);
        if (!pair) return MS_EINVAL;
        pair->v[0] = d->keys[i];
        pair->v[1] = d->vals[i];
        l->v[i] = list_value(pair, JV_TUPLE);
    }
    *out = list_value(l, JV_LIST);
    return 0;
}

static int m_dict_get(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    if (a->npos < 1 || a->npos > 2 || a->nkw) return jr_fail(r, "dict.get() takes 1 or 2 arguments");
    const struct jv *v = jv_dict_get(r, c->self.d, a->pos[0]);
    *out = v ? *v : a->npos > 1 ? a->pos[1] : jv_none();
    return 0;
}

static int m_dict_copy(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jdict *d = c->self.d;
    struct jdict *n = jv_dict_new(r, d->n);
    if (!n) return MS_EINVAL;
    memcpy(n->keys, d->keys, d->n * sizeof *n->keys);
    memcpy(n->vals, d->vals, d->n * sizeof *n->vals);
    n->n = d->n;
    *out = dict_value(n, JV_DICT);
    return 0;
}

// items (mode 0), keys (1) and values (2).
static int m_dict_view(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jdict *d = c->self.d;
    if (c->row->mode == 0) return items_of(r, d, out);
    struct jlist *l = jv_list_new(r, d->n);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < d->n; i++) l->v[i] = c->row->mode == 1 ? d->keys[i] : d->vals[i];
    *out = list_value(l, JV_LIST);
    return 0;
}

// The methods that change a dict or list in place.
static int m_mutate(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)out;
    return jr_fail(r, "%s.%s() modifies the %s, which the template sandbox does not allow",
                   owner(c->row), c->row->name, owner(c->row));
}

// index (mode 0) and count (mode 1) of lists and tuples.
static int m_list_find(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jlist *l = c->self.l;
    int64_t n = 0;
    for (size_t i = 0; i < l->n; i++) {
        bool eq;
        int rc = jv_equal(r, l->v[i], c->a->pos[0], &eq, 0);
        if (rc) return rc;
        if (eq) {
            if (c->row->mode == 0) {
                *out = jv_int((int64_t)i);
                return 0;
            }
            n++;
        }
    }
    if (c->row->mode == 0) return jr_fail(r, "list.index(x): x not in list");
    *out = jv_int(n);
    return 0;
}

static int m_list_copy(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jlist *l = c->self.l;
    struct jlist *n = jv_list_new(r, l->n);
    if (!n) return MS_EINVAL;
    if (l->n) memcpy(n->v, l->v, l->n * sizeof *n->v);
    *out = list_value(n, JV_LIST);
    return 0;
}

// ---- loop -------------------------------------------------------------------------------------
static int m_loop_cycle(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    if (!a->npos) return jr_fail(r, "loop.cycle() needs at least one argument");
    *out = a->pos[c->self.loop->index0 % a->npos];
    return 0;
}

// changed(*values): true when the values differ from the previous call's.
static int m_loop_changed(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jloop *loop = c->self.loop;
    struct jcallargs *a = c->a;
    struct jlist *l = jv_list_new(r, a->npos);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < a->npos; i++) l->v[i] = a->pos[i];
    struct jv now = list_value(l, JV_LIST);
    bool eq = false;
    if (loop->changed_seen) {
        int rc = jv_equal(r, now, loop->last_changed, &eq, 0);
        if (rc) return rc;
    }
    loop->last_changed = now;
    loop->changed_seen = true;
    *out = jv_bool(!eq);
    return 0;
}

// loop.index, loop.first... (mode: which one).
enum loop_attr { LA_INDEX, LA_INDEX0, LA_REVINDEX, LA_REVINDEX0, LA_FIRST, LA_LAST, LA_LENGTH,
                 LA_DEPTH, LA_DEPTH0, LA_PREVITEM, LA_NEXTITEM };

static int a_loop(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    struct jloop *l = c->self.loop;
    size_t i = l->index0, n = l->length;
    switch ((enum loop_attr)c->row->mode) {
    case LA_INDEX: *out = jv_int((int64_t)i + 1); break;
    case LA_INDEX0: *out = jv_int((int64_t)i); break;
    case LA_REVINDEX: *out = jv_int((int64_t)(n - i)); break;
    case LA_REVINDEX0: *out = jv_int((int64_t)(n - i - 1)); break;
    case LA_FIRST: *out = jv_bool(i == 0); break;
    case LA_LAST: *out = jv_bool(i + 1 == n); break;
    case LA_LENGTH: *out = jv_int((int64_t)n); break;
    case LA_DEPTH: *out = jv_int(1); break;
    case LA_DEPTH0: *out = jv_int(0); break;
    case LA_PREVITEM: *out = i > 0 ? l->items->v[i - 1] : jv_undef_msg("there is no previous item"); break;
    case LA_NEXTITEM: *out = i + 1 < n ? l->items->v[i + 1] : jv_undef_msg("there is no next item"); break;
    }
    return 0;
}

// ---- globals ----------------------------------------------------------------------------------
static int g_range(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    if (a->npos < 1 || a->npos > 3 || a->nkw) return jr_fail(r, "range expected 1 to 3 integer arguments");
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->npos; i++) {
        int rc = want_int(r, "range()", a->pos[i], &v[i]);
        if (rc) return rc;
    }
    int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1];
    int64_t step = a->npos == 3 ? v[2] : 1;
    if (step == 0) return jr_fail(r, "range() arg 3 must not be zero");
    long double cnt = 0;
    if (step > 0 && start < stop) cnt = ((long double)stop - start - 1) / step + 1;
    if (step < 0 && start > stop) cnt = ((long double)start - stop - 1) / (-(long double)step) + 1;
    if (cnt > JINJA_MAX_RANGE)
        return jr_fail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                       JINJA_MAX_RANGE);
    size_t n = (size_t)cnt;
    // Building the list is work too: nested ranges hit the step limit before the memory limit.
    int rc = jr_step(r, n);
    if (rc) return rc;
    struct jlist *l = jv_list_new(r, n);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < n; i++) l->v[i] = jv_int(start + (int64_t)i * step);
    *out = list_value(l, JV_LIST);
    return 0;
}

// dict(...) (mode 0) and namespace(...) (mode 1): a mapping or iterable of
// pairs, then keyword arguments.
static int g_dict(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    const char *name = c->row->name;
    bool ns = c->row->mode;
    if (a->npos > 1) return jr_fail(r, "%s expected at most 1 argument, got %zu", name, a->npos);
    struct jdict *d = jv_dict_new(r, 0);
    if (!d) return MS_EINVAL;
    int rc = 0;
    if (a->npos == 1) {
        struct jv src = a->pos[0];
        if (src.t == JV_DICT || src.t == JV_NS) {
            for (size_t i = 0; i < src.d->n && !rc; i++) rc = jv_dict_set(r, d, src.d->keys[i], src.d->vals[i]);
        } else {
            struct jlist *items;
            if ((rc = jv_iterate(r, src, &items))) return rc;
            for (size_t i = 0; i < items->n && !rc; i++) {
                struct jv p = items->v[i];
                if ((p.t != JV_LIST && p.t != JV_TUPLE) || p.l->n != 2)
                    return jr_fail(r, "%s: element #%zu is not a pair", name, i);
                rc = jv_dict_set(r, d, p.l->v[0], p.l->v[1]);
            }
        }
    }
    for (size_t k = 0; k < a->nkw && !rc; k++) rc = jv_dict_set(r, d, jv_str(a->kwn[k].p, a->kwn[k].n), a->kwv[k]);
    if (rc) return rc;
    *out = dict_value(d, ns ? JV_NS : JV_DICT);
    return 0;
}

static int g_raise(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)out;
    struct jcallargs *a = c->a;
    struct jstr msg = {"", 0};
    if (a->npos > 0) {
        int rc = jv_stringify(r, a->pos[0], &msg);
        if (rc) return rc;
    }
    r->raised = true;
    return ms_err(r->err, r->errlen, MS_EINVAL, "%.*s", (int)(msg.n > 4000 ? 4000 : msg.n), msg.p);
}

static int g_strftime(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    if (a->npos != 1 || a->nkw || a->pos[0].t != JV_STR)
        return jr_fail(r, "strftime_now() takes one format string");
    struct jstr fmt = a->pos[0].s;
    char *cfmt = jr_alloc(r, fmt.n + 1);
    if (!cfmt) return MS_EINVAL;
    memcpy(cfmt, fmt.p, fmt.n);
    cfmt[fmt.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    for (size_t cap = 256; cap <= 65536; cap *= 4) {
        char *buf = jr_alloc(r, cap);
        if (!buf) return MS_EINVAL;
        size_t n = strftime(buf, cap, cfmt, &tm);
        if (n || fmt.n == 0) {
            *out = jv_str(buf, n);
            return 0;
        }
    }
    return jr_fail(r, "strftime_now(): the formatted date is too long");
}

// ---- sorting helpers -----------------------------------------------------------------------------
struct sort_item {
    struct jv key;
    struct jv item;
    size_t idx;
};

struct sort_ctx {
    struct jrender *r;
    bool case_sensitive, reverse;
    int rc;
};

static int cmp_with_case(struct jrender *r, struct jv a, struct jv b, bool cs, int *out)
{
    if (!cs && a.t == JV_STR && b.t == JV_STR) {
        struct jv la, lb;
        int rc = change_case(r, a.s, CASE_LOWER, &la);
        if (!rc) rc = change_case(r, b.s, CASE_LOWER, &lb);
        if (rc) return rc;
        return jv_compare(r, la, lb, out, "<");
    }
    return jv_compare(r, a, b, out, "<");
}

// A stable merge sort (qsort is not stable and cannot report errors).
static int merge_sort(struct sort_ctx *c, struct sort_item *v, struct sort_item *tmp, size_t n)
{
    if (n < 2) return 0;
    size_t h = n / 2;
    int rc = merge_sort(c, v, tmp, h);
    if (!rc) rc = merge_sort(c, v + h, tmp, n - h);
    if (rc) return rc;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int cmp;
        if ((rc = cmp_with_case(c->r, v[j].key, v[i].key, c->case_sensitive, &cmp))) return rc;
        // Take from the right only when strictly before (stability); reversed order flips it.
        bool right_first = c->reverse ? (cmp > 0) : (cmp < 0);
        tmp[k++] = right_first ? v[j++] : v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    return 0;
}

static int sort_items(struct jrender *r, struct sort_item *v, size_t n, bool cs, bool reverse)
{
    if (n < 2) return 0;
    struct sort_item *tmp = jr_alloc(r, n * sizeof *tmp);
    if (!tmp) return MS_EINVAL;
    struct sort_ctx c = {r, cs, reverse, 0};
    return merge_sort(&c, v, tmp, n);
}

// ---- filters --------------------------------------------------------------------------------------
// An attribute path given as a string, or as an integer (an index).
static int attr_path(struct jrender *r, const char *what, struct jv attr, struct jstr *path)
{
    if (attr.t != JV_INT) return want_str(r, what, attr, path);
    char *s = jr_alloc(r, 24);
    if (!s) return MS_EINVAL;
    path->n = (size_t)snprintf(s, 24, "%lld", (long long)attr.i);
    path->p = s;
    return 0;
}

static int to_sort_items(struct jrender *r, struct jv seq, struct jv attr, bool has_attr,
                         struct sort_item **out, size_t *n)
{
    struct jlist *items;
    int rc = jv_iterate(r, seq, &items);
    if (rc) return rc;
    struct sort_item *v = jr_alloc(r, (items->n ? items->n : 1) * sizeof *v);
    if (!v) return MS_EINVAL;
    for (size_t i = 0; i < items->n; i++) {
        v[i].item = items->v[i];
        v[i].idx = i;
        v[i].key = items->v[i];
        if (has_attr && attr.t != JV_NONE) {
            struct jstr path;
            if ((rc = attr_path(r, "attribute", attr, &path))) return rc;
            if ((rc = get_path(r, items->v[i], path, &v[i].key))) return rc;
        }
    }
    *out = v;
    *n = items->n;
    return 0;
}

// select, reject, selectattr and rejectattr (mode: SEL_* bits).
enum { SEL_KEEP = 1, SEL_ATTR = 2 };

static int f_select(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    bool attr_mode = c->row->mode & SEL_ATTR, select = c->row->mode & SEL_KEEP;
    struct jlist *items;
    int rc = jv_iterate(r, c->self, &items);
    if (rc) return rc;
    size_t skip = 0;
    struct jstr attr = {0}, test = {0};
    bool have_test = false;
    if (attr_mode) {
        if (a->npos < 1) return jr_fail(r, "%s needs an attribute name", c->row->name);
        if ((rc = want_str(r, "attribute", a->pos[0], &attr))) return rc;
        skip = 1;
    }
    if (a->npos > skip) {
        if ((rc = want_str(r, "test name", a->pos[skip], &test))) return rc;
        have_test = true;
        skip++;
    }
    struct jcallargs targs = {a->npos - skip, a->pos ? a->pos + skip : NULL, a->nkw, a->kwn, a->kwv};
    struct jlist *l = jv_list_new(r, items->n);
    if (!l) return MS_EINVAL;
    l->n = 0;
    for (size_t i = 0; i < items->n; i++) {
        if ((rc = jr_step(r, 1))) return rc;
        struct jv v = items->v[i];
        if (attr_mode && (rc = get_path(r, v, attr, &v))) return rc;
        bool t;
        if (have_test) {
            if ((rc = jb_test(r, test, v, &targs, &t))) return rc;
        } else {
            t = jv_truthy(v);
        }
        if (t == select) l->v[l->n++] = items->v[i];
    }
    *out = list_value(l, JV_LIST);
    return 0;
}

static int f_map(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    struct jlist *items;
    int rc = jv_iterate(r, c->self, &items);
    if (rc) return rc;
    struct jlist *l = jv_list_new(r, items->n);
    if (!l) return MS_EINVAL;
    // map(attribute='x', default=...) or map('filter', *args, **kwargs)
    struct jv attr = jv_undef(), def = jv_undef();
    bool has_attr = false, has_def = false;
    for (size_t k = 0; k < a->nkw; k++) {
        if (jstr_eq(a->kwn[k], "attribute")) attr = a->kwv[k], has_attr = true;
        else if (jstr_eq(a->kwn[k], "default")) def = a->kwv[k], has_def = true;
    }
    if (has_attr) {
        if (a->npos) return jr_fail(r, "map(attribute=...) takes no positional arguments");
        struct jstr path;
        if ((rc = attr_path(r, "map attribute", attr, &path))) return rc;
        for (size_t i = 0; i < items->n; i++) {
            if ((rc = jr_step(r, 1))) return rc;
            if ((rc = get_path(r, items->v[i], path, &l->v[i]))) return rc;
            if (l->v[i].t == JV_UNDEF && has_def) l->v[i] = def;
        }
    } else {
        if (a->npos < 1) return jr_fail(r, "map needs a filter name or attribute=");
        struct jstr fname;
        if ((rc = want_str(r, "map filter name", a->pos[0], &fname))) return rc;
        struct jcallargs fargs = {a->npos - 1, a->pos + 1, a->nkw, a->kwn, a->kwv};
        for (size_t i = 0; i < items->n; i++) {
            if ((rc = jr_step(r, 1))) return rc;
            if ((rc = jb_filter(r, fname, items->v[i], &fargs, &l->v[i]))) return rc;
        }
    }
    *out = list_value(l, JV_LIST);
    return 0;
}

static int py_int_parse(struct jstr s, int64_t base, int64_t *out)
{
    struct jstr t = strip(s, NULL, true, true);
    if (!t.n || t.n > 80) return -1;
    char buf[96];
    size_t k = 0;
    for (size_t i = 0; i < t.n; i++) {
        if (t.p[i] == '_') {
            if (i == 0 || i + 1 == t.n || t.p[i + 1] == '_') return -1;
            continue;
        }
        buf[k++] = t.p[i];
    }
    buf[k] = 0;
    const char *p = buf;
    if (*p == '+' || *p == '-') p++;
    if (!*p) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(buf, &end, (int)base);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int py_float_parse(struct jstr s, double *out)
{
    struct jstr t = strip(s, NULL, true, true);
    if (!t.n || t.n > 300) return -1;
    char buf[320];
    size_t k = 0;
    for (size_t i = 0; i < t.n; i++)
        if (t.p[i] != '_') buf[k++] = t.p[i];
    buf[k] = 0;
    if (strchr(buf, 'x') || strchr(buf, 'X')) return -1; // no hex floats in Python's float()
    char *end;
    double v = strtod(buf, &end);
    if (end == buf || *end) return -1;
    *out = v;
    return 0;
}

static int html_escape(struct jrender *r, struct jstr s, struct jv *out)
{
    struct ms_buf b = jsb_new(r);
    int rc = 0;
    for (size_t i = 0; i < s.n && !rc; i++) {
        switch (s.p[i]) {
        case '&': rc = jsb_put(r, &b, "&amp;", 5); break;
        case '<': rc = jsb_put(r, &b, "&lt;", 4); break;
        case '>': rc = jsb_put(r, &b, "&gt;", 4); break;
        case '"': rc = jsb_put(r, &b, "&#34;", 5); break;
        case '\'': rc = jsb_put(r, &b, "&#39;", 5); break;
        default: rc = jsb_putc(r, &b, s.p[i]);
        }
    }
    if (rc) return rc;
    *out = jsb_str(&b);
    return 0;
}

static int f_safe(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    *out = c->self;
    return 0;
}

static int f_default(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    struct jv def = c->given[0] ? c->vals[0] : jv_str("", 0);
    bool boolean = c->given[1] && jv_truthy(c->vals[1]);
    *out = (c->self.t == JV_UNDEF || (boolean && !jv_truthy(c->self))) ? def : c->self;
    return 0;
}

static int f_length(struct jrender *r, struct bcall *c, struct jv *out)
{
    int64_t n = 0;
    int rc = py_len(r, c->self, &n);
    if (rc) return rc;
    *out = jv_int(n);
    return 0;
}

static int f_string(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    *out = jv_str(s.p, s.n);
    return 0;
}

static int f_trim(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s, chars, *cp = NULL;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    if (c->given[0] && c->vals[0].t != JV_NONE) {
        if ((rc = want_str(r, "trim chars", c->vals[0], &chars))) return rc;
        cp = &chars;
    }
    struct jstr o = strip(s, cp, true, true);
    *out = jv_str(o.p, o.n);
    return 0;
}

// upper, lower, title (Jinja's, not Python's) and capitalize (mode: enum casemode).
static int f_case(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    return change_case(r, s, (int)c->row->mode, out);
}

static int f_replace(struct jrender *r, struct bcall *c, struct jv *out)
{
    if (!c->given[0] || !c->given[1]) return jr_fail(r, "filter 'replace' needs old and new");
    struct jstr s, old, new_;
    int64_t count = -1;
    int rc;
    if ((rc = jv_stringify(r, c->self, &s)) || (rc = jv_stringify(r, c->vals[0], &old)) ||
        (rc = jv_stringify(r, c->vals[1], &new_)))
        return rc;
    if (c->given[2] && c->vals[2].t != JV_NONE && (rc = want_int(r, "replace count", c->vals[2], &count)))
        return rc;
    return replace_str(r, s, old, new_, count, out);
}

static int f_join(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr sep = {"", 0};
    int rc;
    if (c->given[0] && (rc = jv_stringify(r, c->vals[0], &sep))) return rc;
    struct jlist *items;
    if ((rc = jv_iterate(r, c->self, &items))) return rc;
    struct ms_buf b = jsb_new(r);
    for (size_t i = 0; i < items->n; i++) {
        struct jv it = items->v[i];
        if (c->given[1] && c->vals[1].t != JV_NONE) {
            struct jstr path;
            if ((rc = want_str(r, "join attribute", c->vals[1], &path))) return rc;
            if ((rc = get_path(r, it, path, &it))) return rc;
        }
        if (i && (rc = jsb_put(r, &b, sep.p, sep.n))) return rc;
        if ((rc = jv_to_str(r, it, &b))) return rc;
    }
    *out = jsb_str(&b);
    return 0;
}

// first (mode 0) and last (mode 1).
static int f_first_last(struct jrender *r, struct bcall *c, struct jv *out)
{
    bool last = c->row->mode;
    const char *empty = last ? "No last item, sequence was empty." : "No first item, sequence was empty.";
    if (c->self.t == JV_UNDEF) {
        *out = jv_undef_msg(empty);
        return 0;
    }
    struct jlist *items;
    int rc = jv_iterate(r, c->self, &items);
    if (rc) return rc;
    if (!items->n) {
        *out = jv_undef_msg(empty);
        return 0;
    }
    *out = items->v[last ? items->n - 1 : 0];
    return 0;
}

static int f_list(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jlist *items;
    int rc = jv_iterate(r, c->self, &items);
    if (rc) return rc;
    struct jlist *l = jv_list_new(r, items->n);
    if (!l) return MS_EINVAL;
    if (items->n) memcpy(l->v, items->v, items->n * sizeof *l->v);
    *out = list_value(l, JV_LIST);
    return 0;
}

static int f_items(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    if (v.t == JV_UNDEF) {
        struct jlist *l = jv_list_new(r, 0);
        if (!l) return MS_EINVAL;
        *out = list_value(l, JV_LIST);
        return 0;
    }
    if (v.t != JV_DICT) return jr_fail(r, "can only get item pairs from a mapping, not %s", jv_type_name(v.t));
    return items_of(r, v.d, out);
}

static int f_reverse(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    int rc;
    if (v.t == JV_STR) {
        struct jlist *chars;
        if ((rc = jv_iterate(r, v, &chars))) return rc;
        char *s = jr_alloc(r, v.s.n + 1);
        if (!s) return MS_EINVAL;
        size_t o = 0;
        for (size_t i = chars->n; i-- > 0;) {
            memcpy(s + o, chars->v[i].s.p, chars->v[i].s.n);
            o += chars->v[i].s.n;
        }
        s[o] = 0;
        *out = jv_str(s, o);
        return 0;
    }
    struct jlist *items;
    if ((rc = jv_iterate(r, v, &items))) return rc;
    struct jlist *l = jv_list_new(r, items->n);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < items->n; i++) l->v[i] = items->v[items->n - 1 - i];
    *out = list_value(l, JV_LIST);
    return 0;
}

static int f_int(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    struct jv def = c->given[0] ? c->vals[0] : jv_int(0);
    int64_t base = 10;
    int rc;
    if (c->given[1] && (rc = want_int(r, "int base", c->vals[1], &base))) return rc;
    if (base < 2 || base > 36) return jr_fail(r, "int() base must be >= 2 and <= 36");
    int64_t iv;
    double d;
    switch (v.t) {
    case JV_INT: *out = v; return 0;
    case JV_BOOL: *out = jv_int(v.b); return 0;
    case JV_FLOAT:
        if (!isfinite(v.f)) { *out = def; return 0; }
        if (fabs(v.f) >= 9.2e18) return jr_fail(r, "int(): %g does not fit in 64 bits", v.f);
        *out = jv_int((int64_t)v.f);
        return 0;
    case JV_STR:
        if (py_int_parse(v.s, base, &iv) == 0) *out = jv_int(iv);
        else if (py_float_parse(v.s, &d) == 0 && isfinite(d) && fabs(d) < 9.2e18) *out = jv_int((int64_t)d);
        else *out = def;
        return 0;
    default:
        *out = def;
        return 0;
    }
}

static int f_float(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    struct jv v = c->self;
    struct jv def = c->given[0] ? c->vals[0] : jv_float(0.0);
    double d;
    if (jv_is_number(v)) *out = jv_float(jv_num(v));
    else if (v.t == JV_STR && py_float_parse(v.s, &d) == 0) *out = jv_float(d);
    else *out = def;
    return 0;
}

static int f_abs(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    if (v.t == JV_FLOAT) *out = jv_float(fabs(v.f));
    else if (v.t == JV_INT || v.t == JV_BOOL) {
        int64_t i = v.t == JV_BOOL ? v.b : v.i;
        if (i == INT64_MIN) return jr_fail(r, "integer overflow in abs");
        *out = jv_int(i < 0 ? -i : i);
    } else return jr_fail(r, "bad operand type for abs(): '%s'", jv_type_name(v.t));
    return 0;
}

static int f_round(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    int64_t prec = 0;
    int rc;
    if (c->given[0] && (rc = want_int(r, "round precision", c->vals[0], &prec))) return rc;
    struct jstr method = {"common", 6};
    if (c->given[1] && (rc = want_str(r, "round method", c->vals[1], &method))) return rc;
    if (!jv_is_number(v)) return jr_fail(r, "filter 'round' needs a number, not %s", jv_type_name(v.t));
    double x = jv_num(v), res;
    if (prec < -300 || prec > 300) return jr_fail(r, "round precision out of range");
    if (jstr_eq(method, "common") && v.t != JV_FLOAT && prec >= 0) {
        *out = jv_int(v.t == JV_BOOL ? v.b : v.i); // round(int, n) stays an int
        return 0;
    }
    if (jstr_eq(method, "common")) {
        char buf[400];
        if (prec >= 0) {
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            res = strtod(buf, NULL);
        } else {
            double p = pow(10.0, (double)-prec);
            res = nearbyint(x / p) * p;
        }
    } else if (jstr_eq(method, "ceil") || jstr_eq(method, "floor")) {
        double p = pow(10.0, (double)prec);
        res = (method.p[0] == 'c' ? ceil(x * p) : floor(x * p)) / p;
    } else {
        return jr_fail(r, "method must be common, ceil or floor");
    }
    *out = jv_float(res);
    return 0;
}

static int f_escape(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    return html_escape(r, s, out);
}

static int f_format(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    struct jstr s;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    if (a->npos && a->nkw) return jr_fail(r, "can't handle positional and keyword arguments at the same time");
    struct jv args;
    if (a->nkw) {
        struct jdict *d = jv_dict_new(r, a->nkw);
        if (!d) return MS_EINVAL;
        for (size_t k = 0; k < a->nkw; k++)
            if ((rc = jv_dict_set(r, d, jv_str(a->kwn[k].p, a->kwn[k].n), a->kwv[k]))) return rc;
        args = dict_value(d, JV_DICT);
    } else {
        struct jlist *l = jv_list_new(r, a->npos);
        if (!l) return MS_EINVAL;
        for (size_t i = 0; i < a->npos; i++) l->v[i] = a->pos[i];
        args = list_value(l, JV_TUPLE);
    }
    return jb_percent_format(r, s, args, out);
}

static int f_indent(struct jrender *r, struct bcall *c, struct jv *out)
{
    const struct jv *vals = c->vals;
    const bool *given = c->given;
    struct jstr s, ind;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    if (given[0] && vals[0].t == JV_STR) {
        ind = vals[0].s;
    } else {
        int64_t w = 4;
        if (given[0] && (rc = want_int(r, "indent width", vals[0], &w))) return rc;
        if (w < 0) w = 0;
        if (w > 1000) return jr_fail(r, "indent width %lld is too large", (long long)w);
        char *sp = jr_alloc(r, (size_t)w + 1);
        if (!sp) return MS_EINVAL;
        memset(sp, ' ', (size_t)w);
        ind = (struct jstr){sp, (size_t)w};
    }
    bool first = given[1] && jv_truthy(vals[1]), blank = given[2] && jv_truthy(vals[2]);
    // Jinja appends a newline so that splitlines keeps a trailing empty line.
    char *tmp = jr_alloc(r, s.n + 2);
    if (!tmp) return MS_EINVAL;
    memcpy(tmp, s.p, s.n);
    tmp[s.n] = '\n';
    tmp[s.n + 1] = 0;
    struct jlist *lines;
    if ((rc = splitlines(r, (struct jstr){tmp, s.n + 1}, false, &lines))) return rc;
    struct ms_buf b = jsb_new(r);
    if (first) rc = jsb_put(r, &b, ind.p, ind.n);
    for (size_t i = 0; i < lines->n && !rc; i++) {
        struct jstr ln = lines->v[i].s;
        if (i) {
            rc = jsb_putc(r, &b, '\n');
            if (!rc && (blank || ln.n)) rc = jsb_put(r, &b, ind.p, ind.n);
        }
        if (!rc) rc = jsb_put(r, &b, ln.p, ln.n);
    }
    if (rc) return rc;
    *out = jsb_str(&b);
    return 0;
}

static int f_center(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s;
    int64_t w = 80;
    int rc;
    if ((rc = jv_stringify(r, c->self, &s))) return rc;
    if (c->given[0] && (rc = want_int(r, "center width", c->vals[0], &w))) return rc;
    int64_t len = (int64_t)ju_count(s.p, s.n);
    if (w > 100000) return jr_fail(r, "center width too large");
    if (w <= len) {
        *out = jv_str(s.p, s.n);
        return 0;
    }
    int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
    struct ms_buf b = jsb_new(r);
    for (int64_t i = 0; i < left && !rc; i++) rc = jsb_putc(r, &b, ' ');
    if (!rc) rc = jsb_put(r, &b, s.p, s.n);
    for (int64_t i = 0; i < marg - left && !rc; i++) rc = jsb_putc(r, &b, ' ');
    if (rc) return rc;
    *out = jsb_str(&b);
    return 0;
}

static int f_wordcount(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    int64_t words = 0;
    bool in = false;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        i += ju_decode(s.p + i, s.n - i, &cp);
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        bool w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                 cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
        if (w && !in) words++;
        in = w;
    }
    *out = jv_int(words);
    return 0;
}

static int f_attr(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jcallargs *a = c->a;
    struct jv v = c->self;
    if (a->npos != 1 || a->nkw) return jr_fail(r, "filter 'attr' takes one attribute name");
    struct jstr an;
    int rc = want_str(r, "attr name", a->pos[0], &an);
    if (rc) return rc;
    if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
    if (v.t == JV_LOOP) return jb_loop_attr(r, v, an, out);
    if (v.t == JV_NS) {
        const struct jv *hit = jv_dict_get_str(r, v.d, an.p, an.n);
        *out = hit ? *hit : jv_undef_attr(JV_NS, an);
        return 0;
    }
    rc = 0;
    if (!jb_method(r, v, an, out, &rc)) *out = jv_undef_attr(v.t, an);
    return rc;
}

// sort, unique, min and max: the items keyed by the attribute parameter, if given.
static int keyed_items(struct jrender *r, struct bcall *c, int attr_param, struct sort_item **items,
                       size_t *n)
{
    struct jv attr = jv_none();
    bool has_attr = c->given[attr_param];
    if (has_attr) attr = c->vals[attr_param];
    int rc = to_sort_items(r, c->self, attr, has_attr, items, n);
    return rc ? rc : jr_step(r, *n);
}

static int f_sort(struct jrender *r, struct bcall *c, struct jv *out)
{
    bool reverse = c->given[0] && jv_truthy(c->vals[0]), cs = c->given[1] && jv_truthy(c->vals[1]);
    struct sort_item *items;
    size_t n;
    int rc = keyed_items(r, c, 2, &items, &n);
    if (!rc) rc = sort_items(r, items, n, cs, reverse);
    if (rc) return rc;
    struct jlist *l = jv_list_new(r, n);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < n; i++) l->v[i] = items[i].item;
    *out = list_value(l, JV_LIST);
    return 0;
}

static int f_unique(struct jrender *r, struct bcall *c, struct jv *out)
{
    bool cs = c->given[0] && jv_truthy(c->vals[0]);
    struct sort_item *items;
    size_t n;
    int rc = keyed_items(r, c, 1, &items, &n);
    if (rc) return rc;
    struct jlist *l = jv_list_new(r, n);
    if (!l) return MS_EINVAL;
    l->n = 0;
    struct jlist *seen = jv_list_new(r, n);
    if (!seen) return MS_EINVAL;
    seen->n = 0;
    for (size_t i = 0; i < n; i++) {
        struct jv key = items[i].key;
        if (!cs && key.t == JV_STR && (rc = change_case(r, key.s, CASE_LOWER, &key))) return rc;
        bool dup = false;
        for (size_t k = 0; k < seen->n && !dup; k++)
            if ((rc = jv_equal(r, seen->v[k], key, &dup, 0))) return rc;
        if (dup) continue;
        seen->v[seen->n++] = key;
        l->v[l->n++] = items[i].item;
    }
    *out = list_value(l, JV_LIST);
    return 0;
}

// min (mode 0) and max (mode 1).
static int f_minmax(struct jrender *r, struct bcall *c, struct jv *out)
{
    bool cs = c->given[0] && jv_truthy(c->vals[0]);
    struct sort_item *items;
    size_t n;
    int rc = keyed_items(r, c, 1, &items, &n);
    if (rc) return rc;
    if (!n) {
        *out = jv_undef_msg("No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
        int cmp;
        if ((rc = cmp_with_case(r, items[i].key, items[best].key, cs, &cmp))) return rc;
        if (c->row->mode ? cmp > 0 : cmp < 0) best = i;
    }
    *out = items[best].item;
    return 0;
}

static int f_dictsort(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    const struct jv *vals = c->vals;
    const bool *given = c->given;
    int rc;
    if (v.t != JV_DICT) return jr_fail(r, "filter 'dictsort' needs a mapping, not %s", jv_type_name(v.t));
    bool cs = given[0] && jv_truthy(vals[0]), reverse = given[2] && jv_truthy(vals[2]);
    bool by_value = false;
    if (given[1]) {
        struct jstr by = {"", 0};
        if ((rc = want_str(r, "dictsort by", vals[1], &by))) return rc;
        if (jstr_eq(by, "value")) by_value = true;
        else if (!jstr_eq(by, "key")) return jr_fail(r, "You can only sort by either \"key\" or \"value\"");
    }
    struct jv pairs;
    if ((rc = items_of(r, v.d, &pairs))) return rc;
    size_t n = pairs.l->n;
    struct sort_item *items = jr_alloc(r, (n ? n : 1) * sizeof *items);
    if (!items) return MS_EINVAL;
    for (size_t i = 0; i < n; i++) {
        items[i].item = pairs.l->v[i];
        items[i].key = pairs.l->v[i].l->v[by_value ? 1 : 0];
        items[i].idx = i;
    }
    if ((rc = sort_items(r, items, n, cs, reverse))) return rc;
    for (size_t i = 0; i < n; i++) pairs.l->v[i] = items[i].item;
    *out = pairs;
    return 0;
}

static int f_sum(struct jrender *r, struct bcall *c, struct jv *out)
{
    const struct jv *vals = c->vals;
    const bool *given = c->given;
    struct jv acc = given[1] ? vals[1] : jv_int(0);
    struct jlist *items;
    int rc = jv_iterate(r, c->self, &items);
    if (rc) return rc;
    for (size_t i = 0; i < items->n; i++) {
        struct jv it = items->v[i];
        if (given[0] && vals[0].t != JV_NONE) {
            struct jstr path;
            if ((rc = want_str(r, "sum attribute", vals[0], &path))) return rc;
            if ((rc = get_path(r, it, path, &it))) return rc;
        }
        if (!jv_is_number(acc) || !jv_is_number(it))
            return jr_fail(r, "unsupported operand type(s) for +: '%s' and '%s'",
                           jv_type_name(acc.t), jv_type_name(it.t));
        if (acc.t == JV_FLOAT || it.t == JV_FLOAT) acc = jv_float(jv_num(acc) + jv_num(it));
        else {
            int64_t z;
            if (__builtin_add_overflow(acc.t == JV_BOOL ? acc.b : acc.i, it.t == JV_BOOL ? it.b : it.i, &z))
                return jr_fail(r, "integer overflow in sum");
            acc = jv_int(z);
        }
    }
    *out = acc;
    return 0;
}

static int f_batch(struct jrender *r, struct bcall *c, struct jv *out)
{
    const struct jv *vals = c->vals;
    const bool *given = c->given;
    int64_t cnt;
    int rc;
    if (!given[0]) return jr_fail(r, "filter 'batch' needs a line count");
    if ((rc = want_int(r, "batch linecount", vals[0], &cnt))) return rc;
    if (cnt <= 0) return jr_fail(r, "batch linecount must be positive");
    struct jlist *items;
    if ((rc = jv_iterate(r, c->self, &items))) return rc;
    size_t nb = (items->n + (size_t)cnt - 1) / (size_t)cnt;
    struct jlist *l = jv_list_new(r, nb);
    if (!l) return MS_EINVAL;
    for (size_t b = 0; b < nb; b++) {
        size_t st = b * (size_t)cnt, n = items->n - st < (size_t)cnt ? items->n - st : (size_t)cnt;
        size_t full = given[1] && vals[1].t != JV_NONE ? (size_t)cnt : n;
        struct jlist *row = jv_list_new(r, full);
        if (!row) return MS_EINVAL;
        for (size_t k = 0; k < full; k++) row->v[k] = k < n ? items->v[st + k] : vals[1];
        l->v[b] = list_value(row, JV_LIST);
    }
    *out = list_value(l, JV_LIST);
    return 0;
}

// ---- tests -------------------------------------------------------------------------------------------
// The tests that ask for a value's type (mode: the set of types that pass).
static int t_type(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    *out = jv_bool(c->row->mode & TM(c->self.t));
    return 0;
}

// true (mode 1) and false (mode 0): the boolean itself, not truthiness.
static int t_bool(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    *out = jv_bool(c->self.t == JV_BOOL && c->self.b == (bool)c->row->mode);
    return 0;
}

// `is filter` / `is test` (mode: the kind): whether the string names one.
static int t_builtin(struct jrender *r, struct bcall *c, struct jv *out)
{
    (void)r;
    struct jv v = c->self;
    *out = jv_bool(v.t == JV_STR && (c->row->mode == JB_FILTER ? jb_has_filter(v.s) : jb_has_test(v.s)));
    return 0;
}

// odd (mode 1) and even (mode 0).
static int t_parity(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self;
    char what[64];
    if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
    if (v.t != JV_INT && v.t != JV_BOOL)
        return jr_fail(r, "%s needs an integer, not %s", describe(c, what, sizeof what), jv_type_name(v.t));
    int64_t i = v.t == JV_BOOL ? v.b : v.i;
    *out = jv_bool((i % 2 != 0) == (bool)c->row->mode);
    return 0;
}

// lower and upper (mode: IS_LOWER / IS_UPPER), on str(value).
static int t_case(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jstr s;
    int rc = jv_stringify(r, c->self, &s);
    if (rc) return rc;
    *out = jv_bool(str_is(s, c->row->mode));
    return 0;
}

// eq, ne, lt, le, gt, ge and their aliases (mode: the operator, enum jop).
static int t_compare(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self, o = c->a->pos[0];
    int op = (int)c->row->mode, rc;
    if (op == JOP_EQ || op == JOP_NE) {
        bool eq;
        if ((rc = jv_equal(r, v, o, &eq, 0))) return rc;
        *out = jv_bool(op == JOP_EQ ? eq : !eq);
        return 0;
    }
    int cmp;
    if ((rc = jv_compare(r, v, o, &cmp, jinja_op_text(op)))) return rc;
    *out = jv_bool(op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0);
    return 0;
}

static int t_sameas(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self, o = c->a->pos[0];
    bool same;
    if (v.t != o.t) same = false;
    else if (v.t == JV_LIST || v.t == JV_TUPLE) same = v.l == o.l;
    else if (v.t == JV_DICT || v.t == JV_NS) same = v.d == o.d;
    else if (v.t == JV_STR) same = v.s.p == o.s.p && v.s.n == o.s.n;
    else {
        int rc = jv_equal(r, v, o, &same, 0);
        if (rc) return rc;
    }
    *out = jv_bool(same);
    return 0;
}

static int t_divisibleby(struct jrender *r, struct bcall *c, struct jv *out)
{
    int64_t d = 0, x = 0;
    int rc;
    if ((rc = want_int(r, "divisibleby", c->a->pos[0], &d))) return rc;
    if ((rc = want_int(r, "divisibleby", c->self, &x))) return rc;
    if (d == 0) return jr_fail(r, "integer division or modulo by zero");
    *out = jv_bool(d == -1 || x % d == 0);
    return 0;
}

static int t_in(struct jrender *r, struct bcall *c, struct jv *out)
{
    struct jv v = c->self, o = c->a->pos[0];
    bool in = false;
    int rc;
    switch (o.t) {
    case JV_STR:
        if (v.t != JV_STR) return jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_type_name(v.t));
        in = v.s.n == 0 || memmem(o.s.p, o.s.n, v.s.p, v.s.n) != NULL;
        break;
    case JV_LIST: case JV_TUPLE:
        for (size_t i = 0; i < o.l->n && !in; i++)
            if ((rc = jv_equal(r, v, o.l->v[i], &in, 0))) return rc;
        break;
    case JV_DICT: in = jv_dict_get(r, o.d, v) != NULL; break;
    case JV_UNDEF: break;
    default: return jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(o.t));
    }
    *out = jv_bool(in);
    return 0;
}

// ---- the table ---------------------------------------------------------------------------------------
// Every builtin: its name, kind, what it takes and the function that runs it.
// The parser's name checks, `is filter` / `is test`, attribute lookup and
// every call read this one table; a new builtin is one row.
#define FILTER(n, a, f, ...) {.name = n, .kind = JB_FILTER, .args = a, .fn = f, __VA_ARGS__}
#define TEST(n, a, f, ...) {.name = n, .kind = JB_TEST, .args = a, .fn = f, __VA_ARGS__}
#define METHOD(types, n, a, f, ...) \
    {.name = n, .kind = JB_METHOD, .args = a, .recv = types, .fn = f, __VA_ARGS__}
#define GLOBAL(n, f, ...) {.name = n, .kind = JB_GLOBAL, .args = JA_RAW, .fn = f, __VA_ARGS__}
#define LOOP_ATTR(n, which) \
    {.name = n, .kind = JB_ATTR, .args = JA_RAW, .recv = TM(JV_LOOP), .fn = a_loop, .mode = which}
#define PARAMS(...) .params = {__VA_ARGS__}
#define MODE(m) .mode = (m)

#define STR TM(JV_STR)
#define DICT TM(JV_DICT)
#define LIST TM(JV_LIST)
#define SEQ (TM(JV_LIST) | TM(JV_TUPLE))
#define LOOP TM(JV_LOOP)
#define ITERABLE (TM(JV_STR) | TM(JV_LIST) | TM(JV_TUPLE) | TM(JV_DICT) | TM(JV_UNDEF))

static const struct jb_row rows[] = {
    // filters
    FILTER("abs", JA_NONE, f_abs),
    FILTER("attr", JA_RAW, f_attr),
    FILTER("batch", JA_PARAMS, f_batch, PARAMS("linecount", "fill_with")),
    FILTER("capitalize", JA_NONE, f_case, MODE(CASE_CAPITALIZE)),
    FILTER("center", JA_PARAMS, f_center, PARAMS("width")),
    FILTER("count", JA_NONE, f_length),
    FILTER("d", JA_PARAMS, f_default, PARAMS("default_value", "boolean")),
    FILTER("default", JA_PARAMS, f_default, PARAMS("default_value", "boolean")),
    FILTER("dictsort", JA_PARAMS, f_dictsort, PARAMS("case_sensitive", "by", "reverse")),
    FILTER("e", JA_NONE, f_escape),
    FILTER("escape", JA_NONE, f_escape),
    FILTER("first", JA_NONE, f_first_last, MODE(0)),
    FILTER("float", JA_PARAMS, f_float, PARAMS("default")),
    FILTER("forceescape", JA_NONE, f_escape),
    FILTER("format", JA_RAW, f_format),
    FILTER("indent", JA_PARAMS, f_indent, PARAMS("width", "first", "blank")),
    FILTER("int", JA_PARAMS, f_int, PARAMS("default", "base")),
    FILTER("items", JA_NONE, f_items),
    FILTER("join", JA_PARAMS, f_join, PARAMS("d", "attribute")),
    FILTER("last", JA_NONE, f_first_last, MODE(1)),
    FILTER("length", JA_NONE, f_length),
    FILTER("list", JA_NONE, f_list),
    FILTER("lower", JA_NONE, f_case, MODE(CASE_LOWER)),
    FILTER("map", JA_RAW, f_map),
    FILTER("max", JA_PARAMS, f_minmax, MODE(1), PARAMS("case_sensitive", "attribute")),
    FILTER("min", JA_PARAMS, f_minmax, MODE(0), PARAMS("case_sensitive", "attribute")),
    FILTER("reject", JA_RAW, f_select, MODE(0)),
    FILTER("rejectattr", JA_RAW, f_select, MODE(SEL_ATTR)),
    FILTER("replace", JA_PARAMS, f_replace, PARAMS("old", "new", "count")),
    FILTER("reverse", JA_NONE, f_reverse),
    FILTER("round", JA_PARAMS, f_round, PARAMS("precision", "method")),
    FILTER("safe", JA_NONE, f_safe),
    FILTER("select", JA_RAW, f_select, MODE(SEL_KEEP)),
    FILTER("selectattr", JA_RAW, f_select, MODE(SEL_KEEP | SEL_ATTR)),
    FILTER("sort", JA_PARAMS, f_sort, PARAMS("reverse", "case_sensitive", "attribute")),
    FILTER("string", JA_NONE, f_string),
    FILTER("sum", JA_PARAMS, f_sum, PARAMS("attribute", "start")),
    FILTER("title", JA_NONE, f_case, MODE(CASE_JTITLE)),
    FILTER("tojson", JA_PARAMS, f_tojson, PARAMS("ensure_ascii", "indent", "separators", "sort_keys")),
    FILTER("trim", JA_PARAMS, f_trim, PARAMS("chars")),
    FILTER("unique", JA_PARAMS, f_unique, PARAMS("case_sensitive", "attribute")),
    FILTER("upper", JA_NONE, f_case, MODE(CASE_UPPER)),
    FILTER("wordcount", JA_NONE, f_wordcount),

    // tests
    TEST("boolean", JA_NONE, t_type, MODE(TM(JV_BOOL))),
    TEST("callable", JA_NONE, t_type, MODE(TM(JV_FUNC) | TM(JV_MACRO) | TM(JV_LOOP))),
    TEST("defined", JA_NONE, t_type, MODE(~TM(JV_UNDEF))),
    TEST("divisibleby", JA_ONE, t_divisibleby),
    TEST("eq", JA_ONE, t_compare, MODE(JOP_EQ)),
    TEST("equalto", JA_ONE, t_compare, MODE(JOP_EQ)),
    TEST("escaped", JA_NONE, t_type, MODE(0)), // nothing is marked safe here
    TEST("even", JA_NONE, t_parity, MODE(0)),
    TEST("false", JA_NONE, t_bool, MODE(0)),
    TEST("filter", JA_NONE, t_builtin, MODE(JB_FILTER)),
    TEST("float", JA_NONE, t_type, MODE(TM(JV_FLOAT))),
    TEST("ge", JA_ONE, t_compare, MODE(JOP_GE)),
    TEST("greaterthan", JA_ONE, t_compare, MODE(JOP_GT)),
    TEST("gt", JA_ONE, t_compare, MODE(JOP_GT)),
    TEST("in", JA_ONE, t_in),
    TEST("integer", JA_NONE, t_type, MODE(TM(JV_INT))),
    TEST("iterable", JA_NONE, t_type, MODE(ITERABLE)),
    TEST("le", JA_ONE, t_compare, MODE(JOP_LE)),
    TEST("lessthan", JA_ONE, t_compare, MODE(JOP_LT)),
    TEST("lower", JA_NONE, t_case, MODE(IS_LOWER)),
    TEST("lt", JA_ONE, t_compare, MODE(JOP_LT)),
    TEST("mapping", JA_NONE, t_type, MODE(TM(JV_DICT))),
    TEST("ne", JA_ONE, t_compare, MODE(JOP_NE)),
    TEST("none", JA_NONE, t_type, MODE(TM(JV_NONE))),
    TEST("number", JA_NONE, t_type, MODE(TM(JV_BOOL) | TM(JV_INT) | TM(JV_FLOAT))),
    TEST("odd", JA_NONE, t_parity, MODE(1)),
    TEST("sameas", JA_ONE, t_sameas),
    TEST("sequence", JA_NONE, t_type, MODE(ITERABLE)),
    TEST("string", JA_NONE, t_type, MODE(TM(JV_STR))),
    TEST("test", JA_NONE, t_builtin, MODE(JB_TEST)),
    TEST("true", JA_NONE, t_bool, MODE(1)),
    TEST("undefined", JA_NONE, t_type, MODE(TM(JV_UNDEF))),
    TEST("upper", JA_NONE, t_case, MODE(IS_UPPER)),
    TEST("==", JA_ONE, t_compare, MODE(JOP_EQ)),
    TEST("!=", JA_ONE, t_compare, MODE(JOP_NE)),
    TEST("<", JA_ONE, t_compare, MODE(JOP_LT)),
    TEST("<=", JA_ONE, t_compare, MODE(JOP_LE)),
    TEST(">", JA_ONE, t_compare, MODE(JOP_GT)),
    TEST(">=", JA_ONE, t_compare, MODE(JOP_GE)),

    // str methods
    METHOD(STR, "capitalize", JA_NONE, m_str_case, MODE(CASE_CAPITALIZE)),
    METHOD(STR, "count", JA_PARAMS, m_str_find, MODE(FIND_COUNT), PARAMS("sub", "start", "end")),
    METHOD(STR, "endswith", JA_RAW, m_str_affix, MODE(1)),
    METHOD(STR, "find", JA_PARAMS, m_str_find, MODE(0), PARAMS("sub", "start", "end")),
    METHOD(STR, "format", JA_RAW, m_str_format),
    METHOD(STR, "index", JA_PARAMS, m_str_find, MODE(FIND_RAISE), PARAMS("sub", "start", "end")),
    METHOD(STR, "isalnum", JA_NONE, m_str_is, MODE(IS_ALNUM)),
    METHOD(STR, "isalpha", JA_NONE, m_str_is, MODE(IS_ALPHA)),
    METHOD(STR, "isdecimal", JA_NONE, m_str_is, MODE(IS_DIGIT)),
    METHOD(STR, "isdigit", JA_NONE, m_str_is, MODE(IS_DIGIT)),
    METHOD(STR, "islower", JA_NONE, m_str_is, MODE(IS_LOWER)),
    METHOD(STR, "isnumeric", JA_NONE, m_str_is, MODE(IS_DIGIT)),
    METHOD(STR, "isspace", JA_NONE, m_str_is, MODE(IS_SPACE)),
    METHOD(STR, "isupper", JA_NONE, m_str_is, MODE(IS_UPPER)),
    METHOD(STR, "join", JA_ONE, m_str_join),
    METHOD(STR, "lower", JA_NONE, m_str_case, MODE(CASE_LOWER)),
    METHOD(STR, "lstrip", JA_PARAMS, m_str_strip, MODE(STRIP_LEFT), PARAMS("chars")),
    METHOD(STR, "replace", JA_PARAMS, m_str_replace, PARAMS("old", "new", "count")),
    METHOD(STR, "rfind", JA_PARAMS, m_str_find, MODE(FIND_REV), PARAMS("sub", "start", "end")),
    METHOD(STR, "rindex", JA_PARAMS, m_str_find, MODE(FIND_REV | FIND_RAISE), PARAMS("sub", "start", "end")),
    METHOD(STR, "rsplit", JA_PARAMS, m_str_split, MODE(1), PARAMS("sep", "maxsplit")),
    METHOD(STR, "rstrip", JA_PARAMS, m_str_strip, MODE(STRIP_RIGHT), PARAMS("chars")),
    METHOD(STR, "split", JA_PARAMS, m_str_split, MODE(0), PARAMS("sep", "maxsplit")),
    METHOD(STR, "splitlines", JA_PARAMS, m_str_splitlines, PARAMS("keepends")),
    METHOD(STR, "startswith", JA_RAW, m_str_affix, MODE(0)),
    METHOD(STR, "strip", JA_PARAMS, m_str_strip, MODE(STRIP_LEFT | STRIP_RIGHT), PARAMS("chars")),
    METHOD(STR, "title", JA_NONE, m_str_case, MODE(CASE_PYTITLE)),
    METHOD(STR, "upper", JA_NONE, m_str_case, MODE(CASE_UPPER)),

    // dict methods (those that would change the dict are refused by name)
    METHOD(DICT, "clear", JA_RAW, m_mutate),
    METHOD(DICT, "copy", JA_RAW, m_dict_copy),
    METHOD(DICT, "get", JA_RAW, m_dict_get),
    METHOD(DICT, "items", JA_NONE, m_dict_view, MODE(0)),
    METHOD(DICT, "keys", JA_NONE, m_dict_view, MODE(1)),
    METHOD(DICT, "pop", JA_RAW, m_mutate),
    METHOD(DICT, "popitem", JA_RAW, m_mutate),
    METHOD(DICT, "setdefault", JA_RAW, m_mutate),
    METHOD(DICT, "update", JA_RAW, m_mutate),
    METHOD(DICT, "values", JA_NONE, m_dict_view, MODE(2)),

    // list and tuple methods (likewise)
    METHOD(LIST, "append", JA_RAW, m_mutate),
    METHOD(LIST, "clear", JA_RAW, m_mutate),
    METHOD(LIST, "copy", JA_RAW, m_list_copy),
    METHOD(SEQ, "count", JA_ONE, m_list_find, MODE(1)),
    METHOD(LIST, "extend", JA_RAW, m_mutate),
    METHOD(SEQ, "index", JA_ONE, m_list_find, MODE(0)),
    METHOD(LIST, "insert", JA_RAW, m_mutate),
    METHOD(LIST, "pop", JA_RAW, m_mutate),
    METHOD(LIST, "remove", JA_RAW, m_mutate),
    METHOD(LIST, "reverse", JA_RAW, m_mutate),
    METHOD(LIST, "sort", JA_RAW, m_mutate),

    // the loop of a for
    METHOD(LOOP, "changed", JA_RAW, m_loop_changed),
    METHOD(LOOP, "cycle", JA_RAW, m_loop_cycle),
    LOOP_ATTR("depth", LA_DEPTH),
    LOOP_ATTR("depth0", LA_DEPTH0),
    LOOP_ATTR("first", LA_FIRST),
    LOOP_ATTR("index", LA_INDEX),
    LOOP_ATTR("index0", LA_INDEX0),
    LOOP_ATTR("last", LA_LAST),
    LOOP_ATTR("length", LA_LENGTH),
    LOOP_ATTR("nextitem", LA_NEXTITEM),
    LOOP_ATTR("previtem", LA_PREVITEM),
    LOOP_ATTR("revindex", LA_REVINDEX),
    LOOP_ATTR("revindex0", LA_REVINDEX0),

    // globals
    GLOBAL("dict", g_dict, MODE(0)),
    GLOBAL("namespace", g_dict, MODE(1)),
    GLOBAL("raise_exception", g_raise),
    GLOBAL("range", g_range),
    GLOBAL("strftime_now", g_strftime),
};
#undef STR
#undef DICT
#undef LIST
#undef SEQ
#undef LOOP
#undef ITERABLE

// ---- lookup -------------------------------------------------------------------------------------------
// An open-addressing hash of (kind, object type, name) -> row, built once on
// first use. Attribute access asks it for every dict key a template reads
// (Python looks for a method before the item), so scanning the table would
// cost more than the rest of a render.
#define N_ROWS (sizeof rows / sizeof rows[0])
#define INDEX_SLOTS 1024 // a power of two; at most a third full (below)
_Static_assert(N_ROWS * 2 * 3 <= INDEX_SLOTS, "the row index needs more slots");
static uint16_t row_index[INDEX_SLOTS]; // row + 1; 0: empty
static pthread_once_t row_index_once = PTHREAD_ONCE_INIT;
static atomic_bool row_index_built; // pthread_once done: skip its call

static bool typed(int kind)
{
    return kind == JB_METHOD || kind == JB_ATTR;
}

// From the length and the first and last two bytes: names are short and
// differ there, and the misses (dict keys) cost no walk over the name.
static size_t row_slot(int kind, int type, const char *p, size_t n)
{
    uint32_t h = (uint32_t)(kind * 64 + type) * 0x9e3779b1u ^ (uint32_t)n * 0x85ebca6bu;
    if (n) {
        h ^= ((uint32_t)(uint8_t)p[0] << 8 | (uint8_t)p[n - 1]) * 0xc2b2ae35u;
        h ^= ((uint32_t)(uint8_t)p[n / 2] << 16 | (uint8_t)p[n > 1 ? 1 : 0]) * 0x27d4eb2fu;
    }
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return h & (INDEX_SLOTS - 1);
}

// One entry per row, and per object type for methods and attributes (no
// row has more than two: the _Static_assert above counts on it).
static void row_index_build(void)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        const struct jb_row *row = &rows[i];
        for (int t = 0; t < 16; t++) {
            if (typed(row->kind) ? !(row->recv & TM(t)) : t != 0) continue;
            size_t s = row_slot(row->kind, t, row->name, strlen(row->name));
            while (row_index[s]) s = (s + 1) & (INDEX_SLOTS - 1);
            row_index[s] = (uint16_t)(i + 1);
        }
    }
    atomic_store_explicit(&row_index_built, true, memory_order_release);
}

// The row of kind for name; methods and attributes also by the type of their object.
static const struct jb_row *find_row(int kind, struct jstr name, int type)
{
    if (!atomic_load_explicit(&row_index_built, memory_order_acquire))
        pthread_once(&row_index_once, row_index_build);
    if (!typed(kind)) type = 0;
    for (size_t s = row_slot(kind, type, name.p, name.n); row_index[s]; s = (s + 1) & (INDEX_SLOTS - 1)) {
        const struct jb_row *row = &rows[row_index[s] - 1];
        if (row->kind == kind && (!typed(kind) || (row->recv & TM(type))) && jstr_eq(name, row->name))
            return row;
    }
    return NULL;
}

bool jb_entry(size_t i, int *kind, const char **name, unsigned *receivers)
{
    if (i >= N_ROWS) return false;
    *kind = rows[i].kind;
    *name = rows[i].name;
    *receivers = rows[i].recv;
    return true;
}

// Runs a row once its arguments passed.
static int run_row(struct jrender *r, struct bcall *c, struct jv *out)
{
    int rc = check_args(r, c);
    return rc ? rc : c->row->fn(r, c, out);
}

// Methods and globals run when the function value they made is called.
static int call_row(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    struct bcall c = {.row = f->row, .name = {f->row->name, strlen(f->row->name)}, .self = f->self,
                      .a = a};
    return run_row(r, &c, out);
}

bool jb_has_filter(struct jstr name)
{
    return find_row(JB_FILTER, name, 0) != NULL;
}

bool jb_has_test(struct jstr name)
{
    return find_row(JB_TEST, name, 0) != NULL;
}

int jb_filter(struct jrender *r, struct jstr name, struct jv v, struct jcallargs *a, struct jv *out)
{
    const struct jb_row *row = find_row(JB_FILTER, name, 0);
    if (!row) return jr_fail(r, "no filter named '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
    struct bcall c = {.row = row, .name = name, .self = v, .a = a};
    return run_row(r, &c, out);
}

int jb_test(struct jrender *r, struct jstr name, struct jv v, struct jcallargs *a, bool *out)
{
    const struct jb_row *row = find_row(JB_TEST, name, 0);
    if (!row) return jr_fail(r, "no test named '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
    struct bcall c = {.row = row, .name = name, .self = v, .a = a};
    struct jv res;
    int rc = run_row(r, &c, &res);
    if (!rc) *out = res.b;
    return rc;
}

bool jb_method(struct jrender *r, struct jv obj, struct jstr name, struct jv *out, int *rc)
{
    // A loop's attributes, its methods included, are jb_loop_attr's.
    const struct jb_row *row = obj.t == JV_LOOP ? NULL : find_row(JB_METHOD, name, obj.t);
    if (!row) return false;
    *out = mkfunc(r, row, obj);
    *rc = out->t == JV_FUNC ? 0 : MS_EINVAL;
    return true;
}

int jb_loop_attr(struct jrender *r, struct jv loop, struct jstr name, struct jv *out)
{
    const struct jb_row *row = find_row(JB_ATTR, name, JV_LOOP);
    if (row) {
        struct bcall c = {.row = row, .name = name, .self = loop, .a = NULL};
        return row->fn(r, &c, out);
    }
    if ((row = find_row(JB_METHOD, name, JV_LOOP))) {
        *out = mkfunc(r, row, loop);
        return out->t == JV_FUNC ? 0 : MS_EINVAL;
    }
    *out = jv_undef_attr(JV_LOOP, name);
    return 0;
}

bool jb_global(struct jrender *r, struct jstr name, struct jv *out)
{
    const struct jb_row *row = find_row(JB_GLOBAL, name, 0);
    if (!row) return false;
    *out = mkfunc(r, row, jv_none());
    return true;
}
