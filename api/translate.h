// translate: what the Responses and Anthropic Messages parsers share. Each
// turns its API's body into an OpenAI chat body (messages, tools, sampling)
// and lets oa_parse_chat_json validate it, so every API runs the same checks
// and becomes the same engine request; these helpers walk the body through a
// field table, and put the chat parser's error back into the API's names.
#ifndef MOESERVE_API_TRANSLATE_H
#define MOESERVE_API_TRANSLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/openai.h"
#include "base/arena.h"

// The translation in progress: the chat body being built, where each chat
// message came from (for errors), and the fields that were ignored.
struct tr {
    struct oa_error *e;
    struct arena *a;
    json_t *chat;                // owned: the chat body
    json_t *messages;            // borrowed from chat: its "messages" array
    const char *list;            // the API's name for its list of turns ("input", "messages")
    int *from;                   // (cap_from) from[i]: the index in list that chat message i
    int n_from, cap_from;        // came from, -1 for none (instructions, system)
    char ignored[512];
    size_t ignored_len;
    void *api;                   // the API parser's own state
};

// One field of an API's body: copied into the chat body under another name
// (rename, when fn is NULL), or handed to fn with its (non-null) value.
typedef int (*tr_field_fn)(struct tr *t, const char *key, json_t *v);
struct tr_field {
    const char *name;
    const char *rename;          // the chat field it becomes
    tr_field_fn fn;
};
// A row's fn for a field that is informational: accepted, nothing to do.
int tr_field_accept(struct tr *t, const char *key, json_t *v);

// One error name: a chat parameter (a prefix: "tools[" matches "tools[3]…"
// when the row says so) and the API's own spelling.
struct tr_rename {
    const char *chat;
    const char *api;
};

// Sets up t (chat body {"messages": []}). 0 or MS_ENOMEM (with e filled).
int tr_init(struct tr *t, const char *list, struct arena *a, struct oa_error *e);
void tr_release(struct tr *t);

// The body as one JSON object (the same refusals as the chat parser's).
int tr_load(struct tr *t, const char *body, size_t len, json_t **root);

// Every key of root through rows: null values are "not given"; keys no row
// names are noted as ignored. Returns the first error.
int tr_fields(struct tr *t, json_t *root, const struct tr_field *rows, size_t n);

// Appends a chat message (takes m) that came from list[from] (-1: none).
int tr_message(struct tr *t, json_t *m, int from);
// Sets key of the chat body (takes v).
int tr_set(struct tr *t, const char *key, json_t *v);

// Validates the chat body into out, then renames the parameter and the
// quoted names of a failure: "messages[i]…" becomes list[from[i]] and the
// first row whose chat name prefixes the rest gives the API's name.
int tr_finish(struct tr *t, const struct tr_rename *rows, size_t n, const struct oa_limits *lim,
              struct oa_chat_request *out);

// Errors with the chat parser's wording.
int tr_type_error(struct tr *t, const char *key, const char *want, const json_t *v);
int tr_missing(struct tr *t, const char *key);
int tr_unsupported(struct tr *t, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tr_oom(struct tr *t);

// A string value, or the text parts of an array joined with "\n" (each part
// an object whose "type" is one of types and whose "text" is a string).
// *out is a new string. key names the value in errors.
int tr_text(struct tr *t, const char *key, json_t *v, const char *const *types, size_t n_types,
            json_t **out);

#endif
