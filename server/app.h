// app: the model being served and the routes over it — OpenAI chat and
// completions turned into engine requests and their output into responses
// and streams (routes_generate.c, job.c); /tokenize, /detokenize,
// /v1/models, /health, /version, /metrics (routes_text.c).
#ifndef MOESERVE_SERVER_APP_H
#define MOESERVE_SERVER_APP_H

#include <stdbool.h>
#include <stddef.h>

#include "scheduler/engine.h"
#include "server/http.h"

struct app_opts {
    const char *model_dir;
    const char *const *served_names; // (n_served); none: the model path as given
    int n_served;
    // --generation-config: NULL or "auto" (the checkpoint's generation_config.json),
    // "vllm" (neutral sampling defaults), or a folder holding a generation_config.json;
    // then --override-generation-config's JSON object over it.
    const char *generation_config;
    const char *override_generation_config;
    const char *chat_template;       // --chat-template: a file, or the template's text; NULL: the checkpoint's
    int max_logprobs;                // --max-logprobs 0..20, or -1 (20)
    struct engine_opts engine;
    bool kv_dtype_auto;              // resolve engine.kv_dtype from the checkpoint
    enum load_format load_format;    // --load-format: auto, or dummy (random weights)
    enum quant_format quantization;  // --quantization (QUANT_NONE: as the checkpoint is)
    enum quant_method quant_method;  // --quantization naming the checkpoint's method (model_load_opts)
    const char *cache_dir;           // --cache-dir (NULL: the default)
    double health_timeout_s;         // /health turns 503 when work waits and no step ends for this long
    // --reasoning-parser: "auto" (qwen3 when the chat template thinks with
    // <think>), "qwen3", or "none" (reasoning stays in content)
    const char *reasoning_parser;
    // --tool-call-parser: "auto" (qwen3_coder when the chat template writes
    // Qwen3-Coder's <function=...> calls, else hermes), "hermes", or
    // "qwen3_coder" (vLLM's qwen3_xml is the same format)
    const char *tool_call_parser;
    const char *default_chat_template_kwargs; // JSON object text, or NULL
    const char *metrics_prefix;      // /metrics series prefix: NULL "moeserve", or "vllm"
};

struct app;

// An app in the loading state: /health answers 503, everything else 503
// too, until app_load has finished.
int app_create(struct app **out, char *err, size_t errlen);
// Loads the model, tokenizer, chat template and engine; then serves.
int app_load(struct app *a, const struct app_opts *o, char *err, size_t errlen);
void app_routes(const struct http_route **routes, int *n);
// /health turns 503 and new generation requests get 503; running ones get
// timeout_s to finish, the rest end with finish_reason abort. Returns once
// the engine has nothing in flight.
void app_drain(struct app *a, double timeout_s);
// Engine and model gone; call after the HTTP server has stopped.
void app_destroy(struct app *a);

#endif
