// openai_parse: request bodies of chat, completions, tokenize and detokenize
// to validated structs; every parameter checked for type and range. A field
// is a row in its endpoint's table (or in the table chat and completions
// share): its name, type, range and where the value goes. (The error
// envelope is built in openai_build.c.)
#include <errno.h>
#include <float.h>
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai.h"
#include "base/base.h"
#include "base/json.h"

// ---- the parser state ----------------------------------------------------------

enum endpoint { EP_CHAT, EP_COMPLETION, EP_TOKENIZE, EP_DETOKENIZE };

// Fields whose presence matters after the pass (defaults, cross-field rules,
// required fields): the parser sets a field row's bit when the field is given
// and not null.
enum seen {
    SEEN_TEMPERATURE = 1 << 0,
    SEEN_TOP_P = 1 << 1,
    SEEN_TOP_K = 1 << 2,
    SEEN_MIN_P = 1 << 3,
    SEEN_REPETITION_PENALTY = 1 << 4,
    SEEN_MAX_TOKENS = 1 << 5,
    SEEN_MAX_COMPLETION_TOKENS = 1 << 6,
    SEEN_TOP_LOGPROBS = 1 << 7,
    SEEN_BEST_OF = 1 << 8,
    SEEN_ADD_SPECIAL_TOKENS = 1 << 9,
    SEEN_PROMPT = 1 << 10,
    SEEN_MESSAGES = 1 << 11,
    SEEN_TOKENS = 1 << 12,
    SEEN_N_PREDICT = 1 << 13,
};

struct parser {
    enum endpoint ep;
    struct oa_error *e;
    struct arena *a;
    const struct oa_limits *lim;
    void *req;                 // the endpoint's request struct (field rows' IN_REQUEST)
    struct oa_gen_params *gen; // NULL for tokenize/detokenize
    unsigned seen;             // enum seen
    // Values seen in the pass, resolved against each other afterwards.
    int max_tokens, max_completion_tokens, n_predict;
    bool chat_logprobs;
    int top_logprobs;
    json_t *stream_options;
    int best_of;
    // outputs by endpoint
    struct oa_chat_request *chat;
    struct oa_completion_request *cmpl;
    struct oa_tokenize_request *tokz;
    struct oa_detokenize_request *detok;
    char ignored[1024];
    size_t ignored_len;
};

static int oom(struct parser *p)
{
    return oa_errorf(p->e, MS_ENOMEM, "internal_error", NULL, "out of memory parsing the request");
}

static int type_error(struct parser *p, const char *key, const char *want, const json_t *v)
{
    return oa_errorf(p->e, MS_EINVAL, "invalid_type", key, "'%s' must be %s, got %s", key, want,
                     json_kind(v));
}

static int want_bool(struct parser *p, const char *key, json_t *v, bool *out)
{
    if (!json_is_boolean(v)) return type_error(p, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

// A number within [lo, hi]; lo_open excludes lo itself.
static int want_number(struct parser *p, const char *key, json_t *v, double lo, bool lo_open,
                       double hi, float *out)
{
    if (!json_is_number(v)) return type_error(p, key, "a number", v);
    double d = json_number_value(v);
    // Checked as the float the engine gets too: 1e-50 is above 0 as a
    // double but 0 as a float, which the engine would refuse under another
    // parameter's name.
    const float f = (float)d;
    if (!isfinite(d) || d > hi || d < lo || (lo_open && d == lo) || !isfinite(f) || (lo_open && f <= (float)lo)) {
        if (hi >= FLT_MAX)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key, "'%s' must be a finite number %s %g, got %.17g",
                             key, lo_open ? "greater than" : "at least", lo, d);
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                         "'%s' must be %s %g and at most %g, got %.17g", key,
                         lo_open ? "greater than" : "at least", lo, hi, d);
    }
    *out = f;
    return 0;
}

// An integer within [lo, hi]. A real with no fractional part counts (10.0),
// as Python clients sometimes send them.
static int want_int(struct parser *p, const char *key, json_t *v, long long lo, long long hi,
                    long long *out)
{
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18)
            return type_error(p, key, "an integer", v);
        x = (long long)d;
    } else {
        return type_error(p, key, "an integer", v);
    }
    if (x < lo || x > hi) {
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                         "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    }
    *out = x;
    return 0;
}

static int want_string(struct parser *p, const char *key, json_t *v, const char **out,
                       size_t *len)
{
    if (!json_is_string(v)) return type_error(p, key, "a string", v);
    size_t n = json_string_length(v);
    char *s = arena_strndup(p->a, json_string_value(v), n);
    if (!s) return oom(p);
    *out = s;
    if (len) *len = n;
    return 0;
}

// A token id for key (already formatted with its index), below bound (0: any).
static int want_token_id(struct parser *p, const char *key, json_t *v, int bound, int32_t *out)
{
    long long x;
    long long hi = bound > 0 ? bound - 1 : INT32_MAX;
    int rc = want_int(p, key, v, 0, hi, &x);
    if (rc) {
        if (p->e->code && !strcmp(p->e->code, "invalid_value"))
            oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                      "'%s' is %.17g, not a token id of this model (0 to %lld)", key,
                      json_number_value(v), hi);
        return rc;
    }
    *out = (int32_t)x;
    return 0;
}

// Ids that stand for text (prompts, detokenize) end where the tokenizer's do.
static int text_bound(const struct parser *p)
{
    return p->lim->text_vocab_size > 0 ? p->lim->text_vocab_size : p->lim->vocab_size;
}

// An array of token ids below bound; "what[i]" names each in errors.
static int ids_array(struct parser *p, const char *what, json_t *arr, int bound, int32_t **ids,
                     int *n_ids)
{
    char key[96];
    size_t n = json_array_size(arr);
    if (n > INT32_MAX / 2) return oa_errorf(p->e, MS_EINVAL, "invalid_value", what, "too many ids");
    int32_t *out = arena_calloc(p->a, n ? n : 1, sizeof *out);
    if (!out) return oom(p);
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s[%zu]", what, i);
        int rc = want_token_id(p, key, json_array_get(arr, i), bound, &out[i]);
        if (rc) return rc;
    }
    *ids = out;
    *n_ids = (int)n;
    return 0;
}

// ---- fields that need more than a type and a range ---------------------------------------
// Each gets the key, the value (never null) and where its row says the value
// goes (NULL when the row names no place).

// The two names of the output length, each into its own place.
static int f_max_tokens(struct parser *p, const char *k, json_t *v, void *dst)
{
    long long x;
    int rc = want_int(p, k, v, LLONG_MIN, LLONG_MAX, &x);
    if (rc) return rc;
    if (x < 1)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'%s' must be at least 1, got %lld",
                         k, x);
    if (x > INT32_MAX) {
        if (p->lim->max_model_len > 0)
            return oa_errorf(p->e, MS_ETOOLONG, "context_length_exceeded", k,
                             "'%s' is %lld, beyond this model's context length of %d tokens", k,
                             x, p->lim->max_model_len);
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'%s' must be at most %d, got %lld",
                         k, INT32_MAX, x);
    }
    *(int *)dst = (int)x;
    return 0;
}

// truncate_prompt_tokens: -1 (the context's worth) or 1 to max_model_len.
static int f_truncate_prompt_tokens(struct parser *p, const char *k, json_t *v, void *dst)
{
    long long x;
    int rc = want_int(p, k, v, LLONG_MIN, LLONG_MAX, &x);
    if (rc) return rc;
    const long long hi = p->lim->max_model_len > 0 ? p->lim->max_model_len : INT32_MAX;
    if (x != -1 && (x < 1 || x > hi))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'%s' is %lld; it keeps the prompt's last tokens: -1 (as many as the context "
                         "holds) or 1 to %lld", k, x, hi);
    *(int *)dst = (int)x;
    return 0;
}

static int f_top_k(struct parser *p, const char *k, json_t *v, void *dst)
{
    long long x;
    int rc = want_int(p, k, v, -1, INT32_MAX, &x);
    if (rc) return rc;
    *(int *)dst = x <= 0 ? 0 : (int)x; // -1 and 0 both mean off, as in vLLM
    return 0;
}

// vLLM's prompt_logprobs: 0 to OA_MAX_LOGPROBS alternatives; its -1, the
// whole vocabulary, is refused by name (vLLM too refuses it unless
// --max-logprobs is -1).
static int f_prompt_logprobs(struct parser *p, const char *k, json_t *v, void *dst)
{
    long long x;
    int rc = want_int(p, k, v, -1, OA_MAX_LOGPROBS, &x);
    if (rc) return rc;
    if (x < 0)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'prompt_logprobs' -1 (every token of the vocabulary) is not served; ask "
                         "for 0 to %d alternatives", OA_MAX_LOGPROBS);
    *(int *)dst = (int)x;
    return 0;
}

static int f_stop(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    char key[64];
    if (json_is_string(v)) {
        const char **list = arena_alloc(p->a, sizeof *list);
        if (!list) return oom(p);
        int rc = want_string(p, k, v, &list[0], NULL);
        if (rc) return rc;
        if (!list[0][0])
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'stop' must not be empty");
        if (json_string_length(v) > OA_MAX_STOP_BYTES)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'stop' may be at most %d bytes, got %zu",
                             OA_MAX_STOP_BYTES, json_string_length(v));
        p->gen->stop = list;
        p->gen->n_stop = 1;
        return 0;
    }
    if (!json_is_array(v)) return type_error(p, k, "a string or an array of strings", v);
    size_t n = json_array_size(v);
    if (n > OA_MAX_STOP)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'stop' may hold at most %d strings, got %zu", OA_MAX_STOP, n);
    const char **list = arena_calloc(p->a, n ? n : 1, sizeof *list);
    if (!list) return oom(p);
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "stop[%zu]", i);
        int rc = want_string(p, key, json_array_get(v, i), &list[i], NULL);
        if (rc) return rc;
        if (!list[i][0])
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key, "'%s' must not be empty", key);
        if (json_string_length(json_array_get(v, i)) > OA_MAX_STOP_BYTES)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key, "'%s' may be at most %d bytes, got %zu", key,
                             OA_MAX_STOP_BYTES, json_string_length(json_array_get(v, i)));
    }
    p->gen->stop = list;
    p->gen->n_stop = (int)n;
    return 0;
}

static int f_stop_token_ids(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    if (!json_is_array(v)) return type_error(p, k, "an array of token ids", v);
    size_t n = json_array_size(v);
    if (n > OA_MAX_STOP_TOKEN_IDS)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'stop_token_ids' may hold at most %d ids, got %zu",
                         OA_MAX_STOP_TOKEN_IDS, n);
    return ids_array(p, k, v, p->lim->vocab_size, &p->gen->stop_token_ids, &p->gen->n_stop_token_ids);
}

// allowed_token_ids: a non-empty list of the model's ids (vLLM refuses an
// empty one too: nothing could be drawn).
static int f_allowed_token_ids(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    if (!json_is_array(v)) return type_error(p, k, "an array of token ids", v);
    if (!json_array_size(v))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'%s' must name at least one token id", k);
    if (p->lim->vocab_size > 0 && json_array_size(v) > (size_t)p->lim->vocab_size)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'%s' holds more ids than the vocabulary (%d)",
                         k, p->lim->vocab_size);
    return ids_array(p, k, v, p->lim->vocab_size, &p->gen->allowed_token_ids, &p->gen->n_allowed_token_ids);
}

static int f_seed(struct parser *p, const char *k, json_t *v, void *dst)
{
    long long x;
    int rc = want_int(p, k, v, LLONG_MIN, LLONG_MAX, &x);
    if (rc) return rc;
    if (x == -1) return 0; // no seed, as vLLM (and llama.cpp's -1) read it
    p->gen->sampling.has_seed = true;
    *(uint64_t *)dst = (uint64_t)x;
    return 0;
}

// Keys are token ids written as decimal strings, as OpenAI defines them.
static int f_logit_bias(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    char key[96];
    if (!json_is_object(v)) return type_error(p, k, "an object of token id to bias", v);
    size_t n = json_object_size(v);
    if (n > OA_MAX_LOGIT_BIAS)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'logit_bias' may hold at most %d entries, got %zu", OA_MAX_LOGIT_BIAS, n);
    struct sampling_logit_bias *lb = arena_calloc(p->a, n ? n : 1, sizeof *lb);
    if (!lb) return oom(p);
    const char *tk;
    json_t *tv;
    size_t i = 0;
    json_object_foreach(v, tk, tv) {
        snprintf(key, sizeof key, "logit_bias[%.60s]", tk);
        char *end;
        errno = 0;
        long long id = strtoll(tk, &end, 10);
        if (!*tk || *end || errno || id < 0 || (p->lim->vocab_size > 0 && id >= p->lim->vocab_size))
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                             "'logit_bias' keys must be token ids of this model (0 to %d), got "
                             "'%.60s'",
                             p->lim->vocab_size - 1, tk);
        // Clamped to [-100, 100] as a double, as vLLM clamps Python's
        // float (OpenAI's range): 1e39, past a float, is 100 too.
        if (!json_is_number(tv)) return type_error(p, key, "a number", tv);
        const double bias = json_number_value(tv);
        if (isnan(bias))
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key, "'%s' must be a number, got NaN", key);
        // Keys that name one id ("1001", "01001") are one entry, the last
        // winning, as vLLM's {int(k): v}: added up they could pass 100.
        size_t at = 0;
        while (at < i && lb[at].id != (int32_t)id) at++;
        lb[at].id = (int32_t)id;
        lb[at].bias = (float)fmax(-100.0, fmin(100.0, bias));
        if (at == i) i++;
    }
    p->gen->sampling.logit_bias = lb;
    p->gen->sampling.n_logit_bias = (int)i;
    return 0;
}

// stream_options is read after the pass (it depends on stream); the root
// that holds it outlives the pass.
static int f_stream_options(struct parser *p, const char *k, json_t *v, void *dst)
{
    if (!json_is_object(v)) return type_error(p, k, "an object", v);
    *(json_t **)dst = v;
    return 0;
}

static int f_request_id(struct parser *p, const char *k, json_t *v, void *dst)
{
    const char *s;
    size_t n;
    int rc = want_string(p, k, v, &s, &n);
    if (rc) return rc;
    if (n == 0 || n > 128)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'request_id' must be 1 to 128 characters, got %zu", n);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x21 || c > 0x7e)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                             "'request_id' may hold only printable ASCII without spaces");
    }
    *(const char **)dst = s;
    return 0;
}

// ---- messages -------------------------------------------------------------------

static bool role_known(const char *r)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i])) return true;
    return false;
}

// Text parts are joined with newlines, which is what vLLM does for templates
// (like Qwen's) that expect content to be a string.
static int content_parts(struct parser *p, size_t mi, json_t *parts, json_t **out)
{
    char key[96];
    size_t n = json_array_size(parts), total = 0;
    for (size_t j = 0; j < n; j++) {
        json_t *part = json_array_get(parts, j);
        snprintf(key, sizeof key, "messages[%zu].content[%zu]", mi, j);
        if (!json_is_object(part)) return type_error(p, key, "an object", part);
        json_t *type = json_object_get(part, "type");
        snprintf(key, sizeof key, "messages[%zu].content[%zu].type", mi, j);
        if (!type) return oa_errorf(p->e, MS_EINVAL, "missing_required_parameter", key,
                                    "'%s' is required", key);
        if (!json_is_string(type)) return type_error(p, key, "a string", type);
        if (strcmp(json_string_value(type), "text"))
            return oa_errorf(p->e, MS_EUNSUPPORTED, "unsupported_value", key,
                             "content parts of type '%.40s' are not supported: this model "
                             "takes text only",
                             json_string_value(type));
        json_t *text = json_object_get(part, "text");
        snprintf(key, sizeof key, "messages[%zu].content[%zu].text", mi, j);
        if (!text) return oa_errorf(p->e, MS_EINVAL, "missing_required_parameter", key,
                                    "'%s' is required", key);
        if (!json_is_string(text)) return type_error(p, key, "a string", text);
        size_t add = json_string_length(text) + (j ? 1 : 0);
        if (ms_add_overflow(total, add, &total)) return oom(p);
    }
    *out = oa_join_texts(parts, total);
    return *out ? 0 : oom(p);
}

json_t *oa_join_texts(json_t *parts, size_t total)
{
    size_t n = json_array_size(parts), cap;
    if (ms_add_overflow(total, n + 1, &cap)) return NULL;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t at = 0;
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(parts, j), "text");
        size_t tl = json_string_length(text);
        if (at + tl + (j ? 1 : 0) >= cap) break; // not as counted: the caller's bug, cut
        if (j) buf[at++] = '\n';
        memcpy(buf + at, json_string_value(text), tl);
        at += tl;
    }
    json_t *s = json_stringn_nocheck(buf, at);
    free(buf);
    return s;
}

// An assistant message's tool_calls with each function.arguments that is a
// JSON object's text made that object, as vLLM hands them to templates
// (Qwen3-Coder's iterates arguments|items; Qwen3's writes them |tojson): a
// copy set on mc, which shares nothing with the request. 0 or MS_ENOMEM.
static int tool_call_arguments_as_objects(json_t *mc)
{
    json_t *calls = json_object_get(mc, "tool_calls");
    if (!json_is_array(calls)) return 0;
    json_t *copy = json_deep_copy(calls);
    if (!copy || json_object_set_new(mc, "tool_calls", copy)) return MS_ENOMEM;
    size_t i;
    json_t *c;
    json_array_foreach(copy, i, c) {
        json_t *f = json_object_get(c, "function"), *args = json_object_get(f, "arguments");
        if (!json_is_object(f)) continue;
        // Empty or missing arguments are no arguments, as vLLM takes them.
        if (!args || json_is_null(args) || (json_is_string(args) && !json_string_length(args))) {
            if (json_object_set_new(f, "arguments", json_object())) return MS_ENOMEM;
            continue;
        }
        if (!json_is_string(args)) continue;
        // The object its text holds, and {} where it holds none (text cut
        // short by max_tokens, a list, a number), as vLLM has guarded its
        // json.loads since mid-2026 (PR 48922): a conversation replaying a
        // broken call is not refused on every later turn, and templates
        // that iterate arguments|items get an object.
        json_t *val = json_loadb_wide(json_string_value(args), json_string_length(args), JSON_DECODE_ANY);
        if (val && !json_is_object(val)) {
            json_decref(val);
            val = NULL;
        }
        if (json_object_set_new(f, "arguments", val ? val : json_object())) return MS_ENOMEM;
    }
    return 0;
}

// Validates messages and returns an owned copy whose contents are strings.
// Other keys (name, tool_calls, reasoning_content...) pass through to the
// template, as transformers passes message dicts.
static int parse_messages(struct parser *p, json_t *v, json_t **out)
{
    char key[96];
    if (!json_is_array(v)) return type_error(p, "messages", "an array of messages", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "messages",
                         "'messages' must hold at least one message");
    json_t *copy = json_array();
    if (!copy) return oom(p);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        snprintf(key, sizeof key, "messages[%zu]", i);
        if (!json_is_object(m)) {
            json_decref(copy);
            return type_error(p, key, "an object", m);
        }
        json_t *role = json_object_get(m, "role");
        snprintf(key, sizeof key, "messages[%zu].role", i);
        int rc = 0;
        if (!role)
            rc = oa_errorf(p->e, MS_EINVAL, "missing_required_parameter", key, "'%s' is required",
                           key);
        else if (!json_is_string(role))
            rc = type_error(p, key, "a string", role);
        else if (!role_known(json_string_value(role)))
            rc = oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                           "'%s' must be one of system, user, assistant, tool, developer; got "
                           "'%.40s'",
                           key, json_string_value(role));
        if (rc) {
            json_decref(copy);
            return rc;
        }
        bool assistant = !strcmp(json_string_value(role), "assistant");
        json_t *content = json_object_get(m, "content");
        json_t *norm = NULL;
        snprintf(key, sizeof key, "messages[%zu].content", i);
        if (!content || json_is_null(content)) {
            if (!assistant)
                rc = oa_errorf(p->e, MS_EINVAL, "missing_required_parameter", key,
                               "'%s' is required for a %s message", key, json_string_value(role));
            else
                norm = json_string("");
        } else if (json_is_string(content)) {
            norm = json_incref(content);
        } else if (json_is_array(content)) {
            rc = content_parts(p, i, content, &norm);
        } else {
            rc = type_error(p, key, "a string or an array of text parts", content);
        }
        if (rc) {
            json_decref(copy);
            return rc;
        }
        json_t *mc = json_copy(m);
        // The Qwen3 template drops a role it does not know; OpenAI's
        // developer messages are system messages by another name.
        if (mc && !strcmp(json_string_value(role), "developer") &&
            json_object_set_new(mc, "role", json_string("system"))) {
            json_decref(mc);
            mc = NULL;
        }
        if (!norm || !mc || json_object_set_new(mc, "content", norm)) {
            if (!mc) json_decref(norm);
            json_decref(mc);
            json_decref(copy);
            return oom(p);
        }
        // vLLM's name for the thinking of an earlier turn is reasoning (our
        // own answers carry it); the templates read reasoning_content.
        json_t *reasoning = json_object_get(m, "reasoning");
        if (assistant && json_is_string(reasoning) && json_object_set(mc, "reasoning_content", reasoning)) {
            json_decref(mc);
            json_decref(copy);
            return oom(p);
        }
        if (assistant && tool_call_arguments_as_objects(mc)) {
            json_decref(mc);
            json_decref(copy);
            return oom(p);
        }
        if (json_array_append_new(copy, mc)) {
            json_decref(copy);
            return oom(p);
        }
    }
    *out = copy;
    return 0;
}

static int f_messages(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)k;
    return parse_messages(p, v, dst);
}

// chat_template_kwargs: an object the request keeps a reference to.
static int f_kwargs(struct parser *p, const char *k, json_t *v, void *dst)
{
    if (!json_is_object(v)) return type_error(p, k, "an object", v);
    *(json_t **)dst = json_incref(v);
    return 0;
}

// ---- agents: tools, tool_choice, reasoning and structured output ----------------

#define OA_MAX_TOOLS 128
#define OA_MAX_TOOL_NAME 128

// Function names: letters, digits, '_', '-' (and '.', which some clients use
// for namespaces), 1 to 128 of them: OpenAI allows 64, Anthropic 128, and
// MCP tools as Claude Code names them (mcp__server__tool) often need more
// than 64.
static bool tool_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > OA_MAX_TOOL_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.') return false;
    return true;
}

// Sets on dst every key of src it lacks (a reference each), in src's
// order. 0 or -1 (out of memory).
static int copy_other_keys(json_t *dst, json_t *src)
{
    const char *key;
    json_t *x;
    json_object_foreach(src, key, x) {
        if (!json_object_get(dst, key) && json_object_set(dst, key, x)) return -1;
    }
    return 0;
}

// tools: [{type?: "function", function: {name, description?, parameters?,
// ...}, ...}], names distinct.
static int f_tools(struct parser *p, const char *k, json_t *v, void *dst)
{
    if (!json_is_array(v)) return type_error(p, k, "an array of tools", v);
    const size_t n = json_array_size(v);
    if (n > OA_MAX_TOOLS)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'tools' may hold at most %d tools, got %zu", OA_MAX_TOOLS, n);
    char key[96];
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i), *f, *x;
        snprintf(key, sizeof key, "tools[%zu]", i);
        if (!json_is_object(t)) return type_error(p, key, "an object", t);
        x = json_object_get(t, "type");
        snprintf(key, sizeof key, "tools[%zu].type", i);
        if (x && (!json_is_string(x) || strcmp(json_string_value(x), "function")))
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                             "'%s' must be \"function\" (the only tool type served)", key);
        f = json_object_get(t, "function");
        snprintf(key, sizeof key, "tools[%zu].function", i);
        if (!json_is_object(f)) return type_error(p, key, "an object", f ? f : json_null());
        x = json_object_get(f, "name");
        snprintf(key, sizeof key, "tools[%zu].function.name", i);
        if (!json_is_string(x)) return type_error(p, key, "a string", x ? x : json_null());
        if (!tool_name_ok(json_string_value(x)))
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                             "'%s' must be 1 to %d letters, digits, '_', '-' or '.'", key,
                             OA_MAX_TOOL_NAME);
        for (size_t j = 0; j < i; j++) {
            json_t *o = json_object_get(json_object_get(json_array_get(v, j), "function"), "name");
            if (!strcmp(json_string_value(o), json_string_value(x)))
                return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                                 "'%s' repeats the name of tools[%zu]", key, j);
        }
        x = json_object_get(f, "parameters");
        snprintf(key, sizeof key, "tools[%zu].function.parameters", i);
        if (x && !json_is_null(x) && !json_is_object(x)) return type_error(p, key, "an object", x);
        x = json_object_get(f, "description");
        snprintf(key, sizeof key, "tools[%zu].function.description", i);
        if (x && !json_is_null(x) && !json_is_string(x)) return type_error(p, key, "a string", x);
    }
    if (n == 0) return 0;
    // The template sees each tool as vLLM re-serializes it (its pydantic
    // models' dump, extra keys allowed): {type, function: {name,
    // description, parameters}} in that order, absent ones null, type
    // "function" where it was left out, then each level's other keys (such
    // as strict) as the client wrote them, in its order.
    json_t *tools = json_array();
    if (!tools) return oom(p);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i), *f = json_object_get(t, "function");
        json_t *d = json_object_get(f, "description"), *par = json_object_get(f, "parameters");
        json_t *nf = json_pack("{s:O, s:O, s:O}", "name", json_object_get(f, "name"), "description",
                               d ? d : json_null(), "parameters", par ? par : json_null());
        json_t *nt = nf ? json_pack("{s:s, s:o}", "type", "function", "function", nf) : NULL;
        if (!nt || json_array_append_new(tools, nt) || copy_other_keys(nf, f) || copy_other_keys(nt, t)) {
            json_decref(tools);
            return oom(p);
        }
    }
    *(json_t **)dst = tools;
    return 0;
}

// tool_choice: "none", "auto", "required", or {type: "function", function: {name}}.
static int f_tool_choice(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    struct oa_chat_request *r = p->chat;
    if (json_is_string(v)) {
        const char *c = json_string_value(v);
        if (!strcmp(c, "none")) r->tool_choice = OA_TOOL_NONE;
        else if (!strcmp(c, "auto")) r->tool_choice = OA_TOOL_AUTO;
        else if (!strcmp(c, "required")) r->tool_choice = OA_TOOL_REQUIRED;
        else
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                             "'tool_choice' must be \"none\", \"auto\", \"required\" or a named "
                             "function, got \"%.40s\"", c);
        return 0;
    }
    if (!json_is_object(v)) return type_error(p, k, "a string or an object", v);
    json_t *f = json_object_get(v, "function"), *name = json_object_get(f, "name");
    if (!json_is_string(name))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "tool_choice.function.name",
                         "a named 'tool_choice' needs function.name, a string");
    r->tool_choice = OA_TOOL_NAMED;
    r->tool_choice_name = arena_strdup(p->a, json_string_value(name));
    return r->tool_choice_name ? 0 : oom(p);
}

// reasoning_effort: "none" turns Qwen3's thinking off, the others on.
static int f_reasoning_effort(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    static const char *const levels[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    if (!json_is_string(v)) return type_error(p, k, "a string", v);
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (!strcmp(json_string_value(v), levels[i])) {
            p->chat->thinking = i == 0 ? 0 : 1;
            return 0;
        }
    return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                     "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or max, got \"%.40s\"",
                     json_string_value(v));
}

// One structured-output source per request: a second one is refused rather
// than one of them silently winning.
static int set_structured(struct parser *p, const char *param, enum oa_structured_kind kind,
                          json_t *v)
{
    struct oa_structured *so = &p->gen->structured;
    if (so->kind != OA_SO_NONE)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", param,
                         "'%s' and '%s' both ask for structured output; give one of them", so->param,
                         param);
    char *text = NULL;
    if (json_is_string(v)) {
        text = arena_strndup(p->a, json_string_value(v), json_string_length(v));
    } else if (v) {
        char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!d) return oom(p);
        text = arena_strdup(p->a, d);
        free(d);
    } else {
        text = arena_strdup(p->a, "");
    }
    if (!text) return oom(p);
    so->kind = kind;
    so->text = text;
    so->len = strlen(text);
    so->param = arena_strdup(p->a, param);
    return so->param ? 0 : oom(p);
}

static int want_schema(struct parser *p, const char *key, json_t *v)
{
    if (json_is_object(v) || json_is_true(v)) return 0;
    if (json_is_string(v)) { // some clients send the schema as JSON text
        json_error_t je;
        json_t *j = json_loads(json_string_value(v), 0, &je);
        bool ok = j && json_is_object(j);
        json_decref(j);
        if (ok) return 0;
    }
    return type_error(p, key, "a JSON Schema (an object)", v);
}

static int want_choices(struct parser *p, const char *key, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return type_error(p, key, "a non-empty array of strings", v);
    size_t i;
    json_t *c;
    json_array_foreach(v, i, c) if (!json_is_string(c)) {
        char k2[96];
        snprintf(k2, sizeof k2, "%s[%zu]", key, i);
        return type_error(p, k2, "a string", c);
    }
    return 0;
}

// response_format: {type: text | json_object | json_schema, json_schema:
// {name, schema, strict, description}}.
static int f_response_format(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    if (!json_is_object(v)) return type_error(p, k, "an object", v);
    json_t *type = json_object_get(v, "type");
    if (!json_is_string(type))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "response_format.type",
                         "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) return set_structured(p, "response_format", OA_SO_JSON_OBJECT, NULL);
    if (strcmp(t, "json_schema"))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "response_format.type",
                         "'response_format.type' must be \"text\", \"json_object\" or "
                         "\"json_schema\", got \"%.40s\"", t);
    json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "response_format.json_schema",
                         "'response_format.json_schema' must be an object with the schema");
    json_t *schema = json_object_get(js, "schema");
    if (!schema) schema = json_true(); // OpenAI: a missing schema allows any JSON
    int rc = want_schema(p, "response_format.json_schema.schema", schema);
    if (rc) return rc;
    return set_structured(p, "response_format.json_schema.schema", OA_SO_JSON_SCHEMA, schema);
}

// vLLM's structured_outputs: exactly one of json, regex, choice, grammar,
// json_object; disable_any_whitespace writes JSON with fixed separators, as
// xgrammar's any_whitespace false does; the fallback and additional
// properties switches change nothing here (there is no fallback to loosen
// to, and a schema without additionalProperties already allows no others).
static int f_structured_outputs(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    if (!json_is_object(v)) return type_error(p, k, "an object", v);
    const char *key;
    json_t *x;
    int found = 0, rc = 0;
    json_object_foreach(v, key, x) {
        char full[96];
        snprintf(full, sizeof full, "structured_outputs.%.40s", key);
        if (json_is_null(x)) continue;
        if (!strcmp(key, "json")) {
            if (!(rc = want_schema(p, full, x))) rc = set_structured(p, full, OA_SO_JSON_SCHEMA, x);
        } else if (!strcmp(key, "regex")) {
            if (!json_is_string(x)) return type_error(p, full, "a string", x);
            rc = set_structured(p, full, OA_SO_REGEX, x);
        } else if (!strcmp(key, "choice")) {
            if (!(rc = want_choices(p, full, x))) rc = set_structured(p, full, OA_SO_CHOICE, x);
        } else if (!strcmp(key, "grammar")) {
            if (!json_is_string(x)) return type_error(p, full, "a string (GBNF)", x);
            rc = set_structured(p, full, OA_SO_GRAMMAR, x);
        } else if (!strcmp(key, "json_object")) {
            if (!json_is_boolean(x)) return type_error(p, full, "a boolean", x);
            if (json_is_true(x)) rc = set_structured(p, full, OA_SO_JSON_OBJECT, NULL);
        } else if (!strcmp(key, "disable_fallback") || !strcmp(key, "disable_any_whitespace") ||
                   !strcmp(key, "disable_additional_properties")) {
            if (!json_is_boolean(x)) return type_error(p, full, "a boolean", x);
            if (!strcmp(key, "disable_any_whitespace")) p->gen->structured.compact_json = json_is_true(x);
            continue;
        } else {
            return oa_errorf(p->e, MS_EUNSUPPORTED, "unsupported_parameter", full,
                             "'%s' is not supported; structured_outputs takes json, regex, choice, "
                             "grammar or json_object", full);
        }
        if (rc) return rc;
        found++;
    }
    return 0;
}

// vLLM's older spellings and llama-server's, each one structured-output source.
static int f_guided(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    int rc;
    if (!strcmp(k, "guided_json") || !strcmp(k, "json_schema")) {
        if ((rc = want_schema(p, k, v))) return rc;
        return set_structured(p, k, OA_SO_JSON_SCHEMA, v);
    }
    if (!strcmp(k, "guided_choice")) {
        if ((rc = want_choices(p, k, v))) return rc;
        return set_structured(p, k, OA_SO_CHOICE, v);
    }
    if (!json_is_string(v)) return type_error(p, k, "a string", v);
    return set_structured(p, k, !strcmp(k, "guided_regex") ? OA_SO_REGEX : OA_SO_GRAMMAR, v);
}

// llama-server's n_predict: its max_tokens (-1: as much as fits).
static int f_n_predict(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    long long x;
    int rc = want_int(p, k, v, -1, INT32_MAX, &x);
    if (rc) return rc;
    if (x == 0)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'n_predict' must be -1 or at least 1");
    if (x > 0) {
        p->n_predict = (int)x;
        p->seen |= SEEN_N_PREDICT;
    }
    return 0;
}

// modalities: only ["text"] (the model has no other).
static int f_modalities(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    if (!json_is_array(v)) return type_error(p, k, "an array", v);
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
        return oa_errorf(p->e, MS_EUNSUPPORTED, "unsupported_parameter", k,
                         "'modalities' may only hold \"text\" here");
    return 0;
}

// The cross-field rules of tools: a named choice names a tool; a forced call
// needs tools and leaves no room for another output format.
// continue_final_message as vLLM takes it: not beside a generation prompt
// (vLLM's default add_generation_prompt true makes a client say false), and
// only after an assistant message, the one the answer goes on from.
static int continue_final_check(struct parser *p, bool cont, bool add_generation_prompt, json_t *messages)
{
    if (!cont) return 0;
    if (add_generation_prompt)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "continue_final_message",
                         "'continue_final_message' and 'add_generation_prompt' cannot both be true: the "
                         "answer either continues the final message or starts a new one; set "
                         "'add_generation_prompt' to false");
    const char *role = json_string_value(json_object_get(json_array_get(messages, json_array_size(messages) - 1),
                                                         "role"));
    if (!role || strcmp(role, "assistant"))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "continue_final_message",
                         "'continue_final_message' continues the final message, which must be the "
                         "assistant's; it is %s%.40s%s", role ? "\"" : "", role ? role : "missing",
                         role ? "\"" : "");
    return 0;
}

static int chat_tools_finish(struct parser *p)
{
    struct oa_chat_request *r = p->chat;
    if (r->tool_choice == OA_TOOL_REQUIRED || r->tool_choice == OA_TOOL_NAMED) {
        if (!r->tools)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", "tool_choice",
                             "'tool_choice' \"required\" or a named function needs 'tools'");
        if (r->gen.structured.kind != OA_SO_NONE)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", "tool_choice",
                             "'tool_choice' forces a tool call, which leaves no room for '%s'",
                             r->gen.structured.param);
    }
    if (r->tool_choice == OA_TOOL_NAMED) {
        size_t i;
        json_t *t;
        json_array_foreach(r->tools, i, t) {
            const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            if (n && !strcmp(n, r->tool_choice_name)) return 0;
        }
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "tool_choice.function.name",
                         "'tool_choice' names \"%.64s\", which is not one of 'tools'",
                         r->tool_choice_name);
    }
    return 0;
}

// ---- prompts (completions, tokenize) ---------------------------------------------

static int f_prompt_completion(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    char key[64];
    struct oa_completion_request *r = p->cmpl;
    if (json_is_string(v)) {
        r->prompts = arena_calloc(p->a, 1, sizeof *r->prompts);
        if (!r->prompts) return oom(p);
        r->n_prompts = 1;
        return want_string(p, k, v, &r->prompts[0].text, &r->prompts[0].text_len);
    }
    const char *want = "a string, an array of strings, an array of token ids or an array of "
                       "arrays of token ids";
    if (!json_is_array(v)) return type_error(p, k, want, v);
    size_t n = json_array_size(v);
    if (n == 0) return oa_errorf(p->e, MS_EINVAL, "invalid_value", k, "'prompt' must not be empty");
    json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) { // one prompt of token ids
        r->prompts = arena_calloc(p->a, 1, sizeof *r->prompts);
        if (!r->prompts) return oom(p);
        r->n_prompts = 1;
        int32_t *ids;
        int rc = ids_array(p, "prompt", v, text_bound(p), &ids, &r->prompts[0].n_ids);
        r->prompts[0].ids = ids;
        return rc;
    }
    if (n > OA_MAX_PROMPTS)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'prompt' may hold at most %d prompts, got %zu", OA_MAX_PROMPTS, n);
    r->prompts = arena_calloc(p->a, n, sizeof *r->prompts);
    if (!r->prompts) return oom(p);
    r->n_prompts = (int)n;
    bool strings = json_is_string(first);
    if (!strings && !json_is_array(first)) return type_error(p, "prompt[0]", want, first);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        snprintf(key, sizeof key, "prompt[%zu]", i);
        int rc;
        if (strings) {
            if (!json_is_string(e))
                return type_error(p, key, "a string, like the prompts before it", e);
            rc = want_string(p, key, e, &r->prompts[i].text, &r->prompts[i].text_len);
        } else {
            if (!json_is_array(e))
                return type_error(p, key, "an array of token ids, like the prompts before it", e);
            if (json_array_size(e) == 0)
                return oa_errorf(p->e, MS_EINVAL, "invalid_value", key,
                                 "'%s' must not be empty", key);
            int32_t *ids;
            rc = ids_array(p, key, e, text_bound(p), &ids, &r->prompts[i].n_ids);
            r->prompts[i].ids = ids;
        }
        if (rc) return rc;
    }
    return 0;
}

static int f_prompt_tokenize(struct parser *p, const char *k, json_t *v, void *dst)
{
    return want_string(p, k, v, dst, &p->tokz->prompt_len);
}

static int f_tokens(struct parser *p, const char *k, json_t *v, void *dst)
{
    (void)dst;
    if (!json_is_array(v)) return type_error(p, k, "an array of token ids", v);
    return ids_array(p, "tokens", v, text_bound(p), &p->detok->tokens, &p->detok->n_tokens);
}

// ---- the field tables ----------------------------------------------------------------

// Parameters of the OpenAI or vLLM API that moeserve does not implement. The
// value that means "off" is accepted, anything else is refused by name.
enum neutral { N_NULL, N_FALSE, N_TRUE, N_ZERO, N_ONE, N_EMPTY, N_ANY, N_STR_NONE, N_STR_AUTO };

struct unsupported {
    const char *name;
    enum neutral neutral;
};

static const struct unsupported unsupported_common[] = {
    {"bad_words", N_EMPTY},
    {"cache_salt", N_NULL},
    {"guided_decoding_backend", N_NULL},
    {"guided_whitespace_pattern", N_NULL},
    {"kv_transfer_params", N_NULL},
    {"length_penalty", N_ONE},
    {"logits_processors", N_NULL},
    {"metadata", N_ANY},     // informational, like user
    {"priority", N_ZERO},
    {"service_tier", N_ANY}, // billing tier: nothing to do with the output
    {"spaces_between_special_tokens", N_TRUE},
    {"store", N_ANY},        // nothing is stored here either way
    {"use_beam_search", N_FALSE},
    {"vllm_xargs", N_NULL},
};

static const struct unsupported unsupported_chat[] = {
    {"audio", N_NULL},
    {"chat_template", N_NULL},
    {"documents", N_NULL},
    {"echo", N_FALSE},
    {"function_call", N_STR_NONE},
    {"functions", N_EMPTY},
    {"mm_processor_kwargs", N_NULL},
    {"prediction", N_NULL},
    {"web_search_options", N_NULL},
};

static const struct unsupported unsupported_completion[] = {
    {"prompt_embeds", N_NULL},
    {"suffix", N_NULL},
};

static const struct unsupported unsupported_tokenize[] = {
    {"chat_template", N_NULL},
    {"mm_processor_kwargs", N_NULL},
};

static bool is_neutral(enum neutral n, json_t *v)
{
    switch (n) {
    case N_NULL: return false; // null never reaches here
    case N_FALSE: return json_is_false(v);
    case N_TRUE: return json_is_true(v);
    case N_ZERO: return json_is_number(v) && json_number_value(v) == 0;
    case N_ONE: return json_is_number(v) && json_number_value(v) == 1;
    case N_EMPTY:
        return (json_is_array(v) && json_array_size(v) == 0) ||
               (json_is_object(v) && json_object_size(v) == 0);
    case N_ANY: return true;
    case N_STR_NONE: return json_is_string(v) && !strcmp(json_string_value(v), "none");
    case N_STR_AUTO: return json_is_string(v) && !strcmp(json_string_value(v), "auto");
    }
    return false;
}

typedef int (*field_fn)(struct parser *p, const char *key, json_t *v, void *dst);

// What a field's value must be.
enum field_kind {
    FK_BOOL,   // true or false, into a bool
    FK_NUMBER, // a number in [lo, hi] (lo itself excluded when lo_open), into a float
    FK_SAMPLING, // a number in the range model/sampling.h gives its name, into a float
    FK_INT,    // an integer in [lo, hi] (10.0 counts), into an int
    FK_STRING, // a string, copied into the arena, into a const char *
    FK_CUSTOM, // fn checks it and stores it
};

// Where the value goes: a member of the request's generation parameters, of
// the endpoint's request struct, or of the parser (read after the pass); or
// nowhere (accepted and checked only).
enum field_home { IN_NONE, IN_GEN, IN_REQUEST, IN_PARSER };

struct field {
    const char *name;
    uint8_t kind;   // enum field_kind
    uint8_t home;   // enum field_home
    uint8_t lo_open;
    unsigned seen;  // enum seen bits set when the field is given (not null)
    size_t off;     // offsetof the member within home
    double lo, hi;  // FK_NUMBER and FK_INT
    field_fn fn;    // FK_CUSTOM
};

#define GEN(m) .home = IN_GEN, .off = offsetof(struct oa_gen_params, m)
#define REQ(type, m) .home = IN_REQUEST, .off = offsetof(struct type, m)
#define PARSER(m) .home = IN_PARSER, .off = offsetof(struct parser, m)
#define SEEN(bit) .seen = (bit)
#define BOOL_FIELD(n, ...) {.name = n, .kind = FK_BOOL, __VA_ARGS__}
#define NUMBER_FIELD(n, l, h, ...) {.name = n, .kind = FK_NUMBER, .lo = l, .hi = h, __VA_ARGS__}
#define SAMPLING_FIELD(n, ...) {.name = n, .kind = FK_SAMPLING, __VA_ARGS__}
#define INT_FIELD(n, l, h, ...) {.name = n, .kind = FK_INT, .lo = l, .hi = h, __VA_ARGS__}
#define STRING_FIELD(n, ...) {.name = n, .kind = FK_STRING, __VA_ARGS__}
#define CUSTOM_FIELD(n, f, ...) {.name = n, .kind = FK_CUSTOM, .fn = f, __VA_ARGS__}
#define LO_OPEN .lo_open = 1

// The sampling, stopping and output fields chat and completions share.
static const struct field gen_fields[] = {
    BOOL_FIELD("add_special_tokens", GEN(add_special_tokens)),
    SAMPLING_FIELD("frequency_penalty", GEN(sampling.frequency_penalty)),
    CUSTOM_FIELD("allowed_token_ids", f_allowed_token_ids),
    BOOL_FIELD("ignore_eos", GEN(ignore_eos)),
    BOOL_FIELD("include_stop_str_in_output", GEN(include_stop_str)),
    CUSTOM_FIELD("logit_bias", f_logit_bias),
    CUSTOM_FIELD("max_tokens", f_max_tokens, PARSER(max_tokens), SEEN(SEEN_MAX_TOKENS)),
    SAMPLING_FIELD("min_p", GEN(sampling.min_p), SEEN(SEEN_MIN_P)),
    INT_FIELD("min_tokens", 0, INT32_MAX / 2, GEN(min_tokens)),
    CUSTOM_FIELD("truncate_prompt_tokens", f_truncate_prompt_tokens, GEN(truncate_prompt_tokens)),
    INT_FIELD("n", 1, OA_MAX_N, GEN(n)),
    SAMPLING_FIELD("presence_penalty", GEN(sampling.presence_penalty)),
    CUSTOM_FIELD("prompt_logprobs", f_prompt_logprobs, GEN(prompt_logprobs)), // vLLM's
    SAMPLING_FIELD("repetition_penalty", GEN(sampling.repetition_penalty),
                   SEEN(SEEN_REPETITION_PENALTY)),
    CUSTOM_FIELD("request_id", f_request_id, GEN(request_id)),
    CUSTOM_FIELD("response_format", f_response_format),
    BOOL_FIELD("return_tokens_as_token_ids", GEN(return_tokens_as_token_ids)),
    CUSTOM_FIELD("seed", f_seed, GEN(sampling.seed)),
    BOOL_FIELD("skip_special_tokens", GEN(skip_special_tokens)),
    CUSTOM_FIELD("stop", f_stop),
    CUSTOM_FIELD("stop_token_ids", f_stop_token_ids),
    BOOL_FIELD("stream", GEN(stream)),
    CUSTOM_FIELD("structured_outputs", f_structured_outputs),
    CUSTOM_FIELD("guided_json", f_guided),
    CUSTOM_FIELD("guided_regex", f_guided),
    CUSTOM_FIELD("guided_choice", f_guided),
    CUSTOM_FIELD("guided_grammar", f_guided),
    CUSTOM_FIELD("grammar", f_guided),     // llama-server
    CUSTOM_FIELD("json_schema", f_guided), // llama-server
    CUSTOM_FIELD("n_predict", f_n_predict), // llama-server
    CUSTOM_FIELD("stream_options", f_stream_options, PARSER(stream_options)),
    SAMPLING_FIELD("temperature", GEN(sampling.temperature), SEEN(SEEN_TEMPERATURE)),
    CUSTOM_FIELD("top_k", f_top_k, GEN(sampling.top_k), SEEN(SEEN_TOP_K)),
    SAMPLING_FIELD("top_p", GEN(sampling.top_p), SEEN(SEEN_TOP_P)),
    STRING_FIELD("user", GEN(user)),
};

static const struct field chat_fields[] = {
    BOOL_FIELD("add_generation_prompt", REQ(oa_chat_request, add_generation_prompt)),
    BOOL_FIELD("continue_final_message", REQ(oa_chat_request, continue_final_message)),
    CUSTOM_FIELD("chat_template_kwargs", f_kwargs, REQ(oa_chat_request, chat_template_kwargs)),
    BOOL_FIELD("logprobs", PARSER(chat_logprobs)),
    CUSTOM_FIELD("max_completion_tokens", f_max_tokens, PARSER(max_completion_tokens),
                 SEEN(SEEN_MAX_COMPLETION_TOKENS)),
    CUSTOM_FIELD("messages", f_messages, REQ(oa_chat_request, messages), SEEN(SEEN_MESSAGES)),
    STRING_FIELD("model", REQ(oa_chat_request, model)),
    INT_FIELD("top_logprobs", 0, OA_MAX_LOGPROBS, PARSER(top_logprobs), SEEN(SEEN_TOP_LOGPROBS)),
    CUSTOM_FIELD("tools", f_tools, REQ(oa_chat_request, tools)),
    CUSTOM_FIELD("tool_choice", f_tool_choice),
    BOOL_FIELD("parallel_tool_calls", REQ(oa_chat_request, parallel_tool_calls)),
    CUSTOM_FIELD("reasoning_effort", f_reasoning_effort),
    BOOL_FIELD("include_reasoning", REQ(oa_chat_request, include_reasoning)),
    CUSTOM_FIELD("modalities", f_modalities),
};

static const struct field completion_fields[] = {
    INT_FIELD("best_of", 1, OA_MAX_N, PARSER(best_of), SEEN(SEEN_BEST_OF)),
    BOOL_FIELD("echo", REQ(oa_completion_request, echo)),
    INT_FIELD("logprobs", 0, OA_MAX_LOGPROBS, GEN(logprobs)), // the legacy integer
    STRING_FIELD("model", REQ(oa_completion_request, model)),
    CUSTOM_FIELD("prompt", f_prompt_completion, SEEN(SEEN_PROMPT)),
};

static const struct field tokenize_fields[] = {
    BOOL_FIELD("add_generation_prompt", REQ(oa_tokenize_request, add_generation_prompt)),
    BOOL_FIELD("continue_final_message", REQ(oa_tokenize_request, continue_final_message)),
    // The checkpoint's post-processor ids (none for Qwen3), as for generation.
    BOOL_FIELD("add_special_tokens", REQ(oa_tokenize_request, add_special_tokens),
               SEEN(SEEN_ADD_SPECIAL_TOKENS)),
    CUSTOM_FIELD("chat_template_kwargs", f_kwargs, REQ(oa_tokenize_request, chat_template_kwargs)),
    CUSTOM_FIELD("messages", f_messages, REQ(oa_tokenize_request, messages), SEEN(SEEN_MESSAGES)),
    STRING_FIELD("model", REQ(oa_tokenize_request, model)),
    CUSTOM_FIELD("prompt", f_prompt_tokenize, REQ(oa_tokenize_request, prompt), SEEN(SEEN_PROMPT)),
    BOOL_FIELD("return_token_strs", REQ(oa_tokenize_request, return_token_strs)),
    CUSTOM_FIELD("tools", f_tools, REQ(oa_tokenize_request, tools)),
};

static const struct field detokenize_fields[] = {
    STRING_FIELD("model", REQ(oa_detokenize_request, model)),
    CUSTOM_FIELD("tokens", f_tokens, SEEN(SEEN_TOKENS)),
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const struct field *find_field(const struct field *t, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, key)) return &t[i];
    return NULL;
}

// Checks a given (non-null) field against its row and stores it.
static int field_parse(struct parser *p, const struct field *f, const char *key, json_t *v)
{
    void *dst = NULL;
    switch (f->home) {
    case IN_GEN: dst = (char *)p->gen + f->off; break;
    case IN_REQUEST: dst = (char *)p->req + f->off; break;
    case IN_PARSER: dst = (char *)p + f->off; break;
    }
    p->seen |= f->seen;
    int rc = 0;
    switch (f->kind) {
    case FK_BOOL: {
        bool b = false;
        rc = want_bool(p, key, v, &b);
        if (!rc && dst) *(bool *)dst = b;
        return rc;
    }
    case FK_NUMBER:
    case FK_SAMPLING: {
        double lo = f->lo, hi = f->hi;
        bool lo_open = f->lo_open;
        if (f->kind == FK_SAMPLING && !sampling_param_range(f->name, &lo, &hi, &lo_open))
            return oa_errorf(p->e, MS_EINTERNAL, "internal_error", key,
                             "'%s' has no range in the sampling table", key);
        float x = 0;
        rc = want_number(p, key, v, lo, lo_open, hi, &x);
        if (!rc && dst) *(float *)dst = x;
        return rc;
    }
    case FK_INT: {
        long long x = 0;
        rc = want_int(p, key, v, (long long)f->lo, (long long)f->hi, &x);
        if (!rc && dst) *(int *)dst = (int)x;
        return rc;
    }
    case FK_STRING: {
        const char *str = NULL;
        rc = want_string(p, key, v, &str, NULL);
        if (!rc && dst) *(const char **)dst = str;
        return rc;
    }
    default: return f->fn(p, key, v, dst);
    }
}

static const struct unsupported *find_unsupported(const struct unsupported *t, size_t n,
                                                  const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, key)) return &t[i];
    return NULL;
}

static void note_ignored(struct parser *p, const char *key)
{
    size_t kl = strlen(key);
    size_t need = kl + (p->ignored_len ? 2 : 0);
    if (p->ignored_len + need + 4 >= sizeof p->ignored) {
        if (p->ignored_len + 4 < sizeof p->ignored && !strstr(p->ignored, "...")) {
            memcpy(p->ignored + p->ignored_len, ", ...", 5);
            p->ignored_len += 5;
            p->ignored[sizeof p->ignored - 1] = 0;
        }
        return;
    }
    if (p->ignored_len) {
        memcpy(p->ignored + p->ignored_len, ", ", 2);
        p->ignored_len += 2;
    }
    memcpy(p->ignored + p->ignored_len, key, kl);
    p->ignored_len += kl;
    p->ignored[p->ignored_len] = 0;
}

// One pass over the body's keys: known fields (the endpoint's, then for chat
// and completions the shared generation fields) to their rows, unsupported
// ones refused unless neutral, the rest noted as ignored.
static int parse_fields(struct parser *p, json_t *root, const struct field *fields,
                        size_t n_fields, const struct unsupported *extra, size_t n_extra)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        const struct field *f = find_field(fields, n_fields, key);
        if (!f && p->gen) f = find_field(gen_fields, COUNT(gen_fields), key);
        if (f) {
            if (json_is_null(v)) continue; // null is "not given" for every optional field
            int rc = field_parse(p, f, key, v);
            if (rc) return rc;
            continue;
        }
        const struct unsupported *u = find_unsupported(extra, n_extra, key);
        if (!u && p->gen) u = find_unsupported(unsupported_common, COUNT(unsupported_common), key);
        if (u) {
            if (json_is_null(v) || is_neutral(u->neutral, v)) continue;
            return oa_errorf(p->e, MS_EUNSUPPORTED, "unsupported_parameter", key,
                             "'%s' is not supported by moeserve yet; leave it out of the request",
                             key);
        }
        note_ignored(p, key);
    }
    return 0;
}

int oa_load_object(const char *body, size_t len, json_t **out, struct oa_error *e)
{
    json_error_t jerr;
    if (len == 0)
        return oa_errorf(e, MS_EFORMAT, "invalid_json", NULL,
                         "the request body is empty; send a JSON object");
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    // Strings reach the engine as C strings, which a NUL would cut short
    // without a word: refused, and said so (not in the parser's terms).
    if (!root && json_error_code(&jerr) == json_error_null_character)
        return oa_errorf(e, MS_EFORMAT, "invalid_json", NULL,
                         "the request body holds a NUL character (\\u0000) in a string (line %d, column "
                         "%d); requests may not contain NUL characters: remove them",
                         jerr.line, jerr.column);
    if (!root)
        return oa_errorf(e, MS_EFORMAT, "invalid_json", NULL,
                         "the request body is not valid JSON (line %d, column %d): %s", jerr.line,
                         jerr.column, jerr.text);
    if (!json_is_object(root)) {
        oa_errorf(e, MS_EINVAL, "invalid_type", NULL,
                  "the request body must be a JSON object, got %s", json_kind(root));
        json_decref(root);
        return MS_EINVAL;
    }
    *out = root;
    return 0;
}

static int load_root(struct parser *p, const char *body, size_t len, json_t **out)
{
    return oa_load_object(body, len, out, p->e);
}

static void gen_init(struct oa_gen_params *g)
{
    memset(g, 0, sizeof *g);
    sampling_params_default(&g->sampling);
    g->skip_special_tokens = true;
    g->n = 1;
    g->logprobs = -1;
    g->prompt_logprobs = -1;
}

// Sampling values the request left out come from generation_config.json, as
// vLLM's --generation-config auto does; then the cross-field rules.
static int gen_finish(struct parser *p)
{
    struct oa_gen_params *g = p->gen;
    const struct sampling_set set = {
        .temperature = p->seen & SEEN_TEMPERATURE, .top_p = p->seen & SEEN_TOP_P,
        .top_k = p->seen & SEEN_TOP_K, .min_p = p->seen & SEEN_MIN_P,
        .repetition_penalty = p->seen & SEEN_REPETITION_PENALTY};
    sampling_params_merge_defaults(&g->sampling, &set, p->lim->gen);
    // max_completion_tokens is the newer name; when both come, it wins (as in vLLM).
    // llama-server's n_predict beside either would be a guess at its order.
    if ((p->seen & SEEN_N_PREDICT) && (p->seen & (SEEN_MAX_TOKENS | SEEN_MAX_COMPLETION_TOKENS)))
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "n_predict",
                         "'n_predict' and '%s' both set the output's length; give one of them",
                         p->seen & SEEN_MAX_COMPLETION_TOKENS ? "max_completion_tokens" : "max_tokens");
    if (p->seen & SEEN_MAX_COMPLETION_TOKENS) g->max_tokens = p->max_completion_tokens;
    else if (p->seen & SEEN_MAX_TOKENS) g->max_tokens = p->max_tokens;
    else if (p->seen & SEEN_N_PREDICT) g->max_tokens = p->n_predict;
    if (g->max_tokens > 0 && g->min_tokens > g->max_tokens)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "min_tokens",
                         "'min_tokens' (%d) must be at most the output's maximum (%d)", g->min_tokens,
                         g->max_tokens);

    if (p->stream_options) {
        if (!g->stream)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", "stream_options",
                             "'stream_options' is allowed only when 'stream' is true");
        const char *k;
        json_t *v;
        json_object_foreach(p->stream_options, k, v) {
            char key[96];
            snprintf(key, sizeof key, "stream_options.%.60s", k);
            int rc = 0;
            if (json_is_null(v)) continue;
            if (!strcmp(k, "include_usage")) rc = want_bool(p, key, v, &g->include_usage);
            else if (!strcmp(k, "continuous_usage_stats"))
                rc = want_bool(p, key, v, &g->continuous_usage_stats);
            else if (!strcmp(k, "include_obfuscation")) // OpenAI's padding: nothing to hide here
                rc = want_bool(p, key, v, &(bool){false});
            else
                rc = oa_errorf(p->e, MS_EUNSUPPORTED, "unsupported_parameter", key,
                               "'%s' is not supported; stream_options takes include_usage, "
                               "continuous_usage_stats and include_obfuscation",
                               key);
            if (rc) return rc;
        }
    }
    if (p->ep == EP_CHAT) {
        bool has_top_logprobs = p->seen & SEEN_TOP_LOGPROBS;
        if (has_top_logprobs && !p->chat_logprobs && p->top_logprobs > 0)
            return oa_errorf(p->e, MS_EINVAL, "invalid_value", "top_logprobs",
                             "'top_logprobs' needs 'logprobs' set to true");
        if (p->chat_logprobs) g->logprobs = has_top_logprobs ? p->top_logprobs : 0;
    }
    if (p->lim->logprobs_capped && g->logprobs > p->lim->max_logprobs) {
        const char *k = p->ep == EP_CHAT && (p->seen & SEEN_TOP_LOGPROBS) ? "top_logprobs" : "logprobs";
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", k,
                         "'%s' asks for %d logprobs per token; this server gives at most %d "
                         "(--max-logprobs)", k, g->logprobs, p->lim->max_logprobs);
    }
    if (p->lim->logprobs_capped && g->prompt_logprobs > p->lim->max_logprobs)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "prompt_logprobs",
                         "'prompt_logprobs' asks for %d logprobs per prompt token; this server gives "
                         "at most %d (--max-logprobs)", g->prompt_logprobs, p->lim->max_logprobs);
    // As vLLM: they come with the whole answer, which a stream never is;
    // 0 (no alternatives) it lets pass, and streams nothing of it.
    if (g->prompt_logprobs > 0 && g->stream)
        return oa_errorf(p->e, MS_EINVAL, "invalid_value", "prompt_logprobs",
                         "'prompt_logprobs' are not available when 'stream' is true");
    if (g->stream) g->prompt_logprobs = -1;
    if ((p->seen & SEEN_BEST_OF) && p->best_of != g->n)
        return oa_errorf(p->e, MS_EUNSUPPORTED, "unsupported_parameter", "best_of",
                         "'best_of' other than n is not supported by moeserve yet (got %d with "
                         "n %d)",
                         p->best_of, g->n);
    return 0;
}

static char *finish_ignored(struct parser *p)
{
    return p->ignored_len ? arena_strndup(p->a, p->ignored, p->ignored_len) : NULL;
}

static void parser_init(struct parser *p, enum endpoint ep, const struct oa_limits *lim,
                        struct arena *a, struct oa_error *e)
{
    memset(p, 0, sizeof *p);
    p->ep = ep;
    p->lim = lim;
    p->a = a;
    p->e = e;
    memset(e, 0, sizeof *e);
}

static void chat_init(struct parser *p, const struct oa_limits *lim, struct arena *a,
                      struct oa_chat_request *out, struct oa_error *e)
{
    parser_init(p, EP_CHAT, lim, a, e);
    memset(out, 0, sizeof *out);
    out->add_generation_prompt = true;
    out->parallel_tool_calls = true;
    out->thinking = -1;
    out->include_reasoning = true;
    gen_init(&out->gen);
    p->chat = out;
    p->req = out;
    p->gen = &out->gen;
}

static int chat_parse_root(struct parser *p, json_t *root)
{
    struct oa_chat_request *out = p->chat;
    int rc = parse_fields(p, root, chat_fields, COUNT(chat_fields), unsupported_chat,
                          COUNT(unsupported_chat));
    if (!rc && !(p->seen & SEEN_MESSAGES))
        rc = oa_errorf(p->e, MS_EINVAL, "missing_required_parameter", "messages",
                       "'messages' is required");
    if (!rc) rc = gen_finish(p);
    if (!rc) rc = chat_tools_finish(p);
    if (!rc) rc = continue_final_check(p, out->continue_final_message, out->add_generation_prompt, out->messages);
    if (!rc) out->ignored = finish_ignored(p);
    if (rc) oa_chat_request_release(out);
    return rc;
}

int oa_parse_chat(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                  struct oa_chat_request *out, struct oa_error *e)
{
    struct parser p;
    chat_init(&p, lim, a, out, e);
    json_t *root;
    int rc = load_root(&p, body, len, &root);
    if (rc) return rc;
    rc = chat_parse_root(&p, root);
    json_decref(root);
    return rc;
}

int oa_parse_chat_json(json_t *root, const struct oa_limits *lim, struct arena *a,
                       struct oa_chat_request *out, struct oa_error *e)
{
    struct parser p;
    chat_init(&p, lim, a, out, e);
    return chat_parse_root(&p, root);
}

int oa_parse_completion(const char *body, size_t len, const struct oa_limits *lim,
                        struct arena *a, struct oa_completion_request *out, struct oa_error *e)
{
    struct parser p;
    parser_init(&p, EP_COMPLETION, lim, a, e);
    memset(out, 0, sizeof *out);
    gen_init(&out->gen);
    out->gen.add_special_tokens = true; // a raw prompt; a rendered chat already has its tokens
    p.cmpl = out;
    p.req = out;
    p.gen = &out->gen;
    json_t *root;
    int rc = load_root(&p, body, len, &root);
    if (rc) return rc;
    rc = parse_fields(&p, root, completion_fields, COUNT(completion_fields),
                      unsupported_completion, COUNT(unsupported_completion));
    if (!rc && !(p.seen & SEEN_PROMPT))
        rc = oa_errorf(e, MS_EINVAL, "missing_required_parameter", "prompt", "'prompt' is required");
    if (!rc) rc = gen_finish(&p);
    if (!rc) out->ignored = finish_ignored(&p);
    json_decref(root);
    return rc;
}

int oa_parse_tokenize(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                      struct oa_tokenize_request *out, struct oa_error *e)
{
    struct parser p;
    parser_init(&p, EP_TOKENIZE, lim, a, e);
    memset(out, 0, sizeof *out);
    out->add_generation_prompt = true;
    p.tokz = out;
    p.req = out;
    json_t *root;
    int rc = load_root(&p, body, len, &root);
    if (rc) return rc;
    rc = parse_fields(&p, root, tokenize_fields, COUNT(tokenize_fields), unsupported_tokenize,
                      COUNT(unsupported_tokenize));
    bool has_prompt = p.seen & SEEN_PROMPT, has_messages = p.seen & SEEN_MESSAGES;
    if (!rc && has_prompt == has_messages)
        rc = oa_errorf(e, MS_EINVAL, has_prompt ? "invalid_value" : "missing_required_parameter",
                       has_prompt ? "messages" : "prompt",
                       "give exactly one of 'prompt' and 'messages'");
    if (!rc) {
        out->is_chat = has_messages;
        // vLLM's defaults: special tokens added to a raw prompt, not to a rendered chat.
        if (!(p.seen & SEEN_ADD_SPECIAL_TOKENS)) out->add_special_tokens = !out->is_chat;
    }
    if (!rc && out->is_chat)
        rc = continue_final_check(&p, out->continue_final_message, out->add_generation_prompt, out->messages);
    json_decref(root);
    if (rc) oa_tokenize_request_release(out);
    return rc;
}

int oa_parse_detokenize(const char *body, size_t len, const struct oa_limits *lim,
                        struct arena *a, struct oa_detokenize_request *out, struct oa_error *e)
{
    struct parser p;
    parser_init(&p, EP_DETOKENIZE, lim, a, e);
    memset(out, 0, sizeof *out);
    p.detok = out;
    p.req = out;
    json_t *root;
    int rc = load_root(&p, body, len, &root);
    if (rc) return rc;
    rc = parse_fields(&p, root, detokenize_fields, COUNT(detokenize_fields), NULL, 0);
    if (!rc && !(p.seen & SEEN_TOKENS))
        rc = oa_errorf(e, MS_EINVAL, "missing_required_parameter", "tokens", "'tokens' is required");
    json_decref(root);
    return rc;
}

void oa_chat_request_release(struct oa_chat_request *r)
{
    json_decref(r->messages);
    json_decref(r->chat_template_kwargs);
    json_decref(r->tools);
    r->messages = NULL;
    r->chat_template_kwargs = NULL;
    r->tools = NULL;
}

void oa_tokenize_request_release(struct oa_tokenize_request *r)
{
    json_decref(r->messages);
    json_decref(r->chat_template_kwargs);
    json_decref(r->tools);
    r->messages = NULL;
    r->chat_template_kwargs = NULL;
    r->tools = NULL;
}
