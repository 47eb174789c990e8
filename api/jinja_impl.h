// jinja_impl: the types the Jinja lexer, parser, evaluator and builtins share
// (tokens, the AST, runtime values, the render context). Private to api/jinja*.c.
#ifndef MOESERVE_API_JINJA_IMPL_H
#define MOESERVE_API_JINJA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api/jinja.h"
#include "base/arena.h"
#include "base/buf.h"
#include "base/utf8.h"

// Nesting of statements plus expressions the parser accepts; it bounds the
// evaluator's C recursion for any template.
#define JINJA_MAX_PARSE_DEPTH 200
// Nesting of values that printing, tojson and comparison walk (Python would
// raise RecursionError on such data as well).
#define JINJA_MAX_VALUE_DEPTH 1000
// Python's sandbox refuses larger ranges.
#define JINJA_MAX_RANGE 100000

struct jstr {
    const char *p;
    size_t n;
};

// ---- tokens -----------------------------------------------------------------
enum jtok_type {
    JT_EOF,
    JT_DATA,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP,
};

enum jop {
    JOP_NONE,
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_TILDE,
    JOP_LBRACKET, JOP_RBRACKET, JOP_LPAREN, JOP_RPAREN, JOP_LBRACE, JOP_RBRACE,
    JOP_EQ, JOP_NE, JOP_GT, JOP_GE, JOP_LT, JOP_LE,
    JOP_ASSIGN, JOP_DOT, JOP_COLON, JOP_PIPE, JOP_COMMA, JOP_SEMICOLON,
};

struct jtoken {
    uint8_t type; // enum jtok_type
    uint8_t op;   // enum jop for JT_OP
    uint32_t line;
    struct jstr s; // name, data or decoded string
    int64_t ival;
    double fval;
};

// Tokenizes normalized source (newlines already \n). Tokens and decoded
// strings live in arena a. Returns 0 or MS_EINVAL/MS_ENOMEM with err filled.
int jinja_lex(struct arena *a, const char *src, size_t len, struct jtoken **out, size_t *n,
              char *err, size_t errlen);
const char *jinja_op_text(int op);

// ---- runtime values ------------------------------------------------------------
enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_TUPLE,
    JV_DICT,
    JV_NS,    // namespace(): a mutable dict with attribute access
    JV_FUNC,  // builtin function or bound method
    JV_MACRO, // macro or caller
    JV_LOOP,  // the `loop` of a for
};

// How an undefined value came to be, for the error when it is used.
enum jv_undef_kind {
    JU_NAME,    // 'x' is undefined
    JU_ATTR,    // 'dict object' has no attribute 'x'
    JU_ITEM,    // 'list object' has no element 3
    JU_MESSAGE, // a fixed sentence in s
};

struct jlist;
struct jdict;
struct jfunc;
struct jmacro;
struct jloop;

struct jv {
    uint8_t t;      // enum jv_type
    uint8_t ukind;  // enum jv_undef_kind for JV_UNDEF
    uint8_t uobj;   // enum jv_type of the object an attribute was missing on
    uint8_t pad;
    int32_t uitem;  // the missing index for JU_ITEM
    union {
        bool b;
        int64_t i;
        double f;
        struct jstr s; // JV_STR; the missing name (or message) for JV_UNDEF
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
        struct jmacro *m;
        struct jloop *loop;
    };
};

struct jlist {
    size_t n;
    struct jv *v;
};

struct jdict {
    size_t n, cap;
    struct jv *keys;
    struct jv *vals;
    uint32_t *index;  // open-addressing hash of entry+1 (0 = empty), built on demand
    size_t index_cap; // 0 when there is no index
};

struct jrender;
struct jb_row;
struct jcallargs {
    size_t npos;
    struct jv *pos;
    size_t nkw;
    struct jstr *kwn;
    struct jv *kwv;
};

typedef int (*jfn_t)(struct jrender *r, const struct jfunc *f, struct jcallargs *a,
                     struct jv *out);

struct jfunc {
    const char *name;
    jfn_t fn;
    struct jv self;
    const struct jb_row *row; // the builtin's row in jinja_builtins.c's table
};

struct jnode;
struct jframe;

struct jmacro {
    const struct jnode *def; // JN_MACRO, or JN_CALL_BLOCK for a caller
    struct jframe *closure;
    struct jv caller;        // what `caller` is inside the body (undefined if none)
};

struct jloop {
    size_t index0, length;
    struct jlist *items;
    struct jv last_changed;
    bool changed_seen;
};

// ---- the AST ---------------------------------------------------------------------
enum jnode_kind {
    // statements
    JN_TEXT,        // s
    JN_OUTPUT,      // a
    JN_IF,          // a = test, body, else_body
    JN_FOR,         // target, a = iterable, b = filter test or NULL, body, else_body
    JN_SET,         // target, a = value
    JN_SET_BLOCK,   // target, filters (chain of JN_E_FILTER with NULL operand) in b, body
    JN_MACRO,       // s = name, params, body
    JN_CALL_BLOCK,  // a = call expression, params (of caller), body
    JN_FILTER_BLOCK,// b = filter chain, body
    JN_WITH,        // params (names + values), body
    JN_BREAK,
    JN_CONTINUE,
    JN_BODY,        // body (generation blocks)
    // expressions
    JN_E_CONST,     // value
    JN_E_NAME,      // s
    JN_E_LIST,      // items
    JN_E_TUPLE,     // items
    JN_E_DICT,      // items = keys, items2 = values
    JN_E_GETATTR,   // a = object, s = name
    JN_E_GETITEM,   // a = object, b = key
    JN_E_SLICE,     // a = object, items[3] = start/stop/step (NULL = omitted)
    JN_E_CALL,      // a = callee, args
    JN_E_FILTER,    // a = operand (NULL in a filter chain), s = name, args
    JN_E_TEST,      // a = operand, s = name, args
    JN_E_NOT,       // a
    JN_E_NEG,       // a
    JN_E_POS,       // a
    JN_E_BINARY,    // op, a, b  (JOP_ADD ... JOP_POW)
    JN_E_AND,       // a, b
    JN_E_OR,        // a, b
    JN_E_CONCAT,    // items
    JN_E_COMPARE,   // a = first, items = operands, ops
    JN_E_COND,      // a = test, b = then, c = else (NULL: undefined)
    JN_E_IN,        // a in b (compare helper node, negated through JN_E_NOT)
};

struct jargs_ast {
    size_t npos;
    struct jnode **pos;
    size_t nkw;
    struct jstr *kwn;
    struct jnode **kwv;
    struct jnode *dyn_args;   // *args
    struct jnode *dyn_kwargs; // **kwargs
};

// Macro / caller parameters, and `with` assignments.
struct jparams {
    size_t n;
    struct jstr *names;
    struct jnode **defaults; // NULL entries: no default
};

struct jnode {
    uint16_t kind;
    uint8_t op;
    uint8_t flags; // JF_* below
    uint32_t line;
    struct jstr s;
    struct jnode *a, *b, *c;
    struct jnode *target;
    size_t nitems;
    struct jnode **items;
    struct jnode **items2;
    uint8_t *ops;           // JN_E_COMPARE operators (JOP_EQ.. or JOP_NONE+100 for in, +101 not in)
    struct jargs_ast args;
    struct jparams params;
    size_t nbody, nelse;
    struct jnode **body;
    struct jnode **else_body;
    struct jv value;        // JN_E_CONST
};

// JN_MACRO / JN_CALL_BLOCK: which special names the body reads.
#define JF_USES_VARARGS 1
#define JF_USES_KWARGS 2
#define JF_USES_CALLER 4
// JN_FOR with the `recursive` modifier
#define JF_RECURSIVE 8

#define JCMP_IN 200
#define JCMP_NOTIN 201

int jinja_parse_tokens(struct arena *a, const struct jtoken *toks, size_t ntoks,
                       struct jnode ***body, size_t *nbody, char *err, size_t errlen);

struct jinja_template {
    struct arena *arena; // source copy, tokens, AST
    struct jnode **body;
    size_t nbody;
};

// ---- rendering ---------------------------------------------------------------------

struct jvar {
    struct jstr name;
    struct jv value;
};

struct jframe {
    struct jframe *parent;
    size_t n, cap;
    struct jvar *vars;
    bool captured; // a macro or caller closes over it: it must outlive its iteration
};

struct jrender {
    struct arena *a;
    struct jinja_limits lim;
    char *err;
    size_t errlen;
    uint32_t line;    // line of the node being evaluated, for errors
    uint64_t steps;
    int call_depth;
    uintptr_t stack_floor; // the lowest frame address eval may reach (stack_deep)
    uintptr_t stack_budget; // bytes from the render's frame down to it, for the refusal
    bool raised;      // err holds a raise_exception message
    struct jframe *root;
    struct ms_buf *out; // where output goes now (captures push their own)
    struct ms_buf_alloc buf_alloc; // every buffer's memory: the arena, within the memory limit
};

// Control flow out of statement execution, next to the negative MS_* errors.
#define JC_BREAK 1
#define JC_CONTINUE 2

// Allocation within the render's memory limit. NULL after setting the error.
void *jr_alloc(struct jrender *r, size_t n);
int jr_fail(struct jrender *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jr_nomem(struct jrender *r);
int jr_step(struct jrender *r, uint64_t n);

// Text buffers of a render: base/buf.h buffers whose memory comes from the
// render's arena and whose length is capped at max_output_bytes. Make each
// with jsb_new; append through jsb_*, which turn a refusal into the render's
// error sentence; jsb_str is the text as a string value (no copy).
struct ms_buf jsb_new(struct jrender *r);
int jsb_put(struct jrender *r, struct ms_buf *b, const char *p, size_t n);
int jsb_putc(struct jrender *r, struct ms_buf *b, char c);
int jsb_printf(struct jrender *r, struct ms_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Value constructors and helpers (jinja_value.c).
static inline struct jv jv_undef(void) { struct jv v = {0}; v.t = JV_UNDEF; return v; }
static inline struct jv jv_none(void) { struct jv v = {0}; v.t = JV_NONE; return v; }
static inline struct jv jv_bool(bool b) { struct jv v = {0}; v.t = JV_BOOL; v.b = b; return v; }
static inline struct jv jv_int(int64_t i) { struct jv v = {0}; v.t = JV_INT; v.i = i; return v; }
static inline struct jv jv_float(double f) { struct jv v = {0}; v.t = JV_FLOAT; v.f = f; return v; }
static inline struct jv jv_str(const char *p, size_t n)
{
    struct jv v = {0};
    v.t = JV_STR;
    v.s.p = p;
    v.s.n = n;
    return v;
}
static inline struct jv jsb_str(const struct ms_buf *b)
{
    return jv_str(b->data ? b->data : "", b->len);
}
struct jv jv_undef_name(struct jstr name);
struct jv jv_undef_attr(int objtype, struct jstr name);
struct jv jv_undef_msg(const char *msg);

struct jlist *jv_list_new(struct jrender *r, size_t n);
struct jdict *jv_dict_new(struct jrender *r, size_t cap);
int jv_dict_set(struct jrender *r, struct jdict *d, struct jv key, struct jv val);
// Lookup by string key; NULL when absent.
const struct jv *jv_dict_get_str(struct jrender *r, struct jdict *d, const char *k, size_t n);
const struct jv *jv_dict_get(struct jrender *r, struct jdict *d, struct jv key);

int jv_from_json(struct jrender *r, const json_t *j, struct jv *out, int depth);

const char *jv_type_name(int t);
bool jv_truthy(struct jv v);
bool jv_is_number(struct jv v); // bool, int, float
double jv_num(struct jv v);
int jv_equal(struct jrender *r, struct jv a, struct jv b, bool *eq, int depth);
// Sets *cmp to <0, 0, >0; fails with Python's TypeError for unordered types.
int jv_compare(struct jrender *r, struct jv a, struct jv b, int *cmp, const char *opname);
// Fails with the undefined value's error sentence.
int jv_undef_fail(struct jrender *r, struct jv v);

// str(v) and repr(v) as Python prints them.
int jv_to_str(struct jrender *r, struct jv v, struct ms_buf *b);
int jv_to_repr(struct jrender *r, struct jv v, struct ms_buf *b, int depth);
// str(v) as a value (no copy for strings).
int jv_stringify(struct jrender *r, struct jv v, struct jstr *out);

struct jjson_opts {
    bool ensure_ascii;
    bool sort_keys;
    bool has_indent;
    struct jstr indent;
    struct jstr item_sep, key_sep;
};
int jv_to_json(struct jrender *r, struct jv v, const struct jjson_opts *o, struct ms_buf *b,
               int depth);

// Iterate: list/tuple items, dict keys, string characters, nothing for
// undefined; a TypeError for the rest.
int jv_iterate(struct jrender *r, struct jv v, struct jlist **out);

// UTF-8 helpers.
// The shared codec (base/utf8.h) over the engine's char strings; invalid
// bytes decode as U+FFFD, one byte at a time. n == 0 decodes nothing.
static inline size_t ju_decode(const char *p, size_t n, uint32_t *cp)
{
    if (!n) {
        *cp = 0;
        return 0;
    }
    return utf8_decode((const uint8_t *)p, n, cp);
}
static inline size_t ju_encode(uint32_t cp, char out[4])
{
    return utf8_encode(cp, (uint8_t *)out);
}
bool ju_is_ascii(const char *p, size_t n);
bool ju_is_space(uint32_t cp); // Python str.isspace
size_t ju_count(const char *p, size_t n); // code points

// Builtins (jinja_builtins.c): filters, tests, methods and globals, all
// found in one table that also answers which names exist. A call's
// arguments are checked against its row before the builtin runs.
int jb_filter(struct jrender *r, struct jstr name, struct jv operand, struct jcallargs *a,
              struct jv *out);
int jb_test(struct jrender *r, struct jstr name, struct jv operand, struct jcallargs *a,
            bool *out);
bool jb_has_filter(struct jstr name);
bool jb_has_test(struct jstr name);
// A global function (range, namespace, dict, raise_exception, strftime_now...).
bool jb_global(struct jrender *r, struct jstr name, struct jv *out);
// obj.name for the types with methods (str, dict, list, tuple); false when
// the type has no such attribute.
bool jb_method(struct jrender *r, struct jv obj, struct jstr name, struct jv *out, int *rc);
int jb_loop_attr(struct jrender *r, struct jv loop, struct jstr name, struct jv *out);
// str % args, as Python formats it (the format filter too).
int jb_percent_format(struct jrender *r, struct jstr fmt, struct jv args, struct jv *out);

// The table, for the tests that walk it: entry i's kind, name and, for
// methods and attributes, the value types (1 << JV_*) that have it. False
// past the end.
enum jb_kind {
    JB_FILTER,
    JB_TEST,
    JB_METHOD, // obj.name(...): a function bound to obj
    JB_GLOBAL,
    JB_ATTR,   // obj.name computed from obj (loop.index)
};
bool jb_entry(size_t i, int *kind, const char **name, unsigned *receivers);

// Calls any callable value (evaluator: macros; builtins: functions).
int jinja_call_value(struct jrender *r, struct jv fn, struct jcallargs *a, struct jv *out);

static inline bool jstr_eq(struct jstr a, const char *b)
{
    // Without strlen: a mismatch (or b's NUL) stops the walk at once; a NUL
    // inside a must not walk past b's end.
    for (size_t i = 0; i < a.n; i++)
        if (a.p[i] != b[i] || !b[i]) return false;
    return b[a.n] == 0;
}

#endif
