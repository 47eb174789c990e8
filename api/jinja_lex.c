// jinja_lex: splits template source into tokens the way Jinja2's lexer does
// with trim_blocks and lstrip_blocks on: data, {{ }}, {% %}, {# #}, raw blocks,
// whitespace control (- and +), bracket balancing inside tags, line numbers.
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jinja_impl.h"
#include "api/py_literal.h"
#include "base/base.h"

struct lexer {
    struct arena *a;
    const char *src;
    size_t len, pos;
    uint32_t line;
    struct jtoken *toks;
    size_t n, cap;
    char *err;
    size_t errlen;
    char balance[JINJA_MAX_PARSE_DEPTH]; // expected closing brackets inside a tag
    int nbalance;
};

static const struct {
    const char *text;
    int op;
} ops[] = {
    // Longest first, as Jinja matches them.
    {"//", JOP_FLOORDIV}, {"**", JOP_POW}, {"==", JOP_EQ}, {"!=", JOP_NE},
    {">=", JOP_GE}, {"<=", JOP_LE},
    {"+", JOP_ADD}, {"-", JOP_SUB}, {"/", JOP_DIV}, {"*", JOP_MUL}, {"%", JOP_MOD},
    {"~", JOP_TILDE}, {"[", JOP_LBRACKET}, {"]", JOP_RBRACKET}, {"(", JOP_LPAREN},
    {")", JOP_RPAREN}, {"{", JOP_LBRACE}, {"}", JOP_RBRACE}, {">", JOP_GT}, {"<", JOP_LT},
    {"=", JOP_ASSIGN}, {".", JOP_DOT}, {":", JOP_COLON}, {"|", JOP_PIPE}, {",", JOP_COMMA},
    {";", JOP_SEMICOLON},
};

const char *jinja_op_text(int op)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op) return ops[i].text;
    return "?";
}

static int lex_fail(struct lexer *L, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return ms_err(L->err, L->errlen, MS_EINVAL, "line %u: %s", L->line, msg);
}

static struct jtoken *push(struct lexer *L, int type, uint32_t line)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        size_t bytes;
        if (ms_mul_overflow(cap, sizeof *L->toks, &bytes)) return NULL;
        struct jtoken *t = arena_alloc(L->a, bytes);
        if (!t) return NULL;
        if (L->n) memcpy(t, L->toks, L->n * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    struct jtoken *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line;
    return t;
}

static void count_lines(struct lexer *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->src[i] == '\n') L->line++;
}

// Python's str.isspace / regex \s on the code point starting at p.
static size_t space_len(const char *p, size_t n)
{
    uint32_t cp;
    size_t k = ju_decode(p, n, &cp);
    return ju_is_space(cp) ? k : 0;
}

// Length of text after rstrip() of Unicode whitespace.
static size_t rstrip_len(const char *p, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && ((unsigned char)p[start] & 0xc0) == 0x80 && end - start < 4) start--;
        if (!space_len(p + start, end - start) || space_len(p + start, end - start) != end - start)
            break;
        end = start;
    }
    return end;
}

static void skip_spaces(struct lexer *L)
{
    size_t k;
    while (L->pos < L->len && (k = space_len(L->src + L->pos, L->len - L->pos))) {
        if (L->src[L->pos] == '\n') L->line++;
        L->pos += k;
    }
}

static int emit_data(struct lexer *L, size_t start, size_t end, uint32_t line)
{
    if (end <= start) return 0;
    struct jtoken *t = push(L, JT_DATA, line);
    if (!t) return MS_ENOMEM;
    t->s.p = L->src + start;
    t->s.n = end - start;
    return 0;
}

// Applies `{%-` / lstrip_blocks to the text [start, end) before a tag.
static size_t strip_before_tag(struct lexer *L, size_t start, size_t end, char sign, bool is_var)
{
    if (sign == '-') return start + rstrip_len(L->src + start, end - start);
    if (sign == '+' || is_var) return end;
    // lstrip_blocks: drop spaces and tabs between the start of the line and the tag.
    size_t l = end;
    while (l > start && L->src[l - 1] != '\n') l--;
    bool line_start = l > start || start == 0 || L->src[start - 1] == '\n';
    if (!line_start) return end;
    for (size_t i = l; i < end; i++)
        if (L->src[i] != ' ' && L->src[i] != '\t') return end;
    return l;
}

static bool is_name_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

static bool is_name_char(unsigned char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9');
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// (\d+_)*\d+ starting at p; returns its length or 0.
static size_t digits_len(const char *p, size_t n)
{
    size_t i = 0;
    if (i >= n || !is_digit(p[i])) return 0;
    while (i < n) {
        while (i < n && is_digit(p[i])) i++;
        if (i + 1 < n && p[i] == '_' && is_digit(p[i + 1])) {
            i++;
            continue;
        }
        break;
    }
    return i;
}

static int lex_number(struct lexer *L)
{
    const char *p = L->src + L->pos;
    size_t n = L->len - L->pos;
    uint32_t line = L->line;
    size_t i = digits_len(p, n);
    bool is_float = false;
    // A float has a fraction or an exponent; `x.0.1` style attribute chains keep integers.
    bool after_dot = L->pos > 0 && L->src[L->pos - 1] == '.';
    if (!after_dot) {
        size_t j = i;
        if (j + 1 < n && p[j] == '.' && is_digit(p[j + 1])) {
            j++;
            j += digits_len(p + j, n - j);
            is_float = true;
        }
        if (j < n && (p[j] == 'e' || p[j] == 'E')) {
            size_t k = j + 1;
            if (k < n && (p[k] == '+' || p[k] == '-')) k++;
            size_t d = digits_len(p + k, n - k);
            if (d) {
                j = k + d;
                is_float = true;
            }
        }
        if (is_float) i = j;
    }
    if (!is_float && n >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X' || p[1] == 'o' ||
                                               p[1] == 'O' || p[1] == 'b' || p[1] == 'B')) {
        int base = (p[1] == 'x' || p[1] == 'X') ? 16 : (p[1] == 'o' || p[1] == 'O') ? 8 : 2;
        size_t j = 2;
        uint64_t v = 0;
        bool any = false;
        while (j < n) {
            char c = p[j];
            const int d = ms_hex_digit(c);
            if (d < 0 && c == '_' && any) { j++; continue; }
            if (d < 0 || d >= base) break;
            if (v > (uint64_t)INT64_MAX / (uint64_t)base) return lex_fail(L, "integer literal too large%s", "");
            v = v * (uint64_t)base + (uint64_t)d;
            any = true;
            j++;
        }
        if (!any) return lex_fail(L, "malformed number literal%s", "");
        struct jtoken *t = push(L, JT_INT, line);
        if (!t) return MS_ENOMEM;
        t->ival = (int64_t)v;
        L->pos += j;
        return 0;
    }
    char buf[128];
    size_t k = 0;
    for (size_t j = 0; j < i; j++) {
        if (p[j] == '_') continue;
        if (k + 1 >= sizeof buf) return lex_fail(L, "number literal too long%s", "");
        buf[k++] = p[j];
    }
    buf[k] = 0;
    struct jtoken *t = push(L, is_float ? JT_FLOAT : JT_INT, line);
    if (!t) return MS_ENOMEM;
    if (is_float) {
        t->fval = strtod(buf, NULL);
    } else {
        errno = 0;
        char *end;
        long long v = strtoll(buf, &end, 10);
        if (errno) return lex_fail(L, "integer literal %s is too large", buf);
        t->ival = v;
    }
    L->pos += i;
    return 0;
}

// A quoted string with Python's escapes (Jinja decodes with unicode-escape).
static int lex_string(struct lexer *L)
{
    char q = L->src[L->pos];
    uint32_t line = L->line;
    size_t i = L->pos + 1;
    while (i < L->len && L->src[i] != q) {
        if (L->src[i] == '\\' && i + 1 < L->len) i++;
        i++;
    }
    if (i >= L->len) return lex_fail(L, "unterminated string literal%s", "");
    size_t rawn = i - L->pos - 1;
    char *out = arena_alloc(L->a, rawn + 1);
    if (!out) return MS_ENOMEM;
    size_t k = 0;
    for (size_t j = L->pos + 1; j < i; j++) {
        char c = L->src[j];
        if (c != '\\') {
            out[k++] = c;
            continue;
        }
        const char e = L->src[j + 1];
        size_t used;
        const long cp = py_escape_read(L->src + j + 1, L->src + i, false, &used);
        j += used;
        if (cp == PY_ESC_NOTHING) continue; // a line continuation
        if (cp == PY_ESC_BAD) return lex_fail(L, "malformed \\%s escape in a string literal", (char[]){e, 0});
        if (cp == PY_ESC_NAMED) // Python decodes the name; no names are known here
            return lex_fail(L, "\\N{...} escapes (characters by name) are not supported in string literals; "
                               "write the character itself%s", "");
        if (cp == PY_ESC_KEEP) { // Python keeps unknown escapes as they are
            out[k++] = '\\';
            out[k++] = e;
            continue;
        }
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return lex_fail(L, "escape \\%s names no Unicode character", (char[]){e, 0});
        // An encoded code point is never longer than its escape (\xNN is 4 bytes, \NNN 4).
        k += ju_encode((uint32_t)cp, out + k);
    }
    out[k] = 0;
    struct jtoken *t = push(L, JT_STRING, line);
    if (!t) return MS_ENOMEM;
    t->s.p = out;
    t->s.n = k;
    count_lines(L, L->pos, i);
    L->pos = i + 1;
    return 0;
}

// Tokens inside {{ }} or {% %} until the end tag (when brackets are balanced).
static int lex_tag(struct lexer *L, bool is_block)
{
    const char close = is_block ? '%' : '}';
    L->nbalance = 0;
    uint32_t open_line = L->line;
    for (;;) {
        if (L->pos >= L->len) {
            L->line = open_line;
            return lex_fail(L, "unexpected end of template: the %s opened here is not closed",
                            is_block ? "'{%' block tag" : "'{{' expression");
        }
        const char *p = L->src + L->pos;
        size_t n = L->len - L->pos;
        if (L->nbalance == 0) {
            // +%}, -%} (then strip whitespace), %} (then one newline: trim_blocks)
            size_t m = 0;
            char sign = 0;
            if (n >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close && p[2] == '}') {
                m = 3;
                sign = p[0];
            } else if (n >= 2 && p[0] == close && p[1] == '}') {
                m = 2;
            }
            if (m && !(sign == '+' && !is_block)) {
                if (!push(L, is_block ? JT_BLOCK_END : JT_VAR_END, L->line)) return MS_ENOMEM;
                L->pos += m;
                if (sign == '-') skip_spaces(L);
                else if (is_block && sign != '+' && L->pos < L->len && L->src[L->pos] == '\n') {
                    L->pos++;
                    L->line++;
                }
                return 0;
            }
        }
        size_t k = space_len(p, n);
        if (k) {
            if (*p == '\n') L->line++;
            L->pos += k;
            continue;
        }
        unsigned char c = (unsigned char)*p;
        if (is_digit((char)c)) {
            int rc = lex_number(L);
            if (rc) return rc;
            continue;
        }
        if (is_name_start(c)) {
            size_t i = 0;
            while (i < n && is_name_char((unsigned char)p[i])) i++;
            struct jtoken *t = push(L, JT_NAME, L->line);
            if (!t) return MS_ENOMEM;
            t->s.p = p;
            t->s.n = i;
            L->pos += i;
            continue;
        }
        if (c == '\'' || c == '"') {
            int rc = lex_string(L);
            if (rc) return rc;
            continue;
        }
        int op = 0;
        size_t oplen = 0;
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            size_t l = strlen(ops[i].text);
            if (l <= n && memcmp(p, ops[i].text, l) == 0) {
                op = ops[i].op;
                oplen = l;
                break;
            }
        }
        if (!op) {
            char ch[8] = {0};
            memcpy(ch, p, n < 4 ? n : (size_t)(c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4));
            return lex_fail(L, "unexpected character '%s' in a tag", ch);
        }
        if (op == JOP_LPAREN || op == JOP_LBRACKET || op == JOP_LBRACE) {
            if (L->nbalance >= JINJA_MAX_PARSE_DEPTH)
                return lex_fail(L, "brackets nested too deeply (more than %s)", "200");
            L->balance[L->nbalance++] = op == JOP_LPAREN ? ')' : op == JOP_LBRACKET ? ']' : '}';
        } else if (op == JOP_RPAREN || op == JOP_RBRACKET || op == JOP_RBRACE) {
            char want = op == JOP_RPAREN ? ')' : op == JOP_RBRACKET ? ']' : '}';
            if (L->nbalance == 0) return lex_fail(L, "unexpected '%s'", jinja_op_text(op));
            if (L->balance[L->nbalance - 1] != want) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", want,
                         L->balance[L->nbalance - 1]);
                return lex_fail(L, "%s", msg);
            }
            L->nbalance--;
        }
        struct jtoken *t = push(L, JT_OP, L->line);
        if (!t) return MS_ENOMEM;
        t->op = (uint8_t)op;
        L->pos += oplen;
    }
}

// Matches {%[-+]?\s*raw\s*(-%}|%}) at pos; returns its length or 0.
static size_t match_raw_begin(struct lexer *L, size_t pos, const char *word)
{
    const char *p = L->src;
    size_t i = pos + 2;
    if (i < L->len && (p[i] == '-' || p[i] == '+')) i++;
    while (i < L->len && space_len(p + i, L->len - i)) i += space_len(p + i, L->len - i);
    size_t wl = strlen(word);
    if (i + wl > L->len || memcmp(p + i, word, wl) != 0) return 0;
    i += wl;
    while (i < L->len && space_len(p + i, L->len - i)) i += space_len(p + i, L->len - i);
    if (i + 3 <= L->len && (p[i] == '-' || p[i] == '+') && p[i + 1] == '%' && p[i + 2] == '}')
        return i + 3 - pos;
    if (i + 2 <= L->len && p[i] == '%' && p[i + 1] == '}') return i + 2 - pos;
    return 0;
}

static int lex_raw(struct lexer *L, size_t begin_len)
{
    uint32_t open_line = L->line;
    char endsign = L->src[L->pos + begin_len - 3];
    count_lines(L, L->pos, L->pos + begin_len);
    L->pos += begin_len;
    // Jinja applies trim_blocks after {% endraw %} but not after {% raw %}.
    if (endsign == '-') skip_spaces(L);
    size_t start = L->pos;
    for (size_t i = start; i + 1 < L->len; i++) {
        if (L->src[i] != '{' || L->src[i + 1] != '%') continue;
        size_t m = match_raw_begin(L, i, "endraw");
        if (!m) continue;
        char sign = L->src[i + 2];
        uint32_t line = L->line;
        size_t end = strip_before_tag(L, start, i, (sign == '-' || sign == '+') ? sign : 0, false);
        int rc = emit_data(L, start, end, line);
        if (rc) return rc;
        count_lines(L, start, i + m);
        L->pos = i + m;
        char esign = L->src[i + m - 3];
        if (esign == '-') skip_spaces(L);
        else if (esign != '+' && L->pos < L->len && L->src[L->pos] == '\n') {
            L->pos++;
            L->line++;
        }
        return 0;
    }
    L->line = open_line;
    return lex_fail(L, "the raw block opened here is missing its {%% endraw %%}%s", "");
}

int jinja_lex(struct arena *a, const char *src, size_t len, struct jtoken **out, size_t *n,
              char *err, size_t errlen)
{
    struct lexer L = {.a = a, .src = src, .len = len, .line = 1, .err = err, .errlen = errlen};
    while (L.pos < L.len) {
        // The earliest {{, {% or {# starts the next tag.
        size_t tag = L.pos;
        while (tag + 1 < L.len) {
            const char *q = memchr(src + tag, '{', L.len - tag - 1);
            if (!q) {
                tag = L.len;
                break;
            }
            tag = (size_t)(q - src);
            char c = src[tag + 1];
            if (c == '{' || c == '%' || c == '#') break;
            tag++;
        }
        if (tag + 1 >= L.len) {
            int rc = emit_data(&L, L.pos, L.len, L.line);
            if (rc) return rc;
            break;
        }
        char kind = src[tag + 1];
        char sign = tag + 2 < L.len && (src[tag + 2] == '-' || src[tag + 2] == '+') ? src[tag + 2] : 0;
        size_t rawlen = kind == '%' ? match_raw_begin(&L, tag, "raw") : 0;
        uint32_t line = L.line;
        size_t end = strip_before_tag(&L, L.pos, tag, sign, kind == '{');
        int rc = emit_data(&L, L.pos, end, line);
        if (rc) return rc;
        count_lines(&L, L.pos, tag);
        L.pos = tag;
        if (rawlen) {
            rc = lex_raw(&L, rawlen);
            if (rc) return rc;
            continue;
        }
        L.pos += 2 + (sign ? 1 : 0);
        if (kind == '#') {
            // The comment ends at the first #}; -#} strips, #} takes one newline.
            size_t i = L.pos;
            for (; i + 1 < L.len; i++)
                if (src[i] == '#' && src[i + 1] == '}') break;
            if (i + 1 >= L.len) return lex_fail(&L, "the comment opened here is missing its '#}'%s", "");
            char esign = i > L.pos && (src[i - 1] == '-' || src[i - 1] == '+') ? src[i - 1] : 0;
            count_lines(&L, L.pos, i + 2);
            L.pos = i + 2;
            if (esign == '-') skip_spaces(&L);
            else if (esign != '+' && L.pos < L.len && src[L.pos] == '\n') {
                L.pos++;
                L.line++;
            }
            continue;
        }
        bool is_block = kind == '%';
        if (!push(&L, is_block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, L.line)) return MS_ENOMEM;
        rc = lex_tag(&L, is_block);
        if (rc) return rc;
    }
    if (!push(&L, JT_EOF, L.line)) return MS_ENOMEM;
    *out = L.toks;
    *n = L.n;
    return 0;
}
