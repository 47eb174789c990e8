// openai: the OpenAI wire format. Request bodies of /v1/chat/completions,
// /v1/completions, /tokenize and /detokenize parsed and validated into
// arena-backed structs; the JSON of responses, stream chunks and errors.
// No sockets, no threads: server/ moves the bytes, scheduler/ makes the tokens.
#ifndef MOESERVE_API_OPENAI_H
#define MOESERVE_API_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "model/config.h"
#include "model/sampling.h"
#include "tokenizer/tokenizer.h"

#define OA_MAX_LOGPROBS 20      // top_logprobs / logprobs at most (vLLM's max_logprobs)
#define OA_MAX_N 128            // choices per prompt (OpenAI's bound)
#define OA_MAX_STOP 16          // stop strings per request
#define OA_MAX_STOP_BYTES 1024  // bytes per stop string: the engine's STOP_MAX_STRING_BYTES
#define OA_MAX_STOP_TOKEN_IDS 64
#define OA_MAX_LOGIT_BIAS 1024  // entries in logit_bias
#define OA_MAX_PROMPTS 1024     // prompts in one /v1/completions request

// ---- errors ------------------------------------------------------------------

// One failed request, as the OpenAI error envelope carries it. status is the
// MS_* code the failure came from; http is what the client sees.
struct oa_error {
    int status;          // negative MS_* status
    int http;            // 400, 401, 404, 405, 413, 500, 503...
    const char *type;    // "invalid_request_error", "authentication_error", "server_error"...
    const char *code;    // "invalid_type", "model_not_found"... or NULL
    char param[128];     // "messages[1].content", "" when no single parameter is at fault
    char message[768];
};

// HTTP status for an MS_* status (MS_EINVAL 400, MS_ENOTFOUND 404, MS_EBUSY 503, ...).
int oa_http_status(int ms_status);

// Fills e (http from oa_http_status, type from http) and returns status.
int oa_errorf(struct oa_error *e, int status, const char *code, const char *param,
              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
// For failures with no MS_* status of their own (401, 405, 413): sets http directly.
void oa_error_http(struct oa_error *e, int http, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
json_t *oa_error_json(const struct oa_error *e);

// ---- requests ----------------------------------------------------------------

// What validation needs to know about the model being served.
struct oa_limits {
    const struct gen_defaults *gen; // generation_config.json's defaults, or NULL (vLLM's neutral ones)
    int vocab_size;                 // token ids (logit_bias, stop_token_ids) must be below it: the model's logits
    // Prompt and detokenize ids must be below it: the ids that have text, the
    // tokenizer's (a model's padded rows past them have none; vLLM refuses
    // such a prompt as out of vocabulary). 0: vocab_size.
    int text_vocab_size;
    int max_model_len;              // for messages that quote it; 0 when unknown
    bool logprobs_capped;           // max_logprobs applies (else OA_MAX_LOGPROBS alone)
    int max_logprobs;               // logprobs / top_logprobs at most (--max-logprobs)
};

// Structured output: the language the output must be in, from
// response_format, vLLM's structured_outputs (or its older guided_* fields),
// or llama-server's grammar / json_schema. The route compiles it (grammar/).
enum oa_structured_kind {
    OA_SO_NONE = 0,
    OA_SO_JSON_OBJECT,              // any JSON object
    OA_SO_JSON_SCHEMA,              // text: a JSON Schema document
    OA_SO_REGEX,                    // text: a regular expression
    OA_SO_CHOICE,                   // text: a JSON array of strings
    OA_SO_GRAMMAR,                  // text: a GBNF grammar
};

struct oa_structured {
    enum oa_structured_kind kind;
    const char *text;               // arena, NUL-terminated (may be "" for JSON_OBJECT)
    size_t len;
    const char *param;              // the field it came from, to name in errors
    bool compact_json;              // vLLM's disable_any_whitespace: JSON as {"a": 1, "b": [2, 3]}
};

// Sampling, stopping and output options shared by chat and completions,
// resolved: a value the request omitted holds its default (the checkpoint's
// generation_config.json where it has one, merged by
// sampling_params_merge_defaults).
struct oa_gen_params {
    // temperature, top_p, top_k, min_p, the penalties, the seed and
    // logit_bias, ranges as model/sampling.h checks them; logprobs and
    // prompt_logprobs there are left to the route (see logprobs below).
    struct sampling_params sampling;

    int max_tokens;                 // 0: not given (the room left in the context)
    int min_tokens;                 // vLLM's: no eos or stop token id before this many (0: off)
    // vLLM's truncate_prompt_tokens: the prompt's last k tokens only (0: not
    // given; -1: max_model_len's worth)
    int truncate_prompt_tokens;
    const char **stop;              // (n_stop) non-empty strings
    int n_stop;
    int32_t *stop_token_ids;        // (n_stop_token_ids)
    int n_stop_token_ids;
    int32_t *allowed_token_ids;     // (n_allowed_token_ids) vLLM's: only these may be drawn; NULL: any
    int n_allowed_token_ids;
    bool ignore_eos;
    bool include_stop_str;          // vLLM's include_stop_str_in_output: the matched stop string stays
    bool add_special_tokens;        // the tokenizer's BOS/EOS around the prompt: false for chat, true for completions (vLLM)
    bool skip_special_tokens;       // true

    int n;                          // [1, OA_MAX_N]
    bool stream;
    bool include_usage;             // stream_options.include_usage
    bool continuous_usage_stats;    // stream_options.continuous_usage_stats (vLLM)
    int logprobs;                   // -1 none; else alternatives per token (chat: top_logprobs)
    // vLLM's: -1 none; else each prompt token's logprob, rank and this many
    // alternatives (the response's prompt_logprobs; not when streaming)
    int prompt_logprobs;
    bool return_tokens_as_token_ids;
    const char *user;               // or NULL
    const char *request_id;         // vLLM's request_id, or NULL
    struct oa_structured structured;
};

enum oa_tool_choice {
    OA_TOOL_AUTO = 0,               // the default when tools are given: parse calls
    OA_TOOL_NONE,                   // no call parsing (tools still reach the template)
    OA_TOOL_REQUIRED,               // the output is a call to one of the tools
    OA_TOOL_NAMED,                  // the output is a call to tool_choice_name
};

struct oa_chat_request {
    const char *model;              // NULL when omitted (the first served name)
    json_t *messages;               // owned: a copy with every content a string
    bool add_generation_prompt;     // true
    // vLLM's continue_final_message: the answer goes on from the final
    // message (the assistant's), rendered open, with no generation prompt.
    bool continue_final_message;
    json_t *chat_template_kwargs;   // owned object, or NULL
    struct oa_gen_params gen;
    json_t *tools;                  // owned array of {type: "function", function: {name, ...}}, or NULL
    enum oa_tool_choice tool_choice;
    const char *tool_choice_name;   // OA_TOOL_NAMED: a name in tools
    bool parallel_tool_calls;       // true
    int thinking;                   // -1: the template's default; 0: off (reasoning_effort
                                    // "none", enable_thinking false); 1: on
    bool include_reasoning;         // true: reasoning in the answer (vLLM's include_reasoning)
    const char *ignored;            // unknown top-level fields, comma-separated, or NULL
};

// One prompt of a completions request: text, or token ids.
struct oa_prompt {
    const char *text;               // NULL for ids
    size_t text_len;
    const int32_t *ids;             // (n_ids) when text is NULL
    int n_ids;
};

struct oa_completion_request {
    const char *model;
    struct oa_prompt *prompts;      // (n_prompts), at least one
    int n_prompts;
    bool echo;
    struct oa_gen_params gen;       // gen.logprobs: the legacy integer
    const char *ignored;
};

struct oa_tokenize_request {
    const char *model;
    bool is_chat;                   // messages given instead of prompt
    const char *prompt;             // when !is_chat
    size_t prompt_len;
    json_t *messages;               // owned, when is_chat
    bool add_generation_prompt;     // true
    bool continue_final_message;    // as chat's
    json_t *chat_template_kwargs;   // owned, or NULL
    json_t *tools;                  // owned, or NULL (rendered into the template as chat does)
    bool add_special_tokens;        // true for prompt, false for messages (vLLM)
    bool return_token_strs;
};

struct oa_detokenize_request {
    const char *model;
    int32_t *tokens;                // (n_tokens)
    int n_tokens;
};

// Each parser takes the body bytes as received, allocates from the request's
// arena, and returns 0, or a negative status with e naming the parameter.
// Omitted and null optional fields take their defaults; unknown top-level
// fields are accepted and listed in ->ignored (as vLLM does); fields of the
// OpenAI or vLLM API that moeserve does not implement get a 400 naming them.
int oa_parse_chat(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                  struct oa_chat_request *out, struct oa_error *e);
// The body as one JSON object with duplicate keys refused (*root a new
// reference), or a 400 saying what is wrong with it.
int oa_load_object(const char *body, size_t len, json_t **root, struct oa_error *e);
// The same over a body already parsed (not null, an object; borrowed): the
// Responses and Anthropic Messages parsers translate their bodies into a
// chat body and validate it here, so every API runs the same checks.
int oa_parse_chat_json(json_t *root, const struct oa_limits *lim, struct arena *a,
                       struct oa_chat_request *out, struct oa_error *e);
int oa_parse_completion(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                        struct oa_completion_request *out, struct oa_error *e);
int oa_parse_tokenize(const char *body, size_t len, const struct oa_limits *lim, struct arena *a,
                      struct oa_tokenize_request *out, struct oa_error *e);
int oa_parse_detokenize(const char *body, size_t len, const struct oa_limits *lim,
                        struct arena *a, struct oa_detokenize_request *out, struct oa_error *e);
// The "text" strings of parts (an array of objects whose "text" is a
// string, already checked) joined with "\n", as vLLM joins text parts for
// templates that want a string; total: at least their lengths added up
// (separators are room of their own). A new string, or NULL when out of memory.
json_t *oa_join_texts(json_t *parts, size_t total);
// Drop the JSON the requests hold (safe on zeroed or partly filled structs).
void oa_chat_request_release(struct oa_chat_request *r);
void oa_tokenize_request_release(struct oa_tokenize_request *r);

// ---- responses ---------------------------------------------------------------

struct oa_logprob {
    int32_t id;
    float logprob;
};

// One generated (or echoed prompt) token with its logprob and alternatives.
struct oa_token {
    int32_t id;
    float logprob;
    int32_t rank;                   // a prompt token's (prompt_logprobs), else 0
    bool has_logprob;               // false for the first prompt token under echo
    int n_top;
    struct oa_logprob top[OA_MAX_LOGPROBS];
};

struct oa_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;
};

// What every response and chunk of one request shares.
struct oa_meta {
    const char *id;                 // "chatcmpl-…" / "cmpl-…"
    int64_t created;
    const char *model;              // the served name the client asked for
    const struct tokenizer *tok;    // token strings for logprobs
    bool tokens_as_ids;             // return_tokens_as_token_ids
    int logprobs;                   // -1: no logprobs in the output
    int prompt_logprobs;            // -1: no prompt_logprobs in the output (vLLM's)
};

// One choice, as the server accumulated it.
struct oa_choice {
    int index;
    const char *text;               // the generated text (chat content / completion text)
    size_t text_len;
    const struct oa_token *tokens;  // (n_tokens) generated tokens, for logprobs
    int n_tokens;
    const char *finish_reason;      // "stop", "length", "abort"
    const char *stop_str;           // vLLM's stop_reason: the matched string,
    int32_t stop_id;                // or token id (-1), or null when neither
    // completions with echo: the prompt's text and tokens, before the output
    const char *echo_text;
    size_t echo_len;
    const struct oa_token *echo_tokens;
    int n_echo_tokens;
    // prompt_logprobs: the prompt's tokens, each but the first with its
    // logprob, rank and alternatives
    const struct oa_token *prompt_tokens;
    int n_prompt_tokens;
    // chat: the message's fields as the output parser split them (content,
    // reasoning_content, tool_calls), or NULL for plain content = text
    const json_t *message;
};

// A fresh id with the prefix ("chatcmpl-", "cmpl-"), 24 random hex digits after it.
void oa_make_id(char *out, size_t outlen, const char *prefix);

json_t *oa_usage_json(const struct oa_usage *u);
// chat.completion / text_completion with every choice and usage.
json_t *oa_chat_response(const struct oa_meta *m, const struct oa_choice *c, int n,
                         const struct oa_usage *u);
json_t *oa_completion_response(const struct oa_meta *m, const struct oa_choice *c, int n,
                               const struct oa_usage *u);

// One stream chunk for one choice. role: the first chunk's "assistant" (chat
// only) or NULL. finish_reason NULL while more follow. usage non-NULL adds
// continuous usage. Text and tokens may be empty.
json_t *oa_chat_chunk(const struct oa_meta *m, int index, const char *role, const char *text,
                      size_t text_len, const struct oa_token *tokens, int n_tokens,
                      const char *finish_reason, const char *stop_str, int32_t stop_id,
                      const struct oa_usage *usage);
// The same with a delta built by the caller (the output parser's events);
// takes the reference to delta.
json_t *oa_chat_chunk_delta(const struct oa_meta *m, int index, json_t *delta,
                            const struct oa_token *tokens, int n_tokens, const char *finish_reason,
                            const char *stop_str, int32_t stop_id, const struct oa_usage *usage);
// text_offset_base: characters already streamed for this choice (echo included).
json_t *oa_completion_chunk(const struct oa_meta *m, int index, const char *text, size_t text_len,
                            const struct oa_token *tokens, int n_tokens, long *text_offset,
                            const char *finish_reason, const char *stop_str, int32_t stop_id,
                            const struct oa_usage *usage);
// The include_usage chunk: "choices": [] and usage. object: "chat.completion.chunk" or "text_completion".
json_t *oa_usage_chunk(const struct oa_meta *m, const char *object, const struct oa_usage *u);

// Chat logprobs {"content": [...]} and legacy {"tokens", "token_logprobs",
// "top_logprobs", "text_offset"} (text_offset advanced past the tokens).
json_t *oa_chat_logprobs(const struct oa_meta *m, const struct oa_token *t, int n);
// vLLM's prompt_logprobs: [null, {"id": {"logprob", "rank", "decoded_token"},
// ...}, ...], a dict per prompt token after the first holding the token and
// m->prompt_logprobs alternatives (the token first; where it is one of them,
// it takes that entry's rank, as vLLM's dict does).
json_t *oa_prompt_logprobs(const struct oa_meta *m, const struct oa_token *t, int n);
json_t *oa_legacy_logprobs(const struct oa_meta *m, const struct oa_token *t, int n,
                           long *text_offset);

// The string a logprob entry names a token by: "token_id:N" under
// tokens_as_ids, else its bytes with invalid UTF-8 replaced by U+FFFD.
// Writes at most cap-1 bytes and a NUL; returns the length.
size_t oa_token_str(const struct oa_meta *m, int32_t id, char *out, size_t cap);

// Copies bytes to out replacing each maximal invalid UTF-8 subsequence with
// U+FFFD (as Python's errors="replace" and Rust's from_utf8_lossy do). out
// needs 3 * len + 1 bytes; returns the length written (NUL-terminated).
size_t oa_utf8_lossy(const uint8_t *in, size_t len, char *out);
// Unicode code points in valid UTF-8 text.
long oa_utf8_chars(const char *s, size_t len);

#endif
