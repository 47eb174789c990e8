// output_parser: the streaming reasoning / content / tool-call splitter of
// one chat choice, and the JSON of its message fields and stream deltas.
// See output_parser.h for the rules it applies to the text.
//
// How the promise "any split gives the same result" is kept: the parser is a
// small state machine over one buffer of undecided bytes (pend). Each state's
// step only decides what the bytes in pend already settle (a tag found, or a
// stretch that no later byte can turn into a tag, a call or a character), and
// leaves the rest in pend; feed appends and runs the steps, finish runs them
// with "no more bytes". Every decision therefore depends on the text alone,
// never on where the deltas were cut. Texts are handed out through one
// UTF-8 sanitiser, and a stretch is only ever cut where no well-formed
// character spans the cut, so sanitising the pieces equals sanitising the
// whole.
#include "api/output_parser.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/py_literal.h"
#include "base/base.h"
#include "base/json.h"
#include "base/utf8.h"

// ---- bytes: a growable byte buffer, always NUL-terminated -------------------------

struct bytes {
    char *p;
    size_t len, cap;
};

static int bytes_reserve(struct bytes *b, size_t extra)
{
    size_t need;
    if (ms_add_overflow(b->len, extra, &need) || ms_add_overflow(need, 1, &need))
        return MS_ENOMEM;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (ms_mul_overflow(cap, 2, &cap)) return MS_ENOMEM;
    }
    char *q = realloc(b->p, cap);
    if (!q) return MS_ENOMEM;
    b->p = q;
    b->cap = cap;
    return 0;
}

static int bytes_put(struct bytes *b, const char *s, size_t n)
{
    int rc = bytes_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

// Appends s with each byte that is not part of a well-formed character
// replaced by U+FFFD (utf8_decode's one-byte rule).
static int bytes_put_utf8(struct bytes *b, const char *s, size_t n)
{
    while (n) {
        size_t v = utf8_valid_prefix((const uint8_t *)s, n);
        int rc = bytes_put(b, s, v);
        if (rc) return rc;
        s += v;
        n -= v;
        if (n) {
            if ((rc = bytes_put(b, "\xef\xbf\xbd", 3))) return rc;
            s++;
            n--;
        }
    }
    return 0;
}

static void bytes_free(struct bytes *b)
{
    free(b->p);
    *b = (struct bytes){0};
}

// ---- the parser ----------------------------------------------------------------

struct tag {
    const char *s;
    size_t len;
};
static const struct tag TAG_THINK = {"<think>", 7};
static const struct tag TAG_END_THINK = {"</think>", 8};
static const struct tag TAG_CALL = {"<tool_call>", 11};
static const struct tag TAG_END_CALL = {"</tool_call>", 12};

enum pstate {
    ST_START,   // reasoning on, nothing decided yet: does the output open with <think>?
    ST_REASON,  // inside reasoning, looking for </think>
    ST_PLAIN,   // content with tool parsing off
    ST_CONTENT, // content, looking for <tool_call>; pend opens with held whitespace
    ST_CALL,    // pend: held whitespace, "<tool_call>", the body so far
    ST_RAW,     // a call that failed: content up to and including </tool_call>
};

struct call {
    char id[OUTPUT_PARSER_MAX_ID];
    char *name;
    size_t name_len;
    char *args;
    size_t args_len;
};

// One event of the current batch; texts are offsets into the totals, so that
// growing a buffer never leaves a stale pointer. Resolved when the batch is
// handed out.
struct ev_rec {
    enum output_event_kind kind;
    int index;
    size_t off, len;
};

struct output_parser {
    struct output_parser_opts o;
    enum pstate state;
    struct bytes pend;   // undecided bytes are pend.p[pos .. pend.len)
    size_t pos;
    size_t ws_len;       // ST_CONTENT, ST_CALL: held whitespace at the front of the undecided bytes
    size_t scan;         // ST_CALL: body offset where the search for </tool_call> resumes
    struct bytes content, reasoning; // everything emitted so far
    struct call *calls;
    int n_calls, cap_calls;
    struct ev_rec *recs;
    struct output_event *events;
    size_t n_recs, cap_recs;
    bool finished, spent;
};

static const char *undecided(const struct output_parser *p, size_t *len)
{
    *len = p->pend.len - p->pos;
    return p->pend.p ? p->pend.p + p->pos : "";
}

static void consume(struct output_parser *p, size_t n)
{
    p->pos += n;
    if (p->pos == p->pend.len) p->pos = p->pend.len = 0;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t trailing_ws(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n && is_ws(s[n - 1 - k])) k++;
    return k;
}

// The longest proper prefix of tag that s[0..n) ends with: bytes that may
// still become the tag.
static size_t tag_partial_suffix(const char *s, size_t n, const struct tag *t)
{
    for (size_t k = n < t->len - 1 ? n : t->len - 1; k > 0; k--)
        if (!memcmp(s + n - k, t->s, k)) return k;
    return 0;
}

// Trailing bytes of s[0..n) that start a character a later byte may still
// complete: the lead and its continuation bytes so far are checked by
// completing them with the smallest continuation bytes their lead allows.
static size_t utf8_open_tail(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t lead = (uint8_t)s[n - back];
        if (lead >= 0x80 && lead <= 0xbf) continue; // a continuation byte: look further back
        size_t need = lead >= 0xc2 && lead <= 0xdf ? 2 : lead >= 0xe0 && lead <= 0xef ? 3
                    : lead >= 0xf0 && lead <= 0xf4 ? 4 : 0;
        if (need <= back) return 0; // ASCII, an invalid byte, or a character already whole
        uint8_t b[4];
        memcpy(b, s + n - back, back);
        for (size_t k = back; k < need; k++)
            b[k] = k > 1 ? 0x80 : lead == 0xe0 ? 0xa0 : lead == 0xf0 ? 0x90 : 0x80;
        return utf8_valid_prefix(b, need) == need ? back : 0;
    }
    return 0;
}

// How much of s[0..n) is settled when tag (or none) may still begin in its tail.
static size_t decided_len(const char *s, size_t n, const struct tag *t, bool final)
{
    if (final) return n;
    size_t d = n - (t ? tag_partial_suffix(s, n, t) : 0);
    return d - utf8_open_tail(s, d);
}

static int push_rec(struct output_parser *p, enum output_event_kind kind, int index, size_t off,
                    size_t len)
{
    if (p->n_recs > 0 && index < 0) {
        struct ev_rec *last = &p->recs[p->n_recs - 1];
        if (last->kind == kind) { // text of the same kind right after: one event
            last->len += len;
            return 0;
        }
    }
    if (p->n_recs == p->cap_recs) {
        size_t cap = p->cap_recs ? p->cap_recs * 2 : 8, bytes;
        if (ms_mul_overflow(cap, sizeof(struct ev_rec) + sizeof(struct output_event), &bytes))
            return MS_ENOMEM;
        struct ev_rec *r = realloc(p->recs, cap * sizeof *r);
        if (!r) return MS_ENOMEM;
        p->recs = r;
        struct output_event *e = realloc(p->events, cap * sizeof *e);
        if (!e) return MS_ENOMEM;
        p->events = e;
        p->cap_recs = cap;
    }
    p->recs[p->n_recs++] = (struct ev_rec){kind, index, off, len};
    return 0;
}

static int emit_text(struct output_parser *p, enum output_event_kind kind, const char *s, size_t n)
{
    if (!n) return 0;
    struct bytes *b = kind == OUTPUT_EVENT_REASONING ? &p->reasoning : &p->content;
    size_t off = b->len;
    int rc = bytes_put_utf8(b, s, n);
    return rc ? rc : push_rec(p, kind, -1, off, b->len - off);
}

// ---- a call's body ------------------------------------------------------------------

// The scanners below walk JSON that jansson has already accepted; they still
// check every index against n, and give up (false) on anything unexpected.
static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && is_ws(s[i])) i++;
    return i;
}

static bool skip_string(const char *s, size_t n, size_t *i)
{
    for (size_t k = *i + 1; k < n; k++) {
        if (s[k] == '\\') {
            k++;
        } else if (s[k] == '"') {
            *i = k + 1;
            return true;
        }
    }
    return false;
}

static bool skip_value(const char *s, size_t n, size_t *i)
{
    size_t k = *i;
    if (k >= n) return false;
    if (s[k] == '"') return skip_string(s, n, i);
    if (s[k] != '{' && s[k] != '[') { // number, true, false, null
        while (k < n && !is_ws(s[k]) && s[k] != ',' && s[k] != '}' && s[k] != ']') k++;
        if (k == *i) return false;
        *i = k;
        return true;
    }
    size_t depth = 0;
    while (k < n) {
        char c = s[k];
        if (c == '"') {
            if (!skip_string(s, n, &k)) return false;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                *i = k + 1;
                return true;
            }
        }
        k++;
    }
    return false;
}

// Whether the quoted key s[0..n) (quotes included) spells want, escapes decoded.
static bool key_is(const char *s, size_t n, const char *want)
{
    size_t wl = strlen(want);
    if (n == wl + 2 && !memcmp(s + 1, want, wl)) return true;
    if (!memchr(s, '\\', n)) return false;
    json_t *k = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    bool same = json_is_string(k) && json_string_length(k) == wl &&
                !memcmp(json_string_value(k), want, wl);
    json_decref(k);
    return same;
}

// The span of the last top-level member named key in the JSON object s[0..n).
static bool member_span(const char *s, size_t n, const char *key, size_t *v0, size_t *v1)
{
    size_t i = skip_ws(s, n, 0);
    bool found = false;
    if (i >= n || s[i] != '{') return false;
    i = skip_ws(s, n, i + 1);
    if (i < n && s[i] == '}') return false;
    while (i < n) {
        size_t k0 = i;
        if (s[i] != '"' || !skip_string(s, n, &i)) return false;
        size_t k1 = i;
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != ':') return false;
        i = skip_ws(s, n, i + 1);
        size_t a = i;
        if (!skip_value(s, n, &i)) return false;
        if (key_is(s + k0, k1 - k0, key)) {
            *v0 = a;
            *v1 = i;
            found = true;
        }
        i = skip_ws(s, n, i);
        if (i < n && s[i] == '}') return found;
        if (i >= n || s[i] != ',') return false;
        i = skip_ws(s, n, i + 1);
    }
    return false;
}

static char *dup_bytes(const char *s, size_t n)
{
    size_t sz;
    if (ms_add_overflow(n, 1, &sz)) return NULL;
    char *d = malloc(sz);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int keep_call(struct output_parser *p, const char *name, size_t name_len, const char *args,
                     size_t args_len)
{
    if (p->n_calls == p->cap_calls) {
        if (p->cap_calls > (INT32_MAX >> 1)) return MS_ENOMEM;
        int cap = p->cap_calls ? p->cap_calls * 2 : 4;
        size_t bytes;
        if (ms_mul_overflow((size_t)cap, sizeof(struct call), &bytes)) return MS_ENOMEM;
        struct call *c = realloc(p->calls, bytes);
        if (!c) return MS_ENOMEM;
        p->calls = c;
        p->cap_calls = cap;
    }
    struct call *c = &p->calls[p->n_calls];
    *c = (struct call){0};
    c->name = dup_bytes(name, name_len);
    c->args = dup_bytes(args, args_len);
    if (!c->name || !c->args) {
        free(c->name);
        free(c->args);
        return MS_ENOMEM;
    }
    c->name_len = name_len;
    c->args_len = args_len;
    int index = p->n_calls;
    if (p->o.make_id) p->o.make_id(p->o.make_id_ctx, index, c->id, sizeof c->id);
    else snprintf(c->id, sizeof c->id, "call_%d", index);
    c->id[sizeof c->id - 1] = 0;
    p->n_calls++;
    int rc = push_rec(p, OUTPUT_EVENT_TOOL_BEGIN, index, 0, 0);
    return rc ? rc : push_rec(p, OUTPUT_EVENT_TOOL_ARGS, index, 0, args_len);
}

// ---- Qwen3-Coder's XML calls ------------------------------------------------------------

// The schema the tools give parameter key of function name (its
// parameters' "properties", or as vLLM does the parameters object itself
// when it has none): NULL when the tool or the key is not there.
static const json_t *xml_param_schema(const json_t *tools, const char *name, size_t name_len, const char *key,
                                      size_t key_len)
{
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *fn = json_object_get(f, "name");
        if (!json_is_string(fn) || json_string_length(fn) != name_len || memcmp(json_string_value(fn), name, name_len))
            continue;
        const json_t *params = json_object_get(f, "parameters");
        const json_t *props = json_object_get(params, "properties");
        if (!json_is_object(props)) props = params;
        char k[OUTPUT_PARSER_MAX_NAME + 1];
        if (!json_is_object(props) || key_len > OUTPUT_PARSER_MAX_NAME) return NULL;
        memcpy(k, key, key_len);
        k[key_len] = 0;
        return json_object_get(props, k);
    }
    return NULL;
}

static bool starts_ci(const char *s, const char *prefix)
{
    for (; *prefix; s++, prefix++)
        if (tolower((unsigned char)*s) != *prefix) return false;
    return true;
}

// The type name of a parameter's schema, lowercased into out: its "type",
// the first that is not "null" of a list of them, or "string".
static void xml_type_name(const json_t *schema, char *out, size_t cap)
{
    const json_t *t = json_object_get(schema, "type");
    if (json_is_array(t)) {
        size_t i;
        const json_t *x, *pick = NULL;
        json_array_foreach(t, i, x) if (!pick && json_is_string(x) && strcmp(json_string_value(x), "null")) pick = x;
        t = pick;
    }
    const char *s = json_is_string(t) ? json_string_value(t) : "string";
    while (*s == ' ' || *s == '\t' || *s == '\n') s++;
    size_t n = 0;
    for (; s[n] && n + 1 < cap; n++) out[n] = (char)tolower((unsigned char)s[n]);
    while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\t' || out[n - 1] == '\n')) n--;
    out[n] = 0;
}

// One value as vLLM's qwen3_coder parser converts it (the header's rules);
// NULL when out of memory or the text is not valid UTF-8.
static json_t *xml_value(const char *v, size_t n, const json_t *schema)
{
    if (n == 4 && starts_ci(v, "null")) return json_null();
    if (!schema) return json_stringn(v, n);
    char type[32];
    xml_type_name(schema, type, sizeof type);
    static const char *const strings[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!strcmp(type, strings[i])) return json_stringn(v, n);
    // Numbers as Python's int() and float() read them: surrounding
    // whitespace allowed, decimal only (strtod would take hex), finite.
    char buf[64];
    size_t a = 0, z = n;
    while (a < z && isspace((unsigned char)v[a])) a++;
    while (z > a && isspace((unsigned char)v[z - 1])) z--;
    const bool small = z > a && z - a < sizeof buf && !memchr(v + a, 'x', z - a) && !memchr(v + a, 'X', z - a);
    if (small) {
        memcpy(buf, v + a, z - a);
        buf[z - a] = 0;
    }
    if (!strncmp(type, "int", 3) || !strncmp(type, "uint", 4) || !strncmp(type, "long", 4) ||
        !strncmp(type, "short", 5) || !strncmp(type, "unsigned", 8)) {
        char *end;
        errno = 0;
        const long long x = small ? strtoll(buf, &end, 10) : 0;
        if (small && !errno && end != buf && !*end) return json_integer(x);
        return json_stringn(v, n);
    }
    if (!strncmp(type, "num", 3) || !strncmp(type, "float", 5)) {
        char *end;
        const double x = small ? strtod(buf, &end) : 0;
        if (small && end != buf && !*end && isfinite(x))
            // Whole ones as integers, as vLLM's int(float(v)) writes them (within int64).
            return x == floor(x) && fabs(x) < 9.2e18 ? json_integer((json_int_t)x) : json_real(x);
        return json_stringn(v, n);
    }
    if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary"))
        return json_boolean(n == 4 && starts_ci(v, "true"));
    // Objects and arrays, and any other type: its JSON when it parses, else
    // its value as a Python literal ({'k': True}: vLLM's ast.literal_eval).
    json_t *j = json_loadb_wide(v, n, JSON_DECODE_ANY);
    if (!j) j = py_literal_parse(v, n);
    return j ? j : json_stringn(v, n);
}

// s[0..n), trimmed, begins "<function=": 1 kept (or dropped past
// max_calls), 0 not a call, or a negative status.
static int try_xml_call(struct output_parser *p, const char *s, size_t n)
{
    static const char FN[] = "<function=", FN_END[] = "</function>", PAR[] = "<parameter=",
                      PAR_END[] = "</parameter>";
    const char *name = s + strlen(FN), *end = s + n;
    const char *gt = memchr(name, '>', (size_t)(end - name));
    const size_t name_len = gt ? (size_t)(gt - name) : 0;
    if (!name_len || name_len > OUTPUT_PARSER_MAX_NAME || memchr(name, '\n', name_len) ||
        utf8_valid_prefix((const uint8_t *)name, name_len) != name_len || memchr(name, 0, name_len))
        return 0;
    const char *body = gt + 1, *fend = memmem(body, (size_t)(end - body), FN_END, strlen(FN_END));
    if (fend && skip_ws(fend, (size_t)(end - fend), strlen(FN_END)) != (size_t)(end - fend)) return 0;
    if (!fend) fend = end;
    json_t *args = json_object();
    if (!args) return MS_ENOMEM;
    int rc = 0;
    for (const char *q = body; rc == 0 && (q = memmem(q, (size_t)(fend - q), PAR, strlen(PAR)));) {
        const char *key = q + strlen(PAR), *kgt = memchr(key, '>', (size_t)(fend - key));
        if (!kgt) break;
        const char *v = kgt + 1;
        const char *close = memmem(v, (size_t)(fend - v), PAR_END, strlen(PAR_END));
        const char *next = memmem(v, (size_t)(fend - v), PAR, strlen(PAR));
        const char *vend = close && (!next || close < next) ? close : next ? next : fend;
        q = vend == close ? close + strlen(PAR_END) : vend;
        size_t vl = (size_t)(vend - v);
        if (vl && v[0] == '\n') v++, vl--;
        if (vl && v[vl - 1] == '\n') vl--;
        const size_t kl = (size_t)(kgt - key);
        json_t *val = kl ? xml_value(v, vl, xml_param_schema(p->o.tool_defs, name, name_len, key, kl)) : NULL;
        // A key or value that is not UTF-8 (or no memory for it): not a call.
        if (!val || json_object_setn_new(args, key, kl, val)) rc = 1;
    }
    // As vLLM writes them: Python's json.dumps (floats as repr: 0.1, not 0.10000000000000001).
    char *text = rc ? NULL : json_dumps_py(args);
    json_decref(args);
    if (rc) return 0;
    if (!text) return MS_ENOMEM;
    if (p->o.max_calls <= 0 || p->n_calls < p->o.max_calls) rc = keep_call(p, name, name_len, text, strlen(text));
    free(text);
    return rc ? rc : 1;
}

// Keeps the call whose body is s[0..n) when it has the shape the header
// describes: 1 kept, 0 not a call (it becomes content), or a negative status.
static int try_call(struct output_parser *p, const char *s, size_t n)
{
    size_t lead = skip_ws(s, n, 0);
    s += lead;
    n -= lead;
    n -= trailing_ws(s, n);
    if (!n) return 0;
    if (p->o.tool_format == OUTPUT_TOOLS_QWEN3_XML && n > 10 && !memcmp(s, "<function=", 10))
        return try_xml_call(p, s, n);
    json_t *root = json_loadb(s, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
    json_t *name = json_object_get(root, "name");
    json_t *args = json_object_get(root, "arguments");
    size_t name_len = json_string_length(name), a0 = 0, a1 = 0;
    int rc = 0;
    if (json_is_object(root) && json_is_string(name) && json_is_object(args) && name_len > 0 &&
        name_len <= OUTPUT_PARSER_MAX_NAME && !memchr(json_string_value(name), 0, name_len) &&
        member_span(s, n, "arguments", &a0, &a1)) {
        // Past max_calls the call is consumed as a kept one would be, and dropped.
        if (p->o.max_calls <= 0 || p->n_calls < p->o.max_calls)
            rc = keep_call(p, json_string_value(name), name_len, s + a0, a1 - a0);
        if (!rc) rc = 1;
    }
    json_decref(root);
    return rc;
}

// ---- the states -------------------------------------------------------------------------

// Each step decides what it can of the undecided bytes and returns 1 when it
// changed state (run the next step), 0 when it needs more bytes (with final:
// when everything is emitted), or a negative status.
struct state_desc;
typedef int (*step_fn)(struct output_parser *p, const struct state_desc *d, bool final);
struct state_desc {
    step_fn step;
    const struct tag *tag;         // what the state looks for
    enum output_event_kind kind;   // what its text is
    enum pstate next;              // where the tag leads
    bool tag_is_text;              // the tag itself is emitted as text
};

static enum pstate content_state(const struct output_parser *p)
{
    return p->o.tools ? ST_CONTENT : ST_PLAIN;
}

static int step_start(struct output_parser *p, const struct state_desc *d, bool final)
{
    size_t len;
    const char *s = undecided(p, &len);
    size_t n = len < d->tag->len ? len : d->tag->len;
    if (memcmp(s, d->tag->s, n) || (final && len < d->tag->len)) {
        p->state = p->o.start_in_reasoning ? ST_REASON : content_state(p);
        return 1;
    }
    if (len < d->tag->len) return 0;
    consume(p, d->tag->len);
    p->state = ST_REASON;
    return 1;
}

// Reasoning, plain content and a failed call's raw text: text up to a tag.
static int step_text(struct output_parser *p, const struct state_desc *d, bool final)
{
    size_t len;
    const char *s = undecided(p, &len);
    const char *hit = d->tag ? memmem(s, len, d->tag->s, d->tag->len) : NULL;
    if (hit) {
        size_t i = (size_t)(hit - s), through = i + d->tag->len;
        int rc = emit_text(p, d->kind, s, d->tag_is_text ? through : i);
        if (rc) return rc;
        consume(p, through);
        p->state = d->next == ST_CONTENT ? content_state(p) : d->next;
        return 1;
    }
    size_t n = decided_len(s, len, d->tag, final);
    int rc = emit_text(p, d->kind, s, n);
    if (rc) return rc;
    consume(p, n);
    return 0;
}

// Content with tool parsing on. Whitespace is held at the front of the
// undecided bytes (ws_len) until what follows it is known: text (emit it), a
// kept call (drop it), the end after a kept call (drop it).
static int step_content(struct output_parser *p, const struct state_desc *d, bool final)
{
    size_t len, w = p->ws_len;
    const char *s = undecided(p, &len);
    const char *hit = memmem(s + w, len - w, d->tag->s, d->tag->len);
    if (hit) {
        size_t i = (size_t)(hit - s);
        size_t j = i - trailing_ws(s + w, i - w);
        if (j > w) {
            int rc = emit_text(p, d->kind, s, j);
            if (rc) return rc;
            consume(p, j);
            i -= j;
        }
        p->ws_len = i;
        p->scan = 0;
        p->state = ST_CALL;
        return 1;
    }
    if (final) {
        size_t n = p->n_calls > 0 ? len - trailing_ws(s, len) : len;
        int rc = emit_text(p, d->kind, s, n);
        if (rc) return rc;
        consume(p, len);
        p->ws_len = 0;
        return 0;
    }
    size_t dl = w + decided_len(s + w, len - w, d->tag, false);
    size_t j = dl - trailing_ws(s + w, dl - w);
    if (j > w) {
        int rc = emit_text(p, d->kind, s, j);
        if (rc) return rc;
        consume(p, j);
        p->ws_len = dl - j;
    } else {
        p->ws_len = dl;
    }
    return 0;
}

// Inside <tool_call>: wait for </tool_call>, the end, or too many bytes.
static int step_call(struct output_parser *p, const struct state_desc *d, bool final)
{
    size_t len;
    const char *s = undecided(p, &len);
    size_t b = p->ws_len + TAG_CALL.len, bl = len - b, max = p->o.max_call_bytes;
    const char *body = s + b;
    const char *hit = memmem(body + p->scan, bl - p->scan, d->tag->s, d->tag->len);
    int kept = 0;
    if (hit) {
        size_t r = (size_t)(hit - body);
        if (r <= max && (kept = try_call(p, body, r)) < 0) return kept;
        if (kept) consume(p, b + r + d->tag->len);
    } else if (bl >= d->tag->len && bl - (d->tag->len - 1) > max) {
        kept = 0; // no </tool_call> can start within max bytes any more
    } else if (final) {
        if (bl <= max && (kept = try_call(p, body, bl)) < 0) return kept;
        if (kept) consume(p, len);
    } else {
        p->scan = bl >= d->tag->len ? bl - (d->tag->len - 1) : 0;
        return 0;
    }
    if (!kept) { // content: the held whitespace, the tag, and (in ST_RAW) the body
        int rc = emit_text(p, OUTPUT_EVENT_CONTENT, s, b);
        if (rc) return rc;
        consume(p, b);
    }
    p->ws_len = 0;
    p->state = kept ? ST_CONTENT : ST_RAW;
    return 1;
}

static const struct state_desc STATES[] = {
    [ST_START] = {step_start, &TAG_THINK, OUTPUT_EVENT_REASONING, ST_REASON, false},
    [ST_REASON] = {step_text, &TAG_END_THINK, OUTPUT_EVENT_REASONING, ST_CONTENT, false},
    [ST_PLAIN] = {step_text, NULL, OUTPUT_EVENT_CONTENT, ST_PLAIN, false},
    [ST_CONTENT] = {step_content, &TAG_CALL, OUTPUT_EVENT_CONTENT, ST_CALL, false},
    [ST_CALL] = {step_call, &TAG_END_CALL, OUTPUT_EVENT_CONTENT, ST_CONTENT, false},
    [ST_RAW] = {step_text, &TAG_END_CALL, OUTPUT_EVENT_CONTENT, ST_CONTENT, true},
};

// ---- the public interface -------------------------------------------------------------

int output_parser_create(const struct output_parser_opts *opts, struct output_parser **out,
                         char *err, size_t errlen)
{
    *out = NULL;
    if (!opts) return ms_err(err, errlen, MS_EINVAL, "output parser: no options");
    struct output_parser *p = calloc(1, sizeof *p);
    if (!p) return ms_err(err, errlen, MS_ENOMEM, "output parser: out of memory");
    p->o = *opts;
    if (!p->o.max_call_bytes) p->o.max_call_bytes = OUTPUT_PARSER_DEFAULT_MAX_CALL;
    p->state = p->o.reasoning ? ST_START : content_state(p);
    *out = p;
    return 0;
}

void output_parser_destroy(struct output_parser *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].args);
    }
    free(p->calls);
    free(p->recs);
    free(p->events);
    bytes_free(&p->pend);
    bytes_free(&p->content);
    bytes_free(&p->reasoning);
    free(p);
}

static void resolve_events(struct output_parser *p, const struct output_event **ev, size_t *n_ev)
{
    for (size_t i = 0; i < p->n_recs; i++) {
        const struct ev_rec *r = &p->recs[i];
        struct output_event *e = &p->events[i];
        *e = (struct output_event){.kind = r->kind, .index = r->index, .len = r->len};
        switch (r->kind) {
        case OUTPUT_EVENT_REASONING: e->text = p->reasoning.p + r->off; break;
        case OUTPUT_EVENT_CONTENT: e->text = p->content.p + r->off; break;
        case OUTPUT_EVENT_TOOL_BEGIN:
            e->text = p->calls[r->index].name;
            e->len = p->calls[r->index].name_len;
            e->id = p->calls[r->index].id;
            break;
        case OUTPUT_EVENT_TOOL_ARGS: e->text = p->calls[r->index].args + r->off; break;
        }
    }
    *ev = p->n_recs ? p->events : NULL;
    *n_ev = p->n_recs;
}

static int run(struct output_parser *p, bool final, const struct output_event **ev, size_t *n_ev,
               char *err, size_t errlen)
{
    int rc;
    while ((rc = STATES[p->state].step(p, &STATES[p->state], final)) > 0) {}
    if (rc < 0) {
        p->spent = true;
        return ms_err(err, errlen, rc, "output parser: out of memory");
    }
    if (final && p->pend.len != p->pos) {
        p->spent = true;
        return ms_err(err, errlen, MS_EINTERNAL, "output parser: %zu bytes left undecided at the end",
                      p->pend.len - p->pos);
    }
    resolve_events(p, ev, n_ev);
    return 0;
}

static int check_usable(struct output_parser *p, const struct output_event **ev, size_t *n_ev,
                        char *err, size_t errlen)
{
    *ev = NULL;
    *n_ev = 0;
    p->n_recs = 0;
    if (p->spent) return ms_err(err, errlen, MS_EINVAL, "output parser: used after a failure");
    if (p->finished) return ms_err(err, errlen, MS_EINVAL, "output parser: used after finish");
    return 0;
}

int output_parser_feed(struct output_parser *p, const char *text, size_t n,
                       const struct output_event **ev, size_t *n_ev, char *err, size_t errlen)
{
    int rc = check_usable(p, ev, n_ev, err, errlen);
    if (rc) return rc;
    if (!text && n) return ms_err(err, errlen, MS_EINVAL, "output parser: NULL text");
    if (p->pos && p->pos >= p->pend.len - p->pos) { // compact when the dead front outweighs the rest
        memmove(p->pend.p, p->pend.p + p->pos, p->pend.len - p->pos);
        p->pend.len -= p->pos;
        p->pos = 0;
    }
    if (bytes_put(&p->pend, text, n)) {
        p->spent = true;
        return ms_err(err, errlen, MS_ENOMEM, "output parser: out of memory holding %zu bytes",
                      p->pend.len);
    }
    return run(p, false, ev, n_ev, err, errlen);
}

int output_parser_finish(struct output_parser *p, const struct output_event **ev, size_t *n_ev,
                         char *err, size_t errlen)
{
    int rc = check_usable(p, ev, n_ev, err, errlen);
    if (rc) return rc;
    p->finished = true;
    return run(p, true, ev, n_ev, err, errlen);
}

size_t output_parser_held(const struct output_parser *p)
{
    return p->pend.len - p->pos;
}

bool output_parser_in_call(const struct output_parser *p)
{
    return p->state == ST_CALL;
}

int output_parser_n_calls(const struct output_parser *p)
{
    return p->n_calls;
}

int output_parser_call(const struct output_parser *p, int i, struct output_call *out)
{
    if (i < 0 || i >= p->n_calls) return MS_EINVAL;
    const struct call *c = &p->calls[i];
    *out = (struct output_call){c->id, c->name, c->name_len, c->args, c->args_len};
    return 0;
}

const char *output_parser_content(const struct output_parser *p, size_t *len)
{
    *len = p->content.len;
    return p->content.p ? p->content.p : "";
}

const char *output_parser_reasoning(const struct output_parser *p, size_t *len)
{
    *len = p->reasoning.len;
    return p->reasoning.p ? p->reasoning.p : "";
}

const char *output_parser_finish_reason(const struct output_parser *p, const char *engine_reason)
{
    if (p->n_calls > 0 && engine_reason && !strcmp(engine_reason, "stop")) return "tool_calls";
    return engine_reason;
}

bool output_parser_prompt_in_reasoning(const char *prompt, size_t len)
{
    if (!prompt) return false;
    len -= trailing_ws(prompt, len);
    return len >= TAG_THINK.len && !memcmp(prompt + len - TAG_THINK.len, TAG_THINK.s, TAG_THINK.len);
}

// ---- JSON ---------------------------------------------------------------------------------

// Sets key to a string of s[0..n), or null when empty. 0 or MS_ENOMEM.
static int set_text_or_null(json_t *obj, const char *key, const char *s, size_t n)
{
    return json_object_set_new(obj, key, n ? json_stringn(s, n) : json_null()) ? MS_ENOMEM : 0;
}

static json_t *call_json(const char *id, const char *name, size_t name_len, const char *args,
                         size_t args_len)
{
    json_t *fn = json_object(), *c = json_object();
    if (!fn || !c || json_object_set_new(c, "id", json_string(id)) ||
        json_object_set_new(c, "type", json_string("function")) ||
        json_object_set_new(fn, "name", json_stringn(name, name_len)) ||
        json_object_set_new(fn, "arguments", json_stringn(args, args_len)) ||
        json_object_set(c, "function", fn)) {
        json_decref(c);
        c = NULL;
    }
    json_decref(fn);
    return c;
}

json_t *output_parser_tool_calls_json(const struct output_parser *p)
{
    json_t *a = json_array();
    for (int i = 0; a && i < p->n_calls; i++) {
        const struct call *c = &p->calls[i];
        if (json_array_append_new(a, call_json(c->id, c->name, c->name_len, c->args, c->args_len))) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

int output_parser_message_fill(const struct output_parser *p, json_t *message,
                               bool include_reasoning)
{
    if (set_text_or_null(message, "content", p->content.p, p->content.len)) return MS_ENOMEM;
    if (include_reasoning &&
        (set_text_or_null(message, "reasoning_content", p->reasoning.p, p->reasoning.len) ||
         set_text_or_null(message, "reasoning", p->reasoning.p, p->reasoning.len)))
        return MS_ENOMEM;
    if (p->n_calls > 0 && json_object_set_new(message, "tool_calls", output_parser_tool_calls_json(p)))
        return MS_ENOMEM;
    return 0;
}

// The tool_calls entry of this delta for call index, created on first use.
static json_t *delta_call(json_t *calls, int index)
{
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        if (json_integer_value(json_object_get(c, "index")) == index) return c;
    }
    json_t *fn = json_object();
    c = json_object();
    bool ok = fn && c && !json_object_set_new(c, "index", json_integer(index)) &&
              !json_object_set(c, "function", fn);
    json_decref(fn);
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return json_array_append_new(calls, c) ? NULL : c; // a failed append releases c
}

static int delta_call_event(json_t *calls, const struct output_event *e)
{
    json_t *c = delta_call(calls, e->index);
    json_t *fn = json_object_get(c, "function");
    if (!fn) return MS_ENOMEM;
    if (e->kind == OUTPUT_EVENT_TOOL_BEGIN) {
        // id and type go before function, as OpenAI orders them
        json_t *moved = json_incref(fn);
        int bad = json_object_del(c, "function") || json_object_set_new(c, "id", json_string(e->id)) ||
                  json_object_set_new(c, "type", json_string("function")) ||
                  json_object_set_new(c, "function", moved);
        if (bad) return MS_ENOMEM;
        if (json_object_set_new(fn, "name", json_stringn(e->text, e->len))) return MS_ENOMEM;
        if (json_object_get(fn, "arguments")) return 0;
        return json_object_set_new(fn, "arguments", json_string("")) ? MS_ENOMEM : 0;
    }
    json_t *old = json_object_get(fn, "arguments"); // NULL reads as "" 
    struct bytes b = {0};
    int rc = bytes_put(&b, json_string_value(old), json_string_length(old));
    if (!rc) rc = bytes_put(&b, e->text, e->len);
    if (!rc && json_object_set_new(fn, "arguments", json_stringn(b.p, b.len))) rc = MS_ENOMEM;
    bytes_free(&b);
    return rc;
}

int output_events_delta_fill(json_t *delta, const struct output_event *ev, size_t n_ev,
                             bool include_reasoning)
{
    struct bytes text[2] = {{0}, {0}}; // content, reasoning
    json_t *calls = NULL;
    int rc = 0;
    for (size_t i = 0; i < n_ev && !rc; i++) {
        const struct output_event *e = &ev[i];
        if (e->kind == OUTPUT_EVENT_CONTENT || e->kind == OUTPUT_EVENT_REASONING) {
            rc = bytes_put(&text[e->kind == OUTPUT_EVENT_REASONING], e->text, e->len);
            continue;
        }
        if (!calls && !(calls = json_array())) rc = MS_ENOMEM;
        if (!rc) rc = delta_call_event(calls, e);
    }
    if (!rc && text[1].len && include_reasoning &&
        (set_text_or_null(delta, "reasoning_content", text[1].p, text[1].len) ||
         set_text_or_null(delta, "reasoning", text[1].p, text[1].len)))
        rc = MS_ENOMEM;
    if (!rc && text[0].len && set_text_or_null(delta, "content", text[0].p, text[0].len))
        rc = MS_ENOMEM;
    if (!rc && calls && json_object_set(delta, "tool_calls", calls)) rc = MS_ENOMEM;
    json_decref(calls);
    bytes_free(&text[0]);
    bytes_free(&text[1]);
    return rc;
}
