// app: the OpenAI routes over one engine. A generation request becomes a
// job: one engine request per choice, whose sinks (on the engine thread)
// only copy output under the job's lock and wake the HTTP side, which turns
// it into JSON on its own threads — one body when all choices finish, or SSE
// chunks as they come.
#include "server/app.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/chat_template.h"
#include "api/openai.h"
#include "base/arena.h"
#include "base/base.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "moeserve_build.h"
#include "scheduler/metrics.h"
#include "server/prometheus.h"

#define MAX_CHOICES 1024 // prompts x n in one request
#define MAX_NAMES 16

enum app_state { APP_LOADING, APP_SERVING, APP_DRAINING };

struct app {
    atomic_int state;
    struct model *model;
    struct tokenizer *tok;
    struct chat_template *tmpl;      // NULL when the checkpoint has none
    struct engine *engine;
    struct metrics *metrics;         // what /metrics renders; the engine feeds it
    char *names[MAX_NAMES];
    int n_names;
    int max_model_len;
    bool use_gen;
    struct oa_limits limits;
    int64_t created;
    double health_timeout_s;
    pthread_mutex_t health_mu;
    uint64_t health_steps;
    double health_t;
    atomic_uint_least64_t last_delta_us;
};

// ---- jobs ---------------------------------------------------------------------------

struct job;

struct choice {
    struct job *job;
    int index;
    int prompt;                      // which prompt it continues
    uint64_t engine_id;
    bool submitted, finished;
    // output so far (under job->mu while unfinished)
    struct http_buf text;
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
    bool got_prompt_lp;
};

struct prompt {
    int32_t *ids;                    // (n_ids) malloc'd
    int n_ids;
    char *text;                      // for echo: the prompt as text (malloc'd)
    size_t text_len;
    struct oa_token *echo_tokens;    // (n_ids) when echo; logprobs filled from the engine
};

struct job {
    pthread_mutex_t mu;
    int refs;
    struct app *app;
    struct arena *arena;
    struct http_async *async;
    bool chat, stream, echo;
    bool include_usage, continuous_usage;
    char id[96];
    struct oa_meta meta;
    struct prompt *prompts;
    int n_prompts;
    struct choice *choices;
    int n_choices;
    int n_finished;
    bool gone;
    bool usage_sent, done_sent;
};

static void job_free(struct job *j)
{
    for (int i = 0; i < j->n_choices; i++) {
        struct choice *c = &j->choices[i];
        http_buf_free(&c->text);
        free(c->tokens);
        free(c->stop_str);
        free(c->error);
    }
    for (int i = 0; i < j->n_prompts; i++) {
        free(j->prompts[i].ids);
        free(j->prompts[i].text);
        free(j->prompts[i].echo_tokens);
    }
    free(j->prompts);
    free(j->choices);
    http_async_unref(j->async);
    arena_destroy(j->arena);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void job_unref(struct job *j)
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
    o->has_logprob = with_lp;
    o->n_top = with_lp ? t->n_top : 0;
    if (o->n_top > OA_MAX_LOGPROBS) o->n_top = OA_MAX_LOGPROBS;
    for (int k = 0; k < o->n_top; k++) {
        o->top[k].id = t->top[k].id;
        o->top[k].logprob = t->top[k].logprob;
    }
}

// On the engine thread: copy, wake, return.
static void on_delta(void *ctx, const struct engine_delta *d)
{
    struct choice *c = ctx;
    struct job *j = c->job;
    atomic_store(&j->app->last_delta_us, now_us());
    bool with_lp = j->meta.logprobs >= 0;
    pthread_mutex_lock(&j->mu);
    struct prompt *p = &j->prompts[c->prompt];
    if (d->prompt_tokens_lp && p->echo_tokens && !c->got_prompt_lp) {
        // Entries are for prompt tokens 1..n-1; the first has no logprob.
        for (int i = 0; i < d->n_prompt_tokens_lp && i + 1 < p->n_ids; i++)
            token_from_engine(&p->echo_tokens[i + 1], &d->prompt_tokens_lp[i], true);
    }
    c->got_prompt_lp = true;
    bool oom = false;
    if (d->text_len && http_buf_append(&c->text, d->text, d->text_len)) oom = true;
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

static void job_cancel_all(struct job *j)
{
    uint64_t ids[MAX_CHOICES];
    int n = 0;
    pthread_mutex_lock(&j->mu);
    j->gone = true;
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].submitted && !j->choices[i].finished) ids[n++] = j->choices[i].engine_id;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) engine_cancel(j->app->engine, ids[i]);
}

static void job_usage(struct job *j, struct oa_usage *u)
{
    memset(u, 0, sizeof *u);
    for (int p = 0; p < j->n_prompts; p++) {
        // Every choice of a prompt reports the same prompt; count it once.
        const struct choice *c = NULL;
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

static void job_choice_view(struct job *j, const struct choice *c, struct oa_choice *o)
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
    if (j->echo) {
        const struct prompt *p = &j->prompts[c->prompt];
        o->echo_text = p->text;
        o->echo_len = p->text_len;
        o->echo_tokens = p->echo_tokens;
        o->n_echo_tokens = p->echo_tokens ? p->n_ids : 0;
    }
}

// ---- the HTTP side of a job ---------------------------------------------------------------

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
    for (int i = 0; i < j->n_choices; i++) job_choice_view(j, &j->choices[i], &cs[i]);
    json_t *body = j->chat ? oa_chat_response(&j->meta, cs, j->n_choices, &u)
                           : oa_completion_response(&j->meta, cs, j->n_choices, &u);
    free(cs);
    http_respond_json(r, 200, body);
}

static int dump_to_buf(const char *buf, size_t size, void *data)
{
    return http_buf_append(data, buf, size);
}

static void sse_event(struct http_buf *out, json_t *j)
{
    if (!j) return;
    http_buf_append(out, "data: ", 6);
    json_dump_callback(j, dump_to_buf, out, JSON_COMPACT | JSON_REAL_PRECISION(9));
    http_buf_append(out, "\n\n", 2);
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

static bool job_fill(void *ctx, struct http_buf *out)
{
    struct job *j = ctx;
    struct piece *pc = calloc((size_t)j->n_choices * 2 + 1, sizeof *pc);
    if (!pc) return false;
    int n = 0;
    bool all_done;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_choices; i++) {
        struct choice *c = &j->choices[i];
        if (j->chat && !c->role_sent) {
            c->role_sent = true;
            pc[n].choice = i;
            pc[n++].role = true;
        }
        bool echo_needs_lp = j->meta.logprobs >= 0;
        if (j->echo && !c->echo_sent && (!echo_needs_lp || c->got_prompt_lp || c->finished)) {
            c->echo_sent = true;
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
        p->usage.prompt_tokens = c->prompt_tokens;
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
        struct choice *c = &j->choices[p->choice];
        const struct oa_usage *cu = j->continuous_usage ? &p->usage : NULL;
        if (p->role) {
            sse_event(out, oa_chat_chunk(&j->meta, c->index, "assistant", "", 0, NULL, 0, NULL,
                                         NULL, -1, cu));
            continue;
        }
        if (p->echo) {
            const struct prompt *pr = &j->prompts[c->prompt];
            sse_event(out, oa_completion_chunk(&j->meta, c->index, pr->text, pr->text_len,
                                               pr->echo_tokens, pr->echo_tokens ? pr->n_ids : 0,
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
        if (j->chat)
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
    if (j->include_usage && !j->usage_sent) {
        j->usage_sent = true;
        sse_event(out, oa_usage_chunk(&j->meta, j->chat ? "chat.completion.chunk" : "text_completion", &u));
    }
    http_buf_append(out, "data: [DONE]\n\n", 14);
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

// ---- handlers ------------------------------------------------------------------------------------

static void respond_err(struct http_request *r, const struct oa_error *e)
{
    if (e->http == 503) http_add_header(r, "Retry-After", "1");
    http_respond_error(r, e);
}

// 503 unless the model is loaded and the server is not draining.
static bool serving(struct app *a, struct http_request *r)
{
    int st = atomic_load(&a->state);
    if (st == APP_SERVING) return true;
    struct oa_error e;
    oa_errorf(&e, MS_EBUSY, "service_unavailable", NULL, "%s",
              st == APP_LOADING ? "the model is still loading; retry shortly"
                                : "the server is shutting down and takes no new requests");
    respond_err(r, &e);
    return false;
}

// The served name the request asked for (the first when it named none).
static const char *check_model(struct app *a, const char *model, struct oa_error *e)
{
    if (!model) return a->names[0];
    for (int i = 0; i < a->n_names; i++)
        if (!strcmp(a->names[i], model)) return a->names[i];
    oa_errorf(e, MS_ENOTFOUND, "model_not_found", "model",
              "The model `%.200s` does not exist; this server serves `%.200s`", model, a->names[0]);
    return NULL;
}

static int render_chat(struct app *a, json_t *messages, bool add_generation_prompt, json_t *kwargs,
                       char **out, size_t *len, struct oa_error *e)
{
    if (!a->tmpl)
        return oa_errorf(e, MS_EUNSUPPORTED, "unsupported_value", "messages",
                         "this model's tokenizer_config.json has no chat_template; use "
                         "/v1/completions with a prompt instead");
    struct chat_template_args args = {
        .messages = messages,
        .tools = NULL,
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
    return 0;
}

static int encode(struct app *a, const char *text, size_t len, const char *param,
                  struct prompt *p, struct oa_error *e)
{
    char err[256];
    size_t n = 0;
    int32_t *ids = NULL;
    int rc = tok_encode(a->tok, text, len, &ids, &n, err, sizeof err);
    if (rc) return oa_errorf(e, rc, rc == MS_ENOMEM ? "internal_error" : "invalid_value", param, "%s", err);
    if (n > (size_t)INT32_MAX / 2) {
        free(ids);
        return oa_errorf(e, MS_ETOOLONG, "context_length_exceeded", param, "the prompt is too long");
    }
    p->ids = ids;
    p->n_ids = (int)n;
    return 0;
}

static void fill_engine_request(struct app *a, const struct oa_gen_params *g, const struct prompt *p,
                                int choice_in_prompt, bool want_prompt_lp,
                                struct sampling_logit_bias *bias, struct engine_request *er)
{
    engine_request_default(er);
    er->prompt = p->ids;
    er->n_prompt = p->n_ids;
    struct sampling_params *s = &er->sampling;
    s->temperature = g->temperature;
    s->top_p = g->top_p;
    s->top_k = g->top_k;
    s->min_p = g->min_p;
    s->presence_penalty = g->presence_penalty;
    s->frequency_penalty = g->frequency_penalty;
    s->repetition_penalty = g->repetition_penalty;
    s->has_seed = g->has_seed;
    // n > 1 with a seed: each choice its own stream, all reproducible.
    s->seed = (uint64_t)g->seed + (uint64_t)choice_in_prompt;
    s->logit_bias = bias;
    s->n_logit_bias = g->n_logit_bias;
    s->logprobs = g->logprobs;
    s->prompt_logprobs = want_prompt_lp ? g->logprobs : -1;
    struct engine_stop *st = &er->stop;
    int room = a->max_model_len - p->n_ids;
    int max = g->max_tokens;
    if (max == 0) {
        max = room;
        if (a->use_gen && a->model->cfg.gen.max_new_tokens > 0 &&
            a->model->cfg.gen.max_new_tokens < max)
            max = a->model->cfg.gen.max_new_tokens;
    }
    st->max_tokens = max;
    st->ignore_eos = g->ignore_eos;
    st->stop_ids = g->stop_token_ids;
    st->n_stop_ids = g->n_stop_token_ids;
    st->stop_strs = g->stop;
    st->n_stop_strs = g->n_stop;
    st->skip_special_tokens = g->skip_special_tokens;
}

static void handle_generate(struct app *a, struct http_request *r, bool chat)
{
    if (!serving(a, r)) return;
    size_t len;
    const char *body = http_body(r, &len);
    struct oa_error e;
    struct job *j = calloc(1, sizeof *j);
    struct arena *ar = arena_create(16384);
    if (!j || !ar) {
        free(j);
        arena_destroy(ar);
        http_respond_json(r, 500, NULL);
        return;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1; // this handler's, until the end
    j->app = a;
    j->arena = ar;
    j->chat = chat;

    struct oa_chat_request cr;
    struct oa_completion_request pr;
    const struct oa_gen_params *g;
    const char *model, *ignored;
    int rc;
    memset(&cr, 0, sizeof cr);
    if (chat) {
        rc = oa_parse_chat(body, len, &a->limits, ar, &cr, &e);
        g = &cr.gen;
        model = cr.model;
        ignored = cr.ignored;
    } else {
        rc = oa_parse_completion(body, len, &a->limits, ar, &pr, &e);
        g = &pr.gen;
        model = pr.model;
        ignored = pr.ignored;
        j->echo = !rc && pr.echo;
    }
    if (rc) goto fail;
    if (ignored) ms_log(MS_LOG_WARN, "%s: ignored unknown fields: %s", http_path(r), ignored);
    const char *served = check_model(a, model, &e);
    if (!served) {
        rc = e.status;
        goto fail;
    }

    // Prompts to token ids.
    j->n_prompts = chat ? 1 : pr.n_prompts;
    j->prompts = calloc((size_t)j->n_prompts, sizeof *j->prompts);
    if (!j->prompts) {
        rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        goto fail;
    }
    const char *param = chat ? "messages" : "prompt";
    if (chat) {
        char *text;
        size_t tl;
        rc = render_chat(a, cr.messages, cr.add_generation_prompt, cr.chat_template_kwargs, &text,
                         &tl, &e);
        if (rc) goto fail;
        rc = encode(a, text, tl, param, &j->prompts[0], &e);
        free(text);
        if (rc) goto fail;
    } else {
        for (int i = 0; i < pr.n_prompts; i++) {
            struct prompt *p = &j->prompts[i];
            const struct oa_prompt *op = &pr.prompts[i];
            if (op->text) {
                rc = encode(a, op->text, op->text_len, param, p, &e);
                if (rc) goto fail;
                if (j->echo) {
                    p->text = malloc(op->text_len + 1);
                    if (!p->text) {
                        rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
                        goto fail;
                    }
                    memcpy(p->text, op->text, op->text_len);
                    p->text[op->text_len] = 0;
                    p->text_len = op->text_len;
                }
            } else {
                p->ids = malloc((size_t)op->n_ids * sizeof *p->ids);
                if (!p->ids) {
                    rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
                    goto fail;
                }
                memcpy(p->ids, op->ids, (size_t)op->n_ids * sizeof *p->ids);
                p->n_ids = op->n_ids;
                if (j->echo) {
                    char err[256];
                    rc = tok_decode(a->tok, p->ids, (size_t)p->n_ids, false, &p->text,
                                    &p->text_len, err, sizeof err);
                    if (rc) {
                        oa_errorf(&e, rc, "invalid_value", param, "%s", err);
                        goto fail;
                    }
                }
            }
        }
    }
    for (int i = 0; i < j->n_prompts; i++) {
        struct prompt *p = &j->prompts[i];
        char pname[32];
        snprintf(pname, sizeof pname, chat || j->n_prompts == 1 ? "%s" : "%s[%d]", param, i);
        if (p->n_ids == 0) {
            rc = oa_errorf(&e, MS_EINVAL, "invalid_value", pname,
                           "the prompt is empty: it must hold at least one token");
            goto fail;
        }
        if (p->n_ids >= a->max_model_len) {
            rc = oa_errorf(&e, MS_ETOOLONG, "context_length_exceeded", pname,
                           "This model's maximum context length is %d tokens, and the prompt is "
                           "%d tokens, which leaves no room for a completion (--max-model-len)",
                           a->max_model_len, p->n_ids);
            goto fail;
        }
        if (j->echo && g->logprobs >= 0) {
            p->echo_tokens = calloc((size_t)p->n_ids, sizeof *p->echo_tokens);
            if (!p->echo_tokens) {
                rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
                goto fail;
            }
            for (int k = 0; k < p->n_ids; k++) p->echo_tokens[k].id = p->ids[k];
        }
    }

    long total = (long)j->n_prompts * g->n;
    if (total > MAX_CHOICES) {
        rc = oa_errorf(&e, MS_EINVAL, "invalid_value", "n",
                       "%d prompts times n=%d makes %ld choices; at most %d per request",
                       j->n_prompts, g->n, total, MAX_CHOICES);
        goto fail;
    }
    j->n_choices = (int)total;
    j->choices = calloc((size_t)total, sizeof *j->choices);
    if (!j->choices) {
        rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        goto fail;
    }
    if (g->request_id) snprintf(j->id, sizeof j->id, "%s%s", chat ? "chatcmpl-" : "cmpl-", g->request_id);
    else oa_make_id(j->id, sizeof j->id, chat ? "chatcmpl-" : "cmpl-");
    j->meta.id = j->id;
    j->meta.created = ms_unix_time();
    j->meta.model = served;
    j->meta.tok = a->tok;
    j->meta.tokens_as_ids = g->return_tokens_as_token_ids;
    j->meta.logprobs = g->logprobs;
    j->stream = g->stream;
    j->include_usage = g->include_usage;
    j->continuous_usage = g->continuous_usage_stats;

    struct sampling_logit_bias *bias = NULL;
    if (g->n_logit_bias) {
        bias = arena_calloc(ar, (size_t)g->n_logit_bias, sizeof *bias);
        if (!bias) {
            rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
            goto fail;
        }
        for (int i = 0; i < g->n_logit_bias; i++) {
            bias[i].id = g->logit_bias[i].id;
            bias[i].bias = g->logit_bias[i].bias;
        }
    }
    // Submit every choice; sinks may fire before the async exists (they then
    // only record), so the async is created after and woken once.
    for (int i = 0; i < j->n_choices; i++) {
        struct choice *c = &j->choices[i];
        c->job = j;
        c->index = i;
        c->prompt = i / g->n;
        c->stop_id = -1;
        struct engine_request er;
        fill_engine_request(a, g, &j->prompts[c->prompt], i % g->n, j->echo && g->logprobs >= 0,
                            bias, &er);
        struct engine_sink sink = {on_delta, c};
        char err[512];
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        uint64_t id;
        rc = engine_submit(a->engine, &er, &sink, &id, err, sizeof err);
        if (rc) {
            job_unref(j); // never reaches the sink
            const char *code = rc == MS_ETOOLONG ? "context_length_exceeded"
                               : rc == MS_EBUSY   ? "service_unavailable"
                                                  : "invalid_value";
            const char *p = rc == MS_ETOOLONG ? (g->max_tokens ? "max_tokens" : param)
                            : rc == MS_EBUSY  ? NULL
                                              : param;
            oa_errorf(&e, rc, code, p, "%s", err);
            job_cancel_all(j);
            goto fail;
        }
        pthread_mutex_lock(&j->mu);
        c->engine_id = id;
        c->submitted = true;
        pthread_mutex_unlock(&j->mu);
    }

    struct http_async *as = j->stream ? http_stream(r, 200, "text/event-stream", &job_ops, j)
                                      : http_defer(r, &job_ops, j);
    if (!as) {
        job_cancel_all(j);
        oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        rc = MS_ENOMEM;
        goto fail;
    }
    pthread_mutex_lock(&j->mu);
    j->async = as;
    j->refs++; // the HTTP side's, dropped by release
    pthread_mutex_unlock(&j->mu);
    http_async_wake(as);
    if (chat) oa_chat_request_release(&cr);
    job_unref(j);
    return;
fail:
    if (chat) oa_chat_request_release(&cr);
    respond_err(r, &e);
    job_unref(j);
}

static void h_chat(void *app, struct http_request *r)
{
    handle_generate(app, r, true);
}

static void h_completions(void *app, struct http_request *r)
{
    handle_generate(app, r, false);
}

// The byte-level BPE spelling of a token, as convert_ids_to_tokens gives it
// (bytes 33-126, 161-172, 174-255 as themselves, the rest shifted to U+0100+).
static json_t *token_str_json(struct app *a, int32_t id)
{
    size_t n = 0;
    const uint8_t *b = tok_token_bytes(a->tok, id, &n);
    if (!b) return json_null();
    if (tok_is_special(a->tok, id)) {
        char *s = malloc(3 * n + 1);
        if (!s) return json_null();
        size_t l = oa_utf8_lossy(b, n, s);
        json_t *j = json_stringn(s, l);
        free(s);
        return j;
    }
    char *s = malloc(2 * n + 1);
    if (!s) return json_null();
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned c = b[i];
        if ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174) {
            if (c < 0x80) s[o++] = (char)c;
            else s[o++] = (char)(0xc0 | (c >> 6)), s[o++] = (char)(0x80 | (c & 0x3f));
        } else {
            // The other bytes take the code points from 256 up, in byte order.
            unsigned k = c <= 32 ? c : c <= 160 ? 33 + (c - 127) : 67; // 67: byte 173
            unsigned cp = 256 + k;
            s[o++] = (char)(0xc0 | (cp >> 6));
            s[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    json_t *j = json_stringn(s, o);
    free(s);
    return j;
}

static void h_tokenize(void *app, struct http_request *r)
{
    struct app *a = app;
    if (!serving(a, r)) return;
    size_t len;
    const char *body = http_body(r, &len);
    struct arena *ar = arena_create(4096);
    struct oa_tokenize_request t;
    struct oa_error e;
    memset(&t, 0, sizeof t);
    struct prompt p = {0};
    int rc = ar ? oa_parse_tokenize(body, len, &a->limits, ar, &t, &e)
                : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (!rc && !check_model(a, t.model, &e)) rc = e.status;
    if (!rc) {
        if (t.is_chat) {
            char *text;
            size_t tl;
            rc = render_chat(a, t.messages, t.add_generation_prompt, t.chat_template_kwargs,
                             &text, &tl, &e);
            if (!rc) {
                rc = encode(a, text, tl, "messages", &p, &e);
                free(text);
            }
        } else {
            rc = encode(a, t.prompt, t.prompt_len, "prompt", &p, &e);
        }
    }
    if (rc) {
        respond_err(r, &e);
    } else {
        json_t *o = json_object(), *ids = json_array();
        for (int i = 0; i < p.n_ids; i++) json_array_append_new(ids, json_integer(p.ids[i]));
        json_object_set_new(o, "count", json_integer(p.n_ids));
        json_object_set_new(o, "max_model_len", json_integer(a->max_model_len));
        json_object_set_new(o, "tokens", ids);
        if (t.return_token_strs) {
            json_t *strs = json_array();
            for (int i = 0; i < p.n_ids; i++) json_array_append_new(strs, token_str_json(a, p.ids[i]));
            json_object_set_new(o, "token_strs", strs);
        } else {
            json_object_set_new(o, "token_strs", json_null());
        }
        http_set_log_tokens(r, p.n_ids, 0);
        http_respond_json(r, 200, o);
    }
    free(p.ids);
    oa_tokenize_request_release(&t);
    arena_destroy(ar);
}

static void h_detokenize(void *app, struct http_request *r)
{
    struct app *a = app;
    if (!serving(a, r)) return;
    size_t len;
    const char *body = http_body(r, &len);
    struct arena *ar = arena_create(4096);
    struct oa_detokenize_request d;
    struct oa_error e;
    int rc = ar ? oa_parse_detokenize(body, len, &a->limits, ar, &d, &e)
                : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (!rc && !check_model(a, d.model, &e)) rc = e.status;
    char *text = NULL;
    size_t tl = 0;
    if (!rc) {
        char err[256];
        rc = tok_decode(a->tok, d.tokens, (size_t)d.n_tokens, false, &text, &tl, err, sizeof err);
        if (rc) oa_errorf(&e, rc, "invalid_value", "tokens", "%s", err);
    }
    if (rc) {
        respond_err(r, &e);
    } else {
        json_t *o = json_object();
        json_object_set_new(o, "prompt", json_stringn(text, tl));
        http_respond_json(r, 200, o);
    }
    free(text);
    arena_destroy(ar);
}

static void h_models(void *app, struct http_request *r)
{
    struct app *a = app;
    if (atomic_load(&a->state) == APP_LOADING) {
        serving(a, r);
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < a->n_names; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(a->names[i]));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer(a->created));
        json_object_set_new(m, "owned_by", json_string("moeserve"));
        json_object_set_new(m, "root", json_string(a->model->dir));
        json_object_set_new(m, "parent", json_null());
        json_object_set_new(m, "max_model_len", json_integer(a->max_model_len));
        json_object_set_new(m, "permission", json_array());
        json_array_append_new(data, m);
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    http_respond_json(r, 200, o);
}

static void h_version(void *app, struct http_request *r)
{
    (void)app;
    json_t *o = json_object();
    json_object_set_new(o, "version", json_string(MOESERVE_VERSION));
    http_respond_json(r, 200, o);
}

// 200 only while serving and the step loop is alive: when work is queued or
// running, some step or output must have happened within health_timeout_s.
static void h_health(void *app, struct http_request *r)
{
    struct app *a = app;
    int st = atomic_load(&a->state);
    json_t *o = json_object();
    int status = 200;
    const char *what = "ok";
    if (st == APP_LOADING) {
        status = 503;
        what = "loading";
    } else {
        struct engine_stats s;
        engine_get_stats(a->engine, &s);
        double now = ms_now();
        pthread_mutex_lock(&a->health_mu);
        bool work = s.num_running + s.num_waiting > 0;
        if (s.steps != a->health_steps || !work) {
            a->health_steps = s.steps;
            a->health_t = now;
        }
        double last = a->health_t;
        pthread_mutex_unlock(&a->health_mu);
        double last_delta = (double)atomic_load(&a->last_delta_us) * 1e-6;
        if (last_delta > last) last = last_delta;
        if (st == APP_DRAINING || s.draining) {
            status = 503;
            what = "draining";
        } else if (work && now - last > a->health_timeout_s) {
            status = 503;
            what = "stalled";
        }
        int used = 0, cached = 0, total = 0;
        for (int i = 0; i < s.n_ranks && i < ENGINE_MAX_RANKS; i++) {
            used += s.rank[i].kv_blocks_used;
            cached += s.rank[i].kv_blocks_cached;
            total += s.rank[i].kv_blocks_total;
        }
        json_object_set_new(o, "num_running", json_integer(s.num_running));
        json_object_set_new(o, "num_waiting", json_integer(s.num_waiting));
        json_object_set_new(o, "kv_blocks_used", json_integer(used));
        json_object_set_new(o, "kv_blocks_cached", json_integer(cached));
        json_object_set_new(o, "kv_blocks_total", json_integer(total));
        json_object_set_new(o, "steps", json_integer((json_int_t)s.steps));
        json_object_set_new(o, "generation_tokens_total", json_integer((json_int_t)s.generation_tokens_total));
        json_object_set_new(o, "seconds_since_progress", json_real(work ? now - last : 0.0));
    }
    json_object_set_new(o, "status", json_string(what));
    if (status == 503) http_add_header(r, "Retry-After", "1");
    http_respond_json(r, status, o);
}

// Prometheus text: the engine's counters and gauges now, and the histograms
// and MoE series the engine fed. Open without a key, like /health.
static void h_metrics(void *app, struct http_request *r)
{
    struct app *a = app;
    if (atomic_load(&a->state) == APP_LOADING || !a->metrics) {
        http_add_header(r, "Retry-After", "1");
        http_respond(r, 503, "text/plain; charset=utf-8", "loading\n", 8);
        return;
    }
    struct engine_stats st;
    engine_get_stats(a->engine, &st);
    struct metrics_snapshot ms;
    char *text = NULL, err[256];
    size_t len = 0;
    int rc = metrics_take_snapshot(a->metrics, &ms, err, sizeof err);
    if (!rc) rc = prometheus_render(a->names[0], &st, &ms, &text, &len, err, sizeof err);
    metrics_snapshot_release(&ms);
    if (rc) {
        http_respond(r, 500, "text/plain; charset=utf-8", err, strlen(err));
        return;
    }
    http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static const struct http_route routes[] = {
    {"POST", "/v1/chat/completions", false, h_chat},
    {"POST", "/v1/completions", false, h_completions},
    {"GET", "/v1/models", false, h_models},
    {"GET", "/health", true, h_health},
    {"GET", "/metrics", true, h_metrics},
    {"POST", "/tokenize", false, h_tokenize},
    {"POST", "/detokenize", false, h_detokenize},
    {"GET", "/version", false, h_version},
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

int app_load(struct app *a, const struct app_opts *o, char *err, size_t errlen)
{
    int rc = model_load_format(o->model_dir, o->load_format, 0, &a->model, err, errlen);
    if (rc) return rc;
    rc = tok_load(o->model_dir, &a->tok, err, errlen);
    if (rc) return rc;
    const char *src = tok_chat_template(a->tok);
    if (src) {
        char terr[512];
        rc = chat_template_parse(src, strlen(src), &a->tmpl, terr, sizeof terr);
        if (rc) return ms_err(err, errlen, rc, "%s: the chat_template does not parse: %s",
                              o->model_dir, terr);
    } else {
        ms_log(MS_LOG_WARN, "%s has no chat_template: /v1/chat/completions will answer 400",
               o->model_dir);
    }
    if (o->n_served > MAX_NAMES)
        return ms_err(err, errlen, MS_EINVAL, "at most %d --served-model-name values", MAX_NAMES);
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
    struct engine_opts eo = o->engine;
    if (o->kv_dtype_auto) eo.kv_dtype = a->model->cfg.torch_dtype == DTYPE_F32 ? DTYPE_F32 : DTYPE_BF16;
    struct metrics_opts mo = {
        .n_ranks = eo.data_parallel_size > 0 ? eo.data_parallel_size : 1,
        .n_experts = a->model->cfg.n_experts,
        .imbalance_window = 100,
    };
    rc = metrics_create(&mo, &a->metrics, err, errlen);
    if (rc) return rc;
    eo.metrics = a->metrics;
    rc = engine_create(a->model, a->tok, &eo, &a->engine, err, errlen);
    if (rc) return rc;
    a->max_model_len = engine_max_model_len(a->engine);
    a->use_gen = !o->generation_config_vllm;
    a->limits.gen = a->use_gen ? &a->model->cfg.gen : NULL;
    a->limits.vocab_size = tok_vocab_size(a->tok);
    if (a->model->cfg.vocab_size > a->limits.vocab_size) a->limits.vocab_size = a->model->cfg.vocab_size;
    a->limits.max_model_len = a->max_model_len;
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
    if (a->tok) tok_destroy(a->tok);
    if (a->model) model_destroy(a->model);
    for (int i = 0; i < a->n_names; i++) free(a->names[i]);
    pthread_mutex_destroy(&a->health_mu);
    free(a);
}
