// jinja_parse: builds the AST from tokens with Jinja2's grammar and operator
// precedence (condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** <
// unary < postfix and filters/tests). Errors name the line and what was expected.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/jinja_impl.h"
#include "base/base.h"

struct open_block {
    const char *name;
    uint32_t line;
};

struct parser {
    struct arena *a;
    const struct jtoken *t;
    size_t n, pos;
    char *err;
    size_t errlen;
    int depth;
    int loop_depth;
    struct open_block blocks[JINJA_MAX_PARSE_DEPTH];
    int nblocks;
};

// A growable array of node pointers in the arena.
struct nodevec {
    struct jnode **v;
    size_t n, cap;
};

static const struct jtoken *cur(struct parser *P) { return &P->t[P->pos]; }
static const struct jtoken *peek(struct parser *P, size_t k)
{
    size_t i = P->pos + k;
    return i < P->n ? &P->t[i] : &P->t[P->n - 1];
}
static void advance(struct parser *P)
{
    if (P->pos + 1 < P->n) P->pos++;
}

static void describe(const struct jtoken *t, char *buf, size_t len)
{
    switch (t->type) {
    case JT_EOF: snprintf(buf, len, "end of template"); break;
    case JT_DATA: snprintf(buf, len, "template data"); break;
    case JT_VAR_BEGIN: snprintf(buf, len, "begin of print statement"); break;
    case JT_VAR_END: snprintf(buf, len, "end of print statement"); break;
    case JT_BLOCK_BEGIN: snprintf(buf, len, "begin of statement block"); break;
    case JT_BLOCK_END: snprintf(buf, len, "end of statement block"); break;
    case JT_NAME: snprintf(buf, len, "'%.*s'", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p); break;
    case JT_STRING: snprintf(buf, len, "a string"); break;
    case JT_INT: snprintf(buf, len, "integer %lld", (long long)t->ival); break;
    case JT_FLOAT: snprintf(buf, len, "a float"); break;
    case JT_OP: snprintf(buf, len, "'%s'", jinja_op_text(t->op)); break;
    default: snprintf(buf, len, "?");
    }
}

static int pfail(struct parser *P, uint32_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int pfail(struct parser *P, uint32_t line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ms_err(P->err, P->errlen, MS_EINVAL, "line %u: %s", line, msg);
}

static int fail_expected(struct parser *P, const char *what)
{
    char got[96];
    describe(cur(P), got, sizeof got);
    return pfail(P, cur(P)->line, "expected %s, got %s", what, got);
}

static bool is_op(struct parser *P, int op)
{
    return cur(P)->type == JT_OP && cur(P)->op == op;
}

static bool is_name(struct parser *P, const char *name)
{
    return cur(P)->type == JT_NAME && jstr_eq(cur(P)->s, name);
}

static bool tok_is_name(const struct jtoken *t, const char *name)
{
    return t->type == JT_NAME && jstr_eq(t->s, name);
}

static int expect_op(struct parser *P, int op)
{
    if (!is_op(P, op)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", jinja_op_text(op));
        return fail_expected(P, want);
    }
    advance(P);
    return 0;
}

static int expect_type(struct parser *P, int type, const char *what)
{
    if (cur(P)->type != type) return fail_expected(P, what);
    advance(P);
    return 0;
}

static struct jnode *new_node(struct parser *P, int kind, uint32_t line)
{
    struct jnode *n = arena_calloc(P->a, 1, sizeof *n);
    if (!n) return NULL;
    n->kind = (uint16_t)kind;
    n->line = line;
    return n;
}

static int vec_push(struct parser *P, struct nodevec *v, struct jnode *n)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = arena_alloc(P->a, cap * sizeof *nv);
        if (!nv) return MS_ENOMEM;
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
    return 0;
}

static int enter(struct parser *P)
{
    if (++P->depth > JINJA_MAX_PARSE_DEPTH)
        return pfail(P, cur(P)->line, "the template nests more than %d levels deep",
                     JINJA_MAX_PARSE_DEPTH);
    return 0;
}

// One more link of a chain the loops below build left-deep (a + b + c is
// (a + b) + c; x|f|g and a.b.c likewise): the evaluator recurses into the
// left operand, so each link counts as one level of nesting until the
// chain ends (*links of them, which the caller gives back).
static int chain_link(struct parser *P, int *links)
{
    (*links)++;
    return enter(P);
}

#define TRY(x)                 \
    do {                       \
        int rc_ = (x);         \
        if (rc_) return rc_;   \
    } while (0)
#define NEW(var, kind, line)                        \
    do {                                            \
        (var) = new_node(P, (kind), (line));        \
        if (!(var)) return MS_ENOMEM;               \
    } while (0)

static int parse_expression(struct parser *P, bool with_condexpr, struct jnode **out);
static int parse_tuple(struct parser *P, bool simplified, bool with_condexpr,
                       const char *extra_end, bool explicit_parens, struct jnode **out);
static int parse_unary(struct parser *P, bool with_filter, struct jnode **out);
static int parse_primary(struct parser *P, struct jnode **out);
static int parse_postfix(struct parser *P, struct jnode *node, struct jnode **out);
static int subparse(struct parser *P, const char *const *end_tags, struct jnode ***body,
                    size_t *nbody);

static int parse_call_args(struct parser *P, struct jargs_ast *args)
{
    TRY(expect_op(P, JOP_LPAREN));
    struct nodevec pos = {0}, kwv = {0};
    struct jstr *kwn = NULL;
    size_t nkwn = 0, capkwn = 0;
    bool require_comma = false;
    while (!is_op(P, JOP_RPAREN)) {
        if (require_comma) {
            TRY(expect_op(P, JOP_COMMA));
            if (is_op(P, JOP_RPAREN)) break;
        }
        uint32_t line = cur(P)->line;
        if (is_op(P, JOP_MUL)) {
            if (args->dyn_args || args->dyn_kwargs)
                return pfail(P, line, "invalid syntax for function call expression");
            advance(P);
            TRY(parse_expression(P, true, &args->dyn_args));
        } else if (is_op(P, JOP_POW)) {
            if (args->dyn_kwargs) return pfail(P, line, "invalid syntax for function call expression");
            advance(P);
            TRY(parse_expression(P, true, &args->dyn_kwargs));
        } else if (cur(P)->type == JT_NAME && peek(P, 1)->type == JT_OP &&
                   peek(P, 1)->op == JOP_ASSIGN) {
            if (args->dyn_kwargs) return pfail(P, line, "invalid syntax for function call expression");
            if (nkwn == capkwn) {
                size_t cap = capkwn ? capkwn * 2 : 4;
                struct jstr *nk = arena_alloc(P->a, cap * sizeof *nk);
                if (!nk) return MS_ENOMEM;
                if (nkwn) memcpy(nk, kwn, nkwn * sizeof *nk);
                kwn = nk;
                capkwn = cap;
            }
            kwn[nkwn++] = cur(P)->s;
            advance(P);
            advance(P);
            struct jnode *v;
            TRY(parse_expression(P, true, &v));
            TRY(vec_push(P, &kwv, v));
        } else {
            if (args->dyn_args || args->dyn_kwargs || nkwn)
                return pfail(P, line, "positional argument follows keyword argument");
            struct jnode *v;
            TRY(parse_expression(P, true, &v));
            TRY(vec_push(P, &pos, v));
        }
        require_comma = true;
    }
    TRY(expect_op(P, JOP_RPAREN));
    args->npos = pos.n;
    args->pos = pos.v;
    args->nkw = nkwn;
    args->kwn = kwn;
    args->kwv = kwv.v;
    return 0;
}

static int parse_dotted_name(struct parser *P, struct jstr *name)
{
    if (cur(P)->type != JT_NAME) return fail_expected(P, "a name");
    *name = cur(P)->s;
    advance(P);
    while (is_op(P, JOP_DOT)) {
        advance(P);
        if (cur(P)->type != JT_NAME) return fail_expected(P, "a name");
        // Dotted filter names are kept as one string.
        size_t n = name->n + 1 + cur(P)->s.n;
        char *s = arena_alloc(P->a, n + 1);
        if (!s) return MS_ENOMEM;
        memcpy(s, name->p, name->n);
        s[name->n] = '.';
        memcpy(s + name->n + 1, cur(P)->s.p, cur(P)->s.n);
        s[n] = 0;
        name->p = s;
        name->n = n;
        advance(P);
    }
    return 0;
}

// One filter (after `|`, or the first of a filter block / set block).
static int parse_filter_one(struct parser *P, struct jnode *operand, struct jnode **out)
{
    struct jnode *f;
    NEW(f, JN_E_FILTER, cur(P)->line);
    f->a = operand;
    TRY(parse_dotted_name(P, &f->s));
    if (is_op(P, JOP_LPAREN)) TRY(parse_call_args(P, &f->args));
    *out = f;
    return 0;
}

static int parse_test(struct parser *P, struct jnode *operand, struct jnode **out)
{
    uint32_t line = cur(P)->line;
    advance(P); // is
    bool negated = false;
    if (is_name(P, "not")) {
        advance(P);
        negated = true;
    }
    struct jnode *t;
    NEW(t, JN_E_TEST, line);
    t->a = operand;
    TRY(parse_dotted_name(P, &t->s));
    const struct jtoken *c = cur(P);
    if (is_op(P, JOP_LPAREN)) {
        TRY(parse_call_args(P, &t->args));
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT ||
                c->type == JT_FLOAT ||
                (c->type == JT_OP && (c->op == JOP_LBRACKET || c->op == JOP_LBRACE))) &&
               !tok_is_name(c, "else") && !tok_is_name(c, "or") && !tok_is_name(c, "and")) {
        // `x is divisibleby 3`: one argument without parentheses.
        if (tok_is_name(c, "is")) return pfail(P, c->line, "you cannot chain multiple tests with 'is'");
        struct jnode *arg;
        TRY(parse_primary(P, &arg));
        TRY(parse_postfix(P, arg, &arg));
        t->args.pos = arena_alloc(P->a, sizeof *t->args.pos);
        if (!t->args.pos) return MS_ENOMEM;
        t->args.pos[0] = arg;
        t->args.npos = 1;
    }
    if (negated) {
        struct jnode *n;
        NEW(n, JN_E_NOT, line);
        n->a = t;
        t = n;
    }
    *out = t;
    return 0;
}

static int parse_subscripted(struct parser *P, struct jnode **out)
{
    // [a], [a:b], [a:b:c], [::c] ...
    uint32_t line = cur(P)->line;
    struct jnode *parts[3] = {NULL, NULL, NULL};
    if (is_op(P, JOP_COLON)) {
        advance(P);
    } else {
        struct jnode *e;
        TRY(parse_expression(P, true, &e));
        if (!is_op(P, JOP_COLON)) {
            *out = e;
            return 0;
        }
        advance(P);
        parts[0] = e;
    }
    if (!is_op(P, JOP_COLON) && !is_op(P, JOP_RBRACKET) && !is_op(P, JOP_COMMA))
        TRY(parse_expression(P, true, &parts[1]));
    if (is_op(P, JOP_COLON)) {
        advance(P);
        if (!is_op(P, JOP_RBRACKET) && !is_op(P, JOP_COMMA)) TRY(parse_expression(P, true, &parts[2]));
    }
    struct jnode *s;
    NEW(s, JN_E_SLICE, line);
    s->items = arena_alloc(P->a, 3 * sizeof *s->items);
    if (!s->items) return MS_ENOMEM;
    memcpy(s->items, parts, sizeof parts);
    s->nitems = 3;
    *out = s;
    return 0;
}

static int parse_subscript(struct parser *P, struct jnode *node, struct jnode **out)
{
    uint32_t line = cur(P)->line;
    if (is_op(P, JOP_DOT)) {
        advance(P);
        const struct jtoken *t = cur(P);
        if (t->type == JT_NAME) {
            struct jnode *g;
            NEW(g, JN_E_GETATTR, line);
            g->a = node;
            g->s = t->s;
            advance(P);
            *out = g;
            return 0;
        }
        if (t->type != JT_INT) return fail_expected(P, "a name or number after '.'");
        struct jnode *k, *g;
        NEW(k, JN_E_CONST, line);
        k->value = jv_int(t->ival);
        NEW(g, JN_E_GETITEM, line);
        g->a = node;
        g->b = k;
        advance(P);
        *out = g;
        return 0;
    }
    TRY(expect_op(P, JOP_LBRACKET));
    struct jnode *arg;
    TRY(parse_subscripted(P, &arg));
    if (is_op(P, JOP_COMMA))
        return pfail(P, cur(P)->line, "subscripts with several indexes (x[a, b]) are not supported");
    TRY(expect_op(P, JOP_RBRACKET));
    if (arg->kind == JN_E_SLICE) {
        arg->a = node;
        *out = arg;
        return 0;
    }
    struct jnode *g;
    NEW(g, JN_E_GETITEM, line);
    g->a = node;
    g->b = arg;
    *out = g;
    return 0;
}

static int parse_call(struct parser *P, struct jnode *callee, struct jnode **out)
{
    struct jnode *c;
    NEW(c, JN_E_CALL, cur(P)->line);
    c->a = callee;
    TRY(parse_call_args(P, &c->args));
    *out = c;
    return 0;
}

static int parse_postfix(struct parser *P, struct jnode *node, struct jnode **out)
{
    int links = 0;
    while (is_op(P, JOP_DOT) || is_op(P, JOP_LBRACKET) || is_op(P, JOP_LPAREN)) {
        TRY(chain_link(P, &links));
        if (is_op(P, JOP_LPAREN)) TRY(parse_call(P, node, &node));
        else TRY(parse_subscript(P, node, &node));
    }
    P->depth -= links;
    *out = node;
    return 0;
}

static int parse_filter_expr(struct parser *P, struct jnode *node, struct jnode **out)
{
    int links = 0;
    while (is_op(P, JOP_PIPE) || is_name(P, "is") || is_op(P, JOP_LPAREN)) {
        TRY(chain_link(P, &links));
        if (is_op(P, JOP_PIPE)) {
            advance(P);
            TRY(parse_filter_one(P, node, &node));
        } else if (is_name(P, "is")) {
            TRY(parse_test(P, node, &node));
        } else {
            TRY(parse_call(P, node, &node));
        }
    }
    P->depth -= links;
    *out = node;
    return 0;
}

static int parse_list_or_dict(struct parser *P, bool is_dict, struct jnode **out)
{
    uint32_t line = cur(P)->line;
    advance(P);
    struct nodevec keys = {0}, vals = {0};
    int close = is_dict ? JOP_RBRACE : JOP_RBRACKET;
    while (!is_op(P, close)) {
        if (keys.n) TRY(expect_op(P, JOP_COMMA));
        if (is_op(P, close)) break;
        struct jnode *k;
        TRY(parse_expression(P, true, &k));
        TRY(vec_push(P, &keys, k));
        if (is_dict) {
            TRY(expect_op(P, JOP_COLON));
            struct jnode *v;
            TRY(parse_expression(P, true, &v));
            TRY(vec_push(P, &vals, v));
        }
    }
    TRY(expect_op(P, close));
    struct jnode *n;
    NEW(n, is_dict ? JN_E_DICT : JN_E_LIST, line);
    n->nitems = keys.n;
    n->items = keys.v;
    n->items2 = vals.v;
    *out = n;
    return 0;
}

static int parse_primary(struct parser *P, struct jnode **out)
{
    const struct jtoken *t = cur(P);
    struct jnode *n;
    switch (t->type) {
    case JT_NAME:
        if (jstr_eq(t->s, "true") || jstr_eq(t->s, "True") || jstr_eq(t->s, "false") ||
            jstr_eq(t->s, "False")) {
            NEW(n, JN_E_CONST, t->line);
            n->value = jv_bool(t->s.p[0] == 't' || t->s.p[0] == 'T');
        } else if (jstr_eq(t->s, "none") || jstr_eq(t->s, "None")) {
            NEW(n, JN_E_CONST, t->line);
            n->value = jv_none();
        } else {
            NEW(n, JN_E_NAME, t->line);
            n->s = t->s;
        }
        advance(P);
        *out = n;
        return 0;
    case JT_STRING: {
        // Adjacent string literals concatenate.
        size_t total = 0, k = P->pos;
        while (k < P->n && P->t[k].type == JT_STRING) total += P->t[k++].s.n;
        NEW(n, JN_E_CONST, t->line);
        if (k == P->pos + 1) {
            n->value = jv_str(t->s.p, t->s.n);
            advance(P);
        } else {
            char *s = arena_alloc(P->a, total + 1);
            if (!s) return MS_ENOMEM;
            size_t o = 0;
            while (cur(P)->type == JT_STRING) {
                memcpy(s + o, cur(P)->s.p, cur(P)->s.n);
                o += cur(P)->s.n;
                advance(P);
            }
            s[o] = 0;
            n->value = jv_str(s, o);
        }
        *out = n;
        return 0;
    }
    case JT_INT:
    case JT_FLOAT:
        NEW(n, JN_E_CONST, t->line);
        n->value = t->type == JT_INT ? jv_int(t->ival) : jv_float(t->fval);
        advance(P);
        *out = n;
        return 0;
    case JT_OP:
        if (t->op == JOP_LPAREN) {
            advance(P);
            TRY(parse_tuple(P, false, true, NULL, true, out));
            return expect_op(P, JOP_RPAREN);
        }
        if (t->op == JOP_LBRACKET) return parse_list_or_dict(P, false, out);
        if (t->op == JOP_LBRACE) return parse_list_or_dict(P, true, out);
        break;
    default:
        break;
    }
    return fail_expected(P, "an expression");
}

static int parse_unary(struct parser *P, bool with_filter, struct jnode **out)
{
    TRY(enter(P));
    struct jnode *node;
    uint32_t line = cur(P)->line;
    if (is_op(P, JOP_SUB) || is_op(P, JOP_ADD)) {
        int kind = is_op(P, JOP_SUB) ? JN_E_NEG : JN_E_POS;
        advance(P);
        struct jnode *arg;
        TRY(parse_unary(P, false, &arg));
        NEW(node, kind, line);
        node->a = arg;
    } else {
        TRY(parse_primary(P, &node));
    }
    TRY(parse_postfix(P, node, &node));
    if (with_filter) TRY(parse_filter_expr(P, node, &node));
    P->depth--;
    *out = node;
    return 0;
}

static int binary(struct parser *P, int op, struct jnode *a, struct jnode *b, uint32_t line,
                  struct jnode **out)
{
    struct jnode *n;
    NEW(n, JN_E_BINARY, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    *out = n;
    return 0;
}

static int parse_pow(struct parser *P, struct jnode **out)
{
    int links = 0;
    struct jnode *left;
    TRY(parse_unary(P, true, &left));
    while (is_op(P, JOP_POW)) {
        TRY(chain_link(P, &links));
        uint32_t line = cur(P)->line;
        advance(P);
        struct jnode *right;
        TRY(parse_unary(P, true, &right));
        TRY(binary(P, JOP_POW, left, right, line, &left));
    }
    P->depth -= links;
    *out = left;
    return 0;
}

static int parse_math2(struct parser *P, struct jnode **out)
{
    int links = 0;
    struct jnode *left;
    TRY(parse_pow(P, &left));
    while (is_op(P, JOP_MUL) || is_op(P, JOP_DIV) || is_op(P, JOP_FLOORDIV) || is_op(P, JOP_MOD)) {
        TRY(chain_link(P, &links));
        int op = cur(P)->op;
        uint32_t line = cur(P)->line;
        advance(P);
        struct jnode *right;
        TRY(parse_pow(P, &right));
        TRY(binary(P, op, left, right, line, &left));
    }
    P->depth -= links;
    *out = left;
    return 0;
}

static int parse_concat(struct parser *P, struct jnode **out)
{
    struct jnode *first;
    TRY(parse_math2(P, &first));
    if (!is_op(P, JOP_TILDE)) {
        *out = first;
        return 0;
    }
    struct nodevec items = {0};
    TRY(vec_push(P, &items, first));
    uint32_t line = cur(P)->line;
    while (is_op(P, JOP_TILDE)) {
        advance(P);
        struct jnode *e;
        TRY(parse_math2(P, &e));
        TRY(vec_push(P, &items, e));
    }
    struct jnode *n;
    NEW(n, JN_E_CONCAT, line);
    n->nitems = items.n;
    n->items = items.v;
    *out = n;
    return 0;
}

static int parse_math1(struct parser *P, struct jnode **out)
{
    int links = 0;
    struct jnode *left;
    TRY(parse_concat(P, &left));
    while (is_op(P, JOP_ADD) || is_op(P, JOP_SUB)) {
        TRY(chain_link(P, &links));
        int op = cur(P)->op;
        uint32_t line = cur(P)->line;
        advance(P);
        struct jnode *right;
        TRY(parse_concat(P, &right));
        TRY(binary(P, op, left, right, line, &left));
    }
    P->depth -= links;
    *out = left;
    return 0;
}

static int parse_compare(struct parser *P, struct jnode **out)
{
    struct jnode *expr;
    uint32_t line = cur(P)->line;
    TRY(parse_math1(P, &expr));
    struct nodevec operands = {0};
    uint8_t opsbuf[64];
    size_t nops = 0;
    for (;;) {
        int op = 0;
        if (cur(P)->type == JT_OP && (cur(P)->op == JOP_EQ || cur(P)->op == JOP_NE ||
                                      cur(P)->op == JOP_LT || cur(P)->op == JOP_LE ||
                                      cur(P)->op == JOP_GT || cur(P)->op == JOP_GE)) {
            op = cur(P)->op;
            advance(P);
        } else if (is_name(P, "in")) {
            op = JCMP_IN;
            advance(P);
        } else if (is_name(P, "not") && tok_is_name(peek(P, 1), "in")) {
            op = JCMP_NOTIN;
            advance(P);
            advance(P);
        } else {
            break;
        }
        if (nops == sizeof opsbuf) return pfail(P, line, "too many chained comparisons");
        opsbuf[nops++] = (uint8_t)op;
        struct jnode *e;
        TRY(parse_math1(P, &e));
        TRY(vec_push(P, &operands, e));
    }
    if (!nops) {
        *out = expr;
        return 0;
    }
    struct jnode *n;
    NEW(n, JN_E_COMPARE, line);
    n->a = expr;
    n->nitems = nops;
    n->items = operands.v;
    n->ops = arena_alloc(P->a, nops);
    if (!n->ops) return MS_ENOMEM;
    memcpy(n->ops, opsbuf, nops);
    *out = n;
    return 0;
}

static int parse_not(struct parser *P, struct jnode **out)
{
    if (is_name(P, "not")) {
        uint32_t line = cur(P)->line;
        advance(P);
        TRY(enter(P));
        struct jnode *arg, *n;
        TRY(parse_not(P, &arg));
        P->depth--;
        NEW(n, JN_E_NOT, line);
        n->a = arg;
        *out = n;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(struct parser *P, struct jnode **out)
{
    int links = 0;
    struct jnode *left;
    TRY(parse_not(P, &left));
    while (is_name(P, "and")) {
        TRY(chain_link(P, &links));
        uint32_t line = cur(P)->line;
        advance(P);
        struct jnode *right, *n;
        TRY(parse_not(P, &right));
        NEW(n, JN_E_AND, line);
        n->a = left;
        n->b = right;
        left = n;
    }
    P->depth -= links;
    *out = left;
    return 0;
}

static int parse_or(struct parser *P, struct jnode **out)
{
    int links = 0;
    struct jnode *left;
    TRY(parse_and(P, &left));
    while (is_name(P, "or")) {
        TRY(chain_link(P, &links));
        uint32_t line = cur(P)->line;
        advance(P);
        struct jnode *right, *n;
        TRY(parse_and(P, &right));
        NEW(n, JN_E_OR, line);
        n->a = left;
        n->b = right;
        left = n;
    }
    P->depth -= links;
    *out = left;
    return 0;
}

static int parse_condexpr(struct parser *P, struct jnode **out)
{
    struct jnode *expr1;
    TRY(parse_or(P, &expr1));
    while (is_name(P, "if")) {
        uint32_t line = cur(P)->line;
        advance(P);
        struct jnode *test, *n, *other = NULL;
        TRY(parse_or(P, &test));
        if (is_name(P, "else")) {
            advance(P);
            TRY(enter(P));
            TRY(parse_condexpr(P, &other));
            P->depth--;
        }
        NEW(n, JN_E_COND, line);
        n->a = test;
        n->b = expr1;
        n->c = other;
        expr1 = n;
    }
    *out = expr1;
    return 0;
}

static int parse_expression(struct parser *P, bool with_condexpr, struct jnode **out)
{
    TRY(enter(P));
    int rc = with_condexpr ? parse_condexpr(P, out) : parse_or(P, out);
    P->depth--;
    return rc;
}

static bool is_tuple_end(struct parser *P, const char *extra_end)
{
    const struct jtoken *t = cur(P);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || t->type == JT_EOF) return true;
    if (t->type == JT_OP && t->op == JOP_RPAREN) return true;
    return extra_end && tok_is_name(t, extra_end);
}

static int parse_tuple(struct parser *P, bool simplified, bool with_condexpr,
                       const char *extra_end, bool explicit_parens, struct jnode **out)
{
    uint32_t line = cur(P)->line;
    struct nodevec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) TRY(expect_op(P, JOP_COMMA));
        if (is_tuple_end(P, extra_end)) break;
        struct jnode *e;
        if (simplified) TRY(parse_primary(P, &e));
        else TRY(parse_expression(P, with_condexpr, &e));
        TRY(vec_push(P, &items, e));
        if (is_op(P, JOP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) {
            *out = items.v[0];
            return 0;
        }
        if (!explicit_parens) return fail_expected(P, "an expression");
    }
    struct jnode *n;
    NEW(n, JN_E_TUPLE, line);
    n->nitems = items.n;
    n->items = items.v;
    *out = n;
    return 0;
}

static int check_target(struct parser *P, struct jnode *t)
{
    if (t->kind == JN_E_NAME) {
        if (jstr_eq(t->s, "loop") || jstr_eq(t->s, "true") || jstr_eq(t->s, "false") ||
            jstr_eq(t->s, "none"))
            return pfail(P, t->line, "cannot assign to '%.*s'", (int)t->s.n, t->s.p);
        return 0;
    }
    if (t->kind == JN_E_TUPLE) {
        for (size_t i = 0; i < t->nitems; i++) TRY(check_target(P, t->items[i]));
        return 0;
    }
    return pfail(P, t->line, "can only assign to names or tuples of names here");
}

static int parse_assign_target(struct parser *P, bool with_namespace, const char *extra_end,
                               struct jnode **out)
{
    if (with_namespace && cur(P)->type == JT_NAME && peek(P, 1)->type == JT_OP &&
        peek(P, 1)->op == JOP_DOT) {
        struct jnode *ns, *g;
        NEW(ns, JN_E_NAME, cur(P)->line);
        ns->s = cur(P)->s;
        advance(P);
        advance(P);
        if (cur(P)->type != JT_NAME) return fail_expected(P, "an attribute name");
        NEW(g, JN_E_GETATTR, ns->line);
        g->a = ns;
        g->s = cur(P)->s;
        advance(P);
        *out = g;
        return 0;
    }
    TRY(parse_tuple(P, true, true, extra_end, false, out));
    return check_target(P, *out);
}

// {% ... %}, then the body up to one of end_tags (left as the current token).
static int parse_statements(struct parser *P, const char *const *end_tags, struct jnode ***body,
                            size_t *nbody)
{
    TRY(expect_type(P, JT_BLOCK_END, "end of statement block"));
    TRY(subparse(P, end_tags, body, nbody));
    return 0;
}

static int open_block(struct parser *P, const char *name, uint32_t line)
{
    if (P->nblocks >= JINJA_MAX_PARSE_DEPTH)
        return pfail(P, line, "blocks nested more than %d deep", JINJA_MAX_PARSE_DEPTH);
    P->blocks[P->nblocks].name = name;
    P->blocks[P->nblocks].line = line;
    P->nblocks++;
    return 0;
}

// After subparse stopped at `{% name`, consume the end tag name.
static int end_tag(struct parser *P, const char *name)
{
    if (!is_name(P, name)) {
        char want[48];
        snprintf(want, sizeof want, "'%s'", name);
        return fail_expected(P, want);
    }
    advance(P);
    return 0;
}

static void scan_special_names(const struct jnode *n, uint8_t *flags, int depth);

static void scan_list(struct jnode *const *v, size_t n, uint8_t *flags, int depth)
{
    for (size_t i = 0; i < n; i++) scan_special_names(v[i], flags, depth);
}

static void scan_special_names(const struct jnode *n, uint8_t *flags, int depth)
{
    if (!n || depth > JINJA_MAX_PARSE_DEPTH * 2) return;
    if (n->kind == JN_E_NAME) {
        if (jstr_eq(n->s, "varargs")) *flags |= JF_USES_VARARGS;
        else if (jstr_eq(n->s, "kwargs")) *flags |= JF_USES_KWARGS;
        else if (jstr_eq(n->s, "caller")) *flags |= JF_USES_CALLER;
        return;
    }
    if (n->kind == JN_MACRO) return; // a nested macro has its own special names
    scan_special_names(n->a, flags, depth + 1);
    scan_special_names(n->b, flags, depth + 1);
    scan_special_names(n->c, flags, depth + 1);
    scan_special_names(n->target, flags, depth + 1);
    scan_list(n->items, n->items ? n->nitems : 0, flags, depth + 1);
    scan_list(n->items2, n->items2 ? n->nitems : 0, flags, depth + 1);
    scan_list(n->args.pos, n->args.npos, flags, depth + 1);
    scan_list(n->args.kwv, n->args.nkw, flags, depth + 1);
    scan_special_names(n->args.dyn_args, flags, depth + 1);
    scan_special_names(n->args.dyn_kwargs, flags, depth + 1);
    for (size_t i = 0; i < n->params.n; i++) scan_special_names(n->params.defaults[i], flags, depth + 1);
    scan_list(n->body, n->nbody, flags, depth + 1);
    scan_list(n->else_body, n->nelse, flags, depth + 1);
}

static int parse_signature(struct parser *P, struct jparams *params)
{
    TRY(expect_op(P, JOP_LPAREN));
    size_t cap = 0;
    bool have_default = false;
    while (!is_op(P, JOP_RPAREN)) {
        if (params->n) TRY(expect_op(P, JOP_COMMA));
        if (cur(P)->type != JT_NAME) return fail_expected(P, "a parameter name");
        if (params->n == cap) {
            size_t nc = cap ? cap * 2 : 4;
            struct jstr *nn = arena_alloc(P->a, nc * sizeof *nn);
            struct jnode **nd = arena_alloc(P->a, nc * sizeof *nd);
            if (!nn || !nd) return MS_ENOMEM;
            if (params->n) {
                memcpy(nn, params->names, params->n * sizeof *nn);
                memcpy(nd, params->defaults, params->n * sizeof *nd);
            }
            params->names = nn;
            params->defaults = nd;
            cap = nc;
        }
        params->names[params->n] = cur(P)->s;
        params->defaults[params->n] = NULL;
        uint32_t line = cur(P)->line;
        advance(P);
        if (is_op(P, JOP_ASSIGN)) {
            advance(P);
            TRY(parse_expression(P, true, &params->defaults[params->n]));
            have_default = true;
        } else if (have_default) {
            return pfail(P, line, "non-default argument follows default argument");
        }
        params->n++;
    }
    return expect_op(P, JOP_RPAREN);
}

static int parse_statement(struct parser *P, struct jnode **out)
{
    const struct jtoken *t = cur(P);
    if (t->type != JT_NAME) return fail_expected(P, "a statement name");
    uint32_t line = t->line;
    struct jnode *n;
    if (jstr_eq(t->s, "if")) {
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        static const char *const endif[] = {"endif", NULL};
        TRY(open_block(P, "if", line));
        advance(P);
        struct jnode *root = NULL, *last = NULL;
        for (;;) {
            NEW(n, JN_IF, line);
            TRY(parse_tuple(P, false, false, NULL, false, &n->a));
            TRY(parse_statements(P, ends, &n->body, &n->nbody));
            if (!root) root = n;
            else {
                last->else_body = arena_alloc(P->a, sizeof *last->else_body);
                if (!last->else_body) return MS_ENOMEM;
                last->else_body[0] = n;
                last->nelse = 1;
            }
            last = n;
            if (is_name(P, "elif")) {
                line = cur(P)->line;
                advance(P);
                continue;
            }
            if (is_name(P, "else")) {
                advance(P);
                TRY(parse_statements(P, endif, &n->else_body, &n->nelse));
            }
            TRY(end_tag(P, "endif"));
            break;
        }
        P->nblocks--;
        *out = root;
        return 0;
    }
    if (jstr_eq(t->s, "for")) {
        static const char *const ends[] = {"endfor", "else", NULL};
        static const char *const endfor[] = {"endfor", NULL};
        TRY(open_block(P, "for", line));
        advance(P);
        NEW(n, JN_FOR, line);
        TRY(parse_assign_target(P, false, "in", &n->target));
        if (!is_name(P, "in")) return fail_expected(P, "'in'");
        advance(P);
        TRY(parse_tuple(P, false, false, "recursive", false, &n->a));
        if (is_name(P, "if")) {
            advance(P);
            TRY(parse_expression(P, true, &n->b));
        }
        if (is_name(P, "recursive")) {
            advance(P);
            n->flags |= JF_RECURSIVE;
        }
        P->loop_depth++;
        TRY(parse_statements(P, ends, &n->body, &n->nbody));
        P->loop_depth--;
        if (is_name(P, "else")) {
            advance(P);
            TRY(parse_statements(P, endfor, &n->else_body, &n->nelse));
        }
        TRY(end_tag(P, "endfor"));
        P->nblocks--;
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "set")) {
        static const char *const ends[] = {"endset", NULL};
        advance(P);
        struct jnode *target;
        TRY(parse_assign_target(P, true, NULL, &target));
        if (is_op(P, JOP_ASSIGN)) {
            advance(P);
            NEW(n, JN_SET, line);
            n->target = target;
            TRY(parse_tuple(P, false, true, NULL, false, &n->a));
            *out = n;
            return 0;
        }
        TRY(open_block(P, "set", line));
        NEW(n, JN_SET_BLOCK, line);
        n->target = target;
        // {% set x | f | g %}: a filter chain applied to the captured body.
        while (is_op(P, JOP_PIPE)) {
            advance(P);
            TRY(parse_filter_one(P, n->b, &n->b));
        }
        TRY(parse_statements(P, ends, &n->body, &n->nbody));
        TRY(end_tag(P, "endset"));
        P->nblocks--;
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "macro") || jstr_eq(t->s, "call")) {
        bool is_macro = jstr_eq(t->s, "macro");
        static const char *const mends[] = {"endmacro", NULL};
        static const char *const cends[] = {"endcall", NULL};
        TRY(open_block(P, is_macro ? "macro" : "call", line));
        advance(P);
        NEW(n, is_macro ? JN_MACRO : JN_CALL_BLOCK, line);
        if (is_macro) {
            if (cur(P)->type != JT_NAME) return fail_expected(P, "a macro name");
            n->s = cur(P)->s;
            advance(P);
            TRY(parse_signature(P, &n->params));
        } else {
            if (is_op(P, JOP_LPAREN)) TRY(parse_signature(P, &n->params));
            TRY(parse_expression(P, true, &n->a));
            if (n->a->kind != JN_E_CALL) return pfail(P, line, "expected a call after 'call'");
        }
        int saved_loop = P->loop_depth;
        P->loop_depth = 0;
        TRY(parse_statements(P, is_macro ? mends : cends, &n->body, &n->nbody));
        P->loop_depth = saved_loop;
        TRY(end_tag(P, is_macro ? "endmacro" : "endcall"));
        uint8_t flags = 0;
        scan_list(n->body, n->nbody, &flags, 0);
        n->flags |= flags;
        P->nblocks--;
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        TRY(open_block(P, "filter", line));
        advance(P);
        NEW(n, JN_FILTER_BLOCK, line);
        TRY(parse_filter_one(P, NULL, &n->b));
        while (is_op(P, JOP_PIPE)) {
            advance(P);
            TRY(parse_filter_one(P, n->b, &n->b));
        }
        TRY(parse_statements(P, ends, &n->body, &n->nbody));
        TRY(end_tag(P, "endfilter"));
        P->nblocks--;
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "with")) {
        static const char *const ends[] = {"endwith", NULL};
        TRY(open_block(P, "with", line));
        advance(P);
        NEW(n, JN_WITH, line);
        size_t cap = 0;
        while (cur(P)->type != JT_BLOCK_END) {
            if (n->params.n) TRY(expect_op(P, JOP_COMMA));
            if (cur(P)->type != JT_NAME) return fail_expected(P, "a name");
            if (n->params.n == cap) {
                size_t nc = cap ? cap * 2 : 4;
                struct jstr *nn = arena_alloc(P->a, nc * sizeof *nn);
                struct jnode **nd = arena_alloc(P->a, nc * sizeof *nd);
                if (!nn || !nd) return MS_ENOMEM;
                if (n->params.n) {
                    memcpy(nn, n->params.names, n->params.n * sizeof *nn);
                    memcpy(nd, n->params.defaults, n->params.n * sizeof *nd);
                }
                n->params.names = nn;
                n->params.defaults = nd;
                cap = nc;
            }
            n->params.names[n->params.n] = cur(P)->s;
            advance(P);
            TRY(expect_op(P, JOP_ASSIGN));
            TRY(parse_expression(P, true, &n->params.defaults[n->params.n]));
            n->params.n++;
        }
        TRY(parse_statements(P, ends, &n->body, &n->nbody));
        TRY(end_tag(P, "endwith"));
        P->nblocks--;
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "generation")) {
        // transformers' {% generation %} marks assistant tokens; it renders its body.
        static const char *const ends[] = {"endgeneration", NULL};
        TRY(open_block(P, "generation", line));
        advance(P);
        NEW(n, JN_BODY, line);
        TRY(parse_statements(P, ends, &n->body, &n->nbody));
        TRY(end_tag(P, "endgeneration"));
        P->nblocks--;
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "print")) {
        advance(P);
        NEW(n, JN_OUTPUT, line);
        TRY(parse_tuple(P, false, true, NULL, false, &n->a));
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "break") || jstr_eq(t->s, "continue")) {
        bool is_break = jstr_eq(t->s, "break");
        if (!P->loop_depth)
            return pfail(P, line, "'%s' outside of a for loop", is_break ? "break" : "continue");
        advance(P);
        NEW(n, is_break ? JN_BREAK : JN_CONTINUE, line);
        *out = n;
        return 0;
    }
    if (jstr_eq(t->s, "include") || jstr_eq(t->s, "import") || jstr_eq(t->s, "from") ||
        jstr_eq(t->s, "extends") || jstr_eq(t->s, "block") || jstr_eq(t->s, "autoescape"))
        return pfail(P, line, "the '%.*s' tag is not supported in chat templates", (int)t->s.n,
                     t->s.p);
    char msg[160];
    if (P->nblocks) {
        const struct open_block *b = &P->blocks[P->nblocks - 1];
        snprintf(msg, sizeof msg, " (the innermost open block is the '%s' on line %u)", b->name,
                 b->line);
    } else {
        msg[0] = 0;
    }
    return pfail(P, line, "unknown tag '%.*s'%s", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p, msg);
}

static bool in_list(struct jstr s, const char *const *names)
{
    for (; names && *names; names++)
        if (jstr_eq(s, *names)) return true;
    return false;
}

static int fail_eof(struct parser *P, const char *const *end_tags)
{
    char want[128] = "";
    size_t o = 0;
    for (const char *const *e = end_tags; e && *e; e++)
        o += (size_t)snprintf(want + o, sizeof want - o, "%s'%s'", o ? " or " : "", *e);
    if (P->nblocks) {
        const struct open_block *b = &P->blocks[P->nblocks - 1];
        return pfail(P, cur(P)->line,
                     "unexpected end of template: expected %s to close the '%s' block opened on line %u",
                     want, b->name, b->line);
    }
    return pfail(P, cur(P)->line, "unexpected end of template");
}

static int subparse(struct parser *P, const char *const *end_tags, struct jnode ***body,
                    size_t *nbody)
{
    TRY(enter(P));
    struct nodevec v = {0};
    for (;;) {
        const struct jtoken *t = cur(P);
        struct jnode *n = NULL;
        if (t->type == JT_EOF) {
            if (end_tags) return fail_eof(P, end_tags);
            break;
        }
        if (t->type == JT_DATA) {
            NEW(n, JN_TEXT, t->line);
            n->s = t->s;
            advance(P);
            TRY(vec_push(P, &v, n));
            continue;
        }
        if (t->type == JT_VAR_BEGIN) {
            advance(P);
            NEW(n, JN_OUTPUT, t->line);
            TRY(parse_tuple(P, false, true, NULL, false, &n->a));
            TRY(expect_type(P, JT_VAR_END, "end of print statement ('}}')"));
            TRY(vec_push(P, &v, n));
            continue;
        }
        if (t->type == JT_BLOCK_BEGIN) {
            advance(P);
            if (cur(P)->type == JT_NAME && in_list(cur(P)->s, end_tags)) break;
            if (cur(P)->type == JT_NAME && !end_tags &&
                (jstr_eq(cur(P)->s, "endif") || jstr_eq(cur(P)->s, "endfor") ||
                 jstr_eq(cur(P)->s, "else") || jstr_eq(cur(P)->s, "elif") ||
                 jstr_eq(cur(P)->s, "endmacro") || jstr_eq(cur(P)->s, "endset")))
                return pfail(P, cur(P)->line, "unexpected '%.*s': no block is open here",
                             (int)cur(P)->s.n, cur(P)->s.p);
            if (cur(P)->type == JT_NAME && end_tags && P->nblocks &&
                (jstr_eq(cur(P)->s, "endif") || jstr_eq(cur(P)->s, "endfor") ||
                 jstr_eq(cur(P)->s, "else") || jstr_eq(cur(P)->s, "elif") ||
                 jstr_eq(cur(P)->s, "endmacro") || jstr_eq(cur(P)->s, "endset") ||
                 jstr_eq(cur(P)->s, "endcall") || jstr_eq(cur(P)->s, "endfilter") ||
                 jstr_eq(cur(P)->s, "endwith"))) {
                const struct open_block *b = &P->blocks[P->nblocks - 1];
                char want[128] = "";
                size_t o = 0;
                for (const char *const *e = end_tags; *e; e++)
                    o += (size_t)snprintf(want + o, sizeof want - o, "%s'%s'", o ? " or " : "", *e);
                return pfail(P, cur(P)->line,
                             "unexpected '%.*s': expected %s to close the '%s' block opened on line %u",
                             (int)cur(P)->s.n, cur(P)->s.p, want, b->name, b->line);
            }
            TRY(parse_statement(P, &n));
            TRY(expect_type(P, JT_BLOCK_END, "end of statement block ('%}')"));
            TRY(vec_push(P, &v, n));
            continue;
        }
        return fail_expected(P, "template data or a tag");
    }
    P->depth--;
    *body = v.v;
    *nbody = v.n;
    return 0;
}

// Jinja resolves filters and tests when it compiles a template: an unknown name
// is an error then, unless it sits in an if statement or an inline if, where
// the error waits until the code runs.
static int check_names(struct parser *P, const struct jnode *n, bool soft, int depth);

static int check_list(struct parser *P, struct jnode *const *v, size_t n, bool soft, int depth)
{
    for (size_t i = 0; i < n; i++) TRY(check_names(P, v[i], soft, depth));
    return 0;
}

static int check_names(struct parser *P, const struct jnode *n, bool soft, int depth)
{
    if (!n || depth > JINJA_MAX_PARSE_DEPTH * 4) return 0;
    if (n->kind == JN_IF || n->kind == JN_E_COND) soft = true;
    if (!soft && n->kind == JN_E_FILTER && !jb_has_filter(n->s))
        return pfail(P, n->line, "no filter named '%.*s'", (int)(n->s.n > 40 ? 40 : n->s.n), n->s.p);
    if (!soft && n->kind == JN_E_TEST && !jb_has_test(n->s))
        return pfail(P, n->line, "no test named '%.*s'", (int)(n->s.n > 40 ? 40 : n->s.n), n->s.p);
    TRY(check_names(P, n->a, soft, depth + 1));
    TRY(check_names(P, n->b, soft, depth + 1));
    TRY(check_names(P, n->c, soft, depth + 1));
    TRY(check_names(P, n->target, soft, depth + 1));
    TRY(check_list(P, n->items, n->items ? n->nitems : 0, soft, depth + 1));
    TRY(check_list(P, n->items2, n->items2 ? n->nitems : 0, soft, depth + 1));
    TRY(check_list(P, n->args.pos, n->args.npos, soft, depth + 1));
    TRY(check_list(P, n->args.kwv, n->args.nkw, soft, depth + 1));
    TRY(check_names(P, n->args.dyn_args, soft, depth + 1));
    TRY(check_names(P, n->args.dyn_kwargs, soft, depth + 1));
    for (size_t i = 0; i < n->params.n; i++) TRY(check_names(P, n->params.defaults[i], soft, depth + 1));
    TRY(check_list(P, n->body, n->nbody, soft, depth + 1));
    return check_list(P, n->else_body, n->nelse, soft, depth + 1);
}

int jinja_parse_tokens(struct arena *a, const struct jtoken *toks, size_t ntoks,
                       struct jnode ***body, size_t *nbody, char *err, size_t errlen)
{
    struct parser P = {.a = a, .t = toks, .n = ntoks, .err = err, .errlen = errlen};
    TRY(subparse(&P, NULL, body, nbody));
    return check_list(&P, *body, *nbody, false, 0);
}
