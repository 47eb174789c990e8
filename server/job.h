// job: one generation request in flight, the job/SSE state machine. A job
// holds one engine request per choice; their sinks run on the engine thread
// and only copy output under the job's lock and wake the connection, which
// turns it into JSON on an HTTP thread: one body once every choice has
// finished, or SSE chunks as they come, then usage and `data: [DONE]`;
// for the typed-event APIs (event_stream.h), `event: NAME` / `data: JSON`
// frames as their builder emits them.
#ifndef MOESERVE_SERVER_JOB_H
#define MOESERVE_SERVER_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/event_stream.h"
#include "api/openai.h"
#include "api/output_parser.h"
#include "base/arena.h"
#include "scheduler/engine.h"
#include "server/http.h"

#define JOB_MAX_CHOICES 1024 // prompts x n in one request

// One prompt of the request, as token ids.
struct job_prompt {
    int32_t *ids;                    // (n_ids) malloc'd
    int n_ids;
    char *text;                      // for echo: the prompt as text (malloc'd)
    size_t text_len;
    // (n_ids) when echo with logprobs or prompt_logprobs: the prompt's tokens
    // as the engine scored them (one array for echo's logprobs and for
    // prompt_logprobs)
    struct oa_token *scored_tokens;
    // scored_tokens holds the engine's scores: written once, under the
    // job's lock, by the first of the prompt's choices to bring them, and
    // read without it afterwards (another choice's echo may be being
    // written out while a later choice's first delta arrives)
    bool scored;
    bool echoed;                     // an echo with logprobs was taken: the scores are no longer written
    bool max_cut;                    // its choices' max_tokens cut to the room it leaves (a front's)
};

struct job_choice;                   // one choice's output and streaming progress (job.c)

// References: job_create gives its caller one; each submitted choice holds
// one until its engine request finishes, and the connection one from
// job_respond until the HTTP side lets go. The last job_unref frees the job
// with its arena, prompts and choices. The engine must outlive every job.
//
// The route fills the request fields after job_create and before the first
// job_submit; they are read-only from then on. The state fields are this
// module's, under mu.
struct job {
    // request
    struct arena *arena;             // the request's parse arena (16 KiB blocks)
    bool chat, stream, echo;
    bool include_usage, continuous_usage;
    char id[96];
    struct oa_meta meta;             // meta.id points at id
    struct job_prompt *prompts;      // (n_prompts) calloc'd by the route
    int n_prompts;
    // chat: each choice's text split into reasoning, content and tool calls
    // (on the HTTP side, delta by delta as it streams, or once for a body)
    bool parse_output;
    struct output_parser_opts parse_opts; // its tool_defs: tool_defs below
    json_t *tool_defs;               // owned reference: the request's tools, for the parser's types
    bool include_reasoning;
    // Responses and Anthropic Messages: their one choice, always parsed,
    // goes out as that API's typed events or body through es (NULL: the
    // OpenAI chat and completions shapes). es_state is owned: es->destroy
    // when the job ends.
    const struct event_stream_ops *es;
    void *es_state;
    const char *call_id_prefix;      // tool call ids: "call_" when NULL ("toolu_" for Anthropic)
    int32_t think_end_id;            // </think>: output tokens before it are reasoning (-1: none)
    // state
    pthread_mutex_t mu;
    int refs;
    struct engine *engine;
    atomic_uint_least64_t *last_delta_us; // stamped at every engine output (for /health)
    struct http_async *async;
    struct job_choice *choices;      // (n_choices)
    int n_choices;
    int n_finished;
    bool gone;
    bool usage_sent, done_sent;
    bool es_started;
};

// NULL when out of memory. last_delta_us must outlive the job.
struct job *job_create(struct engine *engine, atomic_uint_least64_t *last_delta_us, bool chat);
void job_unref(struct job *j);
// n choices (at most JOB_MAX_CHOICES), none submitted yet. 0 or MS_ENOMEM.
int job_add_choices(struct job *j, int n);
// Submits choice i, which continues prompt `prompt`, as er. On failure
// (engine_submit's code and sentence) the choice holds no reference; the
// caller cancels what it submitted before (job_cancel_all).
int job_submit(struct job *j, int i, int prompt, const struct engine_request *er, char *err,
               size_t errlen);
// Cancels every submitted choice that has not finished (the client is gone,
// or the request failed half way).
void job_cancel_all(struct job *j);
// After every job_submit: answers r as an SSE stream (j->stream) or one
// deferred body, fed by the sinks. MS_ENOMEM (every choice cancelled, r not
// answered) when the response could not be queued.
int job_respond(struct job *j, struct http_request *r);

#endif
