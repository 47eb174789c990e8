// responses_parse: a Responses API body into an OpenAI chat body (see
// responses.h): input items into messages, flat function tools into chat
// tools, text.format into response_format, reasoning.effort into
// reasoning_effort; then the chat parser validates it all.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"
#include "api/translate.h"
#include "base/base.h"

// What the walk over the body keeps for after it: input and instructions
// become messages only once both are known (the body's key order is free),
// and the fields the Response repeats.
struct rs_parse {
    json_t *input, *instructions;
    json_t *echo;
};

static struct rs_parse *S(struct tr *t)
{
    return t->api;
}

static int echo_set(struct tr *t, const char *key, json_t *v)
{
    if (!v || json_object_set_new(S(t)->echo, key, v)) return tr_oom(t);
    return 0;
}

// ---- fields --------------------------------------------------------------------------

static int f_input(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_string(v) && !json_is_array(v))
        return tr_type_error(t, k, "a string or an array of input items", v);
    S(t)->input = v;
    return 0;
}

static int f_instructions(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_string(v)) return tr_type_error(t, k, "a string", v);
    S(t)->instructions = v;
    return echo_set(t, k, json_incref(v));
}

// Function tools are flat here ({type, name, description, parameters,
// strict}); the chat parser checks them in chat's nested shape.
static int f_tools(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_array(v)) return tr_type_error(t, k, "an array of tools", v);
    json_t *tools = json_array();
    if (!tools) return tr_oom(t);
    size_t i;
    json_t *tool;
    char key[64];
    json_array_foreach(v, i, tool) {
        snprintf(key, sizeof key, "tools[%zu]", i);
        json_t *type = json_object_get(tool, "type");
        if (!json_is_object(tool)) {
            json_decref(tools);
            return tr_type_error(t, key, "an object", tool);
        }
        if (!json_is_string(type) || strcmp(json_string_value(type), "function")) {
            json_decref(tools);
            snprintf(key, sizeof key, "tools[%zu].type", i);
            return tr_unsupported(t, key, "'%s' is %s%.40s%s: moeserve runs function tools only "
                                  "(type \"function\"), no hosted tools", key,
                                  json_is_string(type) ? "\"" : "",
                                  json_is_string(type) ? json_string_value(type) : "missing",
                                  json_is_string(type) ? "\"" : "");
        }
        json_t *fn = json_deep_copy(tool), *wrap = NULL;
        if (fn) {
            json_object_del(fn, "type");
            wrap = json_pack("{s:s, s:o}", "type", "function", "function", fn);
        }
        if (!wrap || json_array_append_new(tools, wrap)) {
            json_decref(tools);
            return tr_oom(t);
        }
    }
    if (echo_set(t, k, json_incref(v))) {
        json_decref(tools);
        return t->e->status;
    }
    return json_array_size(tools) ? tr_set(t, "tools", tools) : (json_decref(tools), 0);
}

static int f_tool_choice(struct tr *t, const char *k, json_t *v)
{
    int rc = echo_set(t, k, json_incref(v));
    if (rc) return rc;
    if (json_is_string(v)) return tr_set(t, "tool_choice", json_incref(v));
    if (!json_is_object(v)) return tr_type_error(t, k, "a string or an object", v);
    json_t *type = json_object_get(v, "type"), *name = json_object_get(v, "name");
    if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
        return tr_unsupported(t, "tool_choice.type",
                              "'tool_choice.type' must be \"function\" (with a name); allowed_tools "
                              "and hosted tools are not served");
    if (!json_is_string(name)) return name ? tr_type_error(t, "tool_choice.name", "a string", name)
                                           : tr_missing(t, "tool_choice.name");
    return tr_set(t, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
}

// text: {format: {type: text | json_object | json_schema, name, schema,
// strict, description}, verbosity}.
static int f_text(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *fmt = json_object_get(v, "format"), *verbosity = json_object_get(v, "verbosity");
    if (verbosity && !json_is_null(verbosity) && !json_is_string(verbosity))
        return tr_type_error(t, "text.verbosity", "a string", verbosity);
    int rc = echo_set(t, k, json_incref(v));
    if (rc || !fmt || json_is_null(fmt)) return rc;
    if (!json_is_object(fmt)) return tr_type_error(t, "text.format", "an object", fmt);
    json_t *type = json_object_get(fmt, "type");
    if (!json_is_string(type))
        return type ? tr_type_error(t, "text.format.type", "a string", type)
                    : tr_missing(t, "text.format.type");
    const char *ty = json_string_value(type);
    if (!strcmp(ty, "text") || !strcmp(ty, "json_object"))
        return tr_set(t, "response_format", json_pack("{s:s}", "type", ty));
    if (strcmp(ty, "json_schema"))
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", "text.format.type",
                         "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\", "
                         "got \"%.40s\"", ty);
    json_t *js = json_deep_copy(fmt);
    if (!js) return tr_oom(t);
    json_object_del(js, "type");
    if (!json_object_get(js, "schema")) {
        json_decref(js);
        return tr_missing(t, "text.format.schema");
    }
    return tr_set(t, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
}

// reasoning: {effort, summary}; Qwen3 thinks or does not, and writes no
// summaries (summary is accepted, and the reasoning comes as reasoning_text).
static int f_reasoning(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    json_t *effort = json_object_get(v, "effort");
    int rc = echo_set(t, k, json_pack("{s:O, s:n}", "effort", effort ? effort : json_null(), "summary"));
    if (rc || !effort || json_is_null(effort)) return rc;
    return tr_set(t, "reasoning_effort", json_incref(effort));
}

static int f_store(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_boolean(v)) return tr_type_error(t, k, "a boolean", v);
    if (json_is_true(v))
        return tr_unsupported(t, k, "'store' true is not served: this server keeps no responses "
                              "(stateless, as vLLM without its store); send store false and the "
                              "whole conversation in 'input'");
    return 0;
}

static int f_previous_response_id(struct tr *t, const char *k, json_t *v)
{
    (void)v;
    return tr_unsupported(t, k, "'previous_response_id' is not served: this server keeps no "
                          "responses; send the whole conversation in 'input'");
}

static int f_background(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_boolean(v)) return tr_type_error(t, k, "a boolean", v);
    if (json_is_true(v))
        return tr_unsupported(t, k, "'background' true is not served: responses are not stored to "
                              "poll; stream instead");
    return 0;
}

// include: extra output to add; the only one with a meaning here,
// reasoning.encrypted_content, has nothing to add (reasoning is in the clear).
static int f_include(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_array(v)) return tr_type_error(t, k, "an array of strings", v);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        char key[48];
        snprintf(key, sizeof key, "include[%zu]", i);
        if (!json_is_string(x)) return tr_type_error(t, key, "a string", x);
        if (strcmp(json_string_value(x), "reasoning.encrypted_content"))
            return tr_unsupported(t, key, "'%s' \"%.60s\" is not served (only "
                                  "\"reasoning.encrypted_content\", which adds nothing here)",
                                  key, json_string_value(x));
    }
    return 0;
}

static int f_top_logprobs(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_number(v)) return tr_type_error(t, k, "an integer", v);
    if (json_number_value(v) != 0)
        return tr_unsupported(t, k, "'top_logprobs' is not served on /v1/responses yet; use "
                              "/v1/chat/completions for logprobs");
    return 0;
}

static int f_truncation(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_string(v)) return tr_type_error(t, k, "a string", v);
    if (strcmp(json_string_value(v), "disabled"))
        return tr_unsupported(t, k, "'truncation' must be \"disabled\": the server does not drop "
                              "input items; a conversation beyond the context is refused");
    return 0;
}

static int f_metadata(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    return echo_set(t, k, json_incref(v));
}

static int f_stream_options(struct tr *t, const char *k, json_t *v)
{
    if (!json_is_object(v)) return tr_type_error(t, k, "an object", v);
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (!strcmp(key, "include_obfuscation") && (json_is_boolean(x) || json_is_null(x))) continue;
        return tr_unsupported(t, "stream_options", "'stream_options' takes include_obfuscation "
                              "only here");
    }
    return 0;
}

// Fields of the API that nothing here can honour: refused unless null.
static int f_unserved(struct tr *t, const char *k, json_t *v)
{
    (void)v;
    return tr_unsupported(t, k, "'%s' is not served by moeserve's /v1/responses; leave it out", k);
}

static const struct tr_field rs_fields[] = {
    {"model", "model", NULL},
    {"input", NULL, f_input},
    {"instructions", NULL, f_instructions},
    {"tools", NULL, f_tools},
    {"tool_choice", NULL, f_tool_choice},
    {"parallel_tool_calls", "parallel_tool_calls", NULL},
    {"max_output_tokens", "max_completion_tokens", NULL},
    {"temperature", "temperature", NULL},
    {"top_p", "top_p", NULL},
    {"stream", "stream", NULL},
    {"stream_options", NULL, f_stream_options},
    {"text", NULL, f_text},
    {"reasoning", NULL, f_reasoning},
    {"user", "user", NULL},
    {"metadata", NULL, f_metadata},
    {"store", NULL, f_store},
    {"previous_response_id", NULL, f_previous_response_id},
    {"background", NULL, f_background},
    {"include", NULL, f_include},
    {"top_logprobs", NULL, f_top_logprobs},
    {"truncation", NULL, f_truncation},
    {"service_tier", NULL, tr_field_accept},
    {"prompt_cache_key", NULL, tr_field_accept},
    {"prompt_cache_retention", NULL, tr_field_accept},
    {"safety_identifier", NULL, tr_field_accept},
    {"max_tool_calls", NULL, f_unserved},
    {"prompt", NULL, f_unserved},
    {"conversation", NULL, f_unserved},
    // vLLM's sampling extras on this endpoint
    {"top_k", "top_k", NULL},
    {"min_p", "min_p", NULL},
    {"repetition_penalty", "repetition_penalty", NULL},
    {"presence_penalty", "presence_penalty", NULL},
    {"frequency_penalty", "frequency_penalty", NULL},
    {"seed", "seed", NULL},
    {"request_id", "request_id", NULL},
    // and two of its chat extras, for benchmarks and forced outputs
    {"ignore_eos", "ignore_eos", NULL},
    {"structured_outputs", "structured_outputs", NULL},
};

// ---- input items into messages --------------------------------------------------------

// Turns being put together, as vLLM's construct_chat_messages_with_tool_call
// puts them: a reasoning item, an assistant message or a function call
// fills its slot (reasoning_content, content, tool_calls) of the assistant
// message just before it while that slot is empty (calls always join it);
// otherwise it opens a new assistant message.
struct turns {
    json_t *assistant;               // borrowed: the last message, when it is the assistant's
};

static const char *const text_parts[] = {"input_text", "output_text", "text"};

// Puts value (stolen) in the slot of the assistant message before it, or
// opens one with it.
static int assistant_slot(struct tr *t, struct turns *u, const char *slot, json_t *value, int i)
{
    if (!value) return tr_oom(t);
    if (u->assistant && !json_object_get(u->assistant, slot))
        return json_object_set_new(u->assistant, slot, value) ? tr_oom(t) : 0;
    json_t *m = json_pack("{s:s}", "role", "assistant");
    if (!m || json_object_set_new(m, slot, value)) {
        json_decref(m);
        return tr_oom(t);
    }
    u->assistant = m;
    return tr_message(t, m, i);
}

static int item_message(struct tr *t, struct turns *u, json_t *it, int i)
{
    char key[64];
    json_t *role = json_object_get(it, "role"), *content = json_object_get(it, "content");
    snprintf(key, sizeof key, "input[%d].role", i);
    if (!json_is_string(role)) return role ? tr_type_error(t, key, "a string", role) : tr_missing(t, key);
    static const char *const roles[] = {"user", "assistant", "system", "developer"};
    bool known = false;
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++) known |= !strcmp(json_string_value(role), roles[r]);
    if (!known)
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", key,
                         "'%s' must be user, assistant, system or developer, got \"%.40s\" (tool "
                         "output is a function_call_output item)", key, json_string_value(role));
    snprintf(key, sizeof key, "input[%d].content", i);
    if (!content) return tr_missing(t, key);
    json_t *text;
    int rc = tr_text(t, key, content, text_parts, 3, &text);
    if (rc) return rc;
    if (!strcmp(json_string_value(role), "assistant")) return assistant_slot(t, u, "content", text, i);
    u->assistant = NULL;
    return tr_message(t, json_pack("{s:O, s:o}", "role", role, "content", text), i);
}

static int item_string(struct tr *t, json_t *it, int i, const char *field, json_t **out)
{
    char key[64];
    snprintf(key, sizeof key, "input[%d].%s", i, field);
    json_t *v = json_object_get(it, field);
    if (!json_is_string(v)) return v ? tr_type_error(t, key, "a string", v) : tr_missing(t, key);
    *out = v;
    return 0;
}

// A function call joins the assistant message before it (a turn may call
// several functions), or opens one.
static int item_function_call(struct tr *t, struct turns *u, json_t *it, int i)
{
    json_t *call_id, *name, *args;
    int rc = item_string(t, it, i, "call_id", &call_id);
    if (!rc) rc = item_string(t, it, i, "name", &name);
    if (!rc) rc = item_string(t, it, i, "arguments", &args);
    if (rc) return rc;
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                             "function", "name", name, "arguments", args);
    if (!call) return tr_oom(t);
    json_t *calls = u->assistant ? json_object_get(u->assistant, "tool_calls") : NULL;
    if (json_is_array(calls)) return json_array_append_new(calls, call) ? tr_oom(t) : 0;
    json_t *one = json_array();
    if (!one || json_array_append_new(one, call)) {
        json_decref(one);
        return tr_oom(t);
    }
    return assistant_slot(t, u, "tool_calls", one, i);
}

static int item_function_output(struct tr *t, struct turns *u, json_t *it, int i)
{
    json_t *call_id, *output = json_object_get(it, "output"), *text;
    int rc = item_string(t, it, i, "call_id", &call_id);
    if (rc) return rc;
    char key[64];
    snprintf(key, sizeof key, "input[%d].output", i);
    if (!output) return tr_missing(t, key);
    if ((rc = tr_text(t, key, output, text_parts, 3, &text))) return rc;
    u->assistant = NULL;
    return tr_message(t, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id,
                                   "content", text), i);
}

// A reasoning item's text (its reasoning_text parts, else its summary) is
// an assistant turn's reasoning_content.
static int item_reasoning(struct tr *t, struct turns *u, json_t *it, int i)
{
    static const char *const reasoning_parts[] = {"reasoning_text", "summary_text"};
    json_t *content = json_object_get(it, "content");
    const char *field = "content";
    if (!json_is_array(content) || !json_array_size(content)) {
        content = json_object_get(it, "summary");
        field = "summary";
    }
    if (!content || json_is_null(content)) return 0;
    char key[64];
    snprintf(key, sizeof key, "input[%d].%s", i, field);
    json_t *text;
    int rc = tr_text(t, key, content, reasoning_parts, 2, &text);
    if (rc) return rc;
    return assistant_slot(t, u, "reasoning_content", text, i);
}

typedef int (*item_fn)(struct tr *t, struct turns *u, json_t *it, int i);
static const struct {
    const char *type;
    item_fn fn;
} item_kinds[] = {
    {"message", item_message},
    {"function_call", item_function_call},
    {"function_call_output", item_function_output},
    {"reasoning", item_reasoning},
};

static int input_messages(struct tr *t)
{
    struct rs_parse *s = S(t);
    int rc = 0;
    // Empty instructions are none, as vLLM takes them (no empty system turn).
    if (s->instructions && !(json_is_string(s->instructions) && !json_string_length(s->instructions)))
        rc = tr_message(t, json_pack("{s:s, s:O}", "role", "system", "content", s->instructions), -1);
    if (rc) return rc;
    if (!s->input) return tr_missing(t, "input");
    if (json_is_string(s->input))
        return tr_message(t, json_pack("{s:s, s:O}", "role", "user", "content", s->input), 0);
    struct turns u = {0};
    size_t i;
    json_t *it;
    json_array_foreach(s->input, i, it) {
        char key[64];
        snprintf(key, sizeof key, "input[%zu]", i);
        if (!json_is_object(it)) {
            rc = tr_type_error(t, key, "an object", it);
            break;
        }
        json_t *type = json_object_get(it, "type");
        // An item with a role and no type is a message (the easy input form).
        const char *ty = json_is_string(type) ? json_string_value(type)
                         : !type && json_object_get(it, "role") ? "message" : NULL;
        snprintf(key, sizeof key, "input[%zu].type", i);
        if (!ty) {
            rc = type ? tr_type_error(t, key, "a string", type) : tr_missing(t, key);
            break;
        }
        item_fn fn = NULL;
        for (size_t k = 0; k < sizeof item_kinds / sizeof item_kinds[0]; k++)
            if (!strcmp(item_kinds[k].type, ty)) fn = item_kinds[k].fn;
        if (!fn) {
            rc = tr_unsupported(t, key, "input items of type \"%.40s\" are not served: send "
                                "message, function_call, function_call_output and reasoning items "
                                "(nothing is stored to refer to)", ty);
            break;
        }
        if ((rc = fn(t, &u, it, (int)i))) break;
    }
    if (rc) return rc;
    if (!json_array_size(t->messages))
        return oa_errorf(t->e, MS_EINVAL, "invalid_value", "input", "'input' holds no message");
    return 0;
}

// ---- the whole body --------------------------------------------------------------------

static const struct tr_rename rs_renames[] = {
    {"max_completion_tokens", "max_output_tokens"},
    {"response_format.json_schema.schema", "text.format.schema"},
    {"response_format.json_schema", "text.format"},
    {"response_format", "text.format"},
    {"tools[].function.parameters", "tools[].parameters"},
    {"tools[].function.name", "tools[].name"},
    {"tools[].function.description", "tools[].description"},
    {"tools[].function", "tools[]"},
    {"tool_choice.function.name", "tool_choice.name"},
    {"reasoning_effort", "reasoning.effort"},
};

// A float setting as people write it (0.95, not 0.949999988).
static json_t *setting(float x)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", (double)x);
    return json_real(strtod(buf, NULL));
}

// The sampling the request resolved to, as the Response repeats it.
static int echo_resolved(struct tr *t, const struct oa_chat_request *r)
{
    struct rs_parse *s = S(t);
    int rc = echo_set(t, "temperature", setting(r->gen.sampling.temperature));
    if (!rc) rc = echo_set(t, "top_p", setting(r->gen.sampling.top_p));
    if (!rc) rc = echo_set(t, "parallel_tool_calls", json_boolean(r->parallel_tool_calls));
    if (!rc) rc = echo_set(t, "max_output_tokens",
                           r->gen.max_tokens ? json_integer(r->gen.max_tokens) : json_null());
    if (!rc && !json_object_get(s->echo, "tools")) rc = echo_set(t, "tools", json_array());
    if (!rc && !json_object_get(s->echo, "tool_choice")) rc = echo_set(t, "tool_choice", json_string("auto"));
    if (!rc && !json_object_get(s->echo, "text"))
        rc = echo_set(t, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    if (!rc && !json_object_get(s->echo, "reasoning"))
        rc = echo_set(t, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    if (!rc && !json_object_get(s->echo, "instructions")) rc = echo_set(t, "instructions", json_null());
    if (!rc && !json_object_get(s->echo, "metadata")) rc = echo_set(t, "metadata", json_object());
    if (!rc) rc = echo_set(t, "user", r->gen.user ? json_string(r->gen.user) : json_null());
    return rc;
}

int rs_parse(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
             struct oa_chat_request *out, json_t **echo, struct oa_error *e)
{
    struct tr t;
    struct rs_parse s = {0};
    json_t *root = NULL;
    memset(out, 0, sizeof *out);
    *echo = NULL;
    int rc = tr_init(&t, "input", a, e);
    if (rc) return rc;
    t.api = &s;
    s.echo = json_object();
    if (!s.echo) rc = tr_oom(&t);
    if (!rc) rc = tr_load(&t, body, len, &root);
    if (!rc) rc = tr_fields(&t, root, rs_fields, sizeof rs_fields / sizeof rs_fields[0]);
    if (!rc) rc = input_messages(&t);
    if (!rc) rc = tr_finish(&t, rs_renames, sizeof rs_renames / sizeof rs_renames[0], lim, out);
    if (!rc && (rc = echo_resolved(&t, out))) oa_chat_request_release(out);
    json_decref(root);
    tr_release(&t);
    if (rc) {
        json_decref(s.echo);
        return rc;
    }
    *echo = s.echo;
    return 0;
}
