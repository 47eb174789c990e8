// jinja_value: runtime values as Python sees them — truthiness, equality and
// ordering, str() and repr(), json.dumps, iteration, conversion from jansson —
// plus the render's arena-backed allocation, output buffers and limits.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "api/jinja_impl.h"
#include "base/json.h"
#include "base/base.h"

// ---- render plumbing ---------------------------------------------------------------
int jr_fail(struct jrender *r, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ms_err(r->err, r->errlen, MS_EINVAL, "line %u: %s", r->line, msg);
}

int jr_nomem(struct jrender *r)
{
    return ms_err(r->err, r->errlen, MS_ENOMEM, "line %u: out of memory while rendering", r->line);
}

void *jr_alloc(struct jrender *r, size_t n)
{
    size_t total;
    if (ms_add_overflow(arena_bytes_used(r->a), n, &total) || total > r->lim.max_memory_bytes) {
        jr_fail(r, "the template used more than the %zu MiB a render may use",
                r->lim.max_memory_bytes >> 20);
        return NULL;
    }
    void *p = arena_alloc(r->a, n);
    if (!p) jr_nomem(r);
    return p;
}

int jr_step(struct jrender *r, uint64_t n)
{
    r->steps += n;
    if (r->steps > r->lim.max_steps)
        return jr_fail(r, "the template ran more than %llu loop iterations and calls; "
                          "it looks like it does not terminate",
                       (unsigned long long)r->lim.max_steps);
    return 0;
}

// The arena hands out a new block and keeps the old one until the render
// ends; jr_alloc enforces the memory limit and writes its sentence.
static void *jsb_grow(void *ctx, void *old, size_t len, size_t new_cap)
{
    char *p = jr_alloc(ctx, new_cap);
    if (p && len) memcpy(p, old, len);
    return p;
}

struct ms_buf jsb_new(struct jrender *r)
{
    // The first buffer of a render (its output) sets the allocator up.
    if (!r->buf_alloc.grow) r->buf_alloc = (struct ms_buf_alloc){jsb_grow, NULL, r};
    return (struct ms_buf){.max = r->lim.max_output_bytes, .alloc = &r->buf_alloc};
}

// A buffer's refusal as the render's error (jr_alloc has already written
// the out-of-memory one); MS_EINVAL either way, as every render failure.
static int jsb_status(struct jrender *r, int rc)
{
    if (rc == MS_ETOOLONG)
        return jr_fail(r, "the rendered text exceeds %zu bytes", r->lim.max_output_bytes);
    if (rc == MS_EINVAL) return jr_fail(r, "formatting failed");
    return rc ? MS_EINVAL : 0;
}

int jsb_put(struct jrender *r, struct ms_buf *b, const char *p, size_t n)
{
    if (!n) return 0;
    // A cap of 0 is no cap to ms_buf; to the render it means no output at all.
    return jsb_status(r, r->lim.max_output_bytes ? ms_buf_append(b, p, n) : MS_ETOOLONG);
}

int jsb_putc(struct jrender *r, struct ms_buf *b, char c)
{
    return jsb_put(r, b, &c, 1);
}

int jsb_printf(struct jrender *r, struct ms_buf *b, const char *fmt, ...)
{
    // Short text (nearly all of it) goes through jsb_put like any other.
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return jr_fail(r, "formatting failed");
    if ((size_t)k < sizeof tmp) return jsb_put(r, b, tmp, (size_t)k);
    if (!r->lim.max_output_bytes) return jsb_status(r, MS_ETOOLONG);
    va_start(ap, fmt);
    int rc = ms_buf_append_vfmt(b, fmt, ap);
    va_end(ap);
    return jsb_status(r, rc);
}

// ---- UTF-8 --------------------------------------------------------------------------
bool ju_is_ascii(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) return false;
    return true;
}

bool ju_is_space(uint32_t c)
{
    if (c < 0x80) return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

size_t ju_count(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xc0) != 0x80) c++;
    return c;
}

// ---- constructors ---------------------------------------------------------------------
struct jv jv_undef_name(struct jstr name)
{
    struct jv v = jv_undef();
    v.ukind = JU_NAME;
    v.s = name;
    return v;
}

struct jv jv_undef_attr(int objtype, struct jstr name)
{
    struct jv v = jv_undef();
    v.ukind = JU_ATTR;
    v.uobj = (uint8_t)objtype;
    v.s = name;
    return v;
}

struct jv jv_undef_msg(const char *msg)
{
    struct jv v = jv_undef();
    v.ukind = JU_MESSAGE;
    v.s.p = msg;
    v.s.n = strlen(msg);
    return v;
}

struct jlist *jv_list_new(struct jrender *r, size_t n)
{
    size_t bytes;
    if (ms_mul_overflow(n, sizeof(struct jv), &bytes)) {
        jr_fail(r, "list too large");
        return NULL;
    }
    struct jlist *l = jr_alloc(r, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    l->v = n ? jr_alloc(r, bytes) : NULL;
    if (n && !l->v) return NULL;
    return l;
}

struct jdict *jv_dict_new(struct jrender *r, size_t cap)
{
    struct jdict *d = jr_alloc(r, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    if (cap) {
        d->keys = jr_alloc(r, cap * sizeof *d->keys);
        d->vals = jr_alloc(r, cap * sizeof *d->vals);
        if (!d->keys || !d->vals) return NULL;
        d->cap = cap;
    }
    return d;
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

// The hash index covers string keys only; other keys are found by scanning.
static int dict_index_insert(struct jdict *d, size_t entry)
{
    size_t mask = d->index_cap - 1;
    size_t h = (size_t)hash_bytes(d->keys[entry].s.p, d->keys[entry].s.n) & mask;
    while (d->index[h]) h = (h + 1) & mask;
    d->index[h] = (uint32_t)(entry + 1);
    return 0;
}

static int dict_build_index(struct jrender *r, struct jdict *d)
{
    size_t cap = 32;
    while (cap < d->n * 2 + 2) cap *= 2;
    if (d->n >= UINT32_MAX / 2) return 0; // too big to index: scan
    uint32_t *idx = jr_alloc(r, cap * sizeof *idx);
    if (!idx) return MS_EINVAL;
    memset(idx, 0, cap * sizeof *idx);
    d->index = idx;
    d->index_cap = cap;
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].t == JV_STR) dict_index_insert(d, i);
    return 0;
}

const struct jv *jv_dict_get_str(struct jrender *r, struct jdict *d, const char *k, size_t n)
{
    if (d->n >= 16 && !d->index && r) dict_build_index(r, d);
    if (d->index) {
        size_t mask = d->index_cap - 1;
        size_t h = (size_t)hash_bytes(k, n) & mask;
        while (d->index[h]) {
            size_t e = d->index[h] - 1;
            if (d->keys[e].s.n == n && memcmp(d->keys[e].s.p, k, n) == 0) return &d->vals[e];
            h = (h + 1) & mask;
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].t == JV_STR && d->keys[i].s.n == n && memcmp(d->keys[i].s.p, k, n) == 0)
            return &d->vals[i];
    return NULL;
}

const struct jv *jv_dict_get(struct jrender *r, struct jdict *d, struct jv key)
{
    if (key.t == JV_STR) return jv_dict_get_str(r, d, key.s.p, key.s.n);
    for (size_t i = 0; i < d->n; i++) {
        bool eq = false;
        if (d->keys[i].t != JV_STR && jv_equal(r, d->keys[i], key, &eq, 0) == 0 && eq)
            return &d->vals[i];
    }
    return NULL;
}

int jv_dict_set(struct jrender *r, struct jdict *d, struct jv key, struct jv val)
{
    if (key.t == JV_LIST || key.t == JV_DICT || key.t == JV_NS)
        return jr_fail(r, "unhashable type: '%s'", jv_type_name(key.t));
    const struct jv *old = jv_dict_get(r, d, key);
    if (old) {
        *(struct jv *)old = val;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        struct jv *k = jr_alloc(r, cap * sizeof *k);
        struct jv *v = jr_alloc(r, cap * sizeof *v);
        if (!k || !v) return MS_EINVAL;
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof *k);
            memcpy(v, d->vals, d->n * sizeof *v);
        }
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    if (d->index) {
        if (d->n * 2 + 2 > d->index_cap) {
            d->index = NULL;
            d->index_cap = 0;
            return dict_build_index(r, d);
        }
        if (key.t == JV_STR) dict_index_insert(d, d->n - 1);
    }
    return 0;
}

int jv_from_json(struct jrender *r, const json_t *j, struct jv *out, int depth)
{
    if (depth > 4096) return jr_fail(r, "input JSON nests more than 4096 levels deep");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return 0;
    case JSON_TRUE: *out = jv_bool(true); return 0;
    case JSON_FALSE: *out = jv_bool(false); return 0;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_STRING: *out = jv_str(json_string_value(j), json_string_length(j)); return 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct jlist *l = jv_list_new(r, n);
        if (!l) return MS_EINVAL;
        for (size_t i = 0; i < n; i++) {
            int rc = jv_from_json(r, json_array_get(j, i), &l->v[i], depth + 1);
            if (rc) return rc;
        }
        out->t = JV_LIST;
        out->l = l;
        return 0;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        struct jdict *d = jv_dict_new(r, n);
        if (!d) return MS_EINVAL;
        const char *key;
        json_t *val;
        // jansson iterates in insertion order and has no duplicate keys.
        json_object_foreach((json_t *)j, key, val) {
            d->keys[d->n] = jv_str(key, strlen(key));
            int rc = jv_from_json(r, val, &d->vals[d->n], depth + 1);
            if (rc) return rc;
            d->n++;
        }
        *out = jv_undef();
        out->t = JV_DICT;
        out->d = d;
        return 0;
    }
    }
    return jr_fail(r, "unknown JSON value type");
}

// ---- type predicates ------------------------------------------------------------------
const char *jv_type_name(int t)
{
    switch (t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

bool jv_truthy(struct jv v)
{
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s.n != 0;
    case JV_LIST: case JV_TUPLE: return v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
    }
}

bool jv_is_number(struct jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }

double jv_num(struct jv v)
{
    return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : v.t == JV_BOOL ? (double)v.b : 0.0;
}

static const char *obj_desc(int t)
{
    switch (t) {
    case JV_NONE: return "None";
    case JV_DICT: return "dict object";
    case JV_LIST: return "list object";
    case JV_TUPLE: return "tuple object";
    case JV_STR: return "str object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    case JV_NS: return "Namespace object";
    case JV_LOOP: return "LoopContext object";
    default: return "object";
    }
}

int jv_undef_fail(struct jrender *r, struct jv v)
{
    int n = (int)(v.s.n > 200 ? 200 : v.s.n);
    switch (v.ukind) {
    case JU_ATTR:
        return jr_fail(r, "'%s' has no attribute '%.*s'", obj_desc(v.uobj), n, v.s.p);
    case JU_ITEM:
        return jr_fail(r, "'%s' has no element %d", obj_desc(v.uobj), v.uitem);
    case JU_MESSAGE:
        return jr_fail(r, "%.*s", n, v.s.p);
    default:
        if (!v.s.p) return jr_fail(r, "a value is undefined");
        return jr_fail(r, "'%.*s' is undefined", n, v.s.p);
    }
}

int jv_equal(struct jrender *r, struct jv a, struct jv b, bool *eq, int depth)
{
    if (depth > JINJA_MAX_VALUE_DEPTH) return jr_fail(r, "values nested too deeply to compare");
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_BOOL ? a.b : a.i, y = b.t == JV_BOOL ? b.b : b.i;
            *eq = x == y;
        } else {
            *eq = jv_num(a) == jv_num(b);
        }
        return 0;
    }
    *eq = false;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: *eq = true; return 0;
    case JV_STR: *eq = a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0; return 0;
    case JV_LIST: case JV_TUPLE:
        if (a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++) {
            int rc = jv_equal(r, a.l->v[i], b.l->v[i], eq, depth + 1);
            if (rc || !*eq) return rc;
        }
        *eq = true;
        return 0;
    case JV_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            const struct jv *o = jv_dict_get(r, b.d, a.d->keys[i]);
            if (!o) return 0;
            int rc = jv_equal(r, a.d->vals[i], *o, eq, depth + 1);
            if (rc || !*eq) return rc;
        }
        *eq = true;
        return 0;
    case JV_NS: *eq = a.d == b.d; return 0;
    case JV_FUNC: *eq = a.fn == b.fn; return 0;
    case JV_MACRO: *eq = a.m == b.m; return 0;
    case JV_LOOP: *eq = a.loop == b.loop; return 0;
    }
    return 0;
}

int jv_compare(struct jrender *r, struct jv a, struct jv b, int *cmp, const char *opname)
{
    if (a.t == JV_UNDEF) return jv_undef_fail(r, a);
    if (b.t == JV_UNDEF) return jv_undef_fail(r, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_BOOL ? a.b : a.i, y = b.t == JV_BOOL ? b.b : b.i;
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = jv_num(a), y = jv_num(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = n ? memcmp(a.s.p, b.s.p, n) : 0;
        *cmp = c ? (c < 0 ? -1 : 1) : (a.s.n < b.s.n ? -1 : a.s.n > b.s.n);
        return 0;
    }
    if ((a.t == JV_LIST || a.t == JV_TUPLE) && a.t == b.t) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            bool eq;
            int rc = jv_equal(r, a.l->v[i], b.l->v[i], &eq, 0);
            if (rc) return rc;
            if (!eq) return jv_compare(r, a.l->v[i], b.l->v[i], cmp, opname);
        }
        *cmp = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    return jr_fail(r, "'%s' not supported between instances of '%s' and '%s'", opname,
                   jv_type_name(a.t), jv_type_name(b.t));
}

// ---- printing --------------------------------------------------------------------------
static bool is_printable(uint32_t cp)
{
    if (cp == ' ') return true;
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static int repr_str(struct jrender *r, struct jstr s, struct ms_buf *b)
{
    bool has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    int rc = jsb_putc(r, b, q);
    for (size_t i = 0; i < s.n && !rc;) {
        uint32_t cp;
        size_t k = ju_decode(s.p + i, s.n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            char e[2] = {'\\', (char)cp};
            rc = jsb_put(r, b, e, 2);
        } else if (cp == '\n') rc = jsb_put(r, b, "\\n", 2);
        else if (cp == '\r') rc = jsb_put(r, b, "\\r", 2);
        else if (cp == '\t') rc = jsb_put(r, b, "\\t", 2);
        else if (is_printable(cp)) rc = jsb_put(r, b, s.p + i, k);
        else if (cp <= 0xff) rc = jsb_printf(r, b, "\\x%02x", cp);
        else if (cp <= 0xffff) rc = jsb_printf(r, b, "\\u%04x", cp);
        else rc = jsb_printf(r, b, "\\U%08x", cp);
        i += k;
    }
    return rc ? rc : jsb_putc(r, b, q);
}

int jv_to_repr(struct jrender *r, struct jv v, struct ms_buf *b, int depth)
{
    if (depth > JINJA_MAX_VALUE_DEPTH) return jr_fail(r, "a value nests too deeply to print");
    int rc = 0;
    switch (v.t) {
    case JV_UNDEF: return jsb_put(r, b, "Undefined", 9);
    case JV_STR: return repr_str(r, v.s, b);
    case JV_LIST:
    case JV_TUPLE:
        rc = jsb_putc(r, b, v.t == JV_LIST ? '[' : '(');
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            if (i) rc = jsb_put(r, b, ", ", 2);
            if (!rc) rc = jv_to_repr(r, v.l->v[i], b, depth + 1);
        }
        if (!rc && v.t == JV_TUPLE && v.l->n == 1) rc = jsb_putc(r, b, ',');
        return rc ? rc : jsb_putc(r, b, v.t == JV_LIST ? ']' : ')');
    case JV_DICT:
    case JV_NS:
        if (v.t == JV_NS) rc = jsb_put(r, b, "<Namespace ", 11);
        if (!rc) rc = jsb_putc(r, b, '{');
        for (size_t i = 0; i < v.d->n && !rc; i++) {
            if (i) rc = jsb_put(r, b, ", ", 2);
            if (!rc) rc = jv_to_repr(r, v.d->keys[i], b, depth + 1);
            if (!rc) rc = jsb_put(r, b, ": ", 2);
            if (!rc) rc = jv_to_repr(r, v.d->vals[i], b, depth + 1);
        }
        if (!rc) rc = jsb_putc(r, b, '}');
        if (!rc && v.t == JV_NS) rc = jsb_putc(r, b, '>');
        return rc;
    default:
        return jv_to_str(r, v, b);
    }
}

int jv_to_str(struct jrender *r, struct jv v, struct ms_buf *b)
{
    char num[48];
    switch (v.t) {
    case JV_UNDEF: return 0;
    case JV_NONE: return jsb_put(r, b, "None", 4);
    case JV_BOOL: return v.b ? jsb_put(r, b, "True", 4) : jsb_put(r, b, "False", 5);
    case JV_INT: return jsb_printf(r, b, "%lld", (long long)v.i);
    case JV_FLOAT: json_format_py_float(v.f, num); return jsb_put(r, b, num, strlen(num));
    case JV_STR: return jsb_put(r, b, v.s.p, v.s.n);
    case JV_FUNC: return jsb_printf(r, b, "<built-in function %s>", v.fn->name);
    case JV_MACRO:
        return jsb_printf(r, b, "<Macro '%.*s'>", (int)v.m->def->s.n, v.m->def->s.p);
    case JV_LOOP:
        return jsb_printf(r, b, "<LoopContext %zu/%zu>", v.loop->index0 + 1, v.loop->length);
    default: return jv_to_repr(r, v, b, 0);
    }
}

int jv_stringify(struct jrender *r, struct jv v, struct jstr *out)
{
    if (v.t == JV_STR) {
        *out = v.s;
        return 0;
    }
    if (v.t == JV_UNDEF) {
        out->p = "";
        out->n = 0;
        return 0;
    }
    struct ms_buf b = jsb_new(r);
    int rc = jv_to_str(r, v, &b);
    if (rc) return rc;
    *out = jsb_str(&b).s;
    return 0;
}

// ---- json.dumps -------------------------------------------------------------------------
static int json_str(struct jrender *r, struct jstr s, bool ascii, struct ms_buf *b)
{
    int rc = jsb_putc(r, b, '"');
    size_t run = 0; // bytes copied verbatim, flushed in one piece
    for (size_t i = 0; i < s.n && !rc;) {
        unsigned char c = (unsigned char)s.p[i];
        const char *esc = NULL;
        char ebuf[16];
        size_t k = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20 || (ascii && c == 0x7f)) {
            snprintf(ebuf, sizeof ebuf, "\\u%04x", c);
            esc = ebuf;
        } else if (c >= 0x80 && ascii) {
            uint32_t cp;
            k = ju_decode(s.p + i, s.n - i, &cp);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(ebuf, sizeof ebuf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                snprintf(ebuf, sizeof ebuf, "\\u%04x", cp);
            }
            esc = ebuf;
        }
        if (esc) {
            rc = jsb_put(r, b, s.p + i - run, run);
            run = 0;
            if (!rc) rc = jsb_put(r, b, esc, strlen(esc));
        } else {
            run++;
        }
        i += k;
    }
    if (!rc) rc = jsb_put(r, b, s.p + s.n - run, run);
    return rc ? rc : jsb_putc(r, b, '"');
}

static int json_newline(struct jrender *r, const struct jjson_opts *o, struct ms_buf *b, int level)
{
    int rc = jsb_putc(r, b, '\n');
    for (int i = 0; i < level && !rc; i++) rc = jsb_put(r, b, o->indent.p, o->indent.n);
    return rc;
}

struct keyed {
    struct jstr key;
    size_t idx;
};

static int cmp_keyed(const void *x, const void *y)
{
    const struct keyed *a = x, *b = y;
    size_t n = a->key.n < b->key.n ? a->key.n : b->key.n;
    int c = n ? memcmp(a->key.p, b->key.p, n) : 0;
    if (c) return c;
    if (a->key.n != b->key.n) return a->key.n < b->key.n ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

// A dict key as json.dumps writes it (str keys as they are; int, float, bool, None converted).
static int json_key(struct jrender *r, struct jv k, struct jstr *out)
{
    switch (k.t) {
    case JV_STR: *out = k.s; return 0;
    case JV_NONE: out->p = "null"; out->n = 4; return 0;
    case JV_BOOL: out->p = k.b ? "true" : "false"; out->n = k.b ? 4 : 5; return 0;
    case JV_INT: case JV_FLOAT: return jv_stringify(r, k, out);
    default:
        return jr_fail(r, "tojson: keys must be str, int, float, bool or None, not %s",
                       jv_type_name(k.t));
    }
}

int jv_to_json(struct jrender *r, struct jv v, const struct jjson_opts *o, struct ms_buf *b,
               int depth)
{
    if (depth > JINJA_MAX_VALUE_DEPTH) return jr_fail(r, "tojson: a value nests too deeply");
    char num[48];
    int rc = 0;
    switch (v.t) {
    case JV_NONE: return jsb_put(r, b, "null", 4);
    case JV_BOOL: return v.b ? jsb_put(r, b, "true", 4) : jsb_put(r, b, "false", 5);
    case JV_INT: return jsb_printf(r, b, "%lld", (long long)v.i);
    case JV_FLOAT:
        if (isnan(v.f)) return jsb_put(r, b, "NaN", 3);
        if (isinf(v.f)) return v.f < 0 ? jsb_put(r, b, "-Infinity", 9) : jsb_put(r, b, "Infinity", 8);
        json_format_py_float(v.f, num);
        return jsb_put(r, b, num, strlen(num));
    case JV_STR: return json_str(r, v.s, o->ensure_ascii, b);
    case JV_LIST:
    case JV_TUPLE:
        if (v.l->n == 0) return jsb_put(r, b, "[]", 2);
        rc = jsb_putc(r, b, '[');
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            if (i) rc = jsb_put(r, b, o->item_sep.p, o->item_sep.n);
            if (!rc && o->has_indent) rc = json_newline(r, o, b, depth + 1);
            if (!rc) rc = jv_to_json(r, v.l->v[i], o, b, depth + 1);
        }
        if (!rc && o->has_indent) rc = json_newline(r, o, b, depth);
        return rc ? rc : jsb_putc(r, b, ']');
    case JV_DICT: {
        struct jdict *d = v.d;
        if (d->n == 0) return jsb_put(r, b, "{}", 2);
        struct keyed *order = jr_alloc(r, d->n * sizeof *order);
        if (!order) return MS_EINVAL;
        for (size_t i = 0; i < d->n; i++) {
            rc = json_key(r, d->keys[i], &order[i].key);
            if (rc) return rc;
            order[i].idx = i;
        }
        if (o->sort_keys) qsort(order, d->n, sizeof *order, cmp_keyed);
        rc = jsb_putc(r, b, '{');
        for (size_t i = 0; i < d->n && !rc; i++) {
            if (i) rc = jsb_put(r, b, o->item_sep.p, o->item_sep.n);
            if (!rc && o->has_indent) rc = json_newline(r, o, b, depth + 1);
            if (!rc) rc = json_str(r, order[i].key, o->ensure_ascii, b);
            if (!rc) rc = jsb_put(r, b, o->key_sep.p, o->key_sep.n);
            if (!rc) rc = jv_to_json(r, d->vals[order[i].idx], o, b, depth + 1);
        }
        if (!rc && o->has_indent) rc = json_newline(r, o, b, depth);
        return rc ? rc : jsb_putc(r, b, '}');
    }
    case JV_UNDEF:
        return jr_fail(r, "tojson: Object of type Undefined is not JSON serializable");
    default:
        return jr_fail(r, "tojson: Object of type %s is not JSON serializable", jv_type_name(v.t));
    }
}

// ---- iteration ------------------------------------------------------------------------------
int jv_iterate(struct jrender *r, struct jv v, struct jlist **out)
{
    static struct jlist empty = {0, NULL};
    switch (v.t) {
    case JV_LIST:
    case JV_TUPLE:
        *out = v.l;
        return 0;
    case JV_DICT: {
        struct jlist *l = jv_list_new(r, v.d->n);
        if (!l) return MS_EINVAL;
        for (size_t i = 0; i < v.d->n; i++) l->v[i] = v.d->keys[i];
        *out = l;
        return 0;
    }
    case JV_STR: {
        struct jlist *l = jv_list_new(r, ju_count(v.s.p, v.s.n));
        if (!l) return MS_EINVAL;
        size_t k = 0;
        for (size_t i = 0; i < v.s.n;) {
            uint32_t cp;
            size_t len = ju_decode(v.s.p + i, v.s.n - i, &cp);
            l->v[k++] = jv_str(v.s.p + i, len);
            i += len;
        }
        l->n = k;
        *out = l;
        return 0;
    }
    case JV_UNDEF:
        *out = &empty;
        return 0;
    default:
        return jr_fail(r, "'%s' object is not iterable", jv_type_name(v.t));
    }
}
