// translate: the shared half of the Responses and Anthropic parsers (see
// translate.h) — the field-table walk, the chat body with its map back to the
// API's turns, and the renaming of the chat parser's errors.
#include "api/translate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/json.h"

int tr_oom(struct tr *t)
{
    return oa_errorf(t->e, MS_ENOMEM, "internal_error", NULL, "out of memory parsing the request");
}

int tr_field_accept(struct tr *t, const char *key, json_t *v)
{
    (void)t;
    (void)key;
    (void)v;
    return 0;
}

int tr_type_error(struct tr *t, const char *key, const char *want, const json_t *v)
{
    return oa_errorf(t->e, MS_EINVAL, "invalid_type", key, "'%s' must be %s, got %s", key, want,
                     v ? json_kind(v) : "nothing");
}

int tr_missing(struct tr *t, const char *key)
{
    return oa_errorf(t->e, MS_EINVAL, "missing_required_parameter", key, "'%s' is required", key);
}

int tr_unsupported(struct tr *t, const char *key, const char *fmt, ...)
{
    char msg[sizeof t->e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return oa_errorf(t->e, MS_EUNSUPPORTED, "unsupported_parameter", key, "%s", msg);
}

int tr_init(struct tr *t, const char *list, struct arena *a, struct oa_error *e)
{
    memset(t, 0, sizeof *t);
    memset(e, 0, sizeof *e);
    t->e = e;
    t->a = a;
    t->list = list;
    t->chat = json_object();
    t->messages = json_array();
    if (!t->chat || !t->messages || json_object_set(t->chat, "messages", t->messages)) {
        json_decref(t->messages);
        t->messages = NULL;
        return tr_oom(t);
    }
    json_decref(t->messages); // chat holds it
    return 0;
}

void tr_release(struct tr *t)
{
    json_decref(t->chat);
    free(t->from);
    t->chat = NULL;
    t->messages = NULL;
    t->from = NULL;
}

int tr_load(struct tr *t, const char *body, size_t len, json_t **root)
{
    return oa_load_object(body, len, root, t->e);
}

static void note_ignored(struct tr *t, const char *key)
{
    size_t kl = strlen(key), sep = t->ignored_len ? 2 : 0;
    if (t->ignored_len + sep + kl + 1 > sizeof t->ignored) return;
    memcpy(t->ignored + t->ignored_len, ", ", sep);
    memcpy(t->ignored + t->ignored_len + sep, key, kl + 1);
    t->ignored_len += sep + kl;
}

int tr_fields(struct tr *t, json_t *root, const struct tr_field *rows, size_t n)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        const struct tr_field *f = NULL;
        for (size_t i = 0; i < n && !f; i++)
            if (!strcmp(rows[i].name, key)) f = &rows[i];
        if (!f) {
            note_ignored(t, key);
            continue;
        }
        if (json_is_null(v)) continue;
        int rc = f->fn ? f->fn(t, key, v) : tr_set(t, f->rename, json_incref(v));
        if (rc) return rc;
    }
    return 0;
}

int tr_set(struct tr *t, const char *key, json_t *v)
{
    if (!v || json_object_set_new(t->chat, key, v)) return tr_oom(t);
    return 0;
}

int tr_message(struct tr *t, json_t *m, int from)
{
    if (!m) return tr_oom(t);
    if (t->n_from == t->cap_from) {
        int cap = t->cap_from ? t->cap_from * 2 : 16;
        int *f = realloc(t->from, (size_t)cap * sizeof *f);
        if (!f) {
            json_decref(m);
            return tr_oom(t);
        }
        t->from = f;
        t->cap_from = cap;
    }
    if (json_array_append_new(t->messages, m)) return tr_oom(t);
    t->from[t->n_from++] = from;
    return 0;
}

// Copies src into dst (cap bytes), cut to fit.
static void copy_cut(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memmove(dst, src, n);
    dst[n] = 0;
}

// Replaces every quoted 'from…' in s (the chat parser quotes the names it
// blames) by 'to…', within cap bytes.
static void replace_quoted(char *s, size_t cap, const char *from, const char *to, bool whole)
{
    char out[1024];
    size_t o = 0, fl = strlen(from), tl = strlen(to);
    for (const char *p = s; *p && o + 1 < sizeof out;) {
        if (p[0] == '\'' && !strncmp(p + 1, from, fl) && (!whole || p[1 + fl] == '\'') && o + tl + 2 < sizeof out) {
            out[o++] = '\'';
            memcpy(out + o, to, tl);
            o += tl;
            p += 1 + fl;
            continue;
        }
        out[o++] = *p++;
    }
    out[o] = 0;
    copy_cut(s, cap, out);
}

// "messages[i]…" into the API's turn: list[from[i]], or the list itself.
static void rename_message(struct tr *t, struct oa_error *e)
{
    long i = -1;
    char *end = NULL;
    if (!strncmp(e->param, "messages[", 9)) i = strtol(e->param + 9, &end, 10);
    char api[64];
    if (i >= 0 && i < t->n_from && end && *end == ']' && t->from[i] >= 0)
        snprintf(api, sizeof api, "%s[%d]", t->list, t->from[i]);
    else
        snprintf(api, sizeof api, "%s", t->list);
    char quoted[sizeof e->param];
    snprintf(quoted, sizeof quoted, "%s", e->param);
    replace_quoted(e->message, sizeof e->message, quoted, api, false);
    snprintf(e->param, sizeof e->param, "%s", api);
}

// "tools[3].function.parameters" with the row {"tools[].function.parameters",
// "tools[].input_schema"}: the index is kept, the rest renamed.
static bool rename_row(struct oa_error *e, const struct tr_rename *r)
{
    const char *brackets = strstr(r->chat, "[]");
    char chat[160], api[160];
    if (brackets) {
        size_t head = (size_t)(brackets - r->chat);
        if (strncmp(e->param, r->chat, head) || e->param[head] != '[') return false;
        const char *close = strchr(e->param + head, ']');
        if (!close) return false;
        const char *rest = brackets + 2;
        if (strncmp(close + 1, rest, strlen(rest))) return false;
        size_t idx_len = (size_t)(close + 1 - (e->param + head));
        snprintf(chat, sizeof chat, "%.*s%s", (int)(head + idx_len), e->param, rest);
        const char *ab = strstr(r->api, "[]");
        if (!ab) return false;
        snprintf(api, sizeof api, "%.*s%.*s%s", (int)(ab - r->api), r->api, (int)idx_len,
                 e->param + head, ab + 2);
    } else {
        size_t n = strlen(r->chat);
        if (strncmp(e->param, r->chat, n) || (e->param[n] && e->param[n] != '.' && e->param[n] != '['))
            return false;
        snprintf(chat, sizeof chat, "%s", r->chat);
        snprintf(api, sizeof api, "%s", r->api);
    }
    replace_quoted(e->message, sizeof e->message, chat, api, false);
    char param[320];
    snprintf(param, sizeof param, "%s%s", api, e->param + strlen(chat));
    copy_cut(e->param, sizeof e->param, param);
    return true;
}

int tr_finish(struct tr *t, const struct tr_rename *rows, size_t n, const struct oa_limits *lim,
              struct oa_chat_request *out)
{
    int rc = oa_parse_chat_json(t->chat, lim, t->a, out, t->e);
    if (!rc) {
        out->ignored = t->ignored_len ? arena_strndup(t->a, t->ignored, t->ignored_len) : NULL;
        // The structured output's schema compiles later (the route), and its
        // refusals name this field: the API's name for it.
        struct oa_structured *so = &out->gen.structured;
        struct oa_error named = {0};
        for (size_t i = 0; so->param && i < n; i++) {
            snprintf(named.param, sizeof named.param, "%s", so->param);
            if (!rename_row(&named, &rows[i])) continue;
            const char *api = arena_strdup(t->a, named.param);
            if (!api) {
                oa_chat_request_release(out);
                return tr_oom(t);
            }
            so->param = api;
            break;
        }
        return 0;
    }
    struct oa_error *e = t->e;
    if (!strncmp(e->param, "messages", 8)) {
        rename_message(t, e);
        return rc;
    }
    for (size_t i = 0; i < n; i++)
        if (rename_row(e, &rows[i])) break;
    // Other fields the sentence quotes ("'tool_choice' ... no room for
    // 'response_format.json_schema.schema'") under the API's names too.
    for (size_t i = 0; i < n; i++)
        if (!strstr(rows[i].chat, "[]"))
            replace_quoted(e->message, sizeof e->message, rows[i].chat, rows[i].api, true);
    return rc;
}

int tr_text(struct tr *t, const char *key, json_t *v, const char *const *types, size_t n_types,
            json_t **out)
{
    if (json_is_string(v)) {
        *out = json_incref(v);
        return 0;
    }
    if (!json_is_array(v)) return tr_type_error(t, key, "a string or an array of text parts", v);
    size_t n = json_array_size(v), total = 0;
    char k[160];
    for (size_t i = 0; i < n; i++) {
        json_t *part = json_array_get(v, i), *type = json_object_get(part, "type");
        snprintf(k, sizeof k, "%s[%zu]", key, i);
        if (!json_is_object(part)) return tr_type_error(t, k, "an object", part);
        snprintf(k, sizeof k, "%s[%zu].type", key, i);
        if (!json_is_string(type)) return type ? tr_type_error(t, k, "a string", type) : tr_missing(t, k);
        bool ok = false;
        for (size_t j = 0; j < n_types && !ok; j++) ok = !strcmp(json_string_value(type), types[j]);
        if (!ok)
            return oa_errorf(t->e, MS_EUNSUPPORTED, "unsupported_value", k,
                             "parts of type '%.40s' are not supported here: this model takes text "
                             "(%s)", json_string_value(type), types[0]);
        json_t *text = json_object_get(part, "text");
        snprintf(k, sizeof k, "%s[%zu].text", key, i);
        if (!json_is_string(text)) return text ? tr_type_error(t, k, "a string", text) : tr_missing(t, k);
        if (ms_add_overflow(total, json_string_length(text), &total)) return tr_oom(t);
    }
    *out = oa_join_texts(v, total);
    return *out ? 0 : tr_oom(t);
}
