// app: the wiring of the served model — creating, loading, draining and
// destroying the app (model, tokenizer, chat template, metrics, engine), the
// route table over routes_generate.c, routes_responses.c, routes_anthropic.c
// and routes_text.c, and the few helpers
// every route shares (app_state.h).
#include "server/app.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "server/app_state.h"
#include "server/engine_flags.h"
#include "api/anthropic.h"
#include "server/routes_anthropic.h"
#include "server/routes_generate.h"
#include "server/routes_responses.h"
#include "server/routes_text.h"

// ---- what the routes share -------------------------------------------------------------------

void app_respond_error(struct http_request *r, const struct oa_error *e)
{
    if (e->http == 503) http_add_header(r, "Retry-After", "1");
    http_respond_error(r, e);
}

bool app_serving(struct app *a, struct http_request *r)
{
    int st = atomic_load(&a->state);
    if (st == APP_SERVING) return true;
    struct oa_error e;
    oa_errorf(&e, MS_EBUSY, "service_unavailable", NULL, "%s",
              st == APP_LOADING ? "the model is still loading; retry shortly"
                                : "the server is shutting down and takes no new requests");
    app_respond_error(r, &e);
    return false;
}

const char *app_served_name(struct app *a, const char *model, struct oa_error *e)
{
    if (!model) return a->names[0];
    for (int i = 0; i < a->n_names; i++)
        if (!strcmp(a->names[i], model)) return a->names[i];
    oa_errorf(e, MS_ENOTFOUND, "model_not_found", "model",
              "The model `%.200s` does not exist; this server serves `%.200s`", model, a->names[0]);
    return NULL;
}

// The last occurrence of needle[0..m) in hay[0..n) in *at (NULL: none), in
// linear time (the first of the two reversed, found by glibc's two-way
// memmem): a loop of memmem from each match on was quadratic on repetitive
// text. 0, or MS_ENOMEM for the copies.
static int last_occurrence(const char *hay, size_t n, const char *needle, size_t m, const char **at)
{
    *at = NULL;
    if (m > n) return 0;
    char *rh = malloc(n + 1), *rn = malloc(m + 1);
    if (rh && rn) {
        for (size_t i = 0; i < n; i++) rh[i] = hay[n - 1 - i];
        for (size_t i = 0; i < m; i++) rn[i] = needle[m - 1 - i];
        const char *r = memmem(rh, n, rn, m);
        if (r) *at = hay + (n - (size_t)(r - rh) - m);
    }
    const int rc = rh && rn ? 0 : MS_ENOMEM;
    free(rh);
    free(rn);
    return rc;
}

// The rendered chat cut right after the final message's text, as
// transformers' continue_final_message does: the last place that text (less
// its surrounding whitespace) appears, through its end as the message has it
// when the template kept the message whole (no leading whitespace dropped
// and the trailing kept), else through its stripped end.
static int cut_after_final(json_t *messages, char *text, size_t *len, struct oa_error *e)
{
    json_t *last = json_array_get(messages, json_array_size(messages) - 1);
    const char *m = json_string_value(json_object_get(last, "content"));
    size_t ml = m ? json_string_length(json_object_get(last, "content")) : 0;
    size_t lead = 0, tail = 0;
    while (lead < ml && isspace((unsigned char)m[lead])) lead++;
    while (tail < ml - lead && isspace((unsigned char)m[ml - 1 - tail])) tail++;
    if (!m || lead == ml)
        return oa_errorf(e, MS_EINVAL, "invalid_value", "messages",
                         "the final message has no text for the answer to continue");
    const char *core = m + lead;
    const size_t cl = ml - lead - tail;
    const char *at;
    if (last_occurrence(text, *len, core, cl, &at))
        return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (!at)
        return oa_errorf(e, MS_EINVAL, "invalid_value", "messages",
                         "the final message does not appear in the chat as the template renders it (the "
                         "template changed its text), so the answer cannot continue it");
    size_t end = (size_t)(at - text) + cl;
    if (!lead && tail && *len - end >= tail && !memcmp(text + end, core + cl, tail)) end += tail;
    text[end] = 0;
    *len = end;
    return 0;
}

int app_render_chat(struct app *a, json_t *messages, json_t *tools, bool add_generation_prompt,
                    bool continue_final, json_t *kwargs, char **out, size_t *len, struct oa_error *e)
{
    if (!a->tmpl)
        return oa_errorf(e, MS_EUNSUPPORTED, "unsupported_value", "messages",
                         "this model's tokenizer_config.json has no chat_template; use "
                         "/v1/completions with a prompt instead");
    struct chat_template_args args = {
        .messages = messages,
        .tools = tools,
        .add_generation_prompt = add_generation_prompt,
        .kwargs = kwargs,
        .bos_token = tok_bos_token(a->tok),
        .eos_token = tok_eos_token(a->tok),
    };
    char err[512];
    int rc = chat_template_render(a->tmpl, &args, out, len, err, sizeof err);
    if (rc)
        return oa_errorf(e, rc == MS_ENOMEM ? MS_ENOMEM : MS_EINVAL, "invalid_value", "messages",
                         "the chat template refused these messages: %s", err);
    if (continue_final && (rc = cut_after_final(messages, *out, len, e))) {
        free(*out);
        *out = NULL;
        return rc;
    }
    return 0;
}

json_t *app_chat_kwargs(struct app *a, json_t *request_kwargs, int thinking)
{
    json_t *k = a->default_kwargs ? json_deep_copy(a->default_kwargs) : json_object();
    if (!k) return NULL;
    if (request_kwargs && json_object_update(k, request_kwargs)) goto oom;
    // reasoning_effort (or Anthropic's thinking) over the server's default,
    // but a request's own enable_thinking wins, as vLLM's build_chat_params has it.
    if (thinking >= 0 && !json_object_get(request_kwargs, "enable_thinking") &&
        json_object_set_new(k, "enable_thinking", json_boolean(thinking)))
        goto oom;
    return k;
oom:
    json_decref(k);
    return NULL;
}

int app_refuse_bytes(struct app *a, size_t bytes, const char *param, struct oa_error *e)
{
    const size_t cap = (size_t)a->max_model_len * a->max_bytes_per_id;
    if (bytes <= cap) return 0;
    return oa_errorf(e, MS_ETOOLONG, "context_length_exceeded", param,
                     "This model's maximum context length is %d tokens, and %zu bytes of text "
                     "cannot be fewer than %zu tokens; shorten the prompt",
                     a->max_model_len, bytes, bytes / a->max_bytes_per_id);
}

int app_encode(struct app *a, const char *text, size_t len, const char *param, unsigned flags,
               int32_t **ids_out, int *n_ids, struct oa_error *e)
{
    bool bounded = flags & APP_ENCODE_BOUNDED;
    char err[256];
    size_t n = 0;
    int32_t *ids = NULL;
    // A prompt for generation that cannot fit is refused before any work
    // (its bytes alone say so), or as soon as the tokenizer passes the
    // context: huge prompts cost at most one context's worth of tokenizing.
    int rc = bounded ? app_refuse_bytes(a, len, param, e) : 0;
    if (rc) return rc;
    rc = tok_encode_max(a->tok, text, len, bounded ? (size_t)a->max_model_len : SIZE_MAX,
                        flags & APP_ENCODE_SPECIAL, &ids, &n, err, sizeof err);
    if (rc == MS_ETOOLONG)
        return oa_errorf(e, rc, "context_length_exceeded", param,
                         "This model's maximum context length is %d tokens, and the prompt is "
                         "longer (%s); shorten it", a->max_model_len, err);
    if (rc) return oa_errorf(e, rc, rc == MS_ENOMEM ? "internal_error" : "invalid_value", param, "%s", err);
    if (n > (size_t)INT32_MAX / 2) {
        free(ids);
        return oa_errorf(e, MS_ETOOLONG, "context_length_exceeded", param, "the prompt is too long");
    }
    *ids_out = ids;
    *n_ids = (int)n;
    return 0;
}

// ---- routes ----------------------------------------------------------------------------------

// Every route; the Anthropic ones answer errors in Anthropic's shape.
static const struct http_route routes[] = {
    {.method = "POST", .path = "/v1/chat/completions", .handle = routes_generate_chat},
    {.method = "POST", .path = "/v1/completions", .handle = routes_generate_completions},
    {.method = "POST", .path = "/v1/responses", .handle = routes_responses_create},
    {.method = "POST", .path = "/v1/messages", .handle = routes_anthropic_messages,
     .error_json = an_error_json},
    {.method = "POST", .path = "/v1/messages/count_tokens", .handle = routes_anthropic_count_tokens,
     .error_json = an_error_json},
    {.method = "GET", .path = "/v1/models", .handle = routes_text_models},
    {.method = "GET", .path = "/v1/models/", .handle = routes_text_model, .prefix = true},
    {.method = "GET", .path = "/health", .public_ = true, .handle = routes_text_health},
    {.method = "GET", .path = "/v1/health", .public_ = true, .handle = routes_text_health},
    {.method = "GET", .path = "/ping", .public_ = true, .handle = routes_text_health},
    {.method = "POST", .path = "/ping", .public_ = true, .handle = routes_text_health},
    {.method = "GET", .path = "/metrics", .public_ = true, .handle = routes_text_metrics},
    {.method = "GET", .path = "/dashboard", .public_ = true, .handle = routes_text_dashboard},
    {.method = "POST", .path = "/tokenize", .handle = routes_text_tokenize},
    {.method = "POST", .path = "/detokenize", .handle = routes_text_detokenize},
    {.method = "GET", .path = "/version", .handle = routes_text_version},
};

void app_routes(const struct http_route **out, int *n)
{
    *out = routes;
    *n = (int)(sizeof routes / sizeof routes[0]);
}

// ---- life cycle ------------------------------------------------------------------------------

int app_create(struct app **out, char *err, size_t errlen)
{
    struct app *a = calloc(1, sizeof *a);
    if (!a) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    atomic_init(&a->state, APP_LOADING);
    pthread_mutex_init(&a->health_mu, NULL);
    a->created = ms_unix_time();
    a->health_timeout_s = 120;
    *out = a;
    return 0;
}

// Whether the template makes the model think first: Qwen3's hybrid ones
// switch it with enable_thinking, Thinking-2507's (and QwQ's) generation
// prompt opens <think> itself. Instruct-2507's mentions <think> only to
// replay old turns and never thinks: a reasoning split there would hold
// every grammar back until a </think> that never comes.
static bool template_thinks(struct app *a, const char *src)
{
    if (!src || !strstr(src, "<think>")) return false;
    if (strstr(src, "enable_thinking")) return true;
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
    json_t *kw = app_chat_kwargs(a, NULL, -1);
    char *text = NULL;
    size_t len = 0;
    struct oa_error e;
    memset(&e, 0, sizeof e);
    const bool rendered = msgs && kw && !app_render_chat(a, msgs, NULL, true, false, kw, &text, &len, &e);
    const bool thinks = rendered && output_parser_prompt_in_reasoning(text, len);
    // A template that refuses the probe (one that wants a system message,
    // say) would turn the parser off without a word.
    if (!rendered && msgs && kw)
        ms_log(MS_LOG_WARN, "the chat template holds <think> but refused a one-message probe (%s): "
               "the reasoning parser stays off; --reasoning-parser qwen3 turns it on", e.message);
    free(text);
    json_decref(kw);
    json_decref(msgs);
    return thinks;
}

// What agents need: the grammar vocabulary (tens of milliseconds over a
// 150k vocabulary, once) and a cache of compiled grammars, the reasoning
// parser's switch, the chat_template_kwargs defaults and the tag tokens.
static int load_agents(struct app *a, const struct app_opts *o, char *err, size_t errlen)
{
    const struct model_config *cfg = &a->model->cfg;
    int rc = grammar_vocab_create(a->tok, cfg->vocab_size, cfg->eos_ids, cfg->n_eos, &a->gvocab,
                                  err, errlen);
    if (rc) return rc;
    if ((rc = grammar_cache_create(a->gvocab, 256, (size_t)256 << 20, &a->gcache, err, errlen)))
        return rc;
    a->think_end_id = tok_find_token(a->tok, "</think>");
    a->tool_open_id = tok_find_token(a->tok, "<tool_call>");
    a->tool_close_id = tok_find_token(a->tok, "</tool_call>");
    const char *src = a->template_src ? a->template_src : tok_chat_template(a->tok);
    // Qwen3-Coder's template shows the model XML calls (<function=NAME>,
    // <parameter=KEY>); Qwen3's shows JSON ones.
    const char *tp = o->tool_call_parser ? o->tool_call_parser : "auto";
    a->tool_format = !strcmp(tp, "qwen3_coder") ||
                             (!strcmp(tp, "auto") && src && strstr(src, "<function=") && strstr(src, "<parameter="))
                         ? OUTPUT_TOOLS_QWEN3_XML
                         : OUTPUT_TOOLS_HERMES;
    if (o->default_chat_template_kwargs) {
        json_error_t je;
        a->default_kwargs = json_loads(o->default_chat_template_kwargs, 0, &je);
        if (!json_is_object(a->default_kwargs))
            return ms_err(err, errlen, MS_EINVAL, "--default-chat-template-kwargs is not a JSON "
                          "object: %s", je.text);
    }
    const char *rp = o->reasoning_parser ? o->reasoning_parser : "auto";
    a->reasoning_parser = !strcmp(rp, "qwen3") ||
                          (!strcmp(rp, "auto") && a->think_end_id >= 0 && template_thinks(a, src));
    ms_log(MS_LOG_INFO, "agents: reasoning parser %s, tool calls parsed when tools are given "
           "(%s), structured output on", a->reasoning_parser ? "qwen3" : "off",
           a->tool_format == OUTPUT_TOOLS_QWEN3_XML ? "qwen3_coder" : "hermes");
    return 0;
}

// The default sampling: the checkpoint's generation_config.json (auto),
// none (vllm), or another folder's; then the override's fields over it, as
// vLLM merges them.
static int load_gen_defaults(struct app *a, const struct app_opts *o, char *err, size_t errlen)
{
    const char *g = o->generation_config ? o->generation_config : "auto";
    memset(&a->gen, 0, sizeof a->gen);
    if (!strcmp(g, "auto")) {
        a->gen = a->model->cfg.gen;
    } else if (strcmp(g, "vllm")) {
        char file[4096], *text = NULL, sub[512];
        size_t len = 0;
        int rc = ms_path_join(file, sizeof file, g, "generation_config.json");
        if (!rc) rc = ms_read_file(file, 1 << 20, &text, &len, sub, sizeof sub);
        if (rc) return ms_err(err, errlen, rc, "--generation-config %s: no readable "
                              "generation_config.json there (auto, vllm or a folder): %s", g,
                              rc == MS_ENOTFOUND ? "not found" : sub);
        struct model_config scratch = a->model->cfg;
        memset(&scratch.gen, 0, sizeof scratch.gen);
        rc = config_parse_generation(text, len, &scratch, sub, sizeof sub);
        free(text);
        if (rc) return ms_err(err, errlen, rc, "--generation-config %s: %s", g, sub);
        a->gen = scratch.gen;
    }
    if (!o->override_generation_config) return 0;
    struct model_config scratch = a->model->cfg;
    memset(&scratch.gen, 0, sizeof scratch.gen);
    char sub[512];
    const char *ov = o->override_generation_config;
    int rc = config_parse_generation(ov, strlen(ov), &scratch, sub, sizeof sub);
    if (rc) return ms_err(err, errlen, rc, "--override-generation-config: %s", sub);
    const struct gen_defaults *x = &scratch.gen;
    // Each field the override sets replaces the one below it.
    if (x->has_temperature) a->gen.has_temperature = true, a->gen.temperature = x->temperature;
    if (x->has_top_p) a->gen.has_top_p = true, a->gen.top_p = x->top_p;
    if (x->has_top_k) a->gen.has_top_k = true, a->gen.top_k = x->top_k;
    if (x->has_min_p) a->gen.has_min_p = true, a->gen.min_p = x->min_p;
    if (x->has_repetition_penalty)
        a->gen.has_repetition_penalty = true, a->gen.repetition_penalty = x->repetition_penalty;
    if (x->max_new_tokens > 0) a->gen.max_new_tokens = x->max_new_tokens;
    return 0;
}

// --chat-template: a readable file's text, else the value itself when it
// looks like a template; *out is malloc'd.
static int chat_template_source(const char *v, char **out, char *err, size_t errlen)
{
    char sub[512];
    size_t len;
    int rc = ms_read_file(v, 4u << 20, out, &len, sub, sizeof sub);
    if (!rc) return 0;
    if (strstr(v, "{{") || strstr(v, "{%")) {
        *out = strdup(v);
        return *out ? 0 : ms_err(err, errlen, MS_ENOMEM, "out of memory");
    }
    return ms_err(err, errlen, rc, "--chat-template %s: not a readable file (nor a template's "
                  "text): %s", v, sub);
}

// Long because it is the start-up order in one place: model, tokenizer,
// chat template, served names, metrics, engine, each needing the one
// before. A failure returns at once; app_destroy frees what was loaded.
int app_load(struct app *a, const struct app_opts *o, char *err, size_t errlen)
{
    const struct model_load_opts lo = {.format = o->load_format, .quantization = o->quantization,
                                       .method = o->quant_method, .cache_dir = o->cache_dir};
    int rc = model_load_opts(o->model_dir, &lo, &a->model, err, errlen);
    if (rc) return rc;
    rc = tok_load(o->model_dir, &a->tok, err, errlen);
    if (rc) return rc;
    // No end-of-sequence id inside the vocabulary in config.json or
    // generation_config.json: the tokenizer's eos_token, as vLLM falls back
    // to it (answers, grammars and stop reasons need one).
    struct model_config *cfg = &a->model->cfg;
    if (cfg->n_eos == 0) {
        const char *eos = tok_eos_token(a->tok);
        const int32_t id = eos ? tok_find_token(a->tok, eos) : -1;
        if (id < 0 || id >= cfg->vocab_size)
            return ms_err(err, errlen, MS_EFORMAT, "%s: config.json and generation_config.json name no "
                          "eos_token_id inside the vocabulary (%d ids), and tokenizer_config.json no "
                          "eos_token that is a token: nothing would tell where an answer ends; add "
                          "eos_token_id to generation_config.json", o->model_dir, cfg->vocab_size);
        cfg->eos_ids[0] = id;
        cfg->n_eos = 1;
        ms_log(MS_LOG_WARN, "%s: no eos_token_id in config.json or generation_config.json; using the "
               "tokenizer's eos_token \"%.64s\" (id %d)", o->model_dir, eos, (int)id);
    }
    // The model's own end first (the tokenizer's eos_token, as vLLM takes
    // it): the others stop as stop ids do, naming themselves in stop_reason.
    // vLLM ends every answer there even when generation_config.json lists
    // other ids only (a fine-tune's chat end in the tokenizer, <|endoftext|>
    // in the config): it is put first then, the list's last one giving way
    // when it is full.
    const char *eos_tok = tok_eos_token(a->tok);
    const int32_t eos_id = eos_tok ? tok_find_token(a->tok, eos_tok) : -1;
    if (eos_id >= 0 && eos_id < cfg->vocab_size) {
        int at = 0;
        while (at < cfg->n_eos && cfg->eos_ids[at] != eos_id) at++;
        if (at == cfg->n_eos) at = cfg->n_eos < CONFIG_MAX_EOS ? cfg->n_eos++ : cfg->n_eos - 1;
        memmove(cfg->eos_ids + 1, cfg->eos_ids, (size_t)at * sizeof cfg->eos_ids[0]);
        cfg->eos_ids[0] = eos_id;
    }
    char *own_src = NULL;
    if (o->chat_template && (rc = chat_template_source(o->chat_template, &own_src, err, errlen)))
        return rc;
    const char *src = own_src ? own_src : tok_chat_template(a->tok);
    if (src) {
        char terr[512];
        rc = chat_template_parse(src, strlen(src), &a->tmpl, terr, sizeof terr);
        if (rc) {
            free(own_src);
            return ms_err(err, errlen, rc, "%s: the chat_template does not parse: %s",
                          own_src ? o->chat_template : o->model_dir, terr);
        }
        a->template_src = own_src;
    } else {
        ms_log(MS_LOG_WARN, "%s has no chat_template: /v1/chat/completions will answer 400",
               o->model_dir);
    }
    if (o->n_served > APP_MAX_NAMES)
        return ms_err(err, errlen, MS_EINVAL, "at most %d --served-model-name values", APP_MAX_NAMES);
    for (int i = 0; i < o->n_served; i++) {
        a->names[i] = strdup(o->served_names[i]);
        if (!a->names[i]) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
        a->n_names++;
    }
    if (a->n_names == 0) {
        a->names[0] = strdup(o->model_dir);
        if (!a->names[0]) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
        a->n_names = 1;
    }
    // Before the engine (its KV pool, a prefault of it): a bad flag here is
    // refused in milliseconds, not after the slowest part of a start.
    if ((rc = load_gen_defaults(a, o, err, errlen))) return rc;
    struct engine_opts eo = o->engine;
    if (o->kv_dtype_auto) eo.kv_dtype = engine_flags_auto_kv_dtype(&a->model->cfg);
    struct metrics_opts mo = {
        .n_ranks = eo.data_parallel_size > 0 ? eo.data_parallel_size : 1,
        .n_experts = a->model->cfg.n_experts,
        .n_layers = a->model->cfg.n_layers,
        .imbalance_window = 100,
        .max_model_len = eo.max_model_len > 0 ? eo.max_model_len : a->model->cfg.max_position_embeddings,
    };
    rc = metrics_create(&mo, &a->metrics, err, errlen);
    if (rc) return rc;
    eo.metrics = a->metrics;
    rc = engine_create(a->model, a->tok, &eo, &a->engine, err, errlen);
    if (rc) return rc;
    a->metrics_page = (struct prometheus_page){
        .prefix = o->metrics_prefix ? o->metrics_prefix : "moeserve",
        .model_name = a->names[0],
        .cache_dtype = eo.kv_dtype == DTYPE_F32 ? "float32" : eo.kv_dtype == DTYPE_F16 ? "float16"
                                                                             : "bfloat16",
        .enable_prefix_caching = eo.enable_prefix_caching,
        .gpu_memory_utilization = eo.gpu_memory_utilization,
    };
    a->max_model_len = engine_max_model_len(a->engine);
    a->limits.gen = &a->gen;
    a->limits.logprobs_capped = o->max_logprobs >= 0;
    a->limits.max_logprobs = o->max_logprobs;
    a->limits.vocab_size = a->model->cfg.vocab_size;
    a->limits.text_vocab_size = tok_vocab_size(a->tok);
    if (a->limits.text_vocab_size > a->limits.vocab_size) a->limits.text_vocab_size = a->limits.vocab_size;
    a->limits.max_model_len = a->max_model_len;
    a->max_bytes_per_id = tok_max_bytes_per_id(a->tok);
    if ((rc = load_agents(a, o, err, errlen))) return rc;
    if (o->health_timeout_s > 0) a->health_timeout_s = o->health_timeout_s;
    a->health_t = ms_now();
    atomic_store(&a->state, APP_SERVING);
    return 0;
}

void app_drain(struct app *a, double timeout_s)
{
    if (atomic_load(&a->state) == APP_LOADING || !a->engine) {
        atomic_store(&a->state, APP_DRAINING);
        return;
    }
    atomic_store(&a->state, APP_DRAINING);
    engine_drain(a->engine, timeout_s);
}

void app_destroy(struct app *a)
{
    if (!a) return;
    if (a->engine) engine_destroy(a->engine);
    metrics_destroy(a->metrics);
    chat_template_destroy(a->tmpl);
    grammar_cache_destroy(a->gcache);
    grammar_vocab_destroy(a->gvocab);
    json_decref(a->default_kwargs);
    free(a->template_src);
    if (a->tok) tok_destroy(a->tok);
    if (a->model) model_destroy(a->model);
    for (int i = 0; i < a->n_names; i++) free(a->names[i]);
    pthread_mutex_destroy(&a->health_mu);
    free(a);
}
