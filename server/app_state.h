// app_state: the served model as the routes see it — what app.c loads and
// routes_generate.c and routes_text.c read — and the helpers they share:
// the serving check, error responses, the served name, the chat template
// and prompt encoding. For server/ only; app.h is the public face.
#ifndef MOESERVE_SERVER_APP_STATE_H
#define MOESERVE_SERVER_APP_STATE_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/chat_template.h"
#include "api/openai.h"
#include "api/output_parser.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "scheduler/metrics.h"
#include "server/http.h"
#include "server/prometheus.h"
#include "tokenizer/tokenizer.h"

#define APP_MAX_NAMES 16

enum app_state { APP_LOADING, APP_SERVING, APP_DRAINING };

// app_load writes every field before state turns APP_SERVING; after that
// they are read-only, except state and last_delta_us (atomics) and the
// health_* fields (under health_mu). Handlers may read the rest on any HTTP
// thread once they have seen APP_SERVING (app_serving).
struct app {
    atomic_int state;
    struct model *model;
    struct tokenizer *tok;
    struct chat_template *tmpl;      // NULL when the checkpoint has none
    char *template_src;              // --chat-template's text (owned), or NULL: the checkpoint's
    struct engine *engine;
    struct metrics *metrics;         // what /metrics renders; the engine feeds it
    struct prometheus_page metrics_page; // its prefix, model_name and cache_config_info
    char *names[APP_MAX_NAMES];      // the served model names; names[0] labels /metrics
    int n_names;
    int max_model_len;
    size_t max_bytes_per_id;         // tok_max_bytes_per_id: the byte floor of a prompt's tokens
    struct gen_defaults gen;         // default sampling (--generation-config and its override)
    struct oa_limits limits;
    int64_t created;
    double health_timeout_s;
    pthread_mutex_t health_mu;
    uint64_t health_steps;           // engine steps at health_t
    double health_t;                 // when /health last saw a step (or no work)
    atomic_uint_least64_t last_delta_us; // the last engine output (job.c stamps it)
    // Agents: structured output's vocabulary and compiled grammars, whether
    // reasoning is split off (--reasoning-parser), the chat_template_kwargs
    // defaults, and the tokens that open and close reasoning and tool calls
    // (-1 when the tokenizer has none).
    struct grammar_vocab *gvocab;
    struct grammar_cache *gcache;
    bool reasoning_parser;
    enum output_tool_format tool_format; // how tool calls are written (--tool-call-parser)
    json_t *default_kwargs;          // owned object, or NULL
    int32_t think_end_id, tool_open_id, tool_close_id;
};

// True while serving; otherwise answers r with 503 (loading, or shutting
// down) and returns false.
bool app_serving(struct app *a, struct http_request *r);
// http_respond_error, with Retry-After on a 503.
void app_respond_error(struct http_request *r, const struct oa_error *e);
// The served name the request asked for (the first when model is NULL), or
// NULL with a 404 in *e. The name lives as long as the app.
const char *app_served_name(struct app *a, const char *model, struct oa_error *e);
// Renders the chat template over messages into *out (malloc'd, *len bytes).
// continue_final: cut after the final message's text, left open for the
// answer to continue (vLLM's continue_final_message). 0, or a status with
// *e filled (400 when the model has no template, the template refuses the
// messages, or the final message is not there to continue).
int app_render_chat(struct app *a, json_t *messages, json_t *tools, bool add_generation_prompt,
                    bool continue_final, json_t *kwargs, char **out, size_t *len, struct oa_error *e);
// The chat_template_kwargs a chat renders with: --default-chat-template-kwargs,
// then the request's, then enable_thinking from reasoning_effort when thinking
// is 0 or 1 and the request's kwargs do not set it (-1: leave it). A new reference, or NULL when out of memory.
json_t *app_chat_kwargs(struct app *a, json_t *request_kwargs, int thinking);
// How app_encode tokenizes.
enum app_encode_flags {
    // A prompt to generate from: text whose bytes alone cannot fit
    // max_model_len tokens is refused before tokenizing, and tokenizing stops
    // with context_length_exceeded past max_model_len tokens.
    APP_ENCODE_BOUNDED = 1,
    // add_special_tokens: the tokenizer's post-processor ids (a BOS) around
    // the text; vLLM's default for a raw prompt, not for a rendered chat.
    APP_ENCODE_SPECIAL = 2,
};
// Tokenizes text into *ids (malloc'd, *n_ids of them); errors name param.
int app_encode(struct app *a, const char *text, size_t len, const char *param, unsigned flags,
               int32_t **ids, int *n_ids, struct oa_error *e);
// context_length_exceeded when `bytes` of text cannot be max_model_len
// tokens or fewer (checked before a template renders messages); else 0.
int app_refuse_bytes(struct app *a, size_t bytes, const char *param, struct oa_error *e);

#endif
