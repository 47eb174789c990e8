// openai_build: the JSON of chat.completion, text_completion, their stream
// chunks, usage and logprobs (chat and legacy shapes), response ids, and the
// error envelope.
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api/openai.h"
#include "base/base.h"

// ---- UTF-8 -----------------------------------------------------------------------

// Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes there
// do not start one; *maximal receives how many bytes form the maximal
// invalid subpart to replace (at least 1) in that case.
static int utf8_seq(const uint8_t *s, size_t n, size_t *maximal)
{
    uint8_t c = s[0];
    *maximal = 1;
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c == 0xe0) need = 2, lo = 0xa0;
    else if (c >= 0xe1 && c <= 0xec) need = 2;
    else if (c == 0xed) need = 2, hi = 0x9f;
    else if (c >= 0xee && c <= 0xef) need = 2;
    else if (c == 0xf0) need = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3) need = 3;
    else if (c == 0xf4) need = 3, hi = 0x8f;
    else return 0;
    // The second byte has a narrower range for some leads; later ones are 80..BF.
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xbf;
        if (b < l || b > h) return 0;
        *maximal = (size_t)i + 1;
    }
    return need + 1;
}

size_t oa_utf8_lossy(const uint8_t *in, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t maximal;
        int k = utf8_seq(in + i, len - i, &maximal);
        if (k > 0) {
            memcpy(out + o, in + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            // maximal counts the lead plus the continuation bytes that fitted.
            size_t skip = maximal;
            if (skip > len - i) skip = len - i;
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += skip;
        }
    }
    out[o] = 0;
    return o;
}

long oa_utf8_chars(const char *s, size_t len)
{
    long n = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80) n++;
    return n;
}

// ---- errors ------------------------------------------------------------------

int oa_http_status(int ms_status)
{
    switch (ms_status) {
    case MS_OK: return 200;
    case MS_EINVAL:
    case MS_EFORMAT:
    case MS_ETOOLONG:
    case MS_EUNSUPPORTED:
    case MS_ENOFIT: return 400;
    case MS_ENOTFOUND: return 404;
    case MS_EBUSY: return 503;
    default: return 500;
    }
}

// OpenAI's own types: every client error is an invalid_request_error (the
// code says which), every server error a server_error.
static const char *type_for_http(int http)
{
    return http >= 500 ? "server_error" : "invalid_request_error";
}

// The length of s's prefix that ends on a character boundary: a cut inside
// a UTF-8 character (snprintf's at the buffer's end, a %.40s in a format)
// leaves a lead byte without all its continuation bytes at the end.
static size_t utf8_whole_prefix(const char *s, size_t n)
{
    size_t i = n, back = 0;
    while (i && back < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) {
        i--;
        back++;
    }
    if (!i) return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    return want > back + 1 && lead >= 0xc2 && lead <= 0xf4 ? i - 1 : n;
}

static void error_fill(struct oa_error *e, int http, const char *code, const char *param,
                       const char *fmt, va_list ap)
{
    e->http = http;
    e->type = type_for_http(http);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->param[utf8_whole_prefix(e->param, strlen(e->param))] = 0;
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    e->message[utf8_whole_prefix(e->message, strlen(e->message))] = 0;
}

int oa_errorf(struct oa_error *e, int status, const char *code, const char *param,
              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    e->status = status;
    error_fill(e, oa_http_status(status), code, param, fmt, ap);
    va_end(ap);
    return status;
}

void oa_error_http(struct oa_error *e, int http, const char *code, const char *param,
                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    e->status = http >= 500 ? MS_EINTERNAL : MS_EINVAL;
    error_fill(e, http, code, param, fmt, ap);
    va_end(ap);
}

// A JSON string of s that cannot fail on its bytes: what is not valid UTF-8
// (a quoted client string cut anywhere, jansson's own error text quoting the
// bad bytes) becomes U+FFFD. json_string() would return NULL instead, and the
// field would silently vanish from the envelope.
static json_t *lossy_string(const char *s)
{
    size_t n = strlen(s);
    size_t cap;
    if (ms_mul_overflow(n, 3, &cap) || ms_add_overflow(cap, 1, &cap)) return NULL;
    char *clean = malloc(cap);
    if (!clean) return NULL;
    size_t len = oa_utf8_lossy((const uint8_t *)s, n, clean);
    json_t *j = json_stringn_nocheck(clean, len);
    free(clean);
    return j;
}

json_t *oa_error_json(const struct oa_error *e)
{
    json_t *inner = json_object();
    json_t *root = json_object();
    json_t *message = lossy_string(e->message[0] ? e->message : "error");
    json_t *param = e->param[0] ? lossy_string(e->param) : json_null();
    // Every field or none: an envelope without its message is worse than
    // the caller's fixed out-of-memory answer.
    if (!inner || !root || !message || !param) {
        json_decref(message);
        json_decref(param);
        json_decref(inner);
        json_decref(root);
        return NULL;
    }
    // Each set takes its value's reference, also when it fails.
    int bad = json_object_set_new(inner, "message", message);
    bad |= json_object_set_new(inner, "type", json_string(e->type ? e->type : type_for_http(e->http)));
    bad |= json_object_set_new(inner, "param", param);
    bad |= json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
    bad |= json_object_set_new(root, "error", inner);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

// ---- ids ---------------------------------------------------------------------------

void oa_make_id(char *out, size_t outlen, const char *prefix)
{
    static _Atomic uint64_t counter;
    uint8_t r[12];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        // No entropy yet (early boot): still unique within the process.
        uint64_t c = atomic_fetch_add(&counter, 1) + 1;
        uint64_t t = (uint64_t)ms_unix_time();
        memcpy(r, &c, 8);
        memcpy(r + 8, &t, 4);
    }
    int at = snprintf(out, outlen, "%s", prefix);
    for (size_t i = 0; i < sizeof r && at >= 0 && (size_t)at + 2 < outlen; i++)
        at += snprintf(out + at, outlen - (size_t)at, "%02x", r[i]);
}

// ---- pieces --------------------------------------------------------------------------

// JSON cannot carry -inf; vLLM writes -9999.0 for it, and so do we.
static json_t *lp_json(float lp)
{
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

// The token's bytes as text (invalid UTF-8 as U+FFFD), cut to fit cap.
static size_t token_text(const struct tokenizer *tok, int32_t id, char *out, size_t cap)
{
    size_t len = 0;
    const uint8_t *b = tok ? tok_token_bytes(tok, id, &len) : NULL;
    if (!b) len = 0;
    if (3 * len + 1 > cap) len = (cap - 1) / 3;
    return oa_utf8_lossy(b ? b : (const uint8_t *)"", len, out);
}

size_t oa_token_str(const struct oa_meta *m, int32_t id, char *out, size_t cap)
{
    if (cap == 0) return 0;
    if (m->tokens_as_ids || !m->tok) {
        int n = snprintf(out, cap, "token_id:%d", (int)id);
        return n < 0 ? 0 : ((size_t)n >= cap ? cap - 1 : (size_t)n);
    }
    return token_text(m->tok, id, out, cap);
}

// The bytes a chat logprob entry lists: the token's raw bytes (OpenAI's
// meaning), or those of its "token_id:N" name.
static json_t *bytes_json(const struct oa_meta *m, int32_t id, const char *str, size_t slen)
{
    json_t *arr = json_array();
    if (!arr) return NULL;
    size_t len = slen;
    const uint8_t *b = (const uint8_t *)str;
    if (!m->tokens_as_ids && m->tok) {
        b = tok_token_bytes(m->tok, id, &len);
        if (!b) len = 0;
    }
    for (size_t i = 0; i < len; i++) json_array_append_new(arr, json_integer(b[i]));
    return arr;
}

#define TOKSTR_CAP 1024

static json_t *chat_lp_entry(const struct oa_meta *m, int32_t id, float lp)
{
    char s[TOKSTR_CAP];
    size_t n = oa_token_str(m, id, s, sizeof s);
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "token", json_stringn(s, n));
    json_object_set_new(o, "logprob", lp_json(lp));
    json_object_set_new(o, "bytes", bytes_json(m, id, s, n));
    return o;
}

json_t *oa_chat_logprobs(const struct oa_meta *m, const struct oa_token *t, int n)
{
    json_t *content = json_array();
    json_t *root = json_object();
    if (!content || !root) {
        json_decref(content);
        json_decref(root);
        return NULL;
    }
    int k = m->logprobs < 0 ? 0 : m->logprobs;
    for (int i = 0; i < n; i++) {
        json_t *e = chat_lp_entry(m, t[i].id, t[i].logprob);
        json_t *top = json_array();
        int nt = t[i].n_top < k ? t[i].n_top : k;
        for (int j = 0; j < nt; j++)
            json_array_append_new(top, chat_lp_entry(m, t[i].top[j].id, t[i].top[j].logprob));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(content, e);
    }
    json_object_set_new(root, "content", content);
    return root;
}

static json_t *prompt_lp_entry(const struct oa_meta *m, int32_t id, float lp, int32_t rank)
{
    // The token's own text, as the tokenizer decodes it alone (vLLM's
    // decoded_token; return_tokens_as_token_ids does not reach it).
    char s[TOKSTR_CAP];
    const size_t n = token_text(m->tok, id, s, sizeof s);
    return json_pack("{s:o, s:i, s:s%}", "logprob", lp_json(lp), "rank", (json_int_t)rank, "decoded_token",
                     s, n);
}

json_t *oa_prompt_logprobs(const struct oa_meta *m, const struct oa_token *t, int n)
{
    json_t *list = json_array();
    if (!list) return NULL;
    const int k = m->prompt_logprobs < 0 ? 0 : m->prompt_logprobs;
    char key[16];
    for (int i = 0; i < n; i++) {
        json_t *d = t[i].has_logprob ? json_object() : json_null();
        if (!d || json_array_append_new(list, d)) {
            json_decref(list);
            return NULL;
        }
        if (!t[i].has_logprob) continue;
        snprintf(key, sizeof key, "%d", (int)t[i].id);
        json_object_set_new(d, key, prompt_lp_entry(m, t[i].id, t[i].logprob, t[i].rank));
        const int nt = t[i].n_top < k ? t[i].n_top : k;
        for (int j = 0; j < nt; j++) {
            snprintf(key, sizeof key, "%d", (int)t[i].top[j].id);
            json_object_set_new(d, key, prompt_lp_entry(m, t[i].top[j].id, t[i].top[j].logprob, j + 1));
        }
    }
    return list;
}

json_t *oa_legacy_logprobs(const struct oa_meta *m, const struct oa_token *t, int n,
                           long *text_offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array(), *root = json_object();
    if (!tokens || !lps || !tops || !offs || !root) {
        json_decref(tokens);
        json_decref(lps);
        json_decref(tops);
        json_decref(offs);
        json_decref(root);
        return NULL;
    }
    int k = m->logprobs < 0 ? 0 : m->logprobs;
    char s[TOKSTR_CAP];
    for (int i = 0; i < n; i++) {
        size_t sl = oa_token_str(m, t[i].id, s, sizeof s);
        json_array_append_new(tokens, json_stringn(s, sl));
        json_array_append_new(offs, json_integer(*text_offset));
        *text_offset += oa_utf8_chars(s, sl);
        if (!t[i].has_logprob) {
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, lp_json(t[i].logprob));
        // A dict keyed by token string: the alternatives plus the chosen
        // token, as vLLM gives them (equal strings collapse).
        json_t *top = json_object();
        int nt = t[i].n_top < k ? t[i].n_top : k;
        for (int j = 0; j < nt; j++) {
            char a[TOKSTR_CAP];
            size_t al = oa_token_str(m, t[i].top[j].id, a, sizeof a);
            if (!json_object_getn(top, a, al))
                json_object_setn_new(top, a, al, lp_json(t[i].top[j].logprob));
        }
        if (!json_object_getn(top, s, sl)) json_object_setn_new(top, s, sl, lp_json(t[i].logprob));
        json_array_append_new(tops, top);
    }
    json_object_set_new(root, "tokens", tokens);
    json_object_set_new(root, "token_logprobs", lps);
    json_object_set_new(root, "top_logprobs", tops);
    json_object_set_new(root, "text_offset", offs);
    return root;
}

json_t *oa_usage_json(const struct oa_usage *u)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens));
    json_object_set_new(o, "total_tokens",
                        json_integer((json_int_t)u->prompt_tokens + u->completion_tokens));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(u->cached_tokens));
    json_object_set_new(o, "prompt_tokens_details", d);
    return o;
}

static json_t *envelope(const struct oa_meta *m, const char *object)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "id", json_string(m->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(m->created));
    json_object_set_new(o, "model", json_string(m->model));
    // OpenAI's backend configuration tag: clients read the key; moeserve has
    // no fingerprint to give (vLLM sends null too).
    json_object_set_new(o, "system_fingerprint", json_null());
    return o;
}

static json_t *stop_reason_json(const char *stop_str, int32_t stop_id)
{
    if (stop_str) return json_string(stop_str);
    if (stop_id >= 0) return json_integer(stop_id);
    return json_null();
}

// ---- whole responses --------------------------------------------------------------------

json_t *oa_chat_response(const struct oa_meta *m, const struct oa_choice *c, int n,
                         const struct oa_usage *u)
{
    json_t *o = envelope(m, "chat.completion");
    json_t *choices = json_array();
    if (!o || !choices) {
        json_decref(o);
        json_decref(choices);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        json_t *ch = json_object(), *msg = json_object();
        json_object_set_new(ch, "index", json_integer(c[i].index));
        json_object_set_new(msg, "role", json_string("assistant"));
        if (c[i].message) {
            // The output parser's split: content (or null), reasoning, tool calls.
            json_object_update(msg, (json_t *)c[i].message); // read, not changed
        } else {
            json_object_set_new(msg, "content",
                                json_stringn(c[i].text ? c[i].text : "", c[i].text_len));
        }
        json_object_set_new(msg, "refusal", json_null());
        json_object_set_new(ch, "message", msg);
        json_object_set_new(ch, "logprobs", m->logprobs >= 0
                                                ? oa_chat_logprobs(m, c[i].tokens, c[i].n_tokens)
                                                : json_null());
        json_object_set_new(ch, "finish_reason", json_string(c[i].finish_reason));
        json_object_set_new(ch, "stop_reason", stop_reason_json(c[i].stop_str, c[i].stop_id));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", oa_usage_json(u));
    // vLLM's, beside the choices: every choice shares the one prompt.
    if (m->prompt_logprobs >= 0 && n > 0)
        json_object_set_new(o, "prompt_logprobs", oa_prompt_logprobs(m, c[0].prompt_tokens, c[0].n_prompt_tokens));
    return o;
}

json_t *oa_completion_response(const struct oa_meta *m, const struct oa_choice *c, int n,
                               const struct oa_usage *u)
{
    json_t *o = envelope(m, "text_completion");
    json_t *choices = json_array();
    if (!o || !choices) {
        json_decref(o);
        json_decref(choices);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(c[i].index));
        size_t total = c[i].echo_len + c[i].text_len;
        char *text = malloc(total + 1);
        if (!text) {
            json_decref(ch);
            json_decref(choices);
            json_decref(o);
            return NULL;
        }
        if (c[i].echo_len) memcpy(text, c[i].echo_text, c[i].echo_len);
        if (c[i].text_len) memcpy(text + c[i].echo_len, c[i].text, c[i].text_len);
        json_object_set_new(ch, "text", json_stringn(text, total));
        free(text);
        if (m->logprobs >= 0) {
            long off = 0;
            json_t *lp = oa_legacy_logprobs(m, c[i].echo_tokens, c[i].n_echo_tokens, &off);
            json_t *gen = oa_legacy_logprobs(m, c[i].tokens, c[i].n_tokens, &off);
            if (lp && gen) {
                const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
                for (size_t k = 0; k < 4; k++)
                    json_array_extend(json_object_get(lp, keys[k]), json_object_get(gen, keys[k]));
            }
            json_decref(gen);
            json_object_set_new(ch, "logprobs", lp ? lp : json_null());
        } else {
            json_object_set_new(ch, "logprobs", json_null());
        }
        json_object_set_new(ch, "finish_reason", json_string(c[i].finish_reason));
        json_object_set_new(ch, "stop_reason", stop_reason_json(c[i].stop_str, c[i].stop_id));
        if (m->prompt_logprobs >= 0)
            json_object_set_new(ch, "prompt_logprobs",
                                oa_prompt_logprobs(m, c[i].prompt_tokens, c[i].n_prompt_tokens));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", oa_usage_json(u));
    return o;
}

// ---- stream chunks ------------------------------------------------------------------------

json_t *oa_chat_chunk(const struct oa_meta *m, int index, const char *role, const char *text,
                      size_t text_len, const struct oa_token *tokens, int n_tokens,
                      const char *finish_reason, const char *stop_str, int32_t stop_id,
                      const struct oa_usage *usage)
{
    json_t *delta = json_object();
    if (!delta) return NULL;
    if (role) json_object_set_new(delta, "role", json_string(role));
    if (role || text_len) json_object_set_new(delta, "content", json_stringn(text ? text : "", text_len));
    return oa_chat_chunk_delta(m, index, delta, tokens, n_tokens, finish_reason, stop_str, stop_id,
                               usage);
}

json_t *oa_chat_chunk_delta(const struct oa_meta *m, int index, json_t *delta,
                            const struct oa_token *tokens, int n_tokens, const char *finish_reason,
                            const char *stop_str, int32_t stop_id, const struct oa_usage *usage)
{
    json_t *o = envelope(m, "chat.completion.chunk");
    json_t *choices = json_array(), *ch = json_object();
    if (!o || !choices || !ch || !delta) {
        json_decref(o);
        json_decref(choices);
        json_decref(ch);
        json_decref(delta);
        return NULL;
    }
    json_object_set_new(ch, "index", json_integer(index));
    json_object_set_new(ch, "delta", delta);
    json_object_set_new(ch, "logprobs", m->logprobs >= 0 && n_tokens > 0
                                            ? oa_chat_logprobs(m, tokens, n_tokens)
                                            : json_null());
    json_object_set_new(ch, "finish_reason", finish_reason ? json_string(finish_reason) : json_null());
    if (finish_reason) json_object_set_new(ch, "stop_reason", stop_reason_json(stop_str, stop_id));
    json_array_append_new(choices, ch);
    json_object_set_new(o, "choices", choices);
    if (usage) json_object_set_new(o, "usage", oa_usage_json(usage));
    return o;
}

json_t *oa_completion_chunk(const struct oa_meta *m, int index, const char *text, size_t text_len,
                            const struct oa_token *tokens, int n_tokens, long *text_offset,
                            const char *finish_reason, const char *stop_str, int32_t stop_id,
                            const struct oa_usage *usage)
{
    json_t *o = envelope(m, "text_completion");
    json_t *choices = json_array(), *ch = json_object();
    if (!o || !choices || !ch) {
        json_decref(o);
        json_decref(choices);
        json_decref(ch);
        return NULL;
    }
    json_object_set_new(ch, "index", json_integer(index));
    json_object_set_new(ch, "text", json_stringn(text ? text : "", text_len));
    json_object_set_new(ch, "logprobs", m->logprobs >= 0 && n_tokens > 0
                                            ? oa_legacy_logprobs(m, tokens, n_tokens, text_offset)
                                            : json_null());
    json_object_set_new(ch, "finish_reason", finish_reason ? json_string(finish_reason) : json_null());
    if (finish_reason) json_object_set_new(ch, "stop_reason", stop_reason_json(stop_str, stop_id));
    json_array_append_new(choices, ch);
    json_object_set_new(o, "choices", choices);
    if (usage) json_object_set_new(o, "usage", oa_usage_json(usage));
    return o;
}

json_t *oa_usage_chunk(const struct oa_meta *m, const char *object, const struct oa_usage *u)
{
    json_t *o = envelope(m, object);
    if (!o) return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", oa_usage_json(u));
    return o;
}
