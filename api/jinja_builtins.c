// jinja_builtins: the filters, tests, globals (range, namespace, dict,
// raise_exception, strftime_now), str/dict/list methods and loop attributes that
// chat templates use, each with the semantics of Python and Jinja2 3.1.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "api/jinja_impl.h"
#include "base/base.h"

// ---- helpers --------------------------------------------------------------------------------
static struct jv mkfunc(struct jrender *r, const char *name, jfn_t fn, struct jv self)
{
    struct jfunc *f = jr_alloc(r, sizeof *f);
    struct jv v = jv_undef();
    if (!f) return v; // the error is set; callers check r via the returned undefined
    f->name = name;
    f->fn = fn;
    f->self = self;
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

// Binds positional and keyword arguments to parameter names, Python style.
// what_fmt (e.g. "filter '%.*s'") describes the callee in errors; it is only
// formatted when there is an error to report.
static int bind(struct jrender *r, const char *what_fmt, struct jstr who, struct jcallargs *a,
                const char *const *names, size_t n, struct jv *vals, bool *given)
{
    char what[96];
    for (size_t i = 0; i < n; i++) given[i] = false;
    if (a->npos > n) {
        snprintf(what, sizeof what, what_fmt, (int)(who.n > 40 ? 40 : who.n), who.p);
        return jr_fail(r, "%s takes at most %zu argument%s (%zu given)", what, n, n == 1 ? "" : "s",
                       a->npos);
    }
    for (size_t i = 0; i < a->npos; i++) {
        vals[i] = a->pos[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < n && !jstr_eq(a->kwn[k], names[i])) i++;
        if (i == n || given[i]) {
            snprintf(what, sizeof what, what_fmt, (int)(who.n > 40 ? 40 : who.n), who.p);
            if (i == n)
                return jr_fail(r, "%s got an unexpected keyword argument '%.*s'", what,
                               (int)a->kwn[k].n, a->kwn[k].p);
            return jr_fail(r, "%s got multiple values for argument '%s'", what, names[i]);
        }
        vals[i] = a->kwv[k];
        given[i] = true;
    }
    return 0;
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

static bool contains_cp(const uint32_t *set, size_t n, uint32_t cp)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == cp) return true;
    return false;
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
    // More than 64 strip characters: test membership against the string itself.
    size_t b = 0, e = s.n;
    while (left && b < e) {
        uint32_t cp;
        size_t k = ju_decode(s.p + b, e - b, &cp);
        bool hit;
        if (!chars) hit = ju_is_space(cp);
        else if (big) hit = memmem(chars->p, chars->n, s.p + b, k) != NULL;
        else hit = contains_cp(set, nset, cp);
        if (!hit) break;
        b += k;
    }
    while (right && e > b) {
        size_t st = e - 1;
        while (st > b && ((unsigned char)s.p[st] & 0xc0) == 0x80) st--;
        uint32_t cp;
        size_t k = ju_decode(s.p + st, e - st, &cp);
        bool hit;
        if (!chars) hit = ju_is_space(cp);
        else if (big) hit = memmem(chars->p, chars->n, s.p + st, k) != NULL;
        else hit = contains_cp(set, nset, cp);
        if (!hit) break;
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
static int f_tojson(struct jrender *r, struct jv v, struct jcallargs *a, struct jv *out)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    struct jv vals[4];
    bool given[4];
    int rc = bind(r, "filter '%.*s'", (struct jstr){"tojson", 6}, a, names, 4, vals, given);
    if (rc) return rc;
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
    if ((rc = jv_to_json(r, v, &o, &b, 0))) return rc;
    *out = jsb_str(&b);
    return 0;
}

// ---- %-formatting (str % args, the format filter) ------------------------------------------------
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
            bool left = false;
            size_t k = 1;
            while (k < sn && strchr("-+ #0", spec[k])) left |= spec[k++] == '-';
            size_t width = 0, prec = SIZE_MAX;
            while (k < sn && spec[k] >= '0' && spec[k] <= '9') width = width * 10 + (size_t)(spec[k++] - '0');
            if (k < sn && spec[k] == '.') {
                prec = 0;
                for (k++; k < sn && spec[k] >= '0' && spec[k] <= '9'; k++) prec = prec * 10 + (size_t)(spec[k] - '0');
            }
            size_t bytes = 0, chars = 0;
            while (bytes < t.len && chars < prec) {
                uint32_t cp;
                bytes += ju_decode(t.data + bytes, t.len - bytes, &cp);
                chars++;
            }
            for (size_t pad = chars; !left && pad < width && !rc; pad++) rc = jsb_putc(r, &b, ' ');
            if (!rc) rc = jsb_put(r, &b, t.data, bytes);
            for (size_t pad = chars; left && pad < width && !rc; pad++) rc = jsb_putc(r, &b, ' ');
            break;
        }
        case 'd': case 'i': case 'x': case 'X': case 'o': case 'c': {
            if (!jv_is_number(arg)) return jr_fail(r, "%%%c format: a number is required, not %s", conv, jv_type_name(arg.t));
            long long v = arg.t == JV_FLOAT ? (long long)arg.f : arg.t == JV_BOOL ? arg.b : arg.i;
            if (conv == 'c') {
                char enc[4];
                rc = jsb_put(r, &b, enc, ju_encode((uint32_t)v, enc));
                break;
            }
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
static int m_str(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    struct jstr s = f->self.s;
    const char *name = f->name;
    int rc;
    char what[32]; // for want_str/want_int errors
    snprintf(what, sizeof what, "str.%s()", name);
    struct jstr who = {name, strlen(name)};
    if (!strcmp(name, "format")) return str_format(r, s, a, out);
    if (!strcmp(name, "join")) {
        if (a->npos != 1 || a->nkw) return jr_fail(r, "str.join() takes exactly one argument");
        struct jlist *items;
        if ((rc = jv_iterate(r, a->pos[0], &items))) return rc;
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
    static const char *const n1[] = {"chars"};
    static const char *const nsplit[] = {"sep", "maxsplit"};
    static const char *const nrep[] = {"old", "new", "count"};
    static const char *const nfind[] = {"sub", "start", "end"};
    struct jv vals[3];
    bool given[3];
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if ((rc = bind(r, "str.%.*s()", who, a, n1, 1, vals, given))) return rc;
        struct jstr chars, *cp = NULL;
        if (given[0] && vals[0].t != JV_NONE) {
            if ((rc = want_str(r, what, vals[0], &chars))) return rc;
            cp = &chars;
        }
        struct jstr o = strip(s, cp, name[0] != 'r', name[0] != 'l');
        *out = jv_str(o.p, o.n);
        return 0;
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        if ((rc = bind(r, "str.%.*s()", who, a, nsplit, 2, vals, given))) return rc;
        struct jstr sep, *sp = NULL;
        int64_t maxsplit = -1;
        if (given[0] && vals[0].t != JV_NONE) {
            if ((rc = want_str(r, what, vals[0], &sep))) return rc;
            sp = &sep;
        }
        if (given[1] && (rc = want_int(r, what, vals[1], &maxsplit))) return rc;
        return split_str(r, s, sp, maxsplit, name[0] == 'r', out);
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (a->npos < 1 || a->npos > 3 || a->nkw) return jr_fail(r, "%s takes 1 to 3 arguments", what);
        struct jv pre = a->pos[0];
        // start/end narrow the string, counted in characters.
        struct jstr sub = s;
        if (a->npos > 1) {
            struct jlist *chars;
            if ((rc = jv_iterate(r, jv_str(s.p, s.n), &chars))) return rc;
            int64_t n = (int64_t)chars->n, st = 0, en = n;
            if (a->pos[1].t != JV_NONE && (rc = want_int(r, what, a->pos[1], &st))) return rc;
            if (a->npos > 2 && a->pos[2].t != JV_NONE && (rc = want_int(r, what, a->pos[2], &en))) return rc;
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
                return jr_fail(r, "%s first arg must be str or a tuple of str, not %s", what,
                               jv_type_name(p.t));
            if (p.s.n <= sub.n && memcmp(name[0] == 's' ? sub.p : sub.p + sub.n - p.s.n, p.s.p, p.s.n) == 0) {
                *out = jv_bool(true);
                return 0;
            }
        }
        *out = jv_bool(false);
        return 0;
    }
    if (!strcmp(name, "replace")) {
        if ((rc = bind(r, "str.%.*s()", who, a, nrep, 3, vals, given))) return rc;
        if (!given[0] || !given[1]) return jr_fail(r, "%s takes at least 2 arguments", what);
        struct jstr old, new_;
        int64_t count = -1;
        if ((rc = want_str(r, what, vals[0], &old)) || (rc = want_str(r, what, vals[1], &new_))) return rc;
        if (given[2] && (rc = want_int(r, what, vals[2], &count))) return rc;
        return replace_str(r, s, old, new_, count, out);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") ||
        !strcmp(name, "rindex") || !strcmp(name, "count")) {
        if ((rc = bind(r, "str.%.*s()", who, a, nfind, 3, vals, given))) return rc;
        struct jstr sub = {"", 0};
        if (!given[0]) return jr_fail(r, "%s takes at least 1 argument", what);
        if ((rc = want_str(r, what, vals[0], &sub))) return rc;
        if (given[1] || given[2]) return jr_fail(r, "%s with start/end is not supported", what);
        if (!strcmp(name, "count")) {
            int64_t c = 0;
            if (sub.n == 0) c = (int64_t)ju_count(s.p, s.n) + 1;
            else
                for (size_t i = 0; i + sub.n <= s.n;) {
                    const char *h = memmem(s.p + i, s.n - i, sub.p, sub.n);
                    if (!h) break;
                    c++;
                    i = (size_t)(h - s.p) + sub.n;
                }
            *out = jv_int(c);
            return 0;
        }
        bool rev = name[0] == 'r';
        const char *hit = NULL;
        if (!rev) hit = sub.n ? memmem(s.p, s.n, sub.p, sub.n) : s.p;
        else if (sub.n <= s.n)
            for (size_t p = s.n - sub.n + 1; p-- > 0;)
                if (memcmp(s.p + p, sub.p, sub.n) == 0) {
                    hit = s.p + p;
                    break;
                }
        if (!hit) {
            if (!strcmp(name, "index") || !strcmp(name, "rindex")) return jr_fail(r, "substring not found");
            *out = jv_int(-1);
            return 0;
        }
        *out = jv_int((int64_t)ju_count(s.p, (size_t)(hit - s.p)));
        return 0;
    }
    if (a->npos || a->nkw) {
        if (!strcmp(name, "splitlines")) {
            static const char *const nk[] = {"keepends"};
            if ((rc = bind(r, "str.%.*s()", who, a, nk, 1, vals, given))) return rc;
            struct jlist *l;
            if ((rc = splitlines(r, s, given[0] && jv_truthy(vals[0]), &l))) return rc;
            *out = list_value(l, JV_LIST);
            return 0;
        }
        return jr_fail(r, "%s takes no arguments", what);
    }
    if (!strcmp(name, "upper")) return change_case(r, s, CASE_UPPER, out);
    if (!strcmp(name, "lower")) return change_case(r, s, CASE_LOWER, out);
    if (!strcmp(name, "title")) return change_case(r, s, CASE_PYTITLE, out);
    if (!strcmp(name, "capitalize")) return change_case(r, s, CASE_CAPITALIZE, out);
    if (!strcmp(name, "splitlines")) {
        struct jlist *l;
        if ((rc = splitlines(r, s, false, &l))) return rc;
        *out = list_value(l, JV_LIST);
        return 0;
    }
    // is* predicates: true when non-empty and every character qualifies.
    bool all = s.n > 0, any_cased = false, ok_lower = true, ok_upper = true;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        i += ju_decode(s.p + i, s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool alpha = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL ||
                     c == UTF8PROC_CATEGORY_LT || c == UTF8PROC_CATEGORY_LM ||
                     c == UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        if (!strcmp(name, "isdigit") || !strcmp(name, "isdecimal") || !strcmp(name, "isnumeric")) all &= digit;
        else if (!strcmp(name, "isalpha")) all &= alpha;
        else if (!strcmp(name, "isalnum")) all &= alpha || digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
        else if (!strcmp(name, "isspace")) all &= ju_is_space(cp);
        if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) {
            any_cased = true;
            ok_lower = false;
        }
        if (c == UTF8PROC_CATEGORY_LL) {
            any_cased = true;
            ok_upper = false;
        }
    }
    if (!strcmp(name, "islower")) all = any_cased && ok_lower;
    else if (!strcmp(name, "isupper")) all = any_cased && ok_upper;
    *out = jv_bool(all);
    return 0;
}

static const char *const str_methods[] = {
    "capitalize", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
    "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "isupper", "join", "lower",
    "lstrip", "replace", "rfind", "rindex", "rsplit", "rstrip", "split", "splitlines",
    "startswith", "strip", "title", "upper", NULL,
};

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

static int m_dict(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    struct jdict *d = f->self.d;
    const char *name = f->name;
    if (!strcmp(name, "get")) {
        if (a->npos < 1 || a->npos > 2 || a->nkw) return jr_fail(r, "dict.get() takes 1 or 2 arguments");
        const struct jv *v = jv_dict_get(r, d, a->pos[0]);
        *out = v ? *v : a->npos > 1 ? a->pos[1] : jv_none();
        return 0;
    }
    if (!strcmp(name, "copy")) {
        struct jdict *c = jv_dict_new(r, d->n);
        if (!c) return MS_EINVAL;
        memcpy(c->keys, d->keys, d->n * sizeof *c->keys);
        memcpy(c->vals, d->vals, d->n * sizeof *c->vals);
        c->n = d->n;
        *out = dict_value(c, JV_DICT);
        return 0;
    }
    if (a->npos || a->nkw) {
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values"))
            return jr_fail(r, "dict.%s() takes no arguments", name);
        return jr_fail(r, "dict.%s() modifies the dict, which the template sandbox does not allow", name);
    }
    if (!strcmp(name, "items")) return items_of(r, d, out);
    if (!strcmp(name, "keys") || !strcmp(name, "values")) {
        struct jlist *l = jv_list_new(r, d->n);
        if (!l) return MS_EINVAL;
        for (size_t i = 0; i < d->n; i++) l->v[i] = name[0] == 'k' ? d->keys[i] : d->vals[i];
        *out = list_value(l, JV_LIST);
        return 0;
    }
    return jr_fail(r, "dict.%s() modifies the dict, which the template sandbox does not allow", name);
}

static const char *const dict_methods[] = {
    "clear", "copy", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values", NULL,
};

static int m_list(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    struct jlist *l = f->self.l;
    const char *name = f->name;
    if (!strcmp(name, "index") || !strcmp(name, "count")) {
        if (a->npos != 1 || a->nkw) return jr_fail(r, "list.%s() takes exactly one argument", name);
        int64_t c = 0;
        for (size_t i = 0; i < l->n; i++) {
            bool eq;
            int rc = jv_equal(r, l->v[i], a->pos[0], &eq, 0);
            if (rc) return rc;
            if (eq) {
                if (name[0] == 'i') {
                    *out = jv_int((int64_t)i);
                    return 0;
                }
                c++;
            }
        }
        if (name[0] == 'i') return jr_fail(r, "list.index(x): x not in list");
        *out = jv_int(c);
        return 0;
    }
    if (!strcmp(name, "copy")) {
        struct jlist *c = jv_list_new(r, l->n);
        if (!c) return MS_EINVAL;
        if (l->n) memcpy(c->v, l->v, l->n * sizeof *c->v);
        *out = list_value(c, JV_LIST);
        return 0;
    }
    return jr_fail(r, "list.%s() modifies the list, which the template sandbox does not allow", name);
}

static const char *const list_methods[] = {
    "append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove",
    "reverse", "sort", NULL,
};
static const char *const tuple_methods[] = {"count", "index", NULL};

static bool in_names(const char *const *names, struct jstr s, const char **hit)
{
    for (; *names; names++)
        if (jstr_eq(s, *names)) {
            *hit = *names;
            return true;
        }
    return false;
}

bool jb_method(struct jrender *r, struct jv obj, struct jstr name, struct jv *out, int *rc)
{
    const char *hit;
    jfn_t fn = NULL;
    if (obj.t == JV_STR && in_names(str_methods, name, &hit)) fn = m_str;
    else if (obj.t == JV_DICT && in_names(dict_methods, name, &hit)) fn = m_dict;
    else if (obj.t == JV_LIST && in_names(list_methods, name, &hit)) fn = m_list;
    else if (obj.t == JV_TUPLE && in_names(tuple_methods, name, &hit)) fn = m_list;
    if (!fn) return false;
    *out = mkfunc(r, hit, fn, obj);
    *rc = out->t == JV_FUNC ? 0 : MS_EINVAL;
    return true;
}

// ---- loop -------------------------------------------------------------------------------------
static int m_loop(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    struct jloop *loop = f->self.loop;
    if (!strcmp(f->name, "cycle")) {
        if (!a->npos) return jr_fail(r, "loop.cycle() needs at least one argument");
        *out = a->pos[loop->index0 % a->npos];
        return 0;
    }
    // changed(*values): true when the values differ from the previous call's.
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

int jb_loop_attr(struct jrender *r, struct jv lv, struct jstr name, struct jv *out)
{
    struct jloop *l = lv.loop;
    size_t i = l->index0, n = l->length;
    if (jstr_eq(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (jstr_eq(name, "index0")) *out = jv_int((int64_t)i);
    else if (jstr_eq(name, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (jstr_eq(name, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (jstr_eq(name, "first")) *out = jv_bool(i == 0);
    else if (jstr_eq(name, "last")) *out = jv_bool(i + 1 == n);
    else if (jstr_eq(name, "length")) *out = jv_int((int64_t)n);
    else if (jstr_eq(name, "depth")) *out = jv_int(1);
    else if (jstr_eq(name, "depth0")) *out = jv_int(0);
    else if (jstr_eq(name, "previtem"))
        *out = i > 0 ? l->items->v[i - 1] : jv_undef_msg("there is no previous item");
    else if (jstr_eq(name, "nextitem"))
        *out = i + 1 < n ? l->items->v[i + 1] : jv_undef_msg("there is no next item");
    else if (jstr_eq(name, "cycle") || jstr_eq(name, "changed")) {
        *out = mkfunc(r, jstr_eq(name, "cycle") ? "cycle" : "changed", m_loop, lv);
        return out->t == JV_FUNC ? 0 : MS_EINVAL;
    } else *out = jv_undef_attr(JV_LOOP, name);
    return 0;
}

// ---- globals ----------------------------------------------------------------------------------
static int g_range(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    (void)f;
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

// dict(...) and namespace(...): a mapping or iterable of pairs, then keyword arguments.
static int g_dict(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    bool ns = !strcmp(f->name, "namespace");
    if (a->npos > 1) return jr_fail(r, "%s expected at most 1 argument, got %zu", f->name, a->npos);
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
                    return jr_fail(r, "%s: element #%zu is not a pair", f->name, i);
                rc = jv_dict_set(r, d, p.l->v[0], p.l->v[1]);
            }
        }
    }
    for (size_t k = 0; k < a->nkw && !rc; k++) rc = jv_dict_set(r, d, jv_str(a->kwn[k].p, a->kwn[k].n), a->kwv[k]);
    if (rc) return rc;
    *out = dict_value(d, ns ? JV_NS : JV_DICT);
    return 0;
}

static int g_raise(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    (void)f;
    (void)out;
    struct jstr msg = {"", 0};
    if (a->npos > 0) {
        int rc = jv_stringify(r, a->pos[0], &msg);
        if (rc) return rc;
    }
    r->raised = true;
    return ms_err(r->err, r->errlen, MS_EINVAL, "%.*s", (int)(msg.n > 4000 ? 4000 : msg.n), msg.p);
}

static int g_strftime(struct jrender *r, const struct jfunc *f, struct jcallargs *a, struct jv *out)
{
    (void)f;
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

bool jb_global(struct jrender *r, struct jstr name, struct jv *out)
{
    jfn_t fn = NULL;
    const char *n = NULL;
    if (jstr_eq(name, "range")) fn = g_range, n = "range";
    else if (jstr_eq(name, "namespace")) fn = g_dict, n = "namespace";
    else if (jstr_eq(name, "dict")) fn = g_dict, n = "dict";
    else if (jstr_eq(name, "raise_exception")) fn = g_raise, n = "raise_exception";
    else if (jstr_eq(name, "strftime_now")) fn = g_strftime, n = "strftime_now";
    if (!fn) return false;
    *out = mkfunc(r, n, fn, jv_none());
    return true;
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
static int want_args(struct jrender *r, struct jstr filter, struct jcallargs *a,
                     const char *const *names, size_t n, struct jv *vals, bool *given)
{
    return bind(r, "filter '%.*s'", filter, a, names, n, vals, given);
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
            if (attr.t == JV_INT) {
                char *s = jr_alloc(r, 24);
                if (!s) return MS_EINVAL;
                path.n = (size_t)snprintf(s, 24, "%lld", (long long)attr.i);
                path.p = s;
            } else if ((rc = want_str(r, "attribute", attr, &path))) return rc;
            if ((rc = get_path(r, items->v[i], path, &v[i].key))) return rc;
        }
    }
    *out = v;
    *n = items->n;
    return 0;
}

static int f_select(struct jrender *r, struct jv seq, struct jcallargs *a, bool attr_mode,
                    bool select, struct jv *out)
{
    struct jlist *items;
    int rc = jv_iterate(r, seq, &items);
    if (rc) return rc;
    size_t skip = 0;
    struct jstr attr = {0}, test = {0};
    bool have_test = false;
    if (attr_mode) {
        if (a->npos < 1) return jr_fail(r, "%s needs an attribute name", select ? "selectattr" : "rejectattr");
        if ((rc = want_str(r, "attribute", a->pos[0], &attr))) return rc;
        skip = 1;
    }
    if (a->npos > skip) {
        if ((rc = want_str(r, "test name", a->pos[skip], &test))) return rc;
        have_test = true;
        skip++;
    }
    struct jcallargs targs = {a->npos - skip, a->pos + skip, a->nkw, a->kwn, a->kwv};
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

static int f_map(struct jrender *r, struct jv seq, struct jcallargs *a, struct jv *out)
{
    struct jlist *items;
    int rc = jv_iterate(r, seq, &items);
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
        if (attr.t == JV_INT) {
            char *s = jr_alloc(r, 24);
            if (!s) return MS_EINVAL;
            path.n = (size_t)snprintf(s, 24, "%lld", (long long)attr.i);
            path.p = s;
        } else if ((rc = want_str(r, "map attribute", attr, &path))) return rc;
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

static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join",
    "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount", NULL,
};

bool jb_has_filter(struct jstr name)
{
    const char *hit;
    return in_names(filter_names, name, &hit);
}

int jb_filter(struct jrender *r, struct jstr name, struct jv v, struct jcallargs *a, struct jv *out)
{
    struct jv vals[4];
    bool given[4];
    int rc;
    int fnlen = (int)(name.n > 40 ? 40 : name.n);
    const char *fname = name.p; // printed as %.*s with fnlen
#define ARGS(...)                                                                          \
    do {                                                                                   \
        static const char *const names_[] = {__VA_ARGS__};                                 \
        rc = want_args(r, name, a, names_, sizeof names_ / sizeof names_[0], vals, given); \
        if (rc) return rc;                                                                 \
    } while (0)
#define NOARGS()                                                                           \
    do {                                                                                   \
        if (a->npos || a->nkw)                                                             \
            return jr_fail(r, "filter '%.*s' takes no arguments", fnlen, fname);           \
    } while (0)

    if (jstr_eq(name, "tojson")) return f_tojson(r, v, a, out);
    if (jstr_eq(name, "safe")) {
        NOARGS();
        *out = v;
        return 0;
    }
    if (jstr_eq(name, "default") || jstr_eq(name, "d")) {
        ARGS("default_value", "boolean");
        struct jv def = given[0] ? vals[0] : jv_str("", 0);
        bool boolean = given[1] && jv_truthy(vals[1]);
        *out = (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) ? def : v;
        return 0;
    }
    if (jstr_eq(name, "length") || jstr_eq(name, "count")) {
        NOARGS();
        int64_t n = 0;
        if ((rc = py_len(r, v, &n))) return rc;
        *out = jv_int(n);
        return 0;
    }
    if (jstr_eq(name, "string")) {
        NOARGS();
        struct jstr s;
        if ((rc = jv_stringify(r, v, &s))) return rc;
        *out = jv_str(s.p, s.n);
        return 0;
    }
    if (jstr_eq(name, "trim")) {
        ARGS("chars");
        struct jstr s, chars, *cp = NULL;
        if ((rc = jv_stringify(r, v, &s))) return rc;
        if (given[0] && vals[0].t != JV_NONE) {
            if ((rc = want_str(r, "trim chars", vals[0], &chars))) return rc;
            cp = &chars;
        }
        struct jstr o = strip(s, cp, true, true);
        *out = jv_str(o.p, o.n);
        return 0;
    }
    if (jstr_eq(name, "upper") || jstr_eq(name, "lower") || jstr_eq(name, "title") ||
        jstr_eq(name, "capitalize")) {
        NOARGS();
        struct jstr s;
        if ((rc = jv_stringify(r, v, &s))) return rc;
        int mode = name.p[0] == 'u' ? CASE_UPPER : name.p[0] == 'l' ? CASE_LOWER
                 : name.p[0] == 't' ? CASE_JTITLE : CASE_CAPITALIZE;
        return change_case(r, s, mode, out);
    }
    if (jstr_eq(name, "replace")) {
        ARGS("old", "new", "count");
        if (!given[0] || !given[1]) return jr_fail(r, "filter 'replace' needs old and new");
        struct jstr s, old, new_;
        int64_t count = -1;
        if ((rc = jv_stringify(r, v, &s)) || (rc = jv_stringify(r, vals[0], &old)) ||
            (rc = jv_stringify(r, vals[1], &new_)))
            return rc;
        if (given[2] && vals[2].t != JV_NONE && (rc = want_int(r, "replace count", vals[2], &count))) return rc;
        return replace_str(r, s, old, new_, count, out);
    }
    if (jstr_eq(name, "join")) {
        ARGS("d", "attribute");
        struct jstr sep = {"", 0};
        if (given[0] && (rc = jv_stringify(r, vals[0], &sep))) return rc;
        struct jlist *items;
        if ((rc = jv_iterate(r, v, &items))) return rc;
        struct ms_buf b = jsb_new(r);
        for (size_t i = 0; i < items->n; i++) {
            struct jv it = items->v[i];
            if (given[1] && vals[1].t != JV_NONE) {
                struct jstr path;
                if ((rc = want_str(r, "join attribute", vals[1], &path))) return rc;
                if ((rc = get_path(r, it, path, &it))) return rc;
            }
            if (i && (rc = jsb_put(r, &b, sep.p, sep.n))) return rc;
            if ((rc = jv_to_str(r, it, &b))) return rc;
        }
        *out = jsb_str(&b);
        return 0;
    }
    if (jstr_eq(name, "first") || jstr_eq(name, "last")) {
        NOARGS();
        struct jlist *items;
        if (v.t == JV_UNDEF) {
            *out = jv_undef_msg(name.p[0] == 'f' ? "No first item, sequence was empty." : "No last item, sequence was empty.");
            return 0;
        }
        if ((rc = jv_iterate(r, v, &items))) return rc;
        if (!items->n) {
            *out = jv_undef_msg(name.p[0] == 'f' ? "No first item, sequence was empty." : "No last item, sequence was empty.");
            return 0;
        }
        *out = items->v[name.p[0] == 'f' ? 0 : items->n - 1];
        return 0;
    }
    if (jstr_eq(name, "list")) {
        NOARGS();
        struct jlist *items;
        if ((rc = jv_iterate(r, v, &items))) return rc;
        struct jlist *l = jv_list_new(r, items->n);
        if (!l) return MS_EINVAL;
        if (items->n) memcpy(l->v, items->v, items->n * sizeof *l->v);
        *out = list_value(l, JV_LIST);
        return 0;
    }
    if (jstr_eq(name, "items")) {
        NOARGS();
        if (v.t == JV_UNDEF) {
            struct jlist *l = jv_list_new(r, 0);
            if (!l) return MS_EINVAL;
            *out = list_value(l, JV_LIST);
            return 0;
        }
        if (v.t != JV_DICT) return jr_fail(r, "can only get item pairs from a mapping, not %s", jv_type_name(v.t));
        return items_of(r, v.d, out);
    }
    if (jstr_eq(name, "reverse")) {
        NOARGS();
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
    if (jstr_eq(name, "int")) {
        ARGS("default", "base");
        struct jv def = given[0] ? vals[0] : jv_int(0);
        int64_t base = 10;
        if (given[1] && (rc = want_int(r, "int base", vals[1], &base))) return rc;
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
    if (jstr_eq(name, "float")) {
        ARGS("default");
        struct jv def = given[0] ? vals[0] : jv_float(0.0);
        double d;
        if (jv_is_number(v)) *out = jv_float(jv_num(v));
        else if (v.t == JV_STR && py_float_parse(v.s, &d) == 0) *out = jv_float(d);
        else *out = def;
        return 0;
    }
    if (jstr_eq(name, "abs")) {
        NOARGS();
        if (v.t == JV_FLOAT) *out = jv_float(fabs(v.f));
        else if (v.t == JV_INT || v.t == JV_BOOL) {
            int64_t i = v.t == JV_BOOL ? v.b : v.i;
            if (i == INT64_MIN) return jr_fail(r, "integer overflow in abs");
            *out = jv_int(i < 0 ? -i : i);
        } else return jr_fail(r, "bad operand type for abs(): '%s'", jv_type_name(v.t));
        return 0;
    }
    if (jstr_eq(name, "round")) {
        ARGS("precision", "method");
        int64_t prec = 0;
        if (given[0] && (rc = want_int(r, "round precision", vals[0], &prec))) return rc;
        struct jstr method = {"common", 6};
        if (given[1] && (rc = want_str(r, "round method", vals[1], &method))) return rc;
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
    if (jstr_eq(name, "escape") || jstr_eq(name, "e") || jstr_eq(name, "forceescape")) {
        NOARGS();
        struct jstr s;
        if ((rc = jv_stringify(r, v, &s))) return rc;
        return html_escape(r, s, out);
    }
    if (jstr_eq(name, "format")) {
        struct jstr s;
        if ((rc = jv_stringify(r, v, &s))) return rc;
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
    if (jstr_eq(name, "indent")) {
        ARGS("width", "first", "blank");
        struct jstr s, ind;
        if ((rc = jv_stringify(r, v, &s))) return rc;
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
    if (jstr_eq(name, "center")) {
        ARGS("width");
        struct jstr s;
        int64_t w = 80;
        if ((rc = jv_stringify(r, v, &s))) return rc;
        if (given[0] && (rc = want_int(r, "center width", vals[0], &w))) return rc;
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
    if (jstr_eq(name, "wordcount")) {
        NOARGS();
        struct jstr s;
        if ((rc = jv_stringify(r, v, &s))) return rc;
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s.n;) {
            uint32_t cp;
            i += ju_decode(s.p + i, s.n - i, &cp);
            utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
            bool w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                     c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
            if (w && !in) words++;
            in = w;
        }
        *out = jv_int(words);
        return 0;
    }
    if (jstr_eq(name, "attr")) {
        if (a->npos != 1 || a->nkw) return jr_fail(r, "filter 'attr' takes one attribute name");
        struct jstr an;
        if ((rc = want_str(r, "attr name", a->pos[0], &an))) return rc;
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
    if (jstr_eq(name, "map")) return f_map(r, v, a, out);
    if (jstr_eq(name, "select")) return f_select(r, v, a, false, true, out);
    if (jstr_eq(name, "reject")) return f_select(r, v, a, false, false, out);
    if (jstr_eq(name, "selectattr")) return f_select(r, v, a, true, true, out);
    if (jstr_eq(name, "rejectattr")) return f_select(r, v, a, true, false, out);
    if (jstr_eq(name, "sort") || jstr_eq(name, "unique") || jstr_eq(name, "max") || jstr_eq(name, "min")) {
        bool is_sort = name.p[0] == 's', is_unique = name.p[0] == 'u';
        bool reverse = false, cs = false;
        struct jv attr = jv_none();
        bool has_attr = false;
        if (is_sort) {
            ARGS("reverse", "case_sensitive", "attribute");
            reverse = given[0] && jv_truthy(vals[0]);
            cs = given[1] && jv_truthy(vals[1]);
            if (given[2]) attr = vals[2], has_attr = true;
        } else {
            ARGS("case_sensitive", "attribute");
            cs = given[0] && jv_truthy(vals[0]);
            if (given[1]) attr = vals[1], has_attr = true;
        }
        struct sort_item *items;
        size_t n;
        if ((rc = to_sort_items(r, v, attr, has_attr, &items, &n))) return rc;
        if ((rc = jr_step(r, n))) return rc;
        if (is_unique) {
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
        if (!is_sort) {
            if (!n) {
                *out = jv_undef_msg("No aggregated item, sequence was empty.");
                return 0;
            }
            size_t best = 0;
            for (size_t i = 1; i < n; i++) {
                int cmp;
                if ((rc = cmp_with_case(r, items[i].key, items[best].key, cs, &cmp))) return rc;
                if (name.p[1] == 'a' ? cmp > 0 : cmp < 0) best = i;
            }
            *out = items[best].item;
            return 0;
        }
        if ((rc = sort_items(r, items, n, cs, reverse))) return rc;
        struct jlist *l = jv_list_new(r, n);
        if (!l) return MS_EINVAL;
        for (size_t i = 0; i < n; i++) l->v[i] = items[i].item;
        *out = list_value(l, JV_LIST);
        return 0;
    }
    if (jstr_eq(name, "dictsort")) {
        ARGS("case_sensitive", "by", "reverse");
        if (v.t != JV_DICT) return jr_fail(r, "filter 'dictsort' needs a mapping, not %s", jv_type_name(v.t));
        bool cs = given[0] && jv_truthy(vals[0]), reverse = given[2] && jv_truthy(vals[2]);
        bool by_value = false;
        if (given[1]) {
            struct jstr by;
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
    if (jstr_eq(name, "sum")) {
        ARGS("attribute", "start");
        struct jv acc = given[1] ? vals[1] : jv_int(0);
        struct jlist *items;
        if ((rc = jv_iterate(r, v, &items))) return rc;
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
    if (jstr_eq(name, "batch")) {
        ARGS("linecount", "fill_with");
        int64_t cnt;
        if (!given[0]) return jr_fail(r, "filter 'batch' needs a line count");
        if ((rc = want_int(r, "batch linecount", vals[0], &cnt))) return rc;
        if (cnt <= 0) return jr_fail(r, "batch linecount must be positive");
        struct jlist *items;
        if ((rc = jv_iterate(r, v, &items))) return rc;
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
    return jr_fail(r, "no filter named '%.*s'", fnlen, fname);
#undef ARGS
#undef NOARGS
}

// ---- tests -------------------------------------------------------------------------------------------
static const char *const test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
    "false", "filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le",
    "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">=", NULL,
};

bool jb_has_test(struct jstr name)
{
    const char *hit;
    return in_names(test_names, name, &hit);
}

int jb_test(struct jrender *r, struct jstr name, struct jv v, struct jcallargs *a, bool *out)
{
    int rc = 0;
    int tnlen = (int)(name.n > 40 ? 40 : name.n);
    const char *tname = name.p; // printed as %.*s with tnlen
    bool one = a->npos == 1 && !a->nkw;
    if (!a->npos && !a->nkw) {
        if (jstr_eq(name, "defined")) { *out = v.t != JV_UNDEF; return 0; }
        if (jstr_eq(name, "undefined")) { *out = v.t == JV_UNDEF; return 0; }
        if (jstr_eq(name, "none")) { *out = v.t == JV_NONE; return 0; }
        if (jstr_eq(name, "boolean")) { *out = v.t == JV_BOOL; return 0; }
        if (jstr_eq(name, "true")) { *out = v.t == JV_BOOL && v.b; return 0; }
        if (jstr_eq(name, "false")) { *out = v.t == JV_BOOL && !v.b; return 0; }
        if (jstr_eq(name, "integer")) { *out = v.t == JV_INT; return 0; }
        if (jstr_eq(name, "float")) { *out = v.t == JV_FLOAT; return 0; }
        if (jstr_eq(name, "number")) { *out = jv_is_number(v); return 0; }
        if (jstr_eq(name, "string")) { *out = v.t == JV_STR; return 0; }
        if (jstr_eq(name, "mapping")) { *out = v.t == JV_DICT; return 0; }
        if (jstr_eq(name, "iterable")) {
            *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_TUPLE || v.t == JV_DICT || v.t == JV_UNDEF;
            return 0;
        }
        if (jstr_eq(name, "sequence")) {
            *out = v.t == JV_STR || v.t == JV_LIST || v.t == JV_TUPLE || v.t == JV_DICT || v.t == JV_UNDEF;
            return 0;
        }
        if (jstr_eq(name, "callable")) { *out = v.t == JV_FUNC || v.t == JV_MACRO || v.t == JV_LOOP; return 0; }
        if (jstr_eq(name, "escaped")) { *out = false; return 0; }
        if (jstr_eq(name, "filter") || jstr_eq(name, "test")) {
            *out = v.t == JV_STR && (name.p[0] == 'f' ? jb_has_filter(v.s) : jb_has_test(v.s));
            return 0;
        }
        if (jstr_eq(name, "odd") || jstr_eq(name, "even")) {
            if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
            if (v.t != JV_INT && v.t != JV_BOOL) return jr_fail(r, "test '%.*s' needs an integer, not %s", tnlen, tname, jv_type_name(v.t));
            int64_t i = v.t == JV_BOOL ? v.b : v.i;
            *out = (i % 2 != 0) == (name.p[0] == 'o');
            return 0;
        }
        if (jstr_eq(name, "lower") || jstr_eq(name, "upper")) {
            struct jstr s;
            if ((rc = jv_stringify(r, v, &s))) return rc;
            struct jv f = mkfunc(r, name.p[0] == 'l' ? "islower" : "isupper", m_str, jv_str(s.p, s.n));
            if (f.t != JV_FUNC) return MS_EINVAL;
            struct jcallargs none = {0};
            struct jv res;
            if ((rc = m_str(r, f.fn, &none, &res))) return rc;
            *out = res.b;
            return 0;
        }
    }
    if (one) {
        struct jv o = a->pos[0];
        if (jstr_eq(name, "eq") || jstr_eq(name, "equalto") || jstr_eq(name, "==") ||
            jstr_eq(name, "ne") || jstr_eq(name, "!=")) {
            if ((rc = jv_equal(r, v, o, out, 0))) return rc;
            if (name.p[0] == 'n' || name.p[0] == '!') *out = !*out;
            return 0;
        }
        int op = 0;
        if (jstr_eq(name, "lt") || jstr_eq(name, "lessthan") || jstr_eq(name, "<")) op = 1;
        else if (jstr_eq(name, "le") || jstr_eq(name, "<=")) op = 2;
        else if (jstr_eq(name, "gt") || jstr_eq(name, "greaterthan") || jstr_eq(name, ">")) op = 3;
        else if (jstr_eq(name, "ge") || jstr_eq(name, ">=")) op = 4;
        if (op) {
            int cmp;
            if ((rc = jv_compare(r, v, o, &cmp, op == 1 ? "<" : op == 2 ? "<=" : op == 3 ? ">" : ">="))) return rc;
            *out = op == 1 ? cmp < 0 : op == 2 ? cmp <= 0 : op == 3 ? cmp > 0 : cmp >= 0;
            return 0;
        }
        if (jstr_eq(name, "sameas")) {
            if (v.t != o.t) *out = false;
            else if (v.t == JV_LIST || v.t == JV_TUPLE) *out = v.l == o.l;
            else if (v.t == JV_DICT || v.t == JV_NS) *out = v.d == o.d;
            else if (v.t == JV_STR) *out = v.s.p == o.s.p && v.s.n == o.s.n;
            else if ((rc = jv_equal(r, v, o, out, 0))) return rc;
            return 0;
        }
        if (jstr_eq(name, "divisibleby")) {
            int64_t d, x;
            if ((rc = want_int(r, "divisibleby", o, &d))) return rc;
            if ((rc = want_int(r, "divisibleby", v, &x))) return rc;
            if (d == 0) return jr_fail(r, "integer division or modulo by zero");
            *out = d == -1 || x % d == 0;
            return 0;
        }
        if (jstr_eq(name, "in")) {
            // Reuse the `in` operator through a one-item comparison.
            switch (o.t) {
            case JV_STR:
                if (v.t != JV_STR) return jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_type_name(v.t));
                *out = v.s.n == 0 || memmem(o.s.p, o.s.n, v.s.p, v.s.n) != NULL;
                return 0;
            case JV_LIST: case JV_TUPLE:
                *out = false;
                for (size_t i = 0; i < o.l->n && !*out; i++)
                    if ((rc = jv_equal(r, v, o.l->v[i], out, 0))) return rc;
                return 0;
            case JV_DICT: *out = jv_dict_get(r, o.d, v) != NULL; return 0;
            case JV_UNDEF: *out = false; return 0;
            default: return jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(o.t));
            }
        }
    }
    if (jb_has_test(name)) return jr_fail(r, "test '%.*s' got the wrong number of arguments", tnlen, tname);
    return jr_fail(r, "no test named '%.*s'", tnlen, tname);
}
