// routes_generate: POST /v1/chat/completions and /v1/completions — parse
// and validate the body, turn the messages or prompts into token ids, check
// them against the context, and submit one engine request per choice as a
// job (server/job.h), which answers with one body or an SSE stream.
#include "server/routes_generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai.h"
#include "base/arena.h"
#include "base/base.h"
#include "grammar/grammar.h"
#include "scheduler/stop.h"
#include "server/app_state.h"
#include "server/job.h"

// The front ends refuse a stop string the engine would, under its own name.
_Static_assert(OA_MAX_STOP_BYTES == STOP_MAX_STRING_BYTES, "api/openai.h and scheduler/stop.h disagree");

// The request as parsed: exactly one of cr (chat) and pr (completions)
// holds it; g, served and param point into it or at static strings.
struct parsed {
    bool chat;
    const struct generate_front *front; // Responses, Anthropic: their parse and output (else NULL)
    json_t *echo;                    // front: what the answer repeats (owned), or NULL
    struct oa_chat_request cr;
    struct oa_completion_request pr;
    const struct oa_gen_params *g;
    const char *served;              // the served model name it asked for
    const char *param;               // where its prompt is: "messages" or "prompt"
    // chat: whether the model thinks first (the rendered kwargs' enable_thinking,
    // and a prompt that left <think> open), and whether tool calls are parsed
    bool thinking, prompt_in_reasoning, tools;
    struct grammar *grammar;         // structured output, or NULL (a reference)
};

static int parse(struct app *a, struct http_request *r, struct job *j, struct parsed *q,
                 struct oa_error *e)
{
    size_t len;
    const char *body = http_body(r, &len);
    const char *model, *ignored;
    int rc;
    if (q->front) {
        rc = q->front->parse(body, len, &a->limits, j->arena, &q->cr, &q->echo, e);
        q->g = &q->cr.gen;
        model = q->cr.model;
        ignored = q->cr.ignored;
    } else if (q->chat) {
        rc = oa_parse_chat(body, len, &a->limits, j->arena, &q->cr, e);
        q->g = &q->cr.gen;
        model = q->cr.model;
        ignored = q->cr.ignored;
    } else {
        rc = oa_parse_completion(body, len, &a->limits, j->arena, &q->pr, e);
        q->g = &q->pr.gen;
        model = q->pr.model;
        ignored = q->pr.ignored;
        j->echo = !rc && q->pr.echo;
    }
    if (rc) return rc;
    if (ignored) ms_log(MS_LOG_WARN, "%s: ignored unknown fields: %s", http_path(r), ignored);
    q->served = app_served_name(a, model, e);
    return q->served ? 0 : e->status;
}

// vLLM's truncate_prompt_tokens: the prompt's last k tokens (its beginning
// dropped, a chat's system prompt with it, as vLLM drops it). True when
// tokens were dropped.
static bool truncate_prompt(const struct app *a, const struct parsed *q, struct job_prompt *p)
{
    int k = q->g->truncate_prompt_tokens;
    if (k == -1) k = a->max_model_len;
    if (k <= 0 || p->n_ids <= k) return false;
    memmove(p->ids, p->ids + (p->n_ids - k), (size_t)k * sizeof *p->ids);
    p->n_ids = k;
    return true;
}

// The encoding flags of a prompt: bounded by the context unless it is to be
// cut to it (truncate_prompt_tokens needs all of it tokenized first).
// Whether the prompt is tokenized whole, past the context: to keep its last
// tokens (truncate_prompt_tokens), or to say how long it is in Anthropic's
// refusal ("prompt is too long: N tokens > M maximum"), whose clients cut by
// N - M as count_tokens would count it.
static bool counts_whole(const struct parsed *q)
{
    return q->g->truncate_prompt_tokens || (q->front && q->front->max_within_context);
}

static unsigned prompt_flags(const struct parsed *q)
{
    return (counts_whole(q) ? 0 : APP_ENCODE_BOUNDED) |
           (q->g->add_special_tokens ? APP_ENCODE_SPECIAL : 0);
}

// The chat's prompt, rendered with its tools and kwargs (reasoning_effort
// decides enable_thinking), and what the rendering says about thinking.
static int chat_prompt(struct app *a, struct parsed *q, struct job_prompt *p, struct oa_error *e)
{
    char *text;
    size_t tl;
    // The rendered prompt holds every message's text: when that alone cannot
    // fit, refuse before the template runs over it.
    size_t bytes = 0, i;
    json_t *m;
    json_array_foreach(q->cr.messages, i, m) bytes += json_string_length(json_object_get(m, "content"));
    int rc = counts_whole(q) ? 0 : app_refuse_bytes(a, bytes, q->param, e);
    if (rc) return rc;
    json_t *kw = app_chat_kwargs(a, q->cr.chat_template_kwargs, q->cr.thinking);
    if (!kw) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    // Qwen3 thinks unless the kwargs say enable_thinking false; an answer
    // that continues the final message goes on past its thinking.
    q->thinking = !json_is_false(json_object_get(kw, "enable_thinking")) && !q->cr.continue_final_message;
    rc = app_render_chat(a, q->cr.messages, q->cr.tools, q->cr.add_generation_prompt,
                         q->cr.continue_final_message, kw, &text, &tl, e);
    json_decref(kw);
    if (rc) return rc;
    q->prompt_in_reasoning = output_parser_prompt_in_reasoning(text, tl);
    q->tools = q->cr.tools && q->cr.tool_choice != OA_TOOL_NONE;
    rc = app_encode(a, text, tl, q->param, prompt_flags(q), &p->ids, &p->n_ids, e);
    free(text);
    if (!rc) truncate_prompt(a, q, p);
    return rc;
}

// A prompt given as text or as ids; with echo, both spellings are kept.
static int completion_prompt(struct app *a, const struct parsed *q, bool echo,
                             const struct oa_prompt *op, struct job_prompt *p, struct oa_error *e)
{
    if (op->text) {
        int rc = app_encode(a, op->text, op->text_len, q->param, prompt_flags(q), &p->ids, &p->n_ids, e);
        if (rc) return rc;
    } else {
        p->ids = malloc((size_t)op->n_ids * sizeof *p->ids);
        if (!p->ids) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        memcpy(p->ids, op->ids, (size_t)op->n_ids * sizeof *p->ids);
        p->n_ids = op->n_ids;
    }
    const bool cut = truncate_prompt(a, q, p);
    if (!echo) return 0;
    // Echo the text as sent; a prompt of ids, or one cut to its last tokens,
    // as those tokens' text (what the model saw).
    if (op->text && !cut) {
        p->text = malloc(op->text_len + 1);
        if (!p->text) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        memcpy(p->text, op->text, op->text_len);
        p->text[op->text_len] = 0;
        p->text_len = op->text_len;
        return 0;
    }
    char err[256];
    int rc = tok_decode(a->tok, p->ids, (size_t)p->n_ids, false, &p->text, &p->text_len, err, sizeof err);
    return rc ? oa_errorf(e, rc, "invalid_value", q->param, "%s", err) : 0;
}

// Every prompt holds a token and leaves room for one; prompts scored for
// echo's logprobs or prompt_logprobs get the entries the engine will fill.
static int check_prompts(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    for (int i = 0; i < j->n_prompts; i++) {
        struct job_prompt *p = &j->prompts[i];
        char pname[32];
        snprintf(pname, sizeof pname, q->chat || j->n_prompts == 1 ? "%s" : "%s[%d]", q->param, i);
        if (p->n_ids == 0)
            return oa_errorf(e, MS_EINVAL, "invalid_value", pname,
                             "the prompt is empty: it must hold at least one token");
        if (p->n_ids >= a->max_model_len)
            return oa_errorf(e, MS_ETOOLONG, "context_length_exceeded", pname,
                             "This model's maximum context length is %d tokens, and the prompt is "
                             "%d tokens, which leaves no room for a completion (--max-model-len)",
                             a->max_model_len, p->n_ids);
        if ((j->echo && q->g->logprobs >= 0) || q->g->prompt_logprobs >= 0) {
            p->scored_tokens = calloc((size_t)p->n_ids, sizeof *p->scored_tokens);
            if (!p->scored_tokens)
                return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
            for (int k = 0; k < p->n_ids; k++) p->scored_tokens[k].id = p->ids[k];
        }
    }
    return 0;
}

static int make_prompts(struct app *a, struct job *j, struct parsed *q, struct oa_error *e)
{
    j->n_prompts = q->chat ? 1 : q->pr.n_prompts;
    j->prompts = calloc((size_t)j->n_prompts, sizeof *j->prompts);
    if (!j->prompts) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    int rc = 0;
    if (q->chat) rc = chat_prompt(a, q, &j->prompts[0], e);
    for (int i = 0; !q->chat && !rc && i < q->pr.n_prompts; i++)
        rc = completion_prompt(a, q, j->echo, &q->pr.prompts[i], &j->prompts[i], e);
    return rc ? rc : check_prompts(a, j, q, e);
}

// A front's answer: always parsed (reasoning, tool calls), built by its
// event stream state from the id, the served name and the prompt's size.
static int make_front(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    j->parse_output = true;
    j->call_id_prefix = q->front->call_id_prefix;
    j->think_end_id = a->think_end_id;
    struct es_meta m = {.id = j->id, .created = j->meta.created, .model = q->served,
                        .prompt_tokens = j->prompts[0].n_ids, .echo = q->echo,
                        .continues = q->cr.continue_final_message};
    j->es_state = q->front->stream_create(&m);
    if (!j->es_state) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    j->es = q->front->ops;
    return 0;
}

// n choices for each prompt, the response's id and what every chunk repeats.
static int make_choices(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    const struct oa_gen_params *g = q->g;
    long total = (long)j->n_prompts * g->n;
    if (total > JOB_MAX_CHOICES)
        return oa_errorf(e, MS_EINVAL, "invalid_value", "n",
                         "%d prompts times n=%d makes %ld choices; at most %d per request",
                         j->n_prompts, g->n, total, JOB_MAX_CHOICES);
    if (job_add_choices(j, (int)total))
        return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    const char *prefix = q->front ? q->front->id_prefix : q->chat ? "chatcmpl-" : "cmpl-";
    if (g->request_id) snprintf(j->id, sizeof j->id, "%s%s", prefix, g->request_id);
    else oa_make_id(j->id, sizeof j->id, prefix);
    j->meta.id = j->id;
    j->meta.created = ms_unix_time();
    j->meta.model = q->served;
    j->meta.tok = a->tok;
    j->meta.tokens_as_ids = g->return_tokens_as_token_ids;
    j->meta.logprobs = g->logprobs;
    j->meta.prompt_logprobs = g->prompt_logprobs;
    j->stream = g->stream;
    j->parse_output = q->chat && (a->reasoning_parser || q->tools);
    // A continued final message is answer text: no reasoning to split off.
    const bool reasoning = a->reasoning_parser && !q->cr.continue_final_message;
    // The parser outlives the request's parse (it runs as the answer streams).
    j->tool_defs = q->tools ? json_incref(q->cr.tools) : NULL;
    j->parse_opts = (struct output_parser_opts){.reasoning = reasoning,
                                                .start_in_reasoning = q->prompt_in_reasoning,
                                                .tools = q->tools,
                                                .max_calls = q->tools && !q->cr.parallel_tool_calls,
                                                .tool_format = a->tool_format,
                                                .tool_defs = j->tool_defs};
    j->include_reasoning = q->chat && q->cr.include_reasoning;
    j->include_usage = g->include_usage;
    // vLLM sends usage on every chunk only when include_usage asks for usage at all.
    j->continuous_usage = g->continuous_usage_stats && g->include_usage;
    return q->front ? make_front(a, j, q, e) : 0;
}

// ---- agents: the grammar of a structured output or a forced tool call ----------

// Local references of a tool's parameters, moved under the call schema's
// root: "#/$defs/X" and "#/definitions/X" become "#/$defs/<prefix>X", "#"
// (the parameters themselves) "#/$defs/<prefix>", and any other "#/Y" (a
// pointer into the parameters, such as "#/properties/name")
// "#/$defs/<prefix>/Y", so that several tools' definitions cannot collide
// and no pointer lands in the call's own wrapper. Rewrites v in place (a
// copy).
static void rewrite_refs(json_t *v, const char *prefix)
{
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) rewrite_refs(x, prefix);
        return;
    }
    if (!json_is_object(v)) return;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!strcmp(k, "$ref") && json_is_string(x)) {
            const char *r = json_string_value(x), *rest;
            if (!strncmp(r, "#/$defs/", 8)) rest = r + 8;
            else if (!strncmp(r, "#/definitions/", 14)) rest = r + 14;
            else if (!strcmp(r, "#")) rest = "";
            else if (!strncmp(r, "#/", 2)) rest = r + 1; // "/Y...": under the parameters' own entry
            else continue; // not local: the grammar engine says so
            const int n = snprintf(NULL, 0, "#/$defs/%s%s", prefix, rest);
            char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
            if (!buf) continue; // left as it was: the grammar engine refuses what it cannot resolve
            snprintf(buf, (size_t)n + 1, "#/$defs/%s%s", prefix, rest);
            json_object_set_new(v, "$ref", json_string(buf));
            free(buf);
        } else {
            rewrite_refs(x, prefix);
        }
    }
}

// The parser keeps a call only when its arguments are a JSON object
// (output_parser's try_call), so a forced call's grammar must write one:
// parameters that say nothing of their type ({}, which clients send for a
// tool without arguments) or allow others beside "object" are narrowed to
// an object; parameters that allow no object are refused (a sentence in
// why). A root with $ref, alternatives or values is left as it is: the
// grammar takes no "type" beside those.
static int args_object_only(json_t *args, const char *tool, char *why, size_t whylen)
{
    static const char *const alone[] = {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"};
    json_t *ty = json_object_get(args, "type");
    if (!ty) {
        for (size_t k = 0; k < sizeof alone / sizeof *alone; k++)
            if (json_object_get(args, alone[k])) return 0;
    } else {
        bool object = json_is_string(ty) && !strcmp(json_string_value(ty), "object");
        size_t i;
        json_t *v;
        if (json_is_array(ty))
            json_array_foreach(ty, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), "object")) object = true;
        if (!object)
            return ms_err(why, whylen, MS_EINVAL, "the parameters of tool '%.100s' allow no JSON object "
                          "(their \"type\"), and a call's arguments are one: give them \"type\": \"object\"",
                          tool);
    }
    return json_object_set_new(args, "type", json_string("object")) ? MS_ENOMEM : 0;
}

// A call of tool i as Hermes writes it, as JSON Schema: {"name": its name,
// "arguments": its parameters, an object} (no parameters: an empty
// object); the parameters' definitions go into defs. NULL with *rc set:
// MS_EINVAL with a sentence in why, or MS_ENOMEM.
static json_t *call_schema(json_t *tool, int i, json_t *defs, int *rc, char *why, size_t whylen)
{
    json_t *f = json_object_get(tool, "function"), *params = json_object_get(f, "parameters");
    json_t *args = json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    *rc = MS_ENOMEM;
    if (!args) return NULL;
    if ((*rc = args_object_only(args, json_string_value(json_object_get(f, "name")), why, whylen))) {
        json_decref(args);
        return NULL;
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "tool%d_", i);
    rewrite_refs(args, prefix);
    json_object_del(args, "$id"); // re-rooted: its refs now point from the call's root
    static const char *const keys[] = {"$defs", "definitions"};
    for (int kk = 0; kk < 2; kk++) {
        json_t *d = json_object_get(args, keys[kk]);
        const char *k;
        json_t *x;
        json_object_foreach(d, k, x) {
            char name[320];
            snprintf(name, sizeof name, "%s%s", prefix, k);
            json_object_set(defs, name, x);
        }
        json_object_del(args, keys[kk]);
    }
    json_object_set(defs, prefix, args); // what "#" in the parameters meant
    json_t *call = json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s]}", "type", "object", "properties", "name",
                             "const", json_object_get(f, "name"), "arguments", args, "required", "name",
                             "arguments");
    *rc = call ? 0 : MS_ENOMEM;
    return call;
}

// tool_choice "required": a call of any tool; named: of that one. *rc as
// call_schema's.
static char *forced_call_schema(const struct oa_chat_request *r, int *rc, char *why, size_t whylen)
{
    json_t *schema = NULL, *defs = json_object();
    size_t i;
    json_t *t;
    *rc = MS_ENOMEM;
    if (!defs) return NULL;
    if (r->tool_choice == OA_TOOL_NAMED) {
        json_array_foreach(r->tools, i, t)
            if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                        r->tool_choice_name))
                schema = call_schema(t, (int)i, defs, rc, why, whylen);
    } else if (json_array_size(r->tools) == 1) {
        schema = call_schema(json_array_get(r->tools, 0), 0, defs, rc, why, whylen);
    } else {
        json_t *any = json_array();
        json_array_foreach(r->tools, i, t) {
            json_t *call = any ? call_schema(t, (int)i, defs, rc, why, whylen) : NULL;
            if (!call || json_array_append_new(any, call)) {
                if (call) *rc = MS_ENOMEM;
                json_decref(any);
                any = NULL;
                break;
            }
        }
        schema = any ? json_pack("{s:o}", "anyOf", any) : NULL;
        if (any && !schema) *rc = MS_ENOMEM;
    }
    if (schema && json_object_size(defs)) json_object_set(schema, "$defs", defs);
    json_decref(defs);
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    json_decref(schema);
    if (schema && !text) *rc = MS_ENOMEM;
    return text;
}

// Compiles (through the app's cache) what the output must be: a forced tool
// call wrapped in its tags, or the request's structured output. A schema or
// grammar that cannot be honoured exactly is a 400 naming the field.
static int make_grammar(struct app *a, struct parsed *q, struct oa_error *e)
{
    static const enum grammar_kind kinds[] = {
        [OA_SO_JSON_OBJECT] = GRAMMAR_JSON_OBJECT, [OA_SO_JSON_SCHEMA] = GRAMMAR_JSON_SCHEMA,
        [OA_SO_REGEX] = GRAMMAR_REGEX, [OA_SO_CHOICE] = GRAMMAR_CHOICE,
        [OA_SO_GRAMMAR] = GRAMMAR_GBNF,
    };
    const struct oa_structured *so = &q->g->structured;
    struct grammar_source src = {0};
    const char *param;
    char *owned = NULL;
    if (q->chat && (q->cr.tool_choice == OA_TOOL_REQUIRED || q->cr.tool_choice == OA_TOOL_NAMED)) {
        char why[256];
        int rc = 0;
        owned = forced_call_schema(&q->cr, &rc, why, sizeof why);
        if (!owned && rc == MS_EINVAL) return oa_errorf(e, rc, "invalid_value", "tools", "%s", why);
        if (!owned) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        src = (struct grammar_source){.kind = GRAMMAR_JSON_SCHEMA, .text = owned,
                                      .len = strlen(owned), .prefix = "<tool_call>\n",
                                      .prefix_len = 12, .suffix = "\n</tool_call>",
                                      .suffix_len = 13};
        param = q->cr.tool_choice == OA_TOOL_NAMED ? "tool_choice" : "tools";
    } else if (so->kind != OA_SO_NONE) {
        src = (struct grammar_source){.kind = kinds[so->kind], .text = so->text, .len = so->len,
                                      .json_compact = so->compact_json};
        param = so->param;
    } else {
        return 0;
    }
    char err[512];
    int rc = grammar_cache_get(a->gcache, &src, &q->grammar, err, sizeof err);
    free(owned);
    if (!rc) return 0;
    if (rc == MS_ENOMEM) return oa_errorf(e, rc, "internal_error", NULL, "%s", err);
    return oa_errorf(e, rc == MS_EUNSUPPORTED ? MS_EUNSUPPORTED : MS_EINVAL,
                     rc == MS_EUNSUPPORTED ? "unsupported_value" : "invalid_value", param,
                     "'%s' cannot be enforced: %s", param, err);
}

static void fill_engine_request(struct app *a, const struct parsed *q, struct job_prompt *p,
                                int choice_in_prompt, int prompt_lp_k,
                                struct engine_request *er)
{
    const struct oa_gen_params *g = q->g;
    engine_request_default(er);
    er->prompt = p->ids;
    er->n_prompt = p->n_ids;
    struct sampling_params *s = &er->sampling;
    *s = g->sampling;
    // n > 1: each choice draws its own stream under the one seed, all reproducible.
    s->stream = (uint32_t)choice_in_prompt;
    s->logprobs = g->logprobs;
    s->prompt_logprobs = prompt_lp_k;
    struct engine_stop *st = &er->stop;
    int room = a->max_model_len - p->n_ids;
    int max = g->max_tokens;
    // OpenAI's and vLLM's default for completions is 16 tokens; a chat may
    // use the rest of the context.
    if (max == 0 && !q->chat) max = room < 16 ? room : 16;
    if (max == 0) {
        max = room;
        if (a->gen.max_new_tokens > 0 && a->gen.max_new_tokens < max) max = a->gen.max_new_tokens;
    }
    if (q->front && q->front->max_within_context && max > room && room > 0) {
        max = room;
        p->max_cut = true;
    }
    st->max_tokens = max;
    // A max_tokens left to the context's room may come out below min_tokens.
    st->min_tokens = g->min_tokens < max ? g->min_tokens : max;
    st->ignore_eos = g->ignore_eos;
    st->include_stop_str = g->include_stop_str;
    st->stop_ids = g->stop_token_ids;
    st->n_stop_ids = g->n_stop_token_ids;
    st->stop_strs = g->stop;
    st->n_stop_strs = g->n_stop;
    st->skip_special_tokens = g->skip_special_tokens;
    er->grammar = q->grammar;
    er->allowed_ids = g->allowed_token_ids;
    er->n_allowed_ids = g->n_allowed_token_ids;
    // A model that thinks first is free until </think>; the grammar governs
    // the answer after it.
    if (q->grammar && a->reasoning_parser && (q->thinking || q->prompt_in_reasoning))
        er->grammar_after = a->think_end_id;
    if (q->tools) {
        er->stop_pause_open = a->tool_open_id;
        er->stop_pause_close = a->tool_close_id;
    }
}

// Submits every choice; the first refusal cancels those already submitted
// and names the parameter to blame.
static int submit_choices(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    const struct oa_gen_params *g = q->g;
    for (int i = 0; i < j->n_choices; i++) {
        int prompt = i / g->n;
        struct engine_request er;
        // Echo's logprobs and prompt_logprobs come from one scoring of the
        // prompt, with as many alternatives as either asks for (each output
        // shows its own count). Every choice scores it for echo (each
        // streams its own echo), the first alone for prompt_logprobs; every
        // scoring choice asks for the same count, as they fill one array.
        const int echo_k = j->echo && g->logprobs >= 0 ? g->logprobs : -1;
        int k = echo_k > g->prompt_logprobs ? echo_k : g->prompt_logprobs;
        if (echo_k < 0 && i % g->n != 0) k = -1;
        fill_engine_request(a, q, &j->prompts[prompt], i % g->n, k, &er);
        char err[512];
        int rc = job_submit(j, i, prompt, &er, err, sizeof err);
        if (rc) {
            const char *code = rc == MS_ETOOLONG ? "context_length_exceeded"
                               : rc == MS_EBUSY   ? "service_unavailable"
                                                  : "invalid_value";
            const char *max = q->front ? q->front->max_param : "max_tokens";
            const char *p = rc == MS_ETOOLONG ? (g->max_tokens ? max : q->param)
                            : rc == MS_EBUSY  ? NULL
                                              : q->param;
            oa_errorf(e, rc, code, p, "%s", err);
            job_cancel_all(j);
            return rc;
        }
    }
    return 0;
}

static void handle_generate(struct app *a, struct http_request *r, bool chat,
                            const struct generate_front *front)
{
    if (!app_serving(a, r)) return;
    struct job *j = job_create(a->engine, &a->last_delta_us, chat);
    if (!j) {
        http_respond_json(r, 500, NULL);
        return;
    }
    struct parsed q;
    memset(&q, 0, sizeof q);
    q.chat = chat;
    q.front = front;
    q.param = front ? front->param : chat ? "messages" : "prompt";
    struct oa_error e;
    int rc = parse(a, r, j, &q, &e);
    if (!rc) rc = make_prompts(a, j, &q, &e);
    if (!rc) rc = make_choices(a, j, &q, &e);
    if (!rc) rc = make_grammar(a, &q, &e);
    if (!rc) rc = submit_choices(a, j, &q, &e);
    for (int i = 0; !rc && i < j->n_prompts; i++) metrics_observe_params(a->metrics, q.g->n, q.g->max_tokens);
    if (rc && front && front->max_within_context && e.code && !strcmp(e.code, "context_length_exceeded") &&
        !strcmp(e.param, q.param)) {
        // Anthropic's wording, which its clients key their recovery on. With
        // max_tokens cut to fit, only the prompt itself can be too long.
        int n = j->n_prompts > 0 && j->prompts[0].n_ids > 0 ? j->prompts[0].n_ids : 0;
        if (n) oa_errorf(&e, e.status, e.code, q.param, "prompt is too long: %d tokens > %d maximum", n,
                         a->max_model_len - 1);
        else oa_errorf(&e, e.status, e.code, q.param, "prompt is too long: more than %d tokens > %d maximum",
                       a->max_model_len, a->max_model_len - 1);
    }
    grammar_unref(q.grammar); // each engine request holds its own
    if (!rc && job_respond(j, r)) rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (chat) oa_chat_request_release(&q.cr);
    json_decref(q.echo);
    if (rc) app_respond_error(r, &e);
    job_unref(j);
}

void routes_generate_chat(void *app, struct http_request *r)
{
    handle_generate(app, r, true, NULL);
}

void routes_generate_completions(void *app, struct http_request *r)
{
    handle_generate(app, r, false, NULL);
}

void routes_generate_front(void *app, struct http_request *r, const struct generate_front *f)
{
    handle_generate(app, r, true, f);
}
