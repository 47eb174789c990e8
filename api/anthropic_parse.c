// anthropic_parse: a Messages API body into an OpenAI chat body (see
// anthropic.h): system into the first message, content blocks into chat
// messages (tool_use into tool_calls, tool_result into tool messages,
// thinking into reasoning_content), tools and tool_choice into chat's, then
// the chat parser validates it all.
#include <stdio.h>
#include <string.h>

#include "api/anthropic.h"
#include "api/translate.h"
#include "base/base.h"

struct an_parse {
    json_t *system, *messages;       // borrowed from the body
    bool count_only;
    bool has_max_tokens;
    bool has_thinking;
    const char *format_key;          // where a JSON output format came from, to name in errors
};

static struct an_parse *S(struct tr *t)
{
    return t->api;
}

static const char *const text_block[] = {"text"};

// ---- fields --------------------------------------------------------------------------

static int f_system(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_string(v) && !json_is_array(v))
        return tr_type_error(t, k, "a string or an array of text blocks", v);
    S(t)->system = v;
    return 0;
}

static int f_messages(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_array(v)) return tr_type_error(t, k, "an array of messages", v);
    S(t)->messages = v;
    return 0;
}

static int f_max_tokens(struct tr *t, const char *k, json_t *v)
{
    (void)k;
    S(t)->has_max_tokens = true;
    // count_tokens takes the Messages body as is; its max_tokens means nothing there.
    return S(t)->count_only ? 0 : tr_set(t, "max_completion_tokens", json_incref(v));
}

// tools: [{name, description, input_schema, type "custom" or none}].
// Anthropic's server and client tools (bash, text_editor, web_search...)
// need their own runtimes: refused by name.
static int f_tools(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_array(v)) return tr_type_error(t, k, "an array of tools", v);
    json_t *tools = json_array();
    if (!tools) return tr_oom(t);
    size_t i;
    json_t *tool;
    json_array_foreach(v, i, tool) {
        char key[64];
        snprintf(key, sizeof key, "tools[%zu]", i);
        int rc = 0;
        json_t *type = json_object_get(tool, "type");
        if (!json_is_object(tool)) {
            rc = tr_type_error(t, key, "an object", tool);
        } else if (type && !json_is_null(type) &&
                   (!json_is_string(type) || strcmp(json_string_value(type), "custom"))) {
            snprintf(key, sizeof key, "tools[%zu].type", i);
            rc = tr_unsupported(t, key, "'%s' is %s%.40s%s: moeserve runs custom tools only "
                                "(name, description, input_schema), not Anthropic's server or "
                                "built-in tools", key, json_is_string(type) ? "\"" : "",
                                json_is_string(type) ? json_string_value(type) : "not a string",
                                json_is_string(type) ? "\"" : "");
        }
        json_t *fn = rc ? NULL : json_object();
        const char *field;
        json_t *x;
        if (!rc && !fn) rc = tr_oom(t);
        // name and description as they are, input_schema as parameters.
        if (!rc) json_object_foreach(tool, field, x) {
            if (!strcmp(field, "name") || !strcmp(field, "description")) json_object_set(fn, field, x);
            else if (!strcmp(field, "input_schema")) json_object_set(fn, "parameters", x);
        }
        if (!rc) {
            json_t *wrap = json_pack("{s:s, s:o}", "type", "function", "function", fn);
            if (!wrap || json_array_append_new(tools, wrap)) rc = tr_oom(t);
        }
        if (rc) {
            json_decref(tools);
            return rc;
        }
    }
    if (!json_array_size(tools)) {
        json_decref(tools);
        return 0;
    }
    return tr_set(t, "tools", tools);
}

// tool_choice: {type: auto | any | tool (with name) | none, disable_parallel_tool_use}.
static int f_tool_choice(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *type = json_object_get(v, "type"), *dp = json_object_get(v, "disable_parallel_tool_use");
    if (!json_is_string(type))
        return type ? tr_type_error(t, "tool_choice.type", "a string", type)
                    : tr_missing(t, "tool_choice.type");
    if (dp && !json_is_null(dp)) {
        if (!json_is_boolean(dp))
            return tr_type_error(t, "tool_choice.disable_parallel_tool_use", "a boolean", dp);
        int rc = tr_set(t, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
        if (rc) return rc;
    }
    static const struct {
        const char *anthropic, *chat;
    } simple[] = {{"auto", "auto"}, {"any", "required"}, {"none", "none"}};
    const char *ty = json_string_value(type);
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(ty, simple[i].anthropic)) return tr_set(t, "tool_choice", json_string(simple[i].chat));
    if (strcmp(ty, "tool"))
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", "tool_choice.type",
                         "'tool_choice.type' must be auto, any, tool or none, got \"%.40s\"", ty);
    json_t *name = json_object_get(v, "name");
    if (!json_is_string(name))
        return name ? tr_type_error(t, "tool_choice.name", "a string", name)
                    : tr_missing(t, "tool_choice.name");
    return tr_set(t, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
}

// thinking: {type: enabled, budget_tokens} | {type: disabled} | {type:
// adaptive}. Qwen3 thinks or does not: the budget is not a bound here (the
// thinking ends where the model closes it, within max_tokens).
static int f_thinking(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *type = json_object_get(v, "type"), *budget = json_object_get(v, "budget_tokens");
    if (!json_is_string(type))
        return type ? tr_type_error(t, "thinking.type", "a string", type) : tr_missing(t, "thinking.type");
    if (budget && !json_is_null(budget) && !json_is_integer(budget))
        return tr_type_error(t, "thinking.budget_tokens", "an integer", budget);
    const char *ty = json_string_value(type);
    S(t)->has_thinking = true;
    if (!strcmp(ty, "disabled")) return tr_set(t, "reasoning_effort", json_string("none"));
    if (!strcmp(ty, "enabled") || !strcmp(ty, "adaptive"))
        return tr_set(t, "reasoning_effort", json_string("medium"));
    return oa_errorf(t->e, MS_EINVAL, "invalid_value", "thinking.type",
                     "'thinking.type' must be enabled, disabled or adaptive, got \"%.40s\"", ty);
}

// A JSON output format ({type: "json_schema", schema}) as chat's
// response_format: the answer is held to the schema (Anthropic's structured
// outputs; the SDK's messages.parse()).
static int output_format(struct tr *t, const char *k, json_t *v)
{
    char key[64];
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *type = json_object_get(v, "type"), *schema = json_object_get(v, "schema");
    snprintf(key, sizeof key, "%s.type", k);
    if (!json_is_string(type)) return type ? tr_type_error(t, key, "a string", type) : tr_missing(t, key);
    if (strcmp(json_string_value(type), "json_schema"))
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", key, "'%s' must be \"json_schema\", got \"%.40s\"",
                         key, json_string_value(type));
    snprintf(key, sizeof key, "%s.schema", k);
    if (!json_is_object(schema)) return schema ? tr_type_error(t, key, "an object", schema) : tr_missing(t, key);
    if (S(t)->format_key)
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", k, "'output_config.format' and 'output_format' "
                         "both give the answer's format; give one of them");
    S(t)->format_key = !strcmp(k, "output_format") ? "output_format.schema" : "output_config.format.schema";
    return tr_set(t, "response_format", json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema",
                                                  "name", "output", "schema", schema));
}

// output_config: {format, effort}. effort (low to max) weighs how hard
// Claude works; Qwen3 has no such dial (thinking is 'thinking'), so it is
// checked and changes nothing.
static int f_output_config(struct tr *t, const char *k, json_t *v)
{
    static const char *const efforts[] = {"low", "medium", "high", "xhigh", "max"};
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *effort = json_object_get(v, "effort"), *format = json_object_get(v, "format");
    if (effort && !json_is_null(effort)) {
        bool ok = false;
        for (size_t i = 0; json_is_string(effort) && i < sizeof efforts / sizeof efforts[0]; i++)
            ok |= !strcmp(json_string_value(effort), efforts[i]);
        if (!ok)
            return oa_errorf(t->e, MS_EINVAL, "invalid_value", "output_config.effort",
                             "'output_config.effort' must be low, medium, high, xhigh or max");
    }
    return format && !json_is_null(format) ? output_format(t, "output_config.format", format) : 0;
}

static int f_output_format(struct tr *t, const char *k, json_t *v)
{
    return output_format(t, k, v);
}

// context_management: {edits: [...]}: Claude Code sends
// clear_thinking_* edits whenever thinking is on, and the API may send
// clear_tool_uses_* ones. Both only drop old turns' content from what the
// model sees, which here is already so for thinking (Qwen3's template keeps
// no earlier turn's reasoning) and, for tool uses, only ever applies past a
// size this server's context does not reach first; they are taken as
// no-ops. Other edits are refused by type.
static int f_context_management(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *edits = json_object_get(v, "edits");
    if (!edits || json_is_null(edits)) return 0;
    if (!json_is_array(edits)) return tr_type_error(t, "context_management.edits", "an array", edits);
    size_t i;
    json_t *ed;
    json_array_foreach(edits, i, ed) {
        char key[64];
        json_t *type = json_object_get(ed, "type");
        snprintf(key, sizeof key, "context_management.edits[%zu].type", i);
        if (!json_is_string(type)) return type ? tr_type_error(t, key, "a string", type) : tr_missing(t, key);
        const char *ty = json_string_value(type);
        if (strncmp(ty, "clear_thinking_", 15) && strncmp(ty, "clear_tool_uses_", 16))
            return tr_unsupported(t, key, "'%s' is \"%.40s\": moeserve takes clear_thinking_* and "
                                  "clear_tool_uses_* edits only", key, ty);
    }
    return 0;
}

// thread: server-side message threads (the SDK's toolRunner sends
// {type: "create"}, then only new messages with {type: "continue"}). Nothing
// here stores a conversation, so a thread is refused in the shape the SDK
// reads (an_error_json's details), which it can answer by sending the whole
// history (unsupportedRequestBehavior: 'continue_unthreaded'); ignoring it
// would answer a continue without its history.
static int f_thread(struct tr *t, const char *k, json_t *v)
{
    (void)v;
    return oa_errorf(t->e, MS_EUNSUPPORTED, "thread_unsupported_request", k,
                     "'thread' is not served by moeserve: it stores no conversation, so send the whole "
                     "history in 'messages' and leave 'thread' out");
}

static int f_metadata(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *user = json_object_get(v, "user_id");
    if (json_is_string(user)) return tr_set(t, "user", json_incref(user));
    return 0;
}

// Server-side features nothing here runs: refused unless null or empty.
static int f_unserved(struct tr *t, const char *k, json_t *v)
{
    if ((json_is_array(v) && !json_array_size(v)) || (json_is_object(v) && !json_object_size(v)))
        return 0;
    return tr_unsupported(t, k, "'%s' is not served by moeserve's /v1/messages; leave it out", k);
}

static const struct tr_field an_fields[] = {
    {"model", "model", NULL},
    {"messages", NULL, f_messages},
    {"system", NULL, f_system},
    {"max_tokens", NULL, f_max_tokens},
    {"stop_sequences", "stop", NULL},
    {"temperature", "temperature", NULL},
    {"top_p", "top_p", NULL},
    {"top_k", "top_k", NULL},
    {"stream", "stream", NULL},
    {"tools", NULL, f_tools},
    {"tool_choice", NULL, f_tool_choice},
    {"thinking", NULL, f_thinking},
    {"metadata", NULL, f_metadata},
    {"service_tier", NULL, tr_field_accept},
    {"container", NULL, f_unserved},
    {"mcp_servers", NULL, f_unserved},
    {"context_management", NULL, f_context_management},
    {"output_config", NULL, f_output_config},
    {"output_format", NULL, f_output_format},
    {"thread", NULL, f_thread},
    // vLLM's chat extras, for benchmarks and forced outputs
    {"ignore_eos", "ignore_eos", NULL},
    {"structured_outputs", "structured_outputs", NULL},
    {"seed", "seed", NULL},
};

// ---- messages --------------------------------------------------------------------------

// One turn's blocks gathered into what chat messages carry.
struct turn {
    json_t *texts;                   // array of text blocks (for tr_text)
    json_t *thinking;                // array of {type: text, text} of thinking blocks
    json_t *calls;                   // tool_calls
    json_t *results;                 // tool messages, in order
};

static void turn_free(struct turn *u)
{
    json_decref(u->texts);
    json_decref(u->thinking);
    json_decref(u->calls);
    json_decref(u->results);
}

static int block_text(struct tr *t, struct turn *u, json_t *b, const char *key, bool assistant)
{
    (void)assistant;
    json_t *text = json_object_get(b, "text");
    char k[96];
    snprintf(k, sizeof k, "%s.text", key);
    if (!json_is_string(text)) return text ? tr_type_error(t, k, "a string", text) : tr_missing(t, k);
    if (!json_string_length(text)) return 0; // nothing to join (vLLM skips it too)
    return json_array_append_new(u->texts, json_pack("{s:s, s:O}", "type", "text", "text", text))
               ? tr_oom(t) : 0;
}

static int block_thinking(struct tr *t, struct turn *u, json_t *b, const char *key, bool assistant)
{
    json_t *text = json_object_get(b, "thinking");
    char k[96];
    snprintf(k, sizeof k, "%s.thinking", key);
    if (!json_is_string(text)) return text ? tr_type_error(t, k, "a string", text) : tr_missing(t, k);
    if (!assistant) return 0;
    return json_array_append_new(u->thinking, json_pack("{s:s, s:O}", "type", "text", "text", text))
               ? tr_oom(t) : 0;
}

static int block_redacted(struct tr *t, struct turn *u, json_t *b, const char *key, bool assistant)
{
    (void)t, (void)u, (void)b, (void)key, (void)assistant;
    return 0; // encrypted by another model: nothing this one can read
}

static int block_tool_use(struct tr *t, struct turn *u, json_t *b, const char *key, bool assistant)
{
    char k[96];
    json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
           *input = json_object_get(b, "input");
    if (!assistant)
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", key,
                         "'%s': tool_use blocks belong in assistant messages", key);
    snprintf(k, sizeof k, "%s.id", key);
    if (!json_is_string(id)) return id ? tr_type_error(t, k, "a string", id) : tr_missing(t, k);
    snprintf(k, sizeof k, "%s.name", key);
    if (!json_is_string(name)) return name ? tr_type_error(t, k, "a string", name) : tr_missing(t, k);
    snprintf(k, sizeof k, "%s.input", key);
    if (!json_is_object(input)) return input ? tr_type_error(t, k, "an object", input) : tr_missing(t, k);
    char *args = json_dumps(input, JSON_COMPACT);
    json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                    "function", "name", name, "arguments", args)
                        : NULL;
    free(args);
    return !call || json_array_append_new(u->calls, call) ? tr_oom(t) : 0;
}

static int block_tool_result(struct tr *t, struct turn *u, json_t *b, const char *key, bool assistant)
{
    char k[96];
    json_t *id = json_object_get(b, "tool_use_id"), *content = json_object_get(b, "content"), *text;
    if (assistant)
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", key,
                         "'%s': tool_result blocks belong in user messages", key);
    snprintf(k, sizeof k, "%s.tool_use_id", key);
    if (!json_is_string(id)) return id ? tr_type_error(t, k, "a string", id) : tr_missing(t, k);
    snprintf(k, sizeof k, "%s.content", key);
    int rc = content && !json_is_null(content) ? tr_text(t, k, content, text_block, 1, &text)
                                               : ((text = json_string("")) ? 0 : tr_oom(t));
    if (rc) return rc;
    json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text);
    return !m || json_array_append_new(u->results, m) ? tr_oom(t) : 0;
}

typedef int (*block_fn)(struct tr *t, struct turn *u, json_t *b, const char *key, bool assistant);
static const struct {
    const char *type;
    block_fn fn;
} blocks[] = {
    {"text", block_text},
    {"thinking", block_thinking},
    {"redacted_thinking", block_redacted},
    {"tool_use", block_tool_use},
    {"tool_result", block_tool_result},
};

static int turn_blocks(struct tr *t, struct turn *u, json_t *content, int i, bool assistant)
{
    char key[96];
    size_t j;
    json_t *b;
    json_array_foreach(content, j, b) {
        snprintf(key, sizeof key, "messages[%d].content[%zu]", i, j);
        if (!json_is_object(b)) return tr_type_error(t, key, "a content block (an object)", b);
        json_t *type = json_object_get(b, "type");
        char tk[112];
        snprintf(tk, sizeof tk, "%s.type", key);
        if (!json_is_string(type)) return type ? tr_type_error(t, tk, "a string", type) : tr_missing(t, tk);
        block_fn fn = NULL;
        for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++)
            if (!strcmp(blocks[k].type, json_string_value(type))) fn = blocks[k].fn;
        if (!fn)
            return tr_unsupported(t, tk, "content blocks of type \"%.40s\" are not served: this "
                                  "model takes text, tool_use, tool_result and thinking blocks",
                                  json_string_value(type));
        int rc = fn(t, u, b, key, assistant);
        if (rc) return rc;
    }
    return 0;
}

// One Anthropic message into chat messages: a user turn's tool results
// first (each a tool message), then its text; an assistant turn's text,
// thinking and tool_use blocks as one assistant message.
static int one_message(struct tr *t, json_t *m, int i)
{
    char key[64];
    snprintf(key, sizeof key, "messages[%d]", i);
    if (!json_is_object(m)) return tr_type_error(t, key, "an object", m);
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    snprintf(key, sizeof key, "messages[%d].role", i);
    if (!json_is_string(role)) return role ? tr_type_error(t, key, "a string", role) : tr_missing(t, key);
    const char *r = json_string_value(role);
    if (strcmp(r, "user") && strcmp(r, "assistant"))
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", key,
                         "'%s' must be user or assistant, got \"%.40s\" (the system prompt is the "
                         "top-level 'system')", key, r);
    bool assistant = r[0] == 'a';
    snprintf(key, sizeof key, "messages[%d].content", i);
    if (json_is_string(content))
        return tr_message(t, json_pack("{s:s, s:O}", "role", r, "content", content), i);
    if (!json_is_array(content))
        return content ? tr_type_error(t, key, "a string or an array of content blocks", content)
                       : tr_missing(t, key);
    struct turn u = {json_array(), json_array(), json_array(), json_array()};
    int rc = !u.texts || !u.thinking || !u.calls || !u.results ? tr_oom(t) : 0;
    if (!rc) rc = turn_blocks(t, &u, content, i, assistant);
    size_t k;
    json_t *x;
    if (!rc) json_array_foreach(u.results, k, x) if ((rc = tr_message(t, json_incref(x), i))) break;
    json_t *text = NULL, *msg = NULL;
    bool any = json_array_size(u.texts) || json_array_size(u.calls) || json_array_size(u.thinking);
    if (!rc && (any || !json_array_size(u.results))) {
        rc = tr_text(t, key, u.texts, text_block, 1, &text);
        if (!rc && !(msg = json_pack("{s:s, s:o}", "role", r, "content", text))) rc = tr_oom(t);
        if (!rc && json_array_size(u.calls) && json_object_set(msg, "tool_calls", u.calls)) rc = tr_oom(t);
        json_t *th = NULL;
        if (!rc && json_array_size(u.thinking) &&
            (rc = tr_text(t, key, u.thinking, text_block, 1, &th)) == 0 &&
            json_object_set_new(msg, "reasoning_content", th))
            rc = tr_oom(t);
        if (!rc) {
            rc = tr_message(t, msg, i);
            msg = NULL;
        }
        json_decref(msg);
    }
    turn_free(&u);
    return rc;
}

static int all_messages(struct tr *t)
{
    struct an_parse *s = S(t);
    int rc = 0;
    if (s->system) {
        // Claude Code's first system block is a per-request billing header
        // (x-anthropic-billing-header: ...), which vLLM drops: kept, it
        // would change every prompt's start and defeat the prefix cache.
        // Every block checked where the client put it, so that an error
        // names its place in the request, then the header dropped.
        json_t *text;
        if ((rc = tr_text(t, "system", s->system, text_block, 1, &text))) return rc;
        if (json_is_array(s->system)) {
            json_decref(text);
            json_t *kept = json_array();
            size_t i;
            json_t *b;
            json_array_foreach(s->system, i, b) {
                const char *x = json_string_value(json_object_get(b, "text"));
                if (x && !strncmp(x, "x-anthropic-billing-header", 26)) continue;
                if (!kept || json_array_append(kept, b)) {
                    json_decref(kept);
                    return tr_oom(t);
                }
            }
            rc = tr_text(t, "system", kept, text_block, 1, &text);
            json_decref(kept);
            if (rc) return rc;
        }
        // An empty system prompt is none (no empty system turn), as vLLM takes it.
        if (!json_string_length(text)) json_decref(text);
        else if ((rc = tr_message(t, json_pack("{s:s, s:o}", "role", "system", "content", text), -1)))
            return rc;
    }
    if (!s->messages) return tr_missing(t, "messages");
    if (!json_array_size(s->messages))
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", "messages",
                         "'messages' must hold at least one message");
    size_t i;
    json_t *m;
    json_array_foreach(s->messages, i, m) if ((rc = one_message(t, m, (int)i))) return rc;
    return 0;
}

// ---- the whole body --------------------------------------------------------------------

static const struct tr_rename an_renames[] = {
    {"max_completion_tokens", "max_tokens"},
    {"stop", "stop_sequences"},
    {"tools[].function.parameters", "tools[].input_schema"},
    {"tools[].function.name", "tools[].name"},
    {"tools[].function.description", "tools[].description"},
    {"tools[].function", "tools[]"},
    {"tool_choice.function.name", "tool_choice.name"},
    {"reasoning_effort", "thinking"},
    {"continue_final_message", "messages"},
    {"response_format.json_schema.schema", "output_config.format.schema"},
    {"response_format", "output_config.format"},
};


static int parse(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                 bool count_only, struct oa_chat_request *out, struct oa_error *e)
{
    struct tr t;
    struct an_parse s = {.count_only = count_only};
    json_t *root = NULL;
    memset(out, 0, sizeof *out);
    int rc = tr_init(&t, "messages", a, e);
    if (rc) return rc;
    t.api = &s;
    rc = tr_load(&t, body, len, &root);
    if (!rc) rc = tr_fields(&t, root, an_fields, sizeof an_fields / sizeof an_fields[0]);
    if (!rc && !count_only && !s.has_max_tokens) rc = tr_missing(&t, "max_tokens");
    if (!rc && !json_object_get(root, "model")) rc = tr_missing(&t, "model");
    // Anthropic's default is no thinking; Qwen3's template thinks unless told.
    if (!rc && !s.has_thinking) rc = tr_set(&t, "reasoning_effort", json_string("none"));
    if (!rc) rc = all_messages(&t);
    // A final assistant message is a prefill: the answer continues it.
    const json_t *last = json_array_get(s.messages, json_array_size(s.messages) - 1);
    if (!rc && json_is_string(json_object_get(last, "role")) &&
        !strcmp(json_string_value(json_object_get(last, "role")), "assistant") &&
        !(rc = tr_set(&t, "continue_final_message", json_true())))
        rc = tr_set(&t, "add_generation_prompt", json_false());
    if (!rc) rc = tr_finish(&t, an_renames, sizeof an_renames / sizeof an_renames[0], lim, out);
    // output_format (the beta's spelling) is not the rename's output_config.format.
    if (!rc && s.format_key) out->gen.structured.param = s.format_key;
    json_decref(root);
    tr_release(&t);
    return rc;
}

int an_parse(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
             struct oa_chat_request *out, json_t **echo, struct oa_error *e)
{
    *echo = NULL;
    return parse(body, len, lim, a, false, out, e);
}

int an_parse_count_tokens(const char *body, size_t len, const struct oa_limits *lim,
                          struct arena *a, struct oa_chat_request *out, struct oa_error *e)
{
    return parse(body, len, lim, a, true, out, e);
}
