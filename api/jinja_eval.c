// jinja_eval: executes a parsed template — scopes (a frame per loop iteration,
// macro call and with block, as Jinja scopes them), expressions with Python
// semantics, macros and call blocks, output capture — and owns jinja_parse/render.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "api/jinja_impl.h"
#include "base/base.h"

void jinja_limits_default(struct jinja_limits *lim)
{
    lim->max_output_bytes = (size_t)64 << 20;
    lim->max_memory_bytes = (size_t)256 << 20;
    lim->max_steps = 10000000;
    lim->max_call_depth = 64;
}

// ---- frames -----------------------------------------------------------------------------
static struct jframe *frame_new(struct jrender *r, struct jframe *parent)
{
    struct jframe *f = jr_alloc(r, sizeof *f);
    if (!f) return NULL;
    f->parent = parent;
    f->n = f->cap = 0;
    f->vars = NULL;
    f->captured = false;
    return f;
}

static int frame_set(struct jrender *r, struct jframe *f, struct jstr name, struct jv v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->vars[i].name.n == name.n && memcmp(f->vars[i].name.p, name.p, name.n) == 0) {
            f->vars[i].value = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4;
        struct jvar *nv = jr_alloc(r, cap * sizeof *nv);
        if (!nv) return MS_EINVAL;
        if (f->n) memcpy(nv, f->vars, f->n * sizeof *nv);
        f->vars = nv;
        f->cap = cap;
    }
    f->vars[f->n].name = name;
    f->vars[f->n].value = v;
    f->n++;
    return 0;
}

static void frame_unset(struct jframe *f, struct jstr name)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->vars[i].name.n == name.n && memcmp(f->vars[i].name.p, name.p, name.n) == 0) {
            f->vars[i] = f->vars[--f->n];
            return;
        }
}

static struct jv lookup(struct jrender *r, struct jframe *f, struct jstr name)
{
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (f->vars[i].name.n == name.n && memcmp(f->vars[i].name.p, name.p, name.n) == 0)
                return f->vars[i].value;
    struct jv g;
    if (jb_global(r, name, &g)) return g;
    return jv_undef_name(name);
}

// ---- forward declarations ---------------------------------------------------------------
static int eval(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv *out);
static int exec_body(struct jrender *r, struct jframe *f, struct jnode *const *body, size_t n);

// ---- calls --------------------------------------------------------------------------------
static int eval_args(struct jrender *r, struct jframe *f, const struct jargs_ast *ast,
                     struct jcallargs *a)
{
    memset(a, 0, sizeof *a);
    struct jlist *extra = NULL;
    struct jv dyn = jv_undef();
    if (ast->dyn_args) {
        struct jv v;
        int rc = eval(r, f, ast->dyn_args, &v);
        if (rc) return rc;
        if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
        rc = jv_iterate(r, v, &extra);
        if (rc) return rc;
    }
    if (ast->dyn_kwargs) {
        int rc = eval(r, f, ast->dyn_kwargs, &dyn);
        if (rc) return rc;
        if (dyn.t != JV_DICT)
            return jr_fail(r, "argument after ** must be a mapping, not %s", jv_type_name(dyn.t));
    }
    size_t npos = ast->npos + (extra ? extra->n : 0);
    size_t nkw = ast->nkw + (dyn.t == JV_DICT ? dyn.d->n : 0);
    if (npos) {
        a->pos = jr_alloc(r, npos * sizeof *a->pos);
        if (!a->pos) return MS_EINVAL;
    }
    if (nkw) {
        a->kwn = jr_alloc(r, nkw * sizeof *a->kwn);
        a->kwv = jr_alloc(r, nkw * sizeof *a->kwv);
        if (!a->kwn || !a->kwv) return MS_EINVAL;
    }
    for (size_t i = 0; i < ast->npos; i++) {
        int rc = eval(r, f, ast->pos[i], &a->pos[a->npos]);
        if (rc) return rc;
        a->npos++;
    }
    for (size_t i = 0; extra && i < extra->n; i++) a->pos[a->npos++] = extra->v[i];
    for (size_t i = 0; i < ast->nkw; i++) {
        int rc = eval(r, f, ast->kwv[i], &a->kwv[a->nkw]);
        if (rc) return rc;
        a->kwn[a->nkw++] = ast->kwn[i];
    }
    for (size_t i = 0; dyn.t == JV_DICT && i < dyn.d->n; i++) {
        if (dyn.d->keys[i].t != JV_STR) return jr_fail(r, "keywords must be strings");
        for (size_t k = 0; k < a->nkw; k++)
            if (a->kwn[k].n == dyn.d->keys[i].s.n &&
                memcmp(a->kwn[k].p, dyn.d->keys[i].s.p, a->kwn[k].n) == 0)
                return jr_fail(r, "got multiple values for keyword argument '%.*s'",
                               (int)a->kwn[k].n, a->kwn[k].p);
        a->kwn[a->nkw] = dyn.d->keys[i].s;
        a->kwv[a->nkw++] = dyn.d->vals[i];
    }
    return 0;
}

// Renders body into a fresh buffer and returns it as a string value.
static int capture(struct jrender *r, struct jframe *f, struct jnode *const *body, size_t n,
                   struct jv *out, int *flow)
{
    struct ms_buf buf = jsb_new(r), *saved = r->out;
    r->out = &buf;
    int rc = exec_body(r, f, body, n);
    r->out = saved;
    if (rc < 0) return rc;
    if (flow) *flow = rc;
    *out = jsb_str(&buf);
    return 0;
}

static int call_macro(struct jrender *r, const struct jmacro *m, struct jcallargs *a,
                      struct jv *out)
{
    const struct jnode *def = m->def;
    bool is_caller = def->kind == JN_CALL_BLOCK;
    const char *what = is_caller ? "caller()" : "macro";
    int namelen = is_caller ? 0 : (int)def->s.n;
    if (r->call_depth >= r->lim.max_call_depth)
        return jr_fail(r, "macro calls nest more than %d deep (runaway recursion?)",
                       r->lim.max_call_depth);
    int rc = jr_step(r, 1);
    if (rc) return rc;
    struct jframe *f = frame_new(r, m->closure);
    if (!f) return MS_EINVAL;
    const struct jparams *p = &def->params;
    bool *set = NULL;
    if (p->n) {
        set = jr_alloc(r, p->n);
        if (!set) return MS_EINVAL;
        memset(set, 0, p->n);
    }
    size_t npos = a->npos < p->n ? a->npos : p->n;
    for (size_t i = 0; i < npos; i++) {
        if ((rc = frame_set(r, f, p->names[i], a->pos[i]))) return rc;
        set[i] = true;
    }
    if (a->npos > p->n && !(def->flags & JF_USES_VARARGS))
        return jr_fail(r, "%s '%.*s' takes not more than %zu argument(s)", what, namelen,
                       def->s.p, p->n);
    struct jdict *kwargs = NULL;
    if (def->flags & JF_USES_KWARGS) {
        kwargs = jv_dict_new(r, 0);
        if (!kwargs) return MS_EINVAL;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < p->n && !(p->names[i].n == a->kwn[k].n &&
                             memcmp(p->names[i].p, a->kwn[k].p, a->kwn[k].n) == 0))
            i++;
        if (i < p->n) {
            if (set[i])
                return jr_fail(r, "%s '%.*s' got multiple values for argument '%.*s'", what,
                               namelen, def->s.p, (int)a->kwn[k].n, a->kwn[k].p);
            if ((rc = frame_set(r, f, p->names[i], a->kwv[k]))) return rc;
            set[i] = true;
        } else if (kwargs) {
            if ((rc = jv_dict_set(r, kwargs, jv_str(a->kwn[k].p, a->kwn[k].n), a->kwv[k])))
                return rc;
        } else {
            return jr_fail(r, "%s '%.*s' takes no keyword argument '%.*s'", what, namelen,
                           def->s.p, (int)a->kwn[k].n, a->kwn[k].p);
        }
    }
    if (def->flags & JF_USES_CALLER) {
        if ((rc = frame_set(r, f, (struct jstr){"caller", 6}, m->caller))) return rc;
    }
    if (def->flags & JF_USES_VARARGS) {
        size_t extra = a->npos > p->n ? a->npos - p->n : 0;
        struct jlist *l = jv_list_new(r, extra);
        if (!l) return MS_EINVAL;
        for (size_t i = 0; i < extra; i++) l->v[i] = a->pos[p->n + i];
        struct jv v = {0};
        v.t = JV_TUPLE;
        v.l = l;
        if ((rc = frame_set(r, f, (struct jstr){"varargs", 7}, v))) return rc;
    }
    if (kwargs) {
        struct jv v = {0};
        v.t = JV_DICT;
        v.d = kwargs;
        if ((rc = frame_set(r, f, (struct jstr){"kwargs", 6}, v))) return rc;
    }
    // Defaults are evaluated in the macro's scope, after the passed arguments are bound.
    for (size_t i = 0; i < p->n; i++) {
        if (set[i]) continue;
        struct jv v;
        if (p->defaults[i]) {
            if ((rc = eval(r, f, p->defaults[i], &v))) return rc;
        } else {
            v = jv_undef_name(p->names[i]);
        }
        if ((rc = frame_set(r, f, p->names[i], v))) return rc;
    }
    r->call_depth++;
    uint32_t line = r->line;
    rc = capture(r, f, def->body, def->nbody, out, NULL);
    r->line = line;
    r->call_depth--;
    return rc;
}

int jinja_call_value(struct jrender *r, struct jv fn, struct jcallargs *a, struct jv *out)
{
    switch (fn.t) {
    case JV_FUNC: return fn.fn->fn(r, fn.fn, a, out);
    case JV_MACRO: return call_macro(r, fn.m, a, out);
    case JV_UNDEF: return jv_undef_fail(r, fn);
    case JV_LOOP: return jr_fail(r, "recursive loops (loop(...)) are not supported");
    default: return jr_fail(r, "'%s' object is not callable", jv_type_name(fn.t));
    }
}

// ---- attribute and item access --------------------------------------------------------------
static int get_attr(struct jrender *r, struct jv obj, struct jstr name, struct jv *out)
{
    int rc = 0;
    switch (obj.t) {
    case JV_UNDEF:
        return jv_undef_fail(r, obj);
    case JV_DICT:
        // Python looks up attributes (dict methods) before items.
        if (jb_method(r, obj, name, out, &rc)) return rc;
        {
            const struct jv *v = jv_dict_get_str(r, obj.d, name.p, name.n);
            *out = v ? *v : jv_undef_attr(JV_DICT, name);
        }
        return 0;
    case JV_NS: {
        const struct jv *v = jv_dict_get_str(r, obj.d, name.p, name.n);
        *out = v ? *v : jv_undef_attr(JV_NS, name);
        return 0;
    }
    case JV_LOOP:
        return jb_loop_attr(r, obj, name, out);
    default:
        if (jb_method(r, obj, name, out, &rc)) return rc;
        *out = jv_undef_attr(obj.t, name);
        return 0;
    }
}

static int get_item(struct jrender *r, struct jv obj, struct jv key, struct jv *out)
{
    if (obj.t == JV_UNDEF) return jv_undef_fail(r, obj);
    if (obj.t == JV_DICT) {
        const struct jv *v = jv_dict_get(r, obj.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    } else if ((obj.t == JV_LIST || obj.t == JV_TUPLE || obj.t == JV_STR) &&
               (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = key.t == JV_BOOL ? key.b : key.i;
        if (obj.t == JV_STR) {
            if (ju_is_ascii(obj.s.p, obj.s.n)) {
                int64_t n = (int64_t)obj.s.n;
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    *out = jv_str(obj.s.p + i, 1);
                    return 0;
                }
            } else {
                struct jlist *chars;
                int rc = jv_iterate(r, obj, &chars);
                if (rc) return rc;
                int64_t n = (int64_t)chars->n;
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    *out = chars->v[i];
                    return 0;
                }
            }
        } else {
            int64_t n = (int64_t)obj.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                *out = obj.l->v[i];
                return 0;
            }
        }
        *out = jv_undef();
        out->ukind = JU_ITEM;
        out->uobj = obj.t;
        out->uitem = (int32_t)(key.t == JV_BOOL ? key.b : key.i);
        return 0;
    }
    // x['name'] falls back to the attribute, as Jinja's getitem does.
    if (key.t == JV_STR) return get_attr(r, obj, key.s, out);
    *out = jv_undef_msg("subscript of a value that has no such item");
    return 0;
}

static int slice_index(struct jrender *r, struct jv v, bool *given, int64_t *out)
{
    *given = false;
    if (v.t == JV_NONE) return 0;
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *given = true;
        *out = v.t == JV_BOOL ? v.b : v.i;
        return 0;
    }
    if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
    return jr_fail(r, "slice indices must be integers or None, not %s", jv_type_name(v.t));
}

static int do_slice(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv obj,
                    struct jv *out)
{
    int64_t idx[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; k++) {
        if (!n->items[k]) continue;
        struct jv v;
        int rc = eval(r, f, n->items[k], &v);
        if (rc) return rc;
        if ((rc = slice_index(r, v, &given[k], &idx[k]))) return rc;
    }
    int64_t step = given[2] ? idx[2] : 1;
    if (step == 0) return jr_fail(r, "slice step cannot be zero");
    if (obj.t == JV_UNDEF) return jv_undef_fail(r, obj);
    struct jlist *items = NULL;
    bool ascii = obj.t == JV_STR && ju_is_ascii(obj.s.p, obj.s.n);
    int64_t len;
    if (obj.t == JV_LIST || obj.t == JV_TUPLE) {
        len = (int64_t)obj.l->n;
    } else if (obj.t == JV_STR) {
        if (ascii) {
            len = (int64_t)obj.s.n;
        } else {
            int rc = jv_iterate(r, obj, &items);
            if (rc) return rc;
            len = (int64_t)items->n;
        }
    } else {
        *out = jv_undef_msg("slice of a value that cannot be sliced");
        return 0;
    }
    // CPython's PySlice_AdjustIndices.
    int64_t start, stop;
    if (!given[0]) start = step < 0 ? len - 1 : 0;
    else {
        start = idx[0];
        if (start < 0) {
            start += len;
            if (start < 0) start = step < 0 ? -1 : 0;
        } else if (start >= len) start = step < 0 ? len - 1 : len;
    }
    if (!given[1]) stop = step < 0 ? -1 : len;
    else {
        stop = idx[1];
        if (stop < 0) {
            stop += len;
            if (stop < 0) stop = step < 0 ? -1 : 0;
        } else if (stop >= len) stop = step < 0 ? len - 1 : len;
    }
    int64_t count = 0;
    if (step > 0 && start < stop) count = (stop - start - 1) / step + 1;
    else if (step < 0 && stop < start) count = (start - stop - 1) / (-step) + 1;
    if (obj.t == JV_STR && ascii && step == 1) {
        *out = jv_str(obj.s.p + start, (size_t)count);
        return 0;
    }
    if (obj.t == JV_STR) {
        size_t bytes = 0;
        for (int64_t k = 0, i = start; k < count; k++, i += step)
            bytes += ascii ? 1 : items->v[i].s.n;
        char *s = jr_alloc(r, bytes + 1);
        if (!s) return MS_EINVAL;
        size_t o = 0;
        for (int64_t k = 0, i = start; k < count; k++, i += step) {
            if (ascii) s[o++] = obj.s.p[i];
            else {
                memcpy(s + o, items->v[i].s.p, items->v[i].s.n);
                o += items->v[i].s.n;
            }
        }
        s[o] = 0;
        *out = jv_str(s, o);
        return 0;
    }
    struct jlist *l = jv_list_new(r, (size_t)count);
    if (!l) return MS_EINVAL;
    for (int64_t k = 0, i = start; k < count; k++, i += step) l->v[k] = obj.l->v[i];
    *out = jv_undef();
    out->t = obj.t;
    out->l = l;
    return 0;
}

// ---- operators ------------------------------------------------------------------------------
static int concat_str(struct jrender *r, struct jstr a, struct jstr b, struct jv *out)
{
    size_t n;
    if (ms_add_overflow(a.n, b.n, &n)) return jr_fail(r, "string too long");
    char *s = jr_alloc(r, n + 1);
    if (!s) return MS_EINVAL;
    if (a.n) memcpy(s, a.p, a.n);
    if (b.n) memcpy(s + a.n, b.p, b.n);
    s[n] = 0;
    *out = jv_str(s, n);
    return 0;
}

static int repeat(struct jrender *r, struct jv seq, int64_t times, struct jv *out)
{
    if (times < 0) times = 0;
    if (seq.t == JV_STR) {
        size_t n;
        if (ms_mul_overflow(seq.s.n, (size_t)times, &n) || n > r->lim.max_output_bytes)
            return jr_fail(r, "string repetition result is too large");
        char *s = jr_alloc(r, n + 1);
        if (!s) return MS_EINVAL;
        for (int64_t i = 0; i < times; i++) memcpy(s + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
        s[n] = 0;
        *out = jv_str(s, n);
        return 0;
    }
    size_t n;
    if (ms_mul_overflow(seq.l->n, (size_t)times, &n) || n > r->lim.max_steps)
        return jr_fail(r, "list repetition result is too large");
    struct jlist *l = jv_list_new(r, n);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < n; i++) l->v[i] = seq.l->v[i % seq.l->n];
    *out = jv_undef();
    out->t = seq.t;
    out->l = l;
    return 0;
}

static int64_t as_int(struct jv v) { return v.t == JV_BOOL ? v.b : v.i; }

static int binary_op(struct jrender *r, int op, struct jv a, struct jv b, struct jv *out)
{
    static const char *const names[] = {
        [JOP_ADD] = "+", [JOP_SUB] = "-", [JOP_MUL] = "*", [JOP_DIV] = "/",
        [JOP_FLOORDIV] = "//", [JOP_MOD] = "%", [JOP_POW] = "**",
    };
    if (a.t == JV_UNDEF) return jv_undef_fail(r, a);
    if (b.t == JV_UNDEF) return jv_undef_fail(r, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        bool fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
        int64_t x = fl ? 0 : as_int(a), y = fl ? 0 : as_int(b), z;
        double fx = jv_num(a), fy = jv_num(b);
        switch (op) {
        case JOP_ADD:
            if (fl) { *out = jv_float(fx + fy); return 0; }
            if (__builtin_add_overflow(x, y, &z)) break;
            *out = jv_int(z);
            return 0;
        case JOP_SUB:
            if (fl) { *out = jv_float(fx - fy); return 0; }
            if (__builtin_sub_overflow(x, y, &z)) break;
            *out = jv_int(z);
            return 0;
        case JOP_MUL:
            if (fl) { *out = jv_float(fx * fy); return 0; }
            if (__builtin_mul_overflow(x, y, &z)) break;
            *out = jv_int(z);
            return 0;
        case JOP_DIV:
            if (fy == 0) return jr_fail(r, "division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (fl) {
                if (fy == 0) return jr_fail(r, "float division by zero");
                // CPython's float_divmod.
                double m = fmod(fx, fy), div = (fx - m) / fy;
                if (m != 0) {
                    if ((fy < 0) != (m < 0)) {
                        m += fy;
                        div -= 1.0;
                    }
                } else {
                    m = copysign(0.0, fy);
                }
                double fdiv;
                if (div != 0) {
                    fdiv = floor(div);
                    if (div - fdiv > 0.5) fdiv += 1.0;
                } else {
                    fdiv = copysign(0.0, fx / fy);
                }
                *out = jv_float(op == JOP_MOD ? m : fdiv);
                return 0;
            }
            if (y == 0) return jr_fail(r, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) break;
            {
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == JOP_MOD ? m : q);
            }
            return 0;
        case JOP_POW:
            if (!fl && y >= 0) {
                int64_t res = 1, base = x;
                int64_t e = y;
                bool ovf = false;
                while (e > 0 && !ovf) {
                    if (e & 1) ovf |= __builtin_mul_overflow(res, base, &res);
                    e >>= 1;
                    if (e) ovf |= __builtin_mul_overflow(base, base, &base);
                }
                if (ovf) break;
                *out = jv_int(res);
                return 0;
            }
            if (fx == 0 && fy < 0) return jr_fail(r, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(fx, fy));
            if (isnan(out->f) && !isnan(fx) && !isnan(fy))
                return jr_fail(r, "a negative number raised to a fractional power is complex");
            return 0;
        }
        return jr_fail(r, "integer overflow in '%s' (the result does not fit in 64 bits)", names[op]);
    }
    if (op == JOP_ADD) {
        if (a.t == JV_STR && b.t == JV_STR) return concat_str(r, a.s, b.s, out);
        if ((a.t == JV_LIST || a.t == JV_TUPLE) && a.t == b.t) {
            struct jlist *l = jv_list_new(r, a.l->n + b.l->n);
            if (!l) return MS_EINVAL;
            if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof *l->v);
            if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof *l->v);
            *out = jv_undef();
            out->t = a.t;
            out->l = l;
            return 0;
        }
        if (a.t == JV_STR)
            return jr_fail(r, "can only concatenate str (not \"%s\") to str", jv_type_name(b.t));
    }
    if (op == JOP_MUL) {
        if ((a.t == JV_STR || a.t == JV_LIST || a.t == JV_TUPLE) && (b.t == JV_INT || b.t == JV_BOOL))
            return repeat(r, a, as_int(b), out);
        if ((b.t == JV_STR || b.t == JV_LIST || b.t == JV_TUPLE) && (a.t == JV_INT || a.t == JV_BOOL))
            return repeat(r, b, as_int(a), out);
    }
    if (op == JOP_MOD && a.t == JV_STR) return jb_percent_format(r, a.s, b, out);
    return jr_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'", names[op],
                   jv_type_name(a.t), jv_type_name(b.t));
}

static int contains(struct jrender *r, struct jv needle, struct jv hay, bool *res)
{
    *res = false;
    switch (hay.t) {
    case JV_STR:
        if (needle.t == JV_UNDEF) return jv_undef_fail(r, needle);
        if (needle.t != JV_STR)
            return jr_fail(r, "'in <string>' requires string as left operand, not %s",
                           jv_type_name(needle.t));
        *res = needle.s.n == 0 || memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
        return 0;
    case JV_LIST:
    case JV_TUPLE:
        for (size_t i = 0; i < hay.l->n; i++) {
            int rc = jv_equal(r, needle, hay.l->v[i], res, 0);
            if (rc || *res) return rc;
        }
        return 0;
    case JV_DICT:
        *res = jv_dict_get(r, hay.d, needle) != NULL;
        return 0;
    case JV_UNDEF:
        return 0; // iterating an undefined value yields nothing
    default:
        return jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(hay.t));
    }
}

static int compare_op(struct jrender *r, int op, struct jv a, struct jv b, bool *res)
{
    if (op == JCMP_IN || op == JCMP_NOTIN) {
        int rc = contains(r, a, b, res);
        if (op == JCMP_NOTIN) *res = !*res;
        return rc;
    }
    if (op == JOP_EQ || op == JOP_NE) {
        int rc = jv_equal(r, a, b, res, 0);
        if (op == JOP_NE) *res = !*res;
        return rc;
    }
    int cmp;
    int rc = jv_compare(r, a, b, &cmp, jinja_op_text(op));
    if (rc) return rc;
    *res = op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
    return 0;
}

// ---- expressions ----------------------------------------------------------------------------
static int apply_filter(struct jrender *r, struct jframe *f, const struct jnode *n,
                        struct jv operand, struct jv *out)
{
    struct jcallargs a;
    int rc = eval_args(r, f, &n->args, &a);
    if (rc) return rc;
    r->line = n->line;
    return jb_filter(r, n->s, operand, &a, out);
}

// A filter chain whose innermost operand is a given value (set / filter blocks).
static int apply_chain(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv v,
                       struct jv *out)
{
    if (!n) {
        *out = v;
        return 0;
    }
    struct jv inner;
    int rc = apply_chain(r, f, n->a, v, &inner);
    if (rc) return rc;
    return apply_filter(r, f, n, inner, out);
}

static int eval_seq(struct jrender *r, struct jframe *f, const struct jnode *n, int type,
                    struct jv *out)
{
    struct jlist *l = jv_list_new(r, n->nitems);
    if (!l) return MS_EINVAL;
    for (size_t i = 0; i < n->nitems; i++) {
        int rc = eval(r, f, n->items[i], &l->v[i]);
        if (rc) return rc;
    }
    *out = jv_undef();
    out->t = (uint8_t)type;
    out->l = l;
    return 0;
}

// The stack a render may use. The parser bounds how deep one expression or
// block nests (JINJA_MAX_PARSE_DEPTH), and max_call_depth bounds macro
// calls, but their product, with an evaluator's frames per level, can pass
// a thread's stack (a fuzzed template recursing 64 deep through a long
// chain did, under ASan). So the evaluator also watches the stack itself:
// at most JINJA_MAX_STACK_BYTES below the render's first frame, and never
// within JINJA_STACK_MARGIN of the calling thread's stack's end (room for
// the libc calls an error makes at the deepest point).
#define JINJA_MAX_STACK_BYTES ((uintptr_t)4 << 20)
#define JINJA_STACK_MARGIN ((uintptr_t)128 << 10)

static uintptr_t stack_floor(void)
{
    const uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    uintptr_t floor = here > JINJA_MAX_STACK_BYTES ? here - JINJA_MAX_STACK_BYTES : 0;
    // This thread's stack, once per thread (for the main thread glibc reads
    // /proc/self/maps).
    static _Thread_local uintptr_t low;
    static _Thread_local bool known;
    if (!known) {
        pthread_attr_t a;
        void *addr;
        size_t size;
        if (pthread_getattr_np(pthread_self(), &a) == 0) {
            if (pthread_attr_getstack(&a, &addr, &size) == 0) low = (uintptr_t)addr + JINJA_STACK_MARGIN;
            pthread_attr_destroy(&a);
        }
        known = true;
    }
    return low > floor ? low : floor;
}

static int stack_deep(struct jrender *r)
{
    return jr_fail(r, "the template nests too deeply for the stack (expressions within macro "
                   "calls within macro calls, over the %zu KiB this render may use)",
                   (size_t)(r->stack_budget >> 10));
}

static int eval(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv *out)
{
    r->line = n->line;
    if ((uintptr_t)__builtin_frame_address(0) < r->stack_floor) return stack_deep(r);
    int rc;
    struct jv a, b;
    switch (n->kind) {
    case JN_E_CONST:
        *out = n->value;
        return 0;
    case JN_E_NAME:
        *out = lookup(r, f, n->s);
        return 0;
    case JN_E_LIST:
        return eval_seq(r, f, n, JV_LIST, out);
    case JN_E_TUPLE:
        return eval_seq(r, f, n, JV_TUPLE, out);
    case JN_E_DICT: {
        struct jdict *d = jv_dict_new(r, n->nitems);
        if (!d) return MS_EINVAL;
        for (size_t i = 0; i < n->nitems; i++) {
            if ((rc = eval(r, f, n->items[i], &a))) return rc;
            if ((rc = eval(r, f, n->items2[i], &b))) return rc;
            if ((rc = jv_dict_set(r, d, a, b))) return rc;
        }
        *out = jv_undef();
        out->t = JV_DICT;
        out->d = d;
        return 0;
    }
    case JN_E_GETATTR:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        r->line = n->line;
        return get_attr(r, a, n->s, out);
    case JN_E_GETITEM:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        if ((rc = eval(r, f, n->b, &b))) return rc;
        r->line = n->line;
        return get_item(r, a, b, out);
    case JN_E_SLICE:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        return do_slice(r, f, n, a, out);
    case JN_E_CALL: {
        if ((rc = eval(r, f, n->a, &a))) return rc;
        struct jcallargs args;
        if ((rc = eval_args(r, f, &n->args, &args))) return rc;
        r->line = n->line;
        return jinja_call_value(r, a, &args, out);
    }
    case JN_E_FILTER:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        return apply_filter(r, f, n, a, out);
    case JN_E_TEST: {
        if ((rc = eval(r, f, n->a, &a))) return rc;
        struct jcallargs args;
        if ((rc = eval_args(r, f, &n->args, &args))) return rc;
        bool res;
        r->line = n->line;
        if ((rc = jb_test(r, n->s, a, &args, &res))) return rc;
        *out = jv_bool(res);
        return 0;
    }
    case JN_E_NOT:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case JN_E_NEG:
    case JN_E_POS:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        r->line = n->line;
        if (a.t == JV_UNDEF) return jv_undef_fail(r, a);
        if (a.t == JV_FLOAT) {
            *out = jv_float(n->kind == JN_E_NEG ? -a.f : a.f);
            return 0;
        }
        if (a.t == JV_INT || a.t == JV_BOOL) {
            int64_t v = as_int(a);
            if (n->kind == JN_E_NEG && v == INT64_MIN) return jr_fail(r, "integer overflow in unary -");
            *out = jv_int(n->kind == JN_E_NEG ? -v : v);
            return 0;
        }
        return jr_fail(r, "bad operand type for unary %s: '%s'", n->kind == JN_E_NEG ? "-" : "+",
                       jv_type_name(a.t));
    case JN_E_BINARY:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        if ((rc = eval(r, f, n->b, &b))) return rc;
        r->line = n->line;
        return binary_op(r, n->op, a, b, out);
    case JN_E_AND:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        if (!jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(r, f, n->b, out);
    case JN_E_OR:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        if (jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(r, f, n->b, out);
    case JN_E_CONCAT: {
        struct ms_buf buf = jsb_new(r);
        for (size_t i = 0; i < n->nitems; i++) {
            if ((rc = eval(r, f, n->items[i], &a))) return rc;
            if ((rc = jv_to_str(r, a, &buf))) return rc;
        }
        *out = jsb_str(&buf);
        return 0;
    }
    case JN_E_COMPARE: {
        if ((rc = eval(r, f, n->a, &a))) return rc;
        bool res = true;
        for (size_t i = 0; i < n->nitems && res; i++) {
            if ((rc = eval(r, f, n->items[i], &b))) return rc;
            r->line = n->line;
            if ((rc = compare_op(r, n->ops[i], a, b, &res))) return rc;
            a = b;
        }
        *out = jv_bool(res);
        return 0;
    }
    case JN_E_COND:
        if ((rc = eval(r, f, n->a, &a))) return rc;
        if (jv_truthy(a)) return eval(r, f, n->b, out);
        if (n->c) return eval(r, f, n->c, out);
        *out = jv_undef_msg("the inline if-expression evaluated to false and has no else section");
        return 0;
    default:
        return jr_fail(r, "internal error: node kind %d is not an expression", n->kind);
    }
}

// ---- statements -----------------------------------------------------------------------------
static int bind_target(struct jrender *r, struct jframe *f, const struct jnode *t, struct jv v)
{
    if (t->kind == JN_E_NAME) return frame_set(r, f, t->s, v);
    // Tuple unpacking: the value must hold exactly as many items.
    if (v.t == JV_UNDEF) return jv_undef_fail(r, v);
    struct jlist *items;
    int rc = jv_iterate(r, v, &items);
    if (rc) {
        return jr_fail(r, "cannot unpack non-iterable %s object", jv_type_name(v.t));
    }
    if (items->n != t->nitems) {
        if (items->n > t->nitems)
            return jr_fail(r, "too many values to unpack (expected %zu)", t->nitems);
        return jr_fail(r, "not enough values to unpack (expected %zu, got %zu)", t->nitems,
                       items->n);
    }
    for (size_t i = 0; i < t->nitems; i++)
        if ((rc = bind_target(r, f, t->items[i], items->v[i]))) return rc;
    return 0;
}

static int exec_for(struct jrender *r, struct jframe *f, const struct jnode *n)
{
    if (n->flags & JF_RECURSIVE) return jr_fail(r, "recursive for loops are not supported");
    struct jv it;
    int rc = eval(r, f, n->a, &it);
    if (rc) return rc;
    r->line = n->line;
    struct jlist *items;
    if ((rc = jv_iterate(r, it, &items))) return rc;
    if (n->b) {
        // {% for x in xs if cond %}: the loop (and loop.length) sees only the kept items.
        struct jlist *kept = jv_list_new(r, items->n);
        if (!kept) return MS_EINVAL;
        kept->n = 0;
        struct jframe *tf = frame_new(r, f);
        if (!tf) return MS_EINVAL;
        for (size_t i = 0; i < items->n; i++) {
            if ((rc = jr_step(r, 1))) return rc;
            tf->n = 0;
            if ((rc = bind_target(r, tf, n->target, items->v[i]))) return rc;
            struct jv c;
            if ((rc = eval(r, tf, n->b, &c))) return rc;
            if (jv_truthy(c)) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    struct jloop *loop = jr_alloc(r, sizeof *loop);
    if (!loop) return MS_EINVAL;
    memset(loop, 0, sizeof *loop);
    loop->length = items->n;
    loop->items = items;
    struct jv lv = jv_undef();
    lv.t = JV_LOOP;
    lv.loop = loop;
    struct jframe *it_frame = NULL;
    for (size_t i = 0; i < items->n; i++) {
        if ((rc = jr_step(r, 1))) return rc;
        loop->index0 = i;
        // Each iteration starts with a fresh scope; reuse the last one unless captured.
        if (it_frame && !it_frame->captured) {
            it_frame->n = 0;
        } else {
            it_frame = frame_new(r, f);
            if (!it_frame) return MS_EINVAL;
        }
        if ((rc = frame_set(r, it_frame, (struct jstr){"loop", 4}, lv))) return rc;
        r->line = n->line;
        if ((rc = bind_target(r, it_frame, n->target, items->v[i]))) return rc;
        rc = exec_body(r, it_frame, n->body, n->nbody);
        if (rc < 0) return rc;
        if (rc == JC_BREAK) break;
    }
    if (items->n == 0 && n->nelse) {
        struct jframe *ef = frame_new(r, f);
        if (!ef) return MS_EINVAL;
        return exec_body(r, ef, n->else_body, n->nelse);
    }
    return 0;
}

static int exec_set(struct jrender *r, struct jframe *f, const struct jnode *t, struct jv v)
{
    if (t->kind == JN_E_GETATTR) {
        struct jv ns = lookup(r, f, t->a->s);
        r->line = t->line;
        if (ns.t != JV_NS) return jr_fail(r, "cannot assign attribute on non-namespace object");
        return jv_dict_set(r, ns.d, jv_str(t->s.p, t->s.n), v);
    }
    return bind_target(r, f, t, v);
}

static int exec_stmt(struct jrender *r, struct jframe *f, const struct jnode *n)
{
    r->line = n->line;
    if ((uintptr_t)__builtin_frame_address(0) < r->stack_floor) return stack_deep(r);
    int rc;
    struct jv v;
    switch (n->kind) {
    case JN_TEXT:
        return jsb_put(r, r->out, n->s.p, n->s.n);
    case JN_OUTPUT:
        if ((rc = eval(r, f, n->a, &v))) return rc;
        return jv_to_str(r, v, r->out);
    case JN_IF:
        if ((rc = eval(r, f, n->a, &v))) return rc;
        if (jv_truthy(v)) return exec_body(r, f, n->body, n->nbody);
        return exec_body(r, f, n->else_body, n->nelse);
    case JN_FOR:
        return exec_for(r, f, n);
    case JN_SET:
        if ((rc = eval(r, f, n->a, &v))) return rc;
        return exec_set(r, f, n->target, v);
    case JN_SET_BLOCK: {
        int flow = 0;
        if ((rc = capture(r, f, n->body, n->nbody, &v, &flow))) return rc;
        if ((rc = apply_chain(r, f, n->b, v, &v))) return rc;
        if ((rc = exec_set(r, f, n->target, v))) return rc;
        return flow;
    }
    case JN_FILTER_BLOCK: {
        int flow = 0;
        if ((rc = capture(r, f, n->body, n->nbody, &v, &flow))) return rc;
        if ((rc = apply_chain(r, f, n->b, v, &v))) return rc;
        if ((rc = jv_to_str(r, v, r->out))) return rc;
        return flow;
    }
    case JN_MACRO: {
        struct jmacro *m = jr_alloc(r, sizeof *m);
        if (!m) return MS_EINVAL;
        m->def = n;
        m->closure = f;
        f->captured = true;
        m->caller = jv_undef_name((struct jstr){"caller", 6});
        v = jv_undef();
        v.t = JV_MACRO;
        v.m = m;
        return frame_set(r, f, n->s, v);
    }
    case JN_CALL_BLOCK: {
        const struct jnode *call = n->a;
        struct jv callee;
        if ((rc = eval(r, f, call->a, &callee))) return rc;
        struct jcallargs args;
        if ((rc = eval_args(r, f, &call->args, &args))) return rc;
        r->line = n->line;
        if (callee.t != JV_MACRO) {
            if (callee.t == JV_UNDEF) return jv_undef_fail(r, callee);
            return jr_fail(r, "{%% call %%} needs a macro, not %s", jv_type_name(callee.t));
        }
        struct jmacro *caller = jr_alloc(r, sizeof *caller), *m = jr_alloc(r, sizeof *m);
        if (!caller || !m) return MS_EINVAL;
        caller->def = n;
        caller->closure = f;
        f->captured = true;
        caller->caller = jv_undef_name((struct jstr){"caller", 6});
        *m = *callee.m;
        m->caller = jv_undef();
        m->caller.t = JV_MACRO;
        m->caller.m = caller;
        if ((rc = call_macro(r, m, &args, &v))) return rc;
        return jsb_put(r, r->out, v.s.p, v.s.n);
    }
    case JN_WITH: {
        struct jframe *wf = frame_new(r, f);
        if (!wf) return MS_EINVAL;
        for (size_t i = 0; i < n->params.n; i++) {
            if ((rc = eval(r, f, n->params.defaults[i], &v))) return rc;
            if ((rc = frame_set(r, wf, n->params.names[i], v))) return rc;
        }
        return exec_body(r, wf, n->body, n->nbody);
    }
    case JN_BODY:
        return exec_body(r, f, n->body, n->nbody);
    case JN_BREAK:
        return JC_BREAK;
    case JN_CONTINUE:
        return JC_CONTINUE;
    default:
        return jr_fail(r, "internal error: node kind %d is not a statement", n->kind);
    }
}

static int exec_body(struct jrender *r, struct jframe *f, struct jnode *const *body, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = exec_stmt(r, f, body[i]);
        if (rc) return rc;
    }
    return 0;
}

// ---- entry points ---------------------------------------------------------------------------
int jinja_parse(const char *src, size_t len, struct jinja_template **out, char *err, size_t errlen)
{
    *out = NULL;
    // Reject bytes that are not UTF-8: the template is text, as in Python.
    uint32_t line = 1;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)src + i,
                                              (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0)
            return ms_err(err, errlen, MS_EINVAL, "line %u: the template is not valid UTF-8 (byte offset %zu)",
                          line, i);
        if (cp == '\n') line++;
        i += (size_t)k;
    }
    struct jinja_template *t = calloc(1, sizeof *t);
    if (!t) return ms_err(err, errlen, MS_ENOMEM, "out of memory parsing the chat template");
    t->arena = arena_create(64 * 1024);
    char *norm = t->arena ? arena_alloc(t->arena, len + 1) : NULL;
    if (!norm) {
        jinja_destroy(t);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory parsing the chat template");
    }
    // Jinja turns \r\n and \r into \n and drops one trailing newline (keep_trailing_newline=False).
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    struct jtoken *toks;
    size_t ntoks;
    int rc = jinja_lex(t->arena, norm, n, &toks, &ntoks, err, errlen);
    if (!rc) rc = jinja_parse_tokens(t->arena, toks, ntoks, &t->body, &t->nbody, err, errlen);
    if (rc == MS_ENOMEM) ms_err(err, errlen, MS_ENOMEM, "out of memory parsing the chat template");
    if (rc) {
        jinja_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void jinja_destroy(struct jinja_template *t)
{
    if (!t) return;
    arena_destroy(t->arena);
    free(t);
}

int jinja_render(const struct jinja_template *t, const struct jinja_var *vars, size_t nvars,
                 const struct jinja_limits *lim, char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    struct jrender r = {.err = err, .errlen = errlen, .line = 1, .stack_floor = stack_floor()};
    const uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    r.stack_budget = here > r.stack_floor ? here - r.stack_floor : 0;
    if (lim) r.lim = *lim;
    else jinja_limits_default(&r.lim);
    r.a = arena_create(64 * 1024);
    if (!r.a) return ms_err(err, errlen, MS_ENOMEM, "out of memory rendering the chat template");
    int rc = 0;
    struct ms_buf buf = jsb_new(&r);
    r.out = &buf;
    r.root = frame_new(&r, NULL);
    if (!r.root) rc = MS_EINVAL;
    for (size_t i = 0; !rc && i < nvars; i++) {
        struct jstr name = {vars[i].name, strlen(vars[i].name)};
        if (!vars[i].value) {
            frame_unset(r.root, name);
            continue;
        }
        struct jv v;
        rc = jv_from_json(&r, vars[i].value, &v, 0);
        if (!rc) rc = frame_set(&r, r.root, name, v);
    }
    if (!rc) rc = exec_body(&r, r.root, t->body, t->nbody);
    if (rc > 0) rc = 0; // break/continue cannot leave a loop (the parser checks), but be safe
    if (!rc) {
        *out = malloc(buf.len + 1);
        if (!*out) {
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory rendering the chat template");
        } else {
            if (buf.len) memcpy(*out, buf.data, buf.len);
            (*out)[buf.len] = 0;
            *len = buf.len;
        }
    }
    arena_destroy(r.a);
    return rc;
}
