// py_literal: Python literals as JSON values (py_literal.h says which).
// A recursive-descent reader over Python 3.11's token rules for the few
// constructs ast.literal_eval accepts; every failure is NULL, never a
// guess, since the caller then keeps the model's text as a string.
#include "api/py_literal.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"
#include "base/json.h"
#include "base/utf8.h"

#define PY_MAX_DEPTH 200

// While reading, values are jansson values, and what JSON cannot hold yet
// is kept apart by four per-read tags, compared by address: a tuple is the
// array [tuple, items...], a dict [dict, [keys...], [values...]] (its keys
// and values as Python holds them, converted only once the whole literal
// is read, since a later duplicate key may replace a value json.dumps
// could not write), and a value json.dumps cannot write is bad_hashable
// (bytes, complex, Ellipsis, inf, a lone surrogate) or bad_unhashable (a
// set). finish() turns the survivor into plain JSON, or fails.
struct rd {
    const char *p, *end;
    int depth;      // brackets open: inside any, line breaks are whitespace
    bool last_cont; // the last thing skipped was a backslash-newline
    json_t *tuple, *dict, *bad_hashable, *bad_unhashable;
};

// What an operand was, for the sign and complex rules of literal_eval: a
// plain number (int or float, not bool), an imaginary one, or else.
enum num_kind { NUM_NONE, NUM_REAL, NUM_IMAG };

static bool is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           (unsigned char)c >= 0x80;
}

// Spaces, tabs, form feeds, comments and backslash-newlines; line breaks
// too inside brackets (outside, one ends the expression). The text holds no
// \r: py_literal_parse folded every line end into \n.
static void skip_space(struct rd *r)
{
    while (r->p < r->end) {
        const char c = *r->p;
        if (c != '\\') r->last_cont = false;
        if (c == ' ' || c == '\t' || c == '\f') {
            r->p++;
        } else if (c == '#') {
            while (r->p < r->end && *r->p != '\n') r->p++;
        } else if (c == '\\' && r->end - r->p >= 2 && r->p[1] == '\n') {
            r->last_cont = true;
            r->p += 2;
        } else if (c == '\n' && r->depth > 0) {
            r->p++;
        } else {
            break;
        }
    }
}

static bool take(struct rd *r, char c)
{
    skip_space(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return true;
    }
    return false;
}

// n hex digits at p as a code point; -1 when any is not one.
static long hex_run(const char *p, const char *end, int n)
{
    if (end - p < n) return -1;
    long v = 0;
    for (int i = 0; i < n; i++) {
        const int h = ms_hex_digit(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

long py_escape_read(const char *p, const char *end, bool bytes, size_t *used)
{
    const char e = *p;
    long cp;
    int digits = 0;
    switch (e) {
    case '\n': cp = PY_ESC_NOTHING; break;
    case '\\': cp = '\\'; break;
    case '\'': cp = '\''; break;
    case '"': cp = '"'; break;
    case 'a': cp = 7; break;
    case 'b': cp = 8; break;
    case 'f': cp = 12; break;
    case 'n': cp = 10; break;
    case 'r': cp = 13; break;
    case 't': cp = 9; break;
    case 'v': cp = 11; break;
    case 'x':
    case 'u':
    case 'U':
        if (bytes && e != 'x') { // not escapes in bytes
            cp = PY_ESC_KEEP;
            break;
        }
        digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        cp = hex_run(p + 1, end, digits);
        if (cp < 0) cp = PY_ESC_BAD;
        break;
    case 'N': cp = bytes ? PY_ESC_KEEP : PY_ESC_NAMED; break;
    default:
        if (e >= '0' && e <= '7') {
            cp = e - '0';
            for (; digits < 2 && p + 1 + digits < end && p[1 + digits] >= '0' && p[1 + digits] <= '7'; digits++)
                cp = cp * 8 + (p[1 + digits] - '0');
        } else {
            cp = PY_ESC_KEEP;
        }
    }
    *used = cp == PY_ESC_BAD ? 1 : 1 + (size_t)digits;
    return cp;
}

// What a string literal's prefix makes it.
enum str_kind { STR_TEXT, STR_BYTES, STR_FORMAT };

// The prefix at p (r, u, b, f, rb, br, fr, rf in any case) and where its
// quote is; false when no string literal starts at p.
static bool str_prefix(const char *p, const char *end, enum str_kind *kind, bool *raw, const char **quote)
{
    int n = 0, r = 0, u = 0, b = 0, f = 0;
    for (; p + n < end && n < 3; n++) {
        const char c = (char)(p[n] | 32);
        if (c == 'r') r++;
        else if (c == 'u') u++;
        else if (c == 'b') b++;
        else if (c == 'f') f++;
        else break;
    }
    if (p + n >= end || (p[n] != '\'' && p[n] != '"')) return false;
    if (r > 1 || u > 1 || b > 1 || f > 1 || n > 2 || (u && n > 1) || (b && f)) return false;
    *kind = b ? STR_BYTES : f ? STR_FORMAT : STR_TEXT;
    *raw = r > 0;
    *quote = p + n;
    return true;
}

// One string literal appended to b (its bytes; a bytes literal's too, which
// is checked and kept only to be refused later); *kind says which, and
// *unwritable is set where json.dumps could not write it (bytes, a lone
// surrogate). False when it is not one Python reads.
static bool read_string(struct rd *r, struct ms_buf *b, enum str_kind *kind, bool *unwritable)
{
    bool raw;
    const char *p;
    if (!str_prefix(r->p, r->end, kind, &raw, &p)) return false;
    const bool bytes = *kind == STR_BYTES;
    if (bytes) *unwritable = true;
    const char q = *p;
    const bool triple = r->end - p >= 3 && p[1] == q && p[2] == q;
    p += triple ? 3 : 1;
    for (;;) {
        if (p >= r->end) return false;
        const char c = *p;
        if (c == q && (!triple || (r->end - p >= 3 && p[1] == q && p[2] == q))) {
            p += triple ? 3 : 1;
            break;
        }
        if (c == '\n' && !triple) return false;
        if (bytes && (unsigned char)c >= 0x80) return false; // bytes hold ASCII only
        if (c != '\\') {
            if (ms_buf_append(b, p, 1)) return false;
            p++;
            continue;
        }
        if (p + 1 >= r->end) return false;
        const char e = p[1];
        if (raw) { // a raw string keeps the backslash and what it escapes
            if (bytes && (unsigned char)e >= 0x80) return false;
            if (ms_buf_append(b, p, 2)) return false;
            p += 2;
            continue;
        }
        size_t used;
        long cp = py_escape_read(p + 1, r->end, bytes, &used);
        p += 1 + used;
        if (cp == PY_ESC_NOTHING) continue;
        // Malformed, past Unicode, or a character's name (not known here).
        if (cp == PY_ESC_BAD || cp == PY_ESC_NAMED || cp > 0x10FFFF) return false;
        if (cp == PY_ESC_KEEP) { // unknown: the backslash stays
            if (bytes && (unsigned char)e >= 0x80) return false;
            if (ms_buf_append(b, p - 2, 2)) return false;
            continue;
        }
        if (bytes) cp &= 0xFF; // the value is refused later; only its validity counts
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            // A lone surrogate: a str Python holds but UTF-8 cannot; the
            // literal reads, and is refused if it is kept.
            *unwritable = true;
            continue;
        }
        uint8_t u[4];
        const size_t un = utf8_encode((uint32_t)cp, u);
        if (!un || ms_buf_append(b, u, un)) return false;
    }
    r->p = p;
    return true;
}

// Whether a string literal starts at the reader.
static bool string_starts(const struct rd *r)
{
    enum str_kind k;
    bool raw;
    const char *q;
    return str_prefix(r->p, r->end, &k, &raw, &q);
}

// One or more adjacent string literals, joined: a str, or bad_hashable for
// bytes (and a str holding a lone surrogate); NULL for f-strings and for
// str beside bytes.
static json_t *read_strings(struct rd *r)
{
    struct ms_buf b = {0};
    json_t *v = NULL;
    bool any_bytes = false, any_text = false, unwritable = false;
    do {
        enum str_kind k;
        if (!read_string(r, &b, &k, &unwritable) || k == STR_FORMAT) goto out;
        if (k == STR_BYTES) any_bytes = true;
        else any_text = true;
        skip_space(r);
    } while (r->p < r->end && string_starts(r));
    if (any_bytes && any_text) goto out;
    v = unwritable ? json_incref(r->bad_hashable) : json_stringn(b.data ? b.data : "", b.len);
out:
    ms_buf_free(&b);
    return v;
}

// Digits of base (underscores single and between digits) into out;
// false when there are none or an underscore is misplaced.
static bool digit_run(struct rd *r, int base, struct ms_buf *out, bool after_prefix)
{
    const char *p = r->p;
    bool any = false;
    for (; p < r->end; p++) {
        const int h = ms_hex_digit(*p);
        if (h >= 0 && h < base) {
            if (ms_buf_append(out, p, 1)) return false;
            any = true;
        } else if (*p == '_' && (any || after_prefix)) {
            // 0x_1f: one underscore may follow a base prefix; elsewhere
            // only between digits.
            if (p + 1 >= r->end || ms_hex_digit(p[1]) < 0 || ms_hex_digit(p[1]) >= base) return false;
        } else {
            break;
        }
        after_prefix = false;
    }
    r->p = p;
    return any;
}

// digits (of base 16, 8 or 2, none above the base) as "[-]0x..." for
// strtod, which rounds the whole value once: an octal or binary digit
// string is regrouped into hex digits. malloc'd; NULL when out of memory.
static char *big_to_hex(const char *digits, int base, bool negative)
{
    const size_t n = strlen(digits);
    const int bits = base == 16 ? 4 : base == 8 ? 3 : 1;
    const size_t total = n * (size_t)bits, n_hex = (total + 3) / 4;
    char *out = malloc(n_hex + 4);
    if (!out) return NULL;
    size_t at = 0;
    if (negative) out[at++] = '-';
    out[at++] = '0';
    out[at++] = 'x';
    // Bit i (from the top, the string left-padded to whole hex digits).
    const size_t pad = n_hex * 4 - total;
    for (size_t h = 0; h < n_hex; h++) {
        int x = 0;
        for (int b = 0; b < 4; b++) {
            const size_t i = h * 4 + (size_t)b;
            int bit = 0;
            if (i >= pad) {
                const size_t j = i - pad, digit = j / (size_t)bits, within = j % (size_t)bits;
                bit = (ms_hex_digit(digits[digit]) >> (bits - 1 - (int)within)) & 1;
            }
            x = x * 2 + bit;
        }
        out[at++] = "0123456789abcdef"[x];
    }
    out[at] = 0;
    return out;
}

// A number: an integer (any base) or a float (*kind NUM_REAL), or an
// imaginary one (NUM_IMAG: bad_hashable, complex); NULL for anything
// Python's tokenizer refuses.
static json_t *read_number(struct rd *r, bool negative, enum num_kind *kind)
{
    struct ms_buf d = {0};
    json_t *v = NULL;
    *kind = NUM_REAL;
    if (ms_buf_append(&d, negative ? "-" : "", negative)) goto out;
    if (r->p[0] == '0' && r->end - r->p >= 2 && r->p[1] && strchr("xXoObB", r->p[1])) {
        const int base = (r->p[1] | 32) == 'x' ? 16 : (r->p[1] | 32) == 'o' ? 8 : 2;
        r->p += 2;
        if (!digit_run(r, base, &d, true)) goto out;
        if (r->p < r->end && (is_ident(*r->p) || *r->p == '.')) goto out;
        if (ms_buf_append(&d, "", 1)) goto out;
        errno = 0;
        char *end;
        const long long x = strtoll(d.data, &end, base);
        if (!errno) {
            v = json_integer(x);
        } else { // past 64 bits: the value as a real, rounded once (strtod's hex floats)
            v = json_incref(r->bad_hashable);
            char *hex = big_to_hex(d.data + negative, base, negative);
            if (hex) {
                const double f = strtod(hex, &end);
                if (isfinite(f)) {
                    json_decref(v);
                    v = json_real(f);
                }
                free(hex);
            } else {
                json_decref(v);
                v = NULL;
            }
        }
        goto out;
    }
    bool is_float = false, int_digits = false;
    const char *start = r->p;
    if (r->p < r->end && *r->p != '.') {
        if (!digit_run(r, 10, &d, false)) goto out;
        int_digits = true;
    }
    if (r->p < r->end && *r->p == '.') {
        is_float = true;
        r->p++;
        if (ms_buf_append(&d, ".", 1)) goto out;
        if (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
            if (!digit_run(r, 10, &d, false)) goto out;
        } else if (!int_digits) {
            goto out;
        }
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        is_float = true;
        r->p++;
        if (ms_buf_append(&d, "e", 1)) goto out;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) {
            if (ms_buf_append(&d, r->p, 1)) goto out;
            r->p++;
        }
        if (!digit_run(r, 10, &d, false)) goto out;
    }
    if (r->p < r->end && (*r->p == 'j' || *r->p == 'J')) {
        r->p++;
        if (r->p < r->end && (is_ident(*r->p) || *r->p == '.')) goto out;
        *kind = NUM_IMAG; // 07j is imaginary seven: no leading-zero rule
        v = json_incref(r->bad_hashable);
        goto out;
    }
    if (r->p < r->end && (is_ident(*r->p) || *r->p == '.')) goto out; // 1x, 1.2.3
    if (ms_buf_append(&d, "", 1)) goto out;
    if (!is_float) {
        // 007 is refused; 00 and 0_0 are zero.
        if (*start == '0')
            for (const char *c = d.data + negative; *c; c++)
                if (*c != '0') goto out;
        errno = 0;
        char *end;
        const long long x = strtoll(d.data, &end, 10);
        if (!errno) {
            v = json_integer(x);
            goto out;
        }
    }
    char *end;
    const double f = strtod(d.data, &end);
    v = isfinite(f) ? json_real(f) : json_incref(r->bad_hashable);
out:
    ms_buf_free(&d);
    return v;
}

static json_t *read_expr(struct rd *r);
static json_t *read_operand_expr(struct rd *r, enum num_kind *kind, bool *sign);

static bool is_tagged(const json_t *v, const json_t *tag)
{
    return json_is_array(v) && json_array_size(v) > 0 && json_array_get(v, 0) == tag;
}

// Whether Python can hash v: not a list, dict or set, nor a tuple holding one.
static bool hashable(const struct rd *r, const json_t *v)
{
    if (v == r->bad_unhashable || is_tagged(v, r->dict)) return false;
    if (!json_is_array(v)) return true;
    if (!is_tagged(v, r->tuple)) return false;
    for (size_t i = 1; i < json_array_size(v); i++)
        if (!hashable(r, json_array_get(v, i))) return false;
    return true;
}

// A text two keys share exactly when Python holds them equal (1, 1.0 and
// True are one key; strings equal their own bytes): the dict's index, so
// that a dict of many keys is read in linear time. False for tuples and
// unwritable keys, which are never merged: their dict cannot be written
// whatever it holds, so which value it keeps does not matter.
static bool key_canon(const struct rd *r, const json_t *k, struct ms_buf *out)
{
    out->len = 0;
    if (k == r->bad_hashable || json_is_array(k)) return false;
    if (json_is_string(k))
        return !ms_buf_append(out, "s", 1) && !ms_buf_append(out, json_string_value(k), json_string_length(k));
    if (json_is_null(k)) return !ms_buf_append(out, "n", 1);
    if (json_is_boolean(k)) return !ms_buf_append(out, json_is_true(k) ? "i1" : "i0", 2);
    if (json_is_integer(k)) return !ms_buf_append_fmt(out, "i%" JSON_INTEGER_FORMAT, json_integer_value(k));
    const double f = json_real_value(k);
    // A float equal to an int64 is that int's key (-0.0 is 0's); no other
    // float equals an int64 (2^63 rounds from 2^63 - 1 but is not it).
    if (f == floor(f) && f < 9223372036854775808.0 && f >= -9223372036854775808.0)
        return !ms_buf_append_fmt(out, "i%" JSON_INTEGER_FORMAT, (json_int_t)f);
    return !ms_buf_append_fmt(out, "f%.17g", f);
}

// A key as json.dumps writes it: strings as they are, numbers as repr,
// true, false, null; false for a tuple or an unwritable key (json.dumps
// refuses those).
static bool key_text(const struct rd *r, const json_t *k, struct ms_buf *out)
{
    char buf[40];
    const char *s = buf;
    size_t n;
    if (k == r->bad_hashable || json_is_array(k)) return false;
    if (json_is_string(k)) {
        s = json_string_value(k);
        n = json_string_length(k);
    } else if (json_is_integer(k)) {
        n = (size_t)snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(k));
    } else if (json_is_real(k)) {
        json_format_py_float(json_real_value(k), buf);
        n = strlen(buf);
    } else {
        s = json_is_true(k) ? "true" : json_is_false(k) ? "false" : "null";
        n = strlen(s);
    }
    out->len = 0;
    return !ms_buf_append(out, s, n) && !ms_buf_append(out, "", 1);
}

// The entries of a dict up to its '}' ('{' and the first key read), kept as
// Python keeps them: each key in its first place with its last value.
static json_t *read_dict(struct rd *r, json_t *key)
{
    json_t *keys = json_array(), *vals = json_array(), *index = json_object(), *d = NULL;
    struct ms_buf canon = {0};
    if (!keys || !vals || !index) goto fail;
    for (;;) {
        if (!key || !hashable(r, key) || !take(r, ':')) goto fail;
        json_t *val = read_expr(r);
        if (!val) goto fail;
        size_t at = json_array_size(keys);
        if (key_canon(r, key, &canon)) {
            const json_t *seen = json_object_getn(index, canon.data, canon.len);
            if (seen) at = (size_t)json_integer_value(seen);
            else if (json_object_setn_new(index, canon.data, canon.len, json_integer((json_int_t)at))) {
                json_decref(val);
                goto fail;
            }
        }
        if (at < json_array_size(keys)) {
            json_decref(key);
            key = NULL;
            if (json_array_set_new(vals, at, val)) goto fail;
        } else {
            const int rc = json_array_append_new(keys, key);
            key = NULL;
            if (rc) {
                json_decref(val);
                goto fail;
            }
            if (json_array_append_new(vals, val)) goto fail;
        }
        if (take(r, '}')) break;
        if (!take(r, ',')) goto fail;
        if (take(r, '}')) break;
        key = read_expr(r);
    }
    d = json_pack("[OOO]", r->dict, keys, vals);
fail:
    json_decref(key);
    json_decref(keys);
    json_decref(vals);
    json_decref(index);
    ms_buf_free(&canon);
    return d;
}

// A set's items after its first, up to its '}': bad_unhashable (json.dumps
// refuses sets), or NULL when an item is unhashable or it does not parse.
static json_t *read_set(struct rd *r, json_t *first)
{
    bool ok = hashable(r, first);
    json_decref(first);
    while (ok && !take(r, '}')) {
        if (!take(r, ',')) return NULL;
        if (take(r, '}')) break;
        json_t *v = read_expr(r);
        ok = v && hashable(r, v);
        json_decref(v);
    }
    return ok ? json_incref(r->bad_unhashable) : NULL;
}

// Items after the first up to close into a (the opening bracket and the
// first item read).
static bool read_more_items(struct rd *r, json_t *a, char close)
{
    for (;;) {
        if (take(r, close)) return true;
        if (!take(r, ',')) return false;
        if (take(r, close)) return true;
        json_t *v = read_expr(r);
        if (!v || json_array_append_new(a, v)) return false;
    }
}

// An operand: a constant, a signed number, a bracketed one; *kind and
// *sign say what literal_eval's number rules need of it.
static json_t *read_operand(struct rd *r, enum num_kind *kind, bool *sign)
{
    *kind = NUM_NONE;
    *sign = false;
    skip_space(r);
    if (r->p >= r->end) return NULL;
    const char c = *r->p;
    const bool digit = (c >= '0' && c <= '9') || (c == '.' && r->end - r->p >= 2 && r->p[1] >= '0' && r->p[1] <= '9');
    if (digit) return read_number(r, false, kind);
    if (c == '+' || c == '-') {
        // One sign, before a number, bracketed or not: -True and --1 are
        // not literals.
        r->p++;
        skip_space(r);
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) return NULL; // and no sign reads a sign
        const bool next_digit = r->p < r->end && ((*r->p >= '0' && *r->p <= '9') ||
                                 (*r->p == '.' && r->end - r->p >= 2 && r->p[1] >= '0' && r->p[1] <= '9'));
        json_t *v;
        bool inner_sign;
        if (next_digit) {
            v = read_number(r, c == '-', kind);
        } else {
            v = read_operand(r, kind, &inner_sign);
            if (v && (*kind == NUM_NONE || inner_sign)) {
                json_decref(v);
                return NULL;
            }
            if (v && c == '-' && *kind == NUM_REAL && v != r->bad_hashable) {
                json_t *neg = json_is_integer(v) && json_integer_value(v) != INT64_MIN
                                  ? json_integer(-json_integer_value(v))
                                  : json_real(-json_number_value(v));
                json_decref(v);
                v = neg;
            }
        }
        *sign = true;
        return v;
    }
    if (string_starts(r)) return read_strings(r);
    if (c == '(' || c == '[' || c == '{') {
        if (r->depth >= PY_MAX_DEPTH) return NULL;
        const char close = c == '(' ? ')' : c == '[' ? ']' : '}';
        r->p++;
        r->depth++;
        json_t *v = NULL;
        if (take(r, close)) {
            v = c == '(' ? json_pack("[O]", r->tuple) : c == '[' ? json_array() : json_pack("[O[][]]", r->dict);
        } else {
            enum num_kind k;
            bool sg;
            json_t *first = c == '(' ? read_operand_expr(r, &k, &sg) : read_expr(r);
            if (!first) {
                v = NULL;
            } else if (c == '{') {
                v = take(r, ':') ? (r->p--, read_dict(r, first)) : read_set(r, first);
            } else if (c == '(' && take(r, ')')) { // (x) is x, its kind too
                v = first;
                *kind = k;
                *sign = sg;
            } else {
                v = c == '(' ? json_pack("[O]", r->tuple) : json_array();
                if (!v) json_decref(first);
                if (!v || json_array_append_new(v, first) || !read_more_items(r, v, close)) {
                    json_decref(v);
                    v = NULL;
                }
            }
        }
        r->depth--;
        return v;
    }
    if (is_ident(c)) {
        const char *s = r->p;
        while (r->p < r->end && is_ident(*r->p)) r->p++;
        const size_t n = (size_t)(r->p - s);
        if (n == 4 && !memcmp(s, "True", 4)) return json_true();
        if (n == 5 && !memcmp(s, "False", 5)) return json_false();
        if (n == 4 && !memcmp(s, "None", 4)) return json_null();
        // set(): the one call literal_eval reads.
        if (n == 3 && !memcmp(s, "set", 3) && r->depth < PY_MAX_DEPTH && take(r, '(') && take(r, ')'))
            return json_incref(r->bad_unhashable);
        return NULL;
    }
    if (c == '.' && r->end - r->p >= 3 && r->p[1] == '.' && r->p[2] == '.') { // Ellipsis
        r->p += 3;
        return json_incref(r->bad_hashable);
    }
    return NULL;
}

// An expression with its kind: an operand, or a real number plus or minus
// an imaginary one (a complex number: bad_hashable), the one operator
// literal_eval reads.
static json_t *read_operand_expr(struct rd *r, enum num_kind *kind, bool *sign)
{
    json_t *v = read_operand(r, kind, sign);
    if (!v) return NULL;
    skip_space(r);
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) {
        const bool real_left = *kind == NUM_REAL;
        json_decref(v);
        r->p++;
        enum num_kind rk;
        bool rs;
        json_t *right = read_operand(r, &rk, &rs);
        json_decref(right);
        if (!right || !real_left || rk != NUM_IMAG || rs) return NULL;
        *kind = NUM_NONE;
        *sign = false;
        return json_incref(r->bad_hashable);
    }
    return v;
}

static json_t *read_expr(struct rd *r)
{
    enum num_kind k;
    bool sign;
    return read_operand_expr(r, &k, &sign);
}

// The value read made plain JSON: tuples as arrays, dicts as objects with
// json.dumps' keys; NULL where an unwritable value survived.
static json_t *finish(const struct rd *r, const json_t *v, struct ms_buf *key)
{
    if (v == r->bad_hashable || v == r->bad_unhashable) return NULL;
    if (is_tagged(v, r->dict)) {
        const json_t *keys = json_array_get(v, 1), *vals = json_array_get(v, 2);
        json_t *o = json_object();
        for (size_t i = 0; o && i < json_array_size(keys); i++) {
            // The value first: its own dicts reuse the key buffer.
            json_t *x = finish(r, json_array_get(vals, i), key);
            if (x && !key_text(r, json_array_get(keys, i), key)) {
                json_decref(x);
                x = NULL;
            }
            if (!x || json_object_setn_new(o, key->data, key->len - 1, x)) {
                json_decref(o);
                o = NULL;
            }
        }
        return o;
    }
    if (json_is_array(v)) {
        json_t *a = json_array();
        for (size_t i = is_tagged(v, r->tuple) ? 1 : 0; a && i < json_array_size(v); i++) {
            json_t *x = finish(r, json_array_get(v, i), key);
            if (!x || json_array_append_new(a, x)) {
                json_decref(a);
                a = NULL;
            }
        }
        return a;
    }
    return json_incref((json_t *)v);
}

// The column after the blanks at *p, as Python's tokenizer counts it (a
// tab to the next multiple of 8, a form feed back to 0); *p past them.
static int blank_column(const char **p, const char *end, int col)
{
    for (; *p < end; (*p)++) {
        if (**p == ' ') col++;
        else if (**p == '\t') col = (col / 8 + 1) * 8;
        else if (**p == '\f') col = 0;
        else break;
    }
    return col;
}

// Before the expression: blank and comment lines, and backslash-newlines
// at column 0, but no indentation (ast.literal_eval strips leading spaces
// and tabs of the first line only). False when the first token is indented.
static bool skip_leading(struct rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t')) r->p++;
    int col = 0;
    for (;;) {
        col = blank_column(&r->p, r->end, col);
        if (r->p >= r->end) return true;
        const char c = *r->p;
        if (c == '#') {
            while (r->p < r->end && *r->p != '\n') r->p++;
        } else if (c == '\n') {
            r->p++;
            col = 0;
        } else if (c == '\\' && r->end - r->p >= 2 && r->p[1] == '\n') {
            if (col > 0) return false; // the indentation before it counts
            r->p += 2;
        } else {
            return col == 0;
        }
    }
}

static json_t *parse(struct rd *r)
{
    json_t *v = NULL, *out = NULL;
    if (!skip_leading(r) || !(v = read_expr(r))) goto done;
    // A bare tuple: 1, 2 (and 1,).
    if (take(r, ',')) {
        json_t *t = json_pack("[OO]", r->tuple, v);
        json_decref(v);
        if (!(v = t)) goto done;
        for (;;) {
            skip_space(r);
            if (r->p >= r->end || *r->p == '\n') break;
            json_t *item = read_expr(r);
            if (!item || json_array_append_new(v, item)) goto done;
            if (!take(r, ',')) break;
        }
    }
    // What follows may only be blank space, comments and line breaks; a
    // last line of blanks alone must not be indented (Python takes it for
    // an indent), and no backslash-newline may end the text.
    for (;;) {
        skip_space(r);
        if (r->p >= r->end) break;
        if (*r->p != '\n') goto done;
        r->p++;
        const char *line = r->p;
        if (blank_column(&line, r->end, 0) > 0 && line >= r->end) goto done;
    }
    if (r->last_cont) goto done;
    struct ms_buf key = {0};
    out = finish(r, v, &key);
    ms_buf_free(&key);
done:
    json_decref(v);
    return out;
}

json_t *py_literal_parse(const char *s, size_t n)
{
    // Python refuses source with a NUL byte in it.
    if (!s || memchr(s, 0, n)) return NULL;
    // And reads \r\n and a lone \r as \n everywhere, inside strings too.
    char *text = malloc(n ? n : 1);
    if (!text) return NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') continue;
        text[len++] = s[i] == '\r' ? '\n' : s[i];
    }
    struct rd r = {.p = text, .end = text + len};
    json_t *out = NULL;
    r.tuple = json_object();
    r.dict = json_object();
    r.bad_hashable = json_object();
    r.bad_unhashable = json_object();
    if (r.tuple && r.dict && r.bad_hashable && r.bad_unhashable) out = parse(&r);
    json_decref(r.tuple);
    json_decref(r.dict);
    json_decref(r.bad_hashable);
    json_decref(r.bad_unhashable);
    free(text);
    return out;
}
