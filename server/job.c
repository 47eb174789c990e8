// job: the job/SSE state machine (see job.h) — the engine-thread sink that
// records each choice's output, the HTTP side that turns it into one body or
// SSE chunks, and the references that keep a job alive until both are done.
#include "server/job.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"

struct job_choice {
    struct job *job;
    int index;
    int prompt;                      // which prompt it continues
    uint64_t engine_id;
    bool submitted, finished;
    // output so far (under job->mu while unfinished)
    struct ms_buf text;
    struct oa_token *tokens;
    int n_tokens, cap_tokens;
    const char *finish;
    char *stop_str;
    int32_t stop_id;
    char *error;
    int prompt_tokens, completion_tokens, cached_tokens;
    // streaming progress (HTTP side)
    size_t text_sent;
    int tokens_sent;
    bool role_sent, echo_sent, finish_sent;
    long text_offset;                // legacy logprobs: characters streamed
    bool heard;                      // the engine's first delta has come (with the prompt's
                                     // scores when asked, and its cached share)
    struct output_parser *parser;    // HTTP side, when the job parses output (made on first use)
};

static void job_free(struct job *j)
{
    for (int i = 0; i < j->n_choices; i++) {
        struct job_choice *c = &j->choices[i];
        ms_buf_free(&c->text);
        output_parser_destroy(c->parser);
        free(c->tokens);
        free(c->stop_str);
        free(c->error);
    }
    for (int i = 0; i < j->n_prompts; i++) {
        free(j->prompts[i].ids);
        free(j->prompts[i].text);
        free(j->prompts[i].scored_tokens);
    }
    free(j->prompts);
    free(j->choices);
    if (j->es) j->es->destroy(j->es_state);
    json_decref(j->tool_defs);
    http_async_unref(j->async);
    arena_destroy(j->arena);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void job_unref(struct job *j)
{
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

static uint64_t now_us(void)
{
    return (uint64_t)(ms_now() * 1e6);
}

static void token_from_engine(struct oa_token *o, const struct sample_token *t, bool with_lp)
{
    o->id = t->id;
    o->logprob = t->logprob;
    o->rank = t->rank;
    o->has_logprob = with_lp;
    o->n_top = with_lp ? t->n_top : 0;
    if (o->n_top > OA_MAX_LOGPROBS) o->n_top = OA_MAX_LOGPROBS;
    for (int k = 0; k < o->n_top; k++) {
        o->top[k].id = t->top[k].id;
        o->top[k].logprob = t->top[k].logprob;
    }
}

// On the engine thread: copy, wake, return. Long because one delta may carry
// everything at once (prompt logprobs, text, tokens, the finish) and all of
// it is copied in one lock hold, so the HTTP side never sees half a delta.
static void on_delta(void *ctx, const struct engine_delta *d)
{
    struct job_choice *c = ctx;
    struct job *j = c->job;
    atomic_store(j->last_delta_us, now_us());
    bool with_lp = j->meta.logprobs >= 0;
    pthread_mutex_lock(&j->mu);
    struct job_prompt *p = &j->prompts[c->prompt];
    if (d->prompt_tokens_lp && p->scored_tokens && !p->scored && !p->echoed) {
        // Entries are for prompt tokens 1..n-1; the first has no logprob.
        for (int i = 0; i < d->n_prompt_tokens_lp && i + 1 < p->n_ids; i++)
            token_from_engine(&p->scored_tokens[i + 1], &d->prompt_tokens_lp[i], true);
        p->scored = true;
    }
    c->heard = true;
    bool oom = false;
    if (d->text_len && ms_buf_append(&c->text, d->text, d->text_len)) oom = true;
    if (d->n_tokens > 0) {
        int need = c->n_tokens + d->n_tokens;
        if (need > c->cap_tokens) {
            int cap = c->cap_tokens ? c->cap_tokens * 2 : 16;
            while (cap < need) cap *= 2;
            struct oa_token *t = realloc(c->tokens, (size_t)cap * sizeof *t);
            if (t) {
                c->tokens = t;
                c->cap_tokens = cap;
            } else {
                oom = true;
            }
        }
        if (need <= c->cap_tokens) {
            // Without logprobs only the ids matter; skip copying the alternatives.
            for (int i = 0; i < d->n_tokens; i++) {
                struct oa_token *o = &c->tokens[c->n_tokens + i];
                if (with_lp) token_from_engine(o, &d->tokens[i], true);
                else o->id = d->tokens[i].id, o->n_top = 0, o->has_logprob = false;
            }
            c->n_tokens = need;
        }
    }
    c->prompt_tokens = d->prompt_tokens;
    c->completion_tokens = d->completion_tokens;
    c->cached_tokens = d->cached_tokens;
    bool finished = false;
    if (d->finish != FINISH_NONE && !c->finished) {
        c->finished = true;
        finished = true;
        c->finish = engine_finish_name(d->finish);
        c->stop_str = d->stop_str ? strdup(d->stop_str) : NULL;
        c->stop_id = d->stop_id;
        if (d->error) c->error = strdup(d->error);
        else if (oom) c->error = strdup("out of memory collecting the output");
        j->n_finished++;
    }
    struct http_async *a = j->async;
    // A whole-body response only cares when a choice ends; a stream, always.
    bool wake = a && (j->stream || finished);
    pthread_mutex_unlock(&j->mu);
    if (wake) http_async_wake(a);
    if (finished) job_unref(j); // the engine request's reference, dropped after the wake
}

void job_cancel_all(struct job *j)
{
    uint64_t ids[JOB_MAX_CHOICES];
    int n = 0;
    pthread_mutex_lock(&j->mu);
    j->gone = true;
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].submitted && !j->choices[i].finished) ids[n++] = j->choices[i].engine_id;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) engine_cancel(j->engine, ids[i]);
}

static void job_usage(struct job *j, struct oa_usage *u)
{
    memset(u, 0, sizeof *u);
    for (int p = 0; p < j->n_prompts; p++) {
        // Every choice of a prompt reports the same prompt; count it once.
        const struct job_choice *c = NULL;
        for (int i = 0; i < j->n_choices; i++)
            if (j->choices[i].prompt == p) {
                c = &j->choices[i];
                break;
            }
        u->prompt_tokens += c && c->prompt_tokens ? c->prompt_tokens : j->prompts[p].n_ids;
        u->cached_tokens += c ? c->cached_tokens : 0;
    }
    for (int i = 0; i < j->n_choices; i++) u->completion_tokens += j->choices[i].completion_tokens;
}

static void job_choice_view(struct job *j, const struct job_choice *c, struct oa_choice *o)
{
    memset(o, 0, sizeof *o);
    o->index = c->index;
    o->text = c->text.data;
    o->text_len = c->text.len;
    o->tokens = c->tokens;
    o->n_tokens = c->n_tokens;
    o->finish_reason = c->finish ? c->finish : "abort";
    o->stop_str = c->stop_str;
    o->stop_id = c->stop_str ? -1 : c->stop_id;
    const struct job_prompt *p = &j->prompts[c->prompt];
    if (j->echo) {
        o->echo_text = p->text;
        o->echo_len = p->text_len;
        o->echo_tokens = p->scored_tokens;
        o->n_echo_tokens = p->scored_tokens ? p->n_ids : 0;
    }
    if (j->meta.prompt_logprobs >= 0) {
        o->prompt_tokens = p->scored_tokens;
        o->n_prompt_tokens = p->scored_tokens ? p->n_ids : 0;
    }
}

// ---- the HTTP side of a job ---------------------------------------------------------------

// Tool call ids as the API spells them: "call_" (or the job's prefix,
// Anthropic's "toolu_") and 24 random hex digits.
static void make_call_id(void *ctx, int index, char *out, size_t cap)
{
    const struct job *j = ctx;
    (void)index;
    oa_make_id(out, cap, j->call_id_prefix ? j->call_id_prefix : "call_");
}

static struct output_parser *choice_parser(struct job *j, struct job_choice *c)
{
    if (!j->parse_output) return NULL;
    if (!c->parser) {
        struct output_parser_opts o = j->parse_opts;
        o.make_id = make_call_id;
        o.make_id_ctx = j;
        char err[128];
        if (output_parser_create(&o, &c->parser, err, sizeof err)) c->parser = NULL;
    }
    return c->parser;
}

// The whole answer of a finished choice through its parser: the message's
// fields in *message (a new object) and the finish reason to report.
static int parse_whole(struct job *j, struct job_choice *c, json_t **message, const char **finish)
{
    struct output_parser *p = choice_parser(j, c);
    const struct output_event *ev;
    size_t n_ev;
    char err[128];
    *message = NULL;
    if (!p || output_parser_feed(p, c->text.data ? c->text.data : "", c->text.len, &ev, &n_ev, err,
                                 sizeof err) ||
        output_parser_finish(p, &ev, &n_ev, err, sizeof err))
        return MS_ENOMEM;
    json_t *m = json_object();
    if (!m || output_parser_message_fill(p, m, j->include_reasoning)) {
        json_decref(m);
        return MS_ENOMEM;
    }
    *message = m;
    *finish = output_parser_finish_reason(p, *finish);
    return 0;
}

// ---- the typed-event APIs (Responses, Anthropic Messages) -----------------------------------

// Output tokens before the first </think> token; none when the answer had
// no reasoning. When </think> came spelled in ordinary tokens (a grammar
// wrote it), the reasoning text re-encoded, its two tags included.
static int reasoning_tokens(const struct job *j, const struct job_choice *c)
{
    size_t len = 0;
    const char *text = c->parser ? output_parser_reasoning(c->parser, &len) : NULL;
    if (!text || !len) return 0;
    for (int i = 0; i < c->n_tokens; i++)
        if (j->think_end_id >= 0 && c->tokens[i].id == j->think_end_id) return i;
    int n = c->completion_tokens;
    size_t n_ids = 0;
    int32_t *ids = NULL;
    char err[64];
    if (j->meta.tok && !tok_encode(j->meta.tok, text, len, &ids, &n_ids, err, sizeof err) &&
        n_ids + 2 < (size_t)n)
        n = (int)n_ids + 2;
    free(ids);
    return n;
}

// How a finished choice ended, once its parser has had the whole text.
static void es_result_of(struct job *j, const struct job_choice *c, struct es_result *r)
{
    memset(r, 0, sizeof *r);
    job_usage(j, &r->usage);
    r->finish = output_parser_finish_reason(c->parser, c->finish ? c->finish : "abort");
    r->stop_str = c->stop_str;
    r->reasoning_tokens = reasoning_tokens(j, c);
    r->context_full = j->prompts[c->prompt].max_cut && !strcmp(r->finish, "length");
}

static void es_error(struct job_choice *c, struct oa_error *e)
{
    oa_errorf(e, MS_EINTERNAL, "internal_error", NULL, "%s",
              c->error ? c->error : "out of memory building the answer");
}

// The whole answer of the one choice as the API's body: the parser's events
// through the builder, silently, then its object.
static void es_respond(struct job *j, struct http_request *r)
{
    struct job_choice *c = &j->choices[0];
    struct output_parser *p = choice_parser(j, c);
    const struct output_event *ev;
    size_t n_ev;
    char err[128];
    struct oa_error e;
    int rc = !p || c->error ? MS_EINTERNAL : 0;
    if (!rc) rc = output_parser_feed(p, c->text.data ? c->text.data : "", c->text.len, &ev, &n_ev,
                                     err, sizeof err);
    if (!rc) rc = j->es->feed(j->es_state, ev, n_ev, NULL, NULL);
    if (!rc) rc = output_parser_finish(p, &ev, &n_ev, err, sizeof err);
    if (!rc) rc = j->es->feed(j->es_state, ev, n_ev, NULL, NULL);
    if (!rc) {
        struct es_result res;
        es_result_of(j, c, &res);
        rc = j->es->finish(j->es_state, &res, NULL, NULL);
    }
    json_t *body = rc ? NULL : j->es->body(j->es_state);
    if (!body) {
        es_error(c, &e);
        http_respond_error(r, &e);
        return;
    }
    http_respond_json(r, 200, body);
}

static void job_ready(void *ctx, struct http_request *r)
{
    struct job *j = ctx;
    pthread_mutex_lock(&j->mu);
    bool all = j->n_finished == j->n_choices;
    pthread_mutex_unlock(&j->mu);
    if (!all) return;
    // Every choice finished: the sinks are done with them, no lock needed.
    struct oa_usage u;
    job_usage(j, &u);
    http_set_log_tokens(r, u.prompt_tokens, u.completion_tokens);
    if (j->es) {
        es_respond(j, r);
        return;
    }
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].error) {
            struct oa_error e;
            oa_errorf(&e, MS_EINTERNAL, "internal_error", NULL, "%s", j->choices[i].error);
            http_respond_error(r, &e);
            return;
        }
    struct oa_choice *cs = j->n_choices > 0 ? calloc((size_t)j->n_choices, sizeof *cs) : NULL;
    if (!cs) {
        http_respond_json(r, 500, NULL);
        return;
    }
    json_t **msgs = calloc((size_t)j->n_choices, sizeof *msgs);
    bool oom = !msgs;
    for (int i = 0; i < j->n_choices; i++) {
        job_choice_view(j, &j->choices[i], &cs[i]);
        if (j->parse_output && !oom) {
            oom = parse_whole(j, &j->choices[i], &msgs[i], &cs[i].finish_reason) != 0;
            cs[i].message = msgs[i];
        }
    }
    json_t *body = oom ? NULL
                 : j->chat ? oa_chat_response(&j->meta, cs, j->n_choices, &u)
                           : oa_completion_response(&j->meta, cs, j->n_choices, &u);
    for (int i = 0; msgs && i < j->n_choices; i++) json_decref(msgs[i]);
    free(msgs);
    free(cs);
    http_respond_json(r, body ? 200 : 500, body);
}

static int dump_to_buf(const char *buf, size_t size, void *data)
{
    return ms_buf_append(data, buf, size);
}

static void sse_event(struct ms_buf *out, json_t *j)
{
    if (!j) return;
    ms_buf_append(out, "data: ", 6);
    json_dump_callback(j, dump_to_buf, out, JSON_COMPACT | JSON_REAL_PRECISION(9));
    ms_buf_append(out, "\n\n", 2);
    json_decref(j);
}

// What one fill takes from a choice, copied under the lock.
struct piece {
    int choice;
    bool role, echo;
    char *text;
    size_t text_len;
    struct oa_token *tokens;
    int n_tokens;
    bool finish;
    struct oa_usage usage;           // this choice so far (continuous usage)
};

// Writes one typed event as an SSE frame: `event: NAME`, `data: JSON`.
static void es_frame(void *ctx, const char *event, json_t *data)
{
    struct ms_buf *out = ctx;
    if (!data) return;
    ms_buf_append_fmt(out, "event: %s\ndata: ", event);
    json_dump_callback(data, dump_to_buf, out, JSON_COMPACT | JSON_REAL_PRECISION(9));
    ms_buf_append(out, "\n\n", 2);
    json_decref(data);
}

// One piece of a typed-event stream: start once, the new text's parser
// events, and at the end what the parser held back and the closing events.
static void es_stream_piece(struct job *j, struct job_choice *c, const struct piece *p,
                            struct ms_buf *out)
{
    const struct event_stream_ops *es = j->es;
    struct output_parser *op = choice_parser(j, c);
    const struct output_event *ev;
    size_t n_ev = 0;
    char err[128];
    int rc = op ? 0 : MS_ENOMEM;
    if (!rc && !j->es_started) {
        j->es_started = true;
        rc = es->start(j->es_state, &p->usage, es_frame, out);
    }
    if (!rc && p->role) return; // the start is all a role piece brings
    if (!rc && p->text_len) rc = output_parser_feed(op, p->text, p->text_len, &ev, &n_ev, err, sizeof err);
    if (!rc && n_ev) rc = es->feed(j->es_state, ev, n_ev, es_frame, out);
    if (!rc && p->finish && !c->error) {
        rc = output_parser_finish(op, &ev, &n_ev, err, sizeof err);
        if (!rc) rc = es->feed(j->es_state, ev, n_ev, es_frame, out);
        struct es_result res;
        if (!rc) {
            es_result_of(j, c, &res);
            rc = es->finish(j->es_state, &res, es_frame, out);
        }
    }
    if (rc || (p->finish && c->error)) {
        struct oa_error e;
        es_error(c, &e);
        es->failed(j->es_state, &e, es_frame, out);
    }
}

// One piece of a parsed chat stream: the new text through the choice's
// parser (and, at the end, what it still held), its events as one delta. A
// piece whose text the parser holds back (a tag not yet decided) and that
// carries no logprobs or finish sends nothing.
static void stream_parsed(struct job *j, struct job_choice *c, const struct piece *p,
                          const char *fr, const char *ss, int32_t sid, const struct oa_usage *cu,
                          struct ms_buf *out)
{
    struct output_parser *op = choice_parser(j, c);
    json_t *delta = json_object();
    const struct output_event *ev;
    size_t n_ev = 0;
    char err[128];
    int rc = !op || !delta ? MS_ENOMEM : 0;
    if (!rc && p->text_len) rc = output_parser_feed(op, p->text, p->text_len, &ev, &n_ev, err, sizeof err);
    if (!rc && n_ev) rc = output_events_delta_fill(delta, ev, n_ev, j->include_reasoning);
    if (!rc && p->finish) {
        rc = output_parser_finish(op, &ev, &n_ev, err, sizeof err);
        if (!rc) rc = output_events_delta_fill(delta, ev, n_ev, j->include_reasoning);
        if (!rc) fr = output_parser_finish_reason(op, fr);
    }
    if (rc) {
        json_decref(delta);
        struct oa_error e;
        oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory parsing the output");
        sse_event(out, oa_error_json(&e));
        return;
    }
    if (json_object_size(delta) == 0 && !p->finish && p->n_tokens == 0) {
        json_decref(delta);
        return;
    }
    sse_event(out, oa_chat_chunk_delta(&j->meta, c->index, delta, p->tokens, p->n_tokens, fr, ss,
                                       sid, cu));
}

// Long because it is the stream's whole order in one place: under the lock
// it takes what each choice has not sent yet (role first, then the echoed
// prompt, then text and tokens, then the finish), and off the lock it writes
// those pieces as chunks, then usage and [DONE] once every choice is done.
static bool job_fill(void *ctx, struct ms_buf *out)
{
    struct job *j = ctx;
    struct piece *pc = calloc((size_t)j->n_choices * 2 + 1, sizeof *pc);
    if (!pc) return false;
    int n = 0;
    bool all_done;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_choices; i++) {
        struct job_choice *c = &j->choices[i];
        // A typed-event stream's start waits for the engine's first delta:
        // its usage (Anthropic's message_start) carries the prompt's cached
        // share, known only then.
        if ((j->chat || j->es) && !c->role_sent && (!j->es || c->heard)) {
            c->role_sent = true;
            pc[n].choice = i;
            pc[n].usage.prompt_tokens = c->prompt_tokens ? c->prompt_tokens
                                                         : j->prompts[c->prompt].n_ids;
            pc[n].usage.cached_tokens = c->cached_tokens;
            pc[n++].role = true;
        }
        if ((j->chat || j->es) && !c->role_sent) continue; // nothing before the start
        bool echo_needs_lp = j->meta.logprobs >= 0;
        if (j->echo && !c->echo_sent && (!echo_needs_lp || c->heard)) {
            c->echo_sent = true;
            // Its logprobs are read off the lock from here on: no later choice
            // writes them (one whose first delta failed may echo first).
            if (echo_needs_lp) j->prompts[c->prompt].echoed = true;
            pc[n].choice = i;
            pc[n++].echo = true;
        }
        if (j->echo && !c->echo_sent) continue; // the prompt goes first
        bool new_text = c->text.len > c->text_sent, new_tok = c->n_tokens > c->tokens_sent;
        bool fin = c->finished && !c->finish_sent;
        if (!new_text && !new_tok && !fin) continue;
        struct piece *p = &pc[n++];
        p->choice = i;
        if (new_text) {
            p->text_len = c->text.len - c->text_sent;
            p->text = malloc(p->text_len);
            if (p->text) memcpy(p->text, c->text.data + c->text_sent, p->text_len);
            else p->text_len = 0;
            c->text_sent = c->text.len;
        }
        if (new_tok && j->meta.logprobs >= 0) {
            p->n_tokens = c->n_tokens - c->tokens_sent;
            p->tokens = malloc((size_t)p->n_tokens * sizeof *p->tokens);
            if (p->tokens) memcpy(p->tokens, c->tokens + c->tokens_sent, (size_t)p->n_tokens * sizeof *p->tokens);
            else p->n_tokens = 0;
        }
        c->tokens_sent = c->n_tokens;
        p->finish = fin;
        if (fin) c->finish_sent = true;
        // Before the engine's first delta the prompt's size is already known.
        p->usage.prompt_tokens = c->prompt_tokens ? c->prompt_tokens : j->prompts[c->prompt].n_ids;
        p->usage.completion_tokens = c->completion_tokens;
        p->usage.cached_tokens = c->cached_tokens;
    }
    all_done = j->n_finished == j->n_choices;
    for (int i = 0; i < j->n_choices && all_done; i++)
        if (!j->choices[i].finish_sent) all_done = false;
    pthread_mutex_unlock(&j->mu);

    // JSON off the lock. Finished choices are immutable, so their stop
    // strings and errors can be read here.
    for (int k = 0; k < n; k++) {
        struct piece *p = &pc[k];
        struct job_choice *c = &j->choices[p->choice];
        const struct oa_usage *cu = j->continuous_usage ? &p->usage : NULL;
        if (j->es) {
            es_stream_piece(j, c, p, out);
            continue;
        }
        if (p->role) {
            sse_event(out, oa_chat_chunk(&j->meta, c->index, "assistant", "", 0, NULL, 0, NULL,
                                         NULL, -1, cu));
            continue;
        }
        if (p->echo) {
            const struct job_prompt *pr = &j->prompts[c->prompt];
            sse_event(out, oa_completion_chunk(&j->meta, c->index, pr->text, pr->text_len,
                                               pr->scored_tokens, pr->scored_tokens ? pr->n_ids : 0,
                                               &c->text_offset, NULL, NULL, -1, cu));
            continue;
        }
        if (p->finish && c->error) {
            struct oa_error e;
            oa_errorf(&e, MS_EINTERNAL, "internal_error", NULL, "%s", c->error);
            sse_event(out, oa_error_json(&e));
        }
        const char *fr = p->finish ? (c->finish ? c->finish : "abort") : NULL;
        const char *ss = p->finish ? c->stop_str : NULL;
        int32_t sid = p->finish && !c->stop_str ? c->stop_id : -1;
        if (j->chat && j->parse_output)
            stream_parsed(j, c, p, fr, ss, sid, cu, out);
        else if (j->chat)
            sse_event(out, oa_chat_chunk(&j->meta, c->index, NULL, p->text, p->text_len, p->tokens,
                                         p->n_tokens, fr, ss, sid, cu));
        else
            sse_event(out, oa_completion_chunk(&j->meta, c->index, p->text, p->text_len, p->tokens,
                                               p->n_tokens, &c->text_offset, fr, ss, sid, cu));
    }
    for (int k = 0; k < n; k++) {
        free(pc[k].text);
        free(pc[k].tokens);
    }
    free(pc);
    if (!all_done) return false;
    struct oa_usage u;
    job_usage(j, &u);
    if (j->async) http_async_set_log_tokens(j->async, u.prompt_tokens, u.completion_tokens);
    if (j->es) return true; // their streams end with their own last event, no [DONE]
    if (j->include_usage && !j->usage_sent) {
        j->usage_sent = true;
        sse_event(out, oa_usage_chunk(&j->meta, j->chat ? "chat.completion.chunk" : "text_completion", &u));
    }
    ms_buf_append(out, "data: [DONE]\n\n", 14);
    return true;
}

static void job_gone(void *ctx)
{
    job_cancel_all(ctx);
}

static void job_release(void *ctx)
{
    job_unref(ctx);
}

static const struct http_async_ops job_ops = {job_fill, job_ready, job_gone, job_release};

// ---- creating and submitting --------------------------------------------------------------

struct job *job_create(struct engine *engine, atomic_uint_least64_t *last_delta_us, bool chat)
{
    struct job *j = calloc(1, sizeof *j);
    struct arena *ar = arena_create(16384);
    if (!j || !ar) {
        free(j);
        arena_destroy(ar);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1; // the creator's
    j->engine = engine;
    j->last_delta_us = last_delta_us;
    j->arena = ar;
    j->chat = chat;
    j->think_end_id = -1;
    return j;
}

int job_add_choices(struct job *j, int n)
{
    j->choices = calloc((size_t)n, sizeof *j->choices);
    if (!j->choices) return MS_ENOMEM;
    j->n_choices = n;
    return 0;
}

int job_submit(struct job *j, int i, int prompt, const struct engine_request *er, char *err,
               size_t errlen)
{
    struct job_choice *c = &j->choices[i];
    c->job = j;
    c->index = i;
    c->prompt = prompt;
    c->stop_id = -1;
    struct engine_sink sink = {on_delta, c};
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    uint64_t id;
    int rc = engine_submit(j->engine, er, &sink, &id, err, errlen);
    if (rc) {
        job_unref(j); // never reaches the sink
        return rc;
    }
    pthread_mutex_lock(&j->mu);
    c->engine_id = id;
    c->submitted = true;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

// Sinks may have fired before the async exists (they then only record), so
// it is woken once here.
int job_respond(struct job *j, struct http_request *r)
{
    struct http_async *as = j->stream ? http_stream(r, 200, "text/event-stream", &job_ops, j)
                                      : http_defer(r, &job_ops, j);
    if (!as) {
        job_cancel_all(j);
        return MS_ENOMEM;
    }
    pthread_mutex_lock(&j->mu);
    j->async = as;
    j->refs++; // the HTTP side's, dropped by release
    pthread_mutex_unlock(&j->mu);
    http_async_wake(as);
    return 0;
}
